/* minibert workbench, the step-through: one head's computation for one query token, each step's equation with its
   values drawn (a colour strip per vector, bars for one value per key) and their numbers beside them, links to the
   steps it is computed from and the views that draw it, and every term of a dot product on hover; a second head
   beside the first ("Compare with"), and the figure of both for slides (Download PNG | SVG). The workbench
   (workbench.js) builds it with what it shares: minibertStepThrough(page) → {show(panel, answer) → a promise,
   drawn once the second head's steps are, norm}. */
/** page: {app, config, prefix, state, el, number, select, renew, choose, labelBoth, label, send, body, modelName,
    downloadControl}. */
function minibertStepThrough(page) {
  "use strict";
  var app = page.app, config = page.config, prefix = page.prefix, state = page.state, el = page.el;
  var number = page.number, select = page.select, renew = page.renew, choose = page.choose;
  var labelBoth = page.labelBoth;
  var compare = null;  // [layer, head]: a second head shown beside the selected one, for the same query; or null
  var drawn = {};  // per model: {ticket, answers} of the steps shown, the figure's; a later show drops older answers

  function numbered(count) {  // select options "1 (0-indexed: 0)", …
    var out = [];
    for (var i = 0; i < count; i++) out.push({value: String(i), text: (i + 1) + "  (0-indexed: " + i + ")"});
    return out;
  }

  var unscaled = false;  // the ÷√K switch off: a what-if row, softmax(q·k) without the division, under the softmax

  function showSteps(panel, answer) {
    var part = panel.step, ticket = (drawn[panel.n] ? drawn[panel.n].ticket : 0) + 1;
    drawn[panel.n] = {ticket: ticket, answers: [answer]};
    renew(part);
    var pick = el("div", {"class": "wb-step-pick"});
    var layer = select(prefix + "step-layer-" + panel.n, "Layer", numbered(panel.info.layers));
    var head = select(prefix + "step-head-" + panel.n, "Head", numbered(panel.info.heads));
    layer.node.value = String(answer.layer);
    head.node.value = String(answer.head);
    layer.node.addEventListener("change", function () { choose({layer: Number(layer.node.value)}); });
    head.node.addEventListener("change", function () { choose({head: Number(head.node.value)}); });
    pick.appendChild(el("span", {"class": "wb-step-head", id: prefix + "step-title-" + panel.n},
                        "Head " + labelBoth(panel.n, answer.layer, answer.head) + " · query “"
                        + answer.tokens[answer.query] + "” (position " + answer.query + ", 0-indexed; click a "
                        + "token to change it)"));
    if (answer.ablated) {
      pick.appendChild(el("span", {"class": "wb-step-ablated", id: prefix + "step-ablated-" + panel.n},
                          "ablated (" + answer.ablated.mode + "): its z is replaced by " + REPLACED[answer.ablated.mode]
                          + " (see weighted values)"));
    }
    pick.appendChild(layer.wrap);
    pick.appendChild(head.wrap);
    var heads = [{value: "", text: "no second head"}];
    config.models[panel.n].head_labels.forEach(function (row, l) {
      row.forEach(function (text, h) { heads.push({value: l + ":" + h, text: text}); });  // 0-indexed; text "L-H"
    });
    var other = select(prefix + "step-compare-" + panel.n, "Compare with", heads);
    other.node.value = compare ? compare.join(":") : "";
    other.node.addEventListener("change", function () {
      compare = other.node.value ? other.node.value.split(":").map(Number) : null;
      showSteps(panel, answer);
    });
    pick.appendChild(other.wrap);
    var byId = {};
    answer.steps.forEach(function (step) { byId[step.id] = step; });
    if (byId.qk && byId.scaled && byId.pattern) {  // "why divide by √K?": the softmax without it, beside the model's
      var scale = el("input", {type: "checkbox", id: prefix + "step-sqrtk-" + panel.n});
      scale.checked = !unscaled;
      scale.addEventListener("change", function () { unscaled = !scale.checked; showSteps(panel, answer); });
      var switchLabel = el("label", {"for": prefix + "step-sqrtk-" + panel.n, "class": "wb-select",
                                     title: "off: the softmax row is followed by softmax(q·k) without ÷√K, a what-if "
                                       + "(the model divides)"}, "÷√K ");
      switchLabel.appendChild(scale);
      pick.appendChild(switchLabel);
    }
    if (page.downloadControl) {
      pick.appendChild(page.downloadControl(part, {after: function (promise, then) { promise.then(then); }},
                                            function () { return figureName(panel); },
                                            function () { return figure(panel, drawn[panel.n].answers); }));
    }
    part.appendChild(pick);
    if (!compare) {
      part.appendChild(stepList(panel, answer));
      return Promise.resolve();
    }
    // Two heads side by side: the selected one, and the second, asked for now (the same text, ablation and query).
    var row = part.appendChild(el("div", {"class": "wb-step-compare"}));
    var first = row.appendChild(el("div", {"class": "wb-step-column"}));
    first.appendChild(el("h3", {}, "Head " + page.label(panel.n, answer.layer, answer.head)));
    first.appendChild(stepList(panel, answer));
    var second = row.appendChild(el("div", {"class": "wb-step-column", id: prefix + "step-second-" + panel.n,
                                            "aria-busy": "true"}));
    second.appendChild(el("p", {"class": "wb-pending"}, "computing…"));
    var asked = page.body(panel.n, {layer: compare[0], head: compare[1], query: answer.query});
    return page.send("step", asked).then(function (twin) {
      if (drawn[panel.n].ticket !== ticket) return;
      drawn[panel.n].answers.push(twin);
      while (second.firstChild) second.removeChild(second.firstChild);
      second.appendChild(el("h3", {}, "Head " + page.label(panel.n, twin.layer, twin.head) + (twin.ablated
        ? " (ablated)" : "")));
      second.appendChild(stepList({n: panel.n + "-second", of: panel.n, info: panel.info}, twin));
      second.setAttribute("aria-busy", "false");
    }, function (error) {
      if (drawn[panel.n].ticket !== ticket) return;
      second.textContent = "the second head's steps failed: " + error.message;
      second.setAttribute("aria-busy", "false");
    });
  }

  /** One head's steps as a list; a second head's (compared) is drawn as a panel {n: "0-second", of: 0, info}. */
  function stepList(panel, answer) {
    var byId = {};
    answer.steps.forEach(function (step) { byId[step.id] = step; });
    var list = el("ol", {"class": "wb-steps"});
    answer.steps.forEach(function (step) {
      var item = list.appendChild(stepItem(panel, step, byId, answer));
      if (unscaled && step.id === "pattern" && byId.qk && byId.scaled) item.appendChild(whatIf(panel, byId, answer));
    });
    return list;
  }

  /** softmax(q·k) over the keys in reach (those whose scaled score is not −∞), in float64 with the maximum
      subtracted: the pattern the head would have without ÷√K. Drawn as the softmax row's bars, marked a what-if. */
  function whatIf(panel, byId, answer) {
    var scores = byId.qk.values.map(function (v, s) { return byId.scaled.values[s] === null ? null : v; });
    var top = Math.max.apply(null, scores.filter(function (v) { return v !== null; }));
    var weights = scores.map(function (v) { return v === null ? 0 : Math.exp(v - top); });
    var total = weights.reduce(function (a, b) { return a + b; }, 0);
    var values = weights.map(function (w) { return w / total; });
    var K = panel.info.d_head, box = el("div", {"class": "wb-what-if", id: prefix + "step-" + panel.n + "-unscaled"});
    box.appendChild(el("p", {"class": "wb-more"}, "what if: softmax(q·k) without ÷√K (the model divides by √" + K
      + " = " + number(Math.sqrt(K)) + "; this is not its pattern). The largest weight is " + number(Math.max.apply(
        null, values)) + " here, " + number(Math.max.apply(null, byId.pattern.values)) + " with ÷√K: larger scores "
      + "make the softmax more peaked."));
    box.appendChild(bars({label: "softmax(q·k), without ÷√K", values: values}, answer.tokens, function (s, text) {
      return el("span", {"class": "wb-num", "data-index": String(s), "data-value": String(values[s])}, text);
    }));
    return box;
  }

  /** One step: its label and equation, its values drawn (a colour strip per vector, bars for one value per key)
      with their numbers beside them, links to its operands and to the views that show it. */
  function stepItem(panel, step, byId, answer) {
    var tokens = answer.tokens, shown = answer.shown;
    var item = el("li", {"class": "wb-step", "data-step": step.id, id: prefix + "step-" + panel.n + "-" + step.id});
    item.appendChild(el("span", {"class": "wb-step-label"}, step.label + ": "));
    item.appendChild(el("code", {"class": "wb-equation"}, step.equation));
    item.appendChild(links(panel, step, byId));
    var perKey = step.per_key && step.shape.length === 1;  // one value per key token: bars, each named by its token
    var width = step.shape.length === 2 ? step.shape[1] : step.values.length;
    var rows = step.shape.length === 2 ? step.shape[0] : 1;
    var terms = el("div", {"class": "wb-terms", hidden: ""});

    function cell(at, text) {  // one number: exact in data-value, its operands on hover, its terms where a dot
      var node = el("span", {"class": "wb-num", tabindex: "0", "data-index": at, "data-value": String(step.values[at]),
                             title: operands(step, at, byId)}, text);
      if (step.dot && rows === 1 && at < step.dot.right.length && byId[step.dot.left]) {
        var show = showTerms.bind(null, terms, step, at, byId, tokens);
        node.addEventListener("mouseenter", show);
        node.addEventListener("focus", show);
      }
      return node;
    }

    if (perKey) {
      item.appendChild(bars(step, tokens, cell));
    } else {
      var values = el("div", {"class": "wb-numbers"});
      var scale = maxAbs(step.values);
      for (var r = 0; r < rows; r++) {
        var line = el("div", {"class": "wb-number-row"});
        if (rows > 1) {  // as wide as the longest token (monospace): every row's strip starts at the same x
          var name = line.appendChild(el("span", {"class": "wb-row-label"}, tokens[r]));
          name.style.width = longest(tokens) + 1 + "ch";
        }
        var drawn = strip(step, r * width, width, scale);
        line.appendChild(drawn.node);
        if (step.start) {  // the numbers shown start at this head's slice, not at index 0
          line.appendChild(el("span", {"class": "wb-more"}, "this head's slice starts at index " + step.start + ":"));
        }
        for (var i = step.start; i < width && i < step.start + shown; i++) {
          line.appendChild(cell(r * width + i, number(step.values[r * width + i])));
        }
        if (width > shown) {
          line.appendChild(el("span", {"class": "wb-more"}, "… (" + width + " values" + (step.start ? "; this head's "
            + "from " + step.start : "") + ")"));
        }
        line.appendChild(drawn.readout);
        values.appendChild(line);
      }
      item.appendChild(values);
    }
    if (answer.ablated && step.id in ABLATED_NOTE) item.appendChild(ablatedNote(step, answer));
    item.appendChild(terms);
    return item;
  }

  // What an ablation puts in place of the head's z (Workbench mode), and what each step downstream of it says.
  var REPLACED = {zero: "0", mean: "its mean z over this text's tokens"};
  var ABLATED_NOTE = {z: true, concat: true, head_out: true};

  /** Under an ablated head's z (and the steps made from it): the hook holds the replacement, not Σ_s α_s v_s; z
      shows the run before the ablation's numbers, which the equation gives. */
  function ablatedNote(step, answer) {
    var replaced = REPLACED[answer.ablated.mode];
    var note = el("div", {"class": "wb-ablated-note"});
    if (step.id !== "z") {
      note.appendChild(document.createTextNode("ablated: made from the replaced z (" + replaced + "), not from Σ α v"));
      return note;
    }
    note.appendChild(document.createTextNode("ablated (" + answer.ablated.mode + "): the model's z here is replaced "
      + "by " + replaced + ", so the numbers above are not Σ_s α_s v_s. Before the ablation, z = Σ_s α_s v_s was: "));
    var before = answer.ablated.before.filter(function (s) { return s.id === "z"; })[0];
    var row = el("span", {"class": "wb-number-row wb-before"});
    before.values.slice(before.start, before.start + answer.shown).forEach(function (value, i) {
      row.appendChild(el("span", {"class": "wb-before-num", "data-index": String(before.start + i),
                                  "data-value": String(value)}, number(value)));
    });
    if (before.values.length > answer.shown) row.appendChild(el("span", {"class": "wb-more"}, "…"));
    note.appendChild(row);
    return note;
  }

  var STRIP = 384;  // px: the widest colour strip

  function maxAbs(values) {
    return values.reduce(function (m, v) { return v === null ? m : Math.max(m, Math.abs(v)); }, 0);
  }

  /** A colour (blue positive, orange negative, stronger: larger) for a signed value on the scale of its step. */
  function tint(value, scale) {
    if (value === null) return "transparent";
    var a = scale > 0 ? Math.min(Math.abs(value) / scale, 1) : 0;
    return value >= 0 ? "rgba(31, 119, 180, " + a.toFixed(3) + ")" : "rgba(245, 127, 23, " + a.toFixed(3) + ")";
  }

  /** `count` values from `from` as a strip of coloured cells, STRIP px at most (a 1,536-value FFN row is squeezed
      to fit: a canvas of one pixel per value, drawn narrower); hovering names the value under the pointer, with its
      index, in the strip's readout. */
  function strip(step, from, count, scale) {
    var wrap = el("span", {"class": "wb-strip", title: "hover: each value with its index"});
    var canvas = el("canvas", {"class": "wb-strip-cells", width: count, height: 1,
                               "aria-label": step.label + ": " + count + " values as colours"});
    canvas.style.width = Math.min(STRIP, count * 8) + "px";
    var context = canvas.getContext("2d");
    for (var i = 0; i < count; i++) {
      context.fillStyle = tint(step.values[from + i], scale);
      context.fillRect(i, 0, 1, 1);
    }
    var readout = el("span", {"class": "wb-strip-readout"});
    canvas.addEventListener("mousemove", function (e) {
      var i = Math.min(count - 1, Math.max(0, Math.floor(e.offsetX / canvas.clientWidth * count)));
      var part = step.start && i >= step.start && i < step.start + answerHeadWidth(step) ? " (this head's)" : "";
      readout.textContent = "[" + i + "] = " + number(step.values[from + i]) + part;
      canvas.dataset.hovered = String(step.values[from + i]);
    });
    canvas.addEventListener("mouseleave", function () { readout.textContent = ""; });
    wrap.appendChild(canvas);
    if (step.start) {  // this head's slice of the concatenation, marked under the strip
      var mark = el("span", {"class": "wb-strip-slice"});
      mark.style.left = (step.start / count * 100).toFixed(2) + "%";
      mark.style.width = (answerHeadWidth(step) / count * 100).toFixed(2) + "%";
      var holder = el("span", {"class": "wb-strip-holder"});
      holder.appendChild(canvas);
      holder.appendChild(mark);
      holder.style.width = canvas.style.width;
      wrap.appendChild(holder);
    }
    return {node: wrap, readout: readout};
  }

  function answerHeadWidth(step) {  // K: a head's slice in the concatenation of H heads
    return step.shape[0] / config.models[0].heads;
  }

  function longest(tokens) {  // characters of the longest token
    return tokens.reduce(function (m, token) { return Math.max(m, token.length); }, 0);
  }

  var BAR_LABEL_CHARS = 7;  // characters of a token that fit a bar's column (workbench.css's .wb-bar-col, monospace)

  /** One value per key token as bars (q·k and the scores signed around a baseline, the softmax from 0 to 1), each
      with its number (`cell`) and its token below; −∞ (a masked key) has no bar. */
  function bars(step, tokens, cell) {
    // Whole tokens under the bars: written upright (bottom to top) where one is wider than a column.
    var chart = el("div", {"class": "wb-bars" + (longest(tokens) > BAR_LABEL_CHARS ? " wb-bars-upright" : ""),
                           role: "group", "aria-label": step.label + ", one bar per key token"});
    var scale = maxAbs(step.values), signed = step.values.some(function (v) { return v !== null && v < 0; });
    step.values.forEach(function (value, s) {
      var column = el("div", {"class": "wb-bar-col", "data-key": String(s)});
      var track = el("div", {"class": "wb-bar-track" + (signed ? " wb-signed" : "")});
      if (value !== null) {
        var bar = el("div", {"class": "wb-bar-fill" + (value < 0 ? " wb-negative" : ""), "data-value": String(value)});
        var share = scale > 0 ? Math.abs(value) / scale : 0;
        bar.style.height = (signed ? 50 * share : 100 * share).toFixed(1) + "%";
        if (signed) bar.style[value < 0 ? "top" : "bottom"] = "50%";
        track.appendChild(bar);
      }
      column.appendChild(track);
      column.appendChild(cell(s, number(value)));
      column.appendChild(el("span", {"class": "wb-bar-token", title: "key “" + tokens[s] + "” (s = " + s + ", "
                                                                    + "0-indexed)"}, tokens[s]));
      chart.appendChild(column);
    });
    return chart;
  }

  /** "from: x, a · in: neuron view": links that scroll to (and outline) the operands' steps and the views showing
      this step's values. */
  function links(panel, step, byId) {
    var wrap = el("span", {"class": "wb-links"});
    var targets = step.from.filter(function (id) { return byId[id]; }).map(function (id) {
      return {text: byId[id].label, id: prefix + "step-" + panel.n + "-" + id};
    });
    if (targets.length) wrap.appendChild(document.createTextNode(" ← from "));
    targets.forEach(function (target, n) {
      if (n) wrap.appendChild(document.createTextNode(", "));
      wrap.appendChild(jump(target.text, target.id));
    });
    (step.views || []).forEach(function (kind, n) {
      wrap.appendChild(document.createTextNode(n ? ", " : " · drawn in the "));
      var n = panel.of != null ? panel.of : panel.n;  // a second head's steps link to its model's views
      wrap.appendChild(jump(kind + " view", prefix + "view-" + n + "-" + kind + "-"
                                            + (state.ablate[n].length ? "after" : "only")));
    });
    return wrap;
  }

  function jump(text, id) {
    var link = el("button", {type: "button", "class": "wb-jump", "data-target": id}, text);
    link.addEventListener("click", function () {
      var target = app.querySelector("#" + id) || app.querySelector("#" + id.replace(/-only$/, "-before"));
      if (!target) return;
      target.scrollIntoView({block: "center"});
      target.classList.add("wb-flash");
      setTimeout(function () { target.classList.remove("wb-flash"); }, 1500);
    });
    return link;
  }

  /** Every term of a dot-product value j: left × right for each index the sum runs over (i; or s, the key tokens,
      named by token), their sum, the bias, the divisor. */
  function showTerms(box, step, j, byId, tokens) {
    var dot = step.dot, left = byId[dot.left].values, right = dot.right[j], sum = 0;
    var overKeys = dot.over === "s", index = overKeys ? "s" : "i", leftName = byId[dot.left].label;
    while (box.firstChild) box.removeChild(box.firstChild);
    var name = step.per_key ? "key “" + tokens[j] + "” (s = " + j + ")" : (overKeys ? "i" : "j") + " = " + j;
    var divisor = dot.divisor !== 1 ? " / " + (dot.divisor_text || number(dot.divisor)) : "";
    box.appendChild(el("div", {"class": "wb-terms-head"}, step.label + ", " + name + " = (Σ_" + index + " "
      + leftName + "_" + index + " × " + dot.right_name + "_" + index + (dot.bias ? " + b_j" : "") + ")" + divisor
      + ": " + left.length + " terms" + (overKeys ? ", one per key token s" : "")));
    var table = el("table", {"class": "wb-terms-table"});
    var header = el("tr");
    [overKeys ? "s (key token)" : "i", leftName, dot.right_name, "product"].forEach(function (h) {
      header.appendChild(el("th", {}, h));
    });
    table.appendChild(header);
    left.forEach(function (a, i) {
      var product = a * right[i];
      sum += product;
      var row = el("tr", {"class": "wb-term", "data-left": String(a), "data-right": String(right[i]),
                          "data-product": String(product)});
      [overKeys ? tokens[i] + " (" + i + ")" : String(i), number(a), number(right[i]), number(product)]
        .forEach(function (t) { row.appendChild(el("td", {}, t)); });
      table.appendChild(row);
    });
    var scroller = box.appendChild(el("div", {"class": "wb-terms-scroll"}));
    scroller.appendChild(table);
    var sight = box.appendChild(el("div", {"class": "wb-terms-sight"}));
    var total = (sum + (dot.bias ? dot.bias[j] : 0)) / dot.divisor;
    var hook = step.values[j] === null ? "−∞: a masked key" : number(step.values[j]);
    box.appendChild(el("div", {"class": "wb-terms-sum", "data-sum": String(sum), "data-value": String(total)},
                       "Σ over all " + left.length + " terms = " + number(sum)
                       + (dot.bias ? "; + b_j (" + number(dot.bias[j]) + ")" : "") + divisor + " = " + number(total)
                       + "  (the hook's value: " + hook + ")"));
    box.hidden = false;
    var rows = table.querySelectorAll("tr.wb-term");
    scroller.addEventListener("scroll", function () { sayInSight(sight, scroller, rows, index); });
    sayInSight(sight, scroller, rows, index);
  }

  /** Under a terms table taller than its box: which rows are in sight, of how many, and their sum, labelled as
      partial (a student adding the rows in sight otherwise expects the total below); nothing when all fit. */
  function sayInSight(sight, scroller, rows, index) {
    var box = scroller.getBoundingClientRect(), first = -1, last = -1, sum = 0;
    rows.forEach(function (row, n) {
      var r = row.getBoundingClientRect();
      if (r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5) return;
      if (first < 0) first = n;
      last = n;
      sum += Number(row.dataset.product);
    });
    sight.hidden = first < 0 || (first === 0 && last === rows.length - 1);
    if (sight.hidden) return;
    sight.dataset.first = String(first);
    sight.dataset.last = String(last);
    sight.dataset.sum = String(sum);
    sight.textContent = "rows " + index + " = " + first + "–" + last + " in sight (" + (last - first + 1) + " of "
      + rows.length + "; scroll the table for the rest): their products sum to " + number(sum) + ", a part of Σ";
  }

  /** The hover text of one number: the values it came from (same index where the operand has the same size). */
  function operands(step, at, byId) {
    var parts = [step.label + "[" + at + "] = " + number(step.values[at])];
    step.from.forEach(function (id) {
      var source = byId[id];
      if (!source) return;
      if (source.values.length === step.values.length) {
        parts.push(source.label + "[" + at + "] = " + number(source.values[at]));
      } else {
        parts.push(source.label + " (" + source.shape.join("×") + "): ‖·‖ = " + number(norm(source.values)));
      }
    });
    return parts.join("\n");
  }

  function norm(values) {
    return Math.sqrt(values.reduce(function (s, v) { return s + v * v; }, 0));
  }

  // ---- the figure: the step-through for slides -------------------------------------------------------

  var SVG_NS = "http://www.w3.org/2000/svg";
  var FIG = {font: 14, char: 8.43, line: 20, track: 48, key: 64, keysPerRow: 10, gap: 32};  // px; char: 0.6 em

  function vector(tag, attrs, text) {
    var node = document.createElementNS(SVG_NS, tag);
    for (var name in attrs) node.setAttribute(name, attrs[name]);
    if (text != null) node.textContent = text;
    return node;
  }

  /** minibert-step-through-MODEL-L2-H5-query-3[-and-L3-H1]: what the figure shows (heads as "L-H", 1-indexed). */
  function figureName(panel) {
    var answers = drawn[panel.n].answers, head = function (a) { return "L" + (a.layer + 1) + "-H" + (a.head + 1); };
    return "step-through-" + page.modelName(panel.n) + "-" + head(answers[0]) + "-query-" + answers[0].query
      + (answers[1] ? "-and-" + head(answers[1]) : "");
  }

  /** The step-through as a picture for slides, {node: SVG, width, height}, dark on white whatever the page's theme:
      each head a column (two side by side when compared), its title, then each step's label and equation and its
      values as the page draws them: a colour strip per vector with its first numbers below, bars for one value
      per key with their numbers and tokens. Monospace throughout, so that a text's width is its length × 0.6 em. */
  function figure(panel, answers) {
    var node = vector("svg", {xmlns: SVG_NS, "font-family": "DejaVu Sans Mono, Menlo, Consolas, monospace",
                              "font-size": FIG.font, fill: "#1f2328"});
    var background = node.appendChild(vector("rect", {fill: "#ffffff"})), x0 = 16, width = 0, height = 0;
    answers.forEach(function (answer) {
      var column = drawHead(node, panel, answer, x0, 16);
      width = x0 + column.width;
      height = Math.max(height, column.height);
      x0 = width + FIG.gap;
    });
    width += 16;
    height += 16;
    [[background, "width", width], [background, "height", height], [node, "width", width], [node, "height", height],
     [node, "viewBox", "0 0 " + width + " " + height]].forEach(function (a) { a[0].setAttribute(a[1], a[2]); });
    return {node: node, width: width, height: height};
  }

  /** One head's steps at (x0, y0): {width, height} of what it drew. */
  function drawHead(node, panel, answer, x0, y0) {
    var y = y0, right = 0;
    function text(x, t, attrs) {  // one line of text from x at the current y; the right edge grows to hold it
      var line = node.appendChild(vector("text", Object.assign({x: x, y: y}, attrs || {}), t));
      right = Math.max(right, x - x0 + t.length * FIG.char * (attrs && attrs["font-size"] ? attrs["font-size"]
        / FIG.font : 1));
      return line;
    }
    y += FIG.line;
    text(x0, "Head " + labelBoth(panel.n, answer.layer, answer.head) + " · query “" + answer.tokens[answer.query]
      + "” (position " + answer.query + ")", {"font-weight": "bold"});
    if (answer.ablated) {
      y += FIG.line;
      text(x0, "ablated (" + answer.ablated.mode + "): its z is replaced by " + REPLACED[answer.ablated.mode],
           {fill: "#a40e26"});
    }
    answer.steps.forEach(function (step, n) {
      y += FIG.line * 1.5;
      text(x0, (n + 1) + ". " + step.label + ": " + step.equation, {"font-weight": "bold"});
      var scale = maxAbs(step.values);
      if (step.per_key && step.shape.length === 1) {
        y = drawBars(step, answer.tokens, scale, x0, y, text, node);
        right = Math.max(right, Math.min(step.values.length, FIG.keysPerRow) * FIG.key);
        return;
      }
      var width = step.shape.length === 2 ? step.shape[1] : step.values.length;
      var rows = step.shape.length === 2 ? step.shape[0] : 1, indent = rows > 1 ? (longest(answer.tokens) + 1)
        * FIG.char : 0;
      for (var r = 0; r < rows; r++) {
        y += 8;
        if (rows > 1) text(x0, answer.tokens[r], {fill: "#57606a", y: y + 11});
        var wide = Math.min(STRIP, width * 8), cell = wide / width;
        for (var i = 0; i < width; i++) {
          var v = step.values[r * width + i];
          if (v !== null && v !== 0) {
            node.appendChild(vector("rect", {x: x0 + indent + i * cell, y: y, width: cell + 0.05, height: 14,
                                             fill: tint(v, scale)}));
          }
        }
        node.appendChild(vector("rect", {x: x0 + indent, y: y, width: wide, height: 14, fill: "none",
                                         stroke: "#8c959f"}));
        right = Math.max(right, indent + wide);
        y += 14 + FIG.line;
        var shown = step.values.slice(r * width + step.start, r * width + Math.min(width, step.start + answer.shown));
        text(x0 + indent, (step.start ? "[" + step.start + ":] " : "") + shown.map(number).join("  ")
          + (width > answer.shown ? "  … (" + width + " values)" : ""), {"class": "wb-fig-numbers"});
      }
    });
    return {width: right, height: y + 8 - y0};
  }

  /** One value per key as bars (signed ones around a middle line), each with its number and token below:
      FIG.keysPerRow keys a row, the first at y. Returns the y below them. text(x, t, attrs) writes at attrs.y. */
  function drawBars(step, tokens, scale, x0, y, text, node) {
    var signed = step.values.some(function (v) { return v !== null && v < 0; });
    for (var from = 0; from < step.values.length; from += FIG.keysPerRow) {
      var top = y + 8;
      step.values.slice(from, from + FIG.keysPerRow).forEach(function (value, k) {
        var s = from + k, x = x0 + k * FIG.key, mid = x + FIG.key / 2;
        node.appendChild(vector("rect", {x: mid - 7, y: top, width: 14, height: FIG.track, fill: "#f6f8fa"}));
        var base = signed ? top + FIG.track / 2 : top + FIG.track;
        node.appendChild(vector("line", {x1: mid - 9, x2: mid + 9, y1: base, y2: base, stroke: "#8c959f"}));
        if (value !== null) {
          var h = (signed ? FIG.track / 2 : FIG.track) * (scale > 0 ? Math.abs(value) / scale : 0);
          node.appendChild(vector("rect", {x: mid - 7, y: value < 0 ? base : base - h, width: 14, height: h,
                                           fill: value < 0 ? "#f57f17" : "#1f77b4", "data-key": String(s)}));
        }
        text(mid, number(value), {y: top + FIG.track + 16, "text-anchor": "middle", "font-size": 12,
                                  "class": "wb-fig-value", "data-key": String(s)});
        var size = Math.min(12, (FIG.key - 4) / (tokens[s].length * 0.6));  // the whole token, smaller if long
        text(mid, tokens[s], {y: top + FIG.track + 32, "text-anchor": "middle", "font-size": size.toFixed(1),
                              fill: "#57606a"});
      });
      y = top + FIG.track + 40;
    }
    return y;
  }

  return {show: showSteps, norm: norm};
}

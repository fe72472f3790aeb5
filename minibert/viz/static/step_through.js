/* minibert workbench, the step-through: one head's computation for one query token, each step's equation with its
   values drawn (a colour strip per vector, bars for one value per key) and their numbers beside them, links to the
   steps it is computed from and the views that draw it, and every term of a dot product on hover. The workbench
   (workbench.js) builds it with what it shares: minibertStepThrough(page) → {show(panel, answer), norm}. */
/** page: {app, config, prefix, state, el, number, select, renew, choose, labelBoth}. */
function minibertStepThrough(page) {
  "use strict";
  var app = page.app, config = page.config, prefix = page.prefix, state = page.state, el = page.el;
  var number = page.number, select = page.select, renew = page.renew, choose = page.choose;
  var labelBoth = page.labelBoth;

  function numbered(count) {  // select options "1 (0-indexed: 0)", …
    var out = [];
    for (var i = 0; i < count; i++) out.push({value: String(i), text: (i + 1) + "  (0-indexed: " + i + ")"});
    return out;
  }

  var unscaled = false;  // the ÷√K switch off: a what-if row, softmax(q·k) without the division, under the softmax

  function showSteps(panel, answer) {
    var part = panel.step;
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
    part.appendChild(pick);
    var list = el("ol", {"class": "wb-steps"});
    answer.steps.forEach(function (step) {
      var item = list.appendChild(stepItem(panel, step, byId, answer));
      if (unscaled && step.id === "pattern" && byId.qk && byId.scaled) item.appendChild(whatIf(panel, byId, answer));
    });
    part.appendChild(list);
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
      wrap.appendChild(jump(kind + " view", prefix + "view-" + panel.n + "-" + kind + "-"
                                            + (state.ablate[panel.n].length ? "after" : "only")));
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

  return {show: showSteps, norm: norm};
}

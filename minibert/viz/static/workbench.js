/* minibert workbench (minibert serve's page, and viz.explore's widget): text in, tokens, the views (drawn by
   views.js's render), the outputs before and after ablating heads, and a step-through of one head.
   minibertWorkbench(app, config, options) builds one workbench inside the element `app`; everything it
   keeps is in that call (no globals), its element ids start with options.prefix, and it finds its
   elements through `app`: a notebook page holds as many as it likes. It talks through options.send(action,
   body) → a promise of the answer: POST /api/ACTION to its own server on the page (the boot at the end), a
   message to the kernel in the widget (explore.py). User text reaches the page through textContent and
   value only, never as markup. Every control is a button, select or input: reachable by keyboard. */
/** config: {models: [info answers], tour}; options: {send, render (views.js's render), prefix}. */
function minibertWorkbench(app, config, options) {
  "use strict";
  var prefix = options.prefix, send = options.send;
  app.classList.add("wb-app");
  // baseline: the text and sentence B before the first token replacement since the last edit (the "before" side)
  var state = {ablate: config.models.map(function () { return []; }), query: 1, layer: 0, head: 0, timer: null,
               runs: 0, baseline: null};

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    for (var name in attrs || {}) if (attrs[name] != null) node.setAttribute(name, attrs[name]);
    if (text != null) node.textContent = text;
    return node;
  }

  function number(value) {
    if (value === null) return "−∞";  // a masked score (JSON has no number for it)
    var text = Math.abs(value) >= 1e4 || (value !== 0 && Math.abs(value) < 1e-3) ? value.toExponential(2)
      : value.toFixed(3);
    return text;
  }

  // ---- the controls ---------------------------------------------------------------------------------

  var status = el("div", {"class": "wb-status", role: "status", "aria-live": "polite"});
  var controls = el("div", {"class": "wb-controls"});
  var textLabel = el("label", {"for": prefix + "text"}, "Text");
  var text = el("textarea", {id: prefix + "text", rows: 2, maxlength: config.models[0].max_chars});
  text.value = "The cat sat on the mat because it was tired.";
  var pairLabel = el("label", {"for": prefix + "pair"}, "Sentence B (optional)");
  var pair = el("input", {id: prefix + "pair", "class": "wb-pair", type: "text",
                          maxlength: config.models[0].max_chars});
  var mode = select(prefix + "mode", "Ablation", config.models[0].ablation_modes);
  var mixing = select(prefix + "mixing", "Views show", config.models[0].mixing_methods);
  var clearButton = el("button", {id: prefix + "clear", type: "button"}, "Clear ablations");
  var maskButton = el("button", {id: prefix + "mask", type: "button"}, "[MASK] the chosen token");
  var replaceLabel = el("label", {"for": prefix + "replace"}, "Replace the chosen token with");
  var replace = el("input", {id: prefix + "replace", type: "text", size: 10});
  var replaceButton = el("button", {id: prefix + "replace-go", type: "button"}, "Replace");
  [textLabel, text, pairLabel, pair, mode.wrap, mixing.wrap, clearButton, maskButton, replaceLabel, replace,
   replaceButton].forEach(function (node) { controls.appendChild(node); });
  app.appendChild(el("h1", {}, "minibert workbench"));
  app.appendChild(controls);
  app.appendChild(status);

  function select(id, label, options) {
    var wrap = el("label", {"for": id, "class": "wb-select"}, label + " ");
    var node = el("select", {id: id});
    options.forEach(function (o) { node.appendChild(el("option", {value: o}, o.replace("_", " "))); });
    wrap.appendChild(node);
    return {wrap: wrap, node: node};
  }

  var columns = el("div", {"class": "wb-columns"});
  app.appendChild(columns);
  var panels = config.models.map(function (info, n) { return modelPanel(info, n); });

  function section(parent, title, id) {
    var part = el("section", {"class": "wb-section", id: id, "aria-label": title});
    part.appendChild(el("h2", {}, title));
    parent.appendChild(part);
    return part;
  }

  function modelPanel(info, n) {
    var column = el("div", {"class": "wb-column", id: prefix + "model-" + n});
    column.appendChild(el("div", {"class": "wb-model-name"}, info.architecture + " · " + info.model));
    columns.appendChild(column);
    var panel = {info: info, n: n};
    panel.tokens = section(column, "Tokens", prefix + "tokens-" + n);
    panel.heads = section(column, "Heads (click to ablate)", prefix + "heads-" + n);
    panel.outputs = section(column, "Outputs", prefix + "outputs-" + n);
    panel.step = section(column, "Step through one head", prefix + "step-" + n);
    panel.views = section(column, "Views", prefix + "views-" + n);
    panel.headButtons = [];
    var grid = el("div", {"class": "wb-grid", role: "group", "aria-label": "heads of model " + n});
    grid.style.gridTemplateColumns = "repeat(" + info.heads + ", max-content)";  // one row per layer
    for (var layer = 0; layer < info.layers; layer++) {
      for (var head = 0; head < info.heads; head++) {
        var button = el("button", {type: "button", "class": "wb-head", "data-layer": layer, "data-head": head,
                                   id: prefix + "head-" + n + "-" + layer + "-" + head,
                                   "aria-pressed": "false",
                                   title: "layer " + layer + ", head " + head + " (0-indexed): click to ablate"},
                        (layer + 1) + "-" + (head + 1));
        button.addEventListener("click", toggleHead.bind(null, n, layer, head));
        grid.appendChild(button);
        panel.headButtons.push(button);
      }
    }
    panel.heads.appendChild(grid);
    return panel;
  }

  function toggleHead(n, layer, head) {
    var list = state.ablate[n];
    var at = list.findIndex(function (p) { return p[0] === layer && p[1] === head; });
    if (at >= 0) list.splice(at, 1); else list.push([layer, head]);
    state.layer = layer;
    state.head = head;
    refresh();
  }

  // ---- requests -------------------------------------------------------------------------------------

  function body(n, extra) {
    var request = {model: n, text: text.value, ablate: state.ablate[n], mode: mode.node.value};
    if (pair.value.trim()) request.pair = pair.value;
    for (var key in extra || {}) request[key] = extra[key];
    return request;
  }

  function refresh() {
    clearTimeout(state.timer);
    state.timer = null;
    var ticket = ++state.runs;
    var focused = app.contains(document.activeElement) && document.activeElement.id;  // redrawn ones get it back
    app.setAttribute("aria-busy", "true");
    var work = panels.map(function (panel) {
      return send("run", body(panel.n)).then(function (answer) {
        if (ticket !== state.runs) return null;
        state.query = Math.min(state.query, answer.tokens.length - 1);
        showTokens(panel, answer);
        showHeads(panel);
        var shown = comparison(panel, answer).then(function (compared) {
          if (ticket !== state.runs) return;
          showOutputs(panel, compared.outputs, compared.titles);
          showViews(panel, compared.sides);
        });
        return Promise.all([shown, stepThrough(panel, ticket)]);
      });
    });
    Promise.all(work).then(function () {
      if (ticket !== state.runs) return;
      status.textContent = "";
      var again = focused && app.querySelector("#" + focused);
      if (again && !app.contains(document.activeElement)) again.focus();
      app.setAttribute("aria-busy", "false");
    }, function (error) {
      if (ticket !== state.runs) return;
      status.textContent = error.message;
      app.setAttribute("aria-busy", "false");
    });
  }

  /** What refresh draws: the outputs and the views (raw attention from the run's answer, or the chosen mixing
      maps) of this run alone, or, after an ablation or a token replacement, those of the run before it (the text
      before any replacement, no head ablated) beside this one's. An ablation's outputs both come in the run's
      answer; a replacement's "before" is the earlier text's own run. */
  function comparison(panel, answer) {
    var method = mixing.node.value;
    var now = [text.value, pair.value.trim()];
    var then = state.baseline ? [state.baseline.text, state.baseline.pair.trim()] : now;
    var replaced = then[0] !== now[0] || then[1] !== now[1];
    var after = viewsOf(panel, method, {}, answer);
    if (!answer.ablated.length && !replaced) {
      keep(panel, now, "run", Promise.resolve(answer));
      keep(panel, now, method, after);
      return after.then(function (views) {
        return {sides: [{side: "only", views: views}], outputs: answer.outputs, titles: {}};
      });
    }
    var earlier = unablated(panel, then, "run");
    var before = method === "attention" ? earlier.then(function (run) { return run.views; })
      : unablated(panel, then, method);
    var outputs = !replaced ? Promise.resolve(answer.outputs) : earlier.then(function (run) {
      return {before: run.outputs.before, after: answer.outputs.after || answer.outputs.before};
    });
    var changes = replaced ? ["the token replaced"] : [];
    if (answer.ablated.length) {
      changes.push("ablated (" + answer.mode + "): " + answer.ablated.map(function (p) {
        return (p[0] + 1) + "-" + (p[1] + 1);
      }).join(", "));
    }
    var titles = {before: "Before" + (replaced ? ": " + then[0] : ""), after: "After: " + changes.join("; ")};
    return Promise.all([before, after, outputs]).then(function (all) {
      return {sides: [{side: "before", title: titles.before, views: all[0]},
                      {side: "after", title: titles.after, views: all[1]}], outputs: all[2], titles: titles};
    });
  }

  /** A promise of `what` ("run": the run's answer; a mixing method: its views) for the text `words` ([text,
      sentence B]) with no head ablated: asked for once and kept while that text is the one compared against,
      so clicking heads asks the server for nothing more than the ablated run. */
  function unablated(panel, words, what) {
    var kept = panel.kept && panel.kept.text === JSON.stringify(words) && panel.kept[what];
    return kept || keep(panel, words, what, what === "run"
      ? send("run", body(panel.n, {ablate: [], text: words[0], pair: words[1] || null}))
      : viewsOf(panel, what, {ablate: [], text: words[0], pair: words[1] || null}));
  }

  function keep(panel, words, what, promise) {
    var textKey = JSON.stringify(words);
    if (!panel.kept || panel.kept.text !== textKey) panel.kept = {text: textKey};
    panel.kept[what] = promise;
    promise.catch(function () { if (panel.kept[what] === promise) delete panel.kept[what]; });  // ask again
    return promise;
  }

  /** The views of one run: the run's own answer's for raw attention (asked for when not given), else its mixing. */
  function viewsOf(panel, method, extra, answer) {
    if (method === "attention" && answer) return Promise.resolve(answer.views);
    var action = method === "attention" ? "run" : "mixing";
    if (action === "mixing") extra.method = method;
    return send(action, body(panel.n, extra)).then(function (reply) { return reply.views; });
  }

  function later() {
    state.baseline = null;  // an edit of the text starts a new comparison
    app.setAttribute("aria-busy", "true");  // from the keystroke on: the panels are about to change
    state.runs++;  // answers still coming for the text before this edit are dropped
    clearTimeout(state.timer);
    state.timer = setTimeout(refresh, 200);
  }

  // ---- tokens, heads, outputs -----------------------------------------------------------------------

  function showTokens(panel, answer) {
    var part = panel.tokens;
    while (part.childNodes.length > 1) part.removeChild(part.lastChild);
    var row = el("div", {"class": "wb-token-row", role: "group", "aria-label": "tokens"});
    answer.tokens.forEach(function (tokenText, i) {
      var button = el("button", {type: "button", "class": "wb-token" + (i === state.query ? " wb-chosen" : ""),
                                 id: prefix + "token-" + panel.n + "-" + i, "data-index": i,
                                 "aria-pressed": String(i === state.query),
                                 title: "position " + i + ": click to step through it as the query"}, tokenText);
      if (answer.sentence_b_start != null && i >= answer.sentence_b_start) button.classList.add("wb-b");
      button.addEventListener("click", function () { state.query = i; refresh(); });
      row.appendChild(button);
    });
    part.appendChild(row);
    panel.offsets = answer.offsets;
    panel.sentenceB = answer.sentence_b_start;
  }

  function showHeads(panel) {
    panel.headButtons.forEach(function (button) {
      var layer = Number(button.dataset.layer), head = Number(button.dataset.head);
      var on = state.ablate[panel.n].some(function (p) { return p[0] === layer && p[1] === head; });
      button.setAttribute("aria-pressed", String(on));
    });
  }

  /** outputs: {before} alone, or {before, after} with their titles. */
  function showOutputs(panel, outputs, titles) {
    var part = panel.outputs;
    while (part.childNodes.length > 1) part.removeChild(part.lastChild);
    var sides = Object.keys(outputs);
    var any = false;
    sides.forEach(function (side) {
      var block = el("div", {"class": "wb-output", "data-side": side});
      block.appendChild(el("h3", {}, sides.length > 1 ? titles[side] : "Output"));
      var result = outputs[side];
      (result.mlm || []).forEach(function (masked) {
        block.appendChild(el("div", {}, "[MASK] at position " + masked.position + ":"));
        masked.top.forEach(function (guess) { block.appendChild(valueRow(guess.token, guess.p, "mlm")); });
        any = true;
      });
      (result.classes || []).forEach(function (c) { block.appendChild(valueRow(c.label, c.p, "class")); any = true; });
      if (result.similarity != null) {
        block.appendChild(valueRow("cosine similarity of A and B", result.similarity, "similarity"));
        any = true;
      }
      part.appendChild(block);
    });
    if (!any) {
      var hint = panel.info.outputs.indexOf("mlm") >= 0 ? "Put a " + panel.info.mask_token + " in the text to see "
        + "the model's guesses." : panel.info.outputs.indexOf("similarity") >= 0 ? "Type a sentence B to see the "
        + "A–B similarity." : "This checkpoint has no head: the views and the step-through show what changes.";
      part.appendChild(el("p", {"class": "wb-hint"}, hint));
    }
  }

  function valueRow(label, value, kind) {
    var row = el("div", {"class": "wb-value", "data-kind": kind, "data-label": label, "data-value": String(value)});
    row.appendChild(el("span", {"class": "wb-value-label"}, label));
    var bar = el("span", {"class": "wb-bar"});
    bar.style.width = Math.round(Math.max(0, Math.min(1, value)) * 120) + "px";
    row.appendChild(bar);
    row.appendChild(el("span", {"class": "wb-value-number"}, value.toFixed(4)));
    return row;
  }

  // ---- views ----------------------------------------------------------------------------------------

  /** sides: [{side: "only" | "before" | "after", title, views}], drawn next to each other (stacked when narrow). */
  function showViews(panel, sides) {
    var part = panel.views;
    while (part.childNodes.length > 1) part.removeChild(part.lastChild);
    var row = el("div", {"class": "wb-view-sides"});
    sides.forEach(function (side) {
      var column = el("div", {"class": "wb-view-side", "data-side": side.side});
      if (side.title) column.appendChild(el("h3", {}, side.title));
      Object.keys(side.views).forEach(function (kind) {
        var root = el("div", {"class": "mbv mbv-light wb-view", "data-mbv-kind": kind});
        column.appendChild(root);
        options.render(root, side.views[kind]);
      });
      row.appendChild(column);
    });
    part.appendChild(row);
  }

  // ---- step-through ---------------------------------------------------------------------------------

  function stepThrough(panel, ticket) {
    return send("step", body(panel.n, {layer: state.layer, head: state.head, query: state.query}))
      .then(function (answer) { if (ticket === state.runs) showSteps(panel, answer); });
  }

  function showSteps(panel, answer) {
    var part = panel.step;
    while (part.childNodes.length > 1) part.removeChild(part.lastChild);
    var pick = el("div", {"class": "wb-step-pick"});
    var layers = [], heads = [];
    for (var l = 0; l < panel.info.layers; l++) layers.push(String(l));
    for (var h = 0; h < panel.info.heads; h++) heads.push(String(h));
    var layer = select(prefix + "step-layer-" + panel.n, "Layer (0-indexed)", layers);
    var head = select(prefix + "step-head-" + panel.n, "Head", heads);
    layer.node.value = String(answer.layer);
    head.node.value = String(answer.head);
    layer.node.addEventListener("change", function () { state.layer = Number(layer.node.value); refresh(); });
    head.node.addEventListener("change", function () { state.head = Number(head.node.value); refresh(); });
    pick.appendChild(layer.wrap);
    pick.appendChild(head.wrap);
    pick.appendChild(el("span", {}, " query token: " + answer.tokens[answer.query] + " (position " + answer.query
                                    + "; click a token to change)"));
    part.appendChild(pick);
    var byId = {};
    answer.steps.forEach(function (step) { byId[step.id] = step; });
    var list = el("ol", {"class": "wb-steps"});
    answer.steps.forEach(function (step) { list.appendChild(stepItem(step, byId, answer.tokens, answer.shown)); });
    part.appendChild(list);
  }

  function stepItem(step, byId, tokens, shown) {
    var item = el("li", {"class": "wb-step", "data-step": step.id});
    item.appendChild(el("span", {"class": "wb-step-label"}, step.label + ": "));
    item.appendChild(el("code", {"class": "wb-equation"}, step.equation));
    var values = el("div", {"class": "wb-numbers"});
    var perToken = step.shape.length === 1 && step.shape[0] === tokens.length
      && /qk|c2c|c2p|p2c|scaled|pattern/.test(step.id);  // one value per key (DeBERTa's three terms too)
    var width = step.shape.length === 2 ? step.shape[1] : step.values.length;
    var rows = step.shape.length === 2 ? step.shape[0] : 1;
    var terms = el("div", {"class": "wb-terms", hidden: ""});
    for (var r = 0; r < rows; r++) {
      var line = el("div", {"class": "wb-number-row"});
      if (rows > 1 || perToken) line.appendChild(el("span", {"class": "wb-row-label"}, rows > 1 ? tokens[r] : ""));
      for (var i = 0; i < width && i < (perToken ? width : shown); i++) {
        var at = r * width + i;
        var value = step.values[at];
        var label = perToken ? tokens[i] + " " : "";
        var cell = el("span", {"class": "wb-num", tabindex: "0", "data-index": at, "data-value": String(value),
                               title: operands(step, at, byId)}, label + number(value));
        if (step.dot && rows === 1 && at < step.dot.right.length && byId[step.dot.left]) {
          var show = showTerms.bind(null, terms, step, at, byId, tokens);
          cell.addEventListener("mouseenter", show);
          cell.addEventListener("focus", show);
        }
        line.appendChild(cell);
      }
      if (width > shown && !perToken) line.appendChild(el("span", {"class": "wb-more"}, "… (" + width + " values)"));
      values.appendChild(line);
    }
    item.appendChild(values);
    item.appendChild(terms);
    return item;
  }

  /** Every term of a dot-product value j: left_i × right_i for each i, their sum, the bias, the divisor. */
  function showTerms(box, step, j, byId, tokens) {
    var dot = step.dot, left = byId[dot.left].values, right = dot.right[j], sum = 0;
    while (box.firstChild) box.removeChild(box.firstChild);
    var name = /^(qk|c2c|scaled)$/.test(step.id) ? "key " + tokens[j] + " (s = " + j + ")" : "j = " + j;
    box.appendChild(el("div", {"class": "wb-terms-head"}, step.label + ", " + name + " = (Σ_i " + byId[dot.left].label
      + "_i × " + dot.right_name + "_i" + (dot.bias ? " + b_j" : "") + ")" + (dot.divisor !== 1 ? " / "
      + number(dot.divisor) : "") + ": " + left.length + " terms"));
    var table = el("table", {"class": "wb-terms-table"});
    var header = el("tr");
    ["i", byId[dot.left].label, dot.right_name, "product"].forEach(function (h) {
      header.appendChild(el("th", {}, h));
    });
    table.appendChild(header);
    left.forEach(function (a, i) {
      var product = a * right[i];
      sum += product;
      var row = el("tr", {"class": "wb-term", "data-left": String(a), "data-right": String(right[i]),
                          "data-product": String(product)});
      [String(i), number(a), number(right[i]), number(product)].forEach(function (t) {
        row.appendChild(el("td", {}, t));
      });
      table.appendChild(row);
    });
    box.appendChild(el("div", {"class": "wb-terms-scroll"})).appendChild(table);
    var total = (sum + (dot.bias ? dot.bias[j] : 0)) / dot.divisor;
    var hook = step.values[j] === null ? "−∞: a masked key" : step.values[j];
    box.appendChild(el("div", {"class": "wb-terms-sum", "data-sum": String(sum), "data-value": String(total)},
                       "Σ = " + sum + (dot.bias ? "; + b_j (" + dot.bias[j] + ")" : "") + (dot.divisor !== 1
                         ? "; / " + dot.divisor : "") + " = " + total + "  (the hook's value: " + hook + ")"));
    box.hidden = false;
  }

  /** The hover text of one number: the values it came from (same index where the operand has the same size). */
  function operands(step, at, byId) {
    var parts = [step.label + "[" + at + "] = " + step.values[at]];
    step.from.forEach(function (id) {
      var source = byId[id];
      if (!source) return;
      if (source.values.length === step.values.length) parts.push(source.label + "[" + at + "] = " + source.values[at]);
      else parts.push(source.label + " (" + source.shape.join("×") + "): ‖·‖ = "
                      + norm(source.values).toFixed(4));
    });
    return parts.join("\n");
  }

  function norm(values) {
    return Math.sqrt(values.reduce(function (s, v) { return s + v * v; }, 0));
  }

  // ---- editing the text -------------------------------------------------------------------------------

  function replaceChosen(replacement) {
    var panel = panels[0];
    var span = panel.offsets && panel.offsets[state.query];
    if (!span || span[0] === span[1]) { status.textContent = "choose a word token (not [CLS] or [SEP]) first"; return; }
    var target = panel.sentenceB != null && state.query >= panel.sentenceB ? pair : text;
    if (!state.baseline) state.baseline = {text: text.value, pair: pair.value};
    target.value = target.value.slice(0, span[0]) + replacement + target.value.slice(span[1]);
    refresh();
  }

  text.addEventListener("input", later);
  pair.addEventListener("input", later);
  mode.node.addEventListener("change", refresh);
  mixing.node.addEventListener("change", refresh);
  clearButton.addEventListener("click", function () {
    state.ablate = state.ablate.map(function () { return []; });
    refresh();
  });
  maskButton.addEventListener("click", function () { replaceChosen(config.models[0].mask_token); });
  replaceButton.addEventListener("click", function () {
    if (replace.value.trim()) replaceChosen(replace.value.trim());
  });

  // ---- the tour (tutorial 1, "One head by hand", on the student's own sentence) -------------------------

  var TOUR = [
    ["text", "Type any sentence. Everything below is recomputed from it, live."],
    ["tokens-0", "The tokenizer cuts it into tokens; [CLS] and [SEP] are added. Click a token: it becomes the " +
     "query whose computation the step-through shows."],
    ["step-0", "One head by hand: the block input x gives q = xW_Q + b_Q, k and v the same way, for this layer " +
     "and head. Hover a number to see what it came from."],
    ["step-0", "q·k for every key, divided by √K, masked, then the softmax: the attention pattern, a row " +
     "summing to 1. z = Σ α_s v_s mixes the values."],
    ["step-0", "Every head's z goes through W_O; their sum plus b_O is added to the residual stream, then " +
     "LayerNorm, the FFN, another residual and LayerNorm: the block's output."],
    ["views-0", "The head view draws the same patterns as lines; the model view shows every head at once."],
    ["heads-0", "Now intervene: click a head to ablate it and watch the outputs change, before vs after."]
  ];

  function tour() {
    var box = el("div", {"class": "wb-tour", role: "dialog", "aria-label": "guided tour"});
    var says = el("p", {"aria-live": "polite"});
    var back = el("button", {type: "button", id: prefix + "tour-back"}, "Back");
    var next = el("button", {type: "button", id: prefix + "tour-next"}, "Next");
    var close = el("button", {type: "button", id: prefix + "tour-close"}, "Close the tour");
    var at = 0;
    function show() {
      says.textContent = (at + 1) + "/" + TOUR.length + ": " + TOUR[at][1];
      app.querySelectorAll(".wb-spotlight").forEach(function (n) { n.classList.remove("wb-spotlight"); });
      var target = app.querySelector("#" + prefix + TOUR[at][0]);
      if (target) { target.classList.add("wb-spotlight"); target.scrollIntoView({block: "nearest"}); }
    }
    back.addEventListener("click", function () { at = Math.max(0, at - 1); show(); });
    next.addEventListener("click", function () { at = Math.min(TOUR.length - 1, at + 1); show(); });
    close.addEventListener("click", function () { box.remove(); });
    [says, back, next, close].forEach(function (n) { box.appendChild(n); });
    app.insertBefore(box, controls);
    show();
  }

  if (config.tour) tour();
  refresh();
}

// The served page: one workbench in #workbench, its config in #wb-config, requests to its own server with the
// token from the page's URL. (The widget has no #wb-config: it calls minibertWorkbench itself.)
if (document.getElementById("wb-config")) {
  (function () {
    var query = new URLSearchParams(window.location.search), token = query.get("token") || "";
    var config = JSON.parse(document.getElementById("wb-config").textContent);
    config.tour = config.tour || Boolean(query.get("tour"));
    function send(action, body) {
      return fetch("/api/" + action, {method: "POST", body: JSON.stringify(body),
                                      headers: {"Content-Type": "application/json", "X-Minibert-Token": token}})
        .then(function (response) {
          return response.json().then(function (answer) {
            if (!response.ok) throw new Error(answer.error || ("the server answered " + response.status));
            return answer;
          });
        });
    }
    minibertWorkbench(document.getElementById("workbench"), config,
                      {send: send, render: window.minibertViews.render, prefix: "wb-"});
  })();
}

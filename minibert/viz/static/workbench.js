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
    var where = info.model.split(/[\\/]/).filter(Boolean).slice(-2).join("/");  // a path's last two parts
    column.appendChild(el("div", {"class": "wb-model-name", title: info.model}, info.architecture + " · " + where));
    columns.appendChild(column);
    var panel = {info: info, n: n};
    panel.tokens = section(column, "Tokens", prefix + "tokens-" + n);
    panel.heads = section(column, "Heads (L-H, 1-indexed; click to ablate)", prefix + "heads-" + n);
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
      changes.push("ablated (" + answer.mode + "; L-H, 1-indexed): " + answer.ablated.map(function (p) {
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
    if (tourView) tourView.update();
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
      (result.token_classes || []).forEach(function (labels, position) {  // each token's most probable label
        var best = labels.reduce(function (a, b) { return b.p > a.p ? b : a; });
        var row = valueRow("position " + position + ": " + best.label, best.p, "token_class");
        row.dataset.position = String(position);
        row.dataset.label = best.label;
        block.appendChild(row);
        any = true;
      });
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
      .then(function (answer) {
        if (ticket !== state.runs) return;
        showSteps(panel, answer);
        panel.lastStep = answer;  // what the tour tells: the step shown, current while its ticket is
        panel.stepTicket = ticket;
        if (tourView && panel.n === 0) tourView.update();
      });
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

  // ---- the tour: tutorial 1, "One head by hand", told with the numbers of the student's own sentence ---------

  // Tutorial 1's head: layer 0, head 2 (0-indexed), a previous-token head in the bundled model.
  var TOUR_LAYER = 0, TOUR_HEAD = Math.min(2, config.models[0].heads - 1);
  var tourView = null;  // {update} while the tour is open

  /** The facts the tour tells, from one step answer: the query, the key its attention goes to most, that key's
      score before and after /√K, its weight, z's cosine with that key's value. */
  function tourFacts(answer) {
    var by = {};
    answer.steps.forEach(function (step) { by[step.id] = step; });
    var pattern = by.pattern.values, best = 0;
    pattern.forEach(function (p, s) { if (p > pattern[best]) best = s; });
    var z = by.z.values, K = z.length, v = by.v.values.slice(best * K, (best + 1) * K), dot = 0;
    z.forEach(function (zi, i) { dot += zi * v[i]; });
    return {tokens: answer.tokens, t: answer.query, query: answer.tokens[answer.query], best: best,
            key: answer.tokens[best], weight: pattern[best], score: by.qk.values[best],
            scaled: by.scaled.values[best], q: by.q.values, K: K, cosine: dot / (norm(z) * norm(v)),
            head: (answer.layer + 1) + "-" + (answer.head + 1)};  // the "L-H" label, 1-indexed
  }

  /** A number the tour tells, with its value in data-value (what the tests compare with the hooks). */
  function fact(name, value, shown) {
    return el("span", {"class": "wb-tour-fact", "data-fact": name, "data-value": String(value)}, shown);
  }

  function tutorialHead() {  // the tour's head and a query with a word before it
    var tokens = panels[0].lastStep ? panels[0].lastStep.tokens.length : 3;
    state.layer = TOUR_LAYER;
    state.head = TOUR_HEAD;
    state.query = Math.max(1, Math.min(2, tokens - 2));
    refresh();
  }

  var TOUR = [
    {target: "text", say: function () {
      return ["Type any sentence of your own: everything below is recomputed from it, live. This tour tells " +
              "tutorial 1, “One head by hand”, with your sentence's numbers."];
    }},
    {target: "tokens-0", say: function (f) {
      return ["The tokenizer cut your text into ", fact("tokens", f.tokens.length, String(f.tokens.length)),
              " tokens: [CLS] first, [SEP] after each sentence. Click a token to make it the query whose " +
              "computation the step-through shows."];
    }},
    {target: "step-0", enter: tutorialHead, say: function (f) {
      return ["Tutorial 1 studies head " + (TOUR_LAYER + 1) + "-" + (TOUR_HEAD + 1) + " (0-indexed: layer " +
              TOUR_LAYER + ", head " + TOUR_HEAD + "); the step-through now shows head " + f.head + " for your token “",
              fact("query", f.t, f.query), "”. Step 1: its query q = x W_Q + b_Q, ", fact("K", f.K, String(f.K)),
              " numbers starting ", fact("q0", f.q[0], number(f.q[0])), "; every token gets a key k and a value " +
              "v the same way. Hover (or focus) any number to see what it came from."];
    }},
    {target: "step-0", say: function (f) {
      return ["Step 2: the raw scores q·k_s, one per key. “" + f.query + "” scores highest with “",
              fact("key", f.best, f.key), "”: ", fact("score", f.score, number(f.score)), ". Hover a score to " +
              "see its " + f.K + " products q_i × k_i and their sum."];
    }},
    {target: "step-0", say: function (f) {
      return ["Steps 3 and 4: divided by √K = √" + f.K + " = " + number(Math.sqrt(f.K)) + " (“" + f.key + "”: ",
              fact("scaled", f.scaled, number(f.scaled)), "), which keeps the softmax out of its saturated " +
              "regime as K grows; the mask adds 0 on real tokens and −∞ on the padding that fills your text up to " +
              "its length bucket (the panels show the real tokens only)."];
    }},
    {target: "step-0", say: function (f) {
      var previous = f.best === f.t - 1;
      return ["Step 5: the softmax turns the scores into weights that sum to 1. “" + f.query + "” puts ",
              fact("weight", f.weight, number(f.weight)), " of its attention on “" + f.key + "”" + (previous
                ? ", the token just before it: a previous-token head, as tutorial 1 finds."
                : " (position " + f.best + "), not on the token before it (position " + (f.t - 1) + "). In the " +
                  "bundled model tutorial 1's head sends almost all of each token's attention to the previous " +
                  "one; try other query tokens, or see how this model differs.")];
    }},
    {target: "step-0", say: function (f) {
      return ["Step 6: z = Σ_s α_s v_s mixes the values by those weights. With " + number(f.weight) + " of the " +
              "weight on “" + f.key + "”, z's cosine with that token's value v is ", fact("cosine", f.cosine,
                number(f.cosine)), ": the head copies what “" + f.key + "” offers into “" + f.query + "”."];
    }},
    {target: "step-0", say: function () {
      return ["Step 7: every head's z goes through its W_O; their sum plus b_O is the attention output, added to " +
              "the residual stream. Past tutorial 1 the step-through goes on: LayerNorm, the FFN, another " +
              "residual and LayerNorm make the block's output."];
    }},
    {target: "views-0", say: function () {
      return ["The neuron view draws this computation for one query (q, k, q × k, q·k, the softmax); the head " +
              "view draws every token's pattern as lines, the model view every head at once."];
    }},
    {target: "heads-0", say: function (f) {
      return ["Now intervene: click " + f.head + " to ablate this head and see the outputs and the views " +
              "before vs after; [MASK] a token to see the model's guesses change."];
    }}
  ];

  function tour() {
    var box = el("div", {"class": "wb-tour", role: "dialog", "aria-label": "guided tour"});
    var says = el("p", {"aria-live": "polite"});
    var back = el("button", {type: "button", id: prefix + "tour-back"}, "Back");
    var next = el("button", {type: "button", id: prefix + "tour-next"}, "Next");
    var close = el("button", {type: "button", id: prefix + "tour-close"}, "Close the tour");
    var at = 0;
    function update() {  // the current step's text, with the numbers of the step answer now shown
      var answer = panels[0].lastStep, current = answer && panels[0].stepTicket === state.runs;
      while (says.firstChild) says.removeChild(says.firstChild);
      says.appendChild(document.createTextNode((at + 1) + "/" + TOUR.length + ": "));
      if (!current && at > 0) {  // an edit or the tour's own choice of head is on its way
        says.appendChild(document.createTextNode("working it out for your sentence…"));
        return;
      }
      TOUR[at].say(current ? tourFacts(answer) : null).forEach(function (part) {
        says.appendChild(typeof part === "string" ? document.createTextNode(part) : part);
      });
    }
    function show() {
      app.querySelectorAll(".wb-spotlight").forEach(function (n) { n.classList.remove("wb-spotlight"); });
      var target = app.querySelector("#" + prefix + TOUR[at].target);
      if (target) { target.classList.add("wb-spotlight"); target.scrollIntoView({block: "nearest"}); }
      if (TOUR[at].enter) TOUR[at].enter();
      update();
    }
    back.addEventListener("click", function () { at = Math.max(0, at - 1); show(); });
    next.addEventListener("click", function () { at = Math.min(TOUR.length - 1, at + 1); show(); });
    close.addEventListener("click", function () { box.remove(); tourView = null; });
    [says, back, next, close].forEach(function (n) { box.appendChild(n); });
    app.insertBefore(box, controls);
    tourView = {update: update};
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

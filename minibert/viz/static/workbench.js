/* minibert workbench (minibert serve's page, and viz.explore's widget): text in, tokens, the views (drawn by
   views.js's render), the outputs before and after ablating heads, and a step-through of one head.
   minibertWorkbench(app, config, options) builds one workbench inside the element `app`; everything it
   keeps is in that call (no globals), its element ids start with options.prefix, and it finds its
   elements through `app`: a notebook page holds as many as it likes. It talks through options.send(action,
   body) → a promise of the answer: POST /api/ACTION to its own server on the page (the boot at the end), a
   message to the kernel in the widget (explore.py). User text reaches the page through textContent and
   value only, never as markup. Every control is a button, select or input: reachable by keyboard. */
/** config: {models: [info answers], tour, projector}; options: {send, render (views.js's render), el (common.js's),
    prefix}. */
function minibertWorkbench(app, config, options) {
  "use strict";
  var prefix = options.prefix, send = options.send;
  app.classList.add("wb-app");
  // baseline: the text and sentence B before the first token replacement since the last edit (the "before" side).
  // layer, head, query: the one selection the step-through, the neuron view, the head view and the model view show.
  var state = {ablate: config.models.map(function () { return []; }), query: 1, layer: 0, head: 0, timer: null,
               runs: 0, baseline: null, busy: false};

  /** A head as people read it, "L-H" counted from 1 (config.head_label's, sent by the server). */
  function label(n, layer, head) { return config.models[n].head_labels[layer][head]; }

  /** The label with the code's 0-indexed pair beside it, where both are on screen. */
  function labelBoth(n, layer, head) {
    return label(n, layer, head) + " (0-indexed: layer " + layer + ", head " + head + ")";
  }

  var el = options.el;  // common.js's: the one el() of the views and the page

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
  var guesses = config.models[0].outputs.indexOf("mlm") >= 0;  // a masked-LM head: [MASK] gets guesses
  var maskButton = el("button", {id: prefix + "mask", type: "button", "data-guesses": String(guesses),
                                 title: guesses ? "the model guesses the masked word (Outputs)"
                                   : "this model has no masked-LM head: it makes no guesses; the views and the "
                                     + "step-through show how [MASK] changes the computation"},
                      guesses ? "[MASK] the chosen token" : "[MASK] the chosen token (no guesses: no masked-LM head)");
  var projector = el("button", {id: prefix + "projector", type: "button", "aria-pressed": "false",
                                title: "large type and high contrast, for a projector"}, "Projector mode");
  var replaceLabel = el("label", {"for": prefix + "replace"}, "Replace the chosen token with");
  var replace = el("input", {id: prefix + "replace", type: "text", size: 10});
  var replaceButton = el("button", {id: prefix + "replace-go", type: "button"}, "Replace");
  [textLabel, text, pairLabel, pair, mode.wrap, mixing.wrap, clearButton, maskButton, replaceLabel, replace,
   replaceButton, projector].forEach(function (node) { controls.appendChild(node); });
  var busyLine = el("div", {"class": "wb-busy", id: prefix + "busy", role: "status", "aria-live": "polite", hidden: ""});
  app.appendChild(el("h1", {}, "minibert workbench"));
  app.appendChild(controls);
  app.appendChild(busyLine);
  app.appendChild(status);

  function select(id, label, options) {
    var wrap = el("label", {"for": id, "class": "wb-select"}, label + " ");
    var node = el("select", {id: id});
    options.forEach(function (o) {  // a value shown as it is (underscores as spaces), or {value, text}
      node.appendChild(typeof o === "string" ? el("option", {value: o}, o.replace("_", " "))
        : el("option", {value: o.value}, o.text));
    });
    wrap.appendChild(node);
    return {wrap: wrap, node: node};
  }

  var columns = el("div", {"class": "wb-columns"});
  app.appendChild(columns);
  var panels = config.models.map(function (info, n) { return modelPanel(info, n); });

  function section(parent, title, id) {
    var part = el("section", {"class": "wb-section wb-stale", id: id, "aria-label": title});
    part.appendChild(el("h2", {}, title));
    part.appendChild(el("p", {"class": "wb-pending"}, "computing…"));  // until the first answer replaces it
    parent.appendChild(part);
    return part;
  }

  /** Empty a section for new content (its heading stays) and mark it current. */
  function renew(part) {
    while (part.childNodes.length > 1) part.removeChild(part.lastChild);
    part.classList.remove("wb-stale");
    part.removeAttribute("title");
  }

  /** Mark every section as showing an earlier text than the one typed (dimmed until it is drawn again). */
  function markStale(why) {
    app.querySelectorAll(".wb-section").forEach(function (part) {
      if (part.id.indexOf(prefix + "heads-") === 0) return;  // the head grid is a control, never out of date
      part.classList.add("wb-stale");
      part.setAttribute("title", why);
    });
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
                                   title: "head " + labelBoth(n, layer, head) + ": click to ablate"},
                        label(n, layer, head));
        button.addEventListener("click", toggleHead.bind(null, n, layer, head));
        grid.appendChild(button);
        panel.headButtons.push(button);
      }
    }
    renew(panel.heads);
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
    working(true);
    markStale("out of date: being computed for the text as it is now");
    var work = panels.map(function (panel) {
      return send("run", body(panel.n)).then(function (answer) {
        if (ticket !== state.runs) return null;
        state.query = Math.min(state.query, answer.tokens.length - 1);
        showTokens(panel, answer);
        showHeads(panel);
        var shown = comparison(panel, answer).then(function (compared) {
          if (ticket !== state.runs) return;
          showOutputs(panel, compared.outputs, compared.titles);
          showViews(panel, compared.sides, answer.ablated);
        });
        return Promise.all([shown, stepThrough(panel, ticket)]);
      });
    });
    Promise.all(work).then(function () {
      if (ticket !== state.runs) return;
      status.textContent = "";
      status.classList.remove("wb-error");
      var again = focused && app.querySelector("#" + focused);
      if (again && !app.contains(document.activeElement)) again.focus();
      working(false);
    }, function (error) {
      if (ticket !== state.runs) return;
      failed(error);
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
        return label(panel.n, p[0], p[1]);
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

  /** An answer that failed: its message, and every panel marked as showing the last text that worked. */
  function failed(error) {
    status.textContent = error.message + " (the panels below, dimmed, still show the last text that worked)";
    status.classList.add("wb-error");
    markStale("out of date: the last request failed (see the message above); this shows the last text that worked");
    working(false);
  }

  /** The page is waiting for answers: aria-busy, and a line saying so, which names what compiles meanwhile
      (asked of the server every half second while it waits: a new text length compiles for seconds). */
  function working(on) {
    app.setAttribute("aria-busy", String(on));
    busyLine.hidden = !on;
    if (!on || state.busy) { state.busy = on; return; }
    state.busy = true;
    busyLine.textContent = "working…";
    (function poll() {
      if (!state.busy) return;
      Promise.all(panels.map(function (panel) { return send("status", {model: panel.n}); })).then(function (all) {
        if (!state.busy) return;
        var compiling = [].concat.apply([], all.map(function (answer) { return answer.compiling; }));
        busyLine.textContent = compiling.length ? compiling.map(function (c) {
          return "compiling " + (c.what === "run" ? "" : c.what.replace("_", " ") + " ") + "for " + c.tokens
            + "-token texts";
        }).join("; ") + "… (once per text length; later edits of that length are fast)" : "working…";
        setTimeout(poll, 500);
      }, function () { if (state.busy) setTimeout(poll, 500); });
    })();
  }

  function later() {
    state.baseline = null;  // an edit of the text starts a new comparison
    working(true);  // from the keystroke on: the panels are about to change
    markStale("out of date: being computed for the text as it is now");
    state.runs++;  // answers still coming for the text before this edit are dropped
    if (tourView) tourView.update();
    clearTimeout(state.timer);
    state.timer = setTimeout(refresh, 200);
  }

  // ---- tokens, heads, outputs -----------------------------------------------------------------------

  function showTokens(panel, answer) {
    var part = panel.tokens;
    renew(part);
    var row = el("div", {"class": "wb-token-row", role: "group", "aria-label": "tokens"});
    answer.tokens.forEach(function (tokenText, i) {
      var button = el("button", {type: "button", "class": "wb-token" + (i === state.query ? " wb-chosen" : ""),
                                 id: prefix + "token-" + panel.n + "-" + i, "data-index": i,
                                 "aria-pressed": String(i === state.query),
                                 title: "position " + i + " (0-indexed; [CLS] is 0): click to make it the query"},
                        tokenText);
      if (answer.sentence_b_start != null && i >= answer.sentence_b_start) button.classList.add("wb-b");
      button.addEventListener("click", function () { choose({query: i}); });
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
    renew(part);
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
        + "A–B similarity. This model has no masked-LM head: " + panel.info.mask_token + " gets no guesses."
        : "This checkpoint has no head: the views and the step-through show what changes.";
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

  /** sides: [{side: "only" | "before" | "after", title, views}]: one row per kind of view, its sides next to each
      other where two fit the width (the neuron view, wide, puts "after" below "before"). Each view shows the
      page's selection and changes it (render's `page`); the ablated heads are marked on the "after" side. */
  function showViews(panel, sides, ablated) {
    var part = panel.views;
    renew(part);
    panel.shown = [];
    var kinds = Object.keys(sides[0].views);
    kinds.forEach(function (kind) {
      var row = el("div", {"class": "wb-view-pair", "data-kind": kind});
      part.appendChild(row);
      var roots = sides.map(function (side) {
        var column = el("div", {"class": "wb-view-side", "data-side": side.side});
        if (side.title) column.appendChild(el("h3", {}, side.title));
        var root = el("div", {"class": "mbv mbv-light wb-view" + (projecting() ? " mbv-large" : ""),
                              "data-mbv-kind": kind, id: prefix + "view-" + panel.n + "-" + kind + "-" + side.side});
        column.appendChild(root);
        row.appendChild(column);
        return root;
      });
      sides.forEach(function (side, n) {  // drawn once every side is on the page: the views measure their room
        panel.shown.push(options.render(roots[n], side.views[kind], {
          selection: selection(), onSelect: choose, ablated: side.side === "after" ? ablated : []}));
      });
    });
  }

  // ---- the one selection: layer, head, query --------------------------------------------------------

  function selection() { return {layer: state.layer, head: state.head, query: state.query}; }

  /** Move the selection (any of layer, head, query): every view and the step-through follow, with no new run. */
  function choose(change) {
    var changed = false;
    ["layer", "head", "query"].forEach(function (key) {
      if (change[key] != null && change[key] !== state[key]) { state[key] = change[key]; changed = true; }
    });
    if (!changed) return;
    panels.forEach(function (panel) {
      app.querySelectorAll("#" + prefix + "tokens-" + panel.n + " .wb-token").forEach(function (button, i) {
        button.classList.toggle("wb-chosen", i === state.query);
        button.setAttribute("aria-pressed", String(i === state.query));
      });
      (panel.shown || []).forEach(function (view) { view.select(selection()); });
    });
    var ticket = ++state.runs;
    working(true);
    panels.forEach(function (panel) { panel.step.classList.add("wb-stale"); });
    Promise.all(panels.map(function (panel) { return stepThrough(panel, ticket); })).then(function () {
      if (ticket === state.runs) working(false);
    }, function (error) { if (ticket === state.runs) failed(error); });
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

  function numbered(count) {  // select options "1 (0-indexed: 0)", …
    var out = [];
    for (var i = 0; i < count; i++) out.push({value: String(i), text: (i + 1) + "  (0-indexed: " + i + ")"});
    return out;
  }

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
    pick.appendChild(layer.wrap);
    pick.appendChild(head.wrap);
    part.appendChild(pick);
    var byId = {};
    answer.steps.forEach(function (step) { byId[step.id] = step; });
    var list = el("ol", {"class": "wb-steps"});
    answer.steps.forEach(function (step) {
      list.appendChild(stepItem(panel, step, byId, answer));
    });
    part.appendChild(list);
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
        if (rows > 1) line.appendChild(el("span", {"class": "wb-row-label"}, tokens[r]));
        var drawn = strip(step, r * width, width, scale);
        line.appendChild(drawn.node);
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
    item.appendChild(terms);
    return item;
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

  /** One value per key token as bars (q·k and the scores signed around a baseline, the softmax from 0 to 1), each
      with its number (`cell`) and its token below; −∞ (a masked key) has no bar. */
  function bars(step, tokens, cell) {
    var chart = el("div", {"class": "wb-bars", role: "group", "aria-label": step.label + ", one bar per key token"});
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
      column.appendChild(el("span", {"class": "wb-bar-token", title: "key “" + tokens[s] + "” (s = " + s + ")"},
                            tokens[s]));
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
    box.appendChild(el("div", {"class": "wb-terms-scroll"})).appendChild(table);
    var total = (sum + (dot.bias ? dot.bias[j] : 0)) / dot.divisor;
    var hook = step.values[j] === null ? "−∞: a masked key" : number(step.values[j]);
    box.appendChild(el("div", {"class": "wb-terms-sum", "data-sum": String(sum), "data-value": String(total)},
                       "Σ = " + number(sum) + (dot.bias ? "; + b_j (" + number(dot.bias[j]) + ")" : "") + divisor
                       + " = " + number(total) + "  (the hook's value: " + hook + ")"));
    box.hidden = false;
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
  projector.addEventListener("click", function () { project(!projecting()); refresh(); });

  /** Projector mode: large type and high contrast, the views' text too (they are drawn anew). */
  function project(on) {
    app.classList.toggle("wb-projector", on);
    projector.setAttribute("aria-pressed", String(on));
  }

  function projecting() { return app.classList.contains("wb-projector"); }
  replaceButton.addEventListener("click", function () {
    if (replace.value.trim()) replaceChosen(replace.value.trim());
  });

  // ---- the tour: tutorial 1, "One head by hand", told with the numbers of the student's own sentence ---------

  // Tutorial 1's head: layer 0, head 2 (0-indexed), a previous-token head in the bundled model.
  var TOUR_LAYER = 0, TOUR_HEAD = Math.min(2, config.models[0].heads - 1);
  var tourView = null;  // {update} while the tour is open

  /** The facts the tour tells, from one step answer: the query, the key its attention goes to most, that key's
      score before and after /√K, its weight, z's cosine with that key's value; `row(id)`: a step's number in the
      step-through's list. */
  function tourFacts(answer) {
    var by = {}, rows = {};
    answer.steps.forEach(function (step, n) { by[step.id] = step; rows[step.id] = n + 1; });
    var pattern = by.pattern.values, best = 0;
    pattern.forEach(function (p, s) { if (p > pattern[best]) best = s; });
    var z = by.z.values, K = z.length, v = by.v.values.slice(best * K, (best + 1) * K), dot = 0;
    z.forEach(function (zi, i) { dot += zi * v[i]; });
    return {tokens: answer.tokens, t: answer.query, query: answer.tokens[answer.query], best: best,
            key: answer.tokens[best], weight: pattern[best], score: by.qk.values[best],
            scaled: by.scaled.values[best], q: by.q.values, K: K, cosine: dot / (norm(z) * norm(v)),
            head: label(0, answer.layer, answer.head), both: labelBoth(0, answer.layer, answer.head),
            row: function (id) { return "row " + rows[id] + " (“" + by[id].label + "”)"; }};
  }

  /** A number the tour tells, with its value in data-value (what the tests compare with the hooks). */
  function fact(name, value, shown) {
    return el("span", {"class": "wb-tour-fact", "data-fact": name, "data-value": String(value)}, shown);
  }

  function tutorialHead() {  // the tour's head and a query with a word before it
    var tokens = panels[0].lastStep ? panels[0].lastStep.tokens.length : 3;
    choose({layer: TOUR_LAYER, head: TOUR_HEAD, query: Math.max(1, Math.min(2, tokens - 2))});
  }

  function stepRow(id) { return function () { return "step-0-" + id; }; }

  // Each stop: the element it outlines (an id after the prefix), what it says; `row` names the step-through's rows
  // by their numbers in the list, so that what the tour says and what the page shows agree.
  var TOUR = [
    {target: function () { return "text"; }, say: function () {
      return ["Type any sentence of your own: everything below is recomputed from it, live. This tour tells " +
              "tutorial 1, “One head by hand”, with your sentence's numbers."];
    }},
    {target: function () { return "tokens-0"; }, say: function (f) {
      return ["The tokenizer cut your text into ", fact("tokens", f.tokens.length, String(f.tokens.length)),
              " tokens: [CLS] first, [SEP] after each sentence. Click a token to make it the query whose " +
              "computation the step-through and the neuron view show."];
    }},
    {target: stepRow("q"), enter: tutorialHead, say: function (f) {
      return ["Tutorial 1 studies head " + labelBoth(0, TOUR_LAYER, TOUR_HEAD) + "; the step-through now shows " +
              "head " + f.head + " for your token “", fact("query", f.t, f.query), "”. In " + f.row("q") +
              ": its query q = x W_Q + b_Q, ", fact("K", f.K, String(f.K)), " numbers starting ",
              fact("q0", f.q[0], number(f.q[0])), "; every token gets a key k and a value v the same way. Hover " +
              "(or focus) any number to see what it came from."];
    }},
    {target: stepRow("qk"), say: function (f) {
      return [f.row("qk") + ": the raw scores q·k_s, one bar per key. “" + f.query + "” scores highest with “",
              fact("key", f.best, f.key), "”: ", fact("score", f.score, number(f.score)), ". Hover a score to " +
              "see its " + f.K + " products q_i × k_i and their sum."];
    }},
    {target: stepRow("scaled"), say: function (f) {
      return [f.row("scaled") + ": divided by √K = √" + f.K + " = " + number(Math.sqrt(f.K)) + " (“" + f.key +
              "”: ", fact("scaled", f.scaled, number(f.scaled)), "). Without it, scores grow with K and the " +
              "softmax turns peaked: nearly all weight on one key, with gradients near zero. The mask adds 0 on " +
              "real tokens and −∞ on the padding that fills your text up to its length bucket (the panels show " +
              "the real tokens only)."];
    }},
    {target: stepRow("pattern"), say: function (f) {
      var previous = f.best === f.t - 1;
      return [f.row("pattern") + ": the softmax turns the scores into weights that sum to 1. “" + f.query +
              "” puts ", fact("weight", f.weight, number(f.weight)), " of its attention on “" + f.key + "”" +
              (previous ? ", the token just before it: a previous-token head, as tutorial 1 finds."
                : " (position " + f.best + "), not on the token before it (position " + (f.t - 1) + "). In the " +
                  "bundled model tutorial 1's head sends almost all of each token's attention to the previous " +
                  "one; try other query tokens, or see how this model differs.")];
    }},
    {target: stepRow("z"), say: function (f) {
      return [f.row("z") + ": z = Σ_s α_s v_s mixes the values by those weights. With " + number(f.weight) +
              " of the weight on “" + f.key + "”, z's cosine with that token's value v is ", fact("cosine",
                f.cosine, number(f.cosine)), ": the head copies what “" + f.key + "” offers into “" + f.query + "”."];
    }},
    {target: stepRow("head_out"), say: function (f) {
      return [f.row("head_out") + " and on: every head's z goes through its W_O; their sum plus b_O is the " +
              "attention output, added to the residual stream. Past tutorial 1 the step-through goes on: " +
              "LayerNorm, the FFN, another residual and LayerNorm make the block's output."];
    }},
    {target: function () { return "view-0-neuron-only"; }, say: function (f) {
      return ["The neuron view draws this same computation, head " + f.both + " and query “" + f.query + "”: q, " +
              "each k, q × k, q·k and the softmax. Change its layer, head or query and the step-through follows; " +
              "the head view draws every token's pattern as lines, the model view every head at once."];
    }},
    {target: function () { return "head-0-" + TOUR_LAYER + "-" + TOUR_HEAD; }, say: function (f) {
      var guesses = config.models[0].outputs.indexOf("mlm") >= 0;
      return ["Now intervene: click " + f.head + " (the outlined button) to ablate this head and see the outputs " +
              "and the views before vs after; " + (guesses ? "[MASK] a token to see the model's guesses change."
                : "[MASK] a token to see the computation change (this model has no masked-LM head, so it makes " +
                  "no guesses).")];
    }}
  ];

  function tour() {
    var box = el("div", {"class": "wb-tour", role: "dialog", "aria-label": "guided tour", id: prefix + "tour"});
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
      spotlight();
    }
    /** Outline what this stop explains and bring it into sight, clear of the tour's own box. */
    function spotlight() {
      app.querySelectorAll(".wb-spotlight").forEach(function (n) { n.classList.remove("wb-spotlight"); });
      var target = app.querySelector("#" + prefix + TOUR[at].target());
      if (!target) return;
      target.classList.add("wb-spotlight");
      box.classList.remove("wb-tour-top");
      target.scrollIntoView({block: "center"});
      var covered = function () {
        var a = box.getBoundingClientRect(), b = target.getBoundingClientRect();
        return a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
      };
      if (covered()) box.classList.add("wb-tour-top");  // the box moves to the other edge of the window
    }
    function show() {
      if (TOUR[at].enter) TOUR[at].enter();
      update();
    }
    back.addEventListener("click", function () { at = Math.max(0, at - 1); show(); });
    next.addEventListener("click", function () { at = Math.min(TOUR.length - 1, at + 1); show(); });
    close.addEventListener("click", function () {
      box.remove();
      tourView = null;
      app.querySelectorAll(".wb-spotlight").forEach(function (n) { n.classList.remove("wb-spotlight"); });
    });
    [says, back, next, close].forEach(function (n) { box.appendChild(n); });
    app.insertBefore(box, controls);
    tourView = {update: update};
    show();
  }

  if (config.projector) project(true);
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
    config.projector = Boolean(query.get("projector"));
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
                      {send: send, render: window.minibertViews.render, el: window.minibertViews.el, prefix: "wb-"});
  })();
}

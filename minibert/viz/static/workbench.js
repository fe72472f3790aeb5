/* minibert workbench (minibert serve's page, and viz.explore's widget): text in, tokens, the views (drawn by
   views.js's render), the outputs before and after ablating heads, and a step-through of one head (step_through.js)
   with its tour (tour.js) and the panels of viz/panels.py's table (why_view.js, …: MINIBERT_PANELS, their
   constructors); _html.workbench_script joins them.
   minibertWorkbench(app, config, options) builds one workbench inside the element `app`; everything it
   keeps is in that call (no globals), its element ids start with options.prefix, and it finds its
   elements through `app`: a notebook page holds as many as it likes. It talks through options.send(action,
   body) → a promise of the answer: POST /api/ACTION to its own server on the page (the boot at the end), a
   message to the kernel in the widget (explore.py). User text reaches the page through textContent and
   value only, never as markup. Every control is a button, select or input: reachable by keyboard. */
/** config: {models: [info answers], tour, projector}; options: {send, render (views.js's render), el and
    downloadControl (common.js's), prefix}. */
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

  /** The model's name as a file name takes it (a figure's): its path's last part, other characters as "-". */
  function modelName(n) {
    return config.models[n].model.split(/[\\/]/).filter(Boolean).slice(-1)[0].replace(/[^A-Za-z0-9_.-]+/g, "-");
  }

  /** The label with the code's 0-indexed pair beside it, where both are on screen. */
  function labelBoth(n, layer, head) {
    return label(n, layer, head) + " (0-indexed: layer " + layer + ", head " + head + ")";
  }

  var el = options.el;  // common.js's: the one el() of the views and the page

  /** The page's one format for a number it shows (the neuron view's too): three decimals, so a probability of
      3e-11 reads 0.000 in every panel (the exact value is in data-value and on hover). */
  function number(value) {
    if (value === null) return "−∞";  // a masked score (JSON has no number for it)
    return Math.abs(value) < 5e-4 ? "0.000" : value.toFixed(3);  // never "-0.000"
  }

  // ---- the controls ---------------------------------------------------------------------------------

  var status = el("div", {"class": "wb-status", role: "status", "aria-live": "polite"});
  var controls = el("div", {"class": "wb-controls"});
  var textLabel = el("label", {"for": prefix + "text"}, "Text");
  // No maxlength: a paste past the server's limit stays whole, and the server's message says how long it is.
  var text = el("textarea", {id: prefix + "text", rows: 2});
  text.value = "The cat sat on the mat because it was tired.";
  var pairLabel = el("label", {"for": prefix + "pair"}, "Sentence B (optional)");
  var pair = el("input", {id: prefix + "pair", "class": "wb-pair", type: "text"});
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
  var handoutButton = el("button", {id: prefix + "handout-make", type: "button",
                                    title: "a printable page of the lab with your numbers; then print (Ctrl+P)"},
                         "Handout");
  [textLabel, text, pairLabel, pair, mode.wrap, mixing.wrap, clearButton, maskButton, replaceLabel, replace,
   replaceButton, projector, handoutButton].forEach(function (node) { controls.appendChild(node); });
  // Always in the layout (invisible while idle), so that showing it moves nothing on the page.
  var busyLine = el("div", {"class": "wb-busy", id: prefix + "busy", role: "status", "aria-live": "polite"});
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
  /** Empty a node (a panel's body before it draws again). */
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

  /** A panel's part of a model's column, asked for only while open: <section id=PREFIX+key-n class="wb-section
      wb-KEY" aria-label=label> holding <details id=PREFIX+key-open-n> with its <summary> and a body div
      (id PREFIX+key-body-n, class wb-KEY-body); opening it calls show(panel, state.runs). → {part, details, shown};
      a panel adds its own nodes to `details` after `shown`. */
  function lazySection(column, panel, spec) {
    var n = panel.n;
    var part = el("section", {"class": "wb-section wb-" + spec.key, id: prefix + spec.key + "-" + n,
                              "aria-label": spec.label, "aria-busy": "false"});
    var details = el("details", {id: prefix + spec.key + "-open-" + n});
    details.appendChild(el("summary", {}, spec.summary));
    var shown = el("div", {"class": "wb-" + spec.key + "-body", id: prefix + spec.key + "-body-" + n});
    details.appendChild(shown);
    part.appendChild(details);
    column.appendChild(part);
    details.addEventListener("toggle", function () { if (details.open) spec.show(panel, state.runs); });
    return {part: part, details: details, shown: shown};
  }

  // The panels (viz/panels.py's table: why_view.js and the others), each built on the same page object.
  var extras = MINIBERT_PANELS.map(function (make) {
    return make({prefix: prefix, state: state, send: send, body: body, el: el, number: number, choose: choose,
                 clear: clear, lazySection: lazySection});
  });
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
    extras.forEach(function (extra) { extra.section(column, panel); });
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

  /** The page's state as the URL carries it (served page: options.remember): text, sentence B, the step-through's
      head (layer and head) and query, the ablated heads of the first model and the ablation mode. */
  function remember() {
    if (options.remember) {
      options.remember({text: text.value, pair: pair.value, layer: state.layer, head: state.head, query: state.query,
                        ablate: state.ablate[0], mode: mode.node.value, projector: projecting()});
    }
  }

  /** Start from `config.initial` (the URL's state: the same fields as remember's), within the model's sizes; what
      is left out is said in the note under the controls (initial.notes: what the URL's reader could not read). */
  function restore(initial) {
    var info = config.models[0], inside = function (v, n) { return v != null && v >= 0 && v < n; };
    var notes = (initial.notes || []).slice(), sizes = info.layers + " layers of " + info.heads + " heads";
    if (typeof initial.text === "string") text.value = initial.text;
    if (typeof initial.pair === "string") pair.value = initial.pair;
    if (inside(initial.layer, info.layers)) state.layer = initial.layer;
    if (inside(initial.head, info.heads)) state.head = initial.head;
    if ((initial.layer != null && !inside(initial.layer, info.layers))
        || (initial.head != null && !inside(initial.head, info.heads))) {
      notes.push("head=" + (initial.layer + 1) + "-" + (initial.head + 1) + " is not a head of this model (" + sizes  // 1-indexed, as the URL writes heads
                 + "): showing " + label(0, state.layer, state.head));
    }
    if (initial.query != null && initial.query >= 0) state.query = state.urlQuery = initial.query;
    var dropped = [];
    (initial.ablate || []).forEach(function (p) {
      if (inside(p[0], info.layers) && inside(p[1], info.heads)) state.ablate[0].push([p[0], p[1]]);
      else dropped.push((p[0] + 1) + "-" + (p[1] + 1));  // 1-indexed L-H, as the URL
    });
    if (dropped.length) notes.push("ablate: " + dropped.join(", ") + " left out, not heads of this model (" + sizes
                                   + ")");
    if (info.ablation_modes.indexOf(initial.mode) >= 0) mode.node.value = initial.mode;
    showUrlNotes(notes);
  }

  var urlNote = el("p", {"class": "wb-hint wb-url-note", id: prefix + "url-note", hidden: "hidden"});
  status.after(urlNote);
  var urlNotes = [];
  function showUrlNotes(notes) {  // added to those said before
    urlNotes = urlNotes.concat(notes);
    if (!urlNotes.length) return;
    urlNote.hidden = false;
    urlNote.textContent = "The link's " + urlNotes.join("; ") + ". The address now says what the page shows.";
  }

  function body(n, extra) {
    var request = {model: n, text: text.value, ablate: state.ablate[n], mode: mode.node.value};
    if (pair.value.trim()) request.pair = pair.value;
    for (var key in extra || {}) request[key] = extra[key];
    return request;
  }

  function refresh() {
    clearTimeout(state.timer);
    state.timer = null;
    remember();
    var ticket = ++state.runs;
    var focused = app.contains(document.activeElement) && document.activeElement.id;  // redrawn ones get it back
    working(true);
    markStale("out of date: being computed for the text as it is now");
    var work = panels.map(function (panel) {
      return send("run", body(panel.n)).then(function (answer) {
        if (ticket !== state.runs) return null;
        if (state.urlQuery != null && state.urlQuery > answer.tokens.length - 1) {  // the link's query=99
          showUrlNotes(["query=" + state.urlQuery + " is past the text's last token (position "
                        + (answer.tokens.length - 1) + ", 0-indexed): showing that one"]);
        }
        state.urlQuery = null;
        var clamped = Math.min(state.query, answer.tokens.length - 1);
        if (clamped !== state.query) { state.query = clamped; remember(); }
        showTokens(panel, answer);
        showHeads(panel);
        var shown = comparison(panel, answer).then(function (compared) {
          if (ticket !== state.runs) return;
          showOutputs(panel, compared.outputs, compared.titles);
          showViews(panel, compared.sides, answer.ablated);
          if (answer.change) showChange(panel, answer.change);
        });
        var more = extras.map(function (extra) { return extra.show(panel, ticket); });
        return Promise.all([shown, stepThrough(panel, ticket)].concat(more));
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
    busyLine.classList.toggle("wb-busy-on", on);
    if (!on) busyLine.textContent = "";
    if (!on || state.busy) { state.busy = on; return; }
    state.busy = true;
    busyLine.textContent = "working…";
    var began = Date.now();
    (function poll() {
      if (!state.busy) return;
      Promise.all(panels.map(function (panel) { return send("status", {model: panel.n}); })).then(function (all) {
        if (!state.busy) return;
        var compiling = [].concat.apply([], all.map(function (answer) { return answer.compiling; }));
        var waited = Math.round((Date.now() - began) / 1000);
        busyLine.textContent = compiling.length ? compiling.map(function (c) {
          var first = FIRST_USE[c.what];
          return "compiling " + (c.what === "run" ? "" : (first ? first[0] : c.what.replace("_", " ")) + " ") + "for "
            + c.tokens + "-token texts" + (first ? " (first use, " + first[1] + ")" : "");
        }).join("; ") + "… (once for every text up to that length; later edits are fast)" : "working…";
        if (waited >= 2) busyLine.textContent += " " + waited + " s so far";
        setTimeout(poll, 500);
      }, function () { if (state.busy) setTimeout(poll, 500); });
    })();
  }

  // How long a mixing map's first use takes (its compile and first run; ALTI and value zeroing are one program
  // each): the bundled MiniLM on a 2-core CPU, texts of 13 to 128 tokens, empty compilation cache, at load 4–7 and
  // at 16 (benchmarks/serve.py --mixing; docs/teaching.md's "What it took").
  var FIRST_USE = {value_zeroing: ["value zeroing", "~6–15 s; up to a minute on a busy machine"],
                   alti: ["ALTI", "~3–6 s; up to 30 s on a busy machine"]};

  function later() {
    state.baseline = null;  // an edit of the text starts a new comparison
    working(true);  // from the keystroke on: the panels are about to change
    markStale("out of date: being computed for the text as it is now");
    state.runs++;  // answers still coming for the text before this edit are dropped
    guide.update();
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
    var unk = panel.info.unk_token;
    if (unk && answer.tokens.indexOf(unk) >= 0) {  // non-English text, on an English vocabulary: say why
      part.appendChild(el("p", {"class": "wb-hint", id: prefix + "unk-note-" + panel.n},
        unk + " marks a piece of your text that this model's vocabulary has no word piece for (the bundled model's "
        + "vocabulary is English: words in other scripts become " + unk + " or single letters). The model sees only "
        + "that one token for it."));
    }
    panel.offsets = answer.offsets;
    panel.sentenceB = answer.sentence_b_start;
  }

  function showHeads(panel) {
    panel.headButtons.forEach(function (button) {
      var layer = Number(button.dataset.layer), head = Number(button.dataset.head);
      var on = state.ablate[panel.n].some(function (p) { return p[0] === layer && p[1] === head; });
      button.setAttribute("aria-pressed", String(on));
      button.title = "head " + labelBoth(panel.n, layer, head) + (on ? ": ablated, click to restore"
                                                                    : ": click to ablate");
    });
  }

  /** outputs: {before} alone, or {before, after} with their titles. Where no side has an output (no [MASK], no
      sentence B), the line saying what gives one stands in place of the columns; a side with none says so. */
  function showOutputs(panel, outputs, titles) {
    panel.lastOutputs = outputs;  // what the handout reads
    var part = panel.outputs;
    renew(part);
    var sides = Object.keys(outputs);
    var blocks = sides.map(function (side) {
      var block = el("div", {"class": "wb-output", "data-side": side});
      block.appendChild(el("h3", {}, sides.length > 1 ? titles[side] : "Output"));
      var rows = outputRows(outputs[side]);
      rows.forEach(function (row) { block.appendChild(row); });
      if (!rows.length) block.appendChild(el("p", {"class": "wb-hint"}, noOutput(panel.info)));
      return {block: block, any: rows.length > 0};
    });
    if (blocks.some(function (b) { return b.any; })) {
      blocks.forEach(function (b) { part.appendChild(b.block); });
      return;
    }
    var hint = panel.info.outputs.indexOf("mlm") >= 0 ? "Put a " + panel.info.mask_token + " in the text to see "
      + "the model's guesses" : panel.info.outputs.indexOf("similarity") >= 0 ? "Type a sentence B to see the "
      + "A–B similarity" : "";
    hint = !hint ? "This checkpoint has no head: the views and the step-through show what changes."
      : hint + (sides.length > 1 ? ", before and after (the views below compare them already)." : ".")
        + (panel.info.outputs.indexOf("mlm") < 0 ? " This model has no masked-LM head: " + panel.info.mask_token
           + " gets no guesses." : "");
    part.appendChild(el("p", {"class": "wb-hint"}, hint));
  }

  /** One side's output rows: the guesses at each [MASK], classes, each token's label, the A–B similarity. */
  function outputRows(result) {
    var rows = [];
    (result.mlm || []).forEach(function (masked) {
      rows.push(el("div", {}, "[MASK] at position " + masked.position + ":"));
      masked.top.forEach(function (guess) { rows.push(valueRow(guess.token, guess.p, "mlm")); });
    });
    (result.classes || []).forEach(function (c) { rows.push(valueRow(c.label, c.p, "class")); });
    (result.token_classes || []).forEach(function (labels, position) {  // each token's most probable label
      var best = labels.reduce(function (a, b) { return b.p > a.p ? b : a; });
      var row = valueRow("position " + position + ": " + best.label, best.p, "token_class");
      row.dataset.position = String(position);
      row.dataset.label = best.label;
      rows.push(row);
    });
    if (result.similarity != null) rows.push(valueRow("cosine similarity of A and B", result.similarity, "similarity"));
    return rows;
  }

  /** What a side with no output lacks. */
  function noOutput(info) {
    return info.outputs.indexOf("mlm") >= 0 ? "no " + info.mask_token + " in this text: no guesses"
      : info.outputs.indexOf("similarity") >= 0 ? "no sentence B: no similarity" : "no output";
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
        var root = el("div", {"class": "mbv mbv-" + (darkNow() ? "dark" : "light") + " wb-view"
                                       + (projecting() ? " mbv-large" : ""),
                              "data-mbv-kind": kind, id: prefix + "view-" + panel.n + "-" + kind + "-" + side.side});
        column.appendChild(root);
        row.appendChild(column);
        return root;
      });
      sides.forEach(function (side, n) {  // drawn once every side is on the page: the views measure their room
        panel.shown.push(options.render(roots[n], side.views[kind], {
          selection: selection(), onSelect: choose, ablated: side.side === "after" ? ablated : [],
          figureName: modelName(panel.n) + (side.side === "only" ? "" : "-" + side.side)}));
      });
    });
  }

  /** After an ablation: the first layer whose attention changes (after − before), with a button to show it. The
      views open at the selected layer, where before and after may be equal (rightly): this says where to look. */
  function showChange(panel, change) {
    var first = change.first_layer, line = el("p", {"class": "wb-hint wb-change", id: prefix + "change-" + panel.n});
    if (first === null) {
      line.appendChild(document.createTextNode("after − before: no layer's attention changes (the ablated heads are "
        + "in the last layer, or write nothing later layers read)."));
    } else {
      var peak = change.per_layer[first], shown = mixing.node.options[mixing.node.selectedIndex];
      var same = first === 1 ? "; layer 1 is identical" : "; layers 1–" + first + " are identical";
      line.appendChild(document.createTextNode("after − before: the attention first changes at layer " + (first + 1)
        + " (1-indexed; 0-indexed: " + first + "), by up to " + number(peak) + " (largest |Δα|)"
        + (first > 0 ? same + " before and after" : "") + ". Largest |Δα| per layer: "
        + change.per_layer.map(number).join(", ") + ". "
        + (mixing.node.value === "attention" ? "" : "This line and the map are about the raw attention α, not the "
           + shown.text + " maps the views show: those can change at an earlier layer. ")));
      var go = el("button", {type: "button", id: prefix + "change-show-" + panel.n}, "Show layer " + (first + 1));
      go.addEventListener("click", function () { choose({layer: first}); });
      line.appendChild(go);
    }
    panel.views.insertBefore(line, panel.views.childNodes[1] || null);  // after the heading (renew keeps it)
    if (change.per_head) line.after(changeMap(panel, change));
  }

  /** The after − before map of every layer and head: each cell the head's largest |Δα| over its queries and keys,
      as red as it is large against the largest of all (its number on the cell and in data-value), the first
      layer that changes marked, the ablated heads struck through; a click shows that layer and head. */
  function changeMap(panel, change) {
    var peak = Math.max.apply(null, change.per_layer), heads = change.per_head[0].length;
    var map = el("div", {"class": "wb-change-map", id: prefix + "change-map-" + panel.n, role: "group",
                         "aria-label": "after − before: largest |Δα| of every layer and head"});
    map.style.gridTemplateColumns = "max-content repeat(" + heads + ", minmax(44px, max-content))";
    map.appendChild(el("span", {"class": "wb-change-axis"}, "|Δα|"));
    for (var h = 0; h < heads; h++) map.appendChild(el("span", {"class": "wb-change-axis"}, "H" + (h + 1)));
    change.per_head.forEach(function (row, layer) {
      var firstRow = layer === change.first_layer;
      map.appendChild(el("span", {"class": "wb-change-axis" + (firstRow ? " wb-change-first" : ""),
                                  title: "0-indexed: " + layer}, "Layer " + (layer + 1) + (firstRow ? " ← first" : "")));
      row.forEach(function (gap, head) {
        var off = state.ablate[panel.n].some(function (p) { return p[0] === layer && p[1] === head; });
        var cell = el("button", {type: "button", "class": "wb-change-cell" + (off ? " wb-change-ablated" : "")
                                   + (firstRow ? " wb-change-first" : ""), "data-layer": String(layer),
                                 "data-head": String(head), "data-value": String(gap),
                                 title: "head " + labelBoth(panel.n, layer, head) + (off ? ", ablated" : "")
                                   + ": largest |after − before| attention " + number(gap) + "; click to show it"},
                      gap > 0 ? number(gap) : "0");
        var share = peak > 0 ? gap / peak : 0;
        cell.style.setProperty("--share", share.toFixed(3));
        cell.addEventListener("click", function () { choose({layer: layer, head: head}); });
        map.appendChild(cell);
      });
    });
    return map;
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
    remember();
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
        var shown = steps.show(panel, answer);  // drawn once a second head's steps (compared) are
        panel.lastStep = answer;  // what the tour tells: the step shown, current while its ticket is
        panel.stepTicket = ticket;
        if (panel.n === 0) guide.update();
        return shown;
      });
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
    app.classList.toggle("wb-dark", darkNow());
  }

  // Dark mode follows the system's setting where the page asks to (config.follow_system_theme: the served page),
  // but never in projector mode, black on white. A change of the setting redraws the views in their other theme.
  // The setting is kept as each change event gives it (event.matches): the list's own .matches, read in a click's
  // handler just before a change, has been seen stale there, leaving the page dark on a light system.
  var darkQuery = config.follow_system_theme && window.matchMedia ? window.matchMedia("(prefers-color-scheme: dark)")
    : null;
  var systemDark = Boolean(darkQuery && darkQuery.matches);
  function darkNow() { return systemDark && !projecting(); }
  if (darkQuery) {
    app.classList.toggle("wb-dark", darkNow());
    darkQuery.addEventListener("change", function (event) {
      systemDark = event.matches;
      app.classList.toggle("wb-dark", darkNow());
      refresh();
    });
  }

  function projecting() { return app.classList.contains("wb-projector"); }
  replaceButton.addEventListener("click", function () {
    if (replace.value.trim()) replaceChosen(replace.value.trim());
  });

  var steps = minibertStepThrough({app: app, config: config, prefix: prefix, state: state, el: el, number: number,
                                   select: select, renew: renew, choose: choose, labelBoth: labelBoth, label: label,
                                   send: send, body: body, modelName: modelName,
                                   downloadControl: options.downloadControl});
  var guide = minibertTour({app: app, config: config, prefix: prefix, state: state, panels: panels, controls: controls,
                            el: el, number: number, norm: steps.norm, choose: choose, label: label,
                            labelBoth: labelBoth});
  handoutButton.addEventListener("click", function () {
    var old = app.querySelector("#" + prefix + "handout");
    if (old) old.remove();
    app.appendChild(guide.handout(panels[0].lastOutputs));
    app.classList.add("wb-has-handout");  // printing the page prints the handout alone (workbench.css)
    app.querySelector("#" + prefix + "handout").scrollIntoView();
  });
  if (config.initial) restore(config.initial);
  if (config.projector) project(true);
  if (config.tour) guide.open();
  refresh();
}

// The served page: one workbench in #workbench, its config in #wb-config, requests to its own server with the
// token from the page's URL. (The widget has no #wb-config: it calls minibertWorkbench itself.)
if (document.getElementById("wb-config")) {
  (function () {
    var query = new URLSearchParams(window.location.search), token = query.get("token") || "";
    var config = JSON.parse(document.getElementById("wb-config").textContent);
    // A switch in the URL: ?projector or ?projector=1 turns it on; 0, false, no and off keep it off (Boolean("0")
    // is true, so &projector=0 turned projector mode on).
    function urlSwitch(name) {
      var value = query.get(name);
      return value !== null && !/^(0|false|no|off)$/i.test(value.trim());
    }
    config.tour = config.tour || urlSwitch("tour");
    config.projector = urlSwitch("projector");
    config.follow_system_theme = true;  // dark mode where the system is dark (the notebook widget stays light)
    // URL state: text, pair, head ("L-H" as the page names heads, 1-indexed), query (a token position, 0-indexed),
    // ablate ("1-3,2-5"), mode. A lecturer's link opens every laptop on one configuration; the URL follows edits.
    var labelled = function (word) {  // "2-5" → [1, 4] (0-indexed), or null
      var m = /^(\d+)-(\d+)$/.exec(word.trim());
      return m && Number(m[1]) >= 1 && Number(m[2]) >= 1 ? [Number(m[1]) - 1, Number(m[2]) - 1] : null;
    };
    var initial = {text: query.get("text"), pair: query.get("pair"), mode: query.get("mode"),
                   query: /^\d+$/.test(query.get("query") || "") ? Number(query.get("query")) : null,
                   ablate: (query.get("ablate") || "").split(",").map(labelled).filter(Boolean)};
    var head = (query.get("head") || "").trim(), layer = (query.get("layer") || "").trim(), notes = [];
    var chosen = labelled(head);
    if (!chosen && /^\d+$/.test(head) && /^\d+$/.test(layer)) {  // layer=2&head=4: the form head=L-H asks for
      chosen = labelled(layer + "-" + head);
      if (chosen) notes.push("layer=" + layer + "&head=" + head + " is read as head=" + layer + "-" + head
                             + " (the address names a head as head=L-H, 1-indexed)");
    }
    if (!chosen && (head || layer)) {
      notes.push((head ? "head=" + head : "layer=" + layer) + " is not read: the address names a head as head=L-H, "
                 + "1-indexed (head=1-3)");
    }
    if (chosen) { initial.layer = chosen[0]; initial.head = chosen[1]; }
    var unread = (query.get("ablate") || "").split(",").filter(function (w) { return w.trim() && !labelled(w); });
    if (unread.length) notes.push("ablate: " + unread.join(", ") + " not read (heads as L-H, 1-indexed: 1-3,2-5)");
    initial.notes = notes;
    config.initial = initial;
    function remember(now) {
      var next = new URLSearchParams(window.location.search);
      next.set("text", now.text);
      if (now.pair.trim()) next.set("pair", now.pair); else next.delete("pair");
      // the URL names heads as the page labels them, "L-H" 1-indexed
      next.set("head", (now.layer + 1) + "-" + (now.head + 1));
      next.set("query", String(now.query));
      next.delete("layer");  // read into head= (restore)
      if (now.projector) next.set("projector", "1"); else next.delete("projector");
      if (now.ablate.length) {
        // 1-indexed "L-H" labels, as the head grid shows them
        next.set("ablate", now.ablate.map(function (p) { return (p[0] + 1) + "-" + (p[1] + 1); }).join(","));
      } else {
        next.delete("ablate");
      }
      if (now.ablate.length && now.mode !== "zero") next.set("mode", now.mode); else next.delete("mode");
      window.history.replaceState(null, "", window.location.pathname + "?" + next.toString());
    }
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
                      {send: send, render: window.minibertViews.render, el: window.minibertViews.el, prefix: "wb-",
                       downloadControl: window.minibertViews.downloadControl,
                       remember: remember});
  })();
}

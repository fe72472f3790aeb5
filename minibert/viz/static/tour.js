/* minibert workbench, the tour (--tour, ?tour=1): tutorial 1, "One head by hand", told with the numbers of the
   student's own sentence, each stop outlining the row or control it explains. The workbench (workbench.js) builds
   it with what it shares: minibertTour(page) → {open(), update()}. */
/** page: {app, config, prefix, state, panels, controls, el, number, norm, choose, label, labelBoth}. */
function minibertTour(page) {
  "use strict";
  var app = page.app, config = page.config, prefix = page.prefix, state = page.state, panels = page.panels;
  var controls = page.controls, el = page.el, number = page.number, norm = page.norm, choose = page.choose;
  var label = page.label, labelBoth = page.labelBoth;

  // Tutorial 1's head: layer 0, head 2 (0-indexed), a previous-token head in the bundled model.
  var TOUR_LAYER = 0, TOUR_HEAD = Math.min(2, config.models[0].heads - 1);
  var tourView = null;  // {update} while the tour is open
  var COPIES = 0.9;  // stop 7 says the head "copies" a key's value where z's cosine with it is at least this

  /** The facts the tour tells, from one step answer: the query, the key its attention goes to most, that key's
      score before and after /√K, its weight, z's cosine with that key's value; `row(id)`: a step's number in the
      step-through's list. */
  function tourFacts(answer) {
    var by = {}, rows = {};  // an ablated head's z is the replacement: the tour tells the run before the ablation
    (answer.ablated ? answer.ablated.before : answer.steps).forEach(function (step, n) {
      by[step.id] = step;
      rows[step.id] = n + 1;
    });
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

  // Each stop: the element it outlines (an id after the prefix), what it says, and the elements (ids after the
  // prefix) its box should leave in sight besides; `row` names the step-through's rows by their numbers in the
  // list, so that what the tour says and what the page shows agree.
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
      // The words follow the cosine printed: "copies" only where z points along that value (COPIES and over).
      var rest = number(1 - f.weight), verdict = f.cosine >= COPIES
        ? ": the head copies what “" + f.key + "” offers into “" + f.query + "”."
        : f.cosine >= 0.5
          ? ": z is not a copy of it. It leans towards what “" + f.key + "” offers, mixed with the other keys' " +
            "values by the remaining " + rest + " of the weight."
          : ": z is not a copy of it. The other keys' values, with the remaining " + rest + " of the weight, set " +
            "most of its direction (values differ in length: a small weight on a long value can outweigh a large " +
            "one on a short value).";
      return [f.row("z") + ": z = Σ_s α_s v_s mixes the values by those weights. With " + number(f.weight) +
              " of the weight on “" + f.key + "”, z's cosine with that token's value v is ", fact("cosine",
                f.cosine, number(f.cosine)), verdict];
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
    {target: function () { return "head-0-" + TOUR_LAYER + "-" + TOUR_HEAD; },
     // what it tells students to use, in sight with the button where they fit (in this order), else kept clear
     keep: ["pair", "clear", "mask", "tokens-0", "outputs-0", "step-layer-0", "step-head-0"],
     say: function (f) {
      var guesses = config.models[0].outputs.indexOf("mlm") >= 0;
      var pair = config.models[0].outputs.indexOf("similarity") >= 0;  // its output needs a sentence B
      var typed = pair && document.getElementById(prefix + "pair").value.trim() !== "";
      return ["Now intervene: " + (pair && !typed ? "type a sentence B first (a paraphrase of yours), so that " +
              "Outputs show the A–B similarity; then " : "") + "click " + f.head + " (outlined) to ablate this " +
              "head: Outputs and views show before vs after. The ablation acts after the head's softmax, so its " +
              "own pattern stays; the views change from the next layer on. " +
              (guesses ? "[MASK] a token to see the model's guesses change."
                : "[MASK] a token: the computation changes (no masked-LM head, so no guesses).")];
    }}
  ];

  function tour() {
    var box = el("div", {"class": "wb-tour", role: "dialog", "aria-label": "guided tour", id: prefix + "tour"});
    var says = el("p", {"aria-live": "polite"});
    var back = el("button", {type: "button", id: prefix + "tour-back"}, "Back");
    var next = el("button", {type: "button", id: prefix + "tour-next"}, "Next");
    var close = el("button", {type: "button", id: prefix + "tour-close"}, "Close the tour");
    var buttons = el("div", {"class": "wb-tour-buttons"});  // outside the text's scroll: always in the box
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
      place(target, (TOUR[at].keep || []).map(function (id) { return app.querySelector("#" + prefix + id); })
        .filter(Boolean));
    }
    /** Scroll `target` into the part of the window the box leaves free: the box at the bottom and the target
        centred above it where both fit (the box then covers only what follows the target), else the box at the
        top and the target starting just below it. Then the box goes to the first corner (bottom or top first as
        that chose, right before left) where it covers neither the target nor `keep`; else the first where it
        does not cover the target. */
    function place(target, keep) {
      corner("");
      var clear = box.getBoundingClientRect().height + 16;  // px the box takes, with a gap
      var tall = target.getBoundingClientRect().height > window.innerHeight - clear - 8;
      target.style.scrollMarginTop = tall ? clear + "px" : "";
      target.style.scrollMarginBottom = tall ? "" : clear + "px";
      target.scrollIntoView({block: tall ? "start" : "center"});
      var shown = inSight(target, keep);
      if (shown) window.scrollBy(0, shown.top - 8);  // the target and what it names, from the top of the window
      var corners = tall ? ["top", "", "top left", "left"] : ["", "top", "left", "top left"];
      var clean = function (nodes) {
        return function (where) { corner(where); return !nodes.some(covered); };
      };
      corner(corners.find(clean([target].concat(keep))) || corners.find(clean([target])) || corners[0]);
    }
    /** The span (top, bottom in the window) of `target` with the longest run of `keep`, in order, that fits the
        window's height; null where `keep` is empty or its first does not fit with the target. */
    function inSight(target, keep) {
      var span = null, t = target.getBoundingClientRect(), top = t.top, bottom = t.bottom;
      keep.some(function (node) {
        var r = node.getBoundingClientRect();
        var up = Math.min(top, r.top), down = Math.max(bottom, r.bottom);
        if (down - up > window.innerHeight - 16) return true;  // no room for it: stop at the ones before
        top = up;
        bottom = down;
        span = {top: top, bottom: bottom};
        return false;
      });
      return span;
    }
    function corner(where) {  // "", "top", "left", "top left": where the box sits in the window
      box.classList.toggle("wb-tour-top", where.indexOf("top") >= 0);
      box.classList.toggle("wb-tour-left", where.indexOf("left") >= 0);
    }
    function covered(node) {
      var a = box.getBoundingClientRect(), b = node.getBoundingClientRect();
      return a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
    }
    function show() {
      if (TOUR[at].enter) TOUR[at].enter();
      var last = at === TOUR.length - 1;  // the last stop's Next ends the tour
      next.textContent = last ? "Done" : "Next";
      next.title = last ? "end the tour" : "";
      back.disabled = at === 0;  // nothing before the first stop
      update();
    }
    function end() {
      box.remove();
      tourView = null;
      app.style.paddingBottom = "";
      app.querySelectorAll(".wb-spotlight").forEach(function (n) { n.classList.remove("wb-spotlight"); });
    }
    back.addEventListener("click", function () { at = Math.max(0, at - 1); show(); });
    next.addEventListener("click", function () {
      if (at === TOUR.length - 1) { end(); return; }
      at += 1;
      show();
    });
    close.addEventListener("click", end);
    box.addEventListener("keydown", function (e) { if (e.key === "Escape") end(); });  // focus in the box
    [back, next, close].forEach(function (n) { buttons.appendChild(n); });
    [says, buttons].forEach(function (n) { box.appendChild(n); });
    app.insertBefore(box, controls);
    app.style.paddingBottom = "45vh";  // room to scroll the page's last view above the box (at most 40vh)
    tourView = {update: update};
    show();
  }

  /** A printable handout from the page's state now: the lab's steps, the three room questions answered with the
      numbers of the student's own sentence (the step-through's head and query, the outputs shown), and a short
      quiz with its answer key — every number read from the answers the page shows, none written by hand. */
  function handout(outputs) {
    var answer = panels[0].lastStep;
    var box = el("section", {"class": "wb-handout", id: prefix + "handout", "aria-label": "handout"});
    if (!answer) {
      box.appendChild(el("p", {}, "The page has not computed a step yet: type a sentence, then make the handout."));
      return box;
    }
    var f = tourFacts(answer), by = {};
    answer.steps.forEach(function (step) { by[step.id] = step; });
    var sum = by.pattern.values.reduce(function (a, b) { return a + b; }, 0);
    var raw = by.qk.values.filter(function (v, s) { return by.scaled.values[s] !== null; });
    var top = Math.max.apply(null, raw), weights = raw.map(function (v) { return Math.exp(v - top); });
    var unscaledMax = 1 / weights.reduce(function (a, b) { return a + b; }, 0);  // the top key's weight: e^0 / Σ
    var before = outputs && outputs.before && outputs.before.similarity, after = outputs && outputs.after &&
      outputs.after.similarity;
    var change = before != null && after != null ? Number(number(after)) - Number(number(before)) : null;
    var pairText = document.getElementById(prefix + "pair").value.trim();
    var ablated = state.ablate[0].map(function (p) { return label(0, p[0], p[1]); }).join(", ");
    function section(title, items, ordered, attributes) {
      box.appendChild(el("h2", attributes || {}, title));
      var list = el(ordered ? "ol" : "ul", {});
      items.forEach(function (item) { list.appendChild(el("li", {}, item)); });
      box.appendChild(list);
    }
    box.appendChild(el("h1", {}, "Self-attention lab: your numbers"));
    box.appendChild(el("p", {}, "Text: “" + document.getElementById(prefix + "text").value + "”" +
      (document.getElementById(prefix + "pair").value.trim() ? "; sentence B: “" +
        document.getElementById(prefix + "pair").value + "”" : "") + ". Head " + f.both + ", query “" + f.query +
      "” (position " + f.t + ", 0-indexed)." + (ablated ? " The step-through's numbers below are those of the run " +
      "with " + ablated + " ablated, as the page shows them now (clear the ablations for the unablated run's)." : "")));
    section("The lab", ["Type a sentence; follow the tour (Next) through q, q·k, ÷√K, the softmax, z and W_O.",
      "Type a sentence B, click head 1-3 to ablate it, read the similarity before and after.",
      "Tutorial 1 (one head by hand), tutorial 2 (patterns), tutorial 4 (intervening): Run All, then change the " +
      "sentences and run again."], true);
    section("Questions, with your answers", [
      "Which key does your query attend to most, and is it the previous token? — “" + f.query + "” puts " +
        number(f.weight) + " of its attention on “" + f.key + "” (position " + f.best + "): " +
        (f.best === f.t - 1 ? "the token just before it." : "not the token before it (position " + (f.t - 1) + ")."),
      "Why divide by √K? — q·k for “" + f.key + "” is " + number(f.score) + "; ÷√" + f.K + " = " +
        number(Math.sqrt(f.K)) + " gives " + number(f.scaled) + ". Without the division the largest weight would be " +
        number(unscaledMax) + " instead of " + number(Math.max.apply(null, by.pattern.values)) +
        ": larger scores make the softmax more peaked.",
      "Which head, ablated, changes the similarity most? — " + (before != null && after != null && ablated
        ? "with " + ablated + " ablated the similarity went from " + number(before) + " to " + number(after) +
          " (" + (change >= 0 ? "+" : "") + number(change) + "); tutorial 4 sweeps every head."
        : "type a sentence B and ablate a head, then make the handout again; tutorial 4 sweeps every head.")], true);
    section("Quiz", ["How many tokens does your text have, [CLS] and [SEP] included" +
      (pairText ? ", sentence B's counted too?" : "?"),
      "What do the softmax row's weights add up to?", "What is √K for this model's heads?"], true);
    section("Answer key", [String(f.tokens.length) + " tokens: " + f.tokens.join(" "),
      "1 (here " + number(sum) + "): the softmax makes a probability distribution over the keys.",
      "√" + f.K + " = " + number(Math.sqrt(f.K)) + " (K = " + f.K + " dimensions per head)."], true,
      {"class": "wb-handout-key"});  // printed on a page of its own (workbench.css)
    return box;
  }

  return {open: tour, update: function () { if (tourView) tourView.update(); }, handout: handout};
}

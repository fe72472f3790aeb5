/* minibert workbench, the "why this output" panel (issue 30; minibert/viz/why.py answers its "why" request): which
   tokens (integrated gradients) and which heads (their direct effects along the frozen skip path) account for the
   output shown, for the text as typed. It asks only while it is open, and only once the run's answer has drawn the
   tokens and views, so it never delays them; a failure shows in the panel, not over the page. User text (tokens,
   class labels) reaches the page through textContent only. The workbench builds it:
   minibertWhy(page) → {section(column, panel), show(panel, ticket)}. */
/** page: {prefix, state, send, body, el, number, choose, clear, lazySection}. */
function minibertWhy(page) {
  "use strict";
  var el = page.el, state = page.state, number = page.number, clear = page.clear;
  var RAISES = [31, 111, 235], LOWERS = [207, 34, 46];  // viz.circuits' colours: raises the target, lowers it

  /** The panel's section in a model's column: a <details> whose opening asks for the current text's answer. */
  function section(column, panel) {
    panel.why = page.lazySection(column, panel, {key: "why", label: "Why this output",
                                                 summary: "Why this output (tokens and heads)", show: show});
    return panel.why.part;
  }

  /** Ask for and draw the answer while the panel is open (a promise that never rejects: its errors stay inside). */
  function show(panel, ticket) {
    var why = panel.why;
    if (!why.details.open) {
      why.part.classList.remove("wb-stale");  // closed, it shows nothing that can be out of date
      return Promise.resolve();
    }
    why.part.setAttribute("aria-busy", "true");
    return page.send("why", page.body(panel.n, {query: state.query})).then(function (answer) {
      if (ticket !== state.runs) return;
      draw(panel, answer);
    }, function (error) {
      if (ticket !== state.runs) return;
      clear(why.shown);
      why.shown.appendChild(el("p", {"class": "wb-error wb-why-error"}, error.message));
    }).then(function () {
      if (ticket !== state.runs) return;
      why.part.classList.remove("wb-stale");
      why.part.removeAttribute("title");
      why.part.setAttribute("aria-busy", "false");
    });
  }


  /** A background as strong as |value| is large against `largest`: blue where it raises the target, red where not. */
  function colour(value, largest) {
    var rgb = value > 0 ? RAISES : LOWERS, strength = largest > 0 ? Math.min(1, Math.abs(value) / largest) : 0;
    return "rgba(" + rgb.join(",") + "," + (0.85 * strength).toFixed(3) + ")";
  }

  function largestOf(values) { return values.reduce(function (a, v) { return Math.max(a, Math.abs(v)); }, 0); }

  function draw(panel, answer) {
    var shown = panel.why.shown;
    clear(shown);
    if (answer.hint) shown.appendChild(el("p", {"class": "wb-why-hint"}, answer.hint));
    if (answer.target === null) return;  // a sentence model: nothing of one text to explain (the hint says why)
    var target = el("p", {"class": "wb-why-target"}, "Explains " + answer.target + " = ");
    target.appendChild(el("span", {"class": "wb-why-value", "data-value": String(answer.value)}, number(answer.value)));
    target.appendChild(document.createTextNode(" (the text as typed, no head ablated)."));
    shown.appendChild(target);

    shown.appendChild(el("h3", {}, "Tokens (integrated gradients, " + answer.steps + " points, [PAD] baseline)"));
    var row = el("div", {"class": "wb-why-tokens", role: "group", "aria-label": "token attributions"});
    var largest = largestOf(answer.scores), total = 0;
    answer.tokens.forEach(function (token, i) {
      var score = answer.scores[i];
      total += score;
      var span = el("span", {"class": "wb-why-token", "data-index": String(i), "data-value": String(score),
                             title: "position " + i + ": " + number(score)}, token);
      span.style.background = colour(score, largest);
      row.appendChild(span);
    });
    shown.appendChild(row);
    shown.appendChild(el("p", {"class": "wb-hint wb-why-sum"},
                         "Σ = " + number(total) + "; the target at the text less at the baseline: "
                         + number(answer.value - answer.baseline_value) + " (the integral's gap: "
                         + number(answer.completeness_gap) + "). Blue raises the target, red lowers it."));

    shown.appendChild(el("h3", {}, "Heads: the largest direct effects on the target (L-H, 1-indexed; click to "
                                   + "step through one)"));
    var heads = el("div", {"class": "wb-why-heads"});
    var widest = largestOf(answer.heads.map(function (h) { return h.value; }));
    answer.heads.forEach(function (h) {
      var line = el("div", {"class": "wb-why-head-row"});
      var button = el("button", {type: "button", "class": "wb-why-head", "data-layer": String(h.layer),
                                 "data-head": String(h.head), "data-value": String(h.value),
                                 title: "head " + h.label + " (0-indexed: layer " + h.layer + ", head " + h.head
                                   + "): show it in the step-through and the views"}, h.label);
      button.addEventListener("click", function () { page.choose({layer: h.layer, head: h.head}); });
      var bar = el("span", {"class": "wb-bar"});
      bar.style.width = Math.round(120 * (widest > 0 ? Math.abs(h.value) / widest : 0)) + "px";
      bar.style.background = "rgb(" + (h.value > 0 ? RAISES : LOWERS).join(",") + ")";
      line.appendChild(button);
      line.appendChild(bar);
      line.appendChild(el("span", {"class": "wb-value-number"}, number(h.value)));
      heads.appendChild(line);
    });
    shown.appendChild(heads);
  }

  return {section: section, show: show};
}

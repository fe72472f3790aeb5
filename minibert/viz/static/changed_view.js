/* minibert workbench, the "what changed" panel (issue 39; minibert/viz/changed.py answers its "changed" request): the
   crosscoder latents whose activations differ most between the main model (A) and --compare's (B) on the text as
   typed, each token's share of the latent from A and from B. It asks only while it is open, after the run's answer
   has drawn the tokens and views; a failure shows in the panel. User text reaches the page through textContent only.
   minibertChanged(page) → {section(column, panel), show(panel, ticket)}; only the first model's column has it. */
/** page: {prefix, state, send, body, el, number, choose, clear, lazySection}. */
function minibertChanged(page) {
  "use strict";
  var el = page.el, state = page.state, number = page.number, clear = page.clear;

  function section(column, panel) {
    if (panel.n !== 0) return null;  // one crosscoder reads both models: it is shown once, beside A
    panel.changed = page.lazySection(column, panel, {key: "changed", label: "What changed",
                                                     summary: "What changed (crosscoder latents, A vs B)",
                                                     show: show});
    return panel.changed.part;
  }

  function show(panel, ticket) {
    var part = panel.changed;
    if (!part || !part.details.open) {
      if (part) part.part.classList.remove("wb-stale");
      return Promise.resolve();
    }
    part.part.setAttribute("aria-busy", "true");
    return page.send("changed", page.body(panel.n, {})).then(function (answer) {
      if (ticket === state.runs) draw(panel, answer);
    }, function (error) {
      if (ticket !== state.runs) return;
      clear(part.shown);
      part.shown.appendChild(el("p", {"class": "wb-error wb-changed-error"}, error.message));
    }).then(function () {
      if (ticket !== state.runs) return;
      part.part.classList.remove("wb-stale");
      part.part.removeAttribute("title");
      part.part.setAttribute("aria-busy", "false");
    });
  }

  function draw(panel, answer) {
    var shown = panel.changed.shown;
    clear(shown);
    if (answer.hint) shown.appendChild(el("p", {"class": "wb-changed-hint"}, answer.hint));
    if (answer.tokens === null) return;
    shown.appendChild(el("p", {"class": "wb-hint"}, "At " + answer.site + ": each latent's share of its "
      + "pre-activation from A's vector and from B's, per token where it fires (A / B); r is B's share of the "
      + "decoder norm (0.5 shared)."));
    answer.latents.forEach(function (latent) {
      var block = el("div", {"class": "wb-changed-latent", "data-latent": String(latent.latent),
                             "data-value": String(latent.gap)});
      block.appendChild(el("h3", {}, "Latent " + latent.latent + " · " + latent.scaling_label + " (latent scaling "
        + "on this text; norms say " + latent.norm_label + ") · r = " + number(latent.relative_norm)
        + " · cos = " + number(latent.cosine)));
      var row = el("div", {"class": "wb-changed-tokens"});
      answer.tokens.forEach(function (token, t) {
        if (!(latent.activation[t] > 0)) return;
        var cell = el("span", {"class": "wb-changed-token", "data-index": String(t),
                               "data-a": String(latent.a[t]), "data-b": String(latent.b[t]),
                               title: "position " + t + ": activation " + number(latent.activation[t])}, token);
        cell.appendChild(el("span", {"class": "wb-value-number"}, " " + number(latent.a[t]) + " / "
                                                                  + number(latent.b[t])));
        row.appendChild(cell);
      });
      block.appendChild(row);
      shown.appendChild(block);
    });
  }

  return {section: section, show: show};
}

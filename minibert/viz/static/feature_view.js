/* minibert workbench, the "features" panel (issue 38; minibert/viz/feature_panel.py answers its "features" request):
   the transcoder latents active at each token of the text as typed, and, for a feature clicked, what it feeds in
   the attribution graph of the "why" panel's target. It asks only while it is open, after the run's answer has drawn
   the tokens and views; a failure shows in the panel. User text (tokens) reaches the page through textContent only.
   minibertFeatures(page) → {section(column, panel), show(panel, ticket)}. */
/** page: {prefix, state, send, body, el, number, choose, clear, lazySection}. */
function minibertFeatures(page) {
  "use strict";
  var el = page.el, prefix = page.prefix, state = page.state, number = page.number, clear = page.clear;

  function section(column, panel) {
    var parts = page.lazySection(column, panel, {key: "features", label: "Features",
                                                 summary: "Features (transcoder latents) and what they feed",
                                                 show: show});
    parts.feeds = el("div", {"class": "wb-features-feeds", id: prefix + "features-feeds-" + panel.n,
                             "aria-live": "polite"});
    parts.details.appendChild(parts.feeds);
    panel.features = parts;
    return parts.part;
  }

  function failed(node, error) {
    clear(node);
    node.appendChild(el("p", {"class": "wb-error wb-features-error"}, error.message));
  }

  /** Ask for and draw the features while the panel is open (a promise that never rejects). */
  function show(panel, ticket) {
    var part = panel.features;
    if (!part.details.open) {
      part.part.classList.remove("wb-stale");
      return Promise.resolve();
    }
    part.part.setAttribute("aria-busy", "true");
    clear(part.feeds);
    return page.send("features", page.body(panel.n, {})).then(function (answer) {
      if (ticket !== state.runs) return;
      draw(panel, answer, ticket);
    }, function (error) {
      if (ticket === state.runs) failed(part.shown, error);
    }).then(function () {
      if (ticket !== state.runs) return;
      part.part.classList.remove("wb-stale");
      part.part.removeAttribute("title");
      part.part.setAttribute("aria-busy", "false");
    });
  }

  function draw(panel, answer, ticket) {
    var shown = panel.features.shown;
    clear(shown);
    if (answer.hint) shown.appendChild(el("p", {"class": "wb-features-hint"}, answer.hint));
    if (answer.tokens === null) return;  // no transcoders: the hint says how to get them
    shown.appendChild(el("p", {"class": "wb-hint"}, "Each token's strongest latents, as layer·latent (0-indexed) "
                                                   + "and activation; click one to see what it feeds."));
    var table = el("div", {"class": "wb-features-table", role: "group", "aria-label": "features per token"});
    answer.tokens.forEach(function (token, position) {
      var row = el("div", {"class": "wb-features-row"});
      row.appendChild(el("span", {"class": "wb-features-token", title: "position " + position}, token));
      answer.features[position].forEach(function (f) {
        var button = el("button", {type: "button", "class": "wb-feature", "data-layer": String(f.layer),
                                   "data-position": String(position), "data-latent": String(f.latent),
                                   "data-value": String(f.activation),
                                   title: "latent " + f.latent + " of layer " + f.layer + " (0-indexed) at position "
                                     + position + ": activation " + number(f.activation)},
                        f.layer + "·" + f.latent + " " + number(f.activation));
        button.addEventListener("click", function () { feeds(panel, [f.layer, position, f.latent], ticket); });
        row.appendChild(button);
      });
      table.appendChild(row);
    });
    shown.appendChild(table);
  }

  /** What one feature writes into: ask, then list its edges (weight as a bar: blue raises, red lowers). */
  function feeds(panel, feature, ticket) {
    var node = panel.features.feeds;
    clear(node);
    node.appendChild(el("p", {"class": "wb-pending"}, "building the attribution graph…"));
    return page.send("features", page.body(panel.n, {feature: feature})).then(function (answer) {
      if (ticket !== state.runs) return;
      clear(node);
      var title = "Feature " + feature[0] + "·" + feature[2] + " at position " + feature[1];
      node.appendChild(el("h3", {}, title + (answer.target ? " feeds (toward " + answer.target + ")" : "")));
      if (answer.hint) node.appendChild(el("p", {"class": "wb-features-hint"}, answer.hint));
      if (!answer.target) return;
      var widest = answer.edges.reduce(function (a, e) { return Math.max(a, Math.abs(e.weight)); }, 0);
      answer.edges.forEach(function (e) {
        var line = el("div", {"class": "wb-features-edge" + (e.kept ? " wb-kept" : ""), "data-kind": e.kind,
                              "data-value": String(e.weight)});
        var where = e.kind === "target" ? "the target" : e.kind === "error" ? "error of layer " + e.layer
          + " at position " + e.position : "feature " + e.layer + "·" + e.latent + " at position " + e.position;
        line.appendChild(el("span", {"class": "wb-features-to"}, where + (e.kept ? " (kept by pruning)" : "")));
        var bar = el("span", {"class": "wb-bar"});
        bar.style.width = Math.round(120 * (widest > 0 ? Math.abs(e.weight) / widest : 0)) + "px";
        bar.style.background = e.weight > 0 ? "rgb(31,111,235)" : "rgb(207,34,46)";
        line.appendChild(bar);
        line.appendChild(el("span", {"class": "wb-value-number"}, number(e.weight)));
        node.appendChild(line);
      });
      if (!answer.edges.length) node.appendChild(el("p", {"class": "wb-hint"}, "It feeds nothing (no edge ≠ 0)."));
    }, function (error) {
      if (ticket === state.runs) failed(node, error);
    });
  }

  return {section: section, show: show};
}

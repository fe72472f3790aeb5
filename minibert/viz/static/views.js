/* minibert views, entry: boot (a standalone view's page) and render (a view drawn from its data), after
   common.js and the views' own files (_html.VIEW_SCRIPTS gives the order). */

function boot(script, id) {
  // Jupyter front ends run scripts in different ways; the id finds the root in all of them.
  var root = document.getElementById(id) || (script && script.closest(".mbv"));
  var fallback = root.querySelector(".mbv-fallback");
  if (typeof DecompressionStream === "undefined") {
    fallback.textContent = "This view needs a browser with DecompressionStream (Chrome 80, Firefox 113, Safari 16.4 " +
                           "or later).";
    return;
  }
  var data = JSON.parse(root.querySelector("script.mbv-data").textContent);
  fallback.remove();
  render(root, data);
}

/** Draw a view from its data ({kind, meta, arrays}) into root; the workbench calls this for data it fetched, with
    `page` (optional): {selection: {layer, head, query} to show, onSelect(change): called with the part of the
    selection the reader changed in the view, ablated: [[layer, head], …] to mark}. Returns {select(selection)},
    which moves the view to another selection without drawing it anew. */
function render(root, data, page) {
  var body = el("div", {"class": "mbv-body"});
  root.appendChild(body);
  var arrays = {};
  for (var name in data.arrays) arrays[name] = packedArray(data.arrays[name]);
  var views = {head: headView, model: modelView, neuron: neuronView};
  page = page || {};
  var chosen = function (change) { if (page.onSelect) page.onSelect(change); };
  return views[data.kind](body, data.meta, arrays, root, {selection: page.selection || {}, onSelect: chosen,
                                                           ablated: page.ablated || [], figureName: page.figureName})
    || {select: function () {}};
}


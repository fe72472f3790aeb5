/* minibert head view: one layer's heads as lines from each query token to its keys (common.js). */

// ---- head view ----------------------------------------------------------------------------------

/** Toggle buttons, one per head in its colour (double-click: only that head), plus "all" and "none". */
function headSwatches(meta, active, onChange, ablated, root) {
  var wrap = el("span", {"class": "mbv-swatches", role: "group", "aria-label": "heads"});
  var buttons = meta.heads.map(function (h, n) {
    var b = el("button", {type: "button", "class": "mbv-swatch", style: "--c:" + headColor(h, meta.n_heads, root),
                          title: meta.map_name ? meta.map_name + ": one map per layer, of every head together"
                            : "head " + (h + 1) + " (0-indexed: " + h + "); double-click: only this head"},
               meta.map_name || String(h + 1));
    b.addEventListener("click", function () { active[n] = !active[n]; onChange(); });
    b.addEventListener("dblclick", function () { active.forEach(function (_, m) { active[m] = m === n; }); onChange(); });
    wrap.appendChild(b);
    return b;
  });
  [["all", true], ["none", false]].forEach(function (choice) {
    var b = el("button", {type: "button", "class": "mbv-link"}, choice[0]);
    b.addEventListener("click", function () { active.fill(choice[1]); onChange(); });
    wrap.appendChild(b);
  });
  return {node: wrap, update: function (layer) {
    buttons.forEach(function (b, n) {
      b.setAttribute("aria-pressed", String(active[n]));
      var off = isAblated(ablated, meta.layers[layer], meta.heads[n]);
      b.classList.toggle("mbv-ablated", off);
      b.setAttribute("aria-label", "head " + (meta.heads[n] + 1) + (off ? " (ablated)" : ""));
    });
  }};
}

/** weight(i, j) of head n in one inflated layer of attention [H, T, S]. */
function headWeight(values, scale, n, T) {
  var offset = n * T * T;
  return function (i, j) { return values[offset + i * T + j] * scale; };
}

function headView(body, meta, arrays, root, page) {
  var T = meta.tokens.length, attention = arrays.attention, busy = busyTracker(root, body);
  var filters = sentenceFilters(meta);
  var st = {layer: layerAt(meta, page.selection.layer, meta.layer), active: meta.active.slice(), filter: filters[0]};
  var lines = tokenLines(root, busy, {tokens: meta.tokens, bStart: meta.b_start, maxHeads: meta.heads.length, top: ROW});
  var swatches = headSwatches(meta, st.active, draw, page.ablated, root);
  var controls = div("mbv-controls");
  var layerSelect = selectControl("Layer", oneIndexed(meta.layers), st.layer, function (v) {
    st.layer = Number(v);
    draw();
    page.onSelect({layer: meta.layers[st.layer]});
  });
  controls.appendChild(layerSelect);
  controls.appendChild(filterControl(filters, function (f) { st.filter = f; draw(); }));
  controls.appendChild(swatches.node);
  controls.appendChild(downloadControl(root, busy, function () {  // e.g. minibert-MODEL-after-head-view-layer-3
    var heads = st.active.every(Boolean) ? "" : "-heads-" + meta.heads.filter(function (_, n) { return st.active[n]; })
      .map(function (h) { return h + 1; }).join("-");
    return (page.figureName ? page.figureName + "-" : "") + "head-view-layer-" + (meta.layers[st.layer] + 1) + heads;
  }, function () {
    return picture(root, [{node: lines.svg(), x: 0, y: 0}], lines.width, lines.height);
  }));
  body.appendChild(controls);
  body.appendChild(div("mbv-help", "Hover a token to see only its attention; click to pin it. Layers and heads " +
                                   "are numbered from 1 here, as in Clark et al.; tooltips give the 0-indexed number."));
  body.appendChild(scroller(lines.node));

  function draw() {
    swatches.update(st.layer);
    var values = attention.here[st.layer];
    if (!values) { busy.after(attention.layer(st.layer), draw); return; }
    var heads = [];
    meta.heads.forEach(function (h, n) {
      if (st.active[n]) heads.push({index: h, color: headColor(h, meta.n_heads, root), weight: headWeight(values, attention.scale, n, T)});
    });
    lines.draw({rows: st.filter[2], cols: st.filter[3], heads: heads});
  }
  draw();
  return {select: function (selection) {
    var layer = layerAt(meta, selection.layer, st.layer);
    if (layer === st.layer) return;
    st.layer = layer;
    layerSelect.querySelector("select").value = String(layer);
    draw();
  }};
}


/* minibert model view: every layer's and head's pattern as thumbnails, one enlarged (common.js). */

// ---- model view ---------------------------------------------------------------------------------

/** One head's pattern (flat [T, T] values at offset) on a canvas: bertviz-style lines, or a
    query × key heat map: an image of at most one pixel per cell, scaled to the thumbnail, where
    the cells sharing a pixel overlap as painted cells would, 1 − Π(1 − w). */
function drawThumbnail(canvas, values, offset, scale, T, color, filter, mode, size) {
  var ratio = window.devicePixelRatio || 1, context = canvas.getContext("2d");
  canvas.width = canvas.height = Math.round(size * ratio);
  context.setTransform(ratio, 0, 0, ratio, 0, 0);
  context.clearRect(0, 0, size, size);
  var step = (size - 8) / T, i, j, w;
  if (mode === "matrix") {
    var n = Math.min(T, Math.round((size - 8) * ratio)), per = n / T, light = new Float32Array(n * n);
    for (i = filter[2][0]; i < filter[2][1]; i++) {
      for (j = filter[3][0]; j < filter[3][1]; j++) {
        w = values[offset + i * T + j] * scale;
        if (w >= MIN_WEIGHT) light[Math.floor(i * per) * n + Math.floor(j * per)] -= Math.log(1 - Math.min(w, 0.999));
      }
    }
    var image = new ImageData(n, n), c = rgb(color);
    light.forEach(function (v, p) { if (v > 0) image.data.set([c[0], c[1], c[2], 255 * (1 - Math.exp(-v))], 4 * p); });
    var cells = el("canvas", {width: n, height: n});
    cells.getContext("2d").putImageData(image, 0, 0);
    context.imageSmoothingEnabled = false;  // sharp cells
    context.drawImage(cells, 4, 4, size - 8, size - 8);
    return;
  }
  var lines = [], side = canvas.width, rowAt = function (i) { return (4 + (i + 0.5) * step) * ratio; };
  for (i = filter[2][0]; i < filter[2][1]; i++) {
    for (j = filter[3][0]; j < filter[3][1]; j++) {
      w = values[offset + i * T + j] * scale;
      if (w >= MIN_WEIGHT) lines.push([rowAt(i), rowAt(j), w]);
    }
  }
  var x0 = Math.round(side * 0.2);
  context.putImageData(linesImage(Math.round(side * 0.8) - x0, side, [{color: rgb(color), lines: lines}], ratio), x0, 0);
}

/** The layers × heads grid as {node: SVG, width, height}: axis labels as text, each thumbnail as an
    embedded PNG; the picture spans the grid's cells (the grid element may be wider). */
function gridPicture(root, grid) {
  var cells = Array.from(grid.children).filter(function (cell) { return cell.tagName === "CANVAS" || cell.textContent; });
  var rects = cells.map(function (cell) { return cell.getBoundingClientRect(); });
  var left = Math.min.apply(null, rects.map(function (r) { return r.left; }));
  var top = Math.min.apply(null, rects.map(function (r) { return r.top; }));
  var width = Math.ceil(Math.max.apply(null, rects.map(function (r) { return r.right; })) - left);
  var height = Math.ceil(Math.max.apply(null, rects.map(function (r) { return r.bottom; })) - top);
  var node = svg("svg", {width: width, height: height});
  cells.forEach(function (cell, n) {
    var r = rects[n], x = r.left - left, y = r.top - top;
    if (cell.tagName === "CANVAS") {
      node.appendChild(svg("image", {x: x, y: y, width: r.width, height: r.height, href: cell.toDataURL("image/png")}));
      node.appendChild(svg("rect", {x: x, y: y, width: r.width, height: r.height, rx: 4, fill: "none",
                                    stroke: getComputedStyle(cell).borderTopColor}));
    } else {
      var style = getComputedStyle(cell);
      node.appendChild(svg("text", {x: x + r.width / 2, y: y + r.height / 2, "text-anchor": "middle",
                                    "dominant-baseline": "central", fill: style.color, "font-size": style.fontSize,
                                    "font-family": style.fontFamily}, cell.textContent));
    }
  });
  return picture(root, [{node: node, x: 0, y: 0}], width, height);
}

function modelView(body, meta, arrays, root, page) {
  var T = meta.tokens.length, attention = arrays.attention, busy = busyTracker(root, body);
  var filters = sentenceFilters(meta);
  var st = {filter: filters[0], mode: meta.thumbnail, open: null};
  var controls = div("mbv-controls");
  controls.appendChild(filterControl(filters, function (f) { st.filter = f; draw(); }));
  controls.appendChild(selectControl("Thumbnails", [["lines", "lines"], ["matrix", "query \u00d7 key matrix"]], st.mode,
                                     function (v) { st.mode = v; draw(); }));
  controls.appendChild(downloadControl(root, busy, "model-view", function () {
    if (st.open) return picture(root, [{node: lines.svg(), x: 0, y: 0}], lines.width, lines.height);
    return gridPicture(root, grid);
  }));
  body.appendChild(controls);
  // Thumbnails as large as THUMB, smaller where every head of a row must fit the width the view is given (two
  // models or before / after side by side on a 1366-px screen): no head is cut off.
  var room = root.parentNode && root.parentNode.clientWidth ? root.parentNode.clientWidth - 110 : Infinity;
  var size = Math.max(28, Math.min(THUMB, Math.floor(room / meta.heads.length) - 6));
  // Column labels as wide as their thumbnails allow: "Head 12" over full-size ones, "H12" over shrunk ones.
  var headWord = size >= THUMB ? "Head " : "H";
  body.appendChild(div("mbv-help", "Rows are layers, columns heads" + (size >= THUMB ? "" : " (H3: head 3)") +
                                   ", numbered from 1 (tooltips give the 0-indexed numbers). Click a thumbnail to " +
                                   "enlarge it; Escape closes. Download saves the grid, or the enlarged head when one " +
                                   "is open."));

  var stage = div("mbv-stage"), grid = div("mbv-grid");
  grid.style.gridTemplateColumns = "auto repeat(" + meta.heads.length + ", " + (size + 2) + "px)";
  grid.appendChild(div("mbv-axis"));
  meta.heads.forEach(function (h) {  // a context-mixing map (meta.map_name) is one map per layer, not a head
    grid.appendChild(el("div", {"class": "mbv-axis", title: meta.map_name ? meta.map_name + ": one map per layer, "
                                  + "of every head together" : "head " + (h + 1) + " (0-indexed: " + h + ")"},
                        meta.map_name || headWord + (h + 1)));
  });
  var thumbs = [];
  meta.layers.forEach(function (l, a) {
    grid.appendChild(el("div", {"class": "mbv-axis mbv-rowlab", title: "0-indexed: " + l}, "Layer " + (l + 1)));
    meta.heads.forEach(function (h, b) {
      var off = isAblated(page.ablated, l, h);
      var canvas = el("canvas", {"class": "mbv-thumb" + (off ? " mbv-ablated" : ""), tabindex: 0, role: "button",
                                 "data-layer": l, "data-head": h,
                                 title: "head " + meta.labels[a][b] + " (L-H, 1-indexed; 0-indexed: layer " + l +
                                        ", head " + h + ")" + (off ? ", ablated" : "") + ": click to enlarge"});
      canvas.style.width = canvas.style.height = size + "px";
      canvas.addEventListener("click", function () { open(a, b); });
      canvas.addEventListener("keydown", function (e) { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(a, b); } });
      grid.appendChild(canvas);
      thumbs.push({canvas: canvas, a: a, b: b});
    });
  });

  var detail = div("mbv-detail"), heading = el("b"), close = el("button", {type: "button", "class": "mbv-close",
                                                                           title: "close (Escape)"}, "\u00d7");
  var detailHead = div("mbv-detail-head");
  detailHead.appendChild(heading);
  detailHead.appendChild(close);
  detail.appendChild(detailHead);
  var lines = tokenLines(root, busy, {tokens: meta.tokens, bStart: meta.b_start, maxHeads: 1, top: ROW});
  detail.appendChild(lines.node);
  detail.hidden = true;
  close.addEventListener("click", function () { open(null); });
  root.addEventListener("keydown", function (e) { if (e.key === "Escape" && st.open) open(null); });
  stage.appendChild(grid);
  stage.appendChild(detail);
  body.appendChild(scroller(stage));

  function open(a, b) {
    st.open = a == null ? null : [a, b];
    drawDetail();
    if (st.open) page.onSelect({layer: meta.layers[a], head: meta.heads[b]});
  }

  /** The thumbnails of layer a, once its attention is here. */
  function drawRow(a) {
    var values = attention.here[a];
    if (!values) return;
    thumbs.forEach(function (t) {
      if (t.a === a) drawThumbnail(t.canvas, values, t.b * T * T, attention.scale, T,
                                   headColor(meta.heads[t.b], meta.n_heads, root), st.filter, st.mode, size);
    });
  }

  function drawDetail() {
    thumbs.forEach(function (t) {
      t.canvas.classList.toggle("mbv-selected", Boolean(st.open) && st.open[0] === t.a && st.open[1] === t.b);
    });
    detail.hidden = !st.open;
    stage.style.minHeight = "";
    if (!st.open) return;
    var a = st.open[0], b = st.open[1], l = meta.layers[a], h = meta.heads[b], values = attention.here[a];
    if (!values) return;  // drawn when the layer arrives
    heading.textContent = "Layer " + (l + 1) + " \u00b7 " + (meta.map_name ? meta.map_name + " (one map per layer)"
                          : "Head " + (h + 1)) + "  (0-indexed: layer " + l + (meta.map_name ? "" : ", head " + h) + ")" +
                          (isAblated(page.ablated, l, h) ? " \u00b7 ablated" : "");
    lines.draw({rows: st.filter[2], cols: st.filter[3],
                heads: [{index: h, color: headColor(h, meta.n_heads, root), weight: headWeight(values, attention.scale, b, T)}]});
    stage.style.minHeight = detail.offsetHeight + "px";  // the panel floats over the grid; keep it unclipped
  }

  function draw() {
    meta.layers.forEach(function (_, a) { drawRow(a); });
    drawDetail();
  }
  // Every row is shown at once, so every layer is inflated now; each row draws as its layer arrives.
  meta.layers.forEach(function (_, a) {
    busy.after(attention.layer(a), function () { drawRow(a); if (st.open && st.open[0] === a) drawDetail(); });
  });
  function mark(selection) {  // the selected head's thumbnail (an enlarged one keeps its own mark)
    thumbs.forEach(function (t) {
      t.canvas.classList.toggle("mbv-current", meta.layers[t.a] === selection.layer && meta.heads[t.b] === selection.head);
    });
  }
  mark(page.selection);
  return {select: mark};
}


/* minibert neuron view: q, each k, q × k, q·k and the softmax of one head and query (common.js). */

// ---- neuron view --------------------------------------------------------------------------------

/** A number as the views and the workbench show it: three decimals, never "-0.000" (the exact value on hover). */
function decimals(value) {
  return Math.abs(value) < 5e-4 ? "0.000" : value.toFixed(3);
}

/** Fill colour and opacity for a signed value: blue positive, orange negative, opacity |v| / scale. */
function signed(value, scale) {
  return {fill: value >= 0 ? POSITIVE : NEGATIVE, "fill-opacity": scale > 0 ? Math.min(Math.abs(value) / scale, 1) : 0};
}

function maxAbs(values) {
  return values.reduce(function (m, v) { return Math.max(m, Math.abs(v)); }, 0);
}

/** softmax over keys of the scaled scores, in float64 and with the maximum subtracted, as numpy does. */
function softmax(scores) {
  var top = Math.max.apply(null, scores), e = scores.map(function (s) { return Math.exp(s - top); });
  var total = e.reduce(function (sum, v) { return sum + v; }, 0);
  return e.map(function (v) { return v / total; });
}

function neuronView(body, meta, arrays, root, page) {
  var T = meta.tokens.length, H = meta.heads.length, K = meta.d_head, busy = busyTracker(root, body);
  var given = arrays.attention;  // present only when it is not softmax(q·k/√K): then the page shows it
  // DeBERTa: its three score terms (c2c, c2p, p2c, each [H, T, T] per layer) side by side; their sum is the scores.
  var terms = meta.terms ? meta.terms.map(function (name) { return arrays[name]; }) : [];
  var reach = arrays.key_mask;  // present where the model masks keys (a local layer's window): [T, S] per layer
  var scoresName = terms.length ? meta.terms.join(" + ") : "q\u00b7k/\u221a" + K;
  var chosen = page.selection;
  var st = {layer: layerAt(meta, chosen.layer, meta.layer), head: Math.max(0, meta.heads.indexOf(chosen.head)),
            query: chosen.query != null && chosen.query < T ? chosen.query : meta.query};
  if (chosen.head == null) st.head = meta.head;
  var controls = div("mbv-controls");
  var layerSelect = selectControl("Layer", oneIndexed(meta.layers), st.layer, function (v) {
    st.layer = Number(v);
    draw();
    page.onSelect({layer: meta.layers[st.layer]});
  });
  var headSelect = selectControl("Head", oneIndexed(meta.heads), st.head, function (v) {
    st.head = Number(v);
    draw();
    page.onSelect({head: meta.heads[st.head]});
  });
  controls.appendChild(layerSelect);
  controls.appendChild(headSelect);
  controls.appendChild(downloadControl(root, busy, "neuron-view", function () {
    var tableX = lines.width + 6;
    return picture(root, [{node: lines.svg(), x: 0, y: 0}, {node: tableSvg(), x: tableX, y: 0}],
                   tableX + tableW, Math.max(lines.height, tableH));
  }));
  body.appendChild(controls);
  var status = div("mbv-sub"), readout = div("mbv-readout");
  body.appendChild(status);
  if (meta.mismatch != null) {
    body.appendChild(div("mbv-warn", "softmax(" + scoresName + ") computed here differs from the model's attention " +
                                     "by up to " + meta.mismatch.toPrecision(3) + "; the softmax column shows the model's attention."));
  }
  body.appendChild(div("mbv-help", "Click a query token on the left. Blue: positive, orange: negative, stronger colour: " +
                                   "larger magnitude; hover a cell for its number. Layers and heads are numbered from 1; " +
                                   "tooltips give the 0-indexed number."));
  var lines = tokenLines(root, busy, {tokens: meta.tokens, bStart: meta.b_start, maxHeads: 1, top: 2 * ROW,
                                      onPick: function (i) { st.query = i; draw(); page.onSelect({query: i}); }});
  var cell = Math.max(2, Math.min(6, Math.floor(192 / K))), vectorW = K * cell;
  var x = {label: 4, k: 18, qk: 18 + vectorW + 16};
  x.dot = x.qk + vectorW + 16;
  // A number's box: wider in large type (views.css's .mbv-large, the workbench's projector mode), whose numbers are
  // half as large again.
  var NUM = root.classList.contains("mbv-large") ? 90 : 66;
  x.scaled = x.dot + NUM + 8;
  (meta.terms || []).forEach(function (name) { x[name] = x.scaled; x.scaled += NUM + 8; });
  x.bar = x.scaled + NUM + 14;
  x.softmax = x.bar + NUM - 26;
  var tableW = x.softmax + NUM + 6, tableH = 2 * ROW + T * ROW + 4;
  var table = svg("svg", {width: tableW, height: tableH, "class": "mbv-neuron"});
  // The q, k and q×k cells (K · (2T + 1) of them) go on a canvas: as SVG they made each click slow.
  var cellsW = x.qk + vectorW - x.k, cells = el("canvas", {"class": "mbv-cells", width: cellsW, height: tableH});
  cells.style.left = x.k + "px";
  var tableBox = div("mbv-tablebox");
  tableBox.appendChild(table);
  tableBox.appendChild(cells);
  var stage = div("mbv-neuron-stage");
  stage.appendChild(lines.node);
  stage.appendChild(tableBox);
  body.appendChild(scroller(stage));
  body.appendChild(readout);
  var shown = null;  // what draw() computed: {rows: [{kind, j, y, x0, values, scale}], tip(row, d)}
  table.addEventListener("mouseover", function (e) {
    var tipped = e.target.closest("[data-tip]");
    readout.textContent = tipped ? tipped.getAttribute("data-tip") : "";
  });
  cells.addEventListener("mousemove", function (e) {
    var found = shown && cellAt(e.offsetX + x.k, e.offsetY);
    readout.textContent = found ? shown.tip(found.row, found.d) : "";
  });
  cells.addEventListener("mouseleave", function () { readout.textContent = ""; });

  function rowTop(j) { return 2 * ROW + j * ROW; }

  /** The cell under table coordinates (px, py): {row, d}, or null between cells. */
  function cellAt(px, py) {
    var found = null;
    shown.rows.forEach(function (row) {
      var d = Math.floor((px - row.x0) / cell);
      if (py >= row.y + 3 && py < row.y + ROW - 3 && d >= 0 && d < K) found = {row: row, d: d};
    });
    return found;
  }

  /** Each cell as [x, y, width, height, fill, fill-opacity], in table coordinates. */
  function cellRects(fn) {
    shown.rows.forEach(function (row) {
      row.values.forEach(function (v, d) {
        var paint = signed(v, row.scale);
        fn(row.x0 + d * cell, row.y + 3, cell - (cell > 3 ? 1 : 0), ROW - 6, paint.fill, paint["fill-opacity"]);
      });
    });
  }

  function paintCells() {
    var context = cells.getContext("2d");
    context.clearRect(0, 0, cells.width, cells.height);
    cellRects(function (left, top, w, h, fill, opacity) {
      context.fillStyle = fill;
      context.globalAlpha = opacity;
      context.fillRect(left - x.k, top, w, h);
    });
    context.globalAlpha = 1;
  }

  /** The table as a standalone SVG, its cells as <rect>s. */
  function tableSvg() {
    var copy = standalone(table);
    cellRects(function (left, top, w, h, fill, opacity) {
      copy.appendChild(svg("rect", {x: left, y: top, width: w, height: h, fill: fill, "fill-opacity": opacity}));
    });
    return copy;
  }

  function number(fragment, column, j, value, text, background, tip) {
    var x0 = x[column];
    if (background) fragment.appendChild(svg("rect", Object.assign({x: x0, y: rowTop(j) + 2, width: NUM, height: ROW - 4, rx: 3}, background)));
    fragment.appendChild(svg("text", {x: x0 + NUM - 4, y: rowTop(j) + ROW / 2, "text-anchor": "end", "class": "mbv-num",
                                      "data-col": column, "data-key": j, "data-value": value, "data-tip": tip}, text));
  }

  function header(fragment, text, x0, anchor) {
    fragment.appendChild(svg("text", {x: x0, y: ROW / 2, "class": "mbv-colhead", "text-anchor": anchor || "start"}, text));
  }

  /** The K numbers of token j, head h, in one layer's flat [T, H, K] values (float32 read as float64). */
  function vectorOf(values, j, h) {
    var start = (j * H + h) * K;
    return Array.from(values.subarray(start, start + K));
  }

  function draw() {
    var l = st.layer, needed = [arrays.q, arrays.k].concat(terms, given ? [given] : [], reach ? [reach] : []);
    if (needed.some(function (a) { return !a.here[l]; })) {
      busy.after(Promise.all(needed.map(function (a) { return a.layer(l); })), draw);
      return;
    }
    var h = st.head, i = st.query, keys = range([0, T]);
    var kv = keys.map(function (j) { return vectorOf(arrays.k.here[l], j, h); });
    var qs = keys.map(function (j) { return vectorOf(arrays.q.here[l], j, h); }), qv = qs[i];
    var products = kv.map(function (row) { return row.map(function (v, d) { return qv[d] * v; }); });
    var dots = products.map(function (row) { return row.reduce(function (sum, v) { return sum + v; }, 0); });
    var sqrtK = Math.sqrt(K), scaled = dots.map(function (v) { return v / sqrtK; });
    // The terms' row of this head and query, [T] each; with them, the scores are their sum (already scaled).
    var termRows = terms.map(function (a) { return Array.from(a.here[l].subarray((h * T + i) * T, (h * T + i + 1) * T)); });
    if (termRows.length) scaled = keys.map(function (j) { return termRows.reduce(function (sum, row) { return sum + row[j]; }, 0); });
    // a stored byte: 0 where the key is masked (−∞ before the softmax, as in the model), 255 where it is in reach
    if (reach) scaled = scaled.map(function (v, j) { return reach.here[l][i * T + j] > 0 ? v : -Infinity; });
    var p = given ? Array.from(given.here[l].subarray((h * T + i) * T, (h * T + i + 1) * T)) : softmax(scaled);
    // q and k cells share one scale per vector kind over all tokens, so queries compare with each other.
    var flat = function (rows) { return [].concat.apply([], rows); };
    var qScale = maxAbs(flat(qs)), kScale = maxAbs(flat(kv)), productScale = maxAbs(flat(products));
    var dotScale = maxAbs(dots);
    var token = function (j) { return "\u201c" + meta.tokens[j] + "\u201d"; };

    lines.draw({rows: [0, T], cols: [0, T], query: i, heads: [{index: meta.heads[h], color: headColor(meta.heads[h], meta.n_heads, root),
                                                               weight: function (a, b) { return a === i ? p[b] : 0; }}]});
    status.textContent = "Query " + token(i) + " (position " + i + ", 0-indexed) \u00b7 head " + meta.labels[l][h] +
                         " (L-H, 1-indexed; 0-indexed: layer " + meta.layers[l] + ", head " + meta.heads[h] + ")" +
                         (isAblated(page.ablated, meta.layers[l], meta.heads[h]) ? " \u00b7 ablated" : "") + " \u00b7 d = " + K;
    var rows = [{kind: "q", j: i, y: ROW, x0: x.k, values: qv, scale: qScale}];
    keys.forEach(function (j) {
      rows.push({kind: "k", j: j, y: rowTop(j), x0: x.k, values: kv[j], scale: kScale},
                {kind: "qk", j: j, y: rowTop(j), x0: x.qk, values: products[j], scale: productScale});
    });
    shown = {rows: rows, tip: function (row, d) {
      if (row.kind === "qk") {
        return "q[" + d + "] \u00d7 k[" + d + "] = " + qv[d] + " \u00d7 " + kv[row.j][d] + " = " + row.values[d].toPrecision(4);
      }
      return row.kind + "[" + d + "] of " + token(row.j) + " = " + row.values[d];
    }};
    paintCells();
    var fragment = document.createDocumentFragment();
    header(fragment, "k", x.k);
    header(fragment, "q \u00d7 k", x.qk);
    header(fragment, "q\u00b7k", x.dot + NUM - 4, "end");
    (meta.terms || []).forEach(function (name) { header(fragment, name, x[name] + NUM - 4, "end"); });
    header(fragment, terms.length ? "scores" : "q\u00b7k/\u221a" + K, x.scaled + NUM - 4, "end");
    header(fragment, "softmax", x.bar);
    fragment.appendChild(svg("text", {x: x.label, y: ROW * 1.5, "class": "mbv-colhead"}, "q"));
    keys.forEach(function (j) {
      number(fragment, "dot", j, dots[j], decimals(dots[j]), signed(dots[j], dotScale),
             "q\u00b7k for key " + token(j) + " = " + dots[j]);
      (meta.terms || []).forEach(function (name, n) {
        var value = termRows[n][j];
        number(fragment, name, j, value, decimals(value), signed(value, maxAbs(termRows[n])),
               name + " for key " + token(j) + " = " + value);
      });
      number(fragment, "scaled", j, scaled[j], isFinite(scaled[j]) ? decimals(scaled[j]) : "\u2212\u221e",
             terms.length ? signed(scaled[j], maxAbs(scaled)) : signed(dots[j], dotScale),
             scoresName + " for key " + token(j) + " = " + scaled[j]);
      fragment.appendChild(svg("rect", {x: x.bar, y: rowTop(j) + 4, width: Math.max(60 * p[j], 0.5), height: ROW - 8,
                                        fill: POSITIVE, "class": "mbv-bar"}));
      number(fragment, "softmax", j, p[j], decimals(p[j]), null, "softmax for key " + token(j) + " = " + p[j]);
    });
    clear(table);
    table.appendChild(fragment);
  }
  draw();
  return {select: function (selection) {
    var layer = layerAt(meta, selection.layer, st.layer), head = meta.heads.indexOf(selection.head);
    var query = selection.query != null && selection.query < T ? selection.query : st.query;
    head = head >= 0 ? head : st.head;
    if (layer === st.layer && head === st.head && query === st.query) return;
    st.layer = layer;
    st.head = head;
    st.query = query;
    layerSelect.querySelector("select").value = String(layer);
    headSelect.querySelector("select").value = String(head);
    draw();
  }};
}

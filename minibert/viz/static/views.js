/* minibert views (head, model, neuron): vanilla JS drawing SVG and canvas inside one root element.
   _html.py wraps this file in a function per view, so nothing leaks into the page's globals.
   The page data is {kind, meta, arrays}; arrays are flat and row-major, with the shapes
   attention [L, H, T, S] and q, k [L, T, H, K] (L, H: the layers and heads the view was given,
   in meta.layers and meta.heads). User text reaches the page only
   through textContent and setAttribute, never as markup. */
"use strict";

var SVG_NS = "http://www.w3.org/2000/svg";
var ROW = 22;            // px per token row
var BAR = 7;             // px per head in the weight bars beside a focused token's partners
var LINES_WIDTH = 170;   // px between the query and key columns
var THUMB = 76;          // px, side of a model-view thumbnail
var MIN_WEIGHT = 0.005;  // lines this faint are invisible; skipping them keeps large pages fast
var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
               "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a"];
var POSITIVE = "#1f77b4", NEGATIVE = "#f57f17";  // neuron view: positive blue, negative orange

function boot(script, id) {
  // Jupyter front ends run scripts in different ways; the id finds the root in all of them.
  var root = document.getElementById(id) || (script && script.closest(".mbv"));
  var data = JSON.parse(root.querySelector("script.mbv-data").textContent);
  root.querySelector(".mbv-fallback").remove();
  var body = el("div", {"class": "mbv-body"});
  root.appendChild(body);
  var views = {head: headView, model: modelView, neuron: neuronView};
  views[data.kind](body, data.meta, data.arrays, root);
}

// ---- small helpers ------------------------------------------------------------------------------

function setAttrs(node, attrs) {
  for (var name in attrs) if (attrs[name] != null) node.setAttribute(name, attrs[name]);
  return node;
}

function el(tag, attrs, text) {
  var node = setAttrs(document.createElement(tag), attrs || {});
  if (text != null) node.textContent = text;
  return node;
}

function svg(tag, attrs, text) {
  var node = setAttrs(document.createElementNS(SVG_NS, tag), attrs || {});
  if (text != null) node.textContent = text;
  return node;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

function range(span) {
  var out = [];
  for (var i = span[0]; i < span[1]; i++) out.push(i);
  return out;
}

function inside(i, span) {
  return i >= span[0] && i < span[1];
}

/** An accessor at(i, j, ...) into a flat row-major array of the given shape. */
function tensor(flat, shape) {
  var strides = [], size = 1;
  for (var d = shape.length - 1; d >= 0; d--) { strides[d] = size; size *= shape[d]; }
  if (size !== flat.length) throw new Error("minibert view: " + flat.length + " numbers for shape " + shape);
  return function () {
    var offset = 0;
    for (var d = 0; d < arguments.length; d++) offset += arguments[d] * strides[d];
    return flat[offset];
  };
}

/** Colour of head h (0-indexed) out of n, the same in every view. */
function headColor(h, n) {
  return n <= PALETTE.length ? PALETTE[h] : "hsl(" + Math.round(h * 360 / n) + ",65%,48%)";
}

function isSpecial(token) {
  return /^\[[A-Z]+\]$/.test(token);
}

function textWidth(root, texts) {
  var context = document.createElement("canvas").getContext("2d");
  context.font = "13px " + getComputedStyle(root).fontFamily;
  return Math.max.apply(null, texts.map(function (t) { return context.measureText(t).width; }));
}

/** Select options for layer or head indices: labelled from 1, the 0-indexed number in the tooltip. */
function oneIndexed(indices) {
  return indices.map(function (index, n) { return [n, String(index + 1), "0-indexed: " + index]; });
}

function selectControl(label, options, value, onChange) {
  var select = el("select");
  options.forEach(function (o) { select.appendChild(el("option", {value: o[0], title: o[2]}, o[1])); });
  select.value = String(value);
  select.addEventListener("change", function () { onChange(select.value); });
  var wrap = el("label", null, label);
  wrap.appendChild(select);
  return wrap;
}

/** [value, label, query span, key span] for each sentence filter; only "all" for a single sentence. */
function sentenceFilters(meta) {
  var all = [0, meta.tokens.length], filters = [["all", "All", all, all]];
  if (meta.b_start != null) {
    var a = [0, meta.b_start], b = [meta.b_start, meta.tokens.length];
    filters.push(["AB", "Sentence A \u2192 Sentence B", a, b], ["BA", "Sentence B \u2192 Sentence A", b, a],
                 ["AA", "Sentence A \u2192 Sentence A", a, a], ["BB", "Sentence B \u2192 Sentence B", b, b]);
  }
  return filters;
}

/** A "Attention" select over the sentence filters (nothing for a single sentence). */
function filterControl(filters, onChange) {
  var options = filters.map(function (f) { return [f[0], f[1]]; });
  var wrap = selectControl("Attention", options, "all", function (value) {
    onChange(filters.filter(function (f) { return f[0] === value; })[0]);
  });
  wrap.hidden = filters.length === 1;
  return wrap;
}

function div(cls, text) {
  return el("div", {"class": cls}, text);
}

// ---- token columns joined by attention lines (head view, model view detail, neuron view) --------

/** Queries on the left, keys on the right, one line per (head, query, key) with opacity = weight.
    opts: tokens, bStart, maxHeads (room for weight bars), top (px above row 0), and onPick(i) to make
    a click on a query choose it (neuron view); without onPick, hovering a token shows its lines and
    a click pins it. draw({heads: [{index, color, weight(i, j)}], rows, cols, query}) redraws. */
function tokenLines(root, opts) {
  var tokens = opts.tokens, top = opts.top, pick = Boolean(opts.onPick);
  var textW = Math.ceil(textWidth(root, tokens)) + 12, barsW = opts.maxHeads * BAR + 6;
  var linesL = textW + barsW, linesR = linesL + LINES_WIDTH, keyX = linesR + barsW;
  var width = keyX + textW, height = top + tokens.length * ROW + 4;
  var node = svg("svg", {width: width, height: height, "class": "mbv-lines"});
  var edges = svg("g", {"class": "mbv-edges"}), bars = svg("g", {"class": "mbv-bars"});
  var state = null, focus = null;  // focus: {side: "left" | "right", index, pinned}

  function rowY(i) { return top + i * ROW + ROW / 2; }

  node.appendChild(svg("text", {x: textW - 6, y: top - ROW / 2, "text-anchor": "end", "class": "mbv-colhead"}, "query"));
  node.appendChild(svg("text", {x: keyX + 6, y: top - ROW / 2, "class": "mbv-colhead"}, "key"));
  if (opts.bStart != null) {
    var y = top + opts.bStart * ROW;
    node.appendChild(svg("line", {x1: 0, x2: width, y1: y, y2: y, "class": "mbv-sep"}));
  }
  node.appendChild(edges);
  node.appendChild(bars);

  function tokenNode(side, i) {
    var left = side === "left";
    var g = svg("g", {"class": "mbv-tok" + (isSpecial(tokens[i]) ? " mbv-special" : ""), "data-side": side,
                      "data-i": i, tabindex: pick && !left ? null : 0});
    g.appendChild(svg("rect", {x: left ? 0 : keyX, y: rowY(i) - ROW / 2 + 1, width: textW, height: ROW - 2, rx: 3}));
    g.appendChild(svg("text", {x: left ? textW - 6 : keyX + 6, y: rowY(i), "text-anchor": left ? "end" : "start"},
                      tokens[i]));
    g.addEventListener("mouseenter", function () { hover(side, i); });
    g.addEventListener("mouseleave", function () { if (!pick && focus && !focus.pinned) { focus = null; redraw(); } });
    g.addEventListener("click", function () { press(side, i); });
    g.addEventListener("keydown", function (e) { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); press(side, i); } });
    node.appendChild(g);
    return g;
  }
  var leftNodes = tokens.map(function (_, i) { return tokenNode("left", i); });
  var rightNodes = tokens.map(function (_, i) { return tokenNode("right", i); });

  function span(side) { return side === "left" ? state.rows : state.cols; }

  function hover(side, i) {
    if (pick || (focus && focus.pinned) || !inside(i, span(side))) return;
    focus = {side: side, index: i, pinned: false};
    redraw();
  }

  function press(side, i) {
    if (pick) { if (side === "left") opts.onPick(i); return; }
    if (!inside(i, span(side))) return;
    var same = focus && focus.side === side && focus.index === i;
    focus = {side: side, index: i, pinned: !(same && focus.pinned)};
    redraw();
  }

  function current() {
    if (state.query != null) return {side: "left", index: state.query};
    if (focus && !inside(focus.index, span(focus.side))) focus = null;  // filtered out since
    return focus;
  }

  function markTokens(nodes, side, f) {
    nodes.forEach(function (g, i) {
      g.classList.toggle("mbv-dim", !inside(i, span(side)));
      g.classList.toggle("mbv-focus", Boolean(f) && f.side === side && f.index === i);
    });
  }

  function drawEdges(f) {
    var fragment = document.createDocumentFragment();
    state.heads.forEach(function (head) {
      range(state.rows).forEach(function (i) {
        if (f && f.side === "left" && i !== f.index) return;
        range(state.cols).forEach(function (j) {
          if (f && f.side === "right" && j !== f.index) return;
          var w = head.weight(i, j);
          if (w < MIN_WEIGHT) return;
          fragment.appendChild(svg("line", {x1: linesL, y1: rowY(i), x2: linesR, y2: rowY(j), stroke: head.color,
                                            "stroke-opacity": w, "stroke-width": 2, "data-h": head.index,
                                            "data-i": i, "data-j": j}));
        });
      });
    });
    edges.appendChild(fragment);
  }

  /** Beside each partner of the focused token, one bar per head with opacity = weight. */
  function drawBars(f) {
    var fromLeft = f.side === "left", x0 = fromLeft ? linesR + 3 : textW + 3;
    range(fromLeft ? state.cols : state.rows).forEach(function (other) {
      state.heads.forEach(function (head, n) {
        var w = fromLeft ? head.weight(f.index, other) : head.weight(other, f.index);
        var bar = svg("rect", {x: x0 + n * BAR, y: rowY(other) - ROW / 2 + 4, width: BAR - 1, height: ROW - 8,
                               fill: head.color, "fill-opacity": Math.max(w, 0.04), "class": "mbv-bar"});
        bar.appendChild(svg("title", null, "head " + (head.index + 1) + ": " + w.toFixed(3)));
        bars.appendChild(bar);
      });
    });
  }

  function redraw() {
    var f = current();
    clear(edges);
    clear(bars);
    markTokens(leftNodes, "left", f);
    markTokens(rightNodes, "right", f);
    drawEdges(f);
    if (f) drawBars(f);
  }

  return {node: node, draw: function (s) { state = s; redraw(); }};
}

function scroller(child) {
  var wrap = div("mbv-scroll");
  wrap.appendChild(child);
  return wrap;
}

// ---- head view ----------------------------------------------------------------------------------

/** Toggle buttons, one per head in its colour (double-click: only that head), plus "all" and "none". */
function headSwatches(meta, active, onChange) {
  var wrap = el("span", {"class": "mbv-swatches", role: "group", "aria-label": "heads"});
  var buttons = meta.heads.map(function (h, n) {
    var b = el("button", {type: "button", "class": "mbv-swatch", style: "--c:" + headColor(h, meta.n_heads),
                          title: "head " + (h + 1) + " (0-indexed: " + h + "); double-click: only this head"},
               String(h + 1));
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
  return {node: wrap, update: function () {
    buttons.forEach(function (b, n) { b.setAttribute("aria-pressed", String(active[n])); });
  }};
}

function headView(body, meta, arrays, root) {
  var T = meta.tokens.length, H = meta.heads.length;
  var at = tensor(arrays.attention, [meta.layers.length, H, T, T]);
  var filters = sentenceFilters(meta);
  var st = {layer: meta.layer, active: meta.active.slice(), filter: filters[0]};
  var lines = tokenLines(root, {tokens: meta.tokens, bStart: meta.b_start, maxHeads: H, top: ROW});
  var swatches = headSwatches(meta, st.active, draw);
  var controls = div("mbv-controls");
  controls.appendChild(selectControl("Layer", oneIndexed(meta.layers),
                                     st.layer, function (v) { st.layer = Number(v); draw(); }));
  controls.appendChild(filterControl(filters, function (f) { st.filter = f; draw(); }));
  controls.appendChild(swatches.node);
  body.appendChild(controls);
  body.appendChild(div("mbv-help", "Hover a token to see only its attention; click to pin it. Layers and heads " +
                                   "are numbered from 1 here, as in Clark et al.; tooltips give the 0-indexed number."));
  body.appendChild(scroller(lines.node));

  function draw() {
    swatches.update();
    var heads = [];
    meta.heads.forEach(function (h, n) {
      if (st.active[n]) heads.push({index: h, color: headColor(h, meta.n_heads),
                                    weight: function (i, j) { return at(st.layer, n, i, j); }});
    });
    lines.draw({rows: st.filter[2], cols: st.filter[3], heads: heads});
  }
  draw();
}

// ---- model view ---------------------------------------------------------------------------------

/** One head's pattern on a canvas: bertviz-style lines, or a query × key heat map. */
function drawThumbnail(canvas, weight, color, filter, mode, T) {
  var ratio = window.devicePixelRatio || 1, context = canvas.getContext("2d");
  canvas.width = canvas.height = Math.round(THUMB * ratio);
  context.setTransform(ratio, 0, 0, ratio, 0, 0);
  context.clearRect(0, 0, THUMB, THUMB);
  context.fillStyle = context.strokeStyle = color;
  var step = (THUMB - 8) / T;
  range(filter[2]).forEach(function (i) {
    range(filter[3]).forEach(function (j) {
      var w = weight(i, j);
      if (w < MIN_WEIGHT) return;
      context.globalAlpha = Math.min(w, 1);
      if (mode === "matrix") {
        context.fillRect(4 + j * step, 4 + i * step, Math.max(step, 1), Math.max(step, 1));
      } else {
        context.beginPath();
        context.moveTo(THUMB * 0.2, 4 + (i + 0.5) * step);
        context.lineTo(THUMB * 0.8, 4 + (j + 0.5) * step);
        context.stroke();
      }
    });
  });
  context.globalAlpha = 1;
}

function modelView(body, meta, arrays, root) {
  var T = meta.tokens.length, L = meta.layers.length, H = meta.heads.length;
  var at = tensor(arrays.attention, [L, H, T, T]);
  var filters = sentenceFilters(meta);
  var st = {filter: filters[0], mode: meta.thumbnail, open: null};
  var controls = div("mbv-controls");
  controls.appendChild(filterControl(filters, function (f) { st.filter = f; draw(); }));
  controls.appendChild(selectControl("Thumbnails", [["lines", "lines"], ["matrix", "query \u00d7 key matrix"]], st.mode,
                                     function (v) { st.mode = v; draw(); }));
  body.appendChild(controls);
  body.appendChild(div("mbv-help", "Rows are layers, columns heads, numbered from 1 (tooltips give the 0-indexed " +
                                   "numbers). Click a thumbnail to enlarge it; Escape closes."));

  var stage = div("mbv-stage"), grid = div("mbv-grid");
  grid.style.gridTemplateColumns = "auto repeat(" + H + ", " + (THUMB + 2) + "px)";
  grid.appendChild(div("mbv-axis"));
  meta.heads.forEach(function (h) { grid.appendChild(el("div", {"class": "mbv-axis", title: "0-indexed: " + h}, "Head " + (h + 1))); });
  var thumbs = [];
  meta.layers.forEach(function (l, a) {
    grid.appendChild(el("div", {"class": "mbv-axis mbv-rowlab", title: "0-indexed: " + l}, "Layer " + (l + 1)));
    meta.heads.forEach(function (h, b) {
      var canvas = el("canvas", {"class": "mbv-thumb", tabindex: 0, role: "button", "data-layer": l, "data-head": h,
                                 title: "Layer " + (l + 1) + ", head " + (h + 1) + " (0-indexed: " + l + ", " + h +
                                        "): click to enlarge"});
      canvas.style.width = canvas.style.height = THUMB + "px";
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
  var lines = tokenLines(root, {tokens: meta.tokens, bStart: meta.b_start, maxHeads: 1, top: ROW});
  detail.appendChild(lines.node);
  detail.hidden = true;
  close.addEventListener("click", function () { open(null); });
  root.addEventListener("keydown", function (e) { if (e.key === "Escape" && st.open) open(null); });
  stage.appendChild(grid);
  stage.appendChild(detail);
  body.appendChild(scroller(stage));

  function weight(a, b) { return function (i, j) { return at(a, b, i, j); }; }

  function open(a, b) {
    st.open = a == null ? null : [a, b];
    draw();
  }

  function draw() {
    thumbs.forEach(function (t) {
      drawThumbnail(t.canvas, weight(t.a, t.b), headColor(meta.heads[t.b], meta.n_heads), st.filter, st.mode, T);
      t.canvas.classList.toggle("mbv-selected", Boolean(st.open) && st.open[0] === t.a && st.open[1] === t.b);
    });
    detail.hidden = !st.open;
    stage.style.minHeight = "";
    if (!st.open) return;
    var l = meta.layers[st.open[0]], h = meta.heads[st.open[1]];
    heading.textContent = "Layer " + (l + 1) + " \u00b7 Head " + (h + 1) + "  (0-indexed: layer " + l + ", head " + h + ")";
    lines.draw({rows: st.filter[2], cols: st.filter[3],
                heads: [{index: h, color: headColor(h, meta.n_heads), weight: weight(st.open[0], st.open[1])}]});
    stage.style.minHeight = detail.offsetHeight + "px";  // the panel floats over the grid; keep it unclipped
  }
  draw();
}

// ---- neuron view --------------------------------------------------------------------------------

/** Fill colour and opacity for a signed value: blue positive, orange negative, opacity |v| / scale. */
function signed(value, scale) {
  return {fill: value >= 0 ? POSITIVE : NEGATIVE, "fill-opacity": scale > 0 ? Math.min(Math.abs(value) / scale, 1) : 0};
}

function maxAbs(values) {
  return values.reduce(function (m, v) { return Math.max(m, Math.abs(v)); }, 0);
}

function neuronView(body, meta, arrays, root) {
  var T = meta.tokens.length, L = meta.layers.length, H = meta.heads.length, K = meta.d_head;
  var q = tensor(arrays.q, [L, T, H, K]), k = tensor(arrays.k, [L, T, H, K]);
  var attention = tensor(arrays.attention, [L, H, T, T]);
  var st = {layer: meta.layer, head: meta.head, query: meta.query};
  var controls = div("mbv-controls");
  controls.appendChild(selectControl("Layer", oneIndexed(meta.layers),
                                     st.layer, function (v) { st.layer = Number(v); draw(); }));
  controls.appendChild(selectControl("Head", oneIndexed(meta.heads),
                                     st.head, function (v) { st.head = Number(v); draw(); }));
  body.appendChild(controls);
  var status = div("mbv-sub"), readout = div("mbv-readout");
  body.appendChild(status);
  if (meta.mismatch != null) {
    body.appendChild(div("mbv-warn", "softmax(q\u00b7k/\u221ad) computed from q and k differs from the model's attention " +
                                     "by up to " + meta.mismatch.toPrecision(3) + "; the softmax column shows the model's attention."));
  }
  body.appendChild(div("mbv-help", "Click a query token on the left. Blue: positive, orange: negative, stronger colour: " +
                                   "larger magnitude. Layers and heads are numbered from 1; tooltips give the 0-indexed number."));
  var lines = tokenLines(root, {tokens: meta.tokens, bStart: meta.b_start, maxHeads: 1, top: 2 * ROW,
                                onPick: function (i) { st.query = i; draw(); }});
  var cell = Math.max(2, Math.min(6, Math.floor(192 / K))), vectorW = K * cell;
  var x = {label: 4, k: 18, qk: 18 + vectorW + 16};
  x.dot = x.qk + vectorW + 16;
  x.scaled = x.dot + 74;
  x.bar = x.scaled + 80;
  x.softmax = x.bar + 40;
  var table = svg("svg", {width: x.softmax + 72, height: 2 * ROW + T * ROW + 4, "class": "mbv-neuron"});
  var stage = div("mbv-neuron-stage");
  stage.appendChild(lines.node);
  stage.appendChild(table);
  body.appendChild(scroller(stage));
  body.appendChild(readout);
  table.addEventListener("mouseover", function (e) {
    var tipped = e.target.closest("[data-tip]");
    readout.textContent = tipped ? tipped.getAttribute("data-tip") : "";
  });

  function rowTop(j) { return 2 * ROW + j * ROW; }

  function vectorCells(values, scale, x0, y, describe) {
    values.forEach(function (v, d) {
      table.appendChild(svg("rect", Object.assign({x: x0 + d * cell, y: y + 3, width: cell - (cell > 3 ? 1 : 0), height: ROW - 6,
                                              "data-tip": describe(d, v)}, signed(v, scale))));
    });
  }

  function number(column, j, value, text, background, tip) {
    var x0 = x[column];
    if (background) table.appendChild(svg("rect", Object.assign({x: x0, y: rowTop(j) + 2, width: 66, height: ROW - 4, rx: 3}, background)));
    table.appendChild(svg("text", {x: x0 + 62, y: rowTop(j) + ROW / 2, "text-anchor": "end", "class": "mbv-num",
                                   "data-col": column, "data-key": j, "data-value": value, "data-tip": tip}, text));
  }

  function header(text, x0, anchor) {
    table.appendChild(svg("text", {x: x0, y: ROW / 2, "class": "mbv-colhead", "text-anchor": anchor || "start"}, text));
  }

  function draw() {
    var l = st.layer, h = st.head, i = st.query, dims = range([0, K]), keys = range([0, T]);
    var vectors = function (of) { return keys.map(function (j) { return dims.map(function (d) { return of(l, j, h, d); }); }); };
    var flat = function (rows) { return [].concat.apply([], rows); };
    var qs = vectors(q), kv = vectors(k), qv = qs[i];
    var products = kv.map(function (row) { return row.map(function (v, d) { return qv[d] * v; }); });
    var dots = products.map(function (row) { return row.reduce(function (sum, v) { return sum + v; }, 0); });
    // q and k cells share one scale per vector kind over all tokens, so queries compare with each other.
    var qScale = maxAbs(flat(qs)), kScale = maxAbs(flat(kv)), productScale = maxAbs(flat(products));
    var dotScale = maxAbs(dots), sqrtK = Math.sqrt(K);
    var token = function (j) { return "\u201c" + meta.tokens[j] + "\u201d"; };

    lines.draw({rows: [0, T], cols: [0, T], query: i, heads: [{index: meta.heads[h], color: headColor(meta.heads[h], meta.n_heads),
                                                               weight: function (a, b) { return attention(l, h, a, b); }}]});
    status.textContent = "Query " + token(i) + " (position " + i + ", 0-indexed) \u00b7 layer " + (meta.layers[l] + 1) +
                         ", head " + (meta.heads[h] + 1) + " \u00b7 d = " + K;
    clear(table);
    header("k", x.k);
    header("q \u00d7 k", x.qk);
    header("q\u00b7k", x.dot + 62, "end");
    header("q\u00b7k/\u221a" + K, x.scaled + 62, "end");
    header("softmax", x.bar);
    table.appendChild(svg("text", {x: x.label, y: ROW * 1.5, "class": "mbv-colhead"}, "q"));
    vectorCells(qv, qScale, x.k, ROW, function (d, v) { return "q[" + d + "] of " + token(i) + " = " + v; });
    keys.forEach(function (j) {
      vectorCells(kv[j], kScale, x.k, rowTop(j), function (d, v) { return "k[" + d + "] of " + token(j) + " = " + v; });
      vectorCells(products[j], productScale, x.qk, rowTop(j), function (d, v) {
        return "q[" + d + "] \u00d7 k[" + d + "] = " + qv[d] + " \u00d7 " + kv[j][d] + " = " + v.toPrecision(4);
      });
      var p = attention(l, h, i, j);
      number("dot", j, dots[j], dots[j].toFixed(2), signed(dots[j], dotScale),
             "q\u00b7k for key " + token(j) + " = " + dots[j]);
      number("scaled", j, dots[j] / sqrtK, (dots[j] / sqrtK).toFixed(2), signed(dots[j], dotScale),
             "q\u00b7k/\u221a" + K + " for key " + token(j) + " = " + dots[j] / sqrtK);
      table.appendChild(svg("rect", {x: x.bar, y: rowTop(j) + 4, width: Math.max(60 * p, 0.5), height: ROW - 8,
                                     fill: POSITIVE, "class": "mbv-bar"}));
      number("softmax", j, p, p.toFixed(3), null, "softmax for key " + token(j) + " = " + p);
    });
  }
  draw();
}

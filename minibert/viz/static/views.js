/* minibert views (head, model, neuron): vanilla JS drawing SVG and canvas inside one root element.
   _html.py wraps this file in a function per view, so nothing leaks into the page's globals.
   The page data is {kind, meta, arrays}; each array is packed per layer (see _html.py):
   {packing: "unit_byte" | "float32", shape: the shape of one layer, layers: [base64 of zlib bytes]},
   with the layer shapes attention [H, T, S] and q, k [T, H, K] (the layers and heads the view was
   given, in meta.layers and meta.heads). A layer is inflated when it is first shown; while any is,
   the root has aria-busy="true". User text reaches the page only through textContent and
   setAttribute, never as markup. */
"use strict";

var SVG_NS = "http://www.w3.org/2000/svg";
var ROW = 22;            // px per token row
var BAR = 7;             // px per head in the weight bars beside a focused token's partners
var LINES_WIDTH = 170;   // px between the query and key columns
var THUMB = 76;          // px, side of a model-view thumbnail
var MIN_WEIGHT = 0.005;  // lines this faint are invisible; skipping them keeps large pages fast
var MAX_CANVAS = 32000;  // px, below every browser's limit on a canvas side
var STROKE_COST = 6;     // a pixel of a canvas stroke costs ~6 of linesImage's (headless chromium, no GPU)
var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
               "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a"];
var POSITIVE = "#1f77b4", NEGATIVE = "#f57f17";  // neuron view: positive blue, negative orange

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
                                                           ablated: page.ablated || []}) || {select: function () {}};
}

/** Whether (layer, head) is among the ablated [[layer, head], …]. */
function isAblated(ablated, layer, head) {
  return ablated.some(function (pair) { return pair[0] === layer && pair[1] === head; });
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

/** Colour of head h (0-indexed) out of n, the same in every view. */
function headColor(h, n) {
  return n <= PALETTE.length ? PALETTE[h] : "hsl(" + Math.round(h * 360 / n) + ",65%,48%)";
}

function isSpecial(token) {
  return /^\[[A-Z]+\]$/.test(token);
}

var FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Liberation Sans", "DejaVu Sans", ' +
           "sans-serif";  // views.css's .mbv font: what a root not yet on the page will be drawn in

/** The widest of `texts` as the view's SVG draws them (13 px; its font, or views.css's while root is off the
    page and has none), with a pixel to spare for rounding. */
function textWidth(root, texts) {
  var context = document.createElement("canvas").getContext("2d");
  context.font = (root.classList.contains("mbv-large") ? 16 : 13) + "px " +
                 (root.isConnected && getComputedStyle(root).fontFamily || FONT);
  return texts.reduce(function (m, t) { return Math.max(m, context.measureText(t).width); }, 0) + 1;
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

function scroller(child) {
  var wrap = div("mbv-scroll");
  wrap.appendChild(child);
  return wrap;
}

// ---- packed arrays, inflated per layer on demand -------------------------------------------------

function base64Bytes(text) {
  if (Uint8Array.fromBase64) return Uint8Array.fromBase64(text);
  var binary = atob(text), bytes = new Uint8Array(binary.length);
  for (var i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

function inflate(bytes) {
  return new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"))).arrayBuffer();
}

/** float32 values from their 4 byte planes (little-endian, as _html.py wrote them). */
function fromPlanes(planes) {
  var n = planes.length / 4, bytes = new Uint8Array(planes.length);
  for (var b = 0; b < 4; b++) for (var i = 0; i < n; i++) bytes[4 * i + b] = planes[b * n + i];
  return new Float32Array(bytes.buffer);
}

/** One packed array: layer(l) is a promise of layer l's flat values (inflated once), here[l] those
    already inflated. Values: a Uint8Array of round(255·v) for "unit_byte" (read v as byte / 255),
    a Float32Array for "float32"; `scale` turns a stored value into the value. */
function packedArray(packed) {
  var size = packed.shape.reduce(function (a, b) { return a * b; }, 1);
  var bytesPerValue = packed.packing === "float32" ? 4 : 1, promises = [], here = [];
  function layer(l) {
    if (!promises[l]) {
      promises[l] = inflate(base64Bytes(packed.layers[l])).then(function (buffer) {
        var bytes = new Uint8Array(buffer);
        if (bytes.length !== size * bytesPerValue) {
          throw new Error("minibert view: layer " + l + " holds " + bytes.length + " bytes, not " + size * bytesPerValue);
        }
        here[l] = bytesPerValue === 4 ? fromPlanes(bytes) : bytes;
        return here[l];
      });
    }
    return promises[l];
  }
  return {layer: layer, here: here, shape: packed.shape, scale: bytesPerValue === 4 ? 1 : 1 / 255};
}

/** Work in flight on a root: aria-busy="true" until every queued promise and frame has finished. */
function busyTracker(root, body) {
  var pending = 0;
  root.setAttribute("aria-busy", "false");
  function start() { pending += 1; root.setAttribute("aria-busy", "true"); }
  function end() { pending -= 1; if (pending === 0) root.setAttribute("aria-busy", "false"); }
  function fail(error) {
    body.appendChild(div("mbv-warn", "This view could not be drawn: " + error.message));
    throw error;
  }
  return {
    /** Run then() once promise resolves. */
    after: function (promise, then) {
      start();
      promise.then(then).catch(fail).finally(end);
    },
    /** A function that runs paint() at the next animation frame, once however often it is called. */
    frame: function (paint) {
      var queued = false;
      return function () {
        if (queued) return;
        queued = true;
        start();
        requestAnimationFrame(function () {
          queued = false;
          try { paint(); } finally { end(); }
        });
      };
    }
  };
}

// ---- pictures: the current drawing as a standalone SVG, and as a PNG ----------------------------

var PAINT = ["fill", "fill-opacity", "stroke", "stroke-opacity", "stroke-width", "stroke-dasharray", "opacity",
             "font-family", "font-size", "font-weight", "font-variant-numeric", "letter-spacing",
             "dominant-baseline", "text-anchor"];

/** A copy of an SVG drawing that looks the same outside the page: computed styles become inline styles. */
function standalone(node) {
  var copy = node.cloneNode(true), from = [node].concat(Array.from(node.querySelectorAll("*")));
  var to = [copy].concat(Array.from(copy.querySelectorAll("*")));
  from.forEach(function (original, n) {
    var style = getComputedStyle(original);
    to[n].setAttribute("style", PAINT.map(function (p) { return p + ":" + style.getPropertyValue(p); }).join(";"));
  });
  return copy;
}

/** {node, width, height}: one SVG holding the parts [{node, x, y}] on the view's background colour. */
function picture(root, parts, width, height) {
  var node = svg("svg", {width: width, height: height, viewBox: "0 0 " + width + " " + height});
  node.appendChild(svg("rect", {width: width, height: height, fill: getComputedStyle(root).backgroundColor}));
  parts.forEach(function (part) { node.appendChild(setAttrs(part.node, {x: part.x, y: part.y})); });
  return {node: node, width: width, height: height};
}

function pngBlob(text, width, height) {
  return new Promise(function (resolve, reject) {
    var image = new Image(), url = URL.createObjectURL(new Blob([text], {type: "image/svg+xml"}));
    image.onload = function () {
      var ratio = Math.min(window.devicePixelRatio || 1, MAX_CANVAS / Math.max(width, height));
      var canvas = el("canvas", {width: Math.round(width * ratio), height: Math.round(height * ratio)});
      var context = canvas.getContext("2d");
      context.scale(ratio, ratio);
      context.drawImage(image, 0, 0, width, height);
      URL.revokeObjectURL(url);
      canvas.toBlob(resolve, "image/png");
    };
    image.onerror = function () { URL.revokeObjectURL(url); reject(new Error("the picture could not be drawn")); };
    image.src = url;
  });
}

function save(root, blob, filename) {
  var url = URL.createObjectURL(blob), link = el("a", {href: url, download: filename});
  link.hidden = true;
  root.appendChild(link);
  link.click();
  link.remove();
  setTimeout(function () { URL.revokeObjectURL(url); }, 60000);
}

/** "Download PNG | SVG" buttons saving what current() returns ({node, width, height}), drawn now. */
function downloadControl(root, busy, name, current) {
  var wrap = el("span", {"class": "mbv-download"}, "Download");
  ["png", "svg"].forEach(function (format) {
    var button = el("button", {type: "button", "class": "mbv-link", "data-format": format,
                               title: "save the current drawing as " + format.toUpperCase()}, format.toUpperCase());
    button.addEventListener("click", function () {
      var shown = current(), text = new XMLSerializer().serializeToString(shown.node);
      var filename = "minibert-" + name + "." + format;
      if (format === "svg") save(root, new Blob([text], {type: "image/svg+xml"}), filename);
      else busy.after(pngBlob(text, shown.width, shown.height), function (blob) { save(root, blob, filename); });
    });
    wrap.appendChild(button);
  });
  return wrap;
}

// ---- many faint lines, rasterised in a few passes ------------------------------------------------

/** "#rrggbb" of any CSS colour as [r, g, b] (a canvas normalises what it is given). */
function rgb(color) {
  var context = document.createElement("canvas").getContext("2d");
  context.fillStyle = color;
  var hex = context.fillStyle;
  return [1, 3, 5].map(function (at) { return parseInt(hex.slice(at, at + 2), 16); });
}

/** Add one line from (0, y0) to (width, y1), opacity w, to a row-major difference array of
    −log(1 − α): a prefix sum down each column then gives −log of the light every line let through.
    span: [top, bottom] rows touched so far, widened to this line's. */
function addLine(density, width, height, y0, y1, w, lineWidth, span) {
  var slope = (y1 - y0) / width, half = lineWidth / 2 * Math.sqrt(1 + slope * slope);
  // Spread over the span the stroke touches in a column, its area there gives this mean coverage.
  var cover = 2 * half / (Math.abs(slope) + 2 * half), d = -Math.log(1 - Math.min(w * cover, 0.999));
  span[0] = Math.min(span[0], Math.max(Math.floor(Math.min(y0, y1) - Math.abs(slope) - half), 0));
  span[1] = Math.max(span[1], Math.min(Math.floor(Math.max(y0, y1) + Math.abs(slope) + half) + 2, height + 1));
  for (var x = 0; x < width; x++) {
    var a = y0 + slope * x, b = a + slope;
    var lo = Math.max(Math.min(a, b) - half, 0), hi = Math.min(Math.max(a, b) + half, height);
    if (hi <= lo) continue;
    var il = Math.floor(lo), ih = Math.floor(hi), fl = lo - il, fh = hi - ih;
    density[il * width + x] += d * (1 - fl);
    density[(il + 1) * width + x] += d * fl;
    density[ih * width + x] -= d * (1 - fh);
    density[(ih + 1) * width + x] -= d * fh;
  }
}

/** Paint one colour over rows [span[0], span[1]) of the image where the prefix sums of density
    say its lines cover; density is cleared on the way (up to span[2]), ready for the next colour. */
function composite(density, width, span, color, data) {
  var run = new Float64Array(width);
  density.fill(0, span[1] * width, span[2] * width);  // the rows below the image only close spans
  for (var y = span[0]; y < span[1]; y++) {
    for (var x = 0, at = y * width; x < width; x++, at++) {
      run[x] += density[at];
      density[at] = 0;
      if (run[x] < 1e-5) continue;  // below what a byte of opacity shows; also float residue of the sums
      var alpha = 1 - Math.exp(-run[x]), p = 4 * at, below = data[p + 3] / 255 * (1 - alpha), total = alpha + below;
      data[p] = (color[0] * alpha + data[p] * below) / total;
      data[p + 1] = (color[1] * alpha + data[p + 1] * below) / total;
      data[p + 2] = (color[2] * alpha + data[p + 2] * below) / total;
      data[p + 3] = 255 * total;
    }
  }
}

/** An ImageData of lines from x = 0 to x = width, one group after another, each group's lines
    [y0, y1, w] in its colour with opacity w. Canvas strokes cost each line's length in pixels
    (10⁵ lines of 10³ px take seconds without a GPU); here a line costs `width` steps however
    long it is, and the lines of one colour overlap exactly as strokes do: 1 − Π(1 − αₖ).
    groups: [{color: [r, g, b], lines: [[y0, y1, w], ...]}]. */
function linesImage(width, height, groups, lineWidth) {
  var density = new Float32Array(width * (height + 2)), image = new ImageData(width, height);
  groups.forEach(function (group) {
    var span = [height, 0];
    group.lines.forEach(function (l) { addLine(density, width, height, l[0], l[1], l[2], lineWidth, span); });
    composite(density, width, [span[0], Math.min(span[1], height), span[1] + 1], group.color, image.data);
  });
  return image;
}

// ---- token columns joined by attention lines (head view, model view detail, neuron view) --------

/** Queries on the left, keys on the right, one line per (head, query, key) with opacity = weight,
    drawn on a canvas (a page of 512 tokens has ~10⁵ lines); the lines drawn last are node.mbvDrawn,
    [head, query, key, weight] each, which the SVG download redraws as <line>s.
    opts: tokens, bStart, maxHeads (room for weight bars), top (px above row 0), and onPick(i) to make
    a click on a query choose it (neuron view); without onPick, hovering a token shows its lines and
    a click pins it. draw({heads: [{index, color, weight(i, j)}], rows, cols, query}) redraws at the
    next frame. */
function tokenLines(root, busy, opts) {
  var tokens = opts.tokens, top = opts.top, pick = Boolean(opts.onPick);
  var textW = Math.ceil(textWidth(root, tokens)) + 12, barsW = opts.maxHeads * BAR + 6;
  var linesL = textW + barsW, linesR = linesL + LINES_WIDTH, keyX = linesR + barsW;
  var width = keyX + textW, height = top + tokens.length * ROW + 4;
  var box = div("mbv-linesbox");
  var node = svg("svg", {width: width, height: height, "class": "mbv-lines"});
  // One canvas pixel per CSS pixel: the lines are rasterised here (linesImage), at a cost per pixel.
  var canvas = el("canvas", {"class": "mbv-edges", width: LINES_WIDTH, height: height});
  canvas.style.left = linesL + "px";
  canvas.style.width = LINES_WIDTH + "px";
  canvas.style.height = height + "px";
  var context = canvas.getContext("2d");
  var bars = svg("g", {"class": "mbv-bars"});
  var state = null, focus = null;  // focus: {side: "left" | "right", index, pinned}
  box.appendChild(node);
  box.appendChild(canvas);
  box.mbvDrawn = [];

  function rowY(i) { return top + i * ROW + ROW / 2; }

  node.appendChild(svg("text", {x: textW - 6, y: top - ROW / 2, "text-anchor": "end", "class": "mbv-colhead"}, "query"));
  node.appendChild(svg("text", {x: keyX + 6, y: top - ROW / 2, "class": "mbv-colhead"}, "key"));
  if (opts.bStart != null) {
    var y = top + opts.bStart * ROW;
    node.appendChild(svg("line", {x1: 0, x2: width, y1: y, y2: y, "class": "mbv-sep"}));
  }
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
    if (pick || !state || (focus && focus.pinned) || !inside(i, span(side))) return;
    focus = {side: side, index: i, pinned: false};
    redraw();
  }

  function press(side, i) {
    if (pick) { if (side === "left") opts.onPick(i); return; }
    if (!state || !inside(i, span(side))) return;
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

  /** [head, query, key, weight] of every line to draw: the focused token's, or all in the filter. */
  function visibleEdges(f) {
    var rows = f && f.side === "left" ? [f.index, f.index + 1] : state.rows;
    var cols = f && f.side === "right" ? [f.index, f.index + 1] : state.cols, drawn = [];
    state.heads.forEach(function (head) {
      for (var i = rows[0]; i < rows[1]; i++) {
        for (var j = cols[0]; j < cols[1]; j++) {
          var w = head.weight(i, j);
          if (w >= MIN_WEIGHT) drawn.push([head.index, i, j, w]);
        }
      }
    });
    return drawn;
  }

  /** The lines, head after head in the order of state.heads: stroked one by one when they cover
      few pixels (a token's own lines), else rasterised by linesImage, whose cost is the area. */
  function paintEdges(drawn) {
    var stroked = drawn.reduce(function (sum, e) { return sum + Math.abs(rowY(e[2]) - rowY(e[1])) + LINES_WIDTH; }, 0);
    if (stroked * STROKE_COST < state.heads.length * LINES_WIDTH * height) {
      var colors = headColors();
      context.clearRect(0, 0, canvas.width, canvas.height);
      context.lineWidth = 2;
      drawn.forEach(function (e) {
        context.strokeStyle = colors[e[0]];
        context.globalAlpha = Math.min(e[3], 1);
        context.beginPath();
        context.moveTo(0, rowY(e[1]));
        context.lineTo(LINES_WIDTH, rowY(e[2]));
        context.stroke();
      });
      context.globalAlpha = 1;
      return;
    }
    var groups = {};
    state.heads.forEach(function (head) { groups[head.index] = {color: rgb(head.color), lines: []}; });
    drawn.forEach(function (e) { groups[e[0]].lines.push([rowY(e[1]), rowY(e[2]), e[3]]); });
    var image = linesImage(LINES_WIDTH, height, state.heads.map(function (head) { return groups[head.index]; }), 2);
    context.putImageData(image, 0, 0);
  }

  /** Beside each partner of the focused token, one bar per head with opacity = weight, where a line is drawn. */
  function drawBars(f) {
    var fromLeft = f.side === "left", x0 = fromLeft ? linesR + 3 : textW + 3;
    var fragment = document.createDocumentFragment();
    range(fromLeft ? state.cols : state.rows).forEach(function (other) {
      state.heads.forEach(function (head, n) {
        var w = fromLeft ? head.weight(f.index, other) : head.weight(other, f.index);
        if (w < MIN_WEIGHT) return;  // 12 heads × 512 tokens of empty bars made each hover slow
        var bar = svg("rect", {x: x0 + n * BAR, y: rowY(other) - ROW / 2 + 4, width: BAR - 1, height: ROW - 8,
                               fill: head.color, "fill-opacity": Math.max(w, 0.04), "class": "mbv-bar"});
        bar.appendChild(svg("title", null, "head " + (head.index + 1) + ": " + w.toFixed(3)));
        fragment.appendChild(bar);
      });
    });
    bars.appendChild(fragment);
  }

  var redraw = busy.frame(function () {
    var f = current();
    clear(bars);
    markTokens(leftNodes, "left", f);
    markTokens(rightNodes, "right", f);
    box.mbvDrawn = visibleEdges(f);
    paintEdges(box.mbvDrawn);
    if (f) drawBars(f);
  });

  /** The drawing as a standalone SVG element: tokens, bars, and the lines as <line>s. */
  function svgCopy() {
    var copy = standalone(node), edges = svg("g", {"class": "mbv-edges", "stroke-width": 2}), colors = headColors();
    box.mbvDrawn.forEach(function (e) {
      edges.appendChild(svg("line", {x1: linesL, y1: rowY(e[1]), x2: linesR, y2: rowY(e[2]), "data-h": e[0],
                                     "data-i": e[1], "data-j": e[2], stroke: colors[e[0]], "stroke-opacity": e[3]}));
    });
    copy.insertBefore(edges, copy.querySelector(".mbv-bars"));
    return copy;
  }

  function headColors() {
    var colors = {};
    state.heads.forEach(function (head) { colors[head.index] = head.color; });
    return colors;
  }

  return {node: box, width: width, height: height, svg: svgCopy,
          draw: function (s) { state = s; redraw(); }};
}

// ---- head view ----------------------------------------------------------------------------------

/** Toggle buttons, one per head in its colour (double-click: only that head), plus "all" and "none". */
function headSwatches(meta, active, onChange, ablated) {
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
  var swatches = headSwatches(meta, st.active, draw, page.ablated);
  var controls = div("mbv-controls");
  var layerSelect = selectControl("Layer", oneIndexed(meta.layers), st.layer, function (v) {
    st.layer = Number(v);
    draw();
    page.onSelect({layer: meta.layers[st.layer]});
  });
  controls.appendChild(layerSelect);
  controls.appendChild(filterControl(filters, function (f) { st.filter = f; draw(); }));
  controls.appendChild(swatches.node);
  controls.appendChild(downloadControl(root, busy, "head-view", function () {
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
      if (st.active[n]) heads.push({index: h, color: headColor(h, meta.n_heads), weight: headWeight(values, attention.scale, n, T)});
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

/** The index into meta.layers of the model's layer `layer` (0-indexed), or `otherwise` where the view lacks it. */
function layerAt(meta, layer, otherwise) {
  var at = meta.layers.indexOf(layer);
  return at >= 0 ? at : otherwise;
}

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
  body.appendChild(div("mbv-help", "Rows are layers, columns heads, numbered from 1 (tooltips give the 0-indexed " +
                                   "numbers). Click a thumbnail to enlarge it; Escape closes. Download saves the " +
                                   "grid, or the enlarged head when one is open."));

  // Thumbnails as large as THUMB, smaller where every head of a row must fit the width the view is given (two
  // models or before / after side by side on a 1366-px screen): no head is cut off.
  var room = root.parentNode && root.parentNode.clientWidth ? root.parentNode.clientWidth - 110 : Infinity;
  var size = Math.max(28, Math.min(THUMB, Math.floor(room / meta.heads.length) - 6));
  var stage = div("mbv-stage"), grid = div("mbv-grid");
  grid.style.gridTemplateColumns = "auto repeat(" + meta.heads.length + ", " + (size + 2) + "px)";
  grid.appendChild(div("mbv-axis"));
  meta.heads.forEach(function (h) { grid.appendChild(el("div", {"class": "mbv-axis", title: "0-indexed: " + h}, "Head " + (h + 1))); });
  var thumbs = [];
  meta.layers.forEach(function (l, a) {
    grid.appendChild(el("div", {"class": "mbv-axis mbv-rowlab", title: "0-indexed: " + l}, "Layer " + (l + 1)));
    meta.heads.forEach(function (h, b) {
      var off = isAblated(page.ablated, l, h);
      var canvas = el("canvas", {"class": "mbv-thumb" + (off ? " mbv-ablated" : ""), tabindex: 0, role: "button",
                                 "data-layer": l, "data-head": h,
                                 title: "Layer " + (l + 1) + ", head " + (h + 1) + " (0-indexed: " + l + ", " + h +
                                        ")" + (off ? ", ablated" : "") + ": click to enlarge"});
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
                                   headColor(meta.heads[t.b], meta.n_heads), st.filter, st.mode, size);
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
    heading.textContent = "Layer " + (l + 1) + " \u00b7 Head " + (h + 1) + "  (0-indexed: layer " + l + ", head " + h + ")" +
                          (isAblated(page.ablated, l, h) ? " \u00b7 ablated" : "");
    lines.draw({rows: st.filter[2], cols: st.filter[3],
                heads: [{index: h, color: headColor(h, meta.n_heads), weight: headWeight(values, attention.scale, b, T)}]});
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

// ---- neuron view --------------------------------------------------------------------------------

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
  x.scaled = x.dot + 74;
  (meta.terms || []).forEach(function (name) { x[name] = x.scaled; x.scaled += 74; });
  x.bar = x.scaled + 80;
  x.softmax = x.bar + 40;
  var tableW = x.softmax + 72, tableH = 2 * ROW + T * ROW + 4;
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
    if (background) fragment.appendChild(svg("rect", Object.assign({x: x0, y: rowTop(j) + 2, width: 66, height: ROW - 4, rx: 3}, background)));
    fragment.appendChild(svg("text", {x: x0 + 62, y: rowTop(j) + ROW / 2, "text-anchor": "end", "class": "mbv-num",
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

    lines.draw({rows: [0, T], cols: [0, T], query: i, heads: [{index: meta.heads[h], color: headColor(meta.heads[h], meta.n_heads),
                                                               weight: function (a, b) { return a === i ? p[b] : 0; }}]});
    status.textContent = "Query " + token(i) + " (position " + i + ", 0-indexed) \u00b7 layer " + (meta.layers[l] + 1) +
                         ", head " + (meta.heads[h] + 1) + " (0-indexed: " + meta.layers[l] + ", " + meta.heads[h] + ")" +
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
    header(fragment, "q\u00b7k", x.dot + 62, "end");
    (meta.terms || []).forEach(function (name) { header(fragment, name, x[name] + 62, "end"); });
    header(fragment, terms.length ? "scores" : "q\u00b7k/\u221a" + K, x.scaled + 62, "end");
    header(fragment, "softmax", x.bar);
    fragment.appendChild(svg("text", {x: x.label, y: ROW * 1.5, "class": "mbv-colhead"}, "q"));
    keys.forEach(function (j) {
      number(fragment, "dot", j, dots[j], dots[j].toFixed(2), signed(dots[j], dotScale),
             "q\u00b7k for key " + token(j) + " = " + dots[j]);
      (meta.terms || []).forEach(function (name, n) {
        var value = termRows[n][j];
        number(fragment, name, j, value, value.toFixed(2), signed(value, maxAbs(termRows[n])),
               name + " for key " + token(j) + " = " + value);
      });
      number(fragment, "scaled", j, scaled[j], isFinite(scaled[j]) ? scaled[j].toFixed(2) : "\u2212\u221e",
             terms.length ? signed(scaled[j], maxAbs(scaled)) : signed(dots[j], dotScale),
             scoresName + " for key " + token(j) + " = " + scaled[j]);
      fragment.appendChild(svg("rect", {x: x.bar, y: rowTop(j) + 4, width: Math.max(60 * p[j], 0.5), height: ROW - 8,
                                        fill: POSITIVE, "class": "mbv-bar"}));
      number(fragment, "softmax", j, p[j], p[j].toFixed(3), null, "softmax for key " + token(j) + " = " + p[j]);
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

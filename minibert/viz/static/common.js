/* minibert views, common part: what the head, model and neuron views (head_view.js, model_view.js,
   neuron_view.js) and the workbench share — constants, el() and the other DOM helpers, packed arrays,
   pictures, the rasterised lines and the token columns. views.js (boot, render) comes last.
   _html.py joins these files (VIEW_SCRIPTS) and wraps them in a function per view, so nothing leaks into
   the page's globals.
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
// The same hues lighter, for the dark theme: each at least 7:1 on its #0d1117 (#393b79 was 1.8:1, a line of
// weight 1 nearly as dark as the page)
var PALETTE_DARK = ["#58a6ff", "#ffa657", "#56d364", "#ff7b72", "#bc8cff", "#d4a38f",
                    "#f778ba", "#a8b1bb", "#d6d64a", "#39d4e6", "#a5a8ff", "#f0909a"];
var POSITIVE = "#1f77b4", NEGATIVE = "#f57f17";  // neuron view: positive blue, negative orange

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
/** Head h's colour of n, on the theme of the view `root` (dark: .mbv-dark). */
function headColor(h, n, root) {
  var dark = Boolean(root) && root.classList.contains("mbv-dark");
  if (n <= PALETTE.length) return (dark ? PALETTE_DARK : PALETTE)[h];
  return "hsl(" + Math.round(h * 360 / n) + ",65%," + (dark ? 66 : 48) + "%)";
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

/** "Download PNG | SVG" buttons saving what current() returns ({node, width, height}), drawn now, as
    minibert-NAME.png or .svg: `name` a string, or a function giving the name of what is drawn at the click. */
function downloadControl(root, busy, name, current) {
  var wrap = el("span", {"class": "mbv-download"}, "Download");
  ["png", "svg"].forEach(function (format) {
    var button = el("button", {type: "button", "class": "mbv-link", "data-format": format,
                               title: "save the current drawing as " + format.toUpperCase()}, format.toUpperCase());
    button.addEventListener("click", function () {
      var shown = current(), text = new XMLSerializer().serializeToString(shown.node);
      var filename = "minibert-" + (typeof name === "function" ? name() : name) + "." + format;
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

/** The index into meta.layers of the model's layer `layer` (0-indexed), or `otherwise` where the view lacks it. */
function layerAt(meta, layer, otherwise) {
  var at = meta.layers.indexOf(layer);
  return at >= 0 ? at : otherwise;
}


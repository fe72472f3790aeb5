"""A feature browser for a sparse autoencoder or a transcoder: one offline HTML page, one latent shown at a time.

The page opens on the most frequent latent, under an overview table of the most frequent ones. For each
latent: its top-activating contexts (a window of tokens around the peak, each token shaded by its
activation relative to the latent's maximum), a histogram of its non-zero activations (log10 bins), how
often it fires, and the tokens whose input embeddings are closest (cosine) to its decoder direction (when the
SAE reads a stream as wide as the embeddings). The page holds all latents as one zlib-compressed JSON blob
(token strings once, activations as bytes), which the browser inflates; text reaches the page only as data
set with textContent, never as markup.

    browser = feature_browser(model, config, params, texts)      # texts: a text, a list, pairs or a corpus file
    browser.save("features.html")

A transcoder's latents (analysis.transcoders: config a TranscoderConfig) are found the same way, on its MLP's
input (the hook it reads); its decoder directions, which write the MLP's output, give the nearest tokens.

A crosscoder's latents (analysis.diffing: config a CrosscoderConfig) read two models at once, so it is browsed
over both: `feature_browser((base, tuned), config, params, texts)` runs each batch through A and B and encodes the
paired vectors. Each top context then shows, beside the latent's activation, what each model's own vector
contributes to its pre-activation at the peak (x_A · W_enc[A]_i | x_B · W_enc[B]_i, as diffing.top_examples
does), and each latent its relative decoder norm, decoder cosine and latent-scaling class (diffing.latent_table
on the browsed tokens); the nearest tokens are given in each model's embeddings.
"""

from __future__ import annotations

import base64
import functools
import json
import warnings
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis import diffing, transcoders
from minibert.analysis.sae.model import SAEConfig, encode
from minibert.errors import VizError, outside_minibert
from minibert.viz._html import _safe_json, page, write_page

HISTOGRAM_EDGES = np.linspace(-3.0, 2.0, 17)  # log10 of the activation: 16 bins from 0.001 to 100


ENCODERS = {SAEConfig: encode, transcoders.TranscoderConfig: transcoders.encode,
            diffing.CrosscoderConfig: diffing.encode}  # x [N, D], or [N, 2, D] for a crosscoder


@functools.partial(jax.jit, static_argnames=("config", "top", "window"))
def _chunk_summary(params, x, *, config, top, window):
    """Latents of x [N, D] ([N, 2, D] paired, for a crosscoder: a chunk's real tokens, text after text): the top
    values [S, top], their token indices [S, top], the latent's activations on the window around each
    [S, top, 2·window + 1], the histogram counts [S, bins], and for a crosscoder each model's contribution to
    the pre-activation at each top token [S, top, 2] (else None)."""
    latents = ENCODERS[type(config)](config, params, x)
    values, index = jax.lax.top_k(latents.T, top)
    around = jnp.clip(index[..., None] + jnp.arange(-window, window + 1), 0, x.shape[0] - 1)
    windows = latents[around, jnp.arange(config.d_sae)[:, None, None]]
    bins = jnp.digitize(jnp.log10(jnp.maximum(latents, 1e-30)), jnp.asarray(HISTOGRAM_EDGES[1:-1]))
    counts = jnp.stack([jnp.sum((bins == b) & (latents > 0), axis=0) for b in range(len(HISTOGRAM_EDGES) - 1)], -1)
    parts = None
    if isinstance(config, diffing.CrosscoderConfig):
        parts = jnp.take_along_axis(diffing.contributions(params, x).transpose(2, 0, 1), index[..., None], axis=1)
    return values, index, windows, counts, parts


def _nearest_tokens(model, W_dec: np.ndarray, count: int) -> np.ndarray | None:
    """[S, count] ids of the tokens whose input embeddings have the highest cosine with each decoder row. Only
    rows the tokenizer has a token for take part: tables padded past the vocabulary (ModernBERT-base: 50,368
    rows for 50,280 tokens) have rows no text can reach."""
    embeddings = np.asarray(model.W_E, np.float32)  # the word-embedding table [V, E]
    if embeddings.shape[1] != W_dec.shape[1]:
        return None
    ids = np.array(sorted(i for i in model.tokenizer.ids_to_tokens if 0 <= i < len(embeddings)))
    unit = embeddings[ids] / np.maximum(np.linalg.norm(embeddings[ids], axis=1, keepdims=True), 1e-12)
    rows = W_dec / np.maximum(np.linalg.norm(W_dec, axis=1, keepdims=True), 1e-12)
    return ids[np.asarray(jax.lax.top_k(jnp.asarray(rows) @ jnp.asarray(unit).T, min(count, len(ids)))[1])]


class FeatureBrowser:
    """The browser's data ({"tokens": [...], "latents": [...]}) and its page (`.page()`, `.save(path)`)."""

    def __init__(self, data: dict, title: str):
        self.data, self.title = data, title

    def page(self) -> str:
        blob = base64.b64encode(zlib.compress(json.dumps(self.data, separators=(",", ":")).encode(), 9)).decode()
        fires = [latent["fires"] for latent in self.data["latents"]]
        first = max(range(len(fires)), key=fires.__getitem__)  # the most frequent latent: latent 0 may never fire
        body = (f'<div id="fb-meta"></div><details id="fb-overview-box" open><summary>overview: the most frequent '
                f'latents</summary><table id="fb-overview"></table></details>'
                f'<label>latent <input id="fb-pick" type="number" min="0" value="{first}"></label> '
                f'<select id="fb-order"></select><div id="fb-view"></div>'
                f'<script type="application/json" id="fb-data">{_safe_json(blob)}</script><script>{_SCRIPT}</script>')
        return page(self.title, body, style=_STYLE)

    def save(self, path, *, overwrite: bool = False) -> Path:
        """Write the browser's page to `path`; an existing file is refused unless overwrite=True."""
        return write_page(path, self.page(), overwrite)

    def _repr_html_(self) -> str:
        return self.page()



def _crosscoder_pair(model) -> tuple:
    if not isinstance(model, tuple | list) or len(model) != 2:
        raise VizError(f"a crosscoder's latents read two models, but {type(model).__name__} was passed; pass the "
                       f"pair it was trained on, A (the base) first: feature_browser((base, tuned), config, "
                       f"params, texts).")
    return tuple(model)


def feature_browser(model, config: SAEConfig | transcoders.TranscoderConfig | diffing.CrosscoderConfig, params,
                    texts, *, pairs=None, hook_name: str | None = None, top: int = 5, window: int = 4,
                    nearest: int = 5, max_length: int = 128, batch_size: int = 32, title: str | None = None,
                    source: dict | None = None, names: tuple[str, str] | None = None) -> FeatureBrowser:
    """Browse every latent of an SAE, a transcoder or a crosscoder over `texts` (see the module docstring);
    window: tokens each side of a peak. texts, pairs: as sae.text_rows reads them — one text (a str), a list,
    pairs, (text, pair) tuples or a corpus file — so the browser can show the very rows the SAE was trained on. A
    transcoder reads its MLP's input at its layer (transcoders.checked_site: one for another model or site is
    refused). A text longer than max_length tokens (or the model's positions, if fewer) is browsed in its first
    max_length, and one warning says how many were cut. A crosscoder takes model = (A, B), the pair it was trained
    on; source (its trainer's .source) and names are what diffing.what_changed takes, and its site is checked as
    what_changed checks it."""
    from minibert.analysis.sae.source import hook_width, text_rows, tokenized_within

    crosscoder = isinstance(config, diffing.CrosscoderConfig)
    if crosscoder:
        models = _crosscoder_pair(model)
        hook_name = diffing.checked_site(*models, config, hook_name, source)
        names = diffing.pair_names(*models, names)
        title = title or f"crosscoder features (A = {names[0]}, B = {names[1]})"
    else:
        models = (model,)
        if isinstance(config, transcoders.TranscoderConfig):
            hook_name = hook_name or transcoders.checked_site(model, config)[0]
            title = title or f"transcoder features (block {config.layer}'s MLP)"
        else:
            hook_name = hook_name or config.hook_name
        title = title or "SAE features"
        if hook_name is None or hook_width(model, hook_name) != config.d_in:
            raise VizError(f"hook {hook_name!r} does not give {config.d_in}-wide vectors; pass the hook_name the "
                           f"SAE was trained on.")
    for name, value, least in (("top", top, 1), ("window", window, 0), ("nearest", nearest, 0),
                               ("batch_size", batch_size, 1), ("max_length", max_length, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise VizError(f"{name}={value!r} must be a whole number ≥ {least}.")
    rows, has_pairs = text_rows(texts, pairs)
    rows = list(rows)
    if not rows:
        raise VizError("pass at least one text to find the latents' top contexts in.")
    texts, pairs = [a for a, _ in rows], [b for _, b in rows] if has_pairs else None
    params = {name: jnp.asarray(value, jnp.float32) for name, value in params.items()}
    for name, value in params.items():  # a NaN would reach the page's data as NaN, which JSON cannot hold
        bad = int(np.size(value) - np.isfinite(np.asarray(value)).sum())
        if bad:
            raise VizError(f"the SAE's {name} holds {bad:,} values that are not finite (NaN or ±inf): a diverged "
                           f"or damaged SAE has no features to browse; retrain it, or load a checkpoint of it from "
                           f"before it diverged.")
    S, span = config.d_sae, np.arange(-window, window + 1)
    best = {"value": np.zeros((S, 0), np.float32), "acts": np.zeros((S, 0, len(span)), np.float32),
            "ids": np.zeros((S, 0, len(span)), np.int64)}  # ids −1: outside the peak's text
    if crosscoder:
        best["parts"] = np.zeros((S, 0, 2), np.float32)
    counts, tokens_seen, paired = np.zeros((S, len(HISTOGRAM_EDGES) - 1), np.int64), 0, []
    limit, cut = min(max_length, models[0].config.max_tokens), 0
    for start in range(0, len(texts), batch_size):
        batch, cut_here = tokenized_within(models[0], texts[start:start + batch_size],
                                           None if pairs is None else pairs[start:start + batch_size], limit)
        cut += cut_here
        real = np.asarray(batch.attention_mask) > 0
        x = np.stack([np.asarray(each.run_with_cache(batch, names=[hook_name])[1][hook_name], np.float32)
                      .reshape(*real.shape, -1)[real] for each in models], axis=1)  # [N, models, D]
        x = x if crosscoder else x[:, 0]
        paired += [x] if crosscoder else []
        ids, text_of = np.asarray(batch.input_ids)[real], np.nonzero(real)[0]
        tokens_seen += len(ids)
        values, index, windows, chunk_counts, parts = (None if a is None else np.asarray(a) for a in _chunk_summary(
            params, x, config=config, top=min(top, len(ids)), window=window))
        around = index[..., None] + span
        inside = (around >= 0) & (around < len(ids))
        inside[inside] &= text_of[around[inside]] == text_of[np.broadcast_to(index[..., None], around.shape)[inside]]
        counts += chunk_counts
        candidates = {"value": values, "acts": np.where(inside, windows, 0.0),
                      "ids": np.where(inside, ids[np.clip(around, 0, len(ids) - 1)], -1)}
        if crosscoder:
            candidates["parts"] = parts
        merged = {key: np.concatenate([best[key], candidates[key]], axis=1) for key in best}
        keep = np.argsort(-merged["value"], axis=1, kind="stable")[:, :top]
        best = {key: np.take_along_axis(value, keep.reshape(keep.shape + (1,) * (value.ndim - 2)), 1)
                for key, value in merged.items()}
    if cut:
        more = (f"pass max_length= up to this model's {models[0].config.max_tokens} positions" if limit <
                models[0].config.max_tokens else "split long texts (this model reads no more tokens)")
        warnings.warn(f"feature_browser: {cut} of the {len(texts)} texts had more than max_length={limit} tokens "
                      f"([CLS] and [SEP] counted) and only their first {limit} were browsed; to browse them whole, "
                      f"{more}.", stacklevel=outside_minibert())
    W_dec = np.asarray(params["W_dec"]).reshape(len(models), S, -1)  # [models, S, D]
    neighbours = [_nearest_tokens(each, W_dec[m], nearest) for m, each in enumerate(models)]
    used: dict[int, int] = {}

    def token(i) -> int:
        return used.setdefault(int(i), len(used))

    latents = []
    for j in range(S):
        peak = float(best["value"][j, 0])
        contexts = [[[token(i) for i in ids[ids >= 0]], [round(255 * a / peak) for a in acts[ids >= 0]]]
                    for value, ids, acts in zip(best["value"][j], best["ids"][j], best["acts"][j]) if value > 0]
        latents.append({"max": float(f"{peak:.6g}"), "fires": int(counts[j].sum()), "contexts": contexts,
                        "histogram": counts[j].tolist(),
                        "nearest": [[] if found is None else [token(i) for i in found[j]] for found in neighbours]})
    data = {"tokens": models[0].tokenizer.convert_ids_to_tokens(list(used)), "latents": latents,
            "tokens_seen": tokens_seen, "hook": hook_name, "edges": HISTOGRAM_EDGES.tolist()}
    if crosscoder:
        _add_crosscoder_columns(data, diffing.latent_table(config, params, np.concatenate(paired)), best, names)
    else:
        for latent in latents:
            latent["nearest"] = latent["nearest"][0]
    return FeatureBrowser(data, title)


def _number(value) -> float | None:
    """A float for the page's JSON at 6 significant digits; None where it is not finite (a dead latent's ν)."""
    return float(f"{value:.6g}") if np.isfinite(value) else None


def _add_crosscoder_columns(data: dict, table, best: dict, names: tuple[str, str]) -> None:
    """Per latent: its relative decoder norm, decoder cosine, latent-scaling label and ν (error, reconstruction),
    and each top context's two models' contributions at the peak (A, B); the models' names."""
    data["models"] = list(names)
    for j, latent in enumerate(data["latents"]):
        latent |= {"relative_norm": _number(table.relative_norm[j]), "cosine": _number(table.cosine[j]),
                   "label": str(table.labels[j]), "nu": [_number(table.nu[v][j]) for v in ("error", "reconstruction")],
                   "parts": [[_number(a), _number(b)] for (a, b), value in zip(best["parts"][j], best["value"][j])
                             if value > 0]}


_STYLE = ("body{font-family:system-ui,sans-serif;margin:24px;max-width:1100px;color:#1f2328}"
          ".ctx{font-family:ui-monospace,monospace;margin:4px 0;white-space:pre-wrap}"
          ".tok{padding:1px 2px;border-radius:3px}.bar{display:inline-block;width:14px;background:#0969da;"
          "vertical-align:bottom;margin-right:1px}.hist{height:80px;display:flex;align-items:flex-end}"
          ".near span{border:1px solid #d0d7de;border-radius:4px;padding:1px 4px;margin-right:4px}"
          ".ticks{position:relative;height:16px;font-size:11px;color:#57606a}.tick{position:absolute;"
          "transform:translateX(-50%)}.axis{font-size:12px;color:#57606a;margin-top:2px}"
          "#fb-overview td,#fb-overview th{padding:2px 8px;text-align:left;font-size:13px}"
          ".parts{color:#57606a}")

OVERVIEW_ROWS = 20  # latents the overview table lists, most frequent first
BAR_WIDTH = 15  # px: a histogram bar's 14 px and its 1 px margin (.bar), so tick i sits at i × 15 px

_SCRIPT = r"""
(async function () {
  const OVERVIEW_ROWS = @OVERVIEW_ROWS@, BAR_WIDTH = @BAR_WIDTH@;
  const blob = JSON.parse(document.getElementById("fb-data").textContent);
  const bytes = Uint8Array.from(atob(blob), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
  const data = JSON.parse(await new Response(stream).text());
  const el = (tag, text, cls) => { const e = document.createElement(tag); if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls; return e; };
  const view = document.getElementById("fb-view"), pick = document.getElementById("fb-pick");
  const order = document.getElementById("fb-order");
  const pair = data.models !== undefined, num = (v) => v === null ? "–" : v.toFixed(2);
  const signed = (v) => v === null ? "–" : (v >= 0 ? "+" : "") + v.toFixed(2);
  document.getElementById("fb-meta").textContent = data.latents.length + " latents at " + data.hook + ", over " +
    data.tokens_seen + " tokens" + (pair ? "; a crosscoder between A = " + data.models[0] + " and B = " +
    data.models[1] : "");
  pick.max = data.latents.length - 1;
  const ranked = data.latents.map((l, i) => i).sort((a, b) => data.latents[b].fires - data.latents[a].fires);
  const heading = el("option", "most frequent first"); heading.value = "";  // no number: the pick is left alone
  order.appendChild(heading);
  for (const i of ranked.slice(0, 500)) { const o = el("option", "latent " + i + " (" + data.latents[i].fires + ")");
    o.value = i; order.appendChild(o); }
  order.onchange = () => { if (order.value !== "") { pick.value = order.value; show(); } };
  const overview = document.getElementById("fb-overview"), head = el("tr");
  for (const name of ["latent", "fires on", "share of tokens", "max activation", "top token"].concat(
      pair ? ["relative norm", "latent scaling"] : [])) head.appendChild(el("th", name));
  overview.appendChild(head);
  for (const i of ranked.slice(0, OVERVIEW_ROWS)) { const l = data.latents[i], row = el("tr"), open = el("button",
      "latent " + i);
    open.onclick = () => { pick.value = i; show(); };
    const peak = l.contexts.length ? l.contexts[0] : null;
    const topToken = peak ? data.tokens[peak[0][peak[1].indexOf(255)]] : "";
    row.appendChild(el("td")).appendChild(open);
    for (const cell of [String(l.fires), (100 * l.fires / Math.max(1, data.tokens_seen)).toFixed(2) + "%",
                        String(l.max), topToken].concat(pair ? [num(l.relative_norm), l.label] : []))
      row.appendChild(el("td", cell));
    overview.appendChild(row); }
  function show() {
    const i = Math.max(0, Math.min(data.latents.length - 1, Number(pick.value) || 0)), l = data.latents[i];
    view.replaceChildren(el("h2", "latent " + i), el("p", "fires on " + l.fires + " of " + data.tokens_seen +
      " tokens; max activation " + l.max));
    if (pair) view.appendChild(el("p", "relative decoder norm ‖d_B‖ / (‖d_A‖ + ‖d_B‖) = " + num(l.relative_norm) +
      ", decoder cosine " + num(l.cosine) + "; latent scaling: " + l.label + " (ν error " + num(l.nu[0]) +
      ", ν reconstruction " + num(l.nu[1]) + ")"));
    view.appendChild(el("h3", pair ? "top contexts, with what A's and B's vectors contribute at the peak" :
      "top contexts"));
    l.contexts.forEach(([ids, acts], c) => { const line = el("div", undefined, "ctx");
      if (pair) line.appendChild(el("span", "A " + signed(l.parts[c][0]) + " | B " + signed(l.parts[c][1]) + "  ",
        "parts"));
      ids.forEach((t, k) => { const s = el("span", data.tokens[t] + " ", "tok");
        s.style.background = "rgba(255,140,0," + (acts[k] / 255).toFixed(3) + ")";
        s.title = String(acts[k] / 255 * l.max);
        line.appendChild(s); }); view.appendChild(line); });
    if (!l.contexts.length) view.appendChild(el("p", "never fires on these texts (dead here)"));
    const last = data.edges[data.edges.length - 1];
    view.appendChild(el("h3", "activations (log10 bins " + data.edges[0] + " to " + last + ")"));
    const hist = el("div", undefined, "hist"), top = Math.max(1, ...l.histogram);
    l.histogram.forEach((c, b) => { const bar = el("span", undefined, "bar"); bar.style.height = (80 * c / top) + "px";
      bar.title = c + " tokens in [10^" + data.edges[b].toFixed(2) + ", 10^" + data.edges[b + 1].toFixed(2) + ")";
      hist.appendChild(bar); });
    view.appendChild(hist);
    const ticks = el("div", undefined, "ticks"), lo = data.edges[0], bins = data.edges.length - 1;
    for (let p = Math.ceil(lo); p <= last; p++) {  // a label at each power of ten, where it falls on the bins
      const t = el("span", String(10 ** p), "tick");
      t.style.left = ((p - lo) / (last - lo) * bins * BAR_WIDTH) + "px"; ticks.appendChild(t); }
    view.appendChild(ticks);
    view.appendChild(el("p", "activation (log scale); the tallest bar is " + top + " tokens", "axis"));
    (pair ? l.nearest : [l.nearest]).forEach((found, m) => { if (!found.length) return;
      view.appendChild(el("h3", "nearest token embeddings to its decoder direction" +
        (pair ? " in " + "AB"[m] + " (" + data.models[m] + ")" : "")));
      const near = el("div", undefined, "near");
      for (const t of found) near.appendChild(el("span", data.tokens[t]));
      view.appendChild(near); });
  }
  pick.oninput = show; show();
})();
""".replace("@OVERVIEW_ROWS@", str(OVERVIEW_ROWS)).replace("@BAR_WIDTH@", str(BAR_WIDTH))

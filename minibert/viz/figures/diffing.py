"""The "what changed" sheet of a model diff (analysis.diffing.what_changed): four panels on one figure —
weight change by head, CKA by stream, the crosscoder latents' relative decoder norms split by their latent-scaling
label, and the top fine-tune-only latents with their top examples and what each model contributes to them."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from minibert.errors import refuse_unless_flag
from minibert.viz import _check
from minibert.viz._check import VizError
from minibert.viz.figures._base import NotebookFigure, _legend, _one_based_ticks, figure_path, save

LABEL_COLOURS = {"shared": "0.6", "A-only": "#e66101", "B-only": "#2166ac"}  # dead latents have no decoder to show
TEXT_POINTS = 8
LINE_INCHES = TEXT_POINTS * 1.2 / 72  # one monospace line: matplotlib's line spacing is 1.2 × the font size
TITLE_INCHES = 0.35  # the examples panel's 9 pt title and the gap under it


def what_changed(report, *, path=None, overwrite: bool = False) -> Figure:
    """One figure sheet of a DiffReport (analysis.diffing.what_changed); saved to `path` (.png, .svg, .pdf) where
    given — an existing file only with overwrite=True."""
    refuse_unless_flag("overwrite", overwrite, VizError)  # the flag's type, also without a path
    if path is not None:
        figure_path(path, overwrite)  # before drawing; save() checks it again
    per_head = [_check.matrix(f"weights.per_head[{name!r}]", value, 2, "[L, H]")
                for name, value in report.weights.per_head.items()]
    heads = np.mean(per_head, axis=0)
    cka = _check.matrix("cka", report.cka, 1, "[L + 1]")
    names, table = report.names, report.latents
    lines = []
    for latent, examples in report.examples.items():
        lines.append(f"latent {latent}: r = {table.relative_norm[latent]:.2f}, ν_error = "
                     f"{table.nu['error'][latent]:.2f}, ν_reconstruction = {table.nu['reconstruction'][latent]:.2f}, "
                     f"fires on {100 * table.frequency[latent]:.1f}% of tokens")
        lines += [f"    {e.activation:6.2f}  (A {e.contributions[0]:+.2f} | B {e.contributions[1]:+.2f})  {e.context}"
                  for e in examples]
    text_height = TITLE_INCHES + LINE_INCHES * max(len(lines), 1)  # the examples' own height: no blank below
    fig = NotebookFigure(figsize=(13, 4.5 + text_height), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=(4.5, text_height))
    ax_heads, ax_cka, ax_norms = top.subplots(1, 3)

    image = ax_heads.imshow(heads, cmap="viridis", aspect="auto",
                            extent=(0.5, heads.shape[1] + 0.5, heads.shape[0] + 0.5, 0.5))
    _one_based_ticks(ax_heads, "y", heads.shape[0])
    _one_based_ticks(ax_heads, "x", heads.shape[1])
    ax_heads.set(xlabel="head (1-indexed)", ylabel="layer (1-indexed)")
    ax_heads.set_title("weight change by head\n‖W_B − W_A‖ / ‖W_A‖, mean of Q, K, V, O", fontsize=9)
    top.colorbar(image, ax=ax_heads)

    ax_cka.plot(np.arange(len(cka)), cka, marker="o")
    ax_cka.set_xticks(np.arange(len(cka)), ["emb"] + [str(i) for i in range(1, len(cka))])
    ax_cka.set(xlabel="stream (embedding, then block 1-indexed)", ylabel="linear CKA")
    ax_cka.set_title("representation similarity (CKA) by layer", fontsize=9)

    bins = np.linspace(0, 1, 26)
    for label, colour in LABEL_COLOURS.items():
        chosen = table.labels == label
        ax_norms.hist(table.relative_norm[chosen], bins=bins, color=colour, alpha=0.8,
                      label=f"{label} ({int(chosen.sum())})")
    ax_norms.set(xlabel="relative decoder norm ‖d_B‖ / (‖d_A‖ + ‖d_B‖)", ylabel="latents")
    ax_norms.set_title(f"latents at {report.hook_name}, split by latent scaling", fontsize=9, parse_math=False)
    _legend(ax_norms, fontsize=8)

    ax_text = bottom.subplots()
    ax_text.axis("off")
    ax_text.set_title(f"top fine-tune-only latents (B = {names[1]}; A = {names[0]}): strongest tokens, and each "
                      f"model's contribution to the pre-activation (A | B)", fontsize=9, loc="left", parse_math=False)
    ax_text.text(0, 1, "\n".join(lines) or "no latent was labelled fine-tune-only.", va="top", family="monospace",
                 fontsize=TEXT_POINTS, parse_math=False, transform=ax_text.transAxes)
    if path is not None:
        save(fig, path, overwrite=overwrite)
    return fig

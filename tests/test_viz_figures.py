"""Publication figures: valid PNG/SVG/PDF files, drawn data equal to the input, token and 1-indexed
layer labels, the neuron view's colours, and errors that name the argument.

Arrays are made by hand; one test draws the neuron figure from the bundled model's hooks.
"""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ElementTree

import matplotlib.image
import numpy as np
import pytest
from matplotlib.colors import to_rgba

from minibert.viz import figures
from minibert.viz._check import VizError

TOKENS = ["[CLS]", "i", "made", "the", "mistake", ".", "[SEP]"]
N_LAYERS, N_HEADS = 3, 4


def _attention(seed: int = 0) -> np.ndarray:
    """[L=2, H=3, T, T] with rows summing to 1."""
    return np.random.default_rng(seed).dirichlet(np.ones(len(TOKENS)), size=(2, 3, len(TOKENS)))


def _stats(seed: int = 0) -> dict[str, np.ndarray]:
    """Head statistics [L, H] as the analysis produces them."""
    rng = np.random.default_rng(seed)
    shape = (N_LAYERS, N_HEADS)
    parts = rng.dirichlet(np.ones(4), size=shape)  # cls, sep, punct, other: sum to 1
    return {"to_cls": parts[..., 0], "to_sep": parts[..., 1], "to_punct": parts[..., 2],
            "entropy": rng.uniform(0, 3, shape), "cls_entropy": rng.uniform(0, 3, shape),
            "uniform_entropy": np.full(shape, 2.7), "prev": rng.random(shape), "next": rng.random(shape)}


def _ticks(ax, axis: str) -> list[str]:
    return [t.get_text() for t in getattr(ax, f"get_{axis}ticklabels")()]


def _panel(fig, label: str):
    (ax,) = [ax for ax in fig.axes if ax.get_label() == label]
    return ax


def _titled(fig, title: str):
    (ax,) = [ax for ax in fig.axes if ax.get_title() == title]
    return ax


def _image(ax) -> np.ndarray:
    return np.asarray(ax.images[0].get_array())


# ---- files ------------------------------------------------------------------------------------------

BUILDERS = {
    "attention_heatmap": lambda: figures.attention_heatmap(_attention()[0, 1], TOKENS, title="1-2"),
    "head_grid": lambda: figures.head_grid(_attention(), TOKENS),
    "neuron_figure": lambda: figures.neuron_figure(np.linspace(-1, 1, 7 * 8).reshape(7, 8),
                                                   np.linspace(1, -1, 7 * 8).reshape(7, 8), TOKENS, 4),
    "attention_to_word_plot": lambda: figures.attention_to_word_plot(np.random.default_rng(1).random((3, 6)),
                                                                     ["I made the mistake.", "This was my mistake.",
                                                                      "It's $5 and $6."], word="mistake"),
    "pca_scatter": lambda: figures.pca_scatter([[0, 0], [1, 2], [2, 1]], labels=["good", "bad", "good"],
                                               texts=["It's ok.", "Sorry, my mistake.", "It's fine."]),
    "special_tokens_plot": lambda: figures.special_tokens_plot(_stats()),
    "gradient_plot": lambda: figures.gradient_plot({"cls": _stats()["prev"], "sep": _stats()["next"],
                                                    "other": _stats()["entropy"]}),
    "entropy_plot": lambda: figures.entropy_plot(_stats()),
    "mds_scatter": lambda: figures.mds_scatter(np.arange(N_LAYERS * N_HEADS * 2.0).reshape(-1, 2) ** 0.5,
                                               n_heads=N_HEADS, annotate=True),
    "statistic_heatmap": lambda: figures.statistic_heatmap(_stats()["prev"], "attention to the previous token"),
    "head_statistics_figure": lambda: figures.head_statistics_figure(_stats()),
    "sweep_heatmap": lambda: figures.sweep_heatmap(np.linspace(-1, 1, N_LAYERS * 7).reshape(N_LAYERS, 7), "Δ metric",
                                                   tokens=TOKENS, center=0.0),
}


def _assert_valid(path) -> None:
    data = path.read_bytes()
    if path.suffix == ".png":
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        assert matplotlib.image.imread(path)[..., :3].var() > 1e-3  # not blank
    elif path.suffix == ".svg":
        assert ElementTree.fromstring(data).tag.endswith("svg")
    else:
        assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF")


# The format is save()'s business, the same for every figure: each figure is saved in one format
# (PDF and SVG get the ones with the hardest text: × · √ … $); figures not listed, all three.
FORMAT_OF = {"head_grid": ".png", "special_tokens_plot": ".png", "mds_scatter": ".png", "statistic_heatmap": ".png",
             "pca_scatter": ".svg", "attention_to_word_plot": ".svg", "entropy_plot": ".svg",
             "neuron_figure": ".pdf", "gradient_plot": ".pdf", "head_statistics_figure": ".pdf"}


@pytest.mark.parametrize("name", BUILDERS)
def test_every_figure_saves_to_a_valid_file(name, tmp_path):
    fig = BUILDERS[name]()
    for suffix in [FORMAT_OF[name]] if name in FORMAT_OF else figures.SUFFIXES:
        _assert_valid(figures.save(fig, tmp_path / "out" / f"{name}{suffix}"))


def test_path_argument_saves_and_other_suffixes_are_refused(tmp_path):
    fig = figures.attention_heatmap(_attention()[0, 0], TOKENS, path=tmp_path / "head.svg")
    _assert_valid(tmp_path / "head.svg")
    assert figures.save(fig, tmp_path / "head.PDF").read_bytes().startswith(b"%PDF-")
    with pytest.raises(VizError, match=r"must end in \.png, \.svg or \.pdf.*'\.jpg'"):
        figures.save(fig, tmp_path / "head.jpg")
    with pytest.raises(VizError, match="no suffix"):
        figures.save(fig, tmp_path / "head")


def test_figures_refuse_an_existing_file_unless_asked(tmp_path):
    """Issue 40: the figure savers replaced a user's file where pages refuse: one rule for every writer. The
    refusal leaves the file's bytes; overwrite=True (figures.save and every figure function's path=) replaces it."""
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"my own picture")
    fig = figures.attention_heatmap(_attention()[0, 0], TOKENS)
    with pytest.raises(VizError, match=r"mine\.png already exists; pass overwrite=True to replace it"):
        figures.save(fig, mine)
    with pytest.raises(VizError, match="already exists"):
        figures.attention_heatmap(_attention()[0, 0], TOKENS, path=mine)
    with pytest.raises(VizError, match=r"overwrite='yes': pass True or False"):
        figures.save(fig, mine, overwrite="yes")
    (tmp_path / "folder.png").mkdir()
    with pytest.raises(VizError, match="is a folder"):
        figures.save(fig, tmp_path / "folder.png")
    assert mine.read_bytes() == b"my own picture"
    figures.attention_heatmap(_attention()[0, 0], TOKENS, path=mine, overwrite=True)
    _assert_valid(mine)


# ---- attention matrices ----------------------------------------------------------------------------

def test_attention_heatmap_draws_the_matrix_with_tokens_on_both_axes():
    a = _attention()[1, 2]
    fig = figures.attention_heatmap(a, TOKENS)
    ax = fig.axes[0]
    np.testing.assert_array_equal(_image(ax), a)
    assert _ticks(ax, "x") == TOKENS and _ticks(ax, "y") == TOKENS
    assert ax.images[0].norm.vmin == 0 and ax.images[0].norm.vmax == a.max()
    assert fig.axes[1].get_ylabel() == "attention"  # the colour bar


def test_attention_heatmap_takes_other_key_tokens_and_an_existing_axes():
    from matplotlib.figure import Figure

    own = Figure()
    left, right = own.subplots(1, 2)
    keys = ["[CLS]", "b", "$x$", "[SEP]"]
    a = np.arange(len(TOKENS) * 4.0).reshape(len(TOKENS), 4) / 100
    assert figures.attention_heatmap(a, TOKENS, keys, ax=right, vmax=1.0) is own
    np.testing.assert_array_equal(_image(right), a)
    assert _ticks(right, "x") == keys and _ticks(right, "y") == TOKENS
    assert right.images[0].norm.vmax == 1.0 and not left.images


def test_head_grid_titles_heads_one_indexed_and_shares_one_scale():
    a = _attention()
    fig = figures.head_grid(a, TOKENS)
    grids = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in grids] == ["1-1", "1-2", "1-3", "2-1", "2-2", "2-3"]
    np.testing.assert_array_equal(_image(_titled(fig, "2-3")), a[1, 2])  # layer 1, head 2 (0-indexed)
    assert {ax.images[0].norm.vmax for ax in grids} == {a.max()}
    corner = _titled(fig, "2-1")
    assert _ticks(corner, "x") == TOKENS and _ticks(corner, "y") == TOKENS


def test_head_grid_shows_the_chosen_layers_and_heads_in_order():
    a = _attention()
    fig = figures.head_grid(a, TOKENS, layers=[1], heads=[2, 0])
    assert [ax.get_title() for ax in fig.axes if ax.images] == ["2-3", "2-1"]
    np.testing.assert_array_equal(_image(_titled(fig, "2-1")), a[1, 0])


# ---- the neuron view ---------------------------------------------------------------------------------

def test_neuron_colormap_is_orange_negative_white_zero_blue_positive():
    negative, zero, positive = (np.array(figures.NEURON_CMAP(x)[:3]) for x in (0.0, 0.5, 1.0))
    assert positive[2] > positive[0] + 0.4  # blue
    assert negative[0] > negative[1] > negative[2] and negative[0] - negative[2] > 0.6  # orange
    assert zero.min() > 0.95  # white


def test_neuron_figure_panels_equal_hand_computed_values_and_colour_by_sign():
    tokens = ["[CLS]", "a", "b"]
    q = np.array([[1.0, 0.0, -1.0, 2.0], [0.5, 0.5, 0.5, 0.5], [0.0, 1.0, 0.0, -1.0]])
    k = np.array([[1.0, 2.0, 0.0, 0.0], [-1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 2.0, -2.0]])
    fig = figures.neuron_figure(q, k, tokens, query_index=0)
    scores = np.array([1.0, 0.0, -6.0])  # q[0]·k[s]
    scaled = scores / 2.0  # √K = 2
    softmax = np.exp(scaled) / np.exp(scaled).sum()
    expected = {"q": q[:1], "k": k, "q×k": q[0] * k, "q·k": scores[:, None], "q·k/√K": scaled[:, None],
                "softmax": softmax[:, None]}
    for label, value in expected.items():
        np.testing.assert_allclose(_image(_panel(fig, label)), value, rtol=1e-12)
    assert _ticks(_panel(fig, "k"), "y") == tokens
    assert _panel(fig, "q·k/√K").get_title() == "q·k/√4"
    k_image = _panel(fig, "k").images[0]
    blue, orange = k_image.to_rgba(np.array([[2.0, -2.0]]))[0, :, :3]
    assert blue[2] > blue[0] + 0.4 and orange[0] > orange[2] + 0.6
    assert _panel(fig, "k").images[0].norm.vmin == -2.0  # q and k share one symmetric scale
    assert [t.get_text() for t in _panel(fig, "softmax").texts] == [f"{v:.2f}" for v in softmax]


def test_neuron_figure_takes_the_query_vector_alone():
    q = np.linspace(-1, 1, len(TOKENS) * 8).reshape(len(TOKENS), 8)
    k = q[::-1] * 3
    full = figures.neuron_figure(q, k, TOKENS, query_index=4)
    alone = figures.neuron_figure(q[4], k, TOKENS, query_index=4)
    for label in figures.NEURON_PANELS:
        np.testing.assert_array_equal(_image(_panel(alone, label)), _image(_panel(full, label)))
    np.testing.assert_allclose(figures.neuron_terms(q[4], k)["softmax"].sum(), 1.0)


def test_neuron_figure_from_bundled_hooks_matches_hook_pattern(bundled):
    batch = bundled.tokenize(["I made the mistake."])
    layer, head, query = 2, 5, 4  # 0-indexed: head "3-6"; query "mistake"
    names = [f"blocks.{layer}.attn.{site}" for site in ("hook_q", "hook_k", "hook_pattern")]
    _, cache = bundled.run_with_cache(batch, names=names)
    q, k, pattern = (np.asarray(cache[name])[0] for name in names)
    tokens = batch.tokens[0]
    assert tokens[query] == "mistake"
    fig = figures.neuron_figure(q[:, head], k[:, head], tokens, query)
    np.testing.assert_allclose(_image(_panel(fig, "softmax"))[:, 0], pattern[head, query], atol=1e-5)
    np.testing.assert_allclose(_image(_panel(fig, "q")), q[None, query, head], rtol=1e-6)


# ---- per-sentence and per-point plots ----------------------------------------------------------------

def test_attention_to_word_plot_draws_one_line_per_sentence_over_one_indexed_layers():
    values = np.array([[0.1, 0.2, 0.3], [0.3, 0.2, 0.1]])
    labels = ["I made the mistake.", "This was my mistake."]
    fig = figures.attention_to_word_plot(values, labels, word="mistake")
    ax = fig.axes[0]
    for line, row in zip(ax.lines, values):
        np.testing.assert_array_equal(line.get_ydata(), row)
        np.testing.assert_array_equal(line.get_xdata(), [1, 2, 3])
    assert _ticks(ax, "x") == ["1", "2", "3"] and ax.get_xlabel() == "layer (1-indexed)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == labels
    assert ax.get_ylabel() == "attention to 'mistake'"


def test_word_plot_groups_and_pca_labels_share_colours():
    groups = ["mistake", "apology", "mistake"]
    lines = figures.attention_to_word_plot(np.ones((3, 2)), ["a", "b", "c"], groups=groups).axes[0].lines
    points = figures.pca_scatter(np.zeros((3, 2)), labels=groups).axes[0].collections[0].get_facecolors()
    for line, point in zip(lines, points):
        assert to_rgba(line.get_color())[:3] == pytest.approx(tuple(point[:3]))
    assert to_rgba(lines[0].get_color()) == to_rgba(lines[2].get_color()) != to_rgba(lines[1].get_color())


def test_pca_scatter_places_points_at_coords_with_legend_texts_and_variance():
    coords = np.array([[0.0, 1.0], [2.0, -1.0], [3.0, 0.5]])
    texts = ["It's ok.", "Sorry this will get e-recorded instead, and a long tail", "It's fine."]
    fig = figures.pca_scatter(coords, labels=[1, 0, 1], texts=texts, explained=[0.5, 0.25], max_chars=20)
    ax = fig.axes[0]
    np.testing.assert_array_equal(ax.collections[0].get_offsets(), coords)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["0", "1"]
    assert [t.get_text() for t in ax.texts] == ["It's ok.", "Sorry this will get…", "It's fine."]
    assert ax.get_xlabel() == "PC 1 (50.0% of variance)" and ax.get_ylabel() == "PC 2 (25.0% of variance)"


def test_pca_labels_of_close_and_equal_points_do_not_overprint():
    """Four sentences at one point and one beside it: each label gets its own place (their drawn boxes are
    measured after drawing with Agg); the fifth finds the four places beside the point taken, moves a ring
    out and gets a leader line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text
    coords = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.01, 0.0], [5.0, 5.0]])
    texts = ["It's ok.", "It's fine.", "Sorry, my mistake.", "Fine by me.", "My mistake, sorry.", "far away"]
    fig = figures.pca_scatter(coords, texts=texts)
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    boxes = [Text.get_window_extent(t) for t in ax.texts]  # the text alone, without its leader line
    assert [t.get_text() for t in ax.texts] == texts
    for i, j in itertools.combinations(range(len(boxes)), 2):
        assert not boxes[i].overlaps(boxes[j]), (texts[i], texts[j])
    assert any(t.arrow_patch is not None for t in ax.texts)  # some label had to move away from its point


def test_sweep_heatmap_draws_heads_or_tokens_one_indexed_with_a_centred_scale():
    values = _stats()["prev"]  # [3, 4]
    fig = figures.sweep_heatmap(values, "metric after ablation", annotate=True)
    ax = fig.axes[0]
    np.testing.assert_array_equal(_image(ax), values)
    assert _ticks(ax, "y") == ["1", "2", "3"] and _ticks(ax, "x") == ["1", "2", "3", "4"]
    assert ax.get_ylabel() == "layer (1-indexed)" and "1-indexed" in ax.get_xlabel()
    assert ax.texts[N_HEADS + 2].get_text() == f"{values[1, 2]:.2f}"
    grid = np.linspace(0.2, 0.9, 3 * 7).reshape(3, 7)
    ax = figures.sweep_heatmap(grid, "metric", tokens=TOKENS, center=0.5).axes[0]
    assert _ticks(ax, "x") == TOKENS and ax.get_xlabel() == "position (token)"
    image = ax.get_images()[0]
    assert image.norm.vmin == pytest.approx(0.1) and image.norm.vmax == pytest.approx(0.9)  # 0.5 ± the reach 0.4
    with pytest.raises(VizError, match="tokens has 2 entries but the data has 7 columns"):
        figures.sweep_heatmap(grid, "metric", tokens=["a", "b"])


# ---- head statistics ---------------------------------------------------------------------------------

def test_special_tokens_plot_draws_each_head_and_layer_means_with_other_as_the_rest():
    stats = _stats()
    ax = figures.special_tokens_plot(stats).axes[0]
    other = 1 - stats["to_cls"] - stats["to_sep"] - stats["to_punct"]
    series = [stats["to_cls"], stats["to_sep"], stats["to_punct"], other]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["[CLS]", "[SEP]", ". or ,", "other"]
    for line, dots, values in zip(ax.lines, ax.collections, series):
        np.testing.assert_allclose(line.get_ydata(), values.mean(axis=1))
        np.testing.assert_array_equal(line.get_xdata(), [1, 2, 3])
        offsets = dots.get_offsets()
        np.testing.assert_allclose(offsets[:, 1], values.ravel())
        assert np.abs(offsets[:, 0] - np.repeat([1, 2, 3], N_HEADS)).max() < 0.5
    assert _ticks(ax, "x") == ["1", "2", "3"]


def test_gradient_and_entropy_plots_draw_their_keys_and_the_uniform_baseline():
    stats = _stats()
    grads = {"other": stats["prev"], "sep": stats["next"]}
    ax = figures.gradient_plot(grads).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["[SEP]", "other"]
    np.testing.assert_allclose(ax.lines[0].get_ydata(), stats["next"].mean(axis=1))
    ax = figures.entropy_plot(stats).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["all tokens", "[CLS] row", "uniform"]
    np.testing.assert_allclose(ax.collections[1].get_offsets()[:, 1], stats["cls_entropy"].ravel())
    np.testing.assert_allclose(ax.lines[2].get_ydata(), [2.7] * N_LAYERS)
    assert ax.lines[2].get_linestyle() == "--"


def test_statistic_heatmap_draws_values_with_one_indexed_layers_and_heads():
    values = _stats()["prev"]
    fig = figures.statistic_heatmap(values, "attention to the previous token", annotate=True)
    ax = fig.axes[0]
    np.testing.assert_array_equal(_image(ax), values)
    assert _ticks(ax, "y") == ["1", "2", "3"] and _ticks(ax, "x") == ["1", "2", "3", "4"]
    assert ax.get_ylabel() == "layer (1-indexed)" and fig.axes[1].get_ylabel() == "attention to the previous token"
    assert ax.texts[N_HEADS + 2].get_text() == f"{values[1, 2]:.2f}"  # row-major: layer 1, head 2 (0-indexed)


def test_mds_scatter_colours_by_layer_and_marks_behaviours():
    coords = np.random.default_rng(2).normal(size=(N_LAYERS * N_HEADS, 2))
    behaviours = np.full((N_LAYERS, N_HEADS), None, dtype=object)
    behaviours[0, 1], behaviours[2, 3], behaviours[1, 0] = "broad", "broad", "[SEP]"
    fig = figures.mds_scatter(coords, behaviours)
    ax = fig.axes[0]
    flat = np.array(["" if b is None else b for b in behaviours.ravel()])
    layer = np.repeat(np.arange(1, N_LAYERS + 1), N_HEADS)
    assert [c.get_label() for c in ax.collections] == ["no behaviour", "[SEP]", "broad"]
    for dots, kind in zip(ax.collections, ["", "[SEP]", "broad"]):
        np.testing.assert_array_equal(dots.get_offsets(), coords[flat == kind])
        np.testing.assert_array_equal(dots.get_array(), layer[flat == kind])
    assert _ticks(fig.axes[1], "y") == ["1", "2", "3"]  # colour bar: layers, 1-indexed
    annotated = figures.mds_scatter(coords, n_heads=N_HEADS, annotate=True).axes[0]
    assert annotated.texts[N_HEADS].get_text() == "2-1"  # row 4 = layer 1, head 0 (0-indexed)


def test_head_statistics_figure_combines_the_main_panels():
    stats = _stats()
    fig = figures.head_statistics_figure(stats)
    special = _titled(fig, "attention to special tokens")
    np.testing.assert_allclose(special.lines[1].get_ydata(), stats["to_sep"].mean(axis=1))
    assert _titled(fig, "attention entropy").get_ylabel() == "average attention entropy (nats)"
    np.testing.assert_array_equal(_image(_titled(fig, "prev")), stats["prev"])
    np.testing.assert_array_equal(_image(_titled(fig, "next")), stats["next"])
    without = {key: value for key, value in stats.items() if key not in ("prev", "next")}
    assert not any(ax.images for ax in figures.head_statistics_figure(without).axes)


# ---- errors -----------------------------------------------------------------------------------------

_GOOD_Q = np.ones((len(TOKENS), 4))
ERRORS = [
    (lambda: figures.attention_heatmap(np.ones((3, 4)), TOKENS), r"attention has shape \(3, 4\).*7 query and 7 key"),
    (lambda: figures.attention_heatmap(np.ones(7), TOKENS), r"attention must be a non-empty \[T, S\]"),
    (lambda: figures.attention_heatmap(np.full((7, 7), np.nan), TOKENS), "attention contains NaN"),
    (lambda: figures.attention_heatmap(np.ones((7, 3)), TOKENS, ["a", "b"]), "tokens_to has 2 entries"),
    (lambda: figures.attention_heatmap(np.ones((7, 7)), "[CLS] i"), "tokens must be a list"),
    (lambda: figures.head_grid(np.ones((2, 7, 7)), TOKENS), r"attention must be \[L, H, T, S\]"),
    (lambda: figures.head_grid(_attention(), TOKENS, layers=[2]), "layers=2 is out of range"),
    (lambda: figures.neuron_figure(np.ones((7, 3)), _GOOD_Q, TOKENS), r"q must be \[T, K\] or \[K\] with K = 4"),
    (lambda: figures.neuron_figure(np.ones((5, 4)), _GOOD_Q, TOKENS), "q covers 5 query positions"),
    (lambda: figures.neuron_figure(_GOOD_Q, _GOOD_Q[:5], TOKENS), "k covers 5 key positions"),
    (lambda: figures.neuron_figure(_GOOD_Q, _GOOD_Q, TOKENS, 7), "query_index=7 is out of range"),
    (lambda: figures.attention_to_word_plot(np.ones((2, 3)), ["a"]), "labels has 1 entries"),
    (lambda: figures.attention_to_word_plot(np.ones((2, 3)), ["a", "b"], groups=[0]), "groups must hold one"),
    (lambda: figures.pca_scatter(np.ones((3, 3))), r"coords must be \[N, 2\]"),
    (lambda: figures.pca_scatter(np.ones((3, 2)), labels=[0, 1]), "labels must hold one label per row"),
    (lambda: figures.pca_scatter(np.ones((3, 2)), texts=["a"]), "texts has 1 entries"),
    (lambda: figures.pca_scatter(np.ones((3, 2)), explained=[0.5]), "explained must give the 2"),
    (lambda: figures.layer_plot({}, "y"), "series must be a non-empty dict"),
    (lambda: figures.special_tokens_plot({"to_cls": np.ones((2, 2))}), r"stats lacks \['to_sep', 'to_punct'\]"),
    (lambda: figures.special_tokens_plot({**_stats(), "to_sep": np.ones((2, 2))}), "must share one"),
    (lambda: figures.entropy_plot({**_stats(), "entropy": np.ones(3)}), r"stats\['entropy'\] must be"),
    (lambda: figures.gradient_plot({"loss": np.ones((2, 2))}), "grads must be a dict with one or more of"),
    (lambda: figures.statistic_heatmap(np.ones(3), "x"), r"values must be a non-empty \[L, H\]"),
    (lambda: figures.mds_scatter(np.ones((12, 2))), "pass n_heads"),
    (lambda: figures.mds_scatter(np.ones((12, 2)), np.full((2, 5), "")), "coords has 12 rows"),
    (lambda: figures.mds_scatter(np.ones((12, 2)), np.full((3, 4), ""), n_heads=3), "n_heads=3"),
    (lambda: figures.mds_scatter(np.ones((12, 3)), n_heads=4), r"coords must be \[L\*H, 2\]"),
    (lambda: figures.head_statistics_figure({"to_cls": np.ones((2, 2))}), "mean lacks"),
]


@pytest.mark.parametrize("draw, message", ERRORS, ids=[m.split(" ")[0] for _, m in ERRORS])
def test_bad_input_raises_an_error_naming_the_argument(draw, message):
    with pytest.raises(VizError, match=message):
        draw()


def test_figures_follow_the_one_rule_for_their_path_and_check_their_numbers(tmp_path, monkeypatch):
    """Issue 40, round 5 (a docs-only tester): head_grid wrote through a dangling link, raised pathlib's TypeError
    for path=3 and NumPy's ValueError for attention="abc", took "~" literally, and drew vmax=-1 and center=nan."""
    attention = _attention()
    (tmp_path / "dangling.png").symlink_to(tmp_path / "nothing_here.png")
    with pytest.raises(VizError, match=r"dangling\.png is a symbolic link"):
        figures.head_grid(attention, TOKENS, path=tmp_path / "dangling.png")
    assert not (tmp_path / "nothing_here.png").exists()
    with pytest.raises(VizError, match="path must be a str or pathlib.Path, such as 'out.png'; got int 3"):
        figures.head_grid(attention, TOKENS, path=3)
    with pytest.raises(VizError, match=r"attention must be a numeric array .*got str 'abc'"):
        figures.head_grid("abc", TOKENS)
    with pytest.raises(VizError, match=r"values must be a numeric array .*got str 'x'"):
        figures.sweep_heatmap("x", "m")
    with pytest.raises(VizError, match=r"vmax must be a finite number > 0; got -1"):
        figures.head_grid(attention, TOKENS, vmax=-1)
    with pytest.raises(VizError, match=r"vmax must be a finite number > 0; got 0"):
        figures.attention_heatmap(attention[0, 0], TOKENS, vmax=0)
    with pytest.raises(VizError, match=r"center must be a finite number; got nan"):
        figures.sweep_heatmap(np.zeros((6, 12)), "m", center=float("nan"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    figures.head_grid(attention, TOKENS, layers=[0], heads=[0], path="~/figs/g.png")
    _assert_valid(tmp_path / "home" / "figs" / "g.png")
    assert not (tmp_path / "~").exists()
    mine = tmp_path / "stat.png"
    mine.write_bytes(b"mine")  # statistic_heatmap dropped overwrite=True on its way to sweep_heatmap
    figures.statistic_heatmap(np.ones((2, 3)), "m", path=mine, overwrite=True)
    _assert_valid(mine)

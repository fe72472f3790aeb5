"""Circuit figures and views (viz.circuits) on hand-made graphs and results: what they draw is read back."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.collections import LineCollection

from minibert.analysis.circuits import CircuitGraph, Faithfulness, TokenAttribution
from minibert.analysis.circuits.edges import edge_mask, receiver_labels, sender_labels
from minibert.errors import AnalysisError
from minibert.viz._check import VizError
from minibert.viz.circuits import circuit_figure, faithfulness_figure, token_text

L, H = 2, 3


def hand_graph() -> CircuitGraph:
    edges = edge_mask(L, H)
    scores = np.zeros(edges.shape)
    senders, receivers = sender_labels(L, H), receiver_labels(L, H)
    scores[senders.index("1-2"), receivers.index("2-3.k")] = 2.0
    scores[senders.index("MLP 2"), receivers.index("output")] = -1.0
    scores[senders.index("embed"), receivers.index("1-1.q")] = 0.5
    return CircuitGraph(scores, senders, receivers, edges, L, H, "eap")


def test_labels_and_edges_are_the_papers():
    assert sender_labels(L, H) == ["embed", "1-1", "1-2", "1-3", "MLP 1", "2-1", "2-2", "2-3", "MLP 2"]
    assert receiver_labels(L, H)[:4] == ["1-1.q", "1-2.q", "1-3.q", "1-1.k"]
    assert receiver_labels(L, H)[-2:] == ["MLP 2 in", "output"]
    edges = edge_mask(L, H)
    senders, receivers = sender_labels(L, H), receiver_labels(L, H)
    assert edges[senders.index("1-1"), receivers.index("MLP 1 in")]  # a block's MLP reads its own heads
    assert not edges[senders.index("1-1"), receivers.index("1-2.v")]  # heads of one block do not read each other
    assert not edges[senders.index("MLP 1"), receivers.index("MLP 1 in")]
    assert edges[:, -1].all()  # the output reads every sender


def test_circuit_figure_draws_each_edge_between_its_nodes():
    graph = hand_graph()
    circuit = graph.circuit(top=2)
    assert circuit.edge_list() == [("1-2", "2-3.k"), ("MLP 2", "output")]
    fig = circuit_figure(graph, circuit)
    ax = fig.axes[0]
    (lines,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    segments = [np.asarray(s).tolist() for s in lines.get_segments()]
    # 1-2 at (1, 1) to 2-3 at (2, 3); MLP 2 at (1, 4) to the output at (1, 5): layers bottom to top
    assert segments == [[[1.0, 1.0], [2.0, 3.0]], [[1.0, 4.0], [1.0, 5.0]]]
    np.testing.assert_allclose(lines.get_linewidths(), [4.5, 2.5])  # width by |score|, the widest 0.5 + 4
    texts = {t.get_text() for t in ax.texts}
    assert {"1-1", "2-3", "MLP 1", "MLP 2", "embed", "output", "k"} <= texts


def test_threshold_and_top_agree():
    graph = hand_graph()
    assert graph.circuit(threshold=0.5).size == 3
    assert graph.circuit(threshold=1.5).edge_list() == [("1-2", "2-3.k")]
    assert graph.top_edges(1) == [("1-2", "2-3.k", 2.0)]


def test_faithfulness_curve_plots_the_values():
    result = Faithfulness(np.array([10, 2, 5]), np.array([0.9, 0.2, 0.5]), clean=1.0, corrupted=0.0, empty=0.1)
    ax = faithfulness_figure(result).axes[0]
    x, y = ax.get_lines()[0].get_data()
    assert x.tolist() == [2, 5, 10] and y.tolist() == [0.2, 0.5, 0.9]


def test_token_text_escapes_and_colours_by_sign():
    attribution = TokenAttribution(np.array([[0.5, -1.0, 0.0]]), [["[CLS]", "<script>", "a&b"]], np.array([1.0]),
                                   np.array([0.5]), "integrated_gradients")
    text = token_text(attribution).html
    assert "<script>" not in text and "&lt;script&gt;" in text and "a&amp;b" in text
    assert "rgba(207,34,46,0.850)" in text  # the largest |score|, negative: full-strength red
    assert "rgba(31,111,235,0.425)" in text  # half of it, positive: half-strength blue


def test_a_circuit_is_asked_for_one_way():
    graph = hand_graph()
    with pytest.raises(AnalysisError, match="top=n .* or threshold=t"):
        graph.circuit(top=2, threshold=0.1)
    with pytest.raises(AnalysisError, match=r"top \(a number of edges\) must be a whole number ≥ 0"):
        graph.circuit(top=-1)
    assert graph.circuit(top=10**6).size == graph.edges.sum()  # at most every edge


def test_the_views_name_what_they_were_given_wrongly():
    """Issue 40: token_text(attr, rows=[5]) raised IndexError, token_text(graph) and circuit_figure({...})
    AttributeError; each is a VizError naming the argument."""
    attribution = TokenAttribution(np.array([[0.5, -1.0]]), [["[CLS]", "a"]], np.array([1.0]), np.array([0.5]),
                                   "integrated_gradients")
    for rows in ([5], [-1], "0", [0.5], 3):
        with pytest.raises(VizError, match=r"rows must be a list of row indices from 0 to 0 \(the attribution has 1"):
            token_text(attribution, rows=rows)
    assert token_text(attribution, rows=(r for r in [0])).html == token_text(attribution).html  # any iterable
    with pytest.raises(VizError, match="token_text shows what analysis.token_attribution returns .* got "
                                       "CircuitGraph"):
        token_text(hand_graph())
    with pytest.raises(VizError, match="circuit_figure draws an edge graph .* got dict"):
        circuit_figure({"scores": np.zeros((2, 2))})
    with pytest.raises(VizError, match="circuit must be a Circuit of this graph .* got list"):
        circuit_figure(hand_graph(), [("1-2", "2-3.k")])


def test_the_circuit_figure_says_what_its_colours_mean_in_the_users_terms():
    """Issue 40: 'blue raises the metric, red lowers it' read as the edge's own effect, while the edges the clean
    behaviour depends on are red: the title says an edge's score is the change when the corrupted value flows."""
    title = circuit_figure(hand_graph()).axes[0].get_title()
    assert "when the corrupted run's value flows along it" in title and "red lowers the metric — the clean " \
        "behaviour depends on that edge" in title

"""Issue 43: the analyses' programs are shared across the counts a user chooses — EAP-IG's and integrated
gradients' steps, the circuits of a faithfulness curve, the words occluded — one program per bucket of counts
(analysis.sweeps.padded_count), the padding never run whole (live_sum, live_map); and each says "compiling …"
on its first call. References: plain Python loops over the items, and over the points (one point per call)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_hf_model
from test_circuits_edges import CLEAN, CORRUPTED, logit_difference
from test_circuits_tokens import TEXTS, gradient_rtol, logit_one
from tolerances import dot_rtol, sum_rtol

import minibert
from minibert.analysis import sweeps
from minibert.analysis.circuits import (
    circuit_faithfulness,
    edge_attribution,
    integration_points,
    path_patching,
    token_attribution,
)
from minibert.analysis.circuits import edges as edges_module
from minibert.core.hooks import HookFn
from minibert.runtime import programs


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-classifier")
    make_hf_model(directory, "BertForSequenceClassification", scale=0.3)
    return minibert.load(directory)


def test_a_bucket_runs_under_an_eighth_of_padding_and_its_chunks_tile_it():
    """Every count of a bucket gets the bucket's chunk (the program's one static choice), the chunk tiles the
    bucket, and the items a live loop runs, ceil(n / chunk)·chunk, exceed n by under n/8 (none up to 16)."""
    for n in range(1, 2049):
        bucket, chunk = sweeps.padded_count(n), sweeps.live_chunk(1, n)
        assert bucket >= n and bucket % chunk == 0 and chunk == sweeps.live_chunk(1, bucket)
        wasted = -(-n // chunk) * chunk - n
        assert (wasted == 0) if n <= sweeps.FEWEST_PADDED else (wasted < n / 8), n
    assert [sweeps.padded_count(n) for n in (1, 5, 16, 17, 32, 33, 50, 64, 65)] == [16, 16, 16, 32, 32, 64, 64, 64,
                                                                                     128]
    assert sweeps.live_chunk(2 * sweeps.accounting.MEMORY_BUDGET // 3, 1000) == 1  # the memory budget binds too


def test_live_sum_and_live_map_are_loops_over_the_live_items_in_one_program():
    """Against a loop over the items: the same values summed (one term per live item, each exact in float32 —
    small integers — so the sums are exact) and mapped; the padding (NaN here, never to be read) stays out."""
    traces = []

    def square_plus(x):
        return {"square": x * x, "plus": x + 1.0}

    @jax.jit
    def both(items, live):
        traces.append(None)
        return sweeps.live_sum(square_plus, items, live, 4), sweeps.live_map(square_plus, items, live, 4)

    for n in (33, 35, 50, 64):
        values = np.arange(1, n + 1, dtype=np.float32)
        items = sweeps.padded(values, np.nan)
        items[-(-n // 4) * 4:] = 7.0  # past the last live chunk: never run; inside it, NaN: run and left out
        total, mapped = both(jnp.asarray(items), jnp.int32(n))
        assert float(total["square"]) == float((values**2).sum()) and float(total["plus"]) == float((values + 1).sum())
        np.testing.assert_array_equal(np.asarray(mapped["plus"])[:n], values + 1)
        assert not np.asarray(mapped["plus"])[-(-n // 4) * 4:].any()  # chunks past the live ones never ran
    assert len(traces) == 1  # 33 to 64 items: one bucket, one program


def compiled(err: str, what: str) -> int:
    """How many "compiling {what} …" lines (programs.say_compiling's) the stderr text `err` holds."""
    said = re.compile(rf"minibert: compiling( \(or loading from the compilation cache\))? {re.escape(what)} "
                      rf"\(first use for these shapes\) …")
    return sum(bool(said.fullmatch(line)) for line in err.splitlines())


def one_point_at_a_time(monkeypatch, alpha):
    """edge_attribution's α made [alpha]: EAP at one point of the path (the program EAP-IG runs, one step)."""
    monkeypatch.setattr(edges_module, "_check_method", lambda method, steps: np.array([alpha]))


@pytest.mark.slow  # each of these compiles an analysis of the tiny model: 5–15 s on the shared two cores
def test_eap_ig_steps_of_a_bucket_share_one_program_and_are_the_mean_over_their_points(classifier, monkeypatch,
                                                                                         capsys):
    """EAP (one point) and EAP-IG with 5, 7 and 8 steps: one program, one "compiling" line; the 7-step graph is the
    mean of the graphs at its points one at a time (the same program's gradients, so only the order of adding differs:
    the n gradients summed in float32, and the dot over B·T·D taken of their mean rather than of each)."""
    model = classifier
    monkeypatch.delenv(programs.QUIET, raising=False)
    before = model.programs.traces
    graphs = {0: edge_attribution(model, CLEAN, CORRUPTED, logit_difference)}
    for steps in (5, 7, 8):
        graphs[steps] = edge_attribution(model, CLEAN, CORRUPTED, logit_difference, method="eap-ig", steps=steps)
    assert model.programs.traces - before == 1
    assert compiled(capsys.readouterr().err, "edge attribution") == 1
    B, T = model.inputs(CORRUPTED).shape
    points = []
    for k in range(1, 8):
        one_point_at_a_time(monkeypatch, k / 7)
        points.append(edge_attribution(model, CLEAN, CORRUPTED, logit_difference).scores)
    reference = np.mean(points, axis=0)
    rtol = sum_rtol(7) + 2 * dot_rtol(B * T * model.config.hidden_size)
    assert np.abs(graphs[7].scores - reference).max() <= rtol * np.abs(reference).max()
    assert model.programs.traces - before == 1  # the points one at a time ran the same program
    assert np.abs(graphs[8].scores - graphs[5].scores).max() > 0  # the steps change the graph


@pytest.mark.slow
def test_faithfulness_curves_of_any_length_and_path_patching_share_one_program(classifier, capsys, monkeypatch):
    """Curves of 2 and 5 circuits and a path patch: one program (bucket 16: up to 14 circuits beside the full and
    empty graphs). Each circuit's metric is the one it gets alone: the same compiled body runs it, at another place
    of the loop, so exactly."""
    model = classifier
    monkeypatch.delenv(programs.QUIET, raising=False)
    graph = edge_attribution(model, CLEAN, CORRUPTED, logit_difference)
    capsys.readouterr()
    before = model.programs.traces
    short = circuit_faithfulness(model, CLEAN, CORRUPTED, logit_difference, graph.sweep([2, 8]))
    curve = circuit_faithfulness(model, CLEAN, CORRUPTED, logit_difference, graph.sweep([1, 2, 4, 8, 16]))
    path_patching(model, CLEAN, CORRUPTED, logit_difference, "embed", ["output"])
    assert model.programs.traces - before == 1
    assert compiled(capsys.readouterr().err, "circuit patching") == 1
    alone = [circuit_faithfulness(model, CLEAN, CORRUPTED, logit_difference, graph.circuit(top=n)).metrics[0]
             for n in (1, 2, 4, 8, 16)]
    np.testing.assert_array_equal(curve.metrics, alone)
    np.testing.assert_array_equal(short.metrics, curve.metrics[[1, 3]])
    assert (short.clean, short.empty) == (curve.clean, curve.empty)
    assert model.programs.traces - before == 1


def _replace(value, ctx, new):
    return new


@pytest.mark.slow
def test_integrated_gradients_of_a_bucket_share_one_program_and_sum_their_points(classifier, capsys, monkeypatch):
    """30 and 17 Gauss–Legendre points (bucket 32, run 2 at a time: 17 leaves 1 padding point in its last chunk),
    one program and one "compiling" line; 17 points against a loop of model.grad at each point (the bound of
    test_circuits_tokens' loop)."""
    model = classifier
    monkeypatch.delenv(programs.QUIET, raising=False)
    batch = model.tokenize(TEXTS)
    before = model.programs.traces
    token_attribution(model, batch, logit_one, steps=30, baseline="mask")
    ours = token_attribution(model, batch, logit_one, steps=17, baseline="mask")
    assert model.programs.traces - before == 1
    assert compiled(capsys.readouterr().err, "token attribution (gradients)") == 1
    ids = np.asarray(batch.input_ids)
    table = np.asarray(model.W_E)
    x = table[ids]
    x_base = np.where(np.isin(ids, [2, 3, 0])[..., None], x, table[4])  # specials kept; [MASK] is id 4
    total = np.zeros_like(x)
    for alpha, weight in zip(*integration_points(17)):
        hooks = {"embed.hook_embed": HookFn(_replace, new=x_base + alpha * (x - x_base))}
        _, grads = model.grad(batch, logit_one, "embed.hook_embed", hooks=hooks)
        total += weight * np.asarray(grads["embed.hook_embed"])
    terms = (x - x_base) * total
    scale = np.abs(terms).sum(-1).max()
    assert np.abs(ours.scores - terms.sum(-1)).max() <= gradient_rtol(model, ids.shape[1], 17) * scale


@pytest.mark.slow
def test_gradient_x_input_few_steps_and_occlusion_of_any_words_share_their_programs(classifier, capsys, monkeypatch):
    """Gradient × input (one point) and integrated gradients of 5 and 16 points: one program; occluding the words
    of texts of one batch shape but different word counts: one more. Each says "compiling" once."""
    model = classifier
    monkeypatch.delenv(programs.QUIET, raising=False)
    before = model.programs.traces
    token_attribution(model, ["a b c", "d"], logit_one, method="gradient_x_input")
    for steps in (5, 16):
        token_attribution(model, ["a b c", "d"], logit_one, steps=steps)
    few, many = ["ab c", "d"], ["a b c", "d"]  # [CLS] a ##b c [SEP] and [CLS] a b c [SEP]: one shape
    assert model.inputs(few).shape == model.inputs(many).shape
    words = [token_attribution(model, texts, logit_one, method="occlusion", words=True) for texts in (few, many)]
    assert [len(w.labels[0]) for w in words] == [4, 5]
    assert model.programs.traces - before == 2
    err = capsys.readouterr().err
    assert compiled(err, "token attribution (gradients)") == compiled(err, "token attribution (occlusion)") == 1

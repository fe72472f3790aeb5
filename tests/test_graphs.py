"""Attribution graphs (analysis.graphs) on a post-LN BERT and a pre-LN ModernBERT, tiny and random, with random
transcoders (a graph must be exact for any parameters): the replacement reproduces the run; every edge equals a
forward-mode derivative (jax.jvp) of the frozen replacement along that one source; each node's pre-activation is
the sum of its edges and its bias; pruning and scores against a graph computed by hand; steering the model agrees
with the graph's linear prediction; the JSON loads in circuit-tracer's own reader; bad input gets one error."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_hf_model
from references import reference_library
from test_families_modern import make_modernbert
from tolerances import U32, assert_close_to_scale, dot_rtol, forward_rtol, head_rtol

import minibert
from minibert.analysis import graphs
from minibert.analysis import transcoders as tcs
from minibert.analysis.graphs import attribution, pruning, replacement
from minibert.errors import AnalysisError

T, S = 6, 24


def random_transcoders(model, *, skip: bool = True, architecture: str = "relu", seed: int = 0):
    """One random transcoder per block: unit decoder rows, encoder their transpose, b_enc −0.3 (so a fraction of
    latents is active), a small random skip."""
    D, out = model.config.hidden_size, []
    for layer in range(model.config.num_hidden_layers):
        config = tcs.TranscoderConfig(d_in=D, d_sae=S, d_out=D, layer=layer, architecture=architecture, k=4,
                                      skip=skip)
        params = tcs.init_params(config, seed=seed + layer)
        params["b_enc"] = jnp.full(S, -0.3)
        params["b_dec"] = 0.1 * jax.random.normal(jax.random.key(100 + layer), (D,))
        if skip:
            params["W_skip"] = 0.05 * jax.random.normal(jax.random.key(200 + layer), (D, D))
        out.append((config, params))
    return out


def one_row(ids):
    ids = np.asarray(ids)[None]
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-mlm")
    make_hf_model(directory, "BertForMaskedLM", scale=0.2)
    model = minibert.load(directory)
    batch = one_row([2, 11, 4, 23, 17, 3])  # [CLS] … [MASK] … [SEP]
    transcoders = random_transcoders(model)
    targets = [graphs.mlm_target(model, batch, token=7, minus=9),
               graphs.direction_target(np.random.default_rng(3).normal(size=model.config.hidden_size))]
    before = model.programs.traces
    graph = graphs.attribute(model, batch, transcoders, targets)
    assert model.programs.traces - before == 2  # the run, and every row of the graph: two compiled programs
    return model, batch, transcoders, targets, graph


@pytest.fixture(scope="module")
def modern(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-modern")
    make_modernbert(directory, "ForMaskedLM", scale=0.2)
    model = minibert.load(directory)
    batch = {"input_ids": np.array([[1, 12, 30, 8, 21, 2]]), "attention_mask": np.ones((1, T), int)}
    transcoders = random_transcoders(model, seed=5)
    targets = [graphs.mlm_target(model, batch, token=7, minus=9, position=2),
               graphs.direction_target(np.random.default_rng(4).normal(size=model.config.hidden_size), "cls")]
    return model, batch, transcoders, targets, graphs.attribute(model, batch, transcoders, targets)


FAMILIES = ["bert", pytest.param("modern", marks=pytest.mark.slow)]  # modern: a second fixture, ~40 s more


def recorded(model, batch):
    """The run's own values (run_with_cache, no graph code): what the replacement must reproduce."""
    s = replacement.sites(model)
    out, cache = model.run_with_cache(batch, replacement.record_names(s))
    return out, {n: jnp.asarray(cache[n]) for n in replacement.record_names(s)}, s


def frozen_replacement(model, batch, transcoders):
    """(R, embed, writes, g): the frozen replacement as a function of (embeddings, writes), its inputs at the run,
    and the targets' readout gradients at the run — built from run_with_cache's values."""
    out, cache, s = recorded(model, batch)
    tc = replacement.check_transcoders(model, transcoders)
    x = jnp.stack([cache[n][0] for n in s.mlp_in])
    y = jnp.stack([cache[n][0] for n in s.mlp_out])
    f = jnp.stack([tcs.encode(c, p, x[i]) for i, (c, p) in enumerate(transcoders)])
    errors = y - jnp.stack([tcs.forward(c, p, x[i]) for i, (c, p) in enumerate(transcoders)])
    frozen = {n: cache[n] for n in (*s.patterns, *s.scales)}
    inputs = model.inputs(batch)

    def R(embed, writes):
        return replacement.replacement(model, model.state, inputs, frozen, tc.stacked, s, embed, writes)

    embed = cache["hook_full_embed"][0]
    writes = replacement.writes_of(tc.stacked, f, errors)
    return jax.jit(R), embed, writes, f, errors, (frozen, s, tc, cache, y)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_replacement_reproduces_the_run(request, family):
    model, batch, transcoders, _, _ = request.getfixturevalue(family)
    R, embed, writes, f, errors, (_, s, _, cache, y) = frozen_replacement(model, batch, transcoders)
    x, h = R(embed, writes)
    # the replacement runs the same stages with recorded values put back: one program against another (2 programs)
    rtol = forward_rtol(model.config, S=T)
    assert_close_to_scale(x, jnp.stack([cache[n][0] for n in s.mlp_in]), rtol, "MLP inputs")
    assert_close_to_scale(h, cache[s.final][0], rtol, "last hidden state")
    # error nodes: transcoder output + ε is the MLP's output (one subtraction and one addition: 2 roundings)
    y_hat = jnp.stack([tcs.forward(c, p, x_l) for (c, p), x_l in zip(transcoders, jnp.stack(
        [cache[n][0] for n in s.mlp_in]))])
    assert_close_to_scale(y_hat + errors, y, 2 * U32, "ŷ + ε")
    assert float(jnp.abs(errors).max()) > 0.1  # random transcoders: the error nodes carry real weight


def test_the_replacement_is_affine(bert):
    """Doubling every source doubles what it adds: R(2e, 2w) − R(0, 0) = 2 (R(e, w) − R(0, 0))."""
    model, batch, transcoders, _, _ = bert
    R, embed, writes, *_ = frozen_replacement(model, batch, transcoders)
    x1, h1 = R(embed, writes)
    x2, h2 = R(2 * embed, 2 * writes)
    x0, h0 = R(0 * embed, 0 * writes)
    assert_close_to_scale(h2 - h0, 2 * (h1 - h0), 4 * forward_rtol(model.config, S=T, programs=1), "affine")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_edge_is_the_replacement_derivative_along_that_source(request, family):
    """Brute force: each edge against jax.jvp of the frozen replacement with the source's vector as the only
    tangent (forward mode: no vjp, no row program)."""
    model, batch, transcoders, targets, graph = request.getfixturevalue(family)
    R, embed, writes, f, errors, (frozen, s, tc, _, _) = frozen_replacement(model, batch, transcoders)
    D = model.config.hidden_size
    _, h = R(embed, writes)
    g = [jax.grad(lambda hh, t=t: t(replacement.readout(model, model.state, frozen, s, hh)))(h) for t in targets]
    n_sources = graph.token_slice.stop
    rng = np.random.default_rng(0)
    sources = rng.choice(n_sources, size=min(n_sources, 20), replace=False)
    W_enc = tc.stacked["W_enc"][graph.active_features[:, 0], :, graph.active_features[:, 2]]  # [N, D]
    at = (graph.active_features[:, 0], graph.active_features[:, 1])

    @jax.jit
    def derivative(t_embed, t_writes):
        """The features' pre-activations and the targets' linear parts moved along the tangent, and the sums of
        their terms' magnitudes (each a dot product over D, or over T·D for a target)."""
        _, (dx, dh) = jax.jvp(R, (embed, writes), (t_embed, t_writes))
        terms = [dx[at] * W_enc] + [(gk * dh).ravel()[None] for gk in g]
        return jnp.concatenate([t.sum(-1) for t in terms]), jnp.concatenate([jnp.abs(t).sum(-1) for t in terms])

    checked = 0
    for src in sources:
        t_embed, t_writes = jnp.zeros_like(embed), jnp.zeros_like(writes)
        if src < graph.n_features:
            layer, pos, latent = graph.active_features[src]
            # the graph's own activation a_s: the test's run computes it again, and an activation just above its
            # threshold (x·W_enc ≈ −b_enc) differs between two programs by far more than its own relative rounding
            t_writes = t_writes.at[layer, pos].set(graph.activations[src] * tc.stacked["W_dec"][layer, latent])
        elif src < graph.error_slice.stop:
            layer, pos = divmod(src - graph.n_features, T)
            t_writes = t_writes.at[layer, pos].set(errors[layer, pos])
        else:
            pos = src - graph.error_slice.stop
            t_embed = t_embed.at[pos].set(embed[pos])
        expected, magnitude = (np.asarray(v, np.float64) for v in derivative(t_embed, t_writes))
        ours = graph.adjacency[np.r_[np.arange(graph.n_features), np.arange(-graph.n_targets, 0)], src]
        # the same derivative by the other mode of differentiation (a vjp row against a jvp column): each entry a
        # dot product of a vector carried through L blocks and ≤ 2L frozen LayerNorms (forward_rtol, 2 programs)
        # with an encoder row or readout gradient (dot_rtol over T·D), relative to the sum of its terms' magnitudes
        bound = (forward_rtol(model.config, S=T) + dot_rtol(T * D)) * magnitude
        assert np.all(np.abs(ours - expected) <= bound), (graph.node_label(src), np.abs(ours - expected) - bound)
        checked += len(expected)
    assert checked >= 200


@pytest.mark.parametrize("family", FAMILIES)
def test_each_node_is_the_sum_of_its_edges_and_bias(request, family):
    """Completeness: pre_n = Σ_s w_{s→n} + bias_n, pre_n from the run (a feature's, encoded here from the captured
    input) and bias_n from the replacement run with every source zero."""
    model, batch, transcoders, _, graph = request.getfixturevalue(family)
    _, cache, s = recorded(model, batch)
    layer, pos, latent = graph.active_features.T
    x = np.stack([np.asarray(cache[n][0]) for n in s.mlp_in])
    W_enc = np.stack([np.asarray(p["W_enc"]) for _, p in transcoders])
    b_enc = np.stack([np.asarray(p["b_enc"]) for _, p in transcoders])
    pre = np.einsum("ND,NDi->Ni", x[layer, pos].astype(np.float64), W_enc[layer].astype(np.float64))
    pre = pre[np.arange(len(latent)), latent] + b_enc[layer, latent]
    rows = np.r_[np.arange(graph.n_features), np.arange(-graph.n_targets, 0)]
    total = graph.adjacency[rows].sum(1) + graph.bias[rows]
    # the sum of ≤ N + L·T + T terms each carrying the row's rounding: sum_rtol-like bound on the sum of |terms|
    magnitude = np.abs(graph.adjacency[rows]).sum(1) + np.abs(graph.bias[rows])
    n_terms = graph.adjacency.shape[1] + 1
    bound = (forward_rtol(model.config, S=T) + dot_rtol(n_terms)) * magnitude
    assert np.all(np.abs(total - graph.pre_activations[rows]) <= bound), np.abs(total - graph.pre_activations[rows])
    assert np.allclose(graph.pre_activations[:graph.n_features], pre, rtol=0,
                       atol=forward_rtol(model.config, S=T) * np.abs(pre).max())
    assert graph.n_features > 10 and np.all(graph.activations > 0)


def test_the_direction_target_has_no_remainder_and_the_mlm_one_does(bert):
    """A sentence-vector direction is affine in the last hidden state (BERT's last LayerNorm frozen): its value is
    its linear part; the MLM head's gelu leaves a remainder."""
    model, batch, _, targets, graph = bert
    out = model(batch)
    assert graph.target_values[0] == pytest.approx(float(out.logits[0, 2, 7] - out.logits[0, 2, 9]),
                                                   abs=head_rtol(model.config, S=T) * 10)
    assert abs(graph.remainder[1]) <= forward_rtol(model.config, S=T) * np.abs(graph.adjacency[-1]).sum()
    assert abs(graph.remainder[0]) > 1e-3


def test_new_tokens_reuse_the_programs(bert):
    """Two programs per graph, compiled once: another target token or direction compiles nothing."""
    model, batch, transcoders, targets, _ = bert
    before = model.programs.traces
    graphs.attribute(model, batch, transcoders, [graphs.mlm_target(model, batch, token=12, minus=13), targets[1]])
    assert model.programs.traces == before


# ---- pruning and scores against a graph computed by hand ----------------------------------------------------

def hand_graph() -> attribution.AttributionGraph:
    """1 layer, 2 positions: features f0 (layer 0, pos 0), f1 (layer 0, pos 1); errors e0, e1; tokens t0, t1;
    one target. Edges (row ← column): f0 ← t0 (2), f1 ← t1 (1), f1 ← e0 (1); target ← f0 (3), f1 (−1), e1 (1)."""
    A = np.zeros((7, 7), np.float32)
    A[0, 4] = 2.0
    A[1, 5], A[1, 2] = 1.0, 1.0
    A[6, 0], A[6, 1], A[6, 3] = 3.0, -1.0, 1.0
    return attribution.AttributionGraph(A, np.array([[0, 0, 0], [0, 1, 1]]), np.array([1.0, 1.0]), np.zeros(7),
                                        np.zeros(7), ["target"], np.zeros(1), np.ones(1), np.array([2, 3]),
                                        ["a", "b"], 1, 2)


def test_influence_and_scores_by_hand():
    """Â rows: target (3, 1, 1)/5; f0 ← t0 1; f1 ← t1 ½, e0 ½. Influence from the target w = e_target:
    f0 0.6, f1 0.2, e1 0.2 (one step); then t0 0.6, t1 0.1, e0 0.1 (two steps)."""
    graph = hand_graph()
    influence = pruning.influence(pruning.normalized(graph.adjacency), pruning._target_weights(graph))
    assert np.allclose(influence, [0.6, 0.2, 0.1, 0.2, 0.6, 0.1, 0.0])
    replacement_score, completeness = graphs.graph_scores(graph)
    assert replacement_score == pytest.approx(0.7 / (0.7 + 0.3))
    # non-error fraction per row: f0 1, f1 ½, target 4/5, others 1; weighted by influence + w (target 1)
    weighted = np.array([0.6, 0.2, 0.1, 0.2, 0.6, 0.1, 1.0])
    fractions = np.array([1, 0.5, 1, 1, 1, 1, 0.8])
    assert completeness == pytest.approx((weighted * fractions).sum() / weighted.sum())


def test_pruning_by_hand():
    """node_threshold 0.7: influences sorted 0.6, 0.6, 0.2, 0.2, 0.1, 0.1 of 1.8 cover 0.333, 0.667, 0.778: the
    threshold is 0.2, keeping f0, f1, e1 (and tokens, target). Edges among them: target ← f0 (score 0.6), ← f1
    (0.2), ← e1 (0.2), f0 ← t0 (0.6), f1 ← t1 (Â = 1 once e0 is gone, times 0.2); edge_threshold 0.6 of 1.8
    total keeps those ≥ 0.6: target ← f0 and f0 ← t0; f1 and e1 lose their outgoing edges and go."""
    pruned = graphs.prune(hand_graph(), node_threshold=0.7, edge_threshold=0.6)
    assert pruned.node_mask.tolist() == [True, False, False, False, True, True, True]
    assert sorted(zip(*np.nonzero(pruned.edge_mask))) == [(0, 4), (6, 0)]
    assert np.isclose(pruned.cumulative_scores[0], 0.6 / 1.8) or np.isclose(pruned.cumulative_scores[0], 1.2 / 1.8)


def test_an_empty_graph_after_pruning_is_refused(bert):
    model, batch, transcoders, _, _ = bert
    nothing = [graphs.mlm_target(model, batch, token=7, minus=9), graphs.direction_target(np.zeros(32))]
    graph = graphs.attribute(model, batch, transcoders, nothing, target_weights=[0.0, 1.0])  # the fixture's programs
    with pytest.raises(AnalysisError, match="empty"):
        graphs.prune(graph)


# ---- interventions on the model ---------------------------------------------------------------------------------

def test_steering_agrees_with_the_linear_prediction(bert):
    """Steer the feature with the largest edge into the MLM target by δ and δ/2 (attention and σ held): the direction
    target (affine readout) moves as predicted to rounding; the MLM target's miss shrinks faster than δ (second
    order: the head's gelu)."""
    model, batch, transcoders, _, graph = bert
    n = graph.n_features
    node = int(np.argmax(np.abs(graph.adjacency[-2, :n]) * (graph.active_features[:, 0] == 0)))
    key = tuple(int(v) for v in graph.active_features[node])
    delta = 0.2 * float(graph.activations[node])
    misses = []
    for amount in (delta, delta / 2):
        result = graphs.intervene(model, batch, transcoders, graph, {key: amount})
        misses.append(np.abs(result.change - result.predicted))
        scale = np.abs(graph.adjacency[-2:]).sum(1) + np.abs(result.clean)
        assert misses[-1][1] <= 4 * head_rtol(model.config, S=T) * scale[1], (result.change, result.predicted)
        assert abs(result.predicted[0]) > 1e-3
    assert misses[1][0] < 0.5 * misses[0][0] + 4 * head_rtol(model.config, S=T) * scale[0]


def test_an_unchanged_run_and_ablation(bert):
    """Clamping a feature to its own value changes nothing; ablating it changes the target as the graph says for an
    affine readout, with attention held (freeze=True)."""
    model, batch, transcoders, _, graph = bert
    key = tuple(int(v) for v in graph.active_features[0])
    same = graphs.intervene(model, batch, transcoders, graph, {key: float(graph.activations[0])}, mode="clamp")
    assert np.allclose(same.change, 0, atol=4 * head_rtol(model.config, S=T) * np.abs(same.clean).max())
    assert np.all(same.predicted == 0)  # c = v − a = 0 and the clamped feature ignores its inputs
    live = graphs.intervene(model, batch, transcoders, graph, {key: 0.0}, mode="clamp", freeze=False)
    assert np.all(np.isfinite(live.change))


# ---- export and figure -------------------------------------------------------------------------------------------

def test_json_loads_in_circuit_tracer(bert, tmp_path):
    model, _, _, _, graph = bert
    path = graphs.write_json(graph, tmp_path / "g.json", slug="tiny", node_threshold=0.9, edge_threshold=0.99)
    data = json.loads(path.read_text())
    ids = {node["node_id"] for node in data["nodes"]}
    assert all(link["source"] in ids and link["target"] in ids for link in data["links"])
    assert sum(node["feature_type"] == "embedding" for node in data["nodes"]) == T
    assert [n["node_id"] for n in data["nodes"] if n["feature_type"] == "logit"] == ["3_7_2", f"3_{99 + 1}_0"]
    with pytest.raises(AnalysisError, match="overwrite"):
        graphs.write_json(graph, path, slug="tiny")
    every = graphs.graph_json(graph, slug="all", node_threshold=1.0, edge_threshold=1.0)  # nothing pruned
    node_ids = [node["node_id"] for node in every["nodes"]]
    assert len(node_ids) == len(set(node_ids))  # circuit-tracer's error id "0_{layer}_{pos}" named two nodes
    assert any(node["feature_type"] == "mlp reconstruction error" for node in every["nodes"])
    pruned = graphs.prune(graph)
    for write in (lambda g: graphs.write_json(g, tmp_path / "p.json", slug="p"), graphs.graph_scores):
        with pytest.raises(AnalysisError, match="not a PrunedGraph.*pass pruned.graph"):
            write(pruned)
    graph_models = reference_library("circuit_tracer.frontend.graph_models")
    loaded = graph_models.Model.model_validate_json(path.read_text())
    assert len(loaded.nodes) == len(data["nodes"]) and len(loaded.links) == len(data["links"])


def test_figure_refuses_to_overwrite(bert, tmp_path):
    from minibert import viz
    from minibert.viz import VizError

    _, _, _, _, graph = bert
    pruned = graphs.prune(graph, node_threshold=0.9)
    path = viz.graphs.graph_figure(pruned, path=tmp_path / "g.png") and tmp_path / "g.png"
    assert path.stat().st_size > 1000
    with pytest.raises(VizError, match="overwrite"):
        viz.graphs.graph_figure(pruned, path=path)
    viz.graphs.graph_figure(pruned, path=path, overwrite=True)


# ---- bad input ---------------------------------------------------------------------------------------------------

def test_bad_transcoders_are_refused(bert):
    model, batch, transcoders, targets, _ = bert
    config, params = transcoders[1]
    cases = {
        "another model": [transcoders[0], (tcs.TranscoderConfig(d_in=16, d_sae=S, d_out=16, layer=1,
                                                                architecture="relu"), params)],
        "block order": [transcoders[0], transcoders[0]],
        "another site": [transcoders[0], (tcs.TranscoderConfig(d_in=32, d_sae=S, d_out=32, layer=1, architecture="relu",
                                                               hook_in="blocks.1.ln2.hook_out"), params)],
        "NaN": [transcoders[0], (config, params | {"W_enc": params["W_enc"].at[0, 0].set(jnp.nan)})],
        "one per block": transcoders[:1],
    }
    messages = {"another model": "another model", "block order": "block order", "another site": "another site",
                "NaN": "NaN", "one per block": "one per block"}
    for case, given in cases.items():
        with pytest.raises(AnalysisError, match=messages[case]):
            graphs.attribute(model, batch, given, targets)


def test_transcoders_of_other_weights_are_refused_unless_asked(bert):
    """A tester's finding: transcoders whose config records other model weights (trained on a fine-tune, say)
    built a graph of this model in silence; spliced_fidelity refuses them. Both now refuse unless other_weights."""
    import dataclasses

    model, batch, transcoders, targets, graph = bert
    other = [(dataclasses.replace(config, weights="deadbeefdeadbeef"), params) for config, params in transcoders]
    with pytest.raises(AnalysisError, match="trained on the model weights deadbeefdeadbeef.*other_weights=True"):
        graphs.attribute(model, batch, other, targets)
    key = tuple(int(v) for v in graph.active_features[0])
    with pytest.raises(AnalysisError, match="other_weights=True"):
        graphs.intervene(model, batch, other, graph, {key: 0.0}, mode="clamp")
    again = graphs.attribute(model, batch, other, targets, other_weights=True)
    np.testing.assert_array_equal(again.adjacency, graph.adjacency)  # the same program on the same arrays


def test_a_target_reading_a_missing_head_is_refused(tmp_path):
    make_hf_model(tmp_path, "BertModel", scale=0.2)
    model = minibert.load(tmp_path)
    batch = one_row([2, 11, 4, 23, 17, 3])
    with pytest.raises(AnalysisError, match="no head"):
        graphs.attribute(model, batch, random_transcoders(model), graphs.mlm_target(model, batch, token=7))


def test_bad_targets_are_refused(bert):
    model, batch, transcoders, _, _ = bert
    with pytest.raises(AnalysisError, match="graphs.mlm_target"):
        graphs.attribute(model, batch, transcoders, graphs.class_target(1, minus=0))
    with pytest.raises(AnalysisError, match="position"):
        graphs.mlm_target(model, batch, token=7, position=T)
    with pytest.raises(AnalysisError, match="hidden states have"):
        graphs.attribute(model, batch, transcoders, graphs.direction_target(np.ones(5)))
    with pytest.raises(AnalysisError, match="one input"):
        graphs.attribute(model, {k: np.repeat(v, 2, 0) for k, v in batch.items()}, transcoders,
                         graphs.direction_target(np.ones(model.config.hidden_size)))


@pytest.mark.slow
def test_a_classifier_target_through_the_pooler(tmp_path):
    """A class-logit difference read through the pooler's tanh, linearised at the run: its value is the model's, each
    of its edges the jvp of the frozen replacement read by the readout's gradient, and its pre-activation ⟨g, h⟩ the
    sum of its edges and bias."""
    make_hf_model(tmp_path, "BertForSequenceClassification", scale=0.2, num_labels=3)
    model = minibert.load(tmp_path)
    batch = one_row([2, 11, 4, 23, 17, 3])
    transcoders = random_transcoders(model, seed=9)
    graph = graphs.attribute(model, batch, transcoders, graphs.class_target(2, minus=0))
    logits = np.asarray(model(batch).logits)[0]
    assert graph.target_values[0] == pytest.approx(logits[2] - logits[0], abs=head_rtol(model.config, S=T) * 10)
    row = graph.adjacency[-1]
    magnitude = np.abs(row).sum() + abs(graph.bias[-1])
    assert abs(row.sum() + graph.bias[-1] - graph.pre_activations[-1]) <= \
        (forward_rtol(model.config, S=T) + dot_rtol(row.size)) * magnitude
    assert abs(graph.remainder[0]) > 1e-4  # the classifier's bias and the tanh's curvature
    R, embed, writes, f, errors, (frozen, s, tc, _, _) = frozen_replacement(model, batch, transcoders)
    _, h = R(embed, writes)
    g = jax.grad(lambda hh: graph.targets[0](replacement.readout(model, model.state, frozen, s, hh)))(h)
    pos = 3
    _, (_, dh) = jax.jvp(R, (embed, writes), (jnp.zeros_like(embed).at[pos].set(embed[pos]), jnp.zeros_like(writes)))
    expected = float((g * dh).sum())
    ours = row[graph.token_slice.start + pos]
    assert abs(ours - expected) <= (forward_rtol(model.config, S=T) + dot_rtol(T * model.config.hidden_size)) * \
        float(jnp.abs(g * dh).sum())


def test_pruning_and_scores_match_circuit_tracer(bert):
    """circuit-tracer's own prune_graph and compute_graph_scores on our adjacency (its Graph built from ours) keep
    the same nodes and edges and report the same scores (theirs in float32, ours in float64: rtol from float32's
    rounding of sums over ≤ n nodes)."""
    torch = reference_library("torch")
    ct_graph = reference_library("circuit_tracer.graph")
    from circuit_tracer.attribution.targets import LogitTarget
    from circuit_tracer.utils.tl_nnsight_mapping import UnifiedConfig

    model, _, _, _, graph = bert
    c = model.config
    cfg = UnifiedConfig(n_layers=graph.n_layers, d_model=c.hidden_size, d_head=c.head_dim,
                        n_heads=c.num_attention_heads, d_mlp=c.intermediate_size, d_vocab=graph.vocab_size,
                        tokenizer_name="", model_name="", original_architecture="BertForMaskedLM")
    theirs = ct_graph.Graph(input_string="", input_tokens=torch.tensor(graph.input_ids),
                            active_features=torch.tensor(graph.active_features),
                            adjacency_matrix=torch.tensor(graph.adjacency), cfg=cfg, vocab_size=graph.vocab_size,
                            selected_features=torch.arange(graph.n_features),
                            activation_values=torch.tensor(graph.activations, dtype=torch.float32),
                            logit_targets=[LogitTarget("a", 7), LogitTarget("b", graph.vocab_size + 1)],
                            logit_probabilities=torch.tensor(graph.target_weights), scan="test")
    for node_threshold, edge_threshold in ((0.8, 0.98), (0.5, 0.9)):
        node_mask, edge_mask, cumulative = ct_graph.prune_graph(theirs, node_threshold, edge_threshold)
        ours = graphs.prune(graph, node_threshold, edge_threshold)
        assert np.array_equal(ours.node_mask, node_mask.numpy())
        assert np.array_equal(ours.edge_mask, edge_mask.numpy())
        assert np.allclose(ours.cumulative_scores, cumulative.numpy(), atol=graph.adjacency.shape[0] * U32)
    replacement_score, completeness = ct_graph.compute_graph_scores(theirs)
    ours = graphs.graph_scores(graph)
    assert ours == pytest.approx((replacement_score, completeness), rel=graph.adjacency.shape[0] * U32)


# ---- what a first-time user's mistakes get (a docs-only tester's findings) --------------------------------------

def test_write_json_refuses_paths_it_cannot_write(bert, tmp_path):
    graph = bert[4]
    (tmp_path / "adir").mkdir()
    with pytest.raises(AnalysisError, match="is a folder") as refused:
        graphs.write_json(graph, tmp_path / "adir", slug="tiny")
    assert "overwrite" not in str(refused.value)  # overwrite=True cannot replace a directory
    (tmp_path / "afile").write_text("x")
    with pytest.raises(AnalysisError, match="cannot write"):
        graphs.write_json(graph, tmp_path / "afile" / "g.json", slug="tiny")
    with pytest.raises(AnalysisError, match="cannot write"):
        graphs.write_json(graph, "/proc/minibert-test.json", slug="tiny")
    with pytest.raises(AnalysisError, match="path"):
        graphs.write_json(graph, 5, slug="tiny")
    assert (tmp_path / "afile").read_text() == "x" and not any((tmp_path / "adir").iterdir())


@pytest.mark.parametrize("chunk", ["4", 0, -3, 2.5, True])
def test_attribute_refuses_a_chunk_that_is_no_whole_number(bert, chunk):
    model, batch, transcoders, targets, _ = bert
    with pytest.raises(AnalysisError, match=f"chunk={chunk!r} must be a whole number ≥ 1"):
        graphs.attribute(model, batch, transcoders, targets, chunk=chunk)


# ---- a docs-only tester's findings -------------------------------------------------------------------------------

def test_intervene_takes_the_graphs_own_labels_and_reports_the_change(bert):
    """A feature is named by the tuple, by its label "F l.t.i" (as pruned.edges() shows it) or by its JSON node_id
    "l_i_t": the two runs below change the same two features, so they are the same program on the same arrays;
    the result's change field (next to predicted) is intervened − clean. An inactive or unreadable key is refused
    naming the accepted forms."""
    import dataclasses

    model, batch, transcoders, _, graph = bert
    first, second = (tuple(int(v) for v in graph.active_features[i]) for i in (0, graph.n_features - 1))
    by_tuple = graphs.intervene(model, batch, transcoders, graph, {first: 0.0, second: 0.5}, mode="clamp")
    label = graph.node_label(0)
    assert label == "F {}.{}.{}".format(*first)
    json_id = f"{second[0]}_{second[2]}_{second[1]}"
    assert json_id in {node["node_id"] for node in graphs.graph_json(graph, slug="x", node_threshold=1.0,
                                                                     edge_threshold=1.0)["nodes"]}
    by_label = graphs.intervene(model, batch, transcoders, graph, {label: 0.0, json_id: 0.5}, mode="clamp")
    np.testing.assert_array_equal(by_label.intervened, by_tuple.intervened)
    np.testing.assert_array_equal(by_label.predicted, by_tuple.predicted)
    assert [field.name for field in dataclasses.fields(by_tuple)][-2:] == ["change", "predicted"]
    np.testing.assert_array_equal(by_tuple.change, by_tuple.intervened - by_tuple.clean)
    inactive = next(i for i in range(S) if not ((graph.active_features == (first[0], first[1], i)).all(1)).any())
    with pytest.raises(AnalysisError, match=rf"F {first[0]}\.{first[1]}\.{inactive} .*not active.*active at that "
                                            rf"layer and position: F {first[0]}\.{first[1]}\.{first[2]}"):
        graphs.intervene(model, batch, transcoders, graph, {f"F {first[0]}.{first[1]}.{inactive}": 0.0})
    for bad in ("feature 3", (0, 1), "F 1.2", (0, 1.5, 2)):
        with pytest.raises(AnalysisError, match=r"names no feature; name one as \(layer, position, latent\), "
                                                r"'F layer\.position\.latent'.*node_id of write_json"):
            graphs.intervene(model, batch, transcoders, graph, {bad: 0.0})
    with pytest.raises(AnalysisError, match="must be a finite number"):
        graphs.intervene(model, batch, transcoders, graph, {first: np.nan})
    for amount, mode in ((1e300, "clamp"), (-1e39, "steer")):  # finite in float64, ±inf in the model's float32
        with pytest.raises(AnalysisError, match=r"beyond float32's range \(±3\.4e\+38\), the model's"):
            graphs.intervene(model, batch, transcoders, graph, {first: amount}, mode=mode)
    with pytest.raises(AnalysisError, match="overflowed float32 in the model"):  # a float32 value, inf downstream
        graphs.intervene(model, batch, transcoders, graph, {first: 3e38}, mode="clamp")


def test_a_target_prints_short(bert):
    """repr(Target): label, kind, each scalar's value, a vector's shape and norm — not its values."""
    _, _, _, targets, _ = bert
    mlm, direction = targets
    assert repr(mlm) == (f"Target({mlm.label!r}, kind=mlm, minus=9, position={int(mlm.arrays['position'])}, "
                         f"sign=1, token=7)")
    norm = float(np.linalg.norm(np.asarray(direction.arrays["direction"])))
    assert repr(direction) == f"Target({direction.label!r}, kind=direction_mean, direction=[32] norm {norm:.4g})"


def test_the_json_prompt_is_the_input_text(bert, tmp_path):
    """write_json's "prompt" is the input's text: the ids decoded where the graph was given ids (the fixture), the
    text (and its pair) where it was given text; a prompt= given is written as is, quotes and markup included."""
    from minibert.analysis.graphs.attribution import _prompt

    model, batch, _, _, graph = bert
    decoded = model.tokenizer.decode([int(i) for i in batch["input_ids"][0]])
    assert graph.prompt == decoded and decoded
    written = graphs.write_json(graph, tmp_path / "g.json", slug="tiny")
    assert json.loads(written.read_text())["metadata"]["prompt"] == decoded
    text = 'the "capital" of <b>france</b> is [MASK] .'
    assert json.loads(graphs.write_json(graph, tmp_path / "t.json", slug="t", prompt=text).read_text())[
        "metadata"]["prompt"] == text
    ids = graph.input_ids
    assert _prompt(model, text, ids) == text and _prompt(model, [text], ids) == text
    assert _prompt(model, model.tokenize(["first part"], ["second part"]), ids) == "first part second part"


def test_a_figure_path_that_is_no_path_is_refused(bert, tmp_path):
    from minibert import viz
    from minibert.viz import VizError

    pruned = graphs.prune(bert[4], node_threshold=0.9)
    with pytest.raises(VizError, match=r"must be a str or pathlib.Path, such as 'out.png'; got int 5"):
        viz.graphs.graph_figure(pruned, path=5)
    with pytest.raises(VizError, match=r"must end in .png, .svg or .pdf"):
        viz.graphs.graph_figure(pruned, path=tmp_path / "g.txt")

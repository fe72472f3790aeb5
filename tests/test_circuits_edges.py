"""Edge attribution patching, circuits, faithfulness and path patching (analysis.circuits.edges).

References that do not share the code under test: the frozen skip path rebuilt here in NumPy from the clean
run's σ and the layernorm gains, each receiver's input changed through the model's own weights (q = x·W_Q + b_Q,
the MLP's hook_pre = x·W_in + b_in, post-LN BERT) by a hook, and jax.jvp of the metric along that change."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_hf_model
from test_families_modern import make_modernbert
from tolerances import dot_rtol, forward_rtol

import minibert
from minibert.analysis import interventions
from minibert.analysis.circuits import circuit_faithfulness, edge_attribution, path_patching
from minibert.analysis.circuits.edges import receiver_labels, sender_labels
from minibert.core.hooks import HookFn
from minibert.errors import AnalysisWarning

CLEAN = ["abc de f", "hello world"]
CORRUPTED = ["abc xy f", "hello there world"]  # longer: the clean rows are padded to align


def logit_difference(out):
    return out.logits[:, 1] - out.logits[:, 0]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-classifier")
    make_hf_model(directory, "BertForSequenceClassification", scale=0.3)
    return minibert.load(directory)


def aligned(model):
    length = max(model.inputs(CLEAN).shape[1], model.inputs(CORRUPTED).shape[1])
    return model.padded(CLEAN, length), model.padded(CORRUPTED, length)


def carried_changes(model):
    """{sender label: {"attn_in": [L] arrays, "mlp_in": [L], "final": array}} — each sender's corrupted − clean
    output (zero where the clean row pads) carried in NumPy through LN maps γ ⊙ (x − mean)/σ_clean."""
    clean, corrupt = aligned(model)
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    names = ["hook_full_embed", "blocks.*.attn.hook_result", "blocks.*.hook_mlp_out", "blocks.*.ln1.hook_scale",
             "blocks.*.ln2.hook_scale"]
    _, c = model.run_with_cache(clean, names)
    _, k = model.run_with_cache(corrupt, names)
    real = np.asarray(clean.attention_mask, np.float64)[:, :, None]
    sigma = [np.asarray(c.stack(f"{n}.hook_scale"), np.float64) for n in ("ln1", "ln2")]
    gamma = [np.asarray(model.layer_weights(f"{n}.scale"), np.float64) for n in ("ln1", "ln2")]

    def norm(j, layer, x):
        return gamma[j][layer] * (x - x.mean(-1, keepdims=True)) / sigma[j][layer]

    def carry(start_layer, start_after_attention, vector):
        points = {"attn_in": [0 * vector] * L, "mlp_in": [0 * vector] * L}
        x = vector
        for layer in range(start_layer, L):
            if not (layer == start_layer and start_after_attention is not None):
                points["attn_in"][layer] = x
            if not (layer == start_layer and start_after_attention is False):
                x = norm(0, layer, x)
                points["mlp_in"][layer] = x
            x = norm(1, layer, x)
        points["final"] = x
        return points

    def change(name, index=()):
        return real * (np.asarray(k[name], np.float64)[index] - np.asarray(c[name], np.float64)[index])

    carried = {"embed": carry(0, None, change("hook_full_embed"))}
    for layer in range(L):
        for h in range(H):
            carried[sender_labels(L, H)[1 + layer * (H + 1) + h]] = carry(
                layer, True, change(f"blocks.{layer}.attn.hook_result", (slice(None), slice(None), h)))
        carried[f"MLP {layer + 1}"] = carry(layer, False, change(f"blocks.{layer}.hook_mlp_out"))
    return carried


def _add_head_part(value, ctx, t, change, layer, head):
    """q, k or v [B, T, H, K] of block `layer` with head `head`'s part moved by t·change [B, T, K]."""
    at = (jnp.arange(value.shape[2]) == head)[None, None, :, None] & (ctx.layer == layer)
    return value + jnp.where(at, t * change[:, :, None, :], 0.0)


def _add_at_layer(value, ctx, t, change, layer):
    return value + jnp.where(ctx.layer == layer, t * change, 0.0)


def _add(value, ctx, t, change):
    return value + t * change


def receiver_hooks(model, receiver: str, vector, t):
    """Hooks changing only `receiver`'s input by t·vector [B, T, D], through its own weights (post-LN BERT)."""
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    index = receiver_labels(L, H).index(receiver)
    if receiver == "output":
        return {f"blocks.{L - 1}.hook_normalized_resid_post": HookFn(_add, t=t, change=vector)}
    layer, k = divmod(index, 3 * H + 1)
    if k == 3 * H:
        W_in = model.layer_weights("mlp.W_in")[layer]
        return {"blocks.*.mlp.hook_pre": HookFn(_add_at_layer, t=t, change=vector @ W_in, layer=jnp.int32(layer))}
    part, head = divmod(k, H)
    W = model.layer_weights(f"attn.W_{'QKV'[part]}")[layer][:, head]  # [D, K]
    return {f"blocks.*.attn.hook_{'qkv'[part]}": HookFn(_add_head_part, t=t, change=vector @ W,
                                                        layer=jnp.int32(layer), head=jnp.int32(head))}


def receiver_vector(carried, receiver, L, H):
    if receiver == "output":
        return carried["final"]
    layer, k = divmod(receiver_labels(L, H).index(receiver), 3 * H + 1)
    return carried["mlp_in" if k == 3 * H else "attn_in"][layer]


def edge_rtol(model, rows_tokens: int) -> float:
    """Two programs' gradients (forward_rtol, two programs, as a backward repeats the forward's reductions), a dot
    over B·T·D, and up to 2L LN maps (a mean and a division over D each) on the carried change."""
    cfg = model.config
    return (forward_rtol(cfg, S=rows_tokens) + dot_rtol(rows_tokens * cfg.hidden_size)
            + 2 * cfg.num_hidden_layers * dot_rtol(cfg.hidden_size))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::minibert.core.hooks.RecompileWarning")  # the reference traces one jvp per edge
def test_each_edge_score_is_the_first_order_change_of_its_patch(classifier):
    model = classifier
    graph = edge_attribution(model, CLEAN, CORRUPTED, logit_difference)
    clean, _ = aligned(model)
    carried = carried_changes(model)
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads

    reference = np.zeros_like(graph.scores)
    for u, sender in enumerate(graph.senders):
        for v, receiver in enumerate(graph.receivers):
            if not graph.edges[u, v]:
                continue
            vector = jnp.asarray(receiver_vector(carried[sender], receiver, L, H), jnp.float32)

            def metric_at(t, vector=vector, receiver=receiver):
                out, _ = model.forward_fn((), receiver_hooks(model, receiver, vector, t))(model.state, clean)
                return logit_difference(out).mean()

            reference[u, v] = float(jax.jvp(metric_at, (jnp.float32(0),), (jnp.float32(1),))[1])
    scale = np.abs(reference).max()
    assert scale > 0
    assert np.abs(graph.scores - reference).max() <= edge_rtol(model, int(np.prod(clean.shape))) * scale
    assert np.all(graph.scores[~graph.edges] == 0)


@pytest.mark.slow
def test_eap_ig_with_one_step_is_eap(classifier):
    """EAP-IG's runs sit at α = k/steps: steps=1 is the clean run, EAP's gradient (the same program)."""
    model = classifier
    eap = edge_attribution(model, CLEAN, CORRUPTED, logit_difference)
    one = edge_attribution(model, CLEAN, CORRUPTED, logit_difference, method="eap-ig", steps=1)
    three = edge_attribution(model, CLEAN, CORRUPTED, logit_difference, method="eap-ig", steps=3)
    scale = np.abs(eap.scores).max()
    np.testing.assert_array_equal(one.scores, eap.scores)
    assert np.abs(three.scores - eap.scores).max() > edge_rtol(model, 32) * scale  # the steps change the scores


@pytest.mark.slow
def test_a_single_patched_edge_is_its_receivers_change(classifier):
    model = classifier
    clean, _ = aligned(model)
    carried = carried_changes(model)
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    plain = float(np.asarray(logit_difference(model(clean))).mean())
    # (the classifier reads [CLS] alone, so block 2's queries matter at position 0 only, where the embeddings agree)
    for sender, receiver in [("embed", "2-1.k"), ("1-2", "MLP 1 in"), ("MLP 1", "output"), ("1-1", "2-3.v"),
                             ("1-4", "2-2.q")]:
        ours = path_patching(model, CLEAN, CORRUPTED, logit_difference, sender, [receiver])
        vector = jnp.asarray(receiver_vector(carried[sender], receiver, L, H), jnp.float32)
        hooks = receiver_hooks(model, receiver, vector, jnp.float32(1))
        literal = float(np.asarray(logit_difference(model.run_with_hooks(clean, hooks))).mean())
        # two programs' logits (forward_rtol, two programs, and the classifier's dot over D), against their scale
        rtol = forward_rtol(model.config, S=clean.shape[1]) + dot_rtol(model.config.hidden_size)
        assert abs(ours - literal) <= rtol * max(abs(literal), abs(plain)), (sender, receiver)
        assert abs(literal - plain) > 100 * rtol * abs(plain)  # each patch moves the metric


@pytest.mark.slow
def test_faithfulness_of_full_and_empty_graphs(classifier, tmp_path):
    model = classifier
    before = model.programs.traces
    graph = edge_attribution(model, CLEAN, CORRUPTED, logit_difference)
    result = circuit_faithfulness(model, CLEAN, CORRUPTED, logit_difference, graph.sweep([0, 5, graph.edges.sum()]))
    assert model.programs.traces - before <= 2  # one program each (none new if an earlier test compiled them)
    assert result.values[-1] == 1.0  # the full graph is the clean run: no edge patched, nothing added
    clean, corrupt = aligned(model)
    plain = float(np.asarray(logit_difference(model(clean))).mean())
    rtol = forward_rtol(model.config, S=clean.shape[1]) + dot_rtol(model.config.hidden_size)
    assert abs(result.clean - plain) <= rtol * abs(plain)
    assert result.metrics[0] == result.empty  # a circuit of no edge is the empty graph
    assert result.sizes == [0, 5, int(graph.edges.sum())] and all(type(n) is int for n in result.sizes)

    # pre-LN: every receiver recomputes its own layernorm, so the empty graph is the corrupted run
    make_modernbert(tmp_path, "ForMaskedLM", scale=0.2)
    modern = minibert.load(tmp_path)

    def logit(out):
        return out.logits[:, 1, 7] - out.logits[:, 1, 9]

    graph = edge_attribution(modern, CLEAN, CORRUPTED, logit)
    result = circuit_faithfulness(modern, CLEAN, CORRUPTED, logit, graph.circuit(top=3))
    rtol = forward_rtol(modern.config, S=clean.shape[1]) + dot_rtol(modern.config.vocab_size)
    scale = max(abs(result.corrupted), abs(result.clean))
    assert abs(result.empty - result.corrupted) <= rtol * scale
    assert abs(result.clean - result.corrupted) > 100 * rtol * scale  # the two runs differ: the check is not vacuous


def _set_head_part(value, ctx, new, layer, head):
    """q, k or v [B, T, H, K] of block `layer` with head `head`'s part replaced by new [B, T, K]."""
    at = (jnp.arange(value.shape[2]) == head)[None, None, :, None] & (ctx.layer == layer)
    return jnp.where(at, new[:, :, None, :].astype(value.dtype), value)


def _set_at_layer(value, ctx, new, layer):
    return jnp.where(ctx.layer == layer, new.astype(value.dtype), value)


@pytest.mark.slow
def test_a_single_patched_edge_is_its_receivers_change_pre_ln(tmp_path):
    """Pre-LN ModernBERT: the skip path is the identity, and a receiver recomputes its own layernorm from its
    changed input. The literal reference, in NumPy from the clean run's values and the weights: head h's q (k, v)
    = LN₁(x + Δ)·W_QKV[c][:, h] (layer 0: no LN₁), the MLP reads LN₂(resid_mid + Δ), the output reads the last
    block's output + Δ, with Δ the sender's corrupted − clean output; the model runs with that one value replaced."""
    make_modernbert(tmp_path, "ForMaskedLM", scale=0.2)
    model = minibert.load(tmp_path)

    def logit(out):
        return out.logits[:, 1, 7] - out.logits[:, 1, 9]

    clean, corrupt = aligned(model)
    L = model.config.num_hidden_layers
    names = ["hook_full_embed", "blocks.*.attn.hook_result", "blocks.*.hook_mlp_out", "blocks.*.hook_resid_pre",
             "blocks.*.hook_resid_mid"]
    _, c = model.run_with_cache(clean, names)
    _, k = model.run_with_cache(corrupt, names)
    real = np.asarray(clean.attention_mask, np.float64)[:, :, None]
    weights = {name: np.asarray(value, np.float64) for name, value in model.named_parameters().items()}
    eps = model.config.setting("norm_eps")

    def norm(name, x):
        centred = x - x.mean(-1, keepdims=True)
        y = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + eps) * weights[f"{name}.scale"]
        return y + weights.get(f"{name}.bias", 0.0)

    def change(sender):
        if sender == "embed":
            return real * (np.asarray(k["hook_full_embed"], np.float64) - np.asarray(c["hook_full_embed"], np.float64))
        if sender.startswith("MLP"):
            name = f"blocks.{int(sender.split()[1]) - 1}.hook_mlp_out"
            return real * (np.asarray(k[name], np.float64) - np.asarray(c[name], np.float64))
        layer, head = (int(n) - 1 for n in sender.split("-"))
        name = f"blocks.{layer}.attn.hook_result"
        return real * (np.asarray(k[name], np.float64)[:, :, head] - np.asarray(c[name], np.float64)[:, :, head])

    def literal_hooks(receiver, delta):
        if receiver == "output":
            return {f"blocks.{L - 1}.hook_resid_post": HookFn(_add, t=jnp.float32(1), change=jnp.asarray(delta,
                                                                                                        jnp.float32))}
        if receiver.startswith("MLP"):
            layer = int(receiver.split()[1]) - 1
            new = norm(f"blocks.{layer}.ln2", np.asarray(c[f"blocks.{layer}.hook_resid_mid"], np.float64) + delta)
            return {"blocks.*.ln2.hook_out": HookFn(_set_at_layer, new=jnp.asarray(new, jnp.float32),
                                                    layer=jnp.int32(layer))}
        node, part = receiver.split(".")
        layer, head = (int(n) - 1 for n in node.split("-"))
        x = np.asarray(c[f"blocks.{layer}.hook_resid_pre"], np.float64) + delta
        read = norm(f"blocks.{layer}.ln1", x) if layer else x  # ModernBERT's block 0 has no attention norm
        c_index = "qkv".index(part)
        new = read @ weights[f"blocks.{layer}.attn.W_QKV"][c_index][:, head]
        if f"blocks.{layer}.attn.b_QKV" in weights:
            new = new + weights[f"blocks.{layer}.attn.b_QKV"][c_index][head]
        return {f"blocks.*.attn.hook_{part}": HookFn(_set_head_part, new=jnp.asarray(new, jnp.float32),
                                                     layer=jnp.int32(layer), head=jnp.int32(head))}

    plain = float(np.asarray(logit(model(clean))).mean())
    # two programs' logits (forward_rtol, two programs, and the unembedding's dot over D) against their scale
    rtol = forward_rtol(model.config, S=clean.shape[1]) + dot_rtol(model.config.hidden_size)
    moved = 0
    for sender, receiver in [("embed", "1-2.q"), ("embed", "1-1.v"), ("1-3", "2-1.k"), ("MLP 1", "3-2.v"),
                             ("2-4", "MLP 3 in"), ("MLP 4", "output"), ("3-5", "4-3.q")]:
        ours = path_patching(model, CLEAN, CORRUPTED, logit, sender, [receiver])
        literal = float(np.asarray(logit(model.run_with_hooks(clean, literal_hooks(receiver, change(sender))))).mean())
        assert abs(ours - literal) <= rtol * max(abs(literal), abs(plain)), (sender, receiver, ours, literal)
        moved += abs(literal - plain) > 100 * rtol * abs(plain)
    assert moved >= 5  # the patches move the metric: the comparison is not of two clean runs


@pytest.mark.slow
def test_a_pair_against_single_sentences_warns_and_each_result_names_its_direction(classifier):
    """Before: edge attribution between sentence pairs and single sentences ran without a word, though the runs
    then differ in their segments too; and no result said which run was patched into which. edge_attribution,
    circuit_faithfulness and path_patching patch corrupted into clean; patch_activations clean into corrupted."""
    model = classifier
    pairs = model.tokenize(CLEAN, ["de", "xy"])
    with pytest.warns(AnalysisWarning, match=r"the clean batch holds sentence pairs .* and the corrupted batch "
                                             r"single sentences") as caught:
        graph = edge_attribution(model, pairs, CORRUPTED, logit_difference)
    assert caught[0].filename == __file__
    with pytest.warns(AnalysisWarning, match=r"the corrupted batch holds sentence pairs"):
        edge_attribution(model, CORRUPTED, pairs, logit_difference)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AnalysisWarning)
        edge_attribution(model, CLEAN, CORRUPTED, logit_difference)  # both single: no warning
    assert graph.direction == "corrupted into clean" and "direction='corrupted into clean'" in repr(graph)
    result = circuit_faithfulness(model, CLEAN, CORRUPTED, logit_difference, graph.circuit(top=3))
    assert result.direction == "corrupted into clean" and "direction='corrupted into clean'" in repr(result)
    _, baselines = interventions.patch_activations(model, CLEAN, CORRUPTED, logit_difference, baselines=True)
    assert baselines.direction == "clean into corrupted"
    assert interventions.ablation_sweep(model, CLEAN, logit_difference, baselines=True)[1].direction is None


def test_edge_attribution_refuses_identical_batches_and_warns_on_a_constant_metric(classifier):
    """Before (issue 40, round 5): both gave an all-zero graph without a word, where circuit_faithfulness refuses
    the same batches. A score is (corrupted − clean) · ∂metric, so either makes every one exactly 0."""
    with pytest.raises(minibert.errors.AnalysisError, match="the corrupted batch is the clean batch"):
        edge_attribution(classifier, CLEAN, list(CLEAN), logit_difference)
    with pytest.warns(AnalysisWarning, match="every edge scores exactly 0") as caught:
        graph = edge_attribution(classifier, CLEAN, CORRUPTED, lambda out: jnp.ones(out.logits.shape[0]))
    assert caught[0].filename == __file__ and not graph.scores.any()

"""Performance accounting: parameter counts and FLOPs per token, checked by hand, against the traced
program's matmuls and against XLA's compiled cost analysis. (No timings: those live in benchmarks/.)"""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_hf_model
from flax import nnx

import minibert
from minibert.core.config import BertConfig
from minibert.core.encoder import Encoder
from minibert.runtime import accounting
from minibert.runtime.model import Model

TINY = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=37, max_position_embeddings=64)


def dot_flops(jaxpr) -> int:
    """2·(output size)·(contracted size) summed over every dot_general of a jaxpr, sub-jaxprs included.
    Of a conditional (the model's per-platform attention) one branch runs; all branches must agree. A scan's body
    (the scanned stack of blocks) runs once per step."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2 * int(np.prod(eqn.outvars[0].aval.shape)) * int(np.prod([lhs[d] for d in contract]))
        elif eqn.primitive.name == "cond":
            branches = {dot_flops(branch.jaxpr) for branch in eqn.params["branches"]}
            assert len(branches) == 1, f"attention branches count different FLOPs: {branches}"
            total += branches.pop()
        elif eqn.primitive.name == "scan":
            total += eqn.params["length"] * dot_flops(eqn.params["jaxpr"].jaxpr)
        else:
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                total += dot_flops(sub)
    return total


def test_flops_per_token_by_hand():
    # D=32, F=37, S=16, per layer: qkv 3·2·32·32 = 6144, W_O 2·32·32 = 2048, FFN 2·2·32·37 = 4736,
    # scores and context 2·2·16·32 = 2048 → 14976; two layers → 29952.
    assert accounting.flops_per_token(TINY, 16) == 29952
    assert accounting.matmul_flops(TINY, 16) == {"qkv": 12288, "scores": 2048, "context": 2048,
                                                 "attn_out": 4096, "ffn": 9472}
    # BertModel's pooler: 2·D·D per sequence, spread over 16 tokens.
    assert accounting.flops_per_token(TINY, 16, head=True) == 29952 + 2 * 32 * 32 / 16


@pytest.mark.parametrize("names", [(), "blocks.*.attn.hook_pattern"], ids=["fused", "explicit"])
def test_flops_match_traced_matmuls(names):
    model = Model(TINY, seed=0)
    B, T = 3, 16
    ids = jnp.ones((B, T), jnp.int32)
    jaxpr = jax.make_jaxpr(model.forward_fn(names))(model.state, (ids, ids, ids))
    assert dot_flops(jaxpr.jaxpr) == B * T * accounting.flops_per_token(TINY, T, head=True)


@pytest.mark.parametrize("architecture", ["BertForMaskedLM", "BertForSequenceClassification",
                                          "BertForTokenClassification", "BertForPreTraining"])
def test_head_flops_match_traced_matmuls(architecture):
    cfg = BertConfig(**{**TINY.__dict__, "architecture": architecture, "id2label": ("a", "b", "c")})
    model = Model(cfg, seed=0)
    B, T = 2, 8
    ids = jnp.ones((B, T), jnp.int32)
    jaxpr = jax.make_jaxpr(model.forward_fn())(model.state, (ids, ids, ids))
    # flops_per_token divides per-sequence head FLOPs by T: float64, a few roundings of integers < 2^53.
    assert dot_flops(jaxpr.jaxpr) == pytest.approx(B * T * accounting.flops_per_token(cfg, T, head=True),
                                                   rel=8 * 2.0**-53)


def test_flops_against_compiled_cost_analysis():
    """bert-base-wide blocks at 128 tokens: XLA counts every op; matmuls are ~98% of them. The blocks unrolled
    (scan=False): XLA's cost analysis does not count a while loop's body once per trip, so the scanned stack's
    count is not the program's work."""
    cfg = BertConfig(vocab_size=128, hidden_size=768, num_hidden_layers=2, num_attention_heads=12,
                     intermediate_size=3072, max_position_embeddings=512)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Encoder(cfg, scan=False)))
    B, T = 2, 128
    ids = jax.ShapeDtypeStruct((B, T), jnp.int32)
    forward = jax.jit(lambda state, ids: nnx.merge(graphdef, state)(ids, ids, ids).last_hidden_state)
    analysis = forward.lower(state, ids).compile().cost_analysis()
    if isinstance(analysis, list):  # older jax returned one dict per computation
        analysis = analysis[0]
    assert analysis and "flops" in analysis, f"jax {jax.__version__} reports no compiled cost analysis: {analysis!r}"
    counted = B * T * accounting.flops_per_token(cfg, T, head=True)
    assert 0.95 * analysis["flops"] <= counted <= analysis["flops"]


def test_param_count_equals_hugging_face(tmp_path):
    hf = make_hf_model(tmp_path, "BertForMaskedLM")
    model = minibert.load(tmp_path)
    # HF ties the MLM decoder weight to the word embeddings: count each tensor once, as minibert stores it.
    hf_count = sum(p.numel() for p in hf.parameters())
    assert model.param_count() == hf_count


def test_param_count_bundled(bundled, bundled_dir):
    """Every tensor of the checkpoint file but the position_ids buffer (an index, not a parameter)."""
    from safetensors.numpy import load_file

    tensors = load_file(bundled_dir / "model.safetensors")
    expected = sum(t.size for name, t in tensors.items() if not name.endswith("position_ids"))
    assert bundled.param_count() == expected == 22_713_216  # HF's "22.7M" for all-MiniLM-L6-v2


def test_achieved_fraction_and_gpu_peaks():
    assert accounting.achieved_fraction(1000.0, 2e9, 4e12) == 0.5  # 2e12 / 4e12: exact in binary
    assert accounting.GPU_PEAK_FLOPS["H100"]["bfloat16"] == 989e12

    class FakeH100:
        device_kind = "NVIDIA H100 80GB HBM3"

    assert accounting.peak_flops(FakeH100(), jnp.bfloat16) == 989e12
    assert accounting.peak_flops(jax.devices("cpu")[0]) is None


def test_measure_matmul_peak_is_positive_and_finite():
    peak = accounting.measure_matmul_peak(size=128, repeats=2)
    assert np.isfinite(peak) and peak > 0


@pytest.mark.parametrize("per_head", [False, True])
def test_alti_bytes_by_hand_and_bounds_the_compiled_document(per_head):
    """alti_bytes = T²·(4D + H)·4 bytes (×H per head), and it covers what XLA allocates (temporaries and the
    output) for one document's ALTI contributions in one layer — the unit analysis.mixing.alti chunks by — at
    MiniLM's width (D = 384, H = 12) and 64 tokens."""
    from minibert.analysis import mixing

    D, H, T = 384, 12, 64
    cfg = BertConfig(vocab_size=99, hidden_size=D, num_hidden_layers=1, num_attention_heads=H,
                     intermediate_size=37, max_position_embeddings=512)
    estimate = accounting.alti_bytes(cfg, T, per_head=per_head)
    assert estimate == 64 * 64 * (4 * 384 + 12) * 4 * (12 if per_head else 1)
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    document = (f32(T, D), f32(T, H, D // H), f32(H, T, T), f32(T, 1), f32(T, D), f32(D), f32(H, D // H, D))
    one = jax.jit(lambda *a: mixing._alti_contributions(*a, per_head=per_head))
    memory = one.lower(*document).compile().memory_analysis()
    assert memory.temp_size_in_bytes + memory.output_size_in_bytes <= estimate

"""Performance accounting: parameter count, FLOPs per token, the measured matmul peak, achieved fraction.

As nanoGPT's `estimate_mfu`, the count is of matrix-multiply FLOPs (2·m·n·k for an [m, k] × [k, n]
product) of one forward pass; layernorms, softmax, GELU, biases and the embedding lookup are left out
(they are a few percent of the work and no peak figure covers them). Per token and per layer, with
D = hidden size, F = FFN size and S = keys per query (the padded sequence length):

    q, k, v projections   3 · 2·D·D        attention output W_O   2·D·D
    scores q·k            2·S·D            FFN in and out         2 · 2·D·F
    context pattern·v     2·S·D

so 8·D² + 4·D·F + 4·S·D per layer (the 2·N_matmul + attention term of Kaplan et al. 2020, forward only).

    flops = flops_per_token(model.config, seq_len=128)
    peak = measure_matmul_peak()                       # FLOP/s of a large jitted matmul on this machine
    achieved_fraction(tokens_per_s, flops, peak)       # CPU: fraction of the measured peak
    achieved_fraction(tokens_per_s, flops, peak_flops())   # GPU: MFU against the datasheet peak

It also holds the two facts every analysis sweep shares: how much activation memory one chunk of a sweep may
take (MEMORY_BUDGET, with `activation_bytes` and `items_per_chunk`; `alti_bytes` for ALTI's own intermediates),
and the matmul precision of analyses whose small differences matter (EXACT).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from minibert.core.config import Config

# Device memory the activations of one chunk of an analysis sweep may take; chunk sizes derive from it.
MEMORY_BUDGET = 1 << 30

# Full float32 products on GPUs and TPUs too (no TF32 or bf16 passes), for analyses whose answers are small
# differences of large terms (distances of 1e-9, Gram-matrix norms, statistics summed over many tokens).
EXACT = jax.lax.Precision.HIGHEST

# Dense (no structured sparsity) peak FLOP/s from the vendors' datasheets (SXM parts), by dtype. JAX's
# default precision runs float32 matmuls as TF32 on these GPUs, so float32 maps to the TF32 figure.
GPU_PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H100": {"bfloat16": 989e12, "float16": 989e12, "float32": 494.5e12},
    "H200": {"bfloat16": 989e12, "float16": 989e12, "float32": 494.5e12},
    "A100": {"bfloat16": 312e12, "float16": 312e12, "float32": 156e12},
}


def matmul_flops(config: Config, seq_len: int) -> dict[str, int]:
    """Matmul FLOPs per token of one forward through all L encoder blocks, by site, for `seq_len` keys."""
    D, F, L, S = config.hidden_size, config.intermediate_size, config.num_hidden_layers, seq_len
    flops = {
        "qkv": L * 3 * 2 * D * D,
        "scores": L * 2 * S * D,  # every query against S keys, H heads × K = D
        "context": L * 2 * S * D,
        "attn_out": L * 2 * D * D,
        "ffn": L * 2 * 2 * D * F,
    }
    if config.has_projection:  # ELECTRA, ALBERT: E-wide embeddings up to D
        flops["embed_project"] = 2 * config.embed_dim * D
    return flops


def head_flops_per_token(config: Config, seq_len: int) -> float:
    """Matmul FLOPs per token of the pooler and the architecture's head (per-sequence work spread over tokens)."""
    D, E, V, C = config.hidden_size, config.embed_dim, config.vocab_size, config.num_labels
    heads = config.heads
    flops = 2 * D * D / seq_len if heads.pooler else 0.0
    if heads.mlm:  # D → E, then against the E-wide word embeddings
        flops += 2 * D * E + 2 * E * V
    if heads.discriminator:
        flops += 2 * D * D + 2 * D
    if heads.nsp:
        flops += 2 * D * 2 / seq_len
    if heads.classifier == "sequence":
        flops += 2 * D * C / seq_len
    if heads.classifier == "token":
        flops += 2 * D * C
    return flops


def flops_per_token(config: Config, seq_len: int, *, head: bool = False) -> float:
    """Forward matmul FLOPs per token at padded length `seq_len`: the encoder, plus pooler and head if `head`."""
    flops = sum(matmul_flops(config, seq_len).values())
    return flops + head_flops_per_token(config, seq_len) if head else flops


def measure_matmul_peak(dtype=jnp.float32, size: int = 2048, repeats: int = 7, device=None) -> float:
    """FLOP/s of a jitted [size, size] × [size, size] matmul on `device` (default: the first), median of
    `repeats` timed runs after a warm-up: the machine's practical matmul limit, measured in the same run
    as the model so both see the same clocks, threads and load."""
    device = device or jax.devices()[0]
    keys = jax.random.split(jax.random.key(0))
    a, b = (jax.device_put(jax.random.normal(k, (size, size), dtype), device) for k in keys)
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * size**3 / float(np.median(times))


def peak_flops(device=None, dtype=jnp.bfloat16) -> float | None:
    """The datasheet dense peak FLOP/s of a GPU (GPU_PEAK_FLOPS), or None for CPUs and unlisted devices."""
    device = device or jax.devices()[0]
    kind = getattr(device, "device_kind", "")
    for name, peaks in GPU_PEAK_FLOPS.items():
        if name in kind:
            return peaks.get(jnp.dtype(dtype).name)
    return None


def achieved_fraction(tokens_per_s: float, flops_per_token: float, peak: float) -> float:
    """Model FLOP/s over peak FLOP/s: MFU on a GPU, fraction of the measured matmul peak on a CPU."""
    return tokens_per_s * flops_per_token / peak



def activation_bytes(config: Config, rows: int, tokens: int, *, blocks: int = 1, itemsize: int = 4,
                     backward: bool = False) -> int:
    """Bytes of activations that running `blocks` encoder blocks over a [rows, tokens] batch keeps alive: per
    token the residual stream and its copies (q, k, v, z, attention output, layernorms: about 6·D), the FFN's
    hidden layer (F) and the attention scores and pattern (2·H·S with S = tokens). A forward frees each block's
    values before the next (blocks=1 covers it); a backward keeps every block's and adds their gradients (×2)."""
    D, F, H = config.hidden_size, config.intermediate_size, config.num_attention_heads
    per_token = 6 * D + F + 2 * H * tokens
    return rows * tokens * per_token * itemsize * blocks * (2 if backward else 1)


def alti_bytes(config: Config, tokens: int, *, per_head: bool = False, itemsize: int = 4) -> int:
    """Bytes of one document's ALTI decomposition in one layer (analysis.mixing.alti, which chunks documents by
    it): for each of the T × S query-key pairs (S = T = `tokens`) about 4·D values — z_ts, its term T_t(x_s),
    y_t − T_t(x_s) and its absolute value — and the H attention weights. per_head keeps every head's terms
    apart, H times as many."""
    D, H = config.hidden_size, config.num_attention_heads
    return tokens * tokens * (4 * D + H) * itemsize * (H if per_head else 1)


def items_per_chunk(bytes_per_item: float, n_items: int, budget: int = MEMORY_BUDGET) -> int:
    """How many items of a sweep run side by side so one chunk's activations stay within `budget` (at least 1,
    at most n_items)."""
    return int(max(1, min(n_items, budget // max(bytes_per_item, 1))))

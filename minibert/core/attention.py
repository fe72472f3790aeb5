"""Which kernel computes attention's z = softmax(q·k/√K + mask)·v, and why.

`choose` is a pure function of what a call looks like: the platform it runs on, q's dtype, the head width K,
the mask's form, whether a hook watches the scores or pattern, whether attention dropout is on, and whether
this jax has cuDNN. It returns a Backend, one of

    explicit   every step a hook site (model.explicit_attention): a hook reads the scores or pattern, or
               attention dropout acts on the pattern where no fused kernel drops;
    unwatched  softmax's division after the product with v (model.unwatched_attention): the CPU path, faster
               there than XLA's fused attention (benchmarks/RESULTS.md);
    xla        jax.nn.dot_product_attention(implementation="xla") (model.fused_attention): GPUs in float32,
               TPUs, masks cuDNN cannot take;
    cudnn      cuDNN flash attention on NVIDIA GPUs in bf16/fp16 (head width a multiple of 8 up to 128, even
               lengths), its padding mask given as key lengths; attention dropout fused in the kernel.

and the reason in words, which `model.programs.attention_backend(batch)` reports and model.attend logs once.

Key lengths describe a mask only when every row's real tokens come first (right padding, what Model.inputs and
training batches hold) and at least one is real. That is a property of the values, not the shapes, so the cudnn
kernel checks it at run time (`key_lengths`) and takes the XLA path for a batch that fails it (left padding,
holes, a row of padding only) — never a silently different mask. A [B, 1, T, S] mask (local windows, packed
documents) has no key-length form at all and chooses XLA when traced.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from minibert.errors import InputError

log = logging.getLogger(__name__)

HALF_DTYPES = ("bfloat16", "float16")  # cuDNN flash attention's inputs
CUDNN_MAX_HEAD_DIM = 128  # cuDNN flash attention before Hopper; jax's check_is_flash_attention allows 256 on ≥ 9.0


@dataclasses.dataclass(frozen=True)
class Backend:
    """The kernel one attention call runs (`name`: explicit, unwatched, xla or cudnn) and why."""

    name: str
    reason: str

    def __str__(self):
        return f"{self.name}: {self.reason}"


def mask_form(mask_shape: tuple[int, ...]) -> str:
    """"keys" for a mask [B, 1, 1, S] (the same keys for every query: padding), "per-query" for [B, 1, T, S]."""
    return "keys" if mask_shape[-2] == 1 else "per-query"


def choose(platform: str, dtype, q_shape: tuple[int, ...], k_shape: tuple[int, ...], mask_shape: tuple[int, ...], *,
           watched: bool = False, dropout: bool = False, cudnn: bool = False) -> Backend:
    """The attention kernel for one call (module docstring). platform: "cpu", "cuda", "rocm" or "tpu"; dtype: q's;
    q_shape [B, T, H, K], k_shape [B, S, H, K], mask_shape [B, 1, 1|T, S]; cudnn: whether this jax has cuDNN
    (cudnn_present())."""
    dtype = jnp.dtype(dtype).name
    if watched:
        return Backend("explicit", "a hook reads the scores or the pattern, which only the explicit path forms")
    drop_reason = "attention dropout acts on the formed pattern (masks from the rbg generator)"
    if platform == "cpu":
        if dropout:
            return Backend("explicit", f"CPU: {drop_reason}")
        return Backend("unwatched", "CPU: dividing by softmax's sum after the product with v is faster there than "
                                    "XLA's dot_product_attention")
    refusal = _cudnn_refusal(platform, dtype, q_shape[1], k_shape[1], q_shape[-1], mask_form(mask_shape), cudnn)
    if refusal is None:
        fused = "attention dropout fused in the kernel, " if dropout else ""
        return Backend("cudnn", f"cuDNN flash attention ({dtype}), {fused}key lengths from the right-padded mask "
                                f"(a batch not right-padded takes XLA's kernel at run time)")
    if dropout:
        return Backend("explicit", f"{refusal}; {drop_reason}")
    return Backend("xla", f"{refusal}; XLA's dot_product_attention")


def _cudnn_refusal(platform: str, dtype: str, T: int, S: int, K: int, form: str, cudnn: bool) -> str | None:
    """Why cuDNN flash attention cannot take this call, or None where it can."""
    if platform != "cuda":
        return f"{platform}: cuDNN runs on NVIDIA GPUs only"
    if not cudnn:
        return "this jax has no cuDNN"
    if dtype not in HALF_DTYPES:
        return f"cuDNN flash attention takes bfloat16/float16, not {dtype}"
    if K % 8 or K > CUDNN_MAX_HEAD_DIM:
        return f"cuDNN flash attention needs a head width that is a multiple of 8, ≤ {CUDNN_MAX_HEAD_DIM}; K={K}"
    if T % 2 or S % 2:
        # jax's rule for the differentiated kernel (check_is_flash_attention) counts its empty placeholder bias as
        # a bias, and a bias needs even lengths; model.programs.length_buckets' lengths from 32 up are even.
        return f"jax's cuDNN rule asks even lengths where it differentiates; T={T}, S={S}"
    if form != "keys":
        return "a per-query mask [B, 1, T, S] (local window, packed documents) has no key-length form"
    return None


@functools.cache
def cudnn_present() -> bool:
    """Whether this jax runs on an NVIDIA GPU (with it, cuDNN): jax traces cuDNN calls only then."""
    try:
        return bool(jax.devices("cuda"))
    except RuntimeError:
        return False


_logged: set[Backend] = set()


def log_once(backend: Backend) -> None:
    """Log a choice the first time this process makes it (each trace asks again)."""
    if backend not in _logged:
        _logged.add(backend)
        log.info("attention kernel: %s", backend)


def key_lengths(key_mask):
    """key_mask bool [B, 1, 1, S] → (lengths int32 [B], described bool [B]): whether each row's length describes
    it, the row right-padded (its real keys 0…n−1) with n ≥ 1. Traceable; NumPy in, NumPy out."""
    xp = np if isinstance(key_mask, np.ndarray) else jnp
    rows = key_mask[:, 0, 0, :]
    lengths = rows.sum(-1, dtype=xp.int32)
    prefix = xp.arange(rows.shape[-1])[None, :] < lengths[:, None]
    return lengths, xp.all(rows == prefix, axis=-1) & (lengths > 0)


def for_mask(platform: str, dtype, heads: int, head_dim: int, attention_mask, *, cudnn: bool) -> Backend:
    """The kernel a forward with nothing watched and no dropout runs on `platform` for the padding mask
    attention_mask [B, S] (1 = real token), this batch's values included: where that is cuDNN, a row its key
    length cannot describe sends the batch to XLA's kernel (key_lengths)."""
    mask = np.asarray(attention_mask, bool)
    B, S = mask.shape
    shape = (B, S, heads, head_dim)
    backend = choose(platform, dtype, shape, shape, (B, 1, 1, S), cudnn=cudnn)
    if backend.name != "cudnn":
        return backend
    _, described = key_lengths(mask[:, None, None, :])
    if described.all():
        return backend
    rows = np.flatnonzero(~described).tolist()
    return Backend("xla", f"rows {rows} are not right-padded or hold no real token, so key lengths cannot describe "
                          f"the mask: XLA's dot_product_attention (cuDNN for batches whose rows all are)")


def cudnn_attention(q, k, v, lengths, dropout_rate: float = 0.0, site: str = ""):
    """z [B, T, H, K] by cuDNN flash attention over the first `lengths` [B] keys of each row; q, k, v bf16/fp16
    [B, T|S, H, K]. With dropout_rate > 0 the pattern is dropped inside the kernel.

    Dropout is the one reason for jax's private cudnn module: jax.nn.dot_product_attention has no dropout
    argument, while jax._src.cudnn.fused_attention_stablehlo.dot_product_attention (what it calls) takes
    `dropout_rate` and a static `seed`. cuDNN's masks come from that seed and a counter XLA's runner advances on
    every call (forward and backward in step), so they change from step to step but are not drawn from the
    step's key: a run on this path repeats its masks only within one process. The seed is crc32(site), one
    stream per layer. Only this function touches the private module."""
    if dropout_rate == 0.0:
        return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, implementation="cudnn")
    from jax._src.cudnn import fused_attention_stablehlo as cudnn  # private: the only way to cuDNN's dropout

    every_query = jnp.full((q.shape[0],), q.shape[1], jnp.int32)
    return cudnn.dot_product_attention(q, k, v, q_seqlen=every_query, kv_seqlen=lengths,
                                       scale=1 / math.sqrt(q.shape[-1]), mask_type=cudnn.MaskType.PADDING,
                                       dropout_rate=dropout_rate, seed=zlib.crc32(site.encode()) & 0x7FFFFFFF)


PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # choose's names: jax's "gpu" is NVIDIA's and AMD's, whose kernels differ


def checked_platform(name) -> str:
    """A platform name for choose, in any case ("CUDA" is "cuda"), or an InputError naming the four: an unknown name
    would be answered as if it were a platform without cuDNN."""
    if isinstance(name, str) and name.lower() in PLATFORMS:
        return name.lower()
    if isinstance(name, str) and name.lower() == "gpu":
        raise InputError("platform='gpu' is JAX's name for NVIDIA and AMD GPUs alike, whose attention kernels "
                         "differ (cuDNN on NVIDIA only): pass 'cuda' (NVIDIA) or 'rocm' (AMD).")
    raise InputError(f"platform={name!r}: pass one of {', '.join(map(repr, PLATFORMS))}, or None for this "
                     f"machine's default device.")


def platform() -> str:
    """The default device's platform in choose's names (jax calls NVIDIA and AMD GPUs both "gpu")."""
    name = jax.default_backend()
    if name == "gpu":
        return "cuda" if cudnn_present() else "rocm"
    return name

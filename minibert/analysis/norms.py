"""Attention weighted by the size of what is moved (Kobayashi, Kuribayashi, Yokoi & Inui 2020).

A head's output at query t is Σ_s α_ts f(x_s) with f(x) = (x W_V + b_V) W_O — the value vector
carried to the residual stream by that head's slice of the output projection (the output bias b_O
belongs to no head and is left out). A large weight α on a token whose f(x) is short moves little, so
the paper reads ‖α f(x)‖ instead of α. Per layer, with v = attn.hook_v (which includes b_V):

    f_norm        ‖f_h(x_s)‖                 [L, B, H, S]
    weighted_norm ‖α_hts f_h(x_s)‖ = α·‖f‖   [L, B, H, T, S]
    summed_norm   ‖Σ_h α_hts f_h(x_s)‖       [L, B, T, S]   (the whole layer's transfer from s to t)

and Σ_s Σ_h α_hts f_h(x_s) + b_O is the attention output hook_attn_out[t]. Padding keys have α = 0;
rows and columns at padding positions carry no meaning.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from minibert.core.site_names import PATTERN, V, every_block, in_block
from minibert.core.sites import PATTERNS
from minibert.runtime.accounting import EXACT  # no TF32 on GPUs: the Gram trick below subtracts large terms


@jax.jit
def _layer_norms(v, pattern, W_O) -> tuple[jax.Array, jax.Array]:
    """One layer: v [B, S, H, K], pattern [B, H, T, S], W_O [H, K, D] → (‖f‖ [B, H, S], ‖Σ_h α f‖ [B, T, S]).

    ‖Σ_h α_h f_h‖² = Σ_{h,g} α_h α_g ⟨f_h, f_g⟩, so only the Gram matrix of the heads' vectors per key
    [B, S, H, H] is formed, never the [B, T, S, D] sums.
    """
    f = jnp.einsum("BSHK,HKD->BSHD", v.astype(jnp.float32), W_O.astype(jnp.float32), precision=EXACT)
    gram = jnp.einsum("BSHD,BSGD->BSHG", f, f, precision=EXACT)
    alpha = pattern.astype(jnp.float32)
    summed = jnp.einsum("BHTS,BSHG,BGTS->BTS", alpha, gram, alpha, precision=EXACT)
    f_norm = jnp.sqrt(jnp.einsum("BSHH->BHS", gram))
    return f_norm, jnp.sqrt(jnp.maximum(summed, 0.0))


def attention_norms(model, batch) -> dict[str, np.ndarray]:
    """Kobayashi et al.'s norms for every layer of `model` on `batch` (texts, a Batch or id arrays).

    Returns NumPy float32 arrays (layers and heads 0-indexed): "f_norm" [L, B, H, S], "weighted_norm"
    [L, B, H, T, S], "summed_norm" [L, B, T, S], and "pattern" α [L, B, H, T, S] to compare them with.
    """
    _, cache = model.run_with_cache(batch, names=[every_block(V), PATTERNS])
    f_norms, summed_norms, patterns = [], [], []
    W_O = model.weights.o  # [L, H, K, D]
    for layer in range(model.config.num_hidden_layers):
        pattern = cache[in_block(layer, PATTERN)]
        f_norm, summed = _layer_norms(cache[in_block(layer, V)], pattern, W_O[layer])
        f_norms.append(np.asarray(f_norm))
        summed_norms.append(np.asarray(summed))
        patterns.append(np.asarray(pattern, np.float32))
    f_norm, pattern = np.stack(f_norms), np.stack(patterns)
    return {"f_norm": f_norm, "weighted_norm": pattern * f_norm[:, :, :, None, :],
            "summed_norm": np.stack(summed_norms), "pattern": pattern}

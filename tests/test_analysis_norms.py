"""minibert/analysis/norms.py: attention norms (Kobayashi et al.) against NumPy loops over the
checkpoint's own tensors."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file

from minibert.analysis import norms

TEXTS = ["I made the mistake.", "Sorry, this will get e-recorded instead."]


# ---- attention norms ---------------------------------------------------------------------------------

def reference_norms(tensors, resid_pre, pattern, n_heads):
    """f_h(x_s) = (x_s W_V + b_V)[head h] · W_O[head h rows], from the Hugging Face tensors, by loops."""
    n_layers, batch, length, _ = resid_pre.shape
    f_norm = np.zeros((n_layers, batch, n_heads, length))
    weighted = np.zeros((n_layers, batch, n_heads, length, length))
    summed = np.zeros((n_layers, batch, length, length))
    attn_out = np.zeros(resid_pre.shape)
    for layer in range(n_layers):
        p = f"encoder.layer.{layer}.attention."
        w_v, b_v = tensors[p + "self.value.weight"], tensors[p + "self.value.bias"]  # [D_out, D_in]
        w_o, b_o = tensors[p + "output.dense.weight"], tensors[p + "output.dense.bias"]
        k = w_v.shape[0] // n_heads
        for b in range(batch):
            f = np.zeros((length, n_heads, w_o.shape[0]))
            for s in range(length):
                v = w_v @ resid_pre[layer, b, s] + b_v
                for h in range(n_heads):
                    f[s, h] = w_o[:, h * k:(h + 1) * k] @ v[h * k:(h + 1) * k]
                    f_norm[layer, b, h, s] = np.linalg.norm(f[s, h])
            for t in range(length):
                for s in range(length):
                    vectors = [pattern[layer, b, h, t, s] * f[s, h] for h in range(n_heads)]
                    weighted[layer, b, :, t, s] = [np.linalg.norm(x) for x in vectors]
                    summed[layer, b, t, s] = np.linalg.norm(np.sum(vectors, axis=0))
                attn_out[layer, b, t] = sum(pattern[layer, b, h, t, s] * f[s, h]
                                            for h in range(n_heads) for s in range(length)) + b_o
    return f_norm, weighted, summed, attn_out


@pytest.mark.slow  # Python loops over every layer, head and token pair
def test_attention_norms_match_loops_over_checkpoint_tensors(bundled, bundled_dir):
    batch = bundled.tokenize(TEXTS)  # the first text is padded
    result = norms.attention_norms(bundled, batch)
    _, cache = bundled.run_with_cache(batch)  # every hook: the same program as test_hooks.py's
    resid_pre = np.asarray(cache.stack("hook_resid_pre"), np.float64)
    pattern = np.asarray(cache.stack("attn.hook_pattern"), np.float64)
    tensors = {k: v.astype(np.float64) for k, v in load_file(bundled_dir / "model.safetensors").items()}
    f_norm, weighted, summed, attn_out = reference_norms(tensors, resid_pre, pattern, 12)
    real = batch.attention_mask.astype(bool)
    np.testing.assert_allclose(result["f_norm"], f_norm, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(result["weighted_norm"], weighted, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(result["summed_norm"], summed, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(result["pattern"], pattern, atol=1e-5)  # two compiled programs: rounding differs
    # Σ_s Σ_h α f(x) + b_O is the attention output: f carries b_V, and b_O belongs to no head
    ours = np.asarray(cache.stack("hook_attn_out"))
    np.testing.assert_allclose(ours[:, real], attn_out[:, real], atol=2e-4)
    assert result["summed_norm"].shape == (6, 2, batch.input_ids.shape[1], batch.input_ids.shape[1])
    # the summed norm never exceeds the sum of the heads' norms (triangle inequality), and is often far below
    assert (result["summed_norm"] <= result["weighted_norm"].sum(2) + 1e-4).all()

"""TransformerLens habits on minibert: TL's head hook names (its test_run_with_cache expectations),
hook.layer(), cache.stack / stack_activation with short names, to_str_tokens,
and −inf scores at masked keys. Models are tiny random BertForPreTraining checkpoints built with transformers."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import make_hf_model
from tolerances import U32, assert_close_to_scale, forward_rtol

import minibert

TEXTS = ["a b c d e", "f g"]  # two lengths: row 1 has padding


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory):
    """(minibert model, transformers BertForPreTraining, batch, transformers output) of one tiny random model."""
    directory = tmp_path_factory.mktemp("tiny-pretraining")
    hf = make_hf_model(directory, "BertForPreTraining", scale=0.2)
    model = minibert.load(directory)
    batch = model.tokenize(TEXTS)
    with torch.no_grad():
        hf_out = hf(**{k: torch.as_tensor(np.asarray(v, np.int64)) for k, v in batch.to_dict().items()},
                    output_hidden_states=True)
    return model, hf, batch, hf_out


def test_transformerlens_run_with_cache_names(pretraining):
    """TL's test_run_with_cache_mlm and _nsp assert these keys (their layers 3 and 7 are ours 1 and 0: the tiny
    model has 2 blocks); the head hooks hold what transformers computes (forward_rtol of the model)."""
    model, _, batch, hf_out = pretraining
    out, cache = model.run_with_cache(batch)
    for name in ("embed.hook_embed", "blocks.0.attn.hook_q", "blocks.1.attn.hook_attn_scores",
                 "blocks.1.hook_resid_post", "mlm_head.ln.hook_normalized", "pooler.hook_pooler_out",
                 "nsp_head.hook_nsp_out"):
        assert name in cache, name
    rtol = forward_rtol(model.config, S=batch.input_ids.shape[1])
    real = np.asarray(batch.attention_mask, bool)
    assert_close_to_scale(cache["unembed.hook_out"], hf_out.prediction_logits.numpy(), rtol, "unembed.hook_out",
                          where=real)
    assert_close_to_scale(cache["nsp_head.hook_nsp_out"], hf_out.seq_relationship_logits.numpy(), rtol, "nsp")
    np.testing.assert_array_equal(cache["pooler.hook_pooler_out"], out.pooler_output)
    ln = model.params["mlm"]["ln"]
    scaled = np.asarray(cache["mlm_head.ln.hook_normalized"], np.float64) * ln["scale"]
    # x·γ + β rounded once (fused multiply-add) or twice: within 2u of |x·γ| + |β|
    np.testing.assert_array_less(np.abs(cache["unembed.hook_in"] - (scaled + ln["bias"])),
                                 2 * U32 * (np.abs(scaled) + np.abs(ln["bias"])) + 1e-30)


def test_hook_layer_is_callable_as_in_transformerlens(pretraining):
    """`hook.layer()` (TL) and `ctx.layer` (minibert) name the same block: zeroing z where hook.layer() == 1
    on every block equals zeroing blocks.1 alone."""
    model, _, batch, _ = pretraining
    seen = []

    def zero_in_layer_1(z, hook):
        seen.append((hook.layer(), int(hook.layer), hook.name))
        return z * 0 if hook.layer() == 1 else z

    out = model.run_with_hooks(batch, fwd_hooks=[("blocks.*.attn.hook_z", zero_in_layer_1)])
    want = model.run_with_hooks(batch, {"blocks.1.attn.hook_z": lambda z, ctx: z * 0})
    np.testing.assert_array_equal(out.last_hidden_state, want.last_hidden_state)
    # each site's calls: the trace's, and the padding probe's (buckets.pads_safely calls a hook to see if it reads
    # the row length)
    assert sorted(set(seen)) == [(0, 0, "blocks.0.attn.hook_z"), (1, 1, "blocks.1.attn.hook_z")]


def test_stack_takes_short_names_and_stack_activation(pretraining):
    model, _, batch, _ = pretraining
    _, cache = model.run_with_cache(batch)
    full = cache.stack("attn.hook_pattern")
    assert full.shape[0] == model.config.num_hidden_layers
    np.testing.assert_array_equal(cache.stack("pattern"), full)
    np.testing.assert_array_equal(cache.stack_activation("pattern"), full)
    np.testing.assert_array_equal(cache.stack_activation("pattern", 1), full[:1])  # TL: layers 0 … layer − 1
    np.testing.assert_array_equal(cache.stack("resid_pre"), cache.stack("hook_resid_pre"))
    np.testing.assert_array_equal(cache.stack_activation("scale", sublayer_type="ln1"),
                                  jnp.stack([cache["blocks.0.ln1.hook_scale"], cache["blocks.1.ln1.hook_scale"]]))


def test_to_str_tokens(pretraining):
    """A text, a list of texts (no padding) and ids, as TL's to_str_tokens gives them (special tokens kept)."""
    model, _, batch, _ = pretraining
    assert model.to_str_tokens("a b") == ["[CLS]", "a", "b", "[SEP]"]
    assert model.to_str_tokens(TEXTS) == [["[CLS]", *"abcde", "[SEP]"], ["[CLS]", "f", "g", "[SEP]"]]
    assert model.to_str_tokens(batch.input_ids[1]) == ["[CLS]", "f", "g", "[SEP]", "[PAD]", "[PAD]", "[PAD]"]
    assert model.to_str_tokens(batch.input_ids) == batch.tokens
    with pytest.raises(minibert.InputError, match="to_str_tokens takes"):
        model.to_str_tokens(np.zeros((1, 2, 3), np.int32))


def test_masked_keys_score_minus_infinity_in_a_padded_batch(pretraining):
    """Row 1's padding keys hold −inf in attn.hook_attn_scores (TL's meaning) and 0 in the pattern."""
    model, _, batch, _ = pretraining
    _, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_*")
    scores, pattern = np.asarray(cache.stack("attn_scores")), np.asarray(cache.stack("pattern"))
    padding = ~np.asarray(batch.attention_mask, bool)[None, :, None, None, :]
    padding = np.broadcast_to(padding, scores.shape)
    assert padding.any() and np.isneginf(scores[padding]).all() and np.isfinite(scores[~padding]).all()
    assert (pattern[padding] == 0).all()


def test_weights_under_transformerlens_names_and_orders(tiny_mlm):
    """issue 32 A9: layer_weights("attn.W_Q") is [L, D, H, K] while TransformerLens' W_Q is [L, H, D, K]; per-head
    norms over TL's axes summed the wrong ones silently. model.W_Q, … give TL's order, built here as TL's
    convert_bert_weights builds them from the Hugging Face weights: W_Q = rearrange(query.weight, "(i h) m -> i m h"),
    W_O = rearrange(output.dense.weight, "m (i h) -> i h m"), b_Q = rearrange(query.bias, "(i h) -> i h"). A
    reshape and transpose of the same float32 values: equal exactly."""
    from minibert.core.config import head_label
    from minibert.errors import ConfigError

    model, hf = tiny_mlm
    H, K = model.config.num_attention_heads, model.config.head_dim
    for layer, block in enumerate(hf.bert.encoder.layer):
        attention = block.attention
        for name, linear in (("Q", attention.self.query), ("K", attention.self.key), ("V", attention.self.value)):
            weight, bias = linear.weight.detach().numpy(), linear.bias.detach().numpy()
            tl_order = weight.reshape(H, K, -1).transpose(0, 2, 1)  # [H, D, K]
            np.testing.assert_array_equal(getattr(model, f"W_{name}")[layer], tl_order)
            np.testing.assert_array_equal(getattr(model, f"b_{name}")[layer], bias.reshape(H, K))
        out = attention.output.dense.weight.detach().numpy()
        np.testing.assert_array_equal(model.W_O[layer], out.reshape(-1, H, K).transpose(1, 2, 0))
        np.testing.assert_array_equal(model.b_O[layer], attention.output.dense.bias.detach().numpy())
        np.testing.assert_array_equal(model.W_in[layer], block.intermediate.dense.weight.detach().numpy().T)
        np.testing.assert_array_equal(model.W_out[layer], block.output.dense.weight.detach().numpy().T)
    assert model.W_Q.shape == (model.config.num_hidden_layers, H, model.config.hidden_size, K)
    assert model.config.head_label(1, 2) == head_label(1, 2) == "2-3"
    for layer, head in ((186, 7), (0, 9), (-1, 0), (1.0, 2), (True, 1)):
        with pytest.raises(ConfigError, match="head_label"):
            model.config.head_label(layer, head)
    with pytest.raises(ConfigError, match="divmod"):
        head_label(-1, 2)

"""DeBERTa-v2/v3 against transformers' own classes.

Tiny random models with odd sizes (D = 30, 5 heads of 6, F = 37, vocabulary 99), built with transformers,
every weight redrawn, saved with save_pretrained and loaded by minibert; fp32. Rows of 19 tokens are longer than
position_buckets (8), so distances land in log buckets and past the table's clamp. Compared: every layer's
hidden state, every attention pattern, each head's logits, on padded batches, at real tokens (transformers zeroes
padding positions' embeddings; no real token reads them), within deberta_rtol below. The three score terms are
checked against a loop over (b, h, t, s) written from transformers' functions. Full-size configurations:
parameter counts from shapes alone (jax.eval_shape against torch's meta device).
"""

from __future__ import annotations

import json
import math
import warnings

import jax
import numpy as np
import pytest
import torch
from conftest import write_vocab
from flax import nnx
from test_families import CORPUS, fuzz_texts, hf_rows
from test_families_modern import PAD, VOCAB, hf_outputs, padded_batch  # ids 5…98, padding 0: the same vocabulary
from tolerances import LAMBDA, U32, assert_close_to_scale, block_roundings

import minibert
from minibert.core.config import Config
from minibert.core.encoder import Encoder
from minibert.errors import ConfigError, InputError, TokenizerError
from minibert.families import Heads
from minibert.families.deberta_v2 import enhanced_mask_decoder, log_buckets
from minibert.io.config_json import read_config
from minibert.io.tokenizers_hf import tokenizer_for

LENGTH = 19  # longer than position_buckets: distances beyond ±4 go to log buckets, beyond the largest to the clamp
# DeBERTa-v3's layout (shared keys, no absolute positions, normalised relative table, no segments) at tiny sizes.
V3 = dict(vocab_size=VOCAB, hidden_size=30, num_hidden_layers=3, num_attention_heads=5, intermediate_size=37,
          max_position_embeddings=64, relative_attention=True, position_buckets=8, max_relative_positions=12,
          pos_att_type="p2c|c2p", norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False,
          type_vocab_size=0, pad_token_id=PAD, layer_norm_eps=1e-7)
# DeBERTa-v2's older layout: own position projections, absolute positions too, no buckets (distances clamped at ±6).
V2 = dict(share_att_key=False, position_biased_input=True, norm_rel_ebd="none", position_buckets=-1,
          max_relative_positions=6, type_vocab_size=1, hidden_act="gelu_new")


def make_deberta(directory, suffix: str = "Model", *, seed: int = 0, scale: float = 0.3, **config):
    """A tiny random transformers DebertaV2<suffix>, every weight redrawn (LayerNorm gains near 1), saved."""
    import transformers

    cfg = transformers.DebertaV2Config(**(V3 | config), architectures=["DebertaV2" + suffix], num_labels=3)
    torch.manual_seed(seed)
    model = getattr(transformers, "DebertaV2" + suffix)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = name.endswith("LayerNorm.weight")  # every LayerNorm of DeBERTa-v2 is a module named LayerNorm
            p.copy_(gain + (0.2 if gain else scale) * torch.randn_like(p))
    model.save_pretrained(directory)
    write_vocab(directory, VOCAB)
    return model


def deberta_rtol(config: Config, S: int, stages: int) -> float:
    """tolerances.forward_rtol's bound (λ·√N·u over the N roundings of both programs) with the roundings a
    disentangled block adds to BERT's: the relative table's LayerNorm (D), its projection by W_K' and W_Q' (D
    each) and the two position dot products q·(r W_K') and k·(r W_Q') (K each); `stages` blocks and the
    embedding LayerNorm (one stage more for a head's reductions)."""
    D, F, K = config.hidden_size, config.intermediate_size, config.head_dim
    per_block = block_roundings(D, F, K, S) + 3 * D + 2 * K
    return LAMBDA * math.sqrt(2 * stages * per_block) * U32


def assert_deberta_parity(model, hf_model, batch):
    """Every layer's hidden state and pattern at real query rows, and a head's logits (at real tokens where they
    are per token), within deberta_rtol."""
    L = model.config.num_hidden_layers
    tol, head_tol = deberta_rtol(model.config, LENGTH, L + 1), deberta_rtol(model.config, LENGTH, L + 2)
    out, cache = model.run_with_cache(batch, names=["hook_full_embed", "blocks.*.hook_normalized_resid_post",
                                                    "blocks.*.attn.hook_pattern"])
    ref = hf_outputs(hf_model, batch)
    real = batch["attention_mask"] > 0
    ours = [cache["hook_full_embed"], *cache.stack("hook_normalized_resid_post")]
    assert len(ours) == len(ref.hidden_states) == L + 1
    for layer, (mine, theirs) in enumerate(zip(ours, ref.hidden_states)):
        assert_close_to_scale(mine, theirs, tol, f"hidden state {layer}", where=real)
    patterns = np.asarray(cache.stack("hook_pattern"))
    rows = np.broadcast_to(real[:, None, :, None], patterns.shape[1:])
    for layer, theirs in enumerate(ref.attentions):
        assert_close_to_scale(patterns[layer], theirs, tol, f"attention {layer}", where=rows)
    if model.config.heads != Heads(pooler=False):
        assert_close_to_scale(out.logits, ref.logits.numpy(), head_tol, f"{model.config.architecture} logits",
                              where=real if np.ndim(out.logits) == 3 else None)


@pytest.mark.slow
@pytest.mark.parametrize("config", [
    {},
    V2,
    dict(V2, pos_att_type=["c2p"], share_att_key=True),  # one position term: scale √(2K)
    dict(pos_att_type="p2c", position_buckets=6, max_relative_positions=-1),  # the largest: max_position_embeddings
], ids=["v3", "v2-own-projections", "c2p-only-shared", "p2c-only"])
def test_deberta_encoder_parity(tmp_path, config):
    hf_model = make_deberta(tmp_path, **config)
    model = minibert.load(tmp_path)
    assert model.config.model_type == "deberta-v2"
    batch = padded_batch(np.random.default_rng(1), 3, LENGTH)
    if model.config.setting("type_vocab_size"):
        batch["token_type_ids"] = np.zeros_like(batch["input_ids"])
    assert_deberta_parity(model, hf_model, batch)


@pytest.mark.slow
@pytest.mark.parametrize("suffix,config", [
    ("ForMaskedLM", {}),  # transformers' default legacy head: cls.predictions…
    ("ForMaskedLM", dict(legacy=False)),  # lm_predictions.lm_head…
    ("ForSequenceClassification", {}),
    ("ForSequenceClassification", V2),
    ("ForTokenClassification", {}),
], ids=["mlm-legacy", "mlm", "sequence-cls", "sequence-cls-v2", "token"])
def test_deberta_head_parity(tmp_path, suffix, config):
    hf_model = make_deberta(tmp_path, suffix, seed=2, **config)
    model = minibert.load(tmp_path)
    assert model.config.architecture == "DebertaV2" + suffix
    assert_deberta_parity(model, hf_model, padded_batch(np.random.default_rng(2), 4, LENGTH))


@pytest.mark.slow
def test_enhanced_mask_decoder_is_the_authors(tmp_path):
    """enhanced_mask_decoder against the authors' EnhancedMaskDecoder.emd_context_layer written with transformers'
    modules (its DebertaV2Layer takes query_states as theirs does): H = the last block's input, Q = H + P[0…T−1],
    the last layer twice with queries Q and keys, values H, then the masked-LM head (lm_predictions.lm_head). P is
    a random position table, as DeBERTa-v3 files carry one beside position_biased_input false. Tolerance:
    deberta_rtol over the L blocks, two more and the head."""
    hf_model = make_deberta(tmp_path, "ForMaskedLM", seed=10, legacy=False)
    model = minibert.load(tmp_path)
    table = np.random.default_rng(10).normal(0, 0.3, (V3["max_position_embeddings"], V3["hidden_size"]))
    table = table.astype(np.float32)
    batch = padded_batch(np.random.default_rng(10), 3, LENGTH)
    ours = np.asarray(enhanced_mask_decoder(model, batch, table))
    with torch.no_grad():
        ids, mask = torch.tensor(batch["input_ids"]), torch.tensor(batch["attention_mask"])
        hidden = hf_model.deberta(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-2]
        encoder = hf_model.deberta.encoder
        query = hidden + torch.tensor(table[:LENGTH])[None]
        for _ in range(2):
            query = encoder.layer[-1](hidden, encoder.get_attention_mask(mask), query_states=query,
                                      relative_pos=encoder.get_rel_pos(hidden),
                                      rel_embeddings=encoder.get_rel_embedding())[0]
        theirs = hf_model.lm_predictions(query, hf_model.deberta.embeddings.word_embeddings).numpy()
    real = batch["attention_mask"] > 0
    tol = deberta_rtol(model.config, LENGTH, model.config.num_hidden_layers + 4)
    assert_close_to_scale(ours, theirs, tol, "enhanced mask decoder logits", where=real)
    plain = np.asarray(model(batch).logits)  # the decoder is not the plain head: they differ far beyond tol
    assert np.abs(ours - plain)[real].max() > 100 * tol * np.abs(plain).max()


@pytest.mark.slow  # two decoder runs, each compiling its own programs: 10–15 s on the shared two cores
def test_enhanced_mask_decoder_reads_the_position_rows_it_is_given(tmp_path):
    """position_ids 2…T+1 read the table's rows 2…T+1: the same logits as 0…T−1 on the table without its first two
    rows (the encoder, with no absolute positions, is the same run); without a table, an InputError names it."""
    make_deberta(tmp_path, "ForMaskedLM", num_hidden_layers=2, legacy=False)
    model = minibert.load(tmp_path)
    batch = padded_batch(np.random.default_rng(11), 2, 7)
    table = np.random.default_rng(11).normal(0, 0.3, (V3["max_position_embeddings"], 30)).astype(np.float32)
    shifted = dict(batch, position_ids=np.arange(2, 9)[None])
    # two programs (with and without position_ids) round alike up to deberta_rtol over the blocks and the head
    assert_close_to_scale(enhanced_mask_decoder(model, shifted, table), enhanced_mask_decoder(model, batch, table[2:]),
                          deberta_rtol(model.config, 7, 2 + 4), "shifted rows", where=batch["attention_mask"] > 0)
    with pytest.raises(InputError, match="position_table"):
        enhanced_mask_decoder(model, batch)


def test_enhanced_mask_decoder_with_absolute_positions_is_the_models_head(tmp_path):
    """position_biased_input true: the authors' decoder returns the encoder's own prediction, computed by another
    program: within deberta_rtol of two programs through the block and the head."""
    make_deberta(tmp_path, "ForMaskedLM", num_hidden_layers=1, **V2)
    model = minibert.load(tmp_path)
    batch = model.tokenize(["abc def ghi"])
    rtol = deberta_rtol(model.config, batch.input_ids.shape[1], model.config.num_hidden_layers + 2)
    assert_close_to_scale(enhanced_mask_decoder(model, batch), model(batch).logits, rtol, "decoder vs head")


def test_log_buckets_are_transformers(tmp_path):
    """Bucket of every distance up to ±2000 equals transformers' make_log_bucket_position, at DeBERTa-v3's
    (256 buckets, 512) and the tiny configs' settings: the float32 ceil must land on the same integer."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    distances = np.arange(-2000, 2001)
    for buckets, largest in ((256, 512), (8, 12), (6, 64)):
        theirs = make_log_bucket_position(torch.tensor(distances), buckets, largest).long().numpy()
        np.testing.assert_array_equal(log_buckets(distances, buckets, largest), theirs)


@pytest.mark.slow
def test_score_terms_sum_to_the_scores_and_are_what_they_say(tmp_path):
    """attn.hook_c2c + hook_c2p + hook_p2c = hook_attn_scores at real keys (−inf at padding), and each term is, at
    sampled (b, h, t, s), the dot product its equation names: q_t·k_s, q_t·(LN(r) W_K + b_K)[δ] and
    k_s·(LN(r) W_Q + b_Q)[δ] over √(3K), with δ = clamp(bucket(t − s) + A) from transformers' bucket function."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    make_deberta(tmp_path, seed=4)
    model = minibert.load(tmp_path)
    batch = padded_batch(np.random.default_rng(5), 2, LENGTH)
    names = [f"blocks.1.attn.hook_{part}" for part in ("q", "k", "c2c", "c2p", "p2c", "attn_scores")]
    _, cache = model.run_with_cache(batch, names=names)
    q, k, c2c, c2p, p2c, scores = (np.asarray(cache[name], np.float64) for name in names)
    real_key = np.broadcast_to(batch["attention_mask"][:, None, None, :] > 0, scores.shape)
    np.testing.assert_array_equal(np.isneginf(scores), ~real_key)
    tol = deberta_rtol(model.config, LENGTH, 2)
    assert_close_to_scale((c2c + c2p + p2c)[real_key], scores[real_key], tol, "sum of the terms")

    params = model.params
    table = np.asarray(params["shared"]["table"], np.float64)
    ln = params["shared"]["ln"]
    centered = table - table.mean(-1, keepdims=True)
    r = centered / np.sqrt((centered**2).mean(-1, keepdims=True) + V3["layer_norm_eps"]) * ln["scale"] + ln["bias"]
    attn = params["blocks"][1]["attn"]
    pos_k = np.einsum("RD,DHK->RHK", r, attn["W_K"]) + attn["b_K"]  # share_att_key: the block's own W_K, W_Q
    pos_q = np.einsum("RD,DHK->RHK", r, attn["W_Q"]) + attn["b_Q"]
    A, K = V3["position_buckets"], model.config.head_dim
    scale = math.sqrt(3 * K)
    for b, h, t, s in [(0, 0, 0, 18), (0, 3, 17, 2), (1, 4, 5, 5), (0, 2, 9, 13), (1, 1, 1, 0)]:
        bucket = int(make_log_bucket_position(torch.tensor(t - s), A, V3["max_relative_positions"]))
        row = min(max(bucket + A, 0), 2 * A - 1)
        expected = {"c2c": q[b, t, h] @ k[b, s, h], "c2p": q[b, t, h] @ pos_k[row, h],
                    "p2c": k[b, s, h] @ pos_q[row, h]}
        for term, value in (("c2c", c2c), ("c2p", c2p), ("p2c", p2c)):
            assert abs(value[b, h, t, s] - expected[term] / scale) <= tol * np.abs(value).max(), (term, b, h, t, s)


@pytest.mark.slow
def test_stages_and_named_parameters_go_through_the_shared_table(tmp_path):
    """The relative table is one parameter (shared.table), not one per block; embed → blocks → head (api's stages)
    and a model rebuilt from named_parameters give run's output."""
    make_deberta(tmp_path, "ForSequenceClassification", seed=6)
    model = minibert.load(tmp_path)
    names = list(model.named_parameters())
    assert names.count("shared.table") == 1 and not [n for n in names if n.endswith(".table") and n != "shared.table"]
    batch = padded_batch(np.random.default_rng(7), 2, LENGTH)
    inputs = model.inputs(batch)
    x = model.embed(model.state, inputs)
    for layer in range(model.config.num_hidden_layers):
        x = model.block(model.state, layer, x, inputs)
    staged, whole = model.head(model.state, x).logits, model(batch).logits
    tol = deberta_rtol(model.config, LENGTH, model.config.num_hidden_layers + 2)
    assert_close_to_scale(staged, whole, tol, "stages vs run")
    rebuilt = minibert.Model.from_parameters(model.config, model.named_parameters())
    np.testing.assert_array_equal(rebuilt(batch).logits, whole)


@pytest.mark.slow
@pytest.mark.parametrize("suffix,config", [("ForMaskedLM", dict(legacy=False)), ("ForSequenceClassification", V2)],
                         ids=["mlm", "sequence-cls-v2"])
def test_saved_model_loads_in_transformers(tmp_path, suffix, config):
    """Model.save writes config.json and transformers' key names: transformers' Auto class reads the directory
    and computes the same logits (within deberta_rtol), and minibert reads it back to the same weights."""
    import transformers

    make_deberta(tmp_path / "original", suffix, seed=9, **config)
    model = minibert.load(tmp_path / "original")
    model.save(tmp_path / "saved")
    auto = transformers.AutoModelForMaskedLM if suffix == "ForMaskedLM" else \
        transformers.AutoModelForSequenceClassification
    assert_deberta_parity(model, auto.from_pretrained(tmp_path / "saved").eval(),
                          padded_batch(np.random.default_rng(9), 2, LENGTH))
    reloaded = minibert.load(tmp_path / "saved").named_parameters()
    assert reloaded.keys() == model.named_parameters().keys()
    for name, value in model.named_parameters().items():
        np.testing.assert_array_equal(reloaded[name], value, err_msg=name)


def test_released_checkpoints_extra_keys_are_left_unused(tmp_path):
    """microsoft/deberta-v3-* files carry their pretraining heads (lm_predictions.*, mask_predictions.*) and an
    unused position table beside the encoder, and their config.json names no architecture (DebertaV2Model): such a
    file loads, to the same encoder, and a key of no known use is still refused."""
    from safetensors.numpy import load_file, save_file

    make_deberta(tmp_path, "ForMaskedLM", num_hidden_layers=1, legacy=False)
    with_head = minibert.load(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    extra = {"mask_predictions.dense.weight": np.ones((30, 30), np.float32),
             "deberta.embeddings.position_embeddings.weight": np.ones((64, 30), np.float32)}
    save_file(tensors | extra, tmp_path / "model.safetensors")
    config = json.loads((tmp_path / "config.json").read_text())
    del config["architectures"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    bare = minibert.load(tmp_path)
    assert bare.config.architecture == "DebertaV2Model"
    encoder, everything = bare.named_parameters(), with_head.named_parameters()
    assert encoder.keys() == {name for name in everything if not name.startswith("mlm.")}
    for name, value in encoder.items():
        np.testing.assert_array_equal(value, everything[name], err_msg=name)
    save_file(tensors | {"deberta.encoder.extra.weight": np.ones(3, np.float32)}, tmp_path / "model.safetensors")
    with pytest.raises(minibert.CheckpointError, match="unexpected key.*encoder.extra.weight"):
        minibert.load(tmp_path)


@pytest.mark.parametrize("change,named", [
    (dict(conv_kernel_size=3), "conv_kernel_size"),
    (dict(relative_attention=False), "relative_attention"),
    (dict(norm_rel_ebd="layer_norm|other"), "norm_rel_ebd"),
    (dict(pos_att_type="p2c|c2p|p2p"), "pos_att_type"),
    (dict(type_vocab_size=3), "type_vocab_size = 3"),  # 2 rows load (test_two_segments_…)
    (dict(pooler_hidden_act="relu"), "pooler_hidden_act"),
    (dict(embedding_size=20), "embedding_size"),
    (dict(attention_head_size=5), "attention_head_size = 5"),  # the heads are 30 / 5 = 6 wide
])
def test_unsupported_settings_are_refused(tmp_path, change, named):
    make_deberta(tmp_path, num_hidden_layers=1)
    config = json.loads((tmp_path / "config.json").read_text()) | change
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=named):
        minibert.load(tmp_path)


def test_a_head_size_of_hidden_size_over_heads_is_accepted(tmp_path):
    make_deberta(tmp_path, num_hidden_layers=1, attention_head_size=6)
    assert minibert.load(tmp_path).config.setting("attention_head_size") == 6


V2_XLARGE = {  # microsoft/deberta-v2-xlarge's config.json
    "model_type": "deberta-v2", "attention_head_size": 64, "attention_probs_dropout_prob": 0.1, "conv_act": "gelu",
    "conv_kernel_size": 3, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 1536,
    "initializer_range": 0.02, "intermediate_size": 6144, "layer_norm_eps": 1e-07, "max_position_embeddings": 512,
    "max_relative_positions": -1, "norm_rel_ebd": "layer_norm", "num_attention_heads": 24, "num_hidden_layers": 24,
    "pad_token_id": 0, "pooler_dropout": 0, "pooler_hidden_act": "gelu", "pooler_hidden_size": 1536,
    "pos_att_type": ["p2c", "c2p"], "position_biased_input": False, "position_buckets": 256,
    "relative_attention": True, "share_att_key": True, "type_vocab_size": 0, "vocab_size": 128100}


def test_the_v2_xlarge_config_is_refused_for_its_convolution_layer():
    """Its keys read (attention_head_size = 1536 / 24 included); the model is refused naming the convolution, also
    when built from the config alone (no checkpoint, so no key table)."""
    config = read_config(V2_XLARGE)
    with pytest.raises(ConfigError, match="conv_kernel_size = 3: the convolution layer"):
        nnx.eval_shape(lambda: Encoder(config))


FULL_SIZE = {  # microsoft/deberta-v3-base and -large, config.json's values
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}
V3_RELEASED = dict(vocab_size=128100, max_position_embeddings=512, relative_attention=True, position_buckets=256,
                   norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type="p2c|c2p", layer_norm_eps=1e-7,
                   max_relative_positions=-1, position_biased_input=False, type_vocab_size=0)


@pytest.mark.parametrize("size", list(FULL_SIZE))
@pytest.mark.parametrize("suffix", ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"])
def test_full_size_parameter_counts(size, suffix):
    import transformers

    hf_config = transformers.DebertaV2Config(**FULL_SIZE[size], **V3_RELEASED, architectures=["DebertaV2" + suffix])
    with torch.device("meta"):
        hf_model = getattr(transformers, "DebertaV2" + suffix)(hf_config)
    theirs = sum(p.numel() for p in hf_model.parameters())  # tied weights (the MLM decoder) counted once
    config = read_config(hf_config.to_dict())
    shapes = nnx.state(nnx.eval_shape(lambda: Encoder(config)), nnx.Param)
    ours = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))
    assert ours == theirs


def write_deberta_tokenizer(directory):
    """A SentencePiece-style Unigram learnt here on test_families' CORPUS, handed to transformers' DebertaV2Tokenizer
    (its normalizer, Metaspace pre-tokenizer and [CLS] A [SEP] B [SEP] template), saved as tokenizer.json."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    learner = Tokenizer(models.Unigram())
    learner.pre_tokenizer = pre_tokenizers.Metaspace()
    learner.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=150, special_tokens=specials,
                                                                unk_token="[UNK]"))
    vocab = [tuple(piece) for piece in json.loads(learner.to_str())["model"]["vocab"]]
    tokenizer = transformers.DebertaV2Tokenizer(vocab=vocab)
    tokenizer.save_pretrained(directory)
    return tokenizer


def test_deberta_tokenizer_matches_transformers(tmp_path):
    import transformers

    write_deberta_tokenizer(tmp_path)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").exists() and not (tmp_path / "vocab.txt").exists()
    ours = tokenizer_for(tmp_path, read_config(dict(V3, max_position_embeddings=512, model_type="deberta-v2")))
    rng = np.random.default_rng(12)
    texts, pairs = fuzz_texts(rng, 200), fuzz_texts(rng, 200)
    for first, second in [(texts, None), (texts[:100], pairs[:100])]:
        batch, theirs = ours(first, second), hf_rows(hf_tokenizer, first, second)
        # token_type_ids too (issue 32 A8): sentence B gets segment 1, as transformers gives it, though no
        # DeBERTa-v3 reads it (type_vocab_size 0).
        mine = dict(input_ids=batch.input_ids.tolist(), attention_mask=batch.attention_mask.tolist(),
                    token_type_ids=batch.token_type_ids.tolist(), offsets=batch.offsets, word_ids=batch.word_ids,
                    sequence_ids=batch.sequence_ids)
        theirs["offsets"] = [[tuple(span) for span in row] for row in theirs["offsets"]]
        assert mine == {name: theirs[name] for name in mine}
    assert (ours.cls_token, ours.mask_token, ours.pad_token_id) == ("[CLS]", "[MASK]", hf_tokenizer.pad_token_id)


def test_a_directory_with_only_spm_model_says_how_to_convert(tmp_path):
    (tmp_path / "spm.model").write_bytes(b"\x00")  # DeBERTa-v3's SentencePiece file name
    with pytest.raises(TokenizerError, match=r"spm\.model.*save_pretrained"):
        tokenizer_for(tmp_path, read_config(dict(V3, model_type="deberta-v2")))


def unpacked(packed: dict) -> np.ndarray:
    """The layers of one float32 array a view embeds ([L, ...]), decoded as viz._html packs them."""
    import base64
    import zlib

    layers = [np.frombuffer(zlib.decompress(base64.b64decode(layer)), np.uint8).reshape(4, -1).T.copy().view("<f4")
              for layer in packed["layers"]]
    return np.stack([layer.reshape(packed["shape"]) for layer in layers])


@pytest.mark.slow
def test_neuron_view_shows_the_three_terms(tmp_path, browser):
    """viz.document of a DeBERTa model keeps attn.hook_c2c/c2p/p2c; its neuron view embeds them exactly (float32),
    their sum's softmax is the model's pattern (so the pattern is not carried), and the page shows each term's
    column, their sum as the scores and its softmax for the query."""
    from test_views import Loaded, page_of, shown_column

    from minibert import viz

    make_deberta(tmp_path, seed=8)
    model = minibert.load(tmp_path)
    doc = viz.document(model, "abc def ghi jkl mno pqr stu vwx")
    names = [f"blocks.*.attn.hook_{part}" for part in ("c2c", "c2p", "p2c", "pattern")]
    _, cache = model.run_with_cache(model.tokenize(["abc def ghi jkl mno pqr stu vwx"]), names=names)
    layer, head, query = 1, 2, 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # softmax(c2c + c2p + p2c) is the pattern: no mismatch warning
        view = doc.neuron_view(layer=layer, head=head, query_index=query)
    assert "attention" not in view.data["arrays"] and view.data["meta"]["terms"] == ["c2c", "c2p", "p2c"]
    for term in ("c2c", "c2p", "p2c"):
        hooked = np.asarray(cache.stack(f"hook_{term}"))[:, 0]  # [L, H, T, S]
        np.testing.assert_array_equal(unpacked(view.data["arrays"][term]), hooked)
    page = Loaded(browser, content=page_of(view))
    page.settle()
    terms = [np.asarray(cache.stack(f"hook_{term}"))[layer, 0, head, query].astype(np.float64)
             for term in ("c2c", "c2p", "p2c")]
    for term, row in zip(("c2c", "c2p", "p2c"), terms):
        np.testing.assert_array_equal(shown_column(page.page, term), row)
    scores = sum(terms)  # the page adds the three float32 values in float64: 2 roundings of 2⁻⁵³ each
    np.testing.assert_allclose(shown_column(page.page, "scaled"), scores, rtol=0,
                               atol=2 * np.finfo(np.float64).eps * np.abs(terms).sum(axis=0).max())
    pattern = np.asarray(cache.stack("hook_pattern"))[layer, 0, head, query]
    np.testing.assert_allclose(shown_column(page.page, "softmax"), pattern, rtol=0, atol=viz.views.SOFTMAX_TOLERANCE)
    assert page.problems == []


def test_share_att_key_must_be_a_boolean_and_cls_dropout_loads(tmp_path):
    """issue 32 A5/A8: "share_att_key": "false" (a string) read as true, silently another attention; a fine-tuned
    config's cls_dropout (a training-only rate) was refused at load."""
    make_deberta(tmp_path, "ForSequenceClassification", num_hidden_layers=1, **V2)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"share_att_key": "false"}))
    with pytest.raises(ConfigError, match="share_att_key must be true or false"):
        minibert.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"cls_dropout": 0.1}))
    assert minibert.load(tmp_path).config.architecture == "DebertaV2ForSequenceClassification"


def test_transformers_segment_ids_are_accepted_and_ignored(tmp_path):
    """issue 32 A8: ids as DebertaV2Tokenizer gives them (sentence B segment 1) were refused ("token_type_ids must
    lie in [0, 1)") though DeBERTa-v3 reads no segments: accepted, and the outputs are those of all-zero segments
    (the same program on the same values but the ignored segments: exact)."""
    make_deberta(tmp_path, "Model", **V3)
    model = minibert.load(tmp_path)
    batch = model.tokenize(["abc def"], ["ghi"]).to_dict()
    types = np.asarray(batch["token_type_ids"])  # as transformers gives them (the test above)
    assert types.max() == 1
    with_types = model(batch | {"token_type_ids": types}).last_hidden_state
    np.testing.assert_array_equal(with_types, model(batch | {"token_type_ids": 0 * types}).last_hidden_state)
    with pytest.raises(InputError, match=r"token_type_ids must lie in \[0, 2\)"):
        model(batch | {"token_type_ids": 2 * types})


@pytest.mark.slow
def test_two_segments_load_with_the_tokenizers_pair_segments(tmp_path):
    """Before: type_vocab_size = 2, which transformers loads (DebertaV2Tokenizer giving sentence B segment 1),
    was refused. Loaded, a pair's batch is transformers' tokenizer's (segments 0/1 too) and the hidden states
    are DebertaV2Model's on it within deberta_rtol; its segment-1 row is read (segments all 0 differ)."""
    import transformers

    hf_model = make_deberta(tmp_path, "Model", **dict(V2, type_vocab_size=2, vocab_size=150))
    for written in ("vocab.txt", "tokenizer_config.json"):  # the Unigram tokenizer in their place
        (tmp_path / written).unlink()
    write_deberta_tokenizer(tmp_path)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    model = minibert.load(tmp_path)
    first, second = ["the cat sat", "a dog ran far away"], ["on the mat", "home"]
    batch = model.tokenize(first, second)
    theirs = hf_tokenizer(first, second, padding=True, return_tensors="np")
    for name in ("input_ids", "token_type_ids", "attention_mask"):
        np.testing.assert_array_equal(np.asarray(getattr(batch, name)), theirs[name], err_msg=name)
    assert np.asarray(batch.token_type_ids).max() == 1
    with torch.no_grad():
        ref = hf_model(**{k: torch.tensor(v) for k, v in theirs.items()}).last_hidden_state.numpy()
    ours = np.asarray(model(batch).last_hidden_state)
    real = np.asarray(batch.attention_mask) > 0
    tol = deberta_rtol(model.config, batch.input_ids.shape[1], model.config.num_hidden_layers + 1)
    assert_close_to_scale(ours, ref, tol, "last hidden state", where=real)
    zeros = np.asarray(model(batch.to_dict() | {"token_type_ids": 0 * np.asarray(batch.token_type_ids)})
                       .last_hidden_state)
    assert np.abs(zeros - ours)[real].max() > 100 * tol * np.abs(ref).max()  # the check is not vacuous

"""Modern encoders: ModernBERT against transformers' own classes.

Tiny random models with odd sizes (D = 30, 5 heads of 6, F = 37, vocabulary 99), built with transformers,
every weight redrawn, saved with save_pretrained and loaded by minibert; fp32, eager attention. Compared:
every layer's hidden state, every attention pattern (local layers included, on rows longer than the window),
the last hidden state and each head's logits, on padded batches, within forward_rtol (tests/tolerances.py:
λ·√N·u over the N roundings of both programs; the head is one stage more). Full-size configurations:
parameter counts from shapes alone (jax.eval_shape against torch's meta device).
"""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
import torch
from conftest import write_vocab
from flax import nnx
from test_families import CORPUS, fuzz_texts, hf_rows
from tolerances import assert_close_to_scale, forward_rtol

import minibert
from minibert.core.config import Config
from minibert.core.encoder import Encoder
from minibert.errors import ConfigError, InputError
from minibert.families.modernbert import GLOBAL, LOCAL, layer_kinds, rope_theta
from minibert.families.registry import config_for
from minibert.io.config_json import read_config
from minibert.io.tokenizers_hf import tokenizer_for

VOCAB = 99
PAD = 0
MODERN = dict(vocab_size=VOCAB, hidden_size=30, num_hidden_layers=4, num_attention_heads=5, intermediate_size=37,
              max_position_embeddings=64, local_attention=6, global_attn_every_n_layers=3, pad_token_id=PAD,
              bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None)
LENGTH = 13  # longer than a local layer's window (local_attention = 6: ±3 tokens)


def make_modernbert(directory, suffix: str = "Model", *, seed: int = 0, scale: float = 0.3, **config):
    """A tiny random transformers ModernBert<suffix>, every weight redrawn (norm gains near 1), saved; the model."""
    import transformers

    settings = MODERN | config
    cfg = transformers.ModernBertConfig(**settings, architectures=["ModernBert" + suffix], num_labels=3)
    cfg._attn_implementation = "eager"  # the one that returns attention patterns
    torch.manual_seed(seed)
    model = getattr(transformers, "ModernBert" + suffix)(cfg).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.copy_(1 + 0.2 * torch.randn_like(module.weight))
                if module.bias is not None:
                    module.bias.copy_(scale * torch.randn_like(module.bias))
            else:
                for p in module.parameters(recurse=False):
                    p.copy_(scale * torch.randn_like(p))
    model.save_pretrained(directory)
    write_vocab(directory, VOCAB)
    return model


def padded_batch(rng, batch: int, length: int) -> dict:
    """Random ids, right padding; row 0 full length, the others shorter."""
    lengths = rng.integers(2, length + 1, size=batch)
    lengths[0] = length
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int64)
    return {"input_ids": np.where(mask == 1, rng.integers(5, VOCAB, size=(batch, length)), PAD),
            "attention_mask": mask}


def hf_outputs(hf_model, batch):
    with torch.no_grad():
        return hf_model(**{k: torch.tensor(v) for k, v in batch.items()}, output_hidden_states=True,
                        output_attentions=True)


def rtols(config: Config, length: int) -> tuple[float, float]:
    """(encoder, head) tolerances: forward_rtol of the L blocks, and of one stage more for the head's reductions."""
    head = dataclasses.replace(config, num_hidden_layers=config.num_hidden_layers + 1)
    return forward_rtol(config, S=length), forward_rtol(head, S=length)


def assert_modern_parity(model, hf_model, batch):
    """Every layer's hidden state and pattern at real query rows, and the last hidden state, within forward_rtol."""
    length = batch["input_ids"].shape[1]
    tol, head_tol = rtols(model.config, length)
    out, cache = model.run_with_cache(batch, names=["hook_full_embed", "blocks.*.hook_resid_post",
                                                    "blocks.*.attn.hook_pattern"])
    ref = hf_outputs(hf_model, batch)
    real = batch["attention_mask"] > 0
    # transformers' hidden states: the embeddings, each layer's output but the last, then the final norm's output
    ours = [cache["hook_full_embed"], *cache.stack("hook_resid_post")[:-1]]
    assert len(ours) + 1 == len(ref.hidden_states)
    for layer, (mine, theirs) in enumerate(zip(ours, ref.hidden_states)):
        assert_close_to_scale(mine, theirs, tol, f"hidden state {layer}", where=real)
    assert_close_to_scale(out.last_hidden_state, ref.hidden_states[-1], head_tol, "last hidden state", where=real)
    patterns = np.asarray(cache.stack("hook_pattern"))
    rows = np.broadcast_to(real[:, None, :, None], patterns.shape[1:])
    for layer, theirs in enumerate(ref.attentions):
        assert_close_to_scale(patterns[layer], theirs, tol, f"attention {layer}", where=rows)
    return out, ref, head_tol


@pytest.mark.slow
@pytest.mark.parametrize("config", [
    {},
    # biases everywhere, another θ pair, every other layer global, a wider window
    dict(norm_bias=True, attention_bias=True, mlp_bias=True, global_attn_every_n_layers=2, local_attention=8,
         rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5000.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}},
         hidden_activation="gelu_pytorch_tanh"),
], ids=["defaults", "biases"])
def test_modernbert_encoder_parity(tmp_path, config):
    hf_model = make_modernbert(tmp_path, **config)
    model = minibert.load(tmp_path)
    assert model.config.model_type == "modernbert"
    assert_modern_parity(model, hf_model, padded_batch(np.random.default_rng(1), 3, LENGTH))


@pytest.mark.slow
@pytest.mark.parametrize("suffix,config", [
    ("ForMaskedLM", {}),
    ("ForMaskedLM", dict(decoder_bias=False, classifier_bias=True, classifier_activation="relu")),
    ("ForSequenceClassification", {}),
    ("ForSequenceClassification", dict(classifier_pooling="mean", classifier_bias=True)),
    ("ForTokenClassification", {}),
], ids=["mlm", "mlm-biases", "sequence-cls", "sequence-mean", "token"])
def test_modernbert_head_parity(tmp_path, suffix, config):
    hf_model = make_modernbert(tmp_path, suffix, seed=2, **config)
    model = minibert.load(tmp_path)
    assert model.config.architecture == "ModernBert" + suffix
    batch = padded_batch(np.random.default_rng(2), 4, LENGTH)
    out, ref, head_tol = assert_modern_parity(model, hf_model, batch)
    real = batch["attention_mask"] > 0
    assert_close_to_scale(out.logits, ref.logits.numpy(), head_tol, f"{suffix} logits",
                          where=real if np.ndim(out.logits) == 3 else None)


@pytest.mark.slow
def test_local_window_is_masked_in_the_scores(tmp_path):
    """Local layers hold −inf at keys more than local_attention/2 from the query, global layers at padding only;
    the scores are the rotated q·k/√K (a loop over positions and heads)."""
    make_modernbert(tmp_path)
    model = minibert.load(tmp_path)
    batch = padded_batch(np.random.default_rng(3), 2, LENGTH)
    _, cache = model.run_with_cache(batch, names=["blocks.*.attn.hook_attn_scores", "blocks.*.attn.hook_rot_q",
                                                  "blocks.*.attn.hook_rot_k"])
    kinds, half = layer_kinds(model.config), MODERN["local_attention"] // 2
    assert kinds == (GLOBAL, LOCAL, LOCAL, GLOBAL)
    real_key = batch["attention_mask"][:, None, None, :] > 0
    distance = np.abs(np.arange(LENGTH)[:, None] - np.arange(LENGTH)[None, :])
    for layer, kind in enumerate(kinds):
        scores = np.asarray(cache[f"blocks.{layer}.attn.hook_attn_scores"])  # [B, H, T, S]
        visible = real_key & ((distance <= half) if kind == LOCAL else True)
        np.testing.assert_array_equal(np.isneginf(scores), ~np.broadcast_to(visible, scores.shape))
        q, k = (np.asarray(cache[f"blocks.{layer}.attn.hook_rot_{x}"], np.float64) for x in "qk")
        K = q.shape[-1]
        for b, h, t, s in [(0, 0, 5, 6), (1, 4, 0, 1), (0, 2, 12, 12)]:
            expected = q[b, t, h] @ k[b, s, h] / np.sqrt(K)
            assert abs(scores[b, h, t, s] - expected) <= forward_rtol(model.config, S=LENGTH) * abs(scores[0]).max()


def test_older_config_keys_give_the_same_layers(tmp_path):
    """Hub configs before transformers 5 say global_attn_every_n_layers and global/local_rope_theta; those written
    by transformers 5 say layer_types and rope_parameters. Both give transformers' layer kinds and θ."""
    import transformers

    hf = transformers.ModernBertConfig(**(MODERN | dict(num_hidden_layers=5, global_attn_every_n_layers=2)))
    old = dict(MODERN, num_hidden_layers=5, global_attn_every_n_layers=2, global_rope_theta=160_000.0,
               local_rope_theta=10_000.0, model_type="modernbert")
    new = hf.to_dict()
    for source in (old, new):
        config = read_config(source)
        assert layer_kinds(config) == tuple(hf.layer_types)
        for kind in (GLOBAL, LOCAL):
            assert rope_theta(config, kind) == hf.rope_parameters[kind]["rope_theta"]


@pytest.mark.parametrize("change,named", [
    (dict(layer_types=["full_attention"]), "layer_types"),
    (dict(rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 1.0}}), "rope_type"),
    (dict(classifier_pooling="max"), "classifier_pooling"),
    (dict(num_attention_heads=6), "odd"),  # 30 / 6 = 5-wide heads cannot be rotated in pairs
])
def test_unsupported_settings_are_refused(tmp_path, change, named):
    make_modernbert(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text()) | change
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=named):
        minibert.load(tmp_path)


def test_a_model_built_from_a_config_alone_is_refused_alike():
    """Without a checkpoint there is no key table to check the config: the model's code checks it."""
    config = read_config(dict(MODERN, model_type="modernbert", classifier_pooling="max"))
    with pytest.raises(ConfigError, match="classifier_pooling"):
        nnx.eval_shape(lambda: Encoder(config))


FULL_SIZE = {  # answerdotai/ModernBERT-base and -large, config.json's sizes
    "base": dict(hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152),
    "large": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, intermediate_size=2624),
}


@pytest.mark.parametrize("size", list(FULL_SIZE))
@pytest.mark.parametrize("suffix", ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"])
def test_full_size_parameter_counts(size, suffix):
    import transformers

    hf_config = transformers.ModernBertConfig(**FULL_SIZE[size], architectures=["ModernBert" + suffix])
    with torch.device("meta"):
        theirs = sum(p.numel() for p in getattr(transformers, "ModernBert" + suffix)(hf_config).parameters())
    config = read_config(hf_config.to_dict())
    shapes = nnx.state(nnx.eval_shape(lambda: Encoder(config)), nnx.Param)
    ours = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))
    assert ours == theirs


def write_modernbert_tokenizer(directory):
    """A byte-level BPE trained here on test_families' CORPUS with ModernBERT's special tokens and its template
    ([CLS] A [SEP], [CLS] A [SEP] B [SEP]), saved by transformers' PreTrainedTokenizerFast (the class ModernBERT's
    tokenizer_config.json names)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    ids = {token: backend.token_to_id(token) for token in ("[CLS]", "[SEP]")}
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0", special_tokens=list(ids.items()))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
        mask_token="[MASK]")
    tokenizer.save_pretrained(directory)
    return tokenizer


def test_modernbert_tokenizer_matches_transformers(tmp_path):
    import transformers

    write_modernbert_tokenizer(tmp_path)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = tokenizer_for(tmp_path, config_for("ModernBertModel", type_vocab_size=1,
                                              pad_token_id=hf_tokenizer.pad_token_id))
    rng = np.random.default_rng(11)
    texts, pairs = fuzz_texts(rng, 200), fuzz_texts(rng, 200)
    for first, second in [(texts, None), (texts[:100], pairs[:100])]:
        batch, theirs = ours(first, second), hf_rows(hf_tokenizer, first, second)
        assert batch.input_ids.tolist() == theirs["input_ids"]
        assert batch.attention_mask.tolist() == theirs["attention_mask"]
        assert batch.offsets == [[tuple(span) for span in row] for row in theirs["offsets"]]
        assert batch.word_ids == theirs["word_ids"]
        assert batch.sequence_ids == theirs["sequence_ids"]
    assert (ours.cls_token, ours.mask_token, ours.pad_token_id) == ("[CLS]", "[MASK]", hf_tokenizer.pad_token_id)


@pytest.mark.slow
def test_logit_lens_reads_each_block_through_ln_final(tmp_path):
    """A pre-LN model's logit lens: every block's hook_resid_post through ln_final and the MLM head, against
    transformers' final_norm → head → decoder applied to its hidden states (the last one is the forward's logits)."""
    from minibert.analysis import logit_lens

    hf_model = make_modernbert(tmp_path, "ForMaskedLM", seed=4)
    model = minibert.load(tmp_path)
    batch = padded_batch(np.random.default_rng(4), 2, LENGTH)
    lens = np.asarray(logit_lens(model, batch))  # [L + 1, B, T, V]
    ref = hf_outputs(hf_model, batch)
    with torch.no_grad():
        read = lambda h: hf_model.decoder(hf_model.head(hf_model.model.final_norm(h))).numpy()  # noqa: E731
        theirs = [read(h) for h in ref.hidden_states[:-1]] + [ref.logits.numpy()]
    _, head_tol = rtols(model.config, LENGTH)
    real = batch["attention_mask"] > 0
    for stream, expected in enumerate(theirs):
        assert_close_to_scale(lens[stream], expected, head_tol, f"lens stream {stream}", where=real)


def test_no_position_table_is_said(tmp_path):
    make_modernbert(tmp_path)
    model = minibert.load(tmp_path)
    with pytest.raises(InputError, match="ModernBERT has no position-embedding table"):
        _ = model.W_pos


@pytest.mark.slow
def test_patching_runs_through_modernbert_blocks(tmp_path):
    """Activation patching of attn.hook_rot_q (a rotary site) per position against a loop of patched forwards."""
    from minibert.analysis import patch_activations

    make_modernbert(tmp_path, "ForMaskedLM", seed=6)
    model = minibert.load(tmp_path)
    rng = np.random.default_rng(6)
    clean, corrupted = (padded_batch(rng, 1, 9) for _ in range(2))
    metric = lambda out: out.logits[:, 4, 7]  # noqa: E731
    grid = patch_activations(model, clean, corrupted, metric, site="attn.hook_rot_q")  # [L, T]
    _, cache = model.run_with_cache(clean, names="blocks.*.attn.hook_rot_q")
    for layer, position in [(0, 4), (1, 0), (2, 8), (3, 3)]:
        name = f"blocks.{layer}.attn.hook_rot_q"
        patch = lambda value, ctx, name=name, position=position: value.at[:, position].set(  # noqa: E731
            cache[name][:, position])
        expected = float(metric(model.run_with_hooks(corrupted, {name: patch}))[0])
        _, head_tol = rtols(model.config, 9)
        assert abs(grid[layer, position] - expected) <= head_tol * abs(grid).max()


@pytest.mark.parametrize(("key", "value", "named"), [
    ("local_rope_theta", 0, "local_rope_theta must be a finite number > 0, got 0"),  # loaded, then NaN everywhere
    ("norm_eps", -1, "norm_eps must be a finite number > 0, got -1"),
    ("global_rope_theta", "abc", "global_rope_theta must be a finite number > 0, got 'abc'"),  # a raw ValueError
    ("norm_eps", "x", "norm_eps must be a finite number > 0, got 'x'"),
    ("norm_bias", "false", "norm_bias must be true or false"),  # the string read as true
])
def test_numeric_and_boolean_settings_are_checked_at_load(tmp_path, key, value, named):
    """issue 32 A5/C: each of these loaded (or raised a raw exception) and gave NaN or a silently other model."""
    make_modernbert(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("rope_parameters", None)  # the pre-transformers-5 keys, as Hub configs carry them
    (tmp_path / "config.json").write_text(json.dumps(cfg | {key: value}))
    with pytest.raises(ConfigError, match=named):
        minibert.load(tmp_path)

"""The BERT family: RoBERTa (and XLM-R, CamemBERT), DistilBERT, ELECTRA, ALBERT.

Parity with Hugging Face transformers (PyTorch, eager attention), fp32, on tiny random models of each
family with odd sizes, built and saved here: every hidden state, every attention map and each head's
logits within 1e-5 (TINY, derived in test_parity.py's terms: fp32 rounding, eps = 1.2e-7, through
reductions of at most 37 terms of magnitude ≲ 10, then LayerNorm, is a few 1e-6 per layer). Tokenizers:
byte-level BPE and Unigram tokenizers trained here with the `tokenizers` library, compared with
transformers' AutoTokenizer on a few hundred fuzzed strings (ids, offsets, word ids, segments).
"""

from __future__ import annotations

import dataclasses
import json
import string

import jax
import numpy as np
import pytest
import torch
from conftest import write_vocab
from test_parity import TINY, assert_close, assert_parity
from tolerances import forward_rtol

import minibert
from minibert.core import encoder as model_lib
from minibert.core import shows
from minibert.core.config import Config
from minibert.families import Family, LayerKeys, registry
from minibert.families.registry import ARCHITECTURES, FAMILIES, config_for
from minibert.io.config_json import read_config
from minibert.io.tokenizers_hf import tokenizer_for

VOCAB = 99
HF_CLASSES = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert",
              "distilbert": "DistilBert", "electra": "Electra", "albert": "Albert"}
# Odd sizes: head widths, FFN and embedding widths that share no factor with each other.
SIZES = {
    "roberta": dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
                    max_position_embeddings=40, type_vocab_size=1, pad_token_id=1),
    "xlm-roberta": dict(hidden_size=20, num_hidden_layers=2, num_attention_heads=5, intermediate_size=29,
                        max_position_embeddings=40, type_vocab_size=1, pad_token_id=1, hidden_act="gelu_new"),
    "camembert": dict(hidden_size=18, num_hidden_layers=1, num_attention_heads=2, intermediate_size=23,
                      max_position_embeddings=40, type_vocab_size=1, pad_token_id=1),
    "distilbert": dict(dim=30, n_layers=2, n_heads=5, hidden_dim=37, max_position_embeddings=40),
    "electra": dict(embedding_size=10, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                    intermediate_size=37, max_position_embeddings=40, type_vocab_size=3),
    "albert": dict(embedding_size=10, hidden_size=24, num_hidden_layers=3, num_attention_heads=4,
                   intermediate_size=37, max_position_embeddings=40, hidden_act="gelu_new"),
}


CORPUS = ["Hello world, this is a test.", "The quick brown fox jumps over the lazy dog!",
          "Ünïcödé façade, café and naïve résumé.", "Numbers 1234 and symbols $%& (brackets) [x].",
          "日本語のテキストと English mixed.", "Don't stop: it's 3:45pm, isn't it?"] * 10
TOKENIZER_CLASSES = {"roberta": "RobertaTokenizer", "xlm-roberta": "XLMRobertaTokenizer",
                     "camembert": "CamembertTokenizer", "albert": "AlbertTokenizer"}


def write_tokenizer(directory, model_type: str) -> int:
    """The family's tokenizer files, as transformers writes them, over a vocabulary trained here on CORPUS:
    byte-level BPE merges (RoBERTa) or Unigram pieces with scores (XLM-R, CamemBERT, ALBERT) learnt with
    `tokenizers`, handed to transformers' own tokenizer class, saved with save_pretrained (tokenizer.json
    with the family's normalizer, pre-tokenizer, special tokens and template). WordPiece families get a
    vocab.txt (conftest.write_vocab). Returns the vocabulary size."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    if model_type in ("distilbert", "electra"):
        write_vocab(directory, VOCAB)
        return VOCAB
    hf_class = getattr(transformers, TOKENIZER_CLASSES[model_type])
    defaults = hf_class().get_vocab()  # the class's default vocabulary: its special tokens
    specials = sorted(defaults, key=defaults.get)
    if model_type == "roberta":
        learner = Tokenizer(models.BPE())
        learner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        learner.train_from_iterator(CORPUS, trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        model = json.loads(learner.to_str())["model"]
        tokenizer = hf_class(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]])
    else:
        learner = Tokenizer(models.Unigram())
        learner.pre_tokenizer = pre_tokenizers.Metaspace()
        learner.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=150, special_tokens=specials,
                                                                    unk_token="<unk>"))
        tokenizer = hf_class(vocab=[tuple(piece) for piece in json.loads(learner.to_str())["model"]["vocab"]])
    tokenizer.save_pretrained(directory)
    return len(tokenizer)


def make_family_model(directory, model_type: str, suffix: str = "Model", *, seed: int = 0, scale: float = 0.3,
                      **config):
    """A tiny random HF model of a family: every weight redrawn (LayerNorm gains near 1), saved; the torch model."""
    import transformers

    prefix = HF_CLASSES[model_type]
    settings = dict(vocab_size=VOCAB, **SIZES[model_type]) | config
    cfg = getattr(transformers, f"{prefix}Config")(**settings, architectures=[prefix + suffix], num_labels=3)
    torch.manual_seed(seed)
    model = getattr(transformers, prefix + suffix)(cfg).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.copy_(1 + 0.2 * torch.randn_like(module.weight))
                module.bias.copy_(scale * torch.randn_like(module.bias))
            elif not isinstance(module, torch.nn.LayerNorm):
                for p in module.parameters(recurse=False):
                    p.copy_(scale * torch.randn_like(p))
    model.save_pretrained(directory)
    write_tokenizer(directory, model_type)
    return model


def family_batch(rng, model_type: str, batch: int, length: int):
    """Random ids (none special), right padding with the family's pad id, segments where the family has them."""
    sizes = SIZES[model_type]
    pad = sizes.get("pad_token_id", 0)
    ids = rng.integers(5, VOCAB, size=(batch, length))
    lengths = rng.integers(2, length + 1, size=batch)
    lengths[0] = length
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int64)
    inputs = {"input_ids": np.where(mask == 1, ids, pad), "attention_mask": mask}
    if model_type != "distilbert":
        types = np.zeros_like(ids)
        for b, n in enumerate(lengths):
            types[b, n // 2:n] = rng.integers(0, sizes.get("type_vocab_size", 2))
        inputs["token_type_ids"] = types
    return inputs


@pytest.mark.parametrize("model_type", list(HF_CLASSES))
def test_encoder_parity(tmp_path, model_type):
    hf_model = make_family_model(tmp_path, model_type)
    model = minibert.load(tmp_path)
    assert model.config.model_type == model_type
    out, ref = assert_parity(model, hf_model, family_batch(np.random.default_rng(1), model_type, 3, 11), TINY)
    if model.config.heads.pooler:
        assert_close(out.pooler_output, ref.pooler_output, TINY, "pooler")


HEAD_CASES = [(t, s) for t in HF_CLASSES for s in ("ForMaskedLM", "ForSequenceClassification",
                                                   "ForTokenClassification")] + [("electra", "ForPreTraining")]


@pytest.mark.parametrize("model_type,suffix", HEAD_CASES, ids=lambda v: v)
def test_head_parity(tmp_path, model_type, suffix):
    hf_model = make_family_model(tmp_path, model_type, suffix)
    model = minibert.load(tmp_path)
    assert model.config.architecture == HF_CLASSES[model_type] + suffix
    out, ref = assert_parity(model, hf_model, family_batch(np.random.default_rng(2), model_type, 4, 9), TINY)
    assert_close(out.logits, ref.logits, TINY, f"{model_type} {suffix} logits")


@pytest.mark.parametrize("model_type,config", [
    ("electra", dict(embedding_size=24)),  # no projection when the widths agree (HF builds none)
    ("distilbert", dict(sinusoidal_pos_embds=True, activation="relu")),
    ("roberta", dict(max_position_embeddings=13)),  # the longest row: 13 − (pad 1 + 1) = 11 tokens
])
def test_variant_parity(tmp_path, model_type, config):
    hf_model = make_family_model(tmp_path, model_type, **config)
    model = minibert.load(tmp_path)
    assert_parity(model, hf_model, family_batch(np.random.default_rng(3), model_type, 3, 11), TINY)


def fuzz_texts(rng, n: int) -> list[str]:
    """Strings that stress normalisation and offsets: mixed scripts, accents, emoji, runs of odd whitespace,
    punctuation glued to words, and special tokens written in the text."""
    pieces = [*CORPUS[:6], *string.punctuation, "  ", "\t", "\n", " ", "café", "naïve", "ÉCOLE", "ß", "ﬁ",
              "日本", "😀", "\u00a0", "\u200b", "x\u0301", "<mask>", "[MASK]", "<s>", "Hello", "world", "123", "-"]
    texts = []
    for _ in range(n):
        chosen = rng.choice(len(pieces), size=rng.integers(0, 8))
        texts.append("".join(pieces[i] if rng.random() < 0.7 else " " + pieces[i] for i in chosen))
    return texts


def hf_rows(hf_tokenizer, texts, pairs, **kwargs) -> dict[str, list]:
    """transformers' encoding of a batch, as the per-row lists a minibert Batch holds."""
    encoded = hf_tokenizer(texts, pairs, padding=True, return_offsets_mapping=True, return_token_type_ids=True,
                           **kwargs)
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"],
            "token_type_ids": encoded["token_type_ids"], "offsets": encoded["offset_mapping"],
            "word_ids": [encoded.word_ids(i) for i in range(len(texts))],
            "sequence_ids": [encoded.sequence_ids(i) for i in range(len(texts))]}


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "camembert", "albert"])
def test_tokenizer_matches_transformers(tmp_path, model_type):
    import transformers

    write_tokenizer(tmp_path, model_type)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    architecture = HF_CLASSES[model_type] + "Model"
    segments = model_type == "albert"
    config = config_for(architecture, type_vocab_size=2 if segments else 1, pad_token_id=hf_tokenizer.pad_token_id)
    ours = tokenizer_for(tmp_path, config)
    rng = np.random.default_rng(7)
    texts, pairs = fuzz_texts(rng, 300), fuzz_texts(rng, 300)
    for first, second, kwargs in [(texts, None, {}), (texts[:150], pairs[:150], {}),
                                  (texts[150:], pairs[150:], {"max_length": 12, "truncation": "longest_first"})]:
        batch = ours(first, second, max_length=kwargs.get("max_length"))
        theirs = hf_rows(hf_tokenizer, first, second, **kwargs)
        assert batch.input_ids.tolist() == theirs["input_ids"]
        assert batch.attention_mask.tolist() == theirs["attention_mask"]
        assert batch.offsets == [[tuple(span) for span in row] for row in theirs["offsets"]]
        assert batch.word_ids == theirs["word_ids"]
        assert batch.sequence_ids == theirs["sequence_ids"]
        # Sentence B gets segment 1 where the family has segments (ALBERT); RoBERTa's template gives 0 anyway.
        assert batch.token_type_ids.tolist() == theirs["token_type_ids"]
        assert batch.tokens == [hf_tokenizer.convert_ids_to_tokens(row) for row in theirs["input_ids"]]
    specials = {name: getattr(hf_tokenizer, name) for name in ("cls_token", "sep_token", "pad_token", "mask_token")}
    assert {name: getattr(ours, name) for name in specials} == specials
    assert ours.pad_token_id == hf_tokenizer.pad_token_id


# ---- config: one table of families, strict keys ------------------------------------------------------------

def test_every_family_class_is_in_the_tables():
    """ARCHITECTURES names exactly the classes transformers has for each family's heads minibert builds."""
    import transformers

    for name, model_type in ((n, config_for(n).model_type) for n in ARCHITECTURES):
        assert hasattr(transformers, name), name
        assert getattr(transformers, name).config_class.model_type == model_type
    # ModernBERT's and DeBERTa's parity: test_families_modern.py, test_families_deberta.py
    assert set(FAMILIES) == {"bert", *HF_CLASSES, "modernbert", "deberta-v2"}


@pytest.mark.parametrize("model_type", list(HF_CLASSES))
def test_transformers_config_dicts_pass_the_allow_list(model_type):
    """A config.json as transformers writes it for each family (all its default keys) is accepted."""
    import transformers

    prefix = HF_CLASSES[model_type]
    written = getattr(transformers, f"{prefix}Config")(**SIZES[model_type]).to_dict()
    cfg = read_config(written | {"architectures": [prefix + "ForMaskedLM"]})
    assert (cfg.model_type, cfg.architecture) == (model_type, prefix + "ForMaskedLM")
    assert cfg.hidden_size == SIZES[model_type].get("hidden_size", SIZES[model_type].get("dim"))


def test_distilbert_names_and_no_segments():
    cfg = read_config({"model_type": "distilbert", "dim": 30, "n_layers": 2, "n_heads": 5, "hidden_dim": 37,
                          "activation": "relu", "sinusoidal_pos_embds": True})
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size,
            cfg.hidden_act, cfg.type_vocab_size) == (30, 2, 5, 37, "relu", 1)
    assert cfg.architecture == "DistilBertModel" and not cfg.heads.pooler
    with pytest.raises(minibert.ConfigError, match="both 'dim' and 'hidden_size'"):
        read_config({"model_type": "distilbert", "dim": 30, "hidden_size": 30})
    with pytest.raises(minibert.ConfigError, match="type_vocab_size"):  # DistilBERT has no segment table
        read_config({"model_type": "distilbert", "type_vocab_size": 2})


@pytest.mark.parametrize("config,message", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not a family"),
    ({"model_type": "albert", "num_hidden_groups": 2}, "num_hidden_groups = 2 is not supported"),
    ({"model_type": "albert", "inner_group_num": 2}, "inner_group_num = 2 is not supported"),
    ({"model_type": "roberta", "architectures": ["BertForMaskedLM"]}, "belongs to model_type 'bert'"),
    ({"model_type": "bert", "embedding_size": 128}, "'embedding_size'"),  # BERT has no projection
    ({"model_type": "electra", "sinusoidal_pos_embds": True}, "'sinusoidal_pos_embds'"),  # another family's key
    ({"model_type": "roberta", "pad_token_id": 1, "max_position_embeddings": 2}, "leaves no row"),
    ({"model_type": "albert", "num_hidden_layers": 1_000_000}, "num_hidden_layers 1000000 is above 96"),
])
def test_family_config_errors_name_the_key(config, message):
    with pytest.raises(minibert.ConfigError, match=message):
        read_config(config)


def test_family_layouts():
    roberta = config_for("RobertaModel", pad_token_id=1, max_position_embeddings=514)
    assert (roberta.first_position, roberta.max_tokens) == (2, 512)
    electra = config_for("ElectraModel", hidden_size=256, num_attention_heads=4, embedding_size=128)
    assert electra.has_projection and electra.embed_dim == 128
    assert not config_for("ElectraModel", hidden_size=256, num_attention_heads=4).has_projection
    assert config_for("AlbertModel", embedding_size=768).has_projection  # ALBERT always projects
    # The shared-layer bound (config.MAX_SHARED_LAYERS) holds for shared blocks only; the bound itself is accepted.
    assert config_for("AlbertModel", num_hidden_layers=96).num_hidden_layers == 96
    assert Config(architecture="BertModel", num_hidden_layers=1000).num_hidden_layers == 1000


# ---- tokenizers and the model together ----------------------------------------------------------------------

def test_roberta_from_vocab_and_merges(tmp_path):
    """Without tokenizer.json, RoBERTa's vocab.json + merges.txt build the same byte-level BPE as transformers'."""
    import transformers

    write_tokenizer(tmp_path, "roberta")
    model = json.loads((tmp_path / "tokenizer.json").read_text())["model"]
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "vocab.json").write_text(json.dumps(model["vocab"]))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in model["merges"]) + "\n")
    hf_tokenizer = transformers.RobertaTokenizer(vocab=str(tmp_path / "vocab.json"),
                                                 merges=str(tmp_path / "merges.txt"))
    ours = tokenizer_for(tmp_path, config_for("RobertaModel", type_vocab_size=1, pad_token_id=1))
    texts = fuzz_texts(np.random.default_rng(8), 200)
    batch, theirs = ours(texts[:100], texts[100:]), hf_rows(hf_tokenizer, texts[:100], texts[100:])
    assert batch.input_ids.tolist() == theirs["input_ids"]
    assert batch.offsets == [[tuple(span) for span in row] for row in theirs["offsets"]]
    assert batch.word_ids == theirs["word_ids"]


def test_sentencepiece_only_directory_says_how_to_convert(tmp_path):
    (tmp_path / "spiece.model").write_bytes(b"\x00")
    with pytest.raises(minibert.TokenizerError, match="save_pretrained"):
        tokenizer_for(tmp_path, config_for("AlbertModel"))


@pytest.mark.parametrize("model_type,segment", [("distilbert", 0), ("electra", 1)])
def test_wordpiece_families_segments(tmp_path, model_type, segment):
    """DistilBERT has no segment table: sentence B keeps segment 0 (HF's DistilBertTokenizer returns none)."""
    make_family_model(tmp_path, model_type)
    model = minibert.load(tmp_path)
    batch = model.tokenize(["a b"], ["c"])
    assert batch.tokens[0][:6] == ["[CLS]", "a", "b", "[SEP]", "c", "[SEP]"]
    assert batch.token_type_ids.tolist() == [[0, 0, 0, 0, segment, segment]]
    model(batch)  # the model takes the ids it was given


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "albert"])
def test_text_to_logits_matches_transformers(tmp_path, model_type):
    """model.tokenize → MLM logits on texts, pairs and padding, against transformers' tokenizer and model."""
    import transformers

    vocab = write_tokenizer(tmp_path, model_type)
    hf_model = make_family_model(tmp_path / "model", model_type, "ForMaskedLM", vocab_size=vocab,
                                 max_position_embeddings=130)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the trained tokenizer, with the model
        (tmp_path / "model" / name).write_text((tmp_path / name).read_text())
    model = minibert.load(tmp_path / "model")
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "model")
    texts, pairs = CORPUS[:3], ["Short.", "A somewhat longer second text, café!", "x"]
    batch = model.tokenize(texts, pairs)
    theirs = hf_tokenizer(texts, pairs, padding=True, return_tensors="np")
    np.testing.assert_array_equal(batch.input_ids, theirs["input_ids"])
    out, ref = assert_parity(model, hf_model, {k: np.asarray(v) for k, v in theirs.items()}, TINY)
    assert_close(out.logits, ref.logits, TINY, "MLM logits")
    assert batch.tokens[0][0] == model.tokenizer.cls_token == hf_tokenizer.cls_token


def test_albert_applies_one_block_in_every_layer(tmp_path):
    make_family_model(tmp_path, "albert")
    model = minibert.load(tmp_path)
    assert list(model.params["blocks"]) == [0]  # stored once
    module = model.module
    assert all(block is module.blocks[0] for block in module.blocks)
    names = model.hook_names
    for i in range(3):  # each application has its own hook names
        assert f"blocks.{i}.attn.hook_pattern" in names
    assert "embed.hook_project" in names and "embed.hook_token_type_embed" in names
    # Patching layer 1's pattern leaves layer 0 alone: the hooks tell the applications apart.
    batch = family_batch(np.random.default_rng(9), "albert", 2, 7)
    _, clean = model.run_with_cache(batch, names="blocks.*.hook_resid_post")
    _, patched = model.run(batch, names="blocks.*.hook_resid_post",
                           hooks={"blocks.1.attn.hook_pattern": lambda value, ctx: value * 0})
    # Equal up to fp32 rounding (a run with writer hooks is not padded to a length bucket, so XLA may sum in
    # another order): TINY, as above.
    assert_close(clean["blocks.0.hook_resid_post"], patched["blocks.0.hook_resid_post"], TINY, "layer 0")
    assert np.abs(np.asarray(clean["blocks.1.hook_resid_post"]) - patched["blocks.1.hook_resid_post"]).max() > 0.1


def test_albert_with_too_many_applications_is_refused_before_building(tmp_path, monkeypatch):
    """One shared block cannot confirm num_hidden_layers: 10⁸ is refused by the config (config.MAX_SHARED_LAYERS)
    before any key table or parameter exists; both are made to fail here if reached."""
    from minibert.io import checkpoint

    make_family_model(tmp_path, "albert")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 100_000_000}))

    def unreachable(*args, **kwargs):
        raise AssertionError("a key table was built for a config the bound refuses")

    monkeypatch.setattr(checkpoint, "key_table", unreachable)
    monkeypatch.setattr(checkpoint, "convert", unreachable)
    with pytest.raises(minibert.ConfigError, match="num_hidden_layers 100000000 is above 96"):
        minibert.load(tmp_path)


def test_hook_names_per_family(tmp_path):
    make_family_model(tmp_path, "distilbert")
    names = minibert.load(tmp_path).hook_names
    assert "embed.hook_token_type_embed" not in names and "embed.hook_project" not in names
    assert not any(name.startswith("pooler.") for name in names)


def test_discriminator_hook_on_another_model_names_the_architecture(tmp_path):
    make_family_model(tmp_path, "electra", "ForMaskedLM")
    with pytest.raises(minibert.HookError, match="ElectraForPreTraining"):
        minibert.load(tmp_path).run_with_cache(family_batch(np.random.default_rng(0), "electra", 1, 4),
                                               names=["discriminator.hook_logits"])


def test_released_config_files_load():
    """config.json files as released on the Hub for each family (keys and values as published)."""
    albert_base_v2 = {"architectures": ["AlbertForMaskedLM"], "attention_probs_dropout_prob": 0, "bos_token_id": 2,
                      "classifier_dropout_prob": 0.1, "down_scale_factor": 1, "embedding_size": 128,
                      "eos_token_id": 3, "gap_size": 0, "hidden_act": "gelu_new", "hidden_dropout_prob": 0,
                      "hidden_size": 768, "initializer_range": 0.02, "inner_group_num": 1, "intermediate_size": 3072,
                      "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "albert",
                      "net_structure_type": 0, "num_attention_heads": 12, "num_hidden_groups": 1,
                      "num_hidden_layers": 12, "num_memory_blocks": 0, "pad_token_id": 0, "type_vocab_size": 2,
                      "vocab_size": 30000}
    distilbert_base_uncased = {"activation": "gelu", "architectures": ["DistilBertForMaskedLM"],
                               "attention_dropout": 0.1, "dim": 768, "dropout": 0.1, "hidden_dim": 3072,
                               "initializer_range": 0.02, "max_position_embeddings": 512, "model_type": "distilbert",
                               "n_heads": 12, "n_layers": 6, "pad_token_id": 0, "qa_dropout": 0.1,
                               "seq_classif_dropout": 0.2, "sinusoidal_pos_embds": False, "tie_weights_": True,
                               "transformers_version": "4.10.0.dev0", "vocab_size": 30522}
    roberta_base = {"architectures": ["RobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1, "bos_token_id": 0,
                    "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
                    "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05,
                    "max_position_embeddings": 514, "model_type": "roberta", "num_attention_heads": 12,
                    "num_hidden_layers": 12, "pad_token_id": 1, "type_vocab_size": 1, "vocab_size": 50265}
    assert read_config(albert_base_v2).embed_dim == 128
    assert read_config(distilbert_base_uncased).hidden_size == 768
    assert read_config(roberta_base).max_tokens == 512


def test_head_checkpoint_with_the_bare_models_pooler(tmp_path):
    """roberta-base is saved as RobertaForMaskedLM with roberta.pooler.* too: unused, as in transformers."""
    from safetensors.numpy import load_file, save_file

    hf_model = make_family_model(tmp_path, "roberta", "ForMaskedLM")
    tensors = load_file(tmp_path / "model.safetensors")
    rng = np.random.default_rng(0)
    pooler = {"roberta.pooler.dense.weight": rng.normal(size=(24, 24)).astype(np.float32),
              "roberta.pooler.dense.bias": rng.normal(size=24).astype(np.float32)}
    save_file(tensors | pooler, tmp_path / "model.safetensors", metadata={"format": "pt"})
    out, ref = assert_parity(minibert.load(tmp_path), hf_model, family_batch(rng, "roberta", 2, 6), TINY)
    assert_close(out.logits, ref.logits, TINY, "MLM logits")
    tensors["roberta.pooler.dense.extra"] = pooler["roberta.pooler.dense.bias"]  # anything else stays an error
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(minibert.CheckpointError, match="unexpected key.*pooler.dense.extra"):
        minibert.load(tmp_path)


def test_head_statistics_figures_name_the_familys_special_tokens():
    """Figures label attention to the first and separator tokens with the model's own: <s>, </s> for RoBERTa."""
    from minibert.viz import figures

    values = np.full((2, 3), 0.25)
    stats = {key: values for key in ("to_cls", "to_sep", "to_punct", "entropy", "cls_entropy", "uniform_entropy")}
    legend = figures.special_tokens_plot(stats, cls_token="<s>", sep_token="</s>").axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["<s>", "</s>", ". or ,", "other"]
    legend = figures.entropy_plot(stats, cls_token="<s>").axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()][:2] == ["all tokens", "<s> row"]
    figure = figures.gradient_plot({"cls": values, "sep": values}, cls_token="<s>", sep_token="</s>")
    legend = figure.axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["<s>", "</s>"]


@pytest.mark.parametrize("architecture", ["AlbertForMaskedLM", "ElectraForPreTraining", "ElectraForMaskedLM",
                                          "RobertaForSequenceClassification", "DistilBertForTokenClassification"])
def test_flops_per_token_match_traced_matmuls(architecture):
    """accounting counts the projection, the E-wide MLM head and the discriminator as the traced program does."""
    import jax
    import jax.numpy as jnp
    from test_accounting import dot_flops

    from minibert.runtime import accounting

    projected = architecture.startswith(("Albert", "Electra"))
    cfg = config_for(architecture, vocab_size=99, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                     intermediate_size=37, max_position_embeddings=40, embedding_size=10 if projected else None,
                     id2label=("a", "b", "c"))
    model = minibert.Model(cfg, seed=0)
    B, T = 2, 8
    ids = jnp.full((B, T), 5, jnp.int32)
    jaxpr = jax.make_jaxpr(model.forward_fn())(model.state, (ids, jnp.zeros_like(ids), jnp.ones_like(ids)))
    assert dot_flops(jaxpr.jaxpr) == pytest.approx(B * T * accounting.flops_per_token(cfg, T, head=True))


# Released configs at full size (Hub config.json values that set the sizes).
FULL_SIZE = {
    "roberta": dict(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                    layer_norm_eps=1e-5),
    "xlm-roberta": dict(vocab_size=250002, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                        layer_norm_eps=1e-5),
    "distilbert": dict(vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072),
    "electra": dict(vocab_size=30522, embedding_size=128, hidden_size=256, num_hidden_layers=12,
                    num_attention_heads=4, intermediate_size=1024),
    "albert": dict(vocab_size=30000, embedding_size=128, hidden_size=768, num_hidden_layers=12,
                   num_attention_heads=12, intermediate_size=3072, hidden_act="gelu_new"),
}


@pytest.mark.parametrize("model_type", list(FULL_SIZE))
@pytest.mark.parametrize("suffix", ["Model", "ForMaskedLM"])
def test_full_size_parameter_counts_match_transformers(model_type, suffix):
    """Full-size configs, shapes only (jax.eval_shape; torch's meta device): the same number of parameters."""
    import jax
    import transformers
    from flax import nnx

    from minibert.core.encoder import Encoder

    prefix = HF_CLASSES[model_type]
    hf_config = getattr(transformers, f"{prefix}Config")(**FULL_SIZE[model_type], architectures=[prefix + suffix])
    with torch.device("meta"):
        hf_model = getattr(transformers, prefix + suffix)(hf_config)
    theirs = sum(p.numel() for p in hf_model.parameters())  # tied and shared weights once
    ours = nnx.eval_shape(lambda: Encoder(read_config(hf_config.to_dict())))
    assert sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(nnx.state(ours, nnx.Param))) == theirs


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "albert", "electra"])
def test_dependency_words_encode_as_the_sentence_does(tmp_path, model_type):
    """syntax.encode_words (gold words → ids) gives the ids the tokenizer gives the sentence, in every family."""
    from minibert.analysis import syntax

    write_tokenizer(tmp_path, model_type)
    type_vocab_size = 2 if model_type in ("albert", "electra") else 1
    tokenizer = tokenizer_for(tmp_path, config_for(HF_CLASSES[model_type] + "Model", type_vocab_size=type_vocab_size,
                                                   pad_token_id=0))
    words = ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
    ids, groups = syntax.encode_words(tokenizer, words)
    batch = tokenizer([" ".join(words)])
    assert ids == batch.input_ids[0].tolist()
    assert groups[1:-1] == [[t for t, w in enumerate(batch.word_ids[0]) if w == i] for i in range(len(words))]


def test_compare_two_roberta_checkpoints(tmp_path):
    """analysis.compare_models runs on a family whose tokenizer has no do_lower_case switch."""
    from minibert import analysis

    for name, seed in (("a", 0), ("b", 1)):  # 300: the trained tokenizer's vocabulary
        make_family_model(tmp_path / name, "roberta", seed=seed, vocab_size=300)
    model = minibert.load(tmp_path / "a")
    same = analysis.compare_models(model, model, ["Hello world.", "The lazy dog!"])
    np.testing.assert_allclose(same.similarity, np.ones((2, 3)), atol=1e-6)  # a model against itself: cos = 1
    other = analysis.compare_models(model, minibert.load(tmp_path / "b"), ["Hello world.", "The lazy dog!"])
    assert other.similarity.shape == (2, 3) and (other.similarity < 1 - 1e-3).all()


def test_weight_reading_analyses_run_on_albert(tmp_path):
    """Analyses that read a block's weights (attention norms, ALTI) take ALBERT's shared block for every layer."""
    from minibert import analysis

    make_family_model(tmp_path, "albert")
    model = minibert.load(tmp_path)
    np.testing.assert_array_equal(model.block_params(2)["attn"]["W_O"], model.params["blocks"][0]["attn"]["W_O"])
    batch = family_batch(np.random.default_rng(4), "albert", 2, 6)
    norms = analysis.attention_norms(model, batch)
    assert norms["f_norm"].shape == (3, 2, 4, 6)
    mixing = analysis.alti(model, batch)
    real = batch["attention_mask"].astype(bool)
    # Rows of real tokens sum to 1: a division by the row sum, then a sum of ≤ 6 fp32 terms: ≤ 7 · 1.2e-7.
    np.testing.assert_allclose(mixing.sum(-1)[:, real], 1, atol=1e-6)


# ---- a new family is one module and one registry line -------------------------------------------------------

# A family defined here only: BERT's computation under other key names, config key names, an own setting and
# another class prefix. Everything a family module holds; registering it is the registry line.
TOY = Family("toybert", "ToyBERT", "Toy", "toy", renames=(("width", "hidden_size"),), settings=(("flavour", "plain"),),
             layer_keys=LayerKeys("stack.{i}", "q", "k", "v", "o", "norm1", "up", "down", "norm2"))


@pytest.fixture
def toy_family():
    registry.register(TOY)
    yield TOY
    registry.unregister(TOY.model_type)


def _as_toy(directory):
    """The BERT checkpoint in `directory` rewritten as a ToyBERT one: layer keys under TOY's names, config.json
    with model_type toybert, ToyModel and `width` for hidden_size."""
    from safetensors.numpy import load_file, save_file

    bert = FAMILIES["bert"].layer_keys
    renamed = {}
    for key, value in load_file(directory / "model.safetensors").items():
        for part in ("query", "key", "value", "out", "ln1", "mlp_in", "mlp_out", "ln2"):
            for i in range(2):
                before = f"{bert.prefix.format(i=i)}.{getattr(bert, part)}."
                if key.startswith(before):
                    key = f"{TOY.layer_keys.prefix.format(i=i)}.{getattr(TOY.layer_keys, part)}." + key[len(before):]
        renamed[key] = value
    save_file(renamed, directory / "model.safetensors")
    settings = json.loads((directory / "config.json").read_text())
    settings |= {"model_type": "toybert", "architectures": ["ToyModel"], "width": settings.pop("hidden_size"),
                 "flavour": "spicy"}
    (directory / "config.json").write_text(json.dumps(settings))


def test_a_family_defined_in_a_test_loads_through_its_module_alone(tmp_path, toy_family):
    """Registering TOY is all it takes: config (its renames and setting), the strict key table (its layer names),
    the tokenizer (WordPiece), architectures (ToyModel…) follow. Same weights, same arithmetic as BERT: equal
    bit for bit to the BERT checkpoint they were renamed from (which test_parity compares with transformers)."""
    from conftest import make_hf_model, random_batch

    make_hf_model(tmp_path / "bert")
    reference = minibert.load(tmp_path / "bert")
    make_hf_model(tmp_path / "toy")
    _as_toy(tmp_path / "toy")
    toy = minibert.load(tmp_path / "toy")
    assert (toy.config.model_type, toy.config.architecture, toy.config.setting("flavour")) == ("toybert", "ToyModel",
                                                                                              "spicy")
    assert "ToyForMaskedLM" in ARCHITECTURES
    batch = random_batch(np.random.default_rng(6), 2, 7, 99)
    np.testing.assert_array_equal(toy(batch).last_hidden_state, reference(batch).last_hidden_state)
    (tmp_path / "bert" / "config.json").write_text((tmp_path / "toy" / "config.json").read_text())
    with pytest.raises(minibert.CheckpointError, match=r"missing 32 key\(s\).*'stack\.0\.q\.weight'"):
        minibert.load(tmp_path / "bert")  # BERT's key names are not ToyBERT's: its own table is strict


def test_the_registry_is_the_modules_families():
    """FAMILIES is exactly what the modules of registry.MODULES declare, and only a registered family loads."""
    declared = [f for module in registry.MODULES for f in module.FAMILIES]
    assert list(FAMILIES.values()) == declared
    with pytest.raises(minibert.ConfigError, match="model_type 'toybert' is not a family"):
        read_config({"model_type": "toybert"})
    with pytest.raises(minibert.ConfigError, match="registered already"):
        registry.register(FAMILIES["bert"])


@pytest.mark.parametrize("changes,message", [
    (dict(norm="pre"), r"selects norm = 'pre', which model.Block does not compute: name the family's block code"),
    (dict(positions="rotary", block=model_lib.Block), "name its block code .* and its embeddings"),
    (dict(mlp="swiglu"), r"mlp 'swiglu' is not one of \('dense', 'glu'\)"),
    (dict(tokenizer="bytes"), "tokenizer 'bytes' is not one of"),
])
def test_a_family_selecting_a_variation_names_its_code(changes, message):
    with pytest.raises(minibert.ConfigError, match=message):
        dataclasses.replace(TOY, **changes)


class PreLNBlock(model_lib.Block):
    """A test-only forward variation: LayerNorm before each sublayer (pre-LN), on BERT's parameters and hooks."""

    def __call__(self, resid_pre, key_mask, hooks, name, dropout=model_lib.NO_DROPOUT):
        resid_pre = hooks(f"{name}.hook_resid_pre", resid_pre)
        attn_out = self.attn(self.ln1(resid_pre, hooks, f"{name}.ln1"), key_mask, hooks, f"{name}.attn", dropout)
        resid_mid = hooks(f"{name}.hook_resid_mid", resid_pre + hooks(f"{name}.hook_attn_out", attn_out))
        mlp_out = hooks(f"{name}.hook_mlp_out", self.mlp(self.ln2(resid_mid, hooks, f"{name}.ln2"), hooks,
                                                         f"{name}.mlp"))
        return hooks(f"{name}.hook_resid_post", resid_mid + mlp_out)


# What the toy's block shows, declared here as a family module declares it (families/shows.py): the order of its
# sites (ln1 before attention, ln2 before the MLP, no LayerNorm on its output) and a step-through of its own.
TOY_ORDER = ("hook_resid_pre", "ln1", "attn", "hook_attn_out", "hook_resid_mid", "ln2", "mlp", "hook_mlp_out",
             "hook_resid_post")
TOY_STEPS = shows.step_table(
    ("x", "block {layer} input", "x", "hook_resid_pre", shows.QUERY, ()),
    ("ln1", "LayerNorm before attention", "x̂ = LN₁(x)", "ln1.hook_out", shows.QUERY, ("x",)),
    ("q", "query", "q = x̂ W_Q[h] + b_Q[h]", "attn.hook_q", shows.QUERY_HEAD, ("ln1",)),
    ("k", "keys", "k_s = x̂_s W_K[h] + b_K[h]", "attn.hook_k", shows.KEYS_HEAD, ("ln1",)),
    ("scaled", "scores", "q·k_s/√{d_head}", "attn.hook_attn_scores", shows.HEAD_ROW, ("q", "k")),
    ("pattern", "softmax", "α_s", "attn.hook_pattern", shows.HEAD_ROW, ("scaled",)),
    ("resid_mid", "residual", "r = x + a", "hook_resid_mid", shows.QUERY, ("x",)),
    ("ln2", "LayerNorm before the FFN", "y = LN₂(r)", "ln2.hook_out", shows.QUERY, ("resid_mid",)),
    ("ffn_pre", "FFN in", "y W_in + b_in", "mlp.hook_pre", shows.QUERY, ("ln2",)),
    ("resid_post", "block {layer} output", "h{next_sup} = r + m", "hook_resid_post", shows.QUERY, ("resid_mid",)),
)
TOY_PRE_LN = dataclasses.replace(TOY, model_type="toyprebert", name="ToyPreBERT", prefix="ToyPre", norm="pre",
                                 block=PreLNBlock, block_order=TOY_ORDER, block_output="hook_resid_post",
                                 stream_norms=(), steps=TOY_STEPS)


def pre_ln_reference(params, ids, types, mask, eps: float):
    """The pre-LN encoder in float64 NumPy, written out from its definition: x ← x + Attn(LN1(x)), then
    x ← x + MLP(LN2(x)) per block, after BERT's embeddings; gelu is the erf form."""
    from scipy.special import erf

    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)

    def ln(x, norm):
        centered = x - x.mean(-1, keepdims=True)
        return centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + eps) * norm["scale"] + norm["bias"]

    embed = p["embed"]
    x = ln(embed["word"][ids] + embed["position"][np.arange(ids.shape[1])] + embed["token_type"][types], embed["ln"])
    for block in (p["blocks"][i] for i in sorted(p["blocks"])):
        attn, mlp = block["attn"], block["mlp"]
        h = ln(x, block["ln1"])
        q, k, v = (np.einsum("btd,dhk->bthk", h, attn[f"W_{c}"]) + attn[f"b_{c}"] for c in "QKV")
        scores = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(q.shape[-1])
        scores = np.where(mask[:, None, None, :] == 1, scores, -np.inf)
        pattern = np.exp(scores - scores.max(-1, keepdims=True))
        pattern /= pattern.sum(-1, keepdims=True)
        z = np.einsum("bhts,bshk->bthk", pattern, v)
        x = x + np.einsum("bthk,hkd->btd", z, attn["W_O"]) + attn["b_O"]
        pre = ln(x, block["ln2"]) @ mlp["W_in"] + mlp["b_in"]
        x = x + (pre * 0.5 * (1 + erf(pre / np.sqrt(2)))) @ mlp["W_out"] + mlp["b_out"]
    return x


@pytest.fixture
def toy_pre_ln(tmp_path):
    """A BERT checkpoint loaded as TOY_PRE_LN, the family registered while the test runs."""
    from conftest import make_hf_model

    make_hf_model(tmp_path)
    _as_toy(tmp_path)
    settings = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(settings | {"model_type": "toyprebert",
                                                                 "architectures": ["ToyPreModel"]}))
    registry.register(TOY_PRE_LN)
    try:
        yield minibert.load(tmp_path)
    finally:
        registry.unregister(TOY_PRE_LN.model_type)


def test_a_family_plugs_in_its_own_block(toy_pre_ln):
    """Family.block swaps model.Block for the family's code: BERT's weights under TOY_PRE_LN compute the pre-LN
    encoder (checked against pre_ln_reference; BERT's post-LN block would be off by the whole scale)."""
    from conftest import random_batch

    model = toy_pre_ln
    batch = random_batch(np.random.default_rng(7), 3, 8, 99)
    out = model(batch).last_hidden_state
    assert all(isinstance(block, PreLNBlock) for block in model.module.blocks)
    reference = pre_ln_reference(model.params, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                                 model.config.layer_norm_eps)
    # One fp32 program against float64: tolerances.forward_rtol with programs=1 (rounding of each stage's sums).
    assert_close(out, reference, forward_rtol(model.config, S=8, programs=1), "pre-LN last hidden state")


SHOWN = {shows.QUERY: lambda v, t, h: v[0, t].ravel(), shows.QUERY_HEAD: lambda v, t, h: v[0, t, h],
         shows.KEYS_HEAD: lambda v, t, h: v[0, :, h], shows.HEAD_ROW: lambda v, t, h: v[0, h, t]}


def test_a_family_defined_in_a_test_gets_a_step_through(toy_pre_ln):
    """The workbench walks the toy's block by the toy's own declarations (TOY_STEPS, TOY_ORDER), not by its
    name: every step in its order with its operands, each step's values the hook's values at the query and head
    (against run_with_cache: two programs, tolerances.forward_rtol), and the query's dot product reads the
    step the toy says q is computed from (ln1, where BERT's reads x), rebuilding q from those values."""
    from tolerances import assert_close_to_scale

    from minibert.viz.workbench import Workbench

    model, text, layer, head, query = toy_pre_ln, "hello world again", 1, 1, 2
    answer = Workbench(model).step({"text": text, "layer": layer, "head": head, "query": query})
    steps = answer["steps"]
    assert [step["id"] for step in steps] == [step.id for step in TOY_STEPS]
    assert [step["from"] for step in steps] == [list(step.operands) for step in TOY_STEPS]
    assert steps[-1]["label"] == "block 1 output" and steps[-1]["equation"] == "h² = r + m"
    batch = model.tokenize([text])
    _, cache = model.run_with_cache(batch, [f"blocks.{layer}.{step.site}" for step in TOY_STEPS])
    rtol = forward_rtol(model.config, batch.input_ids.shape[1])
    for step, declared in zip(steps, TOY_STEPS):
        expected = SHOWN[declared.shows](np.asarray(cache[f"blocks.{layer}.{declared.site}"]), query, head)
        assert_close_to_scale(np.asarray(step["values"], np.float64), expected.ravel(), rtol, step["id"])
    q = next(step for step in steps if step["id"] == "q")
    assert q["dot"]["left"] == "ln1"
    ln1 = np.asarray(steps[1]["values"])
    rebuilt = np.asarray(q["dot"]["right"]) @ ln1 + np.asarray(q["dot"]["bias"])
    assert_close_to_scale(rebuilt, np.asarray(q["values"])[:len(rebuilt)], rtol, "q from ln1")

"""sentence-transformers directories load with their sentence embeddings: model.sentence_embeddings equals
SentenceTransformer(path).encode.

Each model is a tiny random BERT built here with transformers (conftest.make_hf_model, generated vocabulary),
wrapped in sentence-transformers' own modules and saved with its own save(): the BGE layout (CLS pooling +
Normalize), the E5 layout (mean pooling + Normalize, "query: " / "passage: " prompts), mean pooling without
Normalize, and every other pooling mode sentence-transformers has. The texts are generated words of letters.

Tolerance (pooled_atol): the two programs' hidden states differ by at most δ = forward_rtol × their scale
(tests/tolerances.py). Picking a token (cls, lasttoken) or a maximum per feature moves a vector by at most δ; a
weighted average (mean, weightedmean) too, plus each program's fp32 sum of T terms, sum_rtol(T) × scale;
mean_sqrt_len_tokens is √n times a mean. L2 normalisation u = v/‖v‖ moves u by at most 2‖δv‖/‖v‖ ≤ 2√D·err/‖v‖
(the smallest row norm ‖v‖ of the unnormalised vectors), plus its own sum of D squares, sum_rtol(D).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import make_hf_model
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Dense, Normalize, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling
from test_families import CORPUS, make_family_model

import minibert
from minibert.io import checkpoint
from tests.tolerances import forward_rtol, sum_rtol

HIDDEN = 32  # conftest.make_hf_model's hidden size
POSITIONS = 64  # and its position table
E5_PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A tiny random BertModel with a cased tokenizer (so lower-casing texts is visible), saved by transformers."""
    directory = tmp_path_factory.mktemp("encoder")
    make_hf_model(directory, "BertModel", seed=3)
    (directory / "tokenizer_config.json").write_text('{"do_lower_case": false, "model_max_length": 512}')
    return directory


def generated_texts(seed: int, count: int = 5, longest: int = 30) -> list[str]:
    """Texts of 1 to `longest` made-up words of 1-4 letters (3 tokens a word on average), so rows pad differently
    and the longest passes 64 tokens (the model's limit: sentence-transformers truncates it)."""
    rng = np.random.default_rng(seed)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    lengths = [1, longest, *rng.integers(2, longest // 2, size=count - 2)]
    return [" ".join("".join(rng.choice(letters, size=rng.integers(1, 5))) for _ in range(n)) + "."
            for n in lengths]


def save_sentence_transformer(directory, encoder, mode, *, normalize=True, extra=(), transformer=None,
                              pooling=None, width=HIDDEN, **model):
    """Save a SentenceTransformer of `encoder` (`width` wide) → Pooling(mode) → Normalize (where asked) → `extra`
    modules."""
    modules = [Transformer(str(encoder), **(transformer or {})),
               Pooling(width, pooling_mode=mode, **(pooling or {})), *([Normalize()] if normalize else []), *extra]
    SentenceTransformer(modules=modules, device="cpu", **model).save(str(directory))
    return directory


def pooled_atol(model, token_embeddings, raw, modes) -> float:
    """How far our sentence vectors may lie from sentence-transformers' (the module docstring derives it).
    token_embeddings: sentence-transformers' hidden states of each text; raw: our vectors before Normalize."""
    length = max(len(tokens) for tokens in token_embeddings)
    scale = max(float(np.abs(np.asarray(tokens)).max()) for tokens in token_embeddings)
    error = forward_rtol(model.config, S=length) * scale + 2 * sum_rtol(length) * scale
    error *= math.sqrt(length) if "mean_sqrt_len_tokens" in modes else 1.0
    if not model.pooling["normalize"]:
        return error
    width = raw.shape[1]
    return 2 * math.sqrt(width) * error / float(np.linalg.norm(raw, axis=1).min()) + 2 * sum_rtol(width)


def both_models(directory):
    """(sentence-transformers' model, minibert's) of one saved directory."""
    return SentenceTransformer(str(directory), device="cpu"), minibert.load(directory)


def assert_encodes_alike(models, texts, pairs=None, **encode) -> np.ndarray:
    """minibert's sentence_embeddings equal sentence-transformers' encode on these texts (or pairs); returns ours.
    models: both_models(directory)."""
    reference, model = models
    inputs = texts if pairs is None else list(zip(texts, pairs))
    theirs = reference.encode(inputs, **encode)
    token_embeddings = reference.encode(inputs, output_value="token_embeddings", **encode)
    ours = np.asarray(model.sentence_embeddings(texts, pairs=pairs, **encode))
    raw = np.asarray(model.sentence_embeddings(texts, pairs=pairs, normalize=False, **encode))
    mode = model.pooling["mode"]
    atol = pooled_atol(model, token_embeddings, raw, (mode,) if isinstance(mode, str) else mode)
    assert ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() <= atol, f"max difference {np.abs(ours - theirs).max():.2e} > {atol:.1e}"
    return ours


@pytest.mark.parametrize("mode, normalize", [
    ("cls", True),  # BGE
    ("mean", True),  # E5 (its prompts: test_prompts)
    ("mean", False),  # Pooling alone
    ("max", False),
    ("mean_sqrt_len_tokens", False),
    ("weightedmean", True),
    ("lasttoken", True),
    (("cls", "mean"), True),  # concatenated, as sentence-transformers does
])
def test_pooling_matches_sentence_transformers(tmp_path, encoder, mode, normalize):
    directory = save_sentence_transformer(tmp_path / "st", encoder, mode, normalize=normalize)
    models = both_models(directory)
    pooling = models[1].pooling
    assert (pooling["mode"], pooling["normalize"], pooling.get("unsupported")) == (mode, normalize, None)
    assert_encodes_alike(models, generated_texts(seed=len(str(mode))))


def test_max_seq_length_truncates_as_sentence_transformers(tmp_path, encoder):
    """BGE's layout with max_seq_length 24 (sentence-transformers 6 keeps it as the tokenizer's
    model_max_length): texts longer than that are cut to it, not refused."""
    directory = save_sentence_transformer(tmp_path / "st", encoder, "cls", transformer={"max_seq_length": 24})
    texts = generated_texts(seed=1, longest=12)
    models = both_models(directory)
    assert max(len(models[1].tokenizer.tokenize(text)) for text in texts) + 2 > 24
    assert_encodes_alike(models, texts)


@pytest.mark.slow  # a 256-token row through the bundled model in both programs: about 10 s on two cores
def test_bundled_checkpoint_matches_sentence_transformers(bundled, bundled_dir):
    """all-MiniLM-L6-v2 as shipped (files written by sentence-transformers 2.0: mean pooling, Normalize,
    max_seq_length 256), with a generated text of about 300 tokens that both cut to 256."""
    texts = ["It's fine.", "The food was great but the service was slow.", " ".join(["ab cde f"] * 100)]
    assert len(bundled.tokenizer.tokenize(texts[-1])) > 256
    assert_encodes_alike((SentenceTransformer(str(bundled_dir), device="cpu"), bundled), texts)


@pytest.mark.parametrize("model_type, width, max_seq_length", [("xlm-roberta", 20, 38), ("distilbert", 30, None)])
def test_other_families(tmp_path, model_type, width, max_seq_length):
    """The E5 layout over XLM-R (as multilingual-E5 is) and DistilBERT (as the msmarco-distilbert models are),
    with test_families' tiny models and tokenizers (trained there on its CORPUS). XLM-R's 40 positions hold 38
    tokens (its positions start at 2): its max_seq_length says so, as 512 of 514 does in the real models."""
    make_family_model(tmp_path / "encoder", model_type, seed=2)
    directory = save_sentence_transformer(tmp_path / "st", tmp_path / "encoder", "mean", width=width,
                                          transformer={"max_seq_length": max_seq_length}, prompts=E5_PROMPTS)
    assert_encodes_alike(both_models(directory), CORPUS[:6], prompt_name="query")


def write_older_layout(directory, modes: dict[str, bool], transformer: dict) -> None:
    """Rewrite a saved directory as older sentence-transformers versions wrote it (and as most Hub models still are):
    models.* module types, `pooling_mode_<name>: true` flags, max_seq_length and do_lower_case in
    sentence_bert_config.json."""
    modules = json.loads((directory / "modules.json").read_text())
    for module in modules:
        module["type"] = "sentence_transformers.models." + module["type"].rsplit(".", 1)[-1]
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": HIDDEN} | {f"pooling_mode_{name}": on for name, on in modes.items()}))
    (directory / "sentence_bert_config.json").write_text(json.dumps(transformer))


def test_older_layout_with_lower_case_and_max_seq_length(tmp_path, encoder):
    directory = save_sentence_transformer(tmp_path / "st", encoder, "mean")
    write_older_layout(directory, {"cls_token": True, "mean_tokens": False, "max_tokens": False},
                    {"max_seq_length": 20, "do_lower_case": True})
    models = both_models(directory)
    settings = {"mode": "cls", "normalize": True, "max_seq_length": 20, "lower_case": True}
    assert models[1].pooling.items() >= settings.items()
    texts = [text.upper() if i % 2 else text for i, text in enumerate(generated_texts(seed=4, longest=10))]
    assert "[UNK]" in models[1].to_str_tokens(texts[1])  # the tokenizer is cased: lower-casing changes the tokens
    assert_encodes_alike(models, texts)


@pytest.mark.slow  # three encodings of each of three layouts: about 10 s on two cores
@pytest.mark.parametrize("mode, include_prompt", [("mean", True), ("mean", False), ("cls", False)])
def test_prompts(tmp_path, encoder, mode, include_prompt):
    """E5's layout with its prompts: the default one, one named, one given; include_prompt false leaves the prompt's
    tokens (and [CLS]) out of the pooling, as sentence-transformers does."""
    directory = save_sentence_transformer(tmp_path / "st", encoder, mode, prompts=E5_PROMPTS,
                                          default_prompt_name="query", pooling={"include_prompt": include_prompt})
    models = both_models(directory)
    assert models[1].pooling["prompts"].items() >= E5_PROMPTS.items()
    texts = generated_texts(seed=5, longest=12)
    default = assert_encodes_alike(models, texts)
    named = assert_encodes_alike(models, texts, prompt_name="passage")
    assert_encodes_alike(models, texts, prompt="represent this: ")
    assert np.abs(default - named).max() > 1e-3  # the prompt reaches the vectors


def test_text_pairs(tmp_path, encoder):
    directory = save_sentence_transformer(tmp_path / "st", encoder, "mean")
    texts, pairs = generated_texts(seed=6, longest=8), generated_texts(seed=7, longest=8)[::-1]
    assert_encodes_alike(both_models(directory), texts, pairs)


def test_dense_module_is_refused_naming_it(tmp_path, encoder):
    """A Dense projection after the pooling is not computed: the checkpoint's embedding is refused, the encoder
    itself still loads and pools when a mode is asked for."""
    dense = Dense(HIDDEN, 16)
    directory = save_sentence_transformer(tmp_path / "st", encoder, "mean", normalize=False, extra=[dense])
    model = minibert.load(directory)
    with pytest.raises(minibert.ConfigError, match="a Dense module, which minibert does not compute"):
        model.sentence_embeddings(["abc def."])
    assert model.sentence_embeddings(["abc def."], mode="mean").shape == (1, HIDDEN)


def write_modules(directory, kinds: list[str], pooling: dict | None = None) -> None:
    """modules.json listing `kinds` (module i in folder i_<kind>), and the Pooling config where given."""
    directory.mkdir(exist_ok=True)
    modules = [{"idx": i, "name": str(i), "path": "" if kind == "Transformer" else f"{i}_{kind}",
                "type": f"sentence_transformers.models.{kind}"} for i, kind in enumerate(kinds)]
    (directory / "modules.json").write_text(json.dumps(modules))
    for module in modules:
        if module["type"].endswith("Pooling"):
            (directory / module["path"]).mkdir()
            (directory / module["path"] / "config.json").write_text(json.dumps(pooling or {}))


@pytest.mark.parametrize("kinds, unsupported", [
    (["Transformer", "Pooling", "Dense", "Normalize"], ("a Dense module",)),
    (["Transformer", "WeightedLayerPooling", "Pooling"], ("a WeightedLayerPooling module",)),
    (["Transformer", "Normalize", "Pooling"], ("the modules in the order Transformer → Normalize → Pooling",)),
    (["Transformer", "Pooling", "Pooling"], ("the modules in the order Transformer → Pooling → Pooling",)),
])
def test_modules_minibert_does_not_compute_are_named(tmp_path, kinds, unsupported):
    write_modules(tmp_path, kinds)
    assert checkpoint.sentence_transformers_layout(tmp_path)[1]["unsupported"] == unsupported


def test_dropout_module_is_the_identity(tmp_path):
    write_modules(tmp_path, ["Transformer", "Dropout", "Pooling"], {"pooling_mode": "max"})
    assert checkpoint.sentence_transformers_layout(tmp_path)[1] == {"mode": "max", "normalize": False}


def test_normalize_of_token_embeddings_is_named(tmp_path):
    write_modules(tmp_path, ["Transformer", "Pooling", "Normalize"])
    (tmp_path / "2_Normalize").mkdir()
    (tmp_path / "2_Normalize" / "config.json").write_text('{"module_input_name": "token_embeddings"}')
    layout = checkpoint.sentence_transformers_layout(tmp_path)[1]
    assert layout["unsupported"] == ("a Normalize module of 'token_embeddings'",) and not layout["normalize"]


@pytest.mark.parametrize("pooling, message", [
    ({"pooling_mode": "first"}, r"pooling_mode 'first' is not one of sentence-transformers' modes 'cls'"),
    ({"pooling_mode": ["mean", "sum"]}, r"pooling_mode \['mean', 'sum'\] is not one of"),
])
def test_unknown_pooling_mode_is_refused(tmp_path, pooling, message):
    write_modules(tmp_path, ["Transformer", "Pooling"], pooling)
    with pytest.raises(minibert.CheckpointError, match=message):
        checkpoint.sentence_transformers_layout(tmp_path)


def test_settings_errors_name_the_file(tmp_path, encoder):
    directory = save_sentence_transformer(tmp_path / "st", encoder, "mean")
    (directory / "sentence_bert_config.json").write_text(json.dumps({"do_lower_case": "false"}))  # truthy
    with pytest.raises(minibert.CheckpointError, match=r"sentence_bert_config.json: do_lower_case must be true or "
                                                       r"false \(JSON booleans\), got 'false'"):
        minibert.load(directory)
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": POSITIONS + 36}))
    model = minibert.load(directory)
    with pytest.raises(minibert.ConfigError, match=f"max_seq_length is 100, but the model has {POSITIONS} positions"):
        model.sentence_embeddings(["abc."])
    with pytest.raises(minibert.InputError, match=r"prompt_name 'passage' is not one of this checkpoint's prompts"):
        model.sentence_embeddings(["abc."], prompt_name="passage")
    (directory / "1_Pooling" / "config.json").unlink()
    with pytest.raises(minibert.CheckpointError, match="1_Pooling/config.json does not exist"):
        minibert.load(directory)
    write_modules(directory, ["Transformer"])
    with pytest.raises(minibert.InputError, match="modules.json has no Pooling module; pass a mode"):
        minibert.load(directory).sentence_embeddings(["abc."])


def test_prompt_needs_texts(tmp_path, encoder):
    directory = save_sentence_transformer(tmp_path / "st", encoder, "mean", prompts=E5_PROMPTS,
                                          default_prompt_name="query")
    model = minibert.load(directory)
    with pytest.raises(minibert.InputError, match="a prompt or pairs go with texts"):
        model.sentence_embeddings(model.tokenize(["abc."]), prompt_name="query")
    tokenized = model.sentence_embeddings(model.tokenize(["abc."]))  # as given: the default prompt is for texts
    np.testing.assert_array_equal(tokenized, model.sentence_embeddings(["abc."], prompt=""))

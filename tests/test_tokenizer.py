"""The from-scratch WordPiece tokenizer against Hugging Face's BertTokenizerFast.

≥ 10,000 generated strings (many scripts, accents, CJK, emoji, punctuation, control and odd
whitespace characters, 200-character words, empty strings, special tokens written in the text),
singles and pairs, truncated and not, for the bundled uncased vocabulary and a cased one.
"""

import json
import random
import re

import numpy as np
import pytest
import transformers

from minibert.io.tokenizer import Tokenizer, TokenizerError

SCRIPTS = [
    "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789",
    "éèêëàâäôöûüùçñÉÈÀÖÜÑåøæßÅØÆœŒ", "ąćęłńóśźżĄĆĘŁŃŚŹŻ", "İıŞşĞğ",
    "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔΣΩάέήίόύώ", "абвгдежзийклмнопрстуфхцчшщъыьэюяАБВГД",
    "אבגדהוזחטיכלמנסעפצקרשת", "ابتثجحخدذرزسشصضطظعغفقكلمنهوي", "अआइईउऊकखगघचछजझ",
    "กขฃคฅฆงจฉชซฌญ", "一二三四五六七八九十人大中国日本語学生你好世界", "가나다라마바사아자차카타파하",
    "あいうえおかきくけこアイウエオカキクケコ", "😀😂🥲🫠👍🏽👨‍👩‍👧🇫🇷❤️✨", "ℕℝ∑∫√∞≠≤≥±×÷",
    ".,;:!?\"'()[]{}<>-_/\\|@#$%^&*+=~`", "«»„“”‘’‚‹›—–…¿¡·§¶†‡•", "\u0301\u0308\u0327\u20dd",
    "\x00\x01\x07\x0b\x0c\x1b\x1c\x1f\x7f\x85\u200b\u200c\u200d\u200e\ufeff\u00ad\ufffd\ue000\u0378\U000e0001",
    " \t\n\r\u00a0\u1680\u2003\u2009\u202f\u205f\u3000\u2028\u2029",
]
SPECIALS = ["[MASK]", "[SEP]", "[CLS]", "[PAD]", "[UNK]", "[mask]"]


def random_text(rng: random.Random, words: list[str]) -> str:
    """A string built from real vocabulary words, random characters of many scripts and odd pieces."""
    parts = []
    for _ in range(rng.choice([0, 1, 2, 3, 5, 8, 13, 30])):
        kind = rng.random()
        if kind < 0.45:
            word = rng.choice(words)
            parts.append(word.capitalize() if rng.random() < 0.3 else word)
        elif kind < 0.85:
            alphabet = rng.choice(SCRIPTS)
            parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))))
        elif kind < 0.9:
            parts.append(rng.choice(SPECIALS))
        elif kind < 0.93:
            parts.append(rng.choice(words) * rng.randint(20, 60))  # words of 100–400 characters
        else:
            parts.append("".join(rng.choice(SCRIPTS[3]) for _ in range(200)))
    separators = [" ", " ", " ", "", "  ", "\t", "\n", "\u00a0", "-", "."]
    return "".join(part + rng.choice(separators) for part in parts)


def hf_tokenizer(directory):
    return transformers.BertTokenizerFast.from_pretrained(str(directory))


def vocab_dir(tmp_path_factory, source_vocab: list[str], lower: bool):
    directory = tmp_path_factory.mktemp("vocab")
    (directory / "vocab.txt").write_text("\n".join(source_vocab) + "\n", encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(
        f'{{"do_lower_case": {str(lower).lower()}, "model_max_length": 512}}')
    return directory


def cased_vocab(uncased: list[str]) -> list[str]:
    """The uncased vocabulary plus capitalised words and accented continuations: a cased WordPiece vocab."""
    extra = [w.capitalize() for w in uncased[2000:8000] if w.isalpha() and w.isascii()]
    extra += list("ÉÈÀÖÜÑÅØÆŒĄŁŚİ") + ["##" + c for c in "éèàöüñåøæœąłśçß"] + ["Élan", "Ñandú", "São"]
    seen = set(uncased)
    return uncased + [w for w in extra if w not in seen]


@pytest.fixture(scope="module", params=["uncased", "cased"])
def tokenizers(request, bundled_dir, tmp_path_factory):
    uncased = (bundled_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    lower = request.param == "uncased"
    directory = vocab_dir(tmp_path_factory, uncased if lower else cased_vocab(uncased), lower)
    return Tokenizer.from_dir(directory), hf_tokenizer(directory)


def assert_same(ours, theirs, texts, pairs=None, max_length=None):
    mine = ours(texts, pairs, max_length=max_length)
    ref = theirs(texts, pairs, padding=True, truncation=max_length is not None, max_length=max_length,
                 return_offsets_mapping=True, return_tensors="np")
    for field in ("input_ids", "token_type_ids", "attention_mask"):
        np.testing.assert_array_equal(getattr(mine, field), ref[field], err_msg=field)
    for row in range(len(texts)):
        n = int(mine.lengths[row])
        assert mine.offsets[row][:n] == [tuple(map(int, o)) for o in ref["offset_mapping"][row][:n]], texts[row]
        assert mine.word_ids[row] == ref.word_ids(row), texts[row]
        assert mine.sequence_ids[row] == ref.sequence_ids(row), texts[row]
        assert mine.tokens[row] == theirs.convert_ids_to_tokens(list(ref["input_ids"][row]))


def test_ten_thousand_generated_strings(tokenizers):
    ours, theirs = tokenizers
    rng = random.Random(0)
    words = [w for w in ours.vocab if not w.startswith(("[", "##"))]
    texts = [random_text(rng, words) for _ in range(10_000)]
    assert sum(t == "" for t in texts) > 100 and any(len(t) > 1000 for t in texts)
    for start in range(0, 6000, 500):
        assert_same(ours, theirs, texts[start:start + 500], max_length=512)
    for start in range(6000, 10_000, 500):  # pairs, with longest-first truncation at several lengths
        chunk = texts[start:start + 500]
        assert_same(ours, theirs, chunk[:250], chunk[250:], max_length=rng.choice([16, 33, 64, 512]))


def test_truncation_lengths_match_longest_first(tokenizers):
    ours, theirs = tokenizers
    for n1 in range(0, 12):
        for n2 in range(0, 12):
            for max_length in (5, 8, 11, 12, 30):
                assert_same(ours, theirs, [" ".join(["a"] * n1)], [" ".join(["b"] * n2)], max_length)


def test_hand_examples(bundled):
    tok = bundled.tokenizer
    batch = tok(["Héllo, wörld! 日本", "unaffable"], ["The [MASK] sat.", "x"])
    assert batch.tokens[0] == ["[CLS]", "hello", ",", "world", "!", "日", "本", "[SEP]", "the", "[MASK]", "sat", ".",
                               "[SEP]"]
    assert batch.word_ids[0] == [None, 0, 1, 2, 3, 4, 5, None, 0, 1, 2, 3, None]
    assert batch.offsets[0][1:5] == [(0, 5), (5, 6), (7, 12), (12, 13)]
    assert batch.tokens[1][:6] == ["[CLS]", "una", "##ffa", "##ble", "[SEP]", "x"]
    assert batch.tokens[1][-1] == "[PAD]" and batch.attention_mask[1].sum() == 7
    assert tok.decode(tok("unaffable world").input_ids[0]) == "unaffable world"


def test_errors(bundled):
    tok = bundled.tokenizer
    with pytest.raises(TokenizerError, match="empty"):
        tok([])
    with pytest.raises(TokenizerError, match="2 texts but 1 pairs"):
        tok(["a", "b"], ["c"])
    with pytest.raises(TokenizerError, match="has 602 tokens.*max_length=512"):
        tok(["word " * 600])
    with pytest.raises(TokenizerError, match=r"texts\[1\] is a int"):
        tok(["a", 3])
    with pytest.raises(TokenizerError, match="max_length=3 leaves no room"):
        tok("a", "b", max_length=3)
    assert tok(["word " * 600], max_length=512).input_ids.shape == (1, 512)
    assert tok("a", max_length=8, padding="max_length").input_ids.shape == (1, 8)
    batch = tok(["a b", "c"])  # a Batch picks rows by number; a field read as from a dict points at the attribute
    with pytest.raises(TokenizerError, match=r"batch\['input_ids'\]: a Batch picks rows by number.*batch.input_ids"):
        batch["input_ids"]
    assert batch[1].input_ids.tolist() == batch.input_ids[1:].tolist()


def test_missing_vocab_names_the_file(tmp_path):
    with pytest.raises(TokenizerError, match="no vocab.txt"):
        Tokenizer.from_dir(tmp_path)


class CountingText(str):
    """A text that counts the characters its `find` calls read (from the start position to the hit's end,
    or to the end of the text when there is none)."""

    scanned = 0

    def find(self, sub, start=0, *args):
        position = super().find(sub, start, *args)
        self.scanned += (len(self) if position < 0 else position + len(sub)) - start
        return position


def test_special_tokens_in_text_are_found_in_linear_work(bundled):
    """A text full of "[MASK] " is read a bounded number of times per special token, however many masks
    it holds: 4× the text reads 4× the characters (the scan used to restart at every hit: quadratic)."""
    tok = bundled.tokenizer
    specials = len(set(tok.special_tokens.values()))
    scanned = {}
    for repeats in (500, 2000):
        text = CountingText("[MASK] " * repeats)
        spans = tok._special_spans(text)
        assert spans == [("[MASK]", 7 * i) for i in range(repeats)]
        # every special token reads the text at most once, plus its last (len - 1) characters on a re-find
        assert text.scanned <= specials * (len(text) + len("[MASK]")), text.scanned
        scanned[repeats] = text.scanned
    assert scanned[2000] == 4 * scanned[500]
    assert tok.tokenize("[MASK] " * 3) == ["[MASK]"] * 3


def test_overlapping_special_tokens_take_the_leftmost_then_longest():
    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[M]", "a"])}
    tok = Tokenizer(vocab, special_tokens={"mask_token": "[MASK]", "unk_token": "[M]"})
    # "[M]" and "[MASK]" start together at 1: the longer wins; "[M]" alone at 8 is found after it.
    assert tok._special_spans("a[MASK]a[M][MASK]") == [("[MASK]", 1), ("[M]", 8), ("[MASK]", 11)]


def test_texts_must_be_text_or_a_list_of_texts(bundled):
    tok = bundled.tokenizer
    for value, kind in ((None, "NoneType"), (3, "int"), (b"bytes", "bytes"), ({"a": 1}, "dict")):
        with pytest.raises(TokenizerError, match=rf"texts is a {kind}; pass a text \(str\) or a list of texts"):
            tok(value)
    with pytest.raises(TokenizerError, match="pairs is a int; pass a text"):
        tok(["a"], 5)
    as_tuple, as_list = tok(("The cat.", "A dog sat.")), tok(["The cat.", "A dog sat."])
    np.testing.assert_array_equal(as_tuple.input_ids, as_list.input_ids)
    assert bundled(("The cat.", "A dog sat.")).last_hidden_state.shape == (2, as_list.input_ids.shape[1], 384)


# ---- tokenizer files that would have raised a bare exception ---------------------------------------------

def _wordpiece_dir(directory, settings=None):
    from conftest import write_vocab

    write_vocab(directory, 99)
    if settings is not None:
        (directory / "tokenizer_config.json").write_bytes(settings)
    return directory


@pytest.mark.parametrize("settings, message", [
    (b'{"model_max_length": "512"}', "model_max_length must be a positive number such as 512, got '512'"),
    (b'{"model_max_length": null}', "model_max_length must be a positive number such as 512, got None"),
    (b'["do_lower_case"]', "holds a JSON list; it must hold an object"),
    (b'{"do_lower_case": true, "unk_token": "\xff"}', "is not valid JSON"),
    (b'{"cls_token": {"lstrip": false}}', "cls_token must be a token"),
    (b'{"mask_token": {"content": 7}}', "mask_token must be a token"),
    # A string is truthy: "false" used to lower-case every text of a cased model, silently.
    (b'{"do_lower_case": "false"}', "do_lower_case must be true or false (JSON booleans), got 'false'"),
    (b'{"tokenize_chinese_chars": null}', "tokenize_chinese_chars must be true or false (JSON booleans), got None"),
    (b'{"strip_accents": 0}', "strip_accents must be true or false or null (JSON booleans), got 0"),
])
def test_tokenizer_config_errors_name_file_and_value(tmp_path, settings, message):
    from minibert.core.config import Config
    from minibert.io.tokenizers_hf import tokenizer_for

    directory = _wordpiece_dir(tmp_path, settings)
    with pytest.raises(TokenizerError, match=re.escape(str(directory / "tokenizer_config.json")) + ".*"
                       + re.escape(message)):
        tokenizer_for(directory, Config())


def test_special_tokens_map_without_content_names_the_file(tmp_path):
    from minibert.core.config import Config
    from minibert.io.tokenizers_hf import tokenizer_for

    directory = _wordpiece_dir(tmp_path)
    (directory / "special_tokens_map.json").write_text('{"sep_token": {"single_word": false}}')
    with pytest.raises(TokenizerError, match=re.escape(f"{directory / 'special_tokens_map.json'}: sep_token must be "
                                                       f"a token")):
        tokenizer_for(directory, Config())


def test_vocab_txt_with_invalid_utf8_names_the_line(tmp_path):
    directory = _wordpiece_dir(tmp_path)
    lines = (directory / "vocab.txt").read_bytes().split(b"\n")
    lines[7] = b"caf\xe9"  # Latin-1, not UTF-8
    (directory / "vocab.txt").write_bytes(b"\n".join(lines))
    with pytest.raises(TokenizerError, match=re.escape(f"{directory / 'vocab.txt'}, line 8: not valid UTF-8 (byte "
                                                       f"0xe9)")):
        Tokenizer.from_dir(directory)


ROBERTA_VOCAB = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4, "a": 5, "b": 6, "ab": 7}


@pytest.mark.parametrize("vocab, merges, message", [
    (json.dumps(ROBERTA_VOCAB), "#version: 0.2\na b\n", None),  # the reference: these files load
    (json.dumps(ROBERTA_VOCAB), "#version: 0.2\na b\nx y\n", "Token `x` out of vocabulary"),
    (json.dumps(ROBERTA_VOCAB)[:30], "#version: 0.2\na b\n", "EOF while parsing"),
])
def test_vocab_json_and_merges_that_do_not_fit_are_named(tmp_path, vocab, merges, message):
    from minibert.families.registry import config_for
    from minibert.io.tokenizers_hf import tokenizer_for

    (tmp_path / "vocab.json").write_text(vocab)
    (tmp_path / "merges.txt").write_text(merges)
    config = config_for("RobertaModel", type_vocab_size=1, pad_token_id=1)
    if message is None:
        assert tokenizer_for(tmp_path, config)("ab").tokens == [["<s>", "ab", "</s>"]]
        return
    with pytest.raises(TokenizerError, match=re.escape(f"{tmp_path}: vocab.json and merges.txt do not make a BPE "
                                                       f"tokenizer") + ".*" + re.escape(message)):
        tokenizer_for(tmp_path, config)

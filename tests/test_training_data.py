"""Masked-LM batches (training.data.bert_masking, batches): BERT's recipe measured on many draws — 15% of the
maskable tokens chosen, 80% of those [MASK], 10% a uniformly random id, 10% unchanged — and special tokens and
padding never chosen."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest

import minibert
from minibert.errors import DataFileError, InputError
from minibert.training import data as data_

VOCAB, MASK = 30522, 103


def _within(count: int, n: int, p: float, what: str) -> None:
    """A binomial(n, p) count within 6 standard deviations of n·p: a failure probability of 2e-9 per check when the
    recipe is right, while a recipe off by a tenth of p (e.g. 13.5% chosen) is 10+ σ away at these n."""
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(count - n * p) <= 6 * sigma, f"{what}: {count} of {n}, expected {n * p:.0f} ± {6 * sigma:.0f}"


def test_bert_masking_follows_berts_recipe():
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, VOCAB, size=(400, 500)).astype(np.int32)  # no id equals [MASK]
    maskable = rng.random(ids.shape) < 0.9
    inputs, labels = data_.bert_masking(ids, maskable, np.random.default_rng(1), MASK, VOCAB)

    chosen = labels != data_.IGNORE
    assert not np.any(chosen & ~maskable)  # specials and padding are never chosen
    np.testing.assert_array_equal(labels[chosen], ids[chosen])  # a chosen token's label is its own id
    np.testing.assert_array_equal(inputs[~chosen], ids[~chosen])  # the rest of the input is untouched
    n_maskable, n_chosen = int(maskable.sum()), int(chosen.sum())
    _within(n_chosen, n_maskable, 0.15, "chosen")

    became_mask = chosen & (inputs == MASK)
    kept = chosen & (inputs == ids)
    replaced = chosen & (inputs != MASK) & (inputs != ids)
    # A random replacement draws [MASK] or the token itself with probability 1/V each: 0.1·(1/V) of the chosen,
    # under one token in 100k, so these counts are the 80/10/10 split up to that.
    _within(int(became_mask.sum()), n_chosen, 0.8, "[MASK]")
    _within(int(replaced.sum()), n_chosen, 0.1, "random id")
    _within(int(kept.sum()), n_chosen, 0.1, "unchanged")
    # The random ids are uniform over the vocabulary: their mean is (V − 1)/2 within 6 standard errors.
    drawn = inputs[replaced].astype(np.float64)
    assert abs(drawn.mean() - (VOCAB - 1) / 2) <= 6 * VOCAB / math.sqrt(12 * drawn.size)


def test_batches_mask_real_tokens_only_and_rebuild_alone():
    """encode marks the text's tokens maskable, never [CLS], [SEP] or padding; batch b's masks come from
    (*mask_seed, b), so a batch rebuilt alone (first=b, as a resumed run does) has the same masks."""
    model = minibert.load()
    texts = ["the food was great", "a much longer sentence about the service and the staff", "ok"]
    rows = [data_.Example(t) for t in texts * 20]
    encoded = data_.encode(model, rows, "masked-lm", ())
    special = set(model.tokenize([model.tokenizer.mask_token]).input_ids[0, [0, 2]].tolist())  # [CLS], [SEP]
    for ids, maskable in zip(encoded.ids, encoded.labels):
        assert maskable[0] == 0 and maskable[-1] == 0 and ids[0] in special and ids[-1] in special
        assert maskable[1:-1].all()
    mask_id = int(model.tokenize([model.tokenizer.mask_token]).input_ids[0, 1])
    settings = dict(batch_size=8, task="masked-lm", buckets=model.programs.length_buckets, pad_id=0, mask_id=mask_id,
                    vocab_size=model.config.vocab_size, mask_seed=(3, 1))
    order = np.arange(len(encoded))
    every = list(data_.batches(encoded, order, **settings))
    for batch in every:
        chosen = batch["labels"] != data_.IGNORE
        assert not np.any(chosen & (batch["attention_mask"] == 0))
        assert not np.any(chosen[:, 0])  # [CLS]
    again = next(data_.batches(encoded, order, first=5, **settings))
    for key in every[5]:
        np.testing.assert_array_equal(again[key], every[5][key])
    assert sum(int((b["labels"] != data_.IGNORE).sum()) for b in every) > 0


# ---- files and labels (issue 32 A1, A2, C) ------------------------------------------------------------------


def _file(tmp_path, name: str, content: str | bytes):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def test_a_row_with_more_fields_than_its_header_names_its_line(tmp_path):
    """Before: csv.DictReader put the text's second half under the key None and the middle field became the
    label, silently."""
    path = _file(tmp_path, "train.csv", "text,label\nthe cat,0\nthe cat, sat,1\n")
    with pytest.raises(DataFileError, match=r"train\.csv, line 3: 3 fields but the header row has 2"):
        data_.examples(path)


def test_a_quoted_field_keeps_its_newline_and_a_later_line_is_named_by_its_file_line(tmp_path):
    path = _file(tmp_path, "train.csv", 'text,label\n"the cat, sat\non the mat",0\nok,1\nbad,1,2\n')
    with pytest.raises(DataFileError, match=r"line 5: 3 fields"):  # the quoted newline counts as a line
        data_.examples(path)
    path = _file(tmp_path, "ok.csv", 'text,label\n"the cat, sat\non the mat",0\n"a\r\nb",1\n')
    assert [row.text for row in data_.examples(path)] == ["the cat, sat\non the mat", "a\r\nb"]


@pytest.mark.parametrize("name", ["train.csv", "train.tsv", "train.jsonl"])
def test_a_utf8_byte_order_mark_is_read_as_excel_writes_it(tmp_path, name):
    content = {"train.csv": "text,label\nhi,0\nho,1\n", "train.tsv": "text\tlabel\nhi\t0\nho\t1\n",
               "train.jsonl": '{"text": "hi", "label": 0}\n{"text": "ho", "label": 1}\n'}[name]
    path = _file(tmp_path, name, b"\xef\xbb\xbf" + content.encode())
    assert data_.examples(path) == [data_.Example("hi", None, 0), data_.Example("ho", None, 1)]


def test_a_latin1_file_names_its_line_and_the_fix(tmp_path):
    path = _file(tmp_path, "train.tsv", "text\tlabel\nok\t0\ncaf\xe9\t1\n".encode("latin-1"))
    with pytest.raises(DataFileError, match=r"train\.tsv, line 3: not valid UTF-8 \(byte 0xe9\).*save the file as "
                                            r"UTF-8"):
        data_.examples(path)


def test_a_text_longer_than_the_csv_modules_field_limit_is_read(tmp_path):
    """Python's csv refuses fields over csv.field_size_limit() (131,072 characters) with a bare _csv.Error; a
    10 MB text is a text like any other (the tokenizer truncates it)."""
    long = "word " * 2_000_000
    path = _file(tmp_path, "train.tsv", f"text\tlabel\n{long}\t0\nshort\t1\n")
    assert [len(row.text) for row in data_.examples(path)] == [len(long), 5]


def test_mixed_class_numbers_and_names_are_refused_naming_both(tmp_path):
    """Before: `2, neg, pos, 0` sorted to names ['0', '2', 'neg', 'pos'] while the number 2 was taken as the id
    2, so the example labelled 2 trained as 'neg'."""
    path = _file(tmp_path, "train.csv", "text,label\na,2\nb,neg\nc,pos\nd,0\n")
    with pytest.raises(InputError, match=r"train\.csv: row 1 \(line 2\)'s label 2 is a class number but row 2 "
                                         r"\(line 3\)'s 'neg' is a name"):
        data_.examples(path)
    with pytest.raises(InputError, match=r"row 2's label 1 is a class number but row 1's 'x' is a name"):
        data_.examples([("a", "x"), ("b", 1)])
    with pytest.raises(InputError, match="class number"):
        data_.examples([("a b", ["B", 0])], task="token-classification")


def test_labels_are_read_without_surrounding_whitespace(tmp_path):
    """Before: ' 1' was a name and 0 a number, and both trained as class 0 (one-class training, silently).
    Whitespace around a label is never significant (files and tuples alike), and a label that reads as an
    integer is a class number."""
    rows = data_.examples(_file(tmp_path, "train.csv", "text,label\na, 1\nb,0\nc,pos \n".replace(",pos ", ", 1 ")))
    assert [row.label for row in rows] == [1, 0, 1]
    assert data_.label_names(rows, "sequence-classification", None) == ("LABEL_0", "LABEL_1")
    rows = data_.examples([("a", " pos"), ("b", "neg\t"), ("c", "pos")])
    assert data_.label_names(rows, "sequence-classification", None) == ("neg", "pos")
    assert [row.label for row in rows] == ["pos", "neg", "pos"]
    assert data_.examples([("a", np.int64(1)), ("b", "0")])[0].label == 1  # a NumPy integer is a number too
    path = _file(tmp_path, "tokens.tsv", "text\tlabel\na b\t 0  1\n")
    assert data_.examples(path, task="token-classification")[0].label == [0, 1]


def test_a_files_rows_are_named_with_their_lines(tmp_path):
    """Docs-only tester (compile 3) item 8: "emptytext.tsv: row 1 has an empty text." sent the user to line 1, the
    header. A row's line is where it begins: after the header, and after a quoted newline of an earlier row."""
    path = _file(tmp_path, "emptytext.tsv", "text\tlabel\n\t0\nb\t1\n")
    with pytest.raises(DataFileError, match=re.escape(f"{path}: row 1 (line 2) has an empty text.")):
        data_.examples(path)
    path = _file(tmp_path, "quoted.tsv", 'text\tlabel\n"two\nlines"\t0\n \t1\n')
    with pytest.raises(DataFileError, match=re.escape(f"{path}: row 2 (line 4) has an empty text.")):
        data_.examples(path)
    path = _file(tmp_path, "rows.jsonl", '{"text": "a", "label": 0}\n\n{"text": "b", "label": 1.5}\n')
    with pytest.raises(InputError, match=re.escape(f"{path}: row 2 (line 3)'s label 1.5 is a float")):
        data_.examples(path)
    with pytest.raises(DataFileError, match=re.escape("the data: row 2 has an empty text.")):  # tuples: no lines
        data_.examples([("a", 0), (" ", 1)])


def test_a_stray_class_number_is_refused_naming_its_row(tmp_path):
    """Docs-only tester (compile 3) item 7: with labels 0 and 1 and one row labelled 5, the inferred classes were
    0 … 5 and a 6-class head trained (2, 3 and 4 had no example) without a word; with num_labels=2 the refusal
    named no row. Both name the row and the fix; num_labels that covers the gap is the user's word for it."""
    path = _file(tmp_path, "train.tsv", "text\tlabel\na\t0\nb\t1\nc\t5\nd\t0\n")
    rows = data_.examples(path)
    task = "sequence-classification"
    with pytest.raises(InputError, match=re.escape(
            "train.tsv: no row has label 2, 3, 4, but row 3 (line 4)'s label 5 makes 6 classes (0 … 5). Correct that "
            "row's label, or pass num_labels=6 (--num-labels 6) if the classes with no example are meant.")):
        data_.label_names(rows, task, None, str(path))
    with pytest.raises(InputError, match=re.escape("the data: row 3 (line 4)'s label 5 is out of range for "
                                                   "num_labels=2; labels are 0 … 1.")):
        data_.label_names(rows, task, 2)
    assert data_.label_names(rows, task, 6) == tuple(f"LABEL_{i}" for i in range(6))
    tokens = data_.examples([("a b", [0, 0]), ("c d", [3, 0])], task="token-classification")
    with pytest.raises(InputError, match=re.escape("the data: no row has label 1, 2, but row 2's label 3 makes 4 "
                                                   "classes")):
        data_.label_names(tokens, "token-classification", None)
    assert data_.label_names(data_.examples([("a", 1), ("b", 0)]), task, None) == ("LABEL_0", "LABEL_1")


@pytest.mark.parametrize("num_labels", [0, 1, -2, 2.5, True])
def test_a_num_labels_that_is_no_count_of_classes_is_refused_as_the_setting(num_labels):
    """Docs-only tester (compile 4): num_labels=0 was blamed on row 1 ("labels are 0 … -1. Correct the row")."""
    rows = data_.examples([("a", 0), ("b", 1)])
    with pytest.raises(InputError, match=re.escape(f"num_labels={num_labels!r}: pass the number of classes, a whole "
                                                   f"number of at least 2 (--num-labels)")):
        data_.label_names(rows, "sequence-classification", num_labels)


def test_a_negative_class_number_is_named_as_negative():
    """A label of -1 was 'out of range for num_labels=2 … or pass num_labels', which no num_labels can fix."""
    rows = data_.examples([("a", 0), ("b", -1), ("c", 1)])
    for num_labels in (None, 3):
        with pytest.raises(InputError, match=re.escape("the data: row 2's label -1 is negative; class numbers start "
                                                       "at 0. Correct the row.")):
            data_.label_names(rows, "sequence-classification", num_labels)


def test_masked_lm_examples_with_a_label_say_so():
    """Before: the label became the pair ("pairs[0] is a int")."""
    with pytest.raises(InputError, match=r"example 1 is \('the cat', 1\).*masked-LM.*no label"):
        data_.examples([("the cat", 1)], task="masked-lm")


@pytest.mark.parametrize(("labels", "names", "fragment"), [
    ([0, 5], ("LABEL_0", "LABEL_1"), "row 2's label 5 is not a class of the model: it has 2 classes, 0 … 1"),
    (["neg", "maybe"], ("neg", "pos"), "row 2's label 'maybe' is not one of the training labels ['neg', 'pos']"),
    ([0, 1], ("neg", "pos"), "row 1's label 0 is a class number but the training labels are names"),
])
def test_labels_outside_the_training_classes_are_named(labels, names, fragment):
    """encode maps labels to the classes the training data gave (eval data included): before, label 5 of 2
    classes gave a NaN eval loss and accuracy 0, and a name the training data lacked a bare ValueError."""
    model = minibert.load()
    rows = [data_.Example(f"text {i}", None, label) for i, label in enumerate(labels)]
    with pytest.raises(InputError, match=re.escape(fragment)):
        data_.encode(model, rows, "sequence-classification", names, where="eval data")


def test_a_token_label_that_is_no_list_is_named():
    """A token-classification example whose label is one number (not a list of word labels) is named by encode,
    not a TypeError in the label check."""
    rows = data_.examples([("a b", 5)], task="token-classification")
    with pytest.raises(InputError, match="the data: row 1 has 2 words but no list of labels"):
        data_.encode(minibert.load(), rows, "token-classification", ("LABEL_0", "LABEL_1"))


def test_a_utf16_file_is_named_as_utf16(tmp_path):
    """Docs-only tester (trust) item 12: Excel's "Unicode text" (UTF-16 with a byte-order mark) was called a
    Latin-1 or Windows-1252 file."""
    from minibert.training import examples

    for bom, codec in ((b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be")):
        path = tmp_path / "utf16.tsv"
        path.write_bytes(bom + "text\tlabel\na\t0\n".encode(codec))
        with pytest.raises(DataFileError, match=r"utf16.tsv is UTF-16 \(it starts with UTF-16's byte-order mark\); "
                                                r"save it as UTF-8"):
            examples(path)


@pytest.mark.parametrize("label", [0.5, float("nan"), True])
def test_a_label_that_is_neither_a_number_nor_a_name_is_named(label):
    """Docs-only tester (trust) item 6: ("a", 0.5) was refused as "row 1's 0.5 is a name", and True/False were taken
    as two classes."""
    with pytest.raises(InputError, match=re.escape(f"the data: row 2's label {label!r} is a "
                                                   f"{type(label).__name__}; a label is a whole number (a class) or "
                                                   f"a name (a string).")):
        data_.examples([("b", 1), ("a", label)])


def test_rows_cut_to_the_models_positions_are_counted(tmp_path):
    """Docs-only tester (trust) item 19: a 10 MB row trained cut to 512 tokens without a word. The tiny model has 64
    positions: 'a ' * 100 is 100 word tokens, cut; 'a ' * 62 is 62 + [CLS] + [SEP] = 64, exactly whole."""
    from tests.conftest import make_hf_model

    make_hf_model(tmp_path, "BertModel")
    model = minibert.load(tmp_path)
    rows = data_.examples([("a " * 62, 0), ("a " * 100, 1), ("b", 0), ("a " * 70, 1)])
    with pytest.warns(UserWarning, match=re.escape("the data: 2 rows are longer than the model's 64 tokens and were "
                                                   "cut to fit (row 2 the first)")):
        data_.encode(model, rows, "sequence-classification", data_.label_names(rows, "sequence-classification", None))
    with pytest.warns(UserWarning, match=re.escape("the data: row 2 is longer than the model's 64 tokens and was cut "
                                                   "to fit; the model sees only its beginning.")):
        data_.encode(model, rows[:3], "sequence-classification", ("LABEL_0", "LABEL_1"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # exactly 64 tokens: nothing cut, nothing said
        data_.encode(model, rows[:1], "sequence-classification", ("LABEL_0", "LABEL_1"))


# ---- the step's row lengths: few programs, chosen from the run's batches ----------------------------------------

def padded_tokens(longest: np.ndarray, lengths) -> int:
    """Tokens of every batch padded to the shortest of `lengths` that holds its longest row (one row each)."""
    return int(sum(min(n for n in lengths if n >= m) for m in longest))


def test_step_lengths_pad_as_few_tokens_as_any_choice_of_as_many():
    """Against brute force: every set of at most 3 lengths from the candidates (the batches' maxima rounded up to
    multiples of 8, the largest always in) pads at least as many tokens as step_lengths' choice."""
    import itertools

    rng = np.random.default_rng(1)
    for _ in range(20):
        longest = rng.integers(3, 129, size=rng.integers(1, 40))  # rows of at most the model's 128 positions
        chosen = data_.step_lengths(longest, limit=128, programs=3)
        assert len(chosen) <= 3 and all(n % data_.ALIGN == 0 or n == 128 for n in chosen)
        candidates = sorted({min(-(-m // 8) * 8, 128) for m in longest})
        best = min(padded_tokens(longest, (*rest, candidates[-1]))
                   for k in range(3) for rest in itertools.combinations(candidates[:-1], k))
        assert padded_tokens(longest, chosen) == best


def test_a_realistic_dataset_compiles_at_most_three_step_programs():
    """2,000 synthetic examples of lognormal lengths (median 25 tokens), batches of 16 in three shuffled epochs, as
    finetune orders them: STEP_PROGRAMS (3) lengths, where the coarse buckets (buckets.COARSE, finetune's rule
    before) touch 5 or more, padding fewer tokens than any 3 of those buckets would."""
    import itertools

    from minibert.runtime.buckets import COARSE, bucket_length, length_buckets

    lengths = np.maximum(np.round(np.random.default_rng(0).lognormal(np.log(25), 0.6, 2000)), 3).astype(int)
    encoded = data_.Encoded([np.full(n, 5) for n in lengths], [np.zeros(n, int) for n in lengths],
                            [np.zeros(1, int) for _ in lengths])
    orders = [data_.epoch_order(len(lengths), epoch, 0, True) for epoch in range(3)]
    longest = data_.longest_rows(encoded, orders, 16)
    assert longest.tolist() == [lengths[order[s:s + 16]].max() for order in orders for s in range(0, 2000, 16)]
    chosen = data_.step_lengths(longest, limit=512)
    touched = sorted({bucket_length(m, length_buckets(512, *COARSE)) for m in longest})
    assert len(chosen) == data_.STEP_PROGRAMS < len(touched)
    assert padded_tokens(longest, chosen) <= min(padded_tokens(longest, (*rest, touched[-1]))
                                                 for rest in itertools.combinations(touched[:-1], 2))
    shapes = {batch["input_ids"].shape[1] for order in orders
              for batch in data_.batches(encoded, order, 16, "sequence-classification", chosen, pad_id=0)}
    assert shapes == set(chosen)

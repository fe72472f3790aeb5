"""corpus.reading: corpus files (formats, shares, blank lines, fingerprints) and lists of texts."""

from __future__ import annotations

import pytest

from minibert.analysis import corpus
from minibert.analysis.corpus import reading
from minibert.errors import DataFileError, MinibertError


def test_read_corpus_formats(tmp_path):
    (tmp_path / "a.txt").write_text("First text.\n\n  \nSecond text.\n", encoding="utf-8")
    assert corpus.read_corpus(tmp_path / "a.txt") == (["First text.", "Second text."], None)
    (tmp_path / "b.tsv").write_text("A one.\tB one.\nA two.\tB two.\n", encoding="utf-8")
    assert corpus.read_corpus(tmp_path / "b.tsv") == (["A one.", "A two."], ["B one.", "B two."])
    (tmp_path / "c.jsonl").write_text('{"text": "One."}\n{"text": "Two.", "label": 1}\n', encoding="utf-8")
    assert corpus.read_corpus(tmp_path / "c.jsonl") == (["One.", "Two."], None)
    (tmp_path / "d.jsonl").write_text('{"text_a": "A.", "text_b": "B."}\n', encoding="utf-8")
    assert corpus.read_corpus(tmp_path / "d.jsonl") == (["A."], ["B."])


@pytest.mark.parametrize("name, content, message", [
    ("empty.txt", "\n \n", "holds no text"),
    ("bad.tsv", "A.\tB.\nno tab here\nA.\tB.\tC.\n", r"lines \[2, 3\] do not hold exactly two tab-separated"),
    ("bad.jsonl", '{"text": "fine"}\n{"text": oops}\n', "line 2: not valid JSON"),
    ("keys.jsonl", '{"text": "fine"}\n{"body": "no text key"}\n', r"line 2: expected an object with .*'text'"),
    ("pairs.jsonl", '{"text_a": "A.", "text_b": "B."}\n{"text_a": "A."}\n', r"line 2: .*'text_a' and 'text_b'"),
])
def test_read_corpus_errors(tmp_path, name, content, message):
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        corpus.read_corpus(tmp_path / name)


def test_read_corpus_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.txt is not a file; pass a \.txt"):
        corpus.read_corpus(tmp_path / "nope.txt")


def test_read_corpus_pairs_from_a_txt(tmp_path):
    (tmp_path / "p.txt").write_text("A one.\tB one.\n\nA two.\tB two.\n")
    assert corpus.read_corpus(tmp_path / "p.txt", pairs=True) == (["A one.", "A two."], ["B one.", "B two."])
    (tmp_path / "bad.txt").write_text("A one.\tB one.\nno tab here\n")
    with pytest.raises(ValueError, match=r"lines \[2\] do not hold exactly two tab-separated texts"):
        corpus.read_corpus(tmp_path / "bad.txt", pairs=True)


def test_read_corpus_shards_are_strided_and_cover_the_file(tmp_path):
    (tmp_path / "a.txt").write_text("".join(f"text {i}\n" + "\n" * (i % 2) for i in range(10)), encoding="utf-8")
    shares = [corpus.read_corpus(tmp_path / "a.txt", shard=(i, 3))[0] for i in range(3)]
    assert shares == [[f"text {i}" for i in range(k, 10, 3)] for k in range(3)]  # 4, 3 and 3 texts
    (tmp_path / "p.tsv").write_text("A0\tB0\nA1\tB1\nA2\tB2\n", encoding="utf-8")
    assert corpus.read_corpus(tmp_path / "p.tsv", shard=(1, 2)) == (["A1"], ["B1"])
    assert corpus.read_corpus(tmp_path / "p.tsv", shard=(4, 5)) == ([], [])  # more processes than lines
    (tmp_path / "j.jsonl").write_text('{"text_a": "A0", "text_b": "B0"}\n{"text_a": "A1", "text_b": "B1"}\n')
    assert corpus.read_corpus(tmp_path / "j.jsonl", shard=(1, 2)) == (["A1"], ["B1"])  # keys of line 1
    for shard in [(3, 3), (-1, 2), (0, 0), "ab"]:
        with pytest.raises(ValueError, match=r"shard must be \(index, count\) with 0 <= index < count"):
            corpus.read_corpus(tmp_path / "a.txt", shard=shard)


def test_scan_counts_blank_lines_and_parses_the_share(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("one\n\n  \ntwo\nthree\n\n", encoding="utf-8")  # blank lines 2, 3 and 6
    scan = corpus.CorpusFile(path).scan()
    assert (scan.rows, scan.blank_lines, scan.first_blank) == (3, 3, 2)
    assert corpus.CorpusFile(path).scan((1, 2)).rows == 1  # "two": the second of three non-blank lines
    source = reading.Source(path, None)
    assert (source.total, source.blank_lines) == (3, 3)
    with pytest.raises(DataFileError, match=r"a.txt, line 2: blank \(3 blank lines in all\); .*strict=False"):
        reading.Source(path, None, strict=True)


def test_fingerprint_changes_with_any_byte(tmp_path):
    """The fingerprint hashes the whole file: one byte changed 2 MB in, past what a size + first-MB check
    reads, with the size unchanged, gives another fingerprint."""
    path = tmp_path / "big.txt"
    lines = [f"line {i:07d} of a corpus that is larger than one megabyte." for i in range(60_000)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    before = corpus.CorpusFile(path).scan().fingerprint
    data = bytearray(path.read_bytes())
    assert len(data) > 3 << 20
    data[2 << 20] = ord("X") if data[2 << 20] != ord("X") else ord("Y")
    path.write_bytes(bytes(data))
    assert corpus.CorpusFile(path).scan().fingerprint != before


def test_stats_command_reports_blank_and_truncated_lines_or_refuses_them(tmp_path, capsys):
    """`minibert stats` says how many blank lines it skipped and documents it truncated; --strict refuses."""
    from minibert.app import cli

    path = tmp_path / "corpus.txt"
    path.write_text("A short text.\n\n\n" + "word " * 20 + "\nAnother one.\n", encoding="utf-8")  # 22 tokens
    arguments = ["stats", str(path), "--max-length", "16", "--out", str(tmp_path / "out")]
    assert cli.main(arguments) == 0
    assert "skipped 2 blank line(s); truncated 1 document(s) to --max-length 16 tokens" in capsys.readouterr().err
    assert cli.main(arguments + ["--strict", "--overwrite"]) == cli.USER_ERROR  # out.npz is the first run's
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 2: blank (2 blank lines in all)" in err[0], err


def test_survey_mixes_single_texts_and_pairs(bundled):
    """pairs=[None, "B", …] as tokenize takes it (a None leaves that document a single text), in a list and in a
    stream: the statistics equal the brute-force mean over those documents (test_corpus's reference, within
    its tolerances), and a number in pairs is still refused by its index."""
    from test_corpus import PAIRS, SETTINGS, TEXTS, assert_same_statistics, document_maps, reference_mean
    from tolerances import survey_statistic_tolerances

    texts = TEXTS[:4] + [a for a, _ in PAIRS[:4]]
    pairs = [None, *(b for _, b in PAIRS[:4]), None, None, None]  # singles and pairs interleaved
    want = reference_mean(document_maps(bundled, texts, pairs))
    tolerances = survey_statistic_tolerances(bundled, texts, pairs, row_length=64)
    for given in (pairs, iter(pairs)):
        result = corpus.survey(bundled, texts, given, **SETTINGS)
        assert result.documents == len(texts)
        assert_same_statistics(result.mean, want, tolerances)
    with pytest.raises(MinibertError, match=r"pairs\[1\] is not a string but int; pass text, or None for a row"):
        corpus.survey(bundled, texts, [None, 3, *pairs[2:]], **SETTINGS)

"""minibert/analysis/syntax.py: CoNLL-U reading and dependency accuracy per head, against brute-force
loops written from the definitions, independent of the library code, and on the bundled checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
from test_analysis_words import reference_word_attention

from minibert.analysis import syntax
from minibert.analysis.syntax import DEPENDENT_TO_HEAD, HEAD_TO_DEPENDENT, ConllError, Sentence

# ---- CoNLL-U ------------------------------------------------------------------------------------------

GOOD = """# sent_id = s1
# text = The dogs' owner can't come.
1\tThe\tthe\tDET\t_\t_\t3\tdet\t_\t_
2\tdogs\tdog\tNOUN\t_\t_\t3\tnmod:poss\t_\t_
3\towner\towner\tNOUN\t_\t_\t6\tnsubj\t_\t_
4-5\tcan't\t_\t_\t_\t_\t_\t_\t_\t_
4\tca\tcan\tAUX\t_\t_\t6\taux\t_\t_
5\tn't\tnot\tPART\t_\t_\t6\tadvmod\t_\t_
6\tcome\tcome\tVERB\t_\t_\t0\troot\t_\t_
6.1\tgo\tgo\tVERB\t_\t_\t_\t_\t6:conj\t_
7\t.\t.\tPUNCT\t_\t_\t6\tpunct\t_\t_

1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_
"""


def test_read_conllu_text_and_file(tmp_path):
    first, second = syntax.read_conllu(GOOD)
    assert first == Sentence(("The", "dogs", "owner", "ca", "n't", "come", "."), (3, 3, 6, 6, 6, 0, 6),
                             ("det", "nmod:poss", "nsubj", "aux", "advmod", "root", "punct"), "s1")
    assert second == Sentence(("Hi",), (0,), ("root",), None)
    path = tmp_path / "two.conllu"
    path.write_text(GOOD)
    assert syntax.read_conllu(path) == syntax.read_conllu(str(path)) == [first, second]
    with pytest.raises(FileNotFoundError, match="missing.conllu"):
        syntax.read_conllu(tmp_path / "missing.conllu")


def with_line(number: int, replacement: str) -> str:
    lines = GOOD.splitlines()
    lines[number - 1] = replacement
    return "\n".join(lines)


@pytest.mark.parametrize("number, line, message", [
    (3, "1\tThe\tthe\tDET\t_\t_\t3\tdet", "expected 10 tab-separated columns"),
    (3, "1 The the DET _ _ 3 det _ _", "expected 10 tab-separated columns"),
    (4, "3\tdogs\tdog\tNOUN\t_\t_\t3\tnmod:poss\t_\t_", "expected 2"),
    (4, "x\tdogs\tdog\tNOUN\t_\t_\t3\tnmod:poss\t_\t_", "ID 'x'"),
    (4, "2\tdogs\tdog\tNOUN\t_\t_\t-1\tnmod:poss\t_\t_", "HEAD '-1'"),
    (5, "3\towner\towner\tNOUN\t_\t_\t9\tnsubj\t_\t_", "HEAD 9 points past the sentence's 7 words"),
    (5, "3\towner\towner\tNOUN\t_\t_\t6\t_\t_\t_", "DEPREL is empty"),
    (6, "4-x\tcan't\t_\t_\t_\t_\t_\t_\t_\t_", "ID '4-x'"),
])
def test_read_conllu_errors_name_the_line(tmp_path, number, line, message):
    with pytest.raises(ConllError, match=f"<text>, line {number}: .*{message}"):
        syntax.read_conllu(with_line(number, line))
    path = tmp_path / "bad.conllu"
    path.write_text(with_line(number, line))
    with pytest.raises(ConllError, match=f"bad.conllu, line {number}:"):
        syntax.read_conllu(path)


def test_sample_treebank_is_well_formed():
    sentences = syntax.read_conllu(syntax.sample_treebank())
    assert 30 <= len(sentences) <= 40
    for s in sentences:
        assert s.heads.count(0) == 1 and s.relations[s.heads.index(0)] == "root"
        for start in range(1, len(s.words) + 1):  # every chain of heads reaches ROOT
            seen, word = set(), start
            while word:
                assert word not in seen, s.sent_id
                seen.add(word)
                word = s.heads[word - 1]
    relations = {r for s in sentences for r in s.relations}
    assert {"nsubj", "obj", "det", "amod", "case", "obl", "nmod", "nmod:poss", "advmod", "aux", "cop", "mark",
            "cc", "conj", "punct", "compound"} <= relations


# ---- scoring ------------------------------------------------------------------------------------------


def reference_scores(word_maps, sentences):
    """{direction: {relation: [L, H]}}, counts and {relation: {k: acc}} with loops over heads and words."""
    counts, correct, baseline = {}, {DEPENDENT_TO_HEAD: {}, HEAD_TO_DEPENDENT: {}}, {}
    for M, s in zip(word_maps, sentences):
        L, H, n, _ = M.shape
        for i in range(n):
            if s.heads[i] == 0:
                continue
            gold = s.heads[i] - 1
            for relation in ("all", s.relations[i]):
                counts[relation] = counts.get(relation, 0) + 1
                for k in range(-3, 3):
                    hit = 0 <= i + k < n and i + k == gold
                    baseline.setdefault(relation, {}).setdefault(k, 0)
                    baseline[relation][k] += hit
                for direction in correct:
                    table = correct[direction].setdefault(relation, np.zeros((L, H)))
                    for layer in range(L):
                        for h in range(H):
                            best, best_j = -1.0, None
                            for j in range(n):
                                if j == i:
                                    continue  # the zeroed diagonal cannot win unless all else is 0
                                value = M[layer, h, i, j] if direction == DEPENDENT_TO_HEAD else M[layer, h, j, i]
                                if value > best:
                                    best, best_j = value, j
                            table[layer, h] += best_j == gold
    accuracy = {d: {r: correct[d][r] / counts[r] for r in counts} for d in correct}
    return accuracy, counts, {r: {k: v / counts[r] for k, v in b.items()} for r, b in baseline.items()}


def random_sentences(rng, count=12):
    relations = ["nsubj", "obj", "det", "amod"]
    out = []
    for index in range(count):
        n = int(rng.integers(2, 9))
        root = int(rng.integers(n))
        heads = [0 if i == root else int(rng.choice([j for j in range(1, n + 1) if j != i + 1])) for i in range(n)]
        rels = ["root" if i == root else str(rng.choice(relations)) for i in range(n)]
        out.append(Sentence(tuple(f"w{i}" for i in range(n)), tuple(heads), tuple(rels), f"r{index}"))
    return out


def test_score_heads_matches_loops():
    rng = np.random.default_rng(0)
    sentences = random_sentences(rng)
    maps = [rng.dirichlet(np.ones(len(s.words)), size=(3, 2, len(s.words))) for s in sentences]
    result = syntax.score_heads(maps, sentences)
    accuracy, counts, baseline = reference_scores(maps, sentences)
    assert result.counts == {r: counts[r] for r in result.counts} and set(result.counts) == set(counts)
    assert result.relations[0] == "all" and "root" not in result.counts
    for direction in (DEPENDENT_TO_HEAD, HEAD_TO_DEPENDENT):
        for relation in counts:
            # hits / count, one correctly rounded division on both sides: equal
            np.testing.assert_array_equal(result.accuracy[direction][relation], accuracy[direction][relation])
    for relation in counts:
        assert result.baseline[relation] == baseline[relation]


def test_score_heads_by_hand():
    """the(det→dog) dog(nsubj→barks) barks(root): a head attending to the previous word, and the transpose."""
    s = Sentence(("the", "dog", "barks"), (2, 3, 0), ("det", "nsubj", "root"))
    previous = np.array([[0.9, 0.05, 0.05],  # "the" has no previous word; its row prefers itself (zeroed)
                         [0.7, 0.2, 0.1],
                         [0.1, 0.8, 0.1]])
    following = np.array([[0.1, 0.8, 0.1],
                          [0.1, 0.2, 0.7],
                          [0.3, 0.3, 0.4]])
    maps = np.stack([previous, following])[None]  # [L=1, H=2, 3, 3]
    result = syntax.score_heads([maps], [s])
    assert result.counts == {"all": 2, "det": 1, "nsubj": 1}
    # head 1-1: "the" → "dog" (0.05 beats 0.05 later; its own 0.9 is zeroed) right, "dog" → "the" wrong
    np.testing.assert_array_equal(result.accuracy[DEPENDENT_TO_HEAD]["all"], [[0.5, 1.0]])
    # transposed, a word's head is the word attending most to it: column "the" → "dog" (0.7),
    # column "dog" → "barks" (0.8) for 1-1; 1-2 gets both wrong
    np.testing.assert_array_equal(result.accuracy[HEAD_TO_DEPENDENT]["all"], [[1.0, 0.0]])
    assert result.best("all") == {"layer": 0, "head": 1, "label": "1-2", "accuracy": 1.0}
    assert result.best("det", HEAD_TO_DEPENDENT)["label"] == "1-1"
    assert result.baseline["all"] == {-3: 0.0, -2: 0.0, -1: 0.0, 0: 0.0, 1: 1.0, 2: 0.0}
    assert result.best_baseline("all") == (1, 1.0)
    rows = result.table()
    assert len(rows) == 6 and rows[0]["relation"] == "all" and rows[0]["direction"] == DEPENDENT_TO_HEAD
    assert rows[0]["baseline_offset"] == 1 and rows[0]["label"] == "1-2"


def test_baseline_offsets_by_hand():
    # a(amod→c) b(det→c) c(root) d(nmod→a): offsets +2, +1, and −3; out-of-range offsets are wrong
    s = Sentence(("a", "b", "c", "d"), (3, 3, 0, 1), ("amod", "det", "root", "nmod"))
    result = syntax.score_heads([np.full((1, 1, 4, 4), 0.25)], [s])
    assert result.baseline["amod"] == {-3: 0, -2: 0, -1: 0, 0: 0, 1: 0, 2: 1}
    assert result.baseline["det"] == {-3: 0, -2: 0, -1: 0, 0: 0, 1: 1, 2: 0}
    assert result.baseline["nmod"] == {-3: 1, -2: 0, -1: 0, 0: 0, 1: 0, 2: 0}
    assert result.baseline["all"] == {-3: 1 / 3, -2: 0, -1: 0, 0: 0, 1: 1 / 3, 2: 1 / 3}  # 1/3: hits / count
    assert result.best_baseline("all") == (-3, 1 / 3)  # ties go to the first offset


def test_score_heads_checks_shapes():
    s = Sentence(("a", "b"), (2, 0), ("det", "root"), "x")
    with pytest.raises(ValueError, match="sentence x has 2 words"):
        syntax.score_heads([np.zeros((1, 1, 3, 3))], [s])
    with pytest.raises(KeyError, match="no word has relation 'obj'"):
        syntax.score_heads([np.zeros((1, 1, 2, 2))], [s]).best("obj")


# ---- end to end on the bundled checkpoint --------------------------------------------------------------


@pytest.fixture(scope="module")
def sample_patterns(bundled):
    """Per sample sentence, one at a time: ids from each word's wordpieces, run_with_cache → ([L, H, T, S], spans)."""
    tok = bundled.tokenizer
    out = []
    for s in syntax.read_conllu(syntax.sample_treebank()):
        ids, spans = [tok.vocab["[CLS]"]], []
        for word in s.words:
            pieces = [tok.vocab[p] for p in tok.tokenize(word)]
            spans.append(list(range(len(ids), len(ids) + len(pieces))))
            ids += pieces
        ids.append(tok.vocab["[SEP]"])
        n, width = len(ids), 32  # one padded width: one compiled forward
        padded = np.zeros((1, width), np.int64)
        padded[0, :n] = ids
        _, cache = bundled.run_with_cache({"input_ids": padded, "attention_mask": (padded != 0).astype(np.int64)},
                                          names="blocks.*.attn.hook_pattern")
        out.append((np.asarray(cache.stack("attn.hook_pattern"))[:, 0, :, :n, :n], spans))
    return out


@pytest.mark.slow  # the bundled model over the sample treebank, twice
@pytest.mark.parametrize("mode", ["mean", "first"])
def test_dependency_accuracy_on_the_bundled_checkpoint(bundled, sample_patterns, mode):
    sentences = syntax.read_conllu(syntax.sample_treebank())
    result = syntax.dependency_accuracy(bundled, syntax.sample_treebank(), mode=mode, batch_size=16)
    assert result.sentences == len(sentences) and result.skipped == 0
    # words only: [CLS]/[SEP] never enter the reference's word maps
    maps = [reference_word_attention(A, spans, mode) for A, spans in sample_patterns]
    accuracy, counts, baseline = reference_scores(maps, sentences)
    assert result.counts == counts
    for direction in (DEPENDENT_TO_HEAD, HEAD_TO_DEPENDENT):
        for relation, count in counts.items():
            # batched (padded) and one-by-one forwards agree to ~1e-7; allow one argmax flip on a near-tie
            np.testing.assert_allclose(result.accuracy[direction][relation], accuracy[direction][relation],
                                       atol=1.01 / count, rtol=0)
            assert np.abs(result.accuracy[direction][relation] - accuracy[direction][relation]).sum() <= 2.01 / count
    for relation, scores in baseline.items():  # offsets need no model: hits / count on both sides
        assert result.baseline[relation] == scores
    assert result.best("all")["accuracy"] > result.best_baseline("all")[1]


def test_dependency_accuracy_skips_long_sentences(bundled):
    sentences = syntax.read_conllu(syntax.sample_treebank())[:3]
    result = syntax.dependency_accuracy(bundled, sentences, max_length=10)
    assert result.skipped == sum(len(s.words) + 2 > 10 for s in sentences) > 0
    assert result.sentences == 3 - result.skipped

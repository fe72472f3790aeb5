"""The Ray path (minibert.analysis.corpus_ray) on a local Ray the test starts: its merged result equals
one corpus.survey of the same file, which test_corpus holds to a brute-force NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
import ray  # in the test extra (CI installs it)
from test_corpus import PAIRS, SETTINGS, TEXTS, assert_same_statistics, regrouped_tolerances
from tolerances import sum_rtol, survey_js_atol

from minibert.analysis import corpus, corpus_ray


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_ray_blocks_merge_to_one_survey(bundled, local_ray, tmp_path):
    """Texts in blocks of 7 lines on two actors (with blank lines, which both readers skip and count), and pairs
    from a .tsv with the Jensen–Shannon matrix: the merged results equal single surveys of the files."""
    texts = tmp_path / "texts.txt"
    # 19 blank lines between the texts and 10 after them: the last block of 7 lines holds only blank lines
    texts.write_text("\n\n".join(TEXTS) + "\n" + "\n" * 10, encoding="utf-8")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{a}\t{b}\n" for a, b in PAIRS), encoding="utf-8")
    settings = {k: v for k, v in SETTINGS.items() if k != "progress"}
    first, second = [a for a, _ in PAIRS], [b for _, b in PAIRS]
    for path, js, documents in ((texts, False, (TEXTS, None)), (pairs, True, (first, second))):
        got = corpus_ray.survey_ray(path, actors=2, block_documents=7, js_divergence=js, **settings)
        want = corpus.survey(bundled, path, js_divergence=js, **SETTINGS)
        assert got.documents == want.documents and got.counts["real_tokens"] == want.counts["real_tokens"]
        assert got.counts["blank_lines"] == want.counts["blank_lines"] == (len(TEXTS) - 1 + 10 if js is False else 0)
        assert got.settings["reduce"] == "merged" and got.settings["model"] == want.settings["model"]
        assert_same_statistics(got.mean, want.mean, regrouped_tolerances(bundled, *documents))
        if js:  # each entry sums non-negative terms over every query row of every document, in two programs
            np.testing.assert_allclose(got.js_divergence, want.js_divergence,
                                       rtol=2 * sum_rtol(want.counts["real_tokens"]),
                                       atol=survey_js_atol(bundled, *documents, row_length=64))

"""corpus.step: the survey's compiled step on one batch of packed rows, against each document run alone.

test_corpus checks whole surveys against a NumPy brute force; this checks the step by itself: running totals in,
totals plus the batch's per-document sums out, documents packed in a row exactly as if run one by one (their own
position ids, attention kept inside each document), empty rows adding nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from tolerances import survey_statistic_tolerances

from minibert.analysis import heads
from minibert.analysis.corpus import packing
from minibert.analysis.corpus.step import survey_step, zeros

TEXTS = ["a b c , d e .", "f g h", "i j , k l m n o p"]  # the tiny vocabulary's letters and punctuation
ROW = 32  # one row holds all three (9 + 5 + 11 tokens with [CLS] and [SEP])


def _documents(model, texts):
    batch = model.tokenize(texts)
    return [(batch.input_ids[i, :n], batch.token_type_ids[i, :n]) for i, n in enumerate(batch.attention_mask.sum(1))]


@pytest.mark.slow  # a tiny model built with transformers, four compiled programs
def test_one_step_adds_each_documents_statistics_as_if_run_alone(tiny_mlm):
    model = tiny_mlm[0]
    documents = _documents(model, TEXTS)
    assert sum(len(ids) for ids, _ in documents) <= ROW
    # Row 0 packs the three documents, row 1 holds the first one alone, row 2 is empty (a batch's padding rows).
    arrays = packing.packed_rows(model, ROW, [documents, documents[:1]], 3, "real")
    step = survey_step(model, js=False, sep_normalization="clark")
    traces = model.programs.traces
    first = step(model.state, zeros(model, js=False), arrays)
    again = step(model.state, first, arrays)
    assert model.programs.traces == traces + 1  # one program for the shape, reused with the totals carried in
    for name, value in first.items():  # the same sums added to themselves: doubling is exact in floating point
        np.testing.assert_array_equal(again[name], 2 * np.asarray(value), err_msg=name)
    assert float(first["documents"]) == 4
    alone = [heads.attention_statistics(model, text) for text in TEXTS]  # a batch of one: that document's values
    want = {name: sum(s[name] for s in alone) + alone[0][name] for name in heads.STATISTICS}
    # Packed rows of ROW tokens against each document's own program: survey_statistic_tolerances.
    rtol, entropy_atol = survey_statistic_tolerances(model, TEXTS, row_length=ROW)
    for name in heads.STATISTICS:
        atol = entropy_atol if name.endswith("entropy") else 0
        np.testing.assert_allclose(first[name], want[name], rtol=rtol, atol=atol, err_msg=name)

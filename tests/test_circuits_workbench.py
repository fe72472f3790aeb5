"""The workbench's "why this output" answer (viz/why.py) through the HTTP API, against references that do not
share its plumbing: the target's value from a plain forward, completeness (Σ scores = F(x) − F(x')) with F(x')
from a forward whose word embeddings are the baseline's, and the heads against analysis.direct_attribution of the
unpadded text (another program, another length)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_hf_model
from test_serve import MASKED, client_for, post
from tolerances import assert_close_to_scale, dot_rtol, forward_rtol, head_rtol, sum_rtol

import minibert
from minibert.analysis import direct_attribution, token_attribution
from minibert.core.hooks import HookFn
from minibert.viz import why


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-classifier-why")
    make_hf_model(directory, "BertForSequenceClassification", scale=0.3)
    return minibert.load(directory)


def _replace(value, ctx, new):
    return new


def baseline_value(model, text, readout):
    """F(x'): a forward with the word embeddings of every non-special token replaced by [PAD]'s."""
    batch = model.tokenize([text])
    ids = np.asarray(batch.input_ids)
    special = np.isin(ids, [model.tokenizer.cls_token_id, model.tokenizer.sep_token_id])
    table = np.asarray(model.W_E)
    embedded = np.where(special[..., None], table[ids], table[model.tokenizer.pad_token_id])
    out = model.run_with_hooks(batch, hooks={"embed.hook_embed": HookFn(_replace, new=embedded)})
    return readout(out)


def ask(model, body):
    response = post(client_for(model), "why", body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.slow
def test_a_classifier_explains_its_predicted_class(classifier):
    text = "the film was not good at all"
    answer = ask(classifier, {"text": text})
    logits = np.asarray(classifier(classifier.tokenize([text])).logits)[0]
    c = int(np.argmax(logits))
    assert answer["target"].endswith(f"“{classifier.config.id2label[c]}”")
    T = len(answer["tokens"])
    assert answer["tokens"] == classifier.tokenize([text]).tokens[0]
    rtol = head_rtol(classifier.config, T)
    assert_close_to_scale([answer["value"]], [logits[c]], rtol, "target value")
    at_baseline = baseline_value(classifier, text, lambda out: np.asarray(out.logits)[0, c])
    assert_close_to_scale([answer["baseline_value"]], [at_baseline], rtol, "baseline value")
    # completeness: 16 Gauss–Legendre points integrate a smooth tiny model's path to well under its logits' scale;
    # the answer's own gap says how far, and the scores are the specials' zeros plus the words'
    scores = np.asarray(answer["scores"])
    assert scores[0] == 0 and scores[-1] == 0  # [CLS] and [SEP] keep their embedding in the baseline
    assert abs(scores.sum() - (answer["value"] - answer["baseline_value"]) - answer["completeness_gap"]) <= \
        (sum_rtol(T) + 2 * rtol) * (np.abs(scores).sum() + abs(answer["value"]) + abs(answer["baseline_value"]))
    reference = direct_attribution(classifier, [text], lambda out: out.logits[:, c])
    heads = answer["heads"]
    assert len(heads) == why.TOP_HEADS
    ours = np.array([h["value"] for h in heads])
    theirs = np.array([reference.heads[h["layer"], h["head"]] for h in heads])
    assert_close_to_scale(ours, theirs, forward_rtol(classifier.config, T) + dot_rtol(classifier.config.hidden_size),
                          "direct effects")
    assert np.all(np.abs(ours) >= np.sort(np.abs(reference.heads).ravel())[-why.TOP_HEADS] * (1 - 1e-3))
    assert [h["label"] for h in heads] == [classifier.config.head_label(h["layer"], h["head"]) for h in heads]


@pytest.mark.slow
def test_a_masked_lm_explains_its_top_guess_and_without_mask_the_cls_length(tiny_mlm):
    model = tiny_mlm[0]
    answer = ask(model, {"text": MASKED})
    tokens = model.tokenize([MASKED]).tokens[0]
    position = tokens.index("[MASK]")
    logits = np.asarray(model(model.tokenize([MASKED])).logits)[0, position]
    assert f"position {position}" in answer["target"]
    assert_close_to_scale([answer["value"]], [logits.max()], head_rtol(model.config, len(tokens)), "top guess")
    plain = "a b c d"
    answer = ask(model, {"text": plain})
    hidden = np.asarray(model(model.tokenize([plain])).last_hidden_state)[0, 0]
    assert "[CLS]" in answer["target"] and "[MASK]" in answer["hint"]  # and how to get the top guess explained
    assert_close_to_scale([answer["value"]], [np.linalg.norm(hidden)],
                          forward_rtol(model.config, len(answer["tokens"])), "[CLS] length")


def test_why_refuses_what_run_refuses_with_the_same_message(tiny_mlm):
    client = client_for(tiny_mlm[0])
    for body, said in [({}, "needs 'text'"), ({"text": "a b", "query": 99}, "'query' must be a whole number"),
                       ({"text": 5}, "must be a string")]:
        response = post(client, "why", body)
        assert response.status_code == 400 and said in response.json()["error"], (body, response.text)


# ---- the panel in the page (headless chromium) --------------------------------------------------------------

@pytest.mark.slow
def test_the_why_panel_shows_the_answer_and_picks_a_head(browser, tiny_mlm):
    """Closed, the panel asks nothing; opened, it shows the target's value and each token's and head's number
    (data-value: the API's, unrounded) equal to the analysis on the text as typed, user text as text; clicking a
    head selects it in the step-through."""
    from test_serve_browser import Server, Workbench_page

    model = tiny_mlm[0]
    text = "a <i id=pwn>b</i> [MASK] d"
    with Server([model]) as running:
        page = Workbench_page(browser, running)
        asked = []
        page.page.on("request", lambda r: asked.append(r.url) if r.url.endswith("/api/why") else None)
        page.type(text)
        assert asked == [] and page.page.locator("#wb-why-body-0 .wb-why-token").count() == 0
        page.page.click("#wb-why-open-0 summary")
        page.page.wait_for_selector("#wb-why-0[aria-busy=false] .wb-why-token")
        tokens = model.tokenize([text]).tokens[0]
        shown = page.page.eval_on_selector_all("#wb-why-0 .wb-why-token", "ns => ns.map(n => n.textContent)")
        assert shown == tokens
        assert page.page.locator("#pwn").count() == 0  # the typed markup stays text
        position = tokens.index("[MASK]")
        metric = lambda out: out.logits[:, position].max(-1)  # noqa: E731 (the panel's target, written again)
        reference = token_attribution(model, [text], metric, steps=why.STEPS)
        T = len(tokens)
        assert_close_to_scale(page.values("#wb-why-0 .wb-why-token"), reference.scores[0],
                              forward_rtol(model.config, T) + sum_rtol(why.STEPS) + dot_rtol(model.config.embed_dim),
                              "token scores")
        assert_close_to_scale(page.values("#wb-why-0 .wb-why-value"), reference.metric, head_rtol(model.config, T),
                              "target")
        heads = page.page.eval_on_selector_all("#wb-why-0 .wb-why-head", "ns => ns.map(n => [Number(n.dataset.layer), "
                                                                         "Number(n.dataset.head), n.textContent])")
        assert [label for _, _, label in heads] == [model.config.head_label(layer, head) for layer, head, _ in heads]
        direct = direct_attribution(model, [text], metric)
        assert_close_to_scale(page.values("#wb-why-0 .wb-why-head"),
                              [direct.heads[layer, head] for layer, head, _ in heads],
                              forward_rtol(model.config, T) + dot_rtol(model.config.hidden_size), "direct effects")
        layer, head, _ = heads[-1]
        page.page.click(f"#wb-why-0 .wb-why-head[data-layer='{layer}'][data-head='{head}']")
        page.settle()
        assert page.page.input_value("#wb-step-layer-0") == str(layer)
        assert page.page.input_value("#wb-step-head-0") == str(head)
        assert page.problems == []
        page.page.close()

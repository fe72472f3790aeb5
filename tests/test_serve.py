"""minibert serve: the workbench's JSON API through Starlette's TestClient, on tiny random models.

Security (token, Host, Origin, limits) is checked by its refusals; the numbers by what they must equal: the
outputs under an ablation equal `run_with_hooks` with `interventions.ablate_heads`, the step-through's
values equal `run_with_cache`'s hook values. Tolerances: tests/tolerances.py's forward bound, two programs
(the workbench pads to a length bucket and ablates through a traced mask; the reference runs at the real
length), one stage more for the model's head.
"""

from __future__ import annotations

import json
import math
import queue
import subprocess
import sys
import threading
import types

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_hf_model
from starlette.testclient import TestClient
from tolerances import assert_close_to_scale, forward_rtol

import minibert
from minibert import HookFn
from minibert.analysis import flow, interventions, mixing
from minibert.app import serve
from minibert.runtime.buckets import bucket_length
from minibert.viz._html import UNIT_BYTE_ERROR
from minibert.viz.workbench import MAX_CHARS, Workbench

PORT = 8765
BASE = f"http://127.0.0.1:{PORT}"
TOKEN = "test-token"
MASKED = "a b [MASK] d e f."
EPS32 = float(np.finfo(np.float32).eps)


def client_for(*models, limiter=None, max_tokens: int = 64) -> TestClient:
    workbenches = [Workbench(model, max_tokens=max_tokens) for model in models]
    app = serve.create_app(workbenches, TOKEN, port=PORT, limiter=limiter or serve.RateLimiter(1e6, 10**6))
    return TestClient(app, base_url=BASE)


def post(client, action, body, **headers):
    return client.post(f"/api/{action}", json=body, headers={serve.TOKEN_HEADER: TOKEN, **headers})


@pytest.fixture(scope="module")
def mlm(tiny_mlm):
    return tiny_mlm[0]


@pytest.fixture(scope="module")
def client(mlm):
    return client_for(mlm)


def head_rtol(config, length: int) -> float:
    """forward_rtol with the head's stage added (its transform, LayerNorm and unembedding are one more block's
    worth of reductions or fewer): √((L + 2) / (L + 1)) times the encoder's bound."""
    layers = config.num_hidden_layers
    return forward_rtol(config, length) * math.sqrt((layers + 2) / (layers + 1))


# ---- security ---------------------------------------------------------------------------------------------

def test_the_token_is_required(client):
    assert client.get("/").status_code == 403
    assert client.get("/?token=wrong").status_code == 403
    page = client.get(f"/?token={TOKEN}")
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    refused = client.post("/api/info", json={})
    assert refused.status_code == 403 and "token" in refused.json()["error"]
    assert post(client, "info", {}).status_code == 200


def test_a_refused_page_says_why_as_a_page(client):
    """A browser opening the workbench without its token (or from a foreign page) got raw JSON; it now gets a page
    naming the reason, with user text escaped and nothing that runs. The API still answers JSON."""
    refused = client.get("/")
    assert refused.status_code == 403 and refused.headers["content-type"].startswith("text/html")
    assert "the access token is missing or wrong" in refused.text and "<script" not in refused.text
    assert refused.headers["content-security-policy"] == "default-src 'none'"
    origin = 'http://evil.example/"><script>alert(1)</script>'
    foreign = client.get(f"/?token={TOKEN}", headers={"origin": origin})
    assert foreign.status_code == 403 and "<script>" not in foreign.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in foreign.text
    assert client.post("/api/info", json={}).json()["error"].startswith("the access token is missing or wrong")


@pytest.mark.parametrize("headers", [{"host": "evil.example"}, {"host": "evil.example:8765"},
                                     {"origin": "http://evil.example"}, {"origin": f"http://127.0.0.1:{PORT + 1}"}])
def test_foreign_host_or_origin_is_refused(client, headers):
    """DNS rebinding sends the attacker's name as Host; a cross-site page sends its Origin: both get 403."""
    answer = post(client, "info", {}, **headers)
    assert answer.status_code == 403, answer.text
    assert post(client, "info", {}, origin=BASE).status_code == 200
    assert post(client, "info", {}, host=f"localhost:{PORT}").status_code == 200


def test_limits_have_clear_messages(mlm):
    client = client_for(mlm, max_tokens=16)
    too_long = post(client, "run", {"text": "a" * (MAX_CHARS + 1)})
    assert too_long.status_code == 400 and f"at most {MAX_CHARS:,}" in too_long.json()["error"]
    many_tokens = post(client, "run", {"text": " ".join("abcdefghijklmnopqrst")})
    assert many_tokens.status_code == 400 and "shorten it to about 14 word pieces" in many_tokens.json()["error"]
    assert "--max-tokens" in many_tokens.json()["error"]  # 20 letters and [CLS] [SEP]: 14 + 2 fit in 16
    huge = client.post("/api/run", content=b"{" + b" " * serve.MAX_BODY_BYTES + b"}",
                       headers={serve.TOKEN_HEADER: TOKEN})
    assert huge.status_code == 413
    assert "not one of" in post(client, "mixing", {"text": "a b", "method": "x"}).json()["error"]
    assert "[layer, head]" in post(client, "run", {"text": "a b", "ablate": [3]}).json()["error"]
    assert "0 to 1" in post(client, "run", {"text": "a b", "ablate": [[2, 0]]}).json()["error"]
    assert "'model' must be 0" in post(client, "run", {"text": "a b", "model": 1}).json()["error"]


LETTERS = " ".join("abcdefghijklmnopqrst")  # 20 word pieces: each letter is a word of the tests' vocabulary


@pytest.mark.parametrize("max_tokens, body, said", [
    (16, {"text": "a b", "pair": LETTERS},  # 3 special tokens ([CLS] a b [SEP] … [SEP]): 13 pieces fit in 16
     "the text and sentence B together are 22 word pieces long (2 and 20); shorten them to about 13 word pieces "
     "together"),
    # At the model's 64 positions, texts past the tokenizer's own limit (512) got its advice for Python callers
    # ("pass max_length=512"): 999 one-letter words, 1,998 characters, within the 2,000 allowed.
    (64, {"text": "a " * 999}, "the text is 999 word pieces long; shorten it to about 62 word pieces"),
    (64, {"text": "a b", "pair": "a " * 900},
     "the text and sentence B together are 902 word pieces long (2 and 900); shorten them to about 61 word pieces "
     "together"),
], ids=["pair", "past-the-tokenizers-limit", "pair-past-the-tokenizers-limit"])
@pytest.mark.parametrize("action", ["run", "tokenize"])
def test_too_many_tokens_get_the_workbenchs_message(mlm, max_tokens, body, said, action):
    """Under any --max-tokens, up to the model's positions, a text (or a pair) with too many tokens gets the
    workbench's message, which counts what the page's boxes hold; below the model's positions the limit is the
    lecturer's to raise, at them the model's own."""
    assert mlm.config.max_tokens == 64
    answer = post(client_for(mlm, max_tokens=max_tokens), action, body)
    assert answer.status_code == 400, answer.text
    change = ("the model takes no more" if max_tokens == 64 else
              "whoever started it can change that: minibert serve --max-tokens")
    assert answer.json()["error"] == (f"{said} (this workbench takes {max_tokens} tokens with [CLS] and [SEP]; "
                                      f"{change}).")


def test_max_tokens_is_checked(mlm):
    with pytest.raises(minibert.MinibertError, match="at least 3"):
        Workbench(mlm, max_tokens=0)


def test_request_rate_is_limited():
    now = [0.0]
    limiter = serve.RateLimiter(rate=2.0, burst=3, clock=lambda: now[0])
    assert [limiter.allow("a") for _ in range(4)] == [True, True, True, False]
    assert limiter.allow("b")  # per client
    now[0] = 0.5  # one request's worth refilled at 2 a second
    assert limiter.allow("a") and not limiter.allow("a")


def test_too_many_requests_get_429(mlm):
    client = client_for(mlm, limiter=serve.RateLimiter(rate=1e-9, burst=1))
    assert post(client, "info", {}).status_code == 200
    refused = post(client, "info", {})
    assert refused.status_code == 429 and "too many requests" in refused.json()["error"]


# ---- numbers ----------------------------------------------------------------------------------------------

def softmax(logits):
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def ablation(model, batch, heads, mode) -> tuple[np.ndarray, dict]:
    """The [L, H] mask of `heads` and `interventions.ablate_heads`' hooks for it (mean: over `batch`'s tokens)."""
    cfg = model.config
    mask = np.zeros((cfg.num_hidden_layers, cfg.num_attention_heads), np.float32)
    for layer, head in heads:
        mask[layer, head] = 1
    mean = interventions.mean_z(model, batch) if mode == "mean" else None
    return mask, interventions.ablate_heads(mask, mean)


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablation_outputs_equal_run_with_hooks(mlm, client, mode):
    cfg = mlm.config
    heads = [[0, 1], [1, 2]]
    answer = post(client, "run", {"text": MASKED, "ablate": heads, "mode": mode}).json()
    batch = mlm.tokenize([MASKED])
    _, ablating = ablation(mlm, batch, heads, mode)
    position = answer["tokens"].index("[MASK]")
    rtol = head_rtol(cfg, len(answer["tokens"]))
    for side, hooks in (("before", {}), ("after", ablating)):
        logits = np.asarray(mlm.run_with_hooks(batch, hooks=hooks).logits[0, position], np.float64)
        top = answer["outputs"][side]["mlm"][0]
        assert top["position"] == position
        ids = [mlm.tokenizer.vocab[guess["token"]] for guess in top["top"]]
        expected = softmax(logits)
        # |Δp_i| ≤ p_i (|Δlogit_i| + Σ_j p_j |Δlogit_j|) ≤ 2 p_i max|Δlogit|, max|Δlogit| ≤ rtol · max|logit|
        delta = rtol * np.abs(logits).max()
        got = np.array([guess["p"] for guess in top["top"]])
        assert np.all(np.abs(got - expected[ids]) <= 2 * expected[ids] * delta + 1e-12), (side, got, expected[ids])
        assert np.all(expected[ids] >= np.sort(expected)[-len(ids)] - 2 * delta)  # they are the top k
    before = np.array([g["p"] for g in answer["outputs"]["before"]["mlm"][0]["top"]])
    after = np.array([g["p"] for g in answer["outputs"]["after"]["mlm"][0]["top"]])
    assert not np.allclose(before, after)  # the ablation changed something: the test can fail


def test_class_probabilities_equal_the_models(tmp_path):
    make_hf_model(tmp_path, "BertForSequenceClassification", num_labels=3)
    model = minibert.load(tmp_path)
    client = client_for(model)
    answer = post(client, "run", {"text": "a b c", "pair": "d e", "ablate": [[1, 3]]}).json()
    batch = model.tokenize(["a b c"], ["d e"])
    mask = interventions.head_mask(1, 3, model.config.num_hidden_layers, model.config.num_attention_heads)
    rtol = head_rtol(model.config, batch.input_ids.shape[1])
    for side, hooks in (("before", {}), ("after", interventions.ablate_heads(mask))):
        logits = np.asarray(model.run_with_hooks(batch, hooks=hooks).logits[0], np.float64)
        classes = answer["outputs"][side]["classes"]
        assert [c["label"] for c in classes] == list(model.config.id2label)
        got = np.array([c["p"] for c in classes])
        assert np.all(np.abs(got - softmax(logits)) <= 2 * softmax(logits) * rtol * np.abs(logits).max() + 1e-12)


def test_token_class_probabilities_equal_the_models(tmp_path):
    make_hf_model(tmp_path, "BertForTokenClassification", num_labels=3)
    model = minibert.load(tmp_path)
    answer = post(client_for(model), "run", {"text": "a b c", "ablate": [[0, 1]]}).json()
    batch = model.tokenize(["a b c"])
    mask = interventions.head_mask(0, 1, model.config.num_hidden_layers, model.config.num_attention_heads)
    rtol = head_rtol(model.config, batch.input_ids.shape[1])
    for side, hooks in (("before", {}), ("after", interventions.ablate_heads(mask))):
        logits = np.asarray(model.run_with_hooks(batch, hooks=hooks).logits[0], np.float64)  # [T, labels]
        per_token = answer["outputs"][side]["token_classes"]
        assert len(per_token) == len(batch.tokens[0])
        assert all([c["label"] for c in classes] == list(model.config.id2label) for classes in per_token)
        got = np.array([[c["p"] for c in classes] for classes in per_token])
        # as for the masked LM: |Δp| ≤ 2 p max|Δlogit|, max|Δlogit| ≤ rtol · max|logit| (per token)
        delta = rtol * np.abs(logits).max(-1, keepdims=True)
        assert np.all(np.abs(got - softmax(logits)) <= 2 * softmax(logits) * delta + 1e-12), side


def test_step_through_values_are_the_hooks(mlm, client):
    layer, head, query = 1, 2, 3
    answer = post(client, "step", {"text": MASKED, "pair": "g h", "layer": layer, "head": head,
                                   "query": query}).json()
    batch = mlm.tokenize([MASKED], ["g h"])
    _, cache = mlm.run_with_cache(batch)
    at = lambda name: np.asarray(cache[name])[0]  # noqa: E731
    block = f"blocks.{layer}."
    expected = {
        "word": at("embed.hook_embed")[query], "position": at("embed.hook_pos_embed")[query],
        "segment": at("embed.hook_token_type_embed")[query], "embed_ln": at("hook_full_embed")[query],
        "x": at(block + "hook_resid_pre")[query], "q": at(block + "attn.hook_q")[query, head],
        "k": at(block + "attn.hook_k")[:, head], "v": at(block + "attn.hook_v")[:, head],
        "qk": at(block + "attn.hook_qk")[head, query], "scaled": at(block + "attn.hook_attn_scores")[head, query],
        "pattern": at(block + "attn.hook_pattern")[head, query], "z": at(block + "attn.hook_z")[query, head],
        "concat": at(block + "attn.hook_z")[query].reshape(-1), "head_out": at(block + "attn.hook_result")[query, head],
        "attn_out": at(block + "hook_attn_out")[query], "resid_mid": at(block + "hook_resid_mid")[query],
        "ln1": at(block + "ln1.hook_out")[query], "ffn_pre": at(block + "mlp.hook_pre")[query],
        "ffn_post": at(block + "mlp.hook_post")[query], "ffn_out": at(block + "hook_mlp_out")[query],
        "resid_post": at(block + "hook_resid_post")[query], "ln2": at(block + "ln2.hook_out")[query],
    }
    steps = {step["id"]: step for step in answer["steps"]}
    assert list(steps) == list(expected)
    rtol = forward_rtol(mlm.config, batch.input_ids.shape[1])
    for name, value in expected.items():
        assert steps[name]["shape"] == list(value.shape), name
        assert_close_to_scale(np.reshape(steps[name]["values"], value.shape), value, rtol, name)
    assert answer["tokens"][query] == batch.tokens[0][query]


def test_one_program_per_length_bucket(mlm, client):
    """New texts of the same bucket, other heads, another ablation mode: the compiled programs are reused, the
    mixing maps' too."""
    first = {"text": "a b c", "ablate": [[0, 0]]}
    post(client, "run", first)
    for method in ("value_zeroing", "alti"):
        post(client, "mixing", {**first, "method": method})
    traces = mlm.programs.traces
    for body in ({"text": "c d e f", "ablate": [[1, 3]]}, {"text": "e f", "ablate": [[0, 2], [1, 1]], "mode": "mean"},
                 {"text": "f g h"}):
        assert post(client, "run", body).status_code == 200
        for method in ("value_zeroing", "alti"):
            assert post(client, "mixing", {**body, "method": method}).status_code == 200
    assert mlm.programs.traces == traces


def test_warm_up_compiles_every_program_a_request_runs(tmp_path):
    """serve.warm_up compiles each program once and names it: the rows Model.run really runs, 64 tokens (its
    smallest for a few rows, buckets.FEW_ROWS_SMALLEST), 128 and 256 (one per doubling, buckets.INTERACTIVE) for
    the workbench's 9 buckets up to 256 — not a line and a count per bucket. Afterwards runs and steps of new texts
    with heads ablated either way compile nothing: a fresh model, so no other test compiled them first. The mixing
    maps compile when first asked, once."""
    make_hf_model(tmp_path, "BertForMaskedLM", max_position_embeddings=256)
    model = minibert.load(tmp_path)
    workbench, said = Workbench(model, max_tokens=256), []
    assert workbench.buckets == (16, 24, 32, 48, 64, 96, 128, 192, 256)
    serve.warm_up([workbench], step=said.append)
    assert said == [f"model 0: compiling for {rows}-token rows (texts of up to {rows} tokens)… ({n}/3)"
                    for n, rows in enumerate((64, 128, 256), 1)] + ["ready"]
    assert model.programs.traces == 3
    for mode in ("zero", "mean"):
        for text in (f"a b {mode} d", "a " * 100):  # 102 tokens: the 128-token program
            body = {"text": text, "pair": "e", "ablate": [[1, 2]], "mode": mode}
            workbench.answer("run", body)
            workbench.answer("step", {**body, "layer": 1, "head": 0, "query": 2})
    assert model.programs.traces == 3
    for method in ("value_zeroing", "alti"):
        workbench.answer("mixing", {"text": "a b c d", "method": method})
    traces = model.programs.traces
    for method in ("value_zeroing", "alti"):
        workbench.answer("mixing", {"text": "a b e d", "pair": "c", "ablate": [[0, 1]], "method": method})
    assert model.programs.traces == traces


def test_runs_are_answered_while_a_mixing_map_compiles(tiny_mlm):
    """A mixing map compiling (held here on an event, as a long compile) holds up no run, step or tokenize of
    another text, and `status` names it meanwhile (alti, for the bucket of "a b c"); afterwards nothing."""
    import threading

    workbench = Workbench(tiny_mlm[0], max_tokens=16)
    release, entered = threading.Event(), threading.Event()
    alti = mixing.alti

    def held(*args, **kwargs):
        entered.set()
        assert release.wait(timeout=300)
        return alti(*args, **kwargs)

    mixing.alti = held
    try:
        waiting = threading.Thread(target=workbench.answer, args=("mixing", {"text": "a b c", "method": "alti"}))
        waiting.start()
        assert entered.wait(timeout=300)
        bucket = bucket_length(5, workbench.buckets)  # [CLS] a b c [SEP]
        assert workbench.answer("status", {})["compiling"] == [{"what": "alti", "tokens": bucket}]
        assert workbench.answer("tokenize", {"text": "d e"})["tokens"] == ["[CLS]", "d", "e", "[SEP]"]
        assert workbench.answer("run", {"text": "d e"})["tokens"] == ["[CLS]", "d", "e", "[SEP]"]
        assert workbench.answer("step", {"text": "d e", "layer": 1, "head": 0, "query": 1})["query"] == 1
        assert waiting.is_alive()  # the map is still compiling: the answers above did not wait for it
    finally:
        release.set()
        mixing.alti = alti
    waiting.join(timeout=300)
    assert workbench.answer("status", {})["compiling"] == []


def test_step_numbers_are_rounded_to_what_float32_holds():
    """The step's numbers travel with SIGNIFICANT digits: each within half a unit of the 8th digit of the float32 value
    (|x|·5e-8, below one float32 step, 2⁻²³|x|), printed in at most 8 digits (magnitudes 1e-14 … 1e14, where the
    powers of ten it scales by are exact); zeros and infinities as they are."""
    from minibert.viz.steps import SIGNIFICANT, rounded

    x = np.random.default_rng(0).standard_normal(1000) * np.logspace(-14, 14, 1000)
    x = x.astype(np.float32).astype(np.float64)
    kept = rounded(x)
    assert np.all(np.abs(kept - x) <= 0.5 * 10.0 ** (1 - SIGNIFICANT) * np.abs(x) * (1 + 1e-12))
    assert np.all(np.abs(kept - x) < 2.0**-23 * np.abs(x))
    exact_powers = kept[(np.abs(x) >= 1e-14) & (np.abs(x) <= 1e14)]
    digits = [len(repr(v).split("e")[0].replace("-", "").replace(".", "").strip("0")) for v in exact_powers.tolist()]
    assert max(digits) <= SIGNIFICANT
    assert rounded(np.array([0.0, -np.inf, np.inf])).tolist() == [0.0, -np.inf, np.inf]


def test_tokenize_and_views(client):
    answer = post(client, "tokenize", {"text": "a b", "pair": "c"}).json()
    assert answer["tokens"] == ["[CLS]", "a", "b", "[SEP]", "c", "[SEP]"] and answer["sentence_b_start"] == 4
    run = post(client, "run", {"text": "a <b>&"}).json()
    assert set(run["views"]) == {"head", "model", "neuron"}
    assert run["views"]["head"]["meta"]["tokens"] == run["tokens"]
    mixed = post(client, "mixing", {"text": "a b c", "method": "rollout"}).json()
    assert mixed["views"]["head"]["meta"]["n_heads"] == 1


def unpacked(view_data: dict) -> np.ndarray:
    """A view's attention as the page decodes it: one byte per weight, /255 ("unit_byte", viz._html)."""
    import base64
    import zlib

    packed = view_data["arrays"]["attention"]
    assert packed["packing"] == "unit_byte"
    return np.stack([np.frombuffer(zlib.decompress(base64.b64decode(layer)), np.uint8).reshape(packed["shape"])
                     for layer in packed["layers"]]) / 255


@pytest.mark.parametrize("method", ["rollout", "value_zeroing", "alti"])
def test_mixing_views_show_the_analyses_maps(mlm, client, method):
    text, pair = "a b c d", "e f"
    answer = post(client, "mixing", {"text": text, "pair": pair, "method": method}).json()
    batch = mlm.tokenize([text], [pair])
    if method == "rollout":
        _, cache = mlm.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
        expected = flow.attention_rollout(np.asarray(cache.stack("attn.hook_pattern"))[:, 0])
    else:
        expected = getattr(mixing, method)(mlm, batch)[:, 0]
    for kind in ("head", "model"):
        shown = unpacked(answer["views"][kind])[:, 0]  # one map per layer, drawn as head 0
        # the page's byte packing (≤ 1/510) plus the two runs' rounding (the workbench's is padded to a bucket)
        rtol = forward_rtol(mlm.config, batch.input_ids.shape[1])
        np.testing.assert_allclose(shown, expected, rtol=0, atol=UNIT_BYTE_ERROR + rtol)


def rollout_reference(model, batch, mask, hooks) -> np.ndarray:
    """Rollout of the ablated run's patterns, the ablated heads' as zeros (they move nothing), float64 [L, T, T]."""
    _, cache = model.run(batch, names="blocks.*.attn.hook_pattern", hooks=hooks)
    patterns = np.asarray(cache.stack("attn.hook_pattern"), np.float64)[:, 0]  # [L, H, T, T]
    return flow.attention_rollout(patterns * (1 - mask)[:, :, None, None])


def value_zeroing_reference(model, batch, hooks) -> np.ndarray:
    """Raw 1 − cos [L, T, S] from L × T literal forwards under `hooks`, each zeroing one token's values in one
    block after them (test_analysis_mixing's loop with the ablation added), the cosine in float64."""
    from test_analysis_mixing import zero_value_at

    L, T = model.config.num_hidden_layers, batch.input_ids.shape[1]
    outputs = [f"blocks.{layer}.hook_normalized_resid_post" for layer in range(L)]
    _, clean = model.run(batch, names=outputs, hooks=hooks)
    distances = np.zeros((L, T, T))
    for layer, token in np.ndindex(L, T):
        zeroing = (f"blocks.{layer}.attn.hook_v", HookFn(zero_value_at, token=jnp.int32(token)))
        _, cache = model.run(batch, names=[outputs[layer]], hooks=[*hooks.items(), zeroing])
        x, y = (np.asarray(c[outputs[layer]], np.float64)[0] for c in (clean, cache))
        distances[layer, :, token] = 1 - (x * y).sum(-1) / np.linalg.norm(x, axis=-1) / np.linalg.norm(y, axis=-1)
    return distances


ALTI_SITES = ["hook_resid_pre", "attn.hook_v", "attn.hook_pattern", "ln1.hook_scale", "ln1.hook_out"]


def alti_reference(model, batch, mask, hooks) -> tuple[np.ndarray, np.ndarray]:
    """ALTI's definition (docs/context_mixing.md) in float64 on the ablated run's captures, the ablated heads
    carrying no token's term: z_ts = Σ_h (1 − mask_lh) α^h_ts f^h(x_s) + [t = s] x_s. Also the tolerance of each
    entry, test_analysis_mixing's per-head ALTI bound: the float32 terms' rounding (atol), × 2D / the row sum."""
    _, cache = model.run(batch, names=[f"blocks.*.{site}" for site in ALTI_SITES], hooks=hooks)
    maps, bounds = [], []
    for layer in range(model.config.num_hidden_layers):
        x, v, pattern, scale, y = (np.asarray(cache[f"blocks.{layer}.{site}"][0], np.float64) for site in ALTI_SITES)
        p = model.params["blocks"][layer]
        gamma, W_O = (np.asarray(a, np.float64) for a in (p["ln1"]["scale"], p["attn"]["W_O"]))
        f = np.einsum("SHK,HKD->HSD", v, W_O)
        z = np.einsum("HTS,HSD->TSD", pattern * (1 - mask[layer])[:, None, None], f) + np.eye(len(x))[..., None] * x
        terms = gamma * (z - z.mean(-1, keepdims=True)) / scale[:, :, None]
        c = np.maximum(0, np.abs(y).sum(-1)[:, None] - np.abs(y[:, None] - terms).sum(-1))
        rows = c.sum(-1, keepdims=True)
        maps.append(c / rows)
        magnitude = np.abs(gamma).max() * (np.abs(x).max() + np.abs(v).max() * np.sqrt(v.shape[-1])) / scale.min()
        atol = 8 * EPS32 * magnitude * np.sqrt(model.config.hidden_size * len(x))
        bounds.append(np.broadcast_to(2 * model.config.hidden_size * atol / rows + 4 * EPS32, c.shape))
    return np.stack(maps), np.stack(bounds)


@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("method", ["rollout", "value_zeroing", "alti"])
def test_mixing_maps_are_the_ablated_models(mlm, client, method, mode):
    """With heads ablated, the mixing views show the ablated model's map: the analysis under the same
    `ablate_heads` HookFn equals a brute-force reference (value zeroing: a loop of literal hooked forwards; ALTI:
    its definition on the hooked run's captures), and the page's bytes equal it."""
    from test_analysis_mixing import block_noise

    text, pair, heads = "a b c d", "e f", [[0, 1], [1, 2]]
    batch = mlm.tokenize([text], [pair])
    mask, hooks = ablation(mlm, batch, heads, mode)
    if method == "rollout":
        expected, unablated = (rollout_reference(mlm, batch, m, h) for m, h in ((mask, hooks), (0 * mask, {})))
    elif method == "value_zeroing":
        raw = value_zeroing_reference(mlm, batch, hooks)
        got = mixing.value_zeroing(mlm, batch, hooks=hooks, normalize=False)[:, 0]
        eps = block_noise(mlm)  # 1 − cos = ½‖x̂ − ŷ‖²: a relative error ε in either output moves it ≤ 2√d·ε + ε²
        np.testing.assert_array_less(np.abs(got - raw), 2 * np.sqrt(raw) * eps + eps**2 + 1e-30)
        expected = raw / raw.sum(-1, keepdims=True)
        unablated = mixing.value_zeroing(mlm, batch)[:, 0]
    else:
        expected, bound = alti_reference(mlm, batch, mask, hooks)
        silenced = {"blocks.*.attn.hook_pattern": lambda pattern, ctx: pattern * (1 - mask[ctx.layer])[:, None, None]}
        got = mixing.alti(mlm, batch, hooks={**hooks, **silenced})[:, 0]  # as mixing.alti asks of an ablation
        np.testing.assert_array_less(np.abs(got - expected), bound)
        unablated = mixing.alti(mlm, batch)[:, 0]
    answer = post(client, "mixing", {"text": text, "pair": pair, "method": method, "ablate": heads, "mode": mode})
    # the page's byte packing (≤ 1/510) plus the two runs' rounding (the workbench's is padded to a bucket)
    atol = UNIT_BYTE_ERROR + forward_rtol(mlm.config, batch.input_ids.shape[1])
    for kind in ("head", "model"):
        np.testing.assert_allclose(unpacked(answer.json()["views"][kind])[:, 0], expected, rtol=0, atol=atol)
    assert np.abs(expected - unablated).max() > 4 * atol  # the ablation moved the map: the test can fail


def test_compare_serves_two_models(mlm, tmp_path):
    make_hf_model(tmp_path, "BertForMaskedLM", seed=1)
    other = minibert.load(tmp_path)
    client = client_for(mlm, other)
    first = post(client, "run", {"text": MASKED, "model": 0}).json()["outputs"]["before"]["mlm"][0]["top"]
    second = post(client, "run", {"text": MASKED, "model": 1}).json()["outputs"]["before"]["mlm"][0]["top"]
    assert first != second


def test_the_printed_url_accepts_connections_before_the_server_starts(mlm, monkeypatch):
    """The URL is printed only once the socket listens: a client that follows it at once waits in the backlog
    instead of being refused while uvicorn starts (CI found the refusal on a slow machine)."""
    import io
    import socket
    from urllib.parse import urlsplit

    import uvicorn

    connected, printed = [], io.StringIO()

    def instead_of_running(self, sockets):
        port = urlsplit(printed.getvalue().strip()).port
        with socket.create_connection(("127.0.0.1", port), timeout=60):  # a hang guard: the backlog accepts at once
            connected.append(port)
        sockets[0].close()

    monkeypatch.setattr(uvicorn.Server, "run", instead_of_running)
    monkeypatch.setattr(serve, "warm_up", lambda workbenches, step: None)
    monkeypatch.setattr(sys, "stdout", printed)
    serve.serve([Workbench(mlm, max_tokens=16)], port=0, open_browser=False)
    assert len(connected) == 1 and connected[0] > 0


def test_a_taken_port_is_refused_with_the_fix(mlm):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(minibert.MinibertError, match=r"cannot listen on 127.0.0.1:\d+ .*choose another --port"):
            serve.serve([Workbench(mlm, max_tokens=16)], port=taken.getsockname()[1], open_browser=False)


def test_another_host_is_served_with_a_warning(mlm, monkeypatch, capsys):
    """minibert serve --host ADDRESS: served where asked (the Host check accepts ADDRESS), with a warning on stderr."""
    from minibert.app import cli

    asked = {}
    monkeypatch.setattr(cli, "_load", lambda name, download: mlm)
    monkeypatch.setattr(serve, "serve", lambda workbenches, **options: asked.update(options))
    assert cli.main(["serve", "--host", "192.168.1.20", "--no-browser", "--max-tokens", "16"]) == 0
    assert asked["host"] == "192.168.1.20" and not asked["open_browser"]
    assert "warning: listening on 192.168.1.20" in capsys.readouterr().err
    assert cli.main(["serve", "--no-browser", "--max-tokens", "16"]) == 0 and asked["host"] == "127.0.0.1"
    assert "warning" not in capsys.readouterr().err
    # the Host check: with --host 192.168.1.20 that name is this server's (a page opened there is answered); without
    # it, a request naming it is refused
    remote = TestClient(serve.create_app([Workbench(mlm, max_tokens=16)], TOKEN, host="192.168.1.20", port=PORT),
                        base_url=f"http://192.168.1.20:{PORT}")
    assert post(remote, "info", {}, origin=f"http://192.168.1.20:{PORT}").status_code == 200
    assert post(client_for(mlm), "info", {}, host=f"192.168.1.20:{PORT}").status_code == 403


def test_host_names_are_case_insensitive(mlm):
    """Issue 40, round 5: `Host: LOCALHOST:port` was refused; host names are case-insensitive (RFC 4343)."""
    client = client_for(mlm)
    assert post(client, "info", {}, host=f"LOCALHOST:{PORT}").status_code == 200
    remote = TestClient(serve.create_app([Workbench(mlm, max_tokens=16)], TOKEN, host="MyBox.Local", port=PORT),
                        base_url=f"http://mybox.local:{PORT}")
    assert post(remote, "info", {}, host=f"MYBOX.local:{PORT}").status_code == 200
    assert post(remote, "info", {}, host=f"otherbox.local:{PORT}").status_code == 403


def test_every_address_prints_a_url_that_works_and_advises_the_real_one(mlm, monkeypatch, capsys):
    """Issue 40, round 5: --host 0.0.0.0 printed http://0.0.0.0:PORT/?token=…, which the Host check refuses, and
    warned only that anyone could reach it. Now the URL names 127.0.0.1 and the warning says to pass the address
    other machines will use."""
    import uvicorn

    from minibert.app import cli

    monkeypatch.setattr(cli, "_load", lambda name, download: mlm)
    monkeypatch.setattr(serve, "warm_up", lambda workbenches, step: None)
    monkeypatch.setattr(uvicorn, "Config", lambda app, **options: None)  # its logging setup outlives capsys
    monkeypatch.setattr(uvicorn, "Server", lambda config: types.SimpleNamespace(run=lambda sockets: None))
    assert cli.main(["serve", "--host", "0.0.0.0", "--port", "0", "--no-browser", "--max-tokens", "16"]) == 0
    printed = capsys.readouterr()
    assert printed.out.startswith("http://127.0.0.1:") and "/?token=" in printed.out
    assert "the Host check accepts only local names" in printed.err and "--host 192.168.x.y" in printed.err


def first_line(process: subprocess.Popen, timeout: float) -> str:
    """The first line `process` writes on stdout ("" if it exits first); a failure after `timeout` seconds instead of
    a readline that blocks the suite forever."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        pytest.fail(f"minibert serve printed no line in {timeout} s (exit status {process.poll()})")


@pytest.mark.slow
def test_serve_command_prints_the_url_first(tmp_path):
    """The first line on stdout is the URL with its token, and it answers at once (the socket listens before the
    URL is printed). Every wait is a hang guard, not a timing: the command imports JAX and loads the model before
    printing, and its warm-up thread compiles while the requests are answered."""
    import httpx

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    make_hf_model(model_dir, "BertForMaskedLM")
    command = [sys.executable, "-m", "minibert.app.cli", "serve", "--model", str(model_dir), "--no-browser",
               "--port", "0", "--max-tokens", "16"]
    log = tmp_path / "stderr.log"  # a file, not a pipe nobody reads: the child can never block on writing it
    with log.open("w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        url = first_line(process, timeout=600).strip()
        assert url.startswith("http://127.0.0.1:") and "/?token=" in url, (url, log.read_text())
        assert httpx.get(url, timeout=120).status_code == 200, log.read_text()
        assert httpx.get(url.split("?")[0], timeout=120).status_code == 403
    finally:  # the warm-up thread may still be compiling on a slow machine: wait generously, then make sure
        process.terminate()
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.slow
def test_serve_benchmark_smoke(tmp_path, monkeypatch):
    """benchmarks/serve.py --smoke: its server, edits, ablations and concurrent clients run without errors."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import serve as serve_benchmark

    out = tmp_path / "serve.md"
    assert serve_benchmark.main(["--smoke", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| edit → every panel (16 tokens) |" in text and ": 0 errors;" in text
    sys.modules.pop("serve", None)


def test_a_family_without_segments_steps_through_its_own_hooks(tmp_path):
    """DistilBERT has no segment embeddings: the walk leaves that step out, and every value shown is still the
    hook's."""
    from test_families import make_family_model

    make_family_model(tmp_path, "distilbert", "ForMaskedLM")
    model = minibert.load(tmp_path)
    client = client_for(model)
    text = "a b c d"
    answer = post(client, "step", {"text": text, "layer": 1, "head": 1, "query": 2}).json()
    steps = {step["id"]: step for step in answer["steps"]}
    assert "segment" not in steps and "embed.hook_token_type_embed" not in model.hook_names
    assert steps["embed_ln"]["from"] == ["word", "position"]
    _, cache = model.run_with_cache(model.tokenize([text]))
    rtol = forward_rtol(model.config, len(answer["tokens"]))
    for step_id, name, pick in (("position", "embed.hook_pos_embed", lambda v: v[2]),
                                ("pattern", "blocks.1.attn.hook_pattern", lambda v: v[1, 2]),
                                ("ln2", "blocks.1.ln2.hook_out", lambda v: v[2])):
        expected = pick(np.asarray(cache[name])[0])
        assert_close_to_scale(np.reshape(steps[step_id]["values"], expected.shape), expected, rtol, step_id)


# ---- hostile bodies (issue 32 D) ----------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "fragment"), [
    (b"[" * 30_000 + b"]" * 30_000, "nested"),  # 60 KB, under the size limit: json's recursion gave a 500
    (b'{"text": "a b", "layer": ' + b"7" * 5_000 + b"}", "5000 digits"),  # int() refuses past 4,300 digits: a 500
    (b'{"text": "a b", "ablate": [[' + b"9" * 4_000 + b", 0]]}", "4000 digits"),  # was echoed whole in the error
    (b'{"text": "a b", "layer": 1e999}', "finite"),  # inf and NaN were accepted as a layer (200)
    (b'{"text": "a b", "layer": NaN}', "finite"),
])
def test_hostile_bodies_get_400_with_the_reason(client, body, fragment):
    """Bodies under the size limit that no page sends: each is a 400 saying why, never a 500 or an answer."""
    answer = client.post("/api/run", content=body, headers={serve.TOKEN_HEADER: TOKEN})
    assert answer.status_code == 400 and fragment in answer.json()["error"], answer.text


def _asgi_post(app, chunks, headers: dict[str, str]):
    """POST /api/run straight to the ASGI app: `chunks` are the body's parts as the client sends them (after the
    last the client stalls, as one that announced more than it sends); returns (status, chunks the app read)."""
    import asyncio

    read, sent = [0], []

    async def receive():
        if read[0] < len(chunks):
            read[0] += 1
            return {"type": "http.request", "body": chunks[read[0] - 1], "more_body": True}
        await asyncio.Event().wait()  # the client sends nothing more

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/api/run", "raw_path": b"/api/run", "query_string": b"",
             "root_path": "", "scheme": "http", "http_version": "1.1", "client": ("127.0.0.1", 5000),
             "server": ("127.0.0.1", PORT),
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers | {"host": f"127.0.0.1:{PORT}",
                                                                                  serve.TOKEN_HEADER: TOKEN}).items()]}
    # A hang guard, not a timing: reading to the end would wait for the stalled client forever.
    asyncio.run(asyncio.wait_for(app(scope, receive, send), timeout=60))
    return sent[0]["status"], read[0]


def test_the_size_limit_stops_reading_at_the_limit(mlm):
    """Before: the whole body was read before its size was checked, so `Content-Length: 64 MB` with 1 MB sent got
    no answer. Now a Content-Length over the limit is answered 413 before any byte is read, and a body without
    one (chunked) is read only until it passes the limit."""
    app = serve.create_app([Workbench(mlm, max_tokens=16)], TOKEN, port=PORT, limiter=serve.RateLimiter(1e6, 10**6))
    megabyte = [b" " * 16_384] * 64
    assert _asgi_post(app, megabyte, {"content-length": str(64 * 2**20)}) == (413, 0)
    assert _asgi_post(app, megabyte, {"content-length": "9" * 5_000}) == (413, 0)
    status, read = _asgi_post(app, megabyte, {})
    assert status == 413 and read == serve.MAX_BODY_BYTES // 16_384 + 1  # the first chunk past the limit


def test_a_port_out_of_range_and_a_host_that_is_no_address_name_their_fix(mlm, monkeypatch, capsys):
    """Docs-only tester (trust) items 14, 16, 17: --port -1 / 70000 were socket's OverflowError traceback (exit 1); a
    host that is no address advised another --port; --max-tokens past the model's positions was cut silently."""
    from minibert.app import cli

    loaded = []
    monkeypatch.setattr(cli, "_load", lambda name, download: loaded.append(name) or mlm)
    for port in ("-1", "70000"):
        assert cli.main(["serve", "--no-browser", "--port", port]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"minibert serve: error: --port {port}: pass a port from 0 to 65535 (0 picks a free one).", err
    assert not loaded  # refused before the (slow) loading
    with pytest.raises(minibert.MinibertError, match=r"cannot listen on 999.1.1.1:0 \(.*\); pass a valid --host "
                                                     r"\(127.0.0.1: this machine only\)"):
        serve.serve([Workbench(mlm, max_tokens=16)], host="999.1.1.1", port=0, open_browser=False)
    positions = mlm.config.max_tokens
    assert cli.main(["serve", "--no-browser", "--max-tokens", str(positions + 1)]) == 2
    assert f"--max-tokens {positions + 1}: the model has {positions} positions; pass at most {positions}." in \
        capsys.readouterr().err
    loaded.clear()
    assert cli.main(["serve", "--no-browser", "--max-tokens", "0"]) == 2
    assert capsys.readouterr().err.strip() == ("minibert serve: error: --max-tokens 0: pass at least 3 ([CLS], a word, "
                                               "[SEP]) and at most the model's positions.")
    assert not loaded  # refused before the loading too


@pytest.mark.parametrize("action", ["tokenize", "run", "why"])
def test_a_lone_surrogate_is_answered_not_a_500(client, action):
    """Issue 40: a text over 2,000 characters holding a lone surrogate ("\\ud800", which JSON can carry and UTF-8
    cannot) got 500: the error message quoted it and could not be encoded. Answers escape what UTF-8 cannot hold."""
    body = json.dumps({"text": "a" * (MAX_CHARS - 5) + "\ud800" * 10})  # ASCII: the surrogate as \ud800
    too_long = client.post(f"/api/{action}", content=body.encode("ascii"),
                           headers={serve.TOKEN_HEADER: TOKEN, "Content-Type": "application/json"})
    assert too_long.status_code == 400 and f"at most {MAX_CHARS:,}" in too_long.json()["error"]
    assert "\ud800" in too_long.json()["error"]  # quoted as it was sent, escaped in the JSON

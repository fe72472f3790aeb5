"""The workbench's "features" panel (viz/feature_panel.py) through the HTTP API, against the library called directly:
the features listed are transcoders.encode of run_with_cache's MLP inputs (the unpadded text: another program), a
clicked feature's edges are the column of graphs.attribute's adjacency for the why panel's target, and bad input
(a transcoder of another width or site, a missing file, a feature not active, hostile text) gets one message.
The transcoders are planted: random, saved with transcoders.save and loaded as --transcoder loads them."""

from __future__ import annotations

import numpy as np
import pytest
from starlette.testclient import TestClient
from test_graphs import random_transcoders
from test_serve import PORT, TOKEN, post
from tolerances import assert_close_to_scale, dot_rtol, forward_rtol

import minibert
from minibert.analysis import graphs
from minibert.analysis import transcoders as tcs
from minibert.app import serve
from minibert.viz import feature_panel
from minibert.viz.workbench import Workbench

TEXT = "a b [MASK] d e f."


@pytest.fixture(scope="module")
def planted(tiny_mlm, tmp_path_factory):
    """(model, [(config, params)] one per block, their saved directories, a client serving the model with them)."""
    model = tiny_mlm[0]
    pairs = random_transcoders(model)
    root = tmp_path_factory.mktemp("transcoders")
    paths = [tcs.save(root / f"tc-{config.layer}", config, params) for config, params in pairs]
    loaded = feature_panel.load_transcoders(model, paths)
    workbench = Workbench(model, max_tokens=64, resources={"transcoders": loaded})
    client = TestClient(serve.create_app([workbench], TOKEN, port=PORT), base_url=f"http://127.0.0.1:{PORT}")
    return model, pairs, paths, client


def ask(client, body):
    response = post(client, "features", body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.slow  # the module's fixture and the features' program: past 10 s on a loaded 2-core machine
def test_the_features_are_the_transcoders_latents_of_the_text(planted):
    model, pairs, _, client = planted
    answer = ask(client, {"text": TEXT})
    batch = model.tokenize([TEXT])
    assert answer["tokens"] == batch.tokens[0] and answer["layers"] == [0, 1] and answer["hint"] is None
    names = [tcs.sites(model, config.layer)[0] for config, _ in pairs]
    _, cache = model.run_with_cache(batch, names=names)
    f = np.stack([np.asarray(tcs.encode(c, p, np.asarray(cache[n])[0])) for (c, p), n in zip(pairs, names)], 1)
    T, L, S = f.shape
    # the workbench's MLP inputs come from the padded bucket's program, these from the unpadded text's: both within
    # the forward's bound of the model's, and the encoder is a D-term dot product more
    rtol = forward_rtol(model.config, T) + dot_rtol(model.config.hidden_size)
    for position, listed in enumerate(answer["features"]):
        flat = f[position].reshape(-1)
        order = np.argsort(-flat, kind="stable")[:feature_panel.TOP_FEATURES]
        want = [(int(i // S), int(i % S)) for i in order if flat[i] > 0]
        assert [(x["layer"], x["latent"]) for x in listed] == want, position
        assert_close_to_scale([x["activation"] for x in listed], flat[order[:len(want)]], rtol, "activations")


@pytest.mark.slow  # two attribution graphs (two programs each) of a tiny model: past 10 s on a loaded 2-core machine
def test_a_clicked_feature_feeds_its_edges_in_the_why_targets_graph(planted):
    model, pairs, _, client = planted
    listed = ask(client, {"text": TEXT})["features"]
    # a layer-0 feature: its write reaches layer 1's features at every position through attention (a last-layer
    # feature away from the [MASK] feeds nothing: no attention runs after the last MLP)
    feature = next([x["layer"], t, x["latent"]] for t, row in enumerate(listed) for x in row if x["layer"] == 0)
    answer = ask(client, {"text": TEXT, "feature": feature})
    batch = model.tokenize([TEXT])
    mask = model.tokenize([TEXT]).tokens[0].index("[MASK]")
    logits = np.asarray(model(batch).logits)[0, mask]
    target = graphs.mlm_target(model, batch, int(np.argmax(logits)), position=mask)  # the why panel's target
    graph = graphs.attribute(model, batch, pairs, target)
    pruned = graphs.prune(graph)
    source = graph.node_index(*feature)
    column = graph.adjacency[:, source]
    order = [i for i in np.argsort(-np.abs(column), kind="stable")[:feature_panel.TOP_EDGES] if column[i] != 0]
    assert answer["target"] == f"the top guess's logit at the first [MASK] (position {mask})"
    # the same function on the same batch and transcoders: the same two programs, so the same numbers bit for bit
    assert [e["weight"] for e in answer["edges"]] == [float(column[i]) for i in order]
    assert [e["label"] for e in answer["edges"]] == [graph.node_label(i) for i in order]
    assert [e["kept"] for e in answer["edges"]] == [bool(pruned.edge_mask[i, source]) for i in order]
    assert answer["activation"] == float(graph.activations[source]) and answer["edges"]
    again = ask(client, {"text": TEXT, "feature": feature})
    assert again == answer  # the graph is kept for the text: a second click reads it


def test_without_transcoders_the_panel_says_how_to_get_them(tiny_mlm):
    workbench = Workbench(tiny_mlm[0], max_tokens=32)
    answer = workbench.answer("features", {"text": "a b"})
    assert answer["tokens"] is None and "minibert serve --model MODEL --transcoder out/tc-0" in answer["hint"]


def test_transcoders_of_another_model_or_a_missing_file_are_refused_at_start_up(planted, tmp_path):
    model, pairs, paths, _ = planted
    with pytest.raises(minibert.InputError, match=r"--transcoder .*nowhere: no such file or directory"):
        feature_panel.load_transcoders(model, [tmp_path / "nowhere"])
    narrow = tcs.TranscoderConfig(d_in=16, d_sae=8, d_out=16, layer=0, architecture="relu")
    tcs.save(tmp_path / "narrow", narrow, tcs.init_params(narrow))
    with pytest.raises(minibert.InputError, match=r"maps 32 → 32 wide vectors, the transcoder 16 → 16"):
        feature_panel.load_transcoders(model, [tmp_path / "narrow"])
    config, params = pairs[0]
    elsewhere = tcs.TranscoderConfig(d_in=32, d_sae=24, d_out=32, layer=0, architecture="relu", skip=True,
                                     hook_in="blocks.0.ln2.hook_out", hook_out="blocks.0.hook_mlp_out")
    tcs.save(tmp_path / "elsewhere", elsewhere, params)
    with pytest.raises(minibert.InputError, match=r"reads 'blocks.0.ln2.hook_out'.*another family"):
        feature_panel.load_transcoders(model, [tmp_path / "elsewhere"])
    with pytest.raises(minibert.InputError, match="two transcoders for layer 0"):
        feature_panel.load_transcoders(model, [paths[0], paths[0] / "cfg.json"])
    import dataclasses

    theirs = dataclasses.replace(config, weights="ab12")  # a transcoder trained on other weights (the CLI has no
    with pytest.raises(minibert.InputError, match=r"trained on the model weights ab12, and --model's are .*: the "
                                                  r"workbench serves a transcoder only with the model it was trained "
                                                  r"on; pass that model as --model"):  # other_weights=True)
        feature_panel.LoadedTranscoders(model, [(theirs, params)])
    # a file of NaN weights (transcoders.save refuses to write one; another writer, or a damaged file, need not)
    import shutil

    from safetensors.numpy import load_file, save_file

    shutil.copytree(paths[0], tmp_path / "nan")
    weights = load_file(tmp_path / "nan" / "sae_weights.safetensors")
    weights["W_dec"][1, 2] = np.nan
    save_file(weights, tmp_path / "nan" / "sae_weights.safetensors")
    with pytest.raises(minibert.InputError, match=r"--transcoder .*nan: the transcoder: params\['W_dec'\] is not "
                                                  r"finite at index \(1, 2\)"):
        feature_panel.load_transcoders(model, [tmp_path / "nan"])


def test_bad_clicks_and_hostile_text_get_messages(planted):
    model, _, _, client = planted
    for feature, said in [([0, 1], "three whole numbers"), ([5, 0, 0], "layer 5 is out of range"),
                          ([0, 99, 0], "position 99 is out of range"), (["0", 0, 0], "three whole numbers")]:
        response = post(client, "features", {"text": TEXT, "feature": feature})
        assert response.status_code == 400 and said in response.json()["error"], (feature, response.text)
    config, params = planted[1][0]
    _, cache = model.run_with_cache(model.tokenize([TEXT]), names=[config.hook_in or tcs.sites(model, 0)[0]])
    f = np.asarray(tcs.encode(config, params, np.asarray(next(iter(cache.values())))[0]))
    quiet = int(np.flatnonzero(f[1] == 0)[0])  # a latent of layer 0 silent at position 1: no node of the graph
    response = post(client, "features", {"text": TEXT, "feature": [0, 1, quiet]})
    assert response.status_code == 400
    assert response.json()["error"] == (f"latent not active at this token: feature {quiet} of layer 0 has "
                                        f"activation 0 at position 1; click one the panel lists.")
    hostile = "</script><img src=x onerror=alert(1)> [MASK]"
    answer = ask(client, {"text": hostile})
    assert answer["tokens"] == model.tokenize([hostile]).tokens[0]  # as data, for the page's textContent
    plain = ask(client, {"text": "a b c d"})["features"]  # no [MASK]: features still listed
    first = plain[1][0]
    no_mask = ask(client, {"text": "a b c d", "feature": [first["layer"], 1, first["latent"]]})
    assert no_mask["target"] is None and "Put [MASK] in the text" in no_mask["hint"]
    assert no_mask["activation"] == first["activation"]  # the listing's program on the same text: the same number
    long = " ".join(["a"] * 40) + " [MASK]"
    n_tokens = len(model.tokenize([long]).tokens[0])
    first = ask(client, {"text": long})["features"][1][0]
    too_long = ask(client, {"text": long, "feature": [first["layer"], 1, first["latent"]]})
    assert too_long["target"] is None and too_long["activation"] == first["activation"]
    assert too_long["hint"] == (f"text too long for a graph: {n_tokens} > {feature_panel.GRAPH_MAX_TOKENS} tokens; "
                                f"shorten it to see what a feature feeds.")


@pytest.mark.slow  # a second tiny model and its graph's two programs: past 10 s on a loaded 2-core machine
def test_a_model_without_a_head_explains_its_sentence_vectors_length(planted, tmp_path):
    """A model with no classifier and no masked-LM head (a sentence encoder, like the bundled MiniLM): a clicked
    feature's edges are those of graphs.direction_target(s / |s|), s the mean-pooled last hidden state."""
    from conftest import make_hf_model

    _, pairs, _, _ = planted
    make_hf_model(tmp_path / "bare", "BertModel", seed=3)
    model = minibert.load(tmp_path / "bare")
    assert not model.config.heads.mlm and model.config.heads.classifier is None
    workbench = Workbench(model, max_tokens=64, resources={"transcoders": feature_panel.LoadedTranscoders(model,
                                                                                                          pairs)})
    listed = workbench.answer("features", {"text": "a b c d"})["features"]
    feature = next([x["layer"], t, x["latent"]] for t, row in enumerate(listed) for x in row if x["layer"] == 0)
    answer = workbench.answer("features", {"text": "a b c d", "feature": feature})
    assert answer["hint"] is None and answer["target"] == ("the sentence vector's length along its own direction "
                                                           "(mean-pooled last hidden state)")
    batch = model.tokenize(["a b c d"])
    s = np.asarray(model(batch).last_hidden_state, np.float64)[0].mean(0)
    graph = graphs.attribute(model, batch, pairs, graphs.direction_target(s / np.linalg.norm(s), "mean"))
    column = graph.adjacency[:, graph.node_index(*feature)]
    order = [i for i in np.argsort(-np.abs(column), kind="stable")[:feature_panel.TOP_EDGES] if column[i] != 0]
    # the same forward and the same function on the same batch: the same programs, so the same numbers bit for bit
    assert [e["weight"] for e in answer["edges"]] == [float(column[i]) for i in order] and order


# ---- the panel in the page (headless chromium) --------------------------------------------------------------

@pytest.mark.slow
def test_the_features_panel_lists_features_and_what_one_feeds(browser, planted):
    """Closed, the panel asks nothing; opened, it lists each token's features (data-value: the API's activation),
    typed markup as text; clicking one lists its edges with the API's weights."""
    from test_serve_browser import Server, Workbench_page

    model, _, paths, client = planted
    text = "a <i id=pwn>b</i> [MASK] d"
    with Server([model], resources={"transcoders": feature_panel.load_transcoders(model, paths)}) as running:
        page = Workbench_page(browser, running)
        asked = []
        page.page.on("request", lambda r: asked.append(r.url) if r.url.endswith("/api/features") else None)
        page.type(text)
        assert asked == [] and page.page.locator("#wb-features-body-0 .wb-feature").count() == 0
        page.page.click("#wb-features-open-0 summary")
        page.page.wait_for_selector("#wb-features-0[aria-busy=false] .wb-feature")
        answer = ask(client, {"text": text})
        shown = page.page.eval_on_selector_all("#wb-features-0 .wb-features-token", "ns => ns.map(n => n.textContent)")
        assert shown == answer["tokens"] and page.page.locator("#pwn").count() == 0  # the markup stays text
        assert page.values("#wb-features-0 .wb-feature") == [x["activation"] for row in answer["features"] for x in row]
        first = page.page.locator("#wb-features-0 .wb-feature[data-layer='0']").first  # one that feeds layer 1
        feature = [int(first.get_attribute(f"data-{k}")) for k in ("layer", "position", "latent")]
        first.click()
        page.page.wait_for_selector("#wb-features-feeds-0 .wb-features-edge")
        edges = ask(client, {"text": text, "feature": feature})["edges"]
        assert edges and page.values("#wb-features-feeds-0 .wb-features-edge") == [e["weight"] for e in edges]
        assert page.problems == []
        page.page.close()


def test_the_serve_command_stops_at_a_bad_transcoder_with_one_line(planted, tmp_path, capsys, monkeypatch):
    """minibert serve --transcoder: a transcoder of another width stops the server before it listens, as one line."""
    from minibert.app import cli

    monkeypatch.setattr(serve, "serve", lambda *args, **kwargs: pytest.fail("the server started"))
    model = planted[0]
    narrow = tcs.TranscoderConfig(d_in=16, d_sae=8, d_out=16, layer=0, architecture="relu")
    tcs.save(tmp_path / "narrow", narrow, tcs.init_params(narrow))
    status = cli.main(["serve", "--model", str(model.source), "--no-browser", "--transcoder", str(tmp_path / "narrow")])
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 2 and said.startswith("minibert serve: error: --transcoder: block 0's MLP here maps 32 → 32")

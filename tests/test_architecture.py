"""The package's shape (docs/architecture.md): one version string, the 0.2 names 0.4 removed are gone (CHANGELOG.md
lists each), and each "where do I add…" of docs/architecture.md tried by adding a toy one here."""

from __future__ import annotations

import importlib
import inspect
import re
import tomllib
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import minibert
from minibert.core.config import Config

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=12,
            max_position_embeddings=16)


# ---- one version string -----------------------------------------------------------------------------------------

def test_the_version_is_written_once():
    """pyproject.toml reads minibert.__version__ (setuptools' dynamic version, read statically as a build reads it),
    `minibert --version` prints it, and CHANGELOG.md has its section."""
    from setuptools.config import expand

    from minibert.app import cli

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "minibert.__version__"}
    assert expand.read_attr("minibert.__version__", root_dir=ROOT) == minibert.__version__
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["--version"])
    assert exit_.value.code == 0
    assert f"## {minibert.__version__}\n" in (ROOT / "CHANGELOG.md").read_text()


def test_the_cli_prints_the_version(capsys):
    from minibert.app import cli

    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out == f"minibert {minibert.__version__}\n"


# ---- the 0.2 names are gone (CHANGELOG.md, 0.4.0) ---------------------------------------------------------------

REMOVED_ATTRIBUTES = [  # (module, old name as CHANGELOG.md writes it)
    ("minibert.core.config", "FAMILY_VALUES"), ("minibert.core.config", "FIELDS_WITHOUT"),
    ("minibert.io.checkpoint", "LAYER_KEYS"), ("minibert.io.checkpoint", "HEAD_KEYS"),
    ("minibert.io.sources", "HUB_FILES"),
    ("minibert.analysis.embeddings", "attention_to_word"), ("minibert.analysis.embeddings", "word_positions"),
    ("minibert.analysis.interventions", "SWEEP_BUDGET_BYTES"), ("minibert.analysis.interventions", "item_bytes"),
    ("minibert.analysis.mixing", "MEMORY_BUDGET"), ("minibert.analysis.mixing", "chunk_size"),
    ("minibert.analysis.corpus", "initialize"),
]
OLD_HOOKS = ["mlm.ln.hook_scale", "mlm.ln.hook_normalized", "mlm.ln.hook_out", "mlm.hook_logits", "pooler.hook_out",
             "nsp.hook_logits"]


def _removed_table() -> str:
    text = (ROOT / "CHANGELOG.md").read_text()
    return text[text.index("### Removed"):text.index("### Moved")]


@pytest.mark.parametrize("module, name", REMOVED_ATTRIBUTES)
def test_a_removed_name_is_gone_and_listed(module, name):
    assert not hasattr(importlib.import_module(module), name)
    assert re.search(rf"\b{name}\b", _removed_table()), f"CHANGELOG.md's removed table does not list {name}"


# Names that collided, renamed with no alias left (CHANGELOG.md, "Renamed so that no two things share a name")
RENAMED = [  # (module, old name, new name)
    ("minibert.core.encoder", "Bert", "Encoder"),  # every family's module, not BERT's alone
    ("minibert.training.finetune", "Step", "TrainingStep"),  # core.shows.Step is the step-through's
    ("minibert.core.shows", "steps", "step_table"),  # viz.steps' is the walk of one head
    ("minibert.viz.steps", "steps", "step_through"),
    ("minibert.viz.workbench", "Programs", "FirstRuns"),  # runtime.programs.Programs is model.programs
    ("minibert.training.data", "mask_tokens", "bert_masking"),  # analysis.mask_tokens' rule differs (all [MASK])
]


@pytest.mark.parametrize("module, old, new", RENAMED)
def test_a_colliding_name_is_renamed_and_listed(module, old, new):
    imported = importlib.import_module(module)
    assert not hasattr(imported, old) and hasattr(imported, new)
    text = (ROOT / "CHANGELOG.md").read_text()
    table = text[text.index("Renamed so that no two things share a name"):]
    assert re.search(rf"`{re.escape(module)}\.{old}` \| `{new}`", table), f"CHANGELOG.md does not list {old} → {new}"


# A Model's compile management, moved behind model.programs with no alias left (CHANGELOG.md, the rings layout)
MOVED_TO_PROGRAMS = {"traces": "traces", "max_programs": "limit", "compiled_programs": "count",
                     "clear_compiled": "clear", "bucket_rule": "bucket_rule", "length_buckets": "length_buckets",
                     "padded_length": "padded_length", "attention_backend": "attention_backend"}


def test_compile_management_is_on_model_programs_only_and_listed():
    """Each moved member is gone from the Model, present on model.programs, and in CHANGELOG.md's old → new row."""
    model = minibert.Model(Config(**TINY))
    text = (ROOT / "CHANGELOG.md").read_text()
    rings = text[text.index("## Unreleased: the rings layout"):text.index("## 0.4.0")]
    for old, new in MOVED_TO_PROGRAMS.items():
        assert not hasattr(model, old), f"Model.{old} is still there: it moved to model.programs.{new}"
        assert hasattr(model.programs, new)
        assert re.search(rf"\| `model\.{old}\b[^|]*\| `model\.programs\.{new}\b", rings), old
    with pytest.raises(AttributeError):  # the count is read, never written: a trace is what adds one
        model.programs.traces += 1


def test_the_old_hook_names_are_unknown_and_listed():
    from minibert.core.hooks import HookError, resolve_names
    from minibert.core.sites import all_hook_names

    model = minibert.Model(Config(**TINY, architecture="BertForPreTraining"))
    for old in OLD_HOOKS:
        assert old not in all_hook_names() and f"`{old}`" in _removed_table().replace("hook `", "`")
        with pytest.raises(HookError, match="no hook point matches"):
            resolve_names(old, model.hook_names, model.config.architecture)


def test_the_removed_keywords_methods_and_cli_alias_are_gone():
    from minibert.analysis import corpus, heads
    from minibert.app import cli
    from minibert.viz._html import View
    from minibert.viz.features import FeatureBrowser

    assert importlib.util.find_spec("minibert.deprecation") is None
    assert "checkpoint" not in inspect.signature(corpus.survey).parameters
    for statistics in (heads.layer_statistics, heads.head_statistics, heads.js_divergence_batch):
        assert "attention_mask" not in inspect.signature(statistics).parameters
    assert not hasattr(View, "document") and not hasattr(FeatureBrowser, "document")
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["stats", "corpus.txt", "--checkpoint", "run.resume"])
    assert exit_.value.code == 2
    table = _removed_table()
    assert all(old in table for old in ("checkpoint=PATH", "--checkpoint", "attention_mask=", "View.document()"))


def test_inputs_are_not_a_tuple():
    inputs = minibert.Model(Config(**TINY)).inputs({"input_ids": np.array([[2, 5, 3]])})
    with pytest.raises(TypeError):
        ids, types, mask = inputs
    with pytest.raises(TypeError):
        inputs[2]  # noqa: B018
    assert re.search(r"model\.inputs\(batch\)\[2\]", _removed_table())


# ---- where do I add… (docs/architecture.md), each tried with a toy one ------------------------------------------

def mean_attention_to_first_token(model, batch) -> np.ndarray:
    """A toy analysis as docs/architecture.md says to write one: [L, H], the attention every real query pays to
    token 0, averaged over the batch's real queries; captured through the Model's public run_with_cache."""
    inputs = model.inputs(batch)
    _, cache = model.run_with_cache(inputs, names=["blocks.*.attn.hook_pattern"])
    pattern = np.asarray(cache.stack("attn.hook_pattern"), np.float64)  # [L, B, H, T, S]
    real = np.asarray(inputs.attention_mask, bool)  # [B, T]
    return (pattern[..., 0] * real[None, :, None, :]).sum((1, 3)) / real.sum()


def test_an_analysis_uses_the_models_boundary_and_agrees_with_a_loop():
    """The toy analysis passes test_layers' boundary check (no module graph, no parameter paths) and equals a
    Python loop over documents, queries and heads of the same captured patterns (the same numbers summed in
    another order: float64 sums of ≤ 8 float32 values, within 8·2⁻⁵³ of each other relative to their size)."""
    from test_layers import boundary_violations

    assert boundary_violations(inspect.getsource(mean_attention_to_first_token)) == []
    model = minibert.Model(Config(**TINY), seed=3)
    batch = {"input_ids": np.array([[2, 7, 9, 3], [2, 8, 3, 0]]), "attention_mask": np.array([[1, 1, 1, 1],
                                                                                               [1, 1, 1, 0]])}
    ours = mean_attention_to_first_token(model, batch)
    _, cache = model.run_with_cache(batch, names=["blocks.*.attn.hook_pattern"])
    L, H = TINY["num_hidden_layers"], TINY["num_attention_heads"]
    expected = np.zeros((L, H))
    for layer in range(L):
        pattern = np.asarray(cache[f"blocks.{layer}.attn.hook_pattern"], np.float64)
        queries = [(b, t) for b in range(2) for t in range(4) if batch["attention_mask"][b, t]]
        for head in range(H):
            expected[layer, head] = sum(pattern[b, head, t, 0] for b, t in queries) / len(queries)
    np.testing.assert_allclose(ours, expected, rtol=8 * 2.0 ** -53 * 8, atol=0)


def test_a_family_is_its_module_plus_its_registry_line():
    """A toy family (BERT's layout under another model_type and prefix) registered from here builds, names its
    architectures, and has BERT's hook sites; unregistered, its config.json is refused by name."""
    import dataclasses

    from minibert.families import registry
    from minibert.io.config_json import read_config

    toy = dataclasses.replace(registry.FAMILIES["bert"], model_type="archtoy", name="ArchToy", prefix="ArchToy",
                              pretraining=None)
    registry.register(toy)
    try:
        config = registry.config_for("ArchToyForMaskedLM", **TINY)
        assert config.family is toy and read_config({"model_type": "archtoy", **TINY}).architecture == "ArchToyModel"
        bert = minibert.Model(Config(**TINY, architecture="BertForMaskedLM"))
        assert minibert.Model(config).hook_names == bert.hook_names
    finally:
        registry.unregister("archtoy")
    with pytest.raises(minibert.ConfigError, match="model_type 'archtoy' is not a family"):
        read_config({"model_type": "archtoy"})


def toy_view(tokens, weights, *, title: str = "Toy view"):
    """A toy view as docs/architecture.md says to write one: inputs checked with viz/_check, data packed by View."""
    from minibert.viz import _check
    from minibert.viz._html import View

    tokens = _check.token_list(tokens)
    weights = np.asarray(weights, np.float32)
    if weights.shape != (len(tokens),):
        raise _check.VizError(f"weights must hold one number per token ({len(tokens)}); got {weights.shape}.")
    return View("toy", {"tokens": tokens}, {"weights": ([weights], "unit_byte")}, title=title, theme="light")


def test_a_view_packs_its_data_and_escapes_user_text():
    """The toy view's page carries its weights within _html's unit_byte error, its tokens and title escaped, and
    loads nothing from the network; a bad input is one VizError naming it."""
    import base64
    import zlib

    from minibert.viz import _check
    from minibert.viz._html import UNIT_BYTE_ERROR

    weights = np.array([0.0, 0.25, 1.0, 0.6], np.float32)
    view = toy_view(["<b>", "a", "&", "z"], weights, title="<script>x</script>")
    packed = view.data["arrays"]["weights"]
    decoded = np.frombuffer(zlib.decompress(base64.b64decode(packed["layers"][0])), np.uint8) / 255
    assert np.abs(decoded - weights).max() <= UNIT_BYTE_ERROR
    page = view.page()
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert '"<b>"' not in page and "\\u003cb\\u003e" in page  # user text in the data is JSON with < escaped
    assert not re.search(r"""(src|href)=["']?https?:""", page)
    with pytest.raises(_check.VizError, match=r"one number per token \(4\)"):
        toy_view(["a", "b", "c", "d"], [1.0])


def toy_panel_answer(workbench, body):
    """A toy panel as docs/architecture.md says to write one: the Workbench's public API only — the checked
    request, its cached run, its padded inputs, its program run under `compiling` — and a JSON-ready answer: the
    largest attention weight of each query of layer 0, head 0, and the row length its program ran at."""
    request = workbench.request(body)
    run = workbench.cached_run(request)
    padded = workbench.padded_inputs(request)
    with workbench.compiling("toy", padded["input_ids"].shape[1]):
        largest = run.stack("attn.hook_pattern")[0, 0].max(-1)
    return {"tokens": run.tokens, "largest": [float(v) for v in largest], "row_length": padded["input_ids"].shape[1],
            "unit": workbench.resource("toy unit")}


def test_a_workbench_panel_is_its_module_plus_its_registry_line(tiny_mlm):
    """A toy panel registered from here is answered over the HTTP API by a workbench built afterwards (its values
    the model's own pattern, its row length the text's bucket, its resource the one it was given), refuses bad
    input as every action does, names only the programs it declared, and is gone once unregistered."""
    from starlette.testclient import TestClient
    from test_serve import PORT, TOKEN, post

    from minibert.app import serve
    from minibert.runtime.buckets import bucket_length, length_buckets
    from minibert.viz import _html, panels
    from minibert.viz.workbench import Workbench

    model = tiny_mlm[0]
    panels.register(panels.Panel("toy", answer=toy_panel_answer, programs=("toy",)))
    try:
        workbench = Workbench(model, max_tokens=32, resources={"toy unit": "probability"})
        client = TestClient(serve.create_app([workbench], TOKEN, port=PORT), base_url=f"http://127.0.0.1:{PORT}")
        answer = post(client, "toy", {"text": "a b c d"}).json()
        _, cache = model.run_with_cache(model.tokenize(["a b c d"]), names=["blocks.0.attn.hook_pattern"])
        reference = np.asarray(cache["blocks.0.attn.hook_pattern"])[0, 0].max(-1)
        assert answer["tokens"] == model.tokenize(["a b c d"]).tokens[0] and answer["unit"] == "probability"
        # padded keys get weight 0 exactly; the real keys' softmax sums one more (zero) term per padded key, and a
        # float32 softmax over S keys is within S rounding errors of its unpadded self
        np.testing.assert_allclose(answer["largest"], reference, rtol=answer["row_length"] * 2.0 ** -24)
        assert answer["row_length"] == bucket_length(len(answer["tokens"]), length_buckets(32))
        assert "toy" in workbench.actions and workbench.programs[-1] == "toy"
        refused = post(client, "toy", {"text": "   "})
        assert refused.status_code == 400 and refused.json()["error"] == "the text is empty; type a sentence."
        with pytest.raises(minibert.InputError, match="'other' is not a program of this workbench's"):
            workbench.compiling("other", 8)
        with pytest.raises(minibert.InputError, match="'why' exists already"):
            panels.register(panels.Panel("why", answer=toy_panel_answer))
        assert "toy" not in panels.constructors_script()  # no page part: nothing in the page's script
    finally:
        panels.unregister("toy")
    assert "toy" not in Workbench(model).actions
    assert "var MINIBERT_PANELS = [minibertWhy" in _html.workbench_script()


def toy_figure(values, tokens, *, title: str = "", ax=None, path=None):
    """A toy figure as docs/architecture.md says to write one: arrays checked with viz/_check, an Axes of the
    caller's or a new NotebookFigure, user text drawn literally, saved by suffix."""
    from minibert.viz import _check
    from minibert.viz.figures._base import _axes, _finish, _tick_labels

    tokens = _check.token_list(tokens)
    v = _check.matrix("values", values, 1, "[T] (one number per token)")
    if v.shape != (len(tokens),):
        raise _check.VizError(f"values must hold one number per token ({len(tokens)}); got {v.shape}.")
    fig, ax = _axes(ax, (4.0, 3.0))
    ax.bar(np.arange(len(tokens)), v)
    _tick_labels(ax, "x", tokens)
    ax.set_title(title, parse_math=False)
    return _finish(fig, path)


def test_a_figure_draws_its_arrays_and_saves_by_suffix(tmp_path):
    """The toy figure holds its values (one bar per token), shows itself as a PNG, keeps "$x$" as typed, draws into
    an Axes it is given, saves .svg by suffix and refuses another suffix and a bad array, each one VizError."""
    from matplotlib.figure import Figure

    from minibert.viz import VizError, figures

    values = np.array([0.5, 2.0, 1.0])
    fig = toy_figure(values, ["$x$", "b", "c"], title="$y$")
    assert isinstance(fig, figures.NotebookFigure) and fig._repr_png_().startswith(b"\x89PNG")
    ax = fig.axes[0]
    np.testing.assert_array_equal([bar.get_height() for bar in ax.patches], values)  # drawn as given, no arithmetic
    assert ax.get_xticklabels()[0].get_text() == "$x$" and not ax.get_xticklabels()[0].get_parse_math()
    assert ax.title.get_text() == "$y$" and not ax.title.get_parse_math()
    own = Figure()
    assert toy_figure(values, ["a", "b", "c"], ax=own.add_subplot()) is own
    saved = tmp_path / "toy.svg"
    toy_figure(values, ["a", "b", "c"], path=saved)
    assert saved.read_text().lstrip().startswith("<?xml")
    with pytest.raises(VizError, match=r"must end in \.png, \.svg or \.pdf"):
        toy_figure(values, ["a", "b", "c"], path=tmp_path / "toy.txt")
    with pytest.raises(VizError, match=r"one number per token \(3\)"):
        toy_figure([1.0], ["a", "b", "c"])


def test_a_cli_command_is_a_subparser_whose_errors_are_one_line(monkeypatch, capsys):
    """A toy command added as build_parser adds one: its output on stdout; a MinibertError from the library it
    calls is one line `minibert NAME: error: …` and exit status 2."""
    from minibert.app import cli
    from minibert.errors import InputError

    def run_toy(args) -> int:
        if args.count < 1:
            raise InputError(f"--count must be at least 1, got {args.count}; pass --count 1 or more.")
        print(" ".join(["toy"] * args.count))
        return 0

    real = cli.build_parser

    def with_toy():
        parser = real()
        commands = next(a for a in parser._actions if a.dest == "command")  # argparse's subparsers action
        toy = commands.add_parser("toy", help="print toy COUNT times")
        toy.add_argument("--count", type=int, default=1)
        toy.set_defaults(run=run_toy)
        return parser

    monkeypatch.setattr(cli, "build_parser", with_toy)
    assert cli.main(["toy", "--count", "2"]) == 0 and capsys.readouterr().out == "toy toy\n"
    assert cli.main(["toy", "--count", "0"]) == cli.USER_ERROR
    error = "minibert toy: error: --count must be at least 1, got 0; pass --count 1 or more.\n"
    assert capsys.readouterr().err == error


def test_a_hook_site_is_a_call_plus_its_row_in_the_site_table(monkeypatch):
    """A toy site: a block that passes its output through hooks("blocks.{i}.hook_toy_out", …), its Site row, and its
    group in the family's block_order. The table's hook_names equal the forward's, the site captures the block's
    output, and writing it (zeros in block 0) reaches block 1 as its input."""
    import dataclasses

    from minibert.core import encoder as model_lib
    from minibert.core import sites
    from minibert.families import registry

    class ToyBlock(model_lib.Block):
        def __call__(self, resid_pre, key_mask, hooks, name, *args, **kwargs):
            return hooks(f"{name}.hook_toy_out", super().__call__(resid_pre, key_mask, hooks, name, *args, **kwargs))

    row = sites.Site("hook_toy_out", ("B", "T", "D"), "the block's output, again (a toy site)", per_block=True)
    monkeypatch.setattr(sites, "SITES", (*sites.SITES, row))
    monkeypatch.setitem(sites._BY_NAME, row.name, row)
    bert = registry.FAMILIES["bert"]
    toy = dataclasses.replace(bert, model_type="sitetoy", name="SiteToy", prefix="SiteToy", pretraining=None,
                              block=ToyBlock, block_order=(*bert.block_order, "hook_toy_out"))
    registry.register(toy)
    try:
        model = minibert.Model(registry.config_for("SiteToyModel", **TINY), seed=2)
        assert model.hook_names == sites.hook_names(model.config)
        batch = {"input_ids": np.array([[2, 7, 9, 3]])}
        _, cache = model.run_with_cache(batch, names=["blocks.0.hook_toy_out", "blocks.0.hook_normalized_resid_post",
                                                      "blocks.1.hook_resid_pre"])
        np.testing.assert_array_equal(cache["blocks.0.hook_toy_out"], cache["blocks.0.hook_normalized_resid_post"])
        _, written = model.run(batch, names=["blocks.1.hook_resid_pre"],
                               hooks={"blocks.0.hook_toy_out": lambda value, ctx: value * 0})
        assert not np.asarray(written["blocks.1.hook_resid_pre"]).any()
    finally:
        registry.unregister("sitetoy")


# Words of other formats that a site's leaf happens to spell, by (module, word), each with its reason.
SITE_LITERALS_ELSEWHERE = {
    ("minibert.analysis.transcoders.source", "hook_in"): "a transcoder's source field (TranscoderConfig.hook_in)",
    ("minibert.analysis.transcoders.source", "hook_out"): "a transcoder's source field (TranscoderConfig.hook_out)",
    ("minibert.analysis.transcoders.training", "hook_in"): "a transcoder's source field (TranscoderConfig.hook_in)",
    ("minibert.analysis.transcoders.training", "hook_out"): "a transcoder's source field (TranscoderConfig.hook_out)",
    ("minibert.analysis.sae.saelens", "hook_z"): "SAELens' value of reshape_activations in its cfg.json",
}
# Modules that may build a hook name from a "hook_" piece, each with its reason.
HOOK_PIECES_ELSEWHERE = {
    "minibert.core.hooks": "TransformerLens' get_act_name grammar: 'hook_' + its short name (checked by the table)",
}
HOOK_WORD = re.compile(r"(?<![A-Za-z0-9_])hook_[A-Za-z0-9_]+")  # "hook_z", alone or in "blocks.3.attn.hook_z"


def site_strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant of a module and every constant piece of its f-strings, leaving out
    documentation: a string standing alone as a statement (docstrings)."""
    import ast

    tree = ast.parse(source)
    prose = {id(node.value) for node in ast.walk(tree)
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose]


def declared_literals() -> list[str]:
    """The literal each site is declared by: its name ("attn.hook_pattern"), or for the layernorms' sites their
    three leaves ("hook_scale", "hook_normalized", "hook_out"), written once for every layernorm prefix."""
    from minibert.core import site_names, sites

    generated = {site_names.layernorm(prefix, leaf)
                 for prefix in site_names.LAYERNORMS for leaf in site_names.LAYERNORM_LEAVES}
    return sorted({*site_names.LAYERNORM_LEAVES, *(entry.name for entry in sites.SITES if entry.name not in generated)})


def test_each_site_name_is_written_once_as_a_literal():
    """Every site name of sites.SITES is one literal of the package, its constant in core/site_names.py, which the
    forward, the families' block orders and steps, the site table and every tool use: no other string (docstrings
    aside) holds a site's leaf as a word — in a hook name, a glob or an error message alike — but the other
    formats' words of SITE_LITERALS_ELSEWHERE, and no string ends in "hook_" to be completed into a name outside
    HOOK_PIECES_ELSEWHERE; site_names.py writes each declared name once. The check sees an f-string's pieces."""
    from test_layers import SOURCES, module_name

    declared = declared_literals()
    leaves = {name.rsplit(".", 1)[-1] for name in declared}
    home, elsewhere, pieces, excused = [], [], [], set()
    for path in SOURCES:
        module = module_name(path)
        for line, text in site_strings(path.read_text(encoding="utf-8")):
            where = f"{path.relative_to(ROOT)}:{line}: {text!r}"
            if text.endswith("hook_") and module not in HOOK_PIECES_ELSEWHERE:
                pieces.append(where)
            for word in set(HOOK_WORD.findall(text)) & leaves:
                if (module, word) in SITE_LITERALS_ELSEWHERE:
                    excused.add((module, word))
                else:
                    (home if module == "minibert.core.site_names" else elsewhere).append((where, text))
    assert not elsewhere, (f"{len(elsewhere)} strings name a site; build them from minibert.core.site_names' "
                           f"constants:\n" + "\n".join(where for where, _ in elsewhere))
    assert not pieces, "build these names from minibert.core.site_names' constants:\n" + "\n".join(pieces)
    assert sorted(text for _, text in home) == declared, [where for where, text in home if text not in declared]
    assert excused == set(SITE_LITERALS_ELSEWHERE), set(SITE_LITERALS_ELSEWHERE) - excused  # no stale excuse
    assert sorted(text for _, text in site_strings('"""hook_q"""\nx = f"{a}.hook_z" + "in hook_v."\n')) == [
        ".hook_z", "in hook_v."]

# ---- importing minibert changes nothing global -------------------------------------------------------------------

GLOBAL_STATE = """
import json, logging, warnings
import jax
def state():
    return {"jax": {name: repr(value) for name, value in sorted(jax.config.values.items())},
            "filters": repr(warnings.filters), "root": repr((logging.root.level, logging.root.handlers))}
before = state()
import minibert, minibert.analysis, minibert.viz, minibert.training, minibert.app.cli
after = state()
print(json.dumps({"jax": [name for name in before["jax"] if before["jax"][name] != after["jax"].get(name)],
                  "filters": before["filters"] == after["filters"], "root": before["root"] == after["root"]}))
"""


def test_importing_minibert_leaves_jax_warnings_and_logging_as_it_found_them():
    """In a fresh process (jax imported first), importing minibert and its tool packages changes no jax.config
    value (every one compared), no warnings filter and the root logger's level and handlers not at all. The
    persistent cache is set up when the first Model is built instead (tests/test_compiles.py)."""
    import json
    import os
    import subprocess
    import sys

    env = {name: value for name, value in os.environ.items() if not name.startswith("JAX_")}
    done = subprocess.run([sys.executable, "-c", GLOBAL_STATE], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["jax"] == [] and report["filters"] and report["root"]


# ---- the rings (docs/architecture.md): core imports nothing above it, no cycle, jit in the runtime, small files --

def _graph(typing_only: bool) -> dict[str, set[str]]:
    from test_layers import SOURCES, imported_modules, module_name

    return {module_name(path): imported_modules(path, typing_only=typing_only) - {module_name(path)}
            for path in SOURCES}


def test_the_core_imports_nothing_above_it_and_never_the_registry():
    """Every module of minibert/core imports only the core and errors — under `if TYPE_CHECKING:` too — so the
    forward can be read, and run, without a family module, io, the runtime or a tool being loaded."""
    graph = _graph(typing_only=True)
    core = {module for module in graph if module == "minibert.core" or module.startswith("minibert.core.")}
    assert {"minibert.core.encoder", "minibert.core.hooks", "minibert.core.sites", "minibert.core.config"} <= core
    above = {module: sorted(name for name in graph[module]
                            if not (name.startswith("minibert.core.") or name == "minibert.errors"))
             for module in core}
    assert not {module: names for module, names in above.items() if names}


def test_the_registry_is_imported_only_by_loading_and_the_hooks_page():
    """families/registry.py (which imports every family's forward code) is read by the config.json loader and by the
    page writer of docs/hooks.md, nobody else in the package: the site table, the hooks, the sources and the
    analyses are handed a Family (a Config's) instead."""
    graph = _graph(typing_only=True)
    readers = sorted(module for module, names in graph.items() if "minibert.families.registry" in names)
    assert readers == ["minibert.app.hooks_page", "minibert.io.config_json"]


def test_the_import_graph_has_no_cycle_with_type_only_imports_counted():
    """test_layers checks the imports that run; counted with those under `if TYPE_CHECKING:` the graph has no
    cycle either (config → family → keys → config was one)."""
    from test_layers import find_cycle

    cycle = find_cycle(_graph(typing_only=True))
    assert not cycle, f"minibert's modules import each other in a circle: {' → '.join(cycle)}"


# Modules outside runtime/ that call jax.jit, and why: each compiles a function of its own arrays — a probe's, an
# SAE's or a fine-tuning step's parameters, statistics of captured arrays — never a Model's forward, which only
# runtime/ compiles (Model.jit, through runtime/programs.py). Moving them into the runtime would make the runtime
# know every tool's training loop.
JIT_ELSEWHERE = {
    "minibert.analysis.clustering": "JS divergence of captured patterns",
    "minibert.analysis.compare": "similarity of two models' captured patterns",
    "minibert.analysis.diffing.diffs": "CKA and KL of two models' captured values",
    "minibert.analysis.diffing.latents": "a crosscoder's latent statistics over paired activations, chunked",
    "minibert.analysis.diffing.training": "a crosscoder's training step (its own parameters)",
    "minibert.analysis.heads": "head statistics of captured patterns",
    "minibert.analysis.mixing": "a mixing map of captured values, chunked",
    "minibert.analysis.norms": "norms of captured values",
    "minibert.analysis.probes.clark": "a probe's training and evaluation steps (its own parameters)",
    "minibert.analysis.probes.linear": "a linear probe's fit (its own parameters)",
    "minibert.analysis.probes.structural": "a structural probe's steps (its own parameters)",
    "minibert.analysis.sae.training": "an SAE's training step (its own parameters)",
    "minibert.analysis.transcoders.training": "a transcoder's training step (its own parameters)",
    "minibert.training.finetune": "the fine-tuning step and evaluation (donated optimiser state)",
    "minibert.training.guards": "the finiteness check of a step's loss and weights",
    "minibert.viz.features": "top activating windows of an SAE's or a transcoder's features",
}


def jit_calls(source: str) -> list[int]:
    """The lines of a module that call or apply jax.jit (jax.jit(f), @jax.jit, partial(jax.jit, ...))."""
    import ast

    from test_layers import _dotted

    return sorted({node.lineno for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.Attribute) and _dotted(node) == "jax.jit"})


def test_only_the_runtime_compiles_a_model_and_the_exceptions_are_stated():
    """jax.jit appears in runtime/ and in the modules of JIT_ELSEWHERE only, and each of those still uses it (the
    table is no stale list of excuses); the check itself sees the three spellings."""
    from test_layers import SOURCES, module_name

    calling = {module_name(path) for path in SOURCES if jit_calls(path.read_text(encoding="utf-8"))}
    outside = {module for module in calling if not module.startswith("minibert.runtime")}
    assert outside == set(JIT_ELSEWHERE), outside ^ set(JIT_ELSEWHERE)
    assert "minibert.runtime.programs" in calling
    assert jit_calls("import jax\n@jax.jit\ndef f(x):\n    return x\ng = jax.jit(f)\n"
                     "h = functools.partial(jax.jit, static_argnames='k')\n") == [2, 5, 6]


# Modules over MAX_LINES, and why they are not split.
LONG_MODULES = {
    "minibert.core.encoder": "the forward read top to bottom next to its equations, every hook site inline "
                             "(one sitting, as nanoGPT's model.py): splitting it would scatter one computation",
}
MAX_LINES = 600


def test_no_module_is_over_600_lines_without_a_stated_reason():
    from test_layers import SOURCES, module_name

    long = {module_name(path) for path in SOURCES if len(path.read_text(encoding="utf-8").splitlines()) > MAX_LINES}
    assert long <= set(LONG_MODULES), f"split these, or state why not in LONG_MODULES: {long - set(LONG_MODULES)}"


# ---- an analysis on the public sweep engine: a toy attention knockout ------------------------------------------

def _zero_key(pattern, ctx, layer, key):
    """pattern [B, H, T, S]: in block `layer`, no query attends to key `key` (its column zeroed, not renormalised)."""
    hit = (ctx.layer == layer) & (jnp.arange(pattern.shape[-1]) == key)
    return jnp.where(hit, 0.0, pattern).astype(pattern.dtype)


def _zero_column(pattern, ctx, key):
    """The loop's knockout, one block at a time: key `key`'s column of the pattern zeroed."""
    return jnp.where(jnp.arange(pattern.shape[-1]) == key, 0.0, pattern).astype(pattern.dtype)


def knock_out_key(layer, item, shared):
    """The toy knockout's patch setter, as analysis.sweep takes one: block `layer`, key position `item`."""
    return {"blocks.*.attn.hook_pattern": minibert.HookFn(_zero_key, layer=layer, key=item)}


def attention_knockout(model, batch, metric):
    """A toy analysis as docs/architecture.md says to write one on the sweep engine: the metric after knocking out
    the attention to each key position in each block → [L, T], one compiled suffix for the whole grid."""
    from minibert import analysis

    return analysis.sweep(model, batch, knock_out_key, model.inputs(batch).shape[1], metric)


@pytest.mark.slow  # four programs of a tiny model compiled, and ten forwards: past 10 s on a loaded 2-core machine
def test_a_user_patch_setter_runs_through_the_public_sweep_engine():
    """The toy knockout equals a Python loop of run_with_hooks calls, one per block and key position, each zeroing
    that key's column of that block's pattern with a hook of its own (atol: tolerances.forward_rtol of two fp32
    programs of the whole forward relative to the metric's scale, a cosine, ≤ 1 — the sweep reruns blocks from a
    captured residual stream, vmapped, the loop runs the whole forward); the grid compiles two programs (the
    residual-stream capture and the vmapped suffix) and a second call none; the sweep engine is the one
    ablation_sweep runs through."""
    from tolerances import forward_rtol

    from minibert.analysis import interventions, sweeps

    model = minibert.Model(Config(**TINY), seed=5)
    batch = {"input_ids": np.array([[2, 7, 9, 11, 3], [2, 8, 5, 3, 0]]),
             "attention_mask": np.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])}
    direction = np.linspace(-1.0, 1.0, TINY["hidden_size"]).astype(np.float32)
    direction /= np.linalg.norm(direction)

    def metric(out):
        first = out.last_hidden_state[:, 0]
        return first @ direction / jnp.linalg.norm(first, axis=-1)

    before = model.programs.traces
    grid = attention_knockout(model, batch, metric)
    assert model.programs.traces - before == 2
    assert np.array_equal(attention_knockout(model, batch, metric), grid) and model.programs.traces - before == 2
    L, T = TINY["num_hidden_layers"], batch["input_ids"].shape[1]
    expected = np.zeros((L, T))
    for layer in range(L):
        for key in range(T):  # the key a traced array: one program per block, not per key
            hook = minibert.HookFn(_zero_column, key=np.int32(key))
            out = model.run_with_hooks(batch, {f"blocks.{layer}.attn.hook_pattern": hook})
            expected[layer, key] = float(np.mean(np.asarray(metric(out))))
    atol = forward_rtol(model.config, S=T)
    np.testing.assert_allclose(grid, expected, atol=atol)
    assert np.ptp(expected) > 10 * atol  # the knockouts matter: the comparison is not of constants
    assert interventions.sweep_streams is sweeps.sweep_streams


def toy_writer(text: str, path, *, overwrite: bool = False):
    """A toy file writer as docs/architecture.md says to write one: io.files.output_path, then write_output."""
    from minibert.errors import InputError
    from minibert.io.files import output_path, write_output

    path = output_path(path, (".txt",), InputError, overwrite=overwrite)
    return write_output(path, lambda p: p.write_text(text), InputError)


def test_a_file_writer_follows_the_one_rule(tmp_path, monkeypatch):
    from minibert.errors import InputError

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert toy_writer("a", "~/new/folder/a.TXT").read_text() == "a"  # ~ expanded, folders created, any case
    (tmp_path / "kept.txt").write_text("kept")
    (tmp_path / "link.txt").symlink_to(tmp_path / "kept.txt")
    (tmp_path / "dangling.txt").symlink_to(tmp_path / "nowhere.txt")
    (tmp_path / "dir.txt").mkdir()
    for path, message in [(7, "path must be a str or pathlib.Path"), ("  ", "the path is empty"),
                          (tmp_path / "a.csv", r"must end in \.txt"), (tmp_path / "kept.txt", "already exists"),
                          (tmp_path / "link.txt", "is a symbolic link"), (tmp_path / "dangling.txt", "symbolic link"),
                          (tmp_path / "dir.txt", "is a folder")]:
        with pytest.raises(InputError, match=message):
            toy_writer("b", path)
    with pytest.raises(InputError, match="is a folder"):
        toy_writer("b", tmp_path / "dir.txt", overwrite=True)
    toy_writer("b", tmp_path / "dangling.txt", overwrite=True)
    toy_writer("b", tmp_path / "link.txt", overwrite=True)
    assert not (tmp_path / "nowhere.txt").exists() and (tmp_path / "kept.txt").read_text() == "kept"
    assert (tmp_path / "link.txt").read_text() == "b" and not (tmp_path / "link.txt").is_symlink()


# ---- a family's parameter layout is declared once (Family.weight_roles); tools read weights by role --------------

# Settings under which a family's blocks hold parameters its defaults leave out (the defaults, and each boolean
# setting flipped, are tried as well): DeBERTa's own position projections W_pos_K, W_pos_Q.
FULLEST = {"deberta-v2": (("pos_att_type", "c2p|p2c"),)}
THE_MODEL_RINGS = ("core", "families", "io", "runtime")  # the modules that may know a family's parameter names


def _block_parameter_names(family) -> set[str]:
    """The names inside a block ("attn.W_QKV") of every parameter the family's blocks may hold: built by shape
    under its defaults, each of its boolean settings flipped, and FULLEST's settings."""
    from minibert.families.registry import config_for
    from minibert.runtime.weights import parameter_shapes

    tries = [(), FULLEST.get(family.model_type, ()),
             *(((key, not value),) for key, value in family.settings if isinstance(value, bool))]
    names = set()
    for settings in tries:
        shapes = parameter_shapes(config_for(f"{family.prefix}ForMaskedLM", **TINY, settings=settings))
        names |= {name.split(".", 2)[2] for name in shapes if name.startswith("blocks.")}
    return names


def layout_readers(source: str, names) -> list[str]:
    """The lines of `source` that name one of a family's own parameters (`names`, "W_QKV") or read a block weight by
    its parameter name (layer_weights, block_params) rather than by role (model.weights)."""
    pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(names))) + r")\b|\blayer_weights\(|"
                         r"\bblock_params\(")
    return [line.strip() for line in source.splitlines() if pattern.search(line)]


def test_no_tool_knows_a_familys_parameter_names():
    """Outside core/, families/, io/ and runtime/ no module names a parameter only some family's blocks hold
    (ModernBERT's fused attn.W_QKV, DeBERTa's W_pos_K …, found by building every registered family, not listed
    here) nor reads a block weight by parameter name: tools ask model.weights for a role (q, w_gate, …), which the
    family's record declares. The check itself sees each kind of reader."""
    from test_layers import SOURCES, module_name

    from minibert.families.registry import FAMILIES

    bert = _block_parameter_names(FAMILIES["bert"])
    own = {name.rsplit(".", 1)[1] for family in FAMILIES.values() for name in _block_parameter_names(family) - bert}
    assert {"W_QKV", "b_QKV", "W_pos_K", "W_pos_Q"} <= own
    tools = [path for path in SOURCES
             if module_name(path).removeprefix("minibert.").split(".")[0] not in THE_MODEL_RINGS]
    assert any(module_name(path) == "minibert.viz.steps" for path in tools)
    found = {module_name(path): lines for path in tools
             if (lines := layout_readers(path.read_text(encoding="utf-8"), own))}
    assert not found, f"read these weights by role (model.weights.q, .w_gate, …): {found}"
    assert len(layout_readers("w = weights['blocks.0.attn.W_QKV'][0]\nb = p['attn.b_pos_K']\n"
                              "model.layer_weights('attn.W_O')\nmodel.block_params(0)\nmodel.weights.q\n"
                              "model.W_pos\n", own)) == 4


def _role_by_hand(named: dict, block: int, role: str):
    """Block `block`'s weight of `role`, cut from named_parameters as each family's block code lays it out: BERT's
    one array per role, ModernBERT's q, k, v along W_QKV's first axis and its GeGLU's W_in [D, 2, F] with the
    activated half (mlp.hook_pre) first. None where the block has no such parameter."""
    def at(name):
        return named.get(f"blocks.{block}.{name}")

    fused = {"q": ("attn.W_QKV", 0), "k": ("attn.W_QKV", 1), "v": ("attn.W_QKV", 2), "b_q": ("attn.b_QKV", 0),
             "b_k": ("attn.b_QKV", 1), "b_v": ("attn.b_QKV", 2)}
    plain = {"q": "attn.W_Q", "k": "attn.W_K", "v": "attn.W_V", "b_q": "attn.b_Q", "b_k": "attn.b_K",
             "b_v": "attn.b_V", "o": "attn.W_O", "b_o": "attn.b_O", "w_in": "mlp.W_in", "b_in": "mlp.b_in",
             "w_out": "mlp.W_out", "b_out": "mlp.b_out", "ln1_scale": "ln1.scale", "ln1_bias": "ln1.bias",
             "ln2_scale": "ln2.scale", "ln2_bias": "ln2.bias"}
    if at("attn.W_QKV") is not None and role in fused:
        name, index = fused[role]
        return None if at(name) is None else np.asarray(at(name))[index]
    w_in, b_in = at("mlp.W_in"), at("mlp.b_in")
    if np.ndim(w_in) == 3:  # GeGLU: [D, 2, F], [2, F]
        halves = {"w_gate": (w_in, 0), "w_in": (w_in, 1), "b_gate": (b_in, 0), "b_in": (b_in, 1)}
        if role in halves:
            value, half = halves[role]
            return None if value is None else np.take(np.asarray(value), half, axis=np.ndim(value) - 2)
    if role in ("w_gate", "b_gate"):
        return None
    return None if at(plain[role]) is None else np.asarray(at(plain[role]))


def _tiny_of_every_family():
    from minibert.families.registry import FAMILIES

    return [pytest.param(family, id=family.model_type) for family in FAMILIES.values()]


@pytest.mark.parametrize("family", _tiny_of_every_family())
def test_model_weights_are_the_parameter_tree_by_role(family):
    """model.weights gives, role by role and layer by layer, the very arrays of the parameter tree (cut by hand
    here, fused ModernBERT's too, with every bias its settings allow): equal exactly, a slice being no computation;
    None where the blocks have none (a dense MLP's gate, ModernBERT's ln1 that block 0 lacks). TransformerLens'
    views read by role and stay what they were: W_Q is q with heads first, W_in the stored input weights (a
    GeGLU's [L, D, 2, F])."""
    from minibert.core.family import ROLES
    from minibert.families.registry import config_for
    from minibert.runtime.weights import parameter_shapes

    settings = tuple((key, True) for key, value in family.settings if isinstance(value, bool) and "bias" in key)
    config = config_for(f"{family.prefix}ForMaskedLM", **TINY, settings=settings)
    rng = np.random.default_rng(1)  # from the host: a random init would compile an initialiser per shape
    model = minibert.Model.from_parameters(config, {name: rng.standard_normal(shape.shape, np.float32)
                                                    for name, shape in parameter_shapes(config).items()})
    named, weights, L = model.named_parameters(), model.weights, TINY["num_hidden_layers"]
    blocks = [0 if family.shared_layers else layer for layer in range(L)]
    for role in ROLES:
        by_hand = [_role_by_hand(named, block, role) for block in blocks]
        stacked = getattr(weights, role)  # weights.read(role)
        if any(value is None for value in by_hand):
            assert stacked is None, role
            continue
        np.testing.assert_array_equal(stacked, np.stack(by_hand), err_msg=role)
        for layer in range(L):
            np.testing.assert_array_equal(weights.layer(layer).read(role), by_hand[layer], err_msg=role)
    np.testing.assert_array_equal(model.W_Q, np.stack([_role_by_hand(named, b, "q") for b in blocks]).transpose(
        0, 2, 1, 3))
    np.testing.assert_array_equal(model.W_in, np.stack([np.asarray(named[f"blocks.{b}.mlp.W_in"]) for b in blocks]))
    np.testing.assert_array_equal(model.b_in, np.stack([np.asarray(named[f"blocks.{b}.mlp.b_in"]) for b in blocks]))
    assert (weights.w_gate is None) == (family.mlp == "dense")
    # the step-through's names of the MLP's weights, written as the stored parameter is indexed
    assert weights.written("w_in", ":", "j") == ("W_in[:, 1, j]" if family.mlp == "glu" else "W_in[:, j]")
    with pytest.raises(minibert.InputError, match="'gate' is not a role.*w_gate"):
        weights.read("gate")
    with pytest.raises(minibert.InputError, match=f"layer {L} is not one of the model's {L} layers"):
        weights.layer(L)


def test_a_fused_familys_roles_are_what_its_forward_multiplies():
    """ModernBERT's declared roles are its forward's: at layer 1 (block 0 has no ln1), hook_q = ln1(x)·q + b_q and
    the GeGLU's hook_pre = ln2(r)·w_gate + b_gate, hook_pre_linear = ln2(r)·w_in + b_in, each within the float32
    rounding of its D-term dot product and bias add: (D + 1)·2⁻²⁴·(|x|·|w| + |b|)."""
    from minibert.families.registry import config_for
    from minibert.runtime.weights import parameter_shapes

    settings = (("attention_bias", True), ("mlp_bias", True), ("norm_bias", True))
    config = config_for("ModernBertForMaskedLM", **TINY, settings=settings)
    rng = np.random.default_rng(2)  # weights from the host, as in the test above
    model = minibert.Model.from_parameters(config, {name: rng.standard_normal(shape.shape, np.float32)
                                                    for name, shape in parameter_shapes(config).items()})
    sites = ("ln1.hook_out", "attn.hook_q", "ln2.hook_out", "mlp.hook_pre", "mlp.hook_pre_linear")
    _, cache = model.run_with_cache({"input_ids": np.array([[2, 7, 9, 3]])}, names=[f"blocks.1.{s}" for s in sites])
    captured = {site: np.asarray(cache[f"blocks.1.{site}"], np.float64) for site in sites}
    weights, D = model.weights.layer(1), TINY["hidden_size"]
    for x, w, b, out, spec in (("ln1.hook_out", "q", "b_q", "attn.hook_q", "BTD,DHK->BTHK"),
                               ("ln2.hook_out", "w_gate", "b_gate", "mlp.hook_pre", "BTD,DF->BTF"),
                               ("ln2.hook_out", "w_in", "b_in", "mlp.hook_pre_linear", "BTD,DF->BTF")):
        weight, bias = (np.asarray(weights.read(role), np.float64) for role in (w, b))
        expected = np.einsum(spec, captured[x], weight) + bias
        bound = (D + 1) * 2.0**-24 * (np.einsum(spec, np.abs(captured[x]), np.abs(weight)) + np.abs(bias))
        assert np.all(np.abs(captured[out] - expected) <= bound), out

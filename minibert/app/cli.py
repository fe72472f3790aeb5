"""The `minibert` command: demo, view, stats, hooks, convert.

    minibert demo                          # figures, views and head statistics, into out/
    minibert view "The cat sat." --pair "It slept." --layer 2 --head 5
    minibert stats corpus.txt              # Clark et al. head statistics over a corpus
    minibert hooks                         # the table of hook points
    minibert convert path/pytorch_model.bin

Options take layers and heads 0-indexed, as the Python API does; figures, pages and summaries label
them "L-H", 1-indexed as in Clark et al. (layer 2, head 5 is "3-6"). Mistakes in the input (a missing
file, an index out of range, an unknown checkpoint) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minibert.errors import InputError, MinibertError

USER_ERROR = 2  # argparse's status for a bad command line; ours for bad input the command line names
EPILOG = ("Layers and heads are 0-indexed in options; figures and pages label them L-H, 1-indexed "
          "(layer 2, head 5 is 3-6).")


def _load(name: str | None):
    import minibert

    return minibert.load(name)


def _demo(args) -> int:
    from minibert.app import demo
    from minibert.viz import report

    paths, result = demo.build(_load(args.model), args.out)
    for path in paths:
        print(path)
    print(report.head_summary(result.mean, result.documents))
    print(f"open {args.out / 'index.html'} in a browser to see them all")
    return 0


VIEW_FILES = {"all": "view.html", "head": "head_view.html", "model": "model_view.html", "neuron": "neuron_view.html"}
MAX_TITLE_CHARS = 80


def _checked_index(option: str, value: int | None, count: int, what: str) -> int | None:
    if value is not None and not 0 <= value < count:
        raise InputError(f"{option} {value} is out of range: the model has {count} {what}, numbered 0 to {count - 1}.")
    return value


def _view(args) -> int:
    from minibert import viz
    from minibert.viz import report

    model = _load(args.model)
    cfg = model.config
    layer = _checked_index("--layer", args.layer, cfg.num_hidden_layers, "layers") or 0
    head = _checked_index("--head", args.head, cfg.num_attention_heads, "heads")
    doc = viz.document(model, args.text, args.pair, max_length=args.max_length)
    query = _checked_index("--query", args.query, len(doc.tokens), "tokens here")
    query = min(1, len(doc.tokens) - 1) if query is None else query
    quoted = repr(args.text if len(args.text) <= MAX_TITLE_CHARS else args.text[:MAX_TITLE_CHARS - 1] + "…")
    make = {
        "head": lambda: doc.head_view(layer=layer, heads=None if head is None else [head],
                                      title=f"Head view: {quoted}"),
        "model": lambda: doc.model_view(title=f"Model view: {quoted}"),
        "neuron": lambda: doc.neuron_view(layer=layer, head=head or 0, query_index=query,
                                          title=f"Neuron view: {quoted}"),
    }
    out = args.out or Path(VIEW_FILES[args.kind])
    kinds = list(make) if args.kind == "all" else [args.kind]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report.views_page(f"minibert: {quoted}", [make[kind]() for kind in kinds]), encoding="utf-8")
    print(out)
    return 0


def _stats(args) -> int:
    from minibert.analysis import corpus
    from minibert.viz import report

    texts, pairs = corpus.read_corpus(args.file, pairs=args.pairs)
    batching = {} if args.batch_size is None else {"batch_size": args.batch_size}
    result = corpus.survey(_load(args.model), texts, pairs, max_length=args.max_length, progress=True, **batching)
    prefix = args.out or Path(f"{args.file.stem}_heads")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    npz, json_path = result.save(prefix)
    for path in (npz, json_path, report.write_table(result.table(), json_path.with_suffix(".csv"))):
        print(path)
    print(report.head_summary(result.mean, result.documents))
    return 0


def _hooks(args) -> int:
    import minibert
    from minibert.hooks import hook_table

    if args.model is None:
        names, n_layers = all_hook_names(), "L"
    else:
        model = minibert.load(args.model)
        names, n_layers = model.hook_names, model.config.num_hidden_layers
    text = hook_table(names, n_layers)
    if args.output:
        Path(args.output).write_text(_HOOKS_HEADER + text)
        print(f"wrote {args.output}")
    else:
        print(text, end="")
    return 0


def all_hook_names() -> list[str]:
    """The hook points of every architecture minibert loads, in forward order (heads last)."""
    from minibert import BertConfig, Model
    from minibert.config import ARCHITECTURES

    names: dict[str, None] = {}
    for architecture in ARCHITECTURES:
        cfg = BertConfig(vocab_size=8, hidden_size=4, num_hidden_layers=1, num_attention_heads=1,
                         intermediate_size=4, max_position_embeddings=4, architecture=architecture)
        names |= dict.fromkeys(Model(cfg).hook_names)
    return list(names)


_HOOKS_HEADER = """# Hook points

Generated from the code by `minibert hooks --output docs/hooks.md`: every hook point of every
architecture minibert loads. `pooler.*` exists on BertModel, BertForPreTraining and
BertForSequenceClassification; `mlm.*` on BertForMaskedLM and BertForPreTraining; `nsp.*` on
BertForPreTraining; `classifier.*` on the two classifiers. `model.hook_names` lists one model's.
Axis letters: B batch, T query positions, S key positions, H heads, K head dim, D model dim,
F ffn dim, V vocabulary, C classes.

"""


def _convert(args) -> int:
    from minibert.checkpoint import convert_bin_to_safetensors

    out = convert_bin_to_safetensors(args.bin, args.output)
    print(f"wrote {out} (read {args.bin} with torch.load(weights_only=True))")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minibert", description="A transparent BERT encoder: attention views, head statistics, hooks.",
        epilog="Run `minibert COMMAND --help` for a command's options. " + EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run, help: str, description: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=description, epilog=EPILOG)
        p.set_defaults(run=run)
        return p

    def model_option(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", metavar="NAME", default=None,
                       help="checkpoint: a directory, a weights/ name or a cached Hugging Face id "
                            "(default: the bundled all-MiniLM-L6-v2)")

    demo = command("demo", _demo, "write example figures, views and head statistics into a folder",
                   "Run the demo on the bundled sentences: PCA of three groups of similar short sentences, "
                   "attention paid to a chosen word by layer, one head's heatmap, a layers × heads grid, the neuron figure, Clark "
                   "et al.'s head statistics and an MDS map of the heads (PNG and SVG); head, model and neuron "
                   "views of an MRPC sentence pair (HTML, offline); the statistics of every head (CSV, JSON, NPZ); "
                   "and index.html linking them all. Prints each path and a summary of the top heads.")
    demo.add_argument("--out", type=Path, default=Path("out"), metavar="DIR", help="output folder (default: out/)")
    model_option(demo)

    view = command("view", _view, "write interactive attention views of a text (HTML)",
                   "Run the model on TEXT (and --pair, as sentence B) and write a standalone HTML page that loads "
                   "nothing from the network: the head view (lines between tokens), the model view (every head) "
                   "and the neuron view (q, k, q×k, q·k, softmax), or one of them. Prints the path.")
    view.add_argument("text", metavar="TEXT", help="the text, sentence A of a pair")
    view.add_argument("--pair", metavar="TEXT", help="sentence B (token type 1)")
    view.add_argument("--kind", choices=list(VIEW_FILES), default="all",
                      help="which view; all puts the three on one page (default: all)")
    view.add_argument("--layer", type=int, metavar="L", help="layer shown first, 0-indexed (default 0)")
    view.add_argument("--head", type=int, metavar="H",
                      help="head shown first, 0-indexed: the only head switched on in the head view, the neuron "
                           "view's head (default: all heads on; neuron view head 0)")
    view.add_argument("--query", type=int, metavar="I", help="the neuron view's query token position, 0-indexed "
                                                             "with [CLS] at 0 (default 1, the first word)")
    view.add_argument("--out", type=Path, metavar="FILE", help="the page to write (default: view.html, or "
                                                               "head_view.html, model_view.html, neuron_view.html)")
    view.add_argument("--max-length", type=int, metavar="N", help="truncate to N tokens (default: no limit)")
    model_option(view)

    stats = command("stats", _stats, "survey every head over a corpus (Clark et al. statistics)",
                    "Compute Clark et al.'s head statistics (attention to [CLS], [SEP], '.' and ',', to the "
                    "previous, next and same token, entropy) for every head, averaged over the documents of FILE, "
                    "with a progress bar on stderr. Writes PREFIX.npz (arrays [L, H]), PREFIX.json and PREFIX.csv "
                    "(one row per head) and prints the top heads of each statistic.")
    stats.add_argument("file", type=Path, metavar="FILE",
                       help="one text per line (.txt), A<TAB>B pairs (.tsv) or JSON lines with text or text_a/text_b")
    stats.add_argument("--pairs", action="store_true", help="read each line of a .txt as A<TAB>B (automatic for .tsv)")
    stats.add_argument("--out", type=Path, metavar="PREFIX",
                       help="output prefix (default: FILE's name without suffix plus _heads, in this folder)")
    stats.add_argument("--batch-size", type=int, metavar="N",
                       help="rows per batch; short documents share a row (default: a token budget,"
                            " fewer rows for longer documents)")
    stats.add_argument("--max-length", type=int, default=128, metavar="N",
                       help="truncate documents to N tokens (default 128)")
    model_option(stats)

    hooks = command("hooks", _hooks, "print the table of hook points (name, axes, equation)",
                    "Print every hook point with its axes and equation, as Markdown (docs/hooks.md is this output).")
    hooks.add_argument("--model", metavar="NAME", default=None,
                       help="list one checkpoint's hooks (default: every architecture's)")
    hooks.add_argument("--output", metavar="FILE", help="write Markdown to this file instead of printing")

    convert = command("convert", _convert, "convert a trusted pytorch_model.bin to model.safetensors",
                      "Read a pytorch_model.bin (a pickle: only for files you trust) and write its tensors as "
                      "model.safetensors, which minibert.load reads without unpickling.")
    convert.add_argument("bin", type=Path, metavar="BIN",
                         help="path to pytorch_model.bin (unpickled once: only for files you trust)")
    convert.add_argument("--output", type=Path, metavar="FILE",
                         help="output file (default: model.safetensors beside the .bin)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except MinibertError as error:  # bad input, named by the library; anything else is a bug: keep its traceback
        message = " ".join(str(error).split())
        print(f"minibert {args.command}: error: {message}", file=sys.stderr)
        return USER_ERROR


if __name__ == "__main__":
    sys.exit(main())

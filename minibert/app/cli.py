"""The `minibert` command: demo, view, stats, hooks, serve, convert.

    minibert demo                          # figures, views and head statistics, into out/
    minibert view "The cat sat." --pair "It slept." --layer 2 --head 5
    minibert stats corpus.txt              # Clark et al. head statistics over a corpus
    minibert hooks                         # the table of hook points
    minibert serve                         # the live workbench in a browser (docs/serve.md)
    minibert convert path/pytorch_model.bin
    minibert tutorial 06                   # writes 06_context_mixing.ipynb (no name: the list)

Options take layers and heads 0-indexed, as the Python API does; figures, pages and summaries label
them "L-H", 1-indexed as in Clark et al. (layer 2, head 5 is "3-6"). Mistakes in the input (a missing
file, an index out of range, an unknown checkpoint, an output that would overwrite the input) print one
line and exit with status 2, before any long work where they can be found first; minibert's warnings print as
one line too; Ctrl-C prints one line and exits with 130. `--download` fetches a --model from the Hugging Face
Hub; `minibert --version`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from minibert import __version__
from minibert.errors import DataFileError, DistributedError, InputError, MinibertError, TokenizerError, refuse_existing
from minibert.io.files import output_path, write_output

USER_ERROR = 2  # argparse's status for a bad command line; ours for bad input the command line names
INTERRUPTED = 130  # the shell's status for a command stopped by Ctrl-C (128 + SIGINT)
EPILOG = ("Layers and heads are 0-indexed in options; figures and pages label them L-H, 1-indexed "
          "(layer 2, head 5 is 3-6).")


def _load(name: str | None, download: bool = False):
    import minibert

    return minibert.load(name, download=download)


def _steps(command: str) -> Callable[[str], None]:
    """Report each step of a long command on stderr as it starts, with the seconds since the command began."""
    start = time.perf_counter()

    def step(what: str) -> None:
        print(f"minibert {command}: [{time.perf_counter() - start:5.1f} s] {what}", file=sys.stderr, flush=True)

    return step


def _checked_outputs(outputs: list[Path], inputs: Sequence[Path] = (), *, overwrite: bool = True) -> None:
    """Refuse, before any work, outputs that would overwrite an input or that cannot be written, and (overwrite
    False) outputs that exist."""
    for output in outputs:
        clash = next((source for source in inputs if output.resolve() == source.resolve()), None)
        if clash is not None:
            raise DataFileError(f"the output {output} is the input file {clash}; writing it would destroy the "
                                f"input. Choose another --out.")
        if output.is_dir():
            raise DataFileError(f"the output {output} is a folder; choose a file name with --out.")
    for folder in dict.fromkeys(output.parent for output in outputs):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):  # a real write: permissions, read-only disks, quotas
                pass
        except OSError as error:
            raise DataFileError(f"cannot write into {folder} ({error.strerror or error}); choose another --out "
                                f"or fix the folder's permissions.") from None
    refuse_existing(outputs, overwrite, DataFileError, replace_hint="pass --overwrite to replace it",
                    elsewhere="another --out")
    unwritable = [output for output in outputs if output.exists() and not os.access(output, os.W_OK)]
    if unwritable:
        raise DataFileError(f"{unwritable[0]} exists and cannot be overwritten; choose another --out.")


def _demo(args) -> int:
    from minibert.app import demo
    from minibert.viz import report

    step = _steps("demo")
    step("loading the model")
    model = _load(args.model, args.download)
    paths, result = demo.build(model, args.out, step=step, overwrite=args.overwrite)
    step("done")
    for path in paths:
        print(path)
    print(report.head_summary(result.mean, result.documents, model.tokenizer))
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
    from minibert.viz._html import PAGE_SUFFIXES

    out = output_path(VIEW_FILES[args.kind] if args.out is None else args.out, PAGE_SUFFIXES, DataFileError,
                      overwrite=args.overwrite, replace_hint="pass --overwrite to replace it", what="--out path")
    _checked_outputs([out])
    model = _load(args.model, args.download)
    cfg = model.config
    layer = _checked_index("--layer", args.layer, cfg.num_hidden_layers, "layers") or 0
    head = _checked_index("--head", args.head, cfg.num_attention_heads, "heads")
    try:
        doc = viz.document(model, args.text, args.pair, max_length=args.max_length)
    except TokenizerError as error:  # the library's advice in the command's words
        raise TokenizerError(str(error).replace("pass max_length=", "pass --max-length ")) from None
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
    kinds = list(make) if args.kind == "all" else [args.kind]
    page = report.views_page(f"minibert: {quoted}", [make[kind]() for kind in kinds])
    write_output(out, lambda path: path.write_text(page, encoding="utf-8"), DataFileError)
    print(out)
    return 0


def _stats(args) -> int:
    import jax

    from minibert.analysis import corpus
    from minibert.viz import report

    prefix = args.out or Path(f"{args.file.stem}_heads")
    npz, json_path = corpus.output_paths(prefix)
    outputs = [npz, json_path, json_path.with_suffix(".csv")]
    _checked_outputs(outputs, [args.file], overwrite=args.overwrite)  # before hours of survey
    if args.distributed:  # before anything touches JAX; each process then reads its share of FILE
        from minibert.app.distributed import initialize

        initialize(args.coordinator, args.num_processes, args.process_id, heartbeat_timeout=args.heartbeat_timeout)
    batching = {} if args.batch_size is None else {"batch_size": args.batch_size}
    model = _load(args.model, args.download)
    result = corpus.survey(model, args.file, args.pairs, max_length=args.max_length, progress=True,
                           resume=args.resume, every=args.every, timeout=args.timeout, strict=args.strict, **batching)
    if jax.process_index() != 0:
        return 0  # every process holds the whole result; process 0 writes and prints it
    _report_skipped(result.counts, args.max_length)
    npz, json_path = result.save(prefix, broad=args.broad, overwrite=args.overwrite)
    table = report.write_table(result.table(args.broad), outputs[2], overwrite=args.overwrite)
    for path in (npz, json_path, table):
        print(path)
    print(report.head_summary(result.mean, result.documents, model.tokenizer, broad=args.broad))
    return 0


def _report_skipped(counts: dict, max_length: int) -> None:
    """Say on stderr what the survey left out or cut (--strict refuses these instead)."""
    blank, truncated = counts.get("blank_lines", 0), counts.get("truncated", 0)
    if blank or truncated:
        print(f"minibert stats: skipped {blank} blank line(s); truncated {truncated} document(s) to "
              f"--max-length {max_length} tokens (--strict refuses both)", file=sys.stderr)


def _hooks(args) -> int:
    from minibert.app import hooks_page
    from minibert.core import sites

    if args.output:
        _checked_outputs([Path(args.output)])
    if args.model is None:  # every architecture's sites; --output writes docs/hooks.md's whole page
        text = hooks_page.hooks_page() if args.output else hooks_page.hook_table(sites.all_hook_names(), "L")
    else:
        model = _load(args.model, args.download)
        text = hooks_page.hook_table(model.hook_names, model.config.num_hidden_layers)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        print(text, end="")
    return 0


def _panel_resources(args, models, step) -> dict:
    """What the main model's panels read (viz/panels.py): --transcoder's transcoders, each checked against it, and
    --crosscoder's crosscoder, checked against it and --compare's model."""
    from minibert.viz import changed, feature_panel

    resources = {}
    if args.transcoder:
        step(f"loading {len(args.transcoder)} transcoder{'s' if len(args.transcoder) > 1 else ''}")
        resources["transcoders"] = feature_panel.load_transcoders(models[0], args.transcoder)
    if args.crosscoder:
        step("loading the crosscoder")
        resources["crosscoder"] = changed.load_crosscoder(models[0], models[1] if len(models) > 1 else None,
                                                          args.crosscoder)
    return resources


def _serve(args) -> int:
    try:  # starlette and uvicorn are the serve extra; minibert.app.serve imports them only when serving
        for extra in ("starlette", "uvicorn"):
            importlib.import_module(extra)
        from minibert.app import serve
    except ImportError as error:
        raise InputError(f"minibert serve needs {error.name}: pip install 'minibert[serve]'.") from None
    from minibert.viz.workbench import Workbench

    if args.host in serve.ALL_ADDRESSES:
        print(f"minibert serve: warning: listening on every address ({args.host}), but the Host check accepts only "
              f"local names and the --host given, so another machine's requests are refused: to serve a network, "
              f"pass the address they will use (--host 192.168.x.y); the URL printed is this machine's own.",
              file=sys.stderr)
    elif args.host not in serve.LOCAL_HOSTS:
        print(f"minibert serve: warning: listening on {args.host}: anyone who can reach it and has the URL's token "
              f"can use the workbench.", file=sys.stderr)
    serve.checked_port(args.port)  # before the loading, which takes a while
    if args.max_tokens is not None and args.max_tokens < 3:
        raise InputError(f"--max-tokens {args.max_tokens}: pass at least 3 ([CLS], a word, [SEP]) and at most the "
                         f"model's positions.")
    step = _steps("serve")
    names = [args.model] + ([args.compare] if args.compare else [])
    models = []
    for name in names:
        step(f"loading {name or 'the bundled model'}")
        model = _load(name, args.download)
        positions = model.config.max_tokens
        if args.max_tokens is not None and args.max_tokens > positions:  # the workbench would cut it, silently
            raise InputError(f"--max-tokens {args.max_tokens}: the model has {positions} positions; pass at most "
                             f"{positions}.")
        models.append(model)
    resources = _panel_resources(args, models, step)
    workbenches = [Workbench(model, resources=resources if n == 0 else None,
                             **({} if args.max_tokens is None else {"max_tokens": args.max_tokens}))
                   for n, model in enumerate(models)]
    serve.serve(workbenches, host=args.host, port=args.port, open_browser=not args.no_browser, tour=args.tour,
                step=step)
    return 0


def _convert(args) -> int:
    from minibert.io.checkpoint import convert_bin_to_safetensors

    out = convert_bin_to_safetensors(args.bin, args.output)
    print(f"wrote {out} (read {args.bin} with torch.load(weights_only=True))")
    return 0


def _warmup(text: str) -> float | int:
    """--warmup: a whole number is a count of updates, anything else a fraction (training.optim.warmup_steps)."""
    return int(text) if text.isdigit() else float(text)


def _checked_run_folder(out: Path, resume: bool) -> None:
    """--out: a new or empty folder, or (with --resume) one holding a run; never a file or a folder of the user's
    files, which the run's model/ and history.json would overwrite."""
    existing = next(folder for folder in (out, *out.parents) if folder.exists())  # out, or the folder it goes in
    if not existing.is_dir():
        raise DataFileError(f"{existing} is a file; --out names a folder for the run (model/, history.json, "
                            f"checkpoints/).")
    if not os.access(existing, os.W_OK):
        raise DataFileError(f"cannot write in {existing}; pass an --out you can write.")
    if not out.exists() or not any(out.iterdir()):
        if resume:  # a typo in DIR would otherwise restart a long run unseen
            print(f"minibert finetune: no run saved in {out}: starting a new one", file=sys.stderr)
        return
    if not resume:
        raise DataFileError(f"{out} is not empty; pass --resume to continue the run saved there, or another --out.")
    if not (out / "checkpoints").is_dir():
        raise DataFileError(f"{out} holds no run to resume (no checkpoints folder), and the run would write over its "
                            f"files; pass another --out.")


def _checked_counts(args) -> None:
    """--epochs, --batch-size and --accumulate: at least 1, refused by the option's name (finetune's own message
    names its Python keywords)."""
    for option in ("--epochs", "--batch-size", "--accumulate"):
        value = getattr(args, option[2:].replace("-", "_"))
        if value < 1:
            raise InputError(f"{option} {value}: pass a whole number, at least 1.")


def _finetune(args) -> int:
    import dataclasses
    import json

    from minibert import training

    _checked_run_folder(args.out, args.resume)
    _checked_counts(args)
    model = _load(args.model, args.download)
    # the files' paths, not their examples: finetune's messages then name the file a bad row is in
    result = training.finetune(model, args.data, task=args.task, num_labels=args.num_labels, epochs=args.epochs,
                               batch_size=args.batch_size, learning_rate=args.learning_rate,
                               weight_decay=args.weight_decay, warmup=args.warmup, schedule=args.schedule,
                               max_grad_norm=args.max_grad_norm, dropout=args.dropout, shuffle=not args.no_shuffle,
                               accumulate=args.accumulate, compute_dtype="bfloat16" if args.bf16 else "float32",
                               seed=args.seed, eval_data=args.eval, resume=args.out / "checkpoints",
                               trainable=args.trainable)
    result.model.save(args.out / "model", overwrite=args.resume)  # --out was checked: a new folder or a run
    (args.out / "history.json").write_text(json.dumps(dataclasses.asdict(result.history), indent=1) + "\n")
    print(f"wrote {args.out / 'model'} (a Hugging Face directory) and {args.out / 'history.json'}; "
          f"final loss {result.history.loss[-1]:.4f}")
    return 0


def _tutorial(args) -> int:
    from minibert.app import tutorials

    if args.name is None:
        for name, path in tutorials.available().items():
            print(f"{name}  ({path.read_text(encoding='utf-8').split('# # ', 1)[-1].splitlines()[0]})")
        return 0
    print(f"wrote {tutorials.write_notebook(args.name, args.output)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minibert", description="A transparent BERT encoder: attention views, head statistics, hooks.",
        epilog="Run `minibert COMMAND --help` for a command's options. " + EPILOG)
    parser.add_argument("--version", action="version", version=f"minibert {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run, help: str, description: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=description, epilog=EPILOG)
        p.set_defaults(run=run)
        return p

    def model_option(p: argparse.ArgumentParser, help: str = "checkpoint: a directory, a weights/ name or a "
                     "cached Hugging Face id (default: the bundled all-MiniLM-L6-v2)") -> None:
        p.add_argument("--model", metavar="NAME", default=None, help=help)
        p.add_argument("--download", action="store_true",
                       help="fetch --model from the Hugging Face Hub if it is not on disk "
                            "(needs pip install 'minibert[hub]')")

    demo = command("demo", _demo, "write example figures, views and head statistics into a folder",
                   "Run the demo on the bundled sentences: PCA of three groups of similar short sentences, "
                   "attention paid to a chosen word by layer, one head's heatmap, a layers × heads grid, the "
                   "neuron figure, Clark et al.'s head statistics and an MDS map of the heads (PNG and SVG); "
                   "head, model and neuron views of an MRPC sentence pair (HTML, offline); the statistics of every "
                   "head (CSV, JSON, NPZ); and index.html linking them all. Prints each path and a summary of the "
                   "top heads, and each step as it starts (on stderr, with the seconds so far).")
    demo.add_argument("--out", type=Path, default=Path("out"), metavar="DIR", help="output folder (default: out/)")
    demo.add_argument("--overwrite", action="store_true",
                      help="replace the demo's files in --out (refused otherwise: an index.html there may be yours)")
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
    view.add_argument("--out", metavar="FILE", help="the page to write, .html or .htm (default: view.html, or "
                                                    "head_view.html, model_view.html, neuron_view.html)")
    view.add_argument("--overwrite", action="store_true",
                      help="replace the page if it is there (without it, an existing file or link is refused)")
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
    stats.add_argument("--overwrite", action="store_true",
                       help="replace PREFIX.npz, .json and .csv where they exist (refused otherwise)")
    stats.add_argument("--batch-size", type=int, metavar="N",
                       help="rows per batch; short documents share a row (default: a token budget,"
                            " fewer rows for longer documents)")
    stats.add_argument("--max-length", type=int, default=128, metavar="N",
                       help="truncate documents to N tokens (default 128)")
    stats.add_argument("--resume", type=Path, metavar="FILE",
                       help="keep the running totals and position in FILE; run the same command again to resume")
    stats.add_argument("--strict", action="store_true",
                       help="refuse a blank line or a document longer than --max-length (default: skip blank "
                            "lines and truncate long documents, and say how many)")
    stats.add_argument("--broad", choices=("relative", "absolute"), default="relative",
                       help="label a head 'broad' when its mean entropy exceeds 3.8 / ln 128 of the uniform "
                            "entropy ln n of the documents (relative, the default: short documents can be broad) or "
                            "Clark et al.'s 3.8 nats (absolute; no document under 45 tokens reaches it)")
    stats.add_argument("--every", type=int, default=100_000, metavar="N",
                       help="rewrite the resume file every N documents (per process; default 100000)")
    stats.add_argument("--distributed", action="store_true",
                       help="one of several processes (jax.distributed): each reads its share of FILE, process 0 "
                            "writes; the coordinator, process count and id come from the flags below or from "
                            "JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID")
    stats.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address (with --distributed)")
    stats.add_argument("--num-processes", type=int, metavar="N", help="how many processes (with --distributed)")
    stats.add_argument("--process-id", type=int, metavar="I", help="this process, 0 … N-1 (with --distributed)")
    stats.add_argument("--timeout", type=float, default=60.0, metavar="S",
                       help="stop with an error naming a process that has not answered for S seconds (default 60)")
    stats.add_argument("--heartbeat-timeout", type=int, default=100, metavar="S",
                       help="jax.distributed's: after S silent seconds it aborts every process; keep it above "
                            "--timeout (default 100)")
    model_option(stats)

    hooks = command("hooks", _hooks, "print the table of hook points (name, axes, equation)",
                    "Print every hook point with its axes and equation, as Markdown (docs/hooks.md is this output).")
    model_option(hooks, help="list one checkpoint's hooks (default: every architecture's)")
    hooks.add_argument("--output", metavar="FILE", help="write Markdown to this file instead of printing")

    serve = command("serve", _serve, "the live workbench: a local page to type, step through and ablate",
                    "Serve the live workbench on this machine: type a text (and sentence B), see its tokens, the "
                    "head, model and neuron views, the model's outputs and a step-through of one head with the real "
                    "numbers; click heads to ablate them. Prints the URL to open (with its access token) as the "
                    "first line and opens it; the JSON API is in docs/serve.md. Ctrl-C stops it.")
    model_option(serve)
    serve.add_argument("--compare", metavar="NAME", help="a second checkpoint shown side by side (e.g. fine-tuned)")
    serve.add_argument("--transcoder", action="append", metavar="DIR",
                       help="a transcoder of the main model (transcoders.save's directory); repeat it, one per layer, "
                            "for the features panel")
    serve.add_argument("--crosscoder", metavar="FILE",
                       help="a crosscoder of --model and --compare (a CrosscoderTrainer.save checkpoint), for the "
                            "\"what changed\" panel")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1: this machine only; another warns)")
    serve.add_argument("--port", type=int, default=8765, metavar="N", help="port (default 8765; 0: a free one)")
    serve.add_argument("--no-browser", action="store_true", help="print the URL without opening a browser")
    serve.add_argument("--max-tokens", type=int, metavar="N",
                       help="longest input accepted, in tokens, at most the model's positions (default 128, or the "
                            "model's positions if fewer)")
    serve.add_argument("--tour", action="store_true", help="start with the guided tour of tutorial 1's story")

    convert = command("convert", _convert, "convert a trusted pytorch_model.bin to model.safetensors",
                      "Read a pytorch_model.bin (a pickle: only for files you trust) and write its tensors as "
                      "model.safetensors, which minibert.load reads without unpickling.")
    convert.add_argument("bin", type=Path, metavar="BIN",
                         help="path to pytorch_model.bin (unpickled once: only for files you trust)")
    convert.add_argument("--output", type=Path, metavar="FILE",
                         help="output file (default: model.safetensors beside the .bin)")

    finetune = command("finetune", _finetune, "fine-tune a model on a task (JAX, optax); save it for transformers",
                       "Fine-tune --model on DATA (TSV/CSV with a header row text[, pair], label, or JSONL) with "
                       "AdamW as transformers' Trainer runs it, and write OUT/model (a Hugging Face directory: "
                       "config.json, model.safetensors, tokenizer files), OUT/history.json (loss per step, "
                       "evaluation per epoch) and OUT/checkpoints (run the same command with --resume to continue).")
    finetune.add_argument("data", type=Path, metavar="DATA", help="training examples (.tsv, .csv or .jsonl)")
    finetune.add_argument("--task", choices=["sequence-classification", "token-classification", "masked-lm"],
                          default="sequence-classification", help="what to train (default sequence-classification)")
    finetune.add_argument("--out", type=Path, required=True, metavar="DIR", help="output folder")
    finetune.add_argument("--resume", action="store_true", help="continue the run saved in DIR/checkpoints")
    finetune.add_argument("--eval", type=Path, metavar="FILE", help="held-out examples, evaluated after each epoch")
    finetune.add_argument("--num-labels", type=int, metavar="N", help="classes (default: from the labels)")
    finetune.add_argument("--epochs", type=int, default=3, metavar="N", help="passes over DATA (default 3)")
    finetune.add_argument("--batch-size", type=int, default=16, metavar="N", help="examples per step (default 16)")
    finetune.add_argument("--learning-rate", type=float, default=2e-5, metavar="LR", help="peak rate (default 2e-5)")
    finetune.add_argument("--weight-decay", type=float, default=0.01, metavar="W",
                          help="AdamW's decoupled decay, not on biases and LayerNorm (default 0.01)")
    finetune.add_argument("--warmup", type=_warmup, default=0.1, metavar="W",
                          help="warm-up: a fraction of the updates (0.1) or a number of updates (100) (default 0.1)")
    finetune.add_argument("--schedule", choices=["linear", "constant"], default="linear",
                          help="the rate after warm-up: down to 0 at the end, or constant (default linear)")
    finetune.add_argument("--max-grad-norm", type=float, default=1.0, metavar="C",
                          help="clip the gradient's global norm to C (default 1.0)")
    finetune.add_argument("--dropout", type=float, default=None, metavar="P",
                          help="one dropout rate everywhere; 0 for none (default: the checkpoint's config)")
    finetune.add_argument("--accumulate", type=int, default=1, metavar="N",
                          help="micro-batches per update, gradients averaged (default 1)")
    finetune.add_argument("--no-shuffle", action="store_true", help="keep DATA's order in every epoch")
    finetune.add_argument("--bf16", action="store_true",
                          help="compute in bfloat16, with float32 master weights and optimiser state")
    finetune.add_argument("--seed", type=int, default=0, metavar="N", help="data order, dropout, new head (default 0)")
    finetune.add_argument("--trainable", nargs="+", metavar="GLOB",
                          help="parameter names that move, e.g. 'classifier.*' 'blocks.5.*' (default: all)")
    model_option(finetune)

    tutorial = command("tutorial", _tutorial, "write a tutorial as a Jupyter notebook (no name: list them)",
                       "Write one of the tutorials that ship with minibert as a runnable notebook (.ipynb), "
                       "without jupytext. NAME is its number (6 or 06), its name (context_mixing) or both "
                       "(06_context_mixing). Never overwrites a file.")
    tutorial.add_argument("name", nargs="?", metavar="NAME", help="which tutorial (default: list them)")
    tutorial.add_argument("--output", type=Path, metavar="FILE", help="the notebook to write (default: ./NAME.ipynb)")
    return parser


def _interrupted(command: str) -> None:
    """Leave the process at once with status 130 after one line: neither the interpreter's teardown, which run
    while XLA's threads are still compiling or computing can die by SIGSEGV, nor the rest of the command."""
    print(f"\nminibert {command}: interrupted", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(INTERRUPTED)


@contextlib.contextmanager
def _one_line_warnings(command: str) -> Iterator[None]:
    """minibert's own warnings printed as one line, "minibert COMMAND: warning: …": Python's file, line number and
    source line of the warning mean nothing to a command-line user. Only the text changes (warnings.formatwarning):
    filters and whoever records warnings see them as before; other packages' warnings print as usual. Ours are
    those raised at a line of minibert's, and those of minibert's own classes (RecompileWarning, CacheWarning),
    which point past minibert at the caller's line (errors.outside_minibert)."""
    package = Path(__file__).resolve().parents[1]  # minibert/: where a warning of ours points
    python_format = warnings.formatwarning

    def one_line(message, category, filename, lineno, line=None) -> str:
        ours = category.__module__.startswith("minibert.") or Path(filename).resolve().is_relative_to(package)
        if not ours:
            return python_format(message, category, filename, lineno, line)
        return f"minibert {command}: warning: {' '.join(str(message).split())}\n"

    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = python_format


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); returns the exit status. As the program (no `argv`),
    Ctrl-C leaves the process at once after its one line (_interrupted): from the signal handler itself, since
    a KeyboardInterrupt raised inside a garbage-collection callback (JAX registers one) is printed as ignored and
    the command would run on."""
    args = build_parser().parse_args(argv)
    if argv is None:
        signal.signal(signal.SIGINT, lambda signum, frame: _interrupted(args.command))
    try:
        with _one_line_warnings(args.command):
            return args.run(args)
    except MinibertError as error:  # bad input, named by the library; anything else is a bug: keep its traceback
        message = " ".join(str(error).split())
        print(f"minibert {args.command}: error: {message}", file=sys.stderr)
        if isinstance(error, DistributedError):  # a normal exit would wait in jax.distributed's shutdown for
            sys.stderr.flush()                  # the lost process until the heartbeat timeout, then abort
            os._exit(USER_ERROR)
        return USER_ERROR
    except KeyboardInterrupt:  # Ctrl-C is the user's choice, not a bug: no traceback
        if argv is None:
            _interrupted(args.command)
        print(f"\nminibert {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())

"""The `minibert` command: demo, view, stats, hooks, convert."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


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
    from minibert.config import HEAD_ARCHITECTURES

    names: dict[str, None] = {}
    for architecture in HEAD_ARCHITECTURES:
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
    parser = argparse.ArgumentParser(prog="minibert", description="A transparent BERT encoder: views, statistics, hooks.")
    sub = parser.add_subparsers(dest="command", required=True)

    hooks = sub.add_parser("hooks", help="print the table of hook points (name, axes, equation)")
    hooks.add_argument("--model", default=None, help="list one checkpoint's hooks (default: every architecture's)")
    hooks.add_argument("--output", help="write Markdown to this file instead of printing")
    hooks.set_defaults(run=_hooks)

    convert = sub.add_parser("convert", help="convert a trusted pytorch_model.bin to model.safetensors")
    convert.add_argument("bin", type=Path, help="path to pytorch_model.bin (unpickled once: only for files you trust)")
    convert.add_argument("--output", type=Path, help="output file (default: model.safetensors beside the .bin)")
    convert.set_defaults(run=_convert)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

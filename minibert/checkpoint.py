"""Hugging Face checkpoints of the BERT family → minibert parameters, by a strict table per family.

Every checkpoint key minibert reads is named in `key_table`, with the minibert
parameter it becomes and the reshaping that puts it in the shape the maths uses
(PyTorch Linear stores W as out×in; minibert stores W_Q as D×H×K and W_O as H×K×D).
Missing keys, unexpected keys and wrong shapes are errors that name the key. The
families differ only in key names (LAYER_KEYS, HEAD_KEYS); config.FAMILIES says which
table a model_type uses.

Loading reads safetensors only. A PyTorch `pytorch_model.bin` is a pickle, which can
run code when it is read: it is loaded only when the caller passes `allow_pickle=True`,
and `convert_bin_to_safetensors` turns it into a safetensors file once.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from minibert.config import Config, read_json_object
from minibert.errors import CheckpointError

# Keys Hugging Face saves that carry no weights (buffers).
IGNORED = ("embeddings.position_ids", "embeddings.token_type_ids")

# Per-layer key names of each layout: (prefix of layer i, {part of minibert's Block: Hugging Face module}).
LAYER_KEYS: dict[str, tuple[str, dict[str, str]]] = {
    "bert": ("encoder.layer.{i}", {
        "query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
        "out": "attention.output.dense", "ln1": "attention.output.LayerNorm",
        "mlp_in": "intermediate.dense", "mlp_out": "output.dense", "ln2": "output.LayerNorm"}),
    "distilbert": ("transformer.layer.{i}", {
        "query": "attention.q_lin", "key": "attention.k_lin", "value": "attention.v_lin",
        "out": "attention.out_lin", "ln1": "sa_layer_norm",
        "mlp_in": "ffn.lin1", "mlp_out": "ffn.lin2", "ln2": "output_layer_norm"}),
    # ALBERT's one shared layer (num_hidden_groups = inner_group_num = 1, see config.FAMILY_VALUES).
    "albert": ("encoder.albert_layer_groups.0.albert_layers.0", {
        "query": "attention.query", "key": "attention.key", "value": "attention.value",
        "out": "attention.dense", "ln1": "attention.LayerNorm",
        "mlp_in": "ffn", "mlp_out": "ffn_output", "ln2": "full_layer_layer_norm"}),
}


@dataclasses.dataclass(frozen=True)
class HeadKeys:
    """Where one family keeps its embedding projection and heads (keys without the encoder's prefix)."""

    pooler: str | None = "pooler.dense"  # the bare model's pooler
    sequence_pooler: str = "pooler.dense"  # the dense layer a sequence classifier puts on the first token
    classifier: str = "classifier"  # the sequence classifier's output layer
    projection: str | None = None  # the E → D embedding projection
    mlm_dense: str = "cls.predictions.transform.dense"
    mlm_ln: str = "cls.predictions.transform.LayerNorm"
    mlm_bias: str = "cls.predictions.bias"
    tied: tuple[tuple[str, str], ...] = (  # key → minibert parameter it repeats (saved or not)
        ("cls.predictions.decoder.weight", "embed.word"), ("cls.predictions.decoder.bias", "mlm.decoder_bias"))


_ROBERTA_HEADS = HeadKeys(
    sequence_pooler="classifier.dense", classifier="classifier.out_proj", mlm_dense="lm_head.dense",
    mlm_ln="lm_head.layer_norm", mlm_bias="lm_head.bias",
    tied=(("lm_head.decoder.weight", "embed.word"), ("lm_head.decoder.bias", "mlm.decoder_bias")))
HEAD_KEYS: dict[str, HeadKeys] = {  # model_type → key names
    "bert": HeadKeys(),
    "roberta": _ROBERTA_HEADS,
    "xlm-roberta": _ROBERTA_HEADS,
    "camembert": _ROBERTA_HEADS,
    "distilbert": HeadKeys(
        pooler=None, sequence_pooler="pre_classifier", mlm_dense="vocab_transform", mlm_ln="vocab_layer_norm",
        mlm_bias="vocab_projector.bias", tied=(("vocab_projector.weight", "embed.word"),)),
    "electra": HeadKeys(
        pooler=None, sequence_pooler="classifier.dense", classifier="classifier.out_proj",
        projection="embeddings_project", mlm_dense="generator_predictions.dense",
        mlm_ln="generator_predictions.LayerNorm", mlm_bias="generator_lm_head.bias",
        tied=(("generator_lm_head.weight", "embed.word"),)),
    "albert": HeadKeys(
        pooler="pooler", sequence_pooler="pooler", projection="encoder.embedding_hidden_mapping_in",
        mlm_dense="predictions.dense", mlm_ln="predictions.LayerNorm", mlm_bias="predictions.bias",
        tied=(("predictions.decoder.weight", "embed.word"), ("predictions.decoder.bias", "mlm.decoder_bias"))),
}




def _identity(w, cfg):
    return w


def _transpose(w, cfg):  # PyTorch Linear [out, in] → [in, out]
    return w.T


def _to_DHK(w, cfg):  # [H·K, D] → [D, H, K]
    return w.T.reshape(cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim)


def _to_HK(b, cfg):  # [H·K] → [H, K]
    return b.reshape(cfg.num_attention_heads, cfg.head_dim)


def _to_HKD(w, cfg):  # [D, H·K] → [H, K, D]
    return w.T.reshape(cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size)


def _to_vector(w, cfg):  # [1, D] → [D] (a Linear with one output)
    return w[0]


def _to_scalar(b, cfg):  # [1] → ()
    return b[0]


Rule = tuple[str, tuple[int, ...], Callable]  # minibert param path, HF shape, converter


def _layer_norm(hf: str, ours: str, D: int) -> dict[str, Rule]:
    return {f"{hf}.weight": (f"{ours}.scale", (D,), _identity), f"{hf}.bias": (f"{ours}.bias", (D,), _identity)}


def _linear(hf: str, w: str, b: str, out_dim: int, in_dim: int, w_fn=_transpose, b_fn=_identity) -> dict[str, Rule]:
    return {f"{hf}.weight": (w, (out_dim, in_dim), w_fn), f"{hf}.bias": (b, (out_dim,), b_fn)}


def key_table(cfg: Config) -> dict[str, Rule]:
    """Every Hugging Face key this architecture needs → (minibert param path, HF shape, converter).

    Encoder keys are bare (`embeddings...`, `encoder...`, `pooler...`); head keys are as HF
    saves them (`cls...`, `classifier...`, `lm_head...`).
    """
    D, E, V = cfg.hidden_size, cfg.embed_dim, cfg.vocab_size
    names = HEAD_KEYS[cfg.model_type]
    table: dict[str, Rule] = {
        "embeddings.word_embeddings.weight": ("embed.word", (V, E), _identity),
        "embeddings.position_embeddings.weight": ("embed.position", (cfg.max_position_embeddings, E), _identity),
        **_layer_norm("embeddings.LayerNorm", "embed.ln", E),
    }
    if cfg.family.token_types:
        table["embeddings.token_type_embeddings.weight"] = ("embed.token_type", (cfg.type_vocab_size, E), _identity)
    if cfg.has_projection:
        table |= _linear(names.projection, "embed.W_proj", "embed.b_proj", D, E)
    layer, parts = LAYER_KEYS[cfg.family.layer_keys]
    # ALBERT's blocks share one set of weights: the key table names them once, as block 0's.
    for i in range(1 if cfg.family.shared_layers else cfg.num_hidden_layers):
        table |= _block_keys(cfg, layer.format(i=i), parts, f"blocks.{i}")
    heads = cfg.heads
    if heads.pooler:
        pooler = names.sequence_pooler if heads.classifier == "sequence" else names.pooler
        table |= _linear(pooler, "pooler.W", "pooler.b", D, D)
    if heads.mlm:
        table |= _linear(names.mlm_dense, "mlm.W", "mlm.b", E, D)
        table |= _layer_norm(names.mlm_ln, "mlm.ln", E)
        table[names.mlm_bias] = ("mlm.decoder_bias", (V,), _identity)
    if heads.nsp:
        table |= _linear("cls.seq_relationship", "nsp.W", "nsp.b", 2, D)
    if heads.classifier:
        classifier = names.classifier if heads.classifier == "sequence" else "classifier"
        table |= _linear(classifier, "classifier.W", "classifier.b", cfg.num_labels, D)
    if heads.discriminator:
        table |= _linear("discriminator_predictions.dense", "discriminator.W", "discriminator.b", D, D)
        table |= _linear("discriminator_predictions.dense_prediction", "discriminator.w", "discriminator.c", 1, D,
                         _to_vector, _to_scalar)
    return table


def _block_keys(cfg: Config, hf: str, parts: Mapping[str, str], ours: str) -> dict[str, Rule]:
    """One layer's keys under the layout's module names `parts`, into minibert's Block `ours`."""
    D, F = cfg.hidden_size, cfg.intermediate_size
    table: dict[str, Rule] = {}
    for name in ("query", "key", "value"):
        letter = name[0].upper()
        table |= _linear(f"{hf}.{parts[name]}", f"{ours}.attn.W_{letter}", f"{ours}.attn.b_{letter}",
                         D, D, _to_DHK, _to_HK)
    table |= _linear(f"{hf}.{parts['out']}", f"{ours}.attn.W_O", f"{ours}.attn.b_O", D, D, _to_HKD)
    table |= _layer_norm(f"{hf}.{parts['ln1']}", f"{ours}.ln1", D)
    table |= _linear(f"{hf}.{parts['mlp_in']}", f"{ours}.mlp.W_in", f"{ours}.mlp.b_in", F, D)
    table |= _linear(f"{hf}.{parts['mlp_out']}", f"{ours}.mlp.W_out", f"{ours}.mlp.b_out", D, F)
    table |= _layer_norm(f"{hf}.{parts['ln2']}", f"{ours}.ln2", D)
    return table


def _unused_pooler(cfg: Config) -> set[str]:
    """The bare model's pooler keys when this head has no pooler: released head checkpoints often carry it
    (roberta-base, saved as RobertaForMaskedLM) and Hugging Face leaves it unused; so does minibert."""
    pooler = HEAD_KEYS[cfg.model_type].pooler
    if cfg.heads.pooler or pooler is None:
        return set()
    return {f"{pooler}.weight", f"{pooler}.bias"}


def _canonical(key: str, prefix: str = "bert") -> str:
    """Strip the encoder prefix of head models (`bert.`, `roberta.`, …) and rename TF-era LayerNorm gamma/beta."""
    key = key.removeprefix(prefix + ".")
    if key.endswith(".gamma"):
        key = key[: -len("gamma")] + "weight"
    elif key.endswith(".beta"):
        key = key[: -len("beta")] + "bias"
    return key


def convert(tensors: Mapping[str, np.ndarray], cfg: Config, *, dtype=jnp.float32, source: str = "checkpoint") -> dict:
    """HF tensors (bare or prefixed keys: `bert.`, `roberta.`, …) → nested dict of minibert params, checked strictly."""
    table = key_table(cfg)
    prefix = cfg.family.key_prefix
    tied = dict(HEAD_KEYS[cfg.model_type].tied)
    by_key = {}
    for key, value in tensors.items():
        canonical = _canonical(key, prefix)
        if canonical in by_key:
            raise CheckpointError(f"{source}: key {key!r} appears twice (with and without the '{prefix}.' prefix).")
        by_key[canonical] = (key, value)
    missing = [k for k in table if k not in by_key]
    if missing:
        raise CheckpointError(
            f"{source}: missing {len(missing)} key(s) that a {cfg.architecture} with "
            f"{cfg.num_hidden_layers} layers needs, first {missing[:3]}. Check that config.json "
            f"(architectures, num_hidden_layers) describes these weights."
        )
    unused = _unused_pooler(cfg)
    unexpected = [by_key[k][0] for k in by_key
                  if k not in table and k not in IGNORED and k not in tied and k not in unused]
    if unexpected:
        raise CheckpointError(
            f"{source}: {len(unexpected)} unexpected key(s), first {unexpected[:3]}. minibert loads "
            f"{cfg.architecture}; if these weights belong to another head, fix `architectures` in config.json."
        )
    flat = {}
    for key, (path, shape, to_ours) in table.items():
        original, value = by_key[key]
        if tuple(value.shape) != shape:
            raise CheckpointError(
                f"{source}: {original!r} has shape {tuple(value.shape)}, expected {shape} from config.json "
                f"(hidden_size={cfg.hidden_size}, heads={cfg.num_attention_heads}, "
                f"intermediate_size={cfg.intermediate_size}, vocab_size={cfg.vocab_size})."
            )
        flat[path] = to_ours(jnp.asarray(value, dtype=jnp.float32), cfg).astype(dtype)
    for key, path in tied.items():
        if key in by_key and path in flat:
            repeated = jnp.asarray(by_key[key][1], jnp.float32).astype(dtype)
            if not jnp.array_equal(repeated, flat[path]):
                raise CheckpointError(
                    f"{source}: {key!r} differs from {path.replace('.', ' ')}; minibert ties the MLM decoder "
                    f"to the word embeddings as {cfg.family.name} does, and these weights are untied."
                )
    return _nest(flat)


def _nest(flat: Mapping[str, object]) -> dict:
    nested: dict = {}
    for path, value in flat.items():
        *parents, leaf = path.split(".")
        node = nested
        for p in parents:
            node = node.setdefault(int(p) if p.isdigit() else p, {})
        node[leaf] = value
    return nested


def read_safetensors(directory: Path) -> dict[str, object]:
    """All tensors of a checkpoint directory: `model.safetensors` or a sharded index."""
    from safetensors import SafetensorError, safe_open

    index = directory / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index} is not a valid safetensors index ({e!r}); "
                                  f"it needs a 'weight_map'.") from None
        files = sorted(set(weight_map.values()))
    elif (directory / "model.safetensors").exists():
        files = ["model.safetensors"]
    elif (directory / "pytorch_model.bin").exists():
        raise CheckpointError(
            f"{directory} has only pytorch_model.bin, a pickle that can run code when read. Convert it once "
            f"with `minibert convert {directory / 'pytorch_model.bin'}` (or load with allow_pickle=True) "
            f"if you trust the file."
        )
    else:
        raise CheckpointError(f"{directory} has no model.safetensors (nor a model.safetensors.index.json).")
    tensors, shard_of = {}, {}
    for name in files:
        path = directory / name
        if not path.exists():
            raise CheckpointError(f"{path} is listed in the safetensors index but does not exist; "
                                  f"download the missing shard.")
        try:
            with safe_open(str(path), framework="flax") as f:
                shard = {key: f.get_tensor(key) for key in f.keys()}
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(
                f"{path} is not a readable safetensors file ({e}); it may be truncated or corrupt — download it again."
            ) from None
        # A tensor in two shards is an error even with equal values: a save writes each tensor once, so
        # these shards come from different saves, and which copy should win cannot be known.
        twice = next((key for key in shard if key in shard_of), None)
        if twice is not None:
            raise CheckpointError(f"{directory}: tensor {twice!r} is stored in two shards, {shard_of[twice]} and "
                                  f"{name}; a checkpoint holds each tensor once. Re-download the checkpoint or "
                                  f"save it again.")
        shard_of |= dict.fromkeys(shard, name)
        tensors |= shard
    return tensors


def read_pytorch_bin(path: Path, *, allow_pickle: bool = False) -> dict[str, np.ndarray]:
    """Tensors of a `pytorch_model.bin` — only when the caller opts in to unpickling."""
    if not allow_pickle:
        raise CheckpointError(
            f"{path} is a pickle; reading it can run arbitrary code. Pass allow_pickle=True only for files you trust, "
            f"or convert it once with `minibert convert {path}`."
        )
    if not Path(path).is_file():
        raise CheckpointError(f"{path} does not exist or is not a file; pass the path of a pytorch_model.bin.")
    try:
        import torch
    except ImportError:
        raise CheckpointError(f"reading {path} needs PyTorch (`pip install torch`); "
                              f"safetensors checkpoints do not.") from None
    try:  # weights_only: the unpickler refuses anything but tensors and plain containers, so no code runs
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as error:
        raise CheckpointError(  # torch's own message suggests weights_only=False: not advice to pass on
            f"{path} could not be read as a file of tensors ({type(error).__name__}). It is read with "
            f"torch.load(weights_only=True), which refuses other objects because unpickling them can run code; "
            f"if the file is corrupt, download it again, and otherwise get the checkpoint as model.safetensors."
        ) from None
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a dict of tensors (a state_dict); "
                              f"save the model with torch.save(model.state_dict(), path).")
    return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in state.items()}


def convert_bin_to_safetensors(bin_path: str | Path, out_path: str | Path | None = None) -> Path:
    """Write `pytorch_model.bin`'s tensors to `model.safetensors` beside it (or at out_path). Unpickles once."""
    from safetensors.numpy import save_file

    bin_path = Path(bin_path)
    out_path = Path(out_path) if out_path else bin_path.with_name("model.safetensors")
    tensors = read_pytorch_bin(bin_path, allow_pickle=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(out_path), metadata={"format": "pt"})
    return out_path


POOLING_MODES = {"cls_token": "cls", "mean_tokens": "mean", "max_tokens": "max"}  # sentence-transformers → ours


def sentence_transformers_layout(directory: Path) -> tuple[Path, dict | None]:
    """(directory of the encoder weights, pooling settings) of a checkpoint directory.

    A sentence-transformers directory has a `modules.json` listing a Transformer module (the encoder,
    often the directory itself), a Pooling module and maybe Normalize; a plain checkpoint has none
    and no pooling settings (None).
    """
    modules_file = directory / "modules.json"
    if not modules_file.exists():
        return directory, None
    modules = _read_modules(modules_file)
    model_dir, pooling = directory, {"mode": "mean", "normalize": False}
    for module in modules:
        kind = module.get("type", "").rsplit(".", 1)[-1]
        path = directory / module.get("path", "")
        if kind == "Transformer":
            model_dir = path
        elif kind == "Pooling" and (path / "config.json").exists():
            settings = read_json_object(path / "config.json", "sentence-transformers' Pooling module needs it",
                                        CheckpointError)
            modes = [m for m in POOLING_MODES if settings.get(f"pooling_mode_{m}")]
            pooling["mode"] = POOLING_MODES[modes[0]] if modes else "mean"
        elif kind == "Normalize":
            pooling["normalize"] = True
    return model_dir, pooling


def _read_modules(path: Path) -> list[dict]:
    try:
        modules = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); "
                              f"sentence-transformers writes a list of modules.") from None
    if not isinstance(modules, list) or not all(
            isinstance(m, dict) and isinstance(m.get("type", ""), str) and isinstance(m.get("path", ""), str)
            for m in modules):
        raise CheckpointError(f"{path} must be a JSON list of objects with 'type' and 'path' strings "
                              f"(sentence-transformers' modules.json); got {str(modules)[:80]}.")
    return modules


def check_config(cfg: Config, tensors: Mapping[str, object], *, source: str = "checkpoint") -> None:
    """Compare config.json's layer count with the weights before the key table is built.

    A config that asks for 10⁸ layers of 1-layer weights fails here at once, not after allocating them.
    ALBERT stores one shared layer whatever the count, so there is nothing to compare.
    """
    if cfg.family.shared_layers:
        return
    # Only the layer count needs checking first: the key table grows with it. Other sizes are checked key by
    # key by convert(), which names the tensor; extra layers in the weights are named there too.
    layer = re.escape(LAYER_KEYS[cfg.family.layer_keys][0]).replace(r"\{i\}", r"(\d+)")
    found = {int(m.group(1)) for key in tensors if (m := re.match(rf"(?:\w+\.)?{layer}\.", key))}
    if not found:
        return  # the weights have no layer at all: convert() names the missing keys
    said = cfg.num_hidden_layers
    if said > max(found) + 1:
        raise CheckpointError(f"{source}: config.json says num_hidden_layers = {said}, but the weights have "
                              f"{max(found) + 1}. Fix config.json (or use the config that came with these weights).")

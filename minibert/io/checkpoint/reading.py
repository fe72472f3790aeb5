"""Reading Hugging Face checkpoints of the BERT family → minibert parameters, by a strict table per family.

Every checkpoint key minibert reads is named in `key_table`, with the minibert
parameter it becomes and the reshaping that puts it in the shape the maths uses
(PyTorch Linear stores W as out×in; minibert stores W_Q as D×H×K and W_O as H×K×D).
Missing keys, unexpected keys and wrong shapes are errors that name the key. Each
family's module (minibert/families/) holds its table (Family.key_table, built from its
LayerKeys and HeadKeys by core/keys.py).

Loading reads safetensors only. A PyTorch `pytorch_model.bin` is a pickle, which can
run code when it is read: it is loaded only when the caller passes `allow_pickle=True`,
and `convert_bin_to_safetensors` turns it into a safetensors file once.
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from minibert.core.config import Config
from minibert.core.keys import Rule, bert_layout
from minibert.errors import CheckpointError
from minibert.io.files import read_json_object

# Keys Hugging Face saves that carry no weights (buffers).
IGNORED = ("embeddings.position_ids", "embeddings.token_type_ids")


def key_table(cfg: Config) -> dict[str, Rule]:
    """Every Hugging Face key this architecture needs → (minibert param path, HF shape, converter): the
    family's own table (Family.key_table), else BERT's layout of its LayerKeys and HeadKeys (keys.bert_layout)."""
    return (cfg.family.key_table or bert_layout)(cfg)


def _unused_pooler(cfg: Config) -> set[str]:
    """The bare model's pooler keys when this head has no pooler: released head checkpoints often carry it
    (roberta-base, saved as RobertaForMaskedLM) and Hugging Face leaves it unused; so does minibert."""
    pooler = cfg.family.head_keys.pooler
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


def convert(tensors: Mapping[str, np.ndarray], cfg: Config, *, dtype=jnp.float32, source: str = "checkpoint",
            allow_nonfinite: bool = False) -> dict:
    """HF tensors (bare or prefixed keys: `bert.`, `roberta.`, …) → nested dict of minibert params, checked strictly.

    Weights must be floating point and, unless `allow_nonfinite`, finite: a NaN or an infinity in any weight makes
    every output non-finite, so it is refused with the tensor's name (pass allow_nonfinite=True to study such
    weights anyway)."""
    table = key_table(cfg)
    prefix = cfg.family.key_prefix
    tied = dict(cfg.family.head_keys.tied)
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
    unused = _unused_pooler(cfg) | {k for k in by_key if any(re.match(p, k) for p in cfg.family.unused_keys)}
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
        flat[path] = to_ours(_checked_weight(original, value, source, allow_nonfinite), cfg).astype(dtype)
    for key, path in tied.items():
        if key in by_key and path in flat:
            repeated = np.asarray(by_key[key][1], np.float32).astype(dtype)
            if not np.array_equal(repeated, flat[path]):
                raise CheckpointError(
                    f"{source}: {key!r} differs from {path.replace('.', ' ')}; minibert ties the MLM decoder "
                    f"to the word embeddings as {cfg.family.name} does, and these weights are untied."
                )
    # Converted on the host, in NumPy, and moved in one transfer: jnp's transposes and reshapes would compile one
    # small program per weight shape on the first load.
    return _nest(jax.device_put(flat))


def _checked_weight(key: str, value, source: str, allow_nonfinite: bool) -> np.ndarray:
    """A checkpoint tensor as float32 (NumPy), refused if it is not floating point or (unless allowed) not finite."""
    if not jnp.issubdtype(value.dtype, jnp.floating):
        # F32 bytes declared I32 in a safetensors header pass the file's size checks and read as numbers ~1e9.
        raise CheckpointError(f"{source}: {key!r} is stored as {value.dtype}, but weights are floating point "
                              f"(F16, BF16, F32 or F64); the file's header declares the wrong type. Re-save or "
                              f"re-download the checkpoint.")
    if not allow_nonfinite:
        # On the host, in NumPy: a jnp reduction would compile one program per tensor shape on the first load.
        bad = np.count_nonzero(~np.isfinite(np.asarray(value)))
        if bad:
            raise CheckpointError(f"{source}: {key!r} holds {bad} NaN or infinite value(s) of {value.size}; every "
                                  f"output would be non-finite. Re-download the checkpoint, or pass "
                                  f"allow_nonfinite=True to load it anyway.")
    return np.asarray(value, dtype=np.float32)


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
        files = _shard_files(index)
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
            with safe_open(str(path), framework="numpy") as f:  # NumPy: flax's reader compiles a program per shape
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


def _shard_files(index: Path) -> list[str]:
    """The shard files a `model.safetensors.index.json` names, each checked to lie inside its folder."""
    weight_map = read_json_object(index, "a sharded checkpoint needs it", CheckpointError).get("weight_map")
    if not isinstance(weight_map, Mapping) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: 'weight_map' must be an object {{tensor name: shard file name}}, got "
                              f"{str(weight_map)[:80]}. Re-download the index or save the checkpoint again.")
    files = sorted(set(weight_map.values()))
    for name in files:
        # Names only, not resolved paths: the Hugging Face cache links each shard to a blob outside the folder.
        if Path(name).is_absolute() or ".." in Path(name).parts:  # "../elsewhere/model.safetensors", "/etc/x"
            raise CheckpointError(f"{index}: shard {name!r} lies outside the checkpoint folder {index.parent}; an "
                                  f"index names the shard files in its folder. Fix the index.")
    return files


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
    if out_path.resolve() == bin_path.resolve():  # resolve: links and .. can name the same file twice
        raise CheckpointError(f"{out_path} is the input file {bin_path} itself; converting would overwrite it. "
                              f"Write to another file, e.g. {bin_path.with_name('model.safetensors')}.")
    tensors = read_pytorch_bin(bin_path, allow_pickle=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(out_path), metadata={"format": "pt"})
    return out_path


# sentence-transformers' pooling modes, which are also sentence_embeddings' modes, in the order in which it
# concatenates several; its older Pooling configs (most Hub models) say `pooling_mode_<old name>: true` for each.
POOLING_MODES = {"cls_token": "cls", "max_tokens": "max", "mean_tokens": "mean",
                 "mean_sqrt_len_tokens": "mean_sqrt_len_tokens", "weightedmean_tokens": "weightedmean",
                 "lasttoken": "lasttoken"}
# The modules minibert computes, in the only order it computes them (Dropout is the identity at inference).
SENTENCE_MODULES = ("Transformer", "Pooling", "Normalize")
# Where sentence-transformers looks for the Transformer module's settings, first found wins.
TRANSFORMER_SETTINGS = ("sentence_bert_config.json", "sentence_roberta_config.json",
                        "sentence_distilbert_config.json", "sentence_camembert_config.json",
                        "sentence_albert_config.json", "sentence_xlm-roberta_config.json")


def sentence_transformers_layout(directory: Path) -> tuple[Path, dict | None]:
    """(directory of the encoder weights, sentence-embedding settings) of a checkpoint directory.

    A sentence-transformers directory has a `modules.json` listing a Transformer module (the encoder,
    often the directory itself), a Pooling module and maybe Normalize; a plain checkpoint has none
    and no settings (None). The settings always hold "mode" (a pooling mode, a tuple of modes to
    concatenate, or None without a Pooling module) and "normalize"; the others only where the directory
    states them: "max_seq_length", "lower_case", "include_prompt" (False), "prompts", "default_prompt",
    and "unsupported" (the modules minibert does not compute, which sentence_embeddings then refuses).
    """
    modules_file = directory / "modules.json"
    if not modules_file.exists():
        return directory, None
    model_dir, settings, kinds, unsupported = directory, {"mode": None, "normalize": False}, [], []
    for module in _read_modules(modules_file):
        kind = module.get("type", "").rsplit(".", 1)[-1]
        path = directory / module.get("path", "")
        if kind == "Transformer":
            model_dir, found = path, _transformer_settings(path)
        elif kind == "Pooling":
            found = _pooling_settings(path / "config.json")
        elif kind == "Normalize":
            found = _normalize_settings(path / "config.json")
        else:
            found = {} if kind == "Dropout" else {"unsupported": f"a {kind} module"}
        unsupported += [found.pop("unsupported")] if "unsupported" in found else []
        settings |= found
        kinds += [kind] if kind != "Dropout" else []
    known = [kind for kind in kinds if kind in SENTENCE_MODULES]
    if known[:1] != ["Transformer"] or known != [kind for kind in SENTENCE_MODULES if kind in known]:
        unsupported.append(f"the modules in the order {' → '.join(kinds)}")
    settings |= {"unsupported": tuple(unsupported)} if unsupported else {}
    return model_dir, settings | _prompt_settings(directory / "config_sentence_transformers.json")


def _transformer_settings(path: Path) -> dict:
    """max_seq_length and do_lower_case of the Transformer module (absent where sentence-transformers 6 saved
    it: the length is then tokenizer_config.json's model_max_length), and whether it yields token embeddings."""
    found = [path / name for name in TRANSFORMER_SETTINGS if (path / name).exists()]
    if not found:
        return {}
    config = read_json_object(found[0], "sentence-transformers' Transformer module reads it", CheckpointError)
    settings = {}
    length = config.get("max_seq_length")
    if length is not None:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise CheckpointError(f"{found[0]}: max_seq_length must be a positive whole number such as 512, got "
                                  f"{length!r}. Fix it, or remove it to use the tokenizer's model_max_length.")
        settings["max_seq_length"] = length
    lower = config.get("do_lower_case", False)
    if not isinstance(lower, bool):  # a string such as "false" would count as true
        raise CheckpointError(f"{found[0]}: do_lower_case must be true or false (JSON booleans), got {lower!r}. "
                              f"Fix the file.")
    if lower:
        settings["lower_case"] = True
    text = (config.get("modality_config") or {}).get("text") or {}  # sentence-transformers 6 writes it
    output = text.get("method_output_name", "last_hidden_state") if isinstance(text, dict) else text
    if config.get("transformer_task", "feature-extraction") != "feature-extraction" or output != "last_hidden_state":
        settings["unsupported"] = (f"a Transformer module yielding {output!r} for the task "
                                   f"{config.get('transformer_task', 'feature-extraction')!r}")
    return settings


def _pooling_settings(path: Path) -> dict:
    """The Pooling module's mode (or modes, concatenated in sentence-transformers' order) and include_prompt,
    from its current config (`pooling_mode`) or an older one (`pooling_mode_<name>: true`)."""
    config = read_json_object(path, "sentence-transformers' Pooling module needs it", CheckpointError)
    if "pooling_mode" in config:
        named = config["pooling_mode"]
        modes = tuple(named) if isinstance(named, list) else (named,)
    else:  # no mode at all is sentence-transformers' default, mean
        modes = tuple(new for old, new in POOLING_MODES.items() if config.get(f"pooling_mode_{old}")) or ("mean",)
    wrong = [mode for mode in modes if mode not in POOLING_MODES.values()]
    if wrong or not modes:
        raise CheckpointError(f"{path}: pooling_mode {config.get('pooling_mode')!r} is not one of "
                              f"sentence-transformers' modes {', '.join(map(repr, POOLING_MODES.values()))} "
                              f"(or a list of them); fix it.")
    settings = {"mode": modes[0] if len(modes) == 1 else modes}
    if config.get("include_prompt", True) is False:
        settings["include_prompt"] = False
    return settings


def _normalize_settings(path: Path) -> dict:
    """L2 normalisation of the sentence embedding; a Normalize of token embeddings (multi-vector models) is one
    minibert does not compute."""
    config = read_json_object(path, "", CheckpointError) if path.exists() else {}
    if config.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        return {"unsupported": f"a Normalize module of {config['module_input_name']!r}"}
    return {"normalize": True}


def _prompt_settings(path: Path) -> dict:
    """config_sentence_transformers.json's prompts {name: text prepended to each input} and the default one."""
    if not path.exists():
        return {}
    config = read_json_object(path, "", CheckpointError)
    prompts, default = config.get("prompts") or {}, config.get("default_prompt_name")
    if not isinstance(prompts, dict) or not all(isinstance(text, str) for text in prompts.values()):
        raise CheckpointError(f"{path}: prompts must be an object {{name: text}}, got {str(prompts)[:80]}; fix it.")
    if default is not None and default not in prompts:
        raise CheckpointError(f"{path}: default_prompt_name {default!r} is not one of its prompts {list(prompts)}; "
                              f"fix it or set it to null.")
    settings = {"prompts": dict(prompts)} if prompts else {}
    return settings | ({"default_prompt": default} if default is not None else {})


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
    layer = re.escape(cfg.family.layer_keys.prefix).replace(r"\{i\}", r"(\d+)")
    found = {int(m.group(1)) for key in tensors if (m := re.match(rf"(?:\w+\.)?{layer}\.", key))}
    if not found:
        return  # the weights have no layer at all: convert() names the missing keys
    said = cfg.num_hidden_layers
    if said > max(found) + 1:
        raise CheckpointError(f"{source}: config.json says num_hidden_layers = {said}, but the weights have "
                              f"{max(found) + 1}. Fix config.json (or use the config that came with these weights).")

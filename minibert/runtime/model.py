"""`minibert.load` and `Model`: a loaded checkpoint with its tokenizer and hook-aware forward passes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from minibert.core.config import Config
from minibert.core.contract import StaticFn, metric_function, metric_values, traced_call
from minibert.core.encoder import NO_DROPOUT, Dropout, Encoder, Output, position_rows, unrolled_stack
from minibert.core.hooks import (
    Cache,
    HookError,
    HookFn,
    HookPoints,
    Recorder,
    add_delta,
    count_compile,
    count_compiles,
    resolve_names,
    writers_for,
)
from minibert.errors import InputError
from minibert.io import checkpoint, sources
from minibert.io.config_json import read_config
from minibert.io.tokenizer import BaseTokenizer, Batch, is_text
from minibert.io.tokenizers_hf import tokenizer_for
from minibert.runtime import buckets, cache, pooling, programs
from minibert.runtime.device import adopted, all_on_device, host_copy, unstacked
from minibert.runtime.pooling import (
    POOLINGS as POOLINGS,  # minibert.runtime.model.POOLINGS, pooled_tokens: as the docs name them
)
from minibert.runtime.pooling import pooled_tokens as pooled_tokens
from minibert.runtime.weights import Weights
from minibert.runtime.weights import (
    parameter_shapes as parameter_shapes,  # minibert.runtime.model.parameter_shapes (docs/training.md)
)


@struct.dataclass
class Inputs:
    """A batch checked and placed on the device (`Model.inputs`): int32 arrays [B, T], a pytree.

    Every Model method and analysis takes an Inputs where it takes a batch, and does not check it again.
    Build one yourself only from arrays you know are valid (ids in the vocabulary, a 0/1 mask).
    """

    input_ids: jax.Array
    token_type_ids: jax.Array
    attention_mask: jax.Array  # 1 = a real token, 0 = padding
    position_ids: jax.Array | None = None  # position-table rows [B, T] or [1, T]; None: the family's numbering

    @property
    def shape(self) -> tuple[int, int]:
        """(B, T): rows and tokens per row."""
        return tuple(self.input_ids.shape)

    def padded_to(self, length: int, pad_id: int) -> Inputs:
        """These rows padded on the right to [B, length]: pad_id tokens, masked, reading position row 0; on the host
        (NumPy) unless traced, for Model.inputs to move in one call."""
        return Inputs(buckets.padded_rows(self.input_ids, length, pad_id), buckets.padded_rows(self.token_type_ids,
                      length), buckets.padded_rows(self.attention_mask, length), buckets.padded_rows(
                      self.position_ids, length))


def as_inputs(inputs) -> Inputs:
    """An Inputs, or the (input_ids, token_type_ids, attention_mask) tuple Model.inputs returned before."""
    return inputs if isinstance(inputs, Inputs) else Inputs(*inputs)


def load(name: str | Path | None = None, *, dtype=jnp.float32, download: bool = False,
         allow_pickle: bool = False, architecture: str | None = None, allow_nonfinite: bool = False) -> Model:
    """Load a BERT checkpoint: a directory, a `weights/` name, the bundled default, or a Hub id.

    `dtype`: parameter and compute dtype (float32, or bfloat16 for speed on accelerators).
    `download`: fetch from the Hugging Face Hub if not found locally (never done silently).
    `allow_pickle`: read a `pytorch_model.bin` (unpickles; only for files you trust).
    `architecture`: override config.json's head, e.g. "BertModel" to drop a head.
    `allow_nonfinite`: load weights holding NaN or infinities (refused by default, naming the tensor).
    """
    dtype = _checked_dtype(dtype)
    directory = sources.resolve(name, download=download)
    model_dir, pooling = checkpoint.sentence_transformers_layout(directory)
    cfg = read_config(model_dir, architecture=architecture)
    bin_path = model_dir / "pytorch_model.bin"
    if allow_pickle and bin_path.exists() and not (model_dir / "model.safetensors").exists():
        tensors = checkpoint.read_pytorch_bin(bin_path, allow_pickle=True)
    else:
        tensors = checkpoint.read_safetensors(model_dir)
    checkpoint.check_config(cfg, tensors, source=str(model_dir))
    params = checkpoint.convert(tensors, cfg, dtype=dtype, source=str(model_dir), allow_nonfinite=allow_nonfinite)
    return Model(cfg, params, tokenizer_for(model_dir, cfg), dtype=dtype, pooling=pooling, source=str(directory))


def _checked_dtype(dtype):
    """The floating dtype to compute in; anything else (int32, a typo) is an error naming the choices."""
    try:
        checked = jnp.dtype(dtype)
    except TypeError:
        checked = None
    if checked is None or not jnp.issubdtype(checked, jnp.floating):
        raise InputError(f"dtype {dtype!r} is not a floating-point type; pass jnp.float32 (exact parity), "
                         f"jnp.bfloat16 or jnp.float16 (faster on accelerators).")
    return checked


def _check_whole_numbers(name: str, value: np.ndarray) -> None:
    """Ids and token types are whole numbers; a float such as 1012.7 would be cut to 1012, silently."""
    if value.dtype == bool or np.issubdtype(value.dtype, np.integer):
        return
    if not np.issubdtype(value.dtype, np.floating):
        raise InputError(f"{name} must be an int array [B, T]; got dtype {value.dtype}. Pass the arrays "
                         f"model.tokenize makes.")
    fractional = ~np.isfinite(value) | (value != np.round(value))
    if fractional.any():
        raise InputError(f"{name} must hold whole numbers; found {value[fractional][0]} in a {value.dtype} array. "
                         f"Pass an int array, as model.tokenize makes.")


def _cut_output(out: Output, length: int, heads) -> Output:
    """The Output fields with a token axis (hidden states; logits of per-token heads) cut back to the real length."""
    per_token = heads.mlm or heads.classifier == "token" or heads.discriminator
    cut = {"last_hidden_state": buckets.cut_axes(out.last_hidden_state, "BT", length)}
    if per_token and out.logits is not None:
        cut["logits"] = buckets.cut_axes(out.logits, "BT", length)
    return out.replace(**cut)


class Model(Weights):
    """A BERT encoder with its tokenizer. Every forward is jit-compiled; hooks run inside the jit. Its weights by
    name (named_parameters, layer_weights), by role (weights: q, k, v, o, w_in, w_gate, …) and under
    TransformerLens' names (W_Q … b_out, W_E, W_pos) are `weights.Weights`'."""

    def __init__(self, config: Config, params: Mapping | None = None, tokenizer: BaseTokenizer | None = None, *,
                 dtype=jnp.float32, pooling: dict | None = None, source: str = "<memory>", seed: int | None = None,
                 scan: bool = True):
        """`params`: nested minibert params (checkpoint.convert); None gives a random model (seed). `scan`: run the
        blocks as one jax.lax.scan where they are alike (encoder.Encoder.stack; False: unrolled, a copy per layer).
        The process's first Model sets up the persistent compilation cache (runtime.cache; never at import)."""
        cache.use_persistent_cache()
        self.config, self.tokenizer, self.dtype, self.pooling, self.source = config, tokenizer, dtype, pooling, source
        if params is None:
            module = Encoder(config, dtype=dtype, rngs=nnx.Rngs(seed or 0), scan=scan)
            self.graphdef, self.state = nnx.split(module)
        else:
            self.graphdef, self.state = nnx.split(nnx.eval_shape(lambda: Encoder(config, dtype=dtype, scan=scan)))
            nnx.replace_by_pure_dict(self.state, params)
        self.programs = programs.Programs(self)  # compile management: traces, limit, buckets (docs/compiled.md)
        self._hook_compiles: dict = {}  # programs compiled per hook code (hooks.count_compiles warns on many)
        self._forward_jit = self.jit(Model._forward, static_argnames=("capture", "writer_def"))
        self._stage_jit = self.jit(Model._stage, static_argnames=("stage", "capture", "writer_def"))
        self._grad_jit = self.jit(Model._grad, static_argnames=("writer_def", "names", "loss_fn"))
        self._hook_sites: dict | None = None

    def __repr__(self):
        c = self.config
        return (f"Model({c.family.name} {c.architecture}: {c.num_hidden_layers} layers, {c.num_attention_heads} heads, "
                f"{c.hidden_size} wide, {self.param_count():,} params, from {self.source})")

    def save(self, directory: str | Path, *, overwrite: bool = False) -> Path:
        """Write this model as a Hugging Face directory — config.json with `architectures`, model.safetensors
        with transformers' key names, the tokenizer files — that AutoModelFor… and minibert.load read. A
        directory already holding files of those names is refused unless overwrite=True."""
        return checkpoint.save(self, directory, overwrite=overwrite)

    # ---- positions ------------------------------------------------------------------------------------

    def position_ids(self, input_ids):
        """The position-table row of every token by this family's rule: [1, T] rows 0…T−1, or RoBERTa's [B, T]
        counting real tokens from pad_token_id + 1. NumPy in, NumPy out; JAX in, JAX out."""
        return position_rows(input_ids, self.config.pad_token_id, self.config.family.position_offset)

    # ---- inputs ---------------------------------------------------------------------------------------

    def padded(self, batch, length: int) -> Inputs:
        """The batch's Inputs padded on the right to `length` tokens per row: masked padding, which no real token
        reads, so real tokens keep their values (up to rounding)."""
        inputs = self._host_inputs(batch)
        if not inputs.shape[1] <= length <= self.config.max_tokens:
            raise InputError(f"cannot pad rows of {inputs.shape[1]} tokens to {length}: the length must lie between "
                             f"them and the model's {self.config.max_tokens} positions.")
        return self.inputs(inputs if length == inputs.shape[1] else inputs.padded_to(length, self.config.pad_token_id))

    def tokenize(self, texts, pairs=None, *, max_length: int | None = None, padding: str = "longest") -> Batch:
        """Texts (and second texts; a None pair leaves its row single) → a Batch. max_length truncates (longest
        first); padding="max_length" also pads every row to max_length, "longest" to the longest row."""
        if self.tokenizer is None:
            raise InputError("this model was built without a tokenizer; pass token ids (a dict with input_ids) "
                             "instead.")
        return self.tokenizer(texts, pairs, max_length=max_length, padding=padding)

    def to_str_tokens(self, text) -> list:
        """TransformerLens' to_str_tokens: a text → its tokens, special ones included (['[CLS]', 'hi', '[SEP]']);
        a list of texts → one such list per text (no padding); token ids [T] or [B, T] → their tokens."""
        if is_text(text):
            batch = self.tokenize(text)
            rows = [batch.real_tokens(row) for row in range(len(batch))]
            return rows[0] if isinstance(text, str) else rows
        ids = np.asarray(text)
        if ids.ndim not in (1, 2) or not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"to_str_tokens takes a text, a list of texts or int token ids [T] or [B, T]; got "
                             f"{type(text).__name__} of shape {ids.shape}.")
        if self.tokenizer is None:
            raise InputError("this model was built without a tokenizer; it has no token strings for ids.")
        if ids.ndim == 1:
            return self.tokenizer.convert_ids_to_tokens(ids)
        return [self.tokenizer.convert_ids_to_tokens(row) for row in ids]

    def inputs(self, batch, *, position_ids=None) -> Inputs:
        """A Batch, a dict of id arrays, or text(s) → checked int32 arrays on the device (an Inputs, which every
        method takes in place of a batch without checking it again; an Inputs passed here comes back as is).

        `position_ids` [B, T] or [1, T] (or a dict's "position_ids"): the position-table row each token reads,
        instead of the family's numbering (e.g. positions restarting at each document packed in a row).
        """
        inputs = self._host_inputs(batch, position_ids=position_ids)
        on_host = {field.name: getattr(inputs, field.name) for field in dataclasses.fields(inputs)
                   if isinstance(getattr(inputs, field.name), np.ndarray)}
        return inputs.replace(**all_on_device(on_host)) if on_host else inputs  # the batch moves in one call

    def _host_inputs(self, batch, *, position_ids=None) -> Inputs:
        """Model.inputs' checked arrays left on the host (NumPy int32), so that a call pads them there and moves the
        batch to the device once (an Inputs given comes back with its arrays where they are)."""
        if isinstance(batch, Inputs):
            return batch if position_ids is None else batch.replace(position_ids=self._checked_positions(
                position_ids, batch.shape))
        if is_text(batch):
            batch = self.tokenize(batch)
        if not isinstance(batch, (Batch, Mapping)):
            pairs = isinstance(batch, (list, tuple)) and bool(batch) and all(
                isinstance(row, (list, tuple)) and len(row) == 2 and all(isinstance(t, str) for t in row)
                for row in batch)
            hint = (" (sentence pairs as (A, B) tuples: pass model.tokenize([a for a, b in pairs], "
                    "pairs=[b for a, b in pairs]))" if pairs else "")
            raise InputError(f"a batch is a text, a list of texts, a Batch (model.tokenize) or a dict of id arrays; "
                             f"got {type(batch).__name__}{hint}.")
        fields = batch.to_dict() if isinstance(batch, Batch) else dict(batch)
        if "input_ids" not in fields:
            raise InputError("a batch needs input_ids; pass model.tokenize(texts) or a dict with input_ids [B, T].")
        ids = np.asarray(fields["input_ids"])
        if ids.ndim != 2 or ids.size == 0:
            raise InputError(f"input_ids must be a non-empty int array [B, T]; got shape {ids.shape}. "
                             f"Wrap a single sequence as [[...]] and pass at least one text.")
        types = np.asarray(fields.get("token_type_ids", np.zeros_like(ids)))
        mask = np.asarray(fields.get("attention_mask", np.ones_like(ids)))
        for name, value in (("token_type_ids", types), ("attention_mask", mask)):
            if value.shape != ids.shape:
                raise InputError(f"{name} has shape {value.shape} but input_ids has {ids.shape}; they must match.")
        _check_whole_numbers("input_ids", ids)
        _check_whole_numbers("token_type_ids", types)
        if not np.isin(mask, (0, 1)).all():  # a 0.5 would run as 0: mask out the token, silently
            raise InputError(f"attention_mask must hold only 1 (a real token) and 0 (padding); found "
                             f"{np.unique(mask[~np.isin(mask, (0, 1))])[:5].tolist()}.")
        cfg = self.config
        if ids.shape[1] > cfg.max_tokens:
            raise InputError(
                f"the batch has {ids.shape[1]} tokens per row but this model has {cfg.max_tokens} "
                f"positions; tokenize with max_length={cfg.max_tokens} to truncate, or split the text.")
        if ids.min() < 0 or ids.max() >= cfg.vocab_size:
            raise InputError(f"input_ids must lie in [0, {cfg.vocab_size}); found {ids.min()}…{ids.max()}. "
                             f"Were they made with another model's tokenizer?")
        # A model without a segment table (DistilBERT, DeBERTa-v3) reads no token_type_ids: the 0 and 1 that
        # Hugging Face's tokenizers give sentence A and B are accepted and ignored.
        segments = cfg.type_vocab_size if cfg.family.token_types else max(cfg.type_vocab_size, 2)
        if types.min() < 0 or types.max() >= segments:
            raise InputError(f"token_type_ids must lie in [0, {segments}); found {types.min()}…{types.max()}.")
        positions = fields.get("position_ids") if position_ids is None else position_ids
        positions = None if positions is None else self._checked_positions(positions, ids.shape)
        # copies of minibert's own (device.host_copy): a device array may adopt its host buffer on a CPU
        return Inputs(*(host_copy(a, np.int32) for a in (ids, types, mask)), position_ids=positions)

    def _checked_positions(self, position_ids, shape: tuple[int, int]) -> np.ndarray:
        positions = np.asarray(position_ids)
        if positions.ndim != 2 or positions.shape[0] not in (1, shape[0]) or positions.shape[1] != shape[1]:
            raise InputError(f"position_ids must have shape {tuple(shape)} or (1, {shape[1]}), one row per token; "
                             f"got {positions.shape}.")
        _check_whole_numbers("position_ids", positions)
        rows = self.config.max_position_embeddings
        if positions.min() < 0 or positions.max() >= rows:
            raise InputError(f"position_ids must lie in [0, {rows}) (the rows of the position table); found "
                             f"{positions.min()}…{positions.max()}.")
        return host_copy(positions, np.int32)

    # ---- hook points ----------------------------------------------------------------------------------

    @property
    def hook_sites(self) -> dict[str, tuple[tuple[int, ...], jnp.dtype]]:
        """Every hook point → (shape, dtype) for a batch of 2 × 3 tokens, in forward order."""
        if self._hook_sites is None:
            recorder = Recorder()
            ids = jax.ShapeDtypeStruct((2, 3), jnp.int32)  # shapes only: concrete arrays would compile jnp's ops
            jax.eval_shape(lambda state, ids: nnx.merge(self.graphdef, state)(ids, ids, ids + 1, recorder),
                           self.state, ids)
            self._hook_sites = recorder.sites
        return self._hook_sites

    @property
    def hook_names(self) -> list[str]:
        """Every hook point of this model, in forward order."""
        return list(self.hook_sites)

    def _names(self, spec) -> list[str]:
        return resolve_names(spec, self.hook_names, self.config)

    def hook_points(self, hooks=None, names=()) -> HookPoints:
        """The hooks object of one traced stage: applies `hooks` ({name or glob: fn} or [(name, fn)], as
        run_with_hooks takes them) and captures `names` into its `.captured` dict."""
        capture = self._names(names) if names != () else ()
        cfg = self.config
        return HookPoints(capture, writers_for(hooks, self.hook_names, cfg), cfg.num_attention_heads,
                          cfg.head_dim)

    def _stage_hooks(self, hooks) -> HookPoints:
        return hooks if isinstance(hooks, HookPoints) else self.hook_points(hooks)

    # ---- compiled programs ----------------------------------------------------------------------------

    def jit(self, fn: Callable, *, static_argnames: Sequence[str] = (), what: str | None = None) -> Callable:
        """`fn(model, *args, **kwargs)` compiled with jax.jit for this model, each trace counted in
        `model.programs.traces`.

        Made once per (fn, static_argnames) and kept on the model, so repeated calls reuse the compiled
        programs; pass `model.state` as an argument (weights traced, not baked into the program). `what` (an
        analysis's name): each call that compiles a program says "minibert: compiling {what} (first use for these
        shapes) …" on stderr (programs.say_compiling; MINIBERT_QUIET_COMPILES=1 silences it).
        """
        return self.programs.program(fn, static_argnames, what)

    # ---- forward passes -------------------------------------------------------------------------------

    def _hook_points(self, writer_leaves, writer_def, capture: frozenset, shape: tuple[int, ...],
                     stacked: bool = False) -> HookPoints:
        """The hooks of one traced forward of a batch of `shape` [B, T], from its writers flattened to traced
        leaves (stacked: HookPoints')."""
        writers = jax.tree_util.tree_unflatten(writer_def, writer_leaves)
        count_compiles(writers, self._hook_compiles, shape)
        return HookPoints(capture, writers, self.config.num_attention_heads, self.config.head_dim, stacked)

    def _forward(self, state, inputs: Inputs, writer_leaves, capture: frozenset, writer_def, dropout=NO_DROPOUT,
                 first_token_only: bool = False):
        hooks = self._hook_points(writer_leaves, writer_def, capture, inputs.shape, stacked=True)
        out = self._module(state)(inputs.input_ids, inputs.token_type_ids, inputs.attention_mask, hooks,
                                  inputs.position_ids, dropout, first_token_only)
        return out, hooks.captured

    def _stage(self, state, x, inputs: Inputs, writer_leaves, stage, capture: frozenset, writer_def):
        """One stage of the forward (embedding, block `stage`, or the head), for streaming captures to host."""
        hooks = self._hook_points(writer_leaves, writer_def, capture, inputs.shape)
        if stage == "embed":
            out = self.embed(state, inputs, hooks)
        elif stage == "head":
            out = self.head(state, x, hooks)
        else:
            out = self.block(state, stage, x, inputs, hooks)
        return out, hooks.captured

    def forward_fn(self, names=(), hooks: Mapping[str, Callable] | None = None, *,
                   dropout: Mapping[str, float] | None = None, first_token_only: bool = False,
                   stacked: bool = False, writer_def=None) -> Callable:
        """A pure function `(state, inputs) -> (Output, {name: value})` to compose inside your own
        jit, vmap, grad or sharded program; `inputs` = model.inputs(batch), `state` = model.state, model.params (the
        nested dict) or model.state_from(named parameters).

        `dropout`: training's rates {"hidden": …, "attention": …, "classifier": …} (model.Dropout); the function
        then takes a third argument, the PRNG key its masks are drawn from, so one step is reproducible.
        `first_token_only`: the last block computes position 0 alone (encoder.Encoder.first_token_suffices: a head that
        reads [CLS] only; training's sequence classifier), so last_hidden_state is [B, 1, D].
        `stacked`: the values of a site captured at several layers of a scanned run come back as one [n, ...] array
        named hooks.stacked_name ("blocks.0,1,2.attn.hook_pattern"), as Model.run's program returns them
        (runtime.device.unstacked splits them): a program capturing every layer then compiles in a time that does not
        grow with depth.
        `writer_def`: in place of `hooks`, the structure of hooks already keyed and flattened for one run
        (jax.tree_util.tree_flatten(hooks.writers_for(...))); the function then takes their leaves as `writer_leaves=`,
        arguments of the program around it (new hook arrays reuse it: training's step), and no trace of it keys or
        flattens the hooks again."""
        capture = frozenset(self._names(names)) if names != () else frozenset()
        if writer_def is None:
            leaves, writer_def = jax.tree_util.tree_flatten(writers_for(hooks, self.hook_names, self.config))
        elif hooks is not None:
            raise InputError("forward_fn: pass hooks or writer_def (hooks already flattened), not both.")
        else:
            leaves = None  # given at each call
        rates = _dropout_rates(dropout)

        def forward(state, inputs, dropout_key=None, *, writer_leaves=None):
            if (rates is None) != (dropout_key is None):
                raise InputError("forward_fn: a dropout key goes with dropout rates: pass both "
                                 "(forward_fn(dropout={...}) then fn(state, inputs, key)) or neither.")
            if (leaves is None) != (writer_leaves is not None):
                raise InputError("forward_fn: writer_leaves go with writer_def: pass both (forward_fn(writer_def=...) "
                                 "then fn(state, inputs, writer_leaves=...)) or neither.")
            drop = NO_DROPOUT if rates is None else Dropout(dropout_key, **rates)
            out, captured = self._forward(state, as_inputs(inputs), leaves if leaves is not None else writer_leaves,
                                          capture, writer_def, drop, first_token_only)
            return out, captured if stacked else unstacked(captured, host=False)

        return self.programs.counted(forward)

    # ---- stages: pure functions of (state, ...) to compose inside a jit, vmap or grad -----------------------

    def embed(self, state, inputs: Inputs, hooks=None) -> jax.Array:
        """The residual stream entering block 0, [B, T, D]. `hooks`: as run_with_hooks takes them, or HookPoints."""
        inputs = as_inputs(inputs)
        return self._module(state).embedding(inputs.input_ids, inputs.token_type_ids, self._stage_hooks(hooks),
                                             inputs.position_ids)

    def block(self, state, layer: int, resid, inputs: Inputs, hooks=None) -> jax.Array:
        """Block `layer` (a Python int) on the residual stream resid [B, T, D] entering it → its output [B, T, D]."""
        module = self._module(state)
        return module.block(layer, resid, module.key_mask(as_inputs(inputs).attention_mask), self._stage_hooks(hooks))

    def suffix(self, state, layer, resid, inputs: Inputs, hooks=None) -> Output:
        """The forward's Output from resid [B, T, D], the residual stream entering block `layer`: blocks
        layer…L−1, then the head. `layer` may be traced (an int32 array): each block then sits behind a
        `lax.cond(i >= layer)`, so one compiled program serves every layer and the blocks before it are
        skipped at run time (under grad and vmap too, as long as `layer` itself is not vmapped)."""
        module, hooks = self._module(state), self._stage_hooks(hooks)
        key_mask = module.key_mask(as_inputs(inputs).attention_mask)
        return module.head(module.stack(resid, key_mask, hooks, start=layer), hooks)

    def head(self, state, hidden, hooks=None) -> Output:
        """The pooler and task head on the last hidden state [B, T, D] (any stream, for the logit lens)."""
        return self._module(state).head(hidden, self._stage_hooks(hooks))

    def run(self, batch, *, names=(), hooks: Mapping[str, Callable] | None = None,
            offload: bool = False) -> tuple[Output, Cache]:
        """The general forward: capture `names` (list, glob or predicate) while `hooks` rewrite values.

        offload=True runs block by block and moves each block's captures to host memory (NumPy) as soon as
        it is produced, so capturing everything of a large batch needs one block's worth of device memory.
        """
        inputs = self._host_inputs(batch)  # padded on the host, then moved to the device once
        capture = frozenset(self._names(names)) if names != () else frozenset()
        writers = writers_for(hooks, self.hook_names, self.config)  # each hook keyed once for this call
        leaves, writer_def = jax.tree_util.tree_flatten(writers)
        # Rows are padded to a bucket length (docs/compiled.md) where the hooks cannot tell, so that a new sentence
        # length rarely compiles a new program; outputs and captures are cut back to the real length. The hooks are
        # probed (pads_safely_under) only where the bucket is longer than the rows: a probe traces each hook twice.
        length = inputs.shape[1]
        calls = self.programs.called(inputs.shape)  # a recurring batch shape gets its tight bucket
        if buckets.every_row_real(inputs.attention_mask):
            padded = self.programs.padded_length(length, inputs.shape[0], calls=calls)
            if padded != length and self.programs.pads_safely_under(writers, inputs.shape[0]):
                inputs = inputs.padded_to(padded, self.config.pad_token_id)
        inputs = self.inputs(inputs)
        if not offload:
            out, captured = self._forward_jit(self.state, inputs, leaves, capture=capture, writer_def=writer_def)
        else:
            captured, out = {}, None
            for stage in ["embed", *range(self.config.num_hidden_layers), "head"]:
                out, values = self._stage_jit(self.state, out, inputs, leaves, stage=stage, capture=capture,
                                              writer_def=writer_def)
                captured |= {name: np.asarray(value) for name, value in values.items()}
        captured = unstacked(captured)  # a scanned run's buffers, split outside the program (NumPy views on a CPU)
        if inputs.shape[1] != length:
            out = _cut_output(out, length, self.config.heads)
            captured = {n: buckets.cut(n, v, length) for n, v in captured.items()}
        # On a CPU the cuts and splits are NumPy views: back to JAX in one call that copies each once, on the host,
        # into a buffer the device array adopts (device.adopted). offload's captures stay NumPy, as asked.
        if offload:
            out = adopted(out)
        else:
            out, captured = adopted((out, captured))
        return out, Cache(captured, self.hook_names)

    def __call__(self, batch) -> Output:
        return self.run(batch)[0]

    def run_with_cache(self, batch, names=None, *, names_filter=None, offload: bool = False) -> tuple[Output, Cache]:
        """Forward pass that stores the hook values named (None: every hook point); `names_filter` is
        TransformerLens' name for `names`."""
        if names is not None and names_filter is not None:
            raise HookError("pass names or names_filter (TransformerLens' name for it), not both.")
        return self.run(batch, names=names if names_filter is None else names_filter, offload=offload)

    def run_with_hooks(self, batch, hooks=None, *, fwd_hooks=None) -> Output:
        """Forward pass where each `fn(value, ctx)` in `hooks` replaces its value: {name or glob: fn}, or a list of
        (name, fn) pairs; `fwd_hooks` is TransformerLens' keyword for the list."""
        if hooks is not None and fwd_hooks is not None:
            raise HookError("pass hooks or fwd_hooks (TransformerLens' name for it), not both.")
        return self.run(batch, hooks=hooks if fwd_hooks is None else fwd_hooks)[0]

    def grad(self, batch, loss_fn: Callable[[Output], jax.Array], names,
             hooks: Mapping[str, Callable] | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
        """(loss, {hook name: ∂loss/∂value}) for `loss_fn(output)` and the hook values `names`.

        loss_fn follows the one contract of metric_values: one value per batch row [B], or one for the whole
        batch (). A [B] loss is differentiated as its sum — rows do not interact, so each row's values get that
        row's own gradient — and returned as [B]. `names`: as run_with_cache takes them (a name, a list, a glob or a
        predicate; None: every hook point). Where `hooks` rewrite a named value, the gradient is with respect to
        the value they return.

        One compiled program per batch shape, loss_fn and hooks (at the exact length: a loss may read any
        position). loss_fn keys its program as a hook function does (docs/compiled.md): its code and the values it
        closes over or reads as globals, not an attribute of an object changed in place."""
        inputs = self.inputs(batch)
        leaves, writer_def = jax.tree_util.tree_flatten(writers_for(hooks, self.hook_names, self.config))  # keyed
        return self._grad_jit(self.state, inputs, leaves, writer_def=writer_def, names=tuple(self._names(names)),
                              loss_fn=StaticFn(metric_function(loss_fn)))

    def _grad(self, state, inputs: Inputs, writer_leaves, writer_def, names: tuple[str, ...], loss_fn: StaticFn):
        """Model.grad's program: the loss with a zero shift added at each named value (hooks.add_delta), and its
        gradient with respect to the shifts, which is the gradient with respect to the values."""
        user_writers = jax.tree_util.tree_unflatten(writer_def, writer_leaves)
        count_compile(loss_fn, "loss_fn", self._hook_compiles, ())  # its versions only: grad runs each length
        # The shapes of the named values, from a forward without the hooks (a hook keeps its value's shape and
        # dtype, hooks._checked): the hooks are traced once, in the objective.
        _, shapes = jax.eval_shape(lambda: self._forward(state, inputs, [], frozenset(names), NO_WRITERS))
        shapes = unstacked(shapes)
        deltas = {name: jnp.zeros(shapes[name].shape, shapes[name].dtype) for name in names}

        def objective(deltas):
            writers = dict(user_writers)
            for name, delta in deltas.items():
                writers[name] = writers.get(name, ()) + (HookFn(add_delta, delta=delta),)
            leaves, writer_def = jax.tree_util.tree_flatten(writers)
            out, _ = self._forward(state, inputs, leaves, frozenset(), writer_def)
            loss = metric_values(traced_call(loss_fn.fn, out, "loss_fn"), inputs.shape[0], "loss_fn")
            return loss.sum(), loss

        with unrolled_stack():  # the scan's backward costs ~2x the unrolled one's (core.encoder.unrolled_stack)
            (_, loss), grads = jax.value_and_grad(objective, has_aux=True)(deltas)
        return loss, grads

    # ---- sentence embeddings --------------------------------------------------------------------------

    def sentence_embeddings(self, batch, mode: str | Sequence[str] | None = None, normalize: bool | None = None,
                            *, pairs=None, prompt: str | None = None, prompt_name: str | None = None) -> jax.Array:
        """[B, D] sentence vectors pooled from the last hidden states: by default as the checkpoint's
        sentence-transformers modules say (Pooling's mode, then Normalize's L2 normalisation), else the mean.

        mode: one of POOLINGS ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"; see
        pooled_tokens), or several, concatenated. normalize: L2-normalise (default: the checkpoint's Normalize).
        Texts (and `pairs`, second texts as in tokenize) are prepared as sentence-transformers' encode prepares
        them: `prompt` (or the checkpoint's prompt named `prompt_name`, or its default prompt) is prepended to
        each first text, every text is lower-cased where sentence_bert_config.json says do_lower_case, and rows
        are truncated to its max_seq_length (else the tokenizer's model_max_length). A Batch or id arrays run as
        given (no default prompt). A checkpoint with modules minibert does not compute (Dense, …) is refused
        unless `mode` asks for a pooling of the encoder's own hidden states.
        """
        return pooling.sentence_embeddings(self, batch, mode, normalize, pairs, prompt, prompt_name)


NO_WRITERS = jax.tree_util.tree_structure({})  # the writer_def of a forward without hooks

DROPOUT_SITES = ("hidden", "attention", "classifier")  # model.Dropout's rates, as Hugging Face's configs name them


def _dropout_rates(dropout: Mapping[str, float] | None) -> dict[str, float] | None:
    if dropout is None:
        return None
    unknown = set(dropout) - set(DROPOUT_SITES)
    bad = {k: v for k, v in dropout.items() if k not in unknown and not 0.0 <= float(v) < 1.0}
    if unknown or bad:
        raise InputError(f"dropout={dict(dropout)!r}: pass rates in [0, 1) for any of {DROPOUT_SITES}.")
    return dict(dropout)


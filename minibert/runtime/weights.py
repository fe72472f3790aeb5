"""The Model's weights by name: {dotted name: array} as an optimiser sees them, one block weight stacked over the
layers, each block weight by its role (model.weights: q, k, v, o, w_in, w_gate, …, read from the family's
declaration, Family.weight_roles), and TransformerLens' names and orders for them (W_Q … b_out, W_E, W_pos).

`Weights` is a part of `api.Model` (Model inherits it), kept apart so that api.py holds the forward passes: it
reads the Model's `config`, `graphdef` and `state`, and builds a Model with the Model's own constructor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from minibert.core.config import Config
from minibert.core.encoder import Encoder, parameter_names
from minibert.core.family import ROLES, Part, WeightRoles
from minibert.errors import InputError


def _part_of(block: Mapping, part: Part) -> jax.Array | None:
    """The array `part` names in one block's params, its fused index taken; None where the block has no such
    parameter (a family without biases, ModernBERT's block 0 without ln1)."""
    value = block
    for key in part.name.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value if part.index is None else jnp.take(value, part.index, axis=part.axis)


def _role_view(field: dataclasses.Field) -> property:
    shape = field.metadata["shape"]
    return property(lambda self: self.read(field.name),
                    doc=f"[L, {shape}] {field.metadata['what']} ([{shape}] from .layer(i)); None where the "
                        f"family's blocks have none.")


class RoleWeights:
    """A model's block weights by role (model.weights.q, .w_gate, .ln1_scale, …: the roles of
    core.family.WeightRoles, each property documenting its shape), each stacked over the layers [L, ...] in
    minibert's einsum layout whatever the family stores (ALBERT: its one shared block's, L times). Fused weights come
    apart by the family's declaration (Family.weight_roles): ModernBERT's q, k, v are slices of its W_QKV, its
    GeGLU's w_gate and w_in the two halves of its W_in. A role is None where the family's blocks have no such
    weight: w_gate in a dense MLP, biases a checkpoint goes without, ln1 in ModernBERT (its block 0 has none).
    `layer(i)` gives block i's alone, without the L axis. A role is stacked when it is read, not before."""

    def __init__(self, blocks: Sequence[Mapping], roles: WeightRoles, *, stacked: bool = True):
        self._blocks, self._roles, self._stacked = blocks, roles, stacked

    def read(self, role: str) -> jax.Array | None:
        """One role's weights (`role` one of ROLES: "q", "w_gate", "ln1_scale", …)."""
        if role not in ROLES:
            raise InputError(f"{role!r} is not a role of a block's weights; the roles are {', '.join(ROLES)}.")
        part = getattr(self._roles, role)
        arrays = [None if part is None else _part_of(block, part) for block in self._blocks]
        if any(array is None for array in arrays):
            return None
        return jnp.stack(arrays) if self._stacked else arrays[0]

    def written(self, role: str, *axes: str) -> str:
        """How one element of `role` is written in its stored parameter, from the role's own axes (Part.written):
        written("w_gate", ":", "j") is ModernBERT's "W_in[:, 0, j]". A role the family lacks is refused."""
        part = getattr(self._roles, role, None) if role in ROLES else None
        if part is None:
            raise InputError(f"{role!r} is no role this family's blocks hold; they hold "
                             f"{', '.join(r for r in ROLES if getattr(self._roles, r) is not None)}.")
        return part.written(*axes)

    def layer(self, layer: int) -> RoleWeights:
        """Block `layer`'s weights by role, each without the L axis (q [D, H, K], …)."""
        if not self._stacked:
            raise InputError("these are one block's weights already (model.weights.layer(i)); call .layer on "
                             "model.weights itself.")
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(self._blocks):
            raise InputError(f"layer {layer} is not one of the model's {len(self._blocks)} layers (0…"
                             f"{len(self._blocks) - 1}).")
        return RoleWeights([self._blocks[layer]], self._roles, stacked=False)

    def __repr__(self):
        present = [role for role in ROLES if self.read(role) is not None]
        return f"RoleWeights({', '.join(present)})"


for _field in dataclasses.fields(WeightRoles):  # one property per role, documented from the declaration's table
    setattr(RoleWeights, _field.name, _role_view(_field))


def _tl_view(name: str, role: str, doc: str) -> property:
    """A read-only property under TransformerLens' name: model.weights' `role`, [L, ...]; W_Q, W_K, W_V in
    TransformerLens' order [L, H, D, K] (heads before D). A family without the weight is refused by name."""
    def view(self) -> jax.Array:
        stacked = self.weights.read(role)
        if stacked is None:
            raise InputError(f"{self.config.family.name}'s blocks have no {name} (model.weights.{role} is None); "
                             f"blocks hold {_weight_names(self.block_params(0))}.")
        return stacked.transpose(0, 2, 1, 3) if name in ("W_Q", "W_K", "W_V") else stacked

    return property(view, doc=doc)


def _mlp_in_view(name: str, role: str, gate: str, doc: str) -> property:
    """TransformerLens' W_in or b_in: model.weights' `role`, and for a gated MLP its `gate` half before it on the
    next-to-last axis ([L, D, 2, F], [L, 2, F]: gate, then linear)."""
    linear = _tl_view(name, role, doc)

    def view(self) -> jax.Array:
        gated = self.weights.read(gate)
        return linear.fget(self) if gated is None else jnp.stack([gated, linear.fget(self)], axis=-2)

    return property(view, doc=doc)


class Weights:
    """The weight-reading half of api.Model (see the module's docstring)."""

    config: Config
    graphdef: nnx.GraphDef
    state: nnx.State

    @property
    def module(self) -> Encoder:
        """The Flax NNX module (a fresh view of the parameters)."""
        return nnx.merge(self.graphdef, self.state)

    def _module(self, state=None) -> Encoder:
        return nnx.merge(self.graphdef, self.state if state is None else state)

    @property
    def params(self) -> dict:
        return nnx.to_pure_dict(self.state)

    def param_count(self) -> int:
        return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(self.params))

    # ---- parameters by name: what an optimiser sees ---------------------------------------------------------

    @classmethod
    def from_parameters(cls, config: Config, parameters: Mapping[str, jax.Array], tokenizer=None, **kwargs):
        """A Model of `config` whose weights are `parameters`, {dotted name: array} as named_parameters gives them
        (kwargs: Model's own)."""
        shapes = _shape_state(config, kwargs.get("dtype", jnp.float32))
        return cls(config, nnx.to_pure_dict(shaped_as(shapes, parameters)), tokenizer, **kwargs)

    def named_parameters(self) -> dict[str, jax.Array]:
        """{dotted name: array} ("blocks.0.attn.W_Q", "classifier.b"), in the state's leaf order."""
        return by_name(self.state)

    def state_from(self, parameters: Mapping[str, jax.Array]):
        """The state forward_fn takes, from {dotted name: array} (traced ones inside a jit or grad)."""
        return shaped_as(self.state, parameters)

    # ---- a block's weights, stacked over the layers ---------------------------------------------------------

    def block_params(self, layer: int) -> dict:
        """The parameters block `layer` applies: its own, or for ALBERT the one block every layer shares."""
        return self.params["blocks"][0 if self.config.family.shared_layers else layer]

    def _layer_params(self) -> list[dict]:
        """block_params of every layer, from one read of the parameter tree."""
        blocks, shared = self.params["blocks"], self.config.family.shared_layers
        return [blocks[0 if shared else layer] for layer in range(self.config.num_hidden_layers)]

    @property
    def weights(self) -> RoleWeights:
        """Every block's weights by role, stacked over the layers in minibert's einsum layout (model.weights.q
        [L, D, H, K], .w_gate, .ln1_scale …; see RoleWeights), whatever the family fuses."""
        return RoleWeights(self._layer_params(), self.config.family.weight_roles)

    def layer_weights(self, name: str) -> jax.Array:
        """One weight of every block stacked over the layers, [L, ...], by its name inside a block, in minibert's
        einsum layout: "attn.W_Q"/"W_K"/"W_V" [L, D, H, K] (TransformerLens' model.W_Q is [L, H, D, K]: use
        model.W_Q for that order), "attn.b_Q" [L, H, K], "attn.W_O" [L, H, K, D], "attn.b_O" [L, D],
        "ln1.scale"/"ln1.bias" [L, D], "mlp.W_in" [L, D, F], "mlp.b_in" [L, F], "mlp.W_out" [L, F, D],
        "mlp.b_out" [L, D] (ALBERT: its one shared block's, L times). By role, whatever the family fuses:
        model.weights."""
        blocks = self._layer_params()
        arrays = [_part_of(block, Part(name)) for block in blocks]
        if any(array is None for array in arrays):
            raise InputError(f"{name!r} is not a weight of a block; blocks hold {_weight_names(blocks[0])}.")
        return jnp.stack(arrays)

    # ---- TransformerLens' weight names and orders: [L, ...] stacks over the blocks -------------------------------
    # minibert's own block weights keep the einsum layout (model.weights.q is [L, D, H, K]); these give
    # TransformerLens' order under its names, read by role, so code written for HookedTransformer (per-head norms
    # over axes (2, 3), W_Q[l, h] a [D, K] matrix) reads them as is.

    W_Q = _tl_view("W_Q", "q", "[L, H, D, K] query weights, TransformerLens' order (model.weights.q is "
                               "[L, D, H, K]).")
    W_K = _tl_view("W_K", "k", "[L, H, D, K] key weights, TransformerLens' order.")
    W_V = _tl_view("W_V", "v", "[L, H, D, K] value weights, TransformerLens' order.")
    b_Q = _tl_view("b_Q", "b_q", "[L, H, K] query biases.")
    b_K = _tl_view("b_K", "b_k", "[L, H, K] key biases.")
    b_V = _tl_view("b_V", "b_v", "[L, H, K] value biases.")
    W_O = _tl_view("W_O", "o", "[L, H, K, D] output weights of each head (the same order as TransformerLens').")
    b_O = _tl_view("b_O", "b_o", "[L, D] the attention output's bias.")
    W_in = _mlp_in_view("W_in", "w_in", "w_gate", "[L, D, F] the MLP's input weights (a gated MLP's, ModernBERT's "
                                                  "GeGLU: [L, D, 2, F], the gate then the linear half).")
    W_out = _tl_view("W_out", "w_out", "[L, F, D] the MLP's output weights.")
    b_in = _mlp_in_view("b_in", "b_in", "b_gate", "[L, F] the MLP's input bias (a gated MLP's: [L, 2, F]).")
    b_out = _tl_view("b_out", "b_out", "[L, D] the MLP's output bias.")

    # ---- the embedding tables -------------------------------------------------------------------------------

    @property
    def W_E(self) -> jax.Array:
        """The word-embedding table [V, E] (TransformerLens' name), which the MLM head also unembeds with."""
        return self._module().embed.word[...]

    @property
    def W_pos(self) -> jax.Array:
        """The position-embedding table [max_position_embeddings, E] (TransformerLens' name)."""
        return self._position_table(self._module())

    def position_embeddings(self, position_ids, state=None) -> jax.Array:
        """The position table's rows [..., E] for `position_ids` (inside a jit, pass the traced `state`)."""
        return self._position_table(self._module(state))[position_ids]

    def _position_table(self, module: Encoder) -> jax.Array:
        if self.config.family.positions != "table":  # ModernBERT rotates q and k instead (attn.hook_rot_q)
            raise InputError(f"{self.config.family.name} has no position-embedding table: its positions are "
                             f"{self.config.family.positions} (in attention), not rows added to the embeddings.")
        return module.embed.position[...]



def parameter_shapes(config: Config, dtype=jnp.float32) -> dict[str, jax.ShapeDtypeStruct]:
    """{dotted name: shape and dtype} of the parameters a Model of `config` holds, without making them."""
    state = _shape_state(config, dtype)
    return dict(zip(parameter_names(state), jax.tree_util.tree_leaves(state)))


def _shape_state(config: Config, dtype):
    return nnx.state(nnx.eval_shape(lambda: Encoder(config, dtype=dtype)))


def by_name(tree) -> dict[str, jax.Array]:
    """{dotted name: leaf} of a parameter tree: the State, the nested params dict (model.params) or a part of
    either (training's trainable parameters), in its leaf order."""
    return dict(zip(parameter_names(tree), jax.tree_util.tree_leaves(tree)))


def shaped_as(like, parameters: Mapping[str, jax.Array]):
    """A tree shaped as `like` (a State, a nested params dict, a part of either) holding `parameters` {dotted name:
    array}: by_name's inverse."""
    names = parameter_names(like)
    missing = [name for name in names if name not in parameters]
    if missing:
        raise InputError(f"{len(missing)} of the model's parameters are missing ({', '.join(missing[:3])}, …): "
                         f"pass every name of model.named_parameters().")
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), [parameters[name] for name in names])


def _weight_names(tree: Mapping, prefix: str = "") -> str:
    """The dotted names of a nested params dict's leaves, e.g. "attn.W_Q, attn.b_Q, …"."""
    return ", ".join(_weight_names(value, f"{prefix}{key}.") if isinstance(value, Mapping) else f"{prefix}{key}"
                     for key, value in tree.items())

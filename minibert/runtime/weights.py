"""The Model's weights by name: {dotted name: array} as an optimiser sees them, one block weight stacked over the
layers, and TransformerLens' names and orders for them (W_Q … b_out, W_E, W_pos).

`Weights` is a part of `api.Model` (Model inherits it), kept apart so that api.py holds the forward passes: it
reads the Model's `config`, `graphdef` and `state`, and builds a Model with the Model's own constructor.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from minibert.core.config import Config
from minibert.core.encoder import Bert, parameter_names
from minibert.errors import InputError


def _stacked_view(name: str, doc: str) -> property:
    """A read-only property under TransformerLens' name: layer_weights(name), [L, ...]."""
    return property(lambda self: self.layer_weights(name), doc=doc)


def _qkv_view(kind: str, which: str, doc: str) -> property:
    """A read-only property: the query, key or value weights (kind "W", [L, H, D, K]: TransformerLens' order, heads
    before D) or biases (kind "b", [L, H, K]) of every block, from the fused [3, ...] weight where the family fuses
    q, k and v."""
    def view(self) -> jax.Array:
        if f"{kind}_{which}" in self.block_params(0)["attn"]:
            stacked = self.layer_weights(f"attn.{kind}_{which}")
        else:
            stacked = self.layer_weights(f"attn.{kind}_QKV")[:, "QKV".index(which)]
        return stacked.transpose(0, 2, 1, 3) if kind == "W" else stacked

    return property(view, doc=doc)


class Weights:
    """The weight-reading half of api.Model (see the module's docstring)."""

    config: Config
    graphdef: nnx.GraphDef
    state: nnx.State

    @property
    def module(self) -> Bert:
        """The Flax NNX module (a fresh view of the parameters)."""
        return nnx.merge(self.graphdef, self.state)

    def _module(self, state=None) -> Bert:
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
        return cls(config, nnx.to_pure_dict(_state_of(shapes, parameters)), tokenizer, **kwargs)

    def named_parameters(self) -> dict[str, jax.Array]:
        """{dotted name: array} ("blocks.0.attn.W_Q", "classifier.b"), in the state's leaf order."""
        return dict(zip(parameter_names(self.state), jax.tree_util.tree_leaves(self.state)))

    def state_from(self, parameters: Mapping[str, jax.Array]):
        """The state forward_fn takes, from {dotted name: array} (traced ones inside a jit or grad)."""
        return _state_of(self.state, parameters)

    # ---- a block's weights, stacked over the layers ---------------------------------------------------------

    def block_params(self, layer: int) -> dict:
        """The parameters block `layer` applies: its own, or for ALBERT the one block every layer shares."""
        return self.params["blocks"][0 if self.config.family.shared_layers else layer]

    def layer_weights(self, name: str) -> jax.Array:
        """One weight of every block stacked over the layers, [L, ...], by its name inside a block, in minibert's
        einsum layout: "attn.W_Q"/"W_K"/"W_V" [L, D, H, K] (TransformerLens' model.W_Q is [L, H, D, K]: use
        model.W_Q for that order), "attn.b_Q" [L, H, K], "attn.W_O" [L, H, K, D], "attn.b_O" [L, D],
        "ln1.scale"/"ln1.bias" [L, D], "mlp.W_in" [L, D, F], "mlp.b_in" [L, F], "mlp.W_out" [L, F, D],
        "mlp.b_out" [L, D] (ALBERT: its one shared block's, L times)."""
        def weight(layer):
            value = self.block_params(layer)
            for part in name.split("."):
                if not isinstance(value, Mapping) or part not in value:
                    raise InputError(f"{name!r} is not a weight of a block; blocks hold "
                                     f"{_weight_names(self.block_params(0))}.")
                value = value[part]
            return value
        return jnp.stack([weight(layer) for layer in range(self.config.num_hidden_layers)])

    # ---- TransformerLens' weight names and orders: [L, ...] stacks over the blocks -------------------------------
    # minibert's own block weights keep the einsum layout (layer_weights("attn.W_Q") is [L, D, H, K]); these give
    # TransformerLens' order under its names, so code written for HookedTransformer (per-head norms over axes
    # (2, 3), W_Q[l, h] a [D, K] matrix) reads them as is.

    W_Q = _qkv_view("W", "Q", "[L, H, D, K] query weights, TransformerLens' order (layer_weights('attn.W_Q') is "
                              "[L, D, H, K]).")
    W_K = _qkv_view("W", "K", "[L, H, D, K] key weights, TransformerLens' order.")
    W_V = _qkv_view("W", "V", "[L, H, D, K] value weights, TransformerLens' order.")
    b_Q = _qkv_view("b", "Q", "[L, H, K] query biases.")
    b_K = _qkv_view("b", "K", "[L, H, K] key biases.")
    b_V = _qkv_view("b", "V", "[L, H, K] value biases.")
    W_O = _stacked_view("attn.W_O", "[L, H, K, D] output weights of each head (the same order as TransformerLens').")
    b_O = _stacked_view("attn.b_O", "[L, D] the attention output's bias.")
    W_in = _stacked_view("mlp.W_in", "[L, D, F] the MLP's input weights (ModernBERT's GeGLU: [L, D, 2, F]).")
    W_out = _stacked_view("mlp.W_out", "[L, F, D] the MLP's output weights.")
    b_in = _stacked_view("mlp.b_in", "[L, F] the MLP's input bias.")
    b_out = _stacked_view("mlp.b_out", "[L, D] the MLP's output bias.")

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

    def _position_table(self, module: Bert) -> jax.Array:
        if self.config.family.positions != "table":  # ModernBERT rotates q and k instead (attn.hook_rot_q)
            raise InputError(f"{self.config.family.name} has no position-embedding table: its positions are "
                             f"{self.config.family.positions} (in attention), not rows added to the embeddings.")
        return module.embed.position[...]



def parameter_shapes(config: Config, dtype=jnp.float32) -> dict[str, jax.ShapeDtypeStruct]:
    """{dotted name: shape and dtype} of the parameters a Model of `config` holds, without making them."""
    state = _shape_state(config, dtype)
    return dict(zip(parameter_names(state), jax.tree_util.tree_leaves(state)))


def _shape_state(config: Config, dtype):
    return nnx.state(nnx.eval_shape(lambda: Bert(config, dtype=dtype)))


def _state_of(like, parameters: Mapping[str, jax.Array]):
    """A state shaped as `like` holding `parameters` {dotted name: array}."""
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

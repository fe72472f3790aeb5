"""minibert/runtime/model.py: what `Model` takes as a batch, its defaults, sentence embeddings against NumPy
pooling of the model's own last hidden state, and the boundary analyses stand on (prepared Inputs,
explicit positions, the stages, Model.jit's trace count). Hooks, caches and gradients: test_hooks.py; bad
input: test_errors.py; parity with transformers: test_parity.py."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import LAMBDA, U32, assert_close_to_scale, block_roundings, forward_rtol

from minibert import Batch, Config, InputError, Model
from minibert.families.registry import config_for
from minibert.runtime.model import POOLINGS, Inputs, is_text, parameter_shapes


@pytest.fixture(scope="module")
def tiny():
    cfg = Config(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=12,
                     max_position_embeddings=16)
    return Model(cfg, seed=1)


IDS = np.array([[2, 7, 9, 3, 0, 0], [2, 5, 6, 8, 11, 3]])
MASK = (IDS > 0).astype(np.int32)


@pytest.mark.parametrize("value, text", [
    ("one text", True), (["a", "b"], True), (("a", "b"), True), ([], True),
    ({"input_ids": IDS}, False), (IDS, False), ([[1, 2]], False), (["a", 3], False), (None, False),
])
def test_is_text_tells_texts_from_id_batches(value, text):
    assert is_text(value) is text


def test_inputs_fill_in_types_and_mask_as_int32(tiny):
    inputs = tiny.inputs({"input_ids": IDS})
    ids, types, mask = (np.asarray(a) for a in (inputs.input_ids, inputs.token_type_ids, inputs.attention_mask))
    np.testing.assert_array_equal(ids, IDS)
    np.testing.assert_array_equal(types, np.zeros_like(IDS))
    np.testing.assert_array_equal(mask, np.ones_like(IDS))
    assert {a.dtype for a in (ids, types, mask)} == {np.dtype(np.int32)}


def test_a_batch_and_its_dict_run_the_same(bundled):
    batch = bundled.tokenize(["The cat sat.", "A much longer sentence than the first one."])
    assert isinstance(batch, Batch)
    np.testing.assert_array_equal(bundled(batch).last_hidden_state, bundled(batch.to_dict()).last_hidden_state)
    np.testing.assert_array_equal(bundled(batch).last_hidden_state, bundled(list(batch.texts)).last_hidden_state)


def numpy_pooling(hidden, mask, mode):
    """Pooling by loops over the real tokens of each row."""
    rows = []
    for h, m in zip(np.asarray(hidden, np.float64), mask):
        real = h[m > 0]
        n = len(real)
        weighted = sum((i + 1) * token for i, token in enumerate(real)) / (n * (n + 1) / 2)  # weights 1, 2, …, n
        rows.append({"mean": real.mean(0), "cls": h[0], "max": real.max(0), "lasttoken": real[-1],
                     "mean_sqrt_len_tokens": real.sum(0) / n**0.5, "weightedmean": weighted}[mode])
    return np.array(rows)


@pytest.mark.parametrize("mode", POOLINGS)
@pytest.mark.parametrize("normalize", [False, True])
def test_sentence_embeddings_pool_the_last_hidden_state(tiny, mode, normalize):
    batch = {"input_ids": IDS, "attention_mask": MASK}
    hidden = tiny(batch).last_hidden_state
    expected = numpy_pooling(hidden, MASK, mode)
    if normalize:
        expected /= np.linalg.norm(expected, axis=-1, keepdims=True)
    got = np.asarray(tiny.sentence_embeddings(batch, mode=mode, normalize=normalize))
    # float32 roundings (u = 2⁻²⁴) of values ≤ max|hidden|: the mean's 5 additions and division, then the
    # norm's 8 squares summed, its square root and the division: 16 (the weighted mean's 6 products and 5
    # additions fit too); mean_sqrt_len_tokens is √n times a mean, n ≤ 6 real tokens.
    grows = np.sqrt(MASK.sum(1).max()) if mode == "mean_sqrt_len_tokens" and not normalize else 1.0
    np.testing.assert_allclose(got, expected, rtol=0,
                               atol=16 * 2.0**-24 * grows * max(1.0, float(np.abs(hidden).max())))


def test_sentence_embeddings_default_to_the_checkpoints_setting(bundled, tiny):
    batch = {"input_ids": IDS, "attention_mask": MASK}
    assert tiny.pooling is None  # no sentence-transformers folder: mean, not normalised
    np.testing.assert_array_equal(tiny.sentence_embeddings(batch), tiny.sentence_embeddings(batch, "mean", False))
    assert (bundled.pooling["mode"], bundled.pooling["normalize"]) == ("mean", True)
    norms = np.linalg.norm(np.asarray(bundled.sentence_embeddings(["It's fine.", "Fine."]), np.float64), axis=-1)
    # The float32 normalisation sums D = 384 squares (≤ 384 roundings), takes a root and divides: 386 · u.
    np.testing.assert_allclose(norms, 1.0, rtol=0, atol=386 * 2.0**-24)


def test_unknown_pooling_mode_fails_before_running(tiny):
    traces = tiny.programs.traces
    with pytest.raises(InputError, match="pooling mode 'first' is not one of 'cls', 'max', 'mean'"):
        tiny.sentence_embeddings({"input_ids": IDS[:, :3]}, mode="first")  # a new shape: a run would trace
    assert tiny.programs.traces == traces


# ---- the boundary: prepared inputs, positions, stages, compiled programs ------------------------------------

def test_prepared_inputs_are_named_and_pass_through_unchecked(tiny):
    inputs = tiny.inputs({"input_ids": IDS, "attention_mask": MASK})
    assert isinstance(inputs, Inputs) and inputs.shape == IDS.shape and inputs.position_ids is None
    np.testing.assert_array_equal(inputs.attention_mask, MASK)
    assert tiny.inputs(inputs) is inputs
    np.testing.assert_array_equal(tiny(inputs).last_hidden_state, tiny({"input_ids": IDS, "attention_mask": MASK})
                                  .last_hidden_state)


def test_explicit_positions_read_those_rows_of_the_position_table(tiny):
    positions = np.array([[5, 6, 7, 0, 1, 2], [3, 3, 9, 8, 1, 0]])
    inputs = tiny.inputs({"input_ids": IDS}, position_ids=positions)
    _, cache = tiny.run_with_cache(inputs, names="embed.hook_pos_embed")
    table = np.asarray(tiny.params["embed"]["position"])
    np.testing.assert_array_equal(cache["embed.hook_pos_embed"], table[positions])  # a gather: no rounding
    np.testing.assert_array_equal(tiny.position_embeddings(positions), table[positions])


def test_the_familys_own_positions_given_explicitly_change_nothing(tiny):
    batch = {"input_ids": IDS, "attention_mask": MASK}
    assert tiny.position_ids(IDS).tolist() == [list(range(IDS.shape[1]))]  # BERT: rows 0…T−1 for every row
    explicit = tiny(tiny.inputs(batch, position_ids=tiny.position_ids(IDS))).last_hidden_state
    # Same arithmetic, another program: two programs' roundings of a whole forward.
    assert_close_to_scale(explicit, tiny(batch).last_hidden_state, forward_rtol(tiny.config, S=IDS.shape[1]))


def test_roberta_numbers_positions_from_the_pad_row():
    roberta = Model(config_for("RobertaModel", vocab_size=30, hidden_size=8, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=12, pad_token_id=1, max_position_embeddings=16))
    ids = np.array([[0, 7, 9, 2, 1, 1]])  # fairseq's numbering: real tokens from pad + 1, padding on the pad row
    np.testing.assert_array_equal(roberta.position_ids(ids), [[2, 3, 4, 5, 1, 1]])


@pytest.mark.parametrize("positions, problem", [
    (np.zeros((2, 5), int), "must have shape"), (np.full((1, 6), 16), r"must lie in \[0, 16\)"),
    (np.full((1, 6), 0.5), "whole numbers"),
])
def test_bad_positions_are_named(tiny, positions, problem):
    with pytest.raises(InputError, match=problem):
        tiny.inputs({"input_ids": IDS}, position_ids=positions)


def test_layer_weights_stack_each_blocks_weight(tiny):
    expected = np.stack([np.asarray(tiny.block_params(layer)["attn"]["W_O"]) for layer in range(2)])
    np.testing.assert_array_equal(tiny.layer_weights("attn.W_O"), expected)
    with pytest.raises(InputError, match="attn.W_K, attn.W_O, attn.W_Q"):
        tiny.layer_weights("attn.W_X")


def two_program_block_rtol(config, S: int) -> float:
    """One block computed by two programs: twice one block's roundings (tolerances.block_roundings)."""
    c = config
    return LAMBDA * math.sqrt(2 * block_roundings(c.hidden_size, c.intermediate_size, c.head_dim, S)) * U32


def test_stages_compose_to_the_forward(tiny):
    batch = {"input_ids": IDS, "attention_mask": MASK}
    out, cache = tiny.run_with_cache(batch, names=["hook_full_embed", "blocks.*.hook_resid_pre"])
    inputs, resid = tiny.inputs(batch), cache.stack("hook_resid_pre")  # [L, B, T, D]
    real = MASK.astype(bool)
    rtol = two_program_block_rtol(tiny.config, IDS.shape[1])
    assert_close_to_scale(tiny.embed(tiny.state, inputs), cache["hook_full_embed"], rtol, "embed", real)
    assert_close_to_scale(tiny.block(tiny.state, 0, resid[0], inputs), resid[1], rtol, "block 0", real)
    for layer in range(2):
        assert_close_to_scale(tiny.suffix(tiny.state, layer, resid[layer], inputs).last_hidden_state,
                              out.last_hidden_state, forward_rtol(tiny.config, S=IDS.shape[1]), f"suffix {layer}",
                              real)


def test_one_traced_suffix_program_serves_every_layer(tiny):
    batch = {"input_ids": IDS, "attention_mask": MASK}
    out, cache = tiny.run_with_cache(batch, names="blocks.*.hook_resid_pre")
    inputs, resid = tiny.inputs(batch), cache.stack("hook_resid_pre")
    program = tiny.jit(lambda model, state, layer, resid, inputs: model.suffix(state, layer, resid, inputs))
    before = tiny.programs.traces
    for layer in range(2):
        got = program(tiny.state, jnp.int32(layer), resid[layer], inputs).last_hidden_state
        assert_close_to_scale(got, out.last_hidden_state, forward_rtol(tiny.config, S=IDS.shape[1]), f"layer {layer}",
                              MASK.astype(bool))
    assert tiny.programs.traces == before + 1


def test_a_forward_fn_traced_inside_a_model_jit_counts_once(tiny):
    forward = tiny.forward_fn("blocks.0.hook_resid_post")

    def mean_resid(model, state, inputs):
        return forward(state, inputs)[1]["blocks.0.hook_resid_post"].mean()

    before = tiny.programs.traces
    inputs = tiny.inputs({"input_ids": IDS[:, :5]})
    tiny.jit(mean_resid)(tiny.state, inputs)
    tiny.jit(mean_resid)(tiny.state, inputs)  # the same program, kept on the model
    assert tiny.programs.traces == before + 1
    jax.jit(forward)(tiny.state, inputs)  # traced alone, it counts itself
    assert tiny.programs.traces == before + 2


def test_named_parameters_rebuild_the_same_model(tiny):
    named = tiny.named_parameters()
    assert sum(int(np.prod(p.shape)) for p in named.values()) == tiny.param_count()
    assert named["blocks.1.attn.W_Q"] is tiny.params["blocks"][1]["attn"]["W_Q"]
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(lambda a, b: a is b, tiny.state_from(named), tiny.state))
    rebuilt = Model.from_parameters(tiny.config, named)
    assert list(rebuilt.named_parameters()) == list(named)
    assert all(np.array_equal(rebuilt.named_parameters()[n], p) for n, p in named.items())
    assert list(parameter_shapes(tiny.config)) == list(named)
    with pytest.raises(InputError, match="missing"):
        tiny.state_from({n: p for n, p in named.items() if n != "blocks.0.ln1.scale"})


def test_forward_fn_with_dropout_drops_and_rescales_each_value(tiny):
    """Inverted dropout at rate 1/2 (torch.nn.Dropout's): each value of the embedding's output entering block 0 is
    0 or twice the value (exact in floating point); hooks see the value before its dropout. Rate 0 is the plain
    forward, to the bit, and one key gives one mask."""
    inputs = tiny.inputs({"input_ids": IDS, "attention_mask": MASK})
    names = ["embed.ln.hook_out", "blocks.0.hook_resid_pre"]
    plain = jax.jit(tiny.forward_fn(names))(tiny.state, inputs)
    key = jax.random.key(3)
    none = jax.jit(tiny.forward_fn(names, dropout={"hidden": 0.0}))(tiny.state, inputs, key)
    assert np.array_equal(none[0].last_hidden_state, plain[0].last_hidden_state)
    dropped = jax.jit(tiny.forward_fn(names, dropout={"hidden": 0.5}))
    out, captured = dropped(tiny.state, inputs, key)
    before, after = np.asarray(captured["embed.ln.hook_out"]), np.asarray(captured["blocks.0.hook_resid_pre"])
    # The embedding's LayerNorm in the dropout program and in the plain one: two programs' rounding of that one
    # stage, bounded as tolerances.forward_rtol bounds one stage (a block's roundings, two programs).
    c = tiny.config
    stage = LAMBDA * math.sqrt(2 * block_roundings(c.hidden_size, c.intermediate_size, c.head_dim, IDS.shape[1])) * U32
    assert_close_to_scale(before, plain[1]["embed.ln.hook_out"], stage, "embedding output")
    kept = after == 2 * before
    assert np.all(kept | (after == 0)) and 0 < kept.mean() < 1
    assert np.array_equal(dropped(tiny.state, inputs, key)[0].last_hidden_state, out.last_hidden_state)
    with pytest.raises(InputError, match="dropout key"):
        tiny.forward_fn(dropout={"hidden": 0.1})(tiny.state, inputs)
    with pytest.raises(InputError, match=r"\[0, 1\)"):
        tiny.forward_fn(dropout={"hiden": 0.1})


def test_head_reads_any_hidden_state(tiny_mlm):
    model, _ = tiny_mlm
    batch = {"input_ids": IDS % model.config.vocab_size, "attention_mask": MASK}
    out = model(batch)
    c = model.config
    # The head alone, two programs: the dense layer (D terms), its LayerNorm (E) and the unembedding (E).
    rtol = LAMBDA * math.sqrt(2 * (c.hidden_size + 2 * c.embed_dim)) * U32
    assert_close_to_scale(model.head(model.state, out.last_hidden_state).logits, out.logits, rtol, "logits",
                          MASK.astype(bool))
    model.block(model.state, 0, out.last_hidden_state, model.inputs(batch))  # the stages take Inputs as they are



"""Length buckets: how many programs a Model compiles for rows of different lengths, and why results do not change.

Every new row length is a new compiled program (seconds of tracing and compiling on a CPU, and memory while it
lives), so Model.run pads the rows of a batch on the right to a bucket length and cuts what it returns back to
the real length. Padding is masked: no real token attends to a padding key, and every other step of the forward
works position by position, so real tokens get the same values up to rounding. A batch with a row of padding
only runs at its exact length (every_row_real): that row has no real key, and its softmax rows would spread over
the bucket's positions.

Three rules (docs/compiled.md, "Compiled programs", has the whole policy and its measured costs):

- INTERACTIVE, Model.run's default (model(batch), run_with_cache, run_with_hooks): 32, 64, 128, 256, 512 — one
  length per doubling from 32 — and a batch of at most FEW_ROWS rows starts at 64: a notebook's single sentences
  of up to ~50 words share one program, texts of 1 to 128 tokens two. A padded row costs up to twice its tokens:
  for a few rows, a few milliseconds on a CPU, where each program it saves costs 50 to 100 times that in tracing
  and compiling (benchmarks/RESULTS.md); a large batch of short texts starts at 32, where padding every row would
  soon cost more than a compile.
- COARSE, two lengths per doubling from 16 (16, 24, 32, 48, 64, 96, …): a row pads by under half its tokens, for
  twice the programs.
- FINE, where many batches share each program and throughput pays for more of them (a survey over a corpus of
  unpacked rows, a long batch job): every length to 31, then 16 per doubling, so no length does more than ~7% more
  work than its exact program (accounting.flops_per_token, over every length to 512).

A batch job pays for padding on every call and a compile once, so under every rule a batch of at least TIGHT_ROWS
rows whose shape [rows, length] recurs runs, from its RECURS_AT-th call, at its TIGHT bucket (1/8 of an octave:
never more than 1.125× its tokens) where that is shorter than the rule's: the first call is served at once by the
rule's program, shared with other lengths; the tight program is compiled when the shape comes back, where it will
be paid back (run_length).

Hooks run on the padded rows too, unless they read the row length: `pads_safely` tries each hook on random
values at two lengths (PROBE_LENGTHS) and keeps the padding only where the first positions come out the same.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from minibert.core.sites import site_axes
from minibert.errors import InputError, is_whole
from minibert.runtime.device import host_buffer, host_view, on_device

INTERACTIVE = (32, 1)  # (smallest, per_octave) of length_buckets: Model.run's default (model.programs.bucket_rule)
FEW_ROWS, FEW_ROWS_SMALLEST = 4, 64  # under INTERACTIVE, a batch of at most 4 rows pads to at least 64 tokens
COARSE = (16, 2)  # half the padding, twice the programs
FINE = (1, 16)  # where throughput pays for programs: model.programs.bucket_rule = FINE
MOST_PER_OCTAVE = 16  # FINE's: more lengths per doubling save under 1/16 of a row and compile a program each
TIGHT = (1, 8)  # a recurring batch shape's buckets: at most 1/8 above its length (≤ 1.125× its tokens)
TIGHT_ROWS = 8  # a batch of at least 8 rows runs at its TIGHT bucket once its shape recurs
RECURS_AT = 2  # … from the second call of its shape [rows, length] on (the first runs at the rule's bucket)


def checked_rule(rule) -> tuple[int, int]:
    """A (smallest, per_octave) bucket rule as length_buckets needs it: whole numbers, smallest ≥ 1 (a rule of 0 or
    less would never reach max_length), 1 ≤ per_octave ≤ MOST_PER_OCTAVE."""
    if (not isinstance(rule, (tuple, list)) or len(rule) != 2 or not all(map(is_whole, rule)) or rule[0] < 1
            or not 1 <= rule[1] <= MOST_PER_OCTAVE):
        raise InputError(f"programs.bucket_rule={rule!r}: pass (smallest, per_octave), two whole numbers with "
                         f"smallest ≥ 1 and 1 ≤ per_octave ≤ {MOST_PER_OCTAVE} — e.g. "
                         f"minibert.runtime.buckets.INTERACTIVE {INTERACTIVE}, "
                         f"COARSE {COARSE} or FINE {FINE}.")
    return int(rule[0]), int(rule[1])


def length_buckets(max_length: int, smallest: int = 16, per_octave: int = 2) -> tuple[int, ...]:
    """The row lengths programs are compiled for, up to max_length: `smallest`, then per_octave evenly spaced
    lengths per doubling (2: 16, 24, 32, 48, 64, 96, …; 1: 128, 256, 512, …; 16 from 1: every length to 31, then
    32, 34, …), then max_length itself. Padding a row to its bucket adds under 1/per_octave of its tokens past
    `smallest`."""
    buckets, octave = [], smallest
    while octave < max_length:
        buckets += range(octave, 2 * octave, max(1, octave // per_octave))
        octave *= 2
    return (*[b for b in buckets if b < max_length], max_length)


def run_length(length: int, rows: int, rule, max_length: int, calls: int = 1) -> int:
    """The row length Model.run pads a batch of `rows` rows of `length` tokens to at the `calls`-th call of that
    shape: its bucket under `rule` (length_buckets up to max_length), and under INTERACTIVE at least
    FEW_ROWS_SMALLEST tokens for a batch of at most FEW_ROWS rows (a few rows cost little more at 64 than at 32;
    another program costs a compile). A batch of at least TIGHT_ROWS rows runs at its TIGHT bucket instead from its
    RECURS_AT-th call, where that is shorter: its padding is paid on every call, the tight program's compile once."""
    buckets = length_buckets(max_length, *rule)
    if tuple(rule) == INTERACTIVE and rows <= FEW_ROWS:
        buckets = tuple(b for b in buckets if b >= min(FEW_ROWS_SMALLEST, max_length))
    bucket = bucket_length(length, buckets)
    if rows >= TIGHT_ROWS and calls >= RECURS_AT:
        return min(bucket, bucket_length(length, length_buckets(max_length, *TIGHT)))
    return bucket


def bucket_length(length: int, buckets) -> int:
    """The smallest bucket that holds `length` tokens (buckets ascending, the last at least `length`)."""
    return next(b for b in buckets if b >= length)


def cut(name: str, value, length: int):
    """A captured value of a padded run cut back to the real length on each of its T and S axes
    (minibert.core.sites)."""
    return cut_axes(value, site_axes(name, value.ndim), length)


def cut_axes(value, axes, length: int):
    """`value` (axis letters `axes`) cut to `length` on its T and S axes. A device array on a CPU is cut as a NumPy
    view of it (runtime.device.host_view), which the caller hands back to JAX with its other values in one call
    (runtime.device.adopted): slicing it with jax would compile a small program for every new length."""
    index = tuple(slice(0, length) if a in ("T", "S") else slice(None) for a in axes)
    return host_view(value)[index]


def has_positions(name: str, ndim: int) -> bool:
    """Whether the value at hook `name` has a T or S axis (the pooler's [B, D] and sequence logits have none)."""
    return bool({"T", "S"} & set(site_axes(name, ndim)))


# ---- hooks on padded rows -----------------------------------------------------------------------------------

PROBE_LENGTHS = (5, 8)  # a row and a longer one, whose first 5 positions must come out the same
PROBE_RTOL = 1e-4  # far above float32 rounding of one hook on two shapes (~1e-7), far below what a length changes


def pads_safely(hook, name: str, shape: tuple[int, ...], dtype, ctx) -> bool:
    """Whether `hook` (a HookFn) at site `name` gives on padded rows what it gives at the real length: one small
    compiled program calls it on random values of PROBE_LENGTHS positions (T and S alike, the other axes as
    `shape` [B, …] has them), and the first positions of the longer result must equal the shorter one's.

    A hook that counts positions from the end (value[:, -1]), takes a mean or sum over positions, rolls or shifts
    them, or holds an array shaped by the real length (a patch from a cached run) fails the probe, and runs at the
    exact length. Not seen: a hook that branches in Python on value.shape past the probe lengths. Like any
    tracing, the probe calls the hook (twice, with traced values), so a hook that prints prints then too."""
    axes = site_axes(name, len(shape))
    short, long = PROBE_LENGTHS

    def gap(values):
        at_long = hook(values, ctx)
        # A hook returning an array of its own shape (a patch cached at the real length) matches the short
        # probe when that length is the probe's: it must keep the long value's shape too.
        if at_long.shape != values.shape:
            raise ValueError("the hook changed the value's shape")
        padded, exact = cut(name, at_long, short), hook(cut(name, values, short), ctx)
        if padded.shape != exact.shape:
            raise ValueError("the hook changed the value's shape")
        return jnp.max(jnp.abs(padded - exact) / (1 + jnp.abs(exact)))

    at_long = tuple(long if axis in ("T", "S") else size for axis, size in zip(axes, shape))
    rng = np.random.default_rng(0)
    values = rng.standard_normal(at_long) if jnp.issubdtype(dtype, jnp.floating) else rng.integers(0, 2, at_long)
    try:
        return float(jax.jit(gap)(on_device(values, dtype))) <= PROBE_RTOL  # on the host: `<=` on the device compiles
    except Exception:  # noqa: BLE001 (a shape error at another length is the answer; the real run raises the rest)
        return False


def every_row_real(attention_mask) -> bool:
    """Whether every row of attention_mask [B, T] holds a real token, so that padding it changes no value. A row of
    padding only has no real key: its softmax rows spread over every position there is, T at the exact length and
    the bucket's when padded, so such a batch runs at its exact length. Inside a traced function the values are
    unknown and padding saves no program (the caller's program holds the forward), so it runs exact there too."""
    if isinstance(attention_mask, jax.core.Tracer):
        return False
    return bool(np.asarray(attention_mask).any(axis=1).all())


def padded_rows(array, length: int, fill: int = 0):
    """[B, T] ids, types, mask or positions padded on the right to [B, length] with `fill`, as NumPy on the host
    (jnp.pad would compile a small program for every new length), in a buffer a CPU device adopts without a copy
    (runtime.device.host_buffer): Model.inputs then moves the batch in one call."""
    if array is None:
        return None
    if isinstance(array, jax.core.Tracer):  # a call inside a traced function: the padding is part of its program
        return jnp.pad(array, ((0, 0), (0, length - array.shape[1])), constant_values=fill)
    rows = np.asarray(array)
    padded = host_buffer((rows.shape[0], length), rows.dtype)
    padded[:, :rows.shape[1]], padded[:, rows.shape[1]:] = rows, fill
    return padded

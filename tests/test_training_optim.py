"""minibert.training.optim against what transformers' Trainer runs: torch.optim.AdamW, clip_grad_norm_,
get_linear/constant_schedule_with_warmup and Trainer.get_decay_parameter_names."""

from __future__ import annotations

import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers

from minibert.errors import InputError
from minibert.io import checkpoint
from minibert.io.config_json import read_config
from minibert.runtime import cache
from minibert.training import optim
from tests.tolerances import U32, sum_rtol

SHAPES = {"W": (6, 5), "b": (5,), "ln.scale": (5,), "ln.bias": (5,), "head.W_O": (2, 3, 4)}


def _gradient_sequence(rng, steps):
    """Gradients whose norms range over ~0.02…7 around max_grad_norm = 1, so clipping acts on some steps only."""
    return [{n: rng.normal(size=s) * 10 ** rng.uniform(-2.5, 0) for n, s in SHAPES.items()} for _ in range(steps)]


def _torch_reference(params0, grads, lr, steps, warmup, schedule, weight_decay, max_norm):
    """transformers' Trainer update: clip, AdamW step on two groups (decay / no decay), scheduler step."""
    params = {n: torch.tensor(v, dtype=torch.float32, requires_grad=True) for n, v in params0.items()}
    groups = [{"params": [p for n, p in params.items() if optim.decays(n)], "weight_decay": weight_decay},
              {"params": [p for n, p in params.items() if not optim.decays(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)
    make = {"linear": transformers.get_linear_schedule_with_warmup,
            "constant": transformers.get_constant_schedule_with_warmup}[schedule]
    kwargs = {"num_training_steps": steps} if schedule == "linear" else {}
    scheduler = make(opt, num_warmup_steps=optim.warmup_steps(warmup, steps), **kwargs)
    history, lrs = [], []
    for g in grads:
        for n, p in params.items():
            p.grad = torch.tensor(g[n], dtype=torch.float32)
        torch.nn.utils.clip_grad_norm_(list(params.values()), max_norm)
        lrs.append(scheduler.get_last_lr()[0])
        opt.step()
        scheduler.step()
        history.append({n: p.detach().numpy().copy() for n, p in params.items()})
    return history, lrs


@pytest.mark.parametrize("schedule", ["linear", "constant"])
def test_adamw_follows_torch_adamw_with_clipping_and_schedule(schedule):
    """The same 25 gradients into both optimisers: every step's parameters agree.

    Tolerance: the gradients are inputs, not computed from the parameters, so the two runs differ only by
    the rounding of the update itself. Each implementation computes an update with relative error at most
    (12 + 2T)·u: about 12 roundings per element (clip factor, m, v, the two bias corrections, √, +ε, ÷, ×lr,
    decay) and m, v's running averages carrying up to 2u more per step over T steps; the clip factor adds
    sum_rtol(n) (a sum of n squares). Two implementations: twice that. Writing the new parameter rounds it
    once more, by u·|p| (torch rounds twice: the decay p·(1 − lr·λ), then the Adam step), so 4u·|p| per step
    between the two. Errors add over steps (decay only shrinks them): after step t they are within
    Σ_{s≤t} (r·max|p_s − p_{s−1}| + 4u·max|p_s|).
    """
    steps, lr, wd = 25, 1e-2, 0.1
    rng = np.random.default_rng(0)
    params0 = {n: rng.normal(size=s) for n, s in SHAPES.items()}
    grads = _gradient_sequence(rng, steps)
    expected, torch_lrs = _torch_reference(params0, grads, lr, steps, 0.2, schedule, wd, 1.0)

    schedule_fn = optim.learning_rate_schedule(lr, steps, warmup=0.2, schedule=schedule)
    opt = optim.adamw(schedule_fn, weight_decay=wd, mask=optim.decay_mask(params0), max_grad_norm=1.0)
    params = {n: jnp.asarray(v, jnp.float32) for n, v in params0.items()}
    state = opt.init(params)
    n = sum(int(np.prod(s)) for s in SHAPES.values())
    r = 2 * ((12 + 2 * steps) * U32 + sum_rtol(n))
    drift, previous = 0.0, params0
    clipped = 0
    for t, (g, want) in enumerate(zip(grads, expected)):
        assert float(schedule_fn(t)) == pytest.approx(torch_lrs[t], rel=4 * U32, abs=1e-12)
        clipped += optax.tree.norm(g) > 1.0
        updates, state = opt.update({k: jnp.asarray(v, jnp.float32) for k, v in g.items()}, state, params)
        params = optax.apply_updates(params, updates)
        drift += max(r * np.abs(want[k] - previous[k]).max() + 4 * U32 * np.abs(want[k]).max() for k in want)
        previous = want
        for k in want:
            err = np.abs(np.asarray(params[k]) - want[k]).max()
            assert err <= drift, f"step {t} {k}: {err:.2e} > {drift:.2e}"
    assert 0 < clipped < steps  # clipping acted on some steps, not all


def test_schedule_values_by_hand():
    """linear: 0, ½, 1 during 2 warm-up steps... then down to 0 at step N; constant: 1 after warm-up."""
    linear = optim.learning_rate_schedule(1.0, 6, warmup=2, schedule="linear")
    assert [float(linear(t)) for t in range(7)] == [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0]
    constant = optim.learning_rate_schedule(2.0, 6, warmup=2, schedule="constant")
    assert [float(constant(t)) for t in range(4)] == [0.0, 1.0, 2.0, 2.0]
    assert optim.warmup_steps(0.1, 25) == 3  # ceil, as TrainingArguments.get_warmup_steps
    with pytest.raises(InputError, match="schedule='cosine'"):
        optim.learning_rate_schedule(1.0, 6, schedule="cosine")
    with pytest.raises(InputError, match="warmup"):
        optim.warmup_steps(-1, 10)


def test_decay_mask_is_the_trainers(tmp_path):
    """decays(name) for every minibert parameter = Trainer.get_decay_parameter_names on the same HF model."""
    from tests.conftest import make_hf_model

    hf = make_hf_model(tmp_path, "BertForSequenceClassification", num_labels=3)
    # The method reads nothing of the Trainer (whose construction needs accelerate, not installed here).
    hf_decays = set(transformers.Trainer.get_decay_parameter_names(None, hf))
    cfg = read_config(tmp_path)
    table = checkpoint.key_table(cfg)
    prefix = cfg.family.key_prefix + "."
    ours = {table[key.removeprefix(prefix)][0]: key in hf_decays for key, _ in hf.named_parameters()}
    assert ours == {name: optim.decays(name) for name in ours}
    assert sum(ours.values()) and not all(ours.values())


def test_accumulation_averages_micro_batches():
    """accumulate=2: no update after the first micro-batch; after the second, the update of their mean."""
    rng = np.random.default_rng(1)
    params = {n: jnp.asarray(rng.normal(size=s), jnp.float32) for n, s in SHAPES.items()}
    g1, g2 = ({k: jnp.asarray(v, jnp.float32) for k, v in g.items()} for g in _gradient_sequence(rng, 2))
    accumulated = optim.adamw(1e-2, weight_decay=0.1, mask=optim.decay_mask(params), accumulate=2)
    once = optim.adamw(1e-2, weight_decay=0.1, mask=optim.decay_mask(params))
    state = accumulated.init(params)
    first, state = accumulated.update(g1, state, params)
    assert all(not np.any(np.asarray(u)) for u in jax.tree.leaves(first))
    second, _ = accumulated.update(g2, state, params)
    mean = jax.tree.map(lambda a, b: (a + b) / 2, g1, g2)
    want, _ = once.update(mean, once.init(params), params)
    for k in want:  # the mean's rounding (2u) moves Adam's m̂/√v̂ by at most about that, relative
        np.testing.assert_allclose(second[k], want[k], rtol=8 * U32, atol=0)


def test_trainable_globs_and_frozen_parameters():
    params = {n: jnp.ones(s) for n, s in SHAPES.items()}
    assert optim.selected(params, "ln.*") == {"ln.scale", "ln.bias"}
    assert optim.selected(params, None) == set(params)
    with pytest.raises(InputError, match="'blocks.9.*' matches no parameter"):
        optim.selected(params, ["W", "blocks.9.*"])
    moves = {n: n == "W" for n in params}
    opt = optim.frozen_except(optim.adamw(0.1, weight_decay=0.5), moves)
    updates, _ = opt.update(jax.tree.map(jnp.ones_like, params), opt.init(params), params)
    assert {k for k, u in updates.items() if np.any(np.asarray(u))} == {"W"}


def test_parameter_names_of_a_model():
    import minibert

    names = optim.parameter_names(minibert.load().state)
    assert "blocks.0.attn.W_Q" in names and "embed.ln.scale" in names and len(names) == len(set(names))


def test_progress_shows_loss_and_tokens_per_second(capsys):
    ticks = iter([0.0, 2.0, 4.0])
    with optim.Progress(2, "fine-tuning", clock=lambda: next(ticks)) as bar:
        bar.update(0.5, 100)
        bar.update(0.25, 300)  # 400 tokens in 4 s
    shown = capsys.readouterr().err
    assert "loss=0.2500" in shown and "tokens_per_s=100" in shown


def test_progress_says_whether_a_step_was_compiled_or_loaded_from_the_cache(capsys):
    """Docs-only tester (compile 3) item 6: a warm run said "compiling" while it loaded each step from the persistent
    cache. A program no process compiled before (a constant of this moment in it) is compiled; the same program in a
    new jit function, which JAX traces again, is read from the cache; a length seen before says nothing."""
    # the cache as a Model's first build sets it up: this file may be the first a test process runs (pytest-xdist)
    assert cache.use_persistent_cache() is not None
    moment = float(time.time_ns() % 1_000_003)

    def step():
        def add(x):
            return x * 2.0 + moment

        return jax.jit(add)

    for _ in range(2):
        with optim.Progress(3, "fine-tuning") as bar:
            for length in (8, 8):
                with bar.compiling(length):
                    step()(np.ones(length, np.float32))
    with optim.Progress(1, "fine-tuning", enabled=False) as bar, bar.compiling(16):
        step()(np.ones(16, np.float32))
    said = [re.sub(r" in \d+\.\d s$", " in T s", line) for line in capsys.readouterr().err.splitlines()
            if "the step for" in line and "preparing" not in line]
    assert said == ["fine-tuning: compiled the step for 8-token rows in T s",
                    "fine-tuning: loaded the step for 8-token rows from the compilation cache in T s"]


def test_the_rate_and_eta_leave_out_the_updates_in_which_a_step_compiled(capsys):
    """Issue 40: at step 1 the bar said 6 tokens/s and 2 h 16 min left, the first step's compile counted as work.
    A fake clock: each update in whose time a step compiled is left out of tokens/s and eta (none shown until one
    update is measured); the "compiled" line says how long the compile took."""
    now = [0.0]

    def step(length: int, compile_s: float, run_s: float, tokens: int) -> str:
        with bar.compiling(length):
            now[0] += compile_s
        now[0] += run_s
        bar.update(0.5, tokens)
        return bar.bar.postfix

    with optim.Progress(5, "fine-tuning", clock=lambda: now[0]) as bar:
        shown = [step(8, 100.0, 1.0, 1000),   # compiled: not measured
                 step(8, 0.5, 1.5, 1000),     # 1000 tokens in 2 s; 3 steps left at 2 s each
                 step(16, 50.0, 1.0, 4000),   # a new row length compiled: not measured (2 steps left)
                 step(16, 0.0, 2.0, 1000)]    # 2000 tokens in 4 s; 1 step left
    assert shown == ["loss=0.5000", "loss=0.5000, tokens_per_s=500, eta=00:06",
                     "loss=0.5000, tokens_per_s=500, eta=00:04", "loss=0.5000, tokens_per_s=500, eta=00:02"]
    said = [line for line in capsys.readouterr().err.splitlines() if "compiled the step" in line]
    assert said == ["fine-tuning: compiled the step for 8-token rows in 100.0 s",
                    "fine-tuning: compiled the step for 16-token rows in 50.0 s"]


@pytest.mark.parametrize("cache_on", [True, False], ids=["cache on", "cache off"])
def test_progress_while_a_step_is_prepared_says_what_can_happen(cache_on):
    """With the compilation cache off a step can only compile, and the bar says so (docs-only tester, compile 4);
    with it on, compiled or loaded."""
    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", cache_on and before)
    try:
        with optim.Progress(1, "fine-tuning", enabled=False) as bar, bar.compiling(8):
            shown = bar.bar.desc
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
    either = "preparing the step for 8-token rows (compiling it, or loading it from the compilation cache)"
    assert shown == "fine-tuning: " + (either if cache_on and before else "compiling the step for 8-token rows")

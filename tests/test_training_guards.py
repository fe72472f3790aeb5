"""A run that diverges stops, naming the update and the setting to lower, and saves nothing; settings that cannot
train are refused by name before any work (issue 32 A4, C)."""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest

import minibert
from minibert import training
from minibert.errors import DataFileError, DivergedError, InputError
from minibert.training import guards
from tests.conftest import make_hf_model

ROWS = [(f"w{i} w{i + 3} a b", i % 2) for i in range(16)]
QUICK = dict(num_labels=2, epochs=2, batch_size=4, dropout=0.0, progress=False)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    directory = tmp_path_factory.mktemp("base")
    make_hf_model(directory, "BertModel", scale=0.1)
    return minibert.load(directory)


def _nan(value, ctx):
    return value * jnp.nan


@pytest.mark.slow
def test_a_diverged_run_stops_at_its_update_and_saves_nothing(base, tmp_path):
    """One NaN activation makes the first update's loss NaN: the run stops there, and its checkpoint folder
    holds nothing (before: it trained on, and saved a model and checkpoints of NaN weights)."""
    with pytest.raises(DivergedError, match=r"the loss of update 1 of 8 was nan \(learning rate 0 there\).*saved no "
                                            r"model\. Lower the learning rate"):
        training.finetune(base, ROWS, learning_rate=1e-3, hooks={"blocks.0.hook_resid_post": _nan},
                          resume=tmp_path / "run", checkpoint_every=1, **QUICK)
    assert not any((tmp_path / "run").iterdir())


@pytest.mark.slow
def test_a_learning_rate_of_a_million_stops_with_the_update_named(base):
    """Before: `--learning-rate 1e6` exited 0 and wrote model.safetensors with non-finite weights. Adam moves each
    weight by about the rate per update, so the logits overflow within a few updates (here the 5th on one CPU:
    the test asks only that the run stops, and names an update)."""
    with pytest.raises(DivergedError, match=r"(the loss of update [1-8] of 8 was nan|a weight was no longer finite "
                                            r"after update [1-8] of 8)"):
        training.finetune(base, ROWS, learning_rate=1e6, **QUICK)


def test_non_finite_weights_are_found_in_any_leaf():
    """check_weights reads every leaf (all_finite reduces each one): an inf in the last leaf of three is found."""
    params = {"a": jnp.zeros((2, 3)), "b": jnp.ones(4), "c": jnp.array([1.0, jnp.inf])}
    with pytest.raises(DivergedError, match=r"a weight was no longer finite after update 7 of 9 \(peak learning rate "
                                            r"0\.002\)"):
        guards.check_weights(params, 7, 9, 2e-3)
    guards.check_weights(params | {"c": jnp.array([1.0, 2.0])}, 7, 9, 2e-3)  # all finite: nothing raised
    assert not bool(guards.all_finite({"x": np.array([np.nan], np.float32)}))


@pytest.mark.parametrize(("settings", "error", "fragment"), [
    ({"learning_rate": float("inf")}, InputError, "learning_rate=inf: pass a positive, finite peak rate"),
    ({"learning_rate": float("nan")}, InputError, "learning_rate=nan"),
    ({"learning_rate": "1e-3"}, InputError, "learning_rate='1e-3'"),
    ({"epochs": 1.5}, InputError, "epochs=1.5, batch_size=4: both must be whole numbers"),
    ({"batch_size": 2.0}, InputError, "batch_size=2.0"),
    ({"warmup": float("nan")}, InputError, "warmup=nan: pass a fraction"),
    ({"warmup": float("inf")}, InputError, "warmup=inf"),
    ({"checkpoint_every": 0}, InputError, "checkpoint_every=0"),
    ({"seed": -1}, InputError, "seed=-1: pass a whole number from 0 to 2**32 - 1"),  # numpy's ValueError before
    ({"seed": 1.5}, InputError, "seed=1.5"),  # jax's TypeError naming a JitTracer before
    ({"seed": 2**32}, InputError, "seed=4294967296"),
])
def test_settings_that_cannot_train_are_named(base, settings, error, fragment):
    """Before: inf trained (to NaN), 1.5 epochs and a NaN warm-up were TypeError/ValueError from deep inside,
    checkpoint_every=0 a ZeroDivisionError after the first update."""
    with pytest.raises(error, match=re.escape(fragment)):
        training.finetune(base, ROWS, **(QUICK | settings))


def test_no_examples_and_eval_labels_the_training_data_lack(base):
    """Before: finetune(model, []) failed deep in the step, and an eval label outside the classes was a bare
    ValueError (a name) or a NaN eval loss with accuracy 0 (a number)."""
    with pytest.raises(DataFileError, match="the data holds no examples"):
        training.finetune(base, [], **QUICK)
    with pytest.raises(InputError, match=r"the eval data: row 2's label 'maybe' is not one of the training labels "
                                         r"\['neg', 'pos'\]"):
        training.finetune(base, [("a b", "neg"), ("c d", "pos")], eval_data=[("a", "pos"), ("b", "maybe")],
                          **(QUICK | {"num_labels": None}))
    with pytest.raises(InputError, match=r"the eval data: row 1's label 5 is not a class of the model: it has 2 "
                                         r"classes, 0 … 1"):
        training.finetune(base, ROWS, eval_data=[("a", 5)], **QUICK)


def test_a_warmup_as_long_as_the_run_warns(base):
    """Docs-only tester (trust) item 5: warmup=10**9 (or the default 0.1 of a one-update run) trained at rates of
    ~1e-14 (or exactly 0) and returned the model as trained, unchanged. 16 rows, batch 4, 2 epochs: 8 updates."""
    with pytest.warns(UserWarning, match=re.escape("warmup=1000000000 is 1000000000 updates but the run has 8: the "
                                                   "learning rate never reaches its peak")):
        training.finetune(base, ROWS, **(QUICK | {"warmup": 10**9}))
    with pytest.warns(UserWarning, match=re.escape("warmup=0.1 is 1 update but the run has 1") + ".*with one update "
                                                   "the model does not change"):
        training.finetune(base, ROWS[:2], **(QUICK | {"epochs": 1, "warmup": 0.1}))


def test_a_loss_that_grows_a_hundredfold_warns_once(recwarn):
    """Docs-only tester (trust) item 4: --learning-rate 1e6 reached a finite loss of 1e7 and reported success. The
    rule, by hand: warn when a loss first exceeds 100 × the run's first loss."""
    guards.check_growth([0.7, 0.8, 69.0], 3, 10, 1e3)  # 69 < 70: no warning
    assert not recwarn.list
    with pytest.warns(UserWarning, match=re.escape("the loss of update 3 of 10 is 71 (learning rate 1e+03 there), "
                                                   "more than 100 × the first update's 0.7")):
        guards.check_growth([0.7, 0.8, 71.0], 3, 10, 1e3)
    recwarn.clear()
    guards.check_growth([0.7, 80.0, 90.0], 3, 10, 1e3)  # already past it at update 2: said there, not again
    assert not recwarn.list

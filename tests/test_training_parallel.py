"""Data-parallel fine-tuning over two (forced) CPU devices follows the one-device run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import minibert
from minibert import training
from tests.conftest import make_hf_model
from tests.test_training_parity import KAPPA, _training_rtol

SETTINGS = dict(task="sequence-classification", num_labels=2, epochs=2, batch_size=6, learning_rate=1e-3,
                dropout=0.0, seed=1, progress=False)
RUN = """
import json, sys
import jax, minibert
from minibert import training
rows = [training.Example(t, None, l) for t, l in json.loads(sys.argv[3])]
result = training.finetune(minibert.load(sys.argv[1]), rows, **json.loads(sys.argv[2]))
print(json.dumps({"devices": result.devices, "loss": result.history.loss}))
"""


@pytest.mark.slow
def test_two_devices_follow_one(tmp_path):
    make_hf_model(tmp_path, "BertForSequenceClassification", num_labels=2, scale=0.1)
    rng = np.random.default_rng(0)
    rows = [(" ".join(rng.choice([f"w{i}" for i in range(40)], size=rng.integers(2, 9))), int(rng.integers(0, 2)))
            for _ in range(57)]  # 10 batches of 6 per epoch, the last one short: padding rows on both devices
    env = os.environ | {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "PYTHONPATH": os.getcwd(),
                        "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", RUN, str(tmp_path), json.dumps(SETTINGS), json.dumps(rows)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    parallel = json.loads(done.stdout.strip().splitlines()[-1])
    assert parallel["devices"] == 2
    model = minibert.load(tmp_path)
    single = training.finetune(model, [training.Example(t, None, label) for t, label in rows], **SETTINGS)
    # The two runs differ only in the order of the batch sums (per device, then across): within the drift bound
    # of any two fp32 implementations of the same steps (test_training_parity._training_rtol).
    rtol = _training_rtol(model.config, 16, len(single.history.loss))
    np.testing.assert_allclose(parallel["loss"], single.history.loss, rtol=rtol, atol=0)


PROCESSES = """
import json, sys
import numpy as np
from minibert.app.distributed import initialize
initialize()
import jax, minibert
from minibert import training
argument = json.loads(sys.argv[1])
rows = [training.Example(t, None, l) for t, l in argument["rows"]]
result = training.finetune(minibert.load(argument["model"]), rows, eval_data=rows[:20], **argument["settings"])
# The weights go to a file: a large print could fill the pipe of a process the launcher is not yet reading,
# and jax.distributed's shutdown then waits for it forever.
np.savez(f"{argument['out']}/weights{jax.process_index()}.npz", **result.model.named_parameters())
print(json.dumps({"devices": result.devices, "loss": result.history.loss, "eval": result.history.eval}))
"""


@pytest.mark.slow
def test_two_processes_follow_one(tmp_path):
    """jax.distributed on localhost, 2 processes × 2 CPU devices (tests/test_distributed.launch): one global step
    per batch, so both processes report the same losses, evaluation and weights, and these follow the one-device
    run within the same drift bound as above. Evaluation gathers every process's predictions."""
    from tests.test_distributed import last_json, launch

    make_hf_model(tmp_path, "BertForSequenceClassification", num_labels=2, scale=0.1)
    rng = np.random.default_rng(2)
    rows = [(" ".join(rng.choice([f"w{i}" for i in range(40)], size=rng.integers(2, 9))), int(rng.integers(0, 2)))
            for _ in range(30)]  # 5 batches of 6 per epoch: 8 rows each (2 per device), 2 of them padding
    settings = SETTINGS | {"epochs": 1}
    done = launch(PROCESSES, {"model": str(tmp_path), "rows": rows, "settings": settings, "out": str(tmp_path)})
    first, second = (last_json(d) for d in done)
    assert first == second and first["devices"] == 4  # each step over both processes' devices
    weights = [np.load(tmp_path / f"weights{i}.npz") for i in range(2)]
    for name in weights[0].files:  # one global step: the same bits in both processes
        np.testing.assert_array_equal(weights[0][name], weights[1][name])
    examples = [training.Example(t, None, label) for t, label in rows]
    model = minibert.load(tmp_path)
    single = training.finetune(model, examples, eval_data=examples[:20], **settings)
    rtol = _training_rtol(model.config, 16, len(single.history.loss))
    np.testing.assert_allclose(first["loss"], single.history.loss, rtol=rtol, atol=0)
    np.testing.assert_allclose([e["loss"] for e in first["eval"]], [e["loss"] for e in single.history.eval],
                               rtol=rtol, atol=0)
    theirs = single.model.named_parameters()
    assert set(weights[0].files) == theirs.keys()
    noise_bound = 2 * KAPPA * sum(single.history.learning_rate)  # key biases: rounding noise (test_training_parity)
    for name, value in theirs.items():
        value = np.asarray(value)
        bound = noise_bound if name.endswith("attn.b_K") else rtol * np.abs(value).max()
        assert np.abs(weights[0][name] - value).max() <= bound, name

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
from tests.test_training_parity import _training_rtol

SETTINGS = dict(task="sequence-classification", num_labels=2, epochs=2, batch_size=6, learning_rate=1e-3,
                dropout=0.0, seed=1, progress=False)
RUN = """
import json, sys
import jax, minibert
from minibert import training
rows = [training.Example(t, None, l) for t, l in json.loads(sys.argv[3])]
result = training.finetune(minibert.load(sys.argv[1]), rows, **json.loads(sys.argv[2]))
print(json.dumps({"devices": jax.device_count(), "loss": result.history.loss}))
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

"""minibert and transformers on one pinned core, timed by process CPU time: the work each does per forward.

On a shared machine the wall-clock ratios of the dense section move with whatever else runs (PyTorch's
OpenMP threads degrade far more than XLA's when another process takes a core). CPU time of a process
pinned to one core with one thread barely moves with background load, so these ratios say which
implementation does less work, apart from how well each uses a second core.

    python benchmarks/one_core.py                       # bundled MiniLM, 8×128
    python benchmarks/one_core.py --model bert-base --repeats 5
    python benchmarks/one_core.py --smoke                   # 1×16, one run per case, outputs checked (CI)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import harness  # noqa: E402

PATTERNS = "blocks.*.attn.hook_pattern"


def cpu_times(cases: dict, repeats: int, warmup: int) -> dict[str, float]:
    """Median process CPU seconds per call of each case, interleaved round-robin."""
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            time.sleep(harness.SETTLE_S)
            start = time.process_time()
            fn()
            samples[name].append(time.process_time() - start)
    return {name: statistics.median(t) for name, t in samples.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm", choices=("minilm", "bert-base"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--core", type=int, default=min(os.sched_getaffinity(0)))
    parser.add_argument("--smoke", action="store_true", help="MiniLM at 1×16, one run per case, no warm-up (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.batch, args.length, args.repeats = "minilm", 1, 16, 1
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {args.core})  # before jax and torch start their thread pools
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = measure(args)
    finally:  # a smoke run inside pytest leaves its process as it found it, failed or not
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)
    return report(args, times)


def measure(args) -> dict:
    """CPU seconds per forward of each case (checked against transformers in a smoke run)."""
    import jax
    import numpy as np
    import torch

    import minibert

    directory = (harness.bundled_dir() if args.model == "minilm"
                 else harness.make_bert_base(harness.scratch_dir() / "bert-base-random"))
    model = minibert.load(directory)
    batch = harness.random_ids(args.batch, args.length)
    torch_batch = {k: torch.tensor(v.astype(np.int64)) for k, v in batch.items()}
    eager, sdpa = harness.hf_model(directory, "eager"), harness.hf_model(directory, "sdpa")
    cases = {
        "minibert, nothing": lambda: jax.block_until_ready(model.run(batch)[0]),
        "minibert, patterns": lambda: jax.block_until_ready(dict(model.run(batch, names=PATTERNS)[1])),
        "transformers sdpa, nothing": lambda: sdpa(**torch_batch),
        "transformers eager, patterns": lambda: eager(**torch_batch, output_attentions=True),
    }
    with torch.inference_mode():
        times = cpu_times(cases, args.repeats, warmup=0 if args.smoke else 2)
        if args.smoke:
            check_forwards(model, batch, sdpa(**torch_batch).last_hidden_state.numpy())
    return times


def report(args, times: dict) -> int:
    import numpy as np

    if args.smoke:
        assert all(np.isfinite(t) and t >= 0 for t in times.values()), times
    print(f"{'smoke run: ' if args.smoke else ''}{args.model} {args.batch}×{args.length}, "
          f"one core ({harness.cpu_model()}), torch 1 thread, "
          f"load average {harness.load_average()}\n")
    print(harness.markdown_table(["case", "CPU ms per forward"], [[n, f"{t * 1e3:.0f}"] for n, t in times.items()]))
    print()
    print(harness.markdown_table(["comparison", "CPU-time ratio (peer ÷ minibert)"], [
        ["minibert nothing vs transformers sdpa",
         f"{times['transformers sdpa, nothing'] / times['minibert, nothing']:.2f}×"],
        ["minibert patterns vs transformers eager + attentions",
         f"{times['transformers eager, patterns'] / times['minibert, patterns']:.2f}×"],
    ]))
    return 0


def check_forwards(model, batch, peer_hidden) -> None:
    """Both timed implementations return a finite last hidden state of shape [B, T, D]."""
    import numpy as np

    ours = np.asarray(model.run(batch)[0].last_hidden_state)
    expected = (*batch["input_ids"].shape, model.config.hidden_size)
    assert ours.shape == peer_hidden.shape == expected, (ours.shape, peer_hidden.shape, expected)
    assert np.isfinite(ours).all() and np.isfinite(peer_hidden).all()


if __name__ == "__main__":
    main()

"""Peak host memory of capturing every hook point of bert-base at T=512, with and without offload=True.
Each measurement runs in a fresh process (`python memory.py DIR B T OFFLOAD`) so ru_maxrss is its own.
The section runs from benchmarks/run.py; `python benchmarks/memory.py --smoke` runs it on the bundled MiniLM at
1×16 and checks what the workers report (CI)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

from harness import Settings, bundled_dir, make_bert_base, markdown_table, scratch_dir


def candidate_batches(model, T: int, wanted: int, free: int) -> int:
    """The largest batch ≤ wanted (halving) whose captures fit in a third of the free memory."""
    from dense import capture_bytes

    B = wanted
    while B > 1 and capture_bytes(model, B, T) > free / 3:
        B //= 2
    return B


def measure(directory: Path, B: int, T: int, offload: bool) -> dict:
    proc = subprocess.run([sys.executable, __file__, str(directory), str(B), str(T), str(int(offload))],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["killed"])[-1][:200], "rc": proc.returncode}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def memory(settings: Settings) -> tuple[str, dict]:
    from dense import available_memory, capture_bytes

    import minibert

    if settings.smoke:  # the bundled MiniLM: building a bert-base takes longer than the whole smoke run
        directory, T, wanted = bundled_dir(), 16, 1
    else:
        directory, T, wanted = make_bert_base(scratch_dir() / "bert-base-random"), 128 if settings.quick else 512, 4
        wanted = wanted if settings.quick else 32
    model = minibert.load(directory)
    B = candidate_batches(model, T, wanted, available_memory())
    captures = capture_bytes(model, B, T)
    sites = len(model.hook_names)
    del model
    rows, out = [], {}
    for offload in (False, True):
        result = measure(directory, B, T, offload)
        out[f"offload={offload}"] = result
        if settings.smoke:
            check_worker(result, sites)
        if "error" in result:
            rows.append([f"offload={offload}", "failed", "", "", "", result["error"]])
            continue
        rows.append([f"offload={offload}", f"{result['after_load_gib']:.2f}", f"{result['holding_gib']:.2f}",
                     f"{result['peak_gib']:.2f}", f"{result['peak_gib'] - result['after_load_gib']:.2f}",
                     f"{result['seconds']:.1f} s"])
    label = "all-MiniLM-L6-v2" if settings.smoke else "bert-base (random)"
    note = (f"{label}, B={B}, T={T}, every hook point captured ({captures / 2**30:.2f} GiB of captured "
            f"values); peak resident set (ru_maxrss) of a fresh process."
            + (f" B={wanted} would capture {captures * wanted / B / 2**30:.0f} GiB (every capture grows with B), more "
               f"than this machine "
               f"can hold, so the batch was halved until the captures fit in a third of the free memory."
               if B != wanted else ""))
    table = markdown_table(["run_with_cache(names=None, …)", "resident after load (GiB)", "holding the cache (GiB)",
                            "peak, ru_maxrss (GiB)", "peak − after load (GiB)", "time (with compile)"], rows)
    return note + "\n\n" + table, {"B": B, "T": T, "capture_bytes": captures, **out}


def check_worker(result: dict, sites: int) -> None:
    """A smoke run's check of one worker: it ran, captured every hook point, and its memory numbers are
    ordered (resident after load ≤ peak; the holding figure is read later than the peak, so it is only
    checked positive) and its time positive."""
    assert "error" not in result, result
    assert result["captured"] == sites, (result["captured"], sites)
    assert 0 < result["after_load_gib"] <= result["peak_gib"] and result["holding_gib"] > 0, result
    assert result["seconds"] > 0, result


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", required=True,
                        help="both workers on the bundled MiniLM at 1×16, their reports checked")
    parser.parse_args(argv)
    text, _ = memory(Settings.make(quick=True, smoke=True))
    print(f"smoke run of the memory section (python benchmarks/run.py --only memory for numbers)\n\n{text}")
    return 0


def _gib(kilobytes: int) -> float:
    return kilobytes / 2**20


def _resident_kb() -> int:
    """This process's resident set now (VmRSS), in KiB; ru_maxrss is the high-water mark."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def worker(directory: str, B: int, T: int, offload: bool) -> None:
    import time

    import jax
    from harness import random_ids

    import minibert

    model = minibert.load(directory)
    after_load = _resident_kb()
    start = time.perf_counter()
    out, cache = model.run_with_cache(random_ids(B, T), offload=offload)
    jax.block_until_ready((out, dict(cache)))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"after_load_gib": _gib(after_load), "peak_gib": _gib(peak), "holding_gib": _gib(_resident_kb()),
                      "seconds": seconds,
                      "captured": len(cache)}))


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]
    if sys.argv[1:2] == ["--smoke"]:
        sys.exit(main(sys.argv[1:]))
    worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), bool(int(sys.argv[4])))

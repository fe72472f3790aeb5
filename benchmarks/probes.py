"""Linear probes on every layer: minibert's one compiled program (L-BFGS; the layers in turn with lax.map, the CPU
default, or side by side with vmap) against one probe per layer in a Python loop (the same compiled solver,
called L times) and against scikit-learn's LogisticRegression (lbfgs, the same objective: C = 1 / (l2 · n))
fitted layer by layer.

Features are generated (Gaussian, [L, N, D], labels a noisy linear function of one layer), so timings do not
depend on a checkpoint; accuracy agreement with scikit-learn is reported next to the times.

    python benchmarks/probes.py [--smoke]        # prints a Markdown section for benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from harness import Settings, fmt, load_average, machine, markdown_table, time_round_robin

from minibert.analysis import probes

FULL = dict(layers=7, items=5000, width=384, classes=17)  # bundled model's 6 blocks + embeddings, UPOS's 17 tags
SMOKE = dict(layers=2, items=200, width=16, classes=3)
L2 = 1e-3
LAX_MAP, VMAP = "all layers, one program (lax.map)", "all layers, one program (vmap)"


def planted(layers, items, width, classes, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(layers, items, width)).astype(np.float32)
    y = np.argmax(x[layers // 2] @ rng.normal(size=(width, classes)) + rng.normal(size=(items, classes)), -1)
    return x, y


def run(sizes, settings):
    from sklearn.linear_model import LogisticRegression

    x, y = planted(**sizes)
    n = len(y)
    classes = sizes["classes"]

    def all_layers(vectorised=False):
        return probes.fit_linear_probes(x, y, num_classes=classes, l2=L2, patience=None, tol=1e-5,
                                        vectorised=vectorised)[0]

    def loop():
        return [probes.fit_linear_probes(x[layer:layer + 1], y, num_classes=classes, l2=L2, patience=None,
                                         tol=1e-5)[0] for layer in range(len(x))]

    def sklearn():
        return [LogisticRegression(C=1 / (L2 * n), tol=1e-5, max_iter=500).fit(x[layer], y) for layer in range(len(x))]

    times = time_round_robin({LAX_MAP: all_layers, VMAP: lambda: all_layers(vectorised=True),
                              "one program per layer, loop": loop, "scikit-learn, per layer": sklearn}, settings)
    ours = probes.predict(all_layers(), x)
    theirs = np.stack([model.predict(x[layer]) for layer, model in enumerate(sklearn())])
    agreement = float((ours == theirs).mean())
    base = times[LAX_MAP]
    rows = [[name, fmt(seconds, 3), fmt(seconds / base)] for name, seconds in times.items()]
    return rows, agreement


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script runs")
    args = parser.parse_args(argv)
    sizes = SMOKE if args.smoke else FULL
    settings = Settings(quick=args.smoke, repeats=1 if args.smoke else 3, warmup=1)
    rows, agreement = run(sizes, settings)
    facts = machine()
    print(f"## Probes ({'smoke' if args.smoke else 'full'})\n")
    print(f"{facts['cpu']}, {facts['cores']} cores ({os.cpu_count()} visible), load {load_average()}; "
          f"{facts['versions']}\n")
    print(f"{sizes['layers']} layers × {sizes['items']} items × {sizes['width']} features, {sizes['classes']} "
          f"classes (generated), l2 = {L2}, L-BFGS to ‖∇‖ ≤ 1e-5 (scikit-learn: tol 1e-5).\n")
    print(markdown_table(["fit every layer's probe", "seconds (median)", "× lax.map"], rows))
    print(f"\nPredictions equal to scikit-learn's on {100 * agreement:.1f}% of items × layers.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

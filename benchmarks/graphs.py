"""One attribution graph on the bundled model (all-MiniLM-L6-v2), random TopK skip transcoders at every block, a
~32-token synthetic sentence, a sentence-vector direction as the target: analysis.graphs.attribute (every row of
the graph as chunked, vmapped backward passes in one program) against a loop of one backward per node (the same
row program built for one row, called once per node; timed over a sample of nodes and scaled to all), with the
memory XLA reports for each program.

    python benchmarks/graphs.py [--quick]   # prints a Markdown table for RESULTS.md
    python benchmarks/graphs.py --smoke     # 8 tokens, k = 2, 3 looped nodes, one run per case (CI)
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from harness import (
    Settings,
    block,
    check_times,
    command_line,
    fmt,
    load_average,
    machine,
    markdown_table,
    time_round_robin,
)

import minibert
from minibert.analysis import graphs
from minibert.analysis import transcoders as tcs
from minibert.analysis.graphs import attribution, replacement
from minibert.analysis.graphs.targets import unlabelled
from minibert.analysis.sweeps import padded_count
from minibert.runtime.accounting import items_per_chunk

TEXT = ("the food at the little place by the river was great , the staff were kind and the prices were fair , so we "
        "will surely come back again next")


def random_transcoders(model, d_sae: int, k: int):
    D = model.config.hidden_size
    out = []
    for layer in range(model.config.num_hidden_layers):
        config = tcs.TranscoderConfig(d_in=D, d_sae=d_sae, d_out=D, layer=layer, architecture="topk", k=k, skip=True)
        params = tcs.init_params(config, seed=layer)
        params["W_skip"] = 0.02 * jax.random.normal(jax.random.key(layer), (D, D))
        out.append((config, params))
    return out


def temp_bytes(fn, *args, **static) -> int | None:
    """The temporary bytes XLA's compiled program of fn(*args) reports (None where the backend does not say)."""
    analysis = jax.jit(fn, static_argnames=tuple(static)).lower(*args, **static).compile().memory_analysis()
    return getattr(analysis, "temp_size_in_bytes", None)


def main(argv=None) -> int:
    args = command_line(__doc__, smoke="8 tokens, k = 2, 3 looped nodes, one run per case").parse_args(argv)
    settings = Settings.make(args.quick, args.smoke)
    tokens, k, looped = (8, 2, 3) if args.smoke else (32, 8, 24)
    model = minibert.load()
    ids = model.tokenize([TEXT]).to_dict()
    batch = {name: np.asarray(v)[:, :tokens] for name, v in ids.items()}
    transcoders = random_transcoders(model, d_sae=4 * model.config.hidden_size, k=k)
    direction = np.random.default_rng(0).normal(size=model.config.hidden_size).astype(np.float32)
    target = graphs.direction_target(direction / np.linalg.norm(direction))
    graph = graphs.attribute(model, batch, transcoders, target)
    n_rows = graph.n_features + graph.n_targets
    rows_sum = graph.adjacency[:graph.n_features].sum(1) + graph.bias[:graph.n_features]
    assert np.allclose(rows_sum, graph.pre_activations[:graph.n_features], atol=1e-3), "completeness"

    # the loop: the row program built for one row, once per node, with the run's values computed once (its share)
    tc = replacement.check_transcoders(model, transcoders)
    s = replacement.sites(model)
    inputs = model.inputs(batch)
    run = model.jit(attribution.record_run, static_argnames=("configs", "names"))
    captured, _, f, errors, _ = run(model.state, inputs, tc.params, unlabelled([target]), configs=tc.configs,
                                    names=tuple(replacement.record_names(s)))
    frozen = {n: v for n, v in captured.items() if n in set(s.patterns) | set(s.scales)}
    active = np.zeros((padded_count(graph.n_features, fewest=attribution.FEWEST_FEATURES), 3), np.int32)
    active[:graph.n_features] = graph.active_features
    one_row = model.jit(attribution.graph_rows, static_argnames=("chunk",))
    arguments = (model.state, inputs, frozen, tc.stacked, captured["hook_full_embed"][0], f, errors, active)

    def node_items(node: int) -> np.ndarray:
        item = np.full((1, 4), -1, np.int32)
        item[0, :3] = graph.active_features[node]
        return item

    sample = np.random.default_rng(1).choice(graph.n_features, size=min(looped, graph.n_features), replace=False)

    def loop_over_sample():
        return [block(one_row(*arguments, node_items(int(n)), unlabelled([target]), chunk=1)["rows"]) for n in sample]

    looped_rows = np.stack([r[0] for r in loop_over_sample()])
    assert np.allclose(looped_rows[:, :graph.n_features], graph.adjacency[sample, :graph.n_features], atol=1e-4)
    times = time_round_robin({
        "minibert attribute (every row, one program)": lambda: graphs.attribute(model, batch, transcoders, target),
        f"one backward per node, {len(sample)} sampled nodes": loop_over_sample,
    }, settings)
    check_times(times)
    per_node = times[f"one backward per node, {len(sample)} sampled nodes"] / len(sample)
    ours = times["minibert attribute (every row, one program)"]
    chunk = attribution.power_of_two(items_per_chunk(attribution.row_bytes(model, len(active), tokens), n_rows))
    items = attribution.row_items(graph.active_features, 1, chunk, len(active))
    rows_fn = functools.partial(attribution.graph_rows, model)
    memory = {"graph": temp_bytes(rows_fn, *arguments, items, unlabelled([target]), chunk=chunk),
              "one row": temp_bytes(rows_fn, *arguments, node_items(0), unlabelled([target]), chunk=1)}

    info = machine()
    mode = "smoke" if args.smoke else "quick" if settings.quick else "full"
    print(f"## Attribution graphs (issue 38) — {info['cpu']}, {info['date']}, load average {load_average()}, "
          f"{mode} run (`python benchmarks/graphs.py{' --' + mode if mode != 'full' else ''}`)\n")
    print(f"{info['versions']}. Bundled all-MiniLM-L6-v2, {tokens} tokens, random TopK skip transcoders (d_sae "
          f"{4 * model.config.hidden_size}, k = {k}) at all {graph.n_layers} blocks: {graph.n_features} active "
          f"features, {n_rows} rows (features and the target) of {graph.adjacency.shape[1]} columns; {chunk} rows "
          f"per vmapped backward. Median of {settings.repeats} runs, programs warm; the loop is timed over "
          f"{len(sample)} nodes and scaled to all {n_rows}. Memory: XLA's temporaries of each compiled program.\n")
    mib = lambda b: "—" if b is None else fmt(b / 2**20, 1)  # noqa: E731
    print(markdown_table(["case", "s", "× minibert's", "program temporaries, MiB"], [
        ["minibert attribute: every row in one program", fmt(ours, 2), "1×", mib(memory["graph"])],
        [f"one backward per node ({n_rows} nodes, from {len(sample)})", fmt(per_node * n_rows, 1),
         fmt(per_node * n_rows / ours, 1) + "×", mib(memory["one row"]) + " per call"]]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Circuits on the bundled model (all-MiniLM-L6-v2), 16 synthetic prompt pairs (clean / corrupted, one word
changed), a metric read off the mean-pooled sentence vector:

- edge attribution patching: minibert's one program for every edge (EAP) against a loop of real edge patches
  (path_patching, one compiled program reused per edge), timed over a sample of edges and scaled to the graph;
- EAP-IG's steps in one program against a loop of single-step programs (each EAP at one point);
- integrated gradients on the word embeddings (50 Gauss–Legendre steps, 16 sentences): minibert's
  token_attribution against captum's LayerIntegratedGradients on transformers' word_embeddings, same CPU;
  the two results are compared first.

    python benchmarks/circuits.py [--quick]   # prints a Markdown table for RESULTS.md
    python benchmarks/circuits.py --smoke     # 2 pairs, 2 steps, 3 patched edges, one run per case (CI)
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from harness import (
    Settings,
    block,
    bundled_dir,
    check_times,
    command_line,
    fmt,
    hf_model,
    load_average,
    machine,
    markdown_table,
    time_round_robin,
)

import minibert
from minibert.analysis import circuits

SUBJECTS = ["the food", "the service", "the movie", "the hotel", "the book", "the music", "the coffee", "the room",
            "the staff", "the game", "the show", "the car", "the phone", "the class", "the view", "the wine"]
PAIRS = [(f"{s} was great and we loved it", f"{s} was awful and we hated it") for s in SUBJECTS]


def sentiment_metric(model, clean, corrupted):
    """(metric, direction): ⟨the mean of the last hidden states, the unit direction from the corrupted texts' mean
    vector to the clean ones'⟩ per row."""
    def pooled(texts):
        inputs = model.inputs(texts)
        hidden = model(inputs).last_hidden_state
        mask = inputs.attention_mask[..., None]
        return (hidden * mask).sum(1) / mask.sum(1)

    direction = pooled(clean).mean(0) - pooled(corrupted).mean(0)
    direction = direction / jnp.linalg.norm(direction)

    def metric(out):
        return out.last_hidden_state.mean(1) @ direction

    return metric, direction


def captum_ig(hf, batch, direction, steps: int):
    """captum's LayerIntegratedGradients on word_embeddings, [PAD] baseline with the specials kept → [B, T]."""
    import torch
    from captum.attr import LayerIntegratedGradients

    fields = {k: torch.as_tensor(np.asarray(v)) for k, v in batch.to_dict().items()}
    ids = fields["input_ids"]
    baseline = torch.where(torch.isin(ids, torch.tensor([0, 101, 102])), ids, torch.zeros_like(ids))
    w = torch.tensor(np.asarray(direction))

    def forward(input_ids, token_type_ids, attention_mask):
        out = hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        return out.last_hidden_state.mean(1) @ w

    lig = LayerIntegratedGradients(forward, hf.embeddings.word_embeddings)
    return lig.attribute(ids, baselines=baseline, additional_forward_args=(fields["token_type_ids"],
                                                                           fields["attention_mask"]),
                         n_steps=steps).sum(-1).detach().numpy()


def main(argv=None) -> int:
    args = command_line(__doc__, smoke="2 pairs, 2 steps, 3 patched edges, one run per case").parse_args(argv)
    settings = Settings.make(args.quick, args.smoke)
    pairs = PAIRS[:2] if args.smoke else PAIRS
    steps, ig_steps, sampled = (2, 2, 3) if args.smoke else (5, 50, 20)
    import torch

    model = minibert.load()
    clean, corrupted = [p[0] for p in pairs], [p[1] for p in pairs]
    metric, direction = sentiment_metric(model, clean, corrupted)
    graph = circuits.edge_attribution(model, clean, corrupted, metric)
    n_edges = int(graph.edges.sum())
    rng = np.random.default_rng(0)
    sample = [tuple(e) for e in rng.permutation(np.argwhere(graph.edges))[:sampled]]

    def patch_sampled_edges():
        return [circuits.path_patching(model, clean, corrupted, metric, graph.senders[u], [graph.receivers[v]])
                for u, v in sample]

    patched = np.array(patch_sampled_edges())
    assert patched.shape == (len(sample),) and np.all(np.isfinite(patched)), patched
    clean_inputs = model.inputs(clean)
    eap = time_round_robin({
        "minibert edge_attribution, EAP (every edge, one program)":
            lambda: circuits.edge_attribution(model, clean, corrupted, metric),
        f"path_patching loop over {len(sample)} sampled edges": patch_sampled_edges,
        "one plain forward": lambda: block(model(clean_inputs).last_hidden_state),
    }, settings)
    per_edge = eap[f"path_patching loop over {len(sample)} sampled edges"] / len(sample)
    floor = eap["one plain forward"]  # no patching loop can take less than one forward per edge
    eap_ig = time_round_robin({
        f"minibert edge_attribution, EAP-IG ({steps} steps in one program)":
            lambda: circuits.edge_attribution(model, clean, corrupted, metric, method="eap-ig", steps=steps),
        f"loop of {steps} single-step programs (EAP each)":
            lambda: [circuits.edge_attribution(model, clean, corrupted, metric) for _ in range(steps)],
    }, settings)

    torch.set_num_threads(2)
    hf = hf_model(bundled_dir(), "eager")
    batch = model.tokenize(clean)
    ours = circuits.token_attribution(model, batch, metric, steps=ig_steps)
    theirs = captum_ig(hf, batch, direction, ig_steps)
    agreement = float(np.abs(ours.scores - theirs).max())
    assert np.isfinite(agreement) and ours.scores.shape == theirs.shape
    ig = time_round_robin({
        f"minibert token_attribution ({ig_steps} Gauss–Legendre steps)":
            lambda: block(circuits.token_attribution(model, batch, metric, steps=ig_steps).scores),
        "captum LayerIntegratedGradients (transformers, 2 torch threads)":
            lambda: captum_ig(hf, batch, direction, ig_steps),
    }, settings)
    for times in (eap, eap_ig, ig):
        check_times(times)

    info = machine()
    run = "smoke" if args.smoke else "quick" if settings.quick else "full"
    T = model.inputs(clean).shape[1]
    print(f"## Circuits (issue 30) — {info['cpu']}, {info['date']}, load average {load_average()}, {run} run "
          f"(`python benchmarks/circuits.py{' --' + run if run != 'full' else ''}`)\n")
    print(f"{info['versions']}. Bundled all-MiniLM-L6-v2 (6 layers × 12 heads), {len(pairs)} synthetic prompt pairs "
          f"of up to {T} tokens; median of {settings.repeats} runs, compiled programs warm. The graph has "
          f"{n_edges} edges; the patching loop is timed over {len(sample)} of them and scaled to all "
          f"({fmt(per_edge * 1e3, 1)} ms per edge). Integrated gradients: largest |difference| minibert vs captum "
          f"{agreement:.1e} (largest |score| {np.abs(theirs).max():.1e}).\n")
    rows = [["minibert EAP, every edge", fmt(eap["minibert edge_attribution, EAP (every edge, one program)"], 2), "1×"],
            [f"one real patch per edge (path_patching), {n_edges} edges (from {len(sample)})",
             fmt(per_edge * n_edges, 1),
             fmt(per_edge * n_edges / eap["minibert edge_attribution, EAP (every edge, one program)"], 0) + "×"],
            [f"one plain forward per edge (the floor of any patching loop), {n_edges} edges", fmt(floor * n_edges, 1),
             fmt(floor * n_edges / eap["minibert edge_attribution, EAP (every edge, one program)"], 0) + "×"]]
    for times in (eap_ig, ig):
        first = next(iter(times.values()))
        rows += [[name, fmt(seconds, 2), fmt(seconds / first, 1) + "×"] for name, seconds in times.items()]
    print(markdown_table(["case", "s", "time / minibert's"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

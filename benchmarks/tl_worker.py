"""TransformerLens' HookedEncoder on a checkpoint directory, timed; run by benchmarks/dense.py in an
interpreter that has TransformerLens < 4 (4.0 removed HookedEncoder), usually a separate venv.

    python tl_worker.py DIR BATCH LENGTH REPEATS WARMUP THREADS CASES  → one JSON line {case: median seconds}

CASES is a comma-separated subset of nothing,patterns,everything.

The weights are the same files minibert and transformers read (converted with TransformerLens' own
convert_bert_weights). HookedEncoder always applies its MLM head and unembedding; a plain encoder
checkpoint has neither and minibert computes neither, so both are replaced by the identity.
"""

import json
import statistics
import sys
import time
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")


def load(directory: str):
    import transformers
    from transformer_lens import HookedEncoder, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.bert import convert_bert_weights

    transformers.logging.set_verbosity_error()
    hf = transformers.BertForPreTraining.from_pretrained(directory).eval()  # MLM head random: unused
    c = hf.config
    cfg = HookedTransformerConfig(
        d_model=c.hidden_size, d_head=c.hidden_size // c.num_attention_heads, n_heads=c.num_attention_heads,
        d_mlp=c.intermediate_size, n_layers=c.num_hidden_layers, n_ctx=c.max_position_embeddings,
        eps=c.layer_norm_eps, d_vocab=c.vocab_size, act_fn="gelu", attention_dir="bidirectional",
        original_architecture="BertForMaskedLM", model_name="bert", device="cpu", dtype=torch.float32)
    model = HookedEncoder(cfg, move_to_device=False)
    model.load_state_dict(convert_bert_weights(hf, cfg), strict=False)
    model.mlm_head = torch.nn.Identity()
    model.unembed = torch.nn.Identity()
    return model.eval()


def main():
    directory, B, T, repeats, warmup, threads = sys.argv[1], *map(int, sys.argv[2:7])
    wanted = sys.argv[7].split(",")
    torch.set_num_threads(threads)
    model = load(directory)
    rng = np.random.default_rng(0)
    ids = torch.tensor(rng.integers(1996, model.cfg.d_vocab, size=(B, T)))
    ids[:, 0], ids[:, T // 2], ids[:, -1] = 101, 102, 102
    types = torch.zeros_like(ids)
    types[:, T // 2 + 1:] = 1
    mask = torch.ones_like(ids)
    kwargs = dict(token_type_ids=types, one_zero_attention_mask=mask)
    cases = {
        "nothing": lambda: model(ids, **kwargs),
        "patterns": lambda: model.run_with_cache(ids, names_filter=lambda n: n.endswith("attn.hook_pattern"), **kwargs),
        "everything": lambda: model.run_with_cache(ids, **kwargs),
    }
    cases = {name: fn for name, fn in cases.items() if name in wanted}
    times = {name: [] for name in cases}
    with torch.inference_mode():
        for fn in cases.values():
            for _ in range(warmup):
                fn()
        for _ in range(repeats):
            for name, fn in cases.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    print(json.dumps({name: statistics.median(t) for name, t in times.items()}))


if __name__ == "__main__":
    main()

"""SAE training throughput, tokens per second including the model's forward: minibert (texts streamed through
the compiled forward with `sae.activations`: packed several to a row, the device's default tokens per forward;
one compiled TopK training step per batch) against the pipeline a PyTorch user writes (transformers' BertModel
with a forward hook on block 3's output, `per_forward` texts per forward padded to the longest, real
non-special tokens gathered and shuffled, a torch TopK SAE step with AuxK and Adam, decoder rows renormalised).
Same texts, same SAE batch and widths, same machine and threads; each side is timed over one pass after a
warm-up pass on other texts (compiling, allocator warm-up).

    python benchmarks/sae.py [--smoke]         # prints a Markdown section for benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from harness import (
    bundled_dir,
    english_like_texts,
    fmt,
    hf_model,
    load_average,
    machine,
    markdown_table,
    scratch_dir,
    tiny_checkpoint,
)

import minibert
from minibert.analysis import sae

FULL = dict(texts=512, width=4096, k=32, batch=1024, per_forward=32, layer=3)
SMOKE = dict(texts=48, width=64, k=4, batch=64, per_forward=8, layer=1)


def minibert_pass(model, texts, sizes, trainer):
    hook = f"blocks.{sizes['layer']}.hook_resid_post"
    tokens = 0
    for x in sae.activations(model, texts, hook, batch_size=sizes["batch"], buffer_tokens=8 * sizes["batch"]):
        trainer.step(x)
        tokens += len(x)
    return tokens


class TorchPipeline:
    """transformers forward + forward hook + a torch TopK SAE (the same algorithm as minibert's Trainer)."""

    def __init__(self, directory, tokenizer, sizes, d_in, device="cpu"):
        import torch

        self.torch, self.sizes, self.tokenizer, self.device = torch, sizes, tokenizer, device
        self.model = hf_model(directory, "sdpa").to(device)
        self.captured = []
        self.model.encoder.layer[sizes["layer"]].register_forward_hook(
            lambda module, args, output: self.captured.append(output[0] if isinstance(output, tuple) else output))
        generator = torch.Generator().manual_seed(0)
        W_dec = torch.randn(sizes["width"], d_in, generator=generator).to(device)
        W_dec /= W_dec.norm(dim=-1, keepdim=True)
        self.p = {"W_enc": W_dec.T.clone().requires_grad_(),
                  "b_enc": torch.zeros(sizes["width"], device=device, requires_grad=True),
                  "W_dec": W_dec.requires_grad_(), "b_dec": torch.zeros(d_in, device=device, requires_grad=True)}
        self.optimizer = torch.optim.Adam(list(self.p.values()), lr=2e-4)
        self.since_fired = torch.zeros(sizes["width"], dtype=torch.int64, device=device)
        self.rng = np.random.default_rng(0)

    def top_k(self, values, k):
        kept, index = self.torch.topk(values, k, dim=-1)
        return self.torch.zeros_like(values).scatter(-1, index, kept).relu()

    def step(self, x):
        torch, p = self.torch, self.p
        pre = (x - p["b_dec"]) @ p["W_enc"] + p["b_enc"]
        latents = self.top_k(pre, self.sizes["k"])
        error = x - (latents @ p["W_dec"] + p["b_dec"])
        dead = self.since_fired >= 1_000_000
        loss = (error**2).sum(-1).mean()
        if dead.any():
            z = self.top_k(torch.where(dead, pre, torch.tensor(-torch.inf, device=x.device)), x.shape[1] // 2)
            loss = loss + ((error.detach() - z @ p["W_dec"]) ** 2).sum(-1).mean() / 32
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        with torch.no_grad():
            p["W_dec"] /= p["W_dec"].norm(dim=-1, keepdim=True)
        self.since_fired = torch.where((latents > 0).any(0), 0, self.since_fired + len(x))

    def run(self, texts):
        torch, batch_size = self.torch, self.sizes["batch"]
        pool, tokens = [], 0
        for start in range(0, len(texts), self.sizes["per_forward"]):
            encoded = self.tokenizer(texts[start:start + self.sizes["per_forward"]], padding=True, truncation=True,
                                     max_length=128, return_tensors="pt", return_special_tokens_mask=True)
            special = encoded.pop("special_tokens_mask").to(self.device)
            encoded = encoded.to(self.device)
            self.captured.clear()
            with torch.no_grad():
                self.model(**encoded)
            keep = (encoded["attention_mask"] > 0) & (special == 0)
            pool.append(self.captured[0][keep])
            if sum(map(len, pool)) >= 8 * batch_size:
                tokens += self.drain(pool, keep=4 * batch_size)
        return tokens + self.drain(pool, keep=0)

    def drain(self, pool, keep):
        x = self.torch.cat(pool)
        x = x[self.torch.from_numpy(self.rng.permutation(len(x))).to(x.device)]
        out = (len(x) - keep) // self.sizes["batch"] * self.sizes["batch"]
        for start in range(0, out, self.sizes["batch"]):
            self.step(x[start:start + self.sizes["batch"]])
        pool[:] = [x[out:]]
        return out


def throughput(directory, sizes: dict, device: str = "cpu") -> dict[str, tuple[int, float]]:
    """{pipeline: (tokens trained on, tokens per second)} for minibert and the PyTorch pipeline on `directory`."""
    import transformers

    model = minibert.load(directory)
    d_in = model.config.hidden_size
    warm, timed = english_like_texts(sizes["texts"], seed=1)[0], english_like_texts(sizes["texts"], seed=2)[0]
    trainer = sae.Trainer(sae.SAEConfig(d_in=d_in, d_sae=sizes["width"], k=sizes["k"]), learning_rate=2e-4)
    torch_side = TorchPipeline(directory, transformers.BertTokenizerFast.from_pretrained(str(directory)), sizes, d_in,
                               device)
    rates = {}
    for name, run in ((MINIBERT, lambda t: minibert_pass(model, t, sizes, trainer)), (PYTORCH, torch_side.run)):
        run(warm)
        start = time.perf_counter()
        tokens = run(timed)
        if device == "cuda":
            import torch

            torch.cuda.synchronize()
        rates[name] = (tokens, tokens / (time.perf_counter() - start))
    return rates


MINIBERT, PYTORCH = "minibert (activations + compiled step)", "transformers hook + torch SAE step"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script runs")
    args = parser.parse_args(argv)
    sizes = SMOKE if args.smoke else FULL
    directory = tiny_checkpoint(scratch_dir() / "tiny-bert") if args.smoke else bundled_dir()
    d_in = minibert.load(directory).config.hidden_size
    rates = throughput(directory, sizes)
    facts = machine()
    base = rates[PYTORCH][1]
    print(f"## SAE training throughput ({'smoke' if args.smoke else 'full'})\n")
    print(f"{facts['cpu']}, {facts['cores']} cores, load {load_average()}; {facts['versions']}\n")
    print(f"{'tiny random BERT' if args.smoke else 'bundled all-MiniLM-L6-v2'}, block {sizes['layer']}'s output, "
          f"TopK SAE {d_in} → {sizes['width']}, k = {sizes['k']}, batches of {sizes['batch']} tokens, "
          f"minibert packs texts into rows of 128 tokens, PyTorch runs {sizes['per_forward']} texts per forward "
          f"padded to the longest; {sizes['texts']} generated texts.\n")
    rows = [[name, str(tokens), fmt(rate, 0), fmt(rate / base)] for name, (tokens, rate) in rates.items()]
    print(markdown_table(["pipeline", "tokens trained on", "tokens / s", "× PyTorch"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

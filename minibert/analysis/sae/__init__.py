"""Sparse autoencoders on any hook of a frozen encoder (docs/probes.md): TopK (Gao et al. 2024, with AuxK)
and ReLU + L1 (Anthropic 2023; SAELens' "standard"), trained on streamed activations, measured by L0, FVU,
dead/dense latents and spliced-in fidelity, saved in SAELens' file layout.

    from minibert.analysis import sae
    config = sae.SAEConfig(d_in=384, d_sae=4096, k=32, hook_name="blocks.3.hook_resid_post")
    trainer = sae.Trainer(config, learning_rate=2e-4, warmup=100)
    trainer.train(sae.activations(model, texts, config.hook_name, batch_size=1024))
    sae.evaluate(config, trainer.params, x)                   # {"l0", "fvu", "dead", "dense", "frequency"}
    sae.spliced_fidelity(model, config, trainer.params, texts)  # {"ce_*", "loss_recovered", "kl", …} or {"cosine", …}
    sae.save("out/sae", config, trainer.params); config, params = sae.load("out/sae")
"""

from minibert.analysis.sae.metrics import evaluate, splice_hook, spliced_fidelity
from minibert.analysis.sae.model import ARCHITECTURES, SAEConfig, decode, encode, init_params, reconstruct
from minibert.analysis.sae.saelens import load, save
from minibert.analysis.sae.source import ActivationStream, activations, hook_width, text_rows, token_activations
from minibert.analysis.sae.training import Trainer

__all__ = [
    "ARCHITECTURES",
    "ActivationStream",
    "SAEConfig",
    "Trainer",
    "activations",
    "decode",
    "encode",
    "evaluate",
    "hook_width",
    "init_params",
    "load",
    "reconstruct",
    "save",
    "splice_hook",
    "spliced_fidelity",
    "text_rows",
    "token_activations",
]

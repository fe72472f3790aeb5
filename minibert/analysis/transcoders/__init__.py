"""Transcoders at any block's MLP (docs/transcoders.md): sparse latents from the MLP's input to its output —
TopK, BatchTopK, JumpReLU and ReLU + L1, with or without a linear skip — trained on streamed (input, output)
pairs, measured by FVU and the spliced model, saved in SAELens 6's transcoder layout.

    from minibert.analysis import transcoders
    hook_in, hook_out = transcoders.sites(model, 3)            # the MLP's input and output hooks
    config = transcoders.TranscoderConfig(d_in=384, d_sae=4096, d_out=384, layer=3, k=32)
    trainer = transcoders.Trainer(config, learning_rate=2e-4)
    trainer.train(transcoders.activations(model, texts, 3, batch_size=1024), steps=2000, progress=True)
    pairs = transcoders.token_pairs(model, held_out, 3)         # (x, y) and the site they were read at
    transcoders.evaluate(trainer.config, trainer.params, pairs)  # {"l0", "fvu", "dead", "dense", "frequency"}
    transcoders.spliced_fidelity(model, trainer.config, trainer.params, held_out)  # {"ce_*", "loss_recovered", …}
    transcoders.save("out/tc", trainer.config, trainer.params); config, params = transcoders.load("out/tc")
    transcoders.forward(config, params, x)                      # ŷ [..., D]
"""

from minibert.analysis.transcoders.metrics import checked_site, evaluate, splice_hooks, spliced_fidelity
from minibert.analysis.transcoders.model import (
    ARCHITECTURES,
    TranscoderConfig,
    decode,
    encode,
    forward,
    init_params,
    pre_activations,
)
from minibert.analysis.transcoders.saelens import load, save
from minibert.analysis.transcoders.source import Pairs, PairStream, activations, sites, source_of, token_pairs
from minibert.analysis.transcoders.training import Trainer

__all__ = [
    "ARCHITECTURES",
    "PairStream",
    "Pairs",
    "Trainer",
    "TranscoderConfig",
    "activations",
    "checked_site",
    "decode",
    "encode",
    "evaluate",
    "forward",
    "init_params",
    "load",
    "pre_activations",
    "save",
    "sites",
    "source_of",
    "splice_hooks",
    "spliced_fidelity",
    "token_pairs",
]

"""Transcoders at any block's MLP (docs/transcoders.md): sparse latents from the MLP's input to its output.

    from minibert.analysis import transcoders
    config = transcoders.TranscoderConfig(d_in=384, d_sae=4096, d_out=384, layer=3, k=32)
    params = transcoders.init_params(config)
    transcoders.forward(config, params, x)        # ŷ [..., D]
"""

from minibert.analysis.transcoders.model import (
    ARCHITECTURES,
    TranscoderConfig,
    decode,
    encode,
    forward,
    init_params,
    pre_activations,
)

__all__ = ["ARCHITECTURES", "TranscoderConfig", "decode", "encode", "forward", "init_params", "pre_activations"]

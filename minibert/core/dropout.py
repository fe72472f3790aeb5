"""Training's dropout inside the forward: inverted dropout with an explicit key, one mask per site.

model.py's forward takes a `Dropout` (NO_DROPOUT in inference, where every rate is 0 and each call returns its
value): the hidden states, the attention pattern and the classifier's input each pass through it at the sites
Hugging Face's BERT drops them. A scanned stack (Encoder.stack) gives each layer a `LayerDropout` drawing the masks
its unrolled block would.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp


class Dropout:
    """Inverted dropout, as torch.nn.Dropout computes it in training: each value is kept with probability
    1 − rate and scaled by 1/(1 − rate), so its expectation is unchanged. Three rates, as Hugging Face's configs
    name them: `hidden` (embeddings and each sublayer's output before it joins the residual stream),
    `attention` (the attention pattern before it weighs v) and `classifier` (the classifier's input).

    The key is explicit: each site draws its mask from mask_key(site_key(site)), so one step is reproducible from its
    key (cuDNN's fused attention dropout aside: attention.cudnn_attention). A rate of 0 returns the value itself,
    so NO_DROPOUT's forward is the inference computation.
    Hooks see values before their dropout (hook_attn_out, hook_pattern keep their meaning in training).
    """

    def __init__(self, key=None, *, hidden: float = 0.0, attention: float = 0.0, classifier: float = 0.0):
        self.key, self.hidden_rate, self.attention_rate, self.classifier_rate = key, hidden, attention, classifier

    def site_key(self, site: str) -> jax.Array:
        """The key of one dropout site: fold_in(key, crc32(site))."""
        return jax.random.fold_in(self.key, zlib.crc32(site.encode()))

    def _drop(self, site: str, x, rate: float):
        if rate == 0.0:
            return x
        keep = jax.random.bernoulli(mask_key(self.site_key(site)), 1.0 - rate, x.shape)
        return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)

    def hidden(self, site: str, x):
        return self._drop(site, x, self.hidden_rate)

    def attention(self, site: str, x):
        return self._drop(site, x, self.attention_rate)

    def classifier(self, site: str, x):
        return self._drop(site, x, self.classifier_rate)


NO_DROPOUT = Dropout()


def mask_key(site_key) -> jax.Array:
    """The key a dropout site draws its mask from: its site key (Dropout.site_key) turned into an rbg key.

    An rbg key draws its bits with XLA's RngBitGenerator, one pass over the mask, where the default threefry
    key computes a 20-round hash per 32 bits (and on an accelerator kept [B, H, T, S] u32 intermediates for the
    backward pass). Four words drawn from the site key seed it, so the mask stays a function of the step's key
    and the site, whatever the caller's key implementation."""
    words = jax.random.bits(site_key, (4,), jnp.uint32)
    return jax.random.wrap_key_data(words, impl="rbg")


class LayerDropout(Dropout):
    """A Dropout inside a scanned block (Encoder.stack), whose sites are named "blocks.*.…": each layer draws the
    masks its unrolled block would, from the crc32 of its own site name ("blocks.3.…"), picked by the traced
    layer."""

    def __init__(self, dropout: Dropout, layer, layers):
        super().__init__(dropout.key, hidden=dropout.hidden_rate, attention=dropout.attention_rate,
                         classifier=dropout.classifier_rate)
        self.layer, self.layers = layer, layers

    def site_key(self, site: str) -> jax.Array:
        tags = jnp.asarray([zlib.crc32(site.replace("*", str(i), 1).encode()) for i in self.layers], jnp.uint32)
        return jax.random.fold_in(self.key, tags[self.layer - self.layers[0]])

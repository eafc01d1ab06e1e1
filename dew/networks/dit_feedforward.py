"""A DiT block's feed-forward: timm's ``Mlp`` (DiT, SiT, REPA, MeanFlow) and the SwiGLU forms of
LightningDiT and improved MeanFlow, built from ``dew.networks.dit_layers.Linear``. Each names its
hidden pre-activation and its output (``dew.networks.remat``'s ``MLP_HIDDEN``, ``MLP_OUTPUT``) so
that a remat policy can keep them."""

from __future__ import annotations

import functools

import haiku as hk
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from dew.networks.dit_layers import Linear
from dew.networks.remat import MLP_HIDDEN, MLP_OUTPUT


class Mlp(hk.Module):
    """timm ``Mlp``: fc2(GELU_tanh(fc1(x))), hidden width int(D · mlp_ratio)."""

    def __init__(self, hidden_features: int, name: str | None = None):
        super().__init__(name=name)
        self.hidden_features = hidden_features

    def __call__(self, x: jax.Array) -> jax.Array:
        h = checkpoint_name(Linear(self.hidden_features, name="fc1")(x), MLP_HIDDEN)
        return checkpoint_name(Linear(x.shape[-1], name="fc2")(jax.nn.gelu(h, approximate=True)), MLP_OUTPUT)


class SwiGLU(hk.Module):
    """LightningDiT's ``SwiGLUFFN``: w3(silu(x1) · x2), [x1, x2] = chunk(w12(x), 2); with
    ``fused=False`` iMF's ``SwiGLUMlp``: w2(silu(w1(x)) · w3(x)). ``bias``: the linears' biases;
    ``w_init``: their weights' initialiser."""

    def __init__(
        self,
        hidden_features: int,
        fused: bool = True,
        bias: bool = True,
        w_init: hk.initializers.Initializer | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.hidden_features, self.fused, self.bias, self.w_init = hidden_features, fused, bias, w_init

    def __call__(self, x: jax.Array) -> jax.Array:
        linear = functools.partial(Linear, bias=self.bias, w_init=self.w_init)
        d, hidden = x.shape[-1], self.hidden_features
        if self.fused:
            x1, x2 = jnp.split(checkpoint_name(linear(2 * hidden, name="w12")(x), MLP_HIDDEN), 2, -1)
        else:
            x1, x2 = (checkpoint_name(linear(hidden, name=n)(x), MLP_HIDDEN) for n in ("w1", "w3"))
        return checkpoint_name(linear(d, name="w3" if self.fused else "w2")(jax.nn.silu(x1) * x2), MLP_OUTPUT)

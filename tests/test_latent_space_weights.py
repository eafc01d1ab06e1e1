"""Training on pre-encoded latents reads no VAE weights: the latent draw needs only the scaling,
and the weights are read (and their errors named) when something first decodes, or at once for
a run that decodes while it trains (previews)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from dew.objectives import latent_space
from dew.schema import ConfigError, Key, Section


def default(key: Key | Section) -> Any:
    """A key's default (the latent section holds keys only, no nested section)."""
    assert isinstance(key, Key)
    return key.default


def section(weights: str) -> ml_collections.ConfigDict:
    """``config.objective.latent`` at its defaults, the stability VAE, ``weights``."""
    config = ml_collections.ConfigDict({name: default(key) for name, key in latent_space.CONFIG.keys.items()})
    config.encoder = "stability_vae"
    config.weights = weights
    return config


def test_the_latent_draw_needs_no_weights_file_and_decoding_names_it(tmp_path):
    missing = str(tmp_path / "no-such-vae.safetensors")
    with pytest.raises(ConfigError, match=r"config\.objective\.latent\.weights=.*no-such-vae"):
        latent_space.from_config(section(missing))  # a run that previews: read at once
    space = latent_space.from_config(section(missing), decodes=False)
    assert space is not None
    raw = jnp.ones((2, 4, 4, 8), jnp.float32)
    drawn = space.draw(raw, jax.random.key(0))
    assert drawn.shape == (2, 4, 4, 4) and bool(jnp.all(jnp.isfinite(drawn)))
    np.testing.assert_array_equal(space.mean(raw), space.mean(raw))
    assert space.image_shape((4, 4, 4)) == (32, 32, 3)
    with pytest.raises(ConfigError, match=r"config\.objective\.latent\.weights=.*no-such-vae"):
        space.to_images(np.zeros((1, 4, 4, 4), np.float32))


def test_a_run_decodes_while_training_when_it_previews():
    config = ml_collections.ConfigDict({"preview": {"every": 0}})
    assert latent_space.decodes_while_training(config) is False
    config.preview.every = 500
    assert latent_space.decodes_while_training(config) is True

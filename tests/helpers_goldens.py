"""What the parity tests against a reference's recorded goldens share (MeanFlow's and improved
MeanFlow's: the tiny-network and the flax-DiT ones): the ``.npz`` read whole, the comparison at a
derived tolerance, the recorded ``meta_json``, the reference's flax parameters (and gradients) as
dew's, the class-label input spec, the reference's recorded noise in place of dew's draw.

Test files import it as ``from helpers_goldens import close, load_golden`` (see helpers_common).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.encoding.class_label import UNCONDITIONAL
from dew.inputs import Condition, Field, InputSpec
from dew.interop.flax_dit import params_from_flax


def load_golden(path) -> dict[str, np.ndarray]:
    """Every array of the golden ``.npz`` at ``path`` (no pickles)."""
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def close(actual, expected, rtol: float) -> None:
    """``actual`` equals ``expected`` to ``rtol`` relative, with atol = rtol · max|expected| (entries
    that cancel to near zero carry their operands' absolute error); an empty array, exactly."""
    expected = np.asarray(expected)
    atol = rtol * float(np.max(np.abs(expected))) if expected.size else 0.0
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=rtol, atol=atol)


def meta(g: dict[str, np.ndarray]) -> dict:
    """The golden's ``meta_json`` record (settings, sizes, what the cases exercise)."""
    return json.loads(str(g["meta_json"]))


def unflatten(flat: dict[str, np.ndarray]) -> dict:
    """``{"a/b/c": x}`` -> ``{"a": {"b": {"c": x}}}``."""
    tree: dict = {}
    for key, value in flat.items():
        node = tree
        *parents, leaf = key.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def flax_tree_as_dew(g: dict[str, np.ndarray], prefix: str) -> dict:
    """The flax tree recorded under ``prefix`` (``param/``, ``<case>/grad/``) as dew's haiku
    parameters (``dew.interop.flax_dit.params_from_flax``), as numpy arrays."""
    return params_from_flax(unflatten({k[len(prefix) :]: v for k, v in g.items() if k.startswith(prefix)}))


def dew_params(g: dict[str, np.ndarray]):
    """The reference network's parameters (``param/...``) as dew's, on the device."""
    return jax.tree_util.tree_map(jnp.asarray, flax_tree_as_dew(g, "param/"))


def assert_gradients_match(grads, g: dict[str, np.ndarray], case: str, rtol: float) -> None:
    """dew's gradient tree equals the reference's recorded ``<case>/grad/...``, module by module,
    leaf by leaf (the same modules on both sides)."""
    expected = flax_tree_as_dew(g, f"{case}/grad/")
    assert set(grads) == set(expected)
    for module, leaves in expected.items():
        for name, value in leaves.items():
            close(grads[module][name], value, rtol)


def class_label_spec(size: int, channels: int) -> InputSpec:
    """Square ``size`` x ``size`` x ``channels`` images with an int class label."""
    return InputSpec(
        Field("image", (size, size, channels)),
        {"label": Condition("class_label", Field("label", (), "int32"), UNCONDITIONAL)},
    )


def use_recorded_noise(monkeypatch: pytest.MonkeyPatch, noise: jax.Array) -> None:
    """``jax.random.normal`` answers the reference's recorded ``noise`` (of that shape only), so
    a sampler starts from the reference's own draw."""

    def recorded_noise(key, shape, dtype=jnp.float32):
        assert tuple(shape) == noise.shape
        return noise.astype(dtype)

    monkeypatch.setattr(jax.random, "normal", recorded_noise)

"""dew.augment against NVlabs/edm's own ``AugmentPipe``: for the reference's recorded random draws,
dew's images and labels match its outputs (goldens in third_party/edm/augment_reference.npz, made
by third_party/edm/make_augment_reference.py) within a bound derived from float32 roundoff; p=0 is
the identity; a sharded jitted call equals the unsharded one; the key alone decides the output."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_common import ROOT
from jax.sharding import NamedSharding, PartitionSpec

from dew.augment.pipeline import DRAWS, apply, augment, draw
from dew.augment.resample import HZ
from dew.augment.settings import COLOUR, GEOMETRIC, AugmentSettings

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

GOLDENS = np.load(ROOT / "third_party" / "edm" / "augment_reference.npz", allow_pickle=False)
CASES = {c["name"]: c for c in json.loads(str(GOLDENS["cases_json"]))}
U = float(np.finfo(np.float32).eps) / 2  # unit roundoff, 2^-24
PAPER = {"xflip": 1e8, "yflip": 1.0, "scale": 1.0, "rotate_frac": 1.0, "aniso": 1.0, "translate_frac": 1.0}


def settings_of(name: str) -> AugmentSettings:
    return AugmentSettings(**{k: float(v) for k, v in CASES[name]["settings"].items()})


def recorded_draws(name: str, settings: AugmentSettings) -> dict[str, tuple[jax.Array, ...]]:
    """The reference's random tensors, in its call order, assigned to dew's named draws."""
    sequence, kinds = [], list(GOLDENS[f"{name}/draw_kinds"])
    while f"{name}/draw{len(sequence)}" in GOLDENS:
        sequence.append(GOLDENS[f"{name}/draw{len(sequence)}"])
    out, i = {}, 0
    for transform in settings.transforms:
        values = []
        for kind, high, _ in DRAWS[transform]:
            assert kinds[i] == (f"randint:{high}" if kind == "randint" else kind), (name, i, kinds[i])
            values.append(jnp.asarray(sequence[i].astype(np.int32) if kind == "randint" else sequence[i]))
            i += 1
        out[transform] = tuple(values)
    assert i == len(sequence), f"{name}: the reference drew {len(sequence)} tensors, dew used {i}"
    return out


def image_bound(settings: AugmentSettings, images: np.ndarray) -> float:
    """The largest float32 difference two correct evaluations of the pipeline may show.

    * Pixel blitting (flips, 90° rotations, integer translation) only moves values: 0.
    * Colour: out = M x + m with M a product of at most 5 4x4 matrices; each entry of the
      product and of M x is a dot product of at most 4 terms, so (Higham's γ_n) the error is at
      most 4·(5+1)·u relative to the sum of magnitudes along the chain, which the factors' norms
      bound: |brightness| ≤ 0.2·8, contrast ≤ 2^(0.5·8), luma flip and hue are orthogonal
      (norm 1), saturation ≤ 2^(1·8) for the |z| < 8 normal draws a float32 generator returns
      (here all |z| < 4.5): bound 24·u·(16 · 2^4 · max|x| + 1.6).
    * Geometry: the output is a 12-tap filter (L1 norm ‖h‖₁ per pass) along x and y of a
      bilinear interpolation of the 2x-upsampled image (two passes of ‖h‖₁ each). Two error
      sources: (1) the sample coordinates, a chain of at most 16 compositions of 3x3 matrices
      (3-term dot products), 8 transcendental draws' maps (exp2, cos, sin, reciprocal, each
      within 4 ulp) and the grid's dot product and unnormalisation: 16·3 + 8·4 + 5 < 96 roundings,
      relative to a coordinate of at most S = 2·(3W-2) upsampled pixels, moving each sample by
      δ ≤ 96·u·S; a bilinear interpolant moves by at most its largest neighbour difference per
      pixel, ≤ 2·‖h‖₁²·max|x|; (2) the 4 filter passes and the 4-term interpolation, at most
      12·4 + 4 = 52 terms in each output's sum: γ_52 relative to ‖h‖₁⁴·max|x|. Output error ≤
      ‖h‖₁⁴·max|x|·(2·δ + 52·u) (the downsampling passes multiply the warp's error by ‖h‖₁²).
    """
    _, _, h, w = images.shape
    scale = float(np.max(np.abs(images)))
    bound = 0.0
    if any(getattr(settings, n) > 0 for n in GEOMETRIC):
        l1 = float(np.sum(np.abs(HZ.astype(np.float64))))
        coordinate = 96 * U * 2 * (3 * max(h, w) - 2)
        bound += l1**4 * scale * (2 * coordinate + 52 * U)
        scale = l1**2 * scale  # the warped image's magnitude bound, fed to the colour stage
    if any(getattr(settings, n) > 0 for n in COLOUR):
        bound = bound * 16 * 2**4 + 24 * U * (16 * 2**4 * scale + 1.6)
    return bound


def label_bound(labels: np.ndarray) -> float:
    """Each label is at most 4 float32 operations on a draw (e.g. (u·2-1)·π·max, then cos - 1 or
    a product with cos/sin within 4 ulp): 8·u relative to max(1, |label|)."""
    return 8 * U * max(1.0, float(np.max(np.abs(labels))))


@pytest.mark.parametrize("name", sorted(CASES))
def test_images_and_labels_match_the_reference_for_its_draws(name):
    settings = settings_of(name)
    draws = recorded_draws(name, settings)
    images = GOLDENS[f"{name}/images"]
    out, labels = jax.jit(lambda d, x: apply(settings, d, x))(
        draws, jnp.asarray(images.transpose(0, 2, 3, 1))
    )
    out = np.asarray(out).transpose(0, 3, 1, 2)
    want_out, want_labels = GOLDENS[f"{name}/out"], GOLDENS[f"{name}/labels"]
    assert labels.shape == want_labels.shape == (images.shape[0], settings.label_dim)
    np.testing.assert_allclose(np.asarray(labels), want_labels, rtol=0, atol=label_bound(want_labels))
    bound = image_bound(settings, images)
    np.testing.assert_allclose(out, want_out, rtol=0, atol=bound)
    if bound:  # the bound is not so loose that an image left alone would pass
        assert np.max(np.abs(images - want_out)) > 10 * bound


@pytest.mark.parametrize("name", sorted(CASES))
def test_dew_draws_the_reference_s_shapes_and_kinds(name):
    settings = settings_of(name)
    n = CASES[name]["shape"][0]
    ours = jax.eval_shape(lambda k: draw(settings, k, n), jax.random.PRNGKey(0))
    theirs = recorded_draws(name, settings)
    assert sorted(ours) == sorted(theirs)  # (eval_shape returns the dict with sorted keys)
    for transform in ours:
        for a, b in zip(ours[transform], theirs[transform], strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype, (transform, a.shape, b.shape)


def _paper(p: float) -> AugmentSettings:
    return AugmentSettings(p=p, **PAPER)


def _batch(n: int = 8, size: int = 16, channels: int = 3) -> jax.Array:
    return jax.random.uniform(jax.random.PRNGKey(7), (n, size, size, channels), minval=-1, maxval=1)


def test_p0_is_the_identity_bit_for_bit():
    images = _batch()
    settings = AugmentSettings(p=0.0, **PAPER)
    out, labels = jax.jit(lambda k, x: augment(settings, k, x))(jax.random.PRNGKey(3), images)
    assert np.array_equal(np.asarray(out), np.asarray(images))
    assert labels.shape == (8, 0) and settings.label_dim == 0


def test_the_same_key_gives_the_same_output_and_another_key_another():
    settings, images = _paper(1.0), _batch()
    run = jax.jit(lambda k, x: augment(settings, k, x))
    a, la = run(jax.random.PRNGKey(5), images)
    b, lb = run(jax.random.PRNGKey(5), images)
    c, lc = run(jax.random.PRNGKey(6), images)
    assert np.array_equal(np.asarray(a), np.asarray(b)) and np.array_equal(np.asarray(la), np.asarray(lb))
    assert not np.array_equal(np.asarray(la), np.asarray(lc))
    assert not np.array_equal(np.asarray(a), np.asarray(c))
    assert la.shape == (8, 9)


def test_a_sharded_jitted_call_equals_the_unsharded_one():
    devices = jax.devices()
    assert len(devices) == 8, "conftest asks for eight CPU devices"
    settings, images = _paper(0.5), _batch(16)
    key = jax.random.PRNGKey(11)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    replicated = NamedSharding(mesh, PartitionSpec())
    fn = lambda k, x: augment(settings, k, x)  # noqa: E731
    sharded = jax.jit(fn, in_shardings=(replicated, rows), out_shardings=(rows, rows))
    out, labels = sharded(key, jax.device_put(images, rows))
    assert out.sharding.is_equivalent_to(rows, out.ndim)
    want, want_labels = jax.jit(fn)(key, images)
    assert np.array_equal(np.asarray(out), np.asarray(want))
    assert np.array_equal(np.asarray(labels), np.asarray(want_labels))

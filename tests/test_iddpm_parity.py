"""DiT's IDDPM process against facebookresearch/DiT's own ``diffusion/`` (third_party/dit_diffusion/):
the beta tables and respacing, q_sample, the hybrid training loss's terms (mse, vb and their sum
for the default, rescaled, fixed-variance and KL variants), p_mean_variance on the full and the
250-step process, and DDPM / DDIM sampling loops with the reference's noise injected.

The goldens are NCHW, dew is channel-last: arrays are transposed, values are not touched. Bounds
are float32 roundoff u = 2⁻²⁴ times a stated operation count, relative to the compared values'
scale; a sampling loop of n steps accumulates n per-step errors (the loop's contraction, √ᾱ ratios
<= 1 times x, keeps them from growing).
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.diffusion.iddpm import GaussianDiffusion, named_betas, space_timesteps

GOLDEN = pathlib.Path(__file__).resolve().parent.parent / "third_party" / "dit_diffusion" / "iddpm.npz"
U = 2.0**-24


@pytest.fixture(scope="module")
def ref():
    with np.load(GOLDEN, allow_pickle=False) as data:
        return dict(data)


def nhwc(a: np.ndarray) -> np.ndarray:
    """NCHW (or [steps, N, C, H, W]) -> channel-last."""
    return np.moveaxis(a, -3, -1)


def fixed_model(ref, learn_sigma: bool = True):
    W, b = jnp.asarray(ref["W"]), jnp.asarray(ref["b"])
    c = W.shape[1]

    def model(x, t):
        s = t.astype(jnp.float32).reshape(-1, 1, 1, 1) / 1000
        out = jnp.einsum("bhwc,oc->bhwo", x, W) * (1 + s) + b * s
        if not learn_sigma:
            return out[..., :c]
        return jnp.concatenate([out[..., :c], jnp.tanh(out[..., c:])], axis=-1)

    return model


def assert_within(actual, expected, ops: float, what: str = ""):
    expected = np.asarray(expected, np.float64)
    scale = max(float(np.max(np.abs(expected))), 1.0)
    err = float(np.max(np.abs(np.asarray(actual, np.float64) - expected)))
    assert err <= ops * U * scale, f"{what}: error {err:.3g} > bound {ops * U * scale:.3g}"


def test_betas_and_respacing_are_the_references(ref):
    # create_diffusion goes through SpacedDiffusion even unspaced: β re-derived as 1 − ᾱ_t/ᾱ_{t−1}
    np.testing.assert_array_equal(np.asarray(GaussianDiffusion.create("").betas), ref["betas_1000"])
    np.testing.assert_allclose(named_betas("linear", 1000), ref["betas_1000"], rtol=1e-11)
    d = GaussianDiffusion.create("250")
    assert d.timestep_map == tuple(ref["timestep_map_250"].tolist())
    # the re-derived betas: float64 arithmetic in the same order, so the same values
    np.testing.assert_allclose(np.asarray(d.betas), ref["betas_250"], rtol=0)
    for spec in ("250", "ddim25", "10,15,20", "1"):
        assert space_timesteps(1000, spec) == ref[f"space/{spec}"].tolist(), spec


@pytest.mark.default_compiler
def test_q_sample_and_training_loss_terms(ref):
    """q_sample: 3 operations. The loss terms: the MSE is a mean of squares of an 8-op
    difference; the VLB's KL and decoder NLL chain <= 40 operations (the posterior mean, exp,
    log, tanh), relative to the term's own scale (the KL's large values at small t carry their
    operands' relative error, not an absolute one)."""
    x_start, noise = jnp.asarray(nhwc(ref["x_start"])), jnp.asarray(nhwc(ref["noise"]))
    t = jnp.asarray(ref["t"], jnp.int32)
    base = GaussianDiffusion.create("")
    assert_within(base.q_sample(x_start, t, noise), nhwc(ref["q_sample"]), 4, "q_sample")
    variants = json.loads(str(ref["meta_json"]))["variants"]
    for name, kwargs in variants.items():
        d = GaussianDiffusion.create("", **kwargs)
        model = fixed_model(ref, kwargs.get("learn_sigma", True))
        terms = jax.jit(d.training_losses, static_argnums=0)(model, x_start, t, noise)
        expected_keys = {k.split("/")[-1] for k in ref if k.startswith(f"losses/{name}/")}
        assert set(terms) == expected_keys, name
        for key in terms:
            ops = 8 if key == "mse" else 40
            assert_within(terms[key], ref[f"losses/{name}/{key}"], ops, f"{name} {key}")


def test_the_vlb_term_does_not_train_the_mean():
    d = GaussianDiffusion.create("")
    x = jax.random.uniform(jax.random.key(0), (2, 3, 3, 2), minval=-1, maxval=1)
    noise = jax.random.normal(jax.random.key(1), x.shape)
    t = jnp.asarray([3, 700])

    def vb_of(mean_scale, var_scale):
        model = lambda x, t: jnp.concatenate([mean_scale * x, jnp.tanh(var_scale * x)], -1)  # noqa: E731
        return jnp.sum(d.training_losses(model, x, t, noise)["vb"])

    g_mean, g_var = jax.grad(vb_of, argnums=(0, 1))(0.3, 0.7)
    assert float(g_mean) == 0.0 and float(g_var) != 0.0


@pytest.mark.default_compiler
def test_p_mean_variance_full_and_respaced(ref):
    """The respaced process calls the model at the original indices (timestep_map); the mean is
    a posterior combination of a clipped or unclipped x_0 estimate (<= 16 ops, relative to
    √(1/ᾱ_t) |x| for the ε -> x_0 step: the bound's scale is the values' own)."""
    model, x_t = fixed_model(ref), jnp.asarray(nhwc(ref["x_t"]))
    for respacing in ("", "250"):
        d = GaussianDiffusion.create(respacing)
        key = respacing or "full"
        steps = jnp.asarray(ref[f"pmv_t/{key}"], jnp.int32)
        for clip in (True, False):
            out = d.p_mean_variance(model, x_t, steps, clip)
            for name in ("mean", "variance", "log_variance", "pred_xstart"):
                assert_within(out[name], nhwc(ref[f"pmv/{key}/{clip}/{name}"]), 32, f"{key} {clip} {name}")


@pytest.mark.default_compiler
def test_sampling_loops_with_the_references_noise(ref):
    """DDPM (p_sample_loop) on 10-, 25- and DiT's 250-step respacings and DDIM (η = 0 and 0.5) on
    the first two, with DiT's ``clip_denoised=False``: each row within 32 u per step so far of
    the trajectory's scale."""
    model, z = fixed_model(ref), jnp.asarray(nhwc(ref["z"]))
    for loop in json.loads(str(ref["meta_json"]))["loops"]:
        d = GaussianDiffusion.create(loop["respacing"])
        noises = jnp.asarray(nhwc(ref[loop["key"] + "/noises"]))
        run = jax.jit(
            lambda z, n, d=d, loop=loop: d.sample_loop(
                model, z, step_noises=n, clip_denoised=False, method=loop["method"], eta=loop["eta"]
            )
        )
        states, expected = np.asarray(run(z, noises)), nhwc(ref[loop["key"]])
        assert states.shape == expected.shape
        for i in range(expected.shape[0]):
            assert_within(states[i], expected[i], 32 * (i + 1), f"{loop['key']} step {i}")

"""Autoguidance (Karras et al. 2024, "Guiding a diffusion model with a bad version of itself")
against NVlabs/edm2's own ``generate_images.py`` ``edm_sampler`` with a guide network
(``third_party/edm2/autoguidance_reference.npz``, made by ``make_autoguidance_reference.py``):
two random-weight EDM2 networks, the sampler's defaults (32 Heun steps on σ ∈ [0.002, 80],
ρ = 7), guidance weights 1 (none) and those of the reference's autoguidance presets."""

from __future__ import annotations

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import registry
from dew.encoding.class_label import UNCONDITIONAL
from dew.inputs import Condition, Field, InputSpec
from dew.networks import edm2_weights
from dew.networks.edm2_precond import EDM2Precond
from dew.objectives.edm2 import EDM2
from dew.sampling import CFG, sample

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "..", "third_party", "edm2", "autoguidance_reference.npz")
UNIT_ROUNDOFF = float(np.finfo(np.float32).eps) / 2


def _objective(config: dict) -> EDM2:
    kwargs = {k: v for k, v in config.items() if k not in ("img_resolution", "img_channels")}
    res, channels = config["img_resolution"], config["img_channels"]
    label = Condition("class_label", Field("label", (), "int32"), UNCONDITIONAL)
    return EDM2(
        InputSpec(Field("image", (res, res, channels)), {"label": label}),
        registry.presets["EDM"],
        functools.partial(EDM2Precond, **kwargs),
        {"label": functools.partial(registry.encoders["class_label"], config["label_dim"])},
    )


def _params(ref, role: str):
    prefix = f"{role}/"
    state = {k[len(prefix) :]: ref[k] for k in ref.files if k.startswith(prefix)}
    return jax.tree.map(jnp.asarray, edm2_weights.convert_state_dict(state))


def test_autoguided_samples_match_the_reference_sampler():
    """Bound (first order): each denoiser evaluation is within ε_D = u · Σ fan-in · max|x| of the
    reference's (the network bound of test_edm2_network, over both networks); a guided one within
    (|w| + |w − 1|) ε_D. A Heun step from σ to σ' moves x by h = 1 − σ'/σ times averaged
    (D − x) terms, so an error in D enters with weight h, and the last point's clean prediction
    with weight 1: (Σ h + 1)(|w| + |w − 1|) ε_D in all. Guidance must move the samples by more
    than that bound, or the comparison could not tell the weights apart."""
    ref = np.load(REFERENCE)
    main, guide = (
        _objective(json.loads(str(ref["main_json"]))),
        _objective(json.loads(str(ref["guide_json"]))),
    )
    main_params, guide_params = _params(ref, "main"), _params(ref, "guide")
    conditions = {"label": jnp.asarray(np.argmax(ref["labels"], axis=1), jnp.int32)}
    noise = jnp.asarray(ref["noise"].transpose(0, 2, 3, 1))
    sigmas = np.asarray(main.process.sigmas(32))
    fan_ins = sum(
        int(np.prod(v.shape[:-1]))
        for tree in (main_params, guide_params)
        for m in tree.values()
        for k, v in m.items()
        if k == "weight"
    )

    @jax.jit
    def draw(weight, main_params, guide_params):
        denoise = main.guided_denoiser(main_params, conditions, CFG(weight=weight), guide, guide_params)
        return sample(denoise, noise, sigmas, "heun")

    steps_h = float(np.sum(1 - sigmas[1:] / sigmas[:-1]))
    scale = max(1.0, float(np.abs(ref["samples"]).max()))
    assert ref["guidance"][0] == 1.0
    for weight, want in zip(ref["guidance"], ref["samples"], strict=True):
        got = np.asarray(draw(jnp.float32(weight), main_params, guide_params))
        want = want.transpose(0, 2, 3, 1)
        w = float(weight)
        bound = (steps_h + 1) * (abs(w) + abs(w - 1)) * UNIT_ROUNDOFF * fan_ins * scale
        np.testing.assert_allclose(got, want, atol=bound, rtol=0, err_msg=f"guidance {w}")
        if w != 1.0:
            assert np.abs(want - ref["samples"][0].transpose(0, 2, 3, 1)).max() > 2 * bound, w


def _pipeline(workdir: str, shape: tuple, num_classes: int | None):
    from types import SimpleNamespace

    from dew.inference import Pipeline

    label = Condition("class_label", Field("label", (), "int32"), UNCONDITIONAL)
    objective = SimpleNamespace(
        input_spec=InputSpec(Field("image", shape), {"label": label} if num_classes else {}),
        num_classes=num_classes,
        denoiser=None,
        inference_options=lambda: {"seed": 0},
    )
    return Pipeline(objective, SimpleNamespace(seed=0), 8, {}, False, workdir)


def test_a_guide_of_another_resolution_or_conditioning_is_one_line_naming_it():
    import pytest

    from dew.inference import PipelineError, check_guide

    main = _pipeline("runs/main", (8, 8, 1), 10)
    check_guide(main, _pipeline("runs/xs", (8, 8, 1), 10))  # same data and conditioning: fine
    cases = {
        "sample shape": _pipeline("runs/big", (16, 16, 1), 10),
        "conditions": _pipeline("runs/uncond", (8, 8, 1), None),
        "classes": _pipeline("runs/five", (8, 8, 1), 5),
    }
    for what, guide in cases.items():
        with pytest.raises(PipelineError) as error:
            check_guide(main, guide)
        message = str(error.value)
        assert what in message and guide.workdir in message and "\n" not in message, message

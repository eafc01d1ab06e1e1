"""Objectives are built whole by their constructors, and the diffusion objective's sampling and
scoring are pure pieces that can be checked alone.

- Every objective dew registers, built by its ``from_config`` as the Trainer builds it, holds
  exactly the attributes its constructor left (same names, same objects): nothing is set on it
  after the constructor returns. Each registered name needs a config here to be built with.
- dew's objectives refuse an attribute assigned or deleted after construction (``BuiltWhole``),
  and previews, scores and inference leave every attribute as it was.
- ``diffusion_sampling``, ``diffusion_preview`` and ``diffusion_scoring`` are checked as the
  functions they are, on arrays and stand-in denoisers, without an objective.
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from PIL import Image

import dew
from dew import registry
from dew.artifacts import ImageGrid, VideoGrid
from dew.config import apply_overrides, load_config
from dew.inputs import Condition, Field, InputSpec
from dew.objectives import diffusion_network, diffusion_preview, diffusion_sampling, diffusion_scoring
from dew.objectives.diffusion import Diffusion
from dew.objectives.diffusion_config import Sampling
from dew.objectives.edm2 import EDM2
from dew.objectives.whole import BuiltWhole
from dew.sampling import CFG
from dew.schema import ConfigError
from dew.training.build import build_objective, open_split
from dew.training.trainer_config import resolve_config

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY_EDM = {  # experiments/edm.py's network at the smallest size (it is only built, not run)
    "model.model_channels": 8,
    "model.num_blocks": 1,
    "model.channel_mult": (1,),
    "model.attn_resolutions": (),
}


def _config(experiment: str, overrides: dict) -> ml_collections.ConfigDict:
    config = load_config(str(ROOT / "experiments" / experiment))
    texts = [f"config.{k}={v}" if isinstance(v, str) else f"config.{k}={v!r}" for k, v in overrides.items()]
    config = apply_overrides(config, texts)
    return resolve_config(config)


def _image_folder(path: pathlib.Path) -> str:
    """Six 8x8 RGB PNGs in NVlabs/edm's folder format (the autoencoder's data)."""
    rng = np.random.default_rng(0)
    path.mkdir()
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(path / f"img{i:05d}.png")
    (path / "dataset.json").write_text(json.dumps({"labels": None}))
    return str(path)


# One config per way an objective is built: (registered name, experiment file, overrides). Every
# objective dew registers must appear here (test_every_registered_objective_has_a_case).
CASES = {
    "diffusion, class labels": ("diffusion", "edm.py", TINY_EDM),
    "diffusion, text": ("diffusion", "edm.py", {**TINY_EDM, "dataset.name": "digits_text"}),
    "diffusion, points": ("diffusion", "mixture2d.py", {"model.width": 8, "model.blocks": 1}),
    "edm2": (
        "edm2",
        "edm2.py:digits",
        {"model.model_channels": 8, "model.channel_mult": (1,), "model.num_blocks": 1},
    ),
    "autoencoder": ("autoencoder", "latent_digits_vae.py", {"objective.vae_channels": (8, 8)}),
    "contrastive": ("contrastive", "probe.py", {"objective.probe_train": 4}),
    "language": ("language", "lm.py", {"objective.score_rows": 1}),
    "meanflow": ("meanflow", "meanflow.py", {}),
    "interpolant": ("interpolant", "sit.py:digits", {}),
    "iddpm": ("iddpm", "dit.py:digits", {}),
    "imeanflow": ("imeanflow", "meanflow.py:iMF-digits", {}),
}


def _dew_objectives() -> list[str]:
    return [n for n in registry.objectives.names() if registry.objectives[n].__module__.startswith("dew.")]


def test_every_registered_objective_has_a_case():
    covered = {name for name, _, _ in CASES.values()}
    missing = sorted(set(_dew_objectives()) - covered)
    assert not missing, f"objectives {missing} have no config in CASES: add one so they are built here"


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_objective_built_by_from_config_holds_what_its_constructor_left(case, tmp_path, monkeypatch):
    name, experiment, overrides = CASES[case]
    if name == "autoencoder":
        overrides = {**overrides, "dataset.path": _image_folder(tmp_path / "images")}
    config = _config(experiment, overrides)
    assert config.objective.name == name
    component = registry.objectives[name]
    left: dict[int, dict] = {}
    constructor = component.__init__

    def recording(self, *args, **kwargs):  # the class's own constructor, then what it left
        constructor(self, *args, **kwargs)
        left[id(self)] = dict(vars(self))

    monkeypatch.setattr(component, "__init__", recording)
    objective = build_objective(config, open_split(config.dataset, "train"))
    assert type(objective) is component and id(objective) in left
    now = {k: v for k, v in vars(objective).items() if k != "_built_whole"}
    before = left[id(objective)]
    assert now.keys() == before.keys(), sorted(set(now) ^ set(before))
    changed = [k for k in now if now[k] is not before[k]]
    assert not changed, f"{name}: {changed} were replaced after the constructor returned"
    if name == "edm2":  # EDM2Loss's settings are constructor arguments, from config.objective
        assert isinstance(objective, EDM2)
        assert (objective.P_mean, objective.P_std, objective.sigma_data) == (
            config.objective.P_mean,
            config.objective.P_std,
            config.objective.sigma_data,
        )
    if case == "diffusion, text":
        assert isinstance(objective, Diffusion)
        assert objective.class_prompts is not None
        assert objective.class_prompts[7] == "a handwritten seven" and objective.num_classes == 10
    if case == "diffusion, points":
        assert isinstance(objective, Diffusion)
        assert objective.extent is not None and objective.extent > 0 and objective.num_classes is None


def _points_objective(**options) -> Diffusion:
    return Diffusion(
        InputSpec(Field("x", (2,))),
        dew.presets.EDM,
        lambda: dew.models["mlp"](width=8, blocks=1),
        {},
        sampling=Sampling(steps=3, per_class=4),
        **options,
    )


def test_dew_objectives_refuse_an_attribute_set_after_construction():
    objective = _points_objective(extent=2.0)
    with pytest.raises(AttributeError, match=r"Diffusion\.extent cannot be set: .* built whole"):
        objective.extent = 3.0
    with pytest.raises(AttributeError, match=r"Diffusion\.latent cannot be deleted"):
        del objective.latent
    with pytest.raises(AttributeError, match=r"Diffusion\.novel cannot be set"):
        objective.novel = 1  # pyright: ignore[reportAttributeAccessIssue]  # the refusal under test
    assert objective.extent == 2.0 and objective.latent is None
    for name in _dew_objectives():
        assert isinstance(registry.objectives[name], BuiltWhole), name

    class Subclass(Diffusion):  # a subclass may set its own attributes around super().__init__
        def __init__(self, *args, scale: float, **kwargs):
            self.before = scale
            super().__init__(*args, **kwargs)
            self.after = 2 * scale

    sub = Subclass(InputSpec(Field("x", (2,))), dew.presets.EDM, lambda: None, {}, scale=1.5)
    assert (sub.before, sub.after) == (1.5, 3.0)
    with pytest.raises(AttributeError, match=r"Subclass\.after cannot be set"):
        sub.after = 0.0


def test_constructor_arguments_are_checked_against_the_conditions():
    with pytest.raises(ValueError, match="num_classes=10 needs a 'label' condition"):
        _points_objective(num_classes=10)
    label = Condition("class_label", Field("label", (), "int32"), -1)
    with pytest.raises(ValueError, match="class_prompts need a text"):
        Diffusion(
            InputSpec(Field("x", (2,)), {"label": label}),
            dew.presets.EDM,
            lambda: None,
            {"label": lambda: None},
            class_prompts=("a", "b"),
        )


def test_the_mean_flow_siblings_check_their_own_arguments_and_hold_the_same_attributes():
    """MeanFlow and IMeanFlow end their constructors in one place: the same attributes, each
    with its own defaults and settings classes; each refuses what it cannot train, in order."""
    from dew.encoding.class_label import UNCONDITIONAL
    from dew.objectives.imeanflow import IMeanFlow, IMFSampling
    from dew.objectives.imeanflow_loss import IMFGuidance
    from dew.objectives.meanflow import MeanFlow, MeanFlowSampling
    from dew.objectives.meanflow_loss import Guidance, TimeSampling

    label = Condition("class_label", Field("label", (), "int32"), UNCONDITIONAL)
    spec, plain = InputSpec(Field("x", (4, 4, 1)), {"label": label}), InputSpec(Field("x", (4, 4, 1)))

    def nothing():
        return None

    mf = MeanFlow(spec, nothing, nothing, 3, label_input="y")
    imf = IMeanFlow(spec, nothing, nothing, 3, label_input="y")
    assert vars(mf).keys() == vars(imf).keys()
    assert (mf.null_label, imf.null_label, MeanFlow(spec, nothing, nothing, 3).null_label) == (3, 3, -1)
    assert (type(mf.guidance), type(imf.guidance)) == (Guidance, IMFGuidance)
    assert (type(mf.sampling), type(imf.sampling)) == (MeanFlowSampling, IMFSampling)
    assert (mf.times, imf.times) == (TimeSampling(), TimeSampling(data_proportion=0.5))
    assert mf._jitted == imf._jitted == {} and mf._jitted is not imf._jitted
    draw = imf._jitted_draw(imf._settings())  # jitted once per settings (compiled at its first call)
    assert imf._jitted_draw(imf._settings()) is draw and list(imf._jitted.values()) == [draw]
    with pytest.raises(AttributeError, match=r"IMeanFlow\.times cannot be set"):
        imf.times = TimeSampling()
    uniform = TimeSampling(noise_dist="uniform")
    for cls in (MeanFlow, IMeanFlow):  # label_input is checked first
        with pytest.raises(ValueError, match="label_input='int' is invalid: expected 'label' or 'y'"):
            cls(plain, nothing, None, None, times=uniform, label_input="int")
    with pytest.raises(ValueError, match="give a class encoder and num_classes together"):
        MeanFlow(spec, nothing, None, 3)
    with pytest.raises(ValueError, match=r"guidance_eq='cfg', class_dropout_prob=0\.1 need classes"):
        MeanFlow(plain, nothing, None, None)
    assert (
        MeanFlow(plain, nothing, None, None, guidance=Guidance("none", class_dropout_prob=0.0)).num_classes
        is None
    )
    with pytest.raises(ValueError, match="noise_dist='uniform' is invalid: iMF draws"):
        IMeanFlow(plain, nothing, None, None, times=uniform)
    with pytest.raises(ValueError, match="iMF trains with guidance and needs classes"):
        IMeanFlow(plain, nothing, None, None)


def test_previews_scores_and_inference_leave_every_attribute_as_it_was():
    objective = _points_objective(extent=3.0)
    before = dict(vars(objective))
    params = objective.init(jax.random.PRNGKey(0), {"x": jnp.zeros((4, 2))})
    grid = objective.preview(params, jax.random.PRNGKey(0))
    assert isinstance(grid, ImageGrid) and grid.images.shape == (1, 96, 96, 1)  # one scatter plot
    assert objective.score(grid, {}) == {} and objective.score(None, {}) == {}
    again = objective.infer(params, **objective.inference_options())  # seed 0: the preview's own draw
    assert isinstance(again, ImageGrid)
    np.testing.assert_array_equal(again.images, grid.images)
    objective.infer(params, **{**objective.inference_options(), "steps": 4})
    diverged = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), params)
    objective.preview(diverged, jax.random.PRNGKey(1))
    now = dict(vars(objective))
    assert now.keys() == before.keys() and all(now[k] is before[k] for k in now)
    assert set(objective._jitted) == {
        ("draw", objective.sampling),
        ("draw", Sampling(4, per_class=4), id(None)),
    }


# --- diffusion_sampling, alone -------------------------------------------------------------------------
def test_interval_guidance_is_none_at_weight_one_and_spans_the_interval():
    assert diffusion_sampling.interval_guidance(1.0, (0.3, 2.0)) is None
    assert diffusion_sampling.interval_guidance(2.0) == CFG(2.0, 0.0, float("inf"))
    assert diffusion_sampling.interval_guidance(1.5, (0.3, 2.0)) == CFG(1.5, 0.3, 2.0)


def test_guided_builds_its_reference_only_under_guidance_and_mixes_as_cfg():
    def conditional(x, sigma):
        return x + 1.0

    def unconditional(x, sigma):
        return x - 1.0

    def no_reference():
        raise AssertionError("the reference was built without guidance")

    assert diffusion_sampling.guided(conditional, None, no_reference) is conditional
    denoise = diffusion_sampling.guided(conditional, CFG(weight=3.0, sigma_hi=2.0), lambda: unconditional)
    x = jnp.zeros((2, 2))
    # inside (0, 2]: D_u + w (D_c − D_u) = −1 + 3·2 = 5; outside: the conditional prediction, 1
    np.testing.assert_array_equal(denoise(x, jnp.float32(1.0)), jnp.full((2, 2), 5.0))
    np.testing.assert_array_equal(denoise(x, jnp.float32(4.0)), jnp.full((2, 2), 1.0))


def test_from_noise_draws_its_noise_from_the_key_itself():
    """D(x, σ) = x ("already clean") makes every Euler step x + (σ' − σ)(x − D)/σ = x, so the
    sample is exactly the initial point: the key's standard normal draw scaled by σ_0."""
    rng = jax.random.PRNGKey(3)
    sigmas = dew.presets.EDM.sigmas(4)
    samples = diffusion_sampling.from_noise(lambda x, sigma: x, rng, (256, 2), sigmas, "euler")
    want = jax.random.normal(rng, (256, 2), jnp.float32) * sigmas[0]
    np.testing.assert_array_equal(np.asarray(samples), np.asarray(want))


def test_class_rows_are_class_major_and_carry_each_classs_condition():
    conditions, labels = diffusion_sampling.class_rows(2, None)
    assert conditions == {} and labels.tolist() == [0, 0]
    conditions, labels = diffusion_sampling.class_rows(2, 3)
    assert labels.tolist() == [0, 0, 1, 1, 2, 2] and conditions["label"].tolist() == labels.tolist()
    tokens = diffusion_sampling.prompt_tokens(("zero", "one", "two"), (8,))
    conditions, labels = diffusion_sampling.class_rows(2, 3, tokens)
    np.testing.assert_array_equal(conditions["label"], tokens[[0, 0, 1, 1, 2, 2]])
    assert diffusion_sampling.class_captions(("a", "b"), 2) == ("a", "a", "b", "b")
    assert diffusion_sampling.class_captions(None, 2) is None


def test_requested_conditions_serve_classes_and_prompts_and_refuse_in_one_line():
    label = Condition("class_label", Field("label", (), "int32"), -1)
    text = Condition("byte_text", Field("text", (8,), "int32"), "")
    request = diffusion_sampling.requested_conditions
    conditions, captions = request((1, 2), None, condition=label, num_classes=3, class_prompts=None)
    assert conditions["label"].tolist() == [1, 2] and captions is None
    conditions, captions = request(1, None, condition=text, num_classes=3, class_prompts=("a", "b", "c"))
    assert captions == ("b",)
    np.testing.assert_array_equal(conditions["label"], diffusion_sampling.prompt_tokens(("b",), (8,)))
    conditions, captions = request(None, "seven", condition=text, num_classes=None, class_prompts=None)
    assert captions == ("seven",) and conditions["label"].shape == (1, 8)
    refusals = [
        ((1,), "x", label, 3, "give classes or prompts, not both"),
        (None, None, label, 3, "give classes or prompts$"),
        (None, "x", label, 3, "not text-conditioned; give classes"),
        ((0, 3), None, label, 3, r"classes \[3\] are out of range: expected ints in \[0, 3\)"),
        ((0,), None, None, None, "this model has no classes"),
    ]
    for classes, prompts, condition, num_classes, message in refusals:
        with pytest.raises(ValueError, match=message):
            request(classes, prompts, condition=condition, num_classes=num_classes, class_prompts=None)


def test_unconditional_repeats_the_datum_for_every_row():
    like = jnp.ones((3, 4), jnp.int32)
    out = diffusion_sampling.unconditional(np.array([7, 0, 0, 0]), like)
    assert out.dtype == jnp.int32 and out.tolist() == [[7, 0, 0, 0]] * 3


# --- diffusion_network, alone ---------------------------------------------------------------------------
def test_drop_conditions_replaces_rows_by_the_unconditional_datum_at_the_rate():
    n = 4000
    conditions = {"label": jnp.arange(n, dtype=jnp.int32) % 10, "text": jnp.ones((n, 3), jnp.int32)}
    tokens = {"label": np.int32(-1), "text": np.zeros(3, np.int32)}
    out = diffusion_network.drop_conditions(jax.random.PRNGKey(0), conditions, 0.25, tokens)
    label_dropped = np.asarray(out["label"] == -1)
    text_dropped = np.asarray(jnp.all(out["text"] == 0, axis=1))
    assert np.all(text_dropped | np.asarray(jnp.all(out["text"] == 1, axis=1)))  # whole rows
    np.testing.assert_array_equal(np.asarray(out["label"])[~label_dropped], np.arange(n)[~label_dropped] % 10)
    # binomial(4000, 0.25): mean 1000, standard deviation 27; 5 of them either side
    assert all(abs(int(d.sum()) - n // 4) < 5 * 27 for d in (label_dropped, text_dropped))
    assert np.any(label_dropped != text_dropped)  # one key per condition
    kept = diffusion_network.drop_conditions(jax.random.PRNGKey(0), conditions, 0.0, tokens)
    assert all(bool(jnp.all(kept[k] == conditions[k])) for k in conditions)


def test_precision_denoiser_runs_the_network_in_the_compute_dtype_and_the_rest_in_float32():
    seen = []

    def apply(params, rng, x, c_noise, conditions, is_training, labels):  # F = w x + c_noise
        seen.append((params["w"].dtype, x.dtype, c_noise.dtype, None if labels is None else labels.dtype))
        return params["w"] * x + c_noise.reshape(-1, 1).astype(x.dtype)

    params = {"w": jnp.float32(0.75)}
    x, sigma, labels = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4), jnp.float32(0.7), jnp.ones((2, 9))
    process = dew.presets.EDM
    exact = diffusion_network.precision_denoiser(apply, process, jnp.dtype("float32"), params, {})(x, sigma)
    assert seen == [(jnp.float32, jnp.float32, jnp.float32, None)]
    s = jnp.float32(0.7)
    scaled_f = process.c_out(s) * (0.75 * process.c_in(s) * x + process.c_noise(s))  # c_out F
    expected = process.c_skip(s) * x + scaled_f
    np.testing.assert_allclose(exact, expected, rtol=1e-6)
    half = diffusion_network.precision_denoiser(
        apply, process, jnp.dtype("float16"), params, {}, augment_labels=labels
    )(x, jnp.full((2,), sigma))
    assert seen[1] == (jnp.float16, jnp.float16, jnp.float32, jnp.float16)
    assert half.dtype == jnp.float32
    # F in float16: x, w x, c_noise and their sum rounded (4 roundings at u = 2⁻¹¹) of c_out F
    np.testing.assert_allclose(half, exact, rtol=0, atol=4 * 2.0**-11 * float(jnp.max(jnp.abs(scaled_f))))


# --- diffusion_preview and diffusion_scoring, alone --------------------------------------------------
def test_finite_samples_count_rows_and_draw_them_grey_or_saturated():
    samples = np.zeros((4, 2, 2, 1), np.float32)
    samples[1, 0, 0, 0], samples[3, 1, 1, 0], samples[3, 0, 0, 0] = np.nan, np.inf, -np.inf
    cleaned, nonfinite = diffusion_preview.finite_samples(samples)
    assert nonfinite == 2 and np.isfinite(cleaned).all()
    assert (cleaned[1, 0, 0, 0], cleaned[3, 1, 1, 0], cleaned[3, 0, 0, 0]) == (0.0, 1.0, -1.0)


def test_to_artifact_picks_the_artifact_by_the_samples_rank():
    points = diffusion_preview.to_artifact(np.zeros((5, 2)), None, 3, extent=2.0)
    assert isinstance(points, ImageGrid) and points.images.shape == (1, 96, 96, 1)
    clips = diffusion_preview.to_artifact(np.full((2, 3, 4, 4, 1), 2.0), None, 2)
    assert isinstance(clips, VideoGrid) and clips.fps == 4 and clips.clips.max() == 1.0
    images = diffusion_preview.to_artifact(np.full((2, 4, 4, 1), -3.0), ("a", "b"), 1)
    assert isinstance(images, ImageGrid)
    assert images.captions == ("a", "b") and images.columns == 1 and images.images.min() == -1.0


def test_jitted_once_builds_one_program_per_key():
    cache: dict = {}
    first = diffusion_preview.jitted_once(cache, ("k",), lambda x, *, scale: x * scale, scale=2.0)
    again = diffusion_preview.jitted_once(cache, ("k",), lambda x, *, scale: x * 0.0, scale=5.0)
    assert again is first and float(first(jnp.float32(3.0))) == 6.0 and list(cache) == [("k",)]


def test_preview_scores_label_rows_class_major_and_report_nonfinite_samples_instead(capsys):
    grid = ImageGrid(np.zeros((6, 4, 4, 1), np.float32))
    seen = []

    def metric(images, labels):
        seen.append(labels.tolist())
        return 0.5

    scores = diffusion_scoring.preview_scores
    shape = (4, 4, 1)
    assert scores(grid, {}, sample_shape=(2,), num_classes=None, per_class=1, nonfinite=0) == {}
    with pytest.raises(ConfigError, match=r"metrics=\('m',\) is invalid: previews of \(2,\)-shaped"):
        scores(grid, {"m": metric}, sample_shape=(2,), num_classes=None, per_class=1, nonfinite=0)
    assert scores(None, {"m": metric}, sample_shape=shape, num_classes=3, per_class=2, nonfinite=0) == {}
    got = scores(grid, {"m": metric}, sample_shape=shape, num_classes=3, per_class=2, nonfinite=0)
    assert got == {"m": 0.5} and seen == [[0, 0, 1, 1, 2, 2]]
    got = scores(grid, {"m": metric}, sample_shape=shape, num_classes=3, per_class=2, nonfinite=4)
    assert got == {"nonfinite_samples": 4.0} and len(seen) == 1
    assert "preview: 4 of 6 samples are non-finite; m not scored" in capsys.readouterr().out

"""The FID protocol's presets for the transformer baselines' objectives: DiT (``iddpm``), SiT and
REPA (``interpolant``), beside the EDM σ-sampler presets of ``dew.scoring.fid_protocol``.

Each preset is the sampler behind a published ImageNet-256 FID, drawn through the objective's own
sampler (the one its ``generate`` uses):

* ``dit``: DiT's ``sample_ddp.py`` defaults (FID 2.27): the IDDPM process respaced to 250 steps,
  the ancestral DDPM loop (``clip_denoised=False``), classifier-free guidance at scale 1.5 on the
  first 3 channels (``forward_with_cfg``); ``experiments/dit.py``'s ``FID_SAMPLING``.
* ``sit``: SiT's ``sample_ddp.py SDE --cfg-scale 1.5`` (FID 2.06): Euler–Maruyama over 250 steps
  (the registered ``transport_sde``), guidance on the first 3 channels at every t;
  ``experiments/sit.py``'s ``FID_SAMPLING``.
* ``repa``: REPA's README ``generate.py --mode=sde --num-steps=250 --cfg-scale=1.8
  --guidance-high=0.7`` (FID 1.42): the registered ``repa_sde``, guidance on all 4 latent
  channels for REPA's t ∈ [0, 0.7], SiT's time [0.3, 1]; ``experiments/repa.py``'s
  ``sampling(REPA_SAMPLING)``.

**Seeds index images** exactly as the EDM presets' (``dew.scoring.fid_protocol``): with
``key = PRNGKey(s)``, image ``s``'s starting noise is ``normal(fold_in(key, 0), [1, *shape])``, its
class ``randint(fold_in(key, 1), 0, classes)`` and the sampler's step noise comes from
``fold_in(key, 2)``; each image is drawn as a batch of one (two with guidance: [z; z] with the
null class, the first half kept, as the references' ``sample.py``) under ``vmap``, so sharding and
resuming give the same images.

**uint8 images as each reference writes its PNGs** (``rounding``): DiT's and SiT's
``sample_ddp.py`` ``clamp(127.5·x + 128, 0, 255)`` truncated (``half_up``; the EDM presets' rule
for pixels), REPA's ``generate.py`` ``clamp(255·(x + 1)/2, 0, 255)`` truncated (``truncate``;
edm2's rule, which the EDM presets use for latents). A latent run's samples are decoded by its
VAE first (``config.objective.latent``'s codec, as the EDM presets' latent path) and its output
turned to uint8 by the preset's rounding in the run's pixel convention
(``dew.encoding.stability_vae.PixelConvention.to_uint8``: with DiT's/SiT's/REPA's
``pixels``, operation for operation the reference's ``vae.decode(latents / 0.18215)`` and rule).

``resolve(name, objective)`` finds a preset of either kind and refuses (``FidInputError``, one
line naming both) a preset whose objective is not the run's: ``--preset=dit`` on an
``interpolant`` run, ``--preset=cifar10`` on an ``iddpm`` one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dew import registry
from dew.scoring import fid_protocol as fp
from dew.scoring.fid_reference import FidInputError

EDM = "EDM σ-sampler"  # what the EDM presets draw: a run with objective.process.sigmas and a denoiser


@dataclasses.dataclass(frozen=True)
class ObjectivePreset:
    """A paper row's sampler for ``objective`` (a registered objective's name): ``sampler``
    (``ddpm`` for ``iddpm``; a registered transport sampler for ``interpolant``) over ``steps``,
    guidance at ``cfg_scale`` on the first ``cfg_channels`` channels for SiT time t in
    ``guidance_interval`` (``interpolant`` only; 1.0: unguided)."""

    name: str
    objective: str
    sampler: str
    steps: int
    cfg_scale: float
    cfg_channels: int
    guidance_interval: tuple[float, float] = (0.0, 1.0)
    rounding: str = "half_up"

    def settings(self) -> dict[str, Any]:
        """What a progress file and the report record (JSON values)."""
        out: dict[str, Any] = {
            "preset": self.name,
            "objective": self.objective,
            "sampler": self.sampler,
            "steps": self.steps,
            "cfg_scale": self.cfg_scale,
            "cfg_channels": self.cfg_channels,
        }
        if self.objective == "interpolant":
            out["guidance_interval"] = list(self.guidance_interval)
        out["uint8"] = UINT8_RULES[self.rounding]
        return out

    def to_uint8(self, objective: Any, samples: Any) -> Any:
        """uint8 images [n, H, W, C] as the reference writes its PNGs (``rounding``, module
        docstring); a latent run's samples decoded by its VAE first."""
        import jax.numpy as jnp

        latent = getattr(objective, "latent", None)
        if latent is not None:  # the decoder's output by this rounding in the run's pixel convention
            return latent.codec.decode(samples, self.rounding)
        if self.rounding == "truncate":  # REPA: clamp(255 * (x + 1) / 2, 0, 255).to(uint8)
            return jnp.clip((samples + 1.0) / 2.0 * 255.0, 0.0, 255.0).astype(jnp.uint8)
        return fp.quantize(samples)  # DiT, SiT: clamp(127.5 * x + 128, 0, 255).to(uint8)

    def draw_samples(self, objective: Any, params: Any, seeds: Any) -> Any:
        """Samples [n, *sample shape] (latents for a latent run) for int32 ``seeds`` [n], each
        from its own seed (module docstring); pure and jittable."""
        import jax
        import jax.numpy as jnp

        shape = tuple(objective.input_spec.sample.shape)
        classes = fp.model_classes(objective)
        make = self._iddpm if self.objective == "iddpm" else self._sit
        draw_one = make(objective, params)

        def one(seed: jax.Array) -> jax.Array:
            key = jax.random.PRNGKey(seed)
            z = jax.random.normal(jax.random.fold_in(key, 0), (1, *shape))
            labels = None
            if classes:
                labels = jax.random.randint(jax.random.fold_in(key, 1), (1,), 0, classes).astype(jnp.int32)
            return draw_one(z, labels, jax.random.fold_in(key, 2))[0]

        return jax.vmap(one)(seeds)

    def _iddpm(self, objective: Any, params: Any):
        """DiT's ``sample.py`` for one image: ``IDDPM.sampling_model`` through the respaced loop."""
        import jax.numpy as jnp

        from dew.sampling.interface import DDPMLoop

        diffusion = objective.process.diffusion(str(self.steps))

        def draw(z, labels, rng):
            y = labels if labels is not None else jnp.zeros((1,), jnp.int32)
            model, guided = objective.sampling_model(params, y, self.cfg_scale, self.cfg_channels)
            x = jnp.concatenate([z, z]) if guided else z
            out = DDPMLoop(method="ddpm", clip_denoised=False)(model, x, diffusion, rng)
            return out[:1]

        return draw

    def _sit(self, objective: Any, params: Any):
        """SiT's / REPA's sampling for one image, as ``Interpolant.generate`` draws it."""
        import jax.numpy as jnp

        from dew.objectives.interpolant import Guidance, transport_sampler

        sampler = dataclasses.replace(transport_sampler(self.sampler), num_steps=self.steps)
        guidance = Guidance(self.cfg_scale, self.cfg_channels, self.guidance_interval)

        def draw(z, labels, rng):
            if labels is None or guidance.cfg_scale == 1.0:
                return sampler.sample(objective.transport, objective.network(params, labels), z, rng)
            model = objective.guided_network(params, labels, guidance)
            return sampler.sample(objective.transport, model, jnp.concatenate([z, z]), rng)[:1]

        return draw


UINT8_RULES = {
    "half_up": "clamp(127.5 * x + 128, 0, 255) truncated",
    "truncate": "clamp(255 * (x + 1) / 2) truncated",
}

OBJECTIVE_PRESETS: dict[str, ObjectivePreset] = {
    # DiT sample_ddp.py: --num-sampling-steps 250 --cfg-scale 1.5 (forward_with_cfg: first 3 channels)
    "dit": ObjectivePreset("dit", "iddpm", "ddpm", 250, 1.5, 3),
    # SiT sample_ddp.py SDE --cfg-scale 1.5: Euler-Maruyama, 250 steps, first 3 channels
    "sit": ObjectivePreset("sit", "interpolant", "transport_sde", 250, 1.5, 3),
    # REPA README generate.py --mode=sde --num-steps=250 --cfg-scale=1.8 --guidance-high=0.7
    # (REPA's t in [guidance-low, guidance-high] = [0, 0.7] is SiT time [1 - 0.7, 1 - 0], as the experiment)
    "repa": ObjectivePreset(
        "repa", "interpolant", "repa_sde", 250, 1.8, 4, (1.0 - 0.7, 1.0 - 0.0), "truncate"
    ),
}

Preset = fp.SamplerPreset | ObjectivePreset


def all_presets() -> dict[str, Preset]:
    """Every protocol preset by name: the EDM σ-samplers', then the objectives' own."""
    return {**fp.PRESETS, **OBJECTIVE_PRESETS}


def objective_name(objective: Any) -> str:
    """The name ``objective``'s class is registered under (its class name if none)."""
    for name in registry.objectives.names():
        if registry.objectives[name] is type(objective):
            return name
    return type(objective).__name__


def _draws(preset: Preset, objective: Any, kind: str) -> bool:
    if isinstance(preset, ObjectivePreset):
        return preset.objective == kind
    process = getattr(objective, "process", None)
    return hasattr(objective, "denoiser") and hasattr(process, "sigmas")


def preset_named(name: str) -> Preset:
    """The preset ``name`` of either kind; ``FidInputError`` (one line naming every preset) if none."""
    presets = all_presets()
    if name not in presets:
        raise FidInputError(f"--preset={name!r} is not a sampler preset; expected one of {sorted(presets)}")
    return presets[name]


def resolve(name: str, objective: Any) -> Preset:
    """The preset ``name`` for a run of ``objective``; ``FidInputError`` (one line) for a name
    that is no preset or a preset of another objective (naming both and the run's presets)."""
    presets = all_presets()
    preset, kind = preset_named(name), objective_name(objective)
    if not _draws(preset, objective, kind):
        wanted = preset.objective if isinstance(preset, ObjectivePreset) else EDM
        fitting = sorted(n for n, p in presets.items() if _draws(p, objective, kind))
        raise FidInputError(
            f"--preset={name!r} draws {wanted!r} runs, but --workdir is a {kind!r} run; "
            f"expected one of its presets {fitting}"
        )
    return preset


__all__ = [
    "OBJECTIVE_PRESETS",
    "ObjectivePreset",
    "Preset",
    "all_presets",
    "objective_name",
    "preset_named",
    "resolve",
]

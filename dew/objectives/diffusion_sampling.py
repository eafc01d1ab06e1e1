"""The diffusion objective's sampling side: the (guided) denoiser, ``generate``, previews and
``dew.pipeline``'s inference, for ``dew.objectives.diffusion.Diffusion``.

``DiffusionSampling`` is a part of that class kept in its own module: it uses the objective's
``denoiser``, ``input_spec``, ``process``, ``sampling``, ``num_classes``, ``class_prompts``,
``extent`` and its table of jitted draws, and adds nothing to what a step computes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.artifacts import ImageGrid, VideoGrid
from dew.objectives import scatter
from dew.objectives.diffusion_config import Sampling, check_sampling
from dew.sampling import CFG, Solver, sample
from dew.training.objective import Params


class DiffusionSampling:
    """Sampling, previews and inference of a diffusion objective (see the module docstring)."""

    def guided_denoiser(
        self,
        params: Params,
        conditions: Mapping[str, jax.Array],
        guidance: CFG | None = None,
        guide: DiffusionSampling | None = None,
        guide_params: Params | None = None,
    ) -> Callable[[jax.Array, jax.Array], jax.Array]:
        """The denoiser ``generate`` samples with: this network's D(x, σ) for ``conditions``,
        guided (``guidance``) against its unconditional prediction, or against ``guide``'s
        prediction for the same conditions when a guide is given (autoguidance)."""
        denoise = self.denoiser(params, conditions)
        if guidance is None:
            return denoise
        if guide is not None:
            return guidance(denoise, guide.denoiser(guide_params, conditions))
        uncond = {k: self._unconditional(k, v) for k, v in conditions.items()}
        return guidance(denoise, self.denoiser(params, uncond))

    def generate(
        self,
        params: Params,
        rng: jax.Array,
        conditions: Mapping[str, jax.Array],
        *,
        steps: int,
        solver: str | Solver = "heun",
        guidance: CFG | None = None,
        num_samples: int | None = None,
        guide: DiffusionSampling | None = None,
        guide_params: Params | None = None,
    ) -> jax.Array:
        """Samples for the given conditions (one per row), pure and jittable.

        Without conditions, ``num_samples`` says how many. The initial noise is drawn from
        ``rng`` itself; a stochastic solver's per-step noise from ``fold_in(rng, 1)``.

        ``guidance`` guides against this network's unconditional prediction (CFG), or, with a
        ``guide`` objective and its ``guide_params``, against the guide's prediction for the same
        conditions (autoguidance, Karras et al. 2024, "Guiding a diffusion model with a bad
        version of itself": D = D_guide + w (D − D_guide), inside the guidance interval).
        """
        n = next(iter(conditions.values())).shape[0] if conditions else (num_samples or 1)
        shape = (n, *self.input_spec.sample.shape)
        denoise = self.guided_denoiser(params, conditions, guidance, guide, guide_params)
        noise = jax.random.normal(rng, shape, jnp.float32)
        with jax.ensure_compile_time_eval():  # a schedule sample can check, even under jit
            sigmas = self.process.sigmas(steps)
        return sample(denoise, noise, sigmas, solver, rng=jax.random.fold_in(rng, 1))

    # --- previews -----------------------------------------------------------------------------------
    def draw(
        self,
        params: Params,
        rng: jax.Array,
        *,
        per_class: int,
        steps: int,
        solver: str,
        guidance: float = 1.0,
        guidance_interval: tuple[float, float] | tuple[()] = (),
        guide: DiffusionSampling | None = None,
        guide_params: Params | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """``per_class`` samples of every class, class-major, and their labels; pure and jittable.

        ``guidance`` is the CFG weight (1 = none), applied only while σ lies in
        ``guidance_interval`` = (σ_lo, σ_hi] when one is given, else over the whole σ range."""
        classes = self.num_classes or 1
        labels = jnp.repeat(jnp.arange(classes, dtype=jnp.int32), per_class)
        conditions = {}
        if self.num_classes:
            conditions = {"label": labels}
            if self.class_prompts is not None:  # text-conditioned: each class's prompt
                field = self.input_spec.conditions["label"].field
                prompts = np.stack(
                    [registry.encoders["byte_text"].tokens(p, field.shape) for p in self.class_prompts]
                )
                conditions = {"label": jnp.asarray(prompts)[labels]}
        lo, hi = guidance_interval or (0.0, float("inf"))
        cfg = CFG(weight=guidance, sigma_lo=lo, sigma_hi=hi) if guidance != 1.0 else None
        samples = self.generate(
            params,
            rng,
            conditions,
            steps=steps,
            solver=solver,
            guidance=cfg,
            num_samples=per_class,
            guide=guide,
            guide_params=guide_params,
        )
        return samples, labels

    def preview(self, params: Params, rng: jax.Array) -> ImageGrid | VideoGrid:
        """Samples as ``config.objective.sampling`` asks: an ``ImageGrid`` with one row per class
        for images (captioned with each row's prompt for text conditions), a ``VideoGrid`` for
        clips, a scatter plot (one ``ImageGrid`` picture) for points."""
        draw = self._jitted_once(("draw", self.sampling), self.draw, **dataclasses.asdict(self.sampling))
        samples, _ = jax.device_get(draw(params, rng))
        # A diverged model samples NaN or inf: drawn grey (NaN) or saturated (inf), counted, and
        # reported by ``score`` instead of being handed to metrics that cannot take them.
        finite = np.isfinite(samples.reshape(len(samples), -1)).all(axis=1)
        self.nonfinite_samples = int(np.sum(~finite))
        samples = np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0)
        captions = None
        if self.class_prompts is not None:
            captions = tuple(p for p in self.class_prompts for _ in range(self.sampling.per_class))
        return self._artifact(samples, captions, self.sampling.per_class)

    def _artifact(self, samples: np.ndarray, captions: tuple[str, ...] | None, columns: int) -> Any:
        if samples.ndim == 2:
            return scatter.scatter_grid(samples, self.extent or scatter.extent_of(samples))
        if samples.ndim == 5:
            return VideoGrid(np.clip(samples, -1.0, 1.0), fps=4)
        return ImageGrid(np.clip(samples, -1.0, 1.0), captions=captions, columns=columns)

    # --- inference (dew.pipeline) ---------------------------------------------------------------
    def inference_options(self) -> dict[str, Any]:
        """What ``dew.pipeline`` accepts; the defaults are the run's preview settings."""
        s = self.sampling
        return {
            "classes": None,
            "prompts": None,
            "per_class": s.per_class,
            "steps": s.steps,
            "solver": s.solver,
            "guidance": s.guidance,
            "guidance_interval": s.guidance_interval,
            "seed": 0,
        }

    def infer(
        self,
        params: Params,
        *,
        classes,
        prompts,
        per_class: int,
        steps: int,
        solver: str,
        guidance: float,
        guidance_interval: tuple[float, ...],
        seed: int,
        guide: DiffusionSampling | None = None,
        guide_params: Params | None = None,
    ) -> Any:
        """Samples as an artifact. Without ``classes`` or ``prompts``: ``per_class`` of every
        class, drawn exactly as ``preview`` draws them (``seed`` = the run's seed with the
        defaults reproduces its previews bit for bit). ``classes`` (class labels) or ``prompts``
        (captions, for a text-conditioned model): one sample per entry. ``guidance`` is the CFG
        weight (1: none), applied to the condition only for σ in ``guidance_interval`` =
        (σ_lo, σ_hi] when one is given; ``solver`` a registered sampler, ``steps`` its σ points.
        ``guide``/``guide_params`` (``dew.pipeline(..., guide=...)``): guide against that
        network's prediction for the same conditions instead (autoguidance)."""
        settings = Sampling(
            steps=steps,
            solver=solver,
            per_class=per_class,
            guidance=guidance,
            guidance_interval=tuple(guidance_interval),
        )
        check_sampling(settings)
        rng = jax.random.PRNGKey(seed)
        if classes is None and prompts is None:
            if settings == self.sampling and guide is None:
                return self.preview(params, rng)
            key = ("draw", settings, id(guide))
            draw = self._jitted_once(key, self.draw, **dataclasses.asdict(settings), guide=guide)
            samples, _ = jax.device_get(draw(params, rng, guide_params=guide_params))
            captions = None
            if self.class_prompts is not None:
                captions = tuple(p for p in self.class_prompts for _ in range(per_class))
            return self._artifact(samples, captions, per_class)
        conditions, captions = self._explicit_conditions(classes, prompts)
        lo, hi = settings.guidance_interval or (0.0, float("inf"))
        cfg = CFG(weight=guidance, sigma_lo=lo, sigma_hi=hi) if guidance != 1.0 else None
        draw = self._jitted_once(
            ("generate", steps, solver, cfg, id(guide)),
            self.generate,
            steps=steps,
            solver=solver,
            guidance=cfg,
            guide=guide,
        )
        samples = jax.device_get(draw(params, rng, conditions, guide_params=guide_params))
        return self._artifact(samples, captions, min(len(samples), 10))

    def _jitted_once(self, key: tuple, fn: Callable[..., Any], **static: Any) -> Callable[..., Any]:
        """``jax.jit(partial(fn, **static))``, built once per ``key`` (the static settings)."""
        if key not in self._jitted:
            self._jitted[key] = jax.jit(functools.partial(fn, **static))
        return self._jitted[key]

    def _explicit_conditions(self, classes, prompts) -> tuple[dict[str, jax.Array], tuple[str, ...] | None]:
        if classes is not None and prompts is not None:
            raise ValueError("give classes or prompts, not both")
        condition = self.input_spec.conditions.get("label")
        if prompts is not None:
            prompts = (prompts,) if isinstance(prompts, str) else tuple(prompts)
            if condition is None or condition.encoder != "byte_text":
                raise ValueError(f"prompts={prompts!r}: this model is not text-conditioned; give classes")
            if not prompts or not all(isinstance(p, str) for p in prompts):
                raise ValueError(f"prompts must be a non-empty sequence of str, got {prompts!r}")
            tokens = np.stack(
                [registry.encoders["byte_text"].tokens(p, condition.field.shape) for p in prompts]
            )
            return {"label": jnp.asarray(tokens)}, prompts
        classes = (classes,) if isinstance(classes, int) else tuple(classes)
        if not self.num_classes or not classes:
            raise ValueError(f"classes={classes!r}: this model has no classes")
        bad = [c for c in classes if not (isinstance(c, int | np.integer) and 0 <= c < self.num_classes)]
        if bad:
            raise ValueError(f"classes {bad} are out of range: expected ints in [0, {self.num_classes})")
        if self.class_prompts is not None:  # a text model asked for classes: each class's prompt
            return self._explicit_conditions(None, tuple(self.class_prompts[c] for c in classes))
        return {"label": jnp.asarray(classes, jnp.int32)}, None

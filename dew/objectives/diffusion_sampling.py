"""Sampling a diffusion model, as pure functions of exactly what each step needs: the guided
denoiser, samples from noise, the conditions a preview draws (every class, class-major) and the
conditions an inference request asks for (classes or prompts).

Nothing here holds or reads an objective: ``dew.objectives.diffusion.Diffusion`` calls these with
its denoiser, its σ schedule and its classes, so each piece can be read and tested alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.inputs import Condition
from dew.sampling import CFG, Solver, sample

Denoiser = Callable[[jax.Array, jax.Array], jax.Array]
"""D(x, σ) -> the denoised x, for fixed conditions."""


def interval_guidance(weight: float, interval: tuple[float, ...] = ()) -> CFG | None:
    """The CFG weight ``weight`` (1: none, returned as None) applied while σ lies in
    ``interval`` = (σ_lo, σ_hi], or over the whole σ range for ``()``."""
    lo, hi = interval or (0.0, float("inf"))
    return CFG(weight=weight, sigma_lo=lo, sigma_hi=hi) if weight != 1.0 else None


def guided(denoise: Denoiser, guidance: CFG | None, reference: Callable[[], Denoiser]) -> Denoiser:
    """``denoise`` guided by ``guidance`` against ``reference()``'s prediction (the unconditional
    branch for CFG; a guide network's prediction for autoguidance, Karras et al. 2024:
    D = D_ref + w (D − D_ref)); ``denoise`` itself, and no reference built, without guidance."""
    if guidance is None:
        return denoise
    return guidance(denoise, reference())


def from_noise(
    denoise: Denoiser, rng: jax.Array, shape: tuple[int, ...], sigmas: jax.Array, solver: str | Solver
) -> jax.Array:
    """Samples of ``shape`` [n, ...]: noise drawn from ``rng`` itself (float32, standard normal,
    scaled by the solver to σ_max), integrated over ``sigmas`` by ``solver``; a stochastic
    solver's per-step noise comes from ``fold_in(rng, 1)``. Pure and jittable."""
    noise = jax.random.normal(rng, shape, jnp.float32)
    return sample(denoise, noise, sigmas, solver, rng=jax.random.fold_in(rng, 1))


def prompt_tokens(prompts: Sequence[str], shape: tuple[int, ...]) -> np.ndarray:
    """Each prompt as the ``byte_text`` encoder's batch-field value: [len(prompts), *shape] int32."""
    return np.stack([registry.encoders["byte_text"].tokens(p, shape) for p in prompts])


def class_rows(
    per_class: int, num_classes: int | None, class_tokens: np.ndarray | None = None
) -> tuple[dict[str, jax.Array], jax.Array]:
    """``(conditions, labels)`` for ``per_class`` rows of every class, class-major: labels [n]
    int32 (all 0 for an unconditional model, ``num_classes`` None or 0), and the ``label``
    condition that asks for them — none when unconditional, the labels for class labels, or with
    ``class_tokens`` ([num_classes, L], each class's prompt as text tokens) each row's prompt."""
    labels = jnp.repeat(jnp.arange(num_classes or 1, dtype=jnp.int32), per_class)
    if not num_classes:
        return {}, labels
    if class_tokens is None:
        return {"label": labels}, labels
    return {"label": jnp.asarray(class_tokens)[labels]}, labels


def class_captions(class_prompts: tuple[str, ...] | None, per_class: int) -> tuple[str, ...] | None:
    """Each class's prompt repeated for its ``per_class`` rows (None without prompts)."""
    if class_prompts is None:
        return None
    return tuple(p for p in class_prompts for _ in range(per_class))


def requested_classes(classes: int | Sequence[int], num_classes: int | None) -> tuple[int, ...]:
    """The class labels an inference request asks for (an int or a sequence of them), checked
    against the model's ``num_classes``; a request the model cannot serve is one ``ValueError``
    line. Every class-conditional objective's ``infer`` asks this."""
    classes = (classes,) if isinstance(classes, int) else tuple(classes)
    if not num_classes or not classes:
        raise ValueError(f"classes={classes!r}: this model has no classes")
    bad = [c for c in classes if not (isinstance(c, int | np.integer) and 0 <= c < num_classes)]
    if bad:
        raise ValueError(f"classes {bad} are out of range: expected ints in [0, {num_classes})")
    return classes


def requested_conditions(
    classes: int | Sequence[int] | None,
    prompts: str | Sequence[str] | None,
    *,
    condition: Condition | None,
    num_classes: int | None,
    class_prompts: tuple[str, ...] | None,
) -> tuple[dict[str, jax.Array], tuple[str, ...] | None]:
    """``(conditions, captions)`` for one sample per requested class or prompt, for a model whose
    ``label`` condition is ``condition`` (None: unconditional) with ``num_classes`` classes and,
    when text-conditioned, ``class_prompts`` (one prompt per class: a class asked of a text model
    is its prompt). A request this model cannot serve is one ``ValueError`` line."""
    if classes is not None and prompts is not None:
        raise ValueError("give classes or prompts, not both")
    if classes is None and prompts is None:
        raise ValueError("give classes or prompts")
    if prompts is not None:
        prompts = (prompts,) if isinstance(prompts, str) else tuple(prompts)
        if condition is None or condition.encoder != "byte_text":
            raise ValueError(f"prompts={prompts!r}: this model is not text-conditioned; give classes")
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"prompts must be a non-empty sequence of str, got {prompts!r}")
        return {"label": jnp.asarray(prompt_tokens(prompts, condition.field.shape))}, prompts
    assert classes is not None  # raised above when neither classes nor prompts is given
    classes = requested_classes(classes, num_classes)
    if class_prompts is not None:  # a text model asked for classes: each class's prompt
        return requested_conditions(
            None,
            tuple(class_prompts[c] for c in classes),
            condition=condition,
            num_classes=num_classes,
            class_prompts=class_prompts,
        )
    return {"label": jnp.asarray(classes, jnp.int32)}, None


def unconditional(tokens: np.ndarray, like: jax.Array) -> jax.Array:
    """A condition's unconditional datum (``tokens``, its encoder's batch-field value), one row
    per row of ``like`` (the condition's values): what condition dropout and CFG's unconditional
    branch feed the network."""
    return jnp.broadcast_to(jnp.asarray(tokens, like.dtype), like.shape)


__all__ = [
    "Denoiser",
    "class_captions",
    "class_rows",
    "from_noise",
    "guided",
    "interval_guidance",
    "prompt_tokens",
    "requested_classes",
    "requested_conditions",
    "unconditional",
]

"""The digits race's sampling noise: one seeded NumPy draw that both sides of the race sample from.

``experiments/digits_race.py`` (dew) and ``third_party/edm/digits_race_reference.py``
(NVlabs/edm) both build their starting noise here, in dew's environment, so that for a given
``--sample_seeds`` the two trainings are drawn from the very same latents and labels and the
race's accuracies differ only by what was trained. The noise is standard normal (σ = 1): each
sampler scales it by its largest σ itself (``dew.sampling.sample`` by σ_0, NVlabs/edm's
``edm_sampler`` by ``t_steps[0]``). Pure NumPy, so the reference's PyTorch side needs no dew.
"""

from __future__ import annotations

import numpy as np

#: The race's digits: 8×8, one channel, ten classes.
IMAGE_SHAPE = (8, 8, 1)
NUM_CLASSES = 10


def race_latents(
    seed: int, per_class: int, image_shape: tuple[int, ...] = IMAGE_SHAPE, num_classes: int = NUM_CLASSES
) -> tuple[np.ndarray, np.ndarray]:
    """``(noise, labels)`` for one sampling seed: ``noise`` is ``[num_classes * per_class,
    *image_shape]`` float32 standard normal (NHWC, unscaled) from ``np.random.default_rng(seed)``,
    ``labels`` the int32 classes, class-major (``per_class`` of class 0, then of class 1, …) as
    ``Diffusion.draw`` and the reference's ``repeat_interleave`` order them. Deterministic for a
    given seed and NumPy's PCG64 stream. Raises ValueError on a negative seed or a count below 1."""
    if seed < 0 or per_class < 1 or num_classes < 1:
        raise ValueError(
            f"race latents: seed {seed}, per_class {per_class}, num_classes {num_classes} "
            "(a seed >= 0 and counts >= 1 are needed)"
        )
    labels = np.repeat(np.arange(num_classes, dtype=np.int32), per_class)
    noise = np.random.default_rng(seed).standard_normal((len(labels), *image_shape), dtype=np.float32)
    return noise, labels


def parse_seeds(text: str) -> list[int]:
    """``"1,2,3"`` as ``[1, 2, 3]``: distinct seeds >= 0, in the order given. Raises ValueError
    (naming the text) on an empty list, a non-integer, a negative or a repeated seed."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--sample_seeds={text!r}: expected comma-separated integers, e.g. 1,2,3") from None
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"--sample_seeds={text!r}: expected distinct seeds >= 0")
    return seeds

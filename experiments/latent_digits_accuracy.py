"""How often the latent digits run's decoded samples show the class they were asked for.

    python experiments/latent_digits_accuracy.py --workdir=runs/latent_digits --vae_run=runs/latent_digits_vae

The judge is dew's digits classifier (``dew.scoring.digits_classifier``, an RBF SVM on the real
8×8 digits). Decoded 32×32 RGB images are brought back to its input by ``to_8x8``: the channel
mean, then the mean of each 4×4 block, the exact inverse of ``latent_digits_data.py``'s
nearest-neighbour upsampling for real digits. Prints the accuracy of ``--per_class`` samples of
every class (drawn as the run's previews are, from ``--seed``) and, with ``--vae_run``, of the
VAE's reconstructions of the 180 held-out validation digits: the ceiling the decoder sets.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def to_8x8(images: np.ndarray) -> np.ndarray:
    """[N, 32, 32, 3] in [-1, 1] -> [N, 8, 8, 1]: channel mean, then 4×4 block means."""
    images = np.asarray(images, np.float64)
    n = len(images)
    return images.mean(-1).reshape(n, 8, 4, 8, 4).mean((2, 4))[..., None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workdir", default="runs/latent_digits")
    parser.add_argument("--vae_run", default="", help="also score the VAE's reconstructions")
    parser.add_argument("--per_class", type=int, default=50)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)

    import dew
    from dew.data.sources.digits import digits
    from dew.scoring.digits_classifier import classify_digits

    started = time.perf_counter()
    task = dew.pipeline(args.workdir)
    grid = task(per_class=args.per_class, seed=args.seed)
    asked = np.repeat(np.arange(10), args.per_class)
    accuracy = np.mean(classify_digits(to_8x8(grid.images)) == asked)
    print(
        f"{args.workdir} step {task.step}: {len(asked)} samples (seed {args.seed}), class accuracy "
        f"{accuracy:.3f} ({time.perf_counter() - started:.0f} s)"
    )
    if args.vae_run:
        held_out = digits("validation")
        x, labels = np.asarray(held_out.fields["image"]), np.asarray(held_out.fields["label"])
        upsampled = x.repeat(4, axis=1).repeat(4, axis=2).repeat(3, axis=3)
        reconstructed = dew.pipeline(args.vae_run)(images=upsampled).images
        vae = np.mean(classify_digits(to_8x8(reconstructed)) == labels)
        real = np.mean(classify_digits(x) == labels)
        print(
            f"{args.vae_run}: reconstructions of {len(x)} held-out digits, class accuracy "
            f"{vae:.3f} (the digits themselves: {real:.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

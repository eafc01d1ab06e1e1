"""``python -m dew.fid``: FID / KID of a folder of images in the standard Inception feature space.

    python -m dew.fid --images=samples/ --ref=real_stats.npz [--kid]
    python -m dew.fid --images=real/ --save_stats=real_stats.npz [--keep_features=10000]
    python -m dew.fid --images=samples/ --ref=real/            (reference statistics computed too)

Images are PNG/JPEG files of one size (as pytorch-fid, which batches them), read as RGB in [0, 1],
resized to 299×299 and embedded by the FID Inception (``dew.scoring.inception``) with weights
converted once by ``python -m dew.scoring.convert_inception``; statistics are streamed in float64
(``dew.scoring.statistics``). ``--ref`` is an ``.npz`` with ``mu``/``sigma`` (the format other
FID tools read and write) or a folder of images. ``--workdir`` (samples drawn through a run's
pipeline) needs ``dew.pipeline``. Bad input exits 2 with one line and writes nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence

import numpy as np

EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


class FidError(ValueError):
    """Input FID cannot use; the message names it."""


def list_images(folder: str, what: str) -> list[str]:
    if not os.path.isdir(folder):
        raise FidError(f"{what}={folder!r} is not a folder of images")
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.lower().endswith(EXTENSIONS))
    if len(files) < 2:
        raise FidError(
            f"{what}={folder!r} holds {len(files)} images ({'/'.join(EXTENSIONS)}); need at least 2"
        )
    return files


def read_batches(files: Sequence[str], batch_size: int) -> Iterator[np.ndarray]:
    """Batches [n, H, W, 3] float32 in [0, 1]; every image must have the first one's size."""
    from PIL import Image

    size = None
    for i in range(0, len(files), batch_size):
        batch = []
        for path in files[i : i + batch_size]:
            with Image.open(path) as img:
                array = np.asarray(img.convert("RGB"), np.float32) / 255.0
            if size is None:
                size = array.shape
            elif array.shape != size:
                raise FidError(
                    f"{path} is {array.shape[1]}x{array.shape[0]}, the first image {size[1]}x{size[0]}"
                )
            batch.append(array)
        yield np.stack(batch)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dew.fid", description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", help="folder of images to score")
    parser.add_argument("--workdir", help="a dew run: samples drawn through its pipeline")
    parser.add_argument("--ref", help="reference: .npz with mu/sigma (and features for KID), or a folder")
    parser.add_argument("--save_stats", help="write the images' statistics to this .npz")
    parser.add_argument("--keep_features", type=int, default=0, help="features kept in --save_stats (KID)")
    parser.add_argument("--kid", action="store_true", help="also report KID (needs features on both sides)")
    parser.add_argument(
        "--weights", default=None, help="converted Inception .npz (default: see convert_inception)"
    )
    parser.add_argument("--batch_size", type=int, default=50)
    parser.add_argument(
        "--allow_unpinned_weights",
        action="store_true",
        help="accept weights not converted from the pinned standard file (tests; FID then not comparable)",
    )
    return parser.parse_args(argv)


def _check(args: argparse.Namespace) -> list[str]:
    """Validate everything before any work; returns the image files."""
    if args.workdir:
        from dew import inference

        if getattr(inference.pipeline, "__module__", "") == "dew._unbuilt":
            raise FidError(
                "--workdir needs dew.pipeline to draw samples from a run, and it is not built yet; "
                "write samples to a folder and pass --images=<folder>"
            )
        raise FidError("--workdir: sampling through dew.pipeline is not wired into dew.fid yet; use --images")
    if not args.images:
        raise FidError("give --images=<folder> (or --workdir=<run>)")
    if not args.ref and not args.save_stats:
        raise FidError("give --ref=<stats.npz or folder> to score against, or --save_stats=<out.npz>")
    if args.batch_size < 1 or args.keep_features < 0:
        raise FidError(f"--batch_size={args.batch_size} must be >= 1 and --keep_features >= 0")
    files = list_images(args.images, "--images")
    if args.ref and not os.path.isdir(args.ref):
        from dew.scoring.statistics import load_statistics

        try:
            ref = load_statistics(args.ref)
        except (OSError, ValueError) as e:
            raise FidError(f"--ref: {e}") from None
        if args.kid and "features" not in ref:
            raise FidError(
                f"--ref={args.ref!r} holds no 'features' for --kid (save them with --keep_features)"
            )
    elif args.ref:
        list_images(args.ref, "--ref")
    from dew.scoring.convert_inception import default_path

    weights = os.path.expanduser(args.weights) if args.weights else default_path()
    if not os.path.isfile(weights):
        from dew.scoring.convert_inception import HOW_TO_GET

        raise FidError(f"FID Inception weights not found at {weights}: {HOW_TO_GET}")
    return files


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        files = _check(args)
    except FidError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from dew.scoring import distances
    from dew.scoring.inception_metrics import InceptionScorer
    from dew.scoring.statistics import load_statistics

    scorer = InceptionScorer(weights_path=args.weights, pinned=not args.allow_unpinned_weights)
    keep = max(args.keep_features, len(files) if args.kid else 0)
    try:
        stats = scorer.statistics(read_batches(files, args.batch_size), (0.0, 1.0), keep_features=keep)
        if args.ref and os.path.isdir(args.ref):
            ref_files = list_images(args.ref, "--ref")
            ref_stats = scorer.statistics(
                read_batches(ref_files, args.batch_size),
                (0.0, 1.0),
                keep_features=len(ref_files) if args.kid else 0,
            )
            ref = {"mu": ref_stats.mu, "sigma": ref_stats.sigma}
            if args.kid:
                ref["features"] = ref_stats.features
        elif args.ref:
            ref = load_statistics(args.ref)
    except FidError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{len(files)} images in {args.images}")
    if args.save_stats:
        from dew.scoring.statistics import save_statistics

        kept = stats.features[: args.keep_features] if args.keep_features else None
        save_statistics(args.save_stats, stats.mu, stats.sigma, kept)
        print(f"statistics -> {args.save_stats}")
    if args.ref:
        print(f"FID {distances.frechet_distance(stats.mu, stats.sigma, ref['mu'], ref['sigma']):.4f}")
        if args.kid:
            mean, std = distances.kernel_distance(stats.features, ref["features"])
            print(f"KID {mean:.6f} ± {std:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

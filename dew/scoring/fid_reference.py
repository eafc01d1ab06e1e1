"""FID statistics as NVlabs/edm's ``fid.py`` computes them, and reference files in its format.

``MomentSums`` accumulates features exactly as the reference's ``calculate_inception_stats``:
float64 running ``Σ f`` and ``Σ f fᵀ`` over every image, then (``fid.py`` lines ``mu /= n``,
``sigma -= mu.ger(mu) * n``, ``sigma /= n - 1``)

    μ = Σ f / n,    Σ = (Σ f fᵀ − n μ μᵀ) / (n − 1).

Sums of float64 rows taken in a fixed order are reproducible, so a draw interrupted between
chunks and resumed (``dew.scoring.fid_protocol``) ends on the same bits as one that never
stopped.

``reference_statistics(path, detector)`` is ``fid.py ref --data=PATH``: the images of an
NVlabs/edm data set (a directory or ``.zip`` of same-size images as its ``dataset_tool.py``
writes, read by ``dew.data.sources.image_folder.ImageFiles`` as its ``ImageFolderDataset`` reads
them: sorted names, ``np.array(PIL.Image.open(f))``, uint8, a greyscale image one channel) fed at
the data set's own resolution to the detector as uint8, one channel repeated to three.

The detector (``dew.scoring.fid_detector``: dew's FID Inception with its image handling) is
read by the caller, or by ``make_reference`` for ``python -m dew.fid ref``; its description goes
into the reference file.

Reference files are the reference's own ``.npz`` (``np.savez(dest, mu=mu, sigma=sigma)``), so its
published ``fid-refs/*.npz`` load here and dew's load in its ``fid.py calc`` (which reads only
``mu`` and ``sigma``). dew adds provenance arrays beside them: ``resolution`` ([H, W] of the
images), ``num_images`` and ``detector`` (a description with the weights' digest). A file
without ``resolution`` (NVlabs's) is accepted at any resolution; one with it refuses samples
of another (``dew.scoring.fid_detector.check_reference``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from dew.npz import Member, NotAnNpzError, read_npz
from dew.scoring.fid_detector import DEFAULT_HANDLING, Detector, weights_detector
from dew.scoring.images import FidInputError, decode_image


@dataclasses.dataclass
class MomentSums:
    """Running float64 ``count``, ``total`` (Σ f, [D]) and ``outer`` (Σ f fᵀ, [D, D]) of feature
    rows, added a block of rows at a time (the reference's per-batch ``mu +=``/``sigma +=``)."""

    count: int = 0
    total: np.ndarray | None = None
    outer: np.ndarray | None = None

    def add(self, features: np.ndarray) -> None:
        """Add rows [n, D] (any float dtype; summed in float64)."""
        f = np.asarray(features)
        if f.ndim != 2 or (self.total is not None and f.shape[1] != self.total.shape[0]):
            raise ValueError(f"MomentSums.add: features must be [n, D={self.dim}], got {f.shape}")
        f = f.astype(np.float64)
        if self.total is None:
            self.total = np.zeros(f.shape[1], np.float64)
            self.outer = np.zeros((f.shape[1], f.shape[1]), np.float64)
        total, outer = self.total, self.outer
        assert outer is not None  # set together with total
        total += f.sum(0)  # in place, into self.total / self.outer
        outer += f.T @ f
        self.count += len(f)

    @property
    def dim(self) -> int | None:
        return None if self.total is None else int(self.total.shape[0])

    def mu_sigma(self) -> tuple[np.ndarray, np.ndarray]:
        """(μ, Σ) by ``calculate_inception_stats``'s formula; needs at least two rows."""
        if self.count < 2:
            raise ValueError(f"FID statistics need at least 2 images, have {self.count}")
        assert self.total is not None and self.outer is not None  # set by the first add
        mu = self.total / self.count
        sigma = (self.outer - np.outer(mu, mu) * self.count) / (self.count - 1)
        return mu, sigma


def save_reference(path: str, mu: np.ndarray, sigma: np.ndarray, *, resolution, num_images, detector) -> None:
    """Write the reference's ``.npz`` (``mu``, ``sigma``) plus dew's provenance, atomically
    (a temporary file renamed into place)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(
            f,
            mu=np.asarray(mu, np.float64),
            sigma=np.asarray(sigma, np.float64),
            resolution=np.asarray(resolution, np.int64),
            num_images=np.int64(num_images),
            detector=np.str_(detector),
        )
    os.replace(tmp, path)


def _reference_schema() -> dict[str, Member]:
    return {
        "mu": Member("f", ("D",)),
        "sigma": Member("f", ("D", "D")),
        "resolution": Member("iu", (2,), required=False),
        "num_images": Member("iu", (), required=False),
        "detector": Member("U", (), max_bytes=4 * TEXT_CHARS, required=False),
    }


TEXT_CHARS = 4096  # a detector description: a name, its image handling and a digest


def load_reference(path: str, flag: str = "--ref", dim: int | None = None) -> dict[str, Any]:
    """``{"mu", "sigma"}`` and, when the file records them, ``"resolution"`` ([H, W]),
    ``"num_images"``, ``"detector"``; ``FidInputError`` naming ``flag``, the file and the member
    when unusable: not such an ``.npz`` (``dew.npz.read_npz``: sizes checked before anything is
    allocated, ``dim``, when given, the feature width), statistics that are not finite, fewer
    than 2 images recorded (a covariance needs 2), or a resolution that is not [H, W] >= 1. Other
    members (``features``) are not read."""
    if not os.path.isfile(path):
        raise FidInputError(f"{flag}={path!r} does not exist; expected an .npz with mu [D] and sigma [D, D]")
    try:
        data = read_npz(path, flag, _reference_schema(), dims={"D": dim} if dim else None, others="ignore")
    except NotAnNpzError as e:
        raise FidInputError(str(e)) from None
    out: dict[str, Any] = {k: np.asarray(data[k], np.float64) for k in ("mu", "sigma")}
    for key in ("mu", "sigma"):
        if not np.isfinite(out[key]).all():
            raise FidInputError(
                f"{flag}={path!r}: {key} holds values that are not finite; expected statistics"
            )
    if "resolution" in data:
        out["resolution"] = tuple(int(v) for v in np.asarray(data["resolution"]))
        if min(out["resolution"]) < 1:
            raise FidInputError(f"{flag}={path!r}: resolution {out['resolution']}; expected [H, W] >= 1")
    if "num_images" in data:
        out["num_images"] = int(np.asarray(data["num_images"]))
        if out["num_images"] < 2:
            raise FidInputError(
                f"{flag}={path!r} records statistics of {out['num_images']} images; a covariance needs 2"
            )
    if "detector" in data:
        out["detector"] = str(np.asarray(data["detector"]))
    return out


def dataset_files(path: str, flag: str = "--data") -> Any:
    """The data set's image files (``ImageFiles``), at least two; ``FidInputError`` otherwise."""
    from dew.data.sources.image_folder import ImageFiles, ImageFolderError

    try:
        files = ImageFiles(path)
    except ImageFolderError as e:
        raise FidInputError(f"{flag}={path!r}: {str(e).removeprefix('image_folder: ')}") from None
    if len(files.images) < 2:
        raise FidInputError(
            f"{flag}={path!r} holds {len(files.images)} image; need at least 2 for statistics"
        )
    return files


def dataset_batches(files: Any, batch: int, flag: str = "--data") -> Iterator[np.ndarray]:
    """uint8 [n, H, W, 3] batches in the files' sorted order; a greyscale image's channel is
    repeated to three (``calculate_inception_stats``'s ``images.repeat([1, 3, 1, 1])``). Every
    image must have the first one's shape, with 1 or 3 channels."""
    from dew.data.sources.image_folder import ImageBomb, bomb_refusal

    shape = None
    for start in range(0, len(files.images), batch):
        rows = []
        for name in files.images[start : start + batch]:
            where = f"{flag}={files.path!r}: {name}"
            try:
                image = decode_image(functools.partial(files.decode, name), where)
            except FidInputError:
                raise
            except ImageBomb as e:
                raise FidInputError(bomb_refusal(where, e.pil_error)) from None
            except ValueError as e:  # ImageFolderError: not an 8-bit image
                raise FidInputError(str(e)) from None
            if shape is None:
                shape = image.shape
                if shape[2] not in (1, 3):
                    raise FidInputError(
                        f"{flag}={files.path!r}: {name} has {shape[2]} channels; expected greyscale or RGB"
                    )
            elif image.shape != shape:
                raise FidInputError(
                    f"{flag}={files.path!r}: {name} is {image.shape[1]}x{image.shape[0]}x{image.shape[2]}, "
                    f"the first image {shape[1]}x{shape[0]}x{shape[2]}; all images must share one size"
                )
            rows.append(image)
        out = np.stack(rows)
        yield np.repeat(out, 3, axis=-1) if out.shape[-1] == 1 else out


def reference_statistics(
    files: Any, detector: Detector, batch: int = 64
) -> tuple[MomentSums, tuple[int, int]]:
    """``fid.py ref``: the data set's feature sums (every image once) and its resolution [H, W].

    Batches are padded to ``batch`` rows (one compiled program; the padding's features are
    dropped) and features summed in float64 in file order."""
    import jax

    features = jax.jit(detector.fn)
    sums, resolution = MomentSums(), None
    for images in dataset_batches(files, batch):
        resolution = (int(images.shape[1]), int(images.shape[2]))  # uint8 [n, H, W, 3]
        n = len(images)
        padded = np.concatenate([images, np.repeat(images[-1:], batch - n, axis=0)]) if n < batch else images
        sums.add(np.asarray(features(detector.params, padded))[:n])
    assert resolution is not None  # dataset_files gives at least two images
    return sums, resolution


def write_reference(
    files: Any, detector: Detector, dest: str, batch: int = 64
) -> tuple[int, tuple[int, int]]:
    """``fid.py ref``'s whole work: the data set's statistics (``reference_statistics``) written
    to ``dest`` with their provenance (``save_reference``: the resolution, the image count and
    ``detector``'s description). Returns (images, [H, W])."""
    sums, resolution = reference_statistics(files, detector, batch)
    mu, sigma = sums.mu_sigma()
    save_reference(
        dest, mu, sigma, resolution=resolution, num_images=sums.count, detector=detector.description
    )
    return sums.count, resolution


def make_reference(
    data: str,
    dest: str,
    batch: int,
    weights: str | None = None,
    *,
    pinned: bool = True,
    handling: str = DEFAULT_HANDLING,
) -> tuple[int, tuple[int, int]]:
    """``python -m dew.fid ref``'s work: the data set ``data`` listed (``dataset_files``), the
    detector read (``dew.scoring.fid_detector.weights_detector``: ``weights``, ``pinned``,
    ``handling``), then the
    statistics written to ``dest`` (``write_reference``, ``batch`` images at a time). Returns
    (images, [H, W]); ``FidInputError`` naming ``--data``, or ``--weights`` for weights it
    cannot use."""
    files = dataset_files(data)
    detector = weights_detector(weights, pinned=pinned, handling=handling)
    return write_reference(files, detector, dest, batch)


__all__ = [
    "FidInputError",
    "MomentSums",
    "dataset_batches",
    "dataset_files",
    "decode_image",
    "load_reference",
    "make_reference",
    "reference_statistics",
    "save_reference",
    "write_reference",
]

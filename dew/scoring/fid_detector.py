"""The FID protocol's detectors: ``Detector`` (a feature network, its params and a description
that names it and its weights), dew's FID Inception as one (``inception_detector``, from the
converted weights ``dew.scoring.convert_inception`` reads and checks), ADM's suite's over the
same network (``adm_detector``), and whether reference statistics fit FID's (``check_reference``).

The detector's image handling (``inception_detector(handling=...)``) defaults to ``"tf1"``, the
2015-12-05 TensorFlow graph's own (TF1 legacy bilinear resize to 299, (x − 128) / 128), which
NVlabs/edm's TorchScript detector reproduces; ``"pytorch_fid"`` is pytorch-fid's (half-pixel
bilinear, x / 255 · 2 − 1), what ``python -m dew.fid --images`` uses. The handling is part of the
detector's description, which reference files record (``dew.scoring.fid_reference``), and
``check_reference`` refuses statistics recorded with the other one.

``python -m dew.fid``'s modes build theirs here: ``ref``'s (``weights_detector``: weights it cannot
use are one line naming ``--weights``), the protocol's for FID (``protocol_detector``: the
reference's recorded handling checked before the weights are read, its feature size and
resolution after) and for ADM's suite (``adm_detector``, over the weights ADM's scorer read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from dew.scoring.images import FidInputError


@dataclasses.dataclass(frozen=True)
class Detector:
    """A feature network: ``fn(params, images)`` maps uint8 NHWC images (3 channels) to
    float32 [n, ``dim``] features, pure and jittable; ``description`` names it and its weights."""

    fn: Callable[[Any, Any], Any]
    params: Any
    dim: int
    description: str


DEFAULT_HANDLING = "tf1"
_HANDLING_MARK = "image handling "
ADM_DESCRIPTION = "dew inception_fid 2015-12-05 (ADM: pool_3, mixed_6/conv[..., :7]), image handling tf1"


def inception_detector(
    weights: str | None = None, *, pinned: bool = True, handling: str = DEFAULT_HANDLING
) -> Detector:
    """dew's FID Inception (``dew.scoring.inception``, the pytorch-fid port of the 2015-12-05
    graph) on uint8 images with ``handling`` (``"tf1"``: TF1 legacy bilinear resize to 299,
    (x − 128) / 128; ``"pytorch_fid"``: x / 255, half-pixel bilinear resize, 2x − 1). The
    weights (the converted ``.npz`` at ``weights``; None: the default file) are read once and
    checked against their digest (and, with ``pinned``, the standard file's), which the
    description records."""
    from dew.scoring import inception
    from dew.scoring.convert_inception import content_sha256, read_checked

    inception.check_handling(handling, "--image_handling")
    _, arrays = read_checked(weights, pinned=pinned)
    params = inception.params_from_torch_names(arrays)
    digest = content_sha256(arrays)  # the digest the file records, which read_checked verified

    def fn(p: Any, images: Any) -> Any:
        import jax.numpy as jnp

        return inception.features(p, images.astype(jnp.float32), (0.0, 255.0), handling=handling)

    description = f"dew inception_fid 2015-12-05, {_HANDLING_MARK}{handling}, weights sha256 {digest}"
    return Detector(fn, params, inception.FEATURE_DIM, description)


def adm_detector(params: Any, digest: str) -> Detector:
    """ADM's suite's detector in the FID protocol over the FID Inception's ``params`` (the
    weights ``dew.scoring.adm_metrics.AdmScorer`` read, their content ``digest``): uint8 images
    [n, H, W, 3] fed at their own size through the graph's TF1 resize -> [n, 4071] float32,
    ``pool_3`` [2048] then ``mixed_6/conv[..., :7]`` flattened [2023], described as
    ``ADM_DESCRIPTION`` with the digest."""
    from dew.scoring import inception
    from dew.scoring.adm_evaluator import POOL_DIM, SPATIAL_DIM

    def fn(p: Any, images: Any) -> Any:
        import jax.numpy as jnp

        pool, spatial = inception.adm_features(p, images.astype(jnp.float32))
        return jnp.concatenate([pool, spatial], axis=-1)

    return Detector(fn, params, POOL_DIM + SPATIAL_DIM, f"{ADM_DESCRIPTION}, weights sha256 {digest}")


def recorded_handling(description: str | None) -> str | None:
    """The image handling a detector description names; dew's descriptions from before the
    handling was recorded are ``"pytorch_fid"``; None for another detector's (NVlabs's files
    record none)."""
    if not description or not description.startswith("dew inception_fid"):
        return None
    if _HANDLING_MARK not in description:
        return "pytorch_fid"
    return description.split(_HANDLING_MARK, 1)[1].split(",", 1)[0].strip()


def check_reference(
    ref: dict[str, Any],
    path: str,
    resolution: tuple[int, int],
    dim: int | None,
    handling: str | None = None,
) -> None:
    """Refuse reference statistics of another feature size (``dim``; None: not checked), or
    (when recorded) computed at another resolution than ``resolution`` (the samples' [H, W]),
    or (when the file records dew's detector) with another image ``handling`` (None: not
    checked) than the samples'."""
    want, got = handling, recorded_handling(ref.get("detector"))
    if want and got and want != got:
        raise FidInputError(
            f"--ref={path!r} was computed with image handling {got!r}, the samples are embedded with "
            f"{want!r}; recompute the reference with --image_handling={want} (or draw with "
            f"--image_handling={got})"
        )
    if dim is not None and ref["mu"].shape[0] != dim:
        raise FidInputError(
            f"--ref={path!r} holds {ref['mu'].shape[0]}-d statistics; the detector gives {dim}-d features"
        )
    recorded = ref.get("resolution")
    if recorded is not None and tuple(recorded) != tuple(resolution):
        raise FidInputError(
            f"--ref={path!r} was computed at resolution {recorded[0]}x{recorded[1]}, the samples are "
            f"{resolution[0]}x{resolution[1]}; compute the reference from the data set at the samples' "
            "resolution (python -m dew.fid ref --data=... --dest=...)"
        )


def weights_detector(weights: str | None, *, pinned: bool, handling: str) -> Detector:
    """``inception_detector`` of ``python -m dew.fid``'s ``--weights`` (None: the converted
    default file), ``pinned`` and ``--image_handling``; weights it cannot use are one
    ``FidInputError`` line naming ``--weights``."""
    try:
        return inception_detector(weights, pinned=pinned, handling=handling)
    except (OSError, ValueError) as e:
        raise FidInputError(f"--weights: {e}") from None


def protocol_detector(
    reference: dict[str, Any],
    ref: str,
    resolution: tuple[int, int],
    weights: str | None,
    *,
    pinned: bool,
    handling: str,
) -> Detector:
    """The FID protocol's detector (``weights_detector``) for samples at ``resolution`` scored
    against ``reference`` (``dew.scoring.fid_reference.load_reference`` of ``ref``): the image
    handling the reference records checked before the weights are read, its feature size and
    resolution after (``check_reference``); ``FidInputError`` otherwise."""
    check_reference(reference, ref, resolution, None, handling)
    detector = weights_detector(weights, pinned=pinned, handling=handling)
    check_reference(reference, ref, resolution, detector.dim)
    return detector


__all__ = [
    "ADM_DESCRIPTION",
    "DEFAULT_HANDLING",
    "Detector",
    "adm_detector",
    "check_reference",
    "inception_detector",
    "protocol_detector",
    "recorded_handling",
    "weights_detector",
]

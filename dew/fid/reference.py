"""``python -m dew.fid ref``: a data set's reference statistics as NVlabs/edm's ``fid.py ref``
computes them (``dew.scoring.fid_reference``), in its ``.npz`` format plus the resolution and
the detector, which ``--preset`` checks against the samples'. The flags are read and checked by
``dew.fid.cli.ref_args``; ``reference_job`` turns them into the mode's settings and
``reference`` runs it."""

from __future__ import annotations

import argparse
import dataclasses

from dew.fid.inputs import Weights


@dataclasses.dataclass(frozen=True)
class ReferenceJob:
    """The ``ref`` mode's settings, from its checked flags: the data set ``data`` (a directory or
    ``.zip`` of images), the ``.npz`` to write (``dest``), images per step (``batch``) and the
    ``weights``."""

    data: str
    dest: str
    batch: int
    weights: Weights


def reference_job(args: argparse.Namespace) -> ReferenceJob:
    """The ``ref`` mode's settings from its checked flags (``dew.fid.cli.ref_args``)."""
    weights = Weights(args.weights, pinned=not args.allow_unpinned_weights, handling=args.image_handling)
    return ReferenceJob(data=args.data, dest=args.dest, batch=args.batch, weights=weights)


def reference(args: argparse.Namespace) -> int:
    """``ref --data=DIR|ZIP --dest=FILE.npz``: the reference statistics of the data set
    ``--data`` embedded ``--batch`` images at a time, written to ``--dest``
    (``dew.scoring.fid_reference.make_reference``: the data set listed, then the weights read);
    ``FidInputError`` on bad input."""
    from dew.scoring.fid_reference import make_reference

    job = reference_job(args)
    weights = job.weights
    count, resolution = make_reference(
        job.data, job.dest, job.batch, weights.path, pinned=weights.pinned, handling=weights.handling
    )
    print(f"{count} images at {resolution[0]}x{resolution[1]} -> {job.dest}")
    return 0


__all__ = ["ReferenceJob", "reference", "reference_job"]

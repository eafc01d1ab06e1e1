"""What every ``python -m dew.fid`` mode shares: its one error type, an argument parser whose usage
errors are that error's one line, the Inception weights a mode embeds with (``Weights``), the
run a ``--workdir`` names (``load_run``: checked to draw images, with their resolution) and the
images a mode scores (``samples``: a ``Samples``, a folder's files read in batches or a run's
samples drawn in batches)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import numpy as np

from dew.scoring.images import list_images, read_images


class FidError(ValueError):
    """Input FID cannot use; the message names it."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one ``FidError`` line, not usage text."""

    def error(self, message: str) -> NoReturn:
        raise FidError(message)


@dataclasses.dataclass(frozen=True)
class Weights:
    """The FID Inception weights a mode embeds with: ``path`` (``--weights``; None: the converted
    default file), ``pinned`` (False with ``--allow_unpinned_weights``) and the detector's image
    ``handling`` (``--image_handling``; the protocol and ``ref`` feed the detector with it)."""

    path: str | None = None
    pinned: bool = True
    handling: str = "tf1"

    @property
    def flag(self) -> str:
        """What a refusal of these weights names: ``--weights``, or the default file."""
        return "--weights" if self.path else "the FID Inception weights"


def load_run(workdir: str, step: int | None = None, raw: bool = False) -> tuple[Any, tuple[int, int]]:
    """``dew.pipeline(workdir, step=step, raw=raw)`` (``--workdir``, ``--step``, ``--raw``), checked
    to draw images by ``per_class`` and ``seed``, and [H, W] of the images it draws (a latent
    run's decoded ones); ``FidError`` naming the flag otherwise."""
    from dew.inference import PipelineError, pipeline

    flags = f"--workdir={workdir!r}" + ("" if step is None else f" --step={step}")
    try:
        task = pipeline(workdir, step=step, raw=raw)
    except PipelineError as e:
        raise FidError(f"{flags}: {str(e).removeprefix('pipeline: ').splitlines()[0]}") from None
    shape = getattr(getattr(getattr(task.objective, "input_spec", None), "sample", None), "shape", ())
    shape = getattr(task.objective, "image_shape", None) or shape  # a latent run: decoded images
    if not {"per_class", "seed"} <= set(task.options) or len(shape) != 3 or shape[-1] not in (1, 3):
        raise FidError(
            f"--workdir={workdir!r} is a {type(task.objective).__name__} run drawing {shape or 'no'} "
            "samples; FID needs a run whose pipeline draws images [H, W, 1 or 3] by per_class and seed "
            "(e.g. diffusion)"
        )
    return task, (int(shape[0]), int(shape[1]))


def samples(args: argparse.Namespace, *, resolution: bool = False) -> Samples:
    """The images ``--images`` or ``--workdir`` names (flags checked): the folder's files, or the
    run's pipeline loaded (``load_run``) with the first draw's seed; with ``resolution`` their
    [H, W] too (a folder's first image's header read). ``FidError`` naming the flag otherwise."""
    from dew.scoring.images import image_resolution as first_image

    if args.workdir:
        task, size = load_run(args.workdir, args.step, args.raw)
        seed = task.options["seed"] if args.seed is None else args.seed
        what = f"samples from {task!r}, seed {seed}"
        return Samples(args.num_samples, what, args.batch_size, task=task, seed=seed, resolution=size)
    files = list_images(args.images, "--images")
    size = first_image(files) if resolution else None
    return Samples(len(files), f"images in {args.images}", args.batch_size, files=files, resolution=size)


@dataclasses.dataclass(frozen=True)
class Samples:
    """The images a mode scores, ``count`` of them, ``what`` they are in its report line: a
    folder's ``files`` (``--images``: in [0, 1]), or ``count`` samples of a run's pipeline ``task``
    (``--workdir``: in [-1, 1]), draw ``i`` with seed ``seed + i`` (``draw_batches``); read or
    drawn ``batch_size`` at a time, once per ``batches()``; their [H, W] ``resolution`` where the
    mode asked for it (``samples``)."""

    count: int
    what: str
    batch_size: int
    files: Sequence[str] = ()
    task: Any = None
    seed: int = 0
    resolution: tuple[int, int] | None = None

    @property
    def value_range(self) -> tuple[float, float]:
        return (-1.0, 1.0) if self.task is not None else (0.0, 1.0)

    def batches(self) -> Iterator[np.ndarray]:
        """The images [n, H, W, C] float32 in ``value_range``, ``batch_size`` at a time."""
        if self.task is not None:
            return draw_batches(self.task, self.count, self.seed, self.batch_size)
        return read_images(self.files, self.batch_size)


DEFAULT_NUM_SAMPLES = 10_000  # --workdir: the usual FID sample count (FID is biased by it)
PROGRESS_SECONDS = 10.0  # --workdir: at most one progress line per this many seconds (and the last)


def draw_batches(task: Any, num_samples: int, seed: int, batch_size: int) -> Iterator[np.ndarray]:
    """``num_samples`` samples [n, H, W, C] in [-1, 1] from ``task``, ``batch_size`` at a time.

    Draw ``i`` is ``task(seed=seed + i)`` (the run's preview settings: every class, class-major);
    the last is cut to the samples still needed taking classes in turn. Progress on stderr.
    """
    classes = getattr(task.objective, "num_classes", None) or 1
    done, draw, last_report = 0, 0, time.monotonic()
    while done < num_samples:
        images = np.asarray(task(seed=seed + draw).images, np.float32)
        if len(images) > num_samples - done:  # class-major -> classes in turn, then cut
            order = np.arange(len(images))
            if len(images) % classes == 0:
                order = order.reshape(classes, -1).T.reshape(-1)
            images = images[order[: num_samples - done]]
        for i in range(0, len(images), batch_size):
            yield images[i : i + batch_size]
        done, draw = done + len(images), draw + 1
        if done == num_samples or time.monotonic() - last_report >= PROGRESS_SECONDS:
            print(f"fid: {done}/{num_samples} samples", file=sys.stderr, flush=True)
            last_report = time.monotonic()


__all__ = [
    "DEFAULT_NUM_SAMPLES",
    "FidError",
    "Parser",
    "Samples",
    "Weights",
    "draw_batches",
    "load_run",
    "samples",
]

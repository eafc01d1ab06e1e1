"""What every ``python -m dew.fid`` mode shares: its one error type, an argument parser whose usage
errors are that error's one line, and the run a ``--workdir`` names, checked to draw images."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn


class FidError(ValueError):
    """Input FID cannot use; the message names it."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one ``FidError`` line, not usage text."""

    def error(self, message: str) -> NoReturn:
        raise FidError(message)


def load_pipeline(args: argparse.Namespace) -> Any:
    """``dew.pipeline(--workdir, step=--step, raw=--raw)``, checked to draw images by
    ``per_class`` and ``seed``; ``FidError`` naming the flag otherwise."""
    from dew.inference import PipelineError, pipeline

    flags = f"--workdir={args.workdir!r}" + ("" if args.step is None else f" --step={args.step}")
    try:
        task = pipeline(args.workdir, step=args.step, raw=args.raw)
    except PipelineError as e:
        raise FidError(f"{flags}: {str(e).removeprefix('pipeline: ').splitlines()[0]}") from None
    shape = getattr(getattr(getattr(task.objective, "input_spec", None), "sample", None), "shape", ())
    shape = getattr(task.objective, "image_shape", None) or shape  # a latent run: decoded images
    if not {"per_class", "seed"} <= set(task.options) or len(shape) != 3 or shape[-1] not in (1, 3):
        raise FidError(
            f"--workdir={args.workdir!r} is a {type(task.objective).__name__} run drawing {shape or 'no'} "
            "samples; FID needs a run whose pipeline draws images [H, W, 1 or 3] by per_class and seed "
            "(e.g. diffusion)"
        )
    return task

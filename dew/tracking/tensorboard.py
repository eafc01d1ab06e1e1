"""``TensorBoardTracker``: real TensorBoard event files, written without TensorFlow.

The events are framed and written by tensorboard's own ``EventFileWriter`` (tfrecord framing
and CRCs are not reimplemented here); dew only builds the ``Summary`` protos:

- scalars as ``simple_value`` (``EventAccumulator.Scalars("train/loss")``);
- arrays of more than one element as histograms (``Histograms``);
- ImageGrid as a PNG image summary (captions drawn under the images), VideoGrid as an
  animated-GIF image summary (TensorBoard's image dashboard plays GIFs), TextSamples and the run
  config as text-plugin summaries, TokenScores as a heat-coloured PNG image summary (the
  dashboard shows no HTML) plus a text summary of bits per row, Representations as a PNG of
  their PCA scatter by label.

Tags are ``<category>/<key>``. On ``CLEANUP_AFTER_CKPT_RESTORATION`` at step S a
``SessionLog.START`` event is written at step S+1: TensorBoard's reader then purges what the
abandoned continuation wrote for steps after S. ``tensorboard`` is imported on the worker
thread when the first report is written.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from dew.artifacts import ImageGrid, Representations, TextSamples, TokenScores, VideoGrid
from dew.tracking.background import BackgroundTracker
from dew.tracking.base import LoggingCategory, is_scalar, tag, to_float
from dew.tracking.media import encode_gif, encode_png, image_pixels, video_frames
from dew.tracking.render import representations_pixels, token_scores_pixels
from dew.tracking.reports import ArtifactReport, Report, ScalarReport


def _protos(*names: str) -> list[Any]:
    """The ``tensorboard.compat.proto`` modules ``names``, imported when first used (tensorboard is
    optional). Typed ``Any``: protobuf builds their message classes at import time, so a type
    checker sees no attributes on them."""
    return [importlib.import_module(f"tensorboard.compat.proto.{name}") for name in names]


class TensorBoardTracker(BackgroundTracker):
    """A TensorBoard event file in directory, opened on the first value logged into it.

    ``config`` (a flat or nested mapping), when given, is written once as a text summary
    ``config`` at step 0 so the dashboard shows what the run was. The writer is a process
    of its own by default (building the protos costs about 70 us of Python per report of 10
    scalars, which a thread would take from the loop through the GIL); ``writer="thread"``
    keeps it in this process.
    """

    def __init__(
        self,
        directory: str,
        config: Mapping[str, Any] | None = None,
        flush_secs: float = 10.0,
        writer: str = "process",
    ):
        kwargs = {"directory": directory, "config": config, "flush_secs": flush_secs}
        super().__init__(writer, kwargs)
        self.directory = os.path.abspath(directory)
        self.config = dict(config) if config is not None else None
        self.flush_secs = flush_secs
        self._writer: Any = None

    def _open(self) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        # EventFileWriter's flush_secs is unannotated ("Number" in its docstring); pyright infers int
        # from its default, 120.
        self._writer = EventFileWriter(
            self.directory,
            max_queue_size=1024,
            flush_secs=self.flush_secs,  # pyright: ignore[reportArgumentType]
        )
        if self.config is not None:
            text = "```\n" + json.dumps(self.config, indent=2, sort_keys=True, default=str) + "\n```"
            self._add([_text_value("config", text)], step=0)

    def _emit(self, batch: list[Report]) -> None:
        event_pb2 = _protos("event_pb2")[0]

        for report in batch:
            if isinstance(report, ScalarReport):
                if report.category is LoggingCategory.CLEANUP_AFTER_CKPT_RESTORATION:
                    start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
                    self._writer.add_event(
                        event_pb2.Event(wall_time=time.time(), step=report.step + 1, session_log=start)
                    )
                    continue
                summary_values = [_value(tag(report.category, k), v) for k, v in report.values.items()]
                self._add([v for v in summary_values if v is not None], report.step)
            elif isinstance(report, ArtifactReport):
                self._add(_artifact_values(report.name, report.artifact), report.step)

    def _add(self, values: list[Any], step: int) -> None:
        event_pb2, summary_pb2 = _protos("event_pb2", "summary_pb2")

        if values:
            summary = summary_pb2.Summary(value=values)
            self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def _flush_backend(self) -> None:
        self._writer.flush()

    def _close_backend(self) -> None:
        self._writer.close()


def _value(name: str, value: Any) -> Any:
    """A scalar or histogram ``Summary.Value``; None for what TensorBoard cannot show (text)."""
    summary_pb2 = _protos("summary_pb2")[0]

    if is_scalar(value):
        return summary_pb2.Summary.Value(tag=name, simple_value=to_float(value))
    array = np.asarray(value)
    if array.dtype.kind in "fiub" and array.size > 1:
        return summary_pb2.Summary.Value(tag=name, histo=_histogram(array.astype(np.float64).ravel()))
    return None


def _histogram(x: np.ndarray, bins: int = 30) -> Any:
    summary_pb2 = _protos("summary_pb2")[0]

    x = x[np.isfinite(x)]
    if x.size == 0:
        return summary_pb2.HistogramProto()
    counts, edges = np.histogram(x, bins=bins)
    return summary_pb2.HistogramProto(
        min=float(x.min()),
        max=float(x.max()),
        num=float(x.size),
        sum=float(x.sum()),
        sum_squares=float(np.square(x).sum()),
        bucket_limit=[float(e) for e in edges[1:]],
        bucket=[float(c) for c in counts],
    )


def _image_value(name: str, pixels: np.ndarray, encoded: bytes) -> Any:
    summary_pb2 = _protos("summary_pb2")[0]

    height, width, channels = pixels.shape[-3:]
    image = summary_pb2.Summary.Image(
        height=height, width=width, colorspace=channels, encoded_image_string=encoded
    )
    return summary_pb2.Summary.Value(tag=name, image=image)


def _text_value(name: str, text: str) -> Any:
    summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2 = _protos(
        "summary_pb2", "tensor_pb2", "tensor_shape_pb2", "types_pb2"
    )
    from tensorboard.plugins.text import metadata

    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING,
        string_val=[text.encode()],
        tensor_shape=tensor_shape_pb2.TensorShapeProto(),
    )
    return summary_pb2.Summary.Value(
        tag=name, metadata=metadata.create_summary_metadata(name, ""), tensor=tensor
    )


def _artifact_values(name: str, artifact: Any) -> list[Any]:
    if isinstance(artifact, ImageGrid):
        pixels = image_pixels(artifact)
        return [_image_value(name, pixels, encode_png(pixels))]
    if isinstance(artifact, VideoGrid):
        frames = video_frames(artifact)
        rgb = frames if frames.shape[-1] == 3 else np.repeat(frames, 3, axis=-1)
        return [_image_value(name, rgb, encode_gif(frames, artifact.fps))]
    if isinstance(artifact, TextSamples):
        # Markdown: one paragraph per line, so each sample shows on a line of its own.
        return [_text_value(name, "\n\n".join(line for line in artifact.to_text().splitlines() if line))]
    if isinstance(artifact, TokenScores):
        pixels = token_scores_pixels(artifact)
        bits = (
            (artifact.losses * artifact.weights).sum(1) / np.maximum(artifact.weights.sum(1), 1) / np.log(2)
        )
        summary = f"mean {artifact.bits_per_token():.4f} bits per counted target\n\n" + "\n\n".join(
            f"row {i}: {b:.4f} bits" for i, b in enumerate(bits)
        )
        return [_image_value(name, pixels, encode_png(pixels)), _text_value(f"{name}/bits", summary)]
    if isinstance(artifact, Representations):
        pixels = representations_pixels(artifact, name)
        return [_image_value(name, pixels, encode_png(pixels))]
    return []

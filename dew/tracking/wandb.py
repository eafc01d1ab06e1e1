"""``WandbTracker``: a Weights & Biases run, offline by default.

``mode="offline"`` (the default) needs no account and no network: the run is written to
``directory/wandb/offline-run-*/`` and can be uploaded later with ``wandb sync``.
``mode="online"`` streams to W&B and needs the user's key (``WANDB_API_KEY`` or ``wandb
login``); dew never asks for one.

- The config is the run config; each step's scalars are one history row, keys
  ``<category>/<key>``; arrays are ``wandb.Histogram``; ImageGrid is ``wandb.Image`` (captions
  drawn under the images), VideoGrid a GIF ``wandb.Video``, TextSamples a ``wandb.Table`` with
  one sample (and its prompt) per row, TokenScores a heat-coloured ``wandb.Html``,
  Representations a ``wandb.Image`` of their PCA scatter by label. All reports of
  one step that are queued together go into one ``run.log`` call.
- The run id is kept in ``directory/run.json``; a restarted training resumes the same run
  (``resume="allow"``). W&B history cannot be rewound from here: on
  ``CLEANUP_AFTER_CKPT_RESTORATION`` at step S the summary gets ``dew/restored_from_step = S``;
  online, W&B itself drops re-logged steps below the run's last step (its monotonic-step rule).

``wandb`` is imported by the tracker's worker when the first report is written.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping
from typing import Any, Literal, cast

import numpy as np

from dew.artifacts import ImageGrid, Representations, TextSamples, TokenScores, VideoGrid
from dew.tracking.background import BackgroundTracker
from dew.tracking.base import LoggingCategory, is_scalar, tag, to_float
from dew.tracking.media import encode_gif, image_pixels, video_frames
from dew.tracking.render import representations_pixels, token_scores_html
from dew.tracking.reports import ArtifactReport, Report, ScalarReport

MODES = ("offline", "online")
Mode = Literal["offline", "online"]


class WandbTracker(BackgroundTracker):
    """A Weights & Biases run, opened on the first value logged into it.

    The writer is a process of its own by default (``run.log`` costs about 170 us of Python per
    call, which a thread would take from the training loop through the GIL)."""

    def __init__(
        self,
        project: str = "dew",
        *,
        directory: str,
        mode: str = "offline",
        run_name: str | None = None,
        entity: str | None = None,
        config: Mapping[str, Any] | None = None,
        writer: str = "process",
    ):
        kwargs = {
            "project": project,
            "directory": directory,
            "mode": mode,
            "run_name": run_name,
            "entity": entity,
            "config": config,
        }
        super().__init__(writer, kwargs)
        if mode not in MODES:
            raise ValueError(f"WandbTracker: mode={mode!r} is invalid: expected one of {MODES}")
        self.project, self.entity, self.run_name = project, entity, run_name
        self.mode: Mode = cast(Mode, mode)  # checked against MODES above
        self.directory = os.path.abspath(directory)
        self.config = dict(config) if config is not None else {}
        self.run: Any = None

    @property
    def _run_file(self) -> str:
        return os.path.join(self.directory, "run.json")

    def _open(self) -> None:
        import wandb

        os.makedirs(self.directory, exist_ok=True)
        run_id = None
        if os.path.exists(self._run_file):
            with open(self._run_file) as f:
                run_id = json.load(f).get("run_id")
        settings = wandb.Settings(
            silent=True,
            console="off",
            disable_git=True,
            save_code=False,
            x_disable_stats=True,
            x_save_requirements=False,
        )
        self.run = wandb.init(
            project=self.project,
            entity=self.entity,
            dir=self.directory,
            mode=self.mode,
            name=self.run_name,
            config=self.config,
            id=run_id,
            resume="allow",
            reinit="create_new",
            settings=settings,
        )
        with open(self._run_file, "w") as f:
            json.dump({"run_id": self.run.id, "project": self.project}, f)

    def _emit(self, batch: list[Report]) -> None:
        import wandb

        row: dict[str, Any] = {}
        row_step: int | None = None
        for report in batch:
            if row and report.step != row_step:
                self.run.log(row, step=row_step)
                row = {}
            row_step = report.step
            if isinstance(report, ScalarReport):
                if report.category is LoggingCategory.CLEANUP_AFTER_CKPT_RESTORATION:
                    self.run.summary["dew/restored_from_step"] = report.step
                    continue
                for key, value in report.values.items():
                    if is_scalar(value):
                        row[tag(report.category, key)] = to_float(value)
                    elif np.asarray(value).dtype.kind in "fiub":
                        # wandb annotates ``sequence`` as a Sequence; its documented input is array_like.
                        values = np.asarray(value).ravel()
                        row[tag(report.category, key)] = wandb.Histogram(values)  # pyright: ignore[reportArgumentType]
            elif isinstance(report, ArtifactReport):
                media = _media(wandb, report.name, report.artifact)
                if media is not None:
                    row[report.name] = media
        if row:
            self.run.log(row, step=row_step)

    def _close_backend(self) -> None:
        """Finish the run, and make sure its files are complete when ``close`` returns.

        ``run.finish()`` only informs W&B's service process, which writes the run file on its
        own schedule; a reader right after it may find the file empty. When no other W&B run is
        active in this process, ``wandb.teardown()`` waits for the service to write everything
        and exit (the next run starts a new one). With other runs active, the file is complete
        once the process ends (W&B's own exit hook).
        """
        import wandb
        from wandb.sdk import wandb_setup

        self.run.finish()
        if wandb_setup.singleton().most_recent_active_run is None:
            wandb.teardown()


def _media(wandb: Any, name: str, artifact: Any) -> Any:
    if isinstance(artifact, ImageGrid):
        pixels = image_pixels(artifact)
        caption = " | ".join(artifact.captions)[:1000] if artifact.captions else None
        return wandb.Image(pixels[..., 0] if pixels.shape[-1] == 1 else pixels, caption=caption)
    if isinstance(artifact, VideoGrid):
        return wandb.Video(io.BytesIO(encode_gif(video_frames(artifact), artifact.fps)), format="gif")
    if isinstance(artifact, TextSamples):
        rows = zip(artifact.prompts(), artifact.to_lines(), strict=True)
        return wandb.Table(columns=["prompt", "sample"], data=[[p or "", line] for p, line in rows])
    if isinstance(artifact, TokenScores):
        return wandb.Html(token_scores_html(artifact, name), inject=False)
    if isinstance(artifact, Representations):
        return wandb.Image(representations_pixels(artifact, name))
    return None

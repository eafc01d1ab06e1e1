"""``MLflowTracker``: an MLflow run, through ``mlflow.MlflowClient``.

With no ``tracking_uri`` the store is embedded: a sqlite database ``mlflow.db`` and an
``artifacts/`` folder inside ``directory`` (the run's ``tracking/mlflow``), so no server is
needed and nothing is written outside the workdir. ``tracking_uri`` (``config.tracking.
mlflow_uri``) points at a real server or any store URI MLflow accepts.

- Params: the config, flattened to dotted keys, logged once when the run opens.
- Metrics: every scalar, per step, as ``<category>/<key>``, written in batches (queued reports
  are coalesced into ``log_batch`` calls). Arrays are not metrics in MLflow and are skipped.
- Media: ImageGrid through ``log_image(key=name, step=step)`` (MLflow's stepped images,
  captions drawn under the images); every other artifact as the files
  ``media.artifact_files`` names, under the same folders as the local tracker's: VideoGrid a
  GIF under ``videos/``, TextSamples ``.txt`` + ``.html`` under ``text/``, TokenScores a
  heat-coloured ``.html`` + ``.png`` under ``scores/``, Representations a PCA ``.png`` +
  ``.npz`` under ``representations/``.
- ``BEST_MODEL`` values are metrics under ``best_model/`` and the tag ``dew.best_step``.
- A workdir's run is resumed: the run id is kept in ``directory/run.json``, so a restarted
  training continues the same MLflow run. MLflow cannot delete metric points; on
  ``CLEANUP_AFTER_CKPT_RESTORATION`` at step S the run gets the tag
  ``dew.restored_from_step = S`` and the re-run steps are logged again (the latest timestamp
  of a step is the current value).

``mlflow`` is imported (about 2.5 s) by the tracker's worker when the first report is written.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from dew.artifacts import ImageGrid
from dew.tracking.background import BackgroundTracker
from dew.tracking.base import LoggingCategory, is_scalar, tag, to_float
from dew.tracking.media import artifact_files, image_pixels
from dew.tracking.reports import ArtifactReport, Report, ScalarReport

_METRICS_PER_BATCH = 1000  # MLflow's log_batch limits
_PARAMS_PER_BATCH = 100
_PARAM_LENGTH = 6000


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings to dotted keys: {"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


class MLflowTracker(BackgroundTracker):
    """An MLflow run in experiment, opened on the first value logged into it.

    ``directory`` holds the embedded store (when ``tracking_uri`` is None) and the id of the
    run this workdir writes to; ``params`` (nested or flat) are logged when the run opens.
    The writer is a process of its own by default: MLflow's store spends about 100 us of Python
    per metric, which a thread would take from the training loop through the GIL.
    """

    linger = 1.0
    """MLflow's sqlite store costs ~1 ms of Python per ``log_batch`` of 10 metrics but ~65 us per
    metric in batches of 1000; a second's worth of reports goes into one call."""

    def __init__(
        self,
        experiment: str = "dew",
        *,
        directory: str,
        tracking_uri: str | None = None,
        run_name: str | None = None,
        params: Mapping[str, Any] | None = None,
        writer: str = "process",
    ):
        kwargs = {
            "experiment": experiment,
            "directory": directory,
            "tracking_uri": tracking_uri,
            "run_name": run_name,
            "params": params,
        }
        super().__init__(writer, kwargs)
        if not experiment:
            raise ValueError("MLflowTracker: experiment must be a non-empty name, got ''")
        self.experiment = experiment
        self.directory = os.path.abspath(directory)
        self.tracking_uri = tracking_uri or f"sqlite:///{os.path.join(self.directory, 'mlflow.db')}"
        self.embedded = not tracking_uri
        self.run_name = run_name
        self.params = flatten(params) if params is not None else {}
        self.run_id: str | None = None
        self._client: Any = None

    @property
    def _run_file(self) -> str:
        return os.path.join(self.directory, "run.json")

    def _open(self) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        os.makedirs(self.directory, exist_ok=True)
        self._client = client = MlflowClient(tracking_uri=self.tracking_uri)
        self.run_id = self._previous_run()
        if self.run_id is not None:
            client.update_run(self.run_id, status="RUNNING")
            return
        found = client.get_experiment_by_name(self.experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            location = f"file://{os.path.join(self.directory, 'artifacts')}" if self.embedded else None
            experiment_id = client.create_experiment(self.experiment, artifact_location=location)
        self.run_id = client.create_run(experiment_id, run_name=self.run_name).info.run_id
        with open(self._run_file, "w") as f:
            json.dump({"tracking_uri": self.tracking_uri, "run_id": self.run_id}, f)
        params = [Param(k, str(v)[:_PARAM_LENGTH]) for k, v in sorted(self.params.items())]
        for i in range(0, len(params), _PARAMS_PER_BATCH):
            client.log_batch(self.run_id, params=params[i : i + _PARAMS_PER_BATCH])

    def _previous_run(self) -> str | None:
        """The run this directory wrote to before, if it still exists in the same store."""
        if not os.path.exists(self._run_file):
            return None
        with open(self._run_file) as f:
            saved = json.load(f)
        if saved.get("tracking_uri") != self.tracking_uri:
            return None
        try:
            return self._client.get_run(saved["run_id"]).info.run_id
        except Exception:  # deleted or unknown in this store: start a new run
            return None

    def _emit(self, batch: list[Report]) -> None:
        from mlflow.entities import Metric

        pending: list[Any] = []
        for report in batch:
            if isinstance(report, ScalarReport):
                if report.category is LoggingCategory.CLEANUP_AFTER_CKPT_RESTORATION:
                    self._log_metrics(pending)
                    self._client.set_tag(self.run_id, "dew.restored_from_step", str(report.step))
                    continue
                now = int(time.time() * 1000)
                pending += [
                    Metric(tag(report.category, k), to_float(v), now, report.step)
                    for k, v in report.values.items()
                    if is_scalar(v)
                ]
                if report.category is LoggingCategory.BEST_MODEL:
                    self._log_metrics(pending)
                    self._client.set_tag(self.run_id, "dew.best_step", str(report.step))
            elif isinstance(report, ArtifactReport):
                self._log_metrics(pending)
                self._log_artifact(report.name, report.artifact, report.step)
        self._log_metrics(pending)

    def _log_metrics(self, metrics: list[Any]) -> None:
        """Write and empty ``metrics``, in chunks MLflow accepts."""
        for i in range(0, len(metrics), _METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=metrics[i : i + _METRICS_PER_BATCH])
        metrics.clear()

    def _log_artifact(self, name: str, artifact: Any, step: int) -> None:
        stem = f"{name}_{step:08d}"
        if isinstance(artifact, ImageGrid):
            pixels = image_pixels(artifact)
            self._client.log_image(
                self.run_id, pixels[..., 0] if pixels.shape[-1] == 1 else pixels, key=name, step=step
            )
            return
        with tempfile.TemporaryDirectory() as tmp:
            for folder, file_name, data in artifact_files(stem, artifact):
                path = os.path.join(tmp, file_name)
                with open(path, "wb") as f:
                    f.write(data)
                self._client.log_artifact(self.run_id, path, artifact_path=folder)

    def _close_backend(self) -> None:
        self._client.set_terminated(self.run_id)

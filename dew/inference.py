"""Inference pipelines: ``pipeline(source)`` turns a finished (or running) dew run into a callable
task, its weights placed once.

``source`` is a run's workdir (it holds ``run.json`` and ``checkpoints/``) or that run's
checkpoint directory (``<workdir>/checkpoints``) or one step of it (``.../checkpoints/<step>``).
The run metadata names the resolved config; the objective is rebuilt from it exactly as the
Trainer built it (``build_objective`` on the training split's source), the parameters' shapes
come from ``objective.init`` traced abstractly (no data read, nothing computed), and the weights
are read once by ``dew.checkpointing.weights.read_weights`` (the debiased EMA: the checkpoint
records its EMA, as ``Checkpoints.restore_ema`` debiases it) or, with ``raw=True``, the live
parameters; it reads those items and ``extra`` alone, read-only, from the persistent tier. They are
placed on the default device when the pipeline is built; calling the task never touches the
checkpoint again.

The weights are placed as the Trainer places the parameters it previews (replicated over
the mesh ``config.mesh`` describes), so the task's jitted sampler is the same program the run's
previews ran.

The task is the objective's own: ``objective.inference_options()`` names the keyword arguments
it accepts, with defaults, and ``objective.infer(params, **options)`` returns an artifact (an
``ImageGrid``/``VideoGrid`` of samples, ``TextSamples``, ``Representations``). The defaults
are the run's own preview settings, so ``pipeline(workdir)()`` draws what the run previewed.

Every bad input is one ``PipelineError`` (a ``ValueError``) naming it: a source that is not a
dew run, a step that does not exist, an option the task does not take.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np


class PipelineError(ValueError):
    """A pipeline source, step or option that cannot be used; the message says which and why."""


def _locate(source: str) -> tuple[str, int | None]:
    """(workdir, step named by the path or None) for a workdir, its checkpoints/ or a step dir."""
    from dew.run_records import RUN_METADATA

    path = os.path.abspath(os.fspath(source))
    if not os.path.isdir(path):
        raise PipelineError(f"pipeline: source {source!r} is not a directory (expected a dew run's workdir)")
    step = None
    if os.path.basename(path).isdigit() and os.path.basename(os.path.dirname(path)) == "checkpoints":
        step, path = int(os.path.basename(path)), os.path.dirname(path)
    if os.path.basename(path) == "checkpoints" and os.path.exists(
        os.path.join(os.path.dirname(path), RUN_METADATA)
    ):
        path = os.path.dirname(path)
    if not os.path.exists(os.path.join(path, RUN_METADATA)):
        raise PipelineError(
            f"pipeline: {source!r} is not a dew run: no {RUN_METADATA} in {path} (expected the --workdir of "
            "a dew training run, or its checkpoints/ directory)"
        )
    return path, step


class Pipeline:
    """A run's inference task with its weights placed: call it with the objective's options.

    ``objective``, ``config`` (the run's resolved config), ``step`` (the checkpoint read),
    ``raw`` (live weights rather than the debiased EMA), ``params`` (on the default device) and
    ``options`` (accepted keyword arguments and their defaults) are attributes.
    """

    def __init__(
        self,
        objective: Any,
        config: Any,
        step: int,
        params: Any,
        raw: bool,
        workdir: str,
        guide: Pipeline | None = None,
    ):
        self.objective, self.config, self.step, self.params, self.raw = objective, config, step, params, raw
        self.workdir, self.guide = workdir, guide
        self.options: dict[str, Any] = dict(objective.inference_options())
        if "seed" in self.options:  # the run's previews draw with PRNGKey(config.seed)
            self.options["seed"] = int(config.seed)

    def check(self, options: Mapping[str, Any]) -> None:
        """Raise ``PipelineError`` for an option the task does not take, or a value whose kind
        differs from its default's (an int, a float, a bool or a string: ``mistyped``)."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            accepted = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
            raise PipelineError(
                f"pipeline: {type(self.objective).__name__} does not take option(s) {', '.join(unknown)}; "
                f"it takes: {accepted}"
            )
        for name, value in options.items():
            expected = self.mistyped(name, value)
            if expected is not None:
                raise PipelineError(
                    f"pipeline: option {name}={value!r} is invalid: expected {expected} "
                    f"(the default is {name}={self.options[name]!r})"
                )

    def mistyped(self, name: str, value: Any) -> str | None:
        """What option ``name`` accepts (e.g. ``"an int"``) when ``value`` is not of its default's
        kind, else None. Only a default that is an int, float, bool or string fixes the kind
        (an int passes for a float); any other default leaves the check to the task."""
        default = self.options[name]
        if isinstance(default, bool):
            return None if isinstance(value, bool) else "True or False"
        if isinstance(default, int):
            ok = isinstance(value, int | np.integer) and not isinstance(value, bool)
            return None if ok else "an int"
        if isinstance(default, float):
            ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
            return None if ok else "a number"
        if isinstance(default, str):
            return None if isinstance(value, str) else "a string"
        return None

    def __call__(self, **options: Any) -> Any:
        self.check(options)
        try:
            extra = (
                {}
                if self.guide is None
                else {"guide": self.guide.objective, "guide_params": self.guide.params}
            )
            return self.objective.infer(self.params, **{**self.options, **options}, **extra)
        except (ValueError, TypeError) as e:
            if isinstance(e, PipelineError):
                raise
            raise PipelineError(f"pipeline: {type(self.objective).__name__}: {e}") from None

    def __repr__(self) -> str:
        weights = "raw" if self.raw else "EMA"
        return (
            f"Pipeline({type(self.objective).__name__}, step {self.step}, {weights} weights, {self.workdir})"
        )


def check_guide(main: Pipeline, guide: Pipeline) -> None:
    """A guide network must draw what the main one draws: the same sample shape (resolution,
    channels) and the same conditioning (condition fields, encoders, classes); else one
    ``PipelineError`` line naming what differs."""
    a, b = main.objective, guide.objective
    if not hasattr(b, "denoiser"):
        raise PipelineError(
            f"pipeline: guide {guide.workdir} ({type(b).__name__}) has no denoiser to guide with"
        )
    pairs = {
        "sample shape": (a.input_spec.sample.shape, b.input_spec.sample.shape),
        "conditions": (dict(a.input_spec.conditions), dict(b.input_spec.conditions)),
        "classes": (getattr(a, "num_classes", None), getattr(b, "num_classes", None)),
    }
    for what, (mine, theirs) in pairs.items():
        if mine != theirs:
            raise PipelineError(
                f"pipeline: guide {guide.workdir} has {what} {theirs!r}, the main run {main.workdir} has "
                f"{mine!r}; expected a guide trained on the same data and conditioning"
            )


def pipeline(
    source: str, *, step: int | None = None, raw: bool = False, guide: str | Pipeline | None = None
) -> Pipeline:
    """Load the inference task for source, its weights placed once.

    ``source``: a run's workdir, its ``checkpoints/`` directory or one step directory in it.
    ``step``: the checkpoint to read (default: the step the path names, else the latest).
    ``raw``: the live parameters instead of the debiased EMA. See the module docstring.
    ``guide``: a second run (a source as above, or its ``Pipeline``) whose network guides the
    samples (autoguidance: the ``guidance`` weight and ``guidance_interval`` options apply to
    it instead of to the unconditional branch); ``check_guide`` says what must match.
    """
    import dew  # the registry fill: every objective, model and data set resolvable by name
    from dew.checkpointing.weights import read_weights, stored_steps
    from dew.run_records import read_run_metadata
    from dew.schema import ConfigError
    from dew.training.build import build_objective, open_split
    from dew.training.trainer_config import resolve_config

    del dew
    from dew.runtime import platform

    # Built before JAX started (a user's script): the platform's choices, as python -m dew.sample makes them.
    platform.start_for("dew.pipeline", say=False, warn=False, present_devices=False, detect_processes=False)
    workdir, named = _locate(source)
    if step is not None and named is not None and step != named:
        raise PipelineError(f"pipeline: source names step {named} but step={step} was asked for")
    step = named if step is None else step
    if step is not None and (isinstance(step, bool) or not isinstance(step, int | np.integer)):
        raise PipelineError(f"pipeline: step must be an int or None, got {step!r}")
    metadata = read_run_metadata(workdir) or {}
    if "config" not in metadata:
        raise PipelineError(f"pipeline: {workdir}/run.json holds no config: not a dew run's metadata")
    config = resolve_config(metadata["config"])
    try:  # the objective and the parameter shapes come from the run's data set
        train_source = open_split(config.dataset, "train")
    except ConfigError as e:
        raise PipelineError(f"pipeline: {workdir}'s data set: {str(e).splitlines()[0]}") from None
    objective = build_objective(config, train_source)
    if not hasattr(objective, "infer"):
        raise PipelineError(
            f"pipeline: {type(objective).__name__} provides no inference task (no infer method)"
        )
    # Read-only: a run that is still training keeps its in-flight save.
    directory = os.path.join(workdir, "checkpoints")
    available = stored_steps(directory)
    if step is None:
        if not available:
            raise PipelineError(f"pipeline: {workdir} has no checkpoint yet (nothing to load)")
        step = available[-1]
    elif int(step) not in available:
        raise PipelineError(
            f"pipeline: {workdir} has no checkpoint at step {step}; it has steps {sorted(available)}"
        )
    step = int(step)
    example = {
        k: jax.ShapeDtypeStruct((config.dataset.batch_size, *v.shape[1:]), v.dtype)
        for k, v in train_source.fields.items()
    }
    template = jax.eval_shape(objective.init, jax.random.PRNGKey(0), example)
    params = read_weights(directory, step, None if raw else template, raw=raw)
    # Placed as the Trainer places what it previews (replicated over the run's mesh), so the
    # task's jitted sampler is the very program the run's previews ran: same samples, bit for bit.
    from dew.training import sharding

    replicated = sharding.Layout.for_mesh(sharding.spec_from_config(config.mesh).mesh()).replicated
    params = jax.device_put(jax.tree.map(np.asarray, params), replicated)
    main = Pipeline(objective, config, step, params, raw, workdir)
    if guide is not None:
        main.guide = guide if isinstance(guide, Pipeline) else pipeline(guide, raw=raw)
        check_guide(main, main.guide)
    return main

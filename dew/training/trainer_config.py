"""The Trainer's config: the sections the trainer itself owns (train, eval, preview; the optimizer's
in ``dew.training.learning_rate``),
the whole schema they join (each other section declared by the code that owns it), and checking a
config and a work directory before any work."""

from __future__ import annotations

import os
from collections.abc import Sequence

import ml_collections

from dew.averaging import ema as ema_lib
from dew.checkpointing import settings as checkpoint_config
from dew.contracts.objective import MODEL_CONFIG, OBJECTIVE_CONFIG
from dew.data import config as data_config
from dew.run_records import recorded_kernels
from dew.runtime import platform as runtime_platform
from dew.schema import ConfigError, Key, Section, at_least, resolve
from dew.tracking import trackers as trackers_lib
from dew.training import precision as precision_lib
from dew.training import sharding
from dew.training.learning_rate import OPTIMIZER_CONFIG, finite_number, make_optimizer
from dew.training.nonfinite import POLICIES as NONFINITE_POLICIES
from dew.training.profile import CONFIG as PROFILE_CONFIG

TRAIN_CONFIG = Section(
    "the loop",
    {
        "num_steps": Key(
            1000, "micro-batches to train for: the run's last step", **at_least(1, "an int >= 1")
        ),
        "log_every": Key(50, "steps per logged window of training metrics", **at_least(1, "an int >= 1")),
        "accumulation": Key(
            1,
            "micro-batches of dataset.batch_size per optimizer update (num_steps counts micro-batches)",
            **at_least(1, "an int >= 1 (micro-batches per update)"),
        ),
        "steps_per_call": Key(
            1,
            "train steps per call of the compiled program (a scan over that many batches): the host "
            "dispatches once per call, which pays where a step takes well under a millisecond or two "
            "(small networks, fast accelerators). Calls end on every cadence (logging, evaluation, "
            "checkpoints), so states, metrics and checkpoints are those of single steps",
            **at_least(1, "an int >= 1"),
        ),
        "nonfinite": Key(
            "stop",
            "on a non-finite loss or gradient: 'stop' (raise naming the step) or 'skip' (drop, count it)",
            choices=NONFINITE_POLICIES,
        ),
        "max_skipped": Key(
            0.5,
            "the skip policy's brake: the fraction of a log_every window's updates it may drop before "
            "the run stops as 'stop' would, after saving the state (which no skipped update touched); "
            "1: no brake",
            check=lambda v: finite_number(v) and 0 <= v <= 1,
            accepted="a fraction in [0, 1]",
        ),
    },
)


EVAL_CONFIG = Section(
    "the objective's held-out statistics on a fixed prefix of the validation split (debiased EMA)",
    {
        "every": Key(
            500,
            "steps between evaluations (0: none, and so no best checkpoint)",
            **at_least(0, "an int >= 0 (0 disables evaluation)"),
        ),
        "num_batches": Key(1, "validation batches per evaluation", **at_least(1, "an int >= 1")),
        "batch_size": Key(
            None,
            "examples per validation batch (None: config.dataset.batch_size; set it when the "
            "validation split is smaller than a training batch)",
            kind=int,
            **at_least(1, "an int >= 1, or None for config.dataset.batch_size"),
        ),
    },
)
PREVIEW_CONFIG = Section(
    "the objective's preview artifact of the debiased EMA, written under <workdir>/previews",
    {
        "every": Key(
            500, "steps between previews (0: none)", **at_least(0, "an int >= 0 (0 disables previews)")
        ),
        "metrics": Key(
            (),
            "registered metrics (dew.metrics) the objective scores each preview with",
            item=str,
            registry="metrics",
        ),
    },
)


def config_schema() -> Section:
    """The whole schema of a Trainer config: each section as the code that owns it declares it."""
    return Section(
        "a dew experiment",
        {
            "seed": Key(
                0,
                "seeds the parameters, the data order, evaluation and previews",
                check=lambda v: 0 <= v < 2**32,
                accepted="an int in [0, 2**32) (it seeds jax and numpy)",
            ),
            "dataset": data_config.CONFIG,
            "objective": OBJECTIVE_CONFIG,
            "model": MODEL_CONFIG,
            "optimizer": OPTIMIZER_CONFIG,
            "ema": ema_lib.CONFIG,
            "train": TRAIN_CONFIG,
            "precision": precision_lib.CONFIG,
            "mesh": sharding.CONFIG,
            "runtime": runtime_platform.CONFIG,
            "checkpoint": checkpoint_config.CONFIG,
            "eval": EVAL_CONFIG,
            "preview": PREVIEW_CONFIG,
            "profile": PROFILE_CONFIG,
            "tracking": trackers_lib.CONFIG,
        },
    )


def resolve_config(
    config: ml_collections.ConfigDict, overrides: Sequence[str] = ()
) -> ml_collections.ConfigDict:
    """``config`` checked against ``config_schema()`` with ``overrides`` applied: every key set
    (omitted ones take their defaults), or a ``ConfigError`` naming the first bad key."""
    resolved, _ = resolve(config_schema(), config, overrides)
    return resolved


def check_workdir(workdir: str, config: ml_collections.ConfigDict | None = None) -> str:
    """The run's directory must be named (an empty ``--workdir=`` would train in the current
    directory) and be a directory (or not exist yet); nothing is created here. Given the resolved
    ``config``, its checks against the workdir and the data run too (``check_before_start``).
    Returns the absolute path."""
    if not str(workdir).strip():
        raise ConfigError(
            f"--workdir={workdir!r} is empty; name the run's directory (new or a previous run's), e.g. "
            "--workdir=runs/edm"
        )
    path = os.path.abspath(workdir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--workdir={workdir!r} is a file; give a directory (new or a previous run's)")
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ConfigError(f"--workdir={workdir!r} lies under {parent!r}, which is a file")
    if config is not None:
        check_before_start(config, path)
    return path


def check_before_start(config: ml_collections.ConfigDict, workdir: str) -> None:
    """The checks of a resolved ``config`` that need the workdir or the data but no JAX backend:
    run before the platform starts (the devices, the compilation cache) and before anything is
    created, so such bad input is one line and exit 2 with nothing written.

    - ``checkpoint.step_to_restore`` must name a step stored where the restore reads it: this
      run's checkpoints, or ``checkpoint.restore_dir``'s while this run has none (a remote
      directory is listed at the restore instead);
    - with evaluation on, ``eval.num_batches`` batches of ``eval.batch_size`` (None:
      ``dataset.batch_size``) must fit the validation split, as one process reads it (the
      Trainer checks each process's share again, and the batch sizes against the mesh and the
      splits).
    """
    check_step_to_restore(config, workdir)
    if config.eval.every:
        from dew.data.dataset import Dataset
        from dew.training.build import open_split

        source = open_split(config.dataset, "validation", keep=True)  # the Trainer's, opened once
        try:
            validation = Dataset(source, config.eval.batch_size or config.dataset.batch_size, shuffle=False)
        except ValueError:
            return  # a batch the split cannot hold: the Trainer names the key, after the mesh's checks
        try:
            validation.check_first(config.eval.num_batches)
        except ValueError as e:
            raise ConfigError(f"config.eval.num_batches={config.eval.num_batches} is invalid: {e}") from None


def platform_for(
    config: ml_collections.ConfigDict, workdir: str, platform: runtime_platform.Platform | None
) -> tuple[str, runtime_platform.Platform | None]:
    """The workdir and the platform a ``Trainer`` of the resolved ``config`` runs with. Given the
    caller's ``platform`` (``dew.launch.Run`` checked the workdir and started it), the step to
    restore is checked again and both come back as they are. Without one (a Trainer built in a
    user's own code): the workdir and the config's checks first (``check_workdir``: absolute
    path), then ``dew.runtime.start`` as ``python -m dew.main`` applies it, keeping the kernels
    the run's ``run.json`` recorded (``start_for``; the platform is None only where JAX started
    first, and then the user's line that built the Trainer gets one warning)."""
    if platform is not None:
        check_step_to_restore(config, workdir)
        return workdir, platform
    workdir = check_workdir(workdir, config)
    recorded = recorded_kernels(workdir)
    runtime_platform.start_for("Trainer", config, workdir, stacklevel=4, recorded=recorded)
    return workdir, runtime_platform.started()


def check_step_to_restore(config: ml_collections.ConfigDict, workdir: str) -> None:
    """``checkpoint.step_to_restore`` names a stored step (``check_before_start``), or a
    ``ConfigError`` says which steps there are; reads the directories' names alone."""
    s = checkpoint_config.checkpoint_settings(config.checkpoint)
    if not s.enabled or s.step_to_restore is None:
        return
    where = s.checkpoint_directory(workdir)
    steps = checkpoint_config.stored_steps(where, s.local_directory)
    if steps == [] and s.restore_dir is not None:
        where = s.restore_dir
        steps = checkpoint_config.stored_steps(where)
    if steps is None or s.step_to_restore in steps:
        return
    held = f"its steps are {steps}" if steps else "it holds none"
    raise ConfigError(
        f"config.checkpoint.step_to_restore={s.step_to_restore} is invalid: {where} holds no "
        f"checkpoint for step {s.step_to_restore} ({held}); expected a stored step, or None for the latest"
    )


__all__ = [
    "EVAL_CONFIG",
    "PREVIEW_CONFIG",
    "TRAIN_CONFIG",
    "check_before_start",
    "check_step_to_restore",
    "check_workdir",
    "config_schema",
    "make_optimizer",
    "platform_for",
    "resolve_config",
]

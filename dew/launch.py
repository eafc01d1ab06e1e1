"""``Run``: one training run as ``python -m dew.main`` makes it, each check in one place, once.

In order: ``Run(name, config, workdir)`` checks the workdir and the config checks that need no
backend (``check_workdir``: a missing ``restore_dir``, a ``step_to_restore`` not stored);
``train`` is the rest, once: ``start`` reads its ``run.json`` once (a damaged one stops here,
named; the kernels it recorded are kept), sets up the process and its platform before JAX
starts (``start_platform``: one call, one ``Platform`` value) and builds the ``Trainer`` with
that value (it validates everything and writes nothing); then the workdir lock (process 0),
the check that the resume fits the config (``Trainer.check_resumable``), the console lines,
the libraries' logs routed under ``<workdir>/logs``, and training (``Trainer.train``, which
records the run's start in ``run.json``); it prints the line a finished run ends with and
returns the exit status. A run that fails has its checkpoint writer shut down, is reported
(``dew.failures.run_failed``) and then lets go of the lock.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

import jax
import ml_collections

from dew.failures import capture_library_logs, run_failed, stop_process
from dew.run_records import RUN_METADATA, read_run
from dew.runtime import heartbeats
from dew.runtime.platform import Platform, start
from dew.runtime.workdir_lock import WorkdirLock, describe_stale
from dew.schema import ConfigError
from dew.training.trainer import Trainer
from dew.training.trainer_config import check_workdir


def say(line: str) -> None:
    """One console line of the run, ``dew: ...``, on stdout."""
    print(f"dew: {line}", flush=True)


def start_platform(
    config: ml_collections.ConfigDict,
    workdir: str,
    coordinator: str | None = None,
    num_processes: str | None = None,
    process_id: str | None = None,
) -> Platform:
    """The process and its platform, set up before JAX starts, as one value: the process group
    the flags (or ``DEW_*`` variables, or a cluster JAX detects) name, the CPU devices, the
    convolution library, the kernels (a resumed run keeps the kernels its ``run.json``
    recorded, for settings left at ``auto``; a damaged ``run.json`` stops here, named, before
    any write) and the compilation cache (``dew.runtime.start``). In a group, every process then
    agrees on the config, and a lost peer stops this one with a report. A setting this machine
    cannot honour is a ``ConfigError``."""
    recorded = (read_run(workdir) or {}).get("kernels")
    try:
        platform = start(
            config,
            workdir,
            group_flags=(coordinator, num_processes, process_id),
            recorded=recorded,
            recorded_in=os.path.join(workdir, RUN_METADATA),
        )
    except ConfigError:  # a process group that cannot form keeps its own type
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if platform.processes is not None:  # one config in every process; a lost peer stops this one
        heartbeats.agree(
            config,
            config.runtime.coordinator_timeout,
            config.runtime.heartbeat_timeout,
            lambda e: stop_process(e, workdir),
        )
    return platform


class Run:
    """One run of ``config`` (resolved) in ``workdir``, named ``name`` (the experiment file) in
    its console lines. See the module docstring for the order of its steps."""

    def __init__(self, name: str, config: ml_collections.ConfigDict, workdir: str):
        self.name, self.config = name, config
        self.workdir = check_workdir(workdir, config)
        self.platform: Platform | None = None
        self.trainer: Trainer | None = None
        self.lock: WorkdirLock | None = None

    def start(
        self, coordinator: str | None = None, num_processes: str | None = None, process_id: str | None = None
    ) -> Trainer:
        """Everything before the first write: the platform started (``start_platform``, which
        reads ``run.json``), the Trainer built with it; returns the Trainer."""
        self.platform = start_platform(self.config, self.workdir, coordinator, num_processes, process_id)
        self.trainer = Trainer.for_run(self.config, self.workdir, self.platform)
        return self.trainer

    def train(
        self,
        argv: Sequence[str],
        coordinator: str | None = None,
        num_processes: str | None = None,
        process_id: str | None = None,
    ) -> int:
        """The whole run of ``python -m dew.main`` with ``argv``: ``start`` (the flags name the
        process group), then the workdir lock, the resume check, the console lines and
        ``Trainer.train``. Returns the exit status: 0 with the line a finished run ends with (its
        step, where its checkpoints and previews are), else what ``dew.failures.run_failed``
        says of the failure, reported before the lock is let go."""
        try:
            trainer = self.start(coordinator, num_processes, process_id)
            # One run per workdir (process 0 holds it for the whole run), taken before anything
            # opens the checkpoint directory: the run's first save cleans up unfinished saves,
            # which would be a live holder's save in progress (readers never clean up:
            # Store.manager).
            self.lock = WorkdirLock(self.workdir).acquire() if jax.process_index() == 0 else None
            if self.lock is not None and self.lock.stale:
                say(describe_stale(self.lock.stale))
            trainer.check_resumable()
            say(f"training {self.name} in {self.workdir}")
            # What the run says of its platform: every choice on a CPU; on an accelerator the
            # devices and the compilation cache.
            for line in trainer.platform.lines(trainer.layout.data_parallel_size) if trainer.platform else []:
                say(line)
            capture_library_logs(self.workdir)
            state = trainer.train()
        except Exception as e:
            # The checkpoint writer and orbax managers are shut down first, so no async teardown
            # runs at interpreter exit; what they raise now belongs to the failure reported.
            checkpoints = None if self.trainer is None else self.trainer.checkpoints
            if checkpoints is not None:
                with contextlib.suppress(Exception):
                    checkpoints.close()
            return run_failed(e, self.workdir, argv)
        finally:
            if self.lock is not None:  # let go of the workdir lock (when this process took it)
                self.lock.release()
        checkpoints = trainer.checkpoints
        where = checkpoints.directory if checkpoints else "none (checkpointing off)"
        previews = os.path.join(self.workdir, "previews")
        print(
            f"done at step {int(state.step)}: checkpoints in {where}"
            + (f", previews in {previews}" if self.config.preview.every else ""),
            flush=True,
        )
        return 0


__all__ = ["Run", "start_platform"]

"""``python -m dew.main --config=experiments/edm.py --workdir=runs/edm [--config.key=value ...]``

Trains, evaluates, previews and checkpoints under ``--workdir``; run it again to resume from the
latest checkpoint. Bad input (unknown key, wrong type, unknown registry name, a data set that
cannot be opened, a workdir that is a file, a resume the config does not fit) stops before
anything is written: one line naming what is wrong, exit status 2. Any other failure prints one
short message and its cause, writes the full traceback under ``<workdir>/logs`` and exits 1.
``--help-config`` prints the resolved schema (every key with its value, default, kind and doc)
and exits.

One of several processes: ``--coordinator=HOST:PORT --num_processes=N --process_id=I`` (or the
``DEW_COORDINATOR`` / ``DEW_NUM_PROCESSES`` / ``DEW_PROCESS_ID`` variables; under SLURM, Open MPI
or a TPU pod JAX finds them itself) start JAX's distributed runtime first
(``dew.runtime.distributed``). Each process reads its own share of every batch; process 0 holds
the workdir lock and writes the trackers and previews; a SIGTERM to any of them saves one
checkpoint at the same step in all, and all exit with the preemption code.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dew.config import apply_overrides, describe_config, load_config
from dew.failures import end_process, report, resume_command
from dew.runtime.cpu.memory import with_kept_heap

if TYPE_CHECKING:
    from dew.training.trainer import Trainer


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m dew.main",
        description="Train a dew experiment. Override config keys with --config.<key>=<value>.",
    )
    parser.add_argument("--config", required=True, help="experiment file, e.g. experiments/edm.py[:arg]")
    parser.add_argument("--workdir", help="run directory: checkpoints, tracking, previews")
    parser.add_argument(
        "--help-config",
        action="store_true",
        help="print every config key (value, default, kind, doc) after overrides, and exit",
    )
    group = parser.add_argument_group(
        "several processes", "one run over several processes (dew.runtime.distributed); all three or none"
    )
    group.add_argument("--coordinator", help="HOST:PORT of process 0, which hosts JAX's coordination service")
    group.add_argument("--num_processes", help="how many processes the run has")
    group.add_argument("--process_id", help="this process's index, 0 .. num_processes - 1")
    args, rest = parser.parse_known_args(argv)
    overrides: list[str] = []
    for item in rest:
        if not item.startswith("--config."):
            parser.error(f"unrecognised argument {item!r} (config keys are set with --config.<key>=<value>)")
        overrides.append(item[2:])
    if args.workdir is None and not args.help_config:
        parser.error("the following arguments are required: --workdir")
    return args, overrides


def main(argv: Sequence[str] | None = None) -> int:
    """Train; return the exit status: 0 done, 2 bad input (one line, nothing written; also a
    workdir another live run holds or that cannot be written, a damaged run.json), 128 + signal
    when preempted (saved, with the command to resume; 130 too for a second Ctrl-C during that
    save, saying what had landed), 1 any other failure (one short message and its cause; the
    traceback in a file, see ``dew.failures``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args, overrides = parse_args(argv)
    run = None
    try:
        raw = load_config(args.config)
        config = None if args.help_config else apply_overrides(raw, overrides)  # the one resolution
        if config is None:
            print(f"# {args.config}: every key, as resolved (value, default if different, kind, doc)")
            print(describe_config(raw, overrides), end="")
            return 0
        from dew.launch import Run  # JAX and the trainer load once with_kept_heap restarted the process

        run = Run(args.config, config, args.workdir)
        # the platform, the Trainer, the workdir lock, the resume check, the console lines, fit;
        # its done line, or its failure reported (dew.failures.run_failed): the exit status
        return run.train(argv, args.coordinator, args.num_processes, args.process_id)
    except Exception as e:  # the CLI boundary: every failure becomes one short report
        return report(e, None)
    except KeyboardInterrupt as e:  # Ctrl-C outside the preemption stage's handler, or a second one
        print(f"dew: {interrupted(e, run and run.trainer, argv)}", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT


def interrupted(error: KeyboardInterrupt, trainer: Trainer | None, argv: Sequence[str]) -> str:
    """What a Ctrl-C that stopped the run leaves behind, for a person: the save it cut short
    (``preemption.Interrupted``), the newest checkpoint that landed (read as a reader would),
    and how to resume. Nothing is waited for: what is still being written is abandoned and
    the next run's first save cleans it up."""
    from dew.training.preemption import landed_steps

    step = getattr(error, "step", None)
    saving = list(getattr(error, "steps", ())) or ([] if step is None else [step])
    checkpoints = getattr(trainer, "checkpoints", None)
    landed = [] if checkpoints is None else landed_steps(checkpoints.directory)
    text = "interrupted by Ctrl-C"
    if saving:
        lost = [s for s in saving if s not in landed]
        if len(saving) == 1:
            what = f"the checkpoint of step {saving[0]} was being saved"
            fate = "it did not land and is discarded at the next start" if lost else "it landed"
        else:
            what = f"the checkpoints of steps {' and '.join(map(str, saving))} were being saved"
            fate = (
                "neither landed; both are discarded at the next start"
                if len(lost) == len(saving)
                else f"{' and '.join(str(s) for s in saving if s in landed)} landed, "
                f"{' and '.join(map(str, lost))} did not and is discarded at the next start"
            )
        text += f" while {what} ({fate})"
    if checkpoints is None:
        return text + ": nothing was saved"
    if not landed:
        return text + f": no checkpoint is saved in {checkpoints.directory}; a restart begins at step 0"
    return (
        text + f": the newest saved checkpoint is step {landed[-1]} in {checkpoints.path(landed[-1])}; "
        f"resume from it with: {resume_command(argv)}"
    )


def run() -> None:
    with_kept_heap()  # restarts this process once with glibc's malloc tunables (dew.runtime.cpu.memory)
    code = main()
    if code in (0, 128 + signal.SIGTERM):  # every process of a run ends here alike: leave in step
        from dew.runtime.heartbeats import stop_processes

        stop_processes()
    from dew.runtime.heartbeats import watching

    if code not in (0, 2) or watching():  # in a group: leave it without JAX's shutdown barrier
        end_process(code)  # reported, everything dew opened is closed: nothing may print after
    sys.exit(code)


if __name__ == "__main__":
    run()

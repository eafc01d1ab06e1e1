"""``python -m dew.main --config=experiments/edm.py --workdir=runs/edm [--config.key=value ...]``

Trains, evaluates, previews and checkpoints under ``--workdir``; run it again to resume from the
latest checkpoint. Bad input (unknown key, wrong type, unknown registry name, a data set that
cannot be opened, a workdir that is a file) stops before anything is written: one line naming
what is wrong, exit status 2. ``--help-config`` prints the resolved schema (every key with its
value, default, kind and doc) and exits.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence

from dew.config import ConfigError, apply_overrides, load_config
from dew.registry import UnknownNameError


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
    args, rest = parser.parse_known_args(argv)
    overrides = []
    for item in rest:
        if not item.startswith("--config."):
            parser.error(f"unrecognised argument {item!r} (config keys are set with --config.<key>=<value>)")
        overrides.append(item[2:])
    if args.workdir is None and not args.help_config:
        parser.error("the following arguments are required: --workdir")
    return args, overrides


def enable_compilation_cache(workdir: str) -> None:
    """Reuse compiled programs across runs (compiles dominate on CPU). ``JAX_COMPILATION_CACHE_DIR``
    wins; otherwise the cache lives in the run's own directory."""
    import jax

    directory = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(workdir, "cache", "jax")
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args, overrides = parse_args(argv)
    try:
        raw = load_config(args.config)
        if args.help_config:
            from dew.schema import describe, resolve
            from dew.training.trainer import config_schema

            config, schema = resolve(config_schema(), raw, overrides)
            print(f"# {args.config}: every key, as resolved (value, default if different, kind, doc)")
            print(describe(schema, config), end="")
            return 0
        config = apply_overrides(raw, overrides)
        from dew.training.trainer import Trainer, check_workdir

        workdir = check_workdir(args.workdir)
        trainer = Trainer(config, workdir)
    except (ConfigError, UnknownNameError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    import jax

    from dew.training.preemption import Preempted
    from dew.training.workdir_lock import WorkdirBusyError, WorkdirLock, describe_stale

    try:  # one run per workdir (process 0 holds it for the whole run)
        lock = WorkdirLock(workdir).acquire() if jax.process_index() == 0 else None
    except WorkdirBusyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if lock is not None and lock.stale:
        print(f"dew: {describe_stale(lock.stale)}", flush=True)
    enable_compilation_cache(workdir)
    print(f"dew: training {args.config} in {workdir}", flush=True)
    try:
        state = trainer.run()
    except Preempted as e:
        command = " ".join(shlex.quote(a) for a in ["python", "-m", "dew.main", *argv])
        print(f"dew: {e}", file=sys.stderr, flush=True)
        if e.path is not None:
            print(f"dew: resume with: {command}", file=sys.stderr, flush=True)
        return e.exit_code
    finally:
        if lock is not None:
            lock.release()
    previews = os.path.join(workdir, "previews")
    where = trainer.checkpoints.directory if trainer.checkpoints else "none (checkpointing off)"
    print(
        f"done at step {int(state.step)}: checkpoints in {where}"
        + (f", previews in {previews}" if trainer.config.preview.every else ""),
        flush=True,
    )
    return 0


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()

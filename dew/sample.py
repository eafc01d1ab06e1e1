"""``python -m dew.sample --workdir=RUN [--out=DIR] [--step=N] [--raw] [--OPTION=VALUE ...]``:
draw from a trained run and write the artifact as files.

Loads ``dew.pipeline(RUN)`` (the debiased EMA of the latest checkpoint, or ``--step``; ``--raw``
for the live weights), calls the task with the options given (each ``--name=value``, the value
read as a Python literal where it is one, e.g. ``--seed=3 --guidance=2.0
--guidance_interval=(0.3,5.0) --prompts=("a seven","a two")``, else as a string), and writes
the artifact under ``--out`` (default ``RUN/samples``) in the local tracker's layout
(``images/sample_<step>.png``, ``videos/...gif``, ``text/...txt`` + ``.html``,
``representations/...png`` + ``.npz``). ``--guide=WORKDIR`` guides with a second run's network (autoguidance,
``D = D_guide + w (D − D_guide)`` with ``w`` = ``--guidance``, inside ``--guidance_interval``; the
guide's debiased EMA of its latest checkpoint, or its live weights with ``--raw``); its samples
and conditioning must be the main run's. ``--list`` prints the options the task takes and their
defaults; ``--help`` prints this text. Bad input (not a run, no such step, an option the task
does not take, a bad value): one line on stderr, exit status 2, nothing written.
"""

from __future__ import annotations

import ast
import os
import sys


def parse(argv: list[str]) -> tuple[dict[str, object], dict[str, object], dict[str, str]]:
    """(flags: workdir/out/step/raw/list, task options, each option's argument as typed) from
    ``--name=value`` arguments."""
    flags: dict[str, object] = {
        "workdir": None,
        "out": None,
        "step": None,
        "raw": False,
        "list": False,
        "guide": None,
    }
    options: dict[str, object] = {}
    texts: dict[str, str] = {}  # each option as typed, for the error that names it
    for arg in argv:
        if not arg.startswith("--"):
            raise ValueError(f"dew.sample: unexpected argument {arg!r}; expected --name=value")
        name, has_value, text = arg[2:].partition("=")
        if name in ("raw", "list") and not has_value:
            flags[name] = True
            continue
        if not has_value or not name:
            raise ValueError(f"dew.sample: {arg!r} has no value; expected --{name or 'name'}=value")
        try:
            value: object = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        if name in flags:
            flags[name] = value if name not in ("workdir", "out", "guide") else text
        else:
            options[name.replace("-", "_")] = value
            texts[name.replace("-", "_")] = arg
    if not flags["workdir"]:
        raise ValueError("dew.sample: --workdir=RUN is required (a dew run's workdir)")
    return flags, options, texts


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        print((__doc__ or "").strip())
        return 0
    try:
        flags, options, texts = parse(argv)
        from dew.runtime.platform import start

        # before JAX starts: convolution library, kernels, as dew.main; sampling is one process
        start(present_devices=False, detect_processes=False)
        from dew.inference import pipeline

        guide = str(flags["guide"]) if flags["guide"] else None
        step = flags["step"]
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise ValueError(f"dew.sample: --step={texts.get('step', step)!r} is invalid: expected an int")
        task = pipeline(str(flags["workdir"]), step=step, raw=bool(flags["raw"]), guide=guide)
        if flags["list"]:
            for name, default in task.options.items():
                print(f"--{name}={default!r}")
            return 0
        for name, value in options.items():  # named as typed: the flag and what it accepts
            expected = task.mistyped(name, value) if name in task.options else None
            if expected is not None:
                typed = texts[name]
                default = task.options[name]
                raise ValueError(
                    f"dew.sample: {typed} is invalid: expected {expected}, e.g. --{name}={default!r}"
                )
        artifact = task(**options)
    except ValueError as e:  # PipelineError, ConfigError and bad values are all ValueErrors
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    from dew.tracking.media import artifact_files, write_atomically

    out = str(flags["out"] or os.path.join(task.workdir, "samples"))
    for folder, name, data in artifact_files(f"sample_{task.step:08d}", artifact):
        print(write_atomically(os.path.join(out, folder, name), data))
    return 0


def run() -> None:
    code = main()
    if code:  # the one-line error is printed: no orbax teardown may print after it
        from dew.failures import end_process

        end_process(code)
    sys.exit(code)


if __name__ == "__main__":
    run()

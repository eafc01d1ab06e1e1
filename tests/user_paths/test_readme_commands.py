"""The paths a newcomer takes, in the environment a newcomer has: the README's commands (train,
sample, ``dew.pipeline``, a custom loop, resume) run as written, at a tiny size, in child
processes with a CLEAN environment: no ``XLA_FLAGS``, no ``DEW_*`` variables, a fresh home and
cache directory (only ``PATH`` and ``PYTHONPATH`` are kept, so this checkout's dew is the one
run). The rest of the suite forces ``XLA_FLAGS`` and
``DEW_CACHE_DIR=off`` (tests/conftest.py); here nothing is forced, so the kernel choice
(``dew.runtime.cpu.choice``) decides as on a newcomer's machine, in the fresh home.

One module fixture trains the run the other tests read; each test states what a user would see.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: The README's training command at a tiny size: a one-level U-Net of 8 channels (a handful of
#: convolution shape classes to time), batch 16 over the CPU devices dew presents, 4 steps.
TINY = {
    "dataset.batch_size": 16,
    "model.model_channels": 8,
    "model.num_blocks": 1,
    "model.channel_mult": "(1,)",
    "model.attn_resolutions": "()",
    "train.num_steps": 4,
    "train.log_every": 2,
    "checkpoint.every": 4,
    "eval.every": 0,
    "preview.every": 0,
    "objective.sampling.steps": 2,
    "objective.sampling.per_class": 1,
}
TIMEOUT = 600


def clean_env(home: pathlib.Path) -> dict[str, str]:
    """A newcomer's environment: PATH, this checkout on PYTHONPATH, a fresh HOME (so a fresh
    ``~/.cache/dew``), nothing else (no XLA_FLAGS, no DEW_*, no JAX_* variables)."""
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "HOME": str(home)}


def run(args: list[str], home: pathlib.Path, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, *args],
        env=clean_env(home),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    return done


def train(workdir: pathlib.Path, home: pathlib.Path, config: str = "experiments/edm.py", **overrides):
    values = {**TINY, **overrides}
    return run(
        [
            "-m",
            "dew.main",
            f"--config={config}",
            f"--workdir={workdir}",
            *(f"--config.{k}={v}" for k, v in values.items()),
        ],
        home,
    )


def kernel_line(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("dew: kernel choice:")]
    assert len(lines) == 1, stdout
    return lines[0]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, home) -> tuple[pathlib.Path, subprocess.CompletedProcess]:
    """``python -m dew.main --config=experiments/edm.py --workdir=...`` on a machine that has
    never run dew: the kernels are chosen, the run trains and checkpoints."""
    workdir = tmp_path_factory.mktemp("runs") / "edm"
    done = train(workdir, home)
    assert done.returncode == 0, done.stdout + done.stderr
    return workdir, done


def test_training_chooses_the_u_nets_kernels_by_the_rule_without_timing(trained, home):
    """The U-Net's convolutions are not timed: no measurement child, no kernel cache file; the
    run's line names the rule and run.json records the decision."""
    workdir, done = trained
    assert "timing" not in done.stdout and "(CPU-flag rule)" in kernel_line(done.stdout)
    assert not (home / ".cache" / "dew" / "kernel_choice.json").exists()
    assert not (workdir / "cache" / "kernel_choice.json").exists()
    assert json.loads((workdir / "run.json").read_text())["kernels"]["how"].startswith("CPU-flag rule")


def test_sample_the_run_as_the_readme_says(trained, home):
    """The README's next command; it crashed (KeyError 'XLA_FLAGS') without XLA_FLAGS."""
    workdir, _ = trained
    listed = run(["-m", "dew.sample", f"--workdir={workdir}", "--list"], home)
    assert listed.returncode == 0, listed.stderr
    assert "--per_class=" in listed.stdout
    drawn = run(["-m", "dew.sample", f"--workdir={workdir}", "--per_class=1", "--steps=2"], home)
    assert drawn.returncode == 0, drawn.stderr
    (path,) = drawn.stdout.split()
    assert path.endswith(".png") and os.path.getsize(path) > 0
    missing = run(["-m", "dew.sample", f"--workdir={workdir}-missing", "--list"], home)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr


def test_the_pipeline_in_a_script(trained, home):
    workdir, _ = trained
    script = f"""
        import dew
        task = dew.pipeline({str(workdir)!r})
        grid = task(per_class=1, steps=2)
        print(grid.images.shape)
    """
    done = run(["-c", textwrap.dedent(script)], home)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("(10,")


def test_resume_and_a_new_workdir_measure_nothing(trained, home, tmp_path):
    workdir, _ = trained
    resumed = train(workdir, home, config="experiments/edm.py", **{"train.num_steps": 6})
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "timing" not in resumed.stdout and "recorded with the run's checkpoints" in kernel_line(
        resumed.stdout
    )
    assert "done at step 6" in resumed.stdout
    fresh = train(
        tmp_path / "other", home, config="experiments/edm.py", **{"train.num_steps": 1, "checkpoint.every": 0}
    )
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert "timing" not in fresh.stdout and kernel_line(fresh.stdout).endswith("(CPU-flag rule)")


def test_a_data_set_registered_in_the_experiment_file(home, tmp_path):
    """The registry is the extension point: a data set the experiment file registers is known
    to the run that the file configures."""
    experiment = tmp_path / "my_experiment.py"
    experiment.write_text(
        textwrap.dedent(
            f"""
            import runpy
            from dew import registry
            from dew.data.sources.digits import digits

            registry.datasets.register("my_digits", digits)


            def get_config():
                config = runpy.run_path({str(ROOT / "experiments" / "edm.py")!r})["get_config"]()
                config.dataset.name = "my_digits"
                return config
            """
        )
    )
    done = train(tmp_path / "run", home, config=str(experiment), **{"train.num_steps": 1})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "unknown" not in done.stderr


@pytest.mark.parametrize(
    "override",
    [
        {"dataset.batch_size": 4096},  # larger than the data
        {"eval.batch_size": 4096, "eval.every": 2},  # larger than the validation split
        {"mesh.devices": 3},  # more devices than the run has
    ],
    ids=["batch-larger-than-data", "eval-batch", "mesh"],
)
def test_bad_input_on_a_new_machine_is_one_line_and_exit_2(tmp_path, override):
    """A config the run refuses gives one line and exit 2 on a machine that has never run dew,
    and nothing is written for it: no workdir, no machine folder."""
    home = tmp_path / "home"
    done = train(tmp_path / "run", home, **override)
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "run").exists() and not (home / ".cache" / "dew").exists()


def test_an_unwritable_workdir_is_one_line_and_exit_2(tmp_path):
    done = train(pathlib.Path("/proc/dew-cannot-be-here"), tmp_path / "home")
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "/proc/dew-cannot-be-here" in errors[0], done.stderr


def test_a_custom_loop_gets_the_platform_choices_of_the_cli(home, tmp_path):
    """``Trainer(config, workdir)`` in a user's script, with no ``dew.runtime.start``: one CPU
    device per core (as many as the batch divides), the kernel choice and its line, as
    ``python -m dew.main`` makes them; and ``dew.runtime.start(config)`` without a workdir in a
    fresh home takes the same rule."""
    overrides = [f"config.{k}={v}" for k, v in TINY.items()]
    script = f"""
        import os
        from dew.config import load_config
        from dew.runtime.cpu import setup
        from dew.training.trainer import Trainer
        from dew.training.trainer_config import resolve_config

        config = resolve_config(load_config("experiments/edm.py"), {overrides!r})
        trainer = Trainer(config, {str(tmp_path / "loop")!r})
        import jax

        cores = len(os.sched_getaffinity(0))
        expected = max(n for n in range(1, cores + 1) if 16 % n == 0)
        assert jax.device_count() == expected, (jax.device_count(), expected)
        assert setup.applied_record() is not None
        state = trainer.programs.init(jax.random.PRNGKey(0), trainer.example_batch())
        print("devices", jax.device_count())
    """
    done = run(["-c", textwrap.dedent(script)], home)
    assert done.returncode == 0, done.stdout + done.stderr
    assert kernel_line(done.stdout) and "devices" in done.stdout
    started = f"""
        from dew.config import load_config
        from dew.runtime import start
        from dew.training.trainer_config import resolve_config

        config = resolve_config(load_config("experiments/edm.py"), {overrides!r})
        platform = start(config)
        print(platform.decision.line())
    """
    fresh = run(["-c", textwrap.dedent(started)], tmp_path / "fresh-home")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert fresh.stdout.strip().splitlines()[-1].endswith("(CPU-flag rule)")

"""The README's "Using the pieces in your own loop" runs as written: its code block, taken from
the README itself, in a fresh process (the Trainer, built before JAX starts, applies
``dew.runtime.start`` itself: the devices and kernel choice below are its), with only the network
shrunk and the loop shortened."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

TINY = [
    "config.dataset.batch_size=16",
    "config.model.model_channels=8",
    "config.model.num_blocks=1",
    "config.model.channel_mult=(1,)",
    "config.model.attn_resolutions=()",
    "config.train.num_steps=3",
    "config.eval.every=0",
    "config.preview.every=0",
]


def readme_loop() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Using the pieces in your own loop") :]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "the README's loop section holds no python block"
    return block.group(1)


def test_the_readme_loop_runs_as_written(tmp_path):
    code = readme_loop()
    assert 'resolve_config(load_config("experiments/edm.py"))' in code and "range(100)" in code
    code = code.replace(
        'resolve_config(load_config("experiments/edm.py"))',
        f'resolve_config(load_config("experiments/edm.py"), {TINY!r})',
    ).replace("range(100)", "range(3)")
    code = code.replace('"runs/mine"', repr(str(tmp_path / "mine")))
    check = (
        "\nimport jax\nimport dew.kernels\n"
        "print(json.dumps({'step': int(state.step), 'saved': trainer.checkpoints.latest_step(),"
        " 'devices': len(jax.devices()), 'kernels': dew.kernels.current().reason}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)  # start() decides the devices, as it does for a user
    run = subprocess.run(
        [sys.executable, "-c", "import json\n" + code + check],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["step"] == 3 and result["saved"] == 3
    # start() presented one CPU device per core (as far as the batch of 16 divides).
    from dew.runtime.cpu.devices import cpu_cores, host_device_count

    assert result["devices"] == host_device_count(0, [16], cpu_cores())
    assert result["kernels"] != "XLA's kernels (no platform choice made)"  # start() made the choice

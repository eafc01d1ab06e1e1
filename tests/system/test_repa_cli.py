"""REPA through the command line: bad REPA settings stop ``python -m dew.main`` in one line."""

from __future__ import annotations

from helpers_common import ROOT


def test_the_cli_refuses_an_encoder_depth_beyond_the_network_in_one_line(tmp_path):
    """``python -m dew.main`` exits 2 with one line naming the field, nothing written."""
    import os
    import subprocess
    import sys

    workdir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dew.main",
            f"--config={ROOT / 'experiments' / 'repa.py'}:digits",
            f"--workdir={workdir}",
            "--config.objective.repa.encoder_depth=9",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "config.objective.repa.encoder_depth=9 is beyond the network: expected 1..4" in lines[0]
    assert not workdir.exists()

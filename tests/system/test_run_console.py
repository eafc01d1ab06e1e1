"""What a person watching a run sees: clu's parameter table once at the start (and kept in the
run directory), and one console line per evaluation, per preview and per new best checkpoint,
with the values the run's scalars.jsonl records."""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers_common import tiny_config

from dew.tracking.console import Progress, _format
from dew.training.parameter_table import PARAMETERS_FILE, parameter_table, report_parameters
from dew.training.trainer import Trainer


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A 6-step run (evaluation, preview and checkpoint every 3 steps) and what it printed."""
    workdir = str(tmp_path_factory.mktemp("console") / "run")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        state = Trainer(tiny_config(), workdir).run()
    rows = [
        json.loads(line)
        for line in pathlib.Path(workdir, "tracking", "scalars.jsonl").read_text().splitlines()
    ]
    return workdir, state, out.getvalue().splitlines(), rows


def _total(table: str) -> tuple[int, int]:
    total = re.fullmatch(r"Total: ([\d,]+) -- ([\d,]+) bytes", table.splitlines()[-1])
    assert total is not None, table
    count, size = total.groups()
    return int(count.replace(",", "")), int(size.replace(",", ""))


def test_a_run_prints_and_keeps_the_parameter_table(tiny_run):
    workdir, state, printed, _ = tiny_run
    table = pathlib.Path(workdir, PARAMETERS_FILE).read_text().rstrip("\n")
    leaves = jax.tree.leaves(state.params)
    assert _total(table) == (sum(x.size for x in leaves), sum(x.nbytes for x in leaves))
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| Name")]
    assert len(rows) == len(leaves)
    # Each parameter by its path, with its shape and count (haiku's module/name).
    flat = {
        f"{module}/{name}": value for module, names in state.params.items() for name, value in names.items()
    }
    for row in rows:
        name, shape, dtype, size = (cell.strip() for cell in row.strip("|").split("|"))
        assert shape == str(flat[name].shape) and dtype == str(flat[name].dtype)
        assert int(size.replace(",", "")) == flat[name].size
    # Printed once: its first rows, then (it is longer than the console's share) the total
    # and where the whole table is.
    lines = table.splitlines()
    assert printed.count(lines[-1]) == 1
    start = printed.index(lines[0])
    cut = printed.index("[...]", start)
    assert printed[start:cut] == lines[: cut - start] and cut - start > 3
    total = printed.index(lines[-1])
    assert printed[total + 1] == f"(every parameter: {os.path.join(workdir, PARAMETERS_FILE)})"


def test_a_long_table_is_cut_on_the_console_and_kept_whole_in_the_file(tmp_path):
    params = {f"layer{i:02d}": {"w": jax.ShapeDtypeStruct((i + 1, 3), np.float32)} for i in range(30)}
    out = io.StringIO()
    path = report_parameters(params, str(tmp_path), stream=out, console_lines=12)
    whole = pathlib.Path(path).read_text().rstrip("\n")
    assert _total(whole) == (sum(3 * (i + 1) for i in range(30)), 4 * sum(3 * (i + 1) for i in range(30)))
    assert len(whole.splitlines()) == 30 + 5  # rule, header, rule, 30 rows, rule, total
    shown = out.getvalue().splitlines()
    assert "[...]" in shown and len(shown) <= 12 + 3
    assert shown[-2] == whole.splitlines()[-1] and shown[-1] == f"(every parameter: {path})"


def test_any_pytree_of_parameters_is_named_by_its_path():
    Pair = collections.namedtuple("Pair", "a b")
    table = parameter_table({"m": [np.zeros((2, 3), np.float32), Pair(np.zeros(4, np.int8), np.zeros(()))]})
    names = [line.split("|")[1].strip() for line in table.splitlines()[3:-2]]
    assert names == ["m/0", "m/1/a", "m/1/b"]
    assert _total(table) == (6 + 4 + 1, 24 + 4 + 8)


def test_the_console_shows_each_evaluation_preview_and_best_checkpoint(tiny_run):
    workdir, _, printed, rows = tiny_run
    evals = [r for r in rows if r["category"] == "eval"]
    losses = [r for r in evals if "loss" in r]  # the evaluation's rows (the preview's are scores)
    scores = [r for r in evals if "digits_class_accuracy" in r]
    best = [r for r in rows if r["category"] == "best_model"]
    assert [r["step"] for r in losses] == [3, 6] and [r["step"] for r in scores] == [3, 6] and best

    def values(row: dict, *names: str) -> str:
        return "  ".join(f"{k} {_format(row[k])}" for k in sorted(names))

    for r in losses:
        names = [k for k in r if k not in ("category", "step", "time", "wall_time")]
        assert f"step {r['step']}/6  eval  {values(r, *names)}" in printed
    for r in scores:
        shown = os.path.join(workdir, "previews", f"samples_{r['step']:08d}.png")
        assert os.path.isfile(shown)
        assert f"step {r['step']}/6  preview  {values(r, 'digits_class_accuracy')}  {shown}" in printed
    for r in best:
        path = os.path.join(workdir, "checkpoints", str(r["step"]))
        assert f"step {r['step']}/6  best checkpoint  {values(r, 'eval_loss')}  {path}" in printed
    # One line per event, nothing more: as many event lines as rows.
    events = [line for line in printed if re.match(r"step \d+/6  (eval|preview|best checkpoint)  ", line)]
    assert len(events) == len(losses) + len(scores) + len(best)


def test_clu_loads_only_when_a_run_makes_its_table():
    code = (
        "import json, sys, dew, dew.training.trainer, dew.training.parameter_table as t, numpy as np\n"
        "before = sorted({m.split('.')[0] for m in sys.modules} & {'clu', 'flax'})\n"
        "t.parameter_table({'w': np.zeros(2)})\n"
        "print(json.dumps([before, sorted({m.split('.')[0] for m in sys.modules} & {'clu', 'flax'})]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == [[], ["clu", "flax"]]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_an_event_line_goes_above_the_progress_line_on_a_terminal():
    tty = Terminal()
    progress = Progress(100, batch_size=8, stream=tty)
    progress.update(10, 0.5)
    progress.update(20, 0.5)
    progress.report(20, "eval", {"loss": 0.123456, "n": 3}, note="a.png")
    progress.close()
    lines = [line.rsplit("\r", 1)[-1].rstrip() for line in tty.getvalue().split("\n")]
    assert lines[0] == "step 20/100  eval  loss 0.1235  n 3  a.png"
    assert lines[1].startswith("step 20/100  ") and "steps/s" in lines[1]  # redrawn under it
    assert lines[2] == ""  # close ended that line, and only that one

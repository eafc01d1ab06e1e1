"""The parameter table a run prints once at its start and keeps as ``<workdir>/parameters.txt``.

``clu.parameter_overview`` renders it: one row per parameter array (its path in the parameter
tree, shape, dtype and element count), then ``Total: <count> -- <bytes> bytes``. The table is
made from shapes and dtypes alone (abstract values do), so it costs no device work and no
transfer. clu pulls in flax: it is imported here, when a run asks for the table, never by
``import dew``.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, TextIO

import numpy as np

from dew.pytrees import leaf_path
from dew.tracking.media import write_atomically
from dew.training import typed_jax

#: The file under the run's directory that keeps the table.
PARAMETERS_FILE = "parameters.txt"

#: The most lines of the table a run prints (the file keeps every row).
CONSOLE_LINES = 40


def parameter_table(params: Any, max_lines: int | None = None) -> str:
    """``clu.parameter_overview``'s table of ``params`` (any pytree of arrays or
    ``jax.ShapeDtypeStruct``), rows sorted by path, ending ``Total: <count> -- <bytes> bytes``
    (the total of every row, also of rows ``max_lines`` leaves out as ``[...]``)."""
    from clu import parameter_overview

    leaves, _ = typed_jax.tree_flatten_with_path(params)
    named = {leaf_path(path): leaf for path, leaf in leaves}
    if len(named) != len(leaves):
        raise ValueError("parameter_table: two parameters have the same path name")
    table = parameter_overview.get_parameter_overview(named, include_stats=False, max_lines=max_lines)
    # clu sums np.prod(shape), a float for a 0-d parameter ("Total: 11.0 -- 36.0 bytes"): the
    # same line, counted in integers.
    count = sum(math.prod(leaf.shape) for leaf in named.values())
    size = sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for leaf in named.values())
    rows, total = table.rsplit("\n", 1)
    if not total.startswith("Total: "):
        raise RuntimeError(f"parameter_table: clu's table ends {total!r}, not with its total")
    return f"{rows}\nTotal: {count:,} -- {size:,} bytes"


def report_parameters(
    params: Any, workdir: str, stream: TextIO | None = None, console_lines: int = CONSOLE_LINES
) -> str:
    """Write ``parameter_table(params)`` to ``<workdir>/parameters.txt`` (atomically, replacing
    an earlier start's) and print it to ``stream`` (stdout): whole when it has at most
    ``console_lines`` lines, else its first rows, ``[...]``, the total and the file's path.
    Returns the path."""
    table = parameter_table(params)
    path = write_atomically(os.path.join(workdir, PARAMETERS_FILE), (table + "\n").encode())
    shown = table
    if len(table.splitlines()) > console_lines:
        shown = f"{parameter_table(params, max_lines=console_lines)}\n(every parameter: {path})"
    print(shown, file=stream or sys.stdout, flush=True)
    return path


__all__ = ["CONSOLE_LINES", "PARAMETERS_FILE", "parameter_table", "report_parameters"]

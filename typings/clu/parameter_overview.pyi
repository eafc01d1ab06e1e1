# clu ships no stubs and no py.typed marker; this is the one function dew calls
# (dew.training.parameter_table), with the signature of clu's own annotations.
from collections.abc import Mapping
from typing import Any

def get_parameter_overview(
    params: Mapping[str, Any], *, include_stats: bool | str = ..., max_lines: int | None = ...
) -> str: ...

# chex ships no stubs and no py.typed marker. The names dew uses are re-exported from chex's own
# modules (their annotations are the library's); ``dataclass`` is declared a dataclass transform,
# which is what it is at runtime, so the checker knows a chex dataclass's fields and constructor.
# Every other name is Any.
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

from chex._src.asserts import assert_axis_dimension as assert_axis_dimension
from chex._src.asserts import assert_equal_shape as assert_equal_shape
from chex._src.asserts import assert_rank as assert_rank
from chex._src.asserts import assert_shape as assert_shape
from chex._src.asserts import (
    assert_trees_all_equal_shapes_and_dtypes as assert_trees_all_equal_shapes_and_dtypes,
)
from chex._src.asserts import assert_type as assert_type

_T = TypeVar("_T")

@overload
@dataclass_transform()
def dataclass(cls: type[_T], /) -> type[_T]: ...
@overload
@dataclass_transform()
def dataclass(
    *,
    init: bool = ...,
    repr: bool = ...,
    eq: bool = ...,
    order: bool = ...,
    unsafe_hash: bool = ...,
    frozen: bool = ...,
    kw_only: bool = ...,
    mappable_dataclass: bool = ...,
) -> Callable[[type[_T]], type[_T]]: ...
def __getattr__(name: str) -> Any: ...

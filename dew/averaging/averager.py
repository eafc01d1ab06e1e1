"""One interface for every average of the parameters a run keeps (EDM2's ``training/phema.py``:
``TraditionalEMA`` and ``PowerFunctionEMA`` share reset/update/get/state_dict).

An ``Averager`` is a pure description; its state is a pytree the caller threads:

    init(params) -> tree                 the average before any update
    update(tree, params, n) -> tree      after the n-th optimizer update (n >= 1); runs inside jit
    read(tree, n) -> [(params, name)]    the averaged parameters it offers after n updates
    record(params, accumulation) -> dict what a checkpoint's or run's record says about it (JSON)

and names where that tree lives: ``field`` (the ``TrainState`` field) and ``item`` (the
checkpoint item), and ``name`` (what records and ``read`` call it). Two implement it:
``ClassicEMA`` (zero-initialised, debiased when read; ``dew.averaging.ema``) and ``PowerEMA``
(EDM2's power-function profiles, no debiasing; ``dew.averaging.power_ema``). ``Averages`` is
the run's set of them, built once from ``config.ema``: what ``Programs`` (its ``init_program`` /
``step_program`` / ``eval_program``), the snapshot stage and the checkpoint layout take as one
argument; ``as_averages`` makes one from the older forms ``make_init`` / ``make_step`` /
``make_eval`` accept.

State and checkpoint layout (the one rule, ``FIELDS``): the classic EMA's tree is
``TrainState.ema`` / item ``ema_params`` (the raw EMA; its law, ``ema.law``, in
``TrainState.ema_law`` / ``extra["ema"]``), the power EMA's is ``TrainState.power_ema`` / item
``power_ema`` (a tuple, one tree per profile). These are the names checkpoints have always
used, so older checkpoints restore unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Protocol, runtime_checkable

import jax

from dew.averaging import ema as ema_lib
from dew.averaging.ema import EMASpec
from dew.averaging.power_ema import PowerEMA, power_ema_from_config

Params = Any


@runtime_checkable
class Averager(Protocol):
    """An average of the parameters: its state is a pytree that ``init`` makes and ``update``
    advances (pure, traceable); ``read`` gives the averaged parameters with a name each."""

    field: ClassVar[str]
    item: ClassVar[str]
    name: ClassVar[str]

    def init(self, params: Params) -> Any: ...

    # Positional-only (``/``): implementations name the tree for what it is (``slots``, ...).
    def update(self, tree: Any, params: Params, n: jax.Array | int, /) -> Any: ...

    def read(self, tree: Any, n: jax.Array | int, /) -> list[tuple[Params, str]]: ...

    def record(self, params: Params, accumulation: int = 1) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class ClassicEMA:
    """The classic EMA as an ``Averager``: zeros where tracked (the live leaf where not), ema_n =
    β_n ema_{n−1} + (1 − β_n) θ_n, read debiased (``ema.debias``). ``spec=None`` (an init made
    without an EMA) starts all-zero and records no law."""

    spec: EMASpec | None = None
    field: ClassVar[str] = "ema"
    item: ClassVar[str] = "ema_params"
    name: ClassVar[str] = "ema"

    @property
    def law_spec(self) -> EMASpec:
        if self.spec is None:
            raise ValueError("ClassicEMA: no EMASpec given; build it with one to update or read the EMA")
        return self.spec

    def init(self, params: Params) -> Params:
        return ema_lib.zeros_like(params, self.spec)

    def update(self, tree: Params, params: Params, n: jax.Array | int) -> Params:
        return ema_lib.update(tree, params, self.law_spec, n)

    def read(self, tree: Params, n: jax.Array | int) -> list[tuple[Params, str]]:
        return [(ema_lib.debias(tree, self.law_spec, n), self.name)]

    def record(self, params: Params, accumulation: int = 1) -> dict[str, Any]:
        return ema_lib.record(self.law_spec, params, accumulation)

    def law(self, params: Params, accumulation: int = 1) -> dict[str, jax.Array] | None:
        """The small arrays ``TrainState.ema_law`` / ``extra["ema"]`` hold (``ema.law``)."""
        return None if self.spec is None else ema_lib.law(self.spec, params, accumulation)


@dataclasses.dataclass(frozen=True)
class Averages:
    """The averages a run keeps: the classic EMA, always, and EDM2's power EMA when configured.

    Threads them through a ``TrainState`` by their ``field``s: ``init`` gives the fields of a
    fresh state, ``update`` / ``current`` those of a stepped / unchanged one (``state.replace(**...)``),
    ``read`` every averaged parameter tree with its name.
    """

    ema: ClassicEMA = dataclasses.field(default_factory=ClassicEMA)
    power: PowerEMA | None = None

    @property
    def members(self) -> tuple[Averager, ...]:
        return (self.ema,) if self.power is None else (self.ema, self.power)

    @property
    def spec(self) -> EMASpec | None:
        """The classic EMA's ``EMASpec``."""
        return self.ema.spec

    def init(self, params: Params, accumulation: int = 1) -> dict[str, Any]:
        fields = {a.field: a.init(params) for a in self.members}
        return {**fields, "ema_law": self.ema.law(params, accumulation)}

    def update(self, state: Any, params: Params, n: jax.Array | int) -> dict[str, Any]:
        return {a.field: a.update(getattr(state, a.field), params, n) for a in self.members}

    def current(self, state: Any) -> dict[str, Any]:
        return {a.field: getattr(state, a.field) for a in self.members}

    def read(self, state: Any, n: jax.Array | int) -> list[tuple[Params, str]]:
        return [pair for a in self.members for pair in a.read(getattr(state, a.field), n)]

    def evaluated(self, state: Any, n: jax.Array | int) -> Params:
        """The parameters evaluations, previews and exports use: the debiased classic EMA."""
        return self.ema.read(state.ema, n)[0][0]

    def record(self, params: Params, accumulation: int = 1) -> dict[str, Any]:
        return {a.name: a.record(params, accumulation) for a in self.members}

    @classmethod
    def from_config(cls, c: Any) -> Averages:
        """``config.ema`` of a resolved config (the power EMA's snapshot cadence falls back to
        ``config.checkpoint.every``)."""
        return cls(ClassicEMA(ema_lib.spec_from_config(c.ema)), power_ema_from_config(c))


def as_averages(ema: EMASpec | Averages | None, power_ema: PowerEMA | None = None) -> Averages:
    """``ema`` as ``Averages``: an ``EMASpec`` (or None) with an optional ``PowerEMA`` beside it."""
    if isinstance(ema, Averages):
        if power_ema is not None:
            raise ValueError("as_averages: give the PowerEMA inside Averages, not beside it")
        return ema
    return Averages(ClassicEMA(ema), power_ema)


#: Where each averager's tree lives: (TrainState field, checkpoint item). The law of the classic
#: EMA rides in ``extra["ema"]`` (``TrainState.ema_law``).
FIELDS = ((ClassicEMA.field, ClassicEMA.item), (PowerEMA.field, PowerEMA.item))
LAW_FIELD, LAW_EXTRA_KEY = "ema_law", "ema"

__all__ = ["FIELDS", "Averager", "Averages", "ClassicEMA", "as_averages"]

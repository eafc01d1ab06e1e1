"""The two tiers a step can be read from, and which one holds it.

The persistent tier (``store.Store``) holds every kept step and restores onto any mesh; the local
tier (``local``) holds one step per process, the shards its devices hold, and restores only onto
the placement it was written with. A step is read from the local tier when it is the local step
every process holds (and its placement fits), else from the persistent one. With several
processes ``local_step``, ``latest_step`` and the placement check are collectives.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from dew.checkpointing import layout, local
from dew.checkpointing.errors import CheckpointRestorationError
from dew.checkpointing.store import Store
from dew.contracts.state import TrainState
from dew.data.dataset import DataPartition


class Tiers:
    """Reads ``store`` and this process's local directory (None: no local tier); ``wait`` is
    called before anything is listed, so pending writes are seen."""

    def __init__(self, store: Store, local_directory: str | None, wait: Callable[[], None]):
        self.store, self.local_directory, self.wait = store, local_directory, wait

    @property
    def local_path(self) -> str:
        if self.local_directory is None:
            raise ValueError("Checkpoints: no local_directory was given")
        return os.path.join(self.local_directory, f"process_{jax.process_index()}")

    def all_steps(self) -> list[int]:
        self.wait()
        return self.store.steps()

    def local_step(self) -> int | None:
        if self.local_directory is None:
            return None
        self.wait()
        mine = local.latest_step(self.local_path)
        if jax.process_count() == 1:
            return mine
        steps = np.asarray(multihost_utils.process_allgather(np.int64(-1 if mine is None else mine))).ravel()
        return int(steps[0]) if steps[0] >= 0 and np.all(steps == steps[0]) else None

    def latest_step(self) -> int | None:
        candidates = [*self.all_steps()[-1:], self.local_step()]
        return max((s for s in candidates if s is not None), default=None)

    def is_local(self, step: int) -> bool:
        return self.local_directory is not None and self.local_step() == step

    def only_local(self, step: int) -> bool:
        return self.is_local(step) and step not in self.all_steps()

    def source(self, step: int) -> str:
        return (
            os.path.join(self.local_path, str(step))
            if self.is_local(step)
            else os.fspath(self.store.path(step))
        )

    def resolve(self, step: int | None) -> int:
        """``step`` checked to exist in a tier, or the latest; ``CheckpointRestorationError`` names
        what is stored otherwise."""
        if step is None:
            latest = self.latest_step()
            if latest is None:
                where = os.fspath(self.store.directory) + (
                    f" or {self.local_path}" if self.local_directory else ""
                )
                raise CheckpointRestorationError(f"no checkpoint in {where}")
            return latest
        step = layout.step_number(step)
        if step not in self.all_steps() and not self.is_local(step):
            raise CheckpointRestorationError(
                f"no checkpoint for step {step} in {os.fspath(self.store.directory)}; stored steps are "
                f"{self.all_steps()}" + (f", local step {self.local_step()}" if self.local_directory else "")
            )
        return step

    def stored(self, step: int) -> TrainState:
        if self.only_local(step):
            return local.stored(local.read_meta(self.local_path, step))
        return self.store.stored(step)

    def restore(
        self, template: TrainState | None, step: int, share: DataPartition | None, read_opt_state: bool
    ) -> tuple[TrainState, bytes | None]:
        template = self._fit_loss_scale(self._fit_law(template, step), step)
        if self.is_local(step):
            meta = local.read_meta(self.local_path, step)
            problem = local.placement_problem(meta, template)
            if _everywhere(problem is None):  # processes must agree, or their reads would diverge
                state, position = local.restore(self.local_path, step, meta, template, share)
                where = f"local checkpoint step {step} in {self.local_path}"
                return layout.typed_rng(state, template, meta.get("rng_impl"), where), position
            if step not in self.all_steps():
                raise CheckpointRestorationError(
                    f"checkpoint step {step} is only in the local directories ({self.local_path}) and "
                    "cannot be restored onto this placement: "
                    f"{problem or 'another process placement differs from the one it wrote'}"
                )
        recorded = self.store.files(step).custom().get("rng_impl")
        where = f"checkpoint step {step} in {os.fspath(self.store.directory)}"
        layout.check_key(template, recorded, where)
        state, position = self.store.restore(step, template, share, read_opt_state)
        return layout.typed_rng(state, template, recorded, where), position

    def _fit_law(self, template: TrainState | None, step: int) -> TrainState | None:
        """``template`` whose ``ema_law`` fits what ``step`` stores: unset when the step stores
        no law (written before states carried one), else the stored law's shapes (placed like
        the template's step count) unless the template already names the same leaves. The law
        comes back as it was saved; a caller running with another one replaces it."""
        if template is None:
            return None
        stored = self.stored(step).ema_law if self.only_local(step) else self.store.stored_extra(step, "ema")
        if stored is None:
            return template.replace(ema_law=None)
        same = template.ema_law is not None and jax.tree.structure(template.ema_law) == jax.tree.structure(
            stored
        )
        if same and all(
            tuple(a.shape) == tuple(b.shape)
            for a, b in zip(jax.tree.leaves(template.ema_law), jax.tree.leaves(stored), strict=True)
        ):
            return template
        sharding = getattr(template.step, "sharding", None)
        return template.replace(
            ema_law=jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), stored)
        )

    def _fit_loss_scale(self, template: TrainState | None, step: int) -> TrainState | None:
        """``template`` whose dynamic loss-scale state is what ``step`` stores (its shapes, placed
        like the step count; unset when it stores none), so a run resumed under another precision
        policy reads the checkpoint as written; the caller creates or drops the state."""
        if template is None:
            return None
        if self.only_local(step):
            stored = self.stored(step).loss_scale
        else:
            stored = self.store.stored_extra(step, "loss_scale")
        if stored is None:
            return template.replace(loss_scale=None)
        sharding = getattr(template.step, "sharding", None)
        return template.replace(
            loss_scale=jax.tree.map(
                lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), stored
            )
        )

    def ema_record(self, step: int) -> dict[str, Any] | None:
        """The EMA record kept with ``step`` (None: written without one)."""
        if self.only_local(step):
            return local.read_meta(self.local_path, step).get("ema")
        return self.store.ema_record(step)

    def ema(self, template: Any, step: int) -> tuple[Any, int, Any]:
        """The raw EMA at ``step``, the step count and the EMA law ``extra`` stores (None when
        it stores none), reading only ``ema_params`` and ``extra`` from the persistent tier (a
        local-only step is read whole, as host arrays)."""
        if self.only_local(step):
            if template is not None:
                raise CheckpointRestorationError(
                    f"checkpoint step {step} is only local: restore_ema reads it with template=None, "
                    "or restore the full state onto its placement"
                )
            state, _ = self.restore(None, step, None, read_opt_state=True)
            return state.ema, int(np.asarray(state.step)), state.ema_law
        restored = self.store.read_items(step, {"ema_params": template, "extra": None})
        count = int(np.asarray(restored["extra"]["step"]))
        self.store.check_step(step, count)
        return restored["ema_params"], count, restored["extra"].get("ema")


def _everywhere(ok: bool) -> bool:
    """Whether ``ok`` holds on every process (a collective with several processes)."""
    if jax.process_count() == 1:
        return ok
    return bool(np.asarray(multihost_utils.process_allgather(np.int32(ok))).all())

"""A published network's weights as a dew run: the steps ``dew.convert_edm`` and ``dew.convert_dit`` share.

Each converter reads its own file format and maps the reference's keys to the configured
network's parameters; around that, both do the same: build the run's ``Trainer`` from the config
the weights belong to and read the network's parameter tree from it (``target``), then write the
run directory as a training run leaves it (``write_run``): the weights as both the parameters and
the (debiased) EMA of a ``TrainState`` at step ``step`` with a fresh optimizer state, saved
through ``Checkpoints`` under ``<workdir>/checkpoints`` with the data stream's start as its
position, and ``run.json`` beside it with a ``converted`` record. Their commands share
``command``: ``--config.<key>=<value>`` overrides, a workdir that holds no checkpoints yet, and
bad input as one ``error:`` line on stderr, exit status 2, nothing left written.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dew.config import ConfigError
from dew.registry import UnknownNameError

if TYPE_CHECKING:
    import jax

    from dew.training.trainer import Trainer


class ConversionError(ValueError):
    """Weights that cannot become the configured network's parameters; the message says why."""


@dataclasses.dataclass(frozen=True)
class Target:
    """The run the weights become: its ``trainer``, the ``key`` and example ``batch`` its state
    is initialised from, the shapes of its parameters (``template``: module -> leaf -> shape and
    dtype) and the one top-level module they all live under (``network``)."""

    trainer: Trainer
    key: jax.Array
    batch: Any
    template: Mapping[str, Mapping[str, Any]]
    network: str


def target(config: Any, workdir: str) -> Target:
    """The ``Target`` of the run ``config`` describes in ``workdir`` (nothing is written or
    initialised: the parameters' shapes are traced). ``ConversionError`` when the objective has
    parameters outside its network; ``ConfigError`` for a config the Trainer refuses."""
    import jax

    from dew.training.trainer import Trainer

    trainer = Trainer(config, workdir)
    key, batch = jax.random.PRNGKey(config.seed), trainer.example_batch()
    template = jax.eval_shape(trainer.programs.init, key, batch).params
    tops = {k.split("/")[0] for k in template}
    if len(tops) != 1:
        raise ConversionError(f"the configured objective has parameters outside the network: {sorted(tops)}")
    return Target(trainer, key, batch, template, next(iter(tops)))


def write_run(
    run: Target, config: Any, workdir: str, params: Mapping, step: int, converted: Mapping[str, Any]
) -> str:
    """Write ``params`` (``run.template``'s tree, already checked against it) as the run's
    checkpoint at ``step`` and ``run.json`` beside it (``converted``: its record of where the
    weights came from); returns the checkpoint directory."""
    import jax
    import jax.numpy as jnp

    from dew.checkpointing import Checkpoints
    from dew.run_records import save_run_metadata

    trainer = run.trainer
    params = jax.tree.map(jnp.asarray, params)
    fresh = trainer.programs.init(
        run.key, run.batch
    )  # only once the weights fit: optimizer state, rng, shardings
    params = jax.device_put(params, jax.tree.map(lambda a: a.sharding, fresh.params))
    # The EMA that debiases to exactly these weights after `step` updates (ema = θ (1 − Π β)).
    spec = trainer.averages.ema.law_spec
    assert spec is not None  # Averages.from_config always builds the classic EMA's EMASpec
    correction = 1.0 - spec.retained(jnp.float32(step // trainer.accumulation or 1))
    mask = spec.mask(params)
    ema = jax.tree.map(lambda p, tracked: p * correction if tracked else p, params, mask)
    state = fresh.replace(step=jnp.asarray(step, fresh.step.dtype), params=params, ema=ema)
    checkpoints = Checkpoints(
        os.path.join(workdir, "checkpoints"), asynchronous=False, ema=trainer.ema_record
    )
    # The data position of a fresh stream: nothing was consumed, so a run that resumes this
    # checkpoint in place reads its data from the first batch, as a new run would.
    data = trainer.train_data
    checkpoints.save(step, state, data.save_position(), share=data.share)
    checkpoints.wait()
    checkpoints.close()
    # run.json, as a training run leaves it: what dew.pipeline, python -m dew.sample and the
    # scoring scripts read to rebuild the objective; no start is recorded (nothing was trained).
    save_run_metadata(
        workdir,
        {
            "label": os.path.basename(os.path.abspath(workdir)),
            "config": config.to_dict(),
            "ema": trainer.ema_record,
            "converted": dict(converted),
        },
    )
    return checkpoints.directory


def command(workdir: str, rest: Sequence[str], write: Callable[[str, list[str]], str]) -> int:
    """A converter command's steps around ``write(workdir, overrides)``, which converts and
    returns the line printed on success: every argument of ``rest`` (what the command's parser
    left) must be a ``--config.<key>=<value>`` override (handed over as ``<key>=<value>``), and
    ``workdir`` (made absolute) must hold no checkpoints yet. A refusal, or a ``ConfigError``,
    ``UnknownNameError`` or ``ConversionError`` of ``write``, is one ``error:`` line on stderr and
    exit status 2, the workdir removed when ``write`` made it; success prints the line, returns 0."""
    bad = [item for item in rest if not item.startswith("--config.")]
    if bad:
        return _error(f"unrecognised argument {bad[0]!r} (config keys are set with --config.<key>=<value>)")
    workdir = os.path.abspath(workdir)
    held = os.path.join(workdir, "checkpoints")
    if os.path.isdir(held) and os.listdir(held):
        return _error(f"--workdir {workdir} already holds checkpoints; choose an empty directory")
    existed = os.path.exists(workdir)
    try:
        done = write(workdir, [item[2:] for item in rest])
    except (ConfigError, UnknownNameError, ConversionError) as e:
        if not existed and os.path.isdir(workdir):
            shutil.rmtree(workdir)
        return _error(str(e).splitlines()[0])
    print(done)
    return 0


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


__all__ = ["ConversionError", "Target", "command", "target", "write_run"]

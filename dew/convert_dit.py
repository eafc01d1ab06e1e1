"""Turn a published DiT / SiT checkpoint into a dew run that dew samples, scores and fine-tunes.

    python -m dew.convert_dit --checkpoint=DiT-XL-2-256x256.pt --config=experiments/dit.py:DiT-XL/2 \
        --workdir=runs/dit [--which=ema] [--step=1] [--config.dataset.path=...] [--config.*=...]
    python -m dew.convert_dit --checkpoint=SiT-XL-2-256x256.pt --config=experiments/sit.py:SiT-XL/2 \
        --workdir=runs/sit

``--checkpoint`` is what facebookresearch/DiT, willisma/SiT or sihyun-yu/REPA publish or save: a
plain ``state_dict`` (``DiT-XL-2-256x256.pt``) or ``train.py``'s ``{"model", "ema", "opt",
"args"}`` (``--which`` picks ``ema``, the default as their ``sample.py`` does, or ``model``), as
a ``.pt`` (read with ``torch.load(weights_only=True)``: the optional ``convert`` extra, PyTorch)
or an ``.npz`` of the same keys (``dew.interop.dit_checkpoint``; no PyTorch needed). ``--config``
is the dew experiment the weights belong to: its ``config.model`` names the network (the
registered ``DiT-XL/2`` …) and its data set the latent shape and classes; ``--config.*``
overrides apply last.

The weights become both the parameters and the (debiased) EMA of a ``TrainState`` at step
``--step`` with a fresh optimizer state, saved through ``Checkpoints`` under
``<workdir>/checkpoints`` with the data stream's start as its position, and ``run.json`` beside
it as a training run leaves it (its ``converted`` record names the file). Sample it with
``python -m dew.sample --workdir=<workdir>`` or ``dew.pipeline(<workdir>)``, score it with
``python -m dew.fid --workdir=<workdir>``, fine-tune it with ``python -m dew.main
--config=... --workdir=<workdir>`` (it resumes from ``--step``).

Exit status 2, with one line on stderr and nothing written, on a bad argument, an unreadable
file, a checkpoint of another network (a key, a shape or the ``pos_embed`` grid that the
configured network does not have: the key named), or a patch size that does not divide the
latent resolution.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Mapping, Sequence

import numpy as np

from dew.config import ConfigError, apply_overrides, load_config
from dew.registry import UnknownNameError


class ConversionError(ValueError):
    """Weights that cannot become the configured network's parameters; the message says why."""


def convert(
    state_dict: Mapping[str, np.ndarray],
    config,
    workdir: str,
    step: int = 1,
    source: str = "<in memory>",
) -> str:
    """Write ``state_dict`` (reference keys -> arrays) as a checkpoint of the run ``config``
    describes, and ``run.json`` beside it; returns the checkpoint directory. Raises
    ConversionError / ConfigError (checked before anything is written)."""
    import jax
    import jax.numpy as jnp

    from dew.checkpointing import Checkpoints, save_run_metadata
    from dew.interop import dit_checkpoint
    from dew.training.trainer import Trainer

    if not isinstance(step, int) or step < 1:
        raise ConversionError(f"--step={step!r} is invalid: expected an int >= 1 (the EMA's update count)")
    name = config.model.name
    trainer = Trainer(config, workdir)
    key, batch = jax.random.PRNGKey(config.seed), trainer.example_batch()
    template = jax.eval_shape(trainer.programs.init, key, batch).params
    tops = {k.split("/")[0] for k in template}
    if len(tops) != 1:
        raise ConversionError(f"the configured objective has parameters outside the network: {sorted(tops)}")
    sample = trainer.objective.input_spec.sample.shape
    options = {k: v for k, v in config.model.items() if k != "name"}
    try:
        converted = dit_checkpoint.convert(
            state_dict, name, options, input_size=int(sample[0]), top=next(iter(tops))
        )
    except dit_checkpoint.CheckpointError as e:
        raise ConversionError(str(e)) from None
    for module, leaves in template.items():
        for leaf, spec in leaves.items():
            got = converted.get(module, {}).get(leaf)
            if got is None or tuple(got.shape) != tuple(spec.shape):
                raise ConversionError(
                    f"{module}/{leaf}: the objective's network has {tuple(spec.shape)}, the checkpoint "
                    f"{None if got is None else tuple(got.shape)}"
                )
    params = jax.tree.map(jnp.asarray, {m: dict(converted[m]) for m in template})
    fresh = trainer.programs.init(key, batch)  # only once the weights fit: optimizer state, rng, shardings
    params = jax.device_put(params, jax.tree.map(lambda a: a.sharding, fresh.params))
    # The EMA that debiases to exactly these weights after `step` updates (ema = θ (1 − Π β)).
    spec = trainer.averages.ema.law_spec
    assert spec is not None  # the Trainer always builds the classic EMA
    correction = 1.0 - spec.retained(jnp.float32(step // trainer.accumulation or 1))
    mask = spec.mask(params)
    ema = jax.tree.map(lambda p, tracked: p * correction if tracked else p, params, mask)
    state = fresh.replace(step=jnp.asarray(step, fresh.step.dtype), params=params, ema=ema)
    checkpoints = Checkpoints(
        os.path.join(workdir, "checkpoints"), asynchronous=False, ema=trainer.ema_record
    )
    data = trainer.train_data  # a fresh stream's position: a resumed run reads from the first batch
    checkpoints.save(step, state, data.save_position(), share=data.share)
    checkpoints.wait()
    checkpoints.close()
    save_run_metadata(
        workdir,
        {
            "label": os.path.basename(os.path.abspath(workdir)),
            "config": config.to_dict(),
            "ema": trainer.ema_record,
            "converted": {"checkpoint": source, "architecture": name, "step": step},
        },
    )
    return checkpoints.directory


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dew.convert_dit", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--checkpoint", required=True, help="a DiT/SiT/REPA .pt or .npz (state dict or train.py's)"
    )
    parser.add_argument("--config", required=True, help="the dew experiment the weights belong to")
    parser.add_argument("--workdir", required=True, help="where the dew run is written")
    parser.add_argument("--which", default="ema", help="ema or model, from a train.py checkpoint")
    parser.add_argument("--step", type=int, default=1, help="the step number the checkpoint carries")
    try:
        args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:
        return int(e.code or 0) and 2
    bad = [item for item in rest if not item.startswith("--config.")]
    if bad:
        print(
            f"error: unrecognised argument {bad[0]!r} (config keys are set with --config.<key>=<value>)",
            file=sys.stderr,
        )
        return 2
    workdir = os.path.abspath(args.workdir)
    held = os.path.join(workdir, "checkpoints")
    if os.path.isdir(held) and os.listdir(held):
        print(
            f"error: --workdir {workdir} already holds checkpoints; choose an empty directory",
            file=sys.stderr,
        )
        return 2
    existed = os.path.exists(workdir)
    try:
        from dew.interop.dit_checkpoint import CheckpointError, read_checkpoint

        config = apply_overrides(load_config(args.config), [item[2:] for item in rest])
        try:
            state = read_checkpoint(args.checkpoint, args.which)  # a bad file fails before anything is built
        except CheckpointError as e:
            raise ConversionError(f"--checkpoint: {e}") from None
        directory = convert(state, config, workdir, args.step, os.path.abspath(args.checkpoint))
    except (ConfigError, UnknownNameError, ConversionError) as e:
        if not existed and os.path.isdir(workdir):
            shutil.rmtree(workdir)
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"converted {args.checkpoint} ({config.model.name}) -> {directory} (step {args.step})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Convert an NVlabs/edm network's weights into a dew checkpoint that dew can sample and fine-tune.

    python -m dew.convert_edm --pickle=network-snapshot-000000.pkl --workdir=runs/from_edm \
        [--config=experiments/edm.py] [--config.dataset.name=...] [--step=1]
    python -m dew.convert_edm --state_dict=net.npz --config=experiments/edm.py --workdir=runs/from_edm \
        [--config.model.model_channels=...] [--step=1]

``--pickle`` is a network pickle as NVlabs/edm writes and publishes them (``network-snapshot-*.pkl``,
``edm-*.pkl``), read by ``dew.interop.edm_pickle`` without running the code it embeds and
without PyTorch: its ``ema`` network's weights, and its constructor arguments, which set
``config.model`` and the objective's preset and conditioning (``dew.interop.edm_config``);
``--config`` (default: every key at its default) gives the rest, above all the data set, which
must have the network's image shape and classes; ``--config.*`` overrides apply last. The pickle's
own record (arguments, loss, augmentation pipe, ``dataset_kwargs``) goes into ``run.json``.

``--state_dict`` is the reference network's state dict: an ``.npz`` whose ``param/<key>``
arrays are the state dict (``third_party/edm/make_reference.py`` writes this form), or a
``.pt``/``.pth`` file saved with ``torch.save(net.state_dict(), path)`` (read with
``torch.load(weights_only=True)``; needs the optional ``convert`` extra, PyTorch); ``--config``
then names the network's arguments. Keys may carry ``EDMPrecond``'s ``model.`` prefix.

The config names the dew run the weights belong to (``config.model.name`` ``songunet`` or
``dhariwalunet`` with the same arguments as the reference network, and a dataset of the same
image shape and classes). The weights become both the parameters and the (debiased) EMA of a
``TrainState`` at step ``--step`` with a fresh optimizer state, saved through ``Checkpoints``
under ``<workdir>/checkpoints`` with the data stream's start as its position, and the run's
``run.json`` beside it as a training run leaves it. Sample it with ``python -m dew.sample
--workdir=<workdir>`` or ``dew.pipeline(<workdir>)`` (score digits with
``experiments/digits_accuracy.py --workdir=<workdir>``). Fine-tune it in place with ``python -m
dew.main --config=... --workdir=<workdir>`` (it resumes from ``--step``), or into a new workdir
with ``--config.checkpoint.restore_dir=<workdir>/checkpoints``; at a smaller learning rate than
the network was trained with, as a fresh Adam state moves every weight by about the learning rate
in its first steps.

Exit status 2, with one line on stderr and nothing written, on a bad argument, an unreadable
file, weights that do not fit the configured network (the first differing parameter named), a
pickle that asks for anything but tensors and EDM's modules (the global named), or one that holds
no EDM network dew can express.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

import numpy as np
from ml_collections import ConfigDict

from dew.config import ConfigError, apply_overrides, load_config
from dew.networks.edm_weights import ARCHITECTURES, convert_state_dict, load_npz_state_dict
from dew.registry import UnknownNameError


class ConversionError(ValueError):
    """Weights that cannot become the configured network's parameters; the message says why."""


def read_state_dict(path: str) -> dict[str, np.ndarray]:
    """The float32 arrays of an ``.npz`` export or a ``torch.save``'d state dict."""
    if not os.path.isfile(path):
        raise ConversionError(f"--state_dict: no file at {path!r}")
    if path.endswith(".npz"):
        from dew.npz import NotAnNpzError

        try:
            state = load_npz_state_dict(path, what="--state_dict")
        except NotAnNpzError as e:
            raise ConversionError(str(e)) from None
        if not state:
            raise ConversionError(f"--state_dict: {path} holds no 'param/<key>' arrays")
        return state
    if path.endswith((".pt", ".pth")):
        try:
            # torch is the optional 'convert' extra, not installed where the types are checked.
            import torch  # pyright: ignore[reportMissingImports]
        except ImportError as e:
            raise ConversionError(
                f"--state_dict: reading {path} needs PyTorch (the 'convert' extra), or export it to .npz"
            ) from e
        loaded = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(loaded, Mapping):
            raise ConversionError(f"--state_dict: {path} holds a {type(loaded).__name__}, not a state dict")
        return {k: v.detach().cpu().float().numpy() for k, v in loaded.items()}
    raise ConversionError(f"--state_dict: {path!r} must end in .npz, .pt or .pth")


def read_pickle(
    path: str, base: ConfigDict, overrides: Sequence[str] = ()
) -> tuple[ConfigDict, dict[str, np.ndarray], dict]:
    """(config, state dict, run.json record) of the NVlabs/edm network pickle at ``path``.

    The pickle's network sets ``config.model`` and the objective's preset and conditioning in
    ``base`` (a ConfigDict, changed in place), ``overrides`` (``a.b=value``) apply last, and the
    data set the result names must have the network's image shape and classes. Raises
    ConversionError (one line) for a missing, refused or unconvertible pickle."""

    from dew.interop.edm_config import UnsupportedNetwork, check_data, network_config
    from dew.interop.edm_pickle import NotAnEDMNetwork, PickleRefused, load_snapshot
    from dew.training.trainer import open_split

    if not os.path.isfile(path):
        raise ConversionError(f"--pickle: no file at {path!r}")
    try:
        snapshot = load_snapshot(path)
        network = network_config(snapshot)
        state_dict = snapshot.state_dict()
    except (PickleRefused, NotAnEDMNetwork, UnsupportedNetwork) as e:
        raise ConversionError(
            f"--pickle: {e}" if str(e).startswith(path) else f"--pickle: {path}: {e}"
        ) from None
    except (ValueError, TypeError, ArithmeticError) as e:  # a record of values no network has
        raise ConversionError(
            f"--pickle: {path}: the network's constructor arguments cannot be read "
            f"({type(e).__name__}: {str(e)[:200]})"
        ) from None
    with base.unlocked():
        base.model = ConfigDict(network.model)
        objective = base.get("objective")
        if objective is None or objective.get("name", "diffusion") != "diffusion":
            base.objective = ConfigDict(network.objective)
        else:
            for key, value in network.objective.items():
                objective[key] = value
    config = apply_overrides(base, overrides)
    try:
        check_data(open_split(config.dataset, "train"), network, config.dataset.name)
    except UnsupportedNetwork as e:
        raise ConversionError(f"--pickle: {e}") from None
    return config, state_dict, {"pickle": os.path.abspath(path), **network.details}


def fit_to_template(converted: dict, template: Mapping) -> dict:
    """``converted`` checked against the network's parameter tree (names and shapes)."""
    missing = sorted(set(template) - set(converted))
    extra = sorted(set(converted) - set(template))
    if missing or extra:
        raise ConversionError(
            "the state dict does not fit config.model: "
            + (f"no weights for {missing[:3]}{' ...' if len(missing) > 3 else ''}" if missing else "")
            + ("; " if missing and extra else "")
            + (
                f"weights for modules the network lacks {extra[:3]}{' ...' if len(extra) > 3 else ''}"
                if extra
                else ""
            )
        )
    for module, leaves in template.items():
        if set(leaves) != set(converted[module]):
            raise ConversionError(
                f"{module}: the network has {sorted(leaves)}, the weights {sorted(converted[module])}"
            )
        for name, spec in leaves.items():
            if tuple(spec.shape) != converted[module][name].shape:
                raise ConversionError(
                    f"{module}/{name}: the network's shape is {tuple(spec.shape)}, "
                    f"the converted weight's {converted[module][name].shape}"
                )
    return converted


def convert(
    state_dict: Mapping[str, np.ndarray],
    config,
    workdir: str,
    step: int = 1,
    source: str = "<in memory>",
    details: Mapping | None = None,
) -> str:
    """Write ``state_dict`` (reference keys -> arrays) as a checkpoint of the run ``config``
    describes, and ``run.json`` beside it (its config; ``source`` names where the weights came
    from, ``details`` is added to that record); returns the checkpoint directory. Raises
    ConversionError / ConfigError."""
    import jax
    import jax.numpy as jnp

    from dew.checkpointing import Checkpoints, save_run_metadata
    from dew.training.trainer import Trainer

    arch = config.model.name
    if arch not in ARCHITECTURES:
        raise ConversionError(
            f"config.model.name={arch!r} has no converter: expected one of {sorted(ARCHITECTURES)}"
        )
    if not isinstance(step, int) or step < 1:
        raise ConversionError(
            f"--step must be an int >= 1 (the EMA is debiased by its update count), got {step!r}"
        )
    trainer = Trainer(config, workdir)
    key, batch = jax.random.PRNGKey(config.seed), trainer.example_batch()
    template = jax.eval_shape(trainer.programs.init, key, batch).params
    tops = {key.split("/")[0] for key in template}
    if len(tops) != 1:
        raise ConversionError(f"the configured objective has parameters outside the network: {sorted(tops)}")
    filt = tuple(config.model.get("resample_filter", (1, 1)))
    try:
        converted = convert_state_dict(state_dict, arch, filt, top=tops.pop())
    except ValueError as e:
        raise ConversionError(str(e)) from e
    params = jax.tree.map(jnp.asarray, fit_to_template(converted, template))
    fresh = trainer.programs.init(key, batch)  # only once the weights fit: optimizer state, rng, shardings
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
            "converted": {"state_dict": source, "architecture": arch, "step": step, **(details or {})},
        },
    )
    return checkpoints.directory


def main(argv: Sequence[str] | None = None) -> int:
    assert __doc__ is not None  # the description is the module docstring
    parser = argparse.ArgumentParser(prog="python -m dew.convert_edm", description=__doc__.split("\n\n")[0])
    weights = parser.add_mutually_exclusive_group(required=True)
    weights.add_argument("--pickle", help="an NVlabs/edm network pickle (network-snapshot-*.pkl, edm-*.pkl)")
    weights.add_argument("--state_dict", help="the reference network's .npz export or .pt state dict")
    parser.add_argument(
        "--config", help="the dew experiment the weights belong to (with --pickle: the settings it leaves)"
    )
    parser.add_argument("--workdir", required=True, help="where the dew checkpoint is written")
    parser.add_argument("--step", type=int, default=1, help="the step number the checkpoint carries")
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    bad = [item for item in rest if not item.startswith("--config.")]
    if args.state_dict and not args.config:
        print(
            "error: --state_dict needs --config (the dew experiment the weights belong to)", file=sys.stderr
        )
        return 2
    if bad:
        print(
            f"error: unrecognised argument {bad[0]!r} (config keys are set with --config.<key>=<value>)",
            file=sys.stderr,
        )
        return 2
    workdir = os.path.abspath(args.workdir)
    if os.path.isdir(os.path.join(workdir, "checkpoints")) and os.listdir(
        os.path.join(workdir, "checkpoints")
    ):
        print(
            f"error: --workdir {workdir} already holds checkpoints; choose an empty directory",
            file=sys.stderr,
        )
        return 2
    existed = os.path.exists(workdir)
    try:
        overrides = [item[2:] for item in rest]
        if args.pickle:
            base = load_config(args.config) if args.config else ConfigDict()
            config, state_dict, details = read_pickle(args.pickle, base, overrides)
        else:
            config, details = apply_overrides(load_config(args.config), overrides), None
            state_dict = read_state_dict(args.state_dict)  # a bad file fails before anything is built
        source = os.path.abspath(args.pickle or args.state_dict)
        directory = convert(state_dict, config, workdir, args.step, source, details)
    except (ConfigError, UnknownNameError, ConversionError) as e:
        if not existed and os.path.isdir(workdir):
            import shutil

            shutil.rmtree(workdir)
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"converted {args.pickle or args.state_dict} ({config.model.name}) -> {directory} (step {args.step})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

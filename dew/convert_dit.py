"""Turn a published DiT / SiT checkpoint into a dew run that dew samples, scores and fine-tunes.

    python -m dew.convert_dit --checkpoint=DiT-XL-2-256x256.pt --config=experiments/dit.py:DiT-XL/2 \
        --workdir=runs/dit [--which=ema] [--step=1] [--config.dataset.path=...] [--config.*=...]
    python -m dew.convert_dit --checkpoint=SiT-XL-2-256x256.pt --config=experiments/sit.py:SiT-XL/2 \
        --workdir=runs/sit
    python -m dew.convert_dit --checkpoint=last.pt --source=repa --config=experiments/repa.py:SiT-XL/2 \
        --workdir=runs/repa

``--checkpoint`` is what facebookresearch/DiT, willisma/SiT or sihyun-yu/REPA publish or save: a
plain ``state_dict`` (``DiT-XL-2-256x256.pt``) or ``train.py``'s ``{"model", "ema", "opt",
"args"}`` (``--which`` picks ``ema``, the default as their ``sample.py`` does, or ``model``), as
a ``.pt`` (PyTorch's zip format, read without PyTorch: ``dew.interop.torch_zip``) or an
``.npz`` of the same keys (``dew.interop.dit_checkpoint``). ``--config``
is the dew experiment the weights belong to: its ``config.model`` names the network (the
registered ``DiT-XL/2`` …) and its data set the latent shape and classes; ``--config.*``
overrides apply last.

``--source=repa`` (required for a checkpoint holding REPA's ``projectors.*``): sihyun-yu/REPA
trains in the mirror of SiT's time (t = 1 at the noise, velocity ε − x), so the run's network is
built with ``config.model.time_direction="repa"`` (dew's time s, 1 − s fed to the weights, the
velocity negated): dew's samplers, ``repa_sde``/``repa_ode`` included, and further training with
the ``interpolant`` objective then see a SiT-convention network, and the loss trains the weights
toward REPA's own target at REPA's time.

The weights become both the parameters and the (debiased) EMA of a ``TrainState`` at step
``--step`` with a fresh optimizer state, saved through ``Checkpoints`` under
``<workdir>/checkpoints`` with the data stream's start as its position, and ``run.json`` beside
it as a training run leaves it (its ``converted`` record names the file). Sample it with
``python -m dew.sample --workdir=<workdir>`` or ``dew.pipeline(<workdir>)``, score it with
``python -m dew.fid --workdir=<workdir>``, fine-tune it with ``python -m dew.main
--config=... --workdir=<workdir>`` (it resumes from ``--step``).

A latent run must follow the checkpoints' latent convention (``check_latent_convention``:
0.18215, bias 0, ``config.objective.latent.pixels`` ``dit`` or ``repa``, as the experiments set
it), so ``dew.pipeline`` and ``python -m dew.sample`` decode as ``sample_ddp.py`` /
``generate.py`` do.

Exit status 2, with one line on stderr and nothing written, on a bad argument, an unreadable
file, a checkpoint of another network (a key, a shape or the ``pos_embed`` grid that the
configured network does not have: the key named), or a patch size that does not divide the
latent resolution.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

import numpy as np

from dew import converted_run
from dew.config import apply_overrides, load_config
from dew.converted_run import ConversionError as ConversionError

REFERENCES = ("dit", "sit", "repa")
#: REPA's paths (``loss.py`` ``path_type``) as dew's interpolant paths, and its one prediction
REPA_PATHS = ("Linear", "GVP")
REPA_PROJECTORS = ("projectors.", "module.projectors.")


def with_time_direction(config, state_dict: Mapping[str, np.ndarray], reference: str | None):
    """``config`` with ``model.time_direction`` set for the checkpoint's reference (a copy; the
    same object when nothing changes; ``repa`` replaces the network's default ``sit``).
    sihyun-yu/REPA trains t = 1 at the noise, x_t = (1 − t)·x + t·ε, v = ε − x (cosine:
    α = cos(πt/2), σ = sin(πt/2)): its networks run in the mirror of SiT's time, so
    ``reference="repa"`` builds dew's network with ``time_direction="repa"`` (it feeds 1 − s to
    the time embedder and negates the velocity: ``dew.networks.dit``). A checkpoint with REPA's
    projector keys and no ``reference`` is refused (its time direction is not in it)."""
    if reference is not None and reference not in REFERENCES:
        raise ConversionError(f"--source={reference!r} is unknown: expected one of {REFERENCES}")
    if reference is None:
        if any(k.startswith(REPA_PROJECTORS) for k in state_dict):
            raise ConversionError(
                "--source: the checkpoint holds REPA's projectors (projectors.*): pass --source=repa "
                "(REPA's time, t = 1 at the noise) or --source=sit if it was trained in SiT's time"
            )
        return config
    if reference != "repa":
        return config
    objective = config.objective
    if objective.get("name") != "interpolant" or objective.get("path", "Linear") not in REPA_PATHS:
        raise ConversionError(
            f"--source=repa: config.objective ({objective.get('name')!r}, path "
            f"{objective.get('path', 'Linear')!r}) is not REPA's: expected the interpolant objective "
            f"on a path in {REPA_PATHS} (REPA's linear and cosine)"
        )
    if objective.get("prediction", "velocity") != "velocity":
        raise ConversionError(
            f"--source=repa: config.objective.prediction={objective.get('prediction')!r} is not REPA's: "
            "expected 'velocity'"
        )
    config = config.copy_and_resolve_references()
    with config.unlocked():
        config.model.time_direction = "repa"
    return config


def check_latent_convention(objective, reference: str | None) -> None:
    """Refuse a latent run whose convention is not the published checkpoints' (``ConversionError``,
    one line): DiT-XL/2, SiT-XL/2 and REPA sample final latents = 0.18215 · the SD-VAE latent of a
    [−1, 1] image, so ``config.objective.latent`` must have scale 0.18215 and bias 0 on every
    channel and ``pixels`` ``dit`` or ``repa`` (``dew.encoding.stability_vae``: the rule encode,
    decode, the FID protocol and this converter share). A pixel-space run is not checked."""
    from dew.encoding.stability_vae import SD_SCALING

    latent = getattr(objective, "latent", None)
    if latent is None:
        return
    codec = latent.codec
    if not codec.pixels.signed:
        want = "repa" if reference == "repa" else "dit"
        raise ConversionError(
            f"config.objective.latent.pixels={codec.pixels.name!r}: the {reference or 'dit'} checkpoint's "
            f"latents are of [-1, 1] images; expected --config.objective.latent.pixels={want}"
        )
    scale, bias = np.asarray(codec.scaling.scale), np.asarray(codec.scaling.bias)
    if scale.shape != SD_SCALING.scale.shape or np.any(scale != SD_SCALING.scale) or np.any(bias != 0):
        raise ConversionError(
            f"config.objective.latent: scale {scale.tolist()}, bias {bias.tolist()}; the published "
            "checkpoints' latents are 0.18215 * the VAE's, bias 0 (raw_mean 0, raw_std 0.5 / 0.18215)"
        )


def convert(
    state_dict: Mapping[str, np.ndarray],
    config,
    workdir: str,
    step: int = 1,
    source: str = "<in memory>",
    reference: str | None = None,
) -> str:
    """Write ``state_dict`` (reference keys -> arrays) as a checkpoint of the run ``config``
    describes, and ``run.json`` beside it; returns the checkpoint directory. ``reference``
    (``dit``, ``sit``, ``repa``; None: DiT/SiT, refused for a checkpoint with REPA's projectors)
    says whose time convention the weights were trained in (``with_time_direction``). Raises
    ConversionError / ConfigError (checked before anything is written)."""
    from dew.interop import dit_checkpoint

    if not isinstance(step, int) or step < 1:
        raise ConversionError(f"--step={step!r} is invalid: expected an int >= 1 (the EMA's update count)")
    try:
        dit_checkpoint.check_layout(state_dict)  # before the run's target is built
    except dit_checkpoint.CheckpointError as e:
        raise ConversionError(f"--checkpoint={source}: {str(e).removeprefix('checkpoint: ')}") from None
    config = with_time_direction(config, state_dict, reference)
    name = config.model.name
    run = converted_run.target(config, workdir)
    check_latent_convention(run.trainer.objective, reference)
    template = run.template
    sample = run.trainer.objective.input_spec.sample.shape
    options = {k: v for k, v in config.model.items() if k != "name"}
    try:
        converted = dit_checkpoint.convert(
            state_dict, name, options, input_size=int(sample[0]), top=run.network
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
    params = {m: dict(converted[m]) for m in template}
    record = {"checkpoint": source, "architecture": name, "step": step}
    if reference is not None:
        record["source"] = reference
    return converted_run.write_run(run, config, workdir, params, step, record)


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
    parser.add_argument(
        "--source",
        choices=REFERENCES,
        default=None,
        help="whose training the weights come from: repa runs t = 1 at the noise (required for REPA's)",
    )
    try:
        args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:
        return int(e.code or 0) and 2

    def write(workdir: str, overrides: list[str]) -> str:
        from dew.interop.dit_checkpoint import CheckpointError, read_checkpoint

        config = apply_overrides(load_config(args.config), overrides)
        try:
            state = read_checkpoint(args.checkpoint, args.which)  # a bad file fails before anything is built
        except CheckpointError as e:
            raise ConversionError(f"--checkpoint: {str(e).removeprefix('checkpoint: ')}") from None
        directory = convert(state, config, workdir, args.step, os.path.abspath(args.checkpoint), args.source)
        return f"converted {args.checkpoint} ({config.model.name}) -> {directory} (step {args.step})"

    return converted_run.command(args.workdir, rest, write)


if __name__ == "__main__":
    sys.exit(main())

"""Every NVlabs/edm2 ``train_edm2.py`` preset, resolved by the reference's own code (run with PyTorch).

    /work/venv-torch/bin/python third_party/edm2/make_presets.py --edm2=/work/ref/edm2

``--edm2`` is an unmodified checkout of NVlabs/edm2 (commit 4bf8162f601bcc09472ce8a32dd0cbe8889dc8fc
was used). For each entry of ``train_edm2.config_presets`` this parses
``--outdir=<tmp> --data=<tmp data> --preset=<name>`` with the reference's own click command
(so every CLI default applies) and resolves it with its ``setup_training_config``, exactly what
``train_edm2.py --dry-run`` prints. The data is a two-item stand-in of the right kind, made in a
temporary directory: ``.npy`` arrays of 8 channels (the reference's VAE-latent ``img512`` data:
``StabilityVAEEncoder``) or 3-channel PNGs (``img64``: ``StandardRGBEncoder``), with labels. The
keyword defaults the resolved config leaves to the callee are read from the reference's
signatures: ``training_loop``'s ``optimizer_kwargs`` and ``ema_kwargs``, ``PowerFunctionEMA``'s
``stds``, ``EDM2Loss``'s ``sigma_data``, ``learning_rate_schedule``'s ``rampup_Mimg``, ``Precond``'s
``sigma_data``. Writes ``presets.json``: ``{"presets": {name: resolved config}, "defaults": {...}}``
(the ``dataset_kwargs.path`` of the stand-in is dropped).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile

import numpy as np


def _stand_in_data(root: str, channels: int) -> str:
    path = os.path.join(root, f"data{channels}")
    os.makedirs(path)
    names = []
    for i in range(2):
        if channels == 8:
            name = f"{i:08d}.npy"
            np.save(os.path.join(path, name), np.zeros((8, 64, 64), np.uint8))
        else:
            import PIL.Image

            name = f"{i:08d}.png"
            PIL.Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(os.path.join(path, name))
        names.append([name, i])
    with open(os.path.join(path, "dataset.json"), "w") as f:
        json.dump({"labels": names}, f)
    return path


def _default(fn, name):
    """A keyword default; for a class, of the first ``__init__`` in its MRO that names it (the
    reference's ``persistent_class`` wraps ``__init__`` in a subclass taking ``*args, **kwargs``)."""
    for f in [c.__init__ for c in fn.__mro__] if inspect.isclass(fn) else [fn]:
        parameters = inspect.signature(f).parameters
        if name in parameters:
            return parameters[name].default
    raise KeyError(f"{fn} has no parameter {name!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edm2", default="/work/ref/edm2", help="an NVlabs/edm2 checkout")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "presets.json"))
    args = parser.parse_args()
    sys.dont_write_bytecode = True
    sys.path.insert(0, os.path.abspath(args.edm2))
    os.chdir(os.path.abspath(args.edm2))  # dnnlib resolves class names relative to the checkout
    import train_edm2
    import training.networks_edm2
    import training.phema
    import training.training_loop

    presets = {}
    with tempfile.TemporaryDirectory() as root:
        data = {"img512": _stand_in_data(root, 8), "img64": _stand_in_data(root, 3)}
        for name in train_edm2.config_presets:
            argv = [f"--outdir={root}/run", f"--data={data[name.split('-')[1]]}", f"--preset={name}"]
            ctx = train_edm2.cmdline.make_context("train_edm2.py", argv)
            opts = {k: v for k, v in ctx.params.items() if k not in ("outdir", "dry_run")}
            c = train_edm2.setup_training_config(**opts)
            c = json.loads(json.dumps(c))
            del c["dataset_kwargs"]["path"]
            presets[name] = c
    loop = training.training_loop
    defaults = {
        "optimizer_kwargs": _default(loop.training_loop, "optimizer_kwargs"),
        "ema_kwargs": _default(loop.training_loop, "ema_kwargs"),
        "ema_stds": list(_default(training.phema.PowerFunctionEMA, "stds")),
        "loss_sigma_data": _default(loop.EDM2Loss, "sigma_data"),
        "rampup_Mimg": _default(loop.learning_rate_schedule, "rampup_Mimg"),
        "network_sigma_data": _default(training.networks_edm2.Precond, "sigma_data"),
    }
    with open(args.out, "w") as f:
        json.dump({"presets": presets, "defaults": json.loads(json.dumps(defaults))}, f, indent=1)
        f.write("\n")
    print(f"{args.out}: {len(presets)} presets", flush=True)


if __name__ == "__main__":
    main()

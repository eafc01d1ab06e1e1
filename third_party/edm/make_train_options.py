"""The training options NVlabs/edm's own ``train.py`` resolves for every published model.

    /work/venv-torch/bin/python third_party/edm/make_train_options.py --edm=/tmp/edm_ref

``--edm`` is an unmodified checkout of NVlabs/edm (commit 008a4e5316c8e3bfe61a62f874bddba254295afb).
For each row of ``ROWS`` (the README's "exact training configurations that we used to obtain our
pre-trained models", plus the Table 2 VP/VE preconditioning baselines ``--precond=vp/ve``) this
calls ``train.py``'s own click command ``main`` with the row's options and ``--dry-run``; the
command builds its options dict ``c`` exactly as a real run would and prints it as JSON
(``Training options:``), which is captured here. Nothing of the option parsing is re-implemented.

What this script supplies around the command:

* a one-process CPU ``torch.distributed`` group (gloo): ``dist.init`` asks for NCCL and CUDA,
  so ``torch_utils.distributed.init`` is replaced by a gloo ``init_process_group`` with world
  size 1 (the only part of ``c`` that depends on it is the run directory's name);
* a small data set per row in the format ``train.py --data`` opens (a folder of PNGs and
  ``dataset.json``; the real ones are made by ``dataset_tool.py``) at the real resolution and
  label count, since ``train.py`` opens the data set to record its resolution and size;
* ``--seed=0`` (without it ``train.py`` draws a seed on CUDA) and ``--outdir`` in a temp dir.

Beyond ``c`` the JSON records, per row, what the training loop derives from it with the
reference's own code and defaults (``inspect.signature`` of the reference classes, bound to the
keyword arguments ``c`` passes, with their defaults applied):

* ``interface_kwargs``: ``img_resolution``, ``img_channels``, ``label_dim`` of the data set,
  read off the reference's ``ImageFolderDataset`` opened from ``c.dataset_kwargs`` as
  ``training_loop.py`` does (``label_dim`` is 0 without ``--cond``);
* ``precond``: the preconditioner's arguments (``EDMPrecond``/``VPPrecond``/``VEPrecond``),
  ``model``: the inner network's (``SongUNet``/``DhariwalUNet``, with ``in_channels`` /
  ``out_channels`` / ``label_dim`` as the preconditioner passes them), ``loss``: the loss's,
  ``augment``: ``AugmentPipe``'s (null without augmentation);
* ``training_loop``: ``training_loop``'s arguments (``ema_rampup_ratio``, ``lr_rampup_kimg`` ...)
  with ``c`` applied.

Data-set-specific entries of ``c`` (``dataset_kwargs.path``, ``max_size``, ``run_dir``) are
replaced by the names a real run would carry (``datasets/<name>.zip``) or dropped (``max_size``:
the length of the stand-in set; ``run_dir``). Writes ``train_options.json`` next to this file.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# The README table (name: options), then the Table 2 baselines (VP / VE preconditioning and loss
# with the DDPM++ / NCSN++ networks, CIFAR-10 at the default options).
ROWS = {
    "cifar10-32x32-cond-ddpmpp": ("cifar10-32x32", "--cond=1 --arch=ddpmpp"),
    "cifar10-32x32-cond-ncsnpp": ("cifar10-32x32", "--cond=1 --arch=ncsnpp"),
    "cifar10-32x32-uncond-ddpmpp": ("cifar10-32x32", "--cond=0 --arch=ddpmpp"),
    "cifar10-32x32-uncond-ncsnpp": ("cifar10-32x32", "--cond=0 --arch=ncsnpp"),
    "ffhq-64x64-uncond-ddpmpp": (
        "ffhq-64x64",
        "--cond=0 --arch=ddpmpp --batch=256 --cres=1,2,2,2 --lr=2e-4 --dropout=0.05 --augment=0.15",
    ),
    "ffhq-64x64-uncond-ncsnpp": (
        "ffhq-64x64",
        "--cond=0 --arch=ncsnpp --batch=256 --cres=1,2,2,2 --lr=2e-4 --dropout=0.05 --augment=0.15",
    ),
    "afhqv2-64x64-uncond-ddpmpp": (
        "afhqv2-64x64",
        "--cond=0 --arch=ddpmpp --batch=256 --cres=1,2,2,2 --lr=2e-4 --dropout=0.25 --augment=0.15",
    ),
    "afhqv2-64x64-uncond-ncsnpp": (
        "afhqv2-64x64",
        "--cond=0 --arch=ncsnpp --batch=256 --cres=1,2,2,2 --lr=2e-4 --dropout=0.25 --augment=0.15",
    ),
    "imagenet-64x64-cond-adm": (
        "imagenet-64x64",
        "--cond=1 --arch=adm --duration=2500 --batch=4096 --lr=1e-4 --ema=50 --dropout=0.10 "
        "--augment=0 --fp16=1 --ls=100 --tick=200",
    ),
    "cifar10-32x32-cond-ddpmpp-vp": ("cifar10-32x32", "--cond=1 --arch=ddpmpp --precond=vp"),
    "cifar10-32x32-cond-ncsnpp-ve": ("cifar10-32x32", "--cond=1 --arch=ncsnpp --precond=ve"),
    "cifar10-32x32-uncond-ddpmpp-vp": ("cifar10-32x32", "--cond=0 --arch=ddpmpp --precond=vp"),
    "cifar10-32x32-uncond-ncsnpp-ve": ("cifar10-32x32", "--cond=0 --arch=ncsnpp --precond=ve"),
}

# The data sets' shapes: resolution, channels, classes (None: unlabelled).
DATASETS = {
    "cifar10-32x32": (32, 3, 10),
    "ffhq-64x64": (64, 3, None),
    "afhqv2-64x64": (64, 3, None),
    "imagenet-64x64": (64, 3, 1000),
}


def write_dataset(root: str, name: str) -> str:
    """A folder in ``dataset_tool.py``'s format: ``img*.png`` and, when labelled,
    ``dataset.json`` ``{"labels": [[file, class], ...]}``; the largest class occurs, so the
    reference's ``label_dim`` (max label + 1) is the real one."""
    from PIL import Image

    resolution, channels, classes = DATASETS[name]
    path = os.path.join(root, name)
    os.makedirs(path)
    rng = np.random.default_rng(0)
    labels = [0, (classes or 1) - 1]
    entries = []
    for i, label in enumerate(labels):
        file = f"img{i:08d}.png"
        pixels = rng.integers(0, 256, (resolution, resolution, channels), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(path, file))
        entries.append([file, label])
    if classes is not None:
        with open(os.path.join(path, "dataset.json"), "w") as f:
            json.dump({"labels": entries}, f)
    return path


def original_class(cls: type) -> type:
    """The class under ``torch_utils.persistence``'s decorator (whose ``__init__`` is
    ``(*args, **kwargs)``)."""
    for klass in cls.__mro__:
        params = inspect.signature(klass.__init__).parameters.values()
        if any(p.kind == p.POSITIONAL_OR_KEYWORD and p.name != "self" for p in params):
            return klass
    return cls


def bind(fn, **kwargs) -> dict:
    """``fn``'s arguments with ``kwargs`` given and its defaults applied; ``**extra`` flattened."""
    if isinstance(fn, type):
        fn = original_class(fn).__init__
        kwargs = {"self": None, **kwargs}
    bound = inspect.signature(fn).bind(**kwargs)
    bound.apply_defaults()
    out = {}
    for name, value in bound.arguments.items():
        param = inspect.signature(fn).parameters[name]
        if name == "self":
            continue
        if param.kind == param.VAR_KEYWORD:
            out.update(value)
        else:
            out[name] = value
    return out


def resolve_row(edm: str, root: str, dataset: str, options: str) -> dict:
    """``train.py``'s ``c`` for one row (captured from its ``--dry-run`` print) and what the
    training loop derives from it."""
    import dnnlib
    import train
    from torch_utils import distributed as dist
    from training import augment, loss, networks, training_loop

    data = write_dataset(root, dataset)
    argv = [f"--outdir={os.path.join(root, 'runs')}", f"--data={data}", "--seed=0", "--dry-run"]
    argv += options.split()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        train.main.main(args=argv, standalone_mode=False)
    text = out.getvalue()
    start = text.index("Training options:") + len("Training options:")
    end = text.index("Output directory:")
    c = json.loads(text[start:end])
    assert dist.get_world_size() == 1
    # What training_loop.py reads off the data set it opens from c.dataset_kwargs.
    dataset_obj = dnnlib.util.construct_class_by_name(**c["dataset_kwargs"])
    resolution, channels = dataset_obj.resolution, dataset_obj.num_channels
    interface = dict(img_resolution=resolution, img_channels=channels, label_dim=dataset_obj.label_dim)
    del dataset_obj
    shutil.rmtree(data)
    c["dataset_kwargs"]["path"] = f"datasets/{dataset}.zip"
    del c["dataset_kwargs"]["max_size"], c["run_dir"]

    network_kwargs = dict(c["network_kwargs"])
    precond_cls = getattr(networks, network_kwargs.pop("class_name").rsplit(".", 1)[1])
    precond = bind(precond_cls, **interface, **network_kwargs)
    precond_args = set(inspect.signature(original_class(precond_cls).__init__).parameters)
    model_kwargs = {k: v for k, v in precond.items() if k not in precond_args}
    precond = {k: v for k, v in precond.items() if k in precond_args}
    model_cls = getattr(networks, precond["model_type"])
    model = bind(
        model_cls,
        img_resolution=resolution,
        in_channels=channels,
        out_channels=channels,
        label_dim=interface["label_dim"],
        **model_kwargs,
    )
    loss_kwargs = dict(c["loss_kwargs"])
    loss_cls = getattr(loss, loss_kwargs.pop("class_name").rsplit(".", 1)[1])
    augment_resolved = None
    if c.get("augment_kwargs") is not None:
        augment_kwargs = dict(c["augment_kwargs"])
        augment_cls = getattr(augment, augment_kwargs.pop("class_name").rsplit(".", 1)[1])
        augment_resolved = bind(augment_cls, **augment_kwargs)
    loop_args = inspect.signature(training_loop.training_loop).parameters
    loop_kwargs = {k: v for k, v in c.items() if k in loop_args}
    loop = bind(training_loop.training_loop, **loop_kwargs)
    loop = {k: v for k, v in loop.items() if not k.endswith("_kwargs") and k not in ("run_dir", "device")}
    return {
        "options": options,
        "train_py": c,
        "interface_kwargs": interface,
        "precond": {"class": precond_cls.__name__, **precond},
        "model": {"class": model_cls.__name__, **model},
        "loss": {"class": loss_cls.__name__, **bind(loss_cls, **loss_kwargs)},
        "augment": augment_resolved,
        "training_loop": loop,
    }


def one_process_gloo() -> None:
    """Replace ``torch_utils.distributed.init`` (NCCL + CUDA) with a world of one on gloo."""
    import torch
    from torch_utils import distributed as dist

    def init() -> None:
        if not torch.distributed.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29517")
            torch.distributed.init_process_group("gloo", rank=0, world_size=1)

    dist.init = init


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edm", required=True, help="an unmodified NVlabs/edm checkout")
    parser.add_argument("--out", default=os.path.join(HERE, "train_options.json"))
    args = parser.parse_args()
    edm = os.path.abspath(args.edm)
    sys.path.insert(0, edm)
    os.chdir(edm)
    import torch

    torch.set_num_threads(1)
    one_process_gloo()
    import train

    train.torch.multiprocessing.set_start_method = lambda *a, **k: None  # once per process is enough
    rows = {}
    with tempfile.TemporaryDirectory() as root:
        for name, (dataset, options) in ROWS.items():
            rows[name] = resolve_row(edm, root, dataset, options)
            print(name, rows[name]["options"])
    record = {
        "source": "NVlabs/edm 008a4e5316c8e3bfe61a62f874bddba254295afb, train.py --dry-run",
        "command": "/work/venv-torch/bin/python third_party/edm/make_train_options.py --edm=<checkout>",
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()

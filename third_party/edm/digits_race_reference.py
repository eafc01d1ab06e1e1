"""The equal wall-clock race of ``experiments/digits_race.py``, run by NVlabs/edm's own code.

NVlabs/edm's ``EDMPrecond(SongUNet)`` with the race's network (8×8×1, ch 32, mult [1, 2], 2 blocks,
attention at 4, dropout 0.10, 10 labels), its ``EDMLoss`` and the optimisation and EMA of its
``training/training_loop.py`` (Adam, no learning-rate ramp-up, the EMA half-life with ramp-up,
nan_to_num on the gradients), on the same 1,617 training digits and batch size (128) as dew's
race, with the same settings as ``experiments/edm.py``'s (lr 2e-3, betas (0.9, 0.999), EMA
half-life 500 updates with ramp-up 0.05, no label dropout, no augmentation). The clock starts
when the training process starts, before torch is imported; steps run until the budget is spent.
Then 200 samples (20 per class) are drawn with the reference's ``edm_sampler`` (Heun, 18 points,
no churn) from the EMA and from the raw weights, once for each of ``--sample_seeds`` (default
1,2,3), and dew's digit classifier scores them, as in dew's race. The latents and labels of each
seed are ``experiments/race_latents.py``'s (one ``np.random.default_rng(seed)`` standard-normal
draw, class-major labels, built by the driver in dew's environment and handed to the trainer as
NCHW arrays; ``edm_sampler`` scales them by its σ_max), the very latents dew's race samples for
the same seeds, so the two sides differ by what was trained, not by the noise each drew.
``accuracy_ema`` / ``accuracy_raw`` are the means over the seeds, ``accuracy_ema_seeds`` /
``accuracy_raw_seeds`` each seed's.

    PYTHONPATH=. /work/venv/bin/python third_party/edm/digits_race_reference.py \\
        --edm=/tmp/edm_ref --torch_python=/work/venv-torch/bin/python [--budget=240] \\
        [--state_dict_out=runs/digits_race_reference/ema.npz]

``--state_dict_out`` also keeps the trained EMA network: its ``EDMPrecond`` state dict as
``param/<key>`` arrays in an ``.npz`` (no pickle), the form ``python -m dew.convert_edm
--config=experiments/edm.py`` reads, so that the reference's trained weights can be sampled and
fine-tuned in dew; ``--raw_state_dict_out`` keeps the raw (last) weights the same way.
``--samples_out`` keeps what was scored: the initial noise (``latents``, NCHW), the labels and the
``ema``/``raw`` samples (NHWC) of the first seed, for a sample-by-sample comparison with another
sampler, and every seed's as ``latents_seeds`` / ``ema_seeds`` / ``raw_seeds`` (seed-major, in
the order of ``sample_seeds``).

``--seed=S`` seeds the training (the initial weights, dropout and the data order; default 0, as
before), so that several sets are several trainings rather than one repeated; dew's race takes
``config.seed=S`` for the same purpose. The sampling noise stays ``--sample_seeds``'.
``--max_steps=N`` also stops after N steps (an equal-steps comparison on a loaded machine).
``--sample_state_dict=<npz>`` trains nothing: it loads that state dict (the ``param/<key>`` form
above, from this script or from ``experiments/race_cross_sampling.py``'s export of a dew network)
into the same ``EDMPrecond`` and draws and scores it as the race draws (reported as ``ema``), so
the reference's sampler can be run on another trainer's network.

The driver (dew's environment) writes the training digits, starts the trainer in PyTorch's
environment (``--worker``, 2 threads) and scores what it returns.
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402

RACE_LATENTS = Path(__file__).resolve().parents[2] / "experiments" / "race_latents.py"

NETWORK = dict(
    img_resolution=8,
    img_channels=1,
    label_dim=10,
    model_type="SongUNet",
    model_channels=32,
    channel_mult=[1, 2],
    num_blocks=2,
    attn_resolutions=[4],
    dropout=0.10,
)


def worker(args: argparse.Namespace) -> None:
    """Train by the reference's code until the budget is spent, then sample; PyTorch side."""
    import copy

    import numpy as np
    import torch

    sys.path.insert(0, args.edm)
    from generate import edm_sampler
    from training.loss import EDMLoss
    from training.networks import EDMPrecond

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # the network's initial weights and its dropout masks
    with np.load(args.data) as data:
        images = torch.from_numpy(data["image"]).permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW
        labels = torch.from_numpy(data["label"]).long()
    net = EDMPrecond(**NETWORK).train().requires_grad_(True)
    eye = torch.eye(10)
    if args.sample_state_dict:
        with np.load(args.sample_state_dict) as given:
            state = {k[6:]: torch.from_numpy(given[k]) for k in given.files if k.startswith("param/")}
        net.load_state_dict(state, strict=True)
        given_only = {"steps": 0, "trained_s": 0.0, "first_step_done_s": 0.0}
        draw(args, edm_sampler, {"ema": net.eval()}, eye, extra=given_only)
        return
    ema = copy.deepcopy(net).eval().requires_grad_(False)
    loss_fn = EDMLoss()
    optimizer = torch.optim.Adam(net.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    generator = torch.Generator().manual_seed(args.seed)  # the data order
    order, cursor, steps, first_step_done = torch.randperm(len(images), generator=generator), 0, 0, None
    while True:
        if cursor + args.batch_size > len(order):  # a new epoch: reshuffle, drop the remainder
            order, cursor = torch.randperm(len(images), generator=generator), 0
        index = order[cursor : cursor + args.batch_size]
        cursor += args.batch_size
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(net=net, images=images[index], labels=eye[labels[index]])
        loss.sum().mul(1.0 / args.batch_size).backward()  # training_loop.py's scaling
        for param in net.parameters():
            if param.grad is not None:
                torch.nan_to_num(param.grad, nan=0, posinf=1e5, neginf=-1e5, out=param.grad)
        optimizer.step()
        steps += 1
        # training_loop.py's EMA: half-life in images, ramped up to ema_rampup_ratio of those seen.
        seen = steps * args.batch_size
        half_life = min(args.ema_half_life * args.batch_size, seen * args.ema_ramp_up)
        beta = 0.5 ** (args.batch_size / max(half_life, 1e-8))
        with torch.no_grad():
            for p_ema, p_net in zip(ema.parameters(), net.parameters(), strict=True):
                p_ema.copy_(p_net.detach().lerp(p_ema, beta))
        now = time.perf_counter() - START
        if first_step_done is None:
            first_step_done = now
        if now >= args.budget or (args.max_steps and steps >= args.max_steps):
            break
    trained = time.perf_counter() - START
    raw = copy.deepcopy(net).eval()
    for path, model in ((args.state_dict_out, ema), (args.raw_state_dict_out, raw)):
        if path:
            np.savez(path, **{f"param/{k}": v.numpy() for k, v in model.state_dict().items()})
    extra = {"steps": steps, "trained_s": trained, "first_step_done_s": first_step_done}
    draw(
        args,
        edm_sampler,
        {"ema": ema, "raw": raw},
        eye,
        extra={**extra, "final_loss": float(loss.detach().mean())},
    )


def draw(args: argparse.Namespace, edm_sampler, models: dict, eye, extra: dict) -> None:
    """Sample each network with the reference's ``edm_sampler`` (Heun, ``args.points`` points, no
    churn, float64 as it runs) from every seed's latents in ``args.data`` (``sampling_inputs``),
    and write them with ``extra`` to ``args.out``: ``<name>_seeds`` [seeds, n, H, W, C] and, for
    the first seed, ``<name>``, ``latents`` (NCHW) and ``labels``."""
    import numpy as np
    import torch

    with np.load(args.data) as data:
        latents_seeds, labels, seeds = data["latents"], data["labels"], data["sample_seeds"]
    class_labels = torch.from_numpy(labels).long()
    out = {}
    for name, model in models.items():
        drawn = []
        for latents in latents_seeds:
            with torch.no_grad():
                samples = edm_sampler(
                    model, torch.from_numpy(latents), eye[class_labels], num_steps=args.points
                )
            drawn.append(samples.float().permute(0, 2, 3, 1).numpy())
        out[name], out[f"{name}_seeds"] = drawn[0], np.stack(drawn)
    np.savez(
        args.out,
        labels=labels,
        latents=latents_seeds[0],
        latents_seeds=latents_seeds,
        sample_seeds=seeds,
        **extra,
        **out,
    )


def load_race_latents() -> ModuleType:
    """``experiments/race_latents.py`` (the race's shared sampling noise), loaded by path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("race_latents", RACE_LATENTS)
    assert spec is not None and spec.loader is not None  # a .py file of this repository
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sampling_inputs(seeds: list[int], per_class: int) -> dict:
    """What the trainer samples from, as written to its data file: ``latents`` [seeds, n, 1, 8, 8]
    float32 (``race_latents``' NHWC noise of each seed, as NCHW for ``EDMPrecond``), ``labels``
    [n] int32 class-major, and ``sample_seeds``. Pure NumPy (dew's environment)."""
    import numpy as np

    shared = load_race_latents()
    draws = [shared.race_latents(seed, per_class) for seed in seeds]
    return {
        "latents": np.stack([noise.transpose(0, 3, 1, 2) for noise, _ in draws]),
        "labels": draws[0][1],
        "sample_seeds": np.asarray(seeds, np.int64),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edm", required=True, help="an NVlabs/edm checkout")
    parser.add_argument("--torch_python", default="/work/venv-torch/bin/python")
    parser.add_argument("--budget", type=float, default=240.0, help="seconds, from the trainer's start")
    parser.add_argument("--max_steps", type=int, default=0, help="also stop after this many steps (0: none)")
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--ema_half_life", type=float, default=500.0, help="in updates")
    parser.add_argument("--ema_ramp_up", type=float, default=0.05)
    parser.add_argument("--per_class", type=int, default=20)
    parser.add_argument("--points", type=int, default=18)
    parser.add_argument(
        "--sample_seeds",
        default="1,2,3",
        help="seeds of the shared sampling noise (experiments/race_latents.py), comma-separated",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="the training's seed (initial weights, dropout, data order)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="runs/digits_race_reference/race.json")
    parser.add_argument("--state_dict_out", help="also write the trained EMA network's state dict (.npz)")
    parser.add_argument("--raw_state_dict_out", help="also write the raw (last) weights' state dict (.npz)")
    parser.add_argument("--samples_out", help="also write the latents, labels and samples scored (.npz)")
    parser.add_argument(
        "--sample_state_dict", help="train nothing: sample this state dict (.npz) as the race does"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    try:
        seeds = load_race_latents().parse_seeds(args.sample_seeds)
    except ValueError as error:
        parser.error(str(error))

    import numpy as np

    from dew.data.sources.digits import digits
    from dew.scoring.digits_classifier import classify_digits

    with tempfile.TemporaryDirectory() as tmp:
        data, samples = os.path.join(tmp, "train.npz"), os.path.join(tmp, "samples.npz")
        train = digits("train")
        np.savez(
            data,
            image=train.fields["image"],
            label=train.fields["label"],
            **sampling_inputs(seeds, args.per_class),
        )
        for key in ("state_dict_out", "raw_state_dict_out", "sample_state_dict"):
            if getattr(args, key):
                setattr(args, key, os.path.abspath(getattr(args, key)))
                os.makedirs(os.path.dirname(getattr(args, key)), exist_ok=True)
        passed = {
            k: v
            for k, v in vars(args).items()
            if k not in ("worker", "data", "out", "samples_out") and v is not None
        }
        flags = [f"--{k}={v}" for k, v in passed.items()]
        subprocess.run(
            [args.torch_python, __file__, "--worker", f"--data={data}", f"--out={samples}", *flags],
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": str(args.threads)},
        )
        with np.load(samples) as result:
            kept = ("steps", "trained_s", "first_step_done_s", "final_loss")
            record = {k: result[k].item() for k in kept if k in result.files}
            record["sample_seeds"] = seeds
            for name in ("ema", "raw"):
                if f"{name}_seeds" in result.files:
                    per_seed = [
                        float(np.mean(classify_digits(np.clip(drawn, -1, 1)) == result["labels"]))
                        for drawn in result[f"{name}_seeds"]
                    ]
                    record[f"accuracy_{name}"] = float(np.mean(per_seed))
                    record[f"accuracy_{name}_seeds"] = per_seed
            record["latents"] = (
                "experiments/race_latents.py: np.random.default_rng(seed), shared with dew's race"
            )
            if args.samples_out:
                os.makedirs(os.path.dirname(os.path.abspath(args.samples_out)), exist_ok=True)
                np.savez(args.samples_out, **{k: result[k] for k in result.files})
    record.update(
        seed=args.seed,
        budget_s=args.budget,
        batch_size=args.batch_size,
        samples=10 * args.per_class,
        load_average_1min=os.getloadavg()[0],
    )
    shown = ", ".join(
        f"{record[f'accuracy_{n}']:.1%} ({n}; "
        + ", ".join(f"{a:.1%}" for a in record[f"accuracy_{n}_seeds"])
        + ")"
        for n in ("ema", "raw")
        if f"accuracy_{n}" in record
    )
    print(
        f"NVlabs/edm: {record['steps']} steps in {record['trained_s']:.0f} s (first step done at "
        f"{record['first_step_done_s']:.1f} s); {record['samples']} Heun-{args.points} samples per seed "
        f"(seeds {args.sample_seeds}) classified as their class: {shown}"
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())

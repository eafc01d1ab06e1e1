"""The EDM paper's published models (Karras et al. 2022), each exactly as NVlabs/edm trained it.

One row of ``ROWS`` per model of NVlabs/edm's README training table ("the exact training
configurations that we used to obtain our pre-trained models"), plus the paper's Table 2 VP and
VE preconditioning baselines (``train.py --precond=vp/ve``) on CIFAR-10. Pick a row after the
colon:

    python -m dew.main --config=experiments/edm_paper.py:cifar10-cond-ddpmpp --workdir=runs/c10c

    python -m dew.main --config=experiments/edm_paper.py:ffhq-ddpmpp --workdir=runs/ffhq \
        --config.dataset.path=datasets/ffhq-64x64.zip

Rows: cifar10-{cond,uncond}-{ddpmpp,ncsnpp}, {ffhq,afhqv2}-{ddpmpp,ncsnpp},
imagenet64-cond-adm, cifar10-{cond,uncond}-ddpmpp-vp, cifar10-{cond,uncond}-ncsnpp-ve.
``experiments/REPRODUCE.md`` gives each row's devices, time and the paper's FID.

Each row holds the reference's command-line options (``--batch``, ``--duration`` in Mimg,
``--lr``, ``--ema`` in Mimg, ``--dropout``, ``--augment``, ``--cres``, ``--fp16``, ``--ls``);
``get_config`` turns them into a dew config the way ``train.py`` and ``training/training_loop.py``
turn them into a run, and ``tests/test_paper_configs.py`` checks every setting against what the
reference's own ``train.py --dry-run`` resolves (``third_party/edm/train_options.json``).

Conversions (the reference counts images, dew counts optimizer updates of B images, B = --batch):

* duration: the reference stops after the update that reaches ``total_kimg``·1000 images, so
  ``train.num_steps`` = ⌈total_kimg·1000 / B⌉ (ImageNet-64: 2.5·10⁹ / 4096 = 610,351.56, so
  610,352 updates, as the reference runs);
* learning-rate ramp-up: the reference's update after ``cur_nimg`` images takes
  lr·min(cur_nimg / (lr_rampup_kimg·1000), 1); optax's count n is the updates before this one,
  cur_nimg = n·B, so ``optimizer.warmup_steps`` = lr_rampup_kimg·1000 / B (fractional: 19,531.25
  for B = 512) and lr·min(n / W, 1) is the same value;
* EMA: half-life ``ema.half_life`` = ema_halflife_kimg·1000 / B updates, ramp-up ratio 0.05. One
  off-by-one remains: the reference's β for the update after ``cur_nimg`` images uses
  min(H, 0.05·cur_nimg), i.e. 0.05·(n−1)·B at the n-th update (β₁ = 0: the first update copies the
  weights), where dew's ``dew.averaging.ema`` uses 0.05·n and a zero start with debiasing. The two
  averages differ in the weight they give the first updates; both spans equal H after
  H/0.05 = 20·H updates (19,531 for CIFAR-10), and everything before that point weighs
  2^-(updates after it / H) in the final average: at most 2^-380 for CIFAR-10 and the 64x64
  sets, 2^-30 for ImageNet-64. The total-variation distance between the two final averages'
  weights is 2^-396 (CIFAR-10), 2^-397 (64x64), 2^-49 (ImageNet-64); after 2,000 updates it is
  1.9·10⁻⁴ (``tests/test_paper_configs.py``, the EMA test, computes both laws in float64);
* loss scale and Adam ε: the reference's loss is the per-image *sum* over C·H·W pixels times
  ``--ls`` (``loss.sum().mul(loss_scaling / batch_gpu_total)``), dew's the per-pixel mean; Adam's
  update is unchanged by a constant gradient scale K except through ε, so the reference's
  ε = 10⁻⁸ is dew's ``optimizer.eps`` = 10⁻⁸ / (C·H·W·ls) (the same update in real arithmetic;
  in float32 ε itself rounds by at most 2⁻²⁴ relative). This is how ``--ls`` acts in float32; in
  float16 it also moves gradients away from underflow, which is ``config.precision``'s static
  loss scale (below);
* augmentation: ``config.objective.augment`` carries ``AugmentPipe``'s keywords as ``train.py``
  sets them (``p`` = --augment, ``xflip=1e8, yflip=1, scale=1, rotate_frac=1, aniso=1,
  translate_frac=1``), and the network's ``augment_dim`` = 9; --augment=0 builds no pipe and no
  augmentation labels (``p`` = 0, ``augment_dim`` = 0);
* mixed precision: ``--fp16`` (ImageNet-64 only) is ``config.precision`` float16 compute with
  ``--ls`` as its static loss scale (``docs/precision.md``: the loss times ``scale`` is
  differentiated, the gradients divided by it in float32, so ε still carries ``--ls``).

What the reference does that is not a config setting here: it replaces non-finite gradient
entries by 0 / ±10⁵ and still steps (dew's ``train.nonfinite="skip"`` drops that update instead),
and it draws a random seed unless given ``--seed`` (dew: ``seed`` = 0).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from ml_collections import ConfigDict


class Row(NamedTuple):
    """One published model: the data set, and ``train.py``'s options in its units."""

    reference: str  # the row's name in third_party/edm/train_options.json
    dataset: str  # cifar10 | ffhq-64x64 | afhqv2-64x64 | imagenet-64x64
    cond: bool  # --cond
    arch: str  # --arch: ddpmpp | ncsnpp | adm
    precond: str = "edm"  # --precond: edm | vp | ve
    batch: int = 512  # --batch (images per optimizer update)
    duration_mimg: float = 200.0  # --duration
    lr: float = 10e-4  # --lr
    ema_mimg: float = 0.5  # --ema (EMA half-life)
    dropout: float = 0.13  # --dropout
    augment: float = 0.12  # --augment (AugmentPipe p)
    cres: tuple[int, ...] | None = None  # --cres (channel_mult)
    xflip: bool = False  # --xflip
    fp16: bool = False  # --fp16: config.precision float16 with --ls as its static loss scale
    loss_scaling: float = 1.0  # --ls
    tick_kimg: int = 50  # --tick (logging and checkpoint cadence only)


_64: dict[str, Any] = dict(batch=256, cres=(1, 2, 2, 2), lr=2e-4, augment=0.15)
ROWS: dict[str, Row] = {
    "cifar10-cond-ddpmpp": Row("cifar10-32x32-cond-ddpmpp", "cifar10", True, "ddpmpp"),
    "cifar10-cond-ncsnpp": Row("cifar10-32x32-cond-ncsnpp", "cifar10", True, "ncsnpp"),
    "cifar10-uncond-ddpmpp": Row("cifar10-32x32-uncond-ddpmpp", "cifar10", False, "ddpmpp"),
    "cifar10-uncond-ncsnpp": Row("cifar10-32x32-uncond-ncsnpp", "cifar10", False, "ncsnpp"),
    "ffhq-ddpmpp": Row("ffhq-64x64-uncond-ddpmpp", "ffhq-64x64", False, "ddpmpp", dropout=0.05, **_64),
    "ffhq-ncsnpp": Row("ffhq-64x64-uncond-ncsnpp", "ffhq-64x64", False, "ncsnpp", dropout=0.05, **_64),
    "afhqv2-ddpmpp": Row("afhqv2-64x64-uncond-ddpmpp", "afhqv2-64x64", False, "ddpmpp", dropout=0.25, **_64),
    "afhqv2-ncsnpp": Row("afhqv2-64x64-uncond-ncsnpp", "afhqv2-64x64", False, "ncsnpp", dropout=0.25, **_64),
    "imagenet64-cond-adm": Row(
        "imagenet-64x64-cond-adm",
        "imagenet-64x64",
        True,
        "adm",
        duration_mimg=2500,
        batch=4096,
        lr=1e-4,
        ema_mimg=50,
        dropout=0.10,
        augment=0.0,
        fp16=True,
        loss_scaling=100,
        tick_kimg=200,
    ),
    "cifar10-cond-ddpmpp-vp": Row("cifar10-32x32-cond-ddpmpp-vp", "cifar10", True, "ddpmpp", precond="vp"),
    "cifar10-cond-ncsnpp-ve": Row("cifar10-32x32-cond-ncsnpp-ve", "cifar10", True, "ncsnpp", precond="ve"),
    "cifar10-uncond-ddpmpp-vp": Row(
        "cifar10-32x32-uncond-ddpmpp-vp", "cifar10", False, "ddpmpp", precond="vp"
    ),
    "cifar10-uncond-ncsnpp-ve": Row(
        "cifar10-32x32-uncond-ncsnpp-ve", "cifar10", False, "ncsnpp", precond="ve"
    ),
}

# The data sets: (resolution, classes with --cond, sampler steps of the paper's FID: 18 Heun steps
# = 35 NFE for CIFAR-10, 40 = 79 NFE at 64x64; ImageNet-64's FID uses the stochastic sampler,
# 256 steps, which dew.fid runs; previews here use Heun).
DATASETS = {
    "cifar10": (32, 10, 18),
    "ffhq-64x64": (64, None, 40),
    "afhqv2-64x64": (64, None, 40),
    "imagenet-64x64": (64, 1000, 40),
}

# train.py's --arch: the inner network (dew's songunet / dhariwalunet take the reference's
# SongUNet / DhariwalUNet keyword arguments under the same names) and its defaults that
# train.py leaves alone (the classes' own: SongUNet num_blocks 4, attention at 16x16; ADM 3 blocks,
# attention at 32, 16, 8).
ARCHS = {
    "ddpmpp": (
        "songunet",
        dict(
            embedding_type="positional",
            encoder_type="standard",
            decoder_type="standard",
            channel_mult_noise=1,
            resample_filter=(1, 1),
            model_channels=128,
            channel_mult=(2, 2, 2),
            channel_mult_emb=4,
            num_blocks=4,
            attn_resolutions=(16,),
        ),
    ),
    "ncsnpp": (
        "songunet",
        dict(
            embedding_type="fourier",
            encoder_type="residual",
            decoder_type="standard",
            channel_mult_noise=2,
            resample_filter=(1, 3, 3, 1),
            model_channels=128,
            channel_mult=(2, 2, 2),
            channel_mult_emb=4,
            num_blocks=4,
            attn_resolutions=(16,),
        ),
    ),
    "adm": (
        "dhariwalunet",
        dict(
            model_channels=192,
            channel_mult=(1, 2, 3, 4),
            channel_mult_emb=4,
            num_blocks=3,
            attn_resolutions=(32, 16, 8),
        ),
    ),
}
PRESETS = {"edm": "EDM", "vp": "VP", "ve": "VE"}

# train.py's AugmentPipe for --augment > 0 (training/augment.py keywords).
AUGMENT = dict(xflip=1e8, yflip=1.0, scale=1.0, rotate_frac=1.0, aniso=1.0, translate_frac=1.0)
AUGMENT_DIM = (
    9  # the labels that pipe returns: xflip 1, yflip 1, scale 1, rotate_frac 2, aniso 2, translate 2
)

# training_loop.py's defaults that train.py does not set.
LR_RAMPUP_KIMG = 10000
EMA_RAMPUP_RATIO = 0.05
ADAM = dict(b1=0.9, b2=0.999, eps=1e-8)  # train.py's optimizer_kwargs: betas [0.9, 0.999], eps 1e-8
SNAPSHOT_TICKS = 50  # train.py --snap: a network snapshot every 50 ticks


def get_config(row: str = "cifar10-cond-ddpmpp") -> ConfigDict:
    if row not in ROWS:
        raise ValueError(f"experiments/edm_paper.py:{row!r} is not a row; expected one of {sorted(ROWS)}")
    r = ROWS[row]
    resolution, classes, sampler_steps = DATASETS[r.dataset]
    pixels = resolution * resolution * 3
    config = ConfigDict()
    config.seed = 0

    if r.dataset == "cifar10":  # tfds's cifar10 (train: the same 50,000 images as the reference's zip)
        dataset = {"name": "cifar10", "data_dir": "", "use_labels": r.cond, "xflip": r.xflip, "cache": True}
    else:  # dataset_tool.py's zip, as NVlabs/edm trains on it
        dataset = {
            "name": "image_folder",
            "path": f"datasets/{r.dataset}.zip",
            "use_labels": r.cond,
            "xflip": r.xflip,
            "cache": True,
            "resolution": resolution,
        }
    config.dataset = ConfigDict({**dataset, "batch_size": r.batch})

    augment = {"p": r.augment, **(AUGMENT if r.augment else {})}
    config.objective = ConfigDict(
        {
            "name": "diffusion",
            "preset": PRESETS[r.precond],
            "condition": "class_label" if r.cond else "none",
            "condition_dropout": 0.0,  # the networks' label_dropout, 0 in train.py
            "augment": augment,
            "sampling": {
                "steps": sampler_steps,
                "solver": "heun",
                "per_class": max(1, 100 // classes) if r.cond else 64,
            },
        }
    )

    name, arch = ARCHS[r.arch]
    model = {"name": name, **arch, "dropout": r.dropout, "label_dim": classes if r.cond else 0}
    model["augment_dim"] = AUGMENT_DIM if r.augment else 0
    if r.cres is not None:
        model["channel_mult"] = tuple(r.cres)
    config.model = ConfigDict(model)

    # Images → updates: every conversion is exact (the module docstring).
    config.optimizer = ConfigDict(
        {
            "learning_rate": r.lr,
            "warmup_steps": LR_RAMPUP_KIMG * 1000 / r.batch,
            "b1": ADAM["b1"],
            "b2": ADAM["b2"],
            "eps": ADAM["eps"] / (pixels * r.loss_scaling),
            "grad_clip": 0.0,
        }
    )
    config.ema = ConfigDict(
        {
            "half_life": int(r.ema_mimg * 1000) * 1000 / r.batch,  # train.py's ema_halflife_kimg
            "ramp_up": EMA_RAMPUP_RATIO,
            "tracks": "",
            "power_std_rels": (),
        }
    )
    total_images = max(int(r.duration_mimg * 1000), 1) * 1000  # train.py's total_kimg, in images
    tick = max(1, round(r.tick_kimg * 1000 / r.batch))
    config.train = ConfigDict(
        {
            "num_steps": math.ceil(total_images / r.batch),
            "accumulation": 1,
            "log_every": tick,
            "nonfinite": "skip",
        }
    )
    if r.fp16:  # --fp16 --ls: float16 compute, --ls the static loss scale
        config.precision = ConfigDict(
            {"compute": "float16", "loss_scale": "static", "scale": float(r.loss_scaling)}
        )
    config.mesh = ConfigDict({"model": 1, "fsdp": 1, "devices": 0})
    # The reference evaluates nothing while training (FID afterwards: python -m dew.fid); a
    # checkpoint and a preview every --snap ticks, the latest two kept.
    config.eval = ConfigDict({"every": 0})
    config.preview = ConfigDict({"every": tick * SNAPSHOT_TICKS})
    config.checkpoint = ConfigDict({"every": tick * SNAPSHOT_TICKS, "keep": 2, "keep_best": False})
    return config

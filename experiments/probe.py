"""A contrastive encoder on the 8x8 digits, scored by a linear probe against raw pixels.

    python -m dew.main --config=experiments/probe.py --workdir=runs/probe

The encoder (``image_encoder``: two stride-2 convs and an MLP, 64 features) learns without
labels (``contrastive``: SimCLR-style views: ±1-pixel shifts, 20 % of pixels blanked, noise
0.1; NT-Xent at temperature 0.2). Each preview embeds the probe set (the 180 validation digits
and 720 training digits) as ``Representations`` (a PCA scatter by label in the tracking
directory), and the registered ``linear_probe`` metric fits logistic regression on its odd rows
and reports held-out accuracy on the even rows, beside ``linear_probe_pixels``: the same probe
on the same records' raw pixels. The validation split holds 180 digits, fewer than a training
batch, so evaluation (the NT-Xent loss on held-out views) takes its own batch of 120.
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    config = ConfigDict()
    config.seed = 0
    config.dataset = ConfigDict({"name": "digits", "batch_size": 256})
    config.objective = ConfigDict(
        {"name": "contrastive", "temperature": 0.2, "shift": 1, "mask": 0.2, "noise": 0.1}
    )
    config.model = ConfigDict({"name": "image_encoder", "features": 64, "width": 32})
    config.optimizer = ConfigDict({"learning_rate": 1e-3, "warmup_steps": 50})
    config.ema = ConfigDict({"decay": 0.99})
    # ~5 min on 2 CPU cores; the features pass the raw pixels' probe accuracy after ~4,000 steps.
    config.train = ConfigDict({"num_steps": 8000, "log_every": 50})
    config.eval = ConfigDict({"every": 2000, "num_batches": 1, "batch_size": 120})
    config.preview = ConfigDict({"every": 2000, "metrics": ("linear_probe",)})
    config.checkpoint = ConfigDict({"every": 2000})
    return config

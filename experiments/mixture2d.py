"""EDM on the 2D Gaussian-mixture toy (8 components of std 0.15 on the unit circle), with a
residual MLP. Train and score it against the sample-vs-sample sliced-Wasserstein noise floor:

    PYTHONPATH=. .venv/bin/python experiments/mixture2d_score.py --workdir=runs/mixture2d
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    config = ConfigDict()
    config.seed = 0
    config.dataset = ConfigDict({"name": "gaussian_mixture", "batch_size": 256})
    config.objective = ConfigDict({"name": "diffusion", "preset": "EDM", "condition_dropout": 0.0})
    # residual=False, blocks=2: the plain 3 -> 128 -> 128 -> 2 MLP of the flow-matching tutorials.
    config.model = ConfigDict({"name": "mlp", "width": 128, "blocks": 3, "residual": True})
    config.optimizer = ConfigDict(
        {"learning_rate": 2e-3, "warmup_steps": 200, "b1": 0.9, "b2": 0.999, "grad_clip": 1.0}
    )
    config.ema = ConfigDict({"decay": 0.999})
    config.train = ConfigDict({"num_steps": 6000, "log_every": 500})
    config.checkpoint = ConfigDict({"every": 3000, "keep": 1})
    # No image previews for 2D points; mixture2d_score.py samples and scores after training.
    config.eval = ConfigDict({"every": 0, "num_batches": 1, "metrics": ()})
    config.sampling = ConfigDict({"steps": 32, "solver": "heun", "per_class": 1, "guidance": 1.0})
    config.tracking = ConfigDict({"backends": ("local",)})
    # Devices per sharding axis; data parallelism takes the rest (devices: 0 = all of them).
    config.mesh = ConfigDict({"model": 1, "fsdp": 1, "devices": 0})
    return config

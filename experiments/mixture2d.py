"""EDM on the 2D Gaussian-mixture toy (8 components of std 0.15 on the unit circle), with a
residual MLP. Evaluates the held-out loss (keeping the best checkpoint) and previews a scatter
plot of samples under <workdir>/previews. Train it:

    python -m dew.main --config=experiments/mixture2d.py --workdir=runs/mixture2d

and score it against the sample-vs-sample sliced-Wasserstein noise floor:

    PYTHONPATH=. .venv/bin/python experiments/mixture2d_score.py --workdir=runs/mixture2d
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    config = ConfigDict()
    config.seed = 0
    config.dataset = ConfigDict({"name": "gaussian_mixture", "batch_size": 256})
    # Previews are scatter plots of 2,000 samples (per_class counts all of them: no classes).
    config.objective = ConfigDict(
        {
            "name": "diffusion",
            "preset": "EDM",
            "condition_dropout": 0.0,
            "sampling": {"steps": 32, "solver": "heun", "per_class": 2000},
        }
    )
    # residual=False, blocks=2: the plain 3 -> 128 -> 128 -> 2 MLP of the flow-matching tutorials.
    config.model = ConfigDict({"name": "mlp", "width": 128, "blocks": 3, "residual": True})
    config.optimizer = ConfigDict(
        {"learning_rate": 2e-3, "warmup_steps": 200, "b1": 0.9, "b2": 0.999, "grad_clip": 1.0}
    )
    config.ema = ConfigDict({"decay": 0.999})
    # A step of this network takes about a millisecond on a CPU: ten steps per call of the
    # compiled program pay the host's dispatch once per ten (calls end on every cadence below).
    config.train = ConfigDict({"num_steps": 6000, "log_every": 500, "steps_per_call": 10})
    # The held-out denoising loss ranks checkpoints; the best and the latest are kept.
    config.checkpoint = ConfigDict({"every": 1000, "keep": 1, "keep_best": True})
    config.eval = ConfigDict({"every": 1000, "num_batches": 4})
    config.preview = ConfigDict({"every": 1000})
    config.tracking = ConfigDict({"backends": ("local",)})
    # Devices per sharding axis; data parallelism takes the rest (devices: 0 = all of them).
    config.mesh = ConfigDict({"model": 1, "fsdp": 1, "devices": 0})
    return config

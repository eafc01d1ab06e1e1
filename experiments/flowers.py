"""Class-conditional EDM on Oxford Flowers 102 (tfds ``oxford_flowers102``), centre-cropped and
resized to ``dataset.resolution``. Needs the data set prepared once in array_record format
(``python -m dew.main`` prints how if it is missing):

    python -m dew.main --config=experiments/flowers.py --workdir=runs/flowers \
        --config.dataset.data_dir=/path/to/tensorflow_datasets
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    config = ConfigDict()
    config.seed = 0
    # data_dir "" means tfds's default ($TFDS_DATA_DIR or ~/tensorflow_datasets).
    config.dataset = ConfigDict(
        {"name": "oxford_flowers102", "batch_size": 32, "resolution": 32, "data_dir": ""}
    )
    config.objective = ConfigDict(
        {
            "name": "diffusion",
            "preset": "EDM",
            "condition_dropout": 0.1,
            "sampling": {"steps": 32, "solver": "heun", "per_class": 1, "guidance": 1.0},
        }
    )
    config.model = ConfigDict(
        {
            "name": "unet",
            "channels": 64,
            "channel_mult": (1, 2, 2),
            "num_blocks": 2,
            "attn_resolutions": (8,),
            "dropout": 0.1,
        }
    )
    config.optimizer = ConfigDict(
        {"learning_rate": 1e-3, "warmup_steps": 1000, "b1": 0.9, "b2": 0.999, "grad_clip": 1.0}
    )
    config.ema = ConfigDict({"decay": 0.9995})
    config.train = ConfigDict({"num_steps": 200_000, "log_every": 100})
    config.checkpoint = ConfigDict({"every": 5000, "keep": 2})
    config.eval = ConfigDict({"every": 5000, "num_batches": 4})
    config.preview = ConfigDict({"every": 5000})
    config.tracking = ConfigDict({"backends": ("local",)})
    # Devices per sharding axis; data parallelism takes the rest (devices: 0 = all of them).
    config.mesh = ConfigDict({"model": 1, "fsdp": 1, "devices": 0})
    return config

"""EDM video diffusion on moving digits: clips of 8 frames, 16x16, one handwritten digit gliding
and bouncing (``dew/data/sources/moving_digits.py`` documents the generator and the split).

    python -m dew.main --config=experiments/video_edm.py --workdir=runs/video

The same ``diffusion`` objective as the image runs (EDM preconditioning, loss weight and σ
schedule, class-conditional with condition dropout for CFG) with a space-time U-Net
(``video_unet``: (2+1)-D convolutions, spatial downsampling only, factorised space/time
attention at 8x8), 16 channels and 16 clips a batch: sized for ~30 min on 2 CPU cores (0.8 s a
step; at 32 channels and 32 clips a step takes ~6 s there). Previews are ``VideoGrid`` GIFs,
one row per class. Whether the motion is learned: ``experiments/video_motion.py
--workdir=runs/video`` compares per-frame digit-classifier accuracy and frame-to-frame
displacement of generated and real clips.
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    config = ConfigDict()
    config.seed = 0
    config.dataset = ConfigDict({"name": "moving_digits", "batch_size": 16})
    config.objective = ConfigDict(
        {
            "name": "diffusion",
            "preset": "EDM",
            "condition_dropout": 0.1,
            "sampling": {"steps": 18, "solver": "heun", "per_class": 2, "guidance": 1.0},
        }
    )
    config.model = ConfigDict({"name": "video_unet", "channels": 16, "channel_mult": (1, 2), "num_blocks": 1})
    config.optimizer = ConfigDict({"learning_rate": 2e-3, "warmup_steps": 100, "grad_clip": 1.0})
    config.ema = ConfigDict({"decay": 0.995})
    config.train = ConfigDict({"num_steps": 2000, "log_every": 50})
    config.eval = ConfigDict({"every": 500, "num_batches": 2})
    config.preview = ConfigDict({"every": 1000})
    config.checkpoint = ConfigDict({"every": 500})
    return config

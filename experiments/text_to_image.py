"""Text-to-image digits: EDM conditioned on a caption ("a handwritten seven", "the number 7", ...)
through ``InputSpec({"label": Condition("byte_text", Field("text", (32,), "int32"), "")})``: the
``byte_text`` encoder (a small transformer over UTF-8 bytes) trained jointly with the U-Net, the
empty caption as the unconditional branch (condition dropout 0.1).

    python -m dew.main --config=experiments/text_to_image.py --workdir=runs/text_to_image

Previews are captioned ``ImageGrid``s, one row per prompt "a handwritten <digit>", with CFG
weight 2 applied only inside σ ∈ (0.28, 2.9] (the guidance interval, on the text condition).
``dew.pipeline(workdir)(prompts=("a seven", "the number 3"))`` draws for any caption.
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    config = ConfigDict()
    config.seed = 0
    config.dataset = ConfigDict({"name": "digits_text", "batch_size": 64})
    config.objective = ConfigDict(
        {
            "name": "diffusion",
            "preset": "EDM",
            "condition": "text",
            "condition_dropout": 0.1,
            "sampling": {
                "steps": 18,
                "solver": "heun",
                "per_class": 6,
                "guidance": 2.0,
                "guidance_interval": (0.28, 2.9),
            },
        }
    )
    config.model = ConfigDict(
        {"name": "unet", "channels": 32, "channel_mult": (1, 2), "num_blocks": 1, "attn_resolutions": (4,)}
    )
    config.optimizer = ConfigDict({"learning_rate": 2e-3, "warmup_steps": 200, "grad_clip": 1.0})
    config.ema = ConfigDict({"decay": 0.999})
    config.train = ConfigDict({"num_steps": 3000, "log_every": 50})
    config.eval = ConfigDict({"every": 1000, "num_batches": 2})
    config.preview = ConfigDict({"every": 1000, "metrics": ("digits_class_accuracy",)})
    config.checkpoint = ConfigDict({"every": 1000})
    return config

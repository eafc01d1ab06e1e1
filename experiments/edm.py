"""Class-conditional EDM (Karras et al. 2022) on scikit-learn's 8x8 handwritten digits.

Run it (trains, samples, checkpoints and logs under --workdir; run again to resume):

    python -m dew.main --config=experiments/edm.py --workdir=runs/edm

Override any key from the command line, e.g. a two-minute smoke run:

    python -m dew.main --config=experiments/edm.py --workdir=runs/edm_smoke \
        --config.train.num_steps=300 --config.eval.every=100 --config.preview.every=100

Every key, its default and its meaning: add --help-config. Keys this file leaves out take their
defaults and can still be set from the command line.
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    config = ConfigDict()
    config.seed = 0

    # The embedded default: 1,617 training / 180 validation digits, no download.
    config.dataset = ConfigDict({"name": "digits", "batch_size": 64})

    # EDM preconditioning, loss weighting and σ schedule (Table 1, "EDM" column). Condition
    # dropout (EDM's label_dropout) is 0 as in EDM: it costs accuracy on short runs and only
    # serves classifier-free guidance; set it (e.g. 0.1) for runs sampled with guidance > 1.
    # Previews: one row per class, sampled with Heun's method on the EDM σ schedule. guidance:
    # CFG weight (1 = none); guidance_interval: () for the whole σ range, or (sigma_lo, sigma_hi)
    # to guide only there (e.g. (0.28, 2.9)).
    config.objective = ConfigDict(
        {
            "name": "diffusion",
            "preset": "EDM",
            "condition_dropout": 0.0,
            "sampling": {
                "steps": 18,
                "solver": "heun",
                "per_class": 10,
                "guidance": 1.0,
                "guidance_interval": (),
            },
        }
    )

    # EDM's DDPM++ network (NVlabs/edm SongUNet, exact: dew.models["songunet"]) at CPU scale:
    # 8x8 -> 4x4, two blocks per level, attention at 4x4 (1.03 M parameters with 10 classes).
    # The other SongUNet arguments keep the reference's defaults (DDPM++: positional embedding,
    # standard encoder/decoder, [1, 1] resampling filter; NCSN++ is embedding_type="fourier",
    # channel_mult_noise=2, encoder_type="residual", resample_filter=(1, 3, 3, 1)).
    config.model = ConfigDict(
        {
            "name": "songunet",
            "model_channels": 32,
            "channel_mult": (1, 2),
            "channel_mult_emb": 4,
            "num_blocks": 2,
            "attn_resolutions": (4,),
            "dropout": 0.10,
            "embedding_type": "positional",
            "channel_mult_noise": 1,
            "encoder_type": "standard",
            "decoder_type": "standard",
            "resample_filter": (1, 1),
        }
    )

    # Adam as EDM trains (no gradient clipping), without a learning-rate warm-up: on this data
    # the reference recipe learns fastest from the first step, and a fixed warm-up of a few
    # hundred steps costs short runs points. warmup_steps > 0 and grad_clip > 0
    # remain available.
    config.optimizer = ConfigDict(
        {
            "learning_rate": 2e-3,
            "warmup_steps": 0,
            "b1": 0.9,
            "b2": 0.999,
            "grad_clip": 0.0,
        }
    )
    # EMA of the weights, zero-initialised and debiased. EDM's half-life with ramp-up (in
    # optimizer updates): β_n = 0.5^(1/min(half_life, ramp_up·n)), so the average spans the last
    # 5 % of the run early on (25 updates at step 500) and at most half_life = 500 updates (200 at
    # step 4,000): one default that is useful after 500 steps as after 4,000. half_life 0 falls
    # back to the constant `decay`. tracks: a regex searched in each parameter path ("" = every leaf).
    # power_std_rels: power-function EMA profiles tracked for post-hoc EMA (EDM2; e.g. (0.05, 0.1);
    # () = off), snapshots every snapshot_every steps (0 = checkpoint.every) under
    # <workdir>/power_ema; `python -m dew.phema --sigma_rel=...` reconstructs any width.
    config.ema = ConfigDict(
        {
            "decay": 0.999,
            "half_life": 500.0,
            "ramp_up": 0.05,
            "tracks": "",
            "power_std_rels": (),
            "snapshot_every": 0,
        }
    )

    # accumulation: micro-batches of dataset.batch_size per optimizer update (num_steps counts
    # micro-batches). nonfinite: "stop" (raise naming the step and the last good checkpoint) or
    # "skip" (drop that update and count it in the logged metrics). max_skipped: the skip policy's
    # brake, the fraction of a log_every window's updates it may drop before the run stops as
    # "stop" would (after saving the state, which skipped updates never touched; 1: no brake).
    config.train = ConfigDict(
        {"num_steps": 4000, "log_every": 50, "accumulation": 1, "nonfinite": "stop", "max_skipped": 0.5}
    )

    # Devices per sharding axis; data parallelism takes the rest (devices: 0 = all of them).
    config.mesh = ConfigDict({"model": 1, "fsdp": 1, "devices": 0})

    # One profiler window per run: `steps` steps traced after `warmup` steps (0 steps = off);
    # directory "" = <workdir>/profile.
    config.profile = ConfigDict({"steps": 0, "warmup": 5, "directory": ""})

    # Checkpoints (`--help-config` documents every key): the latest `keep` plus
    # the best; resume from the latest when the workdir has one.
    config.checkpoint = ConfigDict(
        {
            "directory": None,
            "every": 500,
            "keep": 2,
            "keep_best": True,
            "best_metric": "loss",
            "asynchronous": True,
            "local_directory": None,
            "local_every": None,
            "restore_checkpoint_if_exists": True,
            "step_to_restore": None,
            "restore_dir": None,
            "restore_optimizer_state": True,
            "restore_rng_key": True,
            "clear_previous_checkpoints": False,
            "on_rollback": "move",
        }
    )
    # Held-out loss every 1000 steps (ranks the best checkpoint); previews on their own cadence,
    # scored by an independent digit classifier.
    config.eval = ConfigDict({"every": 1000, "num_batches": 2})
    config.preview = ConfigDict({"every": 1000, "metrics": ("digits_class_accuracy",)})

    # backends: any of ("local", "tensorboard", "mlflow", "wandb"). mlflow_uri "" keeps an
    # embedded sqlite store under the workdir; wandb_mode "online" needs the user's W&B key.
    config.tracking = ConfigDict(
        {
            "backends": ("local",),
            "mlflow_uri": "",
            "mlflow_experiment": "dew",
            "wandb_project": "dew",
            "wandb_mode": "offline",
        }
    )
    return config

"""Each modality's experiment file end to end through the unchanged Trainer, at a few steps with
tiny models: language (TextSamples + TokenScores), video (VideoGrid GIF), representations
(Representations + the linear probe), text-to-image (captioned ImageGrid with interval CFG)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
from PIL import GifImagePlugin, Image

import dew
from dew.config import apply_overrides, load_config
from dew.objectives.contrastive import Contrastive
from dew.scoring.linear_probe import linear_probe, probe_accuracy
from dew.training.trainer import Trainer

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMMON = [
    "config.mesh.devices=1",
    "config.train.log_every=2",
    "config.checkpoint.every=2",
    "config.checkpoint.keep_best=False",
]


def train(experiment: str, workdir: pathlib.Path, overrides: list[str]) -> Trainer:
    config = apply_overrides(load_config(str(ROOT / "experiments" / experiment)), COMMON + overrides)
    trainer = Trainer(config, str(workdir))
    trainer.run()
    return trainer


def rows(workdir: pathlib.Path) -> list[dict]:
    text = (workdir / "tracking" / "scalars.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_language_model_reports_bits_per_byte_token_scores_and_continues_prompts(tmp_path):
    workdir = tmp_path / "lm"
    train(
        "lm.py",
        workdir,
        [
            "config.dataset.batch_size=4",
            "config.model.width=16",
            "config.model.depth=1",
            "config.model.heads=2",
            "config.objective.new_tokens=8",
            "config.objective.score_rows=2",
            "config.train.num_steps=2",
            "config.eval.every=2",
            "config.eval.num_batches=1",
            "config.preview.every=2",
        ],
    )
    (evaluation,) = [r for r in rows(workdir) if r["category"] == "eval"]
    # An untrained byte model is near uniform: ~8 bits per byte (log2 256), far above 1.
    assert 6.0 < evaluation["bits_per_byte"] < 10.0
    text = (workdir / "tracking" / "text" / "samples_00000002.txt").read_text()
    assert "0: [import ] " in text and "1: [def __init__(self] " in text
    page = (workdir / "tracking" / "scores" / "token_scores_00000002.html").read_text()
    assert page.count("<span") == 2 * 128 and "bits per counted target" in page
    task = dew.pipeline(str(workdir))
    samples = task(prompts=("while ",), new_tokens=5, temperature=0.0)
    assert samples.tokens.shape == (1, 5) and samples.prompt == ("while ",)


def test_video_diffusion_previews_gifs_of_moving_digit_clips(tmp_path):
    workdir = tmp_path / "video"
    train(
        "video_edm.py",
        workdir,
        [
            "config.dataset.batch_size=4",
            "config.model.channels=8",
            "config.model.channel_mult=(1,)",  # one level halves the compile; test_video_unet covers two
            "config.objective.sampling.steps=3",
            "config.objective.sampling.per_class=1",
            "config.train.num_steps=2",
            "config.eval.every=0",
            "config.preview.every=2",
        ],
    )
    gif = Image.open(workdir / "tracking" / "videos" / "samples_00000002.gif")
    assert isinstance(gif, GifImagePlugin.GifImageFile) and gif.n_frames == 8
    # The preview's own setting: the pipeline reuses its program (explicit classes take the image
    # path's code, covered by test_pipeline).
    clips = dew.pipeline(str(workdir))()
    assert clips.clips.shape == (10, 8, 16, 16, 1)


def test_contrastive_encoder_emits_representations_scored_by_the_linear_probe(tmp_path):
    workdir = tmp_path / "probe"
    trainer = train(
        "probe.py",
        workdir,
        [  # the default batch sizes: 256 to train, 120 of the 180 validation digits to evaluate
            "config.model.features=8",
            "config.model.width=4",
            "config.objective.probe_train=40",
            "config.train.num_steps=2",
            "config.eval.every=2",
            "config.preview.every=2",
        ],
    )
    (scored,) = [r for r in rows(workdir) if "linear_probe" in r]
    scatter = Image.open(workdir / "tracking" / "representations" / "samples_00000002.png")
    assert scatter.size == (560, 480)
    reps = dew.pipeline(str(workdir))()  # the preview's own representations, reproduced exactly
    assert reps.features.shape == (220, 8)
    # The recorded score is the probe on these representations (the even rows held out) ...
    assert scored["linear_probe"] == linear_probe(reps)
    assert isinstance(trainer.objective, Contrastive) and trainer.objective.probe_images is not None
    assert scored["linear_probe_pixels"] == probe_accuracy(trainer.objective.probe_images, reps.labels)
    # ... and reads the labels from them: a probe whose predictions ignored the labels would score
    # the share q of the held-out rows' commonest label on average, with a standard deviation of at
    # most √(q(1 − q)/n); both scores must lie above that by 4 standard deviations.
    held = reps.labels[::2]
    q = np.bincount(held).max() / len(held)
    chance = q + 4 * np.sqrt(q * (1 - q) / len(held))
    assert scored["linear_probe"] > chance and scored["linear_probe_pixels"] > chance, (scored, chance)


def test_text_to_image_previews_are_captioned_and_guided_in_an_interval(tmp_path):
    workdir = tmp_path / "t2i"
    trainer = train(
        "text_to_image.py",
        workdir,
        [
            "config.dataset.batch_size=16",
            "config.model.channels=8",
            "config.model.channel_mult=(1,)",  # one level: captions and guidance need no depth
            "config.model.attn_resolutions=()",
            "config.objective.sampling.steps=3",
            "config.objective.sampling.per_class=1",
            "config.preview.metrics=()",
            "config.train.num_steps=2",
            "config.eval.every=0",
            "config.preview.every=2",
        ],
    )
    spec = trainer.objective.input_spec
    assert spec.conditions["label"].encoder == "byte_text" and spec.conditions["label"].field.name == "text"
    grid = Image.open(workdir / "tracking" / "images" / "samples_00000002.png")
    plain_height = 10 * 8 * 8  # ten rows of 8x8 digits enlarged 8x, before captions and gutters
    assert grid.mode == "RGB" and grid.height > plain_height
    images = dew.pipeline(str(workdir))(prompts=("a handwritten seven", "the number 3"), guidance=2.0)
    assert images.captions == ("a handwritten seven", "the number 3")
    assert np.isfinite(images.images).all()

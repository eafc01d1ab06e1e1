"""The Objective contract is all the Trainer knows: a non-diffusion objective, defined here and
registered by this file (dew does not ship it), with a config section of its own, trains,
evaluates, previews (``TextSamples`` of predicted labels), checkpoints and resumes through the
unchanged ``Trainer`` and through ``python -m dew.main``."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_common import ROOT

from dew import registry
from dew.artifacts import TextSamples
from dew.inputs import Field, InputSpec
from dew.schema import ConfigError, Key, Section
from dew.training.objective import Artifact, Aux, Objective, Step

NAME = "test_digit_classifier"


class DigitClassifier(Objective):
    """A one-hidden-layer classifier of the 8x8 digits under cross-entropy. Its preview labels a
    fixed set of training digits; its evaluation reports the accuracy beside the loss."""

    input_spec = InputSpec(Field("image", (8, 8, 1)))

    def __init__(self, hidden: int, shown: np.ndarray, truth: np.ndarray):
        self.hidden, self.shown, self.truth = hidden, shown, truth

    @classmethod
    def config_section(cls) -> Section:
        def validate(section, path):
            if section.shown > 64:
                raise ConfigError(f"config.{path}.shown={section.shown} is invalid: expected at most 64")

        return Section(
            "a digit classifier (defined in a test)",
            {
                "hidden": Key(32, "hidden units", check=lambda v: v >= 1, accepted="an int >= 1"),
                "shown": Key(
                    10, "training digits a preview labels", check=lambda v: v >= 1, accepted="an int >= 1"
                ),
            },
            validate=validate,
        )

    @classmethod
    def from_config(cls, config, source):
        n = config.objective.shown
        return cls(
            config.objective.hidden, np.asarray(source.fields["image"][:n]), source.fields["label"][:n]
        )

    def init(self, rng, batch):
        k1, k2 = jax.random.split(rng)
        return {
            "w1": jax.random.normal(k1, (64, self.hidden)) / 8.0,
            "b1": jnp.zeros(self.hidden),
            "w2": jax.random.normal(k2, (self.hidden, 10)) / np.sqrt(self.hidden),
            "b2": jnp.zeros(10),
        }

    def logits(self, params, images):
        h = jnp.tanh(images.reshape(images.shape[0], -1) @ params["w1"] + params["b1"])
        return h @ params["w2"] + params["b2"]

    def loss(self, params, rng, batch, step: Step):
        logits = self.logits(params, batch["image"])
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["label"][:, None], axis=1)[:, 0]
        accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
        return jnp.mean(nll), ({"accuracy": accuracy}, Aux())

    def preview(self, params, rng) -> Artifact:
        predicted = np.asarray(jnp.argmax(self.logits(params, jnp.asarray(self.shown)), -1))
        text = tuple(f"true {t} predicted {p}" for t, p in zip(self.truth, predicted, strict=True))
        return TextSamples(predicted[:, None].astype(np.int32), text=text)


class Unseen(DigitClassifier):
    """The same classifier without a preview."""

    preview = Objective.preview


if NAME not in registry.objectives:
    registry.objectives.register(NAME, DigitClassifier)
    registry.objectives.register(NAME + "_unseen", Unseen)


def classifier_config(**overrides):
    from ml_collections import ConfigDict

    from dew.config import apply_overrides

    config = ConfigDict()
    config.dataset = ConfigDict({"name": "digits", "batch_size": 32})
    config.objective = ConfigDict({"name": NAME, "hidden": 16, "shown": 12})
    config.optimizer = ConfigDict({"learning_rate": 1e-2})
    config.ema = ConfigDict({"decay": 0.9})
    config.train = ConfigDict({"num_steps": 60, "log_every": 10})
    config.checkpoint = ConfigDict({"every": 20, "keep": 1, "asynchronous": False})
    config.eval = ConfigDict({"every": 20, "num_batches": 5})
    config.preview = ConfigDict({"every": 30})
    config.mesh = ConfigDict({"devices": 1})
    return apply_overrides(config, [f"config.{k}={v}" for k, v in overrides.items()])


def rows(workdir):
    return [json.loads(line) for line in (workdir / "tracking" / "scalars.jsonl").read_text().splitlines()]


def test_the_objective_declares_its_section_and_defaults_fill_the_rest():
    config = classifier_config()
    assert config.objective.hidden == 16 and config.objective.shown == 12
    assert config.model.name is None  # no network from the registry: the objective has its own
    assert "preset" not in config.objective and "sampling" not in config
    with pytest.raises(ConfigError, match=r"unknown config key 'config.objective.hiden'.*'hidden'"):
        classifier_config(**{"objective.hiden": 3})
    with pytest.raises(ConfigError, match=r"config.objective.shown=65 is invalid: expected at most 64"):
        classifier_config(**{"objective.shown": 65})


def test_cadences_the_objective_or_the_config_cannot_serve_are_said_at_start(tmp_path, capsys):
    from dew.training.trainer import Trainer

    Trainer(classifier_config(**{"eval.every": 0}), str(tmp_path / "a"))
    err = capsys.readouterr().err
    assert "warning: config.checkpoint.keep_best=True but config.eval.every=0" in err and err.count("\n") == 1
    Trainer(classifier_config(**{"eval.every": 0, "checkpoint.keep_best": False}), str(tmp_path / "b"))
    assert capsys.readouterr().err == ""
    with pytest.raises(ConfigError, match=r"config.preview.every=30 is invalid: Unseen has no preview"):
        Trainer(classifier_config(**{"objective.name": NAME + "_unseen"}), str(tmp_path / "c"))
    with pytest.raises(ConfigError, match=r"config.preview.metrics=\('digits_class_accuracy',\) is invalid"):
        Trainer(classifier_config(**{"preview.metrics": "('digits_class_accuracy',)"}), str(tmp_path / "d"))
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_classifier_trains_evaluates_previews_and_resumes_through_the_trainer(tmp_path):
    from dew.training.trainer import Trainer

    straight = Trainer(classifier_config(), str(tmp_path / "straight")).run()
    workdir = tmp_path / "straight"
    evals = [r for r in rows(workdir) if r["category"] == "eval"]
    assert [r["step"] for r in evals] == [20, 40, 60]
    # Chance is 1/10; a classifier that learned nothing cannot reach half the validation digits.
    assert evals[-1]["accuracy"] > 0.5 and evals[-1]["loss"] < evals[0]["loss"]
    # Previews on their own cadence (30, 60 and the end), as text lines of predicted labels.
    text = (workdir / "previews" / "samples.txt").read_text().splitlines()
    assert len(text) == 12 and all("predicted" in line for line in text)
    assert sorted(p.name for p in (workdir / "previews").glob("samples_*.txt")) == [
        "samples_00000030.txt",
        "samples_00000060.txt",
    ]
    # The best checkpoint is ranked by the evaluation loss and kept beside the latest.
    trainer = Trainer(classifier_config(), str(workdir))
    assert trainer.checkpoints is not None
    best = trainer.checkpoints.best
    losses = {r["step"]: r["loss"] for r in evals}
    assert best == min(losses, key=lambda step: losses[step])
    assert trainer.checkpoints.latest == 60

    # Stopped at 40 and resumed: the same final state, bit for bit.
    first = Trainer(classifier_config(**{"train.num_steps": 40}), str(tmp_path / "resumed")).run()
    assert int(first.step) == 40
    resumed = Trainer(classifier_config(), str(tmp_path / "resumed")).run()
    for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


EXPERIMENT = """
import sys
sys.path[:0] = [{here!r}, {tests!r}]  # this file's folder, and tests/ for its helpers
import test_objective_contract  # registers the classifier, as a user's own module would

def get_config():
    return test_objective_contract.classifier_config(**{{"train.num_steps": {steps}}})
"""


@pytest.mark.slow
def test_the_command_line_runs_and_resumes_an_objective_dew_does_not_ship(tmp_path):
    def run(steps: int, *extra: str) -> subprocess.CompletedProcess:
        path = tmp_path / f"classifier_{steps}.py"
        here = str(pathlib.Path(__file__).resolve().parent)
        path.write_text(EXPERIMENT.format(here=here, tests=str(ROOT / "tests"), steps=steps))
        command = [
            sys.executable,
            "-m",
            "dew.main",
            f"--config={path}",
            f"--workdir={tmp_path / 'cli'}",
            *extra,
        ]
        return subprocess.run(command, capture_output=True, text=True, cwd=ROOT)

    help_text = run(20, "--help-config")
    assert help_text.returncode == 0, help_text.stderr
    assert "objective.hidden = 16 (default 32)  [int] hidden units" in help_text.stdout
    assert not (tmp_path / "cli").exists()

    first = run(20, "--config.preview.every=20")
    assert first.returncode == 0, first.stderr
    assert "done at step 20" in first.stdout
    again = run(40, "--config.preview.every=20")
    assert again.returncode == 0, again.stderr
    assert "resuming from step 20" in again.stdout and "done at step 40" in again.stdout
    assert (tmp_path / "cli" / "previews" / "samples_00000040.txt").exists()
    assert [r["step"] for r in rows(tmp_path / "cli") if r["category"] == "eval"] == [20, 40]


def test_restore_ema_debiases_a_half_life_accumulation_run_on_its_own(tmp_path):
    """The checkpoint records the EMA (half-life, ramp-up, tracked leaves, accumulation), so a
    reader that knows nothing of the run gets exactly the Trainer's own debiased EMA."""
    from dew.averaging import ema as ema_lib
    from dew.checkpointing import Checkpoints
    from dew.training.trainer import Trainer

    overrides = {
        "ema.half_life": 3.0,
        "ema.ramp_up": 0.5,
        "ema.tracks": "w",  # the weights only: biases hold the live parameters
        "train.accumulation": 2,
        "train.num_steps": 10,
        "eval.every": 0,
        "preview.every": 0,
        "checkpoint.every": 10,
    }
    trainer = Trainer(classifier_config(**overrides), str(tmp_path / "run"))
    state = trainer.run()
    expected = trainer.debiased_ema(state)

    reader = Checkpoints(str(tmp_path / "run" / "checkpoints"))  # no EMA given: read from disk
    template = jax.eval_shape(trainer.programs.init, jax.random.PRNGKey(0), trainer.example_batch()).params
    restored = reader.restore_ema(template)
    at_step = reader.restore_ema(template, 10)
    for a, b, c in zip(
        jax.tree.leaves(expected), jax.tree.leaves(restored), jax.tree.leaves(at_step), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
    np.testing.assert_array_equal(np.asarray(restored["b1"]), np.asarray(state.params["b1"]))
    # What callers used to pass (the config's decay, no accumulation) would be wrong here:
    spec = trainer.averages.ema.law_spec
    naive = ema_lib.debias(state.ema, spec, 10)  # 10 micro-batches taken for 10 updates
    assert not np.allclose(np.asarray(naive["w1"]), np.asarray(expected["w1"]))
    with pytest.raises(ValueError, match="contradicts the EMA"):
        reader.restore_ema(template, decay=0.9)
    with pytest.raises(ValueError, match="contradicts the 2 micro-batches"):
        reader.restore_ema(template, accumulation=1)
    with pytest.raises(TypeError, match="step must be an int"):
        reader.restore_ema(template, 0.9)  # pyright: ignore[reportArgumentType]  # the refusal under test
    assert reader.restore_ema(template, decay=spec, accumulation=2)["w2"].shape == (16, 10)

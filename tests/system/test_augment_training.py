"""Augmentation inside diffusion training (NVlabs/edm loss.py: ``y, augment_labels =
augment_pipe(images)`` before noising): a run with it on resumes bit-exactly, the labels reach
the network's ``map_augment``, sampling sees zero labels, and bad combinations are one line."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_common import tiny_config
from test_training import assert_states_identical

from dew.objectives.diffusion import Diffusion
from dew.schema import ConfigError
from dew.training.build import build_objective, open_split
from dew.training.objective import Step
from dew.training.trainer import Trainer

# The paper's CIFAR-10 setting (train.py --augment), at p=0.5 so each batch mixes both branches.
PAPER = {
    "objective.augment.p": 0.5,
    "objective.augment.xflip": 1e8,
    "objective.augment.yflip": 1.0,
    "objective.augment.scale": 1.0,
    "objective.augment.rotate_frac": 1.0,
    "objective.augment.aniso": 1.0,
    "objective.augment.translate_frac": 1.0,
    "model.augment_dim": 9,
}
QUICK = {"preview.every": 1000, "eval.every": 1000}  # no previews or evaluation: compile less


def test_a_run_with_augmentation_resumes_bit_exactly(tmp_path):
    straight = Trainer(tiny_config(**PAPER, **QUICK, **{"train.num_steps": 4}), str(tmp_path / "a")).run()
    interrupted = tmp_path / "b"
    first = Trainer(
        tiny_config(**PAPER, **QUICK, **{"train.num_steps": 2, "checkpoint.every": 2}), str(interrupted)
    ).run()
    assert int(first.step) == 2
    resumed = Trainer(tiny_config(**PAPER, **QUICK, **{"train.num_steps": 4}), str(interrupted)).run()
    assert_states_identical(straight, resumed)


def _objective_and_batch(**overrides):
    config = tiny_config(**overrides)
    source = open_split(config.dataset, "train")
    objective = build_objective(config, source)
    assert isinstance(objective, Diffusion)
    field = source.sample_field
    batch = {
        field: jnp.asarray(np.asarray(source.fields[field][:8]), jnp.float32),
        "label": jnp.asarray(np.asarray(source.fields["label"][:8]), jnp.int32),
    }
    return objective, batch


def test_the_batch_is_augmented_the_labels_reach_map_augment_and_sampling_sees_zeros():
    augmented, batch = _objective_and_batch(**PAPER)
    plain, _ = _objective_and_batch(**{**PAPER, "objective.augment.p": 0.0})
    assert augmented.augment is not None
    assert augmented.augment.label_dim == 9 and augmented.feeds_augment_labels
    assert plain.augment is None and not plain.feeds_augment_labels  # p=0: the loss of before
    params = jax.jit(augmented.init)(jax.random.PRNGKey(0), batch)
    step = Step(index=jnp.int32(0))
    key = jax.random.PRNGKey(1)

    x = jax.random.normal(jax.random.PRNGKey(2), batch[augmented.input_spec.sample.name].shape)
    conditions = {"label": batch["label"]}

    def everything(p):  # one compile for all the checks
        loss, grads = jax.value_and_grad(lambda q: augmented.loss(q, key, batch, step)[0])(p)
        plain_loss = plain.loss(p, key, batch, step)[0]
        zeros = jnp.zeros((x.shape[0], 9))
        sigma = jnp.float32(1.0)
        without = augmented.denoiser(p, conditions)(x, sigma)
        with_zeros = augmented.denoiser(p, conditions, None, False, zeros)(x, sigma)
        return loss, grads, plain_loss, without, with_zeros

    loss, grads, plain_loss, without, with_zeros = jax.jit(everything)(params)
    augment_grads = [leaf for k, v in grads.items() if "map_augment" in k for leaf in jax.tree.leaves(v)]
    assert augment_grads and all(float(jnp.max(jnp.abs(g))) > 0 for g in augment_grads)
    # The same key without augmentation: another loss, as the pipeline changed the batch.
    assert float(loss) != float(plain_loss)
    # Previews and the pipeline pass no labels: the network takes zeros ("not augmented").
    assert np.array_equal(np.asarray(without), np.asarray(with_zeros))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {**PAPER, "model.augment_dim": 4},
            r"^config.model.augment_dim=4 is invalid: config.objective.augment gives 9 augmentation "
            r"labels; expected 9 \(or 0",
        ),
        (
            {
                "objective.augment.p": 0.5,
                "objective.augment.brightness": 1.0,
                "dataset.name": "gaussian_mixture",
            },
            r"^config.objective.augment.p=0.5 is invalid for samples of shape \(2,\)",
        ),
    ],
)
def test_bad_combinations_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as caught:
        _objective_and_batch(**overrides)
    assert "\n" not in str(caught.value)

"""Data sources: tfds by name through tfds.data_source + grain (no TensorFlow), tested on
tfds.testing.mock_data; the 2D Gaussian-mixture toy and its exact denoiser."""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew
from dew.data import DataPartition, Dataset
from dew.data.sources.mixture import RING, GaussianMixture

ROOT = pathlib.Path(__file__).resolve().parents[2]
tfds = pytest.importorskip("tensorflow_datasets")


def test_oxford_flowers102_by_name_is_cropped_resized_and_resumable():
    with tfds.testing.mock_data(num_examples=12):
        source = dew.datasets["oxford_flowers102"]("train", resolution=16)
        assert source.fields["image"].shape == (12, 16, 16, 3)
        assert source.num_classes == 102 and len(source) == 12
        straight = Dataset(source, 4, seed=2, share=DataPartition(0, 1))
        first = next(straight)
        assert first["image"].shape == (4, 16, 16, 3) and first["image"].dtype == np.float32
        assert first["label"].shape == (4,) and first["label"].dtype == np.int32
        assert first["image"].min() >= -1.0 and first["image"].max() <= 1.0
        assert first["label"].min() >= 0 and first["label"].max() < 102
        saved = straight.save_position()
        resumed = Dataset(source, 4, seed=2)
        resumed.read_position(saved)
        assert resumed.save_position() == saved == b'{"batch": 1, "epoch": 0}'
    assert "tensorflow" not in sys.modules  # tfds ran without TensorFlow


def test_the_trainer_passes_the_configured_resolution(tmp_path):
    from dew.config import apply_overrides, load_config
    from dew.training.trainer import Trainer

    config = load_config(str(ROOT / "experiments" / "flowers.py"))
    config = apply_overrides(
        config,
        [
            "config.dataset.resolution=8",
            "config.dataset.batch_size=4",
            "config.eval.num_batches=1",
            "config.mesh.devices=1",
        ],
    )
    with tfds.testing.mock_data(num_examples=8):
        trainer = Trainer(config, str(tmp_path / "run"))
    assert trainer.train_source.fields["image"].shape == (8, 8, 8, 3)
    assert trainer.objective.input_spec.sample.shape == (8, 8, 3)
    assert trainer.objective.input_spec.conditions["label"].encoder == "class_label"


def test_a_missing_prepared_dataset_says_how_to_prepare_it(tmp_path, capsys):
    from dew.main import main

    code = main(
        [
            f"--config={ROOT / 'experiments' / 'flowers.py'}",
            f"--workdir={tmp_path / 'run'}",
            f"--config.dataset.data_dir={tmp_path / 'empty'}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "'oxford_flowers102' is not prepared in array_record format" in err
    assert "download_and_prepare()" in err and "Traceback" not in err
    with pytest.raises(ValueError, match="no tfds data set named 'no_such_set'"):
        from dew.data.sources.tfds_source import tfds_source

        tfds_source("no_such_set", data_dir=str(tmp_path))


def test_the_mixture_toy_and_its_exact_denoiser():
    source = dew.datasets["gaussian_mixture"]("train")
    assert source.fields["x"].shape == (20_000, 2) and source.sample_field == "x"
    assert np.mean(np.linalg.norm(source.fields["x"], axis=1)) == pytest.approx(1.0, abs=0.03)
    # Tweedie: D(x; σ) = x + σ² ∇ log p_σ(x); check against autodiff of the noisy log density.
    means, var = jnp.asarray(RING.means), jnp.asarray(RING.stds) ** 2

    def log_p(x, sigma):
        total = var + sigma**2
        sq = jnp.sum((x - means) ** 2, -1)
        return jax.nn.logsumexp(jnp.log(jnp.asarray(RING.weights)) - jnp.log(total) - 0.5 * sq / total)

    x = jax.random.normal(jax.random.PRNGKey(0), (16, 2)) * 1.5
    for sigma in (0.05, 0.5, 5.0):
        tweedie = x + sigma**2 * jax.vmap(jax.grad(log_p), (0, None))(x, sigma)
        np.testing.assert_allclose(RING.denoise(x, jnp.asarray(sigma)), tweedie, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="weights must sum to 1"):
        GaussianMixture(((0.0, 0.0),), (1.0,), (0.5,))


def test_digits_are_load_digits_read_without_importing_scikit_learn(monkeypatch):
    import subprocess

    from sklearn.datasets import load_digits
    from sklearn.utils import Bunch

    from dew.data.sources import digits as digits_module

    raw = load_digits()
    assert isinstance(raw, Bunch)  # not return_X_y
    pixels, labels = digits_module.load_pixels_and_labels()
    np.testing.assert_array_equal(pixels, raw.data)
    np.testing.assert_array_equal(labels, raw.target)
    train, validation = digits_module.digits("train"), digits_module.digits("validation")
    assert len(train) == 1617 and len(validation) == 180
    np.testing.assert_array_equal(validation.fields["label"], raw.target[::10])
    # Where the shipped file is not found, load_digits itself gives the same split.
    monkeypatch.setattr(digits_module, "shipped_file", lambda: None)
    fallback = digits_module.digits("validation")
    np.testing.assert_array_equal(fallback.fields["image"], validation.fields["image"])
    # The default run's data costs no scikit-learn import (1-2.5 s before the compile can start).
    code = "import sys, dew; dew.datasets['digits']('train'); print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"

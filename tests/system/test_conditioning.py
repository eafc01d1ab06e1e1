"""Conditions: the byte-level text encoder, tokens of the unconditional datum, condition dropout,
and a text-conditioned digits run through the Trainer."""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_cli import rows

import dew
from dew.artifacts import ImageGrid
from dew.encoding.byte_text import ByteText, detokenize, tokenize
from dew.inputs import Condition, Field, InputSpec
from dew.objectives.diffusion import Diffusion


def test_tokenize_is_bytes_plus_one_padded_and_round_trips():
    row = tokenize("a handwritten seven", 32)
    assert row.shape == (32,) and row.dtype == np.int32
    assert row[0] == ord("a") + 1 and np.all(row[19:] == 0)
    assert detokenize(row) == "a handwritten seven"
    assert detokenize(tokenize("ünïcode", 4)) == "ün\ufffd"  # cut inside a 2-byte character
    np.testing.assert_array_equal(tokenize(["", "ab"], 3), [[0, 0, 0], [98, 99, 0]])


def test_byte_text_embeds_prompts_and_maps_the_empty_prompt_to_zero():
    net = hk.without_apply_rng(
        hk.transform(lambda t: ByteText(width=16, layers=1, heads=2, max_length=16)(t))
    )
    tokens = jnp.asarray(tokenize(["a handwritten seven", "a handwritten one", ""], 16))
    params = net.init(jax.random.PRNGKey(0), tokens)
    out = net.apply(params, tokens)
    assert out.shape == (3, 16)
    np.testing.assert_array_equal(out[2], 0.0)
    assert float(jnp.abs(out[0] - out[1]).max()) > 1e-4
    assert dew.encoders["byte_text"] is ByteText


def test_condition_dropout_substitutes_the_encoders_unconditional_tokens():
    spec = InputSpec(Field("x", (2,)), {"label": Condition("byte_text", Field("text", (8,), "int32"), "")})
    objective = Diffusion(
        spec,
        dew.presets.EDM,
        lambda: dew.models["mlp"](width=8, blocks=1),
        {"label": lambda: ByteText(width=8, layers=1, heads=2, max_length=8)},
        0.5,
    )
    tokens = jnp.asarray(tokenize(["seven"] * 256, 8))
    dropped = objective._drop(jax.random.PRNGKey(0), {"label": tokens})["label"]
    empty = np.all(np.asarray(dropped) == 0, axis=1)
    kept = np.all(np.asarray(dropped) == np.asarray(tokens), axis=1)
    assert np.all(np.logical_or(empty, kept)) and 0.35 < empty.mean() < 0.65
    # The class-label encoder's unconditional datum is -1, which one-hots to zeros.
    assert int(dew.encoders["class_label"].tokens(None)) == -1
    with pytest.raises(ValueError, match="field shape"):
        ByteText.tokens("x", ())


def test_a_text_conditioned_digits_run_trains_and_previews_from_prompts(tmp_path):
    from helpers_common import tiny_config

    config = tiny_config(
        **{"dataset.name": "digits_text", "train.num_steps": 2, "eval.every": 0, "checkpoint.every": 2}
    )
    trainer = dew.Trainer(config, str(tmp_path / "run"))
    assert trainer.objective.input_spec.conditions["label"].encoder == "byte_text"
    assert isinstance(trainer.objective, Diffusion) and trainer.objective.class_prompts is not None
    assert trainer.objective.class_prompts[7] == "a handwritten seven"
    state = trainer.run()
    assert int(state.step) == 2
    # The logged training loss of the text batches (an eager loss here would compile op by op).
    (train,) = [row for row in rows(tmp_path / "run") if row["category"] == "train" and row["step"] == 2]
    assert np.isfinite(train["loss"]) and train["loss"] > 0
    grid = trainer.objective.preview(trainer.preview_params(state), jax.random.PRNGKey(0))
    assert isinstance(grid, ImageGrid) and grid.captions is not None
    assert grid.images.shape == (20, 8, 8, 1) and grid.columns == 2
    assert grid.captions[:3] == ("a handwritten zero", "a handwritten zero", "a handwritten one")


def test_input_spec_names_fields_and_refuses_clashes():
    text = Condition("byte_text", Field("text", (32,), "int32"), "")
    spec = InputSpec(Field("image", (8, 8, 1)), {"label": text})
    assert [f.name for f in spec.fields()] == ["image", "text"]
    with pytest.raises(ValueError, match="distinct"):
        InputSpec(Field("text", (8, 8, 1)), {"label": text})
    with pytest.raises(ValueError, match="must name an encoder"):
        Condition("", Field("text", (32,)))
    with pytest.raises(TypeError, match="must be a Condition"):
        InputSpec(Field("image", (8, 8, 1)), {"label": "byte_text"})  # pyright: ignore[reportArgumentType]  # the refusal under test

"""The modality pieces on their own: the byte corpus and its weights, the moving-digits generator
and motion statistics, the linear probe, NT-Xent, and byte generation."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.data.sources import python_bytes as pb
from dew.data.sources.moving_digits import (
    CANVAS,
    DIGIT,
    bounce,
    moving_digits,
    render,
)
from dew.scoring.linear_probe import probe_accuracy
from dew.scoring.motion import digit_window, motion_statistics


def test_windows_weigh_out_document_starts_and_padding_and_cover_every_target_once():
    data = np.frombuffer(b"abcdeXYZ12", np.uint8)  # documents "abcde", "XYZ", "12"
    starts = np.zeros(len(data), bool)
    starts[[0, 5, 8]] = True
    tokens, weights = pb.windows(data, starts, context=4)
    assert tokens.shape == (3, 5) and weights.shape == (3, 4)
    assert bytes(tokens[0].astype(np.uint8)) == b"abcde" and bytes(tokens[1].astype(np.uint8)) == b"eXYZ1"
    # Row 1's targets are X Y Z 1: X and 1 start documents; row 2's are "2" then padding.
    np.testing.assert_array_equal(weights, [[1, 1, 1, 1], [0, 1, 1, 0], [1, 0, 0, 0]])
    # Every counted target, in order, is the stream without its documents' first bytes.
    counted = tokens[:, 1:][weights > 0]
    assert bytes(counted.astype(np.uint8)) == b"bcdeYZ2"


def test_the_corpus_split_is_by_file_fixed_and_disjoint():
    train, held = pb.split_files("train"), pb.split_files("validation")
    assert not set(train) & set(held) and len(train) + len(held) == len(pb.corpus_files())
    assert held == pb.corpus_files()[:: pb.HELD_OUT_EVERY]
    source = pb.python_bytes("validation")
    data, starts = pb.stream("validation")
    assert source.fields["weights"].sum() == len(data) - starts.sum()  # all but each file's first byte
    with pytest.raises(ValueError, match="split must be 'train' or 'validation', got 'test'"):
        pb.python_bytes("test")


def test_bounce_reflects_at_both_walls():
    positions, _ = bounce(7, 2, 6, limit=8)
    np.testing.assert_array_equal(positions, [7, 7, 5, 3, 1, 1])  # 9 -> 7 and -1 -> 1
    positions, _ = bounce(0, 1, 4)
    np.testing.assert_array_equal(positions, [0, 1, 2, 3])


def test_moving_digits_are_deterministic_and_each_frame_holds_its_digit_where_recorded():
    a, b = moving_digits("validation"), moving_digits.__wrapped__("validation")
    np.testing.assert_array_equal(a.fields["video"], b.fields["video"])
    video, positions = a.fields["video"], a.fields["position"]
    assert video.shape == (180, 8, CANVAS, CANVAS, 1) and video.min() >= -1 and video.max() <= 1
    from dew.data.sources.digits import digits

    first = digits("validation").fields["image"][0]
    np.testing.assert_array_equal(video[0], render(first, positions[0]))
    steps = np.abs(np.diff(positions, axis=1))
    # At most 2 px per axis a frame (a bounce can leave a coordinate in place), and every clip moves.
    assert steps.max() <= 2 and (steps.sum((1, 2)) > 0).all()


def test_motion_statistics_tell_moving_from_still_and_from_shuffled_clips():
    real = moving_digits("validation")
    video, labels = real.fields["video"][:60], real.fields["label"][:60]
    moving = motion_statistics(video, labels)
    still = motion_statistics(np.repeat(video[:, :1], 8, axis=1), labels)
    shuffled = motion_statistics(
        video[
            np.arange(60)[:, None], np.random.default_rng(0).permuted(np.tile(np.arange(8), (60, 1)), axis=1)
        ],
        labels,
    )
    assert still["mean_displacement"] < 1e-4 and moving["mean_displacement"] > 1.0
    # Speeds of 1-2 px per axis: the centre moves between 1 and 2√2 px per frame (bounces aside).
    assert 1.0 <= moving["mean_displacement"] <= 2 * np.sqrt(2)
    assert shuffled["constant_velocity_error"] > moving["constant_velocity_error"]
    _, corners = digit_window(video.reshape(-1, CANVAS, CANVAS, 1))
    assert corners.min() >= 0 and corners.max() <= CANVAS - DIGIT


def test_the_linear_probe_separates_what_is_separable_and_not_noise():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 50)
    separable = np.eye(4)[labels] * 3 + rng.normal(size=(200, 4)) * 0.3
    assert probe_accuracy(separable, labels) == 1.0
    # Random labels: held-out accuracy is chance, 1/4 ± a binomial spread (100 rows: sd 0.043).
    assert probe_accuracy(rng.normal(size=(200, 4)), rng.integers(0, 4, 200)) < 0.25 + 4 * 0.043


def test_nt_xent_is_log_of_the_negatives_when_positives_are_certain():
    from dew.objectives.contrastive import nt_xent

    # Two orthogonal pairs of identical unit vectors: each view's positive has similarity 1, its
    # 2 negatives similarity 0 -> loss = −log(e^{1/τ} / (e^{1/τ} + 2)).
    z = jnp.array([[1.0, 0], [0, 1.0], [1.0, 0], [0, 1.0]])
    loss, accuracy = nt_xent(z, temperature=0.5)
    assert float(loss) == pytest.approx(-np.log(np.exp(2) / (np.exp(2) + 2)), rel=1e-6)
    assert float(accuracy) == 1.0


def test_generation_keeps_each_prompt_and_greedy_is_deterministic():
    from dew.networks.byte_transformer import ByteTransformer
    from dew.objectives.language import LanguageModel

    net = functools.partial(ByteTransformer, width=16, depth=1, heads=2, context=24)
    lm = LanguageModel(net, context=24, new_tokens=4)
    batch = {"tokens": jnp.zeros((2, 25), jnp.int32), "weights": jnp.ones((2, 24))}
    params = lm.init(jax.random.PRNGKey(0), batch)
    prompts = jnp.array([[100, 101, 0], [65, 66, 67]], jnp.int32)
    out = lm.generate(
        params, jax.random.PRNGKey(1), prompts, jnp.array([2, 3]), new_tokens=5, temperature=0.0
    )
    assert out.shape == (2, 8)
    np.testing.assert_array_equal(out[0, :2], [100, 101])
    np.testing.assert_array_equal(out[1, :3], [65, 66, 67])
    # Greedy: each new token is the argmax of the logits at the position before it.
    logits = lm.logits(params, out)
    np.testing.assert_array_equal(out[0, 2:7], jnp.argmax(logits[0, 1:6], -1))
    again = lm.generate(
        params, jax.random.PRNGKey(9), prompts, jnp.array([2, 3]), new_tokens=5, temperature=0.0
    )
    np.testing.assert_array_equal(out, again)

"""One averaging interface (``dew.averaging.averager``): the classic EMA and EDM2's power EMA both
satisfy it, ``Averages`` threads both through the step as one argument, the checkpoint layout
follows one rule for them, and today's numbers are kept bit for bit."""

from __future__ import annotations

import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_averaging import SPEC, STD_RELS, digest, tiny_run

from dew.averaging import posthoc as posthoc_ema
from dew.averaging.averager import FIELDS, Averager, Averages, ClassicEMA, as_averages
from dew.averaging.ema import EMASpec
from dew.averaging.power_ema import PowerEMA
from dew.checkpointing import Checkpoints
from dew.checkpointing.layout import STATE_ITEMS, items_from_state, state_from_items

EPS32 = float(np.finfo(np.float32).eps)
K = 7  # updates in the closed-form checks
#: ``helpers_averaging.digest(tiny_run(k, power))`` recorded by running helpers_averaging.py on
#: the code of commit 87d5f86, where the step threaded ``ema`` and ``power_ema`` separately.
RECORDED = {(1, False): "31c858aecebd5263", (1, True): "a564c8c6afd674a7", (2, True): "04407c687ff34e97"}
OLD_CHECKPOINT = pathlib.Path(__file__).parent / "data" / "averages_checkpoint_87d5f86"


def _thetas(k: int = K) -> list[dict[str, jax.Array]]:
    """Positive parameter trees θ_1..θ_k (no cancellation in the weighted sums)."""
    rng = np.random.default_rng(0)
    return [
        {"w": jnp.asarray(rng.uniform(1, 2, (3, 2)), jnp.float32), "b": jnp.full(2, i + 1.0)}
        for i in range(k)
    ]


def _tolerance(k: int) -> float:
    """Relative error of k recurrence steps in float32: each update rounds ≤ 3 times (two
    products and a sum of positives), the read once more; β's own rounding (exp2/pow of a float32
    argument) adds a few ulps per factor: 4(k + 2) ulps bounds it."""
    return 4 * (k + 2) * EPS32


def test_both_averagers_satisfy_the_interface():
    classic, power = ClassicEMA(EMASpec(0.9)), PowerEMA(STD_RELS, 2)
    for averager in (classic, power):
        assert isinstance(averager, Averager)
    # The one rule: each averager's tree is a TrainState field and a checkpoint item of that name.
    assert FIELDS == (("ema", "ema_params"), ("power_ema", "power_ema"))
    assert {item for _, item in FIELDS} <= set(STATE_ITEMS)
    assert (classic.field, classic.item, power.field, power.item) == (
        "ema",
        "ema_params",
        "power_ema",
        "power_ema",
    )


def test_classic_ema_matches_the_closed_form():
    """init: zeros where tracked, the live leaf where not; k updates: Σ (1−β)β^(k−i) θ_i; read:
    that sum over 1 − β^k (the debiased average)."""
    beta = 0.9
    spec = EMASpec(decay=beta, tracks=lambda path: path == "w")
    averager = ClassicEMA(spec)
    thetas = _thetas()
    tree = averager.init(thetas[0])
    np.testing.assert_array_equal(tree["w"], np.zeros((3, 2)))
    np.testing.assert_array_equal(tree["b"], thetas[0]["b"])
    for n, theta in enumerate(thetas, start=1):
        tree = averager.update(tree, theta, n)
    weights = np.array([(1 - beta) * beta ** (K - i) for i in range(1, K + 1)])
    raw = np.einsum("i,ijk->jk", weights, np.stack([np.asarray(t["w"], np.float64) for t in thetas]))
    np.testing.assert_allclose(tree["w"], raw, rtol=_tolerance(K))
    np.testing.assert_array_equal(tree["b"], thetas[-1]["b"])  # untracked: the live parameter
    ((read, name),) = averager.read(tree, K)
    assert name == "ema"
    np.testing.assert_allclose(read["w"], raw / (1 - beta**K), rtol=_tolerance(K + 1))


def test_classic_ema_read_is_debiased_under_the_ramped_half_life():
    """With EDM's ramp-up, a constant θ averages to θ: the read divides by 1 − Π β_i exactly."""
    averager = ClassicEMA(EMASpec(half_life=4.0, ramp_up=0.5))
    theta = {"w": jnp.full((2,), 3.0)}
    tree = averager.init(theta)
    for n in range(1, K + 1):
        tree = averager.update(tree, theta, n)
    ((read, _),) = averager.read(tree, K)
    np.testing.assert_allclose(read["w"], 3.0, rtol=_tolerance(K + 1))


def test_power_ema_matches_the_closed_form():
    """init: zeros; k updates with β_γ(n) = (1 − 1/n)^(γ+1): Σ_i θ_i (i^(γ+1) − (i−1)^(γ+1)) / k^(γ+1)
    (the product of the β's telescopes); read: the slots as they are (no debiasing), named."""
    power = PowerEMA(STD_RELS, 1)
    thetas = _thetas()
    slots = power.init(thetas[0])
    for slot in slots:
        np.testing.assert_array_equal(slot["w"], np.zeros((3, 2)))
    for n, theta in enumerate(thetas, start=1):
        slots = power.update(slots, theta, n)
    read = power.read(slots, K)
    assert [name for _, name in read] == ["std_rel_0.050", "std_rel_0.100"]
    stacked = np.stack([np.asarray(t["w"], np.float64) for t in thetas])
    for (tree, _), gamma in zip(read, power.gammas, strict=True):
        i = np.arange(1, K + 1, dtype=np.float64)
        weights = (i ** (gamma + 1) - (i - 1) ** (gamma + 1)) / K ** (gamma + 1)
        np.testing.assert_allclose(tree["w"], np.einsum("i,ijk->jk", weights, stacked), rtol=_tolerance(K))
    assert power.gammas == tuple(float(posthoc_ema.std_rel_to_gamma(s)) for s in STD_RELS)


def test_averages_thread_both_as_one():
    """``Averages`` gives a fresh state's fields, updates each member exactly as the member alone
    would, reads all of them by name, and records each."""
    averages = Averages(ClassicEMA(SPEC), PowerEMA(STD_RELS, 3))
    theta = _thetas(1)[0]
    theta = {"w": theta["w"][:, :1], "b": theta["b"]}
    fields = averages.init(theta)
    assert set(fields) == {"ema", "power_ema", "ema_law"}
    state = type("S", (), fields)
    updated = averages.update(state, theta, 1)
    assert averages.power is not None
    np.testing.assert_array_equal(updated["ema"]["w"], ClassicEMA(SPEC).update(fields["ema"], theta, 1)["w"])
    for got, want in zip(
        updated["power_ema"], averages.power.update(fields["power_ema"], theta, 1), strict=True
    ):
        np.testing.assert_array_equal(got["w"], want["w"])
    assert averages.current(state).keys() == {"ema", "power_ema"}
    stepped = type("S", (), updated)
    assert [name for _, name in averages.read(stepped, 1)] == ["ema", "std_rel_0.050", "std_rel_0.100"]
    assert set(averages.record(theta)) == {"ema", "power_ema"}
    # Without a power EMA the composite leaves that field alone.
    assert Averages(ClassicEMA(SPEC)).update(state, theta, 1).keys() == {"ema"}
    with pytest.raises(ValueError, match="inside Averages"):
        as_averages(averages, PowerEMA(STD_RELS, 3))


@pytest.mark.default_compiler
@pytest.mark.parametrize(("accumulation", "power"), sorted(RECORDED))
def test_the_trajectory_is_the_recorded_one(accumulation, power):
    """The pure steps' final state, bit for bit, is the one the code before the interface
    recorded, in both forms of the call: one ``Averages``, or ``EMASpec`` + ``power_ema``."""
    averages = Averages(ClassicEMA(SPEC), PowerEMA(STD_RELS, 1) if power else None)
    assert digest(tiny_run(accumulation, power, ema=averages)) == RECORDED[accumulation, power]
    assert digest(tiny_run(accumulation, power)) == RECORDED[accumulation, power]


def test_the_layout_rule_round_trips_both_averages():
    state = tiny_run(2, True, steps=2)
    items = items_from_state(state)
    assert list(items) == ["params", "opt_state", "ema_params", "extra", "pending", "power_ema"]
    assert "ema" in items["extra"]  # the classic EMA's law, what restore_ema needs
    back = state_from_items(items)
    assert digest(back) == digest(state)
    assert isinstance(back.power_ema, tuple)
    classic_only = tiny_run(1, False, steps=1)
    assert list(items_from_state(classic_only)) == ["params", "opt_state", "ema_params", "extra"]


@pytest.mark.default_compiler
def test_a_checkpoint_written_before_the_interface_restores(tmp_path):
    """``data/averages_checkpoint_87d5f86`` was written by commit 87d5f86's ``Checkpoints``
    (``data/make_averages_checkpoint.py``); today's code restores it, both averages included,
    to the state the same run reaches now, bit for bit, and restore_ema reads its EMA alone."""
    expected = jax.device_get(tiny_run(2, True, steps=4))
    shutil.copytree(OLD_CHECKPOINT, tmp_path / "run")  # the stored copy stays as the old code wrote it
    ckpt = Checkpoints(tmp_path / "run", keep=None)
    try:
        restored, _ = ckpt.restore(jax.tree.map(np.asarray, expected))
        assert int(restored.step) == 4
        assert digest(restored) == digest(expected)
        assert restored.power_ema is not None and len(restored.power_ema) == len(STD_RELS)
        debiased = ckpt.restore_ema(expected.params)
    finally:
        ckpt.close()
    want = ClassicEMA(SPEC).read(expected.ema, 2)[0][0]
    np.testing.assert_array_equal(debiased["w"], want["w"])
    np.testing.assert_array_equal(debiased["b"], want["b"])

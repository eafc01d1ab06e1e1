"""The precision policy (``config.precision``, docs/precision.md): float32 is the pre-policy
program, bfloat16 / float16 agree with it within bounds derived from the formats' unit
roundoff, a float16 overflow backs the dynamic loss scale off without touching the parameters,
and a run resumes across policies (the dynamic scale bit-exactly).

The agreement bound (``test_low_precision_loss_and_gradients_agree_with_float32``)
-------------------------------------------------------------------------------------
Unit roundoff u (half the spacing of the format's numbers at 1): 2^-8 for bfloat16 (8
significand bits), 2^-11 for float16 (11 bits). Each operation of F that produces a
compute-dtype value rounds it with a relative error δ, |δ| ≤ u. Counting them along the longest
path of the test's network (SongUNet, model_channels 8, channel_mult (1, 2), num_blocks 1,
attention at 4×4; dew.networks.songunet): a block without attention rounds 11 values (norm0,
SiLU, conv0 and its bias, + embedding, norm1, SiLU, conv1 and its bias, + skip, × skip_scale),
a resampling block one more (12), an attention block 9 more (norm2, qkv and its bias, the
softmax's cast, the product with v, proj and its bias, + x, × skip_scale: 20). The path runs
through 10 blocks (enc 8×8 block0 11, enc 4×4 down 12, enc 4×4 block0 20, dec 4×4 in0 20, in1 11,
block0 11, block1 20, dec 8×8 up 12, block0 11, block1 11 = 139), plus the input cast, the first
conv and bias (3) and the output's norm, SiLU, conv and bias (4): n_f = 146 roundings forward.
Reverse mode rounds at least as many cotangents: n = 2 n_f = 292 for a gradient.

Group norms re-normalise each block's activations, so a relative error neither grows nor
shrinks through a block beyond what its own roundings add (the Lipschitz constant of a
normalised layer in relative terms is O(1)); to first order the relative error is the sum of the
δ's along the path. In the worst case that is n·u (0.57 for bfloat16 gradients: vacuous). The
δ's of round-to-nearest are modelled as independent, mean zero, uniform on [-u, u] (variance
u²/3), so a sum of n has standard deviation √(n/3)·u; a norm-wise relative error over a vector
of thousands of entries (the gradient) concentrates at that value. The tests allow twice it:

    loss:      2·√(n_f/3)·u  = 13.9 u   (bf16 5.4e-2, f16 6.8e-3)
    gradients: 2·√(n/3)·u    = 19.7 u   (bf16 7.7e-2, f16 9.6e-3), norm-wise ‖g − g₃₂‖/‖g₃₂‖

The inner products inside convolutions are not counted separately: XLA accumulates bfloat16 /
float16 dots in float32 on CPU and GPU, and an accumulation in the compute dtype would add
~√K·u (K ≤ 9·32 here), still inside the doubled allowance. What the bound excludes is a
policy that loses more than rounding: a float32 operation (group norm statistics, softmax,
the loss, the σ arithmetic) done in the compute dtype, or a cast that drops a dtype's range.
Broken on purpose by checking bfloat16's result against float16's bound: it fails.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers_common import tiny_config
from test_remat import digits_batch

from dew.averaging.ema import EMASpec
from dew.schema import ConfigError
from dew.training import precision as precision_lib
from dew.training.build import build_objective, open_split
from dew.training.objective import Step
from dew.training.precision import Precision
from dew.training.steps import make_init, make_step
from dew.training.trainer import Trainer
from dew.training.trainer_config import resolve_config

UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11}
FORWARD_ROUNDINGS = 146  # n_f, counted in the module docstring
NETWORK = {
    "model.channel_mult": (1, 2),
    "model.attn_resolutions": (4,),
    "model.dropout": 0.0,
}


def loss_bound(u: float) -> float:
    return 2 * math.sqrt(FORWARD_ROUNDINGS / 3) * u


def gradient_bound(u: float) -> float:
    return 2 * math.sqrt(2 * FORWARD_ROUNDINGS / 3) * u


def objective_for(compute: str, **overrides):
    scale = {"precision.loss_scale": "static", "precision.scale": 1024.0} if compute == "float16" else {}
    c = resolve_config(tiny_config(**NETWORK, **{"precision.compute": compute}, **scale, **overrides))
    return build_objective(c, open_split(c.dataset, "train")), c


def batch_and_params(objective):
    batch, rng = digits_batch()
    params = objective.init(jax.random.PRNGKey(0), batch)
    # Perturb every weight: the zero-initialised output layers would leave F (the part in the
    # compute dtype) out of the loss.
    params = jax.tree.map(lambda p: p + 0.05 * jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
    return batch, params


def loss_and_gradient(objective, params, batch):
    def fn(p, r, b):
        return jax.value_and_grad(objective.loss, has_aux=True)(p, r, b, Step(index=jnp.int32(0)))

    (loss, _), grads = jax.jit(fn)(params, jax.random.PRNGKey(1), batch)
    return float(loss), grads


def flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def test_float32_policy_is_the_program_without_a_policy():
    """float32 adds no operation: the step's program with ``Precision()`` is the one without a
    precision argument (main's code path), and the network's has no dtype conversion to a lower
    precision. (The loss and all 144 gradients were also compared bit for bit against main's
    code before this section existed: equal.)"""
    objective, _ = objective_for("float32")
    batch, _ = digits_batch()  # shapes only: the programs are traced, not run
    optimizer, ema = optax.adam(1e-3), EMASpec(0.999)
    state = jax.eval_shape(make_init(objective, optimizer, ema), jax.random.PRNGKey(0), batch)
    without = jax.make_jaxpr(make_step(objective, optimizer, ema))(state, batch)
    with_f32 = jax.make_jaxpr(make_step(objective, optimizer, ema, precision=Precision()))(state, batch)
    assert str(without) == str(with_f32)
    assert "bf16" not in str(without) and "f16[" not in str(without)
    assert Precision().init_state() is None


@pytest.mark.parametrize("compute", ["bfloat16", "float16"])
def test_low_precision_loss_and_gradients_agree_with_float32(compute):
    reference, _ = objective_for("float32")
    low, _ = objective_for(compute)
    batch, params = batch_and_params(reference)
    loss32, grads32 = loss_and_gradient(reference, params, batch)
    loss_lp, grads_lp = loss_and_gradient(low, params, batch)
    # Gradients come back float32 (the parameters' dtype), as the optimizer needs them.
    assert {x.dtype for x in jax.tree.leaves(grads_lp)} == {jnp.dtype(jnp.float32)}
    g32, glp = flat(grads32), flat(grads_lp)
    assert np.all(np.isfinite(glp))
    u = UNIT_ROUNDOFF[compute]
    loss_error = abs(loss_lp - loss32) / abs(loss32)
    gradient_error = np.linalg.norm(glp - g32) / np.linalg.norm(g32)
    assert loss_error <= loss_bound(u), (loss_error, loss_bound(u))
    assert gradient_error <= gradient_bound(u), (gradient_error, gradient_bound(u))
    # ... and the network did compute in the low precision (the errors are not float32's).
    assert gradient_error > 2.0**-20
    program = str(
        jax.make_jaxpr(lambda p: low.loss(p, jax.random.PRNGKey(1), batch, Step(jnp.int32(0))))(params)
    )
    assert ("bf16[" if compute == "bfloat16" else "f16[") in program


def test_dynamic_scale_backs_off_on_overflow_and_never_applies_it():
    """A scale of 2^40 overflows float16's cotangents (max 65504): the update is skipped, counted
    as an overflow (not as a non-finite step for the policy), the parameters are untouched and
    the scale halves, step after step, until the gradients fit; then updates apply and, after
    growth_interval finite steps, the scale doubles. (Broken on purpose by making an overflow
    keep the scale instead of halving it: fails at the second step's scale.)"""
    objective, _ = objective_for("float16")
    batch, params = batch_and_params(objective)
    precision = Precision("float16", "dynamic", scale=2.0**40, growth_interval=3)
    optimizer, ema = optax.adam(1e-3), EMASpec(0.999)
    state = make_init(objective, optimizer, ema, precision=precision)(jax.random.PRNGKey(0), batch)
    state = state.replace(params=params, opt_state=optimizer.init(params))
    step = jax.jit(make_step(objective, optimizer, ema, precision=precision))
    overflows, applied, scale, good = 0, 0, 2.0**40, 0
    for _ in range(40):
        before = flat(state.params)
        state, stats = step(state, batch)
        after = flat(state.params)
        assert np.all(np.isfinite(after))
        assert int(stats["skipped_updates"]) == 0  # the loss stayed finite
        assert float(stats["loss_scale"]) == scale
        if int(stats["loss_scale_overflows"]):
            overflows += 1
            np.testing.assert_array_equal(after, before)
            scale, good = max(scale / 2, 1.0), 0
        else:
            applied += 1
            assert not np.array_equal(after, before)
            good += 1
            if good == precision.growth_interval:
                scale, good = scale * 2, 0
        assert float(state.loss_scale["scale"]) == scale
        assert int(state.loss_scale["good_steps"]) == good
    assert overflows >= 10 and applied >= 5  # both branches ran


def test_bad_precision_input_gets_one_line_naming_the_field():
    with pytest.raises(ConfigError) as e:
        resolve_config(tiny_config(**{"precision.compute": "float64"}))
    assert "config.precision.compute='float64'" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        resolve_config(tiny_config(**{"precision.compute": "float16"}))
    message = str(e.value)
    assert "config.precision.loss_scale='none'" in message and "'dynamic'" in message and "\n" not in message
    assert precision_lib.from_config(None) == Precision()


def _states_equal(a, b) -> None:
    for name in ("step", "params", "opt_state", "ema", "rng", "loss_scale"):
        leaves_a, leaves_b = jax.tree.leaves(getattr(a, name)), jax.tree.leaves(getattr(b, name))
        assert len(leaves_a) == len(leaves_b), name
        for x, y in zip(leaves_a, leaves_b, strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)


@pytest.mark.slow
def test_resume_is_bit_exact_under_a_dynamic_scale_and_works_across_policies(tmp_path):
    """float16 with a dynamic scale (starting at 2^40, so the first steps overflow and the run
    carries on under the default nonfinite='stop'): stopped at step 4 and resumed to 8 equals a
    straight run to 8, the scale's state included. Then a float32 run resumes under bfloat16
    (no scale state), and that bfloat16 checkpoint under float16 (the scale created), and the
    float16 checkpoint under float32 (the scale dropped); each trains on with finite parameters.
    Checkpoints hold float32 whatever the policy. The network is tiny_config's one-level tiny
    SongUNet: what is checked is the state a resume carries, not the rounding of a deeper network."""
    quiet = {"eval.every": 0, "preview.every": 0, "checkpoint.every": 4, "train.log_every": 4}
    f16 = {
        "precision.compute": "float16",
        "precision.loss_scale": "dynamic",
        "precision.scale": 2.0**40,
        "precision.growth_interval": 2,
    }
    straight = Trainer(
        tiny_config(**quiet, **f16, **{"train.num_steps": 8}), str(tmp_path / "straight")
    ).run()
    assert straight.loss_scale is not None and float(straight.loss_scale["scale"]) < 2.0**40  # it backed off
    Trainer(tiny_config(**quiet, **f16, **{"train.num_steps": 4}), str(tmp_path / "resumed")).run()
    resumed = Trainer(tiny_config(**quiet, **f16, **{"train.num_steps": 8}), str(tmp_path / "resumed")).run()
    _states_equal(straight, resumed)
    stored = Trainer(tiny_config(**quiet, **f16, **{"train.num_steps": 8}), str(tmp_path / "resumed"))
    assert stored.checkpoints is not None
    assert {np.dtype(x.dtype) for x in jax.tree.leaves(stored.checkpoints.stored().params)} == {
        np.dtype(np.float32)
    }

    across = str(tmp_path / "across")
    Trainer(tiny_config(**quiet, **{"train.num_steps": 4}), across).run()
    steps = (
        ("bfloat16", {"precision.compute": "bfloat16"}, None),
        ("float16", f16, 2.0**40),
        ("float32", {}, None),
    )
    for n, (name, policy, start_scale) in enumerate(steps, start=2):
        trainer = Trainer(tiny_config(**quiet, **policy, **{"train.num_steps": 4 * n}), across)
        state = trainer.run()
        assert int(state.step) == 4 * n, name
        assert np.all(np.isfinite(flat(state.params))), name
        if start_scale is None:
            assert state.loss_scale is None, name
        else:
            assert state.loss_scale is not None and float(state.loss_scale["scale"]) <= start_scale

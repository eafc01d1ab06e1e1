"""``model.scan_blocks`` (SongUNet: runs of identical UNetBlocks as one ``jax.lax.scan`` over
their stacked parameters) changes the program, not the function: the same parameter tree
(names, shapes, initial values: bit for bit), the same loss and gradients in training (dropout
on, so the dropout keys must be the unrolled blocks' keys), alone and with ``remat=blocks``.

The network: model_channels 8, channel_mult (1, 2), num_blocks 3, attention at 4×4. Its scanned
runs: enc 8×8 blocks 0-2, enc 4×4 blocks 1-2 (attention), dec 4×4 blocks 0-2, dec 8×8 blocks 1-3.

The bound is tests/system/test_precision.py's, counted for this depth: XLA does not promise bit-identical
results for a restructured program (the scan body is fused on its own, not with its
neighbours), only float32 arithmetic on the same operations, each rounding with relative error
≤ u = 2^-24. Along the longest path, with num_blocks = b (test_precision.py's per-block counts:
11 for a plain block, 12 for a resampling one, 20 with attention): enc 8×8 11b, down 12, enc
4×4 20b, dec in0 20 + in1 11, dec 4×4 11b + 20, up 12, dec 8×8 11(b + 1), plus 3 at the input and
4 at the output: n_f = 53b + 93 = 252 for b = 3 (146 for b = 1, test_precision's count).
Independent roundings give a relative difference with standard deviation √(n/3)·u; the loss may
differ by 2·√(n_f/3)·u relatively, the gradients norm-wise by 2·√(2·n_f/3)·u (≈ 1.6e-6).
Broken on purpose (every scanned block given its run's first block's dropout key, the others
undrawn): the loss already differs beyond its bound and the test fails.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_common import device_batch, tiny_config
from test_remat import U32, digits_batch, loss_and_gradient

from dew.schema import ConfigError
from dew.training.build import build_objective, open_split
from dew.training.objective import Step
from dew.training.trainer import Trainer
from dew.training.trainer_config import resolve_config

NUM_BLOCKS = 3
FORWARD_ROUNDINGS = 53 * NUM_BLOCKS + 93
NETWORK = {
    "model.channel_mult": (1, 2),
    "model.attn_resolutions": (4,),
    "model.num_blocks": NUM_BLOCKS,
    "model.dropout": 0.1,
}


def objective_for(scan: bool, remat: str = "none"):
    c = resolve_config(tiny_config(**{**NETWORK, "model.scan_blocks": scan, "model.remat": remat}))
    return build_objective(c, open_split(c.dataset, "train"))


def scans_in(objective, params, batch) -> int:
    """How many ``scan`` equations the traced loss (forward) holds."""
    step = Step(index=jnp.int32(0))
    jaxpr = jax.make_jaxpr(lambda p, r, b: objective.loss(p, r, b, step))(
        params, jax.random.PRNGKey(1), batch
    )
    return str(jaxpr).count(" scan[")


@pytest.mark.parametrize("remat", ["none", "blocks"])
def test_scanned_blocks_give_the_same_parameters_loss_and_gradients(remat):
    batch, rng = digits_batch()
    plain, scanned = objective_for(False), objective_for(True, remat)
    # Jitted, as the Trainer initialises (one program each, not hundreds of op-by-op compiles).
    params = jax.jit(plain.init)(jax.random.PRNGKey(0), batch)
    params_scan = jax.jit(scanned.init)(jax.random.PRNGKey(0), batch)
    assert jax.tree.structure(params) == jax.tree.structure(params_scan)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params_scan), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The scans are really there (the four runs of the module docstring), and only with the option.
    assert scans_in(plain, params, batch) == 0
    assert scans_in(scanned, params, batch) == 4
    params = jax.tree.map(lambda p: p + 0.05 * jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
    loss, grads = loss_and_gradient(plain, params, batch)
    loss_s, grads_s = loss_and_gradient(scanned, params, batch)
    assert abs(loss_s - loss) <= 2 * math.sqrt(FORWARD_ROUNDINGS / 3) * U32 * abs(loss)
    difference = np.linalg.norm(grads_s - grads) / np.linalg.norm(grads)
    assert difference <= 2 * math.sqrt(2 * FORWARD_ROUNDINGS / 3) * U32, difference


def test_a_config_with_scanned_blocks_trains_through_the_trainer(tmp_path):
    """tiny_config's one-level network (no attention) with 3 blocks: its scanned runs are enc 8×8
    blocks 0-2 and dec 8×8 blocks 0-3 (each 8 + 8 skip channels in, 8 out), so the Trainer's
    loss holds two scans."""
    quiet = {"eval.every": 0, "preview.every": 0, "checkpoint.every": 1, "train.log_every": 1}
    network = {"model.num_blocks": NUM_BLOCKS, "model.dropout": 0.1, "model.scan_blocks": True}
    trainer = Trainer(tiny_config(**network, **quiet, **{"train.num_steps": 1}), str(tmp_path / "run"))
    state = trainer.run()
    assert int(state.step) == 1
    leaves = jax.tree.leaves(state.params)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in leaves)
    assert scans_in(trainer.objective, state.params, digits_batch()[0]) == 2


def test_a_scan_blocks_value_that_is_not_a_bool_is_refused():
    with pytest.raises((ConfigError, ValueError)) as e:
        objective_for("sometimes").init(  # pyright: ignore[reportArgumentType]  # the refusal under test
            jax.random.PRNGKey(0),
            device_batch({"image": np.zeros((2, 8, 8, 1), np.float32), "label": np.zeros(2, np.int32)}),
        )
    assert "scan_blocks" in str(e.value) and "sometimes" in str(e.value)

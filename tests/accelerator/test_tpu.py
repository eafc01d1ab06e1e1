"""What only the chip can show: run where JAX's backend is a TPU (``make test-accelerator``, one
process, on the lent machine); skipped everywhere else, CI included.

- a single-host TPU VM that names its worker in ``TPU_WORKER_HOSTNAMES`` and has no metadata
  server is one process, found without asking the server;
- the platform line names the chip;
- the flash-attention kernel (``dew.kernels.attention``) equals XLA's attention, values and
  gradients, within bfloat16's roundoff.
"""

from __future__ import annotations

import math
import time

import pytest

jax = pytest.importorskip("jax")
if jax.default_backend() != "tpu":
    pytest.skip("needs a TPU backend (make test-accelerator on the chip)", allow_module_level=True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dew import kernels  # noqa: E402
from dew.runtime import backend, distributed  # noqa: E402

U = 2.0**-8  # bfloat16's unit roundoff


def test_a_single_host_tpu_vm_is_one_process_found_at_once():
    began = time.monotonic()
    assert distributed.requested(initialization_timeout=5) is None
    assert time.monotonic() - began < 2.0


def test_the_platform_line_names_the_chip():
    line = backend.describe_devices()
    assert "TPU" in line and "(tpu)" in line, line
    assert backend.expected_platform() == "tpu"


def _loss(attend):
    return lambda q, k, v: jnp.sum(attend(q, k, v).astype(jnp.float32) ** 2)


def test_flash_attention_equals_xla_attention_values_and_gradients():
    """B 2, T 256, N 4 heads of 64, random bfloat16 q, k, v. Each computes softmax(q kᵀ/√h) v
    with float32 statistics; they differ by where they round to bfloat16: the logits, the
    probabilities, the output (n_f = 3 roundings forward, each |δ| ≤ u; the output is a convex
    combination of v's rows, so |error| ≤ n_f·u·max|v| entry-wise, doubled for the two sides),
    and for the gradients the forward's 3 and the backward's 7 (dO, dP = dO vᵀ, dS = P∘(dP − Σ),
    its cast, dQ, dK, dV): n = 10, norm-wise 2·√(n/3)·u as in tests/system/test_precision.py."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 256, 4, 64)), jnp.bfloat16) for _ in range(3))
    with kernels.using(kernels.KernelChoice(attention="tpu_flash")):
        flash = jax.jit(kernels.attention)(q, k, v)
        flash_grads = jax.jit(jax.grad(_loss(kernels.attention), argnums=(0, 1, 2)))(q, k, v)
    xla = jax.jit(jax.nn.dot_product_attention)(q, k, v)
    xla_grads = jax.jit(jax.grad(_loss(jax.nn.dot_product_attention), argnums=(0, 1, 2)))(q, k, v)
    scale = float(jnp.max(jnp.abs(v.astype(jnp.float32))))
    error = float(jnp.max(jnp.abs(flash.astype(jnp.float32) - xla.astype(jnp.float32))))
    assert error <= 2 * 3 * U * scale, (error, scale)
    for got, want in zip(flash_grads, xla_grads, strict=True):
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        relative = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert relative <= 2 * math.sqrt(10 / 3) * U, relative

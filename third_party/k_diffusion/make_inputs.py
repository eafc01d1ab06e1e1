"""Step 1 of 2 (run with dew's environment): write the inputs both implementations share.

    PYTHONPATH=. python third_party/k_diffusion/make_inputs.py

Writes ``inputs.npz``: the mixture (means, stds, weights), the initial standard normal noise,
and the churn noise ε_i dew's stochastic sampler draws at each step i for key
``PRNGKey(CHURN_SEED)`` (``dew.sampling.solvers.step_noise``), so k-diffusion can be fed the same
ε through its ``torch.randn_like`` calls.
"""

from __future__ import annotations

import pathlib

import jax
import numpy as np

from dew.data.sources.mixture import RING
from dew.sampling.solvers import step_noise

HERE = pathlib.Path(__file__).resolve().parent
BATCH, POINTS, NOISE_SEED, CHURN_SEED = 64, 18, 0, 1


def main() -> None:
    noise = np.random.default_rng(NOISE_SEED).standard_normal((BATCH, 2))
    churn = np.stack(
        [np.asarray(step_noise(jax.random.PRNGKey(CHURN_SEED), i, (BATCH, 2))) for i in range(POINTS)]
    )
    np.savez(
        HERE / "inputs.npz",
        means=np.asarray(RING.means, np.float64),
        stds=np.asarray(RING.stds, np.float64),
        weights=np.asarray(RING.weights, np.float64),
        noise=noise,
        churn_noise=churn.astype(np.float64),
        points=np.int64(POINTS),
        churn_seed=np.int64(CHURN_SEED),
    )
    print(f"wrote {HERE / 'inputs.npz'}")


if __name__ == "__main__":
    main()

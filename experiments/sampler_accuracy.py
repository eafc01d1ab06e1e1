"""EDM Table 1 / Fig. 3 in miniature: ODE endpoint error vs NFE, per solver and σ schedule, on
the exact denoiser of the 2D Gaussian mixture (``dew.data.sources.mixture.RING``), so only the
discretisation errs.

Error: RMS over 2,048 fixed noise draws of ‖x_solver − x_ref‖, where x_ref is Heun with 1,000
points of the EDM schedule from the same noise. Every schedule spans σ ∈ [0.002, 80] except VP's,
which is Table 1's own (t from 1 to 10⁻³, σ ∈ [0.0064, 152]). Equal NFE: Heun with n points
costs 2(n−1)+1, Euler and DPM-Solver++(2M) with 2(n−1)+1 points cost the same.

    PYTHONPATH=. .venv/bin/python experiments/sampler_accuracy.py
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp

from dew.data.sources.mixture import RING
from dew.diffusion import EDM, schedules
from dew.sampling import nfe, sample

LO, HI = 0.002, 80.0


def main() -> int:
    noise = jax.random.normal(jax.random.PRNGKey(0), (2048, 2))
    reference = jax.jit(lambda n: sample(RING.denoise, n, EDM.sigmas(1000), "heun"))(noise)

    def error(solver: str, sigmas: jax.Array) -> float:
        out = jax.jit(lambda n: sample(RING.denoise, n, sigmas, solver))(noise)
        return float(jnp.sqrt(jnp.mean(jnp.sum((out - reference) ** 2, axis=-1))))

    columns = {
        "Heun, EDM σ (ρ=7)": lambda p: error("heun", schedules.karras(p, LO, HI)),
        "Euler, EDM σ": lambda p: error("euler", schedules.karras(2 * p - 1, LO, HI)),
        "DPM++(2M), EDM σ": lambda p: error("dpmpp_2m", schedules.karras(2 * p - 1, LO, HI)),
        "Heun, uniform σ": lambda p: error("heun", schedules.uniform(p, LO, HI)),
        "Euler, uniform σ": lambda p: error("euler", schedules.uniform(2 * p - 1, LO, HI)),
        "Heun, VE (geometric σ)": lambda p: error("heun", schedules.geometric(p, LO, HI)),
        "Heun, VP schedule": lambda p: error("heun", schedules.vp(p)),
    }
    print("| NFE | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for points in (6, 10, 18, 32, 64):
        row = [f"{fn(points):.4f}" for fn in columns.values()]
        print(f"| {nfe('heun', points)} | " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

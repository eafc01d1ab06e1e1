"""Write ``phema_reference.npz``: post-hoc EMA numbers computed by NVlabs/edm2's own code.

Run with a PyTorch environment and an unmodified copy of edm2's ``training/phema.py`` (it imports
torch for its training-time classes; the functions used here are NumPy):

    git -C <edm2 checkout> archive HEAD training/phema.py | tar -x -C /tmp/edm2
    /work/venv-torch/bin/python third_party/edm2/make_reference.py --edm2=/tmp/edm2 \
        --out=third_party/edm2/phema_reference.npz

Nothing from edm2 is copied into dew; only these outputs are stored. ``tests/test_posthoc_ema.py``
compares dew.averaging.posthoc with them (no PyTorch needed).
"""

import argparse
import importlib.util
import os

import numpy as np


def load_phema(root: str):
    spec = importlib.util.spec_from_file_location("edm2_phema", os.path.join(root, "training", "phema.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--edm2", required=True, help="directory holding edm2's training/phema.py")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    ph = load_phema(args.edm2)
    out = {}

    # Eq. 123 / Eq. 126 (Algorithm 2): the σ_rel <-> γ conversions.
    out["exp_to_std/exp"] = np.array([0.0, 0.5, 1.0, 2.5, 6.94, 16.97, 50.0, 300.0])
    out["exp_to_std/std"] = ph.exp_to_std(out["exp_to_std/exp"])
    out["std_to_exp/std"] = np.array([0.005, 0.01, 0.03, 0.05, 0.07, 0.10, 0.15, 0.20, 0.25, 0.28])
    out["std_to_exp/exp"] = ph.std_to_exp(out["std_to_exp/std"])

    # Eq. 127: per-update β, counted in updates (t_delta = 1) and in images (t_delta = batch).
    t = np.array([1.0, 2.0, 3.0, 10.0, 100.0, 1000.0, 4000.0, 1e5])
    for std in (0.05, 0.10):
        out[f"beta/{std:.3f}/t"] = t
        out[f"beta/{std:.3f}/dt1"] = np.array([ph.power_function_beta(std, tt, 1.0) for tt in t])
        out[f"beta/{std:.3f}/dt64_t"] = 64.0 * t
        out[f"beta/{std:.3f}/dt64"] = np.array([ph.power_function_beta(std, 64.0 * tt, 64.0) for tt in t])

    # Eq. 121 / 108: discrete response of one profile ending at ofs, over `len` time steps.
    for i, (ofs, std, length) in enumerate(
        [(100, 0.05, 120), (100, 0.10, 120), (37, 0.20, 40), (500, 0.07, 500)]
    ):
        out[f"response/{i}/args"] = np.array([ofs, std, length], np.float64)
        out[f"response/{i}/resp"] = ph.power_function_response(ofs, std, length)

    # Eq. 151: inner products between pairs of profiles.
    rng = np.random.default_rng(0)
    a_ofs, b_ofs = rng.uniform(10, 5000, 16), rng.uniform(10, 5000, 16)
    a_std, b_std = rng.uniform(0.02, 0.25, 16), rng.uniform(0.02, 0.25, 16)
    b_ofs[:3] = a_ofs[:3]  # equal times too
    out["correlation/a_ofs"], out["correlation/a_std"] = a_ofs, a_std
    out["correlation/b_ofs"], out["correlation/b_std"] = b_ofs, b_std
    out["correlation/value"] = ph.power_function_correlation(a_ofs, a_std, b_ofs, b_std)

    # Algorithm 3: reconstruction weights [in, out] for several snapshot schedules.
    schedules = {
        # dew's digits run: two profiles, a snapshot of each every 250 of 4,000 updates.
        "digits": (
            np.repeat(np.arange(250, 4001, 250), 2),
            np.tile([0.05, 0.10], 16),
            4000,
            [0.02, 0.04, 0.07, 0.12, 0.20],
        ),
        # EDM2's training defaults: snapshots every 8 Mimg (in images, kimg_to_nimg-style times).
        "edm2_images": (
            np.repeat(np.arange(1, 17) * 8 * 2**20, 2),
            np.tile([0.05, 0.10], 16),
            16 * 8 * 2**20,
            [0.03, 0.05, 0.07, 0.10, 0.15],
        ),
        # Three profiles on an irregular schedule.
        "irregular": (
            np.repeat([100, 300, 700, 1000, 1600, 2000], 3),
            np.tile([0.03, 0.08, 0.15], 6),
            2000,
            [0.05, 0.10, 0.25],
        ),
        # Few snapshots: the fit is poor, the weights large; still a well-posed solve.
        "sparse": (np.array([500, 500, 1000, 1000]), np.array([0.05, 0.10, 0.05, 0.10]), 1000, [0.06, 0.09]),
    }
    for name, (t_in, s_in, t_out, s_out) in schedules.items():
        out[f"solve/{name}/t_in"] = np.asarray(t_in, np.float64)
        out[f"solve/{name}/sigma_in"] = np.asarray(s_in, np.float64)
        out[f"solve/{name}/t_out"] = np.float64(t_out)
        out[f"solve/{name}/sigma_out"] = np.asarray(s_out, np.float64)
        out[f"solve/{name}/coef"] = ph.solve_posthoc_coefficients(t_in, s_in, t_out, s_out)

    np.savez(args.out, **out)
    print(f"wrote {len(out)} arrays to {args.out}")


if __name__ == "__main__":
    main()

"""Write ``dopri5_steps.npz``: the times at which torchdiffeq's ``odeint(method="dopri5")``
evaluates a nonlinear field, for ``tests/test_interpolants_dopri5.py``'s check of how closely
``dew.sampling.dopri5`` follows its step sizes. See README.md ("dopri5 step sizes").

    python third_party/sit/make_dopri5_steps.py --out=third_party/sit/dopri5_steps.npz

The field is f(t, y) = tanh(y W)·(1 + t) − 30·y·(1 + sin 8t) on y [4, 64] float32 (W and y0
stored), integrated over [0, 1] as SiT's ``sample_ode`` calls torchdiffeq: float32 state and
times, tolerances as one-element lists (atol 1e-6, rtol 1e-3).
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torch
    import torchdiffeq

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    y0 = rng.standard_normal((4, 64)).astype(np.float32)
    times: list[float] = []
    weights = torch.from_numpy(w)

    def field(t, y):
        times.append(float(t))
        return torch.tanh(y @ weights) * (1 + t) - 30.0 * y * (1 + torch.sin(8 * t))

    ts = torch.tensor([0.0, 1.0], dtype=torch.float32)
    y = torchdiffeq.odeint(field, torch.from_numpy(y0), ts, method="dopri5", atol=[1e-6], rtol=[1e-3])
    np.savez(args.out, w=w, y0=y0, times=np.asarray(times, np.float64), y1=y[-1].numpy())
    print(f"wrote {args.out}: {len(times)} evaluations")


if __name__ == "__main__":
    main()

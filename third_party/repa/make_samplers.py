"""Goldens for dew's REPA samplers (``dew.sampling.repa_sampler``) from sihyun-yu/REPA's own
``samplers.py``: ``euler_sampler`` (``generate.py --mode=ode``, with and without ``--heun``) and
``euler_maruyama_sampler`` (``--mode=sde``) on fixed noise, for a fixed stand-in network.

    /work/venvs/dit/bin/python third_party/repa/make_samplers.py --repa=/path/to/REPA \
        --out=third_party/repa

The stand-in network is REPA's calling convention (``model(x, t, y)`` returning a tuple whose
first entry is the velocity, x NCHW, t in REPA's time: 1 at the noise, 0 at the data) around a
fixed map that tests/test_repa_sampler.py writes identically in JAX:

    model(x, t, y)[0] = (flat(x) @ W).reshape(x.shape) · (1 + t/2) + t·c + e(y),
    e(y)_k = ½ sin((y + 1) · 0.37 (k + 1))   (one value per channel k; y = 1000 is REPA's null class)

Each case runs the reference function unmodified; ``torch.randn_like`` is wrapped to record the
draws it returns (the SDE's ε per step) and the network to record what it is fed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np
import torch

B, C, H = 2, 4, 4
SEED = 20260


def fixed_model(W: torch.Tensor, c: torch.Tensor, calls: list):
    freqs = 0.37 * torch.arange(1, C + 1, dtype=torch.float32)

    def model(x, t, y):
        calls.append((x[:B].detach().clone().numpy(), float(t[0]), x.shape[0]))
        b = x.shape[0]
        t4 = t.view(b, 1, 1, 1)
        emb = 0.5 * torch.sin((y.to(torch.float32)[:, None] + 1.0) * freqs[None])  # [b, C]
        out = (x.reshape(b, -1) @ W).reshape(x.shape) * (1 + 0.5 * t4) + t4 * c + emb[:, :, None, None]
        return out, []

    return model


CASES = [
    # name, function, num_steps, heun, cfg_scale, guidance_low, guidance_high, path_type
    ("ode_euler_8", "euler_sampler", 8, False, 1.0, 0.0, 1.0, "linear"),
    ("ode_heun_8_cfg", "euler_sampler", 8, True, 1.8, 0.0, 0.7, "linear"),
    ("ode_generate_defaults", "euler_sampler", 50, False, 1.5, 0.0, 1.0, "linear"),
    ("ode_50_interval_edge", "euler_sampler", 50, False, 1.8, 0.0, 0.7, "linear"),  # t = 0.7 on the grid
    ("sde_linear_8_cfg", "euler_maruyama_sampler", 8, False, 1.8, 0.1, 0.7, "linear"),
    ("sde_cosine_8", "euler_maruyama_sampler", 8, False, 1.0, 0.0, 1.0, "cosine"),
    ("sde_cosine_8_cfg", "euler_maruyama_sampler", 8, True, 2.0, 0.0, 1.0, "cosine"),
    ("sde_published", "euler_maruyama_sampler", 250, False, 1.8, 0.0, 0.7, "linear"),  # README's
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repa", required=True, help="an extracted sihyun-yu/REPA checkout")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(pathlib.Path(args.repa).resolve()))
    import samplers  # REPA's own samplers.py

    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(SEED)
    W = torch.randn(C * H * H, C * H * H, generator=gen) * (0.5 / (C * H * H) ** 0.5)
    c = torch.randn(1, C, H, H, generator=gen) * 0.3
    z = torch.randn(B, C, H, H, generator=gen)
    y = torch.tensor([3, 7])
    out: dict[str, np.ndarray] = {"W": W.numpy(), "c": c.numpy(), "z": z.numpy(), "y": y.numpy()}
    meta = []
    original = torch.randn_like
    for i, (name, fn, steps, heun, scale, low, high, path_type) in enumerate(CASES):
        draws: list[np.ndarray] = []

        def recording(x, *a, draws=draws, **k):
            e = original(x, *a, **k)
            draws.append(e.detach().clone().numpy())
            return e

        calls: list = []
        torch.manual_seed(SEED + i)
        torch.randn_like = recording
        try:
            result = getattr(samplers, fn)(
                fixed_model(W, c, calls),
                z.clone(),
                y,
                num_steps=steps,
                heun=heun,
                cfg_scale=scale,
                guidance_low=low,
                guidance_high=high,
                path_type=path_type,
            )
        finally:
            torch.randn_like = original
        out[f"{name}/out"] = result.numpy()  # float64, as the reference returns it
        out[f"{name}/call_x"] = np.stack([x for x, _, _ in calls])  # the cond half, float32
        out[f"{name}/call_t"] = np.asarray([t for _, t, _ in calls], np.float32)
        out[f"{name}/call_guided"] = np.asarray([n == 2 * B for _, _, n in calls])
        if draws:
            out[f"{name}/noises"] = np.stack(draws)  # float64 [num_steps - 1, B, C, H, W]
        meta.append(
            {
                "name": name,
                "mode": "ode" if fn == "euler_sampler" else "sde",
                "num_steps": steps,
                "heun": heun,
                "cfg_scale": scale,
                "guidance_low": low,
                "guidance_high": high,
                "path_type": path_type,
            }
        )
    out["ode_grid_50"] = torch.linspace(1, 0, 51, dtype=torch.float64).numpy()
    sde = torch.linspace(1.0, 0.04, 250, dtype=torch.float64)
    out["sde_grid_250"] = torch.cat([sde, torch.tensor([0.0], dtype=torch.float64)]).numpy()
    out["meta_json"] = np.asarray(json.dumps({"cases": meta, "torch": torch.__version__}))
    target = pathlib.Path(args.out) / "samplers.npz"
    np.savez_compressed(target, **out)
    print(f"wrote {target}: {len(CASES)} cases")


if __name__ == "__main__":
    main()

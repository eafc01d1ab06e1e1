"""Golden vectors from facebookresearch/DiT's own ``diffusion/`` package (``create_diffusion``),
for tests/test_iddpm_parity.py.

    python third_party/dit_diffusion/make_reference.py --dit=/path/to/DiT-checkout

The model is a fixed per-pixel map implemented identically in the test (there channel-last):

    out[o] = (Σ_c W[o, c] x[c]) (1 + t/1000) + b[o] t/1000,  o < 2C,  the variance half through tanh

with W [2C, C] and b [2C] drawn from a seeded NumPy generator; t is the ORIGINAL step index the
reference's ``_WrappedModel`` passes. Every random draw (noise, the samplers' per-step
``torch.randn_like``) is drawn here with NumPy and handed to the reference: ``torch.randn_like``
is replaced during the sampling loops by a function that returns the stored draws in order.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import numpy as np
import torch

SHAPE = (4, 2, 3, 3)  # B, C, H, W (NCHW as DiT)


def fixed_model(W: torch.Tensor, b: torch.Tensor, learn_sigma: bool = True):
    C = W.shape[1]

    def model(x, t, **kwargs):
        s = t.to(torch.float32).view(-1, 1, 1, 1) / 1000
        out = torch.einsum("oc,bchw->bohw", W, x) * (1 + s) + b.view(1, -1, 1, 1) * s
        if not learn_sigma:
            return out[:, :C]
        return torch.cat([out[:, :C], torch.tanh(out[:, C:])], dim=1)

    return model


@contextlib.contextmanager
def injected_randn_like(draws: list[np.ndarray]):
    original, queue = torch.randn_like, list(draws)

    def randn_like(x, **kwargs):
        draw = queue.pop(0)
        assert draw.shape == tuple(x.shape), (draw.shape, tuple(x.shape))
        return torch.from_numpy(draw.copy())

    torch.randn_like = randn_like
    try:
        yield
    finally:
        torch.randn_like = original
    assert not queue, f"{len(queue)} stored draws unused"


def t_(a, dtype=np.float32):
    return torch.from_numpy(np.asarray(a, dtype).copy())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dit", required=True, help="a checkout of facebookresearch/DiT")
    parser.add_argument("--out", default=str(Path(__file__).parent))
    args = parser.parse_args()
    sys.path.insert(0, args.dit)
    from diffusion import create_diffusion  # the reference's own package
    from diffusion.respace import space_timesteps

    torch.set_num_threads(1)
    rng = np.random.default_rng(20230602)
    C = SHAPE[1]
    W = (rng.standard_normal((2 * C, C)) * 0.5).astype(np.float32)
    b = (rng.standard_normal(2 * C) * 0.5).astype(np.float32)
    x_start = rng.uniform(-1, 1, SHAPE).astype(np.float32)
    x_start[0, 0, 0, :] = [-1.0, 1.0, 0.0]  # the decoder's open-ended edge bins
    noise = rng.standard_normal(SHAPE).astype(np.float32)
    t = np.asarray([0, 1, 500, 999], np.int64)
    out: dict[str, np.ndarray] = {"W": W, "b": b, "x_start": x_start, "noise": noise, "t": t}
    model = fixed_model(t_(W), t_(b))

    base = create_diffusion(timestep_respacing="")  # DiT's train.py
    out["betas_1000"] = base.betas
    out["q_sample"] = base.q_sample(t_(x_start), t_(t, np.int64), noise=t_(noise)).numpy()
    variants = {
        "default": dict(),
        "rescaled": dict(rescale_learned_sigmas=True),
        "fixed": dict(learn_sigma=False),
        "kl": dict(use_kl=True),
    }
    for name, kwargs in variants.items():
        d = create_diffusion(timestep_respacing="", **kwargs)
        m = fixed_model(t_(W), t_(b), learn_sigma=kwargs.get("learn_sigma", True))
        terms = d.training_losses(m, t_(x_start), t_(t, np.int64), noise=t_(noise))
        for key, value in terms.items():
            out[f"losses/{name}/{key}"] = value.detach().numpy()

    x_t = rng.standard_normal(SHAPE).astype(np.float32)
    out["x_t"] = x_t
    for respacing in ("", "250"):
        d = create_diffusion(timestep_respacing=respacing)
        steps = np.asarray([0, 3, d.num_timesteps // 2, d.num_timesteps - 1], np.int64)
        out[f"pmv_t/{respacing or 'full'}"] = steps
        for clip in (True, False):
            o = d.p_mean_variance(model, t_(x_t), t_(steps, np.int64), clip_denoised=clip)
            for key in ("mean", "variance", "log_variance", "pred_xstart"):
                out[f"pmv/{respacing or 'full'}/{clip}/{key}"] = o[key].numpy()
    d250 = create_diffusion("250")
    out["betas_250"], out["timestep_map_250"] = d250.betas, np.asarray(d250.timestep_map, np.int64)
    for spec in ("250", "ddim25", "10,15,20", "1"):
        out[f"space/{spec}"] = np.asarray(sorted(space_timesteps(1000, spec)), np.int64)

    z = rng.standard_normal(SHAPE).astype(np.float32)
    out["z"] = z
    loops = []
    for respacing in ("10", "25", "250"):  # "250": DiT's sample.py
        d = create_diffusion(respacing)
        methods = (("ddpm", 0.0),) if respacing == "250" else (("ddpm", 0.0), ("ddim", 0.0), ("ddim", 0.5))
        for method, eta in methods:
            draws = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(d.num_timesteps)]
            states = []
            with injected_randn_like(draws), torch.no_grad():
                if method == "ddpm":
                    progressive = d.p_sample_loop_progressive(
                        model, SHAPE, noise=t_(z), clip_denoised=False, device="cpu"
                    )
                else:
                    progressive = d.ddim_sample_loop_progressive(
                        model, SHAPE, noise=t_(z), clip_denoised=False, device="cpu", eta=eta
                    )
                for step in progressive:
                    states.append(step["sample"].numpy())
            key = f"loop/{respacing}/{method}/{eta}"
            out[key] = np.stack(states)
            out[f"{key}/noises"] = np.stack(draws)
            loops.append({"key": key, "respacing": respacing, "method": method, "eta": eta})

    out["meta_json"] = np.asarray(
        json.dumps({"loops": loops, "variants": variants, "torch": torch.__version__})
    )
    np.savez_compressed(Path(args.out) / "iddpm.npz", **out)
    print(f"wrote {len(out)} arrays")


if __name__ == "__main__":
    main()

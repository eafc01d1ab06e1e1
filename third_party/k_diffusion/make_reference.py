"""Step 2 of 2 (run with PyTorch and k-diffusion, NOT dew's environment): run k-diffusion's own
samplers on the exact Gaussian-mixture denoiser and store what they produce.

    python -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch==2.13.0 numpy
    /tmp/torchvenv/bin/pip download --no-deps k-diffusion==0.1.1.post1 -d /tmp/kdiff
    unzip -q /tmp/kdiff/k_diffusion-0.1.1.post1-py3-none-any.whl -d /tmp/kdiff/kd
    /tmp/torchvenv/bin/python third_party/k_diffusion/make_reference.py /tmp/kdiff/kd

Only ``k_diffusion/sampling.py`` is loaded, from the unpacked wheel; its imports of scipy,
torchdiffeq, torchsde, tqdm and ``k_diffusion.utils`` are satisfied by tiny stand-ins (none of
them is used by the functions called here, except ``utils.append_dims``, re-stated below and
``trange``, a plain ``range``). Everything runs in float64. The denoiser is written here in torch
from its formula, independently of dew's JAX version.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import types

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
torch.set_default_dtype(torch.float64)


def load_sampling(root: pathlib.Path) -> types.ModuleType:
    def append_dims(x, target_dims):
        return x[(...,) + (None,) * (target_dims - x.ndim)]

    package = types.ModuleType("k_diffusion")
    package.__path__ = [str(root / "k_diffusion")]
    utils = types.ModuleType("k_diffusion.utils")
    utils.append_dims = append_dims
    tqdm_auto = types.ModuleType("tqdm.auto")
    tqdm_auto.trange = lambda n, disable=None: range(n)
    tqdm_auto.tqdm = lambda *a, **k: None
    stand_ins = {
        "k_diffusion": package,
        "k_diffusion.utils": utils,
        "scipy": types.ModuleType("scipy"),
        "torchdiffeq": types.ModuleType("torchdiffeq"),
        "torchsde": types.ModuleType("torchsde"),
        "tqdm": types.ModuleType("tqdm"),
        "tqdm.auto": tqdm_auto,
    }
    stand_ins["scipy"].integrate = None
    stand_ins["torchdiffeq"].odeint = None
    sys.modules.update(stand_ins)
    spec = importlib.util.spec_from_file_location(
        "k_diffusion.sampling", root / "k_diffusion" / "sampling.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mixture_denoiser(means, stds, weights):
    var = stds**2
    dim = means.shape[1]

    def denoise(x, sigma):
        s2 = (sigma**2)[:, None]  # k-diffusion passes σ per example
        total = var[None, :] + s2
        sq = ((x[:, None, :] - means[None]) ** 2).sum(-1)
        logits = torch.log(weights)[None] - 0.5 * dim * torch.log(total) - 0.5 * sq / total
        w = torch.softmax(logits, dim=-1)
        posterior = (var[None, :, None] * x[:, None, :] + s2[..., None] * means[None]) / total[..., None]
        return (w[..., None] * posterior).sum(1)

    return denoise


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: make_reference.py <unpacked k-diffusion wheel directory>")
    kd = load_sampling(pathlib.Path(sys.argv[1]))
    inputs = dict(np.load(HERE / "inputs.npz"))
    t = {k: torch.from_numpy(v) for k, v in inputs.items() if v.ndim}
    denoise = mixture_denoiser(t["means"], t["stds"], t["weights"])
    points = int(inputs["points"])
    sigmas = kd.get_sigmas_karras(points, 0.002, 80.0, 7.0)  # points + the trailing 0
    churn = {"s_churn": 40.0, "s_tmin": 0.05, "s_tmax": 50.0, "s_noise": 1.003}
    out = {"sigmas_karras": sigmas.numpy(), **{f"input_{k}": v for k, v in inputs.items()}}

    def run(name, fn, **kwargs):
        states, calls = [], iter(t["churn_noise"])
        real_randn_like = torch.randn_like

        def fed_randn_like(x):  # called once per step, with the step's x_i before churn
            states.append(x.clone())
            return next(calls).clone()

        torch.randn_like = fed_randn_like
        try:
            x0 = t["noise"] * sigmas[0]
            if name == "dpmpp_2m":  # draws no noise: read x_i through the callback instead
                result = fn(denoise, x0, sigmas, callback=lambda info: states.append(info["x"].clone()))
            else:
                result = fn(denoise, x0, sigmas, **kwargs)
        finally:
            torch.randn_like = real_randn_like
        out[f"{name}_states"] = torch.stack(states).numpy()
        out[f"{name}_output"] = result.numpy()

    run("euler", kd.sample_euler)
    run("heun", kd.sample_heun)
    run("euler_churn", kd.sample_euler, **churn)
    run("heun_churn", kd.sample_heun, **churn)
    run("dpmpp_2m", kd.sample_dpmpp_2m)
    np.savez(HERE / "reference.npz", **out)
    print(f"wrote {HERE / 'reference.npz'}: {sorted(out)}")


if __name__ == "__main__":
    main()

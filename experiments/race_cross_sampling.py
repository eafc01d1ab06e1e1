"""Cross-sampling the digits race: each side's sampler on each side's trained network, same noise.

The race (``experiments/digits_race.py`` against ``third_party/edm/digits_race_reference.py``)
compares two trainings through two samplers. This script separates them. Given the networks a
pair of race runs kept (the reference's EMA and raw ``EDMPrecond`` state dicts,
``--state_dict_out`` / ``--raw_state_dict_out``; dew's debiased EMA and raw parameters,
``--params_out``), it draws ``--per_class`` samples of every class from each of the four networks

* with NVlabs/edm's ``edm_sampler`` (Heun, float64 state, its σ grid in float64), run by the
  reference script's ``--sample_state_dict`` mode in PyTorch's environment: dew's networks go
  there as state dicts (``to_state_dict``, the exact inverse of ``dew.networks.edm_weights``'
  layout conversion), and
* with dew's sampler (``Diffusion.denoiser`` and ``dew.sampling.sample``, Heun, float32, σ from
  ``Process.sigmas``), from the very latents the reference drew (``--seed``'s draw of
  ``experiments/race_latents.py``, the race's shared noise),

and the same digit classifier scores all eight sets. Because the noise is shared, the two
samplers are also compared sample by sample (largest pixel difference, classifier agreement).
It also reports the largest difference between the two σ grids.

    PYTHONPATH=. python experiments/race_cross_sampling.py --edm=<NVlabs/edm checkout> \\
        --torch_python=<torch venv python> --reference_ema=ref_ema.npz --reference_raw=ref_raw.npz \\
        --dew_params=dew_params.npz --workdir=/tmp/cross [--per_class=100] [--seed=1]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
REFERENCE = HERE.parent / "third_party" / "edm" / "digits_race_reference.py"


def to_state_dict(params: dict, template: dict[str, np.ndarray], arch: str = "songunet") -> dict:
    """dew's haiku parameters as the reference state dict ``template`` lays them out (its keys,
    shapes and fixed ``resample_filter`` buffers): each key's element indices are sent through
    ``convert_state_dict`` (the forward conversion), which says where each reference element sits
    in dew's array, so the inverse is exact by construction. Raises ValueError on a missing
    module or a shape that does not fit."""
    from dew.networks.edm_weights import convert_state_dict

    out = {}
    for key, value in template.items():
        if key.split(".")[-1] == "resample_filter":
            out[key] = value
            continue
        if value.size >= 2**24:
            raise ValueError(f"{key}: {value.size} elements; float32 indices are exact below 2**24")
        index = np.arange(value.size, dtype=np.float32).reshape(value.shape)
        ((module, leaves),) = convert_state_dict({key: index}, arch).items()
        ((name, where),) = leaves.items()
        if module not in params or name not in params[module]:
            raise ValueError(f"{key}: dew's parameters hold no {module}/{name}")
        given = np.asarray(params[module][name], np.float32)
        if given.shape != where.shape:
            raise ValueError(f"{key}: dew's {module}/{name} is {given.shape}, expected {where.shape}")
        flat = np.empty(value.size, np.float32)
        flat[where.astype(np.int64).ravel()] = given.ravel()
        out[key] = flat.reshape(value.shape)
    return out


def unflatten(flat: dict[str, np.ndarray], prefix: str) -> dict:
    """``<prefix>/<module path>/<name>`` arrays (``digits_race.py --params_out``) as haiku params."""
    params: dict = {}
    for key, value in flat.items():
        if key.startswith(prefix + "/"):
            module, name = key[len(prefix) + 1 :].rsplit("/", 1)
            params.setdefault(module, {})[name] = value
    return params


def reference_sampler(args: argparse.Namespace, state_dict: str, out: str) -> dict[str, np.ndarray]:
    """NVlabs/edm's ``edm_sampler`` on ``state_dict``; returns its latents, labels and samples."""
    subprocess.run(
        [
            sys.executable,
            str(REFERENCE),
            f"--edm={args.edm}",
            f"--torch_python={args.torch_python}",
            f"--sample_state_dict={state_dict}",
            f"--per_class={args.per_class}",
            f"--points={args.points}",
            f"--sample_seeds={args.seed}",
            f"--out={out}.json",
            f"--samples_out={out}.npz",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    with np.load(f"{out}.npz") as data:
        return {k: data[k] for k in ("latents", "labels", "ema")}


def main() -> int:
    assert __doc__ is not None  # the description is the module docstring
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edm", required=True, help="an NVlabs/edm checkout")
    parser.add_argument("--torch_python", required=True)
    parser.add_argument("--reference_ema", required=True)
    parser.add_argument("--reference_raw", required=True)
    parser.add_argument("--dew_params", required=True, help="digits_race.py --params_out")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--per_class", type=int, default=100)
    parser.add_argument("--points", type=int, default=18)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--noise_seeds",
        type=int,
        default=10,
        help="dew's own draws at seeds 1..N, to show the noise's spread",
    )
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)

    import jax
    import jax.numpy as jnp

    from dew.config import load_config
    from dew.networks.edm_weights import convert_state_dict, load_npz_state_dict
    from dew.sampling import sample
    from dew.scoring.digits_classifier import classify_digits
    from dew.training.trainer import Trainer, resolve_config

    config = resolve_config(load_config(str(HERE / "edm.py")), ["config.eval.num_batches=1"])
    objective: Any = Trainer(config, os.path.join(args.workdir, "unused")).objective  # a Diffusion

    template = load_npz_state_dict(args.reference_ema)
    with np.load(args.dew_params) as data:
        flat = {k: data[k] for k in data.files}
    networks = {
        "NVlabs/edm EMA": (args.reference_ema, convert_state_dict(template, "songunet")),
        "NVlabs/edm raw": (
            args.reference_raw,
            convert_state_dict(load_npz_state_dict(args.reference_raw), "songunet"),
        ),
    }
    for name in ("ema", "raw"):
        params = unflatten(flat, name)
        path = os.path.join(args.workdir, f"dew_{name}_state_dict.npz")
        np.savez(path, **{f"param/{k}": v for k, v in to_state_dict(params, template).items()})
        networks[f"dew {name.upper() if name == 'ema' else name}"] = (path, params)

    sigmas = objective.process.sigmas(args.points)
    n = np.arange(args.points, dtype=np.float64)
    rho, lo, hi = 7.0, 0.002, 80.0
    grid64 = (hi ** (1 / rho) + n / (args.points - 1) * (lo ** (1 / rho) - hi ** (1 / rho))) ** rho
    sigma_gap = float(np.max(np.abs(np.asarray(sigmas, np.float64) - grid64) / grid64))

    @jax.jit
    def dew_draw(params, noise, labels):
        denoise = objective.denoiser(params, {"label": labels})
        return sample(denoise, noise, sigmas, "heun")

    rows = []
    for name, (path, params) in networks.items():
        ref = reference_sampler(
            args, path, os.path.join(args.workdir, name.replace(" ", "_").replace("/", ""))
        )
        labels = ref["labels"].astype(np.int32)
        noise = jnp.asarray(ref["latents"].transpose(0, 2, 3, 1), jnp.float32)  # NCHW -> NHWC
        ours = np.asarray(dew_draw(jax.tree.map(jnp.asarray, params), noise, jnp.asarray(labels)))
        race_noise = jax.random.normal(jax.random.PRNGKey(args.seed), noise.shape, jnp.float32)
        own_noise = np.asarray(dew_draw(jax.tree.map(jnp.asarray, params), race_noise, jnp.asarray(labels)))
        spread = []
        for seed in range(1, args.noise_seeds + 1):
            z = jax.random.normal(jax.random.PRNGKey(seed), noise.shape, jnp.float32)
            drawn = np.asarray(dew_draw(jax.tree.map(jnp.asarray, params), z, jnp.asarray(labels)))
            spread.append(float(np.mean(classify_digits(np.clip(drawn, -1, 1)) == labels)))
        said_ref = classify_digits(np.clip(ref["ema"], -1, 1))
        said_dew = classify_digits(np.clip(ours, -1, 1))
        said_own = classify_digits(np.clip(own_noise, -1, 1))
        rows.append(
            {
                "network": name,
                "reference_sampler": float(np.mean(said_ref == labels)),
                "dew_sampler": float(np.mean(said_dew == labels)),
                "dew_sampler_own_noise": float(np.mean(said_own == labels)),
                "max_pixel_difference": float(np.max(np.abs(ours - ref["ema"]))),
                "classifier_agreement": float(np.mean(said_ref == said_dew)),
                "dew_sampler_seeds": spread,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    record = {
        "samples": 10 * args.per_class,
        "points": args.points,
        "sigma_grid_max_relative_difference": sigma_gap,
        "rows": rows,
    }
    with open(os.path.join(args.workdir, "cross_sampling.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(f"σ grids (dew float32 vs the reference's float64): largest relative difference {sigma_gap:.2e}")
    print(
        "| network | NVlabs/edm's sampler | dew's sampler (same noise) | dew's (own noise, seed "
        f"{args.seed}) | dew's, seeds 1-{args.noise_seeds}: mean (min-max) | max |Δpixel| |"
    )
    for r in rows:
        seeds = r["dew_sampler_seeds"] or [float("nan")]
        print(
            f"| {r['network']} | {r['reference_sampler']:.1%} | {r['dew_sampler']:.1%} | "
            f"{r['dew_sampler_own_noise']:.1%} | {np.mean(seeds):.1%} ({min(seeds):.1%}-{max(seeds):.1%}) | "
            f"{r['max_pixel_difference']:.1e} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

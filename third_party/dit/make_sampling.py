"""A golden of facebookresearch/DiT's ``sample.py`` sampling, for tests/test_iddpm_objective.py:
the tiny DiT (``dit_tiny_state_dict.npz``'s weights, built by the reference's ``models.DiT`` from
``dit_tiny.npz``'s ``config_json``) sampled by the reference's own ``create_diffusion(str(steps))``
and ``p_sample_loop`` through ``model.forward_with_cfg``, exactly as ``sample.py`` composes them:

    z = torch.randn(n, 4, latent_size, latent_size)
    z = torch.cat([z, z], 0); y_null = torch.tensor([1000] * n); y = torch.cat([y, y_null], 0)
    samples = diffusion.p_sample_loop(model.forward_with_cfg, z.shape, z, clip_denoised=False,
                                      model_kwargs=dict(y=y, cfg_scale=args.cfg_scale), ...)
    samples, _ = samples.chunk(2, dim=0)

(the null label is the tiny network's ``num_classes``, 10). The per-step ``torch.randn_like``
draws are made here with NumPy and handed to the reference in order (``torch.randn_like`` is
replaced during the loop), so the test can feed dew the same draws.

    python third_party/dit/make_sampling.py --dit=/path/to/DiT-checkout --out=third_party/dit
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

STEPS, CFG_SCALE, LABELS = 10, 4.0, (3, 7)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dit", required=True, help="a checkout of facebookresearch/DiT")
    parser.add_argument("--out", default=str(Path(__file__).parent))
    args = parser.parse_args()
    sys.path.insert(0, args.dit)
    import models  # the reference's own
    from diffusion import create_diffusion

    here = Path(args.out)
    config = json.loads(str(np.load(here / "dit_tiny.npz", allow_pickle=False)["config_json"]))
    state = dict(np.load(here / "dit_tiny_state_dict.npz", allow_pickle=False))
    torch.set_num_threads(2)
    model = models.DiT(**config).eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})

    rng = np.random.default_rng(46)
    n, side = len(LABELS), config["input_size"]
    z = rng.standard_normal((n, config["in_channels"], side, side)).astype(np.float32)
    diffusion = create_diffusion(str(STEPS))
    doubled = (2 * n, config["in_channels"], side, side)
    draws = [rng.standard_normal(doubled).astype(np.float32) for _ in range(diffusion.num_timesteps)]
    queue, original = list(draws), torch.randn_like

    def randn_like(x, **kwargs):
        draw = queue.pop(0)
        assert draw.shape == tuple(x.shape)
        return torch.from_numpy(draw.copy())

    zz = torch.cat([torch.from_numpy(z), torch.from_numpy(z)], 0)
    y = torch.tensor(list(LABELS) + [config["num_classes"]] * n)
    torch.randn_like = randn_like
    try:
        with torch.no_grad():
            samples = diffusion.p_sample_loop(
                model.forward_with_cfg,
                zz.shape,
                zz,
                clip_denoised=False,
                model_kwargs={"y": y, "cfg_scale": CFG_SCALE},
                progress=False,
                device="cpu",
            )
    finally:
        torch.randn_like = original
    assert not queue
    samples, _ = samples.chunk(2, dim=0)
    np.savez(
        here / "dit_tiny_sample.npz",
        z=z,
        labels=np.asarray(LABELS, np.int32),
        noises=np.stack(draws),
        samples=samples.numpy(),
        steps=np.int32(STEPS),
        cfg_scale=np.float32(CFG_SCALE),
    )
    print(f"wrote {here / 'dit_tiny_sample.npz'}: samples {tuple(samples.shape)}")


if __name__ == "__main__":
    main()

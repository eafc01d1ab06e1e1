"""Golden vectors from willisma/SiT's own ``transport/`` package, for tests/test_interpolants*.py.

Run with a PyTorch that has torchdiffeq (see README.md):

    python third_party/sit/make_reference.py --sit=/path/to/SiT-checkout

The model is a fixed map implemented identically in tests/test_interpolants_parity.py:

    model(x, t) = (flat(x) @ W).reshape(x.shape) * (1 + 0.5 t) + t * c

with W [D, D] and c [C, H, W] drawn once from a seeded NumPy generator (float32). Every random
draw the reference would make (x0, t, the SDE's per-step noise) is drawn here with NumPy and
handed to the reference's functions: its ``torch.randn`` is replaced during the SDE samplers by a
function that returns the stored draws in order.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import numpy as np
import torch

SHAPE = (3, 2, 2, 2)  # B, C, H, W: tiny, NCHW as SiT
PATHS = ("Linear", "GVP", "VP")
PREDICTIONS = ("velocity", "score", "noise")
WEIGHTS = (None, "velocity", "likelihood")
FORMS = ("constant", "SBDM", "sigma", "linear", "decreasing", "inccreasing-decreasing")


def fixed_model(W: torch.Tensor, c: torch.Tensor):
    def model(x, t, **kwargs):
        b = x.shape[0]
        t4 = t.view(b, 1, 1, 1)
        return (x.reshape(b, -1) @ W).reshape(x.shape) * (1 + 0.5 * t4) + t4 * c

    return model


class Counting:
    """Counts the model's evaluations."""

    def __init__(self, model):
        self.model, self.calls = model, 0

    def __call__(self, x, t, **kwargs):
        self.calls += 1
        return self.model(x, t, **kwargs)


@contextlib.contextmanager
def injected_randn(draws: list[np.ndarray]):
    """torch.randn(size) returns the next stored draw (the SDE samplers' only randomness)."""
    original, queue = torch.randn, list(draws)

    def randn(*size, **kwargs):
        shape = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else tuple(size)
        draw = queue.pop(0)
        assert draw.shape == shape, (draw.shape, shape)
        return torch.from_numpy(draw.copy())

    torch.randn = randn
    try:
        yield
    finally:
        torch.randn = original
    assert not queue, f"{len(queue)} stored draws unused"


def t_(a):
    return torch.from_numpy(np.asarray(a, np.float32).copy())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sit", required=True, help="a checkout of willisma/SiT")
    parser.add_argument("--out", default=str(Path(__file__).parent))
    args = parser.parse_args()
    sys.path.insert(0, args.sit)
    from transport import Sampler, create_transport  # the reference's own package
    from transport import path as sit_path

    torch.set_num_threads(1)
    rng = np.random.default_rng(20240917)
    d = int(np.prod(SHAPE[1:]))
    W = (rng.standard_normal((d, d)) * 0.3 / np.sqrt(d)).astype(np.float32)
    c = (rng.standard_normal(SHAPE[1:]) * 0.5).astype(np.float32)
    model = fixed_model(t_(W), t_(c))
    x1 = rng.standard_normal(SHAPE).astype(np.float32)
    x0 = rng.standard_normal(SHAPE).astype(np.float32)
    t_train = np.asarray([0.013, 0.47, 0.9991], np.float32)
    out: dict[str, np.ndarray] = {"W": W, "c": c, "x1": x1, "x0": x0, "t": t_train}
    eps_rules = []

    # --- create_transport's margins and check_interval --------------------------------------------
    for path in PATHS:
        for pred in PREDICTIONS:
            for train_eps, sample_eps in ((None, None), (0.01, 0.02)):
                tr = create_transport(path, pred, None, train_eps, sample_eps)
                row = {
                    "path": path,
                    "prediction": pred,
                    "train_eps_in": train_eps,
                    "sample_eps_in": sample_eps,
                    "train_eps": tr.train_eps,
                    "sample_eps": tr.sample_eps,
                    "intervals": [],
                }
                for sde in (False, True):
                    for form in ("SBDM", "sigma"):
                        for ev in (False, True):
                            for rev in (False, True):
                                for lss in (0.0, 0.04):
                                    t0, t1 = tr.check_interval(
                                        tr.train_eps,
                                        tr.sample_eps,
                                        diffusion_form=form,
                                        sde=sde,
                                        reverse=rev,
                                        eval=ev,
                                        last_step_size=lss,
                                    )
                                    row["intervals"].append([form, sde, ev, rev, lss, float(t0), float(t1)])
                eps_rules.append(row)

    # --- training targets and losses for every path x prediction x weighting -----------------------
    for path in PATHS:
        for pred in PREDICTIONS:
            for weight in WEIGHTS:
                tr = create_transport(path, pred, weight)
                _, xt, ut = tr.path_sampler.plan(t_(t_train), t_(x0), t_(x1))
                # training_losses draws x0 and t itself: hand it ours through its own sample().
                tr.sample = lambda x1_, tr=tr: (t_(t_train), t_(x0), x1_)
                terms = tr.training_losses(model, t_(x1))
                key = f"{path}/{pred}/{weight}"
                out[f"loss/{key}"] = terms["loss"].numpy()
                out[f"pred/{key}"] = terms["pred"].numpy()
            out[f"xt/{path}"], out[f"ut/{path}"] = xt.numpy(), ut.numpy()

    # --- the path's coefficients, conversions, drift and score, diffusion forms ---------------------
    v = rng.standard_normal(SHAPE).astype(np.float32)
    out["v"] = v
    t_conv = np.asarray([0.05, 0.5, 0.93], np.float32)
    out["t_conv"] = t_conv
    for path in PATHS:
        plan = create_transport(path).path_sampler
        te = sit_path.expand_t_like_x(t_(t_conv), t_(x1))
        a, da = plan.compute_alpha_t(te)
        s, ds = plan.compute_sigma_t(te)
        out[f"coef/{path}"] = np.stack(
            [
                np.broadcast_to(np.asarray(q, np.float32), te.shape)
                for q in (a, da, s, ds, plan.compute_d_alpha_alpha_ratio_t(te))
            ]
        )
        dm, dv = plan.compute_drift(t_(x1), t_(t_conv))
        out[f"drift_mean/{path}"], out[f"drift_var/{path}"] = dm.numpy(), np.asarray(dv, np.float32)
        out[f"score_from_velocity/{path}"] = plan.get_score_from_velocity(t_(v), t_(x1), t_(t_conv)).numpy()
        out[f"noise_from_velocity/{path}"] = plan.get_noise_from_velocity(t_(v), t_(x1), t_(t_conv)).numpy()
        out[f"velocity_from_score/{path}"] = plan.get_velocity_from_score(t_(v), t_(x1), t_(t_conv)).numpy()
        for form in FORMS:
            # a 0-d tensor norm: the reference's "constant" form returns the norm itself, which
            # only a tensor lets its SDE take the square root of
            w = plan.compute_diffusion(t_(x1), t_(t_conv), form=form, norm=torch.tensor(0.7))
            out[f"diffusion/{path}/{form}"] = np.broadcast_to(np.asarray(w, np.float32), te.shape).copy()
        for pred in PREDICTIONS:
            tr = create_transport(path, pred)
            out[f"drift/{path}/{pred}"] = tr.get_drift()(t_(x1), t_(t_conv), model).numpy()
            out[f"score/{path}/{pred}"] = tr.get_score()(t_(x1), t_(t_conv), model).numpy()

    # --- ODE samplers: torchdiffeq's euler, heun2 and dopri5 --------------------------------------
    z = rng.standard_normal(SHAPE).astype(np.float32)
    out["z"] = z
    ode_cases = []
    for path in PATHS:
        for pred in ("velocity", "noise"):
            for method, steps in (("euler", 9), ("heun2", 9), ("dopri5", 5)):
                for reverse in (False, True) if method == "dopri5" and pred == "velocity" else (False,):
                    tr = create_transport(path, pred)
                    counting = Counting(model)
                    fn = Sampler(tr).sample_ode(
                        sampling_method=method, num_steps=steps, atol=1e-6, rtol=1e-3, reverse=reverse
                    )
                    key = f"ode/{path}/{pred}/{method}/{'reverse' if reverse else 'forward'}"
                    try:
                        traj = fn(t_(z), counting)
                    except AssertionError as e:  # VP + noise: the fixed map's score blows up at 1 - eps
                        print(f"skipped {key}: the reference's dopri5 stops ({e})")
                        continue
                    key = f"ode/{path}/{pred}/{method}/{'reverse' if reverse else 'forward'}"
                    out[key] = traj.numpy()
                    out[f"nfe/{key}"] = np.asarray(counting.calls, np.int32)
                    ode_cases.append(key)
                    print(key, counting.calls, flush=True)

    # --- SDE samplers with injected noise ----------------------------------------------------------
    sde_cases = []
    steps = 8
    settings = []
    for form in ("constant", "SBDM", "sigma", "linear", "decreasing", "inccreasing-decreasing"):
        settings.append(("Linear", "velocity", "Euler", form, "Mean"))
    for last in (None, "Tweedie", "Euler"):
        settings.append(("Linear", "velocity", "Euler", "sigma", last))
    for path in PATHS:
        for pred in PREDICTIONS:
            settings.append((path, pred, "Heun", "sigma", "Mean"))
            settings.append((path, pred, "Euler", "SBDM", "Tweedie"))
    for i, (path, pred, method, form, last) in enumerate(settings):
        tr = create_transport(path, pred)
        draws = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(steps - 1)]
        fn = Sampler(tr).sample_sde(
            sampling_method=method,
            diffusion_form=form,
            diffusion_norm=torch.tensor(0.8),
            last_step=last,
            last_step_size=0.05,
            num_steps=steps,
        )
        with injected_randn(draws), torch.no_grad():
            traj = torch.stack(fn(t_(z), model))
        key = f"sde/{i}"
        out[key] = traj.numpy()
        out[f"{key}/noises"] = np.stack(draws)
        sde_cases.append(
            {
                "key": key,
                "path": path,
                "prediction": pred,
                "method": method,
                "diffusion_form": form,
                "last_step": last,
            }
        )

    # --- sample.py's own settings: 250 points / steps --------------------------------------------
    tr = create_transport("Linear", "velocity")
    counting = Counting(model)
    traj = Sampler(tr).sample_ode(sampling_method="dopri5", num_steps=250, atol=1e-6, rtol=1e-3)(
        t_(z), counting
    )
    out["published/ode"], out["published/ode/nfe"] = traj.numpy(), np.asarray(counting.calls, np.int32)
    draws = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(249)]
    fn = Sampler(tr).sample_sde(
        sampling_method="Euler",
        diffusion_form="sigma",
        diffusion_norm=1.0,
        last_step="Mean",
        last_step_size=0.04,
        num_steps=250,
    )
    with injected_randn(draws), torch.no_grad():
        out["published/sde"] = torch.stack(fn(t_(z), model)).numpy()
    out["published/sde/noises"] = np.stack(draws)

    meta = {
        "eps_rules": eps_rules,
        "ode_cases": ode_cases,
        "sde_cases": sde_cases,
        "sde_num_steps": steps,
        "sde_diffusion_norm": 0.8,
        "sde_last_step_size": 0.05,
        "diffusion_norm": 0.7,
        "torch": torch.__version__,
    }
    out["meta_json"] = np.asarray(json.dumps(meta))
    np.savez_compressed(Path(args.out) / "transport.npz", **out)
    print(f"wrote {len(out)} arrays")


if __name__ == "__main__":
    main()

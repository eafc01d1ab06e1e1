"""``python -m dew.phema --workdir=runs/edm --sigma_rel=0.07 [--out=DIR] [--step=N]``

Post-hoc EMA (Karras et al. 2024): reconstructs the power-function EMA of relative width
``sigma_rel`` from the snapshots a run saved (``config.ema.power_std_rels``,
``<workdir>/power_ema``) by the least-squares solution of ``dew.averaging.posthoc``, and writes
it as a checkpoint of a run directory (default ``<workdir>/phema/sigma_rel_0.070``):

    <out>/run.json                the run's config, plus {"phema": {sigma_rel, source, step, ...}}
    <out>/checkpoints/<step>/     a full dew checkpoint of the run's step, its params and EMA
                                  replaced by the reconstruction

The EMA item holds the reconstruction, recorded as an average that needs no debiasing, so
``Checkpoints(<out>/checkpoints).restore_ema(template)`` gives the reconstructed weights, and
anything that reads a run directory reads this one. Bad input
exits 2 with one line and writes nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from dew.averaging import posthoc as posthoc_ema


class PhemaError(ValueError):
    """Input the reconstruction cannot use; the message names it."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    assert __doc__ is not None  # the description is the module docstring
    parser = argparse.ArgumentParser(prog="python -m dew.phema", description=__doc__.split("\n\n")[1])
    parser.add_argument("--workdir", required=True, help="a run trained with config.ema.power_std_rels")
    parser.add_argument("--sigma_rel", required=True, type=float, help="EMA width to reconstruct, e.g. 0.07")
    parser.add_argument("--out", default=None, help="output run directory (default <workdir>/phema/...)")
    parser.add_argument("--step", default=None, type=int, help="train step to reconstruct at (default: last)")
    return parser.parse_args(argv)


def _plan(workdir: str, sigma_rel: float, step: int | None, out: str | None) -> dict[str, Any]:
    """Check everything before any work; returns what ``reconstruct_run`` needs."""
    from dew.averaging.power_ema import SNAPSHOT_DIR, PowerEMASnapshots
    from dew.checkpointing import Checkpoints
    from dew.run_records import read_run_metadata

    try:
        posthoc_ema.parse_std_rels([sigma_rel], "--sigma_rel")
    except ValueError as e:
        raise PhemaError(str(e)) from None
    workdir = os.path.abspath(workdir)
    meta = read_run_metadata(workdir) if os.path.isdir(workdir) else None
    if meta is None or "config" not in meta:
        raise PhemaError(f"--workdir={workdir!r} is not a dew run (no run.json with a config)")
    snapshot_dir = os.path.join(workdir, SNAPSHOT_DIR)
    if not os.path.isdir(snapshot_dir):
        raise PhemaError(
            f"--workdir={workdir!r} has no power-EMA snapshots ({snapshot_dir}); train with "
            "--config.ema.power_std_rels='(0.05, 0.1)' to save them"
        )
    store = PowerEMASnapshots(snapshot_dir, read_only=True)
    steps = store.steps()
    store.close()
    ckpt_dir = os.path.join(workdir, "checkpoints")
    ckpt_steps = Checkpoints(ckpt_dir, read_only=True).all_steps() if os.path.isdir(ckpt_dir) else []
    step = max(steps, default=None) if step is None else step
    if step not in steps:
        raise PhemaError(f"--step={step} has no power-EMA snapshot; snapshot steps are {steps}")
    if step not in ckpt_steps:
        raise PhemaError(f"--step={step} has no checkpoint in {ckpt_dir}; checkpoint steps are {ckpt_steps}")
    out = os.path.abspath(
        out or os.path.join(workdir, "phema", f"sigma_rel_{posthoc_ema.std_rel_key(sigma_rel)}")
    )
    if os.path.exists(os.path.join(out, "checkpoints")):
        raise PhemaError(f"--out={out!r} already holds checkpoints; choose another --out or delete it")
    return {"workdir": workdir, "meta": meta, "step": step, "out": out, "snapshot_dir": snapshot_dir}


def reconstruct_run(
    workdir: str, sigma_rel: float, *, step: int | None = None, out: str | None = None
) -> tuple[str, dict[str, Any]]:
    """Write the post-hoc EMA checkpoint; returns (output directory, its ``phema`` record)."""
    import ml_collections

    from dew.averaging import ema as ema_lib
    from dew.averaging.power_ema import PowerEMASnapshots
    from dew.checkpointing import Checkpoints
    from dew.contracts.state import num_updates
    from dew.run_records import save_run_metadata

    plan = _plan(workdir, sigma_rel, step, out)
    config = ml_collections.ConfigDict(plan["meta"]["config"])
    store = PowerEMASnapshots(plan["snapshot_dir"], read_only=True)
    snapshots = store.snapshots()
    store.close()
    updates = int(num_updates(plan["step"], config.train.accumulation))
    used = [s for s in snapshots if s.t <= updates]
    weights = posthoc_ema.solve_coefficients(
        [s.t for s in used], [s.std_rel for s in used], updates, sigma_rel
    )
    weights = weights[:, 0]
    params = posthoc_ema.reconstruct(snapshots, sigma_rel, updates)

    source = Checkpoints(os.path.join(plan["workdir"], "checkpoints"), read_only=True)
    state, _ = source.restore(None, plan["step"])
    # The EMA item holds the reconstruction itself, recorded as a β = 0 EMA (an average that
    # needs no debiasing), so restore_ema (which debiases by the recorded law) returns it as is.
    plain_spec = ema_lib.EMASpec(decay=0.0)
    state = state.replace(
        params=params,
        ema=params,
        power_ema=None,
        ema_law=ema_lib.law(plain_spec, params, config.train.accumulation),
    )
    plain = ema_lib.record(plain_spec, params, config.train.accumulation)
    record = {
        "sigma_rel": float(sigma_rel),
        "gamma": float(posthoc_ema.std_rel_to_gamma(sigma_rel)),
        "source": plan["workdir"],
        "step": plan["step"],
        "updates": updates,
        "snapshots": [
            {"t": s.t, "sigma_rel": s.std_rel, "weight": float(w)} for s, w in zip(used, weights, strict=True)
        ],
    }
    save_run_metadata(plan["out"], {**plan["meta"], "phema": record, "label": os.path.basename(plan["out"])})
    target = Checkpoints(
        os.path.join(plan["out"], "checkpoints"), keep=1, keep_best=False, asynchronous=False, ema=plain
    )
    target.save(plan["step"], state, None)
    target.close()
    return plan["out"], record


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from dew.averaging.power_ema import SnapshotError

    try:
        _plan(args.workdir, args.sigma_rel, args.step, args.out)
        out, record = reconstruct_run(args.workdir, args.sigma_rel, step=args.step, out=args.out)
    except (PhemaError, SnapshotError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    largest = max(abs(s["weight"]) for s in record["snapshots"])
    print(
        f"post-hoc EMA sigma_rel={record['sigma_rel']:.3f} (gamma={record['gamma']:.3f}) at step "
        f"{record['step']} from {len(record['snapshots'])} snapshots (largest |weight| {largest:.3g}) "
        f"-> {os.path.join(out, 'checkpoints')}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

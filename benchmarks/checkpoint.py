"""What a checkpoint save costs: the loop's time per save, and where the writer's time goes.

    python benchmarks/checkpoint.py [--parts dew,orbax,loop] [--sizes tiny,50] [--rounds 7]

States (``--sizes``): ``tiny`` is the size of the suite's small runs (a residual MLP of width 16:
8 parameter leaves, ~7 KB of params; the Adam moments and the EMA match), a number is a state of
about that many MB (params, two Adam moments and the EMA, float32, random so compression cannot
shrink the write). Parts:

* ``dew``: ``Checkpoints.save`` per save, asynchronous and synchronous, for each way
  ``Checkpoints`` can write (``--formats``: ``default``, what it writes unasked: by the state's
  size, dew's direct write of orbax's per-leaf zarr format for a small state, orbax's OCDBT for a
  larger one; ``ocdbt`` / ``no-ocdbt``: orbax with OCDBT on / off): ``blocked`` is what the
  caller waits for with nothing in flight (the loop's cost), ``landed`` until the step is on disk
  and the writer is free (the writer's cost; what decides whether the next save finds the
  previous one still in flight), ``cpu`` the process's CPU time (all threads) from the call
  until landed: what a save takes from a loop that keeps every core busy;
* ``orbax``: orbax alone, without dew (``CheckpointManager`` with the pytree handler per item,
  sync and orbax's own async), OCDBT on/off, zarr3, OCDBT without its post-merge validation,
  the five items of a dew step in one composite call against one call per item: where the
  per-item cost lies, with the process's CPU time per save;
* ``loop``: a jitted tiny train step (~``--step_ms`` of work) run ``--steps`` times with a save
  every ``--every`` steps, against the same loop without saves, in alternating rounds: the
  extra wall time per save is the loop time a save costs, all included (the GIL and the cores
  the writer thread takes, waiting for a save still in flight), printed with the steps/s of
  each; where the writer's thread runs at a lower priority
  (``dew.checkpointing.writer.WRITER_NICENESS``), also at the loop's own (``--niceness0``).

Variants alternate within each round (ABAB...) so machine noise hits all of them; medians are
reported, with every round's value.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dew.checkpointing import Checkpoints
from dew.checkpointing import writer as writer_module
from dew.training.state import TrainState

#: The tiny state's parameter shapes: a width-16 residual MLP on 2-D data (the suite's mixture runs).
TINY = {"in/w": (2, 16), "in/b": (16,), "h0/w": (16, 16), "h0/b": (16,), "h1/w": (16, 16), "h1/b": (16,)}
TINY |= {"out/w": (16, 2), "out/b": (2,)}


def make_state(size: str) -> TrainState:
    """``tiny`` (see ``TINY``), or params of about ``size / 4`` MB in eight leaves; Adam's two
    moments and the EMA match."""
    if size == "tiny":
        shapes = TINY
    else:
        per_leaf = max(1, int(float(size) / 4 * 2**20 / 4 / 8 / 256))
        shapes = {f"layer{i}": (per_leaf, 256) for i in range(8)}
    keys = jax.random.split(jax.random.PRNGKey(0), len(shapes))
    params = {
        name: jax.random.normal(k, shape) for (name, shape), k in zip(shapes.items(), keys, strict=True)
    }
    opt_state = optax.adam(1e-3).init(params)
    opt_state = jax.tree.map(lambda x: x + jax.random.normal(keys[0], x.shape) if x.ndim else x, opt_state)
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=opt_state,
        ema=jax.tree.map(lambda x: 0.5 * x, params),
        rng=jax.random.PRNGKey(1),
    )
    return jax.block_until_ready(state)


def nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


def at_step(state: TrainState, step: int) -> TrainState:
    return jax.block_until_ready(state.replace(step=jnp.asarray(step, jnp.int32)))


def cpu_seconds() -> float:
    """This process's CPU time so far, every thread's, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def report(name: str, times: list[float], unit: str = "ms") -> float:
    median = statistics.median(times)
    print(f"  {name:38s} median {median * 1e3:8.2f} {unit}  (rounds: {[round(t * 1e3, 1) for t in times]})")
    return median


def open_checkpoints(path: str, fmt: str, asynchronous: bool = True) -> Checkpoints:
    """``Checkpoints`` writing ``fmt``: ``default`` (what it writes unasked, also on a dew that
    has no choice of format), ``direct`` (dew's direct write of a small state, at any size),
    ``ocdbt`` or ``no-ocdbt`` (orbax)."""
    if fmt in ("default", "direct"):
        checkpoints = Checkpoints(path, keep=2, asynchronous=asynchronous)
        if fmt == "direct":
            checkpoints.store.small_bytes = float("inf")
        return checkpoints
    return Checkpoints(path, keep=2, asynchronous=asynchronous, ocdbt={"ocdbt": True, "no-ocdbt": False}[fmt])


# --- dew ----------------------------------------------------------------------------------------------
def part_dew(state: TrainState, root: str, rounds: int, formats: list[str]) -> None:
    variants: dict[str, Checkpoints] = {}
    for fmt in formats:
        for mode in ("async", "sync"):
            variants[f"{mode} {fmt}"] = open_checkpoints(
                os.path.join(root, f"dew-{mode}-{fmt}"), fmt, asynchronous=mode == "async"
            )
    blocked: dict[str, list[float]] = {name: [] for name in variants}
    landed: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for round_index in range(rounds + 2):  # rounds 0 and 1 warm up (managers, first prune)
        step = round_index + 1
        s = at_step(state, step)
        for name, checkpoints in variants.items():
            start, start_cpu = time.perf_counter(), cpu_seconds()
            checkpoints.save(step, s, None)
            returned = time.perf_counter()
            checkpoints.writer.wait()  # the step is on disk: the next save would not wait
            done, done_cpu = time.perf_counter(), cpu_seconds()
            checkpoints.wait()  # and whatever else is pending (a pruned step's removal), untimed
            if round_index > 1:
                blocked[name].append(returned - start)
                landed[name].append(done - start)
                cpu[name].append(done_cpu - start_cpu)
    for checkpoints in variants.values():
        checkpoints.close()
    print(
        "dew Checkpoints.save: blocked = the caller's wait with nothing in flight; landed = on disk; "
        "cpu = the process's CPU time until landed"
    )
    for name in variants:
        report(f"{name}: blocked", blocked[name])
        report(f"{name}: landed", landed[name])
        report(f"{name}: cpu", cpu[name])


# --- orbax alone ----------------------------------------------------------------------------------------
def part_orbax(state: TrainState, root: str, rounds: int) -> None:
    import orbax.checkpoint as ocp

    from dew.checkpointing import layout

    items = layout.items_from_state(state)
    items["data"] = {"rows": np.zeros((1, 32), np.uint8)}  # a data position: the fifth item

    def handler(fmt: str) -> ocp.PyTreeCheckpointHandler:
        if fmt == "ocdbt unvalidated":  # OCDBT without the read-back after the per-process merge
            from orbax.checkpoint._src.handlers.base_pytree_checkpoint_handler import (
                BasePyTreeCheckpointHandler,
            )

            impl = BasePyTreeCheckpointHandler(use_ocdbt=True, enable_post_merge_validation=False)
            return ocp.PyTreeCheckpointHandler(use_ocdbt=True, handler_impl=impl)
        settings = {"ocdbt": {}, "no-ocdbt": {"use_ocdbt": False}, "ocdbt zarr3": {"use_zarr3": True}}
        return ocp.PyTreeCheckpointHandler(**settings[fmt])

    def manager(path: str, fmt: str, asynchronous: bool) -> ocp.CheckpointManager:
        registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
        for name in items:
            registry.add(name, ocp.args.PyTreeSave, handler(fmt))
        options = ocp.CheckpointManagerOptions(enable_async_checkpointing=asynchronous, max_to_keep=2)
        return ocp.CheckpointManager(path, options=options, handler_registry=registry)

    variants: dict[str, Callable[[int], tuple[float, float]]] = {}
    cases = [(f, m, c) for f in ("ocdbt", "no-ocdbt") for m in ("sync", "async") for c in (True, False)]
    cases += [(f, "sync", True) for f in ("ocdbt zarr3", "ocdbt unvalidated")]
    for fmt, mode, one in cases:
        path = os.path.join(root, f"orbax-{fmt}-{mode}".replace(" ", "-"))
        if one:
            composite = manager(path, fmt, mode == "async")

            def one_call(step: int, m=composite) -> tuple[float, float]:
                start = time.perf_counter()
                m.save(step, args=ocp.args.Composite(**{k: ocp.args.PyTreeSave(v) for k, v in items.items()}))
                returned = time.perf_counter()
                m.wait_until_finished()
                return returned - start, time.perf_counter() - start

            variants[f"{fmt} {mode} one composite call"] = one_call
        else:
            per_item = {name: manager(f"{path}-{name}", fmt, mode == "async") for name in items}

            def each_item(step: int, ms=per_item) -> tuple[float, float]:
                start = time.perf_counter()
                for name, m in ms.items():
                    m.save(step, args=ocp.args.Composite(**{name: ocp.args.PyTreeSave(items[name])}))
                returned = time.perf_counter()
                for m in ms.values():
                    m.wait_until_finished()
                return returned - start, time.perf_counter() - start

            variants[f"{fmt} {mode} one call per item"] = each_item
    blocked: dict[str, list[float]] = {name: [] for name in variants}
    landed: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for round_index in range(rounds + 2):
        for name, save in variants.items():
            start_cpu = cpu_seconds()
            returned, done = save(round_index + 1)
            if round_index > 1:
                blocked[name].append(returned)
                landed[name].append(done)
                cpu[name].append(cpu_seconds() - start_cpu)
    print(
        f"orbax alone, {len(items)} items (blocked = save() returned; landed = wait_until_finished; "
        "cpu = the process's CPU time until landed)"
    )
    for name in variants:
        if " async " in name:
            report(f"{name}: blocked", blocked[name])
        report(f"{name}: landed", landed[name])
        report(f"{name}: cpu", cpu[name])


# --- the loop's time per save --------------------------------------------------------------------------
def part_loop(
    state: TrainState,
    root: str,
    rounds: int,
    steps: int,
    every: int,
    step_ms: float,
    formats: list[str],
    niceness0: bool = False,
) -> None:
    width = 256
    work = jax.random.normal(jax.random.PRNGKey(2), (width, width))

    @jax.jit
    def train_step(s: TrainState, x: jax.Array) -> tuple[TrainState, jax.Array]:
        params = jax.tree.map(lambda p: p * 0.999, s.params)
        return s.replace(step=s.step + 1, params=params), jnp.tanh(x @ work)

    x = jnp.ones((width, width))
    jax.block_until_ready(train_step(state, x))  # compiled outside the timing
    start, y = time.perf_counter(), x
    for _ in range(50):
        _, y = train_step(state, y)
    jax.block_until_ready(y)
    per_call = (time.perf_counter() - start) / 50
    repeats = max(1, round(step_ms / 1e3 / per_call))  # matmuls per step, for about step_ms of work

    def run(checkpoints: Checkpoints | None) -> float:
        s, y = at_step(state, 0), x
        begin = time.perf_counter()
        for step in range(1, steps + 1):
            s, y = train_step(s, y)
            for _ in range(repeats - 1):
                _, y = train_step(s, y)
            y.block_until_ready()  # the loop reads its loss every step, as dew's does
            if checkpoints is not None and step % every == 0:
                checkpoints.save(step, s, None)
        if checkpoints is not None:
            checkpoints.wait()
        return time.perf_counter() - begin

    saves = steps // every
    names = ["no saves", *[f"async {fmt}" for fmt in formats]]
    default_niceness = getattr(writer_module, "WRITER_NICENESS", 0)
    if niceness0 and default_niceness:  # the writer's priority, lowered and not
        names += [f"async {fmt} niceness 0" for fmt in formats]
    walls: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds + 1):
        for name in names:
            checkpoints = None
            if name != "no saves":
                fmt = name.split()[1]
                path = os.path.join(root, f"loop-{round_index}-{name.replace(' ', '-')}")
                if hasattr(writer_module, "WRITER_NICENESS"):
                    writer_module.WRITER_NICENESS = 0 if name.endswith("niceness 0") else default_niceness
                checkpoints = open_checkpoints(path, fmt)
            wall = run(checkpoints)
            if checkpoints is not None:
                checkpoints.close()
            if round_index:
                walls[name].append(wall)
    print(
        f"loop: {steps} steps of ~{per_call * repeats * 1e3:.1f} ms, a save every {every} ({saves} saves); "
        "steps/s of each, and the extra wall per save against the loop without saves in the same round"
    )
    base = walls["no saves"]
    for name in names:
        rates = [steps / w for w in walls[name]]
        print(
            f"  {name + ': steps/s':38s} median {statistics.median(rates):8.2f}     "
            f"(rounds: {[round(r, 1) for r in rates]})"
        )
    report("no saves: wall", base, unit="ms")
    for name in names[1:]:
        extra = [(w - b) / saves for w, b in zip(walls[name], base, strict=True)]
        report(f"{name}: loop time per save", extra)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", default="dew,orbax,loop")
    parser.add_argument("--sizes", default="tiny,50", help="tiny and/or MB per state")
    parser.add_argument("--formats", default="default,ocdbt,no-ocdbt", help="what Checkpoints writes")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=120, help="loop part: steps per round")
    parser.add_argument("--every", type=int, default=10, help="loop part: a save every N steps")
    parser.add_argument("--step_ms", type=float, default=20.0, help="loop part: work per step")
    parser.add_argument("--directory", default=None, help="where to write (default: a temporary directory)")
    parser.add_argument(
        "--niceness0", action="store_true", help="loop part: also the writer at the loop's priority"
    )
    args = parser.parse_args()
    parts, formats = args.parts.split(","), args.formats.split(",")
    for size in args.sizes.split(","):
        state = make_state(size)
        print(
            f"\n== state {size}: {nbytes(state) / 2**20:.3f} MiB in {len(jax.tree.leaves(state))} arrays =="
        )
        root = tempfile.mkdtemp(prefix="dew-ckpt-bench-", dir=args.directory)
        try:
            if "dew" in parts:
                part_dew(state, root, args.rounds, formats)
            if "orbax" in parts:
                part_orbax(state, root, args.rounds)
            if "loop" in parts and size == "tiny":
                part_loop(
                    state, root, args.rounds, args.steps, args.every, args.step_ms, formats, args.niceness0
                )
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Host overhead on the flow-matching toy: a bare hand-written jitted loop, dew's jitted step in a
plain loop, ``fit`` (one call for the whole run, and one call per window), ``Trainer``, and
stix-ml 0.1.1's ``TrainingLoop`` (in its own environment, as a subprocess), in interleaved
windows; medians and ratios.

    PYTHONPATH=. python benchmarks/host_overhead.py [--window 500] [--rounds 15] \
        [--stix-python /work/venv-stix/bin/python] [--kernels] [--steps-per-call N]

The toy: the 2-D mixture (experiments/mixture2d.py's 20,000 rows), MLP 3 -> 128 -> 128 -> 2,
batch 256, flow matching, Adam(1e-4), EMA 0.99. dew runs it as experiments/mixture2d.py plus
``TOY`` (one override for the network, the rest for the preset and optimizer). The bare loop is
what a person writes by hand for this toy: per-epoch numpy shuffle, uniform t, the same haiku
network, Adam, EMA, nothing else. Neither side evaluates.

Interleaving: ``Trainer.run`` trains as a user runs it; at the end of each of its logging
windows a tracker callback runs one window of every other side (bare, plain, fit, stix, in a
rotating order), then returns. Each side's window is timed on its own (wall clock, and this
process's CPU time, XLA's threads included), so all sides see the same machine state in every
round. The first window of every side (compilation) is dropped.

``fit`` is measured two ways. **fit**: one call for the whole run, as ``Trainer.run`` and a
user's loop call it, on a worker thread; a stage at each window boundary waits for the step
(as every side's window does), stops the clock, and parks the loop until the next round starts
it again. **fit/call**: one ``fit`` call per window, which adds its per-call cost (the state
check and the step read at the start, the non-finite check at the end) to every window.

``fit`` and ``Trainer`` run the experiment's ``config.train.steps_per_call`` steps per call of
the compiled program (experiments/mixture2d.py: 10; ``--steps-per-call 1`` measures them one
step per call); **plain** and **bare** call their step once per step.

``--kernels`` also counts the kernels on the hot path of the dew step and the bare step (XLA
CPU, after fusion).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dew.config import apply_overrides, load_config  # noqa: E402
from dew.data import Dataset  # noqa: E402
from dew.tracking.base import LoggingCategory  # noqa: E402
from dew.training.calls import MultiStep  # noqa: E402
from dew.training.loop import Stage, StepContext, fit  # noqa: E402
from dew.training.trainer import Trainer  # noqa: E402

TOY = [
    "config.model.residual=False",  # the network: 3 -> 128 -> 128 -> 2
    "config.model.blocks=2",
    "config.objective.preset=FlowMatching",
    "config.optimizer.learning_rate=0.0001",
    "config.optimizer.warmup_steps=0",
    "config.optimizer.grad_clip=0.0",
    "config.ema.decay=0.99",
    "config.mesh.devices=1",
    "config.eval.every=0",  # no side evaluates or previews: the loops are compared, not the extras
    "config.preview.every=0",
    "config.checkpoint.keep_best=False",
]


def epochs(rows: np.ndarray, batch_size: int, seed: int = 0):
    """The bare side's data: one permutation per epoch, batches sliced from it."""
    epoch = 0
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(len(rows))
        for i in range(len(rows) // batch_size):
            yield {"x": rows[order[i * batch_size : (i + 1) * batch_size]]}
        epoch += 1


def bare_side(trainer: Trainer, rows: np.ndarray):
    """The hand-written loop: flow matching with the same network, Adam, EMA."""
    net, opt, decay = trainer.objective._net, optax.adam(1e-4), 0.99

    def step(carry, batch):
        params, opt_state, ema, rng = carry
        rng, t_key, n_key = jax.random.split(rng, 3)
        y = batch["x"]
        t = jax.random.uniform(t_key, (y.shape[0],))
        noise = jax.random.normal(n_key, y.shape)

        def loss_fn(p):
            x_t = (1 - t[:, None]) * noise + t[:, None] * y
            return jnp.mean((net.apply(p, None, x_t, t, {}, True) - (y - noise)) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        ema = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, ema, params)
        return (params, opt_state, ema, rng), loss

    params = trainer.objective.init(jax.random.PRNGKey(1), trainer.example_batch())
    carry = (params, opt.init(params), jax.tree.map(jnp.zeros_like, params), jax.random.PRNGKey(2))
    return jax.jit(step, donate_argnums=0), carry, epochs(rows, 256)


class Side:
    def __init__(self, name: str):
        self.name, self.rates, self.cpu = name, [], []

    def record(self, steps: int, wall: float, cpu: float) -> None:
        self.rates.append(steps / wall)
        self.cpu.append(cpu / steps * 1e6)


class Rounds:
    """A logger for the Trainer's trackers: at each TRAIN_METRICS report, time the Trainer's window and run
    one window of every other side."""

    def __init__(self, window: int, others: list[Any], trainer_side: Side):
        self.window, self.others, self.side = window, others, trainer_side
        self.count, self.clock = 0, None

    def __call__(self, category: LoggingCategory, to_log: dict[str, Any], step_number: int) -> None:
        if category != LoggingCategory.TRAIN_METRICS:
            return
        wall, cpu = time.perf_counter(), time.process_time()
        if self.clock is not None:
            self.side.record(self.window, wall - self.clock[0], cpu - self.clock[1])
        for i in range(len(self.others)):
            run = self.others[(i + self.count) % len(self.others)]
            run(record=self.count > 0)  # the first window of each side compiles: not recorded
        self.count += 1
        print(f"round {self.count} done", flush=True)
        self.clock = (time.perf_counter(), time.process_time())


class ParkedFit(Stage):
    """``fit`` over the whole run on a worker thread, one window per ``window(record)`` call: the
    stage ends each window (waits for its last step, stops the clock) and parks the loop until
    the next call. The worker's start and the handover are outside the timed window."""

    def __init__(
        self, side: Side, every: int, state: Any, step: Any, data: Any, windows: int, k: int, multi: Any
    ):
        self.side, self.every, self.k, self.multi = side, every, k, multi
        self._go, self._done = threading.Event(), threading.Event()
        self._clock = (0.0, 0.0)
        self._record = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._work, args=(state, step, data, int(state.step) + every * windows), daemon=True
        )
        self.thread.start()

    def _work(self, state: Any, step: Any, data: Any, num_steps: int) -> None:
        try:
            self._park()
            fit(state, MultiStep(step, self.k, self.multi), data, num_steps, [self])
        except BaseException as e:  # reported on the main thread
            self.error = e
            self._done.set()

    def _park(self) -> None:
        self._go.wait()
        self._go.clear()
        self._clock = (time.perf_counter(), time.process_time())

    def run(self, ctx: StepContext) -> None:
        jax.block_until_ready(ctx.state)
        if self._record:
            self.side.record(
                self.every, time.perf_counter() - self._clock[0], time.process_time() - self._clock[1]
            )
        self._done.set()
        if not ctx.final:
            self._park()

    def window(self, record: bool) -> None:
        self._record = record
        self._go.set()
        self._done.wait()
        self._done.clear()
        if self.error is not None:
            raise self.error


def timed(side: Side, steps: int, body, record: bool) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    body()
    if record:
        side.record(steps, time.perf_counter() - wall, time.process_time() - cpu)


def hot_path_kernels(compiled_text: str) -> int:
    """Kernels the step runs each call: the entry's ops after fusion, plus the taken branch of a
    conditional (the finite-update path); a while loop (threefry's rounds on CPU) counts once."""
    comps: dict[str, list[str]] = {}
    name = None
    for line in compiled_text.splitlines():
        head = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if head and not line.startswith(" "):
            name = "ENTRY" if head.group(1) else head.group(2)
            comps[name] = []
        elif line.startswith("}"):
            name = None
        elif name:
            comps[name].append(line)
    free = {"parameter", "get-tuple-element", "constant", "tuple", "bitcast"}

    def count(computation: str) -> int:
        total = 0
        for line in comps[computation]:
            op = re.match(r"\s*(ROOT\s+)?%?[\w.\-]+\s*=\s*(?:\([^)]*\)|\S+)\s+([\w\-]+)\(", line)
            if not op or op.group(2) in free:
                continue
            total += 1
            if op.group(2) == "conditional":
                branches = re.search(r"branch_computations=\{([^}]*)\}", line)
                if branches:
                    total += count(branches.group(1).split(",")[-1].strip().lstrip("%"))
        return total

    return count("ENTRY")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--window", type=int, default=500, help="steps per timed window")
    parser.add_argument("--rounds", type=int, default=15, help="timed windows per side")
    parser.add_argument("--stix-python", default="/work/venv-stix/bin/python")
    parser.add_argument("--kernels", action="store_true")
    parser.add_argument(
        "--steps-per-call",
        type=int,
        default=None,
        help="train steps per call for fit and the Trainer (default: the experiment's)",
    )
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="dew-host-overhead-")
    total = args.window * (args.rounds + 1)
    config = apply_overrides(
        load_config(os.path.join(ROOT, "experiments", "mixture2d.py")),
        [
            *TOY,
            f"config.train.num_steps={total}",
            f"config.train.log_every={args.window}",
            f"config.checkpoint.every={total}",
            *([f"config.train.steps_per_call={args.steps_per_call}"] if args.steps_per_call else []),
        ],
    )
    trainer = Trainer(config, os.path.join(workdir, "trainer"))
    rows = np.asarray(trainer.train_source.fields["x"])
    np.save(os.path.join(workdir, "rows.npy"), rows)
    w = args.window

    bare, bare_carry, bare_data = bare_side(trainer, rows)
    state_box: dict[str, Any] = {"bare": bare_carry}
    sides = {k: Side(k) for k in ("bare", "plain", "fit", "fit/call", "trainer", "stix")}

    def run_bare(record: bool) -> None:
        def body():
            carry = state_box["bare"]
            for _ in range(w):
                carry, _ = bare(carry, next(bare_data))
            state_box["bare"] = jax.block_until_ready(carry)

        timed(sides["bare"], w, body, record)

    step = trainer.programs.step  # the jitted, sharded dew step
    k = config.train.steps_per_call  # fit and the Trainer run k steps per call (plain: one)
    plain_data = Dataset(trainer.train_source, 256, seed=1)
    state_box["plain"] = trainer.programs.init(jax.random.PRNGKey(3), trainer.example_batch())

    def run_plain(record: bool) -> None:
        def body():
            state = state_box["plain"]
            for _ in range(w):
                state, _ = step(state, next(plain_data))
            state_box["plain"] = jax.block_until_ready(state)

        timed(sides["plain"], w, body, record)

    parked = ParkedFit(
        sides["fit"],
        w,
        trainer.programs.init(jax.random.PRNGKey(4), trainer.example_batch()),
        step,
        Dataset(trainer.train_source, 256, seed=2),
        windows=args.rounds + 1,
        k=k,
        multi=trainer.programs.multi_step,
    )

    def run_fit(record: bool) -> None:
        parked.window(record)

    fit_call_data = Dataset(trainer.train_source, 256, seed=5)
    state_box["fit/call"] = trainer.programs.init(jax.random.PRNGKey(6), trainer.example_batch())

    def run_fit_call(record: bool) -> None:
        def body():
            state = state_box["fit/call"]
            state = fit(
                state, MultiStep(step, k, trainer.programs.multi_step), fit_call_data, int(state.step) + w
            )
            state_box["fit/call"] = jax.block_until_ready(state)

        timed(sides["fit/call"], w, body, record)

    stix = None
    if args.stix_python and os.path.exists(args.stix_python):
        stix = subprocess.Popen(
            [
                args.stix_python,
                os.path.join(ROOT, "benchmarks", "stix_toy.py"),
                f"--data={os.path.join(workdir, 'rows.npy')}",
                f"--window={w}",
                f"--windows={args.rounds + 3}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        print(stix.stdout.readline().strip(), flush=True)
        stix.stdout.readline()  # its first window: compilation
    else:
        print(f"stix-ml: no interpreter at {args.stix_python}; that side is skipped", flush=True)

    def run_stix(record: bool) -> None:
        stix.stdin.write("go\n")
        stix.stdin.flush()
        fields = stix.stdout.readline().split()
        if record:
            sides["stix"].record(w, float(fields[1]), float(fields[2]))

    others = [run_bare, run_plain, run_fit, run_fit_call] + ([run_stix] if stix else [])
    trainer.extra_trackers = [Rounds(w, others, sides["trainer"])]
    trainer.run()
    parked.thread.join(timeout=60)
    if stix:
        stix.stdin.close()
        stix.wait(timeout=60)

    print(f"\n{args.rounds} rounds of {w}-step windows (devices: {jax.devices()}), machine shared:")
    print(f"{'side':>8} {'steps/s median':>15} {'min':>8} {'max':>8} {'CPU µs/step':>12}  ratio to bare")
    base = statistics.median(sides["bare"].rates)
    for side in sides.values():
        if not side.rates:
            continue
        med = statistics.median(side.rates)
        print(
            f"{side.name:>8} {med:15.1f} {min(side.rates):8.1f} {max(side.rates):8.1f} "
            f"{statistics.median(side.cpu):12.1f}  {med / base:.3f}"
        )
    print("ratios: of medians | median of the per-round ratios (each round's windows ran together)")
    pairs = [(a, "bare") for a in ("plain", "fit", "fit/call", "trainer", "stix")]
    pairs += [(a, "stix") for a in ("trainer", "fit", "plain")]
    for a, b in pairs:
        if sides[a].rates and sides[b].rates:
            ratio = statistics.median(sides[a].rates) / statistics.median(sides[b].rates)
            per_round = [x / y for x, y in zip(sides[a].rates, sides[b].rates, strict=False)]
            print(f"  {a:>8} / {b:<5} {ratio:.3f} | {statistics.median(per_round):.3f}")
    if args.kernels:
        placed = trainer.layout.place_batch(next(plain_data))
        dew_text = step.lower(state_box["plain"], placed).compile().as_text()
        bare_text = bare.lower(state_box["bare"], next(bare_data)).compile().as_text()
        dew_k, bare_k = hot_path_kernels(dew_text), hot_path_kernels(bare_text)
        print(f"hot-path kernels: dew step {dew_k}, bare step {bare_k}")


if __name__ == "__main__":
    main()

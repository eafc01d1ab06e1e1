"""dew's SiT training step against a JAX peer's own, the same network, batch and precision, timed
in one process: willisma/diffuse_nnx (flax NNX), its ``trainers/dit_imagenet.py:train_step``.

The one wheel the peer needs beyond dew's locked set: ``flax==0.10.2`` (pure Python; its
requirements are all in ``requirements.lock``), the peer's own pin, beside dew's environment,
never in it. Later ones fail on jax 0.10.2: 0.10.7 and 0.11.2 import ``jax._src.core.mutable_array``
(gone), 0.12.8 refuses the peer's plain list of blocks. On one TPU v5e chip, dew's set installed::

    PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated --only-binary=:all: --no-deps \\
        --index-url file:///opt/pypi/simple --target /tmp/peer_site flax==0.10.2
    PYTHONPATH=$PYTHONPATH:/tmp/peer_site python3 benchmarks/peer_step.py \\
        --peer=diffuse_nnx:third_party/peers/diffuse_nnx --size=B --batch=64 \\
        --precision=float32 --out=peer_step.jsonl --peak-tflops=197

(XL/2: ``--size=XL --precision=bfloat16 --batch=8 --sides=dew``, then ``--sides=diffuse_nnx``;
on the CPU ``--depth=2 --batch=2 --steps=2 --rounds=2`` checks the plumbing.)

The peer (``requirements.txt``: jax 0.5.1, flax 0.10.2) is imported by file from the checkout
``--peer`` names: its config (``configs/dit_imagenet.py``, ``imagenet_256-<size>_2``: SiT
interface, uniform t, AdamW 1e-4 β (0.9, 0.999) ε 1e-8 without weight decay at a constant rate,
EMA 0.9999, replicated sharding), its builders (``utils/initialize.py``'s ``instantiate_*`` as
``build_models`` calls them), ``utils/sharding_utils.py`` (mesh, state shardings), and its
``train_step``, jitted as ``train_and_evaluate`` does (``out_shardings``, ``static_argnums=(3,
4)``, ``donate_argnums=(0, 1)``), fed a batch as ``parse_batch`` leaves it: ``latents`` [batch,
32, 32, 4] float32 and ``labels`` int32, sharded over the data axis. Its ``config.dtype`` is the
precision (``float32`` or ``bfloat16``: the layers' computation dtype, parameters float32).
Modules its step never runs are stubbed (``STUBBED``, each with why); a call into one raises.

dew's step is ``benchmarks/accelerator.py``'s row for the size (``config_for``: the experiment
file's config on ``bench_arrays``, no evaluation, preview or checkpoint), at this batch and
precision, without rematerialisation unless ``--dew-remat`` asks; it samples and scales the raw
latents [batch, 32, 32, 8] (mean ‖ std) in the step, which the peer's encoder does before.

After compiling both and ``--warmup`` steps each, ``--rounds`` windows of ``--steps`` steps
alternate between the sides (which goes first alternating too). One JSON line per side, flushed,
appended to ``--out``: ``images_per_s`` and ``step_ms`` (median window), ``tflop_per_step``
(``compiled.cost_analysis()``), ``mfu`` (model FLOPs per second over ``--peak-tflops``; the
compiled FLOPs, three quarters of them under ``remat='blocks'`` as ``accelerator._model_flops``
says), ``memory_gb`` (``compiled.memory_analysis()``: arguments + outputs + temporaries −
aliased), ``compile_s`` (lower and compile: warm where the compilation cache ``start`` sets up
holds the program), ``first_step_s`` (building to the first result), ``params`` (trainable),
``loss``; a side that fails has ``error`` instead, the other still runs. dew's line also has
``speedup`` (its images/s over the peer's).

The parameter counts differ by one thing: dew's SiT is built as SiT's reference builds it,
``learn_sigma=True``, its final linear layer 2 × p² × 4 outputs wide of which the step uses the
first 4 channels; the peer's ``DiT`` outputs p² × 4. For B/2 that is (768 + 1) × 16 = 12,304 of
~130.3 M (``param_gap``; ``param_gap_is_learn_sigma`` checks it is exactly that).

Both sides' states stay on the chip (a step's temporaries only while it runs). B/2: 2.1 GB each
(float32 parameters, Adam's moments, the EMA): both fit beside one step (dew's B/2 float32 batch
64: 10.9 GB in all). XL/2: 10.8 GB each, so one side per process (``--sides``, not interleaved
then) at a batch that fits without rematerialisation, which the peer does not have (dew's XL/2
row: ``remat='blocks'`` at 32, ``--dew-remat=blocks``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.append(ROOT)

#: The peer's modules its train step never runs, imported by the modules it does run: replaced
#: by stubs while those are imported (module -> why).
STUBBED = {
    name: why
    for names, why in (
        (("interfaces.discrete",), "DDPM interfaces; the SiT step uses interfaces/continuous.py"),
        (("interfaces.repa",), "the REPA wrapper; the step has no REPA loss"),
        (("networks.transformers.lightning_dit_nnx", "networks.transformers.lightning_ddt_nnx"), "networks"),
        (("networks.encoders", "networks.encoders.dino", "networks.encoders.rae", "networks.encoders.rgb"),
         "encoders (torch, transformers): the step takes encoded latents"),
        (("networks.encoders.sd_vae",), "the SD-VAE: its encode runs in parse_batch, before the step"),
        (("samplers", "samplers.samplers"), "sampling"),
        (("clu", "clu.metric_writers", "clu.periodic_actions"), "logging and profiling hooks"),
        (("data", "data.local_imagenet_dataset", "data.utils"), "the torch ImageNet loader, parse_batch"),
        (("eval", "eval.fid"), "FID evaluation"),
        (("utils.checkpoint", "utils.logging_utils", "utils.wandb_utils", "utils.visualize"),
         "checkpoints, logging, sample grids"),
    )
    for name in names
}  # fmt: skip
#: The peer's packages, bound to the checkout: no other top-level package of a name shadows it.
PEER_PACKAGES = ("configs", "interfaces", "networks", "networks.transformers", "trainers", "utils")
SIZES = {"B": "SiT-B/2", "XL": "SiT-XL/2"}


class _Stubbed:
    """What a stubbed module hands out: any attribute is another; a call raises."""

    def __init__(self, name: str, why: str):
        self._name, self._why = name, why

    def __getattr__(self, attr: str) -> _Stubbed:
        return _Stubbed(f"{self._name}.{attr}", self._why)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name} is stubbed by benchmarks/peer_step.py: {self._why}")


def _stub(name: str, why: str) -> types.ModuleType:
    module = types.ModuleType(name, f"stub: {why}")
    module.__path__ = []  # a package: its stubbed submodules import
    module.__getattr__ = lambda attr: _Stubbed(f"{name}.{attr}", why)  # type: ignore[method-assign]
    return module


@contextlib.contextmanager
def _stubs_installed():
    """STUBBED in ``sys.modules`` for the block; whatever those names held before comes back."""
    saved = {name: sys.modules.get(name) for name in STUBBED}
    sys.modules.update({name: _stub(name, why) for name, why in STUBBED.items()})
    try:
        yield
    finally:
        for name in STUBBED:
            sys.modules.pop(name, None)
        sys.modules.update({name: module for name, module in saved.items() if module is not None})


def load_peer(checkout: str) -> types.SimpleNamespace:
    """The peer's ``configs.dit_imagenet``, ``utils.initialize``, ``utils.sharding_utils`` and
    ``trainers.dit_imagenet``, imported from ``checkout`` (its own files, unedited)."""
    import importlib

    checkout = os.path.abspath(checkout)
    for package in PEER_PACKAGES:
        folder = os.path.join(checkout, *package.split("."))
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"--peer: {folder} is missing: not a diffuse_nnx checkout")
        module = types.ModuleType(package)
        module.__path__ = [folder]
        sys.modules[package] = module
    with _stubs_installed():
        return types.SimpleNamespace(
            config=importlib.import_module("configs.dit_imagenet"),
            initialize=importlib.import_module("utils.initialize"),
            sharding=importlib.import_module("utils.sharding_utils"),
            trainer=importlib.import_module("trainers.dit_imagenet"),
        )


def _cost(compiled) -> tuple[float, float | None]:
    """(the compiled program's FLOPs, its memory in GB), as ``accelerator.py`` reports them."""
    from benchmarks import accelerator

    return accelerator.compiled_cost(compiled)


class Side:
    """One compiled step and its carried state: ``run(n)`` takes n steps and waits for them."""

    def __init__(self, name: str, compiled, carry: tuple, batch, info: dict):
        self.name, self.compiled, self.carry, self.batch, self.info = name, compiled, carry, batch, info
        self.times: list[float] = []
        self.loss = float("nan")

    def run(self, steps: int) -> float:
        import jax
        import numpy as np

        if not steps:
            return 0.0
        start = time.perf_counter()
        out: dict = {}
        for _ in range(steps):
            *carry, out = self.compiled(*self.carry, self.batch)
            self.carry = tuple(carry)
        jax.block_until_ready(out)
        seconds = (time.perf_counter() - start) / steps
        self.loss = float(np.asarray(out["loss"]))
        return seconds


def build_peer(checkout: str, size: str, batch: int, precision: str, depth: int | None) -> Side:
    """The peer's step as its ``train_and_evaluate`` builds it (module docstring)."""
    import flax
    import jax
    import numpy as np
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    began = time.perf_counter()
    peer = load_peer(checkout)
    config = peer.config.get_config(f"imagenet_256-{size}_2")
    config.dtype = precision
    config.data.batch_size = batch
    if depth is not None:
        config.network.depth = depth
    if batch % jax.device_count():
        raise ValueError("Batch size must be divisible by the number of devices")  # theirs
    init = peer.initialize
    network = init.instantiate_network(config)
    model = init.instantiate_model(config, network)
    optimizer, _ = init.instantiate_optimizer(config, model)
    ema = init.instantiate_ema(config, model)
    params = sum(int(x.size) for x in jax.tree.leaves(nnx.state(network, nnx.Param)))
    opt_graph, opt_rng_state, opt_state = nnx.split(optimizer, nnx.RngKey, ...)
    _, _, ema_state = nnx.split(ema, nnx.RngKey, ...)
    mesh = peer.sharding.create_device_mesh(config.sharding.mesh)
    graphdef, state, ema_graphdef, ema_state, state_sharding, ema_sharding = (
        peer.sharding.update_model_sharding(
            opt_graph, opt_state, opt_rng_state, ema, ema_state,
            mesh=mesh, sharding_strategy=config.sharding.strategy,
        )
    )  # fmt: skip
    data = NamedSharding(mesh, P(config.sharding.data_axis))
    repl = NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    side = config.network.input_size
    inputs = {
        "latents": rng.standard_normal((batch, side, side, config.network.in_channels)).astype(np.float32),
        "labels": rng.integers(0, config.network.num_classes, batch).astype(np.int32),
    }
    inputs = jax.device_put(inputs, data)
    step = jax.jit(
        peer.trainer.train_step,
        out_shardings=(state_sharding, ema_sharding, repl),
        static_argnums=(3, 4),
        donate_argnums=(0, 1),
    )
    compiling = time.perf_counter()
    with mesh:
        lowered = step.lower(state, ema_state, inputs, graphdef, ema_graphdef)
    compiled = lowered.compile()
    compile_s = time.perf_counter() - compiling

    def call(state, ema_state, batch):
        with mesh:
            return compiled(state, ema_state, batch)

    result = Side("diffuse_nnx", call, (state, ema_state), inputs, {})
    result.run(1)
    flops, memory = _cost(compiled)
    result.info = {
        "flax": flax.__version__,
        "config": f"configs/dit_imagenet.py:imagenet_256-{size}_2",
        "params": params,
        "hidden_size": config.network.hidden_size,
        "flops": flops,
        "remat": "none",
        "memory_gb": None if memory is None else round(memory, 2),
        "compile_s": round(compile_s, 1),
        "first_step_s": round(time.perf_counter() - began, 1),
    }
    return result


def build_dew(size: str, batch: int, precision: str, depth: int | None, remat: str, workdir: str) -> Side:
    """dew's step as ``benchmarks/accelerator.py`` builds its row for ``SiT-<size>/2``."""
    import dataclasses

    import jax
    import numpy as np

    from benchmarks import accelerator
    from dew import kernels
    from dew.training.trainer import Trainer

    began = time.perf_counter()
    short = "f32" if precision == "float32" else "bf16"
    name = f"{SIZES[size]} {short}" if f"{SIZES[size]} {short}" in accelerator.RUNS else f"{SIZES[size]} bf16"
    config = accelerator.config_for(name)
    config.dataset.batch_size = batch
    config.precision.compute = precision
    config.model.remat = remat
    if depth is not None:
        config.model.depth = depth
    attention = accelerator.RUNS[name][6]
    choice = kernels.current()
    if attention is not None:
        choice = dataclasses.replace(choice, attention=attention)
    with kernels.using(choice):
        trainer = Trainer(config, workdir)
        state = trainer.fresh_state()
        fields = trainer.train_source.fields
        placed = trainer.programs.place({k: np.asarray(v[:batch]) for k, v in fields.items()})
        compiling = time.perf_counter()
        step = trainer.programs.step  # a jitted function, typed as the plain one
        compiled = step.lower(state, placed).compile()  # pyright: ignore[reportFunctionMemberAccess]
        compile_s = time.perf_counter() - compiling
    params = sum(int(x.size) for x in jax.tree.leaves(state.params))
    result = Side("dew", compiled, (state,), placed, {})
    result.run(1)
    flops, memory = _cost(compiled)
    result.info = {
        "config": f"benchmarks/accelerator.py:{name} (batch, precision, remat as here)",
        "params": params,
        "flops": flops,
        "remat": remat,
        "attention": kernels.current().attention if attention is None else attention,
        "memory_gb": None if memory is None else round(memory, 2),
        "compile_s": round(compile_s, 1),
        "first_step_s": round(time.perf_counter() - began, 1),
    }
    return result


def trace(side: Side, folder: str) -> None:
    """Three of ``side``'s steps under ``jax.profiler``, kept as ``<folder>/<side>.xplane.pb``
    (one file, for xprof or TensorBoard's profile plugin)."""
    import glob
    import shutil

    import jax

    with tempfile.TemporaryDirectory() as logdir:
        jax.profiler.start_trace(logdir)
        side.run(3)
        jax.profiler.stop_trace()
        found = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        if not found:
            raise RuntimeError(f"jax.profiler wrote no .xplane.pb under {logdir}")
        os.makedirs(folder, exist_ok=True)
        shutil.copy(found[0], os.path.join(folder, f"{side.name}.xplane.pb"))


def _attempt(rows: dict[str, dict], name: str, work: Callable[..., Any], *args: Any) -> Any:
    """``work(*args)``, or None with its error as side ``name``'s line (the other side still runs)."""
    try:
        return work(*args)
    except Exception as e:
        rows[name] = {"side": name, "error": " ".join(f"{type(e).__name__}: {e}".split())[:800]}
        return None


def row(side: Side, batch: int, precision: str, peak_tflops: float) -> dict:
    """A side's JSON line (module docstring) from its windows and compiled program."""
    import jax

    step = statistics.median(side.times)
    flops = side.info["flops"]
    model = flops * 3 / 4 if side.info["remat"] == "blocks" else flops
    info = {k: v for k, v in side.info.items() if k != "flops"}
    return {
        "side": side.name,
        "batch": batch,
        "precision": precision,
        "step_ms": round(step * 1e3, 2),
        "images_per_s": round(batch / step, 1),
        "windows_ms": [round(t * 1e3, 2) for t in side.times],
        "tflop_per_step": round(flops / 1e12, 3),
        "mfu": round(model / step / 1e12 / peak_tflops, 3),
        **info,
        "loss": side.loss,
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--peer", required=True, help="diffuse_nnx:/path/to/checkout")
    parser.add_argument("--size", choices=sorted(SIZES), default="B")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--precision", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--depth", type=int, help="fewer blocks (a CPU check); default: the size's")
    parser.add_argument("--dew-remat", default="none", choices=("none", "blocks"))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=197.0)
    parser.add_argument("--out", default="peer_step.jsonl")
    parser.add_argument("--sides", default="diffuse_nnx,dew", help="the sides to build (one: XL/2)")
    parser.add_argument("--trace", help="after timing, a 3-step profiler trace of each side into this folder")
    args = parser.parse_args(argv)
    peer_name, _, checkout = args.peer.partition(":")
    if peer_name != "diffuse_nnx" or not checkout:
        parser.error(f"--peer={args.peer!r}: expected diffuse_nnx:/path/to/checkout")
    if min(args.steps, args.rounds, args.batch) < 1 or args.warmup < 0:
        parser.error("--steps, --rounds and --batch must be at least 1, --warmup at least 0")
    labels = [label.strip() for label in args.sides.split(",") if label.strip()]
    if not labels or not set(labels) <= {"diffuse_nnx", "dew"}:
        parser.error(f"--sides={args.sides!r}: expected diffuse_nnx, dew or both")

    from dew.runtime import start

    start()  # the platform and the compilation cache, as accelerator.py
    sides: list[Side] = []
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as workdir:
        shape = (args.size, args.batch, args.precision, args.depth)
        for label in labels:
            if label == "diffuse_nnx":
                side = _attempt(rows, label, build_peer, checkout, *shape)
            else:
                side = _attempt(rows, label, build_dew, *shape, args.dew_remat, workdir)
            if side is not None and _attempt(rows, label, side.run, args.warmup) is not None:
                sides.append(side)
            print(f"built {label}", file=sys.stderr, flush=True)
        for round_ in range(args.rounds):
            for side in sides if round_ % 2 == 0 else sides[::-1]:
                seconds = None if side.name in rows else _attempt(rows, side.name, side.run, args.steps)
                if seconds is not None:
                    side.times.append(seconds)
        for side in sides:
            if side.name not in rows:
                line = _attempt(rows, side.name, row, side, args.batch, args.precision, args.peak_tflops)
                rows[side.name] = line or rows[side.name]
        if args.trace:
            for side in sides:
                _attempt(rows, f"{side.name} trace", trace, side, args.trace)
    peer, dew = rows.get("diffuse_nnx", {}), rows.get("dew", {})
    if "step_ms" in peer and "step_ms" in dew:  # the same batch: images/s over images/s
        dew["speedup"] = round(peer["step_ms"] / dew["step_ms"], 3)
    if "params" in peer and "params" in dew:
        dew["param_gap"] = dew["params"] - peer["params"]
        # learn_sigma's extra p² × 4 outputs of the final linear layer, weights and biases
        dew["param_gap_is_learn_sigma"] = dew["param_gap"] == (peer["hidden_size"] + 1) * 2 * 2 * 4
    with open(args.out, "a") as out:
        traced = [f"{label} trace" for label in labels if f"{label} trace" in rows]  # only failures
        for label in labels + traced:
            line = json.dumps(rows.get(label, {"side": label, "error": "not built"}))
            print(line, flush=True)
            out.write(line + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

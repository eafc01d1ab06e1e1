"""The EDM U-Net's train step by parts: where the backward pass spends its time.

    PYTHONPATH=. python benchmarks/backward_parts.py --net=16
    PYTHONPATH=. python benchmarks/backward_parts.py --net=16 --cpu_convolutions=ynnpack \\
        --cpu_weight_gradient=xla

The step is dew's side of ``benchmarks/unet.py`` (the same network, batch, devices, malloc tunables and
kernel choice: ``--cpu_convolutions``, ``--cpu_weight_gradient`` as there, so
the run's ``kernel choice:`` line is printed first). Two views of it:

1. **The whole step, traced.** ``--steps`` warm steps under ``jax.profiler``; every XLA:CPU thunk
   in the trace is matched by name to its instruction in the compiled step (``Compiled.as_text``)
   and put in one part by what that instruction computes: a convolution (forward, input gradient
   or weight gradient: the backward ones carry ``transpose(`` in their op name, and a weight
   gradient's output is the kernel, ``->01…`` in its ``dim_labels``), the dots of a per-tap or
   im2col gradient form (by the ``dew/networks/conv_forms.py`` function their source line is
   in), other dots (1×1 convolutions, attention, linear layers), the group norms (forward and
   backward, by their source lines in ``dew/networks/edm_layers.py``), layout transposes and
   copies (thunks named ``transpose``/``copy``), and the rest (SiLU, adds, Adam, EMA, …), each
   in forward and backward. Times are thunk time summed over XLA's threads, per step: a share of
   the step's work, not of its wall time (Eigen's convolutions run in Eigen's own thread pool,
   which the trace does not see: under ``--cpu_convolutions=eigen`` their rows are lower bounds).
2. **The convolutions jitted alone.** For each shape class the network uses (``dew.kernels``),
   its forward, input gradient and weight gradient as three programs, in the forms the kernel
   choice gave the class, at the step's batch split over its devices: median wall time × uses.

Also printed: the step's median wall time (``--steps`` steps, one by one).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import pathlib
import re
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from benchmarks import unet  # noqa: E402


def frame_functions(hlo: str) -> dict[str, tuple[str, str]]:
    """stack_frame_id -> (file, function) of the frame's own location, from the compiled module's
    FileNames / FunctionNames / FileLocations / StackFrames tables (the source of each op; a
    backward op keeps its forward op's)."""
    tables: dict[str, dict[str, str]] = {}
    current = None
    for line in hlo.splitlines():
        if line.strip() in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current = line.strip()
            tables[current] = {}
        elif current and re.match(r"^\d+ ", line):
            key, _, value = line.partition(" ")
            tables[current][key] = value.strip()
        elif current and line.strip():
            current = None
    files, functions = tables.get("FileNames", {}), tables.get("FunctionNames", {})
    locations = tables.get("FileLocations", {})
    out = {}
    for frame, value in tables.get("StackFrames", {}).items():
        location = locations.get(re.search(r"file_location_id=(\d+)", value).group(1), "")  # type: ignore[union-attr]
        file_id = re.search(r"file_name_id=(\d+)", location)
        function_id = re.search(r"function_name_id=(\d+)", location)
        if file_id and function_id:
            out[frame] = (
                files.get(file_id.group(1), "").strip('"'),
                functions.get(function_id.group(1), "").strip('"'),
            )
    return out


#: (file suffix, function name's end) of the source that names a part of the step. A custom
#: VJP's backward ops carry the frame of the call (``conv_forms.convolve``), not of its backward.
SOURCES = {
    ("networks/conv_forms.py", ""): "conv_forms",
    ("networks/edm_layers.py", "normalise"): "group norm",
    ("networks/edm_layers.py", "group_mean"): "group norm",
}


def instruction_index(hlo: str) -> dict[str, str]:
    """Each instruction's name in the compiled module -> its text, a fusion's text followed by
    its fused computation's body."""
    bodies: dict[str, list[str]] = {}
    current = None
    lines: dict[str, str] = {}
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)  # at column 0
        if head:
            current = head.group(1)
            bodies[current] = []
            continue
        found = re.match(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=", line)
        if found and current is not None:
            bodies[current].append(line)
            lines[found.group(1)] = line
    out = {}
    for name, line in lines.items():
        called = re.search(r"calls=%?([\w.\-]+)", line)
        out[name] = line + "\n" + "\n".join(bodies.get(called.group(1), [])) if called else line
    return out


def classify(name: str, text: str | None, frames: dict[str, tuple[str, str]]) -> str:
    """The part of the step an instruction named ``name`` (its HLO ``text``) belongs to."""
    if text is None:
        return "(not in the compiled step)"
    side = "backward" if "transpose(" in text else "forward"
    conv = re.search(r"convolution\(.*window=\{size=(\d+)x(\d+)([^}]*)\}", text)
    if conv:
        # The network's kernels are 3×3: a window larger than that is a weight gradient (its
        # kernel is the output's gradient, the image's size); a reversed kernel or a transposed
        # op, the input gradient.
        if int(conv.group(1)) > 3 or int(conv.group(2)) > 3:
            return "convolution weight gradient"
        if "rhs_reversal" in conv.group(3) or "reverse(" in text or side == "backward":
            return "convolution input gradient"
        return "convolution forward"
    if re.match(r"(transpose|copy)", name) or "transpose_copy" in name:
        return "layout transposes and copies"
    named = set()
    for frame in re.findall(r"stack_frame_id=(\d+)", text):
        source, function = frames.get(frame, ("", ""))
        for (suffix, known), part in SOURCES.items():
            if source.endswith(suffix) and function.endswith(known):
                named.add(part)
    if "conv_forms" in named:
        # A per-tap or im2col gradient: its weight-gradient dots contract the rows (B·H·W) of
        # both operands, its input-gradient dots the channels.
        dot = re.search(r" dot\(.*lhs_contracting_dims=\{(\d+)\}, rhs_contracting_dims=\{(\d+)\}", text)
        if dot is None:
            return "gradient forms' windows (slices, pads, concatenations)"
        if dot.group(1) == dot.group(2) == "0":
            return "weight gradient, dots (per-tap / im2col forms)"
        return "input gradient, dots (per-tap / im2col forms)"
    if named:
        return f"{named.pop()} {side}"
    if " dot(" in text:
        return f"other dots (1×1 convolutions, attention, linear) {side}"
    return f"other (SiLU, adds, resampling, Adam, EMA, …) {side}"


def trace_step(compiled, state, data, steps: int, directory: str) -> list[tuple[str, float]]:
    """(thunk name, microseconds) of every XLA thunk in ``steps`` traced steps."""
    import jax

    with jax.profiler.trace(directory, create_perfetto_trace=True):
        for _ in range(steps):
            state, stats = compiled(state, data)
        jax.block_until_ready(stats)
    path = sorted(glob.glob(f"{directory}/**/*perfetto_trace.json.gz", recursive=True))[-1]
    with gzip.open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    skipped = ("ThunkExecutor", "$", "Pjit", "Execute", "jit_", "PjRt", "end: ")
    return [
        (e["name"], float(e["dur"]))
        for e in events
        if e.get("ph") == "X" and "dur" in e and not e["name"].startswith(skipped)
    ]


def time_convolutions(batch: int, steps: int) -> list[tuple[str, int, dict[str, float]]]:
    """(class, uses, {forward, input gradient, weight gradient: median ms}) per shape class, in the
    forms the current kernel choice gives it, at ``batch`` over this process's devices."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from dew import kernels
    from dew.networks import conv_forms

    traced = unet.traced_convolutions(ARGS.net, batch)
    devices = jax.devices()
    if batch % len(devices):
        devices = devices[:1]
    mesh = Mesh(np.array(devices), ("data",))
    split, whole = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    rng = np.random.default_rng(0)
    out = []
    for h, w, cin, cout, k, pad, uses in traced["convolutions"]:
        input_form, weight_form = kernels.convolution_forms(h * w, (h, w, cin, cout, k, pad))
        x = jax.device_put(rng.standard_normal((batch, h, w, cin), np.float32), split)
        kernel = jax.device_put(rng.standard_normal((k, k, cin, cout), np.float32) / k, whole)
        ho, wo = h + 2 * pad - k + 1, w + 2 * pad - k + 1
        g = jax.device_put(rng.standard_normal((batch, ho, wo, cout), np.float32), split)

        def conv(a, b, pad=pad, i=input_form, f=weight_form):
            return conv_forms.convolve(a, b, pad, i, f)

        programs = {
            "forward": jax.jit(conv, out_shardings=split),
            "input gradient": jax.jit(
                lambda a, b, g, conv=conv: jax.vjp(lambda a_: conv(a_, b), a)[1](g)[0], out_shardings=split
            ),
            "weight gradient": jax.jit(
                lambda a, b, g, conv=conv: jax.vjp(lambda b_: conv(a, b_), b)[1](g)[0], out_shardings=whole
            ),
        }
        args = {"forward": (x, kernel), "input gradient": (x, kernel, g), "weight gradient": (x, kernel, g)}
        times = {}
        for part, program in programs.items():
            jax.block_until_ready(program(*args[part]))
            calls = []
            for _ in range(max(5, steps)):
                start = time.perf_counter()
                jax.block_until_ready(program(*args[part]))
                calls.append(time.perf_counter() - start)
            times[part] = 1e3 * statistics.median(calls)
        name = f"{h}×{w} {cin}→{cout} k{k} ({input_form}, {weight_form})"
        out.append((name, int(uses), times))
    return out


ARGS = argparse.Namespace()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--net", choices=sorted(unet.NETS), default="16")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5, help="steps traced, and timed one by one")
    parser.add_argument("--devices", type=int, default=0, help="CPU devices (0: one per core, as dew.main)")
    parser.add_argument("--cpu_convolutions", default="auto", choices=("auto", "eigen", "ynnpack"))
    parser.add_argument("--cpu_weight_gradient", default="auto", choices=("auto", "xla", "per_tap"))
    parser.add_argument("--trace_dir", default="", help="where the trace goes (default: a temporary folder)")
    parser.add_argument("--no_kept_heap", action="store_true")
    parser.add_argument("--no_convolutions", action="store_true", help="skip the convolutions jitted alone")
    args = parser.parse_args(namespace=ARGS)
    from dew.runtime.cpu.devices import host_device_count, present_host_devices
    from dew.runtime.cpu.memory import with_kept_heap

    if not args.no_kept_heap:
        with_kept_heap()
    present_host_devices(host_device_count(args.devices, [args.batch]))
    decision = unet.choose_kernels(args)
    print(f"dew: kernel choice: {decision.line()}", flush=True)

    import jax

    init, step, data, _ = unet.dew_setup(args.net, args.batch)
    state = init(jax.random.PRNGKey(0), data)
    compiled = step.lower(state, data).compile()
    for _ in range(2):
        state, stats = compiled(state, data)
    jax.block_until_ready(stats)
    walls = []
    for _ in range(args.steps):
        start = time.perf_counter()
        state, stats = compiled(state, data)
        jax.block_until_ready(stats)
        walls.append(time.perf_counter() - start)
    print(
        f"step: median {1e3 * statistics.median(walls):.1f} ms of {args.steps} ({jax.device_count()} devices)"
    )

    hlo = compiled.as_text() or ""
    index, frames = instruction_index(hlo), frame_functions(hlo)
    directory = args.trace_dir or tempfile.mkdtemp(prefix="backward_parts_")
    total, calls = collections.Counter(), collections.Counter()
    unmatched = 0.0
    for name, us in trace_step(compiled, state, data, args.steps, directory):
        text = index.get(name)
        if text is None:  # the runtime's own events (argument transfer, thread-pool markers)
            unmatched += us / args.steps
            continue
        part = classify(name, text, frames)
        total[part] += us / args.steps
        calls[part] += 1
    whole = sum(total.values())
    print(
        f"\nthunk time by part, per step (summed over XLA's threads; {1e-3 * whole:.1f} ms in all, "
        f"besides {1e-3 * unmatched:.1f} ms of the runtime's own events):"
    )
    print("| part | ms per step | share | thunks per step |\n|---|---|---|---|")
    for part, us in total.most_common():
        print(f"| {part} | {1e-3 * us:.1f} | {100 * us / whole:.1f} % | {calls[part] // args.steps} |")

    if not args.no_convolutions:
        rows = time_convolutions(args.batch, args.steps)
        sums: dict[str, float] = collections.defaultdict(float)
        print("\nconvolutions jitted alone (median wall ms per call; × uses in the step):")
        print("| class (input form, weight form) | uses | forward | input gradient | weight gradient |")
        print("|---|---|---|---|---|")
        for name, uses, times in rows:
            cells = " | ".join(f"{times[p]:.2f}" for p in ("forward", "input gradient", "weight gradient"))
            print(f"| {name} | {uses} | {cells} |")
            for p, t in times.items():
                sums[p] += uses * t
        cells = " | ".join(f"**{sums[p]:.0f}**" for p in ("forward", "input gradient", "weight gradient"))
        print(f"| **the step's convolutions, × uses** | | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

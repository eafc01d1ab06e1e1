"""What ``dew.runtime.kernel_choice`` measures, and its measurement child.

- ``trainer_convolutions`` (called in the run's own process, before JAX starts its backend, so
  the caller's registrations are in effect): the run's convolution shape classes, ``{"batch": B,
  "convolutions": [[h, w, in, out, k, pad, uses], ...]}``, traced from its config after the checks
  the Trainer makes before it needs a device;
- ``python -m dew.kernel_probe time``, its payload a JSON object on stdin (only shapes: nothing
  the user configured or registered), its answer one JSON line on stdout: for each shape class,
  the seconds of one convolution's forward pass and both gradients at batch B over all of this
  process's CPU devices (the batch split over them as a run splits it), in each form of the two
  gradients (``dew.runtime.kernel_cache.FORMS``: XLA's, per-tap or im2col; ``dew.networks.conv_forms``):
  ``{"times": {class: {form: s}}, "programs": {class: {form: digest}}, "unchanged": [...]}``
  (``time_convolutions``). The libraries are whatever this process's ``XLA_FLAGS`` chose; the
  parent starts one child per route (convolution library, and where dots go).

An entry-layer module: it builds what a run builds (the objective, its init, the EDM layers), so
that the runtime below can measure before its own process starts JAX.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

#: Each candidate is called until this many seconds have passed (at least ``MIN_CALLS`` times,
#: after one untimed call); the fastest call counts.
MIN_SECONDS = 0.3
MIN_CALLS = 3
MAX_CALLS = 15
#: A candidate whose fastest call is this many times the other's is not called again.
CLEAR = 2.0


def _traced_init(config: Any, devices: int) -> tuple[Any, tuple[Any, Any], int]:
    """The run's init as the Trainer traces it, its abstract arguments and the per-step batch,
    after the checks the Trainer makes before it needs a device (see ``trainer_convolutions``)."""
    import jax
    import numpy as np

    from dew.averaging.averager import Averages
    from dew.data.dataset import Dataset
    from dew.training import sharding
    from dew.training.build import build_objective, open_split
    from dew.training.precision import from_config as precision_from_config
    from dew.training.steps import make_init
    from dew.training.trainer_config import make_optimizer, resolve_config

    c = resolve_config(config)  # as the Trainer resolves it (a resolved config stays as it is)
    spec = sharding.spec_from_config(c.mesh)
    available = int(devices)
    if spec.devices is not None:
        if spec.devices > available:
            raise ValueError(f"config.mesh.devices={spec.devices} but only {available} devices exist")
        available = spec.devices
    shape = spec.shape(available)
    data_parallel = shape["data"] * shape.get("fsdp", 1)
    sizes = {"dataset.batch_size": int(c.dataset.batch_size)}
    if c.eval.get("batch_size") is not None:
        sizes["eval.batch_size"] = int(c.eval.batch_size)
    for field, size in sizes.items():
        if size % data_parallel:
            raise ValueError(f"config.{field}={size} does not split over {data_parallel} devices")
    train, validation = open_split(c.dataset, "train"), open_split(c.dataset, "validation")
    Dataset(train, sizes["dataset.batch_size"], seed=c.seed, shuffle=True)
    Dataset(validation, sizes.get("eval.batch_size", sizes["dataset.batch_size"]), seed=c.seed, shuffle=False)
    objective = build_objective(c, train)
    if c.precision.compute not in objective.precisions:
        raise ValueError(f"config.precision.compute={c.precision.compute!r} is not one of the objective's")
    init = make_init(
        objective,
        make_optimizer(c),
        Averages.from_config(c),
        accumulation=c.train.accumulation,
        precision=precision_from_config(c.precision),
    )
    batch = {
        k: jax.ShapeDtypeStruct((sizes["dataset.batch_size"], *v.shape[1:]), v.dtype)
        for k, v in train.fields.items()
    }
    per_step = sizes["dataset.batch_size"] // int(c.train.get("accumulation", 1) or 1)
    return init, (jax.ShapeDtypeStruct((2,), np.uint32), batch), per_step


def trainer_convolutions(config: Any, devices: int) -> dict:
    """The convolution shape classes of the run ``config`` (a resolved run config) describes, and
    how often each is used, traced in THIS process without starting JAX's backend, so that the
    caller's registrations (a data set or model registered in the experiment file or the user's
    script) are in effect. Batch: the per-step batch of one micro-step.

    The checks the Trainer makes before it needs a device come first, with the Trainer's own
    functions, so a config the Trainer would refuse raises here too (and nothing is measured): the
    mesh's axes against the ``devices`` the run will have, the batch sizes against its
    data-parallel axes and against the data (train and validation), the objective and the
    compute precision. Then the state's init is traced abstractly (``jax.eval_shape``, as the
    Trainer traces it) while ``dew.kernels`` records every convolution."""
    import jax

    from dew import kernels

    init, arguments, per_step = _traced_init(config, devices)
    with kernels.record_convolutions() as seen:
        jax.eval_shape(init, *arguments)
    return {"batch": per_step, "convolutions": [[*shape, uses] for shape, uses in sorted(seen.items())]}


def trainer_dots(config: Any, devices: int) -> dict:
    """The matrix products of the run ``config`` describes (a transformer's), traced as
    ``trainer_convolutions`` traces convolutions (the same checks first, nothing started): every
    ``dot_general`` of the state's init (the network's forward pass at the run's batch), as
    ``count_dots`` counts them: ``{"batch": B, "dots": [[b, m, k, n, split, uses], ...]}``."""
    import jax

    init, arguments, per_step = _traced_init(config, devices)
    whole = int(arguments[1][next(iter(arguments[1]))].shape[0])  # init's batch
    seen = count_dots(jax.make_jaxpr(init)(*arguments).jaxpr, whole, per_step)
    return {"batch": per_step, "dots": [[*key, uses] for key, uses in sorted(seen.items())]}


def count_dots(jaxpr: Any, whole: int, per_step: int) -> dict[tuple[int, ...], int]:
    """Every ``dot_general`` of ``jaxpr`` (and the jaxprs inside its equations) as a batched
    matrix product ``[b, m, k] · [b, k, n]`` (``b``: the product of its batch dimensions, ``m``/``n``:
    of the two sides' free dimensions, ``k``: of the contracted ones) with the side a batch of
    ``whole`` leads and the run splits over devices (``split``: 0 for ``b``, 1 for ``m``, 2 for
    neither), rescaled to a batch of ``per_step``; mapped to how often it runs (a ``scan`` body's
    products once per iteration)."""
    import math

    from jax.extend import core

    seen: dict[tuple[int, ...], int] = {}

    def walk(jaxpr: Any, times: int) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                lhs, rhs = (v.aval.shape for v in eqn.invars)
                (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
                b = math.prod(lhs[d] for d in lb)
                k = math.prod(lhs[d] for d in lc)
                m = math.prod(lhs[d] for d in range(len(lhs)) if d not in (*lc, *lb))
                n = math.prod(rhs[d] for d in range(len(rhs)) if d not in (*rc, *rb))
                # The batch leads the activations: it is in the batch dimensions (attention) or
                # in the free rows (a dense layer).
                split = 0 if lb and lb[0] == 0 and b % whole == 0 else 1 if m % whole == 0 else 2
                if split == 0:
                    b = b // whole * per_step
                elif split == 1:
                    m = m // whole * per_step
                key = (b, m, k, n, split)
                seen[key] = seen.get(key, 0) + times
            inner = times * int(eqn.params.get("length", 1)) if eqn.primitive.name == "scan" else times
            for sub in core.jaxprs_in_params(eqn.params):
                walk(sub, inner)

    walk(jaxpr, 1)
    return seen


def _compile(fn: Any, out_shardings: Any, args: tuple, label: str) -> tuple[Any, str]:
    """``fn`` jitted and compiled for ``args``, and a digest of its program. ``compiling <label>``
    goes to stderr first: what the parent names if XLA kills this process (a library's abort is
    no exception)."""
    import hashlib

    import jax

    print(f"compiling {label}", file=sys.stderr, flush=True)
    compiled = jax.jit(fn, out_shardings=out_shardings).lower(*args).compile()
    return compiled, hashlib.sha256((compiled.as_text() or "").encode()).hexdigest()[:16]


def _said(error: Exception) -> str:
    """An error as one line: its type and its message's first line."""
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def time_convolutions(
    batch: int,
    convolutions: list[list[int]],
    forms: list[str] | None = None,
    same_as: dict[str, dict[str, str]] | None = None,
) -> dict:
    """Seconds per call of each shape class's forward + input and weight gradients in each of
    ``forms`` (``dew.runtime.kernel_cache.FORMS``: the gradients' forms, ``dew.networks.conv_forms``;
    default all), alternating calls of the forms, and a digest of each compiled program.

    ``same_as``: the digests another child reported (``{class: {form: digest}}``, the same
    library without this child's extra flags): a program that compiles to the same digest is the
    same program, so it is not timed again but listed in ``unchanged`` for the parent to take the
    other child's time. Answer: ``{"times": {class: {form: s}}, "programs": {class: {form:
    digest}}, "unchanged": [[class, form], ...], "failed": [[class, form, error], ...]}`` (a program
    XLA could not compile or run under this process's flags: not timed)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from dew.networks import conv_forms
    from dew.runtime.kernel_cache import FORMS

    forms = list(FORMS) if forms is None else forms
    unknown = sorted(set(forms) - set(FORMS))
    if unknown:
        raise ValueError(f"unknown convolution forms {unknown}: expected some of {list(FORMS)}")
    devices = jax.devices()
    if batch % len(devices):
        devices = devices[:1]
    mesh = Mesh(np.array(devices), ("data",))
    split, whole = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, float]] = {}
    digests: dict[str, dict[str, str]] = {}
    unchanged: list[list[str]] = []
    failed: list[list[str]] = []
    for h, w, cin, cout, k, pad in (tuple(c[:6]) for c in convolutions):
        name = json.dumps([h, w, cin, cout, k, pad])
        x = jax.device_put(rng.standard_normal((batch, h, w, cin), np.float32), split)
        kernel = jax.device_put(rng.standard_normal((k, k, cin, cout), np.float32) / k, whole)
        ho, wo = h + 2 * pad - k + 1, w + 2 * pad - k + 1
        g = jax.device_put(rng.standard_normal((batch, ho, wo, cout), np.float32), split)
        programs, digests[name] = {}, {}
        for form in forms:
            input_form, weight_form = FORMS[form]

            def both(x, kernel, g, pad=pad, i=input_form, f=weight_form):
                y, pullback = jax.vjp(lambda a, b: conv_forms.convolve(a, b, pad, i, f), x, kernel)
                return (y, *pullback(g))

            try:
                compiled, digest = _compile(both, (split, split, whole), (x, kernel, g), f"{name} {form}")
                digests[name][form] = digest
                if same_as is not None and same_as.get(name, {}).get(form) == digest:
                    unchanged.append([name, form])
                    continue
                jax.block_until_ready(compiled(x, kernel, g))  # one untimed call
            except Exception as e:  # XLA's library routes can refuse a program: said, not timed
                failed.append([name, form, _said(e)])
                continue
            programs[form] = compiled
        seconds: dict[str, list[float]] = {form: [] for form in programs}
        active, began = list(programs), time.perf_counter()
        while active:
            for form in active:
                start = time.perf_counter()
                jax.block_until_ready(programs[form](x, kernel, g))
                seconds[form].append(time.perf_counter() - start)
            fastest = min(min(s) for s in seconds.values())
            # Decided for a form this many times the fastest: more calls cannot make it win.
            active = [f for f in active if min(seconds[f]) <= CLEAR * fastest]
            calls = max(len(s) for s in seconds.values())
            decided = len(programs) > 1 and len(active) <= 1
            enough = calls >= MIN_CALLS and time.perf_counter() - began >= MIN_SECONDS
            if decided or enough or calls >= MAX_CALLS:
                break
        # The fastest call: on a shared machine other processes only ever add time.
        out[name] = {form: min(s) for form, s in seconds.items()}
    return {"times": out, "programs": digests, "unchanged": unchanged, "failed": failed}


def _fastest(call: Any) -> float:
    """The fastest of ``call``'s calls (each waited for), called until ``MIN_SECONDS`` have
    passed and at least ``MIN_CALLS`` times, at most ``MAX_CALLS``: on a shared machine other
    processes only ever add time."""
    import jax

    seconds: list[float] = []
    began = time.perf_counter()
    while len(seconds) < MAX_CALLS and (
        len(seconds) < MIN_CALLS or time.perf_counter() - began < MIN_SECONDS
    ):
        start = time.perf_counter()
        jax.block_until_ready(call())
        seconds.append(time.perf_counter() - start)
    return min(seconds)


def time_dots(dots: list[list[int]], same_as: dict[str, str] | None = None) -> dict:
    """Seconds per call of each matrix-product class's forward and both gradients (``[b, m, k] ·
    [b, k, n]`` with its cotangent, ``trainer_dots``' rows; the side ``split`` names divided over
    this process's CPU devices as a run divides its batch), and a digest of each compiled program.
    ``same_as``: another child's digests (``{class: digest}``); a program that compiles the same
    is listed in ``unchanged`` instead of being timed again. Answer: ``{"times": {class: s},
    "programs": {class: digest}, "unchanged": [class, ...], "failed": [[class, error], ...]}``."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    everything = jax.devices()
    rng = np.random.default_rng(0)
    times: dict[str, float] = {}
    digests: dict[str, str] = {}
    unchanged: list[str] = []
    failed: list[list[str]] = []
    for b, m, k, n, split in (tuple(int(v) for v in d[:5]) for d in dots):
        name = json.dumps([b, m, k, n, split])
        rows = (b, m)[split] if split < 2 else 0
        devices = everything if rows and rows % len(everything) == 0 else everything[:1]
        mesh = Mesh(np.array(devices), ("data",))
        parts = {0: PartitionSpec("data"), 1: PartitionSpec(None, "data")}.get(split, PartitionSpec())
        lhs_sharding = NamedSharding(mesh, parts)
        rhs_sharding = NamedSharding(mesh, PartitionSpec("data") if split == 0 else PartitionSpec())
        lhs = jax.device_put(rng.standard_normal((b, m, k), np.float32), lhs_sharding)
        rhs = jax.device_put(rng.standard_normal((b, k, n), np.float32) / np.sqrt(k), rhs_sharding)
        cotangent = jax.device_put(rng.standard_normal((b, m, n), np.float32), lhs_sharding)

        def both(a: Any, w: Any, g: Any) -> Any:
            y, pullback = jax.vjp(lambda a, w: jax.numpy.einsum("bmk,bkn->bmn", a, w), a, w)
            return (y, *pullback(g))

        try:
            shardings = (lhs_sharding, lhs_sharding, rhs_sharding)
            compiled, digests[name] = _compile(both, shardings, (lhs, rhs, cotangent), f"{name} dot")
            if same_as is not None and same_as.get(name) == digests[name]:
                unchanged.append(name)
                continue
            jax.block_until_ready(compiled(lhs, rhs, cotangent))  # one untimed call
        except Exception as e:  # a library route can refuse a program: said, not timed
            failed.append([name, _said(e)])
            continue
        times[name] = _fastest(lambda: compiled(lhs, rhs, cotangent))  # noqa: B023 (called here)
    return {"times": times, "programs": digests, "unchanged": unchanged, "failed": failed}


def main(argv: list[str]) -> int:
    if argv not in (["time"], ["dots"]):
        print("usage: python -m dew.kernel_probe time|dots < payload.json", file=sys.stderr)
        return 2
    payload = json.loads(sys.stdin.read())
    if argv == ["dots"]:
        answer = time_dots(payload["dots"], payload.get("same_as"))
    else:
        answer = time_convolutions(
            int(payload["batch"]), payload["convolutions"], payload.get("forms"), payload.get("same_as")
        )
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

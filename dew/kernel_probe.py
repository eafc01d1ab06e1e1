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
    import numpy as np

    from dew import kernels
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
    with kernels.record_convolutions() as seen:
        jax.eval_shape(init, jax.ShapeDtypeStruct((2,), np.uint32), batch)
    per_step = sizes["dataset.batch_size"] // int(c.train.get("accumulation", 1) or 1)
    return {"batch": per_step, "convolutions": [[*shape, uses] for shape, uses in sorted(seen.items())]}


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
    import hashlib

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

            # What the parent names if XLA kills this process (a library's abort is no exception).
            print(f"compiling {name} {form}", file=sys.stderr, flush=True)
            try:
                compiled = jax.jit(both, out_shardings=(split, split, whole)).lower(x, kernel, g).compile()
                digest = hashlib.sha256((compiled.as_text() or "").encode()).hexdigest()[:16]
                digests[name][form] = digest
                if same_as is not None and same_as.get(name, {}).get(form) == digest:
                    unchanged.append([name, form])
                    continue
                jax.block_until_ready(compiled(x, kernel, g))  # one untimed call
            except Exception as e:  # XLA's library routes can refuse a program: said, not timed
                failed.append([name, form, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"])
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


def main(argv: list[str]) -> int:
    if argv != ["time"]:
        print("usage: python -m dew.kernel_probe time < payload.json", file=sys.stderr)
        return 2
    payload = json.loads(sys.stdin.read())
    answer = time_convolutions(
        int(payload["batch"]), payload["convolutions"], payload.get("forms"), payload.get("same_as")
    )
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

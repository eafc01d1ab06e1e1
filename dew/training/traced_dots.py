"""A transformer's matrix products, traced from its run config before JAX starts: what the CPU
platform's dots measurement times (``dew.runtime.cpu.dots``).

``run_dots(config, devices)`` is the ``ShapeSource`` that ``dew.runtime.start`` receives from its
caller (``dew.launch.start_platform``, a ``Trainer`` built in a user's own script): the runtime
never imports the layers it times, and the function it calls is an import of the caller's, not a
name. Only the DiT family's runs are measured (``MEASURED_MODELS``, ``MEASURED_PREFIXES``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dew.runtime.cpu.dots import ShapeSource

#: The transformers (``dew.networks.dit``'s registered names) whose matrix products are measured.
MEASURED_MODELS = ("dit", "sit", "imf_dit")
MEASURED_PREFIXES = ("DiT-", "SiT-", "iMF-")
#: The config sections that shape a run's products (the key of its traced classes).
SHAPING_SECTIONS = ("dataset", "model", "objective", "mesh")


def run_dots(config: Any, devices: int) -> ShapeSource | None:
    """Where the dots measurement finds a run's matrix products: ``trace_dots`` over the
    ``devices`` the run will have, keyed by the config sections that shape them; None for a model
    that is not a measured transformer, or no run config."""
    if config is None or "model" not in config:
        return None
    name = str(config.model.get("name"))
    if name not in MEASURED_MODELS and not name.startswith(MEASURED_PREFIXES):
        return None
    as_dict = json.loads(json.dumps(config.to_dict(), default=str))
    key = {section: as_dict.get(section) for section in SHAPING_SECTIONS}
    key["accumulation"] = as_dict.get("train", {}).get("accumulation")
    key["eval_batch"] = as_dict.get("eval", {}).get("batch_size")
    from dew.runtime.cpu.dots import ShapeSource  # the CPU platform's: imported where it is used

    return ShapeSource(trace_dots, {"config": config, "devices": devices}, key)


def _traced_init(config: Any, devices: int) -> tuple[Any, tuple[Any, Any], int]:
    """The run's init as the Trainer traces it, its abstract arguments and the per-step batch,
    after the checks the Trainer makes before it needs a device (see ``trace_dots``)."""
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


def trace_dots(config: Any, devices: int) -> dict:
    """The matrix products of the run ``config`` (a resolved run config, a transformer's)
    describes, traced in THIS process without starting JAX's backend, so that the caller's
    registrations (a data set or model registered in the experiment file or the user's script)
    are in effect: every ``dot_general`` of the state's init (the network's forward pass at the
    run's batch), as ``count_dots`` counts them: ``{"batch": B, "dots": [[b, m, k, n, split,
    uses], ...]}``, B the per-step batch of one micro-step.

    The checks the Trainer makes before it needs a device come first, with the Trainer's own
    functions, so a config the Trainer would refuse raises here too (and nothing is measured): the
    mesh's axes against the ``devices`` the run will have, the batch sizes against its
    data-parallel axes and against the data (train and validation), the objective and the
    compute precision."""
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


__all__ = ["MEASURED_MODELS", "MEASURED_PREFIXES", "count_dots", "run_dots", "trace_dots"]

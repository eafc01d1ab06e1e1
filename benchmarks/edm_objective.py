"""The dew side the train-step benchmarks share (``unet.py``, ``gpu.py``, ``compile_memory.py``):
the ``diffusion`` objective over the ``songunet`` network with the ``EDM`` preset, built in code
as ``Diffusion.from_config`` would build it for class-conditional (or unconditional) images.

Imported lazily (``from benchmarks.edm_objective import ...`` inside the function that builds the
case), so a benchmark's reference side never loads JAX; the benchmarks run with the checkout's
root on ``sys.path`` (each appends it, so an installed or ``PYTHONPATH`` dew still wins).
"""

from __future__ import annotations

from typing import Any


def songunet_diffusion(
    resolution: int, channels: int, label_dim: int, model: dict[str, Any], compute_dtype: str = "float32"
):
    """``Diffusion`` over ``songunet(**model)`` for ``resolution``² × ``channels`` images, with a
    ``class_label`` condition of ``label_dim`` classes (none when ``label_dim`` is 0), condition
    dropout 0 and the network computing in ``compute_dtype``. Lists in ``model`` are passed as
    tuples (the benchmarks write their networks as JSON-ready dicts)."""
    import functools

    from dew import registry
    from dew.diffusion import EDM
    from dew.inputs import Condition, Field, InputSpec
    from dew.objectives.diffusion import Diffusion

    conditions, encoders = {}, {}
    if label_dim:
        conditions = {"label": Condition("class_label", Field("label", (), "int32"), -1)}
        encoders = {"label": functools.partial(registry.encoders["class_label"], label_dim)}
    spec = InputSpec(Field("image", (resolution, resolution, channels)), conditions)
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in model.items()}
    network = functools.partial(registry.models["songunet"], **kwargs)
    return Diffusion(spec, EDM, network, encoders, condition_dropout=0.0, compute_dtype=compute_dtype)

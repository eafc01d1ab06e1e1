"""dew: one registry, one objective, one trainer.

Every exported name resolves lazily (PEP 562 ``__getattr__``): ``import dew`` imports no JAX
backend and no optional dependency. Naming any exported name fills the registries, so
``dew.presets.EDM`` and ``dew.models["unet"]`` work after a bare ``import dew``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from dew import registry as _registry
from dew.lazy_exports import lazy_exports as _lazy_exports
from dew.version import __version__ as __version__

# name -> module that defines it. Registry names map to dew.registry.
_EXPORTS: dict[str, str] = {
    "CFG": "dew.sampling.guidance",
    "Aux": "dew.contracts.objective",
    "Checkpoints": "dew.checkpointing.checkpoints",
    "Condition": "dew.inputs",
    "Dataset": "dew.data",
    "EMASpec": "dew.averaging.ema",
    "Evaluation": "dew.training.evaluation",
    "Field": "dew.inputs",
    "ImageGrid": "dew.artifacts",
    "InputSpec": "dew.inputs",
    "Layout": "dew.training.sharding",
    "LocalTracker": "dew.tracking.trackers",
    "MLflowTracker": "dew.tracking.trackers",
    "MeshSpec": "dew.training.sharding",
    "Objective": "dew.contracts.objective",
    "Process": "dew.diffusion.process",
    "ProfileWindow": "dew.training.profile",
    "Representations": "dew.artifacts",
    "Step": "dew.contracts.objective",
    "TensorBoardTracker": "dew.tracking.trackers",
    "TextSamples": "dew.artifacts",
    "TokenScores": "dew.artifacts",
    "Tracker": "dew.tracking.trackers",
    "Trackers": "dew.tracking.trackers",
    "TrainState": "dew.contracts.state",
    "Trainer": "dew.training.trainer",
    "VideoGrid": "dew.artifacts",
    "WandbTracker": "dew.tracking.trackers",
    "datasets": "dew.registry",
    "encoders": "dew.registry",
    "evaluate": "dew.training.evaluation",
    "karras_sigmas": "dew.sampling.schedule",
    "metrics": "dew.registry",
    "models": "dew.registry",
    "pipeline": "dew.inference",
    "presets": "dew.registry",
    "profile": "dew.training.profile",
    "sample": "dew.sampling.solvers",
    "samplers": "dew.registry",
}

if TYPE_CHECKING:  # the lazy names, visible to type checkers (tests/test_types.py keeps them in step)
    from dew.artifacts import ImageGrid, Representations, TextSamples, TokenScores, VideoGrid
    from dew.averaging.ema import EMASpec
    from dew.checkpointing.checkpoints import Checkpoints
    from dew.contracts.objective import Aux, Objective, Step
    from dew.contracts.state import TrainState
    from dew.data import Dataset
    from dew.diffusion.process import Process
    from dew.inference import pipeline
    from dew.inputs import Condition, Field, InputSpec
    from dew.registry import datasets, encoders, metrics, models, presets, samplers
    from dew.sampling.guidance import CFG
    from dew.sampling.schedule import karras_sigmas
    from dew.sampling.solvers import sample
    from dew.tracking.trackers import (
        LocalTracker,
        MLflowTracker,
        TensorBoardTracker,
        Tracker,
        Trackers,
        WandbTracker,
    )
    from dew.training.evaluation import Evaluation, evaluate
    from dew.training.profile import ProfileWindow, profile
    from dew.training.sharding import Layout, MeshSpec
    from dew.training.trainer import Trainer

# Modules that register components. Importing them is the registry fill.
_REGISTERING_MODULES = (
    "dew.diffusion.presets",
    "dew.networks.unet",
    "dew.networks.songunet",
    "dew.networks.dhariwalunet",
    "dew.networks.mlp",
    "dew.networks.byte_transformer",
    "dew.networks.video_unet",
    "dew.networks.dit",
    "dew.networks.edm2_unet",
    "dew.networks.edm2_precond",
    "dew.encoding.class_label",
    "dew.encoding.byte_text",
    "dew.sampling.solvers",
    "dew.sampling.transport_ode",
    "dew.sampling.transport_sde",
    "dew.sampling.repa_sampler",
    "dew.objectives.diffusion",
    "dew.objectives.repa_encoders",
    "dew.objectives.interpolant",
    "dew.objectives.iddpm",
    "dew.objectives.edm2",
    "dew.objectives.language",
    "dew.objectives.contrastive",
    "dew.objectives.autoencoder",
    "dew.objectives.meanflow",
    "dew.objectives.imeanflow",
    "dew.data.sources.digits",
    "dew.data.sources.mixture",
    "dew.data.sources.tfds_source",
    "dew.data.sources.cifar10",
    "dew.data.sources.image_folder",
    "dew.data.sources.latent_source",
    "dew.data.sources.python_bytes",
    "dew.data.sources.moving_digits",
    "dew.scoring.digits_classifier",
    "dew.scoring.sliced_wasserstein",
    "dew.scoring.digits_features",
    "dew.scoring.linear_probe",
    "dew.scoring.inception_metrics",
    "dew.scoring.dinov2_metrics",
)


def _fill_registries() -> None:
    for module in _REGISTERING_MODULES:
        importlib.import_module(module)


_registry.set_filler(_fill_registries)


__getattr__, __dir__ = _lazy_exports(globals(), _EXPORTS, before=_registry._ensure_filled)


# A literal list (type checkers read it); tests/test_types.py checks it names exactly _EXPORTS.
__all__ = [
    "CFG",
    "Aux",
    "Checkpoints",
    "Condition",
    "Dataset",
    "EMASpec",
    "Evaluation",
    "Field",
    "ImageGrid",
    "InputSpec",
    "Layout",
    "LocalTracker",
    "MLflowTracker",
    "MeshSpec",
    "Objective",
    "Process",
    "ProfileWindow",
    "Representations",
    "Step",
    "TensorBoardTracker",
    "TextSamples",
    "TokenScores",
    "Tracker",
    "Trackers",
    "TrainState",
    "Trainer",
    "VideoGrid",
    "WandbTracker",
    "datasets",
    "encoders",
    "evaluate",
    "karras_sigmas",
    "metrics",
    "models",
    "pipeline",
    "presets",
    "profile",
    "sample",
    "samplers",
]

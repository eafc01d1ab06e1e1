"""The contract between the trainer and what it trains: ``Objective``, ``Step``, ``Aux``.

An ``Objective`` is everything the ``Trainer`` knows about what is learned. It declares its own
config section (``config_section``) and builds itself from the config and the dataset
(``from_config``); its pure functions build parameters (``init``), compute a loss (``loss``) and
held-out statistics (``evaluate``) from (params, rng, batch); what it shows a person it returns
as a dew artifact (``preview``), and ``score`` turns a preview into numbers. ``generate`` serves
inference. It never sees the optimizer, the mesh, checkpoints or trackers, so the same objective
runs under ``Trainer`` or a user's own loop.

The ``objective`` and ``model`` config sections are declared here; their keys beyond ``name``
come from the registered component the ``name`` picks.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax

from dew.artifacts import ImageGrid, Representations, TextSamples, TokenScores, VideoGrid
from dew.inputs import InputSpec
from dew.schema import ConfigError, Key, Section, section_from_signature

Params = Any
Batch = Mapping[str, jax.Array]
Stats = dict[str, jax.Array]
Artifact = ImageGrid | VideoGrid | TextSamples | TokenScores | Representations
ARTIFACTS = (ImageGrid, VideoGrid, TextSamples, TokenScores, Representations)
"""What ``Objective.preview`` may return: the artifact types every tracker knows how to write."""


@dataclasses.dataclass(frozen=True)
class Step:
    """What the trainer tells an objective about the current step.

    ``index`` is the optimizer step (a traced int32 inside jit), counted from 0.
    """

    index: jax.Array
    is_training: bool = True


@dataclasses.dataclass(frozen=True)
class Aux:
    """Everything a loss returns besides its statistics: per-example outputs a caller may want
    (e.g. predictions for a probe). Empty for most objectives."""

    outputs: Mapping[str, jax.Array] = dataclasses.field(default_factory=dict[str, jax.Array])


jax.tree_util.register_dataclass(Aux, data_fields=["outputs"], meta_fields=[])


class Objective(abc.ABC):
    """Define what is being learned: the parameters, the loss, what evaluation produces.

    The Trainer uses exactly these members:

    * ``config_section()`` (classmethod): the keys of ``config.objective`` beyond ``name``, with
      defaults, kinds and docs; its ``validate`` checks them together. Default: no keys.
    * ``from_config(config, dataset)`` (classmethod): build from the resolved config and the
      training split's ``Source``. Default: ``cls()``.
    * ``init(rng, batch)``, ``loss(params, rng, batch, step)``, ``evaluate(params, rng, batch)``:
      pure and jittable; ``project(params)`` (default identity): the point each step's loss is
      differentiated at and its update applied to (a constraint such as weight normalisation).
    * ``preview(params, rng)``: one artifact (``ARTIFACTS``), or a mapping name -> artifact
      (each logged under its name; a single one is logged as ``samples``), for a person to look at, from the
      debiased EMA parameters (replicated on every device). Called on every process (it may run
      collective device work); host-side, so it may jit internally and convert to numpy.
      ``has_preview`` says whether an objective provides one.
    * ``score(preview, metrics)``: scalars for the named ``dew.metrics`` (``preview.metrics``) on
      what ``preview`` returned; ``score(None, metrics)`` only checks that the objective can
      score them (a ``ConfigError`` otherwise), before training. Default: refuses any metric.

    ``generate(params, rng, ...)`` produces outputs for inference (``dew.inference``); its
    arguments are the objective's own.
    """

    input_spec: InputSpec
    #: The compute dtypes (``config.precision.compute``) the objective applies its network in;
    #: the Trainer refuses any other before building anything.
    precisions: tuple[str, ...] = ("float32",)

    # --- config ---------------------------------------------------------------------------------
    @classmethod
    def config_section(cls) -> Section:
        """The objective's keys in ``config.objective`` (``name`` aside); none by default."""
        return Section(f"{cls.__name__} takes no options", {})

    @classmethod
    def from_config(cls, config: Any, source: Any) -> Objective:
        """Build from the resolved ``config`` for ``source`` (the training split's ``Source``)."""
        del config, source
        return cls()

    # --- pure functions ---------------------------------------------------------------------------
    @abc.abstractmethod
    def init(self, rng: jax.Array, batch: Batch) -> Params:
        """Fresh parameters for batches shaped like ``batch``."""

    @abc.abstractmethod
    def loss(
        self, params: Params, rng: jax.Array, batch: Batch, step: Step
    ) -> tuple[jax.Array, tuple[Stats, Aux]]:
        """Scalar loss to minimise, with scalar statistics and auxiliary outputs."""

    def project(self, params: Params) -> Params:
        """The parameters the loss is differentiated at, from the stored ones; pure, jittable.

        The step computes ``params = project(state.params)`` before each loss and applies the
        optimizer's update to that, so stored weights are re-projected after every update (once
        per update, before the next forward); the EMA, like a reference that re-normalises inside
        its training forward, averages the updated weights. Default: the identity. EDM2's forced
        weight normalisation (``dew.objectives.edm2``) is the use."""
        return params

    def evaluate(self, params: Params, rng: jax.Array, batch: Batch) -> Stats:
        """Scalar statistics on a held-out batch; by default the loss's own statistics."""
        step = Step(index=jax.numpy.int32(0), is_training=False)
        loss, (stats, _) = self.loss(params, rng, batch, step)
        return {**stats, "loss": loss}

    # --- what a person sees -----------------------------------------------------------------------
    def preview(self, params: Params, rng: jax.Array) -> Artifact:
        """An artifact showing what ``params`` has learned (a fixed ``rng`` shows the same noise
        every time, so change over training is visible)."""
        raise NotImplementedError(f"{type(self).__name__} has no preview")

    @property
    def has_preview(self) -> bool:
        """Whether ``preview`` is implemented (the Trainer refuses ``preview.every`` > 0 if not)."""
        return type(self).preview is not Objective.preview

    def score(
        self, preview: Artifact | None, metrics: Mapping[str, Callable[..., float]]
    ) -> dict[str, float]:
        """Each named metric on ``preview``; objectives that support metrics override this. The
        Trainer passes None once before training, to check the metric names."""
        if metrics:
            raise ConfigError(
                f"config.preview.metrics={tuple(metrics)!r} is invalid: {type(self).__name__} scores "
                "no metrics on its previews; expected ()"
            )
        return {}

    def generate(self, params: Params, rng: jax.Array, *args: Any, **kwargs: Any) -> Any:
        """Outputs for an inference request, pure and jittable; the arguments are the
        objective's own (e.g. conditions and a sampler for a generative model)."""
        raise NotImplementedError(f"{type(self).__name__} does not generate")


def check_artifact(artifact: Any, objective: Objective) -> Artifact:
    """``artifact`` if it is one the trackers can write, else a TypeError naming the objective."""
    if not isinstance(artifact, ARTIFACTS):
        names = ", ".join(a.__name__ for a in ARTIFACTS)
        raise TypeError(
            f"{type(objective).__name__}.preview returned {type(artifact).__name__}; expected one of {names}"
        )
    return artifact


# --- the objective and model config sections --------------------------------------------------------
def _objective_extension(name: str) -> Section:
    from dew import registry

    component = registry.objectives[name]
    return component.config_section()


def _model_extension(name: str) -> Section:
    from dew import registry

    return section_from_signature(registry.models[name], "the network")


OBJECTIVE_CONFIG = Section(
    "what is learned: a registered objective and the options it declares",
    {"name": Key("diffusion", "registered objective (dew.registry.objectives)", registry="objectives")},
    extend=_objective_extension,
)
MODEL_CONFIG = Section(
    "the network an objective builds (its keys are the registered model's arguments)",
    {
        "name": Key(
            None,
            "registered model (dew.models); None: the objective builds its own",
            kind=str,
            registry="models",
        )
    },
    extend=_model_extension,
)

__all__ = [
    "ARTIFACTS",
    "MODEL_CONFIG",
    "OBJECTIVE_CONFIG",
    "Artifact",
    "Aux",
    "Batch",
    "Objective",
    "Params",
    "Stats",
    "Step",
    "check_artifact",
]

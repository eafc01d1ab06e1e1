"""The contract between the trainer and what it trains: ``Objective``, ``Step``, ``Aux``.

Defined in the contracts package (``dew.contracts.objective``, with the ``objective`` and
``model`` config sections), below the trainer and checkpointing alike; the trainer's spelling
names the same classes.
"""

from dew.contracts.objective import (
    ARTIFACTS,
    MODEL_CONFIG,
    OBJECTIVE_CONFIG,
    Artifact,
    Aux,
    Batch,
    Objective,
    Params,
    Stats,
    Step,
    check_artifact,
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

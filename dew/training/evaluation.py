"""Evaluation events and finite coordinated evaluation (``Evaluation``, ``evaluate``).

Not built yet as public API; ``dew.training.stages.EvalStage`` evaluates inside ``fit``.
"""

from dew._unbuilt import unbuilt_class, unbuilt_function

_MISSING = "the public Evaluation/evaluate API lands with the trainer issue; fit() evaluates via EvalStage"
Evaluation = unbuilt_class("Evaluation", "Holds one evaluation event, with bounded previews.", _MISSING)
evaluate = unbuilt_function("evaluate", "Evaluate a finite coordinated prefix.", _MISSING)

"""The names the pure step, ``fit`` and the stages agree on: the statistics every train step
returns and the reports one stage leaves for the next in the same step (``StepContext.reports``).
Each is written once here and imported where it is produced and where it is read."""

from __future__ import annotations

#: The train step's statistics: the loss, the global gradient norm, and the flag (0 or 1 per
#: step) of an update dropped because its loss or gradient was not finite.
LOSS = "loss"
GRAD_NORM = "grad_norm"
NONFINITE_FLAG = "skipped_updates"
#: Under a dynamic loss scale (``config.precision``): the flag (0 or 1 per step) of an update
#: skipped because the scaled gradients overflowed while the loss was finite (the scale backs
#: off; not a failure the non-finite policy acts on), and the scale the step's loss was taken at.
LOSS_SCALE_OVERFLOWS = "loss_scale_overflows"
LOSS_SCALE = "loss_scale"

#: The report evaluation leaves for the checkpoint stage: the held-out loss. Checkpoints ranked
#: by ``best_metric="loss"`` rank by it; a preview metric's report is its own name.
EVAL_LOSS = "eval_loss"

__all__ = ["EVAL_LOSS", "GRAD_NORM", "LOSS", "LOSS_SCALE", "LOSS_SCALE_OVERFLOWS", "NONFINITE_FLAG"]

"""Inference pipelines (``pipeline``). Not built yet."""

from dew._unbuilt import unbuilt_function

pipeline = unbuilt_function(
    "pipeline",
    "Load the inference task for source, its weights placed once.",
    "inference pipelines are not built; restore EMA weights with Checkpoints.restore_ema and call "
    "the objective's generate()",
)

"""Parameter averaging: the classic EMA with its debiasing (``ema``: ``EMASpec``,
``get_debiased_ema``), EDM2's power-function EMA and post-hoc reconstruction (``posthoc``), and
the power-EMA's snapshot store (``power_ema``). Pure functions of parameter trees; no training
loop, no checkpoint format."""

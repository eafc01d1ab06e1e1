"""Parameter averaging: one interface, ``Averager`` (``averager``), implemented by the classic EMA
with its debiasing (``ema``: ``EMASpec``, ``get_debiased_ema``; ``averager.ClassicEMA``) and by
EDM2's power-function EMA (``power_ema.PowerEMA``, with its snapshot store; post-hoc
reconstruction in ``posthoc``); ``averager.Averages`` is a run's set of them. Pure functions of
parameter trees; no training loop, no checkpoint format."""

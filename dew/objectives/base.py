"""The Objective contract, re-exported where the API reference documents it.

``Objective``, ``Step`` and ``Aux`` live in the training layer (``dew.training.objective``) and
``EMASpec`` with the EMA it configures (``dew.averaging.ema``); importing them from here keeps
working.
"""

from dew.averaging.ema import EMASpec
from dew.pytrees import leaf_path
from dew.training.objective import Aux, Batch, Objective, Params, Stats, Step

__all__ = ["Aux", "Batch", "EMASpec", "Objective", "Params", "Stats", "Step", "leaf_path"]

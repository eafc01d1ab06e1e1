"""The Objective contract, re-exported where the API reference documents it.

``Objective``, ``Step`` and ``Aux`` live in the contracts package (``dew.contracts.objective``) and
``EMASpec`` with the EMA it configures (``dew.averaging.ema``); importing them from here keeps
working.
"""

from dew.averaging.ema import EMASpec
from dew.contracts.objective import Aux, Batch, Objective, Params, Stats, Step
from dew.pytrees import leaf_path

__all__ = ["Aux", "Batch", "EMASpec", "Objective", "Params", "Stats", "Step", "leaf_path"]

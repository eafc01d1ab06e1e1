"""Registers the named processes of ``dew.presets``: Table 1's EDM, VP and VE columns, and the
rectified flow (also under its flow-matching name)."""

from dew import registry
from dew.diffusion.process import EDM, FLOW, VE, VP

registry.presets.register("EDM", EDM)
registry.presets.register("VP", VP)
registry.presets.register("VE", VE)
registry.presets.register("RectifiedFlow", FLOW)
registry.presets.register("FlowMatching", FLOW)

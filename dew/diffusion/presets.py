"""Registers the named processes of ``dew.presets``."""

from dew import registry
from dew.diffusion.process import EDM

registry.presets.register("EDM", EDM)

"""Diffusion processes: noise schedules, preconditioning and loss weighting."""

from dew.diffusion.process import EDM, Process

__all__ = ["EDM", "Process"]

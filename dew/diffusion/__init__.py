"""Diffusion processes: noise schedules, prediction targets, preconditioning and loss weighting."""

from dew.diffusion.process import EDM, FLOW, VE, VP, Process

__all__ = ["EDM", "FLOW", "VE", "VP", "Process"]

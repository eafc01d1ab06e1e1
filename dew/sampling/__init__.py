"""Sampling: ODE solvers over a Process's σ schedule, and interval-limited guidance."""

from dew.sampling.guidance import CFG
from dew.sampling.solvers import SOLVERS, sample

__all__ = ["CFG", "SOLVERS", "sample"]

"""Sampling: ODE/SDE solvers over a Process's σ schedule, and interval-limited guidance."""

from dew.sampling.guidance import CFG
from dew.sampling.schedule import karras_sigmas
from dew.sampling.solvers import (
    SOLVERS,
    DPMSolverPP2M,
    EDMStochastic,
    Euler,
    Heun,
    Solver,
    check_unit_noise,
    nfe,
    sample,
    trajectory,
)

__all__ = [
    "CFG",
    "SOLVERS",
    "DPMSolverPP2M",
    "EDMStochastic",
    "Euler",
    "Heun",
    "Solver",
    "check_unit_noise",
    "karras_sigmas",
    "nfe",
    "sample",
    "trajectory",
]

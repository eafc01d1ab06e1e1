"""Run telemetry: native profiler capture (``profile``)."""

from dew.telemetry.profile import profile

__all__ = ["profile"]

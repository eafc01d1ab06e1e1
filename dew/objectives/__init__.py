"""Objective classes. The registry of objectives is ``dew.registry.objectives``."""

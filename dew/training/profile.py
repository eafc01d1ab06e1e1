"""Profiler windows (``ProfileWindow``, ``profile``). Not built yet."""

from dew._unbuilt import unbuilt_class, unbuilt_function

_MISSING = "profiling windows land with the trainer issue"
ProfileWindow = unbuilt_class("ProfileWindow", "One profiler window per fit.", _MISSING)
profile = unbuilt_function("profile", "Configure native profiling.", _MISSING)

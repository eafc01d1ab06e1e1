"""Condition encoders; each registers itself in ``dew.registry.encoders``."""

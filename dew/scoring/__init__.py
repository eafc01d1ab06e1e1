"""Sample-quality metrics; each registers itself in ``dew.registry.metrics``."""

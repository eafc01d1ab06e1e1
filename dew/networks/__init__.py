"""Networks, written in haiku; each registers itself in ``dew.registry.models``.

(The package is not called ``dew.models``: that name is the registry, as the seed API has it.)
"""

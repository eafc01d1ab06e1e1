"""Placement of a train state on a device mesh (``MeshSpec``, ``Layout``).

Not built yet: the trainer runs on one device. The pure step already takes and returns whole
pytrees, so sharding is a matter of passing in/out shardings to ``jax.jit``.
"""

from dew._unbuilt import unbuilt_class

_MISSING = "mesh sharding (MeshSpec/Layout) lands with the trainer issue; training runs on one device"
MeshSpec = unbuilt_class("MeshSpec", "Says how many devices each sharding axis takes.", _MISSING)
Layout = unbuilt_class("Layout", "Says how a train state is placed on a mesh.", _MISSING)

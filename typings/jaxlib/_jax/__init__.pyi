# jaxlib's compiled extension ships no .pyi, so the Device and Client that jax's own signatures
# name (jax.devices(), jax.process_index(backend=...), jnp.zeros(device=...)) are unknown to the
# checker without this (``pytree``, beside it, types a tree's structure). The attributes dew reads
# are declared; every other attribute, and every other name of the module, is Any.
from typing import Any

class Device:
    id: int
    process_index: int
    platform: str
    device_kind: str
    client: Client
    def __getattr__(self, name: str) -> Any: ...

class Client:
    platform: str
    platform_version: str
    def __getattr__(self, name: str) -> Any: ...

def __getattr__(name: str) -> Any: ...

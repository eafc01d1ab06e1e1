# jaxlib.xla_client re-exports the compiled extension's classes (``Device = _xla.Device``); this
# names the two jax's signatures use, from the stub beside it. Every other name is Any.
from typing import Any

from jaxlib._jax import Client as Client
from jaxlib._jax import Device as Device

def __getattr__(name: str) -> Any: ...

# optax ships no stubs and no py.typed marker. The names dew uses are re-exported from optax's own
# modules, so their annotations are the library's; every other name is Any. A submodule imported
# by its own name (``import optax.contrib``) resolves to the library itself.
from typing import Any

from optax._src.alias import adam as adam
from optax._src.alias import adamw as adamw
from optax._src.alias import sgd as sgd
from optax._src.base import EmptyState as EmptyState
from optax._src.base import GradientTransformation as GradientTransformation
from optax._src.base import GradientTransformationExtraArgs as GradientTransformationExtraArgs
from optax._src.base import OptState as OptState
from optax._src.base import Params as Params
from optax._src.base import Schedule as Schedule
from optax._src.base import Updates as Updates
from optax._src.update import apply_updates as apply_updates
from optax.transforms._clipping import clip_by_global_norm as clip_by_global_norm
from optax.transforms._combining import chain as chain

def __getattr__(name: str) -> Any: ...

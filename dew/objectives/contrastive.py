"""A contrastive encoder (SimCLR, Chen et al. 2020, at digit scale): two random views of each
image should embed close to each other and far from the other images of the batch.

Views: each image is shifted by up to ``shift`` pixels in each direction (the exposed border
filled with the background, −1), a random ``mask`` share of its pixels set to the background,
and Gaussian noise of std ``noise`` added. Both views go through the encoder (features [B, D],
what ``Representations`` holds) and a projection head (an MLP, normalised to the unit sphere);
the loss is NT-Xent at ``temperature`` over the 2B views. The preview embeds a fixed probe set
(its images unaugmented) as ``Representations``; ``score`` runs the registered ``linear_probe``
on it and, as the baseline, the same probe on the raw pixels of the same records.

Precision (``config.precision.compute``, ``docs/precision.md``): under bfloat16 the encoder and
the head compute on their float32 parameters cast at use, with the views cast on entry
(``dew.contracts.precision.compute_in``); the features and the head's output return to float32,
where the projection onto the unit sphere, the similarities and NT-Xent are computed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.artifacts import Representations
from dew.contracts.objective import Aux, Batch, Objective, Params, Stats, Step
from dew.contracts.precision import compute_dtype_of, compute_in
from dew.inputs import Field, InputSpec
from dew.objectives.whole import BuiltWhole
from dew.schema import ConfigError, Key, Section, at_least


class ImageEncoder(hk.Module):
    """[B, H, W, C] images -> [B, features]: a small conv net (two stride-2 convs) and an MLP."""

    def __init__(self, features: int = 64, width: int = 32, name: str | None = None):
        super().__init__(name=name)
        self.features, self.width = features, width

    def __call__(self, images: jax.Array) -> jax.Array:
        h = jax.nn.relu(hk.Conv2D(self.width, 3, name="conv0")(images))
        h = jax.nn.relu(hk.Conv2D(self.width, 3, stride=2, name="conv1")(h))
        h = jax.nn.relu(hk.Conv2D(2 * self.width, 3, stride=2, name="conv2")(h))
        h = jax.nn.relu(hk.Linear(4 * self.width, name="fc")(h.reshape(h.shape[0], -1)))
        return hk.Linear(self.features, name="features")(h)


def augment(rng: jax.Array, images: jax.Array, shift: int, mask: float, noise: float) -> jax.Array:
    """One random view of each image (see the module docstring); pure."""
    b, h, w, _ = images.shape
    k_shift, k_mask, k_noise = jax.random.split(rng, 3)
    padded = jnp.pad(images, ((0, 0), (shift, shift), (shift, shift), (0, 0)), constant_values=-1.0)
    offsets = jax.random.randint(k_shift, (b, 2), 0, 2 * shift + 1)

    def crop(image, offset):
        return jax.lax.dynamic_slice(image, (offset[0], offset[1], 0), (h, w, image.shape[-1]))

    views = jax.vmap(crop)(padded, offsets)
    keep = jax.random.uniform(k_mask, (*views.shape[:3], 1)) >= mask
    views = jnp.where(keep, views, -1.0)
    return views + noise * jax.random.normal(k_noise, views.shape)


def nt_xent(z: jax.Array, temperature: float) -> tuple[jax.Array, jax.Array]:
    """NT-Xent over 2B unit vectors (views i and i + B are positives): (loss, top-1 accuracy of
    finding the positive among the other 2B − 1)."""
    n = z.shape[0] // 2
    logits = z @ z.T / temperature
    logits = jnp.where(jnp.eye(2 * n, dtype=bool), -jnp.inf, logits)
    positive = jnp.concatenate([jnp.arange(n, 2 * n), jnp.arange(n)])
    log_p = jax.nn.log_softmax(logits, axis=-1)
    loss = -jnp.mean(log_p[jnp.arange(2 * n), positive])
    return loss, jnp.mean(jnp.argmax(logits, axis=-1) == positive)


class Contrastive(Objective, metaclass=BuiltWhole):
    """Self-supervised encoder on the ``image`` field (labels are never used in training);
    ``compute_dtype`` (float32 or bfloat16) is the dtype the network computes in (module
    docstring)."""

    precisions = ("float32", "bfloat16")

    def __init__(
        self,
        image_shape: tuple[int, ...],
        encoder: Callable[[], Callable[[jax.Array], jax.Array]],
        probe_images: np.ndarray | None = None,
        probe_labels: np.ndarray | None = None,
        projection: int = 32,
        temperature: float = 0.2,
        shift: int = 1,
        mask: float = 0.2,
        noise: float = 0.1,
        compute_dtype: str = "float32",
    ):
        for name, value, ok in (
            ("temperature", temperature, temperature > 0),
            ("shift", shift, shift >= 0),
            ("mask", mask, 0 <= mask < 1),
            ("noise", noise, noise >= 0),
        ):
            if not ok:
                raise ValueError(f"Contrastive: {name}={value} is out of range")
        self.input_spec = InputSpec(Field("image", tuple(image_shape)))
        self.temperature, self.shift, self.mask, self.noise = temperature, shift, mask, noise
        self.probe_images, self.probe_labels = probe_images, probe_labels

        def forward(images: jax.Array) -> tuple[jax.Array, jax.Array]:
            features = encoder()(images)
            return features, hk.nets.MLP([2 * projection, projection], name="head")(jax.nn.relu(features))

        self._net = hk.transform(forward)
        self.compute_dtype = jnp.dtype(compute_dtype)
        self._apply = compute_in(self._net.apply, self.compute_dtype)  # the precision policy

    def init(self, rng: jax.Array, batch: Batch) -> Params:
        return self._net.init(rng, batch["image"])

    def embed(self, params: Params, images: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Images [B, H, W, C] -> (features [B, D], the head's output on the unit sphere [B, P]),
        float32 under every policy (the projection onto the sphere computed in float32)."""
        features, head = self._apply(params, None, images)
        return features, head / (jnp.linalg.norm(head, axis=-1, keepdims=True) + 1e-8)

    def features(self, params: Params, images: jax.Array) -> jax.Array:
        """The encoder's representation [B, D] of (unaugmented) images."""
        return self.embed(params, images)[0]

    def loss(
        self, params: Params, rng: jax.Array, batch: Batch, step: Step
    ) -> tuple[jax.Array, tuple[Stats, Aux]]:
        images = batch["image"]
        chex.assert_shape(images, (None, *self.input_spec.sample.shape))
        a, b = jax.random.split(rng)
        views = jnp.concatenate(
            [augment(k, images, self.shift, self.mask, self.noise) for k in (a, b)], axis=0
        )
        _, z = self.embed(params, views)
        loss, accuracy = nt_xent(z, self.temperature)
        return loss, ({"positive_top1": accuracy}, Aux())

    def generate(self, params: Params, rng: jax.Array, images: jax.Array) -> jax.Array:
        """Inference: the representation of each image (``rng`` unused: the encoder is
        deterministic)."""
        del rng
        return self.features(params, images)

    # --- config ----------------------------------------------------------------------------------
    @classmethod
    def config_section(cls) -> Section:
        return CONFIG

    @classmethod
    def from_config(cls, config: Any, source: Any) -> Contrastive:
        """Build for a labelled image source (``image`` field, e.g. ``digits``); the probe set is
        the validation split followed by the first ``probe_train`` training images."""
        from dew.data.splits import open_split

        if "image" not in source.fields or "label" not in source.fields:
            raise ConfigError(
                f"config.dataset.name={config.dataset.name!r}: the contrastive objective needs 'image' and "
                f"'label' fields (labels only for the probe), {source.name} has {sorted(source.fields)}"
            )
        if config.model.name is None:
            raise ConfigError(
                "config.model.name=None is invalid: the contrastive objective needs an encoder, "
                "e.g. 'image_encoder'"
            )
        o = config.objective
        held = open_split(config.dataset, "validation")
        images = np.concatenate([held.fields["image"], source.fields["image"][: o.probe_train]])
        labels = np.concatenate([held.fields["label"], source.fields["label"][: o.probe_train]])
        options = {k: v for k, v in config.model.items() if k != "name"}
        return cls(
            tuple(source.fields["image"].shape[1:]),
            functools.partial(registry.models[config.model.name], **options),
            images,
            labels,
            projection=o.projection,
            temperature=o.temperature,
            shift=o.shift,
            mask=o.mask,
            noise=o.noise,
            compute_dtype=compute_dtype_of(config),
        )

    # --- inference ------------------------------------------------------------------------------
    def inference_options(self) -> dict[str, Any]:
        return {"images": None, "labels": None}

    def infer(self, params: Params, *, images=None, labels=None) -> Representations:
        """Representations of ``images`` [N, H, W, C] in [-1, 1] with their ``labels`` (default:
        the probe set the run's previews embed, which this reproduces exactly)."""
        if images is None:
            return self.preview(params, jax.random.PRNGKey(0))
        images = np.asarray(images, np.float32)
        if images.shape[1:] != self.input_spec.sample.shape:
            raise ValueError(f"images must be [N, *{self.input_spec.sample.shape}], got shape {images.shape}")
        labels = np.zeros(len(images), np.int64) if labels is None else np.asarray(labels)
        return Representations(np.asarray(_features_jit(self)(params, jnp.asarray(images))), labels)

    def preview(self, params: Params, rng: jax.Array) -> Representations:
        if self.probe_images is None:
            raise ValueError("Contrastive.preview needs probe_images and probe_labels")
        features = np.asarray(_features_jit(self)(params, jnp.asarray(self.probe_images)))
        return Representations(features, np.asarray(self.probe_labels))

    def score(self, preview: Any, metrics: Mapping[str, Callable[..., float]]) -> dict[str, float]:
        """Each metric on the representations; with ``linear_probe``, also
        ``linear_probe_pixels``: the same probe on the probe set's raw pixels (the baseline)."""
        from dew.scoring.linear_probe import probe_accuracy

        if preview is None:  # the Trainer checking the metric names before training
            return {}
        out = {name: float(metric(preview)) for name, metric in metrics.items()}
        if "linear_probe" in metrics:
            assert self.probe_images is not None and self.probe_labels is not None  # preview needs them
            out["linear_probe_pixels"] = probe_accuracy(self.probe_images, self.probe_labels)
        return out


CONFIG = Section(
    "a SimCLR-style contrastive encoder; previews embed a probe set as Representations",
    {
        "projection": Key(32, "width of the projection head's output", **at_least(1, "an int >= 1")),
        "temperature": Key(0.2, "NT-Xent temperature", check=lambda v: v > 0, accepted="a float > 0"),
        "shift": Key(1, "largest shift of a view, pixels", **at_least(0, "an int >= 0")),
        "mask": Key(
            0.2, "share of a view's pixels blanked", check=lambda v: 0 <= v < 1, accepted="a float in [0, 1)"
        ),
        "noise": Key(0.1, "std of the Gaussian noise added to a view", **at_least(0, "a float >= 0")),
        "probe_train": Key(
            720,
            "training images added to the validation split in the probe set",
            **at_least(0, "an int >= 0"),
        ),
    },
)


@functools.lru_cache(maxsize=4)
def _features_jit(objective: Contrastive):
    return jax.jit(objective.features)


registry.models.register("image_encoder", ImageEncoder)
registry.objectives.register("contrastive", Contrastive)

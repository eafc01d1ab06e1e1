"""The augmentation pipeline's settings: ``config.objective.augment``, keyed exactly as NVlabs/edm's
``training/augment.py`` ``AugmentPipe.__init__`` (the keyword names and, but for ``p``, its
defaults), so a reference ``augment_kwargs`` dict reads as a dew section unchanged.

``p`` defaults to 0 here (the reference's constructor says 1, but its ``train.py`` builds no pipe
at all for ``--augment=0``): with ``p`` = 0 there is no augmentation and no labels, and today's
runs are unchanged. The paper's CIFAR-10 setting (``train.py --augment=0.12``) is
``p=0.12, xflip=1e8, yflip=1, scale=1, rotate_frac=1, aniso=1, translate_frac=1``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dew.schema import ConfigError, Key, Section

_MULTIPLIER = "a float >= 0 (a probability multiplier: 0 off, >= 1/p always)"
_STD = "a float >= 0"


def _multiplier(name: str, what: str) -> tuple[str, float, str, str]:
    """A transform's probability multiplier: off (0) by default, as in the reference."""
    return (name, 0.0, f"probability multiplier for {what}", _MULTIPLIER)


# (name, default, doc, accepted range) in the reference constructor's order.
_FIELDS: tuple[tuple[str, float, str, str], ...] = (
    ("p", 0.0, "overall augmentation probability; 0: no augmentation (train.py --augment)", "[0, 1]"),
    # Pixel blitting.
    _multiplier("xflip", "x-flip"),
    _multiplier("yflip", "y-flip"),
    _multiplier("rotate_int", "integer (90°) rotation"),
    _multiplier("translate_int", "integer translation"),
    ("translate_int_max", 0.125, "range of integer translation, relative to image size", "(0, 1]"),
    # Geometric transformations.
    _multiplier("scale", "isotropic scaling"),
    _multiplier("rotate_frac", "fractional rotation"),
    _multiplier("aniso", "anisotropic scaling"),
    _multiplier("translate_frac", "fractional translation"),
    ("scale_std", 0.2, "log2 standard deviation of isotropic scaling", _STD),
    ("rotate_frac_max", 1.0, "range of fractional rotation, 1 = full circle", _STD),
    ("aniso_std", 0.2, "log2 standard deviation of anisotropic scaling", _STD),
    ("aniso_rotate_prob", 0.5, "probability of anisotropic scaling in a rotated frame", "[0, 1]"),
    ("translate_frac_std", 0.125, "standard deviation of fractional translation, relative to size", _STD),
    # Colour transformations.
    _multiplier("brightness", "brightness"),
    _multiplier("contrast", "contrast"),
    _multiplier("lumaflip", "luma flip"),
    _multiplier("hue", "hue rotation"),
    _multiplier("saturation", "saturation"),
    ("brightness_std", 0.2, "standard deviation of brightness", _STD),
    ("contrast_std", 0.5, "log2 standard deviation of contrast", _STD),
    ("hue_max", 1.0, "range of hue rotation, 1 = full circle", _STD),
    ("saturation_std", 1.0, "log2 standard deviation of saturation", _STD),
)

_CHECKS = {
    "[0, 1]": lambda v: 0.0 <= v <= 1.0,
    "(0, 1]": lambda v: 0.0 < v <= 1.0,
    _MULTIPLIER: lambda v: v >= 0.0,
    _STD: lambda v: v >= 0.0,
}
_FINITE = lambda v: v == v and abs(v) != float("inf")  # noqa: E731


def _key(default: float, doc: str, accepted: str) -> Key:
    check = _CHECKS[accepted]
    words = accepted if not accepted.startswith(("[", "(")) else f"a float in {accepted}"
    return Key(default, doc, kind=float, check=lambda v: _FINITE(v) and check(v), accepted=words)


CONFIG = Section(
    "NVlabs/edm's AugmentPipe (training/augment.py), applied to each training batch before noising",
    {name: _key(default, doc, accepted) for name, default, doc, accepted in _FIELDS},
)

# Which transforms each setting enables, and the augmentation labels each adds (in order).
GEOMETRIC = ("scale", "rotate_frac", "aniso", "translate_frac")
COLOUR = ("brightness", "contrast", "lumaflip", "hue", "saturation")
LABEL_WIDTH = {
    "xflip": 1,
    "yflip": 1,
    "rotate_int": 2,
    "translate_int": 2,
    "scale": 1,
    "rotate_frac": 2,
    "aniso": 2,
    "translate_frac": 2,
    "brightness": 1,
    "contrast": 1,
    "lumaflip": 1,
    "hue": 2,
    "saturation": 1,
}


@dataclasses.dataclass(frozen=True)
class AugmentSettings:
    """One ``AugmentPipe``'s settings, the reference constructor's keywords (see ``_FIELDS``)."""

    p: float = 0.0
    xflip: float = 0.0
    yflip: float = 0.0
    rotate_int: float = 0.0
    translate_int: float = 0.0
    translate_int_max: float = 0.125
    scale: float = 0.0
    rotate_frac: float = 0.0
    aniso: float = 0.0
    translate_frac: float = 0.0
    scale_std: float = 0.2
    rotate_frac_max: float = 1.0
    aniso_std: float = 0.2
    aniso_rotate_prob: float = 0.5
    translate_frac_std: float = 0.125
    brightness: float = 0.0
    contrast: float = 0.0
    lumaflip: float = 0.0
    hue: float = 0.0
    saturation: float = 0.0
    brightness_std: float = 0.2
    contrast_std: float = 0.5
    hue_max: float = 1.0
    saturation_std: float = 1.0

    def __post_init__(self) -> None:
        check_settings(self)

    @classmethod
    def from_config(cls, section: Any) -> AugmentSettings:
        """From a resolved ``config.objective.augment`` (a ConfigDict or mapping)."""
        values = section.to_dict() if hasattr(section, "to_dict") else dict(section)
        return cls(**{k: float(v) for k, v in values.items()})

    @property
    def enabled(self) -> bool:
        """Whether the pipeline runs at all: ``p`` > 0 (``train.py --augment=0`` builds no pipe)."""
        return self.p > 0

    @property
    def transforms(self) -> tuple[str, ...]:
        """The transforms the reference executes (multiplier > 0), in its order."""
        return tuple(name for name in LABEL_WIDTH if getattr(self, name) > 0)

    @property
    def label_dim(self) -> int:
        """How many augmentation labels the pipeline returns: the network's ``augment_dim``
        (9 for the paper's setting: xflip 1, yflip 1, scale 1, rotate_frac 2, aniso 2,
        translate_frac 2); 0 when the pipeline is off."""
        return sum(LABEL_WIDTH[name] for name in self.transforms) if self.enabled else 0


def check_settings(settings: AugmentSettings, where: str = "objective.augment") -> None:
    """Each field against its accepted range: a ``ConfigError`` naming the first that is not."""
    for name, *_ in _FIELDS:
        key = CONFIG.keys[name]
        assert isinstance(key, Key)  # every field of _FIELDS is a key of CONFIG
        value = getattr(settings, name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(f"config.{where}.{name}={value!r} is invalid: expected {key.accepted}")
        key.validate(float(value), f"{where}.{name}")


def check_images(settings: AugmentSettings, shape: tuple[int, ...], where: str = "objective.augment") -> None:
    """That the pipeline can run on samples of ``shape`` (one sample, [H, W, C]): images with
    at least 2 pixels a side; 90° rotations need square images, colour transforms 1 or 3
    channels (the reference's own limits). A ``ConfigError`` naming the setting otherwise."""
    if not settings.enabled:
        return
    if len(shape) != 3:
        raise ConfigError(
            f"config.{where}.p={settings.p!r} is invalid for samples of shape {tuple(shape)}: "
            "augmentation needs images [H, W, C]; expected p=0"
        )
    h, w, c = shape
    if min(h, w) < 2:
        raise ConfigError(f"config.{where}.p={settings.p!r} is invalid for {h}x{w} images: expected p=0")
    if settings.rotate_int > 0 and h != w:
        raise ConfigError(
            f"config.{where}.rotate_int={settings.rotate_int!r} is invalid for {h}x{w} images: "
            "90° rotations need square images; expected 0"
        )
    colour = [name for name in COLOUR if getattr(settings, name) > 0]
    if colour and c not in (1, 3):
        raise ConfigError(
            f"config.{where}.{colour[0]}={getattr(settings, colour[0])!r} is invalid for {c}-channel "
            "images: colour transforms need 3 (RGB) or 1 (L) channels; expected 0"
        )

"""One typed config schema, assembled from sections each declared next to the code that owns it.

A ``Section`` lists its keys: a ``Key`` has a default, a kind (int, float, bool, str, tuple), a
one-line doc and optional checks; a section may nest sections and may be *extended* by a
registered component (``dataset``, ``objective``, ``model``: the keys of the component named by
the section's ``name``). ``resolve`` reads an experiment's ``ConfigDict`` against the schema:

* an unknown key stops with one error naming it and the closest known key;
* an omitted key takes its default, so it is present (and overridable) afterwards;
* a value of the wrong kind stops with the key, the value and the kind expected;
* ``--config.a.b=value`` overrides are parsed as the key's kind;
* then every key's checks and every section's cross-key ``validate`` run on the final values.

``ml_collections.ConfigDict`` stays the config type: the result is an ordinary ConfigDict with
every key of the schema set. ``describe`` prints the resolved schema with values, defaults and
docs (``python -m dew.main --help-config``).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections


class ConfigError(ValueError):
    """A config file, key or value that cannot be used; the message names the key."""


_KINDS = (bool, int, float, str, tuple)
_KIND_NAMES = {bool: "a bool", int: "an int", float: "a float", str: "a str", tuple: "a tuple"}


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key: its default, kind, a one-line doc, and what values are accepted.

    ``kind`` is one of bool, int, float, str, tuple (inferred from a non-None default); an int
    is accepted where a float is expected. ``optional`` also accepts None (implied by a None
    default). ``item`` is the kind of a tuple's elements. ``choices`` lists the accepted values;
    ``registry`` names a ``dew.registry`` table the value (each element, for a tuple) must be
    registered in; ``check(value) -> bool`` with ``accepted`` (what it accepts, for the message)
    covers ranges and anything else.
    """

    default: Any
    doc: str
    kind: type | None = None
    optional: bool = False
    item: type | None = None
    choices: tuple[Any, ...] | None = None
    registry: str | None = None
    check: Callable[[Any], bool] | None = None
    accepted: str = ""

    def __post_init__(self) -> None:
        kind = self.kind
        if kind is None:
            if self.default is None:
                raise ValueError(f"Key({self.doc!r}): a None default needs an explicit kind")
            kind = next(k for k in _KINDS if isinstance(self.default, k))
            if isinstance(self.default, list):
                kind = tuple
            object.__setattr__(self, "kind", kind)
        if kind not in _KINDS:
            raise ValueError(f"Key({self.doc!r}): kind must be one of {_KINDS}, got {kind!r}")
        if self.default is None:
            object.__setattr__(self, "optional", True)
        default: Any = self.default  # any value of the kinds (a tuple's elements, for a tuple)
        if kind is tuple and self.item is None and default:
            kinds = {next(k for k in _KINDS if isinstance(v, k)) for v in default}
            if len(kinds) == 1:  # a homogeneous default fixes the element kind
                object.__setattr__(self, "item", kinds.pop())

    @property
    def type_name(self) -> str:
        assert self.kind is not None, "__post_init__ sets the kind"
        name = self.kind.__name__
        if self.kind is tuple and self.item is not None:
            name = f"tuple[{self.item.__name__}]"
        return f"{name} | None" if self.optional else name

    # --- kinds ----------------------------------------------------------------------------------
    def coerce(self, value: Any, key: str) -> Any:
        """``value`` as this key's kind, or a ConfigError naming ``key``."""
        if value is None:
            if self.optional:
                return None
            raise ConfigError(f"config.{key}=None: expected {_KIND_NAMES[self.kind]}")
        kind = self.kind
        ok = {
            bool: isinstance(value, bool),
            int: isinstance(value, int) and not isinstance(value, bool),
            float: isinstance(value, int | float) and not isinstance(value, bool),
            str: isinstance(value, str),
            tuple: isinstance(value, tuple | list),
        }[kind]
        if not ok:
            raise ConfigError(
                f"config.{key}={value!r}: expected {_KIND_NAMES[kind]}{' or None' if self.optional else ''}, "
                f"got {type(value).__name__}"
            )
        if kind is float:
            return float(value)
        if kind is tuple:
            assert isinstance(value, tuple | list)  # checked above
            if self.item is None:
                return tuple(value)
            element = Key(None, "", kind=self.item, optional=False)
            return tuple(element.coerce(v, f"{key}[{i}]") for i, v in enumerate(value))
        return value

    def parse(self, text: str, key: str) -> Any:
        """Parse a command-line ``text`` as this key's kind."""

        def fail(expected: str) -> ConfigError:
            return ConfigError(f"config.{key}={text!r}: expected {expected} (the key is {self.type_name})")

        if self.optional and text in ("None", "none", "null"):
            return None
        if self.kind is bool:
            if text.lower() in ("true", "1", "yes"):
                return True
            if text.lower() in ("false", "0", "no"):
                return False
            raise fail("a bool (true/false)")
        if self.kind is int:
            try:
                return int(text)
            except ValueError:
                raise fail("an int") from None
        if self.kind is float:
            try:
                return float(text)
            except ValueError:
                raise fail("a float") from None
        if self.kind is str:
            return text
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text if self.item is str else None
            if value is None:
                raise fail("a tuple literal such as (1, 2)") from None
        if not isinstance(value, tuple | list):
            value = (value,)
        try:
            return self.coerce(tuple(value), key)
        except ConfigError:
            raise fail(f"a sequence of {self.item.__name__ if self.item else 'values'}") from None

    # --- values ---------------------------------------------------------------------------------
    def validate(self, value: Any, key: str) -> None:
        """Run ``choices``, ``registry`` and ``check`` on a value of the right kind."""
        if value is None:
            return
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"config.{key}={value!r} is invalid: expected one of {self.choices}")
        if self.registry is not None:
            from dew import registry

            table = getattr(registry, self.registry)
            for name in value if isinstance(value, tuple) else (value,):
                if name not in table:
                    raise ConfigError(f"config.{key}: {table._miss_message(name)}")
        if self.check is not None and not self.check(value):
            raise ConfigError(f"config.{key}={value!r} is invalid: expected {self.accepted}")


def at_least(low: float, accepted: str) -> dict[str, Any]:
    """A ``Key``'s ``check``/``accepted`` pair for a lower bound, e.g.
    ``Key(1, "...", **at_least(1, "an int >= 1"))``."""
    return {"check": lambda v: v >= low, "accepted": accepted}


Extension = Callable[[str], "Section"]


@dataclasses.dataclass(frozen=True)
class Section:
    """A named group of keys (and nested sections), with an optional cross-key ``validate``.

    ``validate(section, path)`` receives the resolved section (a ConfigDict) and its dotted path
    and raises ``ConfigError``. ``extend(name) -> Section`` adds the keys of the registered
    component named by this section's ``name`` key (its ``validate`` runs too).
    """

    doc: str
    keys: Mapping[str, Key | Section]
    # Its return value, if any, is ignored (a validator may return what it built).
    validate: Callable[[ml_collections.ConfigDict, str], object] | None = None
    extend: Extension | None = None

    def expand(self, raw: Mapping[str, Any] | None, path: str) -> Section:
        """This section with the component's keys merged in (for the name ``raw`` gives)."""
        extend = self.extend
        if extend is None:
            return self
        name_key = self.keys["name"]
        assert isinstance(name_key, Key), "an extensible section's `name` is a key"
        name = (raw or {}).get("name", name_key.default)
        name = name_key.coerce(name, f"{path}.name")
        name_key.validate(name, f"{path}.name")
        if name is None:
            return self
        extension = extend(name)
        clash = set(extension.keys) & set(self.keys)
        if clash:
            raise ValueError(f"config.{path}: the component {name!r} redeclares keys {sorted(clash)}")
        validators = [v for v in (self.validate, extension.validate) if v is not None]

        def validate(section: ml_collections.ConfigDict, where: str) -> None:
            for v in validators:
                v(section, where)

        return Section(self.doc, {**self.keys, **extension.keys}, validate if validators else None)


def _closest(word: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.0)
    return close[0] if close else ""


def unknown_key(path: str, part: str, known: Sequence[str]) -> ConfigError:
    """The one error for a key the schema does not have: the key and the closest known one."""
    here = f"{path}.{part}" if path else part
    parent = f"config.{path}" if path else "config"
    close = _closest(part, known)
    hint = f"; did you mean {close!r} (config.{path + '.' if path else ''}{close})?" if close else ""
    return ConfigError(f"unknown config key 'config.{here}'{hint} Known keys of {parent}: {sorted(known)}")


# --- resolving ---------------------------------------------------------------------------------
def _as_mapping(value: Any, key: str) -> Mapping[str, Any]:
    if isinstance(value, ml_collections.ConfigDict):
        return value.to_dict()
    if isinstance(value, Mapping):
        return value
    raise ConfigError(f"config.{key}={value!r}: expected a section (a ConfigDict of keys)")


def _expand_all(section: Section, raw: Mapping[str, Any], path: str) -> Section:
    section = section.expand(raw, path)
    keys: dict[str, Key | Section] = {}
    for name, spec in section.keys.items():
        if isinstance(spec, Section):
            where = f"{path}.{name}" if path else name
            sub = _as_mapping(raw[name], where) if name in raw else {}
            keys[name] = _expand_all(spec, sub, where)
        else:
            keys[name] = spec
    return Section(section.doc, keys, section.validate)


def _fill(section: Section, raw: Mapping[str, Any], path: str) -> ml_collections.ConfigDict:
    for name in raw:
        if name not in section.keys:
            raise unknown_key(path, name, list(section.keys))
    out = ml_collections.ConfigDict()
    for name, spec in section.keys.items():
        where = f"{path}.{name}" if path else name
        if isinstance(spec, Section):
            out[name] = _fill(spec, _as_mapping(raw[name], where) if name in raw else {}, where)
        else:
            out[name] = spec.coerce(raw.get(name, spec.default), where)
    return out


def _check(section: Section, config: ml_collections.ConfigDict, path: str) -> None:
    for name, spec in section.keys.items():
        where = f"{path}.{name}" if path else name
        if isinstance(spec, Section):
            _check(spec, config[name], where)
        else:
            spec.validate(config[name], where)
    if section.validate is not None:
        section.validate(config, path)


def _split_override(item: str) -> tuple[list[str], str]:
    key, sep, text = item.partition("=")
    if not sep or not key.startswith("config."):
        raise ConfigError(f"cannot read override {item!r}: expected --config.<key>=<value>")
    return key[len("config.") :].split("."), text


def _lookup(section: Section, path: list[str]) -> Key:
    node: Key | Section = section
    for depth, part in enumerate(path):
        here = ".".join(path[:depth])
        if not isinstance(node, Section):
            raise ConfigError(f"config.{here} is a value, not a section: cannot set config.{'.'.join(path)}")
        if part not in node.keys:
            raise unknown_key(here, part, list(node.keys))
        node = node.keys[part]
    if isinstance(node, Section):
        raise ConfigError(
            f"config.{'.'.join(path)} is a section: expected a sub-key such as "
            f"config.{'.'.join(path)}.<name>, not a value"
        )
    return node


def resolve(
    schema: Section, config: ml_collections.ConfigDict | Mapping[str, Any], overrides: Sequence[str] = ()
) -> tuple[ml_collections.ConfigDict, Section]:
    """Check ``config`` and ``overrides`` (``config.a.b=value`` strings) against ``schema``.

    Returns the complete config (every key set: the file's value, an override, or the default)
    and the schema as resolved for the components it names. Raises ``ConfigError`` naming the
    first key that is unknown, of the wrong kind, or not accepted.
    """
    raw = dict(_as_mapping(config, ""))
    parsed = [(_split_override(item), item) for item in overrides]
    # Component names first: they decide which keys the dataset/objective/model sections have.
    for (path, text), _ in parsed:
        if len(path) == 2 and path[1] == "name" and path[0] in schema.keys:
            spec = schema.keys[path[0]]
            if isinstance(spec, Section) and spec.extend is not None:
                raw[path[0]] = {**_as_mapping(raw.get(path[0], {}), path[0]), "name": text}
    resolved = _expand_all(schema, raw, "")
    out = _fill(resolved, raw, "")
    for (path, text), _ in parsed:
        key = _lookup(resolved, path)
        node = out
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = key.parse(text, ".".join(path))
    _check(resolved, out, "")
    return out, resolved


# --- components declare sections from their signatures --------------------------------------------
_SCALARS = {"int": int, "float": float, "str": str, "bool": bool}


def _annotated_kind(annotation: Any) -> type:
    """The kind of a keyword whose default is None: the scalar its annotation names beside None
    (``int | None`` -> int), else str."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    names = [part.strip() for part in text.replace("Optional[", "").rstrip("]").split("|")]
    kinds = [_SCALARS[n] for n in names if n in _SCALARS]
    return kinds[0] if len(kinds) == 1 and all(n in (*_SCALARS, "None") for n in names) else str


@dataclasses.dataclass(frozen=True)
class Declared:
    """A registered component with its own config section: calling it calls ``build``, and
    ``section_from_signature`` returns ``section()`` instead of reading ``build``'s signature."""

    build: Callable[..., Any]
    section: Callable[[], Section]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.build(*args, **kwargs)


def section_from_signature(
    component: Callable[..., Any],
    doc: str,
    *,
    skip: Sequence[str] = ("name", "split"),
    docs: Mapping[str, str] | None = None,
) -> Section:
    """The keys of a registered component: a ``Declared`` one's own section, else its keyword
    parameters that have defaults (``skip`` aside), each typed by its default (a None default
    takes the scalar its annotation names, ``int | None`` an optional int, else an optional
    str). ``docs`` gives a line per key; otherwise the doc names the parameter it sets."""
    if isinstance(component, Declared):
        return component.section()
    title = getattr(component, "__name__", None) or getattr(getattr(component, "func", None), "__name__", "")
    keys: dict[str, Key] = {}
    for param in inspect.signature(component).parameters.values():
        variadic = param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        if param.name in skip or param.default is inspect.Parameter.empty or variadic:
            continue
        default = tuple(param.default) if isinstance(param.default, list) else param.default
        kind = _annotated_kind(param.annotation) if default is None else None
        line = (docs or {}).get(param.name) or f"argument {param.name!r} of {title}"
        optional = default is None or "None" in str(param.annotation)
        keys[param.name] = Key(default, line, kind=kind, optional=optional)
    return Section(doc, keys)


# --- describing -------------------------------------------------------------------------------
def describe(section: Section, config: ml_collections.ConfigDict, path: str = "") -> str:
    """The resolved schema as text: one line per key with its value, kind, default and doc."""
    lines: list[str] = []
    _describe(section, config, path, lines, 0)
    return "\n".join(lines) + "\n"


def _describe(section: Section, config: Any, path: str, lines: list[str], depth: int) -> None:
    indent = "  " * depth
    for name, spec in section.keys.items():
        where = f"{path}.{name}" if path else name
        if isinstance(spec, Section):
            lines.append(f"{indent}{where}: {spec.doc}")
            _describe(spec, config[name], where, lines, depth + 1)
            continue
        value = config[name]
        note = "" if value == spec.default else f" (default {spec.default!r})"
        lines.append(f"{indent}{where} = {value!r}{note}  [{spec.type_name}] {spec.doc}")


__all__ = [
    "ConfigError",
    "Declared",
    "Key",
    "Section",
    "describe",
    "resolve",
    "section_from_signature",
    "unknown_key",
]

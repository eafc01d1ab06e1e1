"""``config.dataset``: the registered source a run reads, the global batch size, and the
source's own options (the keyword arguments of its registered factory, e.g. ``resolution`` and
``data_dir`` for a tfds data set)."""

from __future__ import annotations

from dew.schema import Key, Section, at_least, section_from_signature


def _source_options(name: str) -> Section:
    from dew import registry

    return section_from_signature(registry.datasets[name], "the source's options")


CONFIG = Section(
    "the data a run trains on (split 'train') and evaluates on (split 'validation')",
    {
        "name": Key("digits", "registered dataset (dew.datasets)", registry="datasets"),
        "batch_size": Key(64, "examples per step over all processes", **at_least(1, "an int >= 1")),
    },
    extend=_source_options,
)

__all__ = ["CONFIG"]

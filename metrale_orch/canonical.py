"""The canonical JSON text of a plan's signature parts (pure): one home for its encoding.

Sorted keys, no spaces, ASCII only, values JSON cannot hold encoded by ``str``:
equal values give equal text in every process and checkout. A list's text is
``"[" + ",".join(item texts) + "]"``, so a part made of items that recur across
targets (module plans) can be encoded once per item (:func:`canonical_list`).

What people read (the command line's JSON output, the cache's stats, the installed
defaults, the compilation database) is :func:`readable_json`: sorted keys, indented.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from json.encoder import encode_basestring_ascii as _quoted

__all__ = [
    "canonical_encoder",
    "canonical_json",
    "canonical_lines",
    "canonical_list",
    "canonical_strings",
    "readable_json",
]


def canonical_json(value: object) -> str:
    """``value`` as canonical JSON text (pure)."""
    return canonical_encoder().encode(value)


def canonical_lines(values: Iterable[object]) -> list[str]:
    """:func:`canonical_json` of each of ``values`` (pure), through one encoder: setting
    one up costs more than encoding a small object (a big build's profile has ~34,000
    events)."""
    encode = canonical_encoder().encode
    return [encode(value) for value in values]


def canonical_encoder() -> json.JSONEncoder:
    """The canonical encoding: sorted keys, no spaces, ASCII, ``str`` for the rest."""
    return json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=True)


def readable_json(value: object) -> str:
    """``value`` as JSON text for people (pure): sorted keys, two-space indent, ASCII."""
    return json.dumps(value, indent=2, sort_keys=True)


def canonical_list(item_texts: Iterable[str]) -> str:
    """The canonical JSON text of a list, from its items' canonical texts (pure):
    ``canonical_json(items) == canonical_list(canonical_json(i) for i in items)``."""
    return "[" + ",".join(item_texts) + "]"


def canonical_strings(value: Mapping[str, str | Sequence[str]]) -> str:
    """:func:`canonical_json` of a mapping whose values are strings or sequences of
    strings (pure): the same text, built without setting up json's encoder, which costs
    more than encoding a small mapping (a cold generation of the real-shaped tree
    encodes ~2,600 module plans). Anything else is left to :func:`canonical_json`."""
    try:
        fields = [
            _quoted(key) + ":" + (_quoted(item) if isinstance(item, str) else _quoted_list(item))
            for key, item in sorted(value.items())
        ]
    except TypeError:  # a key or an item that is not a string
        return canonical_json(value)
    return "{" + ",".join(fields) + "}"


def _quoted_list(items: object) -> str:
    if not isinstance(items, list | tuple):  # a mapping or a set is canonical_json's
        raise TypeError(type(items).__name__)
    return "[" + ",".join(map(_quoted, items)) + "]"

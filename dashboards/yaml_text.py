"""A small, deterministic YAML writer for the provisioning files.

Grafana reads provisioning files as YAML; the runtime needs no YAML library for
writing them. Mappings and lists are written in block style, keys in the order
given, and every string as a double-quoted JSON string (a JSON string is a
valid YAML double-quoted scalar), so no value can be misread as a number, a
boolean or a comment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

Scalar = str | int | float | bool | None


def _scalar(value: Scalar) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as a YAML scalar")


def _key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"YAML mapping keys must be strings, got {key!r}")
    plain = key.replace("_", "").replace("-", "").replace(".", "").isalnum() and not key[0].isdigit()
    return key if plain else json.dumps(key)


def _is_empty_container(value: object) -> bool:
    return isinstance(value, (Mapping, list, tuple)) and not value


def _lines(value: object, indent: int) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    if isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(v, (Mapping, list, tuple)) and not _is_empty_container(v):
                out.append(f"{pad}{_key(k)}:")
                out.extend(_lines(v, indent + 2))
            else:
                out.append(f"{pad}{_key(k)}: {_inline(v)}")
        return out
    if isinstance(value, Sequence) and not isinstance(value, str):
        for item in value:
            if isinstance(item, (Mapping, list, tuple)) and not _is_empty_container(item):
                sub = _lines(item, indent + 2)
                out.append(f"{pad}- {sub[0].lstrip()}")
                out.extend(sub[1:])
            else:
                out.append(f"{pad}- {_inline(item)}")
        return out
    return [pad + _scalar(value)]  # type: ignore[arg-type]


def _inline(value: object) -> str:
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, (list, tuple)):
        return "[]"
    return _scalar(value)  # type: ignore[arg-type]


def dump_yaml(document: Mapping[str, object], header: str = "") -> str:
    """``document`` as YAML text, with ``header`` lines written as ``#`` comments first."""
    comments = [f"# {line}".rstrip() for line in header.splitlines()]
    return "\n".join([*comments, *_lines(document, 0)]) + "\n"

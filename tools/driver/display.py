"""Property values and diffs printed the way `pulumi preview --diff` prints them.

Reproduces the CLI's property printer (pkg/backend/display/object_diff.go, read at pulumi/pulumi 1b5949891b):
nested objects and arrays are expanded one leaf per line, keys justified to the longest key of their object,
four spaces per level; in a diff every changed leaf carries its own mark (`+` added, `-` removed, `~` changed,
`old => new` for primitives), unchanged leaves are printed without a mark; unknowns print as `[unknown]`, secrets
as `[secret]`, null as `<null>`, whole numbers without a fraction. Keys starting with `__` (the dynamic provider's
`__provider`) are internal and never shown (resource.IsInternalPropertyKey). Not reproduced: colours, the
character-level diff of two single-line strings (shown here as `"old" => "new"`) and asset/archive values.

Usage::

    lines = print_object({"host": {"address": "10.0.0.5", "port": 22}}, indent=2)
    lines = print_object_diff(old_inputs, new_inputs, indent=2)
"""

from __future__ import annotations

import json
import math
from typing import Any

from tools.driver.values import RESOURCE_SIG, SIG, UNKNOWN
from tools.driver.values import is_secret as _is_secret
from tools.driver.values import norm as _norm

_MISSING = object()


def _is_resource(v: Any) -> bool:
    return isinstance(v, dict) and v.get(SIG) == RESOURCE_SIG


def _primitive(v: Any) -> bool:
    return v is None or isinstance(v, (str, bool, int, float)) or _is_secret(v)


def _internal(k: str) -> bool:
    return k.startswith("__")


def primitive(v: Any) -> str:
    """One primitive value as the CLI prints it (printPrimitivePropertyValue)."""
    if v is None:
        return "<null>"
    if v == UNKNOWN:
        return "[unknown]"
    if _is_secret(v):
        return "[secret]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        f = float(v)
        return f"{f:.0f}" if math.isfinite(f) and math.trunc(f) == f else f"{f:g}"
    return json.dumps(v, ensure_ascii=False)


def _pad(indent: int, mark: str) -> str:
    # getIndentationString: four spaces a level; a prefixed line puts its two-character mark in the last two.
    s = "    " * indent
    return s[:-2] + f"{mark:<2}" if mark and len(s) >= 2 else s


def _value(v: Any, indent: int, mark: str, title: str) -> list[str]:
    """printPropertyValue: `title` already carries the indentation and mark; nested lines follow at indent+1."""
    if _primitive(v):
        return [title + primitive(v)]
    if _is_resource(v):
        v = {k: x for k, x in v.items() if k != SIG}
    if isinstance(v, list):
        if not v:
            return [title + "[]"]
        out = [title + "["]
        for i, x in enumerate(v):
            out += _value(x, indent + 1, mark, _pad(indent + 1, mark) + f"[{i}]: ")
        return out + [_pad(indent, "") + "]"]
    if isinstance(v, dict):
        keys = sorted(k for k in v if not _internal(k))
        if not keys:
            return [title + "{}"]
        return [title + "{"] + _object(v, indent + 1, mark) + [_pad(indent, "") + "}"]
    return [title + primitive(str(v))]


def _object(props: dict, indent: int, mark: str) -> list[str]:
    keys = sorted(k for k in props if not _internal(k))
    # printObject justifies on every key, internal ones included, though it prints only the others.
    width = max((len(k) for k in props), default=0)
    out: list[str] = []
    for k in keys:
        out += _value(props[k], indent, mark, _pad(indent, mark) + f"{k:<{width}}: ")
    return out


def print_object(props: dict, indent: int = 2, mark: str = "") -> list[str]:
    """Every property of a resource; the CLI prints a create's or a delete's without marks (only coloured)."""
    return _object(props, indent, mark)


def _worth_showing(v: Any) -> bool:
    # shouldPrintPropertyValue: nulls, empty strings, empty arrays and objects are left out of a diff's sides.
    return not (v is None or v == "" or v == [] or v == {})


def _value_diff(old: Any, new: Any, indent: int, title: str, same_title: str) -> list[str]:
    """printPropertyValueDiff: arrays and objects are compared element by element, primitives as `old => new`."""
    if _norm(old) == _norm(new):
        return _value(new, indent, "", same_title)
    both_objects = isinstance(old, dict) and isinstance(new, dict) and not _is_secret(old) and not _is_secret(new)
    if both_objects:
        return [title + "{"] + _diff(old, new, indent + 1) + [_pad(indent, "") + "}"]
    if isinstance(old, list) and isinstance(new, list):
        out = [title + "["]
        for i in range(max(len(old), len(new))):
            t = _pad(indent + 1, "~") + f"[{i}]: "
            if i >= len(old):
                out += _value(new[i], indent + 1, "+", _pad(indent + 1, "+") + f"[{i}]: ")
            elif i >= len(new):
                out += _value(old[i], indent + 1, "-", _pad(indent + 1, "-") + f"[{i}]: ")
            else:
                out += _value_diff(old[i], new[i], indent + 1, t, _pad(indent + 1, "") + f"[{i}]: ")
        return out + [_pad(indent, "") + "]"]
    show_old, show_new = _worth_showing(old), _worth_showing(new)
    if show_old and show_new and _primitive(old) and _primitive(new):
        return [title + f"{primitive(old)} => {primitive(new)}"]
    out = []
    bare = title[len(_pad(indent, "~")) :]
    if show_old:
        out += _value(old, indent, "-", _pad(indent, "-") + bare)
    if show_new:
        out += _value(new, indent, "+", _pad(indent, "+") + bare)
    return out


def _diff(old: dict, new: dict, indent: int) -> list[str]:
    keys = sorted(k for k in set(old) | set(new) if not _internal(k))
    width = max((len(k) for k in keys), default=0)
    out: list[str] = []
    for k in keys:
        o, n = old.get(k, _MISSING), new.get(k, _MISSING)
        name = f"{k:<{width}}: "
        if o is _MISSING:
            lines = _value(n, indent, "+", _pad(indent, "+") + name)
        elif n is _MISSING:
            lines = _value(o, indent, "-", _pad(indent, "-") + name)
        elif _norm(o) == _norm(n):
            if not _worth_showing(n):
                continue
            lines = _value(n, indent, "", _pad(indent, "") + name)
        else:
            lines = _value_diff(o, n, indent, _pad(indent, "~") + name, _pad(indent, "") + name)
        out += lines
    return out


def print_object_diff(old: dict, new: dict, indent: int = 2) -> list[str]:
    """The diff of a resource's old and new inputs (printOldNewDiffs), unchanged keys included, unmarked."""
    return _diff(old, new, indent)

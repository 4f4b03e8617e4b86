"""Which metrics a PromQL expression reads, and Grafana variable expansion for checking dashboard queries.

Usage::

    metric_names('sum by (model) (rate(nv_inference_count{model=~"$model"}[$__rate_interval]))')
    # -> {"nv_inference_count"}
    expand_grafana('rate(x{host=~"$host"}[$__rate_interval])')
    # -> 'rate(x{host=~".*"}[1m])'

This is a lexer, not a parser: parse errors are left to Prometheus itself (promtool / the query API), which the tests
run on every expression. The lexer only has to find the selectors' metric names: an identifier that is not a
keyword, not a function call, not inside `{...}` / `[...]` / a string, and not a `by (...)`-style label list.
"""

from __future__ import annotations

import re

_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = _GROUPING | {"bool", "offset", "and", "or", "unless", "atan2", "inf", "nan", "start", "end"}
_IDENT_START = re.compile(r"[A-Za-z_:]")
_IDENT = re.compile(r"[A-Za-z0-9_:]*")


class PromQLLexError(ValueError):
    pass


def _skip_string(s: str, i: int) -> int:
    quote = s[i]
    i += 1
    while i < len(s):
        if s[i] == "\\" and quote != "`":
            i += 2
            continue
        if s[i] == quote:
            return i + 1
        i += 1
    raise PromQLLexError(f"unterminated string in {s!r}")


def _skip_group(s: str, i: int, open_: str, close: str) -> tuple[int, str]:
    """From s[i] == open_, return the index after the matching close and the text inside."""
    depth = 0
    start = i
    while i < len(s):
        c = s[i]
        if c in "\"'`":
            i = _skip_string(s, i)
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1, s[start + 1 : i]
        i += 1
    raise PromQLLexError(f"unbalanced {open_}{close} in {s!r}")


def _next_nonspace(s: str, i: int) -> int:
    while i < len(s) and s[i].isspace():
        i += 1
    return i


def metric_names(expr: str) -> set[str]:
    names: set[str] = set()
    s = expr
    i = 0
    while i < len(s):
        c = s[i]
        if c.isspace():
            i += 1
        elif c in "\"'`":
            i = _skip_string(s, i)
        elif c == "{":
            i, inner = _skip_group(s, i, "{", "}")
            if "__name__" in inner:
                raise PromQLLexError(f"__name__ matchers are not supported here: {expr!r}")
        elif c == "[":
            i, _ = _skip_group(s, i, "[", "]")
        elif c == "$":
            m = re.compile(r"\$(\{[^}]*\}|[A-Za-z0-9_]+)").match(s, i)
            i = m.end() if m else i + 1
        elif c.isdigit() or (c == "." and i + 1 < len(s) and s[i + 1].isdigit()):
            m = re.compile(r"[0-9.]+([eE][+-]?[0-9]+)?[A-Za-z0-9_]*").match(s, i)
            assert m is not None  # s[i] is a digit or ".digit": the pattern matches at least that
            i = m.end()
        elif _IDENT_START.match(c):
            m = _IDENT.match(s, i + 1)
            assert m is not None  # _IDENT matches the empty string too
            word = s[i : m.end()]
            i = m.end()
            j = _next_nonspace(s, i)
            nxt = s[j] if j < len(s) else ""
            if word.lower() in _KEYWORDS:
                if word in _GROUPING and nxt == "(":
                    i, _ = _skip_group(s, j, "(", ")")
                continue
            if nxt == "(":
                continue  # a function or aggregation
            if re.compile(r"(by|without)\s*\(").match(s, j):
                continue  # an aggregation written `sum by (x) (...)`
            names.add(word)
        else:
            i += 1
    return names


def expand_grafana(expr: str, values: dict[str, str] | None = None, rate_interval: str = "1m") -> str:
    """Replace Grafana's template variables so Prometheus can run the query: `$x` -> values[x] or `.*`."""
    values = values or {}
    out = expr.replace("$__rate_interval", rate_interval).replace("$__interval", rate_interval)
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: values.get(m.group(1), ".*"), out)


def unexported(exprs: "list[str] | tuple[str, ...]", exported: "set[str] | frozenset[str]") -> dict[str, set[str]]:
    """Expression -> the metric names it reads that are not in `exported` (empty dict: every metric exists)."""
    out: dict[str, set[str]] = {}
    for e in exprs:
        missing = metric_names(e) - set(exported)
        if missing:
            out[e] = missing
    return out

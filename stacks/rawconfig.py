"""The stack config as text and plain values, checked before any model sees it: size, depth and characters.

The models (`stacks.schema`) check what each field means; this module checks what every field is made of, once for
all of them, so a new field cannot forget it:

- nesting at most `MAX_DEPTH` levels and at most `MAX_VALUES` values (aliases counted expanded), so a config nested
  thousands deep or a YAML alias bomb is one line, not a RecursionError or a run that never ends;
- no control character in any string, key or value: C0 (tab and line breaks included), DEL, C1, the Unicode line
  and paragraph separators, bidi controls and lone surrogates. No field needs one (multi-line values such as keys
  live in secret config), and each of them can end a line in a file gpuhost writes, a known_hosts entry, a log line
  or a terminal, or show a reader something other than what a tool gets.

Usage (in `stacks.load`)::

    fleet = fleet_json(config.get("fleet"))     # ConfigError: not JSON, or nested too deep
    lines, bad = value_problems(fleet)         # ConfigError when too deep or too big; lines per bad string
    doc = load_yaml(path.read_text(), "Pulumi.dev.yaml")  # a stack file, refused before it is built
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import yaml

from stacks.errors import ConfigError

MAX_DEPTH = 20  # levels of lists and maps in gpuhost:fleet (the stacks use 6)
MAX_VALUES = 100_000  # values in gpuhost:fleet, aliases expanded (hk-prod has about 400)
FILE_DEPTH = MAX_DEPTH + 2  # a stack file holds the fleet under config: gpuhost:fleet:

# Unicode bidi controls (Trojan Source), the line and paragraph separators, C0, DEL, C1 and lone surrogates.
BAD_CHAR_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMES = {0: "NUL", 9: "tab", 10: "line break", 13: "carriage return", 0x1B: "ESC", 0x7F: "DEL"}
_NAMES |= {0x2028: "line separator", 0x2029: "paragraph separator"}
_FIX = {
    "host_key": "a pin is one line: the key `ssh-keyscan -t ed25519 HOST` prints ('ssh-ed25519 AAAA...') or its "
    "'SHA256:...' fingerprint",
    "url": "percent-encode them (e.g. %1B)",
}
_FIX_DEFAULT = "config values are printable text on one line: remove them"


def char_name(c: str) -> str:
    """>>> char_name("\\x1b")
    'U+001B ESC'
    """
    n = _NAMES.get(ord(c))
    n = n or ("bidi control" if 0x200E <= ord(c) <= 0x2069 or ord(c) == 0x61C else None)
    n = n or ("lone surrogate" if 0xD800 <= ord(c) <= 0xDFFF else None)
    return f"U+{ord(c):04X}" + (f" {n}" if n else "")


def visible(text: str) -> str:
    """`text` with every refused character written as an escape, for a message that quotes a value.

    >>> visible("a\\nb")
    'a\\\\nb'
    """
    return BAD_CHAR_RE.sub(lambda m: json.dumps(m.group())[1:-1], text)


def path_of(loc: tuple) -> str:
    """A config path ("fleet.hosts[0].ssh"); a key that is not a plain word is quoted, escapes visible."""
    out = "fleet"
    for p in loc:
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and re.fullmatch(r"[A-Za-z0-9_.:/-]+", p):
            out += f".{p}"
        else:
            out += f"[{visible(json.dumps(p, ensure_ascii=False))}]"
    return out


def _chars_line(where: str, s: str, field: str, key: bool) -> str:
    first: dict[str, int] = {}
    for m in BAD_CHAR_RE.finditer(s):
        first.setdefault(m.group(), m.start())
    shown = [f"{char_name(c)} at character {i}" for c, i in list(first.items())[:3]]
    more = f" and {len(first) - 3} more" if len(first) > 3 else ""
    fix = _FIX_DEFAULT if key else _FIX.get(field, _FIX_DEFAULT)
    what = f"key {visible(json.dumps(s, ensure_ascii=False))}" if key else "value"
    some = "control characters" if len(first) > 1 else "a control character"
    return f"{where}: {what} holds {some} ({', '.join(shown)}{more}); {fix}"


def value_problems(raw: Any) -> tuple[list[str], list[tuple]]:
    """One line per string (key or value) holding a refused character, and their config locations.

    Walks without recursion; raises ConfigError (one line) for nesting deeper than MAX_DEPTH or more than
    MAX_VALUES values (shared values counted each time they appear), before looking further.
    """
    lines: list[str] = []
    bad: list[tuple] = []
    todo: list[tuple[Any, tuple]] = [(raw, ())]
    seen = 0
    while todo:
        v, loc = todo.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise ConfigError(
                [f"gpuhost:fleet: more than {MAX_VALUES} values (a stack has hundreds; YAML aliases count each time "
                 "they are used): write the config out without repeating it"]
            )  # fmt: skip
        if len(loc) > MAX_DEPTH:
            shown = path_of(loc[:6]) + ("..." if len(loc) > 6 else "")
            raise ConfigError(
                [f"gpuhost:fleet: nested more than {MAX_DEPTH} levels deep (at {shown}); a stack config is a few "
                 "levels deep (hosts[].vms[].gpus[]): remove the extra nesting"]
            )  # fmt: skip
        if isinstance(v, dict):
            items = list(v.items())
            keys_bad = [k for k, _ in items if isinstance(k, str) and BAD_CHAR_RE.search(k)]
            lines += [_chars_line(path_of(loc), k, "", key=True) for k in keys_bad]
            bad += [(*loc, k) for k in keys_bad]
            todo += [(x, (*loc, k)) for k, x in reversed(items) if k not in keys_bad]
        elif isinstance(v, list):
            todo += [(x, (*loc, i)) for i, x in reversed(list(enumerate(v)))]
        elif isinstance(v, str) and BAD_CHAR_RE.search(v) and "PRIVATE KEY-----" not in v:
            # (a private key has its own line: it belongs in secret config)
            field = next((p for p in reversed(loc) if isinstance(p, str)), "")
            lines.append(_chars_line(path_of(loc), v, field, key=False))
            bad.append(loc)
    return lines, bad


def scrubbed(raw: Any, locs: list[tuple]) -> tuple[Any, tuple[tuple, ...]]:
    """A copy of `raw` without the refused characters, for the models to check the rest, and the locations whose
    model errors are noise now (the refused ones, and a refused key under its name without them). No model message
    can then quote a control character, and none reports the field a second time."""
    if not locs:
        return raw, ()
    doc = copy.deepcopy(raw)
    quiet = list(locs)
    for loc in locs:
        parent = doc
        for p in loc[:-1]:
            parent = parent[p]
        last = loc[-1]
        if isinstance(last, str) and BAD_CHAR_RE.search(last):
            clean = BAD_CHAR_RE.sub("", last)
            value = parent.pop(last)
            parent.setdefault(clean, value)  # the field as meant, so its siblings' checks do not call it missing
            quiet.append((*loc[:-1], clean))
        else:
            parent[last] = BAD_CHAR_RE.sub("", parent[last])
    return doc, tuple(quiet)


def fleet_json(text: Any) -> Any:
    """`gpuhost:fleet` as Pulumi hands it over (JSON text) to plain values; ConfigError when it is not JSON or is
    nested deeper than the JSON reader goes (`value_problems` then holds it to MAX_DEPTH)."""
    if text is None or not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except RecursionError:
        raise ConfigError(
            [f"gpuhost:fleet: nested more than {MAX_DEPTH} levels deep; a stack config is a few levels deep "
             "(hosts[].vms[].gpus[]): remove the extra nesting"]
        ) from None  # fmt: skip
    except ValueError as e:
        raise ConfigError([f"gpuhost:fleet: not structured config ({e}); write it as YAML maps and lists"]) from None


def load_yaml(text: str, what: str) -> Any:
    """A stack file's YAML as plain values, refused before it is built (ConfigError, one line naming `what`) when
    it nests deeper than FILE_DEPTH, its aliases expand past MAX_VALUES values (a billion-laughs bomb is a few
    hundred bytes), or an alias names a collection that holds it.

    The check reads the parser's events (PyYAML's parser keeps its own stack; its composer recurses), counting
    each anchored node's expanded size once, so it takes time linear in the text.
    """
    sizes: dict[str, int] = {}
    open_: list[list[Any]] = []  # per open collection: [anchor, expanded size so far]
    total = 0

    def refuse(ev: yaml.Event, why: str) -> ConfigError:
        return ConfigError([f"{what}: line {ev.start_mark.line + 1}: {why}"])

    try:
        for ev in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(ev, yaml.CollectionStartEvent):
                if len(open_) >= FILE_DEPTH:
                    raise refuse(ev, f"nested more than {FILE_DEPTH} levels deep; remove the extra nesting")
                open_.append([ev.anchor, 1])
                continue
            if isinstance(ev, yaml.ScalarEvent):
                anchor, n = ev.anchor, 1
            elif isinstance(ev, yaml.AliasEvent):
                if ev.anchor not in sizes:
                    inside = any(o[0] == ev.anchor for o in open_)
                    raise refuse(
                        ev,
                        f"alias *{visible(str(ev.anchor))} "
                        + ("is inside the collection it names" if inside else "names no anchor before it"),
                    )
                anchor, n = None, sizes[ev.anchor]
            elif isinstance(ev, yaml.CollectionEndEvent):
                anchor, n = open_.pop()
            else:
                continue
            if anchor is not None:
                sizes[anchor] = n
            if open_:
                open_[-1][1] += n
                n = open_[-1][1]
            else:
                total += n
                n = total
            if n > MAX_VALUES:
                raise refuse(
                    ev,
                    f"aliases expand to more than {MAX_VALUES} values (a YAML alias bomb); write the values out",
                )
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or "not YAML"
        raise ConfigError([f"{what}: {at}{visible(str(problem))}"]) from None

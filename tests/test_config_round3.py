"""Stack config, round 3 (issue 38 §4): the characters, depth and size checks hold for every field, not the examples.

The table of single bad configs (one exact line each, 0 resources) is tests/test_bad_input.py's BAD_ROUND3; here
hypothesis puts a refused character into any string of a loadable fleet (a key or a value, at any position) and
checks that the loader answers with exactly that field's line; and stack files are read with their alias bombs and
deep nesting refused in linear time.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from stacks.load import ConfigError, parse_fleet
from stacks.rawconfig import BAD_CHAR_RE, MAX_VALUES, char_name, load_yaml, path_of
from tests.test_config_round2 import BASE

ROOT = Path(__file__).resolve().parent.parent


def _strings(v, loc=()):
    """(loc, is_key) of every string in a plain value."""
    if isinstance(v, dict):
        for k, x in v.items():
            yield (*loc, k), True
            yield from _strings(x, (*loc, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _strings(x, (*loc, i))
    elif isinstance(v, str):
        yield loc, False


STRINGS = list(_strings(BASE))
BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
REFUSED = st.one_of(
    st.characters(min_codepoint=0, max_codepoint=0x1F),
    st.characters(min_codepoint=0x7F, max_codepoint=0x9F),
    st.sampled_from(BIDI + "\u2028\u2029\ud800\udfff"),
)


def _with(doc: Any, loc: tuple, is_key: bool, at: int, c: str) -> Any:
    """`doc` with `c` put into the string at `loc` (its key when `is_key`), before character `at`."""
    parent = doc
    for p in loc[:-1]:
        parent = parent[p]
    if is_key:
        k = loc[-1]
        new = k[: at % (len(k) + 1)] + c + k[at % (len(k) + 1) :]
        parent[new] = parent.pop(k)
        return new
    s = parent[loc[-1]]
    parent[loc[-1]] = s[: at % (len(s) + 1)] + c + s[at % (len(s) + 1) :]
    return None


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(STRINGS), REFUSED, st.integers(min_value=0, max_value=200))
def test_a_refused_character_anywhere_is_that_fields_one_line(where, c, at):
    loc, is_key = where
    doc = copy.deepcopy(BASE)
    new_key = _with(doc, loc, is_key, at, c)
    with pytest.raises(ConfigError) as e:
        parse_fleet(json.loads(json.dumps(doc)))
    path = path_of(loc[:-1] if is_key else loc)
    what = f"key {json.dumps(new_key, ensure_ascii=True)}" if is_key else "value"
    assert len(e.value.lines) == 1, e.value.lines
    line = e.value.lines[0]
    assert line.startswith(f"{path}: {what} holds a control character ({char_name(c)} at character "), line
    # no line carries a refused character itself
    assert not BAD_CHAR_RE.search(line)


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters=BIDI), max_size=20))
def test_printable_text_is_never_called_a_control_character(text):
    doc: Any = copy.deepcopy(BASE)
    doc["services"][0]["models"][0]["name"] = text
    doc["hosts"][0]["ssh"]["user"] = text
    try:
        parse_fleet(json.loads(json.dumps(doc)))
    except ConfigError as e:
        assert not any("control character" in ln for ln in e.lines), e.lines


def test_shared_values_count_each_time_they_appear():
    """An alias bomb already built (PyYAML keeps aliases as shared objects): refused after MAX_VALUES, quickly."""
    lol: Any = ["lol"] * 10
    for _ in range(8):
        lol = [lol] * 10
    doc = copy.deepcopy(BASE)
    doc["hosts"][0]["labels"] = lol
    with pytest.raises(ConfigError) as e:  # walked lazily: 10^9 values would not finish at all otherwise
        parse_fleet(doc)
    assert e.value.lines == [
        f"gpuhost:fleet: more than {MAX_VALUES} values (a stack has hundreds; YAML aliases count each time they are "
        "used): write the config out without repeating it"
    ]


def _bomb(levels: int, fan: int, mapping: bool = False) -> str:
    text = "config:\n  a0: &a0 [" + ", ".join(['"lol"'] * fan) + "]\n"
    for i in range(1, levels):
        refs = [f"*a{i - 1}"] * fan
        body = (
            "{" + ", ".join(f"k{j}: {r}" for j, r in enumerate(refs)) + "}" if mapping else "[" + ", ".join(refs) + "]"
        )
        text += f"  a{i}: &a{i} {body}\n"
    return text


@pytest.mark.parametrize(
    "text, line",
    [
        (_bomb(9, 10), "line 6: aliases expand to more than 100000 values (a YAML alias bomb); write the values out"),
        (
            _bomb(30, 2, mapping=True),
            "line 16: aliases expand to more than 100000 values (a YAML alias bomb); write the values out",
        ),
        (
            "config:\n  x: " + "[" * 50_000 + "]" * 50_000 + "\n",
            "line 2: nested more than 22 levels deep; remove the extra nesting",
        ),
        (
            "config:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(40)),
            "line 23: nested more than 22 levels deep; remove the extra nesting",
        ),
        ("config:\n  a: &a [1, *a]\n", "line 2: alias *a is inside the collection it names"),
        ("config:\n  a: *nowhere\n", "line 2: alias *nowhere names no anchor before it"),
    ],
    ids=["billion laughs", "mapping bomb", "flow nesting", "block nesting", "recursive alias", "unknown alias"],
)
def test_stack_file_bombs_and_depth_are_one_line_before_they_are_built(text, line):
    """Refused from the parser's events (a bomb would take minutes and gigabytes once built; no timing asserted)."""
    with pytest.raises(ConfigError) as e:
        load_yaml(text, "Pulumi.x.yaml")
    assert e.value.lines == [f"Pulumi.x.yaml: {line}"]


def test_the_drivers_stack_reader_refuses_a_bomb_with_the_loaders_line(tmp_path):
    """``./gpuhost.sh up`` reads Pulumi.<stack>.yaml itself (tools/driver/config.py): the same line, nothing built."""
    from tools.driver.config import StackConfig

    (tmp_path / "Pulumi.x.yaml").write_text(_bomb(9, 10))
    with pytest.raises(SystemExit) as e:
        StackConfig.load(tmp_path, "x", None)
    assert str(e.value) == (
        "Pulumi.x.yaml: line 6: aliases expand to more than 100000 values (a YAML alias bomb); write the values out"
    )


def test_stack_files_read_as_before_and_small_aliases_still_work():
    for stack in ("dev", "hk-prod"):
        text = (ROOT / f"Pulumi.{stack}.yaml").read_text()
        assert load_yaml(text, stack) == yaml.safe_load(text)
    doc = load_yaml("config:\n  a: &gpu {model: L40S}\n  b: [*gpu, *gpu]\n", "x")
    assert doc == {"config": {"a": {"model": "L40S"}, "b": [{"model": "L40S"}, {"model": "L40S"}]}}


@pytest.mark.parametrize(
    ("edit", "lines"),
    [
        (
            lambda d: d["hosts"][0]["ssh"].__setitem__("address", "10.0.0.1 ; rm"),
            [
                "fleet.hosts[0].ssh.address: address '10.0.0.1 ; rm' is neither an IP address nor a DNS host name "
                "(letters, digits, '-' and '.')"
            ],
        ),
        (
            lambda d: d["hosts"][0]["gpus"][0].__setitem__("functions", [0, 0]),
            [
                "fleet.hosts[0].gpus[0].functions: functions [0, 0]: distinct PCI function numbers 0-7, e.g. [0] or [0, 1]"
            ],
        ),
        (
            lambda d: d["hosts"][0].setdefault("tuning", {}).__setitem__("sysctls", {"a.b": "$(id)", "bad name!": "1"}),
            [
                "fleet.hosts[0].tuning.sysctls: sysctl value '$(id)' may hold only letters, digits, spaces and "
                "_ . , : / + -",
                "fleet.hosts[0].tuning.sysctls: sysctl name 'bad name!' may hold only dotted names like "
                "net.core.somaxconn (letters, digits, _ and -)",
            ],
        ),
    ],
    ids=["a quoted value holding '; '", "a message holding ': '", "two bad sysctls"],
)
def test_a_validators_message_is_its_fields_line_as_raised(edit, lines):
    """The loader writes what a validator raised at the field's path and reads nothing back from the text (a value
    with '; ' in it was once cut in two); a validator that finds several problems gives each its own line."""
    doc = copy.deepcopy(BASE)
    edit(doc)
    with pytest.raises(ConfigError) as e:
        parse_fleet(json.loads(json.dumps(doc)))
    assert e.value.lines == lines

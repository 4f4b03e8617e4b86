"""The driver's outcome prints property values as `pulumi preview --diff` does (tools/driver/display.py), pure."""

from __future__ import annotations

from tools.driver.display import primitive, print_object, print_object_diff
from tools.driver.engine import Outcome, Step
from tools.driver.values import SECRET_SIG, SIG, UNKNOWN

SECRET = {SIG: SECRET_SIG, "value": "hunter2"}
LONG = "x" * 300

OLD = {
    "__provider": "pickled",
    "host": {"address": "10.0.0.5", "port": 22.0, "user": "root", "key": SECRET, "note": LONG, "args": ["a", "b"]},
    "name": "gpu-a",
    "gone": 1,
}
NEW = {
    "__provider": "pickled-again",
    "host": {"address": "10.0.0.5", "port": 2222, "user": "root", "key": SECRET, "note": LONG, "args": ["a", "c", "d"]},
    "name": UNKNOWN,
    "extra": {"vfs": [1, 2]},
}


def test_a_nested_diff_marks_each_changed_leaf_and_keeps_long_values_whole():
    assert print_object_diff(OLD, NEW, indent=2) == [
        "      + extra: {",
        "          + vfs: [",
        "              + [0]: 1",
        "              + [1]: 2",
        "            ]",
        "        }",
        "      - gone : 1",
        "      ~ host : {",
        '            address: "10.0.0.5"',
        "          ~ args   : [",
        '                [0]: "a"',
        '              ~ [1]: "b" => "c"',
        '              + [2]: "d"',
        "            ]",
        "            key    : [secret]",
        f'            note   : "{LONG}"',
        "          ~ port   : 22 => 2222",
        '            user   : "root"',
        "        }",
        '      ~ name : "gpu-a" => [unknown]',
    ]


def test_a_create_prints_every_property_justified_without_marks_and_never_a_secret():
    lines = print_object(NEW, indent=2)
    # printObject justifies on every key, `__provider` included, and never prints internal keys
    assert lines[0] == "        extra     : {" and not any("__provider" in ln or "pickled" in ln for ln in lines)
    assert "            key    : [secret]" in lines and "hunter2" not in "\n".join(lines)
    assert "        name      : [unknown]" in lines


def test_primitives_as_the_cli_prints_them():
    assert [primitive(v) for v in (None, True, 3.0, 2.5, "s", UNKNOWN, SECRET)] == [
        "<null>",
        "true",
        "3",
        "2.5",
        '"s"',
        "[unknown]",
        "[secret]",
    ]


def test_a_preview_shows_an_update_s_nested_diff_and_its_changed_keys():
    urn = "urn:pulumi:dev::gpuhost::gpuhost:host:Sysctl::gpu-a-sysctls"
    outcome = Outcome(
        "preview", steps=[Step("update", urn, "gpuhost:host:Sysctl", old=OLD, new=NEW, keys=["host", "name"])]
    )
    text = outcome.render()
    assert "  ~  gpuhost:host:Sysctl  gpu-a-sysctls  (update)  [diff: ~host, ~name]" in text
    assert "          ~ port   : 22 => 2222" in text and LONG in text and "hunter2" not in text

"""Conformance of the deployment driver (tools/driver) with the Pulumi engine's semantics, on a pure provider.

The project under tests/fixtures/driver_project is a real Pulumi program whose dynamic provider keeps one file per
resource and logs each call with its start and end time, so order and overlap are observable. Nothing is mocked:
the program runs in its own process against the driver's resource monitor, the provider in `python -m
pulumi.dynamic`, as under the CLI.
"""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tools.driver import Driver, Outcome, StackConfig
from tools.driver.engine import SECRET_SIG, UNKNOWN, is_secret, plain

PROJECT = Path(__file__).resolve().parent / "fixtures" / "driver_project"


def calls(d: Path) -> list[tuple[str, str, float, float]]:
    log = d / "calls.log"
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        m, n, a, b = line.split()
        out.append((m, n, float(a), float(b)))
    return out


def driver(tmp: Path, files: list[dict[str, Any]], greeting: str = "hello-secret", stack: str = "t", **shape) -> Driver:
    cfg = StackConfig(
        {
            "drivertest:dir": str(tmp),
            "drivertest:shape": json.dumps({"files": files, **shape}),
            "drivertest:greeting": greeting,
        },
        ["drivertest:greeting"],
    )
    state = tmp / ("state.json" if stack == "t" else f"{stack}.json")
    return Driver(PROJECT, stack, config=cfg, state=state, passphrase="pw", project="drivertest", out=None)


BASE: list[dict[str, Any]] = [
    {"name": "a", "content": "A", "meet": ["b"], "sleep": 0.2},  # a's create and delete wait for b's to start
    {"name": "b", "content": "B", "meet": ["a"], "sleep": 0.2},
    {"name": "c", "content_from": "a", "after": ["b"]},
]


def test_preview_checks_only_and_shows_unknowns(tmp_path):
    outcome = driver(tmp_path, BASE).preview()
    assert not outcome.errors, outcome.errors
    assert outcome.counts() == {"create": 4}  # 3 files + the stack
    c = outcome.step("c")
    # c's content is computed from a's output-only digest: unknown in preview, and shown as such
    assert c.new is not None and c.new["content"] == "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
    assert re.search(r"^ {8}content +: \[unknown\]$", outcome.render(), re.M)  # the CLI's justified key, no mark
    assert calls(tmp_path) == [] and not (tmp_path / "a").exists()  # no Create during preview
    assert not (tmp_path / "state.json").exists()


def test_up_runs_independent_steps_in_parallel_and_dependents_after(tmp_path):
    d = driver(tmp_path, BASE)
    outcome = d.up()
    assert not outcome.errors, outcome.errors
    log = {n: (a, b) for m, n, a, b in calls(tmp_path) if m == "create"}
    assert set(log) == {"a", "b", "c"}
    # a and b overlap (each waits for the other's start); c starts only after both (its input and its depends_on)
    assert log["a"][0] < log["b"][1] and log["b"][0] < log["a"][1]
    assert log["c"][0] >= max(log["a"][1], log["b"][1])
    digest_a = outcome.outputs["a"]
    assert (tmp_path / "c").read_text() == f"digest={digest_a}|hello-secret"  # the secret config reached Configure
    state = (tmp_path / "state.json").read_text()
    assert "hello-secret" not in state and '"secure"' in state  # stored sealed, for refresh/destroy
    again = d.preview()
    assert again.changes() == 0 and not again.errors


def test_refresh_reads_drift_then_up_converges_and_a_vanished_resource_is_dropped(tmp_path):
    d = driver(tmp_path, BASE)
    d.up()
    (tmp_path / "b").write_text("edited by hand|x")
    (tmp_path / "c").unlink()
    outcome = d.refresh()
    assert not outcome.errors, outcome.errors
    drift = {s.name: s for s in outcome.of("refresh")}
    assert set(drift) == {"b"} and drift["b"].keys == ["content"]
    assert [s.name for s in outcome.of("delete")] == ["c"]  # Read returned an empty id
    stored = {r.name: r for r in d.resources()}
    assert "c" not in stored and stored["b"].inputs["content"] == "edited by hand"  # returned inputs replace
    pv = d.preview()
    assert {s.name: s.op for s in pv.steps if s.op != "same"} == {"b": "update", "c": "create"}
    d.up()
    assert (tmp_path / "b").read_text().startswith("B|") and (tmp_path / "c").exists()
    assert d.preview().changes() == 0


def test_delete_before_replace_deletes_the_dependents_that_would_be_replaced_first(tmp_path):
    files: list[dict[str, Any]] = [
        {"name": "a", "content": "A", "dbr": True},
        {"name": "c", "content": "C", "ref_from": "a"},
        {"name": "e", "content": "E", "after": ["a"]},
    ]
    d = driver(tmp_path, files)
    d.up()
    (tmp_path / "calls.log").unlink()
    files[0]["file"] = "a2"  # the file name is a replacing input
    d2 = driver(tmp_path, files)
    pv = d2.preview()
    assert {s.name: s.op for s in pv.steps if s.op != "same"} == {"a": "replace", "c": "replace"}
    assert pv.step("a").replace_keys == ["name"]
    outcome = d2.up()
    assert not outcome.errors, outcome.errors
    order = [(m, n) for m, n, _, _ in calls(tmp_path)]
    # c's `ref` comes from a: with it unknown, c's Diff says replace, so c goes before a; e (depends_on only) stays
    assert order == [("delete", "c"), ("delete", "a"), ("create", "a2"), ("create", "c")]


def test_destroy_goes_in_reverse_dependency_order_in_parallel(tmp_path):
    d = driver(tmp_path, BASE)
    d.up()
    (tmp_path / "calls.log").unlink()
    outcome = d.destroy()
    assert not outcome.errors, outcome.errors
    log = {n: (a, b) for m, n, a, b in calls(tmp_path) if m == "delete"}
    assert log["c"][1] <= min(log["a"][0], log["b"][0])  # c first: it depends on both
    assert log["a"][0] < log["b"][1] and log["b"][0] < log["a"][1]  # a and b together
    assert not any((tmp_path / n).exists() for n in "abc") and d.resources() == []


def test_check_failure_stops_before_any_create(tmp_path):
    outcome = driver(tmp_path, [{"name": "a", "content": "A"}, {"name": "b", "content": "bad", "after": ["a"]}]).up()
    assert any("must not contain 'bad'" in e for e in outcome.errors), outcome.errors
    assert [n for m, n, _, _ in calls(tmp_path) if m == "create"] == ["a"]
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("op", ["refresh", "destroy"])
def test_refresh_and_destroy_configure_the_provider_from_the_config_of_the_last_up(tmp_path, op):
    driver(tmp_path, BASE, greeting="first").up()
    later = driver(tmp_path, BASE, greeting="second")
    if op == "refresh":
        later.refresh()
        # Read returns the file's content as inputs; the greeting written at up is still the first one
        assert (tmp_path / "a").read_text() == "A|first"
        stored = {r.name: r for r in later.resources()}
        assert stored["a"].outputs["digest"]  # kept from the up
    else:
        outcome = later.destroy()
        assert not outcome.errors and later.resources() == []


def reading(tmp: Path) -> tuple[Outcome, Driver]:
    other = driver(tmp, [{"name": "a", "content": "A"}], stack="other").up()
    assert not other.errors, other.errors
    d = driver(
        tmp,
        [{"name": "b", "content": "B"}],
        gets=[{"name": "g", "id": "a"}],  # the other stack's file, read as an external resource
        stackref="organization/drivertest/other",
        lookups=[{"name": "lb", "of": "b"}],  # getResource of b, hydrated by URN
        invokes=[{"name": "inv", "stack": "other", "after": ["b"]}],
    )
    return other, d


def test_reads_stack_references_and_invokes_follow_the_engine(tmp_path):
    other, d = reading(tmp_path)
    pv = d.preview()
    assert not pv.errors, pv.errors
    # ReadStep runs in previews: the read happened, the stack reference resolved; the invoke that depends on a
    # file still to be created is unknown (resourcetracker HasUnresolved), as is b's digest looked up by URN
    assert [m for m, n, _, _ in calls(tmp_path) if n == "a"] == ["create", "read"]
    assert pv.step("g").op == "read" and pv.outputs["g"] == "A"
    assert "  >  pulumi:pulumi:StackReference  ref  (read)" in pv.render()
    assert pv.outputs["ref"] == {"a": other.outputs["a"]}
    assert pv.outputs["inv"] == UNKNOWN and pv.outputs["lb"] == UNKNOWN
    outcome = d.up()
    assert not outcome.errors, outcome.errors
    assert outcome.outputs["inv"] == {"name": "other", "outputs": {"a": other.outputs["a"]}, "secretOutputNames": []}
    assert outcome.outputs["lb"] == outcome.outputs["b"] and outcome.outputs["g"] == "A"
    stored = {r.name: r for r in d.resources()}
    assert stored["g"].external and stored["ref"].external and not stored["b"].external
    assert d.preview().changes() == 0


def test_read_resources_are_refreshed_and_leave_the_state_on_destroy_without_a_delete(tmp_path):
    _, d = reading(tmp_path)
    assert not d.up().errors
    (tmp_path / "a").write_text("A2|by hand")
    ref = d.refresh()  # the stack reference is refreshed by the builtin provider, g by its own
    assert not ref.errors, ref.errors
    # an external resource is not diffed against a desired state: what it reads now is its drift
    assert [s.name for s in ref.of("refresh")] == ["g"] and ref.step("ref").op == "read"
    assert {r.name: r for r in d.resources()}["g"].outputs["content"] == "A2"
    (tmp_path / "calls.log").unlink()
    assert not d.destroy().errors and d.resources() == []
    # external resources leave the state without a Delete: the other stack's file is still there
    assert [(m, n) for m, n, _, _ in calls(tmp_path)] == [("delete", "b")] and (tmp_path / "a").exists()


def test_an_unknown_function_and_a_missing_stack_fail_the_run_clearly(tmp_path):
    outcome = driver(tmp_path, [], invokes=[{"name": "x", "stack": "s", "tok": "pulumi:pulumi:nope"}]).preview()
    assert any("unrecognized function name: 'pulumi:pulumi:nope'" in e for e in outcome.errors), outcome.errors
    outcome = driver(tmp_path, [], stackref="nosuch").preview()
    assert any('unknown stack "nosuch"' in e for e in outcome.errors), outcome.errors


def test_an_unknown_diff_is_the_engine_s_own_comparison_of_the_inputs(tmp_path):
    files = [{"name": "u", "content": "U", "unknown_diff": True}]
    d = driver(tmp_path, files)
    assert not d.up().errors
    assert d.preview().changes() == 0  # DIFF_UNKNOWN with equal inputs: no update (step_generator.go diff)
    files[0]["content"] = "U2"
    d2 = driver(tmp_path, files)
    pv = d2.preview()
    assert pv.step("u").op == "update" and pv.step("u").keys == ["content"]
    (tmp_path / "calls.log").unlink()
    assert not d2.up().errors
    assert [(m, n) for m, n, _, _ in calls(tmp_path)] == [("update", "u")]
    assert (tmp_path / "u").read_text().startswith("U2|")


def _replace_a_under_d(tmp_path: Path, d_content: str) -> tuple[list[dict[str, Any]], Driver, Outcome]:
    """File a and file d that comes after it, up; then a renamed to a2 (a replacement, created before the old a is
    deleted) and d's content set to `d_content`, up again: the files, that driver and its outcome (calls.log holds
    only the second up's calls)."""
    files: list[dict[str, Any]] = [{"name": "a", "content": "A"}, {"name": "d", "content": "D", "after": ["a"]}]
    driver(tmp_path, files).up()
    (tmp_path / "calls.log").unlink()
    files[0]["file"], files[1]["content"] = "a2", d_content
    d = driver(tmp_path, files)
    return files, d, d.up()


def test_create_before_delete_replacement_deletes_the_old_one_at_the_end_of_the_run(tmp_path):
    files, d, outcome = _replace_a_under_d(tmp_path, "D2")
    assert not outcome.errors, outcome.errors
    # the new a first, then what depends on it, the old a last (step_generator.go: pending delete at the end)
    assert [(m, n) for m, n, _, _ in calls(tmp_path)] == [("create", "a2"), ("update", "d"), ("delete", "a")]
    stored = [r for r in d.resources() if r.name == "a"]
    assert len(stored) == 1 and stored[0].inputs["name"] == "a2" and not (tmp_path / "a").exists()


def test_the_old_half_of_a_replacement_outlives_a_failed_run_and_goes_at_the_next_up(tmp_path):
    files, d, outcome = _replace_a_under_d(tmp_path, "please fail")
    assert any("refusing to write d" in e for e in outcome.errors), outcome.errors
    assert [(m, n) for m, n, _, _ in calls(tmp_path)] == [("create", "a2")]  # no delete after a failed step
    halves = sorted((r.inputs["name"], r.pending_delete) for r in d.resources() if r.name == "a")
    assert halves == [("a", True), ("a2", False)] and (tmp_path / "a").exists()
    files[1]["content"] = "D2"
    d = driver(tmp_path, files)
    assert [(s.op, (s.old or {})["name"]) for s in d.preview().of("delete")] == [("delete", "a")]
    assert not d.up().errors
    assert [(m, n) for m, n, _, _ in calls(tmp_path)][1:] == [("update", "d"), ("delete", "a")]
    assert [r.inputs["name"] for r in d.resources() if r.name == "a"] == ["a2"] and not (tmp_path / "a").exists()


FAILING: list[dict[str, Any]] = [
    {"name": "a", "content": "A", "wait_for": ["failed-f"], "sleep": 0.5},  # in flight when f fails
    {"name": "b", "content": "B", "wait_for": ["failed-f"], "sleep": 2},  # done 2 s after f failed
    {"name": "f", "content": "please fail", "meet": ["a", "b"]},  # raises once a and b have started
    {"name": "c", "content": "C", "after": ["f"]},  # depends on f
    {"name": "e", "content": "E", "after": ["b"]},  # independent of f, registered after f failed
]


@pytest.mark.parametrize("continue_on_error", [False, True])
def test_a_failed_step(tmp_path, continue_on_error):
    d = driver(tmp_path, FAILING)
    d.continue_on_error = continue_on_error
    outcome = d.up()
    assert any("refusing to write f" in e for e in outcome.errors), outcome.errors
    created = sorted(n for m, n, _, _ in calls(tmp_path) if m == "create")
    stored = sorted(r.name for r in d.resources() if r.custom)
    if continue_on_error:
        # `up --continue-on-error`: only f's dependents are skipped; independent steps go on, even later ones
        assert created == stored == ["a", "b", "e"]
        assert [s.name for s in outcome.of("skip")] == ["c"]
    else:
        # step_executor.go cancelDueToError: steps in flight finish and are saved, no step starts after
        assert created == stored == ["a", "b"]
    again = driver(tmp_path, [{**f, "content": "F"} if f["name"] == "f" else f for f in FAILING]).up()
    assert not again.errors, again.errors
    assert sorted(r.name for r in d.resources() if r.custom) == ["a", "b", "c", "e", "f"]


def test_program_and_provider_are_launched_and_configured_as_the_engine_does(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "not-the-project"))
    six = [f"p{i}" for i in range(6)]
    # each create waits until four have started, then 2 s: four at once whatever the machine's load
    outcome = driver(tmp_path, [{"name": n, "content": "P", "meet": six, "quorum": 4, "sleep": 2} for n in six]).up()
    assert not outcome.errors, outcome.errors
    prov = json.loads((tmp_path / "provider.json").read_text())
    prog = json.loads((tmp_path / "program.json").read_text())
    # cwd is the project root and imports work through it (fileprov), not through PYTHONPATH, which is dropped
    assert prov["cwd"] == prog["cwd"] == str(PROJECT) and prov["pythonpath"] is None is prog["pythonpath"]
    assert prov["argv0"].endswith("pulumi/dynamic/__main__.py") and prov["project"] == "drivertest"
    # every stack config key reaches Configure as a string (objects JSON-encoded), the secret decrypted
    assert prov["config_types"] == {f"drivertest:{k}": "str" for k in ("dir", "shape", "greeting")}
    assert (tmp_path / "p0").read_text() == "P|hello-secret"
    # the SDK's provider server has 4 worker threads: six independent 2 s creates, at most four at once
    spans = [(a, b) for m, _, a, b in calls(tmp_path) if m == "create"]
    assert len(spans) == 6 and max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans) == 4


def test_parallel_bounds_the_steps_applied_at_once(tmp_path):
    # step_executor.go: DegreeOfParallelism() workers apply the steps (the CLI's --parallel); 1 is one at a time,
    # though the program registers all three at once
    three = [f"q{i}" for i in range(3)]
    d = driver(tmp_path, [{"name": n, "content": "Q", "sleep": 0.5} for n in three])
    d.parallel = 1
    assert not d.up().errors
    spans = sorted((a, b) for m, _, a, b in calls(tmp_path) if m == "create")
    assert len(spans) == 3 and all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans


class Display(io.StringIO):
    """The driver's display, each line kept with the time it was shown; a line containing a key of ``marks`` leaves
    that mark for the fixture provider (its ``wait_for``): a call can wait until the display has shown its line."""

    def __init__(self, marks: dict[str, Path] | None = None) -> None:
        super().__init__()
        self.lines: list[tuple[float, str]] = []
        self.marks = marks or {}

    def write(self, s: str) -> int:
        self.lines += [(time.monotonic(), ln) for ln in s.splitlines() if ln]
        for text, mark in self.marks.items():
            if text in s:
                mark.parent.mkdir(exist_ok=True)
                mark.touch()
        return super().write(s)


def test_what_the_provider_writes_to_stderr_is_shown_as_it_arrives_in_preview_and_up(tmp_path):
    # plugin.go runtrace: each line of the provider plugin's stderr reaches the display as an info of the stack; the
    # progress lines of long steps (providers/progress.py) rely on it
    # a's create says its line, then waits (30 s at most) until the display has shown it
    files = [{"name": "a", "content": "A", "say": "waiting for a: 5 s of 60 s", "wait_for": ["shown-a"]}]
    d = driver(tmp_path, files)
    d.out = Display()
    stack = "     pulumi:pulumi:Stack  drivertest-t  "
    assert not d.preview().errors
    assert (stack + "drivertest: a: check: waiting for a: 5 s of 60 s") in [ln for _, ln in d.out.lines]
    d.out = Display({"a: create: waiting for a": tmp_path / "marks" / "shown-a"})
    t0 = time.monotonic()
    assert not d.up().errors
    shown = {ln: t for t, ln in d.out.lines}
    said = shown[stack + "drivertest: a: create: waiting for a: 5 s of 60 s"]
    created = next((t for ln, t in shown.items() if ":File  a  created" in ln), None)
    assert created, list(shown)
    # shown while the create still ran, not at its end: a driver that showed it only then kept a waiting 30 s
    assert said < created and time.monotonic() - t0 < 25
    assert "info: drivertest: a: create: waiting for a: 5 s of 60 s" in d.logs


def test_secrets_stay_secret_through_the_provider_and_are_encrypted_in_the_state(tmp_path):
    files = [{"name": "s", "secret": True}, {"name": "h", "content": "H", "secret_digest": True}]
    d = driver(tmp_path, files, stack="w")
    pv = d.preview()
    assert not pv.errors and "hello-secret" not in pv.render() and "[secret]" in pv.render()
    outcome = d.up()
    assert not outcome.errors, outcome.errors
    assert (tmp_path / "s").read_text() == "hello-secret|hello-secret"  # the provider got the plain value
    stored = {r.name: r for r in d.resources()}
    # provider_plugin.go annotateSecrets: an output named like a secret input is secret again
    assert is_secret(stored["s"].inputs["content"]) and is_secret(stored["s"].outputs["content"])
    assert stored["s"].inputs["content"]["value"] == "hello-secret"
    # additionalSecretOutputs: h's digest is secret, so is the stack output made from it
    digest = stored["h"].outputs["digest"]
    assert is_secret(digest) and is_secret(outcome.outputs["h"]) and not is_secret(outcome.outputs["s"])
    text = (tmp_path / "w.json").read_text()
    assert "hello-secret" not in text and digest["value"] not in text and '"ciphertext"' in text
    assert d.preview().changes() == 0
    # another stack reading these outputs learns which are secret (builtins.go readStackReference)
    reader = driver(tmp_path, [], stack="reader", invokes=[{"name": "inv", "stack": "w"}]).preview()
    assert not reader.errors, reader.errors
    assert plain(reader.outputs["inv"])["secretOutputNames"] == ["h"] and is_secret(reader.outputs["inv"])
    assert not d.destroy().errors and not (tmp_path / "s").exists()


def test_what_the_program_no_longer_declares_is_deleted_at_the_end_dependents_first(tmp_path):
    files: list[dict[str, Any]] = [
        {"name": "a", "content": "A"},
        {"name": "b", "content": "B"},
        {"name": "c", "content": "C", "after": ["b"]},
    ]
    driver(tmp_path, files).up()
    (tmp_path / "calls.log").unlink()
    d = driver(tmp_path, [{"name": "a", "content": "A2"}])
    pv = d.preview()
    assert sorted((s.op, s.name) for s in pv.steps if s.op != "same") == [
        ("delete", "b"),
        ("delete", "c"),
        ("update", "a"),
    ]
    assert not (tmp_path / "calls.log").exists() and (tmp_path / "b").exists()  # a preview deletes nothing
    outcome = d.up()
    assert not outcome.errors, outcome.errors
    # step_generator.go GenerateDeletes after the program is done; c depends on b, so c goes first
    assert [(m, n) for m, n, _, _ in calls(tmp_path)] == [("update", "a"), ("delete", "c"), ("delete", "b")]
    assert sorted(r.name for r in d.resources() if r.custom) == ["a"]


def test_resource_references_reach_the_provider_as_ids_and_unimplemented_options_are_refused(tmp_path):
    d = driver(tmp_path, [{"name": "a", "content": "A"}, {"name": "r", "content": "R", "ref_resource": "a"}])
    pv = d.preview()
    assert not pv.errors, pv.errors
    assert (pv.step("r").new or {})[
        "ref"
    ] == UNKNOWN  # a's id is not known before it is created (rpc.go, KeepResources off)
    assert not d.up().errors
    assert {r.name: r for r in d.resources()}["r"].inputs["ref"] == "a"  # the provider got a's id
    # source_eval.go says yes to deletedWith; the driver does not implement it, so it says no and the SDK refuses
    outcome = driver(tmp_path, [{"name": "a", "content": "A"}, {"name": "w", "content": "W", "deleted_with": "a"}]).up()
    assert any("does not support the DeletedWith option" in e for e in outcome.errors), outcome.errors
    # options the SDK sends regardless are refused by the driver before any step, not ignored
    outcome = driver(tmp_path, [{"name": "a", "content": "A", "protect": True, "ignore_changes": ["content"]}]).up()
    assert any("does not implement the resource option(s) protect, ignoreChanges" in e for e in outcome.errors)
    assert not any(m == "update" for m, _, _, _ in calls(tmp_path))


def test_stack_config_is_namespaced_objects_as_json_strings_secrets_decrypted(tmp_path):
    from pulumi_crypto import PassphraseCipher

    c = PassphraseCipher("pw")
    (tmp_path / "Pulumi.s.yaml").write_text(
        f"encryptionsalt: {c.salt_state}\n"
        "config:\n"
        "  drivertest:fleet: {hosts: [{name: a, port: 22}]}\n"
        "  plain: text\n"
        "  other:flag: true\n"
        f"  drivertest:key:\n    secure: {c.encrypt('k3y')}\n"
    )
    cfg = StackConfig.load(tmp_path, "s", "pw", project="drivertest")
    assert cfg.values == {
        "drivertest:fleet": '{"hosts": [{"name": "a", "port": 22}]}',
        "drivertest:plain": "text",
        "other:flag": "true",
        "drivertest:key": "k3y",
    }
    assert cfg.secret_keys == ["drivertest:key"]
    assert cfg.configure_args()["drivertest:key"] == {"4dabf18193072939515e22adb298388d": SECRET_SIG, "value": "k3y"}


def test_reading_a_managed_resource_s_urn_with_another_id_relinquishes_and_deletes_it(tmp_path):
    assert not driver(tmp_path, [{"name": "x", "content": "X"}]).up().errors
    (tmp_path / "y").write_text("Y|made elsewhere")
    (tmp_path / "calls.log").unlink()
    d = driver(tmp_path, [], gets=[{"name": "x", "id": "y"}])
    pv = d.preview()
    assert [(s.op, s.name) for s in pv.steps if s.op not in ("same", "create")] == [("read", "x"), ("delete", "x")]
    outcome = d.up()
    assert not outcome.errors, outcome.errors
    # step_generator.go GenerateReadSteps: read-replacement; the managed x is deleted at the end, y only read
    assert [(m, n) for m, n, _, _ in calls(tmp_path)] == [("read", "y"), ("read", "y"), ("delete", "x")]
    (x,) = [r for r in d.resources() if r.name == "x"]
    assert x.external and x.id == "y" and not (tmp_path / "x").exists() and (tmp_path / "y").exists()

"""Apply only what was reviewed: the plan digest (tools/plan_diff) and main's check of it (tools/plan_check, and the
workflow's script .github/scripts/reviewed-plan.sh around it).

The digest and the check are pure (snapshots in, digest and verdict out); the script is run for real on a fixture
repository, with two stand-ins for what cannot be reached from here: `gh` (the GitHub API) and `pulumi` (the stack
tag in Pulumi Cloud), each answering what the real one's `--jq` would print, and logging what it was asked.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.test_plan_diff import commit_edit, repo  # noqa: F401 - the fixture repository of this tree
from tools import plan_check, plan_diff

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".github" / "scripts" / "reviewed-plan.sh"


def _res(name: str, **inputs) -> dict:
    return {"urn": f"urn:x::{name}", "type": "pulumi-python:dynamic/host:Sysctls", "name": name, "parent": "",
            "custom": True, "dependencies": [], "secret": ["key"] if "key" in inputs else [], "inputs": inputs}  # fmt: skip


def _plan(*resources: dict) -> dict:
    return {"stack": "hk-prod", "error": None, "resources": list(resources), "verdicts": {}}


BASE = _plan(_res("a", values={"x": "1"}), _res("b", values={"y": "1"}))


def test_the_same_plan_gives_the_same_digest_and_another_input_another_one():
    head = _plan(_res("a", values={"x": "2"}), _res("b", values={"y": "1"}))
    digest = plan_diff.plan_digest(BASE, head)
    assert digest and re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    assert plan_diff.plan_digest(BASE, _plan(*[dict(r) for r in head["resources"]])) == digest
    assert plan_diff.plan_digest(BASE, _plan(_res("a", values={"x": "3"}), _res("b", values={"y": "1"}))) != digest
    # another base under the same change is another plan (it would apply on top of something else)
    other = _plan(_res("a", values={"x": "0"}), _res("b", values={"y": "1"}))
    assert plan_diff.plan_digest(other, head) != digest
    # a provider that says "no change" (a version bump it ignores) makes no step
    quiet = head | {"verdicts": {"urn:x::a": {"changes": False, "replaces": [], "rule": "P"}}}
    assert plan_diff.plan_digest(BASE, quiet) == plan_diff.plan_digest(BASE, BASE)


def test_secret_inputs_are_masked_in_the_digest():
    one = _plan(_res("a", values={"x": "2"}, key="secret-one"))
    two = _plan(_res("a", values={"x": "2"}, key="secret-two"))
    assert plan_diff.plan_digest(BASE, one) == plan_diff.plan_digest(BASE, two)


def _comment(*stacks: tuple[str, str | None]) -> str:
    return "\n".join([plan_diff.DECLARED, ""] + [plan_diff.digest_line(s, d) + "\n" for s, d in stacks])


def test_the_comment_digest_is_read_per_stack_and_never_from_inside_a_code_block():
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    text = _comment(("dev", a), ("hk-prod", b))
    assert plan_check.shown_digest(text, "hk-prod") == b and plan_check.shown_digest(text, "dev") == a
    assert plan_check.shown_digest(text, "other") is None
    forged = text + "\n" + "\n".join(plan_diff.block([plan_diff.digest_line("hk-prod", a)], "diff"))
    assert plan_check.shown_digest(forged, "hk-prod") == b  # a text diff's line is PR text
    assert plan_check.shown_digest(_comment(("hk-prod", None)), "hk-prod") == "none"


def test_check_passes_the_reviewed_plan_and_refuses_another_with_what_to_do():
    head = _plan(_res("a", values={"x": "2"}), _res("b", values={"y": "1"}))
    now = plan_diff.plan_digest(BASE, head)
    ok, msg = plan_check.check("hk-prod", BASE, head, now, "pull request #7's plan comment", ("1a2b3c4", "5d6e7f8"))
    assert ok and msg.startswith("hk-prod: the plan on main (1a2b3c4 → 5d6e7f8) is the one")
    shown = "sha256:" + "0" * 64
    ok, msg = plan_check.check("hk-prod", BASE, head, shown, "pull request #7's plan comment", ("1a2b3c4", "5d6e7f8"))
    assert not ok and msg.startswith("REFUSED: hk-prod is not applied.")
    assert now in msg and shown in msg and "pull request #7's plan comment showed" in msg
    assert f"gh workflow run up.yml -f stack=hk-prod -f plan_digest={now}" in msg
    ok, msg = plan_check.check("hk-prod", BASE, head, None, "the pull request's plan comment", ("a", "b"))
    assert not ok and "shows no plan digest for hk-prod" in msg
    bad = {"stack": "hk-prod", "error": ["fleet.hosts[0]: bad"], "resources": []}
    ok, msg = plan_check.check("hk-prod", BASE, bad, "none", "x", ("a", "b"))
    assert not ok and "does not load" in msg


# -- the workflow's script, on a fixture repository, with stand-ins for GitHub and Pulumi Cloud -------------------
STANDIN_GH = """#!/bin/sh
# stand-in for the GitHub API (not reachable here): prints what the real `gh api ... --jq` would
echo "gh $*" >> "$STANDIN/log"
case "$2" in
  */commits/*/pulls) cat "$STANDIN/pr" 2>/dev/null || true ;;  # no merged PR: empty, exit 0
  */issues/comments/*) cat "$STANDIN/comment.md" ;;
  */issues/*/comments) if [ -f "$STANDIN/pr" ]; then echo 4242; fi ;;
esac
"""
STANDIN_PULUMI = """#!/bin/sh
# stand-in for Pulumi Cloud's stack tags (not reachable here)
echo "pulumi $*" >> "$STANDIN/log"
[ "$1 $2 $3 $4" = "stack tag get gpuhost:applied-commit" ] && cat "$STANDIN/tag"
"""


@pytest.fixture(scope="module")
def merged(repo, tmp_path_factory):  # noqa: F811 - the imported fixture
    """The fixture repository with a merged change to dev (its base and head), a .venv, and the stand-ins."""
    path, base = repo
    head = commit_edit(
        path,
        base,
        {"Pulumi.dev.yaml": lambda t: t.replace('net.core.somaxconn: "4096"', 'net.core.somaxconn: "8192"')},
        "dev: somaxconn 8192",
    )
    if not (path / ".venv").exists():
        (path / ".venv").symlink_to(ROOT / ".venv")
    standin = tmp_path_factory.mktemp("standin")
    for name, text in (("gh", STANDIN_GH), ("pulumi", STANDIN_PULUMI)):
        (standin / name).write_text(text)
        (standin / name).chmod(0o755)
    (standin / "tag").write_text(base + "\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert plan_diff.main(["--repo", str(path), "--base", base, "--head", head, "dev"]) == 0
    return path, base, head, standin, "<!-- gpuhost plan-diff -->\n" + out.getvalue()


def _run(merged, comment: str | None, digest: str = "") -> subprocess.CompletedProcess:
    path, base, head, standin, _ = merged
    (standin / "log").write_text("")
    for f in ("pr", "comment.md"):
        (standin / f).unlink(missing_ok=True)
    if comment is not None:
        (standin / "pr").write_text("7\n")
        (standin / "comment.md").write_text(comment)
    env = {**os.environ, "PATH": f"{standin}:{os.environ['PATH']}", "STANDIN": str(standin), "STACK": "dev",
           "GITHUB_REPOSITORY": "hk/gpuhost", "GITHUB_SHA": head, "BEFORE": "", "PLAN_DIGEST": digest}  # fmt: skip
    return subprocess.run(["bash", str(SCRIPT)], cwd=path, env=env, capture_output=True, text=True, timeout=600)


def test_the_script_applies_the_plan_the_merged_pull_request_showed(merged):
    path, base, head, standin, comment = merged
    p = _run(merged, comment)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "dev: the plan on main" in p.stdout and "pull request #7's plan comment showed" in p.stdout
    log = (standin / "log").read_text()
    assert f"repos/hk/gpuhost/commits/{head}/pulls" in log and "repos/hk/gpuhost/issues/7/comments" in log
    assert "repos/hk/gpuhost/issues/comments/4242" in log and "stack tag get gpuhost:applied-commit" in log


def test_the_script_refuses_another_plan_and_a_push_without_a_pull_request(merged):
    path, base, head, standin, comment = merged
    other = re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, comment)
    p = _run(merged, other)
    assert p.returncode == plan_check.REFUSED and p.stdout.startswith("REFUSED: dev is not applied.")
    assert "gh workflow run up.yml -f stack=dev -f plan_digest=sha256:" in p.stdout
    assert "The plan as it is now:" in p.stdout and "somaxconn" in p.stdout
    p = _run(merged, None)
    assert p.returncode == plan_check.REFUSED and "shows no plan digest for dev" in p.stdout
    # by hand, with the digest the refusal printed: applied
    printed = re.search(r"plan_digest=(sha256:[0-9a-f]{64})", _run(merged, other).stdout)
    assert printed and _run(merged, None, digest=printed.group(1)).returncode == 0


def test_up_workflow_checks_the_reviewed_plan_before_preview_and_before_up_and_records_what_it_applied():
    import yaml

    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "up.yml").read_text())
    assert doc["permissions"] == {"contents": "read", "pull-requests": "read"}
    assert "plan_digest" in doc[True]["workflow_dispatch"]["inputs"]  # YAML reads `on` as True
    for name, command in (("preview", "preview"), ("up", "up")):
        steps = doc["jobs"][name]["steps"]
        assert steps[0]["with"]["fetch-depth"] == 0  # the commit the stack was last applied from
        runs = [s.get("run", "") for s in steps]
        check = runs.index(".github/scripts/reviewed-plan.sh")
        (pulumi,) = [i for i, s in enumerate(steps) if s.get("with", {}).get("command") == command]
        assert check < pulumi and steps[check]["env"]["GH_TOKEN"] == "${{ github.token }}"
    up = doc["jobs"]["up"]["steps"]
    assert up[-1]["run"] == 'pulumi stack tag set gpuhost:applied-commit "$GITHUB_SHA" --stack "$STACK"'

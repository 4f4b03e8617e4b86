"""CI gives pull-request code no secret, and the tests need no stack passphrase (the workflows are read as YAML)."""

from pathlib import Path

import yaml

WF = Path(__file__).resolve().parent.parent / ".github" / "workflows"


def test_pull_request_workflow_sees_no_secret_and_says_its_plan_is_not_a_preview():
    text = (WF / "preview.yml").read_text()
    doc = yaml.safe_load(text)
    assert list(doc[True]) == ["pull_request"]  # YAML reads `on` as True; never pull_request_target
    assert "secrets." not in text and "PULUMI_CONFIG_PASSPHRASE:" not in text
    assert doc["permissions"] == {"contents": "read"}
    assert "NOT a `pulumi preview`" in text and "no refresh" in text
    steps = [s for job in doc["jobs"].values() for s in job["steps"]]
    assert not any("pulumi/actions" in str(s.get("uses", "")) for s in steps)


def test_pr_diff_runs_pr_code_without_write_access_and_posts_it_from_a_job_that_runs_none():
    doc = yaml.safe_load((WF / "preview.yml").read_text())
    plan, comment = doc["jobs"]["plan"], doc["jobs"]["comment"]
    # PR code (tests, plan_diff and the program at both commits) runs with the top level's contents: read only
    assert "permissions" not in plan and "permissions" not in doc["jobs"]["test"]
    run = "\n".join(s.get("run", "") for s in plan["steps"])
    assert "tools.plan_diff --base HEAD^1 --head HEAD" in run and "GITHUB_STEP_SUMMARY" in run
    assert plan["steps"][0]["with"]["fetch-depth"] == 2  # the merge commit and main as it would land on
    # the one write permission: the default token's, in a job that checks nothing out and runs no repository code
    assert comment["permissions"] == {"pull-requests": "write"} and comment["needs"] == "plan"
    uses = [s.get("uses", "") for s in comment["steps"] if "uses" in s]
    assert uses == ["actions/download-artifact@v4"]
    post = comment["steps"][-1]
    assert post["env"]["GH_TOKEN"] == "${{ github.token }}" and post["continue-on-error"] is True
    assert "python" not in post["run"] and ".venv" not in post["run"] and "./" not in post["run"]


def test_real_preview_and_up_run_merged_code_from_the_management_network():
    doc = yaml.safe_load((WF / "up.yml").read_text())
    assert set(doc[True]) == {"push", "workflow_dispatch"} and doc[True]["push"]["branches"] == ["main"]
    for job in doc["jobs"].values():
        assert job["runs-on"] == ["self-hosted", "hk-mgmt"] and "environment" in job
    assert doc["jobs"]["up"]["needs"] == "preview"
    assert doc["jobs"]["preview"]["steps"][-1]["with"]["refresh"] is True


def test_tool_plan_diff_runs_without_any_passphrase(monkeypatch):
    from tools import plan_diff

    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    base = plan_diff.snapshot("hk-prod", plan_diff.throwaway_key())
    text, ok = plan_diff.render(base, base)
    assert ok and "**No changes** (229 resources unchanged)." in text and "no secret read" in plan_diff.DECLARED


def test_tool_plan_diff_declared_runs_without_any_passphrase(monkeypatch):
    from tools import plan_diff

    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    text, ok = plan_diff.declared("hk-prod")
    assert ok and "| `gpuhost:host:PassthroughHost` | 6 |" in text and "no secrets" in text


def test_tool_plan_diff_declared_prints_the_same_bytes_on_every_run():
    """Two plans of one tree compare byte for byte (the check issue 29 asks of a refactor): registrations sorted by
    name, and one fixed key in place of the stack's secrets, whose private part is never printed."""
    from tools import plan_diff

    first, ok1 = plan_diff.declared("hk-prod")
    second, ok2 = plan_diff.declared("hk-prod")
    assert ok1 and ok2 and first == second
    lines = [ln for ln in first.splitlines() if " (pulumi-python:" in ln or " (gpuhost:" in ln]
    assert len(lines) > 100 and lines == sorted(lines, key=lambda ln: ln.split(" (")[0])
    assert "PRIVATE KEY" not in first and plan_diff.throwaway_key().splitlines()[1] not in first


def test_the_comment_job_edits_only_its_own_comment():
    """Anyone can post a comment that starts with the marker; the job picks one github-actions[bot] wrote."""
    post = yaml.safe_load((WF / "preview.yml").read_text())["jobs"]["comment"]["steps"][-1]["run"]
    select = post.split("--jq", 1)[1].split("| tail", 1)[0]
    assert 'select(.user.login == \\"github-actions[bot]\\" and .user.type == \\"Bot\\")' in select
    assert "startswith" in select and select.index("user.login") < select.index("startswith")

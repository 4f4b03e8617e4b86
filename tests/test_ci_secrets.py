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


def test_real_preview_and_up_run_merged_code_from_the_management_network():
    doc = yaml.safe_load((WF / "up.yml").read_text())
    assert set(doc[True]) == {"push", "workflow_dispatch"} and doc[True]["push"]["branches"] == ["main"]
    for job in doc["jobs"].values():
        assert job["runs-on"] == ["self-hosted", "hk-mgmt"] and "environment" in job
    assert doc["jobs"]["up"]["needs"] == "preview"
    assert doc["jobs"]["preview"]["steps"][-1]["with"]["refresh"] is True


def test_tool_mock_plan_runs_without_any_passphrase(monkeypatch):
    from tools import mock_plan

    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    text, ok = mock_plan.render("hk-prod")
    assert ok and "| `gpuhost:host:PassthroughHost` | 6 |" in text and "no secrets" in text

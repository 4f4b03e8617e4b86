"""tools/plan_diff.py on fixture commits: a throwaway git repository made from this tree (the base commit), one edit
committed on top of it per case (the head), each commit planned from its own worktree in its own process.

Each commit is planned once: the base of each stack once for the module, each head once for its case.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tools import plan_diff

ROOT = Path(__file__).resolve().parent.parent


def sh(repo: Path, *args: str) -> str:
    return subprocess.run(args, cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def commit_edit(repo: Path, base: str, edits: dict[str, object], message: str) -> str:
    """A commit on top of `base` with `edits` (path → new text, or a function of the old text)."""
    sh(repo, "git", "checkout", "-q", "--detach", base)
    for path, edit in edits.items():
        p = repo / path
        p.write_text(edit(p.read_text()) if callable(edit) else str(edit))
    sh(repo, "git", "commit", "-qam", message)
    return sh(repo, "git", "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> tuple[Path, str]:
    repo = tmp_path_factory.mktemp("fixture-repo")
    files = sh(ROOT, "git", "ls-files", "-co", "--exclude-standard").splitlines()
    for f in files:
        src = ROOT / f
        if src.is_file() and not src.is_symlink() and not f.startswith(("bench/", "docs/", "tests/fixtures/")):
            (repo / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / f)
    sh(repo, "git", "init", "-q")
    sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "root")
    sh(repo, "git", "config", "user.name", "t")
    sh(repo, "git", "config", "user.email", "t@t")
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "base")
    return repo, sh(repo, "git", "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def key() -> str:
    return plan_diff.throwaway_key()


@pytest.fixture(scope="module")
def base_plans(repo, key) -> dict[str, dict]:
    path, base = repo
    with plan_diff.checkout(path, base) as tree:
        return {s: plan_diff.plan_tree(tree, s, key) for s in ("dev", "hk-prod")}


def diff(repo, key, base_plan: dict, head: str, stack: str) -> str:
    path, _ = repo
    with plan_diff.checkout(path, head) as tree:
        text, ok = plan_diff.render(base_plan, plan_diff.plan_tree(tree, stack, key, against=base_plan))
    assert ok
    return text


def resource_lines(text: str) -> list[str]:
    """The resource lines of the diff block (`+ x`, `~ x`, `+- x`, `- x`), without their detail lines."""
    block = text.split("```diff\n", 1)[1].split("```", 1)[0] if "```diff" in text else ""
    return [ln for ln in block.splitlines() if not ln.startswith(" ")]


def test_an_unchanged_stack_is_one_line_and_its_digest_without_the_disclaimer(repo, key, base_plans):
    path, base = repo
    text = diff(repo, key, base_plans["dev"], base, "dev")
    assert "**No changes** (13 resources unchanged)." in text
    assert "Declared-state diff" not in text and "**Reboots:**" not in text  # the comment says it once (`main`)
    assert re.search(r"^\*\*Plan digest\*\* of `dev`: `sha256:[0-9a-f]{64}`", text, re.M)


def test_sysctl_value_change_is_one_update_with_that_one_path(repo, key, base_plans):
    path, base = repo
    head = commit_edit(
        path,
        base,
        {"Pulumi.dev.yaml": lambda t: t.replace('net.core.somaxconn: "4096"', 'net.core.somaxconn: "8192"')},
        "dev: somaxconn 8192",
    )
    text = diff(repo, key, base_plans["dev"], head, "dev")
    assert resource_lines(text) == ["~ emulated-gpu-01-sysctls (host:Sysctls): update"]
    details = [ln.strip() for ln in text.split("```diff\n")[1].split("```")[0].splitlines() if ln.startswith(" ")]
    assert details == ['~ values["net.core.somaxconn"]: "4096" → "8192"']
    assert "**Reboots:** none" in text and "1 to update, 12 unchanged." in text


def test_kernel_argument_added_updates_the_cmdline_and_names_the_host_that_reboots(repo, key, base_plans):
    path, base = repo
    head = commit_edit(
        path,
        base,
        {
            "Pulumi.dev.yaml": lambda t: t.replace(
                "        os_family: debian\n", "        os_family: debian\n        kernel: {extra_args: [nosmt]}\n", 1
            )
        },
        "dev: nosmt",
    )
    text = diff(repo, key, base_plans["dev"], head, "dev")
    lines = resource_lines(text)
    assert "~ emulated-gpu-01-cmdline (host:KernelCmdline): update" in lines
    assert '    ~ add[5]: + "nosmt"' in text or re.search(r'~ add\[\d+\]: \+ "nosmt"', text)
    top = text.split("```diff")[0]
    assert "**Reboots:** `emulated-gpu-01` reboots: kernel argument `nosmt` added (its running VMs" in top
    # the reboot's expected running state follows the command line; no resource is replaced
    assert "~ emulated-gpu-01-reboot (host:HostReboot): update" in lines
    assert not [ln for ln in lines if ln.startswith(("+", "-"))]


def _second_host(text: str) -> str:
    doc = yaml.safe_load(text)
    hosts = doc["config"]["gpuhost:fleet"]["hosts"]
    two = {**hosts[0], "name": "emulated-gpu-02", "ssh": {**hosts[0]["ssh"], "port": 2223}, "vms": []}
    hosts.append(two)
    return yaml.safe_dump(doc, sort_keys=False)


def _move_vm(text: str) -> str:
    doc = yaml.safe_load(text)
    hosts = doc["config"]["gpuhost:fleet"]["hosts"]
    hosts[1]["vms"], hosts[0]["vms"] = hosts[0]["vms"], []
    return yaml.safe_dump(doc, sort_keys=False)


def test_vm_moved_to_another_host_is_deleted_there_and_created_here_with_what_depends_on_it(repo, key):
    path, base = repo
    two = commit_edit(path, base, {"Pulumi.dev.yaml": _second_host}, "dev: a second emulated host")
    moved = commit_edit(path, two, {"Pulumi.dev.yaml": _move_vm}, "dev: tenant-a moves to emulated-gpu-02")
    with plan_diff.checkout(path, two) as tree:
        base_plan = plan_diff.plan_tree(tree, "dev", key)
    text = diff(repo, key, base_plan, moved, "dev")
    lines = resource_lines(text)
    assert "- emulated-gpu-01-tenant-a (vm:PinnedVM): delete" in lines
    assert "- emulated-gpu-01-tenant-a-domain (vm:LibvirtDomain): delete" in lines
    assert "+ emulated-gpu-02-tenant-a (vm:PinnedVM): create" in lines
    assert "+ emulated-gpu-02-tenant-a-domain (vm:LibvirtDomain): create" in lines
    # the deleted component's dependents are named (its domain, a child)
    i = text.index("- emulated-gpu-01-tenant-a (vm:PinnedVM): delete")
    assert text[i:].splitlines()[1].strip().startswith("depended on it: emulated-gpu-01-tenant-a-domain")
    # nothing of the hosts themselves is deleted or created
    assert not [ln for ln in lines if ln.startswith(("+", "-")) and "tenant-a" not in ln]


def test_new_service_creates_its_components_children(repo, key, base_plans):
    path, base = repo

    def add_service(text: str) -> str:
        start = text.index("      - {name: yolo-rt, host: trt-l40s-01, vm: tenant-rt-a,")
        end = text.index("      - {name: resnet-a10,")
        entry = text[start:end].replace("name: yolo-rt,", "name: yolo-rt-b,").replace("tenant-rt-a", "tenant-rt-b")
        return text[:end] + entry + text[end:]

    head = commit_edit(path, base, {"Pulumi.hk-prod.yaml": add_service}, "hk-prod: yolo-rt-b on tenant-rt-b")
    text = diff(repo, key, base_plans["hk-prod"], head, "hk-prod")
    lines = resource_lines(text)
    created = [ln for ln in lines if ln.startswith("+ ")]
    assert "+ yolo-rt-b (serving:TritonService): create" in created
    base_children = [
        r["name"].replace("yolo-rt-", "yolo-rt-b-", 1)
        for r in base_plans["hk-prod"]["resources"]
        if r["parent"].endswith("::yolo-rt")
    ]
    assert len(base_children) > 5
    for child in base_children:
        assert any(ln.startswith(f"+ {child} (") for ln in created), child
    # monitoring scrapes the new Triton: an update of its files, Prometheus's config shown as a text diff
    assert "~ monitoring-files (monitoring:MonitoringFiles): update" in lines
    assert "prometheus.yml" in text and "yolo-rt-b" in text.split("monitoring-files")[1]
    assert not [ln for ln in lines if ln.startswith(("-", "+-"))]


def test_pure_refactor_yaml_reformatted_and_code_renamed_is_no_changes(repo, key, base_plans):
    path, base = repo

    def reformat(text: str) -> str:
        doc = yaml.safe_load(text)
        fleet = doc["config"]["gpuhost:fleet"]
        fleet["hosts"] = [dict(reversed(list(h.items()))) for h in fleet["hosts"]]
        return yaml.safe_dump(doc, sort_keys=True, default_flow_style=False, width=200)

    head = commit_edit(
        path,
        base,
        {
            "Pulumi.dev.yaml": reformat,
            "Pulumi.hk-prod.yaml": reformat,
            "stacks/program.py": lambda t: t.replace("_PRESET_FIELDS", "PRESET_DECIDES"),
        },
        "refactor: stack files reformatted, a constant renamed",
    )
    assert "PRESET_DECIDES" in sh(path, "git", "show", f"{head}:stacks/program.py")
    for stack, n in (("dev", 13), ("hk-prod", 229)):
        text = diff(repo, key, base_plans[stack], head, stack)
        assert f"**No changes** ({n} resources unchanged)." in text, text


def test_config_the_loader_refuses_prints_the_loaders_lines(repo, key, base_plans):
    path, base = repo
    head = commit_edit(
        path, base, {"Pulumi.dev.yaml": lambda t: t.replace('reserved_cpus: "0-1"', 'reserved_cpus: "1-0"')}, "bad"
    )
    with plan_diff.checkout(path, head) as tree:
        text, ok = plan_diff.render(base_plans["dev"], plan_diff.plan_tree(tree, "dev", key, against=base_plans["dev"]))
    assert not ok
    assert "refused by the loader" in text and "stack config is invalid:" in text
    assert "fleet.hosts[0].reserved_cpus" in text and "```diff" not in text


def _reboot(host: str, **inputs) -> dict:
    return {
        "urn": f"urn:pulumi:s::gpuhost::{plan_diff.REBOOT_TYPE}::{host}-reboot",
        "type": plan_diff.REBOOT_TYPE,
        "name": f"{host}-reboot",
        "inputs": {"host": {"name": host}, "policy": "auto", "expect_args": ["intel_iommu=on"], **inputs},
    }


def test_reboots_are_the_hosts_whose_expected_running_state_changes_in_plain_words():
    base = [_reboot("a"), _reboot("b"), _reboot("c", expect_drivers={"0000:01:00.0": "vfio-pci"})]
    head = [
        _reboot("a"),  # unchanged: no reboot
        _reboot("b", policy="never", expect_args=["intel_iommu=on", "nosmt"], expect_absent=["quiet"]),
        _reboot("c", expect_drivers={"0000:02:00.0": "vfio-pci"}),
        _reboot("d"),
    ]
    assert plan_diff.reboots(base, head) == [
        "`b` needs a reboot (`reboot: never`: reported as pending, not rebooted): kernel argument `nosmt` added; "
        "kernel argument to remove `quiet` added.",
        "`c` reboots: `0000:02:00.0` bound to `vfio-pci`; `0000:01:00.0` given back to its host driver (its running "
        "VMs are shut down first and started again after).",
        "`d` reboots: new host, the first `up` reboots it once unless its running kernel already matches.",
    ]


def test_value_changes_show_secrets_and_large_values_as_digests_and_text_as_a_unified_diff():
    import base64
    import hashlib

    key_old, key_new = "-----BEGIN KEY-----AAAA", "-----BEGIN KEY-----BBBB"
    (line,) = plan_diff.value_changes(key_old, key_new, ("key",), secret=True)
    assert "BEGIN" not in line and hashlib.sha256(b'"-----BEGIN KEY-----BBBB"').hexdigest()[:16] in line
    big_old, big_new = "x" * 500, "y" * 500
    (line,) = plan_diff.value_changes(big_old, big_new, ("blob",))
    assert "xxx" not in line and "(502 bytes)" in line
    old = "max_batch_size: 8\ndynamic_batching {\n  max_queue_delay_microseconds: 1500\n}\n"
    new = old.replace("1500", "2500")
    enc = {k: base64.b64encode(v.encode()).decode() for k, v in (("o", old), ("n", new))}
    lines = plan_diff.value_changes(
        {"m/config.pbtxt": {"content": enc["o"]}}, {"m/config.pbtxt": {"content": enc["n"]}}
    )
    # sizes, no digests, beside a diff
    assert lines[0] == f'["m/config.pbtxt"].content: base64 text, {len(old)} → {len(new)} bytes'
    body = [ln[1:] for ln in lines[1:]]
    assert "-  max_queue_delay_microseconds: 1500" in body and "+  max_queue_delay_microseconds: 2500" in body
    assert plan_diff.value_changes({"a": [1, 2]}, {"a": [1, 3, 2]}) == ["a[1]: + 3"]


# -- what an operator reads first, and the plan's digest (issue 40 §3) ----------------------------------------------
def _edit(old: str, new: str):
    def apply(text: str) -> str:
        assert text.count(old) == 1, old  # the edit lands on the stack file as it is
        return text.replace(old, new)

    return apply


HK_EDITS = {
    "window": _edit("max_batch_size: 32, max_queue_delay_us: 1500,", "max_batch_size: 32, max_queue_delay_us: 2500,"),
    "kernel": _edit("kernel: {video_efifb_off: true}", "kernel: {video_efifb_off: true, extra_args: [pcie_aspm=off]}"),
    "docker-window": _edit(
        "{name: yolov8n, preset: yolov8n,", "{name: yolov8n, preset: yolov8n, max_queue_delay_us: 700,"
    ),
}


@pytest.fixture(scope="module")
def hk_heads(repo, key, base_plans) -> dict[str, tuple[str, dict]]:
    """Each one-line hk-prod edit committed on the base and planned against it: name → (commit, head plan)."""
    path, base = repo
    out = {}
    for name, edit in HK_EDITS.items():
        head = commit_edit(path, base, {"Pulumi.hk-prod.yaml": edit}, f"hk-prod: {name}")
        with plan_diff.checkout(path, head) as tree:
            out[name] = head, plan_diff.plan_tree(tree, "hk-prod", key, against=base_plans["hk-prod"])
    return out


def _hk(base_plans, hk_heads, name: str) -> tuple[str, str, dict]:
    """(the comment's head lines, its diff block, the head plan) of one hk-prod edit."""
    head = hk_heads[name][1]
    text, ok = plan_diff.render(base_plans["hk-prod"], head)
    assert ok
    top, _, rest = text.partition("```diff\n")
    return top, rest.split("\n```", 1)[0], head


def _resource(plan: dict, name: str) -> dict:
    (r,) = [r for r in plan["resources"] if r["name"] == name]
    return r


def test_window_change_leads_with_the_restart_and_the_gate_and_its_size(base_plans, hk_heads):
    top, block_, head = _hk(base_plans, hk_heads, "window")
    svc = _resource(head, "resnet-rhel-triton-service")["inputs"]
    gate = _resource(head, "resnet-rhel-resnet50-gate")["inputs"]
    guest = svc["host"]["name"]
    assert f"**Restarts:** on `{guest}`: `{svc['unit']}` restarts." in top
    assert gate["rollback"]["host"]["name"] == guest and gate["model"] == "resnet50"
    size = (
        f"{int(gate['concurrency'])} connections for {int(gate['duration_s'])} s, "
        f"up to {int(gate['max_requests']):,} requests through `{gate['url']}`, must hold p95 ≤ {int(gate['p95_ms'])} ms"
    )
    assert f"**Gates re-run:** `resnet50` on `{guest}`: {size}; a miss rolls the deploy back." in top
    assert "**Reboots:** none." in top and "**Replaced** (deleted, then created again): none." in top
    # the one value, as the file it lands in
    assert "-  max_queue_delay_microseconds: 1500" in block_ and "+  max_queue_delay_microseconds: 2500" in block_


def test_window_change_folds_its_hashes_and_names_no_untouched_dependent(base_plans, hk_heads):
    top, block_, head = _hk(base_plans, hk_heads, "window")
    assert not re.search(r"[0-9a-f]{32}", block_), block_  # no trigger, digest or sha256 line
    assert not re.search(r"sha256:[0-9a-f]{16}", top.split("**Plan digest**")[0])
    assert "monitoring" not in top + block_ and "depends on it" not in block_  # monitoring is untouched
    folded = re.search(r"\(derived: (\d+) values, not listed", top)
    assert folded and int(folded.group(1)) >= 5
    lines = resource_lines("```diff\n" + block_ + "\n```")
    assert "~ resnet-rhel-triton-service (host:ServiceState): update (derived values only)" in lines


def test_kernel_argument_change_says_the_host_reboots_and_nothing_restarts(base_plans, hk_heads):
    top, block_, _ = _hk(base_plans, hk_heads, "kernel")
    assert "**Reboots:** `rtx4090-01` reboots: kernel argument `pcie_aspm=off` added" in top
    assert "**Restarts:** none." in top and "**Gates re-run:** none." in top
    assert not re.search(r"[0-9a-f]{32}", block_)
    assert resource_lines("```diff\n" + block_ + "\n```") == [
        "~ rtx4090-01-cmdline (host:KernelCmdline): update",
        "~ rtx4090-01-reboot (host:HostReboot): update",
    ]


def test_docker_window_change_names_the_container_its_component_says_is_recreated(base_plans, hk_heads):
    top, block_, head = _hk(base_plans, hk_heads, "docker-window")
    guest = _resource(head, "yolo-rt-models")["inputs"]["host"]["name"]
    assert f"**Restarts:** on `{guest}`: `triton` container is recreated: Triton restarts." in top
    assert "**Gates re-run:** `yolov8n` on " in top
    # the run script differs only in the repository digest's label: derived, not a 1,000-character line
    assert "~ yolo-rt-triton-run (host:ManagedFile): update (derived values only)" in block_
    assert not re.search(r"[0-9a-f]{32}", block_)


def test_recreated_patterns_match_containers_of_the_stack(base_plans):
    """Every RECREATED pattern a component declares names containers hk-prod has (a renamed child would silently
    stop being reported as a restart)."""
    import components.monitoring_stack
    import components.triton_service
    from components.wiring import Wired

    res = base_plans["hk-prod"]["resources"]
    by_urn = {r["urn"]: r for r in res}
    for cls in (components.triton_service.TritonService, components.monitoring_stack.MonitoringStack):
        assert Wired.BY_TYPE[cls.TYPE] is cls and cls.RECREATED
        kids = [r for r in res if r["type"].startswith("docker:index/container") and r["parent"] in by_urn]
        suffixes = [
            r["name"][len(by_urn[r["parent"]]["name"]) + 1 :] for r in kids if by_urn[r["parent"]]["type"] == cls.TYPE
        ]
        for pattern in cls.RECREATED:
            assert fnmatch.filter(suffixes, pattern), (cls.TYPE, pattern, suffixes)


def test_every_derived_path_a_provider_declares_names_an_input_it_is_given(hk_heads):
    """Each derived path (providers.effects) starts at an input that resources of that kind have (an unset input is
    left out, so not every resource has it): a typo would fold nothing."""
    plan = hk_heads["window"][1]
    kinds = {r["type"] for r in plan["resources"] if r.get("derived")}
    assert {"pulumi-python:dynamic/serving:AcceptanceGate", "pulumi-python:dynamic/host:ServiceState"} <= kinds
    # by declaration (one per provider: ServiceState and SystemdService share theirs)
    by_decl: dict[tuple, list[dict]] = {}
    for r in plan["resources"]:
        by_decl.setdefault(tuple(tuple(p) for p in r.get("derived") or ()), []).append(r)
    for decl, rs in by_decl.items():
        for path in decl:
            assert any(path[0] in r["inputs"] for r in rs), (rs[0]["type"], path)


def test_replaced_names_host_and_reason_and_only_dependents_that_go_too():
    host = {"name": "gpu-a"}
    repo_urn = _res("repo", {})["urn"]

    def plan(root: str, trigger: str) -> dict[str, Any]:
        return {
            "stack": "s",
            "resources": [
                _res("repo", {"host": host, "root": root}),
                _res("svc", {"host": host, "trigger": trigger}) | {"dependencies": [repo_urn]},
                _res("engine", {"host": host, "root": root}) | {"dependencies": [repo_urn]},
            ],
        }

    base, head = plan("/srv/a", "1"), plan("/srv/b", "2")
    repo_, svc, engine = (r["urn"] for r in head["resources"])
    head["verdicts"] = {
        repo_: {"changes": True, "replaces": ["root"], "rule": "P"},
        svc: {"changes": True, "replaces": [], "rule": "P"},
        engine: {"changes": True, "replaces": ["root"], "rule": "P"},
    }
    text, ok = plan_diff.render(base, head)
    assert (
        ok and "**Replaced** (deleted, then created again): `repo` (host:Sysctls) on `gpu-a`: `root` changed;" in text
    )
    # svc is only updated: not named as a dependent
    assert "    depends on it, replaced too: engine (host:Sysctls)" in text.splitlines()


def test_plan_digest_is_the_same_on_every_run_and_differs_for_another_plan(repo, key, base_plans, hk_heads):
    path, base = repo
    window, window_plan = hk_heads["window"]
    with plan_diff.checkout(path, base) as btree, plan_diff.checkout(path, window) as htree:
        again_base = plan_diff.plan_tree(btree, "hk-prod", plan_diff.throwaway_key())
        again = plan_diff.plan_tree(htree, "hk-prod", plan_diff.throwaway_key(), against=again_base)
    first = plan_diff.plan_digest(base_plans["hk-prod"], window_plan)
    assert first and first.startswith("sha256:") and plan_diff.plan_digest(again_base, again) == first
    assert plan_diff.plan_digest(base_plans["hk-prod"], hk_heads["kernel"][1]) != first
    assert plan_diff.plan_digest(base_plans["hk-prod"], base_plans["hk-prod"]) != first


# -- the comment is not an input channel (issue 38 §5) -------------------------------------------------------------
markdown_it = pytest.importorskip("markdown_it")
HOSTILE = [
    "x\n```\n<img src=https://evil.example/p.png> @org/team",
    "`` ` ```` <script>alert(1)</script>",
    "@octocat <a href='https://evil.example'>click</a>",
    "\u202egnp.exe\r\n# heading\x1b[31m",
    "![x](https://evil.example/t.png) <details open>",
]


def _html(md: str) -> str:
    return markdown_it.MarkdownIt("commonmark").render(md)


def _outside_code(html: str) -> str:
    """The HTML with every code span and block removed: what GitHub would render as Markdown/HTML."""
    return re.sub(r"<pre><code[^>]*>.*?</code></pre>|<code>.*?</code>", "", html, flags=re.S)


def _res(name: str, inputs: dict, type_: str = "pulumi-python:dynamic/host:Sysctls") -> dict:
    return {
        "urn": f"urn:pulumi:s::gpuhost::{type_}::{name}",
        "type": type_,
        "name": name,
        "parent": "",
        "custom": True,
        "dependencies": [],
        "secret": [],
        "inputs": inputs,
    }


@pytest.mark.parametrize("evil", HOSTILE)
def test_pr_controlled_text_renders_only_inside_code_that_it_cannot_close(evil):
    base = {
        "stack": evil,
        "resources": [
            _res("keep", {"values": {"a": "1"}}),
            _res(f"gone{evil}", {}),
            _reboot("h", expect_args=["intel_iommu=on"]) | {"parent": "", "custom": True, "dependencies": []},
        ],
    }
    for r in base["resources"]:
        r.setdefault("secret", [])
    head = {
        "stack": evil,
        "resources": [
            _res("keep", {"values": {"a": evil, evil: "2"}, "content": f"line\n{evil}\n"}),
            _res(f"new{evil}", {}, type_=f"pulumi-python:dynamic/{evil}"),
            _reboot(evil, expect_args=["intel_iommu=on", evil], expect_drivers={evil: evil})
            | {"parent": "", "custom": True, "dependencies": [], "secret": []},
        ],
        "verdicts": {},
    }
    load = {"url": evil, "connections": evil, "duration_s": 3, "max_requests": evil, "rate_rps": evil, "p95_ms": evil}
    head["effects"] = {
        head["resources"][0]["urn"]: [
            {"kind": "restart", "host": evil, "what": evil, "how": evil, "load": {}},
            {"kind": "gate", "host": evil, "what": evil, "how": evil, "load": load},
        ]
    }
    text, ok = plan_diff.render(base, head, f"base {plan_diff.code(evil)}", "head `abc1234`")
    assert ok
    assert "**Restarts:** on " in text and "**Gates re-run:** " in text  # the provider's lines are printed too
    html = _html(text)
    outside = _outside_code(html)
    assert "<img" not in html and "<script" not in html and "<a " not in html and "<details" not in html
    assert "@" not in outside and "evil.example" not in outside and "<h1>" not in html
    # what the PR wrote is still shown, escaped, inside the block
    shown = plan_diff._plain(f"+ new{evil}")
    shown = shown.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    assert html.count("<pre><code") == 1 and shown in html.split("<pre><code", 1)[1]
    assert not re.search("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202e]", text.replace("\n", ""))


def test_loader_lines_and_program_output_print_in_a_block_they_cannot_close():
    head = {"stack": "dev", "error": ["fleet.x: ```", *HOSTILE], "resources": []}
    text, ok = plan_diff.render({}, head)
    assert not ok
    html = _html(text)
    assert html.count("<pre><code") == 1 and "<img" not in html and "@" not in _outside_code(html)
    assert "evil.example" in html.split("<pre><code", 1)[1] and "@org/team" in html.split("<pre><code", 1)[1]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_a_code_span_holds_any_text_as_one_span(text):
    html = _html(f"a {plan_diff.code(text)} b")
    spans = re.findall(r"<code>(.*?)</code>", html, flags=re.S)
    assert len(spans) == 1 and _outside_code(html).strip() in ("<p>a  b</p>",), html


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=20), max_size=6))
def test_a_block_holds_any_lines_as_one_block(lines):
    html = _html("\n".join(["before", "", *plan_diff.block(lines, "diff"), "", "after"]))
    assert html.count("<pre><code") == 1 and _outside_code(html).split() == ["<p>before</p>", "<p>after</p>"], html


def test_a_stack_that_fails_or_hangs_is_its_own_section_and_the_others_are_still_shown(repo, monkeypatch, capsys):
    """At the head: dev's file is a YAML alias bomb; a new stack `slow` hangs its planner (PR code can); hk-prod is
    unchanged. Each stack gets its section, in one output: the loader's line, the timeout, and hk-prod's diff."""
    path, base = repo
    lol = "".join(f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 10))
    head = commit_edit(
        path,
        base,
        {
            "Pulumi.dev.yaml": lambda t: t.replace("config:\n", "config:\n  l0: &l0 [lol, lol]\n" + lol, 1),
            "testbed/stackfiles.py": lambda t: t.replace(
                "    doc = stack_file(stack)\n",
                "    if stack == 'slow':\n        import time\n\n        time.sleep(3600)\n    doc = stack_file(stack)\n",
            ),
        },
        "dev: an alias bomb; a stack whose plan hangs",
    )
    sh(path, "git", "checkout", "-q", "--detach", head)
    shutil.copy(path / "Pulumi.dev.yaml", path / "Pulumi.slow.yaml")
    sh(path, "git", "add", "Pulumi.slow.yaml")
    sh(path, "git", "commit", "-qm", "slow")
    head = sh(path, "git", "rev-parse", "HEAD")
    monkeypatch.setattr(plan_diff, "SNAPSHOT_TIMEOUT_S", 30)
    rc = plan_diff.main(["--repo", str(path), "--base", base, "--head", head])
    out = capsys.readouterr().out
    assert rc == 1
    assert out.startswith(plan_diff.DECLARED) and out.count("Declared-state diff") == 1  # once per comment
    sections = {s.split("`", 1)[0]: s for s in out.split("### `")[1:]}
    assert set(sections) == {"dev", "hk-prod", "slow"}
    assert "Pulumi.dev.yaml: line 11: aliases expand to more than 100000 values (a YAML alias bomb)" in sections["dev"]
    assert "the plan did not finish in 30 s and was stopped" in sections["slow"]
    assert "**No changes** (" in sections["hk-prod"]

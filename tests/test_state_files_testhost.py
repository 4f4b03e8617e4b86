"""Rollback survives a dropped connection, on the emulated GPU server: the file-writing providers (ManagedFile,
SystemdService, ModelArtifact).

The same harness as tests/test_state_testhost.py (its test runs each case here, with this file's CASES, PRIORS,
SETUP and WAIT): every SSH session dies after the provider's change ran and before its result came back, the re-run
is a create against the changed host and must report the pristine priors, and destroy must put files, modes, owners
and runtime values back exactly as found. Uses the session's shared `testhost`.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

import tests.test_state_testhost as harness
from plans.host_runtime import Runtime, read_script
from providers.base import Provider
from providers.host_runtime import HostRuntimeProvider
from providers.managed_file import ManagedFileProvider
from providers.model_artifact import ModelArtifactProvider, prior_path
from providers.systemd_service import SystemdServiceProvider, state_script

pytestmark = pytest.mark.testhost

CONF = "/etc/gpuhost-drop-test.conf"
NEW_CONF = "/etc/gpuhost-drop-new.conf"
DEEP = "/etc/gpuhost-test"  # does not exist: ManagedFile makes it and the two below
DEEP_DIRS = [DEEP, f"{DEEP}/a", f"{DEEP}/a/b"]
DEEP_CONF = f"{DEEP}/a/b/file"
KEPT = "/etc/gpuhost-test-kept"  # an operator's directory (0750, group 4): kept as found
KEPT_CONF = f"{KEPT}/new/file"
UNIT = "gpuhost-drop-test.service"
UNIT_FILE = f"/etc/systemd/system/{UNIT}"
WANTS = f"/etc/systemd/system/multi-user.target.wants/{UNIT}"
IRQB = Runtime(conflicts=("irqbalance.service",))
MODEL = "/srv/gpuhost-drop-model/model.onnx"
MODEL_BYTES = b"gpuhost drop-test model\n" * 64
MODEL_SHA = hashlib.sha256(MODEL_BYTES).hexdigest()
NEW_MODEL_DIRS = ["/srv/gpuhost-drop-model-new", "/srv/gpuhost-drop-model-new/a"]  # absent: the fetch makes them
NEW_MODEL = f"{NEW_MODEL_DIRS[-1]}/model.onnx"


def file_runtime(path: str) -> str:
    return f"if [ -e {path} ]; then stat -c '%a %u %g' {path}; sha256sum < {path} | cut -c1-64; else echo absent; fi"


def missing_runtime(dirs: list[str]) -> str:
    return f"for d in {' '.join(dirs)}; do [ -e $d ] || echo $d; done"


def file_prior(o: dict) -> list[str]:
    p = o["prior"]
    if not p["exists"]:
        return ["absent"]
    # numbers come back from the engine as floats
    return [
        p["mode"],
        str(int(p["uid"])),
        str(int(p["gid"])),
        hashlib.sha256(base64.b64decode(p["content_b64"])).hexdigest(),
    ]


CASES: dict[str, tuple[type[Provider], dict[str, Any], list[str], str]] = {
    # An operator's file (0640, group 4) replaced by gpuhost's (0644 root:root).
    "managed_file": (
        ManagedFileProvider,
        {"path": CONF, "content": "gpuhost=1\n", "mode": "0644", "owner": "0:0"},
        [CONF],
        file_runtime(CONF),
    ),
    # A file that did not exist: destroy removes it.
    "managed_file_new": (
        ManagedFileProvider,
        {"path": NEW_CONF, "content": "gpuhost=2\n", "mode": "0600", "owner": "0:0"},
        [NEW_CONF],
        file_runtime(NEW_CONF),
    ),
    # A file whose directory does not exist: its three missing parents are made (0755 root:root), destroy removes
    # the file and then them; the re-run reports them as made (recorded on the host), not as found.
    "managed_file_dirs": (
        ManagedFileProvider,
        {"path": DEEP_CONF, "content": "gpuhost=3\n", "mode": "0644", "owner": "0:0"},
        [*DEEP_DIRS, DEEP_CONF],
        f"{file_runtime(DEEP_CONF)}; {missing_runtime(DEEP_DIRS)}",
    ),
    # Only the missing one of two parents is made and removed; the operator's directory stays as found.
    "managed_file_kept_dir": (
        ManagedFileProvider,
        {"path": KEPT_CONF, "content": "gpuhost=4\n", "mode": "0644", "owner": "0:0"},
        [KEPT, f"{KEPT}/new", KEPT_CONF],
        f"{file_runtime(KEPT_CONF)}; {missing_runtime([KEPT, f'{KEPT}/new'])}",
    ),
    # A unit written, enabled (wants link) and started; destroy stops, disables and removes it.
    "systemd_service": (
        SystemdServiceProvider,
        {
            "unit": UNIT,
            "files": {
                UNIT_FILE: "[Unit]\nDescription=gpuhost drop test\n\n[Service]\nExecStart=/bin/sleep infinity\n\n"
                "[Install]\nWantedBy=multi-user.target\n"
            },
            "enabled": True,
            "active": True,
            "action": "restart",
            "check": [],
            "user": None,
            "trigger": None,
        },
        [UNIT_FILE, WANTS],
        state_script(UNIT),
    ),
    # An operator's model (0640, group 4) replaced by one streamed from a local path; the copy kept aside is gone
    # after destroy.
    "model_artifact": (
        ModelArtifactProvider,
        {"dest": MODEL, "sha256": MODEL_SHA, "url": None, "path": None},  # path: the test's local file
        [MODEL, prior_path(MODEL), prior_path(MODEL) + ".absent"],
        f"test -e {MODEL} && echo existed || echo absent; sha256sum < {MODEL} | cut -c1-64",
    ),
    # A model where there was none, in directories that did not exist: destroy removes the model, the directories
    # the fetch made and the records (the store's directories they leave empty with them).
    "model_artifact_dirs": (
        ModelArtifactProvider,
        {"dest": NEW_MODEL, "sha256": MODEL_SHA, "url": None, "path": None},
        [*NEW_MODEL_DIRS, NEW_MODEL, prior_path(NEW_MODEL) + ".absent", prior_path(NEW_MODEL) + ".dirs"],
        f"if [ -e {NEW_MODEL} ]; then echo existed; sha256sum < {NEW_MODEL} | cut -c1-64; else echo absent; echo absent; "
        f"fi; {missing_runtime(NEW_MODEL_DIRS)}",
    ),
    # A conflicting unit (irqbalance, enabled and running on the pristine host) stopped and disabled; destroy
    # enables and starts it again.
    "host_runtime": (
        HostRuntimeProvider,
        {"runtime": IRQB.model_dump(mode="json")},
        ["/etc/systemd/system/multi-user.target.wants/irqbalance.service"],
        read_script(IRQB),
    ),
}

PRIORS = {
    "managed_file": file_prior,
    "managed_file_new": file_prior,
    "managed_file_dirs": lambda o: [*file_prior(o), *o["made_dirs"]],
    "managed_file_kept_dir": lambda o: [*file_prior(o), *o["made_dirs"]],
    "systemd_service": lambda o: [f"enabled={o['prior']['enabled']}", f"active={o['prior']['active']}"],
    # The kept copy is the prior (its bytes are checked by destroy's file comparison too).
    "model_artifact": lambda o: ["existed" if o["prior_existed"] else "absent", o["found_sha256"]],
    "model_artifact_dirs": lambda o: ["existed" if o["prior_existed"] else "absent", o["found_sha256"]],
    "host_runtime": lambda o: [
        "unit",
        "irqbalance.service",
        o["prior"]["units"]["irqbalance.service"]["enabled"],
        o["prior"]["units"]["irqbalance.service"]["active"],
    ],
}

SETUP = {
    "managed_file": (
        f"printf 'operator=1\\n' > {CONF} && chmod 640 {CONF} && chown 0:4 {CONF}",
        f"rm -f {CONF}",
    ),
    "managed_file_new": ("true", f"rm -f {NEW_CONF}"),
    "managed_file_dirs": ("true", f"rm -rf {DEEP}"),
    "managed_file_kept_dir": (f"mkdir -m 750 {KEPT} && chown 0:4 {KEPT}", f"rm -rf {KEPT}"),
    # The drop waits for the second locked change (the fetch), not the first (the copy kept aside): the hook only
    # fires once the new model is in place.
    "model_artifact": (
        f"mkdir -p /srv/gpuhost-drop-model && printf 'operator model\\n' > {MODEL} && chmod 640 {MODEL} "
        f"&& chown 0:4 {MODEL} && printf '[ \"$(sha256sum < {MODEL} | cut -c1-64)\" = {MODEL_SHA} ]\\n' "
        "> /run/gpuhost-drop-when",
        "rm -rf /srv/gpuhost-drop-model /run/gpuhost-drop-when",
    ),
    "model_artifact_dirs": (
        f"printf '[ \"$(sha256sum < {NEW_MODEL} 2>/dev/null | cut -c1-64)\" = {MODEL_SHA} ]\\n' > /run/gpuhost-drop-when",
        f"rm -rf {NEW_MODEL_DIRS[0]} /run/gpuhost-drop-when",
    ),
}

# The harness's hook, with one more condition when /run/gpuhost-drop-when exists (a case's own moment).
SLOW_DATE = harness.SLOW_DATE.replace(
    "grep -q ' acquired '; then",
    "grep -q ' acquired ' && { [ ! -e /run/gpuhost-drop-when ] || sh /run/gpuhost-drop-when; }; then",
)
assert SLOW_DATE != harness.SLOW_DATE


@pytest.mark.parametrize("case", sorted(CASES))
def test_drop_after_the_write_then_rerun_then_destroy_restores_the_pristine_host(testhost, case, tmp_path, monkeypatch):
    cls, args, paths, runtime_cmd = CASES[case]
    if case.startswith("model_artifact"):
        src = tmp_path / "model.onnx"
        src.write_bytes(MODEL_BYTES)
        args = {**args, "path": str(src)}
    monkeypatch.setitem(harness.CASES, case, (cls, args, paths, runtime_cmd))
    monkeypatch.setitem(harness.PRIORS, case, PRIORS[case])
    if case in SETUP:
        monkeypatch.setitem(harness.SETUP, case, SETUP[case])
    monkeypatch.setattr(harness, "SLOW_DATE", SLOW_DATE)
    harness.test_drop_after_the_write_then_rerun_then_destroy_restores_the_pristine_host(testhost, case)

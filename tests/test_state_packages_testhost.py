"""Rollback survives a dropped connection, on the emulated GPU server: SystemPackages.

The emulated server has no network, so the test builds a tiny .deb here (dpkg-deb), copies it to the host and serves
it from a flat local apt repository there (/srv/gpuhost-apt, `[trusted=yes]`, its Packages and Release files made
here from the .deb's control fields, size and hash); the provider's own `apt-get install` then works offline. The
same harness as tests/test_state_testhost.py (its test runs the case, with this file's CASES, PRIORS and SETUP):
every SSH session dies after the install ran and before its result came back, the re-run is a create against the
changed host and must report the package as one it installed (missing on the pristine host, recorded there the
first time), and destroy must remove it again. Uses the session's shared `testhost`.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
from pathlib import Path

import pytest

import tests.test_state_testhost as harness
from providers.service_state import SystemPackagesProvider

pytestmark = pytest.mark.testhost

PKG = "gpuhost-drop-test"
MARKER = f"/usr/share/{PKG}/marker"
REPO = "/srv/gpuhost-apt"
LIST = f"/etc/apt/sources.list.d/{PKG}.list"
DEB = f"{PKG}_1.0_all.deb"
# `apt-get update` of this list only: the host's other sources are unreachable, and their lists stay as they are.
UPDATE = (
    f"apt-get update -o Dir::Etc::sourcelist={LIST} -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0 "
    ">/dev/null 2>&1"
)
CONTROL = (
    f"Package: {PKG}\nVersion: 1.0\nArchitecture: all\nMaintainer: gpuhost tests <root@localhost>\n"
    "Description: gpuhost dropped-connection test package\n"
)

CASE = (
    SystemPackagesProvider,
    {"packages": [PKG], "debs_dir": None},
    [MARKER, f"/var/lib/dpkg/info/{PKG}.list"],
    f"dpkg -s {PKG} >/dev/null 2>&1 && echo {PKG}:installed || echo {PKG}:absent",
)


def build_deb(tmp_path: Path) -> bytes:
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(CONTROL)
    (root / MARKER.lstrip("/")).parent.mkdir(parents=True)
    (root / MARKER.lstrip("/")).write_text("gpuhost drop test\n")
    out = tmp_path / DEB
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)], check=True)
    return out.read_bytes()


def repo_setup(deb: bytes) -> tuple[str, str]:
    """The shell lines that put the .deb, its Packages and Release files and the source list on the host, and
    check that apt sees the package; and the lines that take all of it away again."""
    packages = (f"{CONTROL}Filename: ./{DEB}\nSize: {len(deb)}\nSHA256: {hashlib.sha256(deb).hexdigest()}\n\n").encode()
    release = (
        f"Origin: gpuhost-drop-test\nSHA256:\n {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n"
    ).encode()

    def put(data: bytes, path: str) -> str:
        return f"printf %s {base64.b64encode(data).decode()} | base64 -d > {path}"

    setup = " && ".join(
        [
            f"! dpkg -s {PKG} >/dev/null 2>&1",  # the pristine host: not installed
            f"mkdir -p {REPO}",
            put(deb, f"{REPO}/{DEB}"),
            put(packages, f"{REPO}/Packages"),
            put(release, f"{REPO}/Release"),
            f"echo 'deb [trusted=yes] file:{REPO} ./' > {LIST}",
            UPDATE,
            f"apt-cache show {PKG} >/dev/null",
        ]
    )
    teardown = (
        f"dpkg -s {PKG} >/dev/null 2>&1 && dpkg -r {PKG} >/dev/null; "
        f"rm -rf {REPO} {LIST} /var/lib/apt/lists/*gpuhost-apt*"
    )
    return setup, teardown


def test_packages_drop_after_the_install_then_rerun_then_destroy_restores_the_pristine_host(
    testhost, tmp_path, monkeypatch
):
    setup, teardown = repo_setup(build_deb(tmp_path))
    monkeypatch.setitem(harness.CASES, "packages", CASE)
    # What the re-run reports: one value whatever `installed` holds, so an empty list cannot pass as a prefix.
    monkeypatch.setitem(
        harness.PRIORS, "packages", lambda o: [f"{PKG}:absent" if o["installed"] == [PKG] else f"{PKG}:found"]
    )
    monkeypatch.setitem(harness.SETUP, "packages", (setup, teardown))
    try:
        # the harness's snapshot after destroy runs `dpkg -s` (the runtime value): the package is removed again
        harness.test_drop_after_the_write_then_rerun_then_destroy_restores_the_pristine_host(testhost, "packages")
    finally:
        testhost.ssh(teardown, check=False)
    # the repository the test made is gone too
    assert testhost.ssh(f"ls -d {REPO} {LIST} /var/lib/apt/lists/*gpuhost-apt* 2>/dev/null || true").stdout == ""

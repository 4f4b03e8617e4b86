"""A manifest of a host's filesystem where gpuhost leaves its traces: every path under /etc, /var/lib/gpuhost and
/boot, directories included, with its type, mode, owner and sha256 (a symlink's target), read in one SSH round trip.
The dev stack's end-to-end test takes one before the first `up` and one after `destroy` and a reboot: they must be
equal, so a file, a link or an empty directory that gpuhost (or a tool on its request) left behind fails it.

Usage::

    before = manifest(th)                 # {"/etc/default/grub": "f 644 0 0 <sha256>", "/etc/mtab": "l 777 0 0 -> ..."}
    ...
    assert differences(before, manifest(th)) == []
"""

from __future__ import annotations

import fnmatch

ROOTS = ("/etc", "/var/lib/gpuhost", "/boot")

# What the OS itself rewrites across a reboot whatever gpuhost does; nothing else may differ. Empty: a plain reboot of
# the emulated server without gpuhost (`python -m tests.hostmanifest`) changed none of its 814 paths (random seeds,
# logs, machine-id, ld.so.cache and resolv.conf live elsewhere or stay as they are). Add one only with that proof.
EXCLUDED: tuple[str, ...] = ()

# Constant text: the roots are fixed, no value from outside reaches it. `find` of a missing root (no
# /var/lib/gpuhost) prints nothing for it.
_SCRIPT = (
    "cd / && echo @@meta && find " + " ".join(ROOTS) + " -printf '%y\\t%m\\t%U\\t%G\\t%p\\t%l\\n' 2>/dev/null; "
    "echo @@sha && find " + " ".join(ROOTS) + " -type f -print0 2>/dev/null | xargs -0 -r sha256sum; true"
)


def parse(out: str) -> dict[str, str]:
    """{path: "<type> <mode> <uid> <gid> <sha256 | -> target | ''>"} from the script's output."""
    meta, sha = out.split("@@meta\n", 1)[1].split("@@sha\n", 1)
    sums = {}
    for line in sha.splitlines():
        digest, _, path = line.partition("  ")
        sums[path] = digest
    res = {}
    for line in meta.splitlines():
        kind, mode, uid, gid, path, target = line.split("\t", 5)
        what = f"-> {target}" if kind == "l" else sums.get(path, "")
        res[path] = f"{kind} {mode} {uid} {gid} {what}".rstrip()
    return res


def excluded(path: str) -> bool:
    return any(fnmatch.fnmatchcase(path, pat) for pat in EXCLUDED)


def manifest(th) -> dict[str, str]:
    """Every path under ROOTS on the host `th` (a TestHost), but the EXCLUDED ones."""
    return {p: v for p, v in parse(th.ssh(_SCRIPT, timeout=600).stdout).items() if not excluded(p)}


def differences(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """One line per path that differs: gone, new, or changed (type, mode, owner, content or link target)."""
    out = []
    for p in sorted(set(before) | set(after)):
        a, b = before.get(p), after.get(p)
        if a != b:
            out.append(f"{p}: {a or 'absent'} -> {b or 'absent'}")
    return out


def main() -> None:
    """Boot a fresh emulated server, take a manifest, reboot it (nothing of gpuhost runs), take another and print
    what differs, without EXCLUDED: the proof that an exclusion is the OS's own doing."""
    import tempfile
    from pathlib import Path

    from testbed.testhost.image import ensure_image
    from testbed.testhost.machine import SshKey, TestHost

    with tempfile.TemporaryDirectory() as d:
        th = TestHost(ensure_image(), Path(d) / "host", SshKey.generate(Path(d) / "key"), name="manifest")
        try:
            th.start()
            th.ssh("systemctl is-system-running --wait >/dev/null 2>&1 || true", timeout=900)
            a = parse(th.ssh(_SCRIPT, timeout=600).stdout)
            th.reboot()
            th.ssh("systemctl is-system-running --wait >/dev/null 2>&1 || true", timeout=900)
            b = parse(th.ssh(_SCRIPT, timeout=600).stdout)
        finally:
            th.stop()
    diff = differences(a, b)
    print(f"{len(a)} paths; {len(diff)} differ across a plain reboot:", *diff, sep="\n")


if __name__ == "__main__":
    main()

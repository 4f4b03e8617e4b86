"""Rollback survives a dropped connection, on the emulated GPU server: LibvirtDomain.

LibvirtDomain talks to libvirtd (tunnelled over the project's SSH), not through the host lock, so the drop point is
a libvirt qemu hook instead of tests/test_state_testhost.py's `date` hook: the domain's `start` hook waits while
the test kills every SSH session, i.e. after the overlay, the seed ISO and `define`, inside `start`, and before the
result; libvirtd then finishes the start, so the re-run finds the domain defined and running.
The re-run is a create against a host that already runs the domain: it must adopt that one domain (its owner mark),
not fail with "already exists" nor define a second one, and report what the first create found (`disk_created`
true); destroy must leave no domain and none of the files it made (overlay, seed ISO, definition, autostart link,
its pristine records, libvirt's autostart directory when it did not exist before). A second case puts an operator's
disk and a file at the seed ISO path there first (0640, owner 0:4, content of their own) and another domain's
autostart link: create replaces only the seed ISO, and destroy with `keep_disk: false` leaves both exactly as
found, and the autostart directory with the other link in it; the same case with both paths empty and no autostart
directory leaves them empty and no directory. Uses the session's shared `testhost`.
"""

from __future__ import annotations

import base64
import time

import pytest

from plans.domain_xml import DomainSpec, Topology
from providers.libvirt_domain import AUTOSTART_DIR, LibvirtDomainProvider
from testbed.provider_server import ProviderError, ProviderServer
from tests.dropharness import drop_first_apply
from tests.test_state_testhost import snapshot

pytestmark = pytest.mark.testhost

NAME = "gpuhost-drop-vm"
POOL = "gpuhost-drop"
DIR = "/var/lib/libvirt/gpuhost-drop"
DISK = f"{DIR}/{NAME}.qcow2"
SEED = f"{DIR}/{NAME}-seed.iso"
HOOK = "/etc/libvirt/hooks/qemu"
# Test hook: the armed domain's `start begin` operation (defined, its overlay and seed ISO made; libvirtd runs the
# hook before launching QEMU and waits for it) waits so the drop lands after the change and before the result; the
# start then completes on the host.
HOOK_SCRIPT = f"""#!/bin/sh
if [ "$1" = {NAME} ] && [ "$2" = start ] && [ "$3" = begin ] && [ -e /run/gpuhost-drop-armed ]; then
  rm -f /run/gpuhost-drop-armed; touch /run/gpuhost-drop-now; sleep 90
fi
exit 0
"""
RECORDS = "/var/lib/gpuhost/pristine"
PATHS = [
    f"/etc/libvirt/qemu/{NAME}.xml",
    f"/etc/libvirt/qemu/autostart/{NAME}.xml",
    f"/var/lib/libvirt/qemu/nvram/{NAME}_VARS.fd",
    DISK,
    SEED,
    # the records of the seed ISO path and the disk: made by create, gone after destroy
    f"{RECORDS}/files{SEED}",
    f"{RECORDS}/files{SEED}.absent",
    f"{RECORDS}/files{SEED}.owner",
    f"{RECORDS}/runtime/libvirt-disk{DISK}",
    f"{RECORDS}/runtime/libvirt-disk{DISK}.owner",
    # made by libvirtd when the domain is set to autostart (when it was missing): gone after destroy
    AUTOSTART_DIR,
    f"{RECORDS}/runtime/libvirt-domain/{NAME}/missing-dirs",
]
OTHER_LINK = f"{AUTOSTART_DIR}/gpuhost-operator-vm.xml"
RUNTIME = f"echo domains; virsh list --all --name | grep -c '^{NAME}$'; virsh domstate {NAME} 2>/dev/null || echo none"
SETUP = (
    "set -e; mkdir -p /etc/libvirt/hooks " + DIR + f"; cat > {HOOK} && chmod 755 {HOOK}; systemctl restart libvirtd; "
    # the first case on a host without an autostart directory (one that earlier tests left empty goes)
    f"rmdir {AUTOSTART_DIR} 2>/dev/null || true; "
    f"virsh pool-define-as {POOL} dir --target {DIR} >/dev/null; virsh pool-start {POOL} >/dev/null; "
    f"qemu-img create -q -f qcow2 {DIR}/base.qcow2 64M"
)
# An operator's own disk (a qcow2 holding their data) and a file at the seed ISO path, 0640 root:adm (0:4).
OPERATOR_FILES = (
    f"set -e; printf 'operator disk data\\n' > {DIR}/op.raw; truncate -s 1M {DIR}/op.raw; "
    f"qemu-img convert -q -f raw -O qcow2 {DIR}/op.raw {DISK}; rm -f {DIR}/op.raw; "
    f"printf 'an operator file at the seed ISO path\\n' > {SEED}; chmod 0640 {DISK} {SEED}; chown 0:4 {DISK} {SEED}; "
    f"mkdir -p {AUTOSTART_DIR}; ln -sfn /etc/libvirt/qemu/gpuhost-operator-vm.xml {OTHER_LINK}"
)
TEARDOWN = (
    f"virsh destroy {NAME} >/dev/null 2>&1; virsh undefine --nvram {NAME} >/dev/null 2>&1; "
    f"virsh pool-destroy {POOL} >/dev/null 2>&1; virsh pool-undefine {POOL} >/dev/null 2>&1; rm -rf {DIR} {HOOK}; "
    f"rm -rf {RECORDS}/files{DIR} {RECORDS}/runtime/libvirt-disk{DIR}; "
    f"rm -f /run/gpuhost-drop-armed /run/gpuhost-drop-now {OTHER_LINK}; rmdir {AUTOSTART_DIR} 2>/dev/null; "
    "systemctl restart libvirtd"
)


def domain_inputs(testhost) -> dict:
    # A firmware-only guest (SeaBIOS, no bootable disk): it stays running and ignores ACPI, so destroy's shutdown
    # ends in `virsh destroy` after shutdown_timeout.
    spec = DomainSpec(
        name=NAME,
        domain_type="qemu",
        cpu_mode="maximum",
        memory_mib=64,
        page_size="4K",
        vcpupin=(0,),
        topology=Topology(),
        loader=None,
        disk=DISK,
        seed_iso=SEED,
    )
    return {
        "host": testhost.host_spec().model_dump(mode="json"),
        "domain": spec.model_dump(mode="json"),
        "storage": {"base_image": f"{DIR}/base.qcow2", "capacity_gib": 1},
        "cloud_init": {"user": "ops", "ssh_authorized_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI ops@x"]},
        "keep_disk": False,
        "shutdown_timeout": 5,
        "owner_tag": "test/libvirt_domain",
        "version": LibvirtDomainProvider.VERSION,
    }


def test_libvirt_domain_drop_after_start_then_rerun_adopts_then_destroy_restores(testhost):
    t0 = time.monotonic()
    testhost.ssh(SETUP, input=HOOK_SCRIPT)
    pristine = snapshot(testhost, PATHS, RUNTIME)
    inputs = domain_inputs(testhost)
    srv = ProviderServer({f"gpuhost:{testhost.key_name}": testhost.private_key_pem}).__enter__()
    r = srv.resource(LibvirtDomainProvider(), "gpuhost:vm:LibvirtDomain", "drop-libvirt")
    try:
        # The drop lands inside `start`: every SSH session dies (the libvirt tunnel with them); then the hook's wait
        # ends and libvirtd finishes the start on the host (a client gone does not cancel it), as after a real drop.
        (changed, uuid), errors = drop_first_apply(
            testhost,
            r,
            inputs,
            observe=lambda: (snapshot(testhost, PATHS, RUNTIME), testhost.ssh(f"virsh domuuid {NAME}").stdout.strip()),
            wait_s=300,
            reached="the start never reached its hook",
            join_s=120,
        )
        print(f"\ndropped create: {errors}")

        assert changed != pristine, "the drop must land after the change"
        assert all(changed["files"][p] != pristine["files"][p] for p in (DISK, SEED, PATHS[0], PATHS[1])), changed
        left = snapshot(testhost, PATHS, RUNTIME)
        print(f"left by the dropped run: {left['runtime']}")
        assert left["runtime"][:2] == ["domains", "1"], left

        op, outs = r.up(inputs)
        print(f"re-run: {op} {outs.get('uuid')} {outs.get('state')}")
        assert op == "create" and outs["uuid"] == uuid and outs["state"] == "running", outs
        # what the first create found (from its records on the host), not the overlay and seed it left
        assert outs["disk_created"] is True and outs["disk_found"] == "absent", outs
        assert outs["seed_found"]["exists"] is False and outs["seed_uploaded"] is True, outs
        assert outs["made_dirs"] == ([AUTOSTART_DIR] if pristine["files"][AUTOSTART_DIR] == "ABSENT\n" else [])
        after = snapshot(testhost, PATHS, RUNTIME)
        assert after["runtime"] == ["domains", "1", "running"], after  # adopted: still one domain
        # the overlay the dropped run made is kept (same bytes; libvirt's DAC labelling owns it while the VM runs)
        assert after["files"][DISK].splitlines()[1] == changed["files"][DISK].splitlines()[1], after
        r.destroy()
        assert snapshot(testhost, PATHS, RUNTIME) == pristine
    finally:
        if r.id is not None:  # a failed assertion must not leave the shared host changed for the next tests
            try:
                r.destroy()
            except ProviderError as e:  # TEARDOWN below removes the domain; the first failure is the one to see
                print(f"destroy after the failure: {e}")
        srv.__exit__(None, None, None)
        testhost.ssh(TEARDOWN, check=False)
        print(f"\nstate drop case libvirt_domain: {round(time.monotonic() - t0, 1)} s")


@pytest.mark.parametrize("found", ["operator-files", "empty-paths"])
def test_libvirt_domain_destroy_puts_back_the_disk_and_seed_iso_path_as_found(testhost, found):
    t0 = time.monotonic()
    testhost.ssh(SETUP, input=HOOK_SCRIPT)
    if found == "operator-files":
        testhost.ssh(OPERATOR_FILES)
    pristine = snapshot(testhost, PATHS, RUNTIME)
    print(f"\nbefore: disk {pristine['files'][DISK]!r}, seed {pristine['files'][SEED]!r}")
    srv = ProviderServer({f"gpuhost:{testhost.key_name}": testhost.private_key_pem}).__enter__()
    r = srv.resource(LibvirtDomainProvider(), "gpuhost:vm:LibvirtDomain", f"found-{found}")
    try:
        op, outs = r.up(domain_inputs(testhost))  # keep_disk: false
        assert op == "create" and outs["state"] == "running", outs
        up = snapshot(testhost, PATHS, RUNTIME)
        assert up["runtime"] == ["domains", "1", "running"], up
        assert up["files"][SEED] != pristine["files"][SEED], "create wrote the seed ISO"
        assert "CIDATA" in testhost.ssh(f"head -c 40000 {SEED}").stdout.upper()
        if found == "operator-files":
            assert outs["disk_created"] is False and outs["disk_found"] == "640 0 4", outs
            seed = outs["seed_found"]
            assert (seed["exists"], seed["mode"], seed["uid"], seed["gid"]) == (True, "640", 0, 4), seed
            assert base64.b64decode(seed["content_b64"]) == b"an operator file at the seed ISO path\n"
            # the operator's disk is the domain's disk, its data untouched
            assert up["files"][DISK].splitlines()[1] == pristine["files"][DISK].splitlines()[1], up
            assert outs["made_dirs"] == [], outs  # the operator's domain had made it
        else:
            assert outs["disk_created"] is True and outs["disk_found"] == "absent", outs
            assert outs["seed_found"]["exists"] is False, outs
            assert up["files"][DISK] != "ABSENT\n", "create made the overlay"
            assert pristine["files"][AUTOSTART_DIR] == "ABSENT\n", pristine
            assert up["files"][AUTOSTART_DIR].startswith("directory "), up
            assert outs["made_dirs"] == [AUTOSTART_DIR], outs
        r.destroy()
        after = snapshot(testhost, PATHS, RUNTIME)
        print(f"after destroy: disk {after['files'][DISK]!r}, seed {after['files'][SEED]!r}")
        assert after == pristine
    finally:
        if r.id is not None:
            try:
                r.destroy()
            except ProviderError as e:
                print(f"destroy after the failure: {e}")
        srv.__exit__(None, None, None)
        testhost.ssh(TEARDOWN, check=False)
        print(f"\nfound case libvirt_domain ({found}): {round(time.monotonic() - t0, 1)} s")

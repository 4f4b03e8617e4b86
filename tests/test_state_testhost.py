"""Rollback survives a dropped connection, on the emulated GPU server, for every provider that changes the host.

The host drops every SSH session after a provider's change ran and before its result came back (a test hook
makes the lock's closing `date` wait, and the test kills the sessions meanwhile). The engine then has no state
for the resource, so the re-run is a create again, reading a host that is already changed. The records on the host
(pristine/) keep the real originals: the re-run reports them as priors, and destroy puts files, modes,
owners and runtime values back exactly as the pristine host had them. Uses the session's shared `testhost`.
"""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

import pytest

from facts.cpulist import format_cpulist
from providers.base import Provider
from providers.hugepages import Hugepages2MProvider
from providers.irq import IrqIsolationProvider
from providers.kernel_cmdline import KernelCmdlineProvider
from providers.sriov import SriovVfsProvider
from providers.sysctls import SysctlsProvider
from providers.triton_repository import TritonModelRepositoryProvider, repository_inputs
from providers.tuning import HostTuningProvider
from testbed.provider_server import ProviderError, ProviderServer
from testbed.testhost.machine import NVME_PF
from tests.dropharness import assert_no_records, drop_first_apply, undo

pytestmark = pytest.mark.testhost

# Test hook (installed for the test only): the epilogue of a locked change, i.e. after the write and before the
# result, waits (long: the test's own SSH calls are slow under TCG) so the drop lands exactly there.
SLOW_DATE = r"""#!/bin/sh
if [ "$1" = "+%s.%N" ] && [ -e /run/gpuhost-drop-armed ] && tail -n1 /run/gpuhost.lock.log 2>/dev/null | grep -q ' acquired '; then
  rm -f /run/gpuhost-drop-armed; touch /run/gpuhost-drop-now; sleep 90
fi
exec /usr/bin/date "$@"
"""

UNIT = f"gpuhost-sriov-{NVME_PF.replace(':', '-')}.service"
REPO = "/srv/gpuhost-drop-repo"

# VfioBinding records its drivers the same way; its case is not here yet: update-initramfs under TCG outlasts the
# test's wait for the epilogue (240 s).
CASES: dict[str, tuple[type[Provider], dict[str, Any], list[str], str]] = {
    "sysctls": (
        SysctlsProvider,
        {"values": {"net.core.somaxconn": "3333", "vm.swappiness": "7"}},
        ["/etc/sysctl.d/99-gpuhost.conf"],
        "sysctl -n net.core.somaxconn vm.swappiness",
    ),
    "tuning": (
        HostTuningProvider,
        {"tuned_profile": "throughput-performance"},
        ["/etc/tuned/active_profile", "/etc/tuned/profile_mode"],
        "cat /etc/tuned/active_profile",
    ),
    # irqbalance is stopped for this case (SETUP): its own rebalancing would move the IRQs under the comparison.
    "irq": (
        IrqIsolationProvider,
        {"banned_cpus": [2, 3, 4, 5, 6, 7], "pin": [{"match": "nvme0q", "cpus": [0, 1]}]},
        ["/etc/default/irqbalance", "/etc/sysconfig/irqbalance"],
        "for q in $(grep nvme0q /proc/interrupts | cut -d: -f1); do cat /proc/irq/$q/smp_affinity_list; done",
    ),
    # No reboot: the file and update-grub's output are the change; the running kernel's line must not move.
    "kernel_cmdline": (
        KernelCmdlineProvider,
        {"add": ["gpuhost_drop_test=1"], "remove": [], "acknowledged": [], "family": "debian"},
        ["/etc/default/grub", "/boot/grub/grub.cfg"],
        "sha256sum < /etc/default/grub | cut -c1-64; cat /proc/cmdline",
    ),
    # The SR-IOV NVMe PF: 2 VFs on vfio-pci (driverctl files), host-driver autoprobe off, persistent at boot (unit +
    # wants link). With vfio off, nvme would probe each VF and wait out its "not ready" timeout.
    "sriov": (
        SriovVfsProvider,
        {
            "pf": NVME_PF,
            "num_vfs": 2,
            "numa_node": 1,
            "numa_policy": "require",
            "vfio": True,
            "vfs": [],
            "irq_cpus": [],
            "persist": True,
        },
        [
            f"/etc/systemd/system/{UNIT}",
            f"/etc/systemd/system/multi-user.target.wants/{UNIT}",
            "/etc/driverctl.d/pci-0000:82:00.1",
            "/etc/driverctl.d/pci-0000:82:00.2",
        ],
        f"cat /sys/bus/pci/devices/{NVME_PF}/sriov_numvfs /sys/bus/pci/devices/{NVME_PF}/sriov_drivers_autoprobe",
    ),
    # An operator's config.pbtxt (0600, group 4) is replaced, a version directory is created; destroy puts the file
    # back and removes only the directory it made.
    "triton_repository": (
        TritonModelRepositoryProvider,
        {"root": REPO, **repository_inputs({"m/config.pbtxt": b'name: "m"\n', "m/1/model.py": b"# stand-in\n"})},
        [REPO, f"{REPO}/m", f"{REPO}/m/config.pbtxt", f"{REPO}/m/1", f"{REPO}/m/1/model.py"],
        f"sha256sum < {REPO}/m/config.pbtxt | cut -c1-64",
    ),
    "hugepages": (
        Hugepages2MProvider,
        {"per_node": {"1": 32}},
        [
            "/etc/systemd/system/gpuhost-hugepages.service",
            "/etc/systemd/system/multi-user.target.wants/gpuhost-hugepages.service",
        ],
        "cat /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages; "
        "systemctl is-enabled gpuhost-hugepages.service 2>/dev/null || true",
    ),
}

PRIORS = {
    "irq": lambda o: [
        format_cpulist(int(c) for c in o["prior_affinity"][i]) for i in sorted(o["prior_affinity"], key=int)
    ],
    "sriov": lambda o: [str(int(o["prior_numvfs"])), "1" if o["prior_autoprobe"] else "0"],
    "triton_repository": lambda o: [
        hashlib.sha256(base64.b64decode(o["prior"]["m/config.pbtxt"]["content_b64"])).hexdigest()
    ],
    "kernel_cmdline": lambda o: [hashlib.sha256(base64.b64decode(o["prior"]["content_b64"])).hexdigest()],
    "tuning": lambda o: [o["prior_profile"]] if o["prior_profile"] else [],  # no active profile: nothing
    "sysctls": lambda o: [o["prior_values"]["net.core.somaxconn"], o["prior_values"]["vm.swappiness"]],
    "hugepages": lambda o: [str(int(o["prior_counts"]["1"]))],  # numbers come back from the engine as floats
}


SETUP = {
    "irq": ("systemctl stop irqbalance", "systemctl start irqbalance"),
    "triton_repository": (
        f"mkdir -p {REPO}/m && printf 'operator config\\n' > {REPO}/m/config.pbtxt && chmod 600 {REPO}/m/config.pbtxt "
        f"&& chown 0:4 {REPO}/m/config.pbtxt",
        f"rm -rf {REPO}",
    ),
}
# update-grub alone takes 1-2 min under TCG on a loaded 2-core machine; SriovVfs reads the host three times before
# its change (check, facts, records) and waits for udev and driverctl.
WAIT = {"kernel_cmdline": 480, "sriov": 480}
TIMES: dict[str, float] = {}


def snapshot(testhost, paths: list[str], runtime_cmd: str) -> dict:
    """Files (type, mode, owner, hash; a symlink as a link) and runtime values, in one round trip (each SSH call
    costs seconds under TCG)."""
    per_file = [
        f"echo @@{p}; if [ -e '{p}' ] || [ -L '{p}' ]; then stat -c '%F %a %u %g' '{p}'; sha256sum < '{p}' 2>/dev/null; "
        "else echo ABSENT; fi"
        for p in paths
    ]
    out = testhost.ssh("\n".join([*per_file, "echo @@runtime", runtime_cmd])).stdout
    sections = dict(part.split("\n", 1) if "\n" in part else (part, "") for part in out.split("@@")[1:])
    return {"files": {p: sections[p] for p in paths}, "runtime": sections["runtime"].split()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_drop_after_the_write_then_rerun_then_destroy_restores_the_pristine_host(testhost, case):
    cls, args, paths, runtime_cmd = CASES[case]
    key = testhost.key_name
    t0 = time.monotonic()
    setup, teardown = SETUP.get(case, ("true", "true"))
    testhost.ssh(setup)
    pristine = snapshot(testhost, paths, runtime_cmd)
    inputs = {
        "host": testhost.host_spec().model_dump(mode="json"),
        **args,
        "owner_tag": f"test/{case}",
        "version": cls.VERSION,
    }
    srv = ProviderServer({f"gpuhost:{key}": testhost.private_key_pem}).__enter__()
    r = srv.resource(cls(), f"gpuhost:host:{cls.__name__}", f"drop-{case}")
    try:
        testhost.ssh("cat > /usr/local/sbin/date && chmod +x /usr/local/sbin/date", input=SLOW_DATE)
        changed, errors = drop_first_apply(
            testhost, r, inputs, observe=lambda: snapshot(testhost, paths, runtime_cmd), wait_s=WAIT.get(case, 240)
        )
        testhost.ssh("rm -f /usr/local/sbin/date")
        assert changed != pristine, "the drop must land after the change"
        assert isinstance(errors[0], ProviderError) and testhost.name in errors[0].details

        op, outs = r.up(inputs)
        assert op == "create"
        # The priors are the pristine host's, not the values the dropped run had already set.
        assert PRIORS[case](outs) == pristine["runtime"][: len(PRIORS[case](outs))], outs
        assert snapshot(testhost, paths, runtime_cmd)["runtime"] == changed["runtime"]
        r.destroy()
        assert snapshot(testhost, paths, runtime_cmd) == pristine
        # this resource's records are gone with it
        assert_no_records(testhost, f"test/{case}")
    finally:
        undo(testhost, r, srv)
        testhost.ssh(teardown, check=False)
        TIMES[case] = round(time.monotonic() - t0, 1)
        print(f"\nstate drop case {case}: {TIMES[case]} s")

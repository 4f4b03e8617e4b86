"""Load-time refusal of two resources that would write one host path, on the components' own children lists.

`stacks.paths.collisions` reads what each child writes (`components.wiring.writes`: a ManagedFile's path, a
SystemdService's or MonitoringFiles' files, a model repository's files, a host-prep provider's fixed files) and
reports one line per pair of config paths. The whole-program case (two gateways on one host, 0 resources
registered) is in tests/test_bad_input.py.
"""

from __future__ import annotations

from components import passthrough_host
from components.wiring import Child, writes
from plans.sysctls import FILE as SYSCTL_FILE
from providers.managed_file import ManagedFile
from providers.monitoring import MonitoringFiles
from stacks.args import passthrough_args
from stacks.paths import collisions
from stacks.program import Planned
from stacks.schema import Host

H1 = {"name": "h1", "address": "10.0.0.1"}


def host(**over) -> Host:
    return Host.model_validate(
        {
            "name": "h1",
            "ssh": {"address": "10.0.0.1", "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE9IHGPsR3Dy"},
            "topology": {"sockets": 1, "cores_per_socket": 4, "threads_per_core": 1, "memory_gib_per_node": 8},
            "reserved_cpus": "0",
            "gpus": [{"address": "0000:81:00.0"}],
            "hugepages": {"size": "2M", "per_node": {0: 64}},
            "tuning": {"sysctls": {"net.core.somaxconn": "4096"}},
            **over,
        }
    )


def prep(where: str = "fleet.hosts[0]") -> Planned:
    h = host()
    return Planned(
        passthrough_host.PassthroughHost, h.name, None, where, passthrough_host.children(h.name, passthrough_args(h))
    )


def files(where: str, name: str, *kids: Child) -> Planned:
    return Planned(object, name, None, where, list(kids))


def managed(suffix: str, path: str, machine: dict = H1) -> Child:
    return Child(suffix, ManagedFile, {"host": machine, "path": path, "content": "x"})


def test_host_prep_writes_its_fixed_files():
    w = {x.path for x in writes("h1", prep().children)}
    assert {"/etc/default/grub", SYSCTL_FILE, "/etc/driverctl.d/pci-0000:81:00.0"} <= w
    assert "/etc/systemd/system/gpuhost-hugepages.service" in w and "/etc/default/irqbalance" in w


def test_two_managed_files_with_one_path():
    lines = collisions(
        [
            files("fleet.a", "a", managed("conf", "/etc/nginx/nginx.conf")),
            files("fleet.b", "b", managed("conf", "/etc/nginx/nginx.conf")),
        ]
    )
    assert lines == [
        "fleet.b: would write /etc/nginx/nginx.conf on h1, as fleet.a does (one file has one owner: each would "
        "undo the other's change and restore its own original on destroy); give each its own path or machine"
    ]


def test_same_path_on_two_machines_is_fine():
    h2 = {"name": "h2", "address": "10.0.0.2"}
    assert (
        collisions([files("fleet.a", "a", managed("c", "/etc/x")), files("fleet.b", "b", managed("c", "/etc/x", h2))])
        == []
    )


def test_a_monitoring_file_colliding_with_a_host_prep_file():
    mon = Child("files", MonitoringFiles, {"host": H1, "files": {"/etc/gpuhost/p.yml": "", SYSCTL_FILE: "x"}})
    lines = collisions([prep(), files("fleet.monitoring", "monitoring", mon)])
    assert len(lines) == 1 and lines[0].startswith(
        f"fleet.monitoring: would write {SYSCTL_FILE} on h1, as fleet.hosts[0] does (one file has one owner"
    )


def test_two_resources_of_one_component():
    lines = collisions([files("fleet.services[0]", "svc", managed("a", "/etc/x"), managed("b", "/etc/x"))])
    assert lines == [
        "fleet.services[0]: would write /etc/x on h1, as another of its resources does (one file has one owner: "
        "each would undo the other's change and restore its own original on destroy); serve both models from one "
        "service"
    ]


def test_two_vms_with_one_disk_and_two_nics_on_one_pf():
    from components import pinned_vm, sriov_nic
    from components.pinned_vm import PinnedVMArgs
    from components.sriov_nic import SriovNicArgs
    from plans import placement as pl

    spec = passthrough_args(host()).host
    box = pl.Host.uniform(sockets=1, cores_per_socket=4, threads_per_core=1, memory_mib=8192, reserved_cpus=[0])
    req = pl.VmRequest(name="tenant-a", vcpus=2, memory_mib=1024, page_size="4K", thread_policy="prefer")
    vm = PinnedVMArgs(host=spec, placement=pl.place(box, [req]).vm("tenant-a"))
    nic = SriovNicArgs(host=spec, pf="0000:41:00.0", num_vfs=2)
    lines = collisions(
        [
            Planned(object, "h1-a", None, "fleet.hosts[0].vms[0]", pinned_vm.children("h1-a", vm)),
            Planned(object, "h1-b", None, "fleet.hosts[0].vms[1]", pinned_vm.children("h1-b", vm)),
            Planned(object, "h1-sriov-0", None, "fleet.hosts[0].sriov[0]", sriov_nic.children("h1-sriov-0", nic)),
            Planned(object, "h1-sriov-1", None, "fleet.hosts[0].sriov[1]", sriov_nic.children("h1-sriov-1", nic)),
        ]
    )
    assert [ln.split(" (one file")[0] for ln in lines] == [
        "fleet.hosts[0].vms[1]: would write /var/lib/libvirt/images/tenant-a.qcow2, "
        "/var/lib/libvirt/qemu/nvram/tenant-a_VARS.fd on h1, as fleet.hosts[0].vms[0] does",
        "fleet.hosts[0].sriov[1]: would write /etc/systemd/system/gpuhost-sriov-0000-41-00.0.service on h1, as "
        "fleet.hosts[0].sriov[0] does",
    ]

"""A change of how a host is reached (SSH port, host key, user) is an update of every resource on it, not a
replacement: a replacement would delete (restore) everything on the machine and create it again."""

from providers.base import HostProvider
from providers.libvirt_domain import LibvirtDomainProvider
from providers.sriov import SriovVfsProvider

HOST = {"name": "gpu-01", "address": "10.0.0.5", "port": 22, "user": "root", "host_key": "ssh-ed25519 AAAA"}


def test_port_change_is_an_update_and_another_machine_a_replacement():
    for prov in (HostProvider(), LibvirtDomainProvider(), SriovVfsProvider()):
        olds = {"host": HOST, "x": 1}
        d = prov.diff("id", olds, {"host": {**HOST, "port": 2222}, "x": 1})
        assert d.changes and not d.replaces, type(prov).__name__
        d = prov.diff("id", olds, {"host": {**HOST, "name": "gpu-02"}, "x": 1})
        assert "host" in (d.replaces or []), type(prov).__name__

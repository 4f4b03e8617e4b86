"""LibvirtDomain through the SDK's provider server, on libvirt's `test:///default` driver (fast XML lifecycle).

The test driver keeps its state inside the provider process (the provider pools its libvirt connection per
process, as the engine's one provider process would), so every check below reads back through the provider.
The same lifecycle against a real libvirtd runs on the emulated host (tests/test_libvirt_testhost.py).
The records of the seed ISO path and the disk (through `host`) are driven against a real local sshd at the end;
the whole create/destroy with them runs on the emulated host (tests/test_state_libvirt_testhost.py).
"""

import os

import libvirt
import pytest

import pristine
from access import keys, ssh
from access.errors import HostError
from facts.files import FileState
from plans.domain_xml import DomainSpec, Topology
from pristine import ROOT, Change, Record
from providers.libvirt_domain import AUTOSTART_DIR, DomainInputs, LibvirtDomainProvider, _lookup, open_libvirt
from testbed.provider_server import ProviderError, ProviderServer

TYPE = "gpuhost:vm:LibvirtDomain"


def spec(**kw) -> dict:
    base = dict(
        name="tenant-a",
        domain_type="test",
        memory_mib=2048,
        page_size="2M",
        vcpupin=(0, 4, 1, 5),
        emulatorpin=(2, 6),
        iothreadpin=((3,),),
        numa_node=0,
        topology=Topology(cores=2, threads=2),
        disk="/default-pool/tenant-a.qcow2",
        seed_iso="/default-pool/tenant-a-seed.iso",
        gpus=("0000:65:00.0", "0000:65:00.1"),
        vfs=("0000:41:02.0",),
        network="default",
    )
    base.update(kw)
    return DomainSpec(**base).model_dump(mode="json")


def inputs(**kw) -> dict:
    d = {
        "uri": "test:///default",
        "domain": spec(**kw.pop("domain", {})),
        "storage": {"base_image": "/default-pool/jammy.qcow2", "capacity_gib": 10},
        "cloud_init": {"user": "ops", "ssh_authorized_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI x@y"]},
        "shutdown_timeout": 5,
        "version": LibvirtDomainProvider.VERSION,
    }
    d.update(kw)
    return d


@pytest.fixture
def server():
    with ProviderServer() as srv:
        yield srv


def _read_by_uuid(server, outs: dict) -> dict:
    """What a refresh of tenant-a with these last outputs reads (its domain looked up by their uuid)."""
    gone = server.resource(LibvirtDomainProvider(), TYPE, "tenant-a")
    gone.id, gone.inputs, gone.outputs = outs["uuid"], inputs(), outs
    return gone.read()


def test_create_read_same_live_update_restart_update_delete(server):
    r = server.resource(LibvirtDomainProvider(), TYPE, "tenant-a")
    op, outs = r.up(inputs())
    assert op == "create" and outs["state"] == "running" and outs["disk_created"] is True
    assert outs["seed_uploaded"] is False  # the test driver cannot upload volumes; the emulated host does
    first_run = outs["domid"]
    refreshed = r.refresh()
    assert refreshed["domain"] == r.inputs["domain"], "live XML reads back as the inputs: no drift"
    assert r.preview(inputs()).changes is False

    # pins only: applied live, the domain keeps running (same run id)
    op, outs = r.up(inputs(domain={"vcpupin": (3, 7, 2, 6), "emulatorpin": (1, 5)}))
    assert op == "update" and outs["domid"] == first_run
    # (the test driver's host has 8 pinnable CPUs: live pins beyond them read back empty)
    assert r.refresh()["domain"]["vcpupin"] == [3, 7, 2, 6]

    # memory: needs shutdown + redefine + start (a new run)
    op, outs = r.up(inputs(domain={"vcpupin": (3, 7, 2, 6), "emulatorpin": (1, 5), "memory_mib": 4096}))
    assert op == "update" and outs["state"] == "running" and outs["domid"] != first_run
    assert r.refresh()["domain"]["memory_mib"] == 4096

    r.destroy()
    assert _read_by_uuid(server, outs) == {}, "delete leaves no domain"


def test_update_that_libvirt_refuses_restores_the_previous_definition(server):
    r = server.resource(LibvirtDomainProvider(), TYPE, "tenant-a")
    r.up(inputs())
    before = r.refresh()
    with pytest.raises(ProviderError, match="previous definition restored and started"):
        r.up(inputs(domain={"arch": "bogus", "memory_mib": 4096}))
    r.outputs = before  # the failed update left state as it was
    after = r.read()
    assert after["domain"] == before["domain"] and after["state"] == "running"


def test_delete_keeps_the_disk_unless_asked_and_never_one_it_found(server):
    r = server.resource(LibvirtDomainProvider(), TYPE, "tenant-a")
    assert r.up(inputs())[1]["disk_created"] is True
    r.destroy()
    assert r.up(inputs())[1]["disk_created"] is False, "the overlay survived delete (keep_disk default)"
    r.destroy()
    # keep_disk false, but the disk was there before this create: delete leaves it
    r2 = server.resource(LibvirtDomainProvider(), TYPE, "tenant-a")
    assert r2.up(inputs(keep_disk=False))[1]["disk_created"] is False
    r2.destroy()
    assert r2.up(inputs())[1]["disk_created"] is False, "keep_disk=false removed a disk that create found"
    r2.destroy()
    # keep_disk false and a disk this create made: delete removes it
    other = {"disk": "/default-pool/tenant-b.qcow2"}
    r3 = server.resource(LibvirtDomainProvider(), TYPE, "tenant-a")
    assert r3.up(inputs(keep_disk=False, domain=other))[1]["disk_created"] is True
    r3.destroy()
    assert r3.up(inputs(domain=other))[1]["disk_created"] is True, "keep_disk=false kept the overlay it made"


def test_a_seed_iso_volume_already_there_is_refused_without_a_host_record(server):
    # another VM's overlay sits at tenant-a's seed ISO path; with `uri` it could not be put back on delete
    b = server.resource(LibvirtDomainProvider(), TYPE, "tenant-b")
    b.up(
        inputs(
            domain={"name": "tenant-b", "disk": "/default-pool/tenant-a-seed.iso", "seed_iso": None},
            cloud_init=None,
            keep_disk=False,
        )
    )
    a = server.resource(LibvirtDomainProvider(), TYPE, "tenant-a")
    with pytest.raises(ProviderError, match="tenant-a-seed.iso .*is there already"):
        a.up(inputs())
    assert b.refresh()["state"] == "running"
    b.destroy()
    assert a.up(inputs())[1]["state"] == "running"


def test_expected_lookups_print_nothing_and_errors_still_raise(capfd):
    lv = open_libvirt(DomainInputs.model_validate(inputs()))
    assert _lookup(lv, "no-such-domain") is None
    with pytest.raises(libvirt.libvirtError, match="Domain not found"):
        lv.lookupByName("no-such-domain")
    assert "libvirt:" not in capfd.readouterr().err, "libvirt's default error handler printed an expected lookup"


def test_rename_replaces_and_a_defined_name_is_not_adopted(server):
    r = server.resource(LibvirtDomainProvider(), TYPE, "tenant-a")
    r.up(inputs())
    assert r.preview(inputs(domain={"name": "tenant-b"})).replaces == ["domain"]
    other = server.resource(LibvirtDomainProvider(), TYPE, "tenant-a-again")
    with pytest.raises(ProviderError, match="already exists"):
        other.up(inputs())


def test_a_create_whose_result_was_lost_is_adopted_by_its_own_rerun_only(server):
    r = server.resource(LibvirtDomainProvider(), TYPE, "tenant-a")
    op, first = r.up(inputs(owner_tag="dev/tenant-a"))
    assert op == "create"
    r.id = None  # the result never came back: the engine has no state, the domain is defined and running
    other = server.resource(LibvirtDomainProvider(), TYPE, "tenant-a-other")
    with pytest.raises(ProviderError, match="already exists"):
        other.up(inputs(owner_tag="dev/someone-else"))
    with pytest.raises(ProviderError, match="already exists"):
        other.up(inputs())  # no owner tag: nothing to match, never adopted
    op, outs = r.up(inputs(owner_tag="dev/tenant-a"))
    assert op == "create" and outs["uuid"] == first["uuid"] and outs["state"] == "running"
    assert outs["domid"] == first["domid"], "the running domain was adopted, not restarted"
    r.destroy()
    assert _read_by_uuid(server, outs) == {}, "one domain, and destroy removed it"


def test_check_refuses_bad_inputs(server):
    r = server.resource(LibvirtDomainProvider(), TYPE, "x")
    with pytest.raises(ProviderError, match="host"):
        r.check({k: v for k, v in inputs().items() if k != "uri"})
    with pytest.raises(ProviderError, match="public keys"):
        r.check(inputs(cloud_init={"user": "ops", "ssh_authorized_keys": ["-----BEGIN OPENSSH PRIVATE KEY-----"]}))
    with pytest.raises(ProviderError, match="topology"):
        r.check({**inputs(), "domain": {**spec(), "vcpupin": [1, 2, 3]}})
    checked = r.check({**inputs(), "domain": {**spec(), "gpus": ["65:00.0"]}})
    assert checked["domain"]["gpus"] == ["0000:65:00.0"], "inputs are normalised so state compares"


# -- the seed ISO path and the disk, recorded and put back over `host` (a real local sshd; no libvirt needed) -------


@pytest.fixture
def host_conn(local_sshd):
    keys.set_private_key("sshPrivateKey", local_sshd.client_key_pem)
    return ssh.connect(local_sshd.host_spec())


def _file(path):
    if not os.path.exists(path):
        return None
    st = os.stat(path)
    return (open(path, "rb").read(), oct(st.st_mode & 0o7777), st.st_uid, st.st_gid)


def _host_inputs(local_sshd, tmp_path, **kw) -> dict:
    d = inputs(domain={"disk": str(tmp_path / "t.qcow2"), "seed_iso": str(tmp_path / "t-seed.iso")}, **kw)
    del d["uri"]
    return {**d, "host": local_sshd.host_spec().model_dump(mode="json"), "owner_tag": "test/lv-records"}


@pytest.mark.parametrize("found", [True, False])
def test_records_survive_a_rerun_and_release_puts_both_paths_back(local_sshd, host_conn, tmp_path, found):
    props = _host_inputs(local_sshd, tmp_path, keep_disk=False)
    inp, p = DomainInputs.model_validate(props), LibvirtDomainProvider()
    seed, disk = inp.domain.seed_iso, inp.domain.disk
    assert seed is not None and disk is not None  # _host_inputs declares both
    if found:
        for path, data in ((seed, b"operator's seed\n"), (disk, b"operator's disk\n")):
            open(path, "wb").write(data)
            os.chmod(path, 0o640)
            os.chown(path, 0, 4)
    before = {seed: _file(seed), disk: _file(disk)}
    autostart_was = os.path.isdir(AUTOSTART_DIR)
    try:
        with pristine.attempt():
            seed_found, disk_found, disk_there, made_dirs = p._found(host_conn, props, inp, disk)
            assert p._write_seed(None, props, inp, host_conn) is True  # over SSH: no libvirt connection needed
        assert disk_there is found and disk_found == ("640 0 4" if found else "absent")
        assert made_dirs == ([] if autostart_was else [AUTOSTART_DIR])
        os.makedirs(AUTOSTART_DIR, exist_ok=True)  # what libvirtd does when the domain is set to autostart
        written = _file(seed)  # the ISO's own timestamps differ from a second build: the label and the mode
        assert b"CIDATA" in written[0].upper() and written[1:] == ("0o600", 0, 0)
        if not found:
            open(disk, "wb").write(b"the overlay gpuhost made\n")
        # a re-run after a dropped connection: the first record wins, not what the first run left
        again = p._found(host_conn, props, inp, disk)
        assert again == (seed_found, disk_found, True, made_dirs)
        assert FileState.model_validate(seed_found).content == (before[seed] or (b"",))[0]
        os.chmod(disk, 0o600)  # libvirt's DAC labelling changed it while the VM ran
        made = {"seed_found": seed_found, "disk_found": disk_found, "disk_created": not found, "made_dirs": made_dirs}
        p._release(None, {**props, **made}, True)
        assert {seed: _file(seed), disk: _file(disk)} == before
        assert os.path.isdir(AUTOSTART_DIR) == autostart_was  # the directory made for the domain goes with it
        assert not any(
            os.path.exists(f"{ROOT}/{d}{x}")
            for d in ("files" + seed, "runtime/libvirt-disk" + disk)
            for x in ("", ".absent", ".owner")
        ), "release forgot the records"
    finally:
        Change(props["owner_tag"]).forget(p._record(props, inp)).run(host_conn)


def test_a_create_refused_by_another_owners_record_leaves_no_record_of_its_own(local_sshd, host_conn, tmp_path):
    props = _host_inputs(local_sshd, tmp_path)
    inp, p = DomainInputs.model_validate(props), LibvirtDomainProvider()
    assert inp.domain.seed_iso is not None  # _host_inputs declares it
    theirs = Record("test/someone-else", files=[inp.domain.seed_iso])
    host_conn.run(theirs.script().render())
    ours = p._record(props, inp)
    try:
        with pytest.raises(HostError, match="test/someone-else"), pristine.attempt():
            p._found(host_conn, props, inp, inp.domain.disk)
        assert not os.path.exists(f"{ROOT}/runtime/libvirt-disk{inp.domain.disk}.owner"), "a fresh record stayed"
    finally:
        Change("test/someone-else").forget(theirs).forget(ours).run(host_conn)

"""Domain XML: seed 002's domain from a placement; every rendering passes libvirt's own schema
(`virt-xml-validate`), and parse(render(spec)) gives the spec back."""

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from plans.domain_xml import DomainSpec, Topology, drift, parse, render
from plans.placement import VmRequest, host_from_dict, place

FIX = Path(__file__).parent / "fixtures" / "placement"
VALIDATOR = shutil.which("virt-xml-validate") or "/usr/bin/virt-xml-validate"


def at(e: ET.Element, path: str) -> ET.Element:
    """The element at `path`, which the test expects to be there."""
    found = e.find(path)
    assert found is not None, f"no <{path}>"
    return found


def validate(xml: str, tmp_path: Path) -> None:
    f = tmp_path / "domain.xml"
    f.write_text(xml)
    r = subprocess.run([VALIDATOR, str(f), "domain"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr + r.stdout


def seed002_spec(**kw):
    host = host_from_dict(json.loads((FIX / "seed002_2x16c.json").read_text()))
    gpu = ("0000:ca:00.0", "0000:ca:00.1")
    plan = place(
        host, [VmRequest("tenant-b", vcpus=16, memory_mib=64 * 1024, gpus=gpu, vfs=("0000:c1:02.0",), iothreads=2)]
    )
    return plan.vm("tenant-b"), DomainSpec.from_placement(
        plan.vm("tenant-b"),
        disk="/var/lib/libvirt/images/tenant-b.qcow2",
        seed_iso="/var/lib/libvirt/images/tenant-b-seed.iso",
        gpus=gpu,
        vfs=["c1:02.0"],
        network="default",
        **kw,
    )


def test_seed002_domain_has_every_piece_and_validates(tmp_path):
    vm, spec = seed002_spec()
    xml = render(spec)
    validate(xml, tmp_path)
    d = ET.fromstring(xml)
    assert at(d, "os/type").get("machine") == "q35"
    assert at(d, "os/loader").get("type") == "pflash" and at(d, "os/nvram").get("template")
    assert at(d, "cpu").get("mode") == "host-passthrough"
    topo = at(d, "cpu/topology")
    assert (topo.get("cores"), topo.get("threads")) == ("8", "2")
    assert at(d, "memoryBacking/hugepages/page").get("size") == "1048576"
    assert at(d, "numatune/memory").attrib == {"mode": "strict", "nodeset": "1"}
    pins = {int(p.get("vcpu", "")): int(p.get("cpuset", "")) for p in d.findall("cputune/vcpupin")}
    assert [pins[i] for i in range(16)] == list(vm.vcpupin)
    assert at(d, "cputune/emulatorpin").get("cpuset") == ",".join(map(str, vm.emulatorpin))
    assert len(d.findall("cputune/iothreadpin")) == 2 and d.findtext("iothreads") == "2"
    assert at(d, "devices/disk[@device='disk']/driver").get("iothread") == "1"
    hostdevs = d.findall("devices/hostdev")
    assert [h.get("managed") for h in hostdevs] == ["yes"] * 3
    assert [h.find("rom") is not None for h in hostdevs] == [True, True, False]  # rom bar on GPU functions only
    assert [at(h, "source/address").get("function") for h in hostdevs] == ["0x0", "0x1", "0x0"]
    assert d.find("features/kvm") is None  # datacenter card: nothing hidden


def test_consumer_card_hides_kvm_and_sets_vendor_id(tmp_path):
    _, spec = seed002_spec(hide_kvm=True, hv_vendor_id="gpuhost0")
    xml = render(spec)
    validate(xml, tmp_path)
    d = ET.fromstring(xml)
    assert at(d, "features/kvm/hidden").get("state") == "on"
    assert at(d, "features/hyperv/vendor_id").get("value") == "gpuhost0"
    assert parse(xml) == spec


def test_roundtrip_and_drift():
    _, spec = seed002_spec()
    assert parse(render(spec)) == spec
    assert drift(spec, parse(render(spec))) == {}
    changed = spec.model_copy(update={"vcpupin": spec.vcpupin[::-1], "gpus": spec.gpus[:1]})
    assert set(drift(spec, parse(render(changed)))) == {"vcpupin", "gpus"}


def test_live_xml_additions_fold_back():
    """libvirt's live XML expands the machine type and adds uuid/controllers/guest addresses: not drift."""
    _, spec = seed002_spec()
    d = ET.fromstring(render(spec))
    at(d, "os/type").set("machine", "pc-q35-8.2")
    ET.SubElement(d, "uuid").text = "c7a5fdbd-cdaf-9455-926a-d65c16db1809"
    ET.SubElement(at(d, "devices"), "controller", type="pci", index="0", model="pcie-root")
    h = at(d, "devices/hostdev")
    ET.SubElement(h, "address", type="pci", domain="0x0000", bus="0x05", slot="0x00", function="0x0")
    assert drift(spec, parse(ET.tostring(d, encoding="unicode"))) == {}


def test_invalid_specs_are_refused():
    with pytest.raises(ValidationError, match="topology"):
        DomainSpec(name="x", memory_mib=1024, vcpupin=(1, 2, 3), topology=Topology(cores=2, threads=2))
    with pytest.raises(ValidationError, match="whole number"):
        DomainSpec(name="x", memory_mib=1000, vcpupin=(1,), topology=Topology())
    with pytest.raises(ValidationError, match="PCI address"):
        DomainSpec(name="x", memory_mib=1024, vcpupin=(1,), topology=Topology(), gpus=["65:00"])
    with pytest.raises(ValidationError):
        DomainSpec(name="x;rm -rf /", memory_mib=1024, vcpupin=(1,), topology=Topology())


@st.composite
def specs(draw):
    threads = draw(st.sampled_from([1, 2]))
    cores = draw(st.integers(1, 8))
    n = cores * threads
    cpus = draw(st.lists(st.integers(0, 255), min_size=n, max_size=n, unique=True))
    page = draw(st.sampled_from(["1G", "2M", "4K"]))
    mem = draw(st.integers(1, 64)) * 1024
    fns = draw(st.lists(st.tuples(st.integers(0, 255), st.integers(0, 31), st.integers(0, 7)), max_size=4, unique=True))
    addrs = [f"0000:{b:02x}:{s:02x}.{f}" for b, s, f in fns]
    k = draw(st.integers(0, len(addrs)))
    fw = draw(st.booleans())
    return DomainSpec(
        name=draw(st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True)),
        domain_type=draw(st.sampled_from(["kvm", "qemu", "test"])),
        cpu_mode=draw(st.sampled_from(["host-passthrough", "maximum"])),
        memory_mib=mem,
        page_size=page,
        vcpupin=tuple(cpus),
        emulatorpin=tuple(draw(st.lists(st.integers(0, 255), max_size=4, unique=True))),
        iothreadpin=tuple(
            tuple(sorted(set(x)))
            for x in draw(st.lists(st.lists(st.integers(0, 255), min_size=1, max_size=2), max_size=3))
        ),
        numa_node=draw(st.none() | st.integers(0, 7)),
        topology=Topology(sockets=1, cores=cores, threads=threads),
        loader=None if not fw else "/usr/share/OVMF/OVMF_CODE_4M.fd",
        disk=draw(st.none() | st.just("/var/lib/libvirt/images/x.qcow2")),
        seed_iso=draw(st.none() | st.just("/var/lib/libvirt/images/x-seed.iso")),
        kernel=draw(st.none() | st.just("/boot/vmlinuz")),
        network=draw(st.none() | st.just("default")),
        console_log=draw(st.none() | st.just("/var/log/libvirt/qemu/x-console.log")),
        gpus=tuple(addrs[:k]),
        vfs=tuple(addrs[k:]),
        hide_kvm=draw(st.booleans()),
        hv_vendor_id=draw(st.none() | st.just("abc123")),
    )


@settings(max_examples=40, deadline=None)
@given(specs())
def test_generated_specs_validate_and_roundtrip(tmp_path_factory, spec):
    validate(render(spec), tmp_path_factory.mktemp("x"))
    parsed = parse(render(spec))
    # iothreadpin/emulatorpin come back sorted (cpuset syntax has no order); everything else exactly
    want = spec.model_copy(update={"emulatorpin": tuple(sorted(spec.emulatorpin))})
    assert drift(want, parsed) == {}

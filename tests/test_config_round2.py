"""Stack config, round 2 (issue 25 §3): property tests over the large input spaces (numbers, names, CPU lists,
addresses, artifact URLs) against the loader itself, and the MIG binding failing closed.

The table of single bad configs (one exact line each, 0 resources) is tests/test_bad_input.py's BAD_ROUND2; here
hypothesis draws many values per field and checks the loader's answer against a reference of its own.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import math
import string
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from facts.cpulist import MAX_CPUS, CpuListError, parse_cpulist
from plans.cmdline import OWNED
from plans.triton_runtime import docker_gpus_flag, docker_gpus_value
from stacks.load import ConfigError, parse_fleet
from stacks.rawconfig import BAD_CHAR_RE
from testbed.mocks import EchoMocks, attempt_program
from testbed.stackfiles import stack_config

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL/kSwgf9qVUgtkwpJuQBIIevT94BAXy29qU5XlIfwG3"
# One host (topology, two GPUs: one for a VM, one kept on the host), one guest, one service on the host.
BASE = {
    "hosts": [
        {
            "name": "gpu-01",
            "ssh": {"address": "10.0.0.10", "host_key": KEY},
            "topology": {"sockets": 2, "cores_per_socket": 8, "threads_per_core": 2, "memory_gib_per_node": 64},
            "reserved_cpus": "0-1",
            "hugepages": {"size": "1G", "count": 32},
            "gpus": [
                {"address": "0000:81:00.0", "model": "L40S", "numa_node": 1},
                {"address": "0000:41:00.0", "model": "L40S", "numa_node": 0, "passthrough": False},
            ],
            "vm_network": {"bridge": "br0", "prefix_length": 24, "gateway": "10.0.1.1"},
            "vms": [
                {
                    "name": "vm-a",
                    "vcpus": 4,
                    "memory_gib": 8,
                    "gpus": ["0000:81:00.0"],
                    "address": "10.0.1.11",
                    "host_key": KEY,
                }
            ],
        }
    ],
    "services": [
        {
            "name": "svc",
            "host": "gpu-01",
            "runtime": "process",
            "models": [
                {
                    "name": "m",
                    "preset": "yolov8n_torch",
                    "artifact": {"url": "https://models.example.internal/yolov8n.pt", "sha256": "ab" * 32},
                }
            ],
            "slo": {"p95_ms": 10},
        }
    ],
}


def _load(mutate) -> list[str]:
    """The loader's lines for BASE with one change ([] when it loads)."""
    doc = copy.deepcopy(BASE)
    mutate(doc)
    doc = json.loads(json.dumps(doc))  # what Pulumi's config hands over (JSON; inf/NaN survive as Infinity/NaN)
    try:
        parse_fleet(doc)
    except ConfigError as e:
        return e.lines
    return []


def test_base_loads():
    assert _load(lambda d: None) == []


# -- numbers: strict, finite, bounded --------------------------------------------------------------------------


def _acceptance(field: str):
    """A setter of the first service's ``acceptance.<field>`` (the section made when the stack has none)."""
    return lambda d, v: d["services"][0].setdefault("acceptance", {}).__setitem__(field, v)


NUMBER_FIELDS = [
    # (setter, config path, lowest allowed, highest allowed, whole numbers only)
    (
        lambda d, v: d["services"][0]["slo"].__setitem__("p95_ms", v),
        "fleet.services[0].slo.p95_ms",
        0,
        3_600_000,
        False,
    ),
    (
        lambda d, v: d["services"][0]["slo"].__setitem__("max_error_rate", v),
        "fleet.services[0].slo.max_error_rate",
        0,
        1,
        False,
    ),
    (
        lambda d, v: d["hosts"][0]["vms"][0].__setitem__("shutdown_timeout_s", v),
        "fleet.hosts[0].vms[0].shutdown_timeout_s",
        0,
        86400,
        True,
    ),
    (lambda d, v: d["hosts"][0].__setitem__("drain_timeout_s", v), "fleet.hosts[0].drain_timeout_s", 0, 86400, True),
    (
        lambda d, v: d["services"][0]["models"][0].__setitem__("max_queue_delay_us", v),
        "fleet.services[0].models[0].max_queue_delay_us",
        0,
        60_000_000,
        True,
    ),
    (
        _acceptance("duration_s"),
        "fleet.services[0].acceptance.duration_s",
        0,
        600,
        False,
    ),
    (
        _acceptance("ready_timeout_s"),
        "fleet.services[0].acceptance.ready_timeout_s",
        0,
        3600,
        False,
    ),
]

_numbers = st.one_of(
    st.booleans(),
    st.integers(min_value=-(10**18), max_value=10**18),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["8", "1e3", "inf", "NaN", "", "0x10"]),
)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(range(len(NUMBER_FIELDS))), _numbers)
def test_numbers_are_strict_finite_and_bounded(k, v):
    setter, path, lo, hi, whole = NUMBER_FIELDS[k]
    lines = _load(lambda d: setter(d, v))
    is_number = not isinstance(v, (bool, str)) and (isinstance(v, int) or (not whole and math.isfinite(v)))
    if whole and isinstance(v, float):
        is_number = False
    # lower bounds: p95_ms / duration_s / ready_timeout_s are > 0, the others >= 0
    strict_low = path.endswith(("p95_ms", "duration_s", "ready_timeout_s"))
    in_range = is_number and (v > lo if strict_low else v >= lo) and v <= hi
    if in_range:
        assert lines == [], (v, lines)
    else:
        assert len(lines) == 1 and lines[0].startswith(path + ": "), (v, lines)
        assert "is not" in lines[0] or "out of range" in lines[0]


# -- CPU lists: bounded before a range expands ------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**10), st.integers(0, 10**10)), min_size=1, max_size=4))
def test_cpu_ranges_are_bounded_before_they_expand(ranges):
    text = ",".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges)
    want_ok = all(a <= b < MAX_CPUS for a, b in ranges if a != b) and all(a < MAX_CPUS for a, b in ranges)
    try:
        got = parse_cpulist(text)
    except CpuListError as e:
        assert not want_ok, (text, e)
        return
    assert want_ok
    want = sorted({c for a, b in ranges for c in range(min(a, b), max(a, b) + 1)})
    assert got == want


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=string.digits + ",- \u0663\u00b2x", max_size=12))
def test_cpu_list_text_is_ascii_digits_only(text):
    try:
        cpus = parse_cpulist(text)
    except CpuListError:
        return
    assert all(0 <= c < MAX_CPUS for c in cpus)
    assert not (set(text) & set("\u0663\u00b2x"))


def test_the_loader_refuses_a_huge_range_quickly():
    lines = _load(lambda d: d["hosts"][0].__setitem__("reserved_cpus", "0-99999999999"))
    assert lines == [
        "fleet.hosts[0].reserved_cpus: CPU 99999999999 in CPU list '0-99999999999' is beyond the largest CPU "
        'number 8191 (write CPU numbers 0-8191, e.g. "0-1,32-33")'
    ]


# -- names: fullmatch ------------------------------------------------------------------------------------------

_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
_junk = st.sampled_from(["\n", "\r\n", " ", "\x00", "\t", "$", "/", "."])


@settings(max_examples=60, deadline=None)
@given(_label, _junk, st.sampled_from(["host", "vm", "service", "bridge"]))
def test_a_name_with_anything_after_it_is_refused(name, junk, where):
    def named(value):
        def mutate(d):
            if where == "host":
                d["hosts"][0]["name"] = value
                d["services"][0]["host"] = value
            elif where == "vm":
                d["hosts"][0]["vms"][0]["name"] = value
            elif where == "service":
                d["services"][0]["name"] = value
            else:
                d["hosts"][0]["vm_network"]["bridge"] = value

        return mutate

    clean = name[:10] if where == "bridge" else name
    path = {
        "host": "fleet.hosts[0].name",
        "vm": "fleet.hosts[0].vms[0].name",
        "service": "fleet.services[0].name",
        "bridge": "fleet.hosts[0].vm_network.bridge",
    }[where]
    assert _load(named(clean)) == []
    lines = _load(named(clean + junk))
    if where == "bridge" and junk == ".":
        assert lines == []  # '.' is allowed in an interface name
    elif where == "host" and BAD_CHAR_RE.search(junk):
        # the host's name is copied into services[0].host: both fields hold the control character, a line each
        assert len(lines) == 2 and lines[0].startswith(path + ": "), lines
        assert lines[1].startswith("fleet.services[0].host: value holds "), lines
    else:
        assert len(lines) == 1 and lines[0].startswith(path + ": "), lines


# -- addresses: subnet, uniqueness, no scope junk -----------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.ip_addresses(v=4))
def test_a_guest_address_loads_exactly_when_it_is_a_free_host_address_of_the_subnet(ip):
    lines = _load(lambda d: d["hosts"][0]["vms"][0].__setitem__("address", str(ip)))
    subnet = ipaddress.ip_network("10.0.1.0/24")
    ok = (
        ip in subnet
        and ip not in (subnet.network_address, subnet.broadcast_address, ipaddress.ip_address("10.0.1.1"))
        and str(ip) != "10.0.0.10"
    )
    assert (lines == []) == ok, (ip, lines)
    if not ok:
        assert len(lines) == 1 and lines[0].startswith("fleet.hosts[0].vms[0].address: ")


@settings(max_examples=60, deadline=None)
@given(st.ip_addresses(), st.sampled_from(["%eth0", "%1", "%25eth0", " ", "/24", "\n"]))
def test_dns_and_gateway_addresses_hold_no_scope_or_junk(ip, junk):
    assert _load(lambda d: d["hosts"][0]["vm_network"].__setitem__("dns", [str(ip)])) == []
    lines = _load(lambda d: d["hosts"][0]["vm_network"].__setitem__("dns", [str(ip) + junk]))
    # a control character is named at the item itself (dns[0]), the model's own checks at the list
    assert len(lines) == 1 and lines[0].startswith(
        ("fleet.hosts[0].vm_network.dns: ", "fleet.hosts[0].vm_network.dns[0]: ")
    ), lines


# -- GPUs: every spelling of one PCI address is one GPU ---------------------------------------------------------


@settings(deadline=None)
@given(st.sampled_from(["0000:81:00.0", "81:00.0", "0000:81:00.0".upper(), "81:00.0".upper()]))
def test_a_gpu_listed_twice_in_any_spelling_is_refused(spelling):
    lines = _load(lambda d: d["hosts"][0]["gpus"].append({"address": spelling, "model": "L40S"}))
    assert lines == [
        "fleet.hosts[0].gpus[2].address: 0000:81:00.0 is gpus[0] already (one PCI device, one entry); remove one "
        "of them"
    ]


# -- artifact URLs: no credentials, valid host and port ------------------------------------------------------------

_param = st.sampled_from(
    [
        "token",
        "access_token",
        "X-Amz-Signature",
        "x-amz-credential",
        "sig",
        "api_key",
        "apikey",
        "password",
        "secret",
        "auth",
        "X-Goog-Signature",
        "key",
        "private_token",
    ]
)


def _load_artifact_url(url: str) -> list[str]:
    """The loader's lines for BASE with its first service's first model fetched from `url`."""

    def mutate(d):
        d["services"][0]["models"][0] = {"name": "m", "preset": "yolov8n", "artifact": {"url": url, "sha256": "a" * 64}}

    return _load(mutate)


@settings(max_examples=80, deadline=None)
@given(_param, st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=12))
def test_an_artifact_url_with_a_credential_in_its_query_is_refused(name, value):
    lines = _load_artifact_url(f"https://store.example/m.onnx?v=2&{name}={value}")
    assert len(lines) == 1 and lines[0].startswith(
        "fleet.services[0].models[0].artifact.url: url carries a credential ("
    )


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 200000), st.sampled_from(["user@", "user:pw@", ":pw@", ""]))
def test_an_artifact_url_port_and_userinfo(port, userinfo):
    lines = _load_artifact_url(f"https://{userinfo}store.example:{port}/m.onnx")
    if userinfo:
        assert lines == [
            "fleet.services[0].models[0].artifact.url: url holds credentials (user:password@), which belong in "
            "secret config (`pulumi config set --secret ...`), not in the URL"
        ]
    elif 1 <= port <= 65535:
        assert lines == []
    else:
        assert len(lines) == 1 and "is not a TCP port (use 1-65535)" in lines[0]


# -- MIG: fail closed ----------------------------------------------------------------------------------------------


class _MigUuidsUnknown(EchoMocks):
    """The MIG provider answering with no MIG devices (a layout pending a GPU reset): mocked, since no MIG GPU
    exists on this machine."""

    def new_resource(self, args):
        rid, outs = super().new_resource(args)
        if args.typ.endswith("/gpu:MigLayout"):
            outs["mig_uuids"] = {g: [] for g in outs["mig_uuids"]}
        return [rid, outs]


def test_mock_mig_service_whose_uuid_is_unknown_fails_and_never_gets_all_gpus():
    cfg, secret = stack_config("hk-prod")
    rec, err = attempt_program(cfg, secret, stack="hk-prod", mocks=_MigUuidsUnknown())
    assert (
        err is not None
        and "service sdxl-mig: MIG instance 0 of GPU 0000:17:00.0 on a100-mig-01 has no known MIG UUID" in str(err)
    )
    names = {r.name for r in rec.registrations}
    assert "sdxl-mig-triton" not in names and "sdxl-mig-triton-run" not in names
    # No container on the MIG host at all (a guest's Triton has "all": the one GPU passed into its VM).
    on_mig_host = [r for r in rec.registrations if r.type.startswith("docker:") and r.name.startswith("sdxl-mig")]
    assert [r.name for r in on_mig_host if r.type == "docker:index/container:Container"] == []


def test_mock_mig_service_with_its_uuid_gets_exactly_that_device():
    cfg, secret = stack_config("hk-prod")
    rec, err = attempt_program(cfg, secret, stack="hk-prod")
    assert err is None
    c = rec.by_name("sdxl-mig-triton")
    assert c.inputs["gpus"].startswith("device=MIG-") and "," not in c.inputs["gpus"]


def test_an_empty_device_list_is_never_widened_to_all():
    with pytest.raises(ValueError, match="refusing to run it with --gpus all"):
        docker_gpus_value([])
    with pytest.raises(ValueError):
        docker_gpus_flag([])
    assert docker_gpus_value(["all"]) == "all"
    assert docker_gpus_flag(["MIG-a", "MIG-b"]) == '"device=MIG-a,MIG-b"'


# -- kernel parameters gpuhost sets: any spelling needs the acknowledgement ------------------------------------


def _spellings(name: str):
    return st.lists(st.sampled_from(["-", "_"]), min_size=name.count("-") + name.count("_"), max_size=64).map(
        lambda seps: "".join(seps.pop(0) if c in "-_" else c for c in name)
    )


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(sorted(OWNED)), st.data())
def test_every_spelling_of_a_parameter_gpuhost_sets_needs_an_acknowledgement(name, data):
    full = name + "disable_vga" if name.endswith(".") else name
    spelled = data.draw(_spellings(full))
    arg = f"{spelled}=1"
    lines = _load(lambda d: d["hosts"][0].__setitem__("kernel", {"extra_args": [arg]}))
    assert len(lines) == 1 and lines[0].startswith("fleet.hosts[0].kernel.extra_args[0]: "), lines
    assert f"add {full!r} to kernel.overrides_acknowledged" in lines[0]
    acked = _load(
        lambda d: d["hosts"][0].__setitem__("kernel", {"extra_args": [arg], "overrides_acknowledged": [spelled]})
    )
    assert acked == []


# -- one machine, one port --------------------------------------------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(st.one_of(st.integers(1, 65535), st.sampled_from([22, 8000, 8001, 8002, 9090, 3000])))
def test_nginx_loads_exactly_on_a_port_nothing_else_on_its_machine_listens_on(port):
    lines = _load(lambda d: d["services"][0].__setitem__("nginx_port", port))
    taken = {22: "sshd", 8000: "Triton's HTTP port", 8001: "Triton's gRPC port", 8002: "Triton's metrics port"}
    if port in taken:
        assert lines == [
            f"fleet.services[0].nginx_port: port {port} on gpu-01 is also {taken[port]} "
            f"({'fleet.hosts[0].ssh.port' if port == 22 else 'fleet.services[0]'}); one port has one listener on a "
            "machine: choose another port"
        ]
    else:
        assert lines == []


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 65535))
def test_monitoring_ports_collide_with_what_runs_on_the_monitoring_host(port):
    def mutate(d):
        d["monitoring"] = {"host": "gpu-01", "prometheus_port": port, "grafana_port": 3000 if port != 3000 else 3001}
        d["hosts"][0]["vms"][0].pop("address")  # no guest to scrape (keeps the check on the host alone)

    lines = _load(mutate)
    on_host = {22, 80, 8000, 8001, 8002, 9100, 9400}  # sshd, nginx, Triton, node- and dcgm-exporter
    if port in on_host:
        assert len(lines) == 1 and lines[0].startswith(f"fleet.monitoring.prometheus_port: port {port} on gpu-01"), (
            lines
        )
    else:
        assert lines == [], lines


# -- the rule holds for every field, present and future -------------------------------------------------------


def _models():
    import stacks.schema as schema
    from plans.adaptive_window import AdaptiveWindow
    from plans.sriov import VfSettings

    seen: list[type[BaseModel]] = []
    todo: list[type[BaseModel]] = [schema.Fleet]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.append(m)
        for f in m.model_fields.values():
            for t in _leaf_types(f.annotation):
                if isinstance(t, type) and issubclass(t, BaseModel):
                    todo.append(t)
    assert AdaptiveWindow in seen and VfSettings in seen
    return seen


def _leaf_types(t):
    args = typing.get_args(t)
    if typing.get_origin(t) is typing.Annotated:
        return _leaf_types(args[0])
    if args:
        return [x for a in args for x in _leaf_types(a)]
    return [t]


def _numeric(f) -> bool:
    return any(t in (int, float) for t in _leaf_types(f.annotation)) and not any(
        t is bool for t in _leaf_types(f.annotation)
    )


def _has_upper_bound(f) -> bool:
    metas = list(f.metadata)
    for t in [f.annotation, *typing.get_args(f.annotation)]:
        if typing.get_origin(t) is typing.Annotated:
            metas += list(t.__metadata__)
    for m in metas:
        if getattr(m, "le", None) is not None or getattr(m, "lt", None) is not None:
            return True
        for inner in getattr(m, "metadata", []) or []:
            if getattr(inner, "le", None) is not None or getattr(inner, "lt", None) is not None:
                return True
    return False


def test_every_model_of_the_stack_config_is_strict_and_finite():
    for m in _models():
        assert m.model_config.get("strict") is True, m.__name__
        assert m.model_config.get("allow_inf_nan") is False, m.__name__
        assert m.model_config.get("extra") == "forbid", m.__name__


def test_every_number_field_of_the_stack_config_has_an_upper_bound():
    unbounded = [
        f"{m.__name__}.{name}"
        for m in _models()
        for name, f in m.model_fields.items()
        if _numeric(f) and typing.get_origin(f.annotation) not in (list, dict) and not _has_upper_bound(f)
    ]
    assert unbounded == []

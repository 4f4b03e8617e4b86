"""Host plans as tables: facts in -> actions out (and the sentence when nothing is needed). Pure, no SSH."""

from __future__ import annotations

import pytest

from plans import hugepages, sysctls
from plans.plan import Plan

WANT = {"net.core.somaxconn": 4096, "net.ipv4.tcp_fin_timeout": "10"}
FILE_OK = sysctls.render({"net.core.somaxconn": "4096", "net.ipv4.tcp_fin_timeout": "10"})


@pytest.mark.parametrize(
    "runtime,file_text,restore,whys",
    [
        (
            {"net.core.somaxconn": "128", "net.ipv4.tcp_fin_timeout": "60"},
            None,
            None,
            [
                "write /etc/sysctl.d/99-gpuhost.conf (2 values, read at every boot)",
                "net.core.somaxconn is 128 live, want 4096",
                "net.ipv4.tcp_fin_timeout is 60 live, want 10",
            ],
        ),
        ({"net.core.somaxconn": "4096", "net.ipv4.tcp_fin_timeout": "10"}, FILE_OK, None, []),
        (
            {"net.core.somaxconn": "4096", "net.ipv4.tcp_fin_timeout": "10"},
            FILE_OK + "vm.swappiness = 1\n",
            None,
            ["write /etc/sysctl.d/99-gpuhost.conf (2 values, read at every boot)"],
        ),
        (
            {"net.core.somaxconn": "4096", "net.ipv4.tcp_fin_timeout": "10", "vm.swappiness": "1"},
            FILE_OK,
            {"vm.swappiness": "60"},
            ["vm.swappiness is no longer managed: back to 60"],
        ),
        (
            {"net.core.somaxconn": "4096", "net.ipv4.tcp_fin_timeout": "10", "vm.swappiness": "60"},
            FILE_OK,
            {"vm.swappiness": "60"},
            [],
        ),
    ],
    ids=["fresh-host", "converged", "hand-edited-file", "dropped-name-restored", "dropped-name-already-back"],
)
def test_sysctls_plan(runtime, file_text, restore, whys):
    p = sysctls.plan_sysctls(WANT, runtime, file_text, restore)
    assert [a.why for a in p.actions] == whys
    assert p.noop == (not whys) and (p.noop_reason != "") == (not whys)
    for a in p.actions:
        assert a.write is not None or a.command.startswith("sysctl -q -w ")


def test_sysctls_plan_refuses_a_name_this_kernel_lacks():
    with pytest.raises(sysctls.UnknownSysctl, match="net.core.somaxconm"):
        sysctls.plan_sysctls({"net.core.somaxconm": "1"}, {"net.core.somaxconm": ""}, None)


def test_sysctls_observed_marks_a_file_that_disagrees_with_the_live_value():
    runtime = {"net.core.somaxconn": "4096", "net.ipv4.tcp_fin_timeout": "10"}
    assert sysctls.observed(WANT, runtime, FILE_OK) == {"net.core.somaxconn": "4096", "net.ipv4.tcp_fin_timeout": "10"}
    edited = FILE_OK.replace("= 10", "= 30")
    assert sysctls.observed(WANT, runtime, edited)["net.ipv4.tcp_fin_timeout"] == "10 (file: 30)"
    assert sysctls.observed(WANT, runtime, None)["net.core.somaxconn"] == "4096 (file: missing)"


def test_an_empty_plan_must_say_why():
    with pytest.raises(ValueError):
        Plan((), "")


@pytest.mark.parametrize(
    "counts,unit_is,enabled,whys",
    [
        (
            {"1": 0},
            None,
            False,
            [
                "write /etc/systemd/system/gpuhost-hugepages.service (reserves the pages at every boot)",
                "enable the unit (new: no reload)",  # systemd has no copy of a unit that did not exist
                "node 1 has 0 pages, want 512",
            ],
        ),
        ({"1": 512}, "same", True, []),
        ({"1": 256}, "same", True, ["node 1 has 256 pages, want 512"]),
        (
            {"1": 512},
            "other",
            True,
            [
                "write /etc/systemd/system/gpuhost-hugepages.service (reserves the pages at every boot)",
                "systemd reads the new unit",
            ],
        ),
        ({"1": 512}, "same", False, ["enable the unit"]),
    ],
    ids=["fresh-host", "converged", "pages-taken-back", "unit-hand-edited", "unit-disabled"],
)
def test_hugepages_plan(counts, unit_is, enabled, whys):
    unit = {"same": hugepages.render_unit({"1": 512}), "other": hugepages.render_unit({"1": 64}), None: None}[unit_is]
    p = hugepages.plan_hugepages({"1": 512}, [0, 1], counts, unit, enabled)
    assert [a.why for a in p.actions] == whys
    assert p.noop == (not whys)
    if "node 1 has" in " ".join(whys):
        cmd = p.actions[-1].command
        assert cmd.count("echo 512 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages") == 2
        # memory is compacted (and the count set again) only when the first try fell short
        first, rest = cmd.split("\nif ", 1)
        assert "compact_memory" not in first and "compact_memory" in rest and rest.endswith("\nfi")


def test_hugepages_plan_refuses_a_node_the_host_lacks():
    with pytest.raises(hugepages.NoSuchNode, match="no NUMA node 3"):
        hugepages.plan_hugepages({"3": 8}, [0, 1], {}, None, False)

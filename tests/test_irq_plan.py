"""plans/irq.py: facts in (a real capture of the emulated server's /proc/interrupts), actions out."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from facts.files import FileState
from facts.host import parse_host_facts
from plans import irq as plan

FACTS = parse_host_facts((Path(__file__).parent / "fixtures" / "facts" / "testhost_fresh.txt").read_text())
DEFAULT = "/etc/default/irqbalance"
STOCK = "#IRQBALANCE_ONESHOT=\n#IRQBALANCE_BANNED_CPULIST=\n"


def _file(text: str | None, mode: str = "644", uid: int = 0, gid: int = 0) -> FileState:
    if text is None:
        return FileState(path=DEFAULT, exists=False)
    import base64

    return FileState(
        path=DEFAULT, exists=True, mode=mode, uid=uid, gid=gid, content_b64=base64.b64encode(text.encode()).decode()
    )


BANNED_2_7 = STOCK + "IRQBALANCE_BANNED_CPULIST=2-7\n"


# (facts: irqbalance file, banned, pin, restore, skip) -> (files written, IRQs moved to CPUs, restarts irqbalance)
CASES = {
    "fresh host: ban list appended, nvme IRQs (on 6 and 0-7) pinned to 0-1": (
        (STOCK, [2, 3, 4, 5, 6, 7], [{"match": "nvme", "cpus": [0, 1]}], None, ()),
        ([DEFAULT], {"43": "0-1", "44": "0-1"}, True),
    ),
    "already banned, IRQ narrowed by irqbalance inside its CPUs: no-op": (
        (BANNED_2_7, [2, 3, 4, 5, 6, 7], [{"match": "virtio0-req.4", "cpus": [0, 1]}], None, ()),
        ([], {}, False),
    ),
    "already banned, a pinned IRQ moved off its CPUs: re-pinned, no restart": (
        (BANNED_2_7, [2, 3, 4, 5, 6, 7], [{"match": "nvme0q0", "cpus": [0, 1]}], None, ()),
        ([], {"43": "0-1"}, False),
    ),
    "kernel-managed IRQ refused before: not tried again": (
        (BANNED_2_7, [2, 3, 4, 5, 6, 7], [{"match": "nvme", "cpus": [0, 1]}], None, ("43", "44")),
        ([], {}, False),
    ),
    "no longer pinned: back to the first-found affinity": (
        (BANNED_2_7, [2, 3, 4, 5, 6, 7], [], {"43": [6], "32": [0, 1, 2, 3, 4, 5, 6, 7]}, ()),
        ([], {"32": "0-7"}, False),
    ),
    "absent file (irqbalance not installed yet): created 0644 root": (
        (None, [4, 5], [], None, ()),
        ([DEFAULT], {}, True),
    ),
    "empty ban list writes an empty value": (
        (BANNED_2_7, [], [], None, ()),
        ([DEFAULT], {}, True),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_facts_in_actions_out(name):
    (text, banned, pin, restore, skip), (writes, moves, restarts) = CASES[name]
    d = plan.plan_irq("debian", _file(text), FACTS.interrupts, banned, pin, restore=restore, skip=skip)
    assert [a.write.path for a in d.plan.actions if a.write] == writes
    got = {
        a.command.split("/proc/irq/")[1].split("/")[0]: shlex.split(a.command)[2]
        for a in d.plan.actions
        if "/proc/irq/" in a.command
    }
    assert got == moves
    assert any(a.command == plan.RESTART for a in d.plan.actions) == restarts
    assert d.plan.noop == (not writes and not moves)
    assert d.plan.sentences and all(d.plan.sentences)


def test_the_written_file_keeps_mode_owner_and_every_other_line():
    d = plan.plan_irq("debian", _file(STOCK + "OPTIONS=x\n", mode="640", uid=0, gid=4), FACTS.interrupts, [2, 3], [])
    w = d.plan.actions[0].write
    assert w is not None and (w.mode, w.owner) == ("0640", "0:4")
    assert w.content.decode() == STOCK + "OPTIONS=x\n# gpuhost: keep IRQs off the CPUs given to VMs (seed 002 §9)\n" + (
        "IRQBALANCE_BANNED_CPULIST=2-3\n"
    )
    assert d.banned == "2-3" and d.path == DEFAULT


def test_rhel_uses_sysconfig_and_targets_come_from_chip_or_action_names():
    d = plan.plan_irq(
        "rhel", FileState(path="", exists=False), FACTS.interrupts, [7], [{"match": "^IR-IO", "cpus": [0]}]
    )
    assert d.path == "/etc/sysconfig/irqbalance"
    assert sorted(d.targets, key=int) == ["0", "1", "4", "8", "9", "12", "16"]


def test_affinity_record_parses_and_unmovable_lines_are_read():
    text = "0/smp_affinity_list:0-7\n43/smp_affinity_list:6\ngarbage\n"
    assert plan.parse_affinities(text) == {"0": list(range(8)), "43": [6]}
    assert plan.unmovable("x\nunmovable 44\nunmovable 9\nunmovable 44\n") == ["9", "44"]


def test_observed_pin_shows_where_a_moved_irq_is():
    pin = [{"match": "nvme0q0", "cpus": [6]}, {"match": "virtio0-req.4", "cpus": [1]}]
    got = plan.observed_pin(pin, {"43": [6], "36": [1]}, FACTS.interrupts)
    assert got == [{"match": "nvme0q0", "cpus": [6]}, {"match": "virtio0-req.4", "cpus": [0]}]

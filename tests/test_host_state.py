"""pristine against a real local sshd: first-time records, owners, symlinks, stdin writes, the host lock.

The local sshd runs commands on this machine, so the records land under the real /var/lib/gpuhost/pristine (at the
test's own tmp paths) and the lock is the real /run/gpuhost.lock.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
import uuid

import pytest

from access import keys, ssh
from access.errors import HostError
from access.shell import sh
from pristine import LOCK, Change, Record, locked
from providers.base import HostProvider
from testbed.servers import wait_until


@pytest.fixture
def conn(local_sshd):
    keys.set_private_key("sshPrivateKey", local_sshd.client_key_pem)
    return ssh.connect(local_sshd.host_spec())


def _snap(path: str):
    if os.path.islink(path):
        return ("link", os.readlink(path))
    if not os.path.exists(path):
        return None
    st = os.lstat(path)
    return (open(path, "rb").read(), st.st_mode, st.st_uid, st.st_gid)


def test_first_record_wins_and_restore_is_exact(conn, tmp_path):
    plain, link, absent, value = tmp_path / "plain.conf", tmp_path / "link.conf", tmp_path / "new.conf", tmp_path / "v"
    plain.write_bytes(b"original\x00\xffbytes\n")
    os.chmod(plain, 0o640)
    os.chown(plain, 0, 4)
    (tmp_path / "target").write_text("the link's target\n")
    os.symlink("target", link)
    value.write_text("42\n")
    before = {p: _snap(str(p)) for p in (plain, link, absent, tmp_path / "target")}

    rec = Record(
        owner=f"test/{tmp_path.name}",
        files=[str(plain), str(link), str(absent)],
        values={f"test{tmp_path}/v": sh("cat", str(value))},
    )
    pristine, priors = rec.parse(conn.run(rec.script().render()).stdout)
    assert pristine[str(link)].link == "target" and not pristine[str(absent)].exists
    assert priors == {f"test{tmp_path}/v": "42"}

    # The change, then a "re-run" that records again from the changed host: the first record stays.
    ch = Change(rec.owner)
    for p in (plain, link, absent):
        ch.write(str(p), b"gpuhost's content\n", "0644", "0:0")
    ch.run(conn)
    assert not os.path.islink(link) and (tmp_path / "target").read_text() == "the link's target\n"
    value.write_text("7\n")
    again, priors2 = rec.parse(conn.run(rec.script().render()).stdout)
    assert again == pristine and priors2 == priors

    Change(rec.owner).restore(again).forget(rec).run(conn)
    assert {p: _snap(str(p)) for p in before} == before
    fresh, _ = rec.parse(conn.run(rec.script().render()).stdout)  # forgotten: a new record is taken from now
    Change(rec.owner).forget(rec).run(conn)
    assert fresh[str(plain)].exists


def test_record_of_another_owner_is_refused_with_the_owner_named(conn, tmp_path):
    p = tmp_path / "shared.conf"
    p.write_text("x\n")
    mine = Record(owner="dev/gpu-a-sysctls", files=[str(p)])
    mine.parse(conn.run(mine.script().render()).stdout)
    other = Record(owner="prod/gpu-a-sysctls", files=[str(p)])
    with pytest.raises(HostError) as e:
        other.parse(conn.run(other.script().render()).stdout, host="local")
    msg = str(e.value)
    assert "dev/gpu-a-sysctls" in msg and "prod/gpu-a-sysctls" in msg and "nothing was changed" in msg
    Change(mine.owner).forget(mine).run(conn)


def test_content_travels_over_stdin_not_argv(conn, tmp_path):
    secret = "never-in-argv-" + tmp_path.name
    ch = Change("test/stdin").write(str(tmp_path / "f"), secret.encode() * 3)
    assert secret not in ch.render()
    ch.run(conn)
    assert (tmp_path / "f").read_text() == secret * 3


def _hold_until(marker: str) -> str:
    """A script that holds on until `marker` exists (at most 60 s): a lock holder that lets go when the test says."""
    return f"i=0; while [ ! -e {shlex.quote(marker)} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done"


def _lock_log(tag: str) -> list[list[str]]:
    """The lock log's lines of this test run (the log is the machine's: earlier runs' lines stay in it)."""
    if not os.path.exists(LOCK + ".log"):
        return []
    return [ln.split() for ln in open(LOCK + ".log").read().splitlines() if ln.endswith(tag)]


def test_two_concurrent_applies_on_one_host_serialize(conn, local_sshd, tmp_path):
    """The test holds the host lock; two applies started meanwhile wait, say for whom, then run one at a time.

    Lined up by cause, not by sleeps: the test's hold lasts until it creates a marker file, which it does once the
    lock is seen held by it and both applies are seen waiting in the lock log."""
    tag = uuid.uuid4().hex
    marker = str(tmp_path / "release")
    holder = threading.Thread(target=lambda: conn.run(locked(_hold_until(marker), f"test-{tag}")))
    holder.start()
    # The holder file names whoever took the lock last: this test's tag there means the lock is held by it now.
    wait_until(
        f"the host lock held by test-{tag}",
        lambda: os.path.exists(LOCK + ".holder") and open(LOCK + ".holder").read().strip() == f"test-{tag}",
    )

    results = {}

    def apply(name):
        c = ssh.connect(local_sshd.host_spec())
        ch = Change(f"{name}-{tag}").write(str(tmp_path / name), name.encode()).add(["sleep 1"])
        res = c.run(ch.render(), input=bytes(ch.stdin))
        results[name] = res.stderr

    threads = [threading.Thread(target=apply, args=(n,)) for n in ("a", "b")]
    try:
        for t in threads:
            t.start()
        wait_until(
            "a and b waiting for the host lock",
            lambda: {who.rsplit("-", 1)[0] for _, ev, who in _lock_log(tag) if ev == "waiting"} == {"a", "b"},
        )
    finally:
        open(marker, "w").close()  # the test's hold ends (also when the wait above failed)
        for t in threads + [holder]:
            t.join()

    log = _lock_log(tag)
    # A "waiting" line (only when the lock was taken) comes before its holder's "acquired", never after it.
    waited = {who.rsplit("-", 1)[0]: float(ts) for ts, ev, who in log if ev == "waiting"}
    got = {who.rsplit("-", 1)[0]: float(ts) for ts, ev, who in log if ev == "acquired"}
    assert set(waited) == {"a", "b"} and all(waited[w] <= got[w] for w in waited), log
    for name, stderr in results.items():  # both started waiting while the test held the lock, and say so
        assert f"waiting for the host lock held by test-{tag}" in stderr, (name, stderr, log)
    events = [(ev, who.rsplit("-", 1)[0]) for _, ev, who in log if ev != "waiting"]
    # Strictly one holder at a time: acquired/released pairs never interleave, so the second apply waited for the
    # first's whole hold (its 1 s sleep) on top of the test's.
    for i in range(0, len(events), 2):
        assert events[i][0] == "acquired" and events[i + 1] == ("released", events[i][1]), events
    assert [who for ev, who in events if ev == "acquired"][0] == "test"
    assert sorted(who for ev, who in events if ev == "acquired") == ["a", "b", "test"]
    first, second = [who for ev, who in events if ev == "acquired"][1:]
    released = {who.rsplit("-", 1)[0]: float(ts) for ts, ev, who in log if ev == "released"}
    assert got[second] >= released[first] >= got[first] + 1.0, log  # the first's 1 s sleep ran inside its hold


def _records(rec: Record) -> list[str]:
    """The record entries of `rec` that exist on this machine (the local sshd's host)."""
    from pristine import ROOT

    paths = [f"{ROOT}/files{p}{sfx}" for p in rec.files for sfx in ("", ".absent", ".owner")]
    paths += [f"{ROOT}/runtime/{k}{sfx}" for k in rec.values for sfx in ("", ".owner")]
    return [p for p in paths if os.path.lexists(p)]


def test_an_attempt_that_fails_before_changing_drops_only_the_records_it_made(conn, tmp_path):
    from pristine import attempt, note_fresh

    old, new = tmp_path / "old.conf", tmp_path / "new.conf"
    old.write_text("recorded by an earlier attempt\n")
    earlier = Record(owner=f"test/{tmp_path.name}", files=[str(old)])
    earlier.parse(conn.run(earlier.script().render()).stdout)
    rec = Record(owner=earlier.owner, files=[str(old), str(new)], values={f"test{tmp_path}/v": "echo 1"})

    with pytest.raises(RuntimeError, match="refused"), attempt():
        out = conn.run(rec.script().render()).stdout
        note_fresh(conn, rec.owner, out)
        raise RuntimeError("refused after reading the host")
    # The earlier record (the true original) stays; this attempt's records are gone.
    assert _records(rec) == _records(earlier) and _records(earlier), _records(rec)

    # An attempt that began its change keeps its records (they describe the original the change replaced).
    with pytest.raises(RuntimeError, match="cut off"), attempt():
        out = conn.run(rec.script().render()).stdout
        note_fresh(conn, rec.owner, out)
        Change(rec.owner).write(str(new), b"gpuhost\n").run(conn)
        raise RuntimeError("cut off after the change")
    # old.conf: copy + owner (the earlier record); new.conf: absent + owner; the value: value + owner
    assert len(_records(rec)) == 6, _records(rec)
    Change(rec.owner).forget(rec).run(conn)
    assert _records(rec) == []


def test_a_provider_refusing_after_its_read_leaves_no_record(local_sshd, provider_server_for):
    """VfioBinding on this machine (through the gRPC provider server): the device is not there, so it refuses after
    the round trip that records its files; no record may stay (it would refuse the next owner of those files)."""
    from providers.vfio import VfioBindingProvider
    from testbed.provider_server import ProviderError

    srv = provider_server_for()
    r = srv.resource(VfioBindingProvider(), "gpuhost:host:VfioBinding", "refused-vfio")
    inputs = {
        "host": local_sshd.host_spec().model_dump(mode="json"),
        "devices": ["0000:ee:1f.7"],
        "mode": "address",
        "blacklist_nouveau": True,
        "disable_vga": True,
        "owner_tag": "test/refused-vfio",
        "version": VfioBindingProvider.VERSION,
    }
    rec = VfioBindingProvider()._record(inputs)
    assert _records(rec) == []
    with pytest.raises(ProviderError, match="unknown PCI address"):
        r.create(r.check(inputs))
    assert _records(rec) == []


class _Step(HostProvider):
    """A prep step reduced to converge: its plan appends a line to one file."""

    KIND = "test-step"


def _hits(conn) -> int:
    return ssh.ROUNDTRIPS.by_host.get(conn.spec.name, 0)


def test_a_change_planned_from_preflights_read_is_one_round_trip_and_a_stale_read_is_planned_again(
    conn, local_sshd, tmp_path
):
    """HostPreflight's read of a step's inputs (read_script) → the step's plan → one round trip that records, checks
    the read still holds and changes. After a hand edit the check fails: nothing changes in that round trip, the
    fresh read comes back with it, and the plan is made again from it."""
    from facts.host import facts_script, parse_host_facts
    from pristine import attempt
    from providers.preflight import parse_reads, read_script

    f = str(tmp_path / "managed.conf")
    open(f, "w").write("before\n")
    spec = {"sections": ["os-release"], "files": [f]}
    host_read = parse_reads(conn.run(read_script({"step": spec})).stdout)["step"]
    rec = Record(owner=f"test/{tmp_path.name}", files=[f])
    seen: list[str] = []

    def plan(read_out, _files, _values):
        text = parse_host_facts(read_out.decode()).files[f].text
        seen.append(text)
        return Change(rec.owner, classes=("sysctl",)).write(f, (text + "gpuhost\n").encode())

    props = {"host": local_sshd.host_spec().model_dump(mode="json"), "host_read": host_read, "owner_tag": rec.owner}
    n = _hits(conn)
    with attempt():
        _, files, _, _, _ = _Step().converge(conn, props, rec, facts_script(**spec), plan)
    assert _hits(conn) - n == 1 and seen == ["before\n"]
    assert open(f).read() == "before\ngpuhost\n" and files[f].text == "before\n"

    open(f, "w").write("hand edit\n")
    n = _hits(conn)
    with attempt():
        _, files, _, _, _ = _Step().converge(conn, props, rec, facts_script(**spec), plan)
    assert _hits(conn) - n == 2 and seen[1:] == ["before\n", "hand edit\n"]
    assert open(f).read() == "hand edit\ngpuhost\n" and files[f].text == "before\n"  # the first record stays
    Change(rec.owner).restore(files).forget(rec).run(conn)
    assert open(f).read() == "before\n" and _records(rec) == []


def test_a_guarded_change_refused_by_another_owners_record_changes_nothing_and_keeps_no_record(
    conn, local_sshd, tmp_path
):
    from facts.host import facts_script
    from pristine import attempt
    from providers.preflight import parse_reads, read_script

    mine, theirs = str(tmp_path / "mine.conf"), str(tmp_path / "theirs.conf")
    for p in (mine, theirs):
        open(p, "w").write("original\n")
    other = Record(owner=f"other/{tmp_path.name}", files=[theirs])
    other.parse(conn.run(other.script().render()).stdout)
    rec = Record(owner=f"test/{tmp_path.name}", files=[mine, theirs])
    spec = {"sections": [], "files": [mine]}
    host_read = parse_reads(conn.run(read_script({"step": spec})).stdout)["step"]
    props = {"host": local_sshd.host_spec().model_dump(mode="json"), "host_read": host_read, "owner_tag": rec.owner}

    def plan(_read, _files, _values):
        return Change(rec.owner, classes=("sysctl",)).write(mine, b"gpuhost\n").write(theirs, b"gpuhost\n")

    with pytest.raises(HostError, match=f"other/{tmp_path.name}"), attempt():
        _Step().converge(conn, props, rec, facts_script(**spec), plan)
    assert open(mine).read() == open(theirs).read() == "original\n"
    assert _records(Record(rec.owner, files=[mine])) == []  # made fresh by the refused attempt: dropped again
    Change(other.owner).forget(other).run(conn)


def test_lock_classes_let_other_classes_through_and_hold_the_same_class_and_exclusive_changes(
    conn, local_sshd, tmp_path
):
    """A "boot" change holds its lock until the test lets go: a "sysctl" change runs meanwhile; a second "boot" change
    and a change naming no class (the host lock, exclusively) wait for it. Ordering is read from the lock log."""
    tag = uuid.uuid4().hex
    go = tmp_path / "go"
    owner = f"test/{tag}"
    spec = local_sshd.host_spec()

    def run(name, classes, lines):
        c = ssh.connect(spec)
        Change(f"{owner}-{name}", classes=classes).add(lines).run(c)

    hold = threading.Thread(target=run, args=("boot1", ("boot",), [f"while [ ! -e {go} ]; do sleep 0.1; done"]))
    hold.start()
    deadline = time.monotonic() + 60
    while not any(ln.split()[1:3] == ["acquired", f"{owner}-boot1"] for ln in open(LOCK + ".log").read().splitlines()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    side = threading.Thread(target=run, args=("sysctl", ("sysctl",), ["true"]))
    side.start()
    side.join(60)
    assert not side.is_alive(), "a change of another class waited for the boot lock"
    waiters = [
        threading.Thread(target=run, args=("boot2", ("boot",), ["true"])),
        threading.Thread(target=run, args=("host", (), ["true"])),
    ]
    for t in waiters:
        t.start()
    deadline = time.monotonic() + 60
    while sum(f"waiting {owner}-" in ln for ln in open(LOCK + ".log").read().splitlines()) < 2:
        assert time.monotonic() < deadline, "the second boot change and the exclusive change did not wait"
        time.sleep(0.1)
    go.touch()
    for t in [hold, *waiters]:
        t.join(60)
    log = [ln.split() for ln in open(LOCK + ".log").read().splitlines() if f" {owner}-" in ln]
    at = {(ev, who.rsplit("-", 1)[1]): float(ts) for ts, ev, who, *_ in log}
    assert at[("acquired", "sysctl")] < at[("released", "boot1")]
    assert at[("acquired", "boot2")] >= at[("released", "boot1")]
    assert at[("acquired", "host")] >= at[("released", "boot1")]
    assert at[("acquired", "host")] >= at[("released", "sysctl")]
    assert [ln[3] for ln in log if ln[2].endswith("-boot1")] == ["boot", "boot"]  # acquired/released name the class


def _gone_or_held(path: str) -> bool:
    """`path` was removed, or it still holds something (rmdir semantics: only an empty directory goes). Other runs on
    this machine may hold records of their own under the store at the same time, so "held" is all one can ask of a
    directory the test does not own alone."""
    return not os.path.lexists(path) or bool(os.listdir(path))


def _store_dirs(path: str) -> list[str]:
    """The store's directories above the record of `path`, deepest first, up to and including BASE."""
    from pristine import BASE, ROOT

    d, out = os.path.dirname(f"{ROOT}/files{path}"), []
    while d.startswith(BASE):
        out.append(d)
        d = os.path.dirname(d)
    return out


def test_forgetting_the_last_record_removes_the_directories_that_only_held_records(conn, tmp_path):
    from pristine import BASE, ROOT

    near, deep = tmp_path / "a" / "x.conf", tmp_path / "a" / "b" / "c" / "y.conf"
    first = Record(owner=f"test/{tmp_path.name}", files=[str(near)], values={f"test{tmp_path}/a/v": "echo 1"})
    second = Record(owner=f"test/{tmp_path.name}", files=[str(deep)])
    for rec in (first, second):
        rec.parse(conn.run(rec.script().render()).stdout)
    shared = f"{ROOT}/files{tmp_path}/a"
    assert os.path.isdir(f"{shared}/b/c") and os.path.isdir(f"{ROOT}/runtime/test{tmp_path}/a")

    # Forget the nested one: its own directories go, the one it shared with the other record stays (and so every
    # directory above it).
    Change(second.owner).forget(second).run(conn)
    assert not os.path.lexists(f"{shared}/b")
    assert sorted(os.listdir(shared)) == ["x.conf.absent", "x.conf.owner"]
    assert os.path.isdir(f"{ROOT}/runtime/test{tmp_path}/a")

    # Forget the last: the whole tree under the store goes, /var/lib/gpuhost too unless something else is in it.
    Change(first.owner).forget(first).run(conn)
    assert not os.path.lexists(f"{ROOT}/files{tmp_path}") and not os.path.lexists(f"{ROOT}/runtime/test{tmp_path}")
    left = [d for d in _store_dirs(str(near)) + [f"{ROOT}/runtime/test{tmp_path}"] if not _gone_or_held(d)]
    assert left == [], left
    assert _gone_or_held(BASE) and _gone_or_held(ROOT)


def test_a_directory_holding_a_file_that_is_not_a_record_stays(conn, tmp_path):
    from pristine import BASE, ROOT, prune_lines

    rec = Record(owner=f"test/{tmp_path.name}", files=[str(tmp_path / "f.conf")])
    rec.parse(conn.run(rec.script().render()).stdout)
    foreign = f"{BASE}/operator-notes-{tmp_path.name}.txt"
    open(foreign, "w").write("not gpuhost's\n")
    try:
        Change(rec.owner).forget(rec).run(conn)
        assert open(foreign).read() == "not gpuhost's\n"  # kept, and so its directory
        assert not os.path.lexists(f"{ROOT}/files{tmp_path}")
        assert _gone_or_held(ROOT)
    finally:
        os.remove(foreign)
        Change(rec.owner).add(prune_lines([f"{ROOT}/files"])).run(conn)  # the store's own dirs, now empty


def test_a_refused_attempt_drops_its_fresh_records_and_the_directories_they_made(conn, tmp_path):
    from pristine import ROOT, attempt, note_fresh

    rec = Record(
        owner=f"test/{tmp_path.name}",
        files=[str(tmp_path / "d" / "e" / "new.conf")],
        values={f"test{tmp_path}/d/v": "echo 1"},
    )
    with pytest.raises(RuntimeError, match="refused"), attempt():
        out = conn.run(rec.script().render()).stdout
        note_fresh(conn, rec.owner, out)
        assert os.path.isdir(f"{ROOT}/files{tmp_path}/d/e")
        raise RuntimeError("refused after reading the host")
    assert _records(rec) == []
    assert not os.path.lexists(f"{ROOT}/files{tmp_path}") and not os.path.lexists(f"{ROOT}/runtime/test{tmp_path}")
    left = [d for d in _store_dirs(str(tmp_path / "d" / "e" / "new.conf")) if not _gone_or_held(d)]
    assert left == [], left


def test_preflights_read_of_a_step_is_the_steps_own_read_with_sections_carved_out_of_the_whole_read(conn, tmp_path):
    """HostPreflight runs the whole read once and carves each step's sections out of it (facts.host.step_read_script)
    instead of running them again: what it hands a step must be the very bytes the step's guard reads a moment later,
    or every first change would be refused as stale. Sections the whole read does not have (hugepages-nr, the
    initramfs stamp), the sysctls and the files run as they are; VfioBinding's initramfs listing comes after its read."""
    import base64

    from facts.host import facts_script, step_read_script
    from plans.vfio import initramfs_read, stamp
    from providers.preflight import parse_reads, read_script

    f = tmp_path / "managed.conf"
    f.write_text("one\ntwo\n")
    specs = {
        "a": {"sections": ["os-release", "cmdline", "tools", "kernel"], "files": [str(f)]},
        "b": {"sections": ["hugepages-nr", "cpu-online", "initramfs-stamp", "boot-id"], "sysctls": ["kernel.ostype"]},
        "c": {"sections": ["driverctl", "kmods", "initramfs-stamp"], "files": [str(f)], "pci_slots": ["0000:00:00"]},
    }
    out = conn.run(read_script(specs)).stdout
    assert "@@net-links\n" in out and "@@end\n" in out  # the whole read itself comes first, as before
    got = parse_reads(out)
    for name, spec in specs.items():
        guarded, _, listing = got[name].partition(" ")
        own = {k: v for k, v in spec.items() if k != "pci_slots"}
        assert base64.b64decode(guarded).decode() == conn.run(facts_script(**own)).stdout, name
        if "pci_slots" in spec:
            text = base64.b64decode(listing).decode()
            assert text == conn.run(initramfs_read(spec["pci_slots"])).stdout
            assert stamp(text) == stamp(base64.b64decode(guarded).decode())
        else:
            assert listing == ""
    with pytest.raises(ValueError, match="not sections of the whole read: hugepages-nr"):
        from facts.host import carved_script

        carved_script('"$f"', ["hugepages-nr"])
    # extra sections run where they stand between carved ones: the order is the step's own
    script = step_read_script('"$f"', sections=["cmdline", "hugepages-nr", "kernel"])
    assert script.index("awk") < script.index("hugepages-2048kB") < script.rindex("awk")

"""ManagedFile through the SDK's provider server against a real local sshd: create, no-op diff, drift, restore."""

import os
import stat
import subprocess

import pytest

from providers.base import host_input
from providers.managed_file import (
    ManagedFileProvider,
    dirs_key,
    make_dirs_lines,
    missing_dirs_command,
    not_dirs_guard,
    parent_dirs,
    parse_missing,
    parse_not_dirs,
    remove_dirs_lines,
)
from testbed.provider_server import ProviderError


def _snap(path):
    if not os.path.exists(path):
        return None
    st = os.stat(path)
    return open(path, "rb").read(), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


@pytest.fixture
def target(tmp_path):
    p = tmp_path / "etc" / "modprobe.d"
    p.mkdir(parents=True)
    return p


def _inputs(local_sshd, path: str, content: str, **more) -> dict:
    """ManagedFile's inputs: `content` at `path` on the local sshd, mode 0644 (``more``: other inputs)."""
    return {
        "host": host_input(local_sshd.host_spec()),
        "path": path,
        "content": content,
        "mode": "0644",
        "version": "1",
        **more,
    }


def test_create_noop_drift_and_byte_exact_restore(local_sshd, provider_server_for, target):
    path = str(target / "vfio.conf")
    original = b"# hand-written by an operator\noptions vfio-pci ids=10de:26b5\n"
    with open(path, "wb") as f:
        f.write(original)
    os.chmod(path, 0o640)
    os.chown(path, 0, 4)
    before = _snap(path)

    srv = provider_server_for()
    r = srv.resource(ManagedFileProvider(), "gpuhost:host:ManagedFile", "vfio-conf")
    content = "options vfio-pci ids=10de:26b5,10de:228e disable_vga=1\n"
    inputs = _inputs(local_sshd, path, content, owner="root:root", prior=None, sha256=None)
    op, outs = r.up(inputs)
    assert op == "create"
    assert open(path).read() == inputs["content"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert outs["prior"]["exists"] and outs["prior"]["mode"] == "640"

    assert r.preview(inputs).changes is False
    assert r.up(inputs)[0] == "same"

    with open(path, "a") as f:
        f.write("blacklist nouveau\n")
    refreshed = r.refresh()
    assert refreshed["content"] != inputs["content"]
    assert r.preview(inputs).changes is True
    assert r.up(inputs)[0] == "update"
    assert open(path).read() == inputs["content"]

    r.destroy()
    assert _snap(path) == before


def test_absent_file_is_removed_again_and_bad_input_fails_in_check(local_sshd, provider_server_for, target):
    path = str(target / "new.conf")
    srv = provider_server_for()
    r = srv.resource(ManagedFileProvider(), "gpuhost:host:ManagedFile", "new-conf")
    base = {"host": host_input(local_sshd.host_spec()), "content": "x\n", "prior": None, "sha256": None, "version": "1"}
    with pytest.raises(ProviderError) as e:
        r.up({**base, "path": "relative/../x", "mode": "rwx"})
    assert "path" in str(e.value.details) and "mode" in str(e.value.details)
    r.up({**base, "path": path})
    assert os.path.exists(path)
    r.destroy()
    assert not os.path.exists(path)


def test_recreate_after_lost_state_keeps_the_real_original(local_sshd, provider_server_for, target):
    """A create whose result never reached the engine (connection dropped after the write) runs again from
    scratch on a changed host: the record on the host, not the changed file, is what destroy puts back."""
    path = str(target / "limits.conf")
    with open(path, "wb") as f:
        f.write(b"# operator's original\n")
    os.chmod(path, 0o600)
    before = _snap(path)
    srv = provider_server_for()
    inputs = _inputs(local_sshd, path, "gpuhost's content\n", owner_tag="test/limits")
    lost = srv.resource(ManagedFileProvider(), "gpuhost:host:ManagedFile", "limits")
    lost.up(inputs)  # the engine never learns of this one
    assert _snap(path) != before
    again = srv.resource(ManagedFileProvider(), "gpuhost:host:ManagedFile", "limits")
    _, outs = again.up(inputs)
    assert outs["prior"]["content_b64"] == "IyBvcGVyYXRvcidzIG9yaWdpbmFsCg==" and outs["prior"]["mode"] == "600"
    again.destroy()
    assert _snap(path) == before


# -- missing parent directories ----------------------------------------------------------------------------------


def test_parent_dirs_top_down_without_root():
    assert parent_dirs("/etc/gpuhost-test/a/b/file") == [
        "/etc",
        "/etc/gpuhost-test",
        "/etc/gpuhost-test/a",
        "/etc/gpuhost-test/a/b",
    ]
    assert parent_dirs("/etc//x/f") == ["/etc", "/etc/x"]
    assert parent_dirs("/f") == []


def test_recorded_missing_dirs_parse_keeps_only_parents_of_the_path():
    assert parse_missing("/etc/x\n/etc/x/y\n", "/etc/x/y/f") == ["/etc/x", "/etc/x/y"]
    # anything else in a record (a hand edit, another path) is never made nor removed
    assert parse_missing("/etc/x\n/var\n\n", "/etc/x/f") == ["/etc/x"]
    assert parse_missing("", "/etc/x/f") == []


def test_remove_dirs_deepest_first_and_only_when_empty():
    lines = remove_dirs_lines(["/t/a", "/t/a/b", "/t"])
    assert [ln.split()[2] for ln in lines] == ["/t/a/b", "/t/a", "/t"]
    assert all(ln.startswith("rmdir -- ") for ln in lines)  # rmdir never removes a non-empty directory


def _sh(script: str) -> str:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout


def test_missing_dirs_made_0755_and_removed_only_when_empty(tmp_path):
    """The generated shell, run by a real sh on this machine's filesystem (a strict umask does not change 0755)."""
    keep = tmp_path / "keep"
    keep.mkdir(mode=0o700)
    path = f"{tmp_path}/keep/new/deeper/file"
    missing = parse_missing(_sh(missing_dirs_command(path)), path)
    assert missing == [f"{tmp_path}/keep/new", f"{tmp_path}/keep/new/deeper"]
    _sh("umask 077\n" + "\n".join(make_dirs_lines(missing)))
    for d in missing:
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o755
    assert stat.S_IMODE(keep.stat().st_mode) == 0o700  # a directory that existed is never touched
    (tmp_path / "keep" / "new" / "other").write_text("someone else's\n")
    _sh("\n".join(remove_dirs_lines(missing)))
    assert not os.path.exists(missing[1]) and os.path.isdir(missing[0])  # 'new' is not empty: it stays
    os.remove(tmp_path / "keep" / "new" / "other")
    _sh("\n".join(remove_dirs_lines(missing)))
    assert not os.path.exists(missing[0]) and keep.is_dir()


def test_a_parent_that_is_a_file_ends_the_read_before_the_record(tmp_path):
    (tmp_path / "f").write_text("x")
    out = _sh(not_dirs_guard(f"{tmp_path}/f/a/conf") + "echo RECORDED\n")
    assert parse_not_dirs(out) == [f"{tmp_path}/f"] and "RECORDED" not in out
    out = _sh(not_dirs_guard(f"{tmp_path}/d/a/conf") + "echo RECORDED\n")
    assert parse_not_dirs(out) == [] and "RECORDED" in out


def test_create_makes_missing_dirs_and_destroy_removes_only_those(local_sshd, provider_server_for, target):
    base = {"host": host_input(local_sshd.host_spec()), "content": "x=1\n", "mode": "0600", "owner": "0:0"}
    srv = provider_server_for()
    made = str(target / "gpuhost-test")
    path = f"{made}/a/b/file"
    r = srv.resource(ManagedFileProvider(), "gpuhost:host:ManagedFile", "deep")
    op, outs = r.up({**base, "path": path, "owner_tag": "test/deep"})
    assert op == "create" and open(path).read() == "x=1\n"
    assert outs["made_dirs"] == [made, f"{made}/a", f"{made}/a/b"]
    for d in outs["made_dirs"]:
        st = os.stat(d)
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o755, 0, 0)
    # a second file in a directory the first one made: its record says the directory existed
    r2 = srv.resource(ManagedFileProvider(), "gpuhost:host:ManagedFile", "beside")
    _, outs2 = r2.up({**base, "path": f"{made}/a/other", "owner_tag": "test/beside"})
    assert outs2["made_dirs"] == []
    r.destroy()
    assert not os.path.exists(f"{made}/a/b") and os.path.isfile(f"{made}/a/other")  # 'a' not empty: stays
    r2.destroy()
    assert os.listdir(made) == ["a"] and os.listdir(f"{made}/a") == []  # the documented leftover
    os.rmdir(f"{made}/a")
    os.rmdir(made)
    assert os.listdir(target) == []  # target (modprobe.d here) existed before: kept


def test_parent_that_is_a_file_is_refused_before_anything_changes(local_sshd, provider_server_for, target):
    blocker = target / "blocker"
    blocker.write_text("operator's\n")
    srv = provider_server_for()
    r = srv.resource(ManagedFileProvider(), "gpuhost:host:ManagedFile", "blocked")
    inputs = {
        "host": host_input(local_sshd.host_spec()),
        "content": "x\n",
        "path": f"{blocker}/conf",
        "owner_tag": "test/blocked",
    }
    with pytest.raises(ProviderError) as e:
        r.up(inputs)
    assert f"{blocker} exists and is not a directory" in str(e.value.details)
    assert "nothing was changed" in str(e.value.details)
    assert blocker.read_text() == "operator's\n" and os.listdir(target) == ["blocker"]
    left = subprocess.run(["grep", "-rl", "test/blocked", "/var/lib/gpuhost/pristine"], capture_output=True, text=True)
    assert left.stdout == ""  # nothing recorded either


def test_refused_by_another_owners_record_leaves_no_record_of_its_own(local_sshd, provider_server_for, target):
    """The file's record belongs to another resource (one created before directories were recorded: no record of
    them): the create is refused, and the record of missing directories it made fresh in that round trip is removed
    again (nothing of a resource the engine never stored stays)."""
    path = str(target / "new" / "shared.conf")
    srv = provider_server_for()
    base = {"host": host_input(local_sshd.host_spec()), "content": "x\n", "path": path}
    first = srv.resource(ManagedFileProvider(), "gpuhost:host:ManagedFile", "first")
    first.up({**base, "owner_tag": "test/first"})
    dirs_record = f"/var/lib/gpuhost/pristine/runtime/{dirs_key(path)}"
    os.remove(dirs_record)
    os.remove(dirs_record + ".owner")
    second = srv.resource(ManagedFileProvider(), "gpuhost:host:ManagedFile", "second")
    with pytest.raises(ProviderError) as e:
        second.up({**base, "owner_tag": "test/second"})
    assert "recorded by test/first" in str(e.value.details)
    left = subprocess.run(["grep", "-rl", "test/second", "/var/lib/gpuhost/pristine"], capture_output=True, text=True)
    assert left.stdout == "" and not os.path.exists(dirs_record)
    first.destroy()
    assert not os.path.exists(target / "new")

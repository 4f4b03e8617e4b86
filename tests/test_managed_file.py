"""ManagedFile through the SDK's provider server against a real local sshd: create, no-op diff, drift, restore."""

import os
import stat

import pytest

from providers.base import host_input
from providers.managed_file import ManagedFileProvider
from tests.engine import ProviderError


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
    inputs = {
        "host": host_input(local_sshd.host_spec()),
        "path": path,
        "content": "options vfio-pci ids=10de:26b5,10de:228e disable_vga=1\n",
        "mode": "0644",
        "owner": "root:root",
        "prior": None,
        "sha256": None,
        "version": "1",
    }
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
    inputs = {
        "host": host_input(local_sshd.host_spec()),
        "path": path,
        "content": "gpuhost's content\n",
        "mode": "0644",
        "owner_tag": "test/limits",
        "version": "1",
    }
    lost = srv.resource(ManagedFileProvider(), "gpuhost:host:ManagedFile", "limits")
    lost.up(inputs)  # the engine never learns of this one
    assert _snap(path) != before
    again = srv.resource(ManagedFileProvider(), "gpuhost:host:ManagedFile", "limits")
    _, outs = again.up(inputs)
    assert outs["prior"]["content_b64"] == "IyBvcGVyYXRvcidzIG9yaWdpbmFsCg==" and outs["prior"]["mode"] == "600"
    again.destroy()
    assert _snap(path) == before

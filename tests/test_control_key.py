"""TritonControlKey through the SDK's provider server against a real local sshd: the key is made on the host,
never carried in inputs, outputs or state, kept across re-runs, remade when broken, and delete puts back what
create found, byte for byte (absent, an operator's file, or a key that was already there)."""

import json
import os
import re
import stat

from plans.triton_runtime import KEY_VAR
from providers.base import host_input
from providers.control_key import TritonControlKeyProvider

_KEY = re.compile(rf"^{KEY_VAR}=([0-9a-f]{{64}})\n$")


def _snap(path):
    if not os.path.lexists(path):
        return None
    st = os.lstat(path)
    return open(path, "rb").read(), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def _key(path) -> str:
    m = _KEY.match(open(path).read())
    assert m, open(path).read()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and os.stat(path).st_uid == 0
    return m.group(1)


def _resource(local_sshd, provider_server_for, path):
    srv = provider_server_for()
    r = srv.resource(TritonControlKeyProvider(), "gpuhost:serving:TritonControlKey", "control-key")
    inputs = {"host": host_input(local_sshd.host_spec()), "path": path, "mode": "0600", "version": "1"}
    return r, inputs


def test_made_on_the_host_kept_remade_when_broken_and_removed_with_its_dirs(local_sshd, provider_server_for, tmp_path):
    path = str(tmp_path / "etc" / "gpuhost" / "triton-control.env")
    r, inputs = _resource(local_sshd, provider_server_for, path)
    op, outs = r.up(inputs)
    assert op == "create"
    key = _key(path)
    # The key is nowhere in what the engine keeps.
    assert key not in json.dumps(outs) and key not in json.dumps(r.refresh())
    assert outs["found"] == "absent" and outs["made_dirs"] == [str(tmp_path / "etc"), str(tmp_path / "etc" / "gpuhost")]
    assert r.up(inputs)[0] == "same" and _key(path) == key  # a re-run keeps the key Triton was started with
    stamp = outs["stamp"]
    assert re.fullmatch(r"\d+:\d+", stamp) and r.refresh()["stamp"] == stamp
    with open(path, "w") as f:
        f.write("broken\n")
    assert r.refresh().get("mode") is None  # drift: not a key file
    op, outs = r.up(inputs)
    assert op == "update"
    assert _key(path) != key
    # A new key is a new file: its stamp (Triton's restart trigger) changes with it.
    assert outs["stamp"] != stamp and r.refresh()["stamp"] == outs["stamp"]
    r.destroy()
    assert not os.path.lexists(path) and not os.path.exists(tmp_path / "etc")


def test_an_operators_file_at_the_path_comes_back_byte_for_byte(local_sshd, provider_server_for, tmp_path):
    path = str(tmp_path / "triton-control.env")
    with open(path, "wb") as f:
        f.write(b"# hand-written\nOTHER_SECRET=zq93x\n")
    os.chmod(path, 0o640)
    os.chown(path, 0, 4)
    before = _snap(path)
    r, inputs = _resource(local_sshd, provider_server_for, path)
    op, outs = r.up(inputs)
    assert op == "create" and outs["found"] == "file"
    _key(path)
    assert "zq93x" not in json.dumps(outs)  # the original stays on the host too
    r.destroy()
    assert _snap(path) == before


def test_a_key_that_was_there_is_kept_and_left_as_found(local_sshd, provider_server_for, tmp_path):
    path = str(tmp_path / "triton-control.env")
    with open(path, "w") as f:
        f.write(f"{KEY_VAR}={'ab' * 32}\n")
    os.chmod(path, 0o600)
    before = _snap(path)
    r, inputs = _resource(local_sshd, provider_server_for, path)
    r.up(inputs)
    assert _key(path) == "ab" * 32
    r.destroy()
    assert _snap(path) == before

"""Serving providers through the SDK's provider server against a real local sshd (testbed/provider_server.py)."""

import urllib.request

import pytest

from plans.triton_repo import repository_files, standin, yolov8n
from providers.base import host_input
from providers.triton_repository import TritonModelRepositoryProvider, repository_inputs
from testbed.servers.triton import STANDIN_MODEL, start_triton, triton_available


def _files(max_batch_size=8):
    return repository_files(
        [standin(yolov8n(max_batch_size=max_batch_size))], gpu_count=0, model_py=STANDIN_MODEL.read_bytes()
    )


def test_repository_create_serves_noop_drift_update_and_restore(local_sshd, provider_server_for, tmp_path):
    root = tmp_path / "srv" / "triton-repo"
    root.mkdir(parents=True)
    (root / "yolov8n").mkdir()
    (root / "yolov8n" / "config.pbtxt").write_text("# operator's old config\n")
    srv = provider_server_for()
    r = srv.resource(TritonModelRepositoryProvider(), "gpuhost:serving:TritonModelRepository", "models")
    inputs = {
        "host": host_input(local_sshd.host_spec()),
        "root": str(root),
        **repository_inputs(_files()),
        "prior": None,
        "prior_root_exists": None,
        "version": "1",
    }
    op, outs = r.up(inputs)
    assert op == "create"
    assert (root / "yolov8n" / "config.pbtxt").read_bytes() == _files()["yolov8n/config.pbtxt"]
    assert outs["prior"]["yolov8n/1/model.py"]["exists"] is False
    assert outs["prior"]["yolov8n/config.pbtxt"]["exists"] is True

    if triton_available():  # the deployed repository is what a real Triton loads
        with start_triton(root, workdir=tmp_path / "work") as t:
            assert urllib.request.urlopen(t.http_url + "/v2/models/yolov8n/ready").status == 200

    assert r.preview(inputs).changes is False
    # State written before VERSION 3 names one output priorRootExists; the update and delete below run on it.
    r.outputs = {("priorRootExists" if k == "prior_root_exists" else k): v for k, v in r.outputs.items()}
    assert "priorRootExists" in r.outputs and r.preview(inputs).changes is False
    (root / "yolov8n" / "config.pbtxt").write_text("max_batch_size: 64\n")
    assert r.refresh()["files"]["yolov8n/config.pbtxt"]["sha256"] != inputs["files"]["yolov8n/config.pbtxt"]["sha256"]
    changed = {**inputs, **repository_inputs(_files(max_batch_size=4))}
    d = r.preview(changed)
    assert d.changes is True and d.replaces == []
    assert r.up(changed)[0] == "update"
    assert b"max_batch_size: 4" in (root / "yolov8n" / "config.pbtxt").read_bytes()

    r.destroy()
    assert (root / "yolov8n" / "config.pbtxt").read_text() == "# operator's old config\n"
    assert not (root / "yolov8n" / "1" / "model.py").exists()
    # The directory it made goes too, unless something not ours is in it (Triton's python backend compiles
    # model.py into __pycache__ there when a real Triton loaded the repository above).
    made = root / "yolov8n" / "1"
    assert (sorted(p.name for p in made.iterdir()) if made.exists() else []) in ([], ["__pycache__"])
    assert (root / "yolov8n").is_dir()


def test_repository_check_refuses_escaping_paths(local_sshd, provider_server_for, tmp_path):
    from testbed.provider_server import ProviderError

    srv = provider_server_for()
    r = srv.resource(TritonModelRepositoryProvider(), "gpuhost:serving:TritonModelRepository", "bad")
    bad = {
        "host": host_input(local_sshd.host_spec()),
        "root": str(tmp_path),
        **repository_inputs({"../../etc/passwd": b"x"}),
        "version": "1",
    }
    with pytest.raises(ProviderError, match=r"files\.\.\./\.\./etc/passwd"):
        r.up(bad)

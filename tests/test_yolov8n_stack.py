"""A stack's yolov8n_torch model serves the weights file its artifact gives, and nothing else: no artifact, a
file whose sha256 or layout does not match, are refused when the config loads (before any resource)."""

import base64
import hashlib
import io
import json

import pytest
import torch

from plans.triton_model import parse_config
from serving.models import yolov8n as yolo
from serving.models.yolov8n_weights import to_ultralytics_key
from testbed.mocks import run_program
from testbed.stackfiles import stack_config


def _with_model(model: dict):
    cfg, secret = stack_config("hk-prod")
    fleet = json.loads(cfg["gpuhost:fleet"])
    fleet["services"][0]["models"] = [model]  # yolo-rt (L40S)
    cfg["gpuhost:fleet"] = json.dumps(fleet)
    return cfg, secret


def _weights_file(tmp_path, state: dict, name: str = "yolov8n.pt") -> tuple[str, str]:
    buf = io.BytesIO()
    torch.save(state, buf)
    path = tmp_path / name
    path.write_bytes(buf.getvalue())
    return str(path), hashlib.sha256(buf.getvalue()).hexdigest()


def _state():
    torch.manual_seed(0)  # the layout is what is checked here; tests/test_yolov8n_weights.py checks values
    return {to_ultralytics_key(k): v.half() for k, v in yolo.YOLOv8n().state_dict().items()}


def _refused(model: dict) -> str:
    with pytest.raises(Exception) as e:
        cfg, secret = _with_model(model)
        run_program(cfg, secret, stack="hk-prod")
    return str(e.value)


def test_a_fast_path_model_without_weights_is_refused_with_the_fix():
    msg = _refused({"name": "yolov8n", "preset": "yolov8n_torch"})
    print(msg)
    assert "fleet.services[0].models[0].artifact: required for preset yolov8n_torch: its weights file" in msg
    assert "a stack may not serve random weights" in msg


def test_weights_whose_sha256_or_layout_does_not_match_are_refused_before_any_resource(tmp_path):
    path, sha = _weights_file(tmp_path, _state())
    msg = _refused({"name": "yolov8n", "preset": "yolov8n_torch", "artifact": {"path": path, "sha256": "0" * 64}})
    print(msg)
    assert f"fleet.services[0].models[0].artifact.sha256: {path} has sha256 {sha}, config says {'0' * 64}" in msg
    bad = _state()
    bad["model.22.cv3.1.2.weight"] = torch.zeros(80, 64, 1, 1)
    path, sha = _weights_file(tmp_path, bad, "bad.pt")
    msg = _refused({"name": "yolov8n", "preset": "yolov8n_torch", "artifact": {"path": path, "sha256": sha}})
    print(msg)
    assert "fleet.services[0].models[0].artifact.path: not YOLOv8n weights" in msg
    assert (
        "key model.22.cv3.1.2.weight (detect.cv3.1.2.weight): expected shape [80, 80, 1, 1], found [80, 64, 1, 1]"
        in msg
    )


def test_the_artifact_is_the_weights_file_beside_the_model_code(tmp_path):
    path, sha = _weights_file(tmp_path, _state())
    cfg, secret = _with_model({"name": "yolov8n", "preset": "yolov8n_torch", "artifact": {"path": path, "sha256": sha}})
    rec = run_program(cfg, secret, stack="hk-prod")
    art = rec.by_name("yolo-rt-yolov8n-artifact").inputs
    assert art["dest"] == "/srv/triton-repo/yolov8n/1/weights.pt" and art["path"] == path and art["sha256"] == sha
    files = rec.by_name("yolo-rt-models").inputs["files"]
    assert {"yolov8n/1/model.py", "yolov8n/1/yolov8n.py", "yolov8n/1/yolov8n_weights.py"} <= set(files)
    cfg = parse_config(base64.b64decode(files["yolov8n/config.pbtxt"]["content"]).decode())
    assert cfg.parameters["weights"].string_value == "weights.pt"
    assert "random_weights_for_benchmarks" not in cfg.parameters


def test_an_artifact_path_that_is_no_regular_file_is_refused_without_reading_it(tmp_path):
    """A FIFO would block the loader forever, /dev/zero never ends: both refused by their type, one line each."""
    import os

    fifo = tmp_path / "weights.fifo"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero", str(tmp_path)):
        msg = _refused({"name": "yolov8n", "preset": "yolov8n_torch", "artifact": {"path": path, "sha256": "0" * 64}})
        assert (
            f"fleet.services[0].models[0].artifact.path: {path} is not a regular file; give the artifact file itself"
            in msg
        ), msg


def _config(rec, model: str = "yolov8n"):
    files = rec.by_name("yolo-rt-models").inputs["files"]
    return parse_config(base64.b64decode(files[f"{model}/config.pbtxt"]["content"]).decode())


def test_the_jpeg_decoder_reaches_config_pbtxt_and_exact_writes_nothing(tmp_path):
    """``jpeg_decoder: nvjpeg`` becomes the model's ``jpeg_decoder`` parameter; ``exact``, written or left out, is
    the model's own default and writes none, so a stack that does not choose keeps its config.pbtxt."""
    path, sha = _weights_file(tmp_path, _state())
    model = {"name": "yolov8n", "preset": "yolov8n_torch", "artifact": {"path": path, "sha256": sha}}
    pbtxt = {}
    for choice in (None, "exact", "nvjpeg"):
        cfg, secret = _with_model({**model, **({"jpeg_decoder": choice} if choice else {})})
        rec = run_program(cfg, secret, stack="hk-prod")
        pbtxt[choice] = rec.by_name("yolo-rt-models").inputs["files"]["yolov8n/config.pbtxt"]["content"]
        parsed = _config(rec)
        assert parsed.parameters["input"].string_value == "jpeg"
        if choice == "nvjpeg":
            assert parsed.parameters["jpeg_decoder"].string_value == "nvjpeg"
        else:
            assert "jpeg_decoder" not in parsed.parameters
    assert pbtxt[None] == pbtxt["exact"] != pbtxt["nvjpeg"]

"""YOLOv8n in plain PyTorch and its Triton model spec.

The spec tests are pure; the architecture tests run the model on the CPU (torch is in requirements.txt).
"""

import pytest
import torch

from plans.triton_model import parse_config
from plans.triton_repo import repository_files, yolov8n_torch
from serving.models import yolov8n_files


def test_spec_renders_the_fast_path_for_triton():
    spec = yolov8n_torch(window_us=200, instances=3, input="raw")
    files = repository_files([spec], gpu_count=1, model_files=yolov8n_files(spec.name))
    cfg = parse_config(files["yolov8n/config.pbtxt"].decode())
    assert cfg.backend == "python" and cfg.max_batch_size == 8
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [("images", 2, [640, 640, 3])]  # TYPE_UINT8
    assert cfg.parameters["input"].string_value == "raw"
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("detections", [100, 6]), ("num_detections", [1])]
    assert cfg.instance_group[0].kind == 1 and cfg.instance_group[0].count == 3  # KIND_GPU
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 200
    assert cfg.parameters["output"].string_value == "nms" and cfg.parameters["cuda_graphs"].string_value == "true"
    assert b"TritonPythonModel" in files["yolov8n/1/model.py"] and b"class YOLOv8n" in files["yolov8n/1/yolov8n.py"]


def test_jpeg_input_is_one_ragged_row_of_bytes_per_frame():
    spec = yolov8n_torch(input="jpeg")
    files = repository_files([spec], gpu_count=1, model_files=yolov8n_files(spec.name))
    cfg = parse_config(files["yolov8n/config.pbtxt"].decode())
    (images,) = cfg.input
    assert (images.name, images.data_type, list(images.dims), images.allow_ragged_batch) == ("images", 2, [-1], True)
    assert cfg.parameters["input"].string_value == "jpeg"
    assert b"def unletterbox" in files["yolov8n/1/frames.py"] and b"import frames" in files["yolov8n/1/model.py"]
    with pytest.raises(ValueError, match="needs output 'nms'"):
        yolov8n_torch(output="raw", input="jpeg")
    with pytest.raises(ValueError, match="'jpeg' or 'raw'"):
        yolov8n_torch(input="png")


def test_raw_output_and_cpu_form():
    raw = yolov8n_torch(output="raw", input="raw")
    assert [(o.name, o.data_type, o.dims) for o in raw.outputs] == [("output0", "FP16", [84, 8400])]
    cpu = yolov8n_torch(gpu=False)
    assert cpu.instance_group[0].kind == "KIND_CPU" and cpu.parameters["precision"] == "fp32"
    repository_files([cpu], gpu_count=0)  # loads where no GPU exists
    with pytest.raises(ValueError, match="nms"):
        yolov8n_torch(output="boxes")


def test_h200_preset_from_the_gpu_sweep_fills_what_the_spec_leaves_open():
    """H100/H200 low latency ships what the H200 sweep measured best (issue 18): max batch 8, 200 µs window,
    3 instances; values the spec sets itself win over the preset."""
    from plans.presets import apply_preset, preset_for

    for gpu in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        p = preset_for(gpu)
        assert (p.max_batch_size, p.max_queue_delay_microseconds, p.instance_count) == (8, 200, 3)
        assert p.preferred_batch_size == [1, 2, 4, 8]
    deployed = apply_preset(yolov8n_torch(), "NVIDIA H200")
    assert deployed.max_batch_size == 8 and deployed.instance_group[0].count == 3
    assert deployed.dynamic_batching
    assert deployed.dynamic_batching.max_queue_delay_microseconds == 200
    assert deployed.parameters["model_code"] == "yolov8n"
    mine = apply_preset(yolov8n_torch(window_us=0, instances=2, max_batch_size=16), "NVIDIA H200")
    assert mine.max_batch_size == 16 and mine.instance_group[0].count == 2
    assert mine.dynamic_batching
    assert mine.dynamic_batching.max_queue_delay_microseconds == 0


def _model():
    from serving.models import yolov8n as yolo

    torch.manual_seed(0)
    return yolo, yolo.YOLOv8n().eval()


def test_architecture_is_yolov8n_at_n_scale():
    """3,157,200 parameters: the published YOLOv8n (225 layers, 8.7 GFLOPs) counts exactly these."""
    yolo, m = _model()
    assert sum(p.numel() for p in m.parameters()) == 3_157_200
    with torch.no_grad():
        out = m(torch.rand(2, 3, 640, 640))
    assert out.shape == (2, 84, 8400)
    assert float(out[:, 4:].min()) >= 0 and float(out[:, 4:].max()) <= 1  # class scores are sigmoids


def test_fused_conv_bn_gives_the_same_outputs():
    yolo, m = _model()
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):  # non-trivial statistics, else fusing is the identity
            assert mod.running_mean is not None and mod.running_var is not None  # track_running_stats
            mod.running_mean.uniform_(-0.2, 0.2)
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.2, 0.2)
    x = torch.rand(1, 3, 640, 640)
    with torch.no_grad():
        ref = m(x)
        fused = yolo.fuse(m)(x)
    assert not any(isinstance(mod, torch.nn.BatchNorm2d) for mod in m.modules())
    assert float((fused - ref).norm() / ref.norm()) < 1e-5


def test_preprocess_is_channels_last_and_scaled():
    from serving.models.yolov8n import Preprocess

    images = torch.randint(0, 256, (2, 640, 640, 3), dtype=torch.uint8)
    x = Preprocess(torch.float32)(images)
    assert x.shape == (2, 3, 640, 640) and x.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(x[1, 2, 10, 20], images[1, 10, 20, 2].float() / 255)


def _reference_nms(boxes, scores, classes, iou_thr):
    """Plain greedy NMS per class, for comparison."""
    keep: list[int] = []
    for i in scores.argsort(descending=True).tolist():
        ok = True
        for j in keep:
            if classes[i] != classes[j]:
                continue
            lt = torch.maximum(boxes[i, :2], boxes[j, :2])
            rb = torch.minimum(boxes[i, 2:], boxes[j, 2:])
            inter = (rb - lt).clamp(min=0).prod()
            area = lambda b: (b[2] - b[0]) * (b[3] - b[1])  # noqa: E731
            if inter / (area(boxes[i]) + area(boxes[j]) - inter) > iou_thr:
                ok = False
                break
        if ok:
            keep.append(i)
    return keep


def test_fast_nms_matches_greedy_nms_on_separated_clusters():
    from serving.models.yolov8n import fast_nms

    torch.manual_seed(1)
    # 12 clusters of 5 jittered boxes (no chains across clusters), 3 classes, 8400 anchors of noise below conf.
    a = 8400
    raw = torch.zeros(1, 84, a)
    raw[0, :2] = torch.rand(2, a) * 600
    raw[0, 2:4] = 10
    raw[0, 4:] = torch.rand(80, a) * 0.1
    xyxy, sc, cl = [], [], []
    for k in range(12):
        cx, cy = 40 + 50 * k, 320
        for j in range(5):
            idx = k * 5 + j
            w = 30 + j
            raw[0, 0, idx], raw[0, 1, idx], raw[0, 2, idx], raw[0, 3, idx] = cx + j, cy, w, w
            raw[0, 4 + (k % 3), idx] = 0.5 + 0.08 * j + 0.001 * k
            xyxy.append([cx + j - w / 2, cy - w / 2, cx + j + w / 2, cy + w / 2])
            sc.append(float(raw[0, 4 + (k % 3), idx]))
            cl.append(k % 3)
    det, count = fast_nms(raw, max_det=100, conf=0.25, iou=0.45)
    keep = _reference_nms(torch.tensor(xyxy), torch.tensor(sc), torch.tensor(cl), 0.45)
    assert int(count[0, 0]) == len(keep) == 12
    got = det[0, : len(keep)]
    want = torch.tensor([[*xyxy[i], sc[i], cl[i]] for i in sorted(keep, key=lambda i: -sc[i])])
    assert torch.allclose(got, want, atol=1e-4)
    assert float(det[0, len(keep) :].abs().sum()) == 0  # rows past the count are zero


def test_stack_config_can_ask_for_the_gpu_fast_path():
    from stacks.program import PRESETS
    from stacks.schema import ServiceModel

    m = ServiceModel(name="det", preset="yolov8n_torch")
    spec = PRESETS[m.preset]().model_copy(update={"name": m.name})
    assert spec.parameters["model_code"] == "yolov8n" and spec.inputs[0].data_type == "UINT8"
    assert "max_batch_size" not in spec.model_fields_set  # left to the GPU's preset


def test_stack_config_input_field_picks_jpeg_or_raw_frames():
    from stacks.program import model_spec
    from stacks.schema import ServiceModel

    assert ServiceModel(name="det", preset="yolov8n_torch").input == "jpeg"  # new services take JPEG frames
    jpeg = model_spec(ServiceModel(name="det", preset="yolov8n_torch"), "NVIDIA H200")
    raw = model_spec(ServiceModel(name="det", preset="yolov8n_torch", input="raw"), "NVIDIA H200")
    assert (jpeg.inputs[0].dims, jpeg.inputs[0].allow_ragged_batch, jpeg.parameters["input"]) == ([-1], True, "jpeg")
    assert (raw.inputs[0].dims, raw.parameters["input"]) == ([640, 640, 3], "raw")
    assert jpeg.instance_group[0].count == raw.instance_group[0].count  # the preset applies to both


def test_mode_lists_agree_in_the_backend_the_plan_and_the_stack_schema():
    """``compile`` and ``jpeg_decoder`` are listed three times: by the backend (shipped alone into the repository,
    so it imports nothing of gpuhost's), by the plan that checks a model's parameters, and by the stack schema's
    Literals. A mode added to one list only would be accepted by the loader and refused by Triton at load, or the
    reverse."""
    import ast
    import typing
    from pathlib import Path

    from plans import triton_repo
    from serving.models import frames
    from stacks.schema import ServiceModel

    backend = ast.parse((Path(__file__).parents[1] / "serving" / "yolov8n_model.py").read_text())
    (modes,) = [
        ast.literal_eval(node.value)
        for node in backend.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COMPILE_MODES" for t in node.targets)
    ]
    fields = ServiceModel.model_fields
    assert modes == triton_repo.COMPILE_MODES == typing.get_args(fields["compile"].annotation)
    assert frames.JPEG_DECODERS == triton_repo.JPEG_DECODERS == typing.get_args(fields["jpeg_decoder"].annotation)


def test_stack_config_compile_field_reaches_the_backend_parameter():
    """``models[].compile``: auto is the backend's own default (no parameter written, a stack that does not choose
    keeps its config.pbtxt); inductor and none are written for the backend (``serving/yolov8n_model.py``), which
    reads them in ``_gpu_setup``; the CPU form takes none of them."""
    from stacks.program import model_spec
    from stacks.schema import ServiceModel

    params = {
        c: model_spec(ServiceModel(name="det", preset="yolov8n_torch", compile=c), "NVIDIA H200").parameters
        for c in ("auto", "inductor", "none")
    }
    assert "compile" not in params["auto"]
    assert (params["inductor"]["compile"], params["none"]["compile"]) == ("inductor", "none")
    files = repository_files([yolov8n_torch(compile="none")], gpu_count=1, model_files=yolov8n_files("yolov8n"))
    assert parse_config(files["yolov8n/config.pbtxt"].decode()).parameters["compile"].string_value == "none"
    with pytest.raises(ValueError, match="compile"):
        yolov8n_torch(compile="tensorrt")
    with pytest.raises(ValueError, match="GPU"):
        yolov8n_torch(gpu=False, compile="inductor")

"""YOLOv8n with weights: the test detector, the weight loaders (Ultralytics ONNX / checkpoint, state_dict,
safetensors) and their equality with the references, on CPU."""

import numpy as np
import torch

from serving.models import yolov8n as yolo
from serving.models.yolov8n_synthetic import make_test_weights, synthetic_image, synthetic_images, to_tensor


def test_synthetic_images_are_distinct_structured_and_deterministic():
    imgs = synthetic_images(16)
    assert imgs.shape == (16, 640, 640, 3) and imgs.dtype == np.uint8
    assert np.array_equal(imgs[5], synthetic_image(5)) and np.array_equal(synthetic_images(2, start=5)[0], imgs[5])
    flat = imgs.reshape(16, -1).astype(np.int16)
    assert all(np.abs(flat[i] - flat[j]).mean() > 10 for i in range(16) for j in range(i))
    # structured, not noise: neighbouring pixels are mostly equal or close
    assert float(np.abs(np.diff(imgs.astype(np.int16), axis=2)).mean()) < 8


def test_test_weights_make_an_input_dependent_detector():
    model = make_test_weights()
    again = make_test_weights()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert not model.training
    with torch.no_grad():
        raw = model(to_tensor(synthetic_images(8)))
    _, count = yolo.fast_nms(raw)
    counts = count.flatten().tolist()
    print(f"detections per image (conf 0.25): {counts}")
    assert sorted(counts)[len(counts) // 2] >= 10  # tens of detections on a typical image
    diffs = [float((raw[i] - raw[j]).abs().max()) for i in range(8) for j in range(i)]
    assert min(diffs) > 1.0  # every image its own answer


# -- loaders and their equality with the references -------------------------------------------------------------

import copy  # noqa: E402
import io  # noqa: E402
import re  # noqa: E402

import pytest  # noqa: E402

from serving.models import yolov8n_weights as yw  # noqa: E402

BOX_PX, SCORE = 0.05, 1e-4  # bounds: box rows in pixels, score rows


def ultralytics_onnx(fused: torch.nn.Module) -> bytes:
    """An ONNX file laid out as Ultralytics exports YOLOv8n: TorchScript exporter, opset 17, BN folded, 64 Conv
    nodes, initializers ``model.N.…conv.weight/bias``, node names ``/model.N/…``; plus what a name lookup misses:
    the exporter's own merged initializers (``onnx::Conv_…``), one bias shared by two Conv nodes through an
    Identity (the last box conv of level 2 reads level 1's bias: all are 1.0 by the head's bias init, and the
    exporter itself merges them into one initializer) and one weight renamed to a name that says nothing."""
    import onnx

    buf = io.BytesIO()
    torch.onnx.export(
        fused, (torch.zeros(1, 3, 640, 640),), buf,  # type: ignore[arg-type]
        opset_version=17, dynamo=False,
        input_names=["images"], output_names=["output0"],
    )  # fmt: skip
    proto = onnx.load_from_string(buf.getvalue())
    g = proto.graph

    def rename(name: str) -> str:
        m = re.match(r"^(b\d|h\d\d|detect)\.(.+)$", name)
        return yw.to_ultralytics_key(name) if m else name

    names = {i.name: rename(i.name) for i in g.initializer}
    names.update({o: rename(o) for n in g.node if n.op_type == "Identity" for o in n.output})  # the exporter's
    for i in g.initializer:
        i.name = names[i.name]
    for n in g.node:
        n.input[:] = [names.get(x, x) for x in n.input]
        n.output[:] = [names.get(x, x) for x in n.output]
        n.name = re.sub(r"^/(b\d|h\d\d|detect)/", lambda m: f"/model.{yw.OURS[m.group(1)]}/", n.name)
    convs = [n for n in g.node if n.op_type == "Conv"]
    # a shared bias through an Identity
    shared = next(n for n in convs if n.name.startswith("/model.22/cv2.2/cv2.2.2"))
    src = next(n for n in convs if n.name.startswith("/model.22/cv2.1/cv2.1.2")).input[2]
    at = list(g.node).index(shared)
    g.node.insert(at, onnx.helper.make_node("Identity", [src], ["identity_bias"], name="/model.22/Identity_bias"))
    shared.input[2] = "identity_bias"
    # a weight under a meaningless name
    w = next(i for i in g.initializer if i.name == convs[5].input[1])
    w.name = "onnx::Conv_9999"
    convs[5].input[1] = w.name
    onnx.checker.check_model(proto)
    return proto.SerializeToString()


@pytest.fixture(scope="module")
def weights():
    """(unfused test model, its Ultralytics-layout ONNX bytes, 4 images as uint8 and as FP32 NCHW)."""
    model = make_test_weights()
    data = ultralytics_onnx(yolo.fuse(copy.deepcopy(model)))
    images = synthetic_images(4, start=100)
    return model, data, images, to_tensor(images)


def _diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """max |a - b| over box rows (0..3, pixels) and over score rows (4..83)."""
    d = (a.float() - b.float()).abs()
    return float(d[:, :4].max()), float(d[:, 4:].max())


def test_test_onnx_is_laid_out_as_ultralytics_exports_it(weights):
    import onnx

    proto = onnx.load_from_string(weights[1])
    convs = [n for n in proto.graph.node if n.op_type == "Conv"]
    inits = {i.name for i in proto.graph.initializer}
    assert proto.opset_import[0].version >= 17 and len(convs) == 64
    assert {"model.0.conv.weight", "model.22.cv3.0.2.bias", "model.22.dfl.conv.weight"} <= inits
    by_name = [n for n in convs for x in n.input[1:] if x not in inits or not x.startswith("model.")]
    assert len(by_name) >= 2  # weights a lookup by model.N.… name would miss
    assert any(n.op_type == "Identity" for n in proto.graph.node)


def test_onnx_weights_equal_onnxruntime(weights, measured):
    """The project's model with the ONNX file's weights answers what onnxruntime answers for the file (FP32)."""
    import onnxruntime as ort

    _, data, _, x = weights
    model = yw.load_model(data)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())  # loaded fused
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    ref = torch.cat([torch.from_numpy(sess.run(["output0"], {"images": x[i : i + 1].numpy()})[0]) for i in range(4)])
    with torch.no_grad():
        got = model(x)
    box, score = _diff(got, ref)
    measured(f"ONNX weights vs onnxruntime output0, FP32, 4 images: max box diff {box:.2e} px, score {score:.2e}")
    assert box <= BOX_PX and score <= SCORE
    assert float((ref[0] - ref[1]).abs().max()) > 1.0  # the reference itself depends on the image


class DetectionModelStandIn(torch.nn.Module):
    """Stands in for Ultralytics' pickled ``DetectionModel`` (not installable here: it pulls ~570 MiB and replaces
    the CPU torch): a pickled module object whose ``state_dict`` has Ultralytics' 355 keys (``model.N.…``) in
    FP16, with ``.float()`` and ``.state_dict()`` as the loader uses them."""

    def __init__(self, state):
        super().__init__()
        self.sd = {yw.to_ultralytics_key(k): v.half() if v.is_floating_point() else v for k, v in state.items()}

    def float(self):
        return self

    def state_dict(self, *a, **k):  # type: ignore[override]
        return {k: v.float() if v.is_floating_point() else v for k, v in self.sd.items()}


def _reference_fp16(model):
    """The unfused model with its weights rounded to FP16 (what a checkpoint holds), FP32 compute."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for t in ref.state_dict().values():
            if t.is_floating_point():
                t.copy_(t.half().float())
    return ref


def test_checkpoint_and_state_dict_weights_equal_the_unfused_model(weights, measured):
    model, _, _, x = weights
    ref16 = _reference_fp16(model)
    with torch.no_grad():
        want, want16 = model(x), ref16(x)
    ckpt = {"model": DetectionModelStandIn(model.state_dict()), "ema": None, "epoch": -1}
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    with pytest.raises(yw.WeightsError, match="pickled objects.*sha256"):
        yw.load_model(buf.getvalue())  # untrusted: refused
    files = {
        "Ultralytics checkpoint (pickled stand-in, FP16)": (buf.getvalue(), True, want16),
        "state_dict, Ultralytics keys, FP16": (
            _save(
                {
                    yw.to_ultralytics_key(k): v.half() if v.is_floating_point() else v
                    for k, v in model.state_dict().items()
                }
            ),
            False,
            want16,
        ),  # noqa: E501
        "state_dict, project keys, FP32": (_save(model.state_dict()), False, want),
        "safetensors, Ultralytics keys, FP32": (
            _safetensors({yw.to_ultralytics_key(k): v for k, v in model.state_dict().items()}),
            False,
            want,
        ),  # noqa: E501
    }
    for what, (data, trusted, ref) in files.items():
        loaded = yw.load_model(data, trusted=trusted)
        assert len(loaded.state_dict()) == 355
        with torch.no_grad():
            got = loaded(x)
            fused = yolo.fuse(loaded)(x)
        assert torch.equal(got, ref), what  # same weights, same ops
        box, score = _diff(fused, ref)
        measured(f"{what}: equal to the unfused model; fused vs unfused max box diff {box:.2e} px, score {score:.2e}")
        assert box <= BOX_PX and score <= SCORE
    box, score = _diff(want16, want)
    measured(f"FP16-rounded weights vs FP32 weights (both FP32 compute): max box diff {box:.2f} px, score {score:.2e}")


def _save(state) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def _safetensors(state) -> bytes:
    from safetensors.torch import save

    return save({k: v.contiguous() for k, v in state.items()})


def test_layout_mismatches_are_refused_naming_key_node_and_shapes(weights):
    import onnx

    model, data, _, _ = weights
    state = {yw.to_ultralytics_key(k): v for k, v in model.state_dict().items()}
    bad = dict(state, **{"model.22.cv3.0.2.weight": torch.zeros(79, 80, 1, 1)})
    with pytest.raises(
        yw.WeightsError,
        match=r"key model\.22\.cv3\.0\.2\.weight .*expected shape \[80, 80, 1, 1\], found \[79, 80, 1, 1\]",
    ):  # noqa: E501
        yw.load_model(_save(bad))
    with pytest.raises(yw.WeightsError, match=r"missing 1: b0\.conv\.weight \(model\.0\.conv\.weight\)"):
        yw.load_model(_safetensors({k: v for k, v in state.items() if k != "model.0.conv.weight"}))
    with pytest.raises(yw.WeightsError, match=r"layer 10 has no parameters"):
        yw.load_model(_save(dict(state, **{"model.10.x": torch.zeros(1)})))
    proto = onnx.load_from_string(data)
    conv = [n for n in proto.graph.node if n.op_type == "Conv"][3]
    init = next(i for i in proto.graph.initializer if i.name == conv.input[1])
    init.CopyFrom(onnx.numpy_helper.from_array(np.zeros((8, 16, 1, 1), np.float32), init.name))
    with pytest.raises(
        yw.WeightsError,
        match=rf"ONNX Conv node {re.escape(conv.name)} \(#3, model\.2\.m\.0\.cv1\.conv\): weight expected shape \[16, 16, 3, 3\], found \[8, 16, 1, 1\]",
    ):  # noqa: E501
        yw.load_model(proto.SerializeToString())
    with pytest.raises(yw.WeightsError, match="unknown weights format"):
        yw.load_model(b"not weights at all")

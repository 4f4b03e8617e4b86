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
import json  # noqa: E402
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


class Marker:
    """A pickled object whose unpickling would run ``os.system`` (the inert reader must not run it)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.path}",))


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
    half = copy.deepcopy(model).half()  # a whole pickled module, as a checkpoint holds it (FP16)
    ckpt = {"model": half, "ema": None, "epoch": -1}
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    files = {
        "pickled module under 'model' (read inert, FP16)": (buf.getvalue(), False, want16),
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
        match=rf"ONNX Conv node {re.escape(conv.name)} \(fed by model\.2\.cv1\.conv\): expected model\.2\.m\.0\.cv1\.conv: weight \[16, 16, 3, 3\], stride \[1, 1\]; found weight \[8, 16, 1, 1\]",
    ):  # noqa: E501
        yw.load_model(proto.SerializeToString())
    with pytest.raises(yw.WeightsError, match="unknown weights format"):
        yw.load_model(b"not weights at all")


def test_onnx_nodes_are_placed_by_structure_not_order(weights):
    """The same graph with its nodes in reverse order loads to the same weights (places come from what feeds what)."""
    import onnx

    _, data, _, x = weights
    proto = onnx.load_from_string(data)
    nodes = list(proto.graph.node)
    del proto.graph.node[:]
    proto.graph.node.extend(reversed(nodes))
    a, b = yw.load_model(data), yw.load_model(proto.SerializeToString())
    assert all(torch.equal(u, v) for u, v in zip(a.state_dict().values(), b.state_dict().values()))
    places = yw._places()
    assert len(places) == yw.CONV_NODES
    assert len({(p.parents, p.shape, p.stride) for p in places.values()}) == len(places)  # no two alike


def test_a_pickled_checkpoint_runs_no_code_of_the_file(tmp_path):
    marker = tmp_path / "ran"
    buf = io.BytesIO()
    torch.save({"model": Marker(marker)}, buf)
    with pytest.raises(yw.WeightsError, match=r"ckpt.pt \(torch\): "):
        yw.load_model(buf.getvalue(), what="ckpt.pt")
    assert not marker.exists()


def _truncations(data: bytes, n: int = 40) -> list[bytes]:
    return [data[:k] for k in sorted({len(data) * i // n for i in range(1, n)} | {1, 2, 9, 20})]


def test_malformed_files_are_one_weights_error_naming_the_artifact(weights):
    """Truncated files, a run of 0xFF, non-UTF-8 names, absurd dims, safetensors offsets that overlap or run past
    the end: each one WeightsError naming the artifact, quickly (no IndexError, UnicodeDecodeError, KeyError)."""
    import time

    import onnx

    model, data, _, _ = weights
    state = {yw.to_ultralytics_key(k): v for k, v in model.state_dict().items()}
    st = _safetensors(state)
    cases: dict[str, bytes] = {f"onnx cut at {len(c)}": c for c in _truncations(data)}
    cases |= {f"safetensors cut at {len(c)}": c for c in _truncations(st)}
    cases |= {f"state_dict cut at {len(c)}": c for c in _truncations(_save(state), 8)}
    cases["0xFF run"] = b"\x08" + b"\xff" * (1 << 20)
    proto = onnx.load_from_string(data)
    cases["non-UTF-8 name"] = data.replace(b"/model.2/cv1/conv/Conv", b"/model.2/cv1/conv/\xff\xfenv")  # same length
    init = proto.graph.initializer[0]
    init.dims[:] = [1 << 40, 1 << 40]
    cases["absurd dims"] = proto.SerializeToString()
    header_len = int.from_bytes(st[:8], "little")
    header = json.loads(st[8 : 8 + header_len])
    keys = [k for k in header if k != "__metadata__"]

    def with_header(h: dict) -> bytes:
        raw = json.dumps(h).encode()
        return len(raw).to_bytes(8, "little") + raw + st[8 + header_len :]

    a, b = header[keys[0]], header[keys[1]]
    cases["overlapping offsets"] = with_header(dict(header, **{keys[1]: dict(b, data_offsets=a["data_offsets"])}))
    end = dict(a, data_offsets=[len(st), len(st) + a["data_offsets"][1] - a["data_offsets"][0]])
    cases["offsets past the end"] = with_header(dict(header, **{keys[0]: end}))
    cases["no dtype"] = with_header(dict(header, **{keys[0]: {"shape": a["shape"]}}))
    cases["header not UTF-8"] = st[:9] + b"\xff" + st[10:]
    assert cases["non-UTF-8 name"] != data
    seen: list[str] = []
    for what, blob in cases.items():
        t0 = time.monotonic()
        with pytest.raises(yw.WeightsError, match=r"^artifact\.bin\b") as e:
            yw.load_model(blob, what="artifact.bin")
        assert time.monotonic() - t0 < 30, what  # refused, not parsed for ever (a bound, not a benchmark)
        seen.append(f"{what}: {e.value}")
    print("\n".join(seen))
    for what, why in [
        ("0xFF run", "varint longer than 10 bytes"),
        ("non-UTF-8 name", "is not UTF-8"),
        ("absurd dims", "dims"),
        ("overlapping offsets", "overlap"),
        ("offsets past the end", "run outside"),
    ]:
        assert why in next(s for s in seen if s.startswith(what)), what


def test_an_artifact_must_be_a_small_regular_file(tmp_path):
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, why in [(fifo, "a FIFO"), ("/dev/zero", "a character device"), (tmp_path, "a directory")]:
        with pytest.raises(yw.WeightsError, match=rf"not a regular file \({why}\)"):
            yw.read_artifact(str(path))
    big = tmp_path / "big.onnx"
    with open(big, "wb") as f:
        f.truncate(yw.MAX_BYTES + 1)  # sparse: nothing is written
    with pytest.raises(yw.WeightsError, match=r"big.onnx: \d+ bytes, more than"):
        yw.read_artifact(str(big))
    with pytest.raises(yw.WeightsError, match=r"cannot open"):
        yw.read_artifact(str(tmp_path / "absent"))
    small = tmp_path / "w.bin"
    small.write_bytes(b"abc")
    assert yw.read_artifact(str(small)) == b"abc"

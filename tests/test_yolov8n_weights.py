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

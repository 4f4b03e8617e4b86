"""YOLOv8n (640×640, 80 classes) in plain PyTorch, after the published YOLOv8 design; serving helpers around it.

The layer graph is the one of Ultralytics' ``yolov8.yaml`` at the ``n`` scale (depth 0.33, width 0.25,
max channels 1024): Conv (conv + BN + SiLU), C2f, SPPF and the anchor-free Detect head with DFL, 3,157,200
parameters. Weights are random (PyTorch's default init, the head's bias init as the design gives it): latency
depends on the architecture and the input size, not on the weights, and no weight file can be fetched where
this runs. Load trained weights with ``load_state_dict`` where they exist.

Serving helpers (used by ``serving/yolov8n_model.py``, the Triton python backend model):

* ``fuse``: Conv+BN folded into one convolution (inference only);
* ``Preprocess``: uint8 NHWC images → normalised FP16/FP32 NCHW in channels_last memory, on the device;
* ``fast_nms``: class-aware NMS of fixed size (top-k candidates, IoU matrix, "Fast NMS" suppression by any
  higher-scoring box), with no data-dependent shapes, so it runs inside a CUDA graph.

Usage::

    model = fuse(YOLOv8n()).eval()
    raw = model(torch.rand(1, 3, 640, 640))            # [1, 84, 8400]: xywh (pixels) + 80 class scores
    boxes, count = fast_nms(raw, max_det=100)          # [1, 100, 6] x1 y1 x2 y2 score class; [1, 1]
"""

from __future__ import annotations

import math

import torch
from torch import nn

WIDTH, DEPTH, MAX_CHANNELS = 0.25, 0.33, 1024
STRIDES = (8, 16, 32)


def _ch(c: int) -> int:
    return int(math.ceil(min(c, MAX_CHANNELS) * WIDTH / 8) * 8)


def _n(n: int) -> int:
    return max(round(n * DEPTH), 1)


class Conv(nn.Module):
    """Conv2d (no bias) + BatchNorm (eps 1e-3) + SiLU; ``fuse`` folds the BN into the convolution."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
        self.bn: nn.Module = nn.BatchNorm2d(c2, eps=1e-3, momentum=0.03)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c1: int, c2: int, shortcut: bool = True):
        super().__init__()
        self.cv1, self.cv2 = Conv(c1, c2, 3), Conv(c2, c2, 3)
        self.add = shortcut and c1 == c2

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = False):
        super().__init__()
        self.c = c2 // 2
        self.cv1 = Conv(c1, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, self.c, shortcut) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c1: int, c2: int, k: int = 5):
        super().__init__()
        c_ = c1 // 2
        self.cv1, self.cv2 = Conv(c1, c_, 1), Conv(c_ * 4, c2, 1)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x):
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class DFL(nn.Module):
    """Distribution focal loss integral: expectation over 16 bins (a fixed 1×1 conv)."""

    def __init__(self, c1: int = 16):
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        self.conv.weight.data[:] = torch.arange(c1, dtype=torch.float).view(1, c1, 1, 1)
        self.c1 = c1

    def forward(self, x):
        b, _, a = x.shape
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


class Detect(nn.Module):
    def __init__(self, nc: int, ch: tuple[int, ...], reg_max: int = 16):
        super().__init__()
        self.nc, self.reg_max, self.no = nc, reg_max, nc + 4 * reg_max
        c2, c3 = max(16, ch[0] // 4, reg_max * 4), max(ch[0], min(nc, 100))
        self.cv2 = nn.ModuleList(
            nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * reg_max, 1)) for x in ch
        )
        self.cv3 = nn.ModuleList(nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for x in ch)
        self.dfl = DFL(reg_max)
        for a, b, s in zip(self.cv2, self.cv3, STRIDES):  # the design's bias init
            assert isinstance(a, nn.Sequential) and isinstance(b, nn.Sequential)
            box_out, cls_out = a[-1], b[-1]
            assert isinstance(box_out, nn.Conv2d) and isinstance(cls_out, nn.Conv2d)
            assert box_out.bias is not None and cls_out.bias is not None
            box_out.bias.data[:] = 1.0
            cls_out.bias.data[:nc] = math.log(5 / nc / (640 / s) ** 2)
        # Anchors per input shape, every one kept: a CUDA graph captured for one shape holds the address of that
        # shape's anchors, so another shape must not replace (and free) them (rect letterbox: a shape per frame size).
        self._anchor_cache: dict = {}

    def _anchors(self, feats):
        points, strides = [], []
        for f, s in zip(feats, STRIDES):
            h, w = f.shape[2:]
            sy, sx = torch.meshgrid(
                torch.arange(h, device=f.device, dtype=f.dtype) + 0.5,
                torch.arange(w, device=f.device, dtype=f.dtype) + 0.5,
                indexing="ij",
            )
            points.append(torch.stack((sx, sy), -1).view(-1, 2))
            strides.append(torch.full((h * w, 1), s, dtype=f.dtype, device=f.device))
        return torch.cat(points).transpose(0, 1), torch.cat(strides).transpose(0, 1)

    def forward(self, xs):
        b = xs[0].shape[0]
        feats = [torch.cat((self.cv2[i](xs[i]), self.cv3[i](xs[i])), 1) for i in range(len(xs))]
        shape = (tuple(f.shape[2:] for f in feats), xs[0].dtype, xs[0].device)
        if shape not in self._anchor_cache:
            self._anchor_cache[shape] = self._anchors(feats)
        anchors, strides = self._anchor_cache[shape]
        x = torch.cat([f.reshape(b, self.no, -1) for f in feats], 2)
        box, cls = x.split((self.reg_max * 4, self.nc), 1)
        lt, rb = self.dfl(box).chunk(2, 1)
        a = anchors.unsqueeze(0)
        x1y1, x2y2 = a - lt, a + rb
        dbox = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * strides
        return torch.cat((dbox, cls.sigmoid()), 1)


class YOLOv8n(nn.Module):
    """The n-scale YOLOv8 detector: [B, 3, 640, 640] in, [B, 84, 8400] out (xywh in pixels, 80 class scores)."""

    def __init__(self, nc: int = 80):
        super().__init__()
        c = [_ch(x) for x in (64, 128, 256, 512, 1024)]  # 16, 32, 64, 128, 256
        self.b0 = Conv(3, c[0], 3, 2)
        self.b1 = Conv(c[0], c[1], 3, 2)
        self.b2 = C2f(c[1], c[1], _n(3), True)
        self.b3 = Conv(c[1], c[2], 3, 2)
        self.b4 = C2f(c[2], c[2], _n(6), True)
        self.b5 = Conv(c[2], c[3], 3, 2)
        self.b6 = C2f(c[3], c[3], _n(6), True)
        self.b7 = Conv(c[3], c[4], 3, 2)
        self.b8 = C2f(c[4], c[4], _n(3), True)
        self.b9 = SPPF(c[4], c[4], 5)
        self.up = nn.Upsample(scale_factor=2.0, mode="nearest")
        self.h12 = C2f(c[4] + c[3], c[3], _n(3))
        self.h15 = C2f(c[3] + c[2], c[2], _n(3))
        self.h16 = Conv(c[2], c[2], 3, 2)
        self.h18 = C2f(c[2] + c[3], c[3], _n(3))
        self.h19 = Conv(c[3], c[3], 3, 2)
        self.h21 = C2f(c[3] + c[4], c[4], _n(3))
        self.detect = Detect(nc, (c[2], c[3], c[4]))

    def forward(self, x):
        p3 = self.b4(self.b3(self.b2(self.b1(self.b0(x)))))
        p4 = self.b6(self.b5(p3))
        p5 = self.b9(self.b8(self.b7(p4)))
        h12 = self.h12(torch.cat((self.up(p5), p4), 1))
        h15 = self.h15(torch.cat((self.up(h12), p3), 1))
        h18 = self.h18(torch.cat((self.h16(h15), h12), 1))
        h21 = self.h21(torch.cat((self.h19(h18), p5), 1))
        return self.detect([h15, h18, h21])


@torch.no_grad()
def fuse(model: nn.Module) -> nn.Module:
    """Fold every Conv's BatchNorm into its convolution (same outputs in eval mode, one kernel fewer each)."""
    for m in model.modules():
        if isinstance(m, Conv) and isinstance(m.bn, nn.BatchNorm2d):
            conv, bn = m.conv, m.bn
            assert isinstance(conv, nn.Conv2d) and bn.running_var is not None and bn.running_mean is not None
            fused = nn.Conv2d(
                conv.in_channels,
                conv.out_channels,
                conv.kernel_size,  # type: ignore[arg-type]  # a 2-tuple for Conv2d; typed as tuple[int, ...]
                conv.stride,  # type: ignore[arg-type]
                conv.padding,  # type: ignore[arg-type]
                bias=True,
            ).to(conv.weight.device, conv.weight.dtype)
            assert fused.bias is not None
            scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
            fused.weight.copy_(conv.weight * scale.view(-1, 1, 1, 1))
            fused.bias.copy_(bn.bias - bn.running_mean * scale)
            m.conv, m.bn = fused, nn.Identity()
    return model


class Preprocess(nn.Module):
    """uint8 [B, H, W, 3] (RGB, NHWC as decoded) → [B, 3, H, W] in ``dtype`` scaled to 0..1, channels_last.

    The permute of an NHWC tensor is already channels_last in memory, so the only work is one cast and scale,
    done on the GPU: the wire carries 1 byte per value instead of 2 (FP16) or 4 (FP32).
    """

    def __init__(self, dtype: torch.dtype = torch.float16):
        super().__init__()
        self.dtype = dtype

    def forward(self, images):
        return images.permute(0, 3, 1, 2).to(self.dtype).mul_(1.0 / 255.0).contiguous(memory_format=torch.channels_last)


def fast_nms(
    raw: torch.Tensor,
    *,
    max_det: int = 100,
    candidates: int = 256,
    conf: float = 0.25,
    iou: float = 0.45,
    max_wh: float = 7680.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Class-aware NMS with static shapes on ``raw`` [B, 4 + nc, A] (xywh + scores).

    The ``candidates`` best anchors (by their best class score) enter an IoU matrix; a box is dropped when a
    higher-scoring box of the same class overlaps it above ``iou`` ("Fast NMS": a dropped box still
    suppresses, which can only drop more), then boxes under ``conf`` are masked. Returns detections
    [B, max_det, 6] (x1, y1, x2, y2, score, class; rows past the count are zero) and counts [B, 1] int32.
    """
    b = raw.shape[0]
    scores, classes = raw[:, 4:, :].max(1)  # [B, A]
    k = min(candidates, raw.shape[2])
    top, idx = scores.topk(k, 1)  # sorted, descending
    xywh = raw[:, :4, :].gather(2, idx.unsqueeze(1).expand(b, 4, k)).transpose(1, 2).float()  # [B, k, 4]
    cls = classes.gather(1, idx).float()
    boxes = torch.cat((xywh[..., :2] - xywh[..., 2:] / 2, xywh[..., :2] + xywh[..., 2:] / 2), 2)
    shifted = boxes + (cls * max_wh).unsqueeze(2)  # other classes never overlap
    area = (shifted[..., 2] - shifted[..., 0]).clamp(min=0) * (shifted[..., 3] - shifted[..., 1]).clamp(min=0)
    lt = torch.maximum(shifted[:, :, None, :2], shifted[:, None, :, :2])
    rb = torch.minimum(shifted[:, :, None, 2:], shifted[:, None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(3)
    ious = inter / (area[:, :, None] + area[:, None, :] - inter + 1e-7)
    ious = ious.triu(1)  # only higher-scoring boxes count
    keep = (ious.max(1).values <= iou) & (top.float() > conf)  # [B, k]
    # Stable order: kept boxes first, by score; then the top max_det.
    rank = torch.where(keep, top.float(), torch.full_like(top, -1.0, dtype=torch.float))
    order = torch.argsort(rank, dim=1, descending=True, stable=True)[:, :max_det]
    sel = keep.gather(1, order)
    det = torch.cat(
        (
            boxes.gather(1, order.unsqueeze(2).expand(-1, -1, 4)),
            top.float().gather(1, order)[..., None],
            cls.gather(1, order)[..., None],
        ),
        2,
    )
    det = det * sel.unsqueeze(2)
    return det, sel.sum(1, keepdim=True, dtype=torch.int32)

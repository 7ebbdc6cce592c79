"""The layers of a grouped network (:mod:`fdlit.execution.grouped`) on M clients' stacked parameters.

Activations come in four layouts:

* ``image``: B x (M*C) x H x W, every client's C channels side by side, channels-last memory;
* ``rows``: M x B x F, one row per client and sample (after Flatten);
* ``shared-image`` / ``shared-rows``: one input for every client alike (inference on the public or
  test set), B x C x H x W or B x F, until the first layer with per-client parameters.

Each function takes the layer's stacked parameters (``params[name + ".weight"]``: M x shape) and
returns the output in its layout; ``Value`` pairs a tensor with its layout.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

CHANNELS_LAST = torch.channels_last
IMAGE, ROWS, SHARED_IMAGE, SHARED_ROWS = "image", "rows", "shared-image", "shared-rows"


class Value(NamedTuple):
    tensor: torch.Tensor
    layout: str

    @property
    def shared(self) -> bool:
        return self.layout in (SHARED_IMAGE, SHARED_ROWS)

    @property
    def image(self) -> bool:
        return self.layout in (IMAGE, SHARED_IMAGE)


def channels_last(t: torch.Tensor) -> torch.Tensor:
    # pooling and activations are slow on NCHW on a CPU; cuDNN's fast bf16 kernels are NHWC
    return t if t.is_contiguous(memory_format=CHANNELS_LAST) else t.contiguous(memory_format=CHANNELS_LAST)


def per_client(v: Value, m: int) -> Value:
    """A shared value as every client's own copy (the first layer that needs per-client layout)."""
    if v.layout == SHARED_IMAGE:
        return Value(channels_last(v.tensor.repeat(1, m, 1, 1)), IMAGE)
    if v.layout == SHARED_ROWS:
        return Value(v.tensor.unsqueeze(0).expand(m, *v.tensor.shape), ROWS)
    return v


def stacked_input(x: torch.Tensor, shared: bool, flat: bool = False) -> Value:
    """M x B x C x H x W (each client's own batch) or B x C x H x W (shared) as a grouped value;
    ``flat``: the network flattens its input first (an MLP), so it comes in as rows at once."""
    if flat:
        return Value(x.flatten(1), SHARED_ROWS) if shared else Value(x.flatten(2), ROWS)
    if shared:
        return Value(x, SHARED_IMAGE if x.dim() == 4 else SHARED_ROWS)
    if x.dim() == 5:  # -> B x (M*C) x H x W, channels-last
        return Value(x.transpose(0, 1).flatten(1, 2).contiguous(memory_format=CHANNELS_LAST), IMAGE)
    return Value(x.flatten(2), ROWS)


def conv2d(module: nn.Conv2d, params, name: str, v: Value, m: int) -> Value:
    weight = params[f"{name}.weight"]  # M x O x I/g x kh x kw
    bias = params.get(f"{name}.bias")
    weight = weight.reshape(-1, *weight.shape[2:])
    bias = None if bias is None else bias.reshape(-1)
    h = v.tensor
    if v.layout == SHARED_IMAGE and module.groups == 1:
        groups = 1  # one ordinary convolution with M times the output channels
    else:
        h = per_client(v, m).tensor
        groups = module.groups * m
    if weight.shape[1] == 1 and weight.is_contiguous():
        # one input channel per group: the layout is ambiguous and oneDNN would write NCHW; the
        # same memory viewed with channels-last strides makes it write channels-last (3x
        # cheaper than NCHW plus a copy for the first LeNet-5 convolution on a shared input)
        weight = weight.as_strided(weight.shape, (weight.stride(0), 1, weight.stride(2), weight.stride(3)))
    out = F.conv2d(h, weight, bias, module.stride, module.padding, module.dilation, groups)
    return Value(channels_last(out), IMAGE)


def batch_norm(module: nn.modules.batchnorm._BatchNorm, params, buffers, name: str, v: Value, m: int,
               training: bool) -> Value:
    """M per-client BatchNorms as one over M*C channels: every channel's batch statistics are its
    own, and the running statistics are views of the stacked M x C buffers, updated in place (each
    client's with the common momentum), so every client keeps its own."""
    h = per_client(v, m).tensor
    weight, bias = params.get(f"{name}.weight"), params.get(f"{name}.bias")
    mean, var = buffers.get(f"{name}.running_mean"), buffers.get(f"{name}.running_var")
    tracked = buffers.get(f"{name}.num_batches_tracked")
    use_batch = training or mean is None
    if training and tracked is not None:
        tracked.add_(1)
    out = F.batch_norm(h, None if mean is None else mean.view(-1), None if var is None else var.view(-1),
                       None if weight is None else weight.reshape(-1), None if bias is None else bias.reshape(-1),
                       use_batch, module.momentum, module.eps)
    return Value(out, IMAGE)


def linear(params, name: str, v: Value, m: int, fused_bias: bool = True) -> Value:
    """One batched product M x B x in times M x in x out plus the bias: fused (``baddbmm``), or, with
    ``fused_bias`` off, the product and then the bias added, as vmap's linear computes it (the
    same bits as the vmapped step)."""
    h = per_client(v, m).tensor
    weight = params[f"{name}.weight"]  # M x out x in
    bias = params.get(f"{name}.bias")
    if bias is not None and fused_bias:
        return Value(torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2)), ROWS)
    out = torch.bmm(h, weight.transpose(1, 2))
    if bias is not None:
        out = out + bias.unsqueeze(1)
    return Value(out, ROWS)


def flatten(v: Value, m: int) -> Value:
    """B x (M*C) x H x W -> M x B x (C*H*W), each client's own order (C, H, W)."""
    h = v.tensor
    if v.layout == SHARED_IMAGE:
        return Value(h.flatten(1), SHARED_ROWS)
    b, mc, hh, ww = h.shape
    return Value(h.reshape(b, m, mc // m, hh, ww).transpose(0, 1).reshape(m, b, -1), ROWS)


def add(a: Value, b: Value, m: int) -> Value:
    """A residual connection's sum (or any sum of two activations in one layout)."""
    if a.layout != b.layout:
        a, b = per_client(a, m), per_client(b, m)
    if a.layout != b.layout:
        raise ValueError(f"cannot add activations laid out as {a.layout} and {b.layout}")
    return Value(a.tensor + b.tensor, a.layout)


def dropout(module: nn.Dropout, v: Value, m: int, training: bool) -> Value:
    if training and module.p > 0:
        v = per_client(v, m)  # every client its own mask
    return Value(F.dropout(v.tensor, module.p, training), v.layout)

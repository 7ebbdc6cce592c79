"""Same-architecture convolutional networks of M clients run as one grouped network, without vmap.

On a CPU, ``torch.func.vmap`` over a convolution with per-client weights runs one grouped
convolution on a contiguous (NCHW) tensor, and the max-pooling after it as NCHW pooling, which
oneDNN and ATen compute slowly at LeNet-5's sizes: 20 LeNet-5 clients' training step (64 samples
each) took 1.4-1.6x the CPU of one client after another, the grouped network 0.6-0.8x
(benchmarks/stacked_conv.py, docs/vectorized-executor.md). The grouped network lays the clients' activations out as one image batch
with every client's channels side by side, B x (M*C) x H x W, in channels-last memory:

* Conv2d: one convolution with ``groups = M * groups`` (weights stacked along the output channels);
  on a shared input (inference on the public or test set), the first convolution is one ordinary
  convolution with M times the output channels;
* pooling and element-wise activations: once on the whole batch (a ReLU right before a max-pool
  runs after it, on a quarter of the values: max and ReLU commute, values and gradients are equal);
* Flatten: back to one row per client and sample (M x B x C*H*W, each client's own order);
* Linear: one batched matrix product (M x B x in times M x in x out).

It applies to networks whose forward is a chain of these layers (each layer's input is the previous
layer's output, every layer called once; :meth:`GroupedNetwork.build` checks this on one sample) that
start with a convolution and end in Linear (or Flatten) layers; any other network runs under vmap.
BatchNorm runs under vmap too: channels-last batch statistics are vectorised across channels, so
their last bits depend on the number of channels (M*C); through the running statistics that would
carry into inference. The convolutions' bias and weight gradients have the same property, so a
client's last bits depend on how many clients share its step (a chunk, or clients out of batches):
runs are deterministic, and chunks agree with the whole stack within float rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

ELEMENTWISE = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Hardtanh,
               nn.Identity, nn.Dropout)
POOLING = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)
CHANNELS_LAST = torch.channels_last
INFERENCE_ACTIVATION_BYTES = 8 << 20  # the largest activation of one inference call, all clients together


def _chain(net: nn.Module, sample: torch.Tensor) -> tuple[list[tuple[str, nn.Module]], int] | None:
    """The leaf modules of ``net`` in call order when its forward on ``sample`` (one sample) is a
    chain of them, and the largest layer output's element count; None otherwise (a functional op
    between layers, a skip connection, a layer called twice)."""
    leaves = {m: n for n, m in net.named_modules() if next(m.children(), None) is None}
    calls: list[tuple[str, nn.Module, int, torch.Tensor]] = []

    def record(module, args, output):
        calls.append((leaves[module], module, id(args[0]) if args else -1, output))

    handles = [m.register_forward_hook(record) for m in leaves]
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            out = net(sample)
    finally:
        net.train(was_training)
        for h in handles:
            h.remove()
    if not calls or len({id(m) for _, m, _, _ in calls}) != len(calls) or out is not calls[-1][3]:
        return None
    previous = id(sample)
    for _, _, arg, output in calls:
        if arg != previous:
            return None
        previous = id(output)
    return [(name, module) for name, module, _, _ in calls], max(out.numel() for *_, out in calls)


def _supported(layers: list[tuple[str, nn.Module]]) -> bool:
    if not layers or not isinstance(layers[0][1], nn.Conv2d):
        return False
    image = True  # activations are B x (M*C) x H x W until Flatten, then M x B x F
    for _, m in layers:
        if isinstance(m, nn.Conv2d):
            ok = image and m.padding_mode == "zeros" and isinstance(m.padding, tuple)
        elif isinstance(m, POOLING):
            ok = image and not getattr(m, "return_indices", False)
        elif isinstance(m, nn.Flatten):
            ok = image and m.start_dim == 1 and m.end_dim == -1
            image = False
        elif isinstance(m, nn.Linear):
            ok = not image
        else:
            ok = isinstance(m, ELEMENTWISE) and not (isinstance(m, nn.Dropout) and m.inplace)
        if not ok:
            return False
    return not image


class GroupedNetwork:
    """A chain network's forward on stacked parameters (module docstring). Build it with
    :meth:`build`; call it with the stacked parameters and buffers (names relative to the network)."""

    def __init__(self, layers: list[tuple[str, nn.Module]], widest: int):
        self.layers = layers
        self.widest = widest  # elements of the largest activation of one client on one sample

    @classmethod
    def build(cls, net: nn.Module, sample: torch.Tensor) -> GroupedNetwork | None:
        """The grouped form of ``net`` (``sample``: one input of one client), or None when ``net``
        is not a supported chain (see the module docstring)."""
        chain = _chain(net, sample[:1])
        return cls(*chain) if chain is not None and _supported(chain[0]) else None

    def inference_batch(self, clients: int, element_size: int, limit: int) -> int:
        """Samples per inference call: as many as keep the stack's largest activation under
        ``INFERENCE_ACTIVATION_BYTES``, at least 1 and at most ``limit``. 20 LeNet-5 clients' first
        activation on 128 samples is 48 MB, beyond the CPU caches and glibc's mmap threshold (every call then page-faults its
        memory in again); 16 samples per call took half the CPU of 128 (benchmarks/stacked_conv.py)."""
        return max(1, min(limit, INFERENCE_ACTIVATION_BYTES // max(1, self.widest * clients * element_size)))

    def __call__(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor,
                 training: bool, shared: bool = False) -> torch.Tensor:
        """Logits M x B x K. ``x``: M x B x C x H x W (each client's own batch), or B x C x H x W
        for every client alike with ``shared``. ``training``: the clients' mode (dropout; the layers
        kept here are one client's, whose own mode may differ). ``buffers``: none in the supported
        layers; taken for the vmapped forward's signature."""
        m = len(params[f"{self.layers[0][0]}.weight"])
        h = x
        if not shared:  # M x B x C x H x W -> B x (M*C) x H x W, channels-last
            h = x.transpose(0, 1).flatten(1, 2).contiguous(memory_format=CHANNELS_LAST)
        layers = self.layers
        i = 0
        while i < len(layers):
            name, module = layers[i]
            following = layers[i + 1][1] if i + 1 < len(layers) else None
            if isinstance(module, nn.ReLU) and isinstance(following, nn.MaxPool2d):
                h = following(h)  # the max-pool first: on a quarter of the values, with equal results
                h = F.relu(h)
                i += 2
                continue
            if isinstance(module, nn.Conv2d):
                first_shared = shared and i == 0
                h = self._conv(module, params, name, h, m, first_shared)
            elif isinstance(module, nn.Flatten):  # B x (M*C) x H x W -> M x B x (C*H*W), each client's order
                b, mc, hh, ww = h.shape
                h = h.reshape(b, m, mc // m, hh, ww).transpose(0, 1).reshape(m, b, -1)
            elif isinstance(module, nn.Linear):
                weight = params[f"{name}.weight"]  # M x out x in
                bias = params.get(f"{name}.bias")
                h = torch.bmm(h, weight.transpose(1, 2)) if bias is None else torch.baddbmm(
                    bias.unsqueeze(1), h, weight.transpose(1, 2))
            elif isinstance(module, nn.Dropout):
                h = F.dropout(h, module.p, training)
            else:  # element-wise activations and pooling: the same on every channel
                h = module(h)
            i += 1
        return h

    @staticmethod
    def _conv(module: nn.Conv2d, params, name: str, h: torch.Tensor, m: int, first_shared: bool) -> torch.Tensor:
        weight = params[f"{name}.weight"]  # M x O x I/g x kh x kw
        bias = params.get(f"{name}.bias")
        weight = weight.reshape(-1, *weight.shape[2:])
        bias = None if bias is None else bias.reshape(-1)
        groups = module.groups if first_shared else module.groups * m
        if first_shared and module.groups != 1:  # each client's channels side by side: one copy per client
            h, groups = h.repeat(1, m, 1, 1), module.groups * m
        if weight.shape[1] == 1 and weight.is_contiguous():
            # one input channel per group: the layout is ambiguous and oneDNN would write NCHW; the
            # same memory viewed with channels-last strides makes it write channels-last (3x
            # cheaper than NCHW plus a copy for the first LeNet-5 convolution on a shared input)
            weight = weight.as_strided(weight.shape, (weight.stride(0), 1, weight.stride(2), weight.stride(3)))
        out = F.conv2d(h, weight, bias, module.stride, module.padding, module.dilation, groups)
        # pooling and activations are slow on NCHW here
        return out if out.is_contiguous(memory_format=CHANNELS_LAST) else out.contiguous(memory_format=CHANNELS_LAST)


def grouped_training_step(step, network: GroupedNetwork, names: list[str], prefix: str):
    """The stacked training step with ``network`` as the forward: every client's logits from the
    grouped network, each client's loss under vmap on its own logits (``step``: a
    :class:`~fdlit.execution.vmap_step.TrainingStep` with ``logits_in``, whose parameters are swapped
    for the client's slice, so loss terms that read them, e.g. FedProx's, see the client's own), and
    one backward pass of the summed losses. Called as the vmapped step is: ``fn(params, buffers, x,
    t, w, state)`` -> (gradients, (losses, buffers)); ``names``: the stack's parameter names,
    ``prefix``: the network's prefix in them."""
    full = ["client.model." + n for n in names]
    local = [n.removeprefix(prefix) for n in names]

    def client_loss(params, logits, t, w, state):
        return functional_call(step, dict(zip(full, params, strict=True)), (logits, t, w, state))

    losses = vmap(client_loss, randomness="different")

    def fn(params, buffers, x, t, w, state):
        leaves = [p.detach().requires_grad_() for p in params]
        with torch.enable_grad():  # no supported layer has buffers: ``buffers`` comes back as it went in
            logits = network(dict(zip(local, leaves, strict=True)), {}, x, step.net.training)
            loss = losses(leaves, logits, t, w, state)
        return torch.autograd.grad(loss.sum(), leaves), (loss.detach(), buffers)

    return fn

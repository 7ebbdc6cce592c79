"""CPU time of one stacked convolutional network's training step (forward + backward) and of
inference, per form.

    python benchmarks/stacked_conv.py [--model lenet5] [--clients 20] [--batch 64] [--repeats 5]
                                      [--eval_samples 1024] [--image 32]

``--model``: ``lenet5`` (28x28 grey images), ``resnet18`` (the CIFAR-stem ResNet-18 on
``--image`` x ``--image`` colour images: residual blocks and BatchNorm), ``convbn`` (LeNet-5's
convolutions with BatchNorm after each, 28x28).

One thread. Forms of the same computation (M clients, each its own weights and its own batch):

* ``per-client loop``: one client after another, as the sequential executor computes it;
* ``vmap``: ``torch.func.vmap`` over the clients' stacked weights (the vectorized executor's step
  for networks the grouped form does not cover);
* ``vmap, channels-last weights``: the same with the convolution weights stored channels-last
  before the transform;
* ``grouped, per-client convolutions``: the grouped network with each convolution run client by
  client (slices of the grouped activations);
* ``grouped``: :class:`fdlit.execution.grouped.GroupedNetwork` (one grouped convolution per layer on
  channels-last activations, batched matrix products after Flatten).

Forms are timed in interleaved rounds (every form once per repeat) and the median CPU time per call
is reported with its ratio to the per-client loop. Inference: every client's logits on
``--eval_samples`` shared inputs (the public or test set), 1,024 per call for the loop (the
sequential executor's batch), ``--eval_batch`` per call for the stacked forms.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from fdlit.execution.grouped import GroupedNetwork
from fdlit.models import LeNet5, ResNet18


class ConvBN(torch.nn.Sequential):
    """LeNet-5's convolutions with BatchNorm after each: a chain with BatchNorm."""

    def __init__(self):
        nn = torch.nn
        super().__init__(nn.Conv2d(1, 6, 5, padding=2), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 16, 5), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 10))


def build(model: str, image: int):
    """(network factory, input shape of one sample)."""
    if model == "resnet18":
        return (lambda: ResNet18((3, image, image), 10)), (3, image, image)
    return (ConvBN if model == "convbn" else (lambda: LeNet5((1, 28, 28), 10))), (1, 28, 28)


def cpu_ms(fn) -> float:
    start = time.process_time()
    fn()
    return (time.process_time() - start) * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="lenet5", choices=["lenet5", "resnet18", "convbn"])
    p.add_argument("--image", type=int, default=32, help="resnet18: image side")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--eval_samples", type=int, default=1024)
    p.add_argument("--eval_batch", type=int, default=128, help="samples per stacked inference call")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m, b = args.clients, args.batch
    factory, shape = build(args.model, args.image)
    nets = [factory() for _ in range(m)]
    x, t = torch.randn(m, b, *shape), torch.randint(0, 10, (m, b))
    names = [n for n, _ in nets[0].named_parameters()]
    stack = {n: torch.stack([dict(net.named_parameters())[n].detach() for net in nets]).requires_grad_() for n in names}
    buffers = {n: torch.stack([dict(net.named_buffers())[n] for net in nets]) for n, _ in nets[0].named_buffers()}
    stack_cl = {n: (v.detach().transpose(2, 4).contiguous().transpose(2, 4) if v.dim() == 5 else v.detach())
                .requires_grad_() for n, v in stack.items()}  # conv weights channels-last per client
    grouped = GroupedNetwork.build(nets[0], x[0, :1])
    assert grouped is not None, f"{args.model} is not covered by the grouped network"

    def loss_of(logits):
        return F.cross_entropy(logits.flatten(0, 1), t.flatten(), reduction="none").view(m, b).mean(1).sum()

    def per_client_loop():
        for net, xi, ti in zip(nets, x, t, strict=True):
            F.cross_entropy(net(xi), ti).backward()

    def vmapped(params):
        def step():
            one = lambda p, bufs, xi: functional_call(nets[0], (p, bufs), (xi,))  # noqa: E731
            torch.autograd.grad(loss_of(vmap(one)(params, buffers, x)), list(params.values()))
        return step

    def grouped_step():
        torch.autograd.grad(loss_of(grouped(stack, buffers, x, training=True)), list(stack.values()))

    def grouped_conv_loop():
        conv2d = F.conv2d

        def per_client(h, weight, bias, stride, padding, dilation, groups):
            per = weight.shape[0] // groups  # output channels of one client
            inputs = h.shape[1] // groups
            return torch.cat([conv2d(h[:, i * inputs:(i + 1) * inputs], weight[i * per:(i + 1) * per],
                                     None if bias is None else bias[i * per:(i + 1) * per], stride, padding, dilation)
                              for i in range(groups)], 1)

        F.conv2d = per_client
        try:
            grouped_step()
        finally:
            F.conv2d = conv2d

    forms = {"per-client loop": per_client_loop, "vmap": vmapped(stack), "vmap, channels-last weights": vmapped(stack_cl),
             "grouped, per-client convolutions": grouped_conv_loop, "grouped": grouped_step}
    if args.model != "lenet5":  # the two LeNet-5 experiments are left out
        forms = {k: v for k, v in forms.items() if k in ("per-client loop", "vmap", "grouped")}
    xs = torch.randn(args.eval_samples, *shape)

    @torch.no_grad()
    def infer_loop():
        for net in nets:
            net.eval()
            net(xs)  # the sequential executor's batch: 1,024
            net.train()

    @torch.no_grad()
    def infer_vmap():
        one = lambda p, bufs, xi: functional_call(nets[0], (p, bufs), (xi,))  # noqa: E731
        nets[0].eval()
        for i in range(0, len(xs), args.eval_batch):  # the vectorized executor's batch
            vmap(one, in_dims=(0, 0, None))(stack, buffers, xs[i:i + args.eval_batch])
        nets[0].train()

    @torch.no_grad()
    def infer_grouped():
        for i in range(0, len(xs), args.eval_batch):
            grouped(stack, buffers, xs[i:i + args.eval_batch], training=False, shared=True)

    inference = {"per-client loop": infer_loop, "vmap": infer_vmap, "grouped": infer_grouped}
    for fn in (*forms.values(), *inference.values()):
        fn()  # warm-up
    times: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, fn in forms.items():
            times.setdefault(("train", name), []).append(cpu_ms(fn))
        for name, fn in inference.items():
            times.setdefault(("infer", name), []).append(cpu_ms(fn))
    print(f"{args.model}, {m} clients, one thread, median of {args.repeats} interleaved repeats")
    print("| work | form | CPU ms | ratio to per-client loop |")
    print("|---|---|---|---|")
    for (work, name), ms in times.items():
        base = statistics.median(times[(work, "per-client loop")])
        label = f"training step, {b} samples per client" if work == "train" else f"inference, {args.eval_samples} samples"
        print(f"| {label} | {name} | {statistics.median(ms):.1f} | {statistics.median(ms) / base:.2f} |")


if __name__ == "__main__":
    main()

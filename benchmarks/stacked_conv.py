"""CPU time of one stacked LeNet-5 training step (forward + backward) and of inference, per form.

    python benchmarks/stacked_conv.py [--clients 20] [--batch 64] [--repeats 5] [--eval_samples 1024]

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
from fdlit.models import LeNet5


def cpu_ms(fn) -> float:
    start = time.process_time()
    fn()
    return (time.process_time() - start) * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--eval_samples", type=int, default=1024)
    p.add_argument("--eval_batch", type=int, default=128, help="samples per stacked inference call")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m, b = args.clients, args.batch
    nets = [LeNet5((1, 28, 28), 10) for _ in range(m)]
    x, t = torch.randn(m, b, 1, 28, 28), torch.randint(0, 10, (m, b))
    names = [n for n, _ in nets[0].named_parameters()]
    stack = {n: torch.stack([dict(net.named_parameters())[n].detach() for net in nets]).requires_grad_() for n in names}
    stack_cl = {n: (v.detach().transpose(2, 4).contiguous().transpose(2, 4) if v.dim() == 5 else v.detach())
                .requires_grad_() for n, v in stack.items()}  # conv weights channels-last per client
    grouped = GroupedNetwork.build(nets[0], x[0, :1])

    def loss_of(logits):
        return F.cross_entropy(logits.flatten(0, 1), t.flatten(), reduction="none").view(m, b).mean(1).sum()

    def per_client_loop():
        for net, xi, ti in zip(nets, x, t, strict=True):
            F.cross_entropy(net(xi), ti).backward()

    def vmapped(params):
        def step():
            one = lambda p, xi: functional_call(nets[0], p, (xi,))  # noqa: E731
            torch.autograd.grad(loss_of(vmap(one)(params, x)), list(params.values()))
        return step

    def grouped_step():
        torch.autograd.grad(loss_of(grouped(stack, {}, x, training=True)), list(stack.values()))

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
    xs = torch.randn(args.eval_samples, 1, 28, 28)

    @torch.no_grad()
    def infer_loop():
        for net in nets:
            net(xs)  # the sequential executor's batch: 1,024

    @torch.no_grad()
    def infer_vmap():
        one = lambda p, xi: functional_call(nets[0], p, (xi,))  # noqa: E731
        for i in range(0, len(xs), args.eval_batch):  # the vectorized executor's batch
            vmap(one, in_dims=(0, None))(stack, xs[i:i + args.eval_batch])

    @torch.no_grad()
    def infer_grouped():
        for i in range(0, len(xs), args.eval_batch):
            grouped(stack, {}, xs[i:i + args.eval_batch], training=False, shared=True)

    inference = {"per-client loop": infer_loop, "vmap": infer_vmap, "grouped": infer_grouped}
    for fn in (*forms.values(), *inference.values()):
        fn()  # warm-up
    times: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, fn in forms.items():
            times.setdefault(("train", name), []).append(cpu_ms(fn))
        for name, fn in inference.items():
            times.setdefault(("infer", name), []).append(cpu_ms(fn))
    print(f"LeNet-5, {m} clients, one thread, median of {args.repeats} interleaved repeats")
    print("| work | form | CPU ms | ratio to per-client loop |")
    print("|---|---|---|---|")
    for (work, name), ms in times.items():
        base = statistics.median(times[(work, "per-client loop")])
        label = f"training step, {b} samples per client" if work == "train" else f"inference, {args.eval_samples} samples"
        print(f"| {label} | {name} | {statistics.median(ms):.1f} | {statistics.median(ms) / base:.2f} |")


if __name__ == "__main__":
    main()

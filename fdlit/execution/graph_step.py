"""The grouped training step of a whole stack at one batch shape, on static tensors, replayed as a
CUDA graph (``federation.cuda_graphs``).

A grouped step of M ResNet-18 clients is a few hundred short kernels; launched one by one from
Python, the GPU waits between them. Captured once per phase and stack into a ``torch.cuda.CUDAGraph``
(forward, the clients' vmapped losses, the backward and, with ``graph_optimizer``, the fused Adam
update), a step is one launch: the inputs are copied into static tensors, the graph replays, the
losses come back in a static tensor. What a step computes does not change:

* shapes are static: a graph covers the steps in which every client of the stack trains on a batch
  of the plan's full width. Without batch-dependent layers every such step has that width (short
  batches are padded with zero-weight samples, which the loss ``sum(w * ce) / sum(w)`` leaves out,
  as in the eager step); with BatchNorm padding would enter the batch statistics, so a short last
  batch of an epoch, or a step without every client, runs eagerly, the same arithmetic;
* the first ``WARMUP`` covered steps run eagerly (on a side stream on CUDA: cuDNN's algorithm search
  and the allocator settle before the capture); the capture records the next step, and its replay
  computes it;
* the optimizer update in the graph reads the step count (Adam's bias correction) from a device
  tensor that is set before every replay from the count kept on the CPU, so eager steps in between
  (a short last batch) keep the count right; it needs one step count and one learning rate for the
  whole stack (else the update runs eagerly after the replay);
* autocast runs without its weight cache inside the step (a cached cast would outlive the capture).

What a captured step reads from Python (the loss function and its options, the method's per-client
state) is fixed for the phase: it is read once, at the capture, as the eager step reads it once per
step. Without CUDA (the tests) the same static-tensor step runs without a capture.
"""

from __future__ import annotations

import contextlib

import torch

WARMUP = 2  # eager steps before the capture


class StaticStep:
    """``step_fn`` (the grouped training step: ``fn(params, buffers, x, t, w, state)`` -> (gradients,
    (losses, buffers))) on the stack ``params`` / ``buffers``, on static inputs, with the optimizer
    update ``opt`` (a :class:`~fdlit.execution.stacked_optimizer.StackedOptimizer`) inside the graph
    (``graph_optimizer`` and ``opt.graph_safe()``) or after it. ``capture``: replay as a CUDA graph
    (CUDA only); else the same static step eagerly. Call it with a step's ``x``, ``t``, ``w`` (every
    client, the plan's full width); it returns the M losses (valid until the next call)."""

    def __init__(self, step_fn, opt, params: list[torch.Tensor], buffers: dict[str, torch.Tensor],
                 state: dict[str, torch.Tensor], dtype: torch.dtype, capture: bool, graph_optimizer: bool = True):
        self.step_fn, self.opt, self.params, self.buffers, self.state = step_fn, opt, params, buffers, state
        self.dtype, self.capture = dtype, capture
        self.optimizer_inside = graph_optimizer and opt.graph_safe()
        self.inputs: tuple[torch.Tensor, ...] | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        self.calls = 0  # steps run (eager warm-up included)
        self.replays = 0

    def __call__(self, x: torch.Tensor, t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.optimizer_inside and not self.opt.graph_safe():
            # the clients' step counts parted (clients of other sizes, BatchNorm's split steps):
            # this step runs as the eager one does
            g, (loss, _) = self.step_fn(self.params, self.buffers, x, t, w, self.state)
            self.opt.step(self.params, [gk.to(self.dtype) for gk in g], None)
            return loss
        if self.inputs is None:
            self.inputs = tuple(v.clone() for v in (x, t, w))
        else:
            for static, v in zip(self.inputs, (x, t, w), strict=True):
                static.copy_(v)
        if self.optimizer_inside:
            self.opt.prepare_graph_step()
        if not self.capture:
            self.out = self._body()
        elif self.calls < WARMUP:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.out = self._body()
            torch.cuda.current_stream().wait_stream(side)
        else:
            if self.graph is None:
                self.graph = torch.cuda.CUDAGraph()
                # thread-local: the run's other threads (the checkpoint writer, a GPU sampler) go on
                with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                    self.out = self._body()
            self.graph.replay()
            self.replays += 1
        self.calls += 1
        loss, grads = self.out
        if not self.optimizer_inside:
            self.opt.step(self.params, grads, None)
        return loss

    def _body(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x, t, w = self.inputs
        with _autocast_without_cache(x.device.type):
            g, (loss, _) = self.step_fn(self.params, self.buffers, x, t, w, self.state)  # buffers: in place
        grads = [gk.to(self.dtype) for gk in g]
        if self.optimizer_inside:
            self.opt.graph_step(self.params, grads)
        return loss, grads


def _autocast_without_cache(device: str):
    if not torch.is_autocast_enabled(device):
        return contextlib.nullcontext()
    return torch.autocast(device, dtype=torch.get_autocast_dtype(device), cache_enabled=False)


def static_step(executor, step_fn, opt, stack, buffer_names: list[str], loss_state, m: int) -> StaticStep | None:
    """The phase's captured step for the vectorized ``executor`` (``federation.cuda_graphs``; without
    CUDA the same static step, uncaptured, where ``cuda_graphs`` is set by hand, as the tests do), or
    None for the eager one: it applies to the grouped network's step (the vmapped one keeps
    functorch's transforms around the forward) on at least two clients."""
    if not executor.cuda_graphs or getattr(step_fn, "grouped_network", None) is None or m < 2:
        return None
    executor.trained["static"] = executor.trained.get("static", 0) + m  # client-phases (tests read it)
    return StaticStep(step_fn, opt, stack.params, {n: stack.buffers[n] for n in buffer_names}, loss_state,
                      stack.dtype, capture=stack.device.type == "cuda", graph_optimizer=executor.graph_optimizer)

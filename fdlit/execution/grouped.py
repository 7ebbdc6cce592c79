"""Same-architecture networks of M clients (conv nets, MLPs) run as one grouped network, without vmap.

The clients' activations are laid out as one image batch with every client's channels side by
side, B x (M*C) x H x W, in channels-last memory (:mod:`fdlit.execution.grouped_layers`):

* Conv2d: one convolution with ``groups = M * groups`` (weights stacked along the output channels);
  on a shared input (inference on the public or test set), the first convolution is one ordinary
  convolution with M times the output channels;
* BatchNorm2d: one BatchNorm over the M*C channels, which is exactly M per-client BatchNorms (batch
  statistics per channel; each client's running statistics are its slice of the stacked buffers,
  updated in place with the common momentum; eval mode reads them);
* residual connections (a sum of two activations), pooling and element-wise activations: once on
  the whole batch (a ReLU right before a max-pool runs after it, on a quarter of the values: max and
  ReLU commute, values and gradients are equal);
* Flatten: back to one row per client and sample (M x B x C*H*W, each client's own order);
* Linear: one batched matrix product (M x B x in times M x in x out); an MLP's input, flattened
  first, comes in as those rows at once.

The network's forward is read with ``torch.fx`` (:meth:`GroupedNetwork.build`): every operation must
be one of the above (``torch.flatten``, ``F.relu``, ``F.interpolate`` and ``+`` included), the network
must hold a convolution or a Linear and end in one row per sample, and the grouped forward on one sample must
reproduce the network's; anything else runs under vmap. That covers ResNet-18 (identity and 1x1-conv
downsampling shortcuts), LeNet-5 and the digits ``SmallCNN``.

Why not vmap: on a CPU, vmap over a convolution runs one grouped convolution on NCHW activations and
the max-pooling after it as NCHW pooling, which oneDNN and ATen compute slowly at LeNet-5's sizes: 20
LeNet-5 clients' training step took 1.4-1.6x the CPU of one client after another, the grouped network
0.6-0.8x (benchmarks/stacked_conv.py, docs/vectorized-executor.md). vmap over BatchNorm cannot run
cuDNN's channels-last kernels ("NYI: querying is_contiguous inside of vmap"); the grouped form is
what bf16 channels-last kernels on a GPU need (docs/gpu.md).

Channels-last reductions (BatchNorm's statistics, the convolutions' bias and weight gradients) are
vectorised across channels, so their last bits depend on the number of channels (M*C): a client's
last bits depend on how many clients share its step (a chunk, or clients out of batches). Runs are
deterministic, and chunks agree with the whole stack within float rounding.
"""

from __future__ import annotations

import copy
import operator

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.func import functional_call, vmap
from torch.utils.flop_counter import FlopCounterMode

from fdlit.execution import grouped_layers as layers
from fdlit.execution.grouped_layers import ROWS, Value
from fdlit.execution.stacked_loss import stacked_cross_entropy

ELEMENTWISE = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Hardtanh,
               nn.Identity)
POOLING = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)
RELU = (F.relu, torch.relu)
ADD = (operator.add, operator.iadd, torch.add)
# functions that act on every channel alike (image layouts only)
PER_CHANNEL = (F.interpolate, F.adaptive_avg_pool2d, F.avg_pool2d, F.max_pool2d)
# On a CPU the grouped network pays for small networks and not for wide ones (one thread, training
# step, CPU time over one client after another; benchmarks/stacked_conv.py): LeNet-5 (0.4 MFLOP a
# sample) 0.6-0.8x, LeNet-5 with BatchNorm 0.65x (vmap 1.57x), ResNet-18 on 16x16 images (140 MFLOP)
# 2.0x (vmap 1.55x). Above this many forward FLOPs per sample it runs under vmap there; the automatic
# executor choice runs such networks one client at a time anyway (fdlit.execution.selection).
CPU_MAX_GROUPED_FLOPS = 30e6
INFERENCE_ACTIVATION_BYTES = 8 << 20  # the largest activation of one inference call, all clients together (CPU)
# the precisions the grouped network runs at when conv_network is "auto": on a CPU those measured
# (benchmarks/stacked_conv.py, float32); on CUDA bf16 too (autocast: convolutions and matrix products
# in bf16, BatchNorm in float32 inside cuDNN)
AUTO_PRECISIONS = {"cpu": ("32-true", "64-true", "32", "64"),
                   "cuda": ("32-true", "64-true", "32", "64", "bf16-mixed", "bf16-true")}


class Unsupported(Exception):
    """An operation the grouped network does not implement (the network then runs under vmap)."""


def grouped_applies(conv_network: str, device: str, precision: str) -> bool:
    """Whether ``federation.executor.conv_network`` asks for the grouped network on ``device`` (a
    device type) at ``precision``; the network itself must still be covered (:meth:`GroupedNetwork.build`)
    and, with ``auto``, be one it pays for (:meth:`GroupedNetwork.pays_on`)."""
    if conv_network == "vmap":
        return False
    if conv_network == "grouped":
        return True
    return precision in AUTO_PRECISIONS.get(device, ())


def _trace(net: nn.Module) -> fx.Graph | None:
    try:
        return fx.Tracer().trace(net)
    except Exception:  # data-dependent control flow, unsupported Python: vmap instead
        return None


def _flatten_args(node: fx.Node) -> bool:
    """Whether a flatten call keeps dim 0 and flattens the rest (one row per sample)."""
    start = node.kwargs.get("start_dim", node.args[1] if len(node.args) > 1 else 0)
    end = node.kwargs.get("end_dim", node.args[2] if len(node.args) > 2 else -1)
    return start == 1 and end == -1


def _node_supported(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    if node.op in ("placeholder", "output"):
        return node.op == "output" or not node.args  # one input, no defaults
    if node.op == "call_module":
        m = modules[node.target]
        if isinstance(m, nn.Conv2d):
            return m.padding_mode == "zeros"
        if isinstance(m, nn.BatchNorm2d):
            return m.momentum is not None or not m.track_running_stats
        if isinstance(m, nn.Flatten):
            return m.start_dim == 1 and m.end_dim == -1
        if isinstance(m, POOLING):
            return not getattr(m, "return_indices", False)
        if isinstance(m, nn.Dropout):
            return not m.inplace
        return isinstance(m, (nn.Linear, *ELEMENTWISE))
    tensors = [a for a in node.args if isinstance(a, fx.Node)]
    if node.op == "call_function":
        if node.target in ADD:
            return len(node.args) == 2 and len(tensors) == 2 and not node.kwargs
        if node.target is torch.flatten:
            return _flatten_args(node)
        return node.target in RELU or node.target in PER_CHANNEL
    if node.op == "call_method":
        if node.target == "flatten":
            return _flatten_args(node)
        return node.target == "relu" and len(node.args) == 1
    return False  # get_attr (a parameter read directly), anything else


class GroupedNetwork:
    """A convolutional network's forward on stacked parameters (module docstring). Build it with
    :meth:`build`; call it with the stacked parameters and buffers (names relative to the network)."""

    def __init__(self, graph: fx.Graph, modules: dict[str, nn.Module]):
        self.nodes = list(graph.nodes)
        self.modules = modules
        # a ReLU whose only use is a max-pool runs after it (max and ReLU commute)
        self.after_pool = {n for n in self.nodes if self._is_relu(n) and len(n.users) == 1
                           and self._module(next(iter(n.users)), nn.MaxPool2d)}
        # a Flatten right after the input (an MLP): the stacked input is flattened to rows at once
        self.input_flatten = self._input_flatten()
        # conv nets: Linear as one baddbmm; networks without a convolution (MLPs): the product and
        # then the bias, the order of vmap's linear, so the grouped and the vmapped MLP agree bit for bit
        self.fused_bias = any(self._module(n, nn.Conv2d) for n in self.nodes)
        self.widest = 1  # elements of the largest activation of one client on one sample
        self.flops = 0.0  # forward FLOPs of one client on one sample
        self._compiled: tuple[str, object] | None = None

    @classmethod
    def build(cls, net: nn.Module, sample: torch.Tensor) -> GroupedNetwork | None:
        """The grouped form of ``net`` (``sample``: one input of one client), or None when ``net``
        is not covered (see the module docstring)."""
        graph = _trace(net)
        if graph is None:
            return None
        modules = dict(net.named_modules())
        if not all(_node_supported(n, modules) for n in graph.nodes):
            return None
        if not any(isinstance(modules[n.target], (nn.Conv2d, nn.Linear)) for n in graph.nodes if n.op == "call_module"):
            return None  # no layer with per-client weights
        network = cls(graph, modules)
        return network if network._reproduces(net, sample[:1]) else None

    def _reproduces(self, net: nn.Module, sample: torch.Tensor) -> bool:
        """The grouped forward of two copies of ``net`` (own inputs and shared) equals its own
        forward on ``sample`` (eval mode), both in float64 on a CPU copy (free of TF32, autocast and
        the device's kernels, so the check is tight); records the widest activation and the FLOPs."""
        probe = copy.deepcopy(net).to(device="cpu", dtype=torch.float64).eval()
        sample = sample.detach().to("cpu", torch.float64 if sample.is_floating_point() else sample.dtype)
        try:
            with torch.no_grad(), torch.autocast("cpu", enabled=False):
                with FlopCounterMode(display=False) as counter:
                    expected = probe(sample)
                self.flops = float(counter.get_total_flops())
                params = {n: torch.stack([p, p]) for n, p in probe.named_parameters()}
                buffers = {n: torch.stack([b, b]) for n, b in probe.named_buffers()}
                own = self(params, buffers, torch.stack([sample, sample]), training=False, observe=True)
                shared = self(params, buffers, sample, training=False, shared=True)
        except Exception:  # an operation in an unexpected layout or form: vmap instead
            return False
        tol = 1e-6 * max(1.0, float(expected.abs().max()))
        return all(out.shape == (2, *expected.shape) and torch.allclose(out, expected.expand_as(out), rtol=1e-6, atol=tol)
                   for out in (own, shared))

    def _input_flatten(self) -> fx.Node | None:
        users = [u for n in self.nodes if n.op == "placeholder" for u in n.users]
        if len(users) != 1:
            return None
        node = users[0]
        flat = (self._module(node, nn.Flatten) or node.target is torch.flatten
                or (node.op == "call_method" and node.target == "flatten"))
        return node if flat else None

    def pays_on(self, device: str) -> bool:
        """Whether the grouped form is the faster one on ``device`` (a device type): everywhere but
        on a CPU for networks above ``CPU_MAX_GROUPED_FLOPS``."""
        return device != "cpu" or self.flops <= CPU_MAX_GROUPED_FLOPS

    def _module(self, node: fx.Node, kind) -> bool:
        return node.op == "call_module" and isinstance(self.modules[node.target], kind)

    def _is_relu(self, node: fx.Node) -> bool:
        return (self._module(node, nn.ReLU) or (node.op == "call_function" and node.target in RELU)
                or (node.op == "call_method" and node.target == "relu"))

    def inference_batch(self, clients: int, element_size: int, limit: int, device: str = "cpu") -> int:
        """Samples per inference call. On a CPU: as many as keep the stack's largest activation under
        ``INFERENCE_ACTIVATION_BYTES``, at least 1 and at most ``limit``. 20 LeNet-5 clients' first
        activation on 128 samples is 48 MB, beyond the CPU caches and glibc's mmap threshold (every call then page-faults its
        memory in again); 16 samples per call took half the CPU of 128 (benchmarks/stacked_conv.py).
        Elsewhere ``limit`` (a GPU wants large batches)."""
        if device != "cpu":
            return limit
        return max(1, min(limit, INFERENCE_ACTIVATION_BYTES // max(1, self.widest * clients * element_size)))

    def compiled(self, backend: str | None):
        """This network's forward compiled with ``torch.compile(backend=backend)`` (once; the
        ``federation.compile_backend`` when ``federation.compile`` is on), or itself for None."""
        if backend is None:
            return self
        if self._compiled is None or self._compiled[0] != backend:
            self._compiled = (backend, torch.compile(self.__call__, backend=backend))
        return self._compiled[1]

    def __call__(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor,
                 training: bool, shared: bool = False, observe: bool = False) -> torch.Tensor:
        """Logits M x B x K. ``x``: M x B x C x H x W (each client's own batch), or B x C x H x W
        for every client alike with ``shared``. ``training``: the clients' mode (dropout, BatchNorm's
        batch statistics and running-statistics update; the modules kept here are one client's,
        whose own mode may differ). ``buffers``: the stacked BatchNorm buffers, updated in place."""
        m = len(next(iter(params.values())))
        values: dict[fx.Node, Value] = {}
        out = None
        for node in self.nodes:
            if node.op == "placeholder":
                values[node] = layers.stacked_input(x, shared, flat=self.input_flatten is not None)
            elif node.op == "output":
                out = values[node.args[0]]
            else:
                values[node] = self._run(node, values, params, buffers, m, training)
                if observe:  # per client and sample
                    v = values[node]
                    samples = len(v.tensor) if v.shared else m * (v.tensor.shape[1] if v.layout == ROWS else len(v.tensor))
                    self.widest = max(self.widest, v.tensor.numel() // samples)
        if out is None or not isinstance(out, Value) or out.image:
            raise Unsupported("the network does not end in one row per sample")
        return layers.per_client(out, m).tensor

    def _run(self, node: fx.Node, values, params, buffers, m: int, training: bool) -> Value:
        args = [values[a] if isinstance(a, fx.Node) else a for a in node.args]
        v = args[0]
        if node is self.input_flatten:
            return v  # the input came in as rows
        if node in self.after_pool:
            return v  # applied after the max-pool that follows
        if node.op == "call_module":
            name, module = node.target, self.modules[node.target]
            if isinstance(module, nn.Linear):
                if v.image:
                    raise Unsupported("Linear on an image")
                return layers.linear(params, name, v, m, self.fused_bias)
            if isinstance(module, nn.Dropout):
                return layers.dropout(module, v, m, training)
            if isinstance(module, ELEMENTWISE) and not v.image:
                return Value(F.relu(v.tensor) if isinstance(module, nn.ReLU) else module(v.tensor), v.layout)
            if not v.image:
                raise Unsupported(f"{type(module).__name__} on rows")
            if isinstance(module, nn.Conv2d):
                return layers.conv2d(module, params, name, v, m)
            if isinstance(module, nn.BatchNorm2d):
                return layers.batch_norm(module, params, buffers, name, v, m, training)
            if isinstance(module, nn.Flatten):
                return layers.flatten(v, m)
            if isinstance(module, nn.MaxPool2d) and node.args[0] in self.after_pool:
                return Value(F.relu(module(v.tensor)), v.layout)
            if isinstance(module, nn.ReLU):
                return Value(F.relu(v.tensor), v.layout)  # never in place: a shared input is the caller's
            if getattr(module, "inplace", False):
                return Value(module(v.tensor.clone()), v.layout)
            return Value(module(v.tensor), v.layout)  # per channel: pooling, activations
        if node.target in ADD:
            return layers.add(args[0], args[1], m)
        if node.target is torch.flatten or node.target == "flatten":
            if not v.image:
                raise Unsupported("flatten of rows")
            return layers.flatten(v, m)
        if node.target in RELU or node.target == "relu":
            return Value(F.relu(v.tensor), v.layout)
        if not v.image:  # PER_CHANNEL
            raise Unsupported(f"{node.target} on rows")
        kwargs = dict(node.kwargs)
        return Value(layers.channels_last(node.target(v.tensor, *args[1:], **kwargs)), v.layout)


def grouped_training_step(step, network: GroupedNetwork, names: list[str], prefix: str, forward=None,
                          plain_loss: bool = False):
    """The stacked training step with ``network`` as the forward: every client's logits from the
    grouped network; with ``plain_loss`` (:func:`~fdlit.execution.stacked_loss.loss_is_plain`) the
    clients' cross-entropies on the M x B x K logits at once, without vmap
    (:func:`~fdlit.execution.stacked_loss.stacked_cross_entropy`), else each client's loss under vmap
    on its own logits (``step``: a
    :class:`~fdlit.execution.vmap_step.TrainingStep` with ``logits_in``, whose parameters are swapped
    for the client's slice, so loss terms that read them, e.g. FedProx's, see the client's own), and
    one backward pass of the summed losses. Called as the vmapped step is: ``fn(params, buffers, x,
    t, w, state)`` -> (gradients, (losses, buffers)); ``names``: the stack's parameter names,
    ``prefix``: the network's prefix in them and in the buffers' names; ``forward``: the network's
    forward to call (its compiled form), default ``network`` itself. BatchNorm's running statistics
    are updated in place in ``buffers``, which come back."""
    full = ["client.model." + n for n in names]
    local = [n.removeprefix(prefix) for n in names]
    forward = forward or network

    def client_loss(params, logits, t, w, state):
        return functional_call(step, dict(zip(full, params, strict=True)), (logits, t, w, state))

    losses = None if plain_loss else vmap(client_loss, randomness="different")

    def fn(params, buffers, x, t, w, state):
        leaves = [p.detach().requires_grad_() for p in params]
        own_buffers = {n.removeprefix(prefix): b for n, b in buffers.items()}
        with torch.enable_grad():
            logits = forward(dict(zip(local, leaves, strict=True)), own_buffers, x, step.net.training)
            loss = stacked_cross_entropy(logits, t, w) if plain_loss else losses(leaves, logits, t, w, state)
        return torch.autograd.grad(loss.sum(), leaves), (loss.detach(), buffers)

    fn.grouped_network = network  # what a captured step (fdlit.execution.graph_step) checks for
    fn.plain_loss = plain_loss
    return fn

"""Vectorized executor: clients that share an architecture train together in one batched step.

Per group of same-architecture clients, each parameter is stacked into one ``M x shape`` tensor for
the length of a phase. Every step runs the loss vmapped over the stack (``torch.func.vmap``) and one
backward pass of the summed losses (each client's gradient lands in its own slice), so
each client computes its own forward/backward on its own batch, and the optimizer update runs
once on the stack (Adam/AdamW: ``torch.optim``'s fused kernel; SGD: its single-tensor arithmetic).
At the end of the phase parameters and optimizer state are written back into each
:class:`~fdlit.clients.ClientModule` in ``torch.optim``'s own format, so ``client_state()``,
checkpoints and the sequential executor stay interchangeable with this one.

Same computation as :class:`~fdlit.execution.executor.SequentialExecutor`:

* batch order: each client's generator gets the same ``randperm`` calls in the same order, and the
  same batch boundaries are used (a final batch of one sample is skipped);
* different private-set sizes: batches are padded to a common length with zero-weight samples and
  the loss is ``sum(w * ce) / sum(w)`` (= the batch mean); a client that has run out of batches is
  left out of the step, so its parameters, moments and step count do not move;
* BatchNorm: running statistics are stacked per client and updated in place under vmap; padding
  would enter the batch statistics, so models with BatchNorm are not padded: clients whose
  batches differ in length at a step run as separate vmapped calls (only at epoch ends);
* per-client Adam step counts (bias correction) and learning rates;
* image datasets: the parameter-free input module the loop puts in front of every network
  (``WithInput(ImageInput, net)``: uint8 -> normalised float, crop + flip from the client's own
  generator) runs per client on its real samples, outside vmap and in the same precision context,
  so augmentation draws are the sequential executor's; only ``net`` is vmapped.

Chunks: ``chunk_size`` bounds how many clients are stacked at once (memory grows with the stack:
parameters, gradients, optimizer moments and activations of every client in it); chunks run one
after another and compute exactly what one stack computes. On CUDA, without a ``chunk_size``, the
chunk is chosen from free memory and an estimate per client (:func:`client_memory_bytes`).

Not supported (``unsupported_reason`` says why; those clients run sequentially inside this
executor, and the automatic choice picks the sequential executor): buffers other than BatchNorm's,
BatchNorm with ``momentum=None``, an overridden ``training_step`` (overriding ``private_loss`` /
``public_loss`` is supported: the step calls them on the client through ``functional_call``), optimizer options
other than lr / weight_decay / momentum, ``16-mixed`` precision (needs a grad scaler). Dropout works
(``randomness="different"``) but draws from the global RNG in another order than the sequential
executor, so runs with dropout > 0 are not bit-comparable between executors.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from torch.func import functional_call, grad_and_value, vmap
from torch.nn.modules.batchnorm import _BatchNorm

from fdlit.data.augment import WithInput
from fdlit.errors import ConfigError, check_at_least
from fdlit.execution.executor import ClientExecutor, SequentialExecutor
from fdlit.execution.stacked_optimizer import StackedOptimizer
from fdlit.execution.stacking import ParamStack, is_transposed, select_rows, transposed

if TYPE_CHECKING:
    from lightning.fabric import Fabric

    from fdlit.clients import ClientModule

SUPPORTED_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)
UNSUPPORTED_PRECISIONS = ("16-mixed", "16-true", "transformer-engine")


def unsupported_reason(client: ClientModule, precision: str = "32-true") -> str | None:
    """Why ``client`` cannot be trained by :class:`VectorizedExecutor`; None when it can."""
    if precision in UNSUPPORTED_PRECISIONS:
        return f"precision {precision!r} (needs a grad scaler)"
    from fdlit.clients import ClientModule

    if type(client).training_step is not ClientModule.training_step:
        return f"{type(client).__name__} overrides training_step() (override private_loss / public_loss instead)"
    _, net, prefix = split_input(client.model)
    for name, module in net.named_modules(prefix=prefix.rstrip(".")):
        own = [n for n, _ in module.named_buffers(recurse=False)]
        if not own:
            continue
        if not isinstance(module, _BatchNorm):
            return f"module {name or 'model'} ({type(module).__name__}) has buffers {own}"
        if module.momentum is None:
            return f"BatchNorm {name} with momentum=None (cumulative average)"
    if not all(p.requires_grad for p in client.model.parameters()):
        return "frozen parameters"
    opt = client.configure_optimizers()
    if type(opt) not in SUPPORTED_OPTIMIZERS:
        return f"optimizer {type(opt).__name__}"
    if len(opt.param_groups) != 1:
        return "more than one parameter group"
    group = opt.param_groups[0]
    if [id(p) for p in group["params"]] != [id(p) for p in client.model.parameters()]:
        return "optimizer parameters are not the model's parameters"
    # options the stacked update does not implement (all off in ClientOptimization.build); a
    # client's fused=True is fine: the stack uses the fused Adam kernel anyway
    for key in ("amsgrad", "maximize", "nesterov", "dampening", "differentiable", "capturable"):
        if group.get(key):
            return f"optimizer option {key}={group[key]!r}"
    return None


def split_input(model: torch.nn.Module) -> tuple[torch.nn.Module | None, torch.nn.Module, str]:
    """(input module, network, parameter-name prefix of the network). A parameter-free input module
    in front of the network (``WithInput``: uint8 -> normalised float, augmentation with its own
    generator, as the loop builds for image datasets) is run per client outside vmap, exactly as the
    sequential executor runs it; only the network is vmapped."""
    if isinstance(model, WithInput) and next(model.input.parameters(), None) is None:
        return model.input, model.net, "net."
    return None, model, ""


def architecture_key(client: ClientModule) -> tuple:
    """Clients with equal keys can share one vmapped step: same module (repr covers layer options
    such as dropout rate and padding), same parameter shapes, same optimizer hyper-parameters
    except the learning rate (which may differ per client)."""
    opt = client.configure_optimizers()
    hyper = tuple(sorted((k, repr(v)) for k, v in opt.param_groups[0].items() if k not in ("params", "lr", "initial_lr")))
    shapes = tuple((n, tuple(p.shape), p.dtype, p.device) for n, p in client.model.named_parameters())
    return (type(client.model), repr(client.model), shapes, type(opt), hyper)


class VectorizedExecutor(ClientExecutor):
    """Trains and evaluates same-architecture clients together with ``torch.func.vmap``.

    Clients are grouped by :func:`architecture_key` (a heterogeneous federation runs one batched
    step per architecture); clients that cannot be vectorized (:func:`unsupported_reason`) run
    through an internal :class:`SequentialExecutor` unless ``strict`` is set, which raises instead.

    Args:
        eval_batch_size: samples per vmapped inference call (per client: a stack of M clients holds M x
            this many samples' activations at once; 128 keeps them below the allocator's mmap threshold
            on LeNet-5-sized models; runs measured with 1,024 gave identical metrics).
        strict: raise a ConfigError for unsupported clients instead of running them sequentially.
        chunk_size: at most this many clients per vmapped step (a group of M clients runs as
            ceil(M / chunk_size) stacks one after another, with the same results: every client's
            computation is its own). null: all clients of a group at once, except on a CUDA device,
            where the chunk is chosen from the device's free memory (:func:`auto_chunk_size`).
    """

    def __init__(self, eval_batch_size: int = 128, strict: bool = False, chunk_size: int | None = None):
        if chunk_size is not None:
            check_at_least("federation.executor.chunk_size", chunk_size, 1)
        self.eval_batch_size = eval_batch_size
        self.strict = strict
        self.chunk_size = chunk_size
        self.fabric: Fabric | None = None
        self.fallback = SequentialExecutor(eval_batch_size)
        self._vectorized: set[int] = set()
        self._keys: dict[int, tuple] = {}
        self._cache: dict = {}
        self._auto_chunks: dict[tuple, int] = {}
        self._compiled: dict[tuple, tuple] = {}

    def configure(self, compile_backend: str | None = None) -> None:
        super().configure(compile_backend)
        self.fallback.configure(compile_backend)

    def setup(self, fabric: Fabric, clients: Sequence[ClientModule]) -> None:
        self.fabric = fabric
        precision = str(getattr(fabric.strategy.precision, "precision", "32-true"))
        # same device / dtype conversion as the sequential executor, so both see identical clients
        self.fallback.setup(fabric, clients)
        for c in clients:
            reason = unsupported_reason(c, precision)
            if reason is None:
                self._vectorized.add(c.client_id)
                # computed once: repr(model) and the optimizer walk cost ~8 % of a digits round
                self._keys[c.client_id] = architecture_key(c)
            elif self.strict:
                raise ConfigError("federation.executor", f"client {c.client_id} cannot be vectorized: {reason}")

    def _groups(self, clients: Sequence[ClientModule]) -> tuple[list[list[int]], list[int]]:
        groups: dict[tuple, list[int]] = {}
        rest = []
        for i, c in enumerate(clients):
            if c.client_id in self._vectorized:
                groups.setdefault(self._keys[c.client_id], []).append(i)
            else:
                rest.append(i)
        return list(groups.values()), rest

    def _chunks(self, clients, members: list[int], sample: torch.Tensor) -> list[list[int]]:
        """``members`` split into the stacks that run one after another. ``sample``: one batch of
        inputs, for the memory estimate of the automatic chunk on CUDA."""
        size = self.chunk_size
        if size is None and sample.device.type == "cuda":
            key = (self._keys[clients[members[0]].client_id], tuple(sample.shape))
            if key not in self._auto_chunks:
                free = free_device_memory(sample.device)
                self._auto_chunks[key] = auto_chunk_size(free, client_memory_bytes(clients[members[0]], sample))
            size = self._auto_chunks[key]
        size = size or len(members)
        return [members[i : i + size] for i in range(0, len(members), size)]

    # ------------------------------------------------------------------ training
    def train(self, clients, phase, datasets, epochs, batch_size):
        losses = [float("nan")] * len(clients)
        groups, rest = self._groups(clients)
        self._done = 0  # clients finished in this phase, for the progress bar (per chunk, per epoch inside)
        for group in groups:
            # every chunk pads its batches to the group's width: a batch padded to another width
            # sums its (zero) padding in another order, which changes the last float bits
            width = max(1, min(batch_size, max(len(datasets[i][0]) for i in group)))
            for members in self._chunks(clients, group, datasets[group[0]][0][:batch_size]):
                out = self._train_group([clients[i] for i in members], phase, [datasets[i] for i in members],
                                        epochs, batch_size, width, progress=(len(clients), epochs))
                for i, loss in zip(members, out, strict=True):
                    losses[i] = loss
                self._done += len(members)
                self.report(phase, self._done, len(clients))
        if rest:
            out = self.fallback.train([clients[i] for i in rest], phase, [datasets[i] for i in rest], epochs, batch_size)
            for i, loss in zip(rest, out, strict=True):
                losses[i] = loss
            self.report(phase, len(clients), len(clients))
        return losses

    def _train_group(self, clients, phase, datasets, epochs, batch_size, width=None,
                     progress: tuple[int, int] | None = None) -> list[float]:
        m = len(clients)
        for c in clients:
            c.set_phase(phase)
            c.train()
        if epochs == 0:
            return [0.0] * m  # what the sequential executor reports for no steps
        template = clients[0].model
        stack = ParamStack(clients, gradient_layout=True)
        opt = StackedOptimizer(clients, stack)
        device, dtype = stack.device, stack.dtype

        x_all, t_all, offsets = self._concat(datasets)
        if x_all.is_floating_point() and x_all.dtype != dtype and dtype == torch.float64:
            x_all = x_all.to(dtype)  # 64-true: Fabric converts inputs of the sequential path alike
        index, weight, counts = _batch_plan(clients, [len(d[0]) for d in datasets], offsets, epochs, batch_size,
                                            width)
        lengths = weight.sum(-1).long()  # S x M real samples per batch
        steps = index.shape[0]
        if steps == 0:
            return [0.0] * m
        index, weight = index.to(device), weight.to(device)

        _, net, prefix = split_input(template)
        inputs = [split_input(c.model)[0] for c in clients]
        buffer_names = [n for n in stack.buffers if n.startswith(prefix)]  # BatchNorm's, not the input's
        step_fn = self._step_function(clients[0], phase, net, stack.names)
        # method state the loss reads (e.g. SCAFFOLD's per-client correction): stacked like the parameters
        part = clients[0].method_part
        keys = [k for k in (part.loss_state_keys if part is not None else ()) if all(k in c.method_state for c in clients)]
        loss_state = {k: torch.stack([c.method_state[k] for c in clients]).to(device) for k in keys}
        total = torch.zeros(m, device=device)
        every = max(1, steps // max(epochs, 1))  # (clients, epochs): report about once per epoch
        for s, substeps in enumerate(_substeps(counts, lengths, bool(buffer_names), index.shape[2])):
            if progress is not None and s and s % every == 0:  # the chunk's clients, part-way
                self.report(phase, self._done + m * s / steps, progress[0])
            for rows, width in substeps:
                members = range(m) if rows is None else rows.tolist()
                if rows is None:
                    params, idx, w = stack.params, index[s], weight[s]
                    bufs = {n: stack.buffers[n] for n in buffer_names}
                    state = loss_state
                else:
                    dev_rows = rows.to(device)
                    params = [select_rows(p, dev_rows) for p in stack.params]
                    bufs = {n: stack.buffers[n].index_select(0, dev_rows) for n in buffer_names}
                    idx, w = index[s].index_select(0, dev_rows), weight[s].index_select(0, dev_rows)
                    state = {k: v.index_select(0, dev_rows) for k, v in loss_state.items()}
                idx, w = idx[:, :width], w[:, :width]
                # the input modules run in the precision context the sequential executor runs them
                # in (64-true makes float64 the default dtype, which changes how many random bits
                # torch.rand draws from the augmentation generator)
                with self.fabric.autocast():
                    if inputs[0] is None:
                        x = x_all[idx]
                    else:
                        x = _client_inputs([inputs[j] for j in members], x_all, idx,
                                           [int(lengths[s, j]) for j in members])
                    with _batch_norm_in_float32(net, self.fabric.device.type):
                        g, (loss, new_bufs) = _at_least_two(step_fn, params, bufs, x, t_all[idx], w, state)
                opt.step(params, [gk.to(dtype) for gk in g], rows)
                if rows is None:
                    total += loss.detach()
                    for n, b in new_bufs.items():
                        stack.buffers[n].copy_(b)
                else:
                    for target, p in zip(stack.params, params, strict=True):
                        target.index_copy_(0, dev_rows, p)
                    for n, b in new_bufs.items():
                        stack.buffers[n].index_copy_(0, dev_rows, b)
                    total.index_add_(0, dev_rows, loss.detach().float())
        stack.write_back()
        opt.write_back()
        return (total.cpu() / counts.clamp_min(1)).tolist()

    def _step_function(self, client: ClientModule, phase: str, net, names: list[str]):
        """vmap(grad_and_value(loss)) over a stack, with ``client`` as the template whose parameters
        are swapped for each client's slice. With ``federation.compile`` it is compiled once per
        architecture and phase and reused (a new function per call would recompile every phase)."""
        key = (self._keys[client.client_id], phase)
        if self.compile_backend is not None and key in self._compiled:
            step, fn = self._compiled[key]
            step.client.phase = phase  # the template dispatches on its phase (set_phase does this too)
            return fn
        step = _TrainingStep(client, net)
        names = ["client.model." + n for n in names]
        tied = _has_tied_tensors(net)

        def client_loss(params, buffers, x, t, w, state):
            # gradients come out per parameter as M x shape, the stack's own layout (no copy into
            # one flat vector: that concatenation was 13 % of a step);
            # BatchNorm updates its (per-client, stacked) running statistics in place
            named = {**dict(zip(names, params, strict=True)), **{"client.model." + n: b for n, b in buffers.items()}}
            return functional_call(step, named, (x, t, w, state), tie_weights=tied), buffers

        if self.compile_backend is not None:
            fn = torch.compile(vmap(grad_and_value(client_loss, has_aux=True), randomness="different"),
                               backend=self.compile_backend)
            self._compiled[key] = (step, fn)
            return fn
        return _grad_and_value_of_sum(vmap(client_loss, randomness="different"))

    def _concat(self, datasets):
        """One tensor of inputs and one of targets for the whole group, and each client's offset.
        One shared (x, t) (the public phase) is used as is; private sets are concatenated once and
        cached while the loop passes the same tensors."""
        if all(d[0] is datasets[0][0] and d[1] is datasets[0][1] for d in datasets):
            return datasets[0][0], datasets[0][1], [0] * len(datasets)
        key = tuple((id(x), id(t)) for x, t in datasets)
        if key not in self._cache:
            if len(self._cache) >= 64:  # one entry per chunk of clients; bounded in case inputs change
                self._cache.clear()
            x_all = torch.cat([d[0] for d in datasets])
            t_all = torch.cat([d[1] for d in datasets])
            offsets = torch.tensor([0] + [len(d[0]) for d in datasets[:-1]]).cumsum(0).tolist()  # one per client
            # the datasets are kept so their ids cannot be reused by other tensors
            self._cache[key] = (list(datasets), (x_all, t_all, offsets))
        return self._cache[key][1]

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def predict(self, clients, x):
        out: list[torch.Tensor | None] = [None] * len(clients)
        groups, rest = self._groups(clients)
        stacks = [members for g in groups for members in self._chunks(clients, g, x[: self.eval_batch_size])]
        for members in stacks:
            group = [clients[i] for i in members]
            modes = [c.model.training for c in group]
            for c in group:
                c.model.eval()
            stack = ParamStack(group)
            _, net, prefix = split_input(group[0].model)
            inputs = [split_input(c.model)[0] for c in group]
            xx = x.to(stack.dtype) if x.is_floating_point() and stack.dtype == torch.float64 else x
            tied = _has_tied_tensors(net)
            params = {n.removeprefix(prefix): p for n, p in zip(stack.names, stack.params, strict=True)}
            bufs = {n.removeprefix(prefix): b for n, b in stack.buffers.items() if n.startswith(prefix)}
            # one input pass for the whole group when every client's input module is the same
            # function in eval mode (the usual case: the dataset's normalisation); else one per client
            shared = inputs[0] is None or _same_module_state(inputs)
            vmapped = vmap(functools.partial(_forward, net, tied), in_dims=(0, 0, None if shared else 0))
            fn = functools.partial(_at_least_two, vmapped, shared_last=shared)
            chunks = []
            for i in range(0, len(xx), self.eval_batch_size):
                xb = xx[i : i + self.eval_batch_size]
                with self.fabric.autocast():
                    if inputs[0] is not None:
                        xb = inputs[0](xb) if shared else torch.stack([mod(xb) for mod in inputs])
                    with _batch_norm_in_float32(net, self.fabric.device.type):
                        chunks.append(fn(params, bufs, xb).float())
            logits = torch.cat(chunks, 1)
            for c, mode in zip(group, modes, strict=True):
                c.model.train(mode)
            for j, i in enumerate(members):
                out[i] = logits[j]
        if rest:
            logits = self.fallback.predict([clients[i] for i in rest], x)
            for j, i in enumerate(rest):
                out[i] = logits[j]
        return torch.stack(out)


def client_memory_bytes(client: ClientModule, batch: torch.Tensor) -> int:
    """Rough device memory one client takes in a vmapped training step: its parameters four times
    (weights, gradients, two Adam moments) plus activations, taken as twice the bytes of every
    leaf module's output on ``batch`` (kept for backward, and their gradients). Measured with one
    forward pass in eval mode (no BatchNorm update, no augmentation draw)."""
    model = client.model
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    activations = 0

    def count(module, inputs, output):
        nonlocal activations
        outs = output if isinstance(output, (tuple, list)) else (output,)
        activations += sum(t.numel() * t.element_size() for t in outs if isinstance(t, torch.Tensor))

    leaves = [m for m in model.modules() if next(m.children(), None) is None]
    handles = [m.register_forward_hook(count) for m in leaves]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(batch)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return 4 * params + 2 * activations


def free_device_memory(device: torch.device) -> int:
    """Bytes a new stack can use on a CUDA device: what the driver reports free plus what PyTorch's
    caching allocator holds but no tensor uses. The driver's figure alone counts the cache of an
    earlier phase as taken (on an H100 with 100 ResNet-18 clients, the driver's figure alone gave
    stacks of 26 clients for one phase and of 1 for another)."""
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def auto_chunk_size(free_bytes: int, per_client_bytes: int, fraction: float = 0.7) -> int:
    """Clients per vmapped step that fit in ``fraction`` of the free device memory (at least 1);
    the rest is left for the allocator's fragmentation and what the round keeps on the device."""
    return max(1, int(free_bytes * fraction) // max(1, per_client_bytes))


def _batch_plan(clients, sizes, offsets, epochs: int, batch_size: int, width: int | None = None):
    """Batches of every client for a whole phase as padded tensors.

    Consumes each client's generator exactly like ``SequentialExecutor._train_one`` (one
    ``randperm(n)`` per epoch) and keeps its batch boundaries, including skipping a final batch of
    one sample. Returns index (S x M x W, global rows of the concatenated data), weight (S x M x W,
    1 for real samples, 0 for padding) and the number of steps of each client (M).
    """
    width = width or max(1, min(batch_size, max(sizes)))
    plans = []
    for c, n, off in zip(clients, sizes, offsets, strict=True):
        rows_idx, rows_w = [], []
        for _ in range(epochs):
            order = torch.randperm(n, generator=c.generator)
            nb = -(-n // batch_size)
            pad = nb * width - n
            idx = torch.cat([order, order[:1].expand(pad)]).view(nb, width)  # padding: a real sample
            w = torch.cat([torch.ones(n), torch.zeros(pad)]).view(nb, width)
            if n > 1 and n % batch_size == 1:  # final batch of one sample: skipped
                idx, w = idx[:-1], w[:-1]
            rows_idx.append(idx + off)
            rows_w.append(w)
        plans.append((torch.cat(rows_idx), torch.cat(rows_w)))
    counts = torch.tensor([len(p[0]) for p in plans])
    steps = int(counts.max()) if len(plans) else 0
    index = torch.zeros(steps, len(plans), width, dtype=torch.long)
    weight = torch.zeros(steps, len(plans), width)
    for j, (idx, w) in enumerate(plans):
        index[: len(idx), j] = idx
        weight[: len(w), j] = w
    return index, weight, counts


def _substeps(counts: torch.Tensor, lengths: torch.Tensor, batch_dependent: bool, width: int):
    """Per step, the vmapped calls to make: (rows or None for all clients, batch width).

    Clients that ran out of batches are left out. Without batch-dependent layers one call covers
    every active client (short batches are zero-weight padded to the plan's ``width``). With
    BatchNorm, padding would enter the batch statistics, so active clients are split by their batch
    length and nothing is padded.
    """
    m = len(counts)
    for s in range(lengths.shape[0]):
        active = counts > s
        if not batch_dependent:
            yield [(None if bool(active.all()) else active.nonzero().squeeze(1), width)]
            continue
        out = []
        for length in lengths[s][active].unique().tolist():
            rows = (active & (lengths[s] == length)).nonzero().squeeze(1)
            out.append((None if len(rows) == m else rows, int(length)))
        yield out


@contextlib.contextmanager
def _batch_norm_in_float32(net: torch.nn.Module, device: str) -> Iterator[None]:
    """Under bf16/fp16 autocast, BatchNorm layers normalise a float32 copy of their input and hand
    the autocast dtype on. Autocast leaves batch_norm in its input's dtype, and vmap's batch rule
    for it refuses a half-precision input with float32 statistics and weights; cuDNN's mixed
    batch norm computes in float32 internally too. Outside autocast nothing changes."""
    if not torch.is_autocast_enabled(device):
        yield
        return
    dtype = torch.get_autocast_dtype(device)
    hooks = []
    for module in net.modules():
        if isinstance(module, _BatchNorm):
            hooks.append(module.register_forward_pre_hook(lambda _, args: (args[0].float(), *args[1:])))
            hooks.append(module.register_forward_hook(lambda _, args, out: out.to(dtype)))
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def _grad_and_value_of_sum(losses_fn):
    """``vmap(grad_and_value(loss, has_aux=True))`` computed as one backward pass of the clients'
    summed losses through the vmapped forward: client i's loss depends on its own slice of the
    stack only, so the gradient of the sum is, slice by slice, each client's own gradient. The
    same mathematics as per-client ``grad`` (within float rounding: the backward's batched kernels
    are chosen by autograd instead of functorch), without functorch's per-step transform and
    without the import of ``torch._dynamo`` (seconds of CPU) that ``torch.func.grad`` makes on its
    first call."""

    def fn(params, buffers, *per_client):
        leaves = [p.detach().requires_grad_() for p in params]
        with torch.enable_grad():
            loss, aux = losses_fn(leaves, buffers, *per_client)
        return torch.autograd.grad(loss.sum(), leaves), (loss.detach(), aux)

    return fn


def _at_least_two(fn, params, buffers, *per_client, shared_last: bool = False):
    """``fn`` (vmapped over clients) on a stack of at least two: a stack of one client runs doubled
    and the copy is dropped. vmap over a single client takes other kernels (mm instead of bmm), whose
    results differ in the last bits, so without this a client would compute differently alone (its
    chunk, or the last client with batches left) than in a stack. ``shared_last``: the last
    argument is the same for every client (not stacked)."""
    first = next(iter(params.values())) if isinstance(params, dict) else params[0]
    if first.shape[0] != 1:
        return fn(params, buffers, *per_client)

    def two(t):
        if isinstance(t, dict):
            return {k: two(v) for k, v in t.items()}
        doubled = torch.cat([t, t])
        return transposed(doubled) if is_transposed(t) else doubled  # in t's layout: the same kernels

    args = [a if shared_last and i == len(per_client) - 1 else two(a) for i, a in enumerate(per_client)]
    doubled = {n: two(p) for n, p in params.items()} if isinstance(params, dict) else [two(p) for p in params]
    return _first(fn(doubled, {n: two(b) for n, b in buffers.items()}, *args))


def _first(out):
    if isinstance(out, torch.Tensor):
        return out[:1]
    if isinstance(out, dict):
        return {k: _first(v) for k, v in out.items()}
    return type(out)(_first(v) for v in out)


def _client_inputs(modules, x_all: torch.Tensor, idx: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Each client's input module on its own batch (real samples only, so its augmentation
    generator draws exactly what it draws in the sequential executor); zero-weight padding rows
    repeat the first sample."""
    out = []
    for module, rows, n in zip(modules, idx, lengths, strict=True):
        y = module(x_all[rows[:n]])
        if n < len(rows):
            y = torch.cat([y, y[:1].expand(len(rows) - n, *y.shape[1:])])
        out.append(y)
    return torch.stack(out)


def _same_module_state(modules) -> bool:
    """Same type, options and buffers: the modules compute the same function in eval mode."""
    first = modules[0]
    ref = list(first.buffers())
    return all(type(m) is type(first) and repr(m) == repr(first)
               and all(torch.equal(a, b) for a, b in zip(ref, m.buffers(), strict=True)) for m in modules[1:])


def _has_tied_tensors(module: torch.nn.Module) -> bool:
    """Whether one tensor is registered under two names (tied embeddings). Only then does
    ``functional_call`` need ``tie_weights=True``, whose module walk on every call was ~3 % of a
    digits round."""
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    return len({id(t) for _, t in named}) != len(named)


def _forward(net, tied, params, buffers, x):
    return functional_call(net, (params, buffers), (x,), tie_weights=tied)


class _TrainingStep(torch.nn.Module):
    """One client's training step on inputs that have been through its input module, for
    ``functional_call`` under vmap: the template client's parameters are swapped for one client's
    slice of the stack, so its ``private_loss`` / ``public_loss`` (and its method part's ``loss``, which
    reads the client's slice of the stacked ``loss_state_keys``, e.g. a proximal term's centre) run
    exactly as the sequential executor runs them. ``w`` weighs padding out."""

    def __init__(self, client: ClientModule, net: torch.nn.Module):
        super().__init__()
        self.client = client
        object.__setattr__(self, "net", net)  # a part of client.model, not a second registration

    def forward(self, x, t, w, state=None):
        if not state:
            return self.client.phase_loss(self.net(x), t, w)
        own = self.client.method_state
        self.client.method_state = {**own, **state}  # this client's slice, for the loss to read
        try:
            return self.client.phase_loss(self.net(x), t, w)
        finally:
            self.client.method_state = own



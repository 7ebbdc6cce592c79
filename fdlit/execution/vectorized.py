"""Vectorized executor: clients that share an architecture train together in one batched step.

Per group of same-architecture clients, each parameter is stacked into one ``M x shape`` tensor for
the length of a phase. A covered network (MLPs, small conv nets on a CPU, ResNet-18 on CUDA) runs
its forward as one grouped network (:mod:`fdlit.execution.grouped`: ``bmm`` on M x in x out
weights, grouped convolutions), the plain cross-entropy on the M x B x K logits
(:mod:`fdlit.execution.stacked_loss`; a method's loss hook under vmap on each client's logits), and
one backward pass of the summed losses (each client's gradient lands in its own slice); other
networks run the whole loss under ``torch.func.vmap`` (:func:`vmapped_training_step`), so
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
* BatchNorm: running statistics are stacked per client and updated in place (each client's slice); padding
  would enter the batch statistics, so models with BatchNorm are not padded: clients whose
  batches differ in length at a step run as separate vmapped calls (only at epoch ends);
* per-client Adam step counts (bias correction) and learning rates;
* image datasets: the parameter-free input module the loop puts in front of every network
  (``WithInput(ImageInput, net)``: uint8 -> normalised float, crop + flip from the client's own
  generator) runs per client on its real samples, outside vmap and in the same precision context,
  so augmentation draws are the sequential executor's; only ``net`` is vmapped.

Chunks: ``chunk_size`` bounds how many clients are stacked at once (memory grows with the stack:
parameters, gradients, optimizer moments and activations of every client in it); chunks run one
after another and compute exactly what one stack computes (the grouped network: within float
rounding, its channels-last reductions span every client's channels). On CUDA, without a ``chunk_size``, the
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

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import torch
from torch.func import vmap

from fdlit.errors import ConfigError, check_at_least
from fdlit.execution.batch_plan import batch_plan, client_inputs, shared_input, step_calls
from fdlit.execution.executor import ClientExecutor, SequentialExecutor
from fdlit.execution.graph_step import static_step
from fdlit.execution.grouped import AUTO_PRECISIONS, GroupedNetwork, grouped_applies, grouped_training_step
from fdlit.execution.stack_memory import auto_chunk_size, client_memory_bytes, free_device_memory
from fdlit.execution.stacked_loss import loss_is_plain
from fdlit.execution.stacked_optimizer import StackedOptimizer
from fdlit.execution.stacking import ParamStack, select_rows
from fdlit.execution.steps import configure, logged_values, report, take_logged
from fdlit.execution.vectorizable import architecture_key, split_input, unsupported_reason
from fdlit.execution.vmap_step import (
    TrainingStep,
    at_least_two,
    batch_norm_in_float32,
    forward,
    has_tied_tensors,
    same_module_state,
    vmapped_training_step,
)

if TYPE_CHECKING:
    from lightning.fabric import Fabric

    from fdlit.clients import ClientModule

TRUE_DTYPES = (torch.float64, torch.bfloat16)  # 64-true, bf16-true: floating inputs converted to the weights'
GROUPED_PRECISIONS = AUTO_PRECISIONS["cpu"]  # those at which the grouped network runs on a CPU by default

__all__ = ["VectorizedExecutor", "architecture_key", "auto_chunk_size", "client_memory_bytes", "free_device_memory",
           "split_input", "unsupported_reason"]


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
        conv_network: how a stack of networks computes its forward: ``grouped`` as one grouped
            network without vmap (:mod:`fdlit.execution.grouped`: MLPs, LeNet-5, SmallCNN, ResNet-18),
            ``vmap`` under ``torch.func.vmap``, ``auto``: grouped on a CPU at 32/64-bit for networks up
            to ``CPU_MAX_GROUPED_FLOPS`` (ResNet-18 is slower grouped there; docs/speed-and-scale.md)
            and on CUDA (bf16 too), vmap elsewhere. Networks the grouped form does not cover run under vmap.
        graph_optimizer: with ``federation.cuda_graphs``, the fused Adam update inside the captured
            step (:mod:`fdlit.execution.graph_step`); false: it runs after each replay.
    """

    def __init__(self, eval_batch_size: int = 128, strict: bool = False, chunk_size: int | None = None,
                 conv_network: Literal["auto", "grouped", "vmap"] = "auto", graph_optimizer: bool = True):
        if chunk_size is not None:
            check_at_least("federation.executor.chunk_size", chunk_size, 1)
        if conv_network not in ("auto", "grouped", "vmap"):
            raise ConfigError("federation.executor.conv_network", f"allowed: auto, grouped, vmap; got {conv_network!r}")
        self.conv_network = conv_network
        self.cuda_graphs, self.graph_optimizer = False, graph_optimizer  # the loop sets federation.cuda_graphs
        self._grouped: dict[tuple, GroupedNetwork | None] = {}
        self.forms: set[str] = set()  # the forms the stacked forwards ran in: "grouped", "vmap"
        self._precision = "32-true"
        self.eval_batch_size = eval_batch_size
        self.runs: dict[int, int] | None = None  # id(client) -> its run, while a call holds several runs'
        self.strict = strict
        self.chunk_size = chunk_size
        self.fabric: Fabric | None = None
        self.fallback = SequentialExecutor(eval_batch_size)
        self._vectorized: set[int] = set()
        self._keys: dict[int, tuple] = {}
        self._cache: dict = {}  # (x, t) ids of a group's private sets -> concatenated tensors
        self._auto_chunks, self._compiled = {}, {}  # chunk sizes found; compiled steps by key
        self.trained = {"vectorized": 0, "sequential": 0}  # client-phases each path trained (tests read it)

    def configure(self, compile_backend: str | None = None) -> None:
        self.compile_backend = compile_backend
        configure(self.fallback, compile_backend)

    def setup(self, fabric: Fabric, clients: Sequence[ClientModule]) -> None:
        self.fabric = fabric
        precision = str(getattr(fabric.strategy.precision, "precision", "32-true"))
        self._precision = precision
        # same device / dtype conversion as the sequential executor, so both see identical clients
        self.fallback.setup(fabric, clients)
        for c in clients:
            reason = unsupported_reason(c, precision, fabric.device.type)
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
                self.trained["vectorized"] += len(members)
                self._done += len(members)
                report(self, phase, self._done, len(clients))
        if rest:
            out = self.fallback.train([clients[i] for i in rest], phase, [datasets[i] for i in rest], epochs, batch_size)
            for i, loss in zip(rest, out, strict=True):
                losses[i] = loss
            self.trained["sequential"] += len(rest)
            report(self, phase, len(clients), len(clients))
        return losses

    def logged_values(self) -> dict[str, list[float]]:
        """What clients logged: those run sequentially here (under vmap ``self.log`` records nothing)."""
        merged = take_logged(self)
        for name, values in logged_values(self.fallback).items():
            merged.setdefault(name, []).extend(values)
        return merged

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
        opt = StackedOptimizer(clients, stack, None if self.runs is None else [self.runs[id(c)] for c in clients])
        device, dtype = stack.device, stack.dtype

        x_all, t_all, offsets = self._concat(datasets)
        if x_all.is_floating_point() and x_all.dtype != dtype and dtype in TRUE_DTYPES:
            x_all = x_all.to(dtype)  # 64-true, bf16-true: Fabric converts the sequential path's alike
        index, weight, counts = batch_plan(clients, [len(d[0]) for d in datasets], offsets, epochs, batch_size,
                                            width)
        lengths = weight.sum(-1).long()  # S x M real samples per batch
        steps = index.shape[0]
        if steps == 0:
            return [0.0] * m
        index, weight = index.to(device), weight.to(device)

        _, net, prefix = split_input(template)
        inputs = [split_input(c.model)[0] for c in clients]
        transform = shared_input(inputs)
        if transform is not None:  # one pass over the phase's inputs, not one call per client and step
            with self.fabric.autocast():
                x_all, inputs = transform(x_all), [None] * m
        buffer_names = [n for n in stack.buffers if n.startswith(prefix)]  # BatchNorm's, not the input's
        step_fn = static = None  # chosen at the first step, from the network's input (grouped or vmapped)
        # method state the loss reads (e.g. SCAFFOLD's per-client correction): stacked like the parameters
        part = clients[0].method_part
        keys = [k for k in (part.loss_state_keys if part is not None else ()) if all(k in c.method_state for c in clients)]
        loss_state = {k: torch.stack([c.method_state[k] for c in clients]).to(device) for k in keys}
        total = torch.zeros(m, device=device)
        every = max(1, steps // max(epochs, 1))  # (clients, epochs): report about once per epoch
        for s, substeps in enumerate(step_calls(counts, lengths, bool(buffer_names), index.shape[2])):
            if progress is not None and s and s % every == 0:  # the chunk's clients, part-way
                report(self, phase, self._done + m * s / steps, progress[0])
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
                        x = client_inputs([inputs[j] for j in members], x_all, idx,
                                           [int(lengths[s, j]) for j in members])
                    if step_fn is None:
                        step_fn = self._step_function(clients[0], phase, net, stack.names, prefix, x[0, :1])
                        static = static_step(self, step_fn, opt, stack, buffer_names, loss_state, m)
                    if static is not None and rows is None and width == index.shape[2]:
                        total += static(x, t_all[idx], w)  # a captured step: weights, buffers, moments updated
                        continue
                    with batch_norm_in_float32(net, self.fabric.device.type):
                        g, (loss, new_bufs) = at_least_two(step_fn, params, bufs, x, t_all[idx], w, state)
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

    def _grouped_network(self, client: ClientModule, net, sample: torch.Tensor) -> GroupedNetwork | None:
        """The grouped form of the network (``conv_network``), or None for the vmapped one.
        ``sample``: one input of one client, after its input module. Records the form in ``forms``."""
        grouped = None
        if (not client.needs_features
                and grouped_applies(self.conv_network, sample.device.type, self._precision)):
            key = (self._keys[client.client_id], tuple(sample.shape[1:]), sample.dtype)
            if key not in self._grouped:
                self._grouped[key] = None if has_tied_tensors(net) else GroupedNetwork.build(net, sample)
            grouped = self._grouped[key]
            if grouped is not None and self.conv_network == "auto" and not grouped.pays_on(sample.device.type):
                grouped = None
        self.forms.add("vmap" if grouped is None else "grouped")
        return grouped

    def _step_function(self, client: ClientModule, phase: str, net, names: list[str], prefix: str,
                       sample: torch.Tensor):
        """vmap(grad_and_value(loss)) over a stack, with ``client`` as the template whose parameters
        are swapped for each client's slice (the forward as one grouped network where
        :meth:`_grouped_network` gives one). With ``federation.compile`` it is compiled once per
        architecture and phase and reused (a new function per call would recompile every phase)."""
        grouped = self._grouped_network(client, net, sample)
        if grouped is not None:
            return grouped_training_step(TrainingStep(client, net, logits_in=True), grouped, names, prefix,
                                         grouped.compiled(self.compile_backend), plain_loss=loss_is_plain(client))
        key = (self._keys[client.client_id], phase)
        if self.compile_backend is not None and key in self._compiled:
            step, fn = self._compiled[key]
            step.client.phase = phase  # the template dispatches on its phase (set_phase does this too)
            return fn
        step = TrainingStep(client, net)
        fn = vmapped_training_step(step, names, has_tied_tensors(net), self.compile_backend)
        if self.compile_backend is not None:
            self._compiled[key] = (step, fn)
        return fn

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
            x_all, t_all = torch.cat([d[0] for d in datasets]), torch.cat([d[1] for d in datasets])
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
            for c in group:  # measured as evaluated: no dropout, batch norm's running statistics
                c.model.eval()
            stack = ParamStack(group)
            _, net, prefix = split_input(group[0].model)
            inputs = [split_input(c.model)[0] for c in group]
            xx = x.to(stack.dtype) if x.is_floating_point() and stack.dtype in TRUE_DTYPES else x
            tied = has_tied_tensors(net)
            params = {n.removeprefix(prefix): p for n, p in zip(stack.names, stack.params, strict=True)}
            bufs = {n.removeprefix(prefix): b for n, b in stack.buffers.items() if n.startswith(prefix)}
            # one input pass for the whole group when every client's input module is the same
            # function in eval mode (the usual case: the dataset's normalisation); else one per client
            shared = inputs[0] is None or same_module_state(inputs)
            fn, chunks = None, []
            start, batch = 0, self.eval_batch_size
            while start < len(xx):
                xb = xx[start : start + batch]
                with self.fabric.autocast():
                    if inputs[0] is not None:
                        xb = inputs[0](xb) if shared else torch.stack([mod(xb) for mod in inputs])
                    if fn is None:
                        grouped = self._grouped_network(group[0], net, xb[:1] if shared else xb[0, :1])
                        if grouped is not None:
                            forward_fn = functools.partial(grouped.compiled(self.compile_backend), training=False,
                                                           shared=shared)
                            batch = grouped.inference_batch(max(2, len(group)), stack.params[0].element_size(), batch,
                                                            xb.device.type)
                            xb = xb[:batch] if shared else xb[:, :batch]  # the input module is per sample
                        else:
                            forward_fn = vmap(functools.partial(forward, net, tied), in_dims=(0, 0, None if shared else 0))
                        fn = functools.partial(at_least_two, forward_fn, shared_last=shared)
                    start += batch
                    with batch_norm_in_float32(net, self.fabric.device.type):
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

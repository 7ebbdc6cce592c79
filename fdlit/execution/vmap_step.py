"""One client's computation written for ``torch.func.vmap`` over a stack of clients: the training
step (its loss hooks through ``functional_call``), inference, and the helpers that keep a stack's
kernels (and so its float rounding) the same whatever the stack's size."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch.func import functional_call, grad_and_value, vmap
from torch.nn.modules.batchnorm import _BatchNorm

from fdlit.clients.features import features_and_logits
from fdlit.execution.stacking import is_transposed, transposed

if TYPE_CHECKING:
    from fdlit.clients import ClientModule


@contextlib.contextmanager
def batch_norm_in_float32(net: torch.nn.Module, device: str) -> Iterator[None]:
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


def grad_and_value_of_sum(losses_fn):
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


def at_least_two(fn, params, buffers, *per_client, shared_last: bool = False):
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
    return first_of(fn(doubled, {n: two(b) for n, b in buffers.items()}, *args))


def first_of(out):
    if isinstance(out, torch.Tensor):
        return out[:1]
    if isinstance(out, dict):
        return {k: first_of(v) for k, v in out.items()}
    return type(out)(first_of(v) for v in out)


def same_module_state(modules) -> bool:
    """Same type, options and buffers: the modules compute the same function in eval mode."""
    first = modules[0]
    ref = list(first.buffers())
    return all(type(m) is type(first) and repr(m) == repr(first)
               and all(torch.equal(a, b) for a, b in zip(ref, m.buffers(), strict=True)) for m in modules[1:])


def has_tied_tensors(module: torch.nn.Module) -> bool:
    """Whether one tensor is registered under two names (tied embeddings). Only then does
    ``functional_call`` need ``tie_weights=True``, whose module walk on every call was ~3 % of a
    digits round."""
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    return len({id(t) for _, t in named}) != len(named)


def forward(net, tied, params, buffers, x):
    return functional_call(net, (params, buffers), (x,), tie_weights=tied)


class TrainingStep(torch.nn.Module):
    """One client's training step on inputs that have been through its input module, for
    ``functional_call`` under vmap: the template client's parameters are swapped for one client's
    slice of the stack, so its ``private_loss`` / ``public_loss`` (and its method part's ``loss``, which
    reads the client's slice of the stacked ``loss_state_keys``, e.g. a proximal term's centre) run
    exactly as the sequential executor runs them. ``w`` weighs padding out. With ``logits_in`` the
    network ran before (the grouped network): ``x`` is this client's logits."""

    def __init__(self, client: ClientModule, net: torch.nn.Module, logits_in: bool = False):
        super().__init__()
        self.client = client
        self.logits_in = logits_in  # x is already the network's output (computed outside vmap)
        object.__setattr__(self, "net", net)  # a part of client.model, not a second registration

    def forward(self, x, t, w, state=None):
        features = None
        if self.logits_in:
            logits = x
        elif self.client.needs_features:  # one forward through the network's halves (FedProto's loss)
            features, logits = features_and_logits(self.net, x)
        else:
            logits = self.net(x)
        if not state:
            return self.client.phase_loss(logits, t, w, features)
        own = self.client.method_state
        self.client.method_state = {**own, **state}  # this client's slice, for the loss to read
        try:
            return self.client.phase_loss(logits, t, w, features)
        finally:
            self.client.method_state = own




def vmapped_training_step(step: TrainingStep, names: list[str], tied: bool, compile_backend: str | None = None):
    """The whole training step under vmap (the fallback for networks the grouped form does not
    cover): ``step`` (the template client's :class:`TrainingStep`) with its parameters swapped for
    each client's slice of the stack, one backward pass of the summed losses
    (:func:`grad_and_value_of_sum`); with ``compile_backend``, ``vmap(grad_and_value(...))``
    compiled. Called as ``fn(params, buffers, x, t, w, state)`` -> (gradients, (losses, buffers))."""
    full = ["client.model." + n for n in names]

    def client_loss(params, buffers, x, t, w, state):
        # gradients come out per parameter as M x shape, the stack's own layout (no copy into
        # one flat vector: that concatenation was 13 % of a step);
        # BatchNorm updates its (per-client, stacked) running statistics in place
        named = {**dict(zip(full, params, strict=True)), **{"client.model." + n: b for n, b in buffers.items()}}
        return functional_call(step, named, (x, t, w, state), tie_weights=tied), buffers

    if compile_backend is not None:
        return torch.compile(vmap(grad_and_value(client_loss, has_aux=True), randomness="different"),
                             backend=compile_backend)
    return grad_and_value_of_sum(vmap(client_loss, randomness="different"))

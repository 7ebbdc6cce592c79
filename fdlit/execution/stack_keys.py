"""When two runs' executor calls compute alike, so that one vectorized call can do both.

A key is None when the call must run alone: another executor than the vectorized one, clients the
executor would not stack as one group, a network with dropout (under vmap it draws from the global
generator, which a merged call would share between runs), or a method's client loss whose settings
cannot be compared. Otherwise it holds everything the stacked step reads from its first client (the
template whose network, loss and optimizer kind every stacked client uses): the network's
architecture, the client class, the method's client part and its loss settings, the optimizer's
settings but the learning rate (read per client), the phase, epochs, batch size and the padded
batch width (a batch padded to another width sums its padding in another order).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fdlit.execution.vectorized import VectorizedExecutor
from fdlit.methods.client_part import ClientPart

_PLAIN = (int, float, str, bool, type(None))


def _plain(value: Any) -> bool:
    return isinstance(value, _PLAIN) or (isinstance(value, (tuple, list)) and all(isinstance(v, _PLAIN) for v in value))


def _settings(obj: Any, leave_out: Sequence[str] = ()) -> tuple | None:
    """An object's plain settings as a comparable tuple; None if one of them is not plain."""
    items = []
    for name, value in sorted(vars(obj).items()):
        if name in leave_out or name.startswith("_"):
            continue
        if not _plain(value):
            return None
        items.append((name, tuple(value) if isinstance(value, list) else value))
    return tuple(items)


def part_signature(part: ClientPart | None) -> tuple | None:
    """What of a method's client part the stacked step reads; None when its loss settings are not comparable."""
    if part is None:
        return ("none",)
    base = (type(part), tuple(part.loss_state_keys or ()), bool(part.needs_features), bool(part.rowwise_loss),
            bool(part.has_loss))
    if not part.has_loss:
        return base
    settings = _settings(part)
    return None if settings is None else (*base, settings)


def _one_group(executor: Any, clients: Sequence[Any]) -> tuple | None:
    """The architecture key when ``executor`` is the vectorized one and stacks ``clients`` as one group."""
    if type(executor) is not VectorizedExecutor or not clients:
        return None
    groups, rest = executor._groups(clients)
    if rest or len(groups) != 1:
        return None
    return executor._keys[clients[0].client_id]


def executor_signature(executor: VectorizedExecutor) -> tuple:
    return (type(executor), executor.conv_network, executor.chunk_size, executor.eval_batch_size, executor.strict,
            executor.compile_backend, executor._precision, str(executor.fabric.device))


def has_dropout(model: torch.nn.Module) -> bool:
    """Whether a layer drops anything (p = 0 draws nothing from the generator)."""
    return any((isinstance(m, torch.nn.modules.dropout._DropoutNd) or "Dropout" in type(m).__name__)
               and getattr(m, "p", 1.0) != 0 for m in model.modules())


def train_key(executor: Any, clients: Sequence[Any], phase: str, datasets: Sequence[tuple[torch.Tensor, torch.Tensor]],
              epochs: int, batch_size: int) -> tuple | None:
    arch = _one_group(executor, clients)
    if arch is None or not datasets:
        return None
    template = clients[0]
    if has_dropout(template.model):
        return None
    part = part_signature(template.method_part)
    optimization = _settings(template.optimization, leave_out=("lr", "public_lr"))  # lr: read per client
    if part is None or optimization is None:
        return None
    x, t = datasets[0]
    width = max(1, min(batch_size, max(len(d[0]) for d in datasets)))
    return ("train", executor_signature(executor), arch, type(template), optimization, part, phase, epochs, batch_size,
            width, x.dtype, tuple(x.shape[1:]), t.dtype, tuple(t.shape[1:]), torch.is_grad_enabled())


def predict_key(executor: Any, clients: Sequence[Any], x: torch.Tensor) -> tuple | None:
    arch = _one_group(executor, clients)
    if arch is None:  # in eval mode dropout draws nothing
        return None
    return ("predict", executor_signature(executor), arch, type(clients[0]), tuple(x.shape), x.dtype, str(x.device))


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and a.device == b.device and (a is b or bool(torch.equal(a, b))))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _fingerprint(call: Any) -> tuple:
    """Cheap, equal for identical calls (ids, batch-order generators, the sum of each client's last
    parameter tensor, which every step moves); the full comparison follows only where these match."""
    last = [next(reversed(list(c.parameters())), None) for c in call.clients]
    sums = torch.stack([p.detach().double().sum() for p in last]).tolist() if all(p is not None for p in last) else []
    return tuple(c.client_id for c in call.clients), tuple(bytes(c.generator.get_state().numpy())
                                                           for c in call.clients), tuple(sums)


def twins(calls: Sequence[Any]) -> list[int | None]:
    """For each call, the index of an earlier call that computes bit for bit the same (the same
    clients' full state, and for ``train`` the same data), or None."""
    prints = [_fingerprint(c) for c in calls]
    out: list[int | None] = []
    for i, call in enumerate(calls):
        match = None
        for j in range(i):
            if out[j] is None and prints[j] == prints[i] and _same_work(calls[j], call):
                match = j
                break
        out.append(match)
    return out


def _same_work(a: Any, b: Any) -> bool:
    if len(a.clients) != len(b.clients):
        return False
    if a.method == "train" and not _equal(list(a.args[1]), list(b.args[1])):
        return False
    return all(_equal(x.client_state(), y.client_state()) for x, y in zip(a.clients, b.clients, strict=True))

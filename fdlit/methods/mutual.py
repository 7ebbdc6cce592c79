"""What FML and FedKD share: a client part whose client holds a private and a shared network
(:class:`fdlit.models.mutual.MutualPair`), whose loss sees both networks' logits of one forward,
and whose exchange is the shared network's parameters only.

Set-up (round 0, counted): every client sends its sample count n_k; client 0 also sends its shared
network's initial parameters, which the server sends down to every client, so every shared
network starts from the same model (as FedAvg's initial model, ``fdlit.methods.fedavg``). The
private networks never leave the client.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fdlit.data.augment import WithInput
from fdlit.errors import ConfigError, check_number
from fdlit.methods.base import ClientContext, ClientPart
from fdlit.methods.parameters import exchanged_tensors, flatten, load_flat
from fdlit.models.mutual import PAIR_PATH, MutualPair, find_pair, fresh_copy, split_logits


def check_fraction(field: str, value: float) -> float:
    """A weight in [0, 1], named by its field."""
    check_number(field, value, minimum=0.0, inclusive=True)
    if value > 1:
        raise ConfigError(field, f"must be in [0, 1], got {value}")
    return value


def check_same_length(uploads, key: str, method: str) -> None:
    """Refuse uploads of shared networks of different sizes (a network built by a callable spec)."""
    sizes = sorted({int(u[key].numel()) for u in uploads})
    if len(sizes) > 1:
        raise ConfigError("model", f"{method} averages the shared network, so it must be the same for every client; "
                          f"got {len(sizes)} different sizes ({sizes} numbers)")


def shared_tensors(model: torch.nn.Module, method: str) -> list[torch.Tensor]:
    """The exchanged tensors of the client's shared network (parameters, then float buffers)."""
    pair = find_pair(model)
    if pair is None:  # e.g. a client part wrapper that does not pass ``client_network`` on
        raise ConfigError("model", f"{method} trains a private and a shared network per client, but this client's "
                          f"network is not paired ({PAIR_PATH}); a wrapper around the method's client part must "
                          "pass its client_network hook on")
    return exchanged_tensors(pair.shared)


def per_row_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every row against its integer label (B)."""
    logp = logits.float().log_softmax(-1)
    return -logp.gather(-1, labels.long()[..., None])[..., 0]


def per_row_kl(target_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(target) || softmax(logits)) per row; the target is a constant (detached): the
    network of ``logits`` learns from the other one, not the reverse."""
    target = F.log_softmax(target_logits.detach().float(), -1)
    return (target.exp() * (target - F.log_softmax(logits.float(), -1))).sum(-1)


def paired(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``model`` with its network paired with a fresh copy of itself (after the dataset's input
    module, which stays in front of both); a model that holds a pair already is returned as it is."""
    if find_pair(model) is not None:
        return model
    if isinstance(model, WithInput):
        model.net = MutualPair.of(model.net, fresh_copy(model.net, seed))
        return model
    return MutualPair.of(model, fresh_copy(model, seed))


class MutualClient(ClientPart):
    """The client part of a two-network method: pairs the client's network, sends n_k (and, from
    client 0, the initial shared model) at set-up and loads the initial shared model on receipt.
    Its loss reads both networks' logits (``needs_features``: the pair's ``embed``) and averages
    over the real rows itself (``rowwise_loss = False``, ``ctx.mean``), exact under padding."""

    label = "mutual"
    needs_features = True
    rowwise_loss = False
    evaluate = "private"  # which network the client is measured (and predicts) with

    def client_network(self, model: torch.nn.Module, seed: int) -> torch.nn.Module:
        model = paired(model, seed + 0x5EED)
        find_pair(model).evaluated = self.evaluate
        return model

    def setup(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        out = {"num_samples": torch.tensor(len(ctx.data.train.y), dtype=torch.int64)}
        if ctx.client.client_id == 0:  # the server's initial shared model, asked of one client (counted)
            out["initial_parameters"] = flatten(shared_tensors(ctx.client.model, self.label))
        return out

    def load_shared(self, ctx: ClientContext, flat: torch.Tensor) -> None:
        tensors = shared_tensors(ctx.client.model, self.label)
        load_flat(tensors, flat.to(tensors[0].device))

    def logits(self, ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """(private, shared) logits of the step's forward."""
        if ctx.features is None:
            raise ConfigError("aggregator", f"{self.label}'s loss was given no features: the client part that wraps "
                              "it must declare needs_features")
        unpaired = ctx.client is not None and find_pair(ctx.client.model) is None
        if unpaired or ctx.features.shape[-1] != 2 * ctx.logits.shape[-1]:  # never split other features
            raise ConfigError("model", f"{self.label}'s loss needs both networks' logits, but this client's network "
                              f"is not paired ({PAIR_PATH}); a wrapper around the method's client part must pass "
                              "its client_network hook on")
        return split_logits(ctx.features)


EVALUATED = ("private", "shared")


def check_evaluate(value: str) -> str:
    if value not in EVALUATED:
        raise ConfigError("aggregator.evaluate", f"allowed: {', '.join(EVALUATED)} (the network every client is "
                          f"measured with); got {value!r}")
    return value

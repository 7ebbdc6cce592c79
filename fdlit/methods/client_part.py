"""A method's client part: the hooks that run where the client lives.

Every hook gets a typed context (:mod:`fdlit.methods.contexts`) and returns what the client sends
(a dict of tensors, or a :class:`~fdlit.messages.Message` to say which arrays are released data and
which are protocol arrays; the round turns either into a Message and counts every byte of it).
The framework, not the hook, carries the execution rules: padding rows never reach ``loss`` unmasked,
a hook runs unchanged under every executor, and what a hook returns is counted once, wherever the
client lives (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fdlit.errors import ConfigError
from fdlit.messages import Message, Upload, as_message
from fdlit.methods.contexts import ClientContext, DistillationContext, LossContext


class ClientPart:
    """A method's client part: hooks run where the client lives.

    Settings only, never server state: executors ship this object to workers. Per-client state goes
    in ``ctx.state`` (the client's ``method_state``). ``loss_state_keys`` names the ``method_state``
    tensors :meth:`loss` reads; the vectorized executor stacks exactly those per client and hands
    each client its own slice.

    ``rowwise_loss``: True (the default) lets the framework make :meth:`loss` exact under padded
    batches by evaluating it one row at a time and averaging over real rows (a loss that is a mean
    over rows plus terms that do not depend on the rows, e.g. a proximal term, is then exact). A part
    that averages with ``ctx.mean`` itself sets it False and is called once on the padded batch.

    ``needs_features``: True makes the client compute each step's forward through its network's
    ``embed`` / ``classify`` halves and hand :meth:`loss` the penultimate features (``ctx.features``);
    a network without them is refused naming ``model`` when the part is attached (FedProto).
    ``shared_feature_width``: True refuses, when the clients are built, clients whose penultimate widths
    differ (a method that averages features across clients).

    ``uploads``: the arrays :meth:`upload` may send each round (:class:`~fdlit.messages.Upload`: name,
    privacy kind, dtype, shape rule). Exactly those are sent, counted and released: an array it does
    not name is refused in one line. Declaring ``logits`` sends the client's public logits unless the
    hook returns its own; a part that does not declare it sends none. None (the default): the
    method's server part declares them (its ``released`` kinds, and ``logits`` for a prediction
    exchange), which is what fdlit's own methods do.

    :meth:`client_network` shapes the client's network when the part is attached, before any
    optimizer exists (FML and FedKD pair it with a shared network); the default leaves it as it is.
    """

    loss_state_keys: tuple[str, ...] = ()
    rowwise_loss: bool = True
    needs_features: bool = False
    shared_feature_width: bool = False
    uploads: tuple[Upload, ...] | None = None
    label: str | None = None  # how errors name the part (None: its class name)

    def client_network(self, model: torch.nn.Module, seed: int) -> torch.nn.Module:
        """The client's network for this method, from the one the config builds (``seed``: the client's)."""
        return model

    def setup(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """Once, before round 1: what the client sends up for the server's set-up."""
        return {}

    def upload(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """Every round, after the private phase and public inference: what the client sends up, the
        arrays ``uploads`` declares (the public logits are added when ``logits`` is declared and the
        hook returns none of its own, e.g. the kept rows only)."""
        return {}

    def receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """After the server's broadcast (``ctx.received``) at set-up and, for parameter exchange,
        every round: e.g. load the global parameters. Returns nothing to send."""
        return {}

    def distillation_set(self, ctx: DistillationContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The public phase's training set (inputs, soft targets) from the kept public samples, the
        teacher's targets and the client's own private data; by default the public samples only."""
        return ctx.public_x, ctx.targets

    def loss(self, ctx: LossContext) -> torch.Tensor:
        """The loss of a ``ctx.phase`` (``"private"`` or ``"public"``) step; ``ctx.base`` is the
        client's own (cross-entropy against the labels or the teacher). Add a term or replace it."""
        return ctx.base

    def carried_classes(self) -> set[type]:
        """The classes the part travels with to a worker (a wrapper adds the part it wraps), so that
        Ray can ship the code of those defined in the user's own modules."""
        return {type(self)}

    @property
    def has_setup(self) -> bool:
        return type(self).setup is not ClientPart.setup

    @property
    def has_receive(self) -> bool:
        return type(self).receive is not ClientPart.receive

    @property
    def has_loss(self) -> bool:
        """Whether the part changes the client's loss (the framework skips the hook otherwise)."""
        return type(self).loss is not ClientPart.loss


def declared_uploads(part: ClientPart, method: object) -> tuple[Upload, ...]:
    """The arrays ``part`` may upload each round: its own declaration, or else its method's (``method``:
    the server part: its ``released`` kinds, with the public logits for a prediction exchange)."""
    if part.uploads is not None:
        return tuple(part.uploads)
    kinds = dict(getattr(method, "released", {"logits": "rows"}))
    if getattr(method, "exchange", "predictions") == "predictions" and "logits" not in kinds:
        kinds = {"logits": "rows", **kinds}
    return tuple(Upload(name, kind) for name, kind in kinds.items())


def declared_payload(owner: str, uploads: tuple[Upload, ...], payload: Message | Mapping[str, torch.Tensor] | None,
                     public_logits: torch.Tensor | None = None, rows: int | None = None,
                     classes: int | None = None) -> Message:
    """What a client sends: its hook's ``payload``, with its public logits when ``logits`` is declared
    and the hook did not send its own; any array the declaration does not name, or does not fit, is
    refused in one line naming ``owner`` and the array. The message's ``sensitivity`` is each array's
    declared kind (a hook that states another kind is refused: the declaration is the one truth)."""
    message = as_message(payload)
    arrays = dict(message.arrays)
    declared = {u.name: u for u in uploads}
    if public_logits is not None and "logits" in declared and "logits" not in arrays:
        arrays = {"logits": public_logits, **arrays}
    for key, value in arrays.items():
        spec = declared.get(key)
        if spec is None:
            raise ConfigError("aggregator", f"{owner} uploads {key!r}, which its client part does not declare "
                              f"(uploads: {', '.join(declared) or 'none'}); add fdlit.messages.Upload({key!r}, kind) "
                              "to its ``uploads``")
        if why := spec.problem(value, rows, classes):
            raise ConfigError("aggregator", f"{owner} uploads {key!r}, which {why}")
        if message.sensitivity.get(key, spec.kind) != spec.kind:
            raise ConfigError("aggregator", f"{owner} sends {key!r} with sensitivity {message.sensitivity[key]!r}, "
                              f"and its client part declares it {spec.kind!r} (Upload.kind); drop the message's "
                              "sensitivity: the declaration sets it")
    out = message.with_arrays(arrays)
    out.sensitivity = {key: declared[key].kind for key in arrays}
    return out

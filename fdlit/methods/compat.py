"""Methods written against earlier contracts, adapted to the current one (with a DeprecationWarning).

Two earlier shapes still run:

* a rule that defines its client hooks (``client_setup``, ``client_upload``, ``client_receive``,
  ``distillation_set``) on the Aggregator itself: :class:`LegacyClientPart` calls them, so the whole
  rule, server state included, travels to workers;
* a client part whose ``loss(client, phase, logits, target, weight, base)`` or
  ``distillation_set(public_x, targets, private_x, private_y)`` takes positional arguments instead of a
  context: :class:`FormerSignatures` calls them with the context's fields.

Nothing outside this module knows either shape: the round only ever sees a :class:`ClientPart`.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch

from fdlit.methods.client_part import ClientPart
from fdlit.methods.contexts import ClientContext, DistillationContext, LossContext

LEGACY_HOOKS = {"client_setup": "setup", "client_upload": "upload", "client_receive": "receive",
                "distillation_set": "distillation_set"}


class LegacyAggregatorHooks:
    """The Aggregator's former client hooks, forwarding to its client part, so that an old rule's
    ``super().client_upload(ctx)`` still reaches its parent's client part."""

    def client_setup(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        return self.client_part().setup(ctx)

    def client_upload(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        return self.client_part().upload(ctx)

    def client_receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        return self.client_part().receive(ctx)

    def distillation_set(self, public_x: torch.Tensor, targets: torch.Tensor, private_x: torch.Tensor,
                         private_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.client_part().distillation_set(DistillationContext(-1, public_x, targets, private_x, private_y))


def legacy_hooks(method: Any) -> list[str]:
    """The client hooks ``method``'s class (or a parent below the Aggregator) still defines."""
    mro = type(method).__mro__
    below = mro[: mro.index(LegacyAggregatorHooks) - 1] if LegacyAggregatorHooks in mro else mro  # not Aggregator
    return [name for name in LEGACY_HOOKS if any(name in vars(cls) for cls in below)]


class LegacyClientPart(ClientPart):
    """The client part of a rule that defines its client hooks on the Aggregator itself (deprecated):
    each hook calls the rule's, so the whole rule, server state included, travels to workers."""

    def __init__(self, method: Any):
        self.method = method
        self.defined = legacy_hooks(method)
        self.own = adapted(method.client_part())

    def setup(self, ctx):
        return self.method.client_setup(ctx)

    def upload(self, ctx):
        return self.method.client_upload(ctx)

    def receive(self, ctx):
        return self.method.client_receive(ctx)

    def distillation_set(self, ctx):
        return self.method.distillation_set(ctx.public_x, ctx.targets, ctx.private_x, ctx.private_y)

    def loss(self, ctx):
        return self.own.loss(ctx)

    def carried_classes(self) -> set[type]:
        return {type(self), type(self.method)}  # the whole rule travels

    @property
    def loss_state_keys(self) -> tuple[str, ...]:
        return self.own.loss_state_keys

    @property
    def rowwise_loss(self) -> bool:
        return self.own.rowwise_loss

    @property
    def has_setup(self) -> bool:
        return "client_setup" in self.defined or self.own.has_setup

    @property
    def has_receive(self) -> bool:
        return "client_receive" in self.defined or self.own.has_receive

    @property
    def has_loss(self) -> bool:
        return self.own.has_loss


def _positional(cls: type, name: str, base: type = ClientPart) -> bool:
    """Whether ``cls`` overrides hook ``name`` with the former positional signature."""
    fn = getattr(cls, name, None)
    if fn is None or fn is getattr(base, name):
        return False
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(params) > 2  # self and a context


class FormerSignatures(ClientPart):
    """A client part whose ``loss`` / ``distillation_set`` take the former positional arguments."""

    def __init__(self, inner: ClientPart):
        self.inner = inner
        self.old_loss = _positional(type(inner), "loss")
        self.old_distillation = _positional(type(inner), "distillation_set")

    def setup(self, ctx):
        return self.inner.setup(ctx)

    def upload(self, ctx):
        return self.inner.upload(ctx)

    def receive(self, ctx):
        return self.inner.receive(ctx)

    def distillation_set(self, ctx):
        if self.old_distillation:
            return self.inner.distillation_set(ctx.public_x, ctx.targets, ctx.private_x, ctx.private_y)
        return self.inner.distillation_set(ctx)

    def loss(self, ctx: LossContext):
        if self.old_loss:
            return self.inner.loss(ctx.client, ctx.phase, ctx.logits, ctx.target, ctx.weight, ctx.base)
        return self.inner.loss(ctx)

    def carried_classes(self) -> set[type]:
        return {type(self), *self.inner.carried_classes()}

    @property
    def loss_state_keys(self) -> tuple[str, ...]:
        return self.inner.loss_state_keys

    @property
    def rowwise_loss(self) -> bool:
        return self.inner.rowwise_loss

    @property
    def has_setup(self) -> bool:
        return self.inner.has_setup

    @property
    def has_receive(self) -> bool:
        return self.inner.has_receive

    @property
    def has_loss(self) -> bool:
        return self.inner.has_loss


def adapted(part: ClientPart) -> ClientPart:
    """``part``, or its :class:`FormerSignatures` adapter (with a warning) where it has old signatures."""
    old = [name for name in ("loss", "distillation_set") if _positional(type(part), name)]
    if not old:
        return part
    warnings.warn(f"{type(part).__name__}.{' and .'.join(old)} take(s) positional arguments; this signature is "
                  "deprecated: take one context (loss(self, ctx: LossContext), distillation_set(self, ctx: "
                  "DistillationContext)); see docs/extending.md", DeprecationWarning, stacklevel=3)
    return FormerSignatures(part)


def client_part_of(method: Any) -> ClientPart:
    """The client part of ``method``: its own (``method.client_part()``), or for a rule that still
    defines ``client_upload`` etc. on the Aggregator, a :class:`LegacyClientPart` (with a warning)."""
    old = legacy_hooks(method)
    if not old:
        return adapted(method.client_part())
    warnings.warn(f"{type(method).__name__} defines {', '.join(old)} on the Aggregator; these hooks are "
                  "deprecated: define a ClientPart (setup, upload, receive, distillation_set, loss) and return "
                  "it from client_part(), so that workers get the client part only, not the server state",
                  DeprecationWarning, stacklevel=2)
    return LegacyClientPart(method)

"""The method's client part with an attack on top: where the client lives, an adversarial client
runs the method's own hooks, then the attack changes its upload (:mod:`fdlit.adversaries.attacks`).
Honest clients run the method's hooks unchanged. Who attacks in a round is a function of (seed,
round, client id) alone (:class:`~fdlit.adversaries.section.Attackers`), so the wrapper holds
settings only and every executor can ship it."""

from __future__ import annotations

from fdlit.adversaries.attacks import START_PARAMETERS, Attack
from fdlit.messages import as_message
from fdlit.methods.base import ClientPart
from fdlit.methods.parameters import exchanged_tensors, flatten


class AdversarialClientPart(ClientPart):
    """``inner`` (the method's client part) for honest clients; ``attack`` on the uploads of the
    clients ``attackers`` names in a round."""

    def __init__(self, inner: ClientPart, attack: Attack, attackers, exchange: str):
        self.inner, self.attack, self.attackers = inner, attack, attackers
        # update attacks scale against the global model, which only parameter exchange sends each round
        self.keeps_start = exchange == "parameters" and attack.keeps_start_parameters

    def setup(self, ctx):
        return self.inner.setup(ctx)

    def upload(self, ctx):
        payload = self.inner.upload(ctx)
        if not self.attackers.attacks(ctx.client.client_id, ctx.info.round):
            return payload
        message = as_message(payload)
        return message.with_arrays(self.attack.upload(ctx, dict(message.arrays)))

    def receive(self, ctx):
        out = self.inner.receive(ctx)
        if self.keeps_start and self.attackers.may_attack(ctx.client.client_id):
            # the model the next round starts from, which the update attacks scale against
            ctx.state[START_PARAMETERS] = flatten(exchanged_tensors(ctx.client.model)).clone()
        return out

    def distillation_set(self, ctx):
        return self.inner.distillation_set(ctx)

    def loss(self, ctx):
        return self.inner.loss(ctx)

    @property
    def loss_state_keys(self):
        return self.inner.loss_state_keys

    @property
    def rowwise_loss(self):
        return self.inner.rowwise_loss

    @property
    def uploads(self):
        return self.inner.uploads

    @property
    def needs_features(self):
        return self.inner.needs_features

    def client_network(self, model, seed):
        return self.inner.client_network(model, seed)

    def carried_classes(self) -> set[type]:
        return {type(self), *self.inner.carried_classes(), type(self.attack)}

    @property
    def has_loss(self):
        return self.inner.has_loss

    @property
    def has_setup(self):
        return self.inner.has_setup

    @property
    def has_receive(self):
        return self.inner.has_receive or self.keeps_start

"""A federated-distillation client: one module, two phases, persistent optimizer state."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from fdlit.clients.loss_context import LossContext
from fdlit.clients.options import OPTIMIZERS, ClientOptimization  # noqa: F401 (re-exported)

Phase = Literal["private", "public"]


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy against integer labels or probabilities (soft targets).

    With ``weight`` (per sample): ``sum(w * ce) / sum(w)``, written as log_softmax + gather / sum so
    that it batches under ``torch.func.vmap`` (the vectorized executor pads batches with weight-0
    samples); without, ``F.cross_entropy``, bit for bit what one-at-a-time training has always used.
    """
    logits = logits.float()
    if weight is None:
        return F.cross_entropy(logits, target)
    logp = logits.log_softmax(-1)
    per_sample = -(target * logp).sum(-1) if target.is_floating_point() else -logp.gather(-1, target[..., None])[..., 0]
    return (per_sample * weight).sum() / weight.sum()


class ClientModule(nn.Module):
    """Client i of the federation (Kovalchuk et al. 2026, Algorithm 1, lines 4-5 and 14).

    Two steps, which every executor calls (sequential, vectorized through ``torch.func.functional_call``
    on this module, Ray), so a subclass that overrides them trains differently everywhere:

    * ``private_loss``: the private step, cross-entropy on the client's labelled data;
    * ``public_loss``: the public step, distillation CE(P(x) || softmax(f_i(x))) against the teacher P
      on X_pub.

    A method changes either loss through its client part's ``loss`` hook (``method_part``, attached
    by the loop: FedProx's proximal term, SCAFFOLD's correction, FedMD's digest); a subclass
    (``federation.client_class``) may override the steps themselves.

    ``training_step`` dispatches on ``phase``; ``predict_step`` returns logits. The optimizer is built
    once and reused every round, so Adam's moments persist across rounds and phases (only the
    learning rate changes between phases). ``method_state`` holds a method's client-side state
    (e.g. Selective-FD's selector mask); it moves and is checkpointed with the client.
    ``method_part`` is the method's client part (settings only; not a submodule, not checkpointed).
    """

    def __init__(
        self,
        model: nn.Module,
        client_id: int,
        classes: list[int],
        optimization: ClientOptimization,
        seed: int = 0,
    ):
        super().__init__()
        self.model = model
        self.client_id = client_id
        self.classes = list(classes)
        self.optimization = optimization
        self.phase: Phase = "private"
        # each client's own random stream (batch order, augmentation): reproducible and checkpointable
        self.generator = torch.Generator().manual_seed(seed * 1_000_003 + client_id)
        self.method_state: dict[str, torch.Tensor] = {}
        self.method_part = None  # the method's ClientPart, whose ``loss`` hook shapes both losses
        self._optimizer: torch.optim.Optimizer | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def private_loss(self, logits: torch.Tensor, labels: torch.Tensor,
                     weight: torch.Tensor | None = None) -> torch.Tensor:
        """The private step's loss: CE against integer labels (``weight``: see :func:`cross_entropy`),
        as the method's client part makes it (e.g. plus FedProx's proximal term)."""
        return self.method_loss("private", logits, labels, weight, cross_entropy(logits, labels, weight))

    def public_loss(self, logits: torch.Tensor, teacher: torch.Tensor,
                    weight: torch.Tensor | None = None) -> torch.Tensor:
        """The public step's loss: CE(P || softmax(logits)) against the teacher's probabilities, as
        the method's client part makes it (e.g. FedMD's digest instead)."""
        return self.method_loss("public", logits, teacher, weight, cross_entropy(logits, teacher, weight))

    def method_loss(self, phase: Phase, logits: torch.Tensor, target: torch.Tensor,
                    weight: torch.Tensor | None, base: torch.Tensor) -> torch.Tensor:
        """``base`` as the method's client part makes it (its ``loss`` hook, given a LossContext).

        Under padded batches (``weight`` given: the vectorized executor) a ``rowwise_loss`` hook is
        evaluated on each row as a batch of one and averaged over the real rows, so a hook written as
        a plain mean over its batch trains exactly as it does one client at a time."""
        part = self.method_part
        if part is None or not part.has_loss:
            return base
        if weight is None or not part.rowwise_loss:
            return part.loss(LossContext(self, phase, logits, target, base, self.method_state, weight))

        def one_row(row_logits, row_target):
            row_logits, row_target = row_logits[None], row_target[None]
            return part.loss(LossContext(self, phase, row_logits, row_target, cross_entropy(row_logits, row_target),
                                         self.method_state))

        per_row = torch.func.vmap(one_row, randomness="different")(logits, target)
        return (per_row * weight).sum() / weight.sum()

    def phase_loss(self, logits: torch.Tensor, target: torch.Tensor,
                   weight: torch.Tensor | None = None) -> torch.Tensor:
        loss = self.private_loss if self.phase == "private" else self.public_loss
        return loss(logits, target, weight)

    def training_step(self, batch, batch_idx: int = 0) -> torch.Tensor:
        """``batch`` = (inputs, targets) or (inputs, targets, per-sample weights)."""
        x, target, *weight = batch
        return self.phase_loss(self(x), target, weight[0] if weight else None)

    def predict_step(self, batch, batch_idx: int = 0) -> torch.Tensor:
        return self(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self._optimizer is None:
            self._optimizer = self.optimization.build(self.parameters())
        return self._optimizer

    def set_phase(self, phase: Phase) -> None:
        self.phase = phase
        lr = self.optimization.lr if phase == "private" else self.optimization.public_lr
        for group in self.configure_optimizers().param_groups:
            group["lr"] = lr

    @torch.inference_mode()
    def predict_logits(self, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
        was_training = self.training
        self.eval()
        # float inputs in the parameters' dtype, as Fabric converts them on the training path
        # (64-true / bf16-true); callbacks call this outside Fabric (e.g. on calibration data)
        p = next(self.model.parameters(), None)
        cast = p is not None and x.is_floating_point() and p.is_floating_point() and x.dtype != p.dtype
        out = torch.cat([self(x[i : i + batch_size].to(p.dtype) if cast else x[i : i + batch_size])
                         for i in range(0, len(x), batch_size)])
        self.train(was_training)
        return out.float()

    # --- state that must move with the client (checkpoints, other executors) ---------------------
    def client_state(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.configure_optimizers().state_dict(),
            "generator": self.generator.get_state(),
            "method": dict(self.method_state),
        }

    def load_client_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.configure_optimizers().load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.method_state = dict(state.get("method", {}))

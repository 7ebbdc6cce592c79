"""A federated-distillation client: one module, two phases, persistent optimizer state."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from fdlit.clients.features import check_feature_network, features_and_logits
from fdlit.clients.lightning_import import LightningModule
from fdlit.clients.loss_context import LossContext
from fdlit.clients.method_part import MethodPart
from fdlit.clients.optimizer_scope import OptimizerScope
from fdlit.clients.options import OPTIMIZERS, ClientOptimization  # noqa: F401 (re-exported)
from fdlit.clients.own_module import find_own_module, step_loss
from fdlit.clients.schedules import built_once, read_optimizers, step_schedules, stepping_hook
from fdlit.clients.step_log import StepLog
from fdlit.errors import ConfigError

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


def part_name(part: MethodPart) -> str:
    """How errors name a method's client part (its method's label where it has one)."""
    return part.label or type(part).__name__


class ClientModule(LightningModule):
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
    ``method_part`` is the method's client part (settings only; not a submodule, not checkpointed);
    a part with a ``client_network(model, seed)`` hook shapes the client's network when it is
    attached, before any optimizer exists (FML and FedKD pair it with a shared network).

    It is a ``lightning.pytorch.LightningModule``. Its epoch is one pass over a phase's data within a
    round (``federation.local_epochs`` of them in the private phase, ``public_epochs`` in the public
    one): ``on_train_epoch_start`` / ``on_train_epoch_end`` are called around each, by the executors
    that step clients one at a time (sequential, Ray actors, Flower nodes). ``self.log(name, value)``
    in a step is recorded outside ``torch.func`` transforms (a no-op under the vectorized executor's
    vmap) and reaches the round's metrics as ``clients/log/<name>``: the mean over the round's steps
    of each client, averaged over the clients that logged it.

    When ``model`` is a user's own LightningModule (``model.class_path``), its ``training_step`` is the
    private step, its ``public_step((x, teacher_probs), batch_idx)`` the public one if it has one (else
    distillation of its ``forward`` logits against the teacher), its ``configure_optimizers`` is used
    with its schedulers, which step in the private phase only (an "epoch" scheduler after each private
    epoch, a "step" one after each private step): the module's training epochs are its passes over its
    own data, as under Lightning's Trainer. Its learning rate is its own (``client.lr`` and
    ``public_lr`` do not apply).

    A subclass may override ``configure_optimizers`` with Lightning's return forms too: it is called
    once per client, its schedulers step as a user's LightningModule's do (in the private phase, after
    each epoch or step; the learning rate is then the schedulers', not ``client.lr`` / ``public_lr``),
    and the vectorized executor trains such a client one at a time (its schedulers step in the epoch
    and batch hooks, which that executor does not call). A metric-watching scheduler
    (ReduceLROnPlateau) is refused.
    """

    is_fdlit_client = True  # fdlit's client, never a user's own network (fdlit.clients.own_module)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("configure_optimizers")
        if own is None:
            return
        cls.configure_optimizers = built_once(own)  # called once; its schedulers are kept and stepped
        for hook in ("on_train_epoch_end", "on_train_batch_end"):
            if hook not in cls.__dict__:
                setattr(cls, hook, stepping_hook(getattr(cls, hook)))

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
        self._scope = OptimizerScope(getattr(optimization, "optimizer_scope", "shared"))
        self._schedules: list = []
        self._step_log = StepLog()
        self._private_epochs = self._private_steps = 0
        own = find_own_module(model)
        if own is not None:  # the user's module logs into this client
            own.log = self.log

    @property
    def own_module(self) -> LightningModule | None:
        """The user's own LightningModule when it is the network, else None."""
        return find_own_module(self.model)

    @property
    def method_part(self) -> MethodPart | None:
        return self.__dict__.get("_method_part")

    @method_part.setter
    def method_part(self, part: MethodPart | None) -> None:
        if part is not None and part.has_loss and self.own_module is not None:
            raise ConfigError("model.class_path", f"{type(self.own_module).__name__} is a LightningModule with its own "
                              f"training_step: the method's loss hook ({type(part).__name__}) cannot shape it; "
                              "use a method without a client loss")
        if part is not None and self._optimizer is None:  # before any optimizer holds the parameters
            self.model = part.client_network(self.model, self.generator.initial_seed())
        if part is not None and part.needs_features:
            check_feature_network(self.model, part_name(part))
        self.__dict__["_method_part"] = part

    @property
    def needs_features(self) -> bool:
        """Whether the method's loss reads each step's penultimate features (``LossContext.features``)."""
        return self.method_part is not None and self.method_part.needs_features

    def log(self, name: str, value, *args, **kwargs) -> None:
        """Lightning's ``self.log``: recorded for the round's metrics (``clients/log/<name>``)."""
        self._step_log.record(name, value)

    def take_logged(self) -> dict[str, float]:
        """Means of the values logged since the last call, by name."""
        return self._step_log.take()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def features_and_logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(penultimate features, logits) of one forward, the same computation as ``self(x)``."""
        return features_and_logits(self.model, x)

    def private_loss(self, logits: torch.Tensor, labels: torch.Tensor,
                     weight: torch.Tensor | None = None, features: torch.Tensor | None = None) -> torch.Tensor:
        """The private step's loss: CE against integer labels (``weight``: see :func:`cross_entropy`),
        as the method's client part makes it (e.g. plus FedProx's proximal term); ``features``: the
        step's penultimate features, for a part that needs them."""
        return self.method_loss("private", logits, labels, weight, cross_entropy(logits, labels, weight), features)

    def public_loss(self, logits: torch.Tensor, teacher: torch.Tensor,
                    weight: torch.Tensor | None = None, features: torch.Tensor | None = None) -> torch.Tensor:
        """The public step's loss: CE(P || softmax(logits)) against the teacher's probabilities, as
        the method's client part makes it (e.g. FedMD's digest instead)."""
        return self.method_loss("public", logits, teacher, weight, cross_entropy(logits, teacher, weight), features)

    def method_loss(self, phase: Phase, logits: torch.Tensor, target: torch.Tensor,
                    weight: torch.Tensor | None, base: torch.Tensor,
                    features: torch.Tensor | None = None) -> torch.Tensor:
        """``base`` as the method's client part makes it (its ``loss`` hook, given a LossContext).

        Under padded batches (``weight`` given: the vectorized executor) a ``rowwise_loss`` hook is
        evaluated on each row as a batch of one and averaged over the real rows, so a hook written as
        a plain mean over its batch trains exactly as it does one client at a time."""
        part = self.method_part
        if part is None or not part.has_loss:
            return base
        if features is None and part.needs_features:
            raise ConfigError("federation.executor", f"{part_name(part)} reads each step's penultimate "
                              "features, which this executor's training step does not pass (it must call "
                              "ClientModule.phase_loss with features=)")
        if weight is None or not part.rowwise_loss:
            return part.loss(LossContext(self, phase, logits, target, base, self.method_state, weight, features))

        def one_row(row_logits, row_target, row_features=None):
            row_logits, row_target = row_logits[None], row_target[None]
            row_features = None if row_features is None else row_features[None]
            return part.loss(LossContext(self, phase, row_logits, row_target, cross_entropy(row_logits, row_target),
                                         self.method_state, features=row_features))

        rows = (logits, target) if features is None else (logits, target, features)
        per_row = torch.func.vmap(one_row, randomness="different")(*rows)
        return (per_row * weight).sum() / weight.sum()

    def phase_loss(self, logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                   features: torch.Tensor | None = None) -> torch.Tensor:
        loss = self.private_loss if self.phase == "private" else self.public_loss
        if features is None:  # without the keyword: a subclass's own private_loss / public_loss may not take it
            return loss(logits, target, weight)
        return loss(logits, target, weight, features=features)

    def training_step(self, batch, batch_idx: int = 0) -> torch.Tensor:
        """``batch`` = (inputs, targets) or (inputs, targets, per-sample weights)."""
        own = self.own_module
        if own is not None:
            return self._own_step(own, batch, batch_idx)
        x, target, *weight = batch
        weight = weight[0] if weight else None
        if self.needs_features:  # one forward through the network's two halves: features and logits
            features, logits = self.features_and_logits(x)
            return self.phase_loss(logits, target, weight, features)
        return self.phase_loss(self(x), target, weight)

    def _own_step(self, own: LightningModule, batch, batch_idx: int) -> torch.Tensor:
        x, target = batch[0], batch[1]
        if self.phase == "public" and not hasattr(own, "public_step"):
            return self.public_loss(self(x), target)
        if own is not self.model:  # the dataset's input module first, as forward does
            x = self.model.input(x)
        step = own.training_step if self.phase == "private" else own.public_step
        return step_loss(step((x, target), batch_idx))

    def on_train_epoch_start(self) -> None:
        if self.own_module is not None:
            self.own_module.on_train_epoch_start()

    def on_train_epoch_end(self) -> None:
        own = self.own_module
        if own is not None:
            own.on_train_epoch_end()
        if self.phase == "private":
            self._private_epochs += 1
            step_schedules(self._schedules, "epoch", self._private_epochs)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self._schedules and self.phase == "private":
            self._private_steps += 1
            step_schedules(self._schedules, "step", self._private_steps)

    def predict_step(self, batch, batch_idx: int = 0) -> torch.Tensor:
        return self(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """The client's one optimizer, built once (the own module's, with its schedulers kept aside)."""
        if self._optimizer is None:
            own = self.own_module
            if own is None:
                self._optimizer = self.optimization.build(self.parameters())
            else:
                self._optimizer, self._schedules = read_optimizers(own.configure_optimizers())
        return self._optimizer

    def set_phase(self, phase: Phase) -> None:
        self.phase = phase
        optimizer = self.configure_optimizers()
        self._scope.enter(optimizer, phase)
        if self.own_module is not None or self._schedules:  # the learning rate is its schedulers'
            return
        lr = self.optimization.lr if phase == "private" else self.optimization.public_lr
        for group in optimizer.param_groups:
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

    @torch.inference_mode()
    def predict_features(self, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
        """Penultimate features (N x D, float32) in eval mode, as :meth:`predict_logits` runs the network."""
        was_training = self.training
        self.eval()
        p = next(self.model.parameters(), None)
        cast = p is not None and x.is_floating_point() and p.is_floating_point() and x.dtype != p.dtype
        out = torch.cat([self.features_and_logits(x[i : i + batch_size].to(p.dtype) if cast else x[i : i + batch_size])[0]
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
            **({"optimizer_scope": self._scope.state_dict()} if self._scope.scope != "shared" else {}),
            **({"schedulers": [s.scheduler.state_dict() for s in self._schedules],
                "private_epochs": self._private_epochs, "private_steps": self._private_steps}
               if self._schedules else {}),
        }

    def load_client_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.configure_optimizers().load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.method_state = dict(state.get("method", {}))
        if "optimizer_scope" in state:
            self._scope.load_state_dict(state["optimizer_scope"])
        for schedule, saved in zip(self._schedules, state.get("schedulers", []), strict=False):
            schedule.scheduler.load_state_dict(saved)
        self._private_epochs = state.get("private_epochs", self._private_epochs)
        self._private_steps = state.get("private_steps", self._private_steps)

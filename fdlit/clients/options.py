"""How clients train (optimizer, learning rates, batch sizes): a config object without Lightning,
so that parsing a config and ``fdlit fit --help`` stay light."""

from __future__ import annotations

from typing import Literal

import torch

from fdlit.errors import ConfigError, check_at_least, check_number

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


class ClientOptimization:
    """How every client trains: optimizer, learning rate, batch size (Kovalchuk et al. 2026, Table 2, per dataset).

    Args:
        optimizer: ``adam``, ``adamw`` or ``sgd``.
        lr: learning rate of both phases.
        public_lr: learning rate of the public (KD) phase; null uses ``lr`` (eta_pub in Kovalchuk et al. 2026).
        weight_decay: decoupled for adamw, L2 otherwise.
        momentum: for sgd.
        batch_size: private-phase batch size.
        public_batch_size: public-phase batch size; null uses ``batch_size``.
        fused: use torch.optim's fused kernel (``fused=True``): one pass per step instead of one
            per operation, faster for small models (on CPU, 20 digits MLP clients trained one at a
            time: see ``benchmarks/executors.py``). Results differ from the default kernel in the
            last float bits. The vectorized executor always uses the fused Adam kernel.
        optimizer_scope: how long the optimizer's state lives: ``shared`` (one optimizer across both
            phases and all rounds), ``per_phase`` (one per phase, each kept across rounds) or
            ``per_round`` (cleared when each round's private phase starts); fdlit.clients.optimizer_scope.
    """

    def __init__(
        self,
        optimizer: Literal["adam", "adamw", "sgd"] = "adam",
        lr: float = 1e-3,
        public_lr: float | None = None,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        batch_size: int = 32,
        public_batch_size: int | None = None,
        fused: bool = False,
        optimizer_scope: Literal["shared", "per_phase", "per_round"] = "shared",
    ):
        if optimizer not in OPTIMIZERS:
            raise ConfigError("client.optimizer", f"allowed: {sorted(OPTIMIZERS)}; got {optimizer!r}")
        for name, value in (("lr", lr), ("public_lr", public_lr)):
            if value is not None and not value > 0:
                raise ConfigError(f"client.{name}", f"must be > 0, got {value}")
        check_at_least("client.batch_size", batch_size, 1)
        if public_batch_size is not None:
            check_at_least("client.public_batch_size", public_batch_size, 1)
        for name, value in (("weight_decay", weight_decay), ("momentum", momentum)):
            check_number(f"client.{name}", value, minimum=0.0, inclusive=True)
        self.optimizer = optimizer
        self.lr = lr
        self.public_lr = public_lr if public_lr is not None else lr
        self.weight_decay = weight_decay
        self.momentum = momentum
        self.batch_size = batch_size
        self.public_batch_size = public_batch_size or batch_size
        self.fused = fused
        if optimizer_scope not in ("shared", "per_phase", "per_round"):
            raise ConfigError("client.optimizer_scope", f"allowed: shared, per_phase, per_round; got {optimizer_scope!r}")
        self.optimizer_scope = optimizer_scope

    def build(self, params) -> torch.optim.Optimizer:
        kwargs = {"lr": self.lr, "weight_decay": self.weight_decay}
        if self.optimizer == "sgd":
            kwargs["momentum"] = self.momentum
        if self.fused:
            kwargs["fused"] = True
        return OPTIMIZERS[self.optimizer](params, **kwargs)

"""The server model: a network on the server, distilled each round from the aggregated teacher.

Server-side distillation is what DS-FL (Itahara et al. 2021), FedDF (Lin et al. 2020) and FedGO
(Jang et al. 2025) add to the FD round: after aggregation, the server trains its own model on the
public set against the teacher P,

    min_theta  (1/|K|) sum_{x in K} KL( P(x) || softmax(g_theta(x)) ),

K = the public samples the rule kept (all of them unless the rule drops samples), and evaluates it
on the test set every evaluated round (``server/acc``, ``server/nll``). Any aggregation rule can be
its teacher. It lives on the driver (the loop's device), whatever the executor, and trains in
float32 with its own optimizer and its own random stream, so it changes no client's random numbers.

``broadcast``: the method asks for the server model's probabilities on the (kept) public set to be
the teacher the clients distil from, sent down instead of the aggregated teacher (kind
``server_teacher``, counted like any message). DS-FL and FedMD do not (their clients distil from
the aggregated labels); a server model that is not broadcast sends nothing.
"""

from __future__ import annotations

import importlib
import math
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F

from fdlit.clients import ClientOptimization
from fdlit.errors import ConfigError, check_at_least, check_number
from fdlit.methods.distillation import Batches, distil
from fdlit.models.build import build_model

if TYPE_CHECKING:
    from fdlit.federation.round_facts import RoundPlan
    from fdlit.federation.tensors import FederationTensors


def check_model_spec(field: str, spec: dict | None) -> None:
    """Refuse a class path that does not import or is not a torch module, before any work."""
    if spec is None:
        return
    class_path = spec.get("class_path") if isinstance(spec, dict) else None
    if not isinstance(class_path, str):
        raise ConfigError(f"{field}.class_path", f"a model needs a class_path, got {spec!r}")
    module_name, _, cls_name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{field}.class_path", f"cannot import {class_path!r} ({exc})") from None
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise ConfigError(f"{field}.class_path", f"{class_path!r} is not a torch.nn.Module subclass")


class ServerModel:
    """The ``server`` section: a server model trained by distillation each round (off when ``model`` is null).

    Args:
        model: the server network by ``class_path`` / ``init_args`` (like ``model``); null: no server model.
        optimizer: ``adam``, ``adamw`` or ``sgd``.
        lr: learning rate (> 0).
        weight_decay: decoupled for adamw, L2 otherwise (>= 0).
        momentum: for sgd (>= 0).
        batch_size: distillation batch size (>= 1).
        epochs_first: distillation epochs over the public set in round 1 (>= 0).
        epochs: distillation epochs in later rounds (>= 0).
        broadcast: send the server model's probabilities on the public set down as the clients'
            teacher instead of the aggregated teacher (counted as ``server_teacher``); needs ``model``.
    """

    def __init__(
        self,
        model: dict | None = None,
        optimizer: Literal["adam", "adamw", "sgd"] = "adam",
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        batch_size: int = 32,
        epochs_first: int = 5,
        epochs: int = 5,
        broadcast: bool = False,
    ):
        check_model_spec("server.model", model)
        if optimizer not in ("adam", "adamw", "sgd"):
            raise ConfigError("server.optimizer", f"allowed: adam, adamw, sgd; got {optimizer!r}")
        check_number("server.lr", lr)
        check_number("server.weight_decay", weight_decay, inclusive=True)
        check_number("server.momentum", momentum, inclusive=True)
        check_at_least("server.batch_size", batch_size, 1)
        check_at_least("server.epochs_first", epochs_first, 0)
        check_at_least("server.epochs", epochs, 0)
        if broadcast and model is None:  # nothing to broadcast: the clients would distil from the aggregate
            raise ConfigError("server.broadcast", "true needs a server model to broadcast the predictions of, and "
                              "server.model is null; allowed: server.broadcast false, or set server.model "
                              "(e.g. --server.model fdlit.models.MLP)")
        self.spec = model
        self.optimization = ClientOptimization(optimizer, lr, weight_decay=weight_decay, momentum=momentum,
                                               batch_size=batch_size)
        self.batch_size, self.epochs_first, self.epochs = batch_size, epochs_first, epochs
        self.broadcast = broadcast
        self.net: torch.nn.Module | None = None

    @property
    def enabled(self) -> bool:
        return self.spec is not None

    def setup(self, input_shape: tuple[int, ...], num_classes: int, seed: int, device: torch.device,
              input_transform=None) -> None:
        """Build the network and its optimizer; seeded, without touching the global random stream.
        ``input_transform``: the dataset's input module (as the clients get it), or None."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed * 1_000_003 + 0x5E2)
            net = build_model(self.spec, input_shape, num_classes, field="server.model")
            if input_transform is not None:
                from fdlit.data.augment import WithInput

                net = WithInput(input_transform(seed=seed * 1_000_003 + 0x5E4), net)
            self.net = net.to(device)
        self.optimizer = self.optimization.build(self.net.parameters())
        self.generator = torch.Generator().manual_seed(seed * 1_000_003 + 0x5E3)  # batch order

    def distil(self, x: torch.Tensor, teacher: torch.Tensor, epochs: int) -> float:
        """Train on (x, teacher) for ``epochs``: KL(P || softmax(g(x))), mean over samples; the mean loss."""
        return distil(self.net, self.optimizer, x, Batches(epochs, self.batch_size, self.generator),
                      lambda log_q, idx: F.kl_div(log_q, teacher[idx].float(), reduction="batchmean"),
                      train_single=True)

    @torch.no_grad()
    def probs(self, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
        self.net.eval()
        return torch.cat([self.net(x[i: i + batch_size]).float().softmax(-1)
                          for i in range(0, len(x), batch_size)])

    def round(self, first: bool, public_x: torch.Tensor, teacher: torch.Tensor,
              test: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor | None, dict[str, float]]:
        """One round's server step: distil from ``teacher`` on ``public_x`` (the kept rows), evaluate
        on ``test`` (None: not evaluated this round, NaN). Returns the probabilities to broadcast
        (None unless ``broadcast``) and the metrics."""
        loss = self.distil(public_x, teacher, self.epochs_first if first else self.epochs) if len(public_x) else math.nan
        metrics = {"server/distill_loss": loss, "server/acc": math.nan, "server/nll": math.nan}
        if test is not None:
            x, y = test
            p = self.probs(x)
            metrics["server/acc"] = float((p.argmax(-1) == y).float().mean())
            metrics["server/nll"] = float(-torch.log(p.gather(1, y[:, None]).clamp_min(1e-12)).mean())
        sent = self.probs(public_x) if self.broadcast else None
        return sent, metrics

    def teacher_step(self, plan: RoundPlan, public_x: torch.Tensor, teacher: torch.Tensor, stats: dict[str, float],
                     tensors: FederationTensors) -> tuple[torch.Tensor, str]:
        """The server model's part of a round (composed into the server's side at set-up): distil from
        the round's teacher, measure on the round's test rows when it evaluates; its metrics go into
        ``stats``. Returns what the clients are sent: the server model's predictions when it
        broadcasts (``server_teacher``), else the teacher."""
        t, rows = tensors, plan.eval_rows
        test = None if not plan.evaluated else (t.test_x, t.test_y) if rows is None else (t.test_x[rows], t.test_y[rows])
        server_teacher, metrics = self.round(plan.first, public_x, teacher, test)
        stats.update(metrics)
        return (teacher, "teacher") if server_teacher is None else (server_teacher, "server_teacher")

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])

"""FedDF: FedAvg, then ensemble distillation of the averaged model on the public set (Lin et al. 2020)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fdlit.errors import ConfigError, check_at_least, check_number
from fdlit.methods.base import AggregationResult, ServerContext, Uploads
from fdlit.methods.distillation import Batches, distil
from fdlit.methods.fedavg import FedAvg, exchanged_tensors, flatten, load_flat
from fdlit.models.build import build_model


class FedDF(FedAvg):
    """FedDF (Lin, Kong, Stich, Jaggi, *Ensemble distillation for robust model fusion in federated
    learning*, NeurIPS 2020, Algorithm 1, homogeneous case). Each round, after the clients' private
    phase:

        w = sum_k (n_k / n) w_k                                   (FedAvg)
        P(x) = softmax( (1/M) sum_k f_{w_k}(x) ),  x in the public set   (the clients' ensemble)
        w <- w - lr * grad_w  KL( P(x) || softmax(f_w(x)) )         (``epochs`` epochs of Adam)

    and the distilled w is broadcast (``parameters``, as FedAvg). The server evaluates the client
    models it received on the unlabelled public set itself, so the messages are FedAvg's.

    Choices: Adam restarted every round from the averaged model, batches in an order seeded by
    (seed, round), so nothing but FedAvg's state is carried and resume is exact; a fixed number of
    epochs instead of the paper's early stopping on a validation set. The server network is built
    from ``model`` (every client runs the same architecture, as FedAvg requires).

    Args:
        epochs: distillation epochs over the public set per round (>= 0; 0: FedAvg).
        lr: Adam learning rate (> 0).
        batch_size: distillation batch size (>= 1).
    """

    short_name = "feddf"
    label = "FedDF"  # how tables and figures name the method

    def __init__(self, epochs: int = 2, lr: float = 1e-3, batch_size: int = 32):
        super().__init__()
        check_at_least("aggregator.epochs", epochs, 0)
        check_number("aggregator.lr", lr)
        check_at_least("aggregator.batch_size", batch_size, 1)
        self.epochs, self.lr, self.batch_size = epochs, lr, batch_size
        self.model_spec: Any = None
        self.net: torch.nn.Module | None = None

    def check_config(self, model: Any, client: Any) -> None:
        super().check_config(model, client)
        self.model_spec = model

    def _network(self, ctx: ServerContext, like: torch.Tensor) -> torch.nn.Module:
        if self.net is None:
            with torch.random.fork_rng(devices=[]):  # its initial weights are overwritten; keep the global stream
                net = build_model(self.model_spec, tuple(ctx.info.public_x.shape[1:]), ctx.info.num_classes)
            if flatten(exchanged_tensors(net)).numel() != like.numel():
                raise ConfigError("aggregator", "FedDF rebuilds the clients' network on the server from model; "
                                  f"it holds {flatten(exchanged_tensors(net)).numel()} numbers, the clients "
                                  f"send {like.numel()} (a dataset input module is not supported)")
            self.net = net.to(like.device)
        return self.net

    @staticmethod
    def _logits(net: torch.nn.Module, x: torch.Tensor, flat: torch.Tensor | None = None) -> torch.Tensor:
        """The server network's logits on x, with ``flat`` (a client's parameters) loaded first when given."""
        if flat is not None:
            load_flat(exchanged_tensors(net), flat)
        net.eval()
        with torch.no_grad():
            return net(x).float()

    def ensemble(self, logits: torch.Tensor, ctx: ServerContext) -> torch.Tensor:
        """The distillation target from the M x N x C client logits: FedDF's mean-logit ensemble."""
        return logits.mean(0).softmax(-1)

    def aggregate(self, uploads: Uploads, ctx: ServerContext) -> AggregationResult:
        average = self.average(uploads, ctx)  # n_k of the clients that arrived
        if self.epochs == 0:
            return AggregationResult(teacher=None, broadcast={"parameters": average})
        net = self._network(ctx, average)
        tensors = exchanged_tensors(net)
        x = ctx.info.public_x.to(average.device)
        with torch.no_grad():
            teacher = self.ensemble(torch.stack([self._logits(net, x, u["parameters"]) for u in uploads]), ctx)
        load_flat(tensors, average)
        optimizer = torch.optim.Adam(net.parameters(), lr=self.lr)
        generator = torch.Generator().manual_seed(ctx.info.seed * 1_000_003 + 0xFEDDF + ctx.info.round)
        loss = distil(net, optimizer, x, Batches(self.epochs, self.batch_size, generator),
                      lambda log_q, idx: F.kl_div(log_q, teacher[idx], reduction="batchmean"))
        stats = {"feddf/distill_loss": loss}
        return AggregationResult(teacher=None, broadcast={"parameters": flatten(tensors).clone()}, stats=stats)

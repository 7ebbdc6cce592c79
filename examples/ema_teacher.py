"""A method written outside fdlit: an EMA of the averaged predictions, distilled at a temperature.

Server part: the round's teacher is an exponential moving average, across rounds, of the clients'
mean probabilities on the public set,

    A_r(x) = (1/M) sum_i softmax(z_i(x)),    P_r(x) = beta P_{r-1}(x) + (1 - beta) A_r(x),   P_1 = A_1.

Client part: the public step distils at temperature T (Hinton et al. 2015, "Distilling the knowledge
in a neural network"), T^2 KL(P || softmax(z / T)), averaged over the batch.

Written the natural way: the loss is a plain batch mean and the server's state a plain tensor over
the round's public rows. fdlit makes the first exact under every executor; under a per-round public
subset (``participation.public_fraction``) it refuses the second with one line (its rows would mix
different public samples), unless the state is kept over the full public set (``full_public_set``).
Run it from this folder (or with it on PYTHONPATH):

    python -m fdlit fit --config ../configs/digits.yaml --config ema_teacher.yaml
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fdlit.methods.base import AggregationResult, Aggregator, ClientPart


class TemperatureDistillation(ClientPart):
    def __init__(self, temperature: float):
        self.temperature = temperature

    def loss(self, ctx):
        if ctx.phase != "public":
            return ctx.base
        t = self.temperature
        log_q = F.log_softmax(ctx.logits / t, dim=-1)
        return F.kl_div(log_q, ctx.target, reduction="batchmean") * t * t


class EMATeacher(Aggregator):
    """EMA of the averaged predictions (``beta``: how much of last round's teacher stays), distilled at
    ``temperature``. ``full_public_set``: keep the EMA over the whole public set, indexed by the
    round's public sample ids (what a per-round public subset needs)."""

    short_name = "ema"
    row_state = {"ema": 0}  # one row per public sample (the full set's, or with full_public_set off, the round's)
    label = "EMA teacher"

    def __init__(self, beta: float = 0.5, temperature: float = 2.0, full_public_set: bool = False):
        self.beta, self.temperature, self.full_public_set = beta, temperature, full_public_set
        self.ema: torch.Tensor | None = None

    def client_part(self):
        return TemperatureDistillation(self.temperature)

    def aggregate(self, uploads, ctx):
        mean = self.stack_logits(uploads).softmax(-1).mean(0)  # N x C
        if not self.full_public_set:
            self.ema = mean if self.ema is None else self.beta * self.ema + (1 - self.beta) * mean
            return AggregationResult(teacher=self.ema)
        ids = ctx.info.public_ids()  # this round's rows of the full public set
        if self.ema is None:
            self.ema = torch.full((ctx.info.full_public_size, mean.shape[-1]), float("nan"), device=mean.device)
        old = self.ema[ids]
        seen = ~old.isnan().any(-1, keepdim=True)
        self.ema[ids] = torch.where(seen, self.beta * old + (1 - self.beta) * mean, mean)
        return AggregationResult(teacher=self.ema[ids])

    def state_dict(self):
        return {"ema": self.ema}

    def load_state_dict(self, state):
        self.ema = state.get("ema")

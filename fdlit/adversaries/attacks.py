"""Attacks: what an adversarial client does differently from an honest one.

Each attack is a small class chosen by class path in the ``adversaries`` section
(:mod:`fdlit.adversaries.section`). It acts in one of two places, both where the client lives, so it
runs the same under every executor:

* its private set (data poisoning): :meth:`Attack.labels` returns the labels the client trains on;
* its upload (prediction, statistics and parameter poisoning): :meth:`Attack.upload` gets the
  method's own upload (the client part's payload, its public logits) and returns what is sent
  instead, through the wrapped client part (:mod:`fdlit.adversaries.client_part`).

An attack states which exchanges it fits (``exchanges``) and refuses a method it cannot attack
(:meth:`Attack.check`) before any work. Random draws are seeded by (seed, round, client), so a run
and a resumed run poison alike.
"""

from __future__ import annotations

import math

import torch

from fdlit.errors import ConfigError, check_number
from fdlit.methods.base import Aggregator, ClientContext
from fdlit.methods.client_part import declared_uploads

FIELD = "adversaries.attack"
# the method's last aggregate, as the client received it (what a free-rider sends back)
LAST_TEACHER = "_adversaries_teacher"  # FD: the teacher over the full public set (probabilities)
START_PARAMETERS = "adversaries_start"  # parameter exchange: the global model the client started the round from
DENSITY_KEYS = ("gmm_means", "log_likelihood")  # uploads that decide a density-weighted rule's weights


def _generator(ctx: ClientContext, salt: int) -> torch.Generator:
    seed = (ctx.info.client_seed(ctx.client.client_id) * 7919 + ctx.info.round * 104_729 + salt) % (2**63)
    return torch.Generator().manual_seed(seed)


class Attack:
    """An attack (see the module docstring). The default does nothing: an honest client."""

    exchanges: tuple[str, ...] = ("predictions", "parameters")  # the exchanges it can attack
    changes: tuple[str, ...] = ()  # the uploaded arrays it rewrites, which the method must declare

    def rewrites(self, method: Aggregator) -> tuple[str, ...]:
        """The uploaded arrays the attack rewrites on ``method`` (by default ``changes``)."""
        return self.changes

    def fits(self, method: Aggregator) -> bool:
        """Whether this attack can act on ``method``: its exchange, and the arrays its client part
        declares it uploads (``ClientPart.uploads``)."""
        return method.exchange in self.exchanges and set(self.rewrites(method)) <= uploaded(method)

    def misfit(self, method: Aggregator) -> str:
        """Why :meth:`fits` is False, for the error message."""
        name = type(method).__name__
        if method.exchange not in self.exchanges:
            return (f"{type(self).__name__} attacks {' or '.join(self.exchanges)} exchange; the method "
                    f"{name} exchanges {method.exchange}")
        return (f"{type(self).__name__} rewrites the uploaded {', '.join(self.rewrites(method))}, and {name}'s client "
                f"part uploads {', '.join(sorted(uploaded(method))) or 'nothing'}")

    def check(self, method: Aggregator, num_classes: int | None) -> None:
        """Refuse, with a ConfigError, a method this attack cannot act on (called before any work)."""
        if not self.fits(method):
            raise ConfigError(FIELD, f"{self.misfit(method)}. Allowed for it: {', '.join(fitting_attacks(method))}")
        if num_classes is not None:
            for name, value in self.class_settings().items():
                if not 0 <= value < num_classes:
                    raise ConfigError(f"{FIELD}.{name}", f"must be a class id in [0, {num_classes - 1}], got {value}")

    def class_settings(self) -> dict[str, int]:
        """The attack's settings that name classes (checked against the dataset's classes)."""
        return {}

    def labels(self, y: torch.Tensor, num_classes: int) -> torch.Tensor | None:
        """The labels the client trains on; None: its private set is untouched."""
        return None

    def upload(self, ctx: ClientContext, payload: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What the client sends instead of ``payload`` (what the method's client part returned; its
        public logits are ``ctx.public_logits`` where it returned none of its own)."""
        return payload

    def targeted(self, num_classes: int) -> tuple[list[int], int] | None:
        """(source classes, target class) of a targeted attack, for its success rate; None otherwise."""
        return None

    @property
    def keeps_start_parameters(self) -> bool:
        """Whether the client keeps the global model it started the round from (update attacks)."""
        return False

    @property
    def needs_teacher(self) -> bool:
        """Whether the client needs the teacher it was last sent (the free-rider)."""
        return False


def uploaded(method: Aggregator) -> set[str]:
    """The arrays ``method``'s clients upload each round, as its client part declares them."""
    return {u.name for u in declared_uploads(method.client_part(), method)}


def fitting_attacks(method: Aggregator) -> list[str]:
    """The shipped attacks a method can be attacked with (for error messages)."""
    return [f"fdlit.adversaries.{cls.__name__}" for cls in SHIPPED if cls().fits(method)]


# ---------------------------------------------------------------------- data poisoning
class LabelFlipping(Attack):
    """Label flipping on the private set (Tolpegin et al. 2020, *Data Poisoning Attacks Against
    Federated Learning Systems*): the client trains on wrong labels and uploads whatever its model
    then predicts.

    Args:
        source: the classes whose labels are flipped to ``target`` (a targeted attack). null: every
            label y becomes C - 1 - y (the untargeted flip of Tolpegin et al. 2020).
        target: the class the ``source`` labels become (required with ``source``).
    """

    def __init__(self, source: list[int] | None = None, target: int | None = None):
        if (source is None) != (target is None):
            raise ConfigError(f"{FIELD}.target", "set source and target together (a targeted flip), or neither "
                              "(every label y becomes C - 1 - y)")
        if source is not None and not source:
            raise ConfigError(f"{FIELD}.source", "must list at least one class")
        self.source = None if source is None else [int(c) for c in source]
        self.target = target

    def class_settings(self):
        if self.source is None:
            return {}
        return {**{f"source[{i}]": c for i, c in enumerate(self.source)}, "target": self.target}

    def labels(self, y, num_classes):
        if self.source is None:
            return num_classes - 1 - y
        flip = torch.isin(y, torch.tensor(self.source, device=y.device))
        return torch.where(flip, torch.full_like(y, self.target), y)

    def targeted(self, num_classes):
        return None if self.source is None else (list(self.source), int(self.target))


# ---------------------------------------------------------------------- prediction poisoning
class _PredictionAttack(Attack):
    exchanges = ("predictions",)
    changes = ("logits",)

    def upload(self, ctx, payload):
        logits = payload.get("logits", ctx.public_logits)
        return {**payload, "logits": self.poison(ctx, logits).to(logits.dtype)}

    def poison(self, ctx, logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class RandomPredictions(_PredictionAttack):
    """Random or uniform predictions (a Byzantine client that sends noise, Blanchard et al. 2017).

    Args:
        kind: ``random``: logits drawn N(0, scale^2) per entry (confident random classes);
            ``uniform``: zero logits, the uniform distribution on every sample.
        scale: the standard deviation of the random logits.
    """

    def __init__(self, kind: str = "random", scale: float = 5.0):
        if kind not in ("random", "uniform"):
            raise ConfigError(f"{FIELD}.kind", f"allowed: random, uniform; got {kind!r}")
        self.kind, self.scale = kind, check_number(f"{FIELD}.scale", scale)

    def poison(self, ctx, logits):
        if self.kind == "uniform":
            return torch.zeros_like(logits)
        noise = torch.randn(logits.shape, generator=_generator(ctx, 1), dtype=torch.float32)
        return (self.scale * noise).to(logits.device)


class ConfidentWrong(_PredictionAttack):
    """Confident wrong predictions: every public sample is called ``target`` with logit margin
    ``confidence`` (a targeted prediction-poisoning attack on the teacher).

    Args:
        target: the class claimed for every sample.
        confidence: the target's logit above the others (0 on every other class).
    """

    def __init__(self, target: int = 0, confidence: float = 10.0):
        self.target, self.confidence = target, check_number(f"{FIELD}.confidence", confidence)

    def class_settings(self):
        return {"target": self.target}

    def poison(self, ctx, logits):
        out = torch.zeros_like(logits, dtype=torch.float32)
        out[..., self.target] = self.confidence
        return out

    def targeted(self, num_classes):
        return [c for c in range(num_classes) if c != self.target], self.target


class ScaledLogits(_PredictionAttack):
    """The client's own logits times ``factor``: overconfident (factor > 1) or inverted (< 0)
    predictions that keep the client's ranking (or reverse it).

    Args:
        factor: the multiplier (finite, not 1).
    """

    def __init__(self, factor: float = 10.0):
        if not math.isfinite(factor) or factor == 1:
            raise ConfigError(f"{FIELD}.factor", f"must be a finite number other than 1, got {factor}")
        self.factor = factor

    def poison(self, ctx, logits):
        return logits.float() * self.factor


class FreeRider(Attack):
    """A free-rider (Lin et al. 2019, *Free-riders in Federated Learning*): sends back what it was
    last sent instead of its own work. Prediction exchange: the log of the teacher it received in the
    previous round on this round's public rows (round 1: uniform predictions); parameter exchange:
    the global model it started the round from, unchanged (a zero update)."""

    def rewrites(self, method):
        return ("parameters",) if method.exchange == "parameters" else ("logits",)

    @property
    def needs_teacher(self):
        return True

    @property
    def keeps_start_parameters(self):
        return True

    def upload(self, ctx, payload):
        if "parameters" in payload:
            return {**payload, "parameters": ctx.state[START_PARAMETERS].to(payload["parameters"])}
        logits = payload.get("logits", ctx.public_logits)
        teacher = ctx.received.get(LAST_TEACHER)
        if teacher is None or teacher.shape[-1] != logits.shape[-1]:
            return {**payload, "logits": torch.zeros_like(logits)}
        rows = teacher if ctx.info.public_index is None else teacher[ctx.info.public_index.to(teacher.device)]
        if rows.shape != logits.shape:  # the method uploads other rows than the public set's (none shipped)
            return {**payload, "logits": torch.zeros_like(logits)}
        return {**payload, "logits": rows.clamp_min(1e-12).log().to(logits)}


# ---------------------------------------------------------------------- statistics poisoning
class FabricatedDensity(Attack):
    """Fabricated density statistics for uncertainty-weighted rules (UWA, sUWA): predictions are
    untouched, but the client claims a density that peaks on every public sample it predicts. With
    ``upload: density`` it sends one Gaussian component per public row, centred on its own uploaded
    logits, with standard deviation ``std`` in every dimension, each labelled with the class it
    predicts there (every predicted class is claimed); the server then computes

        l_i(x_j) ~= -log N - (C / 2) log(2 pi std^2)

    (about +31 for C = 10, N = 500, std = 0.01), far above an honest client's density, so it takes
    (nearly) all the weight. With ``upload: scores`` it sends that value on every row. The robust
    fit (``aggregator.robust``) cannot stop it: it runs in the client's own fit, which this client
    skips.

    Args:
        std: the claimed standard deviation (near zero: a density that claims certainty).
    """

    exchanges = ("predictions",)
    changes = ("logits",)

    def __init__(self, std: float = 0.01):
        self.std = check_number(f"{FIELD}.std", std)

    def fits(self, method):
        return super().fits(method) and bool(uploaded(method) & set(DENSITY_KEYS))

    def misfit(self, method):
        return (f"FabricatedDensity poisons density statistics, which {type(method).__name__} does not use; it "
                "attacks the uncertainty-weighted rules (UWA, sUWA) only")

    def upload(self, ctx, payload):
        logits = payload.get("logits", ctx.public_logits).float()
        c = logits.shape[-1]
        peak = -(c / 2) * math.log(2 * math.pi * self.std**2)
        out = dict(payload)
        if "log_likelihood" in payload:
            out["log_likelihood"] = torch.full_like(payload["log_likelihood"], peak - math.log(len(logits)))
        if "gmm_means" in payload:
            out["gmm_means"] = logits.to(payload["gmm_means"].dtype)
            out["gmm_stds"] = torch.full_like(out["gmm_means"], self.std)
            out["gmm_classes"] = logits.argmax(-1).to(payload["gmm_classes"].dtype)
        return out


# ---------------------------------------------------------------------- parameter poisoning
class ScaledUpdate(Attack):
    """A scaled model update (Blanchard et al. 2017's Byzantine worker; Baruch et al. 2019 for
    scaled updates): the client sends w_t + scale * (w_i - w_t), where w_t is the global model it
    started the round from and w_i its trained model. scale = -1 flips the update's sign, a large
    scale boosts it (model replacement), 0 is a free-rider.

    Args:
        scale: the update's multiplier.
    """

    exchanges = ("parameters",)
    changes = ("parameters",)

    def __init__(self, scale: float = -1.0):
        if not math.isfinite(scale):
            raise ConfigError(f"{FIELD}.scale", f"must be finite, got {scale}")
        self.scale = scale

    @property
    def keeps_start_parameters(self):
        return True

    def upload(self, ctx, payload):
        start = ctx.state[START_PARAMETERS].to(payload["parameters"])
        return {**payload, "parameters": start + self.scale * (payload["parameters"] - start)}


class SignFlippedUpdate(ScaledUpdate):
    """The update with its sign flipped: w_t - (w_i - w_t) (:class:`ScaledUpdate` with scale -1)."""

    def __init__(self):
        super().__init__(-1.0)


SHIPPED = (LabelFlipping, RandomPredictions, ConfidentWrong, ScaledLogits, FreeRider, FabricatedDensity,
           ScaledUpdate, SignFlippedUpdate)

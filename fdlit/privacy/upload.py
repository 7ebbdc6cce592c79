"""The ``privacy`` section: differential privacy and encodings for what clients upload.

The Gaussian mechanism on uploads (client-level differential privacy)
----------------------------------------------------------------------
Every round, client i releases its public-set predictions Z_i (N x C logits) and, under UWA's
``density`` upload, its Gaussian mixture (|C_i| mean rows and |C_i| standard-deviation rows of C
numbers each). With noise multiplier sigma > 0 and clipping norm c:

    each released row r (a logit row, a mean row, a std row) is clipped: r <- r * min(1, c / ||r||_2)
    the whole release X_i (R rows: R = N, or N + 2|C_i| under UWA) gets  X_i + N(0, (sigma * Delta)^2 I)
    Delta = 2 c sqrt(R)

**Privacy unit: the client's whole private data set.** A client's release is computed by a model
trained on its private data; changing one private record may change every row, and FD gives no
per-record bound without per-sample gradient clipping (DP-SGD), which this mechanism does not do.
So the neighbouring relation is "replace the client's data by any other data": any two clipped
releases differ by at most 2c per row, hence by Delta = 2c sqrt(R) in L2 over the release. With
noise std sigma * Delta, one round is the Gaussian mechanism with noise multiplier sigma, and R
rounds (each client sampled with probability q per round, ``sample_rate``) are accounted by a
maintained accountant (Opacus's RDP or PRV accountant; Mironov 2017, Renyi differential privacy;
Gopi et al. 2021, PRV accountant): ``privacy/epsilon`` is the (epsilon, delta) guarantee each
client has about everything it released so far, round 0 to now.

What is protected: the logits (hence probabilities, hard labels, top-k, ...), and UWA's density
means and standard deviations. What is not: which classes a client's density covers (UWA sends
``gmm_classes``, and the number of mixture rows, in the clear), that a client takes part, the
client's model (never released in FD, but the audit shows what it memorises), and anything a rule
sends besides these (such rules are refused with DP on). Server-side processing of the noisy
release (aggregation, the teacher, what goes down) is post-processing and costs no privacy.

sigma = 0 turns the mechanism off: nothing is clipped or noised and epsilon is not reported.
Encodings (``encoding``) apply after the noise (post-processing): they send less, and by
themselves give no formal guarantee.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Literal, Optional, Sequence

import numpy as np
import torch

from fdlit.errors import ConfigError, check_number
from fdlit.privacy.encoding import ENCODINGS, decode, encode

ACCOUNTANTS = ("rdp", "prv")
DENSITY_KEYS = ("gmm_means", "gmm_stds")
STD_FLOOR = 1e-2  # noisy standard deviations are floored (post-processing): the density needs sigma > 0


def default_config() -> dict[str, Any]:
    """The ``privacy`` section with every knob at its default (as a parsed config holds it)."""
    import inspect

    return {name: par.default for name, par in inspect.signature(UploadPrivacy.__init__).parameters.items()
            if name != "self"}


def make_accountant(kind: str, history: Optional[list] = None):
    """An Opacus accountant, with ``history`` ((noise multiplier, sample rate, steps) entries) restored."""
    from opacus.accountants import PRVAccountant, RDPAccountant  # imported only when DP is on

    accountant = RDPAccountant() if kind == "rdp" else PRVAccountant()
    accountant.history = [tuple(h) for h in (history or [])]
    return accountant


def clip_rows(x: torch.Tensor, c: float) -> tuple[torch.Tensor, int]:
    """Rows scaled to L2 norm <= c, and how many were scaled."""
    norms = x.norm(dim=-1, keepdim=True)
    factor = (c / norms.clamp_min(1e-30)).clamp(max=1.0)
    return x * factor, int((factor < 1).sum())


class UploadPrivacy:
    """Differential privacy and encodings for client uploads (the mechanism in this module's docstring).

    Args:
        noise_multiplier: sigma >= 0; the noise std is sigma x the release's L2 sensitivity
            Delta = 2 c sqrt(rows). 0: no mechanism (nothing clipped or noised; epsilon not reported).
        clip_norm: c > 0, the L2 norm every released row (a public-set logit row, a UWA density
            row) is clipped to.
        delta: the delta of the reported (epsilon, delta), in (0, 1).
        epsilon_budget: stop the run cleanly, after the last round that stays within it, when the
            next round would raise epsilon above this (> 0); null: no budget.
        accountant: ``rdp`` (Opacus's RDPAccountant) or ``prv`` (Opacus's PRVAccountant).
        encoding: what a client's prediction travels as: ``full`` logits, ``hard`` class ids,
            ``top_k`` probabilities, ``quantised`` probabilities (fdlit.privacy.encoding).
        top_k: k of ``top_k``, in [1, C].
        bits: bits per probability of ``quantised``, in [1, 16].
        audit: at the last round, a loss-threshold membership-inference attack (Yeom et al. 2018)
            on every client model: ``privacy/mia_auc`` (mean) and ``privacy/mia_auc_clients``.
    """

    def __init__(
        self,
        noise_multiplier: float = 0.0,
        clip_norm: float = 1.0,
        delta: float = 1e-5,
        epsilon_budget: Optional[float] = None,
        accountant: Literal["rdp", "prv"] = "rdp",
        encoding: Literal["full", "hard", "top_k", "quantised"] = "full",
        top_k: int = 1,
        bits: int = 8,
        audit: bool = False,
    ):
        check_number("privacy.noise_multiplier", noise_multiplier, inclusive=True)
        check_number("privacy.clip_norm", clip_norm)
        if not (math.isfinite(delta) and 0 < delta < 1):
            raise ConfigError("privacy.delta", f"must be in (0, 1), got {delta}")
        if epsilon_budget is not None:
            check_number("privacy.epsilon_budget", epsilon_budget)
        if accountant not in ACCOUNTANTS:
            raise ConfigError("privacy.accountant", f"allowed: {', '.join(ACCOUNTANTS)}; got {accountant!r}")
        if encoding not in ENCODINGS:
            raise ConfigError("privacy.encoding", f"allowed: {', '.join(ENCODINGS)}; got {encoding!r}")
        if not 1 <= bits <= 16:
            raise ConfigError("privacy.bits", f"must be in [1, 16], got {bits}")
        if top_k < 1:
            raise ConfigError("privacy.top_k", f"must be in [1, C] (C: the number of classes), got {top_k}")
        if epsilon_budget is not None and noise_multiplier == 0:
            raise ConfigError("privacy.epsilon_budget", "needs privacy.noise_multiplier > 0 (without noise "
                              "epsilon is infinite)")
        self.noise_multiplier, self.clip_norm, self.delta = float(noise_multiplier), float(clip_norm), float(delta)
        self.epsilon_budget = epsilon_budget
        self.accountant_kind, self.encoding, self.top_k, self.bits = accountant, encoding, top_k, bits
        self.audit = bool(audit)
        self.history: list[tuple[float, float, int]] = []  # the accountant's (sigma, q, steps)

    @property
    def dp(self) -> bool:
        return self.noise_multiplier > 0

    @property
    def active(self) -> bool:
        """Whether uploads differ from fdlit's plain logits at all."""
        return self.dp or self.encoding != "full"

    # ------------------------------------------------------------------ checks (before any work)
    def check(self, aggregator, num_classes: int) -> None:
        """Refuse what the mechanism does not cover; called in set-up, before any training."""
        if self.encoding == "top_k" and not 1 <= self.top_k <= num_classes:
            raise ConfigError("privacy.top_k", f"must be in [1, {num_classes}] (the number of classes), "
                              f"got {self.top_k}")
        from fdlit.aggregators.base import Aggregator
        from fdlit.aggregators.uncertainty import UncertaintyWeightedAggregator

        name = type(aggregator).__name__
        uwa = isinstance(aggregator, UncertaintyWeightedAggregator)
        if self.dp:
            own_upload = type(aggregator).client_upload is not Aggregator.client_upload
            if aggregator.has_setup or (own_upload and not uwa):
                raise ConfigError("privacy.noise_multiplier", f"differential privacy covers the public logits and "
                                  f"UWA's density; {name} uploads more (set-up or extra messages), which would "
                                  "leave the mechanism; use a rule that uploads logits only (e.g. AVG) or UWA/sUWA")
            if uwa and aggregator.upload != "density":
                raise ConfigError("privacy.noise_multiplier", "with UWA/sUWA, differential privacy noises the "
                                  "uploaded density: set aggregator.upload: density")
        if self.encoding != "full" and uwa and aggregator.upload == "density":
            raise ConfigError("privacy.encoding", f"{self.encoding!r} sends no logits, so the server cannot "
                              "evaluate UWA's density on them; use aggregator.upload: scores (the client scores "
                              "its own logits) or privacy.encoding: full")

    # ------------------------------------------------------------------ the upload
    def noise(self, shape, r: int, client: int, seed: int, std: float, device) -> torch.Tensor:
        """Gaussian noise from a stream of its own per (seed, round, client): the same under every
        executor and after a resume, and no other random stream moves."""
        key = np.random.SeedSequence([seed, r, client, 0xD9]).generate_state(1, np.uint64)[0] >> 1
        g = torch.Generator().manual_seed(int(key))
        return (torch.randn(shape, generator=g, dtype=torch.float64) * std).to(device)

    def upload(self, r: int, payloads: list[dict[str, torch.Tensor]], dtype: torch.dtype, seed: int,
               num_classes: int, sample_rate: float, send: Callable[[int, int, dict], dict],
               clients: Optional[Sequence[int]] = None) -> tuple[list[dict[str, torch.Tensor]], dict[str, float]]:
        """Clip and noise (DP on), encode, send (``send(r, client, messages)``) and decode every
        client's payload; returns what the server's rule receives and this round's privacy metrics.
        ``clients``: the id of each payload's client (None: 0 … M-1, everyone uploads)."""
        ids = list(range(len(payloads))) if clients is None else list(clients)
        if not self.active:  # fdlit's plain upload, bit for bit
            return [send(r, ids[j], {**p, "logits": p["logits"].to(dtype)}) for j, p in enumerate(payloads)], {}
        uploads, clipped, rows, stds = [], 0, 0, []
        for i, payload in zip(ids, payloads):
            payload = dict(payload)
            logits = payload.pop("logits")
            if self.dp:
                logits, density, c, std = self._privatise(r, i, seed, logits, payload)
                payload.update(density)
                clipped, rows, stds = clipped + c, rows + len(logits), stds + [std]
            messages = encode(logits, self.encoding, dtype, self.top_k, self.bits)
            received = send(r, i, {**messages, **payload})
            decoded = decode(received, self.encoding, num_classes, len(logits), self.bits)
            uploads.append({k: v for k, v in received.items() if k not in messages} | {"logits": decoded})
        stats: dict[str, float] = {}
        if self.dp:
            self.history = self._stepped(sample_rate)
            stats = {"privacy/epsilon": self.epsilon(), "privacy/delta": self.delta,
                     "privacy/noise_multiplier": self.noise_multiplier, "privacy/clip_norm": self.clip_norm,
                     "privacy/sample_rate": float(sample_rate), "privacy/noise_std_mean": float(np.mean(stds)),
                     "privacy/clipped_fraction": clipped / max(rows, 1)}
        return uploads, stats

    def _privatise(self, r, i, seed, logits, payload):
        """Clip every released row to c; one Gaussian draw over the whole release (logits + density)."""
        parts = [logits.double()] + [payload[k].double() for k in DENSITY_KEYS if k in payload]
        release = torch.cat(parts)
        release, clipped = clip_rows(release, self.clip_norm)
        std = self.noise_multiplier * 2 * self.clip_norm * math.sqrt(len(release))  # sigma * Delta
        release = release + self.noise(release.shape, r, i, seed, std, release.device)
        out, start = [], 0
        for part in parts:
            out.append(release[start:start + len(part)])
            start += len(part)
        density = {}
        for k, noisy in zip([k for k in DENSITY_KEYS if k in payload], out[1:]):
            if k == "gmm_stds":  # a std must stay positive for the density to exist
                noisy = noisy.abs().clamp_min(STD_FLOOR)
            density[k] = noisy.to(payload[k].dtype)
        return out[0].float(), density, clipped, std

    # ------------------------------------------------------------------ accounting
    def _stepped(self, sample_rate: float) -> list[tuple[float, float, int]]:
        """The accountant's history with one more round (one Gaussian release per client)."""
        history = list(self.history)
        if history and history[-1][:2] == (self.noise_multiplier, float(sample_rate)):
            history[-1] = (self.noise_multiplier, float(sample_rate), history[-1][2] + 1)
        else:
            history.append((self.noise_multiplier, float(sample_rate), 1))
        return history

    def epsilon(self, history: Optional[list] = None) -> float:
        history = self.history if history is None else history
        if not history:
            return 0.0
        return float(make_accountant(self.accountant_kind, history).get_epsilon(self.delta))

    def over_budget(self, r: int, sample_rate: float) -> Optional[str]:
        """Why round r must not run (it would exceed the budget), or None."""
        if not self.dp or self.epsilon_budget is None:
            return None
        after = self.epsilon(self._stepped(sample_rate))
        if after <= self.epsilon_budget:
            return None
        return (f"privacy budget reached: round {r} would raise epsilon to {after:.4g} > privacy.epsilon_budget "
                f"{self.epsilon_budget:g} (delta {self.delta:g}); stopped after round {r - 1} at epsilon "
                f"{self.epsilon():.4g}")

    def state_dict(self) -> dict[str, Any]:
        return {"history": [list(h) for h in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = [tuple(h) for h in state.get("history", [])]

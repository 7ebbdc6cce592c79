"""The ``privacy`` section: differential privacy and encodings for what clients upload.

The Gaussian mechanism on uploads (client-level differential privacy)
----------------------------------------------------------------------
Every round, client i releases its public-set predictions Z_i (N x C logits) and whatever else its
method declares as released rows (``released``, fdlit.privacy.release: e.g. a density's mean and
standard-deviation rows). With noise multiplier sigma > 0 and clipping norm c:

    each released row r is clipped: r <- r * min(1, c / ||r||_2)
    local (default):  the client's whole release X_i (R rows) gets  X_i + N(0, (sigma * Delta)^2 I)
    central:          the clients' clipped rows are summed (secure aggregation) and the sum gets one
                      N(0, (sigma * Delta)^2 I); the rule receives the noisy mean
    Delta = 2 c sqrt(R)

**Privacy unit: the client's whole private data set.** A client's release is computed by a model
trained on its private data; changing one private record may change every row, and FD gives no
per-record bound without per-sample gradient clipping (DP-SGD), which this mechanism does not do.
So the neighbouring relation is "replace the client's data by any other data": any two clipped
releases differ by at most 2c per row, hence by Delta = 2c sqrt(R) in L2 over the release (and the
sum of the clients' releases changes by at most as much). With noise std sigma * Delta, one round is
the Gaussian mechanism with noise multiplier sigma for every client that took part; the rounds are
accounted in fdlit.privacy.accounting (no amplification by subsampling: the server sees who took
part).

The two threat models (``accounting``):

* ``local``: the server is not trusted with any client's upload; each client noises its own, and
  the server sees every noised upload with its sender. Any rule works; an averaged teacher over M
  clients carries noise of std sigma * Delta / sqrt(M).
* ``central`` (alias ``secure_aggregation``): the server sees only the sum of the clients' clipped
  uploads (secure aggregation) with noise added once (by a trusted party or distributed among the
  clients). Only rules whose teacher depends on the uploads through their mean (declared ``summed``)
  can use it; their teacher carries noise of std sigma * Delta / M, sqrt(M) times less at the same
  epsilon.

What is protected: the declared rows (the logits, hence probabilities, hard labels, top-k, ...). What
is not: keys declared ``clear`` (sent as they are), that a client takes part, the client's model
(never released in FD, but the audit shows what it memorises), and set-up messages (methods with a
set-up stage, or with keys declared ``unbounded``, are refused with DP on). Server-side processing of
the noisy release (aggregation, the teacher, what goes down) is post-processing and costs no privacy.

Where it runs: clipping, local noise and the encoding happen on the client, where it lives (in process,
a Ray actor, a Flower node: fdlit.privacy.client_release), so raw logits never leave a client when this
section is on; the server decodes, adds the secure sum's noise (central) and keeps the accountant.
Secure aggregation (fdlit.privacy.secure_upload) masks each client's terms of a rule that is a sum; in
``fit`` its clients' half runs in the server's process, on each client's release; in ``deploy`` on the
nodes (fdlit.deployment.secure_rounds), so no upload reaches the server. Either way the rule is given
only the unmasked sum.

sigma = 0 turns the mechanism off: nothing is clipped or noised and epsilon is not reported.
Encodings (``encoding``) apply after the noise (post-processing): they send less, and by
themselves give no formal guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch

from fdlit.errors import ConfigError, check_choice, check_number
from fdlit.extras import require
from fdlit.messages import as_message
from fdlit.privacy.accounting import ClientAccountant, make_accountant
from fdlit.privacy.client_release import DIAGNOSTICS, ClientRelease, clip_rows
from fdlit.privacy.encoding import ENCODINGS, MESSAGE_KEYS, decode
from fdlit.privacy.receive import UploadRound
from fdlit.privacy.release import NOISED, POSITIVE_ROWS, ROWS, UNBOUNDED, Declaring, Release
from fdlit.privacy.secure_round import central_mean, masked_round, noisy_rows
from fdlit.privacy.secure_upload import SecureSums, maskable

ACCOUNTANTS = ("rdp", "prv")
ACCOUNTINGS = ("local", "central", "secure_aggregation")  # secure_aggregation: another name for central
LOG_FLOOR = 1e-12  # a noisy mean probability is floored before its log (post-processing)

__all__ = ["ACCOUNTANTS", "ACCOUNTINGS", "UploadPrivacy", "clip_rows", "default_config", "make_accountant"]


def default_config() -> dict[str, Any]:
    """The ``privacy`` section with every knob at its default (as a parsed config holds it)."""
    import inspect

    return {name: par.default for name, par in inspect.signature(UploadPrivacy.__init__).parameters.items()
            if name != "self"}


class UploadPrivacy:
    """Differential privacy and encodings for client uploads (the mechanism in this module's docstring).

    Args:
        noise_multiplier: sigma >= 0; the noise std is sigma x the release's L2 sensitivity
            Delta = 2 c sqrt(rows). 0: no mechanism (nothing clipped or noised; epsilon not reported).
        clip_norm: c > 0, the L2 norm every released row (a public-set logit row, a declared row of
            the method's) is clipped to.
        delta: the delta of the reported (epsilon, delta), in (0, 1).
        epsilon_budget: stop the run cleanly, after the last round that stays within it, when the
            next round could raise epsilon above this (> 0); null: no budget.
        accountant: ``rdp`` (Opacus's RDPAccountant) or ``prv`` (Opacus's PRVAccountant), for the
            per-client composition (fdlit.privacy.accounting).
        accounting: the threat model: ``local`` (each client noises its own upload; the server sees
            each) or ``central`` / ``secure_aggregation`` (the server sees only the noisy sum; rules
            whose teacher is a function of the clients' mean only).
        encoding: what a client's prediction travels as: ``full`` logits, ``hard`` class ids,
            ``top_k`` probabilities, ``quantised`` probabilities (fdlit.privacy.encoding).
        top_k: k of ``top_k``, in [1, C]; another value than 1 needs ``encoding: top_k``.
        bits: bits per probability of ``quantised``, in [1, 16]; another value than 8 needs
            ``encoding: quantised``.
        audit: at the last round, a loss-threshold membership-inference attack (Yeom et al. 2018)
            on every client model: ``privacy/mia_auc`` (mean) and ``clients/privacy/mia_auc``.
        secure_aggregation: mask the uploads pairwise (Bonawitz et al. 2017; fdlit.privacy.secure_sum) so
            the server's rule receives only their sum; for rules that are sums of per-client terms
            (fdlit.privacy.secure_upload), others are refused. null: on exactly when ``accounting`` is
            ``central`` (whose guarantee assumes it); false with ``central`` is refused.
        secure_threshold: the Shamir threshold t of secure aggregation as a fraction of the round's
            sampled clients, in (0, 1]: t = max(2, ceil(fraction x clients)); fewer than t parties (the
            server included) learn nothing of a client's secrets, and a round in which fewer than t
            clients survive has no aggregate (no teacher).
        upload_audit: every round, attacks on what the clients upload (fdlit.privacy.upload_audit):
            label-distribution inference from each client's public-set predictions, and membership
            inference from its predictions with the other clients as shadow models.
    """

    def __init__(
        self,
        noise_multiplier: float = 0.0,
        clip_norm: float = 1.0,
        delta: float = 1e-5,
        epsilon_budget: float | None = None,
        accountant: Literal["rdp", "prv"] = "rdp",
        accounting: Literal["local", "central", "secure_aggregation"] = "local",
        encoding: Literal["full", "hard", "top_k", "quantised"] = "full",
        top_k: int = 1,
        bits: int = 8,
        audit: bool = False,
        secure_aggregation: bool | None = None,
        secure_threshold: float = 0.5,
        upload_audit: bool = False,
    ):
        check_number("privacy.noise_multiplier", noise_multiplier, inclusive=True)
        check_number("privacy.clip_norm", clip_norm)
        if not (math.isfinite(delta) and 0 < delta < 1):
            raise ConfigError("privacy.delta", f"must be in (0, 1), got {delta}")
        if epsilon_budget is not None:
            check_number("privacy.epsilon_budget", epsilon_budget)
        check_choice("privacy.accountant", accountant, ACCOUNTANTS)
        check_choice("privacy.accounting", accounting, ACCOUNTINGS)
        check_choice("privacy.encoding", encoding, ENCODINGS)
        if not 1 <= bits <= 16:
            raise ConfigError("privacy.bits", f"must be in [1, 16], got {bits}")
        if top_k < 1:
            raise ConfigError("privacy.top_k", f"must be in [1, C] (C: the number of classes), got {top_k}")
        # a knob of another encoding changes nothing: refused rather than ignored (1 and 8: the defaults)
        if top_k != 1 and encoding != "top_k":
            raise ConfigError("privacy.top_k", f"applies to privacy.encoding top_k only, and privacy.encoding is "
                              f"{encoding!r}, where it does nothing; allowed: privacy.encoding top_k with "
                              f"privacy.top_k {top_k}, or leave privacy.top_k at 1")
        if bits != 8 and encoding != "quantised":
            raise ConfigError("privacy.bits", f"applies to privacy.encoding quantised only, and privacy.encoding is "
                              f"{encoding!r}, where it does nothing; allowed: privacy.encoding quantised with "
                              f"privacy.bits {bits}, or leave privacy.bits at 8")
        if epsilon_budget is not None and noise_multiplier == 0:
            raise ConfigError("privacy.epsilon_budget", "needs privacy.noise_multiplier > 0 (without noise "
                              "epsilon is infinite)")
        self.noise_multiplier, self.clip_norm, self.delta = float(noise_multiplier), float(clip_norm), float(delta)
        self.epsilon_budget = epsilon_budget
        self.accountant_kind, self.encoding, self.top_k, self.bits = accountant, encoding, top_k, bits
        self.central = accounting != "local"
        if secure_aggregation is False and self.central:
            raise ConfigError("privacy.secure_aggregation", f"privacy.accounting {accounting!r} assumes the server "
                              "sees only the sum of the uploads, which secure aggregation provides; leave "
                              "privacy.secure_aggregation on (true or null) or use privacy.accounting: local")
        self.secure = bool(secure_aggregation) or self.central
        if not (math.isfinite(secure_threshold) and 0 < secure_threshold <= 1):
            raise ConfigError("privacy.secure_threshold", f"must be in (0, 1], got {secure_threshold}")
        if secure_threshold != 0.5 and not self.secure:
            raise ConfigError("privacy.secure_threshold", "applies to secure aggregation only; set "
                              "privacy.secure_aggregation: true, or leave privacy.secure_threshold at 0.5")
        self.secure_threshold = float(secure_threshold)
        if self.dp:  # the accountants (RDP, PRV) are opacus's
            require("opacus", "privacy.noise_multiplier")
        if self.secure:  # key agreement, key derivation and the mask stream are cryptography's
            require("cryptography", "privacy.secure_aggregation")
        self.audit, self.upload_audit = bool(audit), bool(upload_audit)
        self.summands = self.method = None  # the method and its client-side terms of the secure sum (``check``)
        self.release = Release()  # the method's declaration (check() reads it); by default the logits alone
        self.accountant = ClientAccountant(accountant, self.delta)

    @property
    def dp(self) -> bool:
        return self.noise_multiplier > 0

    @property
    def active(self) -> bool:
        """Whether uploads differ from fdlit's plain logits at all."""
        return self.dp or self.encoding != "full" or self.secure

    @property
    def history(self) -> list[tuple[float, float, int]]:
        """The rounds so far as (sigma, q, rounds) entries."""
        return self.accountant.rounds

    # ------------------------------------------------------------------ checks (before any work)
    def check(self, method: Declaring, num_classes: int) -> None:
        """Refuse what the mechanism does not cover, from the method's declaration
        (fdlit.privacy.release); called in set-up, before any training."""
        if self.encoding == "top_k" and not 1 <= self.top_k <= num_classes:
            raise ConfigError("privacy.top_k", f"must be in [1, {num_classes}] (the number of classes), "
                              f"got {self.top_k}")
        release = self.release = Release(method)
        name = release.name
        if self.dp:
            field = "privacy.noise_multiplier"
            if method.has_setup:
                raise ConfigError(field, release.refusal(
                    f"differential privacy covers the rows a method declares it releases; {name} has a set-up "
                    "stage whose messages would leave the mechanism; use a method that uploads logits only or "
                    "declared rows"))
            if release.undeclared_upload:
                raise ConfigError(field, f"{name}'s client part uploads more than the logits without declaring what it releases "
                                  "(a ``released`` attribute in the same class), so the mechanism cannot know "
                                  "what it covers; declare every upload key's kind (fdlit.privacy.release)")
            if unbounded := release.keys(UNBOUNDED):
                raise ConfigError(field, release.refusal(
                    f"{name} releases {', '.join(map(repr, unbounded))} without a sensitivity bound (declared "
                    f"{UNBOUNDED!r}), which the Gaussian mechanism cannot cover"))
            if not release.keys(*NOISED):
                raise ConfigError(field, release.refusal(
                    f"{name} declares no upload the mechanism can privatise (no {ROWS!r} or {POSITIVE_ROWS!r} "
                    f"kind among {', '.join(map(repr, release.released)) or 'none'})"))
        if self.encoding != "full" and "logits" not in release.released:  # parameters, prototypes: nothing to encode
            raise ConfigError("privacy.encoding", f"{self.encoding!r} encodes the public logits, which {name} "
                              "does not upload; allowed: full")
        if self.encoding != "full" and release.evaluates_logits:
            raise ConfigError("privacy.encoding", release.refusal(
                f"{self.encoding!r} sends no logits, and {name} evaluates the uploaded logits themselves"))
        if self.dp and self.central:
            why = None
            if release.summed is None or release.undeclared_teacher:
                why = (f"{name} combines the uploads non-linearly (it declares no ``summed`` quantity whose mean "
                       "is all its teacher needs), so each upload must carry its own noise")
            elif set(release.released) != {"logits"}:
                others = sorted(set(release.released) - {"logits"})
                why = f"{name} uploads more than the summed logits ({', '.join(others)}), which a sum would not carry"
            elif self.encoding != "full":
                why = (f"privacy.encoding {self.encoding!r} encodes one client's prediction, and secure aggregation "
                       "releases only the sum (set privacy.encoding: full)")
            if why:
                raise ConfigError("privacy.accounting", "central noise goes once on the sum of the clients' "
                                  f"clipped uploads (secure aggregation); {why}; use privacy.accounting: local")
        elif self.secure:
            why = maskable(method)
            if why is None and self.encoding != "full":
                why = (f"privacy.encoding {self.encoding!r} encodes one client's prediction, and secure aggregation "
                       "sends only the masked sum (set privacy.encoding: full)")
            if why is None and method.has_setup and not method.secure_setup:
                why = f"{name} has a set-up stage whose messages would go unmasked"
            if why:
                raise ConfigError("privacy.secure_aggregation", "secure aggregation gives the server only the sum "
                                  f"of the clients' masked uploads; {why}; use a rule whose teacher is a sum of "
                                  "per-client terms (docs/privacy.md lists them) or set "
                                  "privacy.secure_aggregation: false")
            self.summands, self.method = method.secure_summands, method

    # ------------------------------------------------------------------ the upload
    def client_release(self, dtype: torch.dtype, seed: int) -> ClientRelease:
        """The client's side of the mechanism (fdlit.privacy.client_release), for the method declared
        in ``check``: executors apply it where each client lives."""
        release = self.release
        return ClientRelease(dtype=dtype, seed=seed, noise_multiplier=self.noise_multiplier, clip_norm=self.clip_norm,
                             central=self.central, summed=release.summed, encoding=self.encoding, top_k=self.top_k,
                             bits=self.bits, method=release.name, released=dict(release.released))

    def receive(self, at: UploadRound, messages: list[dict[str, torch.Tensor]]
                ) -> tuple[list[dict[str, torch.Tensor]] | SecureSums | None, dict[str, float]]:
        """The server's side: count (``at.send``) and decode what each client released
        (``ClientRelease``), add the secure sum's noise (central), account the round; returns what the
        server's rule receives and this round's privacy metrics (``at``: the round, fdlit.privacy.receive).
        Under secure aggregation the rule receives ``SecureSums`` (None: too few clients survived to
        unmask); ``at.masking`` (a deployment's nodes) leaves ``messages`` without arrays."""
        r, ids, send, seed, sample_rate = at.round, list(at.clients), at.send, at.seed, at.sample_rate
        num_classes, num_rows, sampled, masking = at.num_classes, at.num_rows, at.sampled, at.masking
        if not self.active:  # fdlit's plain upload, bit for bit
            return [send(r, i, m) for i, m in zip(ids, messages, strict=True)], {}
        messages = [as_message(m) for m in messages]
        diagnostics = [tuple(m.metrics[k] for k in DIAGNOSTICS) if DIAGNOSTICS[0] in m.metrics else None
                       for m in messages]
        counter = self._counter(send, at.send_down)
        u1 = ids if sampled is None else sampled
        secure_stats: dict[str, float] = {}
        sigma = self.noise_multiplier
        if self.dp and self.central:  # distributed noise inside the masked sum (fdlit.privacy.secure_round)
            uploads, std, secure_stats = central_mean(self, r, u1, ids, messages, counter, masking, seed)
            stds = [std]
            sigma = secure_stats.get("privacy/noise_multiplier_effective", sigma)
        elif self.secure:  # each client's terms, masked where it lives (fit: simulated here), summed
            uploads, secure_stats = masked_round(self, r, u1, ids, messages, counter, masking, seed)
            stds = [float(d[2]) for d in diagnostics if d is not None]
        else:
            uploads, stds = [], [float(d[2]) for d in diagnostics if d is not None]
            keys = MESSAGE_KEYS[self.encoding]
            for i, message in zip(ids, messages, strict=True):
                received = as_message(send(r, i, message))
                if not any(k in received for k in keys):  # a method that sends no public logits
                    uploads.append(received)
                    continue
                decoded = decode(received, self.encoding, num_classes, num_rows, self.bits)
                uploads.append(received.with_arrays({k: v for k, v in received.items() if k not in keys}
                                                    | {"logits": decoded}))
        stats: dict[str, float] = dict(secure_stats)
        if self.dp and (uploads is not None or not self.central):  # a central round without a sum released nothing
            clipped = sum(float(d[0]) for d in diagnostics if d is not None)
            rows = sum(float(d[1]) for d in diagnostics if d is not None)
            self.accountant.step(sigma, sample_rate, ids)
            stats |= {"privacy/epsilon": self.epsilon(), "privacy/delta": self.delta,
                     "privacy/noise_multiplier": self.noise_multiplier, "privacy/clip_norm": self.clip_norm,
                     "privacy/sample_rate": float(sample_rate),
                     "privacy/noise_std_mean": float(np.mean(stds)) if stds else 0.0,
                     "privacy/clipped_fraction": clipped / max(rows, 1)}
            if sample_rate < 1:
                stats["privacy/epsilon_sampled"] = self.accountant.epsilon_sampled()
        return uploads, stats

    def upload(self, r: int, payloads: list[dict[str, torch.Tensor]], dtype: torch.dtype, seed: int,
               num_classes: int, sample_rate: float, send: Callable[[int, int, dict], dict],
               clients: Sequence[int] | None = None) -> tuple[list[dict[str, torch.Tensor]], dict[str, float]]:
        """Both sides in one process: every client's ``payload`` released (``client_release``), then
        received (``receive``); ``clients``: each payload's client id (None: 0 … M-1)."""
        ids = list(range(len(payloads))) if clients is None else list(clients)
        release = self.client_release(dtype, seed)
        messages = [release(r, i, p) for i, p in zip(ids, payloads, strict=True)]
        rows = len(payloads[0]["logits"]) if payloads else 0
        return self.receive(UploadRound(r, ids, num_classes, rows, sample_rate, send, seed), messages)

    @staticmethod
    def _counter(send, send_down):
        """``count(r, client, direction, kind, tensor)`` over the server's two ledger calls."""
        def count(r, client, direction, kind, tensor):
            if direction == "up":
                send(r, client, {kind: tensor})
            elif send_down is not None:
                send_down(r, client, {kind: tensor})
        return count

    @property
    def secure_levels(self) -> int:
        """Levels of the first masked exchange the method's terms read (0: none; central DP: none)."""
        return 0 if (self.dp and self.central) or self.method is None else int(self.method.secure_levels)

    def secure_level(self, message, client: int) -> torch.Tensor:
        return self.method.secure_level(message, client)

    def secure_terms(self, message, client: int, r: int = 0, clients: int = 1, seed: int = 0, maximum=None
                     ) -> dict[str, tuple]:
        """A client's terms of the secure sum from its release (``check`` chose them), where the client
        lives: under central DP its clipped rows with its share of the noise (``clients``: n, the
        clients of the key exchange; fdlit.privacy.secure_round), else the method's ``secure_summands``
        (with the first exchange's ``maximum`` where the method declares levels)."""
        if self.dp and self.central:
            return noisy_rows(message["logits"], r, client, seed, self.noise_multiplier, self.clip_norm, clients)
        if self.secure_levels:
            return self.summands(message, client, maximum=maximum.maximum)
        return self.summands(message, client)

    # ------------------------------------------------------------------ accounting
    def epsilon(self) -> float:
        """The largest per-client epsilon so far (fdlit.privacy.accounting)."""
        return self.accountant.epsilon()

    def over_budget(self, r: int, sample_rate: float) -> str | None:
        """Why round r must not run (it could exceed the budget: every client might take part, and under
        central noise only the fewest survivors that still unmask, t >= fraction n, add their shares), or None."""
        if not self.dp or self.epsilon_budget is None:
            return None
        least = self.noise_multiplier * (math.sqrt(self.secure_threshold) if self.central else 1.0)
        after = self.accountant.epsilon_after_next(least)
        if after <= self.epsilon_budget:
            return None
        return (f"privacy budget reached: round {r} would raise epsilon to {after:.4g} > privacy.epsilon_budget "
                f"{self.epsilon_budget:g} (delta {self.delta:g}); stopped after round {r - 1} at epsilon "
                f"{self.epsilon():.4g}")

    def state_dict(self) -> dict[str, Any]:
        return self.accountant.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accountant.load_state_dict(state)

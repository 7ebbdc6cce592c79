"""Uncertainty-weighted averaging (UWA) and its smoothed form (sUWA)."""

from __future__ import annotations

import math
import warnings
from typing import Literal

import torch

from fdlit.errors import ConfigError, check_at_least, check_number
from fdlit.messages import Message, metric_values
from fdlit.methods.base import AggregationResult, Aggregator, ClientPart
from fdlit.methods.density import DENSITY_METHODS, DiagonalGaussianMixture, mixture_log_likelihood
from fdlit.privacy import secure_softmax
from fdlit.privacy.client_release import FLOOR as NOISY_STD_FLOOR
from fdlit.privacy.secure_upload import LOGIT_BOUND, probability_rows

MIXES = ("probabilities", "logits")  # what UWA's weights average (``mix``)


class DensityFitClient(ClientPart):
    """UWA's client part: the class-conditional Gaussian mixture of its logits, fitted on its
    calibration split, sent as the mixture (``send: density``) or its log-likelihoods on the public
    set (``scores``). The other arguments are UWA's of the same names."""

    def __init__(self, send: str, variance_floor: float, min_calibration_samples: int, density_method: str,
                 robust: bool, shrinkage_samples: int):
        self.send, self.variance_floor, self.min_calibration_samples = send, variance_floor, min_calibration_samples
        self.density_method, self.robust, self.shrinkage_samples = density_method, robust, shrinkage_samples

    def upload(self, ctx):
        cal = ctx.data.calibration
        cal_logits = ctx.client.predict_logits(cal.x.to(ctx.public_logits.device))
        gmm = DiagonalGaussianMixture.fit(
            cal_logits, cal.y.to(cal_logits.device), ctx.client.classes,
            self.variance_floor, self.min_calibration_samples,
            robust=self.robust, shrinkage_samples=self.shrinkage_samples,
        )
        diagnostics = {  # degenerate fits, reported for the run's log (not part of the protocol)
            "density/dropped_components": float(gmm.dropped),
            "density/floored_variances": float(gmm.floored),
            "density/degenerate_components": float(gmm.degenerate),
            "density/shrunk_components": float(gmm.shrunk),
            "density/collapsed_clients": float(int(gmm.collapsed)),
        }
        if self.send == "scores":
            return Message({"log_likelihood": gmm.log_likelihood(ctx.public_logits, self.density_method).float()},
                           metrics=diagnostics)
        return Message({
            "gmm_means": gmm.means.float(),
            "gmm_stds": gmm.variances.sqrt().float(),
            "gmm_classes": gmm.classes.to(torch.int16),
        }, metrics=diagnostics)


class UncertaintyWeighted(Aggregator):
    """UWA (Kovalchuk et al., *Who to Trust?*, arXiv 2509.15147, Sec. 4.4 and App. A.4).

    After its private phase, client i fits a diagonal Gaussian per local class k in C_i on its
    calibration logits z_i(x) = f_i(x) (mean mu_ik, std sigma_ik per logit dimension, equal weights):

        l_i(x) = log( (1/|C_i|) sum_{k in C_i} N(z_i(x); mu_ik, diag sigma_ik^2) )
        W[i, x] = softmax_i( tau * l_i(x) ),   P(x) = sum_i W[i, x] softmax(z_i(x))

    with tau = 1 for UWA. ``mix`` says what the weights average:

      - ``probabilities`` (default): P(x) = sum_i W[i, x] softmax(z_i(x)), the probability mixture of
        Kovalchuk et al. 2026 (Definition 3.1, Sec. 4.4);
      - ``logits``: P(x) = softmax( sum_i W[i, x] z_i(x) ), the workshop paper's Eq. 7 (Kovalchuk et
        al. 2025, Sec. 3.1.3: "the final aggregated logits are then a confidence-weighted average").
        With uniform weights (tau = 0) this is logit averaging.

    When a class gets no component (too few calibration samples, or ``robust`` below), the mixture
    is renormalised over the K components that exist: weights 1/K instead of 1/|C_i|, so l_i stays a
    log-density. A client with no component has l_i = -inf: weight 0.

    UWA has no ``tau`` argument on purpose: switching a config from sUWA to UWA with
    ``--aggregator ...UncertaintyWeighted`` must not carry sUWA's tau along.
    :class:`SmoothedUncertaintyWeighted` adds tau (0 is AVG; infinity gives all weight to
    the client with the highest l_i(x)).

    Args:
        upload: what a client sends besides its logits. ``density`` (Kovalchuk et al. 2026, Algorithm 1,
            line 7: the GMM itself, 2*|C_i|*C numbers; the server evaluates l_i) or ``scores`` (l_i on
            the public set, N numbers, computed on the client).
        variance_floor: lower bound on every sigma^2.
        min_calibration_samples: a class with fewer calibration samples gets no component (>= 2).
        density_method: how l_i is computed: ``matmul`` (the Mahalanobis term as two float64 matrix
            products on centred logits; within 1e-9 (1 + |l|) of ``direct``, ~20x faster on a CPU)
            or ``direct`` (elementwise float64, the reference form); see
            :func:`~fdlit.methods.density.mixture_log_likelihood`.
        mix: ``probabilities`` or ``logits`` (see above).
        robust: repair degenerate density fits (default True; False is the paper's rule as written).
            A client whose logits do not move (a collapsed model, e.g. identical rows) would get a
            density bounded only by the floor, peaking on every public sample, and take all the weight
            (UWA and sUWA tau = 0.25 alike). With ``robust`` a collapsed client gets no component
            (weight 0), a zero-spread class takes the client's pooled within-class variance, and a
            class fitted on few samples is shrunk toward it (:meth:`DiagonalGaussianMixture.fit`).
            Fits where every class spreads and has >= ``shrinkage_samples`` samples are unchanged.
            Counted per round in ``density/collapsed_clients``, ``density/degenerate_components``,
            ``density/shrunk_components`` (with ``density/floored_variances``, the variance entries
            still at the floor); the first round with any of the first three warns once.
        shrinkage_samples: nu, the pseudo-samples of that shrinkage, and the sample count below which
            a class is shrunk (>= 0; 0: no shrinkage).

    Numerics: float64, log space, logsumexp over components and softmax over clients; a sample for
    which every client has l = -inf (no components) falls back to uniform weights.
    """

    short_name = "uwa"
    label = "UWA"  # how tables and figures name the method

    def __init__(
        self,
        upload: Literal["density", "scores"] = "density",
        variance_floor: float = 1e-4,
        min_calibration_samples: int = 2,
        density_method: Literal["matmul", "direct"] = "matmul",
        mix: Literal["probabilities", "logits"] = "probabilities",
        robust: bool = True,
        shrinkage_samples: int = 10,
    ):
        if upload not in ("density", "scores"):
            raise ConfigError("aggregator.upload", f"allowed: 'density', 'scores'; got {upload!r}")
        if not variance_floor > 0:
            raise ConfigError("aggregator.variance_floor", f"must be > 0, got {variance_floor}")
        check_at_least("aggregator.min_calibration_samples", min_calibration_samples, 2)
        if density_method not in DENSITY_METHODS:
            raise ConfigError("aggregator.density_method",
                              f"allowed: {', '.join(DENSITY_METHODS)}; got {density_method!r}")
        self.density_method = density_method
        if mix not in MIXES:
            raise ConfigError("aggregator.mix", f"allowed: {', '.join(repr(m) for m in MIXES)}; got {mix!r}")
        self.tau = 1.0
        check_at_least("aggregator.shrinkage_samples", shrinkage_samples, 0)
        self.mixing = mix  # not ``self.mix``: that is Aggregator.mix, the probability mixture
        self.robust = bool(robust)
        self.shrinkage_samples = shrinkage_samples
        self._warned = False
        self.upload = upload
        self.variance_floor = variance_floor
        self.min_calibration_samples = min_calibration_samples

    @property
    def released(self) -> dict[str, str]:
        """The density's mean and std rows are clipped and noised with the logits; its label set goes in
        the clear; the scores (log-likelihoods) have no sensitivity bound."""
        if self.upload == "scores":
            return {"logits": "rows", "log_likelihood": "unbounded"}
        return {"logits": "rows", "gmm_means": "rows", "gmm_stds": "positive_rows", "gmm_classes": "clear"}

    @property
    def evaluates_logits(self) -> bool:
        return self.upload == "density"  # the server evaluates the density on the uploaded logits

    @property
    def privacy_advice(self) -> str:
        if self.upload == "scores":
            return "set aggregator.upload: density (its rows are clipped and noised with the logits)"
        return "set aggregator.upload: scores (the client scores its own logits) or privacy.encoding: full"

    def client_part(self) -> ClientPart:
        return DensityFitClient(self.upload, self.variance_floor, self.min_calibration_samples, self.density_method,
                                self.robust, self.shrinkage_samples)

    def log_likelihoods(self, uploads, z: torch.Tensor) -> torch.Tensor:
        """l_i(x) for every client: M x N (float64)."""
        if "log_likelihood" in uploads[0]:
            return torch.stack([u["log_likelihood"].double() for u in uploads])
        k_max = max(len(u["gmm_means"]) for u in uploads)
        m, _, c = z.shape
        means = torch.zeros(m, k_max, c, dtype=torch.float64, device=z.device)
        variances = torch.ones(m, k_max, c, dtype=torch.float64, device=z.device)
        valid = torch.zeros(m, k_max, dtype=torch.bool, device=z.device)
        for i, u in enumerate(uploads):
            k = len(u["gmm_means"])
            means[i, :k] = u["gmm_means"].double()
            variances[i, :k] = u["gmm_stds"].double().pow(2)
            valid[i, :k] = True
        return mixture_log_likelihood(z, means, variances, valid, self.density_method)

    def aggregate(self, uploads, ctx):
        z = self.stack_logits(uploads)
        ll = self.log_likelihoods(uploads, z)
        scaled = self.tau * ll if self.tau > 0 else torch.zeros_like(ll)  # tau = 0: AVG, even where l = -inf
        hopeless = torch.isneginf(scaled).all(0)  # no client has a density here: uniform
        scaled = torch.where(hopeless[None], torch.zeros_like(scaled), scaled)
        weights = torch.softmax(scaled, dim=0).float()
        if self.mixing == "logits":  # the workshop paper's Eq. 7: softmax of the weighted logits
            teacher = torch.einsum("mn,mnc->nc", weights, z).softmax(-1)
        else:
            teacher = self.mix(weights, z.softmax(-1))
        finite = ll[torch.isfinite(ll)]

        def total(name):
            return float(sum(metric_values(uploads, name)))

        stats = {
            "density/dropped_components": total("density/dropped_components"),
            "density/floored_variances": total("density/floored_variances"),
            "density/collapsed_clients": total("density/collapsed_clients"),
            "density/degenerate_components": total("density/degenerate_components"),
            "density/shrunk_components": total("density/shrunk_components"),
            "density/uniform_fallback_samples": float(hopeless.sum()),
            "density/log_likelihood_mean": float(finite.mean()) if finite.numel() else float("nan"),
        }
        self._warn_once(stats)
        return AggregationResult(teacher=teacher, weights=weights, stats=stats)

    # ------------------------------------------------------------------ secure aggregation
    def log_density_bound(self, num_classes: int) -> float:
        """U >= l_i(x): a mixture's density is at most its narrowest component's peak, and every variance
        is at least the floor (or the floor of noisy standard deviations, fdlit.privacy.client_release)."""
        return -0.5 * num_classes * math.log(2 * math.pi * min(self.variance_floor, NOISY_STD_FLOOR**2))

    @property
    def secure_levels(self) -> int:
        """Levels of the shift exchange (fdlit.privacy.secure_softmax: K bins and the overflow level);
        0 at tau = 0, where every weight is 1."""
        return secure_softmax.LEVELS + 1 if self.tau > 0 else 0

    def _scores(self, upload) -> tuple[torch.Tensor, torch.Tensor, float, float]:
        """y_i = tau l_i(x), its bound tau U, the mixed quantity q_i and its encoding's bound."""
        z = upload["logits"].float()
        y = self.tau * self.log_likelihoods([upload], z[None])[0].double()
        q, bound = (z, LOGIT_BOUND) if self.mixing == "logits" else (z.softmax(-1), 1.0)
        return y, q, self.tau * self.log_density_bound(z.shape[-1]), bound

    def secure_level(self, upload, client):
        """Client i's level of its scaled log-density per sample (the shift exchange's first step)."""
        y, q, top, bound = self._scores(upload)
        return secure_softmax.level_of(y, top, overflow=(q.abs() > bound).any(-1))

    def secure_summands(self, upload, client, maximum=None):
        """Client i's terms of the secure sum (fdlit.privacy.secure_upload), from its own upload and the
        per-sample maximum level of the shift exchange: w_i(x) = exp(tau l_i(x) - S(x)) in [0, 1] and
        w_i q_i, in wide fixed point (fdlit.privacy.secure_softmax); q_i is the probabilities or, with
        ``mix: logits``, the logits. At tau = 0 every weight is 1 (AVG, even where l = -inf)."""
        if self.tau > 0:
            y, q, top, bound = self._scores(upload)
            w = secure_softmax.weights(y, maximum, top)
        else:
            z = upload["logits"].float()
            q, bound = (z, LOGIT_BOUND) if self.mixing == "logits" else (z.softmax(-1), 1.0)
            w = torch.ones(len(z), dtype=torch.float64, device=z.device)
        limbs = secure_softmax.LIMBS
        return {"weight": (w, 1.0, limbs), "weighted": (w[:, None] * q.double(), bound, limbs)}

    def aggregate_sums(self, sums, ctx):
        """The teacher from the sums alone: sum_i w_i q_i / sum_i w_i, the softmax over clients of
        tau l_i shifted per sample; the run stops where a sample cannot be served exactly."""
        s = sums.sums
        weight = s["weight"].double()
        if sums.maximum is not None:
            secure_softmax.check_served(sums.maximum, weight, sums.error["weight"] + sums.error["weighted"],
                                        type(self).__name__, ctx.info.round if ctx is not None else 0)
        q = s["weighted"] / weight.clamp_min(1e-300)[:, None]
        teacher = q.softmax(-1).float() if self.mixing == "logits" else probability_rows(q)
        hopeless = (sums.maximum < 0).sum() if sums.maximum is not None else 0
        return AggregationResult(teacher=teacher, stats={"density/uniform_fallback_samples": float(hopeless)})

    def _warn_once(self, stats: dict[str, float]) -> None:
        """One warning per aggregator the first time a density fit was repaired (the counts go to
        the metrics every round)."""
        found = {k.split("/")[1]: int(v) for k, v in stats.items()
                 if k in ("density/collapsed_clients", "density/degenerate_components", "density/shrunk_components")
                 and v > 0}
        if found and not self._warned:
            self._warned = True
            what = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in found.items())
            warnings.warn(f"{type(self).__name__}: degenerate density fits this round ({what}); repaired as "
                          "aggregator.robust says (collapsed clients get weight 0). Counted every round in "
                          "density/* metrics; this warning is not repeated.", RuntimeWarning, stacklevel=3)


class SmoothedUncertaintyWeighted(UncertaintyWeighted):
    """sUWA (Kovalchuk et al. 2026, Sec. 4.4, "Smoothed UWA"): W[i, x] = softmax_i(tau * l_i(x)),
    paper default tau = 0.25.

    Lower tau lowers the weight concentration chi (more variance reduction) at the price of more
    bias from uninformed clients. tau is fdlit's main sweep knob (``--aggregator.tau``).
    """

    short_name = "suwa"
    label = "sUWA"  # how tables and figures name the method

    def __init__(
        self,
        tau: float = 0.25,
        upload: Literal["density", "scores"] = "density",
        variance_floor: float = 1e-4,
        min_calibration_samples: int = 2,
        density_method: Literal["matmul", "direct"] = "matmul",
        mix: Literal["probabilities", "logits"] = "probabilities",
        robust: bool = True,
        shrinkage_samples: int = 10,
    ):
        """The remaining arguments are UWA's.

        Args:
            tau: the temperature on the log-likelihoods (finite, >= 0); 0 is plain averaging; as tau
                grows, all weight goes to the client with the highest log-likelihood; 1 is UWA.
        """
        check_number("aggregator.tau", tau, inclusive=True)
        super().__init__(upload=upload, variance_floor=variance_floor, min_calibration_samples=min_calibration_samples,
                         density_method=density_method, mix=mix, robust=robust, shrinkage_samples=shrinkage_samples)
        self.tau = tau

"""F2L's hierarchy in federated distillation: regions, LKD within a region, aggregation across regions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from fdlit.errors import ConfigError, check_at_least
from fdlit.methods.base import AggregationResult
from fdlit.methods.lkd import LKD

ACROSS = ("lkd", "avg")


@dataclass(frozen=True)
class Regions:
    """F2L's regions: a count R (client i is in region i mod R) or an explicit region id per client."""

    spec: int | tuple[int, ...]

    def assignment(self, num_clients: int) -> torch.Tensor:
        """Region id of every client (M,); refuses a spec that does not fit ``num_clients``."""
        if isinstance(self.spec, int):
            if self.spec > num_clients:
                raise ConfigError("aggregator.regions", f"{self.spec} regions for {num_clients} clients: "
                                  "every region needs a client")
            return torch.arange(num_clients) % self.spec
        if len(self.spec) != num_clients:
            raise ConfigError("aggregator.regions", f"an explicit assignment needs one region id per client "
                              f"({num_clients}); got {len(self.spec)}")
        return torch.tensor(self.spec)


def upload_bytes(uploads) -> float:
    """What the clients sent up (the client-to-region tier): every message, not in-process ``_`` keys."""
    return float(sum(t.numel() * t.element_size() for u in uploads for t in u.values()))


def region_assignment(regions: int | list[int]) -> Regions:
    """Check ``aggregator.regions`` (a count >= 1, or ids 0..R-1 each used) before any work."""
    if isinstance(regions, bool) or not isinstance(regions, (int, list, tuple)):
        raise ConfigError("aggregator.regions", f"a count >= 1 or a list of region ids; got {regions!r}")
    if isinstance(regions, int):
        if regions < 1:
            raise ConfigError("aggregator.regions", f"a count must be >= 1; got {regions}")
        return Regions(regions)
    ids = [int(r) for r in regions]
    used = sorted(set(ids))
    if not ids or used != list(range(len(used))):
        raise ConfigError("aggregator.regions", "an explicit assignment uses every region id 0..R-1 "
                          f"(one per client); got {ids}")
    return Regions(tuple(ids))



class F2L(LKD):
    """Hierarchical LKD (Nguyen et al., F2L, *Label-driven Knowledge Aggregator*; Sec. 3.1, Algorithm 1).

    F2L splits the clients into R regions, each with a regional server; the global server distils the
    regional teachers with LKD. In FD every tier exchanges predictions on the public set:

        regional teacher:  P_r(x) = sum_{i in r} W_r[i, x] Q_i(x),
                           W_r[i, x] = beta_r[i, c_i(x)] / sum_{j in r} beta_r[j, c_j(x)],
                           beta_r[i, c] = softmax_{i in r}(T_w AUC_{i,c}),  c_i(x) = argmax Q_i(x)
        global teacher:    P(x) = sum_r V[r, x] P_r(x)
          ``across: lkd``: V[r, x] = gamma[r, c_r(x)] / sum_s gamma[s, c_s(x)],
                           gamma[r, c] = softmax_r(T_w AUC_{r,c}),  AUC_{r,c} = sum_{i in r} beta_r[i, c] AUC_{i,c}
          ``across: avg``: V[r, x] = |r| / M

    so client i's weight is W[i, x] = V[r(i), x] W_r[i, x] (columns still sum to 1). The AUCs are
    LKD's (``scoring``, see :class:`LKD`). **choice**: a regional teacher's class-c
    reliability AUC_{r,c} is its members' AUCs weighted by their share beta_r[., c] of the class-c
    predictions (F2L scores the regional model itself on the server's labelled pool, which FD has
    no model for). With one region this is LKD; with M regions of one client, ``across: lkd`` is LKD.

    F2L's switch back to FedAvg (Algorithm 1) is ``epsilon``: with gap = max_c (max_r gamma[r, c] -
    min_r gamma[r, c]), the global server combines the regions by LKD while gap >= epsilon and by
    their size-weighted mean (``across: avg``) once they agree (0, the default: always LKD). F2L as
    published, with regional FedAvg, the global student's joint loss and this switch on parameters,
    is :class:`~fdlit.methods.f2l_fedavg.F2LParams`.

    Bytes per tier (rule stats, per round): ``f2l/bytes_client_to_region`` (what the clients upload:
    the ledger's uplink), ``f2l/bytes_region_to_global`` (each region's teacher, N x C in the
    uploads' dtype, and its C reliabilities in float32) and ``f2l/bytes_global_to_region`` (the
    global teacher to every regional server); the regional servers' downlink to their clients is
    the ledger's downlink.

    Args:
        regions: R, a count (client i is in region i mod R), or an explicit region id per client
            (a list of M ints, ids 0..R-1, each used).
        across: how the global server combines the regional teachers: ``lkd`` or ``avg``.
        epsilon: the switch to ``avg`` once the regions' reliabilities agree (>= 0; 0: never).
        temperature, scoring, server_labelled_size: LKD's (see :class:`LKD`).
    """

    short_name = "f2l"
    label = "F2L"  # how tables and figures name the method

    def __init__(self, regions: int | list[int] = 4, across: Literal["lkd", "avg"] = "lkd",
                 epsilon: float = 0.0, temperature: float = 20.0,
                 scoring: Literal["calibration_vs_public", "calibration", "server"] = "calibration_vs_public",
                 server_labelled_size: int = 100):
        super().__init__(temperature=temperature, scoring=scoring, server_labelled_size=server_labelled_size)
        if across not in ACROSS:
            raise ConfigError("aggregator.across", f"allowed: 'lkd', 'avg'; got {across!r}")
        check_at_least("aggregator.epsilon", epsilon, 0.0)
        self.regions, self.across, self.epsilon = region_assignment(regions), across, epsilon

    def assignment(self, num_clients: int) -> torch.Tensor:
        """Region id of every client (M,)."""
        return self.regions.assignment(num_clients)

    def check_clients(self, num_clients: int) -> None:
        self.assignment(num_clients)  # every region needs a client

    def server_setup(self, uploads, ctx):
        self.assignment(ctx.info.num_clients)  # refuse a bad assignment before round 1
        return super().server_setup(uploads, ctx)

    def aggregate(self, uploads, ctx):
        z = self.stack_logits(uploads)
        q = z.softmax(-1)  # M x N x C
        m, n, c = q.shape
        auc, _ = self.class_reliability(uploads, c)
        auc = auc.to(q.device)
        ids, total = ctx.info.client_ids(), ctx.info.num_clients
        # the regions of the clients that arrived; a region none of whose members sent anything has
        # no teacher this round, so the others are renumbered 0..R'-1
        region = torch.unique(self.assignment(total)[ids], return_inverse=True)[1].to(q.device)
        num_regions = int(region.max()) + 1
        pred = q.argmax(-1)  # M x N
        within = torch.zeros(m, n, device=q.device)  # W_r[i, x]
        regional = torch.zeros(num_regions, n, c, device=q.device)  # P_r
        regional_auc = torch.zeros(num_regions, c, device=q.device)
        for r in range(num_regions):
            members = (region == r).nonzero().flatten()
            beta = torch.softmax(self.temperature * auc[members], dim=0)  # |r| x C
            w = torch.gather(beta, 1, pred[members])
            w = w / w.sum(0, keepdim=True).clamp_min(1e-30)
            within[members] = w
            regional[r] = self.mix(w, q[members])
            regional_auc[r] = (beta * auc[members]).sum(0)
        gamma = torch.softmax(self.temperature * regional_auc, dim=0)  # R x C
        gap = float((gamma.max(0).values - gamma.min(0).values).max())
        lkd_across = self.across == "lkd" and gap >= self.epsilon  # F2L's switch: regions that agree are averaged
        if lkd_across:
            v = torch.gather(gamma, 1, regional.argmax(-1))
            v = v / v.sum(0, keepdim=True).clamp_min(1e-30)
        else:
            sizes = torch.bincount(region, minlength=num_regions).float()
            v = (sizes / m)[:, None].expand(num_regions, n)
        weights = v[region] * within  # W[i, x] = V[r(i), x] W_r[i, x]
        teacher = torch.einsum("rn,rnc->nc", v, regional)
        return AggregationResult(teacher=teacher, weights=weights, stats={
            "lkd/auc_mean": float(auc.mean()),
            "f2l/regions": float(num_regions),
            "f2l/beta_gap": gap,
            "f2l/lkd_active": float(lkd_across),
            **self.tier_bytes(uploads, num_regions, n, c, uploads[0]["logits"].element_size()),
        })

    @staticmethod
    def tier_bytes(uploads, num_regions: int, n: int, c: int, element_size: int) -> dict[str, float]:
        return {
            "f2l/bytes_client_to_region": upload_bytes(uploads),
            "f2l/bytes_region_to_global": float(num_regions * (n * c * element_size + c * 4)),
            "f2l/bytes_global_to_region": float(num_regions * n * c * element_size),
        }


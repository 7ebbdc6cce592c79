"""SCARLET: soft-label caching and Enhanced ERA (Azuma et al. 2025, arXiv 2504.19602)."""

from __future__ import annotations

import torch

from fdlit.errors import ConfigError, check_number
from fdlit.messages import Message, Upload
from fdlit.methods.base import AggregationResult, Aggregator, ClientPart

NEVER = -1  # a cache entry's round when the row holds no soft label
# what the server tells a client of each row it sends: not cached, cached this round, cached earlier
NOT_CACHED, NEWLY_CACHED, CACHED = 0, 1, 2


def enhanced_era(mean_probs: torch.Tensor, exponent: float) -> torch.Tensor:
    """Enhanced ERA: P(x)_c = Q(x)_c^beta / sum_k Q(x)_k^beta, Q the clients' mean probabilities."""
    powered = mean_probs.double().pow(exponent)
    return (powered / powered.sum(-1, keepdim=True)).float()


def cache_valid(stored: torch.Tensor, round_: int, duration: int) -> torch.Tensor:
    """Rows whose cache entry (the round it was stored, NEVER for none) serves round ``round_``: an entry
    stored in round s serves rounds s + 1 .. s + duration (the authors' ``cache.round + duration > round``,
    checked when the next round's rows are drawn, at the end of round s)."""
    return (stored != NEVER) & (stored + duration >= round_)


class ScarletClient(ClientPart):
    """SCARLET's client part: uploads the probabilities of the round's rows its cache mirror does not
    hold, and keeps the mirror current from the changes the server sends (``receive``).

    ``ctx.state``: ``cache_labels`` (full public set x C, the soft labels it holds) and ``cache_stored``
    (the round each was stored, NEVER for none), checkpointed and moved with the client."""

    uploads = (Upload("logits", "rows", shape=(None, "C")), Upload("requested", "clear", dtype=torch.bool, shape=("N",)))
    label = "SCARLET's client part"

    def __init__(self, cache_duration: int):
        self.cache_duration = cache_duration

    @staticmethod
    def mirror(state: dict, size: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
        if "cache_stored" not in state:
            state["cache_labels"] = torch.zeros(size, classes)
            state["cache_stored"] = torch.full((size,), NEVER, dtype=torch.long)
        return state["cache_labels"], state["cache_stored"]

    def upload(self, ctx):
        rows = ctx.info.public_ids().cpu()
        _, stored = self.mirror(ctx.state, ctx.info.full_public_size, ctx.info.num_classes)
        requested = ~cache_valid(stored[rows], ctx.info.round, self.cache_duration)
        logits = ctx.public_logits[requested.to(ctx.public_logits.device)]
        return {"logits": logits, "requested": requested}

    def receive(self, ctx):
        message = ctx.received
        if "teacher_rows" not in message:  # a full broadcast (a server model's labels): nothing to mirror
            return {}
        rows = ctx.info.public_ids().cpu()
        labels, stored = self.mirror(ctx.state, ctx.info.full_public_size, ctx.info.num_classes)
        sent = rows[message["teacher_rows"].cpu()]
        signal = message["cache_signal"].cpu().long()
        labels[sent] = message["teacher"].float().cpu()
        stored[sent] = torch.where(signal == NEWLY_CACHED, ctx.info.round, NEVER)
        stored[sent[signal == CACHED]] = message["stored_round"].cpu().long()
        return {}


class SCARLET(Aggregator):
    """SCARLET: DS-FL's soft-label exchange with a soft-label cache and Enhanced ERA.

    Source: Azuma et al. 2025, "Soft-Label Caching and Sharpening for Communication-Efficient Federated
    Distillation" (arXiv 2504.19602); the authors' code (kitsuyaazuma/SCARLET) names the knobs.

    Each round r, on its public rows (DS-FL draws a subset each round: ``federation.participation.public_subset``):

    * the server's cache holds, per public sample x, a soft label and the round s it was stored; it serves
      rounds s + 1 .. s + D (D = ``cache_duration``). Rows it serves are *cached*; the others are *requested*;
    * each client uploads its probabilities Q_i(x) for the requested rows only (its mirror of the cache
      tells it which), plus a bit mask of which rows it sent;
    * the teacher: P(x) = Q(x)^beta / sum_c Q(x)_c^beta with Q(x) = (1/M) sum_i Q_i(x) (Enhanced ERA,
      beta = ``era_exponent``) on requested rows, the cached label on cached rows;
    * cache update (the authors' ``update_cache``): of the requested rows with no entry, a share
      ``cache_ratio`` (drawn with the seed and the round) is stored with s = r; a requested row whose entry
      expired is cleared (cached again the next time it is drawn);
    * down to client i: only the rows its mirror lacks (this round's fresh labels and any cached label
      changed since it last heard), a bit mask of those rows, a one-byte cache signal per sent row (not
      cached, cached this round, cached earlier) and, for rows cached earlier, the round they were stored. The server tracks which version of each row each client holds, so a client
      that missed rounds gets the changes it missed.

    D = 0: nothing is ever served from the cache; every row is sent up every round and the teacher is
    Enhanced ERA of the fresh mean. beta = 1: the plain mean (AVG); DS-FL's ERA is softmax(Q / T) instead.

    Differences from the authors' code (its reproducibility branch; docs/algorithms.md, "SCARLET"): fdlit's
    round uploads before it broadcasts, so a client that missed the round in which a row was cached uploads
    that row once more (counted; the server ignores it); the clients distil from the teacher the server
    computes, which equals the one each client rebuilds from its mirror and the changes
    (tests/test_scarlet.py checks the mirror).

    Args:
        era_exponent: beta > 0 (the authors' default 2.0 on ``main``; 1.0 in their reproducibility configs).
        cache_duration: D >= 0 rounds (authors: 50).
        cache_ratio: share in [0, 1] of newly requested rows that enter the cache (authors: 1.0).
    """

    short_name = "scarlet"
    label = "SCARLET"
    client_cache = True  # configure sends each client only what its cache mirror lacks
    secure_refusal = ("SCARLET's clients upload different rows (those their cache lacks) and the server keeps "
                      "the aggregated labels in the clear in its cache")
    row_state = {"cache_labels": 0, "cache_stored": 0, "cache_changed": 0, "mirror_version": 1}

    def __init__(self, era_exponent: float = 2.0, cache_duration: int = 50, cache_ratio: float = 1.0):
        check_number("aggregator.era_exponent", era_exponent)
        if isinstance(cache_duration, bool) or not (isinstance(cache_duration, int) and cache_duration >= 0):
            raise ConfigError("aggregator.cache_duration", f"allowed: an integer >= 0; got {cache_duration!r}")
        if not (isinstance(cache_ratio, (int, float)) and 0.0 <= cache_ratio <= 1.0):
            raise ConfigError("aggregator.cache_ratio", f"allowed: a number in [0, 1]; got {cache_ratio!r}")
        self.era_exponent = float(era_exponent)
        self.cache_duration = cache_duration
        self.cache_ratio = float(cache_ratio)
        # server state over the full public set (and per client: which version of each row it holds)
        self.cache_labels: torch.Tensor | None = None
        self.cache_stored: torch.Tensor | None = None
        self.cache_changed: torch.Tensor | None = None  # the round a row's entry last changed
        self.mirror_version: torch.Tensor | None = None  # M x N: the cache_changed each client holds

    def client_part(self) -> ScarletClient:
        return ScarletClient(self.cache_duration)

    def start_cache(self, size: int, classes: int, clients: int) -> None:
        if self.cache_stored is None:
            self.cache_labels = torch.zeros(size, classes)
            self.cache_stored = torch.full((size,), NEVER, dtype=torch.long)
            self.cache_changed = torch.full((size,), NEVER, dtype=torch.long)
            self.mirror_version = torch.full((clients, size), NEVER - 1, dtype=torch.long)

    def aggregate(self, uploads, ctx):
        info, r = ctx.info, ctx.info.round
        rows = info.public_ids().cpu()
        n, c = len(rows), info.num_classes
        self.start_cache(info.full_public_size, c, info.num_clients)
        stored = self.cache_stored[rows]
        requested = ~cache_valid(stored, r, self.cache_duration)
        total, count = torch.zeros(n, c, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
        for u in uploads:
            sent = u["requested"].cpu().bool()
            probs = torch.zeros(n, c, dtype=torch.float64)
            probs[sent] = u["logits"].float().softmax(-1).cpu().double()
            use = sent & requested  # rows the server needs (a client behind on the cache sends more)
            total[use] += probs[use]
            count += use
        if bool((count[requested] == 0).any()):
            raise RuntimeError("SCARLET: a requested public row reached the server from no client")
        teacher = self.cache_labels[rows].clone()
        teacher[requested] = enhanced_era(total[requested] / count[requested, None], self.era_exponent)
        newly = self.update_cache(rows, stored, requested, teacher, info.seed, r)
        stats = {"scarlet/requested_rows": float(requested.sum()), "scarlet/cached_rows": float((~requested).sum()),
                 "scarlet/newly_cached_rows": float(newly.sum())}
        return AggregationResult(teacher=teacher, stats=stats)

    def update_cache(self, rows, stored, requested, teacher, seed: int, r: int) -> torch.Tensor:
        empty = requested & (stored == NEVER)
        expired = requested & (stored != NEVER)
        candidates = empty.nonzero().flatten()
        generator = torch.Generator().manual_seed(seed * 1_000_003 + r)  # the same draw on resume
        keep = int(self.cache_ratio * len(candidates))
        chosen = candidates[torch.randperm(len(candidates), generator=generator)[:keep]]
        newly = torch.zeros_like(requested)
        newly[chosen] = True
        self.cache_labels[rows[newly]] = teacher[newly]
        self.cache_stored[rows[newly]] = r
        self.cache_stored[rows[expired]] = NEVER
        self.cache_changed[rows[newly | expired]] = r
        return newly

    def configure(self, message: Message, client_ids: list[int], ctx) -> dict[int, Message]:
        teacher = message.get("teacher")
        if teacher is None or not teacher.is_floating_point() or "keep_mask" in message or self.cache_stored is None:
            return super().configure(message, client_ids, ctx)
        rows = ctx.info.public_ids().cpu()
        stored, changed = self.cache_stored[rows], self.cache_changed[rows]
        # requested this round: no entry now, or stored this round (served rows were stored before it)
        fresh = (stored == NEVER) | (stored == ctx.info.round)
        out = {}
        for i in client_ids:
            send = fresh | (self.mirror_version[i, rows] != changed)
            signal = torch.where(stored[send] == NEVER, NOT_CACHED, torch.where(fresh[send], NEWLY_CACHED, CACHED))
            earlier = stored[send][signal == CACHED]  # a change the client missed: when the label was stored
            out[i] = Message({"teacher": teacher[send.to(teacher.device)], "teacher_rows": send,
                              "cache_signal": signal.to(torch.uint8), "stored_round": earlier.to(torch.int32)})
            self.mirror_version[i, rows[send]] = changed[send]
        return out

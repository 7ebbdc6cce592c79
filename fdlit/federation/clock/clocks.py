"""The ``federation.clock`` section: rounds on a virtual clock, synchronous or asynchronous.

The loop calls a clock at four points of a round (and saves its state with the run):

* ``schedule(parts, plan)``: who trains and uploads this round (synchronous: the round's plan as drawn;
  asynchronous: the next clients to arrive);
* ``arrive(parts, plan, sent)``: after the client step, when each upload arrives (its bytes as sent);
  a synchronous deadline drops the late ones from the plan (their uploads are not used);
* ``close(parts, plan)``: after the exchange, when each client has received and distilled; the
  round's metrics (``time/virtual_s``, ``time/distilled_s``, ``async/staleness_mean`` and ``_max``);
* the round's exchange (asynchronous: the cache of stale predictions,
  :func:`fdlit.federation.clock.async_exchange.clocked`).

Times follow :mod:`fdlit.federation.clock.timeline` from the clients' devices
(:mod:`fdlit.federation.clock.profiles`). No clock (the default) runs every round exactly as before.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from fdlit.errors import ConfigError
from fdlit.federation.clock.base import FIELD, VirtualClock
from fdlit.federation.clock.model_versions import ModelVersions
from fdlit.federation.clock.profiles import DeviceProfile
from fdlit.federation.clock.server_updates import FedBuff, ServerUpdate
from fdlit.federation.clock.staleness import Constant, Staleness, mixture_of
from fdlit.federation.participation import participation_metrics
from fdlit.messages import Message, Metrics, array_bytes

if TYPE_CHECKING:
    from fdlit.federation.round_facts import RoundPlan
    from fdlit.federation.round_parts import RoundParts
    from fdlit.federation.server import ServerModel
    from fdlit.federation.settings import FederationSettings
    from fdlit.methods.base import Aggregator
    from fdlit.privacy import UploadPrivacy



class RoundClock(VirtualClock):
    """The round's hooks a clock shares (the module docstring); its kinds subclass it."""

    def check(self, settings: FederationSettings, method: Aggregator, privacy: UploadPrivacy,
              server_model: ServerModel | None) -> None:
        """Refuse, from the config alone, what this clock cannot run (one line per problem)."""

    # ------------------------------------------------------------------ a round
    def schedule(self, parts: RoundParts, plan: RoundPlan) -> RoundPlan:
        return plan

    def job_floor(self) -> float:
        """The earliest a job of this round starts: synchronous rounds start when the server samples."""
        return self.timeline.now

    def arrive(self, parts: RoundParts, plan: RoundPlan, sent: dict) -> RoundPlan:
        """Each sampled client's job; the round's release time; the plan without late uploads."""
        tl, r = self.timeline, plan.round
        rows = _public_rows(parts, plan) if self.predictions else 0
        epochs = parts.settings.private_epochs_of(r)
        self._arrivals = {}
        for i in plan.sampled:
            trained = tl.trained(i, self.job_floor(), len(parts.tensors.private[i][1]) * epochs, rows if sent else 0)
            if i in sent:
                tl.up_bytes[i] = sum(array_bytes(t) for t in sent[i].values())
                self._arrivals[i] = tl.arrival(i, trained, tl.up_bytes[i])
            else:  # dropped before its upload: it trained, nothing arrives
                tl.free[i] = trained
        late = self.late(self._arrivals)
        for i in late:
            tl.free[i] = self._arrivals.pop(i)
        self._release = self.release_time(self._arrivals, bool(late))
        if not late:
            return plan
        return dataclasses.replace(plan, arrived=[i for i in plan.arrived if i not in late])

    def late(self, arrivals: dict[int, float]) -> set[int]:
        return set()

    def release_time(self, arrivals: dict[int, float], any_late: bool) -> float:
        return max(arrivals.values(), default=self.timeline.now)

    def close(self, parts: RoundParts, plan: RoundPlan) -> Metrics:
        """After the exchange: when every client the server sent to has received (and distilled); the
        round's clock metrics."""
        tl, r = self.timeline, plan.round
        public = _public_rows(parts, plan) * parts.settings.public_epochs_of(r) if self.predictions else 0
        arrived = set(plan.arrived)
        done = []
        for i, nbytes in sorted(_down_bytes(parts, r).items()):
            distilled = self.predictions and i in arrived
            t = tl.received(i, self._release, nbytes, public if distilled else 0)
            tl.free[i] = max(tl.free[i], t)
            done.append(t)
            if distilled:
                tl.version[i] = r
        for i in arrived - set(_down_bytes(parts, r)):  # arrived, sent nothing back (no teacher)
            tl.free[i] = max(tl.free[i], self._arrivals.get(i, tl.free[i]))
        tl.finish(self._release, done)
        # the server's clock when it released the round's teacher (synchronous: the last upload's
        # arrival or the deadline); the receivers' download and distillation delay their next job
        metrics = {"time/virtual_s": self._release, "time/distilled_s": tl.elapsed}
        metrics.update(self.round_metrics(parts, plan))
        return metrics

    def round_metrics(self, parts: RoundParts, plan: RoundPlan) -> Metrics:
        # synchronous rounds: every upload was made right after the previous teacher
        return {"async/staleness_mean": 0.0, "async/staleness_max": 0.0}


def _public_rows(parts: RoundParts, plan: RoundPlan) -> int:
    return len(parts.tensors.public_x) if plan.public_index is None else len(plan.public_index)


def _down_bytes(parts: RoundParts, r: int) -> dict[int, int]:
    """Bytes each client was sent in round r (the ledger's latest entries)."""
    out: dict[int, int] = {}
    for m in reversed(parts.server.ledger.messages):
        if m.round != r:
            break
        if m.direction == "down":
            out[m.client] = out.get(m.client, 0) + m.bytes
    return out


class SynchronousClock(RoundClock):
    """Synchronous rounds on the virtual clock: a round's teacher is released when its slowest
    arriving client's upload arrives; with ``deadline``, uploads later than ``deadline`` seconds
    after the round began are not used (the client counts as dropped: over-selection as in
    production FL, Bonawitz et al. 2019), and the server releases at the deadline.

    Args:
        profile: the clients' devices (:mod:`fdlit.federation.clock.profiles`).
        deadline: seconds from the round's start; null: wait for every sampled client.
    """

    def __init__(self, profile: DeviceProfile | None = None, deadline: float | None = None):
        super().__init__(profile)
        if deadline is not None and not deadline > 0:
            raise ConfigError(f"{FIELD}.deadline", f"allowed: seconds > 0 or null (no deadline); got {deadline}")
        self.deadline = deadline

    def late(self, arrivals):
        if self.deadline is None:
            return set()
        return {i for i, t in arrivals.items() if t - self.timeline.now > self.deadline}

    def release_time(self, arrivals, any_late):
        if any_late:
            return self.timeline.now + self.deadline
        return super().release_time(arrivals, any_late)

    def close(self, parts, plan):
        metrics = super().close(parts, plan)
        if self.deadline is not None:
            metrics.update(participation_metrics(plan.sampled, plan.arrived, _public_rows(parts, plan)))
        return metrics


class AsynchronousClock(RoundClock):
    """Asynchronous rounds: a release every ``buffer`` arrivals (FedBuff's buffer, Nguyen et al. 2022)
    or every ``period`` virtual seconds, sent to the clients whose uploads it has just received, which
    start their next job from it.

    * Federated distillation: the server keeps the freshest upload of every client and releases a
      teacher from all of them, each weighted by its staleness; the first release waits for every
      client (the cache starts full). Rows and weights: :mod:`fdlit.federation.clock.async_exchange`.
    * Parameter exchange (FedAvg's family): each release updates the server's model from the uploads
      that arrived with ``server_update``, FedBuff (the default) or FedAsync
      (:mod:`fdlit.federation.clock.async_parameters`).

    With equal devices and ``buffer`` = every client, every release is a synchronous round.

    Args:
        profile: the clients' devices (:mod:`fdlit.federation.clock.profiles`).
        buffer: arrivals per release (1: FedAsync-like, one client at a time; at most the clients).
        period: virtual seconds between releases (set buffer or period; neither: buffer = every client).
        staleness: how an upload's weight decays with its staleness
            (:mod:`fdlit.federation.clock.staleness`: Constant, Polynomial, Hinge).
        server_update: parameter exchange only: how the server's model takes the arrived uploads
            (:mod:`fdlit.federation.clock.server_updates`: FedBuff(server_lr), FedAsync(alpha));
            null: FedBuff with server_lr 1.
        real_time_scale: under ``fdlit deploy`` (real time, docs/async.md): each node holds a reply
            until this many real seconds per virtual second of the job its device would take (injected
            delays, so the deployment's arrivals follow the profile); null: the nodes' own speed.
    """

    def __init__(self, profile: DeviceProfile | None = None, buffer: int | None = None, period: float | None = None,
                 staleness: Staleness | None = None, server_update: ServerUpdate | None = None,
                 real_time_scale: float | None = None):
        super().__init__(profile)
        if real_time_scale is not None and not real_time_scale >= 0:
            raise ConfigError(f"{FIELD}.real_time_scale", f"allowed: seconds >= 0 or null; got {real_time_scale}")
        self.real_time_scale = real_time_scale
        self.asynchronous = True
        if buffer is not None and period is not None:
            raise ConfigError(f"{FIELD}.period", "set buffer or period, not both")
        if buffer is not None and (not isinstance(buffer, int) or buffer < 1):
            raise ConfigError(f"{FIELD}.buffer", f"allowed: an integer in [1, num_clients]; got {buffer!r}")
        if period is not None and not period > 0:
            raise ConfigError(f"{FIELD}.period", f"allowed: seconds > 0; got {period}")
        self.buffer, self.period = buffer, period
        self.staleness = staleness if staleness is not None else Constant()
        self.server_update = server_update  # parameter exchange: set to FedBuff() by check when null
        self.versions = ModelVersions()  # parameter exchange: the server's model versions the clients hold
        self.cache: dict[int, Message] = {}  # client -> its freshest upload, filled by the exchange
        self.cached_version: dict[int, int] = {}  # client -> the release its cached upload's model distilled
        self.last_staleness: list[int] = []  # the staleness of the rows behind the last teacher

    def check(self, settings, method, privacy, server_model):
        """What asynchronous rounds cannot run, refused from the config alone."""
        name = type(method).__name__
        if settings.mode != "fd" or method.exchange not in ("predictions", "parameters"):
            raise ConfigError(FIELD, f"AsynchronousClock runs a prediction or parameter exchange; {name} in mode "
                              f"{settings.mode!r} does not; allowed: SynchronousClock")
        if settings.participation is not None:
            raise ConfigError("federation.participation", "allowed: unset with AsynchronousClock (its buffer or "
                              "period decides who arrives)")
        if getattr(privacy, "secure", False):
            raise ConfigError("privacy.secure_aggregation", "allowed: off with AsynchronousClock (the server caches "
                              "each client's own upload)")
        if server_model is not None:
            raise ConfigError("server.enabled", "allowed: false with AsynchronousClock")
        if privacy.upload_audit:  # its attacks read one round's fresh uploads, not a cache of stale ones
            raise ConfigError("privacy.upload_audit", "allowed: false with AsynchronousClock")
        if method.exchange == "parameters":
            self.server_update = self.server_update if self.server_update is not None else FedBuff()
            self.server_update.check(method, self.buffer, self.period)
            return
        if self.server_update is not None:
            raise ConfigError(f"{FIELD}.server_update", f"allowed: null with federated distillation ({name}); "
                              "FedBuff and FedAsync update a parameter exchange's model")
        if method.client_cache:
            raise ConfigError(FIELD, f"{name} keeps a cache on the clients; allowed with AsynchronousClock: rules "
                              "that send every arriving client the same teacher")
        if not self.staleness.constant and mixture_of(method) is None:
            raise ConfigError(f"{FIELD}.staleness", f"{name} is not a weighted mixture the staleness can re-weight; "
                              "allowed with it: Constant, or a rule among AVG, entropy weighting, UWA, sUWA, ERA")

    def start(self, num_clients, seed):
        if self.buffer is not None and self.buffer > num_clients:
            raise ConfigError(f"{FIELD}.buffer", f"allowed: an integer in [1, {num_clients}] (num_clients); "
                              f"got {self.buffer}")
        super().start(num_clients, seed)
        self.cache, self.cached_version, self.last_staleness = {}, {}, []
        self.versions = ModelVersions()

    def job_floor(self):
        return 0.0  # a client starts its next job as soon as it has distilled

    def schedule(self, parts, plan):
        """The ``buffer`` next arrivals, or those within ``period``; federated distillation's release 1:
        every client (the cache starts full)."""
        tl = self.timeline
        if plan.round == 1 and self.predictions:
            return plan
        landed = parts.clients.arrivals(self.buffer or len(tl.free))  # real time (a deployment), or None
        if landed is not None:
            return dataclasses.replace(plan, sampled=landed, arrived=list(landed))
        expected = self.expected_arrivals(parts, plan)
        if self.period is not None:
            ids = sorted(i for i, t in expected.items() if t <= tl.now + self.period)
        else:
            k = self.buffer or len(expected)
            ids = sorted(i for _, i in sorted((t, i) for i, t in expected.items())[:k])
        return dataclasses.replace(plan, sampled=ids, arrived=list(ids))

    def expected_arrivals(self, parts, plan) -> dict[int, float]:
        """When each client's current job would arrive, its upload as large as its last (before its first:
        a parameter exchange's upload is as large as the model the server sent at set-up)."""
        tl = self.timeline
        rows = _public_rows(parts, plan) if self.predictions else 0
        first = 0 if self.predictions else array_bytes(parts.server.received["parameters"])
        epochs = parts.settings.private_epochs_of(plan.round)
        return {i: tl.arrival(i, tl.trained(i, 0.0, len(parts.tensors.private[i][1]) * epochs, rows),
                              tl.up_bytes[i] or first) for i in range(len(tl.free))}

    def holds(self, parts: RoundParts, plan: RoundPlan, ids: list[int]) -> dict[int, tuple[float, float]]:
        """Real time (a deployment): for each client ``ids`` that receives this release's teacher, the
        virtual seconds from the release until it has distilled, and until its next upload arrives (its
        next job started at once), as ``close`` and ``expected_arrivals`` count them."""
        tl, r = self.timeline, plan.round
        rows = _public_rows(parts, plan)
        public = rows * parts.settings.public_epochs_of(r)
        down, epochs = _down_bytes(parts, r), parts.settings.private_epochs_of(r + 1)
        out = {}
        for i in ids:
            free = max(tl.free[i], tl.received(i, self._release, down.get(i, 0), public))
            start = tl.devices.start(i, free)
            trained = start + tl.devices.compute_s(i, len(parts.tensors.private[i][1]) * epochs + rows / 3.0)
            out[i] = (free - self._release, tl.arrival(i, trained, tl.up_bytes[i]) - self._release)
        return out

    def release_time(self, arrivals, any_late):
        if self.period is not None and (self.cache or not self.predictions):  # FD: after the first release
            return max([self.timeline.now + self.period, *arrivals.values()])
        return super().release_time(arrivals, any_late)

    def round_metrics(self, parts, plan):
        s = self.last_staleness or [0]
        return {"async/staleness_mean": sum(s) / len(s), "async/staleness_max": float(max(s)),
                "async/arrivals": len(plan.arrived)}

    def state_dict(self):
        cache = {str(i): {"arrays": dict(u.arrays), "metrics": dict(u.metrics), "config": dict(u.config),
                          "sensitivity": dict(u.sensitivity)} for i, u in self.cache.items()}
        return {**super().state_dict(), "cache": cache,
                "cached_version": {str(i): v for i, v in self.cached_version.items()},
                "last_staleness": list(self.last_staleness), "versions": self.versions.state_dict()}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.cache = {int(i): Message(**u) for i, u in state["cache"].items()}
        self.cached_version = {int(i): int(v) for i, v in state["cached_version"].items()}
        self.last_staleness = [int(v) for v in state["last_staleness"]]
        if "versions" in state:  # saved before parameter exchange ran asynchronously: FD only, none kept
            self.versions.load_state_dict(state["versions"])

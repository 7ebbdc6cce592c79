"""The ``federation.clock`` section's base class: the clients' devices and their timeline, saved with the run.

Its kinds and the round's hooks are in :mod:`fdlit.federation.clock.clocks`.
"""

from __future__ import annotations

from typing import Any

from fdlit.federation.clock.profiles import DeviceProfile, LogNormalProfile
from fdlit.federation.clock.timeline import Timeline

FIELD = "federation.clock"


class VirtualClock:
    """Rounds on a virtual clock (a subclass: :class:`SynchronousClock`, :class:`AsynchronousClock`).

    Args:
        profile: how each client's speed, link and availability are drawn
            (:mod:`fdlit.federation.clock.profiles`: uniform, log-normal, a trace file).
    """

    asynchronous = False  # True: the cache of stale predictions (fdlit.federation.clock.async_exchange)

    def __init__(self, profile: DeviceProfile | None = None):
        self.profile = profile if profile is not None else LogNormalProfile()
        self.timeline: Timeline | None = None
        self.predictions = True  # the exchange infers on the public set and distils (async_exchange.clocked)
        self._arrivals: dict[int, float] = {}  # this round's upload arrivals (client -> seconds)
        self._release = 0.0  # this round's teacher release

    def start(self, num_clients: int, seed: int) -> None:
        """Draw the clients' devices and start at time 0 (set-up; a resumed run then loads its state)."""
        self.timeline = Timeline(self.profile.draw(num_clients, seed))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"timeline": self.timeline.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.timeline.load_state_dict(state["timeline"])

"""The clients' timeline on the virtual clock: when each is free, when its upload arrives, when it has
received and distilled a teacher. Pure bookkeeping of numbers (no tensors), saved with the run.

One client's job: it starts when it is free (and available), trains its private phase and infers
on the public rows, uploads; once the server releases a teacher to it, it downloads it and
distils (its public phase); then it is free again. In seconds (``Devices``):

    arrival = start + (n_i * e_private + N_pub / 3) / speed_i + latency_i + up_bytes / bandwidth_i
    free    = release + latency_i + down_bytes / bandwidth_i + N_pub * e_public / speed_i

(public inference costs a third of a training sample: forward only, FedScale's factor 3).
"""

from __future__ import annotations

from collections.abc import Sequence

from fdlit.federation.clock.profiles import Devices


class Timeline:
    """Per client: when it is free, its last upload's bytes, the release its model last distilled
    from; the server's time (its last release) and the run's virtual time so far."""

    def __init__(self, devices: Devices):
        m = len(devices.speed)
        self.devices = devices
        self.free = [0.0] * m  # when each client can start its next job
        self.up_bytes = [0] * m  # its last upload's bytes (0: none yet)
        self.version = [0] * m  # the release whose teacher it last distilled (0: none)
        self.now = 0.0  # the server's last release
        self.elapsed = 0.0  # the run's virtual time: the last round complete

    def start(self, i: int, at: float) -> float:
        return self.devices.start(i, max(self.free[i], at))

    def trained(self, i: int, at: float, private_samples: float, inference_samples: float) -> float:
        """When client i's private phase and public inference end, its job started no earlier than ``at``."""
        return self.start(i, at) + self.devices.compute_s(i, private_samples + inference_samples / 3.0)

    def arrival(self, i: int, trained: float, nbytes: int) -> float:
        return trained + self.devices.link_s(i, nbytes)

    def received(self, i: int, release: float, nbytes: int, public_samples: float) -> float:
        """When client i has downloaded what the server sent it at ``release`` and distilled."""
        return release + self.devices.link_s(i, nbytes) + self.devices.compute_s(i, public_samples)

    def finish(self, release: float, done: Sequence[float]) -> None:
        """The round ends: the server released at ``release``; ``done`` the clients' completions."""
        self.now = release
        self.elapsed = max(self.elapsed, release, *done)

    def state_dict(self) -> dict:
        return {"free": list(self.free), "up_bytes": list(self.up_bytes), "version": list(self.version),
                "now": self.now, "elapsed": self.elapsed}

    def load_state_dict(self, state: dict) -> None:
        self.free = [float(v) for v in state["free"]]
        self.up_bytes = [int(v) for v in state["up_bytes"]]
        self.version = [int(v) for v in state["version"]]
        self.now, self.elapsed = float(state["now"]), float(state["elapsed"])

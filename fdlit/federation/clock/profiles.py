"""Device profiles: each client's compute speed, link and availability on the virtual clock.

A profile draws, once per run from the seed (its own ``numpy`` stream, no global state), every
client's

* ``speed``: samples a second its private and public phases process (one sample, one epoch:
  forward and backward);
* ``bandwidth``: bytes a second of its link, the same up and down;
* ``latency``: seconds added to every message it sends or receives;
* optionally availability windows (a trace's): a client starts a job only inside one.

So a client's private phase over ``n`` samples for ``e`` epochs takes ``n * e / speed`` virtual
seconds and a message of ``b`` bytes ``latency + b / bandwidth``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fdlit.errors import ConfigError

FIELD = "federation.clock.profile"
_DRAW = 0xC10C  # the profile's own random stream


@dataclass(frozen=True)
class Windows:
    """A client's availability: it can start a job in [active[k], inactive[k]] of a cycle of
    ``finish_time`` seconds that repeats (FedScale's behaviour trace)."""

    active: tuple[float, ...]
    inactive: tuple[float, ...]
    finish_time: float

    def next_start(self, t: float) -> float:
        """The earliest time >= t at which the client is available."""
        cycle = math.floor(t / self.finish_time) * self.finish_time
        norm = t - cycle
        for start, end in zip(self.active, self.inactive, strict=True):
            if start <= norm <= end:
                return t
            if norm < start:
                return cycle + start
        return cycle + self.finish_time + self.active[0]  # the next cycle's first window


@dataclass(frozen=True)
class Devices:
    """Per client: samples/s, bytes/s, seconds of latency, availability (None: always available)."""

    speed: np.ndarray
    bandwidth: np.ndarray
    latency: np.ndarray
    windows: tuple[Windows | None, ...]

    def compute_s(self, client: int, samples: float) -> float:
        return float(samples / self.speed[client])

    def link_s(self, client: int, nbytes: int) -> float:
        return float(self.latency[client] + nbytes / self.bandwidth[client])

    def start(self, client: int, t: float) -> float:
        w = self.windows[client]
        return t if w is None else w.next_start(t)


def _positive(field: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{FIELD}.{field}", f"allowed: a number > 0; got {value!r}")
    return float(value)


def _non_negative(field: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ConfigError(f"{FIELD}.{field}", f"allowed: a number >= 0; got {value!r}")
    return float(value)


MBIT = 1e6 / 8  # bytes a second in one Mbit/s


class DeviceProfile:
    """How the clients' devices are drawn (a subclass: uniform, log-normal, a trace file)."""

    def draw(self, num_clients: int, seed: int) -> Devices:
        raise NotImplementedError


class UniformProfile(DeviceProfile):
    """Speeds and bandwidths drawn uniformly from [low, high] (equal bounds: every client the same).

    Args:
        speed_low, speed_high: samples a second.
        bandwidth_low, bandwidth_high: Mbit/s.
        latency: seconds per message.
    """

    def __init__(self, speed_low: float = 100.0, speed_high: float = 100.0, bandwidth_low: float = 10.0,
                 bandwidth_high: float = 10.0, latency: float = 0.05):
        self.speed = (_positive("speed_low", speed_low), _positive("speed_high", speed_high))
        self.bandwidth = (_positive("bandwidth_low", bandwidth_low), _positive("bandwidth_high", bandwidth_high))
        if self.speed[0] > self.speed[1]:
            raise ConfigError(f"{FIELD}.speed_low", f"allowed: at most speed_high ({speed_high}); got {speed_low}")
        if self.bandwidth[0] > self.bandwidth[1]:
            raise ConfigError(f"{FIELD}.bandwidth_low", f"allowed: at most bandwidth_high ({bandwidth_high}); "
                              f"got {bandwidth_low}")
        self.latency = _non_negative("latency", latency)

    def draw(self, num_clients, seed):
        rng = np.random.default_rng([seed, _DRAW])
        speed = rng.uniform(*self.speed, size=num_clients)
        bandwidth = rng.uniform(*self.bandwidth, size=num_clients) * MBIT
        return Devices(speed, bandwidth, np.full(num_clients, self.latency), (None,) * num_clients)


class LogNormalProfile(DeviceProfile):
    """Heavy-tailed devices: speed = speed_median * exp(speed_sigma * g), bandwidth likewise, with g
    standard normal per client (a few clients far slower than the median: stragglers).

    Args:
        speed_median: samples a second of the median client.
        speed_sigma: the log-speed's standard deviation (0: every client at the median).
        bandwidth_median: Mbit/s of the median client.
        bandwidth_sigma: the log-bandwidth's standard deviation.
        latency: seconds per message.
    """

    def __init__(self, speed_median: float = 100.0, speed_sigma: float = 1.0, bandwidth_median: float = 10.0,
                 bandwidth_sigma: float = 1.0, latency: float = 0.05):
        self.speed_median = _positive("speed_median", speed_median)
        self.speed_sigma = _non_negative("speed_sigma", speed_sigma)
        self.bandwidth_median = _positive("bandwidth_median", bandwidth_median)
        self.bandwidth_sigma = _non_negative("bandwidth_sigma", bandwidth_sigma)
        self.latency = _non_negative("latency", latency)

    def draw(self, num_clients, seed):
        rng = np.random.default_rng([seed, _DRAW])
        speed = self.speed_median * np.exp(self.speed_sigma * rng.standard_normal(num_clients))
        bandwidth = self.bandwidth_median * MBIT * np.exp(self.bandwidth_sigma * rng.standard_normal(num_clients))
        return Devices(speed, bandwidth, np.full(num_clients, self.latency), (None,) * num_clients)


class TraceProfile(DeviceProfile):
    """Devices read from a JSON trace in the fields of FedScale's device traces (Lai et al. 2022,
    FedScale: ``client_device_capacity`` and ``client_behave_trace``, there pickled; here JSON,
    which cannot run code): a mapping of device id to

    ``{"computation": ms, "communication": kbit/s, "active": [s, ...], "inactive": [s, ...],
    "finish_time": s}``

    ``computation`` is FedScale's milliseconds per sample of inference; as FedScale, a training
    sample costs three of them (forward and backward), so speed = 1000 / (3 * computation)
    samples a second. ``communication`` is kbit/s. The availability fields are optional: present, a
    client starts a job only inside [active[k], inactive[k]] of a cycle of ``finish_time`` seconds.
    Client i takes the i-th device in the file's order (wrapping around when the file has fewer).

    Args:
        path: the JSON file.
        latency: seconds per message (FedScale's traces have none).
    """

    def __init__(self, path: str, latency: float = 0.0):
        self.path = str(path)
        self.latency = _non_negative("latency", latency)
        self.devices = self._read(Path(path))

    @staticmethod
    def _read(path: Path) -> list[dict]:
        field = f"{FIELD}.path"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(field, f"allowed: a readable JSON trace file; {path}: {e}") from None
        if not isinstance(data, dict) or not data:
            raise ConfigError(field, f"allowed: a JSON object of device id -> {{computation, communication}}; "
                              f"{path} holds {type(data).__name__}")
        devices = []
        for key, d in data.items():
            if not isinstance(d, dict) or not all(isinstance(d.get(k), (int, float)) and d[k] > 0
                                                  for k in ("computation", "communication")):
                raise ConfigError(field, f"device {key!r}: allowed: computation (ms) and communication (kbit/s), "
                                  "numbers > 0")
            if "active" in d:
                a, b, f = d.get("active"), d.get("inactive"), d.get("finish_time")
                ok = (isinstance(a, list) and isinstance(b, list) and len(a) == len(b) > 0
                      and isinstance(f, (int, float)) and f > 0 and all(0 <= s <= e <= f for s, e in zip(a, b, strict=False))
                      and all(e <= s for e, s in zip(b, a[1:], strict=False)))
                if not ok:
                    raise ConfigError(field, f"device {key!r}: allowed: active and inactive lists of equal length, "
                                      "ordered windows 0 <= active[k] <= inactive[k] <= finish_time (> 0)")
            devices.append(d)
        return devices

    def draw(self, num_clients, seed):
        picked = [self.devices[i % len(self.devices)] for i in range(num_clients)]
        speed = np.array([1000.0 / (3.0 * d["computation"]) for d in picked])
        bandwidth = np.array([d["communication"] * 1000.0 / 8.0 for d in picked])
        windows = tuple(Windows(tuple(map(float, d["active"])), tuple(map(float, d["inactive"])),
                                float(d["finish_time"])) if "active" in d else None for d in picked)
        return Devices(speed, bandwidth, np.full(num_clients, self.latency), windows)

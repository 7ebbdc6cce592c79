"""Clients in long-lived Ray actors, for scale.

Each actor (:class:`ClientWorker`) holds a group of clients for the whole run: their modules,
optimizers and generators never leave it between rounds. Every call goes to all actors at once and
the driver waits for all of them; what comes back is small: training losses, logits, and the
payloads of ``on_client_private_end`` (e.g. UWA's Gaussian mixtures). The aggregator runs on the
driver. Inside an actor the clients train together with a :class:`VectorizedExecutor` (default) or
one at a time with a :class:`SequentialExecutor` (``actor_executor``); with the sequential one a Ray
run reproduces a sequential run with the same seed exactly, with the vectorized one within float
tolerance (tests/test_ray_executor.py).

Data goes down to the actors once per tensor: the driver hands each distinct tensor (a client's
training split, the public set, this round's teacher) to an actor the first time the actor needs it
and afterwards names it by a token; the actor keeps it on its device until the driver no longer
holds the tensor. Public logits that an actor computed stay there for the client hooks.

Client state: the authoritative copy lives in the actors during a run. :meth:`RayExecutor.fetch_states`
copies it into the driver's ``ClientModule`` objects (``loop.clients``), :meth:`push_states` copies
the driver's into the actors; :meth:`teardown` (called by ``FederationLoop.fit`` at the end) fetches,
then frees the actors, so ``loop.clients`` hold the final clients after ``fit``.

``ray`` is imported only when a RayExecutor is set up: fdlit works without it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import site
import sys
import sysconfig
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from fdlit.errors import ConfigError
from fdlit.execution.executor import ClientExecutor, SequentialExecutor
from fdlit.execution.tokens import Tokens
from fdlit.execution.vectorized import VectorizedExecutor
from fdlit.methods.base import LegacyClientPart

if TYPE_CHECKING:
    from lightning.fabric import Fabric

    from fdlit.clients import ClientModule

INSTALL_HINT = "pip install 'fdlit[ray]'  (or: pip install ray)"


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            f"fdlit.execution.RayExecutor needs the 'ray' package, which is not installed ({exc}). "
            f"Install it with: {INSTALL_HINT}"
        ) from None
    return ray


def plan_actors(
    num_clients: int,
    cluster_cpus: float,
    cluster_gpus: float,
    num_cpus_per_actor: float = 1.0,
    num_gpus_per_client: float = 0.0,
    num_gpus_per_actor: float | None = None,
    clients_per_actor: int | None = None,
) -> tuple[int, int, float]:
    """How many clients each actor holds, how many actors, and the GPUs each actor asks for.

    Every actor must be placed at once (clients live in them for the whole run), so a plan the
    cluster cannot hold is an error here rather than a run that waits forever for resources.
    Default grouping: as many actors as the cluster's CPUs allow (``num_cpus_per_actor`` each),
    clients split evenly (``size`` is the largest group; sizes differ by at most one); if that does not fit the GPUs, fewer, larger actors. An actor asks for
    ``num_gpus_per_actor``, or ``num_gpus_per_client`` times its clients; a fractional ask must fit
    within one GPU, so a GPU holds ``floor(1 / ask)`` actors.
    """
    if num_gpus_per_actor is not None and num_gpus_per_client:
        raise ConfigError("federation.executor", "set num_gpus_per_client or num_gpus_per_actor, not both")
    eps = 1e-9
    if clients_per_actor is not None:
        candidates = [clients_per_actor]
    else:
        slots = int(cluster_cpus // num_cpus_per_actor + eps) if num_cpus_per_actor > 0 else num_clients
        candidates = range(math.ceil(num_clients / max(1, min(num_clients, slots))), num_clients + 1)
    for size in candidates:
        actors = math.ceil(num_clients / size)
        size = math.ceil(num_clients / actors)  # even groups: 4 clients on 3 slots -> 2 + 2
        actors = math.ceil(num_clients / size)
        gpus = num_gpus_per_actor if num_gpus_per_actor is not None else num_gpus_per_client * size
        gpus = round(gpus, 4)  # Ray's resolution is 1e-4
        if gpus > 1 and gpus != int(gpus):
            continue  # Ray accepts fractions <= 1 or whole numbers
        if actors * num_cpus_per_actor > cluster_cpus + eps:
            continue
        whole_gpus = int(cluster_gpus + eps)
        if gpus == 0 or (gpus <= 1 and actors <= int(1 / gpus + eps) * whole_gpus) or (
                gpus > 1 and actors * gpus <= cluster_gpus + eps):
            return size, actors, gpus
    raise ConfigError(
        "federation.executor",
        f"no grouping of {num_clients} clients"
        + (f" into actors of {clients_per_actor}" if clients_per_actor is not None else "")
        + f" fits the Ray cluster ({cluster_cpus:g} CPUs, {cluster_gpus:g} GPUs) with {num_cpus_per_actor:g} CPU "
        f"per actor and {num_gpus_per_actor if num_gpus_per_actor is not None else num_gpus_per_client:g} GPU per "
        f"{'actor' if num_gpus_per_actor is not None else 'client'}; Ray accepts GPU fractions <= 1 or whole numbers",
    )


class ClientWorker:
    """One actor's clients. Plain class: :class:`RayExecutor` turns it into a Ray actor."""

    def __init__(self, clients: list[ClientModule], precision: str, num_threads: int, eval_batch_size: int,
                 actor_executor: str = "vectorized"):
        import ray

        from fdlit.execution.allocator import keep_large_blocks

        keep_large_blocks()  # the actor's process trains its clients, as a fit does
        torch.set_num_threads(num_threads)
        gpu = bool(ray.get_gpu_ids()) and torch.cuda.is_available()
        from fdlit.execution.device import make_device

        self.fabric = make_device("cuda" if gpu else "cpu", precision)
        self.clients = {c.client_id: c for c in clients}
        # the same code as an in-process run of that executor
        executor_cls = VectorizedExecutor if actor_executor == "vectorized" else SequentialExecutor
        self.executor = executor_cls(eval_batch_size)
        self.executor.setup(self.fabric, clients)
        self.objects: dict[int, Any] = {}  # token -> tensor on this device, or ClientData

    def _receive(self, new: dict[int, Any], live: Sequence[int]) -> None:
        import ray

        for token, ref in new.items():
            obj = ray.get(ref)
            # a copy on this device: the object-store buffer may be freed once the driver drops it
            self.objects[token] = obj.to(self.fabric.device, copy=True) if isinstance(obj, torch.Tensor) else obj
        live = set(live)
        for token in [t for t in self.objects if t not in live]:
            del self.objects[token]

    def train(self, ids, phase, data_tokens, epochs, batch_size, new, live) -> list[float]:
        self._receive(new, live)
        datasets = [(self.objects[x], self.objects[t]) for x, t in data_tokens]
        return self.executor.train([self.clients[i] for i in ids], phase, datasets, epochs, batch_size)

    def predict(self, ids, x_token, new, live) -> torch.Tensor:
        self._receive(new, live)
        return self.executor.predict([self.clients[i] for i in ids], self.objects[x_token]).cpu()

    def client_hook(self, hook, ids, part, info, public_x_token, received_tokens, data_tokens, release,
                    new, live) -> list[dict]:
        """``part.<hook>`` for these clients; ``upload`` (with its ``release``) is the whole upload
        step: public inference, the method's upload and the privacy release, here on the actor."""
        self._receive(new, live)
        info = dataclasses.replace(info, public_x=self.objects[public_x_token])
        received = {k: self.objects[t] for k, t in received_tokens.items()}
        clients, data = [self.clients[i] for i in ids], [self.objects[d] for d in data_tokens]
        if release is not None:
            payloads = self.executor.upload(part, info, clients, data, received, release)
        else:
            payloads = self.executor.client_hook(hook, part, info, clients, data, received)
        return [{k: v.cpu() for k, v in p.items()} for p in payloads]

    def get_states(self, ids) -> list[dict]:
        return [_to_cpu(self.clients[i].client_state()) for i in ids]

    def set_states(self, ids, states) -> None:
        for i, state in zip(ids, states, strict=True):
            self.clients[i].load_client_state(state)

    def cpu_seconds(self) -> float:
        """CPU seconds of this actor's process so far (every thread, start-up included)."""
        return time.process_time()

    def where(self) -> dict:
        """Diagnostics: which fdlit this process imported, its device and threads."""
        import fdlit

        return {"fdlit": fdlit.__file__, "device": str(self.fabric.device), "threads": torch.get_num_threads(),
                "pid": os.getpid()}


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def _ship_code_by_value(ray, classes) -> None:
    """Classes from the user's own modules (a test file, a folder of scripts) are pickled by value,
    so actors need not be able to import them; fdlit and installed packages travel by name."""
    installed = [Path(p).resolve() for p in (*site.getsitepackages(), sysconfig.get_paths()["stdlib"])]
    for cls in {base for c in classes for base in c.__mro__}:  # a user's subclass of a user's class, too
        name = cls.__module__
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if name == "__main__" or name.split(".")[0] == "fdlit" or file is None:
            continue  # __main__ is pickled by value anyway
        path = Path(file).resolve()
        if not any(path.is_relative_to(p) for p in installed):
            ray.cloudpickle.register_pickle_by_value(module)


def shipped_classes(part) -> set[type]:
    """The classes a client part travels with (a deprecated rule's adapter carries the rule)."""
    if part is None:
        return set()
    inner = getattr(part, "inner", None)  # a wrapped part (adversarial clients) carries the method's part
    return {type(part), *((type(part.method),) if isinstance(part, LegacyClientPart) else ()),
            *shipped_classes(inner), *((type(part.attack),) if hasattr(part, "attack") else ())}


class RayExecutor(ClientExecutor):
    """Clients in long-lived Ray actors, a group of clients per actor, on fractional GPUs.

    Args:
        address: null starts a local Ray with ``num_cpus`` CPUs (stopped again at the end of the
            run); ``auto`` joins the cluster started on this machine with ``ray start --head``;
            ``ray://host:10001`` joins a remote cluster (Ray Client). An already initialised Ray
            (``ray.init`` in the calling program) is used as it is.
        num_cpus: CPUs of the local Ray started when ``address`` is null; null: all of this machine's.
        num_cpus_per_actor: CPUs each actor reserves; also its torch thread count.
        num_gpus_per_client: GPU share of one client; an actor asks for this times its clients.
        num_gpus_per_actor: GPU share of one actor regardless of its clients (instead of the above).
        clients_per_actor: clients per actor; null spreads the clients over as many actors as the
            cluster's CPUs allow (``num_cpus_per_actor`` each).
        eval_batch_size: batch size of inference (as SequentialExecutor).
        actor_executor: how an actor runs its clients: ``vectorized`` (together, as
            :class:`VectorizedExecutor`; clients it cannot vectorize run one at a time) or
            ``sequential`` (one at a time: bit-identical to an in-process sequential run).
        runtime_env: extra Ray runtime environment of the actors (e.g. ``{"py_modules": [...]}``
            when the cluster's nodes do not have fdlit installed). ``PYTHONPATH`` always starts with
            the folder the driver imported fdlit from, so actors on this machine run the same code.
        startup_timeout_s: how long to wait for every actor to start (resources, imports) before
            giving up with an error instead of waiting forever.
    """

    def __init__(
        self,
        address: str | None = None,
        num_cpus: int | None = None,
        num_cpus_per_actor: float = 1.0,
        num_gpus_per_client: float = 0.0,
        num_gpus_per_actor: float | None = None,
        clients_per_actor: int | None = None,
        eval_batch_size: int = 1024,
        runtime_env: dict | None = None,
        startup_timeout_s: float = 600.0,
        actor_executor: Literal["vectorized", "sequential"] = "vectorized",
    ):
        if actor_executor not in ("vectorized", "sequential"):
            raise ConfigError("federation.executor.actor_executor",
                              f"allowed: 'vectorized', 'sequential'; got {actor_executor!r}")
        if num_cpus_per_actor < 0 or num_gpus_per_client < 0 or (num_gpus_per_actor or 0) < 0:
            raise ConfigError("federation.executor", "resource amounts must be >= 0")
        if clients_per_actor is not None and clients_per_actor < 1:
            raise ConfigError("federation.executor.clients_per_actor", f"must be >= 1, got {clients_per_actor}")
        if num_gpus_per_actor is not None and num_gpus_per_client:
            raise ConfigError("federation.executor", "set num_gpus_per_client or num_gpus_per_actor, not both")
        self.address = address
        self.num_cpus = num_cpus
        self.num_cpus_per_actor = num_cpus_per_actor
        self.num_gpus_per_client = num_gpus_per_client
        self.num_gpus_per_actor = num_gpus_per_actor
        self.clients_per_actor = clients_per_actor
        self.eval_batch_size = eval_batch_size
        self.runtime_env = dict(runtime_env or {})
        self.startup_timeout_s = startup_timeout_s
        self.actor_executor = actor_executor
        self.actors: list = []
        self._actor_cpu: list[float] = []  # each actor's CPU seconds when the last round ended
        self._started_ray = False

    # ------------------------------------------------------------------ set-up and teardown
    def configure(self, compile_backend: str | None = None) -> None:
        if compile_backend is not None:  # the actors build their own executors from pickled clients
            raise ConfigError("federation.compile", "is not available with RayExecutor; use the sequential or "
                              "vectorized executor")

    def setup(self, fabric: Fabric, clients: Sequence[ClientModule]) -> None:
        ray = import_ray()
        if self.actors:  # a second fit with the same executor: start over
            self.teardown([])
        if not ray.is_initialized():
            if self.address is None:
                ray.init(num_cpus=self.num_cpus, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=self.address, log_to_driver=False)
            self._started_ray = True
        self.device = fabric.device
        resources = ray.cluster_resources()
        try:
            self.plan = plan_actors(
                len(clients), resources.get("CPU", 0.0), resources.get("GPU", 0.0), self.num_cpus_per_actor,
                self.num_gpus_per_client, self.num_gpus_per_actor, self.clients_per_actor,
            )
        except ConfigError:
            self.teardown([])  # stop a Ray this executor started
            raise
        _, n_actors, gpus = self.plan
        env = dict(self.runtime_env)
        env_vars = dict(env.get("env_vars") or {})
        import fdlit

        code_root = str(Path(fdlit.__file__).resolve().parent.parent)
        # actors import the same fdlit as the driver (not e.g. another checkout installed in the venv)
        env_vars["PYTHONPATH"] = os.pathsep.join(p for p in (code_root, env_vars.get("PYTHONPATH"), "${PYTHONPATH}") if p)
        env["env_vars"] = env_vars
        actor_cls = ray.remote(ClientWorker).options(
            num_cpus=self.num_cpus_per_actor, num_gpus=gpus, runtime_env=env,
        )
        precision = fabric.strategy.precision.precision
        threads = max(1, int(self.num_cpus_per_actor))
        # group sizes differ by at most one (100 clients on 15 actors: 10 of 7, 5 of 6)
        base, extra = divmod(len(clients), n_actors)
        bounds = list(itertools.accumulate([0] + [base + (a < extra) for a in range(n_actors)]))
        groups = [list(clients[bounds[a]:bounds[a + 1]]) for a in range(n_actors)]
        _ship_code_by_value(ray, {type(m) for c in clients for m in c.modules()}
                            | {k for c in clients for k in shipped_classes(c.method_part)})
        # the driver built the clients (same init as a sequential run) and ships them once, whole
        self.actors = [actor_cls.remote(g, precision, threads, self.eval_batch_size, self.actor_executor)
                       for g in groups]
        self._actor_of = {c.client_id: a for a, g in enumerate(groups) for c in g}
        self._token = Tokens()
        self._has: list[set[int]] = [set() for _ in self.actors]
        # fail here, not mid-round, if an actor cannot start (no resources, cannot import fdlit)
        pending = [a.where.remote() for a in self.actors]
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=self.startup_timeout_s)
        if len(ready) < len(pending):
            self.teardown([])
            raise RuntimeError(
                f"only {len(ready)} of {n_actors} Ray actors started within {self.startup_timeout_s:g} s "
                f"(each asks for {self.num_cpus_per_actor:g} CPU, {gpus:g} GPU; `ray status` shows what is free)"
            )
        try:
            ray.get(ready)  # an actor that failed to start raises here
        except Exception:
            self.teardown([])
            raise

    def timing_metrics(self) -> dict[str, object]:
        """``time/actor_cpu_s``: each actor's CPU seconds since the last round ended (round 1: since
        its process started, Ray's and fdlit's imports included); ``time/actors_cpu_s``: their sum.
        The driver's own CPU is not in them."""
        if not self.actors:
            return {}
        ray = import_ray()
        now = ray.get([actor.cpu_seconds.remote() for actor in self.actors])
        spent = [n - p for n, p in zip(now, self._actor_cpu or [0.0] * len(now), strict=True)]
        self._actor_cpu = now
        return {"time/actor_cpu_s": spent, "time/actors_cpu_s": sum(spent)}

    def teardown(self, clients: Sequence[ClientModule]) -> None:
        """Copy the final client state into ``clients`` (the driver's), free the actors, and stop
        the Ray that this executor started."""
        if not self.actors and not self._started_ray:
            return
        ray = import_ray()
        run_failed = sys.exc_info()[0] is not None  # called from the loop's `finally` while an error propagates
        try:
            if clients and self.actors:
                self.fetch_states(clients)
        except Exception as exc:
            if not run_failed:
                raise
            # do not hide the run's own error (e.g. an actor that died) behind this one
            warnings.warn(f"RayExecutor: could not fetch the client state after the run failed: {exc!r}")
        finally:
            for actor in self.actors:
                ray.kill(actor)
            self.actors = []
            self._actor_cpu = []
            if self._started_ray:
                ray.shutdown()
                self._started_ray = False

    def fetch_states(self, clients: Sequence[ClientModule]) -> list[dict]:
        """Load the actors' client state into the driver's ``clients``; returns the states."""
        if not self.actors:  # after teardown the final state is already in ``clients``
            return [c.client_state() for c in clients]
        ray = import_ray()
        groups = self._groups(clients)
        results = ray.get([self.actors[a].get_states.remote([clients[j].client_id for j in idx])
                           for a, idx in groups.items()])
        states: list[dict | None] = [None] * len(clients)
        for idx, got in zip(groups.values(), results, strict=True):
            for j, state in zip(idx, got, strict=True):
                clients[j].load_client_state(state)
                states[j] = state
        return states

    def push_states(self, clients: Sequence[ClientModule]) -> None:
        """Load the driver's client state (e.g. from a checkpoint) into the actors."""
        ray = import_ray()
        groups = self._groups(clients)
        ray.get([self.actors[a].set_states.remote([clients[j].client_id for j in idx],
                                                   [_to_cpu(clients[j].client_state()) for j in idx])
                 for a, idx in groups.items()])

    # ------------------------------------------------------------------ shipping data down once
    def _shipment(self, objects_by_actor: dict[int, list]) -> dict[int, tuple[dict, list[int]]]:
        """Per actor: the objects it lacks (as object refs, each put once) and the live tokens."""
        ray = import_ray()
        tokens = {a: [(self._token(obj), obj) for obj in objects] for a, objects in objects_by_actor.items()}
        live = self._token.live()  # objects the driver dropped: actors may drop them too
        put: dict[int, Any] = {}
        out = {}
        for a, pairs in tokens.items():
            self._has[a].intersection_update(live)
            new = {}
            for token, obj in pairs:
                if token not in self._has[a]:
                    if token not in put:
                        put[token] = ray.put(obj.detach().cpu() if isinstance(obj, torch.Tensor) else obj)
                    new[token] = put[token]
                    self._has[a].add(token)
            out[a] = (new, live)
        return out

    def _groups(self, clients: Sequence[ClientModule]) -> dict[int, list[int]]:
        """Positions in ``clients`` grouped by the actor holding each client (order kept)."""
        groups: dict[int, list[int]] = {}
        for j, c in enumerate(clients):
            groups.setdefault(self._actor_of[c.client_id], []).append(j)
        return groups

    # ------------------------------------------------------------------ the executor interface
    def train(self, clients, phase, datasets, epochs, batch_size):
        ray = import_ray()
        groups = self._groups(clients)
        ship = self._shipment({a: [t for j in idx for t in datasets[j]] for a, idx in groups.items()})
        calls = [
            self.actors[a].train.remote(
                [clients[j].client_id for j in idx], phase,
                [(self._token(datasets[j][0]), self._token(datasets[j][1])) for j in idx],
                epochs, batch_size, *ship[a],
            )
            for a, idx in groups.items()
        ]
        losses = [math.nan] * len(clients)
        members = dict(zip(calls, groups.values(), strict=True))
        pending, done = list(calls), 0
        while pending:  # as each actor finishes its clients: the progress bar advances per actor
            ready, pending = ray.wait(pending, num_returns=1)
            for idx, got in ((members[c], ray.get(c)) for c in ready):
                for j, loss in zip(idx, got, strict=True):
                    losses[j] = loss
                done += len(idx)
            self.report(phase, done, len(clients))
        return losses

    def predict(self, clients, x):
        ray = import_ray()
        groups = self._groups(clients)
        ship = self._shipment({a: [x] for a in groups})
        token = self._token(x)
        calls = [self.actors[a].predict.remote([clients[j].client_id for j in idx], token, *ship[a])
                 for a, idx in groups.items()]
        out: list[torch.Tensor | None] = [None] * len(clients)
        for idx, got in zip(groups.values(), ray.get(calls), strict=True):
            for j, z in zip(idx, got, strict=True):
                out[j] = z
        return torch.stack(out).to(x.device)

    def client_hook(self, hook, part, info, clients, client_data, received, public_logits=None):
        if public_logits is not None:  # the actors make the public logits themselves (``upload``)
            raise NotImplementedError("RayExecutor.client_hook: public logits come from the actors' own upload step")
        return self._on_actors(hook, part, info, clients, client_data, received, None)

    def upload(self, part, info, clients, client_data, received, release):
        return self._on_actors("upload", part, info, clients, client_data, received, release)

    def _on_actors(self, hook, part, info, clients, client_data, received, release):
        ray = import_ray()
        groups = self._groups(clients)
        _ship_code_by_value(ray, shipped_classes(part))  # the method's client part only, never its server part
        # tensors go down once (tokens); the info travels without its public inputs
        shared = [info.public_x, *received.values()]
        ship = self._shipment({a: [*shared, *(client_data[j] for j in idx)] for a, idx in groups.items()})
        bare = dataclasses.replace(info, public_x=torch.empty(0))
        received_tokens = {k: self._token(v) for k, v in received.items()}
        calls = [
            self.actors[a].client_hook.remote(
                hook, [clients[j].client_id for j in idx], part, bare, self._token(info.public_x), received_tokens,
                [self._token(client_data[j]) for j in idx], release, *ship[a],
            )
            for a, idx in groups.items()
        ]
        out: list[dict | None] = [None] * len(clients)
        for idx, got in zip(groups.values(), ray.get(calls), strict=True):
            for j, payload in zip(idx, got, strict=True):
                out[j] = {k: v.to(self.device) for k, v in payload.items()}
        return out

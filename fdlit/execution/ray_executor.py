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
copies it into the driver's ``ClientModule`` objects (``ClientSide.clients``), :meth:`push_states` copies
the driver's into the actors; :meth:`teardown` (called by ``FederationLoop.fit`` at the end) fetches,
then frees the actors, so ``ClientSide.clients`` hold the final clients after ``fit``.

``ray`` is imported only when a RayExecutor is set up: fdlit works without it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from fdlit.errors import ConfigError
from fdlit.execution.executor import ClientExecutor
from fdlit.execution.ray_actor import ClientWorker, HookCall, ship_code_by_value, shipped_classes, to_cpu
from fdlit.execution.ray_plan import plan_actors
from fdlit.execution.steps import report
from fdlit.execution.tokens import Tokens

if TYPE_CHECKING:
    from lightning.fabric import Fabric

    from fdlit.clients import ClientModule

__all__ = ["INSTALL_HINT", "ClientWorker", "RayExecutor", "import_ray", "plan_actors", "shipped_classes"]

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
        ship_code_by_value(ray, {type(m) for c in clients for m in c.modules()}
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

    def logged_values(self) -> dict[str, list[float]]:
        """What the clients logged, gathered from every actor."""
        merged: dict[str, list[float]] = {}
        if self.actors:
            for values in import_ray().get([actor.logged_values.remote() for actor in self.actors]):
                for name, v in values.items():
                    merged.setdefault(name, []).extend(v)
        return merged

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
                                                   [to_cpu(clients[j].client_state()) for j in idx])
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
            report(self, phase, done, len(clients))
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
        ship_code_by_value(ray, shipped_classes(part))  # the method's client part only, never its server part
        # tensors go down once (tokens); the info travels without its public inputs
        shared = [info.public_x, *received.values()]
        ship = self._shipment({a: [*shared, *(client_data[j] for j in idx)] for a, idx in groups.items()})
        bare = dataclasses.replace(info, public_x=torch.empty(0))
        received_tokens = {k: self._token(v) for k, v in received.items()}
        calls = [
            self.actors[a].client_hook.remote(
                HookCall(hook, [clients[j].client_id for j in idx], part, bare, self._token(info.public_x),
                         received_tokens, [self._token(client_data[j]) for j in idx], release), *ship[a],
            )
            for a, idx in groups.items()
        ]
        out: list[dict | None] = [None] * len(clients)
        for idx, got in zip(groups.values(), ray.get(calls), strict=True):
            for j, payload in zip(idx, got, strict=True):
                out[j] = payload.with_arrays({k: v.to(self.device) for k, v in payload.items()})
        return out

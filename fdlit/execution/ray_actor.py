"""What runs inside a Ray actor (:class:`ClientWorker`: a group of clients with its own executor),
and which classes travel to the actors by value."""

from __future__ import annotations

import dataclasses
import os
import site
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fdlit.execution import steps
from fdlit.execution.executor import SequentialExecutor
from fdlit.execution.vectorized import VectorizedExecutor
from fdlit.methods.base import ClientPart

if TYPE_CHECKING:
    from fdlit.clients import ClientModule


@dataclasses.dataclass(frozen=True)
class HookCall:
    """A client part's hook for some of an actor's clients; tensors named by the tokens they were shipped under."""

    hook: str
    ids: list[int]
    part: ClientPart
    info: Any  # the round's FederationInfo, without its public inputs (``public_x_token`` names them)
    public_x_token: int
    received_tokens: dict[str, int]
    data_tokens: list[int]
    release: Any = None  # the privacy release of an upload step (fdlit.privacy.client_release), or None


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

    def client_hook(self, call: HookCall, new, live) -> list[dict]:
        """``part.<hook>`` for these clients; ``upload`` (with its ``release``) is the whole upload
        step: public inference, the method's upload and the privacy release, here on the actor."""
        self._receive(new, live)
        info = dataclasses.replace(call.info, public_x=self.objects[call.public_x_token])
        received = {k: self.objects[t] for k, t in call.received_tokens.items()}
        clients, data = [self.clients[i] for i in call.ids], [self.objects[d] for d in call.data_tokens]
        if call.release is not None:
            payloads = steps.upload(self.executor, call.part, info, clients, data, received, call.release)
        else:
            payloads = self.executor.client_hook(call.hook, call.part, info, clients, data, received)
        return [p.with_arrays({k: v.cpu() for k, v in p.items()}) for p in payloads]  # metrics and config kept

    def get_states(self, ids) -> list[dict]:
        return [to_cpu(self.clients[i].client_state()) for i in ids]

    def set_states(self, ids, states) -> None:
        for i, state in zip(ids, states, strict=True):
            self.clients[i].load_client_state(state)

    def logged_values(self) -> dict[str, list[float]]:
        """What this actor's clients logged (``self.log``) since the last call."""
        return steps.logged_values(self.executor)

    def cpu_seconds(self) -> float:
        """CPU seconds of this actor's process so far (every thread, start-up included)."""
        return time.process_time()

    def where(self) -> dict:
        """Diagnostics: which fdlit this process imported, its device and threads."""
        import fdlit

        return {"fdlit": fdlit.__file__, "device": str(self.fabric.device), "threads": torch.get_num_threads(),
                "pid": os.getpid()}


def to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def ship_code_by_value(ray, classes) -> None:
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


def shipped_classes(part: ClientPart | None) -> set[type]:
    """The classes a client part travels with (a wrapper's carry the part it wraps)."""
    return set() if part is None else part.carried_classes()


"""The clients' side of a federation: the clients, where they live (the executor), their data and the
method's client part. The round reaches clients only through these steps; where the executor keeps
them (in process, vmapped, Ray actors, Flower nodes) is its business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from fdlit.execution import steps
from fdlit.execution.executor import ClientExecutor, ClientStep
from fdlit.messages import Message
from fdlit.methods.client_part import ClientPart
from fdlit.methods.contexts import FederationInfo

if TYPE_CHECKING:
    from fdlit.clients.client import ClientModule
    from fdlit.data.federated import ClientData
    from fdlit.federation.round_facts import RoundPlan


class ClientSide:
    """Every client of the federation and the steps the round asks of them.

    Args:
        executor: where the clients live (``fdlit.execution.ClientExecutor``).
        clients: one ``ClientModule`` per client (the loop's copies; remote executors keep theirs).
        client_data: each client's data (``fdlit.data.ClientData``).
        method_part: the method's client part every client carries.
        private: each client's private (inputs, labels) on the run's device.
        release: the privacy layer's client step (clip, noise, encode), or None when nothing is sent.
    """

    def __init__(self, executor: ClientExecutor, clients: list[ClientModule | None], client_data: list[ClientData],
                 method_part: ClientPart,
                 private: list[tuple[torch.Tensor, torch.Tensor]],
                 release: Callable[[int, int, dict], dict] | None = None):
        self.executor, self.clients, self.client_data = executor, clients, client_data
        self.method_part, self.private, self.release = method_part, private, release
        # clients a step may have changed since the last evaluation (None: any): an evaluation measures
        # only these and keeps the others' accuracies (no network state measured twice)
        self._changed: set[int] | None = None

    def _touched(self, ids: Sequence[int] | range) -> None:
        if self._changed is not None:
            self._changed.update(ids)

    def evaluated(self) -> None:
        """Every client was just measured: from here on, only the clients a step reaches have changed."""
        self._changed = set()

    def forget_evaluation(self) -> None:
        """The clients' states were replaced outside a step: the next evaluation measures every client."""
        self._changed = None

    def changed(self) -> frozenset[int] | None:
        """The clients a step may have changed since the last evaluation, with those that could not be
        reached (None: any client may have)."""
        if self._changed is None:
            return None
        return frozenset(self._changed) | self.executor.unreachable()

    def __len__(self) -> int:
        return len(self.clients)

    @staticmethod
    def subset(items: Sequence, ids: Sequence[int]) -> Sequence:
        """``items`` (one per client) of the clients ``ids``; the list itself when that is everyone."""
        return items if len(ids) == len(items) else [items[i] for i in ids]

    def train(self, ids: Sequence[int], phase: str, datasets: Sequence[tuple[torch.Tensor, torch.Tensor]],
              epochs: int, batch_size: int) -> list[float]:
        """Clients ``ids`` train one phase on their ``datasets``; their mean losses."""
        self._touched(ids)
        return self.executor.train(self.subset(self.clients, ids), phase, datasets, epochs, batch_size)

    def round_step(self, plan: RoundPlan, datasets: Sequence[tuple[torch.Tensor, torch.Tensor]], epochs: int,
                   batch_size: int, upload: str | None, info: FederationInfo | None, received: dict
                   ) -> tuple[list[float], dict[int, Message]]:
        """The round's client step (:class:`~fdlit.execution.executor.ClientStep`): the sampled clients
        train their private phase on ``datasets``; then the arriving clients send what ``upload``
        names. Returns the mean losses and each uploading client's message by id (a client whose node
        stopped answering has none)."""
        r, trained, uploading = plan.round, plan.sampled, plan.arrived
        self._touched([*trained, *uploading])  # an upload runs the network (batch norm's statistics)
        step = ClientStep(r, self.subset(self.clients, trained), datasets, epochs, batch_size, upload,
                          self.subset(self.clients, uploading), self.subset(self.client_data, uploading),
                          self.method_part, info, received, self.release)
        losses, messages = steps.client_step(self.executor, step)
        if not messages:
            return losses, {}
        lost = self.executor.unreachable()
        return losses, {i: m for i, m in zip(uploading, messages, strict=True) if i not in lost}

    def predict(self, x: torch.Tensor, ids: Sequence[int] | None = None) -> torch.Tensor:
        """Logits of the clients ``ids`` (None: all) on ``x``: M x N x C."""
        return self.executor.predict(self.clients if ids is None else self.subset(self.clients, ids), x)

    def correct(self, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor | None = None,
                ids: Sequence[int] | None = None) -> torch.Tensor:
        """The correctness of every client (or of the clients ``ids``) on (x, y), or on its ``rows``:
        M x N of 1.0 / 0.0, NaN rows for clients that could not be reached (evaluation)."""
        return steps.correct(self.executor, self.clients if ids is None else self.subset(self.clients, ids), x, y, rows)

    def _hook(self, hook: str, info: FederationInfo, ids: Sequence[int], received: dict) -> list[dict]:
        self._touched(ids)
        return self.executor.client_hook(hook, self.method_part, info, self.subset(self.clients, ids),
                                         self.subset(self.client_data, ids), received)

    def setup_step(self, info: FederationInfo) -> list[dict]:
        """Round 0: every client's set-up message (the client part's ``setup``)."""
        return self._hook("setup", info, range(len(self.clients)), {})

    def receive_step(self, info: FederationInfo, received: Mapping | dict[int, Mapping]) -> None:
        """Every client takes in what the server sent it (the client part's ``receive``): one message for
        all, or one per client id; clients sent the same message receive it together."""
        if all(isinstance(k, str) for k in received):  # one message for everyone
            self._hook("receive", info, range(len(self.clients)), dict(received))
            return
        groups: dict[int, tuple[Mapping, list[int]]] = {}
        for i, message in received.items():
            groups.setdefault(id(message), (message, []))[1].append(i)
        for message, ids in groups.values():
            self._hook("receive", info, ids, dict(message))

    def distil(self, ids: Sequence[int], teachers: Sequence[tuple[torch.Tensor, torch.Tensor]], epochs: int,
               batch_size: int) -> list[float]:
        """The public phase of the clients ``ids``, each from the (public inputs, targets) it was sent
        (its training set: the client part's ``distillation_set``, made where the client lives)."""
        self._touched(ids)
        return steps.distil(self.executor, self.method_part, self.subset(self.clients, ids), teachers,
                                    self.subset(self.private, ids), epochs, batch_size)

    @property
    def masking(self) -> Callable | None:
        """Secure aggregation where the clients live (fdlit.privacy.UploadPrivacy.receive's ``masking``), or
        None: its clients' half runs in the server's process."""
        return self.executor.secure_sum

    def arrivals(self, count: int) -> list[int] | None:
        """Real time (an executor whose clients run their jobs on their own, a deployment): the ``count``
        clients whose uploads arrived first, waited for; None where jobs run when the round asks."""
        return steps.arrivals(self.executor, count)

    def unreachable(self) -> frozenset[int]:
        """Clients whose node stopped answering (a deployment): dropouts of the round."""
        return self.executor.unreachable()

    def state_dict(self) -> list[dict]:
        """Every client's state, fetched from where it lives."""
        return self.executor.fetch_states(self.clients)

    def checkpoint_states(self) -> list[dict]:
        """Every client's state as the run's checkpoint keeps it (where the executor says)."""
        return steps.checkpoint_states(self.executor, self.clients)

    def load_state_dict(self, states: list[dict]) -> None:
        self._changed = None
        steps.load_states(self.executor, self.clients, states)

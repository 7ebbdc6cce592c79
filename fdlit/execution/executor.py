"""How clients are executed. One replaceable object: the loop never trains a client itself.

The sequential executor runs clients one after another on one device. Client state (module,
optimizer, generator) lives in :class:`~fdlit.clients.ClientModule` and can be moved between
executors with ``client_state`` / ``load_client_state``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from fdlit.data import ClientData
from fdlit.errors import check_finite
from fdlit.messages import Message, as_message
from fdlit.methods.base import ClientContext, ClientPart, FederationInfo
from fdlit.methods.client_part import declared_payload
from fdlit.methods.contexts import DistillationContext

if TYPE_CHECKING:  # Lightning is imported when a client is built, not on import
    from lightning.fabric import Fabric

    from fdlit.clients import ClientModule


# a client state in a checkpoint that names the node file holding it (fdlit.deployment.node_checkpoints)
ON_NODES = "node_checkpoint"


@dataclass
class ClientStep:
    """One round's work of the clients before the server acts (Kovalchuk et al. 2026, Algorithm 1,
    lines 3-7): the sampled clients train on their private data; then the clients whose upload
    arrives send what the round's protocol asks (``upload``: ``"predictions"``, public inference with
    the method's upload and the privacy release; ``"parameters"``, the client part's upload; None:
    nothing). The round hands it to the executor whole, so an executor whose clients live elsewhere
    does it in one exchange."""

    round: int
    trained: Sequence[ClientModule]
    datasets: Sequence[tuple[torch.Tensor, torch.Tensor]]
    epochs: int
    batch_size: int
    upload: str | None = None
    uploading: Sequence[ClientModule] = ()
    upload_data: Sequence[ClientData] = ()
    part: ClientPart | None = None
    info: FederationInfo | None = None
    received: dict[str, torch.Tensor] = field(default_factory=dict)
    release: Callable[[int, int, Message], Message] | None = None


class ClientExecutor:
    """Interface: set clients up on the device, train them for a phase, predict with them."""

    compile_backend: str | None = None  # federation.compile: a torch.compile backend, or None
    # set by the loop: whether a round's receive (every client loading the broadcast, the round's last
    # client work) may wait for the clients' next request (``receive_carried``)
    may_carry_receive = False
    # set by the loop: progress(phase, clients done (may be fractional), clients in the phase)
    progress: Callable[[str, float, int], None] | None = None
    # secure aggregation's clients' half where the clients live (a deployment's nodes): ``secure_sum(r,
    # sampled, clients, threshold, count) -> (SecureSums | None, stats)``; None: in the server's process
    secure_sum: Callable | None = None

    def report(self, phase: str, done: float, total: int) -> None:
        """Tell the loop how far a ``train`` call is (a progress bar advances as clients finish)."""
        if self.progress is not None:
            self.progress(phase, done, total)

    def configure(self, compile_backend: str | None = None) -> None:
        """Options the loop passes before ``setup``: ``compile_backend`` compiles the training
        computation with ``torch.compile(backend=...)``."""
        self.compile_backend = compile_backend

    def setup(self, fabric: Fabric, clients: Sequence[ClientModule]) -> None:
        raise NotImplementedError

    def train(
        self,
        clients: Sequence[ClientModule],
        phase: str,
        datasets: Sequence[tuple[torch.Tensor, torch.Tensor]],
        epochs: int,
        batch_size: int,
    ) -> list[float]:
        """Train client i on datasets[i] = (inputs, targets) for ``epochs``; return mean losses."""
        raise NotImplementedError

    def predict(self, clients: Sequence[ClientModule], x: torch.Tensor) -> torch.Tensor:
        """Logits of every client on x: M x N x C (float32)."""
        raise NotImplementedError

    def correct(self, clients: Sequence[ClientModule], x: torch.Tensor, y: torch.Tensor,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """Evaluation: whether each client's prediction of each sample of ``x`` (or of its ``rows``) is
        its label ``y``, M x N as 1.0 / 0.0; a client that could not be reached (NaN logits) is a row of
        NaN. An executor whose clients live elsewhere may measure this there, so only these bits leave."""
        if rows is not None:
            x, y = x[rows], y[rows]
        logits = self.predict(clients, x)
        out = (logits.argmax(-1) == y).float()
        if len(y):
            out[logits.flatten(1).isnan().all(1)] = math.nan
        return out

    def receive_carried(self) -> bool:
        """Whether the ``receive`` hook just asked for waits to travel with the clients' next request
        (an executor whose clients live elsewhere, where it saves an exchange a round); the evaluation
        after it then comes back with that request, read inside :meth:`carried_evaluation`."""
        return False

    @contextmanager
    def carried_evaluation(self) -> Iterator[None]:
        """Inside: evaluation (``correct``), states and logged values are those of the clients right
        after the carried receive, even when a later request already trained them on (it is sent on
        its own first when no request carried it yet)."""
        yield

    def client_step(self, step: ClientStep) -> tuple[list[float], list[Message]]:
        """The private phase, then what the arriving clients send (see :class:`ClientStep`); returns
        the trained clients' mean losses and the uploads. Non-finite losses stop here, before any
        upload, naming the clients."""
        losses = []
        if step.trained:
            losses = self.train(step.trained, "private", step.datasets, step.epochs, step.batch_size)
            check_finite(losses, step.round, "private", [c.client_id for c in step.trained])
        if step.upload is None or not step.uploading:
            return losses, []
        if step.upload == "predictions":
            return losses, self.upload(step.part, step.info, step.uploading, step.upload_data, step.received,
                                       step.release)
        sent = self.client_hook("upload", step.part, step.info, step.uploading, step.upload_data, step.received)
        return losses, [declared_payload(type(step.part).__name__, step.part.uploads, m) for m in sent]

    def distil(self, part: ClientPart, clients: Sequence[ClientModule],
               teachers: Sequence[tuple[torch.Tensor, torch.Tensor]],
               private: Sequence[tuple[torch.Tensor, torch.Tensor]], epochs: int, batch_size: int) -> list[float]:
        """The public phase (Kovalchuk et al. 2026, Algorithm 1, lines 12-14), where each client lives:
        its training set from the (public inputs, targets) it was sent and its private data (the
        client part's ``distillation_set``), then training on it; mean losses."""
        datasets = [part.distillation_set(DistillationContext(c.client_id, x, t, *p))
                    for c, (x, t), p in zip(clients, teachers, private, strict=True)]
        return self.train(clients, "public", datasets, epochs, batch_size)

    def fetch_states(self, clients: Sequence[ClientModule]) -> list[dict]:
        """Bring the executor's client state into ``clients`` (the loop's); returns the states.
        Executors that train ``clients`` in place (the sequential one) have nothing to bring."""
        return [c.client_state() for c in clients]

    def push_states(self, clients: Sequence[ClientModule]) -> None:
        """Make the executor's clients match ``clients`` (e.g. after loading a checkpoint)."""

    def checkpoint_states(self, clients: Sequence[ClientModule]) -> list[dict]:
        """The clients' states for the run's checkpoint: their states (``fetch_states``); an executor
        whose clients save their own states where they live may name those instead."""
        return self.fetch_states(clients)

    def load_states(self, clients: Sequence[ClientModule], states: Sequence[dict]) -> None:
        """Continue from a checkpoint's client states (``checkpoint_states``)."""
        if any(isinstance(s, dict) and ON_NODES in s for s in states):
            from fdlit.errors import ConfigError

            raise ConfigError("resume", "this checkpoint's client states stay on the deployment's nodes, which "
                              "saved them (node-side checkpoints): continue the run with `fdlit deploy --resume "
                              "RUN_DIR` on those nodes")
        for client, state in zip(clients, states, strict=True):
            client.load_client_state(state)
        self.push_states(clients)

    def teardown(self, clients: Sequence[ClientModule]) -> None:
        """End of a run: hand the final client state back into ``clients`` and free workers."""

    def unreachable(self) -> frozenset[int]:
        """Ids of clients that can no longer be reached (their process or machine is gone); the loop
        drops them from the round as dropouts. None for an executor in the loop's process."""
        return frozenset()

    def timing_metrics(self) -> dict[str, object]:
        """``time/*`` metrics of the round that just ended that the loop cannot see itself (CPU
        spent in other processes); none for an executor that runs in the loop's process."""
        return {}

    def collect_logged(self, clients: Sequence[ClientModule]) -> None:
        """Keep each client's ``self.log`` means of the phase just trained, for :meth:`logged_metrics`."""
        logged = self.__dict__.setdefault("_logged", {})
        for c in clients:
            for name, value in c.take_logged().items():
                logged.setdefault(name, []).append(value)

    def logged_values(self) -> dict[str, list[float]]:
        """Per-client means of what clients logged since the last call (cleared)."""
        return self.__dict__.pop("_logged", {})

    def logged_metrics(self) -> dict[str, float]:
        """``clients/log/<name>``: the round's mean of each value the clients' steps logged."""
        return {f"clients/log/{k}": sum(v) / len(v) for k, v in self.logged_values().items() if v}

    def client_hook(self, hook: str, part: ClientPart, info: FederationInfo, clients: Sequence[ClientModule],
                    client_data: Sequence[ClientData], received: dict[str, torch.Tensor],
                    public_logits: torch.Tensor | None = None) -> list[Message]:
        """Run ``part.<hook>`` (``setup``, ``upload`` or ``receive`` of a method's client part) for
        every client where the client lives; returns what each client sends up (Kovalchuk et al.
        2026, Algorithm 1, lines 6-7)."""
        fn = getattr(part, hook)
        return [
            as_message(fn(ClientContext(info, client, data, None if public_logits is None else public_logits[i],
                                        received, client.method_state)))
            for i, (client, data) in enumerate(zip(clients, client_data, strict=True))
        ]

    def upload(self, part: ClientPart, info: FederationInfo, clients: Sequence[ClientModule],
               client_data: Sequence[ClientData], received: dict[str, torch.Tensor],
               release: Callable[[int, int, Message], Message]) -> list[Message]:
        """The client step that ends Stage 1 (Kovalchuk et al. 2026, Algorithm 1, lines 6-7), where each
        client lives: its logits on the public set, its method's ``upload``, and ``release``
        (fdlit.privacy.client_release: DP clipping and noise, the encoding); returns what each
        client sends, so raw logits leave no client that the privacy section covers."""
        public_logits = self.predict(clients, info.public_x)  # M x N x C
        ids = [c.client_id for c in clients]
        check_finite(list(public_logits), info.round, "public inference", ids)
        extra = self.client_hook("upload", part, info, clients, client_data, received, public_logits)
        owner, n, c = type(part).__name__, len(info.public_x), info.num_classes
        return [release(info.round, i, declared_payload(owner, part.uploads, payload, public_logits[j], n, c))
                for j, (i, payload) in enumerate(zip(ids, extra, strict=True))]


class SequentialExecutor(ClientExecutor):
    """One client at a time on the Fabric device.

    Batches are index slices of on-device tensors, shuffled by the client's own generator; a final
    batch of a single sample is skipped (BatchNorm cannot train on it). Lightning Fabric supplies the
    device, the precision (``bf16-mixed`` autocast, ``16-mixed`` grad scaling) and backward; a
    Trainer per phase was measured to cost more than the work itself on small clients (docs/speed-and-scale.md).
    With plain 32-bit precision Fabric's per-step wrappers do nothing, but cost ~60 us a step
    (measured: 1.26x a plain loop on 20 digits clients), so that case steps the raw module.
    """

    def __init__(self, eval_batch_size: int = 1024):
        self.eval_batch_size = eval_batch_size
        self.fabric: Fabric | None = None
        self._optimizers: dict[int, torch.optim.Optimizer] = {}

    def setup(self, fabric: Fabric, clients: Sequence[ClientModule]) -> None:
        from fdlit.execution.device import is_plain

        self.fabric = fabric
        plain = is_plain(fabric)  # 32-true: no autocast, no grad scaler
        for c in clients:  # Fabric moves the client to its device and dtype and wraps the optimizer
            _, optimizer = fabric.setup(c, c.configure_optimizers())
            # 32-true: the same math without the wrapper's per-call overhead
            self._optimizers[c.client_id] = optimizer.optimizer if plain else optimizer
        self._plain = plain
        self._backward = (lambda loss: loss.backward()) if plain else fabric.backward
        if self.compile_backend is not None:
            for c in clients:  # in place: parameter names and state_dict keys stay the same
                c.model.compile(backend=self.compile_backend)

    def train(self, clients, phase, datasets, epochs, batch_size):
        losses = []
        for client, (x, t) in zip(clients, datasets, strict=True):
            losses.append(self._train_one(client, phase, x, t, epochs, batch_size))
            self.report(phase, len(losses), len(clients))
        self.collect_logged(clients)
        return losses

    def _train_one(self, client: ClientModule, phase: str, x, t, epochs: int, batch_size: int) -> float:
        optimizer = self._optimizers[client.client_id]
        client.set_phase(phase)
        client.train()
        n = len(x)
        total = torch.zeros((), device=x.device)
        steps = 0
        for _ in range(epochs):  # Lightning's hooks: an epoch is one pass over this phase's data
            client.on_train_epoch_start()
            order = torch.randperm(n, generator=client.generator).to(x.device)
            for start in range(0, n, batch_size):
                idx = order[start : start + batch_size]
                if len(idx) < 2 and n > 1:
                    continue
                loss = self._step_loss(client, (x[idx], t[idx]), steps)
                optimizer.zero_grad(set_to_none=True)
                self._backward(loss)
                optimizer.step()
                client.on_train_batch_end(loss, None, steps)
                total += loss.detach()
                steps += 1
            client.on_train_epoch_end()
        return float(total / max(steps, 1))

    def _step_loss(self, client: ClientModule, batch, batch_idx: int) -> torch.Tensor:
        """``client.training_step`` in Fabric's precision: inputs converted and the step run in its
        forward context (autocast, default dtype), as Fabric's module wrapper does for ``forward``."""
        if self._plain:
            return client.training_step(batch, batch_idx)
        precision = self.fabric.strategy.precision
        x, t = batch
        with precision.forward_context():
            return client.training_step((precision.convert_input(x), t), batch_idx)

    def predict(self, clients, x):
        with self.fabric.autocast():
            return torch.stack([c.predict_logits(x, self.eval_batch_size) for c in clients])

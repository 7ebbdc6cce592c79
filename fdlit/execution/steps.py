"""The round's client steps, built on an executor's interface (:class:`~fdlit.execution.ClientExecutor`).

A back-end implements the interface (set-up, train, predict, a client part's hook, the states,
teardown, who is unreachable); every other step is a function here that takes the executor and
does it with those. An executor whose clients live elsewhere may do a step its own way, in fewer
exchanges: it defines a method of the step's name (one of :data:`OWN_WAYS`), and the function here
calls it instead (a Flower deployment's client step is one message a node, its evaluation is
measured on the nodes). Everything a step returns is the same either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import torch

from fdlit.errors import check_finite
from fdlit.execution.executor import (  # noqa: F401  (report, collect_logged: the interface's own, here too)
    ClientExecutor,
    ClientStep,
    collect_logged,
    report,
)
from fdlit.messages import Message
from fdlit.methods.client_part import declared_payload
from fdlit.methods.contexts import DistillationContext

if TYPE_CHECKING:
    from fdlit.clients import ClientModule
    from fdlit.data import ClientData
    from fdlit.methods.base import ClientPart, FederationInfo

# steps an executor may do its own way (a method of that name); the interface's methods aside, no other
OWN_WAYS = ("configure", "client_step", "upload", "distil", "correct", "checkpoint_states", "load_states",
            "timing_metrics", "logged_values", "when_evaluated", "close_waiting", "arrivals", "secure_sum")

T, R = TypeVar("T"), TypeVar("R")

# a client state in a checkpoint that names the node file holding it (fdlit.deployment.node_checkpoints)
ON_NODES = "node_checkpoint"


def own_way(executor: ClientExecutor, step: str) -> Callable | None:
    """The executor's own way of doing ``step`` (a method it defines), or None: the function here does it."""
    return getattr(executor, step, None)


def configure(executor: ClientExecutor, compile_backend: str | None = None) -> None:
    """Options the loop passes before ``setup``: ``compile_backend`` compiles the training computation
    with ``torch.compile(backend=...)``."""
    if own := own_way(executor, "configure"):
        own(compile_backend)
    else:
        executor.compile_backend = compile_backend


def client_step(executor: ClientExecutor, step: ClientStep) -> tuple[list[float], list[Message]]:
    """The private phase, then what the arriving clients send (see :class:`ClientStep`); returns the
    trained clients' mean losses and the uploads. Non-finite losses stop here, before any upload,
    naming the clients."""
    if own := own_way(executor, "client_step"):
        return own(step)
    losses = []
    if step.trained:
        losses = executor.train(step.trained, "private", step.datasets, step.epochs, step.batch_size)
        check_finite(losses, step.round, "private", [c.client_id for c in step.trained])
    if step.upload is None or not step.uploading:
        return losses, []
    if step.upload == "predictions":
        return losses, upload(executor, step.part, step.info, step.uploading, step.upload_data, step.received,
                              step.release)
    sent = executor.client_hook("upload", step.part, step.info, step.uploading, step.upload_data, step.received)
    return losses, [declared_payload(type(step.part).__name__, step.part.uploads, m) for m in sent]


def upload(executor: ClientExecutor, part: ClientPart, info: FederationInfo, clients: Sequence[ClientModule],
           client_data: Sequence[ClientData], received: dict[str, torch.Tensor],
           release: Callable[[int, int, Message], Message]) -> list[Message]:
    """The client step that ends Stage 1 (Kovalchuk et al. 2026, Algorithm 1, lines 6-7), where each
    client lives: its logits on the public set, its method's ``upload``, and ``release``
    (fdlit.privacy.client_release: DP clipping and noise, the encoding); returns what each client
    sends, so raw logits leave no client that the privacy section covers."""
    if own := own_way(executor, "upload"):
        return own(part, info, clients, client_data, received, release)
    public_logits = executor.predict(clients, info.public_x)  # M x N x C
    ids = [c.client_id for c in clients]
    check_finite(list(public_logits), info.round, "public inference", ids)
    extra = executor.client_hook("upload", part, info, clients, client_data, received, public_logits)
    owner, n, c = type(part).__name__, len(info.public_x), info.num_classes
    return [release(info.round, i, declared_payload(owner, part.uploads, payload, public_logits[j], n, c))
            for j, (i, payload) in enumerate(zip(ids, extra, strict=True))]


def distil(executor: ClientExecutor, part: ClientPart, clients: Sequence[ClientModule],
           teachers: Sequence[tuple[torch.Tensor, torch.Tensor]],
           private: Sequence[tuple[torch.Tensor, torch.Tensor]], epochs: int, batch_size: int) -> list[float]:
    """The public phase (Kovalchuk et al. 2026, Algorithm 1, lines 12-14), where each client lives: its
    training set from the (public inputs, targets) it was sent and its private data (the client part's
    ``distillation_set``), then training on it; mean losses."""
    if own := own_way(executor, "distil"):
        return own(part, clients, teachers, private, epochs, batch_size)
    datasets = [part.distillation_set(DistillationContext(c.client_id, x, t, *p))
                for c, (x, t), p in zip(clients, teachers, private, strict=True)]
    return executor.train(clients, "public", datasets, epochs, batch_size)


def correct(executor: ClientExecutor, clients: Sequence[ClientModule], x: torch.Tensor, y: torch.Tensor,
            rows: torch.Tensor | None = None) -> torch.Tensor:
    """Evaluation: whether each client's prediction of each sample of ``x`` (or of its ``rows``) is its
    label ``y``, M x N as 1.0 / 0.0; a client that could not be reached (NaN logits) is a row of NaN.
    An executor whose clients live elsewhere may measure this there, so only these bits leave."""
    if own := own_way(executor, "correct"):
        return own(clients, x, y, rows)
    return predicted_correct(executor, clients, x, y, rows)


def predicted_correct(executor: ClientExecutor, clients: Sequence[ClientModule], x: torch.Tensor, y: torch.Tensor,
                      rows: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`correct` from the executor's predictions, here."""
    if rows is not None:
        x, y = x[rows], y[rows]
    logits = executor.predict(clients, x)
    out = (logits.argmax(-1) == y).float()
    if len(y):
        out[logits.flatten(1).isnan().all(1)] = math.nan
    return out


def checkpoint_states(executor: ClientExecutor, clients: Sequence[ClientModule]) -> list[dict]:
    """The clients' states for the run's checkpoint: their states (``fetch_states``); an executor whose
    clients save their own states where they live may name those instead."""
    if own := own_way(executor, "checkpoint_states"):
        return own(clients)
    return executor.fetch_states(clients)


def load_states(executor: ClientExecutor, clients: Sequence[ClientModule], states: Sequence[dict]) -> None:
    """Continue from a checkpoint's client states (``checkpoint_states``)."""
    if own := own_way(executor, "load_states"):
        return own(clients, states)
    if any(isinstance(s, dict) and ON_NODES in s for s in states):
        from fdlit.errors import ConfigError

        raise ConfigError("resume", "this checkpoint's client states stay on the deployment's nodes, which "
                          "saved them (node-side checkpoints): continue the run with `fdlit deploy --resume "
                          "RUN_DIR` on those nodes")
    for client, state in zip(clients, states, strict=True):
        client.load_client_state(state)
    executor.push_states(clients)


def timing_metrics(executor: ClientExecutor) -> dict[str, object]:
    """``time/*`` metrics of the round that just ended that the loop cannot see itself (CPU spent in
    other processes); none for an executor that runs in the loop's process."""
    own = own_way(executor, "timing_metrics")
    return own() if own else {}


def take_logged(executor: ClientExecutor) -> dict[str, list[float]]:
    """What :func:`collect_logged` kept since the last call (cleared)."""
    return executor.__dict__.pop("_logged", {})


def logged_values(executor: ClientExecutor) -> dict[str, list[float]]:
    """Per-client means of what clients logged since the last call (cleared), wherever they live."""
    own = own_way(executor, "logged_values")
    return own() if own else take_logged(executor)


def logged_metrics(executor: ClientExecutor) -> dict[str, float]:
    """``clients/log/<name>``: the round's mean of each value the clients' steps logged."""
    return {f"clients/log/{k}": sum(v) / len(v) for k, v in logged_values(executor).items() if v}


def when_evaluated(executor: ClientExecutor, evaluate: Callable[[], T], close: Callable[[T], R]) -> R | None:
    """Close a round with its evaluation after the exchange: ``close(evaluate())`` now, or, where the
    executor lets the round's last client work (every client loading a broadcast) travel with the
    clients' next request (a Flower deployment: one exchange a round, fdlit.deployment.carried), once
    that request came back (:func:`close_waiting`); returns what ``close`` returns, None while it waits."""
    own = own_way(executor, "when_evaluated")
    return own(evaluate, close) if own else close(evaluate())


def arrivals(executor: ClientExecutor, count: int) -> list[int] | None:
    """The ``count`` clients whose uploads arrived first, where clients run their jobs on their own time
    (a deployment on real time: fdlit.deployment.realtime); None where jobs run when a round asks."""
    if own := own_way(executor, "arrivals"):
        return own(count)
    return None


def close_waiting(executor: ClientExecutor) -> None:
    """Close the round that waits for its evaluation (:func:`when_evaluated`), if one does: after the
    next round's client step, and before the run stops."""
    if own := own_way(executor, "close_waiting"):
        own()

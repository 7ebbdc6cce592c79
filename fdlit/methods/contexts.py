"""What a method's hooks are given: typed contexts, never the loop.

* :class:`FederationInfo`: what every participant knows of the round (its number, the public rows);
* :class:`ClientContext`: a client-side hook's client, data, public logits and state;
* :class:`~fdlit.clients.loss_context.LossContext`: one training step's logits, targets and the
  client's own loss (built by the client's step, so it lives with the clients);
* :class:`DistillationContext`: what the public phase's training set is made from;
* :class:`ServerContext`: what the server part sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fdlit.clients.loss_context import LossContext  # noqa: F401 (the clients' step builds it)

if TYPE_CHECKING:  # pragma: no cover
    from fdlit.clients import ClientModule
    from fdlit.data import ClientData

Uploads = list[dict[str, torch.Tensor]]  # what each client sent, in upload order


@dataclass(frozen=True)
class FederationInfo:
    """What every participant knows of the federation. ``round`` is 0 during set-up;
    ``public_x`` (the unlabelled public inputs of this round) is on the reader's device.

    With participation (``fdlit.federation.participation``), ``clients`` names the clients whose
    uploads the server got, in the order of ``uploads`` (empty: all ``num_clients``, in id order),
    and ``public_index`` the rows of the full public set that ``public_x`` holds this round (None:
    all of them). Server state kept per client or per public sample across rounds is indexed with
    :meth:`client_ids`, :meth:`public_ids` and :meth:`rows`; the round refuses a server part that
    keeps state over one round's public rows while those rows change (docs/extending.md)."""

    round: int
    seed: int
    num_clients: int
    num_classes: int
    public_x: torch.Tensor
    private_epochs: int = 0  # epochs of this round's private phase (SCAFFOLD counts its local steps)
    clients: tuple[int, ...] = ()
    public_index: torch.Tensor | None = None
    public_size: int | None = None  # rows of the full public set (None: len(public_x))

    def client_ids(self) -> list[int]:
        """Ids of the clients whose uploads are given, in upload order."""
        return list(self.clients) if self.clients else list(range(self.num_clients))

    def public_ids(self) -> torch.Tensor:
        """Ids (rows of the full public set) of this round's public samples, in upload row order."""
        if self.public_index is not None:
            return self.public_index
        return torch.arange(len(self.public_x), device=self.public_x.device)

    @property
    def full_public_size(self) -> int:
        return len(self.public_x) if self.public_size is None else self.public_size

    def rows(self, per_client: torch.Tensor) -> torch.Tensor:
        """``per_client`` (M x N x ..., server state over every client and the full public set)
        restricted to this round's clients and public rows."""
        out = per_client
        if self.clients:
            out = out[torch.tensor(self.clients, device=out.device)]
        if self.public_index is not None:
            out = out[:, self.public_index.to(out.device)]
        return out

    def client_seed(self, client_id: int) -> int:
        """A seed of the client's own, for seeded client-side work (fdlit's convention)."""
        return self.seed * 1_000_003 + client_id


@dataclass
class ClientContext:
    """What a client-side hook sees: the client, its private data, what it received.

    ``public_logits`` are the client's logits on the public set this round (None during set-up);
    ``received`` is what the server broadcast at set-up; ``state`` is the method's client-side state,
    which lives and is checkpointed with the client (``ClientModule.method_state``).
    """

    info: FederationInfo
    client: ClientModule
    data: ClientData
    public_logits: torch.Tensor | None
    received: dict[str, torch.Tensor]
    state: dict[str, torch.Tensor]


@dataclass(frozen=True)
class DistillationContext:
    """What the public phase's training set is made from: the kept public inputs, the teacher's
    targets for them, and the client's own private data."""

    client_id: int
    public_x: torch.Tensor
    targets: torch.Tensor
    private_x: torch.Tensor
    private_y: torch.Tensor


@dataclass(frozen=True)
class ServerContext:
    """What the server side sees. ``public_y`` and ``client_classes`` are simulation truth: only
    rules that say they use labels (the Oracle, server-scored LKD) may read them."""

    info: FederationInfo
    public_y: torch.Tensor | None = None
    client_classes: tuple[tuple[int, ...], ...] = ()


def context_for(uploads: Uploads, round: int = 1, seed: int = 0, public_x: torch.Tensor | None = None,
                public_y: torch.Tensor | None = None) -> ServerContext:
    """A server context for calling ``aggregate`` outside a run (unit tests, notebooks): every
    client uploaded, over the whole public set (``public_x``: an N x 0 placeholder when not given)."""
    n, c = uploads[0]["logits"].shape if "logits" in uploads[0] else (0, 0)
    if public_x is None:
        public_x = torch.zeros(n, 0)
    info = FederationInfo(round=round, seed=seed, num_clients=len(uploads), num_classes=c, public_x=public_x)
    return ServerContext(info, public_y)

"""What every method shares: the contexts it is given, the result it returns, its two parts.

A method never sees the federation loop; it is two objects:

* the client part (:class:`ClientPart`), what runs where the client lives (in-process, vectorized,
  a Ray actor). It holds settings only, never server state, so it is all an executor ships to a
  worker; its state per client lives in ``ClientContext.state`` (``ClientModule.method_state``) and
  moves and is checkpointed with the client. Its hooks: ``setup`` once before round 1 (e.g. FedGO's
  discriminators), ``upload`` every round after public inference (e.g. UWA's Gaussian mixture),
  ``receive`` after a broadcast, ``distillation_set`` (the public phase's training set) and ``loss``
  (the one way a method changes a client's private or public loss: FedProx's proximal term,
  SCAFFOLD's correction, FedMD's digest). Each hook gets a :class:`ClientContext`;
* the server part: the :class:`Aggregator` the config names. ``server_setup`` turns the set-up
  uploads into server state and a broadcast (sent down to every client once, e.g. the
  Meta-Model's labelled inputs); ``aggregate`` turns a round's uploads into the teacher; both get a
  :class:`ServerContext`. ``client_part()`` builds the method's client part from its settings.

The loop sends every returned tensor through the communication ledger exactly once (set-up
messages as round 0); keys starting with ``_`` are in-process diagnostics, never sent or counted.
Server state made in ``server_setup`` is saved with ``state_dict`` and restored on resume, so the
set-up never runs (or is counted) twice.

A method declares what it exchanges (``exchange``): ``"predictions"`` (federated distillation: public
logits up, a teacher down, then the public phase) or ``"parameters"`` (FedAvg and its relatives:
the client part's ``upload`` sends the client's parameters, ``aggregate`` returns the global model in
``AggregationResult.broadcast``, ``receive`` loads it into every client; no public phase).
A method that does something on the server after averaging ("FedAvg, then server distillation")
overrides ``aggregate``, calls the averaging and replaces or adds to the broadcast.

Rules written before the split (``client_setup``, ``client_upload``, ``client_receive``,
``distillation_set`` defined on the Aggregator) still run, through :class:`LegacyClientPart`, with
a DeprecationWarning: their client hooks ship the whole rule, server state included.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # pragma: no cover
    from fdlit.clients import ClientModule
    from fdlit.data import ClientData

Uploads = list[dict[str, torch.Tensor]]


@dataclass(frozen=True)
class FederationInfo:
    """What every participant knows of the federation. ``round`` is 0 during set-up;
    ``public_x`` (the unlabelled public inputs of this round) is on the reader's device.

    With participation (``fdlit.federation.participation``), ``clients`` names the clients whose
    uploads the server got, in the order of ``uploads`` (empty: all ``num_clients``, in id order),
    and ``public_index`` the rows of the full public set that ``public_x`` holds this round (None:
    all of them). Server state kept per client or per public sample is indexed with
    :meth:`client_ids` and :meth:`rows`."""

    round: int
    seed: int
    num_clients: int
    num_classes: int
    public_x: torch.Tensor
    private_epochs: int = 0  # epochs of this round's private phase (SCAFFOLD counts its local steps)
    clients: tuple[int, ...] = ()
    public_index: torch.Tensor | None = None

    def client_ids(self) -> list[int]:
        """Ids of the clients whose uploads are given, in upload order."""
        return list(self.clients) if self.clients else list(range(self.num_clients))

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


@dataclass
class AggregationResult:
    """Teacher P (N x C probabilities; None for parameter exchange); per-client weights W (M x N,
    columns sum to 1) where the rule has them; a keep-mask over public samples (N, bool) where the
    rule drops samples; rule stats; ``broadcast``: what a parameter-exchange method sends down to
    every client (e.g. the global parameters), handed to ``client_receive``."""

    teacher: torch.Tensor | None
    weights: torch.Tensor | None = None
    keep: torch.Tensor | None = None
    stats: dict[str, float] = field(default_factory=dict)
    broadcast: dict[str, torch.Tensor] = field(default_factory=dict)


class ClientPart:
    """A method's client part (see the module docstring): hooks run where the client lives.

    Settings only, never server state: executors ship this object to workers. Per-client state goes
    in ``ctx.state`` (the client's ``method_state``). ``loss_state_keys`` names the ``method_state``
    tensors :meth:`loss` reads; the vectorized executor stacks exactly those per client and hands
    each client its own slice.
    """

    loss_state_keys: tuple[str, ...] = ()

    def setup(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """Once, before round 1: what the client sends up for the server's set-up."""
        return {}

    def upload(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """Every round, after the private phase and public inference: what the client sends up
        besides its public logits (it may replace ``"logits"``, e.g. with the kept rows only)."""
        return {}

    def receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """After the server's broadcast (``ctx.received``) at set-up and, for parameter exchange,
        every round: e.g. load the global parameters. Returns nothing to send."""
        return {}

    def distillation_set(self, public_x: torch.Tensor, targets: torch.Tensor, private_x: torch.Tensor,
                         private_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The public phase's training set (inputs, soft targets) from the kept public samples, the
        teacher's targets and the client's own private data; by default the public samples only."""
        return public_x, targets

    def loss(self, client: ClientModule, phase: str, logits: torch.Tensor, target: torch.Tensor,
             weight: torch.Tensor | None, base: torch.Tensor) -> torch.Tensor:
        """The loss of a ``phase`` (``"private"`` or ``"public"``) step; ``base`` is the client's own
        (cross-entropy against the labels or the teacher). Add a term or replace it."""
        return base

    @property
    def has_setup(self) -> bool:
        return type(self).setup is not ClientPart.setup

    @property
    def has_receive(self) -> bool:
        return type(self).receive is not ClientPart.receive


LEGACY_HOOKS = {"client_setup": "setup", "client_upload": "upload", "client_receive": "receive",
                "distillation_set": "distillation_set"}


def legacy_hooks(method: Aggregator) -> list[str]:
    """The client hooks ``method``'s class (or a parent below :class:`Aggregator`) still defines."""
    return [name for name in LEGACY_HOOKS
            if any(name in vars(cls) for cls in type(method).__mro__ if cls not in (Aggregator, object))]


class LegacyClientPart(ClientPart):
    """The client part of a rule that defines its client hooks on the Aggregator itself (deprecated):
    each hook calls the rule's, so the whole rule, server state included, travels to workers."""

    def __init__(self, method: Aggregator):
        self.method = method
        self.defined = legacy_hooks(method)

    def setup(self, ctx):
        return self.method.client_setup(ctx)

    def upload(self, ctx):
        return self.method.client_upload(ctx)

    def receive(self, ctx):
        return self.method.client_receive(ctx)

    def distillation_set(self, public_x, targets, private_x, private_y):
        return self.method.distillation_set(public_x, targets, private_x, private_y)

    def loss(self, client, phase, logits, target, weight, base):
        return self.method.client_part().loss(client, phase, logits, target, weight, base)

    @property
    def loss_state_keys(self) -> tuple[str, ...]:
        return self.method.client_part().loss_state_keys

    @property
    def has_setup(self) -> bool:
        return "client_setup" in self.defined or self.method.client_part().has_setup

    @property
    def has_receive(self) -> bool:
        return "client_receive" in self.defined or self.method.client_part().has_receive


def client_part_of(method: Aggregator) -> ClientPart:
    """The client part of ``method``: its own (``method.client_part()``), or for a rule that still
    defines ``client_upload`` etc. on the Aggregator, a :class:`LegacyClientPart` (with a warning)."""
    old = legacy_hooks(method)
    if not old:
        return method.client_part()
    warnings.warn(f"{type(method).__name__} defines {', '.join(old)} on the Aggregator; these hooks are "
                  "deprecated: define a ClientPart (setup, upload, receive, distillation_set, loss) and return "
                  "it from client_part(), so that workers get the client part only, not the server state",
                  DeprecationWarning, stacklevel=2)
    return LegacyClientPart(method)


class Aggregator:
    """A method's server part, which also builds its client part (see the module docstring).

    ``uploads[i]`` is what client i sent this round: always ``"logits"`` (N x C, the logits on the
    public set, in the dtype they were sent), plus whatever the client part's ``upload`` returned
    (which may replace ``"logits"``, e.g. with the kept rows only). The server turns logits into
    probabilities itself, so Q = softmax(logits) costs the same N*C numbers on the wire as Q.
    """

    short_name = "rule"
    label: str | None = None  # how reports name the method (None: its class name)
    exchange = "predictions"  # or "parameters" (see the module docstring)
    # for the privacy mechanism (fdlit.privacy.release): each upload key's kind, and which quantity's
    # client mean is all the teacher needs (None: the rule combines the uploads non-linearly)
    released: dict[str, str] = {"logits": "rows"}
    summed: str | None = None

    def check_config(self, model: Any, client: Any) -> None:
        """Refuse, with a ConfigError, a model spec or client optimization the method cannot run
        with; called before any work (e.g. parameter exchange refuses heterogeneous models)."""

    def check_clients(self, num_clients: int) -> None:
        """Refuse, with a ConfigError, a federation of ``num_clients`` clients the method cannot run
        (e.g. more F2L regions than clients); called when the loop is built, before any data loads."""

    def client_part(self) -> ClientPart:
        """The method's client part, built from its settings (never from its server state)."""
        return ClientPart()

    # deprecated client hooks (before ClientPart): they forward to the client part, so that an old
    # rule's ``super().client_upload(ctx)`` still reaches its parent's client part
    def client_setup(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        return self.client_part().setup(ctx)

    def client_upload(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        return self.client_part().upload(ctx)

    def client_receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        return self.client_part().receive(ctx)

    def distillation_set(self, public_x: torch.Tensor, targets: torch.Tensor, private_x: torch.Tensor,
                         private_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.client_part().distillation_set(public_x, targets, private_x, private_y)

    # ------------------------------------------------------------------ server part
    def server_setup(self, uploads: Uploads, ctx: ServerContext) -> dict[str, torch.Tensor]:
        """Once, on the server: set-up uploads -> server state; returns what goes down to every client."""
        return {}

    def aggregate(self, uploads: Uploads, ctx: ServerContext) -> AggregationResult:
        raise NotImplementedError

    def messages_to(self, client_id: int, num_clients: int,
                    broadcast: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What of a parameter-exchange broadcast client ``client_id`` is sent (and charged for); by
        default all of it. A method whose clients receive different models (F2L's regions) hands the
        simulation every model and charges each client for its own."""
        return broadcast

    def state_dict(self) -> dict[str, Any]:
        """Server state made by ``server_setup`` (tensors and plain data), for checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    @property
    def has_setup(self) -> bool:
        """Whether the method has a set-up stage (the loop skips it otherwise)."""
        with warnings.catch_warnings():  # client_part_of warns where the part is built for a run
            warnings.simplefilter("ignore", DeprecationWarning)
            part = client_part_of(self)
        return part.has_setup or type(self).server_setup is not Aggregator.server_setup

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def stack_logits(uploads: Uploads) -> torch.Tensor:
        return torch.stack([u["logits"].float() for u in uploads])  # M x N x C

    @staticmethod
    def mix(weights: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """P[x] = sum_i W[i, x] Q[i, x] (probability mixing, Kovalchuk et al. 2026, Definition 3.1)."""
        return torch.einsum("mn,mnc->nc", weights, probs)


def uniform_weights(m: int, n: int, device=None) -> torch.Tensor:
    """W = 1/M for every client and public sample (rules that trust every client equally)."""
    return torch.full((m, n), 1.0 / m, device=device)


def weight_concentration(weights: torch.Tensor) -> torch.Tensor:
    """chi = E_x sum_i W[i,x]^2 in [1/M, 1] (Kovalchuk et al. 2026, Sec. 4, Lemma 4.1). AVG: chi = 1/M."""
    return weights.pow(2).sum(0).mean()


def weight_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Mean over public samples of the entropy of the client weights (log M for uniform weights)."""
    return -(weights * torch.log(weights.clamp_min(1e-30))).sum(0).mean()

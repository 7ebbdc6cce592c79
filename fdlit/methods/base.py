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
messages as round 0); a round's upload sends exactly the arrays the client part declares
(``ClientPart.uploads``) and refuses any other. Server state (made in ``server_setup`` or kept across
rounds by ``aggregate``) is saved with ``state_dict`` and restored on resume, so the set-up never runs
(or is counted) twice and no state restarts: by default every attribute of the server part is saved,
and a part holding what a checkpoint cannot (a generator, a module) is refused before round 1 unless
it saves its state itself.

A method declares what it exchanges (``exchange``): ``"predictions"`` (federated distillation: public
logits up, a teacher down, then the public phase) or ``"parameters"`` (FedAvg and its relatives:
the client part's ``upload`` sends the client's parameters, ``aggregate`` returns the global model in
``AggregationResult.broadcast``, ``receive`` loads it into every client; no public phase).
A method that does something on the server after averaging ("FedAvg, then server distillation")
overrides ``aggregate``, calls the averaging and replaces or adds to the broadcast.

The client hooks live on the client part only: an Aggregator that defines one itself
(``client_setup``, ``client_upload``, ``client_receive``, ``distillation_set``) is refused in one line
when its run is built (:func:`check_client_hooks`), so a hook is never silently not called.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from fdlit.errors import ConfigError
from fdlit.messages import Message
from fdlit.methods.client_part import ClientPart
from fdlit.methods.contexts import (
    ClientContext,
    DistillationContext,
    FederationInfo,
    LossContext,
    ServerContext,
    Uploads,
    context_for,
)

if TYPE_CHECKING:
    from fdlit.privacy.secure_upload import SecureSums

__all__ = ["AggregationResult", "Aggregator", "ClientContext", "ClientPart", "DistillationContext", "FederationInfo",
           "LossContext", "ServerContext", "Uploads", "check_client_hooks", "context_for", "uniform_weights",
           "weight_concentration", "weight_entropy"]


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


class Aggregator:
    """A method's server part, which also builds its client part (see the module docstring).

    ``uploads[i]`` is what client i sent this round: the arrays its client part declares
    (``ClientPart.uploads``; by default ``"logits"``, N x C, the logits on the public set in the dtype
    they were sent), as its ``upload`` returned them (``"logits"`` may be its own, e.g. the kept rows
    only). The server turns logits into probabilities itself, so Q = softmax(logits) costs the same
    N*C numbers on the wire as Q.
    """

    short_name = "rule"
    label: str | None = None  # how reports name the method (None: its class name)
    # the published method this rule is with a trained server model (the `server` section): DS-FL for ERA
    server_label: str | None = None
    # the network whose accuracy the run reports (summary.json, the report's tables)
    measured_network = "each client's own network"
    needs_public_set = True  # False: the method runs without a public set (data.public_size 0 allowed)
    exchange = "predictions"  # or "parameters" (see the module docstring)
    # for the privacy mechanism (fdlit.privacy.release): each upload key's kind, and which quantity's
    # client mean is all the teacher needs (None: the rule combines the uploads non-linearly)
    released: dict[str, str] = {"logits": "rows"}
    summed: str | None = None
    # what ``AggregationResult.teacher`` holds: "probabilities" (rows sum to 1) or "logits"; the round
    # checks the result against it (fdlit.federation.result_checks)
    teacher_space = "probabilities"
    evaluates_logits = False  # the server evaluates the uploaded logits themselves (encodings refused)
    privacy_advice = ""  # a sentence a privacy refusal of the method appends (what to set instead)
    public_warmup_epochs = 0  # > 0: every client first trains on the labelled public set (FedMD's transfer learning)
    # state kept per public sample: attribute -> the dim that runs over the full public set (indexed by
    # ctx.info.public_ids()), or None for state that is not per public sample; checked under a per-round
    # public subset, where every tensor ``aggregate`` changes must be declared (fdlit.federation.public_rows)
    row_state: dict[str, int | None] = {}
    # secure aggregation (fdlit.privacy.secure_upload): why the rule cannot run on masked sums ("": it may,
    # where it defines secure_summands / aggregate_sums), and what its set-up sends in the clear ("": its
    # set-up stage, if any, is refused under secure aggregation)
    secure_refusal: str = ""
    secure_setup: str = ""
    # True: the clients keep a cache of the teacher's rows; ``configure`` sends each client only the rows
    # its cache lacks (what it sends is what is counted) and the client part's ``receive`` takes the
    # message in every round, where the client lives (SCARLET)
    client_cache: bool = False
    # levels of a masked per-sample maximum its ``secure_summands`` read (``maximum=``; a softmax over the
    # clients, fdlit.privacy.secure_softmax): 0, none; else each client's ``secure_level`` goes first
    secure_levels: int = 0

    def check_config(self, model: Any, client: Any) -> None:
        """Refuse, with a ConfigError, a model spec or client optimization the method cannot run
        with; called before any work (e.g. parameter exchange refuses heterogeneous models)."""

    def check_clients(self, num_clients: int) -> None:
        """Refuse, with a ConfigError, a federation of ``num_clients`` clients the method cannot run
        (e.g. more F2L regions than clients); called when the loop is built, before any data loads."""

    def client_part(self) -> ClientPart:
        """The method's client part, built from its settings (never from its server state)."""
        return ClientPart()

    # ------------------------------------------------------------------ server part
    def server_setup(self, uploads: Uploads, ctx: ServerContext) -> dict[str, torch.Tensor]:
        """Once, on the server: set-up uploads -> server state; returns what goes down to every client."""
        return {}

    def aggregate(self, uploads: Uploads, ctx: ServerContext) -> AggregationResult:
        raise NotImplementedError

    def configure(self, message: Message, client_ids: list[int], ctx: ServerContext) -> dict[int, Message]:
        """What each client ``client_ids`` is sent after aggregation (Flower's ``configure_*``): by
        default every one the same ``message`` (the teacher and keep-mask of federated distillation,
        the global model of parameter exchange). A method whose clients get different messages (F2L's
        regional models) returns one per client; each client receives, and is charged for, its own."""
        return {i: message for i in client_ids}

    def state_dict(self) -> dict[str, Any]:
        """The server state the part keeps across rounds, for checkpoints. By default every attribute
        it holds (tensors, numbers, strings, None, and lists, tuples and dicts of them), so state a
        part builds in ``server_setup`` or ``aggregate`` resumes without a line of its own; a part
        holding anything else overrides this and :meth:`load_state_dict` (otherwise it is refused
        before round 1, and at every checkpoint)."""
        return {ATTRIBUTES: state_attributes(self)} if check_saveable(self) is None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, value in state.get(ATTRIBUTES, {}).items():
            setattr(self, name, value)

    @property
    def unsaved_state(self) -> str | None:
        """Why the framework cannot save this part's state (None: it can, or the part saves its own)."""
        if type(self).state_dict is not Aggregator.state_dict:
            return None
        return check_saveable(self)

    @property
    def has_setup(self) -> bool:
        """Whether the method has a set-up stage (the loop skips it otherwise)."""
        return self.client_part().has_setup or type(self).server_setup is not Aggregator.server_setup

    # ------------------------------------------------------------------ secure aggregation
    def secure_summands(self, upload: dict[str, torch.Tensor], client: int) -> dict[str, tuple[torch.Tensor, float]]:
        """Client ``client``'s terms of the sums the teacher needs, each with a bound on its absolute
        values (name -> (tensor, bound)); a rule that defines it and :meth:`aggregate_sums` runs under
        secure aggregation (the server sees only the sums)."""
        raise NotImplementedError(f"{type(self).__name__} declares no secure_summands")

    def secure_level(self, upload: dict[str, torch.Tensor], client: int) -> torch.Tensor:
        """Client ``client``'s level per entry (in -1 … secure_levels - 1) for the masked maximum that
        precedes its terms, where ``secure_levels`` > 0."""
        raise NotImplementedError(f"{type(self).__name__} declares no secure_level")

    def aggregate_sums(self, sums: SecureSums, ctx: ServerContext) -> AggregationResult:
        """The round's result from the sums of the clients' masked summands."""
        raise NotImplementedError(f"{type(self).__name__} declares no aggregate_sums")

    @property
    def sums_uploads(self) -> bool:
        """Whether the rule defines both secure-aggregation hooks."""
        cls = type(self)
        return cls.secure_summands is not Aggregator.secure_summands and cls.aggregate_sums is not Aggregator.aggregate_sums

    def model_shares(self, arrived: list[int]) -> list[float] | None:
        """Each of the ``arrived`` clients' share of the global model a parameter exchange broadcasts
        (e.g. FedAvg's n_k / n), for the adversary metrics; None: the rule has no such shares."""
        return None

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def stack_logits(uploads: Uploads) -> torch.Tensor:
        return torch.stack([u["logits"].float() for u in uploads])  # M x N x C

    @staticmethod
    def mix(weights: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """P[x] = sum_i W[i, x] Q[i, x] (probability mixing, Kovalchuk et al. 2026, Definition 3.1)."""
        return torch.einsum("mn,mnc->nc", weights, probs)


ATTRIBUTES = "attributes"  # where the default state_dict keeps a server part's attributes
FUNCTIONS = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)
PLAIN = (torch.Tensor, int, float, str, bool, type(None))


# the client hooks a method defines on its client part, never on the Aggregator: part hook -> its name there
CLIENT_HOOKS = {"client_setup": "setup", "client_upload": "upload", "client_receive": "receive",
                "distillation_set": "distillation_set"}


def check_client_hooks(method: Aggregator) -> None:
    """Refuse an Aggregator that defines a client hook itself: the framework calls the client part's."""
    found = [name for name in CLIENT_HOOKS if any(name in vars(cls) for cls in type(method).__mro__)]
    if found:
        parts = ", ".join(f"{name} as {CLIENT_HOOKS[name]}" for name in found)
        raise ConfigError("aggregator", f"{type(method).__name__} defines {', '.join(found)} on the Aggregator; "
                          f"define them on its ClientPart ({parts}), returned by client_part() (docs/extending.md)")


def saveable(value: Any) -> bool:
    """Whether a checkpoint (``torch.load(weights_only=True)``) holds ``value`` as it is."""
    if isinstance(value, PLAIN):
        return True
    if type(value) in (list, tuple):
        return all(saveable(v) for v in value)
    if type(value) is dict:
        return all(isinstance(k, (str, int)) and saveable(v) for k, v in value.items())
    return False


def state_attributes(part: Any) -> dict[str, Any]:
    """A part's attributes that are state: not the functions set on it (behaviour, e.g. a wrapped
    ``aggregate``, which its constructor or the caller sets again)."""
    return {name: value for name, value in vars(part).items() if not isinstance(value, FUNCTIONS)}


def check_saveable(part: Any) -> str | None:
    """Why ``part``'s attributes cannot all be saved by the default ``state_dict`` (None: they can)."""
    bad = [f"{name!r} (a {type(value).__name__})" for name, value in state_attributes(part).items()
           if not saveable(value)]
    if not bad:
        return None
    return (f"{type(part).__name__} keeps {', '.join(bad)}, which fdlit cannot save for a resume; give it "
            "state_dict / load_state_dict (tensors and plain data) that save its state across rounds")


def uniform_weights(m: int, n: int, device=None) -> torch.Tensor:
    """W = 1/M for every client and public sample (rules that trust every client equally)."""
    return torch.full((m, n), 1.0 / m, device=device)


def weight_concentration(weights: torch.Tensor) -> torch.Tensor:
    """chi = E_x sum_i W[i,x]^2 in [1/M, 1] (Kovalchuk et al. 2026, Sec. 4, Lemma 4.1). AVG: chi = 1/M."""
    return weights.pow(2).sum(0).mean()


def weight_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Mean over public samples of the entropy of the client weights (log M for uniform weights)."""
    return -(weights * torch.log(weights.clamp_min(1e-30))).sum(0).mean()

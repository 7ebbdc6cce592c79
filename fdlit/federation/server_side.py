"""The server's side of a federation: the method's server part, the privacy layer's server step and
accountant, the server model, the set-up broadcast and the byte ledger, each with its state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from fdlit.errors import ConfigError
from fdlit.federation.communication import CommunicationLedger
from fdlit.federation.metric_names import method_stats
from fdlit.federation.public_rows import PublicRowsGuard
from fdlit.federation.result_checks import check_result
from fdlit.messages import Message, as_message
from fdlit.methods.base import AggregationResult, Aggregator, ServerContext
from fdlit.privacy.secure_upload import SecureSums

if TYPE_CHECKING:
    from fdlit.federation.round_facts import RoundPlan
    from fdlit.federation.server import ServerModel
    from fdlit.federation.tensors import FederationTensors
    from fdlit.privacy import UploadPrivacy


class ServerSide:
    """What the server holds across rounds.

    Args:
        method: the method's server part (its Aggregator).
        privacy: the ``privacy`` section (its server step decodes, adds the secure sum's noise, accounts).
        server_model: the optional server model (``fdlit.federation.server.ServerModel``) or None.
        message_dtype: the dtype the teacher is sent in.
    """

    def __init__(self, method: Aggregator, privacy: UploadPrivacy, server_model: ServerModel | None,
                 message_dtype: torch.dtype):
        self.method, self.privacy, self.server_model = method, privacy, server_model
        # what the clients are sent of a round's teacher: the teacher, or the server model's step over it
        self.teacher_step = server_model.teacher_step if server_model is not None else method_teacher
        self.message_dtype = message_dtype
        self.ledger = CommunicationLedger()
        self.received: dict[str, torch.Tensor] = {}  # what the server broadcast at set-up (kept current)
        self.public_rows: PublicRowsGuard | None = None  # set once the public set's size is known

    def send_up(self, r: int, client: int, payload: Message | dict[str, torch.Tensor]) -> Message:
        """Count every array ``client`` sent in round ``r`` and hand the message on."""
        message = as_message(payload)
        for kind, tensor in message.arrays.items():
            self.ledger.send(r, client, "up", kind, tensor)
        return message

    def send_down(self, r: int, client: int, message: Message | dict[str, torch.Tensor]) -> None:
        for kind, tensor in as_message(message).arrays.items():
            self.ledger.send(r, client, "down", kind, tensor)

    def refresh(self, broadcast: Message | dict[str, torch.Tensor]) -> None:
        """Keep ``received`` current: what a later broadcast to every client sends again (FedAvg's global
        model) replaces the set-up's copy, so a checkpoint never holds a stale model."""
        self.received.update({k: v for k, v in as_message(broadcast).items() if k in self.received})

    def aggregate(self, uploads: list, ctx: ServerContext) -> AggregationResult:
        """The method's ``aggregate``, under the rule that keeps its state honest on a public subset."""
        info = ctx.info
        if self.public_rows is not None:
            self.public_rows.before_aggregate(self.method, info.round, info.public_index)
        if isinstance(uploads, SecureSums):  # secure aggregation: the rule sees only the sums
            result = self.method.aggregate_sums(uploads, ctx)
        else:
            result = self.method.aggregate(uploads, ctx)
        check_result(self.method, result, len(info.client_ids()), len(info.public_x), info.num_classes)
        result.stats = method_stats(result.stats)  # never in a framework metric's name
        if self.public_rows is not None:
            self.public_rows.after_aggregate(self.method, info.round, info.public_index)
        return result

    def start(self, public_rows: PublicRowsGuard) -> None:
        """Before round 1: the guard over the public rows, and the check that the method's state can be saved."""
        self.public_rows = public_rows
        self.check_state()

    def check_state(self) -> None:
        """Refuse, before round 1 and at every checkpoint, a server part whose state across rounds fdlit
        cannot save (its resume would silently restart it)."""
        if why := self.method.unsaved_state:
            raise ConfigError("aggregator", why)

    def state_dict(self) -> dict[str, Any]:
        self.check_state()
        return {
            "method": self.method.state_dict(),
            "privacy": self.privacy.state_dict(),  # the accountant: a resumed run reports the same epsilon
            "received": dict(self.received),
            "ledger": self.ledger.state_dict(),
            "server": self.server_model.state_dict() if self.server_model is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.method.load_state_dict(state["method"] or {})
        self.privacy.load_state_dict(state.get("privacy") or {})
        self.received = dict(state["received"])
        self.ledger.load_state_dict(state["ledger"])
        if self.server_model is not None:
            if state.get("server") is None:
                raise ValueError("the checkpoint holds no server model state, but the config has a server model")
            self.server_model.load_state_dict(state["server"])


def method_teacher(plan: RoundPlan, public_x: torch.Tensor, teacher: torch.Tensor, stats: dict[str, float],
                   tensors: FederationTensors) -> tuple[torch.Tensor, str]:
    """Without a server model the clients are sent the method's teacher."""
    return teacher, "teacher"

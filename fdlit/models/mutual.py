"""Two networks in one client: a private (personalised) network and a shared one, for the mutual
distillation methods (FML, Shen et al. 2020; FedKD, Wu et al. 2022: ``fdlit.methods.FML``, ``FedKD``).

A :class:`MutualPair` is one ``nn.Module`` holding both, so every executor trains, stacks
(``torch.func.vmap``), moves and checkpoints it as it does any network, with one optimizer over
both networks' parameters (each network's gradient comes from its own loss only: the methods
detach the other network's prediction wherever it is a target). Its ``forward`` is the private
network's logits unless the method evaluates the shared one (``evaluated``; the methods' ``evaluate``
knob): what every client is evaluated with. The methods' loss needs both networks'
logits of the same forward, which the pair exposes through the two halves fdlit's feature-reading
losses use (:mod:`fdlit.clients.features`): ``embed(x)`` is the two networks' logits side by side
(B x 2C: private, then shared) and ``classify`` reads the private half, so
``forward(x) == classify(embed(x))``. Only the shared network's parameters are exchanged.

Two ways to get a pair:

* name it as the model, with each network's own spec (FedKD's smaller shared "mentee")::

      model:
        class_path: fdlit.models.mutual.MutualPair
        init_args:
          private: {class_path: fdlit.models.MLP, init_args: {hidden: [128, 128]}}
          shared: {class_path: fdlit.models.MLP, init_args: {hidden: [32]}}

  (``shared`` left out: the private network's architecture). Inside ``fdlit.models.PerClient``
  groups the private networks may differ; the shared one must be the same for every client;
* any other network: the method pairs it, when its client part is attached, with a freshly
  initialised copy of its own architecture (:func:`fdlit.methods.mutual.paired`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from fdlit.errors import ConfigError
from fdlit.models.base import ClientNetwork
from fdlit.models.build import build_model

PAIR_PATH = "fdlit.models.mutual.MutualPair"


class MutualPair(ClientNetwork):
    """A private network and a shared one (module docstring); ``forward`` is the private one's logits.

    Args:
        input_shape: shape of one input, filled in from the data.
        num_classes: number of classes C, filled in from the data.
        private: the private network's model spec (``{class_path, init_args}``).
        shared: the shared network's model spec; null: the private network's.
    """

    def __init__(self, input_shape: tuple[int, ...] | None = None, num_classes: int | None = None,
                 private: dict[str, Any] | None = None, shared: dict[str, Any] | None = None):
        if not private:
            raise ConfigError("model.init_args.private", "MutualPair needs the private network's spec "
                              "({class_path, init_args})")
        shape, classes = tuple(input_shape or (1, 8, 8)), num_classes or 10
        private_net = build_model(private, shape, classes, field="model.init_args.private")
        shared_net = build_model(shared or private, shape, classes, field="model.init_args.shared")
        super().__init__()
        self.private, self.shared = private_net, shared_net
        self.evaluated = "private"  # which network ``forward`` (evaluation, prediction) is

    @classmethod
    def of(cls, private: nn.Module, shared: nn.Module) -> MutualPair:
        """A pair of two built networks."""
        pair = nn.Module.__new__(cls)
        nn.Module.__init__(pair)
        pair.private, pair.shared = private, shared
        pair.evaluated = "private"
        return pair

    def forward(self, x):
        """The evaluated network's logits (training reads both through ``embed``)."""
        return self.shared(x) if self.evaluated == "shared" else self.private(x)

    def embed(self, x):
        """Both networks' logits, B x 2C: the private network's, then the shared one's."""
        return torch.cat([self.private(x), self.shared(x)], -1)

    def classify(self, both):
        return both[..., : both.shape[-1] // 2]


def split_logits(both: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(private, shared) logits from a pair's ``embed`` output (B x 2C)."""
    c = both.shape[-1] // 2
    return both[..., :c], both[..., c:]


def find_pair(model: nn.Module) -> MutualPair | None:
    """The pair inside a client's model (after the dataset's input module), or None."""
    return next((m for m in model.modules() if isinstance(m, MutualPair)), None)


def fresh_copy(net: nn.Module, seed: int) -> nn.Module:
    """``net``'s architecture with parameters drawn anew (each layer's own initialisation), from a
    seeded stream of its own, so the global random stream (other clients' initialisation) is unchanged."""
    twin = copy.deepcopy(net)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for module in twin.modules():
            reset = getattr(module, "reset_parameters", None)
            if callable(reset):
                reset()
    return twin


def shared_spec(spec: Any) -> Any:
    """The spec of the shared network a model spec gives (a pair's ``shared``, else its ``private``;
    a plain network's own spec); None for a callable spec (not checkable before it is built)."""
    if not isinstance(spec, dict):
        return None
    if str(spec.get("class_path", "")) == PAIR_PATH:
        args = spec.get("init_args") or {}
        return shared_spec(args.get("shared") or args.get("private"))
    return {k: v for k, v in spec.items() if k not in ("clients", "fraction") and (k != "init_args" or v)}


def check_one_shared_network(model: Any, method: str) -> None:
    """Refuse, naming the field, a ``PerClient`` federation whose clients' shared networks differ:
    the shared network is averaged, so it must be the same for every client (the private ones may differ)."""
    if not isinstance(model, dict) or not str(model.get("class_path", "")).endswith("PerClient"):
        return
    groups = (model.get("init_args") or {}).get("groups") or []
    specs = {repr(canonical(shared_spec(g))) for g in groups}
    if len(specs) > 1:
        raise ConfigError("model.init_args.groups", f"{method} averages the shared network, so it must be the same "
                          f"for every client; got {len(specs)} different ones: give every group a {PAIR_PATH} "
                          "with the same 'shared' spec (the private networks may differ)")


def canonical(spec: Any) -> Any:
    if isinstance(spec, dict):
        return tuple(sorted((k, canonical(v)) for k, v in spec.items()))
    if isinstance(spec, list | tuple):
        return tuple(canonical(v) for v in spec)
    return spec

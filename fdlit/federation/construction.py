"""Building a federation: the checks a loop's settings get before any work, and the clients.

Everything here can fail on bad input, so it runs when the config is parsed (settings) or in
``FederationLoop.setup`` before the first round (clients, networks, tensors on the device).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from fdlit.errors import ConfigError, check_at_least, check_choice, import_hint
from fdlit.federation.baselines import reference_client
from fdlit.methods.base import check_client_hooks
from fdlit.methods.client_part import declared_uploads
from fdlit.models.build import build_model

if TYPE_CHECKING:  # the config's checks import this module for --help, before clients or data load
    from fdlit.adversaries import Adversaries
    from fdlit.clients import ClientModule, ClientOptimization
    from fdlit.data.federated import ClientData, FederatedData
    from fdlit.methods.base import Aggregator
    from fdlit.methods.client_part import ClientPart
    from fdlit.models.build import ModelSpec

MESSAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-mixed", "64-true")
ACCELERATORS = ("auto", "cpu", "cuda", "gpu", "mps", "tpu")
MAX_SEED = 2**32 - 1  # numpy's and Lightning's seed range


def available_accelerators() -> list[str]:
    """The ``federation.accelerator`` values this machine can run."""
    out = ["auto", "cpu"]
    if torch.cuda.is_available():
        out += ["cuda", "gpu"]
    if torch.backends.mps.is_available():
        out += ["mps"] + ([] if "gpu" in out else ["gpu"])
    if importlib.util.find_spec("torch_xla") is not None:
        out.append("tpu")
    return out


def check_accelerator(accelerator: str) -> str:
    """Refuse an unknown accelerator, or one this machine does not have, before Fabric is built."""
    here = available_accelerators()
    if accelerator not in ACCELERATORS:
        raise ConfigError("federation.accelerator", f"allowed: {', '.join(ACCELERATORS)} "
                          f"(on this machine: {', '.join(here)}); got {accelerator!r}")
    if accelerator not in here:
        raise ConfigError("federation.accelerator", f"{accelerator!r} needs a device this machine does not have; "
                          f"allowed on this machine: {', '.join(here)}")
    return accelerator


def check_loop_settings(*, rounds: int, epochs: dict[str, int], choices: dict[str, tuple[str, Sequence[str]]],
                        accelerator: str, eval_every_n_rounds: int, eval_subsample: int | None) -> None:
    """The ``federation`` section's own checks, named by field, before anything is built (``choices``:
    field -> (its value, the allowed values), checked in order)."""
    check_at_least("federation.rounds", rounds, 1)
    for name, value in epochs.items():
        check_at_least(f"federation.{name}", value, 0)
    for name, (value, allowed) in choices.items():
        check_choice(f"federation.{name}", value, allowed)
    check_accelerator(accelerator)
    check_at_least("federation.eval_every_n_rounds", eval_every_n_rounds, 1)
    if eval_subsample is not None:
        check_at_least("federation.eval_subsample", eval_subsample, 1)


def check_compilation(accelerator: str, compile: bool, compile_backend: str, cuda_graphs: bool = False) -> None:
    """``federation.compile``, ``compile_backend`` and ``cuda_graphs`` (after the section's other checks)."""
    if cuda_graphs:
        check_cuda_graphs(accelerator, compile)
    if compile:
        from torch._dynamo import list_backends

        known = list_backends(exclude_tags=())
        if compile_backend not in known:
            raise ConfigError("federation.compile_backend", f"allowed: {', '.join(known)}; got {compile_backend!r}")


def check_cuda_graphs(accelerator: str, compile: bool) -> None:
    """``federation.cuda_graphs`` captures the vectorized executor's grouped step on a CUDA device."""
    cuda = accelerator in ("cuda", "gpu") or (accelerator == "auto" and torch.cuda.is_available())
    if not cuda or not torch.cuda.is_available():
        raise ConfigError("federation.cuda_graphs", f"needs a CUDA device (federation.accelerator {accelerator!r}"
                          f"{'' if torch.cuda.is_available() else ', and this machine has none'}); allowed here: false")
    if compile:
        raise ConfigError("federation.cuda_graphs", "not with federation.compile (the compiled step is not "
                          "captured); allowed: one of the two")


def use_cuda_graphs(executor) -> None:
    """``federation.cuda_graphs`` handed to the executor, which must be the vectorized one."""
    from fdlit.execution import VectorizedExecutor

    if not isinstance(executor, VectorizedExecutor):
        raise ConfigError("federation.cuda_graphs", f"needs the vectorized executor (this run's: "
                          f"{type(executor).__name__}); allowed: false, or federation.executor "
                          "fdlit.execution.VectorizedExecutor")
    executor.cuda_graphs = True


def check_seed(seed: object) -> int:
    if not (isinstance(seed, int) and 0 <= seed <= MAX_SEED):
        raise ConfigError("seed", f"must be an integer in [0, {MAX_SEED}], got {seed!r}")
    return seed


def import_client_class(path: str) -> type:
    """``federation.client_class``: a ClientModule subclass by import path."""
    module_name, _, cls_name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError("federation.client_class", f"cannot import {path!r} ({exc}){import_hint(str(exc))}") from None
    from fdlit.clients import ClientModule  # imported when a run is built, not for --help

    if not (isinstance(cls, type) and issubclass(cls, ClientModule)):
        raise ConfigError("federation.client_class", f"{path!r} is not a subclass of fdlit.clients.ClientModule")
    return cls


def augmentation_seed(seed: int, client_id: int) -> int:
    """The seed of a client's augmentation stream, independent of its batch-order stream (seeded
    ``seed * 1_000_003 + client_id``): on a CPU both are torch CPU generators, and one seed would
    make crops and flips follow the batch order's draws."""
    return int(np.random.SeedSequence([seed, client_id, 0xA06]).generate_state(1, np.uint64)[0] >> 1)


def client_network(model_spec: ModelSpec, data: FederatedData, client_id: int, seed: int) -> torch.nn.Module:
    """The client's network; the dataset's input module (uint8 -> normalised float, batched
    augmentation in training mode; fdlit.data.augment) goes first when the dataset has one."""
    net = build_model(model_spec, data.input_shape, data.num_classes, client_id, len(data.clients))
    make_input = getattr(data, "input_transform", None)
    if make_input is None:
        return net
    from fdlit.data.augment import WithInput

    return WithInput(make_input(seed=augmentation_seed(seed, client_id)), net)


def eval_rows(eval_subsample: int | None, total: int, seed: int) -> torch.Tensor | None:
    """The test rows of intermediate evaluations (sorted), or None for all of them. Drawn from
    a generator of its own, so the subsample changes no other random stream."""
    if eval_subsample is None or eval_subsample >= total:
        return None
    g = torch.Generator().manual_seed(seed * 1_000_003 + 0xE7A1)
    return torch.randperm(total, generator=g)[:eval_subsample].sort().values


@dataclass(frozen=True)
class InitialDraws:
    """Torch's global random state before each client's network was drawn, and after the last: a
    deployment node draws its own clients' networks from these, exactly as ``fit`` draws them one
    after another, without drawing (or holding) any other client's. 5 KB a client."""

    before: dict[int, torch.Tensor]  # client id -> torch.get_rng_state() before its network
    after: torch.Tensor


@dataclass(frozen=True)
class ClientRecipe:
    """What every client is built from: its class, its network's spec and its optimisation."""

    client_class: type[ClientModule]
    model_spec: ModelSpec
    optimization: ClientOptimization


def build_clients(data: FederatedData, mode: str, recipe: ClientRecipe, method: Aggregator, adversaries: Adversaries,
                  seed: int, hosted: Sequence[int] | None = None, draws: InitialDraws | None = None
                  ) -> tuple[list[ClientData], list[ClientModule | None], ClientPart, InitialDraws]:
    """The clients' data and modules (one pooled client for the reference baseline), the method's
    client part every client carries (wrapped by the attack for adversarial clients): what of the
    method runs where the clients live, and the random state each network was drawn from.

    ``hosted`` (a deployment node's clients, with the server's ``draws``): only those clients get a
    module, drawn from their recorded random state; the others are None."""
    client_data = [reference_client(data, seed)] if mode == "reference" else data.clients
    clients, before = [], {}
    for cd in client_data:
        if hosted is not None and cd.client_id not in hosted:
            clients.append(None)
            continue
        if draws is not None:
            torch.set_rng_state(draws.before[cd.client_id].clone())  # its own storage: a row of a stack crashes torch
        before[cd.client_id] = torch.get_rng_state()
        network = client_network(recipe.model_spec, data, cd.client_id, seed)
        clients.append(recipe.client_class(network, cd.client_id, cd.classes, recipe.optimization, seed))
    if draws is not None:
        torch.set_rng_state(draws.after.clone())  # what follows draws as after every network, as in fit
    record = InitialDraws(before, torch.get_rng_state())
    check_client_hooks(method)
    part = method.client_part()
    part.uploads = declared_uploads(part, method)  # what every client may send each round
    method_part = adversaries.wrap(part, method.exchange, len(clients), seed)
    for client in clients:
        if client is not None:
            client.method_part = method_part
    if part.shared_feature_width and part.needs_features:
        from fdlit.clients.features import check_shared_feature_width

        check_shared_feature_width([c.model for c in clients if c is not None], data.input_shape,
                                   part.label or type(part).__name__)
    return client_data, clients, method_part, record

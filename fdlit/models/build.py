"""Building a network from its config spec (``model``, ``server.model``, a method's server copy)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from fdlit.errors import ConfigError

ModelSpec = dict | Callable[..., torch.nn.Module]


def build_model(spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int,
                client_id: int = 0, num_clients: int = 1, field: str = "model") -> torch.nn.Module:
    """Instantiate a client network from ``{"class_path": ..., "init_args": {...}}`` or a callable.

    ``input_shape`` and ``num_classes`` come from the data unless the config sets them. A
    ``fdlit.models.PerClient`` spec (heterogeneous federation) is resolved to client ``client_id``'s group.
    """
    if callable(spec):
        return spec(input_shape=input_shape, num_classes=num_classes)
    cls, kwargs = resolve_model(spec, input_shape, num_classes, client_id, num_clients, field)
    return cls(**kwargs)


def resolve_model(spec: dict, input_shape: tuple[int, ...], num_classes: int, client_id: int = 0,
                  num_clients: int = 1, field: str = "model") -> tuple[type, dict]:
    """(class, every constructor argument) of the network ``build_model`` makes from ``spec``."""
    class_path = spec["class_path"]
    module_name, _, cls_name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{field}.class_path", f"cannot import {class_path!r} ({exc})") from None
    kwargs = dict(spec.get("init_args") or {})
    from fdlit.models.hetero import PerClient

    if isinstance(cls, type) and issubclass(cls, PerClient):
        own = PerClient.assign(kwargs.get("groups") or [], num_clients)[client_id]
        return resolve_model(own, input_shape, num_classes)
    kwargs["input_shape"] = tuple(kwargs.get("input_shape") or input_shape)
    kwargs["num_classes"] = kwargs.get("num_classes") or num_classes
    return cls, kwargs

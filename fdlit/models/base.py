"""What a client network is to fdlit: ``Model(input_shape=..., num_classes=..., **init_args)`` -> logits.

``model`` is typed with :class:`ClientNetwork` so that ``fdlit fit --help`` lists fdlit's networks
(not every ``torch.nn.Module`` in torch) and a class fdlit cannot build (``torch.nn.Linear``) is
refused when the config is parsed. Any other ``torch.nn.Module`` subclass whose constructor takes
``input_shape`` and ``num_classes`` (or ``**kwargs``) counts as a ClientNetwork too, without deriving
from it, so a network of one's own works by ``class_path``.
"""

from __future__ import annotations

import abc
import inspect

from torch import nn

DATA_ARGS = ("input_shape", "num_classes")  # filled in from the data by fdlit.federation.build_model


def takes_data_shape(cls: type) -> bool:
    """True for a ``torch.nn.Module`` subclass whose constructor accepts ``input_shape`` and ``num_classes``."""
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        return False
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return all(name in params for name in DATA_ARGS)


class ClientNetwork(nn.Module, metaclass=abc.ABCMeta):
    """Base of fdlit's client networks; constructed as ``cls(input_shape=..., num_classes=..., **init_args)``."""

    @classmethod
    def __subclasshook__(cls, other):
        if cls is ClientNetwork:  # structural: any nn.Module built from the data's shape and classes
            return True if takes_data_shape(other) else NotImplemented
        return NotImplemented

    @abc.abstractmethod
    def forward(self, x):  # abstract only so that help does not list the base itself as a choice
        raise NotImplementedError

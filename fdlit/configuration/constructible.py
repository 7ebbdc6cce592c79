"""The classes of fdlit's that a config received from elsewhere may construct.

A config someone else wrote (a run folder given to ``export``, a run submitted to a deployment's
nodes) makes its reader construct every class it names, with arguments of the writer's choosing. A
class of fdlit's is no safer for being fdlit's: ``fdlit.runs.directory.RunDirectory`` writes
``<path>/config.yaml`` when it is constructed, ``fdlit.runs.checkpoint.Checkpointer`` writes a
checkpoint wherever it is told. So what such a config may name is an explicit list of kinds, each a
base class and the packages its classes come from, whose classes compute on the tensors they are
given and write no file, start no process and open no connection when constructed or run:

========  ==================================  ==========================================
kind      base                                packages
========  ==================================  ==========================================
method    ``fdlit.methods.base.Aggregator``   ``fdlit.methods``
model     ``fdlit.models.base.ClientNetwork`` ``fdlit.models``
executor  ``ClientExecutor``                  ``fdlit.execution``
attack    ``fdlit.adversaries.attacks.Attack`` ``fdlit.adversaries``
client    ``fdlit.clients.client.ClientModule`` ``fdlit.clients``
callback  ``FederationCallback``              ``fdlit.callbacks``
========  ==================================  ==========================================

The callbacks that write (the run directory, the checkpointer, the W&B logger, the progress bar)
live in :mod:`fdlit.runs`: ``fit`` builds them itself for the run it writes, and a config names none
of them. A node also refuses ``RayExecutor``: setting it up starts Ray, whose ``runtime_env``
installs packages and whose ``address`` joins another machine's cluster (``export`` constructs the
executor, never sets it up: it runs the clients itself).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass

DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


@dataclass(frozen=True)
class Kind:
    """Classes that subclass ``base`` and are defined in one of ``packages`` (or their modules)."""

    name: str
    base: str
    packages: tuple[str, ...]


KINDS = (
    Kind("method", "fdlit.methods.base.Aggregator", ("fdlit.methods",)),
    Kind("model", "fdlit.models.base.ClientNetwork", ("fdlit.models",)),
    Kind("executor", "fdlit.execution.executor.ClientExecutor", ("fdlit.execution",)),
    Kind("attack", "fdlit.adversaries.attacks.Attack", ("fdlit.adversaries",)),
    Kind("client", "fdlit.clients.client.ClientModule", ("fdlit.clients",)),
    Kind("callback", "fdlit.callbacks.FederationCallback", ("fdlit.callbacks",)),
)
# constructible, but never set up on a node: what setting it up does reaches beyond the node's folder
NOT_ON_A_NODE = {"fdlit.execution.ray_executor.RayExecutor": "setting it up starts Ray (its runtime_env installs "
                                                             "packages, its address joins another cluster)"}


def fdlit_object(path: str):
    """What the dotted ``path`` names inside fdlit (its modules imported to look; nothing of
    ``fdlit.__main__``, whose import runs the command line), or None."""
    parts = path.split(".")
    if not DOTTED.fullmatch(path) or parts[0] != "fdlit" or "__main__" in parts:
        return None
    for i in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:i])
        try:
            if importlib.util.find_spec(module) is None:
                continue
            obj = importlib.import_module(module)
        except (ImportError, ValueError):
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
        return obj
    return None


def full_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def kind_of(cls: object) -> Kind | None:
    """The kind ``cls`` is constructible as, or None."""
    if not isinstance(cls, type):
        return None
    for kind in KINDS:
        base = fdlit_object(kind.base)
        if isinstance(base, type) and issubclass(cls, base) and any(
                cls.__module__ == p or cls.__module__.startswith(p + ".") for p in kind.packages):
            return kind
    return None


def constructible(path: str, on_node: bool = False) -> bool:
    """Whether a received config may name ``path`` (on a node: less :data:`NOT_ON_A_NODE`)."""
    cls = fdlit_object(path)
    if kind_of(cls) is None:
        return False
    return not (on_node and full_name(cls) in NOT_ON_A_NODE)


def fdlit_class(path: str) -> bool:
    """Whether ``path`` names a class defined in fdlit (``fdlit.x.os.system`` is none)."""
    obj = fdlit_object(path)
    return isinstance(obj, type) and obj.__module__.split(".", 1)[0] == "fdlit"

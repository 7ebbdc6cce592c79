"""Lightning's ``LightningModule`` at the cost of what a federated run uses of it.

A plain ``import lightning.pytorch`` costs about three times ``import torch`` in CPU seconds, and
almost none of it is Lightning: Lightning imports torchmetrics (for ``Metric``), whose package
``__init__`` imports every optional backend it finds installed (transformers for BERTScore, SciPy's
signal module for audio metrics), and Lightning Fabric imports ``torch._dynamo`` (and with it SymPy)
for two names, ``OptimizedModule`` and ``disable``. A client uses none of these: it is a module, an
optimizer and a loss. Measured (``import fdlit.clients.client``, 2-core machine, median of 5): 6.0 CPU s
plainly, 4.4 with ``torch._dynamo`` deferred, 2.4 with torchmetrics' ``__init__`` deferred as well.

So when fdlit is the first to import Lightning in a process, it does so with

* torchmetrics' package ``__init__`` deferred: Lightning takes ``Metric`` and ``MetricCollection``
  from their own modules; the first other name asked of ``torchmetrics`` runs the real ``__init__``
  (with every backend it finds, as a plain import would).
* ``torch._dynamo`` deferred: while Lightning loads, ``torch._dynamo`` is a stand-in whose
  ``OptimizedModule`` answers ``isinstance``/``issubclass`` as the real class does once
  ``torch._dynamo`` is imported (before that no compiled module can exist, so "no" is the true
  answer), and whose ``disable`` hands each call to the real ``torch._dynamo.disable`` once it is
  loaded. A submodule asked for meanwhile (``from torch._dynamo.eval_frame import ...``) loads the real
  package and is the real submodule (said once). The stand-in leaves ``sys.modules`` when Lightning is
  loaded, so ``torch.compile`` and everything else import the real module as usual.

Both lean on how torchmetrics' package and ``torch._dynamo`` are laid out (no public way to defer
them): should the import fail this way for a release that laid them out otherwise, what it loaded is
dropped, Lightning is imported plainly and one note says so (slower start-up, the same Lightning).
If Lightning (or torchmetrics) is already imported — a user's own LightningModule or callback
imported by the config before the run is built — it is used as it is and nothing here applies.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import types


def _real_dynamo() -> types.ModuleType | None:
    module = sys.modules.get("torch._dynamo")
    return None if module is None or isinstance(module, _DeferredDynamo) else module


class _AsRealOptimizedModule(type):
    def __instancecheck__(cls, obj) -> bool:
        real = _real_dynamo()
        return real is not None and isinstance(obj, real.OptimizedModule)

    def __subclasscheck__(cls, sub) -> bool:
        real = _real_dynamo()
        return real is not None and issubclass(sub, real.OptimizedModule)


class OptimizedModule(metaclass=_AsRealOptimizedModule):
    """Stands for ``torch._dynamo.OptimizedModule`` in the modules loaded beside the stand-in."""


def disable(fn=None, recursive: bool = True, reason: str | None = None):
    """``torch._dynamo.disable`` applied when first called (with the real module)."""
    if fn is None:
        return functools.partial(disable, recursive=recursive, reason=reason)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        real = _real_dynamo()
        if real is None:  # nothing is being compiled: torch._dynamo was never loaded
            return fn(*args, **kwargs)
        if "disabled" not in cache:
            cache["disabled"] = real.disable(fn, recursive, reason=reason)
        return cache["disabled"](*args, **kwargs)

    cache: dict = {}
    return call


class _DeferredDynamo(types.ModuleType):
    """``torch._dynamo`` while Lightning loads; any other name it is asked for comes from the real module."""

    def __getattr__(self, name: str):
        if name in ("OptimizedModule", "disable"):
            return globals()[name]
        if name.startswith("__"):
            raise AttributeError(name)
        with contextlib.suppress(KeyError):
            if sys.modules["torch._dynamo"] is self:
                del sys.modules["torch._dynamo"]
        import importlib

        return getattr(importlib.import_module("torch._dynamo"), name)


class _RealSubmodule:
    """A submodule of ``torch._dynamo`` asked for while the stand-in is in place (``from
    torch._dynamo.eval_frame import ...``): the stand-in leaves, the real ``torch._dynamo`` loads, and
    the import gets the real submodule (loaded once, by the real package). Said once: that import
    costs what the stand-in saves."""

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("torch._dynamo.") or not isinstance(sys.modules.get("torch._dynamo"), _DeferredDynamo):
            return None
        import importlib.util

        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        import importlib

        from fdlit.internals import fell_back

        fell_back(f"{spec.name} was imported while Lightning loaded: torch._dynamo is loaded in full "
                  "(about a CPU second more at start-up)")
        stand_in = sys.modules.pop("torch._dynamo", None)
        torch = sys.modules["torch"]
        if torch.__dict__.get("_dynamo") is stand_in:
            del torch._dynamo
        return importlib.import_module(spec.name)  # the real package first, then its submodule

    def exec_module(self, module) -> None:
        """Loaded in :meth:`create_module` by the real package."""


@contextlib.contextmanager
def _dynamo_deferred():
    import torch

    if "torch._dynamo" in sys.modules:
        yield
        return
    stand_in = _DeferredDynamo("torch._dynamo")
    stand_in.__path__ = []  # a package, as the real one is
    finder = _RealSubmodule()
    sys.modules["torch._dynamo"] = stand_in
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        if sys.modules.get("torch._dynamo") is stand_in:
            del sys.modules["torch._dynamo"]
        if torch.__dict__.get("_dynamo") is stand_in:
            del torch._dynamo  # torch's lazy attribute then imports the real module


class _DeferredPackage(types.ModuleType):
    """torchmetrics before its package ``__init__`` has run: ``Metric`` and ``MetricCollection`` (all
    that Lightning takes from it) come from their own modules; any other name runs the real
    ``__init__`` in this module object first (with every backend it finds), as a plain import would have."""

    _served = {"Metric": "torchmetrics.metric", "MetricCollection": "torchmetrics.collections"}

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        import importlib

        if name in self._served:
            importlib.import_module("torchmetrics.utilities")  # first, as the package's own import order has it
            value = getattr(importlib.import_module(self._served[name]), name)
            setattr(self, name, value)
            return value
        self.__class__ = types.ModuleType  # from here on an ordinary module
        self._logger.handlers.clear()  # the package's __init__ adds its handler again
        self.__spec__.loader.exec_module(self)
        return getattr(self, name)


@contextlib.contextmanager
def _torchmetrics_deferred():
    import importlib.util

    spec = importlib.util.find_spec("torchmetrics")
    if spec is None or "torchmetrics" in sys.modules:
        yield
        return
    package = _DeferredPackage("torchmetrics")
    package.__spec__, package.__loader__, package.__file__ = spec, spec.loader, spec.origin
    package.__path__, package.__package__ = list(spec.submodule_search_locations), "torchmetrics"
    sys.modules["torchmetrics"] = package
    try:
        from torchmetrics.__about__ import __version__  # what Lightning's version checks read

        package.__version__ = __version__
        # the names torchmetrics' own modules take from the package, set as its __init__ sets them
        package._logger = logging.getLogger("torchmetrics")
        package._logger.addHandler(logging.StreamHandler())
        package._logger.setLevel(logging.INFO)
        package._PACKAGE_ROOT = os.path.dirname(spec.origin)
        package._PROJECT_ROOT = os.path.dirname(package._PACKAGE_ROOT)
        yield
    except BaseException:
        if sys.modules.get("torchmetrics") is package and isinstance(package, _DeferredPackage):
            del sys.modules["torchmetrics"]
        raise


LOADED_BY_LIGHTNING = ("lightning", "lightning_fabric", "pytorch_lightning", "torchmetrics")


def _ours(name: str) -> bool:
    return name.split(".", 1)[0] in LOADED_BY_LIGHTNING


def import_lightning() -> None:
    """Import ``lightning.pytorch`` as described above, unless it (or torchmetrics) is loaded already.
    Should that import fail (a Lightning or torchmetrics release this does not fit), what it loaded is
    dropped and Lightning is imported plainly, with one note."""
    if "lightning.pytorch" in sys.modules or "torchmetrics" in sys.modules:
        import lightning.pytorch  # noqa: F401
        return
    try:
        with _dynamo_deferred(), _torchmetrics_deferred():
            import lightning.pytorch  # noqa: F401
    except Exception as exc:
        from fdlit.internals import fell_back

        for name in [n for n in sys.modules if _ours(n)]:
            del sys.modules[name]
        logging.getLogger("torchmetrics").handlers.clear()  # torchmetrics' __init__ adds its handler again
        fell_back(f"Lightning's import with torchmetrics and torch._dynamo deferred failed "
                  f"({type(exc).__name__}: {exc}): Lightning is imported plainly (a few CPU seconds more at start-up)")
        import lightning.pytorch  # noqa: F401


import_lightning()
from lightning.pytorch import LightningModule  # noqa: E402

__all__ = ["LightningModule", "import_lightning"]

"""Deprecated: the former name of :mod:`fdlit.methods`, kept so that configs, checkpoints and run
directories written with ``fdlit.aggregators.*`` class paths still run and resume.

``fdlit.aggregators.X`` is ``fdlit.methods.X`` (former class names included, fdlit.methods.aliases), and
``fdlit.aggregators.<module>`` is the same module object as ``fdlit.methods.<module>``, so classes
pickled under the old path load as the current ones."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

import fdlit.methods as _methods
from fdlit.methods.aliases import OLD_PACKAGE, PACKAGE, renamed_class

warnings.warn(f"{OLD_PACKAGE} is the former name of {PACKAGE}; it still works, but write {PACKAGE} in new configs",
              FutureWarning, stacklevel=2)


class _SubmoduleAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import fdlit.aggregators.uncertainty`` -> the module ``fdlit.methods.uncertainty`` itself."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(OLD_PACKAGE + "."):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(PACKAGE + spec.name[len(OLD_PACKAGE):])

    def exec_module(self, module):
        pass  # already executed under its current name


if not any(isinstance(f, _SubmoduleAlias) for f in sys.meta_path):
    sys.meta_path.append(_SubmoduleAlias())


def __getattr__(name):
    cls = renamed_class(name, vars(_methods))
    return cls if cls is not None else getattr(_methods, name)

"""Datasets as tensors, partitions and splits. The names below load their modules (and torch) when first
used, so a module of this package that needs only numpy (the IDX reader, a node's own files) imports
without torch."""

LAZY = {"DATASETS": "datasets", "TensorDataset": "datasets", "load_dataset": "datasets",
        "ClientData": "federated", "FederatedData": "federated"}

__all__ = list(LAZY)


def __getattr__(name: str):
    if name not in LAZY:
        raise AttributeError(f"module 'fdlit.data' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"fdlit.data.{LAZY[name]}"), name)

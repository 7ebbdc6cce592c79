"""Deployment: a config run as a real Flower federation (SuperLink, SuperNodes, ServerApp, ClientApps).

The ServerApp (:mod:`fdlit.deployment.server_app`) runs fdlit's ordinary round
(:class:`~fdlit.federation.loop.FederationLoop`) with a :class:`~fdlit.deployment.executor.FlowerExecutor`,
whose calls (train, predict, a client part's hook) become Flower Messages to the SuperNodes. Each
SuperNode's ClientApp (:mod:`fdlit.deployment.client_app`) hands them to a long-lived node worker
(:mod:`fdlit.deployment.node`) that holds that node's clients and builds their data itself from the
config and the seed. Under secure aggregation the uploads stay on the nodes and the server gets their
sum (:mod:`fdlit.deployment.secure_rounds`, :mod:`fdlit.deployment.secure_node`).
:mod:`fdlit.deployment.launcher` starts a local deployment (``python -m fdlit
deploy``) or submits to an existing SuperLink. docs/deployment.md.

``flwr`` is imported only here, lazily: fdlit works without it.
"""

from __future__ import annotations

FLWR_RANGE = ">=1.41"  # pyproject.toml's flower extra, tested at both ends by `make compat`
INSTALL_HINT = f"pip install -e '.[flower]'  (or: pip install 'flwr{FLWR_RANGE}')"


def import_flwr():
    """The ``flwr`` package, or an ImportError that says how to install it."""
    try:
        import flwr
    except ImportError as exc:
        raise ImportError(f"fdlit deploy needs the 'flwr' package, which is not installed ({exc}). "
                          f"Install it with: {INSTALL_HINT}") from None
    return flwr

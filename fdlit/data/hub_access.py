"""Whether the Hugging Face hub can be reached, decided in about a second, and reading its cache without it.

Unreachable, ``datasets`` and ``huggingface_hub`` retry every request with back-off (five retries: about
25-45 s) before saying so. A run that needs a hub dataset asks here first: one TCP connection to the
hub's endpoint (``HF_ENDPOINT``, default https://huggingface.co) with a short timeout. When it fails,
the load reads the local cache in offline mode (what ``HF_HUB_OFFLINE=1`` does) and, when the dataset
is not cached, fails at once.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from urllib.parse import urlparse

PROBE_TIMEOUT_S = 1.5
DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "ON", "YES", "TRUE"}


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT


def offline_requested() -> bool:
    """The user asked for the cache only (``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE``)."""
    return any(os.environ.get(v, "").upper() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_reachable(timeout: float = PROBE_TIMEOUT_S) -> bool:
    """A TCP connection to the endpoint opens within ``timeout`` seconds. The probe runs in a thread
    so that a name lookup that hangs (no DNS) is bounded by the timeout too."""
    url = urlparse(hub_endpoint())
    if not url.hostname:
        return False
    port = url.port or (443 if url.scheme == "https" else 80)
    answered: list[bool] = []

    def probe():
        try:
            socket.create_connection((url.hostname, port), timeout=timeout).close()
            answered.append(True)
        except OSError:
            answered.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answered and answered[0])


@contextlib.contextmanager
def cache_only():
    """``datasets`` and ``huggingface_hub`` in offline mode inside the block: both read their flag
    (set from the environment when imported) at each call, so setting it here takes effect."""
    import datasets.config as ds_config
    import huggingface_hub.constants as hub_constants

    saved = [(m, n, getattr(m, n)) for m, n in ((ds_config, "HF_HUB_OFFLINE"), (ds_config, "HF_DATASETS_OFFLINE"),
                                                 (hub_constants, "HF_HUB_OFFLINE")) if hasattr(m, n)]
    for module, name, _ in saved:
        setattr(module, name, True)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)

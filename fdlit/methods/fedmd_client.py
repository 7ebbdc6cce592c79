"""Deprecated: FedMD's digest is FedMD's client part (:class:`fdlit.methods.fedmd.FedMDDigest`),
which ``FedMD`` attaches to every client; ``federation.client_class`` is not needed.

Apart from :mod:`fdlit.methods.fedmd` because it is a client module: importing the rules
does not import the client machinery (start-up of ``fdlit fit --help``)."""

from __future__ import annotations

import warnings

import torch

from fdlit.clients.client import ClientModule
from fdlit.methods.fedmd import digest_loss


class FedMDClient(ClientModule):
    """Deprecated alias: a client whose public step is FedMD's digest (what ``FedMD``'s
    client part does for every client). Kept so that configs naming it in ``federation.client_class``
    still run; remove that line."""

    def __init__(self, *args, **kwargs):
        warnings.warn("fdlit.methods.fedmd_client.FedMDClient is deprecated: FedMD's client part "
                      "applies the digest; remove federation.client_class from the config", DeprecationWarning,
                      stacklevel=2)
        super().__init__(*args, **kwargs)

    def public_loss(self, logits: torch.Tensor, teacher: torch.Tensor,
                    weight: torch.Tensor | None = None) -> torch.Tensor:
        return digest_loss(logits, teacher, weight)

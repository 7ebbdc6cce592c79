"""Checks of a federation that need its config only: they run when the loop is built, before any
dataset is loaded (loading CIFAR or a hub dataset takes minutes on a busy machine), so a setting
that cannot work stops in well under a second.

The same bounds are checked again in set-up against the data as built (the public set a dataset
actually yields); here M is ``data.num_clients`` and N is ``data.public_size``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fdlit.data.datasets import NUM_CLASSES
from fdlit.data.federated import check_public_set

if TYPE_CHECKING:
    from fdlit.adversaries import Adversaries
    from fdlit.data.federated import FederatedData
    from fdlit.federation.settings import FederationSettings
    from fdlit.methods.base import Aggregator
    from fdlit.privacy import UploadPrivacy


def check_before_data(settings: FederationSettings, data: FederatedData, method: Aggregator, privacy: UploadPrivacy,
                      adversaries: Adversaries) -> None:
    """Raise ConfigError for a setting the config alone shows to be impossible or one under which no
    client would ever train (``settings``: the federation section)."""
    num_clients = getattr(data, "num_clients", None)
    if not isinstance(num_clients, int):  # a data object of another kind: set-up checks it
        return
    adversaries.check(method, settings.mode, num_clients, NUM_CLASSES.get(getattr(data, "dataset", None)))
    if settings.participation is not None:  # None: everyone, every round (also the reference baseline)
        settings.participation.check(num_clients, data.public_size)
        settings.participation.check_rounds(settings.rounds, num_clients)
    if settings.mode != "fd":
        return
    check_public_set(getattr(data, "public_size", 1), method)  # 0 only for a method that needs no public set
    method.check_clients(num_clients)  # e.g. F2L: every region needs a client
    if getattr(data, "dataset", None) in NUM_CLASSES:  # a hub dataset's classes are known once it is loaded
        privacy.check(method, NUM_CLASSES[data.dataset])

"""Checks of a federation that need its config only: they run when the loop is built, before any
dataset is loaded (loading CIFAR or a hub dataset takes minutes on a busy machine), so a setting
that cannot work stops in well under a second.

The same bounds are checked again in set-up against the data as built (the public set a dataset
actually yields); here M is ``data.num_clients`` and N is ``data.public_size``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fdlit.data.datasets import NUM_CLASSES
from fdlit.data.federated import check_public_set
from fdlit.errors import ConfigError

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
    if privacy.secure:
        check_secure_clients(settings, num_clients)
    check_public_set(getattr(data, "public_size", 1), method)  # 0 only for a method that needs no public set
    method.check_clients(num_clients)  # e.g. F2L: every region needs a client
    if getattr(data, "dataset", None) in NUM_CLASSES:  # a hub dataset's classes are known once it is loaded
        privacy.check(method, NUM_CLASSES[data.dataset])


def most_sampled(settings: FederationSettings, num_clients: int) -> int:
    """The most clients any round samples (all of them without client sampling)."""
    p = settings.participation
    if p is None:
        return num_clients
    if p.count is not None:
        return min(p.count, num_clients)
    return math.ceil((p.fraction if p.fraction is not None else 1.0) * num_clients)


def check_secure_clients(settings: FederationSettings, num_clients: int) -> None:
    """Secure aggregation needs at least 2 clients in every sum (its threshold is max(2, ...)): refuse a
    run in which no round can sample 2."""
    most = most_sampled(settings, num_clients)
    if most < 2:
        field = "federation.participation.count" if settings.participation is not None else "data.num_clients"
        raise ConfigError("privacy.secure_aggregation", f"needs at least 2 clients in each round's sum (its "
                          f"threshold is max(2, ceil(privacy.secure_threshold x sampled)), so that the sum is never "
                          f"one client's upload), and this run samples at most {most} a round; allowed: {field} "
                          "of 2 or more, or privacy.secure_aggregation: false")

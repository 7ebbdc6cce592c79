"""How a Ray executor places clients: clients per actor, actors, and each actor's GPU share."""

from __future__ import annotations

import math

from fdlit.errors import ConfigError


def plan_actors(
    num_clients: int,
    cluster_cpus: float,
    cluster_gpus: float,
    num_cpus_per_actor: float = 1.0,
    num_gpus_per_client: float = 0.0,
    num_gpus_per_actor: float | None = None,
    clients_per_actor: int | None = None,
) -> tuple[int, int, float]:
    """How many clients each actor holds, how many actors, and the GPUs each actor asks for.

    Every actor must be placed at once (clients live in them for the whole run), so a plan the
    cluster cannot hold is an error here rather than a run that waits forever for resources.
    Default grouping: as many actors as the cluster's CPUs allow (``num_cpus_per_actor`` each),
    clients split evenly (``size`` is the largest group; sizes differ by at most one); if that does not fit the GPUs, fewer, larger actors. An actor asks for
    ``num_gpus_per_actor``, or ``num_gpus_per_client`` times its clients; a fractional ask must fit
    within one GPU, so a GPU holds ``floor(1 / ask)`` actors.
    """
    if num_gpus_per_actor is not None and num_gpus_per_client:
        raise ConfigError("federation.executor", "set num_gpus_per_client or num_gpus_per_actor, not both")
    eps = 1e-9
    if clients_per_actor is not None:
        candidates = [clients_per_actor]
    else:
        slots = int(cluster_cpus // num_cpus_per_actor + eps) if num_cpus_per_actor > 0 else num_clients
        candidates = range(math.ceil(num_clients / max(1, min(num_clients, slots))), num_clients + 1)
    for size in candidates:
        actors = math.ceil(num_clients / size)
        size = math.ceil(num_clients / actors)  # even groups: 4 clients on 3 slots -> 2 + 2
        actors = math.ceil(num_clients / size)
        gpus = num_gpus_per_actor if num_gpus_per_actor is not None else num_gpus_per_client * size
        gpus = round(gpus, 4)  # Ray's resolution is 1e-4
        if gpus > 1 and gpus != int(gpus):
            continue  # Ray accepts fractions <= 1 or whole numbers
        if actors * num_cpus_per_actor > cluster_cpus + eps:
            continue
        whole_gpus = int(cluster_gpus + eps)
        if gpus == 0 or (gpus <= 1 and actors <= int(1 / gpus + eps) * whole_gpus) or (
                gpus > 1 and actors * gpus <= cluster_gpus + eps):
            return size, actors, gpus
    raise ConfigError(
        "federation.executor",
        f"no grouping of {num_clients} clients"
        + (f" into actors of {clients_per_actor}" if clients_per_actor is not None else "")
        + f" fits the Ray cluster ({cluster_cpus:g} CPUs, {cluster_gpus:g} GPUs) with {num_cpus_per_actor:g} CPU "
        f"per actor and {num_gpus_per_actor if num_gpus_per_actor is not None else num_gpus_per_client:g} GPU per "
        f"{'actor' if num_gpus_per_actor is not None else 'client'}; Ray accepts GPU fractions <= 1 or whole numbers",
    )


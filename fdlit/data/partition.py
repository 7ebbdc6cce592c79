"""How clients get classes and samples: k classes per client, or Dirichlet(alpha).

Both return, for every client, indices into the private pool. They are pure functions of the pool
labels and a seeded ``numpy.random.Generator``, so a partition is reproducible from (config, seed).
"""

from __future__ import annotations

import numpy as np

from fdlit.errors import ConfigError


def check_k_classes(num_clients: int, num_classes: int, k: int) -> None:
    """k classes per client must exist and cover every class."""
    if not 1 <= k <= num_classes:
        raise ConfigError("data.classes_per_client", f"must be in [1, {num_classes}] (number of classes), got {k}")
    if num_clients * k < num_classes:
        raise ConfigError(
            "data.classes_per_client",
            f"num_clients x classes_per_client = {num_clients}x{k} < {num_classes} classes: "
            "some class would be held by no client; raise data.num_clients or data.classes_per_client",
        )


def assign_k_classes(num_clients: int, num_classes: int, k: int, rng: np.random.Generator) -> list[list[int]]:
    """Give each client k distinct classes so that every class is held by at least one client.

    **choice** (docs/algorithms.md leaves it open): balanced random draw. Clients are served in a random
    order; each takes, among the classes held by the fewest clients so far, k at random (ties broken
    by a random permutation). With M*k >= C this covers every class and keeps class popularity within
    one of M*k/C, which the purely random draw of k-subsets does not guarantee.
    """
    check_k_classes(num_clients, num_classes, k)
    counts = np.zeros(num_classes, dtype=np.int64)
    sets: list[list[int]] = [[] for _ in range(num_clients)]
    for client in rng.permutation(num_clients):
        order = rng.permutation(num_classes)
        # stable sort by popularity: least-held classes first, random among equals
        chosen = order[np.argsort(counts[order], kind="stable")][:k]
        counts[chosen] += 1
        sets[client] = sorted(int(c) for c in chosen)
    return sets


def cyclic_k_classes(num_clients: int, num_classes: int, k: int) -> list[list[int]]:
    """Client i holds classes i, i+1, ..., i+k-1 (mod C): a fixed, seed-free assignment in which
    neighbouring clients overlap in k-1 classes. Every class is held once M + k - 1 >= C."""
    check_k_classes(num_clients, num_classes, k)
    if num_clients + k - 1 < num_classes:
        raise ConfigError(
            "data.class_assignment",
            f"cyclic assignment covers only num_clients + classes_per_client - 1 = {num_clients + k - 1} of "
            f"{num_classes} classes; use class_assignment: random or more clients / classes per client",
        )
    return [sorted((i + j) % num_classes for j in range(k)) for i in range(num_clients)]


def check_blocks(num_clients: int, num_classes: int, k: int) -> None:
    """Blocks need k | C (whole groups) and (C/k) | M (every group held by as many clients)."""
    check_k_classes(num_clients, num_classes, k)
    if num_classes % k:
        raise ConfigError(
            "data.classes_per_client",
            f"class_assignment: blocks cuts the {num_classes} classes into groups of classes_per_client, so "
            f"classes_per_client must divide {num_classes}; got {k}",
        )
    groups = num_classes // k
    if num_clients % groups:
        raise ConfigError(
            "data.class_assignment",
            f"blocks gives each of the {groups} class groups ({num_classes} classes / {k} per client) to "
            f"num_clients / {groups} clients, so num_clients must be a multiple of {groups}; got {num_clients}",
        )


def block_k_classes(num_clients: int, num_classes: int, k: int, rng: np.random.Generator) -> list[list[int]]:
    """Disjoint class groups: a seeded permutation of the C classes cut into C/k groups of k; client i
    holds group i mod (C/k), so every group is held by M*k/C clients and clients either share all their
    classes or none. The same layout as a cyclic draw with offset i*k over a permuted class order."""
    check_blocks(num_clients, num_classes, k)
    order = rng.permutation(num_classes)
    groups = [sorted(int(c) for c in order[g * k:(g + 1) * k]) for g in range(num_classes // k)]
    return [groups[i % len(groups)] for i in range(num_clients)]


def sample_k_class_clients(
    pool_labels: np.ndarray,
    class_sets: list[list[int]],
    samples_per_client: int | None,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Private indices for each client: drawn from the pool samples of its classes.

    Clients that share a class may share samples (Kovalchuk et al. 2026 and Kovalchuk et al. 2025
    (workshop), App. A.2): each client draws without replacement from its own classes' pool,
    independently of the others. ``samples_per_client=None`` gives each client every pool sample of
    its classes.
    """
    out = []
    for i, classes in enumerate(class_sets):
        candidates = np.flatnonzero(np.isin(pool_labels, classes))
        if samples_per_client is None:
            out.append(np.sort(candidates))
            continue
        if samples_per_client > len(candidates):
            raise ConfigError(
                "data.samples_per_client",
                f"client {i} (classes {classes}) can get at most {len(candidates)} samples from the private pool, "
                f"asked for {samples_per_client}; lower it or set it to null (all samples of the client's classes)",
            )
        out.append(np.sort(rng.choice(candidates, size=samples_per_client, replace=False)))
    return out


def dirichlet_partition(
    pool_labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_samples: int = 10,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Disjoint split of the pool with per-class client proportions ~ Dirichlet(alpha * 1_M).

    The usual recipe of FedGO (Jang et al. 2025) and its predecessors: for each class, draw client proportions and
    cut that class's shuffled samples accordingly; redraw until every client has ``min_samples``.
    """
    if alpha <= 0:
        raise ConfigError("data.dirichlet_alpha", f"must be > 0, got {alpha}")
    if num_clients * min_samples > len(pool_labels):
        raise ConfigError(
            "data.num_clients",
            f"{num_clients} clients x {min_samples} samples each exceed the private pool of {len(pool_labels)}; "
            "use fewer clients",
        )
    classes = np.unique(pool_labels)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(pool_labels == c))
            props = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(props)[:-1] * len(idx)).astype(int)
            for i, chunk in enumerate(np.split(idx, cuts)):
                parts[i].append(chunk)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(o) for o in out) >= min_samples:
            return out
    raise ConfigError(
        "data.dirichlet_alpha",
        f"no Dirichlet({alpha}) split gave every one of {num_clients} clients >= {min_samples} samples "
        f"in {max_tries} draws; raise alpha or use fewer clients",
    )


def stratified_holdout(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Split positions 0..n-1 into (train, holdout), taking ``fraction`` of every class to holdout.

    A class with at least 2 samples keeps at least one on each side, so its calibration component
    and its training signal both exist.
    """
    train, hold = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_hold = int(round(fraction * len(idx)))
        n_hold = min(max(n_hold, 1), len(idx) - 1) if len(idx) >= 2 else 0
        hold.append(idx[:n_hold])
        train.append(idx[n_hold:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(hold))

"""Heterogeneous federations: different client networks in one config (FD only exchanges logits).

```yaml
model:
  class_path: fdlit.models.PerClient
  init_args:
    groups:
      - {class_path: fdlit.models.ResNet18, fraction: 0.5}
      - {class_path: fdlit.models.SmallCNN, init_args: {channels: 32}, clients: [10, 11, 12]}
```

Each group is a model spec plus either ``clients`` (explicit ids) or ``fraction`` (a share of M).
Explicit ids are placed first; fraction groups then take consecutive blocks of the remaining ids in
order (``round(fraction * M)`` each); the last group without ``clients`` takes any remainder. Every
client must end up in exactly one group. ``build_model`` resolves the spec per client.
"""

from __future__ import annotations

from typing import Any

from fdlit.errors import ConfigError
from fdlit.models.base import ClientNetwork


class PerClient(ClientNetwork):
    """Placeholder class for the config parser; never instantiated as a network (see module doc).

    Args:
        groups: list of ``{class_path, init_args, clients | fraction}``.
    """

    def __init__(self, groups: list[dict[str, Any]], input_shape: tuple | None = None,
                 num_classes: int | None = None):
        super().__init__()
        raise ConfigError("model", "fdlit.models.PerClient is resolved per client by build_model; not a network")

    def forward(self, x):  # never called: build_model replaces PerClient by each client's own network
        raise NotImplementedError

    @staticmethod
    def assign(groups: list[dict[str, Any]], num_clients: int) -> list[dict[str, Any]]:
        """The model spec of every client, in client order."""
        if not groups:
            raise ConfigError("model.init_args.groups", "needs at least one group")
        owner: list[int | None] = [None] * num_clients
        for g, group in enumerate(groups):
            if "class_path" not in group:
                raise ConfigError("model.init_args.groups", f"group {g} has no class_path")
            if ("clients" in group) == ("fraction" in group):
                raise ConfigError("model.init_args.groups", f"group {g} needs exactly one of 'clients' or 'fraction'")
            for c in group.get("clients", []):
                if not 0 <= c < num_clients or owner[c] is not None:
                    raise ConfigError("model.init_args.groups", f"group {g}: client {c} is out of range or in two groups")
                owner[c] = g
        free = [c for c in range(num_clients) if owner[c] is None]
        frac_groups = [g for g, group in enumerate(groups) if "fraction" in group]
        for j, g in enumerate(frac_groups):
            f = groups[g]["fraction"]
            if not 0 < f <= 1:
                raise ConfigError("model.init_args.groups", f"group {g}: fraction must be in (0, 1], got {f}")
            n = len(free) if j == len(frac_groups) - 1 else min(len(free), round(f * num_clients))
            for c in free[:n]:
                owner[c] = g
            free = free[n:]
        if free:
            raise ConfigError("model.init_args.groups", f"clients {free} belong to no group")
        return [{k: v for k, v in groups[g].items() if k not in ("clients", "fraction")} for g in owner]

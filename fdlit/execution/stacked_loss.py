"""The clients' losses on a stack's logits (M x B x K) without vmap, where a client's loss is the
plain cross-entropy (no method loss term, no overridden loss hooks): the same formula as
:func:`fdlit.clients.client.cross_entropy` with per-sample weights, on every client at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from fdlit.clients import ClientModule

LOSS_HOOKS = ("phase_loss", "private_loss", "public_loss", "method_loss")


def loss_is_plain(client: ClientModule) -> bool:
    """Whether ``client``'s phase loss is :func:`~fdlit.clients.client.cross_entropy` of its logits
    alone: no method part with a loss hook, and ``ClientModule``'s own loss methods. Anything else
    runs through the client's hooks (under vmap, :func:`fdlit.execution.grouped.grouped_training_step`)."""
    from fdlit.clients import ClientModule

    part = client.method_part
    if part is not None and part.has_loss:
        return False
    return all(getattr(type(client), hook) is getattr(ClientModule, hook) for hook in LOSS_HOOKS)


def stacked_cross_entropy(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Each client's weighted mean cross-entropy, M values:

        L_m = sum_b w_mb * CE(softmax(z_mb), y_mb) / sum_b w_mb,

    with CE against an integer label (the private step) or against probabilities (the public
    step's distillation target, CE(P || softmax(z)); Kovalchuk et al. 2026, Algorithm 1). ``logits``:
    M x B x K; ``target``: M x B labels or M x B x K probabilities; ``weight``: M x B (0 for padding)."""
    logp = logits.float().log_softmax(-1)
    soft = target.is_floating_point()
    per_sample = -(target * logp).sum(-1) if soft else -logp.gather(-1, target[..., None])[..., 0]
    return (per_sample * weight).sum(-1) / weight.sum(-1)

"""Which clients the vectorized executor can train together: what it supports, and which clients
share an architecture (one stacked step per architecture)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from fdlit.data.augment import WithInput

if TYPE_CHECKING:
    from fdlit.clients import ClientModule

SUPPORTED_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)
UNSUPPORTED_PRECISIONS = ("16-mixed", "16-true", "transformer-engine")


def unsupported_reason(client: ClientModule, precision: str = "32-true", device: str | None = None) -> str | None:
    """Why ``client`` cannot be trained by :class:`VectorizedExecutor` on ``device`` (a device type;
    None: not checked); None when it can."""
    if precision in UNSUPPORTED_PRECISIONS:
        return f"precision {precision!r} (needs a grad scaler)"
    from fdlit.clients import ClientModule

    if client.own_module is not None:
        return f"the network {type(client.own_module).__name__} is a LightningModule with its own steps (sequential only)"
    for hook in ("on_train_epoch_start", "on_train_epoch_end", "on_train_batch_end"):
        if getattr(type(client), hook) is not getattr(ClientModule, hook):
            return f"{type(client).__name__} overrides {hook}() (called by the sequential executor only)"
    if type(client).training_step is not ClientModule.training_step:
        return f"{type(client).__name__} overrides training_step() (override private_loss / public_loss instead)"
    _, net, prefix = split_input(client.model)
    for name, module in net.named_modules(prefix=prefix.rstrip(".")):
        own = [n for n, _ in module.named_buffers(recurse=False)]
        if not own:
            continue
        if not isinstance(module, _BatchNorm):
            return f"module {name or 'model'} ({type(module).__name__}) has buffers {own}"
        if module.momentum is None:
            return f"BatchNorm {name} with momentum=None (cumulative average)"
        if device == "cuda" and _has_channels_last_weights(net):
            # cuDNN's batch norm asks its input for its memory format, which vmap does not implement
            # ("NYI: querying is_contiguous inside of vmap"); on a CPU the stack runs in the default layout
            return f"BatchNorm {name} with channels-last weights on CUDA (federation.channels_last)"
    if not all(p.requires_grad for p in client.model.parameters()):
        return "frozen parameters"
    opt = client.configure_optimizers()
    if type(opt) not in SUPPORTED_OPTIMIZERS:
        return f"optimizer {type(opt).__name__}"
    if len(opt.param_groups) != 1:
        return "more than one parameter group"
    group = opt.param_groups[0]
    if [id(p) for p in group["params"]] != [id(p) for p in client.model.parameters()]:
        return "optimizer parameters are not the model's parameters"
    # options the stacked update does not implement (all off in ClientOptimization.build); a
    # client's fused=True is fine: the stack uses the fused Adam kernel anyway
    for key in ("amsgrad", "maximize", "nesterov", "dampening", "differentiable", "capturable"):
        if group.get(key):
            return f"optimizer option {key}={group[key]!r}"
    return None


def split_input(model: torch.nn.Module) -> tuple[torch.nn.Module | None, torch.nn.Module, str]:
    """(input module, network, parameter-name prefix of the network). A parameter-free input module
    in front of the network (``WithInput``: uint8 -> normalised float, augmentation with its own
    generator, as the loop builds for image datasets) is run per client outside vmap, exactly as the
    sequential executor runs it; only the network is vmapped."""
    if isinstance(model, WithInput) and next(model.input.parameters(), None) is None:
        return model.input, model.net, "net."
    return None, model, ""


def architecture_key(client: ClientModule) -> tuple:
    """Clients with equal keys can share one vmapped step: same module (repr covers layer options
    such as dropout rate and padding), same parameter shapes, same optimizer hyper-parameters
    except the learning rate (which may differ per client)."""
    opt = client.configure_optimizers()
    hyper = tuple(sorted((k, repr(v)) for k, v in opt.param_groups[0].items() if k not in ("params", "lr", "initial_lr")))
    shapes = tuple((n, tuple(p.shape), p.dtype, p.device) for n, p in client.model.named_parameters())
    return (type(client.model), repr(client.model), shapes, type(opt), hyper)


def _has_channels_last_weights(net: torch.nn.Module) -> bool:
    return any(p.dim() == 4 and not p.is_contiguous() and p.is_contiguous(memory_format=torch.channels_last)
               for p in net.parameters())

"""A client network's penultimate features, for methods whose loss reads them (FedProto).

A network provides them by splitting its forward in two: ``embed(x)`` (B x D features, the input of
its output layer) and ``classify(features)`` (the logits), with ``forward(x) == classify(embed(x))``.
fdlit's networks (MLP, SmallCNN, LeNet5, ResNet18) have both; the client computes a step's features
and logits in one forward through them, so the loss sees the features of the very forward that
produced its logits, with no hook and no state kept between calls. (A two-network client,
``fdlit.models.mutual.MutualPair``, splits its forward the same way: its "features" are both
networks' logits and its ``classify`` reads the private half.)
"""

from __future__ import annotations

import torch

from fdlit.errors import ConfigError


def split_network(model: torch.nn.Module) -> tuple[torch.nn.Module | None, torch.nn.Module]:
    """(the dataset's input module or None, the network after it)."""
    from fdlit.data.augment import WithInput

    if isinstance(model, WithInput):
        return model.input, model.net
    return None, model


def has_feature_split(net: torch.nn.Module) -> bool:
    return callable(getattr(net, "embed", None)) and callable(getattr(net, "classify", None))


def check_feature_network(model: torch.nn.Module, method: str) -> None:
    """Refuse, with one line naming ``model``, a network that does not expose its penultimate features."""
    _, net = split_network(model)
    if not has_feature_split(net):
        raise ConfigError("model", f"{method} reads each step's penultimate features, so the network must provide "
                          f"embed(x) -> B x D features and classify(features) -> logits, with forward(x) == "
                          f"classify(embed(x)); {type(net).__name__} does not")


def features_and_logits(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(penultimate features flattened to B x D, logits) of one forward of ``model`` on ``x``: the
    same computation as ``model(x)`` (the input module first, then the network's two halves)."""
    inputs, net = split_network(model)
    if inputs is not None:
        x = inputs(x)
    features = net.embed(x)
    return features.flatten(1), net.classify(features)


def check_shared_feature_width(models: list[torch.nn.Module], input_shape: tuple[int, ...], method: str) -> None:
    """Refuse, before any training and naming ``model``, clients whose penultimate widths differ, for a
    method that averages features across clients (FedProto's prototypes). One forward of a zero input per
    network, in eval mode and without gradients, so no running statistic or random draw changes."""
    widths = set()
    for model in models:
        training = model.training
        model.eval()
        with torch.no_grad():
            device = next(model.parameters()).device
            widths.add(features_and_logits(model, torch.zeros(1, *input_shape, device=device))[0].shape[1])
        model.train(training)
    if len(widths) > 1:
        raise ConfigError("model", f"{method} averages the clients' penultimate features per class, so every "
                          f"client's penultimate width (the input of its output layer) must agree; got widths "
                          f"{sorted(widths)}")

"""The grouped network (fdlit.execution.grouped): a stack of convolutional chains computed without
vmap gives each client's own logits and gradients, and a federation trained with it matches the
sequential and the vmapped executors within float tolerance."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fdlit.clients import ClientOptimization
from fdlit.data import FederatedData
from fdlit.execution import SequentialExecutor, VectorizedExecutor
from fdlit.execution.grouped import GroupedNetwork
from fdlit.federation import FederationLoop
from fdlit.methods import FedProx, SmoothedUncertaintyWeighted
from fdlit.models import MLP, LeNet5, ResNet18, SmallCNN

# metrics of one round may differ by float rounding only (grouped convolutions sum in another order)
METRIC_TOL = 1e-4


def stacked(nets):
    names = [n for n, _ in nets[0].named_parameters()]
    return {n: torch.stack([dict(m.named_parameters())[n].detach() for m in nets]) for n in names}


@pytest.mark.parametrize("model_fn,shape", [
    (lambda: LeNet5((1, 28, 28), 10), (1, 28, 28)),
    (lambda: SmallCNN((3, 8, 8), 10, channels=4, hidden=8), (3, 8, 8)),
    (lambda: nn.Sequential(nn.Conv2d(2, 4, 3, stride=2, groups=2), nn.Tanh(), nn.AvgPool2d(2), nn.Flatten(),
                           nn.Linear(4 * 3 * 3, 5, bias=False)), (2, 15, 15)),
    (lambda: MLP((1, 8, 8), 5, hidden=[12, 7]), (1, 8, 8)),
    (lambda: nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 5)), (6,)),
], ids=["lenet5", "smallcnn", "grouped-conv-no-bias", "mlp", "tabular-mlp"])
def test_logits_and_gradients_are_each_clients_own(model_fn, shape):
    torch.manual_seed(0)
    nets = [model_fn() for _ in range(3)]
    grouped = GroupedNetwork.build(nets[0], torch.zeros(1, *shape))
    assert grouped is not None
    x = torch.randn(3, 6, *shape)
    t = torch.randint(0, 5, (3, 6))
    params = {n: p.requires_grad_() for n, p in stacked(nets).items()}
    logits = grouped(params, {}, x, training=True)
    own = torch.stack([net(xi) for net, xi in zip(nets, x, strict=True)])
    torch.testing.assert_close(logits, own, atol=1e-5, rtol=1e-5)
    loss = F.cross_entropy(logits.flatten(0, 1), t.flatten())
    grads = torch.autograd.grad(loss, list(params.values()))
    F.cross_entropy(own.flatten(0, 1), t.flatten()).backward()
    for name, g in zip(params, grads, strict=True):
        expected = torch.stack([dict(net.named_parameters())[name].grad for net in nets])
        torch.testing.assert_close(g, expected, atol=1e-6, rtol=1e-4, msg=name)
    # one input for every client (inference on the public or test set)
    shared = torch.randn(5, *shape)
    with torch.no_grad():
        torch.testing.assert_close(grouped(params, {}, shared, training=False, shared=True),
                                   torch.stack([net(shared) for net in nets]), atol=1e-5, rtol=1e-5)


class FunctionalReLU(nn.Module):
    """A functional op between layers."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 2, 3), nn.Linear(2 * 6 * 6, 3)

    def forward(self, x):
        return self.fc(F.relu(self.conv(x)).flatten(1))


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.flat, self.fc = nn.Conv2d(1, 1, 3, padding=1), nn.Flatten(), nn.Linear(64, 3)

    def forward(self, x):
        return self.fc(self.flat(x + self.conv(x)))


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.act, self.flat, self.fc = nn.Conv2d(1, 1, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3)

    def forward(self, x):
        return self.fc(self.flat(self.act(self.conv(self.act(x)))))


class ParameterRead(nn.Module):
    """A parameter used directly (not through its module)."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 2, 3), nn.Linear(2 * 6 * 6, 3)

    def forward(self, x):
        return self.fc(F.conv2d(x, self.conv.weight).flatten(1))


class Branching(nn.Module):
    """Control flow on the data: not traceable."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 2, 3), nn.Linear(2 * 6 * 6, 3)

    def forward(self, x):
        h = self.conv(x)
        return self.fc((h if h.sum() > 0 else -h).flatten(1))


@pytest.mark.parametrize("model", [
    FunctionalReLU(), Residual(), Twice(),
    nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(72, 3)),
], ids=["functional-op", "residual", "layer-called-twice", "batchnorm"])
def test_functional_ops_skips_and_batchnorm_are_covered(model):
    """A functional op, a skip connection (from the input itself), a layer called twice, BatchNorm:
    each client's own logits (eval mode; tests/test_grouped_residual.py checks training in float64)."""
    torch.manual_seed(0)
    nets = [copy.deepcopy(model) for _ in range(3)]
    for net in nets:
        for p in net.parameters():
            nn.init.normal_(p)
        net.eval()
    grouped = GroupedNetwork.build(nets[0], torch.zeros(1, 1, 8, 8))
    assert grouped is not None
    x = torch.randn(3, 4, 1, 8, 8)
    buffers = {n: torch.stack([dict(m.named_buffers())[n] for m in nets]) for n, _ in nets[0].named_buffers()}
    with torch.no_grad():
        torch.testing.assert_close(grouped(stacked(nets), buffers, x, training=False),
                                   torch.stack([net(xi) for net, xi in zip(nets, x, strict=True)]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model", [
    nn.Sequential(nn.Flatten(), nn.Linear(64, 4), nn.LayerNorm(4), nn.Linear(4, 3)), ParameterRead(), Branching(),
    nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(72, 3), nn.Unflatten(1, (3, 1))),
    nn.Sequential(nn.Conv2d(1, 2, 3)),  # ends on an image, not one row per sample
    nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.BatchNorm1d(72), nn.Linear(72, 3)),
    nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2, momentum=None), nn.Flatten(), nn.Linear(72, 3)),
], ids=["layernorm-mlp", "parameter-read", "data-dependent-branch", "unsupported-layer", "no-flatten", "batchnorm1d",
        "cumulative-batchnorm"])
def test_other_networks_are_left_to_vmap(model):
    assert GroupedNetwork.build(model, torch.zeros(1, 1, 8, 8)) is None


def fit(executor, aggregator, rounds=1):
    loop = FederationLoop(
        rounds=rounds, private_epochs_first=2, private_epochs=1, public_epochs_first=1, public_epochs=1,
        executor=executor,
        data=FederatedData(num_clients=4, partition="dirichlet", dirichlet_alpha=0.5, public_size=100),
        model={"class_path": "fdlit.models.SmallCNN", "init_args": {"channels": 4, "hidden": 16}},
        aggregator=aggregator, client=ClientOptimization(batch_size=16),
    )
    loop.fit()
    return loop


@pytest.mark.parametrize("aggregator", [SmoothedUncertaintyWeighted, lambda: FedProx(mu=0.1)], ids=["suwa", "fedprox"])
def test_one_round_matches_sequential_and_vmap(aggregator):
    """One round of a digits federation with a conv net (unequal private sets): the grouped
    network's metrics equal the sequential and the vmapped executor's within METRIC_TOL. FedProx's
    loss term reads each client's parameters: the grouped step hands the loss the client's own."""
    grouped = VectorizedExecutor(conv_network="grouped")
    loops = [fit(SequentialExecutor(), aggregator()), fit(VectorizedExecutor(conv_network="vmap"), aggregator()),
             fit(grouped, aggregator())]
    assert any(g is not None for g in grouped._grouped.values())  # the grouped network did run
    reference = loops[0].history[-1]
    compared = 0
    for loop in loops[1:]:
        for key, value in loop.history[-1].items():
            if key.startswith(("time/", "comm/")) or not isinstance(value, float):
                continue
            assert value == pytest.approx(reference[key], abs=METRIC_TOL, nan_ok=True), key
            compared += 1
    assert compared > 10
    for a, b in zip(loops[0].view.clients, loops[2].view.clients, strict=True):
        for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
            torch.testing.assert_close(pa, pb, atol=METRIC_TOL, rtol=0)


def test_auto_uses_the_grouped_network_on_cpu_and_vmap_keeps_it_off():
    auto, vmapped = VectorizedExecutor(), VectorizedExecutor(conv_network="vmap")
    fit(auto, SmoothedUncertaintyWeighted())
    fit(vmapped, SmoothedUncertaintyWeighted())
    assert any(g is not None for g in auto._grouped.values())
    assert not any(g is not None for g in vmapped._grouped.values())


def test_conv_network_names_its_allowed_values():
    from fdlit.errors import ConfigError

    with pytest.raises(ConfigError, match="conv_network.*auto, grouped, vmap"):
        VectorizedExecutor(conv_network="loop")


def test_automatic_choice_on_cpu_stacks_convolutions_where_measured_faster():
    """On a CPU (a sample given), a conv chain is vectorized (grouped network), with BatchNorm too
    (conv + BatchNorm chain, benchmarks/stacked_conv.py --model convbn: 0.65x the per-client loop's
    CPU); a conv net the grouped form does not cover (BatchNorm1d after Flatten: vmap) is vectorized
    with digits-sized activations and runs one client at a time with LeNet-sized ones; an MLP is
    vectorized; without a sample (no device known) the CPU rules do not apply."""
    from fdlit.clients import ClientModule
    from fdlit.execution import select_executor

    def clients(model_fn):
        return [ClientModule(model_fn(), i, [0, 1], ClientOptimization(), seed=3) for i in range(3)]

    from fdlit.execution.selection import CPU_MAX_VMAP_CONV_ACTIVATION

    def conv_bn(channels):  # largest activation: channels x 26 x 26
        return lambda: nn.Sequential(nn.Conv2d(1, channels, 3), nn.Flatten(), nn.BatchNorm1d(channels * 26 * 26),
                                     nn.Linear(channels * 26 * 26, 3))

    sample = torch.zeros(1, 1, 28, 28)
    chain = clients(lambda: LeNet5((1, 28, 28), 10))
    small_bn, large_bn = clients(conv_bn(2)), clients(conv_bn(8))
    assert 2 * 26 * 26 <= CPU_MAX_VMAP_CONV_ACTIVATION < 8 * 26 * 26
    mlp = clients(lambda: MLP((1, 28, 28), 10, hidden=[8]))
    assert isinstance(select_executor(chain, sample=sample), VectorizedExecutor)
    assert isinstance(select_executor(small_bn, sample=sample), VectorizedExecutor)
    assert isinstance(select_executor(large_bn, sample=sample), SequentialExecutor)
    grouped_bn = clients(lambda: nn.Sequential(nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.Flatten(),
                                               nn.Linear(8 * 26 * 26, 3)))
    assert isinstance(select_executor(grouped_bn, sample=sample), VectorizedExecutor)
    resnet = clients(lambda: ResNet18((1, 28, 28), 10))  # the grouped form covers it, but does not pay on a CPU
    assert isinstance(select_executor(resnet, sample=sample), SequentialExecutor)
    assert isinstance(select_executor(mlp, sample=sample), VectorizedExecutor)
    # under autocast LeNet-5 runs under vmap: 6 x 28 x 28 values, above the limit
    assert isinstance(select_executor(chain, "bf16-mixed", sample=sample), SequentialExecutor)
    assert isinstance(select_executor(large_bn), VectorizedExecutor)
    assert all(c.model.training for c in chain + large_bn)  # the checks ran in eval mode and restored it

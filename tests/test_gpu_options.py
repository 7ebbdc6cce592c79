"""Opt-in device options (channels-last weights, torch.compile), checked for correctness on a CPU
at toy size: they change speed, not what is computed."""

import pytest
import torch
from torch import nn

from fdlit.clients import ClientModule, ClientOptimization
from fdlit.data import FederatedData
from fdlit.errors import ConfigError
from fdlit.execution import RayExecutor, SequentialExecutor, VectorizedExecutor
from fdlit.execution.vectorized import unsupported_reason
from fdlit.federation import FederationLoop
from fdlit.methods import ProbabilityAveraging

EXECUTORS = {"sequential": SequentialExecutor, "vectorized": VectorizedExecutor,
             "vectorized-vmap": lambda: VectorizedExecutor(conv_network="vmap"), "ray": RayExecutor}


def run(executor, rounds=1, model="SmallCNN", **kw):
    init = {"channels": 4, "hidden": 16} if model == "SmallCNN" else {"hidden": [16]}
    loop = FederationLoop(rounds=rounds, private_epochs_first=1, private_epochs=1, public_epochs_first=1,
                          public_epochs=1, executor=EXECUTORS[executor](),
                          data=FederatedData(num_clients=3, classes_per_client=4, public_size=64),
                          model={"class_path": f"fdlit.models.{model}", "init_args": init},
                          aggregator=ProbabilityAveraging(), **kw)
    loop.fit()
    return loop


def max_weight_difference(a, b):
    return max((x - y).abs().max().item() for ca, cb in zip(a.view.clients, b.view.clients, strict=True)
               for x, y in zip(ca.model.parameters(), cb.model.parameters(), strict=True))


@pytest.mark.parametrize("executor", ["sequential", "vectorized", "vectorized-vmap", "ray"])
def test_channels_last_keeps_the_layout_and_the_results(executor, request):
    if executor == "ray":
        request.getfixturevalue("ray_local")  # the executor uses the running 2-CPU Ray
    plain, nhwc = run(executor), run(executor, channels_last=True)
    for c in nhwc.view.clients:
        convs = [p for p in c.model.parameters() if p.dim() == 4]
        assert convs and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
        assert not convs[1].is_contiguous()  # 4 -> 8 channels: really NHWC, not trivially both
        for p in convs:  # optimizer state in the weights' layout (fused kernels need one layout)
            state = c.configure_optimizers().state[p]
            assert state["exp_avg"].stride() == p.stride()
    assert max_weight_difference(plain, nhwc) < 1e-6
    assert [m["after_public/global_acc_mean"] for m in nhwc.history] == \
        [m["after_public/global_acc_mean"] for m in plain.history]


class ConvBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                                 nn.Conv2d(4, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 64, 10))

    def forward(self, x):
        return self.net(x)


def train_bn_clients(executor, channels_last: bool):
    from lightning.fabric import Fabric

    torch.manual_seed(0)
    clients = [ClientModule(ConvBatchNorm(), i, [0, 1], ClientOptimization(), seed=3) for i in range(3)]
    if channels_last:  # what federation.channels_last does before the executor's set-up
        for c in clients:
            c.model.to(memory_format=torch.channels_last)
    executor.setup(Fabric(accelerator="cpu", devices=1, precision="32-true"), clients)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)) for n in (20, 33, 16)]
    losses = executor.train(clients, "private", data, epochs=2, batch_size=8)
    return clients, losses, executor.predict(clients, data[0][0])


def test_channels_last_batchnorm_nets_train_stacked_on_cpu():
    """A conv + BatchNorm net under vmap with channels-last weights: the vectorized executor stacks
    it in the default layout on a CPU, computes what the sequential executor computes and writes back
    in the clients' layout. On CUDA such clients run one at a time under vmap (cuDNN's batch norm asks
    vmap's tensors for their layout, which vmap refuses)."""
    seq, seq_losses, seq_pred = train_bn_clients(SequentialExecutor(), channels_last=True)
    executor = VectorizedExecutor(strict=True, conv_network="vmap")
    vec, vec_losses, vec_pred = train_bn_clients(executor, channels_last=True)
    assert executor.forms == {"vmap"}
    assert vec_losses == pytest.approx(seq_losses, rel=1e-5)
    torch.testing.assert_close(vec_pred, seq_pred, atol=1e-4, rtol=1e-4)
    for a, b in zip(seq, vec, strict=True):
        conv = b.model.net[3].weight
        assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
        for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
            torch.testing.assert_close(pa, pb, atol=1e-5, rtol=1e-4)
    assert unsupported_reason(vec[0], device="cpu") is None
    assert "channels-last weights on CUDA" in unsupported_reason(vec[0], device="cuda")
    plain = train_bn_clients(VectorizedExecutor(), channels_last=False)[0]
    assert unsupported_reason(plain[0], device="cuda") is None


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_compile_traces_the_training_step_and_computes_the_same(executor):
    """aot_eager: dynamo captures the graph and AOT autograd builds forward and backward, without
    code generation (fast enough for a test); two rounds reuse the graphs of round 1."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    plain = run(executor, rounds=2, model="MLP")
    graphs = []
    for rounds in (1, 2):
        torch._dynamo.reset()  # a fresh cache: count what this run compiles
        counters.clear()
        compiled = run(executor, rounds=rounds, model="MLP", compile=True, compile_backend="aot_eager")
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] >= 1 and graphs[1] == graphs[0]  # compiled in round 1, reused in round 2
    assert max_weight_difference(plain, compiled) < 1e-6
    assert list(compiled.view.clients[0].model.state_dict()) == list(plain.view.clients[0].model.state_dict())


def test_compile_with_inductor_on_the_vectorized_step():
    """The default backend generates C++ for the vmapped training step (slow to compile, hence one test)."""
    plain = run("vectorized", model="MLP")
    compiled = run("vectorized", model="MLP", compile=True)
    assert max_weight_difference(plain, compiled) < 1e-5


def test_bad_compile_settings_are_refused():
    with pytest.raises(ConfigError, match="federation.compile_backend"):
        FederationLoop(compile=True, compile_backend="no-such-backend")
    with pytest.raises(ConfigError, match="federation.compile"):
        RayExecutor().configure("aot_eager")

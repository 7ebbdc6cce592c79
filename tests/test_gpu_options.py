"""Opt-in device options (channels-last weights, torch.compile), checked for correctness on a CPU
at toy size: they change speed, not what is computed."""

import pytest
import torch

from fdlit.data import FederatedData
from fdlit.errors import ConfigError
from fdlit.execution import SequentialExecutor, VectorizedExecutor
from fdlit.federation import FederationLoop
from fdlit.methods import ProbabilityAveraging

EXECUTORS = {"sequential": SequentialExecutor, "vectorized": VectorizedExecutor}


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
    return max((x - y).abs().max().item() for ca, cb in zip(a.clients, b.clients, strict=True)
               for x, y in zip(ca.model.parameters(), cb.model.parameters(), strict=True))


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_channels_last_keeps_the_layout_and_the_results(executor):
    plain, nhwc = run(executor), run(executor, channels_last=True)
    for c in nhwc.clients:
        convs = [p for p in c.model.parameters() if p.dim() == 4]
        assert convs and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
        assert not convs[1].is_contiguous()  # 4 -> 8 channels: really NHWC, not trivially both
        for p in convs:  # optimizer state in the weights' layout (fused kernels need one layout)
            state = c.configure_optimizers().state[p]
            assert state["exp_avg"].stride() == p.stride()
    assert max_weight_difference(plain, nhwc) < 1e-6
    assert [m["after_public/global_acc_mean"] for m in nhwc.history] == \
        [m["after_public/global_acc_mean"] for m in plain.history]


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
    assert list(compiled.clients[0].model.state_dict()) == list(plain.clients[0].model.state_dict())


def test_compile_with_inductor_on_the_vectorized_step():
    """The default backend generates C++ for the vmapped training step (slow to compile, hence one test)."""
    plain = run("vectorized", model="MLP")
    compiled = run("vectorized", model="MLP", compile=True)
    assert max_weight_difference(plain, compiled) < 1e-5


def test_bad_compile_settings_are_refused():
    with pytest.raises(ConfigError, match="federation.compile_backend"):
        FederationLoop(compile=True, compile_backend="no-such-backend")
    from fdlit.execution import RayExecutor

    with pytest.raises(ConfigError, match="federation.compile"):
        RayExecutor().configure("aot_eager")

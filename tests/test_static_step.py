"""The captured grouped step (``federation.cuda_graphs``, fdlit.execution.graph_step) on a CPU: the
same static-shape step without the capture. It must compute what the eager grouped step computes
(bit for bit: the same kernels on copied inputs) and so what per-client networks compute (float64),
with padded batches (zero weights), BatchNorm's short last batches (eager), clients of unequal sizes
(step counts that part) and the optimizer update inside or after the step."""

import pytest
import torch
from test_grouped_residual import TOL, TinyResNet, assert_same_clients, train_phases

from fdlit.execution import SequentialExecutor, VectorizedExecutor
from fdlit.execution import graph_step as graph_step_module
from fdlit.models import SmallCNN


def small_cnn():
    """No batch-dependent layer: short batches are padded with zero-weight samples."""
    return SmallCNN((3, 8, 8), 10, channels=4, hidden=8)


@pytest.fixture
def static_calls(monkeypatch):
    """How many steps each StaticStep ran (eager fall-backs for parted step counts not included)."""
    calls = []
    original = graph_step_module.StaticStep._body

    def counted(self):
        calls.append(self.optimizer_inside)
        return original(self)

    monkeypatch.setattr(graph_step_module.StaticStep, "_body", counted)
    return calls


def static_executor(graph_optimizer=True):
    executor = VectorizedExecutor(strict=True, conv_network="grouped", graph_optimizer=graph_optimizer)
    executor.cuda_graphs = True  # what federation.cuda_graphs sets (refused without CUDA: set by hand)
    return executor


@pytest.mark.parametrize("model,sizes,graph_optimizer", [
    (TinyResNet, (16, 16, 16), True), (TinyResNet, (16, 16, 16), False), (TinyResNet, (20, 33, 16), True),
    (small_cnn, (20, 33, 16), True)],
    ids=["resnet-equal-sizes", "resnet-optimizer-after", "resnet-unequal-sizes", "cnn-padded"])
def test_static_step_equals_the_eager_grouped_step_and_per_client_networks(model, sizes, graph_optimizer,
                                                                            static_calls):
    eager_executor = VectorizedExecutor(strict=True, conv_network="grouped")
    eager, eager_losses, eager_pred = train_phases(eager_executor, sizes=sizes, model=model)
    executor = static_executor(graph_optimizer)
    static, losses, pred = train_phases(executor, sizes=sizes, model=model)
    assert executor.forms == {"grouped"}
    assert len(static_calls) >= 6  # every phase ran full-width steps through the static step
    if graph_optimizer and len(set(sizes)) == 1:
        assert all(static_calls)  # one step count for the stack: the update ran inside
    assert losses == eager_losses
    assert torch.equal(pred, eager_pred)
    assert_same_clients(static, eager, atol=0)
    seq, seq_losses, seq_pred = train_phases(SequentialExecutor(), sizes=sizes, model=model)
    for a, b in zip(seq_losses, losses, strict=True):
        assert a == pytest.approx(b, rel=TOL, abs=TOL)
    torch.testing.assert_close(pred, seq_pred, atol=TOL, rtol=TOL)
    assert_same_clients(static, seq, atol=TOL)


def test_the_static_step_is_off_unless_asked_and_for_the_vmapped_form(static_calls):
    train_phases(VectorizedExecutor(strict=True, conv_network="grouped"), sizes=(8, 8))
    vmapped = VectorizedExecutor(strict=True, conv_network="vmap")
    vmapped.cuda_graphs = True
    train_phases(vmapped, sizes=(8, 8))
    assert static_calls == []

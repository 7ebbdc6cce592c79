"""The grouped network for residual networks and BatchNorm (fdlit.execution.grouped): M clients'
ResNets as one network compute what M per-client networks compute (float64: logits, gradients,
BatchNorm running statistics, train and eval mode), the vectorized executor takes that path and
hands every client its own state, and the path is chosen by device and precision as documented."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fdlit.execution import SequentialExecutor, VectorizedExecutor
from fdlit.execution.grouped import GroupedNetwork, grouped_applies
from fdlit.models import LeNet5, ResNet18, SmallCNN
from tests.stacking import TOL, TinyResNet, assert_same_states, train_phases


def randomised_batchnorm(net):
    """BatchNorm weights and running statistics away from their initial 1 / 0, so a mix-up shows."""
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.3, 0.3)
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return net


MODELS = {
    "resnet18-cifar": (lambda: ResNet18((3, 16, 16), 10), (3, 16, 16)),
    "resnet18-imagenet-stem": (lambda: ResNet18((3, 32, 32), 10, stem="imagenet"), (3, 32, 32)),
    "tiny-resnet": (TinyResNet, (3, 8, 8)),
    "lenet5": (lambda: LeNet5((1, 28, 28), 10), (1, 28, 28)),
    "smallcnn": (lambda: SmallCNN((1, 8, 8), 10, channels=4, hidden=8), (1, 8, 8)),
}


def stacked(dicts):
    return {k: torch.stack([d[k].detach().clone() for d in dicts]) for k in dicts[0]}


def stack(nets, kind):
    return stacked([dict(getattr(n, f"named_{kind}")()) for n in nets])


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", list(MODELS))
def test_grouped_network_equals_per_client_networks_in_float64(name, training):
    """Logits, every parameter's gradient and the BatchNorm running statistics (updated in train
    mode, read in eval mode) of the grouped network equal M = 3 per-client networks' within 1e-6."""
    factory, shape = MODELS[name]
    torch.manual_seed(0)
    nets = [randomised_batchnorm(factory().double()).train(training) for _ in range(3)]
    grouped = GroupedNetwork.build(nets[0], torch.zeros(1, *shape, dtype=torch.float64))
    assert grouped is not None
    params = {k: v.requires_grad_() for k, v in stack(nets, "parameters").items()}
    buffers = stack(nets, "buffers")
    initial = stack(nets, "buffers")
    x = torch.randn(3, 5, *shape, dtype=torch.float64)
    t = torch.randint(0, 10, (3, 5))
    logits = grouped(params, buffers, x, training=training)
    own = torch.stack([net(xi) for net, xi in zip(nets, x, strict=True)])
    torch.testing.assert_close(logits, own, atol=TOL, rtol=TOL)
    grads = torch.autograd.grad(F.cross_entropy(logits.flatten(0, 1), t.flatten()), list(params.values()))
    F.cross_entropy(own.flatten(0, 1), t.flatten()).backward()
    own_grads = stacked([{n: p.grad for n, p in net.named_parameters()} for net in nets])
    for k, g in zip(params, grads, strict=True):
        torch.testing.assert_close(g, own_grads[k], atol=TOL, rtol=TOL, msg=k)
    own_buffers = stack(nets, "buffers")
    assert own_buffers.keys() == buffers.keys()
    for k, b in buffers.items():
        torch.testing.assert_close(b, own_buffers[k], atol=TOL, rtol=TOL, msg=k)
        if k.endswith("running_mean"):  # moved in train mode, untouched in eval mode
            assert torch.equal(b, initial[k]) != training, k
    with torch.no_grad():  # one input for every client (inference on the public or test set)
        for net in nets:
            net.eval()
        shared = torch.randn(4, *shape, dtype=torch.float64)
        torch.testing.assert_close(grouped(params, buffers, shared, training=False, shared=True),
                                   torch.stack([net(shared) for net in nets]), atol=TOL, rtol=TOL)


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_vectorized_executor_takes_the_grouped_path_for_residual_networks(chunk_size):
    """The automatic form on a CPU at 64-true is the grouped network (asserted: a silent fall-back to
    vmap fails here), and three phases with unequal private sets (BatchNorm: clients out of batches
    run as a smaller stack) leave every client's weights, running statistics and optimizer state
    as the sequential executor leaves them."""
    seq, seq_losses, seq_pred = train_phases(SequentialExecutor())
    executor = VectorizedExecutor(strict=True, chunk_size=chunk_size)
    vec, vec_losses, vec_pred = train_phases(executor)
    assert executor.forms == {"grouped"}
    assert [g is not None for g in executor._grouped.values()] == [True]
    for a, b in zip(seq_losses, vec_losses, strict=True):
        assert a == pytest.approx(b, rel=TOL, abs=TOL)
    torch.testing.assert_close(vec_pred, seq_pred, atol=TOL, rtol=TOL)
    assert_same_states(seq, vec, atol=TOL)
    assert all(c.model.training for c in vec)  # predict restored the mode


def test_vmap_form_is_kept_on_request_and_computes_the_same():
    executor = VectorizedExecutor(strict=True, conv_network="vmap")
    vec, _, pred = train_phases(executor, sizes=(12, 12))
    grouped, _, grouped_pred = train_phases(VectorizedExecutor(strict=True), sizes=(12, 12))
    assert executor.forms == {"vmap"}
    torch.testing.assert_close(pred, grouped_pred, atol=TOL, rtol=TOL)
    assert_same_states(vec, grouped, atol=TOL)


def test_bf16_autocast_runs_grouped_where_asked():
    """bf16-mixed (what CUDA runs by default; on a CPU only with ``conv_network: grouped``):
    convolutions in bf16, BatchNorm with float32 statistics; same losses and predictions as the
    sequential executor within bf16's precision."""
    seq, seq_losses, seq_pred = train_phases(SequentialExecutor(), "bf16-mixed", sizes=(16, 16, 16))
    executor = VectorizedExecutor(strict=True, conv_network="grouped")
    vec, vec_losses, vec_pred = train_phases(executor, "bf16-mixed", sizes=(16, 16, 16))
    assert executor.forms == {"grouped"}
    for a, b in zip(seq_losses, vec_losses, strict=True):
        assert a == pytest.approx(b, rel=0.05)
    torch.testing.assert_close(vec_pred, seq_pred, atol=0.1, rtol=0.05)
    for c in vec:
        assert all(b.dtype in (torch.float32, torch.int64) for b in c.model.buffers())


@pytest.mark.parametrize("device,precision,conv_network,expected", [
    ("cpu", "32-true", "auto", True), ("cpu", "64-true", "auto", True), ("cpu", "bf16-mixed", "auto", False),
    ("cuda", "32-true", "auto", True), ("cuda", "bf16-mixed", "auto", True), ("cuda", "bf16-true", "auto", True),
    ("mps", "32-true", "auto", False), ("cuda", "bf16-mixed", "vmap", False), ("cpu", "bf16-mixed", "grouped", True),
    ("mps", "32-true", "grouped", True),
])
def test_where_the_grouped_network_is_chosen(device, precision, conv_network, expected):
    assert grouped_applies(conv_network, device, precision) is expected


def test_inference_batches_are_bounded_on_a_cpu_only():
    grouped = GroupedNetwork.build(LeNet5((1, 28, 28), 10), torch.zeros(1, 1, 28, 28))
    assert grouped.widest == 6 * 28 * 28
    assert grouped.inference_batch(20, 4, 1024, "cpu") == (8 << 20) // (6 * 28 * 28 * 20 * 4)
    assert grouped.inference_batch(20, 4, 1024, "cuda") == 1024


def test_compiled_grouped_forward_computes_the_same():
    """``federation.compile`` compiles the grouped network's forward (here with the ``aot_eager``
    backend: the graph capture and autograd of a real compile, without generating code)."""
    plain, plain_losses, plain_pred = train_phases(VectorizedExecutor(strict=True), "32-true", sizes=(8, 8))
    executor = VectorizedExecutor(strict=True)
    comp, comp_losses, comp_pred = train_phases(executor, "32-true", sizes=(8, 8), compile_backend="aot_eager")
    assert executor.forms == {"grouped"}
    (network,) = executor._grouped.values()
    assert network._compiled is not None and network._compiled[0] == "aot_eager"
    for a, b in zip(plain_losses, comp_losses, strict=True):
        assert b == pytest.approx(a, rel=1e-5)
    torch.testing.assert_close(comp_pred, plain_pred, atol=1e-5, rtol=1e-5)
    assert_same_states(plain, comp, atol=1e-5)


def test_the_grouped_form_pays_on_a_cpu_for_small_networks_only():
    """ResNet-18 is covered everywhere but runs under vmap on a CPU (the grouped form took 2.0x the
    per-client loop's CPU there, benchmarks/stacked_conv.py); small residual networks stay grouped."""
    resnet = GroupedNetwork.build(ResNet18((3, 16, 16), 10), torch.zeros(1, 3, 16, 16))
    tiny = GroupedNetwork.build(TinyResNet(), torch.zeros(1, 3, 8, 8))
    assert resnet is not None and tiny is not None
    assert not resnet.pays_on("cpu") and resnet.pays_on("cuda")
    assert tiny.pays_on("cpu")
    executor = VectorizedExecutor(strict=True)
    train_phases(executor, "32-true", sizes=(4, 4), model=lambda: ResNet18((3, 8, 8), 10))
    assert executor.forms == {"vmap"}


def test_the_papers_resnet18_through_the_executor_equals_sequential():
    """The paper's ResNet-18 (CIFAR stem, 8x8 images to keep it small) through the vectorized
    executor with the grouped network (as on CUDA; on a CPU ``auto`` leaves it to vmap), float64:
    weights, running statistics, Adam state and predictions of the sequential executor."""
    def model():
        return ResNet18((3, 8, 8), 10)

    seq, seq_losses, seq_pred = train_phases(SequentialExecutor(), sizes=(6, 9), model=model)
    executor = VectorizedExecutor(strict=True, conv_network="grouped")
    vec, vec_losses, vec_pred = train_phases(executor, sizes=(6, 9), model=model)
    assert executor.forms == {"grouped"}
    for a, b in zip(seq_losses, vec_losses, strict=True):
        assert a == pytest.approx(b, rel=TOL, abs=TOL)
    torch.testing.assert_close(vec_pred, seq_pred, atol=TOL, rtol=TOL)
    assert_same_states(seq, vec, atol=TOL)

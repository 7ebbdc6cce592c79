"""The stacked training step without vmap (grouped network forward, the clients' cross-entropies on
M x B x K logits, plain autograd, the stacked optimizer) computes what the sequential executor
computes, for MLPs and conv nets, private (CE) and public (KD) steps, with uneven private sets (padded
batches); networks or losses the grouped form does not cover fall back to vmap."""

import pytest
import torch
from torch import nn

import fdlit.execution.grouped as grouped_module
import fdlit.execution.vmap_step as vmap_step_module
from fdlit.clients import ClientOptimization
from fdlit.execution import SequentialExecutor, VectorizedExecutor
from fdlit.execution.stacked_loss import loss_is_plain, stacked_cross_entropy
from fdlit.methods import FedProx
from fdlit.models import MLP, SmallCNN
from tests.stacking import assert_same_clients, make_clients, run_phases

MODELS = {
    "mlp": lambda i: MLP((1, 8, 8), 10, hidden=[24]),
    "cnn": lambda i: SmallCNN((1, 8, 8), 10, channels=4, hidden=16),
}


def no_vmap(*args, **kwargs):
    raise AssertionError("vmap was called")


def agree(seq_clients, vec_clients, executor, phases):
    seq_losses, seq_pred = run_phases(SequentialExecutor(), seq_clients, phases)
    vec_losses, vec_pred = run_phases(executor, vec_clients, phases)
    assert executor.trained["sequential"] == 0
    for a, b in zip(seq_losses, vec_losses, strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(seq_pred, vec_pred, atol=1e-4, rtol=1e-4)
    assert_same_clients(seq_clients, vec_clients)


@pytest.mark.parametrize("phases", [("private",), ("public",), ("private", "public", "private")],
                         ids=["ce", "kd", "ce-kd-ce"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_stacked_step_runs_without_vmap_and_matches_sequential(model, phases, monkeypatch):
    opt = ClientOptimization(optimizer="adam", public_lr=3e-3)
    seq_clients, vec_clients = make_clients(MODELS[model], opt), make_clients(MODELS[model], opt)
    assert loss_is_plain(vec_clients[0])
    # neither the training step nor inference may reach torch.func.vmap
    monkeypatch.setattr(grouped_module, "vmap", no_vmap)
    monkeypatch.setattr(vmap_step_module, "vmap", no_vmap)
    monkeypatch.setattr("fdlit.execution.vectorized.vmap", no_vmap)
    executor = VectorizedExecutor()
    agree(seq_clients, vec_clients, executor, phases)
    assert executor.forms == {"grouped"}


def test_a_method_loss_keeps_its_hook_under_vmap_on_the_grouped_forward():
    """FedProx's proximal term reads each client's parameters: its loss runs through the client's hook
    (vmapped on the grouped network's logits), not the plain cross-entropy."""
    opt = ClientOptimization(optimizer="adam")
    seq_clients, vec_clients = make_clients(MODELS["mlp"], opt), make_clients(MODELS["mlp"], opt)
    for c in (*seq_clients, *vec_clients):
        c.method_part = FedProx(mu=0.5).client_part()
        center = torch.cat([p.detach().flatten() for p in c.model.parameters()]) + 0.1
        c.method_state.update(prox_center=center, prox_mu=torch.tensor(0.5))
    assert not loss_is_plain(vec_clients[0])
    executor = VectorizedExecutor()
    agree(seq_clients, vec_clients, executor, ("private",))
    assert executor.forms == {"grouped"}


class LayerNormMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 24), nn.LayerNorm(24), nn.ReLU(), nn.Linear(24, 10))

    def forward(self, x):
        return self.net(x)


def test_networks_the_grouped_form_does_not_cover_fall_back_to_vmap(monkeypatch):
    opt = ClientOptimization(optimizer="adam")
    seq_clients, vec_clients = make_clients(lambda i: LayerNormMLP(), opt), make_clients(lambda i: LayerNormMLP(), opt)
    calls = []
    real = vmap_step_module.vmap
    monkeypatch.setattr(vmap_step_module, "vmap", lambda *a, **k: calls.append(1) or real(*a, **k))
    executor = VectorizedExecutor()
    agree(seq_clients, vec_clients, executor, ("private", "public"))
    assert executor.forms == {"vmap"} and calls  # the vmapped training step ran


def test_stacked_cross_entropy_is_each_clients_weighted_mean():
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(3, 5, 4, generator=g), torch.randint(0, 4, (3, 5), generator=g)
    probs = torch.softmax(torch.randn(3, 5, 4, generator=g), -1)
    weight = torch.tensor([[1.0] * 5, [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    for target in (labels, probs):
        got = stacked_cross_entropy(logits, target, weight)
        for m in range(3):
            n = int(weight[m].sum())
            expected = torch.nn.functional.cross_entropy(logits[m, :n], target[m, :n])
            torch.testing.assert_close(got[m], expected)

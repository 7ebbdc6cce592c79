"""The client's private and public steps are what every executor calls: a subclass that overrides
``public_loss`` (here a KD temperature) trains differently, and the same, under every executor."""

import pytest
import torch
import torch.nn.functional as F

from fdlit.clients import ClientModule, ClientOptimization
from fdlit.data import FederatedData
from fdlit.errors import ConfigError
from fdlit.execution import SequentialExecutor, VectorizedExecutor
from fdlit.execution.vectorized import unsupported_reason
from fdlit.federation import FederationLoop
from fdlit.methods import ProbabilityAveraging


class TemperatureKD(ClientModule):
    """Hinton-style KD: CE(softmax(log P / T) || softmax(z / T)) * T^2, T = 4."""

    T = 4.0

    def public_loss(self, logits, teacher, weight=None):
        soft_teacher = F.softmax(torch.log(teacher.clamp_min(1e-8)) / self.T, -1)
        return super().public_loss(logits / self.T, soft_teacher, weight) * self.T ** 2


class OwnTrainingStep(ClientModule):
    def training_step(self, batch, batch_idx=0):
        return super().training_step(batch, batch_idx)


def loop(executor, client_class="fdlit.clients.ClientModule"):
    return FederationLoop(
        rounds=2, private_epochs_first=2, private_epochs=1, public_epochs_first=2, public_epochs=1,
        executor=executor, client_class=client_class,
        data=FederatedData(num_clients=4, classes_per_client=3, public_size=150),
        model={"class_path": "fdlit.models.MLP", "init_args": {"hidden": [32]}},
        aggregator=ProbabilityAveraging(), seed=1,
    )


def numbers(history):
    keys = ("after_public/global_acc_mean", "after_public/local_acc_mean", "train/public_loss_mean",
            "teacher/nll", "after_private/global_acc_mean")
    return [[m[k] for k in keys] for m in history]


def test_a_kd_temperature_subclass_trains_the_same_in_both_executors_and_differently_from_the_base():
    kd = f"{__name__}.TemperatureKD"
    seq, vec = loop(SequentialExecutor(), kd), loop(VectorizedExecutor(strict=True), kd)
    base = loop(SequentialExecutor())
    for run in (seq, vec, base):
        run.fit()
    assert all(type(c) is TemperatureKD for c in vec.view.clients)
    for a, b in zip(numbers(seq.history), numbers(vec.history), strict=True):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)
    # round 1's private phase is the same; from the first public phase on the subclass differs
    assert numbers(seq.history)[0][4] == numbers(base.history)[0][4]
    assert numbers(seq.history)[0][2] != pytest.approx(numbers(base.history)[0][2], rel=1e-3)
    def params(run):
        return torch.cat([p.detach().flatten() for p in run.view.clients[0].parameters()])
    assert not torch.allclose(params(seq), params(base))
    assert torch.allclose(params(seq), params(vec), atol=1e-5)


def test_overriding_the_losses_keeps_a_client_vectorizable_but_not_overriding_training_step():
    opt = ClientOptimization()
    assert unsupported_reason(TemperatureKD(torch.nn.Linear(4, 3), 0, [0], opt)) is None
    assert "training_step" in unsupported_reason(OwnTrainingStep(torch.nn.Linear(4, 3), 0, [0], opt))


def test_client_class_must_be_a_client_module():
    with pytest.raises(ConfigError, match="federation.client_class"):
        loop(None, "torch.nn.Linear")
    with pytest.raises(ConfigError, match="federation.client_class"):
        loop(None, "fdlit.nowhere.Client")


def test_augmentation_and_batch_order_draw_from_independent_streams():
    from fdlit.federation.construction import augmentation_seed

    seeds = {augmentation_seed(s, c) for s in range(3) for c in range(50)}
    assert len(seeds) == 150  # distinct per (seed, client)
    batch_order = {s * 1_000_003 + c for s in range(3) for c in range(50)}
    assert not seeds & batch_order
    # the first draws of the two streams differ (they were identical when both used one seed)
    a = torch.Generator().manual_seed(augmentation_seed(0, 7))
    b = torch.Generator().manual_seed(0 * 1_000_003 + 7)
    assert not torch.equal(torch.rand(16, generator=a), torch.rand(16, generator=b))

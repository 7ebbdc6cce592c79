"""Tiny federations trained by an executor, and the checks that two executors left every client alike,
for the executor tests (not a test module: tests import these instead of importing each other)."""

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch import nn

from fdlit.clients import ClientModule, ClientOptimization
from fdlit.execution import steps

TOL = 1e-6



# sizes chosen so clients have different numbers of batches and one ends an epoch with a single
# sample (33 % 16 == 1: that batch is skipped), exercising masking and the skip rule
SIZES = [33, 50, 7, 20]


class TinyResNet(nn.Module):
    """Two residual blocks (identity and 1x1-conv downsampling shortcut), functional ReLU and
    flatten, BatchNorm after every convolution: the ResNet-18 structure at toy size."""

    def __init__(self, input_shape=(3, 8, 8), num_classes=10):
        super().__init__()
        from fdlit.models.resnet import BasicBlock

        self.conv1 = nn.Conv2d(input_shape[0], 4, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.layer1 = nn.Sequential(BasicBlock(4, 4), BasicBlock(4, 8, stride=2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        x = self.layer1(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def make_clients(model_fn, opt, sizes=SIZES):
    torch.manual_seed(0)  # identical initial weights for every executor under test
    return [ClientModule(model_fn(i), i, [0, 1], opt, seed=3) for i in range(len(sizes))]


def make_data(sizes=SIZES):
    g = torch.Generator().manual_seed(1)
    private = [(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)) for n in sizes]
    pub_x = torch.randn(40, 1, 8, 8, generator=g)
    pub_p = torch.softmax(torch.randn(40, 10, generator=g), -1)
    return private, (pub_x, pub_p)


def run_phases(executor, clients, phases=("private", "public", "private")):
    executor.setup(Fabric(accelerator="cpu", devices=1, precision="32-true"), clients)
    private, public = make_data()
    losses = []
    for phase in phases:
        data = private if phase == "private" else [public] * len(clients)
        losses.append(executor.train(clients, phase, data, epochs=2, batch_size=16))
    return losses, executor.predict(clients, public[0])


def assert_same_clients(a, b, atol=1e-5):
    for ca, cb in zip(a, b, strict=True):
        for (name, pa), pb in zip(ca.model.named_parameters(), cb.model.parameters(), strict=True):
            torch.testing.assert_close(pa, pb, atol=atol, rtol=1e-4, msg=f"client {ca.client_id} {name}")
        for (name, ba), bb in zip(ca.model.named_buffers(), cb.model.buffers(), strict=True):  # BatchNorm statistics
            torch.testing.assert_close(ba, bb, atol=atol, rtol=1e-4, msg=f"client {ca.client_id} {name}")
        sa, sb = ca.configure_optimizers().state_dict(), cb.configure_optimizers().state_dict()
        assert sa["state"].keys() == sb["state"].keys()
        for k in sa["state"]:
            assert sa["state"][k].keys() == sb["state"][k].keys()
            for key, va in sa["state"][k].items():
                torch.testing.assert_close(va, sb["state"][k][key], atol=atol, rtol=1e-4)
                assert va.dtype == sb["state"][k][key].dtype and va.device == sb["state"][k][key].device
        assert torch.equal(ca.generator.get_state(), cb.generator.get_state())  # same randperm calls


def train_phases(executor, precision="64-true", sizes=(20, 33, 16), model=TinyResNet, compile_backend=None):
    """Three phases (private with unequal sets, public, private) and a prediction, on fresh clients."""
    torch.manual_seed(0)
    clients = [ClientModule(model(), i, [0, 1], ClientOptimization(optimizer="adam"), seed=3) for i in range(len(sizes))]
    steps.configure(executor, compile_backend)
    executor.setup(Fabric(accelerator="cpu", devices=1, precision=precision), clients)
    g = torch.Generator().manual_seed(1)
    private = [(torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)) for n in sizes]
    public = (torch.randn(24, 3, 8, 8, generator=g), torch.softmax(torch.randn(24, 10, generator=g), -1))
    losses = [executor.train(clients, phase, private if phase == "private" else [public] * len(clients), 2, 8)
              for phase in ("private", "public", "private")]
    return clients, losses, executor.predict(clients, public[0])


def assert_same_states(a, b, atol):
    """Parameters, BatchNorm buffers and Adam state of every client: each its own, as the sequential
    executor leaves them (what checkpoints, evaluation and uploads read)."""
    for ca, cb in zip(a, b, strict=True):
        for (name, ta), tb in zip(ca.model.state_dict().items(), cb.model.state_dict().values(), strict=True):
            torch.testing.assert_close(ta, tb, atol=atol, rtol=atol, msg=f"client {ca.client_id} {name}")
        sa, sb = ca.configure_optimizers().state_dict()["state"], cb.configure_optimizers().state_dict()["state"]
        assert sa.keys() == sb.keys() and len(sa) == len(list(ca.model.parameters()))
        for k in sa:
            for key, va in sa[k].items():
                torch.testing.assert_close(va, sb[k][key], atol=atol, rtol=atol, msg=f"{k} {key}")

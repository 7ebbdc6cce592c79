"""VectorizedExecutor computes what SequentialExecutor computes, on tiny CPU federations."""

import math

import pytest
import torch
from lightning.fabric import Fabric
from torch import nn

from fdlit.clients import ClientModule, ClientOptimization
from fdlit.data import FederatedData
from fdlit.errors import ConfigError
from fdlit.execution import SequentialExecutor, VectorizedExecutor, select_executor
from fdlit.federation import FederationLoop
from fdlit.methods import ProbabilityAveraging, SmoothedUncertaintyWeighted
from fdlit.models import MLP, SmallCNN
from tests.stacking import SIZES, assert_same_clients, make_clients, run_phases


class TinyBN(nn.Module):
    # no conv bias before BatchNorm (as in ResNets): its true gradient is 0, so Adam would amplify
    # float noise in it (sign of ~1e-9) into +-lr steps that differ between any two kernels
    def __init__(self, momentum=0.1):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4, momentum=momentum), nn.ReLU(),
                                 nn.Flatten(), nn.Linear(4 * 64, 10))

    def forward(self, x):
        return self.net(x)


def assert_executors_agree(seq_clients, vec_clients):
    """Train the same phases on both executors: same losses, predictions and client state."""
    seq_losses, seq_pred = run_phases(SequentialExecutor(), seq_clients)
    vectorized = VectorizedExecutor()
    vec_losses, vec_pred = run_phases(vectorized, vec_clients)
    # the vmapped step ran for every client and phase, not a fall-back to one client at a time
    assert vectorized.trained == {"vectorized": 3 * len(vec_clients), "sequential": 0}
    for a, b in zip(seq_losses, vec_losses, strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(seq_pred, vec_pred, atol=1e-4, rtol=1e-4)
    assert_same_clients(seq_clients, vec_clients)


@pytest.mark.parametrize("optimizer,kw", [
    ("adam", {}),
    ("adam", {"weight_decay": 1e-2, "public_lr": 3e-3}),
    ("adamw", {"weight_decay": 1e-2}),
    ("sgd", {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3}),
    ("sgd", {"lr": 0.05}),
    ("adam", {"fused": True}),  # torch.optim's fused kernel in the sequential reference too
    ("sgd", {"lr": 0.05, "momentum": 0.9, "fused": True}),
])
def test_phases_match_sequential_per_optimizer(optimizer, kw):
    opt = ClientOptimization(optimizer=optimizer, **kw)
    assert bool(opt.build([nn.Parameter(torch.zeros(1))]).param_groups[0].get("fused")) == kw.get("fused", False)
    model_fn = lambda i: MLP((1, 8, 8), 10, hidden=[24])  # noqa: E731
    seq_clients, vec_clients = make_clients(model_fn, opt), make_clients(model_fn, opt)
    assert_executors_agree(seq_clients, vec_clients)
    if optimizer.startswith("adam"):  # per-client step counts differ (different batch counts)
        steps = [float(next(iter(c.configure_optimizers().state.values()))["step"]) for c in vec_clients]
        assert len(set(steps)) > 1


@pytest.mark.parametrize("optimizer,kernel", [("adam", "fused"), ("adam", "reference"), ("adamw", "fused"),
                                              ("adamw", "reference"), ("sgd", "reference")])
def test_per_client_learning_rates_and_steps_match_sequential(optimizer, kernel, monkeypatch):
    """Clients with different learning rates and different step counts in one stack, through the
    fused kernel (one call per learning rate, a step tensor per client) and through the
    single-tensor reference used on devices without a fused kernel."""
    import fdlit.execution.stacked_optimizer as stacked_optimizer

    if kernel == "reference":
        monkeypatch.setattr(stacked_optimizer, "_fused_adam_kernel", lambda decoupled, flat: None)
    model_fn = lambda i: MLP((1, 8, 8), 10, hidden=[24])  # noqa: E731
    extra = {"momentum": 0.9} if optimizer == "sgd" else {}
    opts = [ClientOptimization(optimizer=optimizer, lr=lr * (20 if optimizer == "sgd" else 1), weight_decay=1e-2, **extra)
            for lr in (1e-3, 3e-3, 1e-3, 5e-3)]

    def clients():
        torch.manual_seed(0)
        return [ClientModule(model_fn(i), i, [0, 1], o, seed=3) for i, o in enumerate(opts)]

    seq_clients, vec_clients = clients(), clients()
    assert_executors_agree(seq_clients, vec_clients)
    # the other clients moved: a wrong learning rate would show in their weights
    assert not torch.allclose(next(seq_clients[1].model.parameters()), next(seq_clients[0].model.parameters()))


class TiedLayers(nn.Module):
    """Two layers sharing one weight (as tied embeddings do): functional_call must tie them."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 10)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.head(torch.relu(self.b(torch.relu(self.a(x.flatten(1))))))


def test_tied_weights_match_sequential():
    opt = ClientOptimization(optimizer="adam")
    seq_clients, vec_clients = make_clients(lambda i: TiedLayers(), opt), make_clients(lambda i: TiedLayers(), opt)
    assert_executors_agree(seq_clients, vec_clients)
    assert all(c.model.b.weight is c.model.a.weight for c in vec_clients)


class SmallImageNet(nn.Module):
    """A conv + BatchNorm net on 3 x 8 x 8 images (ResNet-like layer types, CPU-sized)."""

    def __init__(self, bn: bool):
        super().__init__()
        norm = nn.BatchNorm2d(4) if bn else nn.Identity()
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=not bn), norm, nn.ReLU(),
                                 nn.Flatten(), nn.Linear(4 * 64, 10))

    def forward(self, x):
        return self.net(x)


# float64 shows the computation is the same to the last bits; in float32 Adam amplifies BatchNorm's
# float noise on the 2-sample final batch to ~1e-4, beyond the shared tolerance
@pytest.mark.parametrize("bn,precision", [(True, "64-true"), (False, "64-true"), (False, "32-true")])
def test_image_input_module_runs_per_client_and_matches_sequential(bn, precision):
    """Image datasets put ImageInput (uint8 -> normalised float, random crop + flip from the
    client's own generator) in front of every network. The vectorized executor runs it per client
    outside vmap: same augmentation draws, same weights, same generator states as sequential;
    unequal private sizes pad (no BatchNorm) or split (BatchNorm) the batches."""
    from fdlit.data.augment import ImageInput, WithInput

    opt = ClientOptimization(optimizer="adam")

    def clients():
        torch.manual_seed(0)
        return [ClientModule(WithInput(ImageInput(mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3), augment=True,
                                                  padding=2, seed=10 + i), SmallImageNet(bn)),
                             i, [0, 1], opt, seed=3) for i in range(len(SIZES))]

    g = torch.Generator().manual_seed(1)
    private = [(torch.randint(0, 256, (n, 3, 8, 8), generator=g, dtype=torch.uint8),
                torch.randint(0, 10, (n,), generator=g)) for n in SIZES]
    public = (torch.randint(0, 256, (40, 3, 8, 8), generator=g, dtype=torch.uint8),
              torch.softmax(torch.randn(40, 10, generator=g), -1))
    fabric = Fabric(accelerator="cpu", devices=1, precision=precision)
    atol = 1e-12 if precision == "64-true" else 1e-5
    results = []
    for executor, cs in ((SequentialExecutor(), clients()), (VectorizedExecutor(strict=True), clients())):
        executor.setup(fabric, cs)
        losses = [executor.train(cs, phase, private if phase == "private" else [public] * len(cs), 2, 16)
                  for phase in ("private", "public", "private")]
        results.append((cs, losses, executor.predict(cs, public[0])))
    (seq, seq_losses, seq_pred), (vec, vec_losses, vec_pred) = results
    assert select_executor(vec).__class__ is VectorizedExecutor
    for a, b in zip(seq_losses, vec_losses, strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(seq_pred, vec_pred, atol=max(atol, 1e-6), rtol=1e-4)
    assert_same_clients(seq, vec, atol=atol)
    for a, b in zip(seq, vec, strict=True):  # the augmentation streams advanced identically
        assert torch.equal(a.model.input._generator.get_state(), b.model.input._generator.get_state())
    assert all(c.model.training for c in vec)  # predict restored the training mode


def test_batchnorm_networks_train_stacked_under_bf16_autocast():
    """vmap's batch rule for batch_norm refuses a bf16 input with float32 statistics, so a ResNet
    under ``bf16-mixed`` could not train stacked; BatchNorm now normalises in float32 there. Same
    losses and predictions as the sequential executor within bf16's precision."""
    opt = ClientOptimization(optimizer="adam")

    def clients():
        torch.manual_seed(0)
        return [ClientModule(SmallImageNet(True), i, [0, 1], opt, seed=3) for i in range(3)]

    g = torch.Generator().manual_seed(1)
    private = [(torch.randn(12, 3, 8, 8, generator=g), torch.randint(0, 10, (12,), generator=g)) for _ in range(3)]
    public = torch.randn(20, 3, 8, 8, generator=g)
    fabric = Fabric(accelerator="cpu", devices=1, precision="bf16-mixed")
    results = []
    for executor, cs in ((SequentialExecutor(), clients()), (VectorizedExecutor(strict=True), clients())):
        executor.setup(fabric, cs)
        losses = executor.train(cs, "private", private, 2, 4)
        results.append((losses, executor.predict(cs, public)))
    (seq_losses, seq_pred), (vec_losses, vec_pred) = results
    stacked = cs
    assert all(math.isfinite(v) for v in vec_losses)
    assert vec_losses == pytest.approx(seq_losses, rel=0.05)
    torch.testing.assert_close(vec_pred, seq_pred, atol=0.1, rtol=0.05)
    for module in (m for c in stacked for m in c.model.modules()):  # the float32 hooks are gone after the step
        assert not module._forward_pre_hooks and not module._forward_hooks


def test_state_moves_between_executors():
    """A phase on the vectorized executor, then phases on the sequential one: same as all
    sequential, so write-back uses torch.optim's own state format."""
    opt = ClientOptimization(optimizer="adam")
    model_fn = lambda i: SmallCNN((1, 8, 8), 10, channels=4, hidden=16)  # noqa: E731
    ref, mixed = make_clients(model_fn, opt), make_clients(model_fn, opt)
    run_phases(SequentialExecutor(), ref, phases=("private", "public", "private"))
    run_phases(VectorizedExecutor(), mixed, phases=("private",))
    run_phases(SequentialExecutor(), mixed, phases=("public", "private"))
    assert_same_clients(ref, mixed)


def test_batchnorm_statistics_stay_per_client():
    """BatchNorm clients with different private sizes (different last-batch lengths): same weights,
    running statistics and predictions as sequential training."""
    opt = ClientOptimization(optimizer="adam")
    seq_clients = make_clients(lambda i: TinyBN(), opt)
    vec_clients = make_clients(lambda i: TinyBN(), opt)
    seq_losses, seq_pred = run_phases(SequentialExecutor(), seq_clients)
    vec_losses, vec_pred = run_phases(VectorizedExecutor(), vec_clients)
    for a, b in zip(seq_losses, vec_losses, strict=True):
        assert a == pytest.approx(b, rel=1e-5)
    torch.testing.assert_close(seq_pred, vec_pred, atol=1e-4, rtol=1e-4)
    assert_same_clients(seq_clients, vec_clients)
    means = torch.stack([c.model.net[1].running_mean for c in vec_clients])
    assert len({tuple(m.tolist()) for m in means}) == len(vec_clients)  # each client its own statistics
    assert [int(c.model.net[1].num_batches_tracked) for c in vec_clients] == \
        [int(c.model.net[1].num_batches_tracked) for c in seq_clients]


def test_heterogeneous_groups_and_fallback():
    """Three architectures train as three vmapped groups; clients that cannot be vectorized
    (BatchNorm with momentum=None) fall back to sequential inside the same executor."""
    opt = ClientOptimization(optimizer="adam")

    def model_fn(i):
        return [MLP((1, 8, 8), 10, hidden=[16]), MLP((1, 8, 8), 10, hidden=[8]), TinyBN(), TinyBN(None)][i % 4]

    sizes = [33, 50, 7, 20, 12, 9, 16, 40]
    seq_clients, vec_clients = make_clients(model_fn, opt, sizes), make_clients(model_fn, opt, sizes)
    fabric = Fabric(accelerator="cpu", devices=1)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)) for n in sizes]
    results = []
    for ex, clients in ((SequentialExecutor(), seq_clients), (VectorizedExecutor(), vec_clients)):
        ex.setup(fabric, clients)
        results.append((ex.train(clients, "private", data, 2, 16), ex.predict(clients, data[0][0])))
    vec = results[1]
    groups, rest = ex._groups(vec_clients)
    assert sorted(map(sorted, groups)) == [[0, 4], [1, 5], [2, 6]] and rest == [3, 7]
    assert ex.trained == {"vectorized": 6, "sequential": 2}  # the groups vmapped, the rest one at a time
    assert results[0][0] == pytest.approx(vec[0], rel=1e-5)
    torch.testing.assert_close(results[0][1], vec[1], atol=1e-4, rtol=1e-4)
    assert_same_clients(seq_clients, vec_clients)
    with pytest.raises(ConfigError, match="cannot be vectorized"):
        VectorizedExecutor(strict=True).setup(fabric, make_clients(model_fn, opt, sizes))


def test_select_executor_picks_vectorized_only_when_it_applies():
    opt = ClientOptimization()
    mlp = make_clients(lambda i: MLP((1, 8, 8), 10, hidden=[8]), opt)
    assert isinstance(select_executor(mlp), VectorizedExecutor)
    assert isinstance(select_executor(mlp, "16-mixed"), SequentialExecutor)
    assert isinstance(select_executor(mlp[:1]), SequentialExecutor)
    assert isinstance(select_executor(make_clients(lambda i: TinyBN(), opt)), VectorizedExecutor)
    assert isinstance(select_executor(make_clients(lambda i: TinyBN(None), opt)), SequentialExecutor)
    mixed = make_clients(lambda i: MLP((1, 8, 8), 10, hidden=[8 if i else 16]), opt)
    assert isinstance(select_executor(mixed), SequentialExecutor)


def test_select_executor_keeps_large_models_sequential_on_cpu():
    """On a CPU, a model above CPU_MAX_FLOPS_PER_SAMPLE (ResNet-18 on CIFAR: 1.1 GFLOP) trains one
    client at a time (vectorized was 0.58x there); small ones are vectorized."""
    from fdlit.execution.selection import CPU_MAX_FLOPS_PER_SAMPLE, forward_flops_per_sample

    opt = ClientOptimization()
    sample = torch.zeros(1, 1, 8, 8)
    small = make_clients(lambda i: MLP((1, 8, 8), 10, hidden=[128, 128]), opt)
    large = make_clients(lambda i: MLP((1, 8, 8), 10, hidden=[4096, 4096]), opt)
    assert forward_flops_per_sample(small[0].model, sample) < CPU_MAX_FLOPS_PER_SAMPLE
    assert forward_flops_per_sample(large[0].model, sample) > CPU_MAX_FLOPS_PER_SAMPLE
    assert isinstance(select_executor(small, sample=sample), VectorizedExecutor)
    assert isinstance(select_executor(large, sample=sample), SequentialExecutor)
    assert isinstance(select_executor(large), VectorizedExecutor)  # no sample: no FLOP rule
    assert all(c.model.training for c in large)  # counting ran in eval mode and restored the mode


@pytest.mark.parametrize("model,aggregator", [
    ("MLP", ProbabilityAveraging()),
    ("SmallCNN", SmoothedUncertaintyWeighted()),
])
def test_federation_metrics_match_sequential(tmp_path, model, aggregator):
    """Two rounds of a digits federation with unequal private sets: same metrics either way, and
    ``executor: null`` picks the vectorized executor."""
    init = {"hidden": [32]} if model == "MLP" else {"channels": 4, "hidden": 16}
    histories, loops = [], []
    for executor in (SequentialExecutor(), None):
        loop = FederationLoop(
            rounds=2, private_epochs_first=2, private_epochs=1, public_epochs_first=1, public_epochs=1,
            executor=executor,
            data=FederatedData(num_clients=5, partition="dirichlet", dirichlet_alpha=0.5, public_size=100),
            model={"class_path": f"fdlit.models.{model}", "init_args": init}, aggregator=aggregator,
            client=ClientOptimization(batch_size=16),
        )
        loop.fit()
        histories.append(loop.history)
        loops.append(loop)
    assert isinstance(loops[1].settings.executor, VectorizedExecutor)
    # every client-phase ran the vmapped step: a fall-back to sequential training would pass the comparison
    trained = loops[1].settings.executor.trained
    assert trained["sequential"] == 0 and trained["vectorized"] > 0
    assert len({len(cd.train.x) for cd in loops[0].data.clients}) > 1
    for a, b in zip(*histories, strict=True):
        for key, value in a.items():
            if key.startswith(("time/", "comm/")):
                continue
            if isinstance(value, list):  # per-client lists; the trust matrix is nested and may hold None
                def flat(v):
                    return [y for x in v for y in (flat(x) if isinstance(x, list) else [x])]
                fa, fb = flat(value), flat(b[key])
                assert [x is None for x in fa] == [y is None for y in fb], key
                assert [x for x in fa if x is not None] == pytest.approx([y for y in fb if y is not None], abs=1e-6), key
            else:
                assert value == pytest.approx(b[key], rel=1e-4, abs=1e-5), key


def test_cli_knob_chooses_the_executor():
    from fdlit.configuration.schema import parse_fit
    from fdlit.runs.experiment import Experiment

    base = ["--config", "digits.yaml", "--logger.mode", "disabled"]
    chosen = {}
    for name in ("VectorizedExecutor", "SequentialExecutor"):
        parser, cfg = parse_fit(base + ["--federation.executor", f"fdlit.execution.{name}"])
        chosen[name] = type(Experiment(cfg, parser).loop.settings.executor).__name__
    assert chosen == {"VectorizedExecutor": "VectorizedExecutor", "SequentialExecutor": "SequentialExecutor"}
    parser, cfg = parse_fit(base)
    assert Experiment(cfg, parser).loop.settings.executor is None  # null: select_executor decides in setup


# ---------------------------------------------------------------------------------- client chunks
def assert_identical_clients(a, b):
    for ca, cb in zip(a, b, strict=True):
        for (name, ta), tb in zip(ca.model.state_dict().items(), cb.model.state_dict().values(), strict=True):
            assert torch.equal(ta, tb), f"client {ca.client_id} {name}"
        sa, sb = ca.configure_optimizers().state_dict()["state"], cb.configure_optimizers().state_dict()["state"]
        assert sa.keys() == sb.keys()
        for k in sa:
            for key in sa[k]:
                assert torch.equal(sa[k][key], sb[k][key]), f"client {ca.client_id} optimizer {k} {key}"
        assert torch.equal(ca.generator.get_state(), cb.generator.get_state())


@pytest.mark.parametrize("model_fn", [lambda i: MLP((1, 8, 8), 10, hidden=[24]), lambda i: TinyBN()],
                         ids=["mlp", "batchnorm"])
@pytest.mark.parametrize("chunk_size", [1, 3])
def test_client_chunks_compute_exactly_what_one_stack_computes(model_fn, chunk_size):
    """Chunks of 1 and 3 of the 4 clients (unequal private sets, clients with per-client lrs):
    the same losses, predictions, weights, optimizer state and generators, bit for bit (under vmap;
    the grouped network agrees within float rounding, below)."""
    whole, chunked, (whole_losses, whole_pred), (chunked_losses, chunked_pred) = train_in_chunks(
        model_fn, chunk_size, conv_network="vmap")
    assert whole_losses == chunked_losses
    assert torch.equal(whole_pred, chunked_pred)
    assert_identical_clients(whole, chunked)


def train_in_chunks(model_fn, chunk_size, **executor_options):
    opts = [ClientOptimization(lr=lr) for lr in (1e-3, 3e-3, 1e-3, 5e-3)]

    def clients():
        torch.manual_seed(0)
        return [ClientModule(model_fn(i), i, [0, 1], o, seed=3) for i, o in enumerate(opts)]

    whole, chunked = clients(), clients()
    whole_out = run_phases(VectorizedExecutor(**executor_options), whole)
    executor = VectorizedExecutor(chunk_size=chunk_size, **executor_options)
    calls = []
    original = executor._train_group
    executor._train_group = lambda group, *a, **kw: (calls.append(len(group)), original(group, *a, **kw))[1]
    chunked_out = run_phases(executor, chunked)
    assert calls[:2] == ([1, 1] if chunk_size == 1 else [3, 1])  # the first phase ran in chunks
    return whole, chunked, whole_out, chunked_out


@pytest.mark.parametrize("model_fn", [lambda i: SmallCNN((1, 8, 8), 10, channels=4, hidden=8), lambda i: TinyBN()],
                         ids=["smallcnn", "batchnorm"])
@pytest.mark.parametrize("chunk_size", [1, 3])
def test_grouped_network_chunks_agree_within_float_rounding(chunk_size, model_fn):
    """A conv net on a CPU runs as one grouped network, whose channels-last reductions (bias and
    weight gradients, BatchNorm's statistics) are vectorised across the M*C channels: chunks agree
    with the whole stack to float rounding (~1e-8 after three phases), not bit for bit; the
    generators advance identically."""
    whole, chunked, (whole_losses, whole_pred), (chunked_losses, chunked_pred) = train_in_chunks(model_fn, chunk_size)
    for a, b in zip(whole_losses, chunked_losses, strict=True):
        assert a == pytest.approx(b, rel=1e-6)
    torch.testing.assert_close(whole_pred, chunked_pred, atol=1e-6, rtol=1e-6)
    assert_same_clients(whole, chunked, atol=1e-6)


def test_automatic_chunk_from_free_memory():
    from fdlit.execution.vectorized import auto_chunk_size, client_memory_bytes

    client = make_clients(lambda i: MLP((1, 8, 8), 10, hidden=[24]), ClientOptimization())[0]
    params = sum(p.numel() * 4 for p in client.model.parameters())
    before = [p.clone() for p in client.model.parameters()]
    batch = torch.randn(16, 1, 8, 8)
    per_client = client_memory_bytes(client, batch)
    # activations: flatten 64, linear 24, relu 24, dropout 24, linear 10 floats per sample (leaf modules), twice
    assert per_client > 4 * params and per_client - 4 * params == 2 * 16 * 4 * (64 + 24 + 24 + 24 + 10)
    assert all(torch.equal(a, b) for a, b in zip(before, client.model.parameters(), strict=True)) and client.model.training
    assert auto_chunk_size(10 * per_client, per_client) == 7  # 70 % of the free memory
    assert auto_chunk_size(per_client // 2, per_client) == 1  # never 0
    with pytest.raises(ConfigError, match="federation.executor.chunk_size"):
        VectorizedExecutor(chunk_size=0)


def test_free_device_memory_counts_the_allocators_cache_as_free(monkeypatch):
    """After a phase PyTorch's cache holds memory the driver reports as taken; the automatic chunk
    must see it as free, or every later phase runs in stacks of one client."""
    from fdlit.execution import vectorized

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 50 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 10 * gib)
    assert vectorized.free_device_memory(torch.device("cuda", 0)) == 42 * gib


# ---------------------------------------------------------------------------------- weight layout
def test_linear_weights_are_stacked_in_their_gradients_layout(monkeypatch):
    """The vmapped backward returns a Linear weight's gradient as the transpose of x^T g; the stack
    keeps those weights (and Adam's moments) in that layout, so the fused update reads every
    tensor in one order and copies no gradient (Linear weights, biases, a convolution alike)."""
    from fdlit.execution import stacked_optimizer

    seen = []
    original = stacked_optimizer.StackedOptimizer._fused_step

    def spy(self, p, g, exp_avg, exp_avg_sq, *args):
        seen.extend((pk.shape, pk.stride(), gk.stride(), m.stride()) for pk, gk, m in zip(p, g, exp_avg, strict=True))
        return original(self, p, g, exp_avg, exp_avg_sq, *args)

    monkeypatch.setattr(stacked_optimizer.StackedOptimizer, "_fused_step", spy)
    clients = make_clients(lambda i: TinyBN(), ClientOptimization())
    run_phases(VectorizedExecutor(), clients, phases=("private",))
    assert seen and all(p_stride == g_stride == m_stride for _, p_stride, g_stride, m_stride in seen)
    linear = [(shape, stride) for shape, stride, _, _ in seen if len(shape) == 3]  # M x 10 x 256
    assert linear and all(stride == (shape[1] * shape[2], 1, shape[1]) for shape, stride in linear)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_a_transposed_stack_takes_the_same_update_as_a_contiguous_one(optimizer):
    """The optimizer's arithmetic is elementwise: a stack in the gradients' layout and a contiguous
    stack of the same weights, given the same gradients, end bit for bit the same (whole stack and
    a subset of rows)."""
    from fdlit.execution.stacked_optimizer import StackedOptimizer
    from fdlit.execution.stacking import ParamStack, is_transposed, select_rows

    kw = {"momentum": 0.9} if optimizer == "sgd" else {}
    opts = [ClientOptimization(optimizer=optimizer, lr=lr, **kw) for lr in (1e-2, 3e-2, 1e-2)]
    results = []
    for layout in (False, True):
        torch.manual_seed(0)
        clients = [ClientModule(MLP((1, 8, 8), 10, hidden=[12]), i, [0, 1], o, seed=3) for i, o in enumerate(opts)]
        stack = ParamStack(clients, gradient_layout=layout)
        assert any(is_transposed(p) for p in stack.params) == layout
        opt = StackedOptimizer(clients, stack)
        g = torch.Generator().manual_seed(5)
        for rows in (None, torch.tensor([0, 2]), None):
            params = stack.params if rows is None else [select_rows(p, rows) for p in stack.params]
            grads = [torch.empty_like(p).copy_(torch.randn(p.shape, generator=g)) for p in params]
            opt.step(params, grads, rows)
            if rows is not None:
                for target, p in zip(stack.params, params, strict=True):
                    target.index_copy_(0, rows, p)
        stack.write_back()
        opt.write_back()
        results.append(clients)
    assert_identical_clients(*results)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_each_runs_rows_of_a_shared_stack_take_the_update_of_a_stack_of_their_own(optimizer):
    """A stacked sweep's call holds several runs' clients (``runs``): each run's rows, updated in
    place as views of the shared stack (or gathered, for a subset of rows), end bit for bit as in a
    stack of the run's clients alone, through whole-stack steps, a subset and steps at which the
    run's clients are at different step counts."""
    from fdlit.execution.stacked_optimizer import StackedOptimizer
    from fdlit.execution.stacking import ParamStack, select_rows

    kw = {"momentum": 0.9} if optimizer == "sgd" else {}
    lrs, runs = (1e-2, 1e-2, 1e-2, 3e-2, 3e-2), [0, 0, 0, 1, 1]

    def clients():
        torch.manual_seed(0)
        return [ClientModule(MLP((1, 8, 8), 10, hidden=[12]), i, [0, 1], ClientOptimization(optimizer=optimizer, lr=lr, **kw),
                             seed=3) for i, lr in enumerate(lrs)]

    schedule = [None, torch.tensor([0, 3]), None, None]
    g = torch.Generator().manual_seed(5)
    shapes = [p.shape for p in ParamStack(clients()[:1]).params]
    grads = [[torch.randn(len(lrs), *s[1:], generator=g) for s in shapes] for _ in schedule]

    def train(members, runs):
        stack = ParamStack(members, gradient_layout=True)
        opt = StackedOptimizer(members, stack, runs)
        ids = torch.tensor([c.client_id for c in members])
        for rows, step_grads in zip(schedule, grads, strict=True):
            if rows is not None:
                rows = (ids[:, None] == rows[None, :]).any(1).nonzero().squeeze(1)
            mine = [gk.index_select(0, ids) for gk in step_grads]
            params = stack.params if rows is None else [select_rows(p, rows) for p in stack.params]
            opt.step(params, [torch.empty_like(p).copy_(gk if rows is None else gk.index_select(0, rows))
                              for p, gk in zip(params, mine, strict=True)], rows)
            if rows is not None:
                for target, p in zip(stack.params, params, strict=True):
                    target.index_copy_(0, rows, p)
        stack.write_back()
        opt.write_back()
        return members

    shared = train(clients(), runs)
    alone = clients()
    train(alone[:3], None)
    train(alone[3:], None)
    assert_identical_clients(shared, alone)

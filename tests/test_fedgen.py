"""FedGen (Zhu et al. 2021) and HtFLlib's heterogeneous-model variant: the client's generated-feature term by hand,
the generated features a client draws from what it received, the count-weighted ensemble of heads,
the server's generator step lowering that ensemble's loss, the sample-weighted global head and a
client loading it (``share: heads``), the bytes of a round under each sharing, the vectorized executor
against the sequential one, and the refusals (bad knobs, a head that is not one linear layer,
different feature widths)."""

import math

import pytest
import torch
import torch.nn.functional as F

from fdlit.clients import ClientModule, ClientOptimization
from fdlit.data import FederatedData
from fdlit.errors import ConfigError
from fdlit.execution import SequentialExecutor, VectorizedExecutor
from fdlit.federation import FederationLoop
from fdlit.methods import FedGen
from fdlit.methods.contexts import ClientContext, FederationInfo
from fdlit.methods.feature_generator import FeatureGenerator, draw, ensemble_logits, seeded
from fdlit.methods.fedavg import exchanged_tensors, flatten
from fdlit.methods.fedgen import head_slices
from fdlit.models import MLP

C, D = 10, 16
MLP16 = {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [D]}}
SMALL = {"generated": 16, "generator_steps": 20, "generator_batch": 16, "hidden": 16}


def loop_for(method, rounds=2, clients=4, model=MLP16, executor=None, **kw):
    return FederationLoop(
        rounds=rounds, private_epochs_first=1, private_epochs=1, public_epochs_first=0, public_epochs=0,
        data=FederatedData(num_clients=clients, classes_per_client=3, public_size=0),
        model=model, client=ClientOptimization(optimizer="adam", lr=0.01, batch_size=32),
        aggregator=method, executor=executor or SequentialExecutor(), **kw,
    )


def params(loop, i=0):
    return flatten(list(loop.view.clients[i].model.parameters()))


def floats(history):
    return [{k: v for k, v in m.items() if isinstance(v, float) and not k.startswith("time/")} for m in history]


# ---------------------------------------------------------------- by hand
def test_the_clients_term_is_alpha_times_its_heads_cross_entropy_on_the_generated_features():
    torch.manual_seed(0)
    net = MLP(input_shape=(1, 8, 8), num_classes=C, hidden=[D])
    client = ClientModule(net, 0, [0, 1, 2], ClientOptimization())
    client.method_part = FedGen(alpha=0.7).client_part()
    z, zy = torch.randn(5, D), torch.tensor([3, 0, 9, 3, 7])
    client.method_state.update(fedgen_features=z, fedgen_labels=zy)
    x, y = torch.randn(6, 1, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    logits = net(x)
    head = net.net[-1]
    by_hand = F.cross_entropy(logits, y) + 0.7 * F.cross_entropy(z @ head.weight.T + head.bias, zy)
    torch.testing.assert_close(client.private_loss(logits, y), by_hand)
    # padded rows (the vectorized executor) weigh nothing; the term is added once
    padded = torch.cat([logits, 30 * torch.randn(2, C)])
    weight = torch.tensor([1.0] * 6 + [0.0] * 2)
    torch.testing.assert_close(client.private_loss(padded, torch.cat([y, y[:2]]), weight), by_hand)
    # the term trains the head only: its gradient reaches the output layer, not the hidden one
    (g_head, g_hidden) = torch.autograd.grad(client.private_loss(logits.detach(), y), [head.weight, net.net[1].weight],
                                             allow_unused=True)
    assert g_head is not None and g_head.abs().sum() > 0 and g_hidden is None
    # nothing in a public step, nor before the first generator arrives
    teacher = torch.softmax(torch.randn(6, C), -1)
    torch.testing.assert_close(client.public_loss(logits, teacher), -(teacher * logits.log_softmax(-1)).sum(-1).mean())
    client.method_state.clear()
    torch.testing.assert_close(client.private_loss(logits, y), F.cross_entropy(logits, y))


def test_a_client_draws_its_features_from_the_received_generator_and_label_counts():
    method = FedGen(generated=200, noise_dim=4, hidden=8)
    part = method.client_part()
    gen = FeatureGenerator(4, C, 8, D)
    flat = torch.cat([p.detach().reshape(-1) for p in gen.parameters()])
    counts = torch.tensor([0, 5, 0, 1, 0, 0, 0, 0, 0, 4], dtype=torch.int32)
    net = MLP(input_shape=(1, 8, 8), num_classes=C, hidden=[D])
    client = ClientModule(net, 3, [1, 3, 9], ClientOptimization())
    info = FederationInfo(round=2, seed=7, num_clients=4, num_classes=C, public_x=torch.zeros(0, 1))
    ctx = ClientContext(info, client, None, None, {"generator": flat, "label_counts": counts}, client.method_state)
    part.receive(ctx)
    labels, eps = draw(counts, 200, 4, seeded(7, 2, 3, 0xF6C))
    assert torch.equal(client.method_state["fedgen_labels"], labels)
    assert set(labels.tolist()) == {1, 3, 9}  # only classes some client holds
    assert (labels == 1).sum() > (labels == 3).sum()  # drawn in proportion to the counts
    with torch.no_grad():
        torch.testing.assert_close(client.method_state["fedgen_features"], gen(eps, labels))


def test_the_ensemble_weighs_each_head_by_its_share_of_the_class():
    g = torch.Generator().manual_seed(2)
    w, b = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, generator=g)
    counts = torch.tensor([[3.0, 0.0, 1.0], [1.0, 2.0, 0.0]])
    mix = counts / counts.sum(0)
    z, y = torch.randn(3, 4, generator=g), torch.tensor([0, 1, 2])
    out = ensemble_logits(z, y, w, b, mix)
    torch.testing.assert_close(out[0], 0.75 * (w[0] @ z[0] + b[0]) + 0.25 * (w[1] @ z[0] + b[1]))
    torch.testing.assert_close(out[1], w[1] @ z[1] + b[1])  # class 1: client 1 alone
    torch.testing.assert_close(out[2], w[0] @ z[2] + b[0])


def heads_uploads(k=3, d=8, seed=3):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(k):
        counts = torch.zeros(C, dtype=torch.int32)
        counts[torch.tensor([i, i + 3, i + 6])] = torch.tensor([20, 10, 5], dtype=torch.int32)
        out.append({"head_weight": torch.randn(C, d, generator=g), "head_bias": torch.randn(C, generator=g),
                    "class_counts": counts})
    return out


def test_the_global_head_is_the_sample_weighted_mean_of_the_uploaded_heads():
    from fdlit.methods.base import context_for

    uploads = heads_uploads(d=D)
    uploads[1]["class_counts"] = uploads[1]["class_counts"] * 3  # 105 samples against 35 and 35
    ctx = context_for([{"logits": torch.zeros(0, C)}] * 3)
    out = FedGen(**SMALL, share="heads").aggregate(uploads, ctx).broadcast
    by_hand_w = (35 * uploads[0]["head_weight"] + 105 * uploads[1]["head_weight"] + 35 * uploads[2]["head_weight"]) / 175
    by_hand_b = (35 * uploads[0]["head_bias"] + 105 * uploads[1]["head_bias"] + 35 * uploads[2]["head_bias"]) / 175
    torch.testing.assert_close(out["global_head_weight"], by_hand_w)
    torch.testing.assert_close(out["global_head_bias"], by_hand_b)
    assert "generator" in out
    # without biases only the weight goes down; share: none sends no head
    no_bias = [{k: v for k, v in u.items() if k != "head_bias"} for u in uploads]
    assert "global_head_bias" not in FedGen(**SMALL, share="heads").aggregate(no_bias, ctx).broadcast
    kept = FedGen(**SMALL, share="none").aggregate(uploads, ctx).broadcast
    assert set(kept) == {"generator", "label_counts"}


def test_a_client_loads_the_global_head_into_its_output_layer_on_receipt():
    part = FedGen(**SMALL, share="heads").client_part()
    net = MLP(input_shape=(1, 8, 8), num_classes=C, hidden=[D])
    hidden_before = net.net[1].weight.detach().clone()
    client = ClientModule(net, 1, [0, 1, 2], ClientOptimization())
    gen = FeatureGenerator(32, C, 16, D)
    received = {"generator": flatten(list(gen.parameters())), "label_counts": torch.ones(C, dtype=torch.int32),
                "global_head_weight": torch.randn(C, D), "global_head_bias": torch.randn(C)}
    info = FederationInfo(round=1, seed=0, num_clients=4, num_classes=C, public_x=torch.zeros(0, 1))
    part.receive(ClientContext(info, client, None, None, received, client.method_state))
    assert torch.equal(net.net[-1].weight, received["global_head_weight"])
    assert torch.equal(net.net[-1].bias, received["global_head_bias"])
    assert torch.equal(net.net[1].weight, hidden_before)  # the feature extractor stays the client's


def test_under_share_heads_every_client_ends_with_one_head_and_its_own_extractor():
    shared = loop_for(FedGen(**SMALL, share="heads"))
    shared.fit()
    heads = [flatten(list(c.model.net[-1].parameters())) for c in shared.view.clients]
    assert all(torch.equal(h, heads[0]) for h in heads)
    assert not torch.allclose(shared.view.clients[0].model.net[1].weight, shared.view.clients[1].model.net[1].weight)
    kept = loop_for(FedGen(**SMALL, share="none"))
    kept.fit()
    assert not torch.allclose(kept.view.clients[0].model.net[-1].weight, kept.view.clients[1].model.net[-1].weight)


def test_share_parameters_averages_the_networks_as_fedavg_and_reads_each_head_out_of_its_vector():
    from fdlit.methods.base import context_for

    torch.manual_seed(1)
    nets = [MLP(input_shape=(1, 8, 8), num_classes=C, hidden=[32, D]) for _ in range(2)]
    method = FedGen(**SMALL, share="parameters")
    method.slices = head_slices(nets[0], nets[0].net[-1])
    method.generator = method._build(C, D, seed=0)
    method.fedavg.counts = torch.tensor([30, 10])
    counts = [torch.tensor([20, 10] + [0] * 8, dtype=torch.int32), torch.tensor([0, 0, 10] + [0] * 7, dtype=torch.int32)]
    uploads = [{"parameters": flatten(exchanged_tensors(n)), "class_counts": c} for n, c in zip(nets, counts, strict=True)]
    read = method.heads_in_parameters(uploads, C)
    for net, head in zip(nets, read, strict=True):
        assert torch.equal(head["head_weight"], net.net[-1].weight.detach())
        assert torch.equal(head["head_bias"], net.net[-1].bias.detach())
    out = method.aggregate(uploads, context_for([{"logits": torch.zeros(0, C)}] * 2)).broadcast
    torch.testing.assert_close(out["parameters"], 0.75 * uploads[0]["parameters"] + 0.25 * uploads[1]["parameters"])
    assert set(out) == {"parameters", "generator", "label_counts"}  # the head travels inside the parameters
    # a whole run: every client ends with the global network
    loop = loop_for(FedGen(**SMALL, share="parameters"))
    loop.fit()
    assert all(torch.equal(params(loop, i), params(loop)) for i in range(4))


def test_share_parameters_is_refused_for_different_networks_before_any_work():
    spec = {"class_path": "fdlit.models.PerClient", "init_args": {"groups": [
        {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [D]}, "fraction": 0.5},
        {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [32, D]}, "fraction": 0.5}]}}
    with pytest.raises(ConfigError, match=r"^model.class_path: FedGen \(share: parameters\) averages") as err:
        loop_for(FedGen(**SMALL, share="parameters"), model=spec)
    assert "\n" not in str(err.value)
    loop_for(FedGen(**SMALL, share="heads"), model=spec)  # share: heads takes them


def test_the_default_is_the_papers_setting_for_one_network_and_heads_with_a_warning_for_several():
    spec = {"class_path": "fdlit.models.PerClient", "init_args": {"groups": [
        {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [D]}, "fraction": 0.5},
        {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [32, D]}, "fraction": 0.5}]}}
    one = FedGen(**SMALL)
    loop_for(one)
    assert one.share == "auto" and one.sharing == "parameters" and one.fedavg is not None
    several = FedGen(**SMALL)
    with pytest.warns(UserWarning, match=r"networks differ.*HtFLlib's heterogeneous-model variant \(share: heads\)"):
        loop_for(several, model=spec)
    assert several.sharing == "heads" and several.fedavg is None


def test_the_servers_generator_step_lowers_the_ensemble_heads_loss_on_generated_features():
    from fdlit.methods.base import context_for

    uploads = heads_uploads()
    method = FedGen(noise_dim=8, hidden=32, generator_steps=60, generator_batch=32, diversity=0.0, share="heads")
    before = method._build(C, 8, seed=0)
    labels, eps = draw(sum(u["class_counts"] for u in uploads), 256, 8, seeded(99))  # fresh draws
    ctx = context_for([{"logits": torch.zeros(0, C)}] * 3)
    out = method.aggregate(uploads, ctx)
    with torch.no_grad():
        loss_before = method.ensemble_loss(uploads, labels, eps, before)
        loss_after = method.ensemble_loss(uploads, labels, eps)
    assert loss_after < 0.5 * loss_before
    flat = out.broadcast["generator"]
    assert flat.shape == ((8 + C) * 32 + 32 + 32 * 8 + 8,) and flat.dtype == torch.float32
    assert out.broadcast["label_counts"].tolist() == [20, 20, 20, 10, 10, 10, 5, 5, 5, 0]
    # a second round trains the same generator further; the state round-trips
    again = FedGen(noise_dim=8, hidden=32, generator_steps=60, generator_batch=32, diversity=0.0, share="heads")
    again.load_state_dict(method.state_dict())
    torch.testing.assert_close(flatten(list(again.generator.parameters())), flat)


# ---------------------------------------------------------------- whole runs
@pytest.mark.parametrize("share", ["heads", "parameters"])
def test_sequential_and_vectorized_executors_give_the_same_metrics(share):
    seq = loop_for(FedGen(**SMALL, share=share))
    seq.fit()
    vec = loop_for(FedGen(**SMALL, share=share), executor=VectorizedExecutor())
    vec.fit()
    assert len(vec.parts.clients.executor._vectorized) == 4  # stacked, not the sequential fallback
    assert all(c.method_state["fedgen_features"].shape == (16, D) for c in vec.view.clients)
    for a, b in zip(floats(seq.history), floats(vec.history), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert math.isclose(a[key], b[key], rel_tol=1e-5, abs_tol=1e-5) or (math.isnan(a[key]) and math.isnan(b[key])), key
    for i in range(4):
        torch.testing.assert_close(params(vec, i), params(seq, i), rtol=1e-4, atol=1e-5)
    off = loop_for(FedGen(**{**SMALL, "alpha": 0.0, "share": share}), executor=VectorizedExecutor())
    off.fit()
    assert not torch.allclose(params(vec), params(off), atol=1e-4)  # the term is active under vmap
    assert seq.history[1]["train/private_loss_mean"] > off.history[1]["train/private_loss_mean"]


def test_weight_zero_is_training_alone_exactly():
    alone = loop_for(FedGen(**SMALL), mode="local_only")
    alone.fit()
    assert alone.server_side.ledger.messages == []
    off = loop_for(FedGen(**{**SMALL, "alpha": 0.0, "share": "none"}))
    off.fit()
    assert "fedgen_features" in off.view.clients[0].method_state  # the generator arrived, weighted by 0
    for i in range(4):
        assert torch.equal(params(off, i), params(alone, i))
    shared = loop_for(FedGen(**{**SMALL, "alpha": 0.0, "share": "heads"}))  # the averaged head still goes down
    shared.fit()
    assert not torch.equal(params(shared), params(alone))


@pytest.mark.parametrize("share", ["heads", "none", "parameters"])
def test_bytes_of_a_round_are_the_analytic_sizes(share):
    m, noise, hidden = 4, 32, 16
    loop = loop_for(FedGen(**SMALL, share=share))
    loop.fit()
    ledger = loop.server_side.ledger
    generator = (noise + C) * hidden + hidden + hidden * D + D
    p = 64 * D + D + D * C + C  # the MLP's parameters, float32
    head = {"heads": (C * D + C) * 4, "none": 0, "parameters": p * 4}[share]  # what goes down besides G
    up = p * 4 if share == "parameters" else (C * D + C) * 4  # the network, or the head's W and b
    for r in (1, 2):
        assert ledger.total("up", round=r) == m * (up + C * 4)  # and the class counts, int32
        assert ledger.total("down", round=r) == m * (generator * 4 + C * 4 + head)  # generator; counts int32
    kinds = {"feature_width", "class_counts", "generator", "label_counts"}
    if share == "parameters":  # set-up: widths int32, n_k int64, head offsets 2 int64; the initial model
        assert ledger.total("up", round=0) == m * (4 + 8 + 16) + p * 4
        assert ledger.total("down", round=0) == m * p * 4
        kinds |= {"num_samples", "head_slices", "initial_parameters", "parameters"}
    else:
        assert ledger.total("up", round=0) == m * 4 and ledger.total("down", round=0) == 0  # int32 widths
        kinds |= {"head_weight", "head_bias"} | ({"global_head_weight", "global_head_bias"} if share == "heads" else set())
    assert {x.kind for x in ledger.messages} == kinds


def test_two_networks_with_the_same_feature_width_share_one_generator():
    spec = {"class_path": "fdlit.models.PerClient", "init_args": {"groups": [
        {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [32, D]}, "fraction": 0.5},
        {"class_path": "fdlit.models.SmallCNN", "init_args": {"channels": 4, "hidden": D}, "fraction": 0.5}]}}
    loop = loop_for(FedGen(**SMALL, share="heads"), model=spec)
    loop.fit()
    assert {type(c.model).__name__ for c in loop.view.clients} == {"MLP", "SmallCNN"} and loop.round == 2
    assert all(c.method_state["fedgen_features"].shape == (16, D) for c in loop.view.clients)


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize(("field", "value"), [
    ("alpha", -1.0), ("alpha", math.nan), ("generated", 0), ("generated", 2.5), ("noise_dim", 0), ("hidden", 0),
    ("generator_steps", 0), ("generator_batch", 1), ("generator_lr", 0.0), ("diversity", -0.1),
    ("share", "weights")])
def test_bad_knobs_are_refused_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=f"^aggregator.{field}: ") as err:
        FedGen(**{field: value})
    assert "\n" not in str(err.value)
    if field == "share":  # the values that exist, named
        assert str(err.value) == "aggregator.share: allowed: auto, parameters, heads, none; got 'weights'"


class DeepHead(torch.nn.Module):
    """A network whose classify is two layers."""

    def __init__(self, input_shape=None, num_classes=None):
        super().__init__()
        self.body = torch.nn.Linear(64, 16)
        self.head = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, num_classes or 10))

    def forward(self, x):
        return self.classify(self.embed(x))

    def embed(self, x):
        return torch.relu(self.body(x.flatten(1)))

    def classify(self, features):
        return self.head(features)


class NoSplit(torch.nn.Module):
    def __init__(self, input_shape=None, num_classes=None):
        super().__init__()
        self.fc = torch.nn.Linear(64, num_classes or 10)

    def forward(self, x):
        return self.fc(x.flatten(1))


@pytest.mark.parametrize(("net", "words"), [("DeepHead", "must be one torch.nn.Linear"), ("NoSplit", "embed(x)")])
def test_a_network_without_one_linear_output_layer_is_refused_before_training(net, words):
    loop = loop_for(FedGen(**SMALL), model={"class_path": f"{__name__}.{net}"}, rounds=1)
    with pytest.raises(ConfigError) as err:
        loop.fit()
    message = str(err.value)
    assert message.startswith("model: FedGen") and words in message and net in message and "\n" not in message
    assert loop.history == [] and loop.server_side.ledger.messages == []
    assert all(c._private_epochs == 0 for c in loop.view.clients)


def test_clients_whose_feature_widths_differ_are_refused_before_training():
    spec = {"class_path": "fdlit.models.PerClient", "init_args": {"groups": [
        {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}, "fraction": 0.5},
        {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [32]}, "fraction": 0.5}]}}
    loop = loop_for(FedGen(**SMALL, share="heads"), model=spec, rounds=1)
    with pytest.raises(ConfigError, match=r"^model: FedGen's generator .* got widths \[16, 32\]$"):
        loop.fit()
    # only the set-up's widths went up
    assert loop.history == [] and {m.round for m in loop.server_side.ledger.messages} == {0}
    assert all(c._private_epochs == 0 for c in loop.view.clients)


def test_the_default_beats_local_training_on_digits_by_ten_points(tmp_path):
    """Digits, 20 clients of k = 2 classes (the shipped configs, 2 rounds, 20 generator steps): the
    default runs the paper's setting, whose averaged networks learn the classes a client lacks."""
    from fdlit.cli import main
    from fdlit.runs import read_jsonl

    def final_global(name, *argv):
        run_dir = tmp_path / name
        assert main(["fit", *argv, "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir",
                     str(run_dir), "--federation.rounds", "2"]) == 0
        (run,) = [p for p in run_dir.iterdir() if p.is_dir()]
        return read_jsonl(run / "metrics.jsonl")[-1]["after_public/global_acc_mean"]

    fedgen = final_global("fedgen", "--config", "digits_fedgen.yaml", "--aggregator.init_args.generator_steps", "20")
    alone = final_global("alone", "--config", "digits.yaml", "--federation.mode", "local_only")
    assert fedgen >= alone + 0.10, (fedgen, alone)

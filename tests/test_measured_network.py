"""Which network each method's accuracies measure, as docs/algorithms.md ("Which network is measured")
and the methods' docstrings name it: the metric logged equals that network's accuracy by hand, does not
move when any other network or state is perturbed, and moves when the named network is."""

import pytest
import torch

from fdlit.methods import FML, FedDistill, FedGen, FedKD, FedProto
from fdlit.models.mutual import find_pair
from tests.fitting import data_free_loop as loop_for

SMALL_GEN = {"generated": 16, "generator_steps": 20, "generator_batch": 16, "hidden": 16}


def scramble(module: torch.nn.Module, seed: int = 0) -> None:
    """Every parameter replaced by fresh Gaussian numbers (a network that no longer predicts as trained)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))


def accuracy(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((net(x).argmax(-1) == y).float().mean())


def global_accuracies(loop) -> torch.Tensor:
    return loop.parts.evaluate()["global_acc"].clone()


def check_measured(loop, measured, others):
    """``measured(client)``: the network the docs name; ``others(client)``: what else the client or
    server holds, perturbed in place. The logged metric is the named network's, by hand; perturbing
    the others leaves the accuracies as they are; perturbing the named one moves them."""
    x, y = loop.parts.tensors.test_x, loop.parts.tensors.test_y
    hand = sum(accuracy(measured(c), x, y) for c in loop.view.clients) / len(loop.view.clients)
    assert loop.history[-1]["after_public/global_acc_mean"] == pytest.approx(hand, abs=1e-6)
    before = global_accuracies(loop)
    for c in loop.view.clients:
        others(c)
    torch.testing.assert_close(global_accuracies(loop), before, rtol=0, atol=0)
    for i, c in enumerate(loop.view.clients):
        scramble(measured(c), seed=i)
    assert not torch.equal(global_accuracies(loop), before)


@pytest.mark.parametrize("method", [FML, FedKD])
@pytest.mark.parametrize("evaluate", [None, "private", "shared"])
def test_the_two_network_methods_measure_the_network_evaluate_names(method, evaluate):
    """FML and FedKD: by default (``private``) the private network (FML's local model, FedKD's mentor),
    as the papers' code measures it; ``shared`` the exchanged network after the exchange."""
    loop = loop_for(method() if evaluate is None else method(evaluate=evaluate))
    loop.fit()
    named = evaluate or "private"
    other = "shared" if named == "private" else "private"
    check_measured(loop, lambda c: getattr(find_pair(c.model), named),
                   lambda c: scramble(getattr(find_pair(c.model), other), seed=99))
    # the run says which network its numbers are (summary.json, the printed summary, the report)
    said = loop.summary()["measured_network"]
    assert ("private" if named == "private" else "averaged at the exchange") in said


@pytest.mark.parametrize(("method", "words"), [
    (FedGen(share="parameters", **SMALL_GEN), "the averaged model each client loads"),
    (FedGen(share="heads", **SMALL_GEN), "averaged head"),
    (FedDistill(), "each client's own network"),
    (FedProto(), "each client's own network"),
])
def test_every_run_says_which_network_its_accuracy_is(method, words):
    loop = loop_for(method)
    loop.fit()
    assert words in loop.summary()["measured_network"]


def test_fedgen_measures_each_clients_network_after_the_exchange_not_the_generator():
    """FedGen (default, the paper's setting): each client's network as it holds it after receiving the
    averaged one; the server's generator is not measured."""
    loop = loop_for(FedGen(**SMALL_GEN))
    loop.fit()
    assert loop.server_side.method.sharing == "parameters"
    check_measured(loop, lambda c: c.model, lambda c: scramble(loop.server_side.method.generator, seed=99))


@pytest.mark.parametrize(("method", "key"), [(FedDistill, "fd_teacher"), (FedProto, "proto_global")])
def test_fd_and_fedproto_measure_each_clients_own_network_not_the_received_summaries(method, key):
    loop = loop_for(method())
    loop.fit()

    def perturb_summaries(c):
        assert key in c.method_state
        c.method_state[key] = torch.randn_like(c.method_state[key]) * 10

    check_measured(loop, lambda c: c.model, perturb_summaries)

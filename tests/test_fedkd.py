"""FedKD (Wu et al. 2022): the adaptive mutual loss against its formula by hand and its gradients,
the energy-threshold rank and the SVD factors, the energy schedule, one client's average is its own
update, the ledger's bytes are those of the factors sent, the vectorized executor against the
sequential one, a smaller mentee beside heterogeneous mentors, and the refusals."""

import pytest
import torch
import torch.nn.functional as F

from fdlit.clients.loss_context import LossContext
from fdlit.errors import ConfigError
from fdlit.execution import VectorizedExecutor
from fdlit.methods import FedKD
from fdlit.methods.base import context_for
from fdlit.methods.fedkd import FedKDClient
from fdlit.methods.parameters import exchanged_tensors, flatten
from fdlit.methods.svd_compression import compress, decompress, factor_numbers, kept_rank, matrix_shapes
from fdlit.models.mutual import find_pair
from tests.fitting import MLP16, pair_spec, private, shared
from tests.fitting import data_free_loop as loop_for

C = 10
MLP8 = {"class_path": "fdlit.models.MLP", "init_args": {"hidden": [8]}}


# ---------------------------------------------------------------- the loss by hand
def test_the_loss_is_its_formula_with_the_batchs_adaptive_intensity():
    b = 6
    g = torch.Generator().manual_seed(5)
    mentor = torch.randn(b, C, generator=g, requires_grad=True)
    mentee = torch.randn(b, C, generator=g, requires_grad=True)
    y = torch.tensor([1, 1, 0, 7, 3, 9])
    part = FedKD().client_part()
    loss = part.loss(LossContext(None, "private", mentor, y, F.cross_entropy(mentor, y), {},
                                 features=torch.cat([mentor, mentee], -1)))

    def ce(z):  # batch mean of -log softmax(z)[y], written out
        return -(z.gather(1, y[:, None])[:, 0] - z.exp().sum(1).log()).mean()

    def kl(p_logits, q_logits):  # batch mean of KL(p || q) = sum p log(p / q)
        p, q = p_logits.softmax(1), q_logits.softmax(1)
        return (p * (p / q).log()).sum(1).mean()

    ce_t, ce_s = ce(mentor), ce(mentee)
    l_t = ce_t + kl(mentee, mentor) / (ce_t + ce_s)
    l_s = ce_s + kl(mentor, mentee) / (ce_t + ce_s)
    torch.testing.assert_close(loss, l_t + l_s)
    # each network descends its own loss; the intensity 1 / (CE_t + CE_s) is a constant of the step
    w = 1 / (ce_t + ce_s).detach()
    g_t, g_s = torch.autograd.grad(loss, (mentor, mentee))
    torch.testing.assert_close(g_t, torch.autograd.grad(ce_t + w * kl(mentee.detach(), mentor), mentor)[0])
    torch.testing.assert_close(g_s, torch.autograd.grad(ce_s + w * kl(mentor.detach(), mentee), mentee)[0])


def test_a_batch_both_networks_fit_exactly_gives_a_finite_loss():
    y = torch.tensor([0, 3])
    sure = torch.zeros(2, C).scatter(1, y[:, None], 20.0)  # CE = 0 in float32
    mentee = sure.clone()
    mentee[:, 5] = 2.0  # another off-label mass, below float32's resolution of the CE: KL > 0
    assert float(F.cross_entropy(sure, y)) == 0.0 == float(F.cross_entropy(mentee, y))
    assert float(F.kl_div(sure.log_softmax(1), mentee.log_softmax(1), log_target=True, reduction="sum")) > 0
    loss = FedKD().client_part().loss(LossContext(None, "private", sure, y, torch.tensor(0.0), {},
                                                  features=torch.cat([sure, mentee], -1)))
    assert torch.isfinite(loss)


def test_a_padded_batch_gives_the_loss_of_its_real_rows():
    g = torch.Generator().manual_seed(6)
    both, y = torch.randn(5, 2 * C, generator=g), torch.tensor([2, 5, 8, 0, 0])
    part = FedKD().client_part()
    real = part.loss(LossContext(None, "private", both[:3, :C], y[:3], torch.tensor(0.0), {}, features=both[:3]))
    padded = part.loss(LossContext(None, "private", both[:, :C], y, torch.tensor(0.0), {},
                                   torch.tensor([1.0, 1, 1, 0, 0]), both))
    torch.testing.assert_close(padded, real)


# ---------------------------------------------------------------- the compression
def test_the_kept_rank_is_the_fewest_singular_values_holding_the_energy():
    s = torch.tensor([3.0, 2.0, 1.0])  # squares 9, 4, 1 of 14: shares 0.643, 0.929, 1
    assert [kept_rank(s, t) for t in (0.5, 0.643, 0.65, 0.93, 1.0)] == [1, 2, 2, 3, 3]
    assert kept_rank(torch.zeros(3), 0.9) == 0


def test_the_factors_are_the_truncated_svd_and_vectors_travel_whole():
    g = torch.Generator().manual_seed(7)
    rank_one = torch.outer(torch.randn(6, generator=g), torch.randn(4, generator=g))
    full = torch.randn(5, 3, generator=g)
    bias = torch.randn(5, generator=g)
    tensors = [rank_one, full, bias]
    shapes = matrix_shapes(tensors)
    assert shapes.tolist() == [[6, 4], [5, 3], [1, 5]]
    flat = flatten(tensors)
    sent = compress(flat, shapes, 0.99)
    s = torch.linalg.svdvals(full.double())
    k = kept_rank(s, 0.99)
    assert sent["ranks"].tolist() == [1, k] and sent["ranks"].dtype == torch.int32
    assert sent["factors"].numel() == (6 + 1 + 4) * 1 + (5 + 1 + 3) * k + 5 == factor_numbers([1, k], shapes)
    back = decompress(sent["factors"], sent["ranks"], shapes)
    torch.testing.assert_close(back[:24], rank_one.reshape(-1))  # rank one: exact up to rounding
    u, sv, vh = torch.linalg.svd(full.double(), full_matrices=False)
    torch.testing.assert_close(back[24:39], ((u[:, :k] * sv[:k]) @ vh[:k]).float().reshape(-1))
    assert torch.equal(back[39:], bias)  # vectors are sent as they are
    torch.testing.assert_close(decompress(**compress(flat, shapes, 1.0), shapes=shapes), flat)


def test_the_energy_share_grows_from_start_to_end_over_the_rounds():
    loop = loop_for(FedKD(0.9, 0.96, energy_rounds=2), rounds=3)
    loop.fit()
    assert [m["fedkd/energy"] for m in loop.history] == pytest.approx([0.93, 0.96, 0.96])


# ---------------------------------------------------------------- one client
def test_with_one_upload_the_average_is_that_clients_update():
    method = FedKD(1.0, 1.0)
    tensors = [torch.randn(6, 4), torch.randn(6)]
    shapes = matrix_shapes(tensors)
    method.server_setup([{"num_samples": torch.tensor(11), "initial_parameters": flatten(tensors),
                          "matrix_shapes": shapes}], context_for([{}]))
    update = flatten([torch.randn(6, 4, generator=torch.Generator().manual_seed(2)), torch.randn(6)])
    upload = compress(update, shapes, 0.9)
    down = method.aggregate([upload], context_for([{}])).broadcast
    own = decompress(upload["factors"], upload["ranks"], shapes)
    torch.testing.assert_close(decompress(down["factors"], down["ranks"], shapes), own)


class Trained(FedKDClient):
    """FedKD's client part that keeps its mentee as trained, before the upload."""

    def upload(self, ctx):
        ctx.state["_trained"] = flatten(exchanged_tensors(find_pair(ctx.client.model).shared)).clone()
        return super().upload(ctx)


class KeepTrained(FedKD):
    def client_part(self):
        return Trained(self.energy_start, self.energy_end, self.energy_rounds)


def test_one_client_at_full_energy_gets_back_its_own_trained_mentee():
    loop = loop_for(KeepTrained(1.0, 1.0), rounds=2, clients=1)
    loop.fit()
    state = loop.view.clients[0].method_state
    torch.testing.assert_close(shared(loop), state["_trained"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state["fedkd_reference"], shared(loop), rtol=0, atol=0)


# ---------------------------------------------------------------- the ledger
class Recording(FedKD):
    """FedKD that keeps the ranks of what it received and sent."""

    def aggregate(self, uploads, ctx):
        out = super().aggregate(uploads, ctx)
        self.seen = getattr(self, "seen", {})
        self.seen[ctx.info.round] = ([u["ranks"].tolist() for u in uploads], out.broadcast["ranks"].tolist())
        return out


def test_the_ledger_counts_the_bytes_of_the_factors_sent():
    method = Recording(0.8, 0.9)
    loop = loop_for(method, model=pair_spec(MLP16, MLP8))
    loop.fit()
    shapes = matrix_shapes(exchanged_tensors(find_pair(loop.view.clients[0].model).shared))
    full = int(shapes.prod(-1).sum())
    for r in (1, 2):
        up_ranks, down_ranks = method.seen[r]
        rows = [m for m in loop.server_side.ledger.messages if m.round == r]
        factors_up = sorted(m.bytes for m in rows if m.direction == "up" and m.kind == "factors")
        assert factors_up == sorted(4 * factor_numbers(k, shapes) for k in up_ranks)
        matrices = int(((shapes[:, 0] > 1) & (shapes[:, 1] > 1)).sum())  # W1 and W2; the biases travel whole
        assert matrices == 2 and all(m.bytes == 4 * matrices for m in rows if m.kind == "ranks")
        down = [m.bytes for m in rows if m.direction == "down" and m.kind == "factors"]
        assert down == [4 * factor_numbers(down_ranks, shapes)] * 4
        assert max(factors_up) < 4 * full  # compressed: fewer numbers than the mentee has
    assert {m.kind for m in loop.server_side.ledger.messages if m.round >= 1} == {"factors", "ranks"}
    assert loop.server_side.ledger.total("up", round=0) == 4 * 8 + 4 * full + 4 * shapes.numel()


# ---------------------------------------------------------------- executors and networks
def test_vectorized_executor_trains_as_the_sequential_one():
    seq = loop_for(FedKD(1.0, 1.0))
    seq.fit()
    vec = loop_for(FedKD(1.0, 1.0), executor=VectorizedExecutor())
    vec.fit()
    assert len(vec.parts.clients.executor._vectorized) == 4  # stacked, not through the sequential fallback
    for i in range(4):
        torch.testing.assert_close(private(vec, i), private(seq, i), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(shared(vec, i), shared(seq, i), rtol=1e-4, atol=1e-5)
    for a, b in zip(seq.history, vec.history, strict=True):
        assert a["after_private/global_acc_mean"] == pytest.approx(b["after_private/global_acc_mean"], abs=1e-6)


def test_a_smaller_mentee_beside_different_mentors():
    cnn = {"class_path": "fdlit.models.SmallCNN", "init_args": {"channels": 4, "hidden": 16}}
    groups = [{**pair_spec(MLP16, MLP8), "fraction": 0.5}, {**pair_spec(cnn, MLP8), "fraction": 0.5}]
    loop = loop_for(FedKD(), model={"class_path": "fdlit.models.PerClient", "init_args": {"groups": groups}})
    loop.fit()
    assert {type(find_pair(c.model).private).__name__ for c in loop.view.clients} == {"MLP", "SmallCNN"}
    assert all(torch.equal(shared(loop, i), shared(loop, 0)) for i in range(4))
    assert shared(loop).numel() < private(loop).numel()


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("kwargs,field", [
    ({"energy_start": 0.99, "energy_end": 0.95}, "energy_start"),
    ({"energy_start": 0.0}, "energy_start"),
    ({"energy_start": -0.5}, "energy_start"),
    ({"energy_end": 1.5}, "energy_end"),
    ({"energy_rounds": 0}, "energy_rounds"),
])
def test_bad_knobs_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=rf"^aggregator\.{field}: ") as err:
        FedKD(**kwargs)
    assert "\n" not in str(err.value)


def test_different_mentees_are_refused_naming_the_groups():
    groups = [{**pair_spec(MLP16, MLP8), "fraction": 0.5}, {**pair_spec(MLP16, MLP16), "fraction": 0.5}]
    with pytest.raises(ConfigError, match=r"^model\.init_args\.groups: FedKD averages the shared network"):
        loop_for(FedKD(), model={"class_path": "fdlit.models.PerClient", "init_args": {"groups": groups}})

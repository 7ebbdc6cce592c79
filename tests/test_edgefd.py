"""EdgeFD (Mujtaba et al. 2025): the server's mean of the kept predictions by hand, a sample no
client kept dropped, all masks on = AVG, the k-means selector's mask against centroids and a
threshold computed here, refusals, and whole runs: sequential against vectorized, the bytes of a round
from the clients' masks, a per-round public subset, and a stop after round 1 with a resume."""

import json
import math

import pytest
import torch

from fdlit.cli import main
from fdlit.errors import ConfigError
from fdlit.methods import EdgeFD, ProbabilityAveraging
from fdlit.methods.base import context_for
from fdlit.runs import read_jsonl
from tests.fitting import EXECUTORS, fit_loop, ledger_rows, only_run, tiny, without_time

CONFIG = "digits_edgefd.yaml"


# ---------------------------------------------------------------- by hand
def test_the_teacher_is_the_mean_of_the_kept_predictions_and_an_uncovered_sample_is_dropped():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 4, 5, generator=g)  # M=3 clients, N=4 samples, C=5
    masks = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 1], [0, 1, 0, 1]], dtype=torch.bool)  # nobody kept sample 2
    uploads = [{"logits": z[i][masks[i]], "mask": masks[i]} for i in range(3)]
    out = EdgeFD().aggregate(uploads, context_for([{"logits": z[0]}] * 3))
    q = z.softmax(-1)
    expected = torch.stack([(q[0, 0] + q[1, 0]) / 2, (q[0, 1] + q[2, 1]) / 2, torch.full((5,), 0.2), (q[1, 3] + q[2, 3]) / 2])
    torch.testing.assert_close(out.teacher, expected)
    assert out.keep.tolist() == [True, True, False, True]
    torch.testing.assert_close(out.weights[:, 0], torch.tensor([0.5, 0.5, 0.0]))
    torch.testing.assert_close(out.weights.sum(0), torch.ones(4))


def test_with_every_mask_on_it_is_avg():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(4, 6, 3, generator=g)
    uploads = [{"logits": zi, "mask": torch.ones(6, dtype=torch.bool)} for zi in z]
    ctx = context_for([{"logits": zi} for zi in z])
    torch.testing.assert_close(EdgeFD().aggregate(uploads, ctx).teacher,
                               ProbabilityAveraging().aggregate([{"logits": zi} for zi in z], ctx).teacher)


def test_the_selector_keeps_the_public_samples_within_the_calibration_radius_of_the_nearest_centroid():
    g = torch.Generator().manual_seed(2)
    centres = torch.tensor([[0.0, 0.0], [10.0, 10.0]])
    train = torch.cat([centres[0] + torch.randn(40, 2, generator=g), centres[1] + torch.randn(40, 2, generator=g)])
    cal = torch.cat([centres[0] + torch.randn(20, 2, generator=g), centres[1] + torch.randn(20, 2, generator=g)])
    public = torch.tensor([[0.5, 0.0], [10.0, 9.5], [5.0, 5.0], [-6.0, 0.0], [0.0, 30.0], [9.0, 10.0]])
    part = EdgeFD(quantile=0.9).client_part()
    mask = part.client_mask(train, cal, 2, public, seed=0)
    # k-means on two well-separated blobs finds their means; the radius is the calibration quantile
    hand = torch.stack([train[:40].mean(0), train[40:].mean(0)]).double()
    tau = torch.quantile(torch.cdist(cal.double(), hand).min(-1).values, 0.9)
    expected = torch.cdist(public.double(), hand).min(-1).values <= tau
    assert mask.tolist() == expected.tolist() == [True, True, False, False, False, True]
    wider = EdgeFD(quantile=1.0).client_part().client_mask(train, cal, 2, public, seed=0)
    assert (wider >= mask).all()  # a larger quantile never keeps fewer samples


def test_the_selector_fits_on_one_thread_so_a_mask_does_not_depend_on_the_machine(monkeypatch):
    """KMeans' sums are reduced over OpenMP threads: a node or actor with another core count would
    otherwise keep other public samples near the radius than ``fit`` does (deployed EdgeFD differed)."""
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_info, threadpool_limits

    seen, fit = [], KMeans.fit

    def recording_fit(self, *args, **kwargs):
        seen.append(max((p["num_threads"] for p in threadpool_info() if p["user_api"] == "openmp"), default=1))
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(KMeans, "fit", recording_fit)
    x = torch.randn(60, 4, generator=torch.Generator().manual_seed(0))
    with threadpool_limits(limits=2):
        EdgeFD().client_part().client_mask(x[:40], x[40:], 3, x, seed=0)
    assert seen == [1]


@pytest.mark.parametrize("kwargs, field", [({"quantile": 0.0}, "aggregator.quantile"), ({"quantile": 1.5}, "aggregator.quantile"),
                                           ({"clusters_per_class": 0}, "aggregator.clusters_per_class"), ({"n_init": 0}, "aggregator.n_init")])
def test_bad_settings_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        EdgeFD(**kwargs)
    assert err.value.field == field and "\n" not in str(err.value)


# ---------------------------------------------------------------- whole runs
def numbers(history):
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "ray/")) and isinstance(v, float)}
            for m in history]


def test_sequential_and_vectorized_executors_give_the_same_numbers_and_messages(tmp_path):
    seq = fit_loop(tiny(CONFIG, tmp_path / "seq", "--federation.executor", EXECUTORS["sequential"]))
    vec = fit_loop(tiny(CONFIG, tmp_path / "vec", "--federation.executor", EXECUTORS["vectorized"]))
    assert 0 < seq.history[-1]["edgefd/client_kept_fraction"] < 1  # the selector kept some, not all
    assert ledger_rows(seq) == ledger_rows(vec)
    for a, b in zip(numbers(seq.history), numbers(vec.history), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert math.isclose(a[key], b[key], rel_tol=1e-5, abs_tol=1e-5) or (math.isnan(a[key]) and math.isnan(b[key])), key


def test_the_bytes_of_a_round_are_the_kept_rows_and_the_bit_masks(tmp_path):
    n, c = 120, 10
    loop = fit_loop(tiny(CONFIG, tmp_path))
    masks = torch.stack([client.method_state["edgefd_mask"] for client in loop.view.clients])  # M x N
    kept = masks.sum(1)
    covered = int(masks.any(0).sum())
    bits = math.ceil(n / 8)
    for r in (1, 2):
        for i, client in enumerate(loop.view.clients):
            up = sum(m.bytes for m in loop.server_side.ledger.messages
                     if m.round == r and m.client == i and m.direction == "up")
            assert up == int(kept[i]) * c * 4 + bits  # float32 kept logits + the bit mask
        down = loop.server_side.ledger.total("down", round=r)
        assert down == len(loop.view.clients) * (covered * c * 4 + bits)  # the covered rows' teacher + the keep mask
    assert loop.server_side.ledger.total(round=0) == 0
    # the set-up fitted each client's selector with 3 centroids per local class, its own seed
    client, data = loop.view.clients[1], loop.view.client_data[1]
    again = loop.server_side.method.client_part().client_mask(data.train.x, data.calibration.x, 3 * len(client.classes),
                                                      loop.parts.tensors.public_x,
                                                      seed=(loop.seed * 1_000_003 + client.client_id) % 2**32)
    assert torch.equal(again.cpu(), masks[1].cpu())


def test_a_per_round_public_subset_uploads_the_rounds_rows_of_the_set_up_mask(tmp_path):
    loop = fit_loop(tiny(CONFIG, tmp_path, "--federation.participation.public_fraction", "0.5"))
    masks = [m for m in loop.server_side.ledger.messages if m.kind == "mask" and m.round >= 1]
    logits = [m for m in loop.server_side.ledger.messages if m.kind == "logits" and m.round >= 1]
    assert masks and all(m.shape == (60,) for m in masks)
    assert all(lg.shape[0] <= 60 for lg in logits)
    assert all(c.method_state["edgefd_mask"].shape == (120,) for c in loop.view.clients)  # fitted over the full set


def test_stopped_after_round_1_and_resumed_equals_an_uninterrupted_run(tmp_path):
    assert main(["fit", *tiny(CONFIG, tmp_path / "straight")]) == 0
    assert main(["fit", *tiny(CONFIG, tmp_path / "stopped", "--federation.rounds", "1")]) == 0
    stopped = only_run(tmp_path / "stopped")
    assert main(["fit", "--resume", str(stopped), "--federation.rounds", "2"]) == 0
    straight = only_run(tmp_path / "straight")
    assert read_jsonl(stopped / "communication.jsonl") == read_jsonl(straight / "communication.jsonl")
    assert without_time(read_jsonl(stopped / "metrics.jsonl")) == without_time(read_jsonl(straight / "metrics.jsonl"))
    assert json.loads((stopped / "summary.json").read_text())["finished"]

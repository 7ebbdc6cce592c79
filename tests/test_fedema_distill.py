"""FedEMA-Distill (Reguieg et al. 2026): the trimmed-mean EMA teacher by hand over two rounds, an
outlier client ignored, the EMA over the full public set under a per-round subset, the state saved and
restored, the temperature loss, refusals, and whole runs: sequential against vectorized, the bytes of
a round, and a stop after round 1 with a resume."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from fdlit.cli import main
from fdlit.clients.loss_context import LossContext
from fdlit.errors import ConfigError
from fdlit.methods import FedEMADistill
from fdlit.methods.base import ServerContext, context_for
from fdlit.methods.contexts import FederationInfo
from fdlit.runs import read_jsonl
from tests.fitting import EXECUTORS, fit_loop, only_run, tiny, without_time

CONFIG = "digits_fedema_distill.yaml"


def uploads_of(logits):
    return [{"logits": z} for z in logits]


def trimmed_by_hand(z, b):
    """Per coordinate: sort the M values, drop the b lowest and b highest, average the rest."""
    m, n, c = z.shape
    out = torch.empty(n, c)
    for x in range(n):
        for k in range(c):
            values = sorted(z[:, x, k].tolist())
            kept = values[b: m - b]
            out[x, k] = sum(kept) / len(kept)
    return out


# ---------------------------------------------------------------- by hand
def test_two_rounds_equal_the_ema_of_trimmed_means_by_hand():
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(5, 6, 3, generator=g), torch.randn(5, 6, 3, generator=g)
    method = FedEMADistill(beta=0.7, robust="trimmed_mean", trim=0.2, temperature=2.0)  # b = floor(0.2 * 5) = 1
    first = method.aggregate(uploads_of(z1), context_for(uploads_of(z1))).teacher
    second = method.aggregate(uploads_of(z2), context_for(uploads_of(z2), round=2)).teacher
    a1, a2 = trimmed_by_hand(z1, 1), trimmed_by_hand(z2, 1)
    torch.testing.assert_close(first, torch.softmax(a1 / 2.0, -1))
    torch.testing.assert_close(second, torch.softmax((0.7 * a1 + 0.3 * a2) / 2.0, -1))
    assert not torch.allclose(second, torch.softmax(a2 / 2.0, -1), atol=1e-3)  # the EMA kept round 1


def test_an_outlier_client_is_ignored_by_the_trimmed_mean_and_the_median_but_not_the_mean():
    g = torch.Generator().manual_seed(1)
    honest = torch.randn(4, 5, 3, generator=g)  # |values| < 5 here

    def teacher(robust, attack):
        z = torch.cat([honest, torch.zeros(1, 5, 3)])
        z[4, :, 0] = attack  # the outlier pushes class 0
        method = FedEMADistill(robust=robust, trim=0.2, temperature=1.0)
        return method, method.aggregate(uploads_of(z), context_for(uploads_of(z))).teacher

    assert honest.abs().max() < 5
    for robust in ("trimmed_mean", "median"):
        # the attacker's value is cut (or never the middle one) however far out it is
        torch.testing.assert_close(teacher(robust, 5.0)[1], teacher(robust, 1e4)[1])
        method, _ = teacher(robust, 1e4)
        assert (method.ema[:, 0] <= honest[:, :, 0].max(0).values).all()  # inside the honest values' range
    _, pushed = teacher("mean", 1e4)
    assert (pushed[:, 0] > 0.999).all() and not torch.allclose(teacher("mean", 5.0)[1], pushed, atol=1e-3)


def test_median_and_mean_are_their_formulas():
    z = torch.tensor([[[0.0, 1.0]], [[2.0, -1.0]], [[5.0, 3.0]], [[1.0, 0.0]]])  # M=4, N=1, C=2
    median = FedEMADistill(robust="median", temperature=1.0).aggregate(uploads_of(z), context_for(uploads_of(z))).teacher
    torch.testing.assert_close(median, torch.softmax(torch.tensor([[1.5, 0.5]]), -1))  # mean of the two middle values
    mean = FedEMADistill(robust="mean", temperature=1.0).aggregate(uploads_of(z), context_for(uploads_of(z))).teacher
    torch.testing.assert_close(mean, torch.softmax(torch.tensor([[2.0, 0.75]]), -1))


def test_the_ema_is_kept_over_the_full_public_set_and_mixes_only_the_same_sample():
    method = FedEMADistill(beta=0.5, robust="mean", temperature=1.0)

    def round_with(r, ids, z):
        info = FederationInfo(r, 0, 1, 2, torch.zeros(len(ids), 1), public_index=torch.tensor(ids), public_size=4)
        return method.aggregate([{"logits": z}], ServerContext(info)).teacher

    round_with(1, [0, 1], torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
    second = round_with(2, [1, 3], torch.tensor([[4.0, 0.0], [1.0, 0.0]]))  # sample 1 again, sample 3 new
    torch.testing.assert_close(second, torch.softmax(torch.tensor([[2.0, 1.0], [1.0, 0.0]]), -1))
    assert method.ema.shape == (4, 2) and method.ema[2].isnan().all()  # never aggregated yet
    torch.testing.assert_close(method.ema[0], torch.tensor([2.0, 0.0]))  # untouched by round 2


def test_the_saved_state_continues_exactly():
    g = torch.Generator().manual_seed(2)
    z1, z2 = torch.randn(3, 4, 5, generator=g), torch.randn(3, 4, 5, generator=g)
    straight = FedEMADistill(beta=0.6)
    straight.aggregate(uploads_of(z1), context_for(uploads_of(z1)))
    expected = straight.aggregate(uploads_of(z2), context_for(uploads_of(z2), round=2)).teacher
    first = FedEMADistill(beta=0.6)
    first.aggregate(uploads_of(z1), context_for(uploads_of(z1)))
    resumed = FedEMADistill(beta=0.6)
    resumed.load_state_dict(first.state_dict())
    torch.testing.assert_close(resumed.aggregate(uploads_of(z2), context_for(uploads_of(z2), round=2)).teacher, expected)
    fresh = FedEMADistill(beta=0.6).aggregate(uploads_of(z2), context_for(uploads_of(z2), round=2)).teacher
    assert not torch.allclose(fresh, expected, atol=1e-4)


def test_the_client_distils_at_the_temperature():
    g = torch.Generator().manual_seed(3)
    logits, teacher = torch.randn(6, 4, generator=g), torch.softmax(torch.randn(6, 4, generator=g), -1)
    part = FedEMADistill(temperature=3.0).client_part()
    base = torch.tensor(7.0)
    loss = part.loss(LossContext(None, "public", logits, teacher, base, {}))
    log_q = F.log_softmax(logits / 3.0, -1)
    expected = 9.0 * (teacher * (teacher.log() - log_q)).sum(-1).mean()
    torch.testing.assert_close(loss, expected)
    assert part.loss(LossContext(None, "private", logits, teacher, base, {})) is base


@pytest.mark.parametrize("kwargs, field", [({"beta": 1.0}, "aggregator.beta"), ({"robust": "mode"}, "aggregator.robust"),
                                           ({"trim": 0.5}, "aggregator.trim"), ({"temperature": 0.0}, "aggregator.temperature")])
def test_bad_settings_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        FedEMADistill(**kwargs)
    assert err.value.field == field and "\n" not in str(err.value)


# ---------------------------------------------------------------- whole runs
def numbers(history):
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "ray/")) and isinstance(v, float)}
            for m in history]


def test_sequential_and_vectorized_executors_give_the_same_numbers(tmp_path):
    seq = fit_loop(tiny(CONFIG, tmp_path / "seq", "--federation.executor", EXECUTORS["sequential"]))
    vec = fit_loop(tiny(CONFIG, tmp_path / "vec", "--federation.executor", EXECUTORS["vectorized"]))
    assert seq.history[-1]["train/public_loss_mean"] > 0
    for a, b in zip(numbers(seq.history), numbers(vec.history), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert math.isclose(a[key], b[key], rel_tol=1e-5, abs_tol=1e-5) or (math.isnan(a[key]) and math.isnan(b[key])), key
    torch.testing.assert_close(seq.server_side.method.ema, vec.server_side.method.ema, rtol=1e-5, atol=1e-5)


def test_the_bytes_of_a_round_are_the_logits_up_and_the_teacher_down(tmp_path):
    m, n, c = 4, 120, 10
    loop = fit_loop(tiny(CONFIG, tmp_path))
    for r in (1, 2):
        assert loop.server_side.ledger.total("up", round=r) == m * n * c * 4  # float32 logits
        assert loop.server_side.ledger.total("down", round=r) == m * n * c * 4  # float32 teacher
    assert loop.server_side.ledger.total(round=0) == 0


def test_stopped_after_round_1_and_resumed_equals_an_uninterrupted_run(tmp_path):
    assert main(["fit", *tiny(CONFIG, tmp_path / "straight")]) == 0
    assert main(["fit", *tiny(CONFIG, tmp_path / "stopped", "--federation.rounds", "1")]) == 0
    stopped = only_run(tmp_path / "stopped")
    assert main(["fit", "--resume", str(stopped), "--federation.rounds", "2"]) == 0
    straight = only_run(tmp_path / "straight")
    assert read_jsonl(stopped / "communication.jsonl") == read_jsonl(straight / "communication.jsonl")
    resumed = without_time(read_jsonl(stopped / "metrics.jsonl"))
    assert resumed == without_time(read_jsonl(straight / "metrics.jsonl"))
    assert json.loads((stopped / "summary.json").read_text())["finished"]


def test_a_per_round_public_subset_keeps_the_ema_over_the_full_public_set(tmp_path):
    loop = fit_loop(tiny(CONFIG, tmp_path, "--federation.participation.public_fraction", "0.5", "--federation.rounds", "3"))
    assert loop.round == 3 and loop.server_side.method.ema.shape == (120, 10)
    fractions = [m["fedema/new_rows_fraction"] for m in loop.history]
    assert fractions[0] == 1.0 and fractions[-1] < 1.0  # later rounds meet samples aggregated before


# ---------------------------------------------------------------- the default under label skew
def teacher_accuracies(tmp_path, config, *extra):
    argv = ["fit", "--config", config, "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(tmp_path), "--federation.rounds", "2", *extra]
    assert main(argv) == 0
    return [m["teacher/acc"] for m in read_jsonl(only_run(tmp_path) / "metrics.jsonl")]


def test_the_default_teacher_stays_within_a_tenth_of_avgs_on_digits_at_two_classes_per_client(tmp_path):
    """Digits, 20 clients of k = 2 classes (the shipped configs, 2 rounds): a trimmed mean or median cuts
    the few clients that hold each class; the default (mean, beta 0.95) keeps the teacher near AVG's."""
    ema = teacher_accuracies(tmp_path / "ema", CONFIG)
    avg = teacher_accuracies(tmp_path / "avg", "digits_avg.yaml")
    assert all(abs(e - a) <= 0.1 for e, a in zip(ema, avg, strict=True)), (ema, avg)
    trimmed = teacher_accuracies(tmp_path / "trimmed", CONFIG, "--aggregator.init_args.robust", "trimmed_mean",
                                 "--federation.rounds", "1")
    assert trimmed[0] < avg[0] - 0.3  # what the default avoids

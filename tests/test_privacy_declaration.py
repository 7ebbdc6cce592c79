"""Privacy by declaration: the mechanism noises what a method declares it releases and names no rule;
the central threat model (secure aggregation, one noise draw on the sum) for rules that declare a
summed teacher, refused for the others."""

import ast
import math
from pathlib import Path

import pytest
import torch

import fdlit.methods
from fdlit.cli import main
from fdlit.errors import ConfigError
from fdlit.messages import Message
from fdlit.methods import ProbabilityAveraging
from fdlit.methods.base import Aggregator, ClientPart, context_for
from fdlit.privacy import UploadPrivacy
from tests.fitting import fit_loop, tiny

DP = ("--privacy.noise_multiplier", "0.8", "--privacy.clip_norm", "2.0", "--privacy.delta", "1e-4")
PRIVACY = Path(fdlit.methods.__file__).parent.parent / "privacy"


def echo(r, i, messages):
    return messages


class PrototypesUpload(ClientPart):
    def upload(self, ctx):
        return {}


class SecretUpload(ClientPart):
    def upload(self, ctx):
        return {"secret": torch.zeros(1)}


class ExtraRows(Aggregator):  # a method written outside the package that releases one more matrix
    released = {"logits": "rows", "prototypes": "rows", "labels_held": "clear"}

    def client_part(self):
        return PrototypesUpload()

    def aggregate(self, uploads, ctx):
        return None


class Undeclared(ExtraRows):  # its client part uploads more, below the class that declared ``released``
    def client_part(self):
        return SecretUpload()


class OpaqueTeacher(ProbabilityAveraging):  # changes the teacher below the ``summed`` declaration
    def aggregate(self, uploads, ctx):
        return super().aggregate(uploads, ctx)


def test_the_privacy_package_names_no_method():
    methods = {n for n in fdlit.methods.__all__ if n[0].isupper()} - {"Aggregator", "AggregationResult"}
    names = methods | {"UWA", "gmm", "isinstance"}
    for path in PRIVACY.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("fdlit.methods"), path
        code = ast.unparse(tree)  # docstrings included, comments not
        assert not [n for n in names if n in code], (path, [n for n in names if n in code])


def test_a_declared_extra_matrix_is_clipped_and_noised_in_the_same_release_and_clear_keys_pass():
    privacy = UploadPrivacy(noise_multiplier=0.5, clip_norm=1.0)
    privacy.check(ExtraRows(), num_classes=3)
    logits, prototypes = torch.randn(50, 3) * 0.1, torch.randn(4, 3) * 0.1  # inside the ball: noise only
    held = torch.tensor([0, 2])
    payload = Message({"logits": logits, "prototypes": prototypes, "labels_held": held}, metrics={"diagnostic": 1.0})
    uploads, stats = privacy.upload(1, [payload], torch.float32, 0, 3, 1.0, echo)
    assert uploads[0].metrics["diagnostic"] == 1.0  # a metric is reported, never released or noised
    assert stats["privacy/noise_std_mean"] == pytest.approx(0.5 * 2 * 1.0 * math.sqrt(54))
    assert (uploads[0]["prototypes"] - prototypes).abs().mean() > 1.0  # noised with std ~7
    assert torch.equal(uploads[0]["labels_held"], held)
    with pytest.raises(RuntimeError, match="'secret'.*does not cover"):
        privacy.upload(2, [{"logits": logits, "secret": torch.ones(1)}], torch.float32, 0, 3, 1.0, echo)


def test_a_method_that_uploads_more_than_it_declares_is_refused_before_any_work():
    with pytest.raises(ConfigError, match="without declaring what it releases") as err:
        UploadPrivacy(noise_multiplier=1.0).check(Undeclared(), num_classes=3)
    assert err.value.field == "privacy.noise_multiplier"
    UploadPrivacy(noise_multiplier=0.0).check(Undeclared(), num_classes=3)  # without DP nothing is refused
    declared = Undeclared()
    declared.released = {"logits": "rows", "secret": "rows"}  # declared on the instance: accepted
    UploadPrivacy(noise_multiplier=1.0).check(declared, num_classes=3)


def test_central_noise_goes_once_on_the_sum_and_the_rule_receives_the_noisy_mean():
    sigma, c, n, m = 0.5, 1.0, 400, 5
    logits = [torch.randn(n, 3, generator=torch.Generator().manual_seed(i)) for i in range(m)]
    for method, to_share in [(ProbabilityAveraging(), lambda z: z.double().softmax(-1)),
                             (fdlit.methods.LogitAveraging(), lambda z: z.double()),
                             # DS-FL's sharpening and FedMD's softmax act on the mean: post-processing of the sum
                             (fdlit.methods.EntropyReduction(), lambda z: z.double().softmax(-1)),
                             (fdlit.methods.FedMD(), lambda z: z.double())]:
        privacy = UploadPrivacy(noise_multiplier=sigma, clip_norm=c, accounting="secure_aggregation")
        privacy.check(method, num_classes=3)
        sent = {}
        uploads, stats = privacy.upload(1, [{"logits": z} for z in logits], torch.float32, 0, 3, 1.0,
                                        lambda r, i, msg, sent=sent: sent.setdefault(i, []).append(msg), list(range(m)))
        shares = torch.stack([to_share(z) for z in logits])
        shares = shares * (c / shares.norm(dim=-1, keepdim=True)).clamp(max=1)
        kinds = {k for messages in sent.values() for message in messages for k in message}
        assert "secagg_masked" in kinds and "logits" not in kinds  # the server never sees a client's share
        assert all(torch.equal(u["logits"], uploads[0]["logits"]) for u in uploads)  # one noisy mean for all
        std = sigma * 2 * c * math.sqrt(n)
        assert stats["privacy/noise_std_mean"] == pytest.approx(std)
        if method.summed == "logits":  # the noise on the sum has std sigma * Delta
            noise = uploads[0]["logits"].double() * m - shares.sum(0)
            assert noise.std().item() == pytest.approx(std, rel=0.05)
        else:  # the rule's teacher is the noisy mean probability, brought back onto the simplex
            teacher = method.aggregate(uploads, context_for(uploads)).teacher
            assert torch.allclose(teacher.sum(-1), torch.ones(n), atol=1e-5)
            assert stats["privacy/epsilon"] > 0


@pytest.mark.parametrize(("method", "reason"), [
    (fdlit.methods.SmoothedUncertaintyWeighted(), "non-linearly"),
    (OpaqueTeacher(), "non-linearly"),
])
def test_central_noise_is_refused_for_rules_that_combine_uploads_non_linearly(method, reason):
    with pytest.raises(ConfigError, match=reason) as err:
        UploadPrivacy(noise_multiplier=1.0, accounting="central").check(method, num_classes=10)
    assert err.value.field == "privacy.accounting" and "privacy.accounting: local" in str(err.value)


def test_central_runs_end_to_end_with_the_same_epsilon_and_counts_the_masking(tmp_path):
    local = fit_loop(tiny("digits_logit_averaging.yaml", tmp_path / "local", *DP))
    central = fit_loop(tiny("digits_logit_averaging.yaml", tmp_path / "central", *DP, "--privacy.accounting", "central"))
    assert [m["privacy/epsilon"] for m in central.history] == [m["privacy/epsilon"] for m in local.history]

    def up(loop, kind):
        return sum(m.bytes for m in loop.server_side.ledger.messages if m.direction == "up" and m.kind == kind)

    # the masked share: the same N x C numbers in 64-bit fixed point (twice float32), plus the keys and shares
    assert up(central, "secagg_masked") == 2 * up(local, "logits") > 0 and up(central, "logits") == 0
    assert central.server_side.ledger.total("up") > up(central, "secagg_masked")
    assert all(math.isfinite(m["after_public/global_acc_mean"]) for m in central.history)
    assert main(["fit", *tiny("digits.yaml", tmp_path / "refused", *DP, "--privacy.accounting", "central")]) == 2

"""fdlit's CFD, COMET and Selective-FD against the SCARLET authors' code for them (the ``reproducibility``
branch), through tests/fixtures/authors_reproducibility.json (written by scripts/side_by_side_reproducibility.py,
which ran their code unmodified on fdlit's digits split; docs/authors-code.md). None of their code runs here:

* fdlit's run of the same setting reproduces fdlit's side of the fixture, round by round;
* fdlit's server parts, fed the uploads their clients sent in the recorded round, make what their server
  made of them: CFD's vote shares (fdlit's quantised to 8 bits), COMET's targets per client (the centroid
  of the cluster nearest each client's own prediction), Selective-FD's kept rows and their mean;
* the two sides' accuracy after private training agree within the stated tolerance every round.
"""

import json
from pathlib import Path

import pytest
import torch
from fitting import fit_loop

from fdlit.federation.participation import Participation
from fdlit.messages import Message
from fdlit.methods import CFD, COMET, SelectiveFD
from fdlit.methods.base import ClientContext, FederationInfo, ServerContext

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "authors_reproducibility.json").read_text())
SETTING, METHODS = FIXTURE["setting"], FIXTURE["methods"]
CLASSES, PUBLIC = 10, 500
# mean client accuracy after private training, fdlit against theirs, in every round (docs/authors-code.md)
ACCURACY_TOLERANCE = 0.015
CFD_QUANTISATION = 0.01
RUN_ROUNDS = 3  # fdlit's 8-bit vote share, renormalised, against their float mean of one-hots


def recorded(method: str) -> tuple[int, dict]:
    (r, rec), = METHODS[method]["recorded_rounds"].items()
    return int(r), rec


def info_for(r: int, rows: list[int]) -> FederationInfo:
    ids = torch.tensor(rows)
    return FederationInfo(r, SETTING["seed"], SETTING["clients"], CLASSES, torch.zeros(len(ids), 1),
                          public_index=ids, public_size=PUBLIC)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_fdlits_run_of_the_setting_reproduces_its_side_of_the_fixture(method, tmp_path):
    """The first rounds of the fixture's run (a round's results do not depend on how many follow)."""
    argv = [str(tmp_path) if a == "RUN_DIR" else a for a in METHODS[method]["fdlit_argv"]]
    argv[argv.index("--federation.rounds") + 1] = str(RUN_ROUNDS)
    loop = fit_loop(argv)
    ledger = loop.server_side.ledger
    for r, ours in enumerate(METHODS[method]["fdlit"][:RUN_ROUNDS], start=1):
        hist = loop.history[r - 1]
        assert ledger.total("up", round=r) == ours["bytes_up"], r
        assert ledger.total("down", round=r) == ours["bytes_down"], r
        assert hist["after_private/global_acc_mean"] == pytest.approx(ours["acc_private"], abs=1e-3), r
        assert hist["after_public/global_acc_mean"] == pytest.approx(ours["acc_public"], abs=1e-3), r


def test_their_rows_are_fdlits_draw():
    draw = Participation(public_fraction=0.1)
    for method in METHODS:
        r, rec = recorded(method)
        assert rec["rows"] == draw.public_rows(SETTING["seed"], r, PUBLIC).tolist()


def test_cfd_teacher_is_their_vote_share_quantised():
    r, rec = recorded("cfd")
    info = info_for(r, rec["rows"])
    method = CFD()
    part = method.client_part()
    uploads = []
    for up in rec["uploads"]:
        assert up["indices"] == rec["rows"]
        labels = torch.tensor(up["values"])
        logits = torch.nn.functional.one_hot(labels, CLASSES).float()  # argmax = their uploaded label
        uploads.append(part.upload(ClientContext(info, None, None, logits, {}, {})))
    teacher = method.aggregate(uploads, ServerContext(info)).teacher
    assert rec["server_indices"] == rec["rows"]
    votes = torch.tensor(rec["server_targets"])
    assert (teacher - votes).abs().max() <= CFD_QUANTISATION
    assert torch.equal(teacher.argmax(-1), votes.argmax(-1))
    # fdlit's coded upload of the same labels against their int64 labels and indices
    assert max(len(u["code"]) for u in uploads) < len(rec["rows"]) * 16


def test_comet_targets_are_the_centroid_their_clients_choose():
    r, rec = recorded("comet")
    info = info_for(r, rec["rows"])
    probs = [torch.tensor(up["values"], dtype=torch.float64) for up in rec["uploads"]]
    uploads = [{"logits": p.clamp_min(1e-30).log().float()} for p in probs]
    method = COMET(num_clusters=2)
    result = method.aggregate(uploads, ServerContext(info))
    sent = method.configure(Message({"teacher": result.teacher}), list(range(len(uploads))), ServerContext(info))
    centroids = torch.tensor(rec["centroids"])  # N x K x C, theirs
    for i, chosen in enumerate(rec["chosen"]):
        theirs = centroids[torch.arange(len(chosen)), torch.tensor(chosen)]
        assert (sent[i]["teacher"] - theirs).abs().max() < 1e-4, i
    # the round's teacher (what their server model distils on): the clients' mean
    assert (result.teacher - torch.tensor(rec["server_targets"])).abs().max() < 1e-5


def test_selective_fd_keeps_and_averages_the_rows_their_server_does():
    r, rec = recorded("selective")
    info = info_for(r, rec["rows"])
    rows = torch.tensor(rec["rows"])
    uploads = []
    for up in rec["uploads"]:
        mask = torch.isin(rows, torch.tensor(up["indices"], dtype=torch.long))
        assert rows[mask].tolist() == up["indices"]  # their clients upload in the round's row order
        kept = torch.tensor(up["values"], dtype=torch.float64).reshape(-1, CLASSES)
        uploads.append({"logits": kept.clamp_min(1e-30).log().float(), "mask": mask})
    result = SelectiveFD(labels="soft", server_threshold=2.0).aggregate(uploads, ServerContext(info))
    assert set(rows[result.keep].tolist()) == set(rec["server_indices"])
    assert len(rec["server_indices"]) < len(rows)  # the recorded round leaves rows no client kept
    where = {int(x): j for j, x in enumerate(rows.tolist())}
    theirs = torch.tensor(rec["server_targets"])
    ours = result.teacher[[where[i] for i in rec["server_indices"]]]
    assert (ours - theirs).abs().max() < 1e-5


@pytest.mark.parametrize("method", sorted(METHODS))
def test_accuracy_after_private_training_agrees(method):
    ours, theirs = METHODS[method]["fdlit"], METHODS[method]["theirs"]
    assert len(ours) == len(theirs) == SETTING["rounds"]
    for r, (f, a) in enumerate(zip(ours, theirs, strict=True), start=1):
        assert abs(f["acc_private"] - a["acc_private"]) <= ACCURACY_TOLERANCE, (r, f["acc_private"], a["acc_private"])

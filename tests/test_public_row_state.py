"""Per-public-sample server state under a per-round public subset is declared (``row_state``), not
guessed from shapes: undeclared state that ``aggregate`` changes is refused, and so is declared state
over one round's rows, whatever its layout (row-major, class-major, nested); state kept over the full
public set by sample id runs."""

import pytest
import torch

from fdlit.cli import main
from fdlit.configuration.schema import parse_fit
from fdlit.errors import ConfigError
from fdlit.methods.base import AggregationResult, Aggregator
from fdlit.runs.experiment import Experiment
from tests.fitting import one_round_args as args

SUBSET = ("--federation.rounds", "2", "--federation.private_epochs", "1", "--federation.public_epochs", "1",
          "--federation.participation.public_fraction", "0.5")


def normalised(x):
    return x / x.sum(-1, keepdim=True)


class ClassMajorVotes(Aggregator):
    """Naive votes kept class-major (C x N'): the round's rows, reused next round."""

    short_name = "class_major"

    def __init__(self):
        self.votes = None

    def aggregate(self, uploads, ctx):
        probs = self.stack_logits(uploads).softmax(-1).mean(0).T
        self.votes = probs if self.votes is None else self.votes + probs
        return AggregationResult(teacher=normalised(self.votes.T))


class DeclaredClassMajorVotes(ClassMajorVotes):
    row_state = {"votes": 1}


class NestedVotes(Aggregator):
    """Naive votes two dicts deep, over the round's rows, updated in place."""

    short_name = "nested"

    def __init__(self):
        self.state = {"votes": {"sum": None}}

    def aggregate(self, uploads, ctx):
        probs = self.stack_logits(uploads).softmax(-1).mean(0)
        inner = self.state["votes"]
        if inner["sum"] is None:
            inner["sum"] = torch.zeros_like(probs)
        inner["sum"] += probs
        return AggregationResult(teacher=normalised(inner["sum"]))


class NestedVotesByPublicId(NestedVotes):
    """The same votes, kept over the full public set and indexed by the round's public ids."""

    row_state = {"state": 0}

    def aggregate(self, uploads, ctx):
        probs, ids = self.stack_logits(uploads).softmax(-1).mean(0), ctx.info.public_ids()
        inner = self.state["votes"]
        if inner["sum"] is None:
            inner["sum"] = torch.zeros(ctx.info.full_public_size, probs.shape[-1], device=probs.device)
        inner["sum"][ids] += probs
        return AggregationResult(teacher=normalised(inner["sum"][ids]))


def loop_of(tmp_path, method, *extra):
    parser, cfg = parse_fit(args(tmp_path, *extra))
    loop = Experiment(cfg, parser).loop
    loop.server_side.method = method
    return loop


@pytest.mark.parametrize("method, message", [
    (ClassMajorVotes, r"ClassMajorVotes keeps votes \(tensors its aggregate changed in round 1\) without declaring"),
    (NestedVotes, r"NestedVotes keeps state \(tensors its aggregate changed in round 1\) without declaring"),
    (DeclaredClassMajorVotes, r"DeclaredClassMajorVotes keeps votes \(per public sample along dim 1\) with 50 rows "
                              r"in round 1, and the full public set has 100"),
])
def test_state_over_the_rounds_rows_is_refused_whatever_its_layout(tmp_path, method, message):
    loop = loop_of(tmp_path, method(), *SUBSET)
    with pytest.raises(ConfigError, match=message):
        loop.fit()
    assert loop.history == []  # stopped in round 1, before the state met other rows


def test_the_refusal_is_one_line_through_the_command_line(tmp_path, capsys):
    argv = args(tmp_path, "--aggregator", "tests.test_public_row_state.NestedVotes", *SUBSET)
    assert main(["fit", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: error: aggregator: NestedVotes keeps state")
    assert "row_state" in err[0] and "public_ids" in err[0]


def test_nested_state_over_the_full_public_set_by_id_runs_and_votes_each_sample_once_a_round(tmp_path):
    method = NestedVotesByPublicId()
    loop = loop_of(tmp_path, method, *SUBSET)
    loop.fit()
    votes = method.state["votes"]["sum"]
    assert loop.round == 2 and votes.shape == (100, 10)
    seen = [set(m_ids) for m_ids in ([int(i) for i in loop.parts.facts.plan(r).public_index] for r in (1, 2))]
    expected = torch.tensor([(i in seen[0]) + (i in seen[1]) for i in range(100)], dtype=votes.dtype)
    torch.testing.assert_close(votes.sum(-1).cpu(), expected)


def test_without_a_public_subset_nothing_needs_declaring(tmp_path):
    loop = loop_of(tmp_path, NestedVotes(), "--federation.rounds", "2", "--federation.private_epochs", "1",
                   "--federation.public_epochs", "1")
    loop.fit()
    assert loop.round == 2

"""Server state across rounds: what a server part keeps is saved by the framework when the part does
not save it itself, so a resumed run continues exactly; state it could not save is refused before
round 1, never restarted silently."""

import io

import pytest
import torch

from fdlit.configuration.schema import parse_fit
from fdlit.errors import ConfigError
from fdlit.methods.base import AggregationResult, Aggregator
from fdlit.runs.experiment import Experiment
from tests.fitting import loop_of
from tests.fitting import one_round_args as args


class CumulativeVotes(Aggregator):
    """Votes of every round so far, kept over the full public set; no state_dict of its own."""

    short_name = "votes"

    def __init__(self):
        self.votes: torch.Tensor | None = None
        self.rounds_seen = 0

    def aggregate(self, uploads, ctx):
        probs = self.stack_logits(uploads).softmax(-1).mean(0).cpu()
        if self.votes is None:
            self.votes = torch.zeros(ctx.info.full_public_size, ctx.info.num_classes)
        self.votes[ctx.info.public_ids().cpu()] += probs.argmax(-1, keepdim=True).eq(
            torch.arange(probs.shape[-1])).float()
        self.rounds_seen += 1
        teacher = (self.votes[ctx.info.public_ids().cpu()] + 1e-3) / self.rounds_seen
        return AggregationResult(teacher=teacher / teacher.sum(-1, keepdim=True))


class KeepsAGenerator(CumulativeVotes):
    def __init__(self):
        super().__init__()
        self.noise = torch.Generator().manual_seed(0)


def through_a_checkpoint(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_a_server_part_without_state_dict_resumes_equal_to_an_uninterrupted_run(tmp_path):
    straight = loop_of(tmp_path / "a", 3, CumulativeVotes())
    straight.fit()
    first = loop_of(tmp_path / "b", 2, CumulativeVotes())
    first.fit()
    state = through_a_checkpoint(first.state_dict())
    resumed = loop_of(tmp_path / "c", 3, CumulativeVotes())
    resumed.load_state_dict(state)
    resumed.fit()
    assert resumed.server_side.method.rounds_seen == 3
    torch.testing.assert_close(resumed.server_side.method.votes, straight.server_side.method.votes)
    assert resumed.history[-1]["teacher/acc"] == straight.history[-1]["teacher/acc"]
    # the resume is not a restart: a fresh part would vote from round 3 only
    assert resumed.server_side.method.votes.sum() == straight.server_side.method.votes.sum() == 3 * 100


def test_server_state_fdlit_cannot_save_is_refused_before_round_1(tmp_path):
    loop = loop_of(tmp_path, 1, KeepsAGenerator())
    with pytest.raises(ConfigError, match=r"^aggregator: KeepsAGenerator keeps 'noise' \(a Generator\), which fdlit "
                                          r"cannot save for a resume; give it state_dict / load_state_dict"):
        loop.fit()
    assert loop.round == 0 and loop.history == []


def test_a_part_that_saves_its_own_state_is_not_second_guessed():
    class SavesItself(KeepsAGenerator):
        def state_dict(self):
            return {"votes": self.votes, "rng": self.noise.get_state()}

    assert SavesItself().unsaved_state is None
    assert KeepsAGenerator().unsaved_state is not None
    assert CumulativeVotes().state_dict() == {"attributes": {"votes": None, "rounds_seen": 0}}


def test_the_servers_copy_of_the_global_model_is_the_last_one_it_broadcast(tmp_path):
    from fdlit.methods import FedAvg
    from fdlit.methods.fedavg import exchanged_tensors, flatten

    parser, cfg = parse_fit(args(tmp_path, "--config", "digits_fedavg.yaml", "--federation.rounds", "2",
                                 "--federation.private_epochs", "1"))
    loop = Experiment(cfg, parser).loop
    assert isinstance(loop.server_side.method, FedAvg)
    loop.fit()
    final = flatten(exchanged_tensors(loop.view.clients[0].model)).to(loop.server_side.received["parameters"])
    torch.testing.assert_close(loop.server_side.received["parameters"], final)
    torch.testing.assert_close(loop.state_dict()["received"]["parameters"], final)

"""A deployment node builds only the clients it hosts: their networks, drawn from the random state the
server recorded for each (so they are ``fit``'s networks, to the bit), and their data; no other client's
network is drawn and no other client's samples (nor the private pool) are kept. No Flower process:
the node worker is driven directly with the set-up message the server sends."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr", reason="the flower extra is not installed")

from fdlit.configuration.schema import parse_fit  # noqa: E402
from fdlit.deployment.node import NodeWorker  # noqa: E402
from fdlit.runs.experiment import Experiment  # noqa: E402

SMALL = ["--config", "digits.yaml", "--data.num_clients", "6", "--logger.mode", "disabled"]


def server_loop(tmp_path, *extra):
    parser, cfg = parse_fit([*SMALL, "--logger.run_dir", str(tmp_path / "runs"), *extra])
    experiment = Experiment(cfg, parser)
    experiment.loop.setup()  # as the ServerApp sets its loop up: every client drawn, the draws recorded
    return experiment


def node_setup(experiment, ids):
    draws = experiment.loop.draws
    worker = NodeWorker()
    meta, _ = worker.op_setup({"config": experiment.config_yaml, "clients": ids, "threads": 1},
                              {"draws": torch.stack([draws.before[i] for i in ids]), "draws_after": draws.after})
    assert meta["clients"] == ids
    return worker.loop


@pytest.mark.parametrize("extra", [[], ["--data.partition", "dirichlet", "--data.classes_per_client", "null",
                                        "--data.dirichlet_alpha", "0.5"]])
def test_a_node_builds_its_own_clients_equal_to_fit_and_nothing_of_the_others(tmp_path, extra):
    experiment = server_loop(tmp_path, *extra)
    server = experiment.loop
    node = node_setup(experiment, [2, 3])
    assert [c is None for c in node.view.clients] == [True, True, False, False, True, True]
    for i in (2, 3):  # the same networks as the server drew (fit's), parameter for parameter
        ours, theirs = node.view.clients[i].model.state_dict(), server.view.clients[i].model.state_dict()
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
        assert torch.equal(node.parts.tensors.private[i][0], server.parts.tensors.private[i][0])  # the same samples
        assert torch.equal(node.parts.tensors.private[i][1], server.parts.tensors.private[i][1])
        assert node.view.client_data[i].classes == server.view.client_data[i].classes
    for i in (0, 1, 4, 5):  # the others' classes are known (the round's facts); their samples are not here
        assert len(node.parts.tensors.private[i][0]) == 0 and len(node.view.client_data[i].train) == 0
        assert len(node.view.client_data[i].calibration) == 0
        assert node.view.client_data[i].classes == server.view.client_data[i].classes
    assert node.data.pool is None and server.data.pool is not None
    # what is drawn after the networks is drawn from the same state as in fit
    assert torch.equal(node.draws.after, server.draws.after)


def test_without_the_servers_draws_a_node_would_draw_other_networks(tmp_path):
    """The draws matter: client 3 built first from the run's seed is not fit's client 3."""
    experiment = server_loop(tmp_path)
    draws = experiment.loop.draws
    assert not torch.equal(draws.before[0], draws.before[3])
    node = node_setup(experiment, [3])
    first = next(iter(node.view.clients[3].model.state_dict().values()))
    assert torch.equal(first, next(iter(experiment.loop.view.clients[3].model.state_dict().values())))
    assert not torch.equal(first, next(iter(experiment.loop.view.clients[0].model.state_dict().values())))

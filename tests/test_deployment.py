"""fdlit deploy: a fit config as a Flower federation (fdlit.deployment).

The fast tests need no Flower process. The ``deploy`` tests start one local SuperLink and 3
SuperNodes on loopback for the whole module, run 2 rounds of sUWA, of AVG with DP and an encoding
(released on the nodes; then resumed for a third round) and of FedAvg through them and compare every
accuracy, epsilon and the analytic bytes with ``fit``; then kill one SuperNode during round 2
and check that its clients are that round's dropouts; finally that every process exited and no
port is left open. They take minutes on a busy machine: ``pytest -m "not deploy"`` skips them.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import sys
import threading
import time
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from fdlit.cli import main as cli_main
from fdlit.errors import ConfigError
from fdlit.execution import steps

flwr = pytest.importorskip("flwr", reason="the flower extra is not installed")

from fdlit.deployment.executor import NodeFailure  # noqa: E402
from fdlit.deployment.membership import assign_order  # noqa: E402
from fdlit.deployment.wire import pack, unpack, wire_bytes  # noqa: E402
from tests.deploying import FEW_EPOCHS, close, deploy_run, fit_with_one_thread, metrics_of  # noqa: E402,F401

ROUNDS = ["--federation.rounds", "2", "--federation.executor", "fdlit.execution.SequentialExecutor", *FEW_EPOCHS]


# ---------------------------------------------------------------------- no processes
def test_records_carry_tensors_exactly_and_count_their_serialised_size():
    # odd sizes before wider dtypes: each must still arrive exact (one byte array carries them all)
    tensors = {"logits": torch.randn(50, 10), "mask": torch.rand(7) > 0.5, "ids": torch.arange(5, dtype=torch.uint8),
               "half": torch.randn(3, 4).to(torch.bfloat16), "classes": torch.tensor([3], dtype=torch.int16),
               "means": torch.randn(1, 10), "scalar": torch.tensor(2.5, dtype=torch.float64)}
    content = pack({"op": "train", "ids": [1, 2]}, tensors)
    meta, back = unpack(content)
    assert meta == {"op": "train", "ids": [1, 2]}
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k], t), k
    payload = sum(t.numel() * t.element_size() for t in tensors.values())
    assert payload < wire_bytes(content) < payload + 4096  # the tensors plus Flower's framing
    # one record: the message is 3 objects (message, record dict, record), each one request per hop
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    assert len(get_all_nested_objects(content)) == 2
    # a reply whose layout does not fit its bytes (a broken or hostile node) is refused, not read past the end
    content["meta"]["json"] = json.dumps({"_layout": [["x", "float32", [1000], 0, 4000]]})
    with pytest.raises(ValueError, match="do not fit"):
        unpack(content)


def test_the_supernode_sends_a_stored_reply_at_once_and_polls_soon_after_work(monkeypatch):
    from fdlit.deployment import pace

    slept, waited = [], []
    monkeypatch.setattr(pace.time, "sleep", slept.append)

    class Event:  # records how long Flower's reply wait would wait; set: a reply is stored
        def __init__(self, stored):
            self.stored = stored

        def wait(self, seconds):
            waited.append(seconds)
            return self.stored

        def clear(self):
            self.stored = False

    clock = pace.SuperNodeClock()
    monkeypatch.setattr(pace, "REPLY_STORED", Event(True))
    clock.sleep(0.5)  # Flower's wait for a reply: ends at once when one is stored, and re-arms
    assert waited == [min(0.5, pace.POLL_S)] and not pace.REPLY_STORED.stored and slept == []
    clock.last_work = pace.time.monotonic()
    clock.sleep(3.0)  # Flower's idle poll, just after work: the shortest
    clock.last_work = pace.time.monotonic() - 60
    clock.sleep(3.0)  # after a minute idle: the longest
    assert slept == [pace.FIRST_POLL_S, pace.POLL_S] and pace.POLL_S < 3.0


def test_the_server_first_asks_for_replies_when_they_are_due(monkeypatch):
    from types import SimpleNamespace

    from fdlit.deployment import messages

    now = [0.0]
    clock = SimpleNamespace(monotonic=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    monkeypatch.setattr(messages, "time", clock)

    class LateGrid:  # node 1 answers 1 s after the request, node 2 after 3 s
        def pull_messages(self, ids):
            self.asked.append(now[0] - self.sent)
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in ids
                    if now[0] - self.sent >= {"m1": 1.0, "m2": 3.0}[i]]

    grid = LateGrid()
    link = messages.NodeLink(grid, 60.0, lambda node: [node])
    monkeypatch.setattr(link, "send", lambda op, items, live: (setattr(grid, "sent", now[0]),
                                                               [f"m{node}" for node, _, _ in items])[1])
    monkeypatch.setattr(link, "take", lambda op, node, reply, tolerate: ({}, {}))
    step = {1: ({"ids": [0, 1], "epochs": 5}, {}), 2: ({"ids": [2], "epochs": 5}, {})}
    asked = []
    for per_node in (step, step, {1: ({"ids": [0, 1], "epochs": 20}, {}), 2: ({"ids": [2], "epochs": 20}, {})}):
        grid.asked = []
        link.request("step", per_node, live=[])
        asked.append(grid.asked)
    first, like, other = asked
    assert first[0] < 0.05 and other[0] < 0.05  # nothing known of such a request: asked at once
    assert 20 < len(first) < 3.0 / messages.POLL_S[1]  # overdue: asked every 20 ms, up to 5 % of the time waited
    assert len(like) < len(first) / 2  # a like request: asked when each node is due
    assert like[0] >= messages.DUE_SHARE * 1.0 and not any(1.1 < t < messages.DUE_SHARE * 3.0 for t in like)
    assert all(a[-1] >= 3.0 for a in asked) and link.round_metrics([1, 2])["comm/pulls"] == sum(map(len, asked))


def test_nodes_take_clients_by_partition_id_else_by_node_id():
    hello = {30: ({"partition_id": 1}, {}), 10: ({"partition_id": 0}, {}), 20: ({"partition_id": 2}, {})}
    assert assign_order(hello) == [10, 30, 20]
    assert assign_order({30: ({"partition_id": None}, {}), 10: ({"partition_id": None}, {})}) == [10, 30]
    with pytest.raises(NodeFailure, match="partition-id"):
        assign_order({1: ({"partition_id": 0}, {}), 2: ({"partition_id": 0}, {})})


def test_without_flwr_fdlit_says_how_to_install_it(monkeypatch):
    from fdlit.deployment import import_flwr

    monkeypatch.setitem(sys.modules, "flwr", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[flower\]'"):
        import_flwr()


def test_bad_input_is_refused_before_any_process_starts(tmp_path, capsys, monkeypatch):
    import fdlit.deployment.launcher as launcher

    monkeypatch.setattr(launcher.LocalDeployment, "start", lambda self: pytest.fail("a process was started"))
    assert cli_main(["deploy", "--nodes", "0", "--config", "digits.yaml"]) != 0
    assert "--nodes" in capsys.readouterr().err
    assert cli_main(["deploy", "--config", "digits.yaml", "--federation.rounds", "0",
                     "--logger.run_dir", str(tmp_path)]) != 0
    assert "federation.rounds" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        from fdlit.deployment.command import main

        main(None, ["--nodes", "-1", "--config", "digits.yaml"])


def test_an_unreachable_client_has_no_accuracy_and_the_means_leave_it_out():
    from fdlit.federation.evaluation import Evaluation
    from fdlit.federation.measurement import accuracy_metrics

    y = torch.tensor([0, 1, 1, 0])
    logits = torch.stack([torch.nn.functional.one_hot(y, 2).float(), torch.full((4, 2), math.nan),
                          torch.nn.functional.one_hot(1 - y, 2).float()])
    from fdlit.execution.executor import ClientExecutor

    class Unreachable(ClientExecutor):  # client 1's node is gone: NaN logits
        def predict(self, clients, x):
            return logits

    evaluate = Evaluation(lambda x, y, rows=None, ids=None: steps.correct(Unreachable(), [None] * 3, x, y, rows),
                          (torch.zeros(4, 1), y), torch.ones(3, 4), (None, None))
    accs = evaluate()
    assert accs["global_acc"][0] == 1 and math.isnan(accs["global_acc"][1]) and accs["global_acc"][2] == 0
    metrics = accuracy_metrics(accs, None, False)
    assert metrics["after_private/global_acc_mean"] == 0.5 and metrics["after_private/global_acc_min"] == 0


def test_deploy_prints_the_summary_of_a_run_without_teacher(tmp_path, monkeypatch, capsys):
    """FedAvg's summary has NaN teacher accuracy, which summary.json holds as null."""
    import fdlit.deployment.command as command
    import fdlit.deployment.launcher as launcher

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    summary = {"run": "fedavg-k2-seed0", "run_dir": str(run_dir), "rounds": 2, "final_round": 2, "finished": True,
               "best_global_acc_mean": 0.8, "best_round": 2, "best_global_acc_mean_after_private": 0.2,
               "best_round_after_private": 1, "final_local_acc_mean_after_private": 0.9,
               "final_local_acc_mean_after_public": 0.8, "final_teacher_acc": None, "bytes_up_total": 10,
               "bytes_down_total": 10, "wall_time_s": 1.0}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    monkeypatch.setattr(launcher.LocalDeployment, "start", lambda self: setattr(self, "address", "127.0.0.1:1"))
    monkeypatch.setattr(launcher.LocalDeployment, "stop", lambda self: None)
    monkeypatch.setattr(command, "run_on", lambda *a: {"status": "done", "run_dir": str(run_dir)})
    options = Namespace(work_dir=str(tmp_path / "work"), superlink=None, nodes=2)
    assert command.run(options, []) == 0
    assert "fedavg-k2-seed0" in capsys.readouterr().out


def test_a_node_reads_the_dataset_from_its_own_data_dir(tmp_path):
    """--node-config "data-dir=..." replaces the server's data.data_dir on that node only."""
    from paper_fixtures import idx_folder

    from fdlit.configuration.schema import parse_fit
    from fdlit.deployment.node import NodeWorker
    from fdlit.runs.experiment import Experiment

    here = tmp_path / "node-files"
    idx_folder(here, n_train=300, n_test=40)
    small = ["--data.num_clients", "4", "--data.classes_per_client", "5", "--data.samples_per_client", "20", "--data.public_size", "60",
             "--data.validation_size", "30", "--logger.mode", "disabled", "--logger.run_dir", str(tmp_path / "runs")]
    parser, cfg = parse_fit(["--config", "fashion_mnist.yaml", "--data.data_dir", str(tmp_path / "server-only"), *small])
    config = Experiment(cfg, parser).config_yaml  # what the ServerApp sends every node
    # the random state each client's network is drawn from, as the server records it at its set-up
    parser, cfg = parse_fit(["--config", "fashion_mnist.yaml", "--data.data_dir", str(here), *small])
    server = Experiment(cfg, parser).loop
    server.setup()
    draws = {"draws": torch.stack([server.draws.before[i] for i in (0, 1)]), "draws_after": server.draws.after}
    worker = NodeWorker()
    with pytest.raises(Exception, match="server-only"):  # the server's path does not exist on this node
        worker.op_setup({"config": config, "clients": [0, 1], "threads": 1}, draws)
    worker.node_config = {"data-dir": str(here)}
    meta, _ = worker.op_setup({"config": config, "clients": [0, 1], "threads": 1}, draws)
    assert meta == {"clients": [0, 1]} and worker.loop.data.data_dir == str(here)
    assert len(worker.loop.view.clients) == 4 and worker.loop.data.num_classes == 10
    assert [c is None for c in worker.loop.view.clients] == [False, False, True, True]  # only its own are built


# ---------------------------------------------------------------------- a real deployment
def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:  # its command line, or its environment (FLWR_HOME: every Flower process started here)
                seen = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if text.encode() in seen and state != "Z":
                found.append(int(proc.name))
    return found


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    from fdlit.deployment.launcher import LocalDeployment, flower_env

    work = tmp_path_factory.mktemp("deploy")
    dep = LocalDeployment(3, work)
    dep.start()
    ports = [int(dep.address.rsplit(":", 1)[1])]
    yield Namespace(dep=dep, work=work, env=flower_env(work))
    dep.stop()
    # every process exited (SuperLink, SuperNodes, SuperExecs, ServerApp, ClientApps, node workers)
    assert all(p.returncode is not None for p in dep.processes)
    deadline = time.monotonic() + 10
    while processes_mentioning(str(work)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(work)) == []
    assert not any(listening(p) for p in ports)


@pytest.mark.deploy
# sUWA (the default); AVG with the privacy study's release (DP noise, top-2 encoding), made on the
# nodes, then resumed; FedAvg's parameter exchange
@pytest.mark.parametrize("config", ["digits.yaml", "digits_dp.yaml", "digits_fedavg.yaml"])
def test_a_deployed_run_equals_fit(deployment, config, tmp_path, capsys):
    args = ["--config", config, *ROUNDS]
    outcome = deploy_run(deployment, [*args, "--logger.run_dir", str(tmp_path / "deployed")])
    assert outcome["status"] == "done", outcome
    shown = capsys.readouterr().err  # the rounds as the ServerApp ends them, as fit prints them
    assert [line.split(":")[0] for line in shown.splitlines() if line.startswith("round ")] == ["round 1/2", "round 2/2"]
    fit_with_one_thread([*args, "--logger.run_dir", str(tmp_path / "fit")])
    deployed = metrics_of(Path(outcome["run_dir"]))
    fitted = metrics_of(next((tmp_path / "fit").iterdir()))
    assert len(deployed) == len(fitted) == 2
    for d, f in zip(deployed, fitted, strict=True):
        for key, value in f.items():  # accuracies, losses, teacher, weights, analytic bytes, ...: all but times
            if not key.startswith("time/"):
                assert close(d[key], value), key
        assert d["comm/up_bytes"] == f["comm/up_bytes"] > 0 and d["comm/down_bytes"] == f["comm/down_bytes"] > 0
        # the real messages: every request and reply as Flower serialised it
        assert d["comm/wire_up_bytes"] > 0 and d["comm/wire_down_bytes"] > 0
        assert d["time/nodes_cpu_s"] > 0
        # the uploads' arrays as they arrived from the nodes are what the ledger counts (released there: with
        # the privacy section, top-2 probabilities a row, not 10 logits); two exchanges a round
        # (round 1 also holds the set-up: hello, the nodes' federation, a method's round 0; FedAvg's
        # last round: its step, then the closing request that loads and measures the global model)
        if d["round"] > 1:
            assert d["comm/wire_upload_bytes"] == d["comm/up_bytes"] and d["comm/exchanges"] == 2
    summary = json.loads((Path(outcome["run_dir"]) / "summary.json").read_text())
    assert summary["rounds"] == summary["final_round"] == 2 and summary["finished"]
    if config != "digits_dp.yaml":
        return
    # deploy --resume: the nodes get the checkpoint's client states, the server its accountant; round 3
    # is a 3-round fit's round 3 (accuracies, epsilon, bytes)
    resumed = deploy_run(deployment, ["--federation.rounds", "3"], resume=outcome["run_dir"])
    assert resumed["status"] == "done" and resumed["run_dir"] == outcome["run_dir"], resumed
    fit_with_one_thread([*args, "--federation.rounds", "3", "--logger.run_dir", str(tmp_path / "fit3")])
    deployed, fitted = metrics_of(Path(outcome["run_dir"])), metrics_of(next((tmp_path / "fit3").iterdir()))
    assert [d["round"] for d in deployed] == [1, 2, 3]
    for key, value in fitted[2].items():
        if not key.startswith("time/"):
            assert close(deployed[2][key], value), key
    assert deployed[2]["privacy/epsilon"] > deployed[1]["privacy/epsilon"]


@pytest.mark.deploy
def test_a_killed_serverapp_resumes_from_the_nodes_own_checkpoints_as_an_uninterrupted_run(deployment, tmp_path):
    runs = tmp_path / "runs"
    args = ["--config", "digits_fedavg.yaml", *ROUNDS, "--federation.rounds", "6"]
    killed = []

    def kill_the_serverapp_after_round_3():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            done = [metrics_of(p.parent) for p in runs.glob("*/checkpoint.pt")]
            if done and len(done[0]) >= 3:  # round 3 ended (round 2's checkpoint is written): the ServerApp dies
                for pid in processes_mentioning(str(deployment.work)):
                    if b"serverapp" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_serverapp_after_round_3, daemon=True)
    killer.start()
    outcome = deploy_run(deployment, [*args, "--logger.run_dir", str(runs)], timeout=60)
    killer.join(1)
    assert killed and outcome["status"] == "failed", outcome
    run_dir = next(runs.iterdir())
    from fdlit.runs.checkpoint import load_checkpoint

    state = load_checkpoint(run_dir / "checkpoint.pt")
    saved = state["loop"]["round"]
    assert 2 <= saved < 6  # the last checkpoint the server completed (written while the next round runs)
    # the server's checkpoint names the round each client's node saved; the states are on the nodes' disks
    assert all(s == {"node_checkpoint": {"key": s["node_checkpoint"]["key"], "round": saved}}
               for s in state["loop"]["clients"])
    resumed = deploy_run(deployment, [], resume=str(run_dir))
    assert resumed["status"] == "done", resumed
    fit_with_one_thread([*args, "--logger.run_dir", str(tmp_path / "fit")])
    deployed, fitted = metrics_of(run_dir), metrics_of(next((tmp_path / "fit").iterdir()))
    assert [d["round"] for d in deployed] == list(range(1, 7))
    for d, f in zip(deployed[saved:], fitted[saved:], strict=True):
        for key, value in f.items():
            if not key.startswith("time/"):
                assert close(d[key], value), (d["round"], key)
    # a checkpointed round before the last moves no client state up: besides the uploads, a few KB
    assert all(d["comm/wire_up_bytes"] - d["comm/wire_upload_bytes"] < 50_000 for d in deployed[saved:-1])
    assert deployed[-1]["comm/wire_up_bytes"] - deployed[-1]["comm/wire_upload_bytes"] > 500_000  # the last: states


@pytest.mark.deploy
def test_an_offline_deployed_run_is_linked_for_wandb_sync_and_the_hint_names_it(deployment, tmp_path, monkeypatch):
    """As with fit: the ServerApp (in Flower's work folder) links the offline W&B folder into the deploy
    command's W&B folder, and the outcome carries the sync command the deploy command prints."""
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    args = ["--config", "digits.yaml", *FEW_EPOCHS, "--federation.rounds", "1", "--logger.mode", "offline",
            "--logger.run_dir", str(tmp_path / "runs")]
    outcome = deploy_run(deployment, args)
    assert outcome["status"] == "done", outcome
    run_dir = Path(outcome["run_dir"])
    offline = next((run_dir / "wandb").glob("offline-run-*"))
    links = list((tmp_path / "wandb").glob("offline-run-*"))
    assert [link.resolve() for link in links] == [offline.resolve()]
    assert outcome["wandb_sync"].startswith("wandb sync ") and str(run_dir) in outcome["wandb_sync"]


@pytest.mark.deploy
def test_the_repository_is_a_flower_app_that_flwr_run_submits(deployment, tmp_path):
    """``flwr run . <connection>`` from the repository (its pyproject's [tool.flwr.app]) runs a digits
    federation on a running SuperLink, equal to ``fit``; the FAB carries fdlit and its configs only."""
    import subprocess

    from fdlit.deployment.launcher import CONNECTION, flower_bin, wait_for_result, write_connection

    repository = Path(__file__).resolve().parent.parent
    write_connection(deployment.env, deployment.dep.address, None)
    args = ["--config", "digits.yaml", *ROUNDS, "--logger.run_dir", str(tmp_path / "flwr-run")]
    result = tmp_path / "result.json"
    run_config = f"fit-args='{json.dumps(args)}' result-file='{result}' nodes=3 threads=1"
    done = subprocess.run([flower_bin("flwr"), "run", ".", CONNECTION, "--run-config", run_config, "--format", "json"],
                          env=deployment.env, cwd=repository, capture_output=True, text=True, timeout=300)
    reply = json.loads(done.stdout)
    assert reply.get("success") and reply["fab-id"] == "fdlit/fdlit", done.stdout + done.stderr
    outcome = wait_for_result(result, int(reply["run-id"]), deployment.env, 600)
    assert outcome["status"] == "done", outcome
    app = next((Path(deployment.env["FLWR_HOME"]) / "apps").glob(f"fdlit.fdlit.*{reply['fab-hash']}*"))
    assert (app / "fdlit" / "deployment" / "server_app.py").exists() and (app / "configs" / "digits.yaml").exists()
    assert not (app / "tests").exists() and not (app / "docs").exists()
    fit_with_one_thread([*args[:-1], str(tmp_path / "fit")])
    deployed, fitted = metrics_of(Path(outcome["run_dir"])), metrics_of(next((tmp_path / "fit").iterdir()))
    assert len(deployed) == len(fitted) == 2
    for d, f in zip(deployed, fitted, strict=True):
        for key, value in f.items():
            if not key.startswith("time/"):
                assert close(d[key], value), key


@pytest.mark.deploy
def test_a_supernode_killed_in_round_2_is_a_dropout_and_its_successor_rejoins(deployment, tmp_path):
    runs = tmp_path / "runs"
    node = deployment.dep.supernode(2)

    def kill_after_round_1_and_restart():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            checkpoints = list(runs.glob("*/checkpoint.pt"))
            if checkpoints:  # round 1 is done and saved: round 2 begins
                os.killpg(node.pid, signal.SIGKILL)
                deployment.dep.restart_supernode(2)  # the same partition on a new SuperNode
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_after_round_1_and_restart, daemon=True)
    killer.start()
    outcome = deploy_run(deployment, ["--config", "digits.yaml", *ROUNDS, "--federation.rounds", "3",
                                      "--logger.run_dir", str(runs)], timeout=30)  # the lost node's round waits this long
    killer.join(1)
    assert outcome["status"] == "done", outcome
    first, second, third = metrics_of(Path(outcome["run_dir"]))
    # round 3: the new SuperNode took the lost node's clients over, from the round-1 checkpoint's states
    assert "participation/dropped_count" not in third  # nobody dropped
    rows = [json.loads(line) for line in (Path(outcome["run_dir"]) / "communication.jsonl").read_text().splitlines()]
    assert {r["client"] for r in rows if r["round"] == 3 and r["direction"] == "up"} == set(range(20))
    assert all(isinstance(a, float) for a in third["clients/after_public/global_acc"])
    lost = list(range(14, 20))  # 20 clients on 3 nodes: the third holds 14..19
    assert "participation/dropped_count" not in first
    assert second["participation/dropped_count"] == len(lost)
    assert sorted(second["participation/arrived"]) == list(range(14))
    accs = second["clients/after_public/global_acc"]  # no accuracy (NaN, null in the JSON) for the lost clients
    assert all(accs[i] is None for i in lost) and all(isinstance(accs[i], float) for i in range(14))
    assert math.isfinite(second["after_public/global_acc_mean"])


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 / localhost signed by it (PEM): Flower's TLS needs no more."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid = {"not_valid_before": now - datetime.timedelta(days=1), "not_valid_after": now + datetime.timedelta(days=2)}

    def certificate(name: str, key, issuer_name, issuer_key, ca: bool, san=None):
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                   .issuer_name(issuer_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(valid["not_valid_before"]).not_valid_after(valid["not_valid_after"])
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    folder.mkdir(parents=True, exist_ok=True)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fdlit test CA")])
    ca = certificate("fdlit test CA", ca_key, ca_name, ca_key, True)
    server = certificate("127.0.0.1", key, ca_name, ca_key, False,
                         [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    paths = folder / "ca.crt", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@pytest.mark.deploy
def test_tls_and_node_authentication_admit_registered_nodes_only(tmp_path):
    """Every connection over TLS (the SuperLink with its certificate, the SuperNodes and `flwr run`
    with the CA's) and SuperNode authentication (each node's EC key registered with the SuperLink):
    one round of FedAvg on the 2 registered nodes completes; a SuperNode with an unregistered key is
    refused, and `flwr run` without the CA starts nothing."""
    from fdlit.deployment.command import run_on
    from fdlit.deployment.launcher import LocalDeployment, flower_bin, flower_env

    certificates = make_certificates(tmp_path / "certs")
    dep = LocalDeployment(2, tmp_path / "tls", certificates=certificates, authenticate=True)
    try:
        dep.start()
        env = flower_env(dep.work)
        stranger = dep.node_key(7)  # a key never registered
        dep._spawn([flower_bin("flower-supernode"), "--root-certificates", str(certificates[0]),
                    "--auth-supernode-private-key", str(stranger), "--superlink", dep.address],
                   env, dep.work / "logs" / "stranger.log")
        assert dep.processes[-1].wait(timeout=120) != 0
        assert "Failed to activate SuperNode" in (dep.work / "logs" / "stranger.log").read_text()
        options = Namespace(nodes=2, timeout=120.0, node_wait=120.0, run_timeout=600.0, threads=1,
                            root_certificates=str(certificates[0]))
        args = ["--config", str(Path("configs/digits_fedavg.yaml").resolve()), *ROUNDS, "--federation.rounds", "1",
                "--data.num_clients", "6", f"--logger.run_dir={tmp_path / 'runs'}"]
        outcome = run_on(dep.address, dep.work, env, options, args)
        assert outcome["status"] == "done", outcome
        assert len(metrics_of(Path(outcome["run_dir"]))) == 1
        with pytest.raises(RuntimeError, match="flwr run failed"):  # no CA given: plain text, refused
            run_on(dep.address, dep.work, env, Namespace(**{**vars(options), "root_certificates": None}), args)
    finally:
        dep.stop()
    assert all(p.returncode is not None for p in dep.processes)

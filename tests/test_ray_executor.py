"""The Ray executor: same metrics as the sequential executor, resource planning, the CLI knob.

One local Ray (2 CPUs) for the whole module; every federation here is tiny.
"""

import importlib.util
import sys

import numpy as np
import pytest
import torch

from fdlit.callbacks import FederationCallback
from fdlit.configuration.schema import parse_fit
from fdlit.data import FederatedData
from fdlit.errors import ConfigError
from fdlit.execution import RayExecutor, SequentialExecutor, VectorizedExecutor
from fdlit.execution import ray_executor as ray_executor_module
from fdlit.execution.ray_executor import plan_actors
from fdlit.federation import FederationLoop
from fdlit.methods import SmoothedUncertaintyWeighted
from fdlit.methods.base import ClientPart
from fdlit.runs.experiment import Experiment


class NoisyLogitsClient(ClientPart):
    """A client part defined outside fdlit: sUWA's upload, with the logits replaced and a statistic
    added (runs in the actor; pickled by value)."""

    def __init__(self, inner: ClientPart):
        self.inner = inner

    def upload(self, ctx):
        g = torch.Generator().manual_seed(1000 * ctx.info.round + ctx.client.client_id)
        noise = 0.01 * torch.randn(ctx.public_logits.shape, generator=g).to(ctx.public_logits.device)
        return {**self.inner.upload(ctx), "logits": ctx.public_logits + noise,
                "n_calibration": torch.tensor([float(len(ctx.data.calibration))])}


class NoisyLogits(SmoothedUncertaintyWeighted):
    """A method defined outside fdlit whose client part is :class:`NoisyLogitsClient` (whose extra
    statistic it declares: a client sends only declared arrays)."""

    @property
    def released(self):
        return {**super().released, "n_calibration": "unbounded"}

    def client_part(self):
        return NoisyLogitsClient(super().client_part())


def tiny_loop(tmp_path, executor, callbacks=(), aggregator=None, **kwargs):
    return FederationLoop(
        rounds=2, private_epochs_first=2, private_epochs=1, public_epochs_first=1, public_epochs=1,
        executor=executor, callbacks=list(callbacks),
        data=FederatedData(num_clients=4, classes_per_client=3, public_size=200),
        model={"class_path": "fdlit.models.MLP", "init_args": {"hidden": [32]}},
        aggregator=aggregator or SmoothedUncertaintyWeighted(tau=0.25),
        seed=3, **kwargs,
    )


def comparable(history):
    return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in history]


class StateRoundTrip(FederationCallback):
    """After round 1 (driver side): fetch the actors' clients, push altered ones, check the actors
    use them, push the originals back. The run must still match the sequential one afterwards."""

    checked = False

    def on_round_end(self, view, round, metrics):
        import ray

        import fdlit

        executor = view.executor
        if round != 1 or not isinstance(executor, RayExecutor):
            return
        x = view.client_data[0].train.x[:64]
        where = ray.get([a.where.remote() for a in executor.actors])
        assert {w["fdlit"] for w in where} == {fdlit.__file__}  # actors run this checkout
        assert {w["threads"] for w in where} == {1}
        trained = executor.predict(view.clients, x)
        initial = torch.stack([c.predict_logits(x) for c in view.clients])
        assert not torch.equal(trained, initial)  # the driver's copies were not trained ...
        states = executor.fetch_states(view.clients)
        assert torch.equal(torch.stack([c.predict_logits(x) for c in view.clients]), trained)  # ... now fetched
        for p in view.clients[0].model.parameters():
            torch.nn.init.zeros_(p)
        executor.push_states(view.clients)
        assert torch.equal(executor.predict(view.clients, x)[0], torch.zeros_like(trained[0]))
        view.clients[0].load_client_state(states[0])
        executor.push_states(view.clients)
        self.checked = True


def fit_with_one_thread(loop):
    """Fit in-process with the actors' thread count (1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loop.fit()
    finally:
        torch.set_num_threads(threads)
    return loop


def test_ray_reproduces_sequential_metrics_and_final_state(tmp_path, ray_local):
    # sUWA fits its mixtures in the actors; NoisyLogits (defined here, pickled by value) replaces logits
    # exact parity holds for equal thread counts (reductions split by thread): actors run 1 thread,
    # so the reference does too, whatever the machine's default (CI: 2)
    seq = fit_with_one_thread(tiny_loop(tmp_path / "seq", SequentialExecutor(), aggregator=NoisyLogits(tau=0.25)))
    # Ray is up: 2 CPUs -> 2 actors of 2 clients, each running its clients one at a time
    executor, round_trip = RayExecutor(actor_executor="sequential"), StateRoundTrip()
    ray_loop = tiny_loop(tmp_path / "ray", executor, [round_trip], aggregator=NoisyLogits(tau=0.25))
    ray_loop.fit()
    assert executor.plan == (2, 2, 0.0) and round_trip.checked
    for m in ray_loop.history:  # the actors' CPU, per actor and round (round 1 includes their start-up)
        assert len(m["time/actor_cpu_s"]) == 2 and min(m["time/actor_cpu_s"]) > 0
        assert m["time/actors_cpu_s"] == pytest.approx(sum(m["time/actor_cpu_s"]))
    assert comparable(ray_loop.history) == comparable(seq.history)  # exact, every metric but time/*
    assert ray_loop.history[-1]["density/log_likelihood_mean"] == seq.history[-1]["density/log_likelihood_mean"]
    rows = [[(m.round, m.client, m.direction, m.kind, m.shape, m.bytes) for m in run.server_side.ledger.messages]
            for run in (ray_loop, seq)]
    assert rows[0] == rows[1]
    # teardown handed the actors' final clients back to the driver: weights, Adam state, generators
    for a, b in zip(seq.view.clients, ray_loop.view.clients, strict=True):
        sa, sb = a.client_state(), b.client_state()
        assert all(torch.equal(sa["model"][k], sb["model"][k]) for k in sa["model"])
        assert torch.equal(sa["generator"], sb["generator"])
        assert sa["optimizer"]["state"][0]["step"] == sb["optimizer"]["state"][0]["step"]
    assert not executor.actors and ray_local.is_initialized()  # actors freed; a Ray it did not start stays up

    # the default: each actor trains its clients together (VectorizedExecutor): same run within float noise
    vec = fit_with_one_thread(tiny_loop(tmp_path / "vec", VectorizedExecutor(), aggregator=NoisyLogits(tau=0.25)))
    executor = RayExecutor()
    ray_vec = tiny_loop(tmp_path / "ray-vec", executor, [StateRoundTrip()], aggregator=NoisyLogits(tau=0.25))
    ray_vec.fit()
    assert executor.actor_executor == "vectorized"
    # the same vectorized code, but stacks of 2 clients per actor against one of 4: vmapped matmuls
    # over different batch counts may round differently in the last bit
    for a, b in zip(comparable(ray_vec.history), comparable(vec.history), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert np.asarray(a[key], dtype=float) == pytest.approx(
                np.asarray(b[key], dtype=float), rel=1e-5, abs=1e-6, nan_ok=True), key
    for a, b in zip(ray_vec.history, seq.history, strict=True):
        assert a["after_public/global_acc_mean"] == pytest.approx(b["after_public/global_acc_mean"], abs=0.02)


def test_plan_groups_clients_and_fractional_gpus():
    assert plan_actors(4, 2, 0) == (2, 2, 0.0)
    assert plan_actors(5, 2, 0) == (3, 2, 0.0)
    assert plan_actors(100, 16, 4, num_gpus_per_client=0.02) == (7, 15, 0.14)
    # 15 actors of 0.28 GPU do not pack into 4 GPUs (3 per GPU): fewer, larger actors, 1 per GPU
    assert plan_actors(100, 16, 4, num_gpus_per_client=0.04) == (25, 4, 1.0)
    assert plan_actors(8, 64, 2, num_gpus_per_client=0.25) == (1, 8, 0.25)  # 4 actors per GPU
    assert plan_actors(8, 2, 2, num_gpus_per_client=0.25) == (4, 2, 1.0)  # 2 CPUs: 2 actors of 4 clients
    assert plan_actors(100, 16, 4, num_gpus_per_actor=0.25) == (7, 15, 0.25)
    assert plan_actors(4, 8, 0, clients_per_actor=1) == (1, 4, 0.0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_clients=4, cluster_cpus=2, cluster_gpus=0, clients_per_actor=1), "into actors of 1 fits"),
    (dict(num_clients=100, cluster_cpus=64, cluster_gpus=4, num_gpus_per_client=0.25), "0.25 GPU per client"),
    (dict(num_clients=8, cluster_cpus=2, cluster_gpus=8, num_gpus_per_client=0.3, clients_per_actor=4), "fractions <= 1"),
    (dict(num_clients=8, cluster_cpus=2, cluster_gpus=8, num_gpus_per_client=0.3, num_gpus_per_actor=1), "not both"),
])
def test_plans_the_cluster_cannot_hold_fail_before_starting(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        plan_actors(**kwargs)


def test_a_plan_the_running_ray_cannot_hold_stops_before_any_actor(tmp_path, ray_local):
    executor = RayExecutor(clients_per_actor=1)  # 4 actors of 1 CPU on a 2-CPU Ray
    with pytest.raises(ConfigError, match="into actors of 1 fits the Ray cluster"):
        tiny_loop(tmp_path, executor).fit()
    assert not executor.actors and ray_local.is_initialized()  # a Ray it did not start stays up


def test_cli_knob_selects_the_ray_executor(fast_args):
    parser, cfg = parse_fit(fast_args + [
        "--federation.executor", "fdlit.execution.RayExecutor",
        "--federation.executor.num_gpus_per_client", "0.25", "--federation.executor.address", "auto",
        "--federation.executor.clients_per_actor", "2",
    ])
    experiment = Experiment(cfg, parser)
    loop = experiment.loop
    assert isinstance(loop.settings.executor, RayExecutor)
    ray = loop.settings.executor
    assert (ray.address, ray.num_gpus_per_client, ray.clients_per_actor) == ("auto", 0.25, 2)


def test_missing_ray_names_the_package_and_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    # the module imports without ray: run its top level again in a fresh module object
    spec = importlib.util.spec_from_file_location("ray_executor_without_ray", ray_executor_module.__file__)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    executor = RayExecutor()  # constructing (and importing fdlit) needs no ray
    with pytest.raises(ImportError, match=r"needs the 'ray' package.*pip install"):
        executor.setup(None, [])


class ShippedParts(RayExecutor):
    """A RayExecutor that keeps, pickled, every client part (and upload release) it sends to the actors,
    and the inputs the driver predicts on."""

    shipped: list
    predicted: list

    def _on_actors(self, hook, part, info, clients, client_data, received, release):
        import ray

        self.shipped.append((hook, ray.cloudpickle.dumps(part), ray.cloudpickle.dumps(release)))
        return super()._on_actors(hook, part, info, clients, client_data, received, release)

    def predict(self, clients, x):
        self.predicted.append(x)
        return super().predict(clients, x)


def server_state_in(obj, seen=None) -> list[str]:
    """Names of tensors, networks and known server fields reachable from obj's attributes."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, (torch.Tensor, torch.nn.Module)):
        return [type(obj).__name__]
    found = []
    for name, value in (vars(obj).items() if hasattr(obj, "__dict__") else []):
        if name in ("control", "net", "counts", "regional", "global_model", "log_odds"):
            found.append(name)
        found += [f"{name}.{inner}" for inner in server_state_in(value, seen)]
    return found


@pytest.mark.parametrize("method", ["scaffold", "feddf"])
def test_actors_get_the_client_part_only_never_the_server_state(tmp_path, ray_local, method):
    from fdlit.clients import ClientOptimization
    from fdlit.methods import FedDF, Scaffold

    executor = ShippedParts(actor_executor="sequential")
    executor.shipped, executor.predicted = [], []
    loop = FederationLoop(
        rounds=2, private_epochs_first=1, private_epochs=1, executor=executor,
        data=FederatedData(num_clients=4, classes_per_client=3, public_size=120),
        model={"class_path": "fdlit.models.MLP", "init_args": {"hidden": [16]}},
        client=ClientOptimization(optimizer="sgd", lr=0.05),
        aggregator=Scaffold() if method == "scaffold" else FedDF(epochs=1), seed=3,
    )
    loop.fit()
    server = loop.server_side.method
    assert server.counts is not None  # the server holds state: n_k, and c or its distillation network
    assert server.control is not None if method == "scaffold" else server.net is not None
    hooks = [hook for hook, _, _ in executor.shipped]
    assert hooks[:2] == ["setup", "receive"] and hooks.count("upload") == 2  # set-up, then 2 rounds
    import ray

    for hook, blob, _ in executor.shipped:
        part = ray.cloudpickle.loads(blob)
        assert type(part).__name__ == ("ScaffoldClient" if method == "scaffold" else "FedAvgClient")
        assert server_state_in(part) == [], (hook, server_state_in(part))
        assert len(blob) < 2_000  # settings only; the server's state is far larger
    assert len(ray.cloudpickle.dumps(server)) > 10 * max(len(b) for _, b, _ in executor.shipped)


def test_the_dp_release_is_made_on_the_actors_and_equals_the_in_process_one(tmp_path, ray_local):
    """Clipping, noise and the encoding run where the client lives: the driver never predicts on the
    public set, what reaches the server is already encoded, and the actors got the release settings
    (never the method); the metrics equal an in-process run's."""
    import ray

    from fdlit.methods import ProbabilityAveraging
    from fdlit.privacy import UploadPrivacy
    from fdlit.privacy.client_release import ClientRelease

    def private():
        return UploadPrivacy(noise_multiplier=0.1, clip_norm=5.0, encoding="top_k", top_k=2)

    executor = ShippedParts(actor_executor="sequential")
    executor.shipped, executor.predicted = [], []
    loop = tiny_loop(tmp_path / "ray", executor, aggregator=ProbabilityAveraging(), privacy=private())
    received, receive = [], loop.privacy.receive
    loop.privacy.receive = lambda at, messages: (received.append(messages), receive(at, messages))[1]
    fit_with_one_thread(loop)
    assert executor.predicted and all(x is not loop.parts.tensors.public_x for x in executor.predicted)  # evaluation only
    assert len(received) == 2 and all(set(m) == {"topk_values", "topk_indices"} and "privacy/noise_std" in m.metrics
                                     for ms in received for m in ms)
    releases = [ray.cloudpickle.loads(r) for hook, _, r in executor.shipped if hook == "upload"]
    assert len(releases) == 2 and all(type(r) is ClientRelease and r.noise_multiplier == 0.1 for r in releases)
    seq = fit_with_one_thread(tiny_loop(tmp_path / "seq", SequentialExecutor(), aggregator=ProbabilityAveraging(),
                                        privacy=private()))
    assert comparable(loop.history) == comparable(seq.history)
    assert loop.history[-1]["privacy/epsilon"] > 0

"""The node worker: one long-lived process per SuperNode and run that holds the node's clients.

Flower starts a fresh ClientApp process for every message; rebuilding torch, the data and the
clients each time would cost seconds per message, so the ClientApp only relays the message's
records to this worker over a local socket, and the worker keeps its clients (modules, optimizers,
generators, the method's client state) in memory between messages, as a Ray actor does.

The worker builds the clients it hosts, and only those, from the config the server sends at set-up
(same seed: the same split as ``fit``, of which it keeps its clients' samples) and from the random
state the server recorded before each of their networks (fit draws them from the global stream in
client order): they are fit's networks, and no other client's is drawn. A node with its own data
(``local-data``) gets the shared sets from the server and reads no dataset. Private data is never sent: train
and hook requests name a client's private split, the public and the test set; only tensors the
server made (the teacher, a public subset, a broadcast) travel, each once per node.

It exits after the run's ``teardown``, when the SuperNode (or the process that launched the
ClientApp) is gone, or after ``idle_timeout_s`` without a message.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fdlit.deployment.processes import alive, peak_rss_bytes
from fdlit.deployment.secure_node import NodeSecureAggregation
from fdlit.deployment.wire import from_bytes, pack, to_bytes, unpack
from fdlit.execution import steps

if TYPE_CHECKING:
    from fdlit.configuration.code_allowlist import CodeAllowlist
    from fdlit.federation.client_side import ClientSide


def node_allowlist(allowed: str) -> CodeAllowlist:
    """The code a node's runs may name: the classes of fdlit's a received config may construct
    (:mod:`fdlit.configuration.constructible`) and its operator's ``allowed-classes`` (``--node-config
    "allowed-classes='mylab.,torch.optim.'"``: comma-separated prefixes of dotted names)."""
    from fdlit.configuration.code_allowlist import CodeAllowlist

    prefixes = [p for p in str(allowed).split(",") if p.strip()]
    return CodeAllowlist(prefixes, "the run names {names} ({key} in {file}; {name} {what}); this node constructs "
                         "fdlit's methods, models, executors, attacks, clients and callbacks and names starting with "
                         f"{[p.strip() for p in prefixes]} (its operator adds prefixes to allowed-classes to accept "
                         "more)", on_node=True)


def check_class_paths(config_yaml: str, allowed: str, folder: Path | None = None) -> Path:
    """A node builds what the run's config names, so whoever submits a run chooses the code its node
    runs: the config (``config_yaml`` as the node received it, written to ``folder``/config.yaml) is
    refused before anything of it is imported when it names code outside the node's allow-list, in any
    spelling (:mod:`fdlit.configuration.code_allowlist`), or names a file of the node's machine (a ``config:`` list, a
    section given as a path: the server sends the config resolved, so a node never reads its own files
    for it). The file written back (``folder`` None: a temporary folder, removed again)."""
    from fdlit.configuration.bounded_yaml import check_text
    from fdlit.configuration.code_allowlist import check_config_files
    from fdlit.errors import ConfigError

    if folder is None:
        with tempfile.TemporaryDirectory() as tmp:
            return check_class_paths(config_yaml, allowed, Path(tmp))
    check_text(config_yaml, "the config the server sent", "config")
    path = Path(folder) / "config.yaml"
    path.write_text(config_yaml)
    try:
        check_config_files([path], node_allowlist(allowed), "node-config allowed-classes", follow_files=False)
    except ConfigError as exc:
        if exc.field == "node-config allowed-classes":
            raise
        raise ConfigError("node-config allowed-classes", f"the run's {exc}") from None
    return path


class NodeWorker:
    """The clients of one node and the requests the server's FlowerExecutor makes of them."""

    def __init__(self):
        self.loop = None
        self.node_config: dict[str, Any] = {}  # flower-supernode --node-config
        self.objects: dict[int, torch.Tensor] = {}  # token -> tensor the server sent
        self.secagg = NodeSecureAggregation()  # its clients' half of secure aggregation

    # ------------------------------------------------------------------ requests
    def handle(self, content):
        reply, due = self.answer(content)
        time.sleep(max(0.0, due - time.monotonic()))  # the reply leaves no earlier than the device would send it
        return reply

    def answer(self, content) -> tuple[Any, float]:
        """The reply to one message, and when it may leave (``time.monotonic``): once the injected delay
        the server asked for has passed (``hold_s``: this device's virtual time, scaled; real time)."""
        started = time.monotonic()
        meta, tensors = unpack(content)
        op = meta.pop("op")
        held, hold_s = "hold_s" in meta, float(meta.pop("hold_s", 0.0))  # fdlit.deployment.realtime
        try:
            if self.loop is not None:
                self._receive(meta.pop("live", None), tensors)
            out_meta, out = getattr(self, f"op_{op}")(meta, tensors)
        except Exception as exc:
            from fdlit.errors import ConfigError

            if isinstance(exc, ConfigError):  # the node refuses the run (its allow-list, its data): one line
                out_meta, out = {"error": " ".join(str(exc).split()), "error_kind": "ConfigError"}, {}
            else:
                out_meta, out = {"error": traceback.format_exc(), "error_kind": type(exc).__name__}, {}
        out_meta.update(cpu_s=time.process_time(), peak_rss=peak_rss_bytes(), pid=os.getpid())
        if held:  # when the reply leaves, on the wall clock: comparable across nodes
            out_meta["sent_at"] = time.time() + max(started + hold_s - time.monotonic(), 0.0)
        return pack(out_meta, out), started + hold_s

    def _receive(self, live: list[int] | None, tensors: dict[str, torch.Tensor]) -> None:
        device = self.loop.fabric.device
        for key, t in tensors.items():
            if key.startswith("t"):
                self.objects[int(key[1:])] = t.to(device)
        if live is not None:
            for token in set(self.objects) - set(live):
                del self.objects[token]

    def _ref(self, ref) -> torch.Tensor | None:
        """A tensor the server named: ``["token", n]`` (sent earlier), ``["private", i, 0|1]``
        (client i's inputs or labels, built here), or a loop attribute (``public_x``, ``test_x``...)."""
        if ref is None:
            return None
        kind, *rest = ref
        if kind == "token":
            return self.objects[rest[0]]
        if kind == "private":
            return self.loop.parts.tensors.private[rest[0]][rest[1]]
        return getattr(self.loop.parts.tensors, kind)

    @property
    def _side(self) -> ClientSide:
        """The clients this node hosts, their data and the executor that runs them."""
        return self.loop.parts.clients

    def _clients(self, ids):
        return [self._side.clients[i] for i in ids]

    def op_hello(self, meta, tensors):
        part = self.node_config.get("partition-id")
        # a node with its own data holds no copy of the dataset: the server sends it the shared sets
        return {"partition_id": None if part is None else int(part),
                "local_data": bool(self.node_config.get("local-data"))}, {}

    def op_setup(self, meta, tensors):
        from fdlit.configuration.code_allowlist import ImportGuard
        from fdlit.configuration.schema import parse_fit
        from fdlit.runs.experiment import loop_from_config

        allowed = self.node_config.get("allowed-classes", "")
        torch.set_num_threads(int(meta.get("threads") or torch.get_num_threads()))
        with tempfile.TemporaryDirectory() as tmp:
            path = check_class_paths(meta["config"], allowed, Path(tmp))  # before anything of it is imported
            # data-dir: where this machine keeps the dataset's files (the server's path may not exist here)
            local = ["--data.data_dir", str(self.node_config["data-dir"])] if self.node_config.get("data-dir") else []
            # the walk refused every name outside the allow-list; the guard refuses any import it did not foresee
            with ImportGuard(node_allowlist(allowed)):
                parser, cfg = parse_fit(["--config", str(path), *local], node_allowlist(allowed))
                self.loop = loop_from_config(cfg, parser.instantiate(cfg), server=False)
        from fdlit.federation.construction import InitialDraws

        self.ids = list(meta["clients"])
        self.loop.hosted = self.ids  # only these clients are built here, with only their data
        # each network drawn from the random state fit drew it from (the server's record), no other drawn
        self.loop.draws = InitialDraws(dict(zip(self.ids, tensors["draws"], strict=True)), tensors["draws_after"])
        folder = self.node_config.get("local-data")
        if folder:  # the node's own samples and the shared sets the server sent: nothing read from the dataset
            from fdlit.data.node_local import serve_node_data

            serve_node_data(self.loop.data, meta["shared"], tensors, str(folder), self.ids, self.loop.seed)
        with ImportGuard(node_allowlist(allowed)):
            self.loop.setup()
        if folder:  # their local classes go to the server, which measures local accuracy on them
            return {"clients": self.ids,
                    "classes": {str(i): list(self._side.client_data[i].classes) for i in self.ids}}, {}
        return {"clients": self.ids}, {}

    def op_train(self, meta, tensors):
        datasets = [(self._ref(x), self._ref(t)) for x, t in meta["datasets"]]
        losses = self._side.executor.train(self._clients(meta["ids"]), meta["phase"], datasets,
                                                        meta["epochs"], meta["batch_size"])
        return self._after({"losses": [float(v) for v in losses]}, meta, {})

    def op_step(self, meta, tensors):
        """The round's client step (``ClientExecutor.client_step``): private phase, evaluation
        predictions, and the arriving clients' upload, made here as ``fit`` makes it."""
        from fdlit.execution.executor import ClientStep

        loop, upload = self.loop, meta.get("upload")
        carried_meta, carried = self._receive_carried(meta)  # the previous round's receive comes first
        trained = self._clients(meta["ids"])
        datasets = [(self._ref(x), self._ref(t)) for x, t in meta["datasets"]]
        executor = self._side.executor
        losses = executor.train(trained, "private", datasets, meta["epochs"], meta["batch_size"]) if trained else []
        out_meta: dict[str, Any] = {"losses": [float(v) for v in losses]}
        out = self._then_measure(meta)  # before the upload, as the round evaluates after the private phase
        secure = loop.privacy.secure
        if secure and upload and "secagg" not in meta:
            raise RuntimeError("secure aggregation is on, and the server asked for the uploads without keys")
        if secure and "secagg" in meta:  # step 0: its sampled clients' keys (fdlit.deployment.secure_node)
            method = loop.server_side.method  # the server state its clients' terms read (what the method declares)
            for name in getattr(method, "secure_state", ()):
                setattr(method, name, self._ref(meta["secagg"].get("state", {}).get(name)))
            out_meta["secagg_ids"], out["secagg/keys"] = self.secagg.start(meta["secagg"]["round"],
                                                                           meta["secagg"]["clients"])
        if upload:
            from fdlit.errors import check_finite

            check_finite(losses, meta["round"], "private", meta["ids"])
            info = loop.parts.facts.info(meta["round"], tuple(upload["clients"]), self._ref(upload["public_index"]))
            ids = upload["ids"]
            step = ClientStep(meta["round"], [], [], 0, 0, upload["kind"], self._clients(ids),
                              [self._side.client_data[i] for i in ids], self._side.method_part, info,
                              {k: self._ref(r) for k, r in upload["received"].items()}, self._side.release)
            _, payloads = steps.client_step(executor, step)
            if secure:  # the terms of the sum stay here; each message goes up without its arrays
                payloads = self.secagg.keep(ids, payloads, loop.privacy, loop.parts.seed)
            out_meta["upload"] = self._typed(payloads, out)
        return self._after(out_meta | carried_meta, meta, out | carried)

    def _receive_carried(self, meta) -> tuple[dict, dict[str, torch.Tensor]]:
        """The receive the server carried with this request (fdlit.deployment.carried): every client
        named loads what it was sent, then is measured on the evaluation sets (``recv/<k>``); its
        logged values and, for a checkpointed round, its state travel back beside the step's."""
        entries = meta.get("receive")
        if not entries:
            return {}, {}
        for entry in entries:
            self._hook("receive", entry)
        ids = [i for entry in entries for i in entry["ids"]]
        out = {f"recv/{k}": v for k, v in self._measured(ids, meta["receive_measure"]).items()}
        out_meta = {"receive_logged": steps.logged_values(self._side.executor)}
        keep = meta.get("receive_states") or {}
        if keep.get("then_states"):
            out["receive_states"] = to_bytes(self._side.executor.fetch_states(self._clients(ids)))
        if keep.get("save_states"):
            out_meta["receive_saved"] = self._save(keep["save_states"], ids)
        return out_meta, out

    def op_distil(self, meta, tensors):
        """The public phase: each client's training set from what it was sent and its own data."""
        loop = self.loop
        ids = meta["ids"]
        teachers = [(self._ref(x), self._ref(t)) for x, t in meta["teachers"]]
        losses = steps.distil(self._side.executor, self._side.method_part, self._clients(ids), teachers,
                                      [loop.parts.tensors.private[i] for i in ids], meta["epochs"], meta["batch_size"])
        return self._after({"losses": [float(v) for v in losses]}, meta, self._then_measure(meta))

    def _after(self, out_meta: dict, meta: dict, out: dict[str, torch.Tensor]):
        """What every reply that changed clients carries besides its answer: the predictions sent ahead,
        what the clients' steps logged (``self.log``), and the hosted clients' states when the round ends
        in a checkpoint (saves the server a request)."""
        if "then_measure" in meta and not any(k.startswith("pred/") for k in out):
            out.update(self._then_measure(meta))
        out_meta["logged"] = steps.logged_values(self._side.executor)
        if meta.get("then_states"):
            out_meta["state_ids"] = list(self.ids)
            out["states"] = to_bytes(self._side.executor.fetch_states(self._clients(self.ids)))
        if meta.get("save_states"):
            out_meta["saved"] = self._save(meta["save_states"], self.ids)
        return out_meta, out

    def _save(self, ask: dict, ids: list[int]) -> list:
        """The clients' states saved on this node's disk for the round's checkpoint: [round, ids]."""
        from fdlit.deployment.node_checkpoints import save

        states = self._side.executor.fetch_states(self._clients(ids))
        save(self.node_config, ask["key"], int(ask["round"]), dict(zip(ids, states, strict=True)))
        return [int(ask["round"]), list(ids)]

    @staticmethod
    def _typed(payloads, out: dict[str, torch.Tensor]) -> dict:
        """Messages as reply parts: arrays ``u<pos>/<key>`` into ``out``; their metrics, config and
        sensitivity in the JSON part."""
        for j, p in enumerate(payloads):
            out.update({f"u{j}/{k}": v for k, v in p.arrays.items()})
        return {"keys": [list(p.arrays) for p in payloads],
                "typed": [{"metrics": p.metrics, "config": p.config, "sensitivity": p.sensitivity} for p in payloads]}

    def _then_measure(self, meta) -> dict[str, torch.Tensor]:
        """The evaluation the server will ask for next (test and validation sets): which samples each
        client predicts right, sent with this reply; the predictions themselves stay here."""
        return {f"pred/{k}": v for k, v in self._measured(meta["ids"], meta.get("then_measure", [])).items()}

    def _measured(self, ids, sets) -> dict[int, torch.Tensor]:
        if not ids:
            return {}
        return {k: self._predict(ids, x).argmax(-1) == self._ref(y).to(self.loop.fabric.device)
                for k, (x, y) in enumerate(sets)}

    def _predict(self, ids, ref) -> torch.Tensor:
        return self._side.executor.predict(self._clients(ids), self._ref(ref)).float()

    def op_predict(self, meta, tensors):
        return {}, {"logits": self._predict(meta["ids"], meta["x"])}

    def _hook(self, hook: str, meta):
        ids = meta["ids"]
        loop = self.loop
        index = self._ref(meta["public_index"])
        info = loop.parts.facts.info(meta["round"], tuple(meta["clients"]), index)
        received = {k: self._ref(r) for k, r in meta["received"].items()}
        clients, data = self._clients(ids), [self._side.client_data[i] for i in ids]
        return self._side.executor.client_hook(hook, self._side.method_part, info, clients, data, received)

    def op_hook(self, meta, tensors):
        payloads = self._hook(meta["hook"], meta)
        out: dict[str, torch.Tensor] = {}
        return self._after({"upload": self._typed(payloads, out)}, meta, out)

    def op_get_states(self, meta, tensors):
        clients = self._clients(meta["ids"])
        return {}, {"states": to_bytes(self._side.executor.fetch_states(clients))}

    def op_set_states(self, meta, tensors):
        clients = self._clients(meta["ids"])
        for client, state in zip(clients, from_bytes(tensors["states"]), strict=True):
            client.load_client_state(state)
        self._side.executor.push_states(clients)
        return {}, {}

    def op_secagg_share(self, meta, tensors):
        return self.secagg.share(meta, tensors)

    def op_secagg_mask(self, meta, tensors):
        return self.secagg.mask(meta, tensors)

    def op_secagg_unmask(self, meta, tensors):
        return self.secagg.unmask(meta, tensors)

    def op_restore(self, meta, tensors):
        """A resumed run: the clients load the states this node saved (fdlit.deployment.node_checkpoints)."""
        from fdlit.deployment.node_checkpoints import load

        rounds = {int(i): int(r) for i, r in meta["rounds"].items()}
        states = load(self.node_config, meta["key"], rounds)
        clients = self._clients(sorted(rounds))
        for client in clients:
            client.load_client_state(states[client.client_id])
        self._side.executor.push_states(clients)
        return {"restored": sorted(rounds)}, {}

    def op_teardown(self, meta, tensors):
        self.stop = True
        return {}, {}


# ---------------------------------------------------------------------- the process
def serve(name: str, folder: Path, authkey: bytes, watch: list[int], idle_timeout_s: float) -> None:
    """Answer relayed messages one at a time until teardown, a watched process ends, or idleness."""
    from multiprocessing.connection import Listener

    worker = NodeWorker()
    worker.stop = False
    last = [time.monotonic()]

    def watchdog():
        while True:
            time.sleep(0.5)
            if not all(alive(p) for p in watch) or time.monotonic() - last[0] > idle_timeout_s:
                os._exit(0)  # the SuperNode is gone (killed, stopped) or the run was abandoned

    threading.Thread(target=watchdog, daemon=True).start()
    (folder / "worker.pid").write_text(str(os.getpid()))  # for the launcher's clean-up
    with Listener("\0" + name, family="AF_UNIX", authkey=authkey) as listener:  # an abstract socket
        while not worker.stop:
            with listener.accept() as conn:
                content, worker.node_config = conn.recv()
                reply = worker.handle(content)
                conn.send(reply)
                last[0] = time.monotonic()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fdlit node worker (started by the fdlit ClientApp)")
    parser.add_argument("--socket", required=True, help="the abstract socket's name")
    parser.add_argument("--authkey-file", required=True)
    parser.add_argument("--watch", type=int, nargs="*", default=[])
    parser.add_argument("--idle-timeout", type=float, default=1800.0)
    args = parser.parse_args(argv)
    key = Path(args.authkey_file)
    from fdlit.execution.allocator import keep_large_blocks

    keep_large_blocks()  # this process trains the node's clients, as a fit does
    serve(args.socket, key.parent, key.read_bytes(), args.watch, args.idle_timeout)


if __name__ == "__main__":
    main()

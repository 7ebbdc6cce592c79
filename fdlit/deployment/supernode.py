"""fdlit's SuperNode: ``python -m fdlit.deployment.supernode [flower-supernode options]``.

It is Flower's ``flower-supernode`` (1.41, 1.42) with two changes that set a deployed round's pace:

* **One long-lived task runner instead of a process per message.** Flower's default (``--isolation
  subprocess``) starts a SuperExec, which starts a fresh ``flwr-clientapp`` process for every
  message: a Python start, Flower's imports, the app unpacked and loaded, seconds a message. Here the
  SuperNode runs with ``--isolation process`` and a thread of its own process takes each ClientApp
  task as soon as the SuperNode stored its message, makes the calls ``flwr-clientapp`` makes
  (acquire, pull the message, push the reply, report the status) on the Runtime API's own handlers
  in this process (:class:`NodeRuntime`: the same state changes, without the ten-odd HTTP requests
  a message), and hands the message to fdlit's relay (:func:`fdlit.deployment.client_app.relay_message`).
  Only fdlit's ClientApp runs on such a node, whatever app a run submits: the node's operator
  decides what code it runs.
* **Waits that end when there is work** (:mod:`fdlit.deployment.pace`): the SuperNode sends a reply
  as soon as it is stored, polls the SuperLink soon after it worked, and retries message objects
  still arriving soon.

Measured on digits (3 SuperNodes on loopback, docs/deployment.md): a round went from ~15 s with
Flower's defaults to within 3x of a `fit` round (median 2.85x).

The task runner calls Flower's private Runtime API handlers: :func:`runner_fits` checks their names and
signatures first; where one moved, the node runs as ``flower-supernode`` does by default (a
``flwr-clientapp`` process per message, fdlit's ClientApp relaying to the same node worker: slower
rounds, the same results) and says so once. ``fdlit deploy`` starts its local nodes this way; on another machine,
run this module with the options you would give ``flower-supernode``.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import traceback

from fdlit.deployment.pace import MESSAGE_STORED, POLL_S, REPLY_STORED, short_object_pulls, short_supernode_polls
from fdlit.internals import MovedInternal, expect_function, fell_back

TASK_FALLBACK_POLL_S = 1.0  # a task whose message was stored outside the wrapped path is still taken

CLIENTAPP_TASK = "flwr-clientapp"

# the Flower functions the task runner calls, and the parameters it passes them (Flower 1.41, 1.42)
RUNTIME_HANDLERS = {
    "flwr.supercore.servicer.runtime.runtime_handlers": {"send_task_heartbeat": ("request", "state", "task")},
    "flwr.supernode.servicer.runtime.runtime_handlers": {
        "acquire_task": ("request", "state"),
        **{n: ("request", "state", "task") for n in ("pull_task_input", "push_task_output", "pull_messages",
                                                      "push_messages", "pull_object", "push_object",
                                                      "confirm_message_received")}},
    "flwr.supernode.runtime.run_clientapp": {"pull_task_input": ("client",), "push_message": ("client", "message", "context"),
                                             "push_task_output": ("client", "context", "sub_status", "details")},
    "flwr.supercore.heartbeat": {"make_task_heartbeat_fn_http": ("client",), "HeartbeatSender": ("heartbeat_fn",)},
    "flwr.supernode.cli.flower_supernode": {"start_client_internal": ("state_factory", "isolation")},
}


def runner_fits() -> bool:
    """Flower's Runtime API handlers and SuperNode start are the ones the task runner calls (names and
    parameters); else one note, and the node runs Flower's own ClientApp process per message."""
    try:
        for module, functions in RUNTIME_HANDLERS.items():
            owner = importlib.import_module(module)
            for name, parameters in functions.items():
                expect_function(owner, name, parameters)
    except (ImportError, MovedInternal) as exc:
        fell_back(f"{exc}: the SuperNode runs Flower's ClientApp process per message (slower rounds)")
        return False
    return True


class NodeRuntime:
    """The SuperNode's Runtime API called inside its own process: the requests Flower's ClientApp makes
    over HTTP (``PullTaskInput``, ``PullMessages``, ``PullObject``, ``PushMessages``, ...), answered by
    the same handlers on the same node state, without a request, a socket or a serialisation each.
    ``token``: the task the calls act for, as the ClientApp's token header names it."""

    def __init__(self, state, token: str | None = None):
        from flwr.supercore.servicer.runtime import runtime_handlers as core
        from flwr.supernode.servicer.runtime import runtime_handlers as node

        self.state, self.token = state, token
        self._calls = {"AcquireTask": lambda req: node.acquire_task(req, state)}
        for name, fn in (("SendTaskHeartbeat", core.send_task_heartbeat), ("PullTaskInput", node.pull_task_input),
                         ("PushTaskOutput", node.push_task_output), ("PullMessages", node.pull_messages),
                         ("PushMessages", node.push_messages), ("PullObject", node.pull_object),
                         ("PushObject", node.push_object), ("ConfirmMessageReceived", node.confirm_message_received)):
            self._calls[name] = self._for_task(fn)

    def _for_task(self, fn):
        def call(request):
            task = self.state.get_task_by_token(self.token)
            if task is None:  # as the HTTP API answers a token it does not know
                raise RuntimeError("the SuperNode knows no task for this token")
            return fn(request, self.state, task)
        return call

    def __getattr__(self, name: str):
        try:
            return self._calls[name]
        except KeyError:
            raise AttributeError(name) from None


def run_task(state, token: str) -> None:
    """One ClientApp task: pull its message, relay it to the node worker, push the reply and the status."""
    from flwr.app import Message
    from flwr.app.error import Error
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

    from fdlit.deployment.client_app import relay_message

    runtime = NodeRuntime(state, token)
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(runtime))  # a long private phase stays claimed
    heartbeat.start()
    context, status, details = None, SubStatus.FAILED, ""
    try:
        message, context, _, _ = pull_task_input(runtime)
        try:
            reply = relay_message(message, context, watch=[os.getpid()])
            status = SubStatus.COMPLETED
        except Exception as exc:  # the reply says what failed; the server names the node
            details = f"{type(exc).__name__}: {exc}"
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details), reply_to=message)
        push_message(runtime, reply, context)
        REPLY_STORED.set()
    finally:
        push_task_output(runtime, context, status, details)
        heartbeat.stop()


def serve_tasks(state_factory, fallback_poll_s: float = TASK_FALLBACK_POLL_S) -> None:
    """Take ClientApp tasks one at a time, as soon as the SuperNode stored a message (else after
    ``fallback_poll_s``), for as long as it runs."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611

    runtime = NodeRuntime(state_factory.state())
    while True:
        try:
            res = runtime.AcquireTask(AcquireTaskRequest(supported_task_types=[CLIENTAPP_TASK]))
            if res.HasField("task") and res.token:
                run_task(runtime.state, res.token)
                continue
        except Exception:  # one task failed outside the relay: log it and go on
            traceback.print_exc()
        if MESSAGE_STORED.wait(fallback_poll_s):
            MESSAGE_STORED.clear()


def serve_tasks_beside(start_client_internal, fallback_poll_s: float = TASK_FALLBACK_POLL_S):
    """Flower's ``start_client_internal``, with fdlit's task runner started on the node's own state."""
    def start(*, state_factory, **kwargs):
        threading.Thread(target=serve_tasks, args=(state_factory, fallback_poll_s), daemon=True,
                         name="fdlit-tasks").start()
        return start_client_internal(state_factory=state_factory, **kwargs)
    return start


def check_node_config(argv: list[str]) -> None:
    """The node's own settings that can be checked before it connects: its local data (one line, exit 2)."""
    if "--node-config" not in argv[:-1]:
        return
    from flwr.common.config import parse_config_args  # Flower's parser, not its SuperNode (~75 MB)

    from fdlit.data.node_files import read_node_data  # numpy only: torch and the SuperNode come after
    from fdlit.errors import ConfigError

    settings = parse_config_args([argv[argv.index("--node-config") + 1]])
    try:
        if settings.get("local-data"):
            read_node_data(str(settings["local-data"]))
    except ConfigError as exc:
        print(f"fdlit: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--isolation" in argv:
        raise SystemExit("fdlit.deployment.supernode: --isolation is set here (process, with fdlit's task runner)")
    check_node_config(argv)  # before Flower's SuperNode and torch are imported: a refusal costs a bare Python
    from flwr.supernode.cli import flower_supernode

    announced = short_supernode_polls()  # else the runner looks for tasks every POLL_S
    short_object_pulls()
    if not runner_fits():
        sys.argv = ["flower-supernode", *argv]
        return flower_supernode()
    cli = importlib.import_module("flwr.supernode.cli.flower_supernode")  # the module (its package exports the function)
    cli.start_client_internal = serve_tasks_beside(cli.start_client_internal,
                                                   TASK_FALLBACK_POLL_S if announced else POLL_S)
    sys.argv = ["flower-supernode", *argv, "--isolation", "process"]
    return flower_supernode()


if __name__ == "__main__":
    sys.exit(main())

"""fdlit's SuperNode: ``python -m fdlit.deployment.supernode [flower-supernode options]``.

It is Flower's ``flower-supernode`` (1.41) with two changes that set a deployed round's pace:

* **One long-lived task runner instead of a process per message.** Flower's default (``--isolation
  subprocess``) starts a SuperExec, which starts a fresh ``flwr-clientapp`` process for every
  message: a Python start, Flower's imports, the app unpacked and loaded, seconds a message. Here the
  SuperNode runs with ``--isolation process`` and a thread of its own process takes each ClientApp
  task from the SuperNode's Runtime API (the calls ``flwr-clientapp`` makes: acquire, pull the
  message, push the reply, report the status) and hands the message to fdlit's relay
  (:func:`fdlit.deployment.client_app.relay_message`). Only fdlit's ClientApp runs on such a node,
  whatever app a run submits: the node's operator decides what code it runs.
* **Short waits** (:mod:`fdlit.deployment.pace`): the SuperNode's idle poll and its retries of
  message objects still arriving.

Measured on digits (3 SuperNodes on loopback, docs/deployment.md): the two changes take a round
from ~15 s to about a second. ``fdlit deploy`` starts its local nodes this way; on another machine,
run this module with the options you would give ``flower-supernode``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from fdlit.deployment.pace import POLL_S, short_object_pulls, short_supernode_polls

CLIENTAPP_TASK = "flwr-clientapp"


def runtime_client(address: str, token: str | None = None):
    """A client of the SuperNode's Runtime API (plain HTTP on this machine), as Flower's SuperExec
    (no token) and ClientApp (the task's token) make it."""
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    interceptors = [RuntimeVersionHttpInterceptor(component_name="flwr-clientapp" if token else "SuperExec")]
    if token:
        interceptors.append(RuntimeTokenHttpInterceptor(token))
    return RuntimeHttpClient.from_server_address(server_address=address, insecure=True, root_certificates=None,
                                                 interceptors=interceptors,
                                                 retry_invoker=make_simple_http_retry_invoker())


def run_task(address: str, token: str) -> None:
    """One ClientApp task: pull its message, relay it to the node worker, push the reply and the status."""
    from flwr.app import Message
    from flwr.app.error import Error
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

    from fdlit.deployment.client_app import relay_message

    client = runtime_client(address, token)
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    heartbeat.start()
    context, status, details = None, SubStatus.FAILED, ""
    try:
        message, context, _, _ = pull_task_input(client)
        try:
            reply = relay_message(message, context, watch=[os.getpid()])
            status = SubStatus.COMPLETED
        except Exception as exc:  # the reply says what failed; the server names the node
            details = f"{type(exc).__name__}: {exc}"
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details), reply_to=message)
        push_message(client, reply, context)
    finally:
        push_task_output(client, context, status, details)
        heartbeat.stop()
        client.close()


def serve_tasks(address: str) -> None:
    """Take ClientApp tasks from the Runtime API one at a time, for as long as the SuperNode runs."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611

    client = None
    while True:
        try:
            client = client or runtime_client(address)
            res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[CLIENTAPP_TASK]))
            if res.HasField("task") and res.token:
                run_task(address, res.token)
                continue
        except Exception:  # the API not up yet, or one task's transport failed: log it and go on
            traceback.print_exc()
            client = None
            time.sleep(1.0)
        time.sleep(POLL_S)


def runtime_address(argv: list[str]) -> str:
    """The Runtime API's address from the SuperNode's ``--host``/``--port`` (Flower's defaults otherwise)."""
    from flwr.supercore.constant import SUPERNODE_UVICORN_DEFAULT_PORT

    def value(flag: str, default: str) -> str:
        return argv[argv.index(flag) + 1] if flag in argv[:-1] else default

    host = value("--host", "127.0.0.1")
    return f"{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{value('--port', str(SUPERNODE_UVICORN_DEFAULT_PORT))}"


def check_node_config(argv: list[str]) -> None:
    """The node's own settings that can be checked before it connects: its local data (one line, exit 2)."""
    if "--node-config" not in argv[:-1]:
        return
    from flwr.common.config import parse_config_args

    from fdlit.data.node_local import read_node_data
    from fdlit.errors import ConfigError

    settings = parse_config_args([argv[argv.index("--node-config") + 1]])
    try:
        if settings.get("local-data"):
            read_node_data(str(settings["local-data"]))
    except ConfigError as exc:
        print(f"fdlit: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> int:
    from flwr.supernode.cli import flower_supernode

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--isolation" in argv:
        raise SystemExit("fdlit.deployment.supernode: --isolation is set here (process, with fdlit's task runner)")
    check_node_config(argv)
    short_supernode_polls()
    short_object_pulls()
    threading.Thread(target=serve_tasks, args=(runtime_address(argv),), daemon=True, name="fdlit-tasks").start()
    sys.argv = ["flower-supernode", *argv, "--isolation", "process"]
    return flower_supernode()


if __name__ == "__main__":
    sys.exit(main())

"""fdlit's use of Flower's private names (fdlit.deployment.superlink, .supernode, .pace): every Fleet and
Control request passes Flower's authentication layers, and each private name that moved (renamed, another
signature, a route moved out of its API's prefix) leaves Flower's own behaviour in place, said once."""

from __future__ import annotations

import importlib
import time

import pytest

pytest.importorskip("flwr", reason="the flower extra is not installed")

PROTOBUF = {"content-type": "application/protobuf"}


def _routes():
    from flwr.superlink.routers.control import router as control
    from flwr.superlink.routers.fleet.router import router as fleet

    return control, fleet


def _app(middleware):
    from fastapi import FastAPI

    control, fleet = _routes()
    app = FastAPI(middleware=middleware)
    app.include_router(control)
    app.include_router(fleet)
    return app


def test_every_fleet_and_control_route_passes_the_authentication_layers(monkeypatch):
    """Each route of Flower's Control and Fleet routers, requested through fdlit's middleware: Flower's
    control and node authentication layers see every one of them (they are never scoped)."""
    from flwr.superlink import main as app_module
    from flwr.superlink.routers.control.middlewares import ControlAuthenticationMiddleware
    from flwr.superlink.routers.fleet.node_auth import NodeAuthMiddleware
    from starlette.testclient import TestClient

    from fdlit.deployment.superlink import AUTHENTICATION, SCOPES, scoped

    assert not set(AUTHENTICATION) & set(SCOPES)
    seen: list[tuple[str, str]] = []

    def recorder(name):
        async def dispatch(self, request, call_next):
            seen.append((name, request.url.path))
            return await call_next(request)
        return dispatch

    monkeypatch.setattr(ControlAuthenticationMiddleware, "dispatch", recorder("control"))
    monkeypatch.setattr(NodeAuthMiddleware, "dispatch", recorder("node"))
    middleware = scoped(app_module._get_middleware())
    assert [m.cls for m in middleware].count(ControlAuthenticationMiddleware) == 1
    assert [m.cls for m in middleware].count(NodeAuthMiddleware) == 1
    client = TestClient(_app(middleware), raise_server_exceptions=False)
    control, fleet = _routes()
    paths = [r.path for r in (*control.routes, *fleet.routes)]
    assert len(paths) > 20
    for path in paths:
        client.post(path, content=b"", headers=PROTOBUF)
    assert [p for n, p in seen if n == "control"] == paths  # every request, whatever its API
    assert [p for n, p in seen if n == "node"] == paths


def test_a_route_moved_out_of_its_prefix_leaves_flowers_middleware_unscoped(monkeypatch, capsys):
    from flwr.superlink import main as app_module

    from fdlit import internals
    from fdlit.deployment import superlink

    monkeypatch.setattr(internals, "_said", set())
    control, _ = _routes()
    route = control.routes[0]
    monkeypatch.setattr(route, "path", route.path.replace("/v1/control/", "/v2/control/"))
    flower = app_module._get_middleware()
    assert superlink.scoped(flower) is flower
    assert superlink.scoped(flower) is flower
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("fdlit: note: ") and "/v2/control/" in err[0], err


def test_a_scoped_layer_that_acts_on_another_api_leaves_flowers_middleware_unscoped(monkeypatch, capsys):
    """A Flower release whose no-cache layer marks every response (not only the Control API's)."""
    from flwr.superlink import main as app_module
    from flwr.superlink.routers.control.middlewares import ControlSensitiveResponseMiddleware

    from fdlit import internals
    from fdlit.deployment import superlink

    async def dispatch(self, request, call_next):
        response = await call_next(request)
        response.headers["Cache-Control"] = "no-store"
        return response

    monkeypatch.setattr(internals, "_said", set())
    monkeypatch.setattr(ControlSensitiveResponseMiddleware, "dispatch", dispatch)
    flower = app_module._get_middleware()
    assert superlink.scoped(flower) is flower
    assert "ControlSensitiveResponseMiddleware acts on requests outside /v1/control/" in capsys.readouterr().err


def test_an_error_translation_that_changes_successful_answers_leaves_flowers_middleware_unscoped(monkeypatch, capsys):
    """A Flower release whose translator marks every answer: fdlit's plain layer would skip that, so
    Flower's own layers stay."""
    import flwr.supercore.error as error
    from flwr.superlink import main as app_module

    from fdlit import internals
    from fdlit.deployment import superlink

    translate = error.http_error_translator

    async def marking(request, call_next):
        response = await translate(request, call_next)
        response.headers["x-flower"] = "1"
        return response

    monkeypatch.setattr(internals, "_said", set())
    flower = app_module._get_middleware()
    monkeypatch.setattr(error, "http_error_translator", marking)
    assert superlink.scoped(flower) is flower
    assert "http_error_translator changes answers that did not raise" in capsys.readouterr().err


def test_a_renamed_get_middleware_leaves_flowers_app_as_it_is(monkeypatch, capsys):
    from flwr.superlink import main as app_module

    from fdlit import internals
    from fdlit.deployment import superlink

    monkeypatch.setattr(internals, "_said", set())
    flower = app_module._get_middleware
    monkeypatch.delattr(app_module, "_get_middleware")
    monkeypatch.setattr(app_module, "_middleware", flower, raising=False)
    superlink.scope_middleware()
    assert not hasattr(app_module, "_get_middleware")
    assert "_get_middleware is gone" in capsys.readouterr().err


def test_keyword_defaults_fdlit_does_not_find_are_an_error():
    from fdlit.internals import MovedInternal, set_keyword_defaults

    def pull(ids, backoff=1.0, *, initial_backoff=1.0):
        return ids, backoff, initial_backoff

    with pytest.raises(MovedInternal, match="has no keyword-only default backoff_cap"):
        set_keyword_defaults(pull, backoff_cap=0.1)
    with pytest.raises(MovedInternal, match="has no keyword-only default backoff"):
        set_keyword_defaults(pull, backoff=0.1)  # positional-or-keyword: __kwdefaults__ would not change it
    assert pull(1) == (1, 1.0, 1.0)
    set_keyword_defaults(pull, initial_backoff=0.01)
    assert pull(1) == (1, 1.0, 0.01)


def test_short_object_pulls_set_flowers_backoff_or_leave_both_as_they_are(monkeypatch, capsys):
    from flwr.supercore.inflatable import inflatable_utils as utils

    from fdlit import internals
    from fdlit.deployment import pace

    monkeypatch.setattr(internals, "_said", set())
    for name in ("pull_objects", "pull_and_inflate_object_from_tree"):  # restored after the test
        monkeypatch.setattr(getattr(utils, name), "__kwdefaults__", dict(getattr(utils, name).__kwdefaults__))
    flower = dict(utils.pull_and_inflate_object_from_tree.__kwdefaults__)

    def pull_objects(object_ids, pull_object_fn, *, max_time=7200, initial_delay=1, delay_cap=10):
        """A Flower release that renamed the backoff parameters."""

    monkeypatch.setattr(utils, "pull_objects", pull_objects)
    assert pace.short_object_pulls() is False and pace.short_object_pulls() is False
    assert utils.pull_and_inflate_object_from_tree.__kwdefaults__ == flower  # checked both before changing either
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "has no keyword-only default initial_backoff, backoff_cap" in err[0], err
    monkeypatch.undo()
    for name in ("pull_objects", "pull_and_inflate_object_from_tree"):
        monkeypatch.setattr(getattr(utils, name), "__kwdefaults__", dict(getattr(utils, name).__kwdefaults__))
    assert pace.short_object_pulls() is True
    assert utils.pull_objects.__kwdefaults__["initial_backoff"] == pytest.approx(pace.POLL_S / 10)
    assert utils.pull_and_inflate_object_from_tree.__kwdefaults__["backoff_cap"] == pytest.approx(pace.POLL_S)


def test_a_supernode_loop_that_moved_keeps_flowers_waits(monkeypatch, capsys):
    from flwr.supernode import start_client_internal as loop

    from fdlit import internals
    from fdlit.deployment import pace

    monkeypatch.setattr(internals, "_said", set())
    pull, push = loop._pull_and_store_message, loop._push_messages
    monkeypatch.setattr(loop, "_push_messages", push)  # restored after the test

    def renamed(state, object_store, transport):  # another signature
        return None

    monkeypatch.setattr(loop, "_pull_and_store_message", renamed)
    assert pace.short_supernode_polls() is False
    assert loop.time is time and loop._pull_and_store_message is renamed and loop._push_messages is push
    assert "_pull_and_store_message takes no receive" in capsys.readouterr().err
    monkeypatch.setattr(loop, "_pull_and_store_message", pull)
    monkeypatch.setattr(loop, "time", time)
    assert pace.short_supernode_polls() is True
    assert isinstance(loop.time, pace.SuperNodeClock) and loop._pull_and_store_message is not pull


@pytest.mark.parametrize("move", ["renamed", "signature"])
def test_a_moved_runtime_handler_runs_the_node_as_flowers_supernode(monkeypatch, capsys, move):
    """fdlit's SuperNode with a Runtime API handler moved: Flower's ``flower-supernode`` with the same
    arguments and its default isolation (a ClientApp process per message, fdlit's ClientApp relaying
    to the node worker), Flower's start untouched, one note."""
    import flwr.supernode.cli as cli_package
    from flwr.supernode.servicer.runtime import runtime_handlers as node

    from fdlit import internals
    from fdlit.deployment import pace, supernode

    monkeypatch.setattr(internals, "_said", set())
    monkeypatch.setattr(pace, "short_supernode_polls", lambda: True)
    monkeypatch.setattr(pace, "short_object_pulls", lambda: True)
    monkeypatch.setattr(supernode, "short_supernode_polls", lambda: True)
    monkeypatch.setattr(supernode, "short_object_pulls", lambda: True)
    if move == "renamed":
        monkeypatch.delattr(node, "pull_messages")
    else:
        monkeypatch.setattr(node, "pull_messages", lambda request, state, run_token: None)
    started = importlib.import_module("flwr.supernode.cli.flower_supernode").start_client_internal
    argv = []
    monkeypatch.setattr(cli_package, "flower_supernode", lambda: argv.append(list(supernode.sys.argv)) or 0)
    monkeypatch.setattr(supernode.sys, "argv", ["x"])
    assert supernode.main(["--insecure", "--superlink", "127.0.0.1:9092"]) == 0
    assert argv == [["flower-supernode", "--insecure", "--superlink", "127.0.0.1:9092"]]
    assert importlib.import_module("flwr.supernode.cli.flower_supernode").start_client_internal is started
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "pull_messages" in err[0] and "Flower's ClientApp process per message" in err[0], err
    assert supernode.runner_fits() is False and capsys.readouterr().err == ""  # said once


def test_the_runtime_handlers_fdlit_calls_are_the_ones_flower_has():
    from fdlit.deployment.supernode import runner_fits

    assert runner_fits() is True

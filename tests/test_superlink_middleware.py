"""fdlit's SuperLink (fdlit.deployment.superlink): Flower's middleware, each API's layers on that API's
requests only. The deployment tests run every request kind through it (Fleet, Runtime, Control, with
and without SuperNode authentication); these check the wrapping itself."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("flwr", reason="the flower extra is not installed")


def test_the_superlink_keeps_flowers_layers_in_their_order_and_scopes_the_six_that_act_on_one_api():
    from flwr.superlink import main as app_module

    from fdlit.deployment.superlink import SCOPES, Scoped, scoped

    flower = app_module._get_middleware()
    ours = scoped(flower)
    assert len(ours) == len(flower)
    names = []
    for theirs, mine in zip(flower, ours, strict=True):
        name = theirs.cls.__name__
        names.append(name)
        if name in SCOPES:
            assert mine.cls is Scoped and mine.args[:3] == (theirs.cls, *SCOPES[name])
            assert mine.args[3:] == theirs.args and mine.kwargs == theirs.kwargs
        else:
            assert mine is theirs
    assert set(SCOPES) <= set(names)  # every scoped layer is one Flower builds (a renamed one would run everywhere)


def test_a_scoped_layer_runs_on_its_api_and_every_other_request_passes_it_by():
    from types import SimpleNamespace

    from fdlit.deployment.superlink import Scoped

    seen: list[tuple[str, str]] = []

    async def app(scope, receive, send):
        seen.append(("app", scope.get("path", scope["type"])))

    class Layer:
        def __init__(self, inner, tag):
            self.inner, self.tag = inner, tag

        async def __call__(self, scope, receive, send):
            seen.append((self.tag, scope["path"]))
            await self.inner(scope, receive, send)

    flower_app = SimpleNamespace(state=SimpleNamespace(fleet_event_log_plugin=None))
    requests = [{"type": "http", "path": p, "app": flower_app}
                for p in ("/v1/fleet/pull-messages", "/v1/runtime/pull-object", "/v1/control/list-runs")]
    for layer in (Scoped(app, Layer, "/v1/fleet/", None, tag="fleet"),
                  Scoped(app, Layer, "/v1/fleet/", "fleet_event_log_plugin", tag="fleet log")):
        for scope in [*requests, {"type": "lifespan"}]:
            asyncio.run(layer(scope, None, None))
    flower_app.state.fleet_event_log_plugin = object()  # a configured event log: its layer acts
    asyncio.run(Scoped(app, Layer, "/v1/fleet/", "fleet_event_log_plugin", tag="fleet log")(requests[0], None, None))
    everything_on = [("app", "/v1/fleet/pull-messages"), ("app", "/v1/runtime/pull-object"),
                     ("app", "/v1/control/list-runs"), ("app", "lifespan")]
    assert seen == [("fleet", "/v1/fleet/pull-messages"), *everything_on, *everything_on,
                    ("fleet log", "/v1/fleet/pull-messages"), ("app", "/v1/fleet/pull-messages")]

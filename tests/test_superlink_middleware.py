"""fdlit's SuperLink (fdlit.deployment.superlink): Flower's middleware, each API's layers on that API's
requests only. The deployment tests run every request kind through it (Fleet, Runtime, Control, with
and without SuperNode authentication); these check the wrapping itself."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("flwr", reason="the flower extra is not installed")


def test_the_superlink_keeps_flowers_layers_in_their_order_scopes_the_six_that_act_on_one_api_and_translates_errors_plainly():
    from flwr.supercore.error import http_error_translator
    from flwr.superlink import main as app_module

    from fdlit.deployment.superlink import SCOPES, Scoped, Translated, scoped

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
        elif theirs.kwargs.get("dispatch") is http_error_translator:
            assert mine.cls is Translated and mine.kwargs == {"translate": http_error_translator}
        else:
            assert mine is theirs
    assert set(SCOPES) <= set(names)
    assert [m.cls for m in ours].count(Translated) == 1  # every scoped layer is one Flower builds (a renamed one would run everywhere)


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


def test_the_plain_error_translation_answers_every_request_as_flowers_layer_does():
    """Success, a FlowerError (a catalogued code and an unknown one), an HTTPException and any other
    exception: the same status, body and headers through Flower's BaseHTTPMiddleware translator and
    through fdlit's plain ASGI one."""
    from flwr.supercore.error import ApiErrorCode, FlowerError, http_error_translator
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from fdlit.deployment.superlink import Translated

    def raising(exc):
        async def endpoint(request):
            raise exc
        return endpoint

    async def ok(request):
        return PlainTextResponse("fine", headers={"x-kept": "1"})

    known = FlowerError(ApiErrorCode.FEDERATION_NOT_FOUND_OR_NO_PERMISSION, "internal detail")
    routes = [Route("/ok", ok), Route("/flower", raising(known)),
              Route("/unknown", raising(FlowerError(10**6, "internal detail"))),
              Route("/http", raising(HTTPException(418, "teapot"))), Route("/boom", raising(ValueError("internal detail")))]
    answers = []
    for layer in (Middleware(BaseHTTPMiddleware, dispatch=http_error_translator),
                  Middleware(Translated, translate=http_error_translator)):
        client = TestClient(Starlette(routes=routes, middleware=[layer]), raise_server_exceptions=False)
        answers.append([(r.status_code, r.content, sorted((k, v) for k, v in r.headers.items() if k != "date"))
                        for r in (client.get(p) for p in ("/ok", "/flower", "/unknown", "/http", "/boom"))])
    flowers, ours = answers
    assert ours == flowers
    assert [status for status, _, _ in ours] == [200, flowers[1][0], 500, 418, 500] and flowers[1][0] >= 400
    assert all(b"internal detail" not in body for _, body, _ in ours)

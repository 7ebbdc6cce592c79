"""fdlit's SuperLink: Flower's own, with its middleware at a cost fit for many small requests (Flower 1.41, 1.42).

Flower's SuperLink serves the Fleet, Runtime and Control APIs from one FastAPI app whose every request
passes eight ``BaseHTTPMiddleware`` layers; six of them act on one API only (four on ``/v1/control/``,
two on ``/v1/fleet/``) and hand every other request straight on. Each layer still costs its task
group, streams and wrapped response (about 0.45 ms of the SuperLink's CPU a layer and request, from a py-spy
profile: 4.6 ms a request, 80 % of it in those layers), and on
a deployment's small, frequent requests (a digits FedAvg round: 65 requests, most of them a message's
objects and polls) those pass-throughs were most of the SuperLink's time. Here four such layers (the
control API's no-cache headers, licence check and event log, the Fleet API's event log) are each built as
Flower builds it and reached only by the requests of its own API (the event-log layers only while an
event-log plugin is configured, as they act only then): the same layers, in the same order, on the same
requests; the others skip them. The authentication layers (``ControlAuthenticationMiddleware``,
``NodeAuthMiddleware``) are never scoped: every request passes them, as in Flower. Flower's error
translation, which every request passes, runs as a plain ASGI layer that calls Flower's translator on a
request that raised (:class:`Translated`).

``_get_middleware`` is Flower's private name: before it is wrapped, :func:`scoping_fits` checks that it
is there, that every Control and Fleet route lies under the prefix its layers are scoped to, and that each
scoped layer hands a request to another API on untouched, and that Flower's error translation hands an
answer that did not raise back as it is; else one note, and Flower's middleware runs
as Flower builds it (the same answers, more SuperLink CPU a request).

``deploy`` starts this SuperLink for its local federation; a SuperLink started with
``flower-superlink`` (another machine, ``flwr run .``) is Flower's and works the same, at its pace.

    python -m fdlit.deployment.superlink <flower-superlink arguments>
"""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

from fdlit.internals import MovedInternal, expect_function, fell_back

# the API each path-specific layer of Flower's SuperLink acts on, and for the event logs the app's
# plugin without which the layer hands every request on (checked against their dispatch, Flower 1.41/1.42)
SCOPES = {"ControlSensitiveResponseMiddleware": ("/v1/control/", None),
          "ControlLicenseMiddleware": ("/v1/control/", None),
          "ControlEventLogMiddleware": ("/v1/control/", "control_event_log_plugin"),
          "FleetEventLogMiddleware": ("/v1/fleet/", "fleet_event_log_plugin")}
# every request passes these, whatever its path: never scoped
AUTHENTICATION = ("ControlAuthenticationMiddleware", "NodeAuthMiddleware")
# Flower's routers whose routes the scoped layers act on, by prefix
ROUTERS = {"/v1/control/": ("flwr.superlink.routers.control", "router"),
           "/v1/fleet/": ("flwr.superlink.routers.fleet.router", "router")}
# requests to other APIs with which each scoped layer is checked to hand requests on untouched
OTHER_API_PATHS = ("/v1/runtime/pull-messages", "/health", "/v1/control/list-runs", "/v1/fleet/pull-messages")


class Scoped:
    """An ASGI middleware that runs ``layer`` (built as Starlette builds it) on HTTP requests whose path
    starts with ``prefix`` (and, given ``plugin``, only while the app's state holds that plugin), and
    passes every other request (and every other scope) to ``app``."""

    def __init__(self, app, layer, prefix: str, plugin: str | None, *args, **kwargs):
        self.app, self.prefix, self.plugin = app, prefix, plugin
        self.layer = layer(app, *args, **kwargs)

    async def __call__(self, scope, receive, send):
        if (scope["type"] == "http" and scope["path"].startswith(self.prefix)
                and (self.plugin is None or getattr(scope["app"].state, self.plugin, None) is not None)):
            await self.layer(scope, receive, send)
        else:
            await self.app(scope, receive, send)


class Translated:
    """Flower's error translation (``http_error_translator``, a ``BaseHTTPMiddleware`` dispatch on every
    request) as a plain ASGI layer: a request that raises before its response starts gets the response
    Flower's translator makes of that exception (the translator itself is called, with a ``call_next``
    that raises it); every other request passes untouched, without the wrapping of the request and
    response that a ``BaseHTTPMiddleware`` layer costs each request."""

    def __init__(self, app, translate):
        self.app, self.translate = app, translate

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            if started:  # nothing can be translated once the response began (as with Flower's layer)
                raise
            from starlette.requests import Request

            async def raising(_request, error=exc):
                raise error

            response = await self.translate(Request(scope, receive), raising)
            await response(scope, receive, send)


def _passes_on(layer_cls, path: str) -> bool:
    """``layer_cls`` (built with no arguments) hands an HTTP request to ``path`` to the app behind it and its
    response back untouched."""
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 204, "headers": [(b"x-fdlit-probe", b"1")]})
        await send({"type": "http.response.body", "body": b""})

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": [],
             "server": ("127.0.0.1", 9), "client": ("127.0.0.1", 9),
             "app": SimpleNamespace(state=SimpleNamespace()), "state": {}}
    asyncio.run(layer_cls(app)(scope, receive, send))
    start = next((m for m in sent if m["type"] == "http.response.start"), None)
    return (reached == [path] and start is not None and start["status"] == 204
            and [(k, v) for k, v in start.get("headers", []) if k != b"content-length"] == [(b"x-fdlit-probe", b"1")])


def _translator_passes_success() -> bool:
    """Flower's error translation hands an answer that did not raise back as it is (:class:`Translated`
    calls it only on a request that raised)."""
    from flwr.supercore.error import http_error_translator
    from starlette.requests import Request
    from starlette.responses import Response

    answer = Response(b"", status_code=204, headers={"x-fdlit-probe": "1"})

    async def call_next(_request):
        return answer

    scope = {"type": "http", "method": "POST", "path": "/v1/fleet/probe", "headers": [], "query_string": b""}
    headers = list(answer.raw_headers)
    returned = asyncio.run(http_error_translator(Request(scope), call_next))
    return returned is answer and answer.status_code == 204 and answer.raw_headers == headers


def scoping_fits(middleware: list) -> None:
    """Raise :class:`MovedInternal` unless scoping ``middleware`` keeps Flower's answers: every route of
    Flower's Control and Fleet routers lies under its API's prefix, no authentication layer is among
    :data:`SCOPES`, and each layer of :data:`SCOPES` present hands requests to other APIs on untouched."""
    import importlib

    if set(SCOPES) & set(AUTHENTICATION):
        raise MovedInternal("an authentication layer is listed for scoping")
    for prefix, (module, name) in ROUTERS.items():
        routes = getattr(importlib.import_module(module), name).routes
        moved = [r.path for r in routes if not getattr(r, "path", "").startswith(prefix)]
        if not routes or moved:
            raise MovedInternal(f"Flower's {module} routes {moved or 'none'} outside {prefix}")
    if not _translator_passes_success():
        raise MovedInternal("Flower's http_error_translator changes answers that did not raise")
    for m in middleware:
        scope = SCOPES.get(getattr(m.cls, "__name__", ""))
        if scope is None:
            continue
        if m.args or m.kwargs:
            raise MovedInternal(f"{m.cls.__name__} is built with arguments")
        others = [p for p in OTHER_API_PATHS if not p.startswith(scope[0])]
        if not all(_passes_on(m.cls, p) for p in others):
            raise MovedInternal(f"{m.cls.__name__} acts on requests outside {scope[0]}")


def scoped(middleware: list) -> list:
    """Flower's middleware list with each layer of :data:`SCOPES` wrapped in :class:`Scoped`, and its
    error translation as :class:`Translated`; Flower's list unchanged (one note) where
    :func:`scoping_fits` finds the layers or routes are not the ones expected."""
    from starlette.middleware import Middleware

    try:
        from flwr.supercore.error import http_error_translator

        scoping_fits(middleware)
    except (ImportError, AttributeError, MovedInternal) as exc:
        fell_back(f"{exc}: the SuperLink runs Flower's middleware on every request (more SuperLink CPU a request)")
        return middleware
    out = []
    for m in middleware:
        scope = SCOPES.get(getattr(m.cls, "__name__", ""))
        if scope:
            out.append(Middleware(Scoped, m.cls, *scope, *m.args, **m.kwargs))
        elif m.kwargs.get("dispatch") is http_error_translator and not m.args:
            out.append(Middleware(Translated, translate=http_error_translator))
        else:
            out.append(m)
    return out


def scope_middleware() -> None:
    """Make Flower's SuperLink app build its middleware through :func:`scoped` (Flower's own, and one note,
    where ``flwr.superlink.main._get_middleware`` is not a function of no arguments)."""
    from flwr.superlink import main as app_module

    try:
        flower_middleware = expect_function(app_module, "_get_middleware")
        import inspect

        if inspect.signature(flower_middleware).parameters:
            raise MovedInternal("flwr.superlink.main._get_middleware takes arguments")
    except MovedInternal as exc:
        fell_back(f"{exc}: the SuperLink runs Flower's middleware on every request (more SuperLink CPU a request)")
        return
    app_module._get_middleware = lambda: scoped(flower_middleware())


def main(argv: list[str] | None = None) -> int:
    from flwr.superlink.cli import flower_superlink

    scope_middleware()
    sys.argv = ["flower-superlink", *(sys.argv[1:] if argv is None else argv)]
    return flower_superlink()


if __name__ == "__main__":
    sys.exit(main())

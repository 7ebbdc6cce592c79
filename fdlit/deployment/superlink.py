"""fdlit's SuperLink: Flower's own, with its middleware at a cost fit for many small requests (Flower 1.42, pinned).

Flower's SuperLink serves the Fleet, Runtime and Control APIs from one FastAPI app whose every request
passes eight ``BaseHTTPMiddleware`` layers; six of them act on one API only (four on ``/v1/control/``,
two on ``/v1/fleet/``) and hand every other request straight on. Each layer still costs its task
group, streams and wrapped response (about 0.45 ms of the SuperLink's CPU a layer and request, from a py-spy
profile: 4.6 ms a request, 80 % of it in those layers), and on
a deployment's small, frequent requests (a digits FedAvg round: 65 requests, most of them a message's
objects and polls) those pass-throughs were most of the SuperLink's time. Here each such layer is
built as Flower builds it and reached only by the requests of its own API (the event-log layers only
while an event-log plugin is configured, as they act only then): the same layers, in the same order,
on the same requests; the others skip them. Flower's error translation, which every request passes,
runs as a plain ASGI layer that calls Flower's translator on a request that raised (:class:`Translated`).

``deploy`` starts this SuperLink for its local federation; a SuperLink started with
``flower-superlink`` (another machine, ``flwr run .``) is Flower's and works the same, at its pace.

    python -m fdlit.deployment.superlink <flower-superlink arguments>
"""

from __future__ import annotations

import sys

# the API each path-specific layer of Flower's SuperLink acts on, and for the event logs the app's
# plugin without which the layer hands every request on (checked against their dispatch, Flower 1.42)
SCOPES = {"ControlSensitiveResponseMiddleware": ("/v1/control/", None),
          "ControlAuthenticationMiddleware": ("/v1/control/", None),
          "ControlLicenseMiddleware": ("/v1/control/", None),
          "ControlEventLogMiddleware": ("/v1/control/", "control_event_log_plugin"),
          "NodeAuthMiddleware": ("/v1/fleet/", None),
          "FleetEventLogMiddleware": ("/v1/fleet/", "fleet_event_log_plugin")}


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


def scoped(middleware: list) -> list:
    """Flower's middleware list with each layer of :data:`SCOPES` wrapped in :class:`Scoped`, and its
    error translation as :class:`Translated`."""
    from flwr.supercore.error import http_error_translator
    from starlette.middleware import Middleware

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
    """Make Flower's SuperLink app build its middleware through :func:`scoped`."""
    from flwr.superlink import main as app_module

    flower_middleware = app_module._get_middleware
    app_module._get_middleware = lambda: scoped(flower_middleware())


def main(argv: list[str] | None = None) -> int:
    from flwr.superlink.cli import flower_superlink

    scope_middleware()
    sys.argv = ["flower-superlink", *(sys.argv[1:] if argv is None else argv)]
    return flower_superlink()


if __name__ == "__main__":
    sys.exit(main())

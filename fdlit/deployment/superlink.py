"""fdlit's SuperLink: Flower's own, with each API's middleware on that API's requests only (Flower 1.42, pinned).

Flower's SuperLink serves the Fleet, Runtime and Control APIs from one FastAPI app whose every request
passes eight ``BaseHTTPMiddleware`` layers; six of them act on one API only (four on ``/v1/control/``,
two on ``/v1/fleet/``) and hand every other request straight on. Each layer still costs its task
group, streams and wrapped response (about 0.4 ms of the SuperLink's CPU a layer and request), and on
a deployment's small, frequent requests (a digits FedAvg round: 65 requests, most of them a message's
objects and polls) those pass-throughs were most of the SuperLink's time. Here each such layer is
built as Flower builds it and reached only by the requests of its own API: the same layers, in the
same order, on the same requests; the others skip them.

``deploy`` starts this SuperLink for its local federation; a SuperLink started with
``flower-superlink`` (another machine, ``flwr run .``) is Flower's and works the same, at its pace.

    python -m fdlit.deployment.superlink <flower-superlink arguments>
"""

from __future__ import annotations

import sys

# the API each path-specific layer of Flower's SuperLink acts on (checked against its dispatch, 1.42)
SCOPES = {"ControlSensitiveResponseMiddleware": "/v1/control/", "ControlAuthenticationMiddleware": "/v1/control/",
          "ControlLicenseMiddleware": "/v1/control/", "ControlEventLogMiddleware": "/v1/control/",
          "NodeAuthMiddleware": "/v1/fleet/", "FleetEventLogMiddleware": "/v1/fleet/"}


class Scoped:
    """An ASGI middleware that runs ``layer`` (built as Starlette builds it) on HTTP requests whose path
    starts with ``prefix``, and passes every other request (and every other scope) to ``app``."""

    def __init__(self, app, layer, prefix: str, *args, **kwargs):
        self.app, self.prefix = app, prefix
        self.layer = layer(app, *args, **kwargs)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(self.prefix):
            await self.layer(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def scoped(middleware: list) -> list:
    """Flower's middleware list with each layer of :data:`SCOPES` wrapped in :class:`Scoped`."""
    from starlette.middleware import Middleware

    out = []
    for m in middleware:
        prefix = SCOPES.get(getattr(m.cls, "__name__", ""))
        out.append(Middleware(Scoped, m.cls, prefix, *m.args, **m.kwargs) if prefix else m)
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

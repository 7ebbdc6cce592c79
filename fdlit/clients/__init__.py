from fdlit.clients.options import ClientOptimization


def __getattr__(name):
    # the client machinery is imported when a client is built, not for --help
    if name == "ClientModule":
        from fdlit.clients.client import ClientModule

        return ClientModule
    raise AttributeError(name)


__all__ = ["ClientModule", "ClientOptimization"]

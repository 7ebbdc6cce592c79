from fdlit.clients.options import ClientOptimization


def __getattr__(name):
    # ClientModule is a LightningModule: import Lightning (seconds of CPU) only when a client is built
    if name == "ClientModule":
        from fdlit.clients.client import ClientModule

        return ClientModule
    raise AttributeError(name)


__all__ = ["ClientModule", "ClientOptimization"]

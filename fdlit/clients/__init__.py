from fdlit.clients.client import ClientModule, ClientOptimization

__all__ = ["ClientModule", "ClientOptimization"]

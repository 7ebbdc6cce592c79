"""Client networks, chosen in configs by ``class_path``."""

from fdlit.models.digits import MLP, SmallCNN

__all__ = ["MLP", "SmallCNN"]

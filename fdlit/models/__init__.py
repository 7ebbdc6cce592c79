"""Client networks, chosen in configs by ``class_path``.

Heavy dependencies (``transformers``) are imported only when their model is built.
"""

from fdlit.models.base import ClientNetwork
from fdlit.models.digits import MLP, SmallCNN
from fdlit.models.hetero import PerClient
from fdlit.models.lenet import LeNet5
from fdlit.models.resnet import ResNet18


def __getattr__(name):
    if name == "BertClassifier":
        from fdlit.models.text import BertClassifier

        return BertClassifier
    raise AttributeError(name)


__all__ = ["ClientNetwork", "MLP", "SmallCNN", "LeNet5", "ResNet18", "BertClassifier", "PerClient"]

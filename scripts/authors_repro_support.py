"""Support for scripts/side_by_side_reproducibility.py: what lets the SCARLET authors' ``reproducibility``
branch run on fdlit's digits split without torchvision and without their CIFAR data.

Nothing here is their code. Written into a temporary folder placed before their ``src`` on ``sys.path``:

* a stand-in ``torchvision``: the names their modules and fedlab import at load. The dataset classes and
  loaders raise if used (the adapter below replaces their CIFAR data). Four transforms are used at run
  time by their Selective-FD density-ratio step and compute what torchvision's compute for an H x W x C
  uint8 array: ``ToTensor`` (C x H x W, / 255), ``Resize`` (``interpolate``, bilinear, antialias, as
  torchvision's tensor resize), ``Normalize`` ((x - mean) / std per channel) and ``Compose``.
* a ``model`` package in place of theirs (ResNet-20): ``get_model`` returns fdlit's client network.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import TensorDataset

_ABSENT = (
    "def _absent(*args, **kwargs):\n"
    "    raise RuntimeError('stand-in torchvision: not available')\n"
)
_ABSENT_CLASS = (
    "class _Absent:\n"
    "    def __init__(self, *args, **kwargs):\n"
    "        raise RuntimeError('stand-in torchvision: not available')\n"
)

STAND_IN = {
    "torchvision/__init__.py": "from . import datasets, models, transforms  # noqa: F401\n",
    "torchvision/datasets/__init__.py": _ABSENT_CLASS + (
        "from . import folder, utils  # noqa: F401\n"
        "class VisionDataset(_Absent): ...\n"
        "class CIFAR10(_Absent): ...\n"
        "class CIFAR100(_Absent): ...\n"
        "class Caltech256(_Absent): ...\n"
        "class MNIST(_Absent): ...\n"
        "class FashionMNIST(_Absent): ...\n"
    ),
    "torchvision/datasets/folder.py": _ABSENT + "default_loader = pil_loader = _absent\n",
    "torchvision/datasets/utils.py": _ABSENT + (
        "extract_archive = check_integrity = download_url = verify_str_arg = download_and_extract_archive = _absent\n"
    ),
    "torchvision/models/__init__.py": "from . import resnet  # noqa: F401\n",
    "torchvision/models/resnet.py": _ABSENT + "resnet18 = resnet34 = resnet50 = _absent\n",
    "torchvision/transforms/__init__.py": _ABSENT_CLASS + (
        "import numpy as np\n"
        "import torch\n"
        "from . import functional  # noqa: F401\n"
        "class Compose:\n"
        "    def __init__(self, transforms):\n"
        "        self.transforms = transforms\n"
        "    def __call__(self, x):\n"
        "        for t in self.transforms:\n"
        "            x = t(x)\n"
        "        return x\n"
        "class ToTensor:\n"
        "    def __call__(self, pic):\n"
        "        if not isinstance(pic, np.ndarray) or pic.dtype != np.uint8 or pic.ndim != 3:\n"
        "            raise RuntimeError('stand-in ToTensor: an H x W x C uint8 array only')\n"
        "        return torch.from_numpy(pic.transpose(2, 0, 1).copy()).float().div(255)\n"
        "class Resize:\n"
        "    def __init__(self, size, antialias=True):\n"
        "        self.size, self.antialias = tuple(size), antialias\n"
        "    def __call__(self, x):\n"
        "        return torch.nn.functional.interpolate(x[None], size=self.size, mode='bilinear',\n"
        "                                               align_corners=False, antialias=self.antialias)[0]\n"
        "class Normalize:\n"
        "    def __init__(self, mean, std):\n"
        "        self.mean, self.std = mean, std\n"
        "    def __call__(self, x):\n"
        "        mean = torch.as_tensor(self.mean, dtype=x.dtype)[:, None, None]\n"
        "        std = torch.as_tensor(self.std, dtype=x.dtype)[:, None, None]\n"
        "        return x.sub(mean).div(std)\n"
        "class RandomCrop(_Absent): ...\n"
        "class RandomHorizontalFlip(_Absent): ...\n"
    ),
    "torchvision/transforms/functional.py": _ABSENT + "pad = crop = hflip = get_image_size = resize = _absent\n",
    "model/__init__.py": (
        "# fdlit's client network in place of the authors' ResNet-20 (the script sets NETWORK)\n"
        "NETWORK = None\n"
        "def get_model(name, num_classes=10):\n"
        "    return NETWORK()\n"
    ),
}


def write_stand_ins(folder: Path) -> None:
    for name, text in STAND_IN.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


# ------------------------------------------------------------------------------ fdlit's split as images
def to_images(x: torch.Tensor):
    """fdlit's digits inputs (k / 16, k = 0..16, 1 x 8 x 8) as 8 x 8 x 3 uint8 images (grey replicated, as
    their GrayscaleToRGB): the raw form their Selective-FD transforms read."""
    import numpy as np

    levels = torch.round(x[:, 0] * 16).to(torch.int64)
    assert torch.equal(levels.double() / 16, x[:, 0].double()), "digits inputs are k / 16"
    u8 = torch.round(levels.double() * 255 / 16).to(torch.uint8).numpy()
    return [np.repeat(img[:, :, None], 3, axis=2) for img in u8]


class ImageToInput:
    """An image of :func:`to_images` back to fdlit's exact input (1 x 8 x 8, k / 16)."""

    def __call__(self, img):
        k = torch.round(torch.from_numpy(img[:, :, 0].astype("float64")) * 16 / 255)
        return (k / 16).float()[None]


class Images:
    """A raw dataset as fedlab's ``Subset`` reads one (``data``, ``targets``)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.data = to_images(x)
        self.targets = y.tolist()


class FdlitSplit:
    """Their ``PartitionedDataset`` interface over fdlit's split: each client's training rows, the public
    set (fdlit's labels, which their training never reads), the global test set for every client."""

    # the keys their Selective-FD reads: the kernel dtype (float64 for every task) and Caltech's greyscale step
    private_task, public_task = "cifar10", "cifar100"

    def __init__(self, data):
        from fedlab.contrib.dataset import Subset

        self.num_classes = data.num_classes
        self.public_size = self.public_train_size = len(data.public)
        pub = Images(data.public.x, data.public.y)
        self.public = Subset(pub, list(range(len(pub.targets))), transform=ImageToInput())
        self.private = []
        for cd in data.clients:
            raw = Images(cd.train.x, cd.train.y)
            self.private.append(Subset(raw, list(range(len(raw.targets))), transform=ImageToInput()))
        self.test = TensorDataset(data.test.x, data.test.y)
        for cd, sub in zip(data.clients, self.private, strict=True):  # the inputs their loops see are fdlit's
            assert torch.equal(torch.stack([sub[i][0] for i in range(len(sub))]), cd.train.x.float())

    def get_private_train_dataset(self, client_id):
        return self.private[client_id]

    def get_public_train_dataset(self):
        return self.public

    def get_test_dataset(self, client_id=None):
        return self.test


class FdlitNetwork:
    """fdlit's client network (their worker names no client: one initialisation for every client, seeded by
    their ``seed_everything`` before it is built)."""

    def __init__(self, model_spec, data, seed: int):
        self.model_spec, self.data, self.seed = model_spec, data, seed

    def __call__(self):
        from fdlit.federation.construction import client_network

        return client_network(self.model_spec, self.data, 0, self.seed)

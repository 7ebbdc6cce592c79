"""ResNet-18 (He et al. 2016) for the CIFAR experiments of Kovalchuk et al. 2026, without
torchvision.

Parameter names follow torchvision's ``resnet18`` (``conv1``, ``bn1``, ``layer1.0.conv1`` ...
``fc``), so ImageNet weights published for it load directly:

* ``stem="cifar"`` (CIFAR-10, Kovalchuk et al. 2026, Table 2: trained from scratch): 3x3 stride-1 first convolution and
  no max-pool, the usual CIFAR form (32x32 inputs keep a 4x4 map before pooling).
* ``stem="imagenet"`` + ``pretrained=True`` (CIFAR-100, Kovalchuk et al. 2026, Table 2: "ResNet-18,
  ImageNet-1K"): the original 7x7 stride-2 stem and max-pool, initialised from torchvision's ImageNet-1K weights
  (``IMAGENET1K_V1``) as published on the Hugging Face hub by timm (``timm/resnet18.tv_in1k``,
  ``model.safetensors``; cached by ``huggingface_hub``). The 1000-way ``fc`` is replaced by a fresh
  ``num_classes`` head. **choice** (not stated in Kovalchuk et al. 2026): inputs stay 32x32 unless ``upsample`` is set
  (e.g. 224, bilinear on the device), the classic fine-tuning recipe, at ~49x the compute.
  ``weights_path`` loads a local file instead (a ``.safetensors`` or torchvision ``.pth``).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from fdlit.errors import ConfigError, check_at_least
from fdlit.models.base import ClientNetwork

DEFAULT_WEIGHTS_REPO = "timm/resnet18.tv_in1k"


class WeightsUnavailable(ConfigError):
    """Pretrained weights are neither cached nor reachable; says how to fetch them."""


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(ClientNetwork):
    """ResNet-18 with a CIFAR or ImageNet stem; see the module docstring.

    Args:
        input_shape: (C, H, W) of the images; filled from the data.
        num_classes: output classes; filled from the data.
        stem: ``cifar`` (3x3 conv, no max-pool) or ``imagenet`` (7x7/2 conv + max-pool).
        pretrained: load ImageNet-1K weights (needs ``stem: imagenet`` and 3 input channels).
        weights_repo: hub repository holding torchvision-named ``model.safetensors``.
        weights_path: local weights file used instead of the hub.
        upsample: resize inputs to this side length (bilinear) before the stem; null keeps them.
        width: channels of the first stage (64 in ResNet-18); the stages have width, 2, 4 and 8 times
            it, and the penultimate features (``embed``) are 8 * width wide (a narrow ResNet for a CPU).
        blocks: basic blocks per stage ([2, 2, 2, 2] in ResNet-18; [1, 1, 1, 1] is ResNet-10,
            [3, 4, 6, 3] ResNet-34). ImageNet weights need both at ResNet-18's values.
    """

    def __init__(
        self,
        input_shape: tuple[int, ...] | None = None,
        num_classes: int | None = None,
        stem: Literal["cifar", "imagenet"] = "cifar",
        pretrained: bool = False,
        weights_repo: str = DEFAULT_WEIGHTS_REPO,
        weights_path: str | None = None,
        upsample: int | None = None,
        width: int = 64,
        blocks: list[int] = [2, 2, 2, 2],
    ):
        super().__init__()
        check_at_least("model.init_args.width", width, 1)
        if len(blocks) != 4 or any(not isinstance(b, int) or b < 1 for b in blocks):
            raise ConfigError("model.init_args.blocks", f"four integers >= 1 (blocks per stage), got {list(blocks)}")
        if pretrained and (width != 64 or list(blocks) != [2, 2, 2, 2]):
            raise ConfigError("model.init_args.pretrained", "ImageNet weights are ResNet-18's: width 64 and blocks "
                              f"[2, 2, 2, 2] (got width {width}, blocks {list(blocks)})")
        if stem not in ("cifar", "imagenet"):
            raise ConfigError("model.init_args.stem", f"allowed: 'cifar', 'imagenet'; got {stem!r}")
        in_ch = (input_shape or (3, 32, 32))[0]
        if pretrained and (stem != "imagenet" or in_ch != 3):
            raise ConfigError("model.init_args.pretrained",
                              f"ImageNet weights need stem: imagenet and 3 input channels (got stem={stem!r}, {in_ch} channels)")
        self.upsample = upsample
        if stem == "cifar":
            self.conv1 = nn.Conv2d(in_ch, width, 3, 1, 1, bias=False)
            self.maxpool = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(in_ch, width, 7, 2, 3, bias=False)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        inplanes = width
        for i, (planes, count) in enumerate(zip((width, 2 * width, 4 * width, 8 * width), blocks, strict=True), start=1):
            stride = 1 if i == 1 else 2
            stage = [BasicBlock(inplanes, planes, stride), *(BasicBlock(planes, planes) for _ in range(count - 1))]
            setattr(self, f"layer{i}", nn.Sequential(*stage))
            inplanes = planes
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8 * width, num_classes or 10)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        if pretrained:
            self.load_backbone(load_imagenet_weights(weights_repo, weights_path))

    def load_backbone(self, state: dict[str, torch.Tensor]) -> None:
        """Load every backbone tensor of ``state`` (torchvision names); the head stays fresh."""
        state = {k: v for k, v in state.items() if not k.startswith("fc.")}
        missing, unexpected = self.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith("fc.")]
        if missing or unexpected:
            raise ConfigError("model.init_args.weights_path",
                              f"weights do not match torchvision resnet18: missing {missing[:5]}, unexpected {unexpected[:5]}")

    def forward(self, x):
        return self.classify(self.embed(x))

    def embed(self, x):
        """The penultimate features (the pooled 8 * width channels, 512 in ResNet-18; the input of ``fc``)."""
        if self.upsample:
            x = nn.functional.interpolate(x, size=(self.upsample, self.upsample), mode="bilinear", align_corners=False)
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)

    def classify(self, features):
        return self.fc(features)


def load_imagenet_weights(repo: str = DEFAULT_WEIGHTS_REPO, path: str | None = None) -> dict[str, torch.Tensor]:
    """torchvision-named ResNet-18 ImageNet weights from a local file or the (cached) hub."""
    if path is None:
        from huggingface_hub import hf_hub_download

        try:
            path = hf_hub_download(repo, "model.safetensors")
        except Exception as exc:
            raise WeightsUnavailable(
                "model.init_args.pretrained",
                f"ImageNet ResNet-18 weights ({repo}, model.safetensors on the Hugging Face hub) are not cached and "
                f"cannot be downloaded ({type(exc).__name__}). Fetch them once:\n"
                f"    hf download {repo} model.safetensors\n"
                f"or pass a local file: --model.weights_path resnet18.safetensors (torchvision's "
                f"resnet18-f37072fd.pth also works)",
            ) from None
    if not str(path).endswith(".safetensors"):
        state = torch.load(path, map_location="cpu", weights_only=True)
        return state.get("state_dict", state)
    from safetensors.torch import load_file

    return load_file(str(path))

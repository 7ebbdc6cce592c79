"""The client's side of the upload mechanism: what leaves a client, made where the client lives.

A client's upload (the arrays its method's client part declares: its public-set logits, other rows)
is clipped and noised (local differential privacy), clipped only (central: its share of the secure
sum), and encoded on the client, so no executor — in process, Ray actor or Flower node — ever sends raw logits when the
``privacy`` section says otherwise. The mechanism and its sensitivity are fdlit.privacy.upload's; the
server's side (decoding, the secure sum's noise, the accountant) is ``UploadPrivacy.receive``.

A ``ClientRelease`` holds plain values only (the section's knobs and the method's declaration, never
the method), so it travels to workers and nodes with the client part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from fdlit.messages import Message, as_message
from fdlit.privacy.encoding import encode
from fdlit.privacy.release import KINDS, NOISED, POSITIVE_ROWS

FLOOR = 1e-2  # noisy positive rows (standard deviations) are floored (post-processing): a density needs sigma > 0
# what a client reports of its release (Message.metrics): rows clipped, rows released, noise std
DIAGNOSTICS = ("privacy/clipped_rows", "privacy/released_rows", "privacy/noise_std")


def clip_rows(x: torch.Tensor, c: float) -> tuple[torch.Tensor, int]:
    """Rows scaled to L2 norm <= c, and how many were scaled."""
    norms = x.norm(dim=-1, keepdim=True)
    factor = (c / norms.clamp_min(1e-30)).clamp(max=1.0)
    return x * factor, int((factor < 1).sum())


def gaussian_noise(shape, r: int, client: int, seed: int, std: float, device, stream: int = 0xD9) -> torch.Tensor:
    """Gaussian noise from a stream of its own per (seed, round, client): the same under every
    executor and after a resume, and no other random stream moves."""
    key = np.random.SeedSequence([seed, r, client, stream]).generate_state(1, np.uint64)[0] >> 1
    g = torch.Generator().manual_seed(int(key))
    return (torch.randn(shape, generator=g, dtype=torch.float64) * std).to(device)


@dataclass(frozen=True)
class ClientRelease:
    """What one client sends for its payload (its declared arrays, ``logits`` among them if declared): see the module
    docstring. ``noise_multiplier`` 0 and ``encoding`` full send the payload as it is (logits in
    ``dtype``); ``central`` sends the clipped logits (or probabilities, ``summed``) for the secure sum."""

    dtype: torch.dtype = torch.float32
    seed: int = 0
    noise_multiplier: float = 0.0
    clip_norm: float = 1.0
    central: bool = False
    summed: str | None = None
    encoding: str = "full"
    top_k: int = 1
    bits: int = 8
    method: str = "the method"
    released: dict[str, str] = field(default_factory=lambda: {"logits": "rows"})

    @property
    def dp(self) -> bool:
        return self.noise_multiplier > 0

    def __call__(self, r: int, client: int, payload: Message | dict[str, torch.Tensor]) -> Message:
        message = as_message(payload)
        arrays = dict(message.arrays)
        if not self.dp and self.encoding == "full":  # fdlit's plain upload, bit for bit
            if "logits" in arrays:
                arrays["logits"] = arrays["logits"].to(self.dtype)
            return message.with_arrays(arrays)
        if self.dp:
            self.check_payload(arrays)
        if "logits" not in arrays:  # the method sends no public logits: its declared rows only
            out = message.with_arrays(arrays)
            if self.dp and any(self.released.get(k) in NOISED for k in arrays):
                _, noised, clipped, std = self.privatise(r, client, None, arrays)
                out = message.with_arrays({**arrays, **noised})
                out.metrics.update(zip(DIAGNOSTICS, (clipped, sum(len(v) for v in noised.values()), std), strict=True))
            return out
        logits = arrays.pop("logits")
        if self.dp and self.central:
            x = logits.double()
            x, clipped = clip_rows(x.softmax(-1) if self.summed == "probabilities" else x, self.clip_norm)
            out = message.with_arrays({"logits": x.to(self.dtype)})
            out.metrics.update(zip(DIAGNOSTICS, (clipped, len(x), 0.0), strict=True))
            return out
        diagnostics = None
        if self.dp:
            logits, noised, clipped, std = self.privatise(r, client, logits, arrays)
            arrays.update(noised)
            diagnostics = (clipped, len(logits), std)
        out = message.with_arrays({**encode(logits, self.encoding, self.dtype, self.top_k, self.bits), **arrays})
        if diagnostics is not None:
            out.metrics.update(zip(DIAGNOSTICS, diagnostics, strict=True))
        return out

    def privatise(self, r: int, client: int, logits: torch.Tensor | None, payload: dict[str, torch.Tensor]):
        """Clip every released row to c; one Gaussian draw over the client's whole release (its logits,
        where it sends them, and every other declared row), of std sigma * Delta, Delta = 2 c sqrt(rows)."""
        others = [k for k, kind in self.released.items() if kind in NOISED and k != "logits" and k in payload]
        first = [] if logits is None else [logits.double()]
        parts = first + [payload[k].double() for k in others]
        release, clipped = clip_rows(torch.cat(parts), self.clip_norm)
        std = self.noise_multiplier * 2 * self.clip_norm * math.sqrt(len(release))  # sigma * Delta
        release = release + gaussian_noise(release.shape, r, client, self.seed, std, release.device)
        out = list(release.split([len(p) for p in parts]))
        noised = {}
        for k, noisy in zip(others, out[len(first):], strict=True):
            if self.released[k] == POSITIVE_ROWS:
                noisy = noisy.abs().clamp_min(FLOOR)
            noised[k] = noisy.to(payload[k].dtype)
        return (out[0].float() if first else None), noised, clipped, std

    def check_payload(self, payload: dict) -> None:
        """Every array sent must be declared: a method's upload that its declaration does not cover
        would leave the mechanism."""
        extra = [k for k in payload if k not in self.released]
        if extra:
            raise RuntimeError(f"{self.method} uploads {', '.join(map(repr, extra))}, which its ``released`` "
                               f"declaration ({self.released}) does not cover; declare each key's kind "
                               f"({', '.join(KINDS)})")

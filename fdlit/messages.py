"""What crosses between a client and the server: one typed message, as Flower's records keep it.

A :class:`Message` has three parts, kept apart by type, never by a key's spelling:

* ``arrays``: the tensors the method's protocol sends (logits, a density's rows, parameters, a
  keep-mask). The ledger counts every byte of every array, by its name, dtype and shape. Which of
  them are released data, and with which sensitivity, is ``sensitivity`` (name -> kind of
  ``fdlit.privacy.release``: ``rows``, ``positive_rows``, ``unbounded``, ``clear``), set on a
  round's upload from the client part's declaration (:class:`Upload` ``kind``), never by hand.
* ``metrics``: numbers a client reports for the run's log (how many density components it dropped,
  how many rows the privacy release clipped). They describe the experiment, not the method's
  protocol, so they are not in the method's ``comm/*`` bytes; a deployment sends them in Flower's
  ``MetricRecord``, and its wire count includes them.
* ``config``: settings (numbers, strings, flags) a sender tells the receiver.

A method's hook may return a plain dict of tensors: every entry is an array. :func:`as_message`
turns either into a Message; :meth:`Message.to_records` / :meth:`Message.from_records` map it to a
Flower ``RecordDict`` and back without loss (bfloat16 arrays travel as their 16-bit patterns).

What a run records crosses too, from the round to its callbacks and files: a round's metrics and the
run's summary are :data:`JSON` values (numbers, strings, flags, None, and lists and dicts of them), as
``metrics.jsonl`` and ``summary.json`` hold them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import TypeAlias

import torch

Scalar = int | float | str | bool
JSON: TypeAlias = "None | bool | int | float | str | list[JSON] | dict[str, JSON]"
Metrics: TypeAlias = "dict[str, JSON]"  # a round's metrics, or the run's summary, by name


@dataclass
class Message(MutableMapping):
    """One message; reads and writes like a dict of its arrays (``msg["logits"]``, ``"mask" in msg``)."""

    arrays: dict[str, torch.Tensor] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    config: dict[str, Scalar] = field(default_factory=dict)
    sensitivity: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.arrays[key]

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        self.arrays[key] = value

    def __delitem__(self, key: str) -> None:
        del self.arrays[key]
        self.sensitivity.pop(key, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)

    def with_arrays(self, arrays: dict[str, torch.Tensor]) -> Message:
        """The same message with other arrays (metrics, config and sensitivity kept)."""
        return Message(dict(arrays), dict(self.metrics), dict(self.config),
                       {k: v for k, v in self.sensitivity.items() if k in arrays})

    # ------------------------------------------------------------------ Flower's records
    def to_records(self):
        """A Flower ``RecordDict``: ``arrays`` (ArrayRecord), ``metrics`` (MetricRecord) and ``config``
        (ConfigRecord, with the sensitivity and the bfloat16 arrays' names as one JSON entry)."""
        from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

        bf16 = sorted(k for k, t in self.arrays.items() if t.dtype == torch.bfloat16)
        arrays = {k: Array((t.view(torch.int16) if k in bf16 else t).detach().cpu().contiguous().numpy())
                  for k, t in self.arrays.items()}
        typing = json.dumps({"sensitivity": self.sensitivity, "bfloat16": bf16})
        return RecordDict({"arrays": ArrayRecord(arrays), "metrics": MetricRecord(dict(self.metrics)),
                           "config": ConfigRecord({**self.config, _TYPING: typing})})

    @classmethod
    def from_records(cls, records) -> Message:
        config = dict(records["config"])
        typing = json.loads(config.pop(_TYPING))
        arrays = {}
        for key, array in records["arrays"].items():
            t = torch.from_numpy(array.numpy().copy())
            arrays[key] = t.view(torch.bfloat16) if key in typing["bfloat16"] else t
        return cls(arrays, dict(records["metrics"]), config, dict(typing["sensitivity"]))


_TYPING = "fdlit.message"  # the config entry that carries the arrays' sensitivity and bfloat16 names


def as_message(reply: Message | Mapping[str, torch.Tensor] | None) -> Message:
    """What a hook returned, as a Message: a Message as it is; a dict's entries as arrays."""
    if isinstance(reply, Message):
        return reply
    return Message(dict(reply or {}))


@dataclass(frozen=True)
class Upload:
    """One array a method's client part may send each round, declared on the part (``uploads``).

    ``kind``: its privacy sensitivity (``fdlit.privacy.release``: ``rows``, ``positive_rows``,
    ``clear``, ``unbounded``). ``dtype``: the dtype it must have (None: any). ``shape``: one entry per
    dimension, an int, ``"N"`` (the round's public rows), ``"C"`` (the classes) or None (any size);
    None: any shape. The name ``logits`` is the client's public-set logits: declared, they are sent
    unless the hook returns its own ``logits`` (the kept rows only, say)."""

    name: str
    kind: str = "unbounded"
    dtype: torch.dtype | None = None
    shape: tuple[int | str | None, ...] | None = None

    def problem(self, value: torch.Tensor, rows: int | None, classes: int | None) -> str | None:
        """Why ``value`` does not fit the declaration (None: it fits)."""
        if self.dtype is not None and value.dtype != self.dtype:
            return f"has dtype {value.dtype}, declared {self.dtype}"
        if self.shape is not None:
            want = [{"N": rows, "C": classes}.get(d) if isinstance(d, str) else d for d in self.shape]
            if len(want) != value.dim() or any(w not in (None, s) for w, s in zip(want, value.shape, strict=True)):
                return f"has shape {tuple(value.shape)}, declared {self.shape} (N={rows}, C={classes})"
        return None


PUBLIC_LOGITS = Upload("logits", "rows", shape=(None, "C"))  # what a part that declares nothing uploads


def metric_values(messages: list[Message], name: str) -> list[float]:
    """The metric ``name`` of every message that reports it."""
    return [float(m.metrics[name]) for m in messages if isinstance(m, Message) and name in m.metrics]


def array_bytes(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor`` as sent: its elements in its dtype; a bool mask as bits."""
    if tensor.dtype == torch.bool:
        return (tensor.numel() + 7) // 8
    return tensor.numel() * tensor.element_size()


__all__ = ["JSON", "PUBLIC_LOGITS", "Message", "Metrics", "Scalar", "Upload", "array_bytes", "as_message", "metric_values"]

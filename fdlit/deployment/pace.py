"""Flower's waits, shortened where fdlit's round sets them (Flower 1.41, pinned).

A federated-distillation round is two exchanges whose server work takes milliseconds, so Flower's
fixed waits, not the training, set a deployed round's pace (measured on digits, 3 SuperNodes on
loopback: ~5 s an exchange against 0.2 s of node CPU):

* a SuperNode that finds no message sleeps 3 s before asking the SuperLink again, and waits for
  each reply in 0.5 s steps;
* an object of a message that is not in the store yet (it is still arriving) is asked for again
  after 1 s, then 2, 4, ... up to 10 s: a message is announced before its arrays are stored, so
  the first ask often misses.

``FDLIT_FLOWER_POLL_S`` (default 0.1 s) bounds the first two and starts the backoff of the third
(capped at 1 s). The cost: a few small requests a second per idle node, on the node's own link.
"""

from __future__ import annotations

import os
import time

POLL_S = float(os.environ.get("FDLIT_FLOWER_POLL_S", "0.1"))


class ShortSleeps:
    """The ``time`` module as one Flower module sees it: every sleep at most ``POLL_S``."""

    def __getattr__(self, name: str):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, POLL_S))


def short_object_pulls() -> None:
    """Objects still arriving are asked for again after ``POLL_S``, backing off to 1 s (not 1 to 10 s)."""
    from flwr.supercore.inflatable import inflatable_utils

    for fn in (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree):
        fn.__kwdefaults__.update(initial_backoff=POLL_S, backoff_cap=max(POLL_S, 1.0))


def short_supernode_polls() -> None:
    """The SuperNode's loop: asks again after ``POLL_S`` when no message came, checks for replies as often."""
    from flwr.supernode import start_client_internal

    start_client_internal.time = ShortSleeps()  # that module's own sleeps only; the rest of Flower is untouched

"""Flower's waits, shortened or replaced by wake-ups where fdlit's round sets them (Flower 1.41, 1.42).

A federated-distillation round is two exchanges whose server work takes milliseconds, so Flower's
fixed waits, not the training, set a deployed round's pace (measured on digits, 3 SuperNodes on
loopback: ~5 s an exchange against 0.2 s of node CPU with Flower's waits):

* a SuperNode that finds no message sleeps 3 s before asking the SuperLink again; here it asks again
  after as long as it has been idle (30 ms at first, ``POLL_S`` at most): the next message of a round
  follows the last reply within a fraction of a second, an idle node slows down, and every ask is a
  request the SuperLink serves (on a 2-core machine shorter first polls were no faster);
* it waits for each reply in 0.5 s steps; here fdlit's task runner wakes it the moment it stored the
  reply (:data:`REPLY_STORED`), ``POLL_S`` being the fallback;
* the task runner takes a task once the SuperNode has stored the whole message
  (:data:`MESSAGE_STORED`): Flower creates the task before the message's arrays arrived, and a
  runner that takes it early waits for them in steps;
* an object of a message that is not in the store yet (it is still arriving) is asked for again
  after 1 s, then 2, 4, ... up to 10 s; here after ``POLL_S`` / 10, backing off to ``POLL_S``.

``FDLIT_FLOWER_POLL_S`` (default 0.1 s) is the longest of these waits. The cost: ten small requests
a second per idle node, on the node's own link, a few more in the moments after it worked.

These are Flower's private names: each is checked first (:mod:`fdlit.internals`); one that moved
leaves Flower's own wait in place (slower rounds, the same results) and says so once.
"""

from __future__ import annotations

import os
import threading
import time

from fdlit.internals import MovedInternal, check_keyword_defaults, expect_function, fell_back, set_keyword_defaults

POLL_S = float(os.environ.get("FDLIT_FLOWER_POLL_S", "0.1"))
FIRST_POLL_S = 0.03

MESSAGE_STORED = threading.Event()  # the SuperNode stored a message with all its objects: a task is ready
REPLY_STORED = threading.Event()  # the task runner stored a reply in the SuperNode: it can go up


class SuperNodeClock:
    """The ``time`` module as Flower's SuperNode loop sees it: its idle sleep (3 s) becomes a short,
    adaptive poll, its other waits (for a reply, for an object's content) end when a reply is stored."""

    last_work = time.monotonic()

    def __getattr__(self, name: str):
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        if seconds >= 3.0:  # the idle poll: soon after work, slower as the node idles
            time.sleep(min(POLL_S, max(FIRST_POLL_S, time.monotonic() - self.last_work)))
        elif REPLY_STORED.wait(min(seconds, POLL_S)):
            REPLY_STORED.clear()


def short_object_pulls() -> bool:
    """Objects still arriving are asked for again after ``POLL_S`` / 10, backing off to ``POLL_S``.
    False (and one note) where Flower's pull functions lack those keyword-only defaults."""
    try:
        from flwr.supercore.inflatable import inflatable_utils as utils

        pulls = [expect_function(utils, n) for n in ("pull_objects", "pull_and_inflate_object_from_tree")]
        for fn in pulls:  # both checked before either changes
            check_keyword_defaults(fn, "initial_backoff", "backoff_cap")
    except (ImportError, MovedInternal) as exc:
        fell_back(f"{exc}: message objects still arriving are retried at Flower's pace (slower rounds)")
        return False
    for fn in pulls:
        set_keyword_defaults(fn, initial_backoff=POLL_S / 10, backoff_cap=POLL_S)
    return True


LOOP_PARAMETERS = {"_pull_and_store_message": ("state", "object_store", "receive"),
                   "_push_messages": ("state", "object_store", "send")}


def short_supernode_polls() -> bool:
    """The SuperNode's loop: polls soon after work, sends a reply once stored, announces stored messages.
    False (and one note) where the loop's module is not the one expected: Flower's own waits stay."""
    try:
        from flwr.supernode import start_client_internal as loop

        pull_and_store, push = (expect_function(loop, n, p) for n, p in LOOP_PARAMETERS.items())
        if getattr(loop, "time", None) is not time:
            raise MovedInternal(f"{loop.__name__} does not wait through the time module")
    except (ImportError, MovedInternal) as exc:
        fell_back(f"{exc}: the SuperNode polls at Flower's pace (slower rounds)")
        return False
    clock = SuperNodeClock()

    def pull_and_store_message(*args, **kwargs):
        run_id = pull_and_store(*args, **kwargs)
        if run_id is not None:
            clock.last_work = time.monotonic()
            MESSAGE_STORED.set()
        return run_id

    def push_messages(*args, **kwargs):
        push(*args, **kwargs)
        clock.last_work = time.monotonic()

    loop.time = clock  # that module's own sleeps only; the rest of Flower is untouched
    loop._pull_and_store_message, loop._push_messages = pull_and_store_message, push_messages
    return True

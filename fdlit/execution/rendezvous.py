"""Several federations in one process, their clients' work stacked together.

Each federation (a run of a sweep) keeps its own loop, server, metrics and files, and runs in its own
thread; its executor is a :class:`StackedRunExecutor`, which hands the heavy calls (``train``,
``predict``) to a shared :class:`Rendezvous`. Only one federation's thread runs at a time, in a fixed
order, each with its own global random state (torch, NumPy, Python), restored when it gets its turn:
the runs interleave deterministically and draw exactly what they draw alone. When every live run is
parked on a call, calls that compute alike (:mod:`fdlit.execution.stack_keys`: the same method,
phase, epochs, batch size, padded width, network, client step and optimizer kind; ``predict`` on the
same inputs) run as one call of the first run's vectorized executor over all their clients, and each
run gets its own clients' share of the result. A vectorized client's computation is its own whatever
the stack holds, so a stacked run computes what it computes alone (within float rounding where a
kernel's reduction spans the stack: the grouped convolutional forward). Calls that merge with nothing
(the sequential executor, a network of its own) run alone, as in a separate run.

A run that raises leaves the rendezvous and fails alone; the others go on. A merged call that raises
is run again run by run (the clients' batch-order generators are restored first: a vectorized phase
writes parameters and optimizer state back only at its end), so only the faulty run fails.
"""

from __future__ import annotations

import copy
import functools
import random
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fdlit.execution import steps
from fdlit.execution.executor import ClientExecutor, SequentialExecutor
from fdlit.execution.stack_keys import predict_key, train_key, twins
from fdlit.execution.vectorized import VectorizedExecutor

STACKABLE = (SequentialExecutor, VectorizedExecutor)  # executors in the loop's process, whose calls we can merge


def stackable_executor(executor: ClientExecutor | None) -> bool:
    """Whether a run with this ``federation.executor`` can run in a rendezvous (null: chosen at set-up,
    always sequential or vectorized)."""
    return executor is None or type(executor) in STACKABLE


class StackStopped(BaseException):
    """Raised in a stacked run's thread when the stack stops (Ctrl-C): the run unwinds as an
    interrupted run does, releasing its run directory; not a failure of the run."""


@dataclass
class Call:
    """One run's parked executor call."""

    run: StackedRunExecutor
    method: str  # "train" or "predict"
    clients: Sequence[Any]
    args: tuple
    key: tuple | None  # calls with equal keys compute alike and may run as one; None: alone

    def alone(self) -> Any:
        return getattr(self.run.inner, self.method)(self.clients, *self.args)


@dataclass
class _Member:
    name: str
    turn: bool = False
    alive: bool = True
    instruction: tuple | None = ("start",)  # what the thread does when it next gets its turn
    call: Call | None = None
    rng: tuple | None = None
    outcome: Any = None
    error: BaseException | None = None
    rounds: list = field(default_factory=list)


def _rng_state() -> tuple:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), np.random.get_state(), random.getstate(), cuda


def _set_rng_state(state: tuple) -> None:
    cpu, numpy_state, python_state, cuda = state
    torch.set_rng_state(cpu)
    np.random.set_state(numpy_state)
    random.setstate(python_state)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


class Rendezvous:
    """Runs bodies (one per run) in threads, one at a time, and merges their parked executor calls."""

    def __init__(self):
        self._cond = threading.Condition()
        self.members: list[_Member] = []
        self.merged_calls = 0  # calls that ran as one for several runs
        self.alone_calls = 0
        self.twin_calls = 0  # runs' calls not computed: bit for bit another run's of the same merged call
        self._random_keys: set[tuple] = set()  # keys whose merged call drew from the global generator

    # ------------------------------------------------------------------ the run threads' side
    def _wait_turn(self, member: _Member) -> None:
        with self._cond:
            self._cond.wait_for(lambda: member.turn)

    def _give_back(self, member: _Member) -> None:
        with self._cond:
            member.turn = False
            self._cond.notify_all()
            self._cond.wait_for(lambda: member.turn)

    def call(self, member: _Member, call: Call) -> Any:
        """Park ``call`` until every live run is parked, then return its result (run merged or alone)."""
        member.call, member.instruction = call, None
        self._give_back(member)
        kind, *payload = member.instruction
        member.instruction, member.call = None, None
        if kind == "stop":
            raise StackStopped("another run of the stack was interrupted")
        return self._execute(payload[0]) if kind == "execute" else payload[0]

    def _thread(self, member: _Member, body: Callable[[], Any]) -> None:
        self._wait_turn(member)
        stopped, member.instruction = member.instruction == ("stop",), None
        try:
            if stopped:
                raise StackStopped("another run of the stack was interrupted before this one started")
            member.outcome = body()
        except BaseException as exc:  # this run fails alone; the others go on
            member.error = exc
        finally:
            with self._cond:
                member.alive, member.turn = False, False
                self._cond.notify_all()

    # ------------------------------------------------------------------ the coordinator
    def join(self, name: str) -> _Member:
        """A run's place in the rendezvous (its executor parks its calls there)."""
        self.members.append(_Member(name))
        return self.members[-1]

    def run(self, bodies: Sequence[Callable[[], Any]]) -> list[tuple[Any, BaseException | None]]:
        """Run the members' bodies (in the order they joined); returns each one's (what it returned,
        None) or (None, the exception it raised)."""
        threads = [threading.Thread(target=self._thread, args=(m, body), name=f"fdlit-stack-{m.name}", daemon=True)
                   for m, body in zip(self.members, bodies, strict=True)]
        for t in threads:
            t.start()
        start = _rng_state()
        for m in self.members:
            m.rng = start  # each run seeds its own generators in set-up, as alone
        try:
            self._coordinate()
        except BaseException:  # Ctrl-C (here or in a run): every run unwinds (its run directory released), then stop
            self._stop()
            raise
        finally:
            _set_rng_state(start)
        for t in threads:
            t.join()
        return [(m.outcome, m.error) for m in self.members]

    def _coordinate(self) -> None:
        while any(m.alive for m in self.members):
            ready = [m for m in self.members if m.alive and m.instruction is not None]
            if ready:
                for m in ready:
                    self._resume(m)
                    if m.error is not None and not isinstance(m.error, Exception):
                        raise m.error  # Ctrl-C, SystemExit in a run: the whole stack stops, as a sweep does
                continue
            waiting = [m for m in self.members if m.alive and m.call is not None and not m.call.run.assigned]
            if not waiting:  # cannot happen: every live run is parked or has its turn
                raise RuntimeError("stacked runs: no run can continue")
            for group in self._groups([m.call for m in waiting]):
                for c in group:
                    c.run.assigned = True
                group[0].run.member.instruction = ("execute", group)

    def _stop(self) -> None:
        with self._cond:  # a run that has its turn goes on to its next call first
            self._cond.wait_for(lambda: not any(m.turn for m in self.members))
        for m in self.members:
            if m.alive:
                m.instruction = ("stop",)
                self._resume(m)

    def _resume(self, member: _Member) -> None:
        _set_rng_state(member.rng)
        with self._cond:
            member.turn = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not member.turn)
        member.rng = _rng_state()

    def _groups(self, calls: list[Call]) -> list[list[Call]]:
        """Calls that can run as one, in the runs' order; a call whose key is None or shared with no
        other call is a group of its own. ``predict`` calls merge only on equal inputs."""
        groups: list[list[Call]] = []
        for c in calls:
            for g in groups:
                head = g[0]
                if (c.key is not None and c.key == head.key and c.key not in self._random_keys
                        and head.run.inner.fabric.device == c.run.inner.fabric.device
                        and (c.method != "predict" or _same_tensor(c.args[0], head.args[0]))):
                    g.append(c)
                    break
            else:
                groups.append([c])
        return groups

    # ------------------------------------------------------------------ execution (in the leader's turn)
    def _execute(self, group: list[Call]) -> Any:
        """Run ``group`` (its first call is this thread's); deliver the others' results; return ours."""
        for c in group:
            c.run.assigned = False
        if len(group) == 1:
            self.alone_calls += 1
            return group[0].alone()
        try:
            results = self._merged(group)
        except Exception as exc:  # rerun each alone, so only the faulty run fails
            print(f"fdlit: a stacked {group[0].method} call failed ({type(exc).__name__}: {exc}); "
                  "running its runs one by one", file=sys.stderr)
            for c in group[1:]:
                c.run.member.instruction = ("execute", [c])
            return group[0].alone()
        self.merged_calls += 1
        for c, result in zip(group[1:], results[1:], strict=True):
            c.run.member.instruction = ("result", result)
        return results[0]

    def _merged(self, group: list[Call]) -> list[Any]:
        """One call of the first run's executor over the group's clients. A run whose clients and
        inputs are bit for bit another's of the group (seeds shared, settings that act later: the
        first round of a sweep over a server knob) is not computed again: it gets that run's result
        and, after training, its clients' state."""
        source = twins(group)
        unique = [c for c, s in zip(group, source, strict=True) if s is None]
        inner = unique[0].run.inner
        clients = [client for c in unique for client in c.clients]
        known = inner._keys  # the leader's executor groups the clients by id: every id must be one it stacks
        head_key = known[unique[0].clients[0].client_id]
        if any(known.get(cl.client_id) != head_key or cl.client_id not in inner._vectorized for cl in clients):
            raise ValueError("client ids outside the first run's architecture group")
        rng = torch.get_rng_state()
        counts = [len(c.clients) for c in unique]
        if group[0].method == "train":
            phase, _, epochs, batch_size = group[0].args
            generators = [cl.generator.get_state() for cl in clients]
            progress, inner.progress = inner.progress, None
            chunk, inner.chunk_size = inner.chunk_size, inner.chunk_size or cpu_chunk(clients, counts)
            inner.runs = {id(cl): i for i, c in enumerate(unique) for cl in c.clients}  # each run's update its own
            try:
                out = inner.train(clients, phase, [d for c in unique for d in c.args[1]], epochs, batch_size)
            except Exception:
                for cl, state in zip(clients, generators, strict=True):
                    cl.generator.set_state(state)
                raise
            finally:
                inner.progress, inner.chunk_size, inner.runs = progress, chunk, None
            computed = [out[sum(counts[:i]) : sum(counts[: i + 1])] for i in range(len(unique))]
        else:
            chunk, inner.chunk_size = inner.chunk_size, inner.chunk_size or cpu_chunk(clients, counts)
            try:
                computed = list(torch.split(inner.predict(clients, group[0].args[0]), counts))
            finally:
                inner.chunk_size = chunk
        if not torch.equal(rng, torch.get_rng_state()):  # e.g. dropout under vmap: not what the runs draw alone
            self._random_keys.add(group[0].key)
            print("fdlit: a stacked step drew from the global random generator; such steps now run run by run "
                  "(the runs of this step are not bit-comparable to separate runs)", file=sys.stderr)
        results: list[Any] = []
        for c, s in zip(group, source, strict=True):
            if s is None:
                results.append(computed.pop(0))
                continue
            self.twin_calls += 1
            twin = group[s]
            if c.method == "train":
                for mine, theirs in zip(c.clients, twin.clients, strict=True):
                    mine.load_client_state(copy.deepcopy(theirs.client_state()))  # nothing shared afterwards
                results.append(list(results[s]))
            else:
                results.append(results[s].clone())
        if group[0].method == "train":
            for c in group:
                steps.report(c.run, group[0].args[0], len(c.clients), len(c.clients))
        return results


def cpu_chunk(clients: Sequence[Any], counts: list[int]) -> int | None:
    """On a CPU, convolutional clients are stacked no more than one run's at a time: the grouped
    network's cost per client grows with the stack there (LeNet-5: 33, 41 and 50 ms per client and
    epoch in stacks of 20, 60 and 180), so the runs' calls still run as one (and twins are still
    computed once) but in chunks of a run's clients, each the stack the run has alone."""
    first = clients[0]
    if first.device.type != "cpu" or not any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in first.modules()):
        return None
    return max(counts)


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    return bool(torch.equal(a, b))


class StackedRunExecutor(ClientExecutor):
    """One run's executor in a rendezvous: ``train`` and ``predict`` go through the rendezvous to
    ``inner`` (this run's own executor; null: chosen at set-up as the loop chooses), everything else
    straight to ``inner``. The round's composite steps (client step, distillation, evaluation) are
    the base class's, built on those two, so they merge too."""

    def __init__(self, rendezvous: Rendezvous, inner: ClientExecutor | None, loop: Any):
        self.rendezvous, self.inner, self.loop = rendezvous, inner, loop
        self.member: _Member | None = None
        self.assigned = False

    def setup(self, fabric, clients) -> None:
        if self.inner is None:
            from fdlit.execution import select_executor

            s = self.loop.settings
            self.inner = select_executor(clients, s.precision, sample=self.loop.parts.tensors.public_x[:1])
        steps.configure(self.inner, self.compile_backend)
        self.inner.setup(fabric, clients)
        self.inner.progress = functools.partial(steps.report, self)

    def train(self, clients, phase, datasets, epochs, batch_size):
        key = train_key(self.inner, clients, phase, datasets, epochs, batch_size)
        return self.rendezvous.call(self.member, Call(self, "train", clients, (phase, datasets, epochs, batch_size),
                                                       key))

    def predict(self, clients, x):
        return self.rendezvous.call(self.member, Call(self, "predict", clients, (x,), predict_key(self.inner, clients, x)))

    def fetch_states(self, clients):
        return self.inner.fetch_states(clients)

    def push_states(self, clients) -> None:
        self.inner.push_states(clients)

    def teardown(self, clients) -> None:
        self.inner.teardown(clients)

    def unreachable(self):
        return self.inner.unreachable()

    def timing_metrics(self):
        return steps.timing_metrics(self.inner)

    def logged_values(self):
        return steps.logged_values(self.inner)


def fit_stacked(loops: Sequence[Any], names: Sequence[str] | None = None,
                fits: Sequence[Callable[[], Any]] | None = None,
                rendezvous: Rendezvous | None = None) -> list[tuple[Any, BaseException | None]]:
    """Fit federations (:class:`~fdlit.federation.FederationLoop`, not yet set up) stacked in one process;
    returns each one's (summary, None) or (None, the exception that stopped it). ``fits``: what runs
    each one instead of ``loop.fit`` (an Experiment's ``fit``, which adds its run directory and W&B run);
    ``rendezvous``: a new one's (its counts say how many calls merged)."""
    rendezvous = rendezvous if rendezvous is not None else Rendezvous()
    names = list(names) if names is not None else [f"run{i}" for i in range(len(loops))]
    executors = []
    for loop in loops:
        if not stackable_executor(loop.settings.executor):
            raise ValueError(f"federation.executor {type(loop.settings.executor).__name__} cannot be stacked")
        executor = StackedRunExecutor(rendezvous, loop.settings.executor, loop)
        loop.settings.executor = executor
        executors.append(executor)
    for executor, name in zip(executors, names, strict=True):
        executor.member = rendezvous.join(name)
    try:
        outcome = rendezvous.run(list(fits or [loop.fit for loop in loops]))
    finally:
        for loop, executor in zip(loops, executors, strict=True):
            if executor.inner is not None:  # the run's own executor again, as a separate run leaves it
                loop.settings.executor = executor.inner
    return outcome

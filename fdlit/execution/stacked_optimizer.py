"""One optimizer update for a whole stack of clients (the vectorized executor's): Adam / AdamW through
torch.optim's fused kernel (per-client step counts and learning rates), SGD with torch.optim's
single-tensor arithmetic; state is written back into each client's own ``torch.optim`` optimizer,
in its own format, at the end of a phase."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from fdlit.execution.stacking import ParamStack, Stacked, is_transposed, scalar_dtype, select_rows

if TYPE_CHECKING:
    from fdlit.clients import ClientModule

def _fused_adam_kernel(decoupled: bool, like: torch.Tensor):
    """``torch._fused_adam(w)_`` when torch has a fused kernel for this device and dtype, else None."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    if like.device.type not in _get_fused_kernels_supported_devices():
        return None
    if like.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return None
    return getattr(torch, "_fused_adamw_" if decoupled else "_fused_adam_", None)




class StackedOptimizer:
    """Adam / AdamW / SGD of M clients on stacked parameters, with per-client step counts and
    learning rates. Adam uses torch.optim's fused kernel (the arithmetic of ``fused=True``, within
    a few float ulps of the default single-tensor Adam); SGD, and Adam on devices without a fused
    kernel, follow torch.optim's single-tensor arithmetic. State is read from and written back to
    each client's own optimizer."""

    def __init__(self, clients: Sequence[ClientModule], stack: ParamStack, runs: Sequence[int] | None = None):
        self.clients, self.stack = clients, stack
        # the run of each client where one call holds several runs' clients (a stacked sweep): each
        # run's rows are updated as a stack of their own, so the path the update takes (one fused call
        # over the stack when every client is at the same step, one per client otherwise: they round
        # differently) is the run's alone whichever runs share the call
        self.runs = None if runs is None else torch.tensor(list(runs))
        self.optimizers = [c.configure_optimizers() for c in clients]
        opt = self.optimizers[0]
        group = opt.param_groups[0]
        self.kind = "sgd" if isinstance(opt, torch.optim.SGD) else "adam"
        self.decoupled = isinstance(opt, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay"))
        self.weight_decay = group["weight_decay"]
        # learning rates, step counts and "has state" live on the CPU: known without a device sync
        self.lr = torch.tensor([o.param_groups[0]["lr"] for o in self.optimizers], dtype=torch.float64)
        states = [[o.state.get(p, {}) for p in c.model.parameters()] for o, c in zip(self.optimizers, clients, strict=True)]
        self.has_state = torch.tensor([bool(st[0]) for st in states])

        def gather(key: str) -> Stacked:
            return [torch.empty_like(p).copy_(torch.stack([  # in the params' layout
                        st[k][key].to(p.dtype) if st[k] and st[k].get(key) is not None else torch.zeros_like(p[0])
                        for st in states]))
                    for k, p in enumerate(stack.params)]

        if self.kind == "adam":
            self.beta1, self.beta2 = group["betas"]
            self.eps = group["eps"]
            self.exp_avg, self.exp_avg_sq = gather("exp_avg"), gather("exp_avg_sq")
            self.step_count = torch.tensor([float(st[0]["step"]) if st[0] else 0.0 for st in states],
                                           dtype=torch.float64)
            self.step_dtype = states[0][0]["step"].dtype if states[0][0] else scalar_dtype()
            self.fused = _fused_adam_kernel(self.decoupled, stack.params[0])
            self._device_step: torch.Tensor | None = None  # the step count a captured update reads
        else:
            self.momentum = group["momentum"]
            self.buf = gather("momentum_buffer") if self.momentum else None

    def step(self, p: Stacked, g: Stacked, rows: torch.Tensor | None) -> None:
        """Update p (the rows ``rows`` (CPU indices) of the stack, or all of it) with gradients g,
        each run's rows on their own (``runs``)."""
        if self.runs is not None:
            runs = self.runs if rows is None else self.runs[rows]
            cuts = ((runs[1:] != runs[:-1]).nonzero().squeeze(1) + 1).tolist()
            if cuts:
                bounds = [0, *cuts, len(runs)]
                for a, b in zip(bounds[:-1], bounds[1:], strict=True):  # slices: updated in place
                    # all rows: the run's moments as views of the stack (the same elements in the
                    # same layout as a gathered copy, without the gather and scatter per step)
                    self._step([t[a:b] for t in p], [t[a:b] for t in g], slice(a, b) if rows is None else rows[a:b])
                return
        self._step(p, g, rows)

    def _step(self, p: Stacked, g: Stacked, rows: torch.Tensor | slice | None) -> None:
        """Update p (the rows ``rows`` of the stack: CPU indices or a slice; or all of it) in place
        with gradients g. Adam runs torch.optim's fused kernel where the device has one, else
        torch.optim's single-tensor arithmetic (with per-client scalars broadcast when the updated
        clients differ in learning rate or step count)."""
        device, dt = p[0].device, p[0].dtype
        dev_rows = rows.to(device) if isinstance(rows, torch.Tensor) else rows
        if rows is None:
            pick = lambda ts: ts  # noqa: E731
        elif isinstance(rows, slice):
            pick = lambda ts: [t[rows] for t in ts]  # noqa: E731  (views: updated in place)
        else:
            pick = lambda ts: [select_rows(t, dev_rows) for t in ts]  # noqa: E731
        lr = self.lr if rows is None else self.lr[rows]
        uniform_lr = bool((lr == lr[0]).all())

        def per_client(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
            # M float64 scalars -> M x 1 x ... on the device, broadcasting against ``like``
            return values.to(device=device, dtype=dt).view(-1, *[1] * (like.dim() - 1))

        wd = self.weight_decay
        if self.kind == "sgd":
            has = (self.has_state if rows is None else self.has_state[rows]).to(device)
            bufs = pick(self.buf) if self.momentum != 0 else [None] * len(p)
            for pk, gk, buf in zip(p, g, bufs, strict=True):
                if wd != 0:
                    gk = gk.add(pk, alpha=wd)
                if buf is not None:
                    if bool(has.all()):
                        buf.mul_(self.momentum).add_(gk)
                    else:  # first step of a client: buf = grad (torch.optim clones the gradient)
                        buf.copy_(torch.where(per_client(has, buf).bool(), buf.mul(self.momentum).add_(gk), gk))
                    gk = buf
                if uniform_lr:
                    pk.add_(gk, alpha=-float(lr[0]))
                else:
                    pk.add_(per_client(-lr, gk) * gk)
            if self.momentum != 0:
                self._put(self.buf, bufs, dev_rows)
            self._mark(rows)
            return
        step = (self.step_count if rows is None else self.step_count[rows]) + 1
        uniform = uniform_lr and bool((step == step[0]).all())
        exp_avg, exp_avg_sq = pick(self.exp_avg), pick(self.exp_avg_sq)
        if self.fused is not None:
            self._fused_step(p, g, exp_avg, exp_avg_sq, lr, step, uniform)
        else:
            for args in zip(p, g, exp_avg, exp_avg_sq, strict=True):
                self._reference_step(*args, lr, step, uniform, per_client)
        if rows is None:
            self.step_count = step
        else:
            self.step_count[rows] = step
            self._put(self.exp_avg, exp_avg, dev_rows)
            self._put(self.exp_avg_sq, exp_avg_sq, dev_rows)
        self._mark(rows)

    def _reference_step(self, p, g, exp_avg, exp_avg_sq, lr, step, uniform, per_client) -> None:
        """torch.optim's single-tensor Adam arithmetic on one stacked parameter."""
        wd = self.weight_decay
        if wd != 0:
            if self.decoupled:
                p.mul_(1 - float(lr[0]) * wd if uniform else per_client(1 - lr * wd, p))
            else:
                g = g.add(p, alpha=wd)
        exp_avg.lerp_(g, 1 - self.beta1)
        exp_avg_sq.mul_(self.beta2).addcmul_(g, g, value=1 - self.beta2)
        if uniform:
            n = float(step[0])
            bias_correction1 = 1 - self.beta1**n
            bias_correction2 = 1 - self.beta2**n
            step_size = float(lr[0]) / bias_correction1
            denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(self.eps)
            p.addcdiv_(exp_avg, denom, value=-step_size)
        else:
            # per-client bias corrections, in double like torch.optim's Python floats
            bias_correction1 = 1 - self.beta1**step
            bias_correction2 = 1 - self.beta2**step
            denom = (exp_avg_sq.sqrt() / per_client(bias_correction2**0.5, p)).add_(self.eps)
            p.add_(per_client(-(lr / bias_correction1), p) * exp_avg / denom)  # = addcdiv_ with value

    def _fused_step(self, p, g, exp_avg, exp_avg_sq, lr, step, uniform, steps=None) -> None:
        """torch.optim's fused Adam/AdamW kernel (``fused=True``): one pass over the stack instead
        of ~8 (it was 20 % of a vectorized round on CPU). It reads the step count from a tensor
        per parameter, so clients at different steps or learning rates go in row by row, in one
        call per learning rate, each row with its client's step. ``steps``: the step count as device
        tensors, one per parameter (a captured update), instead of ``step``."""
        kwargs = dict(beta1=self.beta1, beta2=self.beta2, weight_decay=self.weight_decay, eps=self.eps,
                      amsgrad=False, maximize=False)
        # the kernel walks raw memory: weight, gradient and moments in one layout, contiguous (a
        # transposed stack goes in as its contiguous transpose, the same elements in the same order)
        g = [gk if gk.stride() == pk.stride() else torch.empty_like(pk).copy_(gk) for pk, gk in zip(p, g, strict=True)]
        p, g, exp_avg, exp_avg_sq = ([t.transpose(1, 2) if is_transposed(t) else t for t in ts]
                                     for ts in (p, g, exp_avg, exp_avg_sq))
        device = p[0].device
        if uniform:
            steps = steps or [torch.full((), float(step[0]), dtype=torch.float32, device=device)] * len(p)
            self.fused(p, g, exp_avg, exp_avg_sq, [], steps, lr=float(lr[0]), **kwargs)
            return
        for value in lr.unique().tolist():
            rows = (lr == value).nonzero().squeeze(1).tolist()
            steps = [torch.full((), float(step[j]), dtype=torch.float32, device=device) for j in rows]
            self.fused([t[j] for j in rows for t in p], [t[j] for j in rows for t in g],
                       [t[j] for j in rows for t in exp_avg], [t[j] for j in rows for t in exp_avg_sq], [],
                       [steps[r] for r in range(len(rows)) for _ in p], lr=value, **kwargs)

    def graph_safe(self) -> bool:
        """Whether the update can run inside a captured step (:mod:`fdlit.execution.graph_step`):
        Adam with the fused kernel, one learning rate and one step count for the whole stack."""
        return (self.kind == "adam" and self.fused is not None and bool((self.lr == self.lr[0]).all())
                and bool((self.step_count == self.step_count[0]).all()))

    def prepare_graph_step(self) -> None:
        """Before a captured update: the step it makes is counted on the CPU (as :meth:`step`
        counts it) and written to the device tensor the update reads, without a device sync."""
        step = self.step_count + 1
        if self._device_step is None:
            self._device_step = torch.zeros((), dtype=torch.float32, device=self.stack.params[0].device)
        self._device_step.fill_(float(step[0]))
        self.step_count = step
        self._mark(None)

    def graph_step(self, p: Stacked, g: Stacked) -> None:
        """The fused Adam update of the whole stack as :meth:`step` makes it, its step count read
        from the device tensor :meth:`prepare_graph_step` sets (a capture records the tensor, not
        its value)."""
        self._fused_step(p, g, self.exp_avg, self.exp_avg_sq, self.lr, None, True, [self._device_step] * len(p))

    @staticmethod
    def _put(target: Stacked, value: Stacked, rows: torch.Tensor | slice | None) -> None:
        if isinstance(rows, slice):  # views of the target: already in place
            return
        for t, v in zip(target, value, strict=True):
            if rows is None:
                if v is not t:
                    t.copy_(v)
            else:
                t.index_copy_(0, rows, v)

    def _mark(self, rows: torch.Tensor | slice | None) -> None:
        if rows is None:
            self.has_state.fill_(True)
        else:
            self.has_state[rows] = True

    def write_back(self) -> None:
        """Optimizer state in torch.optim's per-parameter format (clients that never stepped keep
        an empty state, as in torch.optim)."""
        for i, (c, o) in enumerate(zip(self.clients, self.optimizers, strict=True)):
            if not bool(self.has_state[i]):
                continue
            params = list(c.model.parameters())
            if self.kind == "adam":
                step = torch.tensor(float(self.step_count[i]), dtype=self.step_dtype)
                for p, m1, m2 in zip(params, self.exp_avg, self.exp_avg_sq, strict=True):
                    o.state[p] = {"step": step.clone(), "exp_avg": _like(p, m1[i]), "exp_avg_sq": _like(p, m2[i])}
            elif self.momentum != 0:
                for p, b in zip(params, self.buf, strict=True):
                    o.state[p] = {"momentum_buffer": _like(p, b[i])}


def _like(param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """A copy of ``value`` in ``param``'s memory layout (channels-last weights keep channels-last
    state, as torch.optim creates it; its fused kernels need one layout for both)."""
    return torch.empty_like(param).copy_(value)

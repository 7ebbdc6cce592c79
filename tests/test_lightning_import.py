"""fdlit imports Lightning with torchmetrics' package ``__init__`` (and so its optional backends) and
``torch._dynamo`` deferred (fdlit.clients.lightning_import); what it defers still behaves as the real
thing once loaded. Each check runs in a fresh interpreter: the point is what one process imports."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFERRED = ("transformers", "scipy", "sympy", "sklearn", "pandas", "torch._dynamo", "torchmetrics.functional")


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_clients_are_lightning_modules_without_the_deferred_imports():
    out = _run(f"""
import sys
from fdlit.clients import ClientModule
import lightning.pytorch as pl
assert issubclass(ClientModule, pl.LightningModule)
assert "torchmetrics" in sys.modules  # Lightning's own import, kept
print("LOADED=" + ",".join(m for m in {DEFERRED!r} if m in sys.modules))
""")
    assert out.strip().splitlines()[-1] == "LOADED="


def test_deferred_dynamo_is_the_real_one_once_loaded():
    """Lightning's ``OptimizedModule`` answers as torch's does once torch._dynamo is imported, so
    Fabric unwraps a compiled module; ``torch.compiler.disable``'d Lightning code still runs."""
    _run("""
import sys, torch
import fdlit.clients.client
from lightning.fabric import wrappers
from lightning.pytorch.utilities.compile import from_compiled, to_uncompiled
net = torch.nn.Linear(3, 2)
assert "torch._dynamo" not in sys.modules
assert not isinstance(net, wrappers.OptimizedModule)
compiled = torch.compile(net, backend="eager")  # imports the real torch._dynamo
import torch._dynamo
assert type(sys.modules["torch._dynamo"]).__name__ == "module" and hasattr(torch._dynamo, "reset")
assert isinstance(compiled, wrappers.OptimizedModule) and not isinstance(net, wrappers.OptimizedModule)
assert issubclass(type(compiled), wrappers.OptimizedModule)
unwrapped, kwargs = wrappers._unwrap_compiled(compiled)
assert unwrapped is net and kwargs is not None
assert torch.allclose(compiled(torch.ones(1, 3)), net(torch.ones(1, 3)))
""")


def test_stand_in_disable_calls_through_before_and_after_dynamo():
    _run("""
import sys
from fdlit.clients import lightning_import as li
calls = []
f = li.disable(lambda x: calls.append(x) or x + 1)
assert f(1) == 2 and "torch._dynamo" not in sys.modules
import torch._dynamo
assert f(2) == 3 and calls == [1, 2]
""")


def test_backends_are_answered_truly_and_a_metric_plots():
    out = _run("""
import sys
import fdlit.clients.client
from lightning_utilities.core.imports import RequirementCache, package_available
assert package_available("scipy") and bool(RequirementCache("scipy")) and bool(RequirementCache("matplotlib"))
import scipy.stats, matplotlib
from torchmetrics.classification import MulticlassAccuracy
import torch
acc = MulticlassAccuracy(num_classes=3, average="micro")
print("ACC=%.3f" % acc(torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2])).item())
fig, _ = acc.plot()
print("PLOT=" + type(fig).__name__)
""")
    assert "ACC=0.750" in out and "PLOT=Figure" in out


def test_lightning_imported_first_is_used_as_it_is():
    """A user's module that imported Lightning before fdlit gets the plain import."""
    _run("""
import sys
import lightning.pytorch
import fdlit.clients.client
assert "torchmetrics.functional" in sys.modules
assert "torch._dynamo" in sys.modules and not type(sys.modules["torch._dynamo"]).__name__.startswith("_Deferred")
""")


def test_torchmetrics_loads_whole_when_more_than_lightning_needs_is_asked_of_it():
    out = _run("""
import sys
import fdlit.clients.client
import torch, torchmetrics
assert "torchmetrics.functional" not in sys.modules  # deferred so far
mean = torchmetrics.MeanMetric()  # any other name: the package's own __init__ runs
mean.update(torch.tensor([1.0, 3.0]))
assert "torchmetrics.functional" in sys.modules and type(sys.modules["torchmetrics"]).__name__ == "module"
assert len(torchmetrics._logger.handlers) == 1 and torchmetrics.Metric is torchmetrics.metric.Metric
print("MEAN=%.1f" % mean.compute().item())
""")
    assert "MEAN=2.0" in out

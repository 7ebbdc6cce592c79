"""What fdlit asks of wandb to keep logging cheap (fdlit/runs/wandb_costs.py), checked without timing:
the settings passed, the Launch import skipped only while no Launch input can be staged, and what
an offline run holds (no console capture, no system metrics, heatmaps at their cadence, one table)."""

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from fdlit.configuration.run_settings import LoggerConfig
from fdlit.runs import wandb_costs

wandb = pytest.importorskip("wandb")
ROOT = Path(__file__).parents[1]


def fake_wandb(calls):
    class Run:
        def _detect_and_apply_job_inputs(self):
            calls.append(self)

    return types.SimpleNamespace(util=types.SimpleNamespace(pd_available=True),
                                 sdk=types.SimpleNamespace(wandb_run=types.SimpleNamespace(Run=Run))), Run


def test_launch_inputs_are_applied_only_when_a_launch_job_could_have_staged_them(monkeypatch):
    calls = []
    fake, run_class = fake_wandb(calls)
    monkeypatch.delitem(sys.modules, wandb_costs.LAUNCH_INPUTS, raising=False)
    wandb_costs.skip_unused_work(fake)
    wandb_costs.skip_unused_work(fake)  # twice (a resumed run): wrapped once
    run_class()._detect_and_apply_job_inputs()
    assert calls == []  # nothing staged: Launch is not imported
    monkeypatch.setitem(sys.modules, wandb_costs.LAUNCH_INPUTS, types.ModuleType(wandb_costs.LAUNCH_INPUTS))
    run = run_class()
    run._detect_and_apply_job_inputs()
    assert calls == [run]  # Launch's module is loaded: wandb's own method runs, once
    assert fake.util.pd_available is ("pandas" in sys.modules)


def test_a_launch_method_with_another_signature_is_left_as_it_is_and_said_once(monkeypatch, capsys):
    from fdlit import internals

    class Run:
        def _detect_and_apply_job_inputs(self, staged):  # a wandb release that passes what was staged
            return staged

    monkeypatch.setattr(internals, "_said", set())
    fake = types.SimpleNamespace(util=types.SimpleNamespace(), sdk=types.SimpleNamespace(
        wandb_run=types.SimpleNamespace(Run=Run)))
    method = Run._detect_and_apply_job_inputs
    wandb_costs.skip_unused_work(fake)
    wandb_costs.skip_unused_work(fake)
    assert Run._detect_and_apply_job_inputs is method and Run()._detect_and_apply_job_inputs(3) == 3
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "Run._detect_and_apply_job_inputs takes more than self" in err[0], err


def test_pydantics_docstring_search_is_skipped_only_where_it_takes_what_its_stand_in_takes(monkeypatch, capsys):
    from pydantic._internal import _fields

    from fdlit import internals

    monkeypatch.setattr(internals, "_said", set())
    search = _fields.extract_docstrings_from_cls
    with wandb_costs.without_field_docstrings():
        assert _fields.extract_docstrings_from_cls is not search and _fields.extract_docstrings_from_cls(int) == {}
    assert _fields.extract_docstrings_from_cls is search

    def moved(cls, use_inspect=False, *, source=None):  # a pydantic release with another parameter
        return {"x": "doc"}

    monkeypatch.setattr(_fields, "extract_docstrings_from_cls", moved)
    with wandb_costs.without_field_docstrings():
        assert _fields.extract_docstrings_from_cls is moved
    assert "extract_docstrings_from_cls takes more than cls, use_inspect" in capsys.readouterr().err


def test_the_settings_drop_console_capture_and_system_metrics_unless_asked():
    quiet = wandb_costs.wandb_settings(wandb, LoggerConfig(init_timeout_s=3.0))
    assert quiet.console == "off" and quiet.init_timeout == 3.0
    assert quiet.x_disable_stats and not quiet.x_save_requirements
    full = wandb_costs.wandb_settings(wandb, LoggerConfig(system_metrics=True))
    assert full.console == "off"
    assert not full.x_disable_stats and full.x_save_requirements


RUN = r"""
import json, sys
from fdlit.cli import main
assert main(["fit", *sys.argv[1:]]) == 0
print("IMPORTED=" + json.dumps({m: m in sys.modules for m in ("wandb.sdk.launch", "pandas")}))
"""


def test_an_offline_run_logs_its_metrics_heatmaps_at_their_cadence_and_one_table_only(fast_args, tmp_path):
    from tests.wandb_records import offline_record

    args = [*fast_args, "--federation.rounds", "3", "--logger.trust_every_n_rounds", "2"]
    args[args.index("--logger.mode") + 1] = "offline"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NETRC": str(tmp_path / "no-netrc"),
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_DIR": str(tmp_path)}  # W&B's folder: not ROOT's
    done = subprocess.run([sys.executable, "-c", RUN, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = json.loads(done.stdout.split("IMPORTED=")[-1])
    # (matplotlib is not checked: Lightning, which every run's clients are built on, imports it)
    assert imported == {"wandb.sdk.launch": False, "pandas": False}
    (run_dir,) = list((tmp_path / "runs").iterdir())
    (folder,) = (run_dir / "wandb").glob("offline-run-*")
    assert (tmp_path / "wandb" / folder.name).resolve() == folder  # linked where `wandb sync` looks ($WANDB_DIR)
    (records,) = offline_record(run_dir, "exit")
    kinds = [r.WhichOneof("record_type") for r in records]
    assert not {"output", "output_raw", "stats"} & set(kinds)  # no console capture, no system metrics
    history = [{item.key or "/".join(item.nested_key): item.value_json for item in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    rounds = [json.loads(h["round"]) for h in history if "weights/chi" in h]
    assert rounds == [1, 2, 3]  # every round's scalars, chi among them
    assert all("teacher/acc" in h and "comm/up_bytes_total" in h for h in history if "weights/chi" in h)
    heatmaps = [json.loads(h["round"]) for h in history if "clients/trust_matrix/_type" in h]
    assert heatmaps == [1, 2, 3]  # round 1, every 2nd, the last
    tables = [json.loads(h["clients/accuracy/_type"]) for h in history if "clients/accuracy/_type" in h]
    assert tables == ["table-file"]
    files = {f.path for r in records if r.WhichOneof("record_type") == "files" for f in r.files.files}
    assert "requirements.txt" not in files
    images = list((run_dir / "wandb").glob("offline-run-*/files/media/images/**/*.png"))
    assert len(images) == 3


def test_models_defined_while_wandb_loads_skip_the_docstring_search_and_it_comes_back():
    import pydantic
    from pydantic._internal import _fields

    search = _fields.extract_docstrings_from_cls
    with wandb_costs.without_field_docstrings():
        class Inside(pydantic.BaseModel):
            model_config = pydantic.ConfigDict(use_attribute_docstrings=True)
            x: int = 0
            """a description"""
    class Outside(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(use_attribute_docstrings=True)
        x: int = 0
        """a description"""
    assert Inside.model_fields["x"].description is None and Inside(x=3).x == 3
    assert Outside.model_fields["x"].description == "a description"
    assert _fields.extract_docstrings_from_cls is search

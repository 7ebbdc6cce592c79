"""``federation.devices``: which GPU, checked against the machine before any work."""

import pytest
import torch

from fdlit.cli import main
from fdlit.errors import ConfigError
from fdlit.federation import FederationLoop
from fdlit.federation.devices import check_devices


def fake_gpus(monkeypatch, count):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def test_on_a_cpu_only_the_default_is_allowed(monkeypatch):
    fake_gpus(monkeypatch, 0)
    assert check_devices("auto", "auto") == 1 and check_devices("cpu", "auto") == 1
    for devices in (0, 1, [1]):
        with pytest.raises(ConfigError, match="federation.devices: .*no GPU to choose; only auto is allowed"):
            check_devices("auto", devices)


def test_a_gpu_index_is_checked_against_the_gpus_there_are(monkeypatch):
    fake_gpus(monkeypatch, 2)
    assert check_devices("cuda", 1) == [1] and check_devices("gpu", [0]) == [0] and check_devices("auto", "1") == [1]
    with pytest.raises(ConfigError, match=r"has 2 GPU\(s\) \(indices 0 to 1\); got 2"):
        check_devices("cuda", 2)
    with pytest.raises(ConfigError, match="one device.*several GPUs use the Ray executor: --federation.executor "
                                          r"fdlit.execution.RayExecutor with num_gpus_per_client, docs/ray.md\); "
                                          r"got \[0, 1\]"):
        check_devices("cuda", [0, 1])  # a run trains all its clients on one device
    with pytest.raises(ConfigError, match="one device"):
        check_devices("cuda", -1)
    with pytest.raises(ConfigError, match="only auto is allowed"):
        check_devices("cpu", 1)  # the CPU accelerator chosen: no GPU index means anything


def test_the_loop_hands_the_chosen_gpu_to_fabric(monkeypatch):
    fake_gpus(monkeypatch, 2)
    import fdlit.federation.construction as construction

    monkeypatch.setattr(construction, "available_accelerators", lambda: ["auto", "cpu", "cuda", "gpu"])
    assert FederationLoop(accelerator="cuda", devices=1).settings.fabric_devices == [1]
    assert FederationLoop().settings.fabric_devices == 1


def test_the_command_line_refuses_a_gpu_on_this_cpu_before_any_work(fast_args, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["fit", *fast_args, "--federation.devices", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "federation.devices" in err and "only auto is allowed" in err
    assert not (tmp_path / "runs").exists()  # nothing was created

"""An unreachable Hugging Face hub costs about a second, not the libraries' retries: the hub path probes the
endpoint first and, when it does not answer, reads the cache only. The hub here is a closed port on the
loopback interface (HF_ENDPOINT): no test makes a network call."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import paper_fixtures  # noqa: F401  (offline HF env first)
import pytest
from paper_fixtures import image_dataset_dict, save_parquet_hub_layout

from fdlit.data import hub_access

REPO = Path(__file__).resolve().parents[1]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


def unreachable_env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")}
    return {**env, "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}", "HF_HOME": str(tmp_path / "hf"),
            "FDLIT_CACHE": str(tmp_path / "fdlit-cache"), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def timed(code: str, env: dict) -> dict:
    """Run ``code`` (which sets ``out``) in a fresh interpreter; its imports are not timed. ``out['slept']``:
    the seconds it asked ``time.sleep`` for (a retry's back-off), ``out['elapsed']`` its wall time."""
    script = ("import json, time\nslept = []\n_sleep = time.sleep\n"
              "def sleep(s):\n    slept.append(s)\n    _sleep(s)\n"
              f"time.sleep = sleep\nt0 = time.perf_counter()\n{code}\n"
              "out['elapsed'] = time.perf_counter() - t0\nout['slept'] = sum(slept)\nprint(json.dumps(out))")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def fast(out: dict) -> bool:
    """No waiting on the hub: no back-off slept, and well under a retry schedule's wall time even on a loaded
    machine (about 1 s of work on an idle one; the hub clients' retries wait 1 + 2 + 4 + ... s)."""
    return out["slept"] < 0.5 and out["elapsed"] < 30


def test_the_probe_answers_for_a_listening_port_and_not_for_a_closed_one(monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub_access.hub_reachable()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    assert not hub_access.hub_reachable()


def test_an_unreachable_hub_fails_at_once_with_the_commands(tmp_path):
    code = ("from fdlit.data import load_dataset\nfrom fdlit.data.hub import DatasetUnavailable\n"
            "t0 = time.perf_counter()\ntry:\n    load_dataset('cifar10')\n    out = {'msg': None}\n"
            "except DatasetUnavailable as exc:\n    out = {'msg': str(exc), 'field': exc.field}")
    out = timed(code, unreachable_env(tmp_path))
    assert fast(out), out
    msg = out["msg"]
    assert out["field"] == "data.dataset" and "did not answer within" in msg
    assert "hf download --repo-type dataset uoft-cs/cifar10 --local-dir DIR" in msg  # on a machine with network
    assert "HF_HUB_OFFLINE=1" in msg  # skips the hub


def test_the_cli_stops_at_once_and_writes_nothing(tmp_path):
    runs = tmp_path / "runs"
    code = ("import contextlib, io\nfrom fdlit.cli import main\nerr = io.StringIO()\nt0 = time.perf_counter()\n"
            "with contextlib.redirect_stderr(err):\n"
            f"    rc = main(['fit', '--config', 'cifar10', '--logger.mode', 'disabled', '--logger.run_dir', {str(runs)!r}])\n"
            "out = {'rc': rc, 'err': err.getvalue()}")
    out = timed(code, unreachable_env(tmp_path))
    assert out["rc"] == 2 and fast(out), out
    assert out["err"].startswith("fdlit: error: data.dataset: ") and "HF_HUB_OFFLINE=1" in out["err"]
    assert not runs.exists()


def test_a_cached_dataset_still_loads_when_the_hub_is_unreachable(tmp_path):
    """A hub dataset in a Hugging Face cache folder (``--data.data_dir``): read from it at once."""
    import datasets as hf

    dd, _ = image_dataset_dict()
    save_parquet_hub_layout(dd, tmp_path / "snapshot", "plain_text")
    hf.load_dataset(str(tmp_path / "snapshot"), cache_dir=str(tmp_path / "build"))
    # the cache layout of a hub download of uoft-cs/cifar10: <cache>/uoft-cs___cifar10/<config>/<version>/<hash>/
    built = next((tmp_path / "build" / "snapshot").glob("*/*/*/dataset_info.json")).parent
    target = tmp_path / "cache" / "uoft-cs___cifar10" / built.relative_to(tmp_path / "build" / "snapshot")
    target.mkdir(parents=True)
    for f in built.iterdir():
        (target / f.name.replace("snapshot-", "cifar10-")).write_bytes(f.read_bytes())
    code = (f"from fdlit.data import load_dataset\ntrain, test = load_dataset('cifar10', data_dir={str(tmp_path / 'cache')!r})\n"
            "out = {'train': list(train.x.shape), 'test': len(test)}")
    out = timed(code, unreachable_env(tmp_path))
    assert out["train"] == [60, 3, 32, 32] and out["test"] == 20 and fast(out), out


@pytest.mark.parametrize("flag", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_both_offline_flags_count_as_asking_for_the_cache_only(monkeypatch, flag):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    assert not hub_access.offline_requested()
    monkeypatch.setenv(flag, "1")
    assert hub_access.offline_requested()


def test_a_tokenizer_from_the_hub_fails_fast_too(tmp_path):
    code = ("from fdlit.data.hub import DatasetUnavailable, load_tokenizer\nt0 = time.perf_counter()\ntry:\n"
            "    load_tokenizer('prajjwal1/bert-tiny')\n    out = {'field': None}\n"
            "except DatasetUnavailable as exc:\n    out = {'field': exc.field, 'msg': str(exc)}")
    out = timed(code, unreachable_env(tmp_path))
    assert out["field"] == "data.tokenizer" and "hf download prajjwal1/bert-tiny" in out["msg"] and fast(out), out

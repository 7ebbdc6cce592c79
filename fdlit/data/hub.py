"""Paper datasets through one loading path: Hugging Face ``datasets``.

CIFAR-10/100, MNIST, Fashion-MNIST and Yahoo Answers Topics all come from the Hugging Face hub
(``datasets`` caches them and reads the cache offline). ``data_dir`` points at a local copy instead:

* the original files: IDX for MNIST / Fashion-MNIST, the python batches for CIFAR-10/100
  (:mod:`fdlit.data.local_files`; without ``data_dir``, MNIST and Fashion-MNIST are also looked for
  in Debian's location, e.g. ``/usr/share/datasets/fashion-mnist`` from ``apt-get install dataset-fashion-mnist``), or
* a folder written by ``DatasetDict.save_to_disk`` (has ``dataset_dict.json``), or
* a local snapshot of the hub repository (parquet files in the hub's layout, e.g. from
  ``hf download --repo-type dataset uoft-cs/cifar10 --local-dir DIR``), or
* otherwise: a Hugging Face cache directory (``cache_dir`` of ``load_dataset``).

Images are stored as uint8 tensors (N x C x H x W); conversion to float, normalisation and the CIFAR
augmentation happen batched on the training device in :mod:`fdlit.data.augment`. Text is tokenised
once (fast tokenizer) into ``x`` of shape N x 2 x L int64 (token ids, attention mask) and cached, so
index slicing still works. Decoded/tokenised tensors are cached under ``$FDLIT_CACHE`` (default
``~/.cache/fdlit``), keyed by the source's fingerprint.

Offline and not cached, loading raises :class:`DatasetUnavailable` (a ConfigError on ``data.dataset``:
the CLI exits non-zero before any run directory or W&B run exists) naming the dataset, its source and
the command that fetches it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from fdlit.data.augment import ImageInput
from fdlit.data.hub_access import PROBE_TIMEOUT_S, cache_only, hub_endpoint, hub_reachable, offline_requested
from fdlit.data.local_files import find_local_arrays, find_local_folder, local_fetch_hint
from fdlit.data.tensor_dataset import TensorDataset
from fdlit.errors import ConfigError


class DatasetUnavailable(ConfigError):
    """A dataset (or pretrained weights) is neither cached nor reachable; says how to fetch it."""


@dataclass(frozen=True)
class HubSpec:
    """Where a dataset lives on the hub and which columns hold inputs and labels."""

    name: str
    repo_id: str
    label: str
    num_classes: int
    image: str | None = None  # image column (datasets.Image)
    text: tuple[str, ...] = ()  # text columns, concatenated with " " (Kovalchuk et al. 2026, App. A.2)
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    augment: bool = False  # default of data.augment: random crop (pad 4) + horizontal flip
    splits: tuple[str, str] = ("train", "test")


HUB_DATASETS: dict[str, HubSpec] = {
    # CIFAR (Krizhevsky 2009); Kovalchuk et al. 2026, Sec. 5; Kovalchuk et al. 2025 (workshop).
    # Channel statistics of the CIFAR training sets.
    "cifar10": HubSpec("cifar10", "uoft-cs/cifar10", "label", 10, image="img",
                       mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616), augment=True),
    "cifar100": HubSpec("cifar100", "uoft-cs/cifar100", "fine_label", 100, image="img",
                        mean=(0.5071, 0.4865, 0.4409), std=(0.2673, 0.2564, 0.2762), augment=True),
    # MNIST (LeCun 1998); Kovalchuk et al. 2025 (workshop) with LeNet-5. Fashion-MNIST (Xiao 2017), same format.
    "mnist": HubSpec("mnist", "ylecun/mnist", "label", 10, image="image", mean=(0.1307,), std=(0.3081,)),
    "fashion_mnist": HubSpec("fashion_mnist", "zalando-datasets/fashion_mnist", "label", 10, image="image",
                             mean=(0.2860,), std=(0.3530,)),
    # Yahoo! Answers Topics (Zhang et al. 2015), 10 topics; Kovalchuk et al. 2026, App. A.2:
    # title + content + best answer.
    "yahoo_answers": HubSpec("yahoo_answers", "community-datasets/yahoo_answers_topics", "topic", 10,
                             text=("question_title", "question_content", "best_answer")),
}


def fetch_hint(spec: HubSpec) -> str:
    return (
        f"dataset {spec.name!r} comes from the Hugging Face hub ({spec.repo_id}) and is not in the local cache "
        f"(offline or unreachable). Fetch it once on a machine with network:\n"
        f"    python -c \"from datasets import load_dataset; load_dataset('{spec.repo_id}')\"\n"
        f"or download a copy and point fdlit at it:\n"
        f"    hf download --repo-type dataset {spec.repo_id} --local-dir DIR   # then --data.data_dir DIR\n"
        f"(--data.data_dir also accepts a DatasetDict.save_to_disk folder or a Hugging Face cache directory), or\n"
        f"    python -m fdlit data fetch {spec.name} --to DIR   # the original file format; then --data.data_dir DIR\n"
        + local_fetch_hint(spec.name)
        + "\nWithout network, HF_HUB_OFFLINE=1 reads the Hugging Face cache only, without trying the hub."
    ).rstrip()


class HubUnreachable(ConnectionError):
    """The hub did not answer the probe and the dataset is not in the cache."""


def _load_from_hub(hf, repo_id: str, **kwargs):
    """``datasets.load_dataset(repo_id)``; when the hub does not answer the probe, from the cache alone,
    so an unreachable hub costs about a second, not the libraries' retries (``fdlit.data.hub_access``)."""
    if offline_requested() or hub_reachable():
        return hf.load_dataset(repo_id, **kwargs)
    try:
        with cache_only():
            return hf.load_dataset(repo_id, **kwargs)
    except Exception:
        raise HubUnreachable(f"the hub at {hub_endpoint()} did not answer within {PROBE_TIMEOUT_S:g} s, and the "
                             "dataset is not in the local cache") from None


def hf_cached(repo_id: str) -> bool:
    """Whether the Hugging Face caches hold anything of ``repo_id`` (the hub's snapshot folder or a
    ``datasets`` build), found without importing either library; a "yes" is checked by the load itself."""
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser()
    hub = Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or home / "hub").expanduser()
    built = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets").expanduser()
    org_name = repo_id.replace("/", "___")
    return (hub / f"datasets--{repo_id.replace('/', '--')}").is_dir() or (
        built.is_dir() and any(built.glob(f"{org_name}*")))


def check_obtainable(name: str, data_dir: str | None) -> None:
    """Refuse a paper dataset that cannot be had here (no local files, not cached, hub unreachable)
    before the run imports or loads anything heavy; the load decides every other case."""
    spec = HUB_DATASETS.get(name)
    if spec is None or data_dir is not None:  # a given folder is read (and its faults named) by the load
        return
    if spec.image and find_local_folder(name) is not None:
        return
    if hf_cached(spec.repo_id) or (not offline_requested() and hub_reachable()):
        return
    why = ("HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set" if offline_requested() else
           f"the hub at {hub_endpoint()} did not answer within {PROBE_TIMEOUT_S:g} s")
    raise DatasetUnavailable("data.dataset", f"{fetch_hint(spec)}\n({why}, and the dataset is not in the local cache)")


def _cache_root() -> Path:
    return Path(os.environ.get("FDLIT_CACHE", Path.home() / ".cache" / "fdlit"))


def load_hub_splits(spec: HubSpec, data_dir: str | None = None):
    """Return ``{"train": datasets.Dataset, "test": datasets.Dataset}`` from data_dir, the cache or the hub."""
    try:
        import datasets as hf
    except ImportError:  # pragma: no cover - datasets is a dependency of the paper extra
        raise ConfigError("data.dataset", f"{spec.name!r} needs Hugging Face `datasets`: pip install 'fdlit[paper]'")
    hf.disable_progress_bars()
    if data_dir is not None:
        path = Path(data_dir).expanduser()
        if not path.exists():
            raise DatasetUnavailable("data.data_dir", f"{path} does not exist.\n" + fetch_hint(spec))
        try:
            if (path / "dataset_dict.json").exists():
                dd = hf.load_from_disk(str(path))
            elif any(path.rglob("*.parquet")):  # a snapshot of the hub repository
                dd = hf.load_dataset(str(path))
            else:
                dd = _load_from_hub(hf, spec.repo_id, cache_dir=str(path))
        except Exception as exc:
            raise DatasetUnavailable(
                "data.data_dir", f"cannot read {spec.name!r} from {path} ({type(exc).__name__}: {exc}).\n" + fetch_hint(spec)
            ) from None
    else:
        try:
            dd = _load_from_hub(hf, spec.repo_id)
        except HubUnreachable as exc:
            raise DatasetUnavailable("data.dataset", f"{fetch_hint(spec)}\n({exc})") from None
        except Exception as exc:
            raise DatasetUnavailable(
                "data.dataset", f"{fetch_hint(spec)}\n(datasets said: {type(exc).__name__}: {str(exc)[:300]})"
            ) from None
    missing = [s for s in spec.splits if s not in dd]
    if missing:
        raise ConfigError("data.data_dir", f"{spec.name!r}: splits {missing} missing; found {sorted(dd)}")
    return {s: dd[s] for s in spec.splits}


def _cached(key: str, build):
    """Memoise an expensive tensor dict (decoded images, token ids) on disk under $FDLIT_CACHE."""
    path = _cache_root() / f"{key}.pt"
    if path.exists():
        try:
            return torch.load(path, weights_only=True)
        except Exception:
            pass  # a broken cache file is rebuilt
    out = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(out, tmp)
        os.replace(tmp, path)
    except OSError:
        pass  # read-only home: no cache, still correct
    return out


def _fingerprint(ds) -> str:
    return getattr(ds, "_fingerprint", None) or hashlib.sha1(repr(ds).encode()).hexdigest()


def images_to_uint8(ds, column: str) -> torch.Tensor:
    arrays = [np.asarray(im.convert("RGB") if im.mode not in ("L", "RGB") else im) for im in ds[column]]
    x = torch.from_numpy(np.stack(arrays))
    return (x.unsqueeze(1) if x.dim() == 3 else x.permute(0, 3, 1, 2)).contiguous()


def _stratified_limit(labels: np.ndarray, limit: int | None, num_classes: int) -> np.ndarray | None:
    """A fixed (seed-independent), class-balanced subset of at most ``limit`` rows, sorted."""
    if limit is None or limit >= len(labels):
        return None
    rng = np.random.default_rng(0xFD17)
    per_class = limit // num_classes
    keep = []
    for c in range(num_classes):
        idx = np.flatnonzero(labels == c)
        keep.append(rng.permutation(idx)[:per_class])
    return np.sort(np.concatenate(keep))


def load_hub_dataset(
    name: str,
    data_dir: str | None = None,
    augment: bool | None = None,
    max_train_samples: int | None = None,
    tokenizer: str = "prajjwal1/bert-tiny",
    max_length: int = 256,
    input_scaling: str | None = None,
) -> tuple[TensorDataset, TensorDataset]:
    """(train, test) of a paper dataset as tensors; see the module docstring. ``input_scaling`` (images):
    ``standardize`` (the default, also for None) maps pixels to (x/255 - mean) / std with the dataset's
    channel statistics, ``unit`` to x/255 in [0, 1]."""
    spec = HUB_DATASETS[name]
    unit = input_scaling == "unit"
    local = find_local_arrays(name, data_dir) if spec.image else None  # original files (IDX, CIFAR batches)
    splits = local if local is not None else load_hub_splits(spec, data_dir)
    out = []
    for split_name in spec.splits:
        ds = splits[split_name]
        labels = ds[1] if local is not None else np.asarray(ds[spec.label], dtype=np.int64)
        keep = _stratified_limit(labels, max_train_samples, spec.num_classes) if split_name == "train" else None
        if keep is not None:
            ds = (ds[0][keep], ds[1][keep]) if local is not None else ds.select(keep)
            labels = labels[keep]
        y = torch.from_numpy(labels)
        if spec.image:
            if local is not None:  # already decoded: nothing worth caching
                x = torch.from_numpy(np.ascontiguousarray(ds[0]))
            else:
                x = _cached(f"{name}-{split_name}-{_fingerprint(ds)}", lambda ds=ds: {"x": images_to_uint8(ds, spec.image)})["x"]
            mean, std = ((0.0,) * len(spec.mean), (1.0,) * len(spec.std)) if unit else (spec.mean, spec.std)
            transform = partial(ImageInput, mean=mean, std=std,
                                augment=spec.augment if augment is None else augment)
        else:
            key = hashlib.sha1(f"{_fingerprint(ds)}|{tokenizer}|{max_length}".encode()).hexdigest()[:16]
            x = _cached(f"{name}-{split_name}-tok-{key}", lambda ds=ds: {"x": tokenize(ds, spec.text, tokenizer, max_length)})["x"]
            transform = None
        out.append(TensorDataset(x, y, spec.num_classes, f"{name}/{split_name}", input_transform=transform))
    return out[0], out[1]


def concat_text(ds, columns: tuple[str, ...]) -> list[str]:
    """Title + content + best answer, joined with spaces (Kovalchuk et al. 2026, App. A.2);
    missing fields are empty."""
    cols = [ds[c] for c in columns]
    return [" ".join(s.strip() for s in parts if s and s.strip()) for parts in zip(*cols, strict=True)]


def load_tokenizer(name_or_path: str):
    """A fast tokenizer from the hub cache or a local folder, with the fetch hint when missing."""
    from transformers import AutoTokenizer

    # a hub id with the hub not answering: the cache only, at once (fdlit.data.hub_access)
    cache_only = not Path(name_or_path).expanduser().exists() and not offline_requested() and not hub_reachable()
    try:
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=cache_only)
    except Exception as exc:
        raise DatasetUnavailable(
            "data.tokenizer",
            f"tokenizer {name_or_path!r} is not cached and cannot be downloaded ({type(exc).__name__}). Fetch it once:\n"
            f"    hf download {name_or_path}\n"
            f"or pass a local folder holding tokenizer files with --data.tokenizer DIR",
        ) from None


def tokenize(ds, columns: tuple[str, ...], tokenizer: str, max_length: int) -> torch.Tensor:
    """N x 2 x L int64: token ids and attention mask, padded/truncated to ``max_length``."""
    tok = load_tokenizer(tokenizer)
    texts = concat_text(ds, columns)
    enc = tok(texts, padding="max_length", truncation=True, max_length=max_length, return_tensors="pt")
    return torch.stack([enc["input_ids"].long(), enc["attention_mask"].long()], dim=1)


def register(registry: dict) -> None:
    for name in HUB_DATASETS:
        registry[name] = partial(load_hub_dataset, name)

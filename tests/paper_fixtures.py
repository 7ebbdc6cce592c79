"""Tiny local copies of the paper datasets and models, in their real on-disk formats (no network).

Imported by the paper and local-file tests; sets the Hugging Face libraries offline with an empty cache
first. Also the IDX files of MNIST-shaped data sets (LeCun et al.'s format) for the local-file tests.
"""

from __future__ import annotations

import atexit
import gzip
import os
import shutil
import struct
import tempfile


def _scratch(prefix: str) -> str:
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HOME"] = _scratch("fdlit-test-hf-")  # an empty cache: nothing is "already downloaded"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["FDLIT_CACHE"] = _scratch("fdlit-test-cache-")  # never the user's ~/.cache/fdlit

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

WORDS = ["the", "ball", "game", "team", "doctor", "health", "money", "bank", "song", "music", "law", "vote",
         "what", "is", "why", "how", "good", "best", "answer", "question"]


def image_dataset_dict(n_train_per_class=6, n_test_per_class=2, num_classes=10, size=32, mode="RGB",
                       image_col="img", label_col="label", extra_label=None, seed=0):
    """A DatasetDict with an ``Image`` column and ``ClassLabel`` labels, like uoft-cs/cifar10 or ylecun/mnist."""
    import datasets as hf
    from PIL import Image

    rng = np.random.default_rng(seed)
    features = {image_col: hf.Image(), label_col: hf.ClassLabel(num_classes=num_classes)}
    if extra_label:
        features[extra_label] = hf.ClassLabel(num_classes=20)
    out, arrays = {}, {}
    for split, per in (("train", n_train_per_class), ("test", n_test_per_class)):
        labels = np.repeat(np.arange(num_classes), per)
        rng.shuffle(labels)
        shape = (len(labels), size, size, 3) if mode == "RGB" else (len(labels), size, size)
        pix = rng.integers(0, 256, shape, dtype=np.uint8)
        cols = {image_col: [Image.fromarray(p, mode=mode) for p in pix], label_col: labels.tolist()}
        if extra_label:
            cols[extra_label] = (labels % 20).tolist()
        out[split] = hf.Dataset.from_dict(cols, features=hf.Features(features))
        arrays[split] = (pix, labels)
    return hf.DatasetDict(out), arrays


def save_parquet_hub_layout(dd, root: Path, config_dir: str) -> Path:
    """Write ``<root>/<config_dir>/{train,test}-00000-of-00001.parquet`` as the hub repositories do."""
    (root / config_dir).mkdir(parents=True, exist_ok=True)
    for split, ds in dd.items():
        ds.to_parquet(str(root / config_dir / f"{split}-00000-of-00001.parquet"))
    return root


def yahoo_dataset_dict(n_train_per_class=8, n_test_per_class=2, seed=0):
    """Rows like community-datasets/yahoo_answers_topics: id, topic, question_title/content, best_answer."""
    import datasets as hf

    rng = np.random.default_rng(seed)
    features = hf.Features({"id": hf.Value("int32"), "topic": hf.ClassLabel(num_classes=10),
                            "question_title": hf.Value("string"), "question_content": hf.Value("string"),
                            "best_answer": hf.Value("string")})
    out = {}
    for split, per in (("train", n_train_per_class), ("test", n_test_per_class)):
        topics = np.repeat(np.arange(10), per)
        words = lambda k: " ".join(rng.choice(WORDS, size=k))  # noqa: E731
        out[split] = hf.Dataset.from_dict({
            "id": list(range(len(topics))), "topic": topics.tolist(),
            "question_title": [words(3) for _ in topics],
            "question_content": ["" if i % 3 == 0 else words(4) for i in range(len(topics))],
            "best_answer": [words(5) for _ in topics],
        }, features=features)
    return hf.DatasetDict(out)


def local_bert(folder: Path, num_layers=1, hidden=16) -> Path:
    """A tiny random BERT (save_pretrained layout) and a WordPiece tokenizer built from WORDS."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)
    tok.save_pretrained(str(folder))
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=num_layers, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=64)
    BertForSequenceClassification(cfg).save_pretrained(str(folder))
    return folder


def write_idx(path: Path, array: np.ndarray, gz: bool) -> None:
    """An IDX file as LeCun et al. specify it: 0, 0, type 0x08 (uint8), ndim, big-endian dims, data."""
    raw = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    raw += array.astype(np.uint8).tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(raw))
    else:
        path.write_bytes(raw)


def idx_folder(folder: Path, n_train=40, n_test=20, gz=True, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        y = (np.arange(n) % 10).astype(np.uint8)
        write_idx(folder / f"{split}-images-idx3-ubyte", x, gz)
        write_idx(folder / f"{split}-labels-idx1-ubyte", y, gz)
        arrays[split] = (x, y)
    return arrays

"""A deployed node's own data: the real way a participant (a hospital, an edge server) takes part.

With ``--node-config "local-data='/path'"``, the node's clients train on the labelled images in that
folder instead of their partition of the shared dataset: the server and the other nodes never read
them, and their labels, sizes and class mix are the node's. The folder holds the IDX pair fdlit reads
for MNIST-style sets, ``train-images-idx3-ubyte`` and ``train-labels-idx1-ubyte`` (gzipped or not):
N x H x W uint8 images in the federation dataset's own pixel encoding (0-255 for the image datasets,
0-16 for digits, scikit-learn's encoding) and N labels in 0..C-1. ``local-data='mylab.data.load'``
(a dotted path, no folder of that name) names the operator's own loader instead: a function or class
called without arguments that returns (images, labels) of that form, as numpy arrays or tensors. The node's clients split the samples evenly (a seeded shuffle), and each holds
out its calibration share as the federation's data section says; a client's local classes are
the classes its samples hold. A missing or malformed folder is refused at the node's start.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fdlit.data.federated import ClientData, absent_client
from fdlit.data.node_files import FIELD, read_node_data  # noqa: F401 (read_node_data re-exported)
from fdlit.data.partition import stratified_holdout
from fdlit.data.tensor_dataset import TensorDataset
from fdlit.errors import ConfigError

DIGITS_MAX = 16  # the gray levels of the digits images (float-stored datasets here: digits only)


def node_client_data(folder: str | Path, like: TensorDataset, dataset: str, client_ids: list[int], seed: int,
                     calibration_fraction: float) -> list[ClientData]:
    """The node's clients' data from its own folder, shaped and encoded as ``like`` (a split of the
    federation's dataset: its input shape, dtype, classes and input step)."""
    x, y = read_node_data(folder)
    channels, height, width = like.input_shape[-3:] if len(like.input_shape) >= 3 else (1, *like.input_shape[-2:])
    if x.shape[1:] != (height, width) or channels != 1:
        raise ConfigError(FIELD, f"images of {x.shape[1]} x {x.shape[2]} pixels; this federation's {dataset} "
                          f"inputs are {tuple(like.input_shape)}")
    if y.min() < 0 or y.max() >= like.num_classes:
        raise ConfigError(FIELD, f"labels {int(y.min())}..{int(y.max())}; {dataset} has classes 0..{like.num_classes - 1}")
    if len(y) < 3 * len(client_ids):
        raise ConfigError(FIELD, f"{len(y)} samples for {len(client_ids)} clients; each needs at least 3")
    if like.x.is_floating_point() and int(x.max()) > DIGITS_MAX:  # digits' pixels are 0..16, not 0..255
        raise ConfigError(FIELD, f"pixel values {int(x.min())}..{int(x.max())}; {dataset} images have gray levels "
                          f"0..{DIGITS_MAX} (scale 0..255 images with x * {DIGITS_MAX} // 255)")
    inputs = torch.from_numpy(x.copy())[:, None]
    if like.x.is_floating_point():  # digits: 0..16 pixels scaled as the dataset scales its own
        inputs = inputs.float() / float(DIGITS_MAX)
    rng = np.random.default_rng([seed, *client_ids])
    out = []
    for cid, rows in zip(client_ids, np.array_split(rng.permutation(len(y)), len(client_ids)), strict=True):
        labels = y[rows]
        tr, cal = stratified_holdout(labels, calibration_fraction, rng)
        if len(tr) < 2 or len(cal) < 1:
            raise ConfigError(FIELD, f"client {cid} gets {len(tr)} training and {len(cal)} calibration samples of "
                              f"the folder's {len(y)}; each needs at least 2 and 1")
        parts = [TensorDataset(inputs[rows[idx]], torch.from_numpy(labels[idx]), like.num_classes, f"client{cid}/{name}",
                               input_transform=like.input_transform) for idx, name in ((tr, "train"), (cal, "calibration"))]
        out.append(ClientData(cid, sorted(int(c) for c in np.unique(labels)), *parts, np.zeros(0, dtype=np.int64)))
    return out


def shared_sets(data) -> tuple[dict, dict[str, torch.Tensor]]:
    """What a node with its own data needs of the federation's dataset, sent by the server at set-up
    so the node holds no copy of it: the public inputs (not their labels), the test and validation
    sets, and how inputs enter a network (the dataset's input step: its mean and std, or none)."""
    from fdlit.data.augment import ImageInput

    make_input = data.input_transform
    if make_input is None:
        step = None
    elif getattr(make_input, "func", None) is ImageInput and not make_input.args:
        step = {k: list(v) if isinstance(v, (tuple, list)) else v for k, v in make_input.keywords.items()}
    else:  # an input step other than fdlit's ImageInput: not describable in a message
        raise ConfigError(FIELD, f"{data.dataset!r} inputs need their own input step on the node; give the node the "
                          "dataset's files (node-config data-dir) instead of sending the shared sets")
    meta = {"num_classes": data.num_classes, "input_step": step, "name": str(data.dataset)}
    tensors = {"public_x": data.public.x, "test_x": data.test.x, "test_y": data.test.y}
    if data.validation is not None:
        tensors |= {"val_x": data.validation.x, "val_y": data.validation.y}
    return meta, tensors


def serve_node_data(data, meta: dict, tensors: dict[str, torch.Tensor], folder: str, client_ids: list[int],
                    seed: int) -> None:
    """Make ``data`` (a node's FederatedData, configured, never set up) the federation as this node
    holds it: the shared sets the server sent and its own clients' samples from ``folder``; every
    other client is known by id only (no samples, no classes). Nothing is read from the dataset."""
    from functools import partial

    from fdlit.data.augment import ImageInput

    step = meta["input_step"]
    make_input = None if step is None else partial(ImageInput, **step)
    num_classes = int(meta["num_classes"])

    def split(x, y, name):
        return TensorDataset(x, y, num_classes, f"{meta['name']}/{name}", input_transform=make_input)

    public_x = tensors["public_x"]
    data.public = split(public_x, torch.zeros(len(public_x), dtype=torch.long), "public")  # labels stay on the server
    data.test = split(tensors["test_x"], tensors["test_y"], "test")
    data.validation = split(tensors["val_x"], tensors["val_y"], "validation") if "val_x" in tensors else None
    data.num_classes, data.input_shape, data.input_transform = num_classes, tuple(public_x.shape[1:]), make_input
    data.pool = None
    own = {cd.client_id: cd for cd in node_client_data(folder, data.public, str(data.dataset), list(client_ids), seed,
                                                       data.calibration_fraction)}
    data.clients = [own.get(i) or absent_client(i, [], data.public) for i in range(data.num_clients)]
    data.is_setup = True

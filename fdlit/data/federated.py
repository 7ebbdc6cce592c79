"""One object that turns (dataset, seed) into a federation's data.

Pools are disjoint: global test set | public set (labels kept for diagnostics only) | validation set
(optional, for choosing the reported round without the test set) | private pool.
Each client gets, from the private pool, a training split and a calibration split (never trained
on; UWA fits its density model there, Kovalchuk et al. 2026, Sec. 4.4) and its class set C_i.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from fdlit.data.datasets import NUM_CLASSES, TensorDataset, augment_images, input_scalings, load_dataset
from fdlit.data.partition import (
    assign_k_classes,
    block_k_classes,
    check_blocks,
    check_k_classes,
    cyclic_k_classes,
    dirichlet_partition,
    sample_k_class_clients,
    stratified_holdout,
)
from fdlit.errors import ConfigError, check_at_least

DEFAULT_CLASSES_PER_CLIENT = 2
MIN_PRIVATE_PER_CLIENT = 3  # 2 training samples and 1 calibration sample


@dataclass
class ClientData:
    client_id: int
    classes: list[int]
    train: TensorDataset
    calibration: TensorDataset
    pool_index: np.ndarray  # indices of this client's samples (train + calibration) in the private pool


def absent_client(client_id: int, classes: list[int], like: TensorDataset) -> ClientData:
    """A client known by id (and classes, where known) with no samples here: a deployment node's others."""
    none = like.subset(torch.zeros(0, dtype=torch.long))
    return ClientData(client_id, classes, none, none, np.zeros(0, dtype=np.int64))


class FederatedData:
    """Builds test, public and per-client private/calibration splits from a dataset and a seed.

    Args:
        dataset: name of a registered dataset (``digits`` ships inside scikit-learn).
        num_clients: M, the number of clients; each needs at least 3 private samples (2 training,
            1 calibration), so M is at most a third of the private pool.
        partition: ``classes`` (k classes per client, as in Kovalchuk et al. 2026 and the workshop paper
            (Kovalchuk et al. 2025)) or ``dirichlet`` (FedGO (Jang et al. 2025)).
        classes_per_client: k, for ``partition=classes``; null gives 2. Leave it null with
            ``partition=dirichlet`` (there ``dirichlet_alpha`` sets the heterogeneity).
        dirichlet_alpha: concentration alpha, for ``partition=dirichlet``.
        samples_per_client: private samples per client (train + calibration) for ``partition=classes``;
            null gives every pool sample of the client's classes.
        public_size: N, size of the shared unlabelled public set; 0 keeps none, for the methods that
            need no public set (FD: ``needs_public_set = False``; others are refused).
        test_fraction: share of the dataset held out as the global test set when the dataset has no
            official test split.
        calibration_fraction: share of each client's private data kept for calibration (Kovalchuk et al. 2026: 0.2).
        calibration: ``split`` (a held-out calibration split, Kovalchuk et al. 2026, Sec. 4.4) or ``augmented``
            (the training data, augmented; Kovalchuk et al. 2026, Table 2 note). With ``augmented`` nothing is held out.
        data_dir: local copy of a paper dataset: its original files (IDX for MNIST / Fashion-MNIST,
            gzipped or not; the python batches for CIFAR-10/100), a save_to_disk folder, a hub-layout
            parquet snapshot, or a Hugging Face cache dir; null looks in the dataset's default location
            (Fashion-MNIST: ``/usr/share/datasets/fashion-mnist`` from ``apt-get install
            dataset-fashion-mnist``), then the Hugging Face cache / hub (``fdlit.data.hub``).
        augment: CIFAR augmentation (random crop pad 4 + flip, batched on the device) while training;
            null uses the dataset's default (on for CIFAR, off otherwise).
        max_train_samples: class-balanced, seed-independent cap on the training split read before
            splitting (Yahoo Answers has 1.4 M rows; the paper needs ~32 k); null reads all.
        tokenizer: hub id or local folder of the tokenizer for text datasets (BERT-tiny's).
        max_length: tokens per text sample (padded/truncated) for text datasets.
        class_assignment: for ``partition=classes``: ``random`` (a balanced random draw of k classes per
            client, seeded), ``cyclic`` (client i holds classes i, ..., i+k-1 mod C; needs M + k - 1 >= C) or
            ``blocks`` (a seeded permutation of the classes cut into C/k disjoint groups of k; client i holds
            group i mod (C/k); needs k | C and (C/k) | M, so every group has M*k/C clients).
        validation_size: a labelled validation set, drawn (stratified) from the private pool before
            the clients get their data, so it is disjoint from the test, public and private sets. An
            integer is a number of samples, a float in (0, 1) a share of the private pool; 0 (the
            default) keeps no validation set, and every sample stays private. With one, evaluated rounds
            also measure every client on it and the summary reports the test accuracy of the round
            with the best validation accuracy (``selected_*``).
        local_class_min_samples: under ``partition=dirichlet``, a class is one of a client's local
            classes C_i (local accuracy, the Oracle, UWA's density components, LKD and Selective-FD
            class sets) only when the client holds at least this many private samples of it (training
            + calibration). The default 2 is the least that gives the class both a training and a
            calibration sample; 1 counts a class held by a single sample as local. A client with no
            class above the threshold keeps its most frequent class(es). Under ``partition=classes``
            the assigned classes are the local ones.
        input_scaling: how image pixels become network inputs: ``standardize`` ((x/255 - mean) / std with the
            dataset's channel statistics; MNIST, Fashion-MNIST, CIFAR-10/100) or ``unit`` (x/255, in [0, 1]);
            null gives the dataset's own (``standardize`` for those, ``unit`` for digits, which has only
            ``unit``; text datasets have none). The step is the input layer the loop puts in front of every
            network (``input_transform``), so training, inference, export and the server model all see it.
    """

    def __init__(
        self,
        dataset: str = "digits",
        num_clients: int = 10,
        partition: Literal["classes", "dirichlet"] = "classes",
        classes_per_client: int | None = None,
        dirichlet_alpha: float = 0.5,
        samples_per_client: int | None = None,
        public_size: int = 500,
        test_fraction: float = 0.2,
        calibration_fraction: float = 0.2,
        calibration: Literal["split", "augmented"] = "split",
        data_dir: str | None = None,
        augment: bool | None = None,
        max_train_samples: int | None = None,
        tokenizer: str = "prajjwal1/bert-tiny",
        max_length: int = 256,
        class_assignment: Literal["random", "cyclic", "blocks"] = "random",
        validation_size: int | float = 0,
        local_class_min_samples: int = 2,
        input_scaling: Literal["standardize", "unit"] | None = None,
    ):
        check_at_least("data.num_clients", num_clients, 1)
        if partition not in ("classes", "dirichlet"):
            raise ConfigError("data.partition", f"allowed: 'classes', 'dirichlet'; got {partition!r}")
        if partition == "dirichlet" and classes_per_client is not None:
            raise ConfigError("data.classes_per_client", "applies to partition=classes only; with partition=dirichlet "
                              "data.dirichlet_alpha sets the split: leave it null (--data.classes_per_client null "
                              f"when the config sets it); got {classes_per_client}")
        if partition == "classes":
            classes_per_client = DEFAULT_CLASSES_PER_CLIENT if classes_per_client is None else classes_per_client
            check_at_least("data.classes_per_client", classes_per_client, 1)
        if dirichlet_alpha <= 0:
            raise ConfigError("data.dirichlet_alpha", f"must be > 0, got {dirichlet_alpha}")
        if partition == "dirichlet" and samples_per_client is not None:
            raise ConfigError("data.samples_per_client", "applies to partition=classes only; with partition=dirichlet "
                              "the clients share the whole pool (cap it with data.max_train_samples); set it to null, "
                              f"got {samples_per_client}")
        if samples_per_client is not None and samples_per_client < 2:
            raise ConfigError("data.samples_per_client", f"must be >= 2 or null, got {samples_per_client}")
        check_at_least("data.public_size", public_size, 0)  # 0: no public set (check_public_set)
        if not 0 < test_fraction < 1:
            raise ConfigError("data.test_fraction", f"must be in (0, 1), got {test_fraction}")
        if not 0 < calibration_fraction < 1:
            raise ConfigError("data.calibration_fraction", f"must be in (0, 1), got {calibration_fraction}")
        if calibration not in ("split", "augmented"):
            raise ConfigError("data.calibration", f"allowed: 'split', 'augmented'; got {calibration!r}")
        if class_assignment not in ("random", "cyclic", "blocks"):
            raise ConfigError("data.class_assignment", f"allowed: 'random', 'cyclic', 'blocks'; got {class_assignment!r}")
        if isinstance(validation_size, bool) or not (
                (isinstance(validation_size, int) and validation_size >= 0)
                or (isinstance(validation_size, float) and 0 < validation_size < 1)):
            raise ConfigError("data.validation_size", "allowed: a number of samples (an integer >= 0; 0 keeps no "
                              f"validation set) or a share of the private pool (a float in (0, 1)); got {validation_size!r}")
        check_at_least("data.local_class_min_samples", local_class_min_samples, 1)
        check_input_scaling(dataset, input_scaling)
        known = NUM_CLASSES.get(dataset)
        if partition == "classes" and known is not None:
            # here, not only in setup: a sweep's up-front check instantiates every config
            check_k_classes(num_clients, known, classes_per_client)
            if class_assignment == "cyclic":
                cyclic_k_classes(num_clients, known, classes_per_client)
            elif class_assignment == "blocks":
                check_blocks(num_clients, known, classes_per_client)
        self.dataset = dataset
        self.num_clients = num_clients
        self.partition = partition
        self.classes_per_client = classes_per_client
        self.dirichlet_alpha = dirichlet_alpha
        self.samples_per_client = samples_per_client
        self.public_size = public_size
        self.test_fraction = test_fraction
        self.calibration_fraction = calibration_fraction
        self.calibration = calibration
        if max_train_samples is not None and max_train_samples < 2:
            raise ConfigError("data.max_train_samples", f"must be >= 2 or null, got {max_train_samples}")
        check_at_least("data.max_length", max_length, 2)
        self.data_dir, self.augment, self.max_train_samples = data_dir, augment, max_train_samples
        self.tokenizer, self.max_length = tokenizer, max_length
        self.class_assignment = class_assignment
        self.validation_size = validation_size
        self.local_class_min_samples = local_class_min_samples
        self.input_scaling = input_scaling
        self.is_setup = False

    def setup(self, seed: int) -> FederatedData:
        """Load the dataset and build every split; raises ConfigError before any training."""
        rng = np.random.default_rng([seed, 0xFD])
        loaded = load_dataset(self.dataset, data_dir=self.data_dir, augment=self.augment,
                              max_train_samples=self.max_train_samples, tokenizer=self.tokenizer,
                              max_length=self.max_length, input_scaling=self.input_scaling)
        full, test = (loaded if isinstance(loaded, tuple) else (loaded, None))
        labels = full.y.numpy()
        if test is None:
            rest, test_pos = stratified_holdout(labels, self.test_fraction, rng)
            test = full.subset(torch.from_numpy(test_pos), f"{full.name}/test")
            self._test_source_index = test_pos
        else:
            rest = np.arange(len(full))
            self._test_source_index = None  # an official test split: a different source, disjoint by construction
        # sizes first: too many clients or too large a public set must stop here, not minutes into set-up
        need = MIN_PRIVATE_PER_CLIENT * self.num_clients
        if need > len(rest) - 1:
            raise ConfigError(
                "data.num_clients",
                f"must be <= {(len(rest) - 1) // MIN_PRIVATE_PER_CLIENT} for {self.dataset!r}: each client needs at "
                f"least {MIN_PRIVATE_PER_CLIENT} private samples, and {self.dataset!r} has {len(rest)} samples "
                f"outside the test set (the public set takes at least one); got {self.num_clients}",
            )
        if self.public_size > len(rest) - need:
            raise ConfigError(
                "data.public_size",
                f"must be <= {len(rest) - need}: the {len(rest)} non-test samples of {self.dataset!r} less "
                f"{MIN_PRIVATE_PER_CLIENT} private samples for each of the {self.num_clients} clients; "
                f"got {self.public_size}",
            )
        # public set: a stratified draw of public_size samples; the remainder is the private pool
        if self.public_size == 0:  # no public set (data-free methods): every non-test sample is private
            pool_pos, pub_pos = np.arange(len(rest)), np.zeros(0, dtype=np.int64)
        else:
            pub_frac = self.public_size / len(rest)
            pool_pos, pub_pos = stratified_holdout(labels[rest], pub_frac, rng)
            # rounding per class can miss public_size by a few; trim/top up from the pool deterministically
            pub_pos, pool_pos = _fix_size(pub_pos, pool_pos, self.public_size, rng)
        self.num_classes = full.num_classes
        self.test = test
        self.public = full.subset(torch.from_numpy(rest[pub_pos]), f"{full.name}/public")
        self.pool = full.subset(torch.from_numpy(rest[pool_pos]), f"{full.name}/private_pool")
        self.input_shape = full.input_shape
        self.input_transform = full.input_transform  # prepended to every client network by the loop
        self._pool_source_index = rest[pool_pos]  # positions in the source dataset, for overlap checks
        self._public_source_index = rest[pub_pos]
        self.validation, self._validation_source_index = None, None
        n_val = self._validation_count(len(pool_pos))
        if n_val:  # drawn only when asked for: without one, every random draw is as before
            keep, val = stratified_holdout(labels[rest[pool_pos]], n_val / len(pool_pos), rng)
            val, keep = _fix_size(val, keep, n_val, rng)
            self.validation = full.subset(torch.from_numpy(rest[pool_pos[val]]), f"{full.name}/validation")
            self._validation_source_index = rest[pool_pos[val]]
            pool_pos = pool_pos[keep]
            self.pool = full.subset(torch.from_numpy(rest[pool_pos]), f"{full.name}/private_pool")
            self._pool_source_index = rest[pool_pos]

        pool_labels = self.pool.y.numpy()
        if self.partition == "classes":
            if self.class_assignment == "cyclic":
                class_sets = cyclic_k_classes(self.num_clients, self.num_classes, self.classes_per_client)
            elif self.class_assignment == "blocks":
                class_sets = block_k_classes(self.num_clients, self.num_classes, self.classes_per_client, rng)
            else:
                class_sets = assign_k_classes(self.num_clients, self.num_classes, self.classes_per_client, rng)
            parts = sample_k_class_clients(pool_labels, class_sets, self.samples_per_client, rng)
        else:
            parts = dirichlet_partition(pool_labels, self.num_clients, self.dirichlet_alpha, rng)
        self.clients = [self._client(i, idx, rng, seed) for i, idx in enumerate(parts)]
        self.is_setup = True
        return self

    def keep_only(self, client_ids) -> None:
        """A deployment node's data after the (seeded, federation-wide) partition: its own clients'
        samples; every other client's samples and the private pool are dropped. Their classes stay:
        who holds which classes is what the round's facts name, not data."""
        keep = set(client_ids)
        self.clients = [cd if cd.client_id in keep else absent_client(cd.client_id, cd.classes, cd.train)
                        for cd in self.clients]
        self.pool = None

    def _validation_count(self, pool_size: int) -> int:
        """The validation set's size; it must leave every client its minimum of private samples."""
        v = self.validation_size
        n = int(round(v * pool_size)) if isinstance(v, float) else int(v)
        if isinstance(v, float):
            n = max(n, 1)
        room = pool_size - MIN_PRIVATE_PER_CLIENT * self.num_clients
        if n > room:
            raise ConfigError("data.validation_size", f"must leave {MIN_PRIVATE_PER_CLIENT} private samples for each of "
                              f"the {self.num_clients} clients: at most {max(room, 0)} of the {pool_size}-sample private "
                              f"pool of {self.dataset!r}; got {v!r} ({n} samples)")
        return n

    def local_classes(self, labels: np.ndarray) -> list[int]:
        """A client's local classes C_i from its private labels (see ``local_class_min_samples``)."""
        present, counts = np.unique(labels, return_counts=True)
        if self.partition != "dirichlet":
            return sorted(int(c) for c in present)
        # one stray sample of a class does not make a client an expert on it
        keep = present[counts >= self.local_class_min_samples]
        if len(keep) == 0:  # nothing above the threshold: its most frequent class(es)
            keep = present[counts == counts.max()]
        return sorted(int(c) for c in keep)

    def _client(self, i: int, pool_idx: np.ndarray, rng: np.random.Generator, seed: int) -> ClientData:
        labels = self.pool.y.numpy()[pool_idx]
        classes = self.local_classes(labels)
        if self.calibration == "split":
            tr, cal = stratified_holdout(labels, self.calibration_fraction, rng)
            train = self.pool.subset(torch.from_numpy(pool_idx[tr]), f"client{i}/train")
            calibration = self.pool.subset(torch.from_numpy(pool_idx[cal]), f"client{i}/calibration")
        else:
            train = self.pool.subset(torch.from_numpy(pool_idx), f"client{i}/train")
            g = torch.Generator().manual_seed(int(rng.integers(2**62)))
            x = augment_images(train.x, g) if train.x.dim() == 4 else train.x
            calibration = TensorDataset(x, train.y.clone(), train.num_classes, f"client{i}/calibration_augmented")
        if len(train) < 2 or len(calibration) < 1:
            raise ConfigError(
                "data.num_clients",
                f"client {i} got {len(train)} training and {len(calibration)} calibration samples; "
                "the private pool cannot serve this many clients with this partition",
            )
        return ClientData(i, classes, train, calibration, pool_idx)

    def local_test_mask(self, classes: list[int]) -> torch.Tensor:
        """Test samples whose label is one of ``classes`` (for local accuracy)."""
        return torch.isin(self.test.y, torch.tensor(classes))


def check_public_set(public_size: int, method: Any, mode: str = "fd") -> None:
    """Refuse ``data.public_size: 0`` for a method that needs a public set (every method but those
    that declare ``needs_public_set = False``); the baselines (mode other than ``fd``) need none."""
    if public_size == 0 and mode == "fd" and getattr(method, "needs_public_set", True):
        name = getattr(method, "label", None) or type(method).__name__
        raise ConfigError("data.public_size", f"0 leaves no public set, and {name} needs one (only methods that "
                          "declare needs_public_set = False, the data-free FD, run without one); "
                          f"allowed: >= 1 for {name}, or 0 with a data-free method; got {public_size}")


def check_input_scaling(dataset: str, value: str | None) -> None:
    """``data.input_scaling`` must be one of the scalings and one the dataset has (null: its default)."""
    if value is None:
        return
    if value not in ("standardize", "unit"):
        raise ConfigError("data.input_scaling", f"allowed: 'standardize', 'unit', null (the dataset's own); got {value!r}")
    supported = input_scalings(dataset)
    if dataset in NUM_CLASSES and value not in supported:
        what = f"allowed: {', '.join(map(repr, supported))} or null" if supported else "it is a text dataset: leave it null"
        raise ConfigError("data.input_scaling", f"{dataset!r} has no {value!r} scaling ({what}); got {value!r}")


def _fix_size(take: np.ndarray, rest: np.ndarray, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if len(take) > n:
        drop = rng.choice(len(take), size=len(take) - n, replace=False)
        rest = np.sort(np.concatenate([rest, take[drop]]))
        take = np.delete(take, drop)
    elif len(take) < n:
        add = rng.choice(len(rest), size=n - len(take), replace=False)
        take = np.sort(np.concatenate([take, rest[add]]))
        rest = np.delete(rest, add)
    return take, rest

"""The Fashion-MNIST study: every FD rule and the baselines at k in {2, 5, 10}, 3 seeds, on the real files.

    python scripts/fashion_mnist_study.py --out runs/fashion_mnist_study [--seeds 0 1 2] [--ks 2 5 10]
        [--jobs 2] [--rules AVG UWA ...] [--validation_size 500] [-- EXTRA FIT FLAGS]

Each run is a ``fit`` of configs/fashion_mnist.yaml (20 clients, LeNet-5, 10 rounds; needs
``apt-get install dataset-fashion-mnist`` or ``--data.data_dir``) with the rule's flags below, W&B
disabled, one torch thread per run (``--jobs`` runs at once). The table reports the validation-selected
mean global test accuracy after the private and after the public phase (mean ± std over seeds); the
table code, the re-use of finished runs and the layout of ``--out`` are those of scripts/digits_table.py.
13 rules x 3 k x 3 seeds = 117 runs.
"""

from __future__ import annotations

import digits_table

CONFIG = "configs/fashion_mnist.yaml"
LENET = "fdlit.models.LeNet5"
A = "fdlit.methods."
NO_PUBLIC_PHASE = ["--federation.public_epochs_first", "0", "--federation.public_epochs", "0"]
# rule -> (config, fit flags); each rule's settings are those of its digits config, with LeNet-5 wherever
# the method has a model of its own (DS-FL's server model)
RULES = {
    "AVG": (CONFIG, ["--aggregator", A + "ProbabilityAveraging"]),
    "UWA": (CONFIG, ["--aggregator", A + "UncertaintyWeighted"]),
    "sUWA": (CONFIG, ["--aggregator", A + "SmoothedUncertaintyWeighted", "--aggregator.tau", "0.25"]),
    "MM": (CONFIG, ["--aggregator", A + "MetaModel", "--aggregator.labelled_per_client", "15",
                    "--aggregator.hidden", "64", "--aggregator.steps", "300"]),
    "Selective-FD (features)": (CONFIG, [
        "--aggregator", A + "SelectiveFD", "--aggregator.labels", "soft",
        "--aggregator.client_quantile", "0.25", "--aggregator.server_threshold", "1.0",
        "--aggregator.features", "penultimate", "--aggregator.public_per_round", "1000",
        "--aggregator.private_weight", "0.5"]),
    "DS-FL": (CONFIG, ["--aggregator", A + "EntropyReduction", "--aggregator.temperature", "0.1",
                       "--server.model", LENET, "--server.optimizer", "adam", "--server.lr", "0.001",
                       "--server.batch_size", "64", "--server.epochs_first", "5", "--server.epochs", "2",
                       "--server.broadcast", "false"]),
    "FedMD": (CONFIG, ["--aggregator", A + "FedMD", "--aggregator.warmup_epochs", "5"]),
    "FedAvg": (CONFIG, ["--aggregator", A + "FedAvg", *NO_PUBLIC_PHASE]),
    # SCAFFOLD's control-variate update assumes plain SGD steps (its digits config: SGD, lr 0.05)
    "SCAFFOLD": (CONFIG, ["--aggregator", A + "Scaffold", "--client.optimizer", "sgd", "--client.lr", "0.05",
                          *NO_PUBLIC_PHASE]),
    # the data-free family: no public phase; the public set is drawn (the same private data as above) but unused
    "FD": (CONFIG, ["--aggregator", A + "FedDistill", "--aggregator.gamma", "1.0", "--aggregator.temperature", "1.0",
                    *NO_PUBLIC_PHASE]),
    "FedProto": (CONFIG, ["--aggregator", A + "FedProto", "--aggregator.lam", "1.0", *NO_PUBLIC_PHASE]),
    "local-only": (CONFIG, ["--federation.mode", "local_only"]),
    "centralized reference": (CONFIG, ["--federation.mode", "reference"]),
}

if __name__ == "__main__":
    digits_table.main(RULES, list(RULES), out="runs/fashion_mnist_study", ks=(2, 5, 10), validation_size=500,
                      doc=__doc__)

"""Bad input, one table: every case ends with exit status 2 and a message that starts with the field
it is about, and leaves the disk exactly as it was (no run directory, no file created, no existing
run changed). The commands run in-process through ``fdlit.cli.main``.

Placeholders in a case's arguments: NEW is a run_dir that does not exist yet; FILE a plain file;
EMPTY an empty folder; RUN a copy of a finished run (``RUN:<damage>`` damages it first); SWEEP a
sweep file made from the case's ``sweep`` parameters; a name in RAW a file with those bytes.
"""

import re
import shutil

import pytest
import torch
import yaml
from damage import flip_tensor_bytes

from fdlit.cli import main
from fdlit.federation.construction import available_accelerators
from fdlit.runs.directory import CHECKPOINT, CONFIG, RunLock

FIT = ["--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", "NEW"]
SWEEP_TAIL = ["--", "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", "NEW"]
HERE = available_accelerators()


DIGITS = "data:\n  dataset: digits\n  num_clients: 20\n"
# files a user might pass as a config or sweep file: (placeholder, bytes)
RAW = {
    "BINARY": bytes(range(256)) * 4,  # the first byte that is not UTF-8 is 0x80, after one newline (0x0a)
    "UTF16": "seed: 3\n".encode("utf-16"),
    "DUPKEYS": (DIGITS + "federation:\n  rounds: 2\nseed: 1\nfederation:\n  rounds: 5\n").encode(),
    "DUPNESTED": (DIGITS + "federation:\n  rounds: 2\n  private_epochs: 1\n  rounds: 7\n").encode(),
    "DUPDEEP": (DIGITS + "aggregator:\n  class_path: fdlit.methods.ProbabilityAveraging\n"
                "  init_args:\n    tau: 1\n    tau: 2\n").encode(),
    "EMPTYFILE": b"",
    "BLANKFILE": b"\n   \n# only a comment\n",
    "SCALAR": b"just some words\n",
    "LIST": b"- seed\n- 3\n",
    "BADYAML": (DIGITS + "seed: [unclosed\nfederation: {rounds: 2\n").encode(),
    "TABS": b"data:\n\tdataset: digits\n",
}


def fit(*args):
    return ["fit", *FIT, *args]


def resume(*args):
    return ["fit", "--resume", *args]


# (id, argv, field the message starts with, text the message must also hold: what is allowed)
CASES = [
    # run names and folders: a name is one folder name; run_dir a folder that can be written
    ("name-parent", fit("--logger.name", "../../x"), "logger.name", "letters, digits"),
    ("name-slash", fit("--logger.name", "a/b"), "logger.name", "names one folder"),
    ("name-absolute", fit("--logger.name", "/tmp/x"), "logger.name", "letters, digits"),
    ("name-dotdot", fit("--logger.name", ".."), "logger.name", "starting with a letter or digit"),
    ("name-empty", fit("--logger.name", ""), "logger.name", "1 to 120 characters"),
    ("name-space", fit("--logger.name", "my run"), "logger.name", "letters, digits"),
    ("name-long", fit("--logger.name", "x" * 121), "logger.name", "1 to 120 characters"),
    ("name-hidden", fit("--logger.name", ".hidden"), "logger.name", "starting with a letter or digit"),
    ("run-dir-empty", fit("--logger.run_dir", ""), "logger.run_dir", "must be a folder path"),
    ("run-dir-file", fit("--logger.run_dir", "FILE"), "logger.run_dir", "is a file"),
    ("run-dir-under-file", fit("--logger.run_dir", "FILE/runs"), "logger.run_dir", "is a file"),
    ("project-slash", fit("--logger.project", "team/project"), "logger.project", "W&B's rule"),
    ("project-hash", fit("--logger.project", "a#b"), "logger.project", "without any of"),
    ("project-empty", fit("--logger.project", ""), "logger.project", "1 to 128 characters"),
    ("project-long", fit("--logger.project", "p" * 129), "logger.project", "1 to 128 characters"),
    ("init-timeout-0", fit("--logger.init_timeout_s", "0"), "logger.init_timeout_s", "> 0"),
    ("init-timeout-neg", fit("--logger.init_timeout_s", "-3"), "logger.init_timeout_s", "> 0"),
    ("init-timeout-nan", fit("--logger.init_timeout_s", "nan"), "logger.init_timeout_s", "a number (nan is not allowed)"),
    ("init-timeout-inf", fit("--logger.init_timeout_s", ".inf"), "logger.init_timeout_s", "finite"),
    ("logger-mode", fit("--logger.mode", "sometimes"), "logger.mode", "online"),
    # model
    ("hidden-0", fit("--model.hidden", "[0]"), "model.hidden", "integer >= 1"),
    ("hidden-neg", fit("--model.hidden", "[-5]"), "model.hidden", "integer >= 1"),
    ("hidden-second-0", fit("--model.hidden", "[128, 0]"), "model.hidden", "integer >= 1"),
    ("hidden-not-list", fit("--model.hidden", "x"), "model.hidden", "Expected"),
    ("cnn-channels-0", fit("--model", "fdlit.models.SmallCNN", "--model.channels", "0"), "model.channels", ">= 1"),
    ("cnn-hidden-neg", fit("--model", "fdlit.models.SmallCNN", "--model.hidden", "-1"), "model.hidden", ">= 1"),
    ("dropout-1.5", fit("--model.dropout", "1.5"), "model.dropout", "[0, 1)"),
    ("dropout-neg", fit("--model.dropout", "-0.1"), "model.dropout", "[0, 1)"),
    ("model-unknown", fit("--model", "fdlit.models.NoSuchNet"), "model", "NoSuchNet"),
    # data
    ("k-with-dirichlet-from-config", fit("--data.partition", "dirichlet"), "data.classes_per_client",
     "partition=classes only"),
    ("k-with-dirichlet", fit("--data.partition", "dirichlet", "--data.classes_per_client", "3"),
     "data.classes_per_client", "leave it null"),
    ("num-clients-abbreviated", fit("--data.num_client", "5"), "data.num_client", "did you mean --data.num_clients"),
    ("public-abbreviated", fit("--data.public", "5"), "data.public", "no such option"),
    ("num-clients-5000", fit("--data.num_clients", "5000"), "data.num_clients", "must be <= 479"),
    ("num-clients-0", fit("--data.num_clients", "0"), "data.num_clients", ">= 1"),
    ("num-clients-text", fit("--data.num_clients", "abc"), "data.num_clients", "allowed: an integer; got 'abc'"),
    ("assignment-unknown", fit("--data.class_assignment", "round_robin"), "data.class_assignment",
     "allowed: 'random', 'cyclic', 'blocks'; got 'round_robin'"),
    ("blocks-k-3", fit("--data.class_assignment", "blocks", "--data.classes_per_client", "3"),
     "data.classes_per_client", "must divide 10; got 3"),
    ("blocks-18-clients", fit("--data.class_assignment", "blocks", "--data.num_clients", "18"),
     "data.class_assignment", "multiple of 5; got 18"),
    ("scaling-unknown", fit("--data.input_scaling", "minmax"), "data.input_scaling",
     "allowed: 'standardize', 'unit', null; got 'minmax'"),
    ("scaling-digits-standardize", fit("--data.input_scaling", "standardize"), "data.input_scaling",
     "allowed: 'unit' or null"),
    ("public-1437", fit("--data.public_size", "1437"), "data.public_size", "must be <= 1378"),
    ("public-5000", fit("--data.public_size", "5000"), "data.public_size", "must be <="),
    ("public-0", fit("--data.public_size", "0"), "data.public_size", ">= 1"),
    ("k-0", fit("--data.classes_per_client", "0"), "data.classes_per_client", ">= 1"),
    ("k-11", fit("--data.classes_per_client", "11"), "data.classes_per_client", "[1, 10]"),
    ("k-no-coverage", fit("--data.num_clients", "5", "--data.classes_per_client", "1"), "data.classes_per_client",
     "held by no client"),
    ("calibration-1.5", fit("--data.calibration_fraction", "1.5"), "data.calibration_fraction", "(0, 1)"),
    ("calibration-0", fit("--data.calibration_fraction", "0"), "data.calibration_fraction", "(0, 1)"),
    ("test-fraction-1", fit("--data.test_fraction", "1"), "data.test_fraction", "(0, 1)"),
    ("alpha-0", fit("--data.partition", "dirichlet", "--data.classes_per_client", "null", "--data.dirichlet_alpha",
                    "0"), "data.dirichlet_alpha", "> 0"),
    ("samples-1", fit("--data.samples_per_client", "1"), "data.samples_per_client", ">= 2 or null"),
    ("samples-5000", fit("--data.samples_per_client", "5000"), "data.samples_per_client", "at most"),
    ("dataset-unknown", fit("--data.dataset", "nosuch"), "data.dataset", "allowed"),
    ("calibration-mode", fit("--data.calibration", "nope"), "data.calibration", "split"),
    ("max-length-1", fit("--data.max_length", "1"), "data.max_length", ">= 2"),
    ("max-train-1", fit("--data.max_train_samples", "1"), "data.max_train_samples", ">= 2 or null"),
    ("data-unknown-key", fit("--data.no_such_key", "1"), "data.no_such_key", "no such option"),
    # client
    ("weight-decay-neg", fit("--client.weight_decay", "-0.1"), "client.weight_decay", ">= 0"),
    ("momentum-neg", fit("--client.momentum", "-1"), "client.momentum", ">= 0"),
    ("lr-0", fit("--client.lr", "0"), "client.lr", "> 0"),
    ("public-lr-neg", fit("--client.public_lr", "-1"), "client.public_lr", "> 0"),
    ("batch-0", fit("--client.batch_size", "0"), "client.batch_size", ">= 1"),
    ("public-batch-0", fit("--client.public_batch_size", "0"), "client.public_batch_size", ">= 1"),
    ("optimizer", fit("--client.optimizer", "lbfgs"), "client.optimizer", "adam"),
    # privacy
    ("delta-1", fit("--privacy.delta", "1"), "privacy.delta", "(0, 1)"),
    ("delta-0", fit("--privacy.delta", "0"), "privacy.delta", "(0, 1)"),
    ("delta-neg", fit("--privacy.delta=-1e-5"), "privacy.delta", "(0, 1)"),
    ("budget-0", fit("--privacy.noise_multiplier", "1", "--privacy.epsilon_budget", "0"), "privacy.epsilon_budget",
     "> 0"),
    ("budget-neg", fit("--privacy.noise_multiplier", "1", "--privacy.epsilon_budget", "-2"),
     "privacy.epsilon_budget", "> 0"),
    ("budget-without-noise", fit("--privacy.epsilon_budget", "3"), "privacy.epsilon_budget", "noise_multiplier > 0"),
    ("sigma-neg", fit("--privacy.noise_multiplier", "-0.5"), "privacy.noise_multiplier", ">= 0"),
    ("clip-0", fit("--privacy.clip_norm", "0"), "privacy.clip_norm", "> 0"),
    ("clip-neg", fit("--privacy.clip_norm", "-1"), "privacy.clip_norm", "> 0"),
    ("encoding-unknown", fit("--privacy.encoding", "zip"), "privacy.encoding", "hard"),
    ("bits-0", fit("--privacy.bits", "0"), "privacy.bits", "[1, 16]"),
    ("bits-17", fit("--privacy.bits", "17"), "privacy.bits", "[1, 16]"),
    ("top-k-0", fit("--privacy.top_k", "0"), "privacy.top_k", "[1, C]"),
    ("top-k-11", fit("--aggregator.upload", "scores", "--privacy.encoding", "top_k", "--privacy.top_k", "11"),
     "privacy.top_k", "[1, 10]"),
    ("accountant-unknown", fit("--privacy.accountant", "moments"), "privacy.accountant", "rdp"),
    ("accounting-unknown", fit("--privacy.accounting", "trusted"), "privacy.accounting", "secure_aggregation"),
    ("secure-threshold-0", fit("--privacy.secure_threshold", "0", "--privacy.secure_aggregation", "true"),
     "privacy.secure_threshold", "(0, 1]"),
    ("secure-threshold-alone", fit("--privacy.secure_threshold", "0.7"), "privacy.secure_threshold",
     "secure aggregation only"),
    ("secure-with-a-median", fit("--aggregator", "fdlit.methods.CoordinateMedian",
                                                              "--privacy.secure_aggregation", "true"),
     "privacy.secure_aggregation", "order statistic"),
    ("central-with-non-linear-rule", fit("--privacy.noise_multiplier", "1", "--privacy.accounting", "central"),
     "privacy.accounting", "non-linearly"),
    ("dp-with-setup-rule", fit("--aggregator", "fdlit.methods.MetaModel",
                               "--privacy.noise_multiplier", "1"), "privacy.noise_multiplier", "logits only"),
    ("dp-with-uwa-scores", fit("--aggregator.upload", "scores", "--privacy.noise_multiplier", "1"),
     "privacy.noise_multiplier", "upload: density"),
    ("hard-with-uwa-density", fit("--privacy.encoding", "hard"), "privacy.encoding", "upload: scores"),
    # aggregator
    ("tau-neg", fit("--aggregator.tau", "-1"), "aggregator.tau", ">= 0"),
    ("tau-nan", fit("--aggregator.tau", "nan"), "aggregator.tau", "allowed: a number (nan is not allowed)"),
    ("tau-inf", fit("--aggregator.tau", ".inf"), "aggregator.tau", "finite"),
    ("aggregator-unknown", fit("--aggregator", "fdlit.methods.Nope"), "aggregator", "Nope"),
    ("variance-floor-0", fit("--aggregator.variance_floor", "0"), "aggregator.variance_floor", "> 0"),
    ("min-calibration-1", fit("--aggregator.min_calibration_samples", "1"), "aggregator.min_calibration_samples",
     ">= 2"),
    # server model
    ("server-model-unknown", fit("--server.model", "fdlit.models.NoSuchNet"), "server.model", "NoSuchNet"),
    ("server-model-not-module", fit("--server.model", "collections.OrderedDict"), "server.model",
     "collections.OrderedDict is not a network"),
    ("server-epochs-neg", fit("--server.model", "fdlit.models.MLP", "--server.epochs", "-1"), "server.epochs",
     ">= 0"),
    ("server-epochs-first-neg", fit("--server.model", "fdlit.models.MLP", "--server.epochs_first", "-2"),
     "server.epochs_first", ">= 0"),
    ("server-lr-0", fit("--server.model", "fdlit.models.MLP", "--server.lr", "0"), "server.lr", "> 0"),
    ("server-batch-0", fit("--server.model", "fdlit.models.MLP", "--server.batch_size", "0"), "server.batch_size",
     ">= 1"),
    ("server-optimizer", fit("--server.model", "fdlit.models.MLP", "--server.optimizer", "lbfgs"),
     "server.optimizer", "adam"),
    ("fedmd-warmup-neg", fit("--aggregator", "fdlit.methods.FedMD", "--aggregator.warmup_epochs", "-1"),
     "aggregator.warmup_epochs", ">= 0"),
    ("feddf-epochs-neg", fit("--aggregator", "fdlit.methods.FedDF", "--aggregator.epochs", "-1"),
     "aggregator.epochs", ">= 0"),
    # seed, federation, config
    ("seed-neg", fit("--seed", "-1"), "seed", "[0, 4294967295]"),
    ("seed-huge", fit("--seed", "99999999999"), "seed", "[0, 4294967295]"),
    ("seed-text", fit("--seed", "abc"), "seed", "allowed: an integer; got 'abc'"),
    ("accelerator-unknown", fit("--federation.accelerator", "quantum"), "federation.accelerator", "allowed: auto"),
    # a device this machine lacks (skipped where it has one)
    ("accelerator-tpu", fit("--federation.accelerator", "tpu"), "federation.accelerator", "allowed on this machine"),
    ("accelerator-gpu", fit("--federation.accelerator", "gpu"), "federation.accelerator", "allowed on this machine"),
    ("accelerator-cuda", fit("--federation.accelerator", "cuda"), "federation.accelerator", "allowed on this machine"),
    ("rounds-0", fit("--federation.rounds", "0"), "federation.rounds", ">= 1"),
    # participation (client sampling, dropout, late joiners, per-round public subset)
    ("participation-fraction-0", fit("--federation.participation.fraction", "0"), "federation.participation.fraction", "(0, 1]"),
    ("participation-fraction-big", fit("--federation.participation.fraction", "1.5"), "federation.participation.fraction", "(0, 1]"),
    ("participation-fraction-nan", fit("--federation.participation.fraction", "nan"),
     "federation.participation.fraction", "allowed: a number or null (nan is not allowed)"),
    ("participation-count-0", fit("--federation.participation.count", "0"), "federation.participation.count", "[1, num_clients]"),
    ("participation-count-big", fit("--federation.participation.count", "21"), "federation.participation.count", "[1, 20]"),
    ("participation-both", fit("--federation.participation.count", "5", "--federation.participation.fraction", "0.5"), "federation.participation.fraction", "not both"),
    ("participation-dropout-1", fit("--federation.participation.dropout", "1"), "federation.participation.dropout", "[0, 1)"),
    ("participation-join-0", fit("--federation.participation.join_rounds", "[0]"), "federation.participation.join_rounds", "rounds >= 1"),
    ("participation-join-length", fit("--federation.participation.join_rounds", "[1, 2]"), "federation.participation.join_rounds", "20 values"),
    ("participation-late-all", fit("--federation.participation.late_joiners", "20", "--federation.participation.join_round", "3"), "federation.participation.late_joiners",
     "[0, 19]"),
    ("participation-subset-0", fit("--federation.participation.public_subset", "0"), "federation.participation.public_subset", "[1, public size]"),
    ("participation-public-fraction", fit("--federation.participation.public_fraction", "0"),
     "federation.participation.public_fraction", "(0, 1]"),
    ("participation-subset-big", fit("--federation.participation.public_subset", "501"), "federation.participation.public_subset", "[1, 500]"),
    ("private-epochs-neg", fit("--federation.private_epochs", "-1"), "federation.private_epochs", ">= 0"),
    ("public-epochs-first-neg", fit("--federation.public_epochs_first", "-1"), "federation.public_epochs_first",
     ">= 0"),
    ("precision", fit("--federation.precision", "8-bit"), "federation.precision", "32-true"),
    ("message-dtype", fit("--federation.message_dtype", "int8"), "federation.message_dtype", "float32"),
    ("mode", fit("--federation.mode", "nope"), "federation.mode", "local_only"),
    ("client-class", fit("--federation.client_class", "collections.OrderedDict"), "federation.client_class",
     "ClientModule"),
    ("config-unknown", ["fit", "--config", "nope.yaml"], "config", "digits.yaml"),
    # config files: refused naming the file and the line, before jsonargparse reads them
    ("config-binary", ["fit", "--config", "BINARY"], "config", "BINARY, line 2: not UTF-8 text (byte 0x80)"),
    ("config-utf16", ["fit", "--config", "UTF16"], "config", "UTF16, line 1: not UTF-8 text (byte 0xff)"),
    ("config-duplicate-key", ["fit", "--config", "DUPKEYS"], "config",
     "DUPKEYS, line 7: not valid YAML (duplicate key 'federation' (first on line 4))"),
    ("config-duplicate-nested", ["fit", "--config", "DUPNESTED"], "config",
     "DUPNESTED, line 7: not valid YAML (duplicate key 'rounds' (first on line 5))"),
    ("config-duplicate-deep", ["fit", "--config", "DUPDEEP"], "config", "DUPDEEP, line 8: not valid YAML "
     "(duplicate key 'tau' (first on line 7))"),
    ("config-duplicate-second-file", ["fit", "--config", "digits.yaml", "--config=DUPKEYS"], "config",
     "duplicate key 'federation'"),
    ("config-empty", ["fit", "--config", "EMPTYFILE"], "config", "EMPTYFILE is empty"),
    ("config-blank", ["fit", "--config", "BLANKFILE"], "config", "BLANKFILE is empty"),
    ("config-scalar", ["fit", "--config", "SCALAR"], "config", "SCALAR must hold a YAML mapping"),
    ("config-list", ["fit", "--config", "LIST"], "config", "LIST must hold a YAML mapping (keys and values"),
    ("config-not-yaml", ["fit", "--config", "BADYAML"], "config", "BADYAML, line 5: not valid YAML"),
    ("config-tabs", ["fit", "--config", "TABS"], "config", "TABS, line 2: not valid YAML"),
    # impossible settings the config alone shows (refused before any data is loaded)
    ("join-after-last-round", fit("--federation.participation.join_rounds", "[3" + ", 3" * 19 + "]",
                                  "--federation.rounds", "2"), "federation.participation.join_rounds",
     "no client joins within federation.rounds = 2"),
    ("f2l-regions-above-m", fit("--aggregator", "fdlit.methods.F2L", "--aggregator.regions", "21"),
     "aggregator.regions", "every region needs a client"),
    ("f2l-region-ids-length", fit("--aggregator", "fdlit.methods.F2L", "--aggregator.regions",
                                  "[0, 1, 0]"), "aggregator.regions", "one region id per client (20)"),
    ("f2l-fedavg-regions-above-m", fit("--aggregator", "fdlit.methods.F2LParams", "--aggregator.regions", "25"),
     "aggregator.regions", "every region needs a client"),
    ("command-unknown", ["train"], "command", "fit, sweep, report"),
    # resume
    ("resume-no-dir", resume(), "resume", "needs a run directory"),
    ("resume-missing", resume("/no/such/run"), "resume", "no run directory"),
    ("resume-file", resume("FILE"), "resume", "that is a file"),
    ("resume-seed", resume("RUN", "--seed", "3"), "resume", "--federation.rounds"),
    ("resume-name", resume("RUN", "--logger.name", "other"), "resume", "cannot be changed"),
    ("resume-abbreviated", resume("RUN", "--federation.round", "5"), "resume", "cannot be changed"),
    ("resume-fewer-rounds", resume("RUN", "--federation.rounds", "1"), "resume", "beyond federation.rounds = 1"),
    ("resume-rounds-text", resume("RUN", "--federation.rounds", "abc"), "federation.rounds",
     "allowed: an integer; got 'abc'"),
    ("resume-config-not-yaml", resume("RUN:bad_yaml"), "config",
     "config.yaml, line 2: not valid YAML (expected ',' or ']', but got '<stream end>'; while parsing a flow "
     "sequence from line 1)"),
    ("resume-config-empty", resume("RUN:empty_config"), "config", "config.yaml is empty"),
    ("resume-config-binary", resume("RUN:binary_config"), "config", "config.yaml, line 1: not UTF-8"),
    ("resume-config-duplicate", resume("RUN:duplicate_config"), "config", "duplicate key 'seed'"),
    ("resume-flipped-checkpoint", resume("RUN:flipped"), "resume", "is damaged: its contents do not match the "
     "checksum written with it; the newest intact checkpoint kept is round 2's; continue from it with: "),
    ("resume-flipped-kept", resume("RUN:flipped_kept/checkpoint-r2.pt"), "resume", "checkpoint-r2.pt is damaged"),
    ("resume-kept-missing", resume("RUN/checkpoint-r9.pt"), "resume", "no run directory"),
    ("resume-config-unknown-key", resume("RUN:unknown_key"), "data.nosuch", "config.yaml:"),
    ("resume-no-checkpoint", resume("RUN:missing_all"), "resume", "no round of that run completed"),
    ("resume-no-checkpoint-but-kept", resume("RUN:missing"), "resume", "has no checkpoint.pt; the newest intact "
     "checkpoint kept is round 2's; continue from it with: python -m fdlit fit --resume "),
    ("resume-no-config", resume("RUN:no_config"), "resume", "has no config.yaml"),
    ("resume-pickled", resume("RUN:pickled"), "resume", "refusing to load"),
    ("resume-truncated", resume("RUN:truncated"), "resume", "not a readable fdlit checkpoint"),
    ("resume-foreign", resume("RUN:not_fdlit"), "resume", "not an fdlit checkpoint"),
    ("resume-other-config", resume("RUN:other_config"), "resume", "different config"),
    ("resume-in-use", resume("RUN:locked"), "resume", "is in use by pid"),
    # sweeps: every combination is checked before the first one runs
    ("sweep-name", ["sweep", "SWEEP", *SWEEP_TAIL], "logger.name", "names one folder",
     {"logger.name": {"values": ["ok", "../x"]}}),
    ("sweep-seed", ["sweep", "SWEEP", *SWEEP_TAIL], "seed", "[0, 4294967295]", {"seed": {"values": [0, -1]}}),
    ("sweep-weight-decay", ["sweep", "SWEEP", *SWEEP_TAIL], "client.weight_decay", ">= 0",
     {"client.weight_decay": {"values": [0.0, -1.0]}}),
    ("sweep-dirichlet", ["sweep", "SWEEP", *SWEEP_TAIL], "data.classes_per_client", "partition=classes only",
     {"data.partition": {"values": ["classes", "dirichlet"]}}),
    ("sweep-accelerator", ["sweep", "SWEEP", *SWEEP_TAIL], "federation.accelerator", "allowed",
     {"federation.accelerator": {"values": ["cpu", "quantum"]}}),
    ("sweep-abbreviated", ["sweep", "SWEEP", *SWEEP_TAIL], "parameters", "data.num_client",
     {"data.num_client": {"values": [5]}}),
    ("sweep-distribution", ["sweep", "SWEEP", *SWEEP_TAIL], "parameters.aggregator.tau", "values",
     {"aggregator.tau": {"min": 0.0, "max": 1.0}}),
    ("sweep-missing-file", ["sweep", "/no/such/sweep.yaml"], "sweep", "no sweep file"),
    ("sweep-not-yaml", ["sweep", "BADYAML"], "sweep", "BADYAML, line 5: not valid YAML"),
    ("sweep-binary", ["sweep", "BINARY"], "sweep", "not UTF-8 text"),
    ("sweep-duplicate-key", ["sweep", "DUPKEYS"], "sweep", "duplicate key 'federation'"),
    ("sweep-empty", ["sweep", "EMPTYFILE"], "sweep", "EMPTYFILE is empty"),
    ("sweep-list", ["sweep", "LIST"], "sweep", "must hold a YAML mapping"),
    # reports
    ("report-missing", ["report", "/no/such/runs"], "runs", "is not a folder"),
    ("report-empty", ["report", "EMPTY"], "runs", "no finished run directories"),
    ("report-out-file", ["report", "RUNS", "--out", "FILE"], "out", "is a file"),
    ("report-abbreviated", ["report", "RUNS", "--include", "true"], "include", "no such option"),
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    parent = tmp_path_factory.mktemp("finished")
    args = ["fit", "--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", str(parent / "runs"), "--federation.rounds", "2",
            "--federation.private_epochs_first", "1", "--federation.private_epochs", "1",
            "--federation.public_epochs_first", "1", "--federation.public_epochs", "1",
            "--data.num_clients", "3", "--data.classes_per_client", "4", "--data.public_size", "100",
            "--checkpoint.keep", "1"]
    assert main(args) == 0
    (run,) = (parent / "runs").iterdir()
    return run


class Pickled:
    def __reduce__(self):
        return (print, ("code ran",))


def _other_config(run):
    (run / CONFIG).write_text((run / CONFIG).read_text().replace("tau: 0.25", "tau: 0.5"))


DAMAGE = {
    "missing": lambda run: (run / CHECKPOINT).unlink(),
    "missing_all": lambda run: [p.unlink() for p in run.glob("checkpoint*.pt")],
    "no_config": lambda run: (run / CONFIG).unlink(),
    "pickled": lambda run: torch.save({"format": "fdlit-checkpoint", "version": 2, "x": Pickled()}, run / CHECKPOINT),
    "truncated": lambda run: (run / CHECKPOINT).write_bytes((run / CHECKPOINT).read_bytes()[:1000]),
    "not_fdlit": lambda run: torch.save({"weights": torch.ones(2)}, run / CHECKPOINT),
    "other_config": _other_config,
    "bad_yaml": lambda run: (run / CONFIG).write_text("seed: [unclosed\n"),
    "unknown_key": lambda run: (run / CONFIG).write_text((run / CONFIG).read_text().replace("data:\n", "data:\n  nosuch: 3\n", 1)),
    "locked": lambda run: None,  # the test holds the run's lock, as a second process would
    "empty_config": lambda run: (run / CONFIG).write_text(""),
    "binary_config": lambda run: (run / CONFIG).write_bytes(b"\xff\xfe\x00garbage"),
    "duplicate_config": lambda run: (run / CONFIG).write_text((run / CONFIG).read_text() + "seed: 5\n"),
    "flipped": lambda run: flip_tensor_bytes(run / CHECKPOINT),
    "flipped_kept": lambda run: flip_tensor_bytes(run / "checkpoint-r2.pt"),
}


def snapshot(root):
    """Every path under ``root`` with its bytes and modification time."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
            for p in sorted(root.rglob("*"))}


def param(case):
    device = case[0].removeprefix("accelerator-")
    present = device in ("tpu", "gpu", "cuda") and device in HERE
    return pytest.param(case, id=case[0], marks=pytest.mark.skipif(present, reason=f"this machine has a {device}"))


@pytest.mark.parametrize("case", [param(c) for c in CASES])
def test_bad_input_exits_2_names_the_field_and_changes_nothing(case, tmp_path, capsys, finished_run):
    case_id, argv, field, allowed, *sweep = case
    world = tmp_path / "world"
    (world / "EMPTY").mkdir(parents=True)
    (world / "FILE").write_text("not a folder\n")
    for name, raw in RAW.items():
        (world / name).write_bytes(raw)
    runs = world / "RUNS"
    run = runs / finished_run.name
    shutil.copytree(finished_run, run)
    lock = None
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg.startswith("RUN:"):
            damage, _, inside = arg.split(":", 1)[1].partition("/")
            DAMAGE[damage](run)
            if damage == "locked":
                lock = RunLock(run).acquire()
            argv[i] = str(run / inside) if inside else str(run)
        elif arg.split("/")[0] == "RUN":
            argv[i] = str(run) + arg[len("RUN"):]
        elif arg == "SWEEP":
            spec = {"name": "bad", "method": "grid", "parameters": sweep[0],
                    "command": ["python", "-m", "fdlit", "fit", "--config", "digits.yaml", "${args}"]}
            argv[i] = str(world / "bad.yaml")
            (world / "bad.yaml").write_text(yaml.safe_dump(spec))
        elif arg.split("/")[0] in ("NEW", "FILE", "EMPTY", "RUNS", *RAW):
            argv[i] = str(world / arg)
        elif arg.startswith("--config=") and arg.split("=", 1)[1] in RAW:
            argv[i] = f"--config={world / arg.split('=', 1)[1]}"
    before = snapshot(world)
    capsys.readouterr()
    try:
        code = main(argv)
    finally:
        if lock is not None:
            lock.release()
    err = capsys.readouterr().err
    assert code == 2, err
    # a key of a config file is also named with the file and line that hold it: "<file>:<line>: <field>: "
    assert re.match(rf"fdlit: error: (\S+:\d+: )?{re.escape(field)}: ", err), err
    assert allowed in err, err
    assert len(err.strip().splitlines()) == 1, err  # one line, no traceback or usage dump
    assert not (world / "NEW").exists()
    assert snapshot(world) == before  # nothing created, nothing existing changed


def test_the_table_is_large_enough():
    assert len(CASES) >= 60

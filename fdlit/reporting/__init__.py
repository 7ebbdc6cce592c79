"""``python -m fdlit report <runs dir> [...]``: the paper's tables and figures from local run directories.

Reads ``config.yaml``, ``metrics.jsonl`` and ``summary.json`` of every run under the folder (no W&B
needed) and writes ``<out>/index.html`` (self-contained: figures inlined as PNG data URIs; every
value from a run escaped, and a Content-Security-Policy that allows no script and no request),
``<out>/figures/<name>.{pdf,svg,png}`` (see :mod:`fdlit.reporting.paper_figures`: one- or two-column paper
size, text >= 8 pt, no in-plot titles, the captions are in the page) and Table 1 as ``table1.md``,
``table1.csv`` and ``table1.tex`` (booktabs, cells ``$m \\pm s$``):

- a settings header: what all runs share, what varies (a knob only some methods have, like sUWA's
  τ, varies only when the runs that have it differ in it), the seeds, which metric the table holds;
- Table 1 in the layout of Kovalchuk et al. (2026, Table 1): a row per rule, a column per k, each
  split into the best accuracy after the private and after the public phase and the personalized
  accuracy (each client on its own classes: ``after_public/local_acc_mean``), mean ± std over seeds
  (no std with n = 1); the fully informed reference (``federation.mode: reference``) in its own
  ``Ref.`` column and the no-communication baseline (``local_only``) in its own row, neither ever
  marked; a column (phase, Ref., dataset) with nothing to show is left out. Rows are named by what
  they are: sUWA at τ = 0 is AVG, at τ = 1 UWA.
- The bold rule: a column's best rule is bold only when it beats the second best by Welch's t-test
  over seeds (unequal variances, two-sided, p < 0.05, at least 3 seeds each); otherwise every rule
  the test does not show to be worse than the best is marked as tied for best (underlined; a dagger
  in ``table1.md``).
- Figure 2: best accuracy vs k (Kovalchuk et al. 2026, Fig. 2); accuracy vs sUWA's τ; χ vs k;
- App. B curves: mean global and local accuracy vs round, shaded ±1 std over seeds
  (Kovalchuk et al. 2026, App. B.1); χ vs round; accuracy vs cumulative bytes (up + down);
- the last round's who-to-trust matrix of every rule, k and seed, a dot on each client's own classes,
  in files named by the run (``trust_<run directory>``);
- beside Table 1: the privacy table (runs that measure privacy), the bytes table (``bytes.md``: accuracy,
  rounds and MB per client to 95 % of the best), the round-budget table (``budgets.md``, with
  ``budgets``) and the adversaries table (``adversaries.md``: honest accuracy and attackers' weight by
  share of attackers).

"Best" is the best round's mean over clients (``summary.json``; the metrics when it lacks it). Each
run is selected by its own rule: when its summary holds a validation-selected accuracy
(``selected_global_acc_mean``), that one is used instead, and each row says which (``selected by``),
so a run's row never depends on the other runs of the folder. Std is the sample std over seeds (n-1). Each (setting, seed) counts
once: when several run directories hold the same config (a sweep run again, a run copied), the
finished one with the most rounds is used and the others are listed as left out, with the reason
(``include_duplicates`` keeps them all); unfinished runs are left out unless ``include_unfinished``.

A mixed folder is split into sections (a dataset, and model), each with its own table and figures,
and runs of different settings are labelled by what tells them apart (:mod:`~fdlit.reporting.groups`).

Modules: :mod:`~fdlit.reporting.runs` (which runs), :mod:`~fdlit.reporting.labels` (how they are
named), :mod:`~fdlit.reporting.groups` (sections and setting groups), :mod:`~fdlit.reporting.table` and :mod:`~fdlit.reporting.table_files` (Table 1),
:mod:`~fdlit.reporting.measure_table`, :mod:`~fdlit.reporting.bytes_table`, :mod:`~fdlit.reporting.budget_table`,
:mod:`~fdlit.reporting.privacy_table` and :mod:`~fdlit.reporting.adversaries_table` (the other tables),
:mod:`~fdlit.reporting.figures`, :mod:`~fdlit.reporting.adversaries` and
:mod:`~fdlit.reporting.paper_figures` (the figures), :mod:`~fdlit.reporting.page` (``index.html``),
:mod:`~fdlit.reporting.write` (the command).
"""

from fdlit.reporting.figures import (
    accuracy_vs_epsilon,
    accuracy_vs_tau,
    bytes_total,
    chi_vs_k,
    curves,
    figure2,
    trust_figures,
    upload_attacks_vs_epsilon,
)
from fdlit.reporting.labels import LOCAL_LABEL, REF_LABEL, method_label, run_kind, setting_key, suwa_tau
from fdlit.reporting.runs import ACC, LOCAL, PRIVATE_ACC, SELECTED, Run, load_runs, shared_settings
from fdlit.reporting.table import BOLD_RULE, Stat, Table, beats, table1, table1_caption
from fdlit.reporting.write import write_report

__all__ = [
    "ACC", "BOLD_RULE", "LOCAL", "LOCAL_LABEL", "PRIVATE_ACC", "REF_LABEL", "SELECTED", "Run", "Stat", "Table",
    "accuracy_vs_epsilon", "accuracy_vs_tau", "beats", "bytes_total", "chi_vs_k", "curves", "figure2", "load_runs",
    "method_label", "run_kind", "setting_key", "shared_settings", "suwa_tau", "table1", "table1_caption",
    "trust_figures", "upload_attacks_vs_epsilon", "write_report",
]

"""fdlit: federated distillation experiments.

data -> clients -> methods (fdlit.aggregators) -> the round (fdlit.federation) -> execution -> runs
(docs/design.md)
"""

__version__ = "0.1.0"

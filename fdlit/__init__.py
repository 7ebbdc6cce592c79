"""fdlit: federated distillation experiments.

data -> clients -> methods (fdlit.methods) -> the round (fdlit.federation) -> execution -> runs
(docs/design.md)
"""

__version__ = "0.1.0"

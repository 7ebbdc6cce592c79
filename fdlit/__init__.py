"""fdlit: federated distillation experiments.

data -> clients -> federation loop -> aggregators -> loggers
"""

__version__ = "0.1.0"

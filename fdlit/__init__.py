"""fdlit: federated distillation experiments.

data -> clients -> federation loop -> aggregators -> loggers
"""

import os

# Same config + seed must give the same metrics on CPU (issue 6). MKL's default BLAS may take
# different code paths for differently aligned buffers, so results can differ in the last bits run to
# run; Conditional Numerical Reproducibility (STRICT) removes that for a fixed thread count. It must
# be set before MKL's first call, i.e. before fdlit's modules import torch; a user's value wins.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.1.0"

"""gemm-tune's tuner: search space, occupancy model, GPU runner, cuBLAS baseline,
Optuna search, cache of winners and the command line.

Importing it loads no GPU package; the GPU modules import pycuda when first used.
"""

__all__: list[str] = []

"""Golden sources: a config's rendered .cu pinned under tests/golden/.

Regenerate with GEMM_TUNE_UPDATE_GOLDEN=1 after a deliberate template change.
"""

import os
from pathlib import Path

from codegen import render

GOLDEN = Path(__file__).parent / "golden"


def rendered_as_golden(cfg) -> str:
    """`cfg`'s source, asserted equal to its golden file (rewritten first when asked)."""
    path = GOLDEN / f"{cfg.name}.cu"
    src = render(cfg)
    if os.environ.get("GEMM_TUNE_UPDATE_GOLDEN"):
        path.write_text(src)
    assert src == path.read_text(), f"{cfg.name}: the source differs from {path}"
    return src

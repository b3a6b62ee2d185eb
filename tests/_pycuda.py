"""pycuda as a second loader of a cubin in GPU tests: its reading of a kernel's registers
and shared memory checks ptxas's and the runner's (the design card's role for pycuda)."""

_PYCUDA_CTX: list = []  # pycuda's handle on the primary context, pushed once


def pycuda_driver(dev):
    """pycuda.driver with GPU dev's primary context pushed (popped at exit), or None where
    pycuda is not installed: the cross-check of the runner's figures by another loader."""
    try:
        import pycuda.driver as drv
    except ImportError:
        return None
    if not _PYCUDA_CTX:
        import atexit

        drv.init()
        ctx = drv.Device(dev.index).retain_primary_context()
        ctx.push()  # pycuda loads into its own context stack's top: the same context
        atexit.register(ctx.pop)
        _PYCUDA_CTX.append(ctx)
    return drv

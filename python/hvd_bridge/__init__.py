"""hvd-bridge for Python: run a Python function as an MPI job, on a Spark cluster
(``hvd_bridge.spark.run``) or without one (``hvd_bridge.run``), and train with
``hvd_bridge.torch`` (a drop-in for ``horovod.torch``).

The engine is C (the driver and task services, ``hvd-rsh``, ``hvd-exec``, the collective
runtime); this package is its door: ``hvd_bridge._core`` is a CPython extension over the C
libraries, and the package carries the programs (``bin_dir()``).
"""
import os

__version__ = "0.2.0"


def bin_dir():
    """The directory holding hvd-driver, hvd-task, hvd-rsh and hvd-exec of this package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def lib_dir():
    """The directory holding the package's shared libraries (libhvd_runtime.so, ...)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")


from ._job import JobError  # noqa: E402
from .runner import run  # noqa: E402

__all__ = ["run", "JobError", "bin_dir", "lib_dir", "__version__"]

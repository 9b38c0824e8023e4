"""The package's programs on the PATH of the environment it is installed in (pip's console
scripts): ``hvd-driver`` (the horovodrun of hvd-bridge) and ``hvd-task`` (a task service
started by hand). Each replaces this process with the program of the package's bin
directory, which finds its siblings (hvd-rsh, hvd-exec) and libraries there."""
import os
import sys

from . import bin_dir


def _exec(name):
    path = os.path.join(bin_dir(), name)
    try:
        os.execv(path, [path] + sys.argv[1:])
    except OSError as e:
        sys.exit("%s: cannot run %s: %s (reinstall the hvd-bridge package)" % (name, path,
                                                                              e.strerror))


def hvd_driver():
    _exec("hvd-driver")


def hvd_task():
    _exec("hvd-task")

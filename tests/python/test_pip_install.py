#!/usr/bin/env python3
"""`pip install .` into a fresh virtual environment, then a job (label python): the package
built from the repository by scikit-build-core carries the extension, hvd-driver, hvd-task,
hvd-rsh and hvd-exec and the shared libraries, and hvd_bridge.run works from it with nothing
else on the path (no PYTHONPATH, no build tree); hvd-driver and hvd-task are on the
environment's PATH. When this interpreter has torch, the installed
hvd_bridge.torch runs an allreduce on 2 ranks too (torch taken from this interpreter's
site-packages, appended after the installed package: the fresh venv does not download it).

Exits 77 (skip) when the venv module, mpirun or a C compiler is missing, or under a sanitizer
build. Needs PyPI or pip's cache for cloudpickle and scikit-build-core.
"""
import os
import shutil
import sys
import tempfile
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import hvdtest  # noqa: E402
from hvdtest import check  # noqa: E402

JOB = r'''
import os, sys
import hvd_bridge
assert "build" not in hvd_bridge.__file__, hvd_bridge.__file__
for prog in ("hvd-driver", "hvd-task", "hvd-rsh", "hvd-exec"):
    assert os.access(os.path.join(hvd_bridge.bin_dir(), prog), os.X_OK), prog
for lib in ("libhvd_bridge.so", "libhvd_runtime.so"):
    assert os.path.exists(os.path.join(hvd_bridge.lib_dir(), lib)), lib
print("RESULT", hvd_bridge.run(lambda x: (int(os.environ["RANK"]), x), args=("hi",), np=2))
'''

# Appended to JOB when torch is here: TORCH_SITE is where this interpreter has it.
TORCH_JOB = r'''
def torch_sum(site):
    import sys
    sys.path.append(site)
    import torch
    import hvd_bridge.torch as hvd
    assert "build" not in hvd.__file__, hvd.__file__
    hvd.init()
    out = hvd.allreduce(torch.ones(3) * (hvd.rank() + 1), op=hvd.Sum, name="pip")
    hvd.shutdown()
    return out.tolist()
print("TORCH", hvd_bridge.run(torch_sum, args=(TORCH_SITE,), np=2))
'''


def torch_site():
    """The site-packages directory this interpreter has torch in, or None."""
    try:
        import torch
    except ImportError:
        return None
    return os.path.dirname(os.path.dirname(torch.__file__))


def test_pip_install():
    work = tempfile.mkdtemp(prefix="hvd-pip-test.")
    mark = uuid.uuid4().hex
    try:
        venv = os.path.join(work, "venv")
        rc, out, err, _ = hvdtest.run([sys.executable, "-m", "venv", venv], timeout=120)
        check(rc == 0, "venv: %s" % err)
        py = os.path.join(venv, "bin", "python")
        env = hvdtest.marked_env(mark)
        env.pop("PYTHONPATH", None)
        rc, out, err, secs = hvdtest.run(
            [py, "-m", "pip", "install", "--disable-pip-version-check", "-q",
             "-C", "build-dir=" + os.path.join(work, "build"), REPO], env=env, timeout=900,
            merge=True)
        check(rc == 0, "pip install . failed:\n%s" % out[-6000:])
        print("pip install . took %.0f s" % secs)
        site = torch_site()
        job = JOB + ("TORCH_SITE = %r\n" % site + TORCH_JOB if site else "")
        rc, out, err, _ = hvdtest.run([py, "-c", job], env=env, cwd=work, timeout=300)
        check(rc == 0 and "RESULT [(0, 'hi'), (1, 'hi')]" in out,
              "a job from the installed package: status %d\n%s\n%s" % (rc, out, err[-4000:]))
        if site:
            check("TORCH [[3.0, 3.0, 3.0], [3.0, 3.0, 3.0]]" in out,
                  "hvd_bridge.torch from the installed package:\n%s\n%s" % (out, err[-4000:]))
        else:
            print("torch is not here: the installed hvd_bridge.torch was not run")
        # The programs on the environment's PATH, as the docs use them (pip's console scripts).
        path_env = dict(env, PATH=os.path.join(venv, "bin") + os.pathsep + env.get("PATH", ""))
        rc, out, err, _ = hvdtest.run(["hvd-driver", "run", "-np", "2", "--local", "1", "--",
                                       "sh", "-c", "echo rank $OMPI_COMM_WORLD_RANK"],
                                      env=path_env, cwd=work, timeout=120)
        check(rc == 0 and "rank 0" in out and "rank 1" in out,
              "hvd-driver from the venv's PATH: status %d\n%s\n%s" % (rc, out, err[-3000:]))
        rc, out, err, _ = hvdtest.run(["hvd-task", "--help"], env=path_env, timeout=30)
        check(rc == 0 and "hvd-task" in out, "hvd-task --help from the venv's PATH: %d %s %s"
              % (rc, out, err))
        hvdtest.assert_no_leftovers(mark, 15)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    args = hvdtest.package_test_args(("mpirun", "cc"), ())
    return hvdtest.run_cases(hvdtest.cases_in(globals()), args.cases)

if __name__ == "__main__":
    sys.exit(main())

/* hvd_bridge._runtime: the CPython door to the collective runtime (include/hvd/runtime.h) and
 * the rank side of elastic jobs (include/hvd/elastic.h), for hvd_bridge.torch. Buffers travel as
 * addresses (tensor.data_ptr()), never copied here; the Python side keeps the tensors alive until
 * their handle completes. Waits release the GIL.
 *
 * Errors: arguments the runtime refuses at submission raise ValueError (Horovod's
 * INVALID_ARGUMENT); a collective submitted after the runtime stopped (a shutdown on any rank)
 * raises HorovodInternalError, as in Horovod, and so does one that fails (mismatch across ranks,
 * shutdown, MPI or NCCL failure) from wait(). The elastic functions raise HorovodInternalError
 * when a reset may cure the error (a task service or a rank went away), ElasticError when not
 * (hvd_elastic_resettable). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hvd/elastic.h"
#include "hvd/runtime.h"

static PyObject *InternalError; /* hvd_bridge._runtime.HorovodInternalError(RuntimeError) */
static PyObject *ElasticError;  /* hvd_bridge._runtime.ElasticError(RuntimeError) */

/* Outputs of allgather and alltoall, by handle: the runtime fills them at completion. A small
 * open-addressed table would do; a linked list is enough for the handful in flight. */
typedef struct pending_out {
    hvd_handle handle;
    hvd_output out;
    struct pending_out *next;
} pending_out;
static pending_out *outputs; /* the GIL guards it */

/* A refused submission: the runtime failed or has stopped (HorovodInternalError, which
 * @hvd.elastic.run turns into a reset), or the arguments are bad (ValueError). */
static PyObject *submit_error(const hvd_err *err) {
    bool internal = err->code == HVD_E_INTERNAL || err->code == HVD_E_SHUTDOWN;
    PyErr_SetString(internal ? InternalError : PyExc_ValueError, err->msg);
    return NULL;
}

static hvd_output *new_output(void) {
    pending_out *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->next = outputs;
    outputs = p;
    return &p->out;
}

/* Binds the output most recently made to its handle, or drops it if submission failed. */
static void bind_output(hvd_handle h, bool ok) {
    pending_out *p = outputs;
    if (ok) {
        p->handle = h;
        return;
    }
    outputs = p->next;
    free(p);
}

static pending_out **find_output(hvd_handle h) {
    for (pending_out **pp = &outputs; *pp; pp = &(*pp)->next)
        if ((*pp)->handle == h) return pp;
    return NULL;
}

static const char *name_or_null(PyObject *o) {
    return o == Py_None ? NULL : PyUnicode_AsUTF8(o);
}

/* ---- Lifecycle and topology -------------------------------------------------------------- */

static PyObject *rt_init(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    hvd_err err;
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    rc = hvd_init(&err);
    PyEval_RestoreThread(ts);
    if (rc != 0) {
        PyErr_Format(PyExc_ValueError, "hvd_bridge.torch initialization failed: %s", err.msg);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *rt_shutdown(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyThreadState *ts = PyEval_SaveThread();
    hvd_shutdown();
    PyEval_RestoreThread(ts);
    Py_RETURN_NONE;
}

#define INT_GETTER(pyname, cfn)                                                                    \
    static PyObject *pyname(PyObject *self, PyObject *unused) {                                    \
        (void)self, (void)unused;                                                                  \
        return PyLong_FromLong(cfn());                                                             \
    }
INT_GETTER(rt_is_running, hvd_is_running)
INT_GETTER(rt_rank, hvd_rank)
INT_GETTER(rt_size, hvd_size)
INT_GETTER(rt_local_rank, hvd_local_rank)
INT_GETTER(rt_local_size, hvd_local_size)
INT_GETTER(rt_cross_rank, hvd_cross_rank)
INT_GETTER(rt_cross_size, hvd_cross_size)
INT_GETTER(rt_nccl_built, hvd_nccl_built)

/* mpi_built_for() -> "Open MPI 4.1.4", "MPICH 5.0.2": the MPI this extension was built with. */
static PyObject *rt_mpi_built_for(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyUnicode_FromString(hvd_mpi_built_for());
}

/* ---- Collectives ------------------------------------------------------------------------- */

/* allreduce_async(name, send, recv, count, dtype, op, prescale, postscale, device) -> handle */
static PyObject *rt_allreduce(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *name_o;
    unsigned long long send, recv;
    long long count;
    int dtype, op, device;
    double pre, post;
    if (!PyArg_ParseTuple(args, "OKKLiiddi", &name_o, &send, &recv, &count, &dtype, &op, &pre,
                          &post, &device))
        return NULL;
    const char *name = name_or_null(name_o);
    if (!name && PyErr_Occurred()) return NULL;
    hvd_handle h;
    hvd_err err;
    int rc =
        pre == 1.0 && post == 1.0
            ? hvd_allreduce_async(name, (void *)(uintptr_t)send, (void *)(uintptr_t)recv, count,
                                  dtype, op, device, &h, &err)
            : hvd_allreduce_scaled_async(name, (void *)(uintptr_t)send, (void *)(uintptr_t)recv,
                                         count, dtype, op, pre, post, device, &h, &err);
    return rc == 0 ? PyLong_FromLongLong(h) : submit_error(&err);
}

/* allgather_async(name, send, first_dim, row_elems, dtype, device) -> handle */
static PyObject *rt_allgather(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *name_o;
    unsigned long long send;
    long long first_dim, row;
    int dtype, device;
    if (!PyArg_ParseTuple(args, "OKLLii", &name_o, &send, &first_dim, &row, &dtype, &device))
        return NULL;
    const char *name = name_or_null(name_o);
    if (!name && PyErr_Occurred()) return NULL;
    hvd_output *out = new_output();
    if (!out) return PyErr_NoMemory();
    hvd_handle h = 0;
    hvd_err err;
    int rc = hvd_allgather_async(name, (void *)(uintptr_t)send, first_dim, row, dtype, device, out,
                                 &h, &err);
    bind_output(h, rc == 0);
    return rc == 0 ? PyLong_FromLongLong(h) : submit_error(&err);
}

/* broadcast_async(name, buf, count, dtype, root, device) -> handle */
static PyObject *rt_broadcast(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *name_o;
    unsigned long long buf;
    long long count;
    int dtype, root, device;
    if (!PyArg_ParseTuple(args, "OKLiii", &name_o, &buf, &count, &dtype, &root, &device))
        return NULL;
    const char *name = name_or_null(name_o);
    if (!name && PyErr_Occurred()) return NULL;
    hvd_handle h;
    hvd_err err;
    if (hvd_broadcast_async(name, (void *)(uintptr_t)buf, count, dtype, root, device, &h, &err))
        return submit_error(&err);
    return PyLong_FromLongLong(h);
}

/* alltoall_async(name, send, first_dim, row_elems, splits (list or None), dtype, device) */
static PyObject *rt_alltoall(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *name_o, *splits_o;
    unsigned long long send;
    long long first_dim, row;
    int dtype, device;
    if (!PyArg_ParseTuple(args, "OKLLOii", &name_o, &send, &first_dim, &row, &splits_o, &dtype,
                          &device))
        return NULL;
    const char *name = name_or_null(name_o);
    if (!name && PyErr_Occurred()) return NULL;
    int64_t *splits = NULL;
    if (splits_o != Py_None) {
        Py_ssize_t n = PySequence_Size(splits_o);
        if (n < 0) return NULL;
        if (!(splits = calloc((size_t)n + 1, sizeof *splits))) return PyErr_NoMemory();
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *v = PySequence_GetItem(splits_o, i);
            splits[i] = v ? PyLong_AsLongLong(v) : -1;
            Py_XDECREF(v);
            if (PyErr_Occurred()) {
                free(splits);
                return NULL;
            }
        }
    }
    hvd_output *out = new_output();
    if (!out) {
        free(splits);
        return PyErr_NoMemory();
    }
    hvd_handle h = 0;
    hvd_err err;
    int rc = hvd_alltoall_async(name, (void *)(uintptr_t)send, first_dim, row, splits, dtype,
                                device, out, &h, &err);
    free(splits); /* the runtime copied them */
    bind_output(h, rc == 0);
    return rc == 0 ? PyLong_FromLongLong(h) : submit_error(&err);
}

/* reducescatter_async(name, send, recv, first_dim, row_elems, dtype, op, device) -> handle */
static PyObject *rt_reducescatter(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *name_o;
    unsigned long long send, recv;
    long long first_dim, row;
    int dtype, op, device;
    if (!PyArg_ParseTuple(args, "OKKLLiii", &name_o, &send, &recv, &first_dim, &row, &dtype, &op,
                          &device))
        return NULL;
    const char *name = name_or_null(name_o);
    if (!name && PyErr_Occurred()) return NULL;
    hvd_handle h;
    hvd_err err;
    if (hvd_reducescatter_async(name, (void *)(uintptr_t)send, (void *)(uintptr_t)recv, first_dim,
                                row, dtype, op, device, &h, &err))
        return submit_error(&err);
    return PyLong_FromLongLong(h);
}

static PyObject *rt_barrier(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    hvd_handle h;
    hvd_err err;
    if (hvd_barrier_async(&h, &err) != 0) return submit_error(&err);
    return PyLong_FromLongLong(h);
}

/* join_async(device, last_rank_address) -> handle: the last rank to join is written as an
 * int32 at the address (a tensor the caller keeps until the handle completes). */
static PyObject *rt_join(PyObject *self, PyObject *args) {
    (void)self;
    int device;
    unsigned long long last;
    if (!PyArg_ParseTuple(args, "iK", &device, &last)) return NULL;
    hvd_handle h;
    hvd_err err;
    if (hvd_join_async(device, (int32_t *)(uintptr_t)last, &h, &err) != 0)
        return submit_error(&err);
    return PyLong_FromLongLong(h);
}

/* ---- Completion ---------------------------------------------------------------------------- */

static PyObject *rt_poll(PyObject *self, PyObject *args) {
    (void)self;
    long long h;
    if (!PyArg_ParseTuple(args, "L", &h)) return NULL;
    int r = hvd_poll(h);
    if (r < 0) {
        PyErr_Format(PyExc_ValueError, "Handle %lld was not created or has been cleared.", h);
        return NULL;
    }
    return PyBool_FromLong(r);
}

/* wait(handle): blocks until it completes and releases it; raises HorovodInternalError if the
 * collective failed. */
static PyObject *rt_wait(PyObject *self, PyObject *args) {
    (void)self;
    long long h;
    if (!PyArg_ParseTuple(args, "L", &h)) return NULL;
    hvd_err err;
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    rc = hvd_wait(h, &err);
    PyEval_RestoreThread(ts);
    if (rc != 0) {
        /* A failed collective filled nothing; but NOT_FOUND (another thread waited for this
         * handle) leaves the output to that thread. */
        pending_out **pp = rc == HVD_E_NOT_FOUND ? NULL : find_output(h);
        if (pp) {
            pending_out *p = *pp;
            *pp = p->next;
            hvd_output_free(&p->out);
            free(p);
        }
        PyErr_SetString(InternalError, err.msg);
        return NULL;
    }
    Py_RETURN_NONE;
}

static void output_capsule_free(PyObject *capsule) {
    pending_out *p = PyCapsule_GetPointer(capsule, "hvd_bridge.output");
    if (!p) return;
    hvd_output_free(&p->out);
    free(p);
}

/* take_output(handle) -> (owner, address, nbytes, first_dim, rank_rows, device): the output of
 * a completed allgather or alltoall. The memory is freed when `owner` is (a capsule). */
static PyObject *rt_take_output(PyObject *self, PyObject *args) {
    (void)self;
    long long h;
    if (!PyArg_ParseTuple(args, "L", &h)) return NULL;
    pending_out **pp = find_output(h);
    if (!pp) {
        PyErr_Format(PyExc_ValueError, "handle %lld has no output", h);
        return NULL;
    }
    pending_out *p = *pp;
    *pp = p->next;
    PyObject *owner = PyCapsule_New(p, "hvd_bridge.output", output_capsule_free);
    if (!owner) {
        hvd_output_free(&p->out);
        free(p);
        return NULL;
    }
    int size = hvd_size();
    PyObject *rows = PyList_New(size > 0 ? size : 0);
    for (int i = 0; rows && i < size; i++)
        PyList_SET_ITEM(rows, i, PyLong_FromLongLong(p->out.rank_rows ? p->out.rank_rows[i] : 0));
    if (!rows) {
        Py_DECREF(owner);
        return NULL;
    }
    return Py_BuildValue("(NKnLNi)", owner, (unsigned long long)(uintptr_t)p->out.data,
                         (Py_ssize_t)p->out.bytes, (long long)p->out.first_dim, rows,
                         p->out.device);
}

/* copy_host(address, destination, nbytes): memcpy between host buffers. */
static PyObject *rt_copy_host(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long src, dst;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "KKn", &src, &dst, &n)) return NULL;
    if (n > 0) memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, (size_t)n);
    Py_RETURN_NONE;
}

static PyObject *rt_reducescatter_rows(PyObject *self, PyObject *args) {
    (void)self;
    long long first_dim;
    int rank, size;
    if (!PyArg_ParseTuple(args, "Lii", &first_dim, &rank, &size)) return NULL;
    return PyLong_FromLongLong(hvd_reducescatter_rows(first_dim, rank, size));
}

static PyObject *rt_stats(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    hvd_stats s;
    if (hvd_get_stats(&s) != 0) Py_RETURN_NONE;
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "cycles", s.cycles,
                         "full_negotiations", s.full_negotiations, "cached_responses",
                         s.cached_responses, "negotiated_responses", s.negotiated_responses,
                         "tensors_done", s.tensors_done, "collective_calls", s.collective_calls,
                         "fused_calls", s.fused_calls, "negotiation_ns", s.negotiation_ns);
}

/* ---- Elastic jobs (include/hvd/elastic.h) ---------------------------------------------------- */

/* HorovodInternalError when a reset may cure it (@hvd.elastic.run then ends the rank for a
 * reset), else ElasticError (the rank fails: a reset would meet the same error again). */
static PyObject *elastic_error(const hvd_err *err) {
    PyErr_SetString(hvd_elastic_resettable(err->code) ? InternalError : ElasticError, err->msg);
    return NULL;
}

/* elastic_restore() -> bytes of the newest commit that survives, or None (collective) */
static PyObject *rt_elastic_restore(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    void *state = NULL;
    size_t len = 0;
    hvd_err err;
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    rc = hvd_elastic_restore(&state, &len, &err);
    PyEval_RestoreThread(ts);
    if (rc < 0) return elastic_error(&err);
    PyObject *out =
        rc == 1 ? PyBytes_FromStringAndSize(state, (Py_ssize_t)len) : Py_NewRef(Py_None);
    free(state);
    return out;
}

/* elastic_save(bytes): the next commit, in this rank's task service */
static PyObject *rt_elastic_save(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    hvd_err err;
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    rc = hvd_elastic_save(b.buf, (size_t)b.len, &err);
    PyEval_RestoreThread(ts);
    PyBuffer_Release(&b);
    if (rc != 0) return elastic_error(&err);
    Py_RETURN_NONE;
}

/* elastic_check_host_updates() -> bool (collective) */
static PyObject *rt_elastic_check(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    hvd_err err;
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    rc = hvd_elastic_check_host_updates(&err);
    PyEval_RestoreThread(ts);
    if (rc < 0) return elastic_error(&err);
    return PyBool_FromLong(rc == HVD_ELASTIC_RESET);
}

static PyObject *rt_elastic_commit_id(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromUnsignedLongLong(hvd_elastic_commit_id());
}

static PyObject *rt_elastic_enabled(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(hvd_elastic_enabled());
}

static PyObject *rt_elastic_close(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    hvd_elastic_close();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", rt_init, METH_NOARGS, "init(): start the runtime (MPI, the background thread)"},
    {"shutdown", rt_shutdown, METH_NOARGS, "shutdown(): stop it on every rank"},
    {"is_running", rt_is_running, METH_NOARGS, NULL},
    {"rank", rt_rank, METH_NOARGS, NULL},
    {"size", rt_size, METH_NOARGS, NULL},
    {"local_rank", rt_local_rank, METH_NOARGS, NULL},
    {"local_size", rt_local_size, METH_NOARGS, NULL},
    {"cross_rank", rt_cross_rank, METH_NOARGS, NULL},
    {"cross_size", rt_cross_size, METH_NOARGS, NULL},
    {"nccl_built", rt_nccl_built, METH_NOARGS, NULL},
    {"mpi_built_for", rt_mpi_built_for, METH_NOARGS,
     "mpi_built_for(): the MPI the runtime was built against (its mpi.h)"},
    {"allreduce_async", rt_allreduce, METH_VARARGS, NULL},
    {"allgather_async", rt_allgather, METH_VARARGS, NULL},
    {"broadcast_async", rt_broadcast, METH_VARARGS, NULL},
    {"alltoall_async", rt_alltoall, METH_VARARGS, NULL},
    {"reducescatter_async", rt_reducescatter, METH_VARARGS, NULL},
    {"barrier_async", rt_barrier, METH_NOARGS, NULL},
    {"join_async", rt_join, METH_VARARGS, NULL},
    {"poll", rt_poll, METH_VARARGS, NULL},
    {"wait", rt_wait, METH_VARARGS, NULL},
    {"take_output", rt_take_output, METH_VARARGS, NULL},
    {"copy_host", rt_copy_host, METH_VARARGS, NULL},
    {"reducescatter_rows", rt_reducescatter_rows, METH_VARARGS, NULL},
    {"stats", rt_stats, METH_NOARGS, NULL},
    {"elastic_enabled", rt_elastic_enabled, METH_NOARGS, "in an elastic job's rank?"},
    {"elastic_restore", rt_elastic_restore, METH_NOARGS,
     "elastic_restore() -> the newest commit's bytes on every rank, or None (collective)"},
    {"elastic_save", rt_elastic_save, METH_VARARGS, "elastic_save(bytes): the next commit"},
    {"elastic_check_host_updates", rt_elastic_check, METH_NOARGS,
     "elastic_check_host_updates() -> whether the hosts changed (collective)"},
    {"elastic_commit_id", rt_elastic_commit_id, METH_NOARGS, NULL},
    {"elastic_close", rt_elastic_close, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef runtime_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hvd_bridge._runtime",
    .m_doc = "The collective runtime of hvd-bridge (include/hvd/runtime.h).",
    .m_size = -1,
    .m_methods = methods,
};

/* Open MPI loads its components with dlopen, and they need libmpi's symbols global: a Python
 * extension is loaded RTLD_LOCAL, so promote the libmpi we are linked with. */
static void promote_mpi(void) {
    static const char *const names[] = {"libmpi.so.40", "libmpi.so.12", "libmpi.so", NULL};
    for (int i = 0; names[i]; i++)
        if (dlopen(names[i], RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD)) return;
}

PyMODINIT_FUNC PyInit__runtime(void);
PyMODINIT_FUNC PyInit__runtime(void) {
    promote_mpi();
    PyObject *m = PyModule_Create(&runtime_module);
    if (!m) return NULL;
    InternalError = PyErr_NewExceptionWithDoc(
        "hvd_bridge._runtime.HorovodInternalError",
        "A collective failed on this rank (a mismatch across ranks, a shutdown, an MPI or NCCL "
        "failure); Horovod's class of the same name.",
        PyExc_RuntimeError, NULL);
    ElasticError = PyErr_NewExceptionWithDoc(
        "hvd_bridge._runtime.ElasticError",
        "An elastic commit, restore or host check failed in a way a reset cannot cure (a state "
        "over ELASTIC_STATE_MAX bytes, a rank not started by hvd-exec, ...): the rank fails.",
        PyExc_RuntimeError, NULL);
    if (!InternalError || PyModule_AddObjectRef(m, "HorovodInternalError", InternalError) < 0 ||
        !ElasticError || PyModule_AddObjectRef(m, "ElasticError", ElasticError) < 0 ||
        PyModule_AddIntConstant(m, "ELASTIC_STATE_MAX", HVD_ELASTIC_STATE_MAX) < 0 ||
        PyModule_AddIntConstant(m, "DEVICE_CPU", HVD_DEVICE_CPU) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

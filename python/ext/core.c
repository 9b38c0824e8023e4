/* hvd_bridge._core: the CPython door to the C libraries (include/hvd/driver.h, launch.h,
 * task.h). Thin on purpose: objects that own a driver service or a task service, and calls
 * that block release the GIL. Everything else (pickling, Spark, output) is Python.
 *
 * Threads of the C libraries never call into Python: their log lines go to stderr. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/hostspec.h"
#include "hvd/driver.h"
#include "hvd/launch.h"
#include "hvd/proto.h"
#include "hvd/task.h"

static PyObject *HvdError; /* hvd_bridge._core.HvdError(RuntimeError), .code = status name */

static PyObject *raise_err(const hvd_err *err) {
    PyObject *exc = PyObject_CallFunction(HvdError, "s", err->msg);
    if (!exc) return NULL;
    PyObject *code = PyUnicode_FromString(hvd_status_name(err->code));
    if (code) PyObject_SetAttrString(exc, "code", code);
    Py_XDECREF(code);
    PyErr_SetObject(HvdError, exc);
    Py_DECREF(exc);
    return NULL;
}

/* ---- Conversions ------------------------------------------------------------------------- */

/* A NULL-terminated vector of UTF-8 copies of a sequence of str (None: NULL, no error). */
static int strv_from(PyObject *seq, char ***out, const char *what) {
    *out = NULL;
    if (!seq || seq == Py_None) return 0;
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    char **v = PyMem_Calloc((size_t)n + 1, sizeof *v);
    if (!v) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *s = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, i));
        if (!s || !(v[i] = strdup(s))) {
            if (!PyErr_Occurred()) PyErr_NoMemory();
            for (Py_ssize_t k = 0; k < i; k++)
                free(v[k]);
            PyMem_Free(v);
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    *out = v;
    return 0;
}

static void strv_free(char **v) {
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    PyMem_Free(v);
}

static size_t strv_len(char *const *v) {
    size_t n = 0;
    while (v && v[n])
        n++;
    return n;
}

static int ms_from(double seconds, const char *what, int *out) {
    if (!(seconds >= 0) || seconds > 2e6) {
        PyErr_Format(PyExc_ValueError, "%s must be between 0 and 2000000 seconds", what);
        return -1;
    }
    *out = (int)(seconds * 1000.0 + 0.5);
    return 0;
}

static void log_stderr(void *user, const char *line) {
    fprintf(stderr, "%s: %s\n", (const char *)user, line);
}

/* Without verbose: the driver's warnings only, as hvd-driver prints them (a --nics name that
 * no task declared an address on, a truncated interface list). */
static void log_warnings(void *user, const char *line) {
    if (strncmp(line, "warning:", 8) == 0) log_stderr(user, line);
}

/* ---- Driver ------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD hvd_driver *d;
    int stop;    /* hvd_launch_config.stop (atomic) */
    int running; /* a run_job is in progress (GIL held when changed) */
    int num_tasks;
    bool verbose;
} DriverObject;

static int driver_init(DriverObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"num_tasks",   "argv", "payload", "nics",
                             "net_timeout", "bind", "verbose", NULL};
    int num_tasks;
    PyObject *argv_o, *nics_o = Py_None;
    Py_buffer payload = {.buf = NULL};
    double net_timeout = HVD_NET_TIMEOUT_DEFAULT_S;
    const char *bind = NULL;
    int verbose = 0;
    if (self->d) {
        PyErr_SetString(PyExc_RuntimeError, "the driver is already started");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iO|z*Odzp", kwlist, &num_tasks, &argv_o, &payload,
                                     &nics_o, &net_timeout, &bind, &verbose))
        return -1;
    char **argv = NULL, **nics = NULL;
    int rc = -1, net_ms;
    if (ms_from(net_timeout, "net_timeout", &net_ms) != 0 ||
        strv_from(argv_o, &argv, "argv must be a sequence of str") != 0 ||
        strv_from(nics_o, &nics, "nics must be a sequence of str") != 0)
        goto out;
    hvd_code_msg code = {.kind = payload.buf ? HVD_CODE_ARGV_IO : HVD_CODE_ARGV,
                         .argv = {argv, strv_len(argv)},
                         .object = {payload.buf, payload.buf ? (size_t)payload.len : 0}};
    hvd_driver_config cfg = {.num_tasks = num_tasks > 0 ? (uint32_t)num_tasks : 0,
                             .code = &code,
                             .nics = (const char *const *)nics,
                             .bind_host = bind,
                             .log = verbose ? log_stderr : log_warnings,
                             .log_user = "hvd_bridge",
                             .net_timeout_ms = net_ms};
    hvd_err err;
    if (hvd_secret_generate(&cfg.secret, &err) != 0) {
        raise_err(&err);
        goto out;
    }
    PyThreadState *ts = PyEval_SaveThread();
    self->d = hvd_driver_start(&cfg, &err);
    PyEval_RestoreThread(ts);
    hvd_secret_wipe(&cfg.secret);
    if (!self->d) {
        raise_err(&err);
        goto out;
    }
    self->num_tasks = num_tasks;
    self->verbose = verbose;
    rc = 0;
out:
    if (payload.buf) PyBuffer_Release(&payload);
    strv_free(argv);
    strv_free(nics);
    return rc;
}

static hvd_driver *driver_of(DriverObject *self) {
    if (!self->d) PyErr_SetString(PyExc_RuntimeError, "the driver is stopped");
    return self->d;
}

/* The job's environment as a dict: HVD_SECRET and HVD_DRIVER_ADDRS. */
static PyObject *driver_job_env(DriverObject *self, PyObject *unused) {
    (void)unused;
    hvd_driver *d = driver_of(self);
    if (!d) return NULL;
    hvd_err err;
    char **env = hvd_driver_job_env(d, &err);
    if (!env) return raise_err(&err);
    PyObject *out = PyDict_New();
    for (size_t i = 0; out && env[i]; i++) {
        char *eq = strchr(env[i], '=');
        PyObject *v = eq ? PyUnicode_FromString(eq + 1) : NULL;
        if (eq) *eq = '\0';
        if (!v || PyDict_SetItemString(out, env[i], v) != 0) Py_CLEAR(out);
        Py_XDECREF(v);
    }
    for (size_t i = 0; env[i]; i++) {
        memset(env[i], 0, strlen(env[i]));
        free(env[i]);
    }
    free(env);
    return out;
}

static PyObject *driver_wait_registration(DriverObject *self, PyObject *args) {
    double timeout = -1;
    if (!PyArg_ParseTuple(args, "|d", &timeout)) return NULL;
    hvd_driver *d = driver_of(self);
    if (!d) return NULL;
    int ms = timeout < 0 ? -1 : (int)(timeout * 1000);
    hvd_err err;
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    rc = hvd_driver_wait_registration(d, ms, &err);
    PyEval_RestoreThread(ts);
    if (rc != 0) return raise_err(&err);
    Py_RETURN_NONE;
}

/* The driver of self when no job runs on it, or NULL with a Python error. */
static hvd_driver *idle_driver(DriverObject *self) {
    hvd_driver *d = driver_of(self);
    if (d && self->running) {
        PyErr_SetString(PyExc_RuntimeError, "a job is already running on this driver");
        return NULL;
    }
    return d;
}

/* run_job(bin_dir, exec_bin_dir=None, mpi_args=(), env=(), timeout=0, start_timeout=120,
 *         stdout_fd=-1, stderr_fd=-1) -> (mpirun status, timed_out, stopped) */
static PyObject *driver_run_job(DriverObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"bin_dir",       "exec_bin_dir", "mpi_args",  "env", "timeout",
                             "start_timeout", "stdout_fd",    "stderr_fd", NULL};
    const char *bin_dir, *exec_bin_dir = NULL;
    PyObject *mpi_o = Py_None, *env_o = Py_None;
    double timeout = 0, start_timeout = HVD_START_TIMEOUT_DEFAULT_S;
    int out_fd = -1, err_fd = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|zOOddii", kwlist, &bin_dir, &exec_bin_dir, &mpi_o,
                                     &env_o, &timeout, &start_timeout, &out_fd, &err_fd))
        return NULL;
    hvd_driver *d = idle_driver(self);
    if (!d) return NULL;
    char **mpi = NULL, **env = NULL;
    int start_ms;
    if (ms_from(start_timeout, "start_timeout", &start_ms) != 0 ||
        strv_from(mpi_o, &mpi, "mpi_args must be a sequence of str") != 0 ||
        strv_from(env_o, &env, "env must be a sequence of NAME=VALUE str") != 0) {
        strv_free(mpi);
        return NULL;
    }
    int fds[2] = {out_fd < 0 ? 1 : out_fd, err_fd < 0 ? 2 : err_fd};
    hvd_launch_config lc = {.np = self->num_tasks,
                            .bin_dir = bin_dir,
                            .exec_bin_dir = exec_bin_dir,
                            .mpi_args = (const char *const *)mpi,
                            .extra_env = (const char *const *)env,
                            .timeout_s = (int)timeout,
                            .start_timeout_ms = start_ms,
                            .output_fds = fds,
                            .stop = &self->stop,
                            .log = self->verbose ? log_stderr : log_warnings,
                            .log_user = "hvd_bridge"};
    hvd_launch_outcome o;
    hvd_err err;
    int rc;
    self->running = 1;
    Py_INCREF(self); /* abort() from another thread may run while we wait */
    PyThreadState *ts = PyEval_SaveThread();
    rc = hvd_launch_job(d, &lc, &o, &err);
    PyEval_RestoreThread(ts);
    self->running = 0;
    Py_DECREF(self);
    strv_free(mpi);
    strv_free(env);
    if (rc != 0) return raise_err(&err);
    return Py_BuildValue("(iOO)", o.status, o.timed_out ? Py_True : Py_False,
                         o.stopped ? Py_True : Py_False);
}

/* An elastic job's reset lines (hvd_elastic_config.progress) go where the ranks' stderr goes
 * (user: that descriptor), always. */
static void progress_stderr(void *user, const char *line) {
    char buf[2200];
    int n = snprintf(buf, sizeof buf, "hvd_bridge: %s\n", line);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1;
    for (size_t off = 0; off < len;) {
        ssize_t w = write(*(const int *)user, buf + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
}

/* run_elastic(bin_dir, min_np, max_np=0, np=0, reset_limit=-1, elastic_timeout=600,
 *             mpi_args=(), env=(), timeout=0, start_timeout=120, stdout_fd=-1, stderr_fd=-1)
 *   -> (mpirun status of the last launch, timed_out, stopped, resets)
 * The tasks are those that register (hvd_launch_elastic without a discovery script). */
static PyObject *driver_run_elastic(DriverObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"bin_dir",         "min_np",    "max_np", "np",      "reset_limit",
                             "elastic_timeout", "mpi_args",  "env",    "timeout", "start_timeout",
                             "stdout_fd",       "stderr_fd", NULL};
    const char *bin_dir;
    int min_np, max_np = 0, np = 0, reset_limit = -1, out_fd = -1, err_fd = -1;
    double elastic_timeout = HVD_ELASTIC_TIMEOUT_DEFAULT_S, timeout = 0,
           start_timeout = HVD_START_TIMEOUT_DEFAULT_S;
    PyObject *mpi_o = Py_None, *env_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "si|iiidOOddii", kwlist, &bin_dir, &min_np, &max_np,
                                     &np, &reset_limit, &elastic_timeout, &mpi_o, &env_o, &timeout,
                                     &start_timeout, &out_fd, &err_fd))
        return NULL;
    hvd_driver *d = idle_driver(self);
    if (!d) return NULL;
    char **mpi = NULL, **env = NULL;
    int start_ms, el_ms;
    if (ms_from(start_timeout, "start_timeout", &start_ms) != 0 ||
        ms_from(elastic_timeout, "elastic_timeout", &el_ms) != 0 ||
        strv_from(mpi_o, &mpi, "mpi_args must be a sequence of str") != 0 ||
        strv_from(env_o, &env, "env must be a sequence of NAME=VALUE str") != 0) {
        strv_free(mpi);
        return NULL;
    }
    int fds[2] = {out_fd < 0 ? 1 : out_fd, err_fd < 0 ? 2 : err_fd};
    hvd_launch_config lc = {.bin_dir = bin_dir,
                            .mpi_args = (const char *const *)mpi,
                            .extra_env = (const char *const *)env,
                            .timeout_s = (int)timeout,
                            .start_timeout_ms = start_ms,
                            .output_fds = fds,
                            .stop = &self->stop,
                            .log = self->verbose ? log_stderr : log_warnings,
                            .log_user = "hvd_bridge"};
    hvd_elastic_config ec = {.min_np = min_np,
                             .max_np = max_np,
                             .np = np,
                             .reset_limit = reset_limit,
                             .elastic_timeout_s = el_ms / 1000 > 0 ? el_ms / 1000 : 1,
                             .cooldown_min_s = HVD_BLACKLIST_COOLDOWN_MIN_S,
                             .cooldown_max_s = HVD_BLACKLIST_COOLDOWN_MAX_S,
                             .progress = progress_stderr,
                             .progress_user = &fds[1]};
    hvd_launch_outcome o;
    hvd_elastic_outcome eo;
    hvd_err err;
    int rc;
    self->running = 1;
    Py_INCREF(self);
    PyThreadState *ts = PyEval_SaveThread();
    rc = hvd_launch_elastic(d, &lc, &ec, &o, &eo, &err);
    PyEval_RestoreThread(ts);
    self->running = 0;
    Py_DECREF(self);
    strv_free(mpi);
    strv_free(env);
    if (rc != 0) return raise_err(&err);
    return Py_BuildValue("(iOOi)", o.status, o.timed_out ? Py_True : Py_False,
                         o.stopped ? Py_True : Py_False, eo.resets);
}

/* results() -> [(rank, task, host_hash, present, status, data: bytes, error: str|None, order,
 * stopped)] (order: 1, 2, ... in the order the results reached the driver, 0: none; stopped:
 * orted stopped the rank as the job ended, it did not fail on its own) */
static PyObject *driver_results(DriverObject *self, PyObject *unused) {
    (void)unused;
    hvd_driver *d = driver_of(self);
    if (!d) return NULL;
    hvd_rank_result *r;
    size_t n;
    hvd_err err;
    if (hvd_driver_results(d, &r, &n, &err) != 0) return raise_err(&err);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *t = Py_BuildValue(
            "(iizOiy#zKO)", r[i].rank, r[i].index > INT32_MAX ? -1 : (int)r[i].index,
            r[i].host_hash, r[i].present ? Py_True : Py_False, r[i].status,
            (const char *)(r[i].data ? r[i].data : (uint8_t *)""), (Py_ssize_t)r[i].len, r[i].error,
            (unsigned long long)r[i].order, r[i].stopped ? Py_True : Py_False);
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    hvd_driver_results_free(r, n);
    return out;
}

/* failure() -> (text or None, first_failed_rank or -1): the part of the job that failed first
 * on its own (hvd_driver_failure), and the rank that did (hvd_driver_first_failed_rank). */
static PyObject *driver_failure(DriverObject *self, PyObject *unused) {
    (void)unused;
    hvd_driver *d = driver_of(self);
    if (!d) return NULL;
    hvd_rank_result *r;
    size_t n;
    hvd_err err;
    if (hvd_driver_results(d, &r, &n, &err) != 0) return raise_err(&err);
    char text[HVD_ERR_MAX * 2];
    hvd_failure_kind kind = hvd_driver_failure(d, r, n, text, sizeof text);
    int bad = hvd_driver_first_failed_rank(d, r, n);
    hvd_driver_results_free(r, n);
    return Py_BuildValue("(zi)", kind == HVD_FAILURE_NONE ? NULL : text, bad);
}

/* Stops a job: waits for the tasks fail at once, mpirun is stopped. Any thread. */
static PyObject *driver_abort(DriverObject *self, PyObject *args) {
    const char *why = "aborted";
    if (!PyArg_ParseTuple(args, "|s", &why)) return NULL;
    if (!self->d) Py_RETURN_NONE;
    __atomic_store_n(&self->stop, 1, __ATOMIC_RELEASE);
    hvd_driver_abort(self->d, why);
    Py_RETURN_NONE;
}

static PyObject *driver_shutdown_tasks(DriverObject *self, PyObject *unused) {
    (void)unused;
    if (self->d) hvd_driver_shutdown_tasks(self->d);
    Py_RETURN_NONE;
}

/* next_job(): the driver forgets the last job's ranks, results and failures for another
 * run_job over the same task services (tasks made with elastic=True run one command after
 * another). */
static PyObject *driver_next_job(DriverObject *self, PyObject *unused) {
    (void)unused;
    hvd_driver *d = idle_driver(self);
    if (!d) return NULL;
    hvd_err err;
    if (hvd_driver_next_job(d, &err) != 0) return raise_err(&err);
    Py_RETURN_NONE;
}

static PyObject *driver_stop(DriverObject *self, PyObject *unused) {
    (void)unused;
    if (self->running) {
        PyErr_SetString(PyExc_RuntimeError, "abort() the running job before stopping the driver");
        return NULL;
    }
    hvd_driver *d = self->d;
    self->d = NULL;
    if (d) {
        PyThreadState *ts = PyEval_SaveThread();
        hvd_driver_stop(d);
        PyEval_RestoreThread(ts);
    }
    Py_RETURN_NONE;
}

static PyObject *driver_addresses(DriverObject *self, void *closure) {
    (void)closure;
    hvd_driver *d = driver_of(self);
    if (!d) return NULL;
    hvd_addr *a;
    size_t n;
    hvd_err err;
    if (hvd_driver_addrs(d, &a, &n, &err) != 0) return raise_err(&err);
    char *text = hvd_addrs_format(a, n);
    free(a);
    if (!text) return PyErr_NoMemory();
    PyObject *out = PyUnicode_FromString(text);
    free(text);
    return out;
}

static void driver_dealloc(DriverObject *self) {
    if (self->d) {
        __atomic_store_n(&self->stop, 1, __ATOMIC_RELEASE);
        hvd_driver_stop(self->d);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef driver_methods[] = {
    {"job_env", (PyCFunction)driver_job_env, METH_NOARGS,
     "job_env() -> dict: HVD_SECRET and HVD_DRIVER_ADDRS, for the job's processes"},
    {"wait_registration", (PyCFunction)driver_wait_registration, METH_VARARGS,
     "wait_registration(timeout=-1): until every task registered"},
    {"run_job", (PyCFunction)(void (*)(void))driver_run_job, METH_VARARGS | METH_KEYWORDS,
     "run_job(bin_dir, exec_bin_dir=None, mpi_args=(), env=(), timeout=0, start_timeout=120, "
     "stdout_fd=-1, stderr_fd=-1) -> (status, timed_out, stopped)"},
    {"run_elastic", (PyCFunction)(void (*)(void))driver_run_elastic, METH_VARARGS | METH_KEYWORDS,
     "run_elastic(bin_dir, min_np, max_np=0, np=0, reset_limit=-1, elastic_timeout=600, "
     "mpi_args=(), env=(), timeout=0, start_timeout=120, stdout_fd=-1, stderr_fd=-1) -> "
     "(status, timed_out, stopped, resets): an elastic job over the tasks that register"},
    {"results", (PyCFunction)driver_results, METH_NOARGS,
     "results() -> [(rank, task, host_hash, present, status, data, error, order, stopped)] by "
     "rank"},
    {"failure", (PyCFunction)driver_failure, METH_NOARGS,
     "failure() -> (what failed first, in a sentence, or None; first failed rank or -1)"},
    {"next_job", (PyCFunction)driver_next_job, METH_NOARGS,
     "next_job(): ready for another run_job over the same tasks (made with elastic=True)"},
    {"abort", (PyCFunction)driver_abort, METH_VARARGS, "abort(reason): stop the job"},
    {"shutdown_tasks", (PyCFunction)driver_shutdown_tasks, METH_NOARGS,
     "shutdown_tasks(): tell every task service the job is over"},
    {"stop", (PyCFunction)driver_stop, METH_NOARGS, "stop(): stop the driver service"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef driver_getset[] = {
    {"addresses", (getter)driver_addresses, NULL, "the driver's addresses, text form", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DriverType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hvd_bridge._core.Driver",
    .tp_basicsize = sizeof(DriverObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Driver(num_tasks, argv, payload=None, nics=None, net_timeout=15, bind=None, "
              "verbose=False): the driver service of one job (include/hvd/driver.h)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)driver_init,
    .tp_dealloc = (destructor)driver_dealloc,
    .tp_methods = driver_methods,
    .tp_getset = driver_getset,
};

/* ---- Task -------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD hvd_task *t;
    int running; /* run() is in progress */
    char prefix[32];
} TaskObject;

static int level_from(const char *s) {
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

static void task_log(void *user, int level, const char *line) {
    (void)level;
    fprintf(stderr, "%s: %s\n", (const char *)user, line);
}

static int task_init(TaskObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"index",       "driver",       "secret",       "gpus",
                             "work_dir",    "host_hash",    "nics",         "start_timeout",
                             "net_timeout", "min_lifetime", "log_level",    "bind",
                             "elastic",     "warm_python",  "warm_imports", NULL};
    int index;
    const char *driver, *work_dir = NULL, *host_hash = NULL, *level_s = "warn", *bind = NULL,
                        *warm_python = NULL, *warm_imports = NULL;
    Py_buffer secret = {.buf = NULL};
    PyObject *gpus_o = Py_None, *nics_o = Py_None;
    double start_timeout = HVD_TASK_START_TIMEOUT_DEFAULT_S,
           net_timeout = HVD_NET_TIMEOUT_DEFAULT_S,
           min_lifetime = HVD_MIN_LIFETIME_DEFAULT_MS / 1000.0;
    if (self->t) {
        PyErr_SetString(PyExc_RuntimeError, "the task is already started");
        return -1;
    }
    int elastic = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "isy*|OzzOdddszpzz", kwlist, &index, &driver,
                                     &secret, &gpus_o, &work_dir, &host_hash, &nics_o,
                                     &start_timeout, &net_timeout, &min_lifetime, &level_s, &bind,
                                     &elastic, &warm_python, &warm_imports))
        return -1;
    char **gpus = NULL, **nics = NULL;
    hvd_addr *addrs = NULL;
    size_t naddrs = 0;
    int rc = -1, start_ms, net_ms, life_ms, level = level_from(level_s);
    hvd_err err;
    if (secret.len != HVD_SECRET_LEN) {
        PyErr_Format(PyExc_ValueError,
                     "secret must be the job's %d raw bytes (base64.b64decode of the job's "
                     "HVD_SECRET), not %zd bytes",
                     HVD_SECRET_LEN, secret.len);
        goto out;
    }
    if (index < 0 || level < 0) {
        PyErr_SetString(PyExc_ValueError, "index >= 0 and a log level error|warn|info|debug");
        goto out;
    }
    if (ms_from(start_timeout, "start_timeout", &start_ms) != 0 ||
        ms_from(net_timeout, "net_timeout", &net_ms) != 0 ||
        ms_from(min_lifetime, "min_lifetime", &life_ms) != 0 ||
        strv_from(gpus_o, &gpus, "gpus must be a sequence of str") != 0 ||
        strv_from(nics_o, &nics, "nics must be a sequence of str") != 0)
        goto out;
    if (hvd_addrs_parse(driver, &addrs, &naddrs, &err) != 0) {
        raise_err(&err);
        goto out;
    }
    snprintf(self->prefix, sizeof self->prefix, "hvd-task[%d]", index);
    hvd_task_config cfg = {.index = (uint32_t)index,
                           .driver_addrs = addrs,
                           .n_driver_addrs = naddrs,
                           .host_hash = host_hash,
                           .gpus = (const char *const *)gpus,
                           .work_dir = work_dir,
                           .nics = (const char *const *)nics,
                           .start_timeout_ms = start_ms ? start_ms : 1,
                           .net_timeout_ms = net_ms ? net_ms : 1,
                           .min_lifetime_ms = life_ms ? life_ms : -1,
                           .bind_host = bind,
                           .log = task_log,
                           .log_user = self->prefix,
                           .log_level = level,
                           .elastic = elastic,
                           .warm_python = warm_python,
                           .warm_imports = warm_imports};
    memcpy(cfg.secret.key, secret.buf, HVD_SECRET_LEN);
    PyThreadState *ts = PyEval_SaveThread();
    self->t = hvd_task_start(&cfg, &err);
    PyEval_RestoreThread(ts);
    hvd_secret_wipe(&cfg.secret);
    if (!self->t) {
        raise_err(&err);
        goto out;
    }
    rc = 0;
out:
    if (secret.buf) PyBuffer_Release(&secret);
    free(addrs);
    strv_free(gpus);
    strv_free(nics);
    return rc;
}

/* run() -> the command's exit code (the host's first task's for a sibling) */
static PyObject *task_run(TaskObject *self, PyObject *unused) {
    (void)unused;
    if (!self->t || self->running) {
        PyErr_SetString(PyExc_RuntimeError, self->t ? "the task is already running" : "stopped");
        return NULL;
    }
    int code = 0, rc;
    hvd_err err;
    self->running = 1;
    Py_INCREF(self);
    PyThreadState *ts = PyEval_SaveThread();
    rc = hvd_task_run(self->t, &code, &err);
    PyEval_RestoreThread(ts);
    self->running = 0;
    Py_DECREF(self);
    if (rc != 0) return raise_err(&err);
    return PyLong_FromLong(code);
}

static PyObject *task_abort(TaskObject *self, PyObject *unused) {
    (void)unused;
    if (self->t) hvd_task_abort(self->t);
    Py_RETURN_NONE;
}

static PyObject *task_stop(TaskObject *self, PyObject *unused) {
    (void)unused;
    if (self->running) {
        PyErr_SetString(PyExc_RuntimeError, "abort() the running task before stopping it");
        return NULL;
    }
    hvd_task *t = self->t;
    self->t = NULL;
    if (t) {
        PyThreadState *ts = PyEval_SaveThread();
        hvd_task_stop(t);
        PyEval_RestoreThread(ts);
    }
    Py_RETURN_NONE;
}

static PyObject *task_port(TaskObject *self, void *closure) {
    (void)closure;
    if (!self->t) {
        PyErr_SetString(PyExc_RuntimeError, "the task is stopped");
        return NULL;
    }
    return PyLong_FromLong(hvd_task_port(self->t));
}

static void task_dealloc(TaskObject *self) {
    if (self->t) {
        hvd_task_abort(self->t);
        if (!self->running) hvd_task_stop(self->t);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef task_methods[] = {
    {"run", (PyCFunction)task_run, METH_NOARGS, "run() -> exit code: the rest of the task's life"},
    {"abort", (PyCFunction)task_abort, METH_NOARGS, "abort(): end run() (any thread)"},
    {"stop", (PyCFunction)task_stop, METH_NOARGS, "stop(): stop the task service"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef task_getset[] = {
    {"port", (getter)task_port, NULL, "the task service's port", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TaskType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hvd_bridge._core.Task",
    .tp_basicsize = sizeof(TaskObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Task(index, driver, secret, gpus=None, work_dir=None, host_hash=None, nics=None, "
              "start_timeout=600, net_timeout=15, min_lifetime=3, log_level='warn', bind=None, "
              "elastic=False, warm_python=None, warm_imports=None): the task service of one "
              "executor slot (include/hvd/task.h). driver: the driver's addresses (its "
              "HVD_DRIVER_ADDRS); secret: the job's 32 raw bytes (base64.b64decode of its "
              "HVD_SECRET)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)task_init,
    .tp_dealloc = (destructor)task_dealloc,
    .tp_methods = task_methods,
    .tp_getset = task_getset,
};

/* ---- Module ------------------------------------------------------------------------------ */

/* mpi_detect(mpirun=None) -> (implementation, version, daemon): which MPI a launcher belongs
 * to (`mpirun --version`, hvd_mpi_detect), e.g. ("openmpi4", "Open MPI 4.1.4", "orted"). */
static PyObject *mod_mpi_detect(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"mpirun", NULL};
    const char *mpirun = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|z", kwlist, &mpirun)) return NULL;
    hvd_mpi_impl mpi;
    char version[64];
    hvd_err err;
    PyThreadState *ts = PyEval_SaveThread(); /* it runs `mpirun --version` */
    int rc = hvd_mpi_detect(mpirun, &mpi, version, sizeof version, &err);
    PyEval_RestoreThread(ts);
    if (rc != 0) return raise_err(&err);
    return Py_BuildValue("(sss)", hvd_mpi_impl_name(mpi), version, hvd_mpi_daemon(mpi));
}

/* read_hostfile(path) -> "host:n,host:n": Horovod's hostfile read by the launcher's own reader
 * (common/hostspec.h), so hvd_bridge.run(hostfile=) and hvd-driver --hostfile take the same
 * files. ValueError for a file that is not the format; for one that cannot be read, the
 * OSError subclass open() would raise (FileNotFoundError, PermissionError, ...). */
static PyObject *mod_read_hostfile(PyObject *self, PyObject *arg) {
    (void)self;
    PyObject *bytes = NULL;
    if (!PyUnicode_FSConverter(arg, &bytes)) return NULL;
    char *hosts = NULL;
    hvd_err err;
    PyThreadState *ts = PyEval_SaveThread(); /* it reads a file */
    int rc = hvd_hostfile_read(PyBytes_AS_STRING(bytes), &hosts, &err);
    int saved_errno = errno;
    PyEval_RestoreThread(ts);
    Py_DECREF(bytes);
    if (rc != 0 && err.code == HVD_E_IO) { /* FileNotFoundError, PermissionError, ... */
        PyObject *e = PyObject_CallFunction(PyExc_OSError, "isO", saved_errno, err.msg, arg);
        if (e) PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_XDECREF(e);
        return NULL;
    }
    if (rc != 0) {
        PyErr_SetString(PyExc_ValueError, err.msg);
        return NULL;
    }
    PyObject *r = PyUnicode_DecodeFSDefault(hosts);
    free(hosts);
    return r;
}

static PyMethodDef core_methods[] = {
    {"read_hostfile", mod_read_hostfile, METH_O,
     "read_hostfile(path) -> 'host:n,host:n': Horovod's hostfile ('<host> slots=<n>' per line, "
     "# comments) as hvd-driver --hostfile reads it; ValueError when it is not that format"},
    {"mpi_detect", (PyCFunction)(void (*)(void))mod_mpi_detect, METH_VARARGS | METH_KEYWORDS,
     "mpi_detect(mpirun=None) -> (implementation, version, daemon): which MPI a launcher (a "
     "path, or a name in PATH; None: mpirun) belongs to, e.g. ('openmpi4', 'Open MPI 4.1.4', "
     "'orted')"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hvd_bridge._core",
    .m_doc = "The C libraries of hvd-bridge: driver service, job launch, task service.",
    .m_size = -1,
    .m_methods = core_methods,
};

PyMODINIT_FUNC PyInit__core(void);
PyMODINIT_FUNC PyInit__core(void) {
    if (PyType_Ready(&DriverType) < 0 || PyType_Ready(&TaskType) < 0) return NULL;
    PyObject *m = PyModule_Create(&core_module);
    if (!m) return NULL;
    HvdError = PyErr_NewExceptionWithDoc("hvd_bridge._core.HvdError",
                                         "A failure of hvd-bridge's C libraries; .code names its "
                                         "kind (\"timed out\", \"not found\", ...).",
                                         PyExc_RuntimeError, NULL);
    if (!HvdError || PyModule_AddObjectRef(m, "HvdError", HvdError) < 0 ||
        PyModule_AddObjectRef(m, "Driver", (PyObject *)&DriverType) < 0 ||
        PyModule_AddObjectRef(m, "Task", (PyObject *)&TaskType) < 0 ||
        PyModule_AddIntConstant(m, "START_TIMEOUT_DEFAULT_S", HVD_START_TIMEOUT_DEFAULT_S) < 0 ||
        PyModule_AddIntConstant(m, "NET_TIMEOUT_DEFAULT_S", HVD_NET_TIMEOUT_DEFAULT_S) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

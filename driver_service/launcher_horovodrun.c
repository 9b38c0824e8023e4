/* horovodrun's flags that hvd-driver does not take as such (horovod/runner/launch.py, 0.28.1):
 * those that ask for what hvd-bridge does anyway are accepted and said to be ignored; the
 * others are refused, each with why and what to do instead, rather than as unknown options;
 * --prefix-output-with-timestamp becomes Open MPI's --timestamp-output (horovodrun_timestamps;
 * MPICH has none).
 * -v/--version prints hvd-driver's version, as horovodrun prints Horovod's. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "common/strv.h"
#include "launcher.h"

enum { IGNORED, REFUSED, TIMESTAMPS };
static const struct {
    const char *name;
    int has_arg, what;
    const char *why;
} FLAGS[] = {
    {"stall-check", no_argument, IGNORED, "the stall check is on unless --no-stall-check"},
    {"no-autotune", no_argument, IGNORED, "hvd-bridge does not autotune"},
    {"no-hierarchical-allreduce", no_argument, IGNORED, "the runtime's allreduce is flat"},
    {"no-hierarchical-allgather", no_argument, IGNORED, "the runtime's allgather is flat"},
    {"no-torus-allreduce", no_argument, IGNORED, "the runtime's allreduce is flat"},
    {"no-timeline-mark-cycles", no_argument, IGNORED, "the timeline marks no cycles"},
    {"mpi-threads-disable", no_argument, IGNORED,
     "the runtime asks MPI only for MPI_THREAD_FUNNELED (one thread calls MPI)"},
    {"no-mpi-threads-disable", no_argument, IGNORED,
     "the runtime asks MPI only for MPI_THREAD_FUNNELED (one thread calls MPI)"},
    {"gloo-timeout-seconds", required_argument, IGNORED, "hvd-bridge does not use Gloo"},
    {"log-level", required_argument, IGNORED,
     "the runtime has one log level; --verbose shows hvd-driver's progress"},
    {"log-with-timestamp", no_argument, IGNORED, "hvd-bridge's log lines have one format"},
    {"log-without-timestamp", no_argument, IGNORED, "hvd-bridge's log lines have one format"},
    {"log-hide-timestamp", no_argument, IGNORED, "hvd-bridge's log lines have one format"},
    {"no-log-hide-timestamp", no_argument, IGNORED, "hvd-bridge's log lines have one format"},
    {"prefix-output-with-timestamp", no_argument, TIMESTAMPS, "mpirun's --timestamp-output"},
    {"prefix-timestamp", no_argument, TIMESTAMPS, "mpirun's --timestamp-output"},
    {"gloo", no_argument, REFUSED, "hvd-bridge runs every job through MPI: leave it out"},
    {"jsrun", no_argument, REFUSED,
     "hvd-bridge starts the ranks through mpirun only: leave it out"},
    {"autotune", no_argument, REFUSED,
     "hvd-bridge does not autotune: set --fusion-threshold-mb and --cycle-time-ms"},
    {"autotune-log-file", required_argument, REFUSED, "hvd-bridge does not autotune"},
    {"autotune-warmup-samples", required_argument, REFUSED, "hvd-bridge does not autotune"},
    {"autotune-steps-per-sample", required_argument, REFUSED, "hvd-bridge does not autotune"},
    {"autotune-bayes-opt-max-samples", required_argument, REFUSED, "hvd-bridge does not autotune"},
    {"autotune-gaussian-process-noise", required_argument, REFUSED, "hvd-bridge does not autotune"},
    {"hierarchical-allreduce", no_argument, REFUSED,
     "the runtime's allreduce is flat (docs/runtime.md): leave it out"},
    {"hierarchical-allgather", no_argument, REFUSED,
     "the runtime's allgather is flat (docs/runtime.md): leave it out"},
    {"torus-allreduce", no_argument, REFUSED,
     "the runtime's allreduce is flat (docs/runtime.md): leave it out"},
    {"timeline-mark-cycles", no_argument, REFUSED,
     "the timeline marks no cycles: leave it out (--timeline-filename works)"},
    {"config-file", required_argument, REFUSED,
     "hvd-driver reads no config file: give its settings as flags"},
    {"tcp", no_argument, REFUSED,
     "choose MPI's transport with --mpi-args (Open MPI: \"-mca btl self,tcp\")"},
    {"binding-args", required_argument, REFUSED,
     "give mpirun's binding options with --mpi-args (\"--bind-to core\")"},
    {"num-nccl-streams", required_argument, REFUSED, "the runtime uses one NCCL stream"},
    {"thread-affinity", required_argument, REFUSED,
     "the runtime's background thread is not pinned: leave it out"},
    {"check-build", no_argument, REFUSED,
     "hvd-bridge has one build: MPI, and NCCL when built with CUDA (in Python, "
     "hvd_bridge.torch.nccl_built() and mpi_built_for() say)"},
    {"cb", no_argument, REFUSED,
     "hvd-bridge has one build: MPI, and NCCL when built with CUDA (in Python, "
     "hvd_bridge.torch.nccl_built() and mpi_built_for() say)"},
};
#define NFLAGS (sizeof FLAGS / sizeof FLAGS[0])

const struct option *horovodrun_flag_options(void) {
    static struct option opts[NFLAGS + 3];
    if (!opts[0].name) {
        for (size_t i = 0; i < NFLAGS; i++)
            opts[i] = (struct option){FLAGS[i].name, FLAGS[i].has_arg, NULL,
                                      OPT_HOROVODRUN_FLAG + (int)i};
        /* exact names, so that -v is not taken for --verbose (an abbreviation) */
        opts[NFLAGS] = (struct option){"version", no_argument, NULL, OPT_HOROVODRUN_VERSION};
        opts[NFLAGS + 1] = (struct option){"v", no_argument, NULL, OPT_HOROVODRUN_VERSION};
    }
    return opts;
}

void horovodrun_print_version(void) {
    printf("hvd-driver (hvd-bridge) %s\n", HVD_BRIDGE_VERSION);
}

/* As horovodrun spells them: -cb, --gloo. */
static const char *dashes(const char *name) {
    return strlen(name) <= 2 ? "-" : "--";
}

int horovodrun_flag_take(int c, launch_opts *o) {
    size_t i = (size_t)(c - OPT_HOROVODRUN_FLAG);
    if (c < OPT_HOROVODRUN_FLAG || i >= NFLAGS)
        return launch_opts_usage_error("an option is not handled (a bug in hvd-driver)");
    if (FLAGS[i].what == TIMESTAMPS) { /* mpirun's word once its MPI is known */
        o->timestamp_output = true;
        return 0;
    }
    if (FLAGS[i].what == IGNORED) {
        fprintf(stderr, "hvd-driver: horovodrun's %s%s is ignored: %s\n", dashes(FLAGS[i].name),
                FLAGS[i].name, FLAGS[i].why);
        return 0;
    }
    fprintf(stderr, "hvd-driver: horovodrun's %s%s is not supported: %s\n", dashes(FLAGS[i].name),
            FLAGS[i].name, FLAGS[i].why);
    return 2;
}

int horovodrun_timestamps(launch_opts *o) {
    if (!o->timestamp_output) return 0;
    if (o->mpi == HVD_MPI_MPICH) {
        fprintf(stderr, "hvd-driver: horovodrun's --prefix-output-with-timestamp is ignored: "
                        "MPICH's mpiexec has no timestamps\n");
        return 0;
    }
    hvd_strb_add(&o->mpi_argb, "--timestamp-output");
    if (o->mpi_argb.failed) return launch_opts_usage_error("out of memory");
    o->mpi_args = (const char *const *)o->mpi_argb.v;
    return 0;
}

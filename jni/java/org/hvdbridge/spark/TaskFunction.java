package org.hvdbridge.spark;

import java.io.File;
import java.io.IOException;
import java.io.Serializable;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.FutureTask;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.stream.Stream;

import org.apache.spark.BarrierTaskContext;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.resource.ResourceInformation;
import org.hvdbridge.HvdException;
import org.hvdbridge.RankResult;
import org.hvdbridge.TaskService;

import scala.collection.Iterator;

/**
 * The body of each Spark task of a hvd-bridge job, run inside the executor JVM (Horovod's
 * {@code _task_fn}): starts the JNI task service for the task's partition index, registers
 * with the driver service, lives until the job ends (running orted if it is the first task
 * of its host hash), and fails the Spark task with its rank's error text if that rank failed.
 * The task's Spark GPUs (its "gpu" resource) become its rank's GPUs.
 *
 * <p>The job secret is a field of this closure: it travels to the executors inside the
 * serialized task, like Horovod's. Enable Spark's RPC encryption
 * ({@code spark.authenticate=true}, {@code spark.network.crypto.enabled=true}) so that it
 * never crosses the network in clear text (docs/spark.md).
 */
final class TaskFunction implements scala.Function1<Iterator<Integer>, Iterator<TaskOutcome>>, Serializable {
    private static final long serialVersionUID = 1L;

    private final String driverAddresses;
    private final byte[] secret;
    private final boolean hostHashPerExecutor;
    private final int startTimeoutMs;
    private final Map<String, String> env;
    private final String[] nics;
    private final int logLevel;

    TaskFunction(String driverAddresses, byte[] secret, HorovodSpark.Options o) {
        this.driverAddresses = driverAddresses;
        this.secret = secret.clone();
        this.hostHashPerExecutor = o.hostHashPerExecutor;
        this.startTimeoutMs = o.startTimeoutMs;
        this.env = new LinkedHashMap<>(o.taskEnv);
        this.nics = o.nics;
        this.logLevel = o.verbose ? TaskService.LOG_INFO : TaskService.LOG_WARN;
    }

    @Override
    public Iterator<TaskOutcome> apply(Iterator<Integer> ignored) {
        BarrierTaskContext ctx = BarrierTaskContext.get();
        int index = ctx.partitionId();
        if (ctx.attemptNumber() > 0 || ctx.stageAttemptNumber() > 0)
            throw new HvdException("hvd-bridge task " + index + ": attempt " + ctx.attemptNumber() + " of stage attempt "
                                   + ctx.stageAttemptNumber() + " refused: a job's tasks are never retried (its "
                                   + "ranks are gone); run the job again");
        String executorId = SparkEnv.get().executorId();
        String hostHash = hostHashPerExecutor ? TaskService.hostHash("exec" + sanitize(executorId)) : null;
        Path tmp = null;
        Thread cleanup = null;
        try {
            /* A TMPDIR of its own for orted: several orteds on one machine must not share
             * Open MPI session directories (hwloc shared memory). Removed at the end, or when
             * the executor shuts down first (the worker stops it when the application ends). */
            tmp = Files.createTempDirectory("hvd-task-" + index + "-");
            final Path dir = tmp;
            cleanup = new Thread(() -> deleteTree(dir), "hvd-bridge task " + index + " cleanup");
            Runtime.getRuntime().addShutdownHook(cleanup);
            TaskService.Config c = new TaskService.Config(index, driverAddresses, secret)
                                       .hostHash(hostHash)
                                       .startTimeoutMs(startTimeoutMs)
                                       .logLevel(logLevel)
                                       .env("TMPDIR", tmp.toString());
            for (Map.Entry<String, String> e : env.entrySet())
                c.env(e.getKey(), e.getValue());
            if (nics != null) c.nics(nics);
            String[] gpus = gpusOf(ctx);
            if (gpus != null) c.gpus(gpus);
            try (TaskService t = TaskService.start(c)) {
                String ended = null;
                int code = -1;
                try {
                    code = runWatched(t, ctx);
                } catch (HvdException e) {
                    /* Ended by the driver (the job is over, or failed elsewhere): not this
                     * task's failure; a failed rank's own task reports it below. */
                    if (e.code() != HvdException.SHUTDOWN) throw e;
                    ended = e.getMessage();
                }
                if (ctx.isInterrupted())
                    throw new HvdException("hvd-bridge task " + index + " was killed: "
                                           + ctx.getKillReason().getOrElse(() -> "by Spark"));
                RankResult r = t.result();
                if (r != null && r.present() && r.status() != 0)
                    throw new HvdException(r.failure() + " (hvd-bridge task " + index + " on executor " + executorId
                                           + ")");
                TaskOutcome out = new TaskOutcome(index, executorId, hostHash, code, ended);
                return scala.collection.Iterator$.MODULE$.single(out);
            }
        } catch (IOException e) {
            throw new HvdException("hvd-bridge task " + index + ": cannot create a temporary directory: " + e);
        } finally {
            deleteTree(tmp);
            if (cleanup != null) {
                try {
                    Runtime.getRuntime().removeShutdownHook(cleanup);
                } catch (IllegalStateException shuttingDown) {
                    /* the hook runs anyway */
                }
            }
        }
    }

    /*
     * TaskService.run() on a thread of its own, so that this (the Spark task's) thread sees a
     * kill: Spark interrupts it (cancelJobGroup with interruptOnCancel) or only marks the
     * context (a failed barrier stage); either aborts the task service, whose orted dies.
     */
    private static int runWatched(TaskService t, BarrierTaskContext ctx) {
        FutureTask<Integer> run = new FutureTask<>(t::run);
        Thread th = new Thread(run, "hvd-bridge task " + t.index());
        th.setDaemon(true);
        th.start();
        boolean aborted = false, interrupted = false;
        try {
            for (;;) {
                try {
                    return run.get(200, TimeUnit.MILLISECONDS);
                } catch (TimeoutException e) {
                    if (!aborted && ctx.isInterrupted()) {
                        aborted = true;
                        t.abort();
                    }
                } catch (InterruptedException e) {
                    interrupted = true;
                    if (!aborted) {
                        aborted = true;
                        t.abort();
                    }
                } catch (ExecutionException e) {
                    Throwable cause = e.getCause();
                    if (cause instanceof RuntimeException) throw (RuntimeException)cause;
                    if (cause instanceof Error) throw (Error)cause;
                    throw new HvdException("hvd-bridge task " + t.index() + " failed", cause);
                }
            }
        } finally {
            if (interrupted) Thread.currentThread().interrupt();
        }
    }

    /*
     * The GPU addresses Spark gave this task (spark.task.resource.gpu.amount), or null when it
     * has none: then the task service takes CUDA_VISIBLE_DEVICES, as without Spark. hvd-exec
     * gives them to the task's rank as HVD_GPUS and CUDA_VISIBLE_DEVICES (ctx->gpus of a
     * shared-object entry point).
     */
    private static String[] gpusOf(TaskContext ctx) {
        ResourceInformation gpu = ctx.resourcesJMap().get("gpu");
        return gpu != null && gpu.addresses().length > 0 ? gpu.addresses() : null;
    }

    private static String sanitize(String s) {
        StringBuilder b = new StringBuilder();
        for (char ch : s.toCharArray())
            b.append(Character.isLetterOrDigit(ch) && ch < 128 || ch == '-' ? ch : '_');
        return b.toString();
    }

    private static void deleteTree(Path p) {
        if (p == null) return;
        try (Stream<Path> s = Files.walk(p)) {
            s.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
        } catch (IOException ignored) {
        }
    }

    @Override
    public String toString() { /* never the secret */
        return "hvd-bridge task function (driver " + driverAddresses + ")";
    }
}

package org.hvdbridge.spark;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.rdd.RDD;
import org.hvdbridge.DriverService;
import org.hvdbridge.EntryPoint;
import org.hvdbridge.HvdException;
import org.hvdbridge.HvdJobException;
import org.hvdbridge.JobOptions;
import org.hvdbridge.JobResult;
import org.hvdbridge.RankResult;

import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/**
 * Runs an MPI job whose ranks live inside the Spark executors, in the spirit of
 * {@code horovod.spark.run}:
 *
 * <pre>{@code
 * RankResult[] r = HorovodSpark.run(jsc, EntryPoint.sharedObject("train.so", "train", null), 4,
 *                                   new HorovodSpark.Options());
 * }</pre>
 *
 * In this (the Spark driver) JVM it starts the driver service; runs an N-partition barrier
 * Spark job whose tasks start the JNI task service in their executor JVM and wait
 * (TaskService.run); meanwhile, on another thread, runs mpirun through hvd-rsh
 * (DriverService.runJob), which starts orted inside the executors; and returns every rank's
 * result in rank order. On failure it throws {@link HvdJobException} naming the first failed
 * rank and its error text; the failed rank's Spark task fails the Spark job with the same
 * text, and whatever is left of the Spark job is cancelled (its job group).
 */
public final class HorovodSpark {
    private static final AtomicLong JOB_IDS = new AtomicLong();

    private HorovodSpark() {}

    /** Settings of a run; all optional. */
    public static final class Options {
        int startTimeoutMs = 120_000;
        int timeoutSeconds;
        String binDir;
        final List<String> mpiArgs = new ArrayList<>();
        final Map<String, String> taskEnv = new LinkedHashMap<>();
        final Map<String, String> mpirunEnv = new LinkedHashMap<>();
        String[] nics;
        boolean hostHashPerExecutor;
        boolean verbose;
        int cancelGraceMs = 10_000;

        /** Time for the tasks to start, register and agree on interfaces (default 120 s). */
        public Options startTimeoutMs(int v) {
            if (v <= 0) throw new IllegalArgumentException("startTimeoutMs must be > 0, got " + v);
            startTimeoutMs = v;
            return this;
        }

        /** Stop the job after this many seconds; 0 (default): never. */
        public Options timeoutSeconds(int v) {
            timeoutSeconds = v;
            return this;
        }

        /** Where hvd-rsh and hvd-exec are (same path on the executors); default $HVD_BIN_DIR. */
        public Options binDir(String v) {
            binDir = v;
            return this;
        }

        /** Extra mpirun arguments. */
        public Options mpiArgs(String... v) {
            if (v == null || Arrays.asList(v).contains(null))
                throw new NullPointerException("mpiArgs: null argument");
            mpiArgs.addAll(Arrays.asList(v));
            return this;
        }

        /** NAME=VALUE for orted and the ranks, on top of the executor's environment. */
        public Options taskEnv(String name, String value) {
            taskEnv.put(variable("taskEnv", name, value), value);
            return this;
        }

        /** NAME=VALUE for mpirun and hvd-rsh (on the driver). */
        public Options mpirunEnv(String name, String value) {
            mpirunEnv.put(variable("mpirunEnv", name, value), value);
            return this;
        }

        /* A variable's name, checked here rather than on the executors after a stage starts. */
        private static String variable(String what, String name, String value) {
            if (name == null || value == null)
                throw new NullPointerException(what + ": null name or value");
            if (name.isEmpty() || name.indexOf('=') >= 0 || name.indexOf('\0') >= 0 || value.indexOf('\0') >= 0)
                throw new IllegalArgumentException(what + ": '" + name + "' is not a variable name (no '=', no NUL)");
            return name;
        }

        /** Interfaces the job must use (no probing); default: the tasks probe each other. */
        public Options nics(String... v) {
            nics = v == null ? null : v.clone();
            return this;
        }

        /**
         * One host hash per executor instead of per machine: every executor runs its own
         * orted and its tasks' ranks run inside it (several executors on one machine, or
         * executors in containers that share a hostname). Default false: Horovod's behaviour,
         * one orted per machine, in the executor of the machine's lowest task index.
         */
        public Options hostHashPerExecutor(boolean v) {
            hostHashPerExecutor = v;
            return this;
        }

        /** Print the mpirun command line and the services' progress to stderr. */
        public Options verbose(boolean v) {
            verbose = v;
            return this;
        }

        /** After a failure, how long the Spark job may take to fail by itself (with the
         *  failed rank's text) before its job group is cancelled (default 10 s). */
        public Options cancelGraceMs(int v) {
            cancelGraceMs = v;
            return this;
        }
    }

    /**
     * Runs {@code entry} on {@code numProc} ranks (0: the context's default parallelism),
     * one per Spark task, and returns their results in rank order.
     *
     * @throws HvdJobException when the job failed or could not start (the message names the
     *     failed rank, its task, host and error text; {@link HvdJobException#result()} has
     *     every rank's outcome when mpirun ran); its cause is the Spark job's failure, if any
     */
    public static RankResult[] run(JavaSparkContext sc, EntryPoint entry, int numProc, Options options) {
        if (sc == null) throw new NullPointerException("the Spark context is null");
        if (entry == null) throw new NullPointerException("the entry point is null");
        if (numProc < 0)
            throw new IllegalArgumentException("numProc must be 0 (the default parallelism) or more, got " + numProc);
        Options o = options != null ? options : new Options();
        int n = numProc > 0 ? numProc : sc.defaultParallelism();
        waitForSlots(sc, n, o.startTimeoutMs);
        String group = "hvd-bridge.run." + JOB_IDS.incrementAndGet();
        DriverService.Options dopts = new DriverService.Options().verbose(o.verbose);
        if (o.nics != null) dopts.nics(o.nics);
        JobOptions jopts = new JobOptions().startTimeoutMs(o.startTimeoutMs).timeoutSeconds(o.timeoutSeconds)
                               .verbose(o.verbose).mpiArgs(o.mpiArgs.toArray(new String[0]));
        if (o.binDir != null) jopts.binDir(o.binDir);
        for (Map.Entry<String, String> e : o.mpirunEnv.entrySet())
            jopts.env(e.getKey(), e.getValue());

        ExecutorService threads = Executors.newFixedThreadPool(2, r -> {
            Thread t = new Thread(r, "hvd-bridge " + group);
            t.setDaemon(true);
            return t;
        });
        try (DriverService driver = DriverService.start(n, entry, dopts)) {
            TaskFunction fn = new TaskFunction(driver.addresses(), driver.secret(), o);
            Future<List<TaskOutcome>> spark = threads.submit(() -> {
                /* The job group is a property of the submitting thread. */
                sc.setJobGroup(group, "hvd-bridge: " + n + " ranks of " + entry, true);
                try {
                    return sparkJob(sc, n, fn).collect();
                } finally {
                    sc.clearJobGroup();
                }
            });
            Future<JobResult> mpi = threads.submit(() -> driver.runJob(jopts));

            Throwable sparkFailure = null;
            /* Until mpirun is done: a Spark job that fails first stops the job. */
            while (!mpi.isDone()) {
                if (spark.isDone() && sparkFailure == null) {
                    sparkFailure = failureOf(spark);
                    if (sparkFailure != null) driver.abort("the Spark job failed: " + sparkFailure.getMessage());
                }
                if (!sleep(100)) {
                    /* The caller gave up: stop everything, and say so. */
                    driver.abort("the thread that ran the job was interrupted");
                    sc.cancelJobGroup(group);
                    throw new HvdJobException("hvd-bridge job interrupted", null);
                }
            }
            JobResult result = null;
            HvdException notRun = null;
            try {
                result = mpi.get();
            } catch (ExecutionException e) {
                notRun = e.getCause() instanceof HvdException ? (HvdException)e.getCause()
                                                              : new HvdException("the job failed", e.getCause());
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                notRun = new HvdException("interrupted", HvdException.STATE);
            }
            boolean failed = notRun != null || !result.succeeded();
            /* The registration timed out, the Spark job not failed (then its reason is the
             * driver's, "stopped waiting for tasks to register: the Spark job failed: ..."). */
            String why = notRun != null ? notRun.getMessage() : null;
            boolean neverStarted = sparkFailure == null && why != null && why.startsWith("timed out")
                                   && why.contains("waiting for tasks to register");
            if (neverStarted) {
                /* Tasks still waiting for a slot cannot end by themselves. */
                sc.cancelJobGroup(group);
                notRun = new HvdException(notStarted(notRun.getMessage(), n, sc), notRun);
            } else if (failed) {
                /* The failed rank's task fails the Spark job with its text; give it time to,
                 * then cancel what is left. */
                driver.abort(notRun != null ? notRun.getMessage() : result.failureMessage());
                if (!awaitDone(spark, o.cancelGraceMs)) {
                    sc.cancelJobGroup(group);
                }
            }
            if (!awaitDone(spark, Math.max(60_000, o.cancelGraceMs))) {
                sc.cancelJobGroup(group);
                awaitDone(spark, 60_000);
            }
            if (sparkFailure == null) sparkFailure = failureOf(spark);
            if (notRun != null)
                throw new HvdJobException("hvd-bridge job did not run: " + notRun.getMessage(), null,
                                          sparkFailure != null ? sparkFailure : notRun);
            if (!result.succeeded()) throw new HvdJobException(result.failureMessage(), result, sparkFailure);
            if (sparkFailure != null)
                throw new HvdJobException("hvd-bridge job: every rank succeeded but the Spark job failed: "
                                          + sparkFailure.getMessage(), result, sparkFailure);
            return result.ranks();
        } finally {
            threads.shutdownNow();
        }
    }

    /* The task slots the application has now (executors x cores / spark.task.cpus, what Spark's
     * barrier check counts), or -1 when this Spark does not say (a private method, reached by
     * reflection so that another Spark version only loses the wait). */
    private static int taskSlots(JavaSparkContext jsc) {
        try {
            Object sc = jsc.sc();
            Object rpm = sc.getClass().getMethod("resourceProfileManager").invoke(sc);
            Object rp = rpm.getClass().getMethod("defaultResourceProfile").invoke(rpm);
            for (java.lang.reflect.Method m : sc.getClass().getMethods())
                if (m.getName().equals("maxNumConcurrentTasks") && m.getParameterCount() == 1)
                    return ((Number)m.invoke(sc, rp)).intValue();
        } catch (ReflectiveOperationException | RuntimeException e) {
            /* another Spark: do not wait */
        }
        return -1;
    }

    /* Waits until the application has n task slots before the barrier stage is submitted: a
     * stage submitted with too few waits for Spark's next check, 15 s later, and cannot be
     * cancelled meanwhile, so a job asking for more slots than there are failed minutes late.
     * With dynamic allocation (off local mode) Spark refuses a barrier stage at once, saying
     * so: nothing to wait for. */
    private static void waitForSlots(JavaSparkContext sc, int n, int timeoutMs) {
        if (sc.getConf().getBoolean("spark.dynamicAllocation.enabled", false) && !sc.master().startsWith("local"))
            return;
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        int slots = taskSlots(sc);
        while (slots >= 0 && slots < n) {
            if (System.nanoTime() >= deadline)
                throw new HvdJobException(String.format(
                    "hvd-bridge job did not run: timed out after %d ms waiting for %d Spark task slots: the "
                        + "application has %d (executors x cores / spark.task.cpus); the %d tasks run at once in a "
                        + "barrier stage: start more executors, ask for fewer ranks or a longer startTimeoutMs",
                    timeoutMs, n, slots, n), null);
            if (!sleep(200)) throw new HvdJobException("hvd-bridge job interrupted", null);
            slots = taskSlots(sc);
        }
    }

    /* The error for tasks that did not all start in time: the driver's sentence without its
     * question about hvd-task's --driver (that is for task services started by hand). */
    private static String notStarted(String why, int n, JavaSparkContext sc) {
        int cut = why.indexOf(": are the executors running hvd-task");
        String head = cut >= 0 ? why.substring(0, cut) : why;
        int slots = taskSlots(sc) >= 0 ? taskSlots(sc) : sc.defaultParallelism();
        if (n > slots)
            return head + ": the job's " + n + " Spark tasks must run at once (a barrier stage), and the application "
                + "has " + slots + " task slots: start more executors or ask for fewer ranks";
        return head + ": not all of the job's " + n + " Spark tasks started (a barrier stage runs them at once): "
            + "other jobs may hold the application's " + slots + " task slots; wait for them, ask for fewer "
            + "ranks, or give a longer startTimeoutMs";
    }

    /* The N-partition barrier job: all tasks start together or not at all, and the first
     * failed task aborts the stage with its message (no task retries). */
    private static JavaRDD<TaskOutcome> sparkJob(JavaSparkContext sc, int n, TaskFunction fn) {
        List<Integer> indices = new ArrayList<>();
        for (int i = 0; i < n; i++)
            indices.add(i);
        ClassTag<TaskOutcome> tag = ClassTag$.MODULE$.apply(TaskOutcome.class);
        RDD<TaskOutcome> rdd = sc.parallelize(indices, n).rdd().barrier().mapPartitions(fn, false, tag);
        return JavaRDD.fromRDD(rdd, tag);
    }

    private static Throwable failureOf(Future<?> f) {
        if (!f.isDone()) return null;
        try {
            f.get();
            return null;
        } catch (ExecutionException e) {
            return e.getCause();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return e;
        } catch (java.util.concurrent.CancellationException e) {
            return e;
        }
    }

    private static boolean awaitDone(Future<?> f, long ms) {
        try {
            f.get(ms, TimeUnit.MILLISECONDS);
        } catch (TimeoutException e) {
            return false;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return f.isDone();
        } catch (ExecutionException | java.util.concurrent.CancellationException e) {
            /* done, with a failure */
        }
        return true;
    }

    /* False when interrupted (the interrupt status is kept). */
    private static boolean sleep(long ms) {
        try {
            Thread.sleep(ms);
            return true;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return false;
        }
    }
}

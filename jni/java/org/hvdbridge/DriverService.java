package org.hvdbridge;

import java.nio.charset.StandardCharsets;

import java.util.concurrent.locks.ReentrantLock;
import java.util.function.LongFunction;

/**
 * The driver service of one job (libhvd_driver, include/hvd/driver.h) and the mpirun launch
 * (include/hvd/launch.h), embedded in this JVM (a Spark driver, say). It creates the job's
 * secret, listens for the N task services, and {@link #runJob} runs the job the way
 * {@code hvd-driver run} does:
 *
 * <pre>{@code
 * try (DriverService d = DriverService.start(n, EntryPoint.command("hostname"), null)) {
 *     // hand d.addresses() and d.secret() to the N tasks, start them (TaskService)
 *     JobResult r = d.runJob(new JobOptions());   // waits for them, runs mpirun
 *     r.throwIfFailed();
 * }
 * }</pre>
 *
 * Thread safety: {@link #abort}, {@link #shutdownTasks}, {@link #results}, {@link #secret},
 * {@link #addresses} and {@link #close} may be called from any thread at any time (abort and
 * close also stop a running {@link #runJob}); the other operations are serialized. Threads of
 * the native library never call into the JVM: progress lines go straight to stderr.
 */
public final class DriverService implements AutoCloseable {
    /** Length of the job secret in bytes. */
    public static final int SECRET_LENGTH = 32;

    /** Optional settings of the driver service. */
    public static final class Options {
        private String[] nics;
        private String bindHost;
        private int port;
        private boolean verbose;

        /** Interfaces the job must use (skips the tasks' probing); null (default): probe. */
        public Options nics(String... v) {
            nics = v == null ? null : v.clone();
            return this;
        }

        /** Numeric address to listen on; null (default): all interfaces. */
        public Options bindHost(String v) {
            bindHost = v;
            return this;
        }

        /** Port to listen on; 0 (default): ephemeral. */
        public Options port(int v) {
            port = v;
            return this;
        }

        /** Print progress lines ("3/4 tasks registered") to stderr. */
        public Options verbose(boolean v) {
            verbose = v;
            return this;
        }
    }

    private final int numTasks;
    private final NativeHandle handle;
    private final ReentrantLock opLock = new ReentrantLock();
    private boolean jobRan;    /* guarded by opLock */
    private boolean tasksDown; /* a job without keepTasks shut them down; guarded by opLock */

    private DriverService(int numTasks, long h) {
        this.numTasks = numTasks;
        this.handle = new NativeHandle("driver service", h);
    }

    /**
     * Creates a fresh secret and starts the driver service for {@code numTasks} tasks whose
     * ranks run {@code entry}. {@code options} may be null.
     */
    public static DriverService start(int numTasks, EntryPoint entry, Options options) {
        if (numTasks < 1) throw new IllegalArgumentException("the number of tasks must be >= 1, not " + numTasks);
        if (entry == null) throw new NullPointerException("the entry point is null");
        Options o = options != null ? options : new Options();
        Text.checkInterfaces(o.nics, "to probe");
        if (o.port < 0 || o.port > 65535) throw new IllegalArgumentException("bad port " + o.port);
        byte[][] argv = Text.bytes(entry.argv, "the entry point command");
        byte[] symbol = Text.bytes(entry.symbol, "the entry point symbol");
        byte[][] nics = Text.bytes(o.nics, "the interfaces");
        byte[] bind = Text.bytes(o.bindHost, "the bind address");
        NativeLibrary.load();
        long h = nativeStart(numTasks, entry.kind, argv, entry.object, symbol, entry.arg, nics, bind, o.port,
                             o.verbose);
        return new DriverService(numTasks, h);
    }

    /** The number of tasks (and ranks). */
    public int numTasks() {
        return numTasks;
    }

    /**
     * A copy of the 32-byte job secret, for the tasks. Never log it; on Spark it travels in
     * the task closure, which spark.network.crypto.enabled encrypts.
     */
    public byte[] secret() {
        return handle.call(DriverService::nativeSecret);
    }

    /** The addresses tasks reach the driver at, in text form ("lo=127.0.0.1:4000,..."). */
    public String addresses() {
        return Text.string(handle.call(DriverService::nativeAddresses));
    }

    /** Waits until all N tasks registered; timeoutMs < 0 waits without limit. */
    public void waitForRegistration(int timeoutMs) {
        serialized(h -> {
            nativeWaitRegistration(h, timeoutMs);
            return null;
        });
    }

    /**
     * Has the tasks probe each other and returns the interfaces every pair of tasks can use
     * (after {@link #waitForRegistration}).
     */
    public String[] commonInterfaces(int timeoutMs) {
        return Text.strings(serialized(h -> nativeCommonInterfaces(h, timeoutMs)));
    }

    /** mpirun's -H list, "hosthash:slots,..." with task 0's host first (after registration). */
    public String hostList() {
        return Text.string(serialized(DriverService::nativeHostList));
    }

    /**
     * Runs the job like {@code hvd-driver run}: waits for the tasks to register, has them
     * probe each other for common interfaces, runs mpirun (through hvd-rsh, into the tasks)
     * and waits for it, then shuts the tasks down. mpirun's output goes to this process's
     * stdout and stderr. Returns mpirun's status and every rank's outcome in rank order; a
     * failed rank does not throw (see {@link JobResult#throwIfFailed()}). The job's end shuts
     * the tasks down, unless {@link JobOptions#keepTasks} asks for another job: then call
     * runJob again, each job with its own results, and let the last one (or
     * {@link #shutdownTasks}) end them. {@link TaskService.Config#elastic} task services stay
     * for the next job; the others ran their one command, so the next runJob lets them go and
     * waits for new task services at their indices (fresh executors), unless new ones
     * registered there already.
     *
     * @throws IllegalStateException when an earlier job shut the tasks down
     * @throws HvdException when the job cannot start (registration or probe timeout, abort,
     *     mpirun cannot be started)
     */
    public JobResult runJob(JobOptions options) {
        JobOptions o = options != null ? options : new JobOptions();
        String binDir = o.resolveBinDir();
        byte[] bin = Text.bytes(binDir, "the bin dir");
        byte[][] mpiArgs = Text.bytes(o.mpiArgs.toArray(new String[0]), "the mpirun arguments");
        byte[][] env = Text.env(o.env, "the mpirun environment");
        return serialized(h -> {
            try {
                if (tasksDown)
                    throw new IllegalStateException("the task services were shut down after the last job: "
                                                    + "run it with JobOptions.keepTasks(true) to run another");
                if (jobRan) nativeNextJob(h);
                jobRan = true;
                int[] st = nativeRunJob(h, bin, mpiArgs, o.timeoutSeconds, o.startTimeoutMs, o.verbose, env);
                byte[] failure = nativeFailure(h);
                return new JobResult(st[0], st[1] != 0, nativeResults(h),
                                     failure == null ? null : new String(failure, StandardCharsets.UTF_8),
                                     nativeFirstFailedRank(h));
            } finally {
                if (!o.keepTasks) {
                    nativeShutdownTasks(h);
                    tasksDown = true;
                }
            }
        });
    }

    /** Every rank's result so far, in rank order (ranks that did not report: present=false). */
    public RankResult[] results() {
        return handle.call(DriverService::nativeResults);
    }

    /** Tells every task to end (they abort what they run). Any thread. */
    public void shutdownTasks() {
        handle.run(DriverService::nativeShutdownTasks);
    }

    /**
     * Stops the job for {@code reason} (e.g. "the Spark job failed: ..."): waiting for
     * registration or interfaces fails with it, a running mpirun is stopped (SIGTERM, SIGKILL
     * 10 s later) and the tasks are told to end. Any thread; no-op once closed.
     */
    public void abort(String reason) {
        byte[] r = Text.bytes(reason == null ? "aborted" : reason.replace('\0', ' '), "the reason");
        handle.runIfOpen(h -> {
            nativeAbort(h, r);
            nativeShutdownTasks(h);
        });
    }

    /** True once {@link #close()} was called. */
    public boolean isClosed() {
        return handle.isClosed();
    }

    /**
     * Stops a running job (as {@link #abort}), waits for the calls in progress, shuts the
     * tasks down, stops the service and frees everything (the secret is wiped). Idempotent.
     */
    @Override
    public void close() {
        byte[] reason = Text.bytes("the driver service was closed", "reason");
        handle.close(h -> nativeAbort(h, reason), DriverService::nativeStop);
    }

    @Override
    public String toString() {
        return "DriverService{tasks=" + numTasks + (handle.isClosed() ? ", closed" : "") + "}";
    }

    /* f(handle), one driver operation at a time (opLock). */
    private <T> T serialized(LongFunction<T> f) {
        return handle.call(h -> {
            try {
                opLock.lockInterruptibly();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new HvdException("interrupted while waiting for another driver operation", HvdException.STATE);
            }
            try {
                return f.apply(h);
            } finally {
                opLock.unlock();
            }
        });
    }

    private static native long nativeStart(int numTasks, int kind, byte[][] argv, byte[] object, byte[] symbol,
                                           byte[] arg, byte[][] nics, byte[] bindHost, int port, boolean verbose);
    private static native byte[] nativeSecret(long h);
    private static native byte[] nativeAddresses(long h);
    private static native void nativeWaitRegistration(long h, int timeoutMs);
    private static native byte[][] nativeCommonInterfaces(long h, int timeoutMs);
    private static native byte[] nativeHostList(long h);
    private static native void nativeNextJob(long h);
    private static native int[] nativeRunJob(long h, byte[] binDir, byte[][] mpiArgs, int timeoutS,
                                             int startTimeoutMs, boolean verbose, byte[][] env);
    private static native RankResult[] nativeResults(long h);
    private static native byte[] nativeFailure(long h);
    private static native int nativeFirstFailedRank(long h);
    private static native void nativeShutdownTasks(long h);
    private static native void nativeAbort(long h, byte[] reason);
    private static native void nativeStop(long h);
}

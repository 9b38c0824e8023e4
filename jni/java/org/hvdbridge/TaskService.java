package org.hvdbridge;

import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * The task service of one executor slot (libhvd_task, include/hvd/task.h), embedded in this
 * JVM: it registers task {@code index} with the driver service, and when the driver runs
 * mpirun it runs {@code orted} (the lowest index on its host hash) or waits for the one that
 * does. Typical use inside a Spark task:
 *
 * <pre>{@code
 * try (TaskService t = TaskService.start(new TaskService.Config(index, driverAddresses, secret))) {
 *     int exitCode = t.run();          // the task's whole life; blocks until the job ends
 *     RankResult r = t.result();       // this task's rank, or null
 * }
 * }</pre>
 *
 * Every method may be called from any thread. {@link #close()} is idempotent; a call on a
 * closed service throws IllegalStateException. Threads of the native library never call into
 * the JVM: its log lines go straight to this process's stderr.
 */
public final class TaskService implements AutoCloseable {
    /** Log levels of the native library's stderr lines. */
    public static final int LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3;

    /** What {@link #start} needs. Only index, driver addresses and secret are required. */
    public static final class Config {
        private int index = -1;
        private String driverAddresses;
        private byte[] secret;
        private String hostHash;
        private String[] gpus;
        private String workDir;
        private final Map<String, String> env = new LinkedHashMap<>();
        private String[] nics;
        private int startTimeoutMs;
        private int graceMs;
        private int minLifetimeMs;
        private int logLevel = LOG_WARN;
        private boolean elastic;

        public Config() {}

        /** Task {@code index} of the driver at {@code driverAddresses} with the job secret. */
        public Config(int index, String driverAddresses, byte[] secret) {
            index(index).driverAddresses(driverAddresses).secret(secret);
        }

        /** This task's index, 0..N-1. */
        public Config index(int v) {
            index = v;
            return this;
        }

        /** The driver's addresses in text form ({@link DriverService#addresses()}). */
        public Config driverAddresses(String v) {
            driverAddresses = v;
            return this;
        }

        /** The 32-byte job secret ({@link DriverService#secret()}); copied. */
        public Config secret(byte[] v) {
            secret = v == null ? null : v.clone();
            return this;
        }

        /** The host hash to register; null (default): computed ({@link #hostHash(String)}). */
        public Config hostHash(String v) {
            hostHash = v;
            return this;
        }

        /** GPU ids of this executor; null (default): from CUDA_VISIBLE_DEVICES. */
        public Config gpus(String... v) {
            gpus = v == null ? null : v.clone();
            return this;
        }

        /** Where ranks run; null (default): the current directory. */
        public Config workDir(String v) {
            workDir = v;
            return this;
        }

        /** Adds NAME=VALUE to the environment of orted and the ranks (over this process's). */
        public Config env(String name, String value) {
            Text.putVariable(env, name, value, "the task environment");
            return this;
        }

        /** Interfaces to advertise; null (default): all. */
        public Config nics(String... v) {
            nics = v == null ? null : v.clone();
            return this;
        }

        /** Registration and command start timeout; 0 (default): 600 s. */
        public Config startTimeoutMs(int v) {
            startTimeoutMs = v;
            return this;
        }

        /** Abort: SIGTERM, then SIGKILL after this long; 0 (default): 5 s. */
        public Config graceMs(int v) {
            graceMs = v;
            return this;
        }

        /** Exit code still answered this long after the command ended (close() waits for
         *  it, unless the driver shuts the job down first); 0 (default): 3 s; negative: not
         *  at all. */
        public Config minLifetimeMs(int v) {
            minLifetimeMs = v;
            return this;
        }

        /** Run any number of commands, one at a time, until the driver shuts the job down
         *  ({@code hvd-task --elastic}): for a driver that runs several jobs over the same
         *  tasks ({@link JobOptions#keepTasks}) and for elastic jobs. {@link #run()} then
         *  returns at that shutdown. Default false: one command, and run() returns when it
         *  ended. */
        public Config elastic(boolean v) {
            elastic = v;
            return this;
        }

        /** Lines up to this level go to stderr; default {@link #LOG_WARN}. */
        public Config logLevel(int v) {
            logLevel = v;
            return this;
        }

        @Override
        public String toString() { /* never the secret */
            return "TaskService.Config{index=" + index + ", driver=" + driverAddresses
                + (hostHash != null ? ", hostHash=" + hostHash : "")
                + (gpus != null ? ", gpus=" + Arrays.toString(gpus) : "")
                + (workDir != null ? ", workDir=" + workDir : "") + ", env=" + env.keySet() + "}";
        }
    }

    private final int index;
    private final NativeHandle handle;
    private boolean running;

    private TaskService(int index, long h) {
        this.index = index;
        this.handle = new NativeHandle("task service " + index, h);
    }

    /**
     * Starts the task service and registers it with the driver, retrying until the driver
     * answers or the start timeout passes.
     *
     * @throws HvdException if it cannot start or register (the message says why)
     * @throws IllegalArgumentException, NullPointerException on a bad configuration
     */
    public static TaskService start(Config c) {
        if (c == null) throw new NullPointerException("the task service configuration is null");
        if (c.index < 0) throw new IllegalArgumentException("the task index must be >= 0, not " + c.index);
        Text.requireString(c.driverAddresses, "the driver addresses");
        if (c.driverAddresses.trim().isEmpty())
            throw new IllegalArgumentException("the driver addresses are empty");
        if (c.secret == null) throw new NullPointerException("the job secret is null");
        if (c.secret.length != DriverService.SECRET_LENGTH)
            throw new IllegalArgumentException("the job secret must be " + DriverService.SECRET_LENGTH
                                               + " bytes, not " + c.secret.length);
        if (c.hostHash != null && !validHostHash(c.hostHash))
            throw new IllegalArgumentException("bad host hash '" + c.hostHash
                                               + "': 1..127 characters of [A-Za-z0-9_-]");
        Text.checkInterfaces(c.nics, "for all");
        if (c.startTimeoutMs < 0 || c.graceMs < 0)
            throw new IllegalArgumentException("timeouts must be >= 0 (0: the default)");
        if (c.logLevel < LOG_ERROR || c.logLevel > LOG_DEBUG)
            throw new IllegalArgumentException("the log level must be 0..3, not " + c.logLevel);
        byte[] addrs = Text.bytes(c.driverAddresses, "the driver addresses");
        byte[] hostHash = Text.bytes(c.hostHash, "the host hash");
        byte[][] gpus = Text.bytes(c.gpus, "the GPU ids");
        byte[] workDir = Text.bytes(c.workDir, "the work dir");
        byte[][] env = Text.env(c.env, "the task environment");
        byte[][] nics = Text.bytes(c.nics, "the interfaces");
        NativeLibrary.load();
        byte[] secret = c.secret.clone();
        try {
            long h = nativeStart(c.index, secret, addrs, hostHash, gpus, workDir, env, nics,
                                 c.startTimeoutMs, c.graceMs, c.minLifetimeMs, c.logLevel, c.elastic);
            return new TaskService(c.index, h);
        } finally {
            Arrays.fill(secret, (byte)0);
        }
    }

    /** Task {@code index} with defaults; see {@link #start(Config)}. */
    public static TaskService start(int index, String driverAddresses, byte[] secret) {
        return start(new Config(index, driverAddresses, secret));
    }

    /**
     * This machine's host hash (include/hvd/net.h, hvd_host_hash): the short hostname and an
     * MD5 of the hostname and namespaces, then "-salt" if salt is not null, then
     * "-$CONTAINER_ID" if set. $HVD_HOST_HASH overrides it. Tasks with the same host hash
     * share one orted (the lowest index runs it).
     */
    public static String hostHash(String salt) {
        byte[] s = Text.bytes(salt, "the host hash salt");
        NativeLibrary.load();
        return Text.string(nativeHostHash(s));
    }

    /** True if s is a valid host hash: 1..127 characters of [A-Za-z0-9_-]. */
    public static boolean validHostHash(String s) {
        if (s == null || s.isEmpty() || s.length() > 127) return false;
        for (int i = 0; i < s.length(); i++) {
            char ch = s.charAt(i);
            if (!(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '_'
                  || ch == '-'))
                return false;
        }
        return true;
    }

    /** This task's index. */
    public int index() {
        return index;
    }

    /** The task service's TCP port. */
    public int port() {
        return handle.call(TaskService::nativePort);
    }

    /**
     * Runs the rest of the task's life on this thread: waits for the driver's
     * registration-complete notice, probes the other tasks, then runs orted when asked (the
     * first task of its host) or waits for the first task's command to end. Returns the
     * command's exit code (a sibling gets the first task's). Ends early, aborting the
     * command, when the driver shuts the tasks down or goes away, on {@link #abort()} or on
     * {@link #close()}. May be called once.
     *
     * @throws HvdException on a timeout (naming what was awaited) or an abort
     */
    public int run() {
        return handle.call(h -> {
            synchronized (this) {
                if (running) throw new IllegalStateException("task service " + index + ": run() was already called");
                running = true;
            }
            return nativeRun(h);
        });
    }

    /** Makes {@link #run()} abort the command and return. Any thread; no-op once closed. */
    public void abort() {
        handle.runIfOpen(TaskService::nativeAbort);
    }

    /** The result the rank of this task registered, or null if none (yet). */
    public RankResult result() {
        return handle.call(TaskService::nativeResult);
    }

    /** True once {@link #close()} was called. */
    public boolean isClosed() {
        return handle.isClosed();
    }

    /**
     * Aborts a running {@link #run()}, waits for it to return, stops the service (killing any
     * command still running) and frees everything. Idempotent; concurrent calls all return
     * once the service is gone.
     */
    @Override
    public void close() {
        handle.close(TaskService::nativeAbort, TaskService::nativeStop);
    }

    @Override
    public String toString() {
        return "TaskService{index=" + index + (handle.isClosed() ? ", closed" : "") + "}";
    }

    private static native long nativeStart(int index, byte[] secret, byte[] driverAddrs, byte[] hostHash,
                                           byte[][] gpus, byte[] workDir, byte[][] env, byte[][] nics,
                                           int startTimeoutMs, int graceMs, int minLifetimeMs, int logLevel,
                                           boolean elastic);
    private static native int nativeRun(long h);
    private static native void nativeAbort(long h);
    private static native RankResult nativeResult(long h);
    private static native int nativePort(long h);
    private static native void nativeStop(long h);
    private static native byte[] nativeHostHash(byte[] salt);
}

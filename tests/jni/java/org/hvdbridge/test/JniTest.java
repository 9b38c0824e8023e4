package org.hvdbridge.test;

import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Stream;

import org.hvdbridge.DriverService;
import org.hvdbridge.EntryPoint;
import org.hvdbridge.HvdException;
import org.hvdbridge.HvdJobException;
import org.hvdbridge.JobOptions;
import org.hvdbridge.JobResult;
import org.hvdbridge.NativeLibrary;
import org.hvdbridge.RankResult;
import org.hvdbridge.TaskService;

/**
 * The JNI layer without Spark: a driver service and N task services (threads of this JVM)
 * run real mpirun jobs through hvd-rsh into the embedded task services.
 *
 * usage: JniTest --bin DIR --probe-lib libprobe_entry.so --jvm-probe libjvm_probe.so CASE
 * CASE: errors | job | jobs | soak | ancestry | failing_rank | argv | close_running | repeat
 *       | load [--expect-from WHERE]
 * soak: -Dhvdbridge.soak.jobs=N (default 30) jobs; -Dhvdbridge.soak.out=FILE writes the
 * samples as JSON lines (tests/soak/test_soak.py --jvm-samples reads them).
 */
public final class JniTest {
    static String bin, probeLib, jvmProbe, expectFrom;
    static Path tmp;
    static final long PID = ProcessHandle.current().pid();

    public static void main(String[] args) throws Exception {
        String which = null;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
            case "--bin": bin = args[++i]; break;
            case "--probe-lib": probeLib = args[++i]; break;
            case "--jvm-probe": jvmProbe = args[++i]; break;
            case "--expect-from": expectFrom = args[++i]; break;
            default: which = args[i];
            }
        }
        if (which == null || bin == null || probeLib == null || jvmProbe == null) {
            System.err.println("usage: JniTest --bin DIR --probe-lib LIB --jvm-probe LIB CASE");
            System.exit(2);
        }
        tmp = Files.createTempDirectory("hvd-jnitest");
        long t0 = System.nanoTime();
        int rc = 0;
        try {
            switch (which) {
            case "errors": errors(); break;
            case "job": job(); break;
            case "jobs": jobs(); break;
            case "soak": soak(); break;
            case "soak_fresh": soakFresh(); break;
            case "soak_fresh_tasks": soakFreshTasks(); break;
            case "ancestry": ancestry(); break;
            case "failing_rank": failingRank(); break;
            case "timeout": timeout(); break;
            case "argv": argv(); break;
            case "close_running": closeRunning(); break;
            case "load": load(); break;
            case "repeat": repeat(); break;
            case "keeper": keeper(); break;
            default: throw new IllegalArgumentException("unknown case " + which);
            }
            System.out.printf("PASS %s (%.1f s, library from %s)%n", which, (System.nanoTime() - t0) / 1e9,
                              which.equals("load") && "fail".equals(expectFrom) ? "nowhere" : NativeLibrary.loadedFrom());
        } catch (Throwable e) {
            System.out.println("FAIL " + which + ": " + e);
            e.printStackTrace(System.out);
            rc = 1;
        } finally {
            deleteTree(tmp);
        }
        System.exit(rc);
    }

    // ---- helpers ----------------------------------------------------------------------------

    static void check(boolean ok, String what) {
        if (!ok) throw new AssertionError(what);
    }

    interface Body {
        void run() throws Exception;
    }

    static <T extends Throwable> T expect(Class<T> cls, String contains, Body body) {
        try {
            body.run();
        } catch (Throwable e) {
            if (!cls.isInstance(e))
                throw new AssertionError("expected " + cls.getSimpleName() + " but got " + e, e);
            if (contains != null && (e.getMessage() == null || !e.getMessage().contains(contains)))
                throw new AssertionError("expected '" + contains + "' in the message of " + e, e);
            return cls.cast(e);
        }
        throw new AssertionError("expected " + cls.getSimpleName() + ", nothing was thrown");
    }

    static void deleteTree(Path p) {
        if (p == null || !Files.exists(p)) return;
        try (Stream<Path> s = Files.walk(p)) {
            s.sorted(Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
        } catch (IOException ignored) {
        }
    }

    /** One task service on a thread: start, run, result, close. */
    static final class TaskThread extends Thread {
        final TaskService.Config cfg;
        volatile TaskService service;
        volatile int exitCode = Integer.MIN_VALUE;
        volatile RankResult result;
        volatile Throwable failure;
        final CountDownLatch started = new CountDownLatch(1);

        TaskThread(TaskService.Config cfg) {
            super("task-" + cfg);
            this.cfg = cfg;
        }

        @Override
        public void run() {
            try {
                service = TaskService.start(cfg);
                started.countDown();
                exitCode = service.run();
                result = service.result();
            } catch (Throwable e) {
                failure = e;
            } finally {
                started.countDown();
                if (service != null) service.close();
            }
        }
    }

    /** N task services of a driver on `hosts` fake hosts: task i on host i*hosts/N. */
    static List<TaskThread> startTasks(DriverService d, int n, int hosts, String marker) throws IOException {
        return startTasks(d, n, hosts, marker, false);
    }

    static List<TaskThread> startTasks(DriverService d, int n, int hosts, String marker, boolean elastic)
        throws IOException {
        List<TaskThread> v = new ArrayList<>();
        String addrs = d.addresses();
        byte[] secret = d.secret();
        for (int i = 0; i < n; i++) {
            int h = i * hosts / n;
            Path hostTmp = Files.createDirectories(tmp.resolve("host" + h));
            Path work = Files.createDirectories(tmp.resolve("task" + i));
            TaskService.Config c = new TaskService.Config(i, addrs, secret)
                                       .hostHash(TaskService.hostHash("jnitest" + PID + "h" + h))
                                       .workDir(work.toString())
                                       .env("TMPDIR", hostTmp.toString())
                                       .startTimeoutMs(60_000)
                                       .minLifetimeMs(500)
                                       .elastic(elastic);
            if (marker != null) c.env("HVD_TEST_MARKER", marker);
            TaskThread t = new TaskThread(c);
            t.start();
            v.add(t);
        }
        return v;
    }

    static void joinTasks(List<TaskThread> tasks, long ms) throws InterruptedException {
        long deadline = System.currentTimeMillis() + ms;
        for (TaskThread t : tasks) {
            t.join(Math.max(1, deadline - System.currentTimeMillis()));
            check(!t.isAlive(), "task thread " + t.cfg + " did not end in " + ms + " ms");
        }
    }

    static JobOptions opts(String marker) {
        JobOptions o = new JobOptions().binDir(bin).startTimeoutMs(60_000).timeoutSeconds(120);
        if (marker != null) o.env("HVD_TEST_MARKER", marker);
        return o;
    }

    /** Processes (other than this JVM) whose environment holds HVD_TEST_MARKER=marker. */
    static List<String> markedProcesses(String marker) {
        byte[] needle = ("HVD_TEST_MARKER=" + marker).getBytes(StandardCharsets.UTF_8);
        List<String> found = new ArrayList<>();
        try (DirectoryStream<Path> ds = Files.newDirectoryStream(Paths.get("/proc"), "[0-9]*")) {
            for (Path p : ds) {
                if (p.getFileName().toString().equals(Long.toString(PID))) continue;
                try {
                    byte[] env = Files.readAllBytes(p.resolve("environ"));
                    if (indexOf(env, needle) >= 0) {
                        String comm = new String(Files.readAllBytes(p.resolve("comm")), StandardCharsets.UTF_8).trim();
                        found.add(p.getFileName() + ":" + comm);
                    }
                } catch (IOException gone) {
                }
            }
        } catch (IOException e) {
            throw new RuntimeException(e);
        }
        return found;
    }

    static int indexOf(byte[] hay, byte[] needle) {
        outer:
        for (int i = 0; i + needle.length <= hay.length; i++) {
            if (i > 0 && hay[i - 1] != 0) continue; /* entries start after a NUL */
            for (int j = 0; j < needle.length; j++)
                if (hay[i + j] != needle[j]) continue outer;
            if (i + needle.length == hay.length || hay[i + needle.length] == 0) return i;
        }
        return -1;
    }

    static void awaitNoMarked(String marker, long ms) throws InterruptedException {
        long deadline = System.currentTimeMillis() + ms;
        List<String> left;
        while (!(left = markedProcesses(marker)).isEmpty() && System.currentTimeMillis() < deadline)
            Thread.sleep(100);
        check(left.isEmpty(), "processes of the job outlived it: " + left);
    }

    // ---- cases ------------------------------------------------------------------------------

    /** Bad arguments and use after close throw Java exceptions; nothing crashes. */
    static void errors() throws Exception {
        byte[] secret = new byte[32];
        expect(IllegalArgumentException.class, "number of tasks", () -> DriverService.start(0, EntryPoint.command("true"), null));
        expect(NullPointerException.class, "entry point", () -> DriverService.start(1, null, null));
        expect(NullPointerException.class, null, () -> EntryPoint.command((String[])null));
        expect(IllegalArgumentException.class, "empty", () -> EntryPoint.command());
        expect(IllegalArgumentException.class, "empty", () -> EntryPoint.command(""));
        expect(NullPointerException.class, null, () -> EntryPoint.command("a", null));
        expect(IllegalArgumentException.class, "NUL", () -> EntryPoint.command("a\0b"));
        expect(IllegalArgumentException.class, "empty", () -> EntryPoint.sharedObject(new byte[0], "f", null));
        expect(NullPointerException.class, null, () -> EntryPoint.sharedObject((byte[])null, "f", null));
        expect(NullPointerException.class, null, () -> EntryPoint.sharedObject(new byte[1], null, null));
        expect(java.io.UncheckedIOException.class, "cannot read", () -> EntryPoint.sharedObject("/nonexistent.so", "f", null));
        expect(IllegalArgumentException.class, "interfaces", () -> DriverService.start(1, EntryPoint.command("true"), new DriverService.Options().nics()));
        expect(IllegalArgumentException.class, "port", () -> DriverService.start(1, EntryPoint.command("true"), new DriverService.Options().port(70000)));
        expect(HvdException.class, null, () -> DriverService.start(1, EntryPoint.command("true"), new DriverService.Options().bindHost("not-an-address")).close());

        expect(NullPointerException.class, null, () -> TaskService.start(null));
        expect(IllegalArgumentException.class, "index", () -> TaskService.start(-1, "lo=127.0.0.1:1", secret));
        expect(NullPointerException.class, "secret", () -> TaskService.start(0, "lo=127.0.0.1:1", null));
        expect(IllegalArgumentException.class, "32 bytes", () -> TaskService.start(0, "lo=127.0.0.1:1", new byte[31]));
        expect(NullPointerException.class, "driver addresses", () -> TaskService.start(0, null, secret));
        expect(IllegalArgumentException.class, "empty", () -> TaskService.start(0, "  ", secret));
        HvdException bad = expect(HvdException.class, "driver addresses", () -> TaskService.start(0, "no address here", secret));
        check(bad.code() == HvdException.INVALID, "bad addresses: code " + bad.code());
        expect(IllegalArgumentException.class, "host hash", () -> TaskService.start(new TaskService.Config(0, "lo=127.0.0.1:1", secret).hostHash("a.b")));
        expect(IllegalArgumentException.class, "interfaces", () -> TaskService.start(new TaskService.Config(0, "lo=127.0.0.1:1", secret).nics()));
        expect(NullPointerException.class, null, () -> TaskService.start(new TaskService.Config(0, "lo=127.0.0.1:1", secret).env(null, "x")));
        expect(IllegalArgumentException.class, "variable name", () -> TaskService.start(new TaskService.Config(0, "lo=127.0.0.1:1", secret).env("A=B", "x")));
        expect(IllegalArgumentException.class, "log level", () -> TaskService.start(new TaskService.Config(0, "lo=127.0.0.1:1", secret).logLevel(9)));
        expect(IllegalArgumentException.class, "NUL", () -> TaskService.hostHash("a\0"));
        String hh = TaskService.hostHash(null);
        check(TaskService.validHostHash(hh), "host hash " + hh);
        String salted = TaskService.hostHash("x");
        check(TaskService.validHostHash(salted) && salted.equals(TaskService.hostHash("x")), "salted " + salted);
        if (System.getenv("HVD_HOST_HASH") == null)
            check(!salted.equals(hh), "the salt changes the host hash: " + salted);

        /* No driver listening: registration gives up after the start timeout, with a reason. */
        long t0 = System.nanoTime();
        HvdException noDriver = expect(HvdException.class, null,
            () -> TaskService.start(new TaskService.Config(0, "lo=127.0.0.1:1", secret).startTimeoutMs(1500)));
        check((System.nanoTime() - t0) / 1e9 < 20, "registration with no driver took too long");
        System.out.println("no driver: " + noDriver.getMessage());

        try (DriverService d = DriverService.start(2, EntryPoint.command("true"), null)) {
            byte[] s1 = d.secret(), s2 = d.secret();
            check(s1.length == 32 && java.util.Arrays.equals(s1, s2) && s1 != s2, "secret copies");
            s1[0] ^= 1;
            check(!java.util.Arrays.equals(s1, d.secret()), "secret() returns a copy");
            check(d.addresses().contains("127.0.0.1:"), "addresses " + d.addresses());
            /* The wrong secret: the driver drops the task, which gives up with a reason. */
            HvdException auth = expect(HvdException.class, null, () -> TaskService.start(
                new TaskService.Config(0, d.addresses(), new byte[32]).startTimeoutMs(1500)));
            System.out.println("wrong secret: " + auth.getMessage());
            HvdException tmo = expect(HvdException.class, "0-1", () -> d.waitForRegistration(300));
            check(tmo.code() == HvdException.TIMEOUT, "timeout code " + tmo.code());
            expect(HvdException.class, null, () -> d.hostList());
            expect(HvdException.class, "hvd-rsh", () -> d.runJob(new JobOptions().binDir(tmp.toString())));
            expect(NullPointerException.class, null, () -> new JobOptions().env(null, "v"));
            expect(IllegalArgumentException.class, null, () -> new JobOptions().timeoutSeconds(-1));
            expect(NullPointerException.class, null, () -> new JobOptions().mpiArgs((String)null));
            RankResult[] r = d.results();
            check(r.length == 2 && !r[0].present() && !r[1].present(), "results before the job");
            d.abort("stopped by the test");
            expect(HvdException.class, "stopped by the test", () -> d.waitForRegistration(10_000));
            d.close();
            d.close();
            expect(IllegalStateException.class, "closed", d::secret);
            expect(IllegalStateException.class, "closed", d::addresses);
            expect(IllegalStateException.class, "closed", d::results);
            expect(IllegalStateException.class, "closed", d::shutdownTasks);
            expect(IllegalStateException.class, "closed", () -> d.waitForRegistration(1));
            expect(IllegalStateException.class, "closed", () -> d.runJob(new JobOptions().binDir(bin)));
            d.abort("after close: a no-op");
            check(d.isClosed(), "isClosed");
        }

        /* A task service: use after close, run twice, concurrent closes. */
        try (DriverService d = DriverService.start(1, EntryPoint.command("true"), null)) {
            TaskService t = TaskService.start(new TaskService.Config(0, d.addresses(), d.secret()).startTimeoutMs(10_000));
            check(t.port() > 0, "port");
            check(t.result() == null, "no result yet");
            d.waitForRegistration(10_000);
            AtomicReference<Throwable> runFailure = new AtomicReference<>();
            Thread runner = new Thread(() -> {
                try {
                    t.run();
                } catch (Throwable e) {
                    runFailure.set(e);
                }
            });
            runner.start();
            Thread.sleep(300);
            expect(IllegalStateException.class, "already", t::run);
            /* Several threads close it while run() is blocked: all return, run() ends. */
            List<Thread> closers = new ArrayList<>();
            for (int i = 0; i < 4; i++) {
                Thread c = new Thread(t::close);
                closers.add(c);
                c.start();
            }
            for (Thread c : closers) {
                c.join(30_000);
                check(!c.isAlive(), "close() hangs");
            }
            runner.join(30_000);
            check(!runner.isAlive(), "run() did not end on close");
            System.out.println("run() after close from another thread: " + runFailure.get());
            t.close();
            expect(IllegalStateException.class, "closed", t::run);
            expect(IllegalStateException.class, "closed", t::result);
            expect(IllegalStateException.class, "closed", t::port);
            t.abort(); /* no-op */
        }

        /* Closing a driver whose runJob waits for the tasks: runJob throws, nothing hangs. */
        DriverService waiting = DriverService.start(2, EntryPoint.command("true"), null);
        AtomicReference<Throwable> waitFailure = new AtomicReference<>();
        Thread runner = new Thread(() -> {
            try {
                waiting.runJob(new JobOptions().binDir(bin).startTimeoutMs(60_000));
            } catch (Throwable e) {
                waitFailure.set(e);
            }
        });
        runner.start();
        Thread.sleep(300);
        long tc = System.nanoTime();
        waiting.close();
        runner.join(30_000);
        check(!runner.isAlive() && (System.nanoTime() - tc) / 1e9 < 10, "close did not end runJob's wait");
        check(waitFailure.get() instanceof HvdException && waitFailure.get().getMessage().contains("closed"),
              "runJob after close: " + waitFailure.get());

        /* Concurrent closes of a driver. */
        DriverService d = DriverService.start(3, EntryPoint.command("true"), null);
        List<Thread> closers = new ArrayList<>();
        for (int i = 0; i < 8; i++) {
            Thread c = new Thread(i % 2 == 0 ? d::close : () -> d.abort("racing"));
            closers.add(c);
        }
        closers.forEach(Thread::start);
        for (Thread c : closers) c.join(30_000);
        check(d.isClosed(), "closed after concurrent closes");
    }

    static int count(String dir) {
        String[] v = new File(dir).list();
        return v == null ? -1 : v.length;
    }

    /** Jobs one after the other in one JVM: every close gives back its threads and
     *  descriptors (the JVM's own may come and go a little). */
    static void repeat() throws Exception {
        int n = 2, rounds = 6;
        int fds0 = 0, threads0 = 0;
        for (int round = 0; round < rounds; round++) {
            try (DriverService d = DriverService.start(n, EntryPoint.sharedObject(probeLib, "probe_entry", null), null)) {
                List<TaskThread> tasks = startTasks(d, n, 1, null);
                JobResult jr = d.runJob(opts(null));
                check(jr.succeeded(), "round " + round + ": " + jr.failureMessage());
                joinTasks(tasks, 30_000);
            }
            System.gc();
            int fds = count("/proc/self/fd"), threads = count("/proc/self/task");
            System.out.printf("round %d: %d descriptors, %d threads%n", round, fds, threads);
            if (round == 1) {
                fds0 = fds;
                threads0 = threads;
            }
            if (round > 1) {
                check(fds <= fds0 + 4, "descriptors grow: " + fds0 + " -> " + fds);
                check(threads <= threads0 + 4, "threads grow: " + threads0 + " -> " + threads);
            }
        }
    }

    /** Where the library comes from: the jar, java.library.path, -Dhvdbridge.library; a
     *  library that cannot be loaded gives UnsatisfiedLinkError, every time, no crash. */
    static void load() {
        if ("fail".equals(expectFrom)) {
            for (int i = 0; i < 2; i++) {
                UnsatisfiedLinkError e = expect(UnsatisfiedLinkError.class, "libhvd_jni", () -> TaskService.hostHash(null));
                String m = e.getMessage(), libPath = System.getProperty("java.library.path");
                System.out.println("load failure: " + m);
                check(m.contains("HVD_JNI_LIBRARY"), "the message says what to set: " + m);
                if (System.getProperty("hvdbridge.library") == null) /* java.library.path tried */
                    check(m.indexOf(libPath) >= 0 && m.indexOf(libPath) == m.lastIndexOf(libPath),
                          "java.library.path listed once: " + m);
            }
            return;
        }
        check(TaskService.validHostHash(TaskService.hostHash(null)), "host hash");
        check(NativeLibrary.loadedFrom().contains(expectFrom), "loaded from " + NativeLibrary.loadedFrom() + ", want " + expectFrom);
    }

    /** 4 ranks on 2 fake hosts: probe_entry's results in rank order, rank r = task r. */
    static void job() throws Exception {
        int n = 4;
        try (DriverService d = DriverService.start(n, EntryPoint.sharedObject(probeLib, "probe_entry", "hello".getBytes()), null)) {
            List<TaskThread> tasks = startTasks(d, n, 2, null);
            JobResult jr = d.runJob(opts(null));
            System.out.println(jr);
            check(jr.succeeded(), "job failed: " + jr.failureMessage());
            RankResult[] r = jr.ranks();
            check(r.length == n, "ranks: " + r.length);
            for (int i = 0; i < n; i++) {
                String want = "rank=" + i + " size=4 local_rank=" + (i % 2) + " task=" + i + " ";
                check(r[i].rank() == i && r[i].taskIndex() == i && r[i].text().startsWith(want),
                      "rank " + i + ": " + r[i].text());
                check(r[i].hostHash().equals(TaskService.hostHash("jnitest" + PID + "h" + (i / 2))),
                      "rank " + i + " host " + r[i].hostHash());
            }
            expect(IllegalStateException.class, "shut down after the last job", () -> d.runJob(opts(null)));
            joinTasks(tasks, 30_000);
            for (TaskThread t : tasks) {
                check(t.failure == null, "task " + t.cfg + ": " + t.failure);
                check(t.exitCode == 0, "task " + t.cfg + " exit code " + t.exitCode);
                check(t.result != null && t.result.status() == 0 && t.result.text().startsWith("rank="),
                      "task-side result " + t.result);
            }
        }
    }

    /** Three jobs one after another over the same elastic task services (keepTasks on the
     *  first two), each with its own results; the third shuts the tasks down, after which
     *  runJob refuses with the reason. */
    static void jobs() throws Exception {
        int n = 4;
        try (DriverService d = DriverService.start(n, EntryPoint.sharedObject(probeLib, "probe_entry", null), null)) {
            List<TaskThread> tasks = startTasks(d, n, 2, null, true);
            for (int job = 0; job < 3; job++) {
                /* Each job's ranks leave their state files in a directory of its own. */
                Path dir = Files.createDirectories(tmp.resolve("job" + job));
                JobResult jr = d.runJob(opts(null).keepTasks(job < 2).env("HVD_E2E_DIR", dir.toString())
                                            .mpiArgs("-x", "HVD_E2E_DIR"));
                check(jr.succeeded(), "job " + job + " failed: " + jr.failureMessage());
                for (int i = 0; i < n; i++)
                    check(Files.exists(dir.resolve("state." + i)), "job " + job + ": rank " + i + " never ran");
                RankResult[] r = jr.ranks();
                check(r.length == n, "job " + job + ": " + r.length + " ranks");
                for (int i = 0; i < n; i++)
                    check(r[i].present() && r[i].text().startsWith("rank=" + i + " size=4 "),
                          "job " + job + " rank " + i + ": " + r[i].text());
                if (job < 2) {
                    for (TaskThread t : tasks) check(t.isAlive(), "task " + t.cfg + " ended after job " + job);
                }
            }
            expect(IllegalStateException.class, "shut down after the last job", () -> d.runJob(opts(null)));
            joinTasks(tasks, 30_000);
            for (TaskThread t : tasks) {
                check(t.failure == null, "task " + t.cfg + ": " + t.failure);
                check(t.exitCode == 0, "task " + t.cfg + " exit code " + t.exitCode);
            }
        }
    }

    static long vmRssKib() throws IOException {
        for (String line : Files.readAllLines(Paths.get("/proc/self/status")))
            if (line.startsWith("VmRSS:")) return Long.parseLong(line.split("\\s+")[1]);
        return -1;
    }

    /** A long-lived DriverService running N jobs back to back over the same two elastic task
     *  services (threads of this JVM, as in a Spark driver that hosts both): after the
     *  warm-up (the first fifth, at least 5 jobs) the JVM's descriptors and threads stay
     *  within JVM_NOISE of their value at its end (the JVM's own come and go: JIT compiler
     *  threads, a jar opened; a leak of one per job would pass it within a few jobs), and
     *  VmRSS grows by less than 16 MiB (the heap's own breathing included). */
    static final int JVM_NOISE = 4;

    static void soak() throws Exception {
        soakLoop(false);
    }

    /** As soak, each job over a DriverService and task services of its own (as each call of
     *  hvd_bridge.spark.run or HorovodSpark.run starts them), all in this JVM. */
    static void soakFresh() throws Exception {
        soakLoop(true);
    }

    /** As soak, through one long-lived DriverService, each job over two new task services
     *  that run one command each (not elastic, as on executors that come and go): between
     *  jobs the driver lets the spent ones go and the next job waits for the new pair. Each
     *  pair must end by itself, with status 0. */
    static void soakFreshTasks() throws Exception {
        int n = 2;
        EntryPoint entry = EntryPoint.sharedObject(probeLib, "probe_entry", null);
        try (DriverService d = DriverService.start(n, entry, null)) {
            soakMeasure(true, (job, last) -> {
                List<TaskThread> tasks = startTasks(d, n, 1, null);
                JobResult jr = d.runJob(opts(null).keepTasks(!last));
                check(jr.succeeded(), "job " + job + " failed: " + jr.failureMessage());
                joinTasks(tasks, 30_000);
                for (TaskThread t : tasks)
                    check(t.failure == null && t.exitCode == 0,
                          "job " + job + ": task " + t.cfg + ": " + t.failure + ", exit code " + t.exitCode);
            });
        }
    }

    /** One soak job: runs it, checks it succeeded. */
    interface SoakJob {
        void run(int job, boolean last) throws Exception;
    }

    static void soakLoop(boolean fresh) throws Exception {
        int n = 2;
        EntryPoint entry = EntryPoint.sharedObject(probeLib, "probe_entry", null);
        if (fresh) {
            soakMeasure(true, (job, last) -> {
                try (DriverService d = DriverService.start(n, entry, null)) {
                    List<TaskThread> tasks = startTasks(d, n, 1, null);
                    JobResult jr = d.runJob(opts(null));
                    check(jr.succeeded(), "job " + job + " failed: " + jr.failureMessage());
                    joinTasks(tasks, 30_000);
                }
            });
            return;
        }
        try (DriverService d = DriverService.start(n, entry, null)) {
            List<TaskThread> tasks = startTasks(d, n, 1, null, true);
            soakMeasure(false, (job, last) -> {
                JobResult jr = d.runJob(opts(null).keepTasks(!last));
                check(jr.succeeded(), "job " + job + " failed: " + jr.failureMessage());
            });
            joinTasks(tasks, 30_000);
        }
    }

    /** Runs the soak's jobs, reading the JVM's descriptors, threads and VmRSS after each and
     *  checking them against their values at the end of the warm-up; the last job of a soak
     *  over the same services shut them down, so it is not checked. */
    static void soakMeasure(boolean fresh, SoakJob body) throws Exception {
        int jobs = Integer.getInteger("hvdbridge.soak.jobs", 30), warm = Math.max(5, jobs / 5);
        String out = System.getProperty("hvdbridge.soak.out");
        List<String> lines = new ArrayList<>();
        int baseFds = 0, baseThreads = 0;
        long baseRss = 0;
        for (int job = 1; job <= jobs; job++) {
            long t0 = System.nanoTime();
            body.run(job, job == jobs);
            double secs = (System.nanoTime() - t0) / 1e9;
            int fds = count("/proc/self/fd"), threads = count("/proc/self/task");
            long rss = vmRssKib();
            lines.add(String.format("{\"job\": %d, \"fresh\": %b, \"seconds\": %.3f, \"jvm\": {\"fds\": %d, "
                                    + "\"threads\": %d, \"rss_kib\": %d}}", job, fresh, secs, fds, threads, rss));
            if (job == warm) {
                baseFds = fds;
                baseThreads = threads;
                baseRss = rss;
            } else if (job > warm && (fresh || job < jobs)) {
                check(fds <= baseFds + JVM_NOISE, "job " + job + ": " + fds + " descriptors, " + baseFds
                                                  + " after job " + warm);
                check(threads <= baseThreads + JVM_NOISE, "job " + job + ": " + threads + " threads, "
                                                          + baseThreads + " after job " + warm);
                check(rss - baseRss < 16 * 1024, "job " + job + ": VmRSS " + rss + " KiB, " + baseRss
                                                 + " after job " + warm);
            }
            if (job % 50 == 0 || job == jobs) System.out.println(lines.get(lines.size() - 1));
        }
        if (out != null) Files.write(Paths.get(out), lines, StandardCharsets.UTF_8);
    }

    /** VmRSS of a process in KiB, or -1 once it is gone. */
    static long vmRssKib(long pid) {
        try {
            for (String l : Files.readAllLines(Paths.get("/proc/" + pid + "/status"), StandardCharsets.UTF_8))
                if (l.startsWith("VmRSS:")) return Long.parseLong(l.substring(6).trim().split("\\s+")[0]);
        } catch (IOException | RuntimeException ignored) {
        }
        return -1;
    }

    /** Whether process pid is the keeper of the driver's short `mpirun --version` (which MPI
     *  is it?), which comes and goes before the job's own: hvd-keeper's arguments end in the
     *  command; a keeper in place (a forked JVM) has it as its child. */
    static boolean keepsVersionQuery(long pid) {
        if (hasArgument(pid, "--version")) return true;
        return ProcessHandle.of(pid).map(ph -> ph.children().anyMatch(ch -> hasArgument(ch.pid(), "--version")))
                .orElse(false);
    }

    static boolean hasArgument(long pid, String arg) {
        try {
            byte[] raw = Files.readAllBytes(Paths.get("/proc/" + pid + "/cmdline"));
            return java.util.Arrays.asList(new String(raw, StandardCharsets.UTF_8).split("\0")).contains(arg);
        } catch (IOException | RuntimeException gone) {
            return false;
        }
    }

    /** The children of this JVM: pid -> the program they run (/proc/PID/exe). */
    static java.util.Map<Long, String> children() {
        java.util.Map<Long, String> out = new java.util.TreeMap<>();
        try (DirectoryStream<Path> ds = Files.newDirectoryStream(Paths.get("/proc"), "[0-9]*")) {
            for (Path p : ds) {
                try {
                    String stat = new String(Files.readAllBytes(p.resolve("stat")), StandardCharsets.UTF_8);
                    String[] f = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
                    if (Long.parseLong(f[1]) != PID) continue;
                    out.put(Long.parseLong(p.getFileName().toString()), Files.readSymbolicLink(p.resolve("exe")).toString());
                } catch (IOException | RuntimeException gone) {
                }
            }
        } catch (IOException ignored) {
        }
        return out;
    }

    /**
     * The keepers of the commands this JVM runs (mpirun for its driver service, orted for its task
     * services) while a job runs, with 256 MiB of touched heap in the JVM: with hvd-keeper found
     * (HVD_BIN_DIR) each is a small program of its own; with HVD_KEEPER=none each is a forked copy
     * of the JVM, whose VmRSS counts the JVM's heap again (what YARN's process-tree check sums).
     */
    static void keeper() throws Exception {
        boolean inPlace = "none".equals(System.getenv("HVD_KEEPER"));
        byte[] ballast = new byte[256 << 20];
        java.util.Arrays.fill(ballast, (byte) 1);
        int n = 2;
        try (DriverService d = DriverService.start(n, EntryPoint.sharedObject(probeLib, "probe_entry", "sleep=3".getBytes()), null)) {
            List<TaskThread> tasks = startTasks(d, n, 2, null);
            AtomicReference<JobResult> jr = new AtomicReference<>();
            Thread job = new Thread(() -> jr.set(d.runJob(opts(null))));
            job.start();
            // The same n + 1 keepers in two samples in a row: a keeper that came and went (the
            // driver's `mpirun --version`) is not one of the job's.
            java.util.Map<Long, Long> keepers = new java.util.TreeMap<>(), before = keepers;
            String java = Files.readSymbolicLink(Paths.get("/proc/self/exe")).toString();
            long deadline = System.currentTimeMillis() + 30_000;
            while (job.isAlive() && System.currentTimeMillis() < deadline) {
                before = keepers;
                keepers = new java.util.TreeMap<>();
                for (java.util.Map.Entry<Long, String> c : children().entrySet()) {
                    boolean isKeeper = inPlace ? c.getValue().equals(java) : c.getValue().endsWith("/hvd-keeper");
                    isKeeper &= !keepsVersionQuery(c.getKey());
                    long rss = isKeeper ? vmRssKib(c.getKey()) : -1;
                    if (rss > 0) keepers.put(c.getKey(), rss);
                }
                if (keepers.size() == n + 1 && keepers.keySet().equals(before.keySet())) break;
                Thread.sleep(100);
            }
            long jvm = vmRssKib(PID);
            job.join(120_000);
            check(jr.get() != null && jr.get().succeeded(), "job: " + jr.get());
            joinTasks(tasks, 30_000);
            System.out.println("JVM VmRSS " + jvm + " KiB; keepers (" + (inPlace ? "in place" : "hvd-keeper") + ") VmRSS KiB: " + keepers.values());
            check(keepers.size() == n + 1, "keepers of mpirun and " + n + " orteds while the job ran: " + keepers);
            for (long rss : keepers.values())
                check(inPlace ? rss > 256 * 1024 : rss < 16 * 1024, "keeper VmRSS " + rss + " KiB, JVM " + jvm + " KiB");
        }
        check(ballast[ballast.length - 1] == 1, "ballast");
    }

    /** Each rank descends from this JVM (the embedded task service ran orted). */
    static void ancestry() throws Exception {
        int n = 3;
        String marker = UUID.randomUUID().toString();
        try (DriverService d = DriverService.start(n, EntryPoint.sharedObject(jvmProbe, "jvm_probe", null), null)) {
            List<TaskThread> tasks = startTasks(d, n, 2, marker);
            JobResult jr = d.runJob(opts(marker));
            check(jr.succeeded(), "job failed: " + jr.failureMessage());
            for (RankResult r : jr.ranks()) {
                System.out.println(r.text());
                check(r.text().contains(" jvm=" + PID + " "), "rank " + r.rank() + " is not under this JVM: " + r.text());
                check(r.text().endsWith(" marker=" + marker), "marker: " + r.text());
            }
            joinTasks(tasks, 30_000);
        }
        awaitNoMarked(marker, 10_000);
    }

    /**
     * A failing rank: its status and error text reach the driver and its task, in order; the
     * others, still running, are stopped by the job's end and not blamed although their rank
     * numbers are lower (those that report say they were stopped).
     */
    static void failingRank() throws Exception {
        int n = 4;
        try (DriverService d = DriverService.start(n, EntryPoint.sharedObject(probeLib, "probe_entry", "fail=3 sleep=60".getBytes()), null)) {
            List<TaskThread> tasks = startTasks(d, n, 2, null);
            JobResult jr = d.runJob(opts(null));
            System.out.println(jr);
            check(!jr.succeeded(), "the job should fail");
            check(jr.mpirunStatus() != 0, "mpirun status " + jr.mpirunStatus());
            RankResult r3 = jr.ranks()[3];
            check(r3.present() && r3.status() == 3 && r3.error().contains("rank 3 failed on purpose"), "rank 3: " + r3);
            check(jr.firstFailedRank() == r3, "first failed: " + jr.firstFailedRank());
            for (int i = 0; i < 3; i++) {
                RankResult r = jr.ranks()[i];
                check(!r.present() || r.stopped(), "rank " + i + " was only stopped: " + r);
            }
            check(jr.failureMessage().contains("rank 3 (task 3") && jr.failureMessage().contains("failed on purpose"),
                  "failure message: " + jr.failureMessage());
            HvdJobException e = expect(HvdJobException.class, "rank 3 failed on purpose", jr::throwIfFailed);
            check(e.result() == jr, "exception's result");
            joinTasks(tasks, 30_000);
            TaskThread t3 = tasks.get(3);
            check(t3.result != null && t3.result.status() == 3 && t3.result.error().contains("failed on purpose"),
                  "task 3's result: " + t3.result + " / " + t3.failure);
        }
    }

    /**
     * A job that runs past its timeout fails with that reason, not with what stopping it made
     * fail (hvd-rsh and the ranks get SIGTERM then).
     */
    static void timeout() throws Exception {
        int n = 2;
        try (DriverService d = DriverService.start(n, EntryPoint.sharedObject(probeLib, "probe_entry", "sleep=60".getBytes()), null)) {
            List<TaskThread> tasks = startTasks(d, n, 2, null);
            long t0 = System.nanoTime();
            JobResult jr = d.runJob(new JobOptions().binDir(bin).startTimeoutMs(60_000).timeoutSeconds(3));
            double took = (System.nanoTime() - t0) / 1e9;
            System.out.println(jr);
            check(jr.timedOut() && !jr.succeeded(), "the job should have timed out: " + jr);
            check(took < 40, String.format("the job ended %.1f s after its start, timeout 3 s", took));
            check("job failed: it ran past its timeout and mpirun was stopped".equals(jr.failureMessage()),
                  "failure message: " + jr.failureMessage());
            joinTasks(tasks, 30_000);
        }
    }

    /** A program as the entry point; its last stderr line is a failed rank's error text. */
    static void argv() throws Exception {
        int n = 2;
        String script = "if [ \"$HOROVOD_RANK\" = 1 ]; then echo \"rank $HOROVOD_RANK says boom\" >&2; exit 4; fi";
        try (DriverService d = DriverService.start(n, EntryPoint.command("sh", "-c", script), null)) {
            List<TaskThread> tasks = startTasks(d, n, 1, null);
            JobResult jr = d.runJob(opts(null));
            System.out.println(jr);
            RankResult r1 = jr.ranks()[1];
            check(r1.present() && r1.status() == 4 && r1.error() != null && r1.error().contains("rank 1 says boom"), "rank 1: " + r1);
            check(jr.failureMessage().contains("rank 1 says boom"), jr.failureMessage());
            joinTasks(tasks, 30_000);
        }
    }

    /** Closing the driver while mpirun runs stops the job; nothing of it is left. */
    static void closeRunning() throws Exception {
        int n = 4;
        String marker = UUID.randomUUID().toString();
        DriverService d = DriverService.start(n, EntryPoint.sharedObject(jvmProbe, "jvm_probe", "sleep=120".getBytes()), null);
        List<TaskThread> tasks = startTasks(d, n, 2, marker);
        AtomicReference<Object> outcome = new AtomicReference<>();
        Thread job = new Thread(() -> {
            try {
                outcome.set(d.runJob(opts(marker)));
            } catch (Throwable e) {
                outcome.set(e);
            }
        });
        job.start();
        /* Wait until the 4 ranks sleep (hvd-exec processes with the marker). */
        long deadline = System.currentTimeMillis() + 60_000;
        for (;;) {
            long ranks = markedProcesses(marker).stream().filter(s -> s.endsWith(":hvd-exec")).count();
            if (ranks == n) break;
            check(System.currentTimeMillis() < deadline, "the ranks did not start: " + markedProcesses(marker));
            Thread.sleep(100);
        }
        long t0 = System.nanoTime();
        Thread c1 = new Thread(d::close), c2 = new Thread(d::close);
        c1.start();
        c2.start();
        c1.join(60_000);
        c2.join(60_000);
        job.join(60_000);
        double s = (System.nanoTime() - t0) / 1e9;
        check(!job.isAlive() && !c1.isAlive() && !c2.isAlive(), "close did not stop the job");
        System.out.printf("closed in %.1f s; runJob gave %s%n", s, outcome.get());
        check(s < 30, "close took " + s + " s");
        joinTasks(tasks, 30_000);
        awaitNoMarked(marker, 15_000);
    }
}

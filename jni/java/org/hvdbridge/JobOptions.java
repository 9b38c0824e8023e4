package org.hvdbridge;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** How {@link DriverService#runJob} runs mpirun. Every setting is optional. */
public final class JobOptions {
    String binDir;
    final List<String> mpiArgs = new ArrayList<>();
    int timeoutSeconds;
    int startTimeoutMs = 120_000;
    boolean verbose;
    boolean keepTasks;
    final Map<String, String> env = new LinkedHashMap<>();

    /**
     * Where hvd-rsh and hvd-exec are, on this machine and (same path) on the executors.
     * Default: $HVD_BIN_DIR, else the system property {@code hvdbridge.bin.dir}.
     */
    public JobOptions binDir(String v) {
        binDir = v;
        return this;
    }

    /** Extra mpirun arguments, appended in order. */
    public JobOptions mpiArgs(String... v) {
        Text.requireStrings(v, "the mpirun arguments");
        mpiArgs.addAll(Arrays.asList(v));
        return this;
    }

    /** Stop mpirun after this many seconds; 0 (default): never. */
    public JobOptions timeoutSeconds(int v) {
        if (v < 0) throw new IllegalArgumentException("the timeout must be >= 0 s");
        timeoutSeconds = v;
        return this;
    }

    /** Time for the tasks to register and to agree on interfaces (default 120 s). */
    public JobOptions startTimeoutMs(int v) {
        if (v <= 0) throw new IllegalArgumentException("the start timeout must be > 0 ms");
        startTimeoutMs = v;
        return this;
    }

    /** Print the mpirun command line and progress to stderr. */
    public JobOptions verbose(boolean v) {
        verbose = v;
        return this;
    }

    /** Leave the task services up after this job, for another {@link DriverService#runJob}:
     *  over the same ones (start them with {@link TaskService.Config#elastic}(true)), or over
     *  new ones (the next runJob lets the others, whose one command is used up, go and waits
     *  for new task services at their indices). Default false: the job's end shuts them down. */
    public JobOptions keepTasks(boolean v) {
        keepTasks = v;
        return this;
    }

    /** Adds NAME=VALUE to mpirun's environment (and with {@code -x NAME}, the ranks'). */
    public JobOptions env(String name, String value) {
        Text.putVariable(env, name, value, "the mpirun environment");
        return this;
    }

    /* The bin dir to use: the option, $HVD_BIN_DIR, or -Dhvdbridge.bin.dir, made absolute
     * (mpirun's agents and the ranks run in other directories). */
    String resolveBinDir() {
        String d = binDir;
        if (d == null || d.isEmpty()) d = System.getenv("HVD_BIN_DIR");
        if (d == null || d.isEmpty()) d = System.getProperty("hvdbridge.bin.dir");
        if (d == null || d.isEmpty())
            throw new HvdException("where are hvd-rsh and hvd-exec? Set JobOptions.binDir, the environment "
                                   + "variable HVD_BIN_DIR or -Dhvdbridge.bin.dir", HvdException.INVALID);
        for (String exe : new String[] {"hvd-rsh", "hvd-exec"}) {
            java.io.File f = new java.io.File(d, exe);
            if (!f.canExecute())
                throw new HvdException(f + " is missing or not executable: the bin dir must hold hvd-rsh and "
                                       + "hvd-exec (the executors need hvd-exec at the same path)",
                                       HvdException.NOT_FOUND);
        }
        return new java.io.File(d).getAbsolutePath();
    }
}

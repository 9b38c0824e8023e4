package org.hvdbridge.spark;

import java.io.Serializable;

/** What one Spark task of a hvd-bridge job reports back through collect(). */
public final class TaskOutcome implements Serializable {
    private static final long serialVersionUID = 1L;

    /** The task (partition) index. */
    public final int index;
    /** The Spark executor that ran it. */
    public final String executorId;
    /** The host hash it registered. */
    public final String hostHash;
    /** The exit code of orted (the first task of a host) or of the first task's orted. */
    public final int exitCode;
    /** Why the task service ended early (the driver shut the job down), or null. */
    public final String ended;

    TaskOutcome(int index, String executorId, String hostHash, int exitCode, String ended) {
        this.index = index;
        this.executorId = executorId;
        this.hostHash = hostHash;
        this.exitCode = exitCode;
        this.ended = ended;
    }

    @Override
    public String toString() {
        return "task " + index + " on executor " + executorId + " (" + hostHash + "): exit code " + exitCode
            + (ended != null ? ", " + ended : "");
    }
}

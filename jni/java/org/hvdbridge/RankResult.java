package org.hvdbridge;

import java.io.Serializable;
import java.nio.charset.StandardCharsets;

/** One rank's outcome: its task, host hash, status, result bytes and error text. */
public final class RankResult implements Serializable {
    private static final long serialVersionUID = 1L;

    private final int rank;
    private final int taskIndex;
    private final String hostHash;
    private final boolean present;
    private final int status;
    private final byte[] data;
    private final String error;
    private final boolean stopped;

    public RankResult(int rank, int taskIndex, String hostHash, boolean present, int status,
                      byte[] data, String error) {
        this(rank, taskIndex, hostHash, present, status, data, error, false);
    }

    public RankResult(int rank, int taskIndex, String hostHash, boolean present, int status,
                      byte[] data, String error, boolean stopped) {
        this.stopped = stopped;
        this.rank = rank;
        this.taskIndex = taskIndex;
        this.hostHash = hostHash;
        this.present = present;
        this.status = status;
        this.data = data == null ? new byte[0] : data.clone();
        this.error = error;
    }

    /* Built by the native code; text arrives as bytes (UTF-8, possibly invalid). */
    RankResult(int rank, int taskIndex, byte[] hostHash, boolean present, int status,
               byte[] data, byte[] error, boolean stopped) {
        this(rank, taskIndex, hostHash == null ? null : new String(hostHash, StandardCharsets.UTF_8),
             present, status, data, error == null ? null : new String(error, StandardCharsets.UTF_8),
             stopped);
    }

    /** The rank (OMPI_COMM_WORLD_RANK), -1 when unknown. */
    public int rank() {
        return rank;
    }

    /** The task (Spark partition) the rank stands for, -1 when unknown. */
    public int taskIndex() {
        return taskIndex;
    }

    /** The host hash of the rank's task, or null when unknown. */
    public String hostHash() {
        return hostHash;
    }

    /** False when the rank never reported (it died, or never started). */
    public boolean present() {
        return present;
    }

    /** The entry point's exit status (0: success). */
    public int status() {
        return status;
    }

    /** True when the rank reported and its status is 0. */
    public boolean ok() {
        return present && status == 0;
    }

    /** The result bytes (a copy; empty when there are none). */
    public byte[] data() {
        return data.clone();
    }

    /** The result bytes as UTF-8 text. */
    public String text() {
        return new String(data, StandardCharsets.UTF_8);
    }

    /** The error text, or null. */
    public String error() {
        return error;
    }

    /**
     * True when orted stopped the rank as the job ended (SIGTERM from the job, not a failure of
     * its own: another part of the job failed first).
     */
    public boolean stopped() {
        return stopped;
    }

    /** One sentence saying how the rank failed, or null when it succeeded. */
    public String failure() {
        String where = "rank " + rank + " (task " + taskIndex
                       + (hostHash != null ? " on " + hostHash : "") + ")";
        if (!present) return where + " never reported a result (it died, or never started)";
        if (status == 0) return null;
        return where + " exited with status " + status
               + (error != null && !error.isEmpty() ? ": " + error : "");
    }

    @Override
    public String toString() {
        String f = failure();
        return f != null ? f : "rank " + rank + " (task " + taskIndex + "): ok, " + data.length
                                   + " result bytes";
    }
}

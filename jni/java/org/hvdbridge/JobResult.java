package org.hvdbridge;

import java.util.Arrays;

/** What {@link DriverService#runJob} returns: mpirun's exit status and every rank's outcome. */
public final class JobResult {
    private final int mpirunStatus;
    private final boolean timedOut;
    private final RankResult[] ranks;
    private final String failure;  /* the driver's sentence for what failed first, or null */
    private final int firstFailed; /* the rank that failed first on its own, or -1 */

    public JobResult(int mpirunStatus, boolean timedOut, RankResult[] ranks) {
        this(mpirunStatus, timedOut, ranks, null, -1);
    }

    /**
     * With the driver's judgement (hvd_driver_failure): {@code failure}, one sentence naming the
     * part of the job that failed first on its own (a rank, a task service, an agent, orted), or
     * null; {@code firstFailed}, the rank that failed first on its own, or -1.
     */
    public JobResult(int mpirunStatus, boolean timedOut, RankResult[] ranks, String failure,
                     int firstFailed) {
        this.mpirunStatus = mpirunStatus;
        this.timedOut = timedOut;
        this.ranks = ranks.clone();
        this.failure = failure;
        this.firstFailed = firstFailed;
    }

    /** mpirun's exit status (128+N when signal N killed it). */
    public int mpirunStatus() {
        return mpirunStatus;
    }

    /** True when the job ran past its timeout and mpirun was stopped. */
    public boolean timedOut() {
        return timedOut;
    }

    /** Every rank's outcome in rank order (a copy). */
    public RankResult[] ranks() {
        return ranks.clone();
    }

    /** True when mpirun exited 0 and every rank reported status 0. */
    public boolean succeeded() {
        return failureMessage() == null;
    }

    /**
     * The rank that failed first on its own (in the order the results reached the driver; not
     * one that orted only stopped because of it), else the first that failed at all or never
     * reported, or null.
     */
    public RankResult firstFailedRank() {
        for (RankResult r : ranks)
            if (r.rank() == firstFailed && firstFailed >= 0) return r;
        for (RankResult r : ranks)
            if (r.present() && r.status() != 0 && !r.stopped()) return r;
        for (RankResult r : ranks)
            if (r.present() && r.status() != 0) return r;
        for (RankResult r : ranks)
            if (!r.present()) return r;
        return null;
    }

    /**
     * One sentence naming what failed first on its own, as hvd-driver's last line does (a rank
     * with its task, host and error text; a task service, an agent or orted; a rank that never
     * reported; or mpirun), or null when the job succeeded.
     */
    public String failureMessage() {
        boolean ok = mpirunStatus == 0 && !timedOut;
        for (RankResult r : ranks)
            ok &= r.ok();
        if (ok) return null;
        if (failure != null) return "job failed: " + failure;
        // The driver's failure leaves out what the stop itself made fail (a rank killed by it).
        if (timedOut) return "job failed: it ran past its timeout and mpirun was stopped";
        RankResult r = firstFailedRank();
        if (r != null) return "job failed: " + r.failure();
        if (mpirunStatus != 0) return "job failed: mpirun exited with status " + mpirunStatus;
        return null;
    }

    /** Throws {@link HvdJobException} with {@link #failureMessage()} unless the job succeeded. */
    public JobResult throwIfFailed() {
        String m = failureMessage();
        if (m != null) throw new HvdJobException(m, this);
        return this;
    }

    @Override
    public String toString() {
        return "JobResult{mpirun=" + mpirunStatus + (timedOut ? ", timed out" : "") + ", ranks="
            + Arrays.toString(ranks) + "}";
    }
}

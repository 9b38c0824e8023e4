package org.hvdbridge;

import java.util.Arrays;

/** What {@link DriverService#runJob} returns: mpirun's exit status and every rank's outcome. */
public final class JobResult {
    private final int mpirunStatus;
    private final boolean timedOut;
    private final RankResult[] ranks;

    public JobResult(int mpirunStatus, boolean timedOut, RankResult[] ranks) {
        this.mpirunStatus = mpirunStatus;
        this.timedOut = timedOut;
        this.ranks = ranks.clone();
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

    /** The first rank that failed or never reported, or null. */
    public RankResult firstFailedRank() {
        for (RankResult r : ranks)
            if (r.present() && r.status() != 0) return r;
        for (RankResult r : ranks)
            if (!r.present()) return r;
        return null;
    }

    /**
     * One sentence naming what failed first (a rank with its task, host and error text; a
     * rank that never reported; or mpirun), or null when the job succeeded.
     */
    public String failureMessage() {
        RankResult r = firstFailedRank();
        if (r != null) return "job failed: " + r.failure();
        if (timedOut) return "job failed: it ran past its timeout and mpirun was stopped";
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

package org.hvdbridge;

/**
 * A job that ran but failed: a rank exited with a non-zero status, a rank never reported, or
 * mpirun itself failed. The message names the first failed rank, its task, its host and its
 * error text; {@link #result()} has every rank's outcome.
 */
public class HvdJobException extends HvdException {
    private static final long serialVersionUID = 1L;

    private final transient JobResult result;

    public HvdJobException(String message, JobResult result, Throwable cause) {
        super(message, cause);
        this.result = result;
    }

    public HvdJobException(String message, JobResult result) {
        this(message, result, null);
    }

    /** Every rank's outcome, or null when the job did not get as far as mpirun. */
    public JobResult result() {
        return result;
    }
}

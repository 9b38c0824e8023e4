package org.hvdbridge;

/*
 * The life of one native object seen from Java: calls acquire it (and fail with
 * IllegalStateException once it is closed), close waits until no call uses it any more and
 * then frees it exactly once. Concurrent closes all return after the object was freed.
 */
final class NativeHandle {
    private final String what;
    private long handle;
    private int users;
    private boolean closing;
    private boolean closed;

    NativeHandle(String what, long handle) {
        this.what = what;
        this.handle = handle;
    }

    synchronized long acquire() {
        if (closing || closed) throw new IllegalStateException(what + " is closed");
        users++;
        return handle;
    }

    synchronized void release() {
        if (--users == 0) notifyAll();
    }

    synchronized boolean isClosed() {
        return closing || closed;
    }

    /* Marks the object closing and returns its handle; 0 when another close owns it (this
     * one then waits until that close finished). */
    synchronized long beginClose() {
        if (closing || closed) {
            boolean interrupted = false;
            while (!closed) {
                try {
                    wait();
                } catch (InterruptedException e) {
                    interrupted = true;
                }
            }
            if (interrupted) Thread.currentThread().interrupt();
            return 0;
        }
        closing = true;
        return handle;
    }

    /* Waits until the calls that acquired the handle returned. Not interruptible: freeing
     * the object under a running call would crash the JVM. */
    synchronized void awaitIdle() {
        boolean interrupted = false;
        while (users > 0) {
            try {
                wait();
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        if (interrupted) Thread.currentThread().interrupt();
    }

    synchronized void finishClose() {
        closed = true;
        handle = 0;
        notifyAll();
    }
}

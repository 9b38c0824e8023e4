package org.hvdbridge;

import java.util.function.LongConsumer;
import java.util.function.LongFunction;

/*
 * The life of one native object seen from Java: calls acquire it (and fail with
 * IllegalStateException once it is closed), close waits until no call uses it any more and
 * then frees it exactly once. Concurrent closes all return after the object was freed.
 * DriverService and TaskService go through call, run, runIfOpen and close.
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

    private synchronized long acquire() {
        if (closing || closed) throw new IllegalStateException(what + " is closed");
        users++;
        return handle;
    }

    private synchronized void release() {
        if (--users == 0) notifyAll();
    }

    /* f(handle) with the handle acquired; IllegalStateException once closed. */
    <T> T call(LongFunction<T> f) {
        long h = acquire();
        try {
            return f.apply(h);
        } finally {
            release();
        }
    }

    /* f(handle) with the handle acquired; IllegalStateException once closed. */
    void run(LongConsumer f) {
        long h = acquire();
        try {
            f.accept(h);
        } finally {
            release();
        }
    }

    /* f(handle) with the handle acquired; nothing once closed (for abort: any thread, any time). */
    void runIfOpen(LongConsumer f) {
        long h;
        try {
            h = acquire();
        } catch (IllegalStateException closed) {
            return;
        }
        try {
            f.accept(h);
        } finally {
            release();
        }
    }

    /* The owner's close(): abort(handle) stops what the calls in progress wait for, then, once
     * they returned, free(handle) frees the object. Idempotent; concurrent closes all return
     * once it is freed. */
    void close(LongConsumer abort, LongConsumer free) {
        long h = beginClose();
        if (h == 0) return;
        try {
            abort.accept(h);
            awaitIdle();
        } finally {
            free.accept(h);
            finishClose();
        }
    }

    synchronized boolean isClosed() {
        return closing || closed;
    }

    /* Marks the object closing and returns its handle; 0 when another close owns it (this
     * one then waits until that close finished). */
    private synchronized long beginClose() {
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
    private synchronized void awaitIdle() {
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

    private synchronized void finishClose() {
        closed = true;
        handle = 0;
        notifyAll();
    }
}

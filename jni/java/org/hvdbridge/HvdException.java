package org.hvdbridge;

import java.nio.charset.StandardCharsets;

/**
 * A failure reported by the native hvd-bridge library: the message is the library's own
 * sentence (it names what failed and, where it helps, what to do); {@link #code()} is the
 * library's status code ({@code hvd_status} in include/hvd/error.h).
 */
public class HvdException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /** Well-formed request with an invalid argument. */
    public static final int INVALID = 3;
    /** The thing named does not exist. */
    public static final int NOT_FOUND = 4;
    /** Not allowed in the current state (for example after an abort). */
    public static final int STATE = 5;
    /** The library failed (out of memory, fork failed, ...). */
    public static final int INTERNAL = 6;
    /** The service is shutting down. */
    public static final int SHUTDOWN = 7;
    /** An operation ran out of time. */
    public static final int TIMEOUT = 8;
    /** A socket or file operation failed. */
    public static final int IO = 9;
    /** The handshake failed: wrong secret or wrong service. */
    public static final int AUTH = 10;

    private final int code;

    public HvdException(String message) {
        this(message, INTERNAL);
    }

    public HvdException(String message, int code) {
        super(message);
        this.code = code;
    }

    public HvdException(String message, Throwable cause) {
        super(message, cause);
        this.code = INTERNAL;
    }

    /* Thrown by the native code: the message arrives as bytes (UTF-8, possibly invalid). */
    HvdException(byte[] message, int code) {
        this(new String(message, StandardCharsets.UTF_8), code);
    }

    /** The native status code ({@code hvd_status}), {@link #INTERNAL} for Java-side failures. */
    public int code() {
        return code;
    }
}

package org.hvdbridge;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Paths;

/**
 * The entry point every rank runs (include/hvd/proto.h, hvd_code_msg): either a program with
 * its arguments (found in PATH on the executors), or a shared object shipped to the ranks as
 * bytes together with the name of its {@code hvd_entry_fn} (include/hvd/entry.h) and the
 * argument bytes handed to it.
 */
public final class EntryPoint {
    static final int ARGV = 1;
    static final int SHARED_OBJECT = 2;

    final int kind;
    final String[] argv;
    final byte[] object;
    final String symbol;
    final byte[] arg;

    private EntryPoint(int kind, String[] argv, byte[] object, String symbol, byte[] arg) {
        this.kind = kind;
        this.argv = argv;
        this.object = object;
        this.symbol = symbol;
        this.arg = arg;
    }

    /**
     * A program and its arguments; every rank runs it (found in PATH on the executor). A
     * program returns no result bytes ({@link RankResult#text()} is empty): its result is its
     * exit status and, on failure, an error text ending with the last line it wrote to stderr.
     * Result bytes come from a {@linkplain #sharedObject shared object}.
     */
    public static EntryPoint command(String... argv) {
        Text.requireStrings(argv, "the entry point command");
        if (argv.length == 0 || argv[0].isEmpty())
            throw new IllegalArgumentException("the entry point command is empty");
        return new EntryPoint(ARGV, argv.clone(), null, null, null);
    }

    /**
     * A shared object's bytes and the {@code hvd_entry_fn} to call in it; {@code arg} (may be
     * null: empty) reaches the function as {@code ctx->arg}.
     */
    public static EntryPoint sharedObject(byte[] object, String symbol, byte[] arg) {
        if (object == null) throw new NullPointerException("the shared object's bytes are null");
        if (object.length == 0) throw new IllegalArgumentException("the shared object is empty");
        Text.requireString(symbol, "the entry point symbol");
        if (symbol.isEmpty()) throw new IllegalArgumentException("the entry point symbol is empty");
        return new EntryPoint(SHARED_OBJECT, null, object.clone(), symbol,
                              arg == null ? new byte[0] : arg.clone());
    }

    /** Reads the shared object at {@code path}; see {@link #sharedObject(byte[], String, byte[])}. */
    public static EntryPoint sharedObject(String path, String symbol, byte[] arg) {
        Text.requireString(path, "the shared object's path");
        try {
            return sharedObject(Files.readAllBytes(Paths.get(path)), symbol, arg);
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read the entry point " + path, e);
        }
    }

    @Override
    public String toString() {
        return kind == ARGV ? "command " + String.join(" ", argv)
                            : "shared object (" + object.length + " bytes), symbol " + symbol;
    }
}

package org.hvdbridge;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.Locale;

/**
 * Loads libhvd_jni.so once per class loader, trying in order:
 * <ol>
 * <li>the file named by the system property {@code hvdbridge.library} or the environment
 *     variable {@code HVD_JNI_LIBRARY} (an absolute path);</li>
 * <li>the copy inside hvd-bridge.jar ({@code org/hvdbridge/native/linux-ARCH/libhvd_jni.so}),
 *     extracted to a private temporary file (under {@code hvdbridge.tmpdir}, else
 *     {@code java.io.tmpdir}) that is deleted as soon as it is loaded;</li>
 * <li>{@code System.loadLibrary("hvd_jni")}, i.e. java.library.path (on Linux this includes
 *     LD_LIBRARY_PATH, which Spark's {@code spark.executor.extraLibraryPath} extends).</li>
 * </ol>
 * The jar's copy comes before java.library.path because it is the one built with these
 * classes; the native side checks {@link #ABI} either way.
 */
public final class NativeLibrary {
    /** Version of the contract between these classes and libhvd_jni.so. */
    static final int ABI = 1;

    private static boolean loaded;
    private static String loadedFrom;
    private static UnsatisfiedLinkError failure;

    private NativeLibrary() {}

    /** Loads the library if needed; throws UnsatisfiedLinkError naming every place tried. */
    public static synchronized void load() {
        if (loaded) return;
        if (failure != null) throw failure;
        StringBuilder tried = new StringBuilder();
        try {
            String path = System.getProperty("hvdbridge.library");
            if (path == null || path.isEmpty()) path = System.getenv("HVD_JNI_LIBRARY");
            if (path != null && !path.isEmpty()) {
                loadFile(path, tried);
            } else if (!loadFromJar(tried)) {
                try {
                    System.loadLibrary("hvd_jni");
                    loadedFrom = "java.library.path";
                } catch (UnsatisfiedLinkError e) {
                    /* The loader's message already lists java.library.path's directories. */
                    tried.append("; ").append(e.getMessage());
                    throw new UnsatisfiedLinkError("cannot load libhvd_jni.so: tried " + tried
                                                   + " (set -Dhvdbridge.library or HVD_JNI_LIBRARY to its "
                                                   + "absolute path, or use the hvd-bridge.jar that holds it)");
                }
            }
            int abi = nativeAbi();
            if (abi != ABI)
                throw new UnsatisfiedLinkError("libhvd_jni.so from " + loadedFrom + " speaks ABI " + abi
                                               + ", these classes need " + ABI
                                               + ": use the library built with this hvd-bridge.jar");
            loaded = true;
        } catch (UnsatisfiedLinkError e) {
            failure = e;
            throw e;
        }
    }

    /** Where the library was loaded from (a path, "hvd-bridge.jar" or "java.library.path"). */
    public static synchronized String loadedFrom() {
        return loadedFrom;
    }

    private static void loadFile(String path, StringBuilder tried) {
        try {
            System.load(new File(path).getAbsolutePath());
            loadedFrom = path;
        } catch (UnsatisfiedLinkError e) {
            throw new UnsatisfiedLinkError("cannot load libhvd_jni.so from " + path
                                           + " (hvdbridge.library / HVD_JNI_LIBRARY): " + e.getMessage());
        }
    }

    private static String arch() {
        String a = System.getProperty("os.arch", "").toLowerCase(Locale.ROOT);
        if (a.equals("x86_64")) return "amd64";
        return a;
    }

    private static boolean loadFromJar(StringBuilder tried) {
        String os = System.getProperty("os.name", "").toLowerCase(Locale.ROOT);
        String resource = "native/" + (os.contains("linux") ? "linux" : os) + "-" + arch() + "/libhvd_jni.so";
        InputStream in = NativeLibrary.class.getResourceAsStream(resource);
        if (in == null) {
            tried.append("org/hvdbridge/").append(resource).append(" in the jar: not there");
            return false;
        }
        String dir = System.getProperty("hvdbridge.tmpdir");
        if (dir == null || dir.isEmpty()) dir = System.getProperty("java.io.tmpdir");
        Path tmp = null;
        try {
            try {
                tmp = Files.createTempFile(Paths.get(dir), "libhvd_jni", ".so");
                Files.copy(in, tmp, StandardCopyOption.REPLACE_EXISTING);
            } finally {
                in.close();
            }
            System.load(tmp.toAbsolutePath().toString());
            loadedFrom = "hvd-bridge.jar";
            return true;
        } catch (IOException e) {
            throw new UnsatisfiedLinkError("cannot extract libhvd_jni.so from hvd-bridge.jar to " + dir
                                           + ": " + e + " (set -Dhvdbridge.tmpdir to a writable, "
                                           + "executable directory)");
        } finally {
            /* Loaded (mapped) or not, the file is no longer needed. */
            if (tmp != null) {
                try {
                    Files.deleteIfExists(tmp);
                } catch (IOException ignored) {
                    tmp.toFile().deleteOnExit();
                }
            }
        }
    }

    private static native int nativeAbi();
}

package org.hvdbridge;

import java.nio.charset.StandardCharsets;
import java.util.Map;

/* Argument checks and the text form the native code takes: UTF-8 bytes without NUL. */
final class Text {
    private Text() {}

    static void requireString(String s, String what) {
        if (s == null) throw new NullPointerException(what + " is null");
        if (s.indexOf('\0') >= 0) throw new IllegalArgumentException(what + " contains a NUL character");
    }

    static void requireStrings(String[] v, String what) {
        if (v == null) throw new NullPointerException(what + " is null");
        for (int i = 0; i < v.length; i++)
            requireString(v[i], what + "[" + i + "]");
    }

    /* null stays null. */
    static byte[] bytes(String s, String what) {
        if (s == null) return null;
        requireString(s, what);
        return s.getBytes(StandardCharsets.UTF_8);
    }

    /* null stays null. */
    static byte[][] bytes(String[] v, String what) {
        if (v == null) return null;
        requireStrings(v, what);
        byte[][] out = new byte[v.length][];
        for (int i = 0; i < v.length; i++)
            out[i] = v[i].getBytes(StandardCharsets.UTF_8);
        return out;
    }

    /* An environment variable: the name non-empty and free of '=' and NUL. */
    static void checkVariable(String name, String value, String what) {
        if (name == null || value == null) throw new NullPointerException(what + ": null name or value");
        if (name.isEmpty() || name.indexOf('=') >= 0)
            throw new IllegalArgumentException(what + ": bad variable name '" + name + "'");
        requireString(name, what);
        requireString(value, what + ": the value of " + name);
    }

    /* Checks and puts one variable of an environment option (JobOptions, TaskService.Config). */
    static void putVariable(Map<String, String> env, String name, String value, String what) {
        checkVariable(name, value, what);
        env.put(name, value);
    }

    /* The interfaces option of the driver and the tasks may be null (nullMeans says what null
     * does) but not empty. */
    static void checkInterfaces(String[] v, String nullMeans) {
        if (v != null && v.length == 0)
            throw new IllegalArgumentException("the list of interfaces is empty: give one, or null " + nullMeans);
    }

    /* "NAME=VALUE" entries. */
    static byte[][] env(Map<String, String> env, String what) {
        if (env == null) return new byte[0][];
        String[] v = new String[env.size()];
        int i = 0;
        for (Map.Entry<String, String> e : env.entrySet()) {
            checkVariable(e.getKey(), e.getValue(), what);
            v[i++] = e.getKey() + "=" + e.getValue();
        }
        return bytes(v, what);
    }

    static String string(byte[] b) {
        return b == null ? null : new String(b, StandardCharsets.UTF_8);
    }

    static String[] strings(byte[][] v) {
        String[] out = new String[v.length];
        for (int i = 0; i < v.length; i++)
            out[i] = string(v[i]);
        return out;
    }
}

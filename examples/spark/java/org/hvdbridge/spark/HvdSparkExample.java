package org.hvdbridge.spark;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaSparkContext;
import org.hvdbridge.EntryPoint;
import org.hvdbridge.HvdJobException;
import org.hvdbridge.RankResult;

/**
 * A Spark application that runs an hvd-bridge job on the cluster's executors and prints each
 * rank's result (docs/spark.md):
 *
 * <pre>
 * spark-submit --jars hvd-bridge.jar --class org.hvdbridge.spark.HvdSparkExample \
 *     hvd-bridge-spark-example.jar --np 4 --entry libtrain.so:train [--entry-arg STR]
 * spark-submit ... hvd-bridge-spark-example.jar --np 4 -- hostname
 * </pre>
 *
 * Options: --np N (default: the default parallelism), --executors E (wait until E executors
 * are up before starting, so that the N barrier tasks find their slots), --entry LIB.so:SYM
 * and --entry-arg STR, or -- COMMAND ARGS; --host-hash-per-executor, --bin-dir DIR
 * (default $HVD_BIN_DIR), --start-timeout S, --timeout S, --task-env NAME=VALUE,
 * --mpi-arg ARG, --verbose.
 *
 * Prints "RESULT rank=R task=T host=H status=S text=..." per rank and exits 0, or prints
 * "hvd-bridge-spark: job failed: ..." and exits 1.
 */
public final class HvdSparkExample {
    public static void main(String[] args) throws Exception {
        int np = 0, executors = 0;
        String entry = null, entryArg = null;
        List<String> command = null;
        HorovodSpark.Options o = new HorovodSpark.Options();
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (a.equals("--")) {
                command = new ArrayList<>(Arrays.asList(args).subList(i + 1, args.length));
                break;
            }
            switch (a) {
            case "--np": np = Integer.parseInt(args[++i]); break;
            case "--executors": executors = Integer.parseInt(args[++i]); break;
            case "--entry": entry = args[++i]; break;
            case "--entry-arg": entryArg = args[++i]; break;
            case "--host-hash-per-executor": o.hostHashPerExecutor(true); break;
            case "--bin-dir": o.binDir(args[++i]); break;
            case "--start-timeout": o.startTimeoutMs(Integer.parseInt(args[++i]) * 1000); break;
            case "--timeout": o.timeoutSeconds(Integer.parseInt(args[++i])); break;
            case "--mpi-arg": o.mpiArgs(args[++i]); break;
            case "--verbose": o.verbose(true); break;
            case "--task-env": {
                String[] kv = args[++i].split("=", 2);
                if (kv.length != 2) usage("--task-env needs NAME=VALUE");
                o.taskEnv(kv[0], kv[1]);
                break;
            }
            default: usage("unknown argument " + a);
            }
        }
        if ((entry == null) == (command == null || command.isEmpty()))
            usage("give either --entry LIB.so:SYMBOL or -- COMMAND");
        EntryPoint ep;
        if (entry != null) {
            int colon = entry.lastIndexOf(':');
            if (colon <= 0 || colon == entry.length() - 1) usage("--entry must be LIB.so:SYMBOL");
            ep = EntryPoint.sharedObject(entry.substring(0, colon), entry.substring(colon + 1),
                                         entryArg == null ? null : entryArg.getBytes("UTF-8"));
        } else {
            ep = EntryPoint.command(command.toArray(new String[0]));
        }

        SparkConf conf = new SparkConf().setAppName("hvd-bridge example");
        int rc = 0;
        try (JavaSparkContext sc = new JavaSparkContext(conf)) {
            waitForExecutors(sc, executors, 120_000);
            long t0 = System.nanoTime();
            try {
                RankResult[] ranks = HorovodSpark.run(sc, ep, np, o);
                for (RankResult r : ranks)
                    System.out.println("RESULT rank=" + r.rank() + " task=" + r.taskIndex() + " host=" + r.hostHash()
                                       + " status=" + r.status() + " text=" + r.text());
                System.out.printf("hvd-bridge-spark: %d ranks succeeded in %.1f s%n", ranks.length,
                                  (System.nanoTime() - t0) / 1e9);
            } catch (HvdJobException e) {
                System.out.println("hvd-bridge-spark: " + e.getMessage());
                if (e.getCause() != null) System.out.println("hvd-bridge-spark: Spark said: " + e.getCause().getMessage());
                rc = 1;
            }
        }
        System.exit(rc);
    }

    /* Barrier tasks need all their slots at once: wait until the executors are up. */
    private static void waitForExecutors(JavaSparkContext sc, int want, long ms) throws InterruptedException {
        long deadline = System.currentTimeMillis() + ms;
        /* getExecutorInfos() includes the driver. */
        while (want > 0 && sc.sc().statusTracker().getExecutorInfos().length - 1 < want) {
            if (System.currentTimeMillis() > deadline)
                throw new IllegalStateException("only " + (sc.sc().statusTracker().getExecutorInfos().length - 1) + " of "
                                                + want + " executors came up in " + ms / 1000 + " s");
            Thread.sleep(100);
        }
    }

    private static void usage(String why) {
        System.err.println("hvd-bridge-spark: " + why + "\nusage: HvdSparkExample [--np N] [--executors E] "
                           + "[--host-hash-per-executor] [--bin-dir DIR] [--start-timeout S] [--timeout S] "
                           + "[--task-env NAME=VALUE] [--mpi-arg ARG] [--verbose] "
                           + "(--entry LIB.so:SYMBOL [--entry-arg STR] | -- COMMAND ARGS...)");
        System.exit(2);
    }
}

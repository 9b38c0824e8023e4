/* maxrss OUT_PREFIX -- COMMAND...: runs COMMAND, then appends its peak resident set size and
 * its peak proportional set size to OUT_PREFIX.<pid> ("<KiB> <Pss KiB> <command>"): ru_maxrss
 * from wait4, the largest of the command and of the descendants it waited for; Pss from
 * /proc/<pid>/smaps_rollup, sampled every 2 ms while the command runs (shared pages divided
 * among the processes that map them; 0 if the command ended before the first sample). Exits
 * with the command's status.
 *
 * compare.py wraps an agent or a rank bootstrap in it (never on a timed path). It is C, not
 * Python, because the kernel records the RSS of the image a process had before exec: a
 * wrapper that is itself 10 MiB would put a 10 MiB floor under every number. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The Pss line of /proc/<pid>/smaps_rollup in KiB, or -1. */
static long pss_kib(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%ld/smaps_rollup", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long v = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "Pss:", 4) == 0) {
            v = strtol(line + 4, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

int main(int argc, char **argv) {
    if (argc < 4 || strcmp(argv[2], "--") != 0) {
        fprintf(stderr, "usage: maxrss OUT_PREFIX -- COMMAND...\n");
        return 2;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("maxrss: fork");
        return 255;
    }
    if (pid == 0) {
        execvp(argv[3], argv + 3);
        fprintf(stderr, "maxrss: cannot run %s\n", argv[3]);
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    long pss = 0;
    struct timespec tick = {0, 2 * 1000 * 1000};
    for (;;) {
        pid_t r = wait4(pid, &status, WNOHANG, &ru);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) {
            perror("maxrss: wait4");
            return 255;
        }
        long v = pss_kib(pid);
        if (v > pss) pss = v;
        nanosleep(&tick, NULL);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s.%ld", argv[1], (long)getpid());
    FILE *f = fopen(path, "a");
    if (f) {
        fprintf(f, "%ld %ld %s\n", ru.ru_maxrss, pss, argv[3]);
        fclose(f);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

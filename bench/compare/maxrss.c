/* maxrss OUT_PREFIX -- COMMAND...: runs COMMAND, then appends its peak resident set size to
 * OUT_PREFIX.<pid> ("<KiB> <command>"): ru_maxrss from wait4, the largest of the command and
 * of the descendants it waited for. Exits with the command's status.
 *
 * compare.py wraps an agent or a rank bootstrap in it (never on a timed path). It is C, not
 * Python, because the kernel records the RSS of the image a process had before exec: a
 * wrapper that is itself 10 MiB would put a 10 MiB floor under every number. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

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
    if (wait4(pid, &status, 0, &ru) < 0) {
        perror("maxrss: wait4");
        return 255;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s.%ld", argv[1], (long)getpid());
    FILE *f = fopen(path, "a");
    if (f) {
        fprintf(f, "%ld %s\n", ru.ru_maxrss, argv[3]);
        fclose(f);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

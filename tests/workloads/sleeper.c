/*
 * sleeper: N sleeps of MS milliseconds each, through glibc's nanosleep()
 * (which glibc may implement with clock_nanosleep; the test asks strace
 * which one it is).
 *
 *   sleeper [N MS [OUT]]   (default 100 10)
 *
 * With OUT, it also times each call itself (CLOCK_MONOTONIC around the
 * call) and writes the N durations in ns to OUT, one per line: ground
 * truth that contains the tracer's sys_enter..sys_exit interval, so it
 * stays valid on a loaded machine where sleeps overshoot.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? strtol(argv[1], NULL, 10) : 100;
    long ms = argc > 2 ? strtol(argv[2], NULL, 10) : 10;
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
    long long *d = calloc(n > 0 ? n : 1, sizeof *d);

    if (!d)
        return 1;
    for (long i = 0; i < n; i++) {
        long long t0 = now_ns(); /* vDSO: no syscall */
        if (nanosleep(&ts, NULL) != 0)
            return 1;
        d[i] = now_ns() - t0;
    }
    if (argc > 3) {
        FILE *f = fopen(argv[3], "w");
        if (!f)
            return 2;
        for (long i = 0; i < n; i++)
            fprintf(f, "%lld\n", d[i]);
        if (fclose(f) != 0)
            return 2;
    }
    return 0;
}

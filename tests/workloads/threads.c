/*
 * threads: T threads, each making N raw getppid calls and, every 100th
 * call, one raw clock_nanosleep of 1 ms (so threads block, switch CPUs and
 * interleave with each other's fast syscalls).
 *
 *   threads [T N]   (default 4 20000)
 *
 * Per process: T*N getppid and T*(N/100) clock_nanosleep, each >= 1 ms.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static long n;

static void *run(void *arg)
{
    struct timespec ts = { .tv_sec = 0, .tv_nsec = 1000000 };
    (void)arg;
    for (long i = 0; i < n; i++) {
        syscall(SYS_getppid);
        if (i % 100 == 99)
            syscall(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, &ts, NULL);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    long t = argc > 1 ? strtol(argv[1], NULL, 10) : 4;
    n = argc > 2 ? strtol(argv[2], NULL, 10) : 20000;
    pthread_t th[64];

    if (t < 1 || t > 64)
        return 2;
    for (long i = 0; i < t; i++)
        if (pthread_create(&th[i], NULL, run, NULL) != 0)
            return 3;
    for (long i = 0; i < t; i++)
        pthread_join(th[i], NULL);
    return 0;
}

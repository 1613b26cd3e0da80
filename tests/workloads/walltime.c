/*
 * walltime: threads with known wall-time profiles, for the wall-time
 * accounting tests.
 *
 *   walltime three [MS]
 *       Three named threads, started together behind a barrier:
 *         "spinner" burns MS ms (default 500) of CPU time in spin_until(),
 *         "sleeper" sleeps MS ms in one clock_nanosleep,
 *         "reader"  blocks in read(2) on a pipe until the main thread
 *                   (comm "wt-main") writes one byte to it after MS ms.
 *   walltime pinned [T MS]
 *       T threads (default 4) named "pinned0".. pinned to the same CPU (the
 *       lowest one in the affinity mask) at nice -20, each spinning until MS
 *       ms (default 1000) after a common start barrier.
 *   walltime getppid [N]
 *       One thread "getppider" making N raw getppid calls (default 200000).
 *
 * Build with -O1 -g -fno-omit-frame-pointer: spin_until() is the leaf where
 * the CPU samples of the spinning threads land.
 * Each thread prints "thread <comm> tid <tid> cpu_ns <its CPU time>" on
 * stderr as it ends (stdout stays free for the tracer's report).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static pthread_barrier_t start_barrier;
static long duration_ms = 500;
static int pipe_fds[2];
static volatile uint64_t sink;

static uint64_t clock_ns(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t now_ns(void)
{
    return clock_ns(CLOCK_MONOTONIC);
}

/* Spins until clock `clk` reaches `deadline_ns`; the clock is read once per
 * 2^20 iterations (about a millisecond) so that nearly every CPU sample of
 * the thread lands in this function. */
__attribute__((noinline)) uint64_t spin_until(clockid_t clk, uint64_t deadline_ns)
{
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (;;) {
        for (uint32_t i = 0; i < (1u << 20); i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        sink = x;
        if (clock_ns(clk) >= deadline_ns)
            return x;
    }
}

/* Ground truth for the thread's own CPU time, printed at its end. */
static void report_tid(const char *name)
{
    fprintf(stderr, "thread %s tid %ld cpu_ns %llu\n", name,
            (long)syscall(SYS_gettid),
            (unsigned long long)clock_ns(CLOCK_THREAD_CPUTIME_ID));
}

static void *spinner(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "spinner");
    pthread_barrier_wait(&start_barrier);
    /* MS ms of CPU time, however busy the machine is. */
    spin_until(CLOCK_THREAD_CPUTIME_ID,
               clock_ns(CLOCK_THREAD_CPUTIME_ID) + (uint64_t)duration_ms * 1000000ull);
    report_tid("spinner");
    return NULL;
}

static void *sleeper(void *arg)
{
    struct timespec ts = { .tv_sec = duration_ms / 1000,
                           .tv_nsec = (duration_ms % 1000) * 1000000l };
    (void)arg;
    pthread_setname_np(pthread_self(), "sleeper");
    pthread_barrier_wait(&start_barrier);
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR)
        ;
    report_tid("sleeper");
    return NULL;
}

static void *reader(void *arg)
{
    char c;
    (void)arg;
    pthread_setname_np(pthread_self(), "reader");
    pthread_barrier_wait(&start_barrier);
    while (read(pipe_fds[0], &c, 1) < 0 && errno == EINTR)
        ;
    report_tid("reader");
    return NULL;
}

static int three(void)
{
    pthread_t th[3];
    void *(*fn[3])(void *) = { spinner, sleeper, reader };
    struct timespec ts = { .tv_sec = duration_ms / 1000,
                           .tv_nsec = (duration_ms % 1000) * 1000000l };

    if (pipe(pipe_fds) != 0)
        return 3;
    pthread_barrier_init(&start_barrier, NULL, 4);
    for (int i = 0; i < 3; i++)
        if (pthread_create(&th[i], NULL, fn[i], NULL) != 0)
            return 3;
    pthread_barrier_wait(&start_barrier);
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR)
        ;
    if (write(pipe_fds[1], "x", 1) != 1)
        return 4;
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    report_tid("wt-main");
    return 0;
}

static int pin_cpu = -1;

static void *pinned(void *arg)
{
    long i = (long)arg;
    char name[16];
    cpu_set_t set;

    snprintf(name, sizeof name, "pinned%ld", i);
    pthread_setname_np(pthread_self(), name);
    CPU_ZERO(&set);
    CPU_SET(pin_cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
        fprintf(stderr, "pthread_setaffinity_np failed\n");
        exit(5);
    }
    /* Nice -20 (root): other runnable tasks on that CPU (a build, say) then
     * get about 0.3% of it, so the four threads share it among themselves. */
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), -20) != 0)
        fprintf(stderr, "setpriority(-20) failed: %s\n", strerror(errno));
    pthread_barrier_wait(&start_barrier);
    /* The deadline is taken once, right after the barrier, by each thread;
     * they leave the barrier within a few scheduler ticks of each other. */
    spin_until(CLOCK_MONOTONIC, now_ns() + (uint64_t)duration_ms * 1000000ull);
    report_tid(name);
    return NULL;
}

static int pinned_threads(long t)
{
    pthread_t th[64];
    cpu_set_t set;

    if (t < 1 || t > 64)
        return 2;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return 3;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) {
            pin_cpu = c;
            break;
        }
    if (pin_cpu < 0)
        return 3;
    pthread_barrier_init(&start_barrier, NULL, (unsigned)t);
    for (long i = 0; i < t; i++)
        if (pthread_create(&th[i], NULL, pinned, (void *)i) != 0)
            return 3;
    for (long i = 0; i < t; i++)
        pthread_join(th[i], NULL);
    fprintf(stderr, "cpu %d\n", pin_cpu);
    return 0;
}

static long getppid_n;

static void *getppider(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "getppider");
    for (long i = 0; i < getppid_n; i++)
        syscall(SYS_getppid);
    report_tid("getppider");
    return NULL;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "three";

    pthread_setname_np(pthread_self(), "wt-main");
    if (strcmp(mode, "three") == 0) {
        if (argc > 2)
            duration_ms = strtol(argv[2], NULL, 10);
        return three();
    }
    if (strcmp(mode, "pinned") == 0) {
        long t = argc > 2 ? strtol(argv[2], NULL, 10) : 4;
        duration_ms = argc > 3 ? strtol(argv[3], NULL, 10) : 1000;
        return pinned_threads(t);
    }
    if (strcmp(mode, "getppid") == 0) {
        pthread_t th;
        getppid_n = argc > 2 ? strtol(argv[2], NULL, 10) : 200000;
        if (pthread_create(&th, NULL, getppider, NULL) != 0)
            return 3;
        pthread_join(th, NULL);
        return 0;
    }
    fprintf(stderr, "usage: walltime three [MS] | pinned [T MS] | getppid [N]\n");
    return 2;
}

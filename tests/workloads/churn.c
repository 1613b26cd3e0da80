/*
 * churn: thread and process churn, for the churn test and `cargo xtask
 * soak`. Two long-lived threads ("steady-cpu" spins, "steady-io" writes to
 * /dev/null and sleeps) run beside a loop that starts BATCH short threads
 * ("churner": a few getppid calls, a short spin, a 100 us sleep), joins
 * them, and every FORK_EVERY batches forks a child that makes a few
 * syscalls and exits. RATE > 0 paces the loop at about RATE threads per
 * second (0: as fast as it goes). Runs for MS milliseconds, then prints
 *
 *   churn threads <started> processes <forked> ms <elapsed>
 *
 * on stderr.
 *
 *   churn [MS BATCH FORK_EVERY RATE]   (default 3000 8 10 0)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile int stop;

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void spin_us(long us)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do {
        clock_gettime(CLOCK_MONOTONIC, &b);
    } while ((b.tv_sec - a.tv_sec) * 1000000 + (b.tv_nsec - a.tv_nsec) / 1000 < us);
}

static void *churner(void *arg)
{
    struct timespec ts = { .tv_sec = 0, .tv_nsec = 100000 };
    (void)arg;
    prctl(PR_SET_NAME, "churner");
    for (int i = 0; i < 5; i++)
        syscall(SYS_getppid);
    spin_us(50);
    syscall(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, &ts, NULL);
    return NULL;
}

static void *steady_cpu(void *arg)
{
    (void)arg;
    prctl(PR_SET_NAME, "steady-cpu");
    while (!stop)
        spin_us(1000);
    return NULL;
}

static void *steady_io(void *arg)
{
    struct timespec ts = { .tv_sec = 0, .tv_nsec = 2000000 };
    char buf[64];
    FILE *f = fopen("/dev/null", "w");
    (void)arg;
    prctl(PR_SET_NAME, "steady-io");
    memset(buf, 'x', sizeof buf);
    while (!stop) {
        if (f)
            fwrite(buf, 1, sizeof buf, f), fflush(f);
        syscall(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, &ts, NULL);
    }
    if (f)
        fclose(f);
    return NULL;
}

int main(int argc, char **argv)
{
    long ms = argc > 1 ? strtol(argv[1], NULL, 10) : 3000;
    long batch = argc > 2 ? strtol(argv[2], NULL, 10) : 8;
    long fork_every = argc > 3 ? strtol(argv[3], NULL, 10) : 10;
    long rate = argc > 4 ? strtol(argv[4], NULL, 10) : 0;
    pthread_t th[64], cpu, io;
    long threads = 0, procs = 0, batches = 0;
    long t0 = now_ms();

    if (batch < 1 || batch > 64 || ms < 0)
        return 2;
    prctl(PR_SET_NAME, "churn-main");
    if (pthread_create(&cpu, NULL, steady_cpu, NULL) != 0 || pthread_create(&io, NULL, steady_io, NULL) != 0)
        return 3;
    while (now_ms() - t0 < ms) {
        long started = 0;
        for (long i = 0; i < batch; i++)
            if (pthread_create(&th[started], NULL, churner, NULL) == 0)
                started++;
        for (long i = 0; i < started; i++)
            pthread_join(th[i], NULL);
        threads += started;
        if (fork_every > 0 && ++batches % fork_every == 0) {
            pid_t c = fork();
            if (c == 0) {
                for (int i = 0; i < 5; i++)
                    syscall(SYS_getppid);
                _exit(0);
            }
            if (c > 0) {
                waitpid(c, NULL, 0);
                procs++;
            }
        }
        if (rate > 0) {
            /* Ahead of the pace: sleep until the threads started are due. */
            long due_ms = threads * 1000 / rate;
            long ahead = due_ms - (now_ms() - t0);
            if (ahead > 0) {
                struct timespec ts = { .tv_sec = ahead / 1000, .tv_nsec = (ahead % 1000) * 1000000 };
                nanosleep(&ts, NULL);
            }
        }
    }
    stop = 1;
    pthread_join(cpu, NULL);
    pthread_join(io, NULL);
    fprintf(stderr, "churn threads %ld processes %ld ms %ld\n", threads, procs, now_ms() - t0);
    return 0;
}

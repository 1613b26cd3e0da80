/*
 * hostile_names: names its main thread MAIN_NAME (prctl PR_SET_NAME) and a
 * second thread WORKER_NAME (written to /proc/self/task/TID/comm), prints
 * "ready PID", then both make a getppid and sleep a millisecond, forever.
 * Its argv (all of it, hostile strings included) is its command line. For
 * the tests that a target's names cannot drive the reader's terminal.
 *
 *   hostile_names MAIN_NAME WORKER_NAME [ARGS...]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static const char *worker_name = "worker";
static volatile int named;

static void tick(void)
{
    struct timespec ts = { 0, 1000000L };
    syscall(SYS_getppid);
    nanosleep(&ts, NULL);
}

static void *worker(void *arg)
{
    char path[64];
    (void)arg;
    snprintf(path, sizeof path, "/proc/self/task/%ld/comm", (long)syscall(SYS_gettid));
    int fd = open(path, O_WRONLY);
    if (fd >= 0) {
        if (write(fd, worker_name, strlen(worker_name)) < 0)
            perror("comm");
        close(fd);
    }
    named = 1;
    for (;;)
        tick();
    return NULL;
}

int main(int argc, char **argv)
{
    pthread_t t;

    if (argc < 3) {
        fprintf(stderr, "usage: hostile_names MAIN_NAME WORKER_NAME [ARGS...]\n");
        return 2;
    }
    prctl(PR_SET_NAME, argv[1], 0, 0, 0);
    worker_name = argv[2];
    pthread_create(&t, NULL, worker, NULL);
    while (!named)
        tick();
    printf("ready %d\n", getpid());
    fflush(stdout);
    for (;;)
        tick();
}

/*
 * getppid_n: exactly N raw getppid calls, then lingers LINGER_MS
 * milliseconds (so a tracer can read /proc/PID/exe and cmdline before it
 * exits) and exits 0.
 *
 *   getppid_n N [LINGER_MS]
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    long n = argc > 1 ? strtol(argv[1], NULL, 10) : 100;
    long ms = argc > 2 ? strtol(argv[2], NULL, 10) : 0;

    for (long i = 0; i < n; i++)
        syscall(SYS_getppid);
    if (ms > 0) {
        struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
    }
    return 0;
}

/*
 * waiter: a long-running process to attach to. It prints "ready", then for
 * every byte read from stdin makes exactly N getppid calls and prints
 * "done". It exits 0 when stdin reaches EOF.
 *
 *   waiter [N]   (default 250)
 *
 * Between triggers it sits blocked in read(0), so an attached tracer sees
 * exactly N getppid per trigger and nothing else but the read/write pairs.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    long n = argc > 1 ? strtol(argv[1], NULL, 10) : 250;
    char c;

    if (syscall(SYS_write, 1, "ready\n", 6) != 6)
        return 2;
    for (;;) {
        long r = syscall(SYS_read, 0, &c, 1);
        if (r == 0)
            return 0;
        if (r < 0)
            return 3;
        for (long i = 0; i < n; i++)
            syscall(SYS_getppid);
        if (syscall(SYS_write, 1, "done\n", 5) != 5)
            return 4;
    }
}

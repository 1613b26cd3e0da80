/*
 * syscall_counts: makes an exactly known number of syscalls, so the counts
 * infertrace reports can be checked against ground truth.
 *
 *   syscall_counts [GETPPID READS WRITES FAILED_OPENS]   (default 1000 700 300 5)
 *
 * Every call goes through raw syscall(2), so libc caching or wrappers cannot
 * add or remove calls. Built with -static so the dynamic loader adds no
 * read/openat of its own. Besides the failing ones, it makes exactly two
 * openat calls (/dev/zero and /dev/null), both successful.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static long arg(int argc, char **argv, int i, long def)
{
    return i < argc ? strtol(argv[i], NULL, 10) : def;
}

int main(int argc, char **argv)
{
    long n_getppid = arg(argc, argv, 1, 1000);
    long n_read = arg(argc, argv, 2, 700);
    long n_write = arg(argc, argv, 3, 300);
    long n_enoent = arg(argc, argv, 4, 5);
    char buf[64] = {0};

    for (long i = 0; i < n_getppid; i++)
        syscall(SYS_getppid);

    long zero = syscall(SYS_openat, AT_FDCWD, "/dev/zero", O_RDONLY | O_CLOEXEC);
    long null = syscall(SYS_openat, AT_FDCWD, "/dev/null", O_WRONLY | O_CLOEXEC);
    if (zero < 0 || null < 0)
        return 2;

    for (long i = 0; i < n_read; i++)
        if (syscall(SYS_read, zero, buf, sizeof buf) != sizeof buf)
            return 3;
    for (long i = 0; i < n_write; i++)
        if (syscall(SYS_write, null, buf, sizeof buf) != sizeof buf)
            return 4;
    /* Each of these fails with ENOENT. */
    for (long i = 0; i < n_enoent; i++)
        if (syscall(SYS_openat, AT_FDCWD, "/nonexistent-infertrace-e2e/file", O_RDONLY) != -1)
            return 5;
    return 0;
}

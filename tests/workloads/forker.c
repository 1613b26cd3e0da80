/*
 * forker: forks a child that execs PROG ARGS..., waits for it, then exits
 * with EXIT_CODE (whatever the child did; 99 if fork/exec/wait failed).
 *
 *   forker EXIT_CODE PROG [ARGS...]
 *
 * Used to check that a launched command's fork+exec children are followed.
 */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 3)
        return 99;
    int code = atoi(argv[1]);
    pid_t child = fork();
    if (child < 0)
        return 99;
    if (child == 0) {
        execv(argv[2], &argv[2]);
        _exit(98);
    }
    int status;
    if (waitpid(child, &status, 0) != child)
        return 99;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 99;
    return code;
}

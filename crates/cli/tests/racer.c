/*
 * racer DIR LINK: swaps a directory and a symlink in the same parent
 * directory with renameat2(RENAME_EXCHANGE), forever, as fast as it can.
 * Where the kernel refuses RENAME_EXCHANGE (gVisor's does, EINVAL), it
 * swaps them with three renames through a third name, DIR.swap: DIR is
 * then now a directory, now a symlink, now missing. Two of those three
 * states fail any operation on DIR, so after each swap back the racer
 * holds DIR a directory for as long as that swap took: operations still
 * meet every state, and enough of them meet the directory to show the
 * benign result.
 *
 * Used by crates/cli/tests/race.rs as the hostile agent: while the daemon
 * (host root) reads or writes the task's writable layer, the name DIR is
 * now a real directory, now a symlink to a host path, hoping the daemon
 * checks one and then follows the other.
 *
 * Built static (gcc -static -O2 -o racer racer.c) so it runs in any
 * sandbox image. Exits 2 on bad arguments, 1 when the very first exchange
 * fails (so a broken setup is reported, not silently spun on).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

static long exchange(const char *a, const char *b)
{
    return syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE);
}

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int made_aside;

/* a -> spare, b -> a, spare -> b. While a is missing, a daemon making the
 * missing directories of a path through it (as mkdir -p does) may make a
 * new directory a: that one is moved aside to a.made.N and the swap goes
 * on, so the racer never stalls on it. */
static int rename3(const char *a, const char *b, const char *spare)
{
    if (rename(a, spare) != 0)
        return -1;
    if (rename(b, a) != 0) {
        char aside[4200];
        snprintf(aside, sizeof aside, "%s.made.%d", a, ++made_aside);
        if (rename(a, aside) != 0 || rename(b, a) != 0)
            return -1;
    }
    return rename(spare, b);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: racer DIR LINK\n");
        return 2;
    }
    if (exchange(argv[1], argv[2]) == 0) {
        for (;;)
            exchange(argv[1], argv[2]);
    }
    if (errno != EINVAL && errno != ENOSYS) {
        fprintf(stderr, "racer: renameat2(%s, %s, RENAME_EXCHANGE): %s\n", argv[1], argv[2], strerror(errno));
        return 1;
    }
    char spare[4096];
    if (snprintf(spare, sizeof spare, "%s.swap", argv[1]) >= (int)sizeof spare)
        return 2;
    if (rename3(argv[1], argv[2], spare) != 0) {
        fprintf(stderr, "racer: three renames of %s and %s: %s\n", argv[1], argv[2], strerror(errno));
        return 1;
    }
    /* DIR is the symlink now. */
    struct stat st;
    for (;;) {
        long long start = now_ns();
        rename3(argv[1], argv[2], spare); /* DIR a directory again */
        long long swap = now_ns() - start;
        long long until = now_ns() + swap;
        while (now_ns() < until)
            lstat(argv[1], &st);
        rename3(argv[1], argv[2], spare); /* DIR the symlink */
    }
}

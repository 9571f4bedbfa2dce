/* SPDX-License-Identifier: MIT */
/*
 * bench.h - what the decoder's benchmarks share (bench/lm_speed.c,
 * bench/prefill_speed.c): the clock they time with and how they stop.
 * Include after defining BENCH_NAME, the program's name for its messages.
 */
#ifndef KVE_BENCH_H
#define KVE_BENCH_H

#include <kvevict.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* CPU time of this thread: on a shared machine, time spent waiting for a
 * core is not the decoder's. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* what failed and the library's last error, then exit 1 */
static void die(const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", BENCH_NAME, what, kve_last_error());
    exit(1);
}

#endif

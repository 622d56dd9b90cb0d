/*
 * bench_common.h -- what the benchmark programs share: the clock, the median of samples,
 * the status check that ends the program, interleaved measurement rounds, the load average,
 * two halves of a job on two threads, and reading the "key value" lines a peer program prints.
 * Static inline, so each program stays one file and links nothing more.
 *
 * A program defines BENCH_NAME (its name, for messages) before including this header:
 *
 *     #define BENCH_NAME "bench_jit"
 *     #include "bench_common.h"
 */
#ifndef NABLA_BENCH_COMMON_H
#define NABLA_BENCH_COMMON_H

#include <nabla/nabla.h>

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef BENCH_NAME
#error "define BENCH_NAME (the program's name) before including bench_common.h"
#endif

/* fn(first) on this thread while fn(second) runs on a new one, both done on return (the
 * second after the first, here, if no thread can be made): a 2-thread run of a job cut in
 * two, for in-process peers without threads of their own. */
static inline void bench_two_halves(void *(*fn)(void *), void *first, void *second) {
    pthread_t th;
    bool threaded = pthread_create(&th, NULL, fn, second) == 0;
    fn(first);
    if (threaded) {
        pthread_join(th, NULL);
    } else {
        fn(second);
    }
}

/* Seconds on the monotonic clock. */
static inline double bench_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int bench_cmp_f64(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (n >= 1); sorts v in place. */
static inline double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_f64);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* e must return NB_OK; otherwise print the expression and the context's message, exit 1. */
#define BENCH_CHECK(ctx, e)                                                                        \
    do {                                                                                           \
        nb_status bench_s_ = (e);                                                                  \
        if (bench_s_ != NB_OK) {                                                                   \
            fprintf(stderr, BENCH_NAME ": %s: %s\n", #e, nb_ctx_errmsg(ctx));                      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* ---- interleaved measurement ------------------------------------------------------------ */

enum { BENCH_MAX_ROUNDS = 21 };

/* One thing measured: sample() takes one sample (in the item's unit); s holds one sample per
 * round. */
typedef struct bench_item {
    double (*sample)(void *ud);
    void *ud;
    double s[BENCH_MAX_ROUNDS];
} bench_item;

/* One discarded warm-up round, then `rounds` rounds (at most BENCH_MAX_ROUNDS) of one sample
 * per item, the order rotated each round so that no item always runs first or after the same
 * neighbour. */
static inline void bench_rounds(bench_item *items, int n, int rounds) {
    if (rounds > BENCH_MAX_ROUNDS) {
        rounds = BENCH_MAX_ROUNDS;
    }
    for (int k = 0; k < n; k++) {
        (void)items[k].sample(items[k].ud);
    }
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < n; k++) {
            bench_item *it = &items[(k + r) % n];
            it->s[r] = it->sample(it->ud);
        }
    }
}

/* ---- the machine and the peers ---------------------------------------------------------- */

/* The 1-minute load average from /proc/loadavg as "%.2f", or "?". */
static inline void bench_load_average(char *buf, size_t cap) {
    snprintf(buf, cap, "?");
    FILE *f = fopen("/proc/loadavg", "r");
    if (f != NULL) {
        double a = 0;
        if (fscanf(f, "%lf", &a) == 1) {
            snprintf(buf, cap, "%.2f", a);
        }
        fclose(f);
    }
}

/* Run cmd (through popen, from the repository root) and read its "key value" lines:
 * vals[i] = the value of keys[i] (left as it was, NAN, when absent); version = the value of
 * version_key (left as it was when absent). */
static inline void bench_peer_read(const char *cmd, int n, const char *const *keys, double *vals,
                                   const char *version_key, char *version, size_t vcap) {
    FILE *p = popen(cmd, "r");
    if (p == NULL) {
        return;
    }
    char line[256];
    while (fgets(line, sizeof line, p) != NULL) {
        char k[64], v[64];
        if (sscanf(line, "%63s %63s", k, v) != 2) {
            continue;
        }
        if (strcmp(k, version_key) == 0) {
            snprintf(version, vcap, "%s", v);
        }
        for (int i = 0; i < n; i++) {
            if (strcmp(k, keys[i]) == 0) {
                vals[i] = atof(v);
            }
        }
    }
    pclose(p);
}

#endif

/*
 * programs_main.c -- fuzz_programs_driver: the random-program checker (programs.h) without
 * libFuzzer, for ctest and for reproducing failures.
 *
 *   fuzz_programs_driver [--seed S] [--count N] [--start I]  N programs from seed S
 *   fuzz_programs_driver --replay FILE...                    the inputs in the files
 *   fuzz_programs_driver --minimize FILE                     the smallest failing program
 *   fuzz_programs_driver --write-seeds DIR                   the handwritten seed corpus
 *
 * Program i of a seeded run is nbp_random_input(S, i); with no arguments the driver runs
 * NBP_DRIVER_COUNT programs (default 2000) from seed NBP_DRIVER_SEED (default 1), which
 * is what ctest runs. A broken rule prints the program and writes the input to
 * fuzz_programs-failure-S-I.bin in the current directory (replay with --replay). -v
 * prints a line per 1000 programs; NABLA_FUZZ_DEBUG=1 prints every program.
 */
#include "programs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef NBP_DRIVER_COUNT
#define NBP_DRIVER_COUNT 2000
#endif
#ifndef NBP_DRIVER_SEED
#define NBP_DRIVER_SEED 1
#endif

static uint64_t g_seed, g_index;
static bool g_seeded;

static void save_failure(const uint8_t *data, size_t size) {
    if (!g_seeded) {
        return;
    }
    char name[128];
    snprintf(name, sizeof name, "fuzz_programs-failure-%llu-%llu.bin", (unsigned long long)g_seed,
             (unsigned long long)g_index);
    FILE *f = fopen(name, "wb");
    if (f != NULL) {
        fwrite(data, 1, size, f);
        fclose(f);
        fprintf(stderr, "==nabla-fuzz== input written to %s (replay: --replay %s)\n", name, name);
    }
}

static int usage(void) {
    fprintf(stderr, "usage: fuzz_programs_driver [--seed S] [--count N] [--start I] [-v]\n"
                    "       fuzz_programs_driver --replay FILE...\n"
                    "       fuzz_programs_driver --minimize FILE\n"
                    "       fuzz_programs_driver --write-seeds DIR\n");
    return 2;
}

static int replay(int n, char **files) {
    for (int i = 0; i < n; i++) {
        FILE *f = fopen(files[i], "rb");
        if (f == NULL) {
            fprintf(stderr, "fuzz_programs_driver: cannot open %s\n", files[i]);
            return 1;
        }
        static uint8_t buf[1 << 16];
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        fprintf(stderr, "== %s (%zu bytes)\n", files[i], len);
        nbp_run(buf, len);
    }
    return 0;
}

int main(int argc, char **argv) {
    uint64_t seed = NBP_DRIVER_SEED, count = NBP_DRIVER_COUNT, start = 0;
    bool verbose = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--write-seeds") == 0 && i + 1 < argc) {
            if (nbp_init() != 0) {
                return 1;
            }
            int n = nbp_write_seeds(argv[i + 1]);
            nbp_fini();
            if (n < 0) {
                return 1;
            }
            printf("%d seeds written to %s\n", n, argv[i + 1]);
            return 0;
        }
        if (strcmp(argv[i], "--minimize") == 0 && i + 1 < argc) {
            FILE *f = fopen(argv[i + 1], "rb");
            if (f == NULL) {
                fprintf(stderr, "fuzz_programs_driver: cannot open %s\n", argv[i + 1]);
                return 1;
            }
            static uint8_t buf[1 << 16];
            size_t len = fread(buf, 1, sizeof buf, f);
            fclose(f);
            if (nbp_init() != 0) {
                return 1;
            }
            int rc = nbp_minimize(buf, len);
            nbp_fini();
            return rc < 0 ? 1 : 0;
        }
        if (strcmp(argv[i], "--replay") == 0) {
            if (nbp_init() != 0) {
                return 1;
            }
            int rc = replay(argc - i - 1, argv + i + 1);
            nbp_fini();
            return rc;
        }
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 0);
        } else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) {
            count = strtoull(argv[++i], NULL, 0);
        } else if (strcmp(argv[i], "--start") == 0 && i + 1 < argc) {
            start = strtoull(argv[++i], NULL, 0);
        } else if (strcmp(argv[i], "-v") == 0) {
            verbose = true;
        } else {
            return usage();
        }
    }
    if (nbp_init() != 0) {
        return 1;
    }
    nbp_on_fail = save_failure;
    g_seeded = true;
    g_seed = seed;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (uint64_t i = start; i < start + count; i++) {
        uint8_t buf[256];
        g_index = i;
        size_t n = nbp_random_input(seed, i, buf, sizeof buf);
        nbp_run(buf, n);
        if (verbose && (i + 1 - start) % 1000 == 0) {
            fprintf(stderr, "%llu programs\n", (unsigned long long)(i + 1 - start));
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    char prefix[160];
    snprintf(prefix, sizeof prefix, "fuzz_programs_driver: seed %llu, %.1f s (%.0f inputs/s), ",
             (unsigned long long)seed, secs, (double)count / (secs > 0 ? secs : 1));
    nbp_stats_print(stdout, prefix);
    nbp_fini();
    return 0;
}

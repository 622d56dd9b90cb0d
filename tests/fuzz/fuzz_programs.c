/*
 * fuzz_programs.c -- libFuzzer target: random traced programs (programs.h is the checker;
 * tests/fuzz/README.md has the byte format and the rules). A broken rule prints the program
 * as a listing of ops with their shapes and dtypes and aborts, and libFuzzer keeps the
 * input; replay it with this binary or with fuzz_programs_driver --replay <file>, and
 * shrink it with fuzz_programs_driver --minimize <file>. NABLA_FUZZ_STATS=1 prints the
 * checker's counters at exit.
 */
#include "programs.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void print_stats(void) {
    nbp_stats_print(stderr, "fuzz_programs: ");
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (nbp_init() != 0) {
        abort();
    }
    const char *st = getenv("NABLA_FUZZ_STATS");
    if (st != NULL && st[0] != '\0' && st[0] != '0') {
        atexit(print_stats);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return nbp_run(data, size);
}

/*
 * programs.h -- the random-program checker shared by the libFuzzer target fuzz_programs
 * (fuzz_programs.c) and the seeded stand-alone driver fuzz_programs_driver
 * (programs_main.c). The checker itself is programs.c, programs_decode.c and programs_ops.c
 * (programs_internal.h); tests/fuzz/README.md describes the byte format and the rules.
 *
 * nbp_run decodes bytes into a traced program over nabla's public ops, runs it every way
 * the rules compare (jitted whole program, op by op, 1 and 3 threads, grad / jit(grad) /
 * jvp / Hessian-vector products, donation) and aborts with a listing of the program when a
 * rule is broken. Everything it makes is destroyed again before it returns.
 */
#ifndef NABLA_FUZZ_PROGRAMS_H
#define NABLA_FUZZ_PROGRAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Counters over the inputs run so far. */
typedef struct nbp_stats {
    int64_t inputs;         /* nbp_run calls */
    int64_t programs;       /* programs checked (a rejected program's valid prefix counts) */
    int64_t rejected;       /* inputs whose program the library refused at trace time */
    int64_t ops;            /* ops in the programs checked */
    int64_t grad_checked;   /* programs whose jvp / grad agreement was compared */
    int64_t grad_skipped;   /* ... skipped: non-finite values */
    int64_t grad_refused;   /* ... refused by the library with a message (loops in reverse) */
    int64_t hess_checked;   /* programs whose Hessian symmetry was compared */
    int64_t donate_checked; /* programs also run with donated arguments */
    int64_t reruns;         /* inputs run twice because the bytes in use grew (R6) */
    int64_t oom_checked;    /* programs run once more with an allocation failing (R7) */
} nbp_stats;

/* Create the two contexts (1 and 3 threads) and take the counters' baseline. Returns 0, or
 * -1 (with a message on stderr) if a context cannot be made. Reads NABLA_FUZZ_DEBUG (1:
 * print every program) and NABLA_FUZZ_NAN_BITS (default 0: two NaNs compare equal
 * whatever their sign and payload; 1: NaN bits must match too, as nb_array_identical
 * compares them). */
int nbp_init(void);
/* Destroy the contexts. */
void nbp_fini(void);
/* Decode and check one input. Returns 0; a broken rule aborts (after printing it). */
int nbp_run(const uint8_t *data, size_t size);
/* The counters so far. */
nbp_stats nbp_stats_get(void);
/* Print the counters on one line to f. */
void nbp_stats_print(FILE *f, const char *prefix);
/* Random bytes for program number index of a seeded run: the driver's inputs. Writes at
 * most cap bytes; returns the count. */
size_t nbp_random_input(uint64_t seed, uint64_t index, uint8_t *buf, size_t cap);
/* Write the handwritten seed inputs into dir (which must exist), one file each. Returns
 * the number written, or -1 with a message on stderr. */
int nbp_write_seeds(const char *dir);
/* Reduce a failing input's program (checks switched off, outputs and the ops feeding
 * them dropped) while it breaks the same rule, and print the smallest one found.
 * Returns 0, 1 if the input breaks no rule, -1 on a harness error. */
int nbp_minimize(const uint8_t *data, size_t size);
/* Called (if set) before a broken rule aborts, with the input being checked: the driver
 * saves it to a file there. */
extern void (*nbp_on_fail)(const uint8_t *data, size_t size);

#endif /* NABLA_FUZZ_PROGRAMS_H */

/*
 * nbtest.h -- shared test helpers on top of cmocka.
 *
 * cmocka 1.1's integer asserts print values in hex and know nothing of nabla's context;
 * these macros print decimal values, the status name and nb_ctx_errmsg(), so a failure
 * says what went wrong without a debugger.
 */
#ifndef NBTEST_H
#define NBTEST_H

#include <nabla/nabla.h>

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

/* expr must return NB_OK; on failure print the status and the context's message. */
#define NBT_OK(ctx, expr)                                                                          \
    do {                                                                                           \
        nb_status nbt_s_ = (expr);                                                                 \
        if (nbt_s_ != NB_OK) {                                                                     \
            fail_msg("%s\n  returned %s (%d)\n  errmsg: %s", #expr, nb_status_name(nbt_s_),        \
                     (int)nbt_s_, nb_ctx_errmsg(ctx));                                             \
        }                                                                                          \
    } while (0)

/* expr must return exactly status want. */
#define NBT_STATUS(ctx, want, expr)                                                                \
    do {                                                                                           \
        nb_status nbt_s_ = (expr);                                                                 \
        if (nbt_s_ != (want)) {                                                                    \
            fail_msg("%s\n  returned %s (%d), wanted %s\n  errmsg: %s", #expr,                     \
                     nb_status_name(nbt_s_), (int)nbt_s_, nb_status_name(want),                    \
                     nb_ctx_errmsg(ctx));                                                          \
        }                                                                                          \
    } while (0)

/* The context's message must contain substring sub. */
#define NBT_ERRMSG_HAS(ctx, sub)                                                                   \
    do {                                                                                           \
        const char *nbt_m_ = nb_ctx_errmsg(ctx);                                                   \
        if (strstr(nbt_m_, (sub)) == NULL) {                                                       \
            fail_msg("errmsg does not contain \"%s\"\n  errmsg: %s", (sub), nbt_m_);               \
        }                                                                                          \
    } while (0)

#define NBT_EQ_I64(a, b)                                                                           \
    do {                                                                                           \
        long long nbt_a_ = (long long)(a), nbt_b_ = (long long)(b);                                \
        if (nbt_a_ != nbt_b_) {                                                                    \
            fail_msg("%s == %s failed: %lld != %lld", #a, #b, nbt_a_, nbt_b_);                     \
        }                                                                                          \
    } while (0)

#define NBT_EQ_F64(a, b)                                                                           \
    do {                                                                                           \
        double nbt_a_ = (double)(a), nbt_b_ = (double)(b);                                         \
        if (!(nbt_a_ == nbt_b_)) {                                                                 \
            fail_msg("%s == %s failed: %.17g != %.17g", #a, #b, nbt_a_, nbt_b_);                   \
        }                                                                                          \
    } while (0)

#define NBT_NEAR(a, b, tol)                                                                        \
    do {                                                                                           \
        double nbt_a_ = (double)(a), nbt_b_ = (double)(b);                                         \
        if (!(fabs(nbt_a_ - nbt_b_) <= (tol))) {                                                   \
            fail_msg("%s ~= %s failed: %.17g vs %.17g (tol %g)", #a, #b, nbt_a_, nbt_b_,           \
                     (double)(tol));                                                               \
        }                                                                                          \
    } while (0)

#define NBT_STREQ(a, b)                                                                            \
    do {                                                                                           \
        const char *nbt_a_ = (a), *nbt_b_ = (b);                                                   \
        if (nbt_a_ == NULL || nbt_b_ == NULL || strcmp(nbt_a_, nbt_b_) != 0) {                     \
            fail_msg("%s == %s failed:\n  got:  \"%s\"\n  want: \"%s\"", #a, #b,                   \
                     nbt_a_ ? nbt_a_ : "(null)", nbt_b_ ? nbt_b_ : "(null)");                      \
        }                                                                                          \
    } while (0)

#define NBT_TRUE(cond)                                                                             \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fail_msg("expected true: %s", #cond);                                                  \
        }                                                                                          \
    } while (0)

/* The larger of a and b, NaN if either is: for worst-error accumulators (fmax drops a NaN,
 * so a NaN result would pass a "worst <= tol" check). */
static inline double nbt_max(double a, double b) {
    return isnan(a) || isnan(b) ? NAN : a > b ? a : b;
}

/* ---- test allocator ----------------------------------------------------------------- */
/* Counts allocations and live bytes; fails the fail_at-th allocation from now (1-based)
 * when fail_at > 0, and every later one too if fail_all_after is set. */
typedef struct nbt_alloc {
    int64_t n_calls;     /* alloc calls seen */
    int64_t n_live;      /* blocks not yet freed */
    size_t live_bytes;   /* bytes not yet freed */
    int64_t fail_at;     /* 0 = never fail */
    bool fail_all_after; /* after the first injected failure, keep failing */
    int64_t n_failed;    /* injected failures so far */
} nbt_alloc;

/* An nb_allocator backed by the C library that records into *state. */
nb_allocator nbt_alloc_make(nbt_alloc *state);
/* A context using nbt_alloc_make(state); fails the test if creation fails. */
nb_ctx *nbt_ctx_with(nbt_alloc *state);
/* A context with the default allocator; fails the test if creation fails. */
nb_ctx *nbt_ctx(void);
/* Contexts from nbt_ctx / nbt_ctx_with count handles destroyed twice (logged by the library,
 * which survives them); nbt_assert_no_live fails on any. A test that destroys twice on
 * purpose says how many times it did, which also resets the count. */
void nbt_expect_double_destroys(int n);
/* Assert that ctx has no live arrays, trees, treedefs or buffers (leak check at scenario
 * granularity, stronger than LeakSanitizer at exit because objects live in pools). */
void nbt_assert_no_live(nb_ctx *ctx);

/* A tuple of the n trees in items, taking the caller's references (each item destroyed);
 * fails the test if the tuple cannot be made. */
nb_tree *nbt_tuple_take(nb_ctx *ctx, int n, nb_tree **items);

/* Allocation-failure sweep: run scenario in a fresh context (nbt_alloc_make) failing its
 * k-th allocation, for k = 1, 2, ... until a run completes without an injected failure.
 * Every failed run must return NB_ERR_OOM (and, with check_msg, a message containing "out
 * of memory"); with rerun, the scenario must then succeed in the same context; every
 * context must end with nothing live. Returns the number of failure points. name is for
 * messages. */
int nbt_oom_sweep(const char *name, nb_status (*scenario)(nb_ctx *ctx), bool check_msg, bool rerun);

/* Build helpers that fail the test on error (for tests whose subject is elsewhere). */
nb_array *nbt_arr_f32(nb_ctx *ctx, int rank, const int64_t *shape, const float *data);
nb_array *nbt_arr_f64(nb_ctx *ctx, int rank, const int64_t *shape, const double *data);
/* A leaf holding a fresh zeros array of dtype/shape. */
nb_tree *nbt_leaf(nb_ctx *ctx, nb_dtype dtype, int rank, const int64_t *shape);

#endif /* NBTEST_H */

/*
 * nan_bits_fused.c -- found by fuzz_programs with NABLA_FUZZ_NAN_BITS=1: the same program
 * gives NaNs of other bits (sign, payload, quiet/signalling) fused or constant-folded than
 * run op by op. trace.h promises "the same results whether or not ops are fused";
 * nb_array_identical (the test of the determinism guarantees) compares NaN bits.
 *
 *   cc -std=c17 -I include tests/fuzz/repro/nan_bits_fused.c -o /tmp/nan_bits \
 *      build/libnabla.a -lsleef -lblis -lz -lpthread -lm && /tmp/nan_bits
 *
 * Prints one line per case, "differ" where the bits differ; exits 1 if any does.
 */
#include <nabla/nabla.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static int g_case;

/* the whole expression in one body (fused / folded) */
static nb_status whole(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    switch (g_case) {
    case 0: { /* add(log(abs(x)), x), x = -NaN (f32) */
        nb_var *x = nb_get(tr, args, "[0]");
        return nb_return(nb_add(nb_log(nb_abs(x)), x), out);
    }
    case 1: { /* mul(sign(x), rsqrt(y)), x = NaN with a payload, y = -1 (f64) */
        nb_var *x = nb_get(tr, args, "[0]"), *y = nb_get(tr, args, "[1]");
        return nb_return(nb_mul(nb_sign(x), nb_rsqrt(y)), out);
    }
    default: { /* mean over no axes of a constant signalling NaN (f64) */
        double snan;
        uint64_t bits = 0x7ff0000000000001u;
        memcpy(&snan, &bits, sizeof snan);
        nb_var *k = nb_scalar_typed(tr, NB_DTYPE_F64, snan);
        return nb_return(nb_mean(k, (const int[]){0}, 0, true), out);
    }
    }
}

/* the same ops one at a time: step 0 makes the first intermediate, step 1 the result */
static int g_step;
static nb_status step(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *a = nb_get(tr, args, "[0]");
    switch (g_case * 10 + g_step) {
    case 0:
        return nb_return(nb_abs(a), out);
    case 1:
        return nb_return(nb_log(a), out);
    case 2:
        return nb_return(nb_add(a, nb_get(tr, args, "[1]")), out);
    case 10:
        return nb_return(nb_sign(a), out);
    case 11:
        return nb_return(nb_rsqrt(a), out);
    case 12:
        return nb_return(nb_mul(a, nb_get(tr, args, "[1]")), out);
    case 20: {
        double snan;
        uint64_t bits = 0x7ff0000000000001u;
        memcpy(&snan, &bits, sizeof snan);
        return nb_return(nb_scalar_typed(tr, NB_DTYPE_F64, snan), out);
    }
    default:
        return nb_return(nb_mean(a, (const int[]){0}, 0, true), out);
    }
}

static nb_tree *leaf(nb_ctx *ctx, nb_dtype dt, uint64_t bits) {
    nb_array *a = NULL;
    nb_tree *t = NULL;
    nb_array_zeros(ctx, dt, 0, NULL, &a);
    memcpy(nb_array_data(a), &bits, nb_dtype_size(dt));
    nb_tree_array(a, &t);
    nb_array_destroy(a);
    return t;
}

static uint64_t bits_of(const nb_tree *t) {
    nb_array *a = nb_tree_get_array(t);
    uint64_t u = 0;
    memcpy(&u, nb_array_data(a), nb_array_nbytes(a));
    return u;
}

/* run body on (a, b) with nb_eval; returns the result's leaf (new reference) */
static nb_tree *eval(nb_ctx *ctx, nb_fn_body body, nb_tree *a, nb_tree *b) {
    nb_tree *args = NULL, *out = NULL;
    nb_tree *items[2] = {a, b};
    nb_tree_tuple(ctx, b != NULL ? 2 : (a != NULL ? 1 : 0), items, &args);
    nb_status st = nb_eval(ctx, body, NULL, args, &out);
    if (st != NB_OK) {
        fprintf(stderr, "%s\n", nb_ctx_errmsg(ctx));
    }
    nb_tree_destroy(args);
    nb_ctx_clear_cache(ctx);
    return out;
}

int main(void) {
    nb_ctx *ctx = NULL;
    nb_ctx_create(NULL, &ctx);
    int bad = 0;
    static const char *const what[3] = {
        "f32 add(log(abs(x)), x), x = -NaN (0xffc00000)",
        "f64 mul(sign(x), rsqrt(y)), x = NaN payload 0x7ff8000000000123, y = -1",
        "f64 mean(scalar_typed(sNaN 0x7ff0000000000001), axes [])"};
    for (g_case = 0; g_case < 3; g_case++) {
        nb_dtype dt = g_case == 0 ? NB_DTYPE_F32 : NB_DTYPE_F64;
        nb_tree *x = g_case == 0   ? leaf(ctx, dt, 0xffc00000u)
                     : g_case == 1 ? leaf(ctx, dt, 0x7ff8000000000123u)
                                   : NULL;
        nb_tree *y = g_case == 1 ? leaf(ctx, dt, 0xbff0000000000000u) : NULL; /* -1.0 */
        nb_tree *w = eval(ctx, whole, x, y);
        nb_tree *s0 = NULL, *s1 = NULL, *r = NULL;
        if (g_case == 0) {
            g_step = 0, s0 = eval(ctx, step, x, NULL);
            g_step = 1, s1 = eval(ctx, step, s0, NULL);
            g_step = 2, r = eval(ctx, step, s1, x);
        } else if (g_case == 1) {
            g_step = 0, s0 = eval(ctx, step, x, NULL);
            g_step = 1, s1 = eval(ctx, step, y, NULL);
            g_step = 2, r = eval(ctx, step, s0, s1);
        } else {
            nb_tree *dummy = leaf(ctx, dt, 0);
            g_step = 0, s0 = eval(ctx, step, dummy, NULL);
            g_step = 1, r = eval(ctx, step, s0, NULL);
            nb_tree_destroy(dummy);
        }
        uint64_t bw = bits_of(w), br = bits_of(r);
        printf("%-75s whole 0x%016" PRIx64 "  op by op 0x%016" PRIx64 "  %s\n", what[g_case], bw,
               br, bw == br ? "same" : "differ");
        bad |= bw != br;
        nb_tree *all[] = {x, y, w, s0, s1, r};
        for (int i = 0; i < 6; i++) {
            nb_tree_destroy(all[i]);
        }
    }
    nb_ctx_destroy(ctx);
    return bad;
}

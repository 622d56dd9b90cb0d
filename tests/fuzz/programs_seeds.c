/*
 * programs_seeds.c -- the handwritten seed corpus of fuzz_programs (corpus_programs/),
 * written by `fuzz_programs_driver --write-seeds DIR` (no Python needed).
 *
 * Each seed is spelled in the decoder's byte format (programs_decode.c; the README has
 * the table): a header (check flags, value seed, inputs) and then ops, one family byte and
 * its operand and parameter bytes each. An operand byte b picks among the values that fit
 * the op, counting back from the most recent one (0: the last value that fits, 1: the one
 * before, ...), so the comments name the values the bytes pick. Every op family has a
 * seed, and the reproducers of earlier defects stay here as regression seeds:
 *   (a) nb_pad of i32/i64 arrays with NaN / inf / out-of-range fills, fused and not;
 *   (b) a batched matmul of constants folded at compile time (iota f64[5,3] @ iota
 *       f64[5,3,1]);
 *   (c) one array donated at two leaves (tied inputs);
 *   (d) nb_concatenate / nb_stack of zero vars (NULL and non-NULL xs);
 *   (e) nb_scan of length 0 (with xs of leading dim 0, and without xs);
 *   (f) nb_fori_loop with max_steps below its trip count.
 * `fuzz_programs_driver --replay corpus_programs/<seed>` with NABLA_FUZZ_DEBUG=1 prints
 * a seed's program.
 */
#include "programs.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct nbs_seed {
    const char *name;
    uint8_t b[512];
    size_t n;
} nbs_seed;

/* append n bytes */
static void nbs_put(nbs_seed *s, int n, ...) {
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n && s->n < sizeof s->b; i++) {
        s->b[s->n++] = (uint8_t)va_arg(ap, int);
    }
    va_end(ap);
}

/* ---- the header ------------------------------------------------------------------------- */

/* what to check (programs.c): the first header byte holds F_POSITIVE, F_STATIC and F_NULL
 * as they are, the second the checks (R2 when bits 0-1 are 0, donation when bits 2-3 are
 * 3, no R3-R5 with bit 4, no R4 with bit 5, R3-R5 at the specials when bits 6-7 are 3) */
enum {
    F_NO_THREADS = 0x01,
    F_NO_GRAD = 0x02,
    F_DONATE = 0x04,
    F_SPECIAL = 0x08, /* grad checks at the special inputs */
    F_POSITIVE = 0x10,
    F_STATIC = 0x20,
    F_NULL = 0x40,
    F_NO_HESS = 0x80,
    F_OOM = 0x100 /* R7: first byte bits 0-2 all set */
};
/* input dtypes, kinds and fills */
enum { D_F32 = 0, D_F64 = 1, D_I32 = 4, D_I64 = 6, D_BOOL = 7 };
enum { K_PARAM, K_CONST, K_FROZEN, K_TIED };
enum { L_RANDOM, L_SOME, L_SPECIAL, L_SMALLINT, L_POSITIVE, L_CONSTANT, L_EXTREME, L_RAMP };

static void nbs_header(nbs_seed *s, const char *name, unsigned flags, unsigned seed, int n_in) {
    memset(s, 0, sizeof *s);
    s->name = name;
    unsigned checks = ((flags & F_NO_THREADS) ? 0x01u : 0) | ((flags & F_DONATE) ? 0x0cu : 0) |
                      ((flags & F_NO_GRAD) ? 0x10u : 0) | ((flags & F_NO_HESS) ? 0x20u : 0) |
                      ((flags & F_SPECIAL) ? 0xc0u : 0);
    nbs_put(s, 5, (int)((flags & (F_POSITIVE | F_STATIC | F_NULL)) | ((flags & F_OOM) ? 7u : 0)),
            (int)checks, (int)(seed >> 8) & 255, (int)seed & 255, n_in);
}

static unsigned nbs_dim(int d) {
    return d == 0 ? 5 : (unsigned)(d - 1);
}

/* an input: dtype, rank, up to three dims, kind, fill */
static void nbs_in(nbs_seed *s, int dt, int rank, int d0, int d1, int d2, int kind, int fill) {
    int d[3] = {d0, d1, d2};
    nbs_put(s, 2, dt, rank);
    for (int i = 0; i < rank; i++) {
        nbs_put(s, 1, (int)nbs_dim(d[i]));
    }
    nbs_put(s, 1, kind | fill << 2);
}

/* ---- values ------------------------------------------------------------------------------- */

/* indices of nbp_special's table */
enum {
    S_ZERO = 0,
    S_NZERO = 1,
    S_ONE = 2,
    S_NAN = 8,
    S_INF = 9,
    S_NINF = 10,
    S_DENORM = 11,
    S_FLT_MAX = 15,
    S_BIG_F32 = 17, /* 3.5e38: inf in f32 */
    S_DBL_MAX = 18,
    S_1E300 = 20,
    S_I32_MAX = 22,
    S_I32_MIN = 23,
    S_2P31 = 24,
    S_2P32 = 26,
    S_1E10 = 28,
    S_M1E10 = 29,
    S_710 = 31,
    S_NNAN = 40,
    S_NAN_PAYLOAD = 41,
    S_SNAN = 42
};
/* a weak scalar byte: special i, or the loop constant j (0.5, -1, 2, 1, 0.25, -0.75, 3, 0) */
static int nbs_sc_special(int i) {
    return 128 + (i + 4) % 44;
}
static int nbs_sc_const(int j) {
    return j;
}

/* ---- families (the first byte of an op) ----------------------------------------------------- */
enum {
    OP_UNARY = 0,
    OP_BINARY = 4,
    OP_COMPARE = 8,
    OP_LOGICAL = 9,
    OP_SCALAR = 10,
    OP_SELECT = 12,
    OP_CAST = 13,
    OP_REDUCE = 14,
    OP_ARG = 17,
    OP_SOFT = 18,
    OP_RESHAPE = 19,
    OP_BROADCAST = 20,
    OP_TRANSPOSE = 21,
    OP_EXPAND = 22,
    OP_SLICE = 23,
    OP_CONCAT = 24,
    OP_PAD = 25,
    OP_TAKE = 26,
    OP_DYN = 27,
    OP_MATMUL = 28,
    OP_SOURCE = 29,
    OP_RNG = 30,
    OP_LOOP = 31
};
/* unary codes */
enum {
    U_NEG,
    U_ABS,
    U_SIGN,
    U_SQUARE,
    U_RELU,
    U_STOP,
    U_EXP,
    U_EXPM1,
    U_LOG,
    U_LOG1P,
    U_SQRT,
    U_RSQRT,
    U_RECIP,
    U_SIN,
    U_COS,
    U_TAN,
    U_TANH,
    U_SIGMOID,
    U_GELU,
    U_SOFTPLUS,
    U_ERF,
    U_NOT
};
/* binary (and weak-scalar) codes: add sub mul div maximum minimum pow, then the comparisons */
enum { B_ADD, B_SUB, B_MUL, B_DIV, B_MAX, B_MIN, B_POW, B_EQ, B_NE, B_LT, B_LE, B_GT, B_GE };
/* reductions */
enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD, R_LSE };
/* cast targets */
enum { C_F32, C_F64, C_I32, C_I64, C_BOOL };
/* loops */
enum { LP_FORI, LP_SCAN, LP_WHILE, LP_COND, LP_SWITCH, LP_CALL };

static void nbs_unary(nbs_seed *s, int code, int pick) {
    nbs_put(s, 3, OP_UNARY, code, pick);
}
/* binary (code < 7) or comparison (code >= 7) of picks a and b */
static void nbs_binary(nbs_seed *s, int code, int a, int b) {
    if (code >= B_EQ) {
        nbs_put(s, 4, OP_COMPARE, code - B_EQ, a, b);
    } else {
        nbs_put(s, 4, OP_BINARY, code, a, b);
    }
}
/* x op scalar (right) or scalar op x (left): code = s % 13, left = bit 7 */
static void nbs_scalar(nbs_seed *s, int code, bool left, int pick, int value) {
    int sb = 0;
    while (sb < 256 && !(sb % 13 == code && ((sb >> 7) & 1) == (left ? 1 : 0))) {
        sb++;
    }
    nbs_put(s, 4, OP_SCALAR, sb, pick, value);
}
/* a source's first byte: which = s % 3 (iota, full, scalar_typed), dtype = (s >> 2) % 8
 * indexing {f32, f64, i32, f64, i64, f32, bool, f64} */
enum { SRC_IOTA, SRC_FULL, SRC_SCALAR };
enum { SD_F32 = 0, SD_F64 = 1, SD_I32 = 2, SD_I64 = 4, SD_BOOL = 6 };
static int nbs_src(int which, int dt) {
    for (int sb = 0; sb < 255; sb++) {
        if (sb % 3 == which && (sb >> 2) % 8 == dt) {
            return sb;
        }
    }
    return 0;
}
/* take's first byte: which = s % 3 (take, take_along_axis, one_hot), inline indices = bit 2,
 * i64 indices = bit 3, inline length k = (s >> 4) % 5 */
enum { TK_TAKE, TK_ALONG, TK_ONE_HOT };
static int nbs_take(int which, bool inl, bool i64, int k) {
    for (int sb = 0; sb < 255; sb++) {
        if (sb % 3 == which && ((sb >> 2) & 1) == inl && ((sb >> 3) & 1) == i64 &&
            (sb >> 4) % 5 == k) {
            return sb;
        }
    }
    return 0;
}
static void nbs_reduce(nbs_seed *s, int code, int pick, unsigned axes_mask, bool keepdims,
                       bool null_axes, bool negative) {
    nbs_put(s, 5, OP_REDUCE, code, pick, (int)axes_mask,
            (keepdims ? 1 : 0) | (null_axes ? 2 : 0) | (negative ? 4 : 0));
}

/* a loop op: the bytes after the family byte */
static void nbs_loop(nbs_seed *s, int sbyte, int k, int ms, int u, int cs) {
    nbs_put(s, 6, OP_LOOP, sbyte, k, ms, u, cs);
}
/* the first byte value in [0, 256) for which want() holds */
static int nbs_find(bool (*want)(int, const int *), const int *args) {
    for (int b = 0; b < 256; b++) {
        if (want(b, args)) {
            return b;
        }
    }
    return 0;
}
/* loops: s % 6 is the kind of loop; fori: lo = (s >> 3) % 3, hi = (s >> 5) % 6 */
static bool nbs_want_fori(int s, const int *a) {
    return s % 6 == LP_FORI && (s >> 3) % 3 == a[0] && (s >> 5) % 6 == a[1];
}
/* scan: no xs = bit 3, length without xs = (s >> 4) % 4 */
static bool nbs_want_scan(int s, const int *a) {
    return s % 6 == LP_SCAN && ((s >> 3) & 1) == a[0] && (a[0] == 0 || (s >> 4) % 4 == a[1]) &&
           s != 0xff;
}
/* while: n = (s >> 3) % 5 */
static bool nbs_want_while(int s, const int *a) {
    return s % 6 == LP_WHILE && (s >> 3) % 5 == a[0];
}
/* call: non-inlined jit = bit 3 */
static bool nbs_want_call(int s, const int *a) {
    return s % 6 == LP_CALL && ((s >> 3) & 1) == a[0];
}
/* k: kind = k % 3, checkpoints = (k >> 2) % 3, switch branches = 1 + (k >> 4) % 3 */
static int nbs_k(int kind, int checkpoints, int branches) {
    for (int k = 0; k < 32; k++) {
        if (k % 3 == kind && (k >> 2) % 3 == checkpoints && 1 + (k >> 4) % 3 == branches) {
            return k;
        }
    }
    return kind;
}
/* max_steps byte: 0 (the trip count / unbounded), 5..8, or 0..2 (too few) */
static int nbs_ms(int max_steps) {
    if (max_steps == 0) {
        return 0;
    }
    if (max_steps >= 5) {
        return 1 + 2 * (max_steps - 5);
    }
    return 31 + 32 * max_steps;
}

/* ---- the seeds ------------------------------------------------------------------------------ */

#define NBS_MAX 64

static int nbs_build(nbs_seed *all) {
    int n = 0;
    nbs_seed *s;

    /* every float unary op of f32 values, chained */
    s = &all[n++];
    nbs_header(s, "unary_f32_chain", 0x00, 1, 1);
    nbs_in(s, D_F32, 2, 2, 3, 0, K_PARAM, L_RANDOM);
    static const int chain[] = {U_EXP,  U_LOG,      U_TANH, U_SQRT,    U_RSQRT,
                                U_GELU, U_SOFTPLUS, U_ERF,  U_SIGMOID, U_EXPM1};
    for (size_t i = 0; i < sizeof chain / sizeof chain[0]; i++) {
        nbs_unary(s, chain[i], 0); /* of the last value */
    }

    /* every unary op of the same f64 specials (NaN, inf, denormals, huge): pick v0 */
    s = &all[n++];
    nbs_header(s, "unary_f64_specials", 0x00, 2, 1);
    nbs_in(s, D_F64, 1, 5, 0, 0, K_PARAM, L_SPECIAL);
    for (int c = U_STOP, j = 0; c <= U_ERF; c++, j++) {
        nbs_unary(s, c, j); /* j values so far besides v0: v0 is candidate j back */
    }

    /* integer unary ops at INT_MIN and friends: neg, abs, square, sign, relu */
    s = &all[n++];
    nbs_header(s, "unary_int_edges", 0x00, 3, 2);
    nbs_in(s, D_I32, 1, 5, 0, 0, K_PARAM, L_SPECIAL);
    nbs_in(s, D_I64, 1, 4, 0, 0, K_PARAM, L_SPECIAL);
    for (int c = U_NEG, j = 1; c <= U_RELU; c++, j++) {
        nbs_unary(s, c, j); /* v0 */
    }
    for (int c = U_NEG, j = 5; c <= U_RELU; c++, j++) {
        nbs_unary(s, c, j); /* v1 */
    }

    /* broadcasting binary ops: f32[2,1,3] with f32[4,3] */
    s = &all[n++];
    nbs_header(s, "binary_broadcast_f32", 0x00, 4, 2);
    nbs_in(s, D_F32, 3, 2, 1, 3, K_PARAM, L_RANDOM);
    nbs_in(s, D_F32, 2, 4, 3, 0, K_PARAM, L_SOME);
    nbs_binary(s, B_ADD, 1, 0); /* v2 = v0 + v1 */
    nbs_binary(s, B_SUB, 0, 1); /* v3 = v2 - v1 */
    nbs_binary(s, B_MUL, 0, 3); /* v4 = v3 * v0 */
    nbs_binary(s, B_DIV, 0, 0); /* v5 = v4 / v4 */
    nbs_binary(s, B_MAX, 0, 2); /* v6 = maximum(v5, v3) */
    nbs_binary(s, B_MIN, 0, 5); /* v7 = minimum(v6, v1) */
    nbs_binary(s, B_POW, 0, 6); /* v8 = pow(v7, v1) */

    /* integer division and overflow: INT_MIN / -1, x / 0, INT_MAX * x, i32 and i64 */
    s = &all[n++];
    nbs_header(s, "int_div_overflow", 0x00, 5, 2);
    nbs_in(s, D_I32, 1, 5, 0, 0, K_PARAM, L_SPECIAL);
    nbs_in(s, D_I64, 1, 5, 0, 0, K_PARAM, L_SPECIAL);
    nbs_scalar(s, B_DIV, false, 1, nbs_sc_const(1));           /* v2 = v0 / -1 */
    nbs_scalar(s, B_DIV, false, 1, nbs_sc_const(1));           /* v3 = v1 / -1 */
    nbs_scalar(s, B_MUL, false, 3, nbs_sc_special(S_I32_MAX)); /* v4 = v0 * INT_MAX */
    nbs_binary(s, B_DIV, 4, 1);                                /* v5 = v0 / v2 */
    nbs_scalar(s, B_DIV, true, 5, nbs_sc_special(S_ZERO));     /* v6 = 0 / v0 */
    nbs_scalar(s, B_DIV, false, 6, nbs_sc_special(S_ZERO));    /* v7 = v0 / 0 */
    nbs_binary(s, B_SUB, 4, 0);                                /* v8 = v3 - v3 */
    nbs_binary(s, B_ADD, 7, 0);                                /* v9 = v1 + v8 */

    /* comparisons with NaN, then select */
    s = &all[n++];
    nbs_header(s, "compare_select", 0x00, 6, 2);
    nbs_in(s, D_F32, 2, 3, 4, 0, K_PARAM, L_SOME);
    nbs_in(s, D_F32, 1, 4, 0, 0, K_PARAM, L_SPECIAL);
    nbs_binary(s, B_LT, 1, 0);         /* v2 = v0 < v1 */
    nbs_put(s, 4, OP_SELECT, 0, 2, 0); /* v3 = select(v2, v0, v1) */
    nbs_binary(s, B_EQ, 0, 0);         /* v4 = v3 == v3 (NaN) */
    nbs_binary(s, B_NE, 2, 0);         /* v5 = v2 != v4 */
    nbs_binary(s, B_GE, 1, 1);         /* v6 = v3 >= v0 */
    nbs_put(s, 4, OP_SELECT, 0, 1, 2); /* v7 = select(v6, v3, v1) */

    /* logical ops on bools */
    s = &all[n++];
    nbs_header(s, "logical", 0x00, 7, 2);
    nbs_in(s, D_BOOL, 2, 2, 3, 0, K_PARAM, L_RANDOM);
    nbs_in(s, D_F64, 1, 3, 0, 0, K_PARAM, L_SOME);
    nbs_binary(s, B_GT, 0, 0);          /* v2 = v1 > v1 */
    nbs_put(s, 4, OP_LOGICAL, 0, 1, 0); /* v3 = v0 and v2 */
    nbs_put(s, 4, OP_LOGICAL, 1, 0, 2); /* v4 = v3 or v0 */
    nbs_unary(s, U_NOT, 0);             /* v5 = not v4 */
    nbs_put(s, 4, OP_SELECT, 0, 0, 1);  /* v6 = select(v5, v5, v4) */

    /* weak scalars at the edges: NaN, inf, 1e300 (inf in f32), -0.0; into i32: NaN -> 0,
     * inf and 2^31 saturate */
    s = &all[n++];
    nbs_header(s, "weak_scalars", 0x00, 8, 2);
    nbs_in(s, D_F32, 1, 4, 0, 0, K_PARAM, L_RANDOM);
    nbs_in(s, D_I32, 1, 4, 0, 0, K_PARAM, L_SMALLINT);
    nbs_scalar(s, B_ADD, false, 1, nbs_sc_special(S_NAN));   /* v2 = v0 + NaN */
    nbs_scalar(s, B_MUL, true, 2, nbs_sc_special(S_1E300));  /* v3 = 1e300 * v0 */
    nbs_scalar(s, B_SUB, false, 3, nbs_sc_special(S_NZERO)); /* v4 = v0 - -0.0 */
    nbs_scalar(s, B_POW, false, 4, nbs_sc_special(S_INF));   /* v5 = v0 ** inf */
    nbs_scalar(s, B_ADD, false, 4, nbs_sc_special(S_NAN));   /* v6 = v1 + NaN (-> 0) */
    nbs_scalar(s, B_MUL, false, 0, nbs_sc_special(S_INF));   /* v7 = v6 * inf (saturates) */
    nbs_scalar(s, B_SUB, true, 0, nbs_sc_special(S_2P31));   /* v8 = 2^31 - v7 */
    nbs_scalar(s, B_LT, false, 8, nbs_sc_special(S_NAN));    /* v9 = v0 < NaN */
    nbs_scalar(s, B_MAX, true, 8, nbs_sc_special(S_NINF));   /* v10 = maximum(-inf, v0) */

    /* casts at the edges: float specials to int, bool, the other float; int to float */
    s = &all[n++];
    nbs_header(s, "casts", 0x00, 9, 2);
    nbs_in(s, D_F32, 1, 5, 0, 0, K_PARAM, L_SPECIAL);
    nbs_in(s, D_F64, 1, 5, 0, 0, K_PARAM, L_SPECIAL);
    nbs_put(s, 3, OP_CAST, 1, C_I32);                /* v2 = i32(v0) */
    nbs_put(s, 3, OP_CAST, 2, C_I64);                /* v3 = i64(v0) */
    nbs_put(s, 3, OP_CAST, 3, C_BOOL);               /* v4 = bool(v0) */
    nbs_put(s, 3, OP_CAST, 3, C_F32);                /* v5 = f32(v1) */
    nbs_put(s, 3, OP_CAST, 4, C_I32);                /* v6 = i32(v1) */
    nbs_put(s, 3, OP_CAST, 2, C_F64);                /* v7 = f64(v4) */
    nbs_put(s, 3, OP_CAST, 3, C_F32);                /* v8 = f32(v3) */
    nbs_scalar(s, B_ADD, false, 0, nbs_sc_const(3)); /* v9 = v8 + 1 (fused with the cast) */

    /* reductions: axes, keepdims, NULL axes, negative axes; empty dims; int wrapping */
    s = &all[n++];
    nbs_header(s, "reductions", 0x00, 10, 3);
    nbs_in(s, D_F64, 3, 3, 4, 2, K_PARAM, L_SOME);
    nbs_in(s, D_F32, 3, 2, 0, 3, K_PARAM, L_RANDOM);
    nbs_in(s, D_I32, 2, 4, 5, 0, K_PARAM, L_SPECIAL);
    nbs_reduce(s, R_SUM, 2, 0x5, true, false, false);   /* v3 = sum(v0, [0,2], keepdims) */
    nbs_reduce(s, R_MEAN, 2, 0x2, false, false, true);  /* v4 = mean(v0, [-2]) */
    nbs_reduce(s, R_MAX, 3, 0, false, true, false);     /* v5 = max(v0) */
    nbs_reduce(s, R_MIN, 4, 0x4, true, false, true);    /* v6 = min(v0, [-1], keepdims) */
    nbs_reduce(s, R_PROD, 6, 0x1, false, false, false); /* v7 = prod(v0, [0]) */
    nbs_reduce(s, R_SUM, 6, 0x2, false, false, false);  /* v8 = sum(v1, [1]): zeros */
    nbs_reduce(s, R_PROD, 7, 0x2, true, false, false);  /* v9 = prod(v1, [1]): ones */
    nbs_reduce(s, R_SUM, 7, 0x3, false, false, false);  /* v10 = sum(v2, [0,1]): wraps */
    nbs_reduce(s, R_PROD, 8, 0x1, false, false, false); /* v11 = prod(v2, [0]): wraps */
    nbs_reduce(s, R_LSE, 9, 0x6, false, false, false);  /* v12 = logsumexp(v0, [1,2]) */
    nbs_reduce(s, R_SUM, 0, 0, false, false, false);    /* v13 = sum(v12, []) */

    /* argmax / argmin with NaN and ties */
    s = &all[n++];
    nbs_header(s, "argmax_nan_ties", 0x00, 11, 2);
    nbs_in(s, D_F32, 2, 4, 3, 0, K_PARAM, L_SOME);
    nbs_in(s, D_I32, 2, 3, 3, 0, K_PARAM, L_CONSTANT);
    nbs_put(s, 4, OP_ARG, 0, 1, 0);       /* v2 = argmax(v0, 0) */
    nbs_put(s, 4, OP_ARG, 0x81, 2, 0x81); /* v3 = argmin(v0, -1, keepdims) */
    nbs_put(s, 4, OP_ARG, 0, 2, 1);       /* v4 = argmax(v1, 1): ties */
    nbs_put(s, 4, OP_ARG, 1, 0, 0);       /* v5 = argmin(v4, 0) */

    /* logsumexp / softmax / log_softmax with inf, -inf, NaN */
    s = &all[n++];
    nbs_header(s, "softmax_family", 0x00, 12, 2);
    nbs_in(s, D_F32, 2, 2, 5, 0, K_PARAM, L_SPECIAL);
    nbs_in(s, D_F64, 2, 3, 4, 0, K_PARAM, L_SOME);
    nbs_reduce(s, R_LSE, 1, 0x2, true, false, false); /* v2 = logsumexp(v0, [1], keepdims) */
    nbs_put(s, 4, OP_SOFT, 0, 2, 0x81);               /* v3 = softmax(v0, -1) */
    nbs_put(s, 4, OP_SOFT, 1, 3, 0);                  /* v4 = log_softmax(v0, 0) */
    nbs_put(s, 4, OP_SOFT, 0, 3, 1);                  /* v5 = softmax(v1, 1) */
    nbs_put(s, 4, OP_SOFT, 1, 0, 0x81);               /* v6 = log_softmax(v5, -1) */
    nbs_reduce(s, R_LSE, 0, 0, false, true, false);   /* v7 = logsumexp(v6) */

    /* reshape (with -1 and a size 0), transpose (a permutation, NULL), expand, squeeze */
    s = &all[n++];
    nbs_header(s, "reshape_transpose", 0x00, 13, 2);
    nbs_in(s, D_F32, 3, 2, 3, 4, K_PARAM, L_RAMP);
    nbs_in(s, D_F64, 2, 0, 3, 0, K_PARAM, L_RANDOM);
    nbs_put(s, 4, OP_RESHAPE, 1, 3, 0x01); /* v2 = reshape(v0, [2, 12] with a -1) */
    nbs_put(s, 3, OP_TRANSPOSE, 0, 1);     /* v3 = transpose(v2, [1, 0]) */
    nbs_put(s, 3, OP_TRANSPOSE, 3, 0xf0);  /* v4 = transpose(v0, NULL) */
    nbs_put(s, 3, OP_TRANSPOSE, 0, 5);     /* v5 = transpose(v4, perm 5) */
    nbs_put(s, 4, OP_EXPAND, 0, 0, 1);     /* v6 = expand_dims(v5, ...) */
    nbs_put(s, 3, OP_EXPAND, 0x03, 0);     /* v7 = squeeze(v6, NULL) */
    nbs_put(s, 4, OP_RESHAPE, 6, 3, 0);    /* v8 = reshape(v1, [2,0,5]) */
    nbs_put(s, 4, OP_RESHAPE, 0, 0, 0x01); /* v9 = reshape(v8, [-1]) */

    /* broadcast_to: new leading dims, size-1 dims stretched, a size-0 dim */
    s = &all[n++];
    nbs_header(s, "broadcast_to", 0x00, 14, 1);
    nbs_in(s, D_F32, 2, 1, 3, 0, K_PARAM, L_SOME);
    nbs_put(s, 5, OP_BROADCAST, 0, 1, 2, 3);    /* v1 = broadcast(v0, [2, 3->4?, 3]) */
    nbs_put(s, 6, OP_BROADCAST, 1, 2, 1, 0, 4); /* v2 = broadcast(v0, [1, 0, 4, 3]) */
    nbs_binary(s, B_MUL, 1, 0);                 /* v3 = v1 * v1 */

    /* slices: negative steps, starts past the end, empty results */
    s = &all[n++];
    nbs_header(s, "slices", 0x00, 15, 1);
    nbs_in(s, D_F64, 2, 5, 4, 0, K_PARAM, L_RAMP);
    nbs_put(s, 9, OP_SLICE, 0, 0, 0x81, 0x40, 3, 2, 0x40, 2); /* v1 = v0[-7::-1, 2::2] */
    nbs_put(s, 9, OP_SLICE, 1, 1, 6, 0x81, 0, 0, 0x41, 0);    /* v2 = v0[6:-1, ::] NULL step */
    nbs_put(s, 9, OP_SLICE, 2, 0, 4, 1, 6, 0x82, 0x40, 6);    /* v3 = v0[4:1:-2, -6:4:-2] */
    nbs_binary(s, B_ADD, 2, 0);                               /* v4 = v1 + v1 */

    /* concatenate and stack, with an empty input */
    s = &all[n++];
    nbs_header(s, "concat_stack", 0x00, 16, 3);
    nbs_in(s, D_F32, 2, 2, 3, 0, K_PARAM, L_RANDOM);
    nbs_in(s, D_F32, 2, 2, 3, 0, K_PARAM, L_SOME);
    nbs_in(s, D_F32, 2, 0, 3, 0, K_PARAM, L_RANDOM);
    nbs_put(s, 6, OP_CONCAT, 2 << 1, 2, 0, 1, 0);     /* v3 = concat(v0, v1, v2, axis 0) */
    nbs_put(s, 5, OP_CONCAT, 1 << 1, 0, 0x81, 3);     /* v4 = concat(v3, v0, axis -1)? */
    nbs_put(s, 6, OP_CONCAT, 1 | 2 << 1, 3, 1, 2, 1); /* v5 = stack(v1, v0, v1, axis 1) */
    nbs_put(s, 5, OP_CONCAT, 1 | 1 << 1, 0, 0, 0);    /* v6 = stack(v5, v5, axis 0) */

    /* pad of floats with NaN, -inf and a signalling NaN */
    s = &all[n++];
    nbs_header(s, "pad_float", 0x00, 17, 2);
    nbs_in(s, D_F32, 2, 2, 3, 0, K_PARAM, L_RANDOM);
    nbs_in(s, D_F64, 1, 3, 0, 0, K_PARAM, L_RANDOM);
    nbs_put(s, 5, OP_PAD, 1, 0x09, 0x02, S_NAN);  /* v2 = pad(v0, lo [1,2], hi [2,0], NaN) */
    nbs_put(s, 4, OP_PAD, 1, 0x0a, S_SNAN);       /* v3 = pad(v1, [2], [2], sNaN) */
    nbs_put(s, 5, OP_PAD, 1, 0x05, 0x04, S_NINF); /* v4 = pad(v2? ...) */
    nbs_unary(s, U_EXP, 0);                       /* v5 = exp(v4): fused with the pad */

    /* (a) pad of integers with NaN, inf, 1e10, -1e10, 2^31: fused (then an add) and not */
    s = &all[n++];
    nbs_header(s, "defect_a_pad_int_fill", 0x00, 18, 2);
    nbs_in(s, D_I32, 2, 3, 2, 0, K_PARAM, L_SMALLINT);
    nbs_in(s, D_I64, 2, 2, 2, 0, K_PARAM, L_SPECIAL);
    nbs_put(s, 5, OP_PAD, 1, 0x05, 0x05, S_NAN);     /* v2 = pad(v0, 1, 1, NaN) */
    nbs_scalar(s, B_ADD, false, 0, nbs_sc_const(3)); /* v3 = v2 + 1 (fused) */
    nbs_put(s, 5, OP_PAD, 3, 0x01, 0x04, S_INF);     /* v4 = pad(v0, inf) */
    nbs_scalar(s, B_MUL, false, 0, nbs_sc_const(2)); /* v5 = v4 * 2 */
    nbs_put(s, 5, OP_PAD, 4, 0x04, 0x01, S_1E10);    /* v6 = pad(v1, 1e10) */
    nbs_scalar(s, B_SUB, false, 0, nbs_sc_const(3)); /* v7 = v6 - 1 */
    nbs_put(s, 5, OP_PAD, 6, 0x05, 0x00, S_M1E10);   /* v8 = pad(v0?, -1e10) */
    nbs_put(s, 5, OP_PAD, 7, 0x00, 0x05, S_2P31);    /* v9 = pad(v1?, 2^31) */
    nbs_put(s, 5, OP_PAD, 0, 0x05, 0x05, S_NNAN);    /* v10 = pad(v9, -NaN) */
    nbs_binary(s, B_ADD, 0, 0);                      /* v11 = v10 + v10 */

    /* take / take_along_axis / one_hot with out-of-range and negative indices */
    s = &all[n++];
    nbs_header(s, "take_family", 0x00, 19, 2);
    nbs_in(s, D_F32, 2, 5, 3, 0, K_PARAM, L_RAMP);
    nbs_in(s, D_I32, 1, 4, 0, 0, K_PARAM, L_SPECIAL);
    /* (after the first byte: a, b of the inline indices iota * a + b: a = -2 + byte % 6,
     * b = -3 + byte % 10) */
    /* v2 = take(v0, iota(i32[4]) * 3 - 2, axis 0) */
    nbs_put(s, 6, OP_TAKE, nbs_take(TK_TAKE, true, false, 4), 5, 1, 1, 0);
    /* v3 = take(v0, v1 (INT_MIN, INT_MAX, ...), axis -1) */
    nbs_put(s, 7, OP_TAKE, nbs_take(TK_TAKE, false, false, 0), 0, 0, 2, 0x81, 0);
    /* v4 = take_along_axis(v0, iota(i64[5,2], axis 1) * -2 + 6, axis 1) */
    nbs_put(s, 7, OP_TAKE, nbs_take(TK_ALONG, true, true, 2), 0, 9, 3, 1, 0);
    /* v5 = one_hot(iota(i32[3]) * 2 - 1, depth 4, f32) */
    nbs_put(s, 5, OP_TAKE, nbs_take(TK_ONE_HOT, true, false, 3), 4, 2, 4);
    nbs_put(s, 1, 0);
    /* v6 = one_hot(v1, depth 5, bool) */
    nbs_put(s, 7, OP_TAKE, nbs_take(TK_ONE_HOT, false, false, 0), 0, 0, 5, 4, 0);

    /* dynamic_slice / dynamic_update_slice: clamped starts, a start from data */
    s = &all[n++];
    nbs_header(s, "dynamic_slices", 0x00, 20, 2);
    nbs_in(s, D_F32, 2, 4, 5, 0, K_PARAM, L_RAMP);
    nbs_in(s, D_I32, 0, 0, 0, 0, K_PARAM, L_SMALLINT);
    /* dynamic_slice(v0, starts (-3 clamped, 5 clamped), sizes (2, 3)) */
    nbs_put(s, 7, OP_DYN, 0, 1, 2, 0, 3, 8);
    /* dynamic_slice(v0, starts (v1, 1), sizes (3, 5)), i64 starts */
    nbs_put(s, 8, OP_DYN, 2, 2, 3, 0xc0, 0, 5, 4);
    /* dynamic_update_slice(v0, full([1,2], NaN) at (2, -1)) */
    nbs_put(s, 8, OP_DYN, 1 | 4, 3, S_NAN, 1, 5, 2, 2);
    /* dynamic_update_slice(v4, update v2 (a value), starts (v1, 0)) */
    nbs_put(s, 8, OP_DYN, 1, 0, 2, S_ONE, 0, 0xc0, 0, 3);

    /* matmul: 2-d, batched, vector @ matrix, ints, dot, an empty inner dim */
    s = &all[n++];
    nbs_header(s, "matmul", 0x00, 21, 4);
    nbs_in(s, D_F32, 2, 2, 3, 0, K_PARAM, L_RANDOM);
    nbs_in(s, D_F64, 3, 2, 3, 4, K_PARAM, L_RANDOM);
    nbs_in(s, D_I32, 2, 3, 3, 0, K_PARAM, L_SPECIAL);
    nbs_in(s, D_F64, 1, 4, 0, 0, K_PARAM, L_RANDOM);
    /* first byte: dot = s % 4 == 3, inline right operand = bit 2, rank-1 inline = bit 3,
     * batched inline = bit 4, the iota's axis = s >> 5 */
    nbs_put(s, 4, OP_MATMUL, 4, 3, 4);      /* v4 = v0 @ iota([3,4]) */
    nbs_put(s, 4, OP_MATMUL, 4 | 16, 3, 2); /* v5 = v1 @ iota([2,4,2]) batched */
    nbs_put(s, 4, OP_MATMUL, 0, 3, 1);      /* v6 = v2 @ v2 (ints, overflow) */
    nbs_put(s, 4, OP_MATMUL, 3, 0, 0);      /* v7 = dot(v3, v3) */
    nbs_put(s, 4, OP_MATMUL, 4 | 8, 3, 0);  /* v8 = v3 @ iota([4]) */
    nbs_put(s, 4, OP_MATMUL, 4 | 32, 6, 0); /* v9 = v0 @ iota([3,0], axis 1): empty */

    /* (b) a batched matmul of constants folded at compile time: iota f64[5,3] @ iota
     * f64[5,3,1] */
    s = &all[n++];
    nbs_header(s, "defect_b_folded_batched_matmul", 0x00, 22, 0);
    /* iota: rank = 1 + byte % 3, dims = byte % 6, axis = byte % rank, then a fill byte */
    int iota_f64 = nbs_src(SRC_IOTA, SD_F64);
    nbs_put(s, 7, OP_SOURCE, iota_f64, 1, 5, 3, 0, 0);    /* v0 = iota(f64[5,3], axis 0) */
    nbs_put(s, 8, OP_SOURCE, iota_f64, 2, 5, 3, 1, 1, 0); /* v1 = iota(f64[5,3,1], axis 1) */
    nbs_put(s, 4, OP_MATMUL, 0, 1, 0);                    /* v2 = v0 @ v1: f64[5,5,1] */
    nbs_put(s, 7, OP_SOURCE, iota_f64, 1, 2, 3, 1, 0);    /* v3 = iota(f64[2,3], axis 1) */
    nbs_put(s, 4, OP_MATMUL, 0, 0, 1);                    /* v4 = v3 @ v1: f64[5,2,1] */

    /* (c) one array donated at two leaves: tied inputs, every argument donated */
    s = &all[n++];
    nbs_header(s, "defect_c_donate_tied", F_DONATE, 23, 3);
    nbs_in(s, D_F32, 1, 3, 0, 0, K_PARAM, L_RANDOM);
    nbs_in(s, D_F32, 1, 3, 0, 0, K_TIED, L_RANDOM);
    nbs_in(s, D_F64, 2, 2, 2, 0, K_PARAM, L_RANDOM);
    nbs_binary(s, B_ADD, 1, 0); /* v3 = v1 + v1 */
    nbs_binary(s, B_MUL, 0, 2); /* v4 = v3 * v0 */
    nbs_unary(s, U_TANH, 1);    /* v5 = tanh(v2) */

    /* (d) nb_concatenate / nb_stack of zero vars (refused with a message) */
    s = &all[n++];
    nbs_header(s, "defect_d_concat_zero_null", 0x00, 24, 1);
    nbs_in(s, D_F32, 1, 2, 0, 0, K_PARAM, L_RANDOM);
    nbs_unary(s, U_NEG, 0);
    nbs_put(s, 3, OP_CONCAT, 0xfa, 0); /* n 0, NULL xs */
    s = &all[n++];
    nbs_header(s, "defect_d_concat_zero", 0x00, 24, 1);
    nbs_in(s, D_F32, 1, 2, 0, 0, K_PARAM, L_RANDOM);
    nbs_put(s, 3, OP_CONCAT, 0xf8, 0); /* n 0, xs not NULL */
    s = &all[n++];
    nbs_header(s, "defect_d_stack_zero", 0x00, 24, 1);
    nbs_in(s, D_F32, 1, 2, 0, 0, K_PARAM, L_RANDOM);
    nbs_put(s, 3, OP_CONCAT, 0xf9, 0); /* stack, n 0 */

    /* (e) scan of length 0: xs of leading dim 0; and without xs */
    s = &all[n++];
    nbs_header(s, "defect_e_scan_length_zero", 0x00, 25, 2);
    nbs_in(s, D_F64, 2, 0, 3, 0, K_PARAM, L_RANDOM);
    nbs_in(s, D_F64, 1, 2, 0, 0, K_PARAM, L_RANDOM);
    nbs_loop(s, nbs_find(nbs_want_scan, (int[]){0, 0}), nbs_k(2, 0, 1), 0, 0x24, 0x0a);
    nbs_put(s, 2, 0, 1); /* carry v1, xs v0 */
    nbs_loop(s, nbs_find(nbs_want_scan, (int[]){1, 0}), nbs_k(1, 1, 1), 0, 0x31, 0x13);
    nbs_put(s, 1, 1); /* carry v1 (of the values so far, one back) */
    nbs_unary(s, U_SIN, 0);

    /* (f) fori_loop with max_steps 1 below its trip count 5 (refused) */
    s = &all[n++];
    nbs_header(s, "defect_f_fori_max_steps_short", 0x00, 26, 1);
    nbs_in(s, D_F64, 1, 3, 0, 0, K_PARAM, L_RANDOM);
    nbs_loop(s, nbs_find(nbs_want_fori, (int[]){0, 5}), nbs_k(1, 0, 1), nbs_ms(1), 0x05, 0x02);
    nbs_put(s, 1, 0);

    /* (g) sin of a ramp of 16385 f32 (0, 1, ..., 16384) padded by a row above: as it was
     * found (libFuzzer's bytes, ops past the pad included). SLEEF's plain sinf took a faster
     * reduction when all 8 lanes were under 125, so sin(124) alone in a padded row and next
     * to 125..127 differed by one ULP (R1, jit vs op by op); fixed by SLEEF's deterministic
     * variants (src/exec/vmath.h) */
    s = &all[n++];
    memset(s, 0, sizeof *s);
    s->name = "defect_g_trig_lanes";
    static const uint8_t defect_g[] = {
        0x00, 0x00, 0x00, 0x18, 0x01, 0x00, 0x01, 0xff, 0xff, 0xf7, 0xff, 0xff, 0xff, 0xff, 0x01,
        0x34, 0x35, 0x37, 0x62, 0x64, 0x39, 0x32, 0x30, 0x64, 0x37, 0x31, 0x34, 0x34, 0x66, 0x36,
        0x35, 0x36, 0x32, 0x38, 0x31, 0x62, 0x37, 0x64, 0x36, 0x36, 0x63, 0x65, 0x38, 0x38, 0x34,
        0x30, 0x39, 0x31, 0x30, 0x64, 0x38, 0x39, 0x62, 0x65, 0x66, 0x32, 0x31, 0x30, 0x38, 0x61,
        0x37, 0x34, 0x65, 0x34, 0x38, 0x33, 0x63, 0x39, 0x62, 0x39, 0x38, 0x61, 0x35, 0x31, 0x32,
        0x35, 0x33, 0x31, 0x61, 0x00, 0x00, 0x00, 0x00, 0x18, 0xfa, 0x00,
    };
    for (size_t i = 0; i < sizeof defect_g; i++) {
        nbs_put(s, 1, defect_g[i]);
    }

    /* (h) a mean over the rows of a product (v7 @ iota f32[4,4]) feeding a loop: the jitted
     * program made it as the product of the rows' sum (the optimizer's row-sum rewrite,
     * docs/semantics.md section 9: the same to rounding), op by op it was summed as traced,
     * an ULP apart (R1). As it was found (libFuzzer's bytes): the decoder now sums such a
     * value over its last axis (nbp_rowsum_product) */
    s = &all[n++];
    memset(s, 0, sizeof *s);
    s->name = "defect_h_rowsum_product";
    static const uint8_t defect_h[] = {
        0x00, 0x00, 0x00, 0x15, 0x24, 0x00, 0x02, 0x02, 0x03, 0x00, 0x04, 0x02, 0x02,
        0x02, 0x08, 0x01, 0xe4, 0xe4, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xe4, 0xe4, 0xe4, 0xe4, 0xe4, 0xe4,
        0xe4, 0xe4, 0xe4, 0x01, 0x03, 0x00, 0x1c, 0x04, 0x03, 0x04, 0x03, 0x01, 0x1c,
        0x03, 0x02, 0x6e, 0x62, 0x5f, 0x6c, 0x6f, 0x67, 0x73, 0x75, 0x6d, 0x65, 0x78,
        0x70, 0x62, 0x5f, 0x74, 0x61, 0x6b, 0x65, 0x03, 0x01, 0x1c, 0x24, 0x06, 0x00,
    };
    for (size_t i = 0; i < sizeof defect_h; i++) {
        nbs_put(s, 1, defect_h[i]);
    }

    /* loops for reverse mode: fori checkpointed, while bounded, cond, switch, a call of a
     * non-inlined jit; f64 so the Hessian is checked too */
    s = &all[n++];
    nbs_header(s, "loops_grad_f64", 0x00, 27, 2);
    nbs_in(s, D_F64, 1, 3, 0, 0, K_PARAM, L_RANDOM);
    nbs_in(s, D_F64, 2, 2, 3, 0, K_PARAM, L_RANDOM);
    nbs_loop(s, nbs_find(nbs_want_fori, (int[]){1, 4}), nbs_k(1, 2, 1), nbs_ms(0), 0x1b, 0x0c);
    nbs_put(s, 1, 1); /* v2 = fori(v0) */
    nbs_loop(s, nbs_find(nbs_want_while, (int[]){3}), nbs_k(2, 0, 1), nbs_ms(6), 0x15, 0x04);
    nbs_put(s, 1, 1); /* v3, v4 = while(v1) */
    nbs_loop(s, LP_COND, nbs_k(0, 0, 1), 0, 0x6e, 0x0b);
    nbs_put(s, 2, 3, 2); /* v5 = cond(sum(v1) > 0, v2) */
    nbs_loop(s, LP_SWITCH, nbs_k(0, 0, 3), 0, 0x39, 0x1a);
    nbs_put(s, 2, 0, 3); /* v6 = switch(sum(v5), v3?) */
    nbs_loop(s, nbs_find(nbs_want_call, (int[]){1}), 0, 0, 0x05, 0x1a);
    nbs_put(s, 1, 0); /* v7 = call(jit, v6) */
    nbs_loop(s, nbs_find(nbs_want_call, (int[]){0}), 0, 0, 0x06, 0x03);
    nbs_put(s, 1, 0); /* v8 = call(inlined, v7) */
    nbs_loop(s, nbs_find(nbs_want_scan, (int[]){0, 0}), nbs_k(1, 1, 1), 0, 0x2d, 0x21);
    nbs_put(s, 2, 0, 4); /* v9, v10 = scan(v8, xs v?) */

    /* random numbers: every sampler, an inline key and a key argument */
    s = &all[n++];
    nbs_header(s, "rng", 0x00, 28, 2);
    nbs_in(s, D_I32, 1, 2, 0, 0, K_PARAM, L_SPECIAL);
    nbs_in(s, D_F32, 1, 3, 0, 0, K_PARAM, L_RANDOM);
    for (int c = 0; c < 8; c++) {
        /* sampler c; bit 3: the key is v0 (for even c) */
        int sb = c | ((c % 2 == 0) ? 8 : 0);
        nbs_put(s, 2, OP_RNG, sb);
        if (sb & 8) {
            nbs_put(s, 1, 0xff - 1 - c); /* the i32[2] input, counting back (wraps) */
        }
        nbs_put(s, 6, 17 + c, 1 | 2 << 1, 2, 3, c, c);
        if (c == 7) {
            nbs_put(s, 1, 200); /* fold_in's data */
        }
    }
    nbs_binary(s, B_ADD, 0, 0);

    /* a smooth f64 program for R3 and R4: tanh, products, a matmul, logsumexp */
    s = &all[n++];
    nbs_header(s, "hessian_f64", 0x00, 29, 2);
    nbs_in(s, D_F64, 1, 3, 0, 0, K_PARAM, L_RANDOM);
    nbs_in(s, D_F64, 2, 3, 2, 0, K_PARAM, L_RANDOM);
    nbs_unary(s, U_TANH, 1);                        /* v2 = tanh(v0) */
    nbs_binary(s, B_MUL, 0, 1);                     /* v3 = v2 * v0 */
    nbs_put(s, 4, OP_MATMUL, 0, 0, 2);              /* v4 = v3 @ v1 */
    nbs_unary(s, U_SIN, 0);                         /* v5 = sin(v4) */
    nbs_reduce(s, R_LSE, 0, 0, false, true, false); /* v6 = logsumexp(v5) */
    nbs_binary(s, B_DIV, 0, 0);                     /* v7 = v6 / v6 */
    nbs_unary(s, U_SOFTPLUS, 4);                    /* v8 = softplus(v3) */

    /* R7: an allocation failing while a program with a loop, a matmul and a reduction is
     * traced, compiled or run */
    s = &all[n++];
    nbs_header(s, "alloc_failure", F_OOM | F_NO_GRAD, 35, 2);
    nbs_in(s, D_F64, 2, 2, 3, 0, K_PARAM, L_RANDOM);
    nbs_in(s, D_F32, 1, 4, 0, 0, K_CONST, L_SOME);
    nbs_put(s, 4, OP_MATMUL, 4, 1, 4); /* v2 = v0 @ iota([3,4]) */
    nbs_reduce(s, R_LSE, 0, 0x2, true, false, false);
    nbs_loop(s, nbs_find(nbs_want_fori, (int[]){0, 3}), nbs_k(1, 1, 1), nbs_ms(0), 0x1b, 0x0c);
    nbs_put(s, 1, 0);
    nbs_unary(s, U_TANH, 2);

    /* R5: frozen, int, static and null leaves; a constant input */
    s = &all[n++];
    nbs_header(s, "grad_structure", F_STATIC | F_NULL, 30, 4);
    nbs_in(s, D_F32, 1, 2, 0, 0, K_FROZEN, L_RANDOM);
    nbs_in(s, D_I32, 1, 2, 0, 0, K_PARAM, L_SMALLINT);
    nbs_in(s, D_F64, 1, 2, 0, 0, K_PARAM, L_RANDOM);
    nbs_in(s, D_F64, 1, 2, 0, 0, K_CONST, L_RANDOM);
    nbs_binary(s, B_MUL, 0, 1);       /* v4 = v3 * v2 */
    nbs_put(s, 3, OP_CAST, 5, C_F64); /* v5 = f64(v0) */
    nbs_binary(s, B_ADD, 1, 0);       /* v6 = v4 + v5 */
    nbs_put(s, 3, OP_CAST, 5, C_F64); /* v7 = f64(v1) */
    nbs_binary(s, B_MUL, 1, 0);       /* v8 = v6 * v7 */

    /* empty arrays through every kind of op */
    s = &all[n++];
    nbs_header(s, "empty_arrays", 0x00, 31, 2);
    nbs_in(s, D_F32, 2, 0, 3, 0, K_PARAM, L_RANDOM);
    nbs_in(s, D_F64, 1, 0, 0, 0, K_PARAM, L_RANDOM);
    nbs_reduce(s, R_SUM, 1, 0x1, false, false, false); /* v2 = sum(v0, [0]) */
    nbs_put(s, 4, OP_MATMUL, 4, 2, 1);                 /* v3 = v0 @ iota([3,1]) */
    nbs_put(s, 4, OP_SOFT, 0, 3, 0);                   /* v4 = softmax(v0, 0) */
    nbs_put(s, 5, OP_PAD, 4, 0x05, 0x05, S_NAN);       /* v5 = pad(v0, NaN) */
    nbs_reduce(s, R_MEAN, 5, 0, false, true, false);   /* v6 = mean(v1) (0/0) */
    nbs_put(s, 4, OP_MATMUL, 3, 6, 0);                 /* v7 = dot(v1, v1) */

    /* grad bits at the special inputs (no tolerance checks there) */
    s = &all[n++];
    nbs_header(s, "grad_at_specials", F_SPECIAL, 32, 2);
    nbs_in(s, D_F64, 1, 5, 0, 0, K_PARAM, L_SPECIAL);
    nbs_in(s, D_F32, 1, 5, 0, 0, K_PARAM, L_SOME);
    nbs_unary(s, U_SQRT, 1);
    nbs_unary(s, U_LOG, 1);
    nbs_binary(s, B_POW, 3, 0);
    nbs_unary(s, U_RELU, 0);
    nbs_unary(s, U_ABS, 3);
    nbs_binary(s, B_MAX, 1, 0);

    /* int matmul overflow, i64 */
    s = &all[n++];
    nbs_header(s, "int_matmul_overflow", F_NO_GRAD, 33, 2);
    nbs_in(s, D_I64, 2, 3, 3, 0, K_PARAM, L_SPECIAL);
    nbs_in(s, D_I32, 3, 2, 3, 3, K_PARAM, L_SPECIAL);
    nbs_put(s, 4, OP_MATMUL, 0, 1, 0); /* v2 = v0 @ v0 */
    nbs_put(s, 4, OP_MATMUL, 0, 1, 0); /* v3 = v1 @ v1 */
    nbs_reduce(s, R_PROD, 0, 0, false, true, false);

    /* sources: iota, full, scalar_typed of every dtype, with out-of-range fills */
    s = &all[n++];
    nbs_header(s, "sources", 0x00, 34, 0);
    /* full: rank = byte % 4, dims = byte % 6, axis byte (rank > 0), fill byte */
    nbs_put(s, 6, OP_SOURCE, nbs_src(SRC_FULL, SD_I32), 1, 5, 0, S_2P32);    /* v0: i32[5] */
    nbs_put(s, 7, OP_SOURCE, nbs_src(SRC_FULL, SD_BOOL), 2, 2, 3, 0, S_NAN); /* v1: bool[2,3] */
    nbs_put(s, 3, OP_SOURCE, nbs_src(SRC_SCALAR, SD_I64), S_DBL_MAX);        /* v2: i64 */
    nbs_put(s, 3, OP_SOURCE, nbs_src(SRC_SCALAR, SD_F32), S_BIG_F32);        /* v3: f32 inf */
    nbs_put(s, 7, OP_SOURCE, nbs_src(SRC_IOTA, SD_F32), 1, 3, 4, 1, 0);      /* v4: f32[3,4] */
    nbs_binary(s, B_ADD, 0, 1);                                              /* v5 = v4 + v3 */
    nbs_put(s, 6, OP_SOURCE, nbs_src(SRC_FULL, SD_F64), 1, 3, 0, S_SNAN);    /* v6: f64[3] */
    nbs_unary(s, U_NEG, 0);                                                  /* v7 = -v6 */
    return n;
}

int nbp_write_seeds(const char *dir) {
    static nbs_seed all[NBS_MAX];
    int n = nbs_build(all);
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, all[i].name);
        FILE *f = fopen(path, "wb");
        if (f == NULL || fwrite(all[i].b, 1, all[i].n, f) != all[i].n) {
            fprintf(stderr, "nabla-fuzz: cannot write %s\n", path);
            if (f != NULL) {
                fclose(f);
            }
            return -1;
        }
        fclose(f);
    }
    return n;
}

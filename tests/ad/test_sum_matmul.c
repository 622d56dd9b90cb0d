/*
 * test_sum_matmul.c -- the sum-matmul pass (src/ad/passes.c): a row sum of a product,
 * sum(op(a) @ op(b), axis 0), is made as the product of the row sum, and a row sum of adds
 * and subs is split over them down to such a product. Checked: which graphs it rewrites
 * (the optimized IR then has no product with as many rows as a), what it leaves alone,
 * results against a double reference, the same bits at 1 and 2 threads and with
 * debug_nans (the debugging pipeline runs the pass too), the same bits however the
 * computation is put together (the product also returned, an add also returned, a bounded
 * or checkpointed loop's gradient against the unrolled loop's), integers exact, and the
 * gradient it exists for: DeepOBS's noisy quadratic, where the gradient of theta is the
 * row sum of (c r) H^T.
 */
#include "nbtest.h"

#include <math.h>
#include <stdlib.h>

/* A leaf of dtype dt and the given shape, values in [-1, 1) from seed. */
static nb_tree *sm_leaf(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape, uint32_t seed) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, dt, rank, shape, &a));
    for (int64_t i = 0; i < nb_array_size(a); i++) {
        seed = seed * 1664525u + 1013904223u;
        double v = (double)(seed >> 8) / 8388608.0 - 1.0;
        if (dt == NB_DTYPE_F32) {
            ((float *)nb_array_data(a))[i] = (float)v;
        } else if (dt == NB_DTYPE_I32) {
            ((int32_t *)nb_array_data(a))[i] = (int32_t)(seed >> 28) - 8; /* [-8, 8) */
        } else {
            ((double *)nb_array_data(a))[i] = v;
        }
    }
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

static double sm_get(const nb_array *a, int64_t i) {
    if (nb_array_dtype(a) == NB_DTYPE_I32) {
        return ((const int32_t *)nb_array_data(a))[i];
    }
    return nb_array_dtype(a) == NB_DTYPE_F32 ? (double)((const float *)nb_array_data(a))[i]
                                             : ((const double *)nb_array_data(a))[i];
}

static const nb_array *sm_arg(const nb_tree *args, int i) {
    return nb_tree_get_array(nb_tree_child(args, i));
}

/* The products in f's optimized IR on args: how many, and how many have `rows` rows (the
 * first dim of their result). */
static void sm_count(nb_fn *f, const nb_tree *args, int64_t rows, int *n_mm, int *n_rows) {
    static char ir[1 << 16];
    NBT_OK(nb_tree_ctx(args), nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    *n_mm = *n_rows = 0;
    char want[64];
    snprintf(want, sizeof want, "[%lld,", (long long)rows);
    for (const char *p = strstr(ir, "= matmul "); p != NULL; p = strstr(p + 1, "= matmul ")) {
        const char *bol = p;
        while (bol > ir && bol[-1] != '\n') {
            bol--;
        }
        const char *br = strchr(bol, '[');
        (*n_mm)++;
        *n_rows += br != NULL && br < p && strncmp(br, want, strlen(want)) == 0;
    }
}

/* ---- bodies: args (a [n, k] (or [k, n] for the transposed one), b [k, m], c [n, m]) ---- */

static nb_status body_rows(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    return nb_return(nb_sum(p, (int[]){0}, 1, false), out);
}

static nb_status body_rows_keep(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    (void)self;
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    return nb_return(nb_sum(p, (int[]){0}, 1, true), out);
}

static nb_status body_rows_t(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *at = nb_transpose(nb_get(tr, args, "[0]"), (const int[]){1, 0});
    nb_var *p = nb_matmul(at, nb_get(tr, args, "[1]"));
    return nb_return(nb_sum(p, (int[]){0}, 1, false), out);
}

/* sum(c + a @ b) */
static nb_status body_add(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    return nb_return(nb_sum(nb_add(nb_get(tr, args, "[2]"), p), (int[]){0}, 1, false), out);
}

/* sum(c - (2 c + a @ b)): a sub over an add, the product two levels down */
static nb_status body_nested(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *c = nb_get(tr, args, "[2]");
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    nb_var *in = nb_add(nb_mul(nb_scalar(tr, 2.0), c), p);
    return nb_return(nb_sum(nb_sub(c, in), (int[]){0}, 1, false), out);
}

/* sum(a @ b^T - c): b read transposed, a sub at the top */
static nb_status body_bt_sub(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *bt = nb_transpose(nb_get(tr, args, "[1]"), (int[]){1, 0});
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), bt);
    return nb_return(nb_sum(nb_sub(p, nb_get(tr, args, "[2]")), (int[]){0}, 1, false), out);
}

/* ---- read elsewhere too: rewritten all the same ------------------------------------- */

/* (sum(a @ b, axis 0), a @ b): the product also returned */
static nb_status body_prod_out(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    nb_var *s = nb_sum(p, (int[]){0}, 1, false);
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(s), nb_leaf(p)}, out);
}

/* (sum(c + a @ b, axis 0), c + a @ b): the add also returned */
static nb_status body_add_out(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    (void)self;
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    nb_var *s = nb_add(nb_get(tr, args, "[2]"), p);
    nb_var *r = nb_sum(s, (int[]){0}, 1, false);
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(r), nb_leaf(s)}, out);
}

/* the add also read by the output: sum(c + a @ b) kept as a row and added back */
static nb_status body_add_read(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    nb_var *s = nb_add(nb_get(tr, args, "[2]"), p);
    return nb_return(nb_add(s, nb_sum(s, (int[]){0}, 1, true)), out);
}

/* left alone: a sum over the columns */
static nb_status body_cols(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    return nb_return(nb_sum(p, (int[]){1}, 1, false), out);
}

/* left alone: an elementwise product on the way (sum(c * (a @ b)) is not sum(c) (..)) */
static nb_status body_mul(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    return nb_return(nb_sum(nb_mul(nb_get(tr, args, "[2]"), p), (int[]){0}, 1, false), out);
}

/* ---- rewritten: IR, values, threads, debugging ------------------------------------ */

typedef struct sm_case {
    const char *name;
    nb_fn_body body;
    bool trans_a;
    int c_sign;   /* the reference adds c_sign * c to each row of a @ b (c read when != 0) */
    int p_sign;   /* ... and p_sign * a @ b */
    bool trans_b; /* b is [m, k], read transposed */
} sm_case;

static const sm_case SM_CASES[] = {
    {"rows", body_rows, false, 0, 1, false},
    {"rows_keepdims", body_rows_keep, false, 0, 1, false},
    {"rows_transposed", body_rows_t, true, 0, 1, false},
    {"add", body_add, false, 1, 1, false},
    {"nested", body_nested, false, -1, -1, false},
    {"b_transposed_sub", body_bt_sub, false, -1, 1, true},
};

static nb_tree *sm_args(nb_ctx *ctx, nb_dtype dt, bool trans_a, bool trans_b, int64_t n, int64_t k,
                        int64_t m) {
    int64_t sa[2] = {trans_a ? k : n, trans_a ? n : k}, sb[2] = {trans_b ? m : k, trans_b ? k : m};
    nb_tree *l[3] = {sm_leaf(ctx, dt, 2, sa, 11), sm_leaf(ctx, dt, 2, sb, 12),
                     sm_leaf(ctx, dt, 2, (int64_t[]){n, m}, 13)};
    nb_tree *args = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 3, l, &args));
    for (int i = 0; i < 3; i++) {
        nb_tree_destroy(l[i]);
    }
    return args;
}

/* out[j] against sum_i (c_sign c_ij + p_sign (a b)_ij) in double, within rel times the sum
 * of the terms' magnitudes */
static void sm_check(const sm_case *cs, const nb_tree *args, const nb_array *out, int64_t n,
                     int64_t k, int64_t m, double rel) {
    const nb_array *a = sm_arg(args, 0), *b = sm_arg(args, 1), *c = sm_arg(args, 2);
    NBT_EQ_I64(nb_array_size(out), m);
    for (int64_t j = 0; j < m; j++) {
        double want = 0, mag = 0;
        for (int64_t i = 0; i < n; i++) {
            for (int64_t p = 0; p < k; p++) {
                double t = sm_get(a, cs->trans_a ? p * n + i : i * k + p) *
                           sm_get(b, cs->trans_b ? j * k + p : p * m + j);
                want += cs->p_sign * t;
                mag += fabs(t);
            }
            want += cs->c_sign * sm_get(c, i * m + j);
            mag += fabs(sm_get(c, i * m + j));
        }
        double got = sm_get(out, j);
        if (!(fabs(got - want) <= rel * mag)) {
            fail_msg("%s [%lld]: got %.17g, want %.17g", cs->name, (long long)j, got, want);
        }
    }
}

static void test_sum_matmul_rewritten(void **state) {
    (void)state;
    const int64_t n = 37, k = 23, m = 19;
    for (int dti = 0; dti < 2; dti++) {
        nb_dtype dt = dti ? NB_DTYPE_F64 : NB_DTYPE_F32;
        for (size_t ci = 0; ci < sizeof SM_CASES / sizeof SM_CASES[0]; ci++) {
            const sm_case *cs = &SM_CASES[ci];
            nb_tree *res[3] = {NULL, NULL, NULL};
            nb_ctx *ctx[3];
            for (int t = 0; t < 3; t++) {
                nb_ctx_opts o = nb_ctx_opts_default();
                o.n_threads = t == 1 ? 2 : 1;
                NBT_OK(NULL, nb_ctx_create(&o, &ctx[t]));
                nb_tree *args = sm_args(ctx[t], dt, cs->trans_a, cs->trans_b, n, k, m);
                nb_fn *f = NULL, *j = NULL;
                NBT_OK(ctx[t], nb_fn_create(ctx[t], cs->name, cs->body, NULL, &f));
                nb_jit_opts jo = nb_jit_opts_default();
                jo.debug_nans = t == 2; /* the debugging pipeline: no fusion, every op checked */
                NBT_OK(ctx[t], nb_jit(f, &jo, &j));
                int n_mm = 0, n_rows = 0;
                sm_count(j, args, n, &n_mm, &n_rows);
                NBT_EQ_I64(n_mm, 1);   /* one product, ... */
                NBT_EQ_I64(n_rows, 0); /* ... of one row, not n */
                int n_one = 0;
                sm_count(j, args, 1, &n_mm, &n_one);
                NBT_EQ_I64(n_one, 1);
                NBT_OK(ctx[t], nb_fn_call(j, args, &res[t]));
                sm_check(cs, args, nb_tree_get_array(res[t]), n, k, m,
                         dt == NB_DTYPE_F32 ? 1e-6 : 1e-14);
                nb_fn_destroy(j);
                nb_fn_destroy(f);
                nb_tree_destroy(args);
            }
            for (int t = 1; t < 3; t++) {
                const nb_array *r0 = nb_tree_get_array(res[0]), *rt = nb_tree_get_array(res[t]);
                NBT_EQ_I64(nb_array_nbytes(r0), nb_array_nbytes(rt));
                NBT_TRUE(memcmp(nb_array_data(r0), nb_array_data(rt), nb_array_nbytes(r0)) == 0);
            }
            for (int t = 0; t < 3; t++) {
                nb_tree_destroy(res[t]);
                nbt_assert_no_live(ctx[t]);
                nb_ctx_destroy(ctx[t]);
            }
        }
    }
}

/* ---- left alone ---------------------------------------------------------------------- */

static void test_sum_matmul_not_rewritten(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const int64_t n = 9, k = 5, m = 7;
    nb_tree *args = sm_args(ctx, NB_DTYPE_F64, false, false, n, k, m);
    const nb_fn_body bodies[] = {body_cols, body_mul};
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        nb_fn *f = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "kept", bodies[i], NULL, &f));
        int n_mm = 0, n_rows = 0;
        sm_count(f, args, n, &n_mm, &n_rows);
        NBT_EQ_I64(n_mm, 1);
        NBT_EQ_I64(n_rows, 1); /* the product of all n rows */
        nb_fn_destroy(f);
    }
    /* one row: nothing to gain, left alone */
    nb_tree *one = sm_args(ctx, NB_DTYPE_F64, false, false, 1, k, m);
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "one_row", body_rows, NULL, &f));
    int n_mm = 0, n_one = 0;
    sm_count(f, one, 1, &n_mm, &n_one);
    NBT_EQ_I64(n_mm, 1);
    NBT_EQ_I64(n_one, 1);
    static char ir[1 << 14];
    NBT_OK(ctx, nb_fn_format_ir(f, one, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    NBT_TRUE(strstr(ir, "keepdims=true") == NULL); /* no row sum of a: the sum is as traced */
    nb_fn_destroy(f);
    nb_tree_destroy(one);
    nb_tree_destroy(args);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- read elsewhere too ---------------------------------------------------------------- */

/* f's output (its leaf `path`, "" for a single array) on args */
static nb_tree *sm_run(nb_fn *f, const nb_tree *args) {
    nb_tree *r = NULL;
    NBT_OK(nb_tree_ctx(args), nb_fn_call(f, args, &r));
    return r;
}

static bool sm_same_bits(const nb_array *a, const nb_array *b) {
    return nb_array_nbytes(a) == nb_array_nbytes(b) &&
           memcmp(nb_array_data(a), nb_array_data(b), nb_array_nbytes(a)) == 0;
}

/* A sum whose product or add is also returned is made as the one read only by the sum:
 * the same bits (the rewrite never asks how many read a value) */
static void test_sum_matmul_any_readers(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const int64_t n = 37, k = 23, m = 19;
    for (int dti = 0; dti < 2; dti++) {
        nb_dtype dt = dti ? NB_DTYPE_F64 : NB_DTYPE_F32;
        nb_tree *args = sm_args(ctx, dt, false, false, n, k, m);
        const nb_fn_body alone[2] = {body_rows, body_add},
                         shared[2] = {body_prod_out, body_add_out};
        for (int c = 0; c < 2; c++) {
            nb_fn *fa = NULL, *fs = NULL;
            NBT_OK(ctx, nb_fn_create(ctx, "alone", alone[c], NULL, &fa));
            NBT_OK(ctx, nb_fn_create(ctx, "shared", shared[c], NULL, &fs));
            int n_mm = 0, n_rows = 0, n_one = 0;
            sm_count(fs, args, n, &n_mm, &n_rows);
            sm_count(fs, args, 1, &n_mm, &n_one);
            NBT_EQ_I64(n_mm, 2);   /* the product, kept for its other reader, ... */
            NBT_EQ_I64(n_rows, 1); /* ... of n rows */
            NBT_EQ_I64(n_one, 1);  /* and the sum's, of one */
            nb_tree *ra = sm_run(fa, args), *rs = sm_run(fs, args);
            NBT_TRUE(sm_same_bits(nb_tree_get_array(ra), nb_tree_get_array(nb_tree_child(rs, 0))));
            sm_check(&SM_CASES[c == 0 ? 0 : 3], args, nb_tree_get_array(nb_tree_child(rs, 0)), n, k,
                     m, dt == NB_DTYPE_F32 ? 1e-6 : 1e-14);
            nb_tree_destroy(ra);
            nb_tree_destroy(rs);
            nb_fn_destroy(fa);
            nb_fn_destroy(fs);
        }
        /* s + sum(s) with s = c + a @ b: every row of the result is s's row plus the sum */
        nb_fn *f = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "add_read", body_add_read, NULL, &f));
        int n_mm = 0, n_one = 0;
        sm_count(f, args, 1, &n_mm, &n_one);
        NBT_EQ_I64(n_one, 1);
        nb_tree *r = sm_run(f, args);
        const nb_array *a = sm_arg(args, 0), *b = sm_arg(args, 1), *cc = sm_arg(args, 2);
        const nb_array *got = nb_tree_get_array(r);
        for (int64_t j = 0; j < m; j++) {
            double col = 0, mag = 0;
            double *s = malloc((size_t)n * sizeof(double));
            for (int64_t i = 0; i < n; i++) {
                s[i] = sm_get(cc, i * m + j);
                mag += fabs(s[i]);
                for (int64_t p = 0; p < k; p++) {
                    s[i] += sm_get(a, i * k + p) * sm_get(b, p * m + j);
                    mag += fabs(sm_get(a, i * k + p) * sm_get(b, p * m + j));
                }
                col += s[i];
            }
            for (int64_t i = 0; i < n; i++) {
                double want = s[i] + col, g = sm_get(got, i * m + j);
                if (!(fabs(g - want) <= (dt == NB_DTYPE_F32 ? 1e-6 : 1e-14) * mag)) {
                    fail_msg("add_read [%lld, %lld]: got %.17g, want %.17g", (long long)i,
                             (long long)j, g, want);
                }
            }
            free(s);
        }
        nb_tree_destroy(r);
        nb_fn_destroy(f);
        nb_tree_destroy(args);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Integers: the rewrite is exact (a sum of products of integers in any order) */
static void test_sum_matmul_integers(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const int64_t n = 11, k = 6, m = 5;
    for (size_t ci = 0; ci < sizeof SM_CASES / sizeof SM_CASES[0]; ci++) {
        const sm_case *cs = &SM_CASES[ci];
        nb_tree *args = sm_args(ctx, NB_DTYPE_I32, cs->trans_a, cs->trans_b, n, k, m);
        nb_fn *f = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, cs->name, cs->body, NULL, &f));
        int n_mm = 0, n_rows = 0;
        sm_count(f, args, n, &n_mm, &n_rows);
        NBT_EQ_I64(n_rows, 0);
        nb_tree *r = sm_run(f, args);
        NBT_EQ_I64(nb_array_dtype(nb_tree_get_array(r)), NB_DTYPE_I32);
        sm_check(cs, args, nb_tree_get_array(r), n, k, m, 0.0);
        nb_tree_destroy(r);
        nb_fn_destroy(f);
        nb_tree_destroy(args);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- a loop's gradient against the unrolled loop's ------------------------------------ */

enum { SM_STEPS = 3 };

/* s -> tanh((s + b) @ w): the gradient of b is a row sum of a product the reverse sweep
 * also returns (the carry's cotangent) */
static nb_var *sm_step(nb_var *s, nb_var *b, nb_var *w) {
    return nb_tanh(nb_matmul(nb_add(s, b), w));
}

static nb_status body_step(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    return nb_return(
        sm_step(nb_get(tr, args, "[1]"), nb_get(tr, self, "[0]"), nb_get(tr, self, "[1]")), out);
}

/* args ((b [k], w [k, k]), s0 [n, k]); self: a bool, checkpointed (or bounded) */
static nb_status body_loop(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_fn *bf = NULL;
    nb_status st = nb_fn_create(nb_trace_ctx(tr), "step", body_step, nb_tree_child(args, 0), &bf);
    if (st != NB_OK) {
        return st;
    }
    bool checkpointed = false;
    st = nb_tree_get_bool(self, &checkpointed);
    if (st != NB_OK) {
        nb_fn_destroy(bf);
        return st;
    }
    nb_loop_opts o = nb_loop_opts_default();
    o.kind = checkpointed ? NB_LOOP_CHECKPOINTED : NB_LOOP_BOUNDED;
    o.max_steps = SM_STEPS;
    o.checkpoints = 1;
    const nb_tree *r = nb_fori_loop(tr, 0, SM_STEPS, bf, nb_tree_child(args, 1), &o);
    nb_fn_destroy(bf);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    return nb_return(nb_sum(nb_var_of(tr, r), NULL, 0, false), out);
}

static nb_status body_unrolled(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_var *s = nb_get(tr, args, "[1]");
    for (int i = 0; i < SM_STEPS; i++) {
        s = sm_step(s, nb_get(tr, args, "[0][0]"), nb_get(tr, args, "[0][1]"));
    }
    return nb_return(nb_sum(s, NULL, 0, false), out);
}

static void test_sum_matmul_loop_unrolled(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const int64_t n = 64, k = 24;
    for (int dti = 0; dti < 2; dti++) {
        nb_dtype dt = dti ? NB_DTYPE_F64 : NB_DTYPE_F32;
        nb_tree *bw[2] = {sm_leaf(ctx, dt, 1, &k, 31), sm_leaf(ctx, dt, 2, (int64_t[]){k, k}, 32)};
        nb_tree *params = NULL, *args = NULL, *s0 = sm_leaf(ctx, dt, 2, (int64_t[]){n, k}, 33);
        NBT_OK(ctx, nb_tree_tuple(ctx, 2, bw, &params));
        NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){params, s0}, &args));
        nb_tree *g[3] = {NULL, NULL, NULL};
        for (int v = 0; v < 3; v++) {
            nb_tree *self = NULL;
            if (v < 2) {
                NBT_OK(ctx, nb_tree_bool(ctx, v == 1, &self));
            }
            nb_fn *f = NULL, *df = NULL;
            NBT_OK(ctx, nb_fn_create(ctx, v < 2 ? "loop" : "unrolled",
                                     v < 2 ? body_loop : body_unrolled, self, &f));
            NBT_OK(ctx, nb_grad(f, NULL, &df));
            g[v] = sm_run(df, args);
            nb_fn_destroy(df);
            nb_fn_destroy(f);
            nb_tree_destroy(self);
        }
        for (int v = 0; v < 2; v++) {
            for (int leaf = 0; leaf < 2; leaf++) {
                const nb_array *lv = nb_tree_get_array(nb_tree_child(g[v], leaf));
                const nb_array *lu = nb_tree_get_array(nb_tree_child(g[2], leaf));
                if (!sm_same_bits(lv, lu)) {
                    fail_msg("%s loop, %s: the gradient of %s differs from the unrolled loop's",
                             v ? "checkpointed" : "bounded", dti ? "f64" : "f32", leaf ? "w" : "b");
                }
            }
        }
        for (int v = 0; v < 3; v++) {
            nb_tree_destroy(g[v]);
        }
        for (int i = 0; i < 2; i++) {
            nb_tree_destroy(bw[i]);
        }
        nb_tree_destroy(params);
        nb_tree_destroy(s0);
        nb_tree_destroy(args);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- the gradient it is for: the noisy quadratic -------------------------------------- */

/* args (theta [d], x [n, d], h [d, d]): 0.5 mean_i (theta - x_i)^T H (theta - x_i) */
static nb_status body_nq(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *r = nb_sub(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    nb_var *rh = nb_matmul(r, nb_get(tr, args, "[2]"));
    nb_var *q = nb_sum(nb_mul(rh, r), (int[]){1}, 1, false);
    return nb_return(nb_mul(nb_scalar(tr, 0.5), nb_mean(q, NULL, 0, false)), out);
}

static void test_sum_matmul_noisy_quadratic(void **state) {
    (void)state;
    const int64_t n = 64, d = 30;
    nb_tree *g[2] = {NULL, NULL};
    nb_ctx *ctx[2];
    for (int t = 0; t < 2; t++) {
        nb_ctx_opts o = nb_ctx_opts_default();
        o.n_threads = t + 1;
        NBT_OK(NULL, nb_ctx_create(&o, &ctx[t]));
        nb_tree *l[3] = {sm_leaf(ctx[t], NB_DTYPE_F64, 1, &d, 21),
                         sm_leaf(ctx[t], NB_DTYPE_F64, 2, (int64_t[]){n, d}, 22),
                         sm_leaf(ctx[t], NB_DTYPE_F64, 2, (int64_t[]){d, d}, 23)};
        nb_tree *args = NULL;
        NBT_OK(ctx[t], nb_tree_tuple(ctx[t], 3, l, &args));
        for (int i = 0; i < 3; i++) {
            nb_tree_destroy(l[i]);
        }
        nb_fn *f = NULL, *df = NULL;
        NBT_OK(ctx[t], nb_fn_create(ctx[t], "nq", body_nq, NULL, &f));
        NBT_OK(ctx[t], nb_grad(f, NULL, &df));
        /* the forward's product of n rows stays; the gradient's is of one row */
        int n_mm = 0, n_rows = 0, n_one = 0;
        sm_count(df, args, n, &n_mm, &n_rows);
        sm_count(df, args, 1, &n_mm, &n_one);
        NBT_EQ_I64(n_mm, 2);
        NBT_EQ_I64(n_rows, 1);
        NBT_EQ_I64(n_one, 1);
        NBT_OK(ctx[t], nb_fn_call(df, args, &g[t]));
        /* d/dtheta = (1 / n) sum_i 0.5 (H + H^T) (theta - x_i), in double */
        const nb_array *th = sm_arg(args, 0), *x = sm_arg(args, 1), *h = sm_arg(args, 2);
        const nb_array *gt = nb_tree_get_array(g[t]);
        for (int64_t j = 0; j < d; j++) {
            double want = 0, mag = 0;
            for (int64_t i = 0; i < n; i++) {
                for (int64_t p = 0; p < d; p++) {
                    double r = sm_get(th, p) - sm_get(x, i * d + p);
                    double term = 0.5 * (sm_get(h, j * d + p) + sm_get(h, p * d + j)) * r / n;
                    want += term;
                    mag += fabs(term);
                }
            }
            NBT_TRUE(fabs(sm_get(gt, j) - want) <= 1e-14 * mag);
        }
        nb_fn_destroy(df);
        nb_fn_destroy(f);
        nb_tree_destroy(args);
    }
    const nb_array *a = nb_tree_get_array(g[0]), *b = nb_tree_get_array(g[1]);
    NBT_TRUE(memcmp(nb_array_data(a), nb_array_data(b), nb_array_nbytes(a)) == 0);
    for (int t = 0; t < 2; t++) {
        nb_tree_destroy(g[t]);
        nbt_assert_no_live(ctx[t]);
        nb_ctx_destroy(ctx[t]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sum_matmul_rewritten),
        cmocka_unit_test(test_sum_matmul_not_rewritten),
        cmocka_unit_test(test_sum_matmul_any_readers),
        cmocka_unit_test(test_sum_matmul_integers),
        cmocka_unit_test(test_sum_matmul_loop_unrolled),
        cmocka_unit_test(test_sum_matmul_noisy_quadratic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

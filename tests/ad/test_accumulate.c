/*
 * test_accumulate.c -- the accumulate pass (src/ad/pass_accumulate.c) end to end: which
 * add(matmul(a, b), c) it turns into matmul(a, b, c) (the optimized IR shows the third
 * operand), what it leaves alone, and the results of the compiled functions -- exactly the
 * bits of the product and the add made separately, within tolerance of a double reference,
 * bit-identical at 1 and 2 threads. An accumulator read for the last time there is added
 * into in place where nabla's own loops make the product: no second buffer. The kernel
 * itself (in place or not, BLIS's gemm and gemv) is tested in test_ops_linalg.c.
 */
#include "nbtest.h"

#include "ad/ir.h"

#include <math.h>
#include <stdlib.h>

/* ---- helpers ------------------------------------------------------------------------ */

/* A leaf of dtype dt and the given shape, filled with values in [-1, 1) from seed. */
static nb_tree *ta_leaf(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape, uint32_t seed) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, dt, rank, shape, &a));
    for (int64_t i = 0; i < nb_array_size(a); i++) {
        seed = seed * 1664525u + 1013904223u;
        double v = (double)(seed >> 8) / 8388608.0 - 1.0;
        if (dt == NB_DTYPE_F32) {
            ((float *)nb_array_data(a))[i] = (float)v;
        } else {
            ((double *)nb_array_data(a))[i] = v;
        }
    }
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

static const nb_array *ta_arr(const nb_tree *args, int i) {
    return nb_tree_get_array(nb_tree_child(args, i));
}

static double ta_get(const nb_array *a, int64_t i) {
    return nb_array_dtype(a) == NB_DTYPE_F32 ? (double)((const float *)nb_array_data(a))[i]
                                             : ((const double *)nb_array_data(a))[i];
}

/* The number of matmul nodes in f's optimized IR on args, and how many of them have a third
 * operand (accumulate). */
static void ta_count(nb_fn *f, const nb_tree *args, int *n_mm, int *n_acc) {
    nb_ctx *ctx = nb_tree_ctx(args);
    static char ir[1 << 16];
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    *n_mm = *n_acc = 0;
    for (const char *p = strstr(ir, "= matmul "); p != NULL; p = strstr(p + 1, "= matmul ")) {
        const char *eol = strchr(p, '\n');
        int operands = 0;
        for (const char *q = p; q < eol; q++) {
            operands += *q == '%';
        }
        (*n_mm)++;
        *n_acc += operands == 3;
    }
}

/* ---- bodies ------------------------------------------------------------------------- */

/* args (a, b, c): a @ b + c */
static nb_status body_mm_add(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    return nb_return(nb_add(p, nb_get(tr, args, "[2]")), out);
}

/* args (a, b, c): c + a @ b */
static nb_status body_add_mm(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    return nb_return(nb_add(nb_get(tr, args, "[2]"), p), out);
}

/* args (at, b, c): transpose(at) @ b + c (the transpose is folded into the product) */
static nb_status body_mm_t_add(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_var *at = nb_transpose(nb_get(tr, args, "[0]"), (const int[]){1, 0});
    nb_var *p = nb_matmul(at, nb_get(tr, args, "[1]"));
    return nb_return(nb_add(p, nb_get(tr, args, "[2]")), out);
}

/* args (a, b, c): a @ b alone (c unused) */
static nb_status body_mm(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]")), out);
}

/* args (at, b, c): transpose(at) @ b alone */
static nb_status body_mm_t(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *at = nb_transpose(nb_get(tr, args, "[0]"), (const int[]){1, 0});
    return nb_return(nb_matmul(at, nb_get(tr, args, "[1]")), out);
}

/* args (g1, y1, g2, y2, g3, y3): g1 y1^T + g2 y2^T + g3 y3^T, the gradient of a weight used
 * three times (outer products of columns [m, 1] and rows [1, n]) */
static nb_status body_chain(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *s = NULL;
    for (int i = 0; i < 3; i++) {
        nb_var *p = nb_matmul(nb_get(tr, args, "[%d]", 2 * i), nb_get(tr, args, "[%d]", 2 * i + 1));
        s = s == NULL ? p : nb_add(s, p);
    }
    return nb_return(s, out);
}

/* args (a, b, x, y): tanh(a @ b + x @ y): the second product, read only there, is the
 * accumulator, and the sum is made in its buffer */
static nb_status body_inplace(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    (void)self;
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    nb_var *q = nb_matmul(nb_get(tr, args, "[2]"), nb_get(tr, args, "[3]"));
    return nb_return(nb_tanh(nb_add(p, q)), out);
}

/* args (a, b, bias): a @ b + bias[n] (broadcast: left alone) */
static nb_status body_bias(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    return nb_return(nb_add(p, nb_get(tr, args, "[2]")), out);
}

/* args (a, b, c): (a @ b + c) * (a @ b): the product is read twice (left alone) */
static nb_status body_twice(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    return nb_return(nb_mul(nb_add(p, nb_get(tr, args, "[2]")), p), out);
}

/* args (a, b, x, y): (a @ b + t) * t with t = tanh(x @ y): the accumulator is read again
 * after the add (left alone: its buffer could not be taken over) */
static nb_status body_c_reread(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_var *p = nb_matmul(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    nb_var *t = nb_tanh(nb_matmul(nb_get(tr, args, "[2]"), nb_get(tr, args, "[3]")));
    return nb_return(nb_mul(nb_add(p, t), t), out);
}

/* ---- a product accumulated: IR, values, threads, bits ------------------------------- */

typedef struct ta_shape {
    nb_dtype dt;
    int64_t m, k, n; /* n == 0: b is rank 1 [k] (the result [m]); m == 0: a is rank 1 [k] */
    bool trans_a;    /* a passed as [k, m] and transposed in the body */
} ta_shape;

/* The arguments (a, b, c) of shape s. */
static nb_tree *ta_args(nb_ctx *ctx, const ta_shape *s) {
    int64_t m = s->m, k = s->k, n = s->n;
    int64_t sa[2] = {s->trans_a ? k : m, s->trans_a ? m : k}, sb[2] = {k, n};
    int64_t sc[2] = {m != 0 ? m : n, n};
    nb_tree *a = m == 0 ? ta_leaf(ctx, s->dt, 1, &k, 1) : ta_leaf(ctx, s->dt, 2, sa, 1);
    nb_tree *b = n == 0 ? ta_leaf(ctx, s->dt, 1, &k, 2) : ta_leaf(ctx, s->dt, 2, sb, 2);
    int rc = (m != 0) + (n != 0);
    nb_tree *c = ta_leaf(ctx, s->dt, rc, rc == 2 ? sc : (m != 0 ? &m : &n), 3);
    nb_tree *args = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){a, b, c}, &args));
    nb_tree_destroy(a);
    nb_tree_destroy(b);
    nb_tree_destroy(c);
    return args;
}

/* out against c + a @ b in double: |got - ref| <= rel * (k max |a b| + |c|). */
static void ta_check(const ta_shape *s, const nb_tree *args, const nb_array *out) {
    const nb_array *a = ta_arr(args, 0), *b = ta_arr(args, 1), *c = ta_arr(args, 2);
    int64_t m = s->m ? s->m : 1, n = s->n ? s->n : 1, k = s->k;
    double rel = s->dt == NB_DTYPE_F32 ? 1e-5 : 1e-12;
    NBT_EQ_I64(nb_array_size(out), m * n);
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double sum = 0, mx = 0;
            for (int64_t p = 0; p < k; p++) {
                double t = ta_get(a, s->trans_a ? p * m + i : i * k + p) * ta_get(b, p * n + j);
                sum += t;
                mx = fabs(t) > mx ? fabs(t) : mx;
            }
            double cv = ta_get(c, i * n + j), got = ta_get(out, i * n + j);
            if (!(fabs(got - (sum + cv)) <= rel * ((double)k * mx + fabs(cv)))) {
                fail_msg("[%lld,%lld]: got %.17g, want %.17g", (long long)i, (long long)j, got,
                         sum + cv);
            }
        }
    }
}

/* One shape: the pass rewrites the add (either order), the result is right, the same bits at
 * 1 and 2 threads, and the bits of a @ b made alone plus c. */
static void ta_case(const ta_shape *s) {
    nb_ctx *ctx[2];
    nb_tree *res[2][2] = {{NULL, NULL}, {NULL, NULL}};
    for (int t = 0; t < 2; t++) {
        nb_ctx_opts o = nb_ctx_opts_default();
        o.n_threads = t + 1;
        NBT_OK(NULL, nb_ctx_create(&o, &ctx[t]));
        nb_tree *args = ta_args(ctx[t], s);
        for (int order = 0; order < 2; order++) {
            nb_fn_body body = s->trans_a ? body_mm_t_add : order ? body_add_mm : body_mm_add;
            nb_fn *f = NULL;
            NBT_OK(ctx[t], nb_fn_create(ctx[t], "acc", body, NULL, &f));
            int n_mm = 0, n_acc = 0;
            ta_count(f, args, &n_mm, &n_acc);
            NBT_EQ_I64(n_mm, 1);
            NBT_EQ_I64(n_acc, 1);
            NBT_OK(ctx[t], nb_fn_call(f, args, &res[t][order]));
            ta_check(s, args, nb_tree_get_array(res[t][order]));
            nb_fn_destroy(f);
        }
        /* either order: the same number */
        const nb_array *r0 = nb_tree_get_array(res[t][0]), *r1 = nb_tree_get_array(res[t][1]);
        NBT_TRUE(memcmp(nb_array_data(r0), nb_array_data(r1), nb_array_nbytes(r0)) == 0);
        {
            nb_fn *f = NULL;
            nb_tree *p = NULL;
            NBT_OK(ctx[t],
                   nb_fn_create(ctx[t], "product", s->trans_a ? body_mm_t : body_mm, NULL, &f));
            nb_status st = nb_fn_call(f, args, &p);
            if (st != NB_OK) {
                fail_msg("%s", nb_ctx_errmsg(ctx[t]));
            }
            const nb_array *pa = nb_tree_get_array(p), *c = ta_arr(args, 2);
            for (int64_t i = 0; i < nb_array_size(pa); i++) {
                bool same;
                if (s->dt == NB_DTYPE_F32) {
                    float want = ((const float *)nb_array_data(pa))[i] +
                                 ((const float *)nb_array_data(c))[i];
                    same = memcmp(&want, (const float *)nb_array_data(r0) + i, 4) == 0;
                } else {
                    double want = ((const double *)nb_array_data(pa))[i] +
                                  ((const double *)nb_array_data(c))[i];
                    same = memcmp(&want, (const double *)nb_array_data(r0) + i, 8) == 0;
                }
                if (!same) {
                    fail_msg("element %lld: not the bits of the product plus c", (long long)i);
                }
            }
            nb_tree_destroy(p);
            nb_fn_destroy(f);
        }
        nb_tree_destroy(args);
    }
    const nb_array *x = nb_tree_get_array(res[0][0]), *y = nb_tree_get_array(res[1][0]);
    if (memcmp(nb_array_data(x), nb_array_data(y), nb_array_nbytes(x)) != 0) {
        fail_msg("%s m=%lld k=%lld n=%lld: 1 and 2 threads differ", nb_dtype_name(s->dt),
                 (long long)s->m, (long long)s->k, (long long)s->n);
    }
    for (int t = 0; t < 2; t++) {
        nb_tree_destroy(res[t][0]);
        nb_tree_destroy(res[t][1]);
        nbt_assert_no_live(ctx[t]);
        nb_ctx_destroy(ctx[t]);
    }
}

/* Shapes through every path: nabla's small loops; outer products (k = 1) of several row
 * blocks; BLIS's gemm in one block and in several (columns past 128, rows past 1024, k past
 * its 256-deep blocks); gemv with the matrix read by rows (blocks of 256 outputs) and by
 * columns (a transposed), and a row vector times a matrix. */
static void test_accumulate_results(void **state) {
    (void)state;
    const ta_shape shapes[] = {
        {NB_DTYPE_F32, 16, 8, 24, false},   {NB_DTYPE_F64, 5, 7, 3, true},
        {NB_DTYPE_F32, 700, 1, 300, false}, {NB_DTYPE_F64, 300, 1, 301, false},
        {NB_DTYPE_F32, 96, 64, 300, false}, {NB_DTYPE_F64, 1100, 40, 20, true},
        {NB_DTYPE_F32, 64, 600, 40, false}, {NB_DTYPE_F32, 600, 300, 0, false},
        {NB_DTYPE_F64, 600, 300, 0, true},  {NB_DTYPE_F32, 0, 300, 500, false},
        {NB_DTYPE_F64, 0, 200, 700, false},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        ta_case(&shapes[i]);
    }
}

/* ---- what the pass rewrites and what it leaves ------------------------------------- */

/* g1 y1^T + g2 y2^T + g3 y3^T: the first product is made, the next two are added into it
 * (a chain, each step in place), with the bits of the three products and two adds. */
static void test_accumulate_chain(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *leaves[6];
    for (int i = 0; i < 3; i++) {
        leaves[2 * i] = ta_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){300, 1}, 10u + (uint32_t)i);
        leaves[2 * i + 1] = ta_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){1, 200}, 20u + (uint32_t)i);
    }
    nb_tree *args = nbt_tuple_take(ctx, 6, leaves);
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "chain", body_chain, NULL, &f));
    int n_mm = 0, n_acc = 0;
    ta_count(f, args, &n_mm, &n_acc);
    NBT_EQ_I64(n_mm, 3);
    NBT_EQ_I64(n_acc, 2);
    nb_tree *out = NULL;
    NBT_OK(ctx, nb_fn_call(f, args, &out));
    const float *r = nb_array_data(nb_tree_get_array(out));
    const float *v[6];
    for (int i = 0; i < 6; i++) {
        v[i] = nb_array_data(ta_arr(args, i));
    }
    for (int64_t i = 0; i < 300; i++) {
        for (int64_t j = 0; j < 200; j++) {
            float p0 = 0.0f + v[0][i] * v[1][j], p1 = 0.0f + v[2][i] * v[3][j];
            float p2 = 0.0f + v[4][i] * v[5][j];
            float want = (p0 + p1) + p2;
            NBT_TRUE(memcmp(&want, &r[i * 200 + j], 4) == 0);
        }
    }
    /* the running sum is one buffer (the products are not kept; a few hundred bytes of
     * small constants aside), then written into the caller's output */
    nb_fn_stats st;
    NBT_OK(ctx, nb_fn_stats_get(f, &st));
    NBT_TRUE(st.workspace_bytes < (size_t)300 * 200 * 4 * 2);
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* tanh(a @ b + x @ y) with x @ y read only by the add: the sum is made in that product's
 * buffer. Outer products (k = 1, nabla's loop): the workspace holds one [m, n] buffer (two
 * without the in-place accumulation; the tanh writes the caller's output), a few hundred
 * bytes of small constants aside. Products BLIS makes are made block by block in a worker's
 * scratch and then added into the sum's buffer: one [m, n] buffer, plus the scratch of
 * each worker -- one buffer more if the sum were not in place. */
static void ta_in_place_case(int64_t k, bool blis_scratch) {
    nb_ctx *ctx = nbt_ctx();
    const int64_t m = 96, n = 80;
    nb_tree *leaves[4] = {ta_leaf(ctx, NB_DTYPE_F64, 2, (int64_t[]){m, k}, 1),
                          ta_leaf(ctx, NB_DTYPE_F64, 2, (int64_t[]){k, n}, 2),
                          ta_leaf(ctx, NB_DTYPE_F64, 2, (int64_t[]){m, k}, 3),
                          ta_leaf(ctx, NB_DTYPE_F64, 2, (int64_t[]){k, n}, 4)};
    nb_tree *args = nbt_tuple_take(ctx, 4, leaves);
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "inplace", body_inplace, NULL, &f));
    int n_mm = 0, n_acc = 0;
    ta_count(f, args, &n_mm, &n_acc);
    NBT_EQ_I64(n_mm, 2);
    NBT_EQ_I64(n_acc, 1);
    nb_tree *out = NULL;
    NBT_OK(ctx, nb_fn_call(f, args, &out));
    nb_fn_stats st;
    NBT_OK(ctx, nb_fn_stats_get(f, &st));
    size_t buf = (size_t)(m * n * 8);
    print_message("k %lld: workspace %zu bytes, [m, n] buffer %zu\n", (long long)k,
                  st.workspace_bytes, buf);
    if (blis_scratch) {
        size_t w = (size_t)nb_ctx_n_threads(ctx); /* scratch slices (the pool's workers) */
        w = w < 1 ? 1 : w;
        NBT_TRUE(st.workspace_bytes >= (1 + w) * buf && st.workspace_bytes < (1 + w) * buf + 4096);
    } else {
        NBT_TRUE(st.workspace_bytes >= buf && st.workspace_bytes < buf + 4096);
    }
    const nb_array *r = nb_tree_get_array(out);
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double sum = 0;
            for (int64_t p = 0; p < k; p++) {
                sum += ta_get(ta_arr(args, 0), i * k + p) * ta_get(ta_arr(args, 1), p * n + j) +
                       ta_get(ta_arr(args, 2), i * k + p) * ta_get(ta_arr(args, 3), p * n + j);
            }
            NBT_TRUE(fabs(ta_get(r, i * n + j) - tanh(sum)) <= 1e-12);
        }
    }
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_accumulate_in_place(void **state) {
    (void)state;
    ta_in_place_case(1, false);
    ta_in_place_case(64, true);
}

/* An input accumulator (not donated) is copied, never written: the caller's array keeps
 * its values. Donated, the result is the same. */
static void test_accumulate_input_untouched(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    ta_shape s = {NB_DTYPE_F32, 200, 30, 150, false};
    nb_tree *args = ta_args(ctx, &s);
    const nb_array *c = ta_arr(args, 2);
    size_t bytes = nb_array_nbytes(c);
    void *saved = malloc(bytes);
    NBT_TRUE(saved != NULL);
    memcpy(saved, nb_array_data(c), bytes);
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "acc", body_mm_add, NULL, &f));
    nb_tree *out = NULL, *out2 = NULL;
    NBT_OK(ctx, nb_fn_call(f, args, &out));
    NBT_TRUE(memcmp(saved, nb_array_data(c), bytes) == 0);
    ta_check(&s, args, nb_tree_get_array(out));
    /* donated c: its array may hold the result */
    nb_tree *yes = NULL, *no = NULL, *don = NULL, *dargs = ta_args(ctx, &s);
    NBT_OK(ctx, nb_tree_bool(ctx, true, &yes));
    NBT_OK(ctx, nb_tree_bool(ctx, false, &no));
    nb_tree *flags[3] = {no, no, yes};
    NBT_OK(ctx, nb_tree_tuple(ctx, 3, flags, &don));
    nb_call_opts co = nb_call_opts_default();
    co.donate = don;
    NBT_OK(ctx, nb_fn_call_ex(f, dargs, &co, &out2));
    const nb_array *r1 = nb_tree_get_array(out), *r2 = nb_tree_get_array(out2);
    NBT_TRUE(memcmp(nb_array_data(r1), nb_array_data(r2), nb_array_nbytes(r1)) == 0);
    nb_tree_destroy(out2);
    nb_tree_destroy(dargs);
    nb_tree_destroy(don);
    nb_tree_destroy(yes);
    nb_tree_destroy(no);
    free(saved);
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Left alone: a broadcast bias, a product read twice, an accumulator read again later. */
static void test_accumulate_not_rewritten(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const struct {
        nb_fn_body body;
        int n_args;
        int n_mm;
    } cases[] = {{body_bias, 3, 1}, {body_twice, 3, 1}, {body_c_reread, 4, 2}};
    for (size_t q = 0; q < sizeof cases / sizeof cases[0]; q++) {
        nb_tree *leaves[4] = {ta_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){8, 6}, 1),
                              ta_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){6, 5}, 2), NULL, NULL};
        if (cases[q].body == body_bias) {
            leaves[2] = ta_leaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){5}, 3);
        } else if (cases[q].n_args == 3) {
            leaves[2] = ta_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){8, 5}, 3);
        } else {
            leaves[2] = ta_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){8, 6}, 3);
            leaves[3] = ta_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){6, 5}, 4);
        }
        nb_tree *args = nbt_tuple_take(ctx, cases[q].n_args, leaves);
        nb_fn *f = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "alone", cases[q].body, NULL, &f));
        int n_mm = 0, n_acc = 0;
        ta_count(f, args, &n_mm, &n_acc);
        NBT_EQ_I64(n_mm, cases[q].n_mm);
        NBT_EQ_I64(n_acc, 0);
        nb_tree_destroy(args);
        nb_fn_destroy(f);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* A gradient: d/dW sum(tanh(W x1) + tanh(W x2)) sums two outer products (the pass makes one
 * accumulate into the other); the value matches the reference, 1 and 2 threads alike. */
static nb_status body_two_uses(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_var *w = nb_get(tr, args, "[0]");
    nb_var *s = nb_add(nb_tanh(nb_matmul(w, nb_get(tr, args, "[1]"))),
                       nb_tanh(nb_matmul(w, nb_get(tr, args, "[2]"))));
    return nb_return(nb_sum(s, NULL, 0, false), out);
}

static void test_accumulate_gradient(void **state) {
    (void)state;
    const int64_t n = 300;
    nb_tree *g[2] = {NULL, NULL};
    nb_ctx *ctx[2];
    for (int t = 0; t < 2; t++) {
        nb_ctx_opts o = nb_ctx_opts_default();
        o.n_threads = t + 1;
        NBT_OK(NULL, nb_ctx_create(&o, &ctx[t]));
        nb_tree *leaves[3] = {ta_leaf(ctx[t], NB_DTYPE_F64, 2, (int64_t[]){n, n}, 5),
                              ta_leaf(ctx[t], NB_DTYPE_F64, 1, &n, 6),
                              ta_leaf(ctx[t], NB_DTYPE_F64, 1, &n, 7)};
        nb_tree *args = nbt_tuple_take(ctx[t], 3, leaves);
        nb_fn *f = NULL, *df = NULL;
        NBT_OK(ctx[t], nb_fn_create(ctx[t], "two_uses", body_two_uses, NULL, &f));
        NBT_OK(ctx[t], nb_grad(f, NULL, &df));
        int n_mm = 0, n_acc = 0;
        ta_count(df, args, &n_mm, &n_acc);
        NBT_TRUE(n_acc >= 1);
        NBT_OK(ctx[t], nb_fn_call(df, args, &g[t]));
        /* dW[i, j] = sum over uses u of (1 - tanh(W x_u)_i^2) x_u[j] */
        const nb_array *w = ta_arr(args, 0), *dw = nb_tree_get_array(g[t]);
        for (int64_t i = 0; i < n; i++) {
            double d[2];
            for (int u = 0; u < 2; u++) {
                double z = 0;
                for (int64_t j = 0; j < n; j++) {
                    z += ta_get(w, i * n + j) * ta_get(ta_arr(args, 1 + u), j);
                }
                d[u] = 1.0 - tanh(z) * tanh(z);
            }
            for (int64_t j = 0; j < n; j++) {
                double want = d[0] * ta_get(ta_arr(args, 1), j) + d[1] * ta_get(ta_arr(args, 2), j);
                NBT_TRUE(fabs(ta_get(dw, i * n + j) - want) <= 1e-12);
            }
        }
        nb_tree_destroy(args);
        nb_fn_destroy(df);
        nb_fn_destroy(f);
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
        cmocka_unit_test(test_accumulate_results),
        cmocka_unit_test(test_accumulate_chain),
        cmocka_unit_test(test_accumulate_in_place),
        cmocka_unit_test(test_accumulate_input_untouched),
        cmocka_unit_test(test_accumulate_not_rewritten),
        cmocka_unit_test(test_accumulate_gradient),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_passes.c -- optimizer passes observed through compiled functions: transposes folded
 * into matmul strides, and a product's transpose made as the transposed product (same
 * numbers as a plain reference, no transpose left in the IR).
 */
#include "nbtest.h"

#include <stdlib.h>
#include <time.h>

/* args: (a, b, mode): mode 0: a^T @ b; 1: a @ b^T; 2: a^T @ b^T. Batched when rank 3. mode
 * + 4: the product's transpose (made transposed: op(b)^T @ op(a)^T); mode + 8: the product
 * and its transpose (the product read twice: made once, then copied transposed). */
static nb_status body_tmm(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *a = nb_get(tr, args, "[0]"), *b = nb_get(tr, args, "[1]");
    const nb_tree *m = NULL;
    int64_t mode = 0;
    nb_tree_lookup(args, "[2]", &m);
    nb_tree_get_int(m, &mode);
    int r = nb_var_rank(a);
    int perm[3] = {0, 1, 2};
    perm[r - 2] = r - 1;
    perm[r - 1] = r - 2;
    int64_t op = mode & 3;
    if (op == 0 || op == 2) {
        a = nb_transpose(a, perm);
    }
    if (op == 1 || op == 2) {
        b = nb_transpose(b, perm);
    }
    nb_var *c = nb_matmul(a, b);
    if (mode & 8) {
        return nb_tree_tuple(nb_trace_ctx(tr), 2,
                             (nb_tree *[]){nb_leaf(c), nb_leaf(nb_transpose(c, perm))}, out);
    }
    return nb_return((mode & 4) ? nb_transpose(c, perm) : c, out);
}

static nb_tree *rand_leaf(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape,
                          uint64_t *seed) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, dt, rank, shape, &a));
    for (int64_t i = 0; i < nb_array_size(a); i++) {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        int v = (int)(*seed % 11) - 5;
        double dv = dt == NB_DTYPE_I32 ? (double)v : (double)v * 0.25 + 0.125;
        switch (dt) {
        case NB_DTYPE_F32:
            ((float *)nb_array_data(a))[i] = (float)dv;
            break;
        case NB_DTYPE_F64:
            ((double *)nb_array_data(a))[i] = dv;
            break;
        default:
            ((int32_t *)nb_array_data(a))[i] = v;
            break;
        }
    }
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

static double at3(const nb_array *a, int64_t b, int64_t i, int64_t j) {
    int r = nb_array_rank(a);
    int64_t rows = nb_array_dim(a, -2), cols = nb_array_dim(a, -1);
    int64_t off = (r == 3 ? b * rows * cols : 0) + i * cols + j;
    double v = 0;
    nb_array_get_flat(a, off, &v);
    return v;
}

static void test_transpose_into_matmul(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "tmm", body_tmm, NULL, &f));
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    nb_dtype dts[3] = {NB_DTYPE_F32, NB_DTYPE_F64, NB_DTYPE_I32};
    for (int d = 0; d < 3; d++) {
        for (int batched = 0; batched < 2; batched++) {
            for (int mv = 0; mv < 9; mv++) {
                int mode = mv % 3, variant = mv / 3 * 4; /* 0, 4 or 8: see body_tmm */
                int64_t M = 5, K = 7, N = 3, B = 2;
                /* stored shapes: a is [M,K] or [K,M] when transposed; b likewise */
                int64_t sa[3], sb[3];
                int r = batched ? 3 : 2, o = batched ? 1 : 0;
                sa[0] = sb[0] = B;
                sa[o] = (mode == 0 || mode == 2) ? K : M;
                sa[o + 1] = (mode == 0 || mode == 2) ? M : K;
                sb[o] = (mode == 1 || mode == 2) ? N : K;
                sb[o + 1] = (mode == 1 || mode == 2) ? K : N;
                nb_tree *la = rand_leaf(ctx, dts[d], r, sa, &seed);
                nb_tree *lb = rand_leaf(ctx, dts[d], r, sb, &seed);
                nb_tree *lm = NULL, *args = NULL, *out = NULL;
                NBT_OK(ctx, nb_tree_int(ctx, mode + variant, &lm));
                NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){la, lb, lm}, &args));
                char ir[4096];
                NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
                /* read twice (variant 8), the product is made and then copied transposed;
                 * (a^T @ b^T)^T is b @ a: no flag left (variant 4, mode 2) */
                if ((strstr(ir, "= transpose") != NULL) != (variant == 8) ||
                    (strstr(ir, "transposed=[") == NULL) != (variant == 4 && mode == 2)) {
                    fail_msg("variant %d: the transposes were not folded into the matmul:\n%s",
                             variant, ir);
                }
                NBT_OK(ctx, nb_fn_call(f, args, &out));
                const nb_array *c = nb_tree_get_array(variant == 8 ? nb_tree_child(out, 0) : out);
                const nb_array *ct = variant == 8   ? nb_tree_get_array(nb_tree_child(out, 1))
                                     : variant == 4 ? c
                                                    : NULL;
                if (variant == 4) {
                    c = NULL;
                }
                const nb_array *A = nb_tree_get_array(la), *Bm = nb_tree_get_array(lb);
                for (int64_t bb = 0; bb < (batched ? B : 1); bb++) {
                    for (int64_t i = 0; i < M; i++) {
                        for (int64_t j = 0; j < N; j++) {
                            double want = 0;
                            for (int64_t p = 0; p < K; p++) {
                                double x =
                                    (mode == 0 || mode == 2) ? at3(A, bb, p, i) : at3(A, bb, i, p);
                                double y = (mode == 1 || mode == 2) ? at3(Bm, bb, j, p)
                                                                    : at3(Bm, bb, p, j);
                                want += x * y;
                            }
                            /* inputs are multiples of 1/8 and small: every sum is exact */
                            if (c != NULL && at3(c, bb, i, j) != want) {
                                fail_msg("%s mode %d batched %d: c[%lld,%lld,%lld] = %g, want %g",
                                         nb_dtype_name(dts[d]), mode, batched, (long long)bb,
                                         (long long)i, (long long)j, at3(c, bb, i, j), want);
                            }
                            if (ct != NULL && at3(ct, bb, j, i) != want) {
                                fail_msg("%s mode %d variant %d batched %d: c^T[%lld,%lld,%lld] = "
                                         "%g, want %g",
                                         nb_dtype_name(dts[d]), mode, variant, batched,
                                         (long long)bb, (long long)j, (long long)i,
                                         at3(ct, bb, j, i), want);
                            }
                        }
                    }
                }
                nb_tree_destroy(out);
                nb_tree_destroy(args);
                nb_tree_destroy(lm);
                nb_tree_destroy(lb);
                nb_tree_destroy(la);
            }
        }
    }
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Exact algebraic rewrites: x*1, 1*x, x/1, x-0, x+(-0), neg(neg x), reshape and
 * transpose chains, broadcasts feeding elementwise ops. */
static nb_status body_algebra(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]"); /* f32[2,3] */
    nb_var *one = nb_scalar_typed(tr, NB_DTYPE_F32, 1.0);
    nb_var *y = nb_div(nb_mul(one, nb_mul(x, one)), one);
    y = nb_sub(y, nb_scalar_typed(tr, NB_DTYPE_F32, 0.0));
    y = nb_add(nb_scalar_typed(tr, NB_DTYPE_F32, -0.0), y);
    y = nb_neg(nb_neg(y));
    y = nb_reshape(nb_reshape(y, 1, (int64_t[]){6}), 2, (int64_t[]){3, 2});
    y = nb_transpose(nb_transpose(y, (int[]){1, 0}), (int[]){1, 0});
    nb_var *b = nb_broadcast_to(nb_get(tr, args, "[1]"), 2, (int64_t[]){3, 2});
    nb_var *z = nb_mul(y, b);
    nb_var *keep = nb_add(x, nb_scalar_typed(tr, NB_DTYPE_F32, 0.0)); /* not rewritten */
    nb_ctx *ctx = nb_trace_ctx(tr);
    return nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(z), nb_leaf(keep)}, out);
}

static void test_algebraic_simplification(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *x = NULL, *w = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 3},
                                   (float[]){-0.0f, 1, -2, 3.5f, 4, -5}, &x));
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, (float[]){2, -1}, &w));
    nb_tree *lx = NULL, *lw = NULL, *args = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_array(x, &lx));
    NBT_OK(ctx, nb_tree_array(w, &lw));
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){lx, lw}, &args));
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "algebra", body_algebra, NULL, &f));
    char ir[4096];
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    /* what remains: one reshape of x, the product with w (no broadcast node), and x + 0 */
    const char *gone[] = {"= neg", "= div", "= sub", "= transpose", "= broadcast_to"};
    for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++) {
        if (strstr(ir, gone[i]) != NULL) {
            fail_msg("'%s' was not simplified away:\n%s", gone[i], ir);
        }
    }
    const char *p = strstr(ir, "= reshape");
    NBT_TRUE(p != NULL && strstr(p + 1, "= reshape") == NULL); /* the chain became one */
    NBT_TRUE(strstr(ir, "= mul") != NULL && strstr(strstr(ir, "= mul") + 1, "= mul") == NULL);
    NBT_TRUE(strstr(ir, "= add") != NULL); /* x + 0 stays: it turns -0 into +0 */
    NBT_OK(ctx, nb_fn_call(f, args, &out));
    nb_array *z = nb_tree_get_array(nb_tree_child(out, 0));
    nb_array *keep = nb_tree_get_array(nb_tree_child(out, 1));
    /* z = reshape(x, [3,2]) * w: rows (-0, 1), (-2, 3.5), (4, -5) times (2, -1) */
    float want[6] = {-0.0f, -1, -4, -3.5f, 8, 5};
    for (int i = 0; i < 6; i++) {
        float g = ((const float *)nb_array_data(z))[i];
        if (memcmp(&g, &want[i], sizeof g) != 0) {
            fail_msg("z[%d] = %g, want %g (bits must match the unsimplified program)", i, g,
                     want[i]);
        }
    }
    float k0 = ((const float *)nb_array_data(keep))[0];
    NBT_TRUE(k0 == 0.0f && !signbit(k0)); /* -0 + 0 = +0 */
    nb_tree_destroy(out);
    nb_fn_destroy(f);
    nb_tree_destroy(args);
    nb_tree_destroy(lw);
    nb_tree_destroy(lx);
    nb_array_destroy(w);
    nb_array_destroy(x);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* A long elementwise chain with broadcast inputs: fused into one node, and bit-identical to
 * the unfused evaluation (the same function with its inputs as constants is folded node by
 * node at compile time), with several chunks, tiles and threads. */
static bool g_consts;
static nb_array *g_in[4];

static nb_status body_chain(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *v[4];
    for (int i = 0; i < 4; i++) {
        v[i] = g_consts ? nb_constant(tr, g_in[i]) : nb_get(tr, args, "[%d]", i);
    }
    nb_var *x = v[0], *a = v[1], *b = v[2], *c = v[3];
    nb_var *y = nb_mul(nb_tanh(nb_add(nb_mul(x, a), b)), c); /* tanh(x*a + b) * c */
    y = nb_add(y, nb_sigmoid(x));
    y = nb_sub(y, nb_exp(nb_neg(nb_square(x))));
    y = nb_select(nb_gt(x, nb_scalar(tr, 0.5)), y, nb_gelu(y));
    y = nb_add(y, nb_cast(nb_cast(x, NB_DTYPE_F64), NB_DTYPE_F32));
    return nb_return(y, out);
}

static void test_fusion_is_bit_identical(void **state) {
    (void)state;
    nb_ctx_opts o = nb_ctx_opts_default();
    o.n_threads = 2;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(&o, &ctx));
    int64_t rows = 37, cols = 1500; /* 55500 elements: several chunks and tiles */
    NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F32, -3, 3, rows * cols, &g_in[0]));
    nb_array *xr = NULL;
    NBT_OK(ctx, nb_array_reshape(g_in[0], 2, (int64_t[]){rows, cols}, &xr));
    nb_array_destroy(g_in[0]);
    g_in[0] = xr;
    NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F32, 0.5, 2, cols, &g_in[1])); /* [cols] */
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 2, (int64_t[]){rows, 1}, 0.25, &g_in[2]));
    NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_F32, -1.5, &g_in[3]));
    nb_tree *leaves[4], *args = NULL, *empty = NULL, *out1 = NULL, *out2 = NULL;
    for (int i = 0; i < 4; i++) {
        NBT_OK(ctx, nb_tree_array(g_in[i], &leaves[i]));
    }
    NBT_OK(ctx, nb_tree_tuple(ctx, 4, leaves, &args));
    NBT_OK(ctx, nb_tree_tuple(ctx, 0, NULL, &empty));
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "chain", body_chain, NULL, &f));
    g_consts = false;
    static char ir[16384];
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    /* y is used twice, by select and gelu, both in the cluster: the chain fuses into exactly
     * one node that keeps y in a register (nothing stored), and no elementwise op is left on
     * its own */
    const char *fz = strstr(ir, "= fused");
    const char *alone[] = {"] = tanh", "] = gelu", "] = sigmoid", "] = select", "] = cast",
                           "] = exp",  "] = add",  "] = mul"}; /* node lines, not programs */
    bool ok = fz != NULL && strstr(fz + 1, "= fused") == NULL && strstr(ir, "store") == NULL;
    for (size_t i = 0; ok && i < sizeof alone / sizeof alone[0]; i++) {
        ok = strstr(ir, alone[i]) == NULL;
    }
    if (!ok) {
        fail_msg("expected the chain in one fused node:\n%s", ir);
    }
    NBT_OK(ctx, nb_fn_call(f, args, &out1));
    nb_ctx_clear_cache(ctx);
    g_consts = true; /* folded at compile time: every op over the whole array, unfused */
    NBT_OK(ctx, nb_fn_call(f, empty, &out2));
    bool same = false;
    NBT_OK(ctx, nb_array_identical(nb_tree_get_array(out1), nb_tree_get_array(out2), &same));
    NBT_TRUE(same);
    nb_tree_destroy(out2);
    nb_tree_destroy(out1);
    nb_fn_destroy(f);
    nb_tree_destroy(empty);
    nb_tree_destroy(args);
    for (int i = 0; i < 4; i++) {
        nb_tree_destroy(leaves[i]);
        nb_array_destroy(g_in[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Slices, pads and broadcasts feeding a fused chain (or a lone elementwise op) are read in
 * place through views (strided, contiguous-run, reversed, padded before and after in both
 * dims through a slice, stride-0 rows and a stride-0 scalar, also under a unary op): no
 * slice, pad or broadcast node is left, and the result is bit-identical to the unfused
 * evaluation. */
static nb_status body_views(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = g_consts ? nb_constant(tr, g_in[0]) : nb_get(tr, args, "[0]"); /* [37, 1500] */
    const int64_t sh[2] = {18, 750};
    nb_var *a = nb_slice(x, (int64_t[]){0, 0}, (int64_t[]){36, 1500}, (int64_t[]){2, 2});
    nb_var *b = nb_slice(x, (int64_t[]){1, 750}, (int64_t[]){19, 1500}, NULL);
    nb_var *c = nb_slice(x, (int64_t[]){36, 1499}, (int64_t[]){18, 749}, (int64_t[]){-1, -1});
    nb_var *row = nb_slice(x, (int64_t[]){0, 0}, (int64_t[]){1, 750}, NULL);
    nb_var *d = nb_broadcast_to(nb_exp(row), 2, sh);
    nb_var *e = nb_broadcast_to(nb_mean(x, NULL, 0, false), 2, sh);
    nb_var *y = nb_tanh(nb_add(nb_mul(a, b), c));
    y = nb_sub(y, nb_mul(d, nb_scalar(tr, 0.5)));
    y = nb_add(nb_add(y, nb_tanh(e)), nb_mul(e, a));
    nb_var *s1 = nb_slice(x, (int64_t[]){0, 0}, (int64_t[]){17, 749}, NULL);
    nb_var *s2 = nb_slice(x, (int64_t[]){20, 700}, (int64_t[]){37, 1449}, NULL);
    nb_var *p1 = nb_pad(s1, (int64_t[]){1, 0}, (int64_t[]){0, 1}, 0.25);
    nb_var *p2 = nb_pad(s2, (int64_t[]){0, 1}, (int64_t[]){1, 0}, -2.0);
    y = nb_add(y, nb_mul(p1, p2));
    return nb_return(y, out);
}

static void test_fusion_views(void **state) {
    (void)state;
    nb_ctx_opts o = nb_ctx_opts_default();
    o.n_threads = 2;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(&o, &ctx));
    nb_array *x1 = NULL;
    NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F32, -3, 3, 37 * 1500, &x1));
    NBT_OK(ctx, nb_array_reshape(x1, 2, (int64_t[]){37, 1500}, &g_in[0]));
    nb_array_destroy(x1);
    nb_tree *leaf = NULL, *args = NULL, *empty = NULL, *out1 = NULL, *out2 = NULL;
    NBT_OK(ctx, nb_tree_array(g_in[0], &leaf));
    NBT_OK(ctx, nb_tree_tuple(ctx, 1, &leaf, &args));
    NBT_OK(ctx, nb_tree_tuple(ctx, 0, NULL, &empty));
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "views", body_views, NULL, &f));
    g_consts = false;
    static char ir[16384];
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    /* exp reads its row as a view in a fused node of its own; the pads of slices read x
     * through both (no slice node is left) */
    const char *fz = strstr(ir, "= fused");
    bool ok = fz != NULL && strstr(fz + 1, "= fused") != NULL &&
              strstr(strstr(fz + 1, "= fused") + 1, "= fused") == NULL &&
              strstr(ir, "] = broadcast_to") == NULL && strstr(ir, "] = pad") == NULL &&
              strstr(ir, "] = slice") == NULL &&
              strstr(ir, "offset=55499, strides=[-1500,-1]") != NULL &&
              strstr(ir, "offset=30700, strides=[1500,1], pad_lo=[0,1], value=-2, "
                         "within=[17,749]") != NULL;
    if (!ok) {
        fail_msg("expected two fused nodes reading slices, pads and broadcasts as views:\n%s", ir);
    }
    NBT_OK(ctx, nb_fn_call(f, args, &out1));
    nb_ctx_clear_cache(ctx);
    g_consts = true;
    NBT_OK(ctx, nb_fn_call(f, empty, &out2));
    bool same = false;
    NBT_OK(ctx, nb_array_identical(nb_tree_get_array(out1), nb_tree_get_array(out2), &same));
    NBT_TRUE(same);
    nb_tree_destroy(out2);
    nb_tree_destroy(out1);
    nb_fn_destroy(f);
    nb_tree_destroy(empty);
    nb_tree_destroy(args);
    nb_tree_destroy(leaf);
    nb_array_destroy(g_in[0]);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Short runs (a softmax's classes): sums, maxima and minima over rows of 10 and of 7
 * elements (7: rows cross the fused kernel's tiles), f32 and f64, on values with NaNs,
 * -0.0 and infinities, fused into their maps -- several rows at a time -- and bit-identical
 * to the same maps materialised and reduced by the reduction kernel, with 1 and 3 threads. */
static int g_short_mode; /* 0: fused; 1: maps only; 2: reductions of given maps */

static nb_status body_short_runs(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    (void)self;
    nb_var *m[12];
    for (int i = 0; i < 12; i++) {
        if (g_short_mode == 2) {
            m[i] = nb_get(tr, args, "[%d]", i);
            continue;
        }
        nb_var *x = nb_get(tr, args, "[%d]", i / 6); /* [1438, 10] or [913, 7], f64 */
        if ((i / 3) % 2 == 1) {
            x = nb_cast(x, NB_DTYPE_F32);
        }
        /* log of negatives: NaN; x * 0 at negative x: -0.0; exp of large: inf. Each map its
         * own exp: a shared one is stored, not recomputed (nbi_pass_remat), and the maps
         * sharing it would be one program with three reductions after it. */
        double c = 0.125 * (i % 3);
        m[i] = nb_add(nb_mul(nb_log(nb_add(x, nb_scalar(tr, 2.5 + c))),
                             nb_exp(nb_mul(nb_square(x), nb_scalar(tr, 1.0 + c)))),
                      nb_mul(x, nb_scalar(tr, 0.0))); /* a map of its own per reduction */
    }
    nb_tree *leaves[12];
    for (int i = 0; i < 12; i++) {
        nb_var *r = m[i];
        if (g_short_mode != 1) {
            r = i % 3 == 0   ? nb_sum(m[i], (int[]){-1}, 1, false)
                : i % 3 == 1 ? nb_max(m[i], (int[]){-1}, 1, false)
                             : nb_min(m[i], (int[]){-1}, 1, false);
        }
        leaves[i] = nb_leaf(r);
    }
    nb_status st = nb_tree_tuple(nb_trace_ctx(tr), 12, leaves, out);
    for (int i = 0; i < 12; i++) {
        nb_tree_destroy(leaves[i]);
    }
    return st;
}

static void test_fused_short_runs(void **state) {
    (void)state;
    for (int threads = 1; threads <= 3; threads += 2) {
        nb_ctx_opts o = nb_ctx_opts_default();
        o.n_threads = threads;
        nb_ctx *ctx = NULL;
        NBT_OK(NULL, nb_ctx_create(&o, &ctx));
        const int64_t shapes[2][2] = {{1438, 10}, {913, 7}};
        nb_tree *leaves[2], *args = NULL, *fused = NULL, *maps = NULL, *plain = NULL;
        for (int k = 0; k < 2; k++) {
            nb_array *a = NULL;
            NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, shapes[k], &a));
            double *v = nb_array_data(a);
            int64_t n = shapes[k][0] * shapes[k][1];
            for (int64_t i = 0; i < n; i++) {
                v[i] = -3.0 + 6.0 * (double)((i * 2654435761u) % 1000) / 1000.0;
            }
            v[5] = 40.0; /* exp(1600) = inf */
            NBT_OK(ctx, nb_tree_array(a, &leaves[k]));
            nb_array_destroy(a);
        }
        NBT_OK(ctx, nb_tree_tuple(ctx, 2, leaves, &args));
        nb_fn *f = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "short_runs", body_short_runs, NULL, &f));
        g_short_mode = 0;
        static char ir[32768];
        NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
        int n_fused = 0;
        for (const char *q = strstr(ir, "; then "); q != NULL; q = strstr(q + 1, "; then ")) {
            n_fused++;
        }
        if (n_fused != 12) {
            fail_msg("expected 12 fused reductions:\n%s", ir);
        }
        NBT_OK(ctx, nb_fn_call(f, args, &fused));
        nb_ctx_clear_cache(ctx);
        g_short_mode = 1;
        NBT_OK(ctx, nb_fn_call(f, args, &maps));
        nb_ctx_clear_cache(ctx);
        g_short_mode = 2;
        NBT_OK(ctx, nb_fn_call(f, maps, &plain));
        int nans = 0;
        for (int64_t i = 0; i < 12; i++) {
            bool same = false;
            nb_array *a = nb_tree_get_array(nb_tree_child(fused, i));
            nb_array *b = nb_tree_get_array(nb_tree_child(plain, i));
            NBT_OK(ctx, nb_array_identical(a, b, &same));
            if (!same) {
                fail_msg("short-run reduction %lld (threads %d) differs from the unfused kernel",
                         (long long)i, threads);
            }
            for (int64_t e = 0; e < nb_array_size(a); e++) {
                double v = 0;
                NBT_OK(ctx, nb_array_get_flat(a, e, &v));
                nans += isnan(v);
            }
        }
        NBT_TRUE(nans > 0); /* the NaN rows were reduced too */
        nb_tree_destroy(fused);
        nb_tree_destroy(maps);
        nb_tree_destroy(plain);
        nb_tree_destroy(args);
        for (int k = 0; k < 2; k++) {
            nb_tree_destroy(leaves[k]);
        }
        nb_fn_destroy(f);
        nbt_assert_no_live(ctx);
        nb_ctx_destroy(ctx);
    }
}

/* Trailing reductions fused into their elementwise chains: a full f32 sum long enough to be
 * cut into segments (whose partial sums must combine in the unfused kernel's tree), a row
 * sum of short rows, an f32 sum of two long rows (segments per row), a max with keepdims
 * whose first row holds NaNs, a min over the last two axes, and an i32 sum. A column sum
 * (kept innermost dim) stays a reduction node. Every result is bit-identical to the
 * unfused evaluation -- the same maps materialised by one function and reduced by the
 * reduction kernel in another -- with 1 and 3 threads. */
static int g_red_mode; /* 0: maps then reductions in one trace; 1: maps only; 2: reductions */

static nb_var *red_apply(int i, nb_var *m) {
    switch (i) {
    case 1:
        return nb_sum(m, (int[]){1}, 1, false);
    case 2:
        return nb_sum(m, (int[]){-1}, 1, false);
    case 3:
        return nb_max(m, (int[]){1}, 1, true);
    case 4:
        return nb_min(m, (int[]){1, 2}, 2, false);
    case 6:
        return nb_sum(m, (int[]){0}, 1, false); /* column-wise: not fused */
    default:
        return nb_sum(m, NULL, 0, false);
    }
}

static nb_status body_reductions(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    (void)self;
    nb_var *m[7];
    if (g_red_mode == 2) {
        for (int i = 0; i < 7; i++) {
            m[i] = nb_get(tr, args, "[%d]", i);
        }
    } else {
        nb_var *x = nb_get(tr, args, "[0]"), *w = nb_get(tr, args, "[1]");
        nb_var *k = nb_get(tr, args, "[2]"); /* x, w: f64 [3, 70001]; k: i32 [3, 70001] */
        nb_var *xf = nb_cast(x, NB_DTYPE_F32);
        m[0] = nb_mul(nb_sin(nb_mul(xf, nb_scalar(tr, 37.1))), nb_exp(xf));
        nb_var *rows = nb_reshape(nb_slice(x, (int64_t[]){0, 0}, (int64_t[]){3, 70000}, NULL), 2,
                                  (int64_t[]){1500, 140});
        m[1] = nb_exp(nb_neg(nb_square(rows)));
        m[2] = nb_tanh(nb_mul(xf, nb_cast(w, NB_DTYPE_F32)));
        m[3] = nb_log(nb_add(x, nb_scalar(tr, 1.9))); /* NaN where x < -1.9: first row */
        nb_var *cube = nb_reshape(x, 3, (int64_t[]){3, 1, 70001});
        m[4] = nb_sub(nb_square(cube), cube);
        m[5] = nb_mul(k, nb_add(k, nb_scalar(tr, 7)));
        m[6] = nb_square(rows);
    }
    nb_tree *leaves[7];
    for (int i = 0; i < 7; i++) {
        leaves[i] = nb_leaf(g_red_mode == 1 ? m[i] : red_apply(i, m[i]));
    }
    nb_status st = nb_tree_tuple(nb_trace_ctx(tr), 7, leaves, out);
    for (int i = 0; i < 7; i++) {
        nb_tree_destroy(leaves[i]);
    }
    return st;
}

static void test_fused_reductions(void **state) {
    (void)state;
    for (int threads = 1; threads <= 3; threads += 2) {
        nb_ctx_opts o = nb_ctx_opts_default();
        o.n_threads = threads;
        nb_ctx *ctx = NULL;
        NBT_OK(NULL, nb_ctx_create(&o, &ctx));
        int64_t shape[2] = {3, 70001}, n = 3 * 70001;
        nb_array *x1 = NULL;
        NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F64, -3, 2.5, n, &x1));
        NBT_OK(ctx, nb_array_reshape(x1, 2, shape, &g_in[0]));
        NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, shape, &g_in[1]));
        NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I32, 2, shape, &g_in[2]));
        for (int64_t i = 0; i < n; i++) {
            ((double *)nb_array_data(g_in[1]))[i] = 0.25 + (double)(i % 17) * 0.125;
            ((int32_t *)nb_array_data(g_in[2]))[i] = (int32_t)(i * 2654435761u >> 7);
        }
        nb_array_destroy(x1);
        nb_tree *leaves[3], *args = NULL, *out1 = NULL, *out2 = NULL;
        for (int i = 0; i < 3; i++) {
            NBT_OK(ctx, nb_tree_array(g_in[i], &leaves[i]));
        }
        NBT_OK(ctx, nb_tree_tuple(ctx, 3, leaves, &args));
        nb_fn *f = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "reductions", body_reductions, NULL, &f));
        g_red_mode = 0;
        static char ir[16384];
        NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
        int n_fused_red = 0;
        for (const char *q = strstr(ir, "; then "); q != NULL; q = strstr(q + 1, "; then ")) {
            n_fused_red++;
        }
        const char *col = strstr(ir, "] = sum");
        if (n_fused_red != 6 || col == NULL || strstr(col + 1, "] = sum") != NULL ||
            strstr(ir, "then max(axes=[1], keepdims=true)") == NULL ||
            strstr(ir, "then min(axes=[1,2], keepdims=false)") == NULL) {
            fail_msg("expected six fused reductions and one column sum:\n%s", ir);
        }
        NBT_OK(ctx, nb_fn_call(f, args, &out1));
        nb_ctx_clear_cache(ctx);
        g_red_mode = 1; /* the maps, materialised */
        nb_tree *maps = NULL;
        NBT_OK(ctx, nb_fn_call(f, args, &maps));
        nb_ctx_clear_cache(ctx);
        g_red_mode = 2; /* reduced by the reduction kernel */
        NBT_OK(ctx, nb_fn_call(f, maps, &out2));
        nb_tree_destroy(maps);
        NBT_EQ_I64(nb_tree_len(out1), 7);
        for (int64_t i = 0; i < 7; i++) {
            bool same = false;
            nb_array *a = nb_tree_get_array(nb_tree_child(out1, i));
            nb_array *b = nb_tree_get_array(nb_tree_child(out2, i));
            NBT_OK(ctx, nb_array_identical(a, b, &same));
            if (!same) {
                fail_msg("reduction %d differs from the unfused one with %d threads", (int)i,
                         threads);
            }
        }
        /* the max rows: NaN, then the logs of the rows' largest values */
        const double *mx = nb_array_data(nb_tree_get_array(nb_tree_child(out1, 3)));
        NBT_TRUE(isnan(mx[0]) && !isnan(mx[1]) && !isnan(mx[2]));
        NBT_NEAR(mx[2], log(2.5 + 1.9), 1e-12);
        nb_tree_destroy(out2);
        nb_tree_destroy(out1);
        nb_fn_destroy(f);
        nb_tree_destroy(args);
        for (int i = 0; i < 3; i++) {
            nb_tree_destroy(leaves[i]);
            nb_array_destroy(g_in[i]);
        }
        nbt_assert_no_live(ctx);
        nb_ctx_destroy(ctx);
    }
}

/* Pads pushed through elementwise trees: pad(tanh(a * 2 + b) with a and b slices of x (one
 * strided), and pad(exp(c)) of a lone unary op, become masked selects over padded views of
 * x -- no pad or slice node is left -- and give the bits of the unpushed program (the tree
 * materialised by one function, padded by another). */
static int g_pp_mode; /* 0: pushed; 1: the trees only; 2: pads of given arrays */

static nb_status body_pad_push(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_var *t[2];
    if (g_pp_mode == 2) {
        t[0] = nb_get(tr, args, "[0]");
        t[1] = nb_get(tr, args, "[1]");
    } else {
        nb_var *x = nb_get(tr, args, "[0]"); /* [300, 257] */
        nb_var *a = nb_slice(x, (int64_t[]){1, 0}, (int64_t[]){300, 257}, (int64_t[]){1, 2});
        nb_var *b = nb_slice(x, (int64_t[]){0, 1}, (int64_t[]){299, 130}, NULL);
        t[0] = nb_tanh(nb_add(nb_mul(a, nb_scalar(tr, 2.0)), b)); /* [299, 129] */
        t[1] = nb_exp(nb_slice(x, (int64_t[]){5, 7}, (int64_t[]){105, 207}, NULL));
    }
    if (g_pp_mode != 1) {
        t[0] = nb_pad(t[0], (int64_t[]){1, 0}, (int64_t[]){0, 3}, -1.5);
        t[1] = nb_pad(t[1], (int64_t[]){2, 2}, (int64_t[]){2, 2}, 0.0);
    }
    nb_tree *leaves[2] = {nb_leaf(t[0]), nb_leaf(t[1])};
    nb_status st = nb_tree_tuple(nb_trace_ctx(tr), 2, leaves, out);
    nb_tree_destroy(leaves[0]);
    nb_tree_destroy(leaves[1]);
    return st;
}

static void test_pad_push(void **state) {
    (void)state;
    nb_ctx_opts o = nb_ctx_opts_default();
    o.n_threads = 2;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(&o, &ctx));
    nb_array *x1 = NULL, *x = NULL;
    NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F32, -2, 2, 300 * 257, &x1));
    NBT_OK(ctx, nb_array_reshape(x1, 2, (int64_t[]){300, 257}, &x));
    nb_array_destroy(x1);
    nb_tree *leaf = NULL, *args = NULL, *out1 = NULL, *trees = NULL, *out2 = NULL;
    NBT_OK(ctx, nb_tree_array(x, &leaf));
    NBT_OK(ctx, nb_tree_tuple(ctx, 1, &leaf, &args));
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "pad_push", body_pad_push, NULL, &f));
    g_pp_mode = 0;
    static char ir[16384];
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    if (strstr(ir, "] = pad") != NULL || strstr(ir, "] = slice") != NULL ||
        strstr(ir, "strides=[257,2], pad_lo=[1,0], value=0, within=[299,129]") == NULL) {
        fail_msg("expected the pads pushed into fused nodes over views of x:\n%s", ir);
    }
    NBT_OK(ctx, nb_fn_call(f, args, &out1));
    nb_ctx_clear_cache(ctx);
    g_pp_mode = 1;
    NBT_OK(ctx, nb_fn_call(f, args, &trees));
    nb_ctx_clear_cache(ctx);
    g_pp_mode = 2;
    NBT_OK(ctx, nb_fn_call(f, trees, &out2));
    for (int64_t i = 0; i < 2; i++) {
        bool same = false;
        NBT_OK(ctx, nb_array_identical(nb_tree_get_array(nb_tree_child(out1, i)),
                                       nb_tree_get_array(nb_tree_child(out2, i)), &same));
        if (!same) {
            fail_msg("pushed pad %d differs from the pad of the materialised tree", (int)i);
        }
    }
    nb_tree_destroy(out2);
    nb_tree_destroy(trees);
    nb_tree_destroy(out1);
    nb_fn_destroy(f);
    nb_tree_destroy(args);
    nb_tree_destroy(leaf);
    nb_array_destroy(x);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Multi-output fusion. One Adam leaf update -- mu' = c1 g + b1 mu, nu' = c2 g^2 + b2 nu,
 * p' = p + (-lr) (mu' / bc1) / (sqrt(nu' / bc2) + eps), as optim.c traces it -- whose new
 * moments are outputs that the update also reads: ONE fused node reads g, mu, nu and p
 * once, stores mu' and nu' (fused_output nodes) and makes p'. With a reduction beside it
 * whose map is read again afterwards (e / sum(e), e bigger than remat copies, reading g
 * and mu too), the update joins e's cluster as a sibling and one kernel stores mu', nu',
 * p' and e and sums e. Every output is bit-identical to the unfused evaluation (all ops
 * folded one by one) with 1 and 3 threads (55500 elements: several chunks and tiles); and
 * with p, mu and nu donated, the outputs overwrite the inputs the kernel reads -- equal,
 * step after step, to the undonated calls. */
static bool g_mo_red; /* with the reduction */

static nb_status body_multi(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *v[4];
    for (int i = 0; i < 4; i++) {
        v[i] = g_consts ? nb_constant(tr, g_in[i]) : nb_get(tr, args, "[%d]", i);
    }
    nb_var *p = v[0], *mu = v[1], *nu = v[2], *g = v[3];
    nb_var *b1 = nb_scalar_typed(tr, NB_DTYPE_F32, 0.9),
           *b2 = nb_scalar_typed(tr, NB_DTYPE_F32, 0.999);
    nb_var *c1 = nb_cast(
        nb_sub(nb_scalar_typed(tr, NB_DTYPE_F64, 1.0), nb_scalar_typed(tr, NB_DTYPE_F64, 0.9)),
        NB_DTYPE_F32);
    nb_var *c2 = nb_scalar_typed(tr, NB_DTYPE_F32, 0.001);
    nb_var *bc1 = nb_scalar_typed(tr, NB_DTYPE_F32, 0.271),
           *bc2 = nb_scalar_typed(tr, NB_DTYPE_F32, 0.002997);
    nb_var *eps = nb_scalar_typed(tr, NB_DTYPE_F32, 1e-8),
           *lr = nb_scalar_typed(tr, NB_DTYPE_F32, -1e-3);
    nb_var *mu2 = nb_add(nb_mul(c1, g), nb_mul(b1, mu));
    nb_var *nu2 = nb_add(nb_mul(c2, nb_square(g)), nb_mul(b2, nu));
    nb_var *u = nb_div(nb_div(mu2, bc1), nb_add(nb_sqrt(nb_div(nu2, bc2)), eps));
    nb_var *p2 = nb_add(p, nb_mul(lr, u));
    nb_var *e = nb_exp(nb_sub(nb_mul(nb_tanh(g), nb_scalar(tr, 0.5)), nb_mul(mu, mu)));
    nb_var *r = nb_div(e, nb_sum(e, (int[]){1}, 1, true));
    nb_tree *leaves[4] = {nb_leaf(p2), nb_leaf(mu2), nb_leaf(nu2), nb_leaf(r)};
    nb_status st = nb_tree_tuple(nb_trace_ctx(tr), g_mo_red ? 4 : 3, leaves, out);
    for (int i = 0; i < 4; i++) {
        nb_tree_destroy(leaves[i]);
    }
    return st;
}

static int count_of(const char *s, const char *what) {
    int n = 0;
    for (const char *q = strstr(s, what); q != NULL; q = strstr(q + 1, what)) {
        n++;
    }
    return n;
}

static void test_fusion_multi_output(void **state) {
    (void)state;
    for (int variant = 0; variant < 4; variant++) {
        int threads = variant % 2 ? 3 : 1;
        g_mo_red = variant >= 2;
        int n_out = g_mo_red ? 4 : 3;
        nb_ctx_opts o = nb_ctx_opts_default();
        o.n_threads = threads;
        nb_ctx *ctx = NULL;
        NBT_OK(NULL, nb_ctx_create(&o, &ctx));
        int64_t shape[2] = {37, 1500};
        nb_tree *leaves[4], *args = NULL, *empty = NULL, *want = NULL;
        for (int i = 0; i < 4; i++) {
            nb_array *a = NULL;
            NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F32, -2 + i, 1.5 + 0.5 * i, 37 * 1500, &a));
            NBT_OK(ctx, nb_array_reshape(a, 2, shape, &g_in[i]));
            nb_array_destroy(a);
            if (i == 2) { /* nu >= 0 */
                float *d = nb_array_data(g_in[i]);
                for (int64_t k = 0; k < 37 * 1500; k++) {
                    d[k] *= d[k];
                }
            }
            NBT_OK(ctx, nb_tree_array(g_in[i], &leaves[i]));
        }
        NBT_OK(ctx, nb_tree_tuple(ctx, 4, leaves, &args));
        NBT_OK(ctx, nb_tree_tuple(ctx, 0, NULL, &empty));
        nb_fn *f = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "multi", body_multi, NULL, &f));
        g_consts = false;
        static char ir[16384];
        NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
        /* one pass: the update storing mu' and nu' (registers 2 and 6) beside its output
         * p' -- with the reduction, also p' and e, then the sum; no op of the big shape left
         * alone but e / sum(e) */
        bool ok = g_mo_red ? count_of(ir, "= fused ") == 1 && count_of(ir, "= fused_output") == 4 &&
                                 strstr(ir, "; store r2, r6, r13, r18; then sum(axes=[1], "
                                            "keepdims=true)}") != NULL &&
                                 count_of(ir, "f32[37,1500] = ") == 5
                           : count_of(ir, "= fused ") == 1 && count_of(ir, "= fused_output") == 2 &&
                                 strstr(ir, "; store r2, r6}") != NULL &&
                                 count_of(ir, "f32[37,1500] = ") == 3;
        if (!ok) {
            fail_msg("expected the update in one fused node storing mu' and nu' (and the "
                     "reduction's map):\n%s",
                     ir);
        }
        nb_tree *got = NULL;
        NBT_OK(ctx, nb_fn_call(f, args, &got));
        nb_ctx_clear_cache(ctx);
        g_consts = true; /* folded at compile time: every op over the whole array, unfused */
        NBT_OK(ctx, nb_fn_call(f, empty, &want));
        g_consts = false;
        for (int64_t i = 0; i < n_out; i++) {
            bool same = false;
            NBT_OK(ctx, nb_array_identical(nb_tree_get_array(nb_tree_child(got, i)),
                                           nb_tree_get_array(nb_tree_child(want, i)), &same));
            if (!same) {
                fail_msg("output %d differs from the unfused one with %d threads%s", (int)i,
                         threads, g_mo_red ? " (with the reduction)" : "");
            }
        }
        /* donated: p, mu, nu overwritten by p', mu', nu' from the kernel reading them; three
         * steps against undonated calls fed the previous outputs */
        nb_tree *yes = NULL, *no = NULL, *spec = NULL, *dargs = NULL, *dl[4], *ref = got;
        NBT_OK(ctx, nb_tree_bool(ctx, true, &yes));
        NBT_OK(ctx, nb_tree_bool(ctx, false, &no));
        NBT_OK(ctx, nb_tree_tuple(ctx, 4, (nb_tree *[]){yes, yes, yes, no}, &spec));
        for (int i = 0; i < 4; i++) {
            nb_array *c = NULL;
            NBT_OK(ctx, nb_array_copy(g_in[i], &c));
            NBT_OK(ctx, nb_tree_array(c, &dl[i]));
            nb_array_destroy(c);
        }
        NBT_OK(ctx, nb_tree_tuple(ctx, 4, dl, &dargs));
        nb_call_opts co = nb_call_opts_default();
        co.donate = spec;
        ref = NULL;
        nb_tree *prev = args;
        nb_tree_retain(prev);
        for (int step = 0; step < 3; step++) {
            nb_tree *dout = NULL, *next = NULL;
            NBT_OK(ctx, nb_fn_call_ex(f, dargs, &co, &dout));
            NBT_OK(ctx, nb_fn_call(f, prev, &ref));
            for (int64_t i = 0; i < 3; i++) { /* written in place */
                NBT_TRUE(nb_tree_get_array(nb_tree_child(dout, i)) == nb_tree_get_array(dl[i]));
            }
            for (int64_t i = 0; i < n_out; i++) {
                bool same = false;
                NBT_OK(ctx, nb_array_identical(nb_tree_get_array(nb_tree_child(dout, i)),
                                               nb_tree_get_array(nb_tree_child(ref, i)), &same));
                if (!same) {
                    fail_msg("donated step %d: output %d differs from the undonated call with "
                             "%d threads",
                             step, (int)i, threads);
                }
            }
            NBT_OK(ctx, nb_tree_tuple(ctx, 4,
                                      (nb_tree *[]){(nb_tree *)nb_tree_child(ref, 0),
                                                    (nb_tree *)nb_tree_child(ref, 1),
                                                    (nb_tree *)nb_tree_child(ref, 2), leaves[3]},
                                      &next));
            nb_tree_destroy(prev);
            prev = next;
            nb_tree_destroy(ref);
            nb_tree_destroy(dout);
        }
        nb_tree_destroy(prev);
        nb_tree *all[] = {dargs, spec, no, yes, got, want, empty, args};
        for (size_t q = 0; q < sizeof all / sizeof all[0]; q++) {
            nb_tree_destroy(all[q]);
        }
        nb_fn_destroy(f);
        for (int i = 0; i < 4; i++) {
            nb_tree_destroy(dl[i]);
            nb_tree_destroy(leaves[i]);
            nb_array_destroy(g_in[i]);
        }
        nbt_assert_no_live(ctx);
        nb_ctx_destroy(ctx);
    }
}

/* A chain reading more distinct inputs than one fused node holds (16) is split across
 * fused nodes instead of failing to compile; y = (...((x0 c1 + x1) c2 + x2)...) + x19. */
static nb_status body_many(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *y = nb_get(tr, args, "[0]");
    for (int i = 1; i < 20; i++) {
        y = nb_add(nb_mul(y, nb_scalar(tr, 0.5 + i)), nb_get(tr, args, "[%d]", i));
    }
    return nb_return(y, out);
}

static void test_fusion_many_inputs(void **state) {
    (void)state;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(NULL, &ctx));
    nb_tree *l[20], *args = NULL, *out = NULL;
    for (int i = 0; i < 20; i++) {
        nb_array *a = NULL;
        NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 1, (int64_t[]){100}, 0.25 * i, &a));
        NBT_OK(ctx, nb_tree_array(a, &l[i]));
        nb_array_destroy(a);
    }
    NBT_OK(ctx, nb_tree_tuple(ctx, 20, l, &args));
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "many", body_many, NULL, &f));
    NBT_OK(ctx, nb_fn_call(f, args, &out));
    float want = 0.0f;
    for (int i = 1; i < 20; i++) {
        float c = (float)(0.5 + i), t = want * c;
        want = t + 0.25f * (float)i;
    }
    const float *y = nb_array_data(nb_tree_get_array(out));
    NBT_TRUE(memcmp(&y[99], &want, sizeof want) == 0);
    nb_tree_destroy(out);
    nb_fn_destroy(f);
    nb_tree_destroy(args);
    for (int i = 0; i < 20; i++) {
        nb_tree_destroy(l[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- compile time against the number of leaves ----------------------------------------- */

/* sum over n leaves (f32[4] each) of their sums: one reduction per leaf and a chain of adds,
 * fused per leaf -- the graph grows linearly in n, and so must the compile */
static nb_status body_sum_leaves(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    (void)self;
    const nb_tree *p = nb_tree_child(args, 0);
    nb_var *acc = NULL;
    for (int64_t i = 0; i < nb_tree_len(p); i++) {
        nb_var *s =
            nb_sum(nb_mul(nb_var_of(tr, nb_tree_child(p, i)), nb_scalar(tr, 2.0)), NULL, 0, false);
        acc = acc == NULL ? s : nb_add(acc, s);
    }
    return nb_return(acc, out);
}

/* Seconds for the first call (trace, optimise, compile, run) over n leaves; the best of 3. */
static double first_call_seconds(nb_ctx *ctx, int64_t n) {
    nb_tree **items = calloc((size_t)n, sizeof *items);
    NBT_TRUE(items != NULL);
    for (int64_t i = 0; i < n; i++) {
        nb_array *a = NULL;
        NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 1, (int64_t[]){4}, 1.0, &a));
        NBT_OK(ctx, nb_tree_array(a, &items[i]));
        nb_array_destroy(a);
    }
    nb_tree *p = NULL, *args = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_list(ctx, n, items, &p));
    NBT_OK(ctx, nb_tree_tuple(ctx, 1, &p, &args));
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "sum_leaves", body_sum_leaves, NULL, &f));
    double best = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        nb_ctx_clear_cache(ctx);
        struct timespec a, b;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a); /* CPU time: not the machine's load */
        NBT_OK(ctx, nb_fn_call(f, args, &out));
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
        double t = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
        best = t < best ? t : best;
        double v = 0;
        NBT_OK(ctx, nb_array_get(nb_tree_get_array(out), NULL, &v));
        NBT_EQ_F64(v, 8.0 * (double)n);
        nb_tree_destroy(out);
    }
    nb_fn_destroy(f);
    nb_tree_destroy(args);
    nb_tree_destroy(p);
    for (int64_t i = 0; i < n; i++) {
        nb_tree_destroy(items[i]);
    }
    free(items);
    return best;
}

/* 8x the leaves costs about 8x (linear); the fusion pass once scanned every earlier node per
 * cluster, so it cost about 50x. A generous bound (the machine is shared): under 40x. (It
 * was 25x until the default allocator kept large freed blocks: the 1000-leaf call's page
 * faults went away -- 14.6 ms -> 5.8 ms, the 8000-leaf one 196 -> 160 ms -- and the ratio
 * rose from 13x to 20-32x; the quadratic scan would now be about 100x.) */
static void test_compile_time_linear(void **state) {
    (void)state;
    nb_ctx_opts o = nb_ctx_opts_default();
    o.n_threads = 1; /* (process CPU time: no pool threads besides this one) */
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(&o, &ctx));
    double t1 = first_call_seconds(ctx, 1000), t8 = first_call_seconds(ctx, 8000);
    print_message("first call: 1000 leaves %.1f ms, 8000 leaves %.1f ms (%.1fx)\n", t1 * 1e3,
                  t8 * 1e3, t8 / t1);
    if (t8 > 40.0 * t1 + 0.05) {
        fail_msg("8x the leaves took %.1fx as long (%.1f ms vs %.1f ms)", t8 / t1, t8 * 1e3,
                 t1 * 1e3);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Constant folding makes a full of a result whose every element is the same bits (any size),
 * which the algebra then sees: (0.5 * 2) * x is x, x + -(0) is x; a full output keeps its
 * bits (-0.0); a folded result of different elements stays a constant. */
static nb_status body_uniform(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    const int64_t sh[2] = {64, 32};
    nb_var *one =
        nb_mul(nb_full(tr, NB_DTYPE_F32, 2, sh, 0.5), nb_full(tr, NB_DTYPE_F32, 2, sh, 2.0));
    nb_var *mzero = nb_neg(nb_full(tr, NB_DTYPE_F32, 2, sh, 0.0));
    nb_var *ramp = nb_mul(nb_iota(tr, NB_DTYPE_F32, 2, sh, 1), nb_scalar(tr, 2.0));
    nb_var *y = nb_add(nb_mul(one, x), mzero);
    return nb_tree_tuple(nb_trace_ctx(tr), 3,
                         (nb_tree *[]){nb_leaf(y), nb_leaf(mzero), nb_leaf(ramp)}, out);
}

static void test_fold_uniform(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    uint64_t seed = 5;
    nb_tree *x = rand_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){64, 32}, &seed);
    nb_tree *args = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 1, &x, &args));
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "uniform", body_uniform, NULL, &f));
    static char ir[1 << 14];
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    NBT_TRUE(strstr(ir, " mul ") == NULL && strstr(ir, " add ") == NULL); /* y is x itself */
    NBT_TRUE(strstr(ir, "full {") != NULL);     /* -(0) over [64, 32]: a full */
    NBT_TRUE(strstr(ir, "= constant") != NULL); /* the ramp: a constant */
    nb_tree *r = NULL;
    NBT_OK(ctx, nb_fn_call(f, args, &r));
    const nb_array *xa = nb_tree_get_array(x), *ya = nb_tree_get_array(nb_tree_child(r, 0));
    NBT_TRUE(memcmp(nb_array_data(xa), nb_array_data(ya), nb_array_nbytes(xa)) == 0);
    const float *mz = nb_array_data(nb_tree_get_array(nb_tree_child(r, 1)));
    const float *ramp = nb_array_data(nb_tree_get_array(nb_tree_child(r, 2)));
    for (int i = 0; i < 64 * 32; i++) {
        NBT_TRUE(mz[i] == 0.0f && signbit(mz[i]));
        NBT_TRUE(ramp[i] == (float)(2 * (i % 32)));
    }
    nb_tree_destroy(r);
    nb_fn_destroy(f);
    nb_tree_destroy(args);
    nb_tree_destroy(x);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Sums of zero pads: pieces along one axis, disjoint and covering it, summed in any order
 * (the transpose of a split) become their concatenation; pads that overlap, leave a gap or
 * pad two axes stay sums. args: (x f32[4, 12]) -> (cover, overlap, gap, twice, two, a, b,
 * c) */
static nb_status body_padcat(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    nb_var *a = nb_mul(nb_slice(x, (int64_t[]){0, 0}, (int64_t[]){4, 4}, NULL),
                       nb_scalar(tr, 2.0)); /* a -0 stays -0 here, +0 in the sum */
    nb_var *b = nb_sin(nb_slice(x, (int64_t[]){0, 4}, (int64_t[]){4, 8}, NULL));
    nb_var *c = nb_slice(x, (int64_t[]){0, 8}, (int64_t[]){4, 12}, NULL); /* NaN, -0 */
    nb_var *pa = nb_pad(a, (int64_t[]){0, 0}, (int64_t[]){0, 8}, 0.0);
    nb_var *pb = nb_pad(b, (int64_t[]){0, 4}, (int64_t[]){0, 4}, 0.0);
    nb_var *pc = nb_pad(c, (int64_t[]){0, 8}, (int64_t[]){0, 0}, 0.0);
    nb_var *cover = nb_add(nb_add(pb, pc), pa);
    nb_var *wide = nb_pad(nb_slice(x, (int64_t[]){0, 2}, (int64_t[]){4, 8}, NULL),
                          (int64_t[]){0, 2}, (int64_t[]){0, 4}, 0.0);
    nb_var *overlap = nb_add(nb_add(pa, wide), pc);
    nb_var *gap = nb_add(pa, pc);
    nb_var *twice = nb_add(pa, pa); /* the same piece twice: an overlap */
    nb_var *corner = nb_pad(nb_slice(x, (int64_t[]){0, 4}, (int64_t[]){2, 12}, NULL),
                            (int64_t[]){0, 4}, (int64_t[]){2, 0}, 0.0); /* two axes */
    nb_var *two = nb_add(pa, corner);
    return nb_tree_tuple(nb_trace_ctx(tr), 8,
                         (nb_tree *[]){nb_leaf(cover), nb_leaf(overlap), nb_leaf(gap),
                                       nb_leaf(twice), nb_leaf(two), nb_leaf(a), nb_leaf(b),
                                       nb_leaf(c)},
                         out);
}

static void test_pad_concat(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    float xv[4 * 12];
    for (int i = 0; i < 4 * 12; i++) {
        xv[i] = (float)sin(0.7 * i + 0.1) * 3.0f;
    }
    xv[1] = -0.0f;  /* a: 2 x -0 = -0 */
    xv[20] = -0.0f; /* c */
    xv[21] = NAN;   /* c */
    xv[17] = -0.0f; /* b: sin(-0) = -0 */
    nb_array *xa = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F32, 2, (int64_t[]){4, 12}, xv, &xa));
    nb_tree *x = NULL, *args = NULL;
    NBT_OK(ctx, nb_tree_array(xa, &x));
    nb_array_destroy(xa);
    NBT_OK(ctx, nb_tree_tuple(ctx, 1, &x, &args));
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "padcat", body_padcat, NULL, &f));
    static char ir[1 << 15];
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    int n_cat = 0;
    for (const char *p = ir; (p = strstr(p, "= concatenate ")) != NULL; p++) {
        n_cat++;
    }
    printf("sums of pads as concatenations: %d (the covering sum; the overlapping ones, the one "
           "with a gap and the one padded along two axes stay sums)\n",
           n_cat);
    NBT_EQ_I64(n_cat, 1);
    nb_tree *r = NULL;
    NBT_OK(ctx, nb_fn_call(f, args, &r));
    /* the sums' bits, from the pieces nabla made: each element of the covering sum its one
     * piece plus +0s (a -0 becomes +0, a NaN stays), the others added as traced */
    const float *got[5], *pc[3];
    for (int k = 0; k < 5; k++) {
        got[k] = nb_array_data(nb_tree_get_array(nb_tree_child(r, k)));
    }
    for (int k = 0; k < 3; k++) {
        pc[k] = nb_array_data(nb_tree_get_array(nb_tree_child(r, 5 + k)));
    }
    volatile float zero = 0.0f;
    int bad = 0, negz = 0;
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 12; j++) {
            float pa = j < 4 ? pc[0][i * 4 + j] : zero,
                  pb = j >= 4 && j < 8 ? pc[1][i * 4 + j - 4] : zero;
            float pcv = j >= 8 ? pc[2][i * 4 + j - 8] : zero;
            float wide = j >= 2 && j < 8 ? xv[i * 12 + j] : zero;
            float corner = i < 2 && j >= 4 ? xv[i * 12 + j] : zero;
            float want[5] = {(pb + pcv) + pa, (pa + wide) + pcv, pa + pcv, pa + pa, pa + corner};
            for (int k = 0; k < 5; k++) {
                bad += memcmp(&want[k], &got[k][i * 12 + j], sizeof(float)) != 0;
            }
            negz += (pa == 0.0f && signbit(pa)) || (pb == 0.0f && signbit(pb)) ||
                    (pcv == 0.0f && signbit(pcv));
        }
    }
    printf("elements whose bits differ from the sums: %d of 240 (pieces holding -0: %d)\n", bad,
           negz);
    NBT_EQ_I64(bad, 0);
    NBT_TRUE(negz >= 3); /* the -0s reached the pieces: the +0 they get is tested */
    nb_tree_destroy(r);
    nb_fn_destroy(f);
    nb_tree_destroy(args);
    nb_tree_destroy(x);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* log_softmax's exp is read by its sum and by the gradient: computed once and stored (not
 * recomputed by nbi_pass_remat), with the same value as when it is recomputed. */
static nb_status body_lsm_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]"), *w = nb_get(tr, args, "[1]");
    return nb_return(nb_sum(nb_mul(nb_log_softmax(x, -1), w), NULL, 0, false), out);
}

static void test_remat_keeps_exp(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    float xv[6 * 40], wv[6 * 40];
    for (int i = 0; i < 6 * 40; i++) {
        xv[i] = 3.0f * sinf(0.7f * (float)i);
        wv[i] = (float)((i * 7) % 5) - 2.0f;
    }
    nb_array *xa = nbt_arr_f32(ctx, 2, (int64_t[]){6, 40}, xv);
    nb_array *wa = nbt_arr_f32(ctx, 2, (int64_t[]){6, 40}, wv);
    nb_tree *lx = NULL, *lw = NULL;
    NBT_OK(ctx, nb_tree_array(xa, &lx));
    NBT_OK(ctx, nb_tree_array(wa, &lw));
    nb_array_destroy(xa);
    nb_array_destroy(wa);
    nb_tree *args = nbt_tuple_take(ctx, 2, (nb_tree *[]){lx, lw}), *res = NULL;
    nb_fn *f = NULL, *g = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "lsm", body_lsm_loss, NULL, &f));
    NBT_OK(ctx, nb_value_and_grad(f, NULL, &g));
    static char ir[32768];
    NBT_OK(ctx, nb_fn_format_ir(g, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    int n_exp = 0;
    for (const char *q = strstr(ir, " exp "); q != NULL; q = strstr(q + 1, " exp ")) {
        n_exp++;
    }
    if (n_exp != 1) {
        fail_msg("expected one exp in value_and_grad(log_softmax):\n%s", ir);
    }
    NBT_OK(ctx, nb_fn_call(g, args, &res));
    /* d/dx_ij = w_ij - softmax_ij * sum_k w_ik, in double */
    const nb_array *ga = nb_tree_get_array(nb_tree_child(res, 1));
    assert_non_null(ga);
    const float *gv = nb_array_data(ga);
    for (int r = 0; r < 6; r++) {
        double m = -INFINITY, s = 0, sw = 0;
        for (int c = 0; c < 40; c++) {
            m = fmax(m, xv[r * 40 + c]);
        }
        for (int c = 0; c < 40; c++) {
            s += exp(xv[r * 40 + c] - m);
            sw += wv[r * 40 + c];
        }
        for (int c = 0; c < 40; c++) {
            double want = wv[r * 40 + c] - exp(xv[r * 40 + c] - m) / s * sw;
            NBT_NEAR(gv[r * 40 + c], want, 2e-6 * (1 + fabs(want)));
        }
    }
    nb_tree_destroy(res);
    nb_tree_destroy(args);
    nb_fn_destroy(f);
    nb_fn_destroy(g);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transpose_into_matmul),
        cmocka_unit_test(test_algebraic_simplification),
        cmocka_unit_test(test_fusion_is_bit_identical),
        cmocka_unit_test(test_fusion_views),
        cmocka_unit_test(test_fused_reductions),
        cmocka_unit_test(test_fused_short_runs),
        cmocka_unit_test(test_pad_push),
        cmocka_unit_test(test_fusion_many_inputs),
        cmocka_unit_test(test_fusion_multi_output),
        cmocka_unit_test(test_compile_time_linear),
        cmocka_unit_test(test_fold_uniform),
        cmocka_unit_test(test_pad_concat),
        cmocka_unit_test(test_remat_keeps_exp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_pool_ops.c -- max pooling's pool_take / pool_scatter ops (src/ad/op_conv.c) against
 * the composition they replaced in nn's max pool: the windows cut into columns (im2col,
 * padding -inf), argmax over each column and take_along_axis, whose gradient is a masked
 * sum and col2im. Inputs full of ties (values in {-1, 0, 1, 2}), with NaNs and -infs, over
 * 1-d, 2-d and 3-d windows with strides, overlap, padding, windows of padding alone and
 * windows all inside the plane;
 * f32 and f64; forward values and the gradient (integer cotangents, so the overlapping
 * windows' sums are exact in any order) bit for bit, at 1 and 2 threads. Plus the tap-table
 * path's limit (a plane too large for the table takes the row path: the same bits).
 */
#include "ad/ir.h"
#include "nbtest.h"

#include <math.h>
#include <stdlib.h>

typedef struct pgeom {
    int nd;
    int64_t x[5], k[3], s[3], lo[3], hi[3];
} pgeom;

static const pgeom GEOMS[] = {
    {2, {3, 4, 8, 8}, {2, 2}, {2, 2}, {0, 0}, {0, 0}},                /* a CNN's 2x2 */
    {2, {2, 3, 7, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 0}},                /* overlap, padding */
    {1, {2, 3, 11}, {3}, {1}, {2}, {2}},                              /* 1-d, wide padding */
    {3, {1, 2, 4, 5, 6}, {2, 2, 3}, {2, 1, 2}, {0, 1, 1}, {1, 0, 1}}, /* 3-d */
    {2, {2, 2, 3, 3}, {2, 2}, {1, 1}, {2, 2}, {2, 2}},                /* windows of padding */
    {2, {1, 2, 40, 70}, {3, 3}, {1, 1}, {1, 1}, {1, 1}},              /* too large a table */
    /* windows inside the plane (f32: 4 windows of a row at a time, nbi_pool_argmax_dense) */
    {2, {2, 3, 6, 11}, {3, 2}, {1, 1}, {0, 0}, {0, 0}}, /* stride 1, a row's last 2 alone */
    {2, {2, 3, 8, 9}, {2, 2}, {2, 2}, {0, 0}, {0, 0}},  /* stride 2, the plane's end near */
    {1, {2, 3, 20}, {3}, {3}, {0}, {0}},                /* stride 3 */
};

static const pgeom *g_geom;
static int g_new; /* 1: pool_take; 0: the columns */

/* args (x, g): sum(pool(x) * g) */
static nb_status body_pool(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const pgeom *G = g_geom;
    nb_var *x = nb_get(tr, args, "[0]"), *y;
    int64_t ones[3] = {1, 1, 1};
    if (g_new) {
        y = nbi_pool_op(NBI_OP_POOL_TAKE, x, x, G->nd, G->k, G->s, ones, G->lo, G->hi, -INFINITY);
    } else {
        int64_t n = G->x[0] * G->x[1], xs[5] = {n, 1}, k = 1, l = 1, ys[5];
        memcpy(xs + 2, G->x + 2, (size_t)G->nd * sizeof(int64_t));
        ys[0] = G->x[0];
        ys[1] = G->x[1];
        for (int d = 0; d < G->nd; d++) {
            k *= G->k[d];
            ys[2 + d] = (G->x[2 + d] + G->lo[d] + G->hi[d] - G->k[d]) / G->s[d] + 1;
            l *= ys[2 + d];
        }
        nb_var *cols = nbi_im2col(nb_reshape(x, G->nd + 2, xs), G->nd + NBI_CONV_BATCH_FIRST, G->k,
                                  G->s, ones, G->lo, G->hi, -INFINITY);
        cols = nb_reshape(cols, 3, (const int64_t[]){n, k, l});
        y = nb_reshape(nb_take_along_axis(cols, nb_argmax(cols, 1, true), 1), G->nd + 2, ys);
    }
    nb_var *p = nb_mul(y, nb_get(tr, args, "[1]"));
    /* the loss: the products where they are finite (a NaN or inf window value would make
     * the sum non-finite; its gradient is the same either way) */
    nb_var *fin = nb_select(nb_lt(nb_abs(p), nb_scalar(tr, INFINITY)), p, nb_scalar(tr, 0.0));
    return nb_tree_tuple(nb_trace_ctx(tr), 2,
                         (nb_tree *[]){nb_leaf(nb_sum(fin, NULL, 0, false)), nb_leaf(y)}, out);
}

static nb_tree *pool_args(nb_ctx *ctx, nb_dtype dt, const pgeom *G, uint32_t seed) {
    int r = G->nd + 2;
    int64_t ys[5] = {G->x[0], G->x[1]};
    for (int d = 0; d < G->nd; d++) {
        ys[2 + d] = (G->x[2 + d] + G->lo[d] + G->hi[d] - G->k[d]) / G->s[d] + 1;
    }
    nb_array *a[2] = {NULL, NULL};
    NBT_OK(ctx, nb_array_zeros(ctx, dt, r, G->x, &a[0]));
    NBT_OK(ctx, nb_array_zeros(ctx, dt, r, ys, &a[1]));
    for (int i = 0; i < 2; i++) {
        for (int64_t j = 0; j < nb_array_size(a[i]); j++) {
            seed = seed * 1664525u + 1013904223u;
            uint32_t u = seed >> 24;
            double v = i == 0 ? (double)(int)(u % 4) - 1.0 : (double)(int)(u % 7) - 3.0;
            if (i == 0 && u >= 250) {
                v = NAN;
            } else if (i == 0 && u >= 244) {
                v = -INFINITY;
            }
            if (dt == NB_DTYPE_F32) {
                ((float *)nb_array_data(a[i]))[j] = (float)v;
            } else {
                ((double *)nb_array_data(a[i]))[j] = v;
            }
        }
    }
    nb_tree *l[2], *args = NULL;
    for (int i = 0; i < 2; i++) {
        NBT_OK(ctx, nb_tree_array(a[i], &l[i]));
        nb_array_destroy(a[i]);
    }
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, l, &args));
    nb_tree_destroy(l[0]);
    nb_tree_destroy(l[1]);
    return args;
}

static bool same_bits(const nb_array *a, const nb_array *b) {
    return nb_array_nbytes(a) == nb_array_nbytes(b) &&
           memcmp(nb_array_data(a), nb_array_data(b), nb_array_nbytes(a)) == 0;
}

static void test_pool_ops_match_columns(void **state) {
    (void)state;
    for (size_t gi = 0; gi < sizeof GEOMS / sizeof GEOMS[0]; gi++) {
        g_geom = &GEOMS[gi];
        for (int dti = 0; dti < 2; dti++) {
            nb_dtype dt = dti ? NB_DTYPE_F64 : NB_DTYPE_F32;
            nb_tree *res[3] = {NULL, NULL, NULL}; /* columns; new at 1 and 2 threads */
            nb_ctx *ctx[3];
            for (int v = 0; v < 3; v++) {
                nb_ctx_opts o = nb_ctx_opts_default();
                o.n_threads = v == 2 ? 2 : 1;
                NBT_OK(NULL, nb_ctx_create(&o, &ctx[v]));
                g_new = v > 0;
                nb_tree *args = pool_args(ctx[v], dt, g_geom, 7u + (uint32_t)gi);
                nb_fn *f = NULL, *df = NULL;
                NBT_OK(ctx[v],
                       nb_fn_create(ctx[v], g_new ? "pool_take" : "columns", body_pool, NULL, &f));
                nb_grad_opts go = nb_grad_opts_default();
                go.has_aux = true;
                NBT_OK(ctx[v], nb_grad(f, &go, &df));
                NBT_OK(ctx[v], nb_fn_call(df, args, &res[v]));
                if (v > 0) { /* the optimized IR has the new op and no columns */
                    static char ir[1 << 15];
                    NBT_OK(ctx[v], nb_fn_format_ir(df, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
                    NBT_TRUE(strstr(ir, "pool_take") != NULL);
                    NBT_TRUE(strstr(ir, "pool_scatter") != NULL);
                    NBT_TRUE(strstr(ir, "im2col") == NULL);
                }
                nb_fn_destroy(df);
                nb_fn_destroy(f);
                nb_tree_destroy(args);
            }
            for (int v = 1; v < 3; v++) {
                for (int leaf = 0; leaf < 2; leaf++) { /* the gradient of x, the pooled x */
                    const nb_array *a = nb_tree_get_array(nb_tree_child(res[0], leaf));
                    const nb_array *b = nb_tree_get_array(nb_tree_child(res[v], leaf));
                    if (!same_bits(a, b)) {
                        fail_msg("geometry #%zu %s, %d thread(s): the %s differs from the "
                                 "columns'",
                                 gi, nb_dtype_name(dt), v == 2 ? 2 : 1,
                                 leaf ? "pooled value" : "gradient");
                    }
                }
            }
            for (int v = 0; v < 3; v++) {
                nb_tree_destroy(res[v]);
                nbt_assert_no_live(ctx[v]);
                nb_ctx_destroy(ctx[v]);
            }
        }
    }
}

/* Misuse reaches the op's own checks with a message naming it and the shapes. */
static nb_status body_bad(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]"), *g = nb_get(tr, args, "[1]");
    int64_t k[2] = {2, 2}, s[2] = {2, 2}, z[2] = {0, 0}, ones[2] = {1, 1};
    return nb_return(nbi_pool_op(NBI_OP_POOL_SCATTER, x, g, 2, k, s, ones, z, z, 0.0), out);
}

static void test_pool_ops_misuse(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a[2] = {NULL, NULL};
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 4, (int64_t[]){2, 3, 8, 8}, &a[0]));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 4, (int64_t[]){2, 3, 4, 5}, &a[1]));
    nb_tree *l[2], *args = NULL;
    for (int i = 0; i < 2; i++) {
        NBT_OK(ctx, nb_tree_array(a[i], &l[i]));
        nb_array_destroy(a[i]);
    }
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, l, &args));
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "bad", body_bad, NULL, &f));
    nb_tree *r = NULL;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_fn_call(f, args, &r));
    NBT_ERRMSG_HAS(ctx, "pool_scatter");
    NBT_ERRMSG_HAS(ctx, "f32[2,3,4,5]");
    NBT_ERRMSG_HAS(ctx, "4 windows");
    NBT_TRUE(r == NULL);
    nb_fn_destroy(f);
    for (int i = 0; i < 2; i++) {
        nb_tree_destroy(l[i]);
    }
    nb_tree_destroy(args);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_ops_match_columns),
        cmocka_unit_test(test_pool_ops_misuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

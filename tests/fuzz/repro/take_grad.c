/*
 * take_grad.c -- found by fuzz_programs (an input with a 40000-element array): the
 * gradients of nb_take and nb_take_along_axis are built from a dense selection of the
 * indices against every row of the axis (src/ad/op_shape.c, nbi_vjp_take and
 * nbi_vjp_take_along), which
 *   1. costs O(dim * n) memory and time for n indices into an axis of dim rows: the grad
 *      of take_along_axis(f64[40000], i32[40000] indices) asks for a 12.8 GB buffer (an
 *      embedding table of 50000 rows looked up 10000 times: 4 GB in f64), where a
 *      scatter-add needs O(n); and
 *   2. (nb_take's, a matmul with the 0/1 selection) spreads a non-finite cotangent to the
 *      rows no index picked: the gradient of
 *      sum(exp(1000 * take(x, [0]))) with respect to x is [inf, NaN, NaN] instead of
 *      [inf, 0, 0] (JAX's scatter-add gives 0 there), so one overflowing lookup turns the
 *      whole table's gradient into NaN. The source says so in a comment (nbi_vjp_take);
 *      nabla/ad.h and trace.h do not.
 *
 *   cc -std=c17 -I include tests/fuzz/repro/take_grad.c -o /tmp/take_grad \
 *      build/libnabla.a -lsleef -lblis -lz -lpthread -lm && /tmp/take_grad
 *
 * Prints the gradient of (2) and the workspace of (1) for 1000, 2000 and 4000 indices (x4
 * per doubling: 8 MB, 32 MB, 128 MB); exits 1 if either shows.
 */
#include <nabla/nabla.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>

/* loss = sum(exp(1000 * take(x, [0]))) */
static nb_status body_take(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    nb_var *idx = nb_full(tr, NB_DTYPE_I32, 1, (const int64_t[]){1}, 0.0);
    nb_var *y = nb_take(x, idx, 0);
    return nb_return(nb_sum(nb_exp(nb_mul(y, nb_scalar(tr, 1000.0))), NULL, 0, false), out);
}

/* loss = sum(take_along_axis(x, idx, 0)), x f64[n], idx = n indices */
static nb_status body_along(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    int64_t n = nb_var_dim(x, 0);
    nb_var *idx = nb_iota(tr, NB_DTYPE_I32, 1, &n, 0);
    return nb_return(nb_sum(nb_take_along_axis(x, idx, 0), NULL, 0, false), out);
}

static nb_tree *args_of(nb_ctx *ctx, nb_array *x) {
    nb_tree *l = NULL, *t = NULL;
    nb_tree_array(x, &l);
    nb_tree_tuple(ctx, 1, &l, &t);
    nb_tree_destroy(l);
    return t;
}

int main(void) {
    nb_ctx *ctx = NULL;
    nb_ctx_create(NULL, &ctx);
    int bad = 0;

    /* 2: a non-finite cotangent */
    nb_fn *f = NULL, *g = NULL;
    nb_fn_create(ctx, "take_loss", body_take, NULL, &f);
    nb_grad(f, NULL, &g);
    nb_array *x = NULL;
    nb_array_from_data(ctx, NB_DTYPE_F64, 1, (const int64_t[]){3}, (const double[]){1, 2, 3}, &x);
    nb_tree *args = args_of(ctx, x), *out = NULL;
    if (nb_fn_call(g, args, &out) != NB_OK) {
        printf("grad of take: %s\n", nb_ctx_errmsg(ctx));
        return 1;
    }
    double d[3];
    for (int i = 0; i < 3; i++) {
        nb_array_get_flat(nb_tree_get_array(out), i, &d[i]);
    }
    bool nan_rows = isnan(d[1]) || isnan(d[2]);
    printf("grad of sum(exp(1000 * take(x, [0]))) at x = [1, 2, 3]: [%g, %g, %g] (expected [inf, "
           "0, 0]) %s\n",
           d[0], d[1], d[2], nan_rows ? "-- NaN in rows no index picked" : "ok");
    bad |= nan_rows;
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    nb_array_destroy(x);
    nb_fn_destroy(g);
    nb_fn_destroy(f);

    /* 1: memory: the workspace of the gradient's executable for n = 1000, 2000, 4000 indices
     * into an axis of n rows (a scatter-add would need O(n)) */
    nb_fn_create(ctx, "along_loss", body_along, NULL, &f);
    nb_grad(f, NULL, &g);
    size_t ws[3] = {0, 0, 0};
    for (int k = 0; k < 3; k++) {
        int64_t n = 1000 << k;
        nb_array_zeros(ctx, NB_DTYPE_F64, 1, &n, &x);
        args = args_of(ctx, x);
        out = NULL;
        nb_status st = nb_fn_call(g, args, &out);
        nb_fn_stats fs;
        nb_fn_stats_get(g, &fs);
        ws[k] = fs.workspace_bytes;
        printf("grad of sum(take_along_axis(f64[%lld], %lld indices)): %s, workspace %zu bytes\n",
               (long long)n, (long long)n, nb_status_name(st), ws[k]);
        nb_tree_destroy(out);
        nb_tree_destroy(args);
        nb_array_destroy(x);
    }
    bool quadratic = ws[2] > 10 * ws[0];
    printf("  %s (40000 indices: 12.8 GB, refused with NB_ERR_OOM or worse)\n",
           quadratic ? "quadratic in n" : "linear in n");
    bad |= quadratic;
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nb_ctx_destroy(ctx);
    return bad;
}

/*
 * test_vmap.c -- nb_vmap beyond the per-op checks of test_grad_conformance.c (d):
 *   - ops without gradient cases there (comparisons, argmax, one_hot, integer take, the
 *     random samplers over split keys, check) against the unbatched calls, bit for bit;
 *   - composition: per-example gradients (vmap of grad) of a small MLP with cross-entropy
 *     against separate grads, their mean against grad of the mean loss (grad of vmap),
 *     jvp of vmap, vmap of vmap, jit of vmap (one trace for new data), out_axes and
 *     unbatched outputs, axis_size for a vmapped init from split keys;
 *   - errors naming the leaf paths and the fix; allocation failures over a jitted vmap of a
 *     grad: NB_ERR_OOM, nothing leaked.
 */
#include "nbtest.h"

#include <math.h>
#include <string.h>

static double at(const nb_tree *t, int64_t i) {
    double v = NAN;
    nb_array_get_flat(nb_tree_get_array(t), i, &v);
    return v;
}

static nb_tree *f64_leaf(nb_ctx *ctx, int rank, const int64_t *shape, const double *v) {
    nb_array *a = nbt_arr_f64(ctx, rank, shape, v);
    nb_tree *l = NULL;
    NBT_OK(ctx, nb_tree_array(a, &l));
    nb_array_destroy(a);
    return l;
}

static nb_tree *ints(nb_ctx *ctx, int n, const int *v) {
    nb_tree *l[8];
    for (int i = 0; i < n; i++) {
        if (v[i] == -99) {
            NBT_OK(ctx, nb_tree_null(ctx, &l[i]));
        } else {
            NBT_OK(ctx, nb_tree_int(ctx, v[i], &l[i]));
        }
    }
    return nbt_tuple_take(ctx, n, l);
}

/* ---- ops without gradient cases ------------------------------------------------------- */

/* self: which op. args: (x f64[4], y f64[4], i i32[3], key u32[2]) */
static nb_status body_ops(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    int64_t k = 0;
    nb_tree_get_int(self, &k);
    nb_var *x = nb_get(tr, args, "[0]"), *y = nb_get(tr, args, "[1]");
    nb_var *i = nb_get(tr, args, "[2]"), *key = nb_get(tr, args, "[3]");
    nb_var *r = NULL;
    switch (k) {
    case 0:
        r = nb_cast(nb_lt(x, y), NB_DTYPE_F64);
        break;
    case 1:
        r = nb_cast(nb_argmax(x, 0, false), NB_DTYPE_F64);
        break;
    case 2:
        r = nb_one_hot(i, 5, NB_DTYPE_F64);
        break;
    case 3:
        r = nb_take(x, i, 0);
        break;
    case 4:
        r = nb_rng_uniform(key, NB_DTYPE_F64, 1, (int64_t[]){3}, 0.0, 1.0);
        break;
    case 5:
        r = nb_rng_normal(nb_rng_fold_in(key, nb_scalar_typed(tr, NB_DTYPE_I32, 7)), NB_DTYPE_F32,
                          1, (int64_t[]){4});
        r = nb_cast(r, NB_DTYPE_F64);
        break;
    case 6:
        r = nb_cast(nb_rng_split(key, 3), NB_DTYPE_F64);
        break;
    case 7:
        r = nb_select(nb_gt(x, y), nb_sin(x), nb_cos(y));
        break;
    default:
        r = nb_cast(nb_logical_and(nb_ge(x, y), nb_ne(x, nb_scalar(tr, 0.5))), NB_DTYPE_F64);
        break;
    }
    return nb_return(r, out);
}

static void test_ops_without_gradients(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    enum { B = 3 };
    double xs[B][4], ys[B][4];
    int32_t is[B][3];
    uint64_t seeds[B] = {1, 2, 42};
    nb_array *keys[B];
    for (int b = 0; b < B; b++) {
        for (int j = 0; j < 4; j++) {
            xs[b][j] = sin(1.7 * b + j);
            ys[b][j] = cos(0.9 * b - j);
        }
        for (int j = 0; j < 3; j++) {
            is[b][j] = (int32_t)((b * 3 + j * 2) % 7) - 1; /* -1 .. 5: clamped and negative */
        }
        NBT_OK(ctx, nb_random_key(ctx, seeds[b], &keys[b]));
    }
    for (int op = 0; op < 9; op++) {
        nb_tree *self = NULL;
        NBT_OK(ctx, nb_tree_int(ctx, op, &self));
        nb_fn *f = NULL, *vf = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "ops", body_ops, self, &f));
        NBT_OK(ctx, nb_vmap(f, NULL, &vf));
        /* batched args: every leaf on axis 0 */
        nb_array *bx = nbt_arr_f64(ctx, 2, (int64_t[]){B, 4}, &xs[0][0]);
        nb_array *by = nbt_arr_f64(ctx, 2, (int64_t[]){B, 4}, &ys[0][0]), *bi = NULL, *bk = NULL;
        NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 2, (int64_t[]){B, 3}, &is[0][0], &bi));
        int32_t kd[B][2];
        for (int b = 0; b < B; b++) {
            memcpy(kd[b], nb_array_data(keys[b]), sizeof kd[b]);
        }
        NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 2, (int64_t[]){B, 2}, &kd[0][0], &bk));
        nb_tree *l[4] = {NULL}, *args = NULL, *out = NULL;
        nb_array *arrs[4] = {bx, by, bi, bk};
        for (int j = 0; j < 4; j++) {
            NBT_OK(ctx, nb_tree_array(arrs[j], &l[j]));
            nb_array_destroy(arrs[j]);
        }
        args = nbt_tuple_take(ctx, 4, l);
        NBT_OK(ctx, nb_fn_call(vf, args, &out));
        int64_t n = nb_array_size(nb_tree_get_array(out)) / B;
        for (int b = 0; b < B; b++) {
            nb_tree *ll[4], *la = NULL, *lo = NULL;
            ll[0] = f64_leaf(ctx, 1, (int64_t[]){4}, xs[b]);
            ll[1] = f64_leaf(ctx, 1, (int64_t[]){4}, ys[b]);
            nb_array *ia = NULL;
            NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 1, (int64_t[]){3}, is[b], &ia));
            NBT_OK(ctx, nb_tree_array(ia, &ll[2]));
            nb_array_destroy(ia);
            NBT_OK(ctx, nb_tree_array(keys[b], &ll[3]));
            la = nbt_tuple_take(ctx, 4, ll);
            NBT_OK(ctx, nb_fn_call(f, la, &lo));
            NBT_EQ_I64(nb_array_size(nb_tree_get_array(lo)), n);
            for (int64_t e = 0; e < n; e++) {
                double got = at(out, b * n + e), want = at(lo, e);
                if (!(got == want)) {
                    fail_msg("op case %d lane %d [%lld]: vmap %.17g, unbatched %.17g", op, b,
                             (long long)e, got, want);
                }
            }
            nb_tree_destroy(lo);
            nb_tree_destroy(la);
        }
        nb_tree_destroy(out);
        nb_tree_destroy(args);
        nb_fn_destroy(vf);
        nb_fn_destroy(f);
        nb_tree_destroy(self);
    }
    for (int b = 0; b < B; b++) {
        nb_array_destroy(keys[b]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- composition: per-example gradients of an MLP ------------------------------------ */

enum { NI = 6, NH = 5, NO = 3, NB = 8 };

/* args: (params dict(w1, b1, w2, b2), x f64[NI], label i32[]) -> cross-entropy loss */
static nb_status body_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *w1 = nb_get(tr, args, "[0].w1"), *b1 = nb_get(tr, args, "[0].b1");
    nb_var *w2 = nb_get(tr, args, "[0].w2"), *b2 = nb_get(tr, args, "[0].b2");
    nb_var *x = nb_get(tr, args, "[1]"), *lab = nb_get(tr, args, "[2]");
    nb_var *h = nb_tanh(nb_add(nb_matmul(x, w1), b1));
    nb_var *logits = nb_add(nb_matmul(h, w2), b2);
    nb_var *lp = nb_log_softmax(logits, -1);
    nb_var *pick = nb_sum(nb_mul(lp, nb_one_hot(lab, NO, NB_DTYPE_F64)), NULL, 0, false);
    return nb_return(nb_neg(pick), out);
}

static nb_tree *mlp_params(nb_ctx *ctx) {
    double w1[NI * NH], b1[NH], w2[NH * NO], b2[NO];
    for (int i = 0; i < NI * NH; i++) {
        w1[i] = 0.3 * sin(1.3 * i + 0.2);
    }
    for (int i = 0; i < NH; i++) {
        b1[i] = 0.1 * cos(i);
    }
    for (int i = 0; i < NH * NO; i++) {
        w2[i] = 0.4 * cos(0.7 * i - 0.5);
    }
    for (int i = 0; i < NO; i++) {
        b2[i] = 0.05 * i;
    }
    nb_tree *l[4] = {
        f64_leaf(ctx, 2, (int64_t[]){NI, NH}, w1), f64_leaf(ctx, 1, (int64_t[]){NH}, b1),
        f64_leaf(ctx, 2, (int64_t[]){NH, NO}, w2), f64_leaf(ctx, 1, (int64_t[]){NO}, b2)};
    nb_tree *d = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 4, (const char *[]){"w1", "b1", "w2", "b2"}, l, &d));
    for (int i = 0; i < 4; i++) {
        nb_tree_destroy(l[i]);
    }
    return d;
}

static void data(double *x, int32_t *lab) {
    for (int b = 0; b < NB; b++) {
        for (int i = 0; i < NI; i++) {
            x[b * NI + i] = sin(0.37 * b * NI + 1.1 * i);
        }
        lab[b] = (int32_t)(b % NO);
    }
}

/* mean loss over the batch, through vmap (for grad of vmap) */
static nb_status body_mean(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_fn *f = NULL, *v = NULL;
    nb_status st = nb_fn_create(ctx, "loss", body_loss, NULL, &f);
    nb_tree *ia = NULL;
    if (st == NB_OK) {
        ia = ints(ctx, 3, (int[]){-99, 0, 0});
        nb_vmap_opts o = nb_vmap_opts_default();
        o.in_axes = ia;
        st = nb_vmap(f, &o, &v);
    }
    const nb_tree *r = st == NB_OK ? nb_apply(tr, v, args) : NULL;
    nb_fn_destroy(v);
    nb_fn_destroy(f);
    nb_tree_destroy(ia);
    if (r == NULL) {
        return nb_trace_status(tr) != NB_OK ? nb_trace_status(tr) : st;
    }
    nb_var *losses = nb_var_of(tr, r);
    return nb_return(nb_mean(losses, NULL, 0, false), out);
}

static void test_per_example_gradients(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    double x[NB * NI];
    int32_t lab[NB];
    data(x, lab);
    nb_tree *params = mlp_params(ctx);
    nb_fn *loss = NULL, *g = NULL, *vg = NULL, *jvg = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "loss", body_loss, NULL, &loss));
    NBT_OK(ctx, nb_grad(loss, NULL, &g));
    nb_tree *ia = ints(ctx, 3, (int[]){-99, 0, 0});
    nb_vmap_opts o = nb_vmap_opts_default();
    o.in_axes = ia;
    NBT_OK(ctx, nb_vmap(g, &o, &vg));
    NBT_OK(ctx, nb_jit(vg, NULL, &jvg));
    nb_array *la = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 1, (int64_t[]){NB}, lab, &la));
    nb_tree *ll = NULL;
    NBT_OK(ctx, nb_tree_array(la, &ll));
    nb_array_destroy(la);
    nb_tree *args = nbt_tuple_take(
        ctx, 3,
        (nb_tree *[]){nb_tree_retain(params), f64_leaf(ctx, 2, (int64_t[]){NB, NI}, x), ll});
    nb_tree *pg = NULL;
    NBT_OK(ctx, nb_fn_call(jvg, args, &pg));
    /* each lane against a separate grad */
    static const char *const keys[4] = {"w1", "b1", "w2", "b2"};
    static const int64_t sizes[4] = {NI * NH, NH, NH * NO, NO};
    double worst = 0, mean[4][NI * NH] = {{0}};
    for (int b = 0; b < NB; b++) {
        nb_array *lb = NULL;
        NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_I32, lab[b], &lb));
        nb_tree *lbl = NULL;
        NBT_OK(ctx, nb_tree_array(lb, &lbl));
        nb_array_destroy(lb);
        nb_tree *a1 =
            nbt_tuple_take(ctx, 3,
                           (nb_tree *[]){nb_tree_retain(params),
                                         f64_leaf(ctx, 1, (int64_t[]){NI}, x + b * NI), lbl});
        nb_tree *g1 = NULL;
        NBT_OK(ctx, nb_fn_call(g, a1, &g1));
        for (int k = 0; k < 4; k++) {
            const nb_tree *gv = nb_tree_get(pg, keys[k]), *gs = nb_tree_get(g1, keys[k]);
            for (int64_t e = 0; e < sizes[k]; e++) {
                double got = at(gv, b * sizes[k] + e), want = at(gs, e);
                worst = nbt_max(worst, fabs(got - want) / fmax(1e-3, fabs(want)));
                mean[k][e] += want / NB;
            }
        }
        nb_tree_destroy(g1);
        nb_tree_destroy(a1);
    }
    print_message("vmap(grad) of an MLP + cross-entropy, %d examples: worst lane vs separate "
                  "grad %.2e (relative)\n",
                  NB, worst);
    NBT_TRUE(worst <= 1e-12);
    /* grad of the mean loss through vmap == the mean of the per-example gradients */
    nb_fn *mf = NULL, *mg = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "mean_loss", body_mean, NULL, &mf));
    NBT_OK(ctx, nb_grad(mf, NULL, &mg));
    nb_tree *gm = NULL;
    NBT_OK(ctx, nb_fn_call(mg, args, &gm));
    double wm = 0;
    for (int k = 0; k < 4; k++) {
        for (int64_t e = 0; e < sizes[k]; e++) {
            double got = at(nb_tree_get(gm, keys[k]), e);
            wm = nbt_max(wm, fabs(got - mean[k][e]) / fmax(1e-3, fabs(mean[k][e])));
        }
    }
    print_message("grad of the mean loss through vmap vs the mean of per-example grads: "
                  "%.2e\n",
                  wm);
    NBT_TRUE(wm <= 1e-12);
    /* jit(vmap(grad)): new data, no retrace */
    nb_tree_destroy(pg);
    for (int i = 0; i < NB * NI; i++) {
        x[i] *= 1.5;
    }
    nb_tree *args2 = nbt_tuple_take(
        ctx, 3,
        (nb_tree *[]){nb_tree_retain(params), f64_leaf(ctx, 2, (int64_t[]){NB, NI}, x),
                      nb_tree_retain((nb_tree *)nb_tree_child(args, 2))});
    NBT_OK(ctx, nb_fn_call(jvg, args2, &pg));
    nb_fn_stats st;
    NBT_OK(ctx, nb_fn_stats_get(jvg, &st));
    NBT_EQ_I64(st.n_traces, 1);
    nb_tree_destroy(pg);
    nb_tree_destroy(args2);
    nb_tree_destroy(gm);
    nb_fn_destroy(mg);
    nb_fn_destroy(mf);
    nb_tree_destroy(args);
    nb_tree_destroy(ia);
    nb_fn_destroy(jvg);
    nb_fn_destroy(vg);
    nb_fn_destroy(g);
    nb_fn_destroy(loss);
    nb_tree_destroy(params);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- vmap of vmap, jvp of vmap, out_axes, axis_size ----------------------------------- */

static nb_status body_outer(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]"), *y = nb_get(tr, args, "[1]");
    /* x [3], y [2]: an outer product and a reduction */
    nb_var *o = nb_mul(nb_reshape(x, 2, (int64_t[]){3, 1}), nb_reshape(y, 2, (int64_t[]){1, 2}));
    nb_var *s = nb_sum(nb_exp(x), NULL, 0, false);
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(o), nb_leaf(s)}, out);
}

static void test_nesting_and_axes(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *v1 = NULL, *v2 = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "outer", body_outer, NULL, &f));
    /* inner: x batched on axis 0, y unbatched; outer: both batched, x on axis 1, output o on
     * axis 2 (out_axes prefix: (2, 0)) */
    nb_tree *ia1 = ints(ctx, 2, (int[]){0, -99}), *ia2 = ints(ctx, 2, (int[]){1, 0});
    nb_tree *oa2 = ints(ctx, 2, (int[]){2, 0});
    nb_vmap_opts o1 = nb_vmap_opts_default(), o2 = nb_vmap_opts_default();
    o1.in_axes = ia1;
    o2.in_axes = ia2;
    o2.out_axes = oa2;
    NBT_OK(ctx, nb_vmap(f, &o1, &v1));
    NBT_OK(ctx, nb_vmap(v1, &o2, &v2));
    /* x: [4 (inner lanes), 5 (outer lanes), 3]; y: [5, 2] */
    double xs[4 * 5 * 3], ys[5 * 2];
    for (int i = 0; i < 60; i++) {
        xs[i] = 0.1 * sin(i);
    }
    for (int i = 0; i < 10; i++) {
        ys[i] = 1 + i;
    }
    nb_tree *args = nbt_tuple_take(ctx, 2,
                                   (nb_tree *[]){f64_leaf(ctx, 3, (int64_t[]){4, 5, 3}, xs),
                                                 f64_leaf(ctx, 2, (int64_t[]){5, 2}, ys)});
    nb_tree *out = NULL;
    NBT_OK(ctx, nb_fn_call(v2, args, &out));
    const nb_array *O = nb_tree_get_array(nb_tree_child(out, 0));
    const nb_array *S = nb_tree_get_array(nb_tree_child(out, 1));
    /* inner output o: [4, 3, 2] per outer lane; outer out axis 2: [4, 3, 5, 2] */
    NBT_EQ_I64(nb_array_rank(O), 4);
    NBT_EQ_I64(nb_array_dim(O, 0), 4);
    NBT_EQ_I64(nb_array_dim(O, 1), 3);
    NBT_EQ_I64(nb_array_dim(O, 2), 5);
    NBT_EQ_I64(nb_array_dim(O, 3), 2);
    NBT_EQ_I64(nb_array_dim(S, 0), 5);
    NBT_EQ_I64(nb_array_dim(S, 1), 4);
    for (int i = 0; i < 4; i++) {
        for (int b = 0; b < 5; b++) {
            double s = 0;
            for (int j = 0; j < 3; j++) {
                double xv = xs[(i * 5 + b) * 3 + j];
                s += exp(xv);
                for (int k = 0; k < 2; k++) {
                    double got = 0, want = xv * ys[b * 2 + k];
                    nb_array_get(O, (int64_t[]){i, j, b, k}, &got);
                    NBT_TRUE(got == want);
                }
            }
            double gs = 0;
            nb_array_get(S, (int64_t[]){b, i}, &gs);
            NBT_NEAR(gs, s, 1e-14);
        }
    }
    nb_tree_destroy(out);
    /* jvp of vmap: the tangent of sum(exp(x)) per lane is sum(exp(x) v) */
    nb_fn *jv = NULL;
    NBT_OK(ctx, nb_jvp(v1, &jv));
    double x1[4 * 3], t1[4 * 3], y1[2] = {1, 2}, ty[2] = {0, 0};
    for (int i = 0; i < 12; i++) {
        x1[i] = 0.2 * i;
        t1[i] = 1.0 + i;
    }
    nb_tree *prim = nbt_tuple_take(ctx, 2,
                                   (nb_tree *[]){f64_leaf(ctx, 2, (int64_t[]){4, 3}, x1),
                                                 f64_leaf(ctx, 1, (int64_t[]){2}, y1)});
    nb_tree *tan = nbt_tuple_take(ctx, 2,
                                  (nb_tree *[]){f64_leaf(ctx, 2, (int64_t[]){4, 3}, t1),
                                                f64_leaf(ctx, 1, (int64_t[]){2}, ty)});
    nb_tree *pt = nbt_tuple_take(ctx, 2, (nb_tree *[]){prim, tan});
    NBT_OK(ctx, nb_fn_call(jv, pt, &out));
    for (int i = 0; i < 4; i++) {
        double want = 0;
        for (int j = 0; j < 3; j++) {
            want += exp(x1[i * 3 + j]) * t1[i * 3 + j];
        }
        NBT_NEAR(at(nb_tree_child(nb_tree_child(out, 1), 1), i), want, 1e-12);
    }
    nb_tree_destroy(out);
    nb_tree_destroy(pt);
    nb_fn_destroy(jv);
    nb_tree_destroy(args);
    nb_tree_destroy(ia1);
    nb_tree_destroy(ia2);
    nb_tree_destroy(oa2);
    nb_fn_destroy(v2);
    nb_fn_destroy(v1);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* init from split keys: vmap over the keys gives the unbatched samples; axis_size for a
 * function of static data only */
static nb_status body_init(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *key = nb_get(tr, args, "[0]");
    return nb_return(nb_rng_normal(key, NB_DTYPE_F32, 2, (int64_t[]){3, 2}), out);
}

static nb_status body_const(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    (void)args;
    return nb_return(nb_iota(tr, NB_DTYPE_F64, 1, (int64_t[]){3}, 0), out);
}

static void test_init_and_axis_size(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *key = NULL, *keys = NULL;
    NBT_OK(ctx, nb_random_key(ctx, 2026, &key));
    NBT_OK(ctx, nb_random_split(key, 16, &keys));
    nb_fn *f = NULL, *vf = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "init", body_init, NULL, &f));
    NBT_OK(ctx, nb_vmap(f, NULL, &vf));
    nb_tree *kl = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_array(keys, &kl));
    nb_tree *args = nbt_tuple_take(ctx, 1, &kl);
    NBT_OK(ctx, nb_fn_call(vf, args, &out));
    for (int b = 0; b < 16; b++) {
        nb_array *kb = NULL;
        NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 1, (int64_t[]){2},
                                       (const int32_t *)nb_array_data(keys) + 2 * b, &kb));
        nb_tree *l = NULL, *o1 = NULL;
        NBT_OK(ctx, nb_tree_array(kb, &l));
        nb_array_destroy(kb);
        nb_tree *a1 = nbt_tuple_take(ctx, 1, &l);
        NBT_OK(ctx, nb_fn_call(f, a1, &o1));
        for (int e = 0; e < 6; e++) {
            NBT_TRUE(at(out, b * 6 + e) == at(o1, e));
        }
        nb_tree_destroy(o1);
        nb_tree_destroy(a1);
    }
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    /* no batched argument: axis_size gives the lanes (an unbatched output, broadcast) */
    nb_fn *c = NULL, *vc = NULL, *vc0 = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "const", body_const, NULL, &c));
    nb_vmap_opts o = nb_vmap_opts_default();
    o.axis_size = 4;
    NBT_OK(ctx, nb_vmap(c, &o, &vc));
    nb_tree *none = nbt_tuple_take(ctx, 0, NULL);
    NBT_OK(ctx, nb_fn_call(vc, none, &out));
    NBT_EQ_I64(nb_array_dim(nb_tree_get_array(out), 0), 4);
    NBT_EQ_I64(at(out, 3 * 3 + 2), 2);
    nb_tree_destroy(out);
    NBT_OK(ctx, nb_vmap(c, NULL, &vc0));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_fn_call(vc0, none, &out));
    NBT_ERRMSG_HAS(ctx, "has no batched argument, so the number of lanes is unknown -- set "
                        "opts.axis_size");
    nb_tree_destroy(none);
    nb_fn_destroy(vc0);
    nb_fn_destroy(vc);
    nb_fn_destroy(c);
    nb_fn_destroy(vf);
    nb_fn_destroy(f);
    nb_array_destroy(keys);
    nb_array_destroy(key);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- custom_vjp under vmap; static leaves under an int axis ---------------------------- */

static nb_status body_cube(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    return nb_return(nb_mul(nb_square(x), x), out);
}

static nb_status body_cube_fwd(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    nb_tree *res = NULL;
    nb_status st = nb_tree_tuple(nb_trace_ctx(tr), 1, (nb_tree *[]){nb_leaf(x)}, &res);
    if (st == NB_OK) {
        st = nb_tree_tuple(nb_trace_ctx(tr), 2,
                           (nb_tree *[]){nb_leaf(nb_mul(nb_square(x), x)), res}, out);
    }
    nb_tree_destroy(res);
    return st;
}

/* a rule of its own (ct * 10 x), so the test sees it used */
static nb_status body_cube_bwd(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0][0]"), *ct = nb_get(tr, args, "[1]");
    nb_tree *g = nb_leaf(nb_mul(ct, nb_mul(nb_scalar(tr, 10.0), x)));
    return nb_tree_tuple(nb_trace_ctx(tr), 1, &g, out);
}

/* args: (x f64[2], scale: a static float): sum(cube(x)) * scale, through the custom rule */
static nb_status body_cube_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    (void)self;
    nb_fn *cube = NULL;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_fn *f = NULL, *fwd = NULL, *bwd = NULL;
    nb_status st = nb_fn_create(ctx, "cube", body_cube, NULL, &f);
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "cube_fwd", body_cube_fwd, NULL, &fwd);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "cube_bwd", body_cube_bwd, NULL, &bwd);
    }
    if (st == NB_OK) {
        st = nb_custom_vjp(f, fwd, bwd, &cube);
    }
    nb_fn_destroy(f);
    nb_fn_destroy(fwd);
    nb_fn_destroy(bwd);
    nb_var *y = st == NB_OK ? nb_apply1(tr, cube, nb_get(tr, args, "[0]")) : NULL;
    nb_fn_destroy(cube);
    if (y == NULL) {
        return st != NB_OK ? st : nb_trace_status(tr);
    }
    double scale = 0;
    nb_tree_get_float(nb_tree_child(args, 1), &scale);
    return nb_return(nb_mul(nb_sum(y, NULL, 0, false), nb_scalar(tr, scale)), out);
}

/* sum over the lanes of vmap(cube_loss): a scalar to differentiate around the vmap */
static nb_fn *g_vf;
static nb_status body_sum_vf(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    const nb_tree *r = nb_apply(tr, g_vf, args);
    return r != NULL ? nb_return(nb_sum(nb_var_of(tr, r), NULL, 0, false), out)
                     : nb_trace_status(tr);
}

static void test_custom_vjp_and_static_leaves(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *self = nbt_tuple_take(ctx, 0, NULL);
    nb_fn *f = NULL, *g = NULL, *vf = NULL, *vg = NULL, *gv = NULL, *sum = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "cube_loss", body_cube_loss, self, &f));
    NBT_OK(ctx, nb_grad(f, NULL, &g));
    /* in_axes 0 for everything: the static scale is passed through, not an error */
    nb_tree *z = NULL;
    NBT_OK(ctx, nb_tree_int(ctx, 0, &z));
    nb_vmap_opts o = nb_vmap_opts_default();
    o.in_axes = z;
    NBT_OK(ctx, nb_vmap(f, &o, &vf));
    NBT_OK(ctx, nb_vmap(g, &o, &vg));
    double xs[6] = {1, 2, -1, 0.5, 3, -2};
    nb_tree *sc = NULL, *out = NULL, *gout = NULL;
    NBT_OK(ctx, nb_tree_float(ctx, 2.0, &sc));
    nb_tree *args =
        nbt_tuple_take(ctx, 2, (nb_tree *[]){f64_leaf(ctx, 2, (int64_t[]){3, 2}, xs), sc});
    NBT_OK(ctx, nb_fn_call(vf, args, &out));
    NBT_OK(ctx, nb_fn_call(vg, args, &gout));
    for (int b = 0; b < 3; b++) {
        double x0 = xs[2 * b], x1 = xs[2 * b + 1];
        NBT_EQ_F64(at(out, b), 2.0 * (x0 * x0 * x0 + x1 * x1 * x1));
        /* the per-lane gradient through the custom rule: 2 * 10 x */
        NBT_EQ_F64(at(gout, 2 * b), 20.0 * x0);
        NBT_EQ_F64(at(gout, 2 * b + 1), 20.0 * x1);
    }
    nb_tree_destroy(out);
    nb_tree_destroy(gout);
    /* a gradient around the vmap would need bwd batched: a clear error */
    g_vf = vf;
    NBT_OK(ctx, nb_fn_create(ctx, "sum_vf", body_sum_vf, NULL, &sum));
    NBT_OK(ctx, nb_grad(sum, NULL, &gv));
    nb_tree *one = NULL;
    NBT_OK(ctx, nb_tree_float(ctx, 1.0, &one));
    NBT_STATUS(ctx, NB_ERR_UNSUPPORTED, nb_fn_call(gv, args, &out));
    NBT_ERRMSG_HAS(ctx, "a derivative taken around a vmapped function made with nb_custom_vjp "
                        "is not supported yet -- take the derivative inside the vmap");
    nb_tree_destroy(one);
    nb_tree_destroy(args);
    nb_tree_destroy(z);
    nb_tree_destroy(self);
    nb_fn_destroy(gv);
    nb_fn_destroy(sum);
    nb_fn_destroy(vg);
    nb_fn_destroy(vf);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- per-lane dynamic slices ------------------------------------------------------------ */

/* args: ((x f64[5,4], u f64[2,3]), (i i32, j i32)) -> sum(sin(dynamic_slice(y * x at
 * (j, i), [2,2]))), y = x with u^2 written at (i, j); starts out of range are clamped */
static nb_status body_dyn(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0][0]"), *u = nb_get(tr, args, "[0][1]");
    nb_var *i = nb_get(tr, args, "[1][0]"), *j = nb_get(tr, args, "[1][1]");
    nb_var *y = nb_dynamic_update_slice(x, nb_mul(u, u), (nb_var *[]){i, j});
    nb_var *z = nb_dynamic_slice(nb_mul(y, x), (nb_var *[]){j, i}, (int64_t[]){2, 2});
    return nb_return(nb_sum(nb_sin(z), NULL, 0, false), out);
}

static nb_fn *g_vdyn;
static nb_status body_sum_vdyn(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    const nb_tree *r = nb_apply(tr, g_vdyn, args);
    return r != NULL ? nb_return(nb_sum(nb_var_of(tr, r), NULL, 0, false), out)
                     : nb_trace_status(tr);
}

static nb_tree *i32_leaf(nb_ctx *ctx, int rank, const int64_t *shape, const int32_t *v) {
    nb_array *a = NULL;
    nb_tree *l = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, rank, shape, v, &a));
    NBT_OK(ctx, nb_tree_array(a, &l));
    nb_array_destroy(a);
    return l;
}

#define DYN_B 4
static const int32_t DYN_I[DYN_B] = {0, 3, -1, 9}, DYN_J[DYN_B] = {1, 2, 0, 5};

/* f's arguments for lane b (b < 0: the batched ones: x [B,5,4], u shared, i and j [B]) */
static nb_tree *dyn_args(nb_ctx *ctx, const double *xs, const double *us, int b) {
    nb_tree *x = b < 0 ? f64_leaf(ctx, 3, (int64_t[]){DYN_B, 5, 4}, xs)
                       : f64_leaf(ctx, 2, (int64_t[]){5, 4}, xs + 20 * b);
    nb_tree *i =
        b < 0 ? i32_leaf(ctx, 1, (int64_t[]){DYN_B}, DYN_I) : i32_leaf(ctx, 0, NULL, DYN_I + b);
    nb_tree *j =
        b < 0 ? i32_leaf(ctx, 1, (int64_t[]){DYN_B}, DYN_J) : i32_leaf(ctx, 0, NULL, DYN_J + b);
    nb_tree *xu = nbt_tuple_take(ctx, 2, (nb_tree *[]){x, f64_leaf(ctx, 2, (int64_t[]){2, 3}, us)});
    return nbt_tuple_take(ctx, 2, (nb_tree *[]){xu, nbt_tuple_take(ctx, 2, (nb_tree *[]){i, j})});
}

/* lines of f's optimized IR on args, and how many of them are per-lane slices or updates */
static int ir_lines(nb_ctx *ctx, nb_fn *f, const nb_tree *args, int *per_lane) {
    static char ir[1 << 16];
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    int n = 0;
    *per_lane = 0;
    for (const char *s = ir; (s = strchr(s, '\n')) != NULL; s++) {
        n++;
    }
    for (const char *s = ir; (s = strstr(s, "per_lane")) != NULL; s++) {
        (*per_lane)++;
    }
    return n;
}

/* Starts that differ per lane: one dynamic_slice / dynamic_update_slice per lane, not one
 * per lane and op (the program does not grow with B); its derivatives (grad of the vmap,
 * jvp of the vmap: the per-lane forms' own rules) against the unbatched function's lane by
 * lane, bit for bit -- except the shared u's gradient, the sum of the lanes' (within
 * rounding); vmap of vmap. */
static void test_per_lane_starts(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    double xs[DYN_B * 20], us[6] = {0.3, -0.7, 1.1, 0.2, -0.4, 0.9};
    for (int k = 0; k < DYN_B * 20; k++) {
        xs[k] = 0.5 * sin(0.7 * k + 0.1);
    }
    nb_fn *f = NULL, *g = NULL, *vf = NULL, *vg = NULL, *sum = NULL, *gs = NULL, *jv = NULL;
    nb_fn *j1 = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "dyn", body_dyn, NULL, &f));
    NBT_OK(ctx, nb_grad(f, NULL, &g));
    nb_tree *ax = nbt_tuple_take(
        ctx, 2, (nb_tree *[]){ints(ctx, 2, (int[]){0, -99}), ints(ctx, 2, (int[]){0, 0})});
    nb_vmap_opts o = nb_vmap_opts_default();
    o.in_axes = ax;
    NBT_OK(ctx, nb_vmap(f, &o, &vf));
    NBT_OK(ctx, nb_vmap(g, &o, &vg));
    nb_tree *bargs = dyn_args(ctx, xs, us, -1), *vout = NULL, *vgout = NULL;
    NBT_OK(ctx, nb_fn_call(vf, bargs, &vout));
    NBT_OK(ctx, nb_fn_call(vg, bargs, &vgout));
    /* grad of the summed vmap: the per-lane forms' VJPs */
    g_vdyn = vf;
    nb_tree *gsout = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "sum_vdyn", body_sum_vdyn, NULL, &sum));
    NBT_OK(ctx, nb_grad(sum, NULL, &gs));
    NBT_OK(ctx, nb_fn_call(gs, bargs, &gsout));
    double usum[6] = {0};
    for (int b = 0; b < DYN_B; b++) {
        nb_tree *a = dyn_args(ctx, xs, us, b), *y = NULL, *gy = NULL;
        NBT_OK(ctx, nb_fn_call(f, a, &y));
        NBT_OK(ctx, nb_fn_call(g, a, &gy));
        NBT_EQ_F64(at(vout, b), at(y, 0));
        for (int k = 0; k < 20; k++) {
            double want = at(nb_tree_child(gy, 0), k);
            NBT_EQ_F64(at(nb_tree_child(vgout, 0), b * 20 + k), want);
            NBT_EQ_F64(at(nb_tree_child(gsout, 0), b * 20 + k), want);
        }
        for (int k = 0; k < 6; k++) {
            NBT_EQ_F64(at(nb_tree_child(vgout, 1), b * 6 + k), at(nb_tree_child(gy, 1), k));
            usum[k] += at(nb_tree_child(gy, 1), k);
        }
        nb_tree_destroy(a);
        nb_tree_destroy(y);
        nb_tree_destroy(gy);
    }
    for (int k = 0; k < 6; k++) {
        NBT_NEAR(at(nb_tree_child(gsout, 1), k), usum[k], 1e-14);
    }
    /* jvp of the vmap (tangents on x and u) against each lane's jvp */
    double tx[DYN_B * 20], tu[6] = {1, -2, 0.5, 3, 0.25, -1};
    for (int k = 0; k < DYN_B * 20; k++) {
        tx[k] = cos(0.3 * k);
    }
    NBT_OK(ctx, nb_jvp(vf, &jv));
    NBT_OK(ctx, nb_jvp(f, &j1));
    nb_tree *tan = dyn_args(ctx, tx, tu, -1), *pt = NULL, *jout = NULL;
    nb_tree *null_ij = ints(ctx, 2, (int[]){-99, -99});
    nb_tree *tan2 = nbt_tuple_take(
        ctx, 2, (nb_tree *[]){nb_tree_retain((nb_tree *)nb_tree_child(tan, 0)), null_ij});
    nb_tree_destroy(tan);
    pt = nbt_tuple_take(ctx, 2, (nb_tree *[]){nb_tree_retain(bargs), tan2});
    NBT_OK(ctx, nb_fn_call(jv, pt, &jout));
    for (int b = 0; b < DYN_B; b++) {
        nb_tree *a = dyn_args(ctx, xs, us, b), *t = dyn_args(ctx, tx, tu, b), *o1 = NULL;
        nb_tree *tn = ints(ctx, 2, (int[]){-99, -99});
        nb_tree *t2 = nbt_tuple_take(
            ctx, 2, (nb_tree *[]){nb_tree_retain((nb_tree *)nb_tree_child(t, 0)), tn});
        nb_tree *p1 = nbt_tuple_take(ctx, 2, (nb_tree *[]){a, t2});
        NBT_OK(ctx, nb_fn_call(j1, p1, &o1));
        NBT_EQ_F64(at(nb_tree_child(jout, 1), b), at(nb_tree_child(o1, 1), 0));
        nb_tree_destroy(t);
        nb_tree_destroy(p1);
        nb_tree_destroy(o1);
    }
    /* the program does not grow with B: vmap(grad) at 4 and at 40 lanes */
    int pl4 = 0, pl40 = 0;
    int n4 = ir_lines(ctx, vg, bargs, &pl4);
    double xb[40 * 20];
    int32_t ib[40], jb[40];
    for (int k = 0; k < 40 * 20; k++) {
        xb[k] = 0.1 * k;
    }
    for (int b = 0; b < 40; b++) {
        ib[b] = b % 6 - 1;
        jb[b] = b % 5;
    }
    nb_tree *xu40 = nbt_tuple_take(ctx, 2,
                                   (nb_tree *[]){f64_leaf(ctx, 3, (int64_t[]){40, 5, 4}, xb),
                                                 f64_leaf(ctx, 2, (int64_t[]){2, 3}, us)});
    nb_tree *ij40 = nbt_tuple_take(ctx, 2,
                                   (nb_tree *[]){i32_leaf(ctx, 1, (int64_t[]){40}, ib),
                                                 i32_leaf(ctx, 1, (int64_t[]){40}, jb)});
    nb_tree *a40 = nbt_tuple_take(ctx, 2, (nb_tree *[]){xu40, ij40});
    int n40 = ir_lines(ctx, vg, a40, &pl40);
    NBT_EQ_I64(n40, n4);
    NBT_EQ_I64(pl40, pl4);
    NBT_TRUE(pl4 >= 4); /* the slice and the update, and their transposes */
    /* vmap of vmap: 2 outer lanes of the 4-lane batch (x, i, j batched twice) */
    nb_fn *vv = NULL;
    nb_tree *bb = NULL, *vvout = NULL;
    nb_tree *ax2 = nbt_tuple_take(
        ctx, 2, (nb_tree *[]){ints(ctx, 2, (int[]){0, -99}), ints(ctx, 2, (int[]){0, 0})});
    nb_vmap_opts o2 = nb_vmap_opts_default();
    o2.in_axes = ax2;
    NBT_OK(ctx, nb_vmap(vf, &o2, &vv));
    double x2[2 * DYN_B * 20];
    int32_t i2[2 * DYN_B], jj2[2 * DYN_B];
    for (int k = 0; k < 2 * DYN_B * 20; k++) {
        x2[k] = k < DYN_B * 20 ? xs[k] : -xs[k - DYN_B * 20];
    }
    for (int b = 0; b < 2 * DYN_B; b++) {
        i2[b] = b < DYN_B ? DYN_I[b] : DYN_J[b - DYN_B];
        jj2[b] = b < DYN_B ? DYN_J[b] : DYN_I[b - DYN_B];
    }
    nb_tree *xu2 = nbt_tuple_take(ctx, 2,
                                  (nb_tree *[]){f64_leaf(ctx, 4, (int64_t[]){2, DYN_B, 5, 4}, x2),
                                                f64_leaf(ctx, 2, (int64_t[]){2, 3}, us)});
    nb_tree *ij2 = nbt_tuple_take(ctx, 2,
                                  (nb_tree *[]){i32_leaf(ctx, 2, (int64_t[]){2, DYN_B}, i2),
                                                i32_leaf(ctx, 2, (int64_t[]){2, DYN_B}, jj2)});
    bb = nbt_tuple_take(ctx, 2, (nb_tree *[]){xu2, ij2});
    NBT_OK(ctx, nb_fn_call(vv, bb, &vvout));
    for (int q = 0; q < 2 * DYN_B; q++) {
        nb_tree *xl = f64_leaf(ctx, 2, (int64_t[]){5, 4}, x2 + 20 * q);
        nb_tree *il = i32_leaf(ctx, 0, NULL, i2 + q), *jl = i32_leaf(ctx, 0, NULL, jj2 + q);
        nb_tree *a = nbt_tuple_take(
            ctx, 2,
            (nb_tree *[]){
                nbt_tuple_take(ctx, 2, (nb_tree *[]){xl, f64_leaf(ctx, 2, (int64_t[]){2, 3}, us)}),
                nbt_tuple_take(ctx, 2, (nb_tree *[]){il, jl})});
        nb_tree *y = NULL;
        NBT_OK(ctx, nb_fn_call(f, a, &y));
        NBT_EQ_F64(at(vvout, q), at(y, 0));
        nb_tree_destroy(a);
        nb_tree_destroy(y);
    }
    nb_tree_destroy(vvout);
    nb_tree_destroy(bb);
    nb_tree_destroy(ax2);
    nb_fn_destroy(vv);
    nb_tree_destroy(a40);
    nb_tree_destroy(jout);
    nb_tree_destroy(pt);
    nb_tree_destroy(gsout);
    nb_tree_destroy(vgout);
    nb_tree_destroy(vout);
    nb_tree_destroy(bargs);
    nb_tree_destroy(ax);
    nb_fn_destroy(j1);
    nb_fn_destroy(jv);
    nb_fn_destroy(gs);
    nb_fn_destroy(sum);
    nb_fn_destroy(vg);
    nb_fn_destroy(vf);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- errors --------------------------------------------------------------------------- */

static nb_status body_pair(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *a = nb_get(tr, args, "[0].a"), *b = nb_get(tr, args, "[0].b");
    return nb_return(nb_add(a, nb_sum(b, NULL, 0, false)), out);
}

static void test_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *vf = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "pair", body_pair, NULL, &f));
    double v[12] = {0};
    nb_tree *l[2] = {f64_leaf(ctx, 2, (int64_t[]){3, 2}, v),
                     f64_leaf(ctx, 2, (int64_t[]){4, 2}, v)};
    nb_tree *d = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"a", "b"}, l, &d));
    nb_tree_destroy(l[0]);
    nb_tree_destroy(l[1]);
    nb_tree *args = nbt_tuple_take(ctx, 1, &d);
    NBT_OK(ctx, nb_vmap(f, NULL, &vf));
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_fn_call(vf, args, &out));
    NBT_ERRMSG_HAS(ctx, "batched sizes disagree: args[0].b has 4 along its batch axis 0 but "
                        "args[0].a has 3");
    nb_fn_destroy(vf);
    /* an out-of-range axis */
    nb_tree *ia = ints(ctx, 1, (int[]){2});
    nb_vmap_opts o = nb_vmap_opts_default();
    o.in_axes = ia;
    NBT_OK(ctx, nb_vmap(f, &o, &vf));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_fn_call(vf, args, &out));
    NBT_ERRMSG_HAS(ctx, "in_axes gives axis 2 for f64[3,2] at args[0].a, out of range -- give an "
                        "axis in -2..1");
    nb_fn_destroy(vf);
    nb_tree_destroy(ia);
    /* out_axes null on a batched output */
    nb_tree *na = NULL;
    NBT_OK(ctx, nb_tree_null(ctx, &na));
    o = nb_vmap_opts_default();
    o.out_axes = na;
    ia = ints(ctx, 1, (int[]){0});
    o.in_axes = ia;
    NBT_OK(ctx, nb_vmap(f, &o, &vf));
    nb_tree *l2[2] = {f64_leaf(ctx, 2, (int64_t[]){3, 2}, v),
                      f64_leaf(ctx, 2, (int64_t[]){3, 2}, v)};
    nb_tree *d2 = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"a", "b"}, l2, &d2));
    nb_tree_destroy(l2[0]);
    nb_tree_destroy(l2[1]);
    nb_tree *args2 = nbt_tuple_take(ctx, 1, &d2);
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_fn_call(vf, args2, &out));
    NBT_ERRMSG_HAS(ctx, "out_axes is null at <root>, but that output (f64[2] per lane) depends "
                        "on the batched arguments -- give it an out axis");
    nb_tree_destroy(args2);
    nb_fn_destroy(vf);
    nb_tree_destroy(ia);
    nb_tree_destroy(na);
    /* an in_axes leaf that is not an int or null; a structure mismatch */
    nb_tree *s = NULL;
    NBT_OK(ctx, nb_tree_string(ctx, "zero", &s));
    o = nb_vmap_opts_default();
    o.in_axes = s;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_vmap(f, &o, &vf));
    NBT_ERRMSG_HAS(ctx, "opts->in_axes holds a string at <root>; its leaves must be an int");
    nb_tree_destroy(s);
    ia = ints(ctx, 2, (int[]){0, 0});
    o.in_axes = ia;
    NBT_OK(ctx, nb_vmap(f, &o, &vf));
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_fn_call(vf, args, &out));
    NBT_ERRMSG_HAS(ctx, "in_axes does not match the arguments at args: tuple of 2 vs tuple of 1");
    nb_fn_destroy(vf);
    nb_tree_destroy(ia);
    o = nb_vmap_opts_default();
    o.axis_size = -1;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_vmap(f, &o, &vf));
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_vmap(NULL, NULL, &vf));
    nb_tree_destroy(args);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- allocation failures over jit(vmap(grad)) ------------------------------------------ */

static nb_status scenario_vmap(nb_ctx *ctx) {
    nb_fn *loss = NULL, *g = NULL, *vg = NULL, *j = NULL;
    nb_tree *ia = NULL, *params = NULL, *args = NULL, *out = NULL, *n0 = NULL, *z0 = NULL,
            *z1 = NULL, *xl = NULL, *ll = NULL;
    nb_array *xa = NULL, *la = NULL;
    double x[NB * NI];
    int32_t lab[NB];
    data(x, lab);
    nb_status st = nb_fn_create(ctx, "loss", body_loss, NULL, &loss);
    if (st == NB_OK) {
        st = nb_grad(loss, NULL, &g);
    }
    if (st == NB_OK) {
        st = nb_tree_null(ctx, &n0);
    }
    if (st == NB_OK) {
        st = nb_tree_int(ctx, 0, &z0);
    }
    if (st == NB_OK) {
        st = nb_tree_int(ctx, 0, &z1);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 3, (nb_tree *[]){n0, z0, z1}, &ia);
    }
    if (st == NB_OK) {
        nb_vmap_opts o = nb_vmap_opts_default();
        o.in_axes = ia;
        st = nb_vmap(g, &o, &vg);
    }
    if (st == NB_OK) {
        st = nb_jit(vg, NULL, &j);
    }
    double w1[NI * NH] = {0.1}, b1[NH] = {0}, w2[NH * NO] = {0.2}, b2[NO] = {0};
    nb_array *pa[4] = {NULL};
    nb_tree *pl[4] = {NULL};
    const double *pv[4] = {w1, b1, w2, b2};
    const int64_t ps[4][2] = {{NI, NH}, {NH, 0}, {NH, NO}, {NO, 0}};
    for (int k = 0; k < 4 && st == NB_OK; k++) {
        st = nb_array_from_data(ctx, NB_DTYPE_F64, ps[k][1] ? 2 : 1, ps[k], pv[k], &pa[k]);
        if (st == NB_OK) {
            st = nb_tree_array(pa[k], &pl[k]);
        }
    }
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 4, (const char *[]){"w1", "b1", "w2", "b2"}, pl, &params);
    }
    if (st == NB_OK) {
        st = nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){NB, NI}, x, &xa);
    }
    if (st == NB_OK) {
        st = nb_array_from_data(ctx, NB_DTYPE_I32, 1, (int64_t[]){NB}, lab, &la);
    }
    if (st == NB_OK) {
        st = nb_tree_array(xa, &xl);
    }
    if (st == NB_OK) {
        st = nb_tree_array(la, &ll);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 3, (nb_tree *[]){params, xl, ll}, &args);
    }
    if (st == NB_OK) {
        st = nb_fn_call(j, args, &out);
    }
    nb_tree *ts[] = {ia, params, args, out, n0, z0, z1, xl, ll};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        nb_tree_destroy(ts[i]);
    }
    for (int k = 0; k < 4; k++) {
        nb_tree_destroy(pl[k]);
        nb_array_destroy(pa[k]);
    }
    nb_array_destroy(xa);
    nb_array_destroy(la);
    nb_fn_destroy(j);
    nb_fn_destroy(vg);
    nb_fn_destroy(g);
    nb_fn_destroy(loss);
    nb_ctx_clear_cache(ctx);
    return st;
}

static void test_out_of_memory(void **state) {
    (void)state;
    int points = nbt_oom_sweep("scenario_vmap", scenario_vmap, false, false);
    print_message("allocation failures: %d points, each NB_ERR_OOM with nothing leaked\n", points);
    NBT_TRUE(points > 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_without_gradients),
        cmocka_unit_test(test_per_example_gradients),
        cmocka_unit_test(test_nesting_and_axes),
        cmocka_unit_test(test_init_and_axis_size),
        cmocka_unit_test(test_custom_vjp_and_static_leaves),
        cmocka_unit_test(test_per_lane_starts),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_vmap_models.c -- nb_vmap on models, with real data (UCI digits, 64 features, 10
 * classes, f32):
 *   - per-example gradients of an MLP 64-32-10 with cross-entropy, batch 128: vmap(grad)
 *     against 128 separate grads (to f32 rounding: BLIS's product of 128 rows and of one
 *     round differently), and their mean against grad of the batch's mean loss;
 *   - an ensemble of 16 MLPs 64-16-10 initialised by vmap over split keys (parameters and
 *     Adam's state) and trained together, vmap of a train step (grad, nb_optim_update,
 *     nb_apply_updates), jitted (one trace), against 16 separate trainings: bit for bit.
 */
#include "nbtest.h"

#include <math.h>
#include <string.h>

enum { NF = 64, NC = 10, BATCH = 128, NM = 16, STEPS = 8 };

static const char *const PK[4] = {"b1", "b2", "w1", "w2"}; /* the parameters' keys */

static nb_tree *leaf_of(nb_ctx *ctx, nb_array *a) {
    nb_tree *l = NULL;
    NBT_OK(ctx, nb_tree_array(a, &l));
    nb_array_destroy(a);
    return l;
}

/* the first n rows of the digits, features scaled to [0, 1] */
static void digits(nb_ctx *ctx, int64_t n, nb_array **x, nb_array **y) {
    nb_array *fx = NULL, *fy = NULL;
    NBT_OK(ctx, nb_csv_load(ctx, NBT_DATA_DIR "/digits.csv.gz", NULL, &fx, &fy));
    NBT_TRUE(nb_array_dim(fx, 0) >= n && nb_array_dim(fx, 1) == NF);
    float *xs = (float *)nb_array_data(fx);
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F32, 2, (int64_t[]){n, NF}, xs, x));
    float *xd = (float *)nb_array_data(*x);
    for (int64_t i = 0; i < n * NF; i++) {
        xd[i] = xd[i] / 16.0f;
    }
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 1, (int64_t[]){n}, nb_array_data(fy), y));
    nb_array_destroy(fx);
    nb_array_destroy(fy);
}

/* row i of a, as a new array of a's row shape */
static nb_array *row(nb_ctx *ctx, const nb_array *a, int64_t i) {
    int rank = nb_array_rank(a);
    int64_t shape[8], n = 1;
    for (int d = 1; d < rank; d++) {
        shape[d - 1] = nb_array_dim(a, d);
        n *= shape[d - 1];
    }
    size_t es = nb_dtype_size(nb_array_dtype(a));
    nb_array *r = NULL;
    NBT_OK(ctx,
           nb_array_from_data(ctx, nb_array_dtype(a), rank - 1, shape,
                              (const unsigned char *)nb_array_data(a) + (size_t)(i * n) * es, &r));
    return r;
}

/* logits of a 2-layer tanh MLP, params dict(w1, b1, w2, b2), x [..., NF] */
static nb_var *mlp(nb_trace *tr, const nb_tree *p, nb_var *x) {
    nb_var *h = nb_tanh(nb_add(nb_matmul(x, nb_get(tr, p, "w1")), nb_get(tr, p, "b1")));
    return nb_add(nb_matmul(h, nb_get(tr, p, "w2")), nb_get(tr, p, "b2"));
}

/* mean cross-entropy over the rows of x [n, NF] (labels y i32[n]) */
static nb_var *xent(nb_trace *tr, const nb_tree *p, nb_var *x, nb_var *y) {
    nb_var *lp = nb_log_softmax(mlp(tr, p, x), -1);
    nb_var *pick = nb_sum(nb_mul(lp, nb_one_hot(y, NC, NB_DTYPE_F32)), (int[]){-1}, 1, false);
    return nb_neg(nb_mean(pick, NULL, 0, false));
}

/* one example: args (params, x f32[NF], y i32[]) */
static nb_status body_loss1(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_reshape(nb_get(tr, args, "[1]"), 2, (int64_t[]){1, NF});
    nb_var *y = nb_reshape(nb_get(tr, args, "[2]"), 1, (int64_t[]){1});
    return nb_return(xent(tr, nb_tree_child(args, 0), x, y), out);
}

/* a batch: args (params, x f32[n, NF], y i32[n]) */
static nb_status body_lossb(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(
        xent(tr, nb_tree_child(args, 0), nb_get(tr, args, "[1]"), nb_get(tr, args, "[2]")), out);
}

static double at(const nb_tree *t, int64_t i) {
    double v = NAN;
    nb_array_get_flat(nb_tree_get_array(t), i, &v);
    return v;
}

static bool same_bits_f32(double a, double b) {
    float x = (float)a, y = (float)b;
    return memcmp(&x, &y, sizeof x) == 0;
}

/* ---- per-example gradients -------------------------------------------------------------- */

static nb_tree *params_fixed(nb_ctx *ctx, int64_t nh) {
    nb_array *a[4] = {NULL};
    int64_t shapes[4][2] = {{nh, 0}, {NC, 0}, {NF, nh}, {nh, NC}};
    for (int k = 0; k < 4; k++) {
        int rank = shapes[k][1] ? 2 : 1;
        NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, rank, shapes[k], &a[k]));
        float *d = (float *)nb_array_data(a[k]);
        for (int64_t i = 0; i < nb_array_size(a[k]); i++) {
            d[i] = (float)(0.3 * sin(0.7 * (double)i + 1.3 * k) / (k >= 2 ? 2.0 : 4.0));
        }
    }
    nb_tree *l[4] = {leaf_of(ctx, a[0]), leaf_of(ctx, a[1]), leaf_of(ctx, a[2]),
                     leaf_of(ctx, a[3])};
    nb_tree *d = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 4, (const char *[]){"b1", "b2", "w1", "w2"}, l, &d));
    for (int k = 0; k < 4; k++) {
        nb_tree_destroy(l[k]);
    }
    return d;
}

static void test_per_example_digits(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *x = NULL, *y = NULL;
    digits(ctx, BATCH, &x, &y);
    nb_tree *params = params_fixed(ctx, 32);
    nb_fn *l1 = NULL, *g1 = NULL, *vg = NULL, *lb = NULL, *gb = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "loss1", body_loss1, NULL, &l1));
    NBT_OK(ctx, nb_grad(l1, NULL, &g1));
    nb_tree *ia[3] = {NULL, NULL, NULL};
    NBT_OK(ctx, nb_tree_null(ctx, &ia[0]));
    NBT_OK(ctx, nb_tree_int(ctx, 0, &ia[1]));
    NBT_OK(ctx, nb_tree_int(ctx, 0, &ia[2]));
    nb_tree *axes = nbt_tuple_take(ctx, 3, ia);
    nb_vmap_opts vo = nb_vmap_opts_default();
    vo.in_axes = axes;
    NBT_OK(ctx, nb_vmap(g1, &vo, &vg));
    nb_array_retain(x);
    nb_array_retain(y);
    nb_tree *args = nbt_tuple_take(
        ctx, 3, (nb_tree *[]){nb_tree_retain(params), leaf_of(ctx, x), leaf_of(ctx, y)});
    nb_tree *per = NULL, *mean = NULL;
    NBT_OK(ctx, nb_fn_call(vg, args, &per));
    NBT_OK(ctx, nb_fn_create(ctx, "lossb", body_lossb, NULL, &lb));
    NBT_OK(ctx, nb_grad(lb, NULL, &gb));
    NBT_OK(ctx, nb_fn_call(gb, args, &mean));
    int64_t differ = 0, total = 0;
    double worst = 0, mworst = 0, gmax = 0;
    for (int b = 0; b < BATCH; b++) {
        nb_tree *a1 =
            nbt_tuple_take(ctx, 3,
                           (nb_tree *[]){nb_tree_retain(params), leaf_of(ctx, row(ctx, x, b)),
                                         leaf_of(ctx, row(ctx, y, b))});
        nb_tree *g = NULL;
        NBT_OK(ctx, nb_fn_call(g1, a1, &g));
        for (int k = 0; k < 4; k++) {
            const nb_tree *pl = nb_tree_get(per, PK[k]), *gl = nb_tree_get(g, PK[k]);
            int64_t n = nb_array_size(nb_tree_get_array(gl));
            for (int64_t i = 0; i < n; i++) {
                double u = at(pl, b * n + i), v = at(gl, i);
                differ += !same_bits_f32(u, v);
                worst = nbt_max(worst, fabs(u - v));
                gmax = nbt_max(gmax, fabs(v));
                total++;
            }
        }
        nb_tree_destroy(g);
        nb_tree_destroy(a1);
    }
    /* the mean of the per-example gradients against the gradient of the mean loss */
    for (int k = 0; k < 4; k++) {
        const nb_tree *pl = nb_tree_get(per, PK[k]), *ml = nb_tree_get(mean, PK[k]);
        int64_t n = nb_array_size(nb_tree_get_array(ml));
        double scale = 0;
        for (int64_t i = 0; i < n; i++) {
            scale = nbt_max(scale, fabs(at(ml, i)));
        }
        for (int64_t i = 0; i < n; i++) {
            double s = 0;
            for (int b = 0; b < BATCH; b++) {
                s += at(pl, b * n + i);
            }
            mworst = nbt_max(mworst, fabs(s / BATCH - at(ml, i)) / scale);
        }
    }
    print_message("UCI digits, MLP 64-32-10, batch %d: vmap(grad) vs %d separate grads: %lld "
                  "of %lld elements differ, by at most %.2e (%.2e of the largest gradient); "
                  "mean vs grad of the mean loss: %.2e relative\n",
                  BATCH, BATCH, (long long)differ, (long long)total, worst, worst / gmax, mworst);
    /* not bit for bit: the lanes' activations go through one BLIS product of 128 rows
     * (x @ w1 for the batch), a separate grad through a product of one row, and BLIS's
     * kernels for the two round differently (f32: a few ulps). Every op without a matmul
     * is bit for bit (test_grad_conformance (d), test_vmap's f64 MLP). */
    NBT_TRUE(worst <= 1e-6 * gmax);
    NBT_TRUE(mworst <= 1e-5); /* f32: the mean is summed in another order */
    nb_tree_destroy(mean);
    nb_tree_destroy(per);
    nb_tree_destroy(args);
    nb_tree_destroy(axes);
    nb_tree_destroy(params);
    nb_fn_destroy(gb);
    nb_fn_destroy(lb);
    nb_fn_destroy(vg);
    nb_fn_destroy(g1);
    nb_fn_destroy(l1);
    nb_array_destroy(x);
    nb_array_destroy(y);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- an ensemble trained together ------------------------------------------------------ */

/* self: the optimizer; args: (key i32[2]) -> (params, optimizer state) */
static nb_status body_init(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *key = nb_get(tr, args, "[0]");
    nb_var *ks = nb_rng_split(key, 2);
    nb_var *k1 = nb_take(ks, nb_scalar_typed(tr, NB_DTYPE_I32, 0.0), 0);
    nb_var *k2 = nb_take(ks, nb_scalar_typed(tr, NB_DTYPE_I32, 1.0), 0);
    enum { NH = 16 };
    nb_var *w1 = nb_mul(nb_rng_normal(k1, NB_DTYPE_F32, 2, (int64_t[]){NF, NH}),
                        nb_scalar_typed(tr, NB_DTYPE_F32, 0.125));
    nb_var *w2 = nb_mul(nb_rng_normal(k2, NB_DTYPE_F32, 2, (int64_t[]){NH, NC}),
                        nb_scalar_typed(tr, NB_DTYPE_F32, 0.25));
    nb_var *b1 = nb_full(tr, NB_DTYPE_F32, 1, (int64_t[]){NH}, 0.0);
    nb_var *b2 = nb_full(tr, NB_DTYPE_F32, 1, (int64_t[]){NC}, 0.0);
    nb_tree *p = NULL;
    nb_status st =
        nb_tree_dict(nb_trace_ctx(tr), 4, PK,
                     (nb_tree *[]){nb_leaf(b1), nb_leaf(b2), nb_leaf(w1), nb_leaf(w2)}, &p);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *s = nb_optim_init_in(tr, self, p);
    st = s != NULL ? nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){p, (nb_tree *)s}, out)
                   : nb_trace_status(tr);
    nb_tree_destroy(p);
    return st;
}

static nb_fn *g_vgb; /* value_and_grad of body_lossb */

/* self: the optimizer; args: ((params, state), x, y) -> ((params, state), loss) */
static nb_status body_step(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    const nb_tree *ps = nb_tree_child(args, 0);
    const nb_tree *params = nb_tree_child(ps, 0), *st0 = nb_tree_child(ps, 1);
    nb_tree *la = NULL;
    nb_status st = nb_tree_tuple(ctx, 3,
                                 (nb_tree *[]){(nb_tree *)params, (nb_tree *)nb_tree_child(args, 1),
                                               (nb_tree *)nb_tree_child(args, 2)},
                                 &la);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *lg = nb_apply(tr, g_vgb, la);
    nb_tree_destroy(la);
    const nb_tree *upd = NULL, *ns = NULL;
    if (lg == NULL ||
        nb_optim_update(tr, self, nb_tree_child(lg, 1), st0, params, &upd, &ns) != NB_OK) {
        return nb_trace_status(tr);
    }
    const nb_tree *np = nb_apply_updates(tr, params, upd);
    if (np == NULL) {
        return nb_trace_status(tr);
    }
    nb_tree *nps = NULL;
    st = nb_tree_tuple(ctx, 2, (nb_tree *[]){(nb_tree *)np, (nb_tree *)ns}, &nps);
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){nps, (nb_tree *)nb_tree_child(lg, 0)}, out);
    }
    nb_tree_destroy(nps);
    return st;
}

static void test_ensemble_adam(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *x = NULL, *y = NULL, *key = NULL, *keys = NULL;
    digits(ctx, 64, &x, &y);
    nb_tree *opt = NULL;
    NBT_OK(ctx, nb_optim_adam(ctx, 0.01, NULL, &opt));
    nb_fn *lb = NULL, *init = NULL, *step = NULL, *vinit = NULL, *vstep = NULL, *jstep = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "lossb", body_lossb, NULL, &lb));
    NBT_OK(ctx, nb_value_and_grad(lb, NULL, &g_vgb));
    NBT_OK(ctx, nb_fn_create(ctx, "init", body_init, opt, &init));
    NBT_OK(ctx, nb_fn_create(ctx, "step", body_step, opt, &step));
    NBT_OK(ctx, nb_vmap(init, NULL, &vinit));
    nb_tree *ia[3] = {NULL, NULL, NULL};
    NBT_OK(ctx, nb_tree_int(ctx, 0, &ia[0]));
    NBT_OK(ctx, nb_tree_null(ctx, &ia[1]));
    NBT_OK(ctx, nb_tree_null(ctx, &ia[2]));
    nb_tree *axes = nbt_tuple_take(ctx, 3, ia);
    nb_vmap_opts vo = nb_vmap_opts_default();
    vo.in_axes = axes;
    NBT_OK(ctx, nb_vmap(step, &vo, &vstep));
    NBT_OK(ctx, nb_jit(vstep, NULL, &jstep));
    NBT_OK(ctx, nb_random_key(ctx, 21, &key));
    NBT_OK(ctx, nb_random_split(key, NM, &keys));
    /* together: init by vmap over the keys, STEPS vmapped (jitted) steps */
    nb_array_retain(keys);
    nb_tree *kargs = nbt_tuple_take(ctx, 1, (nb_tree *[]){leaf_of(ctx, keys)});
    nb_tree *ens = NULL;
    NBT_OK(ctx, nb_fn_call(vinit, kargs, &ens));
    nb_array_retain(x);
    nb_array_retain(y);
    nb_tree *xl = leaf_of(ctx, x), *yl = leaf_of(ctx, y);
    for (int s = 0; s < STEPS; s++) {
        nb_tree *a = nbt_tuple_take(ctx, 3,
                                    (nb_tree *[]){ens, nb_tree_retain(xl), nb_tree_retain(yl)}),
                *o = NULL;
        NBT_OK(ctx, nb_fn_call(jstep, a, &o));
        ens = nb_tree_retain((nb_tree *)nb_tree_child(o, 0));
        nb_tree_destroy(o);
        nb_tree_destroy(a);
    }
    nb_fn_stats js;
    NBT_OK(ctx, nb_fn_stats_get(jstep, &js));
    NBT_EQ_I64(js.n_traces, 1);
    /* apart: each model alone */
    int64_t differ = 0, total = 0;
    double worst = 0;
    for (int m = 0; m < NM; m++) {
        nb_tree *a1 = nbt_tuple_take(ctx, 1, (nb_tree *[]){leaf_of(ctx, row(ctx, keys, m))});
        nb_tree *one = NULL;
        NBT_OK(ctx, nb_fn_call(init, a1, &one));
        nb_tree_destroy(a1);
        for (int s = 0; s < STEPS; s++) {
            nb_tree *a = nbt_tuple_take(ctx, 3,
                                        (nb_tree *[]){one, nb_tree_retain(xl), nb_tree_retain(yl)}),
                    *o = NULL;
            NBT_OK(ctx, nb_fn_call(step, a, &o));
            one = nb_tree_retain((nb_tree *)nb_tree_child(o, 0));
            nb_tree_destroy(o);
            nb_tree_destroy(a);
        }
        for (int k = 0; k < 4; k++) {
            const nb_tree *el = nb_tree_get(nb_tree_child(ens, 0), PK[k]);
            const nb_tree *ol = nb_tree_get(nb_tree_child(one, 0), PK[k]);
            int64_t n = nb_array_size(nb_tree_get_array(ol));
            for (int64_t i = 0; i < n; i++) {
                double u = at(el, m * n + i), v = at(ol, i);
                differ += !same_bits_f32(u, v);
                worst = nbt_max(worst, fabs(u - v));
                total++;
            }
        }
        nb_tree_destroy(one);
    }
    print_message("an ensemble of %d MLPs 64-16-10 (Adam, %d steps on %d digits, 1 trace): "
                  "%lld of %lld parameters differ from %d separate trainings (largest "
                  "difference %.2e)\n",
                  NM, STEPS, 64, (long long)differ, (long long)total, NM, worst);
    NBT_EQ_I64(differ, 0);
    nb_tree_destroy(ens);
    nb_tree_destroy(xl);
    nb_tree_destroy(yl);
    nb_tree_destroy(kargs);
    nb_tree_destroy(axes);
    nb_tree_destroy(opt);
    nb_fn_destroy(jstep);
    nb_fn_destroy(vstep);
    nb_fn_destroy(vinit);
    nb_fn_destroy(step);
    nb_fn_destroy(init);
    nb_fn_destroy(g_vgb);
    nb_fn_destroy(lb);
    nb_array_destroy(keys);
    nb_array_destroy(key);
    nb_array_destroy(x);
    nb_array_destroy(y);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_per_example_digits),
        cmocka_unit_test(test_ensemble_adam),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

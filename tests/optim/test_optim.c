/*
 * test_optim.c -- optimizers (nabla/optim.h): trajectories against independent equations
 * and against PyTorch / Optax (oracle files beside their scripts in tests/optim/oracle/),
 * state structure invariance for every transformation, the seeds' failure 5 (state built
 * from the gradient template; from the parameters it is an error naming the path), no
 * retrace when an optimizer is re-created or a learning rate changes, schedules, errors.
 */
#include "nbtest.h"

#include <nabla/nabla.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef NBT_ORACLE_DIR
#define NBT_ORACLE_DIR "tests/optim/oracle"
#endif

/* ---- the least-squares problem of the oracle files ------------------------------------ */
#define LS_M 20
#define LS_N 5
#define LS_STEPS 50

static double ls_a[LS_M][LS_N], ls_y[LS_M];

static void ls_setup(void) {
    for (int i = 0; i < LS_M; i++) {
        for (int j = 0; j < LS_N; j++) {
            ls_a[i][j] = sin(1.0 + i * LS_N + j);
        }
        ls_y[i] = cos(0.5 * i);
    }
}

/* x = (w0..w4, b) */
static void ls_grad(const double *x, double *g) {
    double r[LS_M];
    for (int i = 0; i < LS_M; i++) {
        double s = x[LS_N];
        for (int j = 0; j < LS_N; j++) {
            s += ls_a[i][j] * x[j];
        }
        r[i] = s - ls_y[i];
    }
    for (int j = 0; j <= LS_N; j++) {
        double s = 0.0;
        for (int i = 0; i < LS_M; i++) {
            s += r[i] * (j < LS_N ? ls_a[i][j] : 1.0);
        }
        g[j] = s / LS_M;
    }
}

static nb_tree *leaf_of(nb_array *a) {
    nb_tree *t = NULL;
    assert_int_equal(nb_tree_array(a, &t), NB_OK);
    nb_array_destroy(a);
    return t;
}

static nb_tree *dict2(nb_ctx *ctx, const char *k0, nb_tree *v0, const char *k1, nb_tree *v1) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){k0, k1}, (nb_tree *[]){v0, v1}, &t));
    nb_tree_destroy(v0);
    nb_tree_destroy(v1);
    return t;
}

static nb_tree *ls_params(nb_ctx *ctx, const double *x) {
    nb_array *w = NULL, *b = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){LS_N}, x, &w));
    NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_F64, x[LS_N], &b));
    return dict2(ctx, "w", leaf_of(w), "b", leaf_of(b));
}

static void ls_read(const nb_tree *params, double *x) {
    const double *w = nb_array_data(nb_tree_get_array(nb_tree_get(params, "w")));
    memcpy(x, w, LS_N * sizeof(double));
    x[LS_N] = *(const double *)nb_array_data(nb_tree_get_array(nb_tree_get(params, "b")));
}

static nb_fn *ls_grad_fn; /* grad of ls_loss, made in the test's setup */

static nb_status ls_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *w = nb_get(tr, args, "[0].w"), *b = nb_get(tr, args, "[0].b");
    nb_var *a = nb_get(tr, args, "[1]"), *y = nb_get(tr, args, "[2]");
    nb_var *r = nb_sub(nb_add(nb_matmul(a, w), b), y);
    return nb_return(nb_mul(nb_scalar(tr, 0.5), nb_mean(nb_square(r), NULL, 0, false)), out);
}

/* One training step: self = the optimizer; args = (params, state, A, y);
 * returns (params, state). */
static nb_status ls_step(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    const nb_tree *params = nb_tree_child(args, 0), *state = nb_tree_child(args, 1);
    nb_tree *gargs = NULL;
    nb_status st = nb_tree_tuple(nb_trace_ctx(tr), 3,
                                 (nb_tree *[]){(nb_tree *)params, (nb_tree *)nb_tree_child(args, 2),
                                               (nb_tree *)nb_tree_child(args, 3)},
                                 &gargs);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *grads = nb_apply(tr, ls_grad_fn, gargs);
    nb_tree_destroy(gargs);
    if (grads == NULL) {
        return nb_trace_status(tr);
    }
    const nb_tree *updates = NULL, *new_state = NULL;
    st = nb_optim_update(tr, self, grads, state, params, &updates, &new_state);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *new_params = nb_apply_updates(tr, params, updates);
    if (new_params == NULL) {
        return nb_trace_status(tr);
    }
    return nb_tree_tuple(nb_trace_ctx(tr), 2,
                         (nb_tree *[]){(nb_tree *)new_params, (nb_tree *)new_state}, out);
}

typedef struct ls_run {
    nb_ctx *ctx;
    nb_tree *data; /* (A, y) leaves */
    nb_tree *a_leaf, *y_leaf;
} ls_run;

static void ls_run_init(ls_run *r) {
    memset(r, 0, sizeof *r);
    assert_int_equal(nb_ctx_create(NULL, &r->ctx), NB_OK);
    ls_setup();
    nb_array *a = NULL, *y = NULL;
    NBT_OK(r->ctx, nb_array_from_data(r->ctx, NB_DTYPE_F64, 2, (int64_t[]){LS_M, LS_N}, ls_a, &a));
    NBT_OK(r->ctx, nb_array_from_data(r->ctx, NB_DTYPE_F64, 1, (int64_t[]){LS_M}, ls_y, &y));
    r->a_leaf = leaf_of(a);
    r->y_leaf = leaf_of(y);
    nb_fn *loss = NULL;
    NBT_OK(r->ctx, nb_fn_create(r->ctx, "ls_loss", ls_loss, NULL, &loss));
    NBT_OK(r->ctx, nb_grad(loss, NULL, &ls_grad_fn));
    nb_fn_destroy(loss);
}

static void ls_run_free(ls_run *r) {
    nb_tree_destroy(r->a_leaf);
    nb_tree_destroy(r->y_leaf);
    nb_fn_destroy(ls_grad_fn);
    ls_grad_fn = NULL;
    nb_ctx_destroy(r->ctx);
}

static const double ls_x0[LS_N + 1] = {0.1, 0.2, 0.3, 0.4, 0.5, -0.2};

/* Run LS_STEPS jitted steps of opt (borrowed) from ls_x0; traj[(s)*6 + j] after step s
 * (traj[0..5] = x0). Returns the number of traces of the step. */
static int64_t ls_trajectory(ls_run *r, const nb_tree *opt, double *traj) {
    nb_ctx *ctx = r->ctx;
    nb_fn *f = NULL, *jf = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "ls_step", ls_step, opt, &f));
    nb_jit_opts jo = nb_jit_opts_default();
    NBT_OK(ctx, nb_jit(f, &jo, &jf));
    nb_tree *params = ls_params(ctx, ls_x0), *tmpl = NULL, *state = NULL;
    NBT_OK(ctx, nb_grad_template(params, NULL, &tmpl));
    NBT_OK(ctx, nb_optim_init(opt, tmpl, &state));
    memcpy(traj, ls_x0, sizeof ls_x0);
    for (int s = 1; s <= LS_STEPS; s++) {
        nb_tree *args = NULL, *res = NULL;
        NBT_OK(ctx,
               nb_tree_tuple(ctx, 4, (nb_tree *[]){params, state, r->a_leaf, r->y_leaf}, &args));
        NBT_OK(ctx, nb_fn_call(jf, args, &res));
        nb_tree_destroy(args);
        nb_tree_destroy(params);
        nb_tree_destroy(state);
        params = nb_tree_retain((nb_tree *)nb_tree_child(res, 0));
        state = nb_tree_retain((nb_tree *)nb_tree_child(res, 1));
        nb_tree_destroy(res);
        ls_read(params, traj + s * (LS_N + 1));
    }
    nb_fn_stats stats;
    NBT_OK(ctx, nb_fn_stats_get(jf, &stats));
    nb_tree_destroy(params);
    nb_tree_destroy(state);
    nb_tree_destroy(tmpl);
    nb_fn_destroy(jf);
    nb_fn_destroy(f);
    return stats.n_traces;
}

static double rel_err(double a, double b) {
    double d = fabs(a - b), s = fmax(fabs(a), fabs(b));
    return s > 1e-300 ? d / s : d;
}

/* max relative error between two trajectories (all steps, all coordinates) */
static double traj_err(const double *a, const double *b) {
    double e = 0.0;
    for (int i = 0; i < (LS_STEPS + 1) * (LS_N + 1); i++) {
        e = fmax(e, rel_err(a[i], b[i]));
    }
    return e;
}

/* ---- independent reference implementations (the published equations, in doubles) ------ */
typedef enum {
    REF_SGD,
    REF_MOMENTUM,
    REF_NESTEROV,
    REF_ADAM,
    REF_ADAMW,
    REF_RMSPROP,
    REF_RMSPROP_OUT,
    REF_RMSPROP_CENTERED,
    REF_ADAGRAD,
    REF_LION,
    REF_LAMB,
    REF_CLIP_GN_ADAM,
} ref_kind;

typedef struct ref_opts {
    double lr, b1, b2, eps, wd, decay, init, momentum, clip;
} ref_opts;

static double sgn(double v) {
    return v > 0 ? 1.0 : v < 0 ? -1.0 : 0.0;
}

static void ref_trajectory(ref_kind k, ref_opts o, double *traj) {
    enum { N = LS_N + 1 };
    double x[N], g[N], m[N] = {0}, v[N] = {0}, d[N];
    memcpy(x, ls_x0, sizeof x);
    memcpy(traj, x, sizeof x);
    for (int j = 0; j < N; j++) {
        v[j] = (k == REF_ADAGRAD) ? o.init : 0.0;
    }
    for (int t = 1; t <= LS_STEPS; t++) {
        ls_grad(x, g);
        if (k == REF_CLIP_GN_ADAM) {
            double n2 = 0.0;
            for (int j = 0; j < N; j++) {
                n2 += g[j] * g[j];
            }
            double nrm = sqrt(n2);
            if (!(nrm < o.clip)) {
                for (int j = 0; j < N; j++) {
                    g[j] = g[j] / nrm * o.clip;
                }
            }
        }
        for (int j = 0; j < N; j++) {
            switch (k) {
            case REF_SGD:
                d[j] = -o.lr * g[j];
                break;
            case REF_MOMENTUM:
                m[j] = g[j] + o.momentum * m[j];
                d[j] = -o.lr * m[j];
                break;
            case REF_NESTEROV:
                m[j] = g[j] + o.momentum * m[j];
                d[j] = -o.lr * (g[j] + o.momentum * m[j]);
                break;
            case REF_ADAM:
            case REF_ADAMW:
            case REF_LAMB:
            case REF_CLIP_GN_ADAM: {
                m[j] = (1 - o.b1) * g[j] + o.b1 * m[j];
                v[j] = (1 - o.b2) * g[j] * g[j] + o.b2 * v[j];
                double mh = m[j] / (1 - pow(o.b1, t)), vh = v[j] / (1 - pow(o.b2, t));
                d[j] = mh / (sqrt(vh) + o.eps);
                if (k != REF_ADAM && k != REF_CLIP_GN_ADAM) {
                    d[j] += o.wd * x[j];
                }
                if (k != REF_LAMB) {
                    d[j] *= -o.lr;
                }
                break;
            }
            case REF_RMSPROP:
            case REF_RMSPROP_OUT:
                v[j] = (1 - o.decay) * g[j] * g[j] + o.decay * v[j];
                d[j] = -o.lr *
                       (k == REF_RMSPROP ? g[j] / sqrt(v[j] + o.eps) : g[j] / (sqrt(v[j]) + o.eps));
                break;
            case REF_RMSPROP_CENTERED:
                v[j] = (1 - o.decay) * g[j] * g[j] + o.decay * v[j];
                m[j] = (1 - o.decay) * g[j] + o.decay * m[j];
                d[j] = -o.lr * g[j] / sqrt(v[j] - m[j] * m[j] + o.eps);
                break;
            case REF_ADAGRAD:
                v[j] += g[j] * g[j];
                d[j] = -o.lr * (v[j] > 0 ? g[j] / sqrt(v[j] + o.eps) : 0.0);
                break;
            case REF_LION:
                d[j] = sgn((1 - o.b1) * g[j] + o.b1 * m[j]);
                m[j] = (1 - o.b2) * g[j] + o.b2 * m[j];
                d[j] = -o.lr * (d[j] + o.wd * x[j]);
                break;
            }
        }
        if (k == REF_LAMB) {
            /* per leaf: w (coordinates 0..4) and b (5) */
            int lo[2] = {0, LS_N}, hi[2] = {LS_N, N};
            for (int l = 0; l < 2; l++) {
                double pn = 0, un = 0;
                for (int j = lo[l]; j < hi[l]; j++) {
                    pn += x[j] * x[j];
                    un += d[j] * d[j];
                }
                pn = sqrt(pn);
                un = sqrt(un);
                double r = (pn == 0 || un == 0) ? 1.0 : pn / un;
                for (int j = lo[l]; j < hi[l]; j++) {
                    d[j] = -o.lr * r * d[j];
                }
            }
        }
        for (int j = 0; j < N; j++) {
            x[j] += d[j];
        }
        memcpy(traj + t * N, x, sizeof x);
    }
}

#define TRAJ_LEN ((LS_STEPS + 1) * (LS_N + 1))

static void check_against_ref(ls_run *r, const nb_tree *opt, ref_kind k, ref_opts o, double tol,
                              const char *name) {
    double *got = calloc(TRAJ_LEN, sizeof(double)), *want = calloc(TRAJ_LEN, sizeof(double));
    assert_non_null(got);
    assert_non_null(want);
    NBT_EQ_I64(ls_trajectory(r, opt, got), 1);
    ref_trajectory(k, o, want);
    double e = traj_err(got, want);
    printf("%-36s max rel err %.3g\n", name, e);
    if (!(e <= tol)) {
        fail_msg("%s: max relative difference from the reference equations %.3g > %.3g", name, e,
                 tol);
    }
    /* the trajectory moved: the test could fail */
    assert_true(rel_err(got[TRAJ_LEN - 1], ls_x0[LS_N]) > 1e-6);
    free(got);
    free(want);
}

static void test_equations(void **state) {
    (void)state;
    ls_run r;
    ls_run_init(&r);
    nb_ctx *ctx = r.ctx;
    nb_tree *opt = NULL;
    nb_optim_opts o = nb_optim_opts_default();
    const double tol = 1e-12;

    NBT_OK(ctx, nb_optim_sgd(ctx, 0.05, NULL, &opt));
    check_against_ref(&r, opt, REF_SGD, (ref_opts){.lr = 0.05}, tol, "sgd");
    nb_tree_destroy(opt);

    o.momentum = 0.9;
    NBT_OK(ctx, nb_optim_sgd(ctx, 0.05, &o, &opt));
    check_against_ref(&r, opt, REF_MOMENTUM, (ref_opts){.lr = 0.05, .momentum = 0.9}, tol,
                      "sgd momentum");
    nb_tree_destroy(opt);
    o.nesterov = true;
    NBT_OK(ctx, nb_optim_sgd(ctx, 0.05, &o, &opt));
    check_against_ref(&r, opt, REF_NESTEROV, (ref_opts){.lr = 0.05, .momentum = 0.9}, tol,
                      "sgd nesterov");
    nb_tree_destroy(opt);

    NBT_OK(ctx, nb_optim_adam(ctx, 0.01, NULL, &opt));
    check_against_ref(&r, opt, REF_ADAM,
                      (ref_opts){.lr = 0.01, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8}, tol, "adam");
    nb_tree_destroy(opt);

    o = nb_optim_opts_default();
    o.weight_decay = 0.1;
    NBT_OK(ctx, nb_optim_adamw(ctx, 0.01, &o, &opt));
    check_against_ref(&r, opt, REF_ADAMW,
                      (ref_opts){.lr = 0.01, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8, .wd = 0.1}, tol,
                      "adamw");
    nb_tree_destroy(opt);

    NBT_OK(ctx, nb_optim_rmsprop(ctx, 0.01, NULL, &opt));
    check_against_ref(&r, opt, REF_RMSPROP, (ref_opts){.lr = 0.01, .decay = 0.9, .eps = 1e-8}, tol,
                      "rmsprop");
    nb_tree_destroy(opt);
    o = nb_optim_opts_default();
    o.eps_outside_sqrt = true;
    NBT_OK(ctx, nb_optim_rmsprop(ctx, 0.01, &o, &opt));
    check_against_ref(&r, opt, REF_RMSPROP_OUT, (ref_opts){.lr = 0.01, .decay = 0.9, .eps = 1e-8},
                      tol, "rmsprop eps outside sqrt");
    nb_tree_destroy(opt);
    o = nb_optim_opts_default();
    o.centered = true;
    NBT_OK(ctx, nb_optim_rmsprop(ctx, 0.01, &o, &opt));
    check_against_ref(&r, opt, REF_RMSPROP_CENTERED,
                      (ref_opts){.lr = 0.01, .decay = 0.9, .eps = 1e-8}, tol, "rmsprop centered");
    nb_tree_destroy(opt);

    NBT_OK(ctx, nb_optim_adagrad(ctx, 0.1, NULL, &opt));
    check_against_ref(&r, opt, REF_ADAGRAD, (ref_opts){.lr = 0.1, .init = 0.1, .eps = 1e-7}, tol,
                      "adagrad");
    nb_tree_destroy(opt);

    NBT_OK(ctx, nb_optim_lion(ctx, 0.001, NULL, &opt));
    check_against_ref(&r, opt, REF_LION, (ref_opts){.lr = 0.001, .b1 = 0.9, .b2 = 0.99, .wd = 1e-3},
                      tol, "lion");
    nb_tree_destroy(opt);

    o = nb_optim_opts_default();
    o.weight_decay = 0.1;
    NBT_OK(ctx, nb_optim_lamb(ctx, 0.01, &o, &opt));
    check_against_ref(&r, opt, REF_LAMB,
                      (ref_opts){.lr = 0.01, .b1 = 0.9, .b2 = 0.999, .eps = 1e-6, .wd = 0.1}, tol,
                      "lamb");
    nb_tree_destroy(opt);

    nb_tree *parts[2] = {NULL, NULL};
    NBT_OK(ctx, nb_optim_clip_by_global_norm(ctx, 0.5, &parts[0]));
    NBT_OK(ctx, nb_optim_adam(ctx, 0.01, NULL, &parts[1]));
    NBT_OK(ctx, nb_optim_chain(ctx, 2, (const nb_tree *const *)parts, &opt));
    check_against_ref(&r, opt, REF_CLIP_GN_ADAM,
                      (ref_opts){.lr = 0.01, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8, .clip = 0.5}, tol,
                      "chain(clip_by_global_norm, adam)");
    nb_tree_destroy(opt);
    nb_tree_destroy(parts[0]);
    nb_tree_destroy(parts[1]);
    ls_run_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_optim.c -- optimizers (nabla/optim.h): trajectories against independent equations
 * and against PyTorch / Optax (oracle files beside their scripts in tests/optim/oracle/),
 * state structure invariance for every transformation, the seeds' failure 5 (state built
 * from the gradient template; from the parameters it is an error naming the path, at init
 * already), no retrace when an optimizer is re-created or a learning rate changes,
 * nb_optim_set_hyper applying the constructors' checks, schedules, errors.
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
        e = nbt_max(e, rel_err(a[i], b[i]));
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

/* ---- oracles: PyTorch and Optax trajectories, Optax schedules ---------------------------- */

/* The trajectory of config in file (steps 0..50 x 6 values); false if absent. */
static bool oracle_traj(const char *file, const char *config, double *traj) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", NBT_ORACLE_DIR, file);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fail_msg("cannot open oracle file %s", path);
    }
    char line[2048];
    int found = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        char name[128];
        int step = -1, used = 0;
        if (line[0] == '#' || sscanf(line, "%127s %d%n", name, &step, &used) != 2 ||
            strcmp(name, config) != 0) {
            continue;
        }
        assert_true(step >= 0 && step <= LS_STEPS);
        const char *q = line + used;
        for (int j = 0; j < LS_N + 1; j++) {
            char *end = NULL;
            traj[step * (LS_N + 1) + j] = strtod(q, &end);
            assert_true(end != q);
            q = end;
        }
        found++;
    }
    fclose(f);
    if (found != 0 && found != LS_STEPS + 1) {
        fail_msg("%s: config %s has %d steps, wanted %d", file, config, found, LS_STEPS + 1);
    }
    return found != 0;
}

typedef struct oracle_case {
    const char *config;
    nb_tree *opt;
} oracle_case;

static void check_oracle(ls_run *r, const char *file, const char *config, const nb_tree *opt,
                         double tol) {
    double *want = calloc(TRAJ_LEN, sizeof(double)), *got = calloc(TRAJ_LEN, sizeof(double));
    assert_non_null(want);
    assert_non_null(got);
    if (!oracle_traj(file, config, want)) {
        fail_msg("%s has no config %s", file, config);
    }
    NBT_EQ_I64(ls_trajectory(r, opt, got), 1);
    double e = traj_err(got, want);
    printf("%-12s %-28s max rel err %.3g\n", file, config, e);
    if (!(e <= tol)) {
        fail_msg("%s %s: max relative difference %.3g > %.3g", file, config, e, tol);
    }
    free(want);
    free(got);
}

static nb_tree *mk_sched(nb_ctx *ctx, const char *name) {
    nb_tree *s = NULL;
    if (strcmp(name, "constant") == 0) {
        NBT_OK(ctx, nb_schedule_constant(ctx, 0.05, &s));
    } else if (strcmp(name, "linear") == 0) {
        NBT_OK(ctx, nb_schedule_linear(ctx, 0.05, 0.005, 30, 0, &s));
    } else if (strcmp(name, "polynomial") == 0) {
        NBT_OK(ctx, nb_schedule_polynomial(ctx, 0.05, 0.001, 2.0, 40, 5, &s));
    } else if (strcmp(name, "cosine") == 0) {
        NBT_OK(ctx, nb_schedule_cosine_decay(ctx, 0.05, 40, 0.1, 1.0, &s));
    } else if (strcmp(name, "warmup_cosine") == 0) {
        NBT_OK(ctx, nb_schedule_warmup_cosine_decay(ctx, 0.0, 0.05, 10, 45, 0.001, 1.0, &s));
    } else if (strcmp(name, "exp_staircase") == 0) {
        NBT_OK(ctx, nb_schedule_exponential_decay(ctx, 0.05, 10, 0.5, 3, true, NAN, &s));
    } else if (strcmp(name, "exp_end") == 0) {
        NBT_OK(ctx, nb_schedule_exponential_decay(ctx, 0.05, 10, 0.5, 3, false, 0.01, &s));
    } else if (strcmp(name, "piecewise") == 0) {
        NBT_OK(ctx, nb_schedule_piecewise_constant(ctx, 0.05, 2, (int64_t[]){10, 25},
                                                   (double[]){0.5, 0.2}, &s));
    } else {
        fail_msg("unknown schedule %s", name);
    }
    return s;
}

static const char *const sched_names[] = {"constant", "linear",        "polynomial",
                                          "cosine",   "warmup_cosine", "exp_staircase",
                                          "exp_end",  "piecewise"};

/* PyTorch's torch.optim (tests/optim/oracle/gen_torch_optim.py) to 1e-10 relative: the
 * optimizers whose definitions agree with Optax's, and rmsprop/adagrad with the settings
 * under which Optax's and PyTorch's definitions coincide. */
static void test_oracle_torch(void **unused) {
    (void)unused;
    ls_run r;
    ls_run_init(&r);
    nb_ctx *ctx = r.ctx;
    nb_optim_opts o[7];
    for (int i = 0; i < 7; i++) {
        o[i] = nb_optim_opts_default();
    }
    o[0].momentum = 0.9;
    o[1].momentum = 0.9;
    o[1].nesterov = true;
    o[3].weight_decay = 0.1;
    o[4].eps_outside_sqrt = true;
    o[5].eps_outside_sqrt = true;
    o[5].centered = true;
    o[6].eps = 0.0;
    o[6].initial_scale = 0.1;
    oracle_case cases[7] = {
        {"sgd_momentum", NULL}, {"sgd_nesterov", NULL},        {"adam", NULL},
        {"adamw", NULL},        {"rmsprop_eps_outside", NULL}, {"rmsprop_centered", NULL},
        {"adagrad", NULL}};
    NBT_OK(ctx, nb_optim_sgd(ctx, 0.05, &o[0], &cases[0].opt));
    NBT_OK(ctx, nb_optim_sgd(ctx, 0.05, &o[1], &cases[1].opt));
    NBT_OK(ctx, nb_optim_adam(ctx, 0.01, &o[2], &cases[2].opt));
    NBT_OK(ctx, nb_optim_adamw(ctx, 0.01, &o[3], &cases[3].opt));
    NBT_OK(ctx, nb_optim_rmsprop(ctx, 0.01, &o[4], &cases[4].opt));
    NBT_OK(ctx, nb_optim_rmsprop(ctx, 0.01, &o[5], &cases[5].opt));
    NBT_OK(ctx, nb_optim_adagrad(ctx, 0.1, &o[6], &cases[6].opt));
    for (int i = 0; i < 7; i++) {
        check_oracle(&r, "torch_optim.txt", cases[i].config, cases[i].opt, 1e-10);
        nb_tree_destroy(cases[i].opt);
    }
    ls_run_free(&r);
}

/* Optax 0.2.8 (gen_optax_optim.py, f64) for every transformation and schedule. */
static void test_oracle_optax(void **unused) {
    (void)unused;
    ls_run r;
    ls_run_init(&r);
    nb_ctx *ctx = r.ctx;
    enum { NC = 19 + 8 };
    oracle_case c[NC];
    memset(c, 0, sizeof c);
    int n = 0;
    nb_optim_opts o;
#define CASE(name_, expr_)                                                                         \
    do {                                                                                           \
        c[n].config = name_;                                                                       \
        NBT_OK(ctx, expr_);                                                                        \
        n++;                                                                                       \
    } while (0)
    CASE("sgd", nb_optim_sgd(ctx, 0.05, NULL, &c[n].opt));
    o = nb_optim_opts_default();
    o.momentum = 0.9;
    CASE("sgd_momentum", nb_optim_sgd(ctx, 0.05, &o, &c[n].opt));
    o.nesterov = true;
    CASE("sgd_nesterov", nb_optim_sgd(ctx, 0.05, &o, &c[n].opt));
    CASE("adam", nb_optim_adam(ctx, 0.01, NULL, &c[n].opt));
    o = nb_optim_opts_default();
    o.nesterov = true;
    CASE("adam_nesterov", nb_optim_adam(ctx, 0.01, &o, &c[n].opt));
    o = nb_optim_opts_default();
    o.weight_decay = 0.1;
    CASE("adamw", nb_optim_adamw(ctx, 0.01, &o, &c[n].opt));
    CASE("rmsprop", nb_optim_rmsprop(ctx, 0.01, NULL, &c[n].opt));
    o = nb_optim_opts_default();
    o.eps_outside_sqrt = true;
    CASE("rmsprop_eps_outside", nb_optim_rmsprop(ctx, 0.01, &o, &c[n].opt));
    o = nb_optim_opts_default();
    o.centered = true;
    CASE("rmsprop_centered", nb_optim_rmsprop(ctx, 0.01, &o, &c[n].opt));
    o.eps_outside_sqrt = true;
    CASE("rmsprop_centered_eps_outside", nb_optim_rmsprop(ctx, 0.01, &o, &c[n].opt));
    o = nb_optim_opts_default();
    o.momentum = 0.9;
    o.nesterov = true;
    CASE("rmsprop_momentum", nb_optim_rmsprop(ctx, 0.01, &o, &c[n].opt));
    CASE("adagrad", nb_optim_adagrad(ctx, 0.1, NULL, &c[n].opt));
    o = nb_optim_opts_default();
    o.eps = 0.0;
    o.initial_scale = 0.1;
    CASE("adagrad_eps0", nb_optim_adagrad(ctx, 0.1, &o, &c[n].opt));
    CASE("lion", nb_optim_lion(ctx, 0.001, NULL, &c[n].opt));
    CASE("lamb", nb_optim_lamb(ctx, 0.01, NULL, &c[n].opt));
    o = nb_optim_opts_default();
    o.weight_decay = 0.1;
    CASE("lamb_wd", nb_optim_lamb(ctx, 0.01, &o, &c[n].opt));
    nb_tree *p2[2] = {NULL, NULL}, *p3[2] = {NULL, NULL}, *p4[3] = {NULL, NULL, NULL};
    NBT_OK(ctx, nb_optim_clip_by_global_norm(ctx, 0.5, &p2[0]));
    NBT_OK(ctx, nb_optim_adam(ctx, 0.01, NULL, &p2[1]));
    CASE("clip_gn_adam", nb_optim_chain(ctx, 2, (const nb_tree *const *)p2, &c[n].opt));
    NBT_OK(ctx, nb_optim_clip(ctx, 0.05, &p3[0]));
    NBT_OK(ctx, nb_optim_sgd(ctx, 0.05, NULL, &p3[1]));
    CASE("clip_sgd", nb_optim_chain(ctx, 2, (const nb_tree *const *)p3, &c[n].opt));
    nb_tree *t = NULL, *f = NULL, *mask = NULL;
    NBT_OK(ctx, nb_tree_bool(ctx, true, &t));
    NBT_OK(ctx, nb_tree_bool(ctx, false, &f));
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"w", "b"}, (nb_tree *[]){t, f}, &mask));
    NBT_OK(ctx, nb_optim_add_decayed_weights(ctx, 0.1, NULL, &p4[0]));
    NBT_OK(ctx, nb_optim_masked(p4[0], mask, &p4[1]));
    NBT_OK(ctx, nb_optim_sgd(ctx, 0.05, NULL, &p4[2]));
    CASE("masked_wd", nb_optim_chain(ctx, 2, (const nb_tree *const *)(p4 + 1), &c[n].opt));
    char names[8][64];
    for (int i = 0; i < 8; i++) {
        nb_tree *s = mk_sched(ctx, sched_names[i]);
        o = nb_optim_opts_default();
        o.schedule = s;
        snprintf(names[i], sizeof names[i], "sgd_sched_%s",
                 strcmp(sched_names[i], "warmup_cosine") == 0 ? "warmup_cosine" : sched_names[i]);
        CASE(names[i], nb_optim_sgd(ctx, 0.0, &o, &c[n].opt));
        nb_tree_destroy(s);
    }
#undef CASE
    for (int i = 0; i < n; i++) {
        check_oracle(&r, "optax_optim.txt", c[i].config, c[i].opt, 1e-10);
        nb_tree_destroy(c[i].opt);
    }
    for (int i = 0; i < 2; i++) {
        nb_tree_destroy(p2[i]);
        nb_tree_destroy(p3[i]);
    }
    for (int i = 0; i < 3; i++) {
        nb_tree_destroy(p4[i]);
    }
    nb_tree_destroy(t);
    nb_tree_destroy(f);
    nb_tree_destroy(mask);
    ls_run_free(&r);
}

/* Schedule values at counts 0..60 against Optax's (f64). */
static void test_oracle_schedules(void **unused) {
    (void)unused;
    nb_ctx *ctx = NULL;
    assert_int_equal(nb_ctx_create(NULL, &ctx), NB_OK);
    char path[1024];
    snprintf(path, sizeof path, "%s/optax_optim.txt", NBT_ORACLE_DIR);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[512];
    int checked = 0;
    double worst = 0.0;
    while (fgets(line, sizeof line, f) != NULL) {
        char name[64];
        int count = 0;
        double want = 0.0;
        if (sscanf(line, "schedule %63s %d %lf", name, &count, &want) != 3) {
            continue;
        }
        nb_tree *s = mk_sched(ctx, name);
        double got = NAN;
        NBT_OK(ctx, nb_schedule_value(s, count, &got));
        double e = rel_err(got, want);
        worst = nbt_max(worst, e);
        if (!(e <= 1e-13)) {
            fail_msg("schedule %s at %d: %.17g vs Optax %.17g", name, count, got, want);
        }
        nb_tree_destroy(s);
        checked++;
    }
    fclose(f);
    printf("schedules: %d values, max rel err %.3g\n", checked, worst);
    NBT_EQ_I64(checked, 8 * 61);
    nb_ctx_destroy(ctx);
}

/* ---- structure invariance ------------------------------------------------------------ */

/* A model with a frozen parameter, an integer leaf, a static leaf and a null: the grad
 * template has nulls at all of them. */
static nb_tree *model_params(nb_ctx *ctx, nb_dtype dt) {
    nb_array *w0 = NULL, *b0 = NULL, *w1 = NULL, *b1 = NULL, *steps = NULL;
    NBT_OK(ctx, nb_array_full(ctx, dt, 2, (int64_t[]){3, 2}, 0.5, &w0));
    NBT_OK(ctx, nb_array_full(ctx, dt, 1, (int64_t[]){2}, -0.25, &b0));
    NBT_OK(ctx, nb_array_full(ctx, dt, 2, (int64_t[]){2, 1}, 0.75, &w1));
    NBT_OK(ctx, nb_array_full(ctx, dt, 1, (int64_t[]){1}, 0.125, &b1));
    NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_I32, 7, &steps));
    float *pw = nb_array_data(w0);
    for (int i = 0; dt == NB_DTYPE_F32 && i < 6; i++) {
        pw[i] = 0.1f * (float)(i + 1) * (i % 2 ? -1.0f : 1.0f);
    }
    nb_tree *lw1 = leaf_of(w1), *frozen = NULL;
    NBT_OK(ctx, nb_tree_freeze(lw1, &frozen));
    nb_tree_destroy(lw1);
    nb_tree *l0 = dict2(ctx, "weight", leaf_of(w0), "bias", leaf_of(b0));
    nb_tree *l1 = dict2(ctx, "weight", frozen, "bias", leaf_of(b1));
    nb_tree *layers = NULL, *act = NULL, *none = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_list(ctx, 2, (nb_tree *[]){l0, l1}, &layers));
    NBT_OK(ctx, nb_tree_string(ctx, "tanh", &act));
    NBT_OK(ctx, nb_tree_null(ctx, &none));
    nb_tree *st = leaf_of(steps);
    NBT_OK(ctx, nb_tree_dict(ctx, 4, (const char *[]){"layers", "step", "act", "extra"},
                             (nb_tree *[]){layers, st, act, none}, &out));
    nb_tree_destroy(l0);
    nb_tree_destroy(l1);
    nb_tree_destroy(layers);
    nb_tree_destroy(st);
    nb_tree_destroy(act);
    nb_tree_destroy(none);
    return out;
}

/* grads of the template's structure with deterministic values (differing per call k) */
static nb_status fill_cb(void *ud, const char *path, int n, const nb_tree *const *l,
                         nb_tree **out) {
    (void)path;
    (void)n;
    int *k = ud;
    nb_array *a = NULL;
    nb_status st = nb_array_copy(nb_tree_get_array(l[0]), &a);
    if (st != NB_OK) {
        return st;
    }
    for (int64_t i = 0; i < nb_array_size(a); i++) {
        double v = sin(0.7 * (double)(*k) + 1.3 * (double)i);
        if (nb_array_dtype(a) == NB_DTYPE_F32) {
            ((float *)nb_array_data(a))[i] = (float)v;
        } else {
            ((double *)nb_array_data(a))[i] = v;
        }
    }
    (*k)++;
    st = nb_tree_array(a, out);
    nb_array_destroy(a);
    return st;
}

static void expect_same_signature(nb_ctx *ctx, const nb_tree *a, const nb_tree *b, const char *what,
                                  const char *name) {
    bool differ = true;
    char how[512];
    NBT_OK(ctx, nb_tree_diff(a, b, NB_TREE_DIFF_SIGNATURE, &differ, how, sizeof how, NULL));
    if (differ) {
        fail_msg("%s: %s changed: %s", name, what, how);
    }
}

/* Every optimizer of the set, chain and masked, and schedules as learning rates: init from
 * the template, three updates, the state's treedef, dtypes and shapes never change and
 * the updates have the grads' structure. */
static void check_invariance(nb_ctx *ctx, const nb_tree *opt, nb_dtype dt, const char *name) {
    nb_tree *params = model_params(ctx, dt), *tmpl = NULL, *state = NULL;
    NBT_OK(ctx, nb_grad_template(params, NULL, &tmpl));
    NBT_OK(ctx, nb_optim_init(opt, tmpl, &state));
    nb_tree *state0 = nb_tree_retain(state);
    int k = 0;
    for (int step = 0; step < 3; step++) {
        nb_tree *grads = NULL, *updates = NULL, *ns = NULL, *np = NULL;
        NBT_OK(ctx, nb_tree_map(tmpl, fill_cb, &k, 0, &grads));
        nb_status st = nb_optim_update_eager(opt, grads, state, params, &updates, &ns);
        if (st != NB_OK) {
            fail_msg("%s: update failed: %s: %s", name, nb_status_name(st), nb_ctx_errmsg(ctx));
        }
        expect_same_signature(ctx, state0, ns, "the state", name);
        expect_same_signature(ctx, grads, updates, "the updates' structure", name);
        NBT_OK(ctx, nb_apply_updates_eager(params, updates, &np));
        expect_same_signature(ctx, params, np, "the parameters", name);
        /* frozen and integer leaves are untouched */
        bool eq = false;
        NBT_OK(ctx, nb_tree_equal(nb_tree_get(params, "step"), nb_tree_get(np, "step"), &eq));
        assert_true(eq);
        const nb_tree *fw = NULL, *fw2 = NULL;
        NBT_OK(ctx, nb_tree_lookup(params, "layers[1].weight", &fw));
        NBT_OK(ctx, nb_tree_lookup(np, "layers[1].weight", &fw2));
        NBT_OK(ctx, nb_tree_equal(fw, fw2, &eq));
        assert_true(eq);
        nb_tree_destroy(grads);
        nb_tree_destroy(updates);
        nb_tree_destroy(state);
        nb_tree_destroy(params);
        state = ns;
        params = np;
    }
    int64_t count = -1;
    NBT_OK(ctx, nb_optim_count(state, &count));
    NBT_EQ_I64(count, 3);
    nb_tree_destroy(state0);
    nb_tree_destroy(state);
    nb_tree_destroy(tmpl);
    nb_tree_destroy(params);
}

static void test_structure_invariance(void **unused) {
    (void)unused;
    nb_ctx *ctx = NULL;
    assert_int_equal(nb_ctx_create(NULL, &ctx), NB_OK);
    nb_optim_opts o;
    nb_tree *opts[32] = {0};
    const char *names[32];
    int n = 0;
#define ADD(name_, expr_)                                                                          \
    do {                                                                                           \
        names[n] = name_;                                                                          \
        NBT_OK(ctx, expr_);                                                                        \
        n++;                                                                                       \
    } while (0)
    ADD("sgd", nb_optim_sgd(ctx, 0.1, NULL, &opts[n]));
    o = nb_optim_opts_default();
    o.momentum = 0.9;
    o.nesterov = true;
    ADD("sgd nesterov", nb_optim_sgd(ctx, 0.1, &o, &opts[n]));
    ADD("adam", nb_optim_adam(ctx, 0.1, NULL, &opts[n]));
    o = nb_optim_opts_default();
    o.nesterov = true;
    ADD("adam nesterov", nb_optim_adam(ctx, 0.1, &o, &opts[n]));
    ADD("adamw", nb_optim_adamw(ctx, 0.1, NULL, &opts[n]));
    ADD("rmsprop", nb_optim_rmsprop(ctx, 0.1, NULL, &opts[n]));
    o = nb_optim_opts_default();
    o.centered = true;
    o.momentum = 0.5;
    o.bias_correction = true;
    ADD("rmsprop centered momentum", nb_optim_rmsprop(ctx, 0.1, &o, &opts[n]));
    ADD("adagrad", nb_optim_adagrad(ctx, 0.1, NULL, &opts[n]));
    ADD("lion", nb_optim_lion(ctx, 0.1, NULL, &opts[n]));
    ADD("lamb", nb_optim_lamb(ctx, 0.1, NULL, &opts[n]));
    ADD("clip", nb_optim_clip(ctx, 0.3, &opts[n]));
    ADD("clip_by_global_norm", nb_optim_clip_by_global_norm(ctx, 0.3, &opts[n]));
    ADD("add_decayed_weights", nb_optim_add_decayed_weights(ctx, 0.1, NULL, &opts[n]));
    nb_tree *sched = NULL;
    NBT_OK(ctx, nb_schedule_warmup_cosine_decay(ctx, 0.0, 0.1, 2, 10, 0.001, 1.0, &sched));
    ADD("scale_by_schedule", nb_optim_scale_by_schedule(ctx, sched, &opts[n]));
    o = nb_optim_opts_default();
    o.schedule = sched;
    ADD("adam with a schedule", nb_optim_adam(ctx, 0.0, &o, &opts[n]));
    /* masked: adam on layer 0 only */
    nb_tree *t = NULL, *f = NULL, *mask = NULL, *layers_mask = NULL;
    NBT_OK(ctx, nb_tree_bool(ctx, true, &t));
    NBT_OK(ctx, nb_tree_bool(ctx, false, &f));
    NBT_OK(ctx, nb_tree_list(ctx, 2, (nb_tree *[]){t, f}, &layers_mask));
    NBT_OK(ctx, nb_tree_dict(ctx, 4, (const char *[]){"layers", "step", "act", "extra"},
                             (nb_tree *[]){layers_mask, f, f, f}, &mask));
    ADD("masked adam", nb_optim_masked(opts[2], mask, &opts[n]));
    o = nb_optim_opts_default();
    o.mask = mask;
    ADD("adamw with a mask", nb_optim_adamw(ctx, 0.1, &o, &opts[n]));
    const nb_tree *parts[4] = {opts[11], opts[n - 2], opts[12], opts[0]};
    ADD("chain(clip_by_global_norm, masked adam, add_decayed_weights, sgd)",
        nb_optim_chain(ctx, 4, parts, &opts[n]));
#undef ADD
    for (int i = 0; i < n; i++) {
        check_invariance(ctx, opts[i], NB_DTYPE_F32, names[i]);
        check_invariance(ctx, opts[i], NB_DTYPE_F64, names[i]);
        nb_tree_destroy(opts[i]);
    }
    nb_tree_destroy(t);
    nb_tree_destroy(f);
    nb_tree_destroy(layers_mask);
    nb_tree_destroy(mask);
    nb_tree_destroy(sched);
    nb_ctx_destroy(ctx);
}

/* ---- the seeds' failure 5 -------------------------------------------------------------- */

static nb_fn *model_grad_fn;

/* loss(params, x, t) = mean((tanh(x w0 + b0) w1 + b1 - t)^2) */
static nb_status model_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[1]"), *t = nb_get(tr, args, "[2]");
    nb_var *h = nb_tanh(nb_add(nb_matmul(x, nb_get(tr, args, "[0].layers[0].weight")),
                               nb_get(tr, args, "[0].layers[0].bias")));
    nb_var *y = nb_add(nb_matmul(h, nb_get(tr, args, "[0].layers[1].weight")),
                       nb_get(tr, args, "[0].layers[1].bias"));
    return nb_return(nb_mean(nb_square(nb_sub(y, t)), NULL, 0, false), out);
}

/* self = optimizer; args = (params, state, x, t) -> (params, state, loss) */
static nb_status model_step(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    const nb_tree *params = nb_tree_child(args, 0), *state = nb_tree_child(args, 1);
    nb_tree *gargs = NULL;
    nb_status st = nb_tree_tuple(ctx, 3,
                                 (nb_tree *[]){(nb_tree *)params, (nb_tree *)nb_tree_child(args, 2),
                                               (nb_tree *)nb_tree_child(args, 3)},
                                 &gargs);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *vg = nb_apply(tr, model_grad_fn, gargs);
    nb_tree_destroy(gargs);
    if (vg == NULL) {
        return nb_trace_status(tr);
    }
    const nb_tree *updates = NULL, *new_state = NULL;
    st = nb_optim_update(tr, self, nb_tree_child(vg, 1), state, params, &updates, &new_state);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *np = nb_apply_updates(tr, params, updates);
    if (np == NULL) {
        return nb_trace_status(tr);
    }
    return nb_tree_tuple(
        ctx, 3, (nb_tree *[]){(nb_tree *)np, (nb_tree *)new_state, (nb_tree *)nb_tree_child(vg, 0)},
        out);
}

typedef struct model_data {
    nb_tree *x, *t;
} model_data;

static model_data model_data_make(nb_ctx *ctx, nb_dtype dt) {
    nb_array *x = NULL, *t = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){4, 3}, &x));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){4, 1}, &t));
    for (int i = 0; i < 12; i++) {
        ((double *)nb_array_data(x))[i] = cos(0.9 * i);
    }
    for (int i = 0; i < 4; i++) {
        ((double *)nb_array_data(t))[i] = 0.3 * i - 0.4;
    }
    nb_array *xc = NULL, *tc = NULL;
    NBT_OK(ctx, nb_array_cast(x, dt, &xc));
    NBT_OK(ctx, nb_array_cast(t, dt, &tc));
    nb_array_destroy(x);
    nb_array_destroy(t);
    return (model_data){leaf_of(xc), leaf_of(tc)};
}

static void model_setup(nb_ctx *ctx) {
    nb_fn *loss = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "model_loss", model_loss, NULL, &loss));
    NBT_OK(ctx, nb_value_and_grad(loss, NULL, &model_grad_fn));
    nb_fn_destroy(loss);
}

/* Run n steps of fn from (params, state); returns the last loss; params and state are
 * replaced. With check, the state's signature must equal state0's after every step. */
static double run_steps(nb_ctx *ctx, nb_fn *fn, nb_tree **params, nb_tree **state, model_data d,
                        int n, const nb_tree *state0) {
    double loss = NAN;
    for (int s = 0; s < n; s++) {
        nb_tree *args = NULL, *res = NULL;
        NBT_OK(ctx, nb_tree_tuple(ctx, 4, (nb_tree *[]){*params, *state, d.x, d.t}, &args));
        NBT_OK(ctx, nb_fn_call(fn, args, &res));
        nb_tree_destroy(args);
        nb_tree_destroy(*params);
        nb_tree_destroy(*state);
        *params = nb_tree_retain((nb_tree *)nb_tree_child(res, 0));
        *state = nb_tree_retain((nb_tree *)nb_tree_child(res, 1));
        nb_array *l = NULL;
        NBT_OK(ctx, nb_array_cast(nb_tree_get_array(nb_tree_child(res, 2)), NB_DTYPE_F64, &l));
        loss = *(const double *)nb_array_data(l);
        nb_array_destroy(l);
        nb_tree_destroy(res);
        if (state0 != NULL) {
            expect_same_signature(ctx, state0, *state, "the state", "failure 5 step");
        }
    }
    return loss;
}

/* A float array leaf as a new unfrozen zero array of its dtype and shape; null for every
 * other leaf: the template of the parameters with every float array trainable. */
static nb_status thaw_cb(void *ud, const char *path, int n, const nb_tree *const *l,
                         nb_tree **out) {
    (void)ud;
    (void)path;
    (void)n;
    const nb_array *a = nb_tree_get_array(l[0]);
    if (a == NULL || !nb_dtype_is_float(nb_array_dtype(a))) {
        return nb_tree_null(nb_tree_ctx(l[0]), out);
    }
    nb_array *z = NULL;
    nb_status st = nb_array_zeros(nb_tree_ctx(l[0]), nb_array_dtype(a), nb_array_rank(a),
                                  nb_array_shape(a), &z);
    if (st == NB_OK) {
        st = nb_tree_array(z, out);
    }
    nb_array_destroy(z);
    return st;
}

static void test_failure5(void **unused) {
    (void)unused;
    nb_ctx *ctx = NULL;
    assert_int_equal(nb_ctx_create(NULL, &ctx), NB_OK);
    model_setup(ctx);
    model_data d = model_data_make(ctx, NB_DTYPE_F32);
    nb_tree *opt = NULL;
    NBT_OK(ctx, nb_optim_adam(ctx, 0.05, NULL, &opt));
    nb_fn *f = NULL, *jf = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "train_step", model_step, opt, &f));
    nb_jit_opts jo = nb_jit_opts_default();
    jo.max_traces = 1;
    NBT_OK(ctx, nb_jit(f, &jo, &jf));

    nb_tree *params = model_params(ctx, NB_DTYPE_F32), *tmpl = NULL, *state = NULL;
    nb_tree *params0 = nb_tree_retain(params);
    NBT_OK(ctx, nb_grad_template(params, NULL, &tmpl));
    NBT_OK(ctx, nb_optim_init(opt, tmpl, &state));
    nb_tree *state0 = nb_tree_retain(state);
    double first = run_steps(ctx, jf, &params, &state, d, 1, state0);
    double last = run_steps(ctx, jf, &params, &state, d, 99, state0);
    assert_true(last < 0.5 * first); /* it trained */
    nb_fn_stats stats;
    NBT_OK(ctx, nb_fn_stats_get(jf, &stats));
    NBT_EQ_I64(stats.n_traces, 1);
    NBT_EQ_I64(stats.n_hits, 99);
    int64_t count = 0;
    NBT_OK(ctx, nb_optim_count(state, &count));
    NBT_EQ_I64(count, 100);
    /* the parameters keep their structure (frozen mark included); frozen and integer
     * leaves never move */
    expect_same_signature(ctx, params0, params, "the parameters", "failure 5");
    const nb_tree *a = NULL, *b = NULL;
    bool eq = false;
    NBT_OK(ctx, nb_tree_lookup(params0, "layers[1].weight", &a));
    NBT_OK(ctx, nb_tree_lookup(params, "layers[1].weight", &b));
    assert_true(nb_tree_is_frozen(b));
    NBT_OK(ctx, nb_tree_equal(a, b, &eq));
    assert_true(eq);
    NBT_OK(ctx, nb_tree_equal(nb_tree_get(params0, "step"), nb_tree_get(params, "step"), &eq));
    assert_true(eq);

    /* The state built from the parameters instead of the gradient template is refused by
     * nb_optim_init itself (test_init_rejects_params). A state whose float leaves differ
     * from the gradients' (one made for another filter spec, here with the frozen weight
     * thawed) passes init, and the first update names the first mismatching path and the
     * fix -- first in a fresh function, then eagerly. */
    nb_tree *bad = NULL, *thawed = NULL;
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_optim_init(opt, params, &bad));
    assert_null(bad);
    NBT_OK(ctx, nb_tree_map(params, thaw_cb, NULL, NB_TREE_MAP_STATIC, &thawed));
    NBT_OK(ctx, nb_optim_init(opt, thawed, &bad));
    nb_tree_destroy(thawed);
    nb_fn *f2 = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "train_step", model_step, opt, &f2));
    nb_tree *args = NULL, *res = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 4, (nb_tree *[]){params, bad, d.x, d.t}, &args));
    nb_ctx_clear_cache(ctx);
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_fn_call(f2, args, &res));
    printf("state from the parameters: %s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, "nb_optim_update (adam)");
    NBT_ERRMSG_HAS(ctx, "state.mu differ at layers[1].weight: null vs f32[2,1]");
    NBT_ERRMSG_HAS(ctx, "nb_grad_template");
    assert_null(res);
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_optim_update_eager(opt, tmpl, bad, params, &res, &res));
    NBT_ERRMSG_HAS(ctx, "layers[1].weight");
    nb_tree_destroy(args);
    nb_fn_destroy(f2);

    nb_tree_destroy(bad);
    nb_tree_destroy(state0);
    nb_tree_destroy(state);
    nb_tree_destroy(tmpl);
    nb_tree_destroy(params);
    nb_tree_destroy(params0);
    nb_fn_destroy(jf);
    nb_fn_destroy(f);
    nb_tree_destroy(opt);
    nb_tree_destroy(d.x);
    nb_tree_destroy(d.t);
    nb_fn_destroy(model_grad_fn);
    model_grad_fn = NULL;
    nb_ctx_destroy(ctx);
}

/* Re-creating an optimizer with equal settings, or with another learning rate, and changing
 * the learning rate in the state between steps: one trace in all. */
static void test_no_retrace(void **unused) {
    (void)unused;
    nb_ctx *ctx = NULL;
    assert_int_equal(nb_ctx_create(NULL, &ctx), NB_OK);
    model_setup(ctx);
    model_data d = model_data_make(ctx, NB_DTYPE_F64);
    nb_tree *params = model_params(ctx, NB_DTYPE_F64), *tmpl = NULL, *state = NULL;
    NBT_OK(ctx, nb_grad_template(params, NULL, &tmpl));
    nb_jit_opts jo = nb_jit_opts_default();
    jo.max_traces = 1;
    const double lrs[3] = {0.01, 0.01, 0.2};
    for (int k = 0; k < 3; k++) {
        nb_tree *opt = NULL;
        NBT_OK(ctx, nb_optim_adam(ctx, lrs[k], NULL, &opt));
        if (state == NULL) {
            NBT_OK(ctx, nb_optim_init(opt, tmpl, &state));
        }
        nb_fn *f = NULL, *jf = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "train_step", model_step, opt, &f));
        NBT_OK(ctx, nb_jit(f, &jo, &jf));
        run_steps(ctx, jf, &params, &state, d, 3, NULL);
        nb_fn_stats stats;
        NBT_OK(ctx, nb_fn_stats_get(jf, &stats));
        NBT_EQ_I64(stats.n_traces, 1); /* counted per cache identity: all three share it */
        NBT_EQ_I64(stats.n_calls, 3 * (k + 1));
        if (k == 2) {
            /* the learning rate comes from the state: 0 stops training, without a retrace */
            double lr = 0.0;
            NBT_OK(ctx, nb_optim_get_hyper(state, "learning_rate", &lr));
            NBT_EQ_F64(lr, 0.01);
            NBT_OK(ctx, nb_optim_set_hyper(state, "learning_rate", 0.0));
            nb_tree *before = nb_tree_retain(params);
            run_steps(ctx, jf, &params, &state, d, 2, NULL);
            bool eq = false;
            NBT_OK(ctx, nb_tree_equal(before, params, &eq));
            assert_true(eq);
            NBT_OK(ctx, nb_optim_set_hyper(state, "learning_rate", 0.05));
            run_steps(ctx, jf, &params, &state, d, 1, NULL);
            NBT_OK(ctx, nb_tree_equal(before, params, &eq));
            assert_false(eq);
            nb_tree_destroy(before);
            NBT_OK(ctx, nb_fn_stats_get(jf, &stats));
            NBT_EQ_I64(stats.n_traces, 1);
            NBT_STATUS(ctx, NB_ERR_NOT_FOUND, nb_optim_set_hyper(state, "momentum", 0.5));
            NBT_ERRMSG_HAS(ctx, "no hyperparameter 'momentum'");
        }
        nb_fn_destroy(jf);
        nb_fn_destroy(f);
        nb_tree_destroy(opt);
    }
    nb_tree_destroy(state);
    nb_tree_destroy(tmpl);
    nb_tree_destroy(params);
    nb_tree_destroy(d.x);
    nb_tree_destroy(d.t);
    nb_fn_destroy(model_grad_fn);
    model_grad_fn = NULL;
    nb_ctx_destroy(ctx);
}

/* init inside a trace: init + one update in one jitted function equals the eager path */
static nb_status init_update_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                  nb_tree **out) {
    const nb_tree *params = nb_tree_child(args, 0), *grads = nb_tree_child(args, 1);
    const nb_tree *state = nb_optim_init_in(tr, self, grads);
    if (state == NULL) {
        return nb_trace_status(tr);
    }
    const nb_tree *up = NULL, *ns = NULL;
    nb_status st = nb_optim_update(tr, self, grads, state, params, &up, &ns);
    if (st != NB_OK) {
        return st;
    }
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){(nb_tree *)up, (nb_tree *)ns}, out);
}

static void test_init_in_trace(void **unused) {
    (void)unused;
    nb_ctx *ctx = NULL;
    assert_int_equal(nb_ctx_create(NULL, &ctx), NB_OK);
    nb_tree *params = model_params(ctx, NB_DTYPE_F32), *tmpl = NULL, *grads = NULL;
    NBT_OK(ctx, nb_grad_template(params, NULL, &tmpl));
    NBT_OK(ctx, nb_tree_map(tmpl, fill_cb, &(int){3}, 0, &grads));
    nb_tree *opt = NULL, *state = NULL, *up = NULL, *ns = NULL, *args = NULL, *res = NULL;
    nb_optim_opts o = nb_optim_opts_default();
    o.centered = true;
    o.momentum = 0.5;
    NBT_OK(ctx, nb_optim_rmsprop(ctx, 0.1, &o, &opt));
    NBT_OK(ctx, nb_optim_init(opt, tmpl, &state));
    NBT_OK(ctx, nb_optim_update_eager(opt, grads, state, params, &up, &ns));
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){params, grads}, &args));
    NBT_OK(ctx, nb_eval(ctx, init_update_body, opt, args, &res));
    bool eq = false;
    NBT_OK(ctx, nb_tree_equal(nb_tree_child(res, 0), up, &eq));
    assert_true(eq);
    NBT_OK(ctx, nb_tree_equal(nb_tree_child(res, 1), ns, &eq));
    assert_true(eq);
    nb_tree *ts[] = {params, tmpl, grads, opt, state, up, ns, args, res};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        nb_tree_destroy(ts[i]);
    }
    nb_ctx_destroy(ctx);
}

/* ---- init from the parameters instead of the gradient template ------------------------- */

/* dict {w: f32[3], <key>: other} (other is taken). */
static nb_tree *with_w(nb_ctx *ctx, const char *key, nb_tree *other) {
    nb_array *w = NULL;
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 1, (int64_t[]){3}, 0.5, &w));
    return dict2(ctx, "w", leaf_of(w), key, other);
}

static nb_status init_in_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    const nb_tree *state = nb_optim_init_in(tr, self, nb_tree_child(args, 0));
    if (state == NULL) {
        return nb_trace_status(tr);
    }
    return nb_tree_tuple(nb_trace_ctx(tr), 1, (nb_tree *[]){(nb_tree *)state}, out);
}

/* A tree with a non-null leaf where the gradient template has null (a frozen, integer, bool
 * or static leaf: the parameters given instead of the template) is refused by init itself,
 * naming the first such path, what is there and the fix; trees of float arrays and nulls
 * (a template, or parameters that are all trainable) are accepted. */
static void test_init_rejects_params(void **unused) {
    (void)unused;
    nb_ctx *ctx = NULL;
    assert_int_equal(nb_ctx_create(NULL, &ctx), NB_OK);
    nb_tree *adam = NULL, *sgd = NULL, *chain = NULL, *masked = NULL, *t = NULL;
    NBT_OK(ctx, nb_optim_adam(ctx, 0.1, NULL, &adam));
    NBT_OK(ctx, nb_optim_sgd(ctx, 0.1, NULL, &sgd)); /* no moments: nothing would catch it later */
    NBT_OK(ctx, nb_optim_chain(ctx, 2, (const nb_tree *const[]){sgd, adam}, &chain));
    NBT_OK(ctx, nb_tree_bool(ctx, true, &t));
    NBT_OK(ctx, nb_optim_masked(adam, t, &masked));
    const nb_tree *opts[] = {adam, sgd, chain, masked};

    nb_array *i3 = NULL, *b2 = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I32, 1, (int64_t[]){3}, &i3));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_BOOL, 1, (int64_t[]){2}, &b2));
    nb_tree *k3 = NULL, *name = NULL;
    NBT_OK(ctx, nb_tree_int(ctx, 3, &k3));
    NBT_OK(ctx, nb_tree_string(ctx, "tanh", &name));
    struct {
        nb_tree *tree;
        const char *path, *what;
    } bad[] = {
        {model_params(ctx, NB_DTYPE_F32), "at layers[1].weight", "frozen f32[2,1]"},
        {with_w(ctx, "n", leaf_of(i3)), "at n", "i32[3]"},
        {with_w(ctx, "mask", leaf_of(b2)), "at mask", "bool[2]"},
        {with_w(ctx, "k", k3), "at k", "static int 3"},
        {with_w(ctx, "act", name), "at act", "static string \"tanh\""},
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        for (size_t o = 0; o < sizeof opts / sizeof opts[0]; o++) {
            nb_tree *state = (nb_tree *)&state;
            NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_optim_init(opts[o], bad[c].tree, &state));
            assert_null(state);
            NBT_ERRMSG_HAS(ctx, "nb_optim_init: ");
            NBT_ERRMSG_HAS(ctx, bad[c].path);
            NBT_ERRMSG_HAS(ctx, bad[c].what);
            NBT_ERRMSG_HAS(ctx, "build the state from nb_grad_template(params, filter_spec)");
            if (c == 0 && o == 0) {
                printf("init from the parameters: %s\n", nb_ctx_errmsg(ctx));
            }
        }
        /* the same inside a trace */
        nb_tree *args = NULL, *res = NULL;
        NBT_OK(ctx, nb_tree_tuple(ctx, 1, &bad[c].tree, &args));
        NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_eval(ctx, init_in_body, adam, args, &res));
        NBT_ERRMSG_HAS(ctx, "nb_optim_init_in: ");
        NBT_ERRMSG_HAS(ctx, "nb_grad_template(params, filter_spec)");
        assert_null(res);
        nb_tree_destroy(args);
        /* its gradient template is fine */
        nb_tree *tmpl = NULL, *state = NULL;
        NBT_OK(ctx, nb_grad_template(bad[c].tree, NULL, &tmpl));
        NBT_OK(ctx, nb_optim_init(chain, tmpl, &state));
        nb_tree_destroy(state);
        nb_tree_destroy(tmpl);
        nb_tree_destroy(bad[c].tree);
    }

    /* all-float parameters (with a null slot) are their own template: accepted, the same
     * state */
    nb_tree *none = NULL, *params = NULL, *tmpl = NULL;
    NBT_OK(ctx, nb_tree_null(ctx, &none));
    params = with_w(ctx, "extra", none);
    NBT_OK(ctx, nb_grad_template(params, NULL, &tmpl));
    for (size_t o = 0; o < sizeof opts / sizeof opts[0]; o++) {
        nb_tree *s1 = NULL, *s2 = NULL;
        NBT_OK(ctx, nb_optim_init(opts[o], params, &s1));
        NBT_OK(ctx, nb_optim_init(opts[o], tmpl, &s2));
        bool eq = false;
        NBT_OK(ctx, nb_tree_equal(s1, s2, &eq));
        assert_true(eq);
        nb_tree_destroy(s1);
        nb_tree_destroy(s2);
        nb_tree *args = NULL, *res = NULL;
        NBT_OK(ctx, nb_tree_tuple(ctx, 1, &params, &args));
        NBT_OK(ctx, nb_eval(ctx, init_in_body, opts[o], args, &res));
        nb_tree_destroy(res);
        nb_tree_destroy(args);
    }
    nb_tree *ts[] = {params, tmpl, adam, sgd, chain, masked, t};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        nb_tree_destroy(ts[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- nb_optim_set_hyper: the constructors' checks ---------------------------------------- */

typedef enum {
    OPT_SGD,
    OPT_ADAM,
    OPT_ADAMW,
    OPT_LAMB,
    OPT_RMSPROP,
    OPT_ADAGRAD,
    OPT_LION,
    OPT_CLIP,
    OPT_CLIP_GN,
    OPT_ADW
} opt_kind;

/* The optimizer kind with every setting valid, except name = value (name "" for none).
 * Momentum is on (0.5) for sgd and rmsprop so that their states have it. */
static nb_status make_opt(nb_ctx *ctx, opt_kind k, const char *name, double value, nb_tree **out) {
    nb_optim_opts o = nb_optim_opts_default();
    double lr = 0.1;
    double *field = NULL;
    if (k == OPT_SGD || k == OPT_RMSPROP) {
        o.momentum = 0.5;
    }
    if (strcmp(name, "learning_rate") == 0) {
        field = &lr;
    } else if (strcmp(name, "momentum") == 0) {
        field = &o.momentum;
    } else if (strcmp(name, "b1") == 0) {
        field = &o.b1;
    } else if (strcmp(name, "b2") == 0) {
        field = &o.b2;
    } else if (strcmp(name, "eps") == 0) {
        field = &o.eps;
    } else if (strcmp(name, "eps_root") == 0) {
        field = &o.eps_root;
    } else if (strcmp(name, "weight_decay") == 0) {
        field = &o.weight_decay;
    } else if (strcmp(name, "decay") == 0) {
        field = &o.decay;
    }
    double arg = 0.3; /* clip, clip_by_global_norm, add_decayed_weights */
    if (k >= OPT_CLIP && name[0] != '\0') {
        field = &arg;
    }
    if (field != NULL) {
        *field = value;
    }
    switch (k) {
    case OPT_SGD:
        return nb_optim_sgd(ctx, lr, &o, out);
    case OPT_ADAM:
        return nb_optim_adam(ctx, lr, &o, out);
    case OPT_ADAMW:
        return nb_optim_adamw(ctx, lr, &o, out);
    case OPT_LAMB:
        return nb_optim_lamb(ctx, lr, &o, out);
    case OPT_RMSPROP:
        return nb_optim_rmsprop(ctx, lr, &o, out);
    case OPT_ADAGRAD:
        return nb_optim_adagrad(ctx, lr, &o, out);
    case OPT_LION:
        return nb_optim_lion(ctx, lr, &o, out);
    case OPT_CLIP:
        return nb_optim_clip(ctx, arg, out);
    case OPT_CLIP_GN:
        return nb_optim_clip_by_global_norm(ctx, arg, out);
    case OPT_ADW:
        return nb_optim_add_decayed_weights(ctx, arg, NULL, out);
    }
    return NB_ERR_INVALID;
}

static nb_status copy_cb(void *ud, const char *path, int n, const nb_tree *const *l,
                         nb_tree **out) {
    (void)ud;
    (void)path;
    (void)n;
    nb_array *a = NULL;
    nb_status st = nb_array_copy(nb_tree_get_array(l[0]), &a);
    if (st == NB_OK) {
        st = nb_tree_array(a, out);
    }
    nb_array_destroy(a);
    return st;
}

/* The message without its leading function name ("nb_optim_adam: b1 = ..." -> "b1 = ..."). */
static const char *msg_body(const char *m) {
    const char *c = strstr(m, ": ");
    return c != NULL ? c + 2 : m;
}

/* For every hyperparameter of every optimizer: a value its constructor refuses is refused
 * by nb_optim_set_hyper with the same status and message, and leaves the state as it was
 * (in a chain too: all parts are checked before any is written); a value the constructor
 * accepts is accepted. */
static void test_set_hyper_checks(void **unused) {
    (void)unused;
    nb_ctx *ctx = NULL;
    assert_int_equal(nb_ctx_create(NULL, &ctx), NB_OK);
    const struct {
        opt_kind k;
        const char *name;
    } hp[] = {
        {OPT_SGD, "learning_rate"},
        {OPT_SGD, "momentum"},
        {OPT_ADAM, "learning_rate"},
        {OPT_ADAM, "b1"},
        {OPT_ADAM, "b2"},
        {OPT_ADAM, "eps"},
        {OPT_ADAM, "eps_root"},
        {OPT_ADAMW, "learning_rate"},
        {OPT_ADAMW, "b1"},
        {OPT_ADAMW, "b2"},
        {OPT_ADAMW, "eps"},
        {OPT_ADAMW, "eps_root"},
        {OPT_ADAMW, "weight_decay"},
        {OPT_LAMB, "learning_rate"},
        {OPT_LAMB, "b1"},
        {OPT_LAMB, "b2"},
        {OPT_LAMB, "eps"},
        {OPT_LAMB, "eps_root"},
        {OPT_LAMB, "weight_decay"},
        {OPT_RMSPROP, "learning_rate"},
        {OPT_RMSPROP, "decay"},
        {OPT_RMSPROP, "eps"},
        {OPT_RMSPROP, "momentum"},
        {OPT_ADAGRAD, "learning_rate"},
        {OPT_ADAGRAD, "eps"},
        {OPT_LION, "learning_rate"},
        {OPT_LION, "b1"},
        {OPT_LION, "b2"},
        {OPT_LION, "weight_decay"},
        {OPT_CLIP, "max_delta"},
        {OPT_CLIP_GN, "max_norm"},
        {OPT_ADW, "weight_decay"},
    };
    const double values[] = {-0.1, -1.0, 0.0, 0.5, 1.0, 1.5, 2.0, 1e-9, NAN, INFINITY, -INFINITY};
    nb_array *w = NULL;
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 1, (int64_t[]){3}, 0.5, &w));
    nb_tree *none = NULL, *tmpl = NULL;
    NBT_OK(ctx, nb_tree_null(ctx, &none));
    nb_tree *params = dict2(ctx, "w", leaf_of(w), "b", none);
    NBT_OK(ctx, nb_grad_template(params, NULL, &tmpl));
    int refused = 0;
    for (size_t h = 0; h < sizeof hp / sizeof hp[0]; h++) {
        nb_tree *opt = NULL, *state = NULL, *lion = NULL, *chain = NULL, *cstate = NULL;
        NBT_OK(ctx, make_opt(ctx, hp[h].k, "", 0.0, &opt));
        NBT_OK(ctx, nb_optim_init(opt, tmpl, &state));
        /* a chain with a lion after it: lion accepts b1 = 1 where adam does not */
        NBT_OK(ctx, make_opt(ctx, OPT_LION, "", 0.0, &lion));
        NBT_OK(ctx, nb_optim_chain(ctx, 2, (const nb_tree *const[]){lion, opt}, &chain));
        NBT_OK(ctx, nb_optim_init(chain, tmpl, &cstate));
        for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
            char want[512];
            nb_tree *o2 = NULL;
            nb_status ws = make_opt(ctx, hp[h].k, hp[h].name, values[v], &o2);
            snprintf(want, sizeof want, "%s", msg_body(nb_ctx_errmsg(ctx)));
            nb_tree_destroy(o2);
            size_t cmp = sizeof want; /* the whole message */
            if (isnan(values[v]) && hp[h].k < OPT_CLIP && strcmp(hp[h].name, "learning_rate")) {
                /* NAN in nb_optim_opts means "the default": set_hyper refuses it */
                ws = NB_ERR_INVALID;
                snprintf(want, sizeof want, "%s = nan must be in [", hp[h].name);
                cmp = strlen(want);
            }
            nb_tree *copy = NULL, *ccopy = NULL;
            NBT_OK(ctx, nb_tree_map(state, copy_cb, NULL, 0, &copy));
            NBT_OK(ctx, nb_tree_map(cstate, copy_cb, NULL, 0, &ccopy));
            double before = 0.0;
            NBT_OK(ctx, nb_optim_get_hyper(state, hp[h].name, &before));
            nb_status got = nb_optim_set_hyper(state, hp[h].name, values[v]);
            if (got != ws) {
                fail_msg("%s of optimizer %d = %g: the constructor gives %s, set_hyper %s (%s)",
                         hp[h].name, (int)hp[h].k, values[v], nb_status_name(ws),
                         nb_status_name(got), nb_ctx_errmsg(ctx));
            }
            double after = 0.0;
            if (ws != NB_OK) {
                refused++;
                if (strncmp(msg_body(nb_ctx_errmsg(ctx)), want, cmp) != 0) {
                    fail_msg("%s = %g: set_hyper says \"%s\", the constructor \"%s\"", hp[h].name,
                             values[v], nb_ctx_errmsg(ctx), want);
                }
                bool eq = false;
                NBT_OK(ctx, nb_tree_equal(state, copy, &eq));
                assert_true(eq);
                /* in the chain: refused as a whole, the lion part included */
                NBT_STATUS(ctx, ws, nb_optim_set_hyper(cstate, hp[h].name, values[v]));
                NBT_OK(ctx, nb_tree_equal(cstate, ccopy, &eq));
                assert_true(eq);
            } else {
                NBT_OK(ctx, nb_optim_get_hyper(state, hp[h].name, &after));
                NBT_EQ_F64(after, values[v]);
                NBT_OK(ctx, nb_optim_set_hyper(state, hp[h].name, before));
            }
            nb_tree_destroy(copy);
            nb_tree_destroy(ccopy);
        }
        nb_tree *ts[] = {opt, state, lion, chain, cstate};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            nb_tree_destroy(ts[i]);
        }
    }
    printf("set_hyper refused %d settings the constructors refuse\n", refused);
    assert_true(refused > 100);
    nb_tree_destroy(params);
    nb_tree_destroy(tmpl);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- bad input: clear errors ----------------------------------------------------------- */
static void test_errors(void **unused) {
    (void)unused;
    nb_ctx *ctx = NULL;
    assert_int_equal(nb_ctx_create(NULL, &ctx), NB_OK);
    nb_tree *opt = NULL;
    nb_optim_opts o = nb_optim_opts_default();
    o.b1 = 1.0;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_optim_adam(ctx, 0.1, &o, &opt));
    NBT_ERRMSG_HAS(ctx, "nb_optim_adam: b1 = 1 must be in [0, 1)");
    assert_null(opt);
    o = nb_optim_opts_default();
    o.b1 = 0.5;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_optim_sgd(ctx, 0.1, &o, &opt));
    NBT_ERRMSG_HAS(ctx, "option 'b1' is not a setting of this optimizer");
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_optim_sgd(ctx, -0.1, NULL, &opt));
    NBT_ERRMSG_HAS(ctx, "learning_rate = -0.1");
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_optim_sgd(ctx, NAN, NULL, &opt));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_schedule_cosine_decay(ctx, 0.1, 0, 0.0, 1.0, &opt));
    NBT_ERRMSG_HAS(ctx, "decay_steps must be > 0");
    NBT_STATUS(
        ctx, NB_ERR_INVALID,
        nb_schedule_piecewise_constant(ctx, 0.1, 2, (int64_t[]){5, 5}, (double[]){1, 1}, &opt));
    NBT_ERRMSG_HAS(ctx, "strictly increasing");
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_optim_adam(NULL, 0.1, NULL, &opt));
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_optim_init(NULL, NULL, &opt));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_optim_chain(ctx, 0, NULL, &opt));
    {
        nb_tree *one = NULL;
        NBT_OK(ctx, nb_optim_sgd(ctx, 0.1, NULL, &one));
        const nb_tree *many[65];
        for (int i = 0; i < 65; i++) {
            many[i] = one;
        }
        NBT_STATUS(ctx, NB_ERR_INVALID, nb_optim_chain(ctx, 65, many, &opt));
        NBT_ERRMSG_HAS(ctx, "at most 64");
        nb_tree_destroy(one);
    }

    /* grads that do not fit */
    nb_tree *params = model_params(ctx, NB_DTYPE_F32), *tmpl = NULL, *state = NULL;
    NBT_OK(ctx, nb_grad_template(params, NULL, &tmpl));
    NBT_OK(ctx, nb_optim_adam(ctx, 0.1, NULL, &opt));
    NBT_OK(ctx, nb_optim_init(opt, tmpl, &state));
    nb_tree *p64 = model_params(ctx, NB_DTYPE_F64), *t64 = NULL, *up = NULL, *ns = NULL;
    NBT_OK(ctx, nb_grad_template(p64, NULL, &t64));
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_optim_update_eager(opt, t64, state, p64, &up, &ns));
    NBT_ERRMSG_HAS(ctx, "grads and state.mu differ at layers[0].weight: f64[3,2] vs f32[3,2]");
    assert_null(up);
    assert_null(ns);
    /* a state that is not this optimizer's */
    nb_tree *sgd = NULL;
    NBT_OK(ctx, nb_optim_sgd(ctx, 0.1, NULL, &sgd));
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_optim_update_eager(opt, tmpl, tmpl, params, &up, &ns));
    NBT_ERRMSG_HAS(ctx, "is not the state of this optimizer");
    /* weight decay without params */
    nb_tree *adamw = NULL, *sw = NULL;
    NBT_OK(ctx, nb_optim_adamw(ctx, 0.1, NULL, &adamw));
    NBT_OK(ctx, nb_optim_init(adamw, tmpl, &sw));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_optim_update_eager(adamw, tmpl, sw, NULL, &up, &ns));
    NBT_ERRMSG_HAS(ctx, "weight decay needs the parameters, and params is NULL (at "
                        "layers[0].weight)");
    /* a mask that does not fit */
    nb_tree *t = NULL, *mask = NULL, *masked = NULL, *sm = NULL;
    NBT_OK(ctx, nb_tree_bool(ctx, true, &t));
    NBT_OK(ctx, nb_tree_list(ctx, 1, &t, &mask));
    NBT_OK(ctx, nb_optim_masked(opt, mask, &masked));
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_optim_init(masked, tmpl, &sm));
    NBT_ERRMSG_HAS(ctx, "the mask does not fit the grads at <root>: list of 1 vs dict of 4");
    /* apply_updates with an update of the wrong shape */
    nb_tree *bad = NULL, *np = NULL;
    NBT_OK(ctx, nb_tree_map(t64, fill_cb, &(int){0}, 0, &bad));
    nb_array *w = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){6}, &w));
    nb_tree *wl = leaf_of(w), *b0 = NULL, *l0 = NULL, *layers = NULL, *u2 = NULL;
    NBT_OK(ctx, nb_tree_null(ctx, &b0));
    l0 = dict2(ctx, "weight", wl, "bias", nb_tree_retain(b0));
    nb_tree *l1 = dict2(ctx, "weight", nb_tree_retain(b0), "bias", nb_tree_retain(b0));
    NBT_OK(ctx, nb_tree_list(ctx, 2, (nb_tree *[]){l0, l1}, &layers));
    NBT_OK(ctx, nb_tree_dict(ctx, 4, (const char *[]){"layers", "step", "act", "extra"},
                             (nb_tree *[]){layers, b0, b0, b0}, &u2));
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_apply_updates_eager(params, u2, &np));
    NBT_ERRMSG_HAS(ctx, "the parameter at layers[0].weight is f32[3,2] but its update is f32[6]");
    assert_null(np);
    nb_tree_destroy(l0);
    nb_tree_destroy(l1);
    nb_tree_destroy(layers);
    nb_tree_destroy(u2);
    nb_tree_destroy(b0);
    nb_tree_destroy(bad);
    nb_tree_destroy(t);
    nb_tree_destroy(mask);
    nb_tree_destroy(masked);
    nb_tree_destroy(adamw);
    nb_tree_destroy(sw);
    nb_tree_destroy(sgd);
    nb_tree_destroy(p64);
    nb_tree_destroy(t64);
    nb_tree_destroy(state);
    nb_tree_destroy(tmpl);
    nb_tree_destroy(params);
    nb_tree_destroy(opt);
    nb_ctx_destroy(ctx);
}

/* ---- out of memory: every allocation of a build / init / update / apply scenario -------- */
static nb_status scenario_optim(nb_ctx *ctx) {
    nb_tree *params = NULL, *tmpl = NULL, *state = NULL, *grads = NULL, *updates = NULL;
    nb_tree *ns = NULL, *np = NULL, *parts[3] = {NULL, NULL, NULL}, *opt = NULL, *t = NULL;
    nb_tree *f = NULL, *mask = NULL, *masked = NULL, *sched = NULL;
    nb_array *w = NULL, *b = NULL;
    nb_status st = nb_array_full(ctx, NB_DTYPE_F32, 2, (int64_t[]){3, 2}, 0.5, &w);
    if (st == NB_OK) {
        st = nb_array_full(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, 0.25, &b);
    }
    nb_tree *lw = NULL, *lb = NULL;
    if (st == NB_OK) {
        st = nb_tree_array(w, &lw);
    }
    if (st == NB_OK) {
        st = nb_tree_array(b, &lb);
    }
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 2, (const char *[]){"w", "b"}, (nb_tree *[]){lw, lb}, &params);
    }
    if (st == NB_OK) {
        st = nb_grad_template(params, NULL, &tmpl);
    }
    if (st == NB_OK) {
        st = nb_schedule_cosine_decay(ctx, 0.1, 10, 0.0, 1.0, &sched);
    }
    nb_optim_opts o = nb_optim_opts_default();
    o.schedule = sched;
    if (st == NB_OK) {
        st = nb_optim_clip_by_global_norm(ctx, 1.0, &parts[0]);
    }
    if (st == NB_OK) {
        st = nb_optim_adamw(ctx, 0.0, &o, &parts[1]);
    }
    if (st == NB_OK) {
        st = nb_tree_bool(ctx, true, &t);
    }
    if (st == NB_OK) {
        st = nb_tree_bool(ctx, false, &f);
    }
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 2, (const char *[]){"w", "b"}, (nb_tree *[]){t, f}, &mask);
    }
    if (st == NB_OK) {
        st = nb_optim_masked(parts[1], mask, &masked);
    }
    if (st == NB_OK) {
        st = nb_optim_sgd(ctx, 0.1, NULL, &parts[2]);
    }
    if (st == NB_OK) {
        st = nb_optim_chain(ctx, 3, (const nb_tree *const[]){parts[0], masked, parts[2]}, &opt);
    }
    if (st == NB_OK) {
        st = nb_optim_init(opt, tmpl, &state);
    }
    if (st == NB_OK) {
        st = nb_tree_map(tmpl, fill_cb, &(int){0}, 0, &grads);
    }
    if (st == NB_OK) {
        st = nb_optim_update_eager(opt, grads, state, params, &updates, &ns);
    }
    if (st == NB_OK) {
        st = nb_apply_updates_eager(params, updates, &np);
    }
    double v = 0.0;
    if (st == NB_OK) {
        st = nb_optim_get_hyper(ns, "weight_decay", &v);
    }
    nb_tree *ts[] = {params,   tmpl, state, grads, updates, ns,     np,    parts[0], parts[1],
                     parts[2], opt,  t,     f,     mask,    masked, sched, lw,       lb};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        nb_tree_destroy(ts[i]);
    }
    nb_array_destroy(w);
    nb_array_destroy(b);
    nb_ctx_clear_cache(ctx);
    return st;
}

static void test_out_of_memory(void **state) {
    (void)state;
    int points = nbt_oom_sweep("scenario_optim", scenario_optim, false, false);
    assert_true(points > 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equations),
        cmocka_unit_test(test_oracle_torch),
        cmocka_unit_test(test_oracle_optax),
        cmocka_unit_test(test_oracle_schedules),
        cmocka_unit_test(test_structure_invariance),
        cmocka_unit_test(test_failure5),
        cmocka_unit_test(test_no_retrace),
        cmocka_unit_test(test_init_in_trace),
        cmocka_unit_test(test_init_rejects_params),
        cmocka_unit_test(test_set_hyper_checks),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * bench_problems.c -- the problems of `nabla bench` (bench_problems.h).
 *
 * Eight full-batch losses, from a 2-D test function to a fit through an adaptive ODE solve,
 * and six stochastic ones (minibatches, below the table of targets), each with
 * a fixed setup from the cell's key: the starting point, the train/test split, the
 * initialisation and the observation noise all come from sub-keys of that key
 * (nb_random_fold_in(key, BP_STREAM_*)), so a seed and a problem name say everything.
 * Static settings (sizes, tolerances, the starts' centres) are constants below; what the
 * loss reads at run time is in the data tree. Nothing here is mutable: cells may call
 * these functions on several threads at once, each in its own context.
 *
 * The problems: params (the start); data.
 *   rosenbrock2     dict(x f64[2]), (-1.2, 1) + N(0, 0.1^2); ()
 *   rosenbrock100   dict(x f64[100]), (-1.2, 1, -1.2, 1, ...) + N(0, 0.1^2); ()
 *   quadratic       dict(x f64[50]) ~ N(0, 1); dict(A f64[50,50]): A = Q^T diag(lambda) Q,
 *                   lambda log-spaced 1 .. 1e4, Q three Householder reflections of fixed
 *                   vectors (the same A for every seed)
 *   beale           dict(x f64[2]) = (x, y), (1, 1) + N(0, 0.1^2) (the minimum is (3, 0.5)); ()
 *   logreg          dict(w f32[30], b f32[]) = 0; dict(x_train f32[455,30], y_train i32[455],
 *                   x_test f32[114,30], y_test i32[114]): data/breast_cancer.csv split 80/20,
 *                   standardised with the training rows' statistics
 *   softmax         dict(w f32[13,3], b f32[3]) = 0; the same from data/wine_data.csv
 *                   (142 / 36 rows)
 *   mlp             an nn.h MLP 64-32-10 (relu, f32, Equinox's init); the same from
 *                   data/digits.csv.gz (1438 / 359 rows)
 *   lotka_volterra  dict(a, b, c, d) f64[] each, (1.2, 0.8, 2.5, 0.8) (1 + 0.05 N(0, 1));
 *                   dict(x f64[20], y f64[20]): the solve at (1.5, 1, 3, 1) at t = 0.5 ..
 *                   10 plus N(0, 0.05^2)
 * Losses are full-batch means on the training rows; accuracy() is on the test rows.
 *
 * Targets. "Steps to target" counts to loss <= target. Each target was chosen by running the
 * suite (`nabla bench`, 1000-3000 steps, the default learning-rate grids, seeds 0 and 1)
 * and Adam at a tuned rate (tests/tools/test_bench_problems.c, which prints its steps):
 * near enough to the minimum that reaching it means the problem's hard part is solved, and
 * reached by the best optimizers in tens to a few hundred steps -- except Rosenbrock 100-D,
 * which no optimizer of the grids crosses in under ~1600 steps.
 *   rosenbrock2     1e-3  the curved valley followed to (1, 1): momentum and Nesterov (lr
 *                         1e-3) in ~560-600 steps, Adam (lr 0.1) ~770, Adam (0.2) ~410-620.
 *   rosenbrock100   10    from the start the loss falls in a few dozen steps to a plateau
 *                         of ~99 (the coordinates near 0, one unit of loss each) and then
 *                         coordinates move to 1 one after another: 10 means 90% of them
 *                         there. Momentum (1e-3) ~1650 steps, LAMB (1e-2) ~2100, Adam
 *                         (0.1) ~2930, Adam (0.5) ~1200. (1.0, below the local minimum
 *                         near (-1, 1, ..., 1) at ~3.99, took ~2200 steps with LAMB and
 *                         was not reached by the others in 3000.)
 *   quadratic       1     the start's share of the five smallest eigen-directions (curvature
 *                         1 .. 2.1) is ~3.8 on average, so 1 needs progress where the
 *                         curvature is 1e-4 of the largest: LAMB (0.1) ~440-630 steps,
 *                         momentum (1e-4) ~610-720, Adam (0.1) ~690-950, Adam (0.3) ~160-410.
 *                         (1e-2 took LAMB ~1000 and Adam ~1500-1900 steps.)
 *   beale           1e-3  near (3, 0.5): Nesterov ~26 steps, momentum ~82, Adam ~100.
 *   logreg          0.1   train cross-entropy (the start is log 2 = 0.693; 1000 steps of
 *                         the best give 0.03-0.06, test accuracy ~98%): Adam ~7 steps,
 *                         momentum ~84, SGD ~106.
 *   softmax         0.05  (the start is log 3 = 1.099): Adam ~12 steps, SGD ~290; test
 *                         accuracy ~100% at the end.
 *   mlp             0.1   (the start is ~2.3 = log 10): Adam ~8-32 steps, SGD (0.1) ~310,
 *                         momentum ~320; test accuracy ~95% there, ~97% after 1000 steps.
 *   lotka_volterra  4e-3  the MSE at the true parameters is about sigma^2 = 2.5e-3 (sigma
 *                         0.05 on 40 values: 2.5e-3 chi2_40 / 40, +-0.56e-3 between seeds)
 *                         and the best fit is lower (~1.6-1.8e-3 for seeds 0, 1); 4e-3 =
 *                         1.6 sigma^2 is above the best fit of all but ~0.3% of seeds, and
 *                         means the fit is down to the noise: Adam (0.1) ~90-100 steps,
 *                         momentum (1e-2) ~130-160, LAMB ~100-150.
 * Per step (jitted value_and_grad + Adam, one thread, RelWithDebInfo, this 2-core
 * machine): ~2 us for the 2-D and 100-D functions and the quadratic, ~0.01-0.02 ms for
 * the linear classifiers, ~0.6 ms for the MLP (64-32-10 on 1437 rows), ~3 ms for the ODE
 * fit.
 *
 * Stochastic problems (batch > 0): each step's loss is on a minibatch of the training split
 * (bench_stream: the batcher of nabla/data.h over the rows, keyed by the cell key's stream
 * BENCH_STREAM_BATCH). data = dict(train, valid, test), each split a dict(x[, y]) of rows;
 * the UCI splits are the full-batch classifiers' test rows (20 %) and the rest split 80/20
 * into train and valid by the key's valid stream, standardised with the training rows'
 * statistics. Each data also has train_eval (DeepOBS's): a copy of the first min(n_train,
 * n_test) training rows. The driver logs the loss on train_eval (what the target is
 * checked on, at the logged steps), on valid and on test, and the test accuracy.
 *   logreg_mb          logreg's model; batch 16 of 364 rows (91 valid, 114 test)
 *   mlp_mb             mlp's model; batch 32 of 1150 rows (288 valid, 359 test)
 *   cnn_mb             Conv2d 1->8 3x3 SAME, relu, MaxPool 2 (stride 2), Linear 128->10 on
 *                      the 8x8 digits; batch 32, mlp_mb's rows
 *   char_gru           Embedding(65, 16), GRUCell(16, 64), Linear(64, 65) on windows of 17
 *                      characters of Tiny Shakespeare (1270 / 318 / 397); batch 32
 *   noisy_quadratic    DeepOBS's: 0.5 (theta - x)^T H (theta - x) averaged over N(0, I) rows
 *                      x of 100 (1000 / 250 / 1000), H's eigenvalues fixed; batch 128
 *   lotka_volterra_mb  the LV fit against observation sets each with its own noise (64 / 16
 *                      / 16); batch 4
 * Their targets (the training loss on train_eval; test_bench_problems checks them on the whole
 * training split): logreg_mb 0.1 and mlp_mb, cnn_mb 0.1 as logreg's and mlp's; char_gru 2.0 nats
 * (2.89 bits per character; the text's bigram entropy is 3.54 bits), Adam (1e-2) ~160-180 steps;
 * noisy_quadratic 260 (the start ~518, the minimum ~248 = 0.5 tr H less the sample's spread; Adam's
 * noise floor at lr 0.1 ~255), Adam (0.1) ~50 steps; lotka_volterra_mb 3e-3 (sigma^2 = 2.5e-3),
 * Adam (0.1) ~140 steps. Per step (bench_suite, session 22): ~0.004 ms (logreg_mb), ~0.024 ms
 * (mlp_mb), ~0.1 ms (cnn_mb; 0.17 before session 22's max pool), ~0.047 ms (noisy_quadratic),
 * ~0.1 ms (lotka_volterra_mb), ~1.04 ms (char_gru, session 26: nb_scan over 16 characters).
 */
#include "bench_problems.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sub-key streams of a cell's key. */
enum { BP_STREAM_START = 1, BP_STREAM_SPLIT = 2, BP_STREAM_INIT = 3, BP_STREAM_NOISE = 4 };

#define BP_ROSEN100_N 100
#define BP_QUAD_N 50
#define BP_QUAD_COND 1e4
#define BP_TEST_FRACTION 0.2
#define BP_MLP_WIDTH 32
#define BP_LV_POINTS 20
#define BP_LV_T_END 10.0
#define BP_LV_NOISE 0.05
#define BP_LV_MAX_STEPS 4096
/* The fit's parameters must stay in [BP_LV_LO, BP_LV_HI] (else the loss is +inf): the
 * solve runs at the parameters clamped into that box, where it stays cheap (a forward
 * solve at any corner of the box takes under 3 ms, about what a whole step takes at the
 * start), so a diverging optimizer ends a cell at its first step outside instead of
 * making every step a 4096-step solve. The truth (1.5, 1, 3, 1) is well inside. */
#define BP_LV_LO 0.05
#define BP_LV_HI 8.0

#define BP_ROSEN100_TARGET 10.0
#define BP_QUAD_TARGET 1.0
#define BP_LOGREG_TARGET 0.1
#define BP_SOFTMAX_TARGET 0.05
#define BP_MLP_TARGET 0.1
#define BP_LV_TARGET 4e-3

static const char *const bp_lv_names[4] = {"a", "b", "c", "d"};
static const double bp_lv_truth[4] = {1.5, 1.0, 3.0, 1.0};
static const double bp_lv_start[4] = {1.2, 0.8, 2.5, 0.8};

/* ---- helpers ---------------------------------------------------------------------------- */

/* The common start of every setup: NULL outputs, arguments checked. */
static nb_status bp_begin(nb_ctx *ctx, const nb_array *key, nb_tree **params, nb_tree **data) {
    if (params != NULL) {
        *params = NULL;
    }
    if (data != NULL) {
        *data = NULL;
    }
    if (ctx == NULL) {
        return NB_ERR_MISUSE;
    }
    if (params == NULL || data == NULL || key == NULL) {
        return nb_tree_map_fail(ctx, NB_ERR_MISUSE,
                                "bench setup: key, params and data must not be NULL");
    }
    return NB_OK;
}

/* The common end: on failure release what was made and NULL the outputs. */
static nb_status bp_end(nb_status st, nb_tree **params, nb_tree **data) {
    if (st != NB_OK && params != NULL && data != NULL) {
        nb_tree_destroy(*params);
        nb_tree_destroy(*data);
        *params = NULL;
        *data = NULL;
    }
    return st;
}

/* A dict of n <= 8 array leaves (the arrays are borrowed). */
static nb_status bp_dict(nb_ctx *ctx, int n, const char *const *keys, nb_array *const *arrays,
                         nb_tree **out) {
    nb_tree *items[8] = {0};
    nb_status st = NB_OK;
    for (int i = 0; i < n && st == NB_OK; i++) {
        st = nb_tree_array(arrays[i], &items[i]);
    }
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, n, keys, items, out);
    }
    for (int i = 0; i < n; i++) {
        nb_tree_destroy(items[i]);
    }
    return st;
}

/* The n samples of N(mu_i, (scale mu_i or scale)^2) as an f64[n] array, from the key's
 * stream: x_i = mu_i + scale eps_i (additive) or mu_i (1 + scale eps_i) (relative). */
static nb_status bp_noisy_start(const nb_array *key, int64_t n, const double *mu, int64_t n_mu,
                                double scale, bool relative, nb_array **out) {
    nb_array *k = NULL;
    nb_status st = nb_random_fold_in(key, BP_STREAM_START, &k);
    if (st == NB_OK) {
        st = nb_random_normal(k, NB_DTYPE_F64, 1, &n, out);
    }
    nb_array_destroy(k);
    if (st == NB_OK) {
        double *x = nb_array_data(*out);
        for (int64_t i = 0; i < n; i++) {
            double m = mu[i % n_mu];
            x[i] = relative ? m * (1.0 + scale * x[i]) : m + scale * x[i];
        }
    }
    return st;
}

/* params = dict(x = start), data = () */
static nb_status bp_vector_setup(nb_ctx *ctx, const nb_array *key, int64_t n, const double *mu,
                                 int64_t n_mu, double scale, nb_tree **params, nb_tree **data) {
    nb_status st = bp_begin(ctx, key, params, data);
    if (st != NB_OK) {
        return st;
    }
    nb_array *x = NULL;
    st = bp_noisy_start(key, n, mu, n_mu, scale, false, &x);
    if (st == NB_OK) {
        st = bp_dict(ctx, 1, (const char *[]){"x"}, &x, params);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 0, NULL, data);
    }
    nb_array_destroy(x);
    return bp_end(st, params, data);
}

/* ---- Rosenbrock ------------------------------------------------------------------------- */

static const double bp_rosen_start[2] = {-1.2, 1.0};

static nb_status bp_rosen2_setup(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                                 nb_tree **params, nb_tree **data) {
    (void)data_dir;
    return bp_vector_setup(ctx, key, 2, bp_rosen_start, 2, 0.1, params, data);
}

static nb_status bp_rosen100_setup(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                                   nb_tree **params, nb_tree **data) {
    (void)data_dir;
    return bp_vector_setup(ctx, key, BP_ROSEN100_N, bp_rosen_start, 2, 0.1, params, data);
}

/* sum_{i < n-1} 100 (x_{i+1} - x_i^2)^2 + (1 - x_i)^2 */
static nb_var *bp_rosen_loss(nb_trace *tr, const nb_tree *params, const nb_tree *data) {
    (void)data;
    nb_var *x = nb_get(tr, params, "x");
    int64_t n = nb_var_dim(x, 0);
    nb_var *head = nb_slice(x, (int64_t[]){0}, (int64_t[]){n - 1}, NULL);
    nb_var *tail = nb_slice(x, (int64_t[]){1}, (int64_t[]){n}, NULL);
    nb_var *valley = nb_mul(nb_scalar(tr, 100.0), nb_square(nb_sub(tail, nb_square(head))));
    nb_var *along = nb_square(nb_sub(nb_scalar(tr, 1.0), head));
    return nb_sum(nb_add(valley, along), NULL, 0, false);
}

/* ---- the ill-conditioned quadratic ------------------------------------------------------ */

/* q <- (I - 2 v v^T / v^T v) q, for q n x n row-major. */
static void bp_householder(int64_t n, const double *v, double *q) {
    double vv = 0.0;
    for (int64_t k = 0; k < n; k++) {
        vv += v[k] * v[k];
    }
    for (int64_t j = 0; j < n; j++) {
        double s = 0.0;
        for (int64_t k = 0; k < n; k++) {
            s += v[k] * q[k * n + j];
        }
        s *= 2.0 / vv;
        for (int64_t k = 0; k < n; k++) {
            q[k * n + j] -= s * v[k];
        }
    }
}

/* A = Q^T diag(lambda) Q with lambda_k = cond^(k / (n-1)) (1 .. cond, log-spaced; or the
 * n values eig when it is not NULL) and Q the product of three Householder reflections from
 * fixed vectors (no axis is an eigenvector; the same matrix for every seed). Exactly
 * symmetric: the upper triangle is mirrored. */
static nb_status bp_quad_matrix(nb_ctx *ctx, int64_t n, double cond, const double *eig,
                                nb_array **out) {
    nb_array *q = NULL, *v = NULL;
    nb_status st = nb_array_eye(ctx, NB_DTYPE_F64, n, n, 0, &q);
    if (st == NB_OK) {
        st = nb_array_zeros(ctx, NB_DTYPE_F64, 1, &n, &v);
    }
    if (st == NB_OK) {
        st = nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){n, n}, out);
    }
    if (st == NB_OK) {
        double *qd = nb_array_data(q), *vd = nb_array_data(v), *a = nb_array_data(*out);
        for (int r = 0; r < 3; r++) {
            for (int64_t k = 0; k < n; k++) {
                double t = (double)k;
                vd[k] = r == 0 ? 1.0 : r == 1 ? sin(1.0 + t) : cos(1.7 * t + 0.4) + 0.5;
            }
            bp_householder(n, vd, qd);
        }
        double *lambda = vd; /* the vectors are done with */
        for (int64_t k = 0; k < n; k++) {
            lambda[k] = eig != NULL ? eig[k] : pow(cond, (double)k / (double)(n - 1));
        }
        for (int64_t i = 0; i < n; i++) {
            for (int64_t j = i; j < n; j++) {
                double s = 0.0;
                for (int64_t k = 0; k < n; k++) {
                    s += qd[k * n + i] * lambda[k] * qd[k * n + j];
                }
                a[i * n + j] = s;
                a[j * n + i] = s;
            }
        }
    }
    nb_array_destroy(v);
    nb_array_destroy(q);
    return st;
}

static nb_status bp_quad_setup(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                               nb_tree **params, nb_tree **data) {
    (void)data_dir;
    nb_status st = bp_begin(ctx, key, params, data);
    if (st != NB_OK) {
        return st;
    }
    static const double zero = 0.0;
    nb_array *x = NULL, *a = NULL;
    st = bp_noisy_start(key, BP_QUAD_N, &zero, 1, 1.0, false, &x);
    if (st == NB_OK) {
        st = bp_quad_matrix(ctx, BP_QUAD_N, BP_QUAD_COND, NULL, &a);
    }
    if (st == NB_OK) {
        st = bp_dict(ctx, 1, (const char *[]){"x"}, &x, params);
    }
    if (st == NB_OK) {
        st = bp_dict(ctx, 1, (const char *[]){"A"}, &a, data);
    }
    nb_array_destroy(x);
    nb_array_destroy(a);
    return bp_end(st, params, data);
}

/* 0.5 x^T A x */
static nb_var *bp_quad_loss(nb_trace *tr, const nb_tree *params, const nb_tree *data) {
    nb_var *x = nb_get(tr, params, "x");
    nb_var *ax = nb_matmul(nb_get(tr, data, "A"), x);
    return nb_mul(nb_scalar(tr, 0.5), nb_sum(nb_mul(x, ax), NULL, 0, false));
}

/* ---- Beale ------------------------------------------------------------------------------ */

static const double bp_beale_start[2] = {1.0, 1.0};

static nb_status bp_beale_setup(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                                nb_tree **params, nb_tree **data) {
    (void)data_dir;
    return bp_vector_setup(ctx, key, 2, bp_beale_start, 2, 0.1, params, data);
}

/* (1.5 - x + xy)^2 + (2.25 - x + xy^2)^2 + (2.625 - x + xy^3)^2 */
static nb_var *bp_beale_loss(nb_trace *tr, const nb_tree *params, const nb_tree *data) {
    (void)data;
    nb_var *v = nb_get(tr, params, "x");
    nb_var *x = nb_reshape(nb_slice(v, (int64_t[]){0}, (int64_t[]){1}, NULL), 0, NULL);
    nb_var *y = nb_reshape(nb_slice(v, (int64_t[]){1}, (int64_t[]){2}, NULL), 0, NULL);
    static const double c[3] = {1.5, 2.25, 2.625};
    nb_var *total = NULL, *yk = y;
    for (int k = 0; k < 3; k++) {
        nb_var *term = nb_square(nb_add(nb_sub(nb_scalar(tr, c[k]), x), nb_mul(x, yk)));
        total = total == NULL ? term : nb_add(total, term);
        yk = nb_mul(yk, y);
    }
    return total;
}

/* ---- classifiers on the UCI data -------------------------------------------------------- */

/* data_dir/file into path[4096] */
static nb_status bp_data_path(nb_ctx *ctx, const char *data_dir, const char *file,
                              char path[4096]) {
    if (data_dir == NULL) {
        return nb_tree_map_fail(ctx, NB_ERR_MISUSE, "bench setup: data_dir must not be NULL");
    }
    int len = snprintf(path, 4096, "%s/%s", data_dir, file);
    if (len < 0 || len >= 4096) {
        return nb_tree_map_fail(ctx, NB_ERR_INVALID,
                                "bench setup: the data directory '%.64s...' "
                                "is too long a path",
                                data_dir);
    }
    return NB_OK;
}

/* file (in data_dir): its features (f32) and labels (i32) */
static nb_status bp_load_csv(nb_ctx *ctx, const char *data_dir, const char *file, nb_array **x,
                             nb_array **y) {
    char path[4096];
    nb_status st = bp_data_path(ctx, data_dir, file, path);
    if (st != NB_OK) {
        return st;
    }
    nb_csv_opts csv = nb_csv_opts_default();
    return nb_csv_load(ctx, path, &csv, x, y);
}

/* data = dict(x_train, y_train, x_test, y_test): file (in data_dir) split 80/20 by the
 * key's split stream, features standardised with the training rows' statistics (f32). */
static nb_status bp_classifier_data(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                                    const char *file, nb_tree **data) {
    nb_array *x = NULL, *y = NULL, *k = NULL, *split[4] = {0};
    nb_status st = bp_load_csv(ctx, data_dir, file, &x, &y);
    if (st == NB_OK) {
        st = nb_random_fold_in(key, BP_STREAM_SPLIT, &k);
    }
    if (st == NB_OK) {
        st = nb_data_split(x, y, k, BP_TEST_FRACTION, &split[0], &split[1], &split[2], &split[3]);
    }
    if (st == NB_OK) {
        st = nb_data_standardize(split[0], split[2], NULL, NULL);
    }
    if (st == NB_OK) {
        st = bp_dict(ctx, 4, (const char *[]){"x_train", "y_train", "x_test", "y_test"}, split,
                     data);
    }
    for (int i = 0; i < 4; i++) {
        nb_array_destroy(split[i]);
    }
    nb_array_destroy(k);
    nb_array_destroy(y);
    nb_array_destroy(x);
    return st;
}

/* params = dict(w = zeros f32[shape_w], b = zeros f32[shape_b]) */
static nb_status bp_linear_zeros(nb_ctx *ctx, int rank_w, const int64_t *shape_w, int rank_b,
                                 const int64_t *shape_b, nb_tree **params) {
    nb_array *wb[2] = {0};
    nb_status st = nb_array_zeros(ctx, NB_DTYPE_F32, rank_w, shape_w, &wb[0]);
    if (st == NB_OK) {
        st = nb_array_zeros(ctx, NB_DTYPE_F32, rank_b, shape_b, &wb[1]);
    }
    if (st == NB_OK) {
        st = bp_dict(ctx, 2, (const char *[]){"w", "b"}, wb, params);
    }
    nb_array_destroy(wb[0]);
    nb_array_destroy(wb[1]);
    return st;
}

/* The fraction of rows where correct (bool) holds, as an f32 0-d var. */
static nb_var *bp_fraction(nb_var *correct) {
    return nb_mean(nb_cast(correct, NB_DTYPE_F32), NULL, 0, false);
}

/* mean softmax cross-entropy of logits [n, classes] against integer labels [n] */
static nb_var *bp_cross_entropy(nb_var *logits, nb_var *labels) {
    int64_t classes = nb_var_dim(logits, -1);
    nb_var *logp = nb_log_softmax(logits, -1);
    nb_var *picked = nb_sum(nb_mul(logp, nb_one_hot(labels, classes, nb_var_dtype(logp))),
                            (int[]){-1}, 1, false);
    return nb_neg(nb_mean(picked, NULL, 0, false));
}

static nb_var *bp_argmax_accuracy(nb_var *logits, nb_var *labels) {
    return bp_fraction(nb_eq(nb_argmax(logits, -1, false), nb_cast(labels, NB_DTYPE_I64)));
}

/* logistic regression: params dict(w f32[30], b f32[]) at zero, so the start loss is log 2 */
static nb_status bp_logreg_setup(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                                 nb_tree **params, nb_tree **data) {
    nb_status st = bp_begin(ctx, key, params, data);
    if (st == NB_OK) {
        st = bp_classifier_data(ctx, data_dir, key, "breast_cancer.csv", data);
    }
    if (st == NB_OK) {
        int64_t features = nb_array_dim(nb_tree_get_array(nb_tree_get(*data, "x_train")), 1);
        st = bp_linear_zeros(ctx, 1, &features, 0, NULL, params);
    }
    return bp_end(st, params, data);
}

static nb_var *bp_logreg_logits(nb_trace *tr, const nb_tree *params, nb_var *x) {
    return nb_add(nb_matmul(x, nb_get(tr, params, "w")), nb_get(tr, params, "b"));
}

/* mean binary cross-entropy, stably: softplus(z) - y z (= -y log s(z) - (1-y) log(1-s(z))) */
static nb_var *bp_logreg_loss(nb_trace *tr, const nb_tree *params, const nb_tree *data) {
    nb_var *z = bp_logreg_logits(tr, params, nb_get(tr, data, "x_train"));
    nb_var *y = nb_cast(nb_get(tr, data, "y_train"), nb_var_dtype(z));
    return nb_mean(nb_sub(nb_softplus(z), nb_mul(y, z)), NULL, 0, false);
}

static nb_var *bp_logreg_accuracy(nb_trace *tr, const nb_tree *params, const nb_tree *data) {
    nb_var *z = bp_logreg_logits(tr, params, nb_get(tr, data, "x_test"));
    nb_var *y = nb_get(tr, data, "y_test");
    return bp_fraction(nb_eq(nb_cast(nb_gt(z, nb_scalar(tr, 0.0)), nb_var_dtype(y)), y));
}

/* softmax regression: params dict(w f32[13,3], b f32[3]) at zero, so the start loss is
 * log 3 */
#define BP_WINE_CLASSES 3

static nb_status bp_softmax_setup(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                                  nb_tree **params, nb_tree **data) {
    nb_status st = bp_begin(ctx, key, params, data);
    if (st == NB_OK) {
        st = bp_classifier_data(ctx, data_dir, key, "wine_data.csv", data);
    }
    if (st == NB_OK) {
        int64_t features = nb_array_dim(nb_tree_get_array(nb_tree_get(*data, "x_train")), 1);
        st = bp_linear_zeros(ctx, 2, (int64_t[]){features, BP_WINE_CLASSES}, 1,
                             (int64_t[]){BP_WINE_CLASSES}, params);
    }
    return bp_end(st, params, data);
}

static nb_var *bp_softmax_loss(nb_trace *tr, const nb_tree *params, const nb_tree *data) {
    return bp_cross_entropy(bp_logreg_logits(tr, params, nb_get(tr, data, "x_train")),
                            nb_get(tr, data, "y_train"));
}

static nb_var *bp_softmax_accuracy(nb_trace *tr, const nb_tree *params, const nb_tree *data) {
    return bp_argmax_accuracy(bp_logreg_logits(tr, params, nb_get(tr, data, "x_test")),
                              nb_get(tr, data, "y_test"));
}

/* MLP 64-32-10 (relu) on the digits, Equinox's initialisation from the key's init stream */
#define BP_DIGITS_CLASSES 10

static nb_status bp_mlp_setup(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                              nb_tree **params, nb_tree **data) {
    nb_status st = bp_begin(ctx, key, params, data);
    nb_array *k = NULL;
    if (st == NB_OK) {
        st = bp_classifier_data(ctx, data_dir, key, "digits.csv.gz", data);
    }
    if (st == NB_OK) {
        st = nb_random_fold_in(key, BP_STREAM_INIT, &k);
    }
    if (st == NB_OK) {
        int64_t features = nb_array_dim(nb_tree_get_array(nb_tree_get(*data, "x_train")), 1);
        st = nb_nn_mlp_init(ctx, features, BP_DIGITS_CLASSES, BP_MLP_WIDTH, 1, NULL, NB_DTYPE_F32,
                            k, params);
    }
    nb_array_destroy(k);
    return bp_end(st, params, data);
}

static nb_var *bp_mlp_loss(nb_trace *tr, const nb_tree *params, const nb_tree *data) {
    return bp_cross_entropy(nb_nn_mlp(tr, params, nb_get(tr, data, "x_train")),
                            nb_get(tr, data, "y_train"));
}

static nb_var *bp_mlp_accuracy(nb_trace *tr, const nb_tree *params, const nb_tree *data) {
    return bp_argmax_accuracy(nb_nn_mlp(tr, params, nb_get(tr, data, "x_test")),
                              nb_get(tr, data, "y_test"));
}

/* ---- stochastic problems ------------------------------------------------------------------ */

/* A stream only they use (BENCH_STREAM_BATCH = 5 is the minibatches'). */
enum { BP_STREAM_VALID = 6 };

#define BP_VALID_FRACTION 0.2
#define BP_NQ_N 100
#define BP_NQ_TRAIN 1000
#define BP_NQ_VALID 250
#define BP_NQ_TEST 1000
#define BP_LVN_TRAIN 64
#define BP_LVN_VALID 16
#define BP_LVN_TEST 16
#define BP_CNN_CHANNELS 8

#define BP_NQ_TARGET 260.0
#define BP_LVN_TARGET 3e-3

/* data = dict(train, valid, test), each dict(x, y) (dict(x) where ys[i] is NULL), plus in
 * each an entry `name` = c when c is not NULL (a constant the loss reads: bench_stream
 * passes it along with every minibatch); the arrays are borrowed. */
static nb_status bp_splits(nb_ctx *ctx, nb_array *const xs_in[3], nb_array *const ys_in[3],
                           const char *name, nb_array *c, nb_tree **data) {
    /* train_eval (DeepOBS's): the first min(n_train, n_test) training rows, copied */
    nb_array *xs[4] = {xs_in[0], xs_in[1], xs_in[2], NULL}, *ys[4] = {ys_in[0], ys_in[1], ys_in[2]};
    nb_array *view = NULL;
    int64_t n_eval = nb_array_dim(xs[0], 0) < nb_array_dim(xs[2], 0) ? nb_array_dim(xs[0], 0)
                                                                     : nb_array_dim(xs[2], 0);
    nb_status st = nb_array_rows(xs[0], 0, n_eval, &view);
    if (st == NB_OK) {
        st = nb_array_copy(view, &xs[3]);
    }
    nb_array_destroy(view);
    view = NULL;
    if (st == NB_OK && ys[0] != NULL) {
        st = nb_array_rows(ys[0], 0, n_eval, &view);
        if (st == NB_OK) {
            st = nb_array_copy(view, &ys[3]);
        }
        nb_array_destroy(view);
    }
    nb_tree *t[4] = {0};
    for (int i = 0; i < 4 && st == NB_OK; i++) {
        const char *keys[3] = {"x", ys[i] != NULL ? "y" : name, name};
        nb_array *a[3] = {xs[i], ys[i] != NULL ? ys[i] : c, c};
        int n = 1 + (ys[i] != NULL) + (c != NULL);
        st = bp_dict(ctx, n, keys, a, &t[i]);
    }
    if (st == NB_OK) {
        st =
            nb_tree_dict(ctx, 4, (const char *[]){"train", "valid", "test", "train_eval"}, t, data);
    }
    for (int i = 0; i < 4; i++) {
        nb_tree_destroy(t[i]);
    }
    nb_array_destroy(xs[3]);
    nb_array_destroy(ys[3]);
    return st;
}

/* The UCI file split as the full-batch classifiers' (80/20 by the split stream: the same
 * test rows), the 80 then split 80/20 into train and valid by the valid stream; features
 * standardised with the training rows' statistics. */
static nb_status bp_csv_splits(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                               const char *file, nb_tree **data) {
    nb_array *x = NULL, *y = NULL, *k = NULL, *k2 = NULL, *mean = NULL, *sd = NULL;
    nb_array *xa = NULL, *ya = NULL, *xs[3] = {0}, *ys[3] = {0};
    nb_status st = bp_load_csv(ctx, data_dir, file, &x, &y);
    if (st == NB_OK) {
        st = nb_random_fold_in(key, BP_STREAM_SPLIT, &k);
    }
    if (st == NB_OK) {
        st = nb_data_split(x, y, k, BP_TEST_FRACTION, &xa, &ya, &xs[2], &ys[2]);
    }
    if (st == NB_OK) {
        st = nb_random_fold_in(key, BP_STREAM_VALID, &k2);
    }
    if (st == NB_OK) {
        st = nb_data_split(xa, ya, k2, BP_VALID_FRACTION, &xs[0], &ys[0], &xs[1], &ys[1]);
    }
    if (st == NB_OK) {
        st = nb_data_standardize(xs[0], xs[1], &mean, &sd);
    }
    if (st == NB_OK) {
        st = nb_data_standardize_apply(xs[2], mean, sd);
    }
    if (st == NB_OK) {
        st = bp_splits(ctx, xs, ys, NULL, NULL, data);
    }
    for (int i = 0; i < 3; i++) {
        nb_array_destroy(xs[i]);
        nb_array_destroy(ys[i]);
    }
    nb_array *rest[] = {x, y, k, k2, mean, sd, xa, ya};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) {
        nb_array_destroy(rest[i]);
    }
    return st;
}

static int64_t bp_train_dim(const nb_tree *data, int axis) {
    return nb_array_dim(nb_tree_get_array(nb_tree_get(nb_tree_get(data, "train"), "x")), axis);
}

/* logistic regression, minibatches of 16 */
static nb_status bp_logreg_mb_setup(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                                    nb_tree **params, nb_tree **data) {
    nb_status st = bp_begin(ctx, key, params, data);
    if (st == NB_OK) {
        st = bp_csv_splits(ctx, data_dir, key, "breast_cancer.csv", data);
    }
    if (st == NB_OK) {
        int64_t features = bp_train_dim(*data, 1);
        st = bp_linear_zeros(ctx, 1, &features, 0, NULL, params);
    }
    return bp_end(st, params, data);
}

static nb_var *bp_logreg_mb_loss(nb_trace *tr, const nb_tree *params, const nb_tree *split) {
    nb_var *z = bp_logreg_logits(tr, params, nb_get(tr, split, "x"));
    nb_var *y = nb_cast(nb_get(tr, split, "y"), nb_var_dtype(z));
    return nb_mean(nb_sub(nb_softplus(z), nb_mul(y, z)), NULL, 0, false);
}

static nb_var *bp_logreg_mb_accuracy(nb_trace *tr, const nb_tree *params, const nb_tree *split) {
    nb_var *z = bp_logreg_logits(tr, params, nb_get(tr, split, "x"));
    nb_var *y = nb_get(tr, split, "y");
    return bp_fraction(nb_eq(nb_cast(nb_gt(z, nb_scalar(tr, 0.0)), nb_var_dtype(y)), y));
}

/* the MLP 64-32-10, minibatches of 32 */
static nb_status bp_mlp_mb_setup(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                                 nb_tree **params, nb_tree **data) {
    nb_status st = bp_begin(ctx, key, params, data);
    nb_array *k = NULL;
    if (st == NB_OK) {
        st = bp_csv_splits(ctx, data_dir, key, "digits.csv.gz", data);
    }
    if (st == NB_OK) {
        st = nb_random_fold_in(key, BP_STREAM_INIT, &k);
    }
    if (st == NB_OK) {
        st = nb_nn_mlp_init(ctx, bp_train_dim(*data, 1), BP_DIGITS_CLASSES, BP_MLP_WIDTH, 1, NULL,
                            NB_DTYPE_F32, k, params);
    }
    nb_array_destroy(k);
    return bp_end(st, params, data);
}

static nb_var *bp_mlp_mb_loss(nb_trace *tr, const nb_tree *params, const nb_tree *split) {
    return bp_cross_entropy(nb_nn_mlp(tr, params, nb_get(tr, split, "x")), nb_get(tr, split, "y"));
}

static nb_var *bp_mlp_mb_accuracy(nb_trace *tr, const nb_tree *params, const nb_tree *split) {
    return bp_argmax_accuracy(nb_nn_mlp(tr, params, nb_get(tr, split, "x")),
                              nb_get(tr, split, "y"));
}

/* A small CNN on the 8x8 digits: Conv2d 1 -> 8 (3x3, SAME), relu, MaxPool 2x2 stride 2 ->
 * [B, 8, 4, 4], flatten, Linear 128 -> 10; Equinox's init from the init stream's two keys.
 * The rows are the standardised pixels. */
static nb_var *bp_flatten(nb_var *x) {
    return nb_reshape(x, 2, (int64_t[]){nb_var_dim(x, 0), -1});
}

static nb_status bp_cnn_setup(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                              nb_tree **params, nb_tree **data) {
    nb_status st = bp_begin(ctx, key, params, data);
    nb_array *k = NULL, *ks[2] = {0};
    nb_tree *l[5] = {0};
    if (st == NB_OK) {
        st = bp_csv_splits(ctx, data_dir, key, "digits.csv.gz", data);
    }
    if (st == NB_OK) {
        st = nb_random_fold_in(key, BP_STREAM_INIT, &k);
    }
    if (st == NB_OK) {
        st = nb_random_split_keys(k, 2, ks);
    }
    nb_nn_conv_opts same = nb_nn_conv_opts_default();
    same.padding_kind = NB_NN_PAD_SAME;
    nb_nn_pool_opts p2 = nb_nn_pool_opts_default();
    p2.stride[0] = p2.stride[1] = 2;
    if (st == NB_OK) {
        st = nb_nn_conv_init(ctx, 2, 1, BP_CNN_CHANNELS, (int64_t[]){3, 3}, &same, NB_DTYPE_F32,
                             ks[0], &l[0]);
    }
    if (st == NB_OK) {
        st = nb_nn_activation_leaf(ctx, nb_relu, NULL, &l[1]);
    }
    if (st == NB_OK) {
        st = nb_nn_max_pool_init(ctx, 2, (int64_t[]){2, 2}, &p2, &l[2]);
    }
    if (st == NB_OK) {
        st = nb_nn_activation_leaf(ctx, bp_flatten, "flatten", &l[3]);
    }
    if (st == NB_OK) {
        st = nb_nn_linear_init(ctx, BP_CNN_CHANNELS * 16, BP_DIGITS_CLASSES, true, NB_DTYPE_F32,
                               ks[1], &l[4]);
    }
    if (st == NB_OK) {
        st = nb_nn_sequential_init(ctx, 5, l, params);
    }
    for (int i = 0; i < 5; i++) {
        nb_tree_destroy(l[i]);
    }
    nb_array_destroy(ks[0]);
    nb_array_destroy(ks[1]);
    nb_array_destroy(k);
    return bp_end(st, params, data);
}

static nb_var *bp_cnn_logits(nb_trace *tr, const nb_tree *params, const nb_tree *split) {
    nb_var *x = nb_reshape(nb_get(tr, split, "x"), 4, (int64_t[]){-1, 1, 8, 8});
    return nb_nn_apply(tr, params, x, NULL);
}

static nb_var *bp_cnn_loss(nb_trace *tr, const nb_tree *params, const nb_tree *split) {
    return bp_cross_entropy(bp_cnn_logits(tr, params, split), nb_get(tr, split, "y"));
}

static nb_var *bp_cnn_accuracy(nb_trace *tr, const nb_tree *params, const nb_tree *split) {
    return bp_argmax_accuracy(bp_cnn_logits(tr, params, split), nb_get(tr, split, "y"));
}

/* DeepOBS's noisy quadratic (Schneider et al. 2019, "quadratic_deep"), with fixed
 * eigenvalues: loss(theta) = mean over the rows x_i of 0.5 (theta - x_i)^T H (theta - x_i),
 * H = Q^T diag(lambda) Q (Q as the quadratic's: three fixed Householder reflections), 90
 * eigenvalues k / 90 (k = 1 .. 90) and 10 from 30 to 60 evenly (DeepOBS draws them from
 * U(0, 1) and U(30, 60)); the rows are N(0, I) samples (train 1000, valid 250, test 1000,
 * from the noise stream), f32; theta starts at 1 + N(0, 0.1^2). The minimum of the expected
 * loss is 0.5 tr H = 247.75 (at theta = 0); the start's is ~0.5 tr H + 0.5 1^T H 1. */
static nb_status bp_nq_setup(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                             nb_tree **params, nb_tree **data) {
    (void)data_dir;
    nb_status st = bp_begin(ctx, key, params, data);
    if (st != NB_OK) {
        return st;
    }
    double lambda[BP_NQ_N];
    for (int k = 0; k < BP_NQ_N; k++) {
        lambda[k] = k < 90 ? (k + 1) / 90.0 : 30.0 + 30.0 * (k - 90) / 9.0;
    }
    static const double one = 1.0;
    nb_array *h64 = NULL, *h = NULL, *t64 = NULL, *theta = NULL, *kn = NULL, *xs[3] = {0};
    nb_array *none[3] = {0};
    st = bp_quad_matrix(ctx, BP_NQ_N, 0.0, lambda, &h64);
    if (st == NB_OK) {
        st = nb_array_cast(h64, NB_DTYPE_F32, &h);
    }
    if (st == NB_OK) {
        st = bp_noisy_start(key, BP_NQ_N, &one, 1, 0.1, false, &t64);
    }
    if (st == NB_OK) {
        st = nb_array_cast(t64, NB_DTYPE_F32, &theta);
    }
    if (st == NB_OK) {
        st = nb_random_fold_in(key, BP_STREAM_NOISE, &kn);
    }
    static const int64_t rows[3] = {BP_NQ_TRAIN, BP_NQ_VALID, BP_NQ_TEST};
    for (int i = 0; i < 3 && st == NB_OK; i++) {
        nb_array *ki = NULL;
        st = nb_random_fold_in(kn, (uint32_t)i, &ki);
        if (st == NB_OK) {
            st = nb_random_normal(ki, NB_DTYPE_F32, 2, (int64_t[]){rows[i], BP_NQ_N}, &xs[i]);
        }
        nb_array_destroy(ki);
    }
    if (st == NB_OK) {
        st = bp_splits(ctx, xs, none, "H", h, data);
    }
    if (st == NB_OK) {
        st = bp_dict(ctx, 1, (const char *[]){"theta"}, &theta, params);
    }
    nb_array *rest[] = {h64, h, t64, theta, kn, xs[0], xs[1], xs[2]};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) {
        nb_array_destroy(rest[i]);
    }
    return bp_end(st, params, data);
}

/* split = dict(H, x): every split, and so every minibatch, carries H */
static nb_var *bp_nq_loss(nb_trace *tr, const nb_tree *params, const nb_tree *split) {
    nb_var *r = nb_sub(nb_get(tr, params, "theta"), nb_get(tr, split, "x")); /* [n, d] */
    nb_var *rh = nb_matmul(r, nb_get(tr, split, "H"));
    nb_var *q = nb_sum(nb_mul(rh, r), (int[]){1}, 1, false);
    return nb_mul(nb_scalar(tr, 0.5), nb_mean(q, NULL, 0, false));
}

/* A character-level GRU language model on Tiny Shakespeare (data/tinyshakespeare.txt.gz):
 * the first 33,745 characters cut into 1,985 windows of 17 (rows i32[17]: 16 inputs, each
 * followed by its target), split as the classifiers' (test 20 %, then valid 20 % of the
 * rest, by the split and valid streams); Embedding(V, 16), GRUCell(16, 64), Linear(64, V),
 * V = the file's alphabet (65), Equinox's init from the init stream's three keys. Loss: the
 * mean cross-entropy (nats) of the 16 next characters; accuracy: of their argmax. */
#define BP_GRU_T 16
#define BP_GRU_WINDOWS 1985
#define BP_GRU_EMB 16
#define BP_GRU_HIDDEN 64
#define BP_GRU_TARGET 2.0 /* nats: 2.89 bits per character, below the bigram entropy (3.54) */

static nb_status bp_gru_setup(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                              nb_tree **params, nb_tree **data) {
    nb_status st = bp_begin(ctx, key, params, data);
    if (st != NB_OK) {
        return st;
    }
    char path[4096];
    st = bp_data_path(ctx, data_dir, "tinyshakespeare.txt.gz", path);
    if (st != NB_OK) {
        return bp_end(st, params, data);
    }
    int vocab = 0;
    nb_array *codes = NULL, *w = NULL, *k = NULL, *k2 = NULL, *ks[3] = {0}, *wa = NULL;
    nb_array *xs[3] = {0}, *none[3] = {0};
    nb_tree *l[3] = {0};
    st = nb_text_load(ctx, path, &codes, NULL, &vocab);
    if (st == NB_OK && nb_array_dim(codes, 0) < (int64_t)BP_GRU_WINDOWS * (BP_GRU_T + 1)) {
        st = nb_tree_map_fail(ctx, NB_ERR_FORMAT, "bench setup: %s has fewer than %d characters",
                              path, BP_GRU_WINDOWS * (BP_GRU_T + 1));
    }
    if (st == NB_OK) {
        st = nb_array_zeros(ctx, NB_DTYPE_I32, 2, (int64_t[]){BP_GRU_WINDOWS, BP_GRU_T + 1}, &w);
    }
    if (st == NB_OK) {
        memcpy(nb_array_data(w), nb_array_data(codes),
               sizeof(int32_t) * BP_GRU_WINDOWS * (BP_GRU_T + 1));
        st = nb_random_fold_in(key, BP_STREAM_SPLIT, &k);
    }
    if (st == NB_OK) {
        st = nb_data_split(w, NULL, k, BP_TEST_FRACTION, &wa, NULL, &xs[2], NULL);
    }
    if (st == NB_OK) {
        st = nb_random_fold_in(key, BP_STREAM_VALID, &k2);
    }
    if (st == NB_OK) {
        st = nb_data_split(wa, NULL, k2, BP_VALID_FRACTION, &xs[0], NULL, &xs[1], NULL);
    }
    if (st == NB_OK) {
        st = bp_splits(ctx, xs, none, NULL, NULL, data);
    }
    nb_array_destroy(k);
    k = NULL;
    if (st == NB_OK) {
        st = nb_random_fold_in(key, BP_STREAM_INIT, &k);
    }
    if (st == NB_OK) {
        st = nb_random_split_keys(k, 3, ks);
    }
    if (st == NB_OK) {
        st = nb_nn_embedding_init(ctx, vocab, BP_GRU_EMB, NB_DTYPE_F32, ks[0], &l[0]);
    }
    if (st == NB_OK) {
        st = nb_nn_gru_cell_init(ctx, BP_GRU_EMB, BP_GRU_HIDDEN, true, NB_DTYPE_F32, ks[1], &l[1]);
    }
    if (st == NB_OK) {
        st = nb_nn_linear_init(ctx, BP_GRU_HIDDEN, vocab, true, NB_DTYPE_F32, ks[2], &l[2]);
    }
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 3, (const char *[]){"emb", "gru", "out"}, l, params);
    }
    for (int i = 0; i < 3; i++) {
        nb_tree_destroy(l[i]);
        nb_array_destroy(ks[i]);
        nb_array_destroy(xs[i]);
    }
    nb_array *rest[] = {codes, w, k, k2, wa};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) {
        nb_array_destroy(rest[i]);
    }
    return bp_end(st, params, data);
}

/* one character: self = the params; ((h, x [B, E])) -> (h', h') */
static nb_status bp_gru_step(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    nb_var *h = nb_nn_gru_cell(tr, nb_tree_get(self, "gru"), nb_get(tr, args, "[1]"),
                               nb_get(tr, args, "[0]"));
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(h), nb_leaf(h)}, out);
}

/* the logits [T, B, V] of the split's windows, and their targets [T, B] */
static nb_var *bp_gru_logits(nb_trace *tr, const nb_tree *params, const nb_tree *split,
                             nb_var **tgt) {
    nb_var *w = nb_get(tr, split, "x");
    int64_t b = nb_var_dim(w, 0);
    nb_var *in = nb_slice(w, (int64_t[]){0, 0}, (int64_t[]){b, BP_GRU_T}, NULL);
    *tgt = nb_transpose(nb_slice(w, (int64_t[]){0, 1}, (int64_t[]){b, BP_GRU_T + 1}, NULL), NULL);
    nb_var *xs =
        nb_transpose(nb_nn_embedding(tr, nb_tree_get(params, "emb"), in), (int[]){1, 0, 2});
    nb_var *h0 = nb_full(tr, nb_var_dtype(xs), 2, (int64_t[]){b, BP_GRU_HIDDEN}, 0.0);
    nb_fn *f = NULL;
    nb_status st = nb_fn_create(nb_trace_ctx(tr), "char_gru_step", bp_gru_step, params, &f);
    if (st != NB_OK) {
        nb_trace_fail(tr, st, "char_gru: cannot create the step");
        return nb_scalar(tr, NAN);
    }
    const nb_tree *r = nb_scan(tr, f, nb_leaf(h0), nb_leaf(xs), BP_GRU_T,
                               &(nb_loop_opts){.kind = NB_LOOP_BOUNDED});
    nb_fn_destroy(f);
    return nb_nn_linear(tr, nb_tree_get(params, "out"), nb_get(tr, r, "[1]"));
}

static nb_var *bp_gru_loss(nb_trace *tr, const nb_tree *params, const nb_tree *split) {
    nb_var *tgt = NULL;
    nb_var *z = bp_gru_logits(tr, params, split, &tgt);
    nb_var *ll = nb_take_along_axis(nb_log_softmax(z, -1), nb_expand_dims(tgt, 2), 2);
    return nb_neg(nb_mean(ll, NULL, 0, false));
}

static nb_var *bp_gru_accuracy(nb_trace *tr, const nb_tree *params, const nb_tree *split) {
    nb_var *tgt = NULL;
    nb_var *z = bp_gru_logits(tr, params, split, &tgt);
    return bp_fraction(nb_eq(nb_argmax(z, -1, false), nb_cast(tgt, NB_DTYPE_I64)));
}

/* ---- Lotka-Volterra (as tools/ode.c) ---------------------------------------------------- */

/* The vector field: args = (t, state dict(x, y), params dict(a, b, c, d)). */
static nb_status bp_lv_term(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[1].x"), *y = nb_get(tr, args, "[1].y");
    nb_var *a = nb_get(tr, args, "[2].a"), *b = nb_get(tr, args, "[2].b");
    nb_var *c = nb_get(tr, args, "[2].c"), *d = nb_get(tr, args, "[2].d");
    nb_var *xy = nb_mul(x, y);
    nb_var *dx = nb_sub(nb_mul(a, x), nb_mul(b, xy));
    nb_var *dy = nb_sub(nb_mul(d, xy), nb_mul(c, y));
    return nb_tree_dict(nb_trace_ctx(tr), 2, (const char *[]){"x", "y"},
                        (nb_tree *[]){nb_leaf(dx), nb_leaf(dy)}, out);
}

/* The solve from x(0) = y(0) = 1 saved at t_i = 10 i / 20, i = 1 .. 20, with params a var
 * tree dict(a, b, c, d). The solution dict is owned by the trace (NULL after an error). */
static const nb_tree *bp_lv_solve(nb_trace *tr, const nb_tree *params, nb_ode_solver solver,
                                  double tol, int64_t max_steps, bool throw_on_failure) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    double ts[BP_LV_POINTS];
    for (int i = 0; i < BP_LV_POINTS; i++) {
        ts[i] = BP_LV_T_END * (double)(i + 1) / (double)BP_LV_POINTS;
    }
    nb_fn *term = NULL;
    nb_tree *y0 = NULL;
    nb_status st = nb_fn_create(ctx, "lotka_volterra", bp_lv_term, NULL, &term);
    if (st == NB_OK) {
        nb_var *one = nb_scalar_typed(tr, NB_DTYPE_F64, 1.0);
        st = nb_tree_dict(ctx, 2, (const char *[]){"x", "y"},
                          (nb_tree *[]){nb_leaf(one), nb_leaf(one)}, &y0);
    }
    const nb_tree *sol = NULL;
    if (st == NB_OK) {
        nb_ode_opts o = nb_ode_opts_default();
        o.solver = solver;
        o.t0 = 0.0;
        o.t1 = BP_LV_T_END;
        o.dt0 = 0.0; /* picked automatically */
        o.controller = nb_ode_pid(tol, tol);
        o.saveat.kind = NB_SAVEAT_TS;
        o.saveat.ts = ts; /* copied into the trace */
        o.saveat.n_ts = BP_LV_POINTS;
        o.adjoint.kind = NB_ADJOINT_RECURSIVE_CHECKPOINT;
        o.max_steps = max_steps;
        o.throw_on_failure = throw_on_failure;
        sol = nb_diffeqsolve(tr, term, y0, params, &o);
    } else {
        nb_trace_fail(tr, st, "lotka_volterra: cannot set up the solve");
    }
    nb_tree_destroy(y0);
    nb_fn_destroy(term);
    return sol;
}

/* obs(params) -> dict(x, y) of f64[20]: the accurate solve (dopri8, 1e-10). */
static nb_status bp_lv_obs_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    (void)self;
    const nb_tree *sol = bp_lv_solve(tr, nb_tree_child(args, 0), NB_ODE_DOPRI8, 1e-10, 65536, true);
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)nb_tree_get(sol, "ys"));
    return nb_trace_status(tr);
}

/* dict(a, b, c, d) of f64 0-d arrays */
static nb_status bp_lv_params(nb_ctx *ctx, const double *v, nb_tree **out) {
    nb_array *a[4] = {0};
    nb_status st = NB_OK;
    for (int i = 0; i < 4 && st == NB_OK; i++) {
        st = nb_array_scalar(ctx, NB_DTYPE_F64, v[i], &a[i]);
    }
    if (st == NB_OK) {
        st = bp_dict(ctx, 4, bp_lv_names, a, out);
    }
    for (int i = 0; i < 4; i++) {
        nb_array_destroy(a[i]);
    }
    return st;
}

/* data = dict(x, y): the solve at the true parameters plus N(0, 0.05^2) from the key's
 * noise stream; params = the start (1.2, 0.8, 2.5, 0.8) (1 + 0.05 N(0, 1)). */
static nb_status bp_lv_setup(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                             nb_tree **params, nb_tree **data) {
    (void)data_dir;
    nb_status st = bp_begin(ctx, key, params, data);
    if (st != NB_OK) {
        return st;
    }
    nb_array *start = NULL, *k = NULL, *noise = NULL;
    nb_tree *truth = NULL, *args = NULL;
    nb_fn *obs_fn = NULL;
    st = bp_lv_params(ctx, bp_lv_truth, &truth);
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 1, &truth, &args);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "lotka_volterra_obs", bp_lv_obs_body, NULL, &obs_fn);
    }
    if (st == NB_OK) {
        st = nb_fn_call(obs_fn, args, data); /* new arrays: ours to add noise to */
    }
    if (st == NB_OK) {
        st = nb_random_fold_in(key, BP_STREAM_NOISE, &k);
    }
    if (st == NB_OK) {
        st = nb_random_normal(k, NB_DTYPE_F64, 2, (int64_t[]){2, BP_LV_POINTS}, &noise);
    }
    if (st == NB_OK) {
        const double *eps = nb_array_data(noise);
        for (int s = 0; s < 2; s++) {
            double *y = nb_array_data(nb_tree_get_array(nb_tree_get(*data, s == 0 ? "x" : "y")));
            for (int i = 0; i < BP_LV_POINTS; i++) {
                y[i] += BP_LV_NOISE * eps[s * BP_LV_POINTS + i];
            }
        }
        st = bp_noisy_start(key, 4, bp_lv_start, 4, 0.05, true, &start);
    }
    if (st == NB_OK) {
        st = bp_lv_params(ctx, nb_array_data(start), params);
    }
    nb_fn_destroy(obs_fn);
    nb_tree_destroy(args);
    nb_tree_destroy(truth);
    nb_array_destroy(noise);
    nb_array_destroy(k);
    nb_array_destroy(start);
    return bp_end(st, params, data);
}

/* 0.5 (mean rx^2 + mean ry^2) of the fit's solve (tsit5, PID 1e-6, recursive checkpoint)
 * against the observations; +inf when the solve did not succeed or a parameter left
 * [BP_LV_LO, BP_LV_HI] (the solve then runs at the clamped parameters: cheap, and its
 * result is discarded). */
static const nb_tree *bp_lv_fit(nb_trace *tr, const nb_tree *params, nb_var **ok_out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *inside = NULL;
    nb_tree *leaves[4] = {0}, *clamped = NULL;
    for (int i = 0; i < 4; i++) {
        nb_var *p = nb_get(tr, params, "%s", bp_lv_names[i]);
        nb_var *ok =
            nb_logical_and(nb_ge(p, nb_scalar(tr, BP_LV_LO)), nb_le(p, nb_scalar(tr, BP_LV_HI)));
        inside = inside == NULL ? ok : nb_logical_and(inside, ok);
        leaves[i] =
            nb_leaf(nb_minimum(nb_maximum(p, nb_scalar(tr, BP_LV_LO)), nb_scalar(tr, BP_LV_HI)));
    }
    nb_status st = nb_tree_dict(ctx, 4, bp_lv_names, leaves, &clamped);
    if (st != NB_OK) {
        nb_trace_fail(tr, st, "lotka_volterra: cannot build the parameters");
        return NULL;
    }
    const nb_tree *sol = bp_lv_solve(tr, clamped, NB_ODE_TSIT5, 1e-6, BP_LV_MAX_STEPS, false);
    nb_tree_destroy(clamped);
    if (sol == NULL) {
        return NULL; /* the sticky error is recorded */
    }
    nb_var *result = nb_get(tr, sol, "result");
    *ok_out =
        nb_logical_and(inside, nb_eq(result, nb_scalar_typed(tr, NB_DTYPE_I32, NB_ODE_SUCCESSFUL)));
    return sol;
}

static nb_var *bp_lv_loss(nb_trace *tr, const nb_tree *params, const nb_tree *data) {
    nb_var *ok = NULL;
    const nb_tree *sol = bp_lv_fit(tr, params, &ok);
    if (sol == NULL) {
        return nb_scalar(tr, NAN);
    }
    nb_var *rx = nb_sub(nb_get(tr, sol, "ys.x"), nb_get(tr, data, "x"));
    nb_var *ry = nb_sub(nb_get(tr, sol, "ys.y"), nb_get(tr, data, "y"));
    nb_var *mse = nb_mul(
        nb_add(nb_mean(nb_square(rx), NULL, 0, false), nb_mean(nb_square(ry), NULL, 0, false)),
        nb_scalar(tr, 0.5));
    return nb_select(ok, mse, nb_scalar_typed(tr, NB_DTYPE_F64, INFINITY));
}

/* The Lotka-Volterra fit with noisy observations resampled per step: the rows are
 * observation sets f64[2, 20] (x then y at t = 0.5 .. 10), each the solve at the true
 * parameters plus its own N(0, 0.05^2) noise (train 64, valid 16, test 16, from the noise
 * stream); a minibatch is 4 sets. The start as lotka_volterra's. */
static nb_status bp_lvn_setup(nb_ctx *ctx, const char *data_dir, const nb_array *key,
                              nb_tree **params, nb_tree **data) {
    (void)data_dir;
    nb_status st = bp_begin(ctx, key, params, data);
    if (st != NB_OK) {
        return st;
    }
    nb_array *start = NULL, *kn = NULL, *xs[3] = {0}, *none[3] = {0};
    nb_tree *truth = NULL, *args = NULL, *obs = NULL;
    nb_fn *obs_fn = NULL;
    st = bp_lv_params(ctx, bp_lv_truth, &truth);
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 1, &truth, &args);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "lotka_volterra_obs", bp_lv_obs_body, NULL, &obs_fn);
    }
    if (st == NB_OK) {
        st = nb_fn_call(obs_fn, args, &obs);
    }
    if (st == NB_OK) {
        st = nb_random_fold_in(key, BP_STREAM_NOISE, &kn);
    }
    static const int64_t rows[3] = {BP_LVN_TRAIN, BP_LVN_VALID, BP_LVN_TEST};
    for (int i = 0; i < 3 && st == NB_OK; i++) {
        nb_array *ki = NULL;
        st = nb_random_fold_in(kn, (uint32_t)i, &ki);
        if (st == NB_OK) {
            st = nb_random_normal(ki, NB_DTYPE_F64, 3, (int64_t[]){rows[i], 2, BP_LV_POINTS},
                                  &xs[i]);
        }
        nb_array_destroy(ki);
        if (st == NB_OK) {
            double *v = nb_array_data(xs[i]);
            for (int s = 0; s < 2; s++) {
                const double *y = nb_array_data(nb_tree_get_array(nb_tree_get(obs, s ? "y" : "x")));
                for (int64_t r = 0; r < rows[i]; r++) {
                    for (int j = 0; j < BP_LV_POINTS; j++) {
                        double *e = &v[(r * 2 + s) * BP_LV_POINTS + j];
                        *e = y[j] + BP_LV_NOISE * *e;
                    }
                }
            }
        }
    }
    if (st == NB_OK) {
        st = bp_splits(ctx, xs, none, NULL, NULL, data);
    }
    if (st == NB_OK) {
        st = bp_noisy_start(key, 4, bp_lv_start, 4, 0.05, true, &start);
    }
    if (st == NB_OK) {
        st = bp_lv_params(ctx, nb_array_data(start), params);
    }
    nb_fn_destroy(obs_fn);
    nb_tree_destroy(obs);
    nb_tree_destroy(args);
    nb_tree_destroy(truth);
    for (int i = 0; i < 3; i++) {
        nb_array_destroy(xs[i]);
    }
    nb_array_destroy(kn);
    nb_array_destroy(start);
    return bp_end(st, params, data);
}

/* the mean of the squared residuals over the split's sets; +inf as lotka_volterra's */
static nb_var *bp_lvn_loss(nb_trace *tr, const nb_tree *params, const nb_tree *split) {
    nb_var *ok = NULL;
    const nb_tree *sol = bp_lv_fit(tr, params, &ok);
    if (sol == NULL) {
        return nb_scalar(tr, NAN);
    }
    nb_var *pred = nb_stack(2, (nb_var *[]){nb_get(tr, sol, "ys.x"), nb_get(tr, sol, "ys.y")}, 0);
    nb_var *mse = nb_mean(nb_square(nb_sub(pred, nb_get(tr, split, "x"))), NULL, 0, false);
    return nb_select(ok, mse, nb_scalar_typed(tr, NB_DTYPE_F64, INFINITY));
}

/* ---- the table -------------------------------------------------------------------------- */

const bench_problem bench_problems[] = {
    {.name = "rosenbrock2",
     .title = "Rosenbrock 2-D",
     .target = 1e-3,
     .has_accuracy = false,
     .setup = bp_rosen2_setup,
     .loss = bp_rosen_loss,
     .accuracy = NULL},
    {.name = "rosenbrock100",
     .title = "Rosenbrock 100-D",
     .target = BP_ROSEN100_TARGET,
     .has_accuracy = false,
     .setup = bp_rosen100_setup,
     .loss = bp_rosen_loss,
     .accuracy = NULL},
    {.name = "quadratic",
     .title = "Ill-conditioned quadratic (cond 1e4)",
     .target = BP_QUAD_TARGET,
     .has_accuracy = false,
     .setup = bp_quad_setup,
     .loss = bp_quad_loss,
     .accuracy = NULL},
    {.name = "beale",
     .title = "Beale",
     .target = 1e-3,
     .has_accuracy = false,
     .setup = bp_beale_setup,
     .loss = bp_beale_loss,
     .accuracy = NULL},
    {.name = "logreg",
     .title = "Logistic regression, breast cancer",
     .data_file = "breast_cancer.csv",
     .target = BP_LOGREG_TARGET,
     .has_accuracy = true,
     .setup = bp_logreg_setup,
     .loss = bp_logreg_loss,
     .accuracy = bp_logreg_accuracy},
    {.name = "softmax",
     .title = "Softmax regression, wine",
     .data_file = "wine_data.csv",
     .target = BP_SOFTMAX_TARGET,
     .has_accuracy = true,
     .setup = bp_softmax_setup,
     .loss = bp_softmax_loss,
     .accuracy = bp_softmax_accuracy},
    {.name = "mlp",
     .title = "MLP, digits",
     .data_file = "digits.csv.gz",
     .target = BP_MLP_TARGET,
     .has_accuracy = true,
     .setup = bp_mlp_setup,
     .loss = bp_mlp_loss,
     .accuracy = bp_mlp_accuracy},
    {.name = "lotka_volterra",
     .title = "Lotka-Volterra fit (ODE)",
     .target = BP_LV_TARGET,
     .has_accuracy = false,
     .setup = bp_lv_setup,
     .loss = bp_lv_loss,
     .accuracy = NULL},
    /* stochastic: minibatches */
    {.name = "logreg_mb",
     .title = "Logistic regression, breast cancer, batch 16",
     .data_file = "breast_cancer.csv",
     .batch = 16,
     .target = BP_LOGREG_TARGET,
     .has_accuracy = true,
     .setup = bp_logreg_mb_setup,
     .loss = bp_logreg_mb_loss,
     .accuracy = bp_logreg_mb_accuracy},
    {.name = "mlp_mb",
     .title = "MLP, digits, batch 32",
     .data_file = "digits.csv.gz",
     .batch = 32,
     .target = BP_MLP_TARGET,
     .has_accuracy = true,
     .setup = bp_mlp_mb_setup,
     .loss = bp_mlp_mb_loss,
     .accuracy = bp_mlp_mb_accuracy},
    {.name = "cnn_mb",
     .title = "CNN, digits, batch 32",
     .data_file = "digits.csv.gz",
     .batch = 32,
     .target = BP_MLP_TARGET,
     .has_accuracy = true,
     .setup = bp_cnn_setup,
     .loss = bp_cnn_loss,
     .accuracy = bp_cnn_accuracy},
    {.name = "char_gru",
     .title = "Character GRU, Tiny Shakespeare, batch 32",
     .data_file = "tinyshakespeare.txt.gz",
     .batch = 32,
     .target = BP_GRU_TARGET,
     .has_accuracy = true,
     .setup = bp_gru_setup,
     .loss = bp_gru_loss,
     .accuracy = bp_gru_accuracy},
    {.name = "noisy_quadratic",
     .title = "Noisy quadratic (DeepOBS), batch 128",
     .batch = 128,
     .target = BP_NQ_TARGET,
     .has_accuracy = false,
     .setup = bp_nq_setup,
     .loss = bp_nq_loss,
     .accuracy = NULL},
    {.name = "lotka_volterra_mb",
     .title = "Lotka-Volterra fit, noisy observations, batch 4",
     .batch = 4,
     .target = BP_LVN_TARGET,
     .has_accuracy = false,
     .setup = bp_lvn_setup,
     .loss = bp_lvn_loss,
     .accuracy = NULL},
};

const int bench_n_problems = (int)(sizeof bench_problems / sizeof bench_problems[0]);

const bench_problem *bench_problem_find(const char *name) {
    if (name == NULL) {
        return NULL;
    }
    for (int i = 0; i < bench_n_problems; i++) {
        if (strcmp(bench_problems[i].name, name) == 0) {
            return &bench_problems[i];
        }
    }
    return NULL;
}

/* ---- a cell's key, loss and step ---------------------------------------------------------- */

static uint32_t bp_fnv1a(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s != '\0'; s++) {
        h = (h ^ (uint8_t)*s) * 16777619u;
    }
    return h;
}

nb_status bench_cell_key(nb_ctx *ctx, const bench_problem *p, uint64_t seed, nb_array **out) {
    nb_array *k0 = NULL;
    nb_status st = nb_random_key(ctx, seed, &k0);
    if (st == NB_OK) {
        st = nb_random_fold_in(k0, bp_fnv1a(p->name), out);
    }
    nb_array_destroy(k0);
    return st;
}

/* loss(params, data); self = the problem's index (an int leaf). */
static nb_status bp_loss_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    int64_t i = -1;
    if (nb_tree_get_int(self, &i) != NB_OK || i < 0 || i >= bench_n_problems) {
        return nb_trace_fail(tr, NB_ERR_INVALID, "bench_loss: self is not a problem index");
    }
    const bench_problem *p = &bench_problems[i];
    return nb_return(p->loss(tr, nb_tree_child(args, 0), nb_tree_child(args, 1)), out);
}

nb_status bench_loss_fn(nb_ctx *ctx, const bench_problem *p, nb_fn **out) {
    nb_tree *idx = NULL;
    nb_status st = nb_tree_int(ctx, p - bench_problems, &idx);
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "bench_loss", bp_loss_body, idx, out);
    }
    nb_tree_destroy(idx);
    return st;
}

/* The loss's data: a tuple data (the empty one of the problems without data) is spread
 * into the loss's arguments by the step (nb_train_step), so the loss sees (params) for it. */
nb_status bench_step_fn(nb_ctx *ctx, const bench_problem *p, const nb_tree *opt, nb_fn **out) {
    nb_fn *loss = NULL;
    nb_status st = bench_loss_fn(ctx, p, &loss);
    if (st == NB_OK) {
        nb_train_opts to = nb_train_opts_default();
        to.jit.max_traces = 1;
        st = nb_train_step(loss, opt, &to, out);
    }
    nb_fn_destroy(loss);
    return st;
}

void bench_stream_destroy(bench_stream *s) {
    if (s == NULL) {
        return;
    }
    nb_tree_destroy(s->batch);
    nb_array_destroy(s->xb);
    nb_array_destroy(s->yb);
    nb_batcher_destroy(s->batcher);
    *s = (bench_stream){0};
}

/* a new array of a's dtype and shape with rows rows */
static nb_status bp_rows_like(nb_ctx *ctx, const nb_array *a, int64_t rows, nb_array **out) {
    int64_t shape[8];
    int r = nb_array_rank(a);
    if (r < 1 || r > 8) {
        return nb_tree_map_fail(ctx, NB_ERR_SHAPE, "bench_stream: a split's rows of rank %d", r);
    }
    for (int i = 0; i < r; i++) {
        shape[i] = nb_array_dim(a, i);
    }
    shape[0] = rows;
    return nb_array_zeros(ctx, nb_array_dtype(a), r, shape, out);
}

nb_status bench_stream_create(nb_ctx *ctx, const bench_problem *p, const nb_array *cell_key,
                              const nb_tree *data, bench_stream *s) {
    if (s == NULL) {
        return ctx != NULL ? nb_tree_map_fail(ctx, NB_ERR_MISUSE, "bench_stream: s is NULL")
                           : NB_ERR_MISUSE;
    }
    *s = (bench_stream){0};
    const nb_tree *train = data != NULL ? nb_tree_get(data, "train") : NULL;
    const nb_array *x = train != NULL ? nb_tree_get_array(nb_tree_get(train, "x")) : NULL;
    if (ctx == NULL || p == NULL || p->batch <= 0 || cell_key == NULL || x == NULL) {
        return ctx != NULL ? nb_tree_map_fail(ctx, NB_ERR_MISUSE,
                                              "bench_stream: a stochastic problem, its cell key "
                                              "and its data (with train.x) are needed")
                           : NB_ERR_MISUSE;
    }
    const nb_array *y = nb_tree_get_array(nb_tree_get(train, "y")); /* NULL: no labels */
    nb_array *k = NULL;
    nb_status st = nb_random_fold_in(cell_key, BENCH_STREAM_BATCH, &k);
    if (st == NB_OK) {
        st = nb_batcher_create(x, y, k, p->batch, NULL, &s->batcher);
    }
    nb_array_destroy(k);
    if (st == NB_OK) {
        st = bp_rows_like(ctx, x, p->batch, &s->xb);
    }
    if (st == NB_OK && y != NULL) {
        st = bp_rows_like(ctx, y, p->batch, &s->yb);
    }
    /* the minibatch: train's dict with x (and y) replaced by the minibatch's rows */
    int64_t n = nb_tree_len(train);
    const char *keys[8];
    nb_tree *items[8] = {0};
    if (st == NB_OK && (n < 1 || n > 8)) {
        st = nb_tree_map_fail(ctx, NB_ERR_STRUCTURE,
                              "bench_stream: %s's train split has %" PRId64 " entries (1 to 8)",
                              p->name, n);
    }
    for (int64_t i = 0; i < n && st == NB_OK; i++) {
        keys[i] = nb_tree_key(train, i);
        const nb_tree *c = nb_tree_child(train, i);
        if (strcmp(keys[i], "x") == 0) {
            st = nb_tree_array(s->xb, &items[i]);
        } else if (strcmp(keys[i], "y") == 0) {
            st = nb_tree_array(s->yb, &items[i]);
        } else {
            items[i] = nb_tree_retain((nb_tree *)c);
        }
    }
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, n, keys, items, &s->batch);
    }
    for (int64_t i = 0; i < n && i < 8; i++) {
        nb_tree_destroy(items[i]);
    }
    s->epoch = 0;
    s->taken = 0;
    if (st != NB_OK) {
        bench_stream_destroy(s);
    }
    return st;
}

nb_status bench_stream_next(bench_stream *s) {
    if (s == NULL || s->batcher == NULL) {
        return NB_ERR_MISUSE;
    }
    int64_t rows = 0;
    nb_status st = nb_batcher_next(s->batcher, s->xb, s->yb, &rows);
    if (st == NB_OK && rows == 0) {
        s->epoch++;
        s->taken = 0;
        st = nb_batcher_epoch(s->batcher, s->epoch);
        if (st == NB_OK) {
            st = nb_batcher_next(s->batcher, s->xb, s->yb, &rows);
        }
    }
    if (st == NB_OK) {
        s->taken++;
    }
    return st;
}

/* ---- the tuning protocol ------------------------------------------------------------------ */

/* lr ranges: the default grid of nabla bench widened a decade each way */
static const bench_space bp_spaces[] = {
    {"sgd", 1e-5, 1.0, false, false, false, false, false, false},
    {"momentum", 1e-5, 1.0, false, false, false, false, true, false},
    {"nesterov", 1e-5, 1.0, false, false, false, false, true, false},
    {"adam", 1e-5, 1.0, true, true, true, false, false, false},
    {"adamw", 1e-5, 1.0, true, true, true, true, false, false},
    {"rmsprop", 1e-5, 1.0, false, false, true, false, false, true},
    {"adagrad", 1e-4, 10.0, false, false, false, false, false, false},
    {"lion", 1e-5, 1.0, true, true, false, true, false, false},
    {"lamb", 1e-5, 1.0, true, true, true, true, false, false},
};

const bench_space *bench_optim_space(const char *name) {
    for (size_t i = 0; name != NULL && i < sizeof bp_spaces / sizeof bp_spaces[0]; i++) {
        if (strcmp(bp_spaces[i].name, name) == 0) {
            return &bp_spaces[i];
        }
    }
    return NULL;
}

/* LU(lo, hi; u) rounded to 6 significant digits */
static double bp_log_uniform(double lo, double hi, double u) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.6g", exp(log(lo) + u * (log(hi) - log(lo))));
    return strtod(buf, NULL);
}

/* 1 - LU(lo, hi; u), rounded likewise */
static double bp_one_minus(double lo, double hi, double u) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.6g", 1.0 - exp(log(lo) + u * (log(hi) - log(lo))));
    return strtod(buf, NULL);
}

nb_status bench_trial(nb_ctx *ctx, const char *name, uint64_t seed, int64_t t, bench_hp *out) {
    const bench_space *s = bench_optim_space(name);
    if (ctx == NULL || out == NULL || s == NULL || t < 0 || t > (int64_t)UINT32_MAX) {
        return ctx != NULL ? nb_tree_map_fail(ctx, NB_ERR_MISUSE,
                                              "bench_trial: an optimizer of nabla bench ('%s' is "
                                              "not one), a trial in 0 .. 2^32-1 and an output",
                                              name != NULL ? name : "(null)")
                           : NB_ERR_MISUSE;
    }
    nb_array *k0 = NULL, *k1 = NULL, *k2 = NULL, *u = NULL;
    nb_status st = nb_random_key(ctx, seed, &k0);
    if (st == NB_OK) {
        st = nb_random_fold_in(k0, bp_fnv1a(name), &k1);
    }
    if (st == NB_OK) {
        st = nb_random_fold_in(k1, (uint32_t)t, &k2);
    }
    if (st == NB_OK) {
        st = nb_random_uniform(k2, NB_DTYPE_F64, 1, (int64_t[]){5}, 0.0, 1.0, &u);
    }
    if (st == NB_OK) {
        const double *v = nb_array_data(u);
        *out = (bench_hp){NAN, NAN, NAN, NAN, NAN, NAN, NAN};
        out->lr = bp_log_uniform(s->lr_lo, s->lr_hi, v[0]);
        if (s->b1) {
            out->b1 = bp_one_minus(1e-3, 0.5, v[1]);
        }
        if (s->momentum) {
            out->momentum = bp_one_minus(1e-3, 0.5, v[1]);
        }
        if (s->decay) {
            out->decay = bp_one_minus(1e-3, 0.5, v[1]);
        }
        if (s->b2) {
            out->b2 = bp_one_minus(1e-4, 0.1, v[2]);
        }
        if (s->eps) {
            out->eps = bp_log_uniform(1e-10, 1e-5, v[3]);
        }
        if (s->weight_decay) {
            out->weight_decay = bp_log_uniform(1e-5, 0.1, v[4]);
        }
    }
    nb_array *all[] = {k0, k1, k2, u};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        nb_array_destroy(all[i]);
    }
    return st;
}

nb_status bench_step_donate(nb_ctx *ctx, nb_tree **out) {
    nb_tree *t = NULL, *f = NULL;
    nb_status st = nb_tree_bool(ctx, true, &t);
    if (st == NB_OK) {
        st = nb_tree_bool(ctx, false, &f);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 3, (nb_tree *[]){t, t, f}, out);
    }
    nb_tree_destroy(t);
    nb_tree_destroy(f);
    return st;
}

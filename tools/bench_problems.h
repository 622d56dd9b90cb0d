/*
 * bench_problems.h -- the problems of `nabla bench` (bench_problems.c).
 *
 * A problem is a loss over a pytree of parameters, with fixed data. For one cell of the
 * suite (problem, optimizer, learning rate, seed) the driver (bench.c) calls setup once
 * with the cell's key, then traces
 *     step(params, state, data) = value_and_grad(loss)(params, data), optimizer update,
 *                                  apply_updates                          (jitted, donated)
 *     eval(params, data)        = (loss(params, data), accuracy(params, data))
 * and runs `steps` steps: full-batch, or (batch > 0) each on the next minibatch of
 * bench_stream, eval then taking one split at a time (train_eval, valid, test). Everything a
 * problem needs at run time is in the data tree (arrays) or in the problem itself (static
 * settings); problems hold no mutable state, so cells may run on several threads at once, each in
 * its own context.
 */
#ifndef NABLA_TOOLS_BENCH_PROBLEMS_H
#define NABLA_TOOLS_BENCH_PROBLEMS_H

#include <nabla/nabla.h>

#include <stdbool.h>

typedef struct bench_problem {
    const char *name;      /* on the command line and in file names: "rosenbrock2" */
    const char *title;     /* in tables and plots: "Rosenbrock 2-D" */
    double target;         /* the loss "steps to target" counts to (loss <= target) */
    bool has_accuracy;     /* accuracy() exists: the test accuracy of a classifier */
    const char *data_file; /* the file under data_dir that setup reads, or NULL */
    /* 0: a full-batch problem. > 0: a stochastic one, whose every step's loss is on `batch`
     * rows of its training split drawn by bench_stream (below); setup's data is then
     * dict(train, valid, test, train_eval), each split a dict(x[, y]) of rows (train_eval:
     * a copy of the first min(n_train, n_test) training rows), and loss and accuracy
     * take one split (or a minibatch, the same dict with `batch` rows) as their data. */
    int64_t batch;
    /* The cell's starting parameters and its data (both new trees in ctx; data may be an
     * empty tuple). key: an i32[2] Threefry key that depends on the seed and the problem
     * only, so every optimizer and learning rate starts from the same point on the same
     * data. data_dir holds the UCI CSV files. Errors: a status with the context's message
     * (a missing data file: NB_ERR_IO naming it). */
    nb_status (*setup)(nb_ctx *ctx, const char *data_dir, const nb_array *key, nb_tree **params,
                       nb_tree **data);
    /* Inside a trace: the training loss, a 0-d f32 or f64 var, of params (a var tree with
     * setup's structure) on data (likewise). Sticky errors as every traced function. */
    nb_var *(*loss)(nb_trace *tr, const nb_tree *params, const nb_tree *data);
    /* Inside a trace: the test accuracy in [0, 1] as a 0-d var (NULL when !has_accuracy). */
    nb_var *(*accuracy)(nb_trace *tr, const nb_tree *params, const nb_tree *data);
} bench_problem;

/* Every problem, in the suite's order. */
extern const bench_problem bench_problems[];
extern const int bench_n_problems;

/* The problem named name, or NULL. */
const bench_problem *bench_problem_find(const char *name);

/* What every user of the problems (nabla bench, bench_suite, the tests) builds a cell from:
 *   bench_cell_key   the cell's key: fold_in(key(seed), FNV-1a of the problem's name) -- the
 *                    same for every optimizer and learning rate
 *   bench_loss_fn    loss(params, data) -> the 0-d loss, as a function
 *   bench_step_fn    step(params, state, data) -> (params, state, loss): value_and_grad of
 *                    the loss, opt's update, apply_updates; jitted, one trace allowed (a
 *                    retrace is an error, not a slowdown)
 *   bench_step_donate  (true, true, false): the step's params and state donated
 * Each returns a new reference, or a status with the context's message. */
nb_status bench_cell_key(nb_ctx *ctx, const bench_problem *p, uint64_t seed, nb_array **out);
nb_status bench_loss_fn(nb_ctx *ctx, const bench_problem *p, nb_fn **out);
nb_status bench_step_fn(nb_ctx *ctx, const bench_problem *p, const nb_tree *opt, nb_fn **out);
nb_status bench_step_donate(nb_ctx *ctx, nb_tree **out);

/* A stochastic problem's minibatches. The stream's key is fold_in(cell key,
 * BENCH_STREAM_BATCH): the same minibatches for every optimizer and learning rate of a seed
 * (common random numbers). Epoch e (0, 1, ...) visits the training rows in the order
 * p_e = nb_random_permutation(fold_in(stream key, e), n_train) (nabla/data.h's batcher):
 * minibatch i of epoch e is rows p_e[i batch] .. p_e[(i + 1) batch - 1] of data.train, and
 * the n_train % batch rows left at an epoch's end are skipped. So step k (0, 1, ...) takes
 * minibatch k % B of epoch k / B, B = n_train / batch. */
#define BENCH_STREAM_BATCH 5

typedef struct bench_stream {
    nb_batcher *batcher;
    nb_array *xb, *yb;    /* the current minibatch's rows (yb NULL without labels) */
    nb_tree *batch;       /* dict(x = xb[, y = yb]): what the step takes as its data */
    int64_t epoch, taken; /* the epoch, and the minibatches taken in it */
} bench_stream;

/* Create the stream of problem p (p->batch > 0) over data.train, positioned before step 0;
 * *s is zeroed first, so bench_stream_destroy may follow a failure. */
nb_status bench_stream_create(nb_ctx *ctx, const bench_problem *p, const nb_array *cell_key,
                              const nb_tree *data, bench_stream *s);
/* Copy the next step's minibatch into s->xb and s->yb (starting the next epoch when one
 * ends). Never allocates. */
nb_status bench_stream_next(bench_stream *s);
void bench_stream_destroy(bench_stream *s);

/* ---- the tuning protocol (nabla bench --tune random:K[:SEED]) ----------------------------
 * Trial t (0, 1, ...) of an optimizer draws its hyperparameters from log-uniform search
 * spaces (Schmidt, Schneider and Hennig, "Descending through a crowded valley", ICML 2021,
 * tune this way; these are our ranges): with u = nb_random_uniform(fold_in(fold_in(
 * key(SEED), fnv1a(optimizer name)), t), f64, [5], 0, 1) (the same list for every problem),
 * LU(lo, hi; u) = exp(log lo + u (log hi - log lo)), each value then rounded to 6
 * significant digits (as it is printed):
 *   lr            = LU(lr_lo, lr_hi; u0)   the optimizer's range (bench_optim_space)
 *   b1 / momentum = 1 - LU(1e-3, 0.5; u1)  (adam, adamw, lamb, lion: b1; momentum,
 *                                           nesterov: momentum; rmsprop: decay)
 *   b2            = 1 - LU(1e-4, 0.1; u2)  (adam, adamw, lamb, lion)
 *   eps           = LU(1e-10, 1e-5; u3)    (adam, adamw, lamb, rmsprop)
 *   weight_decay  = LU(1e-5, 0.1; u4)      (adamw, lamb, lion)
 * What an optimizer does not draw keeps Optax's default (NAN here). */
typedef struct bench_hp {
    double lr, b1, b2, eps, weight_decay, momentum, decay; /* NAN: the default */
} bench_hp;

typedef struct bench_space {
    const char *name; /* "adam" */
    double lr_lo, lr_hi;
    bool b1, b2, eps, weight_decay, momentum, decay; /* which are drawn */
} bench_space;

/* The search space of the optimizer named name (the nine of nabla bench), or NULL. */
const bench_space *bench_optim_space(const char *name);
/* Trial t (0 <= t < 2^32) of optimizer name drawn with key(seed). */
nb_status bench_trial(nb_ctx *ctx, const char *name, uint64_t seed, int64_t t, bench_hp *out);

#endif

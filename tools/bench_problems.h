/*
 * bench_problems.h -- the problems of `nabla bench` (bench_problems.c).
 *
 * A problem is a loss over a pytree of parameters, with fixed data. For one cell of the
 * suite (problem, optimizer, learning rate, seed) the driver (bench.c) calls setup once
 * with the cell's key, then traces
 *     step(params, state, data) = value_and_grad(loss)(params, data), optimizer update,
 *                                  apply_updates                          (jitted, donated)
 *     eval(params, data)        = (loss(params, data), accuracy(params, data))
 * and runs `steps` full-batch steps. Everything a problem needs at run time is in the data
 * tree (arrays) or in the problem itself (static settings); problems hold no mutable
 * state, so cells may run on several threads at once, each in its own context.
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

#endif

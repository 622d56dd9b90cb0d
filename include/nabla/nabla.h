/*
 * nabla.h -- differentiable programming in C17.
 *
 * Overview
 * --------
 * nabla gives C programs what JAX, Equinox, Optax and Diffrax give Python: reverse-mode
 * automatic differentiation over n-d arrays, composable optimizers and differentiable
 * loops with checkpointing. A user function is written once against symbolic values,
 * traced into an IR, transformed (grad, jvp, loop reversal), compiled into a fixed list of
 * kernels over one planned workspace, cached, and run many times.
 *
 * The modules, one header each (this header includes them all):
 *     nabla/core.h   -- version, status codes, the context (allocator, errors, logging)
 *     nabla/array.h  -- dense n-d host arrays: f32, f64, i32, i64, bool; rank 0..8
 *     nabla/tree.h   -- pytrees: lists, tuples and dicts of arrays and static values,
 *                       flatten/unflatten, map, filter/partition/combine, diff, paths
 *     nabla/trace.h  -- symbolic values (nb_var) and the primitive ops that build the IR
 *     nabla/fn.h     -- functions, filtered jit, the compile cache, trace accounting
 *     nabla/ad.h     -- grad, value_and_grad, vjp, jvp (filtered: null slots)
 *     nabla/data.h   -- data sets: CSV (plain or gzip), train/test split, standardising,
 *                       shuffled minibatches from a key
 *     nabla/random.h -- Threefry-2x32 keys and samplers, eager and traced (as jax.random)
 *     nabla/loops.h  -- while_loop, fori_loop, scan, cond, switch inside traces, with
 *                       closure conversion and Equinox's loop kinds
 *     nabla/optim.h  -- optimizers as gradient transformations (Optax's), schedules,
 *                       apply_updates; state from the gradient template
 *     nabla/train.h  -- the training step in one call: value_and_grad, update and
 *                       apply_updates jitted once, params and state donated
 *     nabla/nn.h     -- layers as pytrees (Linear, MLP, LayerNorm, Embedding, Dropout,
 *                       Conv2d, Sequential) with Equinox's initialisation
 *     nabla/linalg.h -- solve, LU, Cholesky, triangular solves, slogdet, inverse: batched,
 *                       differentiable, failures as values
 *     nabla/ode.h    -- diffeqsolve (Diffrax's): Runge-Kutta solvers, PID step control,
 *                       dense output, adjoints through checkpointed loops
 *     nabla/io.h     -- pytrees on disk: safetensors files (atomic writes, validated reads)
 *
 * Rules that hold everywhere (details in core.h):
 *     - every fallible call returns an nb_status; results come back in out-parameters;
 *     - after a failure nb_ctx_errmsg(ctx) names the function, the leaf path, the shapes
 *       and the fix; nothing is printed unless you install a log callback;
 *     - what a call returns is yours to destroy; what you pass in is borrowed;
 *     - a context and everything made from it are used by one thread at a time.
 *
 * Worked example
 * --------------
 * Build a model's parameters as a pytree, look at it, and update every float leaf. The
 * program is complete (tests/docs/doc_examples.sh extracts, compiles and runs it):
 * build it with `cc -std=c17 tree.c $(pkg-config --cflags --libs nabla) -lm`.
 *
 * [example tree.c]
 *     #include <nabla/nabla.h>
 *
 *     #include <math.h>  // tanh
 *     #include <stdio.h> // stdout, fprintf
 *
 *     static nb_status halve(void *ud, const char *path, int n,
 *                            const nb_tree *const *leaves, nb_tree **out) {
 *         (void)ud; (void)path; (void)n;
 *         nb_array *a = nb_tree_get_array(leaves[0]), *b = NULL;   // borrowed
 *         nb_status st = nb_array_copy(a, &b);
 *         if (st != NB_OK) return st;
 *         float *p = nb_array_data(b);
 *         for (int64_t i = 0; i < nb_array_size(b); i++) p[i] *= 0.5f;
 *         st = nb_tree_array(b, out);       // the leaf takes its own reference
 *         nb_array_destroy(b);
 *         return st;
 *     }
 *
 *     int main(void) {
 *         nb_ctx *ctx = NULL;
 *         if (nb_ctx_create(NULL, &ctx) != NB_OK) return 1;
 *         nb_array *w = NULL, *b = NULL;
 *         nb_tree *lw = NULL, *lb = NULL, *act = NULL, *model = NULL, *half = NULL;
 *         nb_status st = nb_array_ones(ctx, NB_DTYPE_F32, 2, (int64_t[]){32, 2}, &w);
 *         if (st == NB_OK) st = nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){32}, &b);
 *         if (st == NB_OK) st = nb_tree_array(w, &lw);
 *         if (st == NB_OK) st = nb_tree_array(b, &lb);
 *         if (st == NB_OK) st = nb_tree_fnref(ctx, (nb_fnptr)tanh, "tanh", &act);
 *         if (st == NB_OK)
 *             st = nb_tree_dict(ctx, 3, (const char *[]){"weight", "bias", "act"},
 *                               (nb_tree *[]){lw, lb, act}, &model);
 *         if (st == NB_OK) st = nb_tree_map(model, halve, NULL, 0, &half);
 *         if (st == NB_OK) st = nb_tree_fprint_leaves(half, stdout);
 *         //   weight: f32[32,2]
 *         //   bias: f32[32]
 *         if (st != NB_OK) fprintf(stderr, "%s\n", nb_ctx_errmsg(ctx));
 *         nb_tree_destroy(half); nb_tree_destroy(model); nb_tree_destroy(act);
 *         nb_tree_destroy(lb); nb_tree_destroy(lw);
 *         nb_array_destroy(b); nb_array_destroy(w);
 *         nb_ctx_destroy(ctx);
 *         return st == NB_OK ? 0 : 1;
 *     }
 * [end of example]
 *
 * The static leaf "act" is part of the tree's structure (its treedef) and is carried
 * through the map unchanged; the two arrays are its dynamic leaves. The tracing, grad,
 * jit and optimizer modules build on exactly these trees.
 */
#ifndef NABLA_H
#define NABLA_H

#include "ad.h"
#include "array.h"
#include "core.h"
#include "data.h"
#include "fn.h"
#include "io.h"
#include "linalg.h"
#include "loops.h"
#include "nn.h"
#include "ode.h"
#include "optim.h"
#include "random.h"
#include "trace.h"
#include "train.h"
#include "tree.h"

#endif /* NABLA_H */

/*
 * nabla/train.h -- the training step in one call: value_and_grad of a loss, an optimizer's
 * update and apply_updates, jitted once, with parameters and optimizer state donated.
 *
 * Every training program writes the same step: a body that calls value_and_grad, then
 * nb_optim_update and nb_apply_updates, returns (params, state, loss[, aux]), and is jitted
 * and called with params and state donated. nb_train_step builds exactly that function
 * (the same IR, so the same bits as the hand-written step), and nb_train_run calls it in
 * one line:
 *
 *     nb_fn *loss = NULL, *step = NULL;   // loss((params, x, y)) -> f32[] (or (loss, aux))
 *     nb_fn_create(ctx, "loss", loss_body, NULL, &loss);
 *     nb_train_step(loss, opt, NULL, &step);
 *     nb_train_init(step, params, &state);
 *     for (...) nb_train_run(step, &params, &state, batch, &l, NULL);
 *
 * The loss is called as in JAX's value_and_grad(loss)(params, *batch): its arguments are
 * the tuple (params, b_0, ..., b_k-1) for a batch that is a tuple or list of k items,
 * (params, batch) for any other batch tree (an array leaf, a dict), and (params) for a NULL
 * batch. The gradient is taken with respect to params (filter_spec: as nb_grad_opts).
 */
#ifndef NABLA_TRAIN_H
#define NABLA_TRAIN_H

#include "core.h"
#include "fn.h"
#include "tree.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_train_opts {
    /* The loss returns (loss, aux); the step returns aux as well (nb_train_run's *aux). */
    bool has_aux;
    /* nb_grad_opts.filter_spec: NULL trains every float leaf of params; a tree of bools
     * shaped like params (or a prefix of it) freezes the leaves under false: their gradient
     * and update are null, and nb_train_init's state has null there. Retained. */
    const nb_tree *filter_spec;
    /* nb_train_run donates params and state (default true): the step writes the new values
     * into the old arrays, which the caller must not hold other references to expect
     * unchanged. false: new arrays each step, the old ones left as they were. */
    bool donate;
    /* How the step is jitted (default nb_jit_opts_default(): any number of traces -- a new
     * batch shape retraces -- and the automatic native tier). */
    nb_jit_opts jit;
} nb_train_opts;

NB_API nb_train_opts nb_train_opts_default(void);

/* step = jit(train_step(loss, opt)): step((params, state, batch)) returns the tuple
 * (params', state', loss) -- or (params', state', loss, aux) with has_aux -- where
 * (loss[, aux]), grads = value_and_grad(loss)(params, *batch), (updates, state') =
 * nb_optim_update(opt, grads, state, params), params' = nb_apply_updates(params, updates).
 * loss and opt are borrowed and retained (opt is compared by value: an equal optimizer
 * built again shares the compiled step). A new reference; NULL opts for the defaults.
 * Errors: NB_ERR_MISUSE (NULL or destroyed arguments, another context), NB_ERR_INVALID
 * (opt is not an optimizer), NB_ERR_OOM. Errors in the loss surface at the first call. */
NB_API nb_status nb_train_step(nb_fn *loss, const nb_tree *opt, const nb_train_opts *opts,
                               nb_fn **out);

/* The optimizer state for params: nb_optim_init(opt, nb_grad_template(params, filter_spec))
 * with the step's opt and filter spec. *state is a new tree. */
NB_API nb_status nb_train_init(const nb_fn *step, const nb_tree *params, nb_tree **state);

/* One step: calls step on (*params, *state, batch) -- donating both unless the step was
 * built with donate = false -- and replaces *params and *state with the results (the old
 * references are released, on success only: on an error both are left as they were). loss
 * (may be NULL) receives the loss as a double (0 on failure); aux (may be NULL; must be
 * NULL without has_aux) a new reference to the step's aux. batch may be NULL (a loss of
 * params only). Errors: NB_ERR_MISUSE (NULL or destroyed arguments, aux without has_aux),
 * NB_ERR_INVALID (step is not a training step), and whatever the loss's trace or the step's
 * run reports (a shape error inside the loss, NB_ERR_RETRACE with jit.max_traces, ...). */
NB_API nb_status nb_train_run(nb_fn *step, nb_tree **params, nb_tree **state, const nb_tree *batch,
                              double *loss, nb_tree **aux);

/* A metric in one call: f on (params, *batch) -- the loss's argument convention above --
 * compiled once per signature and served from the cache after (f may be the loss itself, or
 * an accuracy; jit it with nb_jit for options). *out is f's output (a new reference).
 * Errors: NB_ERR_MISUSE for NULL or destroyed arguments, and f's own. */
NB_API nb_status nb_train_eval(nb_fn *f, const nb_tree *params, const nb_tree *batch,
                               nb_tree **out);

#ifdef __cplusplus
}
#endif
#endif /* NABLA_TRAIN_H */

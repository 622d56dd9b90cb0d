/*
 * nabla/optim.h -- optimizers as gradient transformations (Optax's model), schedules and
 * apply_updates.
 *
 * An optimizer is a value: a pytree made by the constructors below. It has two operations,
 *     init(template)                  -> state
 *     update(grads, state, params)    -> (updates, new_state)
 * and params are then moved with apply_updates(params, updates). update runs inside a trace
 * (nb_optim_update), so loss, gradient, update and apply compile into one executable; it
 * also runs eagerly (nb_optim_update_eager), through the same code.
 *
 * The state is built from the gradient template (nb_grad_template in nabla/ad.h): the tree
 * grad returns, with null where a leaf has no gradient (integer and bool arrays, static
 * leaves, frozen parameters). A null slot gets null state, update maps null to null, and the
 * new state always has exactly the structure, dtypes and shapes of the old one -- nabla
 * checks it. A state built from the parameters instead of the template is refused by init
 * when the parameters have a leaf the template has null at (an integer, static or frozen
 * one); grads that do not match the state (one made for another filter spec, say) are
 * NB_ERR_STRUCTURE at update. Both name the first differing path and the fix, never a
 * silent retrace.
 *
 * Hyperparameters live in the state. Every float hyperparameter (learning rate, betas, eps,
 * weight decay, momentum, ...) is an f64 0-d array in state "hyper" dicts, and the step count
 * is an i32 0-d array: changing a learning rate between steps (nb_optim_set_hyper) or running
 * a schedule never recompiles. The optimizer tree itself holds only static leaves (kind,
 * flags, schedules, masks) and the hyperparameters' initial values as f64 0-d arrays, which
 * init copies into the state; update reads the state's. So two optimizers made with equal
 * settings have equal treedefs (no retrace when an optimizer is re-created), and even ones
 * with different learning rates compile to the same executable.
 *
 * Formulas and defaults are Optax's (optax 0.2, github.com/google-deepmind/optax,
 * optax/_src/{alias,transform,clipping,schedule}.py). With g the incoming update, t the step
 * count after increment (1 on the first step), and every moment initialised to 0:
 *   sgd(lr; momentum m = 0 (none), nesterov)   tr = g + m tr; u = nesterov ? g + m tr : tr;
 *                                               -lr u (no momentum: -lr g)
 *   adam(lr; b1 .9, b2 .999, eps 1e-8, eps_root 0, nesterov)
 *       mu = (1-b1) g + b1 mu; nu = (1-b2) g^2 + b2 nu;
 *       mu^ = mu / (1 - b1^t) (nesterov: b1 mu / (1 - b1^(t+1)) + (1-b1) g / (1 - b1^t));
 *       nu^ = nu / (1 - b2^t); u = -lr mu^ / (sqrt(nu^ + eps_root) + eps)
 *   adamw(lr; adam's, weight_decay 1e-4, mask)  adam's direction d; u = -lr (d + wd p)
 *   rmsprop(lr; decay .9, eps 1e-8, initial_scale 0, eps_in_sqrt true, centered false,
 *           momentum 0, nesterov, bias_correction false)
 *       nu = (1-decay) g^2 + decay nu (from initial_scale); centered: mu = (1-decay) g + decay mu;
 *       v = nu^ (- mu^^2 when centered), hats by bias correction when asked;
 *       d = eps_in_sqrt ? g rsqrt(v + eps) : g / (sqrt(v) + eps); then -lr d, then the momentum
 *       trace as in sgd (applied after the learning rate, as Optax).
 *   adagrad(lr; initial_accumulator_value .1, eps 1e-7)
 *       s = s + g^2 (from the initial value); u = -lr (s > 0 ? g rsqrt(s + eps) : 0)
 *   lion(lr; b1 .9, b2 .99, weight_decay 1e-3, mask)
 *       d = sign((1-b1) g + b1 mu); mu = (1-b2) g + b2 mu; u = -lr (d + wd p)
 *   lamb(lr; b1 .9, b2 .999, eps 1e-6, eps_root 0, weight_decay 0, mask)
 *       adam's direction d, d += wd p, then per leaf r = ||p|| / ||d|| (1 where either norm
 *       is 0), u = -lr r d
 *   clip(max_delta)                 u = min(max(g, -max_delta), max_delta)
 *   clip_by_global_norm(max_norm)   n = sqrt(sum over leaves of sum g^2) (in f64);
 *                                   u = n < max_norm ? g : g / n * max_norm
 *   add_decayed_weights(wd, mask)   u = g + wd p
 *   scale_by_schedule(s)            u = g s(count) (count before increment: 0 first)
 *   masked(inner, mask)             inner on the leaves where mask is true; others unchanged
 *   chain(t1, ..., tn)              t1 first; state is the tuple of their states
 * Every optimizer takes its learning rate as a constant or a schedule (opts.schedule),
 * evaluated at the count before the increment (0 on the first step). Divisions by the
 * bias corrections are multiplications by their reciprocals, computed once per step in f64
 * (as PyTorch's step-size form): the same values to rounding, and no per-element divide.
 *
 * Schedules (Optax's, count c):
 *   constant(v)                                  v
 *   linear(v0, v1, steps, begin)                 polynomial with power 1
 *   polynomial(v0, v1, power, steps, begin)      k = clip(c - begin, 0, steps);
 *                                                (v0 - v1) (1 - k/steps)^power + v1
 *   cosine_decay(v0, steps, alpha, exponent)     k = min(c, steps);
 *                                                v0 ((1-alpha) (0.5 (1 + cos(pi k/steps)))^exponent
 *                                                    + alpha)
 *   warmup_cosine_decay(v0, peak, warm, steps, end, exponent)
 *                                                linear(v0, peak, warm) for c < warm, then
 *                                                cosine_decay(peak, steps - warm, end/peak,
 *                                                exponent) at c - warm
 *   exponential_decay(v0, steps, rate, begin, staircase, end)
 *                                                k = c - begin; v0 rate^(k/steps) (floored
 *                                                when staircase), v0 while k <= 0; bounded by
 *                                                end (a floor when rate < 1, a ceiling when
 *                                                rate > 1) unless end is NaN
 *   piecewise_constant(v0, boundaries, scales)   v0 times every scale whose boundary <= c
 * Schedules are trees of static leaves; values are computed in f64.
 *
 * Layout (stable; nb_tree_format shows it): an optimizer is dict(transform="adam", ...static
 * flags, hyper=dict(learning_rate=f64[], b1=f64[], ...), schedule=null | schedule); its
 * state is dict(count=i32[], hyper=dict(...), <moments>...) where each moment has the
 * template's structure; chain's state is a tuple of its parts' states; masked's is
 * dict(inner=state).
 *
 * Statuses (eager functions): NB_OK; NB_ERR_MISUSE for NULL or destroyed handles;
 * NB_ERR_INVALID for bad settings (a negative learning rate, b1 outside [0, 1), ...) with a
 * message naming the optimizer and the setting, and for a schedule, mask or part made in
 * another context than ctx (or than inner, for nb_optim_masked); NB_ERR_STRUCTURE for trees
 * that do not fit; NB_ERR_OOM. Traced functions follow the trace's sticky-error rule
 * (nabla/trace.h).
 */
#ifndef NABLA_OPTIM_H
#define NABLA_OPTIM_H

#include "array.h"
#include "core.h"
#include "trace.h"
#include "tree.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- schedules ---------------------------------------------------------------------- */
/* Each returns a new tree (static leaves only). NB_ERR_INVALID for non-finite values or
 * negative step counts. */
NB_API nb_status nb_schedule_constant(nb_ctx *ctx, double value, nb_tree **out);
NB_API nb_status nb_schedule_linear(nb_ctx *ctx, double init_value, double end_value,
                                    int64_t transition_steps, int64_t transition_begin,
                                    nb_tree **out);
NB_API nb_status nb_schedule_polynomial(nb_ctx *ctx, double init_value, double end_value,
                                        double power, int64_t transition_steps,
                                        int64_t transition_begin, nb_tree **out);
/* decay_steps > 0; alpha in [0, 1]; exponent (Optax default 1). */
NB_API nb_status nb_schedule_cosine_decay(nb_ctx *ctx, double init_value, int64_t decay_steps,
                                          double alpha, double exponent, nb_tree **out);
/* decay_steps > warmup_steps >= 0 (decay_steps counts the warmup, as Optax); peak != 0. */
NB_API nb_status nb_schedule_warmup_cosine_decay(nb_ctx *ctx, double init_value, double peak_value,
                                                 int64_t warmup_steps, int64_t decay_steps,
                                                 double end_value, double exponent, nb_tree **out);
/* transition_steps > 0, decay_rate > 0; end_value NAN for no bound. */
NB_API nb_status nb_schedule_exponential_decay(nb_ctx *ctx, double init_value,
                                               int64_t transition_steps, double decay_rate,
                                               int64_t transition_begin, bool staircase,
                                               double end_value, nb_tree **out);
/* n >= 0 strictly increasing boundaries, each with its scale (NB_ERR_INVALID for n < 0;
 * NB_ERR_MISUSE for NULL boundaries or scales with n > 0). */
NB_API nb_status nb_schedule_piecewise_constant(nb_ctx *ctx, double init_value, int n,
                                                const int64_t *boundaries, const double *scales,
                                                nb_tree **out);
/* The schedule's value at count (a 0-d integer var) as an f64 0-d var, inside a trace. */
NB_API nb_var *nb_schedule_eval(nb_trace *tr, const nb_tree *schedule, nb_var *count);
/* The same, eagerly (the traced code run through the cache, so the very same numbers). */
NB_API nb_status nb_schedule_value(const nb_tree *schedule, int64_t count, double *out);

/* ---- optimizers --------------------------------------------------------------------- */
/* Settings. A NAN field (or NULL pointer / false) means the optimizer's Optax default, listed
 * above; fields an optimizer does not use must stay at their default. */
typedef struct nb_optim_opts {
    const nb_tree *schedule; /* learning-rate schedule instead of the constant (borrowed) */
    double momentum;         /* sgd, rmsprop: NAN or 0 = no momentum */
    bool nesterov;           /* sgd, rmsprop (with momentum), adam */
    double b1, b2, eps, eps_root;
    double weight_decay;   /* adamw, lion, lamb */
    const nb_tree *mask;   /* adamw, lion, lamb: where weight decay applies (bool tree) */
    double decay;          /* rmsprop */
    double initial_scale;  /* rmsprop: nu's initial value; adagrad: the initial accumulator */
    bool centered;         /* rmsprop */
    bool eps_outside_sqrt; /* rmsprop: g / (sqrt(nu) + eps) instead of g rsqrt(nu + eps) */
    bool bias_correction;  /* rmsprop */
} nb_optim_opts;

NB_API nb_optim_opts nb_optim_opts_default(void);

/* Each returns a new optimizer tree. opts may be NULL (all defaults). */
NB_API nb_status nb_optim_sgd(nb_ctx *ctx, double learning_rate, const nb_optim_opts *opts,
                              nb_tree **out);
NB_API nb_status nb_optim_adam(nb_ctx *ctx, double learning_rate, const nb_optim_opts *opts,
                               nb_tree **out);
NB_API nb_status nb_optim_adamw(nb_ctx *ctx, double learning_rate, const nb_optim_opts *opts,
                                nb_tree **out);
NB_API nb_status nb_optim_rmsprop(nb_ctx *ctx, double learning_rate, const nb_optim_opts *opts,
                                  nb_tree **out);
NB_API nb_status nb_optim_adagrad(nb_ctx *ctx, double learning_rate, const nb_optim_opts *opts,
                                  nb_tree **out);
NB_API nb_status nb_optim_lion(nb_ctx *ctx, double learning_rate, const nb_optim_opts *opts,
                               nb_tree **out);
NB_API nb_status nb_optim_lamb(nb_ctx *ctx, double learning_rate, const nb_optim_opts *opts,
                               nb_tree **out);
NB_API nb_status nb_optim_clip(nb_ctx *ctx, double max_delta, nb_tree **out);
NB_API nb_status nb_optim_clip_by_global_norm(nb_ctx *ctx, double max_norm, nb_tree **out);
/* mask may be NULL (everywhere). */
NB_API nb_status nb_optim_add_decayed_weights(nb_ctx *ctx, double weight_decay, const nb_tree *mask,
                                              nb_tree **out);
NB_API nb_status nb_optim_scale_by_schedule(nb_ctx *ctx, const nb_tree *schedule, nb_tree **out);
/* mask: a tree of bool leaves with the grads' node structure, or a prefix of it (a bool at
 * a node covers its subtree). Borrowed; stored by value. */
NB_API nb_status nb_optim_masked(const nb_tree *inner, const nb_tree *mask, nb_tree **out);
/* n >= 1 parts, applied in order (an array of nb_tree * or const nb_tree *: nb_tree_items in
 * nabla/tree.h). */
NB_API nb_status nb_optim_chain(nb_ctx *ctx, int n, nb_tree_items parts, nb_tree **out);

/* The optimizer's state for template (the tree nb_grad_template gives: zero arrays where
 * there is a gradient, null elsewhere). Eager: a new tree of new arrays. template must hold
 * only float arrays and nulls (and nodes): a leaf where a gradient template has null -- an
 * integer or bool array, a static leaf, a frozen leaf -- is the parameters given in place of
 * their template, NB_ERR_STRUCTURE with a message naming the first such path, what is there
 * and the fix, e.g.
 *     nb_optim_init: the template has frozen f32[2,1] at layers[1].weight, where a gradient
 *     template has null (is it the parameters instead of their gradient template?) -- build
 *     the state from nb_grad_template(params, filter_spec)
 * (parameters that are all float arrays and trainable are their own template and are
 * accepted). NB_ERR_INVALID for an opt that is not an optimizer or a template of symbolic
 * values; NB_ERR_MISUSE; NB_ERR_OOM. */
NB_API nb_status nb_optim_init(const nb_tree *opt, const nb_tree *template_, nb_tree **state);

/* The same inside a trace: template's leaves may be vars or arrays (float ones, as above:
 * the same NB_ERR_STRUCTURE otherwise, recorded on the trace); the state's moments are
 * new vars, its hyperparameters opt's (vars when opt came in as an argument, constants when
 * they are arrays). Owned by the trace; NULL after a sticky error. */
NB_API const nb_tree *nb_optim_init_in(nb_trace *tr, const nb_tree *opt, const nb_tree *template_);

/* Inside a trace: the updates (grads' structure; null where grads are null) and the new
 * state (state's structure, dtypes and shapes) for grads. opt may be the optimizer tree
 * itself or the var tree a body received for it; state likewise (array leaves are used as
 * constants). params is needed by adamw, lion, lamb and add_decayed_weights (else may be
 * NULL); it has the parameters' structure (grads' nulls are skipped). The outputs are owned
 * by the trace. Returns NB_OK or the trace's sticky status (outputs NULL then): grads that
 * do not fit the state are NB_ERR_STRUCTURE with a message like
 *     nb_optim_update (adam): grads and state.mu differ at layers[1].count: null vs i32[] --
 *     build the state from the gradient template: nb_optim_init(opt, nb_grad_template(params))
 */
NB_API nb_status nb_optim_update(nb_trace *tr, const nb_tree *opt, const nb_tree *grads,
                                 const nb_tree *state, const nb_tree *params,
                                 const nb_tree **updates, const nb_tree **new_state);
/* params + updates inside a trace: the sum (in the parameter's dtype) where the update is an
 * array, the parameter where it is null; static and null leaves of params are kept. The
 * result is owned by the trace (NULL after a sticky error). */
NB_API const nb_tree *nb_apply_updates(nb_trace *tr, const nb_tree *params, const nb_tree *updates);

/* Eager versions (each a compiled function through the cache: one trace per signature).
 * New trees of new arrays. */
NB_API nb_status nb_optim_update_eager(const nb_tree *opt, const nb_tree *grads,
                                       const nb_tree *state, const nb_tree *params,
                                       nb_tree **updates, nb_tree **new_state);
NB_API nb_status nb_apply_updates_eager(const nb_tree *params, const nb_tree *updates,
                                        nb_tree **out);

/* Hyperparameters in a state: every "hyper" entry named name (in every part of a chain)
 * set to value, in place (the state's 0-d arrays are written). value must pass the check the
 * optimizer's constructor applies to that setting (learning_rate finite and >= 0; b1, b2 in
 * [0, 1), or [0, 1] for lion; decay in [0, 1); momentum in [0, 1]; eps, eps_root,
 * weight_decay, max_delta finite and >= 0 (add_decayed_weights' weight_decay: any finite
 * value); max_norm finite and > 0): else NB_ERR_INVALID with the constructor's message
 * (prefixed nb_optim_set_hyper), and the state is left unchanged -- every entry of a chain
 * is checked before any is written. The state does not name its transforms: each entry's
 * transform is known from the names in its hyper dict. NB_ERR_NOT_FOUND when the state has
 * no such entry (the message says where to look); NB_ERR_MISUSE. Never allocates. */
NB_API nb_status nb_optim_set_hyper(const nb_tree *state, const char *name, double value);
/* The first such entry's value. */
NB_API nb_status nb_optim_get_hyper(const nb_tree *state, const char *name, double *value);
/* The step count of the state (its first count leaf). */
NB_API nb_status nb_optim_count(const nb_tree *state, int64_t *count);

#ifdef __cplusplus
}
#endif

#ifdef NB_TREE_ITEMS_UNION /* see nb_tree_items in nabla/tree.h */
#define nb_optim_chain(...) (__extension__ nb_optim_chain(__VA_ARGS__))
#endif
#endif /* NABLA_OPTIM_H */

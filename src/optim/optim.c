/*
 * optim.c -- gradient transformations (nabla/optim.h): constructors, init from the gradient
 * template, the traced update with its structure checks, apply_updates and hyperparameters.
 *
 * update works on flat leaf lists: the grads are flattened once (their treedef, nulls
 * included, is the reference every state moment must have), each transformation maps the
 * current updates leaf by leaf, and moments are unflattened with the same treedef. masked
 * runs its inner transformation on the sub-list of masked leaves, with the treedef of the
 * grads where the other leaves are null (what its state was initialised from).
 */
#include "optim/optim_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- the dict builder ------------------------------------------------------------- */

nbo_builder nbo_builder_make(nb_ctx *ctx) {
    nbo_builder b;
    memset(&b, 0, sizeof b);
    b.ctx = ctx;
    b.st = ctx == NULL ? NB_ERR_MISUSE : NB_OK;
    return b;
}

void nbo_put_take(nbo_builder *b, const char *key, nb_tree *t) {
    if (b->st != NB_OK || t == NULL || b->n >= NBO_BUILDER_MAX) {
        if (b->st == NB_OK) {
            b->st = t == NULL ? NB_ERR_OOM : NB_ERR_INTERNAL;
        }
        nb_tree_destroy(t);
        return;
    }
    b->keys[b->n] = key;
    b->items[b->n++] = t;
}

void nbo_put_tree(nbo_builder *b, const char *key, const nb_tree *t) {
    nbo_put_take(b, key, nb_tree_retain((nb_tree *)t));
}

static void nbo_put_st(nbo_builder *b, const char *key, nb_status st, nb_tree *t) {
    if (st != NB_OK && b->st == NB_OK) {
        b->st = st;
    }
    nbo_put_take(b, key, st == NB_OK ? t : NULL);
}

void nbo_put_string(nbo_builder *b, const char *key, const char *value) {
    nb_tree *t = NULL;
    nb_status st = b->st == NB_OK ? nb_tree_string(b->ctx, value, &t) : b->st;
    nbo_put_st(b, key, st, t);
}

void nbo_put_float(nbo_builder *b, const char *key, double value) {
    nb_tree *t = NULL;
    nb_status st = b->st == NB_OK ? nb_tree_float(b->ctx, value, &t) : b->st;
    nbo_put_st(b, key, st, t);
}

void nbo_put_int(nbo_builder *b, const char *key, int64_t value) {
    nb_tree *t = NULL;
    nb_status st = b->st == NB_OK ? nb_tree_int(b->ctx, value, &t) : b->st;
    nbo_put_st(b, key, st, t);
}

void nbo_put_bool(nbo_builder *b, const char *key, bool value) {
    nb_tree *t = NULL;
    nb_status st = b->st == NB_OK ? nb_tree_bool(b->ctx, value, &t) : b->st;
    nbo_put_st(b, key, st, t);
}

void nbo_put_null(nbo_builder *b, const char *key) {
    nb_tree *t = NULL;
    nb_status st = b->st == NB_OK ? nb_tree_null(b->ctx, &t) : b->st;
    nbo_put_st(b, key, st, t);
}

void nbo_put_f64(nbo_builder *b, const char *key, double value) {
    if (b->st != NB_OK) {
        return;
    }
    nb_array *a = NULL;
    nb_tree *t = NULL;
    nb_status st = nb_array_scalar(b->ctx, NB_DTYPE_F64, value, &a);
    if (st == NB_OK) {
        st = nb_tree_array(a, &t);
    }
    nb_array_destroy(a);
    nbo_put_st(b, key, st, t);
}

nb_status nbo_builder_dict(nbo_builder *b, nb_tree **out) {
    nb_status st = b->st;
    if (st == NB_OK) {
        st = nb_tree_dict(b->ctx, b->n, b->keys, b->items, out);
    }
    for (int i = 0; i < b->n; i++) {
        nb_tree_destroy(b->items[i]);
    }
    b->n = 0;
    return st;
}

/* ---- constructors ------------------------------------------------------------------ */

nb_status nbo_out_args(nb_ctx *ctx, const char *fn, nb_tree **out, const char *what) {
    if (out != NULL) {
        *out = NULL;
    }
    if (ctx == NULL) {
        return NB_ERR_MISUSE; /* nowhere to say so */
    }
    if (out == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_tree * to receive the %s)", fn,
                       what);
    }
    return NB_OK;
}

/* A tree argument t (may be NULL when optional) of a constructor taking ctx: live, and made
 * in ctx. arg names it in messages. */
static nb_status nbo_tree_in(nb_ctx *ctx, const char *fn, const char *arg, const nb_tree *t,
                             bool optional) {
    if (t == NULL && optional) {
        return NB_OK;
    }
    nb_status st = nbi_check_handle_in(ctx, t, NBI_MAGIC_TREE, fn, arg);
    if (st == NB_OK && nb_tree_ctx(t) != ctx) {
        st = nbi_err(ctx, NB_ERR_INVALID,
                     "%s: %s belongs to another context than ctx (each context's arrays and trees "
                     "stay in it) -- make it in the same context",
                     fn, arg);
    }
    return st;
}

/* The context a NULL ctx should have been: the first of two optional handles that has one
 * (for the message; NULL when neither does). */
static const void *nbo_ctx_hint(const void *a, const void *b) {
    return nbi_handle_ctx(a) != NULL ? a : b;
}

nb_optim_opts nb_optim_opts_default(void) {
    nb_optim_opts o;
    memset(&o, 0, sizeof o);
    o.momentum = NAN;
    o.b1 = NAN;
    o.b2 = NAN;
    o.eps = NAN;
    o.eps_root = NAN;
    o.weight_decay = NAN;
    o.decay = NAN;
    o.initial_scale = NAN;
    return o;
}

static double nbo_or(double v, double dflt) {
    return isnan(v) ? dflt : v;
}

/* Check that fields an optimizer does not use are left at their defaults. */
typedef enum {
    NBO_F_MOMENTUM = 1 << 0,
    NBO_F_NESTEROV = 1 << 1,
    NBO_F_B1 = 1 << 2,
    NBO_F_B2 = 1 << 3,
    NBO_F_EPS = 1 << 4,
    NBO_F_EPS_ROOT = 1 << 5,
    NBO_F_WD = 1 << 6,
    NBO_F_MASK = 1 << 7,
    NBO_F_DECAY = 1 << 8,
    NBO_F_INIT = 1 << 9,
    NBO_F_RMS = 1 << 10 /* centered, eps_outside_sqrt, bias_correction */
} nbo_fields;

static nb_status nbo_check_fields(nb_ctx *ctx, const char *who, const nb_optim_opts *o,
                                  unsigned used) {
    /* the handles first: a destroyed one is misuse whatever the optimizer uses */
    nb_status st = nbo_tree_in(ctx, who, "opts->schedule", o->schedule, true);
    if (st == NB_OK) {
        st = nbo_tree_in(ctx, who, "opts->mask", o->mask, true);
    }
    if (st != NB_OK) {
        return st;
    }
    struct {
        unsigned bit;
        bool set;
        const char *name;
    } f[] = {
        {NBO_F_MOMENTUM, !isnan(o->momentum), "momentum"},
        {NBO_F_NESTEROV, o->nesterov, "nesterov"},
        {NBO_F_B1, !isnan(o->b1), "b1"},
        {NBO_F_B2, !isnan(o->b2), "b2"},
        {NBO_F_EPS, !isnan(o->eps), "eps"},
        {NBO_F_EPS_ROOT, !isnan(o->eps_root), "eps_root"},
        {NBO_F_WD, !isnan(o->weight_decay), "weight_decay"},
        {NBO_F_MASK, o->mask != NULL, "mask"},
        {NBO_F_DECAY, !isnan(o->decay), "decay"},
        {NBO_F_INIT, !isnan(o->initial_scale), "initial_scale"},
        {NBO_F_RMS, o->centered || o->eps_outside_sqrt || o->bias_correction,
         "centered/eps_outside_sqrt/bias_correction"},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (f[i].set && !(used & f[i].bit)) {
            return nbi_err(ctx, NB_ERR_INVALID,
                           "%s: option '%s' is not a setting of this optimizer (leave it at "
                           "its nb_optim_opts_default value)",
                           who, f[i].name);
        }
    }
    if (o->schedule != NULL) {
        if (nb_tree_get(o->schedule, "schedule") == NULL) {
            return nbi_err(ctx, NB_ERR_INVALID,
                           "%s: opts.schedule is not a schedule (make it with nb_schedule_*)", who);
        }
    }
    return NB_OK;
}

static nb_status nbo_check_range(nb_ctx *ctx, const char *who, const char *name, double v,
                                 double lo, double hi, bool hi_open) {
    if (!isfinite(v) || v < lo || v > hi || (hi_open && v == hi)) {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: %s = %g must be in [%g, %g%c", who, name, v, lo,
                       hi, hi_open ? ')' : ']');
    }
    return NB_OK;
}

/* ---- hyperparameter rules ------------------------------------------------------------
 * One rule per hyperparameter name, applied both by the constructors (to the values they
 * store in "hyper") and by nb_optim_set_hyper (to the value written into a state), so a value
 * one refuses the other refuses too, with the same status and message. kind is the transform
 * ("adam", "lion", ...): a few names have another range in one transform (b1, b2 may be 1 in
 * lion; add_decayed_weights' weight_decay may be negative). */

typedef enum {
    NBO_RULE_LR,       /* finite and >= 0, with a word on the sign convention */
    NBO_RULE_UNIT,     /* [0, 1] */
    NBO_RULE_UNIT_LT1, /* [0, 1) */
    NBO_RULE_NONNEG,   /* finite and >= 0 */
    NBO_RULE_POSITIVE, /* finite and > 0 */
    NBO_RULE_FINITE    /* any finite value */
} nbo_rule;

/* name, the transform it applies to (NULL: any), the rule; the first match wins. */
static const struct {
    const char *name, *kind;
    nbo_rule rule;
} nbo_rules[] = {
    {"learning_rate", NULL, NBO_RULE_LR},
    {"momentum", NULL, NBO_RULE_UNIT},
    {"decay", NULL, NBO_RULE_UNIT_LT1},
    {"b1", "lion", NBO_RULE_UNIT},
    {"b2", "lion", NBO_RULE_UNIT},
    {"b1", NULL, NBO_RULE_UNIT_LT1},
    {"b2", NULL, NBO_RULE_UNIT_LT1},
    {"eps", NULL, NBO_RULE_NONNEG},
    {"eps_root", NULL, NBO_RULE_NONNEG},
    {"weight_decay", "add_decayed_weights", NBO_RULE_FINITE}, /* negative grows the weights */
    {"weight_decay", NULL, NBO_RULE_NONNEG},
    {"max_delta", NULL, NBO_RULE_NONNEG},
    {"max_norm", NULL, NBO_RULE_POSITIVE},
};

/* The rule for hyperparameter name of transform kind applied to v. */
static nb_status nbo_check_hyper(nb_ctx *ctx, const char *who, const char *kind, const char *name,
                                 double v) {
    nbo_rule rule = NBO_RULE_FINITE;
    for (size_t i = 0; i < sizeof nbo_rules / sizeof nbo_rules[0]; i++) {
        if (strcmp(nbo_rules[i].name, name) == 0 &&
            (nbo_rules[i].kind == NULL || strcmp(nbo_rules[i].kind, kind) == 0)) {
            rule = nbo_rules[i].rule;
            break;
        }
    }
    switch (rule) {
    case NBO_RULE_LR:
        if (!isfinite(v) || v < 0.0) {
            return nbi_err(ctx, NB_ERR_INVALID,
                           "%s: learning_rate = %g must be finite and >= 0 (updates are -lr "
                           "times the direction)",
                           who, v);
        }
        return NB_OK;
    case NBO_RULE_UNIT:
    case NBO_RULE_UNIT_LT1:
        return nbo_check_range(ctx, who, name, v, 0.0, 1.0, rule == NBO_RULE_UNIT_LT1);
    case NBO_RULE_NONNEG:
    case NBO_RULE_POSITIVE: {
        nb_status st = nbo_check_range(ctx, who, name, v, 0.0, INFINITY, false);
        if (st == NB_OK && rule == NBO_RULE_POSITIVE && v == 0.0) {
            st = nbi_err(ctx, NB_ERR_INVALID, "%s: %s must be > 0", who, name);
        }
        return st;
    }
    case NBO_RULE_FINITE:
        break;
    }
    return nbo_check_range(ctx, who, name, v, -INFINITY, INFINITY, false);
}

/* Check n (name, value) pairs of transform kind; the first failure. */
static nb_status nbo_check_hypers(nb_ctx *ctx, const char *who, const char *kind, int n,
                                  const char *const *names, const double *values) {
    nb_status st = NB_OK;
    for (int i = 0; i < n && st == NB_OK; i++) {
        st = nbo_check_hyper(ctx, who, kind, names[i], values[i]);
    }
    return st;
}

/* The common head: transform name, learning rate (hyper or schedule). */
static void nbo_head(nbo_builder *b, const char *kind) {
    nbo_put_string(b, "transform", kind);
}

static nb_status nbo_lr(nb_ctx *ctx, const char *who, double lr, const nb_optim_opts *o) {
    return o->schedule == NULL ? nbo_check_hyper(ctx, who, "", "learning_rate", lr) : NB_OK;
}

/* hyper dict from (name, value) pairs; the learning rate first unless a schedule has it. */
static void nbo_put_hyper(nbo_builder *b, const nb_optim_opts *o, double lr, int n,
                          const char *const *names, const double *values) {
    nbo_builder h = nbo_builder_make(b->ctx);
    if (o == NULL || o->schedule == NULL) {
        nbo_put_f64(&h, "learning_rate", lr);
    }
    for (int i = 0; i < n; i++) {
        nbo_put_f64(&h, names[i], values[i]);
    }
    nb_tree *t = NULL;
    nb_status st = nbo_builder_dict(&h, &t);
    nbo_put_st(b, "hyper", st, t);
    if (o == NULL || o->schedule == NULL) {
        nbo_put_null(b, "schedule");
    } else {
        nbo_put_tree(b, "schedule", o->schedule);
    }
}

static const nb_optim_opts *nbo_opts(const nb_optim_opts *opts, nb_optim_opts *tmp) {
    if (opts == NULL) {
        *tmp = nb_optim_opts_default();
        return tmp;
    }
    return opts;
}

/* The entry of an optimizer constructor: a NULL ctx is reported on the context of a schedule
 * or mask in opts (when there is one), a NULL out on ctx, then opts' fields. */
static nb_status nbo_begin(nb_ctx *ctx, const char *name, const nb_optim_opts *opts,
                           nb_tree **out) {
    if (ctx == NULL) {
        if (out != NULL) {
            *out = NULL;
        }
        return nbi_err_null_ctx(opts != NULL ? nbo_ctx_hint(opts->schedule, opts->mask) : NULL,
                                name);
    }
    return nbo_out_args(ctx, name, out, "optimizer");
}

#define NBO_BEGIN(name, used)                                                                      \
    nb_status st = nbo_begin(ctx, name, opts, out);                                                \
    if (st != NB_OK) {                                                                             \
        return st;                                                                                 \
    }                                                                                              \
    nb_optim_opts tmp_;                                                                            \
    const nb_optim_opts *o = nbo_opts(opts, &tmp_);                                                \
    st = nbo_check_fields(ctx, name, o, used);                                                     \
    if (st == NB_OK) {                                                                             \
        st = nbo_lr(ctx, name, learning_rate, o);                                                  \
    }                                                                                              \
    if (st != NB_OK) {                                                                             \
        return st;                                                                                 \
    }

nb_status nb_optim_sgd(nb_ctx *ctx, double learning_rate, const nb_optim_opts *opts,
                       nb_tree **out) {
    NBO_BEGIN("nb_optim_sgd", NBO_F_MOMENTUM | NBO_F_NESTEROV)
    double m = nbo_or(o->momentum, 0.0);
    if ((st = nbo_check_hyper(ctx, "nb_optim_sgd", "sgd", "momentum", m)) != NB_OK) {
        return st;
    }
    if (o->nesterov && m == 0.0) {
        return nbi_err(ctx, NB_ERR_INVALID, "nb_optim_sgd: nesterov needs a momentum > 0");
    }
    nbo_builder b = nbo_builder_make(ctx);
    nbo_head(&b, "sgd");
    nbo_put_bool(&b, "momentum", m != 0.0);
    nbo_put_bool(&b, "nesterov", o->nesterov);
    nbo_put_hyper(&b, o, learning_rate, m != 0.0 ? 1 : 0, (const char *[]){"momentum"},
                  (double[]){m});
    return nbo_builder_dict(&b, out);
}

static nb_status nbo_adam_like(nb_ctx *ctx, const char *kind, const char *who, double learning_rate,
                               const nb_optim_opts *o, double eps_dflt, double wd_dflt, bool has_wd,
                               nb_tree **out) {
    double b1 = nbo_or(o->b1, 0.9), b2 = nbo_or(o->b2, 0.999);
    double eps = nbo_or(o->eps, eps_dflt), eps_root = nbo_or(o->eps_root, 0.0);
    double wd = nbo_or(o->weight_decay, wd_dflt);
    const char *names[] = {"b1", "b2", "eps", "eps_root", "weight_decay"};
    const double values[] = {b1, b2, eps, eps_root, wd};
    nb_status st = nbo_check_hypers(ctx, who, kind, has_wd ? 5 : 4, names, values);
    if (st != NB_OK) {
        return st;
    }
    nbo_builder b = nbo_builder_make(ctx);
    nbo_head(&b, kind);
    nbo_put_bool(&b, "nesterov", o->nesterov);
    if (has_wd) {
        if (o->mask != NULL) {
            nbo_put_tree(&b, "mask", o->mask);
        } else {
            nbo_put_null(&b, "mask");
        }
    }
    nbo_put_hyper(&b, o, learning_rate, has_wd ? 5 : 4, names, values);
    return nbo_builder_dict(&b, out);
}

nb_status nb_optim_adam(nb_ctx *ctx, double learning_rate, const nb_optim_opts *opts,
                        nb_tree **out) {
    NBO_BEGIN("nb_optim_adam", NBO_F_B1 | NBO_F_B2 | NBO_F_EPS | NBO_F_EPS_ROOT | NBO_F_NESTEROV)
    return nbo_adam_like(ctx, "adam", "nb_optim_adam", learning_rate, o, 1e-8, 0.0, false, out);
}

nb_status nb_optim_adamw(nb_ctx *ctx, double learning_rate, const nb_optim_opts *opts,
                         nb_tree **out) {
    NBO_BEGIN("nb_optim_adamw", NBO_F_B1 | NBO_F_B2 | NBO_F_EPS | NBO_F_EPS_ROOT | NBO_F_NESTEROV |
                                    NBO_F_WD | NBO_F_MASK)
    return nbo_adam_like(ctx, "adamw", "nb_optim_adamw", learning_rate, o, 1e-8, 1e-4, true, out);
}

nb_status nb_optim_lamb(nb_ctx *ctx, double learning_rate, const nb_optim_opts *opts,
                        nb_tree **out) {
    NBO_BEGIN("nb_optim_lamb",
              NBO_F_B1 | NBO_F_B2 | NBO_F_EPS | NBO_F_EPS_ROOT | NBO_F_WD | NBO_F_MASK)
    return nbo_adam_like(ctx, "lamb", "nb_optim_lamb", learning_rate, o, 1e-6, 0.0, true, out);
}

nb_status nb_optim_rmsprop(nb_ctx *ctx, double learning_rate, const nb_optim_opts *opts,
                           nb_tree **out) {
    NBO_BEGIN("nb_optim_rmsprop",
              NBO_F_DECAY | NBO_F_EPS | NBO_F_INIT | NBO_F_RMS | NBO_F_MOMENTUM | NBO_F_NESTEROV)
    const char *who = "nb_optim_rmsprop";
    double decay = nbo_or(o->decay, 0.9), eps = nbo_or(o->eps, 1e-8);
    double init = nbo_or(o->initial_scale, 0.0), m = nbo_or(o->momentum, 0.0);
    st = nbo_check_hyper(ctx, who, "rmsprop", "decay", decay);
    if (st == NB_OK) {
        st = nbo_check_hyper(ctx, who, "rmsprop", "eps", eps);
    }
    if (st == NB_OK) {
        st = nbo_check_range(ctx, who, "initial_scale", init, 0.0, INFINITY, false);
    }
    if (st == NB_OK) {
        st = nbo_check_hyper(ctx, who, "rmsprop", "momentum", m);
    }
    if (st == NB_OK && o->nesterov && m == 0.0) {
        st = nbi_err(ctx, NB_ERR_INVALID, "%s: nesterov needs a momentum > 0", who);
    }
    if (st != NB_OK) {
        return st;
    }
    nbo_builder b = nbo_builder_make(ctx);
    nbo_head(&b, "rmsprop");
    nbo_put_bool(&b, "centered", o->centered);
    nbo_put_bool(&b, "eps_outside_sqrt", o->eps_outside_sqrt);
    nbo_put_bool(&b, "bias_correction", o->bias_correction);
    nbo_put_bool(&b, "momentum", m != 0.0);
    nbo_put_bool(&b, "nesterov", o->nesterov);
    nbo_put_float(&b, "initial_scale", init);
    nbo_put_hyper(&b, o, learning_rate, m != 0.0 ? 3 : 2,
                  (const char *[]){"decay", "eps", "momentum"}, (double[]){decay, eps, m});
    return nbo_builder_dict(&b, out);
}

nb_status nb_optim_adagrad(nb_ctx *ctx, double learning_rate, const nb_optim_opts *opts,
                           nb_tree **out) {
    NBO_BEGIN("nb_optim_adagrad", NBO_F_EPS | NBO_F_INIT)
    double eps = nbo_or(o->eps, 1e-7), init = nbo_or(o->initial_scale, 0.1);
    st = nbo_check_hyper(ctx, "nb_optim_adagrad", "adagrad", "eps", eps);
    if (st == NB_OK) {
        st = nbo_check_range(ctx, "nb_optim_adagrad", "initial_scale (initial accumulator)", init,
                             0.0, INFINITY, false);
    }
    if (st != NB_OK) {
        return st;
    }
    nbo_builder b = nbo_builder_make(ctx);
    nbo_head(&b, "adagrad");
    nbo_put_float(&b, "initial_scale", init);
    nbo_put_hyper(&b, o, learning_rate, 1, (const char *[]){"eps"}, (double[]){eps});
    return nbo_builder_dict(&b, out);
}

nb_status nb_optim_lion(nb_ctx *ctx, double learning_rate, const nb_optim_opts *opts,
                        nb_tree **out) {
    NBO_BEGIN("nb_optim_lion", NBO_F_B1 | NBO_F_B2 | NBO_F_WD | NBO_F_MASK)
    double b1 = nbo_or(o->b1, 0.9), b2 = nbo_or(o->b2, 0.99), wd = nbo_or(o->weight_decay, 1e-3);
    const char *names[] = {"b1", "b2", "weight_decay"};
    const double values[] = {b1, b2, wd};
    st = nbo_check_hypers(ctx, "nb_optim_lion", "lion", 3, names, values);
    if (st != NB_OK) {
        return st;
    }
    nbo_builder b = nbo_builder_make(ctx);
    nbo_head(&b, "lion");
    if (o->mask != NULL) {
        nbo_put_tree(&b, "mask", o->mask);
    } else {
        nbo_put_null(&b, "mask");
    }
    nbo_put_hyper(&b, o, learning_rate, 3, names, values);
    return nbo_builder_dict(&b, out);
}

/* Transforms without a learning rate: hyper holds their own values only. */
static nb_status nbo_simple(nb_ctx *ctx, const char *kind, int n, const char *const *names,
                            const double *values, const nb_tree *mask, const nb_tree *schedule,
                            nb_tree **out) {
    nbo_builder b = nbo_builder_make(ctx);
    nbo_head(&b, kind);
    if (strcmp(kind, "add_decayed_weights") == 0) {
        if (mask != NULL) {
            nbo_put_tree(&b, "mask", mask);
        } else {
            nbo_put_null(&b, "mask");
        }
    }
    nbo_builder h = nbo_builder_make(ctx);
    for (int i = 0; i < n; i++) {
        nbo_put_f64(&h, names[i], values[i]);
    }
    nb_tree *t = NULL;
    nb_status st = nbo_builder_dict(&h, &t);
    nbo_put_st(&b, "hyper", st, t);
    if (schedule != NULL) {
        nbo_put_tree(&b, "schedule", schedule);
    } else {
        nbo_put_null(&b, "schedule");
    }
    return nbo_builder_dict(&b, out);
}

nb_status nb_optim_clip(nb_ctx *ctx, double max_delta, nb_tree **out) {
    nb_status st = nbo_out_args(ctx, "nb_optim_clip", out, "optimizer");
    if (st != NB_OK) {
        return st;
    }
    st = nbo_check_hyper(ctx, "nb_optim_clip", "clip", "max_delta", max_delta);
    return st != NB_OK ? st
                       : nbo_simple(ctx, "clip", 1, (const char *[]){"max_delta"},
                                    (double[]){max_delta}, NULL, NULL, out);
}

nb_status nb_optim_clip_by_global_norm(nb_ctx *ctx, double max_norm, nb_tree **out) {
    nb_status st = nbo_out_args(ctx, "nb_optim_clip_by_global_norm", out, "optimizer");
    if (st != NB_OK) {
        return st;
    }
    st = nbo_check_hyper(ctx, "nb_optim_clip_by_global_norm", "clip_by_global_norm", "max_norm",
                         max_norm);
    return st != NB_OK ? st
                       : nbo_simple(ctx, "clip_by_global_norm", 1, (const char *[]){"max_norm"},
                                    (double[]){max_norm}, NULL, NULL, out);
}

nb_status nb_optim_add_decayed_weights(nb_ctx *ctx, double weight_decay, const nb_tree *mask,
                                       nb_tree **out) {
    static const char fn[] = "nb_optim_add_decayed_weights";
    if (ctx == NULL) {
        if (out != NULL) {
            *out = NULL;
        }
        return nbi_err_null_ctx(mask, fn); /* the mask knows the context */
    }
    nb_status st = nbo_out_args(ctx, fn, out, "optimizer");
    if (st == NB_OK) {
        st = nbo_tree_in(ctx, fn, "mask", mask, true);
    }
    if (st == NB_OK) {
        st = nbo_check_hyper(ctx, fn, "add_decayed_weights", "weight_decay", weight_decay);
    }
    return st != NB_OK ? st
                       : nbo_simple(ctx, "add_decayed_weights", 1, (const char *[]){"weight_decay"},
                                    (double[]){weight_decay}, mask, NULL, out);
}

nb_status nb_optim_scale_by_schedule(nb_ctx *ctx, const nb_tree *schedule, nb_tree **out) {
    static const char fn[] = "nb_optim_scale_by_schedule";
    if (ctx == NULL) {
        if (out != NULL) {
            *out = NULL;
        }
        return nbi_err_null_ctx(schedule, fn); /* the schedule knows the context */
    }
    nb_status st = nbo_out_args(ctx, fn, out, "optimizer");
    if (st == NB_OK) {
        st = nbo_tree_in(ctx, fn, "schedule", schedule, false);
    }
    if (st != NB_OK) {
        return st;
    }
    if (nb_tree_get(schedule, "schedule") == NULL) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "nb_optim_scale_by_schedule: not a schedule (make it with nb_schedule_*)");
    }
    return nbo_simple(ctx, "scale_by_schedule", 0, NULL, NULL, NULL, schedule, out);
}

static const char *nbo_kind(const nb_tree *opt) {
    const char *k = NULL;
    if (nb_tree_kind_of(opt) != NB_TREE_KIND_DICT ||
        nb_tree_get_string(nb_tree_get(opt, "transform"), &k) != NB_OK) {
        return NULL;
    }
    return k;
}

nb_status nb_optim_masked(const nb_tree *inner, const nb_tree *mask, nb_tree **out) {
    static const char fn[] = "nb_optim_masked";
    if (out != NULL) {
        *out = NULL;
    }
    nb_status st = nbi_check_handle_in(nbi_handle_ctx(mask), inner, NBI_MAGIC_TREE, fn, "inner");
    if (st != NB_OK) {
        return st;
    }
    nb_ctx *ctx = nb_tree_ctx(inner);
    st = nbo_out_args(ctx, fn, out, "optimizer");
    if (st == NB_OK) {
        st = nbo_tree_in(ctx, fn, "mask", mask, false);
    }
    if (st != NB_OK) {
        return st;
    }
    if (nbo_kind(inner) == NULL) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "nb_optim_masked: inner is not an optimizer (make it with nb_optim_*)");
    }
    nbo_builder b = nbo_builder_make(ctx);
    nbo_head(&b, "masked");
    nbo_put_tree(&b, "inner", inner);
    nbo_put_tree(&b, "mask", mask);
    return nbo_builder_dict(&b, out);
}

/* (name): the name is also a macro (tree.h, nb_tree_items) */
nb_status(nb_optim_chain)(nb_ctx *ctx, int n, nb_tree_items parts_in, nb_tree **out) {
    static const char fn[] = "nb_optim_chain";
    const nb_tree *const *parts = NB_TREE_ITEMS_PTR(parts_in);
    if (ctx == NULL) {
        if (out != NULL) {
            *out = NULL;
        }
        /* the parts know the context: say there what is wrong */
        const nb_tree *other = NULL;
        for (int i = 0; parts != NULL && i < n && other == NULL; i++) {
            other = nbi_handle_ctx(parts[i]) != NULL ? parts[i] : NULL;
        }
        return nbi_err_null_ctx(other, fn);
    }
    nb_status st = nbo_out_args(ctx, fn, out, "optimizer");
    if (st != NB_OK) {
        return st;
    }
    if (n < 1) {
        return nbi_err(ctx, NB_ERR_INVALID, "nb_optim_chain: n is %d; it needs at least one part",
                       n);
    }
    if (parts == NULL) {
        return nbi_err_null(ctx, fn, "parts", "pass an array of n optimizers, applied in order");
    }
    if (n > 64) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "nb_optim_chain: %d parts (at most 64; chain chains "
                       "to nest more)",
                       n);
    }
    for (int i = 0; i < n; i++) {
        char arg[32];
        snprintf(arg, sizeof arg, "parts[%d]", i);
        st = nbo_tree_in(ctx, fn, arg, parts[i], false);
        if (st != NB_OK) {
            return st;
        }
        if (nbo_kind(parts[i]) == NULL) {
            return nbi_err(ctx, NB_ERR_INVALID,
                           "nb_optim_chain: part %d is not an optimizer (make it with nb_optim_*)",
                           i);
        }
    }
    nb_tree *tuple = NULL;
    st = nb_tree_tuple(ctx, n, parts, &tuple);
    nbo_builder b = nbo_builder_make(ctx);
    nbo_head(&b, "chain");
    nbo_put_st(&b, "parts", st, tuple);
    return nbo_builder_dict(&b, out);
}

/* ---- masks --------------------------------------------------------------------------- */

/* Walk tree t with mask m (a bool tree of t's node structure, or a prefix of it). For every
 * dynamic leaf of t, in order, flags[k++] = its mask value (flags may be NULL); *out (may be
 * NULL) is t with the dynamic leaves whose mask is false replaced by null. */
typedef struct nbo_mask {
    nb_ctx *ctx;
    const char *who;
    bool *flags;
    int64_t k;
    char path[NB_PATH_MAX];
} nbo_mask;

static nb_status nbo_mask_rec(nbo_mask *w, const nb_tree *t, const nb_tree *m, int have, bool val,
                              nb_tree **out) {
    if (!have) {
        nb_tree_kind mk = nb_tree_kind_of(m);
        if (mk == NB_TREE_KIND_BOOL) {
            nb_tree_get_bool(m, &val);
            have = 1;
        } else if (mk != NB_TREE_KIND_LIST && mk != NB_TREE_KIND_TUPLE && mk != NB_TREE_KIND_DICT) {
            return nbi_err(w->ctx, NB_ERR_STRUCTURE,
                           "%s: the mask holds %s at %s; a mask has bool leaves (true: the "
                           "transformation applies there), or nodes shaped like the grads",
                           w->who, nb_tree_kind_name(mk), w->path[0] ? w->path : "<root>");
        }
    }
    nb_tree_kind tk = nb_tree_kind_of(t);
    bool node = tk == NB_TREE_KIND_LIST || tk == NB_TREE_KIND_TUPLE || tk == NB_TREE_KIND_DICT;
    if (!node) {
        if (!have) {
            return nbi_err(w->ctx, NB_ERR_STRUCTURE,
                           "%s: the mask has a %s at %s where the grads have a %s leaf; give a "
                           "bool there",
                           w->who, nb_tree_kind_name(nb_tree_kind_of(m)),
                           w->path[0] ? w->path : "<root>", nb_tree_kind_name(tk));
        }
        bool dyn = nb_tree_is_dynamic(t);
        if (dyn && w->flags != NULL) {
            w->flags[w->k] = val;
        }
        w->k += dyn ? 1 : 0;
        if (out != NULL) {
            if (dyn && !val) {
                return nb_tree_null(w->ctx, out);
            }
            *out = nb_tree_retain((nb_tree *)t);
        }
        return NB_OK;
    }
    int64_t n = nb_tree_len(t);
    if (!have && (nb_tree_kind_of(m) != tk || nb_tree_len(m) != n)) {
        return nbi_err(w->ctx, NB_ERR_STRUCTURE,
                       "%s: the mask does not fit the grads at %s: %s of %lld vs %s of %lld",
                       w->who, w->path[0] ? w->path : "<root>",
                       nb_tree_kind_name(nb_tree_kind_of(m)), (long long)nb_tree_len(m),
                       nb_tree_kind_name(tk), (long long)n);
    }
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(nb_tree *);
    nb_tree **items = NULL;
    if (out != NULL) {
        items = nbi_alloc(w->ctx, bytes, 8);
        if (items == NULL) {
            return nbi_oom(w->ctx, w->who, bytes);
        }
        memset(items, 0, bytes);
    }
    nb_status st = NB_OK;
    size_t len = strlen(w->path);
    for (int64_t i = 0; i < n && st == NB_OK; i++) {
        const nb_tree *mc = m;
        if (tk == NB_TREE_KIND_DICT) {
            const char *key = nb_tree_key(t, i);
            snprintf(w->path + len, sizeof w->path - len, ".%s", key);
            if (!have) {
                if (strcmp(nb_tree_key(m, i), key) != 0) {
                    st = nbi_err(w->ctx, NB_ERR_STRUCTURE,
                                 "%s: the mask does not fit the grads at %s: key '%s' vs '%s'",
                                 w->who, w->path, nb_tree_key(m, i), key);
                    break;
                }
                mc = nb_tree_child(m, i);
            }
        } else {
            snprintf(w->path + len, sizeof w->path - len, "[%lld]", (long long)i);
            if (!have) {
                mc = nb_tree_child(m, i);
            }
        }
        st = nbo_mask_rec(w, nb_tree_child(t, i), mc, have, val, items ? &items[i] : NULL);
    }
    w->path[len] = '\0';
    if (st == NB_OK && out != NULL) {
        if (tk == NB_TREE_KIND_DICT) {
            const char **keys = nbi_alloc(w->ctx, bytes, 8);
            if (keys == NULL) {
                st = nbi_oom(w->ctx, w->who, bytes);
            } else {
                for (int64_t i = 0; i < n; i++) {
                    keys[i] = nb_tree_key(t, i);
                }
                st = nb_tree_dict(w->ctx, n, keys, items, out);
                nbi_free(w->ctx, (void *)keys, bytes);
            }
        } else if (tk == NB_TREE_KIND_LIST) {
            st = nb_tree_list(w->ctx, n, items, out);
        } else {
            st = nb_tree_tuple(w->ctx, n, items, out);
        }
    }
    if (items != NULL) {
        for (int64_t i = 0; i < n; i++) {
            nb_tree_destroy(items[i]);
        }
        nbi_free(w->ctx, items, bytes);
    }
    return st;
}

static nb_status nbo_mask_apply(nb_ctx *ctx, const char *who, const nb_tree *t, const nb_tree *m,
                                bool *flags, nb_tree **out) {
    nbo_mask *w = nbi_alloc(ctx, sizeof *w, 8);
    if (w == NULL) {
        return nbi_oom(ctx, who, sizeof *w);
    }
    memset(w, 0, sizeof *w);
    w->ctx = ctx;
    w->who = who;
    w->flags = flags;
    nb_status st = nbo_mask_rec(w, t, m, 0, false, out);
    nbi_free(ctx, w, sizeof *w);
    return st;
}

/* The dtype, rank, shape and signature text ("f32[2,1]") of an array or var leaf. */
static void nbo_sig_of(const nb_tree *leaf, nb_trace *tr, char *buf, size_t cap, nb_dtype *dt,
                       int *rank, const int64_t **shape) {
    if (nb_tree_kind_of(leaf) == NB_TREE_KIND_ARRAY) {
        const nb_array *a = nb_tree_get_array(leaf);
        *dt = nb_array_dtype(a);
        *rank = nb_array_rank(a);
        *shape = nb_array_shape(a);
    } else {
        nb_var *v = nb_var_of(tr, leaf);
        *dt = nb_var_dtype(v);
        *rank = nb_var_rank(v);
        *shape = nb_var_shape(v);
    }
    nbi_sig(buf, cap, *dt, *rank, *shape);
}

/* ---- init ------------------------------------------------------------------------------ */

/* Leaves are made eagerly (tr == NULL: new arrays) or as vars of tr. */
typedef struct nbo_init {
    nb_ctx *ctx;
    nb_trace *tr;
    double value;
} nbo_init;

static nb_status nbo_full_leaf(nbo_init *in, nb_dtype dtype, int rank, const int64_t *shape,
                               nb_tree **out) {
    if (in->tr != NULL) {
        nb_tree *l = nb_leaf(nb_full(in->tr, dtype, rank, shape, in->value));
        if (l == NULL || nb_trace_status(in->tr) != NB_OK) {
            return nb_trace_status(in->tr) != NB_OK ? nb_trace_status(in->tr) : NB_ERR_OOM;
        }
        *out = nb_tree_retain(l);
        return NB_OK;
    }
    nb_array *a = NULL;
    nb_status st = nb_array_full(in->ctx, dtype, rank, shape, in->value, &a);
    if (st == NB_OK) {
        st = nb_tree_array(a, out);
    }
    nb_array_destroy(a);
    return st;
}

static nb_status nbo_full_cb(void *ud, const char *path, int n, const nb_tree *const *l,
                             nb_tree **out) {
    (void)path;
    (void)n;
    nbo_init *in = ud;
    const nb_tree *t = l[0];
    if (nb_tree_kind_of(t) == NB_TREE_KIND_ARRAY) {
        const nb_array *a = nb_tree_get_array(t);
        return nbo_full_leaf(in, nb_array_dtype(a), nb_array_rank(a), nb_array_shape(a), out);
    }
    nb_var *v = nb_var_of(in->tr, t);
    return nbo_full_leaf(in, nb_var_dtype(v), nb_var_rank(v), nb_var_shape(v), out);
}

/* A moment: template's structure, value everywhere there is an array. */
static nb_status nbo_moment(nbo_init *in, const nb_tree *tmpl, double value, nb_tree **out) {
    in->value = value;
    return nb_tree_map(tmpl, nbo_full_cb, in, 0, out);
}

static nb_status nbo_copy_cb(void *ud, const char *path, int n, const nb_tree *const *l,
                             nb_tree **out) {
    (void)path;
    (void)n;
    nbo_init *in = ud;
    const nb_tree *t = l[0];
    if (in->tr == NULL) {
        nb_array *a = NULL;
        nb_status st = nb_array_copy(nb_tree_get_array(t), &a);
        if (st == NB_OK) {
            st = nb_tree_array(a, out);
        }
        nb_array_destroy(a);
        return st;
    }
    if (nb_tree_kind_of(t) == NB_TREE_KIND_VAR) {
        *out = nb_tree_retain((nb_tree *)t);
        return NB_OK;
    }
    nb_tree *leaf = nb_leaf(nb_constant(in->tr, nb_tree_get_array(t)));
    if (leaf == NULL) {
        return nb_trace_status(in->tr) != NB_OK ? nb_trace_status(in->tr) : NB_ERR_OOM;
    }
    *out = nb_tree_retain(leaf);
    return NB_OK;
}

typedef struct nbo_mom {
    const char *name;
    double value;
} nbo_mom;

static nb_status nbo_init_rec(nbo_init *in, const nb_tree *opt, const nb_tree *tmpl,
                              nb_tree **out) {
    const char *kind = nbo_kind(opt);
    if (kind == NULL) {
        return nbi_err(in->ctx, NB_ERR_INVALID,
                       "nb_optim_init: not an optimizer (a dict with a 'transform' string made by "
                       "nb_optim_*)");
    }
    if (strcmp(kind, "chain") == 0) {
        const nb_tree *parts = nb_tree_get(opt, "parts");
        int64_t n = nb_tree_len(parts);
        nb_tree *items[64] = {0};
        if (n < 1 || n > 64) {
            return nbi_err(in->ctx, NB_ERR_INVALID, "nb_optim_init: a chain of %lld parts (1..64)",
                           (long long)n);
        }
        nb_status st = NB_OK;
        for (int64_t i = 0; i < n && st == NB_OK; i++) {
            st = nbo_init_rec(in, nb_tree_child(parts, i), tmpl, &items[i]);
        }
        if (st == NB_OK) {
            st = nb_tree_tuple(in->ctx, n, items, out);
        }
        for (int64_t i = 0; i < n; i++) {
            nb_tree_destroy(items[i]);
        }
        return st;
    }
    if (strcmp(kind, "masked") == 0) {
        nb_tree *sub = NULL, *inner = NULL;
        nb_status st = nbo_mask_apply(in->ctx, "nb_optim_init (masked)", tmpl,
                                      nb_tree_get(opt, "mask"), NULL, &sub);
        if (st == NB_OK) {
            st = nbo_init_rec(in, nb_tree_get(opt, "inner"), sub, &inner);
        }
        nb_tree_destroy(sub);
        nbo_builder b = nbo_builder_make(in->ctx);
        nbo_put_st(&b, "inner", st, inner);
        return nbo_builder_dict(&b, out);
    }
    nbo_builder b = nbo_builder_make(in->ctx);
    nb_tree *t = NULL;
    in->value = 0.0;
    nb_status st = nbo_full_leaf(in, NB_DTYPE_I32, 0, NULL, &t);
    nbo_put_st(&b, "count", st, t);
    t = NULL;
    st = b.st == NB_OK ? nb_tree_map(nb_tree_get(opt, "hyper"), nbo_copy_cb, in, 0, &t) : b.st;
    nbo_put_st(&b, "hyper", st, t);
    double init = 0.0;
    nb_tree_get_float(nb_tree_get(opt, "initial_scale"), &init);
    bool flag = false;
    nbo_mom mom[2];
    int n_mom = 0;
    if (strcmp(kind, "sgd") == 0) {
        nb_tree_get_bool(nb_tree_get(opt, "momentum"), &flag);
        if (flag) {
            mom[n_mom++] = (nbo_mom){"trace", 0.0};
        }
    } else if (strcmp(kind, "adam") == 0 || strcmp(kind, "adamw") == 0 ||
               strcmp(kind, "lamb") == 0) {
        mom[n_mom++] = (nbo_mom){"mu", 0.0};
        mom[n_mom++] = (nbo_mom){"nu", 0.0};
    } else if (strcmp(kind, "rmsprop") == 0) {
        mom[n_mom++] = (nbo_mom){"nu", init};
        nb_tree_get_bool(nb_tree_get(opt, "centered"), &flag);
        if (flag) {
            mom[n_mom++] = (nbo_mom){"mu", 0.0};
        }
        flag = false;
        nb_tree_get_bool(nb_tree_get(opt, "momentum"), &flag);
        if (flag) {
            nb_tree *m = NULL;
            st = b.st == NB_OK ? nbo_moment(in, tmpl, 0.0, &m) : b.st;
            nbo_put_st(&b, "trace", st, m);
        }
    } else if (strcmp(kind, "adagrad") == 0) {
        mom[n_mom++] = (nbo_mom){"sum_of_squares", init};
    } else if (strcmp(kind, "lion") == 0) {
        mom[n_mom++] = (nbo_mom){"mu", 0.0};
    } else if (strcmp(kind, "clip") != 0 && strcmp(kind, "clip_by_global_norm") != 0 &&
               strcmp(kind, "add_decayed_weights") != 0 && strcmp(kind, "scale_by_schedule") != 0) {
        nbo_builder_dict(&b, out);
        nb_tree_destroy(*out);
        *out = NULL;
        return nbi_err(in->ctx, NB_ERR_INVALID, "nb_optim_init: unknown transform '%s'", kind);
    }
    for (int i = 0; i < n_mom; i++) {
        nb_tree *m = NULL;
        st = b.st == NB_OK ? nbo_moment(in, tmpl, mom[i].value, &m) : b.st;
        nbo_put_st(&b, mom[i].name, st, m);
    }
    return nbo_builder_dict(&b, out);
}

/* The template must be a gradient template: float arrays (or vars) and nulls. A leaf that
 * nb_grad_template would have made null -- an integer or bool array, a static leaf, a frozen
 * leaf -- means the state is being built from the parameters themselves; the first update
 * would refuse that state (or, for a transform without moments, silently accept it), so it is
 * refused here, naming the first such path and what is there. */
typedef struct nbo_tmpl_check {
    nb_ctx *ctx;
    nb_trace *tr;
    const char *who;
} nbo_tmpl_check;

/* A static leaf as "static int 3", "static string \"tanh\"", ... */
static void nbo_describe_static(const nb_tree *t, char *buf, size_t cap) {
    int64_t i = 0;
    double f = 0.0;
    bool b = false;
    const char *str = NULL;
    nb_fnptr fn = NULL;
    const char *kind = nb_tree_kind_name(nb_tree_kind_of(t));
    if (nb_tree_get_int(t, &i) == NB_OK) {
        snprintf(buf, cap, "static %s %lld", kind, (long long)i);
    } else if (nb_tree_get_float(t, &f) == NB_OK) {
        snprintf(buf, cap, "static %s %g", kind, f);
    } else if (nb_tree_get_bool(t, &b) == NB_OK) {
        snprintf(buf, cap, "static %s %s", kind, b ? "true" : "false");
    } else if (nb_tree_get_string(t, &str) == NB_OK) {
        snprintf(buf, cap, "static %s \"%.40s%s\"", kind, str, strlen(str) > 40 ? "..." : "");
    } else if (nb_tree_get_fnref(t, &fn, &str) == NB_OK) {
        snprintf(buf, cap, "static %s %.40s", kind, str);
    } else {
        snprintf(buf, cap, "static %s", kind);
    }
}

static nb_status nbo_tmpl_check_cb(void *ud, const char *path, int n, const nb_tree *const *l,
                                   nb_tree **out) {
    (void)n;
    const nbo_tmpl_check *c = ud;
    const nb_tree *t = l[0];
    bool frozen = nb_tree_is_frozen(t);
    char what[160] = "";
    if (nb_tree_is_static(t)) {
        nbo_describe_static(t, what, sizeof what);
    } else {
        nb_dtype dt;
        int rank;
        const int64_t *shape;
        nbo_sig_of(t, c->tr, what, sizeof what, &dt, &rank, &shape);
        if (!frozen && nb_dtype_is_float(dt)) {
            *out = nb_tree_retain((nb_tree *)t);
            return NB_OK;
        }
    }
    return nb_tree_map_fail(c->ctx, NB_ERR_STRUCTURE,
                            "%s: the template has %s%s at %s, where a gradient template has "
                            "null (is it the parameters instead of their gradient template?) -- "
                            "build the state from nb_grad_template(params, filter_spec)",
                            c->who, frozen ? "frozen " : "", what, path[0] ? path : "<root>");
}

static nb_status nbo_check_template(nb_ctx *ctx, nb_trace *tr, const char *who,
                                    const nb_tree *tmpl) {
    nbo_tmpl_check c = {ctx, tr, who};
    nb_tree *copy = NULL;
    nb_status st = nb_tree_map(tmpl, nbo_tmpl_check_cb, &c, NB_TREE_MAP_STATIC, &copy);
    nb_tree_destroy(copy);
    return st;
}

nb_status nb_optim_init(const nb_tree *opt, const nb_tree *template_, nb_tree **state) {
    static const char fn[] = "nb_optim_init";
    if (state != NULL) {
        *state = NULL;
    }
    nb_status st = nbi_check_handle_in(nbi_handle_ctx(template_), opt, NBI_MAGIC_TREE, fn, "opt");
    if (st == NB_OK) {
        st = nbi_check_handle_in(nb_tree_ctx(opt), template_, NBI_MAGIC_TREE, fn, "template_");
    }
    if (st == NB_OK && state == NULL) {
        st = nbi_err_null(nb_tree_ctx(opt), fn, "state",
                          "pass the address of an nb_tree * to receive the optimizer state");
    }
    if (st != NB_OK) {
        return st;
    }
    nbo_init in = {nb_tree_ctx(opt), NULL, 0.0};
    if (nb_tree_ctx(template_) != in.ctx) {
        return nbi_err(in.ctx, NB_ERR_INVALID,
                       "nb_optim_init: the optimizer and the template belong to different "
                       "contexts");
    }
    nb_tree *leaves = NULL;
    st = nb_tree_flatten(template_, &leaves, NULL);
    for (int64_t i = 0; st == NB_OK && i < nb_tree_len(leaves); i++) {
        if (nb_tree_kind_of(nb_tree_child(leaves, i)) != NB_TREE_KIND_ARRAY) {
            st = nbi_err(in.ctx, NB_ERR_INVALID,
                         "nb_optim_init: the template holds symbolic values; inside a trace use "
                         "nb_optim_init_in");
        }
    }
    nb_tree_destroy(leaves);
    if (st == NB_OK) {
        st = nbo_check_template(in.ctx, NULL, "nb_optim_init", template_);
    }
    if (st == NB_OK) {
        st = nbo_init_rec(&in, opt, template_, state);
    }
    return st;
}

/* The tree arguments of a traced call: the first of n that is not a live tree is recorded
 * on the trace (naming fn and the argument) and its status returned. An entry with
 * optional[i] may be NULL. */
static nb_status nbo_trace_trees(nb_trace *tr, const char *fn, int n, const nb_tree *const *t,
                                 const char *const *names, const bool *optional) {
    char why[NBI_ERRMSG_CAP];
    for (int i = 0; i < n; i++) {
        if ((t[i] != NULL || !optional[i]) &&
            nbi_handle_why(t[i], NBI_MAGIC_TREE, fn, names[i], why, sizeof why)) {
            return nbi_trace_err(tr, NB_ERR_MISUSE, "%s", why);
        }
    }
    return NB_OK;
}

const nb_tree *nb_optim_init_in(nb_trace *tr, const nb_tree *opt, const nb_tree *template_) {
    if (tr == NULL || nb_trace_status(tr) != NB_OK) {
        return NULL;
    }
    if (nbo_trace_trees(tr, "nb_optim_init_in", 2, (const nb_tree *[]){opt, template_},
                        (const char *[]){"opt", "template_"},
                        (const bool[]){false, false}) != NB_OK) {
        return NULL;
    }
    nbo_init in = {nb_trace_ctx(tr), tr, 0.0};
    nb_tree *state = NULL;
    nb_status st = nbo_check_template(in.ctx, tr, "nb_optim_init_in", template_);
    if (st == NB_OK) {
        st = nbo_init_rec(&in, opt, template_, &state);
    }
    if (st != NB_OK) {
        if (nb_trace_status(tr) == NB_OK) {
            nbi_trace_err(tr, st, "%s", nb_ctx_errmsg(in.ctx));
        }
        return NULL;
    }
    if (nbi_trace_own(tr, state) != NB_OK) {
        return NULL;
    }
    return state;
}

/* ---- update ---------------------------------------------------------------------------- */

typedef struct nbo_run {
    nb_trace *tr;
    nb_ctx *ctx;
    const nb_tree *ref; /* the grads (or their masked part): structure reference */
    nb_treedef *def;    /* its treedef */
    int64_t n;          /* its number of array leaves */
    nb_var **u;         /* the updates so far, one per leaf */
    nb_var **p;         /* the parameters, one per leaf (NULL entries when not given) */
    bool have_p;
    const char *kind; /* the transform being applied, for messages */
} nbo_run;

static nb_status nbo_fail(nbo_run *r, nb_status st, const char *fmt, ...) NBI_PRINTF(3, 4);
static nb_status nbo_fail(nbo_run *r, nb_status st, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return nbi_trace_err(r->tr, st, "nb_optim_update (%s): %s", r->kind, msg);
}

/* The var of a state or parameter leaf: a var, or an array used as a constant. */
static nb_var *nbo_var(nb_trace *tr, const nb_tree *leaf) {
    if (nb_tree_kind_of(leaf) == NB_TREE_KIND_ARRAY) {
        return nb_constant(tr, nb_tree_get_array(leaf));
    }
    return nb_var_of(tr, leaf);
}

static bool nbo_same_sig(nb_dtype da, int ra, const int64_t *sa, nb_dtype db, int rb,
                         const int64_t *sb) {
    if (da != db || ra != rb) {
        return false;
    }
    for (int i = 0; i < ra; i++) {
        if (sa[i] != sb[i]) {
            return false;
        }
    }
    return true;
}

/* how is "<path>: <a> vs <b>" from nb_tree_diff; where both sides at path are leaves, say
 * what they are with dtypes and shapes ("null vs f32[2,1]"), which the generic diff cannot
 * for symbolic values. */
static void nbo_describe_leaves(nbo_run *r, const nb_tree *a, const nb_tree *b, char *how,
                                size_t cap) {
    char path[NB_PATH_MAX];
    const char *colon = strstr(how, ": ");
    if (colon == NULL || (size_t)(colon - how) >= sizeof path) {
        return;
    }
    memcpy(path, how, (size_t)(colon - how));
    path[colon - how] = '\0';
    const nb_tree *la = NULL, *lb = NULL;
    if (nb_tree_lookup(a, strcmp(path, "<root>") == 0 ? "" : path, &la) != NB_OK ||
        nb_tree_lookup(b, strcmp(path, "<root>") == 0 ? "" : path, &lb) != NB_OK ||
        !nb_tree_is_leaf(la) || !nb_tree_is_leaf(lb)) {
        return;
    }
    char da[96], db[96];
    const nb_tree *side[2] = {la, lb};
    char *out[2] = {da, db};
    for (int k = 0; k < 2; k++) {
        if (nb_tree_is_dynamic(side[k])) {
            nb_dtype dt;
            int rank;
            const int64_t *shape;
            nbo_sig_of(side[k], r->tr, out[k], 96, &dt, &rank, &shape);
        } else {
            snprintf(out[k], 96, "%s", nb_tree_kind_name(nb_tree_kind_of(side[k])));
        }
    }
    nbi_sbuf sb = nbi_sbuf_make(how, cap);
    nbi_sbuf_printf(&sb, "%s: %s vs %s", path, da, db);
    nbi_sbuf_finish(&sb, NULL);
}

#define NBO_FIX                                                                                    \
    "build the state from the gradient template: nb_optim_init(opt, nb_grad_template(params, "     \
    "filter_spec))"

/* The leaves of state.key, checked against the reference structure. */
static nb_status nbo_slot(nbo_run *r, const nb_tree *state, const char *spath, const char *key,
                          nb_var **out) {
    const nb_tree *s = nb_tree_get(state, key);
    if (s == NULL) {
        return nbo_fail(r, NB_ERR_STRUCTURE,
                        "%s has no '%s': it is not the state of this optimizer -- make it with "
                        "nb_optim_init from the same optimizer",
                        spath, key);
    }
    nb_tree *leaves = NULL;
    nb_treedef *def = NULL;
    nb_status st = nb_tree_flatten(s, &leaves, &def);
    if (st != NB_OK) {
        return nbo_fail(r, st, "flattening %s.%s failed: %s", spath, key,
                        st == NB_ERR_OOM ? "out of memory" : nb_status_string(st));
    }
    if (!nb_treedef_equal(def, r->def)) {
        char how[512] = "";
        bool differ = false;
        nb_tree_diff(r->ref, s, NB_TREE_DIFF_STRUCTURE, &differ, how, sizeof how, NULL);
        nbo_describe_leaves(r, r->ref, s, how, sizeof how);
        st = nbo_fail(r, NB_ERR_STRUCTURE, "grads and %s.%s differ at %s -- " NBO_FIX, spath, key,
                      how);
    }
    for (int64_t i = 0; st == NB_OK && i < r->n; i++) {
        const nb_tree *l = nb_tree_child(leaves, i);
        char sa[96], sb[96];
        nb_dtype da;
        int ra;
        const int64_t *sha;
        nbo_sig_of(l, r->tr, sa, sizeof sa, &da, &ra, &sha);
        const nb_var *g = r->u[i];
        nbi_sig(sb, sizeof sb, nb_var_dtype(g), nb_var_rank(g), nb_var_shape(g));
        if (!nbo_same_sig(da, ra, sha, nb_var_dtype(g), nb_var_rank(g), nb_var_shape(g))) {
            char path[NB_PATH_MAX];
            nb_tree_leaf_path(r->ref, i, path, sizeof path, NULL);
            st = nbo_fail(r, NB_ERR_STRUCTURE, "grads and %s.%s differ at %s: %s vs %s -- " NBO_FIX,
                          spath, key, path[0] ? path : "<root>", sb, sa);
        } else {
            out[i] = nbo_var(r->tr, l);
        }
    }
    nb_tree_destroy(leaves);
    nb_treedef_destroy(def);
    return st != NB_OK ? st : nb_trace_status(r->tr);
}

/* A tree of the reference structure from n vars (owned by the trace). */
static nb_tree *nbo_tree_of(nbo_run *r, nb_var *const *v) {
    size_t bytes = (size_t)(r->n > 0 ? r->n : 1) * sizeof(nb_tree *);
    nb_tree **items = nbi_alloc(r->ctx, bytes, 8);
    if (items == NULL) {
        nbi_trace_err(r->tr, NB_ERR_OOM, "nb_optim_update: out of memory");
        return NULL;
    }
    nb_status st = NB_OK;
    for (int64_t i = 0; i < r->n && st == NB_OK; i++) {
        items[i] = nb_leaf(v[i]);
        if (items[i] == NULL) {
            st = NB_ERR_OOM;
        }
    }
    nb_tree *list = NULL, *out = NULL;
    if (st == NB_OK) {
        st = nb_tree_list(r->ctx, r->n, items, &list);
    }
    if (st == NB_OK) {
        st = nb_tree_unflatten(r->def, list, &out);
    }
    nb_tree_destroy(list);
    nbi_free(r->ctx, items, bytes);
    if (st == NB_OK && nbi_trace_own(r->tr, out) != NB_OK) {
        return NULL;
    }
    if (st != NB_OK) {
        nbi_trace_err(r->tr, st, "nb_optim_update: building a moment failed: %s",
                      st == NB_ERR_OOM ? "out of memory" : nb_status_string(st));
        return NULL;
    }
    return out;
}

/* state.hyper.name as an f64 0-d var. */
static nb_var *nbo_hyper(nbo_run *r, const nb_tree *state, const char *spath, const char *name) {
    const nb_tree *h = nb_tree_get(nb_tree_get(state, "hyper"), name);
    if (h == NULL || !nb_tree_is_dynamic(h)) {
        nbo_fail(r, NB_ERR_STRUCTURE,
                 "%s.hyper has no array '%s': it is not the state of this optimizer -- make it "
                 "with nb_optim_init from the same optimizer",
                 spath, name);
        return NULL;
    }
    nb_var *v = nbo_var(r->tr, h);
    if (nb_var_rank(v) != 0 || nb_var_dtype(v) != NB_DTYPE_F64) {
        char sig[96];
        nbi_var_sig(sig, sizeof sig, v);
        nbo_fail(r, NB_ERR_STRUCTURE, "%s.hyper.%s is %s, not f64[] -- " NBO_FIX, spath, name, sig);
        return NULL;
    }
    return v;
}

static nb_var *nbo_count(nbo_run *r, const nb_tree *state, const char *spath) {
    const nb_tree *c = nb_tree_get(state, "count");
    nb_var *v = c != NULL && nb_tree_is_dynamic(c) ? nbo_var(r->tr, c) : NULL;
    if (v == NULL) {
        nbo_fail(r, NB_ERR_STRUCTURE,
                 "%s has no count array: it is not the state of this optimizer -- make it with "
                 "nb_optim_init(opt, nb_grad_template(params, filter_spec))",
                 spath);
        return NULL;
    }
    if (nb_var_rank(v) != 0 || nb_var_dtype(v) != NB_DTYPE_I32) {
        char sig[96];
        nbi_var_sig(sig, sizeof sig, v);
        nbo_fail(r, NB_ERR_STRUCTURE, "%s.count is %s, not i32[] -- " NBO_FIX, spath, sig);
        return NULL;
    }
    return v;
}

/* Optax's safe_int32_increment: count + 1, saturating at INT32_MAX. */
static nb_var *nbo_inc(nb_var *c) {
    nb_trace *tr = nb_var_trace(c);
    return nb_select(nb_lt(c, nb_scalar_typed(tr, NB_DTYPE_I32, (double)INT32_MAX)),
                     nb_add(c, nb_scalar_typed(tr, NB_DTYPE_I32, 1.0)), c);
}

/* The learning rate at count: the hyper value or the schedule's. */
static nb_var *nbo_lr_var(nbo_run *r, const nb_tree *opt, const nb_tree *state, const char *spath,
                          nb_var *count) {
    const nb_tree *s = nb_tree_get(opt, "schedule");
    if (s != NULL && nb_tree_kind_of(s) == NB_TREE_KIND_DICT) {
        return nb_schedule_eval(r->tr, s, count);
    }
    return nbo_hyper(r, state, spath, "learning_rate");
}

/* A 0-d f64 var cast to dtype (how Optax's Python-float hyperparameters meet the leaf). */
static nb_var *nbo_as(nb_var *h, const nb_var *like) {
    return nb_cast(h, nb_var_dtype(like));
}

static bool nbo_flag(const nb_tree *opt, const char *key) {
    bool v = false;
    nb_tree_get_bool(nb_tree_get(opt, key), &v);
    return v;
}

/* The new state: state's dict with the given keys replaced. */
static nb_tree *nbo_new_state(nbo_run *r, const nb_tree *state, int n, const char *const *keys,
                              nb_tree *const *vals) {
    int64_t len = nb_tree_len(state);
    if (len > NBO_BUILDER_MAX) {
        nbo_fail(r, NB_ERR_STRUCTURE, "the state dict has %lld entries", (long long)len);
        return NULL;
    }
    nbo_builder b = nbo_builder_make(r->ctx);
    for (int64_t i = 0; i < len; i++) {
        const char *k = nb_tree_key(state, i);
        const nb_tree *v = nb_tree_child(state, i);
        for (int j = 0; j < n; j++) {
            if (strcmp(keys[j], k) == 0) {
                v = vals[j];
            }
        }
        nbo_put_tree(&b, k, v);
    }
    nb_tree *out = NULL;
    nb_status st = nbo_builder_dict(&b, &out);
    if (st != NB_OK || nbi_trace_own(r->tr, out) != NB_OK) {
        if (st != NB_OK) {
            nbi_trace_err(r->tr, st, "nb_optim_update: out of memory");
        }
        return NULL;
    }
    return out;
}

/* u + wd p on the leaves where the optimizer's mask (or none) allows. */
static nb_status nbo_decay_weights(nbo_run *r, const nb_tree *opt, nb_var *wd) {
    const nb_tree *mask = nb_tree_get(opt, "mask");
    bool *flags = NULL;
    size_t bytes = (size_t)(r->n > 0 ? r->n : 1);
    if (mask != NULL && nb_tree_kind_of(mask) != NB_TREE_KIND_NULL) {
        flags = nbi_alloc(r->ctx, bytes, 8);
        if (flags == NULL) {
            return nbo_fail(r, NB_ERR_OOM, "out of memory");
        }
        nb_status st = nbo_mask_apply(r->ctx, "nb_optim_update (weight decay mask)", r->ref, mask,
                                      flags, NULL);
        if (st != NB_OK) {
            nbi_free(r->ctx, flags, bytes);
            return nbi_trace_err(r->tr, st, "%s", nb_ctx_errmsg(r->ctx));
        }
    }
    for (int64_t i = 0; i < r->n; i++) {
        if (flags != NULL && !flags[i]) {
            continue;
        }
        if (r->p[i] == NULL) {
            char path[NB_PATH_MAX];
            nb_tree_leaf_path(r->ref, i, path, sizeof path, NULL);
            if (flags != NULL) {
                nbi_free(r->ctx, flags, bytes);
            }
            return nbo_fail(r, NB_ERR_INVALID,
                            "weight decay needs the parameters, and params %s (at %s) -- pass "
                            "params to nb_optim_update",
                            r->have_p ? "has no array there" : "is NULL",
                            path[0] ? path : "<root>");
        }
        r->u[i] =
            nb_add(r->u[i], nb_mul(nbo_as(wd, r->u[i]), nb_cast(r->p[i], nb_var_dtype(r->u[i]))));
    }
    if (flags != NULL) {
        nbi_free(r->ctx, flags, bytes);
    }
    return nb_trace_status(r->tr);
}

/* The sum of squares of a var as a 0-d f64 var. */
static nb_var *nbo_sumsq(nb_var *x) {
    return nb_cast(nb_sum(nb_square(x), NULL, 0, false), NB_DTYPE_F64);
}

static nb_status nbo_update(nbo_run *r, const nb_tree *opt, const nb_tree *state, const char *spath,
                            nb_tree **new_state);

static nb_status nbo_update_chain(nbo_run *r, const nb_tree *opt, const nb_tree *state,
                                  const char *spath, nb_tree **new_state) {
    const nb_tree *parts = nb_tree_get(opt, "parts");
    int64_t n = nb_tree_len(parts);
    if (nb_tree_kind_of(state) != NB_TREE_KIND_TUPLE || nb_tree_len(state) != n) {
        return nbo_fail(r, NB_ERR_STRUCTURE,
                        "%s is not the state of a chain of %lld parts (a tuple of their "
                        "states) -- make it with nb_optim_init from the same optimizer",
                        spath, (long long)n);
    }
    nb_tree *items[64] = {0};
    nb_status st =
        n > 64 ? nbo_fail(r, NB_ERR_INVALID, "a chain of %lld parts (1..64)", (long long)n) : NB_OK;
    for (int64_t i = 0; i < n && st == NB_OK; i++) {
        char sub[NB_PATH_MAX];
        snprintf(sub, sizeof sub, "%s[%lld]", spath, (long long)i);
        st = nbo_update(r, nb_tree_child(parts, i), nb_tree_child(state, i), sub, &items[i]);
    }
    nb_tree *out = NULL;
    if (st == NB_OK) {
        st = nb_tree_tuple(r->ctx, n, items, &out);
        if (st != NB_OK) {
            st = nbi_trace_err(r->tr, st, "nb_optim_update: out of memory");
        } else if (nbi_trace_own(r->tr, out) != NB_OK) {
            st = nb_trace_status(r->tr);
        }
    }
    for (int64_t i = 0; i < n; i++) {
        nb_tree_destroy(items[i]);
    }
    if (st == NB_OK) {
        *new_state = nb_tree_retain(out);
    }
    return st;
}

static nb_status nbo_update_masked(nbo_run *r, const nb_tree *opt, const nb_tree *state,
                                   const char *spath, nb_tree **new_state) {
    const nb_tree *inner_state = nb_tree_get(state, "inner");
    if (inner_state == NULL) {
        return nbo_fail(r, NB_ERR_STRUCTURE,
                        "%s has no 'inner': it is not the state of a masked optimizer", spath);
    }
    size_t fbytes = (size_t)(r->n > 0 ? r->n : 1);
    bool *flags = nbi_alloc(r->ctx, fbytes, 8);
    if (flags == NULL) {
        return nbo_fail(r, NB_ERR_OOM, "out of memory");
    }
    nb_tree *sub = NULL;
    nb_status st = nbo_mask_apply(r->ctx, "nb_optim_update (masked)", r->ref,
                                  nb_tree_get(opt, "mask"), flags, &sub);
    if (st != NB_OK) {
        nbi_free(r->ctx, flags, fbytes);
        return nbi_trace_err(r->tr, st, "%s", nb_ctx_errmsg(r->ctx));
    }
    nbo_run in = *r;
    in.ref = sub;
    in.def = NULL;
    in.n = 0;
    for (int64_t i = 0; i < r->n; i++) {
        in.n += flags[i] ? 1 : 0;
    }
    size_t vbytes = (size_t)(in.n > 0 ? in.n : 1) * sizeof(nb_var *);
    in.u = nbi_alloc(r->ctx, vbytes, 8);
    in.p = nbi_alloc(r->ctx, vbytes, 8);
    if (in.u == NULL || in.p == NULL || nb_tree_treedef(sub, &in.def) != NB_OK) {
        st = nbo_fail(r, NB_ERR_OOM, "out of memory");
    }
    if (st == NB_OK) {
        for (int64_t i = 0, k = 0; i < r->n; i++) {
            if (flags[i]) {
                in.u[k] = r->u[i];
                in.p[k++] = r->p[i];
            }
        }
        char sub_path[NB_PATH_MAX];
        snprintf(sub_path, sizeof sub_path, "%s.inner", spath);
        nb_tree *inner_new = NULL;
        st = nbo_update(&in, nb_tree_get(opt, "inner"), inner_state, sub_path, &inner_new);
        if (st == NB_OK) {
            for (int64_t i = 0, k = 0; i < r->n; i++) {
                if (flags[i]) {
                    r->u[i] = in.u[k++];
                }
            }
            nb_tree *ns = nbo_new_state(r, state, 1, (const char *[]){"inner"}, &inner_new);
            nb_tree_destroy(inner_new);
            st = ns != NULL ? NB_OK : nb_trace_status(r->tr);
            if (st == NB_OK) {
                *new_state = nb_tree_retain(ns);
            }
        }
    }
    nb_treedef_destroy(in.def);
    if (in.u != NULL) {
        nbi_free(r->ctx, in.u, vbytes);
    }
    if (in.p != NULL) {
        nbi_free(r->ctx, in.p, vbytes);
    }
    nb_tree_destroy(sub);
    nbi_free(r->ctx, flags, fbytes);
    return st;
}

/* Up to 3 moments of n leaves each, allocated together. */
typedef struct nbo_moms {
    nb_var **m[3];
    size_t bytes;
    void *block;
} nbo_moms;

static nb_status nbo_moms_alloc(nbo_run *r, nbo_moms *ms) {
    size_t per = (size_t)(r->n > 0 ? r->n : 1) * sizeof(nb_var *);
    ms->bytes = 3 * per;
    ms->block = nbi_alloc(r->ctx, ms->bytes, 8);
    if (ms->block == NULL) {
        return nbo_fail(r, NB_ERR_OOM, "out of memory");
    }
    memset(ms->block, 0, ms->bytes);
    for (int i = 0; i < 3; i++) {
        ms->m[i] = (nb_var **)((char *)ms->block + (size_t)i * per);
    }
    return NB_OK;
}

static void nbo_moms_free(nbo_run *r, nbo_moms *ms) {
    if (ms->block != NULL) {
        nbi_free(r->ctx, ms->block, ms->bytes);
    }
}

static nb_status nbo_update_leafwise(nbo_run *r, const nb_tree *opt, const nb_tree *state,
                                     const char *spath, nb_tree **new_state) {
    nb_trace *tr = r->tr;
    const char *kind = r->kind;
    nb_var *count = nbo_count(r, state, spath);
    if (count == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *count_inc = nbo_inc(count);
    nbo_moms ms = {{NULL, NULL, NULL}, 0, NULL};
    nb_status st = nbo_moms_alloc(r, &ms);
    if (st != NB_OK) {
        return st;
    }
    const char *mom_keys[3];
    int mom_idx[3] = {0, 1, 2}; /* which of ms.m holds moment k */
    int n_mom = 0;
    nb_var *lr = NULL;
    bool needs_lr = strcmp(kind, "clip") != 0 && strcmp(kind, "clip_by_global_norm") != 0 &&
                    strcmp(kind, "add_decayed_weights") != 0;
    if (needs_lr) {
        if (strcmp(kind, "scale_by_schedule") == 0) {
            lr = nb_schedule_eval(tr, nb_tree_get(opt, "schedule"), count);
        } else {
            lr = nbo_lr_var(r, opt, state, spath, count);
        }
        if (lr == NULL) {
            nbo_moms_free(r, &ms);
            return nb_trace_status(tr);
        }
    }
    /* sign: optimizers move by -lr times their direction; scale_by_schedule by +s */
    nb_var *step = lr == NULL ? NULL : strcmp(kind, "scale_by_schedule") == 0 ? lr : nb_neg(lr);
    if (strcmp(kind, "sgd") == 0) {
        if (nbo_flag(opt, "momentum")) {
            nb_var *m = nbo_hyper(r, state, spath, "momentum");
            bool nesterov = nbo_flag(opt, "nesterov");
            mom_keys[n_mom++] = "trace";
            st = m == NULL ? nb_trace_status(tr) : nbo_slot(r, state, spath, "trace", ms.m[0]);
            for (int64_t i = 0; st == NB_OK && i < r->n; i++) {
                nb_var *g = r->u[i], *md = nbo_as(m, g);
                nb_var *t = nb_add(g, nb_mul(md, ms.m[0][i]));
                ms.m[0][i] = t;
                r->u[i] = nesterov ? nb_add(g, nb_mul(md, t)) : t;
            }
        }
    } else if (strcmp(kind, "adam") == 0 || strcmp(kind, "adamw") == 0 ||
               strcmp(kind, "lamb") == 0) {
        nb_var *b1 = nbo_hyper(r, state, spath, "b1"), *b2 = nbo_hyper(r, state, spath, "b2");
        nb_var *eps = nbo_hyper(r, state, spath, "eps");
        nb_var *eps_root = nbo_hyper(r, state, spath, "eps_root");
        nb_var *wd = strcmp(kind, "adam") == 0 ? NULL : nbo_hyper(r, state, spath, "weight_decay");
        mom_keys[n_mom++] = "mu";
        mom_keys[n_mom++] = "nu";
        st = nb_trace_status(tr);
        if (st == NB_OK) {
            st = nbo_slot(r, state, spath, "mu", ms.m[0]);
        }
        if (st == NB_OK) {
            st = nbo_slot(r, state, spath, "nu", ms.m[1]);
        }
        if (st == NB_OK) {
            nb_var *one = nb_scalar(tr, 1.0);
            nb_var *t = nb_cast(count_inc, NB_DTYPE_F64);
            nb_var *bc1 = nb_sub(one, nb_pow(b1, t)), *bc2 = nb_sub(one, nb_pow(b2, t));
            nb_var *bc1n = nb_sub(one, nb_pow(b1, nb_add(t, one)));
            nb_var *c1 = nb_sub(one, b1), *c2 = nb_sub(one, b2);
            nb_var *rbc1 = nb_reciprocal(bc1), *rbc2 = nb_reciprocal(bc2);
            nb_var *rbc1n = nb_reciprocal(bc1n);
            bool nesterov = nbo_flag(opt, "nesterov");
            for (int64_t i = 0; i < r->n; i++) {
                nb_var *g = r->u[i];
                nb_var *mu = nb_add(nb_mul(nbo_as(c1, g), g), nb_mul(nbo_as(b1, g), ms.m[0][i]));
                nb_var *nu =
                    nb_add(nb_mul(nbo_as(c2, g), nb_square(g)), nb_mul(nbo_as(b2, g), ms.m[1][i]));
                /* dividing by the bias corrections = multiplying by their reciprocals,
                 * computed once per step in f64 (a multiply per element instead of a
                 * divide: the same values to rounding, as PyTorch's step_size form) */
                nb_var *mu_hat = nesterov
                                     ? nb_add(nb_mul(nb_mul(nbo_as(b1, g), mu), nbo_as(rbc1n, g)),
                                              nb_mul(nb_mul(nbo_as(c1, g), g), nbo_as(rbc1, g)))
                                     : nb_mul(mu, nbo_as(rbc1, g));
                nb_var *nu_hat = nb_mul(nu, nbo_as(rbc2, g));
                r->u[i] = nb_div(
                    mu_hat, nb_add(nb_sqrt(nb_add(nu_hat, nbo_as(eps_root, g))), nbo_as(eps, g)));
                ms.m[0][i] = mu;
                ms.m[1][i] = nu;
            }
            if (wd != NULL) {
                st = nbo_decay_weights(r, opt, wd);
            }
            if (st == NB_OK && strcmp(kind, "lamb") == 0) {
                /* Optax's scale_by_trust_ratio: ||p|| / ||u|| per leaf, 1 where a norm is 0 */
                for (int64_t i = 0; i < r->n && st == NB_OK; i++) {
                    if (r->p[i] == NULL) {
                        char path[NB_PATH_MAX];
                        nb_tree_leaf_path(r->ref, i, path, sizeof path, NULL);
                        st = nbo_fail(r, NB_ERR_INVALID,
                                      "the trust ratio needs the parameters, and params %s (at "
                                      "%s) -- pass params to nb_optim_update",
                                      r->have_p ? "has no array there" : "is NULL",
                                      path[0] ? path : "<root>");
                        break;
                    }
                    nb_var *u = r->u[i];
                    nb_var *pn = nb_sqrt(
                        nb_sum(nb_square(nb_cast(r->p[i], nb_var_dtype(u))), NULL, 0, false));
                    nb_var *un = nb_sqrt(nb_sum(nb_square(u), NULL, 0, false));
                    nb_var *zero =
                        nb_logical_or(nb_eq(pn, nb_scalar(tr, 0.0)), nb_eq(un, nb_scalar(tr, 0.0)));
                    nb_var *ratio =
                        nb_select(zero, nb_full(tr, nb_var_dtype(u), 0, NULL, 1.0), nb_div(pn, un));
                    r->u[i] = nb_mul(u, ratio);
                }
            }
        }
    } else if (strcmp(kind, "rmsprop") == 0) {
        nb_var *decay = nbo_hyper(r, state, spath, "decay"),
               *eps = nbo_hyper(r, state, spath, "eps");
        bool centered = nbo_flag(opt, "centered"), outside = nbo_flag(opt, "eps_outside_sqrt");
        bool bias = nbo_flag(opt, "bias_correction"), mom = nbo_flag(opt, "momentum");
        nb_var *m = mom ? nbo_hyper(r, state, spath, "momentum") : NULL;
        mom_keys[n_mom++] = "nu";
        if (centered) {
            mom_keys[n_mom++] = "mu";
        }
        if (mom) {
            mom_idx[n_mom] = 2;
            mom_keys[n_mom++] = "trace";
        }
        st = nb_trace_status(tr);
        if (st == NB_OK) {
            st = nbo_slot(r, state, spath, "nu", ms.m[0]);
        }
        if (st == NB_OK && centered) {
            st = nbo_slot(r, state, spath, "mu", ms.m[1]);
        }
        if (st == NB_OK && mom) {
            st = nbo_slot(r, state, spath, "trace", ms.m[2]);
        }
        if (st == NB_OK) {
            nb_var *one = nb_scalar(tr, 1.0);
            nb_var *c = nb_sub(one, decay);
            nb_var *bc = bias ? nb_sub(one, nb_pow(decay, nb_cast(count_inc, NB_DTYPE_F64))) : NULL;
            bool nesterov = nbo_flag(opt, "nesterov");
            for (int64_t i = 0; i < r->n; i++) {
                nb_var *g = r->u[i];
                nb_var *nu = nb_add(nb_mul(nbo_as(c, g), nb_square(g)),
                                    nb_mul(nbo_as(decay, g), ms.m[0][i]));
                ms.m[0][i] = nu;
                nb_var *v = bc != NULL ? nb_div(nu, nbo_as(bc, g)) : nu;
                if (centered) {
                    nb_var *mu =
                        nb_add(nb_mul(nbo_as(c, g), g), nb_mul(nbo_as(decay, g), ms.m[1][i]));
                    ms.m[1][i] = mu;
                    nb_var *mh = bc != NULL ? nb_div(mu, nbo_as(bc, g)) : mu;
                    v = nb_sub(v, nb_square(mh));
                }
                nb_var *d = outside ? nb_div(g, nb_add(nb_sqrt(v), nbo_as(eps, g)))
                                    : nb_mul(g, nb_rsqrt(nb_add(v, nbo_as(eps, g))));
                d = nb_mul(nbo_as(step, d), d);
                if (mom) {
                    /* Optax applies the momentum trace after the learning rate */
                    nb_var *md = nbo_as(m, g);
                    nb_var *t = nb_add(d, nb_mul(md, ms.m[2][i]));
                    ms.m[2][i] = t;
                    d = nesterov ? nb_add(d, nb_mul(md, t)) : t;
                }
                r->u[i] = d;
            }
            step = NULL; /* applied above */
        }
    } else if (strcmp(kind, "adagrad") == 0) {
        nb_var *eps = nbo_hyper(r, state, spath, "eps");
        mom_keys[n_mom++] = "sum_of_squares";
        st = eps == NULL ? nb_trace_status(tr)
                         : nbo_slot(r, state, spath, "sum_of_squares", ms.m[0]);
        for (int64_t i = 0; st == NB_OK && i < r->n; i++) {
            nb_var *g = r->u[i];
            nb_var *s = nb_add(nb_square(g), ms.m[0][i]);
            ms.m[0][i] = s;
            nb_var *inv =
                nb_select(nb_gt(s, nb_scalar(tr, 0.0)), nb_rsqrt(nb_add(s, nbo_as(eps, g))),
                          nb_full(tr, nb_var_dtype(g), 0, NULL, 0.0));
            r->u[i] = nb_mul(inv, g);
        }
    } else if (strcmp(kind, "lion") == 0) {
        nb_var *b1 = nbo_hyper(r, state, spath, "b1"), *b2 = nbo_hyper(r, state, spath, "b2");
        nb_var *wd = nbo_hyper(r, state, spath, "weight_decay");
        mom_keys[n_mom++] = "mu";
        st = nb_trace_status(tr);
        if (st == NB_OK) {
            st = nbo_slot(r, state, spath, "mu", ms.m[0]);
        }
        if (st == NB_OK) {
            nb_var *one = nb_scalar(tr, 1.0);
            nb_var *c1 = nb_sub(one, b1), *c2 = nb_sub(one, b2);
            for (int64_t i = 0; i < r->n; i++) {
                nb_var *g = r->u[i], *mu = ms.m[0][i];
                r->u[i] = nb_sign(nb_add(nb_mul(nbo_as(c1, g), g), nb_mul(nbo_as(b1, g), mu)));
                ms.m[0][i] = nb_add(nb_mul(nbo_as(c2, g), g), nb_mul(nbo_as(b2, g), mu));
            }
            st = nbo_decay_weights(r, opt, wd);
        }
    } else if (strcmp(kind, "clip") == 0) {
        nb_var *md = nbo_hyper(r, state, spath, "max_delta");
        st = nb_trace_status(tr);
        for (int64_t i = 0; st == NB_OK && i < r->n; i++) {
            nb_var *g = r->u[i], *d = nbo_as(md, g);
            r->u[i] = nb_minimum(nb_maximum(g, nb_neg(d)), d);
        }
    } else if (strcmp(kind, "clip_by_global_norm") == 0) {
        nb_var *mx = nbo_hyper(r, state, spath, "max_norm");
        st = nb_trace_status(tr);
        if (st == NB_OK && r->n > 0) {
            nb_var *sq = nbo_sumsq(r->u[0]);
            for (int64_t i = 1; i < r->n; i++) {
                sq = nb_add(sq, nbo_sumsq(r->u[i]));
            }
            nb_var *norm = nb_sqrt(sq);
            nb_var *keep = nb_lt(norm, mx);
            for (int64_t i = 0; i < r->n; i++) {
                nb_var *g = r->u[i];
                r->u[i] = nb_select(keep, g, nb_mul(nb_div(g, nbo_as(norm, g)), nbo_as(mx, g)));
            }
        }
    } else if (strcmp(kind, "add_decayed_weights") == 0) {
        nb_var *wd = nbo_hyper(r, state, spath, "weight_decay");
        st = wd == NULL ? nb_trace_status(tr) : nbo_decay_weights(r, opt, wd);
    } else if (strcmp(kind, "scale_by_schedule") != 0) {
        st = nbo_fail(r, NB_ERR_INVALID, "unknown transform");
    }
    if (st == NB_OK && step != NULL) {
        for (int64_t i = 0; i < r->n; i++) {
            /* Optax's scale: step_size * g */
            r->u[i] = nb_mul(nbo_as(step, r->u[i]), r->u[i]);
        }
    }
    st = st != NB_OK ? st : nb_trace_status(tr);
    nb_tree *vals[4] = {NULL, NULL, NULL, NULL};
    const char *keys[4];
    int nv = 0;
    if (st == NB_OK) {
        keys[nv] = "count";
        vals[nv] = nb_leaf(count_inc);
        nv++;
        for (int k = 0; k < n_mom; k++) {
            keys[nv] = mom_keys[k];
            vals[nv] = nbo_tree_of(r, ms.m[mom_idx[k]]);
            nv++;
        }
        for (int k = 0; k < nv; k++) {
            if (vals[k] == NULL) {
                st = nb_trace_status(tr) != NB_OK ? nb_trace_status(tr) : NB_ERR_OOM;
            }
        }
    }
    nbo_moms_free(r, &ms);
    if (st != NB_OK) {
        return st;
    }
    nb_tree *ns = nbo_new_state(r, state, nv, keys, vals);
    if (ns == NULL) {
        return nb_trace_status(tr);
    }
    *new_state = nb_tree_retain(ns);
    return NB_OK;
}

static nb_status nbo_update(nbo_run *r, const nb_tree *opt, const nb_tree *state, const char *spath,
                            nb_tree **new_state) {
    *new_state = NULL;
    const char *kind = nbo_kind(opt);
    if (kind == NULL) {
        return nbi_trace_err(r->tr, NB_ERR_INVALID,
                             "nb_optim_update: not an optimizer (a dict with a 'transform' string "
                             "made by nb_optim_*)");
    }
    const char *saved = r->kind;
    r->kind = kind;
    nb_status st;
    if (strcmp(kind, "chain") == 0) {
        st = nbo_update_chain(r, opt, state, spath, new_state);
    } else if (strcmp(kind, "masked") == 0) {
        st = nbo_update_masked(r, opt, state, spath, new_state);
    } else if (nb_tree_kind_of(state) != NB_TREE_KIND_DICT) {
        st = nbo_fail(r, NB_ERR_STRUCTURE,
                      "%s is a %s, not the state dict of this optimizer -- make it with "
                      "nb_optim_init from the same optimizer",
                      spath, nb_tree_kind_name(nb_tree_kind_of(state)));
    } else {
        st = nbo_update_leafwise(r, opt, state, spath, new_state);
    }
    r->kind = saved;
    return st;
}

/* Compare the signature (treedef, dtype and shape of every leaf) of two trees. */
static nb_status nbo_check_same(nbo_run *r, const nb_tree *a, const nb_tree *b) {
    nb_tree *la = NULL, *lb = NULL;
    nb_treedef *da = NULL, *db = NULL;
    nb_status st = nb_tree_flatten(a, &la, &da);
    if (st == NB_OK) {
        st = nb_tree_flatten(b, &lb, &db);
    }
    if (st != NB_OK) {
        st = nbi_trace_err(r->tr, st, "nb_optim_update: out of memory");
    } else if (!nb_treedef_equal(da, db)) {
        char how[512] = "";
        bool differ = false;
        nb_tree_diff(a, b, NB_TREE_DIFF_STRUCTURE, &differ, how, sizeof how, NULL);
        st = nbi_trace_err(r->tr, NB_ERR_INTERNAL,
                           "nb_optim_update: the new state's structure differs from the old "
                           "one at %s (a bug in nabla: please report it)",
                           how);
    } else {
        for (int64_t i = 0; i < nb_tree_len(la) && st == NB_OK; i++) {
            char sa[96], sb[96];
            nb_dtype ta, tb;
            int ra, rb;
            const int64_t *sha, *shb;
            nbo_sig_of(nb_tree_child(la, i), r->tr, sa, sizeof sa, &ta, &ra, &sha);
            nbo_sig_of(nb_tree_child(lb, i), r->tr, sb, sizeof sb, &tb, &rb, &shb);
            if (!nbo_same_sig(ta, ra, sha, tb, rb, shb)) {
                char path[NB_PATH_MAX];
                nb_tree_leaf_path(a, i, path, sizeof path, NULL);
                st = nbi_trace_err(r->tr, NB_ERR_INTERNAL,
                                   "nb_optim_update: the new state has %s at %s where the old "
                                   "one has %s (a bug in nabla: please report it)",
                                   sb, path, sa);
            }
        }
    }
    nb_tree_destroy(la);
    nb_tree_destroy(lb);
    nb_treedef_destroy(da);
    nb_treedef_destroy(db);
    return st;
}

/* Record, for each dynamic leaf of the grads in order, the parameter there (its var, or
 * NULL when params hold no array at that position). */
typedef struct nbo_align {
    nbo_run *r;
    int64_t k;
} nbo_align;

static nb_status nbo_align_cb(void *ud, const char *path, int n, const nb_tree *const *l,
                              nb_tree **out) {
    (void)path;
    (void)n;
    nbo_align *a = ud;
    if (a->k < a->r->n) {
        a->r->p[a->k] = nb_tree_is_dynamic(l[1]) ? nbo_var(a->r->tr, l[1]) : NULL;
    }
    a->k++;
    *out = nb_tree_retain((nb_tree *)l[0]);
    return NB_OK;
}

nb_status nb_optim_update(nb_trace *tr, const nb_tree *opt, const nb_tree *grads,
                          const nb_tree *state, const nb_tree *params, const nb_tree **updates,
                          const nb_tree **new_state) {
    if (updates != NULL) {
        *updates = NULL;
    }
    if (new_state != NULL) {
        *new_state = NULL;
    }
    if (tr == NULL) {
        /* no trace to record on: the trees know the context */
        const nb_tree *t[4] = {opt, grads, state, params};
        nb_ctx *ctx = NULL;
        for (int i = 0; i < 4 && ctx == NULL; i++) {
            ctx = nbi_handle_ctx(t[i]);
        }
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "nb_optim_update: tr is NULL (call it inside a traced body with the "
                       "nb_trace * the body received; outside a trace use "
                       "nb_optim_update_eager)");
    }
    if (nb_trace_status(tr) != NB_OK) {
        return nb_trace_status(tr);
    }
    if (updates == NULL || new_state == NULL) {
        return nbi_trace_err(tr, NB_ERR_MISUSE,
                             "nb_optim_update: %s is NULL (pass the address of a const nb_tree * "
                             "to receive it)",
                             updates == NULL ? "updates" : "new_state");
    }
    nb_status cst =
        nbo_trace_trees(tr, "nb_optim_update", 4, (const nb_tree *[]){opt, grads, state, params},
                        (const char *[]){"opt", "grads", "state", "params"},
                        (const bool[]){false, false, false, true});
    if (cst != NB_OK) {
        return cst;
    }
    nbo_run r;
    memset(&r, 0, sizeof r);
    r.tr = tr;
    r.ctx = nb_trace_ctx(tr);
    r.ref = grads;
    r.kind = nbo_kind(opt) != NULL ? nbo_kind(opt) : "?";
    nb_tree *gl = NULL, *aligned = NULL;
    nb_status st = nb_tree_flatten(grads, &gl, &r.def);
    if (st != NB_OK) {
        return nbi_trace_err(tr, st, "nb_optim_update: out of memory");
    }
    r.n = nb_tree_len(gl);
    size_t bytes = (size_t)(r.n > 0 ? r.n : 1) * sizeof(nb_var *);
    r.u = nbi_alloc(r.ctx, bytes, 8);
    r.p = nbi_alloc(r.ctx, bytes, 8);
    if (r.u == NULL || r.p == NULL) {
        st = nbi_trace_err(tr, NB_ERR_OOM, "nb_optim_update: out of memory");
    } else {
        memset(r.p, 0, bytes);
    }
    for (int64_t i = 0; st == NB_OK && i < r.n; i++) {
        r.u[i] = nbo_var(tr, nb_tree_child(gl, i));
        if (!nb_dtype_is_float(nb_var_dtype(r.u[i]))) {
            char path[NB_PATH_MAX], sig[96];
            nb_tree_leaf_path(grads, i, path, sizeof path, NULL);
            nbi_var_sig(sig, sizeof sig, r.u[i]);
            st = nbo_fail(&r, NB_ERR_DTYPE,
                          "grads hold %s at %s; gradients are float arrays (null where there is "
                          "none)",
                          sig, path[0] ? path : "<root>");
        }
    }
    if (st == NB_OK && params != NULL && nb_tree_kind_of(params) != NB_TREE_KIND_NULL) {
        r.have_p = true;
        nbo_align al = {&r, 0};
        const nb_tree *two[2] = {grads, params};
        st = nb_tree_map_n(2, two, nbo_align_cb, &al, 0, &aligned);
        if (st != NB_OK) {
            st = nbo_fail(&r, st, "params do not have the grads' structure: %s",
                          nb_ctx_errmsg(r.ctx));
        }
    }
    nb_tree *ns = NULL;
    if (st == NB_OK) {
        st = nbo_update(&r, opt, state, "state", &ns);
    }
    if (st == NB_OK) {
        st = nbo_check_same(&r, state, ns);
    }
    nb_tree *up = NULL;
    if (st == NB_OK) {
        up = nbo_tree_of(&r, r.u);
        st = up != NULL ? NB_OK : nb_trace_status(tr);
    }
    if (st == NB_OK) {
        *updates = up;
        *new_state = ns; /* owned by the trace (nbo_new_state / chain) */
    }
    nb_tree_destroy(ns);
    nb_tree_destroy(gl);
    nb_tree_destroy(aligned);
    nb_treedef_destroy(r.def);
    if (r.u != NULL) {
        nbi_free(r.ctx, r.u, bytes);
    }
    if (r.p != NULL) {
        nbi_free(r.ctx, r.p, bytes);
    }
    return st != NB_OK ? st : nb_trace_status(tr);
}

/* ---- apply_updates ---------------------------------------------------------------------- */

static nb_status nbo_apply_cb(void *ud, const char *path, int n, const nb_tree *const *l,
                              nb_tree **out) {
    (void)n;
    nb_trace *tr = ud;
    const nb_tree *p = l[0], *u = l[1];
    bool u_null = nb_tree_kind_of(u) == NB_TREE_KIND_NULL;
    if (!nb_tree_is_dynamic(p)) {
        if (!u_null) {
            return nb_tree_map_fail(nb_trace_ctx(tr), NB_ERR_STRUCTURE,
                                    "nb_apply_updates: params hold %s at %s but the updates hold "
                                    "a %s there; updates are null where a parameter is not an "
                                    "array",
                                    nb_tree_kind_name(nb_tree_kind_of(p)),
                                    path[0] ? path : "<root>",
                                    nb_tree_kind_name(nb_tree_kind_of(u)));
        }
        *out = nb_tree_retain((nb_tree *)p);
        return NB_OK;
    }
    nb_var *pv = nbo_var(tr, p);
    nb_tree *leaf = NULL;
    if (u_null) {
        if (nb_tree_kind_of(p) == NB_TREE_KIND_VAR) {
            *out = nb_tree_retain((nb_tree *)p);
            return NB_OK;
        }
        leaf = nb_leaf(pv);
    } else {
        if (!nb_tree_is_dynamic(u)) {
            return nb_tree_map_fail(nb_trace_ctx(tr), NB_ERR_STRUCTURE,
                                    "nb_apply_updates: the update at %s is a %s, not an array or "
                                    "null",
                                    path[0] ? path : "<root>",
                                    nb_tree_kind_name(nb_tree_kind_of(u)));
        }
        nb_var *uv = nbo_var(tr, u);
        if (!nbo_same_sig(nb_var_dtype(uv), nb_var_rank(uv), nb_var_shape(uv), nb_var_dtype(pv),
                          nb_var_rank(pv), nb_var_shape(pv)) &&
            nb_var_rank(uv) == nb_var_rank(pv)) {
            /* a dtype difference is fine (the sum is cast back); a shape one is not */
            bool same_shape = true;
            for (int i = 0; i < nb_var_rank(uv); i++) {
                same_shape = same_shape && nb_var_shape(uv)[i] == nb_var_shape(pv)[i];
            }
            if (!same_shape) {
                uv = NULL;
            }
        } else if (nb_var_rank(uv) != nb_var_rank(pv)) {
            uv = NULL;
        }
        if (uv == NULL) {
            char a[96], b[96];
            nbi_var_sig(a, sizeof a, pv);
            nbi_var_sig(b, sizeof b, nbo_var(tr, u));
            return nb_tree_map_fail(nb_trace_ctx(tr), NB_ERR_SHAPE,
                                    "nb_apply_updates: the parameter at %s is %s but its update "
                                    "is %s",
                                    path[0] ? path : "<root>", a, b);
        }
        /* Optax: (p + u).astype(p.dtype) */
        leaf = nb_leaf(nb_cast(nb_add(nb_cast(pv, nb_var_dtype(uv)), uv), nb_var_dtype(pv)));
    }
    if (leaf == NULL) {
        return nb_trace_status(tr) != NB_OK ? nb_trace_status(tr) : NB_ERR_OOM;
    }
    *out = nb_tree_retain(leaf);
    return NB_OK;
}

const nb_tree *nb_apply_updates(nb_trace *tr, const nb_tree *params, const nb_tree *updates) {
    if (tr == NULL) {
        return NULL;
    }
    if (nb_trace_status(tr) != NB_OK) {
        return NULL;
    }
    if (nbo_trace_trees(tr, "nb_apply_updates", 2, (const nb_tree *[]){params, updates},
                        (const char *[]){"params", "updates"},
                        (const bool[]){false, false}) != NB_OK) {
        return NULL;
    }
    nb_tree *out = NULL;
    const nb_tree *two[2] = {params, updates};
    nb_status st =
        nb_tree_map_n(2, two, nbo_apply_cb, tr, NB_TREE_MAP_NULLS | NB_TREE_MAP_STATIC, &out);
    if (st != NB_OK) {
        if (nb_trace_status(tr) == NB_OK) {
            nbi_trace_err(tr, st, "%s", nb_ctx_errmsg(nb_trace_ctx(tr)));
        }
        return NULL;
    }
    if (nbi_trace_own(tr, out) != NB_OK) {
        return NULL;
    }
    return out;
}

/* ---- eager ----------------------------------------------------------------------------- */

static nb_status nbo_update_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    const nb_tree *params = nb_tree_child(args, 2);
    const nb_tree *up = NULL, *ns = NULL;
    nb_status st =
        nb_optim_update(tr, self, nb_tree_child(args, 0), nb_tree_child(args, 1),
                        nb_tree_kind_of(params) == NB_TREE_KIND_NULL ? NULL : params, &up, &ns);
    if (st != NB_OK) {
        return st;
    }
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (const nb_tree *[]){up, ns}, out);
}

nb_status nb_optim_update_eager(const nb_tree *opt, const nb_tree *grads, const nb_tree *state,
                                const nb_tree *params, nb_tree **updates, nb_tree **new_state) {
    static const char fn[] = "nb_optim_update_eager";
    if (updates != NULL) {
        *updates = NULL;
    }
    if (new_state != NULL) {
        *new_state = NULL;
    }
    const nb_tree *t[4] = {opt, grads, state, params};
    const char *names[4] = {"opt", "grads", "state", "params"};
    nb_ctx *ctx = NULL;
    for (int i = 0; i < 4 && ctx == NULL; i++) {
        ctx = nbi_handle_ctx(t[i]);
    }
    nb_status st = NB_OK;
    for (int i = 0; i < 4 && st == NB_OK; i++) {
        if (t[i] != NULL || i < 3) { /* params may be NULL */
            st = nbi_check_handle_in(ctx, t[i], NBI_MAGIC_TREE, fn, names[i]);
        }
    }
    if (st == NB_OK && (updates == NULL || new_state == NULL)) {
        st = nbi_err_null(ctx, fn, updates == NULL ? "updates" : "new_state",
                          "pass the address of an nb_tree * to receive it");
    }
    if (st != NB_OK) {
        return st;
    }
    ctx = nb_tree_ctx(opt);
    nb_tree *null = NULL, *args = NULL, *res = NULL;
    if (params == NULL) {
        st = nb_tree_null(ctx, &null);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(
            ctx, 3, (const nb_tree *[]){grads, state, params != NULL ? params : null}, &args);
    }
    if (st == NB_OK) {
        st = nb_eval(ctx, nbo_update_body, opt, args, &res);
    }
    if (st == NB_OK) {
        *updates = nb_tree_retain((nb_tree *)nb_tree_child(res, 0));
        *new_state = nb_tree_retain((nb_tree *)nb_tree_child(res, 1));
    }
    nb_tree_destroy(res);
    nb_tree_destroy(args);
    nb_tree_destroy(null);
    return st;
}

static nb_status nbo_apply_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    (void)self;
    const nb_tree *res = nb_apply_updates(tr, nb_tree_child(args, 0), nb_tree_child(args, 1));
    if (res == NULL) {
        return nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)res);
    return NB_OK;
}

nb_status nb_apply_updates_eager(const nb_tree *params, const nb_tree *updates, nb_tree **out) {
    static const char fn[] = "nb_apply_updates_eager";
    if (out != NULL) {
        *out = NULL;
    }
    nb_ctx *ctx = nbi_handle_ctx(params) != NULL ? nbi_handle_ctx(params) : nbi_handle_ctx(updates);
    nb_status st = nbi_check_handle_in(ctx, params, NBI_MAGIC_TREE, fn, "params");
    if (st == NB_OK) {
        st = nbi_check_handle_in(ctx, updates, NBI_MAGIC_TREE, fn, "updates");
    }
    if (st == NB_OK && out == NULL) {
        st = nbi_err_null(ctx, fn, "out", "pass the address of an nb_tree * to receive the result");
    }
    if (st != NB_OK) {
        return st;
    }
    ctx = nb_tree_ctx(params);
    nb_tree *args = NULL;
    st = nb_tree_tuple(ctx, 2, (const nb_tree *[]){params, updates}, &args);
    if (st == NB_OK) {
        st = nb_eval(ctx, nbo_apply_body, NULL, args, out);
    }
    nb_tree_destroy(args);
    return st;
}

/* ---- hyperparameters -------------------------------------------------------------------- */

/* The transform whose state has hyper dict h, as far as the hyperparameter rules need it
 * (nbo_check_hyper): states do not name their transform, but each transform's hyper dict has
 * its own set of names. adam, adamw and lamb share their rules and come back as "adam". */
static const char *nbo_hyper_kind(const nb_tree *h) {
    bool b1 = nb_tree_get(h, "b1") != NULL, eps = nb_tree_get(h, "eps") != NULL;
    if (nb_tree_get(h, "max_delta") != NULL) {
        return "clip";
    }
    if (nb_tree_get(h, "max_norm") != NULL) {
        return "clip_by_global_norm";
    }
    if (b1) {
        return eps ? "adam" : "lion";
    }
    if (nb_tree_get(h, "decay") != NULL) {
        return "rmsprop";
    }
    if (eps) {
        return "adagrad";
    }
    if (nb_tree_get(h, "weight_decay") != NULL && nb_tree_get(h, "learning_rate") == NULL) {
        return "add_decayed_weights";
    }
    return "sgd";
}

typedef enum { NBO_HYPER_GET, NBO_HYPER_CHECK, NBO_HYPER_SET } nbo_hyper_mode;

/* Visit every array under a "hyper" dict entry called name: GET reads the first into *value;
 * CHECK applies the rule of each entry's transform to *value, stopping at the first failure
 * (*st); SET writes *value. Returns the number found. */
static int64_t nbo_hyper_walk(const nb_tree *t, const char *name, nbo_hyper_mode mode,
                              double *value, nb_status *st, int depth) {
    if (depth > NB_TREE_MAX_DEPTH) {
        return 0;
    }
    int64_t found = 0;
    nb_tree_kind k = nb_tree_kind_of(t);
    if (k == NB_TREE_KIND_DICT) {
        const nb_tree *h = nb_tree_get(t, "hyper");
        nb_array *a = nb_tree_get_array(nb_tree_get(h, name));
        if (a != NULL && nb_array_dtype(a) == NB_DTYPE_F64 && nb_array_rank(a) == 0) {
            double *d = nb_array_data(a);
            if (mode == NBO_HYPER_GET) {
                *value = *d;
                return 1;
            }
            if (mode == NBO_HYPER_SET) {
                *d = *value;
            } else if (*st == NB_OK) {
                *st = nbo_check_hyper(nb_tree_ctx(t), "nb_optim_set_hyper", nbo_hyper_kind(h), name,
                                      *value);
            }
            found++;
        }
    }
    /* only through the states' own structure: a chain's tuple and a masked state's
     * "inner" -- never into moments (a parameter dict could hold a key named like a
     * hyperparameter) */
    if (k == NB_TREE_KIND_TUPLE || (k == NB_TREE_KIND_DICT && nb_tree_get(t, "inner") != NULL)) {
        for (int64_t i = 0; i < nb_tree_len(t); i++) {
            if (k == NB_TREE_KIND_DICT && strcmp(nb_tree_key(t, i), "inner") != 0) {
                continue;
            }
            int64_t f = nbo_hyper_walk(nb_tree_child(t, i), name, mode, value, st, depth + 1);
            found += f;
            if (mode == NBO_HYPER_GET && f > 0) {
                return found;
            }
        }
    }
    return found;
}

static nb_status nbo_hyper_missing(const nb_tree *state, const char *who, const char *name) {
    return nbi_err(nb_tree_ctx(state), NB_ERR_NOT_FOUND,
                   "%s: the state has no hyperparameter '%s' (an optimizer with a learning-rate "
                   "schedule has none called learning_rate; see the state's hyper dicts with "
                   "nb_tree_format)",
                   who, name);
}

/* The entry checks of the hyperparameter calls: a live state, a name, an out-parameter (when
 * the call has one: out_name non-NULL). */
static nb_status nbo_hyper_args(const nb_tree *state, const char *fn, const char *name,
                                const char *out_name, const void *out) {
    nb_status st = nbi_check_handle(state, NBI_MAGIC_TREE, fn, "state");
    if (st == NB_OK && name == NULL) {
        st = nbi_err_null(nb_tree_ctx(state), fn, "name",
                          "pass a hyperparameter's name, e.g. \"learning_rate\"");
    }
    if (st == NB_OK && out_name != NULL && out == NULL) {
        st = nbi_err(nb_tree_ctx(state), NB_ERR_MISUSE,
                     "%s: %s is NULL (pass the address of a variable to receive it)", fn, out_name);
    }
    return st;
}

nb_status nb_optim_set_hyper(const nb_tree *state, const char *name, double value) {
    nb_status st = nbo_hyper_args(state, "nb_optim_set_hyper", name, NULL, NULL);
    if (st != NB_OK) {
        return st;
    }
    /* every entry is checked before any is written: a refused value changes nothing */
    if (nbo_hyper_walk(state, name, NBO_HYPER_CHECK, &value, &st, 0) == 0) {
        return nbo_hyper_missing(state, "nb_optim_set_hyper", name);
    }
    if (st == NB_OK) {
        nbo_hyper_walk(state, name, NBO_HYPER_SET, &value, &st, 0);
    }
    return st;
}

nb_status nb_optim_get_hyper(const nb_tree *state, const char *name, double *value) {
    if (value != NULL) {
        *value = 0.0;
    }
    nb_status st = nbo_hyper_args(state, "nb_optim_get_hyper", name, "value", value);
    if (st != NB_OK) {
        return st;
    }
    if (nbo_hyper_walk(state, name, NBO_HYPER_GET, value, &st, 0) == 0) {
        return nbo_hyper_missing(state, "nb_optim_get_hyper", name);
    }
    return NB_OK;
}

static bool nbo_count_walk(const nb_tree *t, int64_t *count, int depth) {
    nb_tree_kind k = nb_tree_kind_of(t);
    if (depth > NB_TREE_MAX_DEPTH) {
        return false;
    }
    if (k == NB_TREE_KIND_DICT) {
        nb_array *a = nb_tree_get_array(nb_tree_get(t, "count"));
        if (a != NULL && nb_array_dtype(a) == NB_DTYPE_I32 && nb_array_rank(a) == 0) {
            *count = *(const int32_t *)nb_array_data(a);
            return true;
        }
    }
    if (k == NB_TREE_KIND_DICT || k == NB_TREE_KIND_LIST || k == NB_TREE_KIND_TUPLE) {
        for (int64_t i = 0; i < nb_tree_len(t); i++) {
            if (nbo_count_walk(nb_tree_child(t, i), count, depth + 1)) {
                return true;
            }
        }
    }
    return false;
}

nb_status nb_optim_count(const nb_tree *state, int64_t *count) {
    if (count != NULL) {
        *count = 0;
    }
    nb_status st = nbo_hyper_args(state, "nb_optim_count", "", "count", count);
    if (st != NB_OK) {
        return st;
    }
    if (!nbo_count_walk(state, count, 0)) {
        return nbi_err(nb_tree_ctx(state), NB_ERR_NOT_FOUND,
                       "nb_optim_count: no i32[] 'count' array in the state (is it an optimizer "
                       "state made by nb_optim_init?)");
    }
    return NB_OK;
}

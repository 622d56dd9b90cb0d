/*
 * train.c -- the training step builder (nabla/train.h).
 *
 * nb_train_step wraps value_and_grad(loss) in a TRAIN layer (spec: (opt, filter spec or
 * null, nb_train_run's donate spec (true, true, false) or null)) and jits it. Traced, the layer's
 * body is the step every training program wrote by hand: the gradient layer on (params, *batch),
 * nb_optim_update, nb_apply_updates, and the tuple (params', state', loss[, aux]). Its identity is
 * the layers' (the loss's body and bound data, has_aux, the filter spec, the optimizer by value),
 * so equal steps built again share the compiled code.
 */
#include "ad/ir.h"

#include <nabla/ad.h>
#include <nabla/optim.h>
#include <nabla/train.h>

#include <math.h>
#include <string.h>

nb_train_opts nb_train_opts_default(void) {
    nb_train_opts o;
    memset(&o, 0, sizeof o);
    o.donate = true;
    o.jit = nb_jit_opts_default();
    return o;
}

static bool nbt_is_opt(const nb_tree *opt) {
    return nb_tree_kind_of(nb_tree_get(opt, "transform")) == NB_TREE_KIND_STRING;
}

nb_status nb_train_step(nb_fn *loss, const nb_tree *opt, const nb_train_opts *opts, nb_fn **out) {
    static const char fn[] = "nb_train_step";
    if (out != NULL) {
        *out = NULL;
    }
    nb_train_opts o = opts != NULL ? *opts : nb_train_opts_default();
    nb_status st = nbi_check_handle_in(nbi_handle_ctx(opt), loss, NBI_MAGIC_FN, fn, "loss");
    if (st != NB_OK) {
        return st;
    }
    nb_ctx *ctx = loss->hdr.ctx;
    st = nbi_check_handle_in(ctx, opt, NBI_MAGIC_TREE, fn, "opt");
    if (st == NB_OK && o.filter_spec != NULL) {
        st = nbi_check_handle_in(ctx, o.filter_spec, NBI_MAGIC_TREE, fn, "opts->filter_spec");
    }
    if (st != NB_OK) {
        return st;
    }
    if (out == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_fn * for the step)", fn);
    }
    if (!nbt_is_opt(opt)) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: opt is not an optimizer (a dict with a 'transform' string made by "
                       "nb_optim_*, e.g. nb_optim_adam(ctx, 1e-3, NULL, &opt))",
                       fn);
    }
    nb_grad_opts go = nb_grad_opts_default();
    go.has_aux = o.has_aux;
    go.filter_spec = o.filter_spec;
    nb_fn *vg = NULL, *t = NULL;
    nb_tree *parts[3] = {NULL, NULL, NULL}, *spec = NULL;
    st = nb_value_and_grad(loss, &go, &vg);
    if (st == NB_OK) {
        parts[0] = nb_tree_retain((nb_tree *)opt);
        st = o.filter_spec != NULL ? (parts[1] = nb_tree_retain((nb_tree *)o.filter_spec), NB_OK)
                                   : nb_tree_null(ctx, &parts[1]);
    }
    nb_tree *yes = NULL, *no = NULL; /* spec[2]: nb_train_run's donate spec, or null */
    if (st == NB_OK && o.donate) {
        st = nb_tree_bool(ctx, true, &yes);
        if (st == NB_OK) {
            st = nb_tree_bool(ctx, false, &no);
        }
        if (st == NB_OK) {
            st = nb_tree_tuple(ctx, 3, (nb_tree *[]){yes, yes, no}, &parts[2]);
        }
    } else if (st == NB_OK) {
        st = nb_tree_null(ctx, &parts[2]);
    }
    nb_tree_destroy(yes);
    nb_tree_destroy(no);
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 3, parts, &spec);
    }
    if (st == NB_OK) {
        st = nbi_fn_wrap(vg, fn, NBI_FN_TRAIN, 0, true, &t);
    }
    if (st == NB_OK) {
        t->has_aux = o.has_aux;
        t->spec = spec;
        spec = NULL;
        st = nb_jit(t, &o.jit, out);
    }
    for (int i = 0; i < 3; i++) {
        nb_tree_destroy(parts[i]);
    }
    nb_tree_destroy(spec);
    nb_fn_destroy(t);
    nb_fn_destroy(vg);
    return st;
}

/* The loss's (or a metric's) arguments: the tuple (params, *batch) -- a tuple or list batch
 * spread, a NULL or null batch none, any other tree as one item. *out a new tree. */
static nb_status nbt_loss_args(nb_ctx *ctx, const nb_tree *params, const nb_tree *batch,
                               nb_tree **out) {
    nb_tree_kind k = batch != NULL ? nb_tree_kind_of(batch) : NB_TREE_KIND_NULL;
    bool spread = k == NB_TREE_KIND_TUPLE || k == NB_TREE_KIND_LIST;
    int64_t n = spread ? nb_tree_len(batch) : k == NB_TREE_KIND_NULL ? 0 : 1;
    size_t bytes = (size_t)(n + 1) * sizeof(const nb_tree *);
    const nb_tree **items = nbi_alloc(ctx, bytes, sizeof(void *));
    if (items == NULL) {
        return nbi_oom(ctx, "nb_train_step", bytes);
    }
    items[0] = params;
    for (int64_t i = 0; i < n; i++) {
        items[1 + i] = spread ? nb_tree_child(batch, i) : batch;
    }
    nb_status st = nb_tree_tuple(ctx, n + 1, items, out);
    nbi_free(ctx, items, bytes);
    return st;
}

/* The TRAIN layer under step's wrappers, or NULL. */
static const nb_fn *nbt_layer(const nb_fn *step) {
    for (const nb_fn *g = step; g != NULL && g->kind != NBI_FN_PLAIN; g = g->inner) {
        if (g->kind == NBI_FN_TRAIN) {
            return g;
        }
    }
    return NULL;
}

/* step checked (errors recorded on step's context, else on hint's) and its TRAIN layer */
static nb_status nbt_step_of(const char *fn, nb_ctx *hint, const nb_fn *step, const nb_fn **layer) {
    nb_status st = nbi_check_handle_in(hint, step, NBI_MAGIC_FN, fn, "step");
    if (st != NB_OK) {
        return st;
    }
    *layer = nbt_layer(step);
    if (*layer == NULL) {
        return nbi_err(step->hdr.ctx, NB_ERR_INVALID,
                       "%s: '%s' is not a training step (make it with nb_train_step)", fn,
                       step->name);
    }
    return NB_OK;
}

nb_status nb_train_init(const nb_fn *step, const nb_tree *params, nb_tree **state) {
    static const char fn[] = "nb_train_init";
    if (state != NULL) {
        *state = NULL;
    }
    const nb_fn *layer = NULL;
    nb_status st = nbt_step_of(fn, nbi_handle_ctx(params), step, &layer);
    if (st != NB_OK) {
        return st;
    }
    nb_ctx *ctx = step->hdr.ctx;
    st = nbi_check_handle_in(ctx, params, NBI_MAGIC_TREE, fn, "params");
    if (st != NB_OK) {
        return st;
    }
    if (state == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: state is NULL (pass the address of an nb_tree * for the state)", fn);
    }
    const nb_tree *filter = nb_tree_child(layer->spec, 1);
    nb_tree *tmpl = NULL;
    st = nb_grad_template(params, nb_tree_kind_of(filter) == NB_TREE_KIND_NULL ? NULL : filter,
                          &tmpl);
    if (st == NB_OK) {
        st = nb_optim_init(nb_tree_child(layer->spec, 0), tmpl, state);
    }
    nb_tree_destroy(tmpl);
    return st;
}

nb_status nb_train_run(nb_fn *step, nb_tree **params, nb_tree **state, const nb_tree *batch,
                       double *loss, nb_tree **aux) {
    static const char fn[] = "nb_train_run";
    if (aux != NULL) {
        *aux = NULL;
    }
    if (loss != NULL) {
        *loss = 0.0;
    }
    const nb_fn *layer = NULL;
    nb_status st = nbt_step_of(fn, nbi_handle_ctx(params != NULL ? *params : NULL), step, &layer);
    if (st != NB_OK) {
        return st;
    }
    nb_ctx *ctx = step->hdr.ctx;
    if (params == NULL || state == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: %s is NULL (pass the address of the nb_tree * holding the %s; it "
                       "is replaced by the new one)",
                       fn, params == NULL ? "params" : "state",
                       params == NULL ? "parameters" : "optimizer state (from nb_train_init)");
    }
    st = nbi_check_handle_in(ctx, *params, NBI_MAGIC_TREE, fn, "*params");
    if (st == NB_OK) {
        st = nbi_check_handle_in(ctx, *state, NBI_MAGIC_TREE, fn, "*state");
    }
    if (st == NB_OK && batch != NULL) {
        st = nbi_check_handle_in(ctx, batch, NBI_MAGIC_TREE, fn, "batch");
    }
    if (st != NB_OK) {
        return st;
    }
    if (aux != NULL && !layer->has_aux) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: aux is not NULL but the step was built without has_aux (the loss "
                       "returns no aux; pass NULL, or build the step with opts.has_aux)",
                       fn);
    }
    const nb_tree *dspec = nb_tree_child(layer->spec, 2); /* made with the step */
    nb_tree *b = NULL, *args = NULL, *res = NULL;
    st = batch != NULL ? (b = nb_tree_retain((nb_tree *)batch), NB_OK) : nb_tree_null(ctx, &b);
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 3, (nb_tree *[]){*params, *state, b}, &args);
    }
    nb_call_opts co = nb_call_opts_default();
    co.donate = nb_tree_kind_of(dspec) == NB_TREE_KIND_NULL ? NULL : dspec;
    if (st == NB_OK) {
        st = nb_fn_call_ex(step, args, &co, &res);
    }
    if (st == NB_OK) {
        nb_tree_destroy(*params);
        nb_tree_destroy(*state);
        *params = nb_tree_retain((nb_tree *)nb_tree_child(res, 0));
        *state = nb_tree_retain((nb_tree *)nb_tree_child(res, 1));
        if (loss != NULL) {
            const nb_array *l = nb_tree_get_array(nb_tree_child(res, 2));
            double v = 0.0;
            *loss = l != NULL && nb_array_get_flat(l, 0, &v) == NB_OK ? v : NAN;
        }
        if (aux != NULL) {
            *aux = nb_tree_retain((nb_tree *)nb_tree_child(res, 3));
        }
    }
    nb_tree_destroy(res);
    nb_tree_destroy(args);
    nb_tree_destroy(b);
    return st;
}

nb_status nb_train_eval(nb_fn *f, const nb_tree *params, const nb_tree *batch, nb_tree **out) {
    static const char fn[] = "nb_train_eval";
    if (out != NULL) {
        *out = NULL;
    }
    nb_status st = nbi_check_handle_in(nbi_handle_ctx(params), f, NBI_MAGIC_FN, fn, "f");
    if (st != NB_OK) {
        return st;
    }
    nb_ctx *ctx = f->hdr.ctx;
    st = nbi_check_handle_in(ctx, params, NBI_MAGIC_TREE, fn, "params");
    if (st == NB_OK && batch != NULL) {
        st = nbi_check_handle_in(ctx, batch, NBI_MAGIC_TREE, fn, "batch");
    }
    if (st == NB_OK && out == NULL) {
        st = nbi_err(ctx, NB_ERR_MISUSE,
                     "%s: out is NULL (pass the address of an nb_tree * for f's output)", fn);
    }
    if (st != NB_OK) {
        return st;
    }
    nb_tree *args = NULL;
    st = nbt_loss_args(ctx, params, batch, &args);
    if (st == NB_OK) {
        st = nb_fn_call(f, args, out);
    }
    nb_tree_destroy(args);
    return st;
}

/* ---- the layer's body ------------------------------------------------------------------ */

nb_status nbi_trace_train(nb_trace *tr, const nb_fn *f, const nb_tree *self, const nb_tree *args,
                          nb_tree **out) {
    *out = NULL;
    if (args->kind != NB_TREE_KIND_TUPLE && args->kind != NB_TREE_KIND_LIST) {
        return nbi_trace_err(tr, NB_ERR_STRUCTURE,
                             "nb_train_step: the step's arguments are a %s; they must be the "
                             "tuple (params, state, batch)",
                             nb_tree_kind_name(args->kind));
    }
    if (args->n != 3) {
        return nbi_trace_err(tr, NB_ERR_STRUCTURE,
                             "nb_train_step: the step was called with %lld arguments; it takes "
                             "the tuple (params, state, batch) (batch null for none)",
                             (long long)args->n);
    }
    nb_ctx *ctx = tr->ctx;
    const nb_tree *params = nb_tree_child(args, 0), *state = nb_tree_child(args, 1);
    const nb_tree *batch = nb_tree_child(args, 2);
    nb_tree *largs = NULL, *vg = NULL;
    nb_status st = nbt_loss_args(ctx, params, batch, &largs); /* (params, *batch) */
    if (st != NB_OK) {
        return nbi_trace_err(tr, st, "nb_train_step: out of memory");
    }
    st = nbi_trace_fn(tr, f->inner, self, largs, &vg); /* ((loss[, aux]) , grads) */
    nb_tree_destroy(largs);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *opt = nb_tree_child(f->spec, 0), *updates = NULL, *new_state = NULL;
    st = nb_optim_update(tr, opt, nb_tree_child(vg, 1), state, params, &updates, &new_state);
    const nb_tree *new_params = st == NB_OK ? nb_apply_updates(tr, params, updates) : NULL;
    if (new_params == NULL) {
        nb_tree_destroy(vg);
        return nb_trace_status(tr);
    }
    const nb_tree *value = nb_tree_child(vg, 0);
    const nb_tree *res[4] = {new_params, new_state, f->has_aux ? nb_tree_child(value, 0) : value,
                             f->has_aux ? nb_tree_child(value, 1) : NULL};
    st = nb_tree_tuple(ctx, f->has_aux ? 4 : 3, res, out);
    nb_tree_destroy(vg);
    if (st != NB_OK) {
        return nbi_trace_err(tr, st, "nb_train_step: out of memory");
    }
    return nb_trace_status(tr);
}

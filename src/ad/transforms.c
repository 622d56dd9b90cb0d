/*
 * transforms.c -- grad, value_and_grad, vjp and jvp as function transforms (nabla/ad.h).
 *
 * Each is an nb_fn layer. Tracing it traces the inner function into the same trace (its
 * region of nodes), then runs reverse or forward mode over that region (autodiff.c). The
 * differentiated inputs first go through an identity node each, so that two leaves that
 * hold the same var still get their own gradients, and so that the region's inputs are
 * distinct nodes.
 */
#include "ad/ir.h"

#include <string.h>

/* ---- building the transforms -------------------------------------------------------- */

nb_grad_opts nb_grad_opts_default(void) {
    nb_grad_opts o;
    memset(&o, 0, sizeof o);
    return o;
}

static nb_status nbi_transform(nb_fn *f, const char *fn_name, nbi_fn_kind kind,
                               const nb_grad_opts *opts, bool with_value, nb_fn **out) {
    if (out != NULL) {
        *out = NULL;
    }
    nb_grad_opts o = opts ? *opts : nb_grad_opts_default();
    nb_status st =
        nbi_check_handle_in(nbi_handle_ctx(o.filter_spec), f, NBI_MAGIC_FN, fn_name, "f");
    if (st != NB_OK) {
        return st;
    }
    if (out == NULL) {
        return nbi_err(f->hdr.ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_fn * for the new function)",
                       fn_name);
    }
    if (o.filter_spec != NULL) {
        st = nbi_check_handle_in(f->hdr.ctx, o.filter_spec, NBI_MAGIC_TREE, fn_name,
                                 "opts->filter_spec");
        if (st != NB_OK) {
            return st;
        }
    }
    nb_fn *g = NULL;
    st = nbi_fn_wrap(f, fn_name, kind, 0, true, &g);
    if (st != NB_OK) {
        return st;
    }
    g->has_aux = o.has_aux;
    g->with_value = with_value;
    g->spec = o.filter_spec ? nb_tree_retain((nb_tree *)o.filter_spec) : NULL;
    *out = g;
    return NB_OK;
}

nb_status nb_grad(nb_fn *f, const nb_grad_opts *opts, nb_fn **out) {
    return nbi_transform(f, "nb_grad", NBI_FN_GRAD, opts, false, out);
}

nb_status nb_value_and_grad(nb_fn *f, const nb_grad_opts *opts, nb_fn **out) {
    return nbi_transform(f, "nb_value_and_grad", NBI_FN_GRAD, opts, true, out);
}

nb_status nb_vjp(nb_fn *f, nb_fn **out) {
    return nbi_transform(f, "nb_vjp", NBI_FN_VJP, NULL, false, out);
}

nb_status nb_jvp(nb_fn *f, nb_fn **out) {
    return nbi_transform(f, "nb_jvp", NBI_FN_JVP, NULL, false, out);
}

nb_status nb_custom_vjp(nb_fn *f, nb_fn *fwd, nb_fn *bwd, nb_fn **out) {
    if (out != NULL) {
        *out = NULL;
    }
    static const char fn[] = "nb_custom_vjp";
    nb_ctx *ctx = nbi_handle_ctx(f);
    ctx = ctx != NULL ? ctx : nbi_handle_ctx(fwd);
    ctx = ctx != NULL ? ctx : nbi_handle_ctx(bwd);
    nb_status st = nbi_check_handle_in(ctx, f, NBI_MAGIC_FN, fn, "f");
    if (st == NB_OK) {
        st = nbi_check_handle_in(ctx, fwd, NBI_MAGIC_FN, fn, "fwd");
    }
    if (st == NB_OK) {
        st = nbi_check_handle_in(ctx, bwd, NBI_MAGIC_FN, fn, "bwd");
    }
    if (st == NB_OK && out == NULL) {
        st = nbi_err(ctx, NB_ERR_MISUSE,
                     "%s: out is NULL (pass the address of an nb_fn * for the new function)", fn);
    }
    if (st != NB_OK) {
        return st;
    }
    nb_fn *g = NULL;
    st = nbi_fn_wrap(f, fn, NBI_FN_CUSTOM_VJP, 0, true, &g);
    if (st != NB_OK) {
        return st;
    }
    g->fwd = nb_fn_retain(fwd);
    g->bwd = nb_fn_retain(bwd);
    *out = g;
    return NB_OK;
}

/* ---- marking the differentiated leaves ---------------------------------------------- */

typedef struct nbi_mark {
    nb_trace *tr;
    const char *who; /* "nb_grad" ... for messages */
    nb_var **wrt;    /* identity vars, in leaf order */
    int n_wrt, cap;
    bool use_leaves; /* template mode: arrays, no trace */
    nb_ctx *ctx;
} nbi_mark;

static bool nbi_leaf_differentiable(const nb_tree *t) {
    if (t->flags & NBI_TREE_FLAG_FROZEN) {
        return false;
    }
    if (t->kind == NB_TREE_KIND_VAR) {
        return nbi_is_float_var(t->u.var.var);
    }
    return t->kind == NB_TREE_KIND_ARRAY && nb_dtype_is_float(t->u.array->dtype);
}

static nb_status nbi_mark_push(nbi_mark *m, nb_var *v) {
    if (m->n_wrt == m->cap) {
        int cap = m->cap ? m->cap * 2 : 16;
        nb_var **w = nbi_arena_alloc(&m->tr->arena, (size_t)cap * sizeof(nb_var *));
        if (w == NULL) {
            return nbi_trace_err(m->tr, NB_ERR_OOM, "%s: out of memory", m->who);
        }
        if (m->n_wrt > 0) {
            memcpy(w, m->wrt, (size_t)m->n_wrt * sizeof(nb_var *));
        }
        m->wrt = w;
        m->cap = cap;
    }
    m->wrt[m->n_wrt++] = v;
    return NB_OK;
}

static nb_status nbi_mark_fail(nbi_mark *m, nb_status st, const char *fmt, const char *a,
                               const char *b) {
    if (m->tr != NULL) {
        return nbi_trace_err(m->tr, st, fmt, m->who, a, b);
    }
    return nbi_err(m->ctx, st, fmt, m->who, a, b);
}

/* Copy x, replacing each differentiable var leaf allowed by the spec with an identity of
 * it (collected in m->wrt), or -- in template mode -- each differentiable array leaf with
 * zeros and every other leaf with null. */
static nb_status nbi_mark_rec(nbi_mark *m, const nb_tree *x, const nb_tree *spec, bool allowed,
                              nbi_path *path, nb_tree **out) {
    *out = NULL;
    if (spec != NULL && spec->kind == NB_TREE_KIND_BOOL) {
        allowed = allowed && spec->u.b;
        spec = NULL;
    } else if (spec != NULL && spec->kind == NB_TREE_KIND_NULL) {
        allowed = false;
        spec = NULL;
    }
    if (nbi_tree_kind_is_node(x->kind)) {
        if (spec != NULL && (spec->kind != x->kind || spec->n != x->n)) {
            char a[64], b[64];
            snprintf(a, sizeof a, "%s of %lld", nb_tree_kind_name(spec->kind), (long long)spec->n);
            snprintf(b, sizeof b, "%s of %lld", nb_tree_kind_name(x->kind), (long long)x->n);
            char msg[256];
            snprintf(msg, sizeof msg,
                     "%%s: the filter spec does not match args[0] at %s: %%s "
                     "vs %%s (a spec is a tree of bools shaped like args[0], or a prefix of it)",
                     nbi_path_str(path));
            return nbi_mark_fail(m, NB_ERR_STRUCTURE, msg, a, b);
        }
        size_t bytes = (size_t)(x->n > 0 ? x->n : 1) * sizeof(nb_tree *);
        nb_tree **items = nbi_alloc(m->ctx, bytes, 8);
        if (items == NULL) {
            return nbi_mark_fail(m, NB_ERR_OOM, "%s: out of memory%s%s", "", "");
        }
        nb_status st = NB_OK;
        int64_t made = 0;
        for (int64_t i = 0; i < x->n && st == NB_OK; i++) {
            if (spec != NULL && x->kind == NB_TREE_KIND_DICT &&
                strcmp(spec->keys[i], x->keys[i]) != 0) {
                char msg[256];
                snprintf(msg, sizeof msg,
                         "%%s: the filter spec has key \"%%s\" where args[0] "
                         "has \"%%s\" (at %s)",
                         nbi_path_str(path));
                st = nbi_mark_fail(m, NB_ERR_STRUCTURE, msg, spec->keys[i], x->keys[i]);
                break;
            }
            nbi_path_mark pm = nbi_path_save(path);
            if (x->kind == NB_TREE_KIND_DICT) {
                nbi_path_push_key(path, x->keys[i]);
            } else {
                nbi_path_push_index(path, i);
            }
            st = nbi_mark_rec(m, x->children[i], spec ? spec->children[i] : NULL, allowed, path,
                              &items[i]);
            nbi_path_restore(path, pm);
            if (st == NB_OK) {
                made++;
            }
        }
        if (st == NB_OK) {
            st = nbi_tree_node_take(m->ctx, m->who, x->kind, x->n, (const char *const *)x->keys,
                                    items, out);
            if (st == NB_OK) {
                (*out)->flags = x->flags;
            }
        } else {
            for (int64_t i = 0; i < made; i++) {
                nb_tree_destroy(items[i]);
            }
        }
        nbi_free(m->ctx, items, bytes);
        return st;
    }
    if (spec != NULL) {
        char a[64];
        snprintf(a, sizeof a, "%s", nb_tree_kind_name(spec->kind));
        char msg[256];
        snprintf(msg, sizeof msg,
                 "%%s: the filter spec has a %%s at %s, where args[0] has a "
                 "leaf%%s (use a bool)",
                 nbi_path_str(path));
        return nbi_mark_fail(m, NB_ERR_STRUCTURE, msg, a, "");
    }
    bool diff = allowed && nbi_leaf_differentiable(x);
    if (m->use_leaves) {
        if (!diff) {
            return nb_tree_null(m->ctx, out);
        }
        nb_array *z = NULL;
        nb_status st =
            nb_array_zeros(m->ctx, x->u.array->dtype, x->u.array->rank, x->u.array->shape, &z);
        if (st == NB_OK) {
            st = nb_tree_array(z, out);
        }
        nb_array_destroy(z);
        return st;
    }
    if (!diff) {
        *out = nb_tree_retain((nb_tree *)x);
        return NB_OK;
    }
    nb_var *v = x->u.var.var;
    nb_var *id = nbi_emit(m->tr, NBI_OP_IDENTITY, 1, &v, NULL);
    nb_status st = nbi_mark_push(m, id);
    if (st == NB_OK && nbi_tree_var(m->ctx, id, m->tr->id, out) != NB_OK) {
        st = nbi_trace_err(m->tr, NB_ERR_OOM, "%s: out of memory", m->who);
    }
    if (st == NB_OK) {
        (*out)->flags = x->flags;
    }
    if (st == NB_OK && m->tr->status != NB_OK) { /* the identity failed: the caller keeps no
                                                    leaf on failure, so none is made */
        nb_tree_destroy(*out);
        *out = NULL;
    }
    return st != NB_OK ? st : m->tr->status;
}

nb_status nb_grad_template(const nb_tree *params, const nb_tree *filter_spec, nb_tree **out) {
    if (out != NULL) {
        *out = NULL;
    }
    static const char fn[] = "nb_grad_template";
    nb_ctx *ctx =
        nbi_handle_ctx(params) != NULL ? nbi_handle_ctx(params) : nbi_handle_ctx(filter_spec);
    nb_status st = nbi_check_handle_in(ctx, params, NBI_MAGIC_TREE, fn, "params");
    if (st == NB_OK && filter_spec != NULL) {
        st = nbi_check_handle_in(ctx, filter_spec, NBI_MAGIC_TREE, fn, "filter_spec");
    }
    if (st == NB_OK && out == NULL) {
        st = nbi_err(ctx, NB_ERR_MISUSE,
                     "%s: out is NULL (pass the address of an nb_tree * for the template)", fn);
    }
    if (st != NB_OK) {
        return st;
    }
    nbi_mark m;
    memset(&m, 0, sizeof m);
    m.who = "nb_grad_template";
    m.use_leaves = true;
    m.ctx = params->hdr.ctx;
    nbi_path path;
    nbi_path_init(&path);
    return nbi_mark_rec(&m, params, filter_spec, true, &path, out);
}

/* ---- tracing a transform ------------------------------------------------------------ */

/* A copy of node args with child 0 replaced by first (a new reference). */
static nb_status nbi_replace_first(nb_trace *tr, const nb_tree *args, nb_tree *first,
                                   nb_tree **out) {
    size_t bytes = (size_t)args->n * sizeof(nb_tree *);
    nb_tree **items = nbi_alloc(tr->ctx, bytes, 8);
    if (items == NULL) {
        return nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
    }
    for (int64_t i = 0; i < args->n; i++) {
        items[i] = nb_tree_retain(i == 0 ? first : args->children[i]);
    }
    nb_status st = nbi_tree_node_take(tr->ctx, "transform", args->kind, args->n,
                                      (const char *const *)args->keys, items, out);
    nbi_free(tr->ctx, items, bytes);
    return st == NB_OK ? NB_OK : nbi_trace_err(tr, st, "out of memory");
}

/* A tree of x's structure: at the k-th differentiable var leaf (in m's order) a var leaf of
 * vals[k], null elsewhere. */
typedef struct nbi_fill {
    nb_trace *tr;
    nb_var *const *wrt;
    nb_var *const *vals;
    int n, next;
} nbi_fill;

static nb_status nbi_fill_cb(void *ud, const char *path, int n, const nb_tree *const *l,
                             nb_tree **out) {
    (void)path;
    (void)n;
    nbi_fill *f = ud;
    const nb_tree *leaf = l[0];
    if (leaf->kind == NB_TREE_KIND_VAR && f->next < f->n && leaf->u.var.var == f->wrt[f->next]) {
        nb_var *v = f->vals[f->next++];
        return nbi_tree_var(f->tr->ctx, v, f->tr->id, out) == NB_OK ? NB_OK : NB_ERR_OOM;
    }
    return nb_tree_null(f->tr->ctx, out);
}

static nb_status nbi_fill_tree(nb_trace *tr, const nb_tree *x, nb_var *const *wrt,
                               nb_var *const *vals, int n, nb_tree **out) {
    nbi_fill f = {tr, wrt, vals, n, 0};
    nb_status st = nb_tree_map(x, nbi_fill_cb, &f, NB_TREE_MAP_NULLS | NB_TREE_MAP_STATIC, out);
    return st == NB_OK ? NB_OK : nbi_trace_err(tr, st, "out of memory building a gradient");
}

/* Pair the float var leaves of res with the leaves of a tree of the same structure. */
typedef struct nbi_pairs {
    nb_trace *tr;
    const char *who;
    const char *what;    /* the leaves of res in messages: "primal", "output", "argument" */
    const char *partner; /* the partner's: "tangent", "cotangent" */
    nb_var **a, **b;     /* res var, partner var (NULL when the partner is null) */
    int n, cap;
} nbi_pairs;

static nb_status nbi_pairs_cb(void *ud, const char *path, int n, const nb_tree *const *l,
                              nb_tree **out) {
    (void)n;
    nbi_pairs *p = ud;
    nb_trace *tr = p->tr;
    const nb_tree *x = l[0], *y = l[1];
    if (x->kind == NB_TREE_KIND_VAR && nbi_is_float_var(x->u.var.var)) {
        nb_var *yv = NULL;
        if (y->kind == NB_TREE_KIND_VAR) {
            yv = y->u.var.var;
            const nb_var *xv = x->u.var.var;
            bool same_shape = yv->rank == xv->rank &&
                              memcmp(yv->shape, xv->shape, (size_t)xv->rank * sizeof(int64_t)) == 0;
            if (yv->dtype != xv->dtype || !same_shape) {
                /* core.h: a dtype mismatch is NB_ERR_DTYPE (whatever the shapes) */
                char a[NBI_SIG_CAP], b[NBI_SIG_CAP];
                return nbi_trace_err(
                    tr, yv->dtype != xv->dtype ? NB_ERR_DTYPE : NB_ERR_SHAPE,
                    "%s: at %s the %s is %s but its %s is %s (a %s must have "
                    "the dtype and shape of its %s%s)",
                    p->who, path[0] ? path : "<root>", p->what, nbi_var_sig(a, sizeof a, xv),
                    p->partner, nbi_var_sig(b, sizeof b, yv), p->partner, p->what,
                    yv->dtype != xv->dtype ? "; convert it with nb_array_cast" : "");
            }
        } else if (y->kind != NB_TREE_KIND_NULL) {
            return nbi_trace_err(tr, NB_ERR_KIND, "%s: at %s a %s must be an array or null, not %s",
                                 p->who, path[0] ? path : "<root>", p->partner,
                                 nb_tree_kind_name(y->kind));
        }
        if (p->n == p->cap) {
            int cap = p->cap ? p->cap * 2 : 16;
            nb_var **a = nbi_arena_alloc(&tr->arena, (size_t)cap * 2 * sizeof(nb_var *));
            if (a == NULL) {
                return nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", p->who);
            }
            if (p->n > 0) {
                memcpy(a, p->a, (size_t)p->n * sizeof(nb_var *));
                memcpy(a + cap, p->b, (size_t)p->n * sizeof(nb_var *));
            }
            p->a = a;
            p->b = a + cap;
            p->cap = cap;
        }
        p->a[p->n] = x->u.var.var;
        p->b[p->n] = yv;
        p->n++;
    }
    return nb_tree_null(tr->ctx, out);
}

static nb_status nbi_pair_up(nb_trace *tr, const char *who, const char *what,
                             const char *partner_what, const nb_tree *res, const nb_tree *partner,
                             nbi_pairs *p) {
    memset(p, 0, sizeof *p);
    p->tr = tr;
    p->who = who;
    p->what = what;
    p->partner = partner_what;
    nb_tree *junk = NULL;
    nb_status st = nb_tree_map_n(2, (const nb_tree *const[]){res, partner}, nbi_pairs_cb, p,
                                 NB_TREE_MAP_NULLS | NB_TREE_MAP_STATIC, &junk);
    nb_tree_destroy(junk);
    if (st != NB_OK && tr->status == NB_OK) {
        char msg[NBI_ERRMSG_CAP];
        snprintf(msg, sizeof msg, "%s", nb_ctx_errmsg(tr->ctx));
        nbi_trace_err(tr, st, "%s: %s", who, msg);
    }
    return tr->status != NB_OK ? tr->status : st;
}

/* The body of a GRAD layer (grad and value_and_grad). */
static nb_status nbi_trace_grad(nb_trace *tr, const nb_fn *g, const nb_tree *self,
                                const nb_tree *args, nb_tree **out) {
    const char *who = g->with_value ? "nb_value_and_grad" : "nb_grad";
    if (args->kind != NB_TREE_KIND_TUPLE && args->kind != NB_TREE_KIND_LIST) {
        return nbi_trace_err(tr, NB_ERR_STRUCTURE,
                             "%s: the arguments of '%s' are a %s; they must be a tuple or list, "
                             "and the gradient is taken with respect to its first element",
                             who, g->name, nb_tree_kind_name(args->kind));
    }
    if (args->n < 1) {
        return nbi_trace_err(tr, NB_ERR_STRUCTURE,
                             "%s: '%s' was called with no arguments; the gradient is taken with "
                             "respect to the first",
                             who, g->name);
    }
    nbi_mark m;
    memset(&m, 0, sizeof m);
    m.tr = tr;
    m.who = who;
    m.ctx = tr->ctx;
    nbi_path path;
    nbi_path_init(&path);
    nbi_path_push_key(&path, "args");
    nbi_path_push_index(&path, 0);
    nb_tree *x2 = NULL, *args2 = NULL, *res = NULL, *grads = NULL, *value_part = NULL;
    nb_status st = nbi_mark_rec(&m, args->children[0], g->spec, true, &path, &x2);
    if (st == NB_OK) {
        st = nbi_replace_first(tr, args, x2, &args2);
    }
    int32_t begin = tr->g.n_nodes;
    if (st == NB_OK) {
        tr->ad_depth++;
        st = nbi_trace_fn(tr, g->inner, self, args2, &res);
        tr->ad_depth--;
    }
    int32_t end = tr->g.n_nodes;
    const nb_tree *loss_leaf = res;
    if (st == NB_OK && g->has_aux) {
        if ((res->kind != NB_TREE_KIND_TUPLE && res->kind != NB_TREE_KIND_LIST) || res->n != 2) {
            st = nbi_trace_err(tr, NB_ERR_STRUCTURE,
                               "%s: with has_aux, '%s' must return a pair (loss, aux); it "
                               "returned a %s of %lld",
                               who, g->name, nb_tree_kind_name(res->kind), (long long)res->n);
        } else {
            loss_leaf = res->children[0];
        }
    }
    nb_var *loss = NULL;
    if (st == NB_OK) {
        if (loss_leaf->kind != NB_TREE_KIND_VAR) {
            char what[128];
            nbi_sbuf ws = nbi_sbuf_make(what, sizeof what);
            nbi_sbuf_describe(&ws, loss_leaf);
            st = nbi_trace_err(tr, NB_ERR_STRUCTURE,
                               "%s: '%s' must return a scalar loss%s; it returned %s", who, g->name,
                               g->has_aux ? " as the first of (loss, aux)" : "", what);
        } else {
            loss = loss_leaf->u.var.var;
            char sig[NBI_SIG_CAP];
            if (loss->rank != 0) {
                st = nbi_trace_err(tr, NB_ERR_SHAPE,
                                   "%s: the loss of '%s' is %s; it must be a scalar (rank 0; "
                                   "reduce it with nb_sum or nb_mean)",
                                   who, g->name, nbi_var_sig(sig, sizeof sig, loss));
            } else if (!nbi_is_float_var(loss)) {
                st = nbi_trace_err(tr, NB_ERR_DTYPE,
                                   "%s: the loss of '%s' is %s; it must be a float (cast it)", who,
                                   g->name, nbi_var_sig(sig, sizeof sig, loss));
            }
        }
    }
    nb_var **cts = NULL;
    if (st == NB_OK) {
        cts = nbi_arena_alloc(&tr->arena, (size_t)(m.n_wrt + 1) * sizeof(nb_var *));
        if (cts == NULL) {
            st = nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        }
    }
    if (st == NB_OK) {
        nb_var *one = nb_full(tr, loss->dtype, 0, NULL, 1.0);
        st = nbi_vjp_region(tr, begin, end, 1, &loss, &one, m.n_wrt, m.wrt, cts);
    }
    if (st == NB_OK) {
        st = nbi_fill_tree(tr, x2, m.wrt, cts, m.n_wrt, &grads);
    }
    if (st == NB_OK) {
        nb_tree *second = g->has_aux && !g->with_value ? res->children[1] : NULL;
        if (g->with_value) {
            value_part = nb_tree_retain(res); /* value, or (value, aux) */
            st = nb_tree_tuple(tr->ctx, 2, (nb_tree *[]){value_part, grads}, out);
        } else if (second != NULL) {
            st = nb_tree_tuple(tr->ctx, 2, (nb_tree *[]){grads, second}, out);
        } else {
            *out = nb_tree_retain(grads);
        }
        if (st != NB_OK) {
            st = nbi_trace_err(tr, st, "%s: out of memory", who);
        }
    }
    nb_tree_destroy(value_part);
    nb_tree_destroy(grads);
    nb_tree_destroy(res);
    nb_tree_destroy(args2);
    nb_tree_destroy(x2);
    return st;
}

/* VJP and JVP layers: args = (primals, ct or tangents). */
static nb_status nbi_trace_vjp_jvp(nb_trace *tr, const nb_fn *g, const nb_tree *self,
                                   const nb_tree *args, nb_tree **out) {
    bool fwd = g->kind == NBI_FN_JVP;
    const char *who = fwd ? "nb_jvp" : "nb_vjp";
    if ((args->kind != NB_TREE_KIND_TUPLE && args->kind != NB_TREE_KIND_LIST) || args->n != 2) {
        return nbi_trace_err(tr, NB_ERR_STRUCTURE,
                             "%s: '%s' takes the pair (primals, %s), where primals are the "
                             "arguments of the function; got a %s of %lld",
                             who, g->name, fwd ? "tangents" : "cotangents",
                             nb_tree_kind_name(args->kind), (long long)args->n);
    }
    nbi_mark m;
    memset(&m, 0, sizeof m);
    m.tr = tr;
    m.who = who;
    m.ctx = tr->ctx;
    nbi_path path;
    nbi_path_init(&path);
    nb_tree *p2 = NULL, *res = NULL, *tail = NULL;
    nb_status st = nbi_mark_rec(&m, args->children[0], NULL, true, &path, &p2);
    nbi_pairs in_pairs;
    memset(&in_pairs, 0, sizeof in_pairs);
    if (st == NB_OK && fwd) {
        st = nbi_pair_up(tr, who, "primal", "tangent", p2, args->children[1], &in_pairs);
    }
    int32_t begin = tr->g.n_nodes;
    if (st == NB_OK) {
        tr->ad_depth++;
        st = nbi_trace_fn(tr, g->inner, self, p2, &res);
        tr->ad_depth--;
    }
    int32_t end = tr->g.n_nodes;
    nbi_pairs out_pairs;
    memset(&out_pairs, 0, sizeof out_pairs);
    if (st == NB_OK && !fwd) {
        st = nbi_pair_up(tr, who, "output", "cotangent", res, args->children[1], &out_pairs);
    }
    nb_var **vals = NULL;
    if (st == NB_OK) {
        int n = fwd ? 0 : m.n_wrt;
        if (fwd) {
            /* outputs: every float var leaf of res */
            st = nbi_pair_up(tr, who, "output", "output", res, res, &out_pairs);
            n = out_pairs.n;
        }
        vals = nbi_arena_alloc(&tr->arena, (size_t)(n + 1) * sizeof(nb_var *));
        if (st == NB_OK && vals == NULL) {
            st = nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        }
    }
    if (st == NB_OK && !fwd) {
        st = nbi_vjp_region(tr, begin, end, out_pairs.n, out_pairs.a, out_pairs.b, m.n_wrt, m.wrt,
                            vals);
        if (st == NB_OK) {
            st = nbi_fill_tree(tr, p2, m.wrt, vals, m.n_wrt, &tail);
        }
    } else if (st == NB_OK) {
        st = nbi_jvp_region(tr, begin, end, in_pairs.n, in_pairs.a, in_pairs.b, out_pairs.n,
                            out_pairs.a, vals);
        if (st == NB_OK) {
            st = nbi_fill_tree(tr, res, out_pairs.a, vals, out_pairs.n, &tail);
        }
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(tr->ctx, 2, (nb_tree *[]){res, tail}, out);
        if (st != NB_OK) {
            st = nbi_trace_err(tr, st, "%s: out of memory", who);
        }
    }
    nb_tree_destroy(tail);
    nb_tree_destroy(res);
    nb_tree_destroy(p2);
    return st;
}

/* ---- custom_vjp ---------------------------------------------------------------------- */

typedef struct nbi_floats {
    nb_trace *tr;
    nb_var **v;
    int n, cap;
    bool stop; /* map mode: replace each float var leaf by stop_gradient of it */
} nbi_floats;

static nb_status nbi_floats_cb(void *ud, const char *path, int n, const nb_tree *const *l,
                               nb_tree **out) {
    (void)path;
    (void)n;
    nbi_floats *f = ud;
    const nb_tree *leaf = l[0];
    if (leaf->kind != NB_TREE_KIND_VAR || !nbi_is_float_var(leaf->u.var.var)) {
        *out = nb_tree_retain((nb_tree *)leaf);
        return NB_OK;
    }
    nb_var *v = leaf->u.var.var;
    if (f->n == f->cap) {
        int cap = f->cap ? f->cap * 2 : 16;
        nb_var **a = nbi_arena_alloc(&f->tr->arena, (size_t)cap * sizeof(nb_var *));
        if (a == NULL) {
            return nbi_trace_err(f->tr, NB_ERR_OOM, "nb_custom_vjp: out of memory");
        }
        if (f->n > 0) {
            memcpy(a, f->v, (size_t)f->n * sizeof(nb_var *));
        }
        f->v = a;
        f->cap = cap;
    }
    f->v[f->n++] = v;
    nb_var *w = f->stop ? nb_stop_gradient(v) : v;
    return nbi_tree_var(f->tr->ctx, w, f->tr->id, out) == NB_OK ? NB_OK : NB_ERR_OOM;
}

/* custom_vjp under a gradient transform: run fwd on stopped inputs, and tie its output to
 * the inputs through one custom_vjp node whose rule calls bwd. */
static nb_status nbi_trace_custom(nb_trace *tr, const nb_fn *g, const nb_tree *self,
                                  const nb_tree *args, nb_tree **out) {
    (void)self; /* f's bound data: fwd and bwd carry their own */
    nbi_floats xs = {tr, NULL, 0, 0, true};
    nb_tree *stopped = NULL, *fr = NULL;
    nb_status st = nb_tree_map(args, nbi_floats_cb, &xs, 0, &stopped);
    if (st != NB_OK) {
        return tr->status != NB_OK ? tr->status : nbi_trace_err(tr, st, "out of memory");
    }
    st = nbi_inline_call(tr, g->fwd, stopped, &fr);
    nb_tree_destroy(stopped);
    if (st != NB_OK) {
        return st;
    }
    if ((fr->kind != NB_TREE_KIND_TUPLE && fr->kind != NB_TREE_KIND_LIST) || fr->n != 2 ||
        fr->children[0]->kind != NB_TREE_KIND_VAR ||
        !nbi_is_float_var(fr->children[0]->u.var.var)) {
        nb_tree_destroy(fr);
        return nbi_trace_err(tr, NB_ERR_STRUCTURE,
                             "nb_custom_vjp: fwd of '%s' must return the pair (out, residuals) "
                             "with out a single float array",
                             g->name);
    }
    nbi_floats rs = {tr, NULL, 0, 0, false};
    nb_tree *junk = NULL;
    st = nb_tree_map(fr->children[1], nbi_floats_cb, &rs, 0, &junk);
    nb_tree_destroy(junk);
    nbi_custom_rec *rec = nbi_arena_alloc(&tr->arena, sizeof *rec);
    int n_in = 1 + xs.n + rs.n;
    nb_var **ins = nbi_arena_alloc(&tr->arena, (size_t)n_in * sizeof(nb_var *));
    if (st != NB_OK || rec == NULL || ins == NULL) {
        nb_tree_destroy(fr);
        return nbi_trace_err(tr, NB_ERR_OOM, "nb_custom_vjp: out of memory");
    }
    /* the rule runs when the trace is differentiated, maybe after the caller released g
     * (a custom_vjp made and dropped inside a body): the trace keeps bwd alive */
    rec->bwd = g->bwd;
    if (!nbi_arena_own_fn(&tr->arena, nb_fn_retain(g->bwd))) {
        nb_tree_destroy(fr);
        return nbi_trace_err(tr, NB_ERR_OOM, "nb_custom_vjp: out of memory");
    }
    rec->args = nb_tree_retain((nb_tree *)args);
    rec->res = nb_tree_retain(fr->children[1]);
    if (nbi_trace_own(tr, rec->args) != NB_OK || nbi_trace_own(tr, rec->res) != NB_OK) {
        nb_tree_destroy(fr);
        return tr->status;
    }
    ins[0] = fr->children[0]->u.var.var;
    memcpy(ins + 1, xs.v, (size_t)xs.n * sizeof(nb_var *));
    if (rs.n > 0) {
        memcpy(ins + 1 + xs.n, rs.v, (size_t)rs.n * sizeof(nb_var *));
    }
    nb_tree_destroy(fr);
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.callee = rec;
    at.ivalue = xs.n;
    nb_var *node = nbi_emit(tr, NBI_OP_CUSTOM_VJP, n_in, ins, &at);
    if (tr->status != NB_OK) {
        return tr->status;
    }
    return nbi_tree_var(tr->ctx, node, tr->id, out) == NB_OK
               ? NB_OK
               : nbi_trace_err(tr, NB_ERR_OOM, "nb_custom_vjp: out of memory");
}

void nbi_vjp_custom(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    const nbi_custom_rec *rec = node->at.callee;
    nb_tree *ctl = nb_leaf(ct), *bargs = NULL, *cts = NULL;
    if (ctl == NULL || nb_tree_tuple(tr->ctx, 2, (nb_tree *[]){rec->res, ctl}, &bargs) != NB_OK ||
        nbi_trace_own(tr, bargs) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_custom_vjp: out of memory");
        return;
    }
    if (nbi_inline_call(tr, rec->bwd, bargs, &cts) != NB_OK) {
        return;
    }
    nbi_pairs p;
    nbi_pair_up(tr, "nb_custom_vjp (bwd's result against the arguments)", "argument", "cotangent",
                rec->args, cts, &p);
    nb_tree_destroy(cts);
    for (int k = 0; k < p.n && k < (int)node->at.ivalue && tr->status == NB_OK; k++) {
        in_ct[1 + k] = p.b[k];
    }
}

nb_var *nbi_jvp_custom(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    (void)node;
    (void)tan;
    return nbi_trace_errv(tr, NB_ERR_UNSUPPORTED,
                          "nb_jvp: forward mode through a function made with nb_custom_vjp is "
                          "not supported (as in JAX); differentiate it in reverse mode");
}

/* ---- custom_jvp ---------------------------------------------------------------------- */

nb_status nb_custom_jvp(nb_fn *f, nb_fn *jvp, nb_fn **out) {
    if (out != NULL) {
        *out = NULL;
    }
    static const char fn[] = "nb_custom_jvp";
    nb_ctx *ctx = nbi_handle_ctx(f);
    ctx = ctx != NULL ? ctx : nbi_handle_ctx(jvp);
    nb_status st = nbi_check_handle_in(ctx, f, NBI_MAGIC_FN, fn, "f");
    if (st == NB_OK) {
        st = nbi_check_handle_in(ctx, jvp, NBI_MAGIC_FN, fn, "jvp");
    }
    if (st == NB_OK && out == NULL) {
        st = nbi_err(ctx, NB_ERR_MISUSE,
                     "%s: out is NULL (pass the address of an nb_fn * for the new function)", fn);
    }
    if (st != NB_OK) {
        return st;
    }
    nb_fn *g = NULL;
    st = nbi_fn_wrap(f, fn, NBI_FN_CUSTOM_JVP, 0, true, &g);
    if (st != NB_OK) {
        return st;
    }
    g->fwd = nb_fn_retain(jvp);
    *out = g;
    return NB_OK;
}

/* The tangent tree the rule gets: args' structure, the k-th float var leaf's tangent at its
 * place (t[k], zeros when NULL), null at the other dynamic leaves. */
typedef struct nbi_tans {
    nb_trace *tr;
    nb_var *const *t;
    nb_var *const *like; /* the float leaves, for zeros */
    int k, n;
} nbi_tans;

static nb_status nbi_tans_cb(void *ud, const char *path, int n, const nb_tree *const *l,
                             nb_tree **out) {
    (void)path;
    (void)n;
    nbi_tans *s = ud;
    const nb_tree *leaf = l[0];
    if (leaf->kind != NB_TREE_KIND_VAR || !nbi_is_float_var(leaf->u.var.var)) {
        return nb_tree_null(s->tr->ctx, out);
    }
    if (s->k >= s->n) {
        return nbi_trace_err(s->tr, NB_ERR_INTERNAL, "nb_custom_jvp: the arguments changed");
    }
    nb_var *t = s->t[s->k] != NULL ? s->t[s->k] : nbi_zeros_like(s->tr, s->like[s->k]);
    s->k++;
    return nbi_tree_var(s->tr->ctx, t, s->tr->id, out) == NB_OK ? NB_OK : NB_ERR_OOM;
}

/* The rule on (args, tangents t): its tangent output (NULL after an error, recorded). */
static nb_var *nbi_custom_jvp_apply(nb_trace *tr, const nb_var *node, nb_var *const *t) {
    const nbi_custom_rec *rec = node->at.callee;
    nbi_tans s = {tr, t, node->in + 1, 0, (int)node->at.ivalue};
    nb_tree *tt = NULL, *pair = NULL, *r = NULL;
    nb_status st = nb_tree_map(rec->args, nbi_tans_cb, &s, 0, &tt);
    if (st == NB_OK) {
        st = nb_tree_tuple(tr->ctx, 2, (nb_tree *[]){rec->args, tt}, &pair);
    }
    nb_tree_destroy(tt);
    if (st != NB_OK) {
        nb_tree_destroy(pair);
        return tr->status != NB_OK ? NULL : nbi_trace_errv(tr, st, "nb_custom_jvp: out of memory");
    }
    st = nbi_inline_call(tr, rec->bwd, pair, &r);
    nb_tree_destroy(pair);
    if (st != NB_OK) {
        return NULL;
    }
    const nb_tree *to = (r->kind == NB_TREE_KIND_TUPLE || r->kind == NB_TREE_KIND_LIST) && r->n == 2
                            ? r->children[1]
                            : NULL;
    nb_var *tv = to != NULL && to->kind == NB_TREE_KIND_VAR ? to->u.var.var : NULL;
    char s1[NBI_SIG_CAP], s2[NBI_SIG_CAP];
    if (tv == NULL || tv->dtype != node->dtype || tv->rank != node->rank ||
        memcmp(tv->shape, node->shape, (size_t)node->rank * sizeof(int64_t)) != 0) {
        nb_tree_destroy(r);
        return nbi_trace_errv(tr, NB_ERR_STRUCTURE,
                              "nb_custom_jvp: the rule '%s' must return the pair (out, "
                              "tangent_out) with tangent_out an array like out (%s)%s%s",
                              rec->bwd->name, nbi_var_sig(s1, sizeof s1, node),
                              tv != NULL ? "; it returned " : "",
                              tv != NULL ? nbi_var_sig(s2, sizeof s2, tv) : "");
    }
    nb_tree_destroy(r);
    return tv;
}

/* custom_jvp under a derivative: f on stopped inputs gives the value; one custom_jvp node
 * ties it to the float inputs (its rules call the user's JVP rule). */
static nb_status nbi_trace_custom_jvp(nb_trace *tr, const nb_fn *g, const nb_tree *self,
                                      const nb_tree *args, nb_tree **out) {
    nbi_floats xs = {tr, NULL, 0, 0, true};
    nb_tree *stopped = NULL, *fr = NULL;
    nb_status st = nb_tree_map(args, nbi_floats_cb, &xs, 0, &stopped);
    if (st != NB_OK) {
        return tr->status != NB_OK ? tr->status : nbi_trace_err(tr, st, "out of memory");
    }
    st = nbi_trace_fn(tr, g->inner, self, stopped, &fr);
    nb_tree_destroy(stopped);
    if (st != NB_OK) {
        return st;
    }
    if (fr->kind != NB_TREE_KIND_VAR || !nbi_is_float_var(fr->u.var.var)) {
        nb_tree_destroy(fr);
        return nbi_trace_err(tr, NB_ERR_STRUCTURE,
                             "nb_custom_jvp: '%s' must return a single float array (the rule "
                             "gives its tangent)",
                             g->name);
    }
    nbi_custom_rec *rec = nbi_arena_alloc(&tr->arena, sizeof *rec);
    int n_in = 1 + xs.n;
    nb_var **ins = nbi_arena_alloc(&tr->arena, (size_t)n_in * sizeof(nb_var *));
    if (rec == NULL || ins == NULL || !nbi_arena_own_fn(&tr->arena, nb_fn_retain(g->fwd))) {
        nb_tree_destroy(fr);
        return nbi_trace_err(tr, NB_ERR_OOM, "nb_custom_jvp: out of memory");
    }
    rec->bwd = g->fwd; /* the rule (kept alive by the trace) */
    rec->args = nb_tree_retain((nb_tree *)args);
    rec->res = NULL;
    if (nbi_trace_own(tr, rec->args) != NB_OK) {
        nb_tree_destroy(fr);
        return tr->status;
    }
    ins[0] = fr->u.var.var;
    if (xs.n > 0) {
        memcpy(ins + 1, xs.v, (size_t)xs.n * sizeof(nb_var *));
    }
    nb_tree_destroy(fr);
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.callee = rec;
    at.ivalue = xs.n;
    nb_var *node = nbi_emit(tr, NBI_OP_CUSTOM_JVP, n_in, ins, &at);
    if (tr->status != NB_OK) {
        return tr->status;
    }
    return nbi_tree_var(tr->ctx, node, tr->id, out) == NB_OK
               ? NB_OK
               : nbi_trace_err(tr, NB_ERR_OOM, "nb_custom_jvp: out of memory");
}

nb_var *nbi_jvp_custom_jvp(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    return nbi_custom_jvp_apply(tr, node, tan + 1);
}

/* The rule's tangent map t -> tangent_out is linear: its transpose applied to ct is reverse
 * mode over the rule traced on zero tangents, with respect to those tangents. */
void nbi_vjp_custom_jvp(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    int n = (int)node->at.ivalue;
    nb_var **t = nbi_arena_alloc(&tr->arena, (size_t)(n + 1) * sizeof(nb_var *));
    if (t == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_custom_jvp: out of memory");
        return;
    }
    for (int k = 0; k < n; k++) { /* distinct nodes to differentiate with respect to */
        nb_var *z = nbi_zeros_like(tr, node->in[1 + k]);
        t[k] = nbi_emit(tr, NBI_OP_IDENTITY, 1, &z, NULL);
    }
    int32_t begin = tr->g.n_nodes;
    nb_var *to = nbi_custom_jvp_apply(tr, node, t);
    int32_t end = tr->g.n_nodes;
    if (to == NULL || tr->status != NB_OK) {
        return;
    }
    (void)nbi_vjp_region(tr, begin, end, 1, &to, &ct, n, t, in_ct + 1);
}

nb_status nbi_trace_transform(nb_trace *tr, const nb_fn *f, const nb_tree *self,
                              const nb_tree *args, nb_tree **out) {
    *out = NULL;
    switch (f->kind) {
    case NBI_FN_GRAD:
        return nbi_trace_grad(tr, f, self, args, out);
    case NBI_FN_CUSTOM_VJP:
        return nbi_trace_custom(tr, f, self, args, out);
    case NBI_FN_CUSTOM_JVP:
        return nbi_trace_custom_jvp(tr, f, self, args, out);
    case NBI_FN_VMAP:
        return nbi_trace_vmap(tr, f, self, args, out);
    case NBI_FN_TRAIN:
        return nbi_trace_train(tr, f, self, args, out);
    case NBI_FN_JAC:
        return nbi_trace_jac(tr, f, self, args, out);
    default:
        return nbi_trace_vjp_jvp(tr, f, self, args, out);
    }
}

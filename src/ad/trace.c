/*
 * trace.c -- traces, graphs, node emission with sticky errors, vars in and out of trees,
 * and the broadcasting helpers the op families share.
 */
#include "ad/ir.h"

#include <stdio.h>
#include <string.h>

/* ---- graphs ------------------------------------------------------------------------- */

nb_status nbi_graph_init(nbi_graph *g, nbi_arena *arena) {
    memset(g, 0, sizeof *g);
    g->arena = arena;
    return NB_OK;
}

nb_var *nbi_graph_add(nbi_graph *g, const nb_var *proto) {
    if (g->n_nodes == g->cap_nodes) {
        int32_t cap = g->cap_nodes ? g->cap_nodes * 2 : 64;
        nb_var **nodes = nbi_arena_alloc_raw(g->arena, (size_t)cap * sizeof(nb_var *));
        if (nodes == NULL) {
            return NULL;
        }
        if (g->n_nodes > 0) {
            memcpy(nodes, g->nodes, (size_t)g->n_nodes * sizeof(nb_var *));
        }
        g->nodes = nodes;
        g->cap_nodes = cap;
    }
    nb_var *v = nbi_arena_alloc_raw(g->arena, sizeof(nb_var)); /* all of it copied below */
    if (v == NULL) {
        return NULL;
    }
    *v = *proto;
    v->in = NULL;
    if (proto->n_in > 0) {
        v->in = nbi_arena_alloc_raw(g->arena, (size_t)proto->n_in * sizeof(nb_var *));
        if (v->in == NULL) {
            return NULL;
        }
        memcpy(v->in, proto->in, (size_t)proto->n_in * sizeof(nb_var *));
    }
    v->id = g->n_nodes;
    g->nodes[g->n_nodes++] = v;
    return v;
}

/* ---- shapes ------------------------------------------------------------------------- */

bool nbi_broadcast_shapes(int ra, const int64_t *sa, int rb, const int64_t *sb, int *rout,
                          int64_t *out) {
    int r = ra > rb ? ra : rb;
    for (int i = 0; i < r; i++) {
        int ia = i - (r - ra), ib = i - (r - rb);
        int64_t da = ia >= 0 ? sa[ia] : 1, db = ib >= 0 ? sb[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            return false;
        }
        out[i] = da == 1 ? db : da;
    }
    *rout = r;
    return true;
}

void nbi_bcast_strides(int rin, const int64_t *sin, int rout, const int64_t *sout,
                       int64_t *strides) {
    int64_t stride = 1;
    for (int i = rout - 1; i >= 0; i--) {
        int j = i - (rout - rin);
        if (j < 0) {
            strides[i] = 0;
            continue;
        }
        strides[i] = (sin[j] == 1 && sout[i] != 1) ? 0 : stride;
        stride *= sin[j];
    }
}

int64_t nbi_shape_size(int rank, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        n *= shape[i];
    }
    return n;
}

bool nbi_norm_axis(int axis, int rank, int *out) {
    int a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= rank) {
        return false;
    }
    *out = a;
    return true;
}

const char *nbi_var_sig(char *buf, size_t cap, const nb_var *v) {
    if (v == NULL) {
        snprintf(buf, cap, "NULL");
        return buf;
    }
    if (v->flags & NBI_NODE_POISON) {
        snprintf(buf, cap, "<error>");
        return buf;
    }
    return nbi_sig(buf, cap, v->dtype, v->rank, v->shape);
}

/* ---- traces ------------------------------------------------------------------------- */

static _Thread_local nb_trace *nbi_cur_trace;

nb_trace *nbi_trace_current(void) {
    return nbi_cur_trace;
}

nb_trace *nbi_trace_set_current(nb_trace *tr) {
    nb_trace *prev = nbi_cur_trace;
    nbi_cur_trace = tr;
    return prev;
}

nb_status nbi_trace_init(nb_trace *tr, nb_ctx *ctx, const char *fn_name) {
    memset(tr, 0, sizeof *tr);
    tr->ctx = ctx;
    tr->fn_name = fn_name ? fn_name : "fn";
    nbi_arena_init(&tr->arena, ctx);
    nbi_graph_init(&tr->g, &tr->arena);
    tr->poison = nbi_arena_alloc(&tr->arena, sizeof(nb_var));
    if (tr->poison == NULL) {
        return nbi_oom(ctx, "trace", sizeof(nb_var));
    }
    tr->poison->flags = NBI_NODE_POISON;
    tr->poison->rank = -1;
    tr->poison->id = -1;
    tr->poison->tr = tr;
    tr->status = NB_OK;
    return NB_OK;
}

void nbi_trace_release(nb_trace *tr) {
    nbi_arena_free_all(&tr->arena);
}

static nb_status nbi_trace_verr(nb_trace *tr, nb_status st, const char *fmt, va_list ap) {
    if (tr->status != NB_OK) {
        return tr->status;
    }
    tr->status = st;
    char msg[NBI_ERRMSG_CAP];
    vsnprintf(msg, sizeof msg, fmt, ap);
    nbi_err(tr->ctx, st, "%s (in '%s')", msg, tr->fn_name);
    return st;
}

nb_status nbi_trace_err(nb_trace *tr, nb_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    nb_status s = nbi_trace_verr(tr, st, fmt, ap);
    va_end(ap);
    return s;
}

nb_var *nbi_trace_errv(nb_trace *tr, nb_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    nbi_trace_verr(tr, st, fmt, ap);
    va_end(ap);
    return tr->poison;
}

nb_status nbi_trace_own(nb_trace *tr, nb_tree *t) {
    if (!nbi_arena_own_tree(&tr->arena, t)) {
        return nbi_trace_err(tr, NB_ERR_OOM, "out of memory while tracing");
    }
    return NB_OK;
}

nb_trace *nbi_trace_of(int n, nb_var *const *in, bool *poisoned) {
    nb_trace *tr = NULL;
    *poisoned = false;
    for (int i = 0; i < n; i++) {
        if (in[i] == NULL) {
            *poisoned = true;
        } else if (tr == NULL) {
            tr = in[i]->tr;
        }
    }
    if (tr == NULL) {
        return NULL;
    }
    if (tr->status != NB_OK) {
        *poisoned = true;
    }
    for (int i = 0; i < n && !*poisoned; i++) {
        if (in[i]->flags & NBI_NODE_POISON) {
            *poisoned = true;
        }
    }
    return tr;
}

/* After a failed inference: name the operands that are function inputs by their leaf paths
 * ("; operands: args[0], self.layers[1].weight"), so the user finds the leaf. */
static void nbi_note_operand_paths(nb_trace *tr, int n_in, nb_var *const *in) {
    bool any = false;
    for (int i = 0; i < n_in; i++) {
        any = any || in[i]->path != NULL;
    }
    if (!any) {
        return;
    }
    nbi_err_append(tr->ctx, "; operands:");
    for (int i = 0; i < n_in; i++) {
        nbi_err_append(tr->ctx, "%s %s", i ? "," : "", in[i]->path ? in[i]->path : "(computed)");
    }
}

nb_var *nbi_emit(nb_trace *tr, nbi_op op, int n_in, nb_var *const *in, const nbi_attrs *at) {
    const nbi_op_info *info = nbi_op_get(op);
    if (tr->status != NB_OK) {
        return tr->poison;
    }
    for (int i = 0; i < n_in; i++) {
        if (in[i] == NULL) {
            return nbi_trace_errv(tr, NB_ERR_MISUSE, "nb_%s: input %d is a NULL var", info->name,
                                  i);
        }
        if (in[i]->flags & NBI_NODE_POISON) {
            return tr->poison;
        }
        if (in[i]->tr != tr) {
            return nbi_trace_errv(tr, NB_ERR_INVALID,
                                  "nb_%s: input %d belongs to another trace (a var was kept "
                                  "after its trace ended, or an outer var was used inside a "
                                  "function without being passed as an argument)",
                                  info->name, i);
        }
    }
    nb_var proto;
    memset(&proto, 0, sizeof proto);
    proto.op = (uint16_t)op;
    proto.n_in = n_in;
    proto.in = (nb_var **)in;
    if (at != NULL) {
        proto.at = *at;
    }
    proto.tr = tr;
    if (info->infer != NULL) {
        nb_status st = info->infer(tr, &proto);
        if (st != NB_OK) {
            nbi_note_operand_paths(tr, n_in, in);
            return tr->poison;
        }
    }
    for (int i = proto.rank; i < NB_MAX_RANK; i++) {
        proto.shape[i] = 0; /* entries past the rank are never junk (hashing, printing) */
    }
    int64_t size = 1;
    for (int i = 0; i < proto.rank; i++) {
        if (proto.shape[i] < 0 || nbi_mul_i64(size, proto.shape[i], &size)) {
            char sig[NBI_SIG_CAP];
            return nbi_trace_errv(tr, NB_ERR_OVERFLOW, "nb_%s: result shape %s is invalid",
                                  info->name,
                                  nbi_sig(sig, sizeof sig, proto.dtype, proto.rank, proto.shape));
        }
    }
    size_t bytes;
    if (nbi_mul_size((size_t)size, nb_dtype_size(proto.dtype), &bytes) ||
        bytes > (size_t)INT64_MAX / 2) {
        return nbi_trace_errv(tr, NB_ERR_OVERFLOW, "nb_%s: result of %lld elements is too large",
                              info->name, (long long)size);
    }
    proto.size = size;
    proto.fn = tr->fn_name;
    nb_var *v = nbi_graph_add(&tr->g, &proto);
    if (v == NULL) {
        return nbi_trace_errv(tr, NB_ERR_OOM, "nb_%s: out of memory while tracing", info->name);
    }
    v->src = v->id;
    return v;
}

nb_var *nbi_emit_param(nb_trace *tr, int32_t index, nb_dtype dtype, int rank, const int64_t *shape,
                       const char *path) {
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.ivalue = index;
    nb_var proto;
    memset(&proto, 0, sizeof proto);
    proto.op = NBI_OP_PARAM;
    proto.dtype = dtype;
    proto.rank = (int8_t)rank;
    for (int i = 0; i < rank; i++) {
        proto.shape[i] = shape[i];
    }
    proto.size = nbi_shape_size(rank, shape);
    proto.at = at;
    proto.tr = tr;
    if (path != NULL) {
        size_t len = strlen(path) + 1;
        char *copy = nbi_arena_alloc(&tr->arena, len);
        if (copy == NULL) {
            return nbi_trace_errv(tr, NB_ERR_OOM, "out of memory while tracing the inputs");
        }
        memcpy(copy, path, len);
        proto.path = copy;
    }
    proto.fn = tr->fn_name;
    nb_var *v = nbi_graph_add(&tr->g, &proto);
    if (v == NULL) {
        return nbi_trace_errv(tr, NB_ERR_OOM, "out of memory while tracing the inputs");
    }
    v->src = v->id;
    return v;
}

/* ---- public: the trace -------------------------------------------------------------- */

nb_ctx *nb_trace_ctx(const nb_trace *tr) {
    return tr ? tr->ctx : NULL;
}

nb_status nb_trace_status(const nb_trace *tr) {
    return tr ? tr->status : NB_ERR_MISUSE;
}

nb_status nb_trace_fail(nb_trace *tr, nb_status status, const char *fmt, ...) {
    if (tr == NULL) {
        return NB_ERR_MISUSE;
    }
    if (fmt == NULL) {
        /* the trace still fails (as asked), with the misuse as its reason */
        nbi_trace_err(tr, NB_ERR_MISUSE,
                      "nb_trace_fail: fmt is NULL (pass a printf format saying why the trace "
                      "fails)");
        return NB_ERR_MISUSE;
    }
    if (status == NB_OK) {
        status = NB_ERR_INVALID;
    }
    va_list ap;
    va_start(ap, fmt);
    nb_status s = nbi_trace_verr(tr, status, fmt, ap);
    va_end(ap);
    return s;
}

nb_var *nb_var_of(nb_trace *tr, const nb_tree *leaf) {
    if (tr == NULL) {
        return NULL;
    }
    if (tr->status != NB_OK) {
        return tr->poison;
    }
    char why[NBI_ERRMSG_CAP];
    if (nbi_handle_why(leaf, NBI_MAGIC_TREE, "nb_var_of", "leaf", why, sizeof why)) {
        return nbi_trace_errv(tr, NB_ERR_MISUSE, "%s", why);
    }
    if (leaf->kind != NB_TREE_KIND_VAR) {
        char what[128];
        nbi_sbuf ws = nbi_sbuf_make(what, sizeof what);
        nbi_sbuf_describe(&ws, leaf);
        return nbi_trace_errv(tr, NB_ERR_KIND, "nb_var_of: the leaf is %s, not a traced array",
                              what);
    }
    nb_var *v = leaf->u.var.var;
    if (v->tr != tr) {
        return nbi_trace_errv(tr, NB_ERR_INVALID, "nb_var_of: the var belongs to another trace");
    }
    return v;
}

nb_var *nb_get(nb_trace *tr, const nb_tree *t, const char *path_fmt, ...) {
    if (tr == NULL) {
        return NULL;
    }
    if (tr->status != NB_OK) {
        return tr->poison;
    }
    char why[NBI_ERRMSG_CAP];
    if (nbi_handle_why(t, NBI_MAGIC_TREE, "nb_get", "t", why, sizeof why)) {
        return nbi_trace_errv(tr, NB_ERR_MISUSE, "%s", why);
    }
    if (path_fmt == NULL) {
        return nbi_trace_errv(tr, NB_ERR_MISUSE,
                              "nb_get: path_fmt is NULL (pass a path such as \"[0]\" or "
                              "\"layers[%%d].w\")");
    }
    char path[NB_PATH_MAX];
    va_list ap;
    va_start(ap, path_fmt);
    vsnprintf(path, sizeof path, path_fmt, ap);
    va_end(ap);
    const nb_tree *leaf = NULL;
    nb_status st = nb_tree_lookup(t, path, &leaf);
    if (st != NB_OK) {
        char msg[NBI_ERRMSG_CAP];
        snprintf(msg, sizeof msg, "%s", nb_ctx_errmsg(tr->ctx));
        return nbi_trace_errv(tr, st, "nb_get: %s", msg);
    }
    if (leaf->kind != NB_TREE_KIND_VAR) {
        char what[128];
        nbi_sbuf ws = nbi_sbuf_make(what, sizeof what);
        nbi_sbuf_describe(&ws, leaf);
        return nbi_trace_errv(tr, NB_ERR_KIND,
                              "nb_get: '%s' is %s, not an array (read static leaves with "
                              "nb_tree_lookup and nb_tree_get_int & co)",
                              path, what);
    }
    return leaf->u.var.var;
}

nb_tree *nb_leaf(nb_var *v) {
    if (v == NULL) {
        return NULL;
    }
    nb_trace *tr = v->tr;
    nb_tree *t = NULL;
    if (nbi_tree_var(tr->ctx, v, tr->id, &t) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_leaf: out of memory");
        return NULL;
    }
    if (nbi_trace_own(tr, t) != NB_OK) {
        return NULL;
    }
    return t;
}

nb_status nb_return(nb_var *v, nb_tree **out) {
    if (out == NULL) {
        /* not sticky: the body itself reports the misuse by returning it */
        return v != NULL ? nbi_err(v->tr->ctx, NB_ERR_MISUSE,
                                   "nb_return: out is NULL (pass the body's out-parameter)")
                         : NB_ERR_MISUSE;
    }
    *out = NULL;
    if (v == NULL) {
        return NB_ERR_MISUSE;
    }
    nb_trace *tr = v->tr;
    if (tr->status != NB_OK) {
        return tr->status;
    }
    if (nbi_tree_var(tr->ctx, v, tr->id, out) != NB_OK) {
        return nbi_trace_err(tr, NB_ERR_OOM, "nb_return: out of memory");
    }
    return NB_OK;
}

/* ---- public: var accessors ---------------------------------------------------------- */

static bool nbi_var_ok(const nb_var *v) {
    return v != NULL && !(v->flags & NBI_NODE_POISON);
}

nb_trace *nb_var_trace(const nb_var *v) {
    return v ? v->tr : NULL;
}

nb_dtype nb_var_dtype(const nb_var *v) {
    return nbi_var_ok(v) ? v->dtype : NB_DTYPE_F32;
}

int nb_var_rank(const nb_var *v) {
    return nbi_var_ok(v) ? v->rank : -1;
}

const int64_t *nb_var_shape(const nb_var *v) {
    return nbi_var_ok(v) ? v->shape : NULL;
}

int64_t nb_var_dim(const nb_var *v, int axis) {
    int a;
    if (!nbi_var_ok(v) || !nbi_norm_axis(axis, v->rank, &a)) {
        return -1;
    }
    return v->shape[a];
}

int64_t nb_var_size(const nb_var *v) {
    return nbi_var_ok(v) ? v->size : -1;
}

bool nb_var_is_poison(const nb_var *v) {
    return v == NULL || (v->flags & NBI_NODE_POISON);
}

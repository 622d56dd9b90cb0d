/*
 * vmap.c -- the batching transform (nabla/ad.h: nb_vmap).
 *
 * A VMAP layer traces its inner function on examples -- zero arrays of one lane's dtype and
 * shape, one per batched argument leaf -- into the trace (its region of nodes), then walks
 * the region in order: a node none of whose inputs is batched is kept as it is (computed
 * once for every lane), and a node with a batched input is rebuilt by its op's batching rule
 * (nbi_op_info.vmap) from the batched values. Every batched value carries its batch on axis
 * 0; the arguments' batch axes are moved there on entry and the outputs' to out_axes on
 * exit. The example nodes end up unused and the passes remove them (a print or check on
 * them is turned into a copy by its rule, so that only the batched one runs).
 *
 * The layer's options live in the function's spec tree, (in_axes, out_axes, axis_size,
 * in_axes given, out_axes given), so that they are part of the jit cache's identity like a
 * grad's filter spec.
 */
#include "ad/ir.h"

#include <string.h>

/* ---- helpers for the rules ------------------------------------------------------------ */

/* a poisoned or NULL var (a failed builder upstream): passed on, the trace has the error */
static bool nbi_vmap_bad(const nb_var *x) {
    return x == NULL || x->rank < 0 || (x->flags & NBI_NODE_POISON) != 0;
}

nb_var *nbi_vmap_lift(nb_var *bx, int rank) {
    if (nbi_vmap_bad(bx)) {
        return bx;
    }
    int rx = bx->rank - 1;
    if (rx >= rank) {
        return bx;
    }
    int64_t shape[NB_MAX_RANK];
    if (rank + 1 > NB_MAX_RANK) {
        return nbi_trace_errv(bx->tr, NB_ERR_SHAPE,
                              "nb_vmap: a batched value of rank %d exceeds the maximum rank %d",
                              rank + 1, NB_MAX_RANK);
    }
    shape[0] = bx->shape[0];
    for (int i = 0; i < rank - rx; i++) {
        shape[1 + i] = 1;
    }
    memcpy(shape + 1 + rank - rx, bx->shape + 1, (size_t)rx * sizeof *shape);
    return nb_reshape(bx, rank + 1, shape);
}

nb_var *nbi_vmap_bcast(nb_var *x, int64_t B) {
    if (nbi_vmap_bad(x)) {
        return x;
    }
    int64_t shape[NB_MAX_RANK];
    if (x->rank + 1 > NB_MAX_RANK) {
        return nbi_trace_errv(x->tr, NB_ERR_SHAPE,
                              "nb_vmap: a batched value of rank %d exceeds the maximum rank %d",
                              x->rank + 1, NB_MAX_RANK);
    }
    shape[0] = B;
    memcpy(shape + 1, x->shape, (size_t)x->rank * sizeof *shape);
    return nb_broadcast_to(nb_expand_dims(x, 0), x->rank + 1, shape);
}

nb_var *nbi_vmap_move(nb_var *x, int from, int to) {
    if (from == to || nbi_vmap_bad(x)) {
        return x;
    }
    int perm[NB_MAX_RANK], k = 0;
    for (int i = 0; i < x->rank; i++) {
        if (i != from) {
            perm[k++] = i;
        }
    }
    /* perm lists the other axes in order; insert `from` at position `to` */
    for (int i = x->rank - 1; i > to; i--) {
        perm[i] = perm[i - 1];
    }
    perm[to] = from;
    return nb_transpose(x, perm);
}

/* The generic rule: the op once per lane on that lane's inputs, the results stacked. Exact
 * (each lane runs the unbatched kernel) but B nodes: for ops whose kernels have no batched
 * form yet (the random samplers). */
nb_var *nbi_vmap_unroll(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    if (node->rank + 1 > NB_MAX_RANK) {
        return nbi_trace_errv(tr, NB_ERR_SHAPE,
                              "nb_vmap: a batched %s of rank %d exceeds the maximum rank %d",
                              nbi_op_name((nbi_op)node->op), node->rank + 1, NB_MAX_RANK);
    }
    if (B == 0) {
        int64_t shape[NB_MAX_RANK];
        shape[0] = 0;
        memcpy(shape + 1, node->shape, (size_t)node->rank * sizeof *shape);
        return nb_full(tr, node->dtype, node->rank + 1, shape, 0.0);
    }
    nb_var **lanes = nbi_arena_alloc(&tr->arena, (size_t)B * sizeof *lanes);
    nb_var **in = nbi_arena_alloc(&tr->arena, (size_t)(node->n_in + 1) * sizeof *in);
    if (lanes == NULL || in == NULL) {
        return nbi_trace_errv(tr, NB_ERR_OOM, "nb_vmap: out of memory");
    }
    for (int64_t b = 0; b < B; b++) {
        nb_var *idx = nb_scalar_typed(tr, NB_DTYPE_I32, (double)b);
        for (int32_t j = 0; j < node->n_in; j++) {
            in[j] = bin[j] != NULL ? nb_take(bin[j], idx, 0) : node->in[j];
        }
        lanes[b] = nbi_emit(tr, (nbi_op)node->op, node->n_in, in, &node->at);
    }
    return nb_stack((int)B, lanes, 0);
}

/* ---- the region ------------------------------------------------------------------------ */

nb_status nbi_vmap_region(nb_trace *tr, int32_t begin, int32_t end, int n_in, nb_var *const *ins,
                          nb_var *const *bins, int64_t B, int n_out, nb_var *const *outs,
                          nb_var **bouts) {
    nb_var **bat = nbi_arena_alloc(&tr->arena, ((size_t)end + 1) * sizeof *bat);
    nb_var **args = nbi_arena_alloc(&tr->arena, 64 * sizeof *args);
    if (bat == NULL || args == NULL) {
        return nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
    }
    memset(bat, 0, ((size_t)end + 1) * sizeof *bat);
    nb_var ***multi = NULL; /* a batched loop's outputs, by the loop node's id */
    for (int i = 0; i < n_in; i++) {
        if (ins[i] != NULL && ins[i]->id >= 0 && ins[i]->id < end) {
            bat[ins[i]->id] = bins[i];
        }
    }
    for (int32_t i = begin; i < end && tr->status == NB_OK; i++) {
        nb_var *v = tr->g.nodes[i];
        bool any = false;
        for (int32_t j = 0; j < v->n_in && !any; j++) {
            any = v->in[j]->id < end && bat[v->in[j]->id] != NULL;
        }
        if (!any) {
            continue;
        }
        if (v->op == NBI_OP_CALL_OUTPUT && multi != NULL && multi[v->in[0]->id] != NULL) {
            bat[i] = multi[v->in[0]->id][v->at.ivalue];
            continue;
        }
        for (int32_t j = 0; multi != NULL && j < v->n_in; j++) {
            if (v->in[j]->id < end && multi[v->in[j]->id] != NULL) {
                return nbi_trace_err(tr, NB_ERR_INTERNAL,
                                     "nb_vmap: a %s reads a loop node's packed output",
                                     nbi_op_name((nbi_op)v->op));
            }
        }
        if (v->n_in > 64) {
            args = nbi_arena_alloc(&tr->arena, (size_t)v->n_in * sizeof *args);
            if (args == NULL) {
                return nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
            }
        }
        for (int32_t j = 0; j < v->n_in; j++) {
            args[j] = v->in[j]->id < end ? bat[v->in[j]->id] : NULL;
        }
        if (v->op == NBI_OP_WHILE || v->op == NBI_OP_LOOP_REVERSE) {
            /* several outputs, read by call_output nodes */
            int32_t n_lo = nbi_exec_n_outputs(v->at.callee);
            nb_var **o = nbi_arena_alloc(&tr->arena, ((size_t)n_lo + 1) * sizeof *o);
            if (multi == NULL) {
                multi = nbi_arena_alloc(&tr->arena, ((size_t)end + 1) * sizeof *multi);
                if (multi != NULL) {
                    memset(multi, 0, ((size_t)end + 1) * sizeof *multi);
                }
            }
            if (o == NULL || multi == NULL) {
                return nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
            }
            if (nbi_loop_vmap(tr, v, args, B, o) != NB_OK) {
                return tr->status;
            }
            multi[i] = o;
            bat[i] = v; /* a marker: only its call_output nodes read it */
            continue;
        }
        const nbi_op_info *info = nbi_op_get((nbi_op)v->op);
        if (info->vmap == NULL) {
            char sig[NBI_SIG_CAP];
            return nbi_trace_err(tr, NB_ERR_UNSUPPORTED,
                                 "nb_vmap: the op '%s' (%s, in '%s') has no batching rule yet -- "
                                 "call the function once per lane, or keep that op's inputs "
                                 "unbatched (in_axes null)",
                                 info->name, nbi_var_sig(sig, sizeof sig, v),
                                 v->fn != NULL ? v->fn : "?");
        }
        nb_var *r = info->vmap(tr, v, args, B);
        if (tr->status != NB_OK) {
            return tr->status;
        }
        if (nbi_vmap_bad(r) || r->rank != v->rank + 1) {
            return nbi_trace_err(tr, NB_ERR_INTERNAL,
                                 "nb_vmap: the batching rule of '%s' gave rank %d for rank %d",
                                 info->name, r != NULL ? r->rank : -1, v->rank);
        }
        bat[i] = r;
    }
    for (int o = 0; o < n_out; o++) {
        bouts[o] =
            outs[o] != NULL && outs[o]->id >= 0 && outs[o]->id < end ? bat[outs[o]->id] : NULL;
    }
    return tr->status;
}

/* ---- the layer ------------------------------------------------------------------------ */

nb_vmap_opts nb_vmap_opts_default(void) {
    nb_vmap_opts o;
    memset(&o, 0, sizeof o);
    return o;
}

/* An axes tree holds nodes, ints and nulls only. */
static nb_status nbi_vmap_check_axes(nb_ctx *ctx, const nb_tree *t, const char *what,
                                     nbi_path *path) {
    if (nbi_tree_kind_is_node(t->kind)) {
        for (int64_t i = 0; i < t->n; i++) {
            nbi_path_mark pm = nbi_path_save(path);
            if (t->kind == NB_TREE_KIND_DICT) {
                nbi_path_push_key(path, t->keys[i]);
            } else {
                nbi_path_push_index(path, i);
            }
            nb_status st = nbi_vmap_check_axes(ctx, t->children[i], what, path);
            nbi_path_restore(path, pm);
            if (st != NB_OK) {
                return st;
            }
        }
        return NB_OK;
    }
    if (t->kind == NB_TREE_KIND_INT || t->kind == NB_TREE_KIND_NULL) {
        return NB_OK;
    }
    return nbi_err(ctx, NB_ERR_INVALID,
                   "nb_vmap: %s holds a %s at %s; its leaves must be an int (the batch axis, "
                   "negative counts back) or null (not batched)",
                   what, nb_tree_kind_name(t->kind), nbi_path_str(path));
}

nb_status nb_vmap(nb_fn *f, const nb_vmap_opts *opts, nb_fn **out) {
    static const char who[] = "nb_vmap";
    if (out != NULL) {
        *out = NULL;
    }
    nb_vmap_opts o = opts != NULL ? *opts : nb_vmap_opts_default();
    /* a NULL f still reaches a context through the axes trees */
    nb_ctx *hctx = nbi_handle_ctx(o.in_axes);
    hctx = hctx != NULL ? hctx : nbi_handle_ctx(o.out_axes);
    nb_status st = nbi_check_handle_in(hctx, f, NBI_MAGIC_FN, who, "f");
    if (st != NB_OK) {
        return st;
    }
    nb_ctx *ctx = f->hdr.ctx;
    if (out == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_fn * for the new function)",
                       who);
    }
    const nb_tree *axes[2] = {o.in_axes, o.out_axes};
    static const char *const names[2] = {"opts->in_axes", "opts->out_axes"};
    for (int k = 0; k < 2; k++) {
        if (axes[k] == NULL) {
            continue;
        }
        st = nbi_check_handle_in(ctx, axes[k], NBI_MAGIC_TREE, who, names[k]);
        if (st != NB_OK) {
            return st;
        }
        nbi_path path;
        nbi_path_init(&path);
        st = nbi_vmap_check_axes(ctx, axes[k], names[k], &path);
        if (st != NB_OK) {
            return st;
        }
    }
    if (o.axis_size < 0) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: opts->axis_size = %lld must be >= 0 (0: taken from the batched "
                       "arguments)",
                       who, (long long)o.axis_size);
    }
    /* (in_axes, out_axes, axis_size, in_axes given, out_axes given): a null tree given as
     * an axes tree means "not batched", unlike a NULL pointer */
    nb_tree *parts[5] = {NULL, NULL, NULL, NULL, NULL}, *spec = NULL;
    st = o.in_axes != NULL ? (parts[0] = nb_tree_retain((nb_tree *)o.in_axes), NB_OK)
                           : nb_tree_null(ctx, &parts[0]);
    if (st == NB_OK) {
        st = o.out_axes != NULL ? (parts[1] = nb_tree_retain((nb_tree *)o.out_axes), NB_OK)
                                : nb_tree_null(ctx, &parts[1]);
    }
    if (st == NB_OK) {
        st = nb_tree_int(ctx, o.axis_size, &parts[2]);
    }
    if (st == NB_OK) {
        st = nb_tree_bool(ctx, o.in_axes != NULL, &parts[3]);
    }
    if (st == NB_OK) {
        st = nb_tree_bool(ctx, o.out_axes != NULL, &parts[4]);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 5, parts, &spec);
    }
    for (int k = 0; k < 5; k++) {
        nb_tree_destroy(parts[k]);
    }
    nb_fn *g = NULL;
    if (st == NB_OK) {
        st = nbi_fn_wrap(f, who, NBI_FN_VMAP, 0, true, &g);
    }
    if (st != NB_OK) {
        nb_tree_destroy(spec);
        return st;
    }
    g->spec = spec;
    *out = g;
    return NB_OK;
}

/* ---- tracing the layer ------------------------------------------------------------------ */

typedef struct nbi_vin {
    nb_trace *tr;
    int64_t B; /* -1 until a batched leaf sets it */
    char bpath[NB_PATH_MAX];
    nb_var **ex, **bx; /* per batched leaf: the example, the batched value (axis 0) */
    int n, cap;
} nbi_vin;

static nb_status nbi_vin_push(nbi_vin *m, nb_var *ex, nb_var *bx) {
    if (m->n == m->cap) {
        int cap = m->cap ? m->cap * 2 : 16;
        nb_var **a = nbi_arena_alloc(&m->tr->arena, (size_t)cap * sizeof *a);
        nb_var **b = nbi_arena_alloc(&m->tr->arena, (size_t)cap * sizeof *b);
        if (a == NULL || b == NULL) {
            return nbi_trace_err(m->tr, NB_ERR_OOM, "nb_vmap: out of memory");
        }
        if (m->n > 0) {
            memcpy(a, m->ex, (size_t)m->n * sizeof *a);
            memcpy(b, m->bx, (size_t)m->n * sizeof *b);
        }
        m->ex = a;
        m->bx = b;
        m->cap = cap;
    }
    m->ex[m->n] = ex;
    m->bx[m->n] = bx;
    m->n++;
    return NB_OK;
}

/* The prefix tree below node x for axes (what = "in_axes" or "out_axes", against "the
 * arguments" or "the output"): axes itself when it is an int or null (it applies to the
 * whole subtree; *sub NULL), or a node of x's kind, length and dict keys (*sub = axes). */
static nb_status nbi_vaxes_sub(nb_trace *tr, const nb_tree *x, const nb_tree *axes,
                               const char *what, const char *against, nbi_path *path,
                               const nb_tree **sub) {
    *sub = axes != NULL && nbi_tree_kind_is_node(axes->kind) ? axes : NULL;
    if (*sub == NULL) {
        return NB_OK;
    }
    if (axes->kind != x->kind || axes->n != x->n) {
        return nbi_trace_err(tr, NB_ERR_STRUCTURE,
                             "nb_vmap: %s does not match %s at %s: %s of %lld vs %s of %lld (%s "
                             "is a tree shaped like %s, or a prefix of it, with an int or null "
                             "at its leaves)",
                             what, against, nbi_path_str(path), nb_tree_kind_name(axes->kind),
                             (long long)axes->n, nb_tree_kind_name(x->kind), (long long)x->n, what,
                             against);
    }
    for (int64_t i = 0; x->kind == NB_TREE_KIND_DICT && i < x->n; i++) {
        if (strcmp(axes->keys[i], x->keys[i]) != 0) {
            return nbi_trace_err(tr, NB_ERR_STRUCTURE,
                                 "nb_vmap: %s has key \"%s\" where %s hold \"%s\" (at %s)", what,
                                 axes->keys[i], against, x->keys[i], nbi_path_str(path));
        }
    }
    return NB_OK;
}

/* path + the step to x's child i */
static void nbi_vpath_push(nbi_path *path, const nb_tree *x, int64_t i) {
    if (x->kind == NB_TREE_KIND_DICT) {
        nbi_path_push_key(path, x->keys[i]);
    } else {
        nbi_path_push_index(path, i);
    }
}

/* The example args: args with each batched var leaf (axes: the in_axes prefix at this node;
 * NULL means the default, 0 for every var leaf) replaced by a zero array of one lane's shape. */
static nb_status nbi_vin_rec(nbi_vin *m, const nb_tree *x, const nb_tree *axes, bool dflt,
                             nbi_path *path, nb_tree **out) {
    nb_trace *tr = m->tr;
    *out = NULL;
    if (axes != NULL && !nbi_tree_kind_is_node(axes->kind)) {
        dflt = false; /* an int or null applies to the whole subtree */
    }
    if (nbi_tree_kind_is_node(x->kind)) {
        const nb_tree *sub = NULL;
        if (nbi_vaxes_sub(tr, x, axes, "in_axes", "the arguments", path, &sub) != NB_OK) {
            return tr->status;
        }
        nb_tree **items =
            nbi_arena_alloc(&tr->arena, (size_t)(x->n > 0 ? x->n : 1) * sizeof *items);
        if (items == NULL) {
            return nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
        }
        for (int64_t i = 0; i < x->n; i++) {
            nbi_path_mark pm = nbi_path_save(path);
            nbi_vpath_push(path, x, i);
            nb_status st = nbi_vin_rec(m, x->children[i], sub != NULL ? sub->children[i] : axes,
                                       dflt, path, &items[i]);
            nbi_path_restore(path, pm);
            if (st != NB_OK) {
                for (int64_t k = 0; k < i; k++) {
                    nb_tree_destroy(items[k]);
                }
                return st;
            }
        }
        nb_status st = nbi_tree_node_take(tr->ctx, "nb_vmap", x->kind, x->n,
                                          (const char *const *)x->keys, items, out);
        if (st == NB_OK) {
            (*out)->flags = x->flags;
        }
        return st == NB_OK ? NB_OK : nbi_trace_err(tr, st, "nb_vmap: out of memory");
    }
    /* an int batches the arrays under it; static leaves are never batched (filter_vmap) */
    bool batched =
        x->kind == NB_TREE_KIND_VAR && (dflt || (axes != NULL && axes->kind == NB_TREE_KIND_INT));
    if (!batched) {
        *out = nb_tree_retain((nb_tree *)x);
        return NB_OK;
    }
    nb_var *v = x->u.var.var;
    int64_t ax = dflt ? 0 : axes->u.i;
    int a = 0;
    char sig[NBI_SIG_CAP];
    if (v->rank == 0 || !nbi_norm_axis((int)ax, v->rank, &a) || ax != (int)ax) {
        return nbi_trace_err(
            tr, NB_ERR_INVALID,
            "nb_vmap: in_axes gives axis %lld for %s at %s, %s -- give an axis "
            "in -%d..%d, or null to pass it unbatched%s",
            (long long)ax, nbi_var_sig(sig, sizeof sig, v), nbi_path_str(path),
            v->rank == 0 ? "a scalar (rank 0) has no axis to batch" : "out of range", v->rank,
            v->rank - 1, dflt ? " (the default batches every array leaf on axis 0)" : "");
    }
    int64_t n = v->shape[a];
    if (m->B >= 0 && n != m->B) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_vmap: batched sizes disagree: %s has %lld along its batch axis "
                             "%d but %s has %lld -- batch every argument over the same number of "
                             "lanes (or pass one unbatched with in_axes null)",
                             nbi_path_str(path), (long long)n, a, m->bpath, (long long)m->B);
    }
    if (m->B < 0) {
        m->B = n;
        snprintf(m->bpath, sizeof m->bpath, "%s", nbi_path_str(path));
    }
    nb_var *bx = nbi_vmap_move(v, a, 0);
    int64_t shape[NB_MAX_RANK];
    for (int d = 0, k = 0; d < v->rank; d++) {
        if (d != a) {
            shape[k++] = v->shape[d];
        }
    }
    nb_var *ex = nb_full(tr, v->dtype, v->rank - 1, shape, 0.0);
    if (tr->status != NB_OK || nbi_vin_push(m, ex, bx) != NB_OK) {
        return tr->status;
    }
    return nbi_tree_var(tr->ctx, ex, tr->id, out) == NB_OK
               ? NB_OK
               : nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
}

typedef struct nbi_vout {
    nb_trace *tr;
    int64_t B;
    int32_t begin, end;
    nb_var **outs; /* the output var leaves, in order */
    nb_var **bouts;
    int n, cap, k;
} nbi_vout;

/* Pass 1 collects the output var leaves; pass 2 (k counting) rebuilds the tree. */
static nb_status nbi_vout_rec(nbi_vout *m, const nb_tree *x, const nb_tree *axes, bool dflt,
                              bool collect, nbi_path *path, nb_tree **out) {
    nb_trace *tr = m->tr;
    if (out != NULL) {
        *out = NULL;
    }
    if (axes != NULL && !nbi_tree_kind_is_node(axes->kind)) {
        dflt = false;
    }
    if (nbi_tree_kind_is_node(x->kind)) {
        const nb_tree *sub = NULL;
        if (nbi_vaxes_sub(tr, x, axes, "out_axes", "the output", path, &sub) != NB_OK) {
            return tr->status;
        }
        nb_tree **items = NULL;
        if (!collect) {
            items = nbi_arena_alloc(&tr->arena, (size_t)(x->n > 0 ? x->n : 1) * sizeof *items);
            if (items == NULL) {
                return nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
            }
        }
        for (int64_t i = 0; i < x->n; i++) {
            nbi_path_mark pm = nbi_path_save(path);
            nbi_vpath_push(path, x, i);
            nb_status st = nbi_vout_rec(m, x->children[i], sub != NULL ? sub->children[i] : axes,
                                        dflt, collect, path, collect ? NULL : &items[i]);
            nbi_path_restore(path, pm);
            if (st != NB_OK) {
                for (int64_t k = 0; !collect && k < i; k++) {
                    nb_tree_destroy(items[k]);
                }
                return st;
            }
        }
        if (collect) {
            return NB_OK;
        }
        nb_status st = nbi_tree_node_take(tr->ctx, "nb_vmap", x->kind, x->n,
                                          (const char *const *)x->keys, items, out);
        if (st == NB_OK) {
            (*out)->flags = x->flags;
        }
        return st == NB_OK ? NB_OK : nbi_trace_err(tr, st, "nb_vmap: out of memory");
    }
    if (x->kind != NB_TREE_KIND_VAR) {
        if (!collect) {
            *out = nb_tree_retain((nb_tree *)x);
        }
        return NB_OK;
    }
    if (collect) {
        if (m->n == m->cap) {
            int cap = m->cap ? m->cap * 2 : 16;
            nb_var **a = nbi_arena_alloc(&tr->arena, (size_t)cap * sizeof *a);
            if (a == NULL) {
                return nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
            }
            if (m->n > 0) {
                memcpy(a, m->outs, (size_t)m->n * sizeof *a);
            }
            m->outs = a;
            m->cap = cap;
        }
        m->outs[m->n++] = x->u.var.var;
        return NB_OK;
    }
    nb_var *v = x->u.var.var, *bv = m->bouts[m->k++];
    char sig[NBI_SIG_CAP];
    bool none = !dflt && (axes == NULL || axes->kind == NB_TREE_KIND_NULL);
    if (none) {
        if (bv != NULL) {
            return nbi_trace_err(tr, NB_ERR_INVALID,
                                 "nb_vmap: out_axes is null at %s, but that output (%s per lane) "
                                 "depends on the batched arguments -- give it an out axis (e.g. "
                                 "0)",
                                 nbi_path_str(path), nbi_var_sig(sig, sizeof sig, v));
        }
        *out = nb_tree_retain((nb_tree *)x);
        return NB_OK;
    }
    int64_t ax = dflt ? 0 : axes->u.i;
    int a = 0;
    if (!nbi_norm_axis((int)ax, v->rank + 1, &a) || ax != (int)ax) {
        return nbi_trace_err(tr, NB_ERR_INVALID,
                             "nb_vmap: out_axes gives axis %lld at %s for an output of %s per "
                             "lane: out of range -- give an axis in -%d..%d (the batched output "
                             "has rank %d)",
                             (long long)ax, nbi_path_str(path), nbi_var_sig(sig, sizeof sig, v),
                             v->rank + 1, v->rank, v->rank + 1);
    }
    if (bv == NULL) {
        bv = nbi_vmap_bcast(v, m->B); /* the same for every lane */
    }
    bv = nbi_vmap_move(bv, 0, a);
    if (tr->status != NB_OK) {
        return tr->status;
    }
    return nbi_tree_var(tr->ctx, bv, tr->id, out) == NB_OK
               ? NB_OK
               : nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
}

nb_status nbi_trace_vmap(nb_trace *tr, const nb_fn *g, const nb_tree *self, const nb_tree *args,
                         nb_tree **out) {
    const nb_tree *in_axes = g->spec->children[0], *out_axes = g->spec->children[1];
    int64_t axis_size = g->spec->children[2]->u.i;
    bool in_dflt = !g->spec->children[3]->u.b, out_dflt = !g->spec->children[4]->u.b;
    nbi_vin m;
    memset(&m, 0, sizeof m);
    m.tr = tr;
    m.B = -1;
    nbi_path path;
    nbi_path_init(&path);
    nbi_path_push_key(&path, "args");
    nb_tree *ex = NULL, *res = NULL;
    nb_status st = nbi_vin_rec(&m, args, in_dflt ? NULL : in_axes, in_dflt, &path, &ex);
    if (st == NB_OK && m.B < 0 && axis_size == 0) {
        st = nbi_trace_err(tr, NB_ERR_INVALID,
                           "nb_vmap: '%s' has no batched argument, so the number of lanes is "
                           "unknown -- set opts.axis_size",
                           g->name);
    }
    if (st == NB_OK && m.B >= 0 && axis_size > 0 && axis_size != m.B) {
        st = nbi_trace_err(tr, NB_ERR_SHAPE,
                           "nb_vmap: opts.axis_size is %lld but %s has %lld lanes -- make them "
                           "agree (or leave axis_size 0)",
                           (long long)axis_size, m.bpath, (long long)m.B);
    }
    int64_t B = m.B >= 0 ? m.B : axis_size;
    int32_t begin = tr->g.n_nodes;
    if (st == NB_OK) {
        tr->vmap_depth++; /* calls inlined (not ad_depth: a custom_vjp stays a plain call) */
        st = nbi_trace_fn(tr, g->inner, self, ex, &res);
        tr->vmap_depth--;
    }
    int32_t end = tr->g.n_nodes;
    nbi_vout o;
    memset(&o, 0, sizeof o);
    o.tr = tr;
    o.B = B;
    nbi_path_init(&path);
    if (st == NB_OK) {
        st = nbi_vout_rec(&o, res, out_dflt ? NULL : out_axes, out_dflt, true, &path, NULL);
    }
    if (st == NB_OK) {
        o.bouts = nbi_arena_alloc(&tr->arena, (size_t)(o.n + 1) * sizeof *o.bouts);
        st = o.bouts != NULL ? NB_OK : nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
    }
    if (st == NB_OK) {
        st = nbi_vmap_region(tr, begin, end, m.n, m.ex, m.bx, B, o.n, o.outs, o.bouts);
    }
    if (st == NB_OK) {
        nbi_path_init(&path);
        st = nbi_vout_rec(&o, res, out_dflt ? NULL : out_axes, out_dflt, false, &path, out);
    }
    nb_tree_destroy(res);
    nb_tree_destroy(ex);
    return tr->status != NB_OK ? tr->status : st;
}

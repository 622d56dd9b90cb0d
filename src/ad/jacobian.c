/*
 * jacobian.c -- Jacobians and Hessians (nabla/ad.h): jacrev, jacfwd, jacobian, hessian.
 *
 * A JAC layer wraps f (spec: the mode, an int). Traced, its body batches one of f's
 * derivatives over the basis, as JAX does: reverse mode is vmap(vjp(f)) over the one-hot
 * cotangents of f's float outputs (M of them, M their total size), forward mode vmap(jvp(f))
 * over the one-hot tangents of args[0]'s float leaves (N of them). One batched pass either
 * way -- the vmap rules turn the N or M products into matrix products -- so the cheaper
 * mode is the one with fewer basis vectors: jacobian picks forward when N < M (JAX's advice
 * for tall Jacobians), reverse otherwise. The two modes sum in different orders, so their
 * Jacobians agree to rounding, not bit for bit (the tests say which agree exactly).
 *
 * The result has f's output structure with every float leaf y (shape Sy) replaced by a tree
 * of args[0]'s structure whose float leaves x (shape Sx) hold the blocks dy/dx of shape
 * Sy + Sx; non-float leaves on either side are null (no derivative).
 */
#include "ad/ir.h"

#include <nabla/ad.h>

#include <string.h>

enum { NBJ_REV = 0, NBJ_FWD = 1, NBJ_AUTO = 2 };

static nb_status nbj_make(nb_fn *f, const char *fn, int mode, nb_fn **out) {
    if (out != NULL) {
        *out = NULL;
    }
    nb_status st = nbi_check_handle(f, NBI_MAGIC_FN, fn, "f");
    if (st != NB_OK) {
        return st;
    }
    if (out == NULL) {
        return nbi_err(f->hdr.ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_fn * for the new function)", fn);
    }
    nb_tree *spec = NULL;
    nb_fn *g = NULL;
    st = nb_tree_int(f->hdr.ctx, mode, &spec);
    if (st == NB_OK) {
        st = nbi_fn_wrap(f, fn, NBI_FN_JAC, 0, true, &g);
    }
    if (st != NB_OK) {
        nb_tree_destroy(spec);
        return st;
    }
    g->spec = spec;
    *out = g;
    return NB_OK;
}

nb_status nb_jacrev(nb_fn *f, nb_fn **out) {
    return nbj_make(f, "nb_jacrev", NBJ_REV, out);
}

nb_status nb_jacfwd(nb_fn *f, nb_fn **out) {
    return nbj_make(f, "nb_jacfwd", NBJ_FWD, out);
}

nb_status nb_jacobian(nb_fn *f, nb_fn **out) {
    return nbj_make(f, "nb_jacobian", NBJ_AUTO, out);
}

nb_status nb_hessian(nb_fn *f, nb_fn **out) {
    if (out != NULL) {
        *out = NULL;
    }
    nb_fn *r = NULL;
    nb_status st = nbj_make(f, "nb_hessian", NBJ_REV, &r);
    if (st == NB_OK) {
        st = nbj_make(r, "nb_hessian", NBJ_FWD, out);
    }
    nb_fn_destroy(r);
    return st;
}

/* ---- the layer's body ------------------------------------------------------------------ */

/* The float leaves of a flattened tree: their vars (NULL for other leaves), sizes and the
 * total. */
typedef struct nbj_side {
    nb_tree *leaves; /* the flattened list (a reference) */
    nb_treedef *def;
    int64_t n, total;
    nb_var **v;
    int64_t *off;
} nbj_side;

static nb_status nbj_side_of(nb_trace *tr, const nb_tree *t, nbj_side *s) {
    memset(s, 0, sizeof *s);
    nb_status st = nb_tree_flatten(t, &s->leaves, &s->def);
    if (st != NB_OK) {
        return nbi_trace_err(tr, st, "flattening failed: out of memory");
    }
    s->n = nb_tree_len(s->leaves);
    s->v = nbi_arena_alloc(&tr->arena, (size_t)(s->n + 1) * sizeof *s->v);
    s->off = nbi_arena_alloc(&tr->arena, (size_t)(s->n + 1) * sizeof *s->off);
    if (s->v == NULL || s->off == NULL) {
        return nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
    }
    for (int64_t i = 0; i < s->n; i++) {
        const nb_tree *l = nb_tree_child(s->leaves, i);
        nb_var *v = nb_tree_kind_of(l) == NB_TREE_KIND_ARRAY ? nb_constant(tr, nb_tree_get_array(l))
                                                             : nb_var_of(tr, l);
        s->off[i] = s->total;
        s->v[i] = v != NULL && nb_dtype_is_float(nb_var_dtype(v)) ? v : NULL;
        if (s->v[i] != NULL) {
            s->total += nb_var_size(v);
        }
    }
    s->off[s->n] = s->total;
    return nb_trace_status(tr);
}

static void nbj_side_free(nbj_side *s) {
    nb_tree_destroy(s->leaves);
    nb_treedef_destroy(s->def);
}

/* The one-hot basis block of a leaf: [total] + shape of v, row r = e_r restricted to the
 * leaf (ones where r == off + the element's flat index). */
static nb_var *nbj_basis(nb_trace *tr, nb_var *v, int64_t off, int64_t total) {
    int64_t size = nb_var_size(v), shape[NB_MAX_RANK + 1];
    nb_var *rows = nb_iota(tr, NB_DTYPE_I64, 2, (int64_t[]){total, size}, 0);
    nb_var *cols = nb_iota(tr, NB_DTYPE_I64, 2, (int64_t[]){total, size}, 1);
    nb_var *hot = nb_eq(rows, nb_add(cols, nb_scalar_typed(tr, NB_DTYPE_I64, (double)off)));
    shape[0] = total;
    memcpy(shape + 1, nb_var_shape(v), (size_t)nb_var_rank(v) * sizeof *shape);
    return nb_reshape(nb_cast(hot, nb_var_dtype(v)), nb_var_rank(v) + 1, shape);
}

/* The one-hot basis of a side as a tree of its structure: nbj_basis at each float leaf,
 * null at the others. *out a new tree. */
static nb_status nbj_basis_tree(nb_trace *tr, const nbj_side *s, nb_tree **out) {
    nb_tree **b = nbi_arena_alloc(&tr->arena, (size_t)(s->n + 1) * sizeof *b);
    if (b == NULL) {
        return nbi_trace_err(tr, NB_ERR_OOM, "a Jacobian's basis: out of memory");
    }
    memset(b, 0, (size_t)(s->n + 1) * sizeof *b);
    nb_status st = NB_OK;
    for (int64_t i = 0; i < s->n && st == NB_OK; i++) {
        if (s->v[i] == NULL) {
            st = nb_tree_null(tr->ctx, &b[i]);
        } else { /* a leaf of the trace's own */
            b[i] = nb_leaf(nbj_basis(tr, s->v[i], s->off[i], s->total));
        }
    }
    nb_tree *list = NULL;
    if (st == NB_OK) {
        st = nb_tree_list(tr->ctx, s->n, b, &list);
    }
    for (int64_t i = 0; i < s->n; i++) {
        if (s->v[i] == NULL) {
            nb_tree_destroy(b[i]); /* ours; the leaves belong to the trace */
        }
    }
    if (st == NB_OK) {
        st = nb_tree_unflatten(s->def, list, out);
    }
    nb_tree_destroy(list);
    return st != NB_OK && nb_trace_status(tr) == NB_OK
               ? nbi_trace_err(tr, st, "a Jacobian's basis: out of memory")
               : nb_trace_status(tr);
}

/* rows [off, off + n) of b ([total] + rest) as [n] + rest */
static nb_var *nbj_rows(nb_var *b, int64_t off, int64_t n) {
    int r = nb_var_rank(b);
    int64_t start[NB_MAX_RANK] = {0}, stop[NB_MAX_RANK];
    for (int d = 0; d < r; d++) {
        stop[d] = nb_var_dim(b, d);
    }
    start[0] = off;
    stop[0] = off + n;
    return nb_slice(b, start, stop, NULL);
}

/* nb_tree_map callback: null at every dynamic leaf (the arguments that get no tangent) */
static nb_status nbj_null_leaf(void *ud, const char *path, int n, const nb_tree *const *leaves,
                               nb_tree **out) {
    (void)path;
    (void)n;
    (void)leaves;
    return nb_tree_null((nb_ctx *)ud, out);
}

/* in or out axes (null, 0): the first element unbatched, the second batched on axis 0 */
static nb_status nbj_axes(nb_ctx *ctx, nb_tree **out) {
    nb_tree *a = NULL, *b = NULL;
    nb_status st = nb_tree_null(ctx, &a);
    if (st == NB_OK) {
        st = nb_tree_int(ctx, 0, &b);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){a, b}, out);
    }
    nb_tree_destroy(a);
    nb_tree_destroy(b);
    return st;
}

/* vmap(g) with in and out axes (null, 0), applied to (first, second) */
static const nb_tree *nbj_batched(nb_trace *tr, nb_fn *g, const nb_tree *first,
                                  const nb_tree *second) {
    nb_ctx *ctx = tr->ctx;
    nb_tree *axes = NULL, *pair = NULL;
    nb_fn *vg = NULL;
    nb_status st = nbj_axes(ctx, &axes);
    if (st == NB_OK) {
        nb_vmap_opts o = nb_vmap_opts_default();
        o.in_axes = axes;
        o.out_axes = axes;
        st = nb_vmap(g, &o, &vg);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (const nb_tree *[]){first, second}, &pair);
    }
    const nb_tree *r = st == NB_OK ? nb_apply(tr, vg, pair) : NULL;
    if (st != NB_OK) {
        nbi_trace_err(tr, st, "a Jacobian's batched pass: out of memory");
    }
    nb_tree_destroy(pair);
    nb_tree_destroy(axes);
    nb_fn_destroy(vg);
    return r;
}

/* Assemble the result: block(k, i) for output leaf k and input leaf i. */
typedef nb_var *(*nbj_block_fn)(void *ud, int64_t k, int64_t i);

static nb_status nbj_assemble(nb_trace *tr, const nbj_side *ys, const nbj_side *xs,
                              nbj_block_fn block, void *ud, nb_tree **out) {
    nb_ctx *ctx = tr->ctx;
    nb_tree **outer = nbi_arena_alloc(&tr->arena, (size_t)(ys->n + 1) * sizeof *outer);
    nb_tree **inner = nbi_arena_alloc(&tr->arena, (size_t)(xs->n + 1) * sizeof *inner);
    if (outer == NULL || inner == NULL) {
        return nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
    }
    nb_status st = NB_OK;
    int64_t made = 0;
    for (int64_t k = 0; k < ys->n && st == NB_OK; k++) {
        if (ys->v[k] == NULL) {
            st = nb_tree_null(ctx, &outer[k]);
            made += st == NB_OK;
            continue;
        }
        int64_t mi = 0;
        for (int64_t i = 0; i < xs->n && st == NB_OK; i++) {
            st = xs->v[i] == NULL                                ? nb_tree_null(ctx, &inner[i])
                 : (inner[i] = nb_leaf(block(ud, k, i))) != NULL ? NB_OK
                                                                 : NB_ERR_OOM;
            mi += st == NB_OK;
        }
        nb_tree *list = NULL;
        if (st == NB_OK) {
            st = nb_tree_list(ctx, xs->n, inner, &list);
        }
        for (int64_t i = 0; i < mi; i++) {
            if (xs->v[i] == NULL) {
                nb_tree_destroy(inner[i]); /* nb_leaf trees belong to the trace */
            }
        }
        if (st == NB_OK) {
            st = nb_tree_unflatten(xs->def, list, &outer[k]);
            made += st == NB_OK;
        }
        nb_tree_destroy(list);
    }
    nb_tree *olist = NULL;
    if (st == NB_OK) {
        st = nb_tree_list(ctx, ys->n, outer, &olist);
    }
    for (int64_t k = 0; k < made; k++) {
        nb_tree_destroy(outer[k]);
    }
    if (st == NB_OK) {
        st = nb_tree_unflatten(ys->def, olist, out);
    }
    nb_tree_destroy(olist);
    if (st != NB_OK && nb_trace_status(tr) == NB_OK) {
        nbi_trace_err(tr, st, "assembling a Jacobian failed: %s",
                      st == NB_ERR_OOM ? "out of memory" : nb_status_string(st));
    }
    return nb_trace_status(tr);
}

typedef struct nbj_blocks {
    const nbj_side *ys, *xs;
    const nb_tree *prod; /* the float leaves' batched derivatives, in order: rev, per x leaf
                          * [M] + Sx; fwd, per y leaf [N] + Sy */
    const int64_t *pos;  /* a side leaf's index in prod */
    bool fwd;
    nb_trace *tr;
} nbj_blocks;

static nb_var *nbj_block(void *ud, int64_t k, int64_t i) {
    const nbj_blocks *b = ud;
    const nbj_side *ys = b->ys, *xs = b->xs;
    nb_var *y = ys->v[k], *x = xs->v[i];
    int ry = nb_var_rank(y), rx = nb_var_rank(x);
    int64_t shape[2 * NB_MAX_RANK];
    memcpy(shape, nb_var_shape(y), (size_t)ry * sizeof *shape);
    memcpy(shape + ry, nb_var_shape(x), (size_t)rx * sizeof *shape);
    if (ry + rx > NB_MAX_RANK) {
        return nbi_trace_errv(b->tr, NB_ERR_SHAPE,
                              "a Jacobian block of a rank-%d output by a rank-%d input has rank "
                              "%d; the most is %d",
                              ry, rx, ry + rx, NB_MAX_RANK);
    }
    if (!b->fwd) { /* rows of y's cotangents in the input leaf's batched cotangent */
        nb_var *ct = nb_var_of(b->tr, nb_tree_child(b->prod, b->pos[i]));
        return nb_reshape(nbj_rows(ct, ys->off[k], nb_var_size(y)), ry + rx, shape);
    }
    /* rows of x's tangents in the output leaf's batched tangent: [n_x] + Sy, to Sx + Sy,
     * then to Sy + Sx */
    nb_var *t = nb_var_of(b->tr, nb_tree_child(b->prod, b->pos[k]));
    int64_t sxy[2 * NB_MAX_RANK];
    memcpy(sxy, nb_var_shape(x), (size_t)rx * sizeof *sxy);
    memcpy(sxy + rx, nb_var_shape(y), (size_t)ry * sizeof *sxy);
    nb_var *r = nb_reshape(nbj_rows(t, xs->off[i], nb_var_size(x)), rx + ry, sxy);
    int perm[NB_MAX_RANK];
    for (int d = 0; d < ry; d++) {
        perm[d] = rx + d;
    }
    for (int d = 0; d < rx; d++) {
        perm[ry + d] = d;
    }
    return nb_transpose(r, perm);
}

nb_status nbi_trace_jac(nb_trace *tr, const nb_fn *f, const nb_tree *self, const nb_tree *args,
                        nb_tree **out) {
    *out = NULL;
    int64_t mode = NBJ_REV;
    nb_tree_get_int(f->spec, &mode);
    const char *who = f->name;
    if ((args->kind != NB_TREE_KIND_TUPLE && args->kind != NB_TREE_KIND_LIST) || args->n < 1) {
        return nbi_trace_err(tr, NB_ERR_STRUCTURE,
                             "%s: the arguments are a %s of %lld; they must be a tuple or list "
                             "whose first element is what the Jacobian is taken with respect to",
                             who, nb_tree_kind_name(args->kind), (long long)args->n);
    }
    nb_ctx *ctx = tr->ctx;
    nb_tree *y = NULL;
    nb_status st = nbi_trace_fn(tr, f->inner, self, args, &y); /* shapes; DCE drops it */
    if (st != NB_OK) {
        return st;
    }
    nbj_side ys, xs;
    st = nbj_side_of(tr, y, &ys);
    if (st == NB_OK) {
        st = nbj_side_of(tr, nb_tree_child(args, 0), &xs);
    } else {
        memset(&xs, 0, sizeof xs);
    }
    nb_fn *d = NULL;
    nb_tree *basis = NULL;
    bool fwd = mode == NBJ_FWD || (mode == NBJ_AUTO && xs.total < ys.total);
    const nb_tree *res = NULL;
    if (st == NB_OK && !fwd) { /* vmap(vjp(f))((args, cotangent basis)) */
        st = nbj_basis_tree(tr, &ys, &basis);
        if (st == NB_OK) {
            st = nb_vjp((nb_fn *)f->inner, &d);
        }
        if (st == NB_OK) {
            res = nbj_batched(tr, d, args, basis);
        }
    } else if (st == NB_OK) { /* vmap(jvp(f))((args, tangent basis of args[0])) */
        nb_tree *t0 = NULL;
        st = nbj_basis_tree(tr, &xs, &t0);
        /* the other arguments get no tangent: null at each of their leaves */
        const nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)args->n * sizeof *items);
        nb_tree **nulls = nbi_arena_alloc(&tr->arena, (size_t)args->n * sizeof *nulls);
        if (st == NB_OK && (items == NULL || nulls == NULL)) {
            st = nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        }
        int64_t made = 0;
        for (int64_t j = 1; j < args->n && st == NB_OK; j++) {
            st = nb_tree_map(nb_tree_child(args, j), nbj_null_leaf, ctx, 0, &nulls[j]);
            items[j] = nulls[j];
            made = st == NB_OK ? j : made;
        }
        if (st == NB_OK) {
            items[0] = t0;
            st = nb_tree_tuple(ctx, args->n, items, &basis);
        }
        for (int64_t j = 1; j <= made; j++) {
            nb_tree_destroy(nulls[j]);
        }
        nb_tree_destroy(t0);
        if (st == NB_OK) {
            st = nb_jvp((nb_fn *)f->inner, &d);
        }
        if (st == NB_OK) {
            res = nbj_batched(tr, d, args, basis);
        }
    }
    if (st == NB_OK && res != NULL) {
        /* rev: res = (y, cotangents of args) -> args[0]'s, flattened; fwd: res = (y,
         * tangents of y) -> flattened */
        const nb_tree *part = fwd ? nb_tree_child(res, 1) : nb_tree_child(nb_tree_child(res, 1), 0);
        nb_tree *flat = NULL;
        nb_treedef *pdef = NULL;
        st = nb_tree_flatten(part, &flat, &pdef);
        nb_treedef_destroy(pdef);
        if (st == NB_OK) {
            /* the flattened derivatives: one per float leaf of the side, in order (the
             * others are null, which flattening skips) */
            const nbj_side *side = fwd ? &ys : &xs;
            int64_t *pos = nbi_arena_alloc(&tr->arena, (size_t)(side->n + 1) * sizeof *pos);
            int64_t q = 0;
            for (int64_t i = 0; pos != NULL && i < side->n; i++) {
                pos[i] = side->v[i] != NULL ? q++ : -1;
            }
            if (pos == NULL || q != nb_tree_len(flat)) {
                st = nbi_trace_err(tr, pos == NULL ? NB_ERR_OOM : NB_ERR_INTERNAL,
                                   "%s: the batched derivative has %lld leaves for %lld", who,
                                   (long long)nb_tree_len(flat), (long long)q);
            } else {
                nbj_blocks bl = {
                    .ys = &ys, .xs = &xs, .prod = flat, .pos = pos, .fwd = fwd, .tr = tr};
                st = nbj_assemble(tr, &ys, &xs, nbj_block, &bl, out);
            }
        }
        nb_tree_destroy(flat);
    }
    nb_fn_destroy(d);
    nb_tree_destroy(basis);
    nbj_side_free(&xs);
    nbj_side_free(&ys);
    nb_tree_destroy(y);
    if (st != NB_OK || nb_trace_status(tr) != NB_OK) {
        nb_tree_destroy(*out);
        *out = NULL;
        return nb_trace_status(tr) != NB_OK ? nb_trace_status(tr) : st;
    }
    return NB_OK;
}

/*
 * tree_ops.c -- operations over whole trees: map, filter/partition/combine, equality and
 * diff, printing.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NBI_MAP_MAX_TREES 16

static bool nbi_tree_live(const nb_tree *t) {
    return nbi_obj_live(t, NBI_MAGIC_TREE);
}

/* ---- describing nodes for messages -------------------------------------------------- */

/* The shortest %g text that reads back as v (as a float when is_f32). */
static void nbi_sbuf_shortest(nbi_sbuf *s, double v, bool is_f32) {
    char tmp[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*g", p, v);
        double back = strtod(tmp, NULL);
        if (is_f32 ? (float)back == (float)v : back == v) {
            break;
        }
    }
    if (isnan(v)) {
        snprintf(tmp, sizeof tmp, "nan");
    }
    nbi_sbuf_puts(s, tmp);
}

void nbi_sbuf_describe(nbi_sbuf *s, const nb_tree *t) {
    switch (t->kind) {
    case NB_TREE_KIND_NULL:
        nbi_sbuf_puts(s, "null");
        return;
    case NB_TREE_KIND_ARRAY: {
        const nb_array *a = t->u.array;
        nbi_sbuf_sig(s, a->dtype, a->rank, a->shape);
        return;
    }
    case NB_TREE_KIND_VAR:
        nbi_sbuf_puts(s, "var");
        return;
    case NB_TREE_KIND_INT:
        nbi_sbuf_printf(s, "int %lld", (long long)t->u.i);
        return;
    case NB_TREE_KIND_FLOAT:
        nbi_sbuf_puts(s, "float ");
        nbi_sbuf_shortest(s, t->u.f, false);
        return;
    case NB_TREE_KIND_BOOL:
        nbi_sbuf_puts(s, t->u.b ? "bool true" : "bool false");
        return;
    case NB_TREE_KIND_STRING:
        nbi_sbuf_printf(s, "string \"%s\"", t->u.str);
        return;
    case NB_TREE_KIND_FNREF:
        nbi_sbuf_printf(s, "fn '%s'", t->u.fnref.name);
        return;
    case NB_TREE_KIND_LIST:
    case NB_TREE_KIND_TUPLE:
    case NB_TREE_KIND_DICT:
        nbi_sbuf_printf(s, "%s of %lld", nb_tree_kind_name(t->kind), (long long)t->n);
        return;
    }
}

bool nbi_static_equal(const nb_tree *a, const nb_tree *b) {
    if (a->kind != b->kind) {
        return false;
    }
    switch (a->kind) {
    case NB_TREE_KIND_INT:
        return a->u.i == b->u.i;
    case NB_TREE_KIND_FLOAT:
        return memcmp(&a->u.f, &b->u.f, sizeof a->u.f) == 0;
    case NB_TREE_KIND_BOOL:
        return a->u.b == b->u.b;
    case NB_TREE_KIND_STRING:
        return strcmp(a->u.str, b->u.str) == 0;
    case NB_TREE_KIND_FNREF:
        return a->u.fnref.fn == b->u.fnref.fn && strcmp(a->u.fnref.name, b->u.fnref.name) == 0;
    default:
        return true;
    }
}

/* Do two nodes agree on kind, length and keys? If not, describe how into s. */
static bool nbi_node_shape_equal(const nb_tree *a, const nb_tree *b, nbi_sbuf *s) {
    if (a->kind != b->kind || a->n != b->n) {
        nbi_sbuf_describe(s, a);
        nbi_sbuf_puts(s, " vs ");
        nbi_sbuf_describe(s, b);
        return false;
    }
    if (a->kind == NB_TREE_KIND_DICT) {
        for (int64_t i = 0; i < a->n; i++) {
            if (strcmp(a->keys[i], b->keys[i]) != 0) {
                nbi_sbuf_printf(s, "dict keys differ at position %lld: \"%s\" vs \"%s\"",
                                (long long)i, a->keys[i], b->keys[i]);
                return false;
            }
        }
    }
    return true;
}

static void nbi_path_child(nbi_path *p, const nb_tree *node, int64_t i) {
    if (node->kind == NB_TREE_KIND_DICT) {
        nbi_path_push_key(p, node->keys[i]);
    } else {
        nbi_path_push_index(p, i);
    }
}

/* The path as given to map callbacks: "" for the root. */
static const char *nbi_path_arg(nbi_path *p) {
    return p->len == 0 ? "" : nbi_path_str(p);
}

/* ---- map ---------------------------------------------------------------------------- */

typedef struct nbi_map {
    nb_ctx *ctx;
    const char *fn_name;
    int n;
    nb_tree_map_fn fn;
    void *ud;
    unsigned flags;
    nbi_path path;
} nbi_map;

static nb_status nbi_map_rec(nbi_map *m, const nb_tree *const *nodes, nb_tree **out) {
    nb_ctx *ctx = m->ctx;
    const nb_tree *t0 = nodes[0];
    char how[256];
    if (nbi_tree_kind_is_node(t0->kind)) {
        for (int k = 1; k < m->n; k++) {
            nbi_sbuf hs = nbi_sbuf_make(how, sizeof how);
            if (!nbi_node_shape_equal(t0, nodes[k], &hs)) {
                return nbi_err(ctx, NB_ERR_STRUCTURE,
                               "%s: tree %d does not match tree 0 at %s: %s (tree 0 has the "
                               "structure every tree must share)",
                               m->fn_name, k, nbi_path_str(&m->path), how);
            }
        }
        int64_t n = t0->n;
        size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(nb_tree *);
        nb_tree **items = nbi_alloc(ctx, bytes, 8);
        if (items == NULL) {
            return nbi_oom(ctx, m->fn_name, bytes);
        }
        const nb_tree *kids[NBI_MAP_MAX_TREES];
        nb_status st = NB_OK;
        for (int64_t i = 0; i < n; i++) {
            for (int k = 0; k < m->n; k++) {
                kids[k] = nodes[k]->children[i];
            }
            nbi_path_mark mark = nbi_path_save(&m->path);
            nbi_path_child(&m->path, t0, i);
            items[i] = NULL;
            st = nbi_map_rec(m, kids, &items[i]);
            nbi_path_restore(&m->path, mark);
            if (st != NB_OK) {
                for (int64_t j = 0; j < i; j++) {
                    nb_tree_destroy(items[j]);
                }
                nbi_free(ctx, items, bytes);
                return st;
            }
        }
        st = nbi_tree_node_take(ctx, m->fn_name, t0->kind, n, (const char *const *)t0->keys, items,
                                out);
        nbi_free(ctx, items, bytes);
        if (st == NB_OK) {
            (*out)->flags = t0->flags;
        }
        return st;
    }
    for (int k = 1; k < m->n; k++) {
        if (nbi_tree_kind_is_node(nodes[k]->kind)) {
            nbi_sbuf hs = nbi_sbuf_make(how, sizeof how);
            nbi_sbuf_describe(&hs, t0);
            nbi_sbuf_puts(&hs, " vs ");
            nbi_sbuf_describe(&hs, nodes[k]);
            return nbi_err(ctx, NB_ERR_STRUCTURE,
                           "%s: tree %d does not match tree 0 at %s: %s (a leaf in tree 0 must "
                           "be a leaf in every tree)",
                           m->fn_name, k, nbi_path_str(&m->path), how);
        }
    }
    bool visit = true;
    if (t0->kind == NB_TREE_KIND_NULL && !(m->flags & NB_TREE_MAP_NULLS)) {
        visit = false;
    }
    if (nbi_tree_kind_is_static(t0->kind) && !(m->flags & NB_TREE_MAP_STATIC)) {
        visit = false;
    }
    if (!visit) {
        *out = nb_tree_retain((nb_tree *)t0);
        return NB_OK;
    }
    nb_tree *res = NULL;
    uint64_t seq = nbi_ctx_err_seq(ctx);
    nb_status st = m->fn(m->ud, nbi_path_arg(&m->path), m->n, nodes, &res);
    if (st != NB_OK) {
        nb_tree_destroy(res);
        if (nbi_ctx_err_seq(ctx) == seq) {
            nbi_err(ctx, st, "%s: the callback failed with %s at %s", m->fn_name,
                    nb_status_name(st), nbi_path_str(&m->path));
        }
        return st;
    }
    if (!nbi_tree_live(res) || res->hdr.ctx != ctx) {
        if (nbi_tree_live(res)) {
            nb_tree_destroy(res);
        }
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: the callback returned NB_OK at %s but %s (it must set *out to a "
                       "new tree of the same context)",
                       m->fn_name, nbi_path_str(&m->path),
                       res == NULL ? "no tree" : "a tree of another context or a dead one");
    }
    *out = res;
    return NB_OK;
}

/* one: the caller's argument is one tree, t (not an array of them). */
static nb_status nbi_map_run(const char *fn_name, bool one, int n, const nb_tree *const *trees,
                             nb_tree_map_fn fn, void *ud, unsigned flags, nb_tree **out) {
    if (out != NULL) {
        *out = NULL;
    }
    if (n < 1 || trees == NULL) {
        return NB_ERR_MISUSE; /* no tree: no context to tell */
    }
    /* The context of the first tree that has one (a destroyed tree keeps its own). */
    nb_ctx *ctx = NULL;
    for (int k = 0; k < n && k < NBI_MAP_MAX_TREES && ctx == NULL; k++) {
        ctx = nbi_handle_ctx(trees[k]);
    }
    for (int k = 0; k < n && k < NBI_MAP_MAX_TREES; k++) {
        char arg[32];
        snprintf(arg, sizeof arg, one ? "t" : "trees[%d]", k);
        nb_status st = nbi_check_handle_in(ctx, trees[k], NBI_MAGIC_TREE, fn_name, arg);
        if (st != NB_OK) {
            return st;
        }
    }
    if (out == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_tree * to receive the result)",
                       fn_name);
    }
    if (fn == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: fn is NULL (pass the callback that maps the leaves)", fn_name);
    }
    if (n > NBI_MAP_MAX_TREES) {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: %d trees; at most %d can be mapped at once",
                       fn_name, n, NBI_MAP_MAX_TREES);
    }
    for (int k = 1; k < n; k++) {
        if (trees[k]->hdr.ctx != ctx) {
            return nbi_err(ctx, NB_ERR_INVALID, "%s: tree %d is from another context", fn_name, k);
        }
    }
    nbi_map *m = nbi_alloc(ctx, sizeof(nbi_map), 8);
    if (m == NULL) {
        return nbi_oom(ctx, fn_name, sizeof(nbi_map));
    }
    m->ctx = ctx;
    m->fn_name = fn_name;
    m->n = n;
    m->fn = fn;
    m->ud = ud;
    m->flags = flags;
    nbi_path_init(&m->path);
    nb_status st = nbi_map_rec(m, trees, out);
    nbi_free(ctx, m, sizeof(nbi_map));
    return st;
}

nb_status nb_tree_map(const nb_tree *t, nb_tree_map_fn fn, void *ud, unsigned flags,
                      nb_tree **out) {
    const nb_tree *trees[1] = {t};
    return nbi_map_run("nb_tree_map", true, 1, trees, fn, ud, flags, out);
}

/* (name): the name is also a macro (tree.h, nb_tree_items) */
nb_status(nb_tree_map_n)(int n, nb_tree_items trees, nb_tree_map_fn fn, void *ud, unsigned flags,
                         nb_tree **out) {
    return nbi_map_run("nb_tree_map_n", false, n, NB_TREE_ITEMS_PTR(trees), fn, ud, flags, out);
}

/* ---- filter / partition / combine --------------------------------------------------- */

bool nb_tree_pred_is_array(void *ud, const nb_tree *leaf) {
    (void)ud;
    return nbi_tree_live(leaf) && leaf->kind == NB_TREE_KIND_ARRAY;
}

bool nb_tree_pred_is_inexact_array(void *ud, const nb_tree *leaf) {
    (void)ud;
    return nbi_tree_live(leaf) && leaf->kind == NB_TREE_KIND_ARRAY &&
           nb_dtype_is_float(leaf->u.array->dtype);
}

typedef struct nbi_filter {
    nb_tree_pred pred;
    void *ud;
    bool keep_if; /* keep leaves where pred == keep_if */
} nbi_filter;

static nb_status nbi_filter_cb(void *ud, const char *path, int n, const nb_tree *const *leaves,
                               nb_tree **out) {
    (void)path;
    (void)n;
    nbi_filter *f = ud;
    const nb_tree *leaf = leaves[0];
    if (leaf->kind != NB_TREE_KIND_NULL && f->pred(f->ud, leaf) == f->keep_if) {
        *out = nb_tree_retain((nb_tree *)leaf);
        return NB_OK;
    }
    return nb_tree_null(leaf->hdr.ctx, out);
}

static nb_status nbi_filter_run(const char *fn_name, const nb_tree *t, nb_tree_pred pred, void *ud,
                                bool keep_if, nb_tree **out) {
    if (out != NULL) {
        *out = NULL;
    }
    nb_status st = nbi_check_handle(t, NBI_MAGIC_TREE, fn_name, "t");
    if (st != NB_OK) {
        return st;
    }
    if (pred == NULL) {
        return nbi_err(t->hdr.ctx, NB_ERR_MISUSE,
                       "%s: pred is NULL (pass a predicate such as nb_tree_pred_is_array)",
                       fn_name);
    }
    if (out == NULL) {
        return nbi_err(t->hdr.ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_tree * to receive the result)",
                       fn_name);
    }
    nbi_filter f = {pred, ud, keep_if};
    const nb_tree *trees[1] = {t};
    return nbi_map_run(fn_name, true, 1, trees, nbi_filter_cb, &f,
                       NB_TREE_MAP_NULLS | NB_TREE_MAP_STATIC, out);
}

nb_status nb_tree_filter(const nb_tree *t, nb_tree_pred pred, void *ud, nb_tree **out) {
    return nbi_filter_run("nb_tree_filter", t, pred, ud, true, out);
}

nb_status nb_tree_partition(const nb_tree *t, nb_tree_pred pred, void *ud, nb_tree **match,
                            nb_tree **rest) {
    if (match != NULL) {
        *match = NULL;
    }
    if (rest != NULL) {
        *rest = NULL;
    }
    nb_status cst = nbi_check_handle(t, NBI_MAGIC_TREE, "nb_tree_partition", "t");
    if (cst != NB_OK) {
        return cst;
    }
    if (match == NULL || rest == NULL) {
        return nbi_err(t->hdr.ctx, NB_ERR_MISUSE,
                       "nb_tree_partition: %s is NULL (pass the addresses of two nb_tree * to "
                       "receive the matching leaves and the rest)",
                       match == NULL ? "match" : "rest");
    }
    nb_tree *a = NULL, *b = NULL;
    nb_status st = nbi_filter_run("nb_tree_partition", t, pred, ud, true, &a);
    if (st == NB_OK) {
        st = nbi_filter_run("nb_tree_partition", t, pred, ud, false, &b);
    }
    if (st != NB_OK) {
        nb_tree_destroy(a);
        return st;
    }
    *match = a;
    *rest = b;
    return NB_OK;
}

static nb_status nbi_combine_cb(void *ud, const char *path, int n, const nb_tree *const *leaves,
                                nb_tree **out) {
    (void)ud;
    (void)path;
    for (int k = 0; k < n; k++) {
        if (leaves[k]->kind != NB_TREE_KIND_NULL) {
            *out = nb_tree_retain((nb_tree *)leaves[k]);
            return NB_OK;
        }
    }
    *out = nb_tree_retain((nb_tree *)leaves[0]);
    return NB_OK;
}

nb_status(nb_tree_combine)(int n, nb_tree_items trees, nb_tree **out) {
    return nbi_map_run("nb_tree_combine", false, n, NB_TREE_ITEMS_PTR(trees), nbi_combine_cb, NULL,
                       NB_TREE_MAP_NULLS | NB_TREE_MAP_STATIC, out);
}

/* ---- equality and diff -------------------------------------------------------------- */

static bool nbi_is_dyn(const nb_tree *t) {
    return t->kind == NB_TREE_KIND_ARRAY || t->kind == NB_TREE_KIND_VAR;
}

/* Depth-first search for the first difference; on one, write "<path>: <how>" into s and
 * return true. */
static bool nbi_diff_rec(const nb_tree *a, const nb_tree *b, nb_tree_diff_level level,
                         nbi_path *path, nbi_sbuf *s) {
    char how[512];
    nbi_sbuf hs = nbi_sbuf_make(how, sizeof how);
    bool differ = false;
    bool a_node = nbi_tree_kind_is_node(a->kind), b_node = nbi_tree_kind_is_node(b->kind);
    if (a_node || b_node) {
        if (!a_node || !b_node || !nbi_node_shape_equal(a, b, &hs)) {
            if (hs.len == 0) {
                nbi_sbuf_describe(&hs, a);
                nbi_sbuf_puts(&hs, " vs ");
                nbi_sbuf_describe(&hs, b);
            }
            differ = true;
        } else {
            for (int64_t i = 0; i < a->n; i++) {
                nbi_path_mark mark = nbi_path_save(path);
                nbi_path_child(path, a, i);
                bool d = nbi_diff_rec(a->children[i], b->children[i], level, path, s);
                nbi_path_restore(path, mark);
                if (d) {
                    return true;
                }
            }
            return false;
        }
    } else if (nbi_is_dyn(a) != nbi_is_dyn(b) || (!nbi_is_dyn(a) && a->kind != b->kind) ||
               (nbi_tree_kind_is_static(a->kind) && !nbi_static_equal(a, b)) ||
               a->flags != b->flags) {
        nbi_sbuf_describe(&hs, a);
        nbi_sbuf_puts(&hs, " vs ");
        nbi_sbuf_describe(&hs, b);
        if (a->flags != b->flags) {
            nbi_sbuf_printf(&hs, " (flags %u vs %u)", a->flags, b->flags);
        }
        differ = true;
    } else if (nbi_is_dyn(a) && level >= NB_TREE_DIFF_SIGNATURE) {
        if (a->kind == NB_TREE_KIND_VAR || b->kind == NB_TREE_KIND_VAR) {
            if (level >= NB_TREE_DIFF_VALUES &&
                (a->kind != b->kind || a->u.var.var != b->u.var.var)) {
                nbi_sbuf_puts(&hs, "different symbolic values");
                differ = true;
            }
        } else {
            const nb_array *x = a->u.array, *y = b->u.array;
            bool same_sig = x->dtype == y->dtype && x->rank == y->rank;
            for (int i = 0; same_sig && i < x->rank; i++) {
                same_sig = x->shape[i] == y->shape[i];
            }
            int64_t where = -1;
            if (!same_sig) {
                nbi_sbuf_describe(&hs, a);
                nbi_sbuf_puts(&hs, " vs ");
                nbi_sbuf_describe(&hs, b);
                differ = true;
            } else if (level >= NB_TREE_DIFF_VALUES && !nbi_array_values_equal(x, y, &where)) {
                nbi_sbuf_puts(&hs, "values differ at [");
                int64_t idx[NB_MAX_RANK];
                int64_t r = where;
                for (int k = x->rank - 1; k >= 0; k--) {
                    idx[k] = r % x->shape[k];
                    r /= x->shape[k];
                }
                for (int k = 0; k < x->rank; k++) {
                    nbi_sbuf_printf(&hs, k ? ",%lld" : "%lld", (long long)idx[k]);
                }
                nbi_sbuf_puts(&hs, "]: ");
                bool f32 = x->dtype == NB_DTYPE_F32;
                if (nb_dtype_is_float(x->dtype)) {
                    nbi_sbuf_shortest(&hs, nbi_array_load(x, where), f32);
                    nbi_sbuf_puts(&hs, " vs ");
                    nbi_sbuf_shortest(&hs, nbi_array_load(y, where), f32);
                } else {
                    nbi_sbuf_printf(&hs, "%.17g vs %.17g", nbi_array_load(x, where),
                                    nbi_array_load(y, where));
                }
                differ = true;
            }
        }
    }
    if (differ) {
        nbi_sbuf_puts(s, nbi_path_str(path));
        nbi_sbuf_puts(s, ": ");
        nbi_sbuf_puts(s, how);
    }
    return differ;
}

/* The entry checks of the comparisons: two live trees and a bool out-parameter. */
static nb_status nbi_tree_pair_check(const nb_tree *a, const nb_tree *b, const bool *out,
                                     const char *out_name, const char *fn) {
    nb_ctx *ctx = nbi_handle_ctx(a) != NULL ? nbi_handle_ctx(a) : nbi_handle_ctx(b);
    nb_status st = nbi_check_handle_in(ctx, a, NBI_MAGIC_TREE, fn, "a");
    if (st == NB_OK) {
        st = nbi_check_handle_in(ctx, b, NBI_MAGIC_TREE, fn, "b");
    }
    if (st == NB_OK && out == NULL) {
        st = nbi_err(ctx, NB_ERR_MISUSE,
                     "%s: %s is NULL (pass the address of a bool to receive the answer)", fn,
                     out_name);
    }
    return st;
}

nb_status nb_tree_diff(const nb_tree *a, const nb_tree *b, nb_tree_diff_level level, bool *differ,
                       char *buf, size_t cap, size_t *needed) {
    if (differ != NULL) {
        *differ = false;
    }
    if (needed != NULL) {
        *needed = 0;
    }
    nb_status st = nbi_tree_pair_check(a, b, differ, "differ", "nb_tree_diff");
    if (st != NB_OK) {
        return st;
    }
    if (buf == NULL && cap > 0) {
        return nbi_err(a->hdr.ctx, NB_ERR_MISUSE,
                       "nb_tree_diff: buf is NULL but cap is %zu (pass a buffer of cap bytes, or "
                       "cap 0 for no report)",
                       cap);
    }
    if ((int)level < NB_TREE_DIFF_STRUCTURE || (int)level > NB_TREE_DIFF_VALUES) {
        return nbi_err(a->hdr.ctx, NB_ERR_INVALID, "nb_tree_diff: unknown level %d", (int)level);
    }
    nbi_path *path = nbi_alloc(a->hdr.ctx, sizeof(nbi_path), 8);
    if (path == NULL) {
        return nbi_oom(a->hdr.ctx, "nb_tree_diff", sizeof(nbi_path));
    }
    nbi_path_init(path);
    nbi_sbuf s = nbi_sbuf_make(buf, cap);
    *differ = nbi_diff_rec(a, b, level, path, &s);
    nbi_free(a->hdr.ctx, path, sizeof(nbi_path));
    return nbi_sbuf_finish(&s, needed);
}

static nb_status nbi_equal_at(const nb_tree *a, const nb_tree *b, nb_tree_diff_level level,
                              bool *out, const char *fn) {
    if (out != NULL) {
        *out = false;
    }
    nb_status cst = nbi_tree_pair_check(a, b, out, "out", fn);
    if (cst != NB_OK) {
        return cst;
    }
    bool differ = false;
    nb_status st = nb_tree_diff(a, b, level, &differ, NULL, 0, NULL);
    if (st != NB_OK && st != NB_ERR_TRUNCATED) {
        return st;
    }
    *out = !differ;
    return NB_OK;
}

nb_status nb_tree_structure_equal(const nb_tree *a, const nb_tree *b, bool *out) {
    return nbi_equal_at(a, b, NB_TREE_DIFF_STRUCTURE, out, "nb_tree_structure_equal");
}

nb_status nb_tree_equal(const nb_tree *a, const nb_tree *b, bool *out) {
    return nbi_equal_at(a, b, NB_TREE_DIFF_VALUES, out, "nb_tree_equal");
}

/* ---- printing ----------------------------------------------------------------------- */

static void nbi_format_rec(nbi_sbuf *s, const nb_tree *t, size_t indent) {
    if (!nbi_tree_kind_is_node(t->kind)) {
        nbi_sbuf_describe(s, t);
        return;
    }
    const char *open = t->kind == NB_TREE_KIND_DICT   ? "{"
                       : t->kind == NB_TREE_KIND_LIST ? "["
                                                      : "(";
    const char *close = t->kind == NB_TREE_KIND_DICT   ? "}"
                        : t->kind == NB_TREE_KIND_LIST ? "]"
                                                       : ")";
    nbi_sbuf_printf(s, "%s %s", nb_tree_kind_name(t->kind), open);
    if (t->n == 0) {
        nbi_sbuf_puts(s, close);
        return;
    }
    nbi_sbuf_putc(s, '\n');
    for (int64_t i = 0; i < t->n; i++) {
        nbi_sbuf_spaces(s, indent + 2);
        if (t->kind == NB_TREE_KIND_DICT) {
            nbi_sbuf_key(s, t->keys[i], true);
        } else {
            nbi_sbuf_printf(s, "[%lld]", (long long)i);
        }
        nbi_sbuf_puts(s, ": ");
        nbi_format_rec(s, t->children[i], indent + 2);
        nbi_sbuf_putc(s, '\n');
    }
    nbi_sbuf_spaces(s, indent);
    nbi_sbuf_puts(s, close);
}

nb_status nb_tree_format(const nb_tree *t, char *buf, size_t cap, size_t *needed) {
    if (needed != NULL) {
        *needed = 0;
    }
    nb_status st = nbi_check_handle(t, NBI_MAGIC_TREE, "nb_tree_format", "t");
    if (st != NB_OK) {
        return st;
    }
    if (buf == NULL && cap > 0) {
        return nbi_err(t->hdr.ctx, NB_ERR_MISUSE,
                       "nb_tree_format: buf is NULL but cap is %zu (pass a buffer of cap bytes, "
                       "or cap 0 to measure)",
                       cap);
    }
    nbi_sbuf s = nbi_sbuf_make(buf, cap);
    nbi_format_rec(&s, t, 0);
    return nbi_sbuf_finish(&s, needed);
}

static nb_status nbi_tree_format_obj(const void *obj, char *buf, size_t cap, size_t *needed) {
    return nb_tree_format(obj, buf, cap, needed);
}

nb_status nb_tree_fprint(const nb_tree *t, FILE *f) {
    nb_status st = nbi_check_handle(t, NBI_MAGIC_TREE, "nb_tree_fprint", "t");
    if (st != NB_OK) {
        return st;
    }
    return nbi_fprint_with(t->hdr.ctx, "nb_tree_fprint", nbi_tree_format_obj, t, f);
}

static void nbi_leaves_rec(nbi_sbuf *s, const nb_tree *t, nbi_path *path) {
    if (nbi_is_dyn(t)) {
        nbi_sbuf_puts(s, nbi_path_str(path));
        nbi_sbuf_puts(s, ": ");
        nbi_sbuf_describe(s, t);
        nbi_sbuf_putc(s, '\n');
        return;
    }
    for (int64_t i = 0; i < t->n; i++) {
        nbi_path_mark mark = nbi_path_save(path);
        nbi_path_child(path, t, i);
        nbi_leaves_rec(s, t->children[i], path);
        nbi_path_restore(path, mark);
    }
}

static nb_status nbi_tree_leaves_obj(const void *obj, char *buf, size_t cap, size_t *needed) {
    const nb_tree *t = obj;
    nbi_path *path = nbi_alloc(t->hdr.ctx, sizeof(nbi_path), 8);
    if (path == NULL) {
        return nbi_oom(t->hdr.ctx, "nb_tree_fprint_leaves", sizeof(nbi_path));
    }
    nbi_path_init(path);
    nbi_sbuf s = nbi_sbuf_make(buf, cap);
    nbi_leaves_rec(&s, t, path);
    nbi_free(t->hdr.ctx, path, sizeof(nbi_path));
    /* fprint adds the final newline */
    if (s.len > 0 && s.buf != NULL && s.len < s.cap && s.buf[s.len - 1] == '\n') {
        s.buf[--s.len] = '\0';
    } else if (s.len > 0 && (s.buf == NULL || s.len >= s.cap)) {
        s.len--;
    }
    return nbi_sbuf_finish(&s, needed);
}

nb_status nb_tree_fprint_leaves(const nb_tree *t, FILE *f) {
    nb_status st = nbi_check_handle(t, NBI_MAGIC_TREE, "nb_tree_fprint_leaves", "t");
    if (st != NB_OK) {
        return st;
    }
    if (t->n_leaves == 0) {
        return f ? NB_OK
                 : nbi_err(t->hdr.ctx, NB_ERR_MISUSE,
                           "nb_tree_fprint_leaves: f is NULL (pass an open FILE *, e.g. stdout)");
    }
    return nbi_fprint_with(t->hdr.ctx, "nb_tree_fprint_leaves", nbi_tree_leaves_obj, t, f);
}

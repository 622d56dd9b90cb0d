/*
 * tree.c -- pytree nodes: building, accessors, paths and lookup, flatten/unflatten and
 * treedefs.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static const char *const nbi_kind_names[] = {
    [NB_TREE_KIND_NULL] = "null",     [NB_TREE_KIND_ARRAY] = "array", [NB_TREE_KIND_VAR] = "var",
    [NB_TREE_KIND_INT] = "int",       [NB_TREE_KIND_FLOAT] = "float", [NB_TREE_KIND_BOOL] = "bool",
    [NB_TREE_KIND_STRING] = "string", [NB_TREE_KIND_FNREF] = "fn",    [NB_TREE_KIND_LIST] = "list",
    [NB_TREE_KIND_TUPLE] = "tuple",   [NB_TREE_KIND_DICT] = "dict",
};

const char *nb_tree_kind_name(nb_tree_kind kind) {
    if ((int)kind < 0 || (size_t)kind >= sizeof nbi_kind_names / sizeof nbi_kind_names[0]) {
        return "?";
    }
    return nbi_kind_names[kind];
}

bool nbi_tree_kind_is_node(nb_tree_kind k) {
    return k == NB_TREE_KIND_LIST || k == NB_TREE_KIND_TUPLE || k == NB_TREE_KIND_DICT;
}

bool nbi_tree_kind_is_static(nb_tree_kind k) {
    return k == NB_TREE_KIND_INT || k == NB_TREE_KIND_FLOAT || k == NB_TREE_KIND_BOOL ||
           k == NB_TREE_KIND_STRING || k == NB_TREE_KIND_FNREF;
}

static bool nbi_tree_live(const nb_tree *t) {
    return nbi_obj_live(t, NBI_MAGIC_TREE);
}

/* The entry check of a tree argument (see nbi_check_handle). */
#define NBI_CHECK_TREE(t, fn)                                                                      \
    do {                                                                                           \
        nb_status check_st_ = nbi_check_handle((t), NBI_MAGIC_TREE, (fn), #t);                     \
        if (check_st_ != NB_OK) {                                                                  \
            return check_st_;                                                                      \
        }                                                                                          \
    } while (0)

/* "fn: <arg> is NULL (pass the address of <what> to receive the result)" on ctx. */
static nb_status nbi_tree_null_out(nb_ctx *ctx, const char *fn, const char *arg, const char *what) {
    return nbi_err(ctx, NB_ERR_MISUSE,
                   "%s: %s is NULL (pass the address of %s to receive the result)", fn, arg, what);
}

/* ---- lifecycle ---------------------------------------------------------------------- */

static nb_tree *nbi_tree_new(nb_ctx *ctx, nb_tree_kind kind, const char *fn) {
    nb_tree *t = nbi_obj_new(ctx, NBI_MAGIC_TREE, fn);
    if (t != NULL) {
        t->kind = kind;
        t->serial = nbi_ctx_serial(ctx);
        nbi_count_add(ctx, NBI_COUNT_TREE, 1);
    }
    return t;
}

void nbi_tree_free_owned(nb_tree *t) {
    nb_ctx *ctx = t->hdr.ctx;
    if (t->aux != NULL) {
        nbi_free(ctx, t->aux, t->aux_size);
        t->aux = NULL;
    }
    nbi_count_add(ctx, NBI_COUNT_TREE, -1);
}

nb_tree *nb_tree_retain(nb_tree *t) {
    if (!nbi_tree_live(t)) {
        return NULL;
    }
    t->hdr.refcount++;
    return t;
}

/* Release iteratively through an explicit stack threaded via next_free, so that very deep
 * trees cannot overflow the C stack. */
void nb_tree_destroy(nb_tree *t) {
    if (t == NULL) {
        return;
    }
    if (t->hdr.magic != NBI_MAGIC_TREE) {
        nbi_obj_double_destroy(t, "nb_tree_destroy");
        return;
    }
    if (--t->hdr.refcount > 0) {
        return;
    }
    nbi_obj *stack = &t->hdr;
    t->hdr.next_free = NULL;
    while (stack != NULL) {
        nb_tree *cur = (nb_tree *)stack;
        stack = stack->next_free;
        if (cur->kind == NB_TREE_KIND_ARRAY) {
            nb_array_destroy(cur->u.array);
        }
        for (int64_t i = 0; i < cur->n; i++) {
            nb_tree *c = cur->children[i];
            if (--c->hdr.refcount == 0) {
                c->hdr.next_free = stack;
                stack = &c->hdr;
            }
        }
        nbi_tree_free_owned(cur);
        nbi_obj_release(&cur->hdr);
    }
}

/* ---- building ----------------------------------------------------------------------- */

#define NBI_TREE_OUT(ctx, out, fn)                                                                 \
    do {                                                                                           \
        if ((out) == NULL || (ctx) == NULL) {                                                      \
            if ((out) != NULL) {                                                                   \
                *(out) = NULL;                                                                     \
            }                                                                                      \
            return (ctx) == NULL ? NB_ERR_MISUSE                                                   \
                                 : nbi_tree_null_out((ctx), (fn), "out", "an nb_tree *");          \
        }                                                                                          \
        *(out) = NULL;                                                                             \
    } while (0)

nb_status nb_tree_null(nb_ctx *ctx, nb_tree **out) {
    NBI_TREE_OUT(ctx, out, "nb_tree_null");
    nb_tree *t = nbi_tree_new(ctx, NB_TREE_KIND_NULL, "nb_tree_null");
    if (t == NULL) {
        return NB_ERR_OOM;
    }
    *out = t;
    return NB_OK;
}

nb_status nb_tree_array(nb_array *a, nb_tree **out) {
    if (out != NULL) {
        *out = NULL;
    }
    nb_status st = nbi_check_handle(a, NBI_MAGIC_ARRAY, "nb_tree_array", "a");
    if (st != NB_OK) {
        return st;
    }
    nb_ctx *ctx = a->hdr.ctx;
    NBI_TREE_OUT(ctx, out, "nb_tree_array");
    nb_tree *t = nbi_tree_new(ctx, NB_TREE_KIND_ARRAY, "nb_tree_array");
    if (t == NULL) {
        return NB_ERR_OOM;
    }
    t->u.array = nb_array_retain(a);
    t->n_leaves = 1;
    *out = t;
    return NB_OK;
}

nb_status nbi_tree_var(nb_ctx *ctx, void *var, uint64_t trace_id, nb_tree **out) {
    NBI_TREE_OUT(ctx, out, "nbi_tree_var");
    nb_tree *t = nbi_tree_new(ctx, NB_TREE_KIND_VAR, "nbi_tree_var");
    if (t == NULL) {
        return NB_ERR_OOM;
    }
    t->u.var.var = var;
    t->u.var.trace_id = trace_id;
    t->n_leaves = 1;
    *out = t;
    return NB_OK;
}

nb_status nb_tree_int(nb_ctx *ctx, int64_t value, nb_tree **out) {
    NBI_TREE_OUT(ctx, out, "nb_tree_int");
    nb_tree *t = nbi_tree_new(ctx, NB_TREE_KIND_INT, "nb_tree_int");
    if (t == NULL) {
        return NB_ERR_OOM;
    }
    t->u.i = value;
    *out = t;
    return NB_OK;
}

nb_status nb_tree_float(nb_ctx *ctx, double value, nb_tree **out) {
    NBI_TREE_OUT(ctx, out, "nb_tree_float");
    nb_tree *t = nbi_tree_new(ctx, NB_TREE_KIND_FLOAT, "nb_tree_float");
    if (t == NULL) {
        return NB_ERR_OOM;
    }
    t->u.f = value;
    *out = t;
    return NB_OK;
}

nb_status nb_tree_bool(nb_ctx *ctx, bool value, nb_tree **out) {
    NBI_TREE_OUT(ctx, out, "nb_tree_bool");
    nb_tree *t = nbi_tree_new(ctx, NB_TREE_KIND_BOOL, "nb_tree_bool");
    if (t == NULL) {
        return NB_ERR_OOM;
    }
    t->u.b = value;
    *out = t;
    return NB_OK;
}

/* A leaf whose aux holds a copy of str. */
static nb_status nbi_tree_with_string(nb_ctx *ctx, const char *fn, nb_tree_kind kind,
                                      const char *str, nb_tree **out, char **copy) {
    size_t len = strlen(str) + 1;
    nb_tree *t = nbi_tree_new(ctx, kind, fn);
    if (t == NULL) {
        return NB_ERR_OOM;
    }
    t->aux = nbi_alloc(ctx, len, 8);
    if (t->aux == NULL) {
        nb_tree_destroy(t);
        return nbi_oom(ctx, fn, len);
    }
    t->aux_size = len;
    memcpy(t->aux, str, len);
    *copy = t->aux;
    *out = t;
    return NB_OK;
}

nb_status nb_tree_string(nb_ctx *ctx, const char *value, nb_tree **out) {
    NBI_TREE_OUT(ctx, out, "nb_tree_string");
    if (value == NULL) {
        return nbi_err(
            ctx, NB_ERR_MISUSE,
            "nb_tree_string: value is NULL (pass a NUL-terminated string; it is copied)");
    }
    nb_tree *t = NULL;
    char *copy = NULL;
    nb_status st =
        nbi_tree_with_string(ctx, "nb_tree_string", NB_TREE_KIND_STRING, value, &t, &copy);
    if (st == NB_OK) {
        t->u.str = copy;
        *out = t;
    }
    return st;
}

nb_status nb_tree_fnref(nb_ctx *ctx, nb_fnptr fn, const char *name, nb_tree **out) {
    NBI_TREE_OUT(ctx, out, "nb_tree_fnref");
    if (fn == NULL || name == NULL || name[0] == '\0') {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "nb_tree_fnref: fn must be non-NULL and name non-empty (got fn %s, name "
                       "%s)",
                       fn ? "set" : "NULL", name ? "\"\"" : "NULL");
    }
    nb_tree *t = NULL;
    char *copy = NULL;
    nb_status st = nbi_tree_with_string(ctx, "nb_tree_fnref", NB_TREE_KIND_FNREF, name, &t, &copy);
    if (st == NB_OK) {
        t->u.fnref.fn = fn;
        t->u.fnref.name = copy;
        *out = t;
    }
    return st;
}

/* Consume n references in items (some may be NULL after a failure elsewhere). */
static void nbi_release_items(int64_t n, nb_tree **items) {
    for (int64_t i = 0; i < n; i++) {
        nb_tree_destroy(items[i]);
    }
}

nb_status nbi_tree_node_take(nb_ctx *ctx, const char *fn, nb_tree_kind kind, int64_t n,
                             const char *const *keys, nb_tree **items, nb_tree **out) {
    *out = NULL;
    /* children pointers, then key pointers, then key characters */
    size_t bytes = 0, key_chars = 0;
    if (kind == NB_TREE_KIND_DICT) {
        for (int64_t i = 0; i < n; i++) {
            if (nbi_add_size(key_chars, strlen(keys[i]) + 1, &key_chars)) {
                nbi_release_items(n, items);
                return nbi_err(ctx, NB_ERR_OVERFLOW, "%s: dict keys too long", fn);
            }
        }
    }
    size_t ptrs = kind == NB_TREE_KIND_DICT ? 2 : 1;
    if (nbi_mul_size((size_t)n, ptrs * sizeof(void *), &bytes) ||
        nbi_add_size(bytes, key_chars, &bytes)) {
        nbi_release_items(n, items);
        return nbi_err(ctx, NB_ERR_OVERFLOW, "%s: %lld children is too many", fn, (long long)n);
    }
    int32_t depth = 0;
    for (int64_t i = 0; i < n; i++) {
        if (items[i]->depth > depth) {
            depth = items[i]->depth;
        }
    }
    if (depth + 1 > NB_TREE_MAX_DEPTH) {
        nbi_release_items(n, items);
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: the tree would be %d levels deep; at most %d are allowed", fn,
                       (int)depth + 1, NB_TREE_MAX_DEPTH);
    }
    nb_tree *t = nbi_tree_new(ctx, kind, fn);
    if (t == NULL) {
        nbi_release_items(n, items);
        return NB_ERR_OOM;
    }
    t->depth = depth + 1;
    if (n > 0) {
        t->aux = nbi_alloc(ctx, bytes, 8);
        if (t->aux == NULL) {
            nbi_release_items(n, items);
            nb_tree_destroy(t);
            return nbi_oom(ctx, fn, bytes);
        }
        t->aux_size = bytes;
        t->children = t->aux;
        if (kind == NB_TREE_KIND_DICT) {
            t->keys = (char **)(t->children + n);
            char *chars = (char *)(t->keys + n);
            for (int64_t i = 0; i < n; i++) {
                size_t len = strlen(keys[i]) + 1;
                memcpy(chars, keys[i], len);
                t->keys[i] = chars;
                chars += len;
            }
        }
    }
    t->n = n;
    for (int64_t i = 0; i < n; i++) {
        t->children[i] = items[i];
        t->n_leaves += items[i]->n_leaves;
    }
    *out = t;
    return NB_OK;
}

/* Dict keys must be unique. Up to NBI_KEYS_SORT_MIN keys are compared pairwise; more are
 * sorted (with their positions) and neighbours compared: n log n, so a file with 10^5 keys
 * loads in milliseconds rather than seconds. */
enum { NBI_KEYS_SORT_MIN = 32 };

typedef struct {
    const char *key;
    int64_t pos;
} nbi_key_pos;

static int nbi_key_pos_cmp(const void *a, const void *b) {
    const nbi_key_pos *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c != 0 ? c : (x->pos > y->pos) - (x->pos < y->pos);
}

static nb_status nbi_dup_key(nb_ctx *ctx, const char *fn, const char *key, int64_t j, int64_t i) {
    return nbi_err(ctx, NB_ERR_INVALID,
                   "%s: key \"%s\" appears twice (positions %lld and %lld); dict keys must be "
                   "unique",
                   fn, key, (long long)j, (long long)i);
}

static nb_status nbi_keys_unique_sorted(nb_ctx *ctx, const char *fn, int64_t n,
                                        const char *const *keys) {
    size_t bytes = (size_t)n * sizeof(nbi_key_pos);
    nbi_key_pos *kp = nbi_alloc(ctx, bytes, 8);
    if (kp == NULL) {
        return nbi_oom(ctx, fn, bytes);
    }
    for (int64_t i = 0; i < n; i++) {
        kp[i] = (nbi_key_pos){keys[i], i};
    }
    qsort(kp, (size_t)n, sizeof *kp, nbi_key_pos_cmp);
    /* The duplicate reported is the one whose second occurrence comes first. */
    int64_t best = -1;
    for (int64_t i = 1; i < n; i++) {
        if (strcmp(kp[i - 1].key, kp[i].key) == 0 && (best < 0 || kp[i].pos < kp[best].pos)) {
            best = i;
        }
    }
    nb_status st = NB_OK;
    if (best >= 0) {
        st = nbi_dup_key(ctx, fn, kp[best].key, kp[best - 1].pos, kp[best].pos);
    }
    nbi_free(ctx, kp, bytes);
    return st;
}

static nb_status nbi_tree_node(nb_ctx *ctx, const char *fn, nb_tree_kind kind, int64_t n,
                               const char *const *keys, const nb_tree *const *items,
                               nb_tree **out) {
    if (ctx == NULL && n > 0 && items != NULL) {
        /* the children know their context: say there what is wrong */
        const nb_tree *other = NULL;
        for (int64_t i = 0; i < n && other == NULL; i++) {
            other = nbi_handle_ctx(items[i]) != NULL ? items[i] : NULL;
        }
        if (out != NULL) {
            *out = NULL;
        }
        return nbi_err_null_ctx(other, fn);
    }
    NBI_TREE_OUT(ctx, out, fn);
    if (n < 0) {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: n is %lld; it must be >= 0", fn, (long long)n);
    }
    if (n > 0 && (items == NULL || (kind == NB_TREE_KIND_DICT && keys == NULL))) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: %s is NULL for %lld children (pass n entries, or n 0)", fn,
                       items == NULL ? "items" : "keys", (long long)n);
    }
    for (int64_t i = 0; i < n; i++) {
        if (!nbi_tree_live(items[i])) {
            char arg[48];
            snprintf(arg, sizeof arg, "items[%lld]", (long long)i);
            return nbi_check_handle_in(ctx, items[i], NBI_MAGIC_TREE, fn, arg);
        }
        if (items[i]->hdr.ctx != ctx) {
            return nbi_err(ctx, NB_ERR_INVALID,
                           "%s: child %lld was made in another context; trees cannot mix "
                           "contexts",
                           fn, (long long)i);
        }
        if (kind == NB_TREE_KIND_DICT) {
            if (keys[i] == NULL) {
                return nbi_err(ctx, NB_ERR_INVALID, "%s: key %lld is NULL", fn, (long long)i);
            }
            for (int64_t j = 0; j < i && n <= NBI_KEYS_SORT_MIN; j++) {
                if (strcmp(keys[i], keys[j]) == 0) {
                    return nbi_dup_key(ctx, fn, keys[i], j, i);
                }
            }
        }
    }
    if (kind == NB_TREE_KIND_DICT && n > NBI_KEYS_SORT_MIN) {
        nb_status st = nbi_keys_unique_sorted(ctx, fn, n, keys);
        if (st != NB_OK) {
            return st;
        }
    }
    /* The node takes its own references; on failure they are released again. */
    nb_tree *small[16];
    nb_tree **taken = small;
    size_t tbytes = 0;
    if (n > 16) {
        tbytes = (size_t)n * sizeof(nb_tree *);
        taken = nbi_alloc(ctx, tbytes, 8);
        if (taken == NULL) {
            return nbi_oom(ctx, fn, tbytes);
        }
    }
    for (int64_t i = 0; i < n; i++) {
        taken[i] = nb_tree_retain((nb_tree *)items[i]); /* immutable: only the count changes */
    }
    nb_status st = nbi_tree_node_take(ctx, fn, kind, n, keys, taken, out);
    if (taken != small) {
        nbi_free(ctx, taken, tbytes);
    }
    return st;
}

/* (name): the name is also a macro (tree.h, nb_tree_items) */
nb_status(nb_tree_list)(nb_ctx *ctx, int64_t n, nb_tree_items items, nb_tree **out) {
    return nbi_tree_node(ctx, "nb_tree_list", NB_TREE_KIND_LIST, n, NULL, NB_TREE_ITEMS_PTR(items),
                         out);
}

nb_status(nb_tree_tuple)(nb_ctx *ctx, int64_t n, nb_tree_items items, nb_tree **out) {
    return nbi_tree_node(ctx, "nb_tree_tuple", NB_TREE_KIND_TUPLE, n, NULL,
                         NB_TREE_ITEMS_PTR(items), out);
}

nb_status(nb_tree_dict)(nb_ctx *ctx, int64_t n, const char *const *keys, nb_tree_items items,
                        nb_tree **out) {
    return nbi_tree_node(ctx, "nb_tree_dict", NB_TREE_KIND_DICT, n, keys, NB_TREE_ITEMS_PTR(items),
                         out);
}

nb_status nb_tree_freeze(const nb_tree *leaf, nb_tree **out) {
    if (out != NULL) {
        *out = NULL;
    }
    NBI_CHECK_TREE(leaf, "nb_tree_freeze");
    nb_ctx *ctx = leaf->hdr.ctx;
    if (out == NULL) {
        return nbi_tree_null_out(ctx, "nb_tree_freeze", "out", "an nb_tree *");
    }
    if (nbi_tree_kind_is_node(leaf->kind)) {
        return nbi_err(ctx, NB_ERR_KIND,
                       "nb_tree_freeze: the tree is a %s; freeze its leaves (nb_tree_map) or "
                       "leave them out with a filter spec",
                       nb_tree_kind_name(leaf->kind));
    }
    nb_tree *t = NULL;
    nb_status st;
    switch (leaf->kind) {
    case NB_TREE_KIND_ARRAY:
        st = nb_tree_array(leaf->u.array, &t);
        break;
    case NB_TREE_KIND_VAR:
        st = nbi_tree_var(ctx, leaf->u.var.var, leaf->u.var.trace_id, &t);
        break;
    case NB_TREE_KIND_INT:
        st = nb_tree_int(ctx, leaf->u.i, &t);
        break;
    case NB_TREE_KIND_FLOAT:
        st = nb_tree_float(ctx, leaf->u.f, &t);
        break;
    case NB_TREE_KIND_BOOL:
        st = nb_tree_bool(ctx, leaf->u.b, &t);
        break;
    case NB_TREE_KIND_STRING:
        st = nb_tree_string(ctx, leaf->u.str, &t);
        break;
    case NB_TREE_KIND_FNREF:
        st = nb_tree_fnref(ctx, leaf->u.fnref.fn, leaf->u.fnref.name, &t);
        break;
    default:
        st = nb_tree_null(ctx, &t);
        break;
    }
    if (st != NB_OK) {
        return st;
    }
    t->flags = leaf->flags | NBI_TREE_FLAG_FROZEN;
    *out = t;
    return NB_OK;
}

bool nb_tree_is_frozen(const nb_tree *t) {
    return nbi_tree_live(t) && (t->flags & NBI_TREE_FLAG_FROZEN);
}

/* ---- accessors ---------------------------------------------------------------------- */

nb_status nb_tree_check(const nb_tree *t) {
    return nbi_check_handle(t, NBI_MAGIC_TREE, "nb_tree_check", "t");
}

nb_ctx *nb_tree_ctx(const nb_tree *t) {
    return nbi_tree_live(t) ? t->hdr.ctx : NULL;
}

nb_tree_kind nb_tree_kind_of(const nb_tree *t) {
    return nbi_tree_live(t) ? t->kind : NB_TREE_KIND_NULL;
}

bool nb_tree_is_leaf(const nb_tree *t) {
    return nbi_tree_live(t) && !nbi_tree_kind_is_node(t->kind);
}

bool nb_tree_is_static(const nb_tree *t) {
    return nbi_tree_live(t) && nbi_tree_kind_is_static(t->kind);
}

bool nb_tree_is_dynamic(const nb_tree *t) {
    return nbi_tree_live(t) && (t->kind == NB_TREE_KIND_ARRAY || t->kind == NB_TREE_KIND_VAR);
}

int64_t nb_tree_len(const nb_tree *t) {
    return nbi_tree_live(t) ? t->n : -1;
}

const nb_tree *nb_tree_child(const nb_tree *t, int64_t i) {
    if (!nbi_tree_live(t) || i < 0 || i >= t->n) {
        return NULL;
    }
    return t->children[i];
}

const char *nb_tree_key(const nb_tree *t, int64_t i) {
    if (!nbi_tree_live(t) || t->kind != NB_TREE_KIND_DICT || i < 0 || i >= t->n) {
        return NULL;
    }
    return t->keys[i];
}

const nb_tree *nb_tree_get(const nb_tree *t, const char *key) {
    if (!nbi_tree_live(t) || t->kind != NB_TREE_KIND_DICT || key == NULL) {
        return NULL;
    }
    for (int64_t i = 0; i < t->n; i++) {
        if (strcmp(t->keys[i], key) == 0) {
            return t->children[i];
        }
    }
    return NULL;
}

nb_array *nb_tree_get_array(const nb_tree *t) {
    if (!nbi_tree_live(t) || t->kind != NB_TREE_KIND_ARRAY) {
        return NULL;
    }
    return t->u.array;
}

static nb_status nbi_kind_check(const nb_tree *t, const void *out, const char *out_name,
                                nb_tree_kind want, const char *fn) {
    NBI_CHECK_TREE(t, fn);
    if (out == NULL) {
        return nbi_err(t->hdr.ctx, NB_ERR_MISUSE,
                       "%s: %s is NULL (pass the address of a variable to receive the %s)", fn,
                       out_name, nb_tree_kind_name(want));
    }
    if (t->kind != want) {
        return nbi_err(t->hdr.ctx, NB_ERR_KIND, "%s: the node is %s, not %s", fn,
                       nb_tree_kind_name(t->kind), nb_tree_kind_name(want));
    }
    return NB_OK;
}

nb_status nb_tree_get_int(const nb_tree *t, int64_t *out) {
    if (out != NULL) {
        *out = 0;
    }
    nb_status st = nbi_kind_check(t, out, "out", NB_TREE_KIND_INT, "nb_tree_get_int");
    if (st == NB_OK) {
        *out = t->u.i;
    }
    return st;
}

nb_status nb_tree_get_float(const nb_tree *t, double *out) {
    if (out != NULL) {
        *out = 0;
    }
    nb_status st = nbi_kind_check(t, out, "out", NB_TREE_KIND_FLOAT, "nb_tree_get_float");
    if (st == NB_OK) {
        *out = t->u.f;
    }
    return st;
}

nb_status nb_tree_get_bool(const nb_tree *t, bool *out) {
    if (out != NULL) {
        *out = false;
    }
    nb_status st = nbi_kind_check(t, out, "out", NB_TREE_KIND_BOOL, "nb_tree_get_bool");
    if (st == NB_OK) {
        *out = t->u.b;
    }
    return st;
}

nb_status nb_tree_get_string(const nb_tree *t, const char **out) {
    if (out != NULL) {
        *out = NULL;
    }
    nb_status st = nbi_kind_check(t, out, "out", NB_TREE_KIND_STRING, "nb_tree_get_string");
    if (st == NB_OK) {
        *out = t->u.str;
    }
    return st;
}

nb_status nb_tree_get_fnref(const nb_tree *t, nb_fnptr *fn, const char **name) {
    if (fn != NULL) {
        *fn = NULL;
    }
    if (name != NULL) {
        *name = NULL;
    }
    nb_status st = nbi_kind_check(t, fn, "fn", NB_TREE_KIND_FNREF, "nb_tree_get_fnref");
    if (st == NB_OK) {
        *fn = t->u.fnref.fn;
        if (name != NULL) {
            *name = t->u.fnref.name;
        }
    }
    return st;
}

/* ---- paths -------------------------------------------------------------------------- */

int64_t nb_tree_num_leaves(const nb_tree *t) {
    return nbi_tree_live(t) ? t->n_leaves : -1;
}

static void nbi_path_step(nbi_sbuf *s, const nb_tree *node, int64_t i) {
    if (node->kind == NB_TREE_KIND_DICT) {
        nbi_sbuf_key(s, node->keys[i], s->len == 0);
    } else {
        nbi_sbuf_printf(s, "[%lld]", (long long)i);
    }
}

nb_status nb_tree_leaf_path(const nb_tree *t, int64_t i, char *buf, size_t cap, size_t *needed) {
    if (needed != NULL) {
        *needed = 0;
    }
    NBI_CHECK_TREE(t, "nb_tree_leaf_path");
    if (buf == NULL && cap > 0) {
        return nbi_err(t->hdr.ctx, NB_ERR_MISUSE,
                       "nb_tree_leaf_path: buf is NULL but cap is %zu (pass a buffer of cap "
                       "bytes, or cap 0 to measure)",
                       cap);
    }
    if (i < 0 || i >= t->n_leaves) {
        return nbi_err(t->hdr.ctx, NB_ERR_INDEX,
                       "nb_tree_leaf_path: leaf %lld is out of range (the tree has %lld dynamic "
                       "leaves)",
                       (long long)i, (long long)t->n_leaves);
    }
    nbi_sbuf s = nbi_sbuf_make(buf, cap);
    const nb_tree *cur = t;
    /* Descend using the cached leaf counts: no recursion, no allocation. */
    while (nbi_tree_kind_is_node(cur->kind)) {
        int64_t k = 0;
        while (i >= cur->children[k]->n_leaves) {
            i -= cur->children[k]->n_leaves;
            k++;
        }
        nbi_path_step(&s, cur, k);
        cur = cur->children[k];
    }
    return nbi_sbuf_finish(&s, needed);
}

/* Does the path text span[0..len) name key? Quoted spans unescape \" and \\. */
static bool nbi_key_matches(const char *key, const char *span, size_t len, bool quoted) {
    size_t i = 0;
    for (; i < len; i++, key++) {
        if (quoted && span[i] == '\\' && i + 1 < len) {
            i++;
        }
        if (*key == '\0' || *key != span[i]) {
            return false;
        }
    }
    return *key == '\0';
}

static const nb_tree *nbi_dict_find(const nb_tree *t, const char *span, size_t len, bool quoted) {
    for (int64_t i = 0; i < t->n; i++) {
        if (nbi_key_matches(t->keys[i], span, len, quoted)) {
            return t->children[i];
        }
    }
    return NULL;
}

nb_status nb_tree_lookup(const nb_tree *t, const char *path, const nb_tree **out) {
    static const char fn[] = "nb_tree_lookup";
    if (out != NULL) {
        *out = NULL;
    }
    NBI_CHECK_TREE(t, fn);
    nb_ctx *ctx = t->hdr.ctx;
    if (path == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: path is NULL (pass a path such as \"layers[0].w\", or \"\" for the "
                       "root)",
                       fn);
    }
    if (out == NULL) {
        return nbi_tree_null_out(ctx, fn, "out", "a const nb_tree *");
    }
    const nb_tree *cur = t;
    const char *p = path;
    size_t done = 0; /* length of the prefix that resolved */
    while (*p) {
        const char *step = p, *span = NULL;
        size_t span_len = 0;
        bool is_index = false, quoted = false;
        int64_t index = 0;
        if (*p == '.' || (p == path && *p != '[')) {
            if (*p == '.') {
                p++;
            }
            span = p;
            while (*p && *p != '.' && *p != '[') {
                if (*p == ']' || *p == '"') {
                    return nbi_err(ctx, NB_ERR_INVALID,
                                   "%s: unexpected '%c' at offset %zu of path \"%s\" (keys "
                                   "that are not identifiers are written [\"key\"])",
                                   fn, *p, (size_t)(p - path), path);
                }
                p++;
            }
            span_len = (size_t)(p - span);
            if (span_len == 0) {
                return nbi_err(ctx, NB_ERR_INVALID, "%s: empty key at offset %zu of path \"%s\"",
                               fn, (size_t)(step - path), path);
            }
        } else if (*p == '[' && p[1] == '"') {
            p += 2;
            span = p;
            quoted = true;
            while (*p && *p != '"') {
                p += (*p == '\\' && p[1]) ? 2 : 1;
            }
            span_len = (size_t)(p - span);
            if (p[0] != '"' || p[1] != ']') {
                return nbi_err(ctx, NB_ERR_INVALID,
                               "%s: unterminated [\"key\"] at offset %zu of path \"%s\"", fn,
                               (size_t)(step - path), path);
            }
            p += 2;
        } else if (*p == '[') {
            p++;
            if (*p < '0' || *p > '9') {
                return nbi_err(ctx, NB_ERR_INVALID,
                               "%s: expected a non-negative index at offset %zu of path \"%s\"", fn,
                               (size_t)(p - path), path);
            }
            while (*p >= '0' && *p <= '9') {
                if (index > (INT64_MAX - 9) / 10) {
                    return nbi_err(ctx, NB_ERR_INVALID, "%s: index too large in path \"%s\"", fn,
                                   path);
                }
                index = index * 10 + (*p++ - '0');
            }
            if (*p != ']') {
                return nbi_err(ctx, NB_ERR_INVALID, "%s: expected ']' at offset %zu of path \"%s\"",
                               fn, (size_t)(p - path), path);
            }
            p++;
            is_index = true;
        } else {
            return nbi_err(ctx, NB_ERR_INVALID, "%s: unexpected '%c' at offset %zu of path \"%s\"",
                           fn, *p, (size_t)(p - path), path);
        }
        const nb_tree *next = NULL;
        if (is_index) {
            if ((cur->kind == NB_TREE_KIND_LIST || cur->kind == NB_TREE_KIND_TUPLE) &&
                index < cur->n) {
                next = cur->children[index];
            }
        } else if (cur->kind == NB_TREE_KIND_DICT) {
            next = nbi_dict_find(cur, span, span_len, quoted);
        }
        if (next == NULL) {
            char what[128];
            nbi_sbuf ws = nbi_sbuf_make(what, sizeof what);
            nbi_sbuf_describe(&ws, cur);
            return nbi_err(ctx, NB_ERR_NOT_FOUND,
                           "%s: \"%s\" not found: \"%.*s\" is %s, which has no %.*s", fn, path,
                           (int)(done ? done : 6), done ? path : "<root>", what, (int)(p - step),
                           step);
        }
        cur = next;
        done = (size_t)(p - path);
    }
    *out = cur;
    return NB_OK;
}

/* ---- treedefs ----------------------------------------------------------------------- */

static void nbi_tree_count(const nb_tree *t, int64_t *nodes, size_t *chars) {
    (*nodes)++;
    if (t->kind == NB_TREE_KIND_STRING) {
        *chars += strlen(t->u.str) + 1;
    } else if (t->kind == NB_TREE_KIND_FNREF) {
        *chars += strlen(t->u.fnref.name) + 1;
    }
    for (int64_t i = 0; i < t->n; i++) {
        if (t->kind == NB_TREE_KIND_DICT) {
            *chars += strlen(t->keys[i]) + 1;
        }
        nbi_tree_count(t->children[i], nodes, chars);
    }
}

typedef struct nbi_td_builder {
    nbi_tdnode *nodes;
    int64_t next;
    char *chars;
} nbi_td_builder;

static const char *nbi_td_str(nbi_td_builder *b, const char *s) {
    size_t len = strlen(s) + 1;
    char *dst = b->chars;
    memcpy(dst, s, len);
    b->chars += len;
    return dst;
}

static void nbi_td_fill(nbi_td_builder *b, const nb_tree *t, const char *key) {
    nbi_tdnode *nd = &b->nodes[b->next++];
    nd->kind = t->kind == NB_TREE_KIND_VAR ? NB_TREE_KIND_ARRAY : t->kind;
    nd->flags = t->flags;
    nd->n = t->n;
    nd->key = key ? nbi_td_str(b, key) : NULL;
    switch (t->kind) {
    case NB_TREE_KIND_INT:
        nd->u.i = t->u.i;
        break;
    case NB_TREE_KIND_FLOAT:
        nd->u.f = t->u.f;
        break;
    case NB_TREE_KIND_BOOL:
        nd->u.b = t->u.b;
        break;
    case NB_TREE_KIND_STRING:
        nd->u.str = nbi_td_str(b, t->u.str);
        break;
    case NB_TREE_KIND_FNREF:
        nd->u.fnref.fn = t->u.fnref.fn;
        nd->u.fnref.name = nbi_td_str(b, t->u.fnref.name);
        break;
    default:
        break;
    }
    for (int64_t i = 0; i < t->n; i++) {
        nbi_td_fill(b, t->children[i], t->kind == NB_TREE_KIND_DICT ? t->keys[i] : NULL);
    }
}

/* FNV-1a over the bytes of v, continuing from h. */
static uint64_t nbi_hash_bytes(uint64_t h, const void *v, size_t n) {
    const unsigned char *p = v;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t nbi_hash_str(uint64_t h, const char *s) {
    return nbi_hash_bytes(h, s, strlen(s) + 1);
}

static uint64_t nbi_td_hash(const nb_treedef *d) {
    uint64_t h = 14695981039346656037ull;
    for (int64_t i = 0; i < d->n_nodes; i++) {
        const nbi_tdnode *nd = &d->nodes[i];
        int32_t kind = (int32_t)nd->kind;
        h = nbi_hash_bytes(h, &kind, sizeof kind);
        h = nbi_hash_bytes(h, &nd->flags, sizeof nd->flags);
        h = nbi_hash_bytes(h, &nd->n, sizeof nd->n);
        if (nd->key != NULL) {
            h = nbi_hash_str(h, nd->key);
        }
        switch (nd->kind) {
        case NB_TREE_KIND_INT:
            h = nbi_hash_bytes(h, &nd->u.i, sizeof nd->u.i);
            break;
        case NB_TREE_KIND_FLOAT:
            h = nbi_hash_bytes(h, &nd->u.f, sizeof nd->u.f);
            break;
        case NB_TREE_KIND_BOOL: {
            uint8_t b = nd->u.b;
            h = nbi_hash_bytes(h, &b, 1);
            break;
        }
        case NB_TREE_KIND_STRING:
            h = nbi_hash_str(h, nd->u.str);
            break;
        case NB_TREE_KIND_FNREF:
            h = nbi_hash_bytes(h, &nd->u.fnref.fn, sizeof nd->u.fnref.fn);
            h = nbi_hash_str(h, nd->u.fnref.name);
            break;
        default:
            break;
        }
    }
    return h;
}

/* The same sequence of bytes nbi_td_hash feeds, straight from the tree. */
/* The hash of a subtree's definition: its node's kind, flags, arity and static value, then
 * each child's key and definition hash. Children's hashes are memoised in the children, so
 * hashing the same arguments' structure again costs one lookup per call. */
static uint64_t nbi_tree_hash_node(const nb_tree *t) {
    uint64_t h = 14695981039346656037ull;
    int32_t kind = (int32_t)(t->kind == NB_TREE_KIND_VAR ? NB_TREE_KIND_ARRAY : t->kind);
    h = nbi_hash_bytes(h, &kind, sizeof kind);
    h = nbi_hash_bytes(h, &t->flags, sizeof t->flags);
    h = nbi_hash_bytes(h, &t->n, sizeof t->n);
    switch (t->kind) {
    case NB_TREE_KIND_INT:
        h = nbi_hash_bytes(h, &t->u.i, sizeof t->u.i);
        break;
    case NB_TREE_KIND_FLOAT:
        h = nbi_hash_bytes(h, &t->u.f, sizeof t->u.f);
        break;
    case NB_TREE_KIND_BOOL: {
        uint8_t b = t->u.b;
        h = nbi_hash_bytes(h, &b, 1);
        break;
    }
    case NB_TREE_KIND_STRING:
        h = nbi_hash_str(h, t->u.str);
        break;
    case NB_TREE_KIND_FNREF:
        h = nbi_hash_bytes(h, &t->u.fnref.fn, sizeof t->u.fnref.fn);
        h = nbi_hash_str(h, t->u.fnref.name);
        break;
    default:
        break;
    }
    for (int64_t i = 0; i < t->n; i++) {
        if (t->kind == NB_TREE_KIND_DICT) {
            h = nbi_hash_str(h, t->keys[i]);
        }
        uint64_t c = nbi_tree_def_hash(t->children[i]);
        h = nbi_hash_bytes(h, &c, sizeof c);
    }
    return h;
}

uint64_t nbi_tree_def_hash(const nb_tree *t) {
    if (!t->def_hash_ok) {
        nb_tree *m = (nb_tree *)t; /* a cache of an immutable value, not a change to it */
        m->def_hash = nbi_tree_hash_node(t);
        m->def_hash_ok = true;
    }
    return t->def_hash;
}

static bool nbi_tree_match_rec(const nb_tree *t, const char *key, const nb_treedef *d, int64_t *i) {
    if (*i >= d->n_nodes) {
        return false;
    }
    const nbi_tdnode *nd = &d->nodes[(*i)++];
    nb_tree_kind kind = t->kind == NB_TREE_KIND_VAR ? NB_TREE_KIND_ARRAY : t->kind;
    if (nd->kind != kind || nd->flags != t->flags || nd->n != t->n) {
        return false;
    }
    if ((key == NULL) != (nd->key == NULL) || (key != NULL && strcmp(key, nd->key) != 0)) {
        return false;
    }
    switch (kind) {
    case NB_TREE_KIND_INT:
        if (nd->u.i != t->u.i) {
            return false;
        }
        break;
    case NB_TREE_KIND_FLOAT:
        if (memcmp(&nd->u.f, &t->u.f, sizeof t->u.f) != 0) {
            return false;
        }
        break;
    case NB_TREE_KIND_BOOL:
        if (nd->u.b != t->u.b) {
            return false;
        }
        break;
    case NB_TREE_KIND_STRING:
        if (strcmp(nd->u.str, t->u.str) != 0) {
            return false;
        }
        break;
    case NB_TREE_KIND_FNREF:
        if (nd->u.fnref.fn != t->u.fnref.fn || strcmp(nd->u.fnref.name, t->u.fnref.name) != 0) {
            return false;
        }
        break;
    default:
        break;
    }
    for (int64_t c = 0; c < t->n; c++) {
        if (!nbi_tree_match_rec(t->children[c], t->kind == NB_TREE_KIND_DICT ? t->keys[c] : NULL, d,
                                i)) {
            return false;
        }
    }
    return true;
}

bool nbi_tree_def_match(const nb_tree *t, const nb_treedef *d) {
    int64_t i = 0;
    return nbi_tree_match_rec(t, NULL, d, &i) && i == d->n_nodes;
}

void nbi_treedef_free_owned(nb_treedef *d) {
    nb_ctx *ctx = d->hdr.ctx;
    if (d->aux != NULL) {
        nbi_free(ctx, d->aux, d->aux_size);
        d->aux = NULL;
    }
    nbi_count_add(ctx, NBI_COUNT_TREEDEF, -1);
}

static nb_status nbi_treedef_build(const nb_tree *t, const char *fn, nb_treedef **out) {
    nb_ctx *ctx = t->hdr.ctx;
    int64_t n_nodes = 0;
    size_t chars = 0;
    nbi_tree_count(t, &n_nodes, &chars);
    size_t bytes = 0;
    if (nbi_mul_size((size_t)n_nodes, sizeof(nbi_tdnode), &bytes) ||
        nbi_add_size(bytes, chars, &bytes)) {
        return nbi_err(ctx, NB_ERR_OVERFLOW, "%s: tree too large", fn);
    }
    nb_treedef *d = nbi_obj_new(ctx, NBI_MAGIC_TREEDEF, fn);
    if (d == NULL) {
        return NB_ERR_OOM;
    }
    nbi_count_add(ctx, NBI_COUNT_TREEDEF, 1);
    d->aux = nbi_alloc(ctx, bytes, 16);
    if (d->aux == NULL) {
        nbi_treedef_free_owned(d);
        nbi_obj_release(&d->hdr);
        return nbi_oom(ctx, fn, bytes);
    }
    d->aux_size = bytes;
    d->nodes = d->aux;
    d->n_nodes = n_nodes;
    d->n_leaves = t->n_leaves;
    nbi_td_builder b = {d->nodes, 0, (char *)(d->nodes + n_nodes)};
    nbi_td_fill(&b, t, NULL);
    d->hash = nbi_td_hash(d);
    *out = d;
    return NB_OK;
}

nb_status nb_tree_treedef(const nb_tree *t, nb_treedef **out) {
    if (out != NULL) {
        *out = NULL;
    }
    NBI_CHECK_TREE(t, "nb_tree_treedef");
    if (out == NULL) {
        return nbi_tree_null_out(t->hdr.ctx, "nb_tree_treedef", "out", "an nb_treedef *");
    }
    return nbi_treedef_build(t, "nb_tree_treedef", out);
}

nb_treedef *nb_treedef_retain(nb_treedef *def) {
    if (!nbi_obj_live(def, NBI_MAGIC_TREEDEF)) {
        return NULL;
    }
    def->hdr.refcount++;
    return def;
}

void nb_treedef_destroy(nb_treedef *def) {
    if (def == NULL) {
        return;
    }
    if (def->hdr.magic != NBI_MAGIC_TREEDEF) {
        nbi_obj_double_destroy(def, "nb_treedef_destroy");
        return;
    }
    if (--def->hdr.refcount > 0) {
        return;
    }
    nbi_treedef_free_owned(def);
    nbi_obj_release(&def->hdr);
}

int64_t nb_treedef_num_leaves(const nb_treedef *def) {
    return nbi_obj_live(def, NBI_MAGIC_TREEDEF) ? def->n_leaves : -1;
}

uint64_t nb_treedef_hash(const nb_treedef *def) {
    return nbi_obj_live(def, NBI_MAGIC_TREEDEF) ? def->hash : 0;
}

static bool nbi_streq(const char *a, const char *b) {
    if (a == NULL || b == NULL) {
        return a == b;
    }
    return strcmp(a, b) == 0;
}

static bool nbi_tdnode_equal(const nbi_tdnode *a, const nbi_tdnode *b) {
    if (a->kind != b->kind || a->flags != b->flags || a->n != b->n || !nbi_streq(a->key, b->key)) {
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

static int64_t nbi_td_extent(const nb_treedef *d, int64_t i, int32_t *leaf, int32_t *size,
                             int32_t *first_leaf, int32_t *n_leaves) {
    int64_t start = i;
    int32_t leaf0 = *leaf;
    const nbi_tdnode *nd = &d->nodes[i++];
    if (nd->kind == NB_TREE_KIND_ARRAY || nd->kind == NB_TREE_KIND_VAR) {
        (*leaf)++;
    }
    for (int64_t c = 0; c < nd->n; c++) {
        i = nbi_td_extent(d, i, leaf, size, first_leaf, n_leaves);
    }
    size[start] = (int32_t)(i - start);
    first_leaf[start] = leaf0;
    n_leaves[start] = *leaf - leaf0;
    return i;
}

void nbi_treedef_extents(const nb_treedef *d, int32_t *size, int32_t *first_leaf,
                         int32_t *n_leaves) {
    int32_t leaf = 0;
    nbi_td_extent(d, 0, &leaf, size, first_leaf, n_leaves);
}

/* The index of the node after the subtree at node i. */
static int64_t nbi_td_skip(const nb_treedef *d, int64_t i) {
    int64_t n = d->nodes[i++].n;
    for (int64_t c = 0; c < n; c++) {
        i = nbi_td_skip(d, i);
    }
    return i;
}

bool nbi_treedef_sub_equal(const nb_treedef *a, int64_t ia, const nb_treedef *b, int64_t ib) {
    int64_t ea = nbi_td_skip(a, ia), eb = nbi_td_skip(b, ib);
    if (ea - ia != eb - ib) {
        return false;
    }
    nbi_tdnode ra = a->nodes[ia], rb = b->nodes[ib];
    ra.key = rb.key = NULL; /* where the roots sit is their parents' business */
    if (!nbi_tdnode_equal(&ra, &rb)) {
        return false;
    }
    for (int64_t k = 1; k < ea - ia; k++) {
        if (!nbi_tdnode_equal(&a->nodes[ia + k], &b->nodes[ib + k])) {
            return false;
        }
    }
    return true;
}

bool nb_treedef_equal(const nb_treedef *a, const nb_treedef *b) {
    if (!nbi_obj_live(a, NBI_MAGIC_TREEDEF) || !nbi_obj_live(b, NBI_MAGIC_TREEDEF)) {
        return false;
    }
    if (a == b) {
        return true;
    }
    if (a->hash != b->hash || a->n_nodes != b->n_nodes || a->n_leaves != b->n_leaves) {
        return false;
    }
    for (int64_t i = 0; i < a->n_nodes; i++) {
        if (!nbi_tdnode_equal(&a->nodes[i], &b->nodes[i])) {
            return false;
        }
    }
    return true;
}

static int64_t nbi_td_format(nbi_sbuf *s, const nb_treedef *d, int64_t i) {
    const nbi_tdnode *nd = &d->nodes[i++];
    switch (nd->kind) {
    case NB_TREE_KIND_NULL:
        nbi_sbuf_puts(s, "null");
        return i;
    case NB_TREE_KIND_ARRAY:
    case NB_TREE_KIND_VAR:
        nbi_sbuf_puts(s, "*");
        return i;
    case NB_TREE_KIND_INT:
        nbi_sbuf_printf(s, "int %lld", (long long)nd->u.i);
        return i;
    case NB_TREE_KIND_FLOAT:
        nbi_sbuf_printf(s, "float %.17g", nd->u.f);
        return i;
    case NB_TREE_KIND_BOOL:
        nbi_sbuf_printf(s, "bool %s", nd->u.b ? "true" : "false");
        return i;
    case NB_TREE_KIND_STRING:
        nbi_sbuf_printf(s, "string \"%s\"", nd->u.str);
        return i;
    case NB_TREE_KIND_FNREF:
        nbi_sbuf_printf(s, "fn %s", nd->u.fnref.name);
        return i;
    case NB_TREE_KIND_LIST:
    case NB_TREE_KIND_TUPLE:
    case NB_TREE_KIND_DICT:
        break;
    }
    nbi_sbuf_puts(s, nb_tree_kind_name(nd->kind));
    nbi_sbuf_putc(s, '(');
    for (int64_t c = 0; c < nd->n; c++) {
        if (c > 0) {
            nbi_sbuf_puts(s, ", ");
        }
        if (nd->kind == NB_TREE_KIND_DICT) {
            nbi_sbuf_printf(s, "%s=", d->nodes[i].key);
        }
        i = nbi_td_format(s, d, i);
    }
    nbi_sbuf_putc(s, ')');
    return i;
}

nb_status nb_treedef_format(const nb_treedef *def, char *buf, size_t cap, size_t *needed) {
    if (needed != NULL) {
        *needed = 0;
    }
    nb_status st = nbi_check_handle(def, NBI_MAGIC_TREEDEF, "nb_treedef_format", "def");
    if (st != NB_OK) {
        return st;
    }
    if (buf == NULL && cap > 0) {
        return nbi_err(def->hdr.ctx, NB_ERR_MISUSE,
                       "nb_treedef_format: buf is NULL but cap is %zu (pass a buffer of cap "
                       "bytes, or cap 0 to measure)",
                       cap);
    }
    nbi_sbuf s = nbi_sbuf_make(buf, cap);
    nbi_td_format(&s, def, 0);
    return nbi_sbuf_finish(&s, needed);
}

/* ---- flatten / unflatten ------------------------------------------------------------ */

static void nbi_collect_leaves(const nb_tree *t, nb_tree **out, int64_t *k) {
    if (t->kind == NB_TREE_KIND_ARRAY || t->kind == NB_TREE_KIND_VAR) {
        out[(*k)++] = (nb_tree *)t;
        return;
    }
    for (int64_t i = 0; i < t->n; i++) {
        nbi_collect_leaves(t->children[i], out, k);
    }
}

nb_status nb_tree_flatten(const nb_tree *t, nb_tree **leaves, nb_treedef **def) {
    static const char fn[] = "nb_tree_flatten";
    if (leaves != NULL) {
        *leaves = NULL;
    }
    if (def != NULL) {
        *def = NULL;
    }
    NBI_CHECK_TREE(t, fn);
    nb_ctx *ctx = t->hdr.ctx;
    nb_treedef *d = NULL;
    if (def != NULL) {
        nb_status st = nbi_treedef_build(t, fn, &d);
        if (st != NB_OK) {
            return st;
        }
    }
    if (leaves != NULL) {
        int64_t n = t->n_leaves;
        size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(nb_tree *);
        nb_tree **items = nbi_alloc(ctx, bytes, 8);
        if (items == NULL) {
            nb_treedef_destroy(d);
            return nbi_oom(ctx, fn, bytes);
        }
        int64_t k = 0;
        nbi_collect_leaves(t, items, &k);
        for (int64_t i = 0; i < n; i++) {
            nb_tree_retain(items[i]);
        }
        nb_status st = nbi_tree_node_take(ctx, fn, NB_TREE_KIND_LIST, n, NULL, items, leaves);
        nbi_free(ctx, items, bytes);
        if (st != NB_OK) {
            nb_treedef_destroy(d);
            return st;
        }
    }
    if (def != NULL) {
        *def = d;
    }
    return NB_OK;
}

/* Rebuild the subtree at node index *i; leaves come from src in order. A node k with
 * reuse[k] >= 0 (reuse may be NULL) is pool[reuse[k]], retained. */
static nb_status nbi_unflatten_rec(nb_ctx *ctx, const nb_treedef *d, int64_t *i,
                                   nb_tree *const *src, int64_t *leaf, const int32_t *reuse,
                                   nb_tree *const *pool, nb_tree **out) {
    static const char fn[] = "nb_tree_unflatten";
    if (reuse != NULL && reuse[*i] >= 0) {
        nb_tree *r = pool[reuse[*i]];
        *i = nbi_td_skip(d, *i);
        *leaf += r->n_leaves;
        *out = nb_tree_retain(r);
        return NB_OK;
    }
    const nbi_tdnode *nd = &d->nodes[(*i)++];
    nb_status st = NB_OK;
    switch (nd->kind) {
    case NB_TREE_KIND_NULL:
        return nb_tree_null(ctx, out);
    case NB_TREE_KIND_ARRAY:
    case NB_TREE_KIND_VAR: {
        nb_tree *src_leaf = src[(*leaf)++];
        /* the treedef's frozen mark is part of the structure: a leaf that comes without it
         * (a jitted function's output array, say) gets it back */
        if ((nd->flags & NBI_TREE_FLAG_FROZEN) && !(src_leaf->flags & NBI_TREE_FLAG_FROZEN)) {
            return nb_tree_freeze(src_leaf, out);
        }
        *out = nb_tree_retain(src_leaf);
        return NB_OK;
    }
    case NB_TREE_KIND_INT:
        st = nb_tree_int(ctx, nd->u.i, out);
        break;
    case NB_TREE_KIND_FLOAT:
        st = nb_tree_float(ctx, nd->u.f, out);
        break;
    case NB_TREE_KIND_BOOL:
        st = nb_tree_bool(ctx, nd->u.b, out);
        break;
    case NB_TREE_KIND_STRING:
        st = nb_tree_string(ctx, nd->u.str, out);
        break;
    case NB_TREE_KIND_FNREF:
        st = nb_tree_fnref(ctx, nd->u.fnref.fn, nd->u.fnref.name, out);
        break;
    case NB_TREE_KIND_LIST:
    case NB_TREE_KIND_TUPLE:
    case NB_TREE_KIND_DICT: {
        int64_t n = nd->n;
        /* small nodes (most of them) gather their children on the stack */
        nb_tree *stack_items[16] = {NULL};
        const char *stack_keys[16] = {NULL};
        size_t bytes = n <= 16 ? 0 : (size_t)n * (sizeof(nb_tree *) + sizeof(char *));
        nb_tree **items = n <= 16 ? stack_items : nbi_alloc(ctx, bytes, 8);
        if (items == NULL) {
            return nbi_oom(ctx, fn, bytes);
        }
        const char **keys = n <= 16 ? stack_keys : (const char **)(items + n);
        for (int64_t c = 0; c < n; c++) {
            keys[c] = d->nodes[*i].key;
            items[c] = NULL;
            st = nbi_unflatten_rec(ctx, d, i, src, leaf, reuse, pool, &items[c]);
            if (st != NB_OK) {
                nbi_release_items(c, items);
                if (bytes > 0) {
                    nbi_free(ctx, items, bytes);
                }
                return st;
            }
        }
        st = nbi_tree_node_take(ctx, fn, nd->kind, n, keys, items, out);
        if (bytes > 0) {
            nbi_free(ctx, items, bytes);
        }
        if (st == NB_OK) {
            (*out)->flags = nd->flags;
        }
        return st;
    }
    }
    if (st == NB_OK) {
        (*out)->flags = nd->flags;
    }
    return st;
}

nb_status nb_tree_unflatten(const nb_treedef *def, const nb_tree *leaves, nb_tree **out) {
    static const char fn[] = "nb_tree_unflatten";
    if (out != NULL) {
        *out = NULL;
    }
    nb_ctx *ctx = nbi_handle_ctx(def) != NULL ? nbi_handle_ctx(def) : nbi_handle_ctx(leaves);
    nb_status st = nbi_check_handle_in(ctx, def, NBI_MAGIC_TREEDEF, fn, "def");
    if (st == NB_OK) {
        st = nbi_check_handle_in(ctx, leaves, NBI_MAGIC_TREE, fn, "leaves");
    }
    if (st == NB_OK && out == NULL) {
        st = nbi_tree_null_out(ctx, fn, "out", "an nb_tree *");
    }
    if (st != NB_OK) {
        return st;
    }
    if (leaves->hdr.ctx != ctx) {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: the leaves come from another context", fn);
    }
    if (leaves->kind != NB_TREE_KIND_LIST && leaves->kind != NB_TREE_KIND_TUPLE) {
        return nbi_err(ctx, NB_ERR_KIND, "%s: leaves must be a list or tuple, not %s", fn,
                       nb_tree_kind_name(leaves->kind));
    }
    if (leaves->n != def->n_leaves) {
        return nbi_err(ctx, NB_ERR_STRUCTURE,
                       "%s: the treedef has %lld dynamic leaves but %lld were given", fn,
                       (long long)def->n_leaves, (long long)leaves->n);
    }
    int64_t i = 0, leaf = 0;
    return nbi_unflatten_rec(ctx, def, &i, leaves->children, &leaf, NULL, NULL, out);
}

nb_status nbi_tree_unflatten_leaves(const nb_treedef *def, nb_tree *const *leaves, nb_tree **out) {
    *out = NULL;
    int64_t i = 0, leaf = 0;
    return nbi_unflatten_rec(def->hdr.ctx, def, &i, leaves, &leaf, NULL, NULL, out);
}

nb_status nbi_tree_unflatten_reuse(const nb_treedef *def, nb_tree *const *leaves,
                                   const int32_t *reuse, nb_tree *const *pool, nb_tree **out) {
    *out = NULL;
    int64_t i = 0, leaf = 0;
    return nbi_unflatten_rec(def->hdr.ctx, def, &i, leaves, &leaf, reuse, pool, out);
}

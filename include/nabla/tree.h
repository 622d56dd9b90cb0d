/*
 * nabla/tree.h -- pytrees: nested lists, tuples and dicts of arrays and static values.
 *
 * A tree is what every nabla transformation takes and returns: model parameters,
 * optimizer state, a batch, a function's arguments. Nodes are
 *     list, tuple          -- ordered children
 *     dict                 -- children under string keys, in the order given (insertion
 *                             order is kept, not sorted; keys are unique)
 * and leaves are
 *     null                 -- an empty slot (a frozen parameter's gradient, say)
 *     array                -- an nb_array: the dynamic data of the tree
 *     var                  -- a symbolic array, only inside a trace (made by nabla/ad)
 *     int, float, bool, string, fnref
 *                          -- static values: part of the tree's structure, compared by
 *                             value (strings by content, doubles by bit pattern, function
 *                             references by pointer and name), never by identity
 *
 * Trees are immutable once built and refcounted. Builders borrow their children (the tree
 * takes its own reference) and return a new reference, released with nb_tree_destroy.
 * Accessors that return a node or an array return a *borrowed* pointer, valid while the
 * tree it came from is alive.
 *
 * Leaves and the treedef. The dynamic leaves of a tree are its array and var leaves, in
 * depth-first order with children in their stored order. Everything else -- node kinds,
 * lengths, dict keys, the place of every null, the value of every static leaf -- is the
 * treedef, which is hashable and compared by value. Flattening splits a tree into (leaves,
 * treedef); unflattening puts it back together.
 *
 * Paths. Every node has a path from the root: dict keys as ".key" (or ["key"] when the key
 * is not an identifier), list and tuple positions as "[i]", e.g. "layers[1].weight" or
 * "mu[\"w-1\"]". The root's path is "" (printed as "<root>"). Paths name leaves in every
 * message and diagnostic; nb_tree_lookup goes the other way.
 */
#ifndef NABLA_TREE_H
#define NABLA_TREE_H

#include "array.h"
#include "core.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_tree nb_tree;
typedef struct nb_treedef nb_treedef;

/* ---- arrays of trees as arguments ---------------------------------------------------
 * Calls that take an array of trees (nb_tree_list, nb_tree_tuple, nb_tree_dict,
 * nb_tree_map_n, nb_tree_combine, nb_optim_chain, nb_nn_sequential_init) only read it and
 * retain the trees, so they accept both arrays of nb_tree * (the trees a builder gave you)
 * and arrays of const nb_tree * (what the accessors nb_tree_child, nb_tree_get and
 * nb_tree_lookup give you, and what a traced body receives), with no cast:
 *     nb_tree_tuple(ctx, 2, (nb_tree *[]){leaf, state}, &out);
 *     nb_tree_tuple(ctx, 2, (const nb_tree *[]){nb_tree_child(args, 0), leaf}, &out);
 * The parameter type is nb_tree_items. In C++ it is const nb_tree *const *, to which
 * nb_tree ** converts implicitly. In C it cannot be: C converts nb_tree ** to
 * nb_tree *const * but not to const nb_tree *const * (gcc and clang warn), so with gcc or
 * clang it is a transparent union of the two pointer types -- the argument is passed as a
 * plain pointer (same ABI as the pointer), any other type is a compile error -- and each of
 * these functions is also a function-like macro that wraps the call in __extension__, so
 * that -Wpedantic does not flag the (GNU) conversion to the union. Calling through a
 * function pointer bypasses the macro: there gcc's -Wpedantic warns, the call is still
 * right. Other C compilers see const nb_tree *const *: cast an nb_tree ** argument there.
 * (A _Generic macro cannot do this: the commas inside a compound literal such as
 * (nb_tree *[]){a, b} split a macro's arguments, and nb_tree_dict has two such arrays.)
 * Code receiving an nb_tree_items reads the pointer with NB_TREE_ITEMS_PTR. */
#if defined(__GNUC__) && !defined(__cplusplus)
typedef union nb_tree_items {
    const nb_tree *const *c;
    nb_tree *const *m;
} nb_tree_items __attribute__((__transparent_union__));
#define NB_TREE_ITEMS_UNION 1
#define NB_TREE_ITEMS_PTR(items) ((items).c)
#else
typedef const nb_tree *const *nb_tree_items;
#define NB_TREE_ITEMS_PTR(items) (items)
#endif

/* Values are ABI; new kinds are only appended. */
typedef enum nb_tree_kind {
    NB_TREE_KIND_NULL = 0,
    NB_TREE_KIND_ARRAY = 1,
    NB_TREE_KIND_VAR = 2,
    NB_TREE_KIND_INT = 3,
    NB_TREE_KIND_FLOAT = 4,
    NB_TREE_KIND_BOOL = 5,
    NB_TREE_KIND_STRING = 6,
    NB_TREE_KIND_FNREF = 7,
    NB_TREE_KIND_LIST = 8,
    NB_TREE_KIND_TUPLE = 9,
    NB_TREE_KIND_DICT = 10
} nb_tree_kind;

/* A generic C function pointer, as stored in a function-reference leaf. Cast to and from
 * the real type. */
typedef void (*nb_fnptr)(void);

/* Nodes may nest at most this deep (every walk over a tree is bounded by it); a builder
 * that would exceed it returns NB_ERR_INVALID. */
#define NB_TREE_MAX_DEPTH 256

/* Paths longer than this are cut, with "..." at the end. */
#define NB_PATH_MAX 512

/* "null", "array", "var", "int", "float", "bool", "string", "fn", "list", "tuple", "dict". */
NB_API const char *nb_tree_kind_name(nb_tree_kind kind);

/* ---- building ----------------------------------------------------------------------- */
/* Every builder: on success *out is a new reference; allocates. Returns NB_OK,
 * NB_ERR_MISUSE (NULL ctx/out, NULL or destroyed child or array, NULL string), or NB_ERR_OOM;
 * the node builders also NB_ERR_INVALID (negative n, NULL or duplicate dict key, a child
 * from another context, nesting deeper than NB_TREE_MAX_DEPTH). */

NB_API nb_status nb_tree_null(nb_ctx *ctx, nb_tree **out);
/* A leaf holding a (borrowed; the tree takes its own reference, no copy: the tree sees
 * later writes to a's data). The context is a's. */
NB_API nb_status nb_tree_array(nb_array *a, nb_tree **out);
NB_API nb_status nb_tree_int(nb_ctx *ctx, int64_t value, nb_tree **out);
NB_API nb_status nb_tree_float(nb_ctx *ctx, double value, nb_tree **out);
NB_API nb_status nb_tree_bool(nb_ctx *ctx, bool value, nb_tree **out);
/* value is copied (NUL-terminated, any length). */
NB_API nb_status nb_tree_string(nb_ctx *ctx, const char *value, nb_tree **out);
/* A function reference: fn must not be NULL; name (copied, non-empty) is what messages
 * and printing show. Equal when both pointer and name are equal. */
NB_API nb_status nb_tree_fnref(nb_ctx *ctx, nb_fnptr fn, const char *name, nb_tree **out);
/* Nodes with n children (items may be NULL when n is 0; an array of nb_tree * or of
 * const nb_tree *, see nb_tree_items above; each child is retained); keys are copied. */
NB_API nb_status nb_tree_list(nb_ctx *ctx, int64_t n, nb_tree_items items, nb_tree **out);
NB_API nb_status nb_tree_tuple(nb_ctx *ctx, int64_t n, nb_tree_items items, nb_tree **out);
NB_API nb_status nb_tree_dict(nb_ctx *ctx, int64_t n, const char *const *keys, nb_tree_items items,
                              nb_tree **out);

/* Take another reference (returns t, or NULL for a NULL or destroyed handle). */
NB_API nb_tree *nb_tree_retain(nb_tree *t);
/* Release the caller's reference; children are released when the node is freed. NULL is a
 * no-op. Destroying a destroyed handle records NB_ERR_MISUSE on the context. */
NB_API void nb_tree_destroy(nb_tree *t);

/* A copy of leaf marked frozen: gradients (nabla/ad.h) give null there, as for a
 * non-float leaf. The mark is static -- part of the treedef -- so freezing or unfreezing a
 * parameter retraces, and the retrace reason names it. Any leaf kind may be marked (the
 * mark matters only on float arrays). Returns a new reference; NB_ERR_KIND for a node. */
NB_API nb_status nb_tree_freeze(const nb_tree *leaf, nb_tree **out);
/* Is t a leaf marked by nb_tree_freeze? */
NB_API bool nb_tree_is_frozen(const nb_tree *t);

/* ---- accessors ---------------------------------------------------------------------- */
/* NB_OK, or NB_ERR_MISUSE if NULL/dead (a destroyed handle also records why on its context). */
NB_API nb_status nb_tree_check(const nb_tree *t);
NB_API nb_ctx *nb_tree_ctx(const nb_tree *t); /* [NULL] for NULL/destroyed */
/* The kind; NB_TREE_KIND_NULL for a NULL or destroyed handle (check with nb_tree_check). */
NB_API nb_tree_kind nb_tree_kind_of(const nb_tree *t);
NB_API bool nb_tree_is_leaf(const nb_tree *t);    /* not list/tuple/dict */
NB_API bool nb_tree_is_static(const nb_tree *t);  /* int/float/bool/string/fnref */
NB_API bool nb_tree_is_dynamic(const nb_tree *t); /* array/var */
/* Number of children of a node (0 for a leaf, -1 for a NULL or destroyed handle). */
NB_API int64_t nb_tree_len(const nb_tree *t);
/* Child i of a node, borrowed; NULL if t is not a node or i is out of range. */
NB_API const nb_tree *nb_tree_child(const nb_tree *t, int64_t i);
/* Key i of a dict, borrowed; NULL if t is not a dict or i is out of range. */
NB_API const char *nb_tree_key(const nb_tree *t, int64_t i);
/* The child of a dict under key, borrowed, or NULL. */
NB_API const nb_tree *nb_tree_get(const nb_tree *t, const char *key);
/* The array of an array leaf, borrowed (valid while t is alive), or NULL. */
NB_API nb_array *nb_tree_get_array(const nb_tree *t);
/* Static values. NB_ERR_KIND (message names the actual kind) if t is another kind. The
 * string and name pointers are borrowed from t. */
NB_API nb_status nb_tree_get_int(const nb_tree *t, int64_t *out);
NB_API nb_status nb_tree_get_float(const nb_tree *t, double *out);
NB_API nb_status nb_tree_get_bool(const nb_tree *t, bool *out);
NB_API nb_status nb_tree_get_string(const nb_tree *t, const char **out);
NB_API nb_status nb_tree_get_fnref(const nb_tree *t, nb_fnptr *fn, const char **name);

/* ---- paths -------------------------------------------------------------------------- */
/* Number of dynamic (array and var) leaves. -1 for a NULL or destroyed handle. */
NB_API int64_t nb_tree_num_leaves(const nb_tree *t);
/* The node at path (syntax as above; "" is the root), borrowed. NB_ERR_NOT_FOUND names the
 * longest prefix that exists and what it holds; NB_ERR_INVALID for a malformed path. */
NB_API nb_status nb_tree_lookup(const nb_tree *t, const char *path, const nb_tree **out);
/* The path of dynamic leaf i (0 <= i < nb_tree_num_leaves), snprintf contract as
 * nb_array_format (NB_ERR_TRUNCATED when cut). NB_ERR_INDEX if i is out of range. */
NB_API nb_status nb_tree_leaf_path(const nb_tree *t, int64_t i, char *buf, size_t cap,
                                   size_t *needed);

/* ---- flatten / unflatten ------------------------------------------------------------ */
/* Split t into its dynamic leaves, returned as a new list tree (*leaves, whose children
 * are t's array and var leaves, in order) and a new treedef (*def). Either out-parameter
 * may be NULL when not wanted. Allocates. */
NB_API nb_status nb_tree_flatten(const nb_tree *t, nb_tree **leaves, nb_treedef **def);
/* Rebuild a tree of def's structure whose dynamic-leaf positions hold the children of the
 * list or tuple leaves (any trees; usually array leaves). A count that differs from
 * nb_treedef_num_leaves is NB_ERR_STRUCTURE. Allocates; returns a new reference. */
NB_API nb_status nb_tree_unflatten(const nb_treedef *def, const nb_tree *leaves, nb_tree **out);
/* The treedef of t alone (a new reference). */
NB_API nb_status nb_tree_treedef(const nb_tree *t, nb_treedef **out);

NB_API nb_treedef *nb_treedef_retain(nb_treedef *def);
NB_API void nb_treedef_destroy(nb_treedef *def);
NB_API int64_t nb_treedef_num_leaves(const nb_treedef *def); /* -1 for NULL/destroyed */
/* A 64-bit hash of the treedef's value: equal treedefs have equal hashes in one process
 * (function references hash by address, so hashes differ between runs). 0 for NULL. */
NB_API uint64_t nb_treedef_hash(const nb_treedef *def);
/* Value equality: same kinds, lengths, keys, null positions and static values. */
NB_API bool nb_treedef_equal(const nb_treedef *a, const nb_treedef *b);
/* A one-line description such as dict(w=*, act=fn relu, n=int 3, b=null) where * marks a
 * dynamic leaf. snprintf contract as nb_array_format. */
NB_API nb_status nb_treedef_format(const nb_treedef *def, char *buf, size_t cap, size_t *needed);

/* ---- map ---------------------------------------------------------------------------- */
/* Called at each leaf position selected by the flags below. leaves[0..n-1] are the leaves
 * of the n trees at that position (borrowed; a tree other than the first may hold a null
 * there), path is its path (borrowed, "" for the root). On success set *out to a new
 * reference to any tree (a leaf or a whole subtree), which becomes the output at that
 * position. A non-OK return stops the map; set a message with nb_tree_map_fail if you
 * want one, else nabla writes one naming the path. */
typedef nb_status (*nb_tree_map_fn)(void *ud, const char *path, int n, const nb_tree *const *leaves,
                                    nb_tree **out);

enum {
    /* Also call fn where the first tree holds null (default: the output is null there). */
    NB_TREE_MAP_NULLS = 1u << 0,
    /* Also call fn at static leaves of the first tree (default: they are kept as they are). */
    NB_TREE_MAP_STATIC = 1u << 1
};

/* Map fn over the dynamic leaves of t (and nulls/static leaves as flags say). The output
 * has t's structure with each visited position replaced by what fn returned. */
NB_API nb_status nb_tree_map(const nb_tree *t, nb_tree_map_fn fn, void *ud, unsigned flags,
                             nb_tree **out);
/* Map over 1 <= n <= 16 trees at once. The trees must have the node structure of the first (same
 * node kinds, lengths and dict keys, in order); at a leaf position of the first tree the
 * others may hold any leaf (null, array, static) but not a node. A mismatch is
 * NB_ERR_STRUCTURE naming the first differing path. */
NB_API nb_status nb_tree_map_n(int n, nb_tree_items trees, nb_tree_map_fn fn, void *ud,
                               unsigned flags, nb_tree **out);
/* For use inside a map callback: record a formatted message on the trees' context and
 * return status (so "return nb_tree_map_fail(ctx, NB_ERR_SHAPE, ...)" works). */
NB_API nb_status nb_tree_map_fail(nb_ctx *ctx, nb_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---- filter / partition / combine --------------------------------------------------- */
/* A predicate on one leaf (any leaf kind except nodes; never called on null). */
typedef bool (*nb_tree_pred)(void *ud, const nb_tree *leaf);
/* Built-in predicates (ud unused): an array leaf; an array leaf of a float dtype. */
NB_API bool nb_tree_pred_is_array(void *ud, const nb_tree *leaf);
NB_API bool nb_tree_pred_is_inexact_array(void *ud, const nb_tree *leaf);

/* A tree of t's structure keeping the leaves where pred holds, null elsewhere. */
NB_API nb_status nb_tree_filter(const nb_tree *t, nb_tree_pred pred, void *ud, nb_tree **out);
/* Both halves at once: *match = filter(t, pred), *rest = filter(t, not pred). */
NB_API nb_status nb_tree_partition(const nb_tree *t, nb_tree_pred pred, void *ud, nb_tree **match,
                                   nb_tree **rest);
/* Inverse of partition: at each leaf position take the first non-null leaf of the n >= 1
 * trees (null if all are). The trees must share the node structure (else
 * NB_ERR_STRUCTURE naming the path). */
NB_API nb_status nb_tree_combine(int n, nb_tree_items trees, nb_tree **out);

/* ---- equality and diff -------------------------------------------------------------- */
/* Same treedef (structure, null positions and static values; arrays not looked at). */
NB_API nb_status nb_tree_structure_equal(const nb_tree *a, const nb_tree *b, bool *out);
/* Same treedef, and every array leaf pair nb_array_equal (same dtype, shape, values). */
NB_API nb_status nb_tree_equal(const nb_tree *a, const nb_tree *b, bool *out);

typedef enum nb_tree_diff_level {
    NB_TREE_DIFF_STRUCTURE = 0, /* treedef only */
    NB_TREE_DIFF_SIGNATURE = 1, /* treedef + dtype and shape of every array leaf */
    NB_TREE_DIFF_VALUES = 2     /* signature + array values (as nb_array_equal) */
} nb_tree_diff_level;

/* Find the first difference between a and b (depth-first) at the given level. *differ
 * says whether there is one; if so buf receives "<path>: <how>", e.g.
 *     opt_state.mu.w1: null vs f32[256,784]
 *     layers: list of 3 vs list of 4
 *     act: fn 'relu' vs fn 'tanh'
 *     x: values differ at [1,2]: 0.5 vs 0.25
 * and "" otherwise. snprintf contract for buf/cap/needed as nb_array_format. */
NB_API nb_status nb_tree_diff(const nb_tree *a, const nb_tree *b, nb_tree_diff_level level,
                              bool *differ, char *buf, size_t cap, size_t *needed);

/* ---- printing ----------------------------------------------------------------------- */
/* Show structure, dtypes and shapes (not values), one node per line, with paths:
 *     dict {
 *       layers: list [
 *         [0]: dict { weight: f32[32,2]  bias: f32[32] } ...
 * snprintf contract as nb_array_format. Never allocates. */
NB_API nb_status nb_tree_format(const nb_tree *t, char *buf, size_t cap, size_t *needed);
/* nb_tree_format then write to f. Allocates a temporary buffer through the context. */
NB_API nb_status nb_tree_fprint(const nb_tree *t, FILE *f);
/* One line per dynamic leaf: "<path>: <dtype>[<shape>]". Allocates a temporary buffer. */
NB_API nb_status nb_tree_fprint_leaves(const nb_tree *t, FILE *f);

#ifdef __cplusplus
}
#endif

/* The calls taking an nb_tree_items, wrapped so that -Wpedantic accepts both array types
 * (see nb_tree_items above). */
#ifdef NB_TREE_ITEMS_UNION
#define nb_tree_list(...) (__extension__ nb_tree_list(__VA_ARGS__))
#define nb_tree_tuple(...) (__extension__ nb_tree_tuple(__VA_ARGS__))
#define nb_tree_dict(...) (__extension__ nb_tree_dict(__VA_ARGS__))
#define nb_tree_map_n(...) (__extension__ nb_tree_map_n(__VA_ARGS__))
#define nb_tree_combine(...) (__extension__ nb_tree_combine(__VA_ARGS__))
#endif
#endif /* NABLA_TREE_H */

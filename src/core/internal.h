/*
 * src/core/internal.h -- what the core modules share. Not API: nothing here is installed.
 *
 * Objects (arrays, tree nodes, treedefs) live in fixed-size blocks taken from per-context
 * slabs. A destroyed object's block keeps a DEAD magic and goes to the back of a FIFO free
 * list, so a stale handle is detected as NB_ERR_MISUSE (rather than read from freed memory)
 * until its block is reused; the slabs are freed with the context.
 */
#ifndef NABLA_SRC_CORE_INTERNAL_H
#define NABLA_SRC_CORE_INTERNAL_H

#include <nabla/fn.h>
#include <nabla/nabla.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define NBI_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define NBI_HIDDEN __attribute__((visibility("hidden")))
#else
#define NBI_PRINTF(f, a)
#define NBI_HIDDEN
#endif

#define NBI_ERRMSG_CAP 1024
#define NBI_ALIGN 64

/* ---- objects ------------------------------------------------------------------------ */
enum {
    NBI_MAGIC_DEAD = 0x44454144u,    /* "DEAD" */
    NBI_MAGIC_ARRAY = 0x41525259u,   /* "ARRY" */
    NBI_MAGIC_TREE = 0x54524545u,    /* "TREE" */
    NBI_MAGIC_TREEDEF = 0x54444546u, /* "TDEF" */
    NBI_MAGIC_FN = 0x464e4354u,      /* "FNCT" */
    NBI_MAGIC_BATCHER = 0x42544348u  /* "BTCH" (io/batch.c) */
};

typedef struct nbi_obj {
    uint32_t magic;
    uint32_t reserved;
    nb_ctx *ctx;
    int64_t refcount;
    struct nbi_obj *next_free; /* on the free list only */
} nbi_obj;

/* A data buffer shared by an array and its reshaped views. Data starts NBI_ALIGN bytes
 * after the header. */
typedef struct nbi_buffer {
    int64_t refcount;
    size_t alloc_size;
    uint64_t donate_mark; /* jit.c: the last call that donated it (finds a buffer donated twice) */
} nbi_buffer;

struct nb_array {
    nbi_obj hdr;
    nb_dtype dtype;
    int rank;
    int64_t shape[NB_MAX_RANK];
    int64_t size;
    size_t nbytes;
    nbi_buffer *buf;
    void *data;
};

struct nb_tree {
    nbi_obj hdr;
    nb_tree_kind kind;
    uint32_t flags;
    int64_t n;          /* children of a node */
    int64_t n_leaves;   /* dynamic leaves in this subtree */
    int32_t depth;      /* 0 for a leaf, 1 + the deepest child for a node */
    bool def_hash_ok;   /* def_hash holds nbi_tree_def_hash (computed on first use: the */
    uint64_t def_hash;  /* tree is immutable once built, so it never goes stale) */
    uint64_t serial;    /* unique in its context, never reused: names this node for memos */
    nb_tree **children; /* node: n entries, inside aux */
    char **keys;        /* dict: n entries, inside aux */
    void *aux;          /* one allocation: children, keys and key chars, or string chars */
    size_t aux_size;
    union {
        nb_array *array;
        int64_t i;
        double f;
        bool b;
        char *str; /* inside aux */
        struct {
            nb_fnptr fn;
            char *name; /* inside aux */
        } fnref;
        struct {
            void *var;
            uint64_t trace_id;
        } var;
    } u;
};

/* A treedef node, in pre-order. key is the key under which the node sits in a dict parent
 * (or NULL). Static strings and fn names point into the treedef's char pool. */
typedef struct nbi_tdnode {
    nb_tree_kind kind; /* ARRAY stands for any dynamic leaf (array or var) */
    uint32_t flags;
    int64_t n;
    const char *key;
    union {
        int64_t i;
        double f;
        bool b;
        const char *str;
        struct {
            nb_fnptr fn;
            const char *name;
        } fnref;
    } u;
} nbi_tdnode;

/* A function (nabla/fn.h). PLAIN holds a body and bound data; JIT and MAXTRACES wrap an
 * inner function with options. */
typedef enum nbi_fn_kind {
    NBI_FN_PLAIN,
    NBI_FN_JIT,
    NBI_FN_MAXTRACES,
    NBI_FN_GRAD, /* grad or value_and_grad (with_value) */
    NBI_FN_VJP,
    NBI_FN_JVP,
    NBI_FN_CUSTOM_VJP, /* inner = f; fwd, bwd: the user's rule */
    NBI_FN_VMAP,       /* inner = f; spec: (in_axes, out_axes, axis_size, given, given) */
    NBI_FN_TRAIN,      /* inner = value_and_grad(loss); spec: (opt, filter, donate spec) */
    NBI_FN_JAC,        /* inner = f; spec: the mode (jacobian.c) */
    NBI_FN_CUSTOM_JVP  /* inner = f; fwd: the user's JVP rule */
} nbi_fn_kind;

/* Layers whose body is a transform of the wrapped function, traced by
 * nbi_trace_transform (the custom rules only under a derivative). */
static inline bool nbi_fn_is_transform(nbi_fn_kind k) {
    return k == NBI_FN_GRAD || k == NBI_FN_VJP || k == NBI_FN_JVP || k == NBI_FN_VMAP ||
           k == NBI_FN_TRAIN || k == NBI_FN_JAC;
}

/* Tree node flags (static: part of the treedef). */
enum {
    NBI_TREE_FLAG_SIG = 1u << 0,   /* a signature-tree leaf (jit.c, internal) */
    NBI_TREE_FLAG_FROZEN = 1u << 1 /* nb_tree_freeze: no gradient for this leaf */
};

struct nb_fn {
    nbi_obj hdr;
    nbi_fn_kind kind;
    int32_t max_traces;
    bool inline_calls;
    uint8_t debug;  /* JIT: NBI_DEBUG_NANS | NBI_DEBUG_INFS (nb_jit_opts) */
    uint8_t native; /* JIT: nb_jit_opts.native (NB_NATIVE_*) */
    nb_fn_body body;
    nb_tree *self;    /* PLAIN: bound data (a reference), may be NULL */
    nb_fn *inner;     /* wrappers and transforms: the wrapped function (a reference) */
    bool has_aux;     /* GRAD: f returns (loss, aux) */
    bool with_value;  /* GRAD: value_and_grad */
    nb_tree *spec;    /* GRAD: filter spec (a reference) or NULL */
    nb_fn *fwd, *bwd; /* CUSTOM_VJP: the rule's two halves (references) */
    char *name;       /* copied */
    size_t name_size;
    void *jit_ident;  /* jit.c's memo: this function's cache identity, valid while */
    uint64_t jit_gen; /* the cache's generation is jit_gen (0: none yet) */
};

struct nb_treedef {
    nbi_obj hdr;
    int64_t n_nodes;
    int64_t n_leaves;
    uint64_t hash;
    nbi_tdnode *nodes; /* inside aux */
    void *aux;
    size_t aux_size;
};

/* ---- context ------------------------------------------------------------------------ */
NBI_HIDDEN void *nbi_alloc(nb_ctx *ctx, size_t size, size_t align);
NBI_HIDDEN void nbi_free(nb_ctx *ctx, void *ptr, size_t size);
/* Record an error (formatted into the fixed buffer, passed to the log callback) and return
 * status, so "return nbi_err(ctx, NB_ERR_SHAPE, ...)" reads naturally. */
NBI_HIDDEN nb_status nbi_err(nb_ctx *ctx, nb_status status, const char *fmt, ...) NBI_PRINTF(3, 4);
NBI_HIDDEN nb_status nbi_verr(nb_ctx *ctx, nb_status status, const char *fmt, va_list ap);
/* Append formatted text to the last error message (cut to the fixed buffer). */
NBI_HIDDEN void nbi_err_append(nb_ctx *ctx, const char *fmt, ...) NBI_PRINTF(2, 3);
/* The standard out-of-memory error: "<fn>: out of memory allocating <n> bytes". */
NBI_HIDDEN nb_status nbi_oom(nb_ctx *ctx, const char *fn, size_t bytes);
/* Incremented by every recorded error: tells whether a callback recorded its own. */
NBI_HIDDEN uint64_t nbi_ctx_err_seq(const nb_ctx *ctx);
NBI_HIDDEN void nbi_log(nb_ctx *ctx, nb_log_level level, const char *fmt, ...) NBI_PRINTF(3, 4);
/* A line the user asked for (nb_debug_print): to the log callback at NB_LOG_LEVEL_INFO
 * whatever its level, or to stderr when there is none. */
NBI_HIDDEN void nbi_print_line(nb_ctx *ctx, const char *text);

/* Take a zeroed object block with the given magic and refcount 1, or NULL (OOM recorded). */
NBI_HIDDEN void *nbi_obj_new(nb_ctx *ctx, uint32_t magic, const char *fn);
/* Return a block to the pool (its resources already released). */
NBI_HIDDEN void nbi_obj_release(nbi_obj *o);
/* NB_OK if o is a live object of the given magic, else NB_ERR_MISUSE. */
static inline bool nbi_obj_live(const void *o, uint32_t magic) {
    return o != NULL && ((const nbi_obj *)o)->magic == magic;
}
/* Report a destroy of an already destroyed handle on its context. */
NBI_HIDDEN void nbi_obj_double_destroy(const void *o, const char *fn);
/* The context a pooled handle (live or destroyed, of any kind) was made in; NULL for NULL or
 * for a pointer that is no handle. */
NBI_HIDDEN nb_ctx *nbi_handle_ctx(const void *h);
/* The entry check of a handle argument: NB_OK if h is a live handle of the kind magic names.
 * Otherwise NB_ERR_MISUSE, recorded on the handle's own context (a destroyed handle keeps it)
 * with the function fn, the argument arg and the fix: "nb_array_get: a (the array) was
 * already destroyed: ...", "... is a tree, not an array". A NULL h has nowhere to record;
 * nbi_check_handle_in records it on ctx (another argument's context, may be NULL). */
NBI_HIDDEN nb_status nbi_check_handle(const void *h, uint32_t magic, const char *fn,
                                      const char *arg);
NBI_HIDDEN nb_status nbi_check_handle_in(nb_ctx *ctx, const void *h, uint32_t magic, const char *fn,
                                         const char *arg);
/* The text nbi_check_handle records, into buf (for callers that record on a trace): true
 * when h is not a live handle of the kind magic names. */
NBI_HIDDEN bool nbi_handle_why(const void *h, uint32_t magic, const char *fn, const char *arg,
                               char *buf, size_t cap);
/* "fn: ctx is NULL ..." recorded on the context of the handle other (NULL, or a pooled handle
 * passed beside the NULL ctx); returns NB_ERR_MISUSE. */
NBI_HIDDEN nb_status nbi_err_null_ctx(const void *other, const char *fn);
/* "fn: arg is NULL (<need>)" on ctx (may be NULL: nothing recorded); returns NB_ERR_MISUSE.
 * For NULL out-parameters and required pointers beside a handle that gives the context. */
NBI_HIDDEN nb_status nbi_err_null(nb_ctx *ctx, const char *fn, const char *arg, const char *need);

/* Per-kind live counters, kept on the context. */
typedef enum nbi_count {
    NBI_COUNT_ARRAY,
    NBI_COUNT_TREE,
    NBI_COUNT_TREEDEF,
    NBI_COUNT_BUFFER,
    NBI_COUNT_FN,
    NBI_COUNT_N
} nbi_count;
NBI_HIDDEN void nbi_count_add(nb_ctx *ctx, nbi_count which, int64_t delta);

/* Free what a live object owns besides its block (used by nb_ctx_destroy for objects the
 * user leaked; never releases references to other objects). */
NBI_HIDDEN void nbi_array_free_owned(nb_array *a);
NBI_HIDDEN void nbi_tree_free_owned(nb_tree *t);
NBI_HIDDEN void nbi_treedef_free_owned(nb_treedef *d);
NBI_HIDDEN void nbi_fn_free_owned(nb_fn *f);

/* A call that runs compiled code (nb_fn_call and friends) holds the context: NB_OK (the
 * same thread may enter again, from a body it traces), or NB_ERR_MISUSE with a message
 * naming fn when another thread is inside. Every NB_OK is paired with nbi_ctx_leave. */
NBI_HIDDEN nb_status nbi_ctx_enter(nb_ctx *ctx, const char *fn);
NBI_HIDDEN void nbi_ctx_leave(nb_ctx *ctx);

/* ---- the thread pool (pool.c) ------------------------------------------------------- */
typedef struct nbi_pool nbi_pool;
/* worker: 0 for the calling thread, 1..threads-1 for the pool's (per-thread scratch). */
typedef void (*nbi_task_fn)(void *ud, int64_t task, int worker);
NBI_HIDDEN nb_status nbi_pool_create(nb_ctx *ctx, int n_threads, nbi_pool **out);
NBI_HIDDEN void nbi_pool_destroy(nbi_pool *p);
/* Run fn(ud, t) for t in [0, n_tasks) on the pool's threads and the caller; returns when
 * all are done. Task boundaries are the caller's and must not depend on the thread count.
 * A NULL pool runs the tasks in order on the caller. Never allocates. */
NBI_HIDDEN void nbi_pool_run(nbi_pool *p, int64_t n_tasks, nbi_task_fn fn, void *ud);
NBI_HIDDEN int nbi_pool_threads(const nbi_pool *p);
/* The context's pool, created on first use with nb_ctx_n_threads threads (NULL with one
 * thread). NB_ERR_OOM if it cannot be allocated. */
NBI_HIDDEN nb_status nbi_ctx_pool(nb_ctx *ctx, nbi_pool **out);

/* The compile cache hangs off the context; the ad module installs a function that frees it,
 * called first thing by nb_ctx_destroy (while every object is still alive). */
NBI_HIDDEN void **nbi_ctx_jit_slot(nb_ctx *ctx);
/* A fresh serial for a tree node: 1, 2, 3, ... per context, never reused. */
NBI_HIDDEN uint64_t nbi_ctx_serial(nb_ctx *ctx);
/* The context's write hook (nb_ctx_set_write_hook), or NULL for write(2). */
NBI_HIDDEN nb_write_hook nbi_ctx_write_hook(nb_ctx *ctx, void **ud);
NBI_HIDDEN void nbi_ctx_set_jit_free(nb_ctx *ctx, void (*fn)(nb_ctx *ctx, void *state));

/* ---- overflow-checked sizes ---------------------------------------------------------- */
static inline bool nbi_mul_i64(int64_t a, int64_t b, int64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool nbi_add_size(size_t a, size_t b, size_t *out) {
    return __builtin_add_overflow(a, b, out);
}
static inline bool nbi_mul_size(size_t a, size_t b, size_t *out) {
    return __builtin_mul_overflow(a, b, out);
}

/* ---- string building (snprintf contract, never allocates) --------------------------- */
typedef struct nbi_sbuf {
    char *buf;
    size_t cap;
    size_t len; /* length the full text would have */
} nbi_sbuf;

static inline nbi_sbuf nbi_sbuf_make(char *buf, size_t cap) {
    nbi_sbuf s = {buf, cap, 0};
    if (buf != NULL && cap > 0) {
        buf[0] = '\0';
    }
    return s;
}
NBI_HIDDEN void nbi_sbuf_printf(nbi_sbuf *s, const char *fmt, ...) NBI_PRINTF(2, 3);
NBI_HIDDEN void nbi_sbuf_puts(nbi_sbuf *s, const char *str);
NBI_HIDDEN void nbi_sbuf_putc(nbi_sbuf *s, char c);
NBI_HIDDEN void nbi_sbuf_spaces(nbi_sbuf *s, size_t n);
/* Set *needed and return NB_OK or NB_ERR_TRUNCATED. */
NBI_HIDDEN nb_status nbi_sbuf_finish(const nbi_sbuf *s, size_t *needed);

/* "f32[2,3]" of a dtype and shape, into s. */
NBI_HIDDEN void nbi_sbuf_sig(nbi_sbuf *s, nb_dtype dtype, int rank, const int64_t *shape);
/* Format a signature into a small fixed buffer (for messages); returns buf. */
NBI_HIDDEN const char *nbi_sig(char *buf, size_t cap, nb_dtype dtype, int rank,
                               const int64_t *shape);
#define NBI_SIG_CAP 192

/* Run a formatter that follows the snprintf contract into a temporary buffer from the
 * context and write it to f (plus a newline). */
typedef nb_status (*nbi_format_fn)(const void *obj, char *buf, size_t cap, size_t *needed);
NBI_HIDDEN nb_status nbi_fprint_with(nb_ctx *ctx, const char *fn, nbi_format_fn format,
                                     const void *obj, FILE *f);

/* ---- paths -------------------------------------------------------------------------- */
typedef struct nbi_path {
    char buf[NB_PATH_MAX];
    size_t len;
    bool cut;
} nbi_path;

typedef struct nbi_path_mark {
    size_t len;
    bool cut;
} nbi_path_mark;

static inline void nbi_path_init(nbi_path *p) {
    p->buf[0] = '\0';
    p->len = 0;
    p->cut = false;
}
static inline nbi_path_mark nbi_path_save(const nbi_path *p) {
    nbi_path_mark m = {p->len, p->cut};
    return m;
}
static inline void nbi_path_restore(nbi_path *p, nbi_path_mark m) {
    p->len = m.len;
    p->cut = m.cut;
    p->buf[p->len] = '\0';
}
NBI_HIDDEN void nbi_path_push_key(nbi_path *p, const char *key);
NBI_HIDDEN void nbi_path_push_index(nbi_path *p, int64_t i);
/* The path for messages: "<root>" for the root, the text otherwise ("..." appended when
 * cut). Returns a pointer into p or a static string. */
NBI_HIDDEN const char *nbi_path_str(nbi_path *p);
/* Append the rendering of one dict key step to s (".key" or ["key"]; no dot at start). */
NBI_HIDDEN void nbi_sbuf_key(nbi_sbuf *s, const char *key, bool at_start);

/* Threefry-2x32, 20 rounds: the block of counter (x0, x1) under key (k0, k1). (random.c) */
NBI_HIDDEN void nbi_threefry2x32(uint32_t k0, uint32_t k1, uint32_t x0, uint32_t x1, uint32_t *y0,
                                 uint32_t *y1);

/* ---- arrays ------------------------------------------------------------------------- */
/* nb_dtype_size for hot loops (inlined): 4, 8, 4, 8, 1; 0 for an unknown dtype. */
static inline size_t nbi_dsize(nb_dtype dtype) {
    return (unsigned)dtype < NB_DTYPE_COUNT ? (size_t)((0x18484u >> (4u * (unsigned)dtype)) & 15u)
                                            : 0;
}
/* Validate dtype/rank/shape and compute size and bytes. fn names the caller in messages. */
NBI_HIDDEN nb_status nbi_shape_check(nb_ctx *ctx, const char *fn, nb_dtype dtype, int rank,
                                     const int64_t *shape, int64_t *size, size_t *nbytes);
/* An uninitialised array (data not zeroed). */
NBI_HIDDEN nb_status nbi_array_new(nb_ctx *ctx, const char *fn, nb_dtype dtype, int rank,
                                   const int64_t *shape, nb_array **out);
/* Row i (0 <= i < dim 0, checked by the caller) of a as a view (errors name fn). */
NBI_HIDDEN nb_status nbi_array_row_view(const nb_array *a, const char *fn, int64_t i,
                                        nb_array **out);
/* Read element i as double / write one (no checks). */
NBI_HIDDEN double nbi_array_load(const nb_array *a, int64_t i);
/* Are two arrays equal per nb_array_equal; *where receives the first differing flat index
 * (or -1). Same dtype and shape are checked first. */
NBI_HIDDEN bool nbi_array_values_equal(const nb_array *a, const nb_array *b, int64_t *where);

/* ---- trees -------------------------------------------------------------------------- */
NBI_HIDDEN bool nbi_tree_kind_is_node(nb_tree_kind k);
NBI_HIDDEN bool nbi_tree_kind_is_static(nb_tree_kind k);
/* A var leaf (for the tracing module): var is opaque to the core. */
NBI_HIDDEN nb_status nbi_tree_var(nb_ctx *ctx, void *var, uint64_t trace_id, nb_tree **out);
/* Build a node taking ownership of the references in items (consumed on success and on
 * failure). keys are copied. */
NBI_HIDDEN nb_status nbi_tree_node_take(nb_ctx *ctx, const char *fn, nb_tree_kind kind, int64_t n,
                                        const char *const *keys, nb_tree **items, nb_tree **out);
/* Compare two static leaves (same kind required) by value. */
NBI_HIDDEN bool nbi_static_equal(const nb_tree *a, const nb_tree *b);
/* The hash nb_treedef_hash would give t's treedef, computed without building it. */
NBI_HIDDEN uint64_t nbi_tree_def_hash(const nb_tree *t);
/* nb_tree_unflatten with the leaves as an array of def->n_leaves trees (each retained into
 * the result); no checks. */
NBI_HIDDEN nb_status nbi_tree_unflatten_leaves(const nb_treedef *def, nb_tree *const *leaves,
                                               nb_tree **out);
/* Does t have exactly the treedef d (same as nb_treedef_equal of t's treedef and d)? */
NBI_HIDDEN bool nbi_tree_def_match(const nb_tree *t, const nb_treedef *d);
/* Per node of d (pre-order): the number of nodes of its subtree (size), the index of its
 * first dynamic leaf among d's (first_leaf) and its number of dynamic leaves (n_leaves). */
NBI_HIDDEN void nbi_treedef_extents(const nb_treedef *d, int32_t *size, int32_t *first_leaf,
                                    int32_t *n_leaves);
/* Do the subtrees at node ia of a and node ib of b have the same definition? The key under
 * which each root sits in its parent is not compared. */
NBI_HIDDEN bool nbi_treedef_sub_equal(const nb_treedef *a, int64_t ia, const nb_treedef *b,
                                      int64_t ib);
/* nbi_tree_unflatten_leaves, except that a node k of def with reuse[k] >= 0 becomes
 * pool[reuse[k]] (retained), which the caller vouches has exactly the definition of k's
 * subtree; the entries of leaves under such a node are not read (may be NULL). */
NBI_HIDDEN nb_status nbi_tree_unflatten_reuse(const nb_treedef *def, nb_tree *const *leaves,
                                              const int32_t *reuse, nb_tree *const *pool,
                                              nb_tree **out);

/* Describe a leaf or node briefly for messages: "null", "f32[2,3]", "int 3", "fn 'relu'",
 * "list of 3", "dict with keys (a, b)". */
NBI_HIDDEN void nbi_sbuf_describe(nbi_sbuf *s, const nb_tree *t);

#endif /* NABLA_SRC_CORE_INTERNAL_H */

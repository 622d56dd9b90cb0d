/*
 * ctx.c -- version, status strings, the context, allocation, errors, logging, the object
 * pool, and the small string/path helpers every module uses.
 */
#include "internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- version and status ------------------------------------------------------------- */

const char *nb_version(void) {
    return NB_VERSION_STRING;
}

int nb_version_number(void) {
    return NB_VERSION_NUMBER;
}

const char *nb_status_string(nb_status status) {
    switch (status) {
#define NB_STATUS_STR_(name, value, desc)                                                          \
    case NB_##name:                                                                                \
        return desc;
        NB_STATUS_LIST(NB_STATUS_STR_)
#undef NB_STATUS_STR_
    }
    return "unknown status";
}

const char *nb_status_name(nb_status status) {
    switch (status) {
#define NB_STATUS_NAME_(name, value, desc)                                                         \
    case NB_##name:                                                                                \
        return #name;
        NB_STATUS_LIST(NB_STATUS_NAME_)
#undef NB_STATUS_NAME_
    }
    return "UNKNOWN";
}

/* ---- default allocator -------------------------------------------------------------- */

/* malloc with the alignment made by hand: the block starts at the first aligned address
 * past a header that keeps malloc's own pointer and the block's size. glibc's aligned_alloc
 * splits chunks on every call (a tiny MLP's seven output arrays spent 0.6 us in
 * _int_memalign per call); plain malloc serves them from its per-thread cache.
 *
 * Large blocks (1 MiB and more) are kept when freed, up to 16 of them and 1 GiB, and given
 * again to an allocation of their size (a block at most an eighth larger than asked): glibc maps
 * blocks above its mmap threshold (at most 32 MiB) afresh on every malloc, and the kernel's page
 * faults and zeroing of a fresh mapping cost more than the work that fills it -- per-example
 * gradients of an MLP 784-256-256-10, 138 MB of outputs per call, ran 5x slower. The kept
 * blocks are freed when any context is destroyed. */
#define NBI_BIG_MIN ((size_t)1 << 20)
#define NBI_BIG_SLOTS 16
#define NBI_BIG_CAP ((size_t)1 << 30)

static pthread_mutex_t nbi_big_lock = PTHREAD_MUTEX_INITIALIZER;
static void *nbi_big_raw[NBI_BIG_SLOTS];
static size_t nbi_big_total[NBI_BIG_SLOTS];
static size_t nbi_big_bytes;

/* A kept block of total in [want, want + want / 8], or NULL. */
static void *nbi_big_take(size_t want, size_t *total) {
    pthread_mutex_lock(&nbi_big_lock);
    int best = -1;
    for (int i = 0; i < NBI_BIG_SLOTS; i++) {
        if (nbi_big_raw[i] != NULL && nbi_big_total[i] >= want &&
            nbi_big_total[i] - want <= want / 8 &&
            (best < 0 || nbi_big_total[i] < nbi_big_total[best])) {
            best = i;
        }
    }
    void *raw = NULL;
    if (best >= 0) {
        raw = nbi_big_raw[best];
        *total = nbi_big_total[best];
        nbi_big_raw[best] = NULL;
        nbi_big_bytes -= *total;
    }
    pthread_mutex_unlock(&nbi_big_lock);
    return raw;
}

/* Keep raw (total bytes) if there is room; true when kept. */
static bool nbi_big_keep(void *raw, size_t total) {
    bool kept = false;
    pthread_mutex_lock(&nbi_big_lock);
    for (int i = 0; i < NBI_BIG_SLOTS && !kept; i++) {
        if (nbi_big_raw[i] == NULL && nbi_big_bytes + total <= NBI_BIG_CAP) {
            nbi_big_raw[i] = raw;
            nbi_big_total[i] = total;
            nbi_big_bytes += total;
            kept = true;
        }
    }
    pthread_mutex_unlock(&nbi_big_lock);
    return kept;
}

static void nbi_big_release(void) {
    pthread_mutex_lock(&nbi_big_lock);
    for (int i = 0; i < NBI_BIG_SLOTS; i++) {
        free(nbi_big_raw[i]);
        nbi_big_raw[i] = NULL;
    }
    nbi_big_bytes = 0;
    pthread_mutex_unlock(&nbi_big_lock);
}

static void *nbi_default_alloc(void *ud, size_t size, size_t align) {
    (void)ud;
    size_t total;
    if (align < sizeof(void *)) {
        align = sizeof(void *);
    }
    if (nbi_add_size(size, align + 2 * sizeof(void *), &total)) {
        return NULL;
    }
    unsigned char *raw = total >= NBI_BIG_MIN ? nbi_big_take(total, &total) : NULL;
    if (raw == NULL) {
        raw = malloc(total);
    }
    if (raw == NULL) {
        return NULL;
    }
    uintptr_t at = ((uintptr_t)raw + 2 * sizeof(void *) + align - 1) & ~(uintptr_t)(align - 1);
    void **p = (void **)at;
    p[-1] = raw;
    p[-2] = (void *)(uintptr_t)total;
    return p;
}

static void nbi_default_free(void *ud, void *ptr, size_t size) {
    (void)ud;
    (void)size;
    if (ptr != NULL) {
        void *raw = ((void **)ptr)[-1];
        size_t total = (size_t)(uintptr_t)((void **)ptr)[-2];
        if (total < NBI_BIG_MIN || !nbi_big_keep(raw, total)) {
            free(raw);
        }
    }
}

nb_allocator nb_allocator_default(void) {
    nb_allocator a = {.alloc = nbi_default_alloc, .free = nbi_default_free, .ud = NULL};
    return a;
}

/* ---- the context -------------------------------------------------------------------- */

#define NBI_SLAB_BLOCKS 64

typedef struct nbi_slab {
    struct nbi_slab *next;
    size_t bytes;
    /* blocks follow, each nbi_block_size() bytes */
} nbi_slab;

struct nb_ctx {
    nb_ctx_opts opts;
    int n_threads;
    nb_status errcode;
    uint64_t err_seq;
    char errmsg[NBI_ERRMSG_CAP];
    nbi_slab *slabs;
    nbi_obj *free_head;
    nbi_obj *free_tail;
    int64_t live[NBI_COUNT_N];
    void *jit_state;
    void (*jit_free)(nb_ctx *ctx, void *state);
    nbi_pool *pool;
    size_t bytes_in_use;
    size_t bytes_peak;
    int64_t n_allocs;
    int64_t n_alloc_failures;
    uint64_t tree_serial;     /* the last serial given to a tree node (nbi_ctx_serial) */
    nb_write_hook write_hook; /* nabla/io.h: writes go through it when set */
    void *write_ud;
    /* The thread inside a call that runs compiled code (nbi_ctx_enter), and how deeply:
     * a second thread entering is refused, never a silent race. */
    _Atomic(uintptr_t) owner;
    int owner_depth;
};

/* An address unique to the running thread: its identity for nbi_ctx_enter. */
static _Thread_local char nbi_thread_tag;

nb_status nbi_ctx_enter(nb_ctx *ctx, const char *fn) {
    uintptr_t me = (uintptr_t)&nbi_thread_tag, free_ = 0;
    if (atomic_load_explicit(&ctx->owner, memory_order_relaxed) == me) {
        ctx->owner_depth++; /* a call made from a body this thread is tracing */
        return NB_OK;
    }
    if (!atomic_compare_exchange_strong_explicit(&ctx->owner, &free_, me, memory_order_acquire,
                                                 memory_order_relaxed)) {
        /* (the message is written while the other thread may write its own: that thread's
         * call is the one this misuse races with anyway) */
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: the context is in use by another thread (a context and everything "
                       "made from it are used by one thread at a time): give each thread a "
                       "context of its own, or serialise the calls",
                       fn);
    }
    ctx->owner_depth = 1;
    return NB_OK;
}

void nbi_ctx_leave(nb_ctx *ctx) {
    if (--ctx->owner_depth == 0) {
        atomic_store_explicit(&ctx->owner, (uintptr_t)0, memory_order_release);
    }
}

nb_status nb_ctx_set_write_hook(nb_ctx *ctx, nb_write_hook hook, void *ud) {
    if (ctx == NULL) {
        return NB_ERR_MISUSE;
    }
    ctx->write_hook = hook;
    ctx->write_ud = ud;
    return NB_OK;
}

nb_write_hook nbi_ctx_write_hook(nb_ctx *ctx, void **ud) {
    *ud = ctx->write_ud;
    return ctx->write_hook;
}

static size_t nbi_max3(size_t a, size_t b, size_t c) {
    size_t m = a > b ? a : b;
    return m > c ? m : c;
}

static size_t nbi_block_size(void) {
    size_t s = nbi_max3(sizeof(struct nb_array), sizeof(struct nb_tree), sizeof(struct nb_treedef));
    s = s > sizeof(struct nb_fn) ? s : sizeof(struct nb_fn);
    return (s + 15) / 16 * 16;
}

static size_t nbi_slab_header(void) {
    return (sizeof(nbi_slab) + 15) / 16 * 16;
}

nb_ctx_opts nb_ctx_opts_default(void) {
    nb_ctx_opts o;
    memset(&o, 0, sizeof o);
    o.allocator = nb_allocator_default();
    o.log = NULL;
    o.log_ud = NULL;
    o.log_level = NB_LOG_LEVEL_WARN;
    o.n_threads = 0;
    return o;
}

/* n_threads 0: $NABLA_THREADS when it is an integer in 1..1024 (a way to pin a program's
 * thread count from outside, as OMP_NUM_THREADS), else the number of cores. */
static int nbi_cores(void) {
    const char *env = getenv("NABLA_THREADS");
    if (env != NULL && *env != '\0') {
        char *end = NULL;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 1 && v <= 1024) {
            return (int)v;
        }
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) {
        return 1;
    }
    return n > 1024 ? 1024 : (int)n;
}

nb_status nb_ctx_create(const nb_ctx_opts *opts, nb_ctx **out) {
    if (out == NULL) {
        return NB_ERR_MISUSE;
    }
    *out = NULL;
    nb_ctx_opts o = opts ? *opts : nb_ctx_opts_default();
    if (o.allocator.alloc == NULL || o.allocator.free == NULL) {
        return NB_ERR_MISUSE;
    }
    if (o.n_threads < 0 || (int)o.log_level < (int)NB_LOG_LEVEL_ERROR ||
        (int)o.log_level > (int)NB_LOG_LEVEL_DEBUG) {
        return NB_ERR_INVALID;
    }
    nb_ctx *ctx = o.allocator.alloc(o.allocator.ud, sizeof(nb_ctx), 64);
    if (ctx == NULL) {
        return NB_ERR_OOM;
    }
    memset(ctx, 0, sizeof *ctx);
    ctx->opts = o;
    ctx->n_threads = o.n_threads == 0 ? nbi_cores() : o.n_threads;
    ctx->errcode = NB_OK;
    ctx->errmsg[0] = '\0';
    ctx->n_allocs = 1;
    ctx->bytes_in_use = sizeof(nb_ctx);
    ctx->bytes_peak = sizeof(nb_ctx);
    *out = ctx;
    return NB_OK;
}

void nb_ctx_destroy(nb_ctx *ctx) {
    if (ctx == NULL) {
        return;
    }
    if (ctx->jit_free != NULL) {
        ctx->jit_free(ctx, ctx->jit_state);
        ctx->jit_state = NULL;
    }
    nbi_pool_destroy(ctx->pool);
    ctx->pool = NULL;
    /* Free what leaked objects own, then the slabs. Buffers are shared between arrays, so
     * arrays drop their buffer references one by one. */
    size_t bs = nbi_block_size();
    for (nbi_slab *s = ctx->slabs; s != NULL; s = s->next) {
        unsigned char *base = (unsigned char *)s + nbi_slab_header();
        for (int i = 0; i < NBI_SLAB_BLOCKS; i++) {
            nbi_obj *o = (nbi_obj *)(base + (size_t)i * bs);
            switch (o->magic) {
            case NBI_MAGIC_ARRAY:
                nbi_array_free_owned((nb_array *)o);
                break;
            case NBI_MAGIC_TREE:
                nbi_tree_free_owned((nb_tree *)o);
                break;
            case NBI_MAGIC_TREEDEF:
                nbi_treedef_free_owned((nb_treedef *)o);
                break;
            case NBI_MAGIC_FN:
                nbi_fn_free_owned((nb_fn *)o);
                break;
            default:
                break;
            }
            o->magic = NBI_MAGIC_DEAD;
        }
    }
    nbi_slab *s = ctx->slabs;
    while (s != NULL) {
        nbi_slab *next = s->next;
        ctx->opts.allocator.free(ctx->opts.allocator.ud, s, s->bytes);
        s = next;
    }
    nb_allocator a = ctx->opts.allocator;
    a.free(a.ud, ctx, sizeof(nb_ctx));
    nbi_big_release();
}

const char *nb_ctx_errmsg(const nb_ctx *ctx) {
    if (ctx == NULL) {
        return "NULL context (nb_ctx_create failed or was not called)";
    }
    return ctx->errmsg;
}

nb_status nb_ctx_errcode(const nb_ctx *ctx) {
    return ctx == NULL ? NB_ERR_MISUSE : ctx->errcode;
}

void nb_ctx_clear_error(nb_ctx *ctx) {
    if (ctx != NULL) {
        ctx->errcode = NB_OK;
        ctx->errmsg[0] = '\0';
    }
}

nb_status nb_ctx_stats_get(const nb_ctx *ctx, nb_ctx_stats *out) {
    if (out != NULL) {
        memset(out, 0, sizeof *out);
    }
    if (ctx == NULL) {
        return NB_ERR_MISUSE;
    }
    if (out == NULL) {
        /* The error buffer is the one part of a context that a const query may write: the
         * context itself was never made const. */
        return nbi_err_null((nb_ctx *)ctx, "nb_ctx_stats_get", "out",
                            "pass the address of an nb_ctx_stats to fill");
    }
    out->live_arrays = ctx->live[NBI_COUNT_ARRAY];
    out->live_trees = ctx->live[NBI_COUNT_TREE];
    out->live_treedefs = ctx->live[NBI_COUNT_TREEDEF];
    out->live_buffers = ctx->live[NBI_COUNT_BUFFER];
    out->live_fns = ctx->live[NBI_COUNT_FN];
    out->bytes_in_use = ctx->bytes_in_use;
    out->bytes_peak = ctx->bytes_peak;
    out->n_allocs = ctx->n_allocs;
    out->n_alloc_failures = ctx->n_alloc_failures;
    return NB_OK;
}

int nb_ctx_n_threads(const nb_ctx *ctx) {
    return ctx == NULL ? 0 : ctx->n_threads;
}

void *nb_ctx_alloc(nb_ctx *ctx, size_t size, size_t align) {
    static const char fn[] = "nb_ctx_alloc";
    if (ctx == NULL) {
        nbi_err_null_ctx(NULL, fn);
        return NULL;
    }
    if (size == 0 || align > 4096 || (align & (align - 1)) != 0) {
        nbi_err(ctx, NB_ERR_MISUSE,
                "%s: size %zu, align %zu: size must be > 0 and align a power of two at most "
                "4096",
                fn, size, align);
        return NULL;
    }
    return nbi_alloc(ctx, size, align);
}

void nb_ctx_free(nb_ctx *ctx, void *ptr, size_t size) {
    if (ptr == NULL || ctx == NULL) {
        return;
    }
    nbi_free(ctx, ptr, size);
}

nb_status nbi_ctx_pool(nb_ctx *ctx, nbi_pool **out) {
    if (ctx->pool == NULL && ctx->n_threads > 1) {
        nb_status st = nbi_pool_create(ctx, ctx->n_threads, &ctx->pool);
        if (st != NB_OK) {
            *out = NULL;
            return st;
        }
    }
    *out = ctx->pool;
    return NB_OK;
}

uint64_t nbi_ctx_serial(nb_ctx *ctx) {
    return ++ctx->tree_serial;
}

void **nbi_ctx_jit_slot(nb_ctx *ctx) {
    return &ctx->jit_state;
}

void nbi_ctx_set_jit_free(nb_ctx *ctx, void (*fn)(nb_ctx *ctx, void *state)) {
    ctx->jit_free = fn;
}

void nbi_count_add(nb_ctx *ctx, nbi_count which, int64_t delta) {
    ctx->live[which] += delta;
}

/* ---- allocation --------------------------------------------------------------------- */

void *nbi_alloc(nb_ctx *ctx, size_t size, size_t align) {
    if (size == 0) {
        size = 1;
    }
    if (align < 8) {
        align = 8;
    }
    ctx->n_allocs++;
    void *p = ctx->opts.allocator.alloc(ctx->opts.allocator.ud, size, align);
    if (p == NULL) {
        ctx->n_alloc_failures++;
        return NULL;
    }
    ctx->bytes_in_use += size;
    if (ctx->bytes_in_use > ctx->bytes_peak) {
        ctx->bytes_peak = ctx->bytes_in_use;
    }
    return p;
}

void nbi_free(nb_ctx *ctx, void *ptr, size_t size) {
    if (ptr == NULL) {
        return;
    }
    if (size == 0) {
        size = 1;
    }
    ctx->bytes_in_use -= size;
    ctx->opts.allocator.free(ctx->opts.allocator.ud, ptr, size);
}

/* ---- errors and logging ------------------------------------------------------------- */

static void nbi_log_str(nb_ctx *ctx, nb_log_level level, const char *msg) {
    if (ctx->opts.log != NULL && (int)level <= (int)ctx->opts.log_level) {
        ctx->opts.log(ctx->opts.log_ud, level, msg);
    }
}

nb_status nbi_verr(nb_ctx *ctx, nb_status status, const char *fmt, va_list ap) {
    if (ctx == NULL) {
        return status;
    }
    ctx->errcode = status;
    ctx->err_seq++;
    int n = vsnprintf(ctx->errmsg, sizeof ctx->errmsg, fmt, ap);
    if (n < 0) {
        snprintf(ctx->errmsg, sizeof ctx->errmsg, "%s", nb_status_string(status));
    } else if ((size_t)n >= sizeof ctx->errmsg) {
        memcpy(ctx->errmsg + sizeof ctx->errmsg - 4, "...", 4);
    }
    nbi_log_str(ctx, NB_LOG_LEVEL_ERROR, ctx->errmsg);
    return status;
}

nb_status nbi_err(nb_ctx *ctx, nb_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    nb_status s = nbi_verr(ctx, status, fmt, ap);
    va_end(ap);
    return s;
}

void nbi_err_append(nb_ctx *ctx, const char *fmt, ...) {
    if (ctx == NULL) {
        return;
    }
    size_t len = strlen(ctx->errmsg);
    if (len + 4 >= sizeof ctx->errmsg) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(ctx->errmsg + len, sizeof ctx->errmsg - len, fmt, ap);
    va_end(ap);
    if (n > 0 && (size_t)n >= sizeof ctx->errmsg - len) {
        memcpy(ctx->errmsg + sizeof ctx->errmsg - 4, "...", 4);
    }
}

nb_status nbi_oom(nb_ctx *ctx, const char *fn, size_t bytes) {
    return nbi_err(ctx, NB_ERR_OOM,
                   "%s: out of memory allocating %zu bytes (the allocator "
                   "returned NULL; free memory or raise the allocator's limit)",
                   fn, bytes);
}

uint64_t nbi_ctx_err_seq(const nb_ctx *ctx) {
    return ctx->err_seq;
}

void nbi_log(nb_ctx *ctx, nb_log_level level, const char *fmt, ...) {
    if (ctx == NULL || ctx->opts.log == NULL || (int)level > (int)ctx->opts.log_level) {
        return;
    }
    char msg[NBI_ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ctx->opts.log(ctx->opts.log_ud, level, msg);
}

void nbi_print_line(nb_ctx *ctx, const char *text) {
    if (ctx != NULL && ctx->opts.log != NULL) {
        ctx->opts.log(ctx->opts.log_ud, NB_LOG_LEVEL_INFO, text);
    } else {
        fprintf(stderr, "%s\n", text);
    }
}

nb_status nb_tree_map_fail(nb_ctx *ctx, nb_status status, const char *fmt, ...) {
    if (ctx == NULL) {
        return NB_ERR_MISUSE;
    }
    if (fmt == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "nb_tree_map_fail: fmt is NULL (pass a printf format saying why the "
                       "callback failed)");
    }
    va_list ap;
    va_start(ap, fmt);
    nb_status s = nbi_verr(ctx, status, fmt, ap);
    va_end(ap);
    return s;
}

/* ---- object pool -------------------------------------------------------------------- */

static bool nbi_pool_grow(nb_ctx *ctx) {
    size_t bs = nbi_block_size();
    size_t bytes = nbi_slab_header() + bs * NBI_SLAB_BLOCKS;
    nbi_slab *s = nbi_alloc(ctx, bytes, 64);
    if (s == NULL) {
        return false;
    }
    memset(s, 0, bytes);
    s->bytes = bytes;
    s->next = ctx->slabs;
    ctx->slabs = s;
    unsigned char *base = (unsigned char *)s + nbi_slab_header();
    for (int i = 0; i < NBI_SLAB_BLOCKS; i++) {
        nbi_obj *o = (nbi_obj *)(base + (size_t)i * bs);
        o->magic = NBI_MAGIC_DEAD;
        o->next_free = NULL;
        if (ctx->free_tail != NULL) {
            ctx->free_tail->next_free = o;
        } else {
            ctx->free_head = o;
        }
        ctx->free_tail = o;
    }
    return true;
}

void *nbi_obj_new(nb_ctx *ctx, uint32_t magic, const char *fn) {
    if (ctx->free_head == NULL && !nbi_pool_grow(ctx)) {
        nbi_oom(ctx, fn, nbi_slab_header() + nbi_block_size() * NBI_SLAB_BLOCKS);
        return NULL;
    }
    nbi_obj *o = ctx->free_head;
    ctx->free_head = o->next_free;
    if (ctx->free_head == NULL) {
        ctx->free_tail = NULL;
    }
    memset(o, 0, nbi_block_size());
    o->magic = magic;
    o->ctx = ctx;
    o->refcount = 1;
    return o;
}

void nbi_obj_release(nbi_obj *o) {
    nb_ctx *ctx = o->ctx;
    o->magic = NBI_MAGIC_DEAD;
    o->refcount = 0;
    o->next_free = NULL;
    /* FIFO: the block is reused as late as possible, so stale handles stay detectable. */
    if (ctx->free_tail != NULL) {
        ctx->free_tail->next_free = o;
    } else {
        ctx->free_head = o;
    }
    ctx->free_tail = o;
}

void nbi_obj_double_destroy(const void *p, const char *fn) {
    const nbi_obj *o = p;
    if (o->ctx != NULL) {
        nbi_err(o->ctx, NB_ERR_MISUSE,
                "%s: handle %p was already destroyed (each reference is released once; "
                "use the _retain function to hold more than one)",
                fn, p);
    }
}

/* ---- handle checks ------------------------------------------------------------------ */

typedef struct nbi_kind_info {
    uint32_t magic;
    const char *name;    /* "an array" without the article: "array" */
    const char *article; /* "a" or "an" */
    const char *destroy; /* the function after which the handle is dead */
    const char *keep;    /* how to keep a handle alive past another owner's destroy */
} nbi_kind_info;

static const nbi_kind_info nbi_kinds[] = {
    {NBI_MAGIC_ARRAY, "array", "an", "nb_array_destroy", "keep a reference with nb_array_retain"},
    {NBI_MAGIC_TREE, "tree", "a", "nb_tree_destroy", "keep a reference with nb_tree_retain"},
    {NBI_MAGIC_TREEDEF, "treedef", "a", "nb_treedef_destroy",
     "keep a reference with nb_treedef_retain"},
    {NBI_MAGIC_FN, "function", "a", "nb_fn_destroy", "keep a reference with nb_fn_retain"},
    {NBI_MAGIC_BATCHER, "batcher", "a", "nb_batcher_destroy",
     "destroy the batcher only after its last use"},
};

static const nbi_kind_info *nbi_kind_of(uint32_t magic) {
    for (size_t i = 0; i < sizeof nbi_kinds / sizeof nbi_kinds[0]; i++) {
        if (nbi_kinds[i].magic == magic) {
            return &nbi_kinds[i];
        }
    }
    return NULL;
}

nb_ctx *nbi_handle_ctx(const void *h) {
    if (h == NULL) {
        return NULL;
    }
    const nbi_obj *o = h;
    if (o->magic != NBI_MAGIC_DEAD && nbi_kind_of(o->magic) == NULL) {
        return NULL; /* not a block of the pool: its ctx field means nothing */
    }
    return o->ctx;
}

bool nbi_handle_why(const void *h, uint32_t magic, const char *fn, const char *arg, char *buf,
                    size_t cap) {
    if (nbi_obj_live(h, magic)) {
        return false;
    }
    const nbi_kind_info *want = nbi_kind_of(magic);
    const char *wname = want != NULL ? want->name : "handle";
    const char *wart = want != NULL ? want->article : "a";
    uint32_t got = h != NULL ? ((const nbi_obj *)h)->magic : 0;
    const nbi_kind_info *is = nbi_kind_of(got);
    if (h == NULL) {
        snprintf(buf, cap, "%s: %s is NULL (%s %s is required)", fn, arg, wart, wname);
    } else if (got == NBI_MAGIC_DEAD && nbi_handle_ctx(h) != NULL) {
        snprintf(buf, cap,
                 "%s: %s (the %s) was already destroyed: a handle must not be used after %s; %s",
                 fn, arg, wname, want != NULL ? want->destroy : "its destroy",
                 want != NULL ? want->keep : "keep it alive while it is used");
    } else if (is != NULL) {
        snprintf(buf, cap,
                 "%s: %s is %s %s, not %s %s (a wrong argument, or a destroyed handle whose "
                 "block was reused: keep handles alive while they are used)",
                 fn, arg, is->article, is->name, wart, wname);
    } else {
        snprintf(buf, cap,
                 "%s: %s is not %s %s handle (uninitialised memory, or a handle of a context "
                 "that was destroyed)",
                 fn, arg, wart, wname);
    }
    return true;
}

nb_status nbi_check_handle_in(nb_ctx *ctx, const void *h, uint32_t magic, const char *fn,
                              const char *arg) {
    char why[NBI_ERRMSG_CAP];
    if (!nbi_handle_why(h, magic, fn, arg, why, sizeof why)) {
        return NB_OK;
    }
    nb_ctx *own = nbi_handle_ctx(h);
    return nbi_err(own != NULL ? own : ctx, NB_ERR_MISUSE, "%s", why);
}

nb_status nbi_check_handle(const void *h, uint32_t magic, const char *fn, const char *arg) {
    return nbi_check_handle_in(NULL, h, magic, fn, arg);
}

nb_status nbi_err_null_ctx(const void *other, const char *fn) {
    return nbi_err(nbi_handle_ctx(other), NB_ERR_MISUSE,
                   "%s: ctx is NULL (pass the context the other arguments were made in)", fn);
}

nb_status nbi_err_null(nb_ctx *ctx, const char *fn, const char *arg, const char *need) {
    return nbi_err(ctx, NB_ERR_MISUSE, "%s: %s is NULL (%s)", fn, arg, need);
}

/* ---- string building ---------------------------------------------------------------- */

static void nbi_sbuf_append(nbi_sbuf *s, const char *str, size_t n) {
    if (s->buf != NULL && s->cap > 0 && s->len < s->cap - 1) {
        size_t room = s->cap - 1 - s->len;
        size_t k = n < room ? n : room;
        memcpy(s->buf + s->len, str, k);
        s->buf[s->len + k] = '\0';
    }
    s->len += n;
}

void nbi_sbuf_printf(nbi_sbuf *s, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) {
        return;
    }
    if ((size_t)n < sizeof tmp) {
        nbi_sbuf_append(s, tmp, (size_t)n);
        return;
    }
    /* Longer than the scratch buffer: format straight into the destination. */
    size_t room = (s->buf != NULL && s->cap > s->len) ? s->cap - s->len : 0;
    if (room > 0) {
        va_start(ap, fmt);
        vsnprintf(s->buf + s->len, room, fmt, ap);
        va_end(ap);
    }
    s->len += (size_t)n;
}

void nbi_sbuf_puts(nbi_sbuf *s, const char *str) {
    nbi_sbuf_append(s, str, strlen(str));
}

void nbi_sbuf_putc(nbi_sbuf *s, char c) {
    nbi_sbuf_append(s, &c, 1);
}

void nbi_sbuf_spaces(nbi_sbuf *s, size_t n) {
    static const char sp[] = "                                ";
    while (n > 0) {
        size_t k = n < sizeof sp - 1 ? n : sizeof sp - 1;
        nbi_sbuf_append(s, sp, k);
        n -= k;
    }
}

nb_status nbi_sbuf_finish(const nbi_sbuf *s, size_t *needed) {
    if (needed != NULL) {
        *needed = s->len;
    }
    return s->len < s->cap ? NB_OK : NB_ERR_TRUNCATED;
}

void nbi_sbuf_sig(nbi_sbuf *s, nb_dtype dtype, int rank, const int64_t *shape) {
    nbi_sbuf_puts(s, nb_dtype_name(dtype));
    nbi_sbuf_putc(s, '[');
    for (int i = 0; i < rank; i++) {
        nbi_sbuf_printf(s, i ? ",%lld" : "%lld", (long long)shape[i]);
    }
    nbi_sbuf_putc(s, ']');
}

const char *nbi_sig(char *buf, size_t cap, nb_dtype dtype, int rank, const int64_t *shape) {
    nbi_sbuf s = nbi_sbuf_make(buf, cap);
    nbi_sbuf_sig(&s, dtype, rank, shape);
    return buf;
}

nb_status nbi_fprint_with(nb_ctx *ctx, const char *fn, nbi_format_fn format, const void *obj,
                          FILE *f) {
    if (f == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE, "%s: f is NULL (pass an open FILE *, e.g. stdout)", fn);
    }
    size_t need = 0;
    nb_status st = format(obj, NULL, 0, &need);
    if (st != NB_OK && st != NB_ERR_TRUNCATED) {
        return st;
    }
    size_t cap = need + 1;
    char *buf = nbi_alloc(ctx, cap, 8);
    if (buf == NULL) {
        return nbi_oom(ctx, fn, cap);
    }
    st = format(obj, buf, cap, &need);
    if (st == NB_OK) {
        fputs(buf, f);
        fputc('\n', f);
    }
    nbi_free(ctx, buf, cap);
    return st;
}

/* ---- paths -------------------------------------------------------------------------- */

static bool nbi_is_identifier(const char *k) {
    if (!((*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') || *k == '_')) {
        return false;
    }
    for (k++; *k; k++) {
        if (!((*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') || *k == '_' ||
              (*k >= '0' && *k <= '9'))) {
            return false;
        }
    }
    return true;
}

void nbi_sbuf_key(nbi_sbuf *s, const char *key, bool at_start) {
    if (nbi_is_identifier(key)) {
        if (!at_start) {
            nbi_sbuf_putc(s, '.');
        }
        nbi_sbuf_puts(s, key);
        return;
    }
    nbi_sbuf_puts(s, "[\"");
    for (const char *c = key; *c; c++) {
        if (*c == '"' || *c == '\\') {
            nbi_sbuf_putc(s, '\\');
        }
        nbi_sbuf_putc(s, *c);
    }
    nbi_sbuf_puts(s, "\"]");
}

static void nbi_path_take(nbi_path *p, const nbi_sbuf *s) {
    /* s was written into p->buf + p->len with the room that was left. */
    if (s->len >= s->cap) {
        p->cut = true;
        p->len = sizeof p->buf - 1;
        p->buf[p->len] = '\0';
    } else {
        p->len += s->len;
    }
}

void nbi_path_push_key(nbi_path *p, const char *key) {
    if (p->cut) {
        return;
    }
    nbi_sbuf s = nbi_sbuf_make(p->buf + p->len, sizeof p->buf - p->len);
    nbi_sbuf_key(&s, key, p->len == 0);
    nbi_path_take(p, &s);
}

void nbi_path_push_index(nbi_path *p, int64_t i) {
    if (p->cut) {
        return;
    }
    nbi_sbuf s = nbi_sbuf_make(p->buf + p->len, sizeof p->buf - p->len);
    nbi_sbuf_printf(&s, "[%lld]", (long long)i);
    nbi_path_take(p, &s);
}

const char *nbi_path_str(nbi_path *p) {
    if (p->len == 0) {
        return "<root>";
    }
    if (p->cut) {
        memcpy(p->buf + sizeof p->buf - 4, "...", 4);
    }
    return p->buf;
}

/*
 * nabla/core.h -- version, status codes, the context, allocators and logging.
 *
 * Every nabla object is made from a context (nb_ctx). The context owns the allocator that
 * every allocation goes through, the last error message, and (in later modules) the
 * compile cache and the thread pool. There is no global mutable state: two contexts are
 * fully independent.
 *
 * Conventions used by every nabla header
 * --------------------------------------
 * - Fallible functions return nb_status: NB_OK (0) on success, a negative NB_ERR_* code on
 *   failure, a positive code for a notable success. Results come back through
 *   out-parameters, which are set to NULL (or zero) on failure.
 * - After a failure, nb_ctx_errmsg() holds one line naming the function, the leaf path or
 *   shapes involved, and the fix. The message lives in a fixed buffer on the context, so
 *   reporting out-of-memory never allocates.
 * - A NULL handle, a NULL required out-parameter or a handle that was already destroyed
 *   gives NB_ERR_MISUSE; the library never aborts on user input. The misuse is recorded
 *   (function, argument, fix) whenever a context can be reached: a destroyed handle still
 *   knows its context, and a NULL out-parameter or pointer beside a live handle is reported
 *   on that handle's context. Only a NULL handle that is the one way to a context leaves no
 *   message (there is nowhere to put it).
 * - Threads: a context and everything made from it are used by one thread at a time. The
 *   calls that run compiled code (nb_fn_call, nb_fn_call_ex, nb_eval) check it: a second
 *   thread calling while one is inside gets NB_ERR_MISUSE naming the function, never a
 *   silent race (other functions are not checked).
 * - "borrows" means the call does not keep or release the caller's reference; "returns a
 *   new reference" means the caller owns what comes back and releases it with the
 *   matching _destroy function.
 * - The library prints nothing. Install a log callback to receive diagnostics.
 */
#ifndef NABLA_CORE_H
#define NABLA_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- export macro ------------------------------------------------------------------- */
#if defined(NABLA_STATIC_DEFINE)
#define NB_API
#elif defined(_WIN32)
#ifdef NABLA_BUILDING
#define NB_API __declspec(dllexport)
#else
#define NB_API __declspec(dllimport)
#endif
#else
#define NB_API __attribute__((visibility("default")))
#endif

/* ---- version ------------------------------------------------------------------------ */
#define NB_VERSION_MAJOR 0
#define NB_VERSION_MINOR 1
#define NB_VERSION_PATCH 0
#define NB_VERSION_STRING "0.1.0"
/* NB_VERSION_NUMBER is major*10000 + minor*100 + patch, for #if comparisons. */
#define NB_VERSION_NUMBER (NB_VERSION_MAJOR * 10000 + NB_VERSION_MINOR * 100 + NB_VERSION_PATCH)

/* The version of the library actually linked, as "major.minor.patch". Never fails. */
NB_API const char *nb_version(void);
/* The same as NB_VERSION_NUMBER, but of the linked library. */
NB_API int nb_version_number(void);

/* ---- status codes ------------------------------------------------------------------- */
/* One list generates the enum and nb_status_string(). Append only: values are ABI.
 * X(name, value, description) */
#define NB_STATUS_LIST(X)                                                                          \
    X(OK, 0, "success")                                                                            \
    X(ERR_MISUSE, -1, "API misuse (NULL or destroyed handle, NULL out-parameter)")                 \
    X(ERR_OOM, -2, "out of memory")                                                                \
    X(ERR_INVALID, -3, "invalid argument")                                                         \
    X(ERR_SHAPE, -4, "invalid or mismatched shape")                                                \
    X(ERR_DTYPE, -5, "invalid or mismatched dtype")                                                \
    X(ERR_OVERFLOW, -6, "size computation overflows")                                              \
    X(ERR_INDEX, -7, "index out of range")                                                         \
    X(ERR_STRUCTURE, -8, "tree structure mismatch")                                                \
    X(ERR_NOT_FOUND, -9, "not found")                                                              \
    X(ERR_TRUNCATED, -10, "output buffer too small")                                               \
    X(ERR_KIND, -11, "wrong kind of tree node")                                                    \
    X(ERR_INTERNAL, -12, "internal error (a bug in nabla: please report it)")                      \
    X(ERR_RETRACE, -13, "a function was traced more often than max_traces allows")                 \
    X(ERR_UNSUPPORTED, -14, "operation not supported for these operands")                          \
    X(ERR_IO, -15, "a file could not be opened, read or written")                                  \
    X(ERR_FORMAT, -16, "malformed file contents")                                                  \
    X(ERR_RUNTIME, -17, "a run-time check failed (e.g. an ODE solve that did not reach t1)")       \
    X(ERR_COMM, -18, "communication between processes failed or timed out (nabla/dist.h)")

#define NB_STATUS_ENUM_(name, value, desc) NB_##name = value,
typedef enum nb_status { NB_STATUS_LIST(NB_STATUS_ENUM_) } nb_status;
#undef NB_STATUS_ENUM_

/* A static, human-readable description of a status ("out of memory"). Unknown values give
 * "unknown status". Never fails, never allocates. */
NB_API const char *nb_status_string(nb_status status);
/* The enum name of a status without the NB_ prefix ("ERR_OOM"), or "UNKNOWN". */
NB_API const char *nb_status_name(nb_status status);

/* One line describing the build and the linked math libraries, e.g.
 *     nabla 0.1.0; BLIS 0.9.0 (kernels: zen3, single-threaded); SLEEF 3.5.1 (self-check: ok)
 * (the BLIS kernel set is the one chosen for this CPU at run time, then how the BLIS
 * library was built: single-threaded, OpenMP or pthreads; the SLEEF self-check
 * evaluates exp through SLEEF's dispatcher against libm). snprintf contract: writes at
 * most cap bytes including the NUL (buf may be NULL when cap is 0), sets *needed (may be
 * NULL) to the full length; returns NB_OK, NB_ERR_TRUNCATED if cut, NB_ERR_MISUSE for a
 * NULL buf with cap > 0. Never allocates. */
NB_API nb_status nb_build_info(char *buf, size_t cap, size_t *needed);

/* ---- allocator ---------------------------------------------------------------------- */
/* Every allocation nabla makes goes through this interface, so tests can count
 * allocations and inject failures.
 *   alloc(ud, size, align): return size bytes aligned to align (a power of two >= 8,
 *       at most 4096), or NULL on failure. size is never 0.
 *   free(ud, ptr, size): release a block returned by alloc; size is the size that was
 *       asked for. ptr is never NULL.
 * Both are called only from the thread that is using the context. */
typedef struct nb_allocator {
    void *(*alloc)(void *ud, size_t size, size_t align);
    void (*free)(void *ud, void *ptr, size_t size);
    void *ud;
} nb_allocator;

/* The default allocator: aligned_alloc/free from the C library. */
NB_API nb_allocator nb_allocator_default(void);

/* ---- logging ------------------------------------------------------------------------ */
typedef enum nb_log_level {
    NB_LOG_LEVEL_ERROR = 0,
    NB_LOG_LEVEL_WARN = 1,
    NB_LOG_LEVEL_INFO = 2,
    NB_LOG_LEVEL_DEBUG = 3
} nb_log_level;

/* Receives one message (a NUL-terminated line without a trailing newline). msg is
 * borrowed for the duration of the call. Every error recorded on the context is also
 * passed here at NB_LOG_LEVEL_ERROR. Must not call back into the same context. */
typedef void (*nb_log_fn)(void *ud, nb_log_level level, const char *msg);

/* ---- context ------------------------------------------------------------------------ */
typedef struct nb_ctx nb_ctx;

/* Options for nb_ctx_create. Get defaults with nb_ctx_opts_default() and change fields;
 * new fields are only ever added at the end. */
typedef struct nb_ctx_opts {
    nb_allocator allocator; /* default: nb_allocator_default() */
    nb_log_fn log;          /* default: NULL (nothing is printed or passed anywhere) */
    void *log_ud;           /* passed to log */
    nb_log_level log_level; /* messages above this level are not passed; default WARN */
    int n_threads;          /* threads kernels split work across (results are bit-identical for
                               any count); 0 = $NABLA_THREADS if it is an integer in
                               1..1024, else the number of cores */
} nb_ctx_opts;

NB_API nb_ctx_opts nb_ctx_opts_default(void);

/* Create a context. opts may be NULL for the defaults; it is copied. On success *out is a
 * new context, destroyed with nb_ctx_destroy.
 * Returns NB_OK; NB_ERR_MISUSE if out is NULL or the allocator lacks alloc or free;
 * NB_ERR_INVALID for a negative n_threads or an unknown log level; NB_ERR_OOM if the
 * context itself cannot be allocated. No message is available on failure (there is no
 * context to hold it); the status says why. Allocates. */
NB_API nb_status nb_ctx_create(const nb_ctx_opts *opts, nb_ctx **out);

/* Destroy a context and everything still alive that was made from it (arrays, trees,
 * treedefs): their handles become invalid. NULL is a no-op. Using ctx afterwards is
 * undefined (its memory is gone; unlike arrays and trees it cannot be detected). */
NB_API void nb_ctx_destroy(nb_ctx *ctx);

/* The message of the last failure recorded on ctx ("" if none). The pointer is borrowed:
 * valid until the next call that uses ctx. A NULL ctx gives a static message saying so. */
NB_API const char *nb_ctx_errmsg(const nb_ctx *ctx);
/* The status of the last failure recorded on ctx (NB_OK if none; NB_ERR_MISUSE for NULL). */
NB_API nb_status nb_ctx_errcode(const nb_ctx *ctx);
/* Forget the last failure: errcode becomes NB_OK and errmsg "". NULL is a no-op. */
NB_API void nb_ctx_clear_error(nb_ctx *ctx);

/* Live-object and memory counters, for tests and leak checks. */
typedef struct nb_ctx_stats {
    int64_t live_arrays;      /* arrays not yet destroyed (including those held by trees) */
    int64_t live_trees;       /* tree nodes alive */
    int64_t live_treedefs;    /* treedefs alive */
    int64_t live_buffers;     /* array data buffers alive */
    size_t bytes_in_use;      /* bytes currently allocated through the allocator */
    size_t bytes_peak;        /* the most bytes_in_use has been */
    int64_t n_allocs;         /* allocator calls made so far (successful or not) */
    int64_t n_alloc_failures; /* allocator calls that returned NULL */
    int64_t live_fns;         /* functions (nb_fn) alive */
} nb_ctx_stats;

/* Fill *out with ctx's counters. Returns NB_OK or NB_ERR_MISUSE. Never allocates. */
NB_API nb_status nb_ctx_stats_get(const nb_ctx *ctx, nb_ctx_stats *out);

/* The number of worker threads the context will use (after resolving 0 to the number of
 * cores), or 0 for a NULL ctx. */
NB_API int nb_ctx_n_threads(const nb_ctx *ctx);

/* The context's allocator, for libraries built on nabla (nabla_dist uses it, so that its
 * memory is counted and fails where a test injects failures like nabla's own): size bytes
 * aligned to align (a power of two, 8 <= align <= 4096; smaller is raised to 8), or NULL --
 * on an allocator failure (nothing recorded: the caller reports what it was doing), or with
 * NB_ERR_MISUSE recorded for a NULL ctx (then nothing can be recorded), size 0 or a bad
 * align. nb_ctx_free returns a block with the size that was asked for (NULL ptr: no-op).
 * Both only from the thread using the context; every block must be returned before
 * nb_ctx_destroy. */
NB_API void *nb_ctx_alloc(nb_ctx *ctx, size_t size, size_t align);
NB_API void nb_ctx_free(nb_ctx *ctx, void *ptr, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* NABLA_CORE_H */

/*
 * src/exec/native.c -- the native tier: when an executable gets machine code, and how it
 * is swapped in.
 *
 * Tiers. The interpreter (exec.c) always works and is always correct. An executable may
 * also get native code: its C (codegen.c) compiled by the system compiler and loaded
 * (native_cache.c). Three modes, from nb_jit_opts.native or NABLA_NATIVE:
 *  - NOW: compiled when the executable is compiled (the caller waits; a warm disk cache
 *    makes that a hash and a dlopen);
 *  - AUTO (default): counted; once it has dispatched NBI_NATIVE_HOT instructions (runs x
 *    instructions) its source is generated and queued for the process's one compile
 *    thread; the result is installed by the context's own thread at the start of a later
 *    run -- between calls, never during one;
 *  - OFF: never.
 * NABLA_NATIVE=check runs as NOW and, on every run of every executable with native code,
 * runs the native code first into scratch outputs, then the interpreter as usual, and
 * compares the outputs bit for bit (NaNs by NaN-ness: a NaN's payload is not specified);
 * a difference fails the call with NB_ERR_RUNTIME naming the output and element.
 *
 * Ownership. Everything on an executable (its nbi_native state, the installed function)
 * is read and written by the thread that owns the context only. The compile thread sees
 * a job: the source text, and where to put the loaded library and the reason of a
 * failure. The job is shared by two owners (the executable and the thread) and freed by
 * the last one; an executable destroyed while its job is queued or compiling just drops
 * its reference.
 */
#include "exec/native.h"
#include "exec/exec.h"
#include "exec/vmath.h"

#include <nabla/fn.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The environment the generated code reads: the layout of nbx_env in codegen.c's
 * prelude. */
typedef struct nbi_native_env {
    unsigned char *ws;
    void *scratch;
    nbi_pool *pool;
    int n_workers;
    const void *const *node;
    const nbi_kernel_fn *kern;
    const nbi_vmath *vm;
    void (*par)(nbi_pool *pool, int64_t n, int64_t chunk, nbi_range_fn fn, void *ud);
    const struct nbi_native_env *sub; /* the loops' conds' and bodies' (nbi_native_subs) */
    const nbi_exec *exec;
    const bool *(*plan)(const nbi_exec *e, const void *const *in, void *const *out,
                        const bool *donated, int *n_copy);
    void (*copy)(const nbi_exec *e, void *const *out);
    void (*loop_reverse)(const nbi_kargs *k, const nbi_loop_fns *f);
} nbi_native_env;

/* The prelude's nbx_kargs must be nbi_kargs. */
typedef struct nbi_kargs_mirror {
    const void *node;
    void *out;
    const void *const *in;
    void *scratch;
    void *pool;
    int n_workers;
    void *const *outs;
} nbi_kargs_mirror;
_Static_assert(sizeof(nbi_kargs_mirror) == sizeof(nbi_kargs) &&
                   offsetof(nbi_kargs_mirror, out) == offsetof(nbi_kargs, out) &&
                   offsetof(nbi_kargs_mirror, in) == offsetof(nbi_kargs, in) &&
                   offsetof(nbi_kargs_mirror, scratch) == offsetof(nbi_kargs, scratch) &&
                   offsetof(nbi_kargs_mirror, pool) == offsetof(nbi_kargs, pool) &&
                   offsetof(nbi_kargs_mirror, n_workers) == offsetof(nbi_kargs, n_workers) &&
                   offsetof(nbi_kargs_mirror, outs) == offsetof(nbi_kargs, outs),
               "codegen.c's nbx_kargs must have nbi_kargs's layout");
_Static_assert(NBI_VM_COUNT == 9, "codegen.c's nbx_vmath has 9 functions per dtype");

enum { NBI_NSTATE_NONE, NBI_NSTATE_QUEUED, NBI_NSTATE_READY, NBI_NSTATE_FAILED };

typedef struct nbi_native_job {
    _Atomic int refs; /* the executable and the compile thread */
    _Atomic int done;
    char *src;
    size_t len;
    nbi_native_lib *lib; /* the result (NULL: failed, see why) */
    nbi_native_load_info info;
    char why[512];
    struct nbi_native_job *next;
} nbi_native_job;

struct nbi_native {
    int mode; /* NB_NATIVE_AUTO or NB_NATIVE_NOW */
    int state;
    int64_t weight; /* instructions dispatched so far (AUTO) */
    nbi_native_job *job;
    nbi_native_lib *lib;
    nbi_native_env env;
    const void **nodes;
    nbi_kernel_fn *kerns;
    size_t bytes;
    nbi_native_env *subenv; /* the environments of the functions of loops (one block) */
    size_t sub_bytes;
    int source_id;  /* the process's count of generated sources (NABLA_NATIVE_SOURCES) */
    bool looked_up; /* AUTO: the disk cache was asked at the first call */
};

/* Executables with more instructions stay interpreted: the compiler's time grows with the
 * file (a 10^4-leaf optimizer update would be minutes of gcc), and such programs spend
 * their time in kernels over large arrays, which both tiers share. */
#define NBI_NATIVE_MAX_INSTRS 3000
/* AUTO asks the disk cache at the first call for executables up to this size. */
#define NBI_NATIVE_LOOKUP_INSTRS 400

/* ---- configuration -------------------------------------------------------------------- */

static _Atomic int nbi_native_env_mode = -1; /* -1: not read; else NB_NATIVE_*, 3: check */
static _Atomic long long nbi_native_hot = -1;
static _Atomic int nbi_native_env_bad; /* 1: NABLA_NATIVE is no known value; 2: said so */

static int nbi_native_env_read(void) {
    int m = atomic_load_explicit(&nbi_native_env_mode, memory_order_relaxed);
    if (m >= 0) {
        return m;
    }
    const char *v = getenv("NABLA_NATIVE");
    m = NB_NATIVE_AUTO;
    if (v != NULL) {
        if (strcmp(v, "off") == 0 || strcmp(v, "0") == 0) {
            m = NB_NATIVE_OFF;
        } else if (strcmp(v, "now") == 0 || strcmp(v, "on") == 0 || strcmp(v, "1") == 0) {
            m = NB_NATIVE_NOW;
        } else if (strcmp(v, "check") == 0) {
            m = 3;
        } else if (strcmp(v, "auto") != 0 && v[0] != '\0') {
            atomic_store_explicit(&nbi_native_env_bad, 1, memory_order_relaxed);
        }
    }
    const char *h = getenv("NABLA_NATIVE_HOT");
    long long hot = h != NULL && h[0] != '\0' ? atoll(h) : 20000;
    atomic_store_explicit(&nbi_native_hot, hot > 0 ? hot : 1, memory_order_relaxed);
    atomic_store_explicit(&nbi_native_env_mode, m, memory_order_relaxed);
    return m;
}

bool nbi_native_checking(void) {
    return nbi_native_env_read() == 3;
}

/* The mode an executable compiled for a function with option mode runs in. */
int nbi_native_resolve(int mode) {
    int env = nbi_native_env_read();
    if (mode != NB_NATIVE_AUTO) {
        return env == 3 && mode == NB_NATIVE_NOW ? NB_NATIVE_NOW : mode;
    }
    return env == 3 ? NB_NATIVE_NOW : env;
}

/* ---- the compile thread --------------------------------------------------------------- */

static pthread_mutex_t nbi_nq_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t nbi_nq_cond = PTHREAD_COND_INITIALIZER;
static nbi_native_job *nbi_nq_head, *nbi_nq_tail;
static bool nbi_nq_started;

static void nbi_job_drop(nbi_native_job *j) {
    if (atomic_fetch_sub_explicit(&j->refs, 1, memory_order_acq_rel) == 1) {
        nbi_native_unload(j->lib); /* NULL once installed */
        free(j->src);
        free(j);
    }
}

static void *nbi_native_thread(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&nbi_nq_lock);
        while (nbi_nq_head == NULL) {
            pthread_cond_wait(&nbi_nq_cond, &nbi_nq_lock);
        }
        nbi_native_job *j = nbi_nq_head;
        nbi_nq_head = j->next;
        if (nbi_nq_head == NULL) {
            nbi_nq_tail = NULL;
        }
        pthread_mutex_unlock(&nbi_nq_lock);
        if (atomic_load_explicit(&j->refs, memory_order_acquire) > 1) { /* still wanted */
            j->lib = nbi_native_load(j->src, j->len, j->why, sizeof j->why, &j->info);
        }
        atomic_store_explicit(&j->done, 1, memory_order_release);
        nbi_job_drop(j);
    }
    return NULL;
}

/* Queue j (the queue takes a reference); false if the thread cannot be started. */
static bool nbi_native_enqueue(nbi_native_job *j) {
    pthread_mutex_lock(&nbi_nq_lock);
    if (!nbi_nq_started) {
        pthread_t t;
        pthread_attr_t at;
        bool ok = pthread_attr_init(&at) == 0;
        ok = ok && pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED) == 0;
        ok = ok && pthread_create(&t, &at, nbi_native_thread, NULL) == 0;
        pthread_attr_destroy(&at);
        if (!ok) {
            pthread_mutex_unlock(&nbi_nq_lock);
            return false;
        }
        nbi_nq_started = true;
    }
    atomic_fetch_add_explicit(&j->refs, 1, memory_order_relaxed);
    j->next = NULL;
    if (nbi_nq_tail != NULL) {
        nbi_nq_tail->next = j;
    } else {
        nbi_nq_head = j;
    }
    nbi_nq_tail = j;
    pthread_cond_signal(&nbi_nq_cond);
    pthread_mutex_unlock(&nbi_nq_lock);
    return true;
}

/* ---- source and installation ---------------------------------------------------------- */

/* NABLA_NATIVE_SOURCES=<dir>: every generated source is also written there, as
 * nabla-<pid>-<n>.c (to read what the native tier compiles, loop bodies included). */
static _Atomic int nbi_native_counter;

static int nbi_native_keep_source(const char *src, size_t len) {
    int id = atomic_fetch_add(&nbi_native_counter, 1);
    const char *dir = getenv("NABLA_NATIVE_SOURCES");
    if (dir == NULL || dir[0] == '\0') {
        return id;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/nabla-%ld-%d.c", dir, (long)getpid(), id);
    FILE *f = fopen(path, "w");
    if (f != NULL) {
        fwrite(src, 1, len, f);
        fclose(f);
    }
    return id;
}

/* e's C source in new memory (malloc; the compile thread frees it). */
static char *nbi_native_source(nbi_exec *e, size_t *len) {
    /* one pass into a buffer sized from the executable (written-out code runs to about a
     * kilobyte per instruction); a second pass only when the text did not fit */
    size_t cap = 16384 + (size_t)e->n_instrs * 1536;
    char *src = malloc(cap);
    if (src == NULL) {
        return NULL;
    }
    nbi_sbuf s = nbi_sbuf_make(src, cap);
    nbi_native_codegen(e, &s);
    if (s.len >= cap) {
        size_t want = s.len + 1;
        char *big = realloc(src, want);
        if (big == NULL) {
            free(src);
            return NULL;
        }
        src = big;
        s = nbi_sbuf_make(src, want);
        nbi_native_codegen(e, &s);
    }
    *len = s.len;
    e->native->source_id = nbi_native_keep_source(src, s.len);
    return src;
}

static void nbi_native_fail(nbi_exec *e, const char *why) {
    e->native->state = NBI_NSTATE_FAILED;
    nbi_log(e->ctx, NB_LOG_LEVEL_WARN,
            "native tier: an executable of %d instructions stays "
            "interpreted: %s",
            (int)e->n_instrs, why);
}

/* env: the environment of executable x's code, with its node and kernel tables (n_nodes
 * entries each) filled. */
static void nbi_native_env_fill(nbi_native_env *env, const nbi_exec *x, const void **nodes,
                                nbi_kernel_fn *kerns, const nbi_native_env *sub) {
    for (int32_t i = 0; i < x->n_nodes; i++) {
        nodes[i] = &x->nodes[i];
        kerns[i] = nbi_op_get((nbi_op)x->nodes[i].op)->kernel;
    }
    env->ws = x->ws;
    env->scratch = x->ws + x->scratch_off;
    env->pool = x->pool;
    env->n_workers = x->n_workers;
    env->node = nodes;
    env->kern = kerns;
    env->vm = nbi_vmath_get();
    env->par = nbi_par_range;
    env->sub = sub;
    env->exec = x;
    env->plan = nbi_exec_plan_io;
    env->copy = nbi_exec_copy_out;
    env->loop_reverse = nbi_loop_reverse_run;
}

/* The environments of the functions of e's loops in its file (codegen.c's order), when it
 * has loops: one block, the environments, then each one's node and kernel tables. */
static nb_status nbi_native_subenv(nbi_exec *e, struct nbi_native *n) {
    const nbi_exec *subs[NBI_NATIVE_MAX_SUBS];
    int32_t n_sub = nbi_native_subs(e, subs, NBI_NATIVE_MAX_SUBS);
    if (n->subenv != NULL || n_sub <= 0) {
        return NB_OK;
    }
    size_t bytes = (size_t)n_sub * sizeof(nbi_native_env);
    for (int32_t k = 0; k < n_sub; k++) {
        bytes += (size_t)subs[k]->n_nodes * sizeof(void *) * 2;
    }
    n->subenv = nbi_alloc(e->ctx, bytes, 16);
    if (n->subenv == NULL) {
        return nbi_oom(e->ctx, "nb_fn_call", bytes);
    }
    n->sub_bytes = bytes;
    const void **tab = (const void **)(n->subenv + n_sub);
    for (int32_t k = 0; k < n_sub; k++) {
        int32_t nn = subs[k]->n_nodes;
        nbi_native_env_fill(&n->subenv[k], subs[k], tab, (nbi_kernel_fn *)(tab + nn), n->subenv);
        tab += 2 * (size_t)nn;
    }
    return NB_OK;
}

/* Install lib's nbx_run on e (the context's thread). */
static void nbi_native_install(nbi_exec *e, nbi_native_lib *lib) {
    struct nbi_native *n = e->native;
    nbi_native_fn fn = (nbi_native_fn)(uintptr_t)nbi_native_sym(lib, "nbx_run");
    if (fn == NULL) {
        nbi_native_unload(lib);
        nbi_native_fail(e, "the compiled library has no nbx_run");
        return;
    }
    nbi_native_env_fill(&n->env, e, n->nodes, n->kerns, n->subenv);
    n->lib = lib;
    n->state = NBI_NSTATE_READY;
    e->native_fn = fn;
}

/* Compile e now, on this thread. */
static void nbi_native_compile_now(nbi_exec *e) {
    size_t len = 0;
    char *src = nbi_native_source(e, &len);
    if (src == NULL) {
        nbi_native_fail(e, "out of memory generating its source");
        return;
    }
    char why[512] = "";
    nbi_native_lib *lib = nbi_native_load(src, len, why, sizeof why, NULL);
    free(src);
    if (lib == NULL) {
        nbi_native_fail(e, why);
        return;
    }
    nbi_native_install(e, lib);
}

static nb_status nbi_native_attach_in(nbi_exec *e, int mode, bool inlined);

/* Attach e's callees. A loop's executables written into e's own file (nbi_native_subs) are
 * compiled on their own only once hot -- while e still runs interpreted, or if e's compile
 * fails -- and not looked up in the disk cache at the first call: e's code runs them. */
static nb_status nbi_native_callees(nbi_exec *e, int mode) {
    nb_status st = NB_OK;
    for (int32_t i = 0; i < e->n_nodes && st == NB_OK; i++) {
        const nb_var *v = &e->nodes[i];
        if (v->op == NBI_OP_CALL) {
            st = nbi_native_attach(v->at.callee, mode);
        } else if (v->op == NBI_OP_WHILE || v->op == NBI_OP_LOOP_REVERSE) {
            bool inl = nbi_native_loop_inlined(e, v);
            st = nbi_native_attach_in(v->at.callee, mode, inl);
            if (st == NB_OK) {
                st = nbi_native_attach_in(v->at.callee2, mode, inl);
            }
            if (st == NB_OK && v->at.callee3 != NULL) {
                st = nbi_native_attach_in(v->at.callee3, mode, inl);
            }
        }
    }
    return st;
}

static _Thread_local bool nbi_interp_only;
static _Thread_local bool nbi_shadow; /* check mode: the native run beside the interpreter */

bool nbi_native_shadow_run(void) {
    return nbi_shadow;
}

bool nbi_native_set_interp_only(bool on) {
    bool was = nbi_interp_only;
    nbi_interp_only = on;
    return was;
}

bool nbi_native_interp_only(void) {
    return nbi_interp_only;
}

bool nbi_exec_native(const nbi_exec *e) {
    return e->native_fn != NULL && !nbi_interp_only;
}

nb_status nbi_native_format(nb_ctx *ctx, const nbi_graph *g, nbi_sbuf *s) {
    nbi_exec *e = NULL;
    nb_status st = nbi_exec_compile(ctx, g, 0, &e);
    if (st == NB_OK) {
        nbi_native_codegen(e, s);
        nbi_exec_destroy(e);
    }
    return st;
}

nb_status nbi_native_attach(nbi_exec *e, int mode) {
    return nbi_native_attach_in(e, mode, false);
}

static nb_status nbi_native_attach_in(nbi_exec *e, int mode, bool inlined) {
    mode = nbi_native_resolve(mode);
    if (inlined && mode != NB_NATIVE_OFF) {
        mode = NB_NATIVE_AUTO; /* compiled alone only once hot (nbi_native_callees) */
    }
    int bad = 1;
    if (e != NULL && atomic_compare_exchange_strong(&nbi_native_env_bad, &bad, 2)) {
        nbi_log(e->ctx, NB_LOG_LEVEL_WARN,
                "NABLA_NATIVE='%s' is none of off, auto, now, check: auto is used",
                getenv("NABLA_NATIVE") ? getenv("NABLA_NATIVE") : "");
    }
    if (e == NULL || e->debug != 0 || mode == NB_NATIVE_OFF || e->n_instrs == 0) {
        return NB_OK;
    }
    if (e->native != NULL && (e->native->mode == NB_NATIVE_NOW || mode == NB_NATIVE_AUTO)) {
        return NB_OK; /* attached already, at least as eagerly */
    }
    nb_status st = nbi_native_callees(e, mode); /* first: e is attached once they all are */
    if (st != NB_OK) {
        return st;
    }
    if (e->native == NULL) {
        size_t bytes = sizeof(struct nbi_native) + (size_t)e->n_nodes * sizeof(void *) * 2;
        struct nbi_native *n = nbi_alloc(e->ctx, bytes, 16);
        if (n == NULL) {
            return nbi_oom(e->ctx, "nb_fn_call", bytes);
        }
        memset(n, 0, sizeof *n);
        n->bytes = bytes;
        n->nodes = (const void **)(n + 1);
        n->kerns = (nbi_kernel_fn *)(n->nodes + e->n_nodes);
        n->mode = mode;
        n->looked_up = inlined; /* no first-call lookup for a loop's function */
        e->native = n;
    }
    struct nbi_native *n = e->native;
    st = nbi_native_subenv(e, n);
    if (st != NB_OK) {
        n->state = NBI_NSTATE_FAILED; /* its code would need the environments: interpreted */
        return st;
    }
    if (n->state == NBI_NSTATE_NONE && e->n_instrs > NBI_NATIVE_MAX_INSTRS) {
        n->state = NBI_NSTATE_FAILED; /* the compiler would take too long: interpreted */
        nbi_log(e->ctx, NB_LOG_LEVEL_INFO,
                "native tier: an executable of %d instructions stays interpreted (more than "
                "%d)",
                (int)e->n_instrs, NBI_NATIVE_MAX_INSTRS);
        return NB_OK;
    }
    if (mode == NB_NATIVE_AUTO && n->state == NBI_NSTATE_NONE && !n->looked_up &&
        e->n_instrs <= NBI_NATIVE_LOOKUP_INSTRS) {
        /* a warm disk cache gives native code from the first call, compiling nothing (for
         * small executables: writing and hashing the C of a large one would slow the first
         * call; it is compiled, or found in the cache, once hot) */
        n->looked_up = true;
        size_t len = 0;
        char *src = nbi_native_source(e, &len);
        char why[256];
        nbi_native_lib *lib =
            src != NULL ? nbi_native_load_cached(src, len, why, sizeof why, NULL) : NULL;
        free(src);
        if (lib != NULL) {
            nbi_native_install(e, lib);
        }
    }
    if (mode == NB_NATIVE_NOW && n->state != NBI_NSTATE_READY && n->state != NBI_NSTATE_FAILED) {
        n->mode = NB_NATIVE_NOW;
        if (n->job != NULL) { /* a background compile is under way: wait for it */
            while (!atomic_load_explicit(&n->job->done, memory_order_acquire)) {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
            }
            nbi_native_tick(e);
        } else {
            nbi_native_compile_now(e);
        }
    }
    return NB_OK;
}

void nbi_native_tick(nbi_exec *e) {
    struct nbi_native *n = e->native;
    if (n->state == NBI_NSTATE_QUEUED) {
        nbi_native_job *j = n->job;
        if (!atomic_load_explicit(&j->done, memory_order_acquire)) {
            return;
        }
        n->job = NULL;
        if (j->lib != NULL) {
            nbi_native_lib *lib = j->lib;
            j->lib = NULL;
            nbi_native_install(e, lib);
        } else {
            nbi_native_fail(e, j->why[0] ? j->why : "the compile was abandoned");
        }
        nbi_job_drop(j);
        return;
    }
    if (n->state != NBI_NSTATE_NONE) {
        return;
    }
    n->weight += e->n_instrs > 0 ? e->n_instrs : 1;
    if (n->weight < atomic_load_explicit(&nbi_native_hot, memory_order_relaxed)) {
        return;
    }
    nbi_native_job *j = calloc(1, sizeof *j);
    if (j != NULL) {
        j->src = nbi_native_source(e, &j->len);
    }
    if (j == NULL || j->src == NULL) {
        free(j);
        nbi_native_fail(e, "out of memory generating its source");
        return;
    }
    atomic_init(&j->refs, 1);
    atomic_init(&j->done, 0);
    if (!nbi_native_enqueue(j)) {
        nbi_job_drop(j);
        nbi_native_fail(e, "the compile thread could not be started");
        return;
    }
    n->job = j;
    n->state = NBI_NSTATE_QUEUED;
}

void nbi_native_release(nbi_exec *e) {
    struct nbi_native *n = e->native;
    if (n == NULL) {
        return;
    }
    if (n->job != NULL) {
        nbi_job_drop(n->job);
    }
    e->native_fn = NULL;
    nbi_native_unload(n->lib);
    if (n->subenv != NULL) {
        nbi_free(e->ctx, n->subenv, n->sub_bytes);
    }
    nbi_free(e->ctx, n, n->bytes);
    e->native = NULL;
}

/* ---- running -------------------------------------------------------------------------- */

void nbi_native_run(const nbi_exec *e, const void *const *inputs, void *const *outputs) {
    e->native_fn(&e->native->env, inputs, outputs, e->out_direct);
}

/* Is a == b for n elements of dtype d, NaN matching NaN? The first differing element or
 * -1. One memcmp of the whole buffers first: a loop's body runs once per step with its
 * carry (a checkpoint tape or kept states of max_steps rows) among its outputs, and an
 * element-by-element comparison of that made the native check of the stiff solvers'
 * gradients 90% comparison. */
static int64_t nbi_native_diff(nb_dtype d, const void *a, const void *b, int64_t n) {
    if (n <= 0 || memcmp(a, b, (size_t)n * nbi_dsize(d)) == 0) {
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        if (d == NB_DTYPE_F32) {
            float x = ((const float *)a)[i], y = ((const float *)b)[i];
            if (memcmp(&x, &y, 4) != 0 && !(x != x && y != y)) {
                return i;
            }
        } else if (d == NB_DTYPE_F64) {
            double x = ((const double *)a)[i], y = ((const double *)b)[i];
            if (memcmp(&x, &y, 8) != 0 && !(x != x && y != y)) {
                return i;
            }
        } else {
            size_t es = nbi_dsize(d);
            if (memcmp((const unsigned char *)a + (size_t)i * es,
                       (const unsigned char *)b + (size_t)i * es, es) != 0) {
                return i;
            }
        }
    }
    return -1;
}

void *nbi_native_check_begin(const nbi_exec *e, const void *const *inputs) {
    /* native first, into fresh buffers (inputs are only read), then the interpreter */
    size_t total = 0;
    for (int32_t i = 0; i < e->n_outputs; i++) {
        const nb_var *o = &e->nodes[e->outputs[i]];
        total += nbi_leaf_bytes(o);
    }
    size_t head = ((size_t)e->n_outputs * (sizeof(void *) + sizeof(bool)) + 63) / 64 * 64;
    unsigned char *mem = aligned_alloc(64, head + total + 64);
    if (mem == NULL) {
        return NULL;
    }
    void **outs = (void **)mem;
    bool *direct = (bool *)(outs + e->n_outputs);
    unsigned char *p = mem + head;
    for (int32_t i = 0; i < e->n_outputs; i++) {
        const nb_var *o = &e->nodes[e->outputs[i]];
        outs[i] = p;
        direct[i] = e->out_first[i] == i;
        p += ((size_t)o->size * nbi_dsize(o->dtype) + 63) / 64 * 64;
    }
    bool was = nbi_shadow;
    nbi_shadow = true;
    e->native_fn(&e->native->env, inputs, (void *const *)outs, direct);
    nbi_shadow = was;
    for (int32_t i = 0; i < e->n_outputs; i++) {
        const nb_var *o = &e->nodes[e->outputs[i]];
        if (!direct[i]) {
            memcpy(outs[i], outs[e->out_first[i]], (size_t)o->size * nbi_dsize(o->dtype));
        }
    }
    return mem;
}

void nbi_native_check_end(const nbi_exec *e, void *mem, void *const *outputs) {
    if (mem == NULL) {
        return;
    }
    void **outs = mem;
    for (int32_t i = 0; i < e->n_outputs; i++) {
        const nb_var *o = &e->nodes[e->outputs[i]];
        int64_t at = nbi_native_diff(o->dtype, outs[i], outputs[i], o->size);
        if (at >= 0) {
            char msg[512], sig[NBI_SIG_CAP];
            snprintf(msg, sizeof msg,
                     "nb_fn_call: NABLA_NATIVE=check: the native tier and the interpreter "
                     "differ at output %d (%s, made by %s) element %lld of an executable "
                     "of %d instructions (its C: source %d of process %ld, kept by "
                     "NABLA_NATIVE_SOURCES=<dir>)",
                     (int)i, nbi_var_sig(sig, sizeof sig, o), nbi_op_name((nbi_op)o->op),
                     (long long)at, (int)e->n_instrs, e->native->source_id, (long)getpid());
            fprintf(stderr, "nabla: %s\n", msg);
            nbi_check_fail_text(msg);
            break;
        }
    }
    free(mem);
}

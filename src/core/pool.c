/*
 * pool.c -- a persistent thread pool per context.
 *
 * Work is handed over as n tasks with fixed boundaries chosen by the caller from the data
 * alone (never from the number of threads); threads, the caller included, claim task
 * indices from an atomic counter. Which thread runs a task never changes what it computes,
 * and every task writes its own part of the output, so results are bit-identical for any
 * thread count. Partial results that must be combined (reductions) are combined by the
 * caller in task order after the run.
 *
 * The pool is created with the context's first executable (compiling may allocate; running
 * must not). If the system refuses a thread, the pool runs with the threads it got -- the
 * results are the same.
 */
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

struct nbi_pool {
    nb_ctx *ctx;
    int n_workers;   /* threads besides the caller that were started */
    int cap_threads; /* entries allocated in threads */
    pthread_t *threads;
    struct nbi_worker_arg *args; /* one per thread, inside the threads allocation */
    pthread_mutex_t mu;
    pthread_cond_t wake;
    int sleepers;                    /* workers waiting on wake (under mu) */
    atomic_uint_fast64_t generation; /* bumped for each job (release) */
    atomic_bool stop;
    /* the current job: written before generation is bumped */
    nbi_task_fn fn;
    void *ud;
    int64_t n_tasks;
    atomic_llong next;
    atomic_int busy; /* workers still inside the current job */
};

/* Spinning before sleeping: a training step runs dozens of parallel regions back to back,
 * and waking a sleeping thread through the kernel costs more than most of them. */
#define NBI_SPIN 20000

static inline void nbi_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void nbi_pool_drain(nbi_pool *p, int worker) {
    for (;;) {
        int64_t t = (int64_t)atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->n_tasks) {
            return;
        }
        p->fn(p->ud, t, worker);
    }
}

typedef struct nbi_worker_arg {
    nbi_pool *pool;
    int index;
} nbi_worker_arg;

static void *nbi_pool_worker(void *arg) {
    nbi_worker_arg *wa = arg;
    nbi_pool *p = wa->pool;
    int index = wa->index;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = atomic_load_explicit(&p->generation, memory_order_acquire);
        for (int i = 0; g == seen && i < NBI_SPIN; i++) {
            nbi_cpu_relax();
            g = atomic_load_explicit(&p->generation, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            p->sleepers++;
            while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
                   !atomic_load(&p->stop)) {
                pthread_cond_wait(&p->wake, &p->mu);
            }
            p->sleepers--;
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) {
            return NULL;
        }
        seen = g;
        nbi_pool_drain(p, index);
        atomic_fetch_sub_explicit(&p->busy, 1, memory_order_release);
    }
}

nb_status nbi_pool_create(nb_ctx *ctx, int n_threads, nbi_pool **out) {
    *out = NULL;
    nbi_pool *p = nbi_alloc(ctx, sizeof *p, 64);
    if (p == NULL) {
        return nbi_oom(ctx, "thread pool", sizeof *p);
    }
    memset(p, 0, sizeof *p);
    p->ctx = ctx;
    int want = n_threads > 1 ? n_threads - 1 : 0;
    p->cap_threads = want;
    if (want > 0) {
        p->threads =
            nbi_alloc(ctx, (size_t)want * (sizeof(pthread_t) + sizeof(nbi_worker_arg)), 16);
        if (p->threads == NULL) {
            nbi_free(ctx, p, sizeof *p);
            return nbi_oom(ctx, "thread pool", (size_t)want * sizeof(pthread_t));
        }
        p->args = (nbi_worker_arg *)(p->threads + want);
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->next, 0);
    atomic_init(&p->busy, 0);
    for (int i = 0; i < want; i++) {
        p->args[p->n_workers].pool = p;
        p->args[p->n_workers].index = p->n_workers + 1;
        if (pthread_create(&p->threads[p->n_workers], NULL, nbi_pool_worker,
                           &p->args[p->n_workers]) != 0) {
            nbi_log(ctx, NB_LOG_LEVEL_WARN,
                    "thread pool: started %d of %d worker threads (the system refused more); "
                    "results are unchanged, only slower",
                    p->n_workers, want);
            break;
        }
        p->n_workers++;
    }
    *out = p;
    return NB_OK;
}

void nbi_pool_destroy(nbi_pool *p) {
    if (p == NULL) {
        return;
    }
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_workers; i++) {
        pthread_join(p->threads[i], NULL);
    }
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    nb_ctx *ctx = p->ctx;
    if (p->threads != NULL) {
        nbi_free(ctx, p->threads,
                 (size_t)p->cap_threads * (sizeof(pthread_t) + sizeof(nbi_worker_arg)));
    }
    nbi_free(ctx, p, sizeof *p);
}

void nbi_pool_run(nbi_pool *p, int64_t n_tasks, nbi_task_fn fn, void *ud) {
    if (p == NULL || p->n_workers == 0 || n_tasks <= 1) {
        for (int64_t t = 0; t < n_tasks; t++) {
            fn(ud, t, 0);
        }
        return;
    }
    p->fn = fn;
    p->ud = ud;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->busy, p->n_workers, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_mutex_lock(&p->mu); /* wake sleepers; a spinning worker sees the bump itself */
    if (p->sleepers > 0) {
        pthread_cond_broadcast(&p->wake);
    }
    pthread_mutex_unlock(&p->mu);
    nbi_pool_drain(p, 0); /* the caller works too */
    for (unsigned i = 0; atomic_load_explicit(&p->busy, memory_order_acquire) > 0; i++) {
        if (i < NBI_SPIN) {
            nbi_cpu_relax();
        } else {
            sched_yield();
        }
    }
}

int nbi_pool_threads(const nbi_pool *p) {
    return p == NULL ? 1 : p->n_workers + 1;
}

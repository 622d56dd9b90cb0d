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
    atomic_int sleepers; /* workers waiting on wake (changed under mu) */
    atomic_bool stop;
    /* The current job. A task is claimed by advancing ticket = (job << 32) | next task
     * with a compare-and-swap, so a worker that read an older job's ticket can never claim
     * a task of a newer one: it would run the newer job's tasks with the older job's fn.
     * fn, ud and n_tasks are written (release) before the job's first ticket is published
     * and stay until every task of the job is done (nbi_pool_drain). */
    _Atomic(nbi_task_fn) fn;
    _Atomic(void *) ud;
    atomic_llong n_tasks;
    atomic_uint_fast64_t ticket;
    atomic_llong done; /* tasks of the current job finished */
};

/* Spinning before sleeping: a training step runs dozens of parallel regions back to back,
 * and waking a sleeping thread through the kernel costs more than most of them. Spinning
 * yields the core every NBI_YIELD_EVERY rounds, so that with more threads than free cores
 * (another job on the machine, several contexts) a spinning worker does not keep the
 * threads that have work off the CPU. */
#define NBI_SPIN 20000
#define NBI_YIELD_EVERY 256

static inline void nbi_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claim and run tasks of job `job` until none is left (or a newer job has started). The
 * caller of the job waits for the tasks to be done, not for the threads: a worker that
 * is slow to wake (descheduled, oversubscribed) finds the tasks taken by the threads that
 * were running and goes back to waiting -- it never holds the job up. */
static void nbi_pool_drain(nbi_pool *p, uint64_t job, int worker) {
    uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
    for (;;) {
        if ((t >> 32) != job) {
            return; /* a newer job: its own wake-up brings this thread back */
        }
        /* Acquire: had these been the next job's (stored, with release, only after every
         * task of this one was done), the claim below would see a moved ticket and fail. */
        nbi_task_fn fn = atomic_load_explicit(&p->fn, memory_order_acquire);
        void *ud = atomic_load_explicit(&p->ud, memory_order_acquire);
        int64_t n = atomic_load_explicit(&p->n_tasks, memory_order_acquire);
        if ((int64_t)(t & 0xffffffffu) >= n) {
            return; /* every task of this job is taken */
        }
        if (!atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acquire,
                                                   memory_order_acquire)) {
            continue; /* t was reloaded */
        }
        fn(ud, (int64_t)(t & 0xffffffffu), worker);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        t++;
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
    uint64_t seen = 0; /* the last job this worker looked at */
    for (;;) {
        uint64_t job = atomic_load_explicit(&p->ticket, memory_order_acquire) >> 32;
        for (int i = 1; job == seen && i <= NBI_SPIN; i++) {
            if (i % NBI_YIELD_EVERY == 0) {
                sched_yield();
            } else {
                nbi_cpu_relax();
            }
            job = atomic_load_explicit(&p->ticket, memory_order_acquire) >> 32;
        }
        if (job == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1); /* seq_cst: see nbi_pool_run */
            while ((job = atomic_load(&p->ticket) >> 32) == seen && !atomic_load(&p->stop)) {
                pthread_cond_wait(&p->wake, &p->mu);
            }
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) {
            return NULL;
        }
        seen = job;
        nbi_pool_drain(p, job, index);
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
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->fn, (nbi_task_fn)NULL);
    atomic_init(&p->ud, (void *)NULL);
    atomic_init(&p->n_tasks, 0);
    atomic_init(&p->ticket, 0);
    atomic_init(&p->done, 0);
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
    if (p == NULL || p->n_workers == 0 || n_tasks <= 1 || n_tasks > (int64_t)UINT32_MAX) {
        for (int64_t t = 0; t < n_tasks; t++) {
            fn(ud, t, 0);
        }
        return;
    }
    /* No task of the previous job is outstanding (it returned when all were done), so the
     * job can be replaced; workers still looking at the previous job's ticket cannot claim
     * from this one. */
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->fn, fn, memory_order_release);
    atomic_store_explicit(&p->ud, ud, memory_order_release);
    atomic_store_explicit(&p->n_tasks, n_tasks, memory_order_release);
    /* job numbers are 32 bits and wrap (after 2^32 jobs) -- never into the task half */
    uint64_t job =
        ((atomic_load_explicit(&p->ticket, memory_order_relaxed) >> 32) + 1) & 0xffffffffu;
    /* seq_cst store, then the seq_cst load of sleepers: a worker increments sleepers before
     * its last look at the ticket, so either it sees this job or it is counted and woken. */
    atomic_store(&p->ticket, job << 32);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    nbi_pool_drain(p, job, 0); /* the caller works too */
    /* Wait for the tasks others claimed; yield the core while waiting, so that a claimed
     * task on a descheduled thread gets it back sooner. */
    for (unsigned i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks; i++) {
        if (i < 64) {
            nbi_cpu_relax();
        } else {
            sched_yield();
        }
    }
}

int nbi_pool_threads(const nbi_pool *p) {
    return p == NULL ? 1 : p->n_workers + 1;
}

/*
 * nabla/dist.h -- past one machine: collectives on pytrees over MPI, and data-parallel
 * training whose results are the same bits for any number of processes.
 *
 * An optional component: libnabla_dist (CMake: find_package(nabla COMPONENTS dist),
 * target nabla::dist; pkg-config: nabla-dist), built when CMake finds MPI. The core library
 * has no MPI dependency. Programs run under mpirun:
 *
 *     mpirun -np 4 ./train
 *
 * Determinism. A sum over processes normally depends on how many there are: MPI_Allreduce
 * (and PyTorch DDP, JAX's psum) associate the terms by the world size. nabla fixes the
 * association by the *parts* instead: a global batch is cut into n_parts micro-batches (a
 * number fixed by the batch, not by the processes), each process computes its parts
 * (nb_dist_parts: a contiguous block), and nb_dist_reduce_parts adds the parts' trees in
 * one fixed binary tree over 0 .. n_parts - 1: node [lo, hi) = node [lo, mid) + node [mid,
 * hi), mid = lo + (hi - lo) / 2. Each process adds the largest nodes inside its own block;
 * then every element's sum is completed by the process owning that slice of the vector
 * (nodes exchanged with MPI_Alltoallv, slices joined with MPI_Allgatherv), always in the
 * same tree. The result is bit for bit the one a single process adding the n_parts trees in
 * that tree gets, for 1, 2, 3 ... n_parts processes. Traffic per process and call: the
 * vector once out and once in, times (1 + the number of nodes of a block: at most
 * 2 log2(n_parts)) / size -- see docs/distributed.md for the cost model.
 *
 * Trees. Collectives take pytrees (nabla/tree.h) of arrays: null slots (a frozen
 * parameter's gradient) are skipped and stay null; static leaves are kept; leaves may mix
 * dtypes (each is reduced in its own dtype; integers wrap as unsigned, exactly). Every
 * process must pass trees of the same structure, dtypes and shapes: a difference is
 * NB_ERR_STRUCTURE on every process, naming the first leaf path that differs and both
 * processes' signatures of it.
 *
 * Failures. The communicator is duplicated (nabla's messages never mix with the caller's)
 * and set to MPI_ERRORS_RETURN; an MPI error is NB_ERR_COMM with MPI's message. Every
 * collective is non-blocking underneath and waited for with a timeout (opts.timeout_s,
 * default 600 s, or the environment's NABLA_DIST_TIMEOUT): a process that died or stopped
 * calling collectives makes the others fail with NB_ERR_COMM naming the call, the rank and
 * the wait -- never a hang without end. (Open MPI's mpirun by default kills every process
 * when one dies; with `mpirun --enable-recovery` the survivors run on and get this error.)
 * After an MPI error or a timeout (NB_ERR_COMM whose message says the nb_dist is unusable)
 * every later call fails: destroy it and exit without further MPI calls (a collective left
 * pending may still write into its buffers). Outputs are written only
 * on success: nothing half-reduced is ever returned. A failure on one process before the
 * data moves (a NULL tree, a leaf that is a var, a bad op or root, buffers it cannot
 * allocate, an error in its loss) fails the call on every process at once: that process
 * gets its own error, the others NB_ERR_COMM naming its rank. (A small allocation failing
 * on one process alone inside an exchange leaves the others to the timeout.)
 *
 * Memory. Through the context's allocator (nb_ctx_alloc); the reduction's buffers (the
 * vector a few times over: its partial sums and a row per level of the tree) are kept
 * between calls and returned by nb_dist_destroy, which must come before nb_ctx_destroy.
 *
 * Every process must make the same call: the trees, and the call's arguments (n_parts,
 * op, root, a training step's micro-batch size) are checked equal, and a difference fails
 * everywhere with a message naming it.
 *
 * Threads. One thread at a time per nb_dist (MPI_THREAD_FUNNELED is enough); the arrays'
 * own computations use the context's threads as ever.
 */
#ifndef NABLA_DIST_H
#define NABLA_DIST_H

#include <mpi.h>

#include "core.h"
#include "fn.h"
#include "io.h"
#include "train.h"
#include "tree.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_dist nb_dist;

typedef struct nb_dist_opts {
    /* Seconds a collective may wait for the other processes before it fails with
     * NB_ERR_COMM. Default: NABLA_DIST_TIMEOUT from the environment if set (seconds, > 0),
     * else 600. <= 0: wait without end. */
    double timeout_s;
} nb_dist_opts;

NB_API nb_dist_opts nb_dist_opts_default(void);

/* A handle on the processes of comm (MPI_COMM_WORLD, or any intra-communicator; MPI_COMM_NULL
 * means MPI_COMM_WORLD), which is duplicated. If MPI is not initialized yet, this
 * initializes it (MPI_Init_thread, MPI_THREAD_FUNNELED) and nb_dist_destroy finalizes it.
 * A collective call: every process of comm must make it. Errors (recorded on ctx):
 * NB_ERR_MISUSE (NULL ctx or out), NB_ERR_COMM (MPI failed), NB_ERR_OOM. */
NB_API nb_status nb_dist_create(nb_ctx *ctx, MPI_Comm comm, const nb_dist_opts *opts,
                                nb_dist **out);
/* Free the handle (its duplicated communicator), and finalize MPI if nb_dist_create
 * initialized it and no collective failed (with several handles, destroy that one last) (after
 * NB_ERR_COMM MPI is left as it is: the process should exit). NULL is a no-op. A collective call
 * unless a collective failed. */
NB_API void nb_dist_destroy(nb_dist *d);
/* This process's rank, 0 <= rank < size; the number of processes. -1 for NULL. */
NB_API int nb_dist_rank(const nb_dist *d);
NB_API int nb_dist_size(const nb_dist *d);
/* The context the handle reports errors on. */
NB_API nb_ctx *nb_dist_ctx(const nb_dist *d);

typedef enum nb_dist_op {
    NB_DIST_SUM = 0, /* the sum */
    NB_DIST_MEAN = 1 /* the sum divided by the number of terms (float leaves only) */
} nb_dist_op;

/* Parts: the block of n_parts this process owns -- parts first .. first + count - 1, with
 * first = floor(rank * n_parts / size) -- so each process gets n_parts / size parts, give
 * or take one, consecutive. For n_parts >= size every process has at least one. Returns
 * NB_OK, NB_ERR_MISUSE (NULL), NB_ERR_INVALID (n_parts < size). */
NB_API nb_status nb_dist_parts(const nb_dist *d, int64_t n_parts, int64_t *first, int64_t *count);

/* The reduction of n_parts trees over all processes, in the fixed tree above: local[i]
 * is part first + i of this process's block (nb_dist_parts; count trees). *out (a new tree
 * of local[0]'s structure, on every process) holds, per array leaf, the sum over all
 * n_parts parts -- or the sum divided by n_parts for NB_DIST_MEAN (which refuses an integer
 * leaf with NB_ERR_DTYPE naming it). The same bits for any number of processes.
 * Errors: NB_ERR_MISUSE, NB_ERR_INVALID (n_parts < size, op unknown), NB_ERR_KIND (a leaf
 * that is a traced var), NB_ERR_STRUCTURE (trees that differ, here or between processes),
 * NB_ERR_DTYPE, NB_ERR_COMM, NB_ERR_OOM; *out is NULL then. A collective call. */
NB_API nb_status nb_dist_reduce_parts(nb_dist *d, int64_t n_parts, const nb_tree *const *local,
                                      nb_dist_op op, nb_tree **out);

/* All-reduce: the sum (or mean) of t over the processes, rank 0's term first -- the
 * reduction above with one part per process. The same bits on every process (for a given
 * number of processes). Errors as nb_dist_reduce_parts. A collective call. */
NB_API nb_status nb_dist_allreduce(nb_dist *d, const nb_tree *t, nb_dist_op op, nb_tree **out);

/* Broadcast: root's array data written into every other process's arrays of t, in place
 * (same structure, dtypes and shapes everywhere, checked first; nulls and static leaves
 * untouched). Parameters and optimizer state from rank 0. Errors: NB_ERR_MISUSE,
 * NB_ERR_INVALID (root out of range), NB_ERR_STRUCTURE, NB_ERR_COMM (nothing written then).
 * A collective call. */
NB_API nb_status nb_dist_broadcast(nb_dist *d, nb_tree *t, int root);

/* All-gather: *out has t's structure with every array leaf stacked over the processes: a
 * leaf of shape S becomes [size, S...], row r rank r's (metrics of every process). Errors
 * as nb_dist_broadcast. A collective call. */
NB_API nb_status nb_dist_allgather(nb_dist *d, const nb_tree *t, nb_tree **out);

/* Wait until every process has called it (with the timeout). NB_OK or NB_ERR_COMM. */
NB_API nb_status nb_dist_barrier(nb_dist *d);

/* A training checkpoint (nabla/io.h nb_checkpoint_save) written by rank 0 alone, atomically,
 * while the others wait; rank 0's status (and message) reaches every process, so a failed
 * write fails everywhere and nothing half-written is left. Every process resumes by reading
 * the file itself (nb_checkpoint_load; a file system all processes see), on any number of
 * processes. A collective call. */
NB_API nb_status nb_dist_checkpoint_save(nb_dist *d, const char *path, const nb_tree *params,
                                         const nb_tree *opt_state, const nb_array *key,
                                         int64_t step);

/* ---- data-parallel training --------------------------------------------------------- */
/* A training step over processes whose parameters are the same bits for any number of
 * processes (1 .. n_parts):
 *
 *     nb_dist_train_create(d, loss, opt, NULL, 8, &tr);     // 8 micro-batches per step
 *     nb_dist_train_init(tr, &params, &state);              // rank 0's params everywhere
 *     for (...) {
 *         nb_dist_parts(d, 8, &first, &count);
 *         (this process's rows: micro-batches first .. first + count - 1 of the step's
 *          global batch, i.e. rows first * m .. (first + count) * m - 1, m = B / 8;
 *          nb_batcher_next_rows reads just those, from a batcher with drop_last -- the
 *          default -- so that every step is a whole global batch on every process)
 *         nb_dist_train_run(tr, &params, &state, local_batch, &loss, NULL);
 *     }
 *
 * Each step: for every local micro-batch (the local batch's rows cut into count equal
 * slices), (loss_j[, aux_j]), g_j = jit(value_and_grad(loss))(params, *batch_j); then
 * (loss, aux, g) = nb_dist_reduce_parts over the n_parts micro-batches (sums), loss and g
 * divided by n_parts (the gradient of the global batch's mean loss when the loss is a mean
 * over its rows), aux left a sum; then the optimizer's update and apply_updates, jitted,
 * params and state donated (opts->donate) -- on every process, on the same bits, so the
 * parameters stay identical without a broadcast. opts as nb_train_step (has_aux,
 * filter_spec, donate, jit). */
typedef struct nb_dist_train nb_dist_train;

NB_API nb_status nb_dist_train_create(nb_dist *d, nb_fn *loss, const nb_tree *opt,
                                      const nb_train_opts *opts, int64_t n_parts,
                                      nb_dist_train **out);
NB_API void nb_dist_train_destroy(nb_dist_train *t);
/* Broadcast *params from rank 0 into every process's (in place), then *state =
 * nb_optim_init(opt, nb_grad_template(params, filter_spec)). A collective call. */
NB_API nb_status nb_dist_train_init(nb_dist_train *t, nb_tree **params, nb_tree **state);
/* One step (above). local_batch: a tree whose array leaves all have count * m rows (axis 0)
 * for this process's count micro-batches (a tuple or list is spread into the loss's
 * arguments, as nb_train_run). *params and *state are replaced on success (left as they
 * were on failure); loss (may be NULL) receives the global batch's mean loss; aux (may be
 * NULL; only with has_aux) the summed aux. A collective call. */
NB_API nb_status nb_dist_train_run(nb_dist_train *t, nb_tree **params, nb_tree **state,
                                   const nb_tree *local_batch, double *loss, nb_tree **aux);
/* The step's compiled functions' counters (nabla/fn.h): grad (may be NULL) those of
 * jit(value_and_grad(loss)), run once per micro-batch; update (may be NULL) the jitted
 * optimizer update's, run once per step. n_traces 1 each: nothing retraced. */
NB_API nb_status nb_dist_train_stats(const nb_dist_train *t, nb_fn_stats *grad,
                                     nb_fn_stats *update);

/* Communication counters of a handle: the MPI operations waited for (a collective is one to
 * a few: the trees' check, then one or two per dtype), the seconds spent waiting in them,
 * and the bytes this process sent and received (payload, as handed to MPI). */
typedef struct nb_dist_stats {
    int64_t calls;
    double wait_s;
    int64_t bytes_sent, bytes_received;
} nb_dist_stats;

NB_API nb_status nb_dist_stats_get(const nb_dist *d, nb_dist_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* NABLA_DIST_H */

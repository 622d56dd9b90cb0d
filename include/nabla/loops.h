/*
 * nabla/loops.h -- structured control flow inside traces: while_loop, fori_loop, scan, cond
 * and switch (JAX's lax control flow with Equinox's loop kinds).
 *
 * The functions given to a loop (cond, body, branches) are nb_fns made by nb_fn_create (or
 * nb_jit of one; a grad/vjp/jvp-transformed function is refused: transform the function
 * that contains the loop instead), traced once each into a sub-graph that is compiled into
 * its own executable and run by the loop op inside the enclosing executable: no allocation
 * per iteration, loops nest, and the enclosing function is traced once however many steps
 * run.
 *
 * Closure conversion. A function's bound data (its self tree) may hold vars of the
 * enclosing trace -- a threshold computed from the parameters, a weight matrix. Those are
 * lifted into explicit operands of the loop op (so derivatives reach them) and are never
 * hashed: the sub-graph's cache key is the function's body pointer, the static parts of
 * its self and carry trees and the (dtype, shape) of every array or var leaf, compared by
 * value (as nb_apply with a non-inlined function). A while loop's cond gets exactly the
 * same treatment as its body, so a cond that closes over traced values works, and
 * re-tracing the enclosing function with new data does not retrace the loop.
 *
 * Kinds (Equinox's names):
 *   NB_LOOP_LAX            forward evaluation and jvp; reverse mode through it is an error
 *                          whose message names the fix (checkpointed with max_steps or
 *                          checkpoints);
 *   NB_LOOP_CHECKPOINTED   reverse mode with bounded memory (needs max_steps or checkpoints;
 *                          default checkpoints floor(-1.5 + sqrt(2 max_steps + 0.25)) + 1);
 *   NB_LOOP_BOUNDED        reverse mode storing every step (needs max_steps).
 * max_steps, when given, also bounds the forward loop: a while loop stops after max_steps
 * iterations even if cond still holds.
 *
 * Reverse mode through a bounded loop runs the loop again writing every step's carry on a
 * tape of max_steps rows, then a reverse loop that retraces the body on each taped carry and
 * differentiates it in place: the gradients are those of the unrolled loop, bit for bit
 * (except where a row-sum rewrite of docs/semantics.md section 9 applies on one side only:
 * a value broadcast once outside the loop whose cotangent the loop gathers), and reach the carry's
 * initial value and every var the body closes over (the cond's lifted values get none: a bool has
 * no derivative). Forward mode (jvp) through a loop of any kind runs one loop over (carry, tangent)
 * whose body is the body's jvp, also bit for bit the unrolled loop's. Checkpointed reversal follows
 * Griewank-Walther revolve when the trip count is known (fori, scan) and an online schedule for
 * while loops (src/loops/checkpoint.h), with the same gradient bits as the bounded reversal. cond
 * and switch differentiate in both modes (their branches run as one-step bounded loops). Second
 * derivatives through loops (reverse of reverse) are not supported.
 *
 * Errors follow the trace's sticky rule (nabla/trace.h): a body whose output does not have
 * the carry's structure, dtypes and shapes is NB_ERR_STRUCTURE naming the first differing
 * path; a cond that does not return a 0-d bool is NB_ERR_SHAPE; bad options NB_ERR_INVALID.
 */
#ifndef NABLA_LOOPS_H
#define NABLA_LOOPS_H

#include "core.h"
#include "fn.h"
#include "trace.h"
#include "tree.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nb_loop_kind {
    NB_LOOP_LAX = 0,
    NB_LOOP_CHECKPOINTED = 1,
    NB_LOOP_BOUNDED = 2
} nb_loop_kind;

typedef struct nb_loop_opts {
    nb_loop_kind kind;   /* default NB_LOOP_LAX */
    int64_t max_steps;   /* 0 (default): unbounded (lax only) */
    int64_t checkpoints; /* 0 (default): Equinox's default for max_steps (checkpointed) */
    /* NULL (default), or Equinox's buffers: a tree of bools shaped like the carry (or a
     * prefix of it) marking the carry leaves the body only writes into, at distinct indices
     * of their first axis (saved outputs), never reads. Reverse mode keeps them out of
     * checkpoints and tapes: the body's derivative does not depend on their values. scan's
     * stacked outputs are buffers already. Both rules are checked while tracing, with an
     * error naming the buffer's path: a read is any use but as the buffer operand of
     * nb_dynamic_update_slice; a write must be one row per step at a step counter (a 0-d
     * integer carry leaf the body returns plus 1), so no row is written twice. Borrowed
     * for the call. */
    const nb_tree *buffers;
} nb_loop_opts;

NB_API nb_loop_opts nb_loop_opts_default(void);

/* What the last checkpointed reversal run on this thread did (the counters of its schedule,
 * as the kernel executed it). */
typedef struct nb_loop_stats {
    int64_t primal_steps;         /* the loop's trip count */
    int64_t forward_sweep_steps;  /* unrecorded steps of the reversal's first forward sweep:
                                     the trip count (online: x_0 to x_n), or one less
                                     (offline: x_0 to x_{n-1}; the last step is taped) */
    int64_t recomputed_steps;     /* unrecorded steps run after that */
    bool offline;                 /* revolve (a known trip count: fori, scan) or online */
    int64_t taped_steps;          /* steps recorded and reversed (= primal_steps) */
    int64_t checkpoints;          /* slots the schedule had */
    int64_t peak_checkpoints;     /* most slots holding a state at once */
    size_t state_bytes;           /* bytes of one checkpoint: the carry without its buffers */
    size_t buffer_bytes;          /* bytes of the buffers (held once, never checkpointed) */
    size_t peak_checkpoint_bytes; /* peak_checkpoints * state_bytes (+ buffer_bytes: the
                                     peak memory of the reversal's states) */
} nb_loop_stats;

/* Copy the counters of the last checkpointed reversal this thread ran into *out (zeros
 * before the first). NB_ERR_MISUSE for NULL. Never allocates. */
NB_API nb_status nb_loop_last_stats(nb_loop_stats *out);

/* while cond(carry): carry = body(carry). cond is called on the carry tree (as its args)
 * and returns a 0-d bool var; body returns a tree of the carry's structure, dtypes and
 * shapes. init: a tree of vars (or arrays, used as constants) and static leaves. Returns
 * the final carry, owned by the trace (NULL after a sticky error). opts may be NULL. */
NB_API const nb_tree *nb_while_loop(nb_trace *tr, nb_fn *cond, nb_fn *body, const nb_tree *init,
                                    const nb_loop_opts *opts);

/* for i in [lo, hi): carry = body((i, carry)), i an i32 0-d var. hi - lo steps (0 when
 * hi <= lo); the trip count is known, so max_steps defaults to it, and a max_steps below it
 * is NB_ERR_INVALID (the loop would stop early). */
NB_API const nb_tree *nb_fori_loop(nb_trace *tr, int64_t lo, int64_t hi, nb_fn *body,
                                   const nb_tree *init, const nb_loop_opts *opts);

/* JAX's scan: for i in [0, length): (carry, y_i) = body((carry, x_i)), x_i the i-th slices
 * of the leaves of xs (a tree of vars with leading dim length, or NULL for none). Returns
 * the tuple (carry, ys): ys has the structure of body's y with each leaf stacked along a
 * new leading dim of size length. length 0 gives init and ys with a leading dim of 0 (the
 * body is traced for the structure of y, never run). As for fori, a max_steps below length
 * is NB_ERR_INVALID. */
NB_API const nb_tree *nb_scan(nb_trace *tr, nb_fn *body, const nb_tree *init, const nb_tree *xs,
                              int64_t length, const nb_loop_opts *opts);

/* pred ? true_fn(operand) : false_fn(operand), only the chosen branch running. pred is a
 * 0-d bool var; both branches return trees of one structure, dtypes and shapes. */
NB_API const nb_tree *nb_cond(nb_trace *tr, nb_var *pred, nb_fn *true_fn, nb_fn *false_fn,
                              const nb_tree *operand);
/* branches[clamp(index, 0, n - 1)](operand): index a 0-d integer var; n >= 1. */
NB_API const nb_tree *nb_switch(nb_trace *tr, nb_var *index, int n, nb_fn *const *branches,
                                const nb_tree *operand);

#ifdef __cplusplus
}
#endif
#endif /* NABLA_LOOPS_H */

/*
 * src/loops/checkpoint.h -- checkpoint schedules for reverse mode through loops: which loop
 * states to keep, and which steps to run again, so that every step of a loop of n steps is
 * reversed with at most c stored states. Not API: the loop executor (src/loops) follows
 * these schedules, and the tests simulate them on integer states.
 *
 * Everything here is integer bookkeeping: no arrays, no context, no allocation. State
 * machines live in structs the caller owns, with O(c) int64 words of workspace the caller
 * provides once (nbl_*_work_len); a call per step costs O(1) amortised (beyond its optimal
 * phase the online schedule also pays O(c - k) after dropping checkpoint k, usually one of
 * the last few). Nothing is global: one schedule per thread.
 *
 * ---- Terms ------------------------------------------------------------------------------
 * A loop of n steps maps states x_0 -> x_1 -> ... -> x_n; step i computes x_{i+1} from x_i
 * (x_0 is the loop's input, x_n its output). The reverse of step i maps the cotangent of
 * x_{i+1} to that of x_i (and adds to the cotangents of captured operands); it needs x_i.
 *
 * The executor holds one WORKING STATE (the carry it runs the body on) and c SLOTS,
 * numbered 0 .. c-1, each able to hold one state (a "checkpoint"). Only the steps' indices
 * matter to a schedule: "the working state is x_i" or "slot 3 holds x_17".
 *
 * ---- The action stream (both schedules) -------------------------------------------------
 * nbl_ckpt_next() yields one action at a time; `step`, `count` and `slot` say exactly what
 * the executor holds before and after, so it can check itself:
 *
 *   NBL_CKPT_ADVANCE  count >= 1 unrecorded steps: the working state is x_step before,
 *                     x_{step+count} after (steps step .. step+count-1 run, no tape).
 *   NBL_CKPT_TAKESHOT copy the working state (x_step) into slot `slot`, overwriting what it
 *                     held; the working state is unchanged.
 *   NBL_CKPT_RESTORE  copy slot `slot` (it holds x_step) into the working state.
 *   NBL_CKPT_TAPE     the working state is x_step: run step `step` recording what its
 *                     reverse needs, then run that reverse on the cotangent of x_{step+1},
 *                     giving the cotangent of x_step. The working state is undefined after
 *                     it: the next action is a RESTORE or DONE. TAPEs come for every step
 *                     from the last one down to 0, each once, in that order.
 *   NBL_CKPT_DONE     the reversal is complete (step 0 was taped); repeated if called again.
 *
 * A slot's content is only ever read by RESTORE, and a slot is written only by TAKESHOT
 * (offline) or by the online forward sweep; no action frees a slot explicitly. Slot ids are
 * always in [0, c).
 *
 * ---- Offline: binomial checkpointing (revolve) -----------------------------------------
 * For a loop whose step count l is known before the reversal starts (fori, scan, a while
 * loop that has already stopped) with s slots. Griewank [G92] and Griewank-Walther [GW00]:
 * with s checkpoints and at most r unrecorded evaluations of each step, at most
 *     beta(s, r) = C(s + r, s)
 * steps can be reversed; with r = min{r : beta(s, r) >= l} the minimal number of
 * unrecorded (advance) steps is
 *     t(l, s) = r l - beta(s + 1, r - 1)                                      [G92, GW00]
 * which this schedule attains exactly, plus the l taped steps. The s slots include the one
 * that holds x_0 (Griewank's convention): s = 1 gives t = l(l-1)/2, rerunning from x_0
 * every time. Published rows: (l, s) = (3, 1) -> 3, (10, 2) -> 20, (1000, 10) -> 3636,
 * (10000, 30) -> 34016 (tested).
 *
 * Contract: at the start the working state is x_0 and no slot holds anything. For l >= 2
 * the stream begins with the forward sweep -- TAKESHOT(slot 0, x_0), then ADVANCEs and
 * TAKESHOTs up to x_{l-1} -- and its first TAPE is step l-1 from the working state the sweep
 * left (l = 1 is a single TAPE). The
 * ADVANCE steps before the first TAPE (l - 1 of them) are the counters' `forward`, those
 * after it `recomputed`, so forward + recomputed = t(l, s). An executor whose primal pass is
 * separate from the backward pass runs the sweep in the primal pass and must keep x_{l-1}
 * (or tape step l-1 there) for the first TAPE; if it would rather finish the primal pass at
 * x_l and keep nothing extra, it runs the online schedule's reversal instead.
 *
 * How: the recursion of [G92] as an iterative state machine. The checkpoints in use form a
 * stack ordered by step (x_0 at the bottom); for the segment from the top checkpoint x_a to
 * the next step to reverse g (L = g + 1 - a steps) with k slots available (the top's plus
 * the free ones) it advances m steps and takes a snapshot, where m is the largest optimal
 * first step: m = min(beta(k, r-1), L - beta(k-1, r-1)), r = r(L, k) (the optimal m form
 * an interval, checked against a brute-force minimisation in the tests). Memory: 3 s words.
 *
 * ---- Online: the step count is not known until the loop stops (while loops) -------------
 * During the forward sweep, before each step i the executor asks nbl_online_next() whether
 * to copy x_i into a slot (and which; the slot's old checkpoint is dropped). x_0 always goes
 * to slot 0 and stays there. When the loop stops after n steps (the working state is x_n,
 * which the reversal does not use), nbl_online_reverse_start() turns the slots as they are
 * into the action stream above: it begins with a RESTORE, `forward` = n, and `recomputed`
 * counts every ADVANCE.
 *
 * Optimal regime. Every state x_i (i < n) not in a slot when the reversal starts must be
 * recomputed at least once, so any schedule -- online or offline -- with x_0 in one of c
 * slots recomputes at least n - c steps. This schedule recomputes exactly n - c (n taped:
 * 2n - c body evaluations in the backward pass) for every
 *     c <= n <= (c+1)(c+2)/2 - 1                          (nbl_online_optimal_limit(c)),
 * and none for n <= c. This is the regime of Stumm and Walther [SW10], whose bound is
 * quoted as l <= (c+1)(c+2)/2 (so in Equinox's source, which also finds the paper's Fig. 2.2
 * off by one; we have not checked the paper's own counting). In this counting -- x_0 held in
 * a slot, the reversal starting from x_n -- the last n with n - c recomputations is
 * (c+1)(c+2)/2 - 1, where Equinox switches to its fallback too, and at n = (c+1)(c+2)/2 the
 * fewest any schedule can make is n - c + 1 (nbl_ckpt_min_recomputations, tested). Reversing
 * segment j (from its checkpoint, with the c - j slots of itself and the later checkpoints) costs
 * one recomputation per step if it is at most c + 1 - j long; the sweep keeps every segment within
 * that bound, growing the first segment that is not full by dropping the checkpoint after it when
 * the merged segment fits; at n = (c+1)(c+2)/2 - 1 the layout is forced: segments c+1, c, ...,
 * 3, 2.
 *
 * Beyond it. Past (c+1)(c+2)/2 - 1 steps no online schedule can stay optimal for every n.
 * Wang-Moin dynamic checkpointing [WM09] (Equinox's fallback) keeps checkpoints by levels;
 * this schedule instead drops, at each step, the checkpoint (or none) that minimises the
 * cost of the reversal were the loop to stop after this step, where the cost of a layout is
 * the sum over its segments of t(length, slots available) -- exact, since the reversal runs
 * revolve on each segment. Measured: never more recomputations than Equinox 0.13.8 on any
 * row of tests/loops/oracle/equinox_counts.txt (74 pairs (n, c), n up to 1e4) -- e.g.
 * n = 4096: c = 30 -> 7669 against Equinox's 12770, c = 12 -> 14013 against 19127 -- and
 * within 5 % of nbl_ckpt_min_recomputations (the fewest for any schedule, offline included,
 * that starts the reversal from the slots) for n >= 1000 and c = 2 .. 100; 22 % above it at
 * worst for small n (n = 13, c = 2: 28 against 23). This greedy rule is ours, without a
 * proven bound; the tests pin it against Equinox and the lower bound.
 *
 * Equinox's default number of checkpoints is nbl_ckpt_default_count(max_steps).
 *
 * References
 *   [G92]  A. Griewank, Achieving logarithmic growth of temporal and spatial complexity in
 *          reverse automatic differentiation, Optim. Methods Softw. 1 (1992) 35-54.
 *   [GW00] A. Griewank, A. Walther, Algorithm 799: revolve, ACM TOMS 26 (2000) 19-45.
 *   [SW10] P. Stumm, A. Walther, New algorithms for optimal online checkpointing, SIAM J.
 *          Sci. Comput. 32 (2010) 836-854.
 *   [WM09] Q. Wang, P. Moin, G. Iaccarino, Minimal repetition dynamic checkpointing
 *          algorithm for unsteady adjoint calculation, SIAM J. Sci. Comput. 31 (2009)
 *          2549-2567.
 *   Equinox 0.13.8, equinox/internal/_loop/checkpointed.py (its online algorithm, default
 *          checkpoint count and the published n = 4096 counts).
 */
#ifndef NABLA_SRC_LOOPS_CHECKPOINT_H
#define NABLA_SRC_LOOPS_CHECKPOINT_H

#include "core/internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- closed forms ---------------------------------------------------------------------- */

/* Equinox's default checkpoint count for a checkpointed loop of at most max_steps steps:
 * floor(-1.5 + sqrt(2 max_steps + 0.25)) + 1, computed exactly in integers (it is the largest
 * k with k(k+1)/2 <= max_steps; equal to Equinox's floating-point value, 1 for max_steps = 1).
 * 0 for max_steps <= 0 (Equinox rejects that combination); max_steps is clamped to 2^62. */
NBI_HIDDEN int64_t nbl_ckpt_default_count(int64_t max_steps);

/* beta(s, t) = C(s + t, s), the most steps s checkpoints reverse with t repetitions. s, t >= 0;
 * INT64_MAX when it does not fit (saturating), -1 for negative arguments. */
NBI_HIDDEN int64_t nbl_revolve_beta(int64_t s, int64_t t);

/* r = min{r : beta(s, r) >= l}, the repetition number of revolve: 0 for l <= 1. -1 when
 * l < 0 or s < 1. */
NBI_HIDDEN int64_t nbl_revolve_repetitions(int64_t l, int64_t s);

/* t(l, s) = r l - beta(s + 1, r - 1): the advance (unrecorded) steps of the offline optimal
 * reversal of l steps with s slots, the forward sweep's l - 1 included (0 for l <= 1). Exact
 * whenever the result fits in int64 (any l <= 1e9 with any s >= 1; l <= 4.29e9 when s = 1);
 * -1 when l < 0, s < 1 or it overflows. */
NBI_HIDDEN int64_t nbl_revolve_advances(int64_t l, int64_t s);

/* (c+1)(c+2)/2 - 1: the last step count at which the online schedule with c >= 1 slots
 * recomputes only n - c steps (see the header comment). -1 when c < 1 or on overflow. */
NBI_HIDDEN int64_t nbl_online_optimal_limit(int64_t c);

/* The fewest recomputations any schedule can make when the reversal of n steps starts from
 * the working state x_n and c slots holding states of the sweep (x_0 in one of them): the
 * n cheapest of the marginal costs of the c segments, segment j (c - j slots) offering
 * one step at cost 0 and beta(c-j-1, m) steps at cost m >= 1 -- at most c steps cost 0, then
 * beta(c-1, m+1) at cost m. A lower bound for the online schedule, equal to it while
 * n <= nbl_online_optimal_limit(c). -1 for n < 0, c < 1 or overflow. */
NBI_HIDDEN int64_t nbl_ckpt_min_recomputations(int64_t n, int64_t c);

/* ---- counters ------------------------------------------------------------------------ */

/* What a schedule does, counted by the simulations below and kept up to date by
 * nbl_ckpt_next; the executor counts what it ran and compares. */
typedef struct nbl_ckpt_counts {
    int64_t forward;    /* unrecorded steps of the forward sweep (offline: ADVANCE steps
                           before the first TAPE; online: the n steps of the loop itself) */
    int64_t recomputed; /* unrecorded steps after that (ADVANCE in the reversal) */
    int64_t taped;      /* recorded steps, each followed by its reverse (= the step count) */
    int64_t peak_slots; /* most slots holding a checkpoint at once (<= the slots given) */
    int64_t takeshots;  /* state copies into slots (the online sweep's stores included) */
    int64_t restores;   /* state copies out of slots */
} nbl_ckpt_counts;

/* ---- the action stream ------------------------------------------------------------------ */

typedef enum nbl_ckpt_op {
    NBL_CKPT_DONE = 0,
    NBL_CKPT_ADVANCE = 1,
    NBL_CKPT_TAKESHOT = 2,
    NBL_CKPT_RESTORE = 3,
    NBL_CKPT_TAPE = 4
} nbl_ckpt_op;

/* One action (see the header comment for what each does to the executor's states). */
typedef struct nbl_ckpt_action {
    nbl_ckpt_op op;
    int64_t step;  /* ADVANCE: first step run; TAKESHOT/RESTORE: i of the state x_i copied;
                      TAPE: the step taped and reversed; DONE: -1 */
    int64_t count; /* ADVANCE: steps run (>= 1); otherwise 0 */
    int64_t slot;  /* TAKESHOT/RESTORE: the slot, in [0, slots); otherwise -1 */
} nbl_ckpt_action;

/* The reversal state machine (both schedules). The caller owns it and its workspace; the
 * fields are read-only outside checkpoint.c except for reading `counts`. */
typedef struct nbl_ckpt_rev {
    int64_t slots;     /* c or s */
    int64_t next;      /* the step whose reverse comes next; -1 when done */
    int64_t cur;       /* i of the working state x_i, or -1 when it is none the schedule uses */
    int64_t depth;     /* checkpoints held: a stack ordered by step */
    int64_t nfree;     /* slot ids on the free stack */
    int64_t *pos;      /* [slots] step of stack entry i, increasing */
    int64_t *slot;     /* [slots] slot id of stack entry i */
    int64_t *free_ids; /* [slots] free slot ids, the next one to use last */
    bool reversing;    /* the forward sweep is over: ADVANCE counts as recomputed (offline:
                          from the first TAPE on; online: from the start) */
    nbl_ckpt_counts counts;
} nbl_ckpt_rev;

/* Workspace of a reversal with `slots` slots, in int64 words (0 when slots < 1 or huge). */
NBI_HIDDEN size_t nbl_ckpt_rev_work_len(int64_t slots);

/* Start the offline (revolve) reversal of l >= 0 steps with s >= 1 slots; the working state
 * is x_0 and every slot is empty. work: nbl_ckpt_rev_work_len(s) words, borrowed until the
 * reversal is done. Does not allocate. NB_ERR_MISUSE for NULL rev or work, NB_ERR_INVALID for
 * l < 0 or s < 1, NB_ERR_TRUNCATED when work_len is too small. */
NBI_HIDDEN nb_status nbl_revolve_start(nbl_ckpt_rev *rev, int64_t l, int64_t s, int64_t *work,
                                       size_t work_len);

/* The next action into *out (NBL_CKPT_DONE once the reversal is complete, and again on every
 * later call). Updates rev->counts. O(1) amortised, plus O(r) for the binomials of a split.
 * NB_ERR_MISUSE for NULL arguments, NB_ERR_INTERNAL if the state machine is inconsistent
 * (*out is then DONE). */
NBI_HIDDEN nb_status nbl_ckpt_next(nbl_ckpt_rev *rev, nbl_ckpt_action *out);

/* Run the offline schedule for (l, s) to the end and count it (peak_slots included) into
 * *out. work as nbl_revolve_start. Statuses as nbl_revolve_start. */
NBI_HIDDEN nb_status nbl_revolve_simulate(int64_t l, int64_t s, int64_t *work, size_t work_len,
                                          nbl_ckpt_counts *out);

/* ---- online: the forward sweep's decisions -------------------------------------------- */

/* The online schedule's state during the forward sweep. Caller-owned; read-only outside
 * checkpoint.c. */
typedef struct nbl_online {
    int64_t slots;      /* c */
    int64_t steps;      /* decisions made = i of the next state to decide on */
    int64_t used;       /* slots holding a checkpoint */
    int64_t limit;      /* nbl_online_optimal_limit(c) */
    int64_t first_open; /* optimal phase: the first segment that may still grow */
    /* The checkpoints, by increasing step: pos/slot[0 .. nfront-1], then (in the optimal
     * phase) a ring qpos/qslot of qcount entries from qhead; one plain array after it. */
    int64_t *pos;   /* [slots] step of each checkpoint */
    int64_t *slot;  /* [slots] its slot id */
    int64_t *qpos;  /* [slots] */
    int64_t *qslot; /* [slots] */
    int64_t nfront, qhead, qcount;
    /* The greedy's cost cache over the closed segments j = 0 .. c-2 (L_j = pos[j+1] -
     * pos[j]), valid below index `stale`: a drop at k changes segments k-1 and later. */
    int64_t *pre;      /* [slots] pre[m] = sum_{j < m} t(L_j, c - j) */
    int64_t *q;        /* [slots] q[m] = sum_{j < m} t(L_j, c - j + 1) (one more slot) */
    int64_t *pm;       /* [slots] pm[k] = min_{1 <= k' <= k} d(k'), d(k') the cost of
                          dropping checkpoint k' minus the part after segment k' */
    int64_t *pk;       /* [slots] the k' attaining pm[k] (the later one on ties) */
    int64_t stale;     /* cache entries from here on need recomputing */
    int64_t peak_used; /* most slots in use so far */
    int64_t stores;    /* decisions that stored a state */
} nbl_online;

/* Workspace of an online schedule with `slots` slots, in int64 words (0 when invalid). */
NBI_HIDDEN size_t nbl_online_work_len(int64_t slots);

/* Start an online schedule with c >= 1 slots, before step 0. work: nbl_online_work_len(c)
 * words, borrowed until nbl_online_reverse_start has copied what it needs. Statuses as
 * nbl_revolve_start. */
NBI_HIDDEN nb_status nbl_online_start(nbl_online *on, int64_t c, int64_t *work, size_t work_len);

/* The decision before step i = on->steps runs: the slot the executor must copy the working
 * state x_i into (overwriting that slot's checkpoint), or -1 to store nothing. Call it once
 * per step that will run -- after the loop's condition said continue -- and not for the
 * final state. The first call returns 0 (x_0 goes to slot 0, for good). -1 too for a NULL on.
 * Cost: O(1) amortised in the optimal phase; beyond it O(1) plus, when it drops checkpoint
 * k, a memmove of c - k words and O(c - k) cost evaluations. The greedy drops one of the last
 * few (c - k averages 2 to 4 over 1e5 to 1e6 steps with c = 10 .. 100): 10 to 80 ns a step
 * measured, c up to 1e4. */
NBI_HIDDEN int64_t nbl_online_next(nbl_online *on);

/* Start the reversal of the on->steps steps run so far, from the slots as the sweep left
 * them; the working state is x_n and unused. counts.forward = n, counts.takeshots and
 * peak_slots include the sweep's. work: nbl_ckpt_rev_work_len(c) words (not on's). Statuses
 * as nbl_revolve_start (NB_ERR_MISUSE for NULL on). */
NBI_HIDDEN nb_status nbl_online_reverse_start(nbl_ckpt_rev *rev, const nbl_online *on,
                                              int64_t *work, size_t work_len);

/* Run the online schedule for a loop that stops after n >= 0 steps with c >= 1 slots --
 * the sweep's decisions, then the reversal -- and count it into *out. work:
 * nbl_online_work_len(c) + nbl_ckpt_rev_work_len(c) words. Statuses as nbl_revolve_start. */
NBI_HIDDEN nb_status nbl_online_simulate(int64_t n, int64_t c, int64_t *work, size_t work_len,
                                         nbl_ckpt_counts *out);

#endif /* NABLA_SRC_LOOPS_CHECKPOINT_H */

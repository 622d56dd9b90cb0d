/*
 * src/loops/checkpoint.c -- checkpoint schedules: revolve (offline), the online schedule and
 * the reversal state machine both share. What they do, and why, is in checkpoint.h.
 */
#include "loops/checkpoint.h"

#include <math.h>
#include <string.h>

#define NBL_SAT INT64_MAX

/* ---- saturating integer helpers ---------------------------------------------------------- */

static int64_t nbl_gcd(int64_t a, int64_t b) {
    while (b != 0) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* a + b for a, b >= 0, saturating at NBL_SAT. */
static int64_t nbl_add_sat(int64_t a, int64_t b) {
    return a > NBL_SAT - b ? NBL_SAT : a + b;
}

/* a * b for a, b >= 0, saturating at NBL_SAT. */
static int64_t nbl_mul_sat(int64_t a, int64_t b) {
    if (a == 0 || b == 0) {
        return 0;
    }
    return a > NBL_SAT / b ? NBL_SAT : a * b;
}

/* x * num / den, exact when den divides x * num and x is a binomial built up so far (den's
 * part not shared with num divides x); saturating. x, num, den > 0. */
static int64_t nbl_mul_div_sat(int64_t x, int64_t num, int64_t den) {
    int64_t g = nbl_gcd(num, den);
    num /= g;
    den /= g;
    if (x == NBL_SAT) {
        return NBL_SAT;
    }
    return nbl_mul_sat(x / den, num);
}

/* C(n, k) for n >= k >= 0, saturating. Each partial product C(n - k + i, i) is exact. */
static int64_t nbl_binom(int64_t n, int64_t k) {
    if (k > n - k) {
        k = n - k;
    }
    int64_t c = 1;
    for (int64_t i = 1; i <= k && c != NBL_SAT; i++) {
        c = nbl_mul_div_sat(c, n - k + i, i);
    }
    return c;
}

/* ---- closed forms -------------------------------------------------------------------------- */

int64_t nbl_ckpt_default_count(int64_t max_steps) {
    if (max_steps <= 0) {
        return 0;
    }
    const int64_t cap = (int64_t)1 << 62;
    uint64_t m = (uint64_t)(max_steps > cap ? cap : max_steps);
    /* The largest k with k(k+1)/2 <= m: floor(-1.5 + sqrt(2m + 0.25)) + 1 in exact terms,
     * since (x + 1/2)^2 = 2m + 1/4 is x(x + 1) = 2m. A float estimate, then corrected;
     * k <= 3.1e9, so k(k+1) fits in 64 unsigned bits. */
    uint64_t k = (uint64_t)((sqrt(8.0 * (double)m + 1.0) - 1.0) / 2.0);
    while (k > 0 && k * (k + 1) / 2 > m) {
        k--;
    }
    while ((k + 1) * (k + 2) / 2 <= m) {
        k++;
    }
    return (int64_t)k;
}

int64_t nbl_revolve_beta(int64_t s, int64_t t) {
    if (s < 0 || t < 0) {
        return -1;
    }
    if (s > NBL_SAT - t) {
        return NBL_SAT;
    }
    return nbl_binom(s + t, s);
}

/* r = min{r : beta(s, r) >= l} for l >= 2, s >= 2, and beta(s, r - 1) into *prev, by
 * beta(s, r) = beta(s, r - 1) (s + r) / r: the product is r beta(s, r), so the division is
 * exact; r <= sqrt(2 l). A product past int64 means beta(s, r) >= l. */
static int64_t nbl_reps(int64_t l, int64_t s, int64_t *prev) {
    int64_t r = 0, b = 1;
    *prev = 0;
    while (b < l) {
        r++;
        *prev = b;
        int64_t f = s > NBL_SAT - r ? NBL_SAT : s + r;
        b = b > NBL_SAT / f ? NBL_SAT : b * f / r;
    }
    return r;
}

int64_t nbl_revolve_repetitions(int64_t l, int64_t s) {
    if (l < 0 || s < 1) {
        return -1;
    }
    if (l <= 1) {
        return 0;
    }
    if (s == 1) {
        return l - 1; /* beta(1, r) = r + 1 */
    }
    int64_t prev;
    return nbl_reps(l, s, &prev);
}

int64_t nbl_revolve_advances(int64_t l, int64_t s) {
    if (l < 0 || s < 1) {
        return -1;
    }
    if (l <= 1) {
        return 0;
    }
    if (s == 1) { /* l (l - 1) / 2, without forming r l = l (l - 1) */
        int64_t a = l, b = l - 1;
        if (a % 2 == 0) {
            a /= 2;
        } else {
            b /= 2;
        }
        int64_t t = nbl_mul_sat(a, b);
        return t == NBL_SAT ? -1 : t;
    }
    int64_t prev, r = nbl_reps(l, s, &prev);
    int64_t rl = nbl_mul_sat(r, l);
    /* beta(s + 1, r - 1) = beta(s, r - 1) (s + r) / (s + 1), exactly; the slow way when the
     * product does not fit. */
    int64_t b;
    if (s <= NBL_SAT - r && prev <= NBL_SAT / (s + r)) {
        b = prev * (s + r) / (s + 1);
    } else {
        b = nbl_revolve_beta(s + 1, r - 1);
    }
    if (rl == NBL_SAT || b == NBL_SAT || b > rl) {
        return -1;
    }
    return rl - b;
}

int64_t nbl_online_optimal_limit(int64_t c) {
    if (c < 1) {
        return -1;
    }
    int64_t a = c + 1, b = c + 2;
    if (a % 2 == 0) {
        a /= 2;
    } else {
        b /= 2;
    }
    int64_t u = nbl_mul_sat(a, b);
    return u == NBL_SAT ? -1 : u - 1;
}

int64_t nbl_ckpt_min_recomputations(int64_t n, int64_t c) {
    if (n < 0 || c < 1) {
        return -1;
    }
    if (n <= c) {
        return 0;
    }
    if (c == 1) {
        return nbl_revolve_advances(n, 1); /* one step at each cost 1 .. n - 1 */
    }
    /* c steps cost nothing (the checkpoints themselves), then beta(c - 1, m + 1) steps cost
     * m = 1, 2, ...: segment j's length L with k = c - j slots costs t(L, k), whose
     * increments are 0 once, then m for beta(k, m) - beta(k, m - 1) = beta(k - 1, m)
     * steps; summed over k = 1 .. c by the hockey-stick identity. */
    int64_t rest = n - c, cost = 0;
    for (int64_t m = 1; rest > 0; m++) {
        int64_t cap = nbl_revolve_beta(c - 1, m + 1);
        int64_t take = cap < rest ? cap : rest;
        cost = nbl_add_sat(cost, nbl_mul_sat(m, take));
        rest -= take;
    }
    return cost == NBL_SAT ? -1 : cost;
}

/* Costs and their sums saturate at 2^61, so that a few of them add and subtract without
 * overflow; no layout of a loop that could run in practice comes near. */
#define NBL_CAP ((int64_t)1 << 61)

static int64_t nbl_add_cap(int64_t a, int64_t b) {
    return a > NBL_CAP - b ? NBL_CAP : a + b;
}

/* t(L, k), capped; closed forms for repetition numbers 1 to 3 (k <= 2^20 keeps the products
 * in range), which are what the online greedy meets. */
static int64_t nbl_cost(int64_t len, int64_t k) {
    if (len <= 1) {
        return 0;
    }
    if (len <= k + 1) {
        return len - 1; /* r = 1 */
    }
    if (k <= ((int64_t)1 << 20)) {
        int64_t b2 = (k + 1) * (k + 2) / 2; /* beta(k, 2) */
        if (len <= b2) {
            return 2 * len - (k + 2); /* 2L - beta(k+1, 1) */
        }
        int64_t b3 = b2 * (k + 3) / 3; /* beta(k, 3) */
        if (len <= b3 && len <= NBL_CAP / 3) {
            return 3 * len - (k + 2) * (k + 3) / 2; /* 3L - beta(k+1, 2) */
        }
    }
    int64_t t = nbl_revolve_advances(len, k);
    return t < 0 || t > NBL_CAP ? NBL_CAP : t;
}

/* ---- the reversal state machine ------------------------------------------------------------ */

size_t nbl_ckpt_rev_work_len(int64_t slots) {
    if (slots < 1 || slots > ((int64_t)1 << 40)) {
        return 0;
    }
    return 3 * (size_t)slots;
}

static nb_status nbl_rev_setup(nbl_ckpt_rev *rev, int64_t slots, int64_t *work, size_t work_len) {
    if (rev == NULL || work == NULL) {
        return NB_ERR_MISUSE;
    }
    size_t need = nbl_ckpt_rev_work_len(slots);
    if (need == 0) {
        return NB_ERR_INVALID;
    }
    if (work_len < need) {
        return NB_ERR_TRUNCATED;
    }
    memset(rev, 0, sizeof *rev);
    rev->slots = slots;
    rev->pos = work;
    rev->slot = work + slots;
    rev->free_ids = work + 2 * slots;
    rev->cur = -1;
    rev->next = -1;
    return NB_OK;
}

nb_status nbl_revolve_start(nbl_ckpt_rev *rev, int64_t l, int64_t s, int64_t *work,
                            size_t work_len) {
    if (rev != NULL && work != NULL && l < 0) {
        return NB_ERR_INVALID;
    }
    nb_status st = nbl_rev_setup(rev, s, work, work_len);
    if (st != NB_OK) {
        return st;
    }
    rev->next = l - 1;
    rev->cur = 0; /* the working state is x_0 */
    /* Free ids s-1 .. 0 with 0 on top: x_0 goes to slot 0, the stack fills slots upward. */
    rev->nfree = s;
    for (int64_t i = 0; i < s; i++) {
        rev->free_ids[i] = s - 1 - i;
    }
    return NB_OK;
}

/* The first step of an optimal reversal of L >= 2 steps from a checkpoint with k >= 2 slots
 * (its own included): advance m, take a snapshot, reverse the last L - m steps with k - 1
 * slots, then the first m with k. With r = r(L, k) the optimal m are the interval
 *   max(beta(k, r-2), L - beta(k-1, r)) <= m <= min(beta(k, r-1), L - beta(k-1, r-1)):
 * the first m steps must fit in r - 1 repetitions with k slots, the rest in r with k - 1,
 * and both parts must carry their share of the repetitions. This takes the largest; both
 * bounds lie in [1, L - 1] since beta(k-1, r-1) <= beta(k, r-1) < L. */
static int64_t nbl_split(int64_t len, int64_t k) {
    int64_t r = nbl_revolve_repetitions(len, k);
    int64_t a = nbl_revolve_beta(k, r - 1);
    int64_t b = len - nbl_revolve_beta(k - 1, r - 1);
    int64_t m = a < b ? a : b;
    if (m < 1) {
        m = 1;
    }
    if (m > len - 1) {
        m = len - 1;
    }
    return m;
}

static nb_status nbl_rev_internal(nbl_ckpt_rev *rev) {
    rev->next = -1;
    rev->cur = -1;
    return NB_ERR_INTERNAL;
}

nb_status nbl_ckpt_next(nbl_ckpt_rev *rev, nbl_ckpt_action *out) {
    if (out != NULL) {
        *out = (nbl_ckpt_action){.op = NBL_CKPT_DONE, .step = -1, .count = 0, .slot = -1};
    }
    if (rev == NULL || out == NULL) {
        return NB_ERR_MISUSE;
    }
    for (;;) {
        if (rev->next < 0) {
            return NB_OK;
        }
        /* The top checkpoint's segment is reversed: its slot is free again. */
        if (rev->depth > 0 && rev->pos[rev->depth - 1] > rev->next) {
            rev->free_ids[rev->nfree++] = rev->slot[rev->depth - 1];
            rev->depth--;
            continue;
        }
        break;
    }
    int64_t top = rev->depth > 0 ? rev->pos[rev->depth - 1] : -1;
    if (rev->cur == rev->next) {
        *out = (nbl_ckpt_action){.op = NBL_CKPT_TAPE, .step = rev->next, .count = 0, .slot = -1};
        rev->counts.taped++;
        rev->reversing = true;
        rev->next--;
        rev->cur = -1;
        return NB_OK;
    }
    if (rev->cur >= 0 && rev->cur > top && rev->cur < rev->next) {
        /* Just advanced to a state the schedule keeps (or the initial x_0). */
        if (rev->nfree == 0) {
            return nbl_rev_internal(rev);
        }
        int64_t id = rev->free_ids[--rev->nfree];
        rev->pos[rev->depth] = rev->cur;
        rev->slot[rev->depth] = id;
        rev->depth++;
        if (rev->depth > rev->counts.peak_slots) {
            rev->counts.peak_slots = rev->depth;
        }
        rev->counts.takeshots++;
        *out = (nbl_ckpt_action){.op = NBL_CKPT_TAKESHOT, .step = rev->cur, .count = 0, .slot = id};
        return NB_OK;
    }
    if (rev->depth == 0) {
        return nbl_rev_internal(rev); /* no state to start again from */
    }
    if (rev->cur != top) {
        rev->cur = top;
        rev->counts.restores++;
        *out = (nbl_ckpt_action){
            .op = NBL_CKPT_RESTORE, .step = top, .count = 0, .slot = rev->slot[rev->depth - 1]};
        return NB_OK;
    }
    /* The working state is the top checkpoint x_a, a < next: reverse a .. next with the
     * top's slot and the free ones, revolve's way. */
    int64_t len = rev->next + 1 - top, k = rev->nfree + 1;
    int64_t m = k == 1 ? len - 1 : nbl_split(len, k);
    *out = (nbl_ckpt_action){.op = NBL_CKPT_ADVANCE, .step = top, .count = m, .slot = -1};
    rev->cur = top + m;
    if (rev->reversing) {
        rev->counts.recomputed += m;
    } else {
        rev->counts.forward += m;
    }
    return NB_OK;
}

static nb_status nbl_rev_drain(nbl_ckpt_rev *rev, nbl_ckpt_counts *out) {
    nbl_ckpt_action act;
    nb_status st;
    do {
        st = nbl_ckpt_next(rev, &act);
    } while (st == NB_OK && act.op != NBL_CKPT_DONE);
    if (st == NB_OK) {
        *out = rev->counts;
    }
    return st;
}

nb_status nbl_revolve_simulate(int64_t l, int64_t s, int64_t *work, size_t work_len,
                               nbl_ckpt_counts *out) {
    if (out == NULL) {
        return NB_ERR_MISUSE;
    }
    *out = (nbl_ckpt_counts){0};
    nbl_ckpt_rev rev;
    nb_status st = nbl_revolve_start(&rev, l, s, work, work_len);
    return st != NB_OK ? st : nbl_rev_drain(&rev, out);
}

/* ---- online ------------------------------------------------------------------------------- */

size_t nbl_online_work_len(int64_t slots) {
    if (slots < 1 || slots > ((int64_t)1 << 40)) {
        return 0;
    }
    return 8 * (size_t)slots;
}

nb_status nbl_online_start(nbl_online *on, int64_t c, int64_t *work, size_t work_len) {
    if (on == NULL || work == NULL) {
        return NB_ERR_MISUSE;
    }
    size_t need = nbl_online_work_len(c);
    if (need == 0) {
        return NB_ERR_INVALID;
    }
    if (work_len < need) {
        return NB_ERR_TRUNCATED;
    }
    memset(on, 0, sizeof *on);
    on->slots = c;
    on->limit = nbl_online_optimal_limit(c);
    if (on->limit < 0) {
        on->limit = NBL_SAT;
    }
    on->pos = work;
    on->slot = work + c;
    on->pre = work + 2 * c;
    on->q = work + 3 * c;
    on->pm = work + 4 * c;
    on->pk = work + 5 * c;
    on->qpos = work + 6 * c;
    on->qslot = work + 7 * c;
    return NB_OK;
}

/* The optimal phase's queue of the checkpoints after the prefix: a ring of c entries. */
static void nbl_queue_push(nbl_online *on, int64_t step, int64_t id) {
    int64_t at = (on->qhead + on->qcount) % on->slots;
    on->qpos[at] = step;
    on->qslot[at] = id;
    on->qcount++;
}

static void nbl_queue_pop(nbl_online *on) {
    on->qhead = (on->qhead + 1) % on->slots;
    on->qcount--;
}

/* Checkpoint k (0 <= k < used) of the layout: the prefix, then the queue. */
static void nbl_online_at(const nbl_online *on, int64_t k, int64_t *step, int64_t *id) {
    if (k < on->nfront) {
        *step = on->pos[k];
        *id = on->slot[k];
    } else {
        int64_t at = (on->qhead + k - on->nfront) % on->slots;
        *step = on->qpos[at];
        *id = on->qslot[at];
    }
}

/* Drop checkpoint k (1 <= k < c) and keep x_i, the newest, in its slot. */
static int64_t nbl_online_move(nbl_online *on, int64_t k, int64_t i) {
    int64_t c = on->slots, id = on->slot[k];
    memmove(on->pos + k, on->pos + k + 1, (size_t)(c - 1 - k) * sizeof *on->pos);
    memmove(on->slot + k, on->slot + k + 1, (size_t)(c - 1 - k) * sizeof *on->slot);
    on->pos[c - 1] = i;
    on->slot[c - 1] = id;
    if (k - 1 < on->stale) {
        on->stale = k - 1; /* segments k-1 .. c-2 changed */
    }
    on->stores++;
    return id;
}

/* Bring the greedy's cost cache up to date (see nbl_online in checkpoint.h). With A_j =
 * t(L_j, c - j) and B_j = t(L_j, c - j + 1) for the closed segments j <= c-2, dropping
 * checkpoint k' in 1 .. c-2 and keeping the newest state leaves segments j < k'-1 as they
 * are, merges k'-1 and k' (c - k' + 1 slots) and moves the later ones down a place (one
 * slot more each):
 *   cost(k') = pre[k'-1] + t(L_{k'-1} + L_{k'}, c - k' + 1) + q[c-1] - q[k'+1]
 *            = d(k') + q[c-1]   (+ the open segment's term, the same for every k').
 * d(k') depends on segments up to k' only, so a drop at k leaves d and its prefix minimum pm
 * valid below k - 1: the work is O(c - k). */
static void nbl_online_refresh(nbl_online *on) {
    int64_t c = on->slots, from = on->stale < 0 ? 0 : on->stale;
    const int64_t *p = on->pos;
    if (from == 0) {
        on->pre[0] = 0;
        on->q[0] = 0;
    }
    for (int64_t m = from + 1; m <= c - 1; m++) { /* segment m-1 */
        int64_t len = p[m] - p[m - 1];
        on->pre[m] = nbl_add_cap(on->pre[m - 1], nbl_cost(len, c - (m - 1)));
        on->q[m] = nbl_add_cap(on->q[m - 1], nbl_cost(len, c - (m - 1) + 1));
    }
    for (int64_t k = from > 1 ? from : 1; k <= c - 2; k++) {
        int64_t d = nbl_add_cap(on->pre[k - 1], nbl_cost(p[k + 1] - p[k - 1], c - k + 1));
        d -= on->q[k + 1];
        if (k == 1 || d <= on->pm[k - 1]) { /* ties: the later checkpoint */
            on->pm[k] = d;
            on->pk[k] = k;
        } else {
            on->pm[k] = on->pm[k - 1];
            on->pk[k] = on->pk[k - 1];
        }
    }
    on->stale = c; /* everything valid */
}

int64_t nbl_online_next(nbl_online *on) {
    if (on == NULL || on->pos == NULL) {
        return -1;
    }
    int64_t i = on->steps++, c = on->slots;
    int64_t *p = on->pos;
    if (on->used < c) { /* x_0 .. x_{c-1}: every slot once, in order */
        int64_t id = on->used++;
        if (id == 0) { /* x_0 heads the prefix for good */
            p[0] = i;
            on->slot[0] = 0;
            on->nfront = 1;
        } else {
            nbl_queue_push(on, i, id);
        }
        on->peak_used = on->used;
        on->stale = 0;
        on->stores++;
        return id;
    }
    if (c == 1) {
        return -1; /* x_0 stays; nothing else fits */
    }
    if (i < on->limit) {
        /* Optimal phase: segment j (from checkpoint j) may grow to c + 1 - j steps. Grow the
         * first one that is not full by dropping the checkpoint after it -- if the merged
         * segment still fits -- and keeping x_i. The segments before it are full and stay
         * so: checkpoints 0 .. j are the prefix p[0 .. j], the later ones a queue that
         * loses its head to a drop (or to the prefix when segment j fills) and gains x_i. */
        int64_t j = on->first_open;
        while (j < c - 1) {
            int64_t head = on->qpos[on->qhead];
            if (head - p[j] < c + 1 - j) {
                break;
            }
            p[on->nfront] = head; /* segment j is full: checkpoint j+1 joins the prefix */
            on->slot[on->nfront] = on->qslot[on->qhead];
            on->nfront++;
            nbl_queue_pop(on);
            j++;
        }
        on->first_open = j;
        if (j == c - 1) {
            return -1;
        }
        int64_t next_end = on->qcount >= 2 ? on->qpos[(on->qhead + 1) % c] : i;
        if (next_end - p[j] > c + 1 - j) {
            return -1;
        }
        int64_t id = on->qslot[on->qhead];
        nbl_queue_pop(on);
        nbl_queue_push(on, i, id);
        on->stores++;
        return id;
    }
    if (on->qcount > 0) { /* leaving the optimal phase: one plain array from now on */
        for (int64_t k = 0; k < on->qcount; k++) {
            p[on->nfront + k] = on->qpos[(on->qhead + k) % c];
            on->slot[on->nfront + k] = on->qslot[(on->qhead + k) % c];
        }
        on->nfront = c;
        on->qcount = 0;
        on->stale = 0;
    }
    /* Beyond it: the choice (drop checkpoint k and keep x_i, or keep nothing) that makes the
     * reversal cheapest were the loop to stop after this step; ties prefer keeping x_i and
     * then dropping the later checkpoint. open = the steps since the newest checkpoint. */
    if (on->stale < c) {
        nbl_online_refresh(on);
    }
    int64_t open = i - p[c - 1];
    /* Drop k = c-1: segments c-2 and the open one merge, with 2 slots. */
    int64_t best = nbl_add_cap(on->pre[c - 2], nbl_cost(p[c - 1] - p[c - 2] + open, 2));
    int64_t best_k = c - 1;
    if (c >= 3) { /* k <= c-2: the open segment closes at x_i and has 2 slots */
        int64_t v = nbl_add_cap(on->pm[c - 2] + on->q[c - 1], nbl_cost(open, 2));
        if (v < best) {
            best = v;
            best_k = on->pk[c - 2];
        }
    }
    int64_t none = nbl_add_cap(on->pre[c - 1], nbl_cost(open + 1, 1));
    if (none < best) {
        return -1;
    }
    return nbl_online_move(on, best_k, i);
}

nb_status nbl_online_reverse_start(nbl_ckpt_rev *rev, const nbl_online *on, int64_t *work,
                                   size_t work_len) {
    if (on == NULL || on->pos == NULL) {
        return NB_ERR_MISUSE;
    }
    int64_t c = on->slots;
    nb_status st = nbl_rev_setup(rev, c, work, work_len);
    if (st != NB_OK) {
        return st;
    }
    /* The sweep used slot ids 0 .. used-1 (ids are handed out in order and then reused);
     * the free ones go on the free stack with the lowest on top. */
    for (int64_t k = 0; k < on->used; k++) {
        nbl_online_at(on, k, &rev->pos[k], &rev->slot[k]);
    }
    rev->depth = on->used;
    rev->nfree = c - on->used;
    for (int64_t i = 0; i < rev->nfree; i++) {
        rev->free_ids[i] = c - 1 - i;
    }
    rev->next = on->steps - 1;
    rev->cur = -1; /* x_n: not used */
    rev->reversing = true;
    rev->counts.forward = on->steps;
    rev->counts.takeshots = on->stores;
    rev->counts.peak_slots = on->peak_used;
    return NB_OK;
}

nb_status nbl_online_simulate(int64_t n, int64_t c, int64_t *work, size_t work_len,
                              nbl_ckpt_counts *out) {
    if (out == NULL || work == NULL) {
        return NB_ERR_MISUSE;
    }
    *out = (nbl_ckpt_counts){0};
    if (n < 0) {
        return NB_ERR_INVALID;
    }
    size_t lon = nbl_online_work_len(c), lrev = nbl_ckpt_rev_work_len(c);
    if (lon == 0 || lrev == 0) {
        return NB_ERR_INVALID;
    }
    if (work_len < lon + lrev) {
        return NB_ERR_TRUNCATED;
    }
    nbl_online on;
    nb_status st = nbl_online_start(&on, c, work, lon);
    if (st != NB_OK) {
        return st;
    }
    for (int64_t i = 0; i < n; i++) {
        (void)nbl_online_next(&on);
    }
    nbl_ckpt_rev rev;
    st = nbl_online_reverse_start(&rev, &on, work + lon, lrev);
    return st != NB_OK ? st : nbl_rev_drain(&rev, out);
}

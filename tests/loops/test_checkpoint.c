/*
 * test_checkpoint.c -- the checkpoint schedules of src/loops/checkpoint.h, without a loop:
 * a simulator executes every action on integer states (the step index a state belongs to)
 * and checks that each step is reversed exactly once, in reverse order, from the right
 * state, with at most the slots given; the counts are checked against revolve's closed
 * form and published rows, brute-force minimisations, the online optimal regime, and
 * Equinox's own counts (tests/loops/oracle/equinox_counts.txt, made by
 * gen_equinox_counts.py beside it).
 */
#include "nbtest.h"

#include "loops/checkpoint.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef NBT_ORACLE_DIR
#define NBT_ORACLE_DIR "tests/loops/oracle"
#endif

/* ---- the simulator -------------------------------------------------------------------------- */

typedef struct sim {
    int64_t c;       /* slots */
    int64_t *slots;  /* [c] the step of the state each slot holds, -1 for none */
    int64_t working; /* the step of the working state, -1 for none */
    int64_t expect;  /* the step whose reverse must come next */
    int64_t advanced, taped, takeshots, restores, peak;
} sim;

static int64_t *xcalloc(size_t n) {
    int64_t *p = calloc(n > 0 ? n : 1, sizeof *p);
    if (p == NULL) {
        fail_msg("out of memory");
    }
    return p;
}

static void sim_init(sim *s, int64_t c, int64_t working, int64_t steps) {
    memset(s, 0, sizeof *s);
    s->c = c;
    s->slots = xcalloc((size_t)c);
    for (int64_t i = 0; i < c; i++) {
        s->slots[i] = -1;
    }
    s->working = working;
    s->expect = steps - 1;
}

/* Slots holding a state that a later reverse may still need (step <= expect). */
static int64_t sim_live(const sim *s) {
    int64_t k = 0;
    for (int64_t i = 0; i < s->c; i++) {
        k += s->slots[i] >= 0 && s->slots[i] <= s->expect;
    }
    return k;
}

/* Execute rev's actions to DONE; fail on the first one that is not well-formed. */
static void sim_run(sim *s, nbl_ckpt_rev *rev, int64_t max_actions) {
    for (int64_t a = 0;; a++) {
        if (a > max_actions) {
            fail_msg("more than %lld actions", (long long)max_actions);
        }
        nbl_ckpt_action act;
        NBT_EQ_I64(nbl_ckpt_next(rev, &act), NB_OK);
        switch (act.op) {
        case NBL_CKPT_ADVANCE:
            NBT_EQ_I64(act.step, s->working);
            NBT_TRUE(act.count >= 1 && act.slot == -1);
            /* Never past the step to reverse next: that work would be wasted. */
            NBT_TRUE(s->working >= 0 && s->working + act.count <= s->expect);
            s->working += act.count;
            s->advanced += act.count;
            break;
        case NBL_CKPT_TAKESHOT:
            NBT_TRUE(act.slot >= 0 && act.slot < s->c && act.count == 0);
            NBT_EQ_I64(act.step, s->working);
            NBT_TRUE(s->working >= 0);
            s->slots[act.slot] = s->working;
            s->takeshots++;
            if (sim_live(s) > s->peak) {
                s->peak = sim_live(s);
            }
            break;
        case NBL_CKPT_RESTORE:
            NBT_TRUE(act.slot >= 0 && act.slot < s->c && act.count == 0);
            NBT_EQ_I64(s->slots[act.slot], act.step);
            NBT_TRUE(act.step >= 0 && act.step <= s->expect);
            s->working = act.step;
            s->restores++;
            break;
        case NBL_CKPT_TAPE:
            NBT_EQ_I64(act.step, s->expect);
            NBT_EQ_I64(s->working, act.step);
            s->expect--;
            s->working = -1;
            s->taped++;
            break;
        case NBL_CKPT_DONE:
            NBT_EQ_I64(s->expect, -1);
            NBT_EQ_I64(nbl_ckpt_next(rev, &act), NB_OK); /* stays done */
            NBT_EQ_I64(act.op, NBL_CKPT_DONE);
            return;
        default:
            fail_msg("unknown action %d", (int)act.op);
        }
    }
}

/* ---- revolve: closed forms ---------------------------------------------------------------- */

/* min over the first step m of m + T(m, s) + T(l - m, s - 1): revolve's recursion. */
static int64_t *brute_revolve_table(int64_t lmax, int64_t smax) {
    int64_t *t = xcalloc((size_t)((lmax + 1) * (smax + 1)));
#define T(l, s) t[(l) * (smax + 1) + (s)]
    for (int64_t s = 1; s <= smax; s++) {
        for (int64_t l = 2; l <= lmax; l++) {
            int64_t best = INT64_MAX;
            if (s == 1) {
                best = l * (l - 1) / 2;
            } else {
                for (int64_t m = 1; m < l; m++) {
                    int64_t v = m + T(m, s) + T(l - m, s - 1);
                    best = v < best ? v : best;
                }
            }
            T(l, s) = best;
        }
    }
#undef T
    return t;
}

static void test_revolve_closed_form(void **state) {
    (void)state;
    /* Published rows (the issue, from Griewank-Walther). */
    NBT_EQ_I64(nbl_revolve_advances(3, 1), 3);
    NBT_EQ_I64(nbl_revolve_advances(10, 2), 20);
    NBT_EQ_I64(nbl_revolve_advances(1000, 10), 3636);
    NBT_EQ_I64(nbl_revolve_advances(10000, 30), 34016);
    NBT_EQ_I64(nbl_revolve_beta(2, 3), 10);
    NBT_EQ_I64(nbl_revolve_beta(30, 0), 1);
    NBT_EQ_I64(nbl_revolve_beta(0, 7), 1);
    NBT_EQ_I64(nbl_revolve_beta(10000, 3), 166766685001LL); /* C(10003, 3) */
    NBT_EQ_I64(nbl_revolve_beta(1000, 1000), INT64_MAX);    /* saturates */
    NBT_EQ_I64(nbl_revolve_beta(-1, 2), -1);
    NBT_EQ_I64(nbl_revolve_repetitions(10, 2), 3);
    NBT_EQ_I64(nbl_revolve_repetitions(1, 5), 0);
    NBT_EQ_I64(nbl_revolve_repetitions(0, 5), 0);
    NBT_EQ_I64(nbl_revolve_repetitions(5, 0), -1);
    NBT_EQ_I64(nbl_revolve_advances(0, 3), 0);
    NBT_EQ_I64(nbl_revolve_advances(1, 3), 0);
    NBT_EQ_I64(nbl_revolve_advances(2, 1), 1);
    NBT_EQ_I64(nbl_revolve_advances(-1, 3), -1);
    NBT_EQ_I64(nbl_revolve_advances(5, 0), -1);
    NBT_EQ_I64(nbl_revolve_advances(50, 100), 49); /* more slots than steps: the sweep only */

    /* Against the recursion it solves, for every l <= 160 and s <= 8. */
    const int64_t lmax = 160, smax = 8;
    int64_t *t = brute_revolve_table(lmax, smax);
    for (int64_t s = 1; s <= smax; s++) {
        for (int64_t l = 0; l <= lmax; l++) {
            int64_t want = l <= 1 ? 0 : t[l * (smax + 1) + s];
            if (nbl_revolve_advances(l, s) != want) {
                fail_msg("t(%lld, %lld) = %lld, recursion %lld", (long long)l, (long long)s,
                         (long long)nbl_revolve_advances(l, s), (long long)want);
            }
        }
    }
    free(t);

    /* Large l: t = sum_{j < r} (l - beta(s, j)) (hockey stick), summed independently with
     * exact integer recurrences; s = 1 is l (l - 1) / 2. */
    const int64_t ls[] = {1000000000, 999999937, 123456789, 65536};
    const int64_t ss[] = {2, 3, 5, 10, 30, 100, 1000, 10000};
    for (size_t a = 0; a < sizeof ls / sizeof *ls; a++) {
        int64_t l = ls[a];
        NBT_EQ_I64(nbl_revolve_advances(l, 1), l * (l - 1) / 2);
        for (size_t b = 0; b < sizeof ss / sizeof *ss; b++) {
            int64_t s = ss[b], sum = 0, beta = 1, r = 0;
            while (beta < l) {
                sum += l - beta;
                r++;
                beta = beta * (s + r) / r; /* exact: beta(s, r-1) (s + r) is r beta(s, r) */
            }
            NBT_EQ_I64(nbl_revolve_repetitions(l, s), r);
            if (nbl_revolve_advances(l, s) != sum) {
                fail_msg("t(%lld, %lld) = %lld, sum %lld", (long long)l, (long long)s,
                         (long long)nbl_revolve_advances(l, s), (long long)sum);
            }
        }
    }
    /* The largest l whose s = 1 count fits, and the first that does not. */
    NBT_EQ_I64(nbl_revolve_advances(4294967296LL, 1), 9223372034707292160LL);
    NBT_EQ_I64(nbl_revolve_advances(4294967298LL, 1), -1);
}

/* ---- revolve: the executed schedule ------------------------------------------------------- */

static void check_revolve(int64_t l, int64_t s) {
    size_t wl = nbl_ckpt_rev_work_len(s);
    int64_t *work = xcalloc(wl);
    nbl_ckpt_rev rev;
    NBT_EQ_I64(nbl_revolve_start(&rev, l, s, work, wl), NB_OK);
    sim sm;
    sim_init(&sm, s, 0, l); /* the working state is x_0, the slots empty */
    int64_t t = nbl_revolve_advances(l, s);
    sim_run(&sm, &rev, 4 * (t + l) + 8);
    if (sm.advanced != t) {
        fail_msg("revolve (l %lld, s %lld): %lld advances, t(l, s) = %lld", (long long)l,
                 (long long)s, (long long)sm.advanced, (long long)t);
    }
    NBT_EQ_I64(sm.taped, l);
    NBT_TRUE(sm.peak <= s);
    NBT_EQ_I64(rev.counts.forward, l > 0 ? l - 1 : 0);
    NBT_EQ_I64(rev.counts.forward + rev.counts.recomputed, t);
    NBT_EQ_I64(rev.counts.taped, l);
    NBT_EQ_I64(rev.counts.takeshots, sm.takeshots);
    NBT_EQ_I64(rev.counts.restores, sm.restores);
    NBT_EQ_I64(rev.counts.peak_slots, sm.peak);

    nbl_ckpt_counts c;
    NBT_EQ_I64(nbl_revolve_simulate(l, s, work, wl, &c), NB_OK);
    NBT_TRUE(memcmp(&c, &rev.counts, sizeof c) == 0);
    free(sm.slots);
    free(work);
}

static void test_revolve_schedule(void **state) {
    (void)state;
    for (int64_t s = 1; s <= 12; s++) {
        for (int64_t l = 0; l <= 300; l++) {
            check_revolve(l, s);
        }
    }
    const int64_t rows[][2] = {{3, 1},     {10, 2},    {1000, 10},  {10000, 30}, {1000, 2},
                               {4096, 3},  {10000, 4}, {10000, 10}, {5000, 100}, {10000, 1000},
                               {20000, 2}, {777, 777}, {778, 777}};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        check_revolve(rows[i][0], rows[i][1]);
    }
    /* The first actions of (10, 2): x_0 to slot 0, the optimal first step, a snapshot. */
    int64_t work[6];
    nbl_ckpt_rev rev;
    nbl_ckpt_action a;
    NBT_EQ_I64(nbl_revolve_start(&rev, 10, 2, work, 6), NB_OK);
    NBT_EQ_I64(nbl_ckpt_next(&rev, &a), NB_OK);
    NBT_TRUE(a.op == NBL_CKPT_TAKESHOT && a.step == 0 && a.slot == 0);
    NBT_EQ_I64(nbl_ckpt_next(&rev, &a), NB_OK);
    NBT_TRUE(a.op == NBL_CKPT_ADVANCE && a.step == 0 && a.count == 6); /* beta(2, 2) = 6 */
    NBT_EQ_I64(nbl_ckpt_next(&rev, &a), NB_OK);
    NBT_TRUE(a.op == NBL_CKPT_TAKESHOT && a.step == 6 && a.slot == 1);
    /* A single step: taped at once, no slot used. */
    NBT_EQ_I64(nbl_revolve_start(&rev, 1, 2, work, 6), NB_OK);
    NBT_EQ_I64(nbl_ckpt_next(&rev, &a), NB_OK);
    NBT_TRUE(a.op == NBL_CKPT_TAPE && a.step == 0);
    NBT_EQ_I64(nbl_ckpt_next(&rev, &a), NB_OK);
    NBT_TRUE(a.op == NBL_CKPT_DONE && a.step == -1);
}

/* ---- online ------------------------------------------------------------------------------ */

/* min over layouts (x_0 first, at most c checkpoints) of sum_j t(L_j, c - j): the offline
 * optimum when the reversal starts from the slots alone. best[k][m]: m steps, k slots. */
static int64_t brute_min_recomputations(int64_t n, int64_t c) {
    int64_t *best = xcalloc((size_t)((c + 1) * (n + 1)));
#define B(k, m) best[(k) * (n + 1) + (m)]
    for (int64_t m = 0; m <= n; m++) {
        B(1, m) = nbl_revolve_advances(m, 1);
    }
    for (int64_t k = 2; k <= c; k++) {
        for (int64_t m = 0; m <= n; m++) {
            int64_t v = nbl_revolve_advances(m, k); /* one segment */
            for (int64_t a = 1; a < m; a++) {       /* first segment a steps, k slots */
                int64_t w = nbl_revolve_advances(a, k) + B(k - 1, m - a);
                v = w < v ? w : v;
            }
            B(k, m) = v;
        }
    }
    int64_t r = B(c, n);
#undef B
    free(best);
    return r;
}

/* Run the online schedule for n steps with c slots through the simulator; its counts. */
static nbl_ckpt_counts check_online(int64_t n, int64_t c) {
    size_t wo = nbl_online_work_len(c), wr = nbl_ckpt_rev_work_len(c);
    int64_t *work = xcalloc(wo + wr);
    nbl_online on;
    NBT_EQ_I64(nbl_online_start(&on, c, work, wo), NB_OK);
    sim sm;
    sim_init(&sm, c, -1, n);
    int64_t stores = 0, peak = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t id = nbl_online_next(&on);
        if (i == 0) {
            NBT_EQ_I64(id, 0); /* x_0 to slot 0 */
        }
        if (id >= 0) {
            NBT_TRUE(id < c);
            NBT_TRUE(i == 0 || id != 0); /* x_0 stays */
            NBT_TRUE(i >= c || id == i); /* the first c states fill the slots in order */
            sm.slots[id] = i;
            stores++;
        }
        int64_t live = 0;
        for (int64_t k = 0; k < c; k++) {
            live += sm.slots[k] >= 0;
        }
        peak = live > peak ? live : peak;
    }
    sm.working = n; /* x_n, which the reversal must not use */
    nbl_ckpt_rev rev;
    NBT_EQ_I64(nbl_online_reverse_start(&rev, &on, work + wo, wr), NB_OK);
    int64_t bound = nbl_revolve_advances(n, 1);
    sim_run(&sm, &rev, 4 * (bound + n) + 8);
    NBT_EQ_I64(sm.taped, n);
    NBT_EQ_I64(rev.counts.forward, n);
    NBT_EQ_I64(rev.counts.recomputed, sm.advanced);
    NBT_EQ_I64(rev.counts.taped, n);
    NBT_EQ_I64(rev.counts.takeshots, stores + sm.takeshots);
    NBT_EQ_I64(rev.counts.restores, sm.restores);
    peak = sm.peak > peak ? sm.peak : peak;
    NBT_EQ_I64(rev.counts.peak_slots, peak);
    NBT_TRUE(peak <= c);

    nbl_ckpt_counts cs;
    NBT_EQ_I64(nbl_online_simulate(n, c, work, wo + wr, &cs), NB_OK);
    NBT_TRUE(memcmp(&cs, &rev.counts, sizeof cs) == 0);
    free(sm.slots);
    free(work);
    return cs;
}

static void test_online_optimal_regime(void **state) {
    (void)state;
    NBT_EQ_I64(nbl_online_optimal_limit(1), 2);
    NBT_EQ_I64(nbl_online_optimal_limit(4), 14);
    NBT_EQ_I64(nbl_online_optimal_limit(30), 495);
    NBT_EQ_I64(nbl_online_optimal_limit(0), -1);
    for (int64_t c = 1; c <= 14; c++) {
        int64_t lim = nbl_online_optimal_limit(c);
        int64_t nmax = c == 1 ? 120 : lim + 60;
        for (int64_t n = 0; n <= nmax; n++) {
            nbl_ckpt_counts k = check_online(n, c);
            int64_t lower = nbl_ckpt_min_recomputations(n, c);
            if (n <= lim) { /* exactly n - c: 2n - c body evaluations in the backward pass */
                int64_t want = n > c ? n - c : 0;
                if (k.recomputed != want || lower != want) {
                    fail_msg("n %lld c %lld: %lld recomputations (bound %lld), want %lld",
                             (long long)n, (long long)c, (long long)k.recomputed, (long long)lower,
                             (long long)want);
                }
            }
            NBT_TRUE(k.recomputed >= lower);
        }
        /* One step past the regime, the best any schedule can do is n - c + 1. */
        if (c >= 2) {
            NBT_EQ_I64(nbl_ckpt_min_recomputations(lim + 1, c), lim + 1 - c + 1);
        }
    }
}

static void test_online_lower_bound(void **state) {
    (void)state;
    /* The closed form against the brute-force minimum over layouts. */
    for (int64_t c = 1; c <= 6; c++) {
        for (int64_t n = 0; n <= 120; n++) {
            int64_t want = brute_min_recomputations(n, c);
            if (nbl_ckpt_min_recomputations(n, c) != want) {
                fail_msg("min recomputations (n %lld, c %lld) = %lld, brute force %lld",
                         (long long)n, (long long)c, (long long)nbl_ckpt_min_recomputations(n, c),
                         (long long)want);
            }
        }
    }
    NBT_EQ_I64(nbl_ckpt_min_recomputations(-1, 3), -1);
    NBT_EQ_I64(nbl_ckpt_min_recomputations(5, 0), -1);
    NBT_EQ_I64(nbl_ckpt_min_recomputations(1000000000, 1), 499999999500000000LL);
    NBT_TRUE(nbl_ckpt_min_recomputations(1000000000, 10000) > 0);
}

/* The longer loops: the counts (pinned; checkpoint.h quotes some), within a few percent of
 * the lower bound, and never more than c slots. */
static void test_online_long(void **state) {
    (void)state;
    const int64_t rows[][3] = {{4096, 2, 240822},     {4096, 5, 33772},      {4096, 12, 14013},
                               {4096, 30, 7669},      {4096, 100, 3996},     {10000, 10, 47731},
                               {10000, 30, 24023},    {10000, 100, 14751},   {10000, 1000, 9000},
                               {100000, 100, 194751}, {1000000, 30, 4623040}};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        int64_t n = rows[i][0], c = rows[i][1];
        nbl_ckpt_counts k = check_online(n, c);
        int64_t lower = nbl_ckpt_min_recomputations(n, c);
        NBT_EQ_I64(k.recomputed, rows[i][2]);
        NBT_TRUE(k.recomputed >= lower);
        if ((double)k.recomputed > 1.05 * (double)lower) {
            fail_msg("n %lld c %lld: %lld recomputations, lower bound %lld", (long long)n,
                     (long long)c, (long long)k.recomputed, (long long)lower);
        }
        NBT_EQ_I64(k.peak_slots, c < n ? c : n);
    }
}

static void test_online_vs_equinox(void **state) {
    (void)state;
    FILE *f = fopen(NBT_ORACLE_DIR "/equinox_counts.txt", "r");
    if (f == NULL) {
        fail_msg("cannot open %s/equinox_counts.txt", NBT_ORACLE_DIR);
    }
    char line[256];
    int rows = 0, published = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (line[0] == '#' || line[0] == '\n') {
            continue;
        }
        long long n, c, theirs, evals;
        if (sscanf(line, "%lld %lld %lld %lld", &n, &c, &theirs, &evals) != 4) {
            fail_msg("bad oracle line: %s", line);
        }
        NBT_EQ_I64(evals, 2 * n + theirs);
        nbl_ckpt_counts k = check_online(n, c);
        if (k.recomputed > theirs) {
            fail_msg("n %lld c %lld: %lld recomputations, Equinox %lld", n, c,
                     (long long)k.recomputed, theirs);
        }
        if (n <= nbl_online_optimal_limit(c)) { /* both optimal: n - c */
            NBT_EQ_I64(k.recomputed, n > c ? n - c : 0);
            NBT_EQ_I64(theirs, n > c ? n - c : 0);
        }
        if (n == 4096 && c == 30) { /* Equinox's published counts */
            NBT_EQ_I64(theirs, 12770);
            published++;
        }
        if (n == 4096 && c == 12) {
            NBT_EQ_I64(theirs, 19127);
            published++;
        }
        rows++;
    }
    fclose(f);
    NBT_TRUE(rows >= 60);
    NBT_EQ_I64(published, 2);
}

/* ---- Equinox's default checkpoint count ------------------------------------------------- */

static void test_default_count(void **state) {
    (void)state;
    NBT_EQ_I64(nbl_ckpt_default_count(1), 1);
    NBT_EQ_I64(nbl_ckpt_default_count(2), 1);
    NBT_EQ_I64(nbl_ckpt_default_count(3), 2);
    NBT_EQ_I64(nbl_ckpt_default_count(4096), 90);
    NBT_EQ_I64(nbl_ckpt_default_count(100000), 446);
    NBT_EQ_I64(nbl_ckpt_default_count(0), 0);
    NBT_EQ_I64(nbl_ckpt_default_count(-5), 0);
    NBT_EQ_I64(nbl_ckpt_default_count(INT64_MAX), 3037000499LL); /* clamped to 2^62 */
    /* Equinox's floating-point formula, for every max_steps up to 2e6 and some large ones;
     * and its own assertion 2 max_steps < (c + 1)(c + 2). */
    for (int64_t m = 2; m <= 2000000; m++) {
        int64_t c = nbl_ckpt_default_count(m);
        int64_t eq = (int64_t)floor(-1.5 + sqrt(2.0 * (double)m + 0.25)) + 1;
        if (c != eq) {
            fail_msg("default count(%lld) = %lld, Equinox's formula %lld", (long long)m,
                     (long long)c, (long long)eq);
        }
        NBT_TRUE(2 * m < (c + 1) * (c + 2) && c * (c + 1) / 2 <= m);
    }
    for (int64_t m = 1000000007; m < 1000000007 + 100000; m += 7) {
        int64_t c = nbl_ckpt_default_count(m);
        NBT_EQ_I64(c, (int64_t)floor(-1.5 + sqrt(2.0 * (double)m + 0.25)) + 1);
    }
}

/* ---- misuse ------------------------------------------------------------------------------ */

static void test_misuse(void **state) {
    (void)state;
    int64_t work[64];
    nbl_ckpt_rev rev;
    nbl_online on;
    nbl_ckpt_action a;
    nbl_ckpt_counts c;
    NBT_EQ_I64(nbl_ckpt_rev_work_len(0), 0);
    NBT_EQ_I64(nbl_ckpt_rev_work_len(4), 12);
    NBT_EQ_I64(nbl_online_work_len(-1), 0);
    NBT_EQ_I64(nbl_revolve_start(NULL, 5, 2, work, 64), NB_ERR_MISUSE);
    NBT_EQ_I64(nbl_revolve_start(&rev, 5, 2, NULL, 64), NB_ERR_MISUSE);
    NBT_EQ_I64(nbl_revolve_start(&rev, -1, 2, work, 64), NB_ERR_INVALID);
    NBT_EQ_I64(nbl_revolve_start(&rev, 5, 0, work, 64), NB_ERR_INVALID);
    NBT_EQ_I64(nbl_revolve_start(&rev, 5, 2, work, 5), NB_ERR_TRUNCATED);
    NBT_EQ_I64(nbl_ckpt_next(NULL, &a), NB_ERR_MISUSE);
    NBT_EQ_I64(a.op, NBL_CKPT_DONE);
    NBT_EQ_I64(nbl_ckpt_next(&rev, NULL), NB_ERR_MISUSE);
    NBT_EQ_I64(nbl_revolve_simulate(5, 2, work, 64, NULL), NB_ERR_MISUSE);
    NBT_EQ_I64(nbl_revolve_simulate(5, 2, work, 2, &c), NB_ERR_TRUNCATED);
    NBT_EQ_I64(nbl_online_start(NULL, 2, work, 64), NB_ERR_MISUSE);
    NBT_EQ_I64(nbl_online_start(&on, 0, work, 64), NB_ERR_INVALID);
    NBT_EQ_I64(nbl_online_start(&on, 20, work, 64), NB_ERR_TRUNCATED);
    NBT_EQ_I64(nbl_online_next(NULL), -1);
    NBT_EQ_I64(nbl_online_reverse_start(&rev, NULL, work, 64), NB_ERR_MISUSE);
    NBT_EQ_I64(nbl_online_start(&on, 4, work, 31), NB_ERR_TRUNCATED);
    NBT_EQ_I64(nbl_online_start(&on, 4, work, 32), NB_OK);
    NBT_EQ_I64(nbl_online_reverse_start(&rev, &on, work + 32, 11), NB_ERR_TRUNCATED);
    NBT_EQ_I64(nbl_online_reverse_start(&rev, &on, work + 32, 12), NB_OK);
    NBT_EQ_I64(nbl_ckpt_next(&rev, &a), NB_OK); /* no steps: done at once */
    NBT_EQ_I64(a.op, NBL_CKPT_DONE);
    NBT_EQ_I64(nbl_online_simulate(-1, 2, work, 64, &c), NB_ERR_INVALID);
    NBT_EQ_I64(nbl_online_simulate(5, 0, work, 64, &c), NB_ERR_INVALID);
    NBT_EQ_I64(nbl_online_simulate(5, 10, work, 64, &c), NB_ERR_TRUNCATED);
    NBT_EQ_I64(nbl_online_simulate(5, 2, NULL, 64, &c), NB_ERR_MISUSE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_revolve_closed_form),   cmocka_unit_test(test_revolve_schedule),
        cmocka_unit_test(test_online_optimal_regime), cmocka_unit_test(test_online_lower_bound),
        cmocka_unit_test(test_online_long),           cmocka_unit_test(test_online_vs_equinox),
        cmocka_unit_test(test_default_count),         cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

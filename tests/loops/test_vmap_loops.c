/*
 * test_vmap_loops.c -- nb_vmap of loops (JAX's semantics: the batched loop runs while any
 * lane's cond holds, a finished lane keeps its carry):
 *   - a while loop (lax, checkpointed, bounded) whose lanes stop after different numbers
 *     of steps, the cond's and the body's bound data batched or not, bit for bit against
 *     one call per lane;
 *   - derivatives: vmap of grad (per-lane gradients, the loop checkpointed and bounded)
 *     bit for bit against one grad per lane; grad of vmap (the gradient of the sum)
 *     against the sum of the lanes' gradients;
 *   - an ensemble of Lotka-Volterra solves: each lane's saved states, result code and
 *     steps its own solve's (lanes stopping at max_steps alone), per-lane gradients through
 *     the recursive checkpoint adjoint (explicit and stiff solvers), bit for bit;
 *   - allocation failures over jit(vmap(grad)) of a checkpointed loop.
 */
#include "nbtest.h"

#include <math.h>
#include <string.h>

#define NL 5 /* lanes */

static double at(const nb_tree *t, int64_t i) {
    double v = NAN;
    nb_array_get_flat(nb_tree_get_array(t), i, &v);
    return v;
}

static nb_tree *f64_leaf(nb_ctx *ctx, int rank, const int64_t *shape, const double *v) {
    nb_array *a = nbt_arr_f64(ctx, rank, shape, v);
    nb_tree *l = NULL;
    NBT_OK(ctx, nb_tree_array(a, &l));
    nb_array_destroy(a);
    return l;
}

static nb_tree *scalar_leaf(nb_ctx *ctx, double v) {
    return f64_leaf(ctx, 0, NULL, &v);
}

/* The loop: carry (x, n) with x f64[2]; while x[0] + x[1] < lim: x = x a + 0.3 + 0.25
 * sin(x^2), n += 1 (x grows by at least 0.05 a step). lim is the cond's bound data, a the
 * body's. */
static nb_status cond_fn(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *x = nb_get(tr, args, "[0]"), *lim = nb_var_of(tr, self);
    return nb_return(nb_lt(nb_sum(x, NULL, 0, false), lim), out);
}

static nb_status body_fn(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *x = nb_get(tr, args, "[0]"), *n = nb_get(tr, args, "[1]"), *a = nb_var_of(tr, self);
    nb_var *x1 = nb_add(nb_mul(x, a), nb_add(nb_scalar(tr, 0.3),
                                             nb_mul(nb_scalar(tr, 0.25), nb_sin(nb_square(x)))));
    nb_tree *l[2] = {nb_leaf(x1), nb_leaf(nb_add(n, nb_scalar_typed(tr, NB_DTYPE_I32, 1.0)))};
    return nb_tree_tuple(nb_trace_ctx(tr), 2, l, out); /* nb_leaf trees: the trace's */
}

/* self: loop kind (int); args: (x0 f64[2], a f64, lim f64) -> (x final, n, loss = sum x^2) */
static nb_status body_loop(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    int64_t kind = 0;
    nb_tree_get_int(self, &kind);
    nb_fn *c = NULL, *b = NULL;
    nb_tree *init = NULL;
    nb_tree *l[2] = {nb_leaf(nb_get(tr, args, "[0]")),
                     nb_leaf(nb_scalar_typed(tr, NB_DTYPE_I32, 0.0))};
    /* no asserts while tracing: the allocation-failure sweep fails these calls */
    nb_status st = nb_fn_create(ctx, "cond", cond_fn, nb_tree_child(args, 2), &c);
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "body", body_fn, nb_tree_child(args, 1), &b);
    }
    if (st == NB_OK) {
        st = nb_trace_status(tr) != NB_OK ? nb_trace_status(tr) : nb_tree_tuple(ctx, 2, l, &init);
    }
    if (st != NB_OK) {
        nb_fn_destroy(c);
        nb_fn_destroy(b);
        return st;
    }
    nb_loop_opts o = nb_loop_opts_default();
    o.kind = (nb_loop_kind)kind;
    o.max_steps = kind == NB_LOOP_LAX ? 0 : 40;
    o.checkpoints = kind == NB_LOOP_CHECKPOINTED ? 3 : 0;
    const nb_tree *r = nb_while_loop(tr, c, b, init, &o);
    nb_tree_destroy(init);
    nb_fn_destroy(c);
    nb_fn_destroy(b);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *x = nb_get(tr, r, "[0]");
    nb_tree *o3[3] = {nb_leaf(x), nb_leaf(nb_get(tr, r, "[1]")),
                      nb_leaf(nb_sum(nb_square(x), NULL, 0, false))};
    return nb_tree_tuple(ctx, 3, o3, out);
}

/* lanes' data: x0 [NL, 2], a [NL], lim [NL] */
static void lane_data(double *x0, double *a, double *lim) {
    for (int b = 0; b < NL; b++) {
        x0[2 * b] = 0.1 + 0.05 * b;
        x0[2 * b + 1] = 0.2 - 0.01 * b;
        a[b] = 1.1 + 0.07 * b;
        lim[b] = 2.0 + 1.5 * b;
    }
}

static nb_tree *lane_args(nb_ctx *ctx, const double *x0, double a, double lim) {
    nb_tree *l[3] = {f64_leaf(ctx, 1, (int64_t[]){2}, x0), scalar_leaf(ctx, a),
                     scalar_leaf(ctx, lim)};
    return nbt_tuple_take(ctx, 3, l);
}

/* in_axes for (x0, a, lim): batched 0 or null (-99) */
static nb_tree *axes3(nb_ctx *ctx, int ax, int aa, int al) {
    int v[3] = {ax, aa, al};
    nb_tree *l[3];
    for (int i = 0; i < 3; i++) {
        if (v[i] == -99) {
            NBT_OK(ctx, nb_tree_null(ctx, &l[i]));
        } else {
            NBT_OK(ctx, nb_tree_int(ctx, v[i], &l[i]));
        }
    }
    return nbt_tuple_take(ctx, 3, l);
}

static bool same_bits(double a, double b) {
    return memcmp(&a, &b, sizeof a) == 0;
}

/* a vmapped while: lanes with their own trip counts, each bit for bit its own call */
static void test_while_lanes(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    double x0[2 * NL], a[NL], lim[NL];
    lane_data(x0, a, lim);
    /* (batched x0, a, lim), (x0 and lim batched, a shared), (only lim batched) */
    static const int cases[3][3] = {{0, 0, 0}, {0, -99, 0}, {-99, -99, 0}};
    for (int kind = NB_LOOP_LAX; kind <= NB_LOOP_BOUNDED; kind++) {
        for (int c = 0; c < 3; c++) {
            nb_tree *self = NULL;
            NBT_OK(ctx, nb_tree_int(ctx, kind, &self));
            nb_fn *f = NULL, *v = NULL;
            NBT_OK(ctx, nb_fn_create(ctx, "loop", body_loop, self, &f));
            nb_vmap_opts vo = nb_vmap_opts_default();
            vo.in_axes = axes3(ctx, cases[c][0], cases[c][1], cases[c][2]);
            NBT_OK(ctx, nb_vmap(f, &vo, &v));
            nb_tree *l[3] = {cases[c][0] == 0 ? f64_leaf(ctx, 2, (int64_t[]){NL, 2}, x0)
                                              : f64_leaf(ctx, 1, (int64_t[]){2}, x0),
                             cases[c][1] == 0 ? f64_leaf(ctx, 1, (int64_t[]){NL}, a)
                                              : scalar_leaf(ctx, a[0]),
                             f64_leaf(ctx, 1, (int64_t[]){NL}, lim)};
            nb_tree *args = nbt_tuple_take(ctx, 3, l), *out = NULL;
            NBT_OK(ctx, nb_fn_call(v, args, &out));
            int steps_min = 1000, steps_max = 0, bad = 0;
            for (int b = 0; b < NL; b++) {
                const double *xb = cases[c][0] == 0 ? x0 + 2 * b : x0;
                double ab = cases[c][1] == 0 ? a[b] : a[0];
                nb_tree *la = lane_args(ctx, xb, ab, lim[b]), *lo = NULL;
                NBT_OK(ctx, nb_fn_call(f, la, &lo));
                int n = (int)at(nb_tree_child(lo, 1), 0);
                steps_min = n < steps_min ? n : steps_min;
                steps_max = n > steps_max ? n : steps_max;
                bad += !same_bits(at(nb_tree_child(out, 0), 2 * b), at(nb_tree_child(lo, 0), 0));
                bad +=
                    !same_bits(at(nb_tree_child(out, 0), 2 * b + 1), at(nb_tree_child(lo, 0), 1));
                bad += (int)at(nb_tree_child(out, 1), b) != n;
                bad += !same_bits(at(nb_tree_child(out, 2), b), at(nb_tree_child(lo, 2), 0));
                nb_tree_destroy(lo);
                nb_tree_destroy(la);
            }
            print_message("kind %d case %d: lanes' steps %d..%d, %d lanes differ\n", kind, c,
                          steps_min, steps_max, bad);
            NBT_EQ_I64(bad, 0);
            NBT_TRUE(steps_max > steps_min); /* the lanes stop at different steps */
            nb_tree_destroy(out);
            nb_tree_destroy(args);
            nb_tree_destroy((nb_tree *)vo.in_axes);
            nb_fn_destroy(v);
            nb_fn_destroy(f);
            nb_tree_destroy(self);
        }
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- derivatives ---------------------------------------------------------------------- */

/* self: loop kind; args: ((x0, a), lim) -> sum x^2 at the loop's end */
static nb_status body_lossfn(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_tree *l[3] = {nb_leaf(nb_get(tr, args, "[0][0]")), nb_leaf(nb_get(tr, args, "[0][1]")),
                     nb_leaf(nb_get(tr, args, "[1]"))};
    nb_tree *a3 = NULL, *r = NULL;
    nb_status st = nb_tree_tuple(ctx, 3, l, &a3);
    if (st == NB_OK) {
        st = body_loop(tr, self, a3, &r);
    }
    nb_tree_destroy(a3);
    if (st != NB_OK) {
        nb_tree_destroy(r);
        return st;
    }
    st = nb_return(nb_get(tr, r, "[2]"), out);
    nb_tree_destroy(r);
    return st;
}

/* in_axes ((ax, aa), al) */
static nb_tree *axes_p(nb_ctx *ctx, int ax, int aa, int al) {
    nb_tree *t = axes3(ctx, ax, aa, al), *p = NULL, *l[2];
    NBT_OK(ctx,
           nb_tree_tuple(
               ctx, 2,
               (nb_tree *[]){(nb_tree *)nb_tree_child(t, 0), (nb_tree *)nb_tree_child(t, 1)}, &p));
    l[0] = p;
    l[1] = nb_tree_retain((nb_tree *)nb_tree_child(t, 2));
    nb_tree_destroy(t);
    return nbt_tuple_take(ctx, 2, l);
}

static nb_tree *p_args(nb_ctx *ctx, nb_tree *x0, nb_tree *a, nb_tree *lim) {
    nb_tree *p = nbt_tuple_take(ctx, 2, (nb_tree *[]){x0, a});
    return nbt_tuple_take(ctx, 2, (nb_tree *[]){p, lim});
}

static nb_fn *g_vloss;
static nb_status body_sum_v(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *r = nb_apply(tr, g_vloss, args);
    return r != NULL ? nb_return(nb_sum(nb_var_of(tr, r), NULL, 0, false), out)
                     : nb_trace_status(tr);
}

/* vmap(grad(loss)): per-lane gradients through a checkpointed and a bounded loop, bit for
 * bit one grad per lane (x0 batched, a shared: its gradient per lane); grad(sum vmap(loss))
 * within 1e-13 of the lanes' gradients summed. */
static void test_loop_derivatives(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    double x0[2 * NL], a[NL], lim[NL];
    lane_data(x0, a, lim);
    for (int kind = NB_LOOP_CHECKPOINTED; kind <= NB_LOOP_BOUNDED; kind++) {
        nb_tree *self = NULL;
        NBT_OK(ctx, nb_tree_int(ctx, kind, &self));
        nb_fn *f = NULL, *g = NULL, *vg = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "loss", body_lossfn, self, &f));
        NBT_OK(ctx, nb_grad(f, NULL, &g));
        nb_vmap_opts vo = nb_vmap_opts_default();
        vo.in_axes = axes_p(ctx, 0, -99, 0);
        NBT_OK(ctx, nb_vmap(g, &vo, &vg));
        nb_tree *args = p_args(ctx, f64_leaf(ctx, 2, (int64_t[]){NL, 2}, x0),
                               scalar_leaf(ctx, a[0]), f64_leaf(ctx, 1, (int64_t[]){NL}, lim));
        nb_tree *out = NULL;
        NBT_OK(ctx, nb_fn_call(vg, args, &out));
        double sum_gx[2 * NL], sum_ga = 0;
        int bad = 0;
        for (int b = 0; b < NL; b++) {
            nb_tree *la = p_args(ctx, f64_leaf(ctx, 1, (int64_t[]){2}, x0 + 2 * b),
                                 scalar_leaf(ctx, a[0]), scalar_leaf(ctx, lim[b]));
            nb_tree *lo = NULL;
            NBT_OK(ctx, nb_fn_call(g, la, &lo));
            for (int i = 0; i < 2; i++) {
                sum_gx[2 * b + i] = at(nb_tree_child(lo, 0), i);
                bad += !same_bits(at(nb_tree_child(out, 0), 2 * b + i), sum_gx[2 * b + i]);
            }
            double ga = at(nb_tree_child(lo, 1), 0);
            sum_ga += ga;
            bad += !same_bits(at(nb_tree_child(out, 1), b), ga);
            nb_tree_destroy(lo);
            nb_tree_destroy(la);
        }
        print_message("kind %d: vmap(grad): %d of %d per-lane gradient elements differ\n", kind,
                      bad, 3 * NL);
        NBT_EQ_I64(bad, 0);
        nb_tree_destroy(out);
        /* grad of the vmapped loss summed over the lanes */
        nb_fn *v = NULL, *s = NULL, *gs = NULL;
        NBT_OK(ctx, nb_vmap(f, &vo, &v));
        g_vloss = v;
        nb_tree *tag = NULL;
        NBT_OK(ctx, nb_tree_int(ctx, kind, &tag));
        NBT_OK(ctx, nb_fn_create(ctx, "sum_v", body_sum_v, tag, &s));
        nb_tree_destroy(tag);
        NBT_OK(ctx, nb_grad(s, NULL, &gs));
        NBT_OK(ctx, nb_fn_call(gs, args, &out));
        double e = fabs(at(nb_tree_child(out, 1), 0) - sum_ga) / fabs(sum_ga);
        for (int i = 0; i < 2 * NL; i++) {
            e = nbt_max(e, fabs(at(nb_tree_child(out, 0), i) - sum_gx[i]) / fabs(sum_gx[i]));
        }
        print_message("kind %d: grad(sum vmap): worst relative difference %.2e\n", kind, e);
        NBT_TRUE(e <= 1e-13);
        nb_tree_destroy(out);
        nb_fn_destroy(gs);
        nb_fn_destroy(s);
        nb_fn_destroy(v);
        nb_tree_destroy(args);
        nb_tree_destroy((nb_tree *)vo.in_axes);
        nb_fn_destroy(vg);
        nb_fn_destroy(g);
        nb_fn_destroy(f);
        nb_tree_destroy(self);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- an ensemble of ODE solves ----------------------------------------------------------- */

/* Lotka-Volterra: state (x, y) f64[2], args (a, b, c, d) f64[4] */
static nb_status term_lv(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *s = nb_get(tr, args, "[1]"), *p = nb_get(tr, args, "[2]");
    nb_var *x = nb_slice(s, (int64_t[]){0}, (int64_t[]){1}, NULL);
    nb_var *y = nb_slice(s, (int64_t[]){1}, (int64_t[]){2}, NULL);
    nb_var *pa = nb_slice(p, (int64_t[]){0}, (int64_t[]){1}, NULL);
    nb_var *pb = nb_slice(p, (int64_t[]){1}, (int64_t[]){2}, NULL);
    nb_var *pc = nb_slice(p, (int64_t[]){2}, (int64_t[]){3}, NULL);
    nb_var *pd = nb_slice(p, (int64_t[]){3}, (int64_t[]){4}, NULL);
    nb_var *xy = nb_mul(x, y);
    nb_var *dx = nb_sub(nb_mul(pa, x), nb_mul(pb, xy));
    nb_var *dy = nb_add(nb_neg(nb_mul(pc, y)), nb_mul(pd, xy));
    return nb_return(nb_concatenate(2, (nb_var *[]){dx, dy}, 0), out);
}

/* self: (max_steps, saveat kind); args: (y0 f64[2], p f64[4]) -> (ys, result, num_steps,
 * loss = sum ys^2) */
static nb_status body_lv(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    int64_t max_steps = 0, save = 0, solver = NB_ODE_TSIT5;
    nb_tree_get_int(nb_tree_child(self, 0), &max_steps);
    nb_tree_get_int(nb_tree_child(self, 1), &save);
    if (nb_tree_len(self) > 2) {
        nb_tree_get_int(nb_tree_child(self, 2), &solver);
    }
    nb_fn *term = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "lv", term_lv, NULL, &term));
    static const double ts[4] = {1.0, 2.5, 4.0, 6.0};
    nb_ode_opts o = nb_ode_opts_default();
    o.solver = (nb_ode_solver)solver;
    o.t0 = 0.0;
    o.t1 = 6.0;
    o.controller = nb_ode_pid(1e-8, 1e-8);
    o.max_steps = max_steps;
    if (save == NB_SAVEAT_TS) {
        o.saveat.kind = NB_SAVEAT_TS;
        o.saveat.ts = ts;
        o.saveat.n_ts = 4;
    }
    const nb_tree *sol =
        nb_diffeqsolve(tr, term, nb_tree_child(args, 0), nb_tree_child(args, 1), &o);
    nb_fn_destroy(term);
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *ys = nb_get(tr, sol, "ys");
    nb_tree *l[4] = {nb_leaf(ys), nb_leaf(nb_get(tr, sol, "result")),
                     nb_leaf(nb_get(tr, sol, "stats.num_steps")),
                     nb_leaf(nb_sum(nb_square(ys), NULL, 0, false))};
    return nb_tree_tuple(ctx, 4, l, out);
}

static nb_status body_lv_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    nb_tree *r = NULL;
    nb_status st = body_lv(tr, self, args, &r);
    if (st != NB_OK) {
        nb_tree_destroy(r);
        return st;
    }
    st = nb_return(nb_get(tr, r, "[3]"), out);
    nb_tree_destroy(r);
    return st;
}

/* jit(vmap(grad)) of the checkpointed while-loss, x0 and lim batched, a shared */
static nb_status scenario_loop(nb_ctx *ctx) {
    double x0[2 * NL], a[NL], lim[NL];
    lane_data(x0, a, lim);
    nb_tree *self = NULL, *px = NULL, *pa = NULL, *pl = NULL, *p = NULL, *args = NULL, *out = NULL,
            *ia = NULL, *i0 = NULL, *i1 = NULL, *i2 = NULL, *ip = NULL;
    nb_array *arr[3] = {NULL};
    nb_fn *f = NULL, *g = NULL, *vg = NULL, *j = NULL;
    nb_status st = nb_tree_int(ctx, NB_LOOP_CHECKPOINTED, &self);
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "loss", body_lossfn, self, &f);
    }
    if (st == NB_OK) {
        st = nb_grad(f, NULL, &g);
    }
    if (st == NB_OK) {
        st = nb_tree_int(ctx, 0, &i0);
    }
    if (st == NB_OK) {
        st = nb_tree_null(ctx, &i1);
    }
    if (st == NB_OK) {
        st = nb_tree_int(ctx, 0, &i2);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){i0, i1}, &ip);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){ip, i2}, &ia);
    }
    if (st == NB_OK) {
        nb_vmap_opts o = nb_vmap_opts_default();
        o.in_axes = ia;
        st = nb_vmap(g, &o, &vg);
    }
    if (st == NB_OK) {
        st = nb_jit(vg, NULL, &j);
    }
    if (st == NB_OK) {
        st = nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){NL, 2}, x0, &arr[0]);
    }
    if (st == NB_OK) {
        st = nb_array_from_data(ctx, NB_DTYPE_F64, 0, NULL, a, &arr[1]);
    }
    if (st == NB_OK) {
        st = nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){NL}, lim, &arr[2]);
    }
    nb_tree **leaves[3] = {&px, &pa, &pl};
    for (int k = 0; k < 3 && st == NB_OK; k++) {
        st = nb_tree_array(arr[k], leaves[k]);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){px, pa}, &p);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){p, pl}, &args);
    }
    if (st == NB_OK) {
        st = nb_fn_call(j, args, &out);
    }
    nb_tree *ts[] = {self, px, pa, pl, p, args, out, ia, i0, i1, i2, ip};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        nb_tree_destroy(ts[i]);
    }
    for (int k = 0; k < 3; k++) {
        nb_array_destroy(arr[k]);
    }
    nb_fn_destroy(j);
    nb_fn_destroy(vg);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nb_ctx_clear_cache(ctx);
    return st;
}

/* allocation failures over jit(vmap(grad)) of a checkpointed loop: NB_ERR_OOM at every
 * point, nothing leaked */
static void test_out_of_memory(void **state) {
    (void)state;
    int points = nbt_oom_sweep("scenario_loop", scenario_loop, false, false);
    print_message("allocation failures: %d points, each NB_ERR_OOM with nothing leaked\n", points);
    NBT_TRUE(points > 100);
}

/* A batch of Lotka-Volterra solves (tsit5, rtol 1e-8) over a grid of parameters and
 * initial states: each lane's ys, result code and step count equal its own solve's, bit
 * for bit -- with max_steps small enough that the lanes needing the most steps stop with
 * max_steps_reached in their own result while the others succeed; and the gradient of the
 * summed loss (recursive checkpoint adjoint), per lane (vmap of grad), bit for bit the
 * lane's own gradient. SaveAt t1 and SaveAt ts. */
static void test_ode_ensemble(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    enum { NE = 6 };
    double y0[2 * NE], p[4 * NE];
    for (int b = 0; b < NE; b++) {
        y0[2 * b] = 1.0 + 0.3 * b;
        y0[2 * b + 1] = 0.5 + 0.1 * b;
        p[4 * b] = 1.5 - 0.05 * b;
        p[4 * b + 1] = 1.0;
        p[4 * b + 2] = 3.0 + 0.4 * b;
        p[4 * b + 3] = 1.0 + 0.2 * b;
    }
    for (int save = NB_SAVEAT_T1; save <= NB_SAVEAT_TS; save++) {
        for (int lim = 0; lim < 2; lim++) {
            int64_t max_steps = lim ? 120 : 4096;
            nb_tree *s0 = NULL, *s1 = NULL;
            NBT_OK(ctx, nb_tree_int(ctx, max_steps, &s0));
            NBT_OK(ctx, nb_tree_int(ctx, save, &s1));
            nb_tree *self = nbt_tuple_take(ctx, 2, (nb_tree *[]){s0, s1});
            nb_fn *f = NULL, *v = NULL;
            NBT_OK(ctx, nb_fn_create(ctx, "lv_solve", body_lv, self, &f));
            NBT_OK(ctx, nb_vmap(f, NULL, &v));
            nb_tree *args = nbt_tuple_take(ctx, 2,
                                           (nb_tree *[]){f64_leaf(ctx, 2, (int64_t[]){NE, 2}, y0),
                                                         f64_leaf(ctx, 2, (int64_t[]){NE, 4}, p)});
            nb_tree *out = NULL;
            NBT_OK(ctx, nb_fn_call(v, args, &out));
            int bad = 0, n_fail = 0, smin = 1 << 30, smax = 0;
            int64_t nrow = nb_array_size(nb_tree_get_array(nb_tree_child(out, 0))) / NE;
            for (int b = 0; b < NE; b++) {
                nb_tree *la =
                    nbt_tuple_take(ctx, 2,
                                   (nb_tree *[]){f64_leaf(ctx, 1, (int64_t[]){2}, y0 + 2 * b),
                                                 f64_leaf(ctx, 1, (int64_t[]){4}, p + 4 * b)});
                nb_tree *lo = NULL;
                NBT_OK(ctx, nb_fn_call(f, la, &lo));
                for (int64_t i = 0; i < nrow; i++) {
                    bad += !same_bits(at(nb_tree_child(out, 0), b * nrow + i),
                                      at(nb_tree_child(lo, 0), i));
                }
                int res = (int)at(nb_tree_child(lo, 1), 0),
                    steps = (int)at(nb_tree_child(lo, 2), 0);
                bad += (int)at(nb_tree_child(out, 1), b) != res;
                bad += (int)at(nb_tree_child(out, 2), b) != steps;
                n_fail += res != NB_ODE_SUCCESSFUL;
                smin = steps < smin ? steps : smin;
                smax = steps > smax ? steps : smax;
                nb_tree_destroy(lo);
                nb_tree_destroy(la);
            }
            print_message("saveat %d, max_steps %lld: lanes' steps %d..%d, %d lanes stopped at "
                          "max_steps, %d values differ\n",
                          save, (long long)max_steps, smin, smax, n_fail, bad);
            NBT_EQ_I64(bad, 0);
            NBT_TRUE(smax > smin);
            if (lim) { /* some lanes fail, not all */
                NBT_TRUE(n_fail > 0 && n_fail < NE);
            } else {
                NBT_EQ_I64(n_fail, 0);
            }
            nb_tree_destroy(out);
            if (!lim) { /* per-lane gradients */
                nb_fn *fl = NULL, *g = NULL, *vg = NULL;
                NBT_OK(ctx, nb_fn_create(ctx, "lv_loss", body_lv_loss, self, &fl));
                NBT_OK(ctx, nb_grad(fl, NULL, &g));
                NBT_OK(ctx, nb_vmap(g, NULL, &vg));
                NBT_OK(ctx, nb_fn_call(vg, args, &out));
                int gbad = 0;
                for (int b = 0; b < NE; b++) {
                    nb_tree *la =
                        nbt_tuple_take(ctx, 2,
                                       (nb_tree *[]){f64_leaf(ctx, 1, (int64_t[]){2}, y0 + 2 * b),
                                                     f64_leaf(ctx, 1, (int64_t[]){4}, p + 4 * b)});
                    nb_tree *lo = NULL;
                    NBT_OK(ctx, nb_fn_call(g, la, &lo));
                    for (int i = 0; i < 2; i++) {
                        gbad += !same_bits(at(out, 2 * b + i), at(lo, i));
                    }
                    nb_tree_destroy(lo);
                    nb_tree_destroy(la);
                }
                print_message("saveat %d: vmap(grad): %d of %d gradient elements differ\n", save,
                              gbad, 2 * NE);
                NBT_EQ_I64(gbad, 0);
                /* the gradient of the loss summed over the lanes (grad of vmap): the same */
                nb_fn *vl = NULL, *s = NULL, *gs = NULL;
                NBT_OK(ctx, nb_vmap(fl, NULL, &vl));
                g_vloss = vl;
                nb_tree *tag = NULL;
                NBT_OK(ctx, nb_tree_int(ctx, 100 + save, &tag));
                NBT_OK(ctx, nb_fn_create(ctx, "sum_v", body_sum_v, tag, &s));
                nb_tree_destroy(tag);
                NBT_OK(ctx, nb_grad(s, NULL, &gs));
                nb_tree *sout = NULL;
                NBT_OK(ctx, nb_fn_call(gs, args, &sout));
                double e = 0, m = 0;
                for (int i = 0; i < 2 * NE; i++) {
                    m = nbt_max(m, fabs(at(out, i)));
                }
                for (int i = 0; i < 2 * NE; i++) {
                    e = nbt_max(e, fabs(at(sout, i) - at(out, i)) / m);
                }
                print_message("saveat %d: grad(sum vmap) vs the lanes' gradients: %.2e\n", save, e);
                NBT_TRUE(e <= 1e-13);
                nb_tree_destroy(sout);
                nb_fn_destroy(gs);
                nb_fn_destroy(s);
                nb_fn_destroy(vl);
                nb_tree_destroy(out);
                nb_fn_destroy(vg);
                nb_fn_destroy(g);
                nb_fn_destroy(fl);
            }
            nb_tree_destroy(args);
            nb_fn_destroy(v);
            nb_fn_destroy(f);
            nb_tree_destroy(self);
        }
    }
    /* the other adaptive solvers (SaveAt ts): the stiff ones' solutions, and every one's
     * per-lane gradients -- bit for bit each lane's own, and finite (a finished lane's
     * discarded step has h = 0, where the Newton matrix I / (h gamma) - J and the dense
     * output would be infinite: the solver steps 2^-20 |t| there instead) */
    static const int solvers[] = {NB_ODE_RODAS5P, NB_ODE_KVAERNO5, NB_ODE_BDF,
                                  NB_ODE_BOSH3,   NB_ODE_DOPRI5,   NB_ODE_DOPRI8,
                                  NB_ODE_RODAS5P, NB_ODE_KVAERNO5, NB_ODE_BDF};
    for (size_t si = 0; si < sizeof solvers / sizeof solvers[0]; si++) {
        bool stiff = si < 3; /* the solution; every gradient after it */
        nb_tree *s[3] = {NULL, NULL, NULL};
        NBT_OK(ctx, nb_tree_int(ctx, 4096, &s[0]));
        NBT_OK(ctx, nb_tree_int(ctx, NB_SAVEAT_TS, &s[1]));
        NBT_OK(ctx, nb_tree_int(ctx, solvers[si], &s[2]));
        nb_tree *self = nbt_tuple_take(ctx, 3, s);
        nb_fn *fl = NULL, *g = NULL, *vg = NULL;
        if (stiff) {
            NBT_OK(ctx, nb_fn_create(ctx, "lv_solve", body_lv, self, &g));
        } else {
            NBT_OK(ctx, nb_fn_create(ctx, "lv_loss", body_lv_loss, self, &fl));
            NBT_OK(ctx, nb_grad(fl, NULL, &g));
        }
        NBT_OK(ctx, nb_vmap(g, NULL, &vg));
        nb_tree *args = nbt_tuple_take(ctx, 2,
                                       (nb_tree *[]){f64_leaf(ctx, 2, (int64_t[]){NE, 2}, y0),
                                                     f64_leaf(ctx, 2, (int64_t[]){NE, 4}, p)});
        nb_tree *out = NULL;
        NBT_OK(ctx, nb_fn_call(vg, args, &out));
        int gbad = 0, nonfinite = 0;
        for (int b = 0; b < NE; b++) {
            nb_tree *la =
                nbt_tuple_take(ctx, 2,
                               (nb_tree *[]){f64_leaf(ctx, 1, (int64_t[]){2}, y0 + 2 * b),
                                             f64_leaf(ctx, 1, (int64_t[]){4}, p + 4 * b)});
            nb_tree *lo = NULL;
            NBT_OK(ctx, nb_fn_call(g, la, &lo));
            const nb_tree *ob = stiff ? nb_tree_child(out, 0) : out;
            const nb_tree *lb = stiff ? nb_tree_child(lo, 0) : lo;
            int n = stiff ? 8 : 2; /* the 4 saved states, or the gradient */
            for (int i = 0; i < n; i++) {
                gbad += !same_bits(at(ob, n * b + i), at(lb, i));
                nonfinite += !isfinite(at(ob, n * b + i));
            }
            if (stiff) {
                gbad += at(nb_tree_child(out, 2), b) != at(nb_tree_child(lo, 2), 0);
            }
            nb_tree_destroy(lo);
            nb_tree_destroy(la);
        }
        print_message("%-9s vmap(%s), SaveAt ts: %d values differ, %d not finite\n",
                      nb_ode_solver_name((nb_ode_solver)solvers[si]), stiff ? "solve" : "grad",
                      gbad, nonfinite);
        NBT_EQ_I64(gbad, 0);
        NBT_EQ_I64(nonfinite, 0);
        nb_tree_destroy(out);
        nb_tree_destroy(args);
        nb_fn_destroy(vg);
        nb_fn_destroy(g);
        nb_fn_destroy(fl);
        nb_tree_destroy(self);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- fori, scan, cond; jit and vmap in either order --------------------------------------- */

static nb_status fsc_fori(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *c = nb_get(tr, args, "[1]");
    return nb_return(nb_add(nb_mul(c, nb_scalar(tr, 1.1)), nb_sin(c)), out);
}

/* scan body: ((c), x_i) -> (c + x_i c, c^2) */
static nb_status fsc_scan(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *c = nb_get(tr, args, "[0]"), *x = nb_get(tr, args, "[1]");
    nb_var *c1 = nb_add(c, nb_mul(x, c));
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(c1), nb_leaf(nb_square(c1))},
                         out);
}

static nb_status fsc_true(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_mul(nb_var_of(tr, args), nb_scalar(tr, 2.0)), out);
}

static nb_status fsc_false(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_sub(nb_var_of(tr, args), nb_scalar(tr, 1.0)), out);
}

/* args: (x f64[3], k i32[]) -> (fori 0..4 of c 1.1 + sin c from x, scan's ys over x from
 * c = 0.5, k > 0 ? 2 x : x - 1) */
static nb_status body_fsc(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *x = nb_get(tr, args, "[0]"), *k = nb_get(tr, args, "[1]");
    nb_fn *fb = NULL, *sb = NULL, *tb = NULL, *eb = NULL;
    nb_status st = nb_fn_create(ctx, "fori_body", fsc_fori, NULL, &fb);
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "scan_body", fsc_scan, NULL, &sb);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "if_true", fsc_true, NULL, &tb);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "if_false", fsc_false, NULL, &eb);
    }
    const nb_tree *r1 = st == NB_OK ? nb_fori_loop(tr, 0, 4, fb, nb_leaf(x), NULL) : NULL;
    const nb_tree *r2 =
        r1 != NULL
            ? nb_scan(tr, sb, nb_leaf(nb_scalar_typed(tr, NB_DTYPE_F64, 0.5)), nb_leaf(x), 3, NULL)
            : NULL;
    const nb_tree *r3 = r2 != NULL ? nb_cond(tr, nb_gt(k, nb_scalar_typed(tr, NB_DTYPE_I32, 0.0)),
                                             tb, eb, nb_leaf(x))
                                   : NULL;
    nb_fn_destroy(fb);
    nb_fn_destroy(sb);
    nb_fn_destroy(tb);
    nb_fn_destroy(eb);
    if (r3 == NULL) {
        return st != NB_OK ? st : nb_trace_status(tr);
    }
    return nb_tree_tuple(
        ctx, 3, (nb_tree *[]){(nb_tree *)r1, (nb_tree *)nb_tree_child(r2, 1), (nb_tree *)r3}, out);
}

static nb_tree *fsc_args(nb_ctx *ctx, int B) {
    double x[3 * 8];
    int32_t k[8];
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < 3; i++) {
            x[3 * b + i] = 0.1 * (b + 1) + 0.2 * i;
        }
        k[b] = b % 2 ? 1 : -1;
    }
    nb_array *ka = NULL;
    nb_tree *kl = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 1, (int64_t[]){B}, k, &ka));
    NBT_OK(ctx, nb_tree_array(ka, &kl));
    nb_array_destroy(ka);
    return nbt_tuple_take(ctx, 2, (nb_tree *[]){f64_leaf(ctx, 2, (int64_t[]){B, 3}, x), kl});
}

/* fori, scan (its stacked ys: a buffer) and cond (a per-lane predicate) under vmap, bit for
 * bit one call per lane; vmap(jit(f)) the same; jit(vmap(f)) traced once per batch size,
 * its retrace reason naming the leaf whose shape changed */
static void test_fori_scan_cond(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *jf = NULL, *v = NULL, *vj = NULL, *jv = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "fsc", body_fsc, NULL, &f));
    NBT_OK(ctx, nb_jit(f, NULL, &jf));
    NBT_OK(ctx, nb_vmap(f, NULL, &v));
    NBT_OK(ctx, nb_vmap(jf, NULL, &vj));
    NBT_OK(ctx, nb_jit(v, NULL, &jv));
    enum { B = 5 };
    nb_tree *args = fsc_args(ctx, B), *o1 = NULL, *o2 = NULL, *o3 = NULL;
    NBT_OK(ctx, nb_fn_call(v, args, &o1));
    NBT_OK(ctx, nb_fn_call(vj, args, &o2));
    NBT_OK(ctx, nb_fn_call(jv, args, &o3));
    static const int per[3] = {3, 3, 3}; /* elements per lane of each output */
    int bad = 0;
    for (int b = 0; b < B; b++) {
        const nb_array *xa = nb_tree_get_array(nb_tree_child(args, 0));
        int32_t kv = ((const int32_t *)nb_array_data(nb_tree_get_array(nb_tree_child(args, 1))))[b];
        nb_array *ka = NULL;
        nb_tree *kl = NULL;
        NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 0, NULL, &kv, &ka));
        NBT_OK(ctx, nb_tree_array(ka, &kl));
        nb_array_destroy(ka);
        nb_tree *la = nbt_tuple_take(
            ctx, 2,
            (nb_tree *[]){
                f64_leaf(ctx, 1, (int64_t[]){3}, (const double *)nb_array_data(xa) + 3 * b), kl});
        nb_tree *lo = NULL;
        NBT_OK(ctx, nb_fn_call(f, la, &lo));
        for (int o = 0; o < 3; o++) {
            for (int i = 0; i < per[o]; i++) {
                double want = at(nb_tree_child(lo, o), i);
                bad += !same_bits(at(nb_tree_child(o1, o), per[o] * b + i), want);
                bad += !same_bits(at(nb_tree_child(o2, o), per[o] * b + i), want);
                bad += !same_bits(at(nb_tree_child(o3, o), per[o] * b + i), want);
            }
        }
        nb_tree_destroy(lo);
        nb_tree_destroy(la);
    }
    print_message("fori, scan, cond under vmap, vmap(jit), jit(vmap): %d values differ\n", bad);
    NBT_EQ_I64(bad, 0);
    /* another batch size: one more trace of jit(vmap(f)), the reason naming args[0] */
    nb_tree *args4 = fsc_args(ctx, 4), *o4 = NULL;
    NBT_OK(ctx, nb_fn_call(jv, args4, &o4));
    nb_tree_destroy(o4);
    NBT_OK(ctx, nb_fn_call(jv, args, &o4)); /* cached */
    nb_fn_stats s;
    NBT_OK(ctx, nb_fn_stats_get(jv, &s));
    NBT_EQ_I64(s.n_traces, 2);
    char why[512];
    NBT_OK(ctx, nb_fn_retrace_reason(jv, 0, why, sizeof why, NULL));
    print_message("jit(vmap(f)): %lld traces for batch sizes 5, 4, 5; retrace reason: %s\n",
                  (long long)s.n_traces, why);
    NBT_TRUE(strstr(why, "args[0]") != NULL);
    nb_tree_destroy(o4);
    nb_tree_destroy(args4);
    nb_tree_destroy(o1);
    nb_tree_destroy(o2);
    nb_tree_destroy(o3);
    nb_tree_destroy(args);
    nb_fn_destroy(jv);
    nb_fn_destroy(vj);
    nb_fn_destroy(v);
    nb_fn_destroy(jf);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_while_lanes),    cmocka_unit_test(test_loop_derivatives),
        cmocka_unit_test(test_fori_scan_cond), cmocka_unit_test(test_ode_ensemble),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

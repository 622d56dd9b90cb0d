/*
 * bench_native.c -- issue 19's rows: nabla's two tiers (the interpreter, NB_NATIVE_OFF, and
 * native code, NB_NATIVE_NOW) next to hand-written C doing the same computation (the "limit",
 * benchmarks/limits/) and the peers, 1 thread, every number a median:
 *
 *   lv      Lotka-Volterra (bench_ode's problem: a = 1.5, b = 1, c = 3, d = 1, x0 = y0 = 1,
 *           t in [0, 10], tsit5, rtol = atol = 1e-8, dt0 = 0.01): the solve.
 *           Peer: Diffrax. Goal: <= 2x C, >= 5x faster than Diffrax.
 *   lvgrad  its gradient d(x(10) + y(10)) / d(a, b, c, d, x0, y0), recursive checkpoint
 *           (nb_grad, the default adjoint); the C limit is the discrete adjoint with every
 *           state stored. Peers: CVODES's adjoint at equal accuracy, Diffrax.
 *           Goal: <= 3x C, >= 10x faster than CVODES.
 *   mlp     the tiny MLP 2-32-32-1, batch 16: one Adam train step (bench_train's, params and
 *           state donated). Peer: JAX + Optax. Goal: <= 1.3x C.
 *   mlp784  the MLP 784-256-256-10, batch 128: the same step; the C limit calls BLIS for its
 *           GEMMs. Peer: JAX + Optax. Goal: <= 1.1x its 8 GEMMs + a plain-C Adam.
 *
 * Each workload's results are checked before it is timed: the C limit against nabla (steps
 * and values; bits where the order of operations is the same) and the two tiers against each
 * other (bits). Then the first call of a fresh program (a new context: trace + compile + one
 * run) with NB_NATIVE_OFF, NB_NATIVE_AUTO and NB_NATIVE_NOW, the native tier with a cold and
 * with a warm disk cache (NABLA_NATIVE_CACHE, set to a fresh directory under build/ for the
 * run and removed at its end).
 *
 *   bench_native [--only lv|lvgrad|mlp|mlp784] [--no-peers] [--samples N]
 *
 * Run from the repository root (the peers' scripts, the LV reference). Until nabla has its
 * native tier, NB_NATIVE_NOW runs the interpreter: the tier that ran is printed.
 * See benchmarks/README.md.
 */
#define BENCH_NAME "bench_native"
#include "bench_common.h"

#include "limits/limits.h"
#include "ode/tableau.h"

#include <nabla/nabla.h>

#include <dirent.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { W_LV, W_LVGRAD, W_MLP, W_MLP784, W_COUNT };
static const char *const w_names[W_COUNT] = {"lv", "lvgrad", "mlp", "mlp784"};

enum { T_OFF, T_NOW, T_COUNT }; /* the tiers timed: nb_jit_opts.native */
static const int t_mode[T_COUNT] = {NB_NATIVE_OFF, NB_NATIVE_NOW};

/* ---- contexts, and what the native tier logs ----------------------------------------------- */

/* The first warning or error a context logs (the native tier's reason for falling back). */
typedef struct log_box {
    atomic_flag taken;
    char msg[256];
} log_box;

static void log_first(void *ud, nb_log_level level, const char *msg) {
    log_box *b = ud;
    if (level <= NB_LOG_LEVEL_WARN && !atomic_flag_test_and_set(&b->taken)) {
        snprintf(b->msg, sizeof b->msg, "%s", msg);
    }
}

static nb_ctx *ctx_new(log_box *box) {
    nb_ctx_opts o = nb_ctx_opts_default();
    o.n_threads = 1;
    if (box != NULL) {
        o.log = log_first;
        o.log_ud = box;
    }
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(&o, &ctx) != NB_OK) {
        fprintf(stderr, BENCH_NAME ": cannot create a context\n");
        exit(1);
    }
    return ctx;
}

/* f jitted with the tier mode (and max_traces 1); f is borrowed */
static nb_fn *jit_mode(nb_ctx *ctx, nb_fn *f, int mode) {
    nb_jit_opts jo = nb_jit_opts_default();
    jo.max_traces = 1;
    jo.native = mode;
    nb_fn *j = NULL;
    BENCH_CHECK(ctx, nb_jit(f, &jo, &j));
    return j;
}

static int fn_tier(nb_ctx *ctx, const nb_fn *f) {
    nb_fn_stats s;
    BENCH_CHECK(ctx, nb_fn_stats_get(f, &s));
    return s.tier;
}

/* ---- the disk cache of native code -------------------------------------------------------- */

static char cache_dir[256];

/* Remove everything below path (and path itself when self): files, links, directories. */
static void rm_tree(const char *path, bool self) {
    DIR *d = opendir(path);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) {
                continue;
            }
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            struct stat st;
            if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode)) {
                rm_tree(sub, true);
            } else {
                unlink(sub);
            }
        }
        closedir(d);
    }
    if (self) {
        rmdir(path);
    }
}

static void cache_remove(void) {
    rm_tree(cache_dir, true);
}

/* A fresh private directory under build/ as NABLA_NATIVE_CACHE, before nabla reads it; removed
 * at exit (a failed check's exit included). */
static void cache_setup(void) {
    mkdir("build", 0755);
    snprintf(cache_dir, sizeof cache_dir, "build/bench_native_cache.XXXXXX");
    if (mkdtemp(cache_dir) == NULL) {
        fprintf(stderr, BENCH_NAME ": cannot create build/bench_native_cache.* (run from the "
                                   "repository root)\n");
        exit(1);
    }
    char abs[1024];
    if (getcwd(abs, sizeof abs - sizeof cache_dir - 2) == NULL) {
        fprintf(stderr, BENCH_NAME ": getcwd failed\n");
        exit(1);
    }
    strcat(abs, "/");
    strcat(abs, cache_dir);
    setenv("NABLA_NATIVE_CACHE", abs, 1);
    atexit(cache_remove);
}

/* ---- peers ---------------------------------------------------------------------------------- */

#define MAX_ROWS 32
typedef struct peer_rows {
    int n;
    char name[MAX_ROWS][64];
    double us[MAX_ROWS], err[MAX_ROWS];
    char version[128];
} peer_rows;

/* Run cmd and keep its "row <name> <us> <err>" lines (bench_ode's peer format); version: the
 * value of version_key. */
static void peer_run(const char *cmd, const char *version_key, peer_rows *r) {
    FILE *p = popen(cmd, "r");
    if (p == NULL) {
        return;
    }
    char line[512];
    while (fgets(line, sizeof line, p) != NULL) {
        char k[64], nm[64], a[64], b[64];
        int n = sscanf(line, "%63s %63s %63s %63s", k, nm, a, b);
        if (n >= 3 && strcmp(k, "row") == 0 && r->n < MAX_ROWS) {
            snprintf(r->name[r->n], sizeof r->name[r->n], "%s", nm);
            r->us[r->n] = atof(a);
            r->err[r->n] = n == 4 ? atof(b) : NAN;
            r->n++;
        } else if (n >= 2 && strcmp(k, version_key) == 0) {
            snprintf(r->version, sizeof r->version, "%s", nm);
        }
    }
    pclose(p);
}

static int peer_find(const peer_rows *p, const char *name) {
    for (int i = 0; i < p->n; i++) {
        if (strcmp(p->name[i], name) == 0) {
            return i;
        }
    }
    return -1;
}

/* ---- timing: each item a burst of calls, calibrated to ~10 ms -------------------------------- */

typedef struct timed {
    void (*call)(void *ud); /* one call */
    void *ud;
    int inner;
} timed;

static double sample_timed(void *ud) {
    timed *t = ud;
    double t0 = bench_now_s();
    for (int i = 0; i < t->inner; i++) {
        t->call(t->ud);
    }
    return (bench_now_s() - t0) / t->inner * 1e6;
}

static void calibrate(timed *t) {
    t->call(t->ud);
    double t0 = bench_now_s();
    t->call(t->ud);
    double once = bench_now_s() - t0;
    t->inner = once >= 0.01 ? 1 : (int)(0.01 / (once > 1e-7 ? once : 1e-7));
    if (t->inner < 1) {
        t->inner = 1;
    }
}

/* medians (µs per call) of n timed items in `rounds` interleaved rounds */
static void measure(timed *t, int n, int rounds, double *med) {
    bench_item items[8];
    for (int i = 0; i < n; i++) {
        calibrate(&t[i]);
        items[i] = (bench_item){.sample = sample_timed, .ud = &t[i]};
    }
    bench_rounds(items, n, rounds);
    for (int i = 0; i < n; i++) {
        med[i] = bench_median(items[i].s, rounds < BENCH_MAX_ROUNDS ? rounds : BENCH_MAX_ROUNDS);
    }
}

/* nb_fn_call(f, args [, donate]) and destroy the output */
typedef struct nb_call_ud {
    nb_ctx *ctx;
    nb_fn *f;
    const nb_tree *args;
    const nb_call_opts *opts;
} nb_call_ud;

static void call_nabla(void *ud) {
    nb_call_ud *c = ud;
    nb_tree *out = NULL;
    BENCH_CHECK(c->ctx, nb_fn_call_ex(c->f, c->args, c->opts, &out));
    nb_tree_destroy(out);
}

/* ---- results of a workload ------------------------------------------------------------------ */

typedef struct wl_res {
    bool run;
    double lim, tier_us[T_COUNT]; /* µs */
    int tier[T_COUNT];            /* stats.tier after the timed calls */
    double base2;                 /* mlp784: the GEMMs + plain-C Adam (µs) */
    double peer, peer2;           /* µs; NAN when not run */
    char peer_name[96], peer2_name[96];
    double first[5]; /* ms: OFF, AUTO cold, NOW cold, NOW warm, AUTO warm */
    int first_tier[5];
    char why[T_COUNT][256]; /* what each tier's context logged */
} wl_res;

enum { F_OFF, F_AUTO_COLD, F_NOW_COLD, F_NOW_WARM, F_AUTO_WARM, F_COUNT };

/* ---- Lotka-Volterra ------------------------------------------------------------------------- */

typedef struct lv_ref {
    double x, y, g[6];
} lv_ref;

static bool load_ref(lv_ref *r) {
    FILE *f = fopen("tests/ode/oracle/lotka_volterra.txt", "r");
    if (f == NULL) {
        return false;
    }
    char line[512];
    int first = 1, ng = 0;
    static const char *const names[6] = {"a", "b", "c", "d", "x0", "y0"};
    while (fgets(line, sizeof line, f) != NULL) {
        double t, x, y, g;
        char name[16];
        if (first && sscanf(line, "state %lf %lf %lf", &t, &x, &y) == 3) {
            r->x = x;
            r->y = y;
            first = 0;
        } else if (sscanf(line, "grad %15s %lf", name, &g) == 2) {
            for (int i = 0; i < 6; i++) {
                if (strcmp(name, names[i]) == 0) {
                    r->g[i] = g;
                    ng++;
                }
            }
        }
    }
    fclose(f);
    return !first && ng == 6;
}

/* bench_ode's term: f = u y + v (x y), u = (a, -c), v = (-b, d) */
static nb_status lv_term(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *y = nb_get(tr, args, "[1]");
    nb_var *u = nb_get(tr, args, "[2].u"), *v = nb_get(tr, args, "[2].v");
    nb_var *xy = nb_prod(y, NULL, 0, false);
    return nb_return(nb_add(nb_mul(u, y), nb_mul(v, xy)), out);
}

/* args: (p = f64[6] (a, b, c, d, x0, y0)); self: dict(out, dt0). out 0: y(10) f64[2];
 * 1: x(10) + y(10) (to differentiate); 2: (y(10), num_steps, num_accepted_steps). */
static nb_status lv_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    int64_t what = 0;
    double dt0 = 0.01;
    nb_tree_get_int(nb_tree_get(self, "out"), &what);
    nb_tree_get_float(nb_tree_get(self, "dt0"), &dt0);
    nb_var *p = nb_get(tr, args, "[0]");
    nb_var *e[6];
    for (int i = 0; i < 6; i++) {
        e[i] = nb_reshape(nb_slice(p, (int64_t[]){i}, (int64_t[]){i + 1}, NULL), 0, NULL);
    }
    nb_var *u = nb_stack(2, (nb_var *[]){e[0], nb_neg(e[2])}, 0);
    nb_var *v = nb_stack(2, (nb_var *[]){nb_neg(e[1]), e[3]}, 0);
    nb_var *y0 = nb_slice(p, (int64_t[]){4}, (int64_t[]){6}, NULL);
    nb_tree *a = NULL;
    nb_status st =
        nb_tree_dict(ctx, 2, (const char *[]){"u", "v"}, (nb_tree *[]){nb_leaf(u), nb_leaf(v)}, &a);
    nb_fn *term = NULL;
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "lotka_volterra", lv_term, NULL, &term);
    }
    if (st != NB_OK) {
        nb_tree_destroy(a);
        return st;
    }
    nb_ode_opts o = nb_ode_opts_default();
    o.solver = NB_ODE_TSIT5;
    o.t0 = 0.0;
    o.t1 = 10.0;
    o.dt0 = dt0;
    o.controller = nb_ode_pid(1e-8, 1e-8);
    const nb_tree *sol = nb_diffeqsolve(tr, term, nb_leaf(y0), a, &o);
    nb_fn_destroy(term);
    nb_tree_destroy(a);
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *ys = nb_get(tr, sol, "ys"); /* f64[1, 2] */
    if (what == 1) {
        return nb_return(nb_sum(ys, NULL, 0, false), out);
    }
    nb_var *y = nb_reshape(ys, 1, (int64_t[]){2});
    if (what == 0) {
        return nb_return(y, out);
    }
    return nb_tree_tuple(ctx, 3,
                         (nb_tree *[]){nb_leaf(y), nb_leaf(nb_get(tr, sol, "stats.num_steps")),
                                       nb_leaf(nb_get(tr, sol, "stats.num_accepted_steps"))},
                         out);
}

/* The function of `what` (see lv_body), as nb_grad of it when grad; jitted with mode. */
static nb_fn *lv_fn(nb_ctx *ctx, int what, double dt0, bool grad, int mode) {
    nb_tree *l[2] = {NULL, NULL}, *self = NULL;
    BENCH_CHECK(ctx, nb_tree_int(ctx, what, &l[0]));
    BENCH_CHECK(ctx, nb_tree_float(ctx, dt0, &l[1]));
    BENCH_CHECK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"out", "dt0"}, l, &self));
    nb_tree_destroy(l[0]);
    nb_tree_destroy(l[1]);
    nb_fn *f = NULL, *g = NULL;
    BENCH_CHECK(ctx, nb_fn_create(ctx, "lv", lv_body, self, &f));
    nb_tree_destroy(self);
    if (grad) {
        BENCH_CHECK(ctx, nb_grad(f, NULL, &g));
    }
    nb_fn *j = jit_mode(ctx, grad ? g : f, mode);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    return j;
}

static const double lv_p[6] = {1.5, 1, 3, 1, 1, 1};

static nb_tree *lv_args(nb_ctx *ctx) {
    nb_array *pa = NULL;
    nb_tree *pl = NULL, *args = NULL;
    BENCH_CHECK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){6}, lv_p, &pa));
    BENCH_CHECK(ctx, nb_tree_array(pa, &pl));
    BENCH_CHECK(ctx, nb_tree_tuple(ctx, 1, &pl, &args));
    nb_tree_destroy(pl);
    nb_array_destroy(pa);
    return args;
}

/* f's f64 output (a single array leaf, or child `child` of a tuple), n values into v */
static void out_f64(nb_ctx *ctx, nb_fn *f, const nb_tree *args, int child, double *v, int n) {
    nb_tree *out = NULL;
    BENCH_CHECK(ctx, nb_fn_call(f, args, &out));
    const nb_tree *t = child < 0 ? out : nb_tree_child(out, child);
    nb_array *a = nb_tree_get_array(t);
    for (int i = 0; i < n; i++) {
        BENCH_CHECK(ctx, nb_array_get_flat(a, i, &v[i]));
    }
    nb_tree_destroy(out);
}

static int bits_equal_f64(const double *a, const double *b, int n) {
    int eq = 0;
    for (int i = 0; i < n; i++) {
        eq += memcmp(&a[i], &b[i], sizeof(double)) == 0;
    }
    return eq;
}

static double max_rel(const double *a, const double *b, int n) {
    double e = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]) / fmax(fabs(b[i]), 1e-300);
        e = d > e || d != d ? d : e;
    }
    return e;
}

/* The tsit5 coefficients of the C limit are nabla's, bit for bit. */
static bool tableau_same(void) {
    const nbo_tableau *t = nbo_tableau_get(NB_ODE_TSIT5);
    return t != NULL && t->stages == 7 && t->dense_stages == 7 && t->dense_degree == 4 &&
           memcmp(t->c, lim_tsit5_c, sizeof lim_tsit5_c) == 0 &&
           memcmp(t->dense, lim_tsit5_dense, sizeof lim_tsit5_dense) == 0 &&
           memcmp(t->a, lim_tsit5_a, sizeof lim_tsit5_a) == 0 &&
           memcmp(t->b, lim_tsit5_b, sizeof lim_tsit5_b) == 0 &&
           memcmp(t->e, lim_tsit5_e, sizeof lim_tsit5_e) == 0;
}

typedef struct lim_lv_ud {
    lim_lv_opts o;
    void *work;
    double y[2], g[6];
} lim_lv_ud;

static void call_lim_solve(void *ud) {
    lim_lv_ud *u = ud;
    lim_lv_solve(lv_p, &u->o, u->y, NULL, NULL);
}

static void call_lim_grad(void *ud) {
    lim_lv_ud *u = ud;
    lim_lv_grad(lv_p, &u->o, u->work, u->g, NULL, NULL);
}

static lim_lv_opts lv_opts(double dt0) {
    return (lim_lv_opts){
        .t0 = 0.0, .t1 = 10.0, .dt0 = dt0, .rtol = 1e-8, .atol = 1e-8, .max_steps = 4096};
}

/* Check the C limit against nabla and print it: the timed function (run, one per tier) and,
 * when solves, the solve's steps and values with dt0 = 0.01 and 0 (Hairer's first step). */
static void lv_check(const lv_ref *ref, bool grad, bool solves, nb_ctx *const *ctx,
                     nb_fn *const *run, nb_tree *const *targs) {
    const nb_tree *args = targs[T_OFF];
    printf("- C tsit5 coefficients are nabla's (src/ode/tableau.c) bit for bit: %s\n",
           tableau_same() ? "yes" : "NO");
    for (int k = 0; solves && k < 2; k++) {
        double dt0 = k == 0 ? 0.01 : 0.0;
        nb_fn *fs = lv_fn(ctx[T_OFF], 2, dt0, false, NB_NATIVE_OFF);
        double yn[2], nsteps = 0, nacc = 0;
        out_f64(ctx[T_OFF], fs, args, 0, yn, 2);
        out_f64(ctx[T_OFF], fs, args, 1, &nsteps, 1);
        out_f64(ctx[T_OFF], fs, args, 2, &nacc, 1);
        nb_fn_destroy(fs);
        lim_lv_opts o = lv_opts(dt0);
        double yc[2];
        lim_lv_stats st;
        lim_lv_solve(lv_p, &o, yc, NULL, &st);
        printf("- solve, dt0 = %s: steps C %d (%d accepted) / nabla %.0f (%.0f accepted); "
               "(x, y)(10) C %.17g %.17g, nabla %.17g %.17g; max rel. diff %.2e, bits equal "
               "%d of 2; error vs reference: C %.2e, nabla %.2e\n",
               k == 0 ? "0.01" : "0 (Hairer's initial step)", st.steps, st.accepted, nsteps, nacc,
               yc[0], yc[1], yn[0], yn[1], max_rel(yc, yn, 2), bits_equal_f64(yc, yn, 2),
               fmax(fabs(yc[0] - ref->x) / fabs(ref->x), fabs(yc[1] - ref->y) / fabs(ref->y)),
               fmax(fabs(yn[0] - ref->x) / fabs(ref->x), fabs(yn[1] - ref->y) / fabs(ref->y)));
    }
    /* the timed functions: the tiers agree, the limit against the interpreter */
    int n = grad ? 6 : 2;
    double v[T_COUNT][6], c[6];
    for (int t = 0; t < T_COUNT; t++) {
        out_f64(ctx[t], run[t], targs[t], -1, v[t], n);
    }
    lim_lv_opts o = lv_opts(0.01);
    void *work = malloc(lim_lv_work_bytes(&o));
    if (work == NULL) {
        fprintf(stderr, BENCH_NAME ": out of memory\n");
        exit(1);
    }
    if (grad) {
        lim_lv_grad(lv_p, &o, work, c, NULL, NULL);
    } else {
        lim_lv_solve(lv_p, &o, c, NULL, NULL);
    }
    free(work);
    if (!grad) {
        printf("- the timed solve: C vs the interpreter, bits equal %d of 2\n",
               bits_equal_f64(c, v[T_OFF], 2));
    } else {
        printf("- gradient (a, b, c, d, x0, y0): C");
        for (int i = 0; i < 6; i++) {
            printf(" %.15g", c[i]);
        }
        printf("; nabla");
        for (int i = 0; i < 6; i++) {
            printf(" %.15g", v[T_OFF][i]);
        }
        printf("\n- gradient: max rel. diff C vs nabla %.2e (bits equal %d of 6: the adjoint's "
               "order of operations is not nabla's); error vs reference: C %.2e, nabla %.2e\n",
               max_rel(c, v[T_OFF], 6), bits_equal_f64(c, v[T_OFF], 6), max_rel(c, ref->g, 6),
               max_rel(v[T_OFF], ref->g, 6));
    }
    int same = bits_equal_f64(v[T_OFF], v[T_NOW], n);
    printf("- the two tiers (OFF ran tier %d, NOW tier %d): bits equal %d of %d",
           fn_tier(ctx[T_OFF], run[T_OFF]), fn_tier(ctx[T_NOW], run[T_NOW]), same, n);
    if (same < n) {
        printf("; NOW gave");
        for (int i = 0; i < n; i++) {
            printf(" %.17g", v[T_NOW][i]);
        }
        printf(" (max rel. diff %.2e)", max_rel(v[T_NOW], v[T_OFF], n));
    }
    printf("\n");
}

/* solves: also check the solve's steps and values (once per run) */
static void bench_lv(bool grad, bool solves, const lv_ref *ref, int rounds, wl_res *r,
                     log_box *boxes) {
    nb_ctx *ctx[T_COUNT];
    nb_fn *run[T_COUNT];
    nb_tree *args[T_COUNT];
    for (int t = 0; t < T_COUNT; t++) {
        ctx[t] = ctx_new(&boxes[t]);
        run[t] = lv_fn(ctx[t], grad ? 1 : 0, 0.01, grad, t_mode[t]);
        args[t] = lv_args(ctx[t]);
    }
    printf("### %s: checks\n\n", grad ? "lvgrad" : "lv");
    lv_check(ref, grad, solves, ctx, run, args);
    printf("\n");

    lim_lv_ud lu = {.o = lv_opts(0.01)};
    lu.work = malloc(lim_lv_work_bytes(&lu.o));
    if (lu.work == NULL) {
        fprintf(stderr, BENCH_NAME ": out of memory\n");
        exit(1);
    }
    nb_call_ud cu[T_COUNT];
    timed t[1 + T_COUNT];
    t[0] = (timed){grad ? call_lim_grad : call_lim_solve, &lu, 1};
    for (int k = 0; k < T_COUNT; k++) {
        cu[k] = (nb_call_ud){ctx[k], run[k], args[k], NULL};
        t[1 + k] = (timed){call_nabla, &cu[k], 1};
    }
    double med[1 + T_COUNT];
    measure(t, 1 + T_COUNT, rounds, med);
    r->lim = med[0];
    for (int k = 0; k < T_COUNT; k++) {
        r->tier_us[k] = med[1 + k];
        r->tier[k] = fn_tier(ctx[k], run[k]);
    }
    free(lu.work);
    for (int k = 0; k < T_COUNT; k++) {
        nb_tree_destroy(args[k]);
        nb_fn_destroy(run[k]);
        nb_ctx_destroy(ctx[k]);
    }
}

/* ---- the MLPs (bench_train's models and train step) ----------------------------------------- */

static const double learning_rate = 1e-3;

static nb_var *mlp_logits(nb_trace *tr, const nb_tree *args) {
    nb_var *h = nb_get(tr, args, "[1].x");
    for (int i = 0; i < 3; i++) {
        h = nb_add(nb_matmul(h, nb_get(tr, args, "[0][%d].w", i)),
                   nb_get(tr, args, "[0][%d].b", i));
        if (i < 2) {
            h = nb_tanh(h);
        }
    }
    return h;
}

static nb_status body_mlp(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *picked = nb_take_along_axis(nb_log_softmax(mlp_logits(tr, args), -1),
                                        nb_expand_dims(nb_get(tr, args, "[1].y"), -1), -1);
    return nb_return(nb_neg(nb_mean(picked, NULL, 0, false)), out);
}

static nb_status body_tiny(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *d = nb_sub(mlp_logits(tr, args), nb_get(tr, args, "[1].y"));
    return nb_return(nb_mean(nb_square(d), NULL, 0, false), out);
}

static nb_status train_step(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out,
                            nb_fn_body loss_body) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_tree *params = (nb_tree *)nb_tree_child(args, 0), *batch = (nb_tree *)nb_tree_child(args, 2);
    const nb_tree *state = nb_tree_child(args, 1);
    nb_fn *loss = NULL, *vg = NULL;
    nb_tree *gargs = NULL;
    nb_status st = nb_fn_create(ctx, "loss", loss_body, NULL, &loss);
    if (st == NB_OK) {
        st = nb_value_and_grad(loss, NULL, &vg);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){params, batch}, &gargs);
    }
    const nb_tree *r = st == NB_OK ? nb_apply(tr, vg, gargs) : NULL;
    const nb_tree *updates = NULL, *new_state = NULL, *new_params = NULL;
    if (st == NB_OK && r != NULL) {
        st = nb_optim_update(tr, self, nb_tree_child(r, 1), state, params, &updates, &new_state);
    }
    if (st == NB_OK && r != NULL) {
        new_params = nb_apply_updates(tr, params, updates);
    }
    if (st == NB_OK && new_params != NULL) {
        st = nb_tree_tuple(ctx, 3,
                           (nb_tree *[]){(nb_tree *)new_params, (nb_tree *)new_state,
                                         (nb_tree *)nb_tree_child(r, 0)},
                           out);
    }
    nb_tree_destroy(gargs);
    nb_fn_destroy(vg);
    nb_fn_destroy(loss);
    return st != NB_OK ? st : nb_trace_status(tr);
}

static nb_status body_train_mlp(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    return train_step(tr, self, args, out, body_mlp);
}

static nb_status body_train_tiny(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    return train_step(tr, self, args, out, body_tiny);
}

static nb_tree *leaf_of(nb_ctx *ctx, nb_array *a) {
    nb_tree *t = NULL;
    BENCH_CHECK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

/* bench_train's model: deterministic parameters and batch, Adam, the donated train step
 * jitted with the tier mode. */
typedef struct model {
    nb_ctx *ctx;
    nb_tree *params, *batch, *opt, *state, *train_args, *donate;
    nb_call_opts copts;
    nb_fn *step, *jstep;
} model;

static void model_init(model *m, nb_ctx *ctx, bool tiny, int mode) {
    memset(m, 0, sizeof *m);
    m->ctx = ctx;
    const int64_t big[4] = {784, 256, 256, 10}, small[4] = {2, 32, 32, 1};
    const int64_t *sz = tiny ? small : big, batch = tiny ? 16 : 128;
    nb_array *key = NULL, *k = NULL, *a = NULL;
    BENCH_CHECK(ctx, nb_random_key(ctx, tiny ? 1 : 0, &key));
    nb_tree *layers[3];
    for (int i = 0; i < 3; i++) {
        double r = 1.0 / sqrt((double)sz[i]);
        BENCH_CHECK(ctx, nb_random_fold_in(key, (uint32_t)i, &k));
        BENCH_CHECK(
            ctx, nb_random_uniform(k, NB_DTYPE_F32, 2, (int64_t[]){sz[i], sz[i + 1]}, -r, r, &a));
        nb_array_destroy(k);
        nb_tree *w = leaf_of(ctx, a);
        BENCH_CHECK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, &sz[i + 1], &a));
        nb_tree *b = leaf_of(ctx, a);
        BENCH_CHECK(
            ctx, nb_tree_dict(ctx, 2, (const char *[]){"w", "b"}, (nb_tree *[]){w, b}, &layers[i]));
        nb_tree_destroy(w);
        nb_tree_destroy(b);
    }
    BENCH_CHECK(ctx, nb_tree_list(ctx, 3, layers, &m->params));
    for (int i = 0; i < 3; i++) {
        nb_tree_destroy(layers[i]);
    }
    nb_array *xa = NULL, *ya = NULL;
    BENCH_CHECK(ctx, nb_random_fold_in(key, 100, &k));
    if (tiny) {
        BENCH_CHECK(ctx,
                    nb_random_uniform(k, NB_DTYPE_F32, 2, (int64_t[]){batch, sz[0]}, -1, 1, &xa));
        BENCH_CHECK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){batch, 1}, &ya));
        const float *x = nb_array_data(xa);
        for (int64_t i = 0; i < batch; i++) {
            ((float *)nb_array_data(ya))[i] = (float)(sin(2.0 * x[2 * i]) * cos(x[2 * i + 1]));
        }
    } else {
        BENCH_CHECK(ctx, nb_random_normal(k, NB_DTYPE_F32, 2, (int64_t[]){batch, sz[0]}, &xa));
        BENCH_CHECK(ctx, nb_array_zeros(ctx, NB_DTYPE_I32, 1, &batch, &ya));
        for (int64_t i = 0; i < batch; i++) {
            ((int32_t *)nb_array_data(ya))[i] = (int32_t)((7 * i + 3) % 10);
        }
    }
    nb_array_destroy(k);
    nb_array_destroy(key);
    nb_tree *x = leaf_of(ctx, xa), *y = leaf_of(ctx, ya);
    BENCH_CHECK(ctx,
                nb_tree_dict(ctx, 2, (const char *[]){"x", "y"}, (nb_tree *[]){x, y}, &m->batch));
    nb_tree_destroy(x);
    nb_tree_destroy(y);
    nb_tree *tmpl = NULL;
    BENCH_CHECK(ctx, nb_optim_adam(ctx, learning_rate, NULL, &m->opt));
    BENCH_CHECK(ctx, nb_grad_template(m->params, NULL, &tmpl));
    BENCH_CHECK(ctx, nb_optim_init(m->opt, tmpl, &m->state));
    nb_tree_destroy(tmpl);
    BENCH_CHECK(
        ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){m->params, m->state, m->batch}, &m->train_args));
    nb_tree *yes = NULL, *no = NULL;
    BENCH_CHECK(ctx, nb_tree_bool(ctx, true, &yes));
    BENCH_CHECK(ctx, nb_tree_bool(ctx, false, &no));
    BENCH_CHECK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){yes, yes, no}, &m->donate));
    nb_tree_destroy(yes);
    nb_tree_destroy(no);
    m->copts = nb_call_opts_default();
    m->copts.donate = m->donate;
    BENCH_CHECK(ctx, nb_fn_create(ctx, tiny ? "train_step_tiny" : "train_step",
                                  tiny ? body_train_tiny : body_train_mlp, m->opt, &m->step));
    m->jstep = jit_mode(ctx, m->step, mode);
}

static void model_free(model *m) {
    nb_fn_destroy(m->jstep);
    nb_fn_destroy(m->step);
    nb_tree *all[] = {m->train_args, m->donate, m->state, m->opt, m->batch, m->params};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        nb_tree_destroy(all[i]);
    }
}

/* One step; returns the loss. The donated outputs are the args' own arrays. */
static double model_step(model *m) {
    nb_tree *out = NULL;
    BENCH_CHECK(m->ctx, nb_fn_call_ex(m->jstep, m->train_args, &m->copts, &out));
    double loss = NAN;
    BENCH_CHECK(m->ctx, nb_array_get_flat(nb_tree_get_array(nb_tree_child(out, 2)), 0, &loss));
    nb_tree_destroy(out);
    return loss;
}

static void call_model(void *ud) {
    (void)model_step(ud);
}

/* leaf i (0..5: w0, b0, w1, b1, w2, b2) of params (which 0), mu (1) or nu (2) */
static nb_array *model_leaf(const model *m, int which, int i) {
    const nb_tree *t = which == 0 ? m->params : nb_tree_get(m->state, which == 1 ? "mu" : "nu");
    return nb_tree_get_array(nb_tree_get(nb_tree_child(t, i / 2), i % 2 == 0 ? "w" : "b"));
}

static double state_hyper(const model *m, const char *name) {
    double v = NAN;
    BENCH_CHECK(m->ctx,
                nb_array_get_flat(
                    nb_tree_get_array(nb_tree_get(nb_tree_get(m->state, "hyper"), name)), 0, &v));
    return v;
}

/* Compare a model's leaves (params, mu, nu) with n floats per leaf at c[which][i]: bits equal
 * and the largest difference. */
typedef struct cmp_res {
    int64_t n, equal;
    double max_abs, max_rel;
} cmp_res;

static void cmp_f32(cmp_res *r, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        r->n++;
        r->equal += memcmp(&a[i], &b[i], sizeof(float)) == 0;
        double d = fabs((double)a[i] - (double)b[i]);
        double q = d / fmax(fabs((double)b[i]), 1e-30);
        r->max_abs = d > r->max_abs || d != d ? d : r->max_abs;
        r->max_rel = q > r->max_rel || q != q ? q : r->max_rel;
    }
}

static void print_cmp(const char *what, const cmp_res *c) {
    printf("- %s: bits equal %lld of %lld values, max |diff| %.3g, max rel. diff %.3g\n", what,
           (long long)c->equal, (long long)c->n, c->max_abs, c->max_rel);
}

static void call_lim_tiny(void *ud) {
    (void)lim_tiny_step(ud);
}

static void call_lim_mlp(void *ud) {
    (void)lim_mlp_step(ud);
}

static void call_lim_gemms_adam(void *ud) {
    lim_mlp_gemms_adam(ud);
}

static void bench_mlp(bool tiny, int rounds, wl_res *r, log_box *boxes) {
    nb_ctx *ctx[T_COUNT];
    model m[T_COUNT];
    for (int t = 0; t < T_COUNT; t++) {
        ctx[t] = ctx_new(&boxes[t]);
        model_init(&m[t], ctx[t], tiny, t_mode[t]);
    }
    const int64_t nleaf[6] = {tiny ? 64 : 784 * 256, tiny ? 32 : 256,  tiny ? 1024 : 256 * 256,
                              tiny ? 32 : 256,       tiny ? 32 : 2560, tiny ? 1 : 10};
    /* the C limit from the same parameters and batch (a copy of the interpreter's model) */
    lim_tiny *lt = NULL;
    lim_mlp *lm = NULL;
    const model *m0 = &m[T_OFF];
    const float *x = nb_array_data(nb_tree_get_array(nb_tree_get(m0->batch, "x")));
    const void *y = nb_array_data(nb_tree_get_array(nb_tree_get(m0->batch, "y")));
    double hyper[5] = {state_hyper(m0, "learning_rate"), state_hyper(m0, "b1"),
                       state_hyper(m0, "b2"), state_hyper(m0, "eps"), state_hyper(m0, "eps_root")};
    if (tiny) {
        lt = aligned_alloc(64, (sizeof *lt + 63) / 64 * 64);
        if (lt == NULL) {
            fprintf(stderr, BENCH_NAME ": out of memory\n");
            exit(1);
        }
        memset(lt, 0, sizeof *lt);
        int64_t off = 0;
        for (int i = 0; i < 6; i++) {
            memcpy(lt->p + off, nb_array_data(model_leaf(m0, 0, i)),
                   (size_t)nleaf[i] * sizeof(float));
            off += nleaf[i];
        }
        memcpy(lt->x, x, sizeof lt->x);
        memcpy(lt->y, y, sizeof lt->y);
        lt->lr = hyper[0], lt->b1 = hyper[1], lt->b2 = hyper[2], lt->eps = hyper[3];
        lt->eps_root = hyper[4];
    } else {
        lm = lim_mlp_create();
        if (lm == NULL) {
            fprintf(stderr, BENCH_NAME ": out of memory\n");
            exit(1);
        }
        for (int i = 0; i < 6; i++) {
            memcpy(lim_mlp_leaf(lm, 0, i, NULL), nb_array_data(model_leaf(m0, 0, i)),
                   (size_t)nleaf[i] * sizeof(float));
        }
        memcpy(lim_mlp_x(lm), x, (size_t)LIM_MLP_B * LIM_MLP_IN * sizeof(float));
        memcpy(lim_mlp_labels(lm), y, (size_t)LIM_MLP_B * sizeof(int32_t));
        lim_mlp_set_adam(lm, 0, hyper[0], hyper[1], hyper[2], hyper[3], hyper[4]);
    }
    /* one step each from the same start, compared */
    double loss[T_COUNT];
    for (int t = 0; t < T_COUNT; t++) {
        loss[t] = model_step(&m[t]);
    }
    double lloss = tiny ? lim_tiny_step(lt) : lim_mlp_step(lm);
    printf("### %s: checks (one Adam step from the same parameters)\n\n", tiny ? "mlp" : "mlp784");
    cmp_res c = {0}, tt = {0};
    int64_t off = 0;
    for (int w = 0; w < 3; w++) {
        off = 0;
        for (int i = 0; i < 6; i++) {
            const float *cv = tiny ? (w == 0   ? lt->p
                                      : w == 1 ? lt->mu
                                               : lt->nu) +
                                         off
                                   : lim_mlp_leaf(lm, w, i, NULL);
            cmp_f32(&c, cv, nb_array_data(model_leaf(&m[T_OFF], w, i)), nleaf[i]);
            cmp_f32(&tt, nb_array_data(model_leaf(&m[T_NOW], w, i)),
                    nb_array_data(model_leaf(&m[T_OFF], w, i)), nleaf[i]);
            off += nleaf[i];
        }
    }
    float lf = (float)lloss, nf = (float)loss[T_OFF];
    printf("- loss: C %.9g, nabla %.9g (bits %s)\n", lloss, loss[T_OFF],
           memcmp(&lf, &nf, sizeof lf) == 0 ? "equal" : "differ");
    print_cmp("C vs nabla's interpreter, new params + mu + nu", &c);
    printf("- the two tiers (OFF ran tier %d, NOW tier %d): loss bits %s\n",
           fn_tier(ctx[T_OFF], m[T_OFF].jstep), fn_tier(ctx[T_NOW], m[T_NOW].jstep),
           loss[T_OFF] == loss[T_NOW] ? "equal" : "differ");
    print_cmp("the two tiers, new params + mu + nu", &tt);
    printf("\n");

    timed t[2 + T_COUNT];
    int n = 0;
    t[n++] = (timed){tiny ? call_lim_tiny : call_lim_mlp, tiny ? (void *)lt : (void *)lm, 1};
    for (int k = 0; k < T_COUNT; k++) {
        t[n++] = (timed){call_model, &m[k], 1};
    }
    if (!tiny) {
        t[n++] = (timed){call_lim_gemms_adam, lm, 1}; /* the same model's buffers */
    }
    double med[2 + T_COUNT];
    measure(t, n, rounds, med);
    r->lim = med[0];
    for (int k = 0; k < T_COUNT; k++) {
        r->tier_us[k] = med[1 + k];
        r->tier[k] = fn_tier(ctx[k], m[k].jstep);
    }
    r->base2 = tiny ? NAN : med[1 + T_COUNT];
    for (int k = 0; k < T_COUNT; k++) {
        model_free(&m[k]);
        nb_ctx_destroy(ctx[k]);
    }
    free(lt);
    lim_mlp_destroy(lm);
}

/* ---- the first call of a fresh program ---------------------------------------------------------
 */

/* ms of the first call of workload w in a new context with the given mode; *tier: its tier */
static double first_call(int w, int mode, int *tier) {
    log_box box = {ATOMIC_FLAG_INIT, ""};
    nb_ctx *ctx = ctx_new(&box);
    double ms;
    if (w == W_LV || w == W_LVGRAD) {
        nb_tree *args = lv_args(ctx);
        double t0 = bench_now_s();
        nb_fn *f = lv_fn(ctx, w == W_LV ? 0 : 1, 0.01, w == W_LVGRAD, mode);
        nb_tree *out = NULL;
        BENCH_CHECK(ctx, nb_fn_call(f, args, &out));
        ms = (bench_now_s() - t0) * 1e3;
        *tier = fn_tier(ctx, f);
        nb_tree_destroy(out);
        nb_fn_destroy(f);
        nb_tree_destroy(args);
    } else {
        model m;
        model_init(&m, ctx, w == W_MLP, mode); /* data and parameters: outside the time */
        double t0 = bench_now_s();
        (void)model_step(&m);
        ms = (bench_now_s() - t0) * 1e3;
        *tier = fn_tier(ctx, m.jstep);
        model_free(&m);
    }
    nb_ctx_destroy(ctx);
    return ms;
}

/* Rounds of: OFF; AUTO with an empty cache; NOW with an empty cache; NOW again (warm);
 * AUTO (warm). The medians. */
static void bench_first(int w, int rounds, wl_res *r) {
    double s[F_COUNT][BENCH_MAX_ROUNDS];
    for (int k = 0; k < rounds; k++) {
        s[F_OFF][k] = first_call(w, NB_NATIVE_OFF, &r->first_tier[F_OFF]);
        rm_tree(cache_dir, false);
        s[F_AUTO_COLD][k] = first_call(w, NB_NATIVE_AUTO, &r->first_tier[F_AUTO_COLD]);
        rm_tree(cache_dir, false);
        s[F_NOW_COLD][k] = first_call(w, NB_NATIVE_NOW, &r->first_tier[F_NOW_COLD]);
        s[F_NOW_WARM][k] = first_call(w, NB_NATIVE_NOW, &r->first_tier[F_NOW_WARM]);
        s[F_AUTO_WARM][k] = first_call(w, NB_NATIVE_AUTO, &r->first_tier[F_AUTO_WARM]);
    }
    for (int f = 0; f < F_COUNT; f++) {
        r->first[f] = bench_median(s[f], rounds);
    }
}

/* ---- the tables ---------------------------------------------------------------------------------
 */

static void cell(char *buf, size_t cap, double v) {
    if (isnan(v)) {
        snprintf(buf, cap, "not run");
    } else {
        snprintf(buf, cap, "%.*f", v >= 100 ? 0 : v >= 10 ? 1 : 2, v);
    }
}

static const char *met(double q, double lim, bool at_most) {
    if (isnan(q)) {
        return "n/a";
    }
    return (at_most ? q <= lim : q >= lim) ? "met" : "not met";
}

int main(int argc, char **argv) {
    int samples = 15;
    bool peers = true, want[W_COUNT] = {true, true, true, true};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-peers") == 0) {
            peers = false;
        } else if (strcmp(argv[i], "--samples") == 0 && i + 1 < argc) {
            samples = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            i++;
            int k = 0;
            while (k < W_COUNT && strcmp(argv[i], w_names[k]) != 0) {
                k++;
            }
            if (k == W_COUNT) {
                fprintf(stderr, BENCH_NAME ": --only lv|lvgrad|mlp|mlp784\n");
                return 2;
            }
            for (int j = 0; j < W_COUNT; j++) {
                want[j] = j == k;
            }
        } else {
            fprintf(stderr, "usage: bench_native [--only lv|lvgrad|mlp|mlp784] [--no-peers] "
                            "[--samples N]\n");
            return 2;
        }
    }
    samples = samples < 1 ? 1 : samples > BENCH_MAX_ROUNDS ? BENCH_MAX_ROUNDS : samples;
    int first_rounds = samples < 3 ? samples : 3;
    cache_setup(); /* before anything reads the environment */

    char info[512], load[32];
    nb_build_info(info, sizeof info, NULL);
    bench_load_average(load, sizeof load);
    lv_ref ref = {0};
    if ((want[W_LV] || want[W_LVGRAD]) && !load_ref(&ref)) {
        fprintf(stderr, BENCH_NAME ": cannot read tests/ode/oracle/lotka_volterra.txt (run from "
                                   "the repository root)\n");
        return 1;
    }

    /* ---- peers first, each alone on the machine ---- */
    peer_rows dfx = {0}, cv = {0};
    double jax[4] = {NAN, NAN, NAN, NAN}; /* tiny_step_us, mlp_step_us, tiny_first_ms, ... */
    char jax_version[64] = "";
    bool have_py = access("build/peers/bin/python", X_OK) == 0;
    if (peers && (want[W_LV] || want[W_LVGRAD]) && have_py) {
        peer_run("build/peers/bin/python benchmarks/peers/diffrax_lv.py tsit5_solve tsit5_grad "
                 "2>/dev/null",
                 "diffrax_version", &dfx);
    }
    if (peers && want[W_LVGRAD]) {
        if (access("build/peers/cvodes_lv", X_OK) != 0 &&
            system("sh benchmarks/peers/build_cvodes.sh build/peers >/dev/null 2>&1") != 0) {
            fprintf(stderr, BENCH_NAME ": could not build the CVODES peer\n");
        }
        if (access("build/peers/cvodes_lv", X_OK) == 0) {
            static const char *const tols[3] = {"1e-8", "1e-9", "1e-10"};
            for (int k = 0; k < 3; k++) {
                char cmd[256];
                peer_rows one = {0};
                snprintf(cmd, sizeof cmd,
                         "build/peers/cvodes_lv --rtol %s --atol %s --method adams 2>/dev/null",
                         tols[k], tols[k]);
                peer_run(cmd, "sundials_version", &one);
                int i = peer_find(&one, "cvodes_adams_grad");
                if (i >= 0 && cv.n < MAX_ROWS) {
                    snprintf(cv.name[cv.n], sizeof cv.name[cv.n], "adams, tol %s", tols[k]);
                    cv.us[cv.n] = one.us[i];
                    cv.err[cv.n] = one.err[i];
                    cv.n++;
                    snprintf(cv.version, sizeof cv.version, "%s", one.version);
                }
            }
        }
    }
    if (peers && (want[W_MLP] || want[W_MLP784]) && have_py) {
        static const char *const keys[4] = {"tiny_step_us", "mlp_step_us", "tiny_first_ms",
                                            "mlp_first_ms"};
        char cmd[256];
        snprintf(cmd, sizeof cmd,
                 "build/peers/bin/python benchmarks/peers/jax_mlp_step.py%s%s "
                 "2>/dev/null",
                 want[W_MLP] ? " tiny" : "", want[W_MLP784] ? " mlp" : "");
        bench_peer_read(cmd, 4, keys, jax, "jax_version", jax_version, sizeof jax_version);
    }

    printf("%s\n", info);
    printf("limits: benchmarks/limits/, SLEEF table %s; machine: %ld CPUs, load average %s at "
           "start; 1 thread; medians of %d interleaved rounds\n",
           lim_vmath_get()->isa, sysconf(_SC_NPROCESSORS_ONLN), load, samples);
    printf("peers: Diffrax %s, CVODES %s, JAX %s; native cache %s\n\n",
           dfx.version[0] ? dfx.version : "not run", cv.version[0] ? cv.version : "not run",
           jax_version[0] ? jax_version : "not run", cache_dir);

    /* ---- nabla and the limits ---- */
    wl_res res[W_COUNT];
    memset(res, 0, sizeof res);
    static log_box boxes[W_COUNT][T_COUNT];
    for (int w = 0; w < W_COUNT; w++) {
        res[w].peer = res[w].peer2 = res[w].base2 = NAN;
        for (int t = 0; t < T_COUNT; t++) {
            atomic_flag_clear(&boxes[w][t].taken);
        }
        if (!want[w]) {
            continue;
        }
        res[w].run = true;
        if (w == W_LV || w == W_LVGRAD) {
            bench_lv(w == W_LVGRAD, w == W_LV || !want[W_LV], &ref, samples, &res[w], boxes[w]);
        } else {
            bench_mlp(w == W_MLP, samples, &res[w], boxes[w]);
        }
        for (int t = 0; t < T_COUNT; t++) {
            snprintf(res[w].why[t], sizeof res[w].why[t], "%s", boxes[w][t].msg);
        }
        bench_first(w, first_rounds, &res[w]);
    }

    /* ---- peers into the rows ---- */
    double nab_grad_err = NAN;
    if (want[W_LV]) {
        int i = peer_find(&dfx, "diffrax_tsit5_solve");
        res[W_LV].peer = i >= 0 ? dfx.us[i] : NAN;
        snprintf(res[W_LV].peer_name, sizeof res[W_LV].peer_name, "Diffrax Tsit5");
    }
    if (want[W_LVGRAD]) {
        /* nabla's gradient error, for CVODES at equal accuracy */
        nb_ctx *ctx = ctx_new(NULL);
        nb_fn *g = lv_fn(ctx, 1, 0.01, true, NB_NATIVE_OFF);
        nb_tree *args = lv_args(ctx);
        double v[6];
        out_f64(ctx, g, args, -1, v, 6);
        nab_grad_err = max_rel(v, ref.g, 6);
        nb_tree_destroy(args);
        nb_fn_destroy(g);
        nb_ctx_destroy(ctx);
        int best = -1;
        for (int i = 0; i < cv.n; i++) {
            if (cv.err[i] <= nab_grad_err && (best < 0 || cv.us[i] < cv.us[best])) {
                best = i;
            }
        }
        res[W_LVGRAD].peer = best >= 0 ? cv.us[best] : NAN;
        snprintf(res[W_LVGRAD].peer_name, sizeof res[W_LVGRAD].peer_name, "CVODES adjoint%s%s",
                 cv.n == 0 ? "" : ", ",
                 cv.n == 0   ? ""
                 : best >= 0 ? cv.name[best]
                             : "none as accurate");
        int d = peer_find(&dfx, "diffrax_tsit5_grad");
        res[W_LVGRAD].peer2 = d >= 0 ? dfx.us[d] : NAN;
        snprintf(res[W_LVGRAD].peer2_name, sizeof res[W_LVGRAD].peer2_name,
                 "Diffrax RecursiveCheckpointAdjoint");
    }
    if (want[W_MLP]) {
        res[W_MLP].peer = jax[0];
        snprintf(res[W_MLP].peer_name, sizeof res[W_MLP].peer_name, "JAX + Optax");
    }
    if (want[W_MLP784]) {
        res[W_MLP784].peer = jax[1];
        snprintf(res[W_MLP784].peer_name, sizeof res[W_MLP784].peer_name, "JAX + Optax");
    }

    /* ---- the speed table ---- */
    static const char *const wl_text[W_COUNT] = {
        "LV tsit5 solve, rtol 1e-8", "LV gradient (recursive checkpoint)",
        "tiny MLP 2-32-32-1 b16, Adam step", "MLP 784-256-256-10 b128, Adam step"};
    printf("## Speed (1 thread, µs per call, medians)\n\n");
    printf("| workload | limit (C) | nabla interpreter | nabla native (tier) | peer | "
           "interp / C | native / C | peer / native | goal | met |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
    for (int w = 0; w < W_COUNT; w++) {
        const wl_res *r = &res[w];
        if (!r->run) {
            continue;
        }
        char a[32], b[32], c[32], d[32];
        cell(a, sizeof a, r->lim);
        cell(b, sizeof b, r->tier_us[T_OFF]);
        cell(c, sizeof c, r->tier_us[T_NOW]);
        cell(d, sizeof d, r->peer);
        double nat = r->tier_us[T_NOW];
        double qc = nat / r->lim, qp = r->peer / nat;
        char goal[160], ok[64];
        switch (w) {
        case W_LV:
            snprintf(goal, sizeof goal, "<= 2x C; >= 5x faster than Diffrax");
            snprintf(ok, sizeof ok, "%s; %s", met(qc, 2.0, true), met(qp, 5.0, false));
            break;
        case W_LVGRAD:
            snprintf(goal, sizeof goal, "<= 3x C; >= 10x faster than CVODES at equal accuracy");
            snprintf(ok, sizeof ok, "%s; %s", met(qc, 3.0, true), met(qp, 10.0, false));
            break;
        case W_MLP:
            snprintf(goal, sizeof goal, "<= 1.3x C");
            snprintf(ok, sizeof ok, "%s", met(qc, 1.3, true));
            break;
        default:
            snprintf(goal, sizeof goal, "<= 1.1x its GEMMs + plain-C Adam (%.0f µs)", r->base2);
            snprintf(ok, sizeof ok, "%s", met(nat / r->base2, 1.1, true));
            break;
        }
        char qpeer[32];
        snprintf(qpeer, sizeof qpeer, isnan(qp) ? "-" : "%.2f", qp);
        printf("| %s | %s | %s | %s (%d) | %s (%s) | %.2f | %.2f | %s | %s | %s |\n", wl_text[w], a,
               b, c, r->tier[T_NOW], d, r->peer_name, r->tier_us[T_OFF] / r->lim, qc, qpeer, goal,
               ok);
    }
    printf("\nlimit: benchmarks/limits/ (hand-written C, same operations in the same order; "
           "-O3 -ffp-contract=off -march=native). native: NB_NATIVE_NOW, the tier that ran in "
           "parentheses (0: the interpreter, 1: native code). peer / native above 1: nabla is "
           "faster.\n");
    if (res[W_LVGRAD].run) {
        const wl_res *r = &res[W_LVGRAD];
        printf("LV gradient: nabla's error vs the reference %.2e; CVODES Adams adjoint runs:",
               nab_grad_err);
        for (int i = 0; i < cv.n; i++) {
            printf(" %s %.1f µs (error %.2e)%s", cv.name[i], cv.us[i], cv.err[i],
                   i + 1 < cv.n ? "," : "");
        }
        if (cv.n == 0) {
            printf(" not run");
        }
        if (isnan(r->peer2)) {
            printf("; Diffrax not run.\n");
        } else {
            printf("; Diffrax (max_steps 4096) %.1f µs: %.2fx the native tier.\n", r->peer2,
                   r->peer2 / r->tier_us[T_NOW]);
        }
    }
    if (res[W_MLP784].run) {
        const wl_res *r = &res[W_MLP784];
        printf("MLP 784: its 8 GEMMs (BLIS) + the plain-C Adam alone %.1f µs; native / that "
               "%.2f, interpreter / that %.2f.\n",
               r->base2, r->tier_us[T_NOW] / r->base2, r->tier_us[T_OFF] / r->base2);
    }
    for (int w = 0; w < W_COUNT; w++) {
        for (int t = 0; t < T_COUNT; t++) {
            if (res[w].run && res[w].why[t][0]) {
                printf("%s, %s context logged: %s\n", w_names[w],
                       t == T_OFF ? "interpreter" : "native", res[w].why[t]);
            }
        }
    }

    /* ---- first calls ---- */
    printf("\n## First call of a fresh program (new context: trace + compile + one run; ms, "
           "medians of %d; tier in parentheses)\n\n",
           first_rounds);
    printf("| workload | OFF | AUTO, empty cache | NOW, empty cache | NOW, warm cache | AUTO, "
           "warm cache | compile (NOW cold - OFF) | cache hit (NOW warm - OFF) | peer |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int w = 0; w < W_COUNT; w++) {
        const wl_res *r = &res[w];
        if (!r->run) {
            continue;
        }
        char peer[64] = "";
        double pf = w == W_MLP ? jax[2] : w == W_MLP784 ? jax[3] : NAN;
        if (!isnan(pf)) {
            snprintf(peer, sizeof peer, "JAX %.0f", pf);
        } else {
            snprintf(peer, sizeof peer, "-");
        }
        printf("| %s | %.2f (%d) | %.2f (%d) | %.2f (%d) | %.2f (%d) | %.2f (%d) | %.2f | %.2f | "
               "%s |\n",
               w_names[w], r->first[F_OFF], r->first_tier[F_OFF], r->first[F_AUTO_COLD],
               r->first_tier[F_AUTO_COLD], r->first[F_NOW_COLD], r->first_tier[F_NOW_COLD],
               r->first[F_NOW_WARM], r->first_tier[F_NOW_WARM], r->first[F_AUTO_WARM],
               r->first_tier[F_AUTO_WARM], r->first[F_NOW_COLD] - r->first[F_OFF],
               r->first[F_NOW_WARM] - r->first[F_OFF], peer);
    }
    printf("\nGoal: the first call no slower than today's (AUTO, empty cache, vs OFF); with a "
           "warm disk cache the native tier from the first call (AUTO and NOW warm: tier 1).\n");

    return 0;
}

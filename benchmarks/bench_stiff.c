/*
 * bench_stiff.c -- work-precision of the stiff solvers on Hairer's test set, peers in the
 * same run.
 *
 * Problems (tests/ode/stiff_problems.h; references tests/ode/oracle/stiff_ref.txt, SciPy
 * Radau at rtol 1e-13): robertson (t1 = 1e5), hires, vdp (mu = 1e3), pollu; rtol = 1e-4,
 * 1e-6, 1e-8 with atol = rtol x the problem's scale (the reference file's
 * bench_atol_scale). The error of a solve is the final state's, in the controller's norm:
 * sqrt(mean_i ((y_i - ref_i) / (|ref_i| + scale))^2); of a gradient (robertson and hires,
 * of sum_i w_i y_i(t1) with respect to every rate constant) max_i |g_i - g_ref,i| / max |g_ref|.
 *
 * nabla: rodas5p, kvaerno5, kencarp5 (the term as the implicit part), ros3p, rosenbrock23
 * (1e-4 only: an order-2 method) and bdf, also at rtol 1e-10 (not kencarp5, ros3p), each jitted
 * with the parameters as an argument, native code compiled before timing (NABLA_NATIVE=now unless
 * set), 1 thread; the median of the rounds (bench_common.h: interleaved, rotated). Gradients:
 * rodas5p, kvaerno5 and bdf with the recursive checkpoint adjoint (nabla_<solver>_grad), and
 * rodas5p and bdf with the interpolating adjoint (nabla_<solver>_interp_grad). Peers, run from here
 * when built/installed: build/peers/cvodes_stiff (SUNDIALS CVODES BDF, dense linear solver,
 * analytic Jacobian; its adjoint CVodeB for gradients; benchmarks/peers/build_cvodes.sh),
 * benchmarks/peers/diffrax_stiff.py (Diffrax Kvaerno5 and KenCarp5, RecursiveCheckpointAdjoint) and
 * benchmarks/peers/scipy_stiff.py (SciPy Radau and BDF with the analytic Jacobian), both with
 * build/peers/bin/python.
 *
 * Output: a table per problem and a ratio summary (nabla's fastest solve of at least the
 * peer's accuracy, against CVODES and Diffrax at each rtol); with --plots DIR, gnuplot
 * work-precision plots DIR/stiff_<problem>.png (error against time, log-log) and their data.
 *
 * Usage: bench_stiff [--rounds N] [--no-peers] [--problems a,b] [--plots DIR]
 */
#define _POSIX_C_SOURCE 200809L
#define BENCH_NAME "bench_stiff"
#include "bench_common.h"
#include "stiff_problems.h"

#include <sys/stat.h>
#include <unistd.h>

#define MAX_ROWS 512

typedef struct row {
    char name[96]; /* <method>_<problem>_<rtolexp>, as the peers print */
    double us, err, steps;
} row;

static row g_rows[MAX_ROWS];
static int g_n_rows;

static void add_row(const char *name, double us, double err, double steps) {
    if (g_n_rows < MAX_ROWS) {
        row *r = &g_rows[g_n_rows++];
        snprintf(r->name, sizeof r->name, "%s", name);
        r->us = us;
        r->err = err;
        r->steps = steps;
    }
}

static const row *find_row(const char *name) {
    for (int i = 0; i < g_n_rows; i++) {
        if (strcmp(g_rows[i].name, name) == 0) {
            return &g_rows[i];
        }
    }
    return NULL;
}

/* Read a peer's "row <name> <us> <err> <steps>" lines; version_key's value into version. */
static void peer_rows(const char *cmd, const char *version_key, char *version, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (p == NULL) {
        return;
    }
    char line[512];
    while (fgets(line, sizeof line, p) != NULL) {
        char k[64], name[96];
        double us = NAN, err = NAN, steps = NAN;
        if (sscanf(line, "%63s", k) != 1) {
            continue;
        }
        if (strcmp(k, "row") == 0 &&
            sscanf(line, "%*s %95s %lf %lf %lf", name, &us, &err, &steps) >= 3) {
            add_row(name, us, err, steps);
        } else if (strcmp(k, version_key) == 0) {
            sscanf(line, "%*s %63s", version);
            (void)cap;
        }
    }
    pclose(p);
}

/* ---- the reference file ------------------------------------------------------------------ */

static int ref_read(const char *problem, const char *field, double *v, int cap) {
    FILE *f = fopen("tests/ode/oracle/stiff_ref.txt", "r");
    if (f == NULL) {
        fprintf(stderr, BENCH_NAME ": run from the repository root (tests/ode/oracle/)\n");
        exit(1);
    }
    char line[4096], name[64], key[64];
    int n = 0;
    while (n == 0 && fgets(line, sizeof line, f) != NULL) {
        int used = 0;
        if (line[0] == '#' || sscanf(line, "%63s %63s%n", name, key, &used) != 2 ||
            strcmp(name, problem) != 0 || strcmp(key, field) != 0) {
            continue;
        }
        char *q = line + used, *end = NULL;
        for (double x = strtod(q, &end); end != q && n < cap; x = strtod(q, &end)) {
            v[n++] = x;
            q = end;
        }
    }
    fclose(f);
    return n;
}

/* ---- nabla's solves ---------------------------------------------------------------------- */

typedef struct cfg {
    const sp_problem *P;
    int solver, grad; /* grad: 0 none, 1 recursive checkpoint, 2 interpolating adjoint */
    double rtol, scale;
    double w[32];
} cfg;

/* self: an int (the index into g_cfgs) */
static cfg g_cfgs[256];
static int g_n_cfgs;

static nb_status body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    int64_t ci = 0;
    nb_tree_get_int(self, &ci);
    const cfg *c = &g_cfgs[ci];
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_fn *term = NULL;
    nb_status st = nb_fn_create(ctx, c->P->name, c->P->term, NULL, &term);
    if (st != NB_OK) {
        return st;
    }
    nb_ode_opts o = nb_ode_opts_default();
    o.solver = (nb_ode_solver)c->solver;
    o.t1 = c->P->t1;
    o.controller = nb_ode_pid(c->rtol, c->rtol * c->scale);
    o.max_steps = 1000000;
    if (c->grad == 2) {
        o.adjoint.kind = NB_ADJOINT_INTERPOLATED;
    }
    nb_array *y0a = NULL;
    st = nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){c->P->n}, c->P->y0, &y0a);
    if (st != NB_OK) {
        nb_fn_destroy(term);
        return st;
    }
    nb_tree *y0 = nb_leaf(nb_constant(tr, y0a));
    nb_array_destroy(y0a);
    const nb_tree *sol = nb_diffeqsolve(tr, term, y0, nb_tree_child(args, 0), &o);
    nb_fn_destroy(term);
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *ys = nb_reshape(nb_get(tr, sol, "ys"), 1, (int64_t[]){c->P->n});
    nb_var *steps = nb_get(tr, sol, "stats.num_steps");
    if (!c->grad) {
        return nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(ys), nb_leaf(steps)}, out);
    }
    nb_array *wa = NULL;
    st = nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){c->P->n}, c->w, &wa);
    if (st != NB_OK) {
        return st;
    }
    nb_var *loss = nb_sum(nb_mul(ys, nb_constant(tr, wa)), NULL, 0, false);
    nb_array_destroy(wa);
    return nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(loss), nb_leaf(steps)}, out);
}

typedef struct job {
    nb_ctx *ctx;
    nb_fn *fn;
    nb_tree *args;
    int inner;
} job;

static double sample(void *ud) {
    job *j = ud;
    double t0 = bench_now_s();
    for (int i = 0; i < j->inner; i++) {
        nb_tree *out = NULL;
        if (nb_fn_call(j->fn, j->args, &out) != NB_OK) {
            fprintf(stderr, BENCH_NAME ": a solve failed: %s\n", nb_ctx_errmsg(j->ctx));
            exit(1);
        }
        nb_tree_destroy(out);
    }
    return (bench_now_s() - t0) / j->inner * 1e6;
}

static double leaf(const nb_tree *t, int64_t i) {
    double v = NAN;
    nb_array_get_flat(nb_tree_get_array(t), i, &v);
    return v;
}

static const int NABLA_SOLVERS[] = {NB_ODE_RODAS5P, NB_ODE_KVAERNO5,     NB_ODE_KENCARP5,
                                    NB_ODE_ROS3P,   NB_ODE_ROSENBROCK23, NB_ODE_BDF};
static const char *const PROBLEMS[] = {"robertson", "hires", "vdp", "pollu"};
/* the peers run at 1e-4, 1e-6, 1e-8; nabla also at 1e-10 (rodas5p, kvaerno5 and bdf), so
 * that a peer's 1e-8 run, often more accurate than its rtol, has a nabla run to meet */
static const int RTOLS[] = {4, 6, 8, 10};

static const sp_problem *problem(const char *name) {
    for (int i = 0; i < SP_N_PROBLEMS; i++) {
        if (strcmp(SP_PROBLEMS[i].name, name) == 0) {
            return &SP_PROBLEMS[i];
        }
    }
    return NULL;
}

/* One nabla configuration: compile, check, time; its row. */
static const char *grad_suffix(int grad) {
    return grad == 0 ? "" : grad == 1 ? "_grad" : "_interp_grad";
}

static void run_nabla(nb_ctx *ctx, const sp_problem *P, int solver, int rexp, int grad,
                      int rounds) {
    cfg *c = &g_cfgs[g_n_cfgs];
    memset(c, 0, sizeof *c);
    c->P = P;
    c->solver = solver;
    c->grad = grad;
    c->rtol = pow(10.0, -rexp);
    ref_read(P->name, "bench_atol_scale", &c->scale, 1);
    if (grad) {
        ref_read(P->name, "w", c->w, 32);
    }
    nb_tree *self = NULL, *pl = NULL, *args = NULL;
    BENCH_CHECK(ctx, nb_tree_int(ctx, g_n_cfgs++, &self));
    nb_array *pa = NULL;
    BENCH_CHECK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){P->np}, P->p, &pa));
    BENCH_CHECK(ctx, nb_tree_array(pa, &pl));
    nb_array_destroy(pa);
    BENCH_CHECK(ctx, nb_tree_tuple(ctx, 1, &pl, &args));
    nb_tree_destroy(pl);
    nb_fn *f = NULL, *g = NULL, *jf = NULL;
    BENCH_CHECK(ctx, nb_fn_create(ctx, "stiff", body, self, &f));
    nb_tree_destroy(self);
    if (grad) {
        nb_grad_opts go = nb_grad_opts_default();
        go.has_aux = true;
        BENCH_CHECK(ctx, nb_value_and_grad(f, &go, &g));
    }
    BENCH_CHECK(ctx, nb_jit(grad ? g : f, NULL, &jf));
    /* the first call compiles (and, with NABLA_NATIVE=now, writes native code) */
    double tc = bench_now_s();
    nb_tree *out = NULL;
    BENCH_CHECK(ctx, nb_fn_call(jf, args, &out));
    tc = bench_now_s() - tc;
    double err = 0, steps = 0;
    if (!grad) {
        double ref[32], s = 0;
        ref_read(P->name, "y1", ref, 32);
        for (int i = 0; i < P->n; i++) {
            double e = (leaf(nb_tree_child(out, 0), i) - ref[i]) / (fabs(ref[i]) + c->scale);
            s += e * e;
        }
        err = sqrt(s / P->n);
        steps = leaf(nb_tree_child(out, 1), 0);
    } else {
        double gref[32], gmax = 0;
        ref_read(P->name, "grad", gref, 32);
        for (int i = 0; i < P->np; i++) {
            gmax = fmax(gmax, fabs(gref[i]));
        }
        const nb_tree *gt = nb_tree_child(out, 1);
        for (int i = 0; i < P->np; i++) {
            err = fmax(err, fabs(leaf(gt, i) - gref[i]) / gmax);
        }
        steps = leaf(nb_tree_child(nb_tree_child(out, 0), 1), 0);
    }
    nb_tree_destroy(out);
    job j = {ctx, jf, args, 1};
    /* about 20 ms a sample */
    double one = sample(&j);
    j.inner = one > 20000 ? 1 : (int)(20000 / fmax(one, 1.0));
    bench_item it = {.sample = sample, .ud = &j};
    bench_rounds(&it, 1, rounds);
    double us = bench_median(it.s, rounds < BENCH_MAX_ROUNDS ? rounds : BENCH_MAX_ROUNDS);
    char name[96];
    snprintf(name, sizeof name, "nabla_%s%s_%s_%d", nb_ode_solver_name((nb_ode_solver)solver),
             grad_suffix(grad), P->name, rexp);
    add_row(name, us, err, steps);
    fprintf(stderr, "%s: %.1f us, error %.2e, %.0f steps (first call %.0f ms)\n", name, us, err,
            steps, tc * 1e3);
    nb_fn_destroy(jf);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nb_tree_destroy(args);
}

/* Is name one of the comma-separated list's entries? */
static bool bench_listed(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; *p != '\0';) {
        const char *e = strchr(p, ',');
        size_t len = e != NULL ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) {
            return true;
        }
        p += len + (e != NULL);
    }
    return false;
}

/* ---- reporting ----------------------------------------------------------------------------- */

static const char *const PEERS[] = {"cvodes_bdf", "diffrax_kvaerno5", "diffrax_kencarp5",
                                    "scipy_radau", "scipy_bdf"};

static void print_table(const char *prob, bool grad) {
    printf("\n%s%s (time us / error / steps)\n", prob, grad ? ", gradient" : "");
    printf("%-28s", "method");
    for (size_t r = 0; r < sizeof RTOLS / sizeof RTOLS[0]; r++) {
        printf(" | rtol 1e-%d%22s", RTOLS[r], "");
    }
    printf("\n");
    char name[128];
    const char *methods[24];
    int nm = 0;
    static char buf[24][64];
    for (int kind = grad ? 1 : 0; kind <= (grad ? 2 : 0); kind++) {
        for (size_t s = 0; s < sizeof NABLA_SOLVERS / sizeof NABLA_SOLVERS[0]; s++) {
            snprintf(buf[nm], sizeof buf[nm], "nabla_%s%s",
                     nb_ode_solver_name((nb_ode_solver)NABLA_SOLVERS[s]), grad_suffix(kind));
            methods[nm] = buf[nm];
            nm++;
        }
    }
    if (grad) {
        methods[nm++] = "cvodes_bdf_grad";
        methods[nm++] = "diffrax_kvaerno5_grad";
    } else {
        for (size_t k = 0; k < sizeof PEERS / sizeof PEERS[0]; k++) {
            methods[nm++] = PEERS[k];
        }
    }
    for (int m = 0; m < nm; m++) {
        bool any = false;
        for (size_t r = 0; r < sizeof RTOLS / sizeof RTOLS[0]; r++) {
            snprintf(name, sizeof name, "%s_%s_%d", methods[m], prob, RTOLS[r]);
            any = any || find_row(name) != NULL;
        }
        if (!any) {
            continue;
        }
        printf("%-28s", methods[m]);
        for (size_t r = 0; r < sizeof RTOLS / sizeof RTOLS[0]; r++) {
            snprintf(name, sizeof name, "%s_%s_%d", methods[m], prob, RTOLS[r]);
            const row *w = find_row(name);
            if (w == NULL) {
                printf(" | %-29s", "-");
            } else {
                printf(" | %9.0f %9.2e %8.0f", w->us, w->err, w->steps);
            }
        }
        printf("\n");
    }
}

/* nabla's fastest row for prob/rtol (grad or not) whose error is at most max_err */
static const row *best_nabla(const char *prob, int rexp, bool grad, double max_err) {
    const row *best = NULL;
    char name[128];
    for (int kind = grad ? 1 : 0; kind <= (grad ? 2 : 0); kind++) {
        for (size_t s = 0; s < sizeof NABLA_SOLVERS / sizeof NABLA_SOLVERS[0]; s++) {
            for (size_t r = 0; r < sizeof RTOLS / sizeof RTOLS[0]; r++) {
                snprintf(name, sizeof name, "nabla_%s%s_%s_%d",
                         nb_ode_solver_name((nb_ode_solver)NABLA_SOLVERS[s]), grad_suffix(kind),
                         prob, RTOLS[r]);
                const row *w = find_row(name);
                if (w != NULL && w->err <= max_err && (best == NULL || w->us < best->us)) {
                    best = w;
                }
            }
        }
    }
    (void)rexp;
    return best;
}

static void print_ratios(void) {
    printf("\nratios: peer time / nabla's fastest solve (any solver, any rtol) at least as "
           "accurate as the peer\n");
    const char *peers[] = {"cvodes_bdf", "diffrax_kvaerno5", "diffrax_kencarp5", "scipy_radau",
                           "scipy_bdf"};
    for (size_t pi = 0; pi < sizeof PROBLEMS / sizeof PROBLEMS[0]; pi++) {
        for (int grad = 0; grad < 2; grad++) {
            for (size_t k = 0; k < (grad ? 2 : sizeof peers / sizeof peers[0]); k++) {
                const char *peer =
                    grad ? (k == 0 ? "cvodes_bdf_grad" : "diffrax_kvaerno5_grad") : peers[k];
                for (size_t r = 0; r < sizeof RTOLS / sizeof RTOLS[0]; r++) {
                    char name[128];
                    snprintf(name, sizeof name, "%s_%s_%d", peer, PROBLEMS[pi], RTOLS[r]);
                    const row *p = find_row(name);
                    if (p == NULL || !isfinite(p->err)) {
                        continue;
                    }
                    const row *n = best_nabla(PROBLEMS[pi], RTOLS[r], grad, p->err);
                    if (n == NULL) {
                        printf("  %-9s %-22s rtol 1e-%d: error %.2e -- no nabla run that "
                               "accurate\n",
                               PROBLEMS[pi], peer, RTOLS[r], p->err);
                        continue;
                    }
                    printf("  %-9s %-22s rtol 1e-%d: %9.0f us (error %.2e) vs %-30s %9.0f us "
                           "(%.2e): %.2fx\n",
                           PROBLEMS[pi], peer, RTOLS[r], p->us, p->err, n->name, n->us, n->err,
                           p->us / n->us);
                }
            }
        }
    }
}

static void write_plots(const char *dir) {
    mkdir(dir, 0755);
    for (size_t pi = 0; pi < sizeof PROBLEMS / sizeof PROBLEMS[0]; pi++) {
        char path[512], plot[4096];
        snprintf(path, sizeof path, "%s/stiff_%s.dat", dir, PROBLEMS[pi]);
        FILE *f = fopen(path, "w");
        if (f == NULL) {
            continue;
        }
        /* one block per method: "time_us error", in rtol order */
        const char *methods[32];
        int nm = 0;
        static char buf[32][64];
        for (int i = 0; i < g_n_rows; i++) {
            const char *n = g_rows[i].name;
            const char *at = strstr(n, PROBLEMS[pi]);
            if (at == NULL || at == n || at[-1] != '_' || strstr(n, "_grad") != NULL) {
                continue;
            }
            char m[64];
            snprintf(m, sizeof m, "%.*s", (int)(at - n - 1), n);
            bool seen = false;
            for (int k = 0; k < nm; k++) {
                seen = seen || strcmp(methods[k], m) == 0;
            }
            if (!seen && nm < 32) {
                snprintf(buf[nm], sizeof buf[nm], "%s", m);
                methods[nm] = buf[nm];
                nm++;
            }
        }
        int blocks = 0;
        for (int k = 0; k < nm; k++) {
            fprintf(f, "# %s\n", methods[k]);
            for (size_t r = 0; r < sizeof RTOLS / sizeof RTOLS[0]; r++) {
                char name[128];
                snprintf(name, sizeof name, "%s_%s_%d", methods[k], PROBLEMS[pi], RTOLS[r]);
                const row *w = find_row(name);
                if (w != NULL && isfinite(w->err) && w->err > 0) {
                    fprintf(f, "%g %g\n", w->us, w->err);
                }
            }
            fprintf(f, "\n\n");
            blocks++;
        }
        fclose(f);
        int o =
            snprintf(plot, sizeof plot,
                     "set terminal pngcairo size 800,560 noenhanced\nset output '%s/stiff_%s.png'\n"
                     "set logscale xy\nset xlabel 'time per solve (us), 1 thread'\n"
                     "set ylabel 'final-state error (controller norm)'\n"
                     "set title '%s: work-precision (rtol 1e-4 .. 1e-8; nabla to 1e-10)'\n"
                     "set key outside right\nset grid\nplot ",
                     dir, PROBLEMS[pi], PROBLEMS[pi]);
        for (int k = 0; k < blocks && o < (int)sizeof plot - 200; k++) {
            o += snprintf(plot + o, sizeof plot - (size_t)o,
                          "%s'%s/stiff_%s.dat' index %d with linespoints lw 2 title '%s'",
                          k ? ", " : "", dir, PROBLEMS[pi], k, methods[k]);
        }
        snprintf(path, sizeof path, "%s/stiff_%s.gp", dir, PROBLEMS[pi]);
        f = fopen(path, "w");
        if (f != NULL) {
            fprintf(f, "%s\n", plot);
            fclose(f);
            char cmd[600];
            snprintf(cmd, sizeof cmd, "gnuplot '%s' 2>/dev/null", path);
            if (system(cmd) != 0) {
                fprintf(stderr, BENCH_NAME ": gnuplot failed on %s\n", path);
            }
        }
    }
}

int main(int argc, char **argv) {
    int rounds = 7;
    bool peers = true;
    const char *plots = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--no-peers") == 0) {
            peers = false;
        } else if (strcmp(argv[i], "--plots") == 0 && i + 1 < argc) {
            plots = argv[++i];
        } else if (strcmp(argv[i], "--problems") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else {
            fprintf(stderr, "usage: bench_stiff [--rounds N] [--no-peers] [--problems a,b] "
                            "[--plots DIR]\n");
            return 2;
        }
    }
    if (getenv("NABLA_NATIVE") == NULL) {
        setenv("NABLA_NATIVE", "now", 1);
    }
    nb_ctx_opts co = nb_ctx_opts_default();
    co.n_threads = 1;
    nb_ctx *ctx = NULL;
    BENCH_CHECK(NULL, nb_ctx_create(&co, &ctx));
    char load[16];
    bench_load_average(load, sizeof load);
    printf("bench_stiff: nabla %s, 1 thread, NABLA_NATIVE=%s, load average %s\n", nb_version(),
           getenv("NABLA_NATIVE"), load);
    for (size_t pi = 0; pi < sizeof PROBLEMS / sizeof PROBLEMS[0]; pi++) {
        const sp_problem *P = problem(PROBLEMS[pi]);
        if (only != NULL && !bench_listed(only, P->name)) {
            continue; /* --problems: the others are skipped (the peers still run all) */
        }
        for (size_t s = 0; s < sizeof NABLA_SOLVERS / sizeof NABLA_SOLVERS[0]; s++) {
            for (size_t r = 0; r < sizeof RTOLS / sizeof RTOLS[0]; r++) {
                if (NABLA_SOLVERS[s] == NB_ODE_ROSENBROCK23 && RTOLS[r] > 4) {
                    continue; /* order 2: loose tolerances only */
                }
                if (NABLA_SOLVERS[s] == NB_ODE_ROS3P && RTOLS[r] > 6) {
                    continue;
                }
                if (NABLA_SOLVERS[s] == NB_ODE_KENCARP5 && RTOLS[r] > 8) {
                    continue;
                }
                run_nabla(ctx, P, NABLA_SOLVERS[s], RTOLS[r], 0, rounds);
            }
        }
        if (strcmp(P->name, "robertson") == 0 || strcmp(P->name, "hires") == 0) {
            static const int gs[] = {NB_ODE_RODAS5P, NB_ODE_KVAERNO5, NB_ODE_BDF};
            for (int kind = 1; kind <= 2; kind++) {
                for (size_t s = 0; s < 3; s++) {
                    if (kind == 2 && gs[s] == NB_ODE_KVAERNO5) {
                        continue; /* the interpolating adjoint: rodas5p and bdf */
                    }
                    for (size_t r = 0; r < sizeof RTOLS / sizeof RTOLS[0]; r++) {
                        run_nabla(ctx, P, gs[s], RTOLS[r], kind, rounds);
                    }
                }
            }
        }
    }
    char v_cv[64] = "-", v_dx[64] = "-", v_sp[64] = "-";
    if (peers) {
        if (access("build/peers/cvodes_stiff", X_OK) == 0) {
            peer_rows("build/peers/cvodes_stiff 2>/dev/null", "sundials_version", v_cv,
                      sizeof v_cv);
        } else {
            fprintf(stderr, BENCH_NAME ": no build/peers/cvodes_stiff "
                                       "(benchmarks/peers/build_cvodes.sh builds it)\n");
        }
        if (access("build/peers/bin/python", X_OK) == 0) {
            peer_rows("build/peers/bin/python benchmarks/peers/diffrax_stiff.py 2>/dev/null",
                      "diffrax_version", v_dx, sizeof v_dx);
            peer_rows("build/peers/bin/python benchmarks/peers/scipy_stiff.py 2>/dev/null",
                      "scipy_version", v_sp, sizeof v_sp);
        } else {
            fprintf(stderr, BENCH_NAME ": no build/peers/bin/python (the peers' virtualenv)\n");
        }
    }
    printf("peers: CVODES %s, Diffrax %s, SciPy %s\n", v_cv, v_dx, v_sp);
    for (size_t pi = 0; pi < sizeof PROBLEMS / sizeof PROBLEMS[0]; pi++) {
        print_table(PROBLEMS[pi], false);
        if (pi < 2) {
            print_table(PROBLEMS[pi], true);
        }
    }
    print_ratios();
    if (plots != NULL) {
        write_plots(plots);
        printf("\nplots: %s/stiff_<problem>.png\n", plots);
    }
    nb_ctx_destroy(ctx);
    return 0;
}

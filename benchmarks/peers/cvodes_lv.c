/*
 * cvodes_lv.c -- peer numbers for nabla's ODE benchmarks (bench_ode): SUNDIALS CVODES on the
 * Lotka-Volterra problem of tests/ode/oracle/lotka_volterra.txt, the state at t = 10 and the
 * gradient of G = x(10) + y(10) with respect to (a, b, c, d, x0, y0) by the adjoint method.
 *
 *   dx/dt = a x - b x y,  dy/dt = -c y + d x y,  a = 1.5, b = 1, c = 3, d = 1, x0 = y0 = 1,
 *   t in [0, 10].
 *
 * Build (Debian 12: apt-get install libsundials-dev, SUNDIALS 6.4.1), or use
 * benchmarks/peers/build_cvodes.sh:
 *   cc -std=c17 -O2 benchmarks/peers/cvodes_lv.c -o cvodes_lv -lsundials_cvodes \
 *      -lsundials_nvecserial -lsundials_sunmatrixdense -lsundials_sunlinsoldense \
 *      -lsundials_sunnonlinsolfixedpoint -lm
 *
 * Run from the repository root (the reference's default path is relative to it):
 *   cvodes_lv [--rtol R] [--atol A] [--repeats N] [--inner K] [--method adams|bdf|both]
 *             [--interp hermite|polynomial] [--ref tests/ode/oracle/lotka_volterra.txt]
 * Defaults: rtol = atol = 1e-8, N = 31 samples, each the mean of K = 20 calls, both methods,
 * Hermite interpolation of the forward solution during the backward solve.
 *
 * Methods: "adams" is CVODES's Adams-Moulton (non-stiff) with fixed-point iteration (no
 * Jacobian); "bdf" is BDF with Newton iteration, a dense linear solver and the analytic
 * Jacobian. The backward (adjoint) problem uses the same method, tolerances and iteration.
 *
 * What is timed (the CVODES memory is created once, outside the timing, like a jitted
 * function; every call starts from CVodeReInit):
 *   solve  CVodeReInit + CVode to t = 10 (no checkpointing)
 *   grad   CVodeReInit + CVodeAdjReInit + CVodeF to t = 10 (checkpoints every 100 steps,
 *          Hermite interpolation unless --interp polynomial), then CVodeReInitB /
 *          CVodeQuadReInitB and CVodeB back to t = 0: lambda' = -J^T lambda,
 *          lambda(10) = dG/dy = (1, 1); the quadrature q' = -lambda^T df/d(a,b,c,d)
 *          (included in the error test) gives dG/d(a,b,c,d) = q(0), and lambda(0) =
 *          dG/d(x0, y0).
 *
 * Output, one "key value..." per line:
 *   sundials_version 6.4.1 / rtol / atol / repeats / inner / interp
 *   row cvodes_<method>_solve <median_us> <max rel. err. of (x(10), y(10)) vs the reference>
 *   row cvodes_<method>_grad <median_us> <max rel. err. of the six gradient entries>
 *   cvodes_<method>_{solve,grad}_min_us   the best sample
 *   cvodes_<method>_state <x(10)> <y(10)>
 *   cvodes_<method>_gradient <dG/da> <dG/db> <dG/dc> <dG/dd> <dG/dx0> <dG/dy0>
 *   cvodes_<method>_steps <forward steps> <forward rhs evals> <backward steps> <backward rhs evals>
 * Exit status 1 on a CVODES failure or an unreadable reference, 2 on bad arguments.
 *
 * Accuracy (measured with SUNDIALS 6.4.1): at rtol = atol = 1e-8 the adjoint gradient is good
 * to about 4e-6 relative (Adams; BDF 3e-5), not 1e-6; the state to 8e-7 (Adams). Adams reaches
 * 1e-6 on the gradient at 1e-10 (6e-7 with Hermite, 9e-9 with polynomial interpolation).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cvodes/cvodes.h>
#include <nvector/nvector_serial.h>
#include <sundials/sundials_config.h>
#include <sundials/sundials_context.h>
#include <sunlinsol/sunlinsol_dense.h>
#include <sunmatrix/sunmatrix_dense.h>
#include <sunnonlinsol/sunnonlinsol_fixedpoint.h>

enum { NP = 4 }; /* a, b, c, d */

static const double T0 = 0.0, T1 = 10.0;
static const double PAR[NP] = {1.5, 1.0, 3.0, 1.0};
static const double X0 = 1.0, Y0 = 1.0;
static const char *NAMES[6] = {"a", "b", "c", "d", "x0", "y0"};

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ < 0) {                                                                             \
            fprintf(stderr, "cvodes_lv: %s failed (%d) at line %d\n", #call, rc_, __LINE__);       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* ---- the problem ---- */

static int rhs(sunrealtype t, N_Vector u, N_Vector du, void *data) {
    (void)t;
    const double *p = data;
    double x = NV_Ith_S(u, 0), y = NV_Ith_S(u, 1);
    NV_Ith_S(du, 0) = p[0] * x - p[1] * x * y;
    NV_Ith_S(du, 1) = -p[2] * y + p[3] * x * y;
    return 0;
}

static int jac(sunrealtype t, N_Vector u, N_Vector fu, SUNMatrix J, void *data, N_Vector t1,
               N_Vector t2, N_Vector t3) {
    (void)t, (void)fu, (void)t1, (void)t2, (void)t3;
    const double *p = data;
    double x = NV_Ith_S(u, 0), y = NV_Ith_S(u, 1);
    SM_ELEMENT_D(J, 0, 0) = p[0] - p[1] * y;
    SM_ELEMENT_D(J, 0, 1) = -p[1] * x;
    SM_ELEMENT_D(J, 1, 0) = p[3] * y;
    SM_ELEMENT_D(J, 1, 1) = -p[2] + p[3] * x;
    return 0;
}

/* Adjoint: lambda' = -J^T lambda. */
static int rhs_b(sunrealtype t, N_Vector u, N_Vector l, N_Vector dl, void *data) {
    (void)t;
    const double *p = data;
    double x = NV_Ith_S(u, 0), y = NV_Ith_S(u, 1);
    double l0 = NV_Ith_S(l, 0), l1 = NV_Ith_S(l, 1);
    NV_Ith_S(dl, 0) = -((p[0] - p[1] * y) * l0 + p[3] * y * l1);
    NV_Ith_S(dl, 1) = -(-p[1] * x * l0 + (-p[2] + p[3] * x) * l1);
    return 0;
}

static int jac_b(sunrealtype t, N_Vector u, N_Vector l, N_Vector fl, SUNMatrix JB, void *data,
                 N_Vector t1, N_Vector t2, N_Vector t3) {
    (void)t, (void)l, (void)fl, (void)t1, (void)t2, (void)t3;
    const double *p = data;
    double x = NV_Ith_S(u, 0), y = NV_Ith_S(u, 1);
    /* -J^T */
    SM_ELEMENT_D(JB, 0, 0) = -(p[0] - p[1] * y);
    SM_ELEMENT_D(JB, 0, 1) = -(p[3] * y);
    SM_ELEMENT_D(JB, 1, 0) = -(-p[1] * x);
    SM_ELEMENT_D(JB, 1, 1) = -(-p[2] + p[3] * x);
    return 0;
}

/* Parameter quadrature: q' = -lambda^T df/dp, so that q(t0) = int_t0^T lambda^T df/dp dt when
 * integrated backwards from q(T) = 0. df/dp = [[x, -x y, 0, 0], [0, 0, -y, x y]]. */
static int quad_b(sunrealtype t, N_Vector u, N_Vector l, N_Vector dq, void *data) {
    (void)t, (void)data;
    double x = NV_Ith_S(u, 0), y = NV_Ith_S(u, 1);
    double l0 = NV_Ith_S(l, 0), l1 = NV_Ith_S(l, 1);
    NV_Ith_S(dq, 0) = -(l0 * x);
    NV_Ith_S(dq, 1) = -(-l0 * x * y);
    NV_Ith_S(dq, 2) = -(-l1 * y);
    NV_Ith_S(dq, 3) = -(l1 * x * y);
    return 0;
}

/* ---- the solvers ---- */

typedef struct lv_solver {
    int lmm; /* CV_ADAMS or CV_BDF */
    double rtol, atol;
    double par[NP];
    SUNContext ctx;
    /* forward only */
    void *mem;
    N_Vector y;
    SUNNonlinearSolver nls;
    SUNMatrix A;
    SUNLinearSolver ls;
    /* forward + adjoint */
    void *amem;
    N_Vector ya, yB, qB;
    SUNNonlinearSolver nlsa, nlsB;
    SUNMatrix Aa, AB;
    SUNLinearSolver lsa, lsB;
    int which;
    int backward_ready;
} lv_solver;

static void set_y0(N_Vector y) {
    NV_Ith_S(y, 0) = X0;
    NV_Ith_S(y, 1) = Y0;
}

/* Fixed-point (Adams) or Newton with the dense solver and the analytic Jacobian (BDF). */
static void attach_iteration(lv_solver *s, void *mem, N_Vector y, SUNNonlinearSolver *nls,
                             SUNMatrix *A, SUNLinearSolver *ls) {
    if (s->lmm == CV_ADAMS) {
        *nls = SUNNonlinSol_FixedPoint(y, 0, s->ctx);
        CHECK(CVodeSetNonlinearSolver(mem, *nls));
    } else {
        *A = SUNDenseMatrix(2, 2, s->ctx);
        *ls = SUNLinSol_Dense(y, *A, s->ctx);
        CHECK(CVodeSetLinearSolver(mem, *ls, *A));
        CHECK(CVodeSetJacFn(mem, jac));
    }
}

static void *make_forward(lv_solver *s, N_Vector y, SUNNonlinearSolver *nls, SUNMatrix *A,
                          SUNLinearSolver *ls) {
    void *mem = CVodeCreate(s->lmm, s->ctx);
    if (!mem) {
        fprintf(stderr, "cvodes_lv: CVodeCreate failed\n");
        exit(1);
    }
    set_y0(y);
    CHECK(CVodeInit(mem, rhs, T0, y));
    CHECK(CVodeSStolerances(mem, s->rtol, s->atol));
    CHECK(CVodeSetUserData(mem, s->par));
    CHECK(CVodeSetMaxNumSteps(mem, 1000000));
    attach_iteration(s, mem, y, nls, A, ls);
    return mem;
}

static int g_interp = CV_HERMITE;

static void solver_init(lv_solver *s, int lmm, double rtol, double atol) {
    memset(s, 0, sizeof *s);
    s->lmm = lmm;
    s->rtol = rtol;
    s->atol = atol;
    memcpy(s->par, PAR, sizeof PAR);
    CHECK(SUNContext_Create(NULL, &s->ctx));
    s->y = N_VNew_Serial(2, s->ctx);
    s->mem = make_forward(s, s->y, &s->nls, &s->A, &s->ls);
    s->ya = N_VNew_Serial(2, s->ctx);
    s->yB = N_VNew_Serial(2, s->ctx);
    s->qB = N_VNew_Serial(NP, s->ctx);
    s->amem = make_forward(s, s->ya, &s->nlsa, &s->Aa, &s->lsa);
    CHECK(CVodeAdjInit(s->amem, 100, g_interp));
    CHECK(CVodeCreateB(s->amem, lmm, &s->which));
}

static void solver_free(lv_solver *s) {
    CVodeFree(&s->mem);
    CVodeFree(&s->amem);
    SUNNonlinSolFree(s->nls);
    SUNNonlinSolFree(s->nlsa);
    SUNNonlinSolFree(s->nlsB);
    SUNLinSolFree(s->ls);
    SUNLinSolFree(s->lsa);
    SUNLinSolFree(s->lsB);
    SUNMatDestroy(s->A);
    SUNMatDestroy(s->Aa);
    SUNMatDestroy(s->AB);
    N_VDestroy(s->y);
    N_VDestroy(s->ya);
    N_VDestroy(s->yB);
    N_VDestroy(s->qB);
    SUNContext_Free(&s->ctx);
}

/* The state at T1. */
static void solve(lv_solver *s, double out[2]) {
    double t;
    set_y0(s->y);
    CHECK(CVodeReInit(s->mem, T0, s->y));
    CHECK(CVode(s->mem, T1, s->y, &t, CV_NORMAL));
    out[0] = NV_Ith_S(s->y, 0);
    out[1] = NV_Ith_S(s->y, 1);
}

/* The state at T1 and dG/d(a, b, c, d, x0, y0). */
static void grad(lv_solver *s, double state[2], double g[6]) {
    double t;
    int ncheck;
    set_y0(s->ya);
    CHECK(CVodeReInit(s->amem, T0, s->ya));
    CHECK(CVodeAdjReInit(s->amem));
    CHECK(CVodeF(s->amem, T1, s->ya, &t, CV_NORMAL, &ncheck));
    state[0] = NV_Ith_S(s->ya, 0);
    state[1] = NV_Ith_S(s->ya, 1);
    NV_Ith_S(s->yB, 0) = 1.0; /* dG/dy(T1) */
    NV_Ith_S(s->yB, 1) = 1.0;
    N_VConst(0.0, s->qB);
    if (!s->backward_ready) { /* CVodeInitB needs the forward interval: after the first CVodeF */
        CHECK(CVodeInitB(s->amem, s->which, rhs_b, T1, s->yB));
        CHECK(CVodeSStolerancesB(s->amem, s->which, s->rtol, s->atol));
        CHECK(CVodeSetUserDataB(s->amem, s->which, s->par));
        CHECK(CVodeSetMaxNumStepsB(s->amem, s->which, 1000000));
        if (s->lmm == CV_ADAMS) {
            s->nlsB = SUNNonlinSol_FixedPoint(s->yB, 0, s->ctx);
            CHECK(CVodeSetNonlinearSolverB(s->amem, s->which, s->nlsB));
        } else {
            s->AB = SUNDenseMatrix(2, 2, s->ctx);
            s->lsB = SUNLinSol_Dense(s->yB, s->AB, s->ctx);
            CHECK(CVodeSetLinearSolverB(s->amem, s->which, s->lsB, s->AB));
            CHECK(CVodeSetJacFnB(s->amem, s->which, jac_b));
        }
        CHECK(CVodeQuadInitB(s->amem, s->which, quad_b, s->qB));
        CHECK(CVodeQuadSStolerancesB(s->amem, s->which, s->rtol, s->atol));
        CHECK(CVodeSetQuadErrConB(s->amem, s->which, SUNTRUE));
        s->backward_ready = 1;
    } else {
        CHECK(CVodeReInitB(s->amem, s->which, T1, s->yB));
        CHECK(CVodeQuadReInitB(s->amem, s->which, s->qB));
    }
    CHECK(CVodeB(s->amem, T0, CV_NORMAL));
    CHECK(CVodeGetB(s->amem, s->which, &t, s->yB));
    CHECK(CVodeGetQuadB(s->amem, s->which, &t, s->qB));
    for (int i = 0; i < NP; i++)
        g[i] = NV_Ith_S(s->qB, i);
    g[4] = NV_Ith_S(s->yB, 0);
    g[5] = NV_Ith_S(s->yB, 1);
}

/* ---- reference, timing ---- */

static int read_reference(const char *path, double state[2], double g[6]) {
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[512];
    int have_state = 0, have = 0;
    while (fgets(line, sizeof line, f)) {
        char name[32];
        double t, u, v;
        if (line[0] == '#')
            continue;
        /* The first state line is t = 10, the solve's end point. */
        if (!have_state && sscanf(line, "state %lf %lf %lf", &t, &u, &v) == 3 && t == T1) {
            state[0] = u;
            state[1] = v;
            have_state = 1;
        } else if (sscanf(line, "grad %31s %lf", name, &u) == 2) {
            for (int i = 0; i < 6; i++)
                if (!strcmp(name, NAMES[i])) {
                    g[i] = u;
                    have |= 1 << i;
                }
        }
    }
    fclose(f);
    return have_state && have == 63;
}

static double max_rel(const double *u, const double *ref, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs(u[i] - ref[i]) / fabs(ref[i]);
        if (e > m)
            m = e;
    }
    return m;
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct timing {
    double median, min;
} timing;

static timing time_calls(lv_solver *s, int do_grad, int repeats, int inner) {
    double *samples = malloc(sizeof(double) * (size_t)repeats);
    double st[2], g[6];
    for (int r = 0; r < repeats; r++) {
        double t0 = now_us();
        for (int k = 0; k < inner; k++) {
            if (do_grad)
                grad(s, st, g);
            else
                solve(s, st);
        }
        samples[r] = (now_us() - t0) / inner;
    }
    qsort(samples, (size_t)repeats, sizeof(double), cmp_double);
    timing t = {samples[repeats / 2], samples[0]};
    if (repeats % 2 == 0)
        t.median = 0.5 * (samples[repeats / 2 - 1] + samples[repeats / 2]);
    free(samples);
    return t;
}

static void run(const char *name, int lmm, double rtol, double atol, int repeats, int inner,
                const double ref_state[2], const double ref_grad[6]) {
    lv_solver s;
    solver_init(&s, lmm, rtol, atol);
    double st[2], gst[2], g[6];
    solve(&s, st);
    long nst, nfe, nstB = 0, nfeB = 0;
    CHECK(CVodeGetNumSteps(s.mem, &nst));
    CHECK(CVodeGetNumRhsEvals(s.mem, &nfe));
    grad(&s, gst, g);
    void *memB = CVodeGetAdjCVodeBmem(s.amem, s.which);
    CHECK(CVodeGetNumSteps(memB, &nstB));
    CHECK(CVodeGetNumRhsEvals(memB, &nfeB));
    timing ts = time_calls(&s, 0, repeats, inner);
    timing tg = time_calls(&s, 1, repeats, inner);
    printf("row cvodes_%s_solve %.3f %.3g\n", name, ts.median, max_rel(st, ref_state, 2));
    printf("row cvodes_%s_grad %.3f %.3g\n", name, tg.median, max_rel(g, ref_grad, 6));
    printf("cvodes_%s_solve_min_us %.3f\n", name, ts.min);
    printf("cvodes_%s_grad_min_us %.3f\n", name, tg.min);
    printf("cvodes_%s_state %.17g %.17g\n", name, st[0], st[1]);
    printf("cvodes_%s_gradient", name);
    for (int i = 0; i < 6; i++)
        printf(" %.17g", g[i]);
    printf("\n");
    printf("cvodes_%s_grad_state_err %.3g\n", name, max_rel(gst, ref_state, 2));
    printf("cvodes_%s_steps %ld %ld %ld %ld\n", name, nst, nfe, nstB, nfeB);
    fflush(stdout);
    solver_free(&s);
}

static void usage(void) {
    fprintf(stderr, "usage: cvodes_lv [--rtol R] [--atol A] [--repeats N] [--inner K] "
                    "[--method adams|bdf|both] [--ref PATH]\n");
    exit(2);
}

int main(int argc, char **argv) {
    double rtol = 1e-8, atol = 1e-8;
    int repeats = 31, inner = 20;
    const char *method = "both";
    const char *ref = "tests/ode/oracle/lotka_volterra.txt";
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            usage();
        if (!strcmp(argv[i], "--rtol"))
            rtol = atof(argv[++i]);
        else if (!strcmp(argv[i], "--atol"))
            atol = atof(argv[++i]);
        else if (!strcmp(argv[i], "--repeats"))
            repeats = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--inner"))
            inner = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--method"))
            method = argv[++i];
        else if (!strcmp(argv[i], "--interp")) {
            const char *v = argv[++i];
            if (!strcmp(v, "hermite"))
                g_interp = CV_HERMITE;
            else if (!strcmp(v, "polynomial"))
                g_interp = CV_POLYNOMIAL;
            else
                usage();
        } else if (!strcmp(argv[i], "--ref"))
            ref = argv[++i];
        else
            usage();
    }
    if (repeats < 1 || inner < 1 || !(rtol > 0) || !(atol > 0))
        usage();
    double ref_state[2], ref_grad[6];
    if (!read_reference(ref, ref_state, ref_grad)) {
        fprintf(stderr,
                "cvodes_lv: cannot read the reference %s (run from the repository "
                "root, or pass --ref)\n",
                ref);
        return 1;
    }
    printf("sundials_version %s\n", SUNDIALS_VERSION);
    printf("rtol %g\natol %g\nrepeats %d\ninner %d\ninterp %s\n", rtol, atol, repeats, inner,
           g_interp == CV_HERMITE ? "hermite" : "polynomial");
    int both = !strcmp(method, "both");
    if (both || !strcmp(method, "adams"))
        run("adams", CV_ADAMS, rtol, atol, repeats, inner, ref_state, ref_grad);
    if (both || !strcmp(method, "bdf"))
        run("bdf", CV_BDF, rtol, atol, repeats, inner, ref_state, ref_grad);
    if (!both && strcmp(method, "adams") && strcmp(method, "bdf"))
        usage();
    return 0;
}

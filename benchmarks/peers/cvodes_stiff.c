/*
 * cvodes_stiff.c -- peer numbers for nabla's stiff-ODE work-precision benchmark: SUNDIALS
 * CVODES (BDF, Newton iteration, dense linear solver, analytic Jacobian) on the stiff test set
 * of tests/ode/oracle/gen_stiff.py, end states against the references of
 * tests/ode/oracle/stiff_ref.txt, and for robertson and hires the gradient of
 * L = sum_i w_i y_i(t1) with respect to all parameters p by the adjoint method.
 *
 *   robertson  n = 3,  np = 3,  t1 = 1e5     (Robertson's chemical reaction)
 *   vdp        n = 2,  np = 1,  t1 = 3000    (Van der Pol, unscaled, mu = 1000)
 *   hires      n = 8,  np = 12, t1 = 321.8122 (IVPtestset HIRES)
 *   pollu      n = 20, np = 25, t1 = 60      (IVPtestset POLLU, 25 reactions)
 * The right-hand sides below are those of gen_stiff.py (same operations in the same order);
 * the Jacobians df/dy and df/dp are written out analytically. y0, p, t1, the reference end
 * state y1, the benchmark atol scale and (robertson, hires) the loss weights w and the
 * reference gradient are read from the reference file at run time.
 *
 * Build (Debian 12: apt-get install libsundials-dev, SUNDIALS 6.4.1), or use
 * benchmarks/peers/build_cvodes.sh:
 *   cc -std=c17 -O2 benchmarks/peers/cvodes_stiff.c -o cvodes_stiff -lsundials_cvodes \
 *      -lsundials_nvecserial -lsundials_sunmatrixdense -lsundials_sunlinsoldense \
 *      -lsundials_sunnonlinsolfixedpoint -lm
 *
 * Run from the repository root (the reference's default path is relative to it):
 *   cvodes_stiff [--repeats N] [--inner K] [--problems robertson,vdp,hires,pollu]
 *                [--rtols 1e-4,1e-6,1e-8] [--ref tests/ode/oracle/stiff_ref.txt] [--check]
 * Defaults: all four problems, rtol in {1e-4, 1e-6, 1e-8} (each a power of ten: the row key
 * is its exponent), atol = rtol * bench_atol_scale of the problem, N = 11 samples, each the
 * mean of K = 5 calls. When one call times N * K would exceed about 3 s (a slow case), K and
 * then N are lowered for that row and a "# ... reduced" comment line says so.
 * --check prints, instead of timing, "<problem> f0 <f(0, y0)>", "<problem> f1 <f(t1, y1)>",
 * "<problem> jac1 <df/dy at y1, row-major>" and "<problem> fp1 <df/dp at y1, row-major>"
 * (to compare the C problem definitions with gen_stiff.py's).
 *
 * Method: CV_BDF, maximum order 5, Newton iteration with SUNLinSol_Dense on a SUNDenseMatrix
 * and the analytic Jacobian, scalar tolerances, at most 1e6 steps, CV_NORMAL to t1. The
 * adjoint uses checkpoints every 100 steps with Hermite interpolation; the backward problem
 * lambda' = -J^T lambda, lambda(t1) = w, is solved by BDF with the dense solver and the
 * analytic backward Jacobian -J^T, with the forward tolerances; the quadrature
 * q' = -lambda^T df/dp, q(t1) = 0 (with the same tolerances, included in the error test)
 * gives dL/dp = q(0) (y0 does not depend on p).
 *
 * What is timed (the CVODES memory is created once per problem and rtol, outside the timing,
 * like a jitted function; every call starts from CVodeReInit):
 *   solve  CVodeReInit + CVode to t1 (no checkpointing)
 *   grad   CVodeReInit + CVodeAdjReInit + CVodeF to t1, then CVodeReInitB / CVodeQuadReInitB
 *          and CVodeB back to t = 0, CVodeGetB + CVodeGetQuadB.
 *
 * Errors:
 *   solve  sqrt(mean_i ((y_i - y1_i) / (|y1_i| + s))^2), s = bench_atol_scale (the norm of
 *          nabla's tests/ode/test_stiff.c)
 *   grad   max_i |g_i - grad_i| / max_i |grad_i|
 *
 * Output, one "key value..." per line (comment lines start with "# "):
 *   sundials_version 6.4.1
 *   row cvodes_bdf_<problem>_<e> <median_us> <error> <steps>           (rtol = 10^-e)
 *   row cvodes_bdf_grad_<problem>_<e> <median_us> <error> <forward steps>
 * Each row is followed by a comment line with the best sample, CVODES's work counters, the
 * max relative component error (solve) or the backward counters and the gradient (grad).
 * The forward steps of a grad row differ a little from the solve row's: CVodeF forces a
 * linear-solver setup (a new Newton matrix) at every checkpoint, which changes the step
 * sequence (SUNDIALS's cvodea.c, cv_forceSetup).
 * Exit status 1 on a CVODES failure or an unreadable reference, 2 on bad arguments.
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

enum { NMAX = 20, NPMAX = 25, MAXRTOLS = 16 };

static const double T0 = 0.0;
static const double BUDGET_US = 3e6; /* per row: above it, fewer calls are timed */

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ < 0) {                                                                             \
            fprintf(stderr, "cvodes_stiff: %s failed (%d) at line %d\n", #call, rc_, __LINE__);    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Element (i, j) of a column-major matrix with n rows (the SUNDenseMatrix layout). */
#define AT(M, n, i, j) ((M)[(size_t)(j) * (size_t)(n) + (size_t)(i)])

/* ---- the problems ----
 * f(y, p) -> dy; jac(y, p) -> J = df/dy (n x n); fp(y, p) -> F = df/dp (n x np). J and F
 * are column-major and zeroed by the caller; only the nonzero entries are written. */

typedef void (*f_fn)(const double *y, const double *p, double *dy);
typedef void (*mat_fn)(const double *y, const double *p, double *M);

static void robertson_f(const double *y, const double *k, double *dy) {
    double a = k[0] * y[0];
    double b = k[2] * y[1] * y[2];
    double c = k[1] * y[1] * y[1];
    dy[0] = -a + b;
    dy[1] = a - b - c;
    dy[2] = c;
}

static void robertson_jac(const double *y, const double *k, double *J) {
    AT(J, 3, 0, 0) = -k[0];
    AT(J, 3, 0, 1) = k[2] * y[2];
    AT(J, 3, 0, 2) = k[2] * y[1];
    AT(J, 3, 1, 0) = k[0];
    AT(J, 3, 1, 1) = -k[2] * y[2] - 2 * k[1] * y[1];
    AT(J, 3, 1, 2) = -k[2] * y[1];
    AT(J, 3, 2, 1) = 2 * k[1] * y[1];
}

static void robertson_fp(const double *y, const double *k, double *F) {
    (void)k;
    AT(F, 3, 0, 0) = -y[0];
    AT(F, 3, 1, 0) = y[0];
    AT(F, 3, 1, 1) = -y[1] * y[1];
    AT(F, 3, 2, 1) = y[1] * y[1];
    AT(F, 3, 0, 2) = y[1] * y[2];
    AT(F, 3, 1, 2) = -y[1] * y[2];
}

static void vdp_f(const double *y, const double *p, double *dy) {
    double mu = p[0];
    dy[0] = y[1];
    dy[1] = mu * ((1 - y[0] * y[0]) * y[1]) - y[0];
}

static void vdp_jac(const double *y, const double *p, double *J) {
    double mu = p[0];
    AT(J, 2, 0, 1) = 1;
    AT(J, 2, 1, 0) = -2 * mu * y[0] * y[1] - 1;
    AT(J, 2, 1, 1) = mu * (1 - y[0] * y[0]);
}

static void vdp_fp(const double *y, const double *p, double *F) {
    (void)p;
    AT(F, 2, 1, 0) = (1 - y[0] * y[0]) * y[1];
}

static void hires_f(const double *y, const double *p, double *dy) {
    double f7 = p[9] * y[5] * y[7] - p[11] * y[6];
    dy[0] = -p[0] * y[0] + p[1] * y[1] + p[2] * y[2] + p[3];
    dy[1] = p[0] * y[0] - p[4] * y[1];
    dy[2] = -p[5] * y[2] + p[1] * y[3] + p[6] * y[4];
    dy[3] = p[2] * y[1] + p[0] * y[2] - p[7] * y[3];
    dy[4] = -p[8] * y[4] + p[1] * (y[5] + y[6]);
    dy[5] = -p[9] * y[5] * y[7] + p[10] * y[3] + p[0] * y[4] - p[1] * y[5] + p[10] * y[6];
    dy[6] = f7;
    dy[7] = -f7;
}

static void hires_jac(const double *y, const double *p, double *J) {
    AT(J, 8, 0, 0) = -p[0];
    AT(J, 8, 0, 1) = p[1];
    AT(J, 8, 0, 2) = p[2];
    AT(J, 8, 1, 0) = p[0];
    AT(J, 8, 1, 1) = -p[4];
    AT(J, 8, 2, 2) = -p[5];
    AT(J, 8, 2, 3) = p[1];
    AT(J, 8, 2, 4) = p[6];
    AT(J, 8, 3, 1) = p[2];
    AT(J, 8, 3, 2) = p[0];
    AT(J, 8, 3, 3) = -p[7];
    AT(J, 8, 4, 4) = -p[8];
    AT(J, 8, 4, 5) = p[1];
    AT(J, 8, 4, 6) = p[1];
    AT(J, 8, 5, 3) = p[10];
    AT(J, 8, 5, 4) = p[0];
    AT(J, 8, 5, 5) = -p[9] * y[7] - p[1];
    AT(J, 8, 5, 6) = p[10];
    AT(J, 8, 5, 7) = -p[9] * y[5];
    AT(J, 8, 6, 5) = p[9] * y[7];
    AT(J, 8, 6, 6) = -p[11];
    AT(J, 8, 6, 7) = p[9] * y[5];
    AT(J, 8, 7, 5) = -p[9] * y[7];
    AT(J, 8, 7, 6) = p[11];
    AT(J, 8, 7, 7) = -p[9] * y[5];
}

static void hires_fp(const double *y, const double *p, double *F) {
    (void)p;
    double y68 = y[5] * y[7];
    AT(F, 8, 0, 0) = -y[0]; /* p1 */
    AT(F, 8, 1, 0) = y[0];
    AT(F, 8, 3, 0) = y[2];
    AT(F, 8, 5, 0) = y[4];
    AT(F, 8, 0, 1) = y[1]; /* p2 */
    AT(F, 8, 2, 1) = y[3];
    AT(F, 8, 4, 1) = y[5] + y[6];
    AT(F, 8, 5, 1) = -y[5];
    AT(F, 8, 0, 2) = y[2]; /* p3 */
    AT(F, 8, 3, 2) = y[1];
    AT(F, 8, 0, 3) = 1;     /* p4 */
    AT(F, 8, 1, 4) = -y[1]; /* p5 */
    AT(F, 8, 2, 5) = -y[2]; /* p6 */
    AT(F, 8, 2, 6) = y[4];  /* p7 */
    AT(F, 8, 3, 7) = -y[3]; /* p8 */
    AT(F, 8, 4, 8) = -y[4]; /* p9 */
    AT(F, 8, 5, 9) = -y68;  /* p10 */
    AT(F, 8, 6, 9) = y68;
    AT(F, 8, 7, 9) = -y68;
    AT(F, 8, 5, 10) = y[3] + y[6]; /* p11 */
    AT(F, 8, 6, 11) = -y[6];       /* p12 */
    AT(F, 8, 7, 11) = y[6];
}

/* POLLU: reaction j (0-based here) has rate r_j = k_j * y[a] (* y[b]), with the 1-based
 * species (a, b) below (b = 0: one reactant), multiplied left to right (k_j * y_a) * y_b. */
static const int POLLU_REACT[25][2] = {
    {1, 0},  {2, 4},  {5, 2},  {7, 0},  {7, 0}, {7, 6},  {9, 0}, {9, 6}, {11, 2},
    {11, 1}, {13, 0}, {10, 2}, {14, 0}, {1, 6}, {3, 0},  {4, 0}, {4, 0}, {16, 0},
    {16, 0}, {17, 6}, {19, 0}, {19, 0}, {1, 4}, {19, 1}, {20, 0}};
/* dy_i/dt as signed 1-based reaction numbers, summed left to right, 0-terminated. */
static const int POLLU_SUM[20][13] = {{-1, -10, -14, -23, -24, 2, 3, 9, 11, 12, 22, 25, 0},
                                      {-2, -3, -9, -12, 1, 21, 0},
                                      {-15, 1, 17, 19, 22, 0},
                                      {-2, -16, -17, -23, 15, 0},
                                      {-3, 4, 4, 6, 7, 13, 20, 0},
                                      {-6, -8, -14, -20, 3, 18, 18, 0},
                                      {-4, -5, -6, 13, 0},
                                      {4, 5, 6, 7, 0},
                                      {-7, -8, 0},
                                      {-12, 7, 9, 0},
                                      {-9, -10, 8, 11, 0},
                                      {9, 0},
                                      {-11, 10, 0},
                                      {-13, 12, 0},
                                      {14, 0},
                                      {-18, -19, 16, 0},
                                      {-20, 0},
                                      {20, 0},
                                      {-21, -22, -24, 23, 25, 0},
                                      {-25, 24, 0}};

static void pollu_f(const double *y, const double *k, double *dy) {
    double r[25];
    for (int j = 0; j < 25; j++) {
        double v = k[j] * y[POLLU_REACT[j][0] - 1];
        if (POLLU_REACT[j][1])
            v = v * y[POLLU_REACT[j][1] - 1];
        r[j] = v;
    }
    for (int i = 0; i < 20; i++) {
        const int *s = POLLU_SUM[i];
        double acc = s[0] > 0 ? r[s[0] - 1] : -r[-s[0] - 1];
        for (int m = 1; s[m]; m++)
            acc = s[m] > 0 ? acc + r[s[m] - 1] : acc - r[-s[m] - 1];
        dy[i] = acc;
    }
}

/* J(i, c) = sum over the terms +-r_j of dy_i/dt of +-dr_j/dy_c. */
static void pollu_jac(const double *y, const double *k, double *J) {
    for (int i = 0; i < 20; i++)
        for (const int *s = POLLU_SUM[i]; *s; s++) {
            int j = abs(*s) - 1;
            double sg = *s > 0 ? 1.0 : -1.0;
            int a = POLLU_REACT[j][0] - 1, b = POLLU_REACT[j][1] - 1;
            if (b < 0) {
                AT(J, 20, i, a) += sg * k[j];
            } else {
                AT(J, 20, i, a) += sg * k[j] * y[b];
                AT(J, 20, i, b) += sg * k[j] * y[a];
            }
        }
}

/* dr_j/dk_j = the product of reactant concentrations. */
static void pollu_fp(const double *y, const double *k, double *F) {
    (void)k;
    for (int i = 0; i < 20; i++)
        for (const int *s = POLLU_SUM[i]; *s; s++) {
            int j = abs(*s) - 1;
            int a = POLLU_REACT[j][0] - 1, b = POLLU_REACT[j][1] - 1;
            double m = b < 0 ? y[a] : y[a] * y[b];
            AT(F, 20, i, j) += *s > 0 ? m : -m;
        }
}

typedef struct problem_def {
    const char *name;
    int n, np;
    f_fn f;
    mat_fn jac, fp;
} problem_def;

static const problem_def DEFS[] = {
    {"robertson", 3, 3, robertson_f, robertson_jac, robertson_fp},
    {"vdp", 2, 1, vdp_f, vdp_jac, vdp_fp},
    {"hires", 8, 12, hires_f, hires_jac, hires_fp},
    {"pollu", 20, 25, pollu_f, pollu_jac, pollu_fp},
};
enum { NDEFS = sizeof DEFS / sizeof DEFS[0] };

/* A problem with its data from the reference file. */
typedef struct problem {
    const problem_def *def;
    int n, np;
    double t1, scale;
    double y0[NMAX], p[NPMAX], y1[NMAX];
    int have_grad; /* w and grad present: the gradient rows are run */
    double w[NMAX], grad[NPMAX];
} problem;

/* ---- CVODES callbacks ---- */

typedef struct udata {
    const problem *pb;
    double J[NMAX * NMAX];  /* scratch: df/dy */
    double F[NMAX * NPMAX]; /* scratch: df/dp */
} udata;

static int rhs(sunrealtype t, N_Vector y, N_Vector dy, void *data) {
    (void)t;
    const udata *u = data;
    u->pb->def->f(NV_DATA_S(y), u->pb->p, NV_DATA_S(dy));
    return 0;
}

static int jac(sunrealtype t, N_Vector y, N_Vector fy, SUNMatrix J, void *data, N_Vector t1,
               N_Vector t2, N_Vector t3) {
    (void)t, (void)fy, (void)t1, (void)t2, (void)t3;
    const udata *u = data;
    int n = u->pb->n;
    memset(SM_DATA_D(J), 0, sizeof(double) * (size_t)n * (size_t)n);
    u->pb->def->jac(NV_DATA_S(y), u->pb->p, SM_DATA_D(J));
    return 0;
}

/* Adjoint: lambda' = -J^T lambda. */
static int rhs_b(sunrealtype t, N_Vector y, N_Vector l, N_Vector dl, void *data) {
    (void)t;
    udata *u = data;
    int n = u->pb->n;
    const double *lv = NV_DATA_S(l);
    double *d = NV_DATA_S(dl);
    memset(u->J, 0, sizeof(double) * (size_t)n * (size_t)n);
    u->pb->def->jac(NV_DATA_S(y), u->pb->p, u->J);
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int k = 0; k < n; k++)
            s += AT(u->J, n, k, i) * lv[k];
        d[i] = -s;
    }
    return 0;
}

/* The backward Jacobian d(lambda')/d(lambda) = -J^T. */
static int jac_b(sunrealtype t, N_Vector y, N_Vector l, N_Vector fl, SUNMatrix JB, void *data,
                 N_Vector t1, N_Vector t2, N_Vector t3) {
    (void)t, (void)l, (void)fl, (void)t1, (void)t2, (void)t3;
    udata *u = data;
    int n = u->pb->n;
    double *B = SM_DATA_D(JB);
    memset(u->J, 0, sizeof(double) * (size_t)n * (size_t)n);
    u->pb->def->jac(NV_DATA_S(y), u->pb->p, u->J);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < n; k++)
            AT(B, n, i, k) = -AT(u->J, n, k, i);
    return 0;
}

/* Parameter quadrature: q' = -lambda^T df/dp, so that q(0) = int_0^t1 lambda^T df/dp dt when
 * integrated backwards from q(t1) = 0. */
static int quad_b(sunrealtype t, N_Vector y, N_Vector l, N_Vector dq, void *data) {
    (void)t;
    udata *u = data;
    int n = u->pb->n, np = u->pb->np;
    const double *lv = NV_DATA_S(l);
    double *d = NV_DATA_S(dq);
    memset(u->F, 0, sizeof(double) * (size_t)n * (size_t)np);
    u->pb->def->fp(NV_DATA_S(y), u->pb->p, u->F);
    for (int j = 0; j < np; j++) {
        double s = 0;
        for (int i = 0; i < n; i++)
            s += lv[i] * AT(u->F, n, i, j);
        d[j] = -s;
    }
    return 0;
}

/* ---- the solver ---- */

typedef struct stiff_solver {
    const problem *pb;
    double rtol, atol;
    SUNContext ctx;
    udata ud;
    /* forward only */
    void *mem;
    N_Vector y;
    SUNMatrix A;
    SUNLinearSolver ls;
    /* forward + adjoint (only when pb->have_grad) */
    void *amem;
    N_Vector ya, yB, qB;
    SUNMatrix Aa, AB;
    SUNLinearSolver lsa, lsB;
    int which;
    int backward_ready;
} stiff_solver;

static void set_y0(const problem *pb, N_Vector y) {
    memcpy(NV_DATA_S(y), pb->y0, sizeof(double) * (size_t)pb->n);
}

/* BDF, Newton with the dense solver and the analytic Jacobian. */
static void *make_forward(stiff_solver *s, N_Vector y, SUNMatrix *A, SUNLinearSolver *ls) {
    int n = s->pb->n;
    void *mem = CVodeCreate(CV_BDF, s->ctx);
    if (!mem) {
        fprintf(stderr, "cvodes_stiff: CVodeCreate failed\n");
        exit(1);
    }
    set_y0(s->pb, y);
    CHECK(CVodeInit(mem, rhs, T0, y));
    CHECK(CVodeSStolerances(mem, s->rtol, s->atol));
    CHECK(CVodeSetUserData(mem, &s->ud));
    CHECK(CVodeSetMaxNumSteps(mem, 1000000));
    CHECK(CVodeSetMaxOrd(mem, 5));
    *A = SUNDenseMatrix(n, n, s->ctx);
    *ls = SUNLinSol_Dense(y, *A, s->ctx);
    if (!*A || !*ls) {
        fprintf(stderr, "cvodes_stiff: cannot create the dense linear solver\n");
        exit(1);
    }
    CHECK(CVodeSetLinearSolver(mem, *ls, *A));
    CHECK(CVodeSetJacFn(mem, jac));
    return mem;
}

static void solver_init(stiff_solver *s, const problem *pb, double rtol, double atol) {
    memset(s, 0, sizeof *s);
    s->pb = pb;
    s->rtol = rtol;
    s->atol = atol;
    s->ud.pb = pb;
    CHECK(SUNContext_Create(NULL, &s->ctx));
    s->y = N_VNew_Serial(pb->n, s->ctx);
    s->mem = make_forward(s, s->y, &s->A, &s->ls);
    if (pb->have_grad) {
        s->ya = N_VNew_Serial(pb->n, s->ctx);
        s->yB = N_VNew_Serial(pb->n, s->ctx);
        s->qB = N_VNew_Serial(pb->np, s->ctx);
        s->amem = make_forward(s, s->ya, &s->Aa, &s->lsa);
        CHECK(CVodeAdjInit(s->amem, 100, CV_HERMITE));
        CHECK(CVodeCreateB(s->amem, CV_BDF, &s->which));
    }
}

static void solver_free(stiff_solver *s) {
    CVodeFree(&s->mem);
    CVodeFree(&s->amem);
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

/* The state at t1. */
static void solve(stiff_solver *s, double *out) {
    double t;
    set_y0(s->pb, s->y);
    CHECK(CVodeReInit(s->mem, T0, s->y));
    CHECK(CVode(s->mem, s->pb->t1, s->y, &t, CV_NORMAL));
    memcpy(out, NV_DATA_S(s->y), sizeof(double) * (size_t)s->pb->n);
}

/* The state at t1 and dL/dp, L = sum_i w_i y_i(t1); the forward steps into *fwd_steps unless
 * it is NULL (they must be read before CVodeB, whose recomputation of the forward solution
 * between checkpoints restarts the forward counters). */
static void grad(stiff_solver *s, double *state, double *g, long *fwd_steps) {
    const problem *pb = s->pb;
    double t;
    int ncheck;
    set_y0(pb, s->ya);
    CHECK(CVodeReInit(s->amem, T0, s->ya));
    CHECK(CVodeAdjReInit(s->amem));
    CHECK(CVodeF(s->amem, pb->t1, s->ya, &t, CV_NORMAL, &ncheck));
    if (fwd_steps)
        CHECK(CVodeGetNumSteps(s->amem, fwd_steps));
    memcpy(state, NV_DATA_S(s->ya), sizeof(double) * (size_t)pb->n);
    memcpy(NV_DATA_S(s->yB), pb->w, sizeof(double) * (size_t)pb->n); /* dL/dy(t1) */
    N_VConst(0.0, s->qB);
    if (!s->backward_ready) { /* CVodeInitB needs the forward interval: after the first CVodeF */
        CHECK(CVodeInitB(s->amem, s->which, rhs_b, pb->t1, s->yB));
        CHECK(CVodeSStolerancesB(s->amem, s->which, s->rtol, s->atol));
        CHECK(CVodeSetUserDataB(s->amem, s->which, &s->ud));
        CHECK(CVodeSetMaxNumStepsB(s->amem, s->which, 1000000));
        CHECK(CVodeSetMaxOrdB(s->amem, s->which, 5));
        s->AB = SUNDenseMatrix(pb->n, pb->n, s->ctx);
        s->lsB = SUNLinSol_Dense(s->yB, s->AB, s->ctx);
        if (!s->AB || !s->lsB) {
            fprintf(stderr, "cvodes_stiff: cannot create the backward dense linear solver\n");
            exit(1);
        }
        CHECK(CVodeSetLinearSolverB(s->amem, s->which, s->lsB, s->AB));
        CHECK(CVodeSetJacFnB(s->amem, s->which, jac_b));
        CHECK(CVodeQuadInitB(s->amem, s->which, quad_b, s->qB));
        CHECK(CVodeQuadSStolerancesB(s->amem, s->which, s->rtol, s->atol));
        CHECK(CVodeSetQuadErrConB(s->amem, s->which, SUNTRUE));
        s->backward_ready = 1;
    } else {
        CHECK(CVodeReInitB(s->amem, s->which, pb->t1, s->yB));
        CHECK(CVodeQuadReInitB(s->amem, s->which, s->qB));
    }
    CHECK(CVodeB(s->amem, T0, CV_NORMAL));
    CHECK(CVodeGetB(s->amem, s->which, &t, s->yB));
    CHECK(CVodeGetQuadB(s->amem, s->which, &t, s->qB));
    memcpy(g, NV_DATA_S(s->qB), sizeof(double) * (size_t)pb->np);
}

/* ---- reference ---- */

/* Reads "<name> <key> <numbers...>" into out (at most cap numbers); returns how many, or -1
 * when there is no such line. The first matching line counts. */
static int read_record(FILE *f, const char *name, const char *key, double *out, int cap) {
    char *line = NULL;
    size_t len = 0;
    int count = -1;
    size_t nl = strlen(name), kl = strlen(key);
    rewind(f);
    while (getline(&line, &len, f) != -1) {
        if (line[0] == '#' || strncmp(line, name, nl) || line[nl] != ' ' ||
            strncmp(line + nl + 1, key, kl) ||
            (line[nl + 1 + kl] != ' ' && line[nl + 1 + kl] != '\n'))
            continue;
        char *c = line + nl + 1 + kl, *end;
        count = 0;
        for (;;) {
            double v = strtod(c, &end);
            if (end == c)
                break;
            if (count < cap)
                out[count] = v;
            count++;
            c = end;
        }
        break;
    }
    free(line);
    return count;
}

/* 1 when every record the runs need is there with the right length. */
static int load_problem(FILE *f, const problem_def *def, problem *pb) {
    memset(pb, 0, sizeof *pb);
    pb->def = def;
    pb->n = def->n;
    pb->np = def->np;
    if (read_record(f, def->name, "t1", &pb->t1, 1) != 1 ||
        read_record(f, def->name, "bench_atol_scale", &pb->scale, 1) != 1 ||
        read_record(f, def->name, "y0", pb->y0, NMAX) != pb->n ||
        read_record(f, def->name, "p", pb->p, NPMAX) != pb->np ||
        read_record(f, def->name, "y1", pb->y1, NMAX) != pb->n)
        return 0;
    int nw = read_record(f, def->name, "w", pb->w, NMAX);
    int ng = read_record(f, def->name, "grad", pb->grad, NPMAX);
    if (nw < 0 && ng < 0)
        return 1;
    if (nw != pb->n || ng != pb->np)
        return 0;
    pb->have_grad = 1;
    return 1;
}

static double solve_error(const problem *pb, const double *y, double *maxrel) {
    double s = 0;
    *maxrel = 0;
    for (int i = 0; i < pb->n; i++) {
        double e = (y[i] - pb->y1[i]) / (fabs(pb->y1[i]) + pb->scale);
        s += e * e;
        double r = fabs(y[i] - pb->y1[i]) / fabs(pb->y1[i]);
        if (r > *maxrel)
            *maxrel = r;
    }
    return sqrt(s / pb->n);
}

static double grad_error(const problem *pb, const double *g) {
    double num = 0, den = 0;
    for (int i = 0; i < pb->np; i++) {
        num = fmax(num, fabs(g[i] - pb->grad[i]));
        den = fmax(den, fabs(pb->grad[i]));
    }
    return num / den;
}

/* ---- timing ---- */

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

static timing time_calls(stiff_solver *s, int do_grad, int repeats, int inner) {
    double *samples = malloc(sizeof(double) * (size_t)repeats);
    double st[NMAX], g[NPMAX];
    if (!samples) {
        fprintf(stderr, "cvodes_stiff: out of memory\n");
        exit(1);
    }
    for (int r = 0; r < repeats; r++) {
        double t0 = now_us();
        for (int k = 0; k < inner; k++) {
            if (do_grad)
                grad(s, st, g, NULL);
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

/* Lowers inner, then repeats (to no fewer than 3), when repeats * inner calls of call_us each
 * would exceed the budget. Says so in a comment line. */
static void fit_budget(const char *key, double call_us, int *repeats, int *inner) {
    int r = *repeats, k = *inner;
    while (k > 1 && call_us * r * k > BUDGET_US)
        k--;
    while (r > 3 && call_us * r * k > BUDGET_US)
        r--;
    if (r != *repeats || k != *inner) {
        printf("# %s reduced: repeats %d inner %d (one call about %.0f us; asked %d x %d)\n", key,
               r, k, call_us, *repeats, *inner);
        *repeats = r;
        *inner = k;
    }
}

/* ---- runs ---- */

static void run(const problem *pb, double rtol, int repeats, int inner) {
    int e = (int)lround(-log10(rtol));
    double atol = rtol * pb->scale;
    char key[96];
    stiff_solver s;
    solver_init(&s, pb, rtol, atol);
    printf("# %s rtol %g atol %g n %d np %d t1 %.17g\n", pb->def->name, rtol, atol, pb->n, pb->np,
           pb->t1);

    /* solve: one untimed call (its result and counters are the reported ones) */
    double y[NMAX], maxrel;
    double c0 = now_us();
    solve(&s, y);
    double call_us = now_us() - c0;
    long nst, nfe, nje, nsetups, netf, ncfn;
    CHECK(CVodeGetNumSteps(s.mem, &nst));
    CHECK(CVodeGetNumRhsEvals(s.mem, &nfe));
    CHECK(CVodeGetNumJacEvals(s.mem, &nje));
    CHECK(CVodeGetNumLinSolvSetups(s.mem, &nsetups));
    CHECK(CVodeGetNumErrTestFails(s.mem, &netf));
    CHECK(CVodeGetNumNonlinSolvConvFails(s.mem, &ncfn));
    double err = solve_error(pb, y, &maxrel);
    snprintf(key, sizeof key, "cvodes_bdf_%s_%d", pb->def->name, e);
    int r = repeats, k = inner;
    fit_budget(key, call_us, &r, &k);
    timing ts = time_calls(&s, 0, r, k);
    printf("row %s %.3f %.3g %ld\n", key, ts.median, err, nst);
    printf("# %s min_us %.3f rhs %ld jac %ld lsetups %ld err_test_fails %ld conv_fails %ld "
           "max_rel_err %.3g\n",
           key, ts.min, nfe, nje, nsetups, netf, ncfn, maxrel);
    fflush(stdout);

    if (pb->have_grad) {
        double ys[NMAX], g[NPMAX];
        c0 = now_us();
        long fst, bst, bfe, bje, bqe;
        grad(&s, ys, g, &fst);
        call_us = now_us() - c0;
        void *memB = CVodeGetAdjCVodeBmem(s.amem, s.which);
        CHECK(CVodeGetNumSteps(memB, &bst));
        CHECK(CVodeGetNumRhsEvals(memB, &bfe));
        CHECK(CVodeGetNumJacEvals(memB, &bje));
        CHECK(CVodeGetQuadNumRhsEvals(memB, &bqe));
        double gerr = grad_error(pb, g);
        double serr = solve_error(pb, ys, &maxrel);
        snprintf(key, sizeof key, "cvodes_bdf_grad_%s_%d", pb->def->name, e);
        r = repeats, k = inner;
        fit_budget(key, call_us, &r, &k);
        timing tg = time_calls(&s, 1, r, k);
        printf("row %s %.3f %.3g %ld\n", key, tg.median, gerr, fst);
        printf("# %s min_us %.3f backward_steps %ld backward_rhs %ld backward_jac %ld "
               "quad_rhs %ld state_err %.3g\n",
               key, tg.min, bst, bfe, bje, bqe, serr);
        printf("# %s gradient", key);
        for (int i = 0; i < pb->np; i++)
            printf(" %.17g", g[i]);
        printf("\n");
        fflush(stdout);
    }
    solver_free(&s);
}

/* --check: the problem functions at y0 and y1, to compare with gen_stiff.py. */
static void print_vec(const char *name, const char *key, const double *v, int n) {
    printf("%s %s", name, key);
    for (int i = 0; i < n; i++)
        printf(" %.17g", v[i]);
    printf("\n");
}

static void check_problem(const problem *pb) {
    int n = pb->n, np = pb->np;
    double dy[NMAX], J[NMAX * NMAX] = {0}, F[NMAX * NPMAX] = {0}, row[NMAX * NPMAX];
    pb->def->f(pb->y0, pb->p, dy);
    print_vec(pb->def->name, "f0", dy, n);
    pb->def->f(pb->y1, pb->p, dy);
    print_vec(pb->def->name, "f1", dy, n);
    pb->def->jac(pb->y1, pb->p, J);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            row[i * n + j] = AT(J, n, i, j);
    print_vec(pb->def->name, "jac1", row, n * n);
    pb->def->fp(pb->y1, pb->p, F);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < np; j++)
            row[i * np + j] = AT(F, n, i, j);
    print_vec(pb->def->name, "fp1", row, n * np);
}

static void usage(void) {
    fprintf(stderr, "usage: cvodes_stiff [--repeats N] [--inner K] "
                    "[--problems robertson,vdp,hires,pollu] [--rtols 1e-4,1e-6,1e-8] "
                    "[--ref PATH] [--check]\n");
    exit(2);
}

/* A positive integer option value, or usage(). */
static int parse_count(const char *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < 1 || v > 1000000)
        usage();
    return (int)v;
}

int main(int argc, char **argv) {
    int repeats = 11, inner = 5, check = 0;
    const char *ref = "tests/ode/oracle/stiff_ref.txt";
    const char *problems = "robertson,vdp,hires,pollu";
    const char *rtols_arg = "1e-4,1e-6,1e-8";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check")) {
            check = 1;
            continue;
        }
        if (i + 1 >= argc)
            usage();
        if (!strcmp(argv[i], "--repeats"))
            repeats = parse_count(argv[++i]);
        else if (!strcmp(argv[i], "--inner"))
            inner = parse_count(argv[++i]);
        else if (!strcmp(argv[i], "--problems"))
            problems = argv[++i];
        else if (!strcmp(argv[i], "--rtols"))
            rtols_arg = argv[++i];
        else if (!strcmp(argv[i], "--ref"))
            ref = argv[++i];
        else
            usage();
    }

    /* the rtols: powers of ten */
    double rtols[MAXRTOLS];
    int nrtol = 0;
    for (const char *c = rtols_arg;;) {
        char *end;
        double v = strtod(c, &end);
        if (end == c || !(v > 0) || v >= 1 || nrtol == MAXRTOLS ||
            fabs(-log10(v) - lround(-log10(v))) > 1e-9 || (*end && *end != ','))
            usage();
        rtols[nrtol++] = v;
        if (!*end)
            break;
        c = end + 1;
    }

    /* the problems, in the order given */
    const problem_def *sel[NDEFS * 4];
    int nsel = 0;
    for (const char *c = problems;;) {
        size_t len = strcspn(c, ",");
        int found = -1;
        for (int d = 0; d < NDEFS; d++)
            if (strlen(DEFS[d].name) == len && !strncmp(DEFS[d].name, c, len))
                found = d;
        if (found < 0 || nsel == (int)(sizeof sel / sizeof sel[0]))
            usage();
        sel[nsel++] = &DEFS[found];
        if (!c[len])
            break;
        c += len + 1;
    }

    static problem pbs[NDEFS * 4];
    FILE *f = fopen(ref, "r");
    if (!f) {
        fprintf(stderr,
                "cvodes_stiff: cannot read the reference %s (run from the repository root, or "
                "pass --ref)\n",
                ref);
        return 1;
    }
    for (int i = 0; i < nsel; i++)
        if (!load_problem(f, sel[i], &pbs[i])) {
            fprintf(stderr, "cvodes_stiff: the reference %s lacks (complete) records for %s\n", ref,
                    sel[i]->name);
            fclose(f);
            return 1;
        }
    fclose(f);

    if (check) {
        for (int i = 0; i < nsel; i++)
            check_problem(&pbs[i]);
        return 0;
    }

    printf("sundials_version %s\n", SUNDIALS_VERSION);
    printf("# repeats %d inner %d ref %s; CV_BDF max order 5, Newton + dense LU, analytic "
           "Jacobian; adjoint: Hermite, checkpoints every 100 steps\n",
           repeats, inner, ref);
    fflush(stdout);
    for (int i = 0; i < nsel; i++)
        for (int j = 0; j < nrtol; j++)
            run(&pbs[i], rtols[j], repeats, inner);
    return 0;
}

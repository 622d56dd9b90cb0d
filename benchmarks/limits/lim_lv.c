/*
 * lim_lv.c -- Lotka-Volterra with Tsitouras 5(4), hand-written: the solve and its gradient by
 * the discrete adjoint (limits.h). The "limit" of bench_native's LV rows, bench_vmap's LV
 * table and (with SaveAt ts) bench_suite's lotka_volterra_mb (lim_suite.c).
 *
 * The solve does what nb_diffeqsolve (src/ode/solve.c) does for this problem, operation for
 * operation, so that it takes the same steps and ends on the same bits:
 *   - the term f(y) = u y + v (x y) with u = (a, -c), v = (-b, d) (bench_ode's lv_term);
 *   - a stage i: Y_i = y + h (k_0 a_i0 + k_1 a_i1 + ...), summed left to right; y1 is the
 *     FSAL stage's input, f(y1) the next step's first stage; the error estimate
 *     h (k_0 e_0 + ... + k_6 e_6);
 *   - the error norm sqrt(sum((err / (atol + rtol max(|y|, |y1|)))^2) / 2), a non-finite
 *     norm taken as infinity; keep the step when the norm is < 1;
 *   - the I controller of nb_ode_pid: factor = 0.9 (1 / norm)^(1/5) (SLEEF's pow, as nabla's
 *     executor), within [1 (kept) or 0.2 (rejected), 10];
 *   - the next end time clipped to t1 within 1e-10 (after a rejected step: halfway there);
 *   - dt0 = 0: Hairer's initial step (solve.c's nbo_initial_step);
 *   - SaveAt ts: a kept step from t to tn writes every save time in (t, tn] from its dense
 *     output (Diffrax's _Tsit5Interpolation, solve.c's nbo_dense_eval): y + h sum_j b_j(theta)
 *     k_j, theta = (ts - t) / h, b_j(theta) = sum_q d_jq theta^(q+1), k_6 = f(y1).
 * The gradient of G with the cotangents ybar of y(t1) and ysbar of the saves: the step sizes
 * and decisions are constants (nabla's stop_gradient on the controller), so dG/dp is the
 * adjoint of the accepted steps' y_{n+1} = y_n + h sum_i b_i f(Y_i) and of the saves. The
 * forward pass stores each accepted step's h and its stage inputs Y_0 .. Y_5 (the FSAL stage
 * has b_6 = 0 and feeds only the error estimate and the dense output; its input y_{n+1} is the
 * next step's Y_0, or the final state), and each save's step and b_j(theta); the reverse pass
 * runs the steps backwards with lambda the cotangent of y_{n+1}: the step's saves give
 * D_j = h sum_s b_j(theta_s) ysbar_s, with k_6 = f(y_{n+1}) first,
 *   lambda += J(y_{n+1})^T D_6,   pbar += (df/dp)(y_{n+1})^T D_6;
 * then for i = 5 .. 0,
 *   kbar_i = h (b_i lambda + sum_{l > i} a_li w_l) + D_i,   w_i = J(Y_i)^T kbar_i,
 *   pbar += (df/dp)(Y_i)^T kbar_i;   then lambda += sum_i w_i + sum_s ysbar_s.
 * Nothing is recomputed: the limit of a checkpointed reverse sweep.
 */
#include "limits.h"

#include <math.h>
#include <string.h>

/* clang-format off */
const double lim_tsit5_c[7] = {
    0.0,
    161.0 / 1000.0,
    327.0 / 1000.0,
    9.0 / 10.0,
    0.9800255409045096857298102862870245954942137979563024768854764293221195950761080302604,
    1.0,
    1.0,
};
const double lim_tsit5_a[49] = {
    [1 * 7] = 161.0 / 1000.0,
    [2 * 7] = -0.8480655492356988544426874250230774675121177393430391537369234245294192976164141156943e-2,
              0.3354806554923569885444268742502307746751211773934303915373692342452941929761641411569,
    [3 * 7] = 2.897153057105493432130432594192938764924887287701866490314866693455023795137503079289,
              -6.359448489975074843148159912383825625952700647415626703305928850207288721235210244366,
              4.362295432869581411017727318190886861027813359713760212991062156752264926097707165077,
    [4 * 7] = 5.325864828439256604428877920840511317836476253097040101202360397727981648835607691791,
              -11.74888356406282787774717033978577296188744178259862899288666928009020615663593781589,
              7.495539342889836208304604784564358155658679161518186721010132816213648793440552049753,
              -0.9249506636175524925650207933207191611349983406029535244034750452930469056411389539635e-1,
    [5 * 7] = 5.861455442946420028659251486982647890394337666164814434818157239052507339770711679748,
              -12.92096931784710929170611868178335939541780751955743459166312250439928519268343184452,
              8.159367898576158643180400794539253485181918321135053305748355423955009222648673734986,
              -0.7158497328140099722453054252582973869127213147363544882721139659546372402303777878835e-1,
              -0.2826905039406838290900305721271224146717633626879770007617876201276764571291579142206e-1,
    [6 * 7] = 0.9646076681806522951816731316512876333711995238157997181903319145764851595234062815396e-1,
              1.0 / 100.0,
              0.4798896504144995747752495322905965199130404621990332488332634944254542060153074523509,
              1.379008574103741893192274821856872770756462643091360525934940067397245698027561293331,
              -3.290069515436080679901047585711363850115683290894936158531296799594813811049925401677,
              2.324710524099773982415355918398765796109060233222962411944060046314465391054716027841,
};
const double lim_tsit5_b[7] = {
    0.9646076681806522951816731316512876333711995238157997181903319145764851595234062815396e-1,
    1.0 / 100.0,
    0.4798896504144995747752495322905965199130404621990332488332634944254542060153074523509,
    1.379008574103741893192274821856872770756462643091360525934940067397245698027561293331,
    -3.290069515436080679901047585711363850115683290894936158531296799594813811049925401677,
    2.324710524099773982415355918398765796109060233222962411944060046314465391054716027841,
    0.0,
};
const double lim_tsit5_e[7] = {
    0.9646076681806522951816731316512876333711995238157997181903319145764851595234062815396e-1
        - 0.9468075576583945807478876255758922856117527357724631226139574065785592789071067303271e-1,
    1.0 / 100.0
        - 0.9183565540343253096776363936645313759813746240984095238905939532922955247253608687270e-2,
    0.4798896504144995747752495322905965199130404621990332488332634944254542060153074523509
        - 0.4877705284247615707855642599631228241516691959761363774365216240304071651579571959813,
    1.379008574103741893192274821856872770756462643091360525934940067397245698027561293331
        - 1.234297566930478985655109673884237654035539930748192848315425833500484878378061439761,
    -3.290069515436080679901047585711363850115683290894936158531296799594813811049925401677
        + 2.707712349983525454881109975059321670689605166938197378763992255714444407154902012702,
    2.324710524099773982415355918398765796109060233222962411944060046314465391054716027841
        - 1.866628418170587035753719399566211498666255505244122593996591602841258328965767580089,
    -1.0 / 66.0,
};
/* clang-format on */

/* Diffrax's _Tsit5Interpolation writes b_i(theta) as products, e.g.
 *   b_1 = -1.0530884977290216 t (t - 1.3299890189751412) (t^2 - 1.4364028541716351 t
 *         + 0.7139816917074209),
 *   b_7 = 2.5 (t - 1) (t - 0.6) t^2;
 * the coefficients of theta^1..theta^4 below are those products multiplied out exactly
 * (from Diffrax's decimals, in rational arithmetic), rounded to 21 digits. */
/* clang-format off */
const double lim_tsit5_dense[7 * 4] = {
    0.999999999999999974283, -2.76370619727482591134, 2.91325546182191274375, -1.0530884977290216,
    0.0, 0.13169999999999999727, -0.22339999999999999818, 0.1017,
    0.0, 3.93029623689475152851, -5.94103387213150473470, 2.490627285651252793,
    0.0, -12.4110771669336769837, 30.3381886302823215982, -16.54810288924490272,
    0.0, 37.5093134165110391950, -88.1789048947664011014, 47.37952196281928122,
    0.0, -27.8965262891972878059, 65.0918946747936715263, -34.87065786149660974,
    0.0, 1.5, -4.0, 2.5,
};
/* clang-format on */

#define A(i, j) lim_tsit5_a[(i)*7 + (j)]
#define B(i) lim_tsit5_b[i]
#define E(i) lim_tsit5_e[i]

enum { LIM_OK = 0, LIM_MAX_STEPS = 1, LIM_DT_UNDERFLOW = 2, LIM_NONFINITE = 3 };

/* nabla's maximum and minimum: NaN propagates */
static inline double lim_max(double x, double y) {
    return (x > y || x != x) ? x : y;
}
static inline double lim_min(double x, double y) {
    return (x < y || x != x) ? x : y;
}

/* f(y) = u y + v (x y): fx = a x + (-b) xy, fy = (-c) y + d xy */
typedef struct lv_par {
    double u0, u1, v0, v1; /* a, -c, -b, d */
} lv_par;

static inline void lv_f(const lv_par *q, double x, double y, double *fx, double *fy) {
    double xy = x * y;
    *fx = q->u0 * x + q->v0 * xy;
    *fy = q->u1 * y + q->v1 * xy;
}

/* Hairer's initial step (solve.c's nbo_initial_step, error order 5) */
static double lv_initial_step(const lv_par *q, const lim_lv_opts *o, double x0, double y0,
                              double fx0, double fy0) {
    double sx = o->atol + fabs(x0) * o->rtol, sy = o->atol + fabs(y0) * o->rtol;
    double a0 = x0 / sx, a1 = y0 / sy, b0 = fx0 / sx, b1 = fy0 / sy;
    double d0 = sqrt((a0 * a0 + a1 * a1) / 2.0), d1 = sqrt((b0 * b0 + b1 * b1) / 2.0);
    int small = d0 < 1e-5 || d1 < 1e-5;
    double d1s = small ? 1.0 : d1;
    double h0 = small ? 1e-6 : 0.01 * (d0 / d1s);
    double x1 = x0 + h0 * fx0, y1 = y0 + h0 * fy0, fx1, fy1;
    lv_f(q, x1, y1, &fx1, &fy1);
    double c0 = (fx1 - fx0) / sx, c1 = (fy1 - fy0) / sy;
    double d2 = sqrt((c0 * c0 + c1 * c1) / 2.0) / h0;
    double maxd = lim_max(d1, d2);
    double h1 =
        maxd <= 1e-15 ? lim_max(1e-6, h0 * 1e-3) : lim_vmath_get()->pow1(0.01 / maxd, 1.0 / 5.0);
    return lim_min(h0 * 100.0, h1);
}

/* What one step stores for the reverse pass: h, then Y_0 .. Y_5 as (x, y) pairs. */
enum { LV_REC = 13 };

/* What one save stores: its accepted step's index and b_0(theta) .. b_6(theta). */
typedef struct lv_save {
    double b[7];
    int64_t step;
} lv_save;

/* The work buffer: max_steps records, the final state, n_ts saves. */
typedef struct lv_work {
    double *rec, *yend;
    lv_save *save;
} lv_work;

static lv_work lv_work_of(const lim_lv_opts *o, void *work) {
    lv_work w;
    w.rec = work;
    w.yend = w.rec + (size_t)(o->max_steps > 0 ? o->max_steps : 1) * LV_REC;
    w.save = (lv_save *)(w.yend + 2);
    return w;
}

size_t lim_lv_work_bytes(const lim_lv_opts *o) {
    size_t steps = (size_t)(o->max_steps > 0 ? o->max_steps : 1);
    size_t saves = (size_t)(o->n_ts > 0 ? o->n_ts : 0);
    return (steps * LV_REC + 2) * sizeof(double) + saves * sizeof(lv_save);
}

/* b_j(theta) as nbo_dense_eval sums it: theta d_j0 + theta^2 d_j1 + ..., zero terms left out,
 * the powers by repeated multiplication */
static inline void lv_dense_b(double th, double b[7]) {
    for (int j = 0; j < 7; j++) {
        const double *d = lim_tsit5_dense + j * 4;
        double pw = th, bj = 0.0;
        int any = 0;
        for (int q = 0; q < 4; q++) {
            if (q > 0) {
                pw = pw * th;
            }
            if (d[q] != 0.0) {
                double term = pw * d[q];
                bj = any ? bj + term : term;
                any = 1;
            }
        }
        b[j] = bj;
    }
}

/* The solve; w (NULL: nothing stored) gets LV_REC doubles per accepted step, the final state
 * and the saves; ys (NULL: not wanted) the solution at o->ts. */
static int lv_run(const double p[6], const lim_lv_opts *o, double y[2], double *ys,
                  lim_lv_stats *st, const lv_work *w) {
    const lv_par q = {p[0], -p[2], -p[1], p[3]};
    double (*pow1)(double, double) = lim_vmath_get()->pow1;
    const double t1 = o->t1, tol = 1e-10, rtol = o->rtol, atol = o->atol;
    const int n_ts = (ys != NULL || w != NULL) && o->n_ts > 0 ? o->n_ts : 0;
    const double *ts = o->ts;
    double *rec = w != NULL ? w->rec : NULL;
    for (int i = 0; i < n_ts; i++) {
        if (ys != NULL) {
            ys[2 * i] = ys[2 * i + 1] = NAN; /* not reached */
        }
        if (w != NULL) {
            w->save[i].step = -1;
        }
    }
    int si = 0; /* the next save time */
    double x = p[4], yy = p[5], fx, fy;
    lv_f(&q, x, yy, &fx, &fy);
    double first = o->dt0 != 0.0 ? fabs(o->dt0) : lv_initial_step(&q, o, x, yy, fx, fy);
    double t = o->t0, tn = lim_min(o->t0 + first, t1);
    tn = tn > t1 - tol ? t1 : tn;
    int steps = 0, acc = 0, result = LIM_OK;
    while (t < t1 && result == LIM_OK) {
        if (steps == o->max_steps) {
            result = LIM_MAX_STEPS;
            break;
        }
        double h = tn - t;
        double k0x = fx, k0y = fy, k1x, k1y, k2x, k2y, k3x, k3y, k4x, k4y, k5x, k5y, k6x, k6y;
        double Y1x = x + h * (k0x * A(1, 0));
        double Y1y = yy + h * (k0y * A(1, 0));
        lv_f(&q, Y1x, Y1y, &k1x, &k1y);
        double Y2x = x + h * (k0x * A(2, 0) + k1x * A(2, 1));
        double Y2y = yy + h * (k0y * A(2, 0) + k1y * A(2, 1));
        lv_f(&q, Y2x, Y2y, &k2x, &k2y);
        double Y3x = x + h * (k0x * A(3, 0) + k1x * A(3, 1) + k2x * A(3, 2));
        double Y3y = yy + h * (k0y * A(3, 0) + k1y * A(3, 1) + k2y * A(3, 2));
        lv_f(&q, Y3x, Y3y, &k3x, &k3y);
        double Y4x = x + h * (k0x * A(4, 0) + k1x * A(4, 1) + k2x * A(4, 2) + k3x * A(4, 3));
        double Y4y = yy + h * (k0y * A(4, 0) + k1y * A(4, 1) + k2y * A(4, 2) + k3y * A(4, 3));
        lv_f(&q, Y4x, Y4y, &k4x, &k4y);
        double Y5x =
            x + h * (k0x * A(5, 0) + k1x * A(5, 1) + k2x * A(5, 2) + k3x * A(5, 3) + k4x * A(5, 4));
        double Y5y = yy + h * (k0y * A(5, 0) + k1y * A(5, 1) + k2y * A(5, 2) + k3y * A(5, 3) +
                               k4y * A(5, 4));
        lv_f(&q, Y5x, Y5y, &k5x, &k5y);
        double x1 = x + h * (k0x * A(6, 0) + k1x * A(6, 1) + k2x * A(6, 2) + k3x * A(6, 3) +
                             k4x * A(6, 4) + k5x * A(6, 5));
        double y1 = yy + h * (k0y * A(6, 0) + k1y * A(6, 1) + k2y * A(6, 2) + k3y * A(6, 3) +
                              k4y * A(6, 4) + k5y * A(6, 5));
        lv_f(&q, x1, y1, &k6x, &k6y);
        double ex = h * (k0x * E(0) + k1x * E(1) + k2x * E(2) + k3x * E(3) + k4x * E(4) +
                         k5x * E(5) + k6x * E(6));
        double ey = h * (k0y * E(0) + k1y * E(1) + k2y * E(2) + k3y * E(3) + k4y * E(4) +
                         k5y * E(5) + k6y * E(6));
        double qx = ex / (atol + rtol * lim_max(fabs(x), fabs(x1)));
        double qy = ey / (atol + rtol * lim_max(fabs(yy), fabs(y1)));
        double scaled = sqrt((qx * qx + qy * qy) / 2.0);
        int finite = scaled - scaled == 0.0;
        scaled = finite ? scaled : INFINITY;
        int keep = scaled < 1.0;
        double factor = 0.9 * pow1(1.0 / scaled, 0.2);
        factor = lim_min(lim_max(factor, keep ? 1.0 : 0.2), 10.0);
        double t_new = keep ? tn : t;
        double tn_new = t_new + h * factor;
        double tclip = keep ? t1 : t_new + 0.5 * (t1 - t_new);
        tn_new = tn_new > t1 - tol ? tclip : tn_new;
        if (t_new < t1 && tn_new <= t_new) {
            result = finite ? LIM_DT_UNDERFLOW : LIM_NONFINITE;
        }
        if (keep) {
            /* the saves in (t, tn]: the dense output y + h sum_j b_j(theta) k_j */
            for (; si < n_ts && ts[si] <= tn; si++) {
                if (!(ts[si] > t)) {
                    continue; /* at or before t0: never written (as nabla's mask) */
                }
                double b[7];
                lv_dense_b((ts[si] - t) / h, b);
                if (ys != NULL) {
                    double sx = b[0] * k0x + b[1] * k1x + b[2] * k2x + b[3] * k3x + b[4] * k4x +
                                b[5] * k5x + b[6] * k6x;
                    double sy = b[0] * k0y + b[1] * k1y + b[2] * k2y + b[3] * k3y + b[4] * k4y +
                                b[5] * k5y + b[6] * k6y;
                    ys[2 * si] = x + h * sx;
                    ys[2 * si + 1] = yy + h * sy;
                }
                if (w != NULL) {
                    memcpy(w->save[si].b, b, sizeof b);
                    w->save[si].step = acc;
                }
            }
            if (rec != NULL) {
                double *r = rec + (size_t)acc * LV_REC;
                r[0] = h;
                r[1] = x, r[2] = yy, r[3] = Y1x, r[4] = Y1y, r[5] = Y2x, r[6] = Y2y;
                r[7] = Y3x, r[8] = Y3y, r[9] = Y4x, r[10] = Y4y, r[11] = Y5x, r[12] = Y5y;
            }
            x = x1, yy = y1, fx = k6x, fy = k6y;
            acc++;
        }
        t = t_new;
        tn = tn_new;
        steps++;
    }
    y[0] = x;
    y[1] = yy;
    if (w != NULL) {
        w->yend[0] = x;
        w->yend[1] = yy;
    }
    if (st != NULL) {
        st->steps = steps;
        st->accepted = acc;
        st->rejected = steps - acc;
        st->result = result;
    }
    return result;
}

int lim_lv_solve(const double p[6], const lim_lv_opts *o, double y[2], double *ys,
                 lim_lv_stats *st) {
    return lv_run(p, o, y, ys, st, NULL);
}

int lim_lv_forward(const double p[6], const lim_lv_opts *o, void *work, double y[2], double *ys,
                   lim_lv_stats *st) {
    lv_work w = lv_work_of(o, work);
    return lv_run(p, o, y, ys, st, &w);
}

/* kbar's pull-back through f at (X, Y): w = J^T kbar, pbar += (df/dp)^T kbar */
static inline void lv_pull(double a, double b, double c, double d, double X, double Y, double kx,
                           double ky, double *wx, double *wy, double pb[4]) {
    double XY = X * Y;
    *wx = kx * (a - b * Y) + ky * (d * Y);
    *wy = kx * (-b * X) + ky * (-c + d * X);
    pb[0] += kx * X;
    pb[1] -= kx * XY;
    pb[2] -= ky * Y;
    pb[3] += ky * XY;
}

void lim_lv_reverse(const double p[6], const lim_lv_opts *o, const void *work,
                    const lim_lv_stats *st, const double ybar[2], const double *ysbar,
                    double g[6]) {
    const lv_work w = lv_work_of(o, (void *)work);
    const double *rec = w.rec;
    const double a = p[0], b = p[1], c = p[2], d = p[3];
    double lx = ybar != NULL ? ybar[0] : 0.0, ly = ybar != NULL ? ybar[1] : 0.0; /* dG/dy(t1) */
    double pb[4] = {0.0, 0.0, 0.0, 0.0};
    int si = ysbar != NULL && o->n_ts > 0 ? o->n_ts - 1 : -1; /* the last save not yet taken */
    while (si >= 0 && w.save[si].step < 0) {
        si--; /* not reached */
    }
    for (int n = st->accepted - 1; n >= 0; n--) {
        const double *r = rec + (size_t)n * LV_REC;
        const double h = r[0];
        double Dx[7] = {0}, Dy[7] = {0}, sx0 = 0.0, sy0 = 0.0;
        int dense = 0;
        for (; si >= 0 && w.save[si].step == n; si--) { /* this step's saves */
            const lv_save *sv = &w.save[si];
            double gx = ysbar[2 * si], gy = ysbar[2 * si + 1];
            for (int j = 0; j < 7; j++) {
                Dx[j] += sv->b[j] * gx;
                Dy[j] += sv->b[j] * gy;
            }
            sx0 += gx;
            sy0 += gy;
            dense = 1;
        }
        if (dense) { /* D_j = h sum_s b_j ysbar_s; k_6 = f(y_{n+1}) */
            for (int j = 0; j < 7; j++) {
                Dx[j] *= h;
                Dy[j] *= h;
            }
            const double *y1 = n + 1 < st->accepted ? rec + (size_t)(n + 1) * LV_REC + 1 : w.yend;
            double w6x, w6y;
            lv_pull(a, b, c, d, y1[0], y1[1], Dx[6], Dy[6], &w6x, &w6y, pb);
            lx += w6x;
            ly += w6y;
        }
        double wx[6], wy[6];
        for (int i = 5; i >= 0; i--) {
            double sx = B(i) * lx, sy = B(i) * ly;
            for (int l = i + 1; l < 6; l++) {
                sx += A(l, i) * wx[l];
                sy += A(l, i) * wy[l];
            }
            double kx = h * sx + Dx[i], ky = h * sy + Dy[i]; /* kbar_i */
            lv_pull(a, b, c, d, r[1 + 2 * i], r[2 + 2 * i], kx, ky, &wx[i], &wy[i], pb);
        }
        lx += wx[0] + wx[1] + wx[2] + wx[3] + wx[4] + wx[5] + sx0;
        ly += wy[0] + wy[1] + wy[2] + wy[3] + wy[4] + wy[5] + sy0;
    }
    g[0] = pb[0], g[1] = pb[1], g[2] = pb[2], g[3] = pb[3], g[4] = lx, g[5] = ly;
}

int lim_lv_grad(const double p[6], const lim_lv_opts *o, void *work, double g[6], double y[2],
                lim_lv_stats *st) {
    double yend[2];
    lim_lv_stats s;
    int result = lim_lv_forward(p, o, work, yend, NULL, &s);
    if (y != NULL) {
        y[0] = yend[0];
        y[1] = yend[1];
    }
    if (st != NULL) {
        *st = s;
    }
    lim_lv_reverse(p, o, work, &s, (const double[2]){1.0, 1.0}, NULL, g);
    return result;
}

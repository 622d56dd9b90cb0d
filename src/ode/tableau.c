/*
 * tableau.c -- the explicit Runge-Kutta methods of nabla/ode.h as data (see tableau.h for the
 * layout), and nb_ode_solver_name / nb_ode_solver_order.
 *
 * The methods are Diffrax's (diffrax 0.7.2, diffrax/_solver/<method>.py), so that an adaptive
 * solve can be compared with Diffrax's step for step: the same c, a, b, error weights and
 * FSAL property. Every c, a, b and e number below (and dopri8's dense coefficients) is
 * transcribed from Diffrax's source with all its digits and its arithmetic kept (Diffrax's `35 /
 * 384` is `35.0 / 384.0` here, its b_error entry `35 / 384 - 1951 / 21600` is the same difference
 * here), so each double is bit for bit the float64 Diffrax uses; tests/ode/test_tableau.c checks
 * that, and the order conditions. The exception is classical RK4, which Diffrax does not have
 * (Kutta 1901).
 *
 * Error weights: e is Diffrax's `b_error` as it stands (Diffrax computes the error estimate
 * as h sum_i b_error_i f_i, never as a difference of two solutions). For bosh3, dopri5, tsit5
 * and dopri8 that is b - bhat. For heun, midpoint and ralston Diffrax writes it as
 * bhat - b with bhat Euler's weights (1, 0): the sign is the opposite of tableau.h's
 * b - bhat, and it does not matter, since only |err| reaches the controller's norm.
 *
 * error_order is Diffrax's AbstractSolver.error_order(terms) for an ODE, which returns
 * solver.order(terms) (its docstring: an estimate from methods of orders p and q = p - 1 has
 * local order min(p, q) + 1 = p). The PID controller uses it as the exponent 1/error_order
 * of its step-size factor, and the initial-step selection (dt0 = None) as well. Euler and RK4
 * have no estimate: 0.
 *
 * Dense output, against Diffrax's `interpolation_cls`:
 *   euler        Diffrax: LocalLinearInterpolation, y0 + theta (y1 - y0), i.e. B_0 = theta
 *                (order 1). Here: dense_degree 0, the solver's cubic Hermite through
 *                (y0, f0, y1, f(t1, y1)) -- same order 1 globally, different values.
 *   heun, midpoint, ralston
 *                Diffrax: ThirdOrderHermitePolynomialInterpolation.from_k, a cubic Hermite
 *                through (y0, k[0], y1, k[-1]) where k[-1] = h f of the LAST STAGE, not
 *                h f(t1, y1): f(t0 + h, y0 + h f0) for heun, f(t0 + h/2, .) for midpoint,
 *                f(t0 + 2h/3, .) for ralston. Written in this file's form that is degree 3
 *                with, for s = 2 stages,
 *                  B_i(theta) = [i == 0] theta + (3 b_i - 2 [i == 0] - [i == 1]) theta^2
 *                               + ([i == 0] + [i == 1] - 2 b_i) theta^3,
 *                of global order 2. Here: dense_degree 0 (the true Hermite cubic with
 *                f(t1, y1)), also of global order 2 for these order-2 methods.
 *   bosh3        Diffrax: the same from_k Hermite; bosh3 is FSAL, so k[-1] = h f(t1, y1) and
 *                it is exactly the solver's Hermite cubic: dense_degree 0 (order 3).
 *   rk4          (not in Diffrax) dense_degree 0: Hermite cubic, order 4.
 *   dopri5       Diffrax: FourthOrderPolynomialInterpolation, the quartic through y0, f0, y1,
 *                f1 = k[6] and y_mid = y0 + h sum_i c_mid_i f_i (dopri5.py's c_mid). Substituting
 *                y1 and y_mid gives this file's quartic B_i exactly (rationals below).
 *   tsit5        Diffrax: _Tsit5Interpolation, y0 + h sum_i b_i(theta) f_i with b_i(theta)
 *                as products of factors (Tsitouras 2011); expanded to monomials below.
 *   dopri8       Diffrax: _Dopri8Interpolation, y0 + h sum_i theta p_i(theta) f_i with p_i of
 *                degree 5 (`eval_coeffs`, cited to Bogacki and Shampine 1990): degree 6 here,
 *                over the 14 stages of the step (the 14th is FSAL's f(t1, y1)); no extra
 *                stages. Its order conditions hold up to order 5 only (the test checks every
 *                rooted tree), so its global error is O(h^6), not the 8 of Diffrax's docstring;
 *                and its 20-digit coefficients give B_i(1) = b_i only to ~1e-12 (the
 *                interpolant ends ~1e-12 h |f| away from y1). Kept as Diffrax has it.
 *
 * dopri8 is Diffrax's Dopri8: Prince and Dormand's RK8(7)13M (J. Comp. Appl. Math 7, 1981)
 * with an FSAL 14th stage, order 8 with an embedded order-7 estimate -- not Hairer's DOP853
 * (which has an order 5 and 3 estimate and extra dense-output stages).
 */
#include "ode/tableau.h"

#include "core/internal.h"
#include "nabla/ode.h"

#include <stddef.h>

/* ---- euler: y1 = y0 + h f0 (Diffrax's Euler, diffrax/_solver/euler.py) ----------------- */

static const double euler_c[1] = {0.0};
static const double euler_a[1 * 1] = {0.0};
static const double euler_b[1] = {1.0};

/* ---- heun (diffrax/_solver/heun.py): explicit trapezoidal rule, embedded Euler ------------ */

/* clang-format off */
static const double heun_c[2] = {
    0.0, 1.0,
};
static const double heun_a[2 * 2] = {
    [1 * 2] = 1.0,
};
static const double heun_b[2] = {
    0.5, 0.5,
};
static const double heun_e[2] = {
    0.5, -0.5,
};
/* clang-format on */

/* ---- midpoint (diffrax/_solver/midpoint.py), embedded Euler --------------------------------- */

/* clang-format off */
static const double midpoint_c[2] = {
    0.0, 0.5,
};
static const double midpoint_a[2 * 2] = {
    [1 * 2] = 0.5,
};
static const double midpoint_b[2] = {
    0.0, 1.0,
};
static const double midpoint_e[2] = {
    1.0, -1.0,
};
/* clang-format on */

/* ---- ralston (diffrax/_solver/ralston.py): Ralston's 2/3 method, embedded Euler --------- */

/* clang-format off */
static const double ralston_c[2] = {
    0.0, 2.0 / 3.0,
};
static const double ralston_a[2 * 2] = {
    [1 * 2] = 2.0 / 3.0,
};
static const double ralston_b[2] = {
    0.25, 0.75,
};
static const double ralston_e[2] = {
    0.75, -0.75,
};
/* clang-format on */

/* ---- bosh3 (diffrax/_solver/bosh3.py): Bogacki and Shampine's 3(2), FSAL -------------------- */

/* clang-format off */
static const double bosh3_c[4] = {
    0.0, 1.0 / 2.0, 3.0 / 4.0, 1.0,
};
static const double bosh3_a[4 * 4] = {
    [1 * 4] = 1.0 / 2.0,
    [2 * 4] = 0.0, 3.0 / 4.0,
    [3 * 4] = 2.0 / 9.0, 1.0 / 3.0, 4.0 / 9.0,
};
static const double bosh3_b[4] = {
    2.0 / 9.0, 1.0 / 3.0, 4.0 / 9.0, 0.0,
};
static const double bosh3_e[4] = {
    2.0 / 9.0 - 7.0 / 24.0, 1.0 / 3.0 - 1.0 / 4.0, 4.0 / 9.0 - 1.0 / 3.0, -1.0 / 8.0,
};
/* clang-format on */

/* ---- rk4: Kutta's classical method (Kutta 1901; Hairer, Norsett and Wanner, Solving ODE I,
 * table II.1.2). Not a Diffrax solver. ------------------------------------------------------ */

static const double rk4_c[4] = {
    0.0,
    1.0 / 2.0,
    1.0 / 2.0,
    1.0,
};
static const double rk4_a[4 * 4] = {
    [1 * 4] = 1.0 / 2.0, [2 * 4] = 0.0, 1.0 / 2.0, [3 * 4] = 0.0, 0.0, 1.0,
};
static const double rk4_b[4] = {
    1.0 / 6.0,
    1.0 / 3.0,
    1.0 / 3.0,
    1.0 / 6.0,
};

/* ---- dopri5 (diffrax/_solver/dopri5.py): Dormand and Prince's 5(4), FSAL. The embedded
 * weights are Diffrax's (its docstring credits Shampine, Math. Comp. 46, 1986): bhat =
 * (1951/21600, 0, 22642/50085, 451/720, -12231/42400, 649/6300, 1/60), not the (5179/57600, 0,
 * 7571/16695, 393/640, -92097/339200, 187/2100, 1/40) of Dormand and Prince's paper. ---- */

/* clang-format off */
static const double dopri5_c[7] = {
    0.0, 1.0 / 5.0, 3.0 / 10.0, 4.0 / 5.0, 8.0 / 9.0, 1.0, 1.0,
};
static const double dopri5_a[7 * 7] = {
    [1 * 7] = 1.0 / 5.0,
    [2 * 7] = 3.0 / 40.0, 9.0 / 40.0,
    [3 * 7] = 44.0 / 45.0, -56.0 / 15.0, 32.0 / 9.0,
    [4 * 7] = 19372.0 / 6561.0, -25360.0 / 2187.0, 64448.0 / 6561.0, -212.0 / 729.0,
    [5 * 7] = 9017.0 / 3168.0, -355.0 / 33.0, 46732.0 / 5247.0, 49.0 / 176.0, -5103.0 / 18656.0,
    [6 * 7] = 35.0 / 384.0, 0.0, 500.0 / 1113.0, 125.0 / 192.0, -2187.0 / 6784.0, 11.0 / 84.0,
};
static const double dopri5_b[7] = {
    35.0 / 384.0, 0.0, 500.0 / 1113.0, 125.0 / 192.0, -2187.0 / 6784.0, 11.0 / 84.0, 0.0,
};
static const double dopri5_e[7] = {
    35.0 / 384.0 - 1951.0 / 21600.0, 0.0, 500.0 / 1113.0 - 22642.0 / 50085.0,
    125.0 / 192.0 - 451.0 / 720.0, -2187.0 / 6784.0 - -12231.0 / 42400.0,
    11.0 / 84.0 - 649.0 / 6300.0, -1.0 / 60.0,
};
/* clang-format on */

/* Diffrax's quartic (_local_interpolation.py, FourthOrderPolynomialInterpolation, with
 * dopri5.py's c_mid) as B_i(theta) = sum_p dense[i][p - 1] theta^p: with K_i = h f_i,
 * y1 - y0 = sum_i b_i K_i and y_mid - y0 = sum_i c_mid_i K_i, its coefficients
 *   theta^1: K_0
 *   theta^2: K_6 - 4 K_0 - 5 (y1 - y0) + 16 (y_mid - y0)
 *   theta^3: 5 K_0 - 3 K_6 + 14 (y1 - y0) - 32 (y_mid - y0)
 *   theta^4: 2 (K_6 - K_0) - 8 (y1 - y0) + 16 (y_mid - y0)
 * are linear in the K_i; the rationals are exact (computed in rational arithmetic). */
/* clang-format off */
static const double dopri5_dense[7 * 4] = {
    1.0, -8048581381.0 / 2820520608.0, 8663915743.0 / 2820520608.0, -12715105075.0 / 11282082432.0,
    0.0, 0.0, 0.0, 0.0,
    0.0, 131558114200.0 / 32700410799.0,
        -68118460800.0 / 10900136933.0, 87487479700.0 / 32700410799.0,
    0.0, -1754552775.0 / 470086768.0, 14199869525.0 / 1410260304.0, -10690763975.0 / 1880347072.0,
    0.0, 127303824393.0 / 49829197408.0,
        -318862633887.0 / 49829197408.0, 701980252875.0 / 199316789632.0,
    0.0, -282668133.0 / 205662961.0, 2019193451.0 / 616988883.0, -1453857185.0 / 822651844.0,
    0.0, 40617522.0 / 29380423.0, -110615467.0 / 29380423.0, 69997945.0 / 29380423.0,
};
/* clang-format on */

/* ---- tsit5 (diffrax/_solver/tsit5.py): Tsitouras' 5(4), FSAL (Tsitouras, Comput. Math.
 * Appl. 62, 2011) ------------------------------------------------------------------------------ */

/* clang-format off */
static const double tsit5_c[7] = {
    0.0,
    161.0 / 1000.0,
    327.0 / 1000.0,
    9.0 / 10.0,
    0.9800255409045096857298102862870245954942137979563024768854764293221195950761080302604,
    1.0,
    1.0,
};
static const double tsit5_a[7 * 7] = {
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
static const double tsit5_b[7] = {
    0.9646076681806522951816731316512876333711995238157997181903319145764851595234062815396e-1,
    1.0 / 100.0,
    0.4798896504144995747752495322905965199130404621990332488332634944254542060153074523509,
    1.379008574103741893192274821856872770756462643091360525934940067397245698027561293331,
    -3.290069515436080679901047585711363850115683290894936158531296799594813811049925401677,
    2.324710524099773982415355918398765796109060233222962411944060046314465391054716027841,
    0.0,
};
static const double tsit5_e[7] = {
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
static const double tsit5_dense[7 * 4] = {
    0.999999999999999974283, -2.76370619727482591134, 2.91325546182191274375, -1.0530884977290216,
    0.0, 0.13169999999999999727, -0.22339999999999999818, 0.1017,
    0.0, 3.93029623689475152851, -5.94103387213150473470, 2.490627285651252793,
    0.0, -12.4110771669336769837, 30.3381886302823215982, -16.54810288924490272,
    0.0, 37.5093134165110391950, -88.1789048947664011014, 47.37952196281928122,
    0.0, -27.8965262891972878059, 65.0918946747936715263, -34.87065786149660974,
    0.0, 1.5, -4.0, 2.5,
};
/* clang-format on */

/* ---- dopri8 (diffrax/_solver/dopri8.py): Prince and Dormand's RK8(7)13M, FSAL --------------- */

/* clang-format off */
static const double dopri8_c[14] = {
    0.0, 1.0 / 18.0, 1.0 / 12.0, 1.0 / 8.0, 5.0 / 16.0, 3.0 / 8.0, 59.0 / 400.0, 93.0 / 200.0,
    5490023248.0 / 9719169821.0, 13.0 / 20.0, 1201146811.0 / 1299019798.0, 1.0, 1.0, 1.0,
};
static const double dopri8_a[14 * 14] = {
    [1 * 14] = 1.0 / 18.0,
    [2 * 14] = 1.0 / 48.0, 1.0 / 16.0,
    [3 * 14] = 1.0 / 32.0, 0.0, 3.0 / 32.0,
    [4 * 14] = 5.0 / 16.0, 0.0, -75.0 / 64.0, 75.0 / 64.0,
    [5 * 14] = 3.0 / 80.0, 0.0, 0.0, 3.0 / 16.0, 3.0 / 20.0,
    [6 * 14] = 29443841.0 / 614563906.0, 0.0, 0.0, 77736538.0 / 692538347.0,
               -28693883.0 / 1125000000.0, 23124283.0 / 1800000000.0,
    [7 * 14] = 16016141.0 / 946692911.0, 0.0, 0.0, 61564180.0 / 158732637.0,
               22789713.0 / 633445777.0, 545815736.0 / 2771057229.0, -180193667.0 / 1043307555.0,
    [8 * 14] = 39632708.0 / 573591083.0, 0.0, 0.0, -433636366.0 / 683701615.0,
               -421739975.0 / 2616292301.0, 100302831.0 / 723423059.0, 790204164.0 / 839813087.0,
               800635310.0 / 3783071287.0,
    [9 * 14] = 246121993.0 / 1340847787.0, 0.0, 0.0, -37695042795.0 / 15268766246.0,
               -309121744.0 / 1061227803.0, -12992083.0 / 490766935.0, 6005943493.0 / 2108947869.0,
               393006217.0 / 1396673457.0, 123872331.0 / 1001029789.0,
    [10 * 14] = -1028468189.0 / 846180014.0, 0.0, 0.0, 8478235783.0 / 508512852.0,
                1311729495.0 / 1432422823.0, -10304129995.0 / 1701304382.0,
                -48777925059.0 / 3047939560.0, 15336726248.0 / 1032824649.0,
                -45442868181.0 / 3398467696.0, 3065993473.0 / 597172653.0,
    [11 * 14] = 185892177.0 / 718116043.0, 0.0, 0.0, -3185094517.0 / 667107341.0,
                -477755414.0 / 1098053517.0, -703635378.0 / 230739211.0,
                5731566787.0 / 1027545527.0, 5232866602.0 / 850066563.0,
                -4093664535.0 / 808688257.0, 3962137247.0 / 1805957418.0, 65686358.0 / 487910083.0,
    [12 * 14] = 403863854.0 / 491063109.0, 0.0, 0.0, -5068492393.0 / 434740067.0,
                -411421997.0 / 543043805.0, 652783627.0 / 914296604.0, 11173962825.0 / 925320556.0,
                -13158990841.0 / 6184727034.0, 3936647629.0 / 1978049680.0,
                -160528059.0 / 685178525.0, 248638103.0 / 1413531060.0, 0.0,
    [13 * 14] = 14005451.0 / 335480064.0, 0.0, 0.0, 0.0, 0.0, -59238493.0 / 1068277825.0,
                181606767.0 / 758867731.0, 561292985.0 / 797845732.0, -1041891430.0 / 1371343529.0,
                760417239.0 / 1151165299.0, 118820643.0 / 751138087.0, -528747749.0 / 2220607170.0,
                1.0 / 4.0,
};
static const double dopri8_b[14] = {
    14005451.0 / 335480064.0, 0.0, 0.0, 0.0, 0.0, -59238493.0 / 1068277825.0,
    181606767.0 / 758867731.0, 561292985.0 / 797845732.0, -1041891430.0 / 1371343529.0,
    760417239.0 / 1151165299.0, 118820643.0 / 751138087.0, -528747749.0 / 2220607170.0, 1.0 / 4.0,
    0.0,
};
static const double dopri8_e[14] = {
    14005451.0 / 335480064.0 - 13451932.0 / 455176623.0, 0.0, 0.0, 0.0, 0.0,
    -59238493.0 / 1068277825.0 - -808719846.0 / 976000145.0,
    181606767.0 / 758867731.0 - 1757004468.0 / 5645159321.0,
    561292985.0 / 797845732.0 - 656045339.0 / 265891186.0,
    -1041891430.0 / 1371343529.0 - -3867574721.0 / 1518517206.0,
    760417239.0 / 1151165299.0 - 465885868.0 / 322736535.0,
    118820643.0 / 751138087.0 - 53011238.0 / 667516719.0, -528747749.0 / 2220607170.0 - 2.0 / 45.0,
    1.0 / 4.0, 0.0,
};
/* clang-format on */

/* Diffrax's _Dopri8Interpolation: B_i(theta) = theta polyval(eval_coeffs[i], theta), so the
 * coefficient of theta^p is eval_coeffs[i][6 - p]; rows 1-4 are zero. */
/* clang-format off */
static const double dopri8_dense[14 * 6] = {
    [0 * 6] = 1.0, -6.6910181737837595697, 19.9990069333683970610, -30.0610568289666450593,
              22.1396504998094068976, -6.3448349392860401388,
    [5 * 6] = 0.0, -7.6142658045872677172, 52.2273532792945524050, -121.4999627731334642623,
              116.4422149550342161651, -39.6107919852202505218,
    [6 * 6] = 0.0, 10.7281392630428866124, -46.8919164181093621583, 83.1721004639847717481,
              -67.1451318825957197185, 20.3761213808791436958,
    [7 * 6] = 0.0, 0.5526637063753648783, -0.1890893225010595467, 9.5724507555993664382,
              -16.5672243527496524646, 7.3347098826795362023,
    [8 * 6] = 0.0, 4.2186562625665153803, -35.7075975946222072821, 87.8406057677205645007,
              -89.9916014847245016028, 32.8801774352459155182,
    [9 * 6] = 0.0, -0.6627209125361597559, 6.2736448083240352160, -17.4152107770762969005,
              22.6237489648532849093, -10.1588990526426760954,
    [10 * 6] = 0.0, -1.2636789001135462218, 10.3160881272450748458, -28.5903289514790976966,
               32.2362340167355370113, -12.5401268098782561200,
    [11 * 6] = 0.0, 5.4106037898590422230, -34.7650769866611817349, 81.6630950584341412934,
               -82.1020315488359848644, 29.5553001484516038033,
    [12 * 6] = 0.0, -7.0321379067945741781, 47.7457971078225540396, -114.9375291377009418170,
               116.2662185791119533462, -41.7923486424390588923,
    [13 * 6] = 0.0, 2.3537586759714983486, -19.0082099341608028453, 50.2558364226176017553,
               -53.9020777466385396792, 20.3006925822100825485,
};
/* clang-format on */

/* ---- Rosenbrock methods ------------------------------------------------------------------
 * In the transformed form of tableau.h's nbo_rosen, transcribed with all digits from
 * OrdinaryDiffEq.jl (lib/OrdinaryDiffEqRosenbrock[Tableaus]/src/rosenbrock_tableaus.jl), where they
 * are the published coefficients:
 *   rodas5p  G. Steinebach, "Construction of Rosenbrock-Wanner method Rodas5P and numerical
 *            benchmarks within the Julia Differential Equations package", BIT 63 (2023) 27:
 *            order 5 (embedded 4), 8 stages, L-stable, stiffly accurate (b = A's last row
 *            and 1: y1 is the last stage's argument plus k_8; the error estimate is k_8),
 *            with a dense output of order 4 (three H rows);
 *   ros3p    J. Lang and J. Verwer, "ROS3P -- an accurate third-order Rosenbrock solver
 *            designed for parabolic problems", BIT 41 (2001) 731-738: order 3 (embedded 2),
 *            3 stages, A-stable; no interpolant of its own (the cubic Hermite). */
/* clang-format off */
static const double rodas5p_A[8 * 8] = {
    [1 * 8] = 3.0,
    [2 * 8] = 2.849394379747939, 0.45842242204463923,
    [3 * 8] = -6.954028509809101, 2.489845061869568, -10.358996098473584,
    [4 * 8] = 2.8029986275628964, 0.5072464736228206, -0.3988312541770524, -0.04721187230404641,
    [5 * 8] = -7.502846399306121, 2.561846144803919, -11.627539656261098, -0.18268767659942256,
              0.030198172008377946,
    [6 * 8] = -7.502846399306121, 2.561846144803919, -11.627539656261098, -0.18268767659942256,
              0.030198172008377946, 1.0,
    [7 * 8] = -7.502846399306121, 2.561846144803919, -11.627539656261098, -0.18268767659942256,
              0.030198172008377946, 1.0, 1.0,
};
static const double rodas5p_C[8 * 8] = {
    [1 * 8] = -14.155112264123755,
    [2 * 8] = -17.97296035885952, -2.859693295451294,
    [3 * 8] = 147.12150275711716, -1.41221402718213, 71.68940251302358,
    [4 * 8] = 165.43517024871676, -0.4592823456491126, 42.90938336958603, -5.961986721573306,
    [5 * 8] = 24.854864614690072, -3.0009227002832186, 47.4931110020768, 5.5814197821558125,
              -0.6610691825249471,
    [6 * 8] = 30.91273214028599, -3.1208243349937974, 77.79954646070892, 34.28646028294783,
              -19.097331116725623, -28.087943162872662,
    [7 * 8] = 37.80277123390563, -3.2571969029072276, 112.26918849496327, 66.9347231244047,
              -40.06618937091002, -54.66780262877968, -9.48861652309627,
};
static const double rodas5p_c[8] = {0.0, 0.6358126895828704, 0.4095798393397535,
                                    0.9769306725060716, 0.4288403609558664, 1.0, 1.0, 1.0};
static const double rodas5p_d[8] = {0.21193756319429014, -0.42387512638858027,
                                    -0.3384627126235924, 1.8046452872882734,
                                    2.325825639765069, 0.0, 0.0, 0.0};
static const double rodas5p_b[8] = {-7.502846399306121, 2.561846144803919, -11.627539656261098,
                                    -0.18268767659942256, 0.030198172008377946, 1.0, 1.0, 1.0};
static const double rodas5p_btilde[8] = {0, 0, 0, 0, 0, 0, 0, 1.0};
static const double rodas5p_H[3 * 8] = {
    25.948786856663858, -2.5579724845846235, 10.433815404888879, -2.3679251022685204,
    0.524948541321073, 1.1241088310450404, 0.4272876194431874, -0.17202221070155493,
    -9.91568850695171, -0.9689944594115154, 3.0438037242978453, -24.495224566215796,
    20.176138334709044, 15.98066361424651, -6.789040303419874, -6.710236069923372,
    11.419903575922262, 2.8879645146136994, 72.92137995996029, 80.12511834622643,
    -52.072871366152654, -59.78993625266729, -0.15582684282751913, 4.883087185713722,
};
/* clang-format on */
static const nbo_rosen rodas5p = {.stages = 8,
                                  .gamma = 0.21193756319429014,
                                  .A = rodas5p_A,
                                  .C = rodas5p_C,
                                  .c = rodas5p_c,
                                  .d = rodas5p_d,
                                  .b = rodas5p_b,
                                  .btilde = rodas5p_btilde,
                                  .n_h = 3,
                                  .H = rodas5p_H};

/* ROS3P: OrdinaryDiffEq computes its transformed coefficients from gamma = 1/2 + sqrt(3)/6
 * (igamma = 1/gamma; C21 = -igamma^2, t = -igamma (2 - igamma/2), C31 = -igamma (1 - t),
 * C32 = t; t2 = igamma (2/3 - igamma/6), b = (igamma (1 + t2), t2, igamma/3)); these are
 * those expressions evaluated in double, printed with 17 digits. */
static const double ros3p_A[3 * 3] = {[1 * 3] = 1.2679491924311228, [2 * 3] = 1.2679491924311228};
static const double ros3p_C[3 * 3] = {
    [1 * 3] = -1.6076951545867364, [2 * 3] = -3.4641016151377553, -1.7320508075688774};
static const double ros3p_c[3] = {0.0, 1.0, 1.0};
static const double ros3p_d[3] = {0.7886751345948129, -0.2113248654051871, -1.077350269189626};
static const double ros3p_b[3] = {2, 0.57735026918962573, 0.42264973081037427};
static const double ros3p_btilde[3] = {-0.1132486540518709, -0.42264973081037427,
                                       5.5511151231257827e-17};
static const nbo_rosen ros3p = {.stages = 3,
                                .gamma = 0.78867513459481287,
                                .A = ros3p_A,
                                .C = ros3p_C,
                                .c = ros3p_c,
                                .d = ros3p_d,
                                .b = ros3p_b,
                                .btilde = ros3p_btilde,
                                .n_h = 0,
                                .H = NULL};

/* rosenbrock23: L. F. Shampine and M. W. Reichelt, "The MATLAB ODE suite", SIAM J. Sci.
 * Comput. 18 (1997) 1-22 (MATLAB's ode23s; OrdinaryDiffEq's Rosenbrock23): a W-method of
 * order 2 with an L-stable order-3 error estimate, FSAL, and its own dense output of order
 * 2; d = 1 / (2 + sqrt 2). */
static const nbo_rosen rosenbrock23 = {.ros23 = true, .stages = 3, .gamma = 0.29289321881345248};

/* ---- ESDIRK methods --------------------------------------------------------------------
 * Diffrax's implicit Runge-Kutta methods (diffrax/_solver/implicit_euler.py, kvaerno3.py,
 * kvaerno4.py, kvaerno5.py) in tableau.h's nbo_dirk form: A strictly lower (the diagonal is
 * gamma), Diffrax's a_predictor rows as P, its b_error as e, its c with c_0 = 0 prepended.
 * Kvaerno5's numbers are Diffrax's decimal literals; Kvaerno3's and Kvaerno4's are Diffrax's
 * expressions in gamma evaluated in double and printed with 17 digits (the same doubles).
 * References: A. Kvaerno, "Singly diagonally implicit Runge-Kutta methods with an explicit
 * first stage", BIT 44 (2004) 489-502. ImplicitEuler: f1 = f(t0 + h, y0 + h f1), y1 = y0 +
 * h f1, the error estimate h (f1 - f0) / 2 (Diffrax's, of order 2). */
/* clang-format off */
static const double ieuler_A[2 * 2] = {0};
static const double ieuler_P[2 * 2] = {[1 * 2] = 1.0};
static const double ieuler_e[2] = {-0.5, 0.5};
static const double ieuler_c[2] = {0.0, 1.0};
static const double kvaerno3_A[4 * 4] = {
    0, 0, 0, 0,
    0.43586652149999999, 0, 0, 0,
    0.49056338841910818, 0.073570090080891895, 0, 0,
    0.30880996997303606, 1.4905633882541081, -1.2352398797271447, 0,
};
static const double kvaerno3_P[4 * 4] = {
    0, 0, 0, 0,
    1, 0, 0, 0,
    -0.14714018016178376, 1.1471401801617838, 0, 0,
    0.49056338841910818, 0.073570090080891895, 0.43586652149999999, 0,
};
static const double kvaerno3_e[4] = {-0.18175341844607212, 1.4169932981732161, -1.6711064012271446, 0.43586652149999999};
static const double kvaerno3_c[4] = {0, 0.87173304299999999, 1, 1};
#define KVAERNO3_GAMMA 0.43586652149999999
static const double kvaerno4_A[5 * 5] = {
    0, 0, 0, 0, 0,
    0.57281606249999995, 0, 0, 0, 0,
    0.16723546204189954, -0.14294653686128728, 0, 0, 0,
    0.26260329027397794, -0.31190432741478491, 0.47648497464080769, 0, 0,
    0.19721654832102861, 0.1768437839066134, 0.81544218140355162, -0.76231857613119303, 0,
};
static const double kvaerno4_P[5 * 5] = {
    0, 0, 0, 0, 0,
    1, 0, 0, 0, 0,
    0.47879866961603201, 0.52120133038396799, 0, 0, 0,
    0, 0.73450333613083663, 0.26549666386916337, 0, 0,
    0.26260329027397794, -0.31190432741478491, 0.47648497464080769, 0.57281606249999995, 0,
};
static const double kvaerno4_e[5] = {-0.065386741952949329, 0.48874811132139828, 0.33895720676274393, -1.3351346386311929, 0.57281606249999995};
static const double kvaerno4_c[5] = {0, 1.1456321249999999, 0.59710498768061226, 1, 1};
#define KVAERNO4_GAMMA 0.57281606249999995
static const double kvaerno5_A[7 * 7] = {
    [1 * 7] = 0.26,
    [2 * 7] = 0.13, 0.84033320996790809,
    [3 * 7] = 0.22371961478320505, 0.47675532319799699, -0.06470895363112615,
    [4 * 7] = 0.16648564323248321, 0.10450018841591720, 0.03631482272098715, -0.13090704451073998,
    [5 * 7] = 0.13855640231268224, 0, -0.04245337201752043, 0.02446657898003141, 0.61943039072480676,
    [6 * 7] = 0.13659751177640291, 0, -0.05496908796538376, -0.04118626728321046, 0.62993304899016403,
              0.06962479448202728,
};
static const double kvaerno5_P[7 * 7] = {
    [1 * 7] = 1.0,
    [2 * 7] = -1.366025403784441, 2.3660254037844357,
    [3 * 7] = -0.19650552613122207, 0.8113579546496623, 0.38514757148155954,
    [4 * 7] = 0.10375304369958693, 0.937994698066431, -0.04174774176601781, 0,
    [5 * 7] = -0.17281112873898072, 0.6235784481025847, 0.5492326806363959, 0, 0,
    [6 * 7] = 0.13855640231268224, 0, -0.04245337201752043, 0.02446657898003141, 0.61943039072480676,
              0.26,
};
static const double kvaerno5_e[7] = {
    0.13659751177640291 - 0.13855640231268224, 0 - 0, -0.05496908796538376 - -0.04245337201752043,
    -0.04118626728321046 - 0.02446657898003141, 0.62993304899016403 - 0.61943039072480676,
    0.06962479448202728 - 0.26, 0.26};
static const double kvaerno5_c[7] = {0.0, 0.52, 1.230333209967908, 0.8957659843500759,
                                     0.43639360985864756, 1.0, 1.0};
/* clang-format on */
static const nbo_dirk ieuler = {
    .stages = 2, .gamma = 1.0, .A = ieuler_A, .P = ieuler_P, .e = ieuler_e, .c = ieuler_c};
static const nbo_dirk kvaerno3 = {.stages = 4,
                                  .gamma = KVAERNO3_GAMMA,
                                  .A = kvaerno3_A,
                                  .P = kvaerno3_P,
                                  .e = kvaerno3_e,
                                  .c = kvaerno3_c};
static const nbo_dirk kvaerno4 = {.stages = 5,
                                  .gamma = KVAERNO4_GAMMA,
                                  .A = kvaerno4_A,
                                  .P = kvaerno4_P,
                                  .e = kvaerno4_e,
                                  .c = kvaerno4_c};
static const nbo_dirk kvaerno5 = {
    .stages = 7, .gamma = 0.26, .A = kvaerno5_A, .P = kvaerno5_P, .e = kvaerno5_e, .c = kvaerno5_c};

/* ---- additive (IMEX) methods: Kennedy-Carpenter's KenCarp3/4/5 ----------------------------
 * Diffrax's (diffrax/_solver/kencarp3.py, kencarp4.py, kencarp5.py): its explicit and
 * implicit tableaus, predictors, b_sol, b_error (= b_sol - b_sol_embedded) and the dense
 * coefficients of its KenCarpInterpolation, evaluated as Diffrax writes them (its rational
 * literals, in float64) and printed with 17 digits: the same doubles. Reference: C. A.
 * Kennedy and M. H. Carpenter, "Additive Runge-Kutta schemes for convection-diffusion-
 * reaction equations", Appl. Numer. Math. 44 (2003) 139-181. */
/* clang-format off */
static const double kencarp3_A[16] = {0, 0, 0, 0, 0.435866521508459, 0, 0, 0, 0.25764824606642722, -0.093514767574886248, 0, 0, 0.18764102434672383, -0.59529747357695495, 0.97178992772177208, 0};
static const double kencarp3_AE[16] = {0, 0, 0, 0, 0.87173304301691801, 0, 0, 0, 0.52758901197630037, 0.072410988023699593, 0, 0, 0.39909600767607012, -0.43755765461351942, 1.0384616469374492, 0};
static const double kencarp3_P[16] = {0, 0, 0, 0, 1, 0, 0, 0, 0.31171589191628757, 0.68828410808371243, 0, 0, -0.1471401801395209, 1.1471401801395209, 0, 0};
static const double kencarp3_b[4] = {0.18764102434672383, -0.59529747357695495, 0.97178992772177208, 0.435866521508459};
static const double kencarp3_e[4] = {-0.027099261876665309, -0.11013520969201585, 0.10306492520138455, 0.034169546367296577};
static const double kencarp3_c[4] = {0, 0.87173304301691801, 0.59999999999999998, 1};
static const double kencarp3_H[8] = {-0.015883484505808787, 0.20352450885253262, 1.2933442599675704, -1.8886417335445254, -1.625024620129419, 2.5968145478511913, 0.34756384466765727, 0.088302676840801717};
static const double kencarp4_A[36] = {0, 0, 0, 0, 0, 0, 0.25, 0, 0, 0, 0, 0, 0.13777600000000001, -0.055775999999999999, 0, 0, 0, 0, 0.14463686602698217, -0.22393190761334475, 0.44929504158636258, 0, 0, 0, 0.098258783283564771, -0.59154424281967044, 0.81012105382829958, 0.28316440570780599, 0, 0, 0.15791629516167136, 0, 0.18675894052400077, 0.68056529530933463, -0.27524053099500667, 0};
static const double kencarp4_AE[36] = {0, 0, 0, 0, 0, 0, 0.5, 0, 0, 0, 0, 0, 0.221776, 0.110224, 0, 0, 0, 0, -0.04884659515311858, -0.177720652326401, 0.84656724747951961, 0, 0, 0, -0.15541685842491548, -0.3567050098221991, 1.0587258798684427, 0.30339598837867193, 0, 0, 0.20142435067267633, 0.0087420578429041849, 0.15993995707168115, 0.40382906052207751, 0.22606457389066084, 0};
static const double kencarp4_P[36] = {0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0.33599999999999997, 0.66400000000000003, 0, 0, 0, 0, -0.23999999999999999, 1.24, 0, 0, 0, 0, -0.37096774193548376, 0, 0, 1.3709677419354838, 0, 0, -0.17647058823529416, 0, 0, 0, 1.1764705882352942, 0};
static const double kencarp4_b[6] = {0.15791629516167136, 0, 0.18675894052400077, 0.68056529530933463, -0.27524053099500667, 0.25};
static const double kencarp4_e[6] = {0.0032044943984591845, 0, -0.0024462511366794559, -0.021480075919587227, 0.043946868068572453, -0.023225035410764872};
static const double kencarp4_c[6] = {0, 0.5, 0.33200000000000002, 0.62, 0.84999999999999998, 1};
static const double kencarp4_H[18] = {0.96035043509916451, -1.7641875401903802, 0.96175340025288703, 0, 0, 0, 0.17385801449315527, -0.77450466915551053, 0.787405595186356, -6.2142286282372554, 9.6402358444129241, -2.7454419208663343, 8.5661285996637648, -12.544886411270999, 3.7035172806122283, -3.4861084210188289, 5.4433427762039663, -1.707234355185137};
static const double kencarp5_A[64] = {0, 0, 0, 0, 0, 0, 0, 0, 0.20499999999999999, 0, 0, 0, 0, 0, 0, 0, 0.10249999999999999, -0.047570415551619845, 0, 0, 0, 0, 0, 0, 0.073899440792006915, 0, -0.080748954099503292, 0, 0, 0, 0, 0, 0.29921811830801498, 0, 2.4638206661140414, -2.0480387844220567, 0, 0, 0, 0, 0.14689238442881303, 0, 0.11740332879881549, -0.22170196800245401, -0.0075937452251744813, 0, 0, 0, 0.17845729560319554, 0, 1.0197467452199207, -0.22154535039396367, -0.036124916205265319, -0.54553377422597815, 0, 0, -0.09554858675139874, 0, 0, 2.3386928037652464, -0.14043175608247527, -2.0705877079565589, 0.76287524702518661, 0};
static const double kencarp5_AE[64] = {0, 0, 0, 0, 0, 0, 0, 0, 0.40999999999999998, 0, 0, 0, 0, 0, 0, 0, 0.17753520777580992, 0.082394376672570227, 0, 0, 0, 0, 0, 0, 0.12262307902976895, 0, 0.075527407662734677, 0, 0, 0, 0, 0, 2.2901776494938124, 0, 11.244925765143737, -12.615103414637549, 0, 0, 0, 0, 0.40294451783476792, 0, 1.3540123800181454, -1.4857008988406062, -0.031255999012307065, 0, 0, 0, 1.4641384430844078, 0, 7.2304686798580153, -7.8446071229424232, -0.125, -0.125, 0, 0, -1.6748080049977643, 0, -6.3894386455592986, 14.692200676518024, 0.094666234325682705, -7.2111573276528604, 1.4885370673662177, 0};
static const double kencarp5_P[64] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0.3660254037844386, 0.6339745962155614, 0, 0, 0, 0, 0, 0, 0.5167061300182838, 0.4832938699817162, 0, 0, 0, 0, 0, 0, -1.2439024390243905, 2.2439024390243905, 0, 0, 0, 0, 0, 0, 0.076673013157292247, 0, 0.92332698684270775, 0, 0, 0, 0, 0, 0.34782608695652184, 0, 0, 0, 0.65217391304347816, 0, 0, 0, -0.086956521739130377, 0, 0, 0, 1.0869565217391304, 0, 0, 0};
static const double kencarp5_b[8] = {-0.09554858675139874, 0, 0, 2.3386928037652464, -0.14043175608247527, -2.0705877079565589, 0.76287524702518661, 0.20499999999999999};
static const double kencarp5_e[8] = {0.0040283780536099906, 0, 0, -0.068470076234528499, 0.019716427003038328, 0.073648888487967579, -0.016690375399811663, -0.01223324191027586};
static const double kencarp5_c[8] = {0, 0.40999999999999998, 0.25992958444838016, 0.19815048669250362, 0.92000000000000004, 0.23999999999999999, 0.59999999999999998, 1};
static const double kencarp5_H[24] = {-1.8434745513691351, 3.4043317810659155, -1.6564058164481792, 0, 0, 0, 0, 0, 0, 2.3218595498174697, -8.2653703365181759, 8.2822035904659526, 4.5375256852308476, -7.2880278547571846, 2.6100704134438621, 2.9511058158214976, -1.3372862053107384, -3.6844073184673176, -6.5603746836579289, 10.806577862485343, -3.4833279318022283, -1.4066418158427509, 2.6797747530348404, -1.0681329371920893};
/* clang-format on */
static const nbo_dirk kencarp3 = {.stages = 4,
                                  .gamma = 0.435866521508459,
                                  .A = kencarp3_A,
                                  .P = kencarp3_P,
                                  .e = kencarp3_e,
                                  .c = kencarp3_c,
                                  .AE = kencarp3_AE,
                                  .b = kencarp3_b,
                                  .dense_degree = 2,
                                  .H = kencarp3_H};
static const nbo_dirk kencarp4 = {.stages = 6,
                                  .gamma = 0.25,
                                  .A = kencarp4_A,
                                  .P = kencarp4_P,
                                  .e = kencarp4_e,
                                  .c = kencarp4_c,
                                  .AE = kencarp4_AE,
                                  .b = kencarp4_b,
                                  .dense_degree = 3,
                                  .H = kencarp4_H};
static const nbo_dirk kencarp5 = {.stages = 8,
                                  .gamma = 0.20499999999999999,
                                  .A = kencarp5_A,
                                  .P = kencarp5_P,
                                  .e = kencarp5_e,
                                  .c = kencarp5_c,
                                  .AE = kencarp5_AE,
                                  .b = kencarp5_b,
                                  .dense_degree = 3,
                                  .H = kencarp5_H};

/* ---- the table ------------------------------------------------------------------------------
 * stiff_bound (the FSAL methods' stiffness test, solve.c): 0.98 of the real stability
 * boundary, where |R(x)| first exceeds 1 on the negative real axis (R the stability
 * polynomial of the tableau below; measured: bosh3 2.513, dopri5 3.307 -- Hairer's DOPRI5
 * uses 3.25 --, tsit5 3.507, dopri8 5.167). */

static const nbo_tableau nbo_tableaus[] = {
    [NB_ODE_EULER] = {.name = "euler",
                      .stages = 1,
                      .order = 1,
                      .error_order = 0,
                      .fsal = false,
                      .c = euler_c,
                      .a = euler_a,
                      .b = euler_b,
                      .e = NULL,
                      .dense_stages = 1,
                      .dense_degree = 0,
                      .dense = NULL,
                      .dense_order = 1},
    [NB_ODE_HEUN] = {.name = "heun",
                     .stages = 2,
                     .order = 2,
                     .error_order = 2,
                     .fsal = false,
                     .c = heun_c,
                     .a = heun_a,
                     .b = heun_b,
                     .e = heun_e,
                     .dense_stages = 2,
                     .dense_degree = 0,
                     .dense = NULL,
                     .dense_order = 2},
    [NB_ODE_MIDPOINT] = {.name = "midpoint",
                         .stages = 2,
                         .order = 2,
                         .error_order = 2,
                         .fsal = false,
                         .c = midpoint_c,
                         .a = midpoint_a,
                         .b = midpoint_b,
                         .e = midpoint_e,
                         .dense_stages = 2,
                         .dense_degree = 0,
                         .dense = NULL,
                         .dense_order = 2},
    [NB_ODE_RALSTON] = {.name = "ralston",
                        .stages = 2,
                        .order = 2,
                        .error_order = 2,
                        .fsal = false,
                        .c = ralston_c,
                        .a = ralston_a,
                        .b = ralston_b,
                        .e = ralston_e,
                        .dense_stages = 2,
                        .dense_degree = 0,
                        .dense = NULL,
                        .dense_order = 2},
    [NB_ODE_BOSH3] = {.name = "bosh3",
                      .stages = 4,
                      .order = 3,
                      .error_order = 3,
                      .fsal = true,
                      .c = bosh3_c,
                      .a = bosh3_a,
                      .b = bosh3_b,
                      .e = bosh3_e,
                      .dense_stages = 4,
                      .dense_degree = 0,
                      .dense = NULL,
                      .dense_order = 3,
                      .stiff_bound = 2.46},
    [NB_ODE_RK4] = {.name = "rk4",
                    .stages = 4,
                    .order = 4,
                    .error_order = 0,
                    .fsal = false,
                    .c = rk4_c,
                    .a = rk4_a,
                    .b = rk4_b,
                    .e = NULL,
                    .dense_stages = 4,
                    .dense_degree = 0,
                    .dense = NULL,
                    .dense_order = 4},
    [NB_ODE_DOPRI5] = {.name = "dopri5",
                       .stages = 7,
                       .order = 5,
                       .error_order = 5,
                       .fsal = true,
                       .c = dopri5_c,
                       .a = dopri5_a,
                       .b = dopri5_b,
                       .e = dopri5_e,
                       .dense_stages = 7,
                       .dense_degree = 4,
                       .dense = dopri5_dense,
                       .dense_order = 5,
                       .stiff_bound = 3.24},
    [NB_ODE_TSIT5] = {.name = "tsit5",
                      .stages = 7,
                      .order = 5,
                      .error_order = 5,
                      .fsal = true,
                      .c = tsit5_c,
                      .a = tsit5_a,
                      .b = tsit5_b,
                      .e = tsit5_e,
                      .dense_stages = 7,
                      .dense_degree = 4,
                      .dense = tsit5_dense,
                      .dense_order = 5,
                      .stiff_bound = 3.44},
    [NB_ODE_DOPRI8] = {.name = "dopri8",
                       .stages = 14,
                       .order = 8,
                       .error_order = 8,
                       .fsal = true,
                       .c = dopri8_c,
                       .a = dopri8_a,
                       .b = dopri8_b,
                       .e = dopri8_e,
                       .dense_stages = 14,
                       .dense_degree = 6,
                       .dense = dopri8_dense,
                       .dense_order = 6,
                       .stiff_bound = 5.06},
    [NB_ODE_ROS3P] =
        {.name = "ros3p", .order = 3, .error_order = 3, .dense_order = 3, .ros = &ros3p},
    [NB_ODE_RODAS5P] =
        {.name = "rodas5p", .order = 5, .error_order = 5, .dense_order = 4, .ros = &rodas5p},
    [NB_ODE_IMPLICIT_EULER] =
        {.name = "implicit_euler", .order = 1, .error_order = 2, .dense_order = 1, .dirk = &ieuler},
    [NB_ODE_KVAERNO3] =
        {.name = "kvaerno3", .order = 3, .error_order = 3, .dense_order = 3, .dirk = &kvaerno3},
    [NB_ODE_KVAERNO4] =
        {.name = "kvaerno4", .order = 4, .error_order = 4, .dense_order = 3, .dirk = &kvaerno4},
    [NB_ODE_KVAERNO5] =
        {.name = "kvaerno5", .order = 5, .error_order = 5, .dense_order = 3, .dirk = &kvaerno5},
    [NB_ODE_KENCARP3] =
        {.name = "kencarp3", .order = 3, .error_order = 3, .dense_order = 2, .dirk = &kencarp3},
    [NB_ODE_KENCARP4] =
        {.name = "kencarp4", .order = 4, .error_order = 4, .dense_order = 3, .dirk = &kencarp4},
    [NB_ODE_KENCARP5] =
        {.name = "kencarp5", .order = 5, .error_order = 5, .dense_order = 3, .dirk = &kencarp5},
    [NB_ODE_ROSENBROCK23] = {.name = "rosenbrock23",
                             .order = 2,
                             .error_order = 3,
                             .dense_order = 2,
                             .ros = &rosenbrock23},
    /* orders 1 to 5; its interpolant is the step's polynomial through the last order + 1
     * points */
    [NB_ODE_BDF] = {.name = "bdf", .order = 5, .error_order = 1, .dense_order = 1, .bdf = true},
};

_Static_assert(sizeof nbo_tableaus / sizeof nbo_tableaus[0] == NB_ODE_BDF + 1,
               "one tableau per nb_ode_solver");

NBI_HIDDEN const nbo_tableau *nbo_tableau_get(int solver) {
    if (solver < 0 || solver > NB_ODE_BDF) {
        return NULL;
    }
    return &nbo_tableaus[solver];
}

const char *nb_ode_solver_name(nb_ode_solver solver) {
    const nbo_tableau *t = nbo_tableau_get((int)solver);
    return t != NULL ? t->name : "unknown";
}

int nb_ode_solver_order(nb_ode_solver solver) {
    const nbo_tableau *t = nbo_tableau_get((int)solver);
    return t != NULL ? t->order : 0;
}

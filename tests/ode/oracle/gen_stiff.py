"""Reference data for nabla's stiff ODE tests: end states of five standard stiff problems
(Robertson, Van der Pol with mu = 1000, HIRES, Oregonator, POLLU) by SciPy's Radau IIA at
rtol = 1e-13, gradients of a weighted end state by forward sensitivities (Robertson, HIRES),
and SciPy's work counts at benchmark tolerances. tests/ode/stiff_problems.h defines the same
problems as nabla terms, with the same y0 and p vectors and the same order of operations.

How it was run (from the repository root; the peers' virtualenv: CPython 3.11.7, numpy 2.4.6,
scipy 1.17.1, float64; nothing else is needed):

    build/peers/bin/python tests/ode/oracle/gen_stiff.py > tests/ode/oracle/stiff_ref.txt

It takes about three minutes on one core and prints the same bytes on every run (run times go
to stderr only). With the argument --f0 it instead prints "<problem> f0 <f(0, y0)...>" for
each problem (used once to check stiff_problems.h against this script; not part of the data
file).

Problems (t0 = 0 for all; the numbers are copied digit for digit from the sources):
  robertson       Robertson's chemical reaction, H&W II sec. IV.1 / IVPtestset "rober":
                  y1' = -k1 y1 + k3 y2 y3, y2' = k1 y1 - k3 y2 y3 - k2 y2^2, y3' = k2 y2^2,
                  p = (k1, k2, k3) = (0.04, 3e7, 1e4), y0 = (1, 0, 0), t1 = 1e5 (the span of
                  SciMLBenchmarks.jl benchmarks/StiffODE/ROBER.jmd).
  robertson_long  the same with t1 = 1e11 (the IVPtestset span).
  vdp             Van der Pol, unscaled, mu = 1000 (MATLAB's vdp1000 demo, solved there on
                  [0, 3000] from [2; 0]): y1' = y2, y2' = mu ((1 - y1^2) y2) - y1, p = (mu,),
                  y0 = (2, 0), t1 = 3000. NOT the IVPtestset "vdpol" (scaled, eps = 1e-6,
                  t1 = 2) and NOT ODEProblemLibrary's mu ((1 - x^2) y - x).
  hires           IVPtestset hires.f (Schaefer 1975, H&W II sec. IV.10), 8 species,
                  y0 = (1, 0, 0, 0, 0, 0, 0, 0.0057), t1 = 321.8122. Its 12 distinct numeric
                  constants in order of appearance are p = (p1..p12) = (1.71, 0.43, 8.32,
                  0.0007, 8.75, 10.03, 0.035, 1.12, 1.745, 280, 0.69, 1.81), the
                  parametrisation of SciML's ODEProblemLibrary (prob_ode_hires):
                    y1' = -p1 y1 + p2 y2 + p3 y3 + p4
                    y2' =  p1 y1 - p5 y2
                    y3' = -p6 y3 + p2 y4 + p7 y5
                    y4' =  p3 y2 + p1 y3 - p8 y4
                    y5' = -p9 y5 + p2 (y6 + y7)
                    y6' = -p10 y6 y8 + p11 y4 + p1 y5 - p2 y6 + p11 y7
                    y7' =  p10 y6 y8 - p12 y7
                    y8' = -y7'
                  (the combined constants 8.75 = 0.43 + 8.32 etc. are separate entries of p,
                  as in hires.f and ODEProblemLibrary; a constant that appears several times is
                  one entry, used at each place.)
  orego           IVPtestset orego.f (Field-Noyes Oregonator, H&W II sec. IV.10), p = (s, q, w)
                  = (77.27, 8.375e-6, 0.161):
                    y1' = s (y2 + y1 (1 - q y1 - y2)), y2' = (y3 - (1 + y1) y2) / s,
                    y3' = w (y1 - y3), y0 = (1, 2, 3), t1 = 360
                  (s appears twice and is one entry; ODEProblemLibrary prob_ode_orego uses the
                  same p but t1 = 30).
  pollu           IVPtestset pollu.f (Verwer 1994, RIVM air pollution model), 20 species,
                  25 reactions r_j = k_j * (product of its reactants), p = (k1..k25),
                  y0 = 0 except y2 = 0.2, y4 = 0.04, y7 = 0.1, y8 = 0.3, y9 = 0.01,
                  y17 = 0.007; t1 = 60. The reactions and the 20 sums are those of pollu.f
                  (and of ODEProblemLibrary's pollution_prob.jl), term for term.

Sources (read through the search tool's stored copies):
  IVPtestset (Mazzia, Magherini, Bari; archimede.uniba.it/~testset) Fortran problem files:
    hires.f and pollu.f from github.com/volpatto/pside problems/HIRES/hires.f and
    problems/Pollution/pollu.f (rev. 2006/10/02, with their reference solutions solut());
    orego.f (rev. 1.4 2006/10/06, an ARKode-modified copy whose feval/solut are untouched);
    the R port deTestSet (github.com/TypeFox/R-Examples deTestSet/R/ex_hires.R, ex_orego.R,
    ex_pollution.R, ex_reference.R: the same constants and reference solutions, including
    rober at 1e11).
  SciML DiffEqProblemLibrary.jl lib/ODEProblemLibrary/src/ode_simple_nonlinear_prob.jl
    (rober, hires p1..p12, orego p1..p3) and pollution_prob.jl (k1..k25, Jacobian).
  SciMLBenchmarks.jl benchmarks/StiffODE/{ROBER,VanDerPol,Pollution}.jmd: their
    work-precision sets use abstol = 1e-3 * reltol throughout.
  MATLAB vdp1000.m (Kierzenka & Shampine): dydt = [y(2); 1000*(1-y(1)^2)*y(2)-y(1)].

Method:
  - Reference y(t1): solve_ivp(method="Radau", rtol=1e-13, atol=ATOL_REF[problem], jac=J) with
    the analytic Jacobian J = df/dy. SciPy floors rtol at 100 eps = 2.2e-14, so 1e-13 is the
    tightest round value. atol is chosen per problem so that the smallest component of
    interest is still controlled relatively (see ATOL_REF below and the comment lines).
  - Checks (comment lines "# <problem> check ..."): the max over components of
    |y - y_ref| / |y_ref| against Radau at rtol 1e-12, BDF at rtol 1e-12 and LSODA at rtol
    1e-12 (same atol, same Jacobian), and against the IVPtestset's published reference
    solution where there is one (hires, orego, pollu at their t1; rober at 1e11, i.e.
    robertson_long; computed there by RADAU5 in extended precision). SciPy's BDF cannot
    integrate vdp through its first relaxation jump at any rtol <= 1e-9 (step size
    underflow); that check says so.
  - Gradients (robertson, hires): loss L = sum_i w_i y_i(t1); dL/dp = w^T S(t1) where
    S = dy/dp solves S' = J S + df/dp, S(0) = 0, integrated together with y by Radau at
    rtol 1e-12. The augmented state is (y, S row-major); its Jacobian is block lower
    triangular [[J, 0], [d(J S + df/dp)/dy, J kron I]] with the lower-left block by complex
    step (exact to rounding: f is polynomial). atol is ATOL_SENS for y and ATOL_SENS / |p_j|
    for column j of S (CVODES' pbar scaling; ATOL_SENS = 1e-20 for robertson, 1e-17 for
    hires). Checked against the same system at Radau
    rtol 1e-13, at BDF rtol 1e-12, and against central differences of L (Radau rtol 1e-13
    solves, h_j = 1e-6 |p_j|). These agree only to ~3e-7 for hires: L is strongly curved in
    p1 there (the central difference for p1 is off by 0.17, 2.7e-3, 2.7e-5, 2.7e-7, 2.6e-9
    at h = 1e-3 ... 1e-7 |p1|, converging as h^2 to the sensitivity result), so that check
    is limited by truncation, not by the gradient.
  - The analytic J and df/dp are checked against complex-step derivatives of f at y0 and at
    y(t1) (comment line "# jacobian check"); the script stops if they differ by > 1e-12.
  - Benchmarks: for rtol in (1e-4, 1e-6, 1e-8), atol = rtol * BENCH_ATOL_SCALE[problem], Radau
    and BDF with the analytic Jacobian, default first step and max_step.

Output: one record per line, fields separated by one space; lines starting with '#' are
comments. Numbers are printf "%.17g" (round-trip through strtod), counts are integers, and
the <rtol> key of the scipy lines is "%g" (0.0001, 1e-06, 1e-08).
  <problem> t1 <t1>
  <problem> y0 <y0[0]> ... <y0[n-1]>
  <problem> p <p[0]> ... <p[np-1]>
  <problem> atol_ref <atol>                 atol of the reference solve (rtol 1e-13)
  <problem> y1 <y(t1)[0]> ... <y(t1)[n-1]>  the reference end state
  <problem> w <w[0]> ... <w[n-1]>           (robertson, hires) loss weights
  <problem> grad <dL/dp[0]> ... <dL/dp[np-1]>   (robertson, hires)
  <problem> y1_sens <y(t1)...>              (robertson, hires) y(t1) from the sensitivity run
  <problem> bench_atol_scale <s>            benchmark atol = rtol * s
  <problem> scipy <Radau|BDF> <rtol> <steps> <nfev> <njev> <nlu> <maxrelerr>
      steps = sol.t.size - 1 (accepted steps), nfev/njev/nlu as SciPy counts them, maxrelerr
      = max_i |y_i(t1) - y1_i| / |y1_i| against the reference above; "nan" when the solve
      failed (a comment line before it gives SciPy's message and the t reached).
Problems appear in the order robertson, robertson_long, vdp, hires, orego, pollu (the order
of SP_PROBLEMS in stiff_problems.h).
"""
import platform
import sys
import time

import numpy as np
import scipy
from scipy.integrate import solve_ivp

RTOL_REF = 1e-13
RTOL_CHECK = 1e-12
RTOL_SENS = 1e-12
BENCH_RTOLS = (1e-4, 1e-6, 1e-8)
FD_REL_STEP = 1e-6


# ---- problems -------------------------------------------------------------------------
# Each right-hand side is written with the same operations in the same order as its term in
# tests/ode/stiff_problems.h, so that f(0, y0) agrees to the last bits. They work on complex
# arrays too (for the complex-step checks).

def _vec(items):
    return np.array(items, dtype=np.result_type(*[np.asarray(v) for v in items], float))


def robertson_f(t, y, k):
    a = k[0] * y[0]
    b = k[2] * y[1] * y[2]
    c = k[1] * y[1] * y[1]
    return _vec([-a + b, a - b - c, c])


def robertson_jac(t, y, k):
    dt = np.result_type(y, k, float)
    return np.array([[-k[0], k[2] * y[2], k[2] * y[1]],
                     [k[0], -k[2] * y[2] - 2 * k[1] * y[1], -k[2] * y[1]],
                     [0 * k[0], 2 * k[1] * y[1], 0 * k[0]]], dtype=dt)


def robertson_fp(t, y, k):
    dt = np.result_type(y, k, float)
    z = 0 * y[0]
    return np.array([[-y[0], z, y[1] * y[2]],
                     [y[0], -y[1] * y[1], -y[1] * y[2]],
                     [z, y[1] * y[1], z]], dtype=dt)


def vdp_f(t, y, p):
    mu = p[0]
    return _vec([y[1], mu * ((1 - y[0] * y[0]) * y[1]) - y[0]])


def vdp_jac(t, y, p):
    mu = p[0]
    dt = np.result_type(y, p, float)
    return np.array([[0 * mu, 1 + 0 * mu],
                     [-2 * mu * y[0] * y[1] - 1, mu * (1 - y[0] * y[0])]], dtype=dt)


def vdp_fp(t, y, p):
    return _vec([0 * y[0], (1 - y[0] * y[0]) * y[1]]).reshape(2, 1)


def hires_f(t, y, p):
    p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12 = p
    y1, y2, y3, y4, y5, y6, y7, y8 = y
    f7 = p10 * y6 * y8 - p12 * y7
    return _vec([-p1 * y1 + p2 * y2 + p3 * y3 + p4,
                 p1 * y1 - p5 * y2,
                 -p6 * y3 + p2 * y4 + p7 * y5,
                 p3 * y2 + p1 * y3 - p8 * y4,
                 -p9 * y5 + p2 * (y6 + y7),
                 -p10 * y6 * y8 + p11 * y4 + p1 * y5 - p2 * y6 + p11 * y7,
                 f7,
                 -f7])


def hires_jac(t, y, p):
    p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12 = p
    y1, y2, y3, y4, y5, y6, y7, y8 = y
    J = np.zeros((8, 8), dtype=np.result_type(y, p, float))
    J[0, 0:3] = [-p1, p2, p3]
    J[1, 0:2] = [p1, -p5]
    J[2, 2:5] = [-p6, p2, p7]
    J[3, 1:4] = [p3, p1, -p8]
    J[4, 4:7] = [-p9, p2, p2]
    J[5, 3:8] = [p11, p1, -p10 * y8 - p2, p11, -p10 * y6]
    J[6, 5:8] = [p10 * y8, -p12, p10 * y6]
    J[7, 5:8] = [-p10 * y8, p12, -p10 * y6]
    return J


def hires_fp(t, y, p):
    y1, y2, y3, y4, y5, y6, y7, y8 = y
    F = np.zeros((8, 12), dtype=np.result_type(y, p, float))
    F[[0, 1, 3, 5], 0] = [-y1, y1, y3, y5]          # p1
    F[[0, 2, 4, 5], 1] = [y2, y4, y6 + y7, -y6]     # p2
    F[[0, 3], 2] = [y3, y2]                         # p3
    F[0, 3] = 1                                     # p4
    F[1, 4] = -y2                                   # p5
    F[2, 5] = -y3                                   # p6
    F[2, 6] = y5                                    # p7
    F[3, 7] = -y4                                   # p8
    F[4, 8] = -y5                                   # p9
    F[5:8, 9] = [-y6 * y8, y6 * y8, -y6 * y8]       # p10
    F[5, 10] = y4 + y7                              # p11
    F[6:8, 11] = [-y7, y7]                          # p12
    return F


def orego_f(t, y, p):
    s, q, w = p
    return _vec([s * (y[1] + y[0] * (1 - q * y[0] - y[1])),
                 (y[2] - (1 + y[0]) * y[1]) / s,
                 w * (y[0] - y[2])])


def orego_jac(t, y, p):
    s, q, w = p
    return np.array([[s * (1 - 2 * q * y[0] - y[1]), s * (1 - y[0]), 0 * s],
                     [-y[1] / s, -(1 + y[0]) / s, 1 / s],
                     [w, 0 * w, -w]], dtype=np.result_type(y, p, float))


def orego_fp(t, y, p):
    s, q, w = p
    return np.array([[y[1] + y[0] * (1 - q * y[0] - y[1]), -s * y[0] * y[0], 0 * s],
                     [-(y[2] - (1 + y[0]) * y[1]) / (s * s), 0 * s, 0 * s],
                     [0 * s, 0 * s, y[0] - y[2]]], dtype=np.result_type(y, p, float))


# POLLU: reaction j (1-based) has rate r_j = k_j * y[a] (* y[b]), 1-based species indices as
# in pollu.f, multiplied left to right (k_j * y_a) * y_b.
POLLU_REACTANTS = [(1,), (2, 4), (5, 2), (7,), (7,), (7, 6), (9,), (9, 6), (11, 2), (11, 1),
                   (13,), (10, 2), (14,), (1, 6), (3,), (4,), (4,), (16,), (16,), (17, 6),
                   (19,), (19,), (1, 4), (19, 1), (20,)]
# dy_i/dt as signed 1-based reaction indices, summed left to right as in pollu.f.
POLLU_SUMS = [
    (-1, -10, -14, -23, -24, 2, 3, 9, 11, 12, 22, 25),
    (-2, -3, -9, -12, 1, 21),
    (-15, 1, 17, 19, 22),
    (-2, -16, -17, -23, 15),
    (-3, 4, 4, 6, 7, 13, 20),
    (-6, -8, -14, -20, 3, 18, 18),
    (-4, -5, -6, 13),
    (4, 5, 6, 7),
    (-7, -8),
    (-12, 7, 9),
    (-9, -10, 8, 11),
    (9,),
    (-11, 10),
    (-13, 12),
    (14,),
    (-18, -19, 16),
    (-20,),
    (20,),
    (-21, -22, -24, 23, 25),
    (-25, 24),
]
# Stoichiometric matrix N (20 x 25): f = N r.
POLLU_N = np.zeros((20, 25))
for _i, _terms in enumerate(POLLU_SUMS):
    for _s in _terms:
        POLLU_N[_i, abs(_s) - 1] += 1.0 if _s > 0 else -1.0


def _signed_sum(r, terms):
    acc = r[terms[0] - 1] if terms[0] > 0 else -r[-terms[0] - 1]
    for s in terms[1:]:
        acc = acc + r[s - 1] if s > 0 else acc - r[-s - 1]
    return acc


def pollu_rates(y, k):
    r = []
    for j, a in enumerate(POLLU_REACTANTS):
        v = k[j] * y[a[0] - 1]
        if len(a) == 2:
            v = v * y[a[1] - 1]
        r.append(v)
    return r


def pollu_f(t, y, k):
    r = pollu_rates(y, k)
    return _vec([_signed_sum(r, terms) for terms in POLLU_SUMS])


def pollu_jac(t, y, k):
    D = np.zeros((25, 20), dtype=np.result_type(y, k, float))  # dr/dy
    for j, a in enumerate(POLLU_REACTANTS):
        if len(a) == 1:
            D[j, a[0] - 1] += k[j]
        else:
            D[j, a[0] - 1] += k[j] * y[a[1] - 1]
            D[j, a[1] - 1] += k[j] * y[a[0] - 1]
    return POLLU_N @ D


def pollu_fp(t, y, k):
    m = np.array([y[a[0] - 1] * (y[a[1] - 1] if len(a) == 2 else 1.0) for a in POLLU_REACTANTS])
    return POLLU_N * m[None, :]  # dr_j/dk_j = product of reactants


ROBERTSON_P = [0.04, 3e7, 1e4]
HIRES_P = [1.71, 0.43, 8.32, 0.0007, 8.75, 10.03, 0.035, 1.12, 1.745, 280.0, 0.69, 1.81]
OREGO_P = [77.27, 8.375e-6, 0.161]
POLLU_P = [.35e0, .266e2, .123e5, .86e-3, .82e-3, .15e5, .13e-3, .24e5, .165e5, .9e4,
           .22e-1, .12e5, .188e1, .163e5, .48e7, .35e-3, .175e-1, .1e9, .444e12, .124e4,
           .21e1, .578e1, .474e-1, .178e4, .312e1]
POLLU_Y0 = [0.0] * 20
for _i, _v in ((2, 0.2), (4, 0.04), (7, 0.1), (8, 0.3), (9, 0.01), (17, 0.007)):
    POLLU_Y0[_i - 1] = _v

# IVPtestset reference solutions (solut() of hires.f, orego.f, pollu.f; rober from
# deTestSet's ex_reference.R), for the check lines only.
TESTSET_REF = {
    "robertson_long": [0.2083340149701255e-7, 0.8333360770334713e-13, 0.9999999791665050],
    "hires": [0.7371312573325668e-3, 0.1442485726316185e-3, 0.5888729740967575e-4,
              0.1175651343283149e-2, 0.2386356198831331e-2, 0.6238968252742796e-2,
              0.2849998395185769e-2, 0.2850001604814231e-2],
    "orego": [0.1000814870318523e1, 0.1228178521549917e4, 0.1320554942846706e3],
    "pollu": [0.5646255480022769e-01, 0.1342484130422339e+00, 0.4139734331099427e-08,
              0.5523140207484359e-02, 0.2018977262302196e-06, 0.1464541863493966e-06,
              0.7784249118997964e-01, 0.3245075353396018e+00, 0.7494013383880406e-02,
              0.1622293157301561e-07, 0.1135863833257075e-07, 0.2230505975721359e-02,
              0.2087162882798630e-03, 0.1396921016840158e-04, 0.8964884856898295e-02,
              0.4352846369330103e-17, 0.6899219696263405e-02, 0.1007803037365946e-03,
              0.1772146513969984e-05, 0.5682943292316392e-04],
}

# atol of the reference solves. robertson: y2 falls to ~7e-8 (t = 1e5) and ~8e-14
# (t = 1e11), y1 to ~2e-8: 1e-26 keeps every component under relative control. vdp: the
# end state is sensitive to the timing of the relaxation jumps; atol 1e-13 moved y(t1) by
# ~1e-12, 1e-16 and 1e-20 agree to ~1e-13. hires: components ~1e-5..1e-3. orego:
# components >= ~1. pollu: y16 ~ 4e-18 at t1, so 1e-20 (gives 1.7e-14 from the IVPtestset
# solution including y16, against 6e-13 for atol 1e-14).
ATOL_REF = {"robertson": 1e-26, "robertson_long": 1e-26, "vdp": 1e-16, "hires": 1e-17,
            "orego": 1e-13, "pollu": 1e-20}

# State atol of the sensitivity runs (column j of S gets atol / |p_j|). robertson's 1e-26
# is too small there: rounding noise in the S entries then keeps Radau's Newton iteration
# from converging (thousands of rejected steps); 1e-20 and 1e-16 give gradients that agree
# to ~2e-12, and Radau at rtol 1e-12 and 1e-13 agree to ~2e-14 with 1e-20.
ATOL_SENS = {"robertson": 1e-20, "hires": 1e-17}

# Benchmark atol = rtol * scale. SciMLBenchmarks uses abstol = 1e-3 * reltol for all of these;
# robertson takes 1e-6 instead (y2 ~ 7e-8 at t = 1e5 and <= 3.7e-5 throughout), and
# robertson_long 1e-10 (y1 ~ 2e-8, y2 ~ 8e-14 at t = 1e11).
BENCH_ATOL_SCALE = {"robertson": 1e-6, "robertson_long": 1e-10, "vdp": 1e-3, "hires": 1e-3,
                    "orego": 1e-3, "pollu": 1e-3}


class Problem:
    def __init__(self, name, f, jac, fp, y0, p, t1, w=None):
        self.name, self.f, self.jac, self.fp = name, f, jac, fp
        self.y0 = np.array(y0, dtype=float)
        self.p = np.array(p, dtype=float)
        self.t1 = float(t1)
        self.w = None if w is None else np.array(w, dtype=float)
        self.n, self.np = self.y0.size, self.p.size
        self.atol = ATOL_REF[name]
        self.bench_scale = BENCH_ATOL_SCALE[name]
        self.testset = TESTSET_REF.get(name)


PROBLEMS = [
    Problem("robertson", robertson_f, robertson_jac, robertson_fp, [1.0, 0.0, 0.0],
            ROBERTSON_P, 1e5, w=[1.0, 1e4, 0.5]),
    Problem("robertson_long", robertson_f, robertson_jac, robertson_fp, [1.0, 0.0, 0.0],
            ROBERTSON_P, 1e11),
    Problem("vdp", vdp_f, vdp_jac, vdp_fp, [2.0, 0.0], [1000.0], 3000.0),
    Problem("hires", hires_f, hires_jac, hires_fp, [1, 0, 0, 0, 0, 0, 0, 0.0057], HIRES_P,
            321.8122, w=[i + 1.0 for i in range(8)]),
    Problem("orego", orego_f, orego_jac, orego_fp, [1.0, 2.0, 3.0], OREGO_P, 360.0),
    Problem("pollu", pollu_f, pollu_jac, pollu_fp, POLLU_Y0, POLLU_P, 60.0),
]


# ---- helpers --------------------------------------------------------------------------

def fmt(v):
    return "%.17g" % v


def rec(out, prob, field, values):
    out.append(" ".join([prob.name, field] + [fmt(v) for v in np.atleast_1d(values)]))


def max_rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b) / np.abs(b)))


def solve(prob, method, rtol, atol, p=None):
    p = prob.p if p is None else p
    return solve_ivp(prob.f, (0.0, prob.t1), prob.y0, method=method, rtol=rtol, atol=atol,
                     args=(p,), jac=prob.jac)


def complex_step_check(prob, y):
    """Max relative difference of the analytic J and df/dp from complex-step derivatives."""
    h = 1e-30
    J = prob.jac(0.0, y, prob.p)
    Fp = prob.fp(0.0, y, prob.p)
    Jc = np.empty_like(J)
    for k in range(prob.n):
        yc = y.astype(complex)
        yc[k] += 1j * h
        Jc[:, k] = prob.f(0.0, yc, prob.p).imag / h
    Fc = np.empty_like(Fp)
    for j in range(prob.np):
        pc = prob.p.astype(complex)
        pc[j] += 1j * h
        Fc[:, j] = prob.f(0.0, y, pc).imag / h
    rel = lambda a, b: float(np.max(np.where(b == 0, np.abs(a), np.abs(a - b) / np.where(b == 0, 1.0, np.abs(b)))))
    dj, dp = rel(J, Jc), rel(Fp, Fc)
    return dj, dp


def sens_rhs(t, z, prob):
    n, m, p = prob.n, prob.np, prob.p
    y, S = z[:n], z[n:].reshape(n, m)
    return np.concatenate([prob.f(t, y, p), (prob.jac(t, y, p) @ S + prob.fp(t, y, p)).ravel()])


def sens_jac(t, z, prob):
    n, m, p = prob.n, prob.np, prob.p
    y, S = z[:n], z[n:].reshape(n, m)
    J = prob.jac(t, y, p)
    A = np.zeros((n + n * m, n + n * m))
    A[:n, :n] = J
    A[n:, n:] = np.kron(J, np.eye(m))
    h = 1e-30
    for k in range(n):  # d(J S + df/dp)/dy_k by complex step (f is polynomial in y)
        yc = y.astype(complex)
        yc[k] += 1j * h
        A[n:, k] = ((prob.jac(t, yc, p) @ S + prob.fp(t, yc, p)).imag / h).ravel()
    return A


def solve_sens(prob, method, rtol):
    n, m = prob.n, prob.np
    z0 = np.concatenate([prob.y0, np.zeros(n * m)])
    a = ATOL_SENS[prob.name]
    atol = np.concatenate([np.full(n, a), np.tile(a / np.abs(prob.p), n)])
    sol = solve_ivp(sens_rhs, (0.0, prob.t1), z0, method=method, rtol=rtol, atol=atol,
                    args=(prob,), jac=sens_jac)
    assert sol.success, (prob.name, method, sol.message)
    z = sol.y[:, -1]
    return z[:n], z[n:].reshape(n, m), sol


# ---- main -----------------------------------------------------------------------------

def print_f0():
    for prob in PROBLEMS:
        print(" ".join([prob.name, "f0"] + [fmt(v) for v in prob.f(0.0, prob.y0, prob.p)]))


def main():
    t_start = time.time()
    out = []
    out.append("# Stiff ODE reference data for nabla's tests (tests/ode). Made by:")
    out.append("#   build/peers/bin/python tests/ode/oracle/gen_stiff.py > tests/ode/oracle/stiff_ref.txt")
    out.append(f"# python {platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}, "
               "float64. Problem definitions, sources and line formats: the script's docstring.")
    out.append(f"# Reference: solve_ivp(method='Radau', rtol={RTOL_REF:g}, atol=atol_ref, jac=analytic). "
               "Check lines give max_i |y_i - y1_i| / |y1_i| of other solves against it.")
    out.append("# Records: <problem> t1|y0|p|atol_ref|y1|w|grad|y1_sens|bench_atol_scale ... ; "
               "<problem> scipy <method> <rtol> <steps> <nfev> <njev> <nlu> <maxrelerr>")
    for prob in PROBLEMS:
        t0 = time.time()
        out.append(f"# ---- {prob.name}: n = {prob.n}, np = {prob.np}")
        rec(out, prob, "t1", prob.t1)
        rec(out, prob, "y0", prob.y0)
        rec(out, prob, "p", prob.p)
        rec(out, prob, "atol_ref", prob.atol)
        ref = solve(prob, "Radau", RTOL_REF, prob.atol)
        assert ref.success, (prob.name, ref.message)
        y1 = ref.y[:, -1]
        rec(out, prob, "y1", y1)

        dj0, dp0 = complex_step_check(prob, prob.y0)
        dj1, dp1 = complex_step_check(prob, y1)
        assert max(dj0, dp0, dj1, dp1) < 1e-12, (prob.name, dj0, dp0, dj1, dp1)
        out.append(f"# {prob.name} jacobian check (analytic vs complex step; at y0, at y1): "
                   f"df/dy {dj0:.2g}, {dj1:.2g}; df/dp {dp0:.2g}, {dp1:.2g}")
        out.append(f"# {prob.name} reference run: {ref.t.size - 1} steps, nfev {ref.nfev}, "
                   f"njev {ref.njev}, nlu {ref.nlu}")
        checks = []
        for method in ("Radau", "BDF", "LSODA"):
            c = solve(prob, method, RTOL_CHECK, prob.atol)
            if c.success:
                checks.append(f"{method} rtol {RTOL_CHECK:g}: {max_rel(c.y[:, -1], y1):.2g}")
            else:
                checks.append(f"{method} rtol {RTOL_CHECK:g}: failed at t = {c.t[-1]:.6g} ({c.message})")
        if prob.testset is not None:
            checks.append(f"IVPtestset reference: {max_rel(y1, prob.testset):.2g}")
        out.append(f"# {prob.name} check y1 vs " + "; ".join(checks))

        if prob.w is not None:
            rec(out, prob, "w", prob.w)
            out.append(f"# {prob.name} sensitivity runs: atol {ATOL_SENS[prob.name]:g} for y, "
                       f"{ATOL_SENS[prob.name]:g} / |p_j| for dy/dp_j")
            ys, S, ssol = solve_sens(prob, "Radau", RTOL_SENS)
            grad = prob.w @ S
            rec(out, prob, "grad", grad)
            rec(out, prob, "y1_sens", ys)
            _, S13, _ = solve_sens(prob, "Radau", RTOL_REF)
            _, Sb, _ = solve_sens(prob, "BDF", RTOL_SENS)
            loss = lambda q: float(prob.w @ solve(prob, "Radau", RTOL_REF, prob.atol, p=q).y[:, -1])
            fd = np.empty(prob.np)
            for j in range(prob.np):
                h = FD_REL_STEP * abs(prob.p[j])
                qp, qm = prob.p.copy(), prob.p.copy()
                qp[j] += h
                qm[j] -= h
                fd[j] = (loss(qp) - loss(qm)) / (qp[j] - qm[j])
            out.append(f"# {prob.name} sensitivity run: {ssol.t.size - 1} steps; y1_sens vs y1: "
                       f"{max_rel(ys, y1):.2g}")
            out.append(f"# {prob.name} check grad vs Radau rtol {RTOL_REF:g}: {max_rel(prob.w @ S13, grad):.2g}; "
                       f"BDF rtol {RTOL_SENS:g}: {max_rel(prob.w @ Sb, grad):.2g}; "
                       f"central differences (h = {FD_REL_STEP:g} |p_j|): {max_rel(fd, grad):.2g}")

        rec(out, prob, "bench_atol_scale", prob.bench_scale)
        for rtol in BENCH_RTOLS:
            for method in ("Radau", "BDF"):
                s = solve(prob, method, rtol, rtol * prob.bench_scale)
                err = max_rel(s.y[:, -1], y1) if s.success else float("nan")
                if not s.success:
                    out.append(f"# {prob.name} scipy {method} {rtol:g} failed at t = {s.t[-1]:.6g}: {s.message}")
                out.append(f"{prob.name} scipy {method} {rtol:g} {s.t.size - 1} {s.nfev} {s.njev} "
                           f"{s.nlu} {fmt(err)}")
        print(f"{prob.name}: {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    print(f"total: {time.time() - t_start:.1f} s", file=sys.stderr)
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--f0"]:
        print_f0()
    else:
        main()

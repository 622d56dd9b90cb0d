/*
 * nabla/ode.h -- differential equations: Diffrax's diffeqsolve in C.
 *
 * nb_diffeqsolve solves dy/dt = f(t, y, args) from t0 to t1 inside a trace, written with
 * the traced ops and the loops of nabla/loops.h: it jits and differentiates like any other
 * function (with respect to y0, to args' array leaves and to vars the term closes over).
 *
 *   term        an nb_fn (nb_fn_create, or nb_jit of one) called on the tuple (t, y, args):
 *               t a 0-d var of the state's dtype, y a tree of y0's structure, args the args
 *               tree; it returns dy/dt as a tree of y0's structure, dtypes and shapes.
 *   y0          a tree of float vars, all of one dtype (f32 or f64): the state's dtype,
 *               which is also the dtype of t.
 *   args        a tree (vars, static leaves, nulls; may be NULL), passed through to the term.
 *   t0, t1, dt0 static times (a change retraces); t1 < t0 integrates backwards in time
 *               (dt0 then has the sign of t1 - t0, as in Diffrax). dt0 = 0
 *               with an adaptive controller picks the first step automatically: Hairer's
 *               algorithm, as Diffrax's PIDController implements it for a plain ODETerm
 *               (Diffrax 0.7.2's diffeqsolve never reaches it -- it hands the controller a
 *               wrapped term and starts from 0.01 -- so its dt0=None runs start at 0.01).
 *
 * Solvers: explicit Runge-Kutta with their Butcher tableaus (src/ode/tableau.c). The
 * embedded error estimates of heun, midpoint, ralston (Euler), bosh3, dopri5, tsit5 and
 * dopri8 drive the adaptive controller; euler and rk4 have none (constant steps only).
 * Dense output uses each method's own interpolant (dopri5 and tsit5: order 5; dopri8:
 * Diffrax's, order 6) or the cubic Hermite interpolant through both ends' states and
 * derivatives f(t0, y0), f(t1, y1) (euler, heun, midpoint, ralston, bosh3, rk4: as accurate
 * as the method, orders 1, 2, 2, 2, 3, 4). Diffrax differs for four of these: its euler
 * interpolates linearly, and its heun, midpoint and ralston use an inner stage as the end
 * slope (the same orders, other values). Saving at given times never changes the steps
 * taken (Diffrax's steps, bit for bit in count: tests/ode/test_ode.c).
 *
 * Stiff solvers (tests/ode/test_stiff.c: Robertson, Van der Pol mu = 1e3, HIRES, OREGO and
 * POLLU against SciPy's Radau at rtol 1e-13; gradients against forward sensitivities):
 *   Rosenbrock methods -- linearly implicit: one LU of W per step, no Newton iteration:
 *     rodas5p (Steinebach's, order 5, dense output of order 4; the first choice at rtol
 *     1e-5..1e-10 on small and medium systems), ros3p (Lang-Verwer, order 3, A-stable),
 *     rosenbrock23 (Shampine's ode23s, order 2, L-stable; loose tolerances);
 *   ESDIRK (Diffrax's tableaus and predictors): implicit_euler, kvaerno3/4/5, and the
 *     additive kencarp3/4/5 for dy/dt = f_E + f_I with opts.explicit_term as f_E;
 *   The BDF -- bdf: variable order 1..5 and variable step in the quasi-constant step-size
 *     form of Shampine's ode15s and SciPy's BDF (its NDF coefficients and order choice):
 *     the history of backward differences is re-expressed when the step size changes, the
 *     order chosen (k - 1, k or k + 1) after k + 1 steps of one size; one chord Newton solve
 *     per step (below); dense output: the step's polynomial through the last k + 1 points.
 *     Adaptive controllers only (its steps and orders are its own; the controller gives the
 *     tolerances, dtmin and dtmax). Few function evaluations per step: for long stiff
 *     transients and larger systems (Robertson to t = 1e11: 841 steps at rtol 1e-6).
 * The Jacobian J = df/dy (and df/dt for Rosenbrock) comes from nabla's forward mode over the
 * term: one tangent sweep per state element, never written by the user (who may give one:
 * opts.jacobian); no Jacobian structure (sparsity, bands) is exploited. ESDIRK stages are
 * solved by a simplified ("very chord") Newton iteration: J at the step's start (the BDF's:
 * at its predicted point), I - h gamma J (the BDF: I - h / alpha_k J) factored once per
 * step and reused by every stage and iteration; converged when, after two iterations, the
 * contraction rate r < 1 and r / (1 - r) |dz| <= 0.01 in the controller's scaled norm (or
 * at once when |dz| <= 1e-4); failed at a rate >= 1, a non-finite norm or 10 iterations.
 * A failed iteration or a singular W rejects the step, which the controller shrinks (as a
 * non-finite error); with constant steps, or below dtmin, the solve ends with
 * NB_ODE_NEWTON_FAILED. The Jacobian is re-evaluated every step and the LU reused by all the
 * step's stages and iterations. Keeping J across steps as CVODES does (refreshed after 20
 * steps or a failed iteration) was built and measured slower here, 1.1-2x on the stiff test
 * set (N <= 20): forward mode's N + 1 tangent sweeps run fused in native code and cost less
 * than the extra chord iterations and rejected steps of an old J.
 * Derivatives through a stiff step: Rosenbrock steps are explicit formulas (their
 * derivatives include J's); a Newton stage is differentiated by the implicit function
 * theorem -- one solve with the stage's exact Jacobian, transposed in reverse mode -- and
 * never through its iterations (its extra work is done only when a derivative is taken).
 * The explicit solvers that are FSAL (bosh3, dopri5, tsit5, dopri8) watch for stiffness:
 * stats.stiffness_suspected is 1 once their step size has been held by stability (Hairer's
 * test, 15 kept steps past the stability boundary), and a failure message then names the
 * stiff solvers.
 *
 * Step-size control: constant steps of dt0, or Diffrax's PID controller with its defaults
 * (pcoeff 0, icoeff 1, dcoeff 0: an I controller; factormin 0.2, factormax 10, safety 0.9).
 * The error norm is the RMS over every element of the state tree of
 * err / (atol + rtol max(|y0|, |y1|)); a step is kept when it is < 1 (or when dt is at dtmin
 * and force_dtmin). The step-size factor is not differentiated (as Diffrax): derivatives
 * are those of the solve with its steps held fixed.
 *
 * Adjoints (how reverse mode goes through the solve):
 *   NB_ADJOINT_RECURSIVE_CHECKPOINT  (default) the solve's while loop is checkpointed
 *       (NB_LOOP_CHECKPOINTED): memory bounded by `checkpoints` states (0: Equinox's default
 *       for max_steps), the gradient exactly that of the discrete solve;
 *   NB_ADJOINT_DIRECT                the loop is bounded (NB_LOOP_BOUNDED): every step
 *       stored on a tape of max_steps rows (memory, and a per-call cost, that grow with
 *       max_steps, as Diffrax's DirectAdjoint); no recomputation; the same gradient bits
 *       as the recursive checkpoint;
 *   NB_ADJOINT_BACKSOLVE             the continuous adjoint: reverse mode solves the
 *       augmented system (y, a, a_args) backwards from t1 to t0 with its own solver and
 *       tolerances (NB_ADJOINT_BACKSOLVE's solver and controller; by default the forward
 *       ones). O(1) memory in the number of steps; the gradient approximates the exact one
 *       to the tolerances. SaveAt t1 only; state, args and the term's bound data float
 *       leaves of one dtype; forward mode (jvp) through it is an error (custom_vjp). Any
 *       solver may solve the adjoint system, the stiff ones included -- but y is rebuilt
 *       backwards in time, which is unstable for stiff dissipative problems (Robertson's
 *       fast modes grow backwards): there the adjoint's solve fails (NaN cotangents, or
 *       the error with throw_on_failure) -- use NB_ADJOINT_INTERPOLATED;
 *   NB_ADJOINT_INTERPOLATED          the continuous adjoint for stiff problems (CVODES's
 *       and SciML's InterpolatingAdjoint's idea): the forward solve keeps every accepted
 *       step's state (max_steps + 1 rows of y0's size), and reverse mode integrates only
 *       (a, a_args) from t1 back to t0, with y(t) interpolated between kept states by
 *       Hermite polynomials in (y, f): after a stiff forward solver the cubic of the step
 *       holding t (2 extra term calls per evaluation of the adjoint's vector field), after
 *       an explicit one the quintic through that step and its neighbour (3 calls; as
 *       accurate as 5th-order steps, but worse where h |lambda| >> 1). y is never
 *       integrated backwards, so a stiff problem's adjoint is as stable as its forward
 *       solve; a stiff solver integrates it (nb_ode_adjoint.solver, by default the forward
 *       one). The gradient approximates the exact one to the tolerances and the
 *       interpolant's accuracy (measured: within 7e-8 relative of SciPy's forward
 *       sensitivities on Robertson and HIRES at rtol 1e-10 for rodas5p, kvaerno4/5,
 *       kencarp5 and the BDF; 4e-7 on y' = -k y at rtol 1e-9) -- but not at loose
 *       tolerances, where few long steps make the interpolant coarse (Robertson with
 *       rodas5p: 0.46 at rtol 1e-4, 1.9e-3 at 1e-6; the BDF 1.3e-4 and 4.9e-5): use it at
 *       rtol <= 1e-8, or a discrete adjoint. Its cost has a part that grows with max_steps
 *       (the kept states are max_steps + 1 rows, written and read every call: about 0.1 s
 *       with max_steps 1e6), so set max_steps near what the solve needs. Restrictions as
 * backsolve's (SaveAt t1; one float dtype; no jvp; no events, traced times, explicit_term or
 *       jacobian); a failed forward solve gives NaN cotangents.
 *
 * The solution is a dict (owned by the trace):
 *   ts       [n] save times (the state's dtype)
 *   ys       y0's structure, each leaf with a leading axis of n rows
 *   result   i32[]: an nb_ode_result
 *   t_final  the time the solve reached (t1 when successful; the event time after an event)
 *   stats    dict(num_steps, num_accepted_steps, num_rejected_steps, stiffness_suspected):
 *            i32[] each (stiffness_suspected 0 or 1, above)
 *   event    i32[]: the index of the event condition that ended the solve, -1 if none
 *            (opts.event, below)
 * with n = 1 for SaveAt t1 (row 0 = y(t1)), n = n_ts for SaveAt ts, and n = max_steps for
 * SaveAt steps: row i is the state after accepted step i, rows from num_accepted_steps on
 * hold +inf in ts and ys (as Diffrax). A failed solve (result != successful) never hangs:
 * the loop runs at most max_steps steps; its rows that were not reached hold +inf, and
 * with SaveAt t1 row 0 holds the state at t_final. With opts.throw_on_failure the
 * enclosing function's call instead fails with NB_ERR_RUNTIME and a message naming the
 * result and the time reached -- also when only derivatives of the solution are computed
 * (nb_grad). A derivative through a failed solve is that of what was computed (recursive
 * checkpoint, direct); a continuous adjoint's own backward solve, if it fails, gives NaN
 * cotangents (or NB_ERR_RUNTIME with throw_on_failure), never a wrong number.
 *
 * Under nb_vmap (a batch of solves: parameters or initial states per lane) every lane
 * takes its own steps with its own step sizes and gets its own result code and stats, bit
 * for bit its own solve's (a lane that hits max_steps says so alone); the batched loop
 * runs until the last lane is done, the finished lanes' state frozen (their discarded
 * steps are of size 2^-20 max(|t|, 1), never 0: every solver stays finite there, and
 * reverse mode's per-lane gradients with it). Tested for the explicit solvers and rodas5p,
 * kvaerno5 and the BDF, SaveAt t1 and ts, recursive checkpoint adjoint
 * (tests/loops/test_vmap_loops.c); 1,000 Lotka-Volterra lanes in bench_vmap.
 *
 * Errors while tracing (sticky, nabla/trace.h): a term that is not a plain or jitted
 * function, or returns a tree that differs from y0's (naming the first differing path,
 * dtype and shape); y0 leaves that are not float vars of one dtype; bad options
 * (NB_ERR_INVALID naming the option and the fix: rk4 or euler with an adaptive controller,
 * dt0 = 0 with constant steps, dt0 pointing away from t1, unsorted ts or ts outside
 * [t0, t1], max_steps < 1, a continuous adjoint with SaveAt ts or steps).
 */
#ifndef NABLA_ODE_H
#define NABLA_ODE_H

#include "core.h"
#include "fn.h"
#include "trace.h"
#include "tree.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nb_ode_solver {
    NB_ODE_EULER = 0,    /* order 1, no error estimate */
    NB_ODE_HEUN = 1,     /* order 2, embedded Euler */
    NB_ODE_MIDPOINT = 2, /* order 2, embedded Euler */
    NB_ODE_RALSTON = 3,  /* order 2, embedded Euler */
    NB_ODE_BOSH3 = 4,    /* Bogacki-Shampine 3(2), FSAL */
    NB_ODE_RK4 = 5,      /* classical order 4, no error estimate */
    NB_ODE_DOPRI5 = 6,   /* Dormand-Prince 5(4), FSAL */
    NB_ODE_TSIT5 = 7,    /* Tsitouras 5(4), FSAL */
    NB_ODE_DOPRI8 = 8,   /* Prince-Dormand 8(7) (RK8(7)13M + FSAL stage, as Diffrax's) */
    /* stiff problems: linearly implicit (Rosenbrock) methods, see "Stiff solvers" above */
    NB_ODE_ROS3P = 9,    /* Lang-Verwer ROS3P: order 3 (2), 3 stages, A-stable */
    NB_ODE_RODAS5P = 10, /* Steinebach's Rodas5P: order 5 (4), 8 stages, L-stable */
    /* stiff problems: implicit Runge-Kutta (ESDIRK, Diffrax's tableaus), Newton inside */
    NB_ODE_IMPLICIT_EULER = 11, /* order 1, error estimate of order 2 (as Diffrax's) */
    NB_ODE_KVAERNO3 = 12,       /* Kvaerno 3(2), 4 stages, L-stable */
    NB_ODE_KVAERNO4 = 13,       /* Kvaerno 4(3), 5 stages, L-stable */
    NB_ODE_KVAERNO5 = 14,       /* Kvaerno 5(4), 7 stages, L-stable */
    /* split (IMEX) problems dy/dt = f_E + f_I: the term is the stiff part f_I, solved
     * implicitly; opts.explicit_term the non-stiff part f_E, evaluated explicitly (Diffrax's
     * MultiTerm(ODETerm(f_E), ODETerm(f_I))). Without an explicit term f_E = 0. */
    NB_ODE_KENCARP3 = 15, /* Kennedy-Carpenter ARK 3(2), 4 stages */
    NB_ODE_KENCARP4 = 16, /* ARK 4(3), 6 stages */
    NB_ODE_KENCARP5 = 17, /* ARK 5(4), 8 stages */
    /* stiff, low order: Shampine's L-stable W-method (MATLAB's ode23s), order 2 with an
     * order-3 error estimate (rtol ~1e-2..1e-4) */
    NB_ODE_ROSENBROCK23 = 18,
    /* stiff, larger systems: variable-order (1-5), variable-step BDF in the quasi-constant
     * step-size form of Shampine's ode15s / SciPy's BDF (adaptive controller only; see
     * "The BDF" above) */
    NB_ODE_BDF = 19
} nb_ode_solver;

/* "euler", "heun", ... ("unknown" otherwise). */
NB_API const char *nb_ode_solver_name(nb_ode_solver solver);
/* The order of the solver's solution (0 for an unknown solver). */
NB_API int nb_ode_solver_order(nb_ode_solver solver);

typedef struct nb_ode_controller {
    bool adaptive;                 /* false: constant steps of dt0 */
    double rtol, atol;             /* adaptive: the tolerances (both > 0, or one of them 0) */
    double pcoeff, icoeff, dcoeff; /* Diffrax's PID coefficients: 0, 1, 0 */
    double factormin, factormax;   /* bounds of the step-size factor: 0.2, 10 */
    double safety;                 /* 0.9 */
    double dtmin, dtmax;           /* bounds of |dt|; 0: none */
    bool force_dtmin;              /* at dtmin, keep the step instead of failing */
} nb_ode_controller;

/* Constant steps. */
NB_API nb_ode_controller nb_ode_constant_step(void);
/* A PID controller with Diffrax's defaults and the given tolerances. */
NB_API nb_ode_controller nb_ode_pid(double rtol, double atol);

typedef enum nb_saveat_kind {
    NB_SAVEAT_T1 = 0,   /* the state at t1 only (default) */
    NB_SAVEAT_TS = 1,   /* the states at the given times (dense output) */
    NB_SAVEAT_STEPS = 2 /* the state after every accepted step */
} nb_saveat_kind;

typedef struct nb_ode_saveat {
    nb_saveat_kind kind;
    const double *ts; /* NB_SAVEAT_TS: n_ts times, monotone in the direction of t0 -> t1 and
                         within [t0, t1] (copied into the trace: static data) */
    int64_t n_ts;
} nb_ode_saveat;

typedef enum nb_ode_adjoint_kind {
    NB_ADJOINT_RECURSIVE_CHECKPOINT = 0,
    NB_ADJOINT_DIRECT = 1,
    NB_ADJOINT_BACKSOLVE = 2,
    NB_ADJOINT_INTERPOLATED = 3
} nb_ode_adjoint_kind;

typedef struct nb_ode_adjoint {
    nb_ode_adjoint_kind kind;
    int64_t checkpoints; /* recursive checkpoint: 0 (default) for Equinox's default */
    /* backsolve, interpolated: the adjoint system's solver and controller; solver -1
     * (default) means the
     * forward solver, and a controller with adaptive == false and rtol == 0 the forward
     * controller. */
    int solver;
    nb_ode_controller controller;
} nb_ode_adjoint;

typedef struct nb_ode_opts {
    nb_ode_solver solver;         /* default NB_ODE_TSIT5 */
    double t0, t1, dt0;           /* default 0, 1, 0 */
    nb_ode_saveat saveat;         /* default t1 */
    nb_ode_controller controller; /* default constant steps */
    nb_ode_adjoint adjoint;       /* default recursive checkpoint */
    int64_t max_steps;            /* default 4096: steps tried, accepted or rejected */
    bool throw_on_failure;        /* default false: report through result */
    /* Traced times (default NULL: the static t0, t1 and saveat.ts above). A 0-d float var of
     * the trace for t0 or t1, and for SaveAt ts a rank-1 float var of n_ts times (saveat.kind
     * NB_SAVEAT_TS; saveat.ts and n_ts are then ignored): new values run the same compiled
     * solve -- no retrace -- and derivatives reach them (through the first and last steps and
     * the dense output, the step sizes held fixed as for every derivative of the solve). The
     * direction of integration is still the static one, sign(t1 - t0) of the doubles above
     * (0 and 1 by default: forwards); at run time the traced values must go that way and
     * the ts lie sorted within [t0, t1], or the call fails with NB_ERR_RUNTIME naming the
     * values. Not with a continuous adjoint (backsolve, interpolated). Cast to the state's dtype.
     */
    nb_var *t0_traced, *t1_traced, *ts_traced;
    /* The explicit (non-stiff) part f_E of dy/dt = f_I + f_E, the term being f_I (default
     * NULL: none). A function like the term (nb_fn_create or nb_jit of one), called on the
     * same (t, y, args). The KenCarp solvers evaluate it explicitly and solve only f_I
     * implicitly; every other solver integrates the sum. Borrowed for the call. Not with a
     * continuous adjoint (backsolve, interpolated). */
    nb_fn *explicit_term;
    /* Events (default NULL: none; Diffrax's Event, CVODES's rootfinding): a function like the
     * term, called on the same (t, y, args), returning one 0-d var or a tuple or list of them
     * -- one condition each (float; a bool counts as +1 when true, -1 when false). A
     * condition fires when its sign changes over a kept step: from > 0 to <= 0 or from < 0 to
     * >= 0 (in the direction of integration); starting at exactly 0 is not a change. The solve
     * then stops at the event (terminal events): the first time within the step at which a
     * condition fires, located by bisection on the step's dense output to event_tol, the
     * bracket's end on the far side kept (there the condition has changed sign, or is 0: a
     * solve restarted from the event state with event_direction set does not fire again at
     * once). t_final is the event time, SaveAt t1's row the state there (with SaveAt ts, the
     * ys rows of times past it stay +inf, as rows never reached), result successful, and the
     * solution's "event" the index
     * of the condition that fired (the lowest of those firing first), -1 if none did.
     * Derivatives reach the event time by the implicit function theorem,
     * dt* = -(dc/dp) / (dc/dt) along the solution (0 for a bool condition or a tangential
     * crossing, dc/dt = 0), and the state at the event through it. Each step tried evaluates
     * the conditions once more (at its end);
     * the bisection and the event time's derivative only run at the step where one fires. */
    nb_fn *event;
    /* NULL: every condition fires on either change; else n_event_direction (= the number of
     * conditions) entries: 0 either, +1 only rising (from < 0), -1 only falling (from > 0) */
    const int *event_direction;
    int n_event_direction;
    double event_tol; /* the event time's tolerance (0: default, 4 ulp of t); >= 0 */
    /* The Jacobian of the term, df/dy, from the user (default NULL: nabla's forward mode, N
     * tangent sweeps). A function like the term, called on the same (t, y, args), returning
     * one float var [N, N] -- N the number of state elements, the leaves flattened in tree
     * order and concatenated; row i is d f_i / dy. The stiff solvers use it in place of
     * forward mode wherever they need J: the Newton and Rosenbrock matrices, and the exact
     * Jacobian of the implicit function theorem in derivatives (so it must be exact, and
     * differentiable where gradients are taken); df/dt (Rosenbrock) stays one forward-mode
     * sweep. The explicit solvers do not use it. Not with a continuous adjoint, nor with
     * opts.explicit_term unless the solver is a KenCarp (it would miss the explicit part). */
    nb_fn *jacobian;
} nb_ode_opts;

NB_API nb_ode_opts nb_ode_opts_default(void);

typedef enum nb_ode_result {
    NB_ODE_SUCCESSFUL = 0,
    NB_ODE_MAX_STEPS_REACHED = 1, /* max_steps steps were taken before t1 */
    NB_ODE_DT_UNDERFLOW = 2,      /* the step fell below dtmin, or to where t + dt == t */
    NB_ODE_NONFINITE = 3,         /* the state or its derivative became NaN or infinite */
    NB_ODE_NEWTON_FAILED = 4      /* an implicit solver's Newton iteration diverged or did not
                                     converge, and the step could not shrink further (at
                                     dtmin, or constant steps) */
} nb_ode_result;

/* "successful", "max_steps reached", ... ("unknown result" otherwise). */
NB_API const char *nb_ode_result_string(int result);

/* Solve; returns the solution dict (above), owned by the trace, or NULL after a sticky
 * error. opts may be NULL (defaults). */
NB_API const nb_tree *nb_diffeqsolve(nb_trace *tr, nb_fn *term, const nb_tree *y0,
                                     const nb_tree *args, const nb_ode_opts *opts);

#ifdef __cplusplus
}
#endif
#endif /* NABLA_ODE_H */

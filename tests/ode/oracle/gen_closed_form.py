"""Oracle for nabla's ODE convergence-order tests (tests/ode, issue 8): problems with closed-form
solutions and their exact values at t1, correctly rounded to f64, so a C test can compute global
errors over a ladder of step sizes.

Each closed form is evaluated by mpmath at 50 digits and rounded once to f64 (float(mpf) rounds
to nearest); as a check, each problem is also integrated by mpmath's Taylor solver (mpmath.odefun).

Run with Debian's python3 and python3-mpmath (apt-get install python3-mpmath):
    /usr/bin/python3 tests/ode/oracle/gen_closed_form.py > tests/ode/oracle/closed_form.txt
See README.md beside this script for the line format.
"""
import platform
import sys

import mpmath

mpmath.mp.dps = 50
mpf = mpmath.mpf

# name, ODE text, f(t, y) (mpmath lists), t0, t1, y0, exact y(t1), solution text
PROBLEMS = [
    ("exp_decay", "dy/dt = -y", lambda t, y: [-y[0]],
     0, 1, [1], lambda: [mpmath.exp(-1)], "y(t) = exp(-t)"),
    ("exp_decay_backward", "dy/dt = -y, integrated backwards in time (t1 < t0)", lambda t, y: [-y[0]],
     0, -1, [1], lambda: [mpmath.e], "y(t) = exp(-t)"),
    ("harmonic", "dx/dt = v, dv/dt = -x (state (x, v))", lambda t, y: [y[1], -y[0]],
     0, 1, [1, 0], lambda: [mpmath.cos(1), -mpmath.sin(1)], "x(t) = cos t, v(t) = -sin t"),
    ("t_growth", "dy/dt = t y (non-autonomous)", lambda t, y: [t * y[0]],
     0, 1, [1], lambda: [mpmath.exp(mpf(1) / 2)], "y(t) = exp(t^2/2)"),
    ("logistic", "dy/dt = y (1 - y) (nonlinear)", lambda t, y: [y[0] * (1 - y[0])],
     0, 1, [mpf(1) / 2], lambda: [1 / (1 + mpmath.exp(-1))], "y(t) = 1/(1 + exp(-t))"),
]


def main():
    out = [
        "# Closed-form ODE oracle for tests/ode (issue 8). Made by tests/ode/oracle/gen_closed_form.py:",
        "#   /usr/bin/python3 tests/ode/oracle/gen_closed_form.py > tests/ode/oracle/closed_form.txt",
        f"# mpmath {mpmath.__version__} python {platform.python_version()}; exact values at 50 digits, "
        "each rounded once to the nearest f64",
        "# Lines: 'problem <name> <t0> <t1> <y0[0..n-1]> <y(t1)[0..n-1]>' (n = state dimension = half the",
        "#   number of floats after t1). Floats are Python repr (round-trip exactly with strtod).",
        "# Problems (check: |closed form - mpmath.odefun Taylor solution at 50 digits| at t1):",
    ]
    lines = []
    for name, ode, f, t0, t1, y0, exact, soln in PROBLEMS:
        y0 = [mpf(v) for v in y0]
        ex = exact()
        if t1 >= t0:
            taylor = mpmath.odefun(f, mpf(t0), y0)(mpf(t1))
        else:  # odefun goes forwards only: in s = -t, dy/ds = -f(-s, y) from -t0 to -t1
            g = lambda s, y, f=f: [-v for v in f(-s, y)]
            taylor = mpmath.odefun(g, mpf(-t0), y0)(mpf(-t1))
        err = max(abs(u - v) for u, v in zip(ex, taylor))
        assert err < mpf(10) ** -30, (name, err)
        out.append(f"#   {name}: {ode}, {soln}, t in [{t0}, {t1}] (n = {len(y0)}); "
                   f"check {mpmath.nstr(err, 3)}")
        nums = [float(t0), float(t1)] + [float(v) for v in y0] + [float(v) for v in ex]
        lines.append("problem " + name + " " + " ".join(repr(v) for v in nums))
    sys.stdout.write("\n".join(out + lines) + "\n")


if __name__ == "__main__":
    main()

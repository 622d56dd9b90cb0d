"""An independent check that ros3p's large error on OREGO is the method's, not nabla's.

ROS3P (Lang and Verwer 2001) in the Hairer-Wanner transformed form, with the coefficients
of src/ode/tableau.c (OrdinaryDiffEq's), its embedded order-2 estimate, an I controller
(safety 0.9, factor in [0.2, 5], exponent 1/3) and the RMS error norm with atol + rtol
max(|y0|, |y1|) -- written here in NumPy without nabla -- on OREGO over [0, 360] with
atol = 1e-3 rtol (bench_atol_scale in stiff_ref.txt). Its final-state error against the
Radau reference of stiff_ref.txt (the RMS of |y - ref| / (|ref| + 1e-3), as test_stiff.c's
set_error) is:
    rtol 1e-4: 1117 steps, error 3.7
    rtol 1e-6: 7145 steps, error 4.4e-2   (nabla's ros3p: 7092 steps, 5.7e-2)
    rtol 1e-8: 42585 steps, error 2.6e-4  (nabla's ros3p: 5.4e-4)
Run: /usr/bin/python3 tests/ode/oracle/check_ros3p_orego.py
"""
import numpy as np

s, q, w = 77.27, 8.375e-6, 0.161


def f(y):
    return np.array([s * (y[1] - y[0] * y[1] + y[0] - q * y[0] ** 2),
                     (-y[1] - y[0] * y[1] + y[2]) / s, w * (y[0] - y[2])])


def jac(y):
    return np.array([[s * (-y[1] + 1 - 2 * q * y[0]), s * (1 - y[0]), 0],
                     [-y[1] / s, (-1 - y[0]) / s, 1 / s], [w, 0, -w]])


gamma = 0.78867513459481287
A = np.array([[0, 0, 0], [1.2679491924311228, 0, 0], [1.2679491924311228, 0, 0]])
C = np.array([[0, 0, 0], [-1.6076951545867364, 0, 0],
              [-3.4641016151377553, -1.7320508075688774, 0]])
b = np.array([2, 0.57735026918962573, 0.42264973081037427])
btilde = np.array([-0.1132486540518709, -0.42264973081037427, 5.5511151231257827e-17])
ref = np.array([1.0008148703185227, 1228.1785215499076, 132.05549428465864])


def solve(rtol, atol, t1=360.0):
    y, t, h, n = np.array([1.0, 2.0, 3.0]), 0.0, 1e-6, 0
    while t < t1:
        h = min(h, t1 - t)
        W = np.eye(3) / (h * gamma) - jac(y)
        u = []
        for i in range(3):
            yi = y + sum(A[i, j] * u[j] for j in range(i))
            u.append(np.linalg.solve(W, f(yi) + sum(C[i, j] / h * u[j] for j in range(i))))
        y1 = y + sum(b[i] * u[i] for i in range(3))
        e = sum(btilde[i] * u[i] for i in range(3))
        err = np.sqrt(np.mean((e / (atol + rtol * np.maximum(abs(y), abs(y1)))) ** 2))
        if err <= 1:
            t, y, n = t + h, y1, n + 1
        h *= min(5.0, max(0.2, 0.9 * max(err, 1e-10) ** (-1 / 3)))
    return y, n


for rtol in (1e-4, 1e-6, 1e-8):
    y, n = solve(rtol, 1e-3 * rtol)
    e = abs(y - ref) / (abs(ref) + 1e-3)
    print("rtol %g: %d steps, error %.2g" % (rtol, n, np.sqrt(np.mean(e ** 2))))

/*
 * schedule.c -- learning-rate schedules as trees of static leaves, evaluated inside traces
 * (nabla/optim.h). Formulas are Optax's (optax/_src/schedule.py); each is written once, as
 * traced ops, and the eager nb_schedule_value runs that same code through the cache.
 */
#include "optim/optim_internal.h"

#include <math.h>
#include <string.h>

/* ---- building ----------------------------------------------------------------------- */

static nb_status nbo_sched_bad(nb_ctx *ctx, const char *who, const char *what) {
    return nbi_err(ctx, NB_ERR_INVALID, "%s: %s", who, what);
}

nb_status nb_schedule_constant(nb_ctx *ctx, double value, nb_tree **out) {
    nb_status st = nbo_out_args(ctx, "nb_schedule_constant", out, "schedule");
    if (st != NB_OK) {
        return st;
    }
    if (!isfinite(value)) {
        return nbo_sched_bad(ctx, "nb_schedule_constant", "value must be finite");
    }
    nbo_builder b = nbo_builder_make(ctx);
    nbo_put_string(&b, "schedule", "constant");
    nbo_put_float(&b, "value", value);
    return nbo_builder_dict(&b, out);
}

/* polynomial, reported as fn (nb_schedule_linear is a polynomial of power 1). */
static nb_status nbo_sched_polynomial(nb_ctx *ctx, const char *fn, double init_value,
                                      double end_value, double power, int64_t transition_steps,
                                      int64_t transition_begin, nb_tree **out) {
    nb_status st = nbo_out_args(ctx, fn, out, "schedule");
    if (st != NB_OK) {
        return st;
    }
    if (!isfinite(init_value) || !isfinite(end_value) || !isfinite(power)) {
        return nbo_sched_bad(ctx, fn, "init_value, end_value and power must be finite");
    }
    if (transition_steps < 0 || transition_begin < 0) {
        return nbo_sched_bad(ctx, fn, "transition_steps and transition_begin must be >= 0");
    }
    nbo_builder b = nbo_builder_make(ctx);
    nbo_put_string(&b, "schedule", "polynomial");
    nbo_put_float(&b, "init_value", init_value);
    nbo_put_float(&b, "end_value", end_value);
    nbo_put_float(&b, "power", power);
    nbo_put_int(&b, "transition_steps", transition_steps);
    nbo_put_int(&b, "transition_begin", transition_begin);
    return nbo_builder_dict(&b, out);
}

nb_status nb_schedule_polynomial(nb_ctx *ctx, double init_value, double end_value, double power,
                                 int64_t transition_steps, int64_t transition_begin,
                                 nb_tree **out) {
    return nbo_sched_polynomial(ctx, "nb_schedule_polynomial", init_value, end_value, power,
                                transition_steps, transition_begin, out);
}

nb_status nb_schedule_linear(nb_ctx *ctx, double init_value, double end_value,
                             int64_t transition_steps, int64_t transition_begin, nb_tree **out) {
    return nbo_sched_polynomial(ctx, "nb_schedule_linear", init_value, end_value, 1.0,
                                transition_steps, transition_begin, out);
}

nb_status nb_schedule_cosine_decay(nb_ctx *ctx, double init_value, int64_t decay_steps,
                                   double alpha, double exponent, nb_tree **out) {
    nb_status st = nbo_out_args(ctx, "nb_schedule_cosine_decay", out, "schedule");
    if (st != NB_OK) {
        return st;
    }
    if (!isfinite(init_value) || !isfinite(alpha) || !isfinite(exponent)) {
        return nbo_sched_bad(ctx, "nb_schedule_cosine_decay",
                             "init_value, alpha and exponent must be finite");
    }
    if (decay_steps <= 0) {
        return nbo_sched_bad(ctx, "nb_schedule_cosine_decay", "decay_steps must be > 0");
    }
    nbo_builder b = nbo_builder_make(ctx);
    nbo_put_string(&b, "schedule", "cosine_decay");
    nbo_put_float(&b, "init_value", init_value);
    nbo_put_int(&b, "decay_steps", decay_steps);
    nbo_put_float(&b, "alpha", alpha);
    nbo_put_float(&b, "exponent", exponent);
    return nbo_builder_dict(&b, out);
}

nb_status nb_schedule_warmup_cosine_decay(nb_ctx *ctx, double init_value, double peak_value,
                                          int64_t warmup_steps, int64_t decay_steps,
                                          double end_value, double exponent, nb_tree **out) {
    nb_status st = nbo_out_args(ctx, "nb_schedule_warmup_cosine_decay", out, "schedule");
    if (st != NB_OK) {
        return st;
    }
    if (!isfinite(init_value) || !isfinite(peak_value) || !isfinite(end_value) ||
        !isfinite(exponent)) {
        return nbo_sched_bad(ctx, "nb_schedule_warmup_cosine_decay",
                             "init_value, peak_value, end_value and exponent must be finite");
    }
    if (warmup_steps < 0 || decay_steps <= warmup_steps) {
        return nbo_sched_bad(ctx, "nb_schedule_warmup_cosine_decay",
                             "need decay_steps > warmup_steps >= 0 (decay_steps includes the "
                             "warmup, as in Optax)");
    }
    if (peak_value == 0.0) {
        return nbo_sched_bad(ctx, "nb_schedule_warmup_cosine_decay",
                             "peak_value must not be 0 (the decay's alpha is end/peak)");
    }
    nbo_builder b = nbo_builder_make(ctx);
    nbo_put_string(&b, "schedule", "warmup_cosine_decay");
    nbo_put_float(&b, "init_value", init_value);
    nbo_put_float(&b, "peak_value", peak_value);
    nbo_put_int(&b, "warmup_steps", warmup_steps);
    nbo_put_int(&b, "decay_steps", decay_steps);
    nbo_put_float(&b, "end_value", end_value);
    nbo_put_float(&b, "exponent", exponent);
    return nbo_builder_dict(&b, out);
}

nb_status nb_schedule_exponential_decay(nb_ctx *ctx, double init_value, int64_t transition_steps,
                                        double decay_rate, int64_t transition_begin, bool staircase,
                                        double end_value, nb_tree **out) {
    nb_status st = nbo_out_args(ctx, "nb_schedule_exponential_decay", out, "schedule");
    if (st != NB_OK) {
        return st;
    }
    if (!isfinite(init_value) || !isfinite(decay_rate) || isinf(end_value)) {
        return nbo_sched_bad(ctx, "nb_schedule_exponential_decay",
                             "init_value and decay_rate must be finite, end_value finite or NAN");
    }
    if (transition_steps <= 0 || transition_begin < 0 || decay_rate <= 0.0) {
        return nbo_sched_bad(ctx, "nb_schedule_exponential_decay",
                             "need transition_steps > 0, transition_begin >= 0, decay_rate > 0");
    }
    nbo_builder b = nbo_builder_make(ctx);
    nbo_put_string(&b, "schedule", "exponential_decay");
    nbo_put_float(&b, "init_value", init_value);
    nbo_put_int(&b, "transition_steps", transition_steps);
    nbo_put_float(&b, "decay_rate", decay_rate);
    nbo_put_int(&b, "transition_begin", transition_begin);
    nbo_put_bool(&b, "staircase", staircase);
    if (isnan(end_value)) {
        nbo_put_null(&b, "end_value");
    } else {
        nbo_put_float(&b, "end_value", end_value);
    }
    return nbo_builder_dict(&b, out);
}

nb_status nb_schedule_piecewise_constant(nb_ctx *ctx, double init_value, int n,
                                         const int64_t *boundaries, const double *scales,
                                         nb_tree **out) {
    static const char fn[] = "nb_schedule_piecewise_constant";
    nb_status st = nbo_out_args(ctx, fn, out, "schedule");
    if (st != NB_OK) {
        return st;
    }
    if (n < 0) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: n is %d; it must be >= 0 (the number of boundaries)", fn, n);
    }
    if (n > 0 && (boundaries == NULL || scales == NULL)) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: %s is NULL with n = %d (pass n entries, or n = 0 for a constant)", fn,
                       boundaries == NULL ? "boundaries" : "scales", n);
    }
    if (!isfinite(init_value)) {
        return nbo_sched_bad(ctx, "nb_schedule_piecewise_constant", "init_value must be finite");
    }
    for (int i = 0; i < n; i++) {
        if (boundaries[i] < 0 || (i > 0 && boundaries[i] <= boundaries[i - 1]) ||
            !isfinite(scales[i])) {
            return nbi_err(ctx, NB_ERR_INVALID,
                           "nb_schedule_piecewise_constant: boundary %d (%lld, scale %g): "
                           "boundaries must be >= 0 and strictly increasing, scales finite",
                           i, (long long)boundaries[i], scales[i]);
        }
    }
    size_t bytes = (size_t)(n > 0 ? n : 1) * 2 * sizeof(nb_tree *);
    nb_tree **items = nbi_alloc(ctx, bytes, 8);
    if (items == NULL) {
        return nbi_oom(ctx, "nb_schedule_piecewise_constant", bytes);
    }
    memset(items, 0, bytes);
    for (int i = 0; i < n && st == NB_OK; i++) {
        st = nb_tree_int(ctx, boundaries[i], &items[i]);
        if (st == NB_OK) {
            st = nb_tree_float(ctx, scales[i], &items[n + i]);
        }
    }
    nb_tree *bl = NULL, *sl = NULL;
    if (st == NB_OK) {
        st = nb_tree_list(ctx, n, items, &bl);
    }
    if (st == NB_OK) {
        st = nb_tree_list(ctx, n, items + n, &sl);
    }
    for (int i = 0; i < 2 * n; i++) {
        nb_tree_destroy(items[i]);
    }
    nbi_free(ctx, items, bytes);
    nbo_builder b = nbo_builder_make(ctx);
    if (st != NB_OK) {
        b.st = st;
    }
    nbo_put_string(&b, "schedule", "piecewise_constant");
    nbo_put_float(&b, "init_value", init_value);
    nbo_put_take(&b, "boundaries", bl);
    nbo_put_take(&b, "scales", sl);
    return nbo_builder_dict(&b, out);
}

/* ---- evaluating --------------------------------------------------------------------- */

static double nbo_sf(const nb_tree *s, const char *key) {
    double v = NAN;
    nb_tree_get_float(nb_tree_get(s, key), &v);
    return v;
}

static int64_t nbo_si(const nb_tree *s, const char *key) {
    int64_t v = 0;
    nb_tree_get_int(nb_tree_get(s, key), &v);
    return v;
}

static nb_var *nbo_const64(nb_trace *tr, double v) {
    return nb_scalar_typed(tr, NB_DTYPE_F64, v);
}

/* v0 and v1 at f64 count c (Optax's polynomial_schedule). */
static nb_var *nbo_polynomial(nb_trace *tr, nb_var *c, double v0, double v1, double power,
                              int64_t steps, int64_t begin) {
    if (steps <= 0) {
        return nbo_const64(tr, v0);
    }
    nb_var *k = nb_minimum(nb_maximum(nb_sub(c, nb_scalar(tr, (double)begin)), nb_scalar(tr, 0.0)),
                           nb_scalar(tr, (double)steps));
    nb_var *frac = nb_sub(nb_scalar(tr, 1.0), nb_div(k, nb_scalar(tr, (double)steps)));
    nb_var *p = power == 1.0 ? frac : nb_pow(frac, nb_scalar(tr, power));
    return nb_add(nb_mul(nb_scalar(tr, v0 - v1), p), nb_scalar(tr, v1));
}

static nb_var *nbo_cosine(nb_trace *tr, nb_var *c, double v0, int64_t steps, double alpha,
                          double exponent) {
    nb_var *k = nb_minimum(c, nb_scalar(tr, (double)steps));
    nb_var *cosv = nb_mul(
        nb_scalar(tr, 0.5),
        nb_add(nb_scalar(tr, 1.0), nb_cos(nb_div(nb_mul(nb_scalar(tr, 3.14159265358979323846), k),
                                                 nb_scalar(tr, (double)steps)))));
    nb_var *pw = exponent == 1.0 ? cosv : nb_pow(cosv, nb_scalar(tr, exponent));
    nb_var *decayed = nb_add(nb_mul(nb_scalar(tr, 1.0 - alpha), pw), nb_scalar(tr, alpha));
    return nb_mul(nb_scalar(tr, v0), decayed);
}

nb_var *nb_schedule_eval(nb_trace *tr, const nb_tree *s, nb_var *count) {
    if (tr == NULL) {
        return NULL;
    }
    char why[NBI_ERRMSG_CAP];
    if (nbi_handle_why(s, NBI_MAGIC_TREE, "nb_schedule_eval", "schedule", why, sizeof why) ||
        count == NULL) {
        return tr->status != NB_OK ? tr->poison
               : count != NULL     ? nbi_trace_errv(tr, NB_ERR_MISUSE, "%s", why)
                                   : nbi_trace_errv(tr, NB_ERR_MISUSE,
                                                    "nb_schedule_eval: count is a NULL var (pass "
                                                        "the step count, a 0-d integer var)");
    }
    if (nb_var_is_poison(count)) {
        return count;
    }
    const char *kind = NULL;
    if (nb_tree_get_string(nb_tree_get(s, "schedule"), &kind) != NB_OK) {
        return nbi_trace_errv(tr, NB_ERR_INVALID,
                              "nb_schedule_eval: not a schedule (a dict with a 'schedule' string "
                              "made by nb_schedule_*)");
    }
    if (nb_var_rank(count) != 0 || nb_dtype_is_float(nb_var_dtype(count)) ||
        nb_var_dtype(count) == NB_DTYPE_BOOL) {
        return nbi_trace_errv(tr, NB_ERR_INVALID,
                              "nb_schedule_eval (%s): count must be a 0-d integer var", kind);
    }
    nb_var *c = nb_cast(count, NB_DTYPE_F64);
    if (strcmp(kind, "constant") == 0) {
        return nbo_const64(tr, nbo_sf(s, "value"));
    }
    if (strcmp(kind, "polynomial") == 0) {
        return nbo_polynomial(tr, c, nbo_sf(s, "init_value"), nbo_sf(s, "end_value"),
                              nbo_sf(s, "power"), nbo_si(s, "transition_steps"),
                              nbo_si(s, "transition_begin"));
    }
    if (strcmp(kind, "cosine_decay") == 0) {
        return nbo_cosine(tr, c, nbo_sf(s, "init_value"), nbo_si(s, "decay_steps"),
                          nbo_sf(s, "alpha"), nbo_sf(s, "exponent"));
    }
    if (strcmp(kind, "warmup_cosine_decay") == 0) {
        double v0 = nbo_sf(s, "init_value"), peak = nbo_sf(s, "peak_value");
        double end = nbo_sf(s, "end_value");
        int64_t warm = nbo_si(s, "warmup_steps"), steps = nbo_si(s, "decay_steps");
        /* Optax's join_schedules: the warmup below the boundary, the decay from it on,
         * evaluated at count - boundary. */
        nb_var *up = nbo_polynomial(tr, c, v0, peak, 1.0, warm, 0);
        nb_var *down = nbo_cosine(tr, nb_sub(c, nb_scalar(tr, (double)warm)), peak, steps - warm,
                                  end / peak, nbo_sf(s, "exponent"));
        return nb_select(nb_lt(c, nb_scalar(tr, (double)warm)), up, down);
    }
    if (strcmp(kind, "exponential_decay") == 0) {
        double v0 = nbo_sf(s, "init_value"), rate = nbo_sf(s, "decay_rate");
        int64_t steps = nbo_si(s, "transition_steps"), begin = nbo_si(s, "transition_begin");
        bool stair = false;
        nb_tree_get_bool(nb_tree_get(s, "staircase"), &stair);
        nb_var *k = nb_sub(c, nb_scalar(tr, (double)begin));
        nb_var *p;
        if (stair) {
            /* floor(k / steps) for k > 0 (the only place it is used): integer division of
             * the integer count, exact */
            nb_var *ki = nb_sub(nb_cast(count, NB_DTYPE_I64), nb_scalar(tr, (double)begin));
            p = nb_cast(nb_div(ki, nb_scalar(tr, (double)steps)), NB_DTYPE_F64);
        } else {
            p = nb_div(k, nb_scalar(tr, (double)steps));
        }
        nb_var *v = nb_select(nb_le(k, nb_scalar(tr, 0.0)), nbo_const64(tr, v0),
                              nb_mul(nb_scalar(tr, v0), nb_pow(nb_scalar(tr, rate), p)));
        double end = NAN;
        if (nb_tree_get_float(nb_tree_get(s, "end_value"), &end) == NB_OK) {
            v = rate < 1.0 ? nb_maximum(v, nb_scalar(tr, end)) : nb_minimum(v, nb_scalar(tr, end));
        }
        return v;
    }
    if (strcmp(kind, "piecewise_constant") == 0) {
        nb_var *v = nbo_const64(tr, nbo_sf(s, "init_value"));
        const nb_tree *bl = nb_tree_get(s, "boundaries"), *sl = nb_tree_get(s, "scales");
        for (int64_t i = 0; i < nb_tree_len(bl); i++) {
            int64_t bound = 0;
            double scale = 1.0;
            nb_tree_get_int(nb_tree_child(bl, i), &bound);
            nb_tree_get_float(nb_tree_child(sl, i), &scale);
            v = nb_select(nb_ge(c, nb_scalar(tr, (double)bound)), nb_mul(v, nb_scalar(tr, scale)),
                          v);
        }
        return v;
    }
    return nbi_trace_errv(tr, NB_ERR_INVALID, "nb_schedule_eval: unknown schedule '%s'", kind);
}

static nb_status nbo_sched_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    return nb_return(nb_schedule_eval(tr, self, nb_get(tr, args, "[0]")), out);
}

nb_status nb_schedule_value(const nb_tree *s, int64_t count, double *out) {
    static const char fn[] = "nb_schedule_value";
    if (out != NULL) {
        *out = 0.0;
    }
    nb_status st = nbi_check_handle(s, NBI_MAGIC_TREE, fn, "schedule");
    if (st != NB_OK) {
        return st;
    }
    nb_ctx *ctx = nb_tree_ctx(s);
    if (out == NULL) {
        return nbi_err_null(ctx, fn, "out", "pass the address of a double to receive the value");
    }
    if (count < 0 || count > INT32_MAX) {
        return nbi_err(ctx, NB_ERR_INVALID, "nb_schedule_value: count %lld outside [0, 2^31)",
                       (long long)count);
    }
    nb_array *c = NULL;
    nb_tree *leaf = NULL, *args = NULL, *res = NULL;
    st = nb_array_scalar(ctx, NB_DTYPE_I32, (double)count, &c);
    if (st == NB_OK) {
        st = nb_tree_array(c, &leaf);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 1, &leaf, &args);
    }
    if (st == NB_OK) {
        st = nb_eval(ctx, nbo_sched_body, s, args, &res);
    }
    if (st == NB_OK) {
        *out = *(const double *)nb_array_data(nb_tree_get_array(res));
    }
    nb_tree_destroy(res);
    nb_tree_destroy(args);
    nb_tree_destroy(leaf);
    nb_array_destroy(c);
    return st;
}

/*
 * array_format.c -- numpy-style printing of arrays.
 *
 * Follows numpy's default print options: precision 8, line width 75, summarisation above
 * 1000 elements with 3 edge items, positional floats unless the magnitudes call for
 * scientific notation (max >= 1e8, min nonzero < 1e-4, or max/min > 1e3), values padded to
 * one width so that columns line up, and dtype=... shown unless it is numpy's default for
 * the kind (float64, int64, bool) or the array is empty.
 */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBI_FMT_LINEWIDTH 75
#define NBI_FMT_THRESHOLD 1000
#define NBI_FMT_EDGE 3
#define NBI_FMT_PREC 8
#define NBI_FMT_ELEM 64

typedef enum { NBI_FMT_INT, NBI_FMT_BOOL, NBI_FMT_POS, NBI_FMT_EXP } nbi_fmt_mode;

typedef struct nbi_fmt {
    nbi_fmt_mode mode;
    int int_width; /* POS: width of sign + integer part */
    int frac;      /* POS: fractional digits shown (padded with spaces) */
    int exp_prec;  /* EXP: mantissa digits after the point */
    int width;     /* total width every element is padded to */
    bool summarise;
    bool scalar;
} nbi_fmt;

typedef struct nbi_writer {
    nbi_sbuf *s;
    size_t col;
} nbi_writer;

static void nbi_w_puts(nbi_writer *w, const char *str) {
    nbi_sbuf_puts(w->s, str);
    const char *nl = strrchr(str, '\n');
    w->col = nl ? strlen(nl + 1) : w->col + strlen(str);
}

static void nbi_w_spaces(nbi_writer *w, size_t n) {
    nbi_sbuf_spaces(w->s, n);
    w->col += n;
}

/* Does text read back as v (compared as float when is_f32)? */
static bool nbi_roundtrips(const char *text, double v, bool is_f32) {
    double back = strtod(text, NULL);
    return is_f32 ? (float)back == (float)v : back == v;
}

/* numpy's "maxprec" with unique digits: the fewest fractional digits (at most 8) whose
 * positional text reads back as v; 8 if none does. */
static int nbi_frac_digits(double v, bool is_f32) {
    char tmp[NBI_FMT_ELEM * 8];
    for (int p = 0; p < NBI_FMT_PREC; p++) {
        snprintf(tmp, sizeof tmp, "%.*f", p, v);
        if (nbi_roundtrips(tmp, v, is_f32)) {
            return p;
        }
    }
    /* Not exact within 8 digits: round to 8 and drop trailing zeros. */
    snprintf(tmp, sizeof tmp, "%.*f", NBI_FMT_PREC, fabs(v));
    char *dot = strchr(tmp, '.');
    int n = dot ? (int)strlen(dot + 1) : 0;
    while (n > 0 && dot[n] == '0') {
        n--;
    }
    return n;
}

/* The same for the mantissa of scientific notation. */
static int nbi_exp_digits(double v, bool is_f32) {
    char tmp[NBI_FMT_ELEM];
    for (int p = 0; p < NBI_FMT_PREC; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p, v);
        if (nbi_roundtrips(tmp, v, is_f32)) {
            return p;
        }
    }
    snprintf(tmp, sizeof tmp, "%.*e", NBI_FMT_PREC, fabs(v));
    char *dot = strchr(tmp, '.');
    char *e = strchr(tmp, 'e');
    int n = (dot && e) ? (int)(e - dot - 1) : 0;
    while (n > 0 && dot[n] == '0') {
        n--;
    }
    return n;
}

static int nbi_int_part_width(double v) {
    char tmp[NBI_FMT_ELEM * 8];
    snprintf(tmp, sizeof tmp, "%.0f", trunc(fabs(v)));
    return (int)strlen(tmp) + (signbit(v) ? 1 : 0);
}

/* The flat indices shown along one axis: all, or the edges around an ellipsis. */
static bool nbi_fmt_shown(const nbi_fmt *f, int64_t n, int64_t i) {
    return !f->summarise || n <= 2 * NBI_FMT_EDGE || i < NBI_FMT_EDGE || i >= n - NBI_FMT_EDGE;
}

/* Visit every element that will be printed, for measuring widths. */
typedef void (*nbi_visit_fn)(void *ud, const nb_array *a, int64_t flat);

static void nbi_fmt_visit(const nbi_fmt *f, const nb_array *a, int axis, int64_t base,
                          nbi_visit_fn fn, void *ud) {
    if (axis == a->rank) {
        fn(ud, a, base);
        return;
    }
    int64_t n = a->shape[axis];
    for (int64_t i = 0; i < n; i++) {
        if (nbi_fmt_shown(f, n, i)) {
            nbi_fmt_visit(f, a, axis + 1, base * n + i, fn, ud);
        }
    }
}

typedef struct nbi_measure {
    bool any_finite;
    double max_abs;
    double min_abs_nonzero;
    int max_frac;
    int max_exp_digits;
    int max_int_width;
    int max_width;
    const nbi_fmt *f;
} nbi_measure;

static void nbi_measure_range(void *ud, const nb_array *a, int64_t flat) {
    nbi_measure *m = ud;
    double v = nbi_array_load(a, flat);
    if (!isfinite(v)) {
        return;
    }
    double av = fabs(v);
    if (!m->any_finite || av > m->max_abs) {
        m->max_abs = av;
    }
    if (av > 0 && (m->min_abs_nonzero == 0 || av < m->min_abs_nonzero)) {
        m->min_abs_nonzero = av;
    }
    m->any_finite = true;
}

static void nbi_measure_pos(void *ud, const nb_array *a, int64_t flat) {
    nbi_measure *m = ud;
    double v = nbi_array_load(a, flat);
    if (!isfinite(v)) {
        return;
    }
    int fd = nbi_frac_digits(v, a->dtype == NB_DTYPE_F32);
    int iw = nbi_int_part_width(v);
    if (fd > m->max_frac) {
        m->max_frac = fd;
    }
    if (iw > m->max_int_width) {
        m->max_int_width = iw;
    }
}

static void nbi_measure_exp(void *ud, const nb_array *a, int64_t flat) {
    nbi_measure *m = ud;
    double v = nbi_array_load(a, flat);
    if (!isfinite(v)) {
        return;
    }
    int d = nbi_exp_digits(v, a->dtype == NB_DTYPE_F32);
    if (d > m->max_exp_digits) {
        m->max_exp_digits = d;
    }
}

static void nbi_fmt_element(const nbi_fmt *f, const nb_array *a, int64_t i, char *out, size_t cap) {
    char tmp[NBI_FMT_ELEM * 8];
    switch (f->mode) {
    case NBI_FMT_BOOL:
        snprintf(tmp, sizeof tmp, "%s", ((const uint8_t *)a->data)[i] ? "True" : "False");
        break;
    case NBI_FMT_INT: {
        long long v = a->dtype == NB_DTYPE_I32 ? ((const int32_t *)a->data)[i]
                                               : (long long)((const int64_t *)a->data)[i];
        snprintf(tmp, sizeof tmp, "%lld", v);
        break;
    }
    case NBI_FMT_POS:
    case NBI_FMT_EXP: {
        double v = nbi_array_load(a, i);
        if (isnan(v)) {
            snprintf(tmp, sizeof tmp, "nan");
        } else if (isinf(v)) {
            snprintf(tmp, sizeof tmp, v < 0 ? "-inf" : "inf");
        } else if (f->mode == NBI_FMT_EXP) {
            snprintf(tmp, sizeof tmp, "%#.*e", f->exp_prec, v);
        } else {
            /* Integer part padded left, fraction padded right with spaces. */
            int fd = nbi_frac_digits(v, a->dtype == NB_DTYPE_F32);
            char num[NBI_FMT_ELEM * 8];
            snprintf(num, sizeof num, "%#.*f", fd, v);
            int iw = nbi_int_part_width(v);
            int lpad = f->scalar ? 0 : f->int_width - iw;
            int rpad = f->scalar ? 0 : f->frac - fd;
            size_t k = 0, nl = strlen(num);
            for (int p = 0; p < lpad && k + 1 < sizeof tmp; p++) {
                tmp[k++] = ' ';
            }
            for (size_t p = 0; p < nl && k + 1 < sizeof tmp; p++) {
                tmp[k++] = num[p];
            }
            for (int p = 0; p < rpad && k + 1 < sizeof tmp; p++) {
                tmp[k++] = ' ';
            }
            tmp[k] = '\0';
        }
        break;
    }
    }
    int pad = f->scalar ? 0 : f->width - (int)strlen(tmp);
    size_t k = 0, tl = strlen(tmp);
    for (int p = 0; p < pad && k + 1 < cap; p++) {
        out[k++] = ' ';
    }
    for (size_t p = 0; p < tl && k + 1 < cap; p++) {
        out[k++] = tmp[p];
    }
    out[k] = '\0';
}

static void nbi_measure_width(void *ud, const nb_array *a, int64_t flat) {
    nbi_measure *m = ud;
    char el[NBI_FMT_ELEM * 8];
    nbi_fmt_element(m->f, a, flat, el, sizeof el);
    int len = (int)strlen(el);
    if (len > m->max_width) {
        m->max_width = len;
    }
}

static void nbi_fmt_rec(const nbi_fmt *f, nbi_writer *w, const nb_array *a, int axis,
                        int64_t base) {
    int64_t n = a->shape[axis];
    size_t indent = 6 + (size_t)axis + 1;
    nbi_w_puts(w, "[");
    bool first = true;
    bool ellipsis_done = false;
    for (int64_t i = 0; i < n; i++) {
        bool shown = nbi_fmt_shown(f, n, i);
        if (!shown && ellipsis_done) {
            continue;
        }
        if (axis == a->rank - 1) {
            char el[NBI_FMT_ELEM * 8];
            if (shown) {
                nbi_fmt_element(f, a, base * n + i, el, sizeof el);
            } else {
                snprintf(el, sizeof el, "...");
                ellipsis_done = true;
            }
            if (!first) {
                /* numpy: the line width less the suffix "," or ")", one "]" per level, and
                 * room for the separator; never wrap a line that holds only the indent. */
                nbi_w_puts(w, ",");
                size_t limit = NBI_FMT_LINEWIDTH - 1 - (size_t)axis - 1;
                if (w->col + 1 + strlen(el) > limit && w->col + 1 > indent) {
                    nbi_w_puts(w, "\n");
                    nbi_w_spaces(w, indent);
                } else {
                    nbi_w_puts(w, " ");
                }
            }
            nbi_w_puts(w, el);
        } else {
            if (!first) {
                nbi_w_puts(w, ",");
                for (int k = axis; k < a->rank - 1; k++) {
                    nbi_w_puts(w, "\n");
                }
                nbi_w_spaces(w, indent);
            }
            if (shown) {
                nbi_fmt_rec(f, w, a, axis + 1, base * n + i);
            } else {
                nbi_w_puts(w, "...");
                ellipsis_done = true;
            }
        }
        first = false;
    }
    nbi_w_puts(w, "]");
}

static const char *nbi_numpy_dtype(nb_dtype d) {
    switch (d) {
    case NB_DTYPE_F32:
        return "float32";
    case NB_DTYPE_F64:
        return "float64";
    case NB_DTYPE_I32:
        return "int32";
    case NB_DTYPE_I64:
        return "int64";
    case NB_DTYPE_BOOL:
        return "bool";
    }
    return "?";
}

static bool nbi_numpy_default_dtype(nb_dtype d) {
    return d == NB_DTYPE_F64 || d == NB_DTYPE_I64 || d == NB_DTYPE_BOOL;
}

/* ", dtype=float32)", on a new line when it would pass the line width (as numpy does). */
static void nbi_fmt_dtype_suffix(nbi_writer *w, nb_dtype dtype) {
    char d[32];
    snprintf(d, sizeof d, "dtype=%s)", nbi_numpy_dtype(dtype));
    nbi_w_puts(w, ",");
    if (w->col + strlen(d) + 1 > NBI_FMT_LINEWIDTH) {
        nbi_w_puts(w, "\n      ");
    } else {
        nbi_w_puts(w, " ");
    }
    nbi_w_puts(w, d);
}

nb_status nb_array_format(const nb_array *a, char *buf, size_t cap, size_t *needed) {
    if (needed != NULL) {
        *needed = 0;
    }
    nb_status st = nbi_check_handle(a, NBI_MAGIC_ARRAY, "nb_array_format", "a");
    if (st != NB_OK) {
        return st;
    }
    if (buf == NULL && cap > 0) {
        return nbi_err(a->hdr.ctx, NB_ERR_MISUSE,
                       "nb_array_format: buf is NULL but cap is %zu (pass a buffer of cap bytes, "
                       "or cap 0 to measure)",
                       cap);
    }
    nbi_sbuf s = nbi_sbuf_make(buf, cap);
    nbi_writer w = {&s, 0};
    if (a->size == 0) {
        nbi_w_puts(&w, "array([]");
        if (a->rank != 1) {
            nbi_w_puts(&w, ", shape=(");
            for (int i = 0; i < a->rank; i++) {
                char d[32];
                snprintf(d, sizeof d, i ? ", %lld" : "%lld", (long long)a->shape[i]);
                nbi_w_puts(&w, d);
            }
            nbi_w_puts(&w, ")");
        }
        nbi_fmt_dtype_suffix(&w, a->dtype);
        return nbi_sbuf_finish(&s, needed);
    }

    nbi_fmt f;
    memset(&f, 0, sizeof f);
    f.summarise = a->size > NBI_FMT_THRESHOLD;
    f.scalar = a->rank == 0;
    nbi_measure m;
    memset(&m, 0, sizeof m);
    if (a->dtype == NB_DTYPE_BOOL) {
        f.mode = NBI_FMT_BOOL;
    } else if (a->dtype == NB_DTYPE_I32 || a->dtype == NB_DTYPE_I64) {
        f.mode = NBI_FMT_INT;
    } else {
        nbi_fmt_visit(&f, a, 0, 0, nbi_measure_range, &m);
        bool exp = m.any_finite &&
                   (m.max_abs >= 1e8 || (m.min_abs_nonzero > 0 && m.min_abs_nonzero < 1e-4) ||
                    (m.min_abs_nonzero > 0 && m.max_abs / m.min_abs_nonzero > 1e3));
        if (exp) {
            f.mode = NBI_FMT_EXP;
            nbi_fmt_visit(&f, a, 0, 0, nbi_measure_exp, &m);
            f.exp_prec = m.max_exp_digits;
        } else {
            f.mode = NBI_FMT_POS;
            nbi_fmt_visit(&f, a, 0, 0, nbi_measure_pos, &m);
            f.int_width = m.max_int_width;
            f.frac = m.max_frac;
        }
    }
    /* One width for all shown elements so that columns line up (bools: " True"). */
    if (!f.scalar) {
        m.f = &f;
        m.max_width = f.mode == NBI_FMT_BOOL ? 5 : 0;
        nbi_fmt_visit(&f, a, 0, 0, nbi_measure_width, &m);
        f.width = m.max_width;
    }

    nbi_w_puts(&w, "array(");
    if (f.scalar) {
        char el[NBI_FMT_ELEM * 8];
        nbi_fmt_element(&f, a, 0, el, sizeof el);
        nbi_w_puts(&w, el);
    } else {
        nbi_fmt_rec(&f, &w, a, 0, 0);
    }
    if (!nbi_numpy_default_dtype(a->dtype)) {
        nbi_fmt_dtype_suffix(&w, a->dtype);
    } else {
        nbi_w_puts(&w, ")");
    }
    return nbi_sbuf_finish(&s, needed);
}

static nb_status nbi_array_format_obj(const void *obj, char *buf, size_t cap, size_t *needed) {
    return nb_array_format(obj, buf, cap, needed);
}

nb_status nb_array_fprint(const nb_array *a, FILE *f) {
    nb_status st = nbi_check_handle(a, NBI_MAGIC_ARRAY, "nb_array_fprint", "a");
    if (st != NB_OK) {
        return st;
    }
    return nbi_fprint_with(a->hdr.ctx, "nb_array_fprint", nbi_array_format_obj, a, f);
}

nb_status nb_array_format_sig(const nb_array *a, char *buf, size_t cap, size_t *needed) {
    if (needed != NULL) {
        *needed = 0;
    }
    nb_status st = nbi_check_handle(a, NBI_MAGIC_ARRAY, "nb_array_format_sig", "a");
    if (st != NB_OK) {
        return st;
    }
    if (buf == NULL && cap > 0) {
        return nbi_err(a->hdr.ctx, NB_ERR_MISUSE,
                       "nb_array_format_sig: buf is NULL but cap is %zu (pass a buffer of cap "
                       "bytes, or cap 0 to measure)",
                       cap);
    }
    nbi_sbuf s = nbi_sbuf_make(buf, cap);
    nbi_sbuf_sig(&s, a->dtype, a->rank, a->shape);
    return nbi_sbuf_finish(&s, needed);
}

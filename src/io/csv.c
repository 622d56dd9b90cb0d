/*
 * csv.c -- CSV data sets, plain or gzip (zlib reads both transparently). See nabla/data.h.
 */
#include "core/internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

nb_csv_opts nb_csv_opts_default(void) {
    nb_csv_opts o;
    memset(&o, 0, sizeof o);
    o.feature_dtype = NB_DTYPE_F32;
    o.label_dtype = NB_DTYPE_I32;
    o.has_labels = true;
    o.delimiter = ',';
    return o;
}

typedef struct nbi_csv {
    nb_ctx *ctx;
    const char *path;
    gzFile f;
    char *line;
    size_t line_cap;
    double *feat;
    size_t feat_cap; /* doubles */
    size_t n_feat;
    int64_t *lab;
    size_t lab_cap;
    size_t n_lab;
    char buf[16384]; /* decompressed bytes not yet split into lines */
    size_t buf_len, buf_pos;
    bool eof;
} nbi_csv;

static bool nbi_grow(nb_ctx *ctx, void **p, size_t *cap, size_t used, size_t need, size_t es) {
    if (need <= *cap) {
        return true;
    }
    size_t cap2 = *cap ? *cap : 1024;
    while (cap2 < need) {
        cap2 *= 2;
    }
    void *q = nbi_alloc(ctx, cap2 * es, 16);
    if (q == NULL) {
        return false;
    }
    if (*p != NULL) {
        memcpy(q, *p, used * es);
        nbi_free(ctx, *p, *cap * es);
    }
    *p = q;
    *cap = cap2;
    return true;
}

/* Read one line (without its newline) into c->line; *got: 1 a line, 0 end of file. Reads
 * blocks with gzread rather than lines with gzgets, which cannot tell a NUL byte from the
 * end of the string: a NUL is an error naming the line (it used to cut the line there and
 * glue the next line on, or drop a row, silently). */
static nb_status nbi_csv_read_line(nbi_csv *c, int64_t lineno, int *got, size_t *len) {
    size_t n = 0;
    *got = 0;
    for (;;) {
        if (c->buf_pos == c->buf_len) {
            if (c->eof) {
                break;
            }
            int r = gzread(c->f, c->buf, (unsigned)sizeof c->buf);
            if (r <= 0) {
                int zerr = Z_OK;
                const char *msg = gzerror(c->f, &zerr);
                if (r < 0 || (zerr != Z_OK && zerr != Z_STREAM_END)) {
                    return nbi_err(c->ctx, NB_ERR_IO, "nb_csv_load: %s: read error: %s", c->path,
                                   msg);
                }
                c->eof = true;
                break;
            }
            c->buf_len = (size_t)r;
            c->buf_pos = 0;
        }
        const char *start = c->buf + c->buf_pos;
        size_t avail = c->buf_len - c->buf_pos;
        const char *nl = memchr(start, '\n', avail);
        size_t take = nl != NULL ? (size_t)(nl - start) : avail;
        if (memchr(start, '\0', take) != NULL) {
            return nbi_err(c->ctx, NB_ERR_FORMAT, "nb_csv_load: %s:%lld: a NUL byte", c->path,
                           (long long)lineno);
        }
        if (!nbi_grow(c->ctx, (void **)&c->line, &c->line_cap, n, n + take + 1, 1)) {
            return nbi_oom(c->ctx, "nb_csv_load", n + take + 1);
        }
        memcpy(c->line + n, start, take);
        n += take;
        c->buf_pos += take + (nl != NULL);
        *got = 1;
        if (nl != NULL) {
            break;
        }
    }
    if (c->line == NULL) { /* an empty file */
        *len = 0;
        return NB_OK;
    }
    while (n > 0 && (c->line[n - 1] == '\r' || c->line[n - 1] == ' ')) {
        n--;
    }
    c->line[n] = '\0';
    *len = n;
    return NB_OK;
}

/* Split line in place at the delimiter; fields[] point into it. Returns the count. */
static size_t nbi_csv_split(char *line, char delim, char **fields, size_t max) {
    size_t n = 0;
    char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t') {
            p++;
        }
        if (n < max) {
            fields[n] = p;
        }
        n++;
        char *d = strchr(p, delim);
        char *end = d ? d : p + strlen(p);
        char *t = end;
        while (t > p && (t[-1] == ' ' || t[-1] == '\t')) {
            t--;
        }
        if (d == NULL) {
            *t = '\0';
            break;
        }
        *t = '\0';
        p = d + 1;
    }
    return n;
}

static bool nbi_parse_double(const char *s, double *out) {
    if (*s == '\0') {
        return false;
    }
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (*end != '\0' || !isfinite(v)) { /* (ERANGE on underflow: a subnormal or 0 is fine) */
        return false;
    }
    *out = v;
    return true;
}

static bool nbi_parse_int(const char *s, int64_t *out) {
    if (*s == '\0') {
        return false;
    }
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end != '\0' || errno == ERANGE) {
        return false;
    }
    *out = v;
    return true;
}

#define NBI_CSV_MAX_FIELDS 100000

static nb_status nbi_csv_parse(nbi_csv *c, const nb_csv_opts *o, int64_t *rows_out,
                               int64_t *cols_out) {
    static const char fn[] = "nb_csv_load";
    nb_ctx *ctx = c->ctx;
    char **fields = NULL;
    size_t fields_bytes = NBI_CSV_MAX_FIELDS * sizeof(char *);
    fields = nbi_alloc(ctx, fields_bytes, 8);
    if (fields == NULL) {
        return nbi_oom(ctx, fn, fields_bytes);
    }
    nb_status st = NB_OK;
    int64_t lineno = 0, rows = 0, want_rows = -1, want_feat = -1;
    size_t n_cols = 0;
    bool first = true;
    for (;;) {
        int got = 0;
        size_t len = 0;
        st = nbi_csv_read_line(c, lineno + 1, &got, &len);
        if (st != NB_OK || !got) {
            break;
        }
        lineno++;
        if (len == 0) {
            continue;
        }
        size_t n = nbi_csv_split(c->line, o->delimiter, fields, NBI_CSV_MAX_FIELDS);
        if (n > NBI_CSV_MAX_FIELDS) {
            st = nbi_err(ctx, NB_ERR_FORMAT, "%s: %s:%lld: more than %d fields", fn, c->path,
                         (long long)lineno, NBI_CSV_MAX_FIELDS);
            break;
        }
        if (first) {
            first = false;
            bool numeric = true;
            double tmp;
            for (size_t i = 0; i < n && numeric; i++) {
                numeric = nbi_parse_double(fields[i], &tmp);
            }
            if (!numeric) {
                /* A header. scikit-learn's form starts with n_samples, n_features. */
                int64_t a = 0, b = 0;
                if (n >= 2 && nbi_parse_int(fields[0], &a) && nbi_parse_int(fields[1], &b) &&
                    a >= 0 && b >= 0) {
                    want_rows = a;
                    want_feat = b;
                }
                continue;
            }
        }
        if (n_cols == 0) {
            n_cols = n;
            if (o->has_labels && n_cols < 2) {
                st = nbi_err(ctx, NB_ERR_FORMAT,
                             "%s: %s:%lld: a row needs at least one feature and a label, found "
                             "%zu field",
                             fn, c->path, (long long)lineno, n);
                break;
            }
        } else if (n != n_cols) {
            st = nbi_err(ctx, NB_ERR_FORMAT, "%s: %s:%lld: expected %zu fields, found %zu", fn,
                         c->path, (long long)lineno, n_cols, n);
            break;
        }
        size_t nf = o->has_labels ? n - 1 : n;
        if (!nbi_grow(ctx, (void **)&c->feat, &c->feat_cap, c->n_feat, c->n_feat + nf,
                      sizeof(double)) ||
            (o->has_labels && !nbi_grow(ctx, (void **)&c->lab, &c->lab_cap, c->n_lab, c->n_lab + 1,
                                        sizeof(int64_t)))) {
            st = nbi_oom(ctx, fn, (c->n_feat + nf) * sizeof(double));
            break;
        }
        for (size_t i = 0; i < nf; i++) {
            double *v = &c->feat[c->n_feat + i];
            if (!nbi_parse_double(fields[i], v) ||
                (o->feature_dtype == NB_DTYPE_F32 && isinf((float)*v))) {
                st = nbi_err(ctx, NB_ERR_FORMAT,
                             "%s: %s:%lld: field %zu (\"%.40s\") is not a finite number%s", fn,
                             c->path, (long long)lineno, i + 1, fields[i],
                             o->feature_dtype == NB_DTYPE_F32 ? " that fits f32" : "");
                break;
            }
        }
        if (st != NB_OK) {
            break;
        }
        c->n_feat += nf;
        if (o->has_labels) {
            int64_t lab = 0;
            if (!nbi_parse_int(fields[n - 1], &lab) ||
                (o->label_dtype == NB_DTYPE_I32 && (lab < INT32_MIN || lab > INT32_MAX))) {
                st = nbi_err(ctx, NB_ERR_FORMAT,
                             "%s: %s:%lld: the label (last field, \"%.40s\") is not an integer%s",
                             fn, c->path, (long long)lineno, fields[n - 1],
                             o->label_dtype == NB_DTYPE_I32 ? " that fits i32" : "");
                break;
            }
            c->lab[c->n_lab++] = lab;
        }
        rows++;
    }
    nbi_free(ctx, fields, fields_bytes);
    if (st != NB_OK) {
        return st;
    }
    if (rows == 0) {
        return nbi_err(ctx, NB_ERR_FORMAT, "%s: %s: no data rows", fn, c->path);
    }
    int64_t nfeat = (int64_t)(o->has_labels ? n_cols - 1 : n_cols);
    if (want_rows >= 0 && (want_rows != rows || want_feat != nfeat)) {
        return nbi_err(ctx, NB_ERR_FORMAT,
                       "%s: %s: the header announces %lld samples of %lld features, the file "
                       "has %lld of %lld",
                       fn, c->path, (long long)want_rows, (long long)want_feat, (long long)rows,
                       (long long)nfeat);
    }
    *rows_out = rows;
    *cols_out = nfeat;
    return NB_OK;
}

nb_status nb_csv_load(nb_ctx *ctx, const char *path, const nb_csv_opts *opts, nb_array **features,
                      nb_array **labels) {
    static const char fn[] = "nb_csv_load";
    if (features != NULL) {
        *features = NULL;
    }
    if (labels != NULL) {
        *labels = NULL;
    }
    if (ctx == NULL || features == NULL || path == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: %s is NULL (pass the context, the file's path and the address of an "
                       "nb_array * for the features)",
                       fn,
                       ctx == NULL    ? "ctx"
                       : path == NULL ? "path"
                                      : "features");
    }
    nb_csv_opts o = opts ? *opts : nb_csv_opts_default();
    if (!nb_dtype_is_float(o.feature_dtype) ||
        (o.label_dtype != NB_DTYPE_I32 && o.label_dtype != NB_DTYPE_I64)) {
        return nbi_err(ctx, NB_ERR_DTYPE,
                       "%s: features must be f32 or f64 and labels i32 or i64 (got %s, %s)", fn,
                       nb_dtype_name(o.feature_dtype), nb_dtype_name(o.label_dtype));
    }
    if (o.delimiter == '\0' || o.delimiter == '\n' || o.delimiter == '"') {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: delimiter '%c' cannot be used", fn, o.delimiter);
    }
    nbi_csv c;
    memset(&c, 0, sizeof c);
    c.ctx = ctx;
    c.path = path;
    errno = 0;
    c.f = gzopen(path, "rb");
    if (c.f == NULL) {
        char why[128] = "unknown error";
        if (errno != 0) {
            strerror_r(errno, why, sizeof why);
        }
        return nbi_err(ctx, NB_ERR_IO, "%s: cannot open '%s': %s", fn, path, why);
    }
    int64_t rows = 0, cols = 0;
    nb_status st = nbi_csv_parse(&c, &o, &rows, &cols);
    nb_array *x = NULL, *y = NULL;
    if (st == NB_OK) {
        st = nbi_array_new(ctx, fn, o.feature_dtype, 2, (int64_t[]){rows, cols}, &x);
    }
    if (st == NB_OK && o.has_labels && labels != NULL) {
        st = nbi_array_new(ctx, fn, o.label_dtype, 1, &rows, &y);
    }
    if (st == NB_OK) {
        for (size_t i = 0; i < c.n_feat; i++) {
            if (o.feature_dtype == NB_DTYPE_F32) {
                ((float *)nb_array_data(x))[i] = (float)c.feat[i];
            } else {
                ((double *)nb_array_data(x))[i] = c.feat[i];
            }
        }
        for (size_t i = 0; y != NULL && i < c.n_lab; i++) {
            if (o.label_dtype == NB_DTYPE_I32) {
                ((int32_t *)nb_array_data(y))[i] = (int32_t)c.lab[i];
            } else {
                ((int64_t *)nb_array_data(y))[i] = c.lab[i];
            }
        }
    }
    /* a truncated or corrupt .gz reads as a short file; zlib says so when it is closed */
    if (gzclose(c.f) != Z_OK && st == NB_OK) {
        st = nbi_err(ctx, NB_ERR_IO, "%s: '%s' is truncated or corrupt (zlib)", fn, path);
    }
    if (c.line != NULL) {
        nbi_free(ctx, c.line, c.line_cap);
    }
    if (c.feat != NULL) {
        nbi_free(ctx, c.feat, c.feat_cap * sizeof(double));
    }
    if (c.lab != NULL) {
        nbi_free(ctx, c.lab, c.lab_cap * sizeof(int64_t));
    }
    if (st != NB_OK) {
        nb_array_destroy(x);
        nb_array_destroy(y);
        return st;
    }
    *features = x;
    if (labels != NULL) {
        *labels = y;
    }
    return NB_OK;
}

/* ---- text as characters ------------------------------------------------------------- */

nb_status nb_text_load(nb_ctx *ctx, const char *path, nb_array **codes, char *vocab, int *n_vocab) {
    static const char fn[] = "nb_text_load";
    if (codes != NULL) {
        *codes = NULL;
    }
    if (n_vocab != NULL) {
        *n_vocab = 0;
    }
    if (ctx == NULL || path == NULL || codes == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: %s is NULL (pass the context, the file's path and the address of an "
                       "nb_array * for the codes)",
                       fn,
                       ctx == NULL    ? "ctx"
                       : path == NULL ? "path"
                                      : "codes");
    }
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (f == NULL) {
        char why[128] = "unknown error";
        if (errno != 0) {
            strerror_r(errno, why, sizeof why);
        }
        return nbi_err(ctx, NB_ERR_IO, "%s: cannot open '%s': %s", fn, path, why);
    }
    /* read it whole into a growing buffer */
    size_t cap = (size_t)1 << 16, n = 0;
    unsigned char *buf = nbi_alloc(ctx, cap, 64);
    nb_status st = buf != NULL ? NB_OK : nbi_err(ctx, NB_ERR_OOM, "%s: out of memory", fn);
    while (st == NB_OK) {
        if (n == cap) {
            unsigned char *nb = cap <= SIZE_MAX / 2 ? nbi_alloc(ctx, 2 * cap, 64) : NULL;
            if (nb == NULL) {
                st = nbi_err(ctx, NB_ERR_OOM, "%s: out of memory reading '%s' (%zu bytes so far)",
                             fn, path, n);
                break;
            }
            memcpy(nb, buf, n);
            nbi_free(ctx, buf, cap);
            buf = nb;
            cap *= 2;
        }
        unsigned want = cap - n > (1u << 30) ? (1u << 30) : (unsigned)(cap - n);
        int got = gzread(f, buf + n, want);
        if (got < 0) {
            int zerr = 0;
            const char *msg = gzerror(f, &zerr);
            st = nbi_err(ctx, NB_ERR_IO, "%s: cannot read '%s': %s", fn, path,
                         zerr == Z_ERRNO ? strerror(errno) : msg);
        } else if (got == 0) {
            break;
        }
        n += got > 0 ? (size_t)got : 0;
    }
    /* a truncated or corrupt .gz reads as a short file; zlib says so when it is closed */
    if (gzclose(f) != Z_OK && st == NB_OK) {
        st = nbi_err(ctx, NB_ERR_IO, "%s: '%s' is truncated or corrupt (zlib)", fn, path);
    }
    if (st == NB_OK && n == 0) {
        st = nbi_err(ctx, NB_ERR_FORMAT, "%s: '%s' is empty", fn, path);
    }
    /* the sorted byte alphabet and each byte's index in it */
    int index[256];
    int nv = 0;
    if (st == NB_OK) {
        bool seen[256] = {false};
        for (size_t i = 0; i < n; i++) {
            seen[buf[i]] = true;
        }
        for (int b = 0; b < 256; b++) {
            index[b] = seen[b] ? nv : -1;
            if (seen[b] && vocab != NULL) {
                vocab[nv] = (char)b;
            }
            nv += seen[b];
        }
    }
    nb_array *a = NULL;
    if (st == NB_OK) {
        st = nbi_array_new(ctx, fn, NB_DTYPE_I32, 1, (int64_t[]){(int64_t)n}, &a);
    }
    if (st == NB_OK) {
        int32_t *d = nb_array_data(a);
        for (size_t i = 0; i < n; i++) {
            d[i] = index[buf[i]];
        }
        *codes = a;
        if (n_vocab != NULL) {
            *n_vocab = nv;
        }
    }
    if (buf != NULL) {
        nbi_free(ctx, buf, cap);
    }
    return st;
}

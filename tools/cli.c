/*
 * cli.c -- what the subcommands of the `nabla` program share: option values read with clear
 * messages, where the data sets are, failed library calls reported in plain words, the
 * monotonic clock, and a progress display (cli.h).
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The relative path from the installed program's directory to the installed data sets
 * (tools/CMakeLists.txt computes it from CMAKE_INSTALL_BINDIR and CMAKE_INSTALL_DATADIR). */
#ifndef NABLA_BIN_TO_DATA
#define NABLA_BIN_TO_DATA "../share/nabla/data"
#endif

enum { CLI_LINE_MAX = 512, CLI_BAR_MAX = 100 };

double cli_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- option values ------------------------------------------------------------------ */

int cli_i64(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    bool range = errno == ERANGE;
    /* the whole string: no leading blanks (strtoll would skip them), nothing after */
    bool ok = end != s && *end == '\0' && errno == 0 && !isspace((unsigned char)s[0]);
    if (!ok || v < lo || v > hi) {
        const char *why = range ? " (beyond a 64-bit integer)" : "";
        if (hi == INT64_MAX) {
            fprintf(stderr, "nabla %s: %s wants an integer >= %lld, got '%s'%s\n", cmd, opt,
                    (long long)lo, s, why);
        } else {
            fprintf(stderr, "nabla %s: %s wants an integer in [%lld, %lld], got '%s'%s\n", cmd, opt,
                    (long long)lo, (long long)hi, s, why);
        }
        return 2;
    }
    *out = (int64_t)v;
    return 0;
}

/* Whether the significand of a number strtod has read (all of s) has a nonzero digit. */
static bool cli_literal_nonzero(const char *s) {
    const char *p = s + (*s == '+' || *s == '-');
    bool hex = p[0] == '0' && (p[1] == 'x' || p[1] == 'X');
    p += hex ? 2 : 0;
    for (; *p != '\0' && *p != (hex ? 'p' : 'e') && *p != (hex ? 'P' : 'E'); p++) {
        if (*p != '0' && *p != '.') {
            return true;
        }
    }
    return false;
}

bool cli_parse_f64(const char *s, double *out, const char **why) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    bool range = errno == ERANGE;
    if (end == s || *end != '\0' || isspace((unsigned char)s[0])) {
        *why = "not a number";
        return false;
    }
    if (isnan(v)) {
        *why = "not a number";
        return false;
    }
    if (isinf(v)) {
        *why = range ? "too large for a double" : "not a finite number";
        return false;
    }
    if (range || (v == 0 && cli_literal_nonzero(s))) {
        *why = "too small for a double: below 2.2e-308 it would be read as 0 or lose digits";
        return false;
    }
    *out = v;
    return true;
}

int cli_f64(const char *cmd, const char *opt, const char *s, double lo, double hi, bool open_lo,
            bool open_hi, double *out) {
    double v = 0;
    const char *why = NULL;
    bool ok = cli_parse_f64(s, &v, &why);
    ok = ok && (open_lo ? v > lo : v >= lo) && (open_hi ? v < hi : v <= hi);
    if (!ok) {
        char range[96];
        if (isinf(hi) && hi > 0) {
            snprintf(range, sizeof range, "%s %g", open_lo ? ">" : ">=", lo);
        } else {
            snprintf(range, sizeof range, "in %c%g, %g%c", open_lo ? '(' : '[', lo, hi,
                     open_hi ? ')' : ']');
        }
        fprintf(stderr, "nabla %s: %s wants a number %s, got '%s'%s%s%s\n", cmd, opt, range, s,
                why != NULL ? " (" : "", why != NULL ? why : "", why != NULL ? ")" : "");
        return 2;
    }
    *out = v;
    return 0;
}

int cli_dir_path(const char *cmd, const char *opt, const char *s, const char **out) {
    if (*s == '\0') {
        fprintf(stderr,
                "nabla %s: %s wants a directory, got '' (an empty path; name a directory, or "
                "leave %s out for the default)\n",
                cmd, opt, opt);
        return 2;
    }
    size_t len = strlen(s);
    if (len > CLI_PATH_OPT_MAX) {
        fprintf(stderr, "nabla %s: %s wants a directory path of at most %d bytes, got %zu bytes\n",
                cmd, opt, CLI_PATH_OPT_MAX, len);
        return 2;
    }
    *out = s;
    return 0;
}

int cli_progress_mode(const char *cmd, const char *s, int *mode) {
    if (strcmp(s, "bar") == 0) {
        *mode = 1;
    } else if (strcmp(s, "lines") == 0) {
        *mode = 0;
    } else if (strcmp(s, "auto") == 0) {
        *mode = -1;
    } else {
        fprintf(stderr, "nabla %s: --progress wants bar, lines or auto, got '%s'\n", cmd, s);
        return 2;
    }
    return 0;
}

/* ---- the data sets ------------------------------------------------------------------ */

typedef enum cli_data_source {
    CLI_DATA_NONE,
    CLI_DATA_ENV,
    CLI_DATA_INSTALLED,
    CLI_DATA_CWD,
} cli_data_source;

/* Written once (cli_data_once), read-only afterwards. */
static struct cli_data_state {
    char dir[CLI_PATH_MAX];
    char installed[CLI_PATH_MAX]; /* the installed data sets' place ("": the program's unknown) */
    cli_data_source source;
    bool env_empty; /* NABLA_DATA set to "" (taken as not set) */
    bool env_long;  /* NABLA_DATA too long to use */
} cli_data;
static pthread_once_t cli_data_once = PTHREAD_ONCE_INIT;

static bool cli_is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* out = dir/rel, each leading "../" of rel taking the last component off dir (lexically: dir
 * comes from /proc/self/exe, which has no symbolic links left to resolve). false when it
 * does not fit. */
static bool cli_path_up(const char *dir, const char *rel, char *out, size_t cap) {
    char base[CLI_PATH_MAX];
    if ((size_t)snprintf(base, sizeof base, "%s", dir) >= sizeof base) {
        return false;
    }
    if (rel[0] == '/') {
        base[0] = '\0';
    }
    while (strncmp(rel, "../", 3) == 0 && base[0] == '/' && base[1] != '\0') {
        char *slash = strrchr(base, '/');
        slash[slash == base ? 1 : 0] = '\0'; /* "/bin" -> "/", "/usr/bin" -> "/usr" */
        rel += 3;
    }
    size_t n = strlen(base);
    const char *sep = n > 0 && base[n - 1] != '/' ? "/" : "";
    return (size_t)snprintf(out, cap, "%s%s%s", base, sep, rel) < cap;
}

static void cli_data_init(void) {
    struct cli_data_state *d = &cli_data;
    char exe[CLI_PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash != NULL) {
            slash[slash == exe ? 1 : 0] = '\0'; /* the program's directory */
            if (!cli_path_up(exe, NABLA_BIN_TO_DATA, d->installed, sizeof d->installed)) {
                d->installed[0] = '\0';
            }
        }
    }
    const char *env = getenv("NABLA_DATA");
    d->env_empty = env != NULL && env[0] == '\0';
    d->env_long = env != NULL && strlen(env) >= sizeof d->dir;
    if (env != NULL && !d->env_empty && !d->env_long) {
        snprintf(d->dir, sizeof d->dir, "%s", env);
        d->source = CLI_DATA_ENV;
    } else if (d->installed[0] != '\0' && strlen(d->installed) < sizeof d->dir &&
               cli_is_dir(d->installed)) {
        memcpy(d->dir, d->installed, strlen(d->installed) + 1); /* fits: checked above */
        d->source = CLI_DATA_INSTALLED;
    } else {
        snprintf(d->dir, sizeof d->dir, "data");
        d->source = cli_is_dir("data") ? CLI_DATA_CWD : CLI_DATA_NONE;
    }
}

const char *cli_data_dir(void) {
    pthread_once(&cli_data_once, cli_data_init);
    return cli_data.dir;
}

const char *cli_data_dir_source(void) {
    pthread_once(&cli_data_once, cli_data_init);
    switch (cli_data.source) {
    case CLI_DATA_ENV:
        return "from NABLA_DATA";
    case CLI_DATA_INSTALLED:
        return "installed with nabla";
    case CLI_DATA_CWD:
        return "./data in the working directory";
    case CLI_DATA_NONE:
        break;
    }
    return NULL;
}

void cli_data_dir_explain(FILE *f) {
    pthread_once(&cli_data_once, cli_data_init);
    const struct cli_data_state *d = &cli_data;
    switch (d->source) {
    case CLI_DATA_ENV:
        fprintf(f,
                "  the data directory %s is from NABLA_DATA: point NABLA_DATA at the directory "
                "holding the data sets, unset it, or pass --data DIR\n",
                d->dir);
        return;
    case CLI_DATA_INSTALLED:
        fprintf(f,
                "  the data directory %s is the one installed with nabla: install nabla again, "
                "or pass --data DIR\n",
                d->dir);
        return;
    case CLI_DATA_CWD:
        fprintf(f, "  the data directory is ./data in the working directory: pass --data DIR "
                   "for another\n");
        return;
    case CLI_DATA_NONE:
        break;
    }
    char cwd[CLI_PATH_MAX];
    fprintf(f, "  no --data given, and no data directory found; looked for:\n");
    fprintf(f, "    $NABLA_DATA  (%s)\n",
            d->env_empty  ? "set but empty"
            : d->env_long ? "too long"
                          : "not set");
    if (d->installed[0] != '\0') {
        fprintf(f, "    %s  (where `cmake --install` puts them: not there)\n", d->installed);
    } else {
        fprintf(f,
                "    <bin>/%s  (where `cmake --install` puts them: the program's own "
                "directory is unknown)\n",
                NABLA_BIN_TO_DATA);
    }
    fprintf(f, "    ./data  (in the working directory %s: not there)\n",
            getcwd(cwd, sizeof cwd) != NULL ? cwd : "(unknown)");
    fprintf(f, "  pass --data DIR (the directory holding the data sets, such as a source tree's "
               "data/), or set NABLA_DATA=DIR\n");
}

/* ---- failed library calls ------------------------------------------------------------ */

const char *cli_errmsg(const nb_ctx *ctx, nb_status st) {
    const char *m = ctx != NULL ? nb_ctx_errmsg(ctx) : NULL;
    return m != NULL && m[0] != '\0' ? m : nb_status_string(st);
}

int cli_fail(const char *cmd, const nb_ctx *ctx, nb_status st, const char *fmt, ...) {
    char what[CLI_PATH_MAX + CLI_LINE_MAX]; /* room for a path */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fprintf(stderr, "nabla %s: %s: %s\n", cmd, what, cli_errmsg(ctx, st));
    return 1;
}

const char *cli_hms(double seconds, char *buf, size_t cap) {
    if (!isfinite(seconds)) {
        snprintf(buf, cap, "?");
        return buf;
    }
    if (seconds < 0) {
        seconds = 0;
    }
    if (seconds > 1e12) { /* far beyond any ETA worth reading; keeps the cast defined */
        seconds = 1e12;
    }
    long long t = llround(seconds);
    long long h = t / 3600, m = t / 60 % 60, s = t % 60;
    if (h > 0) {
        snprintf(buf, cap, "%lld:%02lld:%02lld", h, m, s);
    } else {
        snprintf(buf, cap, "%lld:%02lld", m, s);
    }
    return buf;
}

/* ---- progress ----------------------------------------------------------------------- */

static int cli_terminal_cols(void) {
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
        return ws.ws_col;
    }
    return 0;
}

void cli_progress_start(cli_progress *p, int mode, int64_t total) {
    p->bar = mode == 1 || (mode < 0 && isatty(STDOUT_FILENO));
    p->total = total > 0 ? total : 0;
    p->t0 = cli_now_s();
    p->last_draw = -INFINITY;
    p->width = 20;
    p->last_len = 0;
    p->cols = p->bar ? cli_terminal_cols() : 0;
}

/* Writes line (len bytes) over the current terminal line: back to its start, the text cut to
 * the terminal's width, blanks over what is left of the previous one. */
static void cli_progress_put(cli_progress *p, const char *line, size_t len) {
    if (p->cols > 1 && len > (size_t)(p->cols - 1)) {
        len = (size_t)(p->cols - 1); /* the last column would wrap on some terminals */
    }
    fputc('\r', stdout);
    fwrite(line, 1, len, stdout);
    for (size_t i = len; i < p->last_len; i++) {
        fputc(' ', stdout);
    }
    p->last_len = len;
    fflush(stdout);
}

void cli_progress_update(cli_progress *p, int64_t done, const char *fmt, ...) {
    if (!p->bar) {
        return;
    }
    double now = cli_now_s();
    if (done < p->total && now - p->last_draw < 0.1) {
        return;
    }
    p->last_draw = now;
    int64_t total = p->total;
    if (done < 0) {
        done = 0;
    }
    if (done > total) {
        done = total;
    }
    double frac = total > 0 ? (double)done / (double)total : 1.0;
    int width = p->width < 1 ? 1 : p->width > CLI_BAR_MAX ? CLI_BAR_MAX : p->width;
    int fill = (int)(frac * (double)width);
    char bar[CLI_BAR_MAX + 1];
    for (int i = 0; i < width; i++) {
        bar[i] = i < fill ? '#' : '.';
    }
    bar[width] = '\0';
    double elapsed = now - p->t0;
    double eta = done > 0 ? elapsed * (double)(total - done) / (double)done : NAN;
    char hms[32];
    char line[CLI_LINE_MAX];
    int n = snprintf(line, sizeof line, "  [%s] %3d%%  ETA %s", bar, (int)(100.0 * frac),
                     cli_hms(eta, hms, sizeof hms));
    size_t len = n < 0 ? 0 : (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    if (fmt != NULL && len + 2 < sizeof line) {
        line[len++] = ' ';
        line[len++] = ' ';
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(line + len, sizeof line - len, fmt, ap);
        va_end(ap);
        if (m > 0) {
            len += (size_t)m < sizeof line - len ? (size_t)m : sizeof line - len - 1;
        }
    }
    cli_progress_put(p, line, len);
}

void cli_progress_line(cli_progress *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (!p->bar) {
        vprintf(fmt, ap);
        va_end(ap);
        fputc('\n', stdout);
        fflush(stdout);
        return;
    }
    char line[CLI_LINE_MAX];
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    if (p->last_len > 0) { /* over the bar: blank it, then the line */
        fputc('\r', stdout);
        for (size_t i = 0; i < p->last_len; i++) {
            fputc(' ', stdout);
        }
        fputc('\r', stdout);
    }
    fwrite(line, 1, len, stdout);
    fputc('\n', stdout);
    p->last_len = 0;
    p->last_draw = -INFINITY; /* the bar comes back at the next update */
    fflush(stdout);
}

void cli_progress_end(cli_progress *p) {
    if (p->bar && p->last_len > 0) {
        fputc('\n', stdout);
        fflush(stdout);
    }
    p->last_len = 0;
}

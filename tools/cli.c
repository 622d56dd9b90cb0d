/*
 * cli.c -- what the subcommands of the `nabla` program share: option values read with clear
 * messages, the monotonic clock, and a progress display (cli.h).
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

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
    /* the whole string: no leading blanks (strtoll would skip them), nothing after */
    bool ok = end != s && *end == '\0' && errno == 0 && !isspace((unsigned char)s[0]);
    if (!ok || v < lo || v > hi) {
        if (hi == INT64_MAX) {
            fprintf(stderr, "nabla %s: %s wants an integer >= %lld, got '%s'\n", cmd, opt,
                    (long long)lo, s);
        } else {
            fprintf(stderr, "nabla %s: %s wants an integer in [%lld, %lld], got '%s'\n", cmd, opt,
                    (long long)lo, (long long)hi, s);
        }
        return 2;
    }
    *out = (int64_t)v;
    return 0;
}

int cli_f64(const char *cmd, const char *opt, const char *s, double lo, double hi, bool open_lo,
            bool open_hi, double *out) {
    char *end = NULL;
    double v = strtod(s, &end);
    bool ok = end != s && *end == '\0' && isfinite(v) && !isspace((unsigned char)s[0]);
    ok = ok && (open_lo ? v > lo : v >= lo) && (open_hi ? v < hi : v <= hi);
    if (!ok) {
        char range[96];
        if (isinf(hi) && hi > 0) {
            snprintf(range, sizeof range, "%s %g", open_lo ? ">" : ">=", lo);
        } else {
            snprintf(range, sizeof range, "in %c%g, %g%c", open_lo ? '(' : '[', lo, hi,
                     open_hi ? ')' : ']');
        }
        fprintf(stderr, "nabla %s: %s wants a number %s, got '%s'\n", cmd, opt, range, s);
        return 2;
    }
    *out = v;
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

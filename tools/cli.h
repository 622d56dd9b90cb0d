/*
 * cli.h -- what the subcommands of the `nabla` program share (cli.c): reading option values
 * with clear messages, where the data sets are, reporting a failed library call, the clock,
 * and a progress display that is a bar with an ETA on a terminal and plain lines otherwise.
 *
 * Option readers print one line, "nabla <cmd>: <opt> wants ..., got '<value>'" (and why,
 * when that is not plain), to stderr and return 2 (the exit code for bad usage) on a bad
 * value; 0 and *out set otherwise (*out untouched on error).
 */
#ifndef NABLA_TOOLS_CLI_H
#define NABLA_TOOLS_CLI_H

#include <nabla/core.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* The longest path option value, in bytes (--data, bench's --out), and the longest directory
 * path cli_data_dir() returns (strlen < CLI_PATH_MAX): a buffer of CLI_PATH_MAX + 64 bytes
 * holds either joined with a file name. */
enum { CLI_PATH_OPT_MAX = 1024, CLI_PATH_MAX = 4096 };

/* Seconds on the monotonic clock. */
double cli_now_s(void);

/* An integer in [lo, hi] (decimal, the whole string: no blanks, nothing after the digits,
 * within 64 bits). */
int cli_i64(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);

/* A finite number in the interval from lo to hi; open_lo / open_hi exclude that end. The
 * message shows the interval in the usual notation, e.g. "(0, 10)" or "[0.01, 0.9)". The
 * whole string must be a number (cli_parse_f64): 1e400 (overflow) and 1e-400 (underflow,
 * which strtod would quietly turn into 0) are refused. */
int cli_f64(const char *cmd, const char *opt, const char *s, double lo, double hi, bool open_lo,
            bool open_hi, double *out);

/* Reads all of s as a finite double (decimal or hexadecimal, as strtod). true and *out set;
 * else false and *why set to a short reason for a message ("not a number", "too large for a
 * double", ...). Refuses what strtod would change silently: a value out of range
 * (ERANGE: beyond DBL_MAX, or below DBL_MIN in magnitude), and 0 read from a literal with a
 * nonzero digit. Prints nothing. */
bool cli_parse_f64(const char *s, double *out, const char **why);

/* A directory path option: 1 to CLI_PATH_OPT_MAX bytes. An empty one is refused: it would
 * read "/<file>" from the root directory. *out = s. */
int cli_dir_path(const char *cmd, const char *opt, const char *s, const char **out);

/* ---- the data sets ------------------------------------------------------------------ */

/* The directory of the data sets when no --data is given, decided once per process
 * (thread-safe), the first of:
 *   - $NABLA_DATA, when set and not empty (used as given: a wrong one is reported when a
 *     file cannot be read);
 *   - the data sets installed with the program: <directory of the running program>/
 *     NABLA_BIN_TO_DATA (a compile definition, the relative path from the install's bin
 *     directory to <datadir>/nabla/data), when that is a directory; found from
 *     /proc/self/exe, so it follows the program wherever `cmake --install --prefix` put it;
 *   - ./data, when that is a directory (a source tree's data/ as the working directory).
 * Never NULL: when none is found, "data", and cli_data_dir_source() returns NULL. */
const char *cli_data_dir(void);

/* How cli_data_dir() was chosen, for a message: "from NABLA_DATA", "installed with nabla",
 * "./data in the working directory"; NULL when nothing was found. */
const char *cli_data_dir_source(void);

/* Prints to f, indented, after a data set could not be read from cli_data_dir(): where the
 * directory came from (or, when nothing was found, every place looked in) and how to point
 * at the data sets (--data DIR, NABLA_DATA=DIR). */
void cli_data_dir_explain(FILE *f);

/* ---- failed library calls ----------------------------------------------------------- */

/* The library's message for a call that returned st: the context's (nb_ctx_errmsg) when
 * there is one, else the status's description. Borrowed from ctx or static. */
const char *cli_errmsg(const nb_ctx *ctx, nb_status st);

/* Prints "nabla <cmd>: <what>: <cli_errmsg(ctx, st)>" as one line to stderr, <what> from fmt
 * (printf-style, e.g. "cannot read the data set %s"); returns 1, the exit code of a run that
 * failed. */
int cli_fail(const char *cmd, const nb_ctx *ctx, nb_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* --progress MODE: "bar" (1), "lines" (0) or "auto" (-1). */
int cli_progress_mode(const char *cmd, const char *s, int *mode);

/* A progress display over `total` units of work (steps, cells). On a terminal (mode 1, or
 * -1 with stdout a tty): one line redrawn in place, at most 10 times a second,
 *     "  [#########...........]  41%  ETA 0:12  <text>"
 * the ETA from the elapsed time and the share done. Otherwise cli_progress_line prints
 * its text as a plain line and cli_progress_update prints nothing. Writes to stdout; one
 * thread at a time (callers from several threads hold a lock around each call). */
typedef struct cli_progress {
    bool bar;         /* drawing a bar (else plain lines) */
    int64_t total;    /* units of work in all */
    double t0;        /* cli_now_s() at start */
    double last_draw; /* when the bar was last drawn */
    int width;        /* the bar's width in characters */
    size_t last_len;  /* the length of the line last drawn (to blank what is left of it) */
    int cols;         /* the terminal's columns (the bar's line is cut to fit; 0: unknown) */
} cli_progress;

/* mode as from cli_progress_mode. The bar is 20 characters wide; set p->width after this
 * call for another width (at most 100). */
void cli_progress_start(cli_progress *p, int mode, int64_t total);

/* done of total units finished; text (printf-style, may be NULL) shown after the ETA. Draws
 * the bar when due (always when done == total). Nothing when not drawing a bar. */
void cli_progress_update(cli_progress *p, int64_t done, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A line of its own: on a terminal it is printed above the bar (the bar is redrawn below it
 * at the next update); otherwise printed as is, with a newline, and flushed. */
void cli_progress_line(cli_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Ends the bar's line (a newline, when a bar was drawn). */
void cli_progress_end(cli_progress *p);

/* "1:05" or "1:02:03" for a number of seconds (buf >= 16 bytes; "?" when not finite). */
const char *cli_hms(double seconds, char *buf, size_t cap);

#endif

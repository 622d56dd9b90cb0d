/*
 * cli.h -- what the subcommands of the `nabla` program share (cli.c): reading option values
 * with clear messages, the clock, and a progress display that is a bar with an ETA on a
 * terminal and plain lines otherwise.
 *
 * Option readers print "nabla <cmd>: <opt> wants ..., got '<value>'" to stderr and return
 * 2 (the exit code for bad usage) on a bad value; 0 and *out set otherwise (*out untouched
 * on error).
 */
#ifndef NABLA_TOOLS_CLI_H
#define NABLA_TOOLS_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Seconds on the monotonic clock. */
double cli_now_s(void);

/* An integer in [lo, hi] (decimal, the whole string). */
int cli_i64(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);

/* A finite number in the interval from lo to hi; open_lo / open_hi exclude that end. The
 * message shows the interval in the usual notation, e.g. "(0, 10)" or "[0.01, 0.9)". */
int cli_f64(const char *cmd, const char *opt, const char *s, double lo, double hi, bool open_lo,
            bool open_hi, double *out);

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

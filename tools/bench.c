/*
 * bench.c -- `nabla bench`: a reproducible optimizer benchmark suite.
 *
 * The suite is every cell (problem, optimizer, learning rate, seed) of the problems in
 * bench_problems.c, the optimizers of nabla/optim.h, a small log-spaced learning-rate grid
 * per optimizer and a list of seeds. A cell runs `steps` steps of one jitted, donated
 * function (value_and_grad of the loss, the optimizer's update, apply_updates) and logs the
 * loss (and, for classifiers, the test accuracy) every `log_every` steps. A stochastic
 * problem's step takes a minibatch of its training split (bench_stream, from the cell key);
 * it logs the loss on its train_eval split (DeepOBS's: the first min(n_train, n_test)
 * training rows), on the validation and on the test split.
 * With --tune random:K the settings are K trials per optimizer, hyperparameters drawn from
 * the search spaces of bench_problems.h (bench_trial): every trial runs on the first seed,
 * then the chosen one (BN_CHOSEN_TEXT) on the other seeds -- a second phase, after the
 * first has finished (and been read back by every process under mpirun).
 *
 * Reproducible means the same bytes:
 *   - a cell's randomness is one Threefry key, fold_in(key(seed), fnv1a(problem)) (bench_cell_key):
 * every optimizer and learning rate starts from the same point on the same data (a fair
 *     comparison), and a cell run alone gives what it gives inside the suite;
 *   - each cell runs in a context of its own, and nabla's kernels give the same bits for any
 *     thread count, so --threads (kernel threads) and --jobs (cells at once) change nothing;
 *   - a finished cell is written atomically to <out>/cells/, and everything else
 *     (results.csv, summary.json, summary.md, the plots) is made from those files in a fixed
 *     order: an interrupted run continued with --resume ends with the same bytes;
 *   - numbers are printed so that they read back exactly (%.9g for f32, read back as a float;
 *     %.17g for f64), with no times or dates in the results; the summary and the plots are
 *     made from the rows as the cell files read back (an accuracy has 6 decimals), in a run
 *     straight through as after --resume.
 * The summary and the plots leave out of their means and ranges the cells that diverged
 * (BN_DIVERGED_TEXT), and flag them: an optimizer that diverged at every learning rate has no
 * best rate.
 * The SHA-256 of results.csv is printed last.
 */
#define _POSIX_C_SOURCE 200809L

#include "bench_problems.h"
#include "cli.h"
#include "cli_dist.h"
#include "commands.h"
#include "sha256.h"

#include <nabla/nabla.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

enum {
    BN_MAX_PROBLEMS = 32,
    BN_N_OPTIMS = 9,
    BN_MAX_LRS = 16,
    BN_MAX_TRIALS = 64,
    BN_MAX_SETTINGS = 64, /* max(BN_MAX_LRS, BN_MAX_TRIALS) */
    BN_MAX_SEEDS = 64
};

/* What the summary and the plots call diverged (bn_cell_diverged), and how they pick the best
 * learning rate (bn_summarize); --help, summary.md and summary.json say it in these words. */
#define BN_DIVERGED_FACTOR 1000.0 /* the 1000 of BN_DIVERGED_TEXT */
#define BN_DIVERGED_TEXT                                                                           \
    "its loss became inf or nan (the cell stops there) or its final loss is more than 1000 "       \
    "times its loss at step 0"
#define BN_BEST_TEXT                                                                               \
    "the fewest seeds diverged, then the lowest mean final loss over the seeds that did not "      \
    "diverge, then the smaller rate"

/* ---- the optimizers and their default learning-rate grids ------------------------------- */

typedef struct bn_optim {
    const char *name, *title;
    double lo, hi; /* the default grid: lo .. hi, log-spaced */
    int n;
    const char *color; /* its curve in every plot; variants of one method share a colour */
    int dash;          /* and differ in dash type */
} bn_optim;

/* Optax's defaults for everything but the learning rate (nabla/optim.h lists them). */
static const bn_optim bn_optims[BN_N_OPTIMS] = {
    {"sgd", "SGD", 1e-4, 1e-1, 4, "#1f77b4", 1},
    {"momentum", "SGD, momentum 0.9", 1e-4, 1e-1, 4, "#ff7f0e", 1},
    {"nesterov", "SGD, Nesterov 0.9", 1e-4, 1e-1, 4, "#ff7f0e", 2},
    {"adam", "Adam", 1e-4, 1e-1, 4, "#d62728", 1},
    {"adamw", "AdamW (decay 1e-4)", 1e-4, 1e-1, 4, "#d62728", 2},
    {"rmsprop", "RMSprop", 1e-4, 1e-1, 4, "#2ca02c", 1},
    {"adagrad", "Adagrad", 1e-3, 1.0, 4, "#8c564b", 1},
    {"lion", "Lion (decay 1e-3)", 1e-4, 1e-1, 4, "#9467bd", 1},
    {"lamb", "LAMB", 1e-4, 1e-1, 4, "#17becf", 1},
};

/* Optimizer k at rate lr, its other hyperparameters Optax's defaults or (a --tune trial)
 * hp's, where they are not NAN. */
static nb_status bn_make_optim(nb_ctx *ctx, int k, double lr, const bench_hp *hp, nb_tree **out) {
    nb_optim_opts o = nb_optim_opts_default();
    if (hp != NULL) {
        o.b1 = hp->b1;
        o.b2 = hp->b2;
        o.eps = hp->eps;
        o.weight_decay = hp->weight_decay;
        o.decay = hp->decay;
    }
    switch (k) {
    case 0:
        return nb_optim_sgd(ctx, lr, &o, out);
    case 1:
    case 2:
        o.momentum = hp != NULL ? hp->momentum : 0.9;
        o.nesterov = k == 2;
        return nb_optim_sgd(ctx, lr, &o, out);
    case 3:
        return nb_optim_adam(ctx, lr, &o, out);
    case 4:
        return nb_optim_adamw(ctx, lr, &o, out);
    case 5:
        return nb_optim_rmsprop(ctx, lr, &o, out);
    case 6:
        return nb_optim_adagrad(ctx, lr, &o, out);
    case 7:
        return nb_optim_lion(ctx, lr, &o, out);
    default:
        return nb_optim_lamb(ctx, lr, &o, out);
    }
}

/* ---- text buffers and files ------------------------------------------------------------ */

typedef struct bn_buf {
    char *s;
    size_t len, cap;
    bool oom;
} bn_buf;

static void bn_printf(bn_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bn_printf(bn_buf *b, const char *fmt, ...) {
    if (b->oom) {
        return;
    }
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s != NULL ? b->s + b->len : NULL, b->s != NULL ? b->cap - b->len : 0,
                          fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->s != NULL && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap < 4096 ? 4096 : b->cap;
        while (cap <= b->len + (size_t)n) {
            cap *= 2;
        }
        char *s = realloc(b->s, cap);
        if (s == NULL) {
            b->oom = true;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

/* n bytes as they are (NULs too); the buffer stays NUL-terminated. */
static void bn_append(bn_buf *b, const void *data, size_t n) {
    if (b->oom) {
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap < 4096 ? 4096 : b->cap;
        while (cap < b->len + n + 1) {
            cap *= 2;
        }
        char *s = realloc(b->s, cap);
        if (s == NULL) {
            b->oom = true;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
    memcpy(b->s + b->len, data, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void bn_buf_free(bn_buf *b) {
    free(b->s);
    memset(b, 0, sizeof *b);
}

/* A number as it goes into the results: exact for its dtype, "nan"/"inf"/"-inf" spelled
 * one way. */
static void bn_num(bn_buf *b, double v, bool f64) {
    if (isnan(v)) {
        bn_printf(b, "nan");
    } else if (isinf(v)) {
        bn_printf(b, v > 0 ? "inf" : "-inf");
    } else {
        bn_printf(b, f64 ? "%.17g" : "%.9g", v);
    }
}

/* JSON has no inf or nan: null. */
static void bn_json_num(bn_buf *b, double v) {
    if (isfinite(v)) {
        bn_printf(b, "%.17g", v);
    } else {
        bn_printf(b, "null");
    }
}

/* snprintf for paths and messages that may be cut short (vsnprintf: no truncation
 * warnings for what is bounded by design; --out is limited to 1024 bytes). */
static void bn_fmt(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void bn_fmt(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

static int bn_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) {
        return -1;
    }
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Write path atomically: a temporary file beside it, fsync, rename, fsync the directory.
 * On failure nothing is left behind and errno says why. */
static int bn_write_atomic(const char *dir, const char *name, const char *text, size_t len) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s/.%s.XXXXXX", dir, name);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        return -1;
    }
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, text + done, len - done);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            break;
        }
        done += (size_t)w;
    }
    int err = done == len && fchmod(fd, 0644) == 0 && fsync(fd) == 0 ? 0 : errno;
    if (close(fd) != 0 && err == 0) {
        err = errno;
    }
    if (err == 0 && rename(tmp, path) != 0) {
        err = errno;
    }
    if (err != 0) {
        unlink(tmp);
        errno = err;
        return -1;
    }
    bn_fsync_dir(dir);
    return 0;
}

/* The whole file (with a NUL after it; NULs inside are kept: *len counts them) or NULL. */
static char *bn_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    bn_buf b = {0};
    char chunk[8192];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        bn_append(&b, chunk, n);
    }
    bool bad = ferror(f) || b.oom;
    fclose(f);
    if (bad) {
        bn_buf_free(&b);
        return NULL;
    }
    if (b.s == NULL) {
        b.s = calloc(1, 1);
    }
    if (len != NULL) {
        *len = b.len;
    }
    return b.s;
}

/* ---- configuration --------------------------------------------------------------------- */

typedef struct bn_cfg {
    int problems[BN_MAX_PROBLEMS], n_problems; /* indices into bench_problems, ascending */
    bool optim_on[BN_N_OPTIMS];
    /* the settings of each optimizer: its learning rates (ascending, each read back from
     * its %.6g text), or with --tune its trials (their learning rates here, the rest in hps) */
    double lrs[BN_N_OPTIMS][BN_MAX_SETTINGS];
    int n_lrs[BN_N_OPTIMS];
    int tune_k;         /* > 0: --tune random:K */
    uint64_t tune_seed; /* its SEED */
    bench_hp hps[BN_N_OPTIMS][BN_MAX_TRIALS];
    uint64_t seeds[BN_MAX_SEEDS]; /* ascending, distinct */
    int n_seeds;
    int64_t steps, log_every;
    int threads, jobs, progress;
    const char *out, *data;
    bool resume, overwrite, plots;
    int cell_start[BN_MAX_PROBLEMS][BN_N_OPTIMS]; /* the first cell of (problem, optimizer) */
} bn_cfg;

/* text on f in lines of at most 84 columns, broken at spaces. */
static void bn_wrap(FILE *f, const char *text) {
    const char *p = text;
    while (*p != '\0') {
        size_t n = strlen(p);
        if (n > 84) {
            n = 84;
            while (n > 0 && p[n] != ' ') {
                n--;
            }
            n = n > 0 ? n : 84;
        }
        fprintf(f, "%.*s\n", (int)n, p);
        p += n;
        while (*p == ' ') {
            p++;
        }
    }
}

static void bn_usage(FILE *f) {
    fprintf(f, "usage: nabla bench [options]\n\n"
               "Run a reproducible optimizer benchmark: every problem x optimizer x learning\n"
               "rate (or --tune trial) x seed for a number of steps, full-batch or on\n"
               "minibatches. Writes results.csv (every logged step), report.html (one page:\n"
               "the summary and every plot), summary.json and summary.md (per problem and\n"
               "optimizer: the best learning rate, the final loss mean +- std over seeds, how\n"
               "many seeds diverged, the steps to the problem's target loss),\n"
               "plots/<problem>.png (loss against step at the best learning rate of each\n"
               "optimizer: the mean over seeds, a band from their min to their max, the target\n"
               "loss as a line) and plots/<problem>_lr.png (final loss against learning rate,\n"
               "one line per optimizer), drawn by gnuplot, into the output directory, prints\n"
               "the summary table, and last the SHA-256 of results.csv: the same options give\n"
               "the same bytes on every run, for any --threads and --jobs, and after an\n"
               "interrupted run is resumed.\n\n"
               "options:\n"
               "  --problems LIST    comma-separated problems or groups: full-batch (the\n"
               "                     default), stochastic, all. Full-batch:\n");
    for (int i = 0; i < bench_n_problems; i++) {
        if (bench_problems[i].batch == 0) {
            fprintf(f, "                       %-17s %s\n", bench_problems[i].name,
                    bench_problems[i].title);
        }
    }
    fprintf(f, "                     Stochastic (each step on a minibatch of the training\n"
               "                     split; logged: the training loss (on train_eval,\n"
               "                     as many training rows as the test split has),\n"
               "                     the validation and test losses, the test accuracy):\n");
    for (int i = 0; i < bench_n_problems; i++) {
        if (bench_problems[i].batch > 0) {
            fprintf(f, "                       %-17s %s\n", bench_problems[i].name,
                    bench_problems[i].title);
        }
    }
    fprintf(f, "  --optimizers LIST  comma-separated (default: all); with their default\n"
               "                     learning-rate grids (Optax's defaults otherwise):\n");
    for (int k = 0; k < BN_N_OPTIMS; k++) {
        fprintf(f, "                       %-9s %-20s %g .. %g, %d values\n", bn_optims[k].name,
                bn_optims[k].title, bn_optims[k].lo, bn_optims[k].hi, bn_optims[k].n);
    }
    fprintf(f, "  --lrs GRID         the learning rates of every optimizer: a comma-separated\n"
               "                     list (0.001,0.01) or LO:HI:N, N values log-spaced from LO\n"
               "                     to HI; each rounded to 6 significant digits\n"
               "  --lr NAME=GRID     the same for one optimizer (may be repeated; wins over\n"
               "                     --lrs)\n"
               "  --tune random:K[:SEED]\n"
               "                     instead of the grids, K trials per optimizer with\n"
               "                     hyperparameters drawn from log-uniform search spaces\n"
               "                     (the learning rate; b1, b2, eps, weight decay, momentum\n"
               "                     or decay where the optimizer has them; the draws are\n"
               "                     listed in run.cfg), from the key of SEED (default 0):\n"
               "                     every trial runs on the first seed, the one with the\n"
               "                     lowest final validation loss (full-batch problems: the\n"
               "                     final loss) then on every seed\n"
               "  --seeds LIST       comma-separated seeds (default 0,1)\n"
               "  --steps N          optimizer steps per cell (default 1000)\n"
               "  --log-every N      log loss and accuracy every N steps (default steps/50; the\n"
               "                     first and the last step are always logged)\n"
               "  --out DIR          the output directory (default bench-results)\n"
               "  --data DIR         the UCI data sets (default: $NABLA_DATA, the installed\n"
               "                     data sets, or ./data; nabla --version shows which)\n"
               "  --resume           continue the run in --out with the same options: finished\n"
               "                     cells are kept, the rest are run\n"
               "  --overwrite        start again in an --out that holds a run\n"
               "  --no-plots         do not draw the plots\n"
               "  --threads N        kernel threads per cell, 0 = all cores (default 1)\n"
               "  --jobs N           cells run at once, each on its own thread (default 1)\n"
               "  --progress MODE    bar, lines or auto (bar on a terminal; default auto)\n"
               "\n"
               "A single cell alone: --problems P --optimizers O --lrs LR --seeds S (with the\n"
               "suite's --steps) gives the rows it has in the full suite, bit for bit.\n"
               "\n"
               "On several processes: mpirun -np N nabla bench [options] shares the cells out\n"
               "(cell i of those to run on process i mod N, each with its --jobs); process 0\n"
               "writes the results, the same files as one process.\n");
    bn_wrap(f, "A cell diverged when " BN_DIVERGED_TEXT ". The best learning rate has " BN_BEST_TEXT
               "; the final loss, the accuracy and the plots' curves and y ranges are over the "
               "seeds that did not diverge (an optimizer that diverged at every rate is drawn "
               "clipped, at its smallest rate). Steps to target: the first step, of every step, "
               "whose loss is at or below the problem's target (a stochastic problem: the first "
               "logged step whose train_eval loss is); the mean is over the seeds that got "
               "there. Without --tune a stochastic problem's best rate is judged on that "
               "training loss too; --tune chooses on the validation loss. \"The first seed\" is "
               "the smallest of --seeds. Every run also writes report.html: the summary and "
               "the curves as one self-contained page (inline SVG).");
}

static int bn_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bn_err(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "nabla bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 2;
}

/* Comma-separated items; calls item() on each (non-empty) one. */
static int bn_split(const char *s, const char *opt, void *ud,
                    int (*item)(void *ud, const char *opt, const char *tok)) {
    char tok[256];
    const char *p = s;
    if (*s == '\0') {
        return bn_err("%s wants a comma-separated list, got ''", opt);
    }
    for (;;) {
        const char *c = strchr(p, ',');
        size_t n = c != NULL ? (size_t)(c - p) : strlen(p);
        if (n == 0 || n >= sizeof tok) {
            return bn_err("%s: an empty or overlong item in '%s'", opt, s);
        }
        memcpy(tok, p, n);
        tok[n] = '\0';
        int rc = item(ud, opt, tok);
        if (rc != 0) {
            return rc;
        }
        if (c == NULL) {
            return 0;
        }
        p = c + 1;
    }
}

static int bn_problem_item(void *ud, const char *opt, const char *tok) {
    bool *on = ud;
    bool full = strcmp(tok, "full-batch") == 0, stoch = strcmp(tok, "stochastic") == 0;
    if (full || stoch || strcmp(tok, "all") == 0) {
        for (int i = 0; i < bench_n_problems && i < BN_MAX_PROBLEMS; i++) {
            on[i] = on[i] || (!full && !stoch) || (full == (bench_problems[i].batch == 0));
        }
        return 0;
    }
    const bench_problem *p = bench_problem_find(tok);
    if (p == NULL) {
        fprintf(stderr,
                "nabla bench: %s: unknown problem '%s'; the groups are full-batch, stochastic "
                "and all, the problems:",
                opt, tok);
        for (int i = 0; i < bench_n_problems; i++) {
            fprintf(stderr, " %s", bench_problems[i].name);
        }
        fprintf(stderr, "\n");
        return 2;
    }
    on[p - bench_problems] = true;
    return 0;
}

static int bn_optim_index(const char *name) {
    for (int k = 0; k < BN_N_OPTIMS; k++) {
        if (strcmp(name, bn_optims[k].name) == 0) {
            return k;
        }
    }
    return -1;
}

static int bn_unknown_optim(const char *opt, const char *name) {
    fprintf(stderr, "nabla bench: %s: unknown optimizer '%s'; the optimizers are:", opt, name);
    for (int k = 0; k < BN_N_OPTIMS; k++) {
        fprintf(stderr, " %s", bn_optims[k].name);
    }
    fprintf(stderr, "\n");
    return 2;
}

static int bn_optim_item(void *ud, const char *opt, const char *tok) {
    bool *on = ud;
    int k = bn_optim_index(tok);
    if (k < 0) {
        return bn_unknown_optim(opt, tok);
    }
    on[k] = true;
    return 0;
}

typedef struct bn_seed_list {
    uint64_t *v;
    int n;
} bn_seed_list;

static int bn_seed_item(void *ud, const char *opt, const char *tok) {
    bn_seed_list *l = ud;
    int64_t v = 0;
    int rc = cli_i64("bench", opt, tok, 0, INT64_MAX, &v);
    if (rc != 0) {
        return rc;
    }
    for (int i = 0; i < l->n; i++) {
        if (l->v[i] == (uint64_t)v) {
            return 0; /* a repeat */
        }
    }
    if (l->n == BN_MAX_SEEDS) {
        return bn_err("%s: at most %d seeds", opt, BN_MAX_SEEDS);
    }
    l->v[l->n++] = (uint64_t)v;
    return 0;
}

/* A learning rate as the results show it and as it is used: the double read back from its
 * %.6g text, so that a value copied from results.csv names the same cell. */
static double bn_lr_round(double lr) {
    char s[32];
    snprintf(s, sizeof s, "%.6g", lr);
    return strtod(s, NULL);
}

typedef struct bn_lr_list {
    double *v;
    int n;
} bn_lr_list;

static int bn_lr_add(bn_lr_list *l, const char *opt, double lr) {
    double r = bn_lr_round(lr);
    for (int i = 0; i < l->n; i++) {
        if (l->v[i] == r) {
            return bn_err("%s: the learning rates %.17g and %.17g are the same to 6 significant "
                          "digits (%.6g), which is how results name them",
                          opt, l->v[i], lr, r);
        }
    }
    lr = r;
    if (l->n == BN_MAX_LRS) {
        return bn_err("%s: at most %d learning rates per optimizer", opt, BN_MAX_LRS);
    }
    l->v[l->n++] = lr;
    return 0;
}

static int bn_lr_item(void *ud, const char *opt, const char *tok) {
    double v = 0;
    int rc = cli_f64("bench", opt, tok, 0.0, 1e3, true, true, &v);
    return rc != 0 ? rc : bn_lr_add(ud, opt, v);
}

static int bn_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int bn_cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* GRID: a list, or LO:HI:N. */
static int bn_parse_grid(const char *opt, const char *s, double out[BN_MAX_LRS], int *n) {
    bn_lr_list l = {out, 0};
    if (strchr(s, ':') != NULL) {
        char lo_s[64], hi_s[64], n_s[64];
        const char *c1 = strchr(s, ':'), *c2 = strchr(c1 + 1, ':');
        if (c2 == NULL || strchr(c2 + 1, ':') != NULL || (size_t)(c1 - s) >= sizeof lo_s ||
            (size_t)(c2 - c1 - 1) >= sizeof hi_s || strlen(c2 + 1) >= sizeof n_s) {
            return bn_err("%s wants LO:HI:N (e.g. 1e-4:1e-1:4) or a list, got '%s'", opt, s);
        }
        snprintf(lo_s, sizeof lo_s, "%.*s", (int)(c1 - s), s);
        snprintf(hi_s, sizeof hi_s, "%.*s", (int)(c2 - c1 - 1), c1 + 1);
        snprintf(n_s, sizeof n_s, "%s", c2 + 1);
        double lo = 0, hi = 0;
        int64_t count = 0;
        int rc = cli_f64("bench", opt, lo_s, 0.0, 1e3, true, true, &lo);
        if (rc == 0) {
            rc = cli_f64("bench", opt, hi_s, 0.0, 1e3, true, true, &hi);
        }
        if (rc == 0) {
            rc = cli_i64("bench", opt, n_s, 1, BN_MAX_LRS, &count);
        }
        if (rc != 0) {
            return rc;
        }
        if (hi < lo || (count == 1) != (hi == lo)) {
            return bn_err("%s: '%s' wants LO < HI with N >= 2, or LO = HI with N = 1", opt, s);
        }
        for (int64_t i = 0; i < count && rc == 0; i++) {
            double t = count == 1 ? 0.0 : (double)i / (double)(count - 1);
            rc = bn_lr_add(&l, opt, lo * pow(hi / lo, t));
        }
        if (rc != 0) {
            return rc;
        }
    } else {
        int rc = bn_split(s, opt, &l, bn_lr_item);
        if (rc != 0) {
            return rc;
        }
    }
    qsort(out, (size_t)l.n, sizeof *out, bn_cmp_double);
    *n = l.n;
    return 0;
}

/* 0: go on; -1: --help shown; 2: bad usage (message printed). */
/* --tune random:K[:SEED] */
static int bn_parse_tune(const char *v, bn_cfg *c) {
    char *end = NULL;
    if (strncmp(v, "random:", 7) != 0 || !(v[7] >= '0' && v[7] <= '9')) {
        return bn_err("--tune wants random:K or random:K:SEED (K trials per optimizer), got '%s'",
                      v);
    }
    errno = 0;
    unsigned long long k = strtoull(v + 7, &end, 10), seed = 0;
    if (errno == 0 && *end == ':' && end[1] >= '0' && end[1] <= '9') {
        seed = strtoull(end + 1, &end, 10);
    }
    if (errno != 0 || *end != '\0' || k < 1 || k > BN_MAX_TRIALS) {
        return bn_err("--tune random:K[:SEED]: K from 1 to %d and SEED an integer, got '%s'",
                      BN_MAX_TRIALS, v);
    }
    c->tune_k = (int)k;
    c->tune_seed = seed;
    return 0;
}

static int bn_parse_args(int argc, char **argv, bn_cfg *c) {
    memset(c, 0, sizeof *c);
    c->steps = 1000;
    c->log_every = 0; /* steps / 50 */
    c->threads = 1;
    c->jobs = 1;
    c->progress = -1;
    c->out = "bench-results";
    c->data = cli_data_dir(); /* --data, else $NABLA_DATA, the installed data sets or ./data */
    c->plots = true;
    bool prob_on[BN_MAX_PROBLEMS] = {0}, any_prob = false, any_optim = false;
    bool lr_set[BN_N_OPTIMS] = {0};
    double all_lrs[BN_MAX_LRS];
    int n_all = 0;
    bn_seed_list seeds = {c->seeds, 0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int rc = 0;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            bn_usage(stdout);
            return -1;
        }
        if (strcmp(a, "--resume") == 0) {
            c->resume = true;
            continue;
        }
        if (strcmp(a, "--overwrite") == 0) {
            c->overwrite = true;
            continue;
        }
        if (strcmp(a, "--no-plots") == 0) {
            c->plots = false;
            continue;
        }
        static const char *const with_value[] = {
            "--problems", "--optimizers", "--lrs", "--lr",   "--seeds",
            "--steps",    "--log-every",  "--out", "--data", "--jobs",
            "--threads",  "--progress",   "--tune"};
        bool known = false;
        for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) {
            known = known || strcmp(a, with_value[k]) == 0;
        }
        if (!known) {
            bn_err("unknown option '%s' (nabla bench --help lists them)", a);
            return 2;
        }
        if (i + 1 >= argc) {
            bn_err("%s wants a value", a);
            return 2;
        }
        const char *v = argv[++i];
        int64_t n = 0;
        if (strcmp(a, "--problems") == 0) { /* the last one counts */
            memset(prob_on, 0, sizeof prob_on);
            rc = bn_split(v, a, prob_on, bn_problem_item);
            any_prob = true;
        } else if (strcmp(a, "--optimizers") == 0) {
            memset(c->optim_on, 0, sizeof c->optim_on);
            rc = bn_split(v, a, c->optim_on, bn_optim_item);
            any_optim = true;
        } else if (strcmp(a, "--lrs") == 0) {
            rc = bn_parse_grid(a, v, all_lrs, &n_all);
        } else if (strcmp(a, "--lr") == 0) {
            const char *eq = strchr(v, '=');
            char name[64];
            if (eq == NULL || (size_t)(eq - v) >= sizeof name) {
                rc = bn_err("--lr wants NAME=GRID (e.g. adam=1e-4:1e-2:3), got '%s'", v);
            } else {
                snprintf(name, sizeof name, "%.*s", (int)(eq - v), v);
                int k = bn_optim_index(name);
                if (k < 0) {
                    rc = bn_unknown_optim(a, name);
                } else {
                    rc = bn_parse_grid(a, eq + 1, c->lrs[k], &c->n_lrs[k]);
                    lr_set[k] = true;
                }
            }
        } else if (strcmp(a, "--seeds") == 0) {
            seeds.n = 0;
            rc = bn_split(v, a, &seeds, bn_seed_item);
        } else if (strcmp(a, "--steps") == 0) {
            rc = cli_i64("bench", a, v, 1, INT64_C(100000000), &c->steps);
        } else if (strcmp(a, "--log-every") == 0) {
            rc = cli_i64("bench", a, v, 1, INT64_C(100000000), &c->log_every);
        } else if (strcmp(a, "--out") == 0) {
            c->out = v;
            if (*v == '\0' || strlen(v) > 1024) {
                rc = bn_err("--out wants a directory path of 1 to 1024 bytes");
            }
        } else if (strcmp(a, "--data") == 0) {
            c->data = v;
            if (*v == '\0' || strlen(v) > 1024) {
                rc = bn_err("--data wants a directory path of 1 to 1024 bytes");
            }
        } else if (strcmp(a, "--jobs") == 0) {
            rc = cli_i64("bench", a, v, 1, 256, &n);
            c->jobs = (int)n;
        } else if (strcmp(a, "--threads") == 0) {
            rc = cli_i64("bench", a, v, 0, 256, &n);
            c->threads = (int)n;
        } else if (strcmp(a, "--tune") == 0) {
            rc = bn_parse_tune(v, c);
        } else {
            rc = cli_progress_mode("bench", v, &c->progress);
        }
        if (rc != 0) {
            return rc;
        }
    }
    if (c->resume && c->overwrite) {
        return bn_err("--resume and --overwrite exclude each other");
    }
    if (c->tune_k > 0 && (n_all > 0 || memchr(lr_set, 1, sizeof lr_set) != NULL)) {
        return bn_err("--tune draws the learning rates: it excludes --lrs and --lr");
    }
    for (int k = 0; k < BN_N_OPTIMS; k++) {
        if (lr_set[k] && any_optim && !c->optim_on[k]) {
            return bn_err("--lr %s=...: %s is not among --optimizers", bn_optims[k].name,
                          bn_optims[k].name);
        }
    }
    for (int i = 0; i < bench_n_problems && i < BN_MAX_PROBLEMS; i++) {
        if (any_prob ? prob_on[i] : bench_problems[i].batch == 0) {
            c->problems[c->n_problems++] = i;
        }
    }
    for (int k = 0; k < BN_N_OPTIMS; k++) {
        c->optim_on[k] = !any_optim || c->optim_on[k];
        if (lr_set[k]) {
            continue;
        }
        if (n_all > 0) {
            memcpy(c->lrs[k], all_lrs, (size_t)n_all * sizeof all_lrs[0]);
            c->n_lrs[k] = n_all;
        } else {
            char grid[96];
            snprintf(grid, sizeof grid, "%.17g:%.17g:%d", bn_optims[k].lo, bn_optims[k].hi,
                     bn_optims[k].n);
            int rc = bn_parse_grid("--lrs", grid, c->lrs[k], &c->n_lrs[k]);
            if (rc != 0) {
                return rc;
            }
        }
    }
    if (seeds.n == 0) {
        c->seeds[0] = 0;
        c->seeds[1] = 1;
        seeds.n = 2;
    }
    c->n_seeds = seeds.n;
    qsort(c->seeds, (size_t)c->n_seeds, sizeof c->seeds[0], bn_cmp_u64);
    if (c->log_every == 0) {
        c->log_every = c->steps / 50 > 0 ? c->steps / 50 : 1;
    }
    if (c->steps / c->log_every > 1000000) {
        return bn_err("--steps %" PRId64 " with --log-every %" PRId64 " logs more than 10^6 rows "
                      "a cell; log less often",
                      c->steps, c->log_every);
    }
    return 0;
}

/* A trial's hyperparameters as text: "trial 3 lr 0.00123 b1 0.9 ..." (what it draws). */
static void bn_hp_text(bn_buf *b, int t, const bench_hp *h) {
    bn_printf(b, "trial %d lr %.6g", t, h->lr);
    static const char *const names[] = {"b1", "b2", "eps", "weight_decay", "momentum", "decay"};
    const double v[] = {h->b1, h->b2, h->eps, h->weight_decay, h->momentum, h->decay};
    for (int i = 0; i < 6; i++) {
        if (!isnan(v[i])) {
            bn_printf(b, " %s %.6g", names[i], v[i]);
        }
    }
}

/* What decides the results, one per line -- the options, nabla's version and the SHA-256
 * of every data file the problems read: run.cfg in the output directory. --resume continues
 * a run only when they are the same. 0, or 2 with a message (a data file unreadable). */
static int bn_cfg_text(const bn_cfg *c, bn_buf *b) {
    bn_printf(b, "nabla bench run, format 1\nproblems =");
    for (int i = 0; i < c->n_problems; i++) {
        bn_printf(b, " %s", bench_problems[c->problems[i]].name);
    }
    bn_printf(b, "\n");
    for (int k = 0; k < BN_N_OPTIMS; k++) {
        if (!c->optim_on[k]) {
            continue;
        }
        if (c->tune_k > 0) {
            bn_printf(b, "optimizer %s, trials:\n", bn_optims[k].name);
            for (int t = 0; t < c->n_lrs[k]; t++) {
                bn_hp_text(b, t, &c->hps[k][t]);
                bn_printf(b, "\n");
            }
            continue;
        }
        bn_printf(b, "optimizer %s, learning rates =", bn_optims[k].name);
        for (int l = 0; l < c->n_lrs[k]; l++) {
            bn_printf(b, " %.6g", c->lrs[k][l]);
        }
        bn_printf(b, "\n");
    }
    if (c->tune_k > 0) {
        bn_printf(b, "tune = random %d seed %" PRIu64 " (the trials on the first seed)\n",
                  c->tune_k, c->tune_seed);
    }
    bn_printf(b, "seeds =");
    for (int s = 0; s < c->n_seeds; s++) {
        bn_printf(b, " %" PRIu64, c->seeds[s]);
    }
    bn_printf(b, "\nsteps = %" PRId64 "\nlog every = %" PRId64 "\nnabla %s\n", c->steps,
              c->log_every, nb_version());
    for (int i = 0; i < c->n_problems; i++) {
        const char *f = bench_problems[c->problems[i]].data_file;
        if (f == NULL) {
            continue;
        }
        char path[2200], hex[65];
        bn_fmt(path, sizeof path, "%s/%s", c->data, f);
        if (sha256_file(path, hex) != 0) {
            return bn_err("cannot read %s: %s (--data names the directory of the UCI data sets)",
                          path, strerror(errno));
        }
        bn_printf(b, "data %s sha256 %s\n", f, hex);
    }
    return 0;
}

/* ---- cells ----------------------------------------------------------------------------- */

typedef struct bn_row {
    int64_t step;
    double loss, acc;   /* acc NaN when the problem has none */
    double valid, test; /* a stochastic problem's validation and test losses, else NaN */
} bn_row;

typedef struct bn_cell {
    int p, o;   /* problem (index into bench_problems), optimizer */
    int l;      /* learning rate (index into the optimizer's grid), or --tune's trial */
    int k;      /* the seed's index in cfg->seeds */
    bool trial; /* a --tune trial: l is its number */
    double lr;  /* its value */
    char lr_s[32];
    uint64_t seed;
    char file[256]; /* under <out>/cells */
    /* the outcome */
    bool done;
    bn_row *rows;
    int64_t n_rows;
    int64_t reached; /* the first step whose loss is <= the target; -1: never */
    bool diverged;   /* stopped at a non-finite loss */
    bool f64;        /* the loss's dtype */
    char *text;      /* the cell's results.csv lines */
    size_t text_len;
    double secs;
    double reached_secs; /* when this run reached the target: seconds from the cell's start
                          * (setup, compile and logging included); NaN otherwise -- printed,
                          * in no file */
} bn_cell;

/* results.csv's line for one row. */
static void bn_row_text(bn_buf *b, const bn_cell *c, const bn_row *r) {
    const bench_problem *p = &bench_problems[c->p];
    bn_printf(b, "%s,%s,", p->name, bn_optims[c->o].name);
    if (c->trial) {
        bn_printf(b, "%d", c->l);
    }
    bn_printf(b, ",%s,%" PRIu64 ",%" PRId64 ",", c->lr_s, c->seed, r->step);
    bn_num(b, r->loss, c->f64);
    bn_printf(b, ",");
    if (p->has_accuracy && isnan(r->acc)) {
        bn_printf(b, "nan");
    } else if (p->has_accuracy) {
        bn_printf(b, "%.6f", r->acc);
    }
    bn_printf(b, ",");
    if (p->batch > 0 && !isnan(r->valid)) {
        bn_num(b, r->valid, c->f64);
    } else if (p->batch > 0) {
        bn_printf(b, "nan");
    }
    bn_printf(b, ",");
    if (p->batch > 0 && !isnan(r->test)) {
        bn_num(b, r->test, c->f64);
    } else if (p->batch > 0) {
        bn_printf(b, "nan");
    }
    bn_printf(b, "\n");
}

/* The cell file's first line: who it is and how it ended. */
static void bn_cell_head(bn_buf *b, const bn_cell *c, const bn_cfg *cfg) {
    bn_printf(b, "# cell %s %s ", bench_problems[c->p].name, bn_optims[c->o].name);
    if (c->trial) { /* the trial's number and every hyperparameter it drew */
        bn_hp_text(b, c->l, &cfg->hps[c->o][c->l]);
    } else {
        bn_printf(b, "lr %s", c->lr_s);
    }
    bn_printf(b, " seed %" PRIu64 " steps %" PRId64 " log_every %" PRId64 " dtype %s", c->seed,
              cfg->steps, cfg->log_every, c->f64 ? "f64" : "f32");
}

static bool bn_row_add(bn_cell *c, int64_t *cap, int64_t step, double loss, double acc,
                       double valid, double test) {
    if (c->n_rows == *cap) {
        int64_t nc = *cap < 16 ? 16 : 2 * *cap;
        bn_row *r = realloc(c->rows, (size_t)nc * sizeof *r);
        if (r == NULL) {
            return false;
        }
        c->rows = r;
        *cap = nc;
    }
    c->rows[c->n_rows++] = (bn_row){step, loss, acc, valid, test};
    return true;
}

static bool bn_cell_rows(bn_cell *c, const bn_cfg *cfg, const char *body, const char *end);

/* ---- running one cell -------------------------------------------------------------------- */

/* eval(params, data) -> (loss, accuracy) or (loss,); self = the problem's index. */
static nb_status bn_eval_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    int64_t pi = 0;
    nb_tree_get_int(self, &pi);
    const bench_problem *p = &bench_problems[pi];
    const nb_tree *params = nb_tree_child(args, 0), *data = nb_tree_child(args, 1);
    nb_var *loss = p->loss(tr, params, data);
    nb_var *acc = p->has_accuracy ? p->accuracy(tr, params, data) : NULL;
    if (nb_trace_status(tr) != NB_OK) {
        return nb_trace_status(tr);
    }
    nb_tree *items[2] = {nb_leaf(loss), acc != NULL ? nb_leaf(acc) : NULL};
    return nb_tree_tuple(nb_trace_ctx(tr), acc != NULL ? 2 : 1, items, out);
}

static double bn_scalar(const nb_tree *t, bool *f64) {
    const nb_array *a = nb_tree_get_array(t);
    double v = NAN;
    if (a == NULL || nb_array_get_flat(a, 0, &v) != NB_OK) {
        return NAN;
    }
    if (f64 != NULL) {
        *f64 = nb_array_dtype(a) == NB_DTYPE_F64;
    }
    return v;
}

/* Progress shared by the workers. */
typedef struct bn_shared {
    pthread_mutex_t mu;
    cli_progress prog;
    int64_t steps_done;
    int cells_done, cells_total;
} bn_shared;

static void bn_progress_steps(bn_shared *sh, const bn_cell *c, int64_t steps) {
    if (sh == NULL) {
        return;
    }
    pthread_mutex_lock(&sh->mu);
    sh->steps_done += steps;
    cli_progress_update(&sh->prog, sh->steps_done, "cell %d/%d  %s %s lr %s seed %" PRIu64,
                        sh->cells_done + 1, sh->cells_total, bench_problems[c->p].name,
                        bn_optims[c->o].name, c->lr_s, c->seed);
    pthread_mutex_unlock(&sh->mu);
}

#define BN_CHECK(expr)                                                                             \
    do {                                                                                           \
        st = (expr);                                                                               \
        if (st != NB_OK) {                                                                         \
            snprintf(err, err_cap, "%s %s lr %s seed %" PRIu64 ": %s", bench_problems[c->p].name,  \
                     bn_optims[c->o].name, c->lr_s, c->seed, cli_errmsg(ctx, st));                 \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* Run cell c: its rows, reached, diverged. Returns 0, or 1 with err set. */
static int bn_run_cell(bn_cell *c, const bn_cfg *cfg, bn_shared *sh, char *err, size_t err_cap) {
    const bench_problem *p = &bench_problems[c->p];
    nb_ctx_opts co = nb_ctx_opts_default();
    co.n_threads = cfg->threads;
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(&co, &ctx) != NB_OK) {
        snprintf(err, err_cap, "cannot create a context");
        return 1;
    }
    double t0 = cli_now_s();
    nb_status st = NB_OK;
    int rc = 1;
    int64_t cap = 0, logged_steps = 0;
    nb_array *key = NULL;
    nb_tree *params = NULL, *data = NULL, *opt = NULL, *tmpl = NULL, *state = NULL, *pidx = NULL,
            *donate = NULL;
    nb_fn *step_jit = NULL, *eval = NULL, *eval_jit = NULL;
    bench_stream stream = {0};
    bool stoch = p->batch > 0;
    c->n_rows = 0;
    c->reached = -1;
    c->reached_secs = NAN;
    c->diverged = false;
    c->f64 = false;
    BN_CHECK(bench_cell_key(ctx, p, c->seed, &key));
    BN_CHECK(p->setup(ctx, cfg->data, key, &params, &data));
    BN_CHECK(bn_make_optim(ctx, c->o, c->lr, cfg->tune_k > 0 ? &cfg->hps[c->o][c->l] : NULL, &opt));
    BN_CHECK(nb_grad_template(params, NULL, &tmpl));
    BN_CHECK(nb_optim_init(opt, tmpl, &state));
    BN_CHECK(bench_step_fn(ctx, p, opt, &step_jit));
    BN_CHECK(nb_tree_int(ctx, c->p, &pidx));
    BN_CHECK(nb_fn_create(ctx, "bench_eval", bn_eval_body, pidx, &eval));
    nb_jit_opts jo = nb_jit_opts_default();
    /* a retrace would be a bug; a stochastic problem's eval sees its three splits */
    jo.max_traces = stoch ? 3 : 1;
    BN_CHECK(nb_jit(eval, &jo, &eval_jit));
    BN_CHECK(bench_step_donate(ctx, &donate));
    if (stoch) {
        BN_CHECK(bench_stream_create(ctx, p, key, data, &stream));
    }
    nb_call_opts call = nb_call_opts_default();
    call.donate = donate;
    for (int64_t k = 0;; k++) {
        bool last = k == cfg->steps;
        if (last || k % cfg->log_every == 0) {
            /* full batch: (loss, accuracy) on data; stochastic: the loss on the training,
             * validation and test splits and the test accuracy */
            double v[4] = {NAN, NAN, NAN, NAN}; /* loss, accuracy, valid, test */
            static const char *const splits[3] = {"train_eval", "valid", "test"};
            for (int s = 0; s < (stoch ? 3 : 1); s++) {
                nb_tree *args = NULL, *res = NULL;
                const nb_tree *d = stoch ? nb_tree_get(data, splits[s]) : data;
                BN_CHECK(nb_tree_tuple(ctx, 2, (const nb_tree *[]){params, d}, &args));
                st = nb_fn_call(eval_jit, args, &res);
                nb_tree_destroy(args);
                BN_CHECK(st);
                double lo = bn_scalar(nb_tree_child(res, 0), &c->f64);
                v[s == 0 ? 0 : s + 1] = lo;
                if (p->has_accuracy && (s == 2 || !stoch)) {
                    v[1] = bn_scalar(nb_tree_child(res, 1), NULL);
                }
                nb_tree_destroy(res);
            }
            double loss = v[0];
            if (!bn_row_add(c, &cap, k, loss, v[1], v[2], v[3])) {
                snprintf(err, err_cap, "out of memory");
                goto done;
            }
            /* a stochastic problem's target is on the logged training loss */
            if ((last || stoch) && c->reached < 0 && loss <= p->target) {
                c->reached = k;
                c->reached_secs = cli_now_s() - t0;
            }
            if (!isfinite(loss)) {
                c->diverged = true;
            }
            bn_progress_steps(sh, c, k - logged_steps);
            logged_steps = k;
        }
        if (last || c->diverged) {
            break;
        }
        nb_tree *args = NULL, *res = NULL;
        if (stoch) {
            BN_CHECK(bench_stream_next(&stream));
        }
        BN_CHECK(nb_tree_tuple(ctx, 3, (nb_tree *[]){params, state, stoch ? stream.batch : data},
                               &args));
        st = nb_fn_call_ex(step_jit, args, &call, &res);
        nb_tree_destroy(args);
        BN_CHECK(st);
        nb_tree_destroy(params);
        nb_tree_destroy(state);
        params = nb_tree_retain((nb_tree *)nb_tree_child(res, 0));
        state = nb_tree_retain((nb_tree *)nb_tree_child(res, 1));
        double loss = bn_scalar(nb_tree_child(res, 2), NULL);
        nb_tree_destroy(res);
        if (!stoch && c->reached < 0 && loss <= p->target) {
            c->reached = k;
            c->reached_secs = cli_now_s() - t0;
        }
        if (!isfinite(loss)) {
            /* the loss at step k went non-finite: its row (the parameters that produced it
             * were donated to the step, so no accuracy), and the cell stops */
            if (c->n_rows > 0 && c->rows[c->n_rows - 1].step == k) {
                c->rows[c->n_rows - 1].loss = loss;
                c->rows[c->n_rows - 1].acc = NAN;
                c->rows[c->n_rows - 1].valid = NAN;
                c->rows[c->n_rows - 1].test = NAN;
            } else if (!bn_row_add(c, &cap, k, loss, NAN, NAN, NAN)) {
                snprintf(err, err_cap, "out of memory");
                goto done;
            }
            c->diverged = true;
            break;
        }
    }
    bn_progress_steps(sh, c, cfg->steps - logged_steps);
    /* the rows as text, and the rows as that text reads back: what the summary and the plots
     * are made of, here as after a --resume that reads the cell's file (the same numbers by
     * construction: an accuracy has 6 decimals in the text) */
    bn_buf b = {0};
    for (int64_t i = 0; i < c->n_rows; i++) {
        bn_row_text(&b, c, &c->rows[i]);
    }
    if (b.oom) {
        bn_buf_free(&b);
        snprintf(err, err_cap, "out of memory");
        goto done;
    }
    free(c->text);
    c->text = b.s;
    c->text_len = b.len;
    if (!bn_cell_rows(c, cfg, c->text, c->text + c->text_len)) {
        snprintf(err, err_cap,
                 "%s %s lr %s seed %" PRIu64 ": its rows do not read back as a --resume reads "
                 "them (a bug; or out of memory)",
                 p->name, bn_optims[c->o].name, c->lr_s, c->seed);
        goto done;
    }
    c->done = true;
    c->secs = cli_now_s() - t0;
    rc = 0;
done:
    bench_stream_destroy(&stream);
    nb_fn_destroy(eval_jit);
    nb_fn_destroy(eval);
    nb_fn_destroy(step_jit);
    nb_tree *trees[] = {params, data, opt, tmpl, state, pidx, donate};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nb_array_destroy(key);
    nb_ctx_destroy(ctx);
    return rc;
}

/* ---- cell files -------------------------------------------------------------------------- */

/* A cell file, <out>/cells/<file>:
 *     # cell <problem> <optimizer> lr <lr> seed <seed> steps <n> log_every <n> dtype <f32|f64>
 *       reached <step or -1> diverged <0|1> sha256 <hex>                       (one line)
 *     <the cell's results.csv lines>
 * where the SHA-256 is that of the head line up to " sha256" (with its newline) and the
 * lines after it. --resume keeps a cell only when the file is whole, its digest right, it
 * names this cell under these options, and its rows are exactly the steps a run logs. */

static void bn_cell_digest(const char *head, size_t head_len, const char *body, size_t body_len,
                           char hex[65]) {
    sha256_ctx h;
    uint8_t d[32];
    sha256_init(&h);
    sha256_update(&h, head, head_len);
    sha256_update(&h, "\n", 1);
    sha256_update(&h, body, body_len);
    sha256_final(&h, d);
    sha256_hex(d, hex);
}

static int bn_cell_save(const bn_cell *c, const bn_cfg *cfg, const char *dir, char *err,
                        size_t err_cap) {
    bn_buf b = {0};
    bn_cell_head(&b, c, cfg);
    bn_printf(&b, " reached %" PRId64 " diverged %d", c->reached, c->diverged ? 1 : 0);
    int rc = 0;
    if (!b.oom) {
        char hex[65];
        bn_cell_digest(b.s, b.len, c->text, c->text_len, hex);
        bn_printf(&b, " sha256 %s\n", hex);
        bn_append(&b, c->text, c->text_len);
    }
    if (b.oom) {
        bn_fmt(err, err_cap, "out of memory");
        rc = 1;
    } else if (bn_write_atomic(dir, c->file, b.s, b.len) != 0) {
        bn_fmt(err, err_cap, "cannot write %s/%s: %s", dir, c->file, strerror(errno));
        rc = 1;
    }
    bn_buf_free(&b);
    return rc;
}

/* The k-th step a run logs: 0, E, 2E, ..., and the last step. */
static int64_t bn_logged_step(const bn_cfg *cfg, int64_t k) {
    int64_t s = k * cfg->log_every;
    return s < cfg->steps ? s : cfg->steps;
}

/* Reads the rows of body into c (false: a malformed line or not the steps a run logs). An
 * f32 loss is read as a float: the value the run had, not the double nearest its %.9g text. */
static bool bn_cell_rows(bn_cell *c, const bn_cfg *cfg, const char *body, const char *end) {
    int64_t cap = 0;
    c->n_rows = 0;
    for (const char *line = body; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (eol == NULL) {
            return false;
        }
        const char *f = line;
        for (int k = 0; k < 5 && f != NULL; k++) { /* problem, optimizer, trial, lr, seed */
            f = memchr(f, ',', (size_t)(eol - f));
            f = f != NULL ? f + 1 : NULL;
        }
        char *e = NULL;
        long long step = f != NULL ? strtoll(f, &e, 10) : -1;
        double loss = NAN;
        if (e != NULL && *e == ',') {
            loss = c->f64 ? strtod(e + 1, &e) : (double)strtof(e + 1, &e);
        }
        double v[3] = {NAN, NAN, NAN}; /* accuracy, valid, test */
        for (int j = 0; j < 3 && e != NULL; j++) {
            if (*e != ',') {
                e = NULL;
            } else if (e + 1 < eol && e[1] != ',') {
                v[j] = j == 0 || c->f64 ? strtod(e + 1, &e) : (double)strtof(e + 1, &e);
            } else {
                e++;
            }
        }
        if (f == NULL || e != eol || step < 0 ||
            !bn_row_add(c, &cap, step, loss, v[0], v[1], v[2])) {
            return false;
        }
        line = eol + 1;
    }
    /* every row but a diverged cell's last is at the next logged step, with a finite loss */
    int64_t n = c->n_rows;
    if (n == 0) {
        return false;
    }
    for (int64_t i = 0; i < n; i++) {
        const bn_row *r = &c->rows[i];
        bool last = i == n - 1;
        if (last && c->diverged) {
            if (isfinite(r->loss) || r->step > cfg->steps ||
                (i > 0 && r->step <= c->rows[i - 1].step)) {
                return false;
            }
        } else if (r->step != bn_logged_step(cfg, i) || !isfinite(r->loss)) {
            return false;
        }
    }
    return c->diverged || c->rows[n - 1].step == cfg->steps;
}

/* A finished cell from its file, when it is whole and made for this cell under these
 * options (see above). false: run it (again). */
static bool bn_cell_load(bn_cell *c, const bn_cfg *cfg, const char *dir) {
    char path[4400];
    bn_fmt(path, sizeof path, "%s/%s", dir, c->file);
    size_t len = 0;
    char *s = bn_read_file(path, &len);
    if (s == NULL) {
        return false;
    }
    bool ok = false;
    bn_buf head = {0}, again = {0};
    char *nl = memchr(s, '\n', len);
    const char *body = nl != NULL ? nl + 1 : NULL, *end = s + len;
    /* the digest: the last field of the head line */
    static const char tag[] = " sha256 ";
    size_t tag_len = sizeof tag - 1, head_len = 0;
    if (nl != NULL && (size_t)(nl - s) > tag_len + 64 &&
        memcmp(nl - 64 - tag_len, tag, tag_len) == 0) {
        head_len = (size_t)(nl - s) - 64 - tag_len;
        char hex[65];
        bn_cell_digest(s, head_len, body, (size_t)(end - body), hex);
        ok = memcmp(hex, nl - 64, 64) == 0;
    }
    /* the head: this cell, these options, a dtype, reached and diverged written as a save
     * writes them */
    bool named = false;
    for (int d = 0; d < 2 && ok && !named; d++) {
        c->f64 = d == 1;
        head.len = 0;
        bn_cell_head(&head, c, cfg);
        named = !head.oom && head.len < head_len && memcmp(s, head.s, head.len) == 0;
    }
    if (ok && named) {
        long long reached = -2;
        int diverged = -1;
        char *tail = s + head.len;
        s[head_len] = '\0';
        ok = sscanf(tail, " reached %lld diverged %d", &reached, &diverged) == 2 && reached >= -1 &&
             reached <= cfg->steps && (diverged == 0 || diverged == 1);
        if (ok) {
            head.len = 0;
            bn_printf(&head, " reached %lld diverged %d", reached, diverged);
            ok = !head.oom && strcmp(head.s, tail) == 0;
        }
        c->reached = reached;
        c->diverged = diverged == 1;
        ok = ok && bn_cell_rows(c, cfg, body, end);
    } else {
        ok = false;
    }
    if (ok) { /* and the rows print as the file holds them */
        for (int64_t i = 0; i < c->n_rows; i++) {
            bn_row_text(&again, c, &c->rows[i]);
        }
        ok = !again.oom && again.len == (size_t)(end - body) &&
             memcmp(again.s, body, again.len) == 0;
    }
    if (ok) {
        free(c->text);
        c->text = again.s;
        c->text_len = again.len;
        again.s = NULL;
        c->done = true;
    } else {
        c->n_rows = 0;
        c->reached = -1;
        c->diverged = false;
    }
    bn_buf_free(&head);
    bn_buf_free(&again);
    free(s);
    return ok;
}

/* ---- running the cells ----------------------------------------------------------------- */

typedef struct bn_run {
    const bn_cfg *cfg;
    bn_cell *cells;
    int *todo, n_todo, next;
    bool failed;
    char err[2048];
    char cells_dir[4096];
    bn_shared sh;
    int kill_after; /* > 0: SIGKILL itself once that many cells are saved (for the tests) */
    int cells_run;  /* by this process, over the phases */
} bn_run;

static void *bn_worker(void *arg) {
    bn_run *r = arg;
    char err[2048];
    for (;;) {
        pthread_mutex_lock(&r->sh.mu);
        if (r->failed || r->next == r->n_todo) {
            pthread_mutex_unlock(&r->sh.mu);
            break;
        }
        bn_cell *c = &r->cells[r->todo[r->next++]];
        pthread_mutex_unlock(&r->sh.mu);
        err[0] = '\0';
        int rc = bn_run_cell(c, r->cfg, &r->sh, err, sizeof err);
        if (rc == 0) {
            rc = bn_cell_save(c, r->cfg, r->cells_dir, err, sizeof err);
        }
        pthread_mutex_lock(&r->sh.mu);
        if (rc != 0) {
            if (!r->failed) {
                r->failed = true;
                snprintf(r->err, sizeof r->err, "%s", err);
            }
        } else {
            r->sh.cells_done++;
            if (r->kill_after > 0 && r->cells_run + r->sh.cells_done == r->kill_after) {
                raise(SIGKILL); /* the test of --resume: a run killed between two cells */
            }
            if (!r->sh.prog.bar) {
                const bn_row *last = &c->rows[c->n_rows - 1];
                char reached[64] = "target not reached";
                if (c->reached >= 0) {
                    snprintf(reached, sizeof reached, "target at step %" PRId64 " after %.2f s",
                             c->reached, c->reached_secs);
                }
                cli_progress_line(&r->sh.prog,
                                  "  [%d/%d] %s %s lr %s seed %" PRIu64 ": loss %.4g%s, %s "
                                  "(%.2f s)",
                                  r->sh.cells_done, r->sh.cells_total, bench_problems[c->p].name,
                                  bn_optims[c->o].name, c->lr_s, c->seed, last->loss,
                                  c->diverged ? " (diverged)" : "", reached, c->secs);
            }
        }
        pthread_mutex_unlock(&r->sh.mu);
    }
    return NULL;
}

/* Run the cells run->todo[0 .. n_todo) (under mpirun cell i of them on process i mod N),
 * with --jobs threads; then the processes that need them (every process when another phase
 * follows: everyone, else rank 0, which writes the results) read back the cells the others
 * ran, and all agree on the outcome. kept: the cells a resumed run kept (for the message).
 * 0, or 1 with the message printed -- the same on every process. */
static int bn_run_todo(bn_run *run, nb_dist *dist, int rank, int n_proc, int kept, bool everyone) {
    const bn_cfg *cfg = run->cfg;
    /* every process has read what a resumed run kept before any writes a new cell: the
     * processes' lists of cells to run are the same, so i mod N shares them out */
    if (dist != NULL && cli_dist_agree(dist, 0) != 0) {
        fprintf(stderr, "nabla bench: rank %d: the processes could not agree to start\n", rank);
        return 1;
    }
    int n_all = run->n_todo, *all = NULL;
    if (dist != NULL) {
        all = malloc((size_t)(n_all > 0 ? n_all : 1) * sizeof *all);
        if (all == NULL) {
            fprintf(stderr, "nabla bench: out of memory\n");
            cli_dist_agree(dist, 1); /* the two agreements the others make after their cells */
            cli_dist_agree(dist, 1);
            return 1;
        }
        memcpy(all, run->todo, (size_t)n_all * sizeof *all);
        int mine = 0;
        for (int i = 0; i < run->n_todo; i++) {
            if (i % n_proc == rank) {
                run->todo[mine++] = run->todo[i];
            }
        }
        run->n_todo = mine;
    }
    run->next = 0;
    run->sh.cells_done = 0;
    run->sh.steps_done = 0;
    run->sh.cells_total = run->n_todo;
    cli_progress_start(&run->sh.prog, cfg->progress, (int64_t)run->n_todo * cfg->steps);
    int jobs = cfg->jobs < run->n_todo ? cfg->jobs : run->n_todo;
    pthread_t tid[256];
    int started = 0;
    for (int j = 1; j < jobs; j++) {
        int e = pthread_create(&tid[started], NULL, bn_worker, run);
        if (e != 0) {
            fprintf(stderr, "nabla bench: warning: only %d of %d jobs could start a thread: %s\n",
                    j, jobs, strerror(e));
            break;
        }
        started++;
    }
    bn_worker(run);
    for (int j = 0; j < started; j++) {
        pthread_join(tid[j], NULL);
    }
    cli_progress_end(&run->sh.prog);
    run->cells_run += run->sh.cells_done;
    int rc = 0;
    if (run->failed) {
        int kept_now = run->sh.cells_done + kept;
        fprintf(stderr,
                "nabla bench: %s\n  %d cell%s finished and kept in %s; fix the cause and run "
                "again with --resume\n",
                run->err, kept_now, kept_now == 1 ? "" : "s", run->cells_dir);
        rc = 1;
    }
    if (dist != NULL) {
        /* every process's cells are on disk (or one failed); each reads the others' */
        rc = cli_dist_agree(dist, rc);
        for (int i = 0; rc == 0 && (everyone || rank == 0) && i < n_all; i++) {
            bn_cell *c = &run->cells[all[i]];
            if (c->text == NULL && !bn_cell_load(c, cfg, run->cells_dir)) {
                fprintf(stderr, "nabla bench: cannot read back %s/%s written by another process\n",
                        run->cells_dir, c->file);
                rc = 1;
            }
        }
        free(all);
        rc = cli_dist_agree(dist, rc); /* a failed read-back stops every process */
    }
    return rc;
}

/* ---- the summary ----------------------------------------------------------------------- */

/* The cell of problem p (index into bench_problems), optimizer o, rate l, seed number k:
 * cells are in the suite's order (problem, optimizer, rate, seed). */
static const bn_cell *bn_find(const bn_cell *cells, const bn_cfg *cfg, int p, int o, int l, int k) {
    return &cells[cfg->cell_start[p][o] + l * cfg->n_seeds + k];
}

/* Diverged (BN_DIVERGED_TEXT): the loss went inf or nan -- the run stops there, so that is the
 * last row -- or the final loss is more than BN_DIVERGED_FACTOR times the loss at step 0. A
 * finite blow-up (1e110 after 60 steps) is no result to average or to scale a plot to. */
static bool bn_cell_diverged(const bn_cell *c) {
    if (c->n_rows == 0) { /* not run (--tune: a trial not chosen, on a later seed) */
        return true;
    }
    double first = c->rows[0].loss, last = c->rows[c->n_rows - 1].loss;
    return c->diverged || !isfinite(first) || !isfinite(last) ||
           last > BN_DIVERGED_FACTOR * fabs(first);
}

static double bn_final(const bn_cell *c) {
    return c->rows[c->n_rows - 1].loss;
}

/* --tune: the chosen trial of problem p and optimizer o (BN_CHOSEN_TEXT); -1 when every
 * trial diverged, or one has not run. */
#define BN_CHOSEN_TEXT                                                                             \
    "of the trials on the first seed that did not diverge, the one with the lowest final "         \
    "validation loss (a full-batch problem, which has no validation split: final training "        \
    "loss); ties go to the lower trial number"
static int bn_chosen(const bn_cfg *cfg, const bn_cell *cells, int p, int o) {
    int best = -1;
    double bv = INFINITY;
    for (int t = 0; t < cfg->n_lrs[o]; t++) {
        const bn_cell *c = bn_find(cells, cfg, p, o, t, 0);
        if (!c->done || c->n_rows == 0) {
            return -1;
        }
        if (bn_cell_diverged(c)) {
            continue;
        }
        const bn_row *r = &c->rows[c->n_rows - 1];
        double v = bench_problems[p].batch > 0 ? r->valid : r->loss;
        if (!isnan(v) && (best < 0 || v < bv)) {
            best = t;
            bv = v;
        }
    }
    return best;
}

typedef struct bn_sum {
    int best;                   /* the best rate's index (BN_BEST_TEXT); -1: every seed diverged
                                 * at every rate */
    int n_div;                  /* seeds diverged at the best rate (all of them when best is -1) */
    double mean, std, acc_mean; /* final loss and accuracy at the best rate, over the seeds that
                                 * did not diverge */
    int n_reached;              /* seeds that reached the target at the best rate */
    double reached_mean;        /* their mean steps to it */
    /* at the best setting, over the seeds that did not diverge: the best (highest) test
     * accuracy of the logged steps, the final test loss (stochastic problems), and the area
     * under the learning curve -- the mean training loss over the run, by the trapezoid rule
     * over the logged steps */
    double best_acc_mean, test_mean, auc_mean;
    /* per setting (rate or trial): the seeds run, those diverged; the final loss over the
     * others (NaN: none left) -- with --tune a trial not chosen ran on the first seed only */
    int lr_ran[BN_MAX_SETTINGS], lr_div[BN_MAX_SETTINGS];
    double lr_mean[BN_MAX_SETTINGS], lr_min[BN_MAX_SETTINGS], lr_max[BN_MAX_SETTINGS];
} bn_sum;

static void bn_summarize(const bn_cfg *cfg, const bn_cell *cells, int p, int o, bn_sum *s) {
    memset(s, 0, sizeof *s);
    s->best = -1;
    for (int l = 0; l < cfg->n_lrs[o]; l++) {
        double sum = 0, lo = INFINITY, hi = -INFINITY;
        int div = 0, ran = 0;
        for (int k = 0; k < cfg->n_seeds; k++) {
            const bn_cell *c = bn_find(cells, cfg, p, o, l, k);
            if (!c->done) {
                continue;
            }
            ran++;
            if (bn_cell_diverged(c)) {
                div++;
                continue;
            }
            double v = bn_final(c);
            sum += v;
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        int ok = ran - div;
        s->lr_ran[l] = ran;
        s->lr_div[l] = div;
        s->lr_mean[l] = ok > 0 ? sum / ok : NAN;
        s->lr_min[l] = ok > 0 ? lo : NAN;
        s->lr_max[l] = ok > 0 ? hi : NAN;
        int b = s->best;
        if (cfg->tune_k == 0 && ok > 0 &&
            (b < 0 || div < s->lr_div[b] ||
             (div == s->lr_div[b] && s->lr_mean[l] < s->lr_mean[b]))) {
            s->best = l; /* ties: the smaller rate */
        }
    }
    if (cfg->tune_k > 0) {
        s->best = bn_chosen(cfg, cells, p, o);
        if (s->best >= 0 && s->lr_ran[s->best] - s->lr_div[s->best] == 0) {
            s->best = -1; /* every seed of the chosen trial diverged */
        }
    }
    if (s->best < 0) {
        s->n_div = cfg->n_seeds;
        s->mean = s->std = s->acc_mean = s->reached_mean = NAN;
        s->best_acc_mean = s->test_mean = s->auc_mean = NAN;
        return;
    }
    s->n_div = s->lr_div[s->best];
    s->mean = s->lr_mean[s->best];
    int ok = cfg->n_seeds - s->n_div;
    double ss = 0, acc = 0, steps = 0, best_acc = 0, test = 0, auc = 0;
    for (int k = 0; k < cfg->n_seeds; k++) {
        const bn_cell *c = bn_find(cells, cfg, p, o, s->best, k);
        if (c->reached >= 0) {
            s->n_reached++;
            steps += (double)c->reached;
        }
        if (!bn_cell_diverged(c)) {
            const bn_row *r = c->rows, *last = &r[c->n_rows - 1];
            double d = bn_final(c) - s->mean, hi = -INFINITY, area = 0;
            ss += d * d;
            acc += last->acc;
            test += last->test;
            for (int64_t i = 0; i < c->n_rows; i++) {
                hi = r[i].acc > hi ? r[i].acc : hi;
                if (i > 0) {
                    area += 0.5 * (r[i].loss + r[i - 1].loss) * (double)(r[i].step - r[i - 1].step);
                }
            }
            best_acc += hi;
            auc += last->step > 0 ? area / (double)last->step : last->loss;
        }
    }
    s->std = ok > 1 ? sqrt(ss / (ok - 1)) : 0.0;
    s->acc_mean = acc / ok;
    s->best_acc_mean = best_acc / ok;
    s->test_mean = test / ok;
    s->auc_mean = auc / ok;
    s->reached_mean = s->n_reached > 0 ? steps / s->n_reached : NAN;
}

static void bn_summary_json(const bn_cfg *cfg, const bn_cell *cells, bn_buf *b) {
    bn_printf(b, "{\n  \"format\": \"nabla bench summary 2\",\n");
    bn_printf(b, "  \"diverged\": \"a cell diverged when %s\",\n", BN_DIVERGED_TEXT);
    bn_printf(b, "  \"best_lr_rule\": \"the best learning rate has %s\",\n", BN_BEST_TEXT);
    if (cfg->tune_k > 0) {
        bn_printf(b,
                  "  \"tuning\": {\"protocol\": \"random\", \"trials\": %d, \"seed\": %" PRIu64
                  ", \"rule\": \"the chosen trial is, %s; it then runs on every seed\"},\n",
                  cfg->tune_k, cfg->tune_seed, BN_CHOSEN_TEXT);
    }
    bn_printf(b, "  \"auc\": \"the area under the learning curve: the mean training loss over "
                 "the run (trapezoid rule over the logged steps)\",\n");
    bn_printf(b, "  \"steps\": %" PRId64 ",\n  \"log_every\": %" PRId64 ",\n  \"seeds\": [",
              cfg->steps, cfg->log_every);
    for (int k = 0; k < cfg->n_seeds; k++) {
        bn_printf(b, "%s%" PRIu64, k ? ", " : "", cfg->seeds[k]);
    }
    bn_printf(b, "],\n  \"problems\": [");
    for (int i = 0; i < cfg->n_problems; i++) {
        const bench_problem *p = &bench_problems[cfg->problems[i]];
        bn_printf(b, "%s\n    {\n      \"name\": \"%s\",\n      \"title\": \"%s\",\n", i ? "," : "",
                  p->name, p->title);
        bn_printf(b, "      \"target_loss\": ");
        bn_json_num(b, p->target);
        bn_printf(b, ",\n      \"optimizers\": [");
        bool first = true;
        for (int o = 0; o < BN_N_OPTIMS; o++) {
            if (!cfg->optim_on[o]) {
                continue;
            }
            bn_sum s;
            bn_summarize(cfg, cells, cfg->problems[i], o, &s);
            bn_printf(b, "%s\n        {\n          \"name\": \"%s\",\n          \"best_lr\": ",
                      first ? "" : ",", bn_optims[o].name);
            first = false;
            if (s.best >= 0) {
                bn_printf(b, "%.6g", cfg->lrs[o][s.best]);
            } else {
                bn_printf(b, "null");
            }
            bn_printf(b,
                      ",\n          \"diverged_at_every_lr\": %s,\n          \"diverged_seeds\": "
                      "%d,\n          \"final_loss_mean\": ",
                      s.best < 0 ? "true" : "false", s.n_div);
            bn_json_num(b, s.mean);
            bn_printf(b, ",\n          \"final_loss_std\": ");
            bn_json_num(b, s.best >= 0 ? s.std : NAN);
            if (p->has_accuracy) {
                bn_printf(b, ",\n          \"final_test_accuracy_mean\": ");
                bn_json_num(b, s.acc_mean);
                bn_printf(b, ",\n          \"best_test_accuracy_mean\": ");
                bn_json_num(b, s.best_acc_mean);
            }
            if (p->batch > 0) {
                bn_printf(b, ",\n          \"final_test_loss_mean\": ");
                bn_json_num(b, s.test_mean);
            }
            bn_printf(b, ",\n          \"auc_mean\": ");
            bn_json_num(b, s.auc_mean);
            if (cfg->tune_k > 0) {
                bn_printf(b, ",\n          \"chosen_trial\": ");
                if (s.best >= 0) {
                    bn_buf h = {0};
                    bn_hp_text(&h, s.best, &cfg->hps[o][s.best]);
                    bn_printf(b, "%d, \"chosen\": \"%s\"", s.best, h.s != NULL ? h.s : "");
                    b->oom = b->oom || h.oom;
                    bn_buf_free(&h);
                } else {
                    bn_printf(b, "null");
                }
            }
            bn_printf(b, ",\n          \"steps_to_target\": [");
            for (int k = 0; k < cfg->n_seeds && s.best >= 0; k++) {
                const bn_cell *c = bn_find(cells, cfg, cfg->problems[i], o, s.best, k);
                if (c->reached >= 0) {
                    bn_printf(b, "%s%" PRId64, k ? ", " : "", c->reached);
                } else {
                    bn_printf(b, "%snull", k ? ", " : "");
                }
            }
            bn_printf(b, "],\n          \"seeds_reached_target\": %d", s.n_reached);
            bn_printf(b, ",\n          \"steps_to_target_mean\": ");
            bn_json_num(b, s.reached_mean);
            bn_printf(b, ",\n          \"%s\": [", cfg->tune_k > 0 ? "trials" : "learning_rates");
            for (int l = 0; l < cfg->n_lrs[o]; l++) {
                bn_printf(b, "%s{", l ? ", " : "");
                if (cfg->tune_k > 0) {
                    bn_printf(b, "\"trial\": %d, ", l);
                }
                bn_printf(b, "\"lr\": %.6g, \"final_loss_mean\": ", cfg->lrs[o][l]);
                bn_json_num(b, s.lr_mean[l]);
                if (cfg->tune_k > 0) {
                    const bn_cell *c0 = bn_find(cells, cfg, cfg->problems[i], o, l, 0);
                    bn_printf(b, ", \"final_valid_loss\": ");
                    bn_json_num(b, c0->n_rows > 0 && !bn_cell_diverged(c0)
                                       ? c0->rows[c0->n_rows - 1].valid
                                       : NAN);
                    bn_printf(b, ", \"seeds_run\": %d", s.lr_ran[l]);
                }
                bn_printf(b, ", \"diverged_seeds\": %d}", s.lr_div[l]);
            }
            bn_printf(b, "]\n        }");
        }
        bn_printf(b, "\n      ]\n    }");
    }
    bn_printf(b, "\n  ]\n}\n");
}

static void bn_summary_md(const bn_cfg *cfg, const bn_cell *cells, bn_buf *b) {
    bn_printf(b,
              "| problem | optimizer | %s | final loss (mean ± std, %d seed%s) | diverged | "
              "test accuracy | steps to target | AUC |\n|---|---|---|---|---|---|---|---|\n",
              cfg->tune_k > 0 ? "chosen trial (its lr)" : "best lr", cfg->n_seeds,
              cfg->n_seeds == 1 ? "" : "s");
    for (int i = 0; i < cfg->n_problems; i++) {
        const bench_problem *p = &bench_problems[cfg->problems[i]];
        bool first = true;
        for (int o = 0; o < BN_N_OPTIMS; o++) {
            if (!cfg->optim_on[o]) {
                continue;
            }
            bn_sum s;
            bn_summarize(cfg, cells, cfg->problems[i], o, &s);
            if (first) {
                bn_printf(b, "| %s (target %g) ", p->title, p->target);
            } else {
                bn_printf(b, "| ");
            }
            first = false;
            bn_printf(b, "| %s ", bn_optims[o].name);
            if (s.best < 0) {
                bn_printf(b, "| — | diverged at every %s | every seed at every %s | | | |\n",
                          cfg->tune_k > 0 ? "trial" : "lr", cfg->tune_k > 0 ? "trial" : "lr");
                continue;
            }
            int ok = cfg->n_seeds - s.n_div;
            if (cfg->tune_k > 0) {
                bn_printf(b, "| %d (%.6g) ", s.best, cfg->lrs[o][s.best]);
            } else {
                bn_printf(b, "| %.6g ", cfg->lrs[o][s.best]);
            }
            bn_printf(b, "| %.3e ± %.1e ", s.mean, s.std);
            if (s.n_div > 0) {
                bn_printf(b, "(%d seed%s) | %d of %d seeds ", ok, ok == 1 ? "" : "s", s.n_div,
                          cfg->n_seeds);
            } else {
                bn_printf(b, "| no ");
            }
            bn_printf(b, "| ");
            if (p->has_accuracy) {
                bn_printf(b, "%.1f %% ", 100.0 * s.acc_mean);
            }
            if (s.n_reached == cfg->n_seeds) {
                bn_printf(b, "| %.0f ", s.reached_mean);
            } else if (s.n_reached > 0) {
                bn_printf(b, "| %.0f (%d of %d seeds) ", s.reached_mean, s.n_reached, cfg->n_seeds);
            } else {
                bn_printf(b, "| not reached ");
            }
            bn_printf(b, "| %.3e |\n", s.auc_mean);
        }
    }
    if (cfg->tune_k > 0) {
        bn_printf(b,
                  "\nA cell diverged when %s. --tune random:%d:%" PRIu64 ": each optimizer's %d "
                  "trials ran on seed %" PRIu64 "; the chosen trial is, %s, and ran on every "
                  "seed; its final loss, accuracy and curve are over the seeds that did not "
                  "diverge. AUC: the mean training loss over the run. The chosen trials:\n\n",
                  BN_DIVERGED_TEXT, cfg->tune_k, cfg->tune_seed, cfg->tune_k, cfg->seeds[0],
                  BN_CHOSEN_TEXT);
        for (int i = 0; i < cfg->n_problems; i++) {
            for (int o = 0; o < BN_N_OPTIMS; o++) {
                int t = cfg->optim_on[o] ? bn_chosen(cfg, cells, cfg->problems[i], o) : -1;
                if (t >= 0) {
                    bn_printf(b, "- %s, %s: ", bench_problems[cfg->problems[i]].name,
                              bn_optims[o].name);
                    bn_hp_text(b, t, &cfg->hps[o][t]);
                    bn_printf(b, "\n");
                }
            }
        }
        return;
    }
    bn_printf(b,
              "\nA cell diverged when %s. The best learning rate has %s; its final loss, "
              "accuracy and curve are over the seeds that did not diverge. AUC: the mean "
              "training loss over the run.\n",
              BN_DIVERGED_TEXT, BN_BEST_TEXT);
}

/* ---- plots ------------------------------------------------------------------------------- */

/* Runs `gnuplot <a1> [<a2>]` in dir (NULL: here), its output and errors to /dev/null; the
 * exit code (127: not found), or -1. */
static int bn_gnuplot(const char *dir, const char *a1, const char *a2) {
    pid_t pid = fork();
    if (pid < 0) {
        return -1;
    }
    if (pid == 0) {
        if (dir != NULL && chdir(dir) != 0) {
            _exit(126);
        }
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            dup2(devnull, STDOUT_FILENO);
            dup2(devnull, STDERR_FILENO);
            close(devnull);
        }
        execlp("gnuplot", "gnuplot", a1, a2, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            return -1;
        }
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The values a log axis shows: positive and finite; lo > hi while there are none. */
typedef struct bn_range {
    double lo, hi;
} bn_range;

static void bn_range_add(bn_range *r, double v) {
    if (isfinite(v) && v > 0) {
        r->lo = v < r->lo ? v : r->lo;
        r->hi = v > r->hi ? v : r->hi;
    }
}

/* r widened on a log axis by 5% of its span (at least 0.1 decade) below and above, and at
 * least top decades above. */
static bn_range bn_range_padded(bn_range r, double top) {
    double span = log10(r.hi / r.lo), pad = 0.05 * span > 0.1 ? 0.05 * span : 0.1;
    return (bn_range){r.lo / pow(10.0, pad), r.hi * pow(10.0, pad > top ? pad : top)};
}

/* `set ytics (...)` for a log axis over y when it spans too few decades for gnuplot's own
 * (one per decade): 1, 2, 5 times a power of ten, or finer for a narrower range. */
static void bn_log_ytics(bn_buf *gp, bn_range y) {
    static const struct {
        double below; /* for a span of fewer decades than this */
        int n;
        double m[12]; /* these times each power of ten */
    } tics[] = {
        {0.5, 12, {1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9}},
        {1.2, 7, {1, 1.5, 2, 3, 4, 5, 7}},
        {2.5, 3, {1, 2, 5}},
    };
    double span = log10(y.hi / y.lo);
    int t = 0;
    while (t < 3 && !(span < tics[t].below)) {
        t++;
    }
    if (t == 3) {
        return;
    }
    const char *sep = "set ytics (";
    for (int k = (int)floor(log10(y.lo)); k <= (int)ceil(log10(y.hi)); k++) {
        for (int i = 0; i < tics[t].n; i++) {
            double v = tics[t].m[i] * pow(10.0, k);
            if (v >= y.lo && v <= y.hi) {
                bn_printf(gp, "%s%g", sep, v);
                sep = ", ";
            }
        }
    }
    if (sep[0] == ',') {
        bn_printf(gp, ")\n");
    }
}

/* One curve of the loss plot: the rows the seeds at rate l of (p, o) all have -- only those
 * that did not diverge when skip_diverged -- as "step mean min max" over the seeds, where the
 * mean is positive and finite (a log axis). Adds min and max to r, the losses at step 0 to
 * r0 (either may be NULL); returns the points written. */
static int64_t bn_curve(bn_buf *b, const bn_cfg *cfg, const bn_cell *cells, int p, int o, int l,
                        bool skip_diverged, bn_range *r, bn_range *r0) {
    int64_t rows = INT64_MAX, pts = 0;
    int n = 0;
    for (int k = 0; k < cfg->n_seeds; k++) {
        const bn_cell *c = bn_find(cells, cfg, p, o, l, k);
        if (!skip_diverged || !bn_cell_diverged(c)) {
            rows = c->n_rows < rows ? c->n_rows : rows;
            n++;
        }
    }
    for (int64_t i = 0; n > 0 && i < rows; i++) {
        double sum = 0, lo = INFINITY, hi = -INFINITY;
        int64_t step = 0;
        for (int k = 0; k < cfg->n_seeds; k++) {
            const bn_cell *c = bn_find(cells, cfg, p, o, l, k);
            if (skip_diverged && bn_cell_diverged(c)) {
                continue;
            }
            double v = c->rows[i].loss;
            sum += v;
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
            step = c->rows[i].step;
            if (i == 0 && r0 != NULL) {
                bn_range_add(r0, v);
            }
        }
        double mean = sum / n;
        if (!isfinite(mean) || !(mean > 0)) {
            continue;
        }
        lo = lo > 0 ? lo : mean; /* a loss of exactly 0 has no place on a log axis */
        bn_printf(b, "%" PRId64 " %.9g %.9g %.9g\n", step, mean, lo, hi);
        if (r != NULL) {
            bn_range_add(r, lo);
            bn_range_add(r, hi);
        }
        pts++;
    }
    return pts;
}

/* <dir>/<base>.dat and .gp, and <base>.png drawn by gnuplot from them (the script writes
 * .<base>.png.tmp, renamed when gnuplot succeeds). 0, 127 when gnuplot is missing, else 1
 * with err set. */
static int bn_plot_files(const char *dir, const char *base, const bn_buf *dat, const bn_buf *gp,
                         char *err, size_t err_cap) {
    char name[300], png[4700], tmp[4700];
    if (dat->oom || gp->oom) {
        bn_fmt(err, err_cap, "out of memory");
        return 1;
    }
    bn_fmt(name, sizeof name, "%s.dat", base);
    if (bn_write_atomic(dir, name, dat->s != NULL ? dat->s : "", dat->len) != 0) {
        bn_fmt(err, err_cap, "cannot write %s/%s: %s", dir, name, strerror(errno));
        return 1;
    }
    bn_fmt(name, sizeof name, "%s.gp", base);
    if (bn_write_atomic(dir, name, gp->s, gp->len) != 0) {
        bn_fmt(err, err_cap, "cannot write %s/%s: %s", dir, name, strerror(errno));
        return 1;
    }
    int g = bn_gnuplot(dir, name, NULL);
    bn_fmt(tmp, sizeof tmp, "%s/.%s.png.tmp", dir, base);
    bn_fmt(png, sizeof png, "%s/%s.png", dir, base);
    if (g == 0 && rename(tmp, png) == 0) {
        bn_fsync_dir(dir);
        return 0;
    }
    unlink(tmp);
    if (g == 127) {
        return 127;
    }
    bn_fmt(err, err_cap, "gnuplot failed on %s/%s (exit %d)", dir, name, g);
    return 1;
}

/* The start of a plot's script: terminal, output, title and axis labels. spread: how the
 * plot shows the spread over the seeds. */
static void bn_plot_head(bn_buf *gp, const bn_cfg *cfg, const char *base, const char *what,
                         const char *spread, const char *xlabel, const char *ylabel) {
    bn_printf(gp,
              "# gnuplot script made by nabla bench: %s.png from %s.dat\n"
              "set terminal pngcairo size 1120,600 noenhanced font \"sans,10\"\n"
              "set output '.%s.png.tmp'\n"
              "set title \"%s\\nmean over the seeds that did not diverge (of %d); %s: their min "
              "to max\"\n"
              "set xlabel '%s'\nset ylabel '%s'\nset grid\nset key outside right top\n",
              base, base, base, what, cfg->n_seeds, spread, xlabel, ylabel);
}

/* plots/<problem>.png: loss against step at the best rate of each optimizer, the mean over
 * the seeds that did not diverge with a band from their min to their max, the target loss as
 * a line. An optimizer that diverged at every rate is drawn at its smallest rate, thin,
 * clipped and labelled so; the y range is the curves' that did not diverge. */
static int bn_plot_loss(const bn_cfg *cfg, const bn_cell *cells, int p, const char *dir, char *err,
                        size_t err_cap) {
    const bench_problem *pr = &bench_problems[p];
    bn_buf dat = {0}, gp = {0}, bands = {0}, lines = {0}, block = {0};
    bn_range r = {INFINITY, -INFINITY}, r0 = r;
    int n_blocks = 0, n_ok = 0;
    for (int o = 0; o < BN_N_OPTIMS; o++) {
        if (!cfg->optim_on[o]) {
            continue;
        }
        bn_sum s;
        bn_summarize(cfg, cells, p, o, &s);
        bool ok = s.best >= 0;
        int l = ok ? s.best : 0;
        block.len = 0;
        int64_t pts = bn_curve(&block, cfg, cells, p, o, l, ok, ok ? &r : NULL, ok ? NULL : &r0);
        if (pts == 0) {
            continue;
        }
        int n = ok ? cfg->n_seeds - s.n_div : cfg->n_seeds;
        bn_printf(&dat,
                  "%s# %s, lr %.6g%s: step, then the loss's mean, min and max over %d seed%s\n",
                  n_blocks ? "\n\n" : "", bn_optims[o].name, cfg->lrs[o][l],
                  ok ? "" : " (diverged at every lr; its smallest shown, where finite)", n,
                  n == 1 ? "" : "s");
        bn_append(&dat, block.s, block.len);
        if (ok) {
            n_ok++;
            bn_printf(&bands,
                      "'%s.dat' index %d using 1:3:4 with filledcurves fs transparent solid 0.15 "
                      "noborder lc rgb '%s' notitle, \\\n     ",
                      pr->name, n_blocks, bn_optims[o].color);
            bn_printf(&lines,
                      "'%s.dat' index %d using 1:2 with lines lw 2 lc rgb '%s' dt %d title '%s (",
                      pr->name, n_blocks, bn_optims[o].color, bn_optims[o].dash, bn_optims[o].name);
            if (cfg->tune_k > 0) {
                bn_printf(&lines, "trial %d, ", l);
            }
            bn_printf(&lines, "lr %.6g", cfg->lrs[o][l]);
            if (s.n_div > 0) {
                bn_printf(&lines, ", %d of %d seeds diverged", s.n_div, cfg->n_seeds);
            }
            bn_printf(&lines, ")', \\\n     ");
        } else {
            bn_printf(&lines,
                      "'%s.dat' index %d using 1:2 with lines lw 1.5 lc rgb '%s' dt 3 title '%s "
                      "(lr %.6g): diverged at every lr', \\\n     ",
                      pr->name, n_blocks, bn_optims[o].color, bn_optims[o].name, cfg->lrs[o][l]);
        }
        n_blocks++;
    }
    char what[512];
    bn_fmt(what, sizeof what, "%s: %sloss at the %s of each optimizer", pr->title,
           pr->batch > 0 ? "training " : "",
           cfg->tune_k > 0 ? "chosen trial" : "best learning rate");
    bn_plot_head(&gp, cfg, pr->name, what, "band", "step", "loss");
    bn_range_add(&r, pr->target);
    if (n_ok == 0) { /* every optimizer diverged at every rate: the range of their starts */
        bn_range_add(&r0, pr->target);
        r = r0.lo <= r0.hi ? r0 : (bn_range){1.0, 10.0};
        bn_printf(&gp, "set label 1 'every optimizer diverged at every learning rate' at graph "
                       "0.5, 0.5 center\n");
    }
    bn_range y = bn_range_padded(r, 0.0);
    bn_printf(&gp, "set logscale y\nset format y '%%g'\nset xrange [0:%" PRId64 "]\n", cfg->steps);
    bn_printf(&gp, "set yrange [%.4g:%.4g]\n", y.lo, y.hi);
    bn_log_ytics(&gp, y);
    bn_printf(&gp, "plot %.*s%.*s", (int)bands.len, bands.s != NULL ? bands.s : "", (int)lines.len,
              lines.s != NULL ? lines.s : "");
    if (pr->target > 0) {
        bn_printf(&gp, "%g with lines lw 1.5 lc rgb '#000000' dt 2 title 'target %g'\n", pr->target,
                  pr->target);
    } else {
        bn_printf(&gp, "NaN notitle\n");
    }
    bn_printf(&gp, "unset output\n");
    int rc = bands.oom || lines.oom || block.oom
                 ? (bn_fmt(err, err_cap, "out of memory"), 1)
                 : bn_plot_files(dir, pr->name, &dat, &gp, err, err_cap);
    bn_buf_free(&dat);
    bn_buf_free(&gp);
    bn_buf_free(&bands);
    bn_buf_free(&lines);
    bn_buf_free(&block);
    return rc;
}

/* plots/<problem>_lr.png: the final loss against the learning rate (log-log), one line per
 * optimizer through the mean over the seeds that did not diverge, bars from their min to
 * their max; a rate where some seeds diverged is circled, one where every seed diverged is a
 * triangle at the top of the plot. The y range is the rates' that did not diverge. */
static int bn_plot_lr(const bn_cfg *cfg, const bn_cell *cells, int p, const char *dir, char *err,
                      size_t err_cap) {
    const bench_problem *pr = &bench_problems[p];
    bn_sum sums[BN_N_OPTIMS];
    bn_range r = {INFINITY, -INFINITY}, x = r;
    bool any_div = false, any_part = false;
    for (int o = 0; o < BN_N_OPTIMS; o++) {
        if (!cfg->optim_on[o]) {
            continue;
        }
        bn_summarize(cfg, cells, p, o, &sums[o]);
        for (int l = 0; l < cfg->n_lrs[o]; l++) {
            bn_range_add(&x, cfg->lrs[o][l]);
            bn_range_add(&r, sums[o].lr_min[l]);
            bn_range_add(&r, sums[o].lr_max[l]);
            int ran = sums[o].lr_ran[l];
            any_div = any_div || sums[o].lr_div[l] == ran;
            any_part = any_part || (sums[o].lr_div[l] > 0 && sums[o].lr_div[l] < ran);
        }
    }
    bn_range_add(&r, pr->target);
    if (r.lo > r.hi) {
        r = (bn_range){1.0, 10.0};
    }
    /* the diverged rates' triangles: half way into a margin of at least 0.4 decade on top */
    bn_range y = bn_range_padded(r, any_div ? 0.4 : 0.0);
    double top = sqrt(r.hi * y.hi);
    bn_buf dat = {0}, gp = {0}, plot = {0};
    int n_blocks = 0;
    for (int o = 0; o < BN_N_OPTIMS; o++) {
        if (!cfg->optim_on[o]) {
            continue;
        }
        const bn_sum *s = &sums[o];
        /* the settings by rate (--tune's trials are in the order drawn) */
        int order[BN_MAX_SETTINGS];
        for (int l = 0; l < cfg->n_lrs[o]; l++) {
            int j = l;
            for (; j > 0 && cfg->lrs[o][order[j - 1]] > cfg->lrs[o][l]; j--) {
                order[j] = order[j - 1];
            }
            order[j] = l;
        }
        /* kind 0: rates with a seed left (the line), 1: some seeds diverged (circles), 2:
         * every seed diverged (triangles at the top) */
        for (int kind = 0; kind < 3; kind++) {
            int pts = 0;
            for (int j = 0; j < cfg->n_lrs[o]; j++) {
                int l = order[j];
                bool all = s->lr_div[l] == s->lr_ran[l], some = s->lr_div[l] > 0 && !all;
                bool shown = !all && isfinite(s->lr_mean[l]) && s->lr_mean[l] > 0; /* log axis */
                if (!(kind == 0 ? shown : kind == 1 ? some && shown : all && isfinite(top))) {
                    continue;
                }
                if (pts++ == 0) {
                    static const char *const what[] = {
                        "lr, final loss: mean, min and max over the seeds that did not diverge",
                        "lr, mean final loss: some seeds diverged",
                        "lr, the top of the plot: every seed diverged"};
                    bn_printf(&dat, "%s# %s: %s\n", n_blocks ? "\n\n" : "", bn_optims[o].name,
                              what[kind]);
                }
                if (kind == 0) {
                    double lo = s->lr_min[l] > 0 ? s->lr_min[l] : s->lr_mean[l];
                    bn_printf(&dat, "%.6g %.9g %.9g %.9g\n", cfg->lrs[o][l], s->lr_mean[l], lo,
                              s->lr_max[l]);
                } else {
                    bn_printf(&dat, "%.6g %.9g\n", cfg->lrs[o][l], kind == 1 ? s->lr_mean[l] : top);
                }
            }
            if (pts == 0) {
                continue;
            }
            if (kind == 0) { /* --tune's trials differ in more than the rate: no line */
                bn_printf(&plot,
                          "'%s_lr.dat' index %d using 1:2:3:4 with %s lw 2 pt 7 ps 0.8 "
                          "lc rgb '%s' dt %d title '%s', \\\n     ",
                          pr->name, n_blocks, cfg->tune_k > 0 ? "yerrorbars" : "yerrorlines",
                          bn_optims[o].color, bn_optims[o].dash, bn_optims[o].name);
            } else {
                bn_printf(&plot,
                          "'%s_lr.dat' index %d using 1:2 with points pt %d ps %s lc rgb '%s' ",
                          pr->name, n_blocks, kind == 1 ? 6 : 9, kind == 1 ? "2" : "1.5",
                          bn_optims[o].color);
                if (kind == 2 && s->best < 0) { /* no line names it */
                    bn_printf(&plot, "title '%s: diverged at every lr', \\\n     ",
                              bn_optims[o].name);
                } else {
                    bn_printf(&plot, "notitle, \\\n     ");
                }
            }
            n_blocks++;
        }
    }
    char what[512];
    bn_fmt(what, sizeof what, "%s: final loss (step %" PRId64 ") against the learning rate",
           pr->title, cfg->steps);
    char base[300];
    bn_fmt(base, sizeof base, "%s_lr", pr->name);
    bn_plot_head(&gp, cfg, base, what, "bars", "learning rate", "final loss");
    bn_printf(&gp,
              "set logscale xy\nset format x '%%g'\nset format y '%%g'\nset xrange [%.4g:%.4g]\n"
              "set yrange [%.4g:%.4g]\n",
              x.lo / 2, x.hi * 2, y.lo, y.hi);
    bn_log_ytics(&gp, y);
    bn_printf(&gp, "plot %.*s", (int)plot.len, plot.s != NULL ? plot.s : "");
    if (any_div) {
        bn_printf(&gp, "NaN with points pt 9 ps 1.5 lc rgb '#000000' title 'every seed "
                       "diverged (at the top)', \\\n     ");
    }
    if (any_part) {
        bn_printf(&gp, "NaN with points pt 6 ps 2 lc rgb '#000000' title 'some seeds "
                       "diverged (the mean of the others)', \\\n     ");
    }
    if (pr->target > 0) {
        bn_printf(&gp, "%g with lines lw 1.5 lc rgb '#000000' dt 2 title 'target %g'\n", pr->target,
                  pr->target);
    } else {
        bn_printf(&gp, "NaN notitle\n");
    }
    bn_printf(&gp, "unset output\n");
    int rc = plot.oom ? (bn_fmt(err, err_cap, "out of memory"), 1)
                      : bn_plot_files(dir, base, &dat, &gp, err, err_cap);
    bn_buf_free(&dat);
    bn_buf_free(&gp);
    bn_buf_free(&plot);
    return rc;
}

/* Both plots of problem p. 0, 127 when gnuplot is missing, else 1 with err set. */
static int bn_plot(const bn_cfg *cfg, const bn_cell *cells, int p, const char *dir, char *err,
                   size_t err_cap) {
    int rc = bn_plot_loss(cfg, cells, p, dir, err, err_cap);
    return rc != 0 ? rc : bn_plot_lr(cfg, cells, p, dir, err, err_cap);
}

/* Wall time to the target, on stdout only (times are in no file): per problem and
 * optimizer at its best setting, the mean over the seeds whose cells ran in this
 * invocation and reached it. */
static void bn_print_wall(const bn_cfg *cfg, const bn_cell *cells) {
    bool header = false;
    for (int i = 0; i < cfg->n_problems; i++) {
        for (int o = 0; o < BN_N_OPTIMS; o++) {
            bn_sum s;
            if (!cfg->optim_on[o]) {
                continue;
            }
            bn_summarize(cfg, cells, cfg->problems[i], o, &s);
            double sum = 0;
            int n = 0;
            for (int k = 0; s.best >= 0 && k < cfg->n_seeds; k++) {
                const bn_cell *c = bn_find(cells, cfg, cfg->problems[i], o, s.best, k);
                if (!isnan(c->reached_secs)) {
                    sum += c->reached_secs;
                    n++;
                }
            }
            if (n == 0) {
                continue;
            }
            if (!header) {
                printf("wall time to the target (seconds from a cell's start, setup and compile "
                       "included; the mean over the seeds run now that reached it; in no file):\n");
                header = true;
            }
            printf("  %-17s %-9s %.3f s (%d seed%s)\n", bench_problems[cfg->problems[i]].name,
                   bn_optims[o].name, sum / n, n, n == 1 ? "" : "s");
        }
    }
    if (header) {
        printf("\n");
    }
}

/* ---- report.html ------------------------------------------------------------------------- */

/* One self-contained page: the summary table, and per problem the learning curves (the
 * mean over the seeds that did not diverge, their min-max as a band) of each optimizer's
 * best rate or chosen trial, the test accuracy likewise, the final loss against the
 * learning rate, and one Dolan-More performance profile over the problems. Inline SVG drawn
 * here (no JavaScript, no network, no other file), from the rows as the cell files read
 * back: the same bytes for the same results. */

typedef struct bn_svg {
    bn_buf *b;
    double x0, x1, y0, y1; /* the data ranges shown */
    bool logx, logy;
    int n_legend;
} bn_svg;

enum {
    BN_SVG_W = 760,
    BN_SVG_H = 380,
    BN_SVG_ML = 70,
    BN_SVG_MR = 190,
    BN_SVG_MT = 34,
    BN_SVG_MB = 46
};

static double bn_svg_x(const bn_svg *s, double x) {
    double a = s->logx ? log10(x) : x, lo = s->logx ? log10(s->x0) : s->x0;
    double hi = s->logx ? log10(s->x1) : s->x1;
    return BN_SVG_ML + (a - lo) / (hi - lo) * (BN_SVG_W - BN_SVG_ML - BN_SVG_MR);
}

static double bn_svg_y(const bn_svg *s, double y) {
    double a = s->logy ? log10(y) : y, lo = s->logy ? log10(s->y0) : s->y0;
    double hi = s->logy ? log10(s->y1) : s->y1;
    return BN_SVG_H - BN_SVG_MB - (a - lo) / (hi - lo) * (BN_SVG_H - BN_SVG_MT - BN_SVG_MB);
}

/* text safe for HTML */
static void bn_html(bn_buf *b, const char *s) {
    for (; *s != '\0'; s++) {
        switch (*s) {
        case '<':
            bn_printf(b, "&lt;");
            break;
        case '>':
            bn_printf(b, "&gt;");
            break;
        case '&':
            bn_printf(b, "&amp;");
            break;
        case '"':
            bn_printf(b, "&quot;");
            break;
        default:
            bn_append(b, s, 1);
        }
    }
}

/* The ticks of one axis: decades on a log axis (with 2 and 5 when it spans under two), else
 * 1-2-5 steps; each value through fn(ud, v). */
static void bn_svg_ticks(double lo, double hi, bool logscale, void (*fn)(bn_svg *, double, bool),
                         bn_svg *s, bool xaxis) {
    if (logscale) {
        int e0 = (int)floor(log10(lo)), e1 = (int)ceil(log10(hi));
        int step = (e1 - e0 + 7) / 8 > 1 ? (e1 - e0 + 7) / 8 : 1;
        for (int e = e0; e <= e1; e += step) {
            static const double m[3] = {1, 2, 5};
            for (int i = 0; i < (e1 - e0 < 2 ? 3 : 1); i++) {
                double v = m[i] * pow(10.0, e);
                if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) {
                    fn(s, v, xaxis);
                }
            }
        }
        return;
    }
    double span = hi - lo, raw = span / 5, mag = pow(10.0, floor(log10(raw))), st = mag;
    st = raw / mag >= 5 ? 5 * mag : raw / mag >= 2 ? 2 * mag : mag;
    for (double v = ceil(lo / st) * st; v <= hi + 1e-9 * span; v += st) {
        fn(s, fabs(v) < 1e-12 * span ? 0.0 : v, xaxis);
    }
}

static void bn_svg_tick(bn_svg *s, double v, bool xaxis) {
    if (xaxis) {
        double x = bn_svg_x(s, v);
        bn_printf(
            s->b,
            "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" class=\"grid\"/><text x=\"%.1f\" "
            "y=\"%d\" text-anchor=\"middle\">%g</text>\n",
            x, BN_SVG_MT, x, BN_SVG_H - BN_SVG_MB, x, BN_SVG_H - BN_SVG_MB + 16, v);
    } else {
        double y = bn_svg_y(s, v);
        bn_printf(
            s->b,
            "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" class=\"grid\"/><text x=\"%d\" "
            "y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
            BN_SVG_ML, y, BN_SVG_W - BN_SVG_MR, y, BN_SVG_ML - 6, y + 4, v);
    }
}

/* An axis range that can be drawn: finite, positive on a log axis (within 1e-300 ..
 * 1e300), not empty. */
static void bn_svg_range(double *lo, double *hi, bool logscale) {
    if (logscale) {
        *lo = isfinite(*lo) && *lo > 1e-300 ? fmin(*lo, 1e299) : 1e-300;
        *hi = isfinite(*hi) && *hi < 1e300 ? *hi : 1e300;
        if (!(*hi > *lo)) {
            *hi = *lo * 10;
        }
        return;
    }
    *lo = isfinite(*lo) ? *lo : 0;
    *hi = isfinite(*hi) && *hi > *lo ? *hi : *lo + 1;
}

static void bn_svg_begin(bn_svg *s, const char *title, const char *xlabel, const char *ylabel) {
    bn_svg_range(&s->x0, &s->x1, s->logx);
    bn_svg_range(&s->y0, &s->y1, s->logy);
    bn_printf(s->b,
              "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
              "viewBox=\"0 0 %d %d\" role=\"img\"><title>",
              BN_SVG_W, BN_SVG_H, BN_SVG_W, BN_SVG_H);
    bn_html(s->b, title);
    bn_printf(s->b, "</title>\n<text x=\"%d\" y=\"20\" class=\"title\">", BN_SVG_ML);
    bn_html(s->b, title);
    bn_printf(s->b, "</text>\n");
    bn_svg_ticks(s->x0, s->x1, s->logx, bn_svg_tick, s, true);
    bn_svg_ticks(s->y0, s->y1, s->logy, bn_svg_tick, s, false);
    bn_printf(
        s->b,
        "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" class=\"frame\"/>\n<text x=\"%d\" "
        "y=\"%d\" text-anchor=\"middle\">",
        BN_SVG_ML, BN_SVG_MT, BN_SVG_W - BN_SVG_ML - BN_SVG_MR, BN_SVG_H - BN_SVG_MT - BN_SVG_MB,
        (BN_SVG_ML + BN_SVG_W - BN_SVG_MR) / 2, BN_SVG_H - 8);
    bn_html(s->b, xlabel);
    bn_printf(s->b,
              "</text>\n<text transform=\"translate(16 %d) rotate(-90)\" "
              "text-anchor=\"middle\">",
              (BN_SVG_MT + BN_SVG_H - BN_SVG_MB) / 2);
    bn_html(s->b, ylabel);
    bn_printf(s->b, "</text>\n<g clip-path=\"none\">\n");
}

static void bn_svg_end(bn_svg *s) {
    bn_printf(s->b, "</g>\n</svg>\n");
}

static void bn_svg_legend(bn_svg *s, const char *label, const char *color, int dash, bool line) {
    int y = BN_SVG_MT + 8 + 18 * s->n_legend++, x = BN_SVG_W - BN_SVG_MR + 12;
    if (line) {
        bn_printf(
            s->b,
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/>", x,
            y, x + 22, y, color, dash > 1 ? " stroke-dasharray=\"6 4\"" : "");
    } else {
        bn_printf(s->b, "<circle cx=\"%d\" cy=\"%d\" r=\"3.5\" fill=\"%s\"/>", x + 11, y, color);
    }
    bn_printf(s->b, "<text x=\"%d\" y=\"%d\">", x + 28, y + 4);
    bn_html(s->b, label);
    bn_printf(s->b, "</text>\n");
}

/* x, y clamped into the box (a curve leaving it is cut at the edge) */
static void bn_svg_pt(bn_svg *s, double x, double y) {
    double py = bn_svg_y(s, y);
    py = py < BN_SVG_MT ? BN_SVG_MT : py > BN_SVG_H - BN_SVG_MB ? BN_SVG_H - BN_SVG_MB : py;
    bn_printf(s->b, "%.1f,%.1f ", bn_svg_x(s, x), py);
}

/* The rows of (p, o, l) over the seeds that did not diverge: per logged row its step and
 * the mean, min and max of the loss (what 0) or of the accuracy (what 1). n rows, or 0. */
static int64_t bn_band(const bn_cfg *cfg, const bn_cell *cells, int p, int o, int l, int what,
                       double *st, double *mean, double *lo, double *hi, int64_t cap) {
    int64_t rows = INT64_MAX;
    int n = 0;
    for (int k = 0; k < cfg->n_seeds; k++) {
        const bn_cell *c = bn_find(cells, cfg, p, o, l, k);
        if (c->done && !bn_cell_diverged(c)) {
            rows = c->n_rows < rows ? c->n_rows : rows;
            n++;
        }
    }
    if (n == 0) {
        return 0;
    }
    rows = rows < cap ? rows : cap;
    for (int64_t i = 0; i < rows; i++) {
        double sum = 0, a = INFINITY, b = -INFINITY;
        for (int k = 0; k < cfg->n_seeds; k++) {
            const bn_cell *c = bn_find(cells, cfg, p, o, l, k);
            if (!c->done || bn_cell_diverged(c)) {
                continue;
            }
            double v = what == 0 ? c->rows[i].loss : c->rows[i].acc;
            sum += v;
            a = v < a ? v : a;
            b = v > b ? v : b;
            st[i] = (double)c->rows[i].step;
        }
        mean[i] = sum / n;
        lo[i] = a;
        hi[i] = b;
    }
    return rows;
}

/* Curves of problem p: what 0 the training loss (log axis), 1 the test accuracy. */
static void bn_report_curves(bn_buf *b, const bn_cfg *cfg, const bn_cell *cells, int p, int what) {
    const bench_problem *pr = &bench_problems[p];
    int64_t cap = cfg->steps / cfg->log_every + 2;
    double *buf = malloc((size_t)cap * 4 * sizeof *buf);
    if (buf == NULL) {
        b->oom = true;
        return;
    }
    double *st = buf, *mean = buf + cap, *lo = buf + 2 * cap, *hi = buf + 3 * cap;
    bn_svg s = {.b = b, .x0 = 0, .x1 = (double)cfg->steps, .logy = what == 0};
    bn_range r = {INFINITY, -INFINITY};
    for (int o = 0; o < BN_N_OPTIMS; o++) {
        bn_sum sum;
        if (!cfg->optim_on[o]) {
            continue;
        }
        bn_summarize(cfg, cells, p, o, &sum);
        int64_t n =
            sum.best >= 0 ? bn_band(cfg, cells, p, o, sum.best, what, st, mean, lo, hi, cap) : 0;
        for (int64_t i = 0; i < n; i++) {
            if (what == 1 || (lo[i] > 0 && isfinite(hi[i]))) {
                bn_range_add(&r, lo[i]);
                bn_range_add(&r, hi[i]);
            }
        }
    }
    if (what == 0) {
        bn_range_add(&r, pr->target);
    }
    if (!(r.lo <= r.hi)) {
        r = (bn_range){what == 0 ? 1 : 0, what == 0 ? 10 : 1};
    }
    s.y0 = what == 0 ? pow(10.0, floor(log10(r.lo))) : fmax(0.0, floor(r.lo * 10) / 10);
    s.y1 = what == 0 ? pow(10.0, ceil(log10(r.hi))) : fmin(1.0, ceil(r.hi * 10) / 10);
    char title[400];
    bn_fmt(title, sizeof title, "%s: %s", pr->title,
           what == 0 ? (pr->batch > 0 ? "training loss (train_eval)" : "loss") : "test accuracy");
    bn_svg_begin(&s, title, "step", what == 0 ? "loss" : "accuracy");
    for (int o = 0; o < BN_N_OPTIMS; o++) {
        bn_sum sum;
        if (!cfg->optim_on[o]) {
            continue;
        }
        bn_summarize(cfg, cells, p, o, &sum);
        int64_t n =
            sum.best >= 0 ? bn_band(cfg, cells, p, o, sum.best, what, st, mean, lo, hi, cap) : 0;
        if (n == 0) {
            continue;
        }
        const bn_optim *op = &bn_optims[o];
        bn_printf(b, "<polygon fill=\"%s\" fill-opacity=\"0.15\" stroke=\"none\" points=\"",
                  op->color);
        for (int64_t i = 0; i < n; i++) {
            bn_svg_pt(&s, st[i], what == 0 && !(lo[i] > 0) ? s.y0 : lo[i]);
        }
        for (int64_t i = n - 1; i >= 0; i--) {
            bn_svg_pt(&s, st[i], what == 0 && !(hi[i] > 0) ? s.y0 : hi[i]);
        }
        bn_printf(b, "\"/>\n<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"",
                  op->color, op->dash > 1 ? " stroke-dasharray=\"6 4\"" : "");
        for (int64_t i = 0; i < n; i++) {
            bn_svg_pt(&s, st[i], what == 0 && !(mean[i] > 0) ? s.y0 : mean[i]);
        }
        bn_printf(b, "\"/>\n");
        char label[80];
        if (cfg->tune_k > 0) {
            bn_fmt(label, sizeof label, "%s (trial %d)", op->name, sum.best);
        } else {
            bn_fmt(label, sizeof label, "%s (lr %.3g)", op->name, cfg->lrs[o][sum.best]);
        }
        bn_svg_legend(&s, label, op->color, op->dash, true);
    }
    if (what == 0 && pr->target >= s.y0 && pr->target <= s.y1) {
        double y = bn_svg_y(&s, pr->target);
        bn_printf(b,
                  "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#000\" "
                  "stroke-dasharray=\"3 3\"/>\n",
                  BN_SVG_ML, y, BN_SVG_W - BN_SVG_MR, y);
        char label[64];
        bn_fmt(label, sizeof label, "target %g", pr->target);
        bn_svg_legend(&s, label, "#000", 2, true);
    }
    bn_svg_end(&s);
    free(buf);
}

/* Final loss against the learning rate: per optimizer the mean over the seeds run at each
 * rate (or trial), min-max as a bar; diverged ones left out. */
static void bn_report_lr(bn_buf *b, const bn_cfg *cfg, const bn_cell *cells, int p) {
    const bench_problem *pr = &bench_problems[p];
    bn_svg s = {.b = b, .logx = true, .logy = true};
    bn_range x = {INFINITY, -INFINITY}, y = x;
    bn_sum sums[BN_N_OPTIMS];
    for (int o = 0; o < BN_N_OPTIMS; o++) {
        if (!cfg->optim_on[o]) {
            continue;
        }
        bn_summarize(cfg, cells, p, o, &sums[o]);
        for (int l = 0; l < cfg->n_lrs[o]; l++) {
            bn_range_add(&x, cfg->lrs[o][l]);
            if (sums[o].lr_min[l] > 0 && isfinite(sums[o].lr_max[l])) {
                bn_range_add(&y, sums[o].lr_min[l]);
                bn_range_add(&y, sums[o].lr_max[l]);
            }
        }
    }
    if (!(x.lo <= x.hi)) {
        x = (bn_range){1e-4, 1};
    }
    if (!(y.lo <= y.hi)) {
        y = (bn_range){1, 10};
    }
    s.x0 = pow(10.0, floor(log10(x.lo)));
    s.x1 = pow(10.0, ceil(log10(x.hi)));
    s.y0 = pow(10.0, floor(log10(y.lo)));
    s.y1 = pow(10.0, ceil(log10(y.hi)));
    char title[400];
    bn_fmt(title, sizeof title, "%s: final loss (step %" PRId64 ") against the learning rate",
           pr->title, cfg->steps);
    bn_svg_begin(&s, title, "learning rate", "final loss");
    for (int o = 0; o < BN_N_OPTIMS; o++) {
        if (!cfg->optim_on[o]) {
            continue;
        }
        const bn_optim *op = &bn_optims[o];
        const bn_sum *sm = &sums[o];
        bool any = false;
        for (int l = 0; l < cfg->n_lrs[o]; l++) {
            if (!(sm->lr_mean[l] > 0) || !isfinite(sm->lr_mean[l])) {
                continue;
            }
            any = true;
            double px = bn_svg_x(&s, cfg->lrs[o][l]);
            bn_printf(b,
                      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>"
                      "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n",
                      px, bn_svg_y(&s, sm->lr_min[l] > 0 ? sm->lr_min[l] : sm->lr_mean[l]), px,
                      bn_svg_y(&s, sm->lr_max[l]), op->color, px, bn_svg_y(&s, sm->lr_mean[l]),
                      op->color);
        }
        if (any) {
            bn_svg_legend(&s, op->name, op->color, op->dash, false);
        }
    }
    bn_svg_end(&s);
}

/* The cost of (p, o) for the performance profile: the mean steps to the target over the
 * seeds at the best setting when every seed reached it, else infinity. */
static double bn_cost(const bn_cfg *cfg, const bn_cell *cells, int p, int o) {
    bn_sum s;
    bn_summarize(cfg, cells, p, o, &s);
    if (s.best < 0 || s.n_reached < cfg->n_seeds) {
        return INFINITY;
    }
    return fmax(s.reached_mean, 1.0); /* a target met at step 0 costs a step */
}

#define BN_PROFILE_TEXT                                                                            \
    "Dolan and More's performance profile: for each problem an optimizer's cost is its mean "      \
    "steps to the target at its best learning rate (chosen trial) when every seed reached it, "    \
    "else infinite; rho(tau) is the fraction of the problems where its cost is within tau "        \
    "times the best optimizer's. Problems no optimizer solved are left out."

static void bn_report_profile(bn_buf *b, const bn_cfg *cfg, const bn_cell *cells, int *n_used) {
    double cost[BN_MAX_PROBLEMS][BN_N_OPTIMS], tmax = 1;
    int used = 0;
    bool use[BN_MAX_PROBLEMS] = {0};
    for (int i = 0; i < cfg->n_problems; i++) {
        double best = INFINITY;
        for (int o = 0; o < BN_N_OPTIMS; o++) {
            cost[i][o] = cfg->optim_on[o] ? bn_cost(cfg, cells, cfg->problems[i], o) : INFINITY;
            best = cost[i][o] < best ? cost[i][o] : best;
        }
        use[i] = isfinite(best);
        used += use[i];
        for (int o = 0; use[i] && o < BN_N_OPTIMS; o++) {
            cost[i][o] /= best; /* the ratio */
            tmax = isfinite(cost[i][o]) && cost[i][o] > tmax ? cost[i][o] : tmax;
        }
    }
    *n_used = used;
    bn_svg s = {
        .b = b, .x0 = 1, .x1 = pow(10.0, ceil(log10(tmax * 1.01))), .y0 = 0, .y1 = 1, .logx = true};
    if (s.x1 <= 1) {
        s.x1 = 10;
    }
    char title[128];
    bn_fmt(title, sizeof title, "Performance profile over %d problem%s (steps to target)", used,
           used == 1 ? "" : "s");
    bn_svg_begin(&s, title, "tau (ratio to the best steps to target)", "fraction of problems");
    for (int o = 0; o < BN_N_OPTIMS && used > 0; o++) {
        if (!cfg->optim_on[o]) {
            continue;
        }
        double r[BN_MAX_PROBLEMS];
        int n = 0;
        for (int i = 0; i < cfg->n_problems; i++) {
            if (use[i] && isfinite(cost[i][o])) {
                r[n++] = cost[i][o];
            }
        }
        qsort(r, (size_t)n, sizeof r[0], bn_cmp_double);
        const bn_optim *op = &bn_optims[o];
        bn_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"",
                  op->color, op->dash > 1 ? " stroke-dasharray=\"6 4\"" : "");
        double frac = 0;
        bn_svg_pt(&s, 1.0, 0.0);
        for (int j = 0; j < n; j++) {
            bn_svg_pt(&s, r[j], frac);
            frac = (double)(j + 1) / used;
            bn_svg_pt(&s, r[j], frac);
        }
        bn_svg_pt(&s, s.x1, frac);
        bn_printf(b, "\"/>\n");
        bn_svg_legend(&s, op->name, op->color, op->dash, true);
    }
    bn_svg_end(&s);
}

/* report.html from the results (md: the summary table, as summary.md holds it). */
static void bn_report(const bn_cfg *cfg, const bn_cell *cells, const char *digest, bn_buf *b) {
    bn_printf(b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
                 "<title>nabla bench report</title>\n<style>\n"
                 "body{font-family:sans-serif;max-width:1000px;margin:1em auto;color:#222}\n"
                 "table{border-collapse:collapse;font-size:90%%}td,th{border:1px solid #bbb;"
                 "padding:3px 6px;text-align:right}th{background:#eee}td.l{text-align:left}\n"
                 "svg{display:block;margin:0.5em 0;font-size:12px}svg .grid{stroke:#e4e4e4}"
                 "svg .frame{fill:none;stroke:#555}svg .title{font-size:14px;font-weight:bold}\n"
                 "</style>\n</head>\n<body>\n<h1>nabla bench report</h1>\n<p>");
    bn_printf(
        b, "nabla %s; %d problem%s; %" PRId64 " steps per cell, logged every %" PRId64 "; seeds",
        nb_version(), cfg->n_problems, cfg->n_problems == 1 ? "" : "s", cfg->steps, cfg->log_every);
    for (int k = 0; k < cfg->n_seeds; k++) {
        bn_printf(b, " %" PRIu64, cfg->seeds[k]);
    }
    if (cfg->tune_k > 0) {
        bn_printf(b,
                  "; tuning: random, %d trials per optimizer (seed %" PRIu64 ") on seed %" PRIu64
                  ", the chosen one on every seed",
                  cfg->tune_k, cfg->tune_seed, cfg->seeds[0]);
    } else {
        bn_printf(b, "; learning-rate grids");
    }
    bn_printf(b, ". results.csv SHA-256 <code>%s</code>.</p>\n", digest);
    /* the summary table */
    bn_printf(b,
              "<h2>Summary</h2>\n<table>\n<tr><th>problem</th><th>optimizer</th><th>%s</th>"
              "<th>final loss (mean &#177; std)</th><th>diverged seeds</th><th>final test "
              "accuracy</th><th>best test accuracy</th><th>final test loss</th><th>steps to "
              "target</th><th>AUC</th></tr>\n",
              cfg->tune_k > 0 ? "chosen trial (lr)" : "best lr");
    for (int i = 0; i < cfg->n_problems; i++) {
        const bench_problem *p = &bench_problems[cfg->problems[i]];
        for (int o = 0; o < BN_N_OPTIMS; o++) {
            if (!cfg->optim_on[o]) {
                continue;
            }
            bn_sum s;
            bn_summarize(cfg, cells, cfg->problems[i], o, &s);
            bn_printf(b, "<tr><td class=\"l\">");
            bn_html(b, p->name);
            bn_printf(b, "</td><td class=\"l\">%s</td>", bn_optims[o].name);
            if (s.best < 0) {
                bn_printf(b, "<td>&#8212;</td><td colspan=\"7\" class=\"l\">diverged at every "
                             "setting</td></tr>\n");
                continue;
            }
            if (cfg->tune_k > 0) {
                bn_printf(b, "<td>%d (%.3g)</td>", s.best, cfg->lrs[o][s.best]);
            } else {
                bn_printf(b, "<td>%.3g</td>", cfg->lrs[o][s.best]);
            }
            bn_printf(b, "<td>%.4g &#177; %.2g</td><td>%d of %d</td>", s.mean, s.std, s.n_div,
                      cfg->n_seeds);
            if (p->has_accuracy) {
                bn_printf(b, "<td>%.1f %%</td><td>%.1f %%</td>", 100 * s.acc_mean,
                          100 * s.best_acc_mean);
            } else {
                bn_printf(b, "<td></td><td></td>");
            }
            if (p->batch > 0) {
                bn_printf(b, "<td>%.4g</td>", s.test_mean);
            } else {
                bn_printf(b, "<td></td>");
            }
            if (s.n_reached > 0) {
                bn_printf(b, "<td>%.0f (%d of %d)</td>", s.reached_mean, s.n_reached, cfg->n_seeds);
            } else {
                bn_printf(b, "<td>not reached</td>");
            }
            bn_printf(b, "<td>%.4g</td></tr>\n", s.auc_mean);
        }
    }
    bn_printf(b, "</table>\n<p>A cell diverged when %s. ", BN_DIVERGED_TEXT);
    if (cfg->tune_k > 0) {
        bn_printf(b, "The chosen trial is, %s. ", BN_CHOSEN_TEXT);
    } else {
        bn_printf(b, "The best learning rate has %s. ", BN_BEST_TEXT);
    }
    bn_printf(b, "AUC: the mean training loss over the run. Curves: the mean over the seeds "
                 "that did not diverge; the band, their min to max.</p>\n");
    /* the performance profile */
    bn_printf(b, "<h2>Performance profile</h2>\n");
    int used = 0;
    bn_report_profile(b, cfg, cells, &used);
    bn_printf(b, "<p>%s</p>\n", BN_PROFILE_TEXT);
    /* per problem */
    for (int i = 0; i < cfg->n_problems; i++) {
        const bench_problem *p = &bench_problems[cfg->problems[i]];
        bn_printf(b, "<h2 id=\"%s\">", p->name);
        bn_html(b, p->title);
        bn_printf(b, "</h2>\n");
        bn_report_curves(b, cfg, cells, cfg->problems[i], 0);
        if (p->has_accuracy) {
            bn_report_curves(b, cfg, cells, cfg->problems[i], 1);
        }
        bn_report_lr(b, cfg, cells, cfg->problems[i]);
    }
    bn_printf(b, "</body>\n</html>\n");
}

/* ---- the command ------------------------------------------------------------------------- */

static bool bn_is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool bn_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* rmdir path and its parents up to and including top (a prefix of path); stops at the
 * first that is not empty. */
static void bn_rmdirs(const char *path, const char *top) {
    if (top[0] == '\0') {
        return;
    }
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    size_t top_len = strlen(top);
    while (strlen(p) >= top_len && rmdir(p) == 0) {
        char *slash = strrchr(p, '/');
        if (slash == NULL || (size_t)(slash - p) < top_len) {
            break;
        }
        *slash = '\0';
    }
}

/* mkdir -p. 0, or -1 with errno and the directories it made removed again. *made: the
 * outermost directory it made (for the caller to remove on a later failure), or "". */
static int bn_mkdirs(const char *path, char made[4096]) {
    char p[4096];
    made[0] = '\0';
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0') {
            continue;
        }
        char keep = *s;
        *s = '\0';
        int rc = mkdir(p, 0755);
        int e = errno;
        if (rc == 0 && made[0] == '\0') {
            memcpy(made, p, (size_t)(s - p) + 1);
        }
        if ((rc != 0 && e != EEXIST) || !bn_is_dir(p)) {
            e = rc != 0 && e != EEXIST ? e : ENOTDIR;
            char *slash = strrchr(p, '/');
            if (slash != NULL) {
                *slash = '\0';
                bn_rmdirs(p, made);
            }
            made[0] = '\0';
            errno = e;
            return -1;
        }
        *s = keep;
        if (keep == '\0') {
            return 0;
        }
    }
}

/* Removes the temporary files (".<name>.XXXXXX") that writes cut short by a kill left. */
static void bn_remove_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) {
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' && strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            char f[4400];
            bn_fmt(f, sizeof f, "%s/%s", dir, e->d_name);
            unlink(f);
        }
    }
    closedir(d);
}

/* Removes what a run writes in dir (for --overwrite): the cells, the results, the plots. */
static void bn_clear_run(const char *out) {
    static const char *const subdirs[] = {"cells", "plots"};
    char path[4400];
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", out, subdirs[i]);
        DIR *d = opendir(path);
        if (d == NULL) {
            continue;
        }
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
                char f[4700];
                bn_fmt(f, sizeof f, "%s/%s", path, e->d_name);
                unlink(f);
            }
        }
        closedir(d);
    }
    static const char *const files[] = {"results.csv", "summary.json", "summary.md", "report.html",
                                        "run.cfg"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", out, files[i]);
        unlink(path);
    }
}

/* Every selected problem set up once (seed 0), so that a missing data file is reported
 * before anything is written. */
static int bn_preflight(const bn_cfg *cfg) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(NULL, &ctx) != NB_OK) {
        fprintf(stderr, "nabla bench: cannot create a context\n");
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < cfg->n_problems && rc == 0; i++) {
        const bench_problem *p = &bench_problems[cfg->problems[i]];
        nb_array *key = NULL;
        nb_tree *params = NULL, *data = NULL;
        nb_status st = nb_random_key(ctx, 0, &key);
        if (st == NB_OK) {
            st = p->setup(ctx, cfg->data, key, &params, &data);
        }
        if (st != NB_OK) {
            fprintf(stderr, "nabla bench: problem %s cannot be set up: %s\n  %s\n", p->name,
                    nb_status_name(st), nb_ctx_errmsg(ctx));
            if (st == NB_ERR_IO) {
                fprintf(stderr,
                        "  (--data names the directory holding the UCI data sets; "
                        "this run looked in %s)\n",
                        cfg->data);
            }
            rc = 2;
        }
        nb_tree_destroy(params);
        nb_tree_destroy(data);
        nb_array_destroy(key);
    }
    nb_ctx_destroy(ctx);
    return rc;
}

/* Takes the lock of --out: <out>/run.lock, locked with fcntl (released when the process ends,
 * however it ends). A run that holds it removes the file when it is done (bn_unlock), so a
 * lock taken on a file that is no longer at that path is no lock: it is taken again on the
 * new file. The descriptor, -1 when another run holds the lock (*other: its pid) or errno. */
static int bn_lock(const char *path, long *other) {
    *other = 0;
    for (int tries = 0; tries < 100; tries++) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            return -1;
        }
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        if (fcntl(fd, F_SETLK, &fl) != 0) {
            int e = errno;
            struct flock who = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
            bool held = (e == EACCES || e == EAGAIN) && fcntl(fd, F_GETLK, &who) == 0;
            close(fd);
            if (held && who.l_type != F_UNLCK) {
                *other = (long)who.l_pid;
                return -1;
            }
            if (!held) {
                errno = e;
                return -1;
            }
            continue; /* its holder let it go in between: again */
        }
        struct stat held, now;
        if (fstat(fd, &held) == 0 && stat(path, &now) == 0 && held.st_dev == now.st_dev &&
            held.st_ino == now.st_ino) {
            return fd;
        }
        close(fd); /* removed by a run that finished in between: again */
    }
    errno = EAGAIN;
    return -1;
}

/* Removes <out>/run.lock and lets the lock go (fd < 0: not held, nothing to do). Only the
 * holder removes it, while it holds it; see bn_lock. */
static void bn_unlock(const char *out, int fd) {
    if (fd < 0) {
        return;
    }
    char path[4400];
    bn_fmt(path, sizeof path, "%s/run.lock", out);
    unlink(path);
    close(fd);
}

/* Makes --out ready: 0, or 2 with a message (and nothing created). Holds the lock of --out
 * (bn_lock) so that two runs cannot write into one directory; *lock_fd is its descriptor. */
static int bn_prepare_out(const bn_cfg *cfg, const bn_buf *cfg_text, bool *resumed, int *lock_fd) {
    char path[4400], made[4096] = "";
    *resumed = false;
    *lock_fd = -1;
    bool existed = bn_exists(cfg->out);
    if (existed && !bn_is_dir(cfg->out)) {
        return bn_err("--out %s exists and is not a directory", cfg->out);
    }
    if (cfg->resume && !existed) {
        return bn_err("--resume: %s holds no run to continue (it does not exist)", cfg->out);
    }
    if (!existed && bn_mkdirs(cfg->out, made) != 0) {
        return bn_err("cannot create the output directory %s: %s", cfg->out, strerror(errno));
    }
    int rc = 0;
    long other = 0;
    bn_fmt(path, sizeof path, "%s/run.lock", cfg->out);
    int fd = bn_lock(path, &other);
    if (fd < 0 && other != 0) {
        rc = bn_err("another nabla bench (pid %ld) is writing into %s; wait for it or pick "
                    "another --out",
                    other, cfg->out);
    } else if (fd < 0) {
        rc = bn_err("cannot write into the output directory %s: %s", cfg->out, strerror(errno));
    }
    bn_fmt(path, sizeof path, "%s/run.cfg", cfg->out);
    bool has_run = rc == 0 && bn_exists(path);
    if (rc == 0 && has_run) {
        if (cfg->overwrite) {
            bn_clear_run(cfg->out);
            has_run = false;
        } else if (!cfg->resume) {
            rc = bn_err("%s already holds a run (run.cfg): --resume continues it, --overwrite "
                        "starts again, or pick another --out",
                        cfg->out);
        } else {
            size_t len = 0;
            char *old = bn_read_file(path, &len);
            bool same = old != NULL && len == cfg_text->len && memcmp(old, cfg_text->s, len) == 0;
            if (!same) {
                fprintf(stderr,
                        "nabla bench: --resume: the run in %s was made with other options, "
                        "data or nabla; its run.cfg says:\n%s"
                        "and this run would be:\n%.*s"
                        "(resume with the same options and data, or pass --overwrite to start "
                        "again)\n",
                        cfg->out, old != NULL ? old : "(unreadable)\n", (int)cfg_text->len,
                        cfg_text->s);
                rc = 2;
            }
            free(old);
            *resumed = rc == 0;
        }
    } else if (rc == 0 && cfg->resume) {
        rc = bn_err("--resume: %s holds no run to continue (no run.cfg)", cfg->out);
    }
    char cells[4400], plots[4400];
    bn_fmt(cells, sizeof cells, "%s/cells", cfg->out);
    bn_fmt(plots, sizeof plots, "%s/plots", cfg->out);
    bool made_cells = false, made_plots = false;
    if (rc == 0) {
        made_cells = mkdir(cells, 0755) == 0;
        made_plots = cfg->plots && mkdir(plots, 0755) == 0;
        if (!bn_is_dir(cells) || (cfg->plots && !bn_is_dir(plots))) {
            rc = bn_err("cannot use %s: %s/cells and %s/plots must be directories", cfg->out,
                        cfg->out, cfg->out);
        } else if (!has_run &&
                   bn_write_atomic(cfg->out, "run.cfg", cfg_text->s, cfg_text->len) != 0) {
            rc = bn_err("cannot write into the output directory %s: %s", cfg->out, strerror(errno));
        }
    }
    if (rc == 0) {
        /* what writes cut short by a kill left: .<name>.XXXXXX */
        bn_remove_temps(cfg->out);
        bn_remove_temps(cells);
        bn_remove_temps(plots);
        *lock_fd = fd;
        return 0;
    }
    if (made_cells) {
        rmdir(cells);
    }
    if (made_plots) {
        rmdir(plots);
    }
    bn_unlock(cfg->out, fd);
    if (!existed) {
        bn_rmdirs(cfg->out, made);
    }
    return rc;
}

/* The end of a run: the cells freed, --out unlocked (a no-op without the lock), the
 * processes' handle closed; returns rc. */
static int bn_finish(bn_cell *cells, int n, int *todo, const char *out, int lock_fd, nb_dist *dist,
                     nb_ctx *dctx, int rc) {
    for (int i = 0; i < n; i++) {
        free(cells[i].rows);
        free(cells[i].text);
    }
    free(cells);
    free(todo);
    bn_unlock(out, lock_fd);
    cli_dist_close(dist);
    nb_ctx_destroy(dctx);
    return rc;
}

/* --tune: every optimizer's K trials (bench_trial), their learning rates as its settings */
static int bn_draw_trials(bn_cfg *cfg) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(NULL, &ctx) != NB_OK) {
        return bn_err("cannot create a context");
    }
    int rc = 0;
    for (int o = 0; o < BN_N_OPTIMS && rc == 0; o++) {
        for (int t = 0; t < cfg->tune_k && rc == 0; t++) {
            if (bench_trial(ctx, bn_optims[o].name, cfg->tune_seed, t, &cfg->hps[o][t]) != NB_OK) {
                rc = bn_err("--tune: %s", nb_ctx_errmsg(ctx));
            }
            cfg->lrs[o][t] = cfg->hps[o][t].lr;
        }
        cfg->n_lrs[o] = cfg->tune_k;
    }
    nb_ctx_destroy(ctx);
    return rc;
}

int nabla_cmd_bench(int argc, char **argv) {
    bn_cfg cfg;
    int rc = bn_parse_args(argc, argv, &cfg);
    if (rc == 0 && cfg.tune_k > 0) {
        rc = bn_draw_trials(&cfg);
    }
    if (rc != 0) {
        return rc < 0 ? 0 : rc;
    }
    /* Under mpirun the cells are shared out over the processes (cell i of those left to run
     * goes to process i mod N); rank 0 prepares --out before and writes the results after,
     * from the cell files every process wrote. Cells are independent, so the bytes are the
     * same for any number of processes. */
    nb_ctx *dctx = NULL;
    nb_dist *dist = NULL;
    int rank = 0, n_proc = 1;
    if (cli_dist_launched()) {
        if (nb_ctx_create(NULL, &dctx) != NB_OK) {
            return bn_err("cannot create a context");
        }
        rc = cli_dist_open("bench", dctx, &dist);
        if (rc != 0) {
            nb_ctx_destroy(dctx);
            return rc;
        }
        rank = cli_dist_rank(dist);
        n_proc = cli_dist_size(dist);
        if (rank != 0 && freopen("/dev/null", "w", stdout) == NULL) { /* rank 0 reports */
            fprintf(stderr, "nabla bench: rank %d: cannot quiet its output\n", rank);
        }
    }
    bool resumed = false;
    int lock_fd = -1;
    if (rank == 0) {
        rc = bn_preflight(&cfg);
        if (rc == 0 && cfg.plots && bn_gnuplot(NULL, "-e", "set terminal pngcairo") != 0) {
            rc = bn_err("gnuplot with its pngcairo terminal is needed for the plots (Debian: "
                        "apt-get install gnuplot-nox; scripts/deps.sh does it), or pass "
                        "--no-plots");
        }
        bn_buf cfg_text = {0};
        if (rc == 0) {
            rc = bn_cfg_text(&cfg, &cfg_text);
            if (rc == 0 && cfg_text.oom) {
                rc = bn_err("out of memory");
            }
        }
        if (rc == 0) {
            rc = bn_prepare_out(&cfg, &cfg_text, &resumed, &lock_fd);
        }
        bn_buf_free(&cfg_text);
    }
    if (dist != NULL) {
        rc = cli_dist_agree(dist, rc); /* the others wait for rank 0's --out */
        resumed = cli_dist_root_value(dist, resumed) == 1;
    }
    if (rc != 0) {
        bn_unlock(cfg.out, lock_fd);
        cli_dist_close(dist);
        nb_ctx_destroy(dctx);
        return rc;
    }

    /* the cells, in the suite's order: (problem, optimizer, setting, seed), the settings
     * being the learning rates or, with --tune, the trials (of which only the chosen one
     * runs on the seeds after the first) */
    int n = 0;
    for (int i = 0; i < cfg.n_problems; i++) {
        for (int o = 0; o < BN_N_OPTIMS; o++) {
            n += cfg.optim_on[o] ? cfg.n_lrs[o] * cfg.n_seeds : 0;
        }
    }
    bn_cell *cells = calloc((size_t)n, sizeof *cells);
    int *todo = calloc((size_t)n, sizeof *todo);
    bn_run run;
    memset(&run, 0, sizeof run);
    if (cells == NULL || todo == NULL) {
        fprintf(stderr, "nabla bench: out of memory\n");
        return bn_finish(cells, cells != NULL ? n : 0, todo, cfg.out, lock_fd, dist, dctx, 1);
    }
    int m = 0;
    bool tune = cfg.tune_k > 0;
    for (int i = 0; i < cfg.n_problems; i++) {
        for (int o = 0; o < BN_N_OPTIMS; o++) {
            cfg.cell_start[cfg.problems[i]][o] = m;
            for (int l = 0; cfg.optim_on[o] && l < cfg.n_lrs[o]; l++) {
                for (int k = 0; k < cfg.n_seeds; k++) {
                    bn_cell *c = &cells[m++];
                    c->p = cfg.problems[i];
                    c->o = o;
                    c->l = l;
                    c->k = k;
                    c->trial = tune;
                    c->lr = cfg.lrs[o][l];
                    snprintf(c->lr_s, sizeof c->lr_s, "%.6g", c->lr);
                    c->seed = cfg.seeds[k];
                    c->reached = -1; /* until it runs or is read back */
                    c->reached_secs = NAN;
                    if (tune) {
                        snprintf(c->file, sizeof c->file, "%s.%s.trial%d.seed%" PRIu64 ".csv",
                                 bench_problems[c->p].name, bn_optims[o].name, l, c->seed);
                    } else {
                        snprintf(c->file, sizeof c->file, "%s.%s.lr%s.seed%" PRIu64 ".csv",
                                 bench_problems[c->p].name, bn_optims[o].name, c->lr_s, c->seed);
                    }
                }
            }
        }
    }
    snprintf(run.cells_dir, sizeof run.cells_dir, "%s/cells", cfg.out);
    run.cfg = &cfg;
    run.cells = cells;
    run.todo = todo;
    const char *kill_env = getenv("NABLA_BENCH_KILL_AFTER"); /* tests/tools/test_bench.sh */
    run.kill_after = kill_env != NULL ? atoi(kill_env) : 0;
    /* the first phase: every cell, or with --tune every trial on the first seed */
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (tune && cells[i].k != 0) {
            continue;
        }
        if (resumed && bn_cell_load(&cells[i], &cfg, run.cells_dir)) {
            kept++;
        } else {
            todo[run.n_todo++] = i;
        }
    }
    int n_optims = 0;
    for (int o = 0; o < BN_N_OPTIMS; o++) {
        n_optims += cfg.optim_on[o];
    }
    if (tune) {
        printf("nabla bench: %d problem%s x %d optimizer%s x %d trials on seed %" PRIu64
               ", then each one's chosen trial on %d more seed%s (--tune random:%d:%" PRIu64
               "): cells of %" PRId64 " steps (logged every %" PRId64 ")\n",
               cfg.n_problems, cfg.n_problems == 1 ? "" : "s", n_optims, n_optims == 1 ? "" : "s",
               cfg.tune_k, cfg.seeds[0], cfg.n_seeds - 1, cfg.n_seeds == 2 ? "" : "s", cfg.tune_k,
               cfg.tune_seed, cfg.steps, cfg.log_every);
    } else {
        printf("nabla bench: %d problem%s x %d optimizer%s x their learning rates x %d seed%s = "
               "%d cells of %" PRId64 " steps (logged every %" PRId64 ")\n",
               cfg.n_problems, cfg.n_problems == 1 ? "" : "s", n_optims, n_optims == 1 ? "" : "s",
               cfg.n_seeds, cfg.n_seeds == 1 ? "" : "s", n, cfg.steps, cfg.log_every);
    }
    if (resumed) {
        printf("  resuming %s: %d cell%s finished before, %d to run%s\n", cfg.out, kept,
               kept == 1 ? "" : "s", run.n_todo, tune ? " (trials)" : "");
    }
    printf("  %d job%s, %d kernel thread%s per cell; results in %s/\n", cfg.jobs,
           cfg.jobs == 1 ? "" : "s", cfg.threads, cfg.threads == 1 ? "" : "s", cfg.out);
    if (dist != NULL) {
        printf("  %d process%s (mpirun): cell i of those to run on process i mod %d\n", n_proc,
               n_proc == 1 ? "" : "es", n_proc);
    }
    fflush(stdout);
    pthread_mutex_init(&run.sh.mu, NULL);
    double t0 = cli_now_s();
    rc = bn_run_todo(&run, dist, rank, n_proc, kept, tune);
    if (rc == 0 && tune) {
        /* the second phase: each (problem, optimizer)'s chosen trial on the other seeds */
        run.n_todo = 0;
        run.next = 0;
        kept = 0;
        for (int i = 0; i < cfg.n_problems; i++) {
            for (int o = 0; o < BN_N_OPTIMS; o++) {
                int t = cfg.optim_on[o] ? bn_chosen(&cfg, cells, cfg.problems[i], o) : -1;
                for (int k = 1; t >= 0 && k < cfg.n_seeds; k++) {
                    int ci = (int)(bn_find(cells, &cfg, cfg.problems[i], o, t, k) - cells);
                    if (resumed && bn_cell_load(&cells[ci], &cfg, run.cells_dir)) {
                        kept++;
                    } else {
                        todo[run.n_todo++] = ci;
                    }
                }
            }
        }
        printf("  the chosen trials on the other seeds: %d cell%s to run%s\n", run.n_todo,
               run.n_todo == 1 ? "" : "s", kept > 0 ? " (more were finished before)" : "");
        fflush(stdout);
        rc = bn_run_todo(&run, dist, rank, n_proc, kept, false);
    }
    pthread_mutex_destroy(&run.sh.mu);
    printf("  %d cell%s run in %.1f s%s\n", run.cells_run, run.cells_run == 1 ? "" : "s",
           cli_now_s() - t0, dist != NULL ? " by process 0" : "");
    if (dist != NULL && rank != 0) { /* done: rank 0 writes the results (and holds no lock) */
        return bn_finish(cells, n, todo, cfg.out, lock_fd, dist, dctx, rc);
    }

    /* the results, from the cells in order */
    bn_buf csv = {0}, json = {0}, md = {0}, html = {0};
    if (rc == 0) {
        bn_printf(&csv,
                  "problem,optimizer,trial,lr,seed,step,loss,accuracy,valid_loss,test_loss\n");
        for (int i = 0; i < n; i++) {
            if (cells[i].text != NULL) { /* --tune: trials not chosen ran on one seed */
                bn_printf(&csv, "%.*s", (int)cells[i].text_len, cells[i].text);
            }
        }
        bn_summary_json(&cfg, cells, &json);
        bn_summary_md(&cfg, cells, &md);
        char hex[65] = "";
        if (!csv.oom) {
            sha256_ctx h;
            uint8_t d[32];
            sha256_init(&h);
            sha256_update(&h, csv.s, csv.len);
            sha256_final(&h, d);
            sha256_hex(d, hex);
        }
        bn_report(&cfg, cells, hex, &html);
        if (csv.oom || json.oom || md.oom || html.oom) {
            fprintf(stderr, "nabla bench: out of memory\n");
            rc = 1;
        }
    }
    static const char *const names[] = {"results.csv", "summary.json", "summary.md", "report.html"};
    const bn_buf *bufs[] = {&csv, &json, &md, &html};
    for (int i = 0; i < 4 && rc == 0; i++) {
        if (bn_write_atomic(cfg.out, names[i], bufs[i]->s, bufs[i]->len) != 0) {
            fprintf(stderr, "nabla bench: cannot write %s/%s: %s\n", cfg.out, names[i],
                    strerror(errno));
            rc = 1;
        }
    }
    /* the plots: a failure (gnuplot broke after the check above) still shows the table and
     * the digest of the complete results, then fails the run */
    char plot_err[1100] = "";
    if (rc == 0 && cfg.plots) {
        char dir[4400], err[1024];
        bn_fmt(dir, sizeof dir, "%s/plots", cfg.out);
        for (int i = 0; i < cfg.n_problems && plot_err[0] == '\0'; i++) {
            int g = bn_plot(&cfg, cells, cfg.problems[i], dir, err, sizeof err);
            if (g == 127) {
                bn_fmt(plot_err, sizeof plot_err, "gnuplot not found");
            } else if (g != 0) {
                bn_fmt(plot_err, sizeof plot_err, "%s", err);
            }
        }
    }
    if (rc == 0) {
        printf("\n%.*s\n", (int)md.len, md.s);
        bn_print_wall(&cfg, cells);
        printf("results: %s/results.csv, summary.json, summary.md, report.html", cfg.out);
        if (cfg.plots && plot_err[0] == '\0') {
            printf(", plots/<problem>.png and <problem>_lr.png");
        }
        printf("\n");
        char hex[65];
        char path[4400];
        bn_fmt(path, sizeof path, "%s/results.csv", cfg.out);
        if (sha256_file(path, hex) != 0) {
            fprintf(stderr, "nabla bench: cannot read %s back: %s\n", path, strerror(errno));
            rc = 1;
        } else {
            printf("sha256 of results.csv: %s\n", hex);
        }
    }
    if (rc == 0 && plot_err[0] != '\0') {
        fflush(stdout);
        fprintf(stderr,
                "nabla bench: the plots were not drawn: %s\n  the results are complete; draw "
                "the plots again with the same options and --resume (no cell runs again)\n",
                plot_err);
        rc = 1;
    }
    bn_buf_free(&csv);
    bn_buf_free(&json);
    bn_buf_free(&md);
    bn_buf_free(&html);
    /* done, or failed with what is kept for --resume */
    return bn_finish(cells, n, todo, cfg.out, lock_fd, dist, dctx, rc);
}

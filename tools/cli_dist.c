/*
 * cli_dist.c -- the `nabla` program over several processes (cli_dist.h).
 */
#include "cli_dist.h"

#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef NABLA_CLI_DIST
#include <nabla/dist.h>
#include <nabla/nabla.h>
#endif

bool cli_dist_launched(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                       "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        if (getenv(vars[i]) != NULL) {
            return true;
        }
    }
    return false;
}

#ifdef NABLA_CLI_DIST

bool cli_dist_available(void) {
    return true;
}

int cli_dist_open(const char *cmd, nb_ctx *ctx, nb_dist **out) {
    nb_status st = nb_dist_create(ctx, MPI_COMM_NULL, NULL, out);
    if (st != NB_OK) {
        return cli_fail(cmd, ctx, st, "cannot start on several processes");
    }
    return 0;
}

/* every process's v into all[0 .. size-1] (all may be NULL after a failed allocation: the
 * exchange still takes place, so nobody waits); false (with a message) on a failure */
static bool cli_dist_gather(nb_dist *d, int64_t v, int64_t *all) {
    nb_ctx *ctx = nb_dist_ctx(d);
    nb_array *a = NULL;
    nb_tree *t = NULL, *g = NULL;
    bool ok = false;
    if (nb_array_from_data(ctx, NB_DTYPE_I64, 0, NULL, &v, &a) != NB_OK ||
        nb_tree_array(a, &t) != NB_OK) {
        nb_tree_destroy(t);
        t = NULL; /* a NULL tree still takes part: the call fails on every process */
    }
    if (nb_dist_allgather(d, t, &g) == NB_OK && all != NULL) {
        memcpy(all, nb_array_data(nb_tree_get_array(g)), sizeof(int64_t) * (size_t)nb_dist_size(d));
        ok = true;
    } else {
        fprintf(stderr, "nabla: rank %d: %s\n", nb_dist_rank(d), nb_ctx_errmsg(ctx));
    }
    nb_tree_destroy(g);
    nb_tree_destroy(t);
    nb_array_destroy(a);
    return ok;
}

int cli_dist_agree(nb_dist *d, int rc) {
    int64_t *all = calloc((size_t)nb_dist_size(d) + 1, sizeof *all);
    int out = 1;
    if (cli_dist_gather(d, rc, all)) {
        out = 0;
        for (int i = 0; i < nb_dist_size(d); i++) {
            out = all[i] > out ? (int)all[i] : out;
        }
    }
    free(all);
    return out;
}

int64_t cli_dist_root_value(nb_dist *d, int64_t v) {
    int64_t *all = calloc((size_t)nb_dist_size(d) + 1, sizeof *all), out = -1;
    if (cli_dist_gather(d, v, all)) {
        out = all[0];
    }
    free(all);
    return out;
}

int cli_dist_rank(const nb_dist *d) {
    return nb_dist_rank(d);
}

int cli_dist_size(const nb_dist *d) {
    return nb_dist_size(d);
}

void cli_dist_close(nb_dist *d) {
    nb_dist_destroy(d);
}

#else /* built without nabla_dist */

bool cli_dist_available(void) {
    return false;
}

int cli_dist_open(const char *cmd, nb_ctx *ctx, nb_dist **out) {
    (void)ctx;
    *out = NULL;
    fprintf(stderr,
            "nabla %s: this nabla was built without MPI, so it cannot run on several processes "
            "(Debian: apt-get install libopenmpi-dev openmpi-bin, then configure and build "
            "nabla again: CMake then builds nabla_dist)\n",
            cmd);
    return 2;
}

int cli_dist_agree(nb_dist *d, int rc) {
    (void)d;
    return rc;
}

int64_t cli_dist_root_value(nb_dist *d, int64_t v) {
    (void)d;
    return v;
}

int cli_dist_rank(const nb_dist *d) {
    (void)d;
    return 0;
}

int cli_dist_size(const nb_dist *d) {
    (void)d;
    return 1;
}

void cli_dist_close(nb_dist *d) {
    (void)d;
}

#endif

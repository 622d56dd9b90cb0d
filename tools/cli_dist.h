/*
 * cli_dist.h -- the `nabla` program over several processes (cli_dist.c): `mpirun -np N nabla
 * train` and `mpirun -np N nabla bench`, through nabla/dist.h when nabla_dist was built.
 *
 * A program built without MPI still answers: cli_dist_open reports that MPI support is
 * missing and how to get it, so `mpirun -np 4 nabla train` never runs four unrelated copies.
 */
#ifndef NABLA_TOOLS_CLI_DIST_H
#define NABLA_TOOLS_CLI_DIST_H

#include <nabla/core.h>

#include <stdbool.h>
#include <stdint.h>

typedef struct nb_dist nb_dist;

/* Launched by mpirun (or another MPI launcher): its environment names a world size. */
bool cli_dist_launched(void);
/* true when this program was built with nabla_dist */
bool cli_dist_available(void);
/* The processes' handle on ctx: 0 and *out, or an exit code after a message on stderr
 * naming cmd. */
int cli_dist_open(const char *cmd, nb_ctx *ctx, nb_dist **out);
/* Every process's rc combined: the largest (so one failure fails all). A failed exchange
 * gives 1. */
int cli_dist_agree(nb_dist *d, int rc);
/* Rank 0's v, on every process (-1 if the exchange failed). */
int64_t cli_dist_root_value(nb_dist *d, int64_t v);
int cli_dist_rank(const nb_dist *d);
int cli_dist_size(const nb_dist *d);
void cli_dist_close(nb_dist *d);

#endif

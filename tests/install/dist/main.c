/* A consumer of the installed MPI component: the sum of the ranks + 1 over the processes. */
#include <nabla/dist.h>
#include <nabla/nabla.h>

#include <stdio.h>

int main(void) {
    nb_ctx *ctx = NULL;
    nb_dist *d = NULL;
    if (nb_ctx_create(NULL, &ctx) != NB_OK ||
        nb_dist_create(ctx, MPI_COMM_NULL, NULL, &d) != NB_OK) {
        fprintf(stderr, "setup failed: %s\n", ctx != NULL ? nb_ctx_errmsg(ctx) : "no context");
        return 1;
    }
    nb_array *a = NULL;
    nb_tree *t = NULL, *s = NULL;
    int rc = 1;
    if (nb_array_scalar(ctx, NB_DTYPE_F32, nb_dist_rank(d) + 1.0, &a) == NB_OK &&
        nb_tree_array(a, &t) == NB_OK && nb_dist_allreduce(d, t, NB_DIST_SUM, &s) == NB_OK) {
        if (nb_dist_rank(d) == 0) {
            printf("nabla dist: %d processes, sum %g\n", nb_dist_size(d),
                   (double)*(const float *)nb_array_data(nb_tree_get_array(s)));
        }
        rc = 0;
    } else {
        fprintf(stderr, "%s\n", nb_ctx_errmsg(ctx));
    }
    nb_tree_destroy(s);
    nb_tree_destroy(t);
    nb_array_destroy(a);
    nb_dist_destroy(d); /* finalizes MPI: nb_dist_create initialized it */
    nb_ctx_destroy(ctx);
    return rc;
}

/* A program outside the nabla tree: prints the linked version, makes a context. */
#include <nabla/nabla.h>

#include <stdio.h>
#include <string.h>

int main(void) {
    const char *v = nb_version();
    if (strcmp(v, NB_VERSION_STRING) != 0) {
        fprintf(stderr, "header says %s but the library is %s\n", NB_VERSION_STRING, v);
        return 1;
    }
    nb_ctx *ctx = NULL;
    nb_status s = nb_ctx_create(NULL, &ctx);
    if (s != NB_OK) {
        fprintf(stderr, "nb_ctx_create: %s\n", nb_status_string(s));
        return 1;
    }
    nb_ctx_destroy(ctx);
    printf("nabla %s\n", v);
    return 0;
}

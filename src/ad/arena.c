/*
 * arena.c -- bump allocation for trace and IR metadata, freed as a whole, plus the
 * references (constant arrays, output trees) that the IR holds until then.
 */
#include "ad/ir.h"

#include <string.h>

#define NBI_CHUNK_MIN (64 * 1024)

struct nbi_arena_chunk {
    nbi_arena_chunk *next;
    size_t size; /* bytes after the header */
    size_t used;
};

struct nbi_arena_ref {
    nbi_arena_ref *next;
    nb_array *array;
    nb_tree *tree;
    nb_fn *fn;
};

static size_t nbi_chunk_header(void) {
    return (sizeof(nbi_arena_chunk) + 15) / 16 * 16;
}

void nbi_arena_init(nbi_arena *a, nb_ctx *ctx) {
    a->ctx = ctx;
    a->head = NULL;
    a->refs = NULL;
    a->used_total = 0;
}

void *nbi_arena_alloc_raw(nbi_arena *a, size_t size) {
    size = (size + 15) / 16 * 16;
    if (size == 0) {
        size = 16;
    }
    nbi_arena_chunk *c = a->head;
    if (c == NULL || c->size - c->used < size) {
        size_t want = size > NBI_CHUNK_MIN ? size : NBI_CHUNK_MIN;
        size_t total = 0;
        if (nbi_add_size(want, nbi_chunk_header(), &total)) {
            return NULL;
        }
        c = nbi_alloc(a->ctx, total, 16);
        if (c == NULL) {
            return NULL;
        }
        c->size = want;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = (unsigned char *)c + nbi_chunk_header() + c->used;
    c->used += size;
    a->used_total += size;
    return p;
}

void *nbi_arena_alloc(nbi_arena *a, size_t size) {
    void *p = nbi_arena_alloc_raw(a, size);
    if (p != NULL) {
        memset(p, 0, size);
    }
    return p;
}

static bool nbi_arena_ref_add(nbi_arena *a, nb_array *x, nb_tree *t, nb_fn *f) {
    nbi_arena_ref *r = nbi_arena_alloc(a, sizeof *r);
    if (r == NULL) {
        nb_array_destroy(x);
        nb_tree_destroy(t);
        nb_fn_destroy(f);
        return false;
    }
    r->array = x;
    r->tree = t;
    r->fn = f;
    r->next = a->refs;
    a->refs = r;
    return true;
}

bool nbi_arena_own_array(nbi_arena *a, nb_array *x) {
    return nbi_arena_ref_add(a, x, NULL, NULL);
}

bool nbi_arena_own_tree(nbi_arena *a, nb_tree *t) {
    return nbi_arena_ref_add(a, NULL, t, NULL);
}

bool nbi_arena_own_fn(nbi_arena *a, nb_fn *f) {
    return nbi_arena_ref_add(a, NULL, NULL, f);
}

void nbi_arena_free_all(nbi_arena *a) {
    for (nbi_arena_ref *r = a->refs; r != NULL; r = r->next) {
        nb_tree_destroy(r->tree);
        nb_array_destroy(r->array);
        nb_fn_destroy(r->fn);
    }
    a->refs = NULL;
    nbi_arena_chunk *c = a->head;
    while (c != NULL) {
        nbi_arena_chunk *next = c->next;
        nbi_free(a->ctx, c, c->size + nbi_chunk_header());
        c = next;
    }
    a->head = NULL;
    a->used_total = 0;
}

/*
 * registry.c -- the op registry: one table built from ops.def, pointing at the entries
 * each family file defines.
 */
#include "ad/ir.h"

static const nbi_op_info *const nbi_registry[] = {
#define NBI_OP(NAME, name, family) [NBI_OP_##NAME] = &nbi_opinfo_##name,
#include "ops.def"
#undef NBI_OP
};

_Static_assert(sizeof nbi_registry / sizeof nbi_registry[0] == NBI_OP_COUNT,
               "every op in ops.def has a registry entry");

static const char *const nbi_op_names[] = {
#define NBI_OP(NAME, name, family) [NBI_OP_##NAME] = #name,
#include "ops.def"
#undef NBI_OP
};

const nbi_op_info *nbi_op_get(nbi_op op) {
    if ((int)op < 0 || op >= NBI_OP_COUNT) {
        return NULL;
    }
    return nbi_registry[op];
}

const char *nbi_op_name(nbi_op op) {
    if ((int)op < 0 || op >= NBI_OP_COUNT) {
        return "?";
    }
    return nbi_op_names[op];
}

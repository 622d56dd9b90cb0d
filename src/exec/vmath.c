/* vmath.c -- choose the vector-math table for this CPU (see vmath.h). */
#include "exec/vmath.h"

const nbi_vmath *nbi_vmath_get(void) {
    /* __builtin_cpu_supports reads what libgcc recorded at start-up: no state of ours. */
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        return &nbi_vmath_avx2;
    }
    return &nbi_vmath_sse2;
}

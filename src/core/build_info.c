/*
 * build_info.c -- what nabla was built with and what it runs on: the BLIS kernel set
 * chosen for this CPU and a self-check of SLEEF's runtime-dispatched vector functions.
 */
#include "internal.h"

#include <emmintrin.h>
#include <math.h>

#include <blis.h>
#include <sleef.h>

/* exp through SLEEF's 2-wide dispatcher against libm: both within 1 ulp of e^x. */
static bool nbi_sleef_selfcheck(void) {
    double in[2] = {1.0, -0.5}, out[2];
    _mm_storeu_pd(out, Sleef_expd2_u10(_mm_loadu_pd(in)));
    for (int i = 0; i < 2; i++) {
        double ref = exp(in[i]);
        if (fabs(out[i] - ref) > 2.0 * fabs(nextafter(ref, INFINITY) - ref)) {
            return false;
        }
    }
    return true;
}

nb_status nb_build_info(char *buf, size_t cap, size_t *needed) {
    if (needed != NULL) {
        *needed = 0;
    }
    if (buf == NULL && cap > 0) {
        return NB_ERR_MISUSE;
    }
    nbi_sbuf s = nbi_sbuf_make(buf, cap);
    /* the BLIS build's threading: nabla calls BLIS on one thread either way, but an OpenMP
     * or pthreads build pays for a parallel region per call (cmake/FindBLIS.cmake) */
    const char *thr = bli_info_get_enable_openmp()     ? "OpenMP"
                      : bli_info_get_enable_pthreads() ? "pthreads"
                                                       : "single-threaded";
    nbi_sbuf_printf(&s, "nabla %s; BLIS %s (kernels: %s, %s); SLEEF %d.%d.%d (self-check: %s)",
                    NB_VERSION_STRING, bli_info_get_version_str(),
                    bli_arch_string(bli_arch_query_id()), thr, SLEEF_VERSION_MAJOR,
                    SLEEF_VERSION_MINOR, SLEEF_VERSION_PATCHLEVEL,
                    nbi_sleef_selfcheck() ? "ok" : "FAILED");
    return nbi_sbuf_finish(&s, needed);
}

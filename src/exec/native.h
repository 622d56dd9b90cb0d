/*
 * src/exec/native.h -- the native tier: an executable's code generated as C, compiled by
 * the system C compiler into a shared object, cached on disk, loaded with dlopen. Not API.
 *
 *   codegen.c       nbi_exec -> C source (one self-contained translation unit, no #include)
 *   native_cache.c  C source -> a loaded shared object: the compiler as a subprocess, the
 *                   disk cache (keyed by a hash of the source, the compiler and its flags,
 *                   nabla's version and the CPU), its safety rules and its size bound
 *   native.c        tiers: when an executable is compiled natively (at once, or on a
 *                   background thread when it is hot), swapping it in, the check mode
 */
#ifndef NABLA_SRC_EXEC_NATIVE_H
#define NABLA_SRC_EXEC_NATIVE_H

#include "core/internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the cache (native_cache.c) ------------------------------------------------------- */

/* A loaded shared object. */
typedef struct nbi_native_lib nbi_native_lib;

typedef struct nbi_native_load_info {
    bool cache_hit;    /* nothing was compiled: a disk cache hit, or the key was loaded */
    double compile_ms; /* wall time of the compiler (0 on a hit) */
    double load_ms;    /* wall time of everything else (hashing, checks, dlopen) */
    char key[65];      /* the cache key, hex (set once the configuration is read) */
    bool stored;       /* the library is an entry of the disk cache (a hit or an insert) */
    bool repaired;     /* a corrupt entry of this key was found, removed and rebuilt */
    int evicted;       /* entries removed to keep the cache within its size bound */
    char note[256];    /* one line on anything unusual, e.g. why the library was not
                          cached ("not cached: cannot write to the cache directory ...")
                          or that a corrupt entry was rebuilt; "" when there is none */
} nbi_native_load_info;

/* Compile the C source src (len bytes, self-contained) to a shared object and load it,
 * through the disk cache. Returns NULL when that cannot be done, with the reason in why
 * (one line, e.g. "no C compiler: set NABLA_CC or install gcc", "/usr/bin/cc exited with
 * status 1: src.c:3:9: error: ...", "the cache directory /x is writable by other users
 * (mode 0777): ..."); the caller then keeps the interpreter. On success why is "". info
 * may be NULL; it is filled on failure too (as far as the load got).
 *
 * The key is SHA-256 over the source and: the compiler's resolved path and the first line
 * of its --version, the fixed flags, nabla's version, the CPU (the vendor, "model name"
 * and "flags" lines of /proc/cpuinfo). The entry is <cache dir>/<key>.so: the compiler's
 * output plus a trailer (NBI_NATIVE_TRAILER_SIZE bytes: the SHA-256 of the ELF part, the
 * raw key, the ELF part's length as 8 bytes little-endian, NBI_NATIVE_TRAILER_MAGIC).
 * The source is compiled with one line appended, the definition of the string
 * NBI_NATIVE_KEY_SYMBOL (the hex key), checked after dlopen: src must not define it.
 *
 * What happens when:
 * - a hit: the entry is opened O_NOFOLLOW, must be a regular file owned by this user and
 *   writable by no one else (else refused: NULL), its trailer and hash must match (else it
 *   is unlinked and rebuilt, info->repaired); it is loaded as /proc/self/fd/N, so exactly
 *   the verified inode is mapped; its mtime is touched (least recently used goes first).
 *   A symbolic link in an entry's place is unlinked and rebuilt, never followed.
 * - the cache directory is not owned by this user, or is writable by group or others
 *   (also through a symlink to it): NULL, never a compile.
 * - the cache directory (or a missing component) cannot be created or written for want
 *   of permission or a writable file system (EACCES, EPERM, EROFS), or no directory is
 *   configured (neither XDG_CACHE_HOME nor HOME): compiled and loaded from a private
 *   directory under $TMPDIR that is removed at once, like NABLA_NATIVE_CACHE=off;
 *   info->stored is false and info->note says why. A read-only cache still serves hits.
 * - any other failure of the cache (disk full, a failed rename, a read error, out of
 *   memory): NULL with the reason.
 * - the compiler fails (a non-zero status, a signal, the timeout, no output): NULL with a
 *   reason naming the compiler and what happened, quoting its first error line.
 * A library of a key already loaded in this process is shared (refcounted), not loaded
 * twice. Thread-safe (a compile thread and callers at once; compiles run in parallel);
 * several processes may fill one cache at once. Allocates with malloc. Needs /proc. */
NBI_HIDDEN nbi_native_lib *nbi_native_load(const char *src, size_t len, char *why, size_t why_cap,
                                           nbi_native_load_info *info);
/* The same, but only from the disk cache (or already loaded): NULL, compiling nothing,
 * when the source has no entry ("not in the cache") -- AUTO's first call with a warm
 * cache. */
NBI_HIDDEN nbi_native_lib *nbi_native_load_cached(const char *src, size_t len, char *why,
                                                  size_t why_cap, nbi_native_load_info *info);
/* The address of a symbol of the library, or NULL (also for a NULL lib or name). */
NBI_HIDDEN void *nbi_native_sym(nbi_native_lib *lib, const char *name);
/* Drop one load: the last one dlcloses and frees (NULL is a no-op). Every symbol address
 * of the library is invalid after its last unload. */
NBI_HIDDEN void nbi_native_unload(nbi_native_lib *lib);

/* The name of the string symbol appended to every compiled source. */
#define NBI_NATIVE_KEY_SYMBOL "nbx_native_key"
/* The trailer after the ELF part of a cache entry. */
#define NBI_NATIVE_TRAILER_SIZE 80
#define NBI_NATIVE_TRAILER_MAGIC "NBNATIV1" /* its last 8 bytes */

/* SHA-256 (FIPS 180-4) of len bytes of data. */
NBI_HIDDEN void nbi_native_sha256(const void *data, size_t len, uint8_t out[32]);

/* ---- configuration (environment, read once per process; tests may reset) --------------- */
/* NABLA_CC: the compiler, one program (a path, or a name looked up in PATH; default: cc,
 *   then gcc, then clang). Flags are fixed: -O2 -fPIC -shared -ffp-contract=off
 *   -fno-math-errno -fno-strict-aliasing -march=native -fno-tree-slp-vectorize -w (no
 *   fast-math: the same bits as the interpreter; -march=native is safe for values since
 *   nothing is contracted or reassociated -- the basic-block vectoriser off, as gcc 12's
 *   made a fused multiply-add of a b - c beside d e + f regardless (native_cache.c) -- and
 *   the key holds the CPU). It runs without a shell, stdin /dev/null, in
 *   its own process group, with TMPDIR set to its private work directory. A compiler whose
 *   --version fails is not used (the reason is kept until a reset).
 * NABLA_NATIVE_CACHE: the cache directory (a relative path is taken from the working
 *   directory at the first load), or "off" (compile into a private directory under
 *   $TMPDIR, removed after loading). Default $XDG_CACHE_HOME/nabla/native, else
 *   $HOME/.cache/nabla/native. Missing components are created 0700.
 * NABLA_NATIVE_CACHE_MAX: the size bound in bytes (default 256 MiB): after an insert, the
 *   least recently used entries go until the rest fits (never the one just inserted);
 *   work directories left for more than an hour (by a killed process) go too.
 * NABLA_NATIVE_TIMEOUT: seconds a compile may take before its process group is killed
 *   (default 60).
 * A malformed value makes every load fail, with a reason naming the variable. */
NBI_HIDDEN void nbi_native_config_reset(void); /* re-read the environment (tests) */

/* Fault injection for tests (0: none): make the next cache operation fail at the given
 * point as if the system had failed there (one-shot, process-wide). */
enum {
    NBI_NATIVE_FAULT_NONE = 0,
    NBI_NATIVE_FAULT_WRITE_SOURCE,   /* writing the .c file: ENOSPC -> NULL */
    NBI_NATIVE_FAULT_WRITE_ENTRY,    /* writing the cache entry: ENOSPC -> NULL */
    NBI_NATIVE_FAULT_RENAME,         /* the atomic rename: EROFS -> NULL */
    NBI_NATIVE_FAULT_DLOPEN,         /* dlopen fails -> NULL (the entry stays) */
    NBI_NATIVE_FAULT_SPAWN,          /* starting the compiler: EAGAIN -> NULL */
    NBI_NATIVE_FAULT_CACHE_READONLY, /* the work directory in the cache directory: EROFS ->
                                        compiled privately, not cached */
};
NBI_HIDDEN void nbi_native_inject_fault(int where);
/* Make the nth allocation of this module from now fail (one-shot; 0 disarms). Returns the
 * countdown that was armed before (0 when it fired or none was armed). */
NBI_HIDDEN int nbi_native_inject_alloc_fault(int nth);

#endif /* NABLA_SRC_EXEC_NATIVE_H */

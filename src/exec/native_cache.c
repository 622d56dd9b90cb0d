/*
 * src/exec/native_cache.c -- C source -> a loaded shared object, through a disk cache.
 *
 * The key of a source is SHA-256 over the source bytes and a per-process "salt": the
 * compiler's identity (its resolved path and the first line of `<cc> --version`, which is
 * remembered in the cache: see ncache_memo_name), the fixed flags, nabla's version and the
 * CPU (-march=native depends on it). An entry is the file
 * <cache dir>/<hex key>.so: the compiler's ELF output followed by a trailer (the key, the
 * length of the ELF part and its SHA-256, a magic); the dynamic loader maps the ELF by its
 * program headers and never reads past them, so the trailer does not disturb dlopen.
 *
 * Safety. The cache directory must be owned by this user and writable by nobody else (a
 * symlink to such a directory is fine); an entry must be a regular file owned by this user
 * and writable by nobody else. An entry is opened once, O_NOFOLLOW, checked through that
 * descriptor (fstat, the trailer's hash) and loaded as /proc/self/fd/N, so the inode that
 * was checked is the inode that is mapped. A corrupt or truncated entry is unlinked and
 * rebuilt; a symbolic link where an entry should be is unlinked and rebuilt; anything else
 * wrong is refused (the caller keeps the interpreter).
 *
 * Inserting. The compiler runs in a private work directory tmp-XXXXXX inside the cache
 * directory (its TMPDIR too, so a killed compile leaves nothing elsewhere); its output is
 * made 0600, the trailer appended, and rename() puts it in place atomically: processes
 * that fill one cache at once each rename a whole file, and the last one wins. No fsync: an
 * entry torn by a crash fails its trailer check and is rebuilt. After an insert, the least
 * recently used entries (a hit touches the mtime) go until the total fits the size bound,
 * and work directories older than an hour (left by a killed process) are removed.
 *
 * The compiler runs under posix_spawn (no shell): stdin /dev/null, stdout and stderr into a
 * pipe (the first error line goes into the reason of a failure), in its own process group,
 * which is killed and reaped after the timeout.
 *
 * Process-wide state, each behind its own mutex: the configuration (the environment, the
 * compiler's identity: read once, nbi_native_config_reset re-reads), and the table of
 * loaded libraries. The table makes one dlopen per key: a second load of a key that is
 * loaded shares it (refcounted). A library keeps its descriptor open while it is loaded, so
 * the name /proc/self/fd/N -- which the dynamic loader also matches loaded objects by --
 * cannot be reused for another object while this one is loaded; the library's key symbol
 * (nbx_native_key, appended to the source) is checked after dlopen all the same.
 *
 * Linux and glibc: /proc/self/fd, /proc/cpuinfo. This module runs outside any context:
 * malloc/free (every allocation checked; failure is "out of memory"), nothing logged.
 */
#include "exec/native.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define NCACHE_ERR_CAP 512
#define NCACHE_OUT_CAP 4096 /* bytes of compiler output kept */
#define NCACHE_DEFAULT_MAX ((uint64_t)256 << 20)
#define NCACHE_DEFAULT_TIMEOUT 60.0
#define NCACHE_STALE_SECONDS 3600 /* work directories older than this are leftovers */
#define NCACHE_PATH_ROOM 64       /* the cache dir's path leaves room for this much */

/* The fixed flags (part of the key). -w: the source is generated, its warnings are noise.
 * -fno-strict-aliasing: the generated code moves elements as same-sized unsigned integers
 * (concatenations, dynamic slices) and computes on them as floats in the same function.
 * -fno-tree-slp-vectorize: gcc 12's basic-block vectoriser pairs one value's b c - a with
 * another's b e + d into a single vfmaddsub despite -ffp-contract=off (and despite -mno-fma
 * where AVX-512 is there): one rounding where the interpreter rounds twice, the last bit
 * differed (tests/exec/test_native.c, test_native_no_fma). The pattern is gcc's SLP
 * addsub, which the loop vectoriser also runs on groups of neighbouring stores of one
 * iteration; the generated loops store one element of each array per iteration, so they
 * never make such a group. */
static const char *const ncache_flags[] = {
    "-O2",
    "-fPIC",
    "-shared",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fno-strict-aliasing",
    "-march=native",
    "-fno-tree-slp-vectorize",
    "-w",
};
#define NCACHE_N_FLAGS ((int)(sizeof ncache_flags / sizeof ncache_flags[0]))

/* ---- SHA-256 (FIPS 180-4) --------------------------------------------------------------- */

typedef struct ncache_sha {
    uint32_t h[8];
    uint64_t total; /* bytes hashed */
    uint8_t block[64];
    size_t fill;
} ncache_sha;

/* Section 4.2.2: the first 32 bits of the fractional parts of the cube roots of the first
 * 64 primes. */
static const uint32_t ncache_sha_k[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u,
    0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu,
    0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu,
    0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u,
    0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu,
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu,
    0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u,
    0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u,
    0xc67178f2u,
};

static uint32_t ncache_rotr(uint32_t x, unsigned n) {
    return (x >> n) | (x << (32u - n));
}

/* Section 6.2.2: one 512-bit block into the state. */
static void ncache_sha_compress(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int t = 0; t < 16; t++) {
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 |
               (uint32_t)p[4 * t + 2] << 8 | (uint32_t)p[4 * t + 3];
    }
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = ncache_rotr(w[t - 15], 7) ^ ncache_rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = ncache_rotr(w[t - 2], 17) ^ ncache_rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t sum1 = ncache_rotr(e, 6) ^ ncache_rotr(e, 11) ^ ncache_rotr(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = hh + sum1 + ch + ncache_sha_k[t] + w[t];
        uint32_t sum0 = ncache_rotr(a, 2) ^ ncache_rotr(a, 13) ^ ncache_rotr(a, 22);
        uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = sum0 + maj;
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
}

static void ncache_sha_init(ncache_sha *s) {
    /* Section 5.3.3: the first 32 bits of the fractional parts of the square roots of the
     * first 8 primes. */
    static const uint32_t h0[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                   0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    memcpy(s->h, h0, sizeof h0);
    s->total = 0;
    s->fill = 0;
}

static void ncache_sha_update(ncache_sha *s, const void *data, size_t len) {
    const uint8_t *p = data;
    s->total += len;
    if (s->fill > 0) {
        size_t take = 64 - s->fill < len ? 64 - s->fill : len;
        memcpy(s->block + s->fill, p, take);
        s->fill += take;
        p += take;
        len -= take;
        if (s->fill < 64) {
            return;
        }
        ncache_sha_compress(s->h, s->block);
        s->fill = 0;
    }
    for (; len >= 64; p += 64, len -= 64) {
        ncache_sha_compress(s->h, p);
    }
    memcpy(s->block, p, len);
    s->fill = len;
}

/* Section 5.1.1: a 1 bit, zeros up to 56 mod 64 bytes, the length in bits (big-endian). */
static void ncache_sha_final(ncache_sha *s, uint8_t out[32]) {
    uint64_t bits = s->total * 8;
    s->block[s->fill++] = 0x80;
    if (s->fill > 56) {
        memset(s->block + s->fill, 0, 64 - s->fill);
        ncache_sha_compress(s->h, s->block);
        s->fill = 0;
    }
    memset(s->block + s->fill, 0, 56 - s->fill);
    for (int i = 0; i < 8; i++) {
        s->block[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    }
    ncache_sha_compress(s->h, s->block);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
}

void nbi_native_sha256(const void *data, size_t len, uint8_t out[32]) {
    ncache_sha s;
    ncache_sha_init(&s);
    ncache_sha_update(&s, data, len);
    ncache_sha_final(&s, out);
}

/* A field of the key: its length (8 bytes, little-endian), then its bytes. Length prefixes
 * keep ("ab", "c") and ("a", "bc") apart. */
static void ncache_sha_field(ncache_sha *s, const void *data, size_t len) {
    uint8_t n[8];
    for (int i = 0; i < 8; i++) {
        n[i] = (uint8_t)((uint64_t)len >> (8 * i));
    }
    ncache_sha_update(s, n, sizeof n);
    ncache_sha_update(s, data, len);
}

static void ncache_hex(const uint8_t *raw, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[raw[i] >> 4];
        out[2 * i + 1] = digits[raw[i] & 15];
    }
    out[2 * n] = '\0';
}

/* ---- fault injection -------------------------------------------------------------------- */

static _Atomic int ncache_fault;           /* NBI_NATIVE_FAULT_* armed, or NONE */
static _Atomic int ncache_alloc_countdown; /* > 0: the countdown-th allocation fails */

void nbi_native_inject_fault(int where) {
    atomic_store(&ncache_fault, where);
}

int nbi_native_inject_alloc_fault(int nth) {
    return atomic_exchange(&ncache_alloc_countdown, nth > 0 ? nth : 0);
}

/* True (once) when the fault at where is armed: the caller fails as the system would. */
static bool ncache_fault_take(int where) {
    int expected = where;
    return atomic_compare_exchange_strong(&ncache_fault, &expected, NBI_NATIVE_FAULT_NONE);
}

/* The spawn fault is armed: the configuration runs --version (not its memo) to meet it. */
static bool ncache_ccfault_memo(void) {
    return atomic_load(&ncache_fault) == NBI_NATIVE_FAULT_SPAWN;
}

static void *ncache_malloc(size_t size) {
    int c = atomic_load(&ncache_alloc_countdown);
    while (c > 0) {
        if (atomic_compare_exchange_weak(&ncache_alloc_countdown, &c, c - 1)) {
            if (c == 1) {
                return NULL;
            }
            break;
        }
    }
    return malloc(size);
}

static void *ncache_realloc(void *p, size_t size) {
    int c = atomic_load(&ncache_alloc_countdown);
    while (c > 0) {
        if (atomic_compare_exchange_weak(&ncache_alloc_countdown, &c, c - 1)) {
            if (c == 1) {
                return NULL;
            }
            break;
        }
    }
    return realloc(p, size);
}

/* ---- small helpers ---------------------------------------------------------------------- */

static double ncache_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void ncache_sleep_ms(double ms) {
    if (ms <= 0) {
        return;
    }
    struct timespec ts = {(time_t)(ms / 1e3), (long)(fmod(ms, 1e3) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The message of errno value e (thread-safe). */
static const char *ncache_strerror(int e, char *buf, size_t cap) {
    if (strerror_r(e, buf, cap) != 0) {
        snprintf(buf, cap, "error %d", e);
    }
    return buf;
}

/* snprintf that reports whether the text fit. */
static bool ncache_fmt(char *buf, size_t cap, const char *fmt, ...) NBI_PRINTF(3, 4);
static bool ncache_fmt(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < cap;
}

static bool ncache_write_all(int fd, const void *data, size_t len) {
    const char *p = data;
    while (len > 0) {
        ssize_t k = write(fd, p, len);
        if (k < 0) {
            if (errno == EINTR) {
                continue;
            }
            return false;
        }
        p += k;
        len -= (size_t)k;
    }
    return true;
}

static bool ncache_pwrite_all(int fd, const void *data, size_t len, off_t off) {
    const char *p = data;
    while (len > 0) {
        ssize_t k = pwrite(fd, p, len, off);
        if (k < 0) {
            if (errno == EINTR) {
                continue;
            }
            return false;
        }
        p += k;
        len -= (size_t)k;
        off += k;
    }
    return true;
}

/* Read exactly len bytes at off: 1, 0 when the file ends first, -1 on an error (errno). */
static int ncache_pread_all(int fd, void *data, size_t len, off_t off) {
    char *p = data;
    while (len > 0) {
        ssize_t k = pread(fd, p, len, off);
        if (k < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        if (k == 0) {
            return 0;
        }
        p += k;
        len -= (size_t)k;
        off += k;
    }
    return 1;
}

/* SHA-256 of the first len bytes of fd: 1, 0 when the file is shorter, -1 (errno). */
static int ncache_hash_fd(int fd, uint64_t len, uint8_t out[32]) {
    uint8_t buf[16384];
    ncache_sha s;
    ncache_sha_init(&s);
    for (uint64_t off = 0; off < len;) {
        size_t n = len - off < sizeof buf ? (size_t)(len - off) : sizeof buf;
        int r = ncache_pread_all(fd, buf, n, (off_t)off);
        if (r <= 0) {
            return r;
        }
        ncache_sha_update(&s, buf, n);
        off += n;
    }
    ncache_sha_final(&s, out);
    return 1;
}

/* ---- the configuration ------------------------------------------------------------------ */

enum { NCACHE_DIR_CACHE, NCACHE_DIR_OFF, NCACHE_DIR_NONE };

typedef struct ncache_config {
    int dir_mode;
    char dir[PATH_MAX];       /* NCACHE_DIR_CACHE: the cache directory, absolute */
    char dir_note[256];       /* NCACHE_DIR_NONE: why there is none */
    char tmp[PATH_MAX];       /* where private work directories go: $TMPDIR or /tmp */
    uint64_t max_bytes;       /* NABLA_NATIVE_CACHE_MAX */
    double timeout_s;         /* NABLA_NATIVE_TIMEOUT */
    char cc[PATH_MAX];        /* the compiler to run */
    uint8_t salt[32];         /* SHA-256 of everything but the source that goes into a key */
    char err[NCACHE_ERR_CAP]; /* non-empty: native code cannot be made, and why */
    bool transient;           /* err may go away (out of memory, could not spawn): read again */
} ncache_config;

static pthread_mutex_t ncache_config_lock = PTHREAD_MUTEX_INITIALIZER;
static ncache_config ncache_config_state; /* behind ncache_config_lock */
static bool ncache_config_loaded;         /* behind ncache_config_lock */

/* Serialises making the output pipe and spawning, so that no compiler started by another
 * of our threads inherits the write end of this one's pipe before it is close-on-exec. */
static pthread_mutex_t ncache_spawn_lock = PTHREAD_MUTEX_INITIALIZER;

/* How a run of a program ended. */
typedef struct ncache_run {
    int status;               /* waitpid status (when !timed_out) */
    bool timed_out;           /* killed after the timeout */
    char out[NCACHE_OUT_CAP]; /* the first bytes of its stdout + stderr, NUL-terminated */
    size_t out_len;
    double ms; /* wall time */
} ncache_run;

static const char *ncache_signame(int sig) {
    static const struct {
        int sig;
        const char *name;
    } names[] = {
        {SIGSEGV, "SIGSEGV"}, {SIGBUS, "SIGBUS"},   {SIGILL, "SIGILL"},   {SIGFPE, "SIGFPE"},
        {SIGABRT, "SIGABRT"}, {SIGKILL, "SIGKILL"}, {SIGTERM, "SIGTERM"}, {SIGINT, "SIGINT"},
        {SIGHUP, "SIGHUP"},   {SIGPIPE, "SIGPIPE"}, {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (names[i].sig == sig) {
            return names[i].name;
        }
    }
    return "?";
}

/* Keep what fits of the bytes available on fd (non-blocking); true at end of file. */
static bool ncache_drain(int fd, ncache_run *r) {
    for (;;) {
        char buf[4096];
        ssize_t k = read(fd, buf, sizeof buf);
        if (k < 0) {
            return errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK;
        }
        if (k == 0) {
            return true;
        }
        size_t room = sizeof r->out - 1 - r->out_len;
        size_t take = (size_t)k < room ? (size_t)k : room;
        memcpy(r->out + r->out_len, buf, take);
        r->out_len += take;
        r->out[r->out_len] = '\0';
    }
}

/* Run prog with argv and envp: stdin /dev/null, stdout and stderr into r->out, in its own
 * process group, killed (the whole group) after timeout_s. False when it could not be
 * started or waited for, with the reason in err. */
static bool ncache_spawn(const char *prog, const char *what, char *const argv[], char *const envp[],
                         double timeout_s, ncache_run *r, char *err, size_t err_cap) {
    char eb[128];
    memset(r, 0, sizeof *r);
    double t0 = ncache_now_ms();

    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    int rc = posix_spawn_file_actions_init(&fa);
    if (rc != 0) {
        snprintf(err, err_cap, "cannot run %s: %s", what, ncache_strerror(rc, eb, sizeof eb));
        return false;
    }
    rc = posix_spawnattr_init(&at);
    if (rc != 0) {
        posix_spawn_file_actions_destroy(&fa);
        snprintf(err, err_cap, "cannot run %s: %s", what, ncache_strerror(rc, eb, sizeof eb));
        return false;
    }
    sigset_t none, dflt;
    sigemptyset(&none);
    sigemptyset(&dflt);
    const int dflt_sigs[] = {SIGPIPE, SIGINT, SIGQUIT, SIGHUP, SIGTERM, SIGCHLD, SIGXFSZ};
    for (size_t i = 0; i < sizeof dflt_sigs / sizeof dflt_sigs[0]; i++) {
        sigaddset(&dflt, dflt_sigs[i]);
    }

    int fds[2] = {-1, -1};
    pid_t pid = -1;
    pthread_mutex_lock(&ncache_spawn_lock);
    if (pipe(fds) != 0) {
        rc = errno;
    } else if (fcntl(fds[0], F_SETFD, FD_CLOEXEC) != 0 || fcntl(fds[1], F_SETFD, FD_CLOEXEC) != 0 ||
               fcntl(fds[0], F_SETFL, O_NONBLOCK) != 0) {
        rc = errno;
    } else if ((rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0)) != 0 ||
               (rc = posix_spawn_file_actions_adddup2(&fa, fds[1], 1)) != 0 ||
               (rc = posix_spawn_file_actions_adddup2(&fa, fds[1], 2)) != 0 ||
               (rc = posix_spawnattr_setsigmask(&at, &none)) != 0 ||
               (rc = posix_spawnattr_setsigdefault(&at, &dflt)) != 0 ||
               (rc = posix_spawnattr_setpgroup(&at, 0)) != 0 ||
               (rc = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                                       POSIX_SPAWN_SETSIGDEF)) != 0) {
        /* rc says what */
    } else if (ncache_fault_take(NBI_NATIVE_FAULT_SPAWN)) {
        rc = EAGAIN;
    } else {
        rc = posix_spawn(&pid, prog, &fa, &at, argv, envp);
    }
    if (fds[1] >= 0) {
        close(fds[1]);
    }
    pthread_mutex_unlock(&ncache_spawn_lock);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (rc != 0) {
        if (fds[0] >= 0) {
            close(fds[0]);
        }
        snprintf(err, err_cap, "cannot run %s: %s", what, ncache_strerror(rc, eb, sizeof eb));
        return false;
    }

    /* Wait: poll the pipe (which also wakes at the child's exit, when nothing else holds
     * the write end), then waitpid; after the end of the output, sleeps of 1..8 ms. */
    double deadline = t0 + timeout_s * 1e3;
    bool eof = false, ok = true;
    double nap = 1.0;
    for (;;) {
        pid_t w = waitpid(pid, &r->status, WNOHANG);
        if (w == pid) {
            break;
        }
        if (w < 0 && errno != EINTR) {
            /* ECHILD: someone else reaped it (SIGCHLD ignored, or a waitpid(-1) elsewhere) */
            int e = errno;
            kill(-pid, SIGKILL);
            snprintf(err, err_cap, "lost track of %s: waitpid: %s (is SIGCHLD ignored?)", what,
                     ncache_strerror(e, eb, sizeof eb));
            ok = false;
            break;
        }
        double left = deadline - ncache_now_ms();
        if (left <= 0) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            while (waitpid(pid, &r->status, 0) < 0 && errno == EINTR) {
            }
            r->timed_out = true;
            break;
        }
        if (!eof) {
            struct pollfd p = {.fd = fds[0], .events = POLLIN};
            int wait_ms = left < 50 ? (int)left + 1 : 50;
            if (poll(&p, 1, wait_ms) > 0) {
                eof = ncache_drain(fds[0], r);
            }
        } else {
            ncache_sleep_ms(nap < left ? nap : left);
            nap = nap * 2 < 8 ? nap * 2 : 8;
        }
    }
    if (!r->timed_out) {
        ncache_drain(fds[0], r);
    }
    close(fds[0]);
    r->ms = ncache_now_ms() - t0;
    return ok;
}

/* The line of the output to quote in a reason: the first that says "error", else the
 * first non-empty one, without the work directory's path; "" when there is none. */
static void ncache_pick_line(const char *out, const char *strip, char *line, size_t cap) {
    const char *best = NULL, *first = NULL;
    for (const char *p = out; *p != '\0';) {
        const char *end = strchr(p, '\n');
        size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
        bool blank = true;
        for (size_t i = 0; i < n; i++) {
            if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r') {
                blank = false;
            }
        }
        if (!blank) {
            if (first == NULL) {
                first = p;
            }
            for (size_t i = 0; i + 5 <= n; i++) {
                if (memcmp(p + i, "error", 5) == 0) {
                    best = p;
                    break;
                }
            }
            if (best != NULL) {
                break;
            }
        }
        p += n;
        if (*p == '\n') {
            p++;
        }
    }
    const char *p = best != NULL ? best : first;
    line[0] = '\0';
    if (p == NULL || cap == 0) {
        return;
    }
    size_t sl = strip != NULL ? strlen(strip) : 0;
    if (sl > 0 && strncmp(p, strip, sl) == 0 && p[sl] == '/') {
        p += sl + 1;
    }
    size_t n = strcspn(p, "\n");
    while (n > 0 && (p[n - 1] == '\r' || p[n - 1] == ' ')) {
        n--;
    }
    if (n >= cap) {
        n = cap - 1;
    }
    memcpy(line, p, n);
    line[n] = '\0';
}

/* Describe how a run that was started ended, into err; true for exit status 0. */
static bool ncache_run_ok(const ncache_run *r, const char *what, const char *strip,
                          double timeout_s, char *err, size_t err_cap) {
    char line[300];
    ncache_pick_line(r->out, strip, line, sizeof line);
    if (r->timed_out) {
        snprintf(err, err_cap,
                 "%s did not finish within %g s and was killed (NABLA_NATIVE_TIMEOUT)", what,
                 timeout_s);
        return false;
    }
    if (WIFSIGNALED(r->status)) {
        int sig = WTERMSIG(r->status);
        snprintf(err, err_cap, "%s was killed by signal %d (%s)%s%s", what, sig,
                 ncache_signame(sig), line[0] != '\0' ? ": " : "", line);
        return false;
    }
    if (!WIFEXITED(r->status) || WEXITSTATUS(r->status) != 0) {
        snprintf(err, err_cap, "%s exited with status %d%s%s", what,
                 WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1,
                 line[0] != '\0' ? ": " : " (it printed nothing)", line);
        return false;
    }
    return true;
}

/* Is path an executable regular file? */
static bool ncache_is_exe(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* Look name up in PATH into out; false when it is not there. */
static bool ncache_which(const char *name, char *out, size_t cap) {
    const char *path = getenv("PATH");
    if (path == NULL || path[0] == '\0') {
        path = "/usr/local/bin:/usr/bin:/bin";
    }
    for (const char *p = path;;) {
        size_t n = strcspn(p, ":");
        if (n > 0 && ncache_fmt(out, cap, "%.*s/%s", (int)n, p, name) && ncache_is_exe(out)) {
            return true;
        }
        if (p[n] == '\0') {
            return false;
        }
        p += n + 1;
    }
}

/* Find the compiler (NABLA_CC, else cc, gcc, clang in PATH) into c->cc. */
static bool ncache_find_cc(ncache_config *c) {
    char eb[128];
    const char *env = getenv("NABLA_CC");
    if (env != NULL && env[0] != '\0') {
        if (strchr(env, '/') != NULL) {
            if (!ncache_fmt(c->cc, sizeof c->cc, "%s", env)) {
                snprintf(c->err, sizeof c->err, "NABLA_CC=%.200s...: the path is too long", env);
                return false;
            }
            struct stat st;
            if (stat(env, &st) != 0) {
                snprintf(c->err, sizeof c->err, "NABLA_CC=%.300s: %s", env,
                         ncache_strerror(errno, eb, sizeof eb));
                return false;
            }
            if (!ncache_is_exe(env)) {
                snprintf(c->err, sizeof c->err, "NABLA_CC=%.300s: not an executable file", env);
                return false;
            }
            return true;
        }
        if (!ncache_which(env, c->cc, sizeof c->cc)) {
            snprintf(c->err, sizeof c->err, "NABLA_CC=%.300s: no such program in PATH", env);
            return false;
        }
        return true;
    }
    const char *names[] = {"cc", "gcc", "clang"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (ncache_which(names[i], c->cc, sizeof c->cc)) {
            return true;
        }
    }
    snprintf(c->err, sizeof c->err, "no C compiler: set NABLA_CC or install gcc");
    return false;
}

/* The lines of /proc/cpuinfo that -march=native depends on (of the first processor), into
 * the hash. An unreadable file adds nothing (the key still holds the compiler). */
static bool ncache_hash_cpu(ncache_sha *s) {
    static const char *const keys[] = {"vendor_id",
                                       "model name",
                                       "flags",
                                       /* aarch64 */ "Features",
                                       "CPU implementer",
                                       "CPU part"};
    int fd = open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return true;
    }
    size_t cap = 65536, len = 0;
    char *buf = ncache_malloc(cap);
    if (buf == NULL) {
        close(fd);
        return false;
    }
    while (len < cap - 1) {
        ssize_t k = read(fd, buf + len, cap - 1 - len);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            break;
        }
        len += (size_t)k;
        buf[len] = '\0';
        if (strstr(buf, "\n\n") != NULL) {
            break; /* the first processor's block is complete */
        }
    }
    close(fd);
    buf[len] = '\0';
    char *block_end = strstr(buf, "\n\n");
    if (block_end != NULL) {
        block_end[1] = '\0';
    }
    for (char *p = buf; *p != '\0';) {
        size_t n = strcspn(p, "\n");
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
            size_t kl = strlen(keys[i]);
            if (n > kl && strncmp(p, keys[i], kl) == 0 &&
                (p[kl] == ' ' || p[kl] == '\t' || p[kl] == ':')) {
                ncache_sha_field(s, p, n);
            }
        }
        p += n;
        if (*p == '\n') {
            p++;
        }
    }
    free(buf);
    return true;
}

/* The path of the file path names, symlinks resolved (through /proc/self/fd: realpath is
 * not POSIX.1 base); path itself when that fails. */
static void ncache_resolve(const char *path, char *out, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    char link[64];
    ssize_t n = -1;
    if (fd >= 0) {
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        n = readlink(link, out, cap - 1);
        close(fd);
    }
    if (n > 0) {
        out[n] = '\0';
    } else {
        snprintf(out, cap, "%s", path);
    }
}

/* path made absolute (relative to the working directory) and without trailing slashes. */
static bool ncache_abs_path(const char *path, char *out, size_t cap) {
    char cwd[PATH_MAX];
    bool fit;
    if (path[0] == '/') {
        fit = ncache_fmt(out, cap, "%s", path);
    } else if (getcwd(cwd, sizeof cwd) == NULL) {
        return false;
    } else {
        fit = ncache_fmt(out, cap, "%s/%s", cwd, path);
    }
    if (!fit) {
        return false;
    }
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') {
        out[--n] = '\0';
    }
    return true;
}

/* ---- the compiler's identity, remembered ------------------------------------------------ */

/* Running `<cc> --version` costs a process start (about a millisecond), which would be on
 * the first call of every process that looks its programs up in the cache. So its first
 * line is remembered in the cache directory as cc-<32 hex>, named by a hash of the resolved
 * compiler path and its inode's identity and times (device, inode, size, mtime, ctime): a
 * reinstalled or upgraded compiler is a new name, and its --version runs again. The memo is
 * read with the checks an entry gets (the directory and the file owned by this user and
 * writable by nobody else, O_NOFOLLOW, a regular file) and written atomically (tmp- file,
 * rename). It only saves time: when it cannot be read or written, --version runs, as it
 * would without it, and nothing else changes. */

#define NCACHE_MEMO_MAGIC "nabla cc identity 1\n"

static bool ncache_memo_name(const char *real, char name[40]) {
    struct stat st;
    if (stat(real, &st) != 0) {
        return false;
    }
    int64_t f[9] = {
        (int64_t)st.st_dev,          (int64_t)st.st_ino,          (int64_t)st.st_size,
        (int64_t)st.st_mtim.tv_sec,  (int64_t)st.st_mtim.tv_nsec, (int64_t)st.st_ctim.tv_sec,
        (int64_t)st.st_ctim.tv_nsec, (int64_t)st.st_mode,         (int64_t)st.st_uid};
    ncache_sha s;
    ncache_sha_init(&s);
    ncache_sha_field(&s, NCACHE_MEMO_MAGIC, strlen(NCACHE_MEMO_MAGIC));
    ncache_sha_field(&s, real, strlen(real));
    ncache_sha_field(&s, f, sizeof f);
    uint8_t h[32];
    ncache_sha_final(&s, h);
    memcpy(name, "cc-", 3);
    ncache_hex(h, 16, name + 3);
    return true;
}

/* Make dir and its missing parents (0700): 0 or the errno of the first failure. */
static int ncache_mkdirs(const char *dir) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char keep = *s;
            *s = '\0';
            if (mkdir(p, 0700) != 0 && errno != EEXIST) {
                return errno;
            }
            *s = keep;
            if (keep == '\0') {
                return 0;
            }
        }
    }
}

/* The cache directory (made when missing, as ncache_open_dir makes it), opened when it
 * passes the entry checks; else -1. */
static int ncache_memo_dir(const ncache_config *c) {
    if (c->dir_mode != NCACHE_DIR_CACHE) {
        return -1;
    }
    int dfd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 && errno == ENOENT && ncache_mkdirs(c->dir) == 0) {
        dfd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    }
    struct stat st;
    if (dfd >= 0 && (fstat(dfd, &st) != 0 || st.st_uid != geteuid() ||
                     (st.st_mode & (S_IWGRP | S_IWOTH)) != 0)) {
        close(dfd);
        dfd = -1;
    }
    return dfd;
}

/* The remembered first line of --version into line (cap bytes), or false. */
static bool ncache_memo_read(int dfd, const char *name, char *line, size_t cap) {
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        return false;
    }
    struct stat st;
    char buf[NCACHE_ERR_CAP];
    int n = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
        (st.st_mode & (S_IWGRP | S_IWOTH)) == 0 && st.st_size < (off_t)sizeof buf) {
        n = ncache_pread_all(fd, buf, (size_t)st.st_size, 0) == 1 ? (int)st.st_size : -1;
    }
    close(fd);
    size_t ml = strlen(NCACHE_MEMO_MAGIC);
    if (n < (int)ml + 1 || memcmp(buf, NCACHE_MEMO_MAGIC, ml) != 0 || buf[n - 1] != '\n') {
        return false;
    }
    size_t len = (size_t)n - ml - 1;
    if (len >= cap || memchr(buf + ml, '\n', len) != NULL || memchr(buf + ml, '\0', len) != NULL) {
        return false;
    }
    memcpy(line, buf + ml, len);
    line[len] = '\0';
    return true;
}

/* Remember line (best effort: see above). */
static void ncache_memo_write(int dfd, const char *name, const char *line, size_t len) {
    char tmp[64];
    snprintf(tmp, sizeof tmp, "tmp-%s-%ld", name, (long)getpid());
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        return;
    }
    size_t ml = strlen(NCACHE_MEMO_MAGIC);
    bool ok = ncache_write_all(fd, NCACHE_MEMO_MAGIC, ml) && ncache_write_all(fd, line, len) &&
              ncache_write_all(fd, "\n", 1);
    ok = close(fd) == 0 && ok;
    if (!ok || renameat(dfd, tmp, dfd, name) != 0) {
        unlinkat(dfd, tmp, 0);
    }
}

static void ncache_config_read(ncache_config *c) {
    memset(c, 0, sizeof *c);
    c->max_bytes = NCACHE_DEFAULT_MAX;
    c->timeout_s = NCACHE_DEFAULT_TIMEOUT;

    const char *e = getenv("NABLA_NATIVE_TIMEOUT");
    if (e != NULL && e[0] != '\0') {
        char *end;
        errno = 0;
        double t = strtod(e, &end);
        if (errno != 0 || *end != '\0' || !(t > 0) || !(t <= 1e6)) {
            snprintf(c->err, sizeof c->err,
                     "NABLA_NATIVE_TIMEOUT=%.100s: not a number of seconds (> 0)", e);
            return;
        }
        c->timeout_s = t;
    }
    e = getenv("NABLA_NATIVE_CACHE_MAX");
    if (e != NULL && e[0] != '\0') {
        char *end;
        errno = 0;
        unsigned long long m = strtoull(e, &end, 10);
        if (errno != 0 || *end != '\0' || e[0] < '0' || e[0] > '9') {
            snprintf(c->err, sizeof c->err, "NABLA_NATIVE_CACHE_MAX=%.100s: not a number of bytes",
                     e);
            return;
        }
        c->max_bytes = m;
    }

    e = getenv("TMPDIR");
    if (e == NULL || e[0] != '/' || !ncache_abs_path(e, c->tmp, sizeof c->tmp) ||
        strlen(c->tmp) + NCACHE_PATH_ROOM >= sizeof c->tmp) {
        snprintf(c->tmp, sizeof c->tmp, "/tmp");
    }

    const char *dir = getenv("NABLA_NATIVE_CACHE");
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    bool fit = true;
    c->dir_mode = NCACHE_DIR_CACHE;
    if (dir != NULL && strcmp(dir, "off") == 0) {
        c->dir_mode = NCACHE_DIR_OFF;
    } else if (dir != NULL && dir[0] != '\0') {
        fit = ncache_abs_path(dir, c->dir, sizeof c->dir);
    } else if (xdg != NULL && xdg[0] == '/') {
        char tmp[PATH_MAX];
        fit = ncache_fmt(tmp, sizeof tmp, "%s/nabla/native", xdg) &&
              ncache_abs_path(tmp, c->dir, sizeof c->dir);
    } else if (home != NULL && home[0] == '/') {
        char tmp[PATH_MAX];
        fit = ncache_fmt(tmp, sizeof tmp, "%s/.cache/nabla/native", home) &&
              ncache_abs_path(tmp, c->dir, sizeof c->dir);
    } else {
        c->dir_mode = NCACHE_DIR_NONE;
        snprintf(c->dir_note, sizeof c->dir_note,
                 "not cached: no cache directory (neither XDG_CACHE_HOME nor HOME is set; "
                 "set NABLA_NATIVE_CACHE)");
    }
    if (!fit || strlen(c->dir) + NCACHE_PATH_ROOM >= sizeof c->dir) {
        snprintf(c->err, sizeof c->err,
                 "the native cache directory's path is too long (or the working directory "
                 "is unknown): set NABLA_NATIVE_CACHE");
        return;
    }

    if (!ncache_find_cc(c)) {
        return;
    }
    /* The compiler's identity: its resolved path and the first line of --version
     * (remembered in the cache directory, see ncache_memo_name). */
    char real[PATH_MAX];
    ncache_resolve(c->cc, real, sizeof real);
    char version[NCACHE_ERR_CAP];
    char memo[40];
    bool named = !ncache_ccfault_memo() && ncache_memo_name(real, memo);
    int dfd = named ? ncache_memo_dir(c) : -1;
    if (dfd < 0 || !ncache_memo_read(dfd, memo, version, sizeof version)) {
        char *argv[] = {c->cc, "--version", NULL};
        ncache_run *r = ncache_malloc(sizeof *r);
        if (r == NULL) {
            snprintf(c->err, sizeof c->err, "out of memory");
            c->transient = true;
            if (dfd >= 0) {
                close(dfd);
            }
            return;
        }
        char what[PATH_MAX + 16];
        snprintf(what, sizeof what, "%s --version", c->cc);
        bool ok = ncache_spawn(c->cc, what, argv, environ, c->timeout_s, r, c->err, sizeof c->err);
        if (!ok) {
            c->transient = true;
        }
        ok = ok && ncache_run_ok(r, what, NULL, c->timeout_s, c->err, sizeof c->err);
        size_t vl = ok ? strcspn(r->out, "\n") : 0;
        if (ok && vl >= sizeof version) {
            vl = sizeof version - 1;
        }
        memcpy(version, r->out, vl);
        version[vl] = '\0';
        free(r);
        if (!ok) {
            if (dfd >= 0) {
                close(dfd);
            }
            return;
        }
        if (dfd >= 0) {
            ncache_memo_write(dfd, memo, version, vl);
        }
    }
    if (dfd >= 0) {
        close(dfd);
    }

    ncache_sha s;
    ncache_sha_init(&s);
    static const char tag[] = "nabla native cache 1";
    ncache_sha_field(&s, tag, sizeof tag - 1);
    ncache_sha_field(&s, NB_VERSION_STRING, strlen(NB_VERSION_STRING));
    ncache_sha_field(&s, real, strlen(real));
    ncache_sha_field(&s, version, strlen(version));
    for (int i = 0; i < NCACHE_N_FLAGS; i++) {
        ncache_sha_field(&s, ncache_flags[i], strlen(ncache_flags[i]));
    }
    ncache_sha_field(&s, NBI_NATIVE_KEY_SYMBOL, strlen(NBI_NATIVE_KEY_SYMBOL));
    if (!ncache_hash_cpu(&s)) {
        snprintf(c->err, sizeof c->err, "out of memory");
        c->transient = true;
        return;
    }
    ncache_sha_final(&s, c->salt);
}

/* A snapshot of the configuration, read from the environment on first use. */
static void ncache_config_get(ncache_config *out) {
    pthread_mutex_lock(&ncache_config_lock);
    if (!ncache_config_loaded) {
        ncache_config_read(&ncache_config_state);
        ncache_config_loaded = !ncache_config_state.transient;
    }
    memcpy(out, &ncache_config_state, sizeof *out);
    pthread_mutex_unlock(&ncache_config_lock);
}

void nbi_native_config_reset(void) {
    pthread_mutex_lock(&ncache_config_lock);
    ncache_config_loaded = false;
    pthread_mutex_unlock(&ncache_config_lock);
}

/* ---- loaded libraries ------------------------------------------------------------------- */

struct nbi_native_lib {
    struct nbi_native_lib *next;
    void *handle;
    int fd;       /* the verified inode, open while loaded (keeps /proc/self/fd/N unique) */
    int64_t refs; /* loads not yet unloaded */
    char key[65];
};

static pthread_mutex_t ncache_libs_lock = PTHREAD_MUTEX_INITIALIZER;
static nbi_native_lib *ncache_libs; /* behind ncache_libs_lock */

/* The loaded library of key with one more reference, or NULL. Lock held. */
static nbi_native_lib *ncache_libs_find(const char *key) {
    for (nbi_native_lib *l = ncache_libs; l != NULL; l = l->next) {
        if (strcmp(l->key, key) == 0) {
            l->refs++;
            return l;
        }
    }
    return NULL;
}

void *nbi_native_sym(nbi_native_lib *lib, const char *name) {
    if (lib == NULL || name == NULL) {
        return NULL;
    }
    return dlsym(lib->handle, name);
}

void nbi_native_unload(nbi_native_lib *lib) {
    if (lib == NULL) {
        return;
    }
    /* dlclose under the lock: no other load of this key can dlopen the same inode under
     * another name while it is still mapped. */
    pthread_mutex_lock(&ncache_libs_lock);
    if (--lib->refs == 0) {
        for (nbi_native_lib **p = &ncache_libs; *p != NULL; p = &(*p)->next) {
            if (*p == lib) {
                *p = lib->next;
                break;
            }
        }
        dlclose(lib->handle);
        close(lib->fd);
        free(lib);
    }
    pthread_mutex_unlock(&ncache_libs_lock);
}

/* ---- one load --------------------------------------------------------------------------- */

typedef struct ncache_job {
    ncache_config cfg; /* snapshot */
    uint8_t key_raw[32];
    char key[65];
    char err[NCACHE_ERR_CAP]; /* the first failure */
    nbi_native_load_info info;
    bool no_compile; /* nbi_native_load_cached: a hit or nothing */
} ncache_job;

static void ncache_fail(ncache_job *job, const char *fmt, ...) NBI_PRINTF(2, 3);
static void ncache_fail(ncache_job *job, const char *fmt, ...) {
    if (job->err[0] != '\0') {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(job->err, sizeof job->err, fmt, ap);
    va_end(ap);
}

static void ncache_note(ncache_job *job, const char *fmt, ...) NBI_PRINTF(2, 3);
static void ncache_note(ncache_job *job, const char *fmt, ...) {
    if (job->info.note[0] != '\0') {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(job->info.note, sizeof job->info.note, fmt, ap);
    va_end(ap);
}

/* dlopen the verified inode behind fd (taken: kept by the library, closed on failure). */
static nbi_native_lib *ncache_dlopen(ncache_job *job, int fd) {
    pthread_mutex_lock(&ncache_libs_lock);
    nbi_native_lib *lib = ncache_libs_find(job->key);
    if (lib != NULL) {
        pthread_mutex_unlock(&ncache_libs_lock);
        close(fd);
        return lib;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    void *h = NULL;
    if (ncache_fault_take(NBI_NATIVE_FAULT_DLOPEN)) {
        ncache_fail(job, "dlopen %s: injected failure", path);
    } else if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) == NULL) {
        const char *e = dlerror();
        ncache_fail(job, "dlopen failed: %s", e != NULL ? e : "(no message)");
    } else {
        const char *k = dlsym(h, NBI_NATIVE_KEY_SYMBOL);
        if (k == NULL || memcmp(k, job->key, sizeof job->key) != 0) {
            ncache_fail(job, "dlopen %s gave another object than the one built for key %s", path,
                        job->key);
        } else if ((lib = ncache_malloc(sizeof *lib)) == NULL) {
            ncache_fail(job, "out of memory");
        } else {
            lib->handle = h;
            lib->fd = fd;
            lib->refs = 1;
            memcpy(lib->key, job->key, sizeof lib->key);
            lib->next = ncache_libs;
            ncache_libs = lib;
        }
        if (lib == NULL) {
            dlclose(h);
        }
    }
    pthread_mutex_unlock(&ncache_libs_lock);
    if (lib == NULL) {
        close(fd);
    }
    return lib;
}

/* Unlink every entry of the directory wfd (a work directory: flat). */
static void ncache_clear_dir(int wfd) {
    int d = fcntl(wfd, F_DUPFD_CLOEXEC, 0);
    if (d < 0) {
        return;
    }
    DIR *dir = fdopendir(d);
    if (dir == NULL) {
        close(d);
        return;
    }
    for (struct dirent *de; (de = readdir(dir)) != NULL;) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) {
            continue;
        }
        if (unlinkat(wfd, de->d_name, 0) != 0 && (errno == EISDIR || errno == EPERM)) {
            unlinkat(wfd, de->d_name, AT_REMOVEDIR);
        }
    }
    closedir(dir);
}

/* Remove the work directory name of parent (opened as wfd, which is closed). */
static void ncache_remove_work(int parent, const char *name, int wfd) {
    for (int attempt = 0; attempt < 3; attempt++) {
        ncache_clear_dir(wfd);
        if (unlinkat(parent, name, AT_REMOVEDIR) == 0 || errno != ENOTEMPTY) {
            break;
        }
        ncache_sleep_ms(10); /* a killed compiler's helpers may still have been writing */
    }
    close(wfd);
}

/* A copy of the environment with TMPDIR=tmpdir (malloc'ed: the pointer array, then the
 * TMPDIR string), or NULL when out of memory. */
static char **ncache_env_with(const char *tmpdir) {
    size_t n = 0;
    for (char **e = environ; e != NULL && *e != NULL; e++) {
        n++;
    }
    size_t tl = strlen("TMPDIR=") + strlen(tmpdir) + 1;
    char **env = ncache_malloc((n + 2) * sizeof *env + tl);
    if (env == NULL) {
        return NULL;
    }
    char *t = (char *)(env + n + 2);
    snprintf(t, tl, "TMPDIR=%s", tmpdir);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (strncmp(environ[i], "TMPDIR=", 7) != 0) {
            env[k++] = environ[i];
        }
    }
    env[k++] = t;
    env[k] = NULL;
    return env;
}

/* Check that fd is a regular file owned by this user that nobody else may write; what
 * names it in the reason. */
static bool ncache_check_file(ncache_job *job, int fd, const char *what, const char *path,
                              struct stat *st) {
    char eb[128];
    if (fstat(fd, st) != 0) {
        ncache_fail(job, "cannot stat %s %s: %s", what, path,
                    ncache_strerror(errno, eb, sizeof eb));
        return false;
    }
    if (!S_ISREG(st->st_mode)) {
        ncache_fail(job, "%s %s is not a regular file; refusing to load it", what, path);
        return false;
    }
    if (st->st_uid != geteuid()) {
        ncache_fail(job, "%s %s is owned by uid %u, not by this user (uid %u); refusing to load it",
                    what, path, (unsigned)st->st_uid, (unsigned)geteuid());
        return false;
    }
    if ((st->st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        ncache_fail(job, "%s %s is writable by other users (mode %04o); refusing to load it", what,
                    path, (unsigned)(st->st_mode & 07777));
        return false;
    }
    return true;
}

/* Compile src into <wpath>/out.so (wfd: the work directory, opened): the source is written
 * as src.c with the key symbol appended. Returns the output opened read-write, checked
 * and made 0600, or -1 (reason in job). */
static int ncache_compile(ncache_job *job, const char *wpath, int wfd, const char *src,
                          size_t len) {
    char eb[128];
    const ncache_config *c = &job->cfg;
    char src_path[PATH_MAX], out_path[PATH_MAX];
    if (!ncache_fmt(src_path, sizeof src_path, "%s/src.c", wpath) ||
        !ncache_fmt(out_path, sizeof out_path, "%s/out.so", wpath)) {
        ncache_fail(job, "the work directory's path %s is too long", wpath);
        return -1;
    }

    int sfd = openat(wfd, "src.c", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (sfd < 0) {
        ncache_fail(job, "cannot write the source %s: %s", src_path,
                    ncache_strerror(errno, eb, sizeof eb));
        return -1;
    }
    char tail[192];
    snprintf(tail, sizeof tail,
             "\n__attribute__((visibility(\"default\"))) const char %s[] = \"%s\";\n",
             NBI_NATIVE_KEY_SYMBOL, job->key);
    bool ok = ncache_write_all(sfd, src, len) && ncache_write_all(sfd, tail, strlen(tail));
    if (ok && ncache_fault_take(NBI_NATIVE_FAULT_WRITE_SOURCE)) {
        errno = ENOSPC;
        ok = false;
    }
    int e = errno;
    if (close(sfd) != 0 && ok) {
        e = errno;
        ok = false;
    }
    if (!ok) {
        ncache_fail(job, "cannot write the source %s: %s", src_path,
                    ncache_strerror(e, eb, sizeof eb));
        return -1;
    }

    char **env = ncache_env_with(wpath);
    if (env == NULL) {
        ncache_fail(job, "out of memory");
        return -1;
    }
    char *argv[NCACHE_N_FLAGS + 5];
    int n = 0;
    argv[n++] = job->cfg.cc;
    for (int i = 0; i < NCACHE_N_FLAGS; i++) {
        argv[n++] = (char *)ncache_flags[i];
    }
    argv[n++] = "-o";
    argv[n++] = out_path;
    argv[n++] = src_path;
    argv[n] = NULL;
    ncache_run *r = ncache_malloc(sizeof *r);
    if (r == NULL) {
        free(env);
        ncache_fail(job, "out of memory");
        return -1;
    }
    ok = ncache_spawn(c->cc, c->cc, argv, env, c->timeout_s, r, job->err, sizeof job->err);
    free(env);
    job->info.compile_ms = r->ms;
    ok = ok && ncache_run_ok(r, c->cc, wpath, c->timeout_s, job->err, sizeof job->err);
    free(r);
    if (!ok) {
        return -1;
    }

    int fd = openat(wfd, "out.so", O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        ncache_fail(job, "%s exited with status 0 but did not write %s: %s", c->cc, out_path,
                    ncache_strerror(errno, eb, sizeof eb));
        return -1;
    }
    struct stat st;
    if (fchmod(fd, 0600) != 0) {
        ncache_fail(job, "cannot chmod %s: %s", out_path, ncache_strerror(errno, eb, sizeof eb));
        close(fd);
        return -1;
    }
    if (!ncache_check_file(job, fd, "the compiler's output", out_path, &st)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Open the work directory name of dir (fd dfd, path dpath) just made by mkdtemp: a
 * directory of ours, and the one the name refers to. */
static int ncache_open_work(ncache_job *job, int dfd, const char *wpath, const char *name) {
    char eb[128];
    int wfd = dfd >= 0 ? openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                       : open(wpath, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (wfd < 0) {
        ncache_fail(job, "cannot open the work directory %s: %s", wpath,
                    ncache_strerror(errno, eb, sizeof eb));
        return -1;
    }
    struct stat st;
    if (fstat(wfd, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077) != 0) {
        ncache_fail(job, "the work directory %s is not a private directory of this user", wpath);
        close(wfd);
        return -1;
    }
    return wfd;
}

/* NABLA_NATIVE_CACHE=off, no cache directory, or one that cannot be written: compile in a
 * private directory under $TMPDIR, load, remove the directory. */
static nbi_native_lib *ncache_load_private(ncache_job *job, const char *src, size_t len) {
    char eb[128], wpath[PATH_MAX];
    bool made = ncache_fmt(wpath, sizeof wpath, "%s/nabla-native-XXXXXX", job->cfg.tmp);
    if (!made) {
        errno = ENAMETOOLONG;
    } else {
        made = mkdtemp(wpath) != NULL;
    }
    if (!made) {
        ncache_fail(job, "cannot create a private directory in %s: %s", job->cfg.tmp,
                    ncache_strerror(errno, eb, sizeof eb));
        return NULL;
    }
    int wfd = ncache_open_work(job, -1, wpath, NULL);
    if (wfd < 0) {
        rmdir(wpath);
        return NULL;
    }
    nbi_native_lib *lib = NULL;
    int fd = ncache_compile(job, wpath, wfd, src, len);
    if (fd >= 0) {
        lib = ncache_dlopen(job, fd);
    }
    int parent = open(job->cfg.tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (parent >= 0) {
        ncache_remove_work(parent, strrchr(wpath, '/') + 1, wfd);
        close(parent);
    } else {
        ncache_clear_dir(wfd);
        close(wfd);
        rmdir(wpath);
    }
    return lib;
}

/* ---- the cache directory ------------------------------------------------------------------ */

enum { NCACHE_DIR_OK, NCACHE_DIR_FAIL, NCACHE_DIR_FALLBACK };

static bool ncache_unwritable(int e) {
    return e == EACCES || e == EROFS || e == EPERM;
}

/* Open the cache directory, creating what is missing (0700), and check it. FALLBACK (with
 * a note) when it cannot be created for want of permission or a writable file system. */
static int ncache_open_dir(ncache_job *job, int *dfd_out) {
    char eb[128];
    const char *dir = job->cfg.dir;
    *dfd_out = -1;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 && errno == ENOENT) {
        int e = ncache_mkdirs(dir);
        if (e != 0) {
            if (ncache_unwritable(e)) {
                ncache_note(job, "not cached: cannot create the cache directory %s: %s", dir,
                            ncache_strerror(e, eb, sizeof eb));
                return NCACHE_DIR_FALLBACK;
            }
            ncache_fail(job, "cannot create the cache directory %s: %s", dir,
                        ncache_strerror(e, eb, sizeof eb));
            return NCACHE_DIR_FAIL;
        }
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    }
    if (dfd < 0) {
        int e = errno;
        if (ncache_unwritable(e)) {
            ncache_note(job, "not cached: cannot open the cache directory %s: %s", dir,
                        ncache_strerror(e, eb, sizeof eb));
            return NCACHE_DIR_FALLBACK;
        }
        ncache_fail(job, "cannot open the cache directory %s: %s", dir,
                    ncache_strerror(e, eb, sizeof eb));
        return NCACHE_DIR_FAIL;
    }
    struct stat st;
    if (fstat(dfd, &st) != 0) {
        ncache_fail(job, "cannot stat the cache directory %s: %s", dir,
                    ncache_strerror(errno, eb, sizeof eb));
        close(dfd);
        return NCACHE_DIR_FAIL;
    }
    if (st.st_uid != geteuid()) {
        ncache_fail(job,
                    "the cache directory %s is owned by uid %u, not by this user (uid %u): "
                    "set NABLA_NATIVE_CACHE to a directory of yours",
                    dir, (unsigned)st.st_uid, (unsigned)geteuid());
        close(dfd);
        return NCACHE_DIR_FAIL;
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        ncache_fail(job,
                    "the cache directory %s is writable by other users (mode %04o): "
                    "chmod 700 it or set NABLA_NATIVE_CACHE",
                    dir, (unsigned)(st.st_mode & 07777));
        close(dfd);
        return NCACHE_DIR_FAIL;
    }
    *dfd_out = dfd;
    return NCACHE_DIR_OK;
}

enum { NCACHE_HIT, NCACHE_MISS, NCACHE_REFUSED };

/* The trailer of an entry: the ELF's SHA-256, the key, the ELF's length (little-endian),
 * the magic. */
static void ncache_trailer_make(uint8_t t[NBI_NATIVE_TRAILER_SIZE], const uint8_t sha[32],
                                const uint8_t key[32], uint64_t elf_len) {
    memcpy(t, sha, 32);
    memcpy(t + 32, key, 32);
    for (int i = 0; i < 8; i++) {
        t[64 + i] = (uint8_t)(elf_len >> (8 * i));
    }
    memcpy(t + 72, NBI_NATIVE_TRAILER_MAGIC, 8);
}

/* Remove the entry name if it is still the inode st describes (ours, checked). */
static void ncache_unlink_if_same(int dfd, const char *name, const struct stat *st) {
    struct stat now;
    if (fstatat(dfd, name, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_dev == st->st_dev &&
        now.st_ino == st->st_ino) {
        unlinkat(dfd, name, 0);
    }
}

/* Look the entry up: HIT with *fd_out open on the verified file, MISS (none, or a corrupt
 * one or a symlink that was removed), or REFUSED (reason in job). */
static int ncache_lookup(ncache_job *job, int dfd, const char *name, int *fd_out) {
    char eb[128], path[PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/%s", job->cfg.dir, name);
    *fd_out = -1;
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) {
            return NCACHE_MISS;
        }
        struct stat lst;
        if (e == ELOOP && fstatat(dfd, name, &lst, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISLNK(lst.st_mode)) {
            if (lst.st_uid == geteuid() && unlinkat(dfd, name, 0) == 0) {
                ncache_note(job, "replaced a symbolic link at the cache entry %s", path);
                return NCACHE_MISS;
            }
            ncache_fail(job, "the cache entry %s is a symbolic link; refusing to load it", path);
            return NCACHE_REFUSED;
        }
        ncache_fail(job, "cannot open the cache entry %s: %s", path,
                    ncache_strerror(e, eb, sizeof eb));
        return NCACHE_REFUSED;
    }
    struct stat st;
    if (!ncache_check_file(job, fd, "the cache entry", path, &st)) {
        close(fd);
        return NCACHE_REFUSED;
    }
    /* The trailer, then the hash of what it covers. */
    const char *bad = NULL;
    uint8_t t[NBI_NATIVE_TRAILER_SIZE];
    uint64_t size = (uint64_t)st.st_size, elf_len = 0;
    int r = 1;
    if (size < NBI_NATIVE_TRAILER_SIZE) {
        bad = "shorter than its trailer";
    } else if ((r = ncache_pread_all(fd, t, sizeof t, (off_t)(size - sizeof t))) <= 0) {
        bad = "truncated";
    } else {
        for (int i = 0; i < 8; i++) {
            elf_len |= (uint64_t)t[64 + i] << (8 * i);
        }
        if (memcmp(t + 72, NBI_NATIVE_TRAILER_MAGIC, 8) != 0) {
            bad = "no trailer";
        } else if (elf_len != size - sizeof t) {
            bad = "truncated or extended";
        } else if (memcmp(t + 32, job->key_raw, 32) != 0) {
            bad = "made for another key";
        } else {
            uint8_t sha[32];
            r = ncache_hash_fd(fd, elf_len, sha);
            if (r <= 0) {
                bad = "truncated";
            } else if (memcmp(sha, t, 32) != 0) {
                bad = "its contents do not match its checksum";
            }
        }
    }
    if (r < 0) {
        ncache_fail(job, "cannot read the cache entry %s: %s", path,
                    ncache_strerror(errno, eb, sizeof eb));
        close(fd);
        return NCACHE_REFUSED;
    }
    if (bad != NULL) {
        close(fd);
        ncache_unlink_if_same(dfd, name, &st);
        job->info.repaired = true;
        ncache_note(job, "rebuilt the corrupt cache entry %s (%s)", path, bad);
        return NCACHE_MISS;
    }
    *fd_out = fd;
    return NCACHE_HIT;
}

typedef struct ncache_entry {
    char name[72];
    uint64_t size;
    struct timespec mtime;
} ncache_entry;

static int ncache_entry_cmp(const void *a, const void *b) {
    const ncache_entry *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec) {
        return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    }
    if (x->mtime.tv_nsec != y->mtime.tv_nsec) {
        return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    }
    return strcmp(x->name, y->name);
}

/* Is name "<64 lowercase hex>.so"? */
static bool ncache_is_entry_name(const char *name) {
    for (int i = 0; i < 64; i++) {
        char ch = name[i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) {
            return false;
        }
    }
    return strcmp(name + 64, ".so") == 0;
}

/* After an insert: remove work directories older than an hour, then the least recently
 * used entries until the total fits the bound (never the entry just inserted, keep).
 * Best effort: a failure leaves the cache as it is. */
static void ncache_sweep(ncache_job *job, int dfd, const char *keep) {
    int d = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
    if (d < 0) {
        return;
    }
    DIR *dir = fdopendir(d);
    if (dir == NULL) {
        close(d);
        return;
    }
    ncache_entry *list = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    time_t now = time(NULL);
    bool oom = false;
    for (struct dirent *de; (de = readdir(dir)) != NULL;) {
        struct stat st;
        bool is_work = strncmp(de->d_name, "tmp-", 4) == 0;
        if ((!is_work && !ncache_is_entry_name(de->d_name)) ||
            fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != geteuid()) {
            continue;
        }
        if (is_work) {
            if (now - st.st_mtime > NCACHE_STALE_SECONDS) {
                if (S_ISDIR(st.st_mode)) {
                    int wfd =
                        openat(dfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                    if (wfd >= 0) {
                        ncache_remove_work(dfd, de->d_name, wfd);
                    }
                } else if (S_ISREG(st.st_mode)) {
                    unlinkat(dfd, de->d_name, 0);
                }
            }
            continue;
        }
        if (!S_ISREG(st.st_mode) || oom) {
            continue;
        }
        if (n == cap) {
            size_t ncap = cap == 0 ? 64 : cap * 2;
            ncache_entry *grown = ncache_realloc(list, ncap * sizeof *list);
            if (grown == NULL) {
                oom = true;
                continue;
            }
            list = grown;
            cap = ncap;
        }
        memcpy(list[n].name, de->d_name, 68); /* 64 hex digits, ".so", NUL */
        list[n].size = (uint64_t)st.st_size;
        list[n].mtime = st.st_mtim;
        total += list[n].size;
        n++;
    }
    closedir(dir);
    if (oom) {
        ncache_note(job, "out of memory while sizing the cache; nothing was evicted");
    } else if (total > job->cfg.max_bytes) {
        qsort(list, n, sizeof *list, ncache_entry_cmp);
        for (size_t i = 0; i < n && total > job->cfg.max_bytes; i++) {
            if (strcmp(list[i].name, keep) != 0 && unlinkat(dfd, list[i].name, 0) == 0) {
                total -= list[i].size;
                job->info.evicted++;
            }
        }
    }
    free(list);
}

/* Make the entry: compile in a work directory inside the cache directory, append the
 * trailer, rename into place. *fallback when the directory cannot be written. */
static nbi_native_lib *ncache_insert(ncache_job *job, int dfd, const char *name, const char *src,
                                     size_t len, bool *fallback) {
    char eb[128], wpath[PATH_MAX];
    const char *dir = job->cfg.dir;
    bool made;
    if (!ncache_fmt(wpath, sizeof wpath, "%s/tmp-XXXXXX", dir)) {
        errno = ENAMETOOLONG;
        made = false;
    } else if (ncache_fault_take(NBI_NATIVE_FAULT_CACHE_READONLY)) {
        errno = EROFS;
        made = false;
    } else {
        made = mkdtemp(wpath) != NULL;
    }
    if (!made) {
        int e = errno;
        if (ncache_unwritable(e)) {
            *fallback = true;
            ncache_note(job, "not cached: cannot write to the cache directory %s: %s", dir,
                        ncache_strerror(e, eb, sizeof eb));
            return NULL;
        }
        ncache_fail(job, "cannot create a work directory in the cache directory %s: %s", dir,
                    ncache_strerror(e, eb, sizeof eb));
        return NULL;
    }
    const char *wname = wpath + strlen(dir) + 1;
    int wfd = ncache_open_work(job, dfd, wpath, wname);
    if (wfd < 0) {
        unlinkat(dfd, wname, AT_REMOVEDIR);
        return NULL;
    }

    nbi_native_lib *lib = NULL;
    int fd = ncache_compile(job, wpath, wfd, src, len), rofd = -1;
    if (fd >= 0) {
        struct stat st, rost;
        uint8_t sha[32], t[NBI_NATIVE_TRAILER_SIZE];
        int r = fstat(fd, &st) == 0 ? ncache_hash_fd(fd, (uint64_t)st.st_size, sha) : -1;
        bool ok = r > 0;
        int e = r == 0 ? EIO : errno;
        if (ok) {
            ncache_trailer_make(t, sha, job->key_raw, (uint64_t)st.st_size);
            if (ncache_fault_take(NBI_NATIVE_FAULT_WRITE_ENTRY)) {
                e = ENOSPC;
                ok = false;
            } else if (!ncache_pwrite_all(fd, t, sizeof t, st.st_size)) {
                e = errno;
                ok = false;
            }
        }
        if (close(fd) != 0 && ok) {
            e = errno;
            ok = false;
        }
        if (!ok) {
            ncache_fail(job, "cannot write the cache entry %s/out.so: %s", wpath,
                        ncache_strerror(e, eb, sizeof eb));
        } else if ((rofd = openat(wfd, "out.so", O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
                   fstat(rofd, &rost) != 0 || rost.st_ino != st.st_ino ||
                   rost.st_dev != st.st_dev) {
            ncache_fail(job, "cannot reopen %s/out.so", wpath);
        } else {
            bool renamed;
            if (ncache_fault_take(NBI_NATIVE_FAULT_RENAME)) {
                errno = EROFS;
                renamed = false;
            } else {
                renamed = renameat(wfd, "out.so", dfd, name) == 0;
            }
            if (!renamed) {
                ncache_fail(job, "cannot store the cache entry %s/%s: rename: %s", dir, name,
                            ncache_strerror(errno, eb, sizeof eb));
            } else {
                job->info.stored = true;
                lib = ncache_dlopen(job, rofd);
                rofd = -1;
                ncache_sweep(job, dfd, name);
            }
        }
        if (rofd >= 0) {
            close(rofd);
        }
    }
    ncache_remove_work(dfd, wname, wfd);
    return lib;
}

static nbi_native_lib *ncache_load_cached(ncache_job *job, const char *src, size_t len,
                                          bool *fallback) {
    int dfd;
    int d = ncache_open_dir(job, &dfd);
    if (d != NCACHE_DIR_OK) {
        *fallback = d == NCACHE_DIR_FALLBACK;
        return NULL;
    }
    char name[72];
    snprintf(name, sizeof name, "%s.so", job->key);
    nbi_native_lib *lib = NULL;
    int fd;
    int found = ncache_lookup(job, dfd, name, &fd);
    if (found == NCACHE_HIT) {
        futimens(fd, NULL); /* least recently used goes first; fails harmlessly when read-only */
        job->info.cache_hit = true;
        job->info.stored = true;
        lib = ncache_dlopen(job, fd);
    } else if (found == NCACHE_MISS && job->no_compile) {
        ncache_fail(job, "not in the cache");
    } else if (found == NCACHE_MISS) {
        lib = ncache_insert(job, dfd, name, src, len, fallback);
    }
    close(dfd);
    return lib;
}

static nbi_native_lib *ncache_load(const char *src, size_t len, bool no_compile, char *why,
                                   size_t why_cap, nbi_native_load_info *info);

nbi_native_lib *nbi_native_load(const char *src, size_t len, char *why, size_t why_cap,
                                nbi_native_load_info *info) {
    return ncache_load(src, len, false, why, why_cap, info);
}

nbi_native_lib *nbi_native_load_cached(const char *src, size_t len, char *why, size_t why_cap,
                                       nbi_native_load_info *info) {
    return ncache_load(src, len, true, why, why_cap, info);
}

static nbi_native_lib *ncache_load(const char *src, size_t len, bool no_compile, char *why,
                                   size_t why_cap, nbi_native_load_info *info) {
    double t0 = ncache_now_ms();
    ncache_job *job = ncache_malloc(sizeof *job);
    if (job == NULL) {
        if (why != NULL && why_cap > 0) {
            snprintf(why, why_cap, "out of memory");
        }
        if (info != NULL) {
            memset(info, 0, sizeof *info);
        }
        return NULL;
    }
    memset(job, 0, sizeof *job);
    job->no_compile = no_compile;
    nbi_native_lib *lib = NULL;
    if (src == NULL) {
        ncache_fail(job, "no source");
    } else {
        ncache_config_get(&job->cfg);
    }
    if (job->err[0] == '\0' && job->cfg.err[0] != '\0') {
        ncache_fail(job, "%s", job->cfg.err);
    }
    if (job->err[0] == '\0') {
        ncache_sha s;
        ncache_sha_init(&s);
        ncache_sha_update(&s, job->cfg.salt, sizeof job->cfg.salt);
        ncache_sha_field(&s, src, len);
        ncache_sha_final(&s, job->key_raw);
        ncache_hex(job->key_raw, 32, job->key);
        memcpy(job->info.key, job->key, sizeof job->key);

        pthread_mutex_lock(&ncache_libs_lock);
        lib = ncache_libs_find(job->key);
        pthread_mutex_unlock(&ncache_libs_lock);
        if (lib != NULL) {
            job->info.cache_hit = true;
            ncache_note(job, "already loaded in this process");
        } else {
            bool fallback = job->cfg.dir_mode != NCACHE_DIR_CACHE;
            if (no_compile && job->cfg.dir_mode != NCACHE_DIR_CACHE) {
                ncache_fail(job, "no disk cache");
                fallback = false;
            } else if (job->cfg.dir_mode == NCACHE_DIR_CACHE) {
                lib = ncache_load_cached(job, src, len, &fallback);
            } else if (job->cfg.dir_mode == NCACHE_DIR_NONE) {
                ncache_note(job, "%s", job->cfg.dir_note);
            } else {
                ncache_note(job, "not cached: NABLA_NATIVE_CACHE=off");
            }
            if (lib == NULL && fallback && !no_compile && job->err[0] == '\0') {
                lib = ncache_load_private(job, src, len);
            }
        }
    }
    if (lib == NULL && job->err[0] == '\0') {
        ncache_fail(job, "native code could not be loaded"); /* never reached: every failure says */
    }
    job->info.load_ms = ncache_now_ms() - t0 - job->info.compile_ms;
    if (why != NULL && why_cap > 0) {
        snprintf(why, why_cap, "%s", lib != NULL ? "" : job->err);
    }
    if (info != NULL) {
        *info = job->info;
    }
    free(job);
    return lib;
}

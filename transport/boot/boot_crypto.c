/* SPDX-License-Identifier: Apache-2.0 */
/* HMAC-SHA256 through OpenSSL's libcrypto, loaded at run time (boot_crypto.h). Only three of
 * its functions are used, all present in OpenSSL 1.1 and 3: the one-shot HMAC(), EVP_sha256()
 * and CRYPTO_memcmp(). Their declarations are this file's own, so nothing of OpenSSL is
 * needed to build. */
#include "boot_crypto.h"

#include "base/dl.h"
#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct boot_crypto_fns {
    unsigned char *(*hmac)(const void *md, const void *key, int key_len, const unsigned char *d,
                           size_t n, unsigned char *out, unsigned int *out_len);
    const void *(*sha256)(void);
    int (*memcmp)(const void *a, const void *b, size_t n);
};

static struct boot_crypto_fns fns;

static const struct rs_dl_sym boot_crypto_syms[] = {
    {"HMAC", offsetof(struct boot_crypto_fns, hmac), RS_DL_REQUIRED},
    {"EVP_sha256", offsetof(struct boot_crypto_fns, sha256), RS_DL_REQUIRED},
    {"CRYPTO_memcmp", offsetof(struct boot_crypto_fns, memcmp), RS_DL_REQUIRED},
};

/* The library serves when it reproduces RFC 4231's test case 2, so that a file of that name
 * that is not OpenSSL (or a broken one) is refused instead of trusted. */
static int boot_crypto_ready(void *table, char *why, size_t cap)
{
    static const unsigned char want[BOOT_MAC_BYTES] = {
        0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24,
        0x26, 0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27,
        0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
    static const char data[] = "what do ya want for nothing?";
    const struct boot_crypto_fns *f = table;
    unsigned char got[BOOT_MAC_BYTES];
    unsigned int len = 0;
    const void *md = f->sha256();
    if (!md || !f->hmac(md, "Jefe", 4, (const unsigned char *)data, sizeof(data) - 1, got, &len) ||
        len != BOOT_MAC_BYTES || memcmp(got, want, sizeof(want)) != 0) {
        snprintf(why, cap, "crypto: libcrypto's HMAC-SHA256 fails its known-answer test");
        return -1;
    }
    return 0;
}

static struct rs_dl boot_crypto_dl = {
    .what = "crypto",
    .file = RS_PARAM_CRYPTO_LIB,
    .fallback = "libcrypto.so.3",
    .open_prefix = "the bootstrap authenticates ranks with OpenSSL's HMAC-SHA256: ",
    .open_hint = " (install libssl3, or point RESHARD_CRYPTO_LIB at libcrypto)",
    .syms = boot_crypto_syms,
    .nsyms = sizeof(boot_crypto_syms) / sizeof(boot_crypto_syms[0]),
    .table = &fns,
    .table_size = sizeof(fns),
    .ready = boot_crypto_ready,
};

reshard_status_t boot_mac(const void *key, size_t key_len, const char *label,
                          const struct boot_mac_part *parts, int nparts,
                          unsigned char out[BOOT_MAC_BYTES])
{
    const struct boot_crypto_fns *f = rs_dl_load(&boot_crypto_dl);
    if (!f)
        return RESHARD_ERR_UNAVAILABLE;
    /* The message is the label, its terminator (so that no label is a prefix of another's
     * message), and the parts. */
    size_t n = strlen(label) + 1;
    for (int i = 0; i < nparts; i++)
        n += parts[i].n;
    unsigned char small[512],
        *msg = n <= sizeof(small) ? small : rs_calloc(1, n, "a MAC's message");
    if (!msg)
        return RESHARD_ERR_NO_MEMORY;
    size_t at = strlen(label) + 1;
    memcpy(msg, label, at);
    for (int i = 0; i < nparts; i++) {
        if (parts[i].n)
            memcpy(msg + at, parts[i].p, parts[i].n);
        at += parts[i].n;
    }
    unsigned int len = 0;
    unsigned char mac[BOOT_MAC_BYTES];
    const unsigned char *ok = f->hmac(f->sha256(), key, (int)key_len, msg, n, mac, &len);
    if (msg != small)
        free(msg);
    if (!ok || len != BOOT_MAC_BYTES)
        return rs_error(RESHARD_ERR_INTERNAL, "crypto: HMAC-SHA256 failed");
    memcpy(out, mac, BOOT_MAC_BYTES);
    return RESHARD_OK;
}

int boot_mac_equal(const unsigned char *a, const unsigned char *b)
{
    /* Only called on MACs that boot_mac computed, so the library is loaded. */
    if (fns.memcmp)
        return fns.memcmp(a, b, BOOT_MAC_BYTES) == 0;
    unsigned char d = 0;
    for (int i = 0; i < BOOT_MAC_BYTES; i++)
        d |= a[i] ^ b[i];
    return d == 0;
}

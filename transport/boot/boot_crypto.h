/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The bootstrap's cryptography: HMAC-SHA256 from OpenSSL's libcrypto, loaded at run time
 * (RESHARD_CRYPTO_LIB, libcrypto.so.3 by default) so that the library loads on a host without
 * it and a bootstrap that needs it says so. Ranks prove they hold the job's secret with MACs
 * over nonces from both ends; the secret itself never crosses the wire.
 */
#ifndef RS_BOOT_CRYPTO_H
#define RS_BOOT_CRYPTO_H

#include "base/reshard_status.h"

#include <stddef.h>

#define BOOT_MAC_BYTES 32

/* One piece of a MAC's message: the pieces are MACed as if concatenated. */
struct boot_mac_part {
    const void *p;
    size_t n;
};

/* HMAC-SHA256 under key (key_len bytes) of a label (what the MAC is for, so that one kind of
 * message can never stand for another) followed by the parts. RESHARD_ERR_UNAVAILABLE with a
 * message naming the library when libcrypto cannot be loaded. */
reshard_status_t boot_mac(const void *key, size_t key_len, const char *label,
                          const struct boot_mac_part *parts, int nparts,
                          unsigned char out[BOOT_MAC_BYTES]);
/* Whether two MACs are equal, in time that does not depend on where they differ. */
int boot_mac_equal(const unsigned char *a, const unsigned char *b);

#endif

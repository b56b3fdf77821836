/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the execution hello's decoders, fed what a hostile peer could send. The
 * first byte picks one: a receiver's announcement of its buffers (exec_ann_decode, against a
 * writer expecting 3 entries of 2 tensors), a writer's message (exec_writer_decode), or a
 * failing rank's start report (exec_start_refuse, on a plan of 2 tensors); the rest is the
 * message. Each must take it or refuse it with a message, never read, write or allocate past
 * what the expectation allows. */
#include "base/error.h"
#include "plugin/exec/exec_link.h"
#include "plugin/exec/exec_vote.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 65536)
        return 0;
    const uint8_t *msg = data + 1;
    size_t len = size - 1;
    static const struct exec_entry ent[3] = {
        {0, XBUF_DST, 4096}, {0, XBUF_TMP, 8192}, {1, XBUF_DST, 64}};
    switch (data[0] % 3) {
    case 0: {
        struct exec_ann_want w = {
            .peer = 1, .pid = 4242, .seq = 7, .hash = 0x1234, .nent = 3, .ent = ent};
        uint64_t addr[3];
        struct cuda_ipc_export exp[3];
        uint8_t has[3];
        (void)exec_ann_decode(msg, len, &w, addr, exp, has);
        break;
    }
    case 1: {
        uint8_t cuda = 0;
        (void)exec_writer_decode(msg, len, 1, 7, 0x1234, &cuda);
        break;
    }
    default: {
        struct plan_tensor t[2] = {{.name = "w"}, {.name = "b"}};
        struct rs_plan plan = {.ntensors = 2, .tensors = t};
        struct exec_start_report r;
        memset(&r, 0, sizeof(r));
        memcpy(&r, msg, len < sizeof(r) ? len : sizeof(r));
        (void)exec_start_refuse(&plan, 3, &r);
    }
    }
    rs_error_clear();
    return 0;
}

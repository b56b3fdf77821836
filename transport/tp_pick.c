/* SPDX-License-Identifier: Apache-2.0 */
#include "tp.h"
#include "transport/ib/ib_dev.h"

#include "base/error.h"
#include "base/param.h"

#include <string.h>

reshard_status_t tp_pick(const struct tp_ops **ops)
{
    const char *want = rs_param_str(RS_PARAM_TRANSPORT);
    const struct ib_port *ports;
    int n = 0;
    if (!strcmp(want, "ucx")) {
        *ops = &tp_ucx_ops;
        return RESHARD_OK;
    }
    if (!strcmp(want, "ib")) {
        RS_CHECK(ib_ports(&ports, &n));
        if (!n)
            return rs_error(RESHARD_ERR_UNAVAILABLE,
                            "RESHARD_TRANSPORT=ib: no active RDMA port%s (ibv_devinfo lists them)",
                            *rs_param_str(RS_PARAM_IB_HCA) ? " matches RESHARD_IB_HCA" : "");
        *ops = &tp_ib_ops;
        return RESHARD_OK;
    }
    if (strcmp(want, "auto"))
        return rs_error(RESHARD_ERR_INVALID_ARG, "RESHARD_TRANSPORT=%s: expected ib, ucx or auto",
                        want);
    *ops = ib_ports(&ports, &n) == RESHARD_OK && n > 0 ? &tp_ib_ops : &tp_ucx_ops;
    return RESHARD_OK;
}

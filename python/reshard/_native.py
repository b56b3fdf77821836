# SPDX-License-Identifier: Apache-2.0
"""The shared object, its C structs and its function signatures (ctypes).

The library is found, in order, at $RESHARD_LIB, next to this package (a copy placed there),
in the source tree's build/ folder (python/reshard -> ../../build), and through the dynamic
loader's search path (make install puts it in PREFIX/lib). It is loaded on first use, so
`import reshard` works anywhere and only a call that needs it can fail.
"""
import ctypes
import os
import threading

LIB_NAME = "libnccl-net-reshard.so"

# reshard_status.h, X(name, value, message): test_python checks this table against it.
STATUS_NAMES = {
    0: "OK",
    1: "ERR_INVALID_ARG",
    2: "ERR_NO_MEMORY",
    3: "ERR_SPEC_SYNTAX",
    4: "ERR_MESH_SIZE",
    5: "ERR_SHARD_DIM",
    6: "ERR_NOT_DIVISIBLE",
    7: "ERR_MISMATCH",
    8: "ERR_RANK_RANGE",
    9: "ERR_VIEW",
    10: "ERR_TOO_LARGE",
    11: "ERR_INVALID_PLAN",
    12: "ERR_INTERNAL",
    13: "ERR_TIMEOUT",
    14: "ERR_REFUSED",
    15: "ERR_NETWORK",
    16: "ERR_BUSY",
    17: "ERR_BUFFER",
    18: "ERR_PLAN_MISMATCH",
    19: "ERR_UNAVAILABLE",
    20: "ERR_REMOTE",
    21: "ERR_ABORTED",
    22: "ERR_DATA_LOST",
    23: "ERR_VERIFY",
    24: "ERR_LEFT",
}
STATUS = {name: value for value, name in STATUS_NAMES.items()}

MEM_HOST, MEM_CUDA = 0, 1
TENSOR_STATES = {0: "none", 1: "complete", 2: "untouched", 3: "torn"}
ALGOS = {"reshard": 0, "direct": 1, "bcast": 2}


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class TensorT(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("src", ctypes.c_void_p), ("dst", ctypes.c_void_p)]


class BuffersT(ctypes.Structure):
    _fields_ = [
        ("src", ctypes.c_void_p),
        ("src_bytes", ctypes.c_size_t),
        ("dst", ctypes.c_void_p),
        ("dst_bytes", ctypes.c_size_t),
        ("mem", ctypes.c_int),
    ]


class LayoutInfo(ctypes.Structure):
    _fields_ = [
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_int64 * 8),
        ("elem_size", ctypes.c_size_t),
        ("nranks", ctypes.c_int),
        ("max_rank", ctypes.c_int),
    ]


class PlanConfig(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("split_min_bytes", ctypes.c_int64),
        ("max_ops", ctypes.c_int64),
        ("algo", ctypes.c_int),
        ("verify", ctypes.c_int),
        ("delta", ctypes.c_int),
    ]


class PlanStats(ctypes.Structure):
    _fields_ = [
        ("net_bytes", ctypes.c_uint64),
        ("min_net_bytes", ctypes.c_uint64),
        ("gather_bcast_bytes", ctypes.c_uint64),
        ("local_bytes", ctypes.c_uint64),
        ("self_bytes", ctypes.c_uint64),
        ("max_nic_bytes", ctypes.c_uint64),
        ("lb_nic_bytes", ctypes.c_uint64),
        ("max_nic_rank", ctypes.c_int),
        ("net_ops", ctypes.c_uint64),
        ("local_ops", ctypes.c_uint64),
        ("fwd_ops", ctypes.c_uint64),
        ("self_ops", ctypes.c_uint64),
        ("plan_ms", ctypes.c_double),
        ("ntensors", ctypes.c_int),
        ("world_size", ctypes.c_int),
        ("ndomains", ctypes.c_int),
        ("quant_bytes", ctypes.c_uint64),
        ("quant_at_source_pct", ctypes.c_double),
    ]


class Counters(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "net_out", "net_in", "local_out", "local_in", "self",
            "ctrl_msgs", "net_msgs", "ipc_out", "gdr_out", "gdr_in",
            "boot_out", "boot_in", "ctrl_bytes_out", "ctrl_bytes_in",
        )
    ]


_P = ctypes.c_void_p
_I = ctypes.c_int
_S = ctypes.c_int  # reshard_status_t
_SIGNATURES = {
    "reshard_strerror": (ctypes.c_char_p, [_S]),
    "reshard_last_error": (ctypes.c_char_p, []),
    "reshard_layout_parse": (_S, [ctypes.c_char_p, _I, ctypes.POINTER(_P)]),
    "reshard_layout_format": (ctypes.c_size_t, [_P, ctypes.c_char_p, ctypes.c_size_t]),
    "reshard_layout_destroy": (None, [_P]),
    "reshard_layout_info": (_S, [_P, ctypes.POINTER(LayoutInfo)]),
    "reshard_layout_shard_shape": (
        _S,
        [_P, _I, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)],
    ),
    "reshard_layout_shard_index": (_S, [_P, _I, _I, ctypes.POINTER(ctypes.c_int64)]),
    "reshard_layout_shard_bytes": (_S, [_P, _I, ctypes.POINTER(ctypes.c_size_t)]),
    "reshard_plan_destroy": (None, [_P]),
    "reshard_plan_ntensors": (_I, [_P]),
    "reshard_plan_tensor_name": (ctypes.c_char_p, [_P, _I]),
    "reshard_plan_tensor_layout": (_S, [_P, _I, _I, ctypes.POINTER(_P)]),
    "reshard_plan_hash": (ctypes.c_uint64, [_P]),
    "reshard_plan_stats": (_S, [_P, ctypes.POINTER(PlanStats), _P]),
    "reshard_plan_outcome": (_S, [_P, ctypes.POINTER(ctypes.c_int)]),
    "reshard_plan_execute": (_S, [_P, ctypes.POINTER(BuffersT)]),
    "reshard_plan_check_layouts": (_S, [_P, ctypes.POINTER(BuffersT)]),
    "reshard_manifest_load": (_S, [ctypes.c_char_p, ctypes.POINTER(_P)]),
    "reshard_manifest_destroy": (None, [_P]),
    "reshard_manifest_world_size": (_I, [_P]),
    "reshard_manifest_ntensors": (_I, [_P]),
    "reshard_manifest_tensors": (ctypes.POINTER(TensorT), [_P]),
    "reshard_get_unique_id": (_S, [ctypes.POINTER(UniqueId)]),
    "reshard_comm_init_rank": (_S, [ctypes.POINTER(UniqueId), _I, _I, ctypes.POINTER(_P)]),
    "reshard_comm_init_env": (_S, [ctypes.POINTER(_P)]),
    "reshard_comm_init_nccl": (_S, [_P, ctypes.POINTER(_P)]),
    "reshard_plan_execute_stream": (_S, [_P, ctypes.POINTER(BuffersT), _P]),
    "reshard_comm_rank": (_I, [_P]),
    "reshard_comm_size": (_I, [_P]),
    "reshard_comm_has_rank": (_I, [_P, _I]),
    "reshard_comm_destroy": (None, [_P]),
    "reshard_comm_abort": (_S, [_P]),
    "reshard_comm_shrink": (_S, [_P, ctypes.POINTER(_I), _I, ctypes.POINTER(_P)]),
    "reshard_comm_leave": (_S, [_P]),
    "reshard_comm_grow_id": (_S, [_P, ctypes.POINTER(_I), _I, ctypes.POINTER(UniqueId)]),
    "reshard_comm_grow": (_S, [_P, ctypes.POINTER(_I), _I, ctypes.POINTER(_P)]),
    "reshard_comm_join": (
        _S,
        [ctypes.POINTER(UniqueId), _I, ctypes.POINTER(_I), _I, ctypes.POINTER(_P)],
    ),
    "reshard_comm_left": (_S, [_P, ctypes.POINTER(_I)]),
    "reshard_comm_barrier": (_S, [_P]),
    "reshard_comm_counters": (_S, [_P, ctypes.POINTER(Counters)]),
    "reshard_comm_plan_create": (
        _S,
        [_P, ctypes.POINTER(TensorT), _I, ctypes.POINTER(PlanConfig), ctypes.POINTER(_P)],
    ),
    "reshard_plan_catch_up": (
        _S,
        [_P, ctypes.POINTER(_I), _I, ctypes.POINTER(PlanConfig), ctypes.POINTER(_P)],
    ),
}

_lock = threading.Lock()
_lib = None


def candidates():
    """Where the library is looked for, in order."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = os.environ.get("RESHARD_LIB")
    if env:
        return [env]
    return [
        os.path.join(here, LIB_NAME),
        os.path.normpath(os.path.join(here, "..", "..", "build", LIB_NAME)),
        LIB_NAME,
    ]


def load(paths, signatures):
    """The first of paths that loads (a bare name goes to the loader's search), with every
    function of signatures ({name: (restype, argtypes)}) declared; or (None, why each failed)."""
    errors = []
    for path in paths:
        if os.sep in path and not os.path.exists(path):
            errors.append("%s: no such file" % path)
            continue
        try:
            handle = ctypes.CDLL(path)
            break
        except OSError as e:
            errors.append(str(e))
    else:
        return None, "; ".join(errors)
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(handle, name)
        fn.restype, fn.argtypes = restype, argtypes
    return handle, None


def lib():
    """The loaded library, with every signature declared."""
    global _lib
    with _lock:
        if _lib is None:
            handle, why = load(candidates(), _SIGNATURES)
            if handle is None:
                raise OSError("reshard: cannot load %s (%s); build it with make, install it, or "
                              "set RESHARD_LIB to its path" % (LIB_NAME, why))
            _lib = handle
        return _lib

# SPDX-License-Identifier: Apache-2.0
"""NCCL M2N's Python surface (`nccl.m2n`), on reshard: what vLLM 0.33's m2n weight-transfer
engine (vllm/distributed/weight_transfer/m2n_common.py, m2n_engine.py, m2n_trainer.py) and the
other M2N integrations call, backed by libreshard-m2n.so (plugin/m2n/nccl_m2n.h).

    import reshard.m2n
    reshard.m2n.install()          # `import nccl.m2n` now gives this module

    m2n.reshard(src, dst, comm, stream,
                src_mesh=m2n.Mesh((2, 2), start_rank=0), src_placements=[m2n.Shard(0), m2n.Replicate()],
                dst_mesh=m2n.Mesh((4, 1), start_rank=4), dst_placements=[m2n.Replicate(), m2n.Shard(1)],
                handle=m2n.Handle.create(m2n.Config(max_cta=None)))

src and dst are this rank's tiles (torch tensors, numpy arrays, objects with
__cuda_array_interface__, or None where the rank is not on that side), comm the NCCL
communicator over both sides (NCCL4Py's Communicator, vLLM's PyNcclCommunicator.comm, or an
ncclComm_t as an int) or a torch.distributed process group (gloo: CPU tiles moved by
reshard's own transports, for runs without a GPU), stream a CUDA stream (torch's, NCCL4Py's, an
int, or None for the default). Every rank passes both meshes and placements; the local shape of the side it does not
hold is computed from the one it does, as M2N's shards are even. What M2N's descriptors cannot
say (more than 3 dims or 2 mesh axes, several shard axes, uneven shards) goes through reshard's
extension when `global_shape=` is given.

Invalid arguments raise NcclInvalid (a ValueError); a failed call raises NCCLReshardError with
M2N's status and ncclM2nGetLastError's detail, as nccl.m2n does.
"""
import contextlib
import ctypes
import os
import sys
import threading
import types

from . import _buffers, _native

LIB_NAME = "libreshard-m2n.so"

# nccl_m2n.h
API_MAGIC = 0x4D324E32
API_VERSION = 2
CONFIG_UNDEF_INT = -(2 ** 31)
MESH_NDIMS = 2
MAX_TENSOR_DIMS = 3
EXT_MAX_DIMS = 8
REPLICATE = -1

# ncclResult_t
RESULTS = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError",
           3: "ncclInternalError", 4: "ncclInvalidArgument", 5: "ncclInvalidUsage",
           6: "ncclRemoteError", 7: "ncclInProgress"}

# ncclDataType_t by the names torch and numpy give
_DTYPES = {
    "int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6,
    "half": 6, "float32": 7, "float": 7, "float64": 8, "double": 8, "bfloat16": 9,
    "float8_e4m3fn": 10, "float8_e4m3": 10, "float8_e5m2": 11,
}
_DTYPE_SIZES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 1, 11: 1}


class NcclInvalid(ValueError):
    """An argument M2N refuses before any native call."""


class NCCLReshardError(RuntimeError):
    """A failed native call: M2N's status and ncclM2nGetLastError's detail."""

    def __init__(self, status, detail=None):
        self.status = int(status)
        self.detail = detail
        message = "NCCL Reshard error code %d (%s)" % (self.status, RESULTS.get(self.status, "?"))
        if detail:
            message += ": " + detail
        RuntimeError.__init__(self, message)

    def __reduce__(self):
        return (type(self), (self.status, self.detail))


# ---- the native library ----

class _Mesh(ctypes.Structure):
    _fields_ = [("dims", ctypes.c_int * MESH_NDIMS), ("startRank", ctypes.c_int)]


class _DistTensor(ctypes.Structure):
    _fields_ = [
        ("dataPtr", ctypes.c_void_p),
        ("localShape", ctypes.c_size_t * MAX_TENSOR_DIMS),
        ("ndims", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("mesh", ctypes.POINTER(_Mesh)),
        ("placements", ctypes.c_int * MESH_NDIMS),
    ]


class _Config(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("maxCta", ctypes.c_int)]


class _ExtTensor(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("dataPtr", ctypes.c_void_p),
        ("ndims", ctypes.c_int),
        ("shape", ctypes.c_int64 * EXT_MAX_DIMS),
        ("dtype", ctypes.c_int),
        ("meshNdims", ctypes.c_int),
        ("meshDims", ctypes.c_int * EXT_MAX_DIMS),
        ("startRank", ctypes.c_int),
        ("placements", ctypes.c_int * EXT_MAX_DIMS),
    ]


_V, _I = ctypes.c_void_p, ctypes.c_int
_SIGNATURES = {
    "ncclM2nInit": (_I, [ctypes.POINTER(_V), ctypes.POINTER(_Config)]),
    "ncclM2nFinalize": (_I, [_V]),
    "ncclM2nGetLastError": (ctypes.c_char_p, []),
    "ncclM2nGroupStart": (_I, []),
    "ncclM2nGroupEnd": (_I, []),
    "ncclM2nGroupAbort": (_I, []),
    "ncclReshard": (_I, [_V, _V, ctypes.POINTER(_DistTensor), ctypes.POINTER(_DistTensor), _V]),
    "ncclReshardWithWindow": (_I, [_V, _V, _V, ctypes.POINTER(_DistTensor),
                                   ctypes.POINTER(_DistTensor), _V]),
    "reshard_m2n_reshard": (_I, [_V, _V, ctypes.POINTER(_ExtTensor), ctypes.POINTER(_ExtTensor),
                                 _V]),
    "reshard_m2n_local_shape": (_I, [ctypes.POINTER(_ExtTensor), _I, ctypes.c_int64 * EXT_MAX_DIMS,
                                     ctypes.POINTER(ctypes.c_size_t)]),
}

_lock = threading.Lock()
_lib = None


def candidates():
    """Where libreshard-m2n.so is looked for: $NCCL_M2N_LIBRARY, beside this package, the source
    tree's build/ (or beside $RESHARD_LIB), then the loader's path."""
    env = os.environ.get("NCCL_M2N_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.join(here, LIB_NAME)]
    if os.environ.get("RESHARD_LIB"):
        out.append(os.path.join(os.path.dirname(os.environ["RESHARD_LIB"]), LIB_NAME))
    out += [os.path.normpath(os.path.join(here, "..", "..", "build", LIB_NAME)), LIB_NAME]
    return out


def lib():
    global _lib
    with _lock:
        if _lib is None:
            handle, why = _native.load(candidates(), _SIGNATURES)
            if handle is None:
                raise ImportError("reshard.m2n: cannot load %s (%s); build it with make, install "
                                  "it, or set NCCL_M2N_LIBRARY to its path" % (LIB_NAME, why))
            _lib = handle
        return _lib


def check_status(status):
    if status != 0:
        detail = lib().ncclM2nGetLastError()
        raise NCCLReshardError(status, detail.decode("utf-8", "replace") if detail else None)


# ---- meshes and placements ----

class Mesh:
    """One side's ranks: [start_rank, start_rank + prod(dims)), row-major over dims. A flat
    mesh (one dim) is M2N's (n, 1)."""

    def __init__(self, dims, start_rank=0):
        if isinstance(dims, int):
            dims = (dims,)
        self.dims = tuple(int(d) for d in dims)
        self.start_rank = int(start_rank)
        if not 1 <= len(self.dims) <= EXT_MAX_DIMS or any(d < 1 for d in self.dims):
            raise NcclInvalid("Mesh dims must be 1 to %d positive sizes, got %r"
                              % (EXT_MAX_DIMS, dims))
        if self.start_rank < 0:
            raise NcclInvalid("Mesh start_rank must be non-negative, got %d" % self.start_rank)

    @property
    def ndims(self):
        return len(self.dims)

    @property
    def size(self):
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def ranks(self):
        return range(self.start_rank, self.start_rank + self.size)

    def __eq__(self, other):
        return isinstance(other, Mesh) and (self.dims, self.start_rank) == (other.dims,
                                                                             other.start_rank)

    def __hash__(self):
        return hash((self.dims, self.start_rank))

    def __repr__(self):
        return "Mesh(%r, start_rank=%d)" % (self.dims, self.start_rank)


class Replicate:
    code = REPLICATE

    def __eq__(self, other):
        return isinstance(other, Replicate)

    def __hash__(self):
        return hash("Replicate")

    def __repr__(self):
        return "Replicate()"


class Shard:
    def __init__(self, dim):
        if int(dim) < 0:
            raise NcclInvalid("Shard dim must be non-negative, got %r" % (dim,))
        self.dim = int(dim)

    @property
    def code(self):
        return self.dim

    def __eq__(self, other):
        return isinstance(other, Shard) and other.dim == self.dim

    def __hash__(self):
        return hash(("Shard", self.dim))

    def __repr__(self):
        return "Shard(%d)" % self.dim


def normalize_placements(placements):
    """M2N's codes (-1 replicate, d shard tensor dim d) from Replicate/Shard objects, DTensor's
    (anything with .dim or .is_replicate()), or ints."""
    out = []
    for p in placements:
        if isinstance(p, bool):
            raise NcclInvalid("placement %r is not a placement" % (p,))
        if isinstance(p, int):
            out.append(REPLICATE if p == REPLICATE else p)
        elif isinstance(p, (Replicate, Shard)):
            out.append(p.code)
        elif callable(getattr(p, "is_replicate", None)) and p.is_replicate():
            out.append(REPLICATE)
        elif isinstance(getattr(p, "dim", None), int):
            out.append(p.dim)
        else:
            raise NcclInvalid("placement %r is neither Replicate() nor Shard(d)" % (p,))
        if out[-1] < REPLICATE:
            raise NcclInvalid("placement code %d is neither -1 nor a tensor dim" % out[-1])
    return tuple(out)


# ---- config and handles ----

class Config:
    def __init__(self, max_cta=None):
        if max_cta is not None and (isinstance(max_cta, bool) or int(max_cta) <= 0):
            raise NcclInvalid("max_cta must be a positive int or None, got %r" % (max_cta,))
        self.max_cta = None if max_cta is None else int(max_cta)

    def _struct(self):
        c = _Config(ctypes.sizeof(_Config), API_MAGIC, API_VERSION, CONFIG_UNDEF_INT)
        if self.max_cta is not None:
            c.maxCta = self.max_cta
        return c


class Handle:
    """An M2N handle (ncclM2nInit); destroy() finalizes it. Usable as a context manager."""

    def __init__(self, ptr):
        self._ptr = ptr

    @classmethod
    def create(cls, config=None):
        ptr = ctypes.c_void_p()
        cfg = (config or Config())._struct()
        check_status(lib().ncclM2nInit(ctypes.byref(ptr), ctypes.byref(cfg)))
        return cls(ptr.value)

    @property
    def ptr(self):
        return self._ptr or 0

    def destroy(self):
        ptr, self._ptr = self._ptr, None
        if ptr:
            check_status(lib().ncclM2nFinalize(ptr))

    finalize = close = destroy

    def reshard(self, comm, src, dst, stream=None, **kw):
        reshard(src, dst, comm, stream, handle=self, **kw)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()


def init(config=None):
    return Handle.create(config)


def finalize(handle=None):
    """Finalizes handle, or the default handle when None."""
    if handle is None:
        check_status(lib().ncclM2nFinalize(None))
    else:
        handle.destroy()


def group_start():
    check_status(lib().ncclM2nGroupStart())


def group_end():
    check_status(lib().ncclM2nGroupEnd())


def group_abort():
    check_status(lib().ncclM2nGroupAbort())


@contextlib.contextmanager
def group():
    """Records the reshard calls of the body and issues them at its end; aborts them when the
    body raises. The tensors must stay alive until the group ended."""
    group_start()
    try:
        yield
    except BaseException:
        group_abort()
        raise
    group_end()


# ---- arguments ----

def _dtype_code(dtype):
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if dtype in _DTYPE_SIZES:
            return dtype
        raise NcclInvalid("unsupported NCCL Reshard dtype: %r" % (dtype,))
    name = str(dtype).replace("torch.", "").lower()
    if name in _DTYPES:
        return _DTYPES[name]
    raise NcclInvalid("unsupported NCCL Reshard dtype: %r" % (dtype,))


def _buffer(buf, what):
    """(pointer, shape, dtype code) of a tile, (0, None, None) for None."""
    if buf is None:
        return 0, None, None
    data_ptr = getattr(buf, "data_ptr", None)
    if callable(data_ptr):  # torch
        if not buf.is_contiguous():
            raise NcclInvalid("%s must be contiguous: ncclDistTensor_t carries no strides" % what)
        return int(data_ptr()), tuple(int(d) for d in buf.shape), _dtype_code(buf.dtype)
    cai = getattr(buf, "__cuda_array_interface__", None)
    iface = cai if cai is not None else getattr(buf, "__array_interface__", None)
    if iface is not None:  # CUDA arrays, numpy (host memory: the stand-in CUDA's tests)
        import numpy as np

        shape = tuple(int(d) for d in iface["shape"])
        dtype = np.dtype(iface["typestr"])
        strides = iface.get("strides")
        if strides is not None and not _buffers.same_strides(
                shape, tuple(s // dtype.itemsize for s in strides),
                _buffers.contiguous_strides(shape)):
            raise NcclInvalid("%s must be contiguous: ncclDistTensor_t carries no strides" % what)
        name = getattr(getattr(buf, "dtype", None), "name", None) or dtype.name
        return int(iface["data"][0]), shape, _dtype_code(name)
    if isinstance(buf, int):
        raise NcclInvalid("%s is a raw pointer: pass a tensor, which carries its shape and dtype"
                          % what)
    raise NcclInvalid("cannot use %s (%s): expected None, a torch tensor, a numpy array or a "
                      "__cuda_array_interface__ object" % (what, type(buf).__name__))


def _handle_ptr(obj, names):
    if obj is None:
        return None
    if isinstance(obj, int) and not isinstance(obj, bool):
        return obj
    if isinstance(obj, ctypes.c_void_p):
        return obj.value
    if isinstance(obj, ctypes._Pointer):
        return ctypes.cast(obj, ctypes.c_void_p).value
    for name in names:
        v = getattr(obj, name, None)
        if callable(v) and name.startswith("_"):
            v = v()
        if v is not None and not callable(v):
            return _handle_ptr(v, names)
    raise NcclInvalid("cannot take a raw handle from %s" % type(obj).__name__)


def _comm_ptr(comm):
    # NCCL4Py's Communicator (.ptr), vLLM's PyNcclCommunicator (.comm), a ctypes or int handle
    ptr = _handle_ptr(comm, ("ptr", "handle", "comm", "value", "_comm_ptr"))
    if not ptr:
        raise NcclInvalid("comm must be an NCCL communicator, got %r" % (comm,))
    return ptr


def _stream_ptr(stream):
    if stream is None:
        return None
    return _handle_ptr(stream, ("cuda_stream", "handle", "ptr", "value")) or None


def _factors(mesh, placements, ndims):
    f = [1] * ndims
    for axis, code in enumerate(placements):
        if code != REPLICATE:
            if code >= ndims:
                raise NcclInvalid("placement Shard(%d) on mesh axis %d, but the tensor has %d dims"
                                  % (code, axis, ndims))
            f[code] *= mesh.dims[axis]
    return f


def _m2n_fits(mesh, placements, shape):
    """Whether M2N's own descriptors say it: <= 3 dims, <= 2 mesh axes, <= 1 shard axis, even."""
    if len(shape) > MAX_TENSOR_DIMS or mesh.ndims > MESH_NDIMS:
        return False
    if sum(1 for p in placements if p != REPLICATE) > 1:
        return False
    f = _factors(mesh, placements, len(shape))
    return all(s % k == 0 for s, k in zip(shape, f))


def _m2n_side(mesh, placements, shape, dtype, ptr):
    dims = mesh.dims if mesh.ndims == 2 else mesh.dims + (1,)
    codes = placements if mesh.ndims == 2 else placements + (REPLICATE,)
    m = _Mesh((ctypes.c_int * 2)(*dims), mesh.start_rank)
    f = _factors(mesh, placements, len(shape))
    local = [s // k for s, k in zip(shape, f)] + [0] * (MAX_TENSOR_DIMS - len(shape))
    t = _DistTensor(ptr or None, (ctypes.c_size_t * MAX_TENSOR_DIMS)(*local), len(shape), dtype,
                    ctypes.pointer(m), (ctypes.c_int * 2)(*codes))
    return m, t, tuple(local[:len(shape)])


def _ext_side(mesh, placements, shape, dtype, ptr):
    t = _ExtTensor()
    t.size = ctypes.sizeof(_ExtTensor)
    t.dataPtr = ptr or None
    t.ndims = len(shape)
    t.shape[:len(shape)] = list(shape)
    t.dtype = dtype
    t.meshNdims = mesh.ndims
    t.meshDims[:mesh.ndims] = list(mesh.dims)
    t.startRank = mesh.start_rank
    t.placements[:mesh.ndims] = list(placements)
    return t


def local_shape(mesh, placements, global_shape, rank):
    """The shape of rank's tile of a tensor of global_shape (torch.chunk shards, uneven ones
    too); zeros when rank is not on the mesh."""
    placements = normalize_placements(placements)
    t = _ext_side(mesh, placements, tuple(int(s) for s in global_shape), 0, 0)
    out, nbytes = (ctypes.c_int64 * EXT_MAX_DIMS)(), ctypes.c_size_t()
    check_status(lib().reshard_m2n_local_shape(ctypes.byref(t), rank, out, ctypes.byref(nbytes)))
    return tuple(out[:len(global_shape)])


def reshard(src, dst, comm, stream=None, *, src_mesh, src_placements, dst_mesh, dst_placements,
            handle=None, window=None, global_shape=None, dtype=None):
    """Collective over comm: this rank's src tile (or None) into its dst tile (or None).
    global_shape (and dtype, when this rank passes neither tile) say what the tiles cannot."""
    for name, mesh in (("src_mesh", src_mesh), ("dst_mesh", dst_mesh)):
        if not isinstance(mesh, Mesh):
            raise NcclInvalid("%s must be reshard.m2n.Mesh, got %s" % (name, type(mesh).__name__))
    sp, dp = normalize_placements(src_placements), normalize_placements(dst_placements)
    for name, mesh, p in (("src", src_mesh, sp), ("dst", dst_mesh, dp)):
        if len(p) != mesh.ndims:
            raise NcclInvalid("%s_placements has %d entries for a %d-D mesh"
                              % (name, len(p), mesh.ndims))
    sptr, sshape, sdt = _buffer(src, "src")
    dptr, dshape, ddt = _buffer(dst, "dst")
    if sdt is not None and ddt is not None and sdt != ddt:
        raise NcclInvalid("src and dst dtypes differ (%d, %d): M2N copies, it converts nothing"
                          % (sdt, ddt))
    given = dtype
    dtype = sdt if sdt is not None else ddt
    if dtype is None and given is not None:
        dtype = _dtype_code(getattr(given, "name", given))
    if dtype is None or (sshape is None and dshape is None and global_shape is None):
        raise NcclInvalid("src and dst are both None: pass global_shape= and dtype= for a rank "
                          "that holds neither tile")
    if global_shape is not None:
        shape = tuple(int(s) for s in global_shape)
    elif sshape is not None:
        shape = tuple(s * k for s, k in zip(sshape, _factors(src_mesh, sp, len(sshape))))
    else:
        shape = tuple(s * k for s, k in zip(dshape, _factors(dst_mesh, dp, len(dshape))))
    if _is_process_group(comm):
        _reshard_on_group(comm, src, dst, shape, dtype, (src_mesh, sp), (dst_mesh, dp), stream)
        return
    h = None if handle is None else _handle_ptr(handle, ("ptr",))
    c, s = _comm_ptr(comm), _stream_ptr(stream)
    # M2N's own descriptors where they can say it, reshard's extension where they cannot
    if _m2n_fits(src_mesh, sp, shape) and _m2n_fits(dst_mesh, dp, shape):
        keep = []
        descs = []
        for name, mesh, p, ptr, have in (("src", src_mesh, sp, sptr, sshape),
                                         ("dst", dst_mesh, dp, dptr, dshape)):
            m, t, local = _m2n_side(mesh, p, shape, dtype, ptr)
            if have is not None and have != local:
                raise NcclInvalid("%s's shape %r is not its tile %r of the global %r"
                                  % (name, have, local, shape))
            keep.append(m)
            descs.append(t)
        if window is not None:
            check_status(lib().ncclReshardWithWindow(h, c, _handle_ptr(window, ("ptr", "handle")),
                                                     ctypes.byref(descs[0]),
                                                     ctypes.byref(descs[1]), s))
        else:
            check_status(lib().ncclReshard(h, c, ctypes.byref(descs[0]), ctypes.byref(descs[1]),
                                           s))
        return
    st = _ext_side(src_mesh, sp, shape, dtype, sptr)
    dt = _ext_side(dst_mesh, dp, shape, dtype, dptr)
    check_status(lib().reshard_m2n_reshard(h, c, ctypes.byref(st), ctypes.byref(dt), s))


# ---- a torch.distributed group instead of an NCCL communicator ----

_SPEC_DTYPES = {0: "i8", 1: "u8", 2: "i32", 3: "i32", 4: "i64", 5: "i64", 6: "f16", 7: "f32",
                8: "f64", 9: "bf16", 10: "fp8e4m3", 11: "fp8e5m2"}
_groups = {}  # id(group) -> (group, reshard.Comm, {(src spec, dst spec): reshard.Plan})
_groups_lock = threading.Lock()


def _is_process_group(comm):
    dist = sys.modules.get("torch.distributed")
    return dist is not None and isinstance(comm, getattr(dist, "ProcessGroup", ()))


def _spec(side, shape, dtype):
    """The layout spec of one side, as libreshard-m2n.so writes it from M2N's descriptors."""
    mesh, codes = side
    ranks = "%d" % mesh.start_rank
    if mesh.size > 1:
        ranks += "-%d" % (mesh.start_rank + mesh.size - 1)
    return "shape=%s dtype=%s ranks=%s mesh=%s place=%s" % (
        "x".join(str(d) for d in shape), _SPEC_DTYPES[dtype], ranks,
        "x".join(str(d) for d in mesh.dims),
        ",".join("R" if c == REPLICATE else "S(%d)" % c for c in codes))


def _reshard_on_group(group, src, dst, shape, dtype, src_side, dst_side, stream):
    """The same reshard on a process group's ranks: a reshard communicator made on the group
    once (collective), a plan once per pair of layouts, host or device tiles moved by reshard's
    native executor. Errors are M2N's: NCCLReshardError with the library's detail."""
    import reshard as _rs

    key = (_spec(src_side, shape, dtype), _spec(dst_side, shape, dtype))
    try:
        with _groups_lock:
            entry = _groups.get(id(group))
            if entry is None or entry[0] is not group:
                entry = _groups[id(group)] = (group, _rs.Comm.from_process_group(group), {})
            plan = entry[2].get(key)
            if plan is None:
                plan = entry[2][key] = _rs.Plan(entry[1], [("m2n", key[0], key[1])])
        plan.execute([src], [dst], stream=stream)
    except _rs.ReshardError as e:
        invalid = {"ERR_INVALID_ARG", "ERR_SPEC_SYNTAX", "ERR_MESH_SIZE", "ERR_SHARD_DIM",
                   "ERR_NOT_DIVISIBLE", "ERR_MISMATCH", "ERR_RANK_RANGE", "ERR_VIEW",
                   "ERR_TOO_LARGE", "ERR_BUFFER", "ERR_PLAN_MISMATCH"}
        remote = {"ERR_TIMEOUT", "ERR_REFUSED", "ERR_REMOTE", "ERR_ABORTED", "ERR_DATA_LOST"}
        status = 4 if e.name in invalid else 6 if e.name in remote else 2
        raise NCCLReshardError(status, "reshard: %s" % e.message) from e


def release_groups():
    """Destroys the communicators and plans made on process groups (collective over each)."""
    with _groups_lock:
        entries = list(_groups.values())
        _groups.clear()
    for _, comm, plans in entries:
        for plan in plans.values():
            plan.close()
        comm.close()


def reshard_with_window(src, dst, comm, window, stream=None, **kw):
    """ncclReshardWithWindow: the window is accepted and not needed."""
    reshard(src, dst, comm, stream, window=window, **kw)


def install():
    """Makes `import nccl.m2n` give this module: into an installed `nccl` package (NCCL4Py's,
    whose nccl.core makes the communicators), else into an empty one. Returns this module."""
    this = sys.modules[__name__]
    try:
        import nccl as pkg
    except ImportError:
        pkg = types.ModuleType("nccl")
        pkg.__path__ = []
        sys.modules["nccl"] = pkg
    sys.modules["nccl.m2n"] = this
    pkg.m2n = this
    return this


__all__ = [
    "Config", "Handle", "Mesh", "Replicate", "Shard", "NCCLReshardError", "NcclInvalid",
    "reshard", "reshard_with_window", "group", "group_start", "group_end", "group_abort", "init",
    "finalize", "install", "local_shape", "normalize_placements", "release_groups",
]

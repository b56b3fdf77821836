# SPDX-License-Identifier: Apache-2.0
"""reshard from Python: layouts, communicators, plans and refits over libnccl-net-reshard.so.

    import numpy as np, reshard
    comm = reshard.Comm.from_env()                       # torchrun / mpirun / srun variables
    src = reshard.Layout("shape=4096x1024 dtype=f32 ranks=0-3 mesh=2x2 place=R,S(0)")
    dst = reshard.Layout("shape=4096x1024 dtype=f32 ranks=4-7 place=S(1)")
    plan = reshard.Plan(comm, [("w", src, dst)])
    mine = np.zeros(dst.shard_shape(comm.rank), np.float32)
    plan.execute([src_shard_or_None], [mine])            # every refit step

Standard library only; numpy arrays and torch tensors are taken by pointer (C-contiguous).
Every failure raises ReshardError with the library's status and message.
"""
import ctypes

from . import _native
from ._native import STATUS, STATUS_NAMES

__all__ = [
    "ReshardError",
    "Layout",
    "Comm",
    "Plan",
    "Manifest",
    "unique_id",
    "refit",
    "STATUS",
    "STATUS_NAMES",
]

DTYPES = ("bf16", "f16", "f32", "f64", "fp8e4m3", "fp8e5m2", "i8", "u8", "i32", "i64")
_FROM_TORCH = {
    "torch.bfloat16": "bf16",
    "torch.float16": "f16",
    "torch.float32": "f32",
    "torch.float64": "f64",
    "torch.float8_e4m3fn": "fp8e4m3",
    "torch.float8_e5m2": "fp8e5m2",
    "torch.int8": "i8",
    "torch.uint8": "u8",
    "torch.int32": "i32",
    "torch.int64": "i64",
}
_FROM_NUMPY = {
    "bfloat16": "bf16",  # ml_dtypes
    "float16": "f16",
    "float32": "f32",
    "float64": "f64",
    "int8": "i8",
    "uint8": "u8",
    "int32": "i32",
    "int64": "i64",
}


class ReshardError(Exception):
    """A failed call: status (int), name ("ERR_TIMEOUT"), message (the library's, which names
    the rank, tensor or spec column concerned)."""

    def __init__(self, status, message):
        self.status = status
        self.name = STATUS_NAMES.get(status, "ERR_%d" % status)
        self.message = message
        super().__init__("%s: %s" % (self.name, message))


def _check(status):
    if status != 0:
        lib = _native.lib()
        msg = lib.reshard_last_error().decode(errors="replace")
        raise ReshardError(status, msg or lib.reshard_strerror(status).decode())


def _fail(name, message):
    raise ReshardError(STATUS[name], message)


def dtype_name(dtype):
    """The spec name ("bf16") of a spec name, a torch dtype or a numpy dtype."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    text = str(dtype)
    if text in _FROM_TORCH:
        return _FROM_TORCH[text]
    name = getattr(dtype, "name", None) or getattr(getattr(dtype, "dtype", None), "name", text)
    if name in _FROM_NUMPY:
        return _FROM_NUMPY[name]
    _fail("ERR_INVALID_ARG", "dtype %s has no reshard equivalent (one of %s)" % (text, DTYPES))


def _placement(p, ndim):
    if isinstance(p, str):
        return p
    kind = type(p).__name__
    dim = getattr(p, "dim", None)
    if isinstance(dim, int) and dim < 0:
        dim += ndim
    if kind == "Replicate":
        return "R"
    if kind == "_StridedShard":  # before Shard: torch derives it from Shard
        return "SS(%d,%d)" % (dim, p.split_factor)
    if kind == "Shard":
        return "S(%d)" % dim
    if kind == "Partial":
        _fail(
            "ERR_INVALID_ARG",
            "a Partial placement holds partial sums, not a shard: redistribute the DTensor to "
            "Shard or Replicate before a refit",
        )
    _fail("ERR_INVALID_ARG", "placement %r is not Replicate, Shard or _StridedShard" % (p,))


class Layout:
    """One side of a tensor: a spec (DESIGN.md section 4) parsed by the library."""

    def __init__(self, spec, world_size=0):
        lib = _native.lib()
        handle = ctypes.c_void_p()
        _check(lib.reshard_layout_parse(spec.encode(), world_size, ctypes.byref(handle)))
        self._h = handle
        info = _native.LayoutInfo()
        _check(lib.reshard_layout_info(self._h, ctypes.byref(info)))
        self.ndim = info.ndim
        self.shape = tuple(info.shape[: info.ndim])
        self.elem_size = info.elem_size
        self.nranks = info.nranks
        self.max_rank = info.max_rank
        self.spec = self._format()
        self.dtype = self.spec.split("dtype=")[1].split()[0]

    @classmethod
    def from_placements(cls, shape, dtype, ranks, placements, mesh_shape=None):
        """The layout of a DTensor-style description: global shape, dtype, the global ranks of
        the mesh (row-major), one placement per mesh dim (Replicate / Shard / _StridedShard
        objects, or spec strings such as "S(0)")."""
        ranks = [int(r) for r in ranks]
        mesh_shape = tuple(mesh_shape) if mesh_shape else (len(ranks),)
        place = ",".join(_placement(p, len(shape)) for p in placements)
        spec = "shape=%s dtype=%s ranks=%s mesh=%s place=%s" % (
            "x".join(str(int(n)) for n in shape),
            dtype_name(dtype),
            ",".join(str(r) for r in ranks),
            "x".join(str(int(n)) for n in mesh_shape),
            place,
        )
        return cls(spec)

    @classmethod
    def from_dtensor(cls, t):
        """The layout of a torch DTensor: its device_mesh (global ranks), placements, shape
        and dtype."""
        mesh = t.device_mesh.mesh
        return cls.from_placements(
            tuple(t.shape), t.dtype, mesh.flatten().tolist(), t.placements, tuple(mesh.shape)
        )

    def _format(self):
        lib = _native.lib()
        n = lib.reshard_layout_format(self._h, None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        lib.reshard_layout_format(self._h, buf, n + 1)
        return buf.value.decode()

    def shard_shape(self, rank):
        """The shape of rank's shard (zeros when it holds none)."""
        shape = (ctypes.c_int64 * 8)()
        numel = ctypes.c_int64()
        _check(
            _native.lib().reshard_layout_shard_shape(self._h, rank, shape, ctypes.byref(numel))
        )
        return tuple(shape[: self.ndim])

    def shard_index(self, rank, dim):
        """The global indices along tensor dim `dim` of rank's shard, in local order."""
        n = self.shard_shape(rank)[dim]
        out = (ctypes.c_int64 * max(n, 1))()
        _check(_native.lib().reshard_layout_shard_index(self._h, rank, dim, out))
        return list(out[:n])

    def shard_bytes(self, rank):
        """Bytes rank's buffer for this side must hold."""
        n = ctypes.c_size_t()
        _check(_native.lib().reshard_layout_shard_bytes(self._h, rank, ctypes.byref(n)))
        return n.value

    def shard_of(self, full, rank):
        """Rank's shard cut out of the whole tensor `full` (a numpy array): a test oracle and
        a way to fill source buffers."""
        import numpy as np

        index = [self.shard_index(rank, d) for d in range(self.ndim)]
        return np.ascontiguousarray(full[np.ix_(*index)])

    def close(self):
        if getattr(self, "_h", None):
            _native.lib().reshard_layout_destroy(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def __repr__(self):
        return "Layout(%r)" % self.spec


def unique_id():
    """A new rendezvous id (128 bytes) for Comm(); this process must create rank 0 (itself, or
    a child forked after this call)."""
    uid = _native.UniqueId()
    _check(_native.lib().reshard_get_unique_id(ctypes.byref(uid)))
    return ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid))


class Comm:
    """A communicator: Comm(unique_id(), rank, size), or Comm.from_env() under torchrun,
    mpirun or srun (MASTER_ADDR / MASTER_PORT)."""

    def __init__(self, uid, rank, size):
        if not isinstance(uid, (bytes, bytearray)) or len(uid) != 128:
            _fail("ERR_INVALID_ARG", "the unique id is the 128 bytes reshard.unique_id() made")
        raw = _native.UniqueId()
        ctypes.memmove(ctypes.addressof(raw), bytes(uid), 128)
        handle = ctypes.c_void_p()
        _check(_native.lib().reshard_comm_init_rank(ctypes.byref(raw), rank, size,
                                                    ctypes.byref(handle)))
        self._h = handle

    @classmethod
    def _wrap(cls, handle):
        c = cls.__new__(cls)
        c._h = handle
        return c

    @classmethod
    def from_env(cls):
        handle = ctypes.c_void_p()
        _check(_native.lib().reshard_comm_init_env(ctypes.byref(handle)))
        return cls._wrap(handle)

    @classmethod
    def from_nccl(cls, nccl_comm):
        """On the ranks of an existing NCCL communicator: an ncclComm_t as an integer address or
        a ctypes pointer (vLLM: PyNcclCommunicator(...).comm). Collective over its ranks; the
        NCCL communicator must outlive this one."""
        ptr = nccl_comm if isinstance(nccl_comm, int) else ctypes.cast(nccl_comm, ctypes.c_void_p).value
        if not ptr:
            _fail("ERR_INVALID_ARG", "from_nccl needs an ncclComm_t, got %r" % (nccl_comm,))
        handle = ctypes.c_void_p()
        _check(_native.lib().reshard_comm_init_nccl(ctypes.c_void_p(ptr), ctypes.byref(handle)))
        return cls._wrap(handle)

    @property
    def rank(self):
        return _native.lib().reshard_comm_rank(self._h)

    @property
    def size(self):
        return _native.lib().reshard_comm_size(self._h)

    def has_rank(self, rank):
        """False once a shrink left `rank` out."""
        return bool(_native.lib().reshard_comm_has_rank(self._h, rank))

    def barrier(self):
        _check(_native.lib().reshard_comm_barrier(self._h))

    def abort(self):
        """Stops an execution in flight here and on every rank it can reach (any thread)."""
        _check(_native.lib().reshard_comm_abort(self._h))

    def shrink(self, exclude):
        """A communicator of the ranks not in `exclude` (only they call it); ranks keep their
        numbers. This one is left as it is: close it after."""
        exclude = [int(r) for r in exclude]
        arr = (ctypes.c_int * max(len(exclude), 1))(*exclude)
        handle = ctypes.c_void_p()
        _check(_native.lib().reshard_comm_shrink(self._h, arr, len(exclude), ctypes.byref(handle)))
        return Comm._wrap(handle)

    def counters(self):
        """Bytes and messages this rank's transports moved: a dict."""
        c = _native.Counters()
        _check(_native.lib().reshard_comm_counters(self._h, ctypes.byref(c)))
        return {name: getattr(c, name) for name, _ in c._fields_}

    def close(self):
        """Collective (unless the communicator failed); destroy its plans first."""
        if getattr(self, "_h", None):
            _native.lib().reshard_comm_destroy(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Manifest:
    """A whole model's tensors (DESIGN.md section 4): names and both layouts of each."""

    def __init__(self, path):
        handle = ctypes.c_void_p()
        _check(_native.lib().reshard_manifest_load(str(path).encode(), ctypes.byref(handle)))
        self._h = handle
        lib = _native.lib()
        self.world_size = lib.reshard_manifest_world_size(self._h)
        tensors = lib.reshard_manifest_tensors(self._h)
        self._tensors = tensors
        self.names = [tensors[i].name.decode() for i in range(lib.reshard_manifest_ntensors(self._h))]

    def close(self):
        if getattr(self, "_h", None):
            _native.lib().reshard_manifest_destroy(self._h)
            self._h = None

    def __del__(self):
        self.close()


def _buffer(obj, elem_size, writable, what):
    """(pointer, bytes, memory kind) of a numpy array, torch tensor, an object with
    __cuda_array_interface__ (device memory), a bytearray or None."""
    if obj is None:
        return None, 0, _native.MEM_HOST
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # torch
        if not obj.is_contiguous():
            _fail("ERR_INVALID_ARG", "%s is not contiguous: pass .contiguous()" % what)
        if obj.element_size() != elem_size:
            _fail("ERR_INVALID_ARG", "%s has %d-byte elements, the layout %d-byte ones"
                  % (what, obj.element_size(), elem_size))
        mem = _native.MEM_CUDA if obj.is_cuda else _native.MEM_HOST
        return obj.data_ptr(), obj.numel() * obj.element_size(), mem
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:  # CuPy, Numba and others: device memory
        itemsize = int(cai["typestr"][2:])
        shape = tuple(cai["shape"])
        strides = cai.get("strides")
        contiguous = [itemsize]
        for n in reversed(shape[1:]):
            contiguous.insert(0, contiguous[0] * n)
        if strides is not None and tuple(strides) != tuple(contiguous[: len(shape)]):
            _fail("ERR_INVALID_ARG", "%s is not C-contiguous" % what)
        ptr, readonly = cai["data"]
        if writable and readonly:
            _fail("ERR_INVALID_ARG", "%s is read-only" % what)
        if itemsize != elem_size:
            _fail("ERR_INVALID_ARG", "%s has %d-byte elements, the layout %d-byte ones"
                  % (what, itemsize, elem_size))
        nbytes = itemsize
        for n in shape:
            nbytes *= n
        return ptr, nbytes, _native.MEM_CUDA
    iface = getattr(obj, "__array_interface__", None)
    if iface is not None:  # numpy and friends
        flags = getattr(obj, "flags", None)
        if flags is not None and not flags["C_CONTIGUOUS"]:
            _fail("ERR_INVALID_ARG", "%s is not C-contiguous: pass np.ascontiguousarray" % what)
        ptr, readonly = iface["data"]
        if writable and readonly:
            _fail("ERR_INVALID_ARG", "%s is read-only" % what)
        itemsize = obj.dtype.itemsize
        if itemsize != elem_size:
            _fail("ERR_INVALID_ARG", "%s has %d-byte elements (%s), the layout %d-byte ones"
                  % (what, itemsize, obj.dtype, elem_size))
        return ptr, obj.nbytes, _native.MEM_HOST
    if isinstance(obj, (bytearray, memoryview)):
        view = memoryview(obj)
        if writable and view.readonly:
            _fail("ERR_INVALID_ARG", "%s is read-only" % what)
        if view.nbytes == 0:
            return None, 0, _native.MEM_HOST
        holder = (ctypes.c_char * view.nbytes).from_buffer(view) if not view.readonly else None
        if holder is None:
            _fail("ERR_INVALID_ARG", "%s: pass a bytearray, not read-only bytes" % what)
        return ctypes.addressof(holder), view.nbytes, _native.MEM_HOST
    _fail("ERR_INVALID_ARG", "%s is a %s: pass a numpy array, a torch tensor, a bytearray or None"
          % (what, type(obj).__name__))


def _stream_handle(stream, torch_cuda):
    """The cudaStream_t to pass, or None for a plain execute: an explicit stream (an int, or
    an object with .cuda_stream as torch's), else torch's current stream for CUDA tensors."""
    if stream is not None:
        return int(getattr(stream, "cuda_stream", stream))
    if torch_cuda:
        import torch

        return int(torch.cuda.current_stream().cuda_stream)
    return None


class Plan:
    """A collective plan on a communicator: Plan(comm, [(name, src, dst), ...]) with Layouts or
    spec strings, or Plan.from_manifest(comm, path). Every rank passes the same tensors."""

    def __init__(self, comm, tensors, algo="reshard", _manifest=None):
        self._comm = comm
        self._manifest = _manifest
        if _manifest is not None:
            self.names = list(_manifest.names)
            arr = _manifest._tensors
            n = len(self.names)
            self._layouts = []
        else:
            if hasattr(tensors, "items"):  # {name: (src, dst)}
                items = [(name, sd[0], sd[1]) for name, sd in tensors.items()]
            else:  # [(name, src, dst)]
                items = [tuple(t) for t in tensors]
            self._layouts = [
                (name, s if isinstance(s, Layout) else Layout(s), d if isinstance(d, Layout)
                 else Layout(d))
                for name, s, d in items
            ]
            self.names = [name for name, _, _ in self._layouts]
            n = len(self._layouts)
            arr = (_native.TensorT * max(n, 1))()
            for i, (name, s, d) in enumerate(self._layouts):
                arr[i] = _native.TensorT(name.encode(), s._h, d._h)
        if algo not in _native.ALGOS:
            _fail("ERR_INVALID_ARG", "algo %r is not one of %s" % (algo, sorted(_native.ALGOS)))
        cfg = _native.PlanConfig(ctypes.sizeof(_native.PlanConfig), 0, 0, _native.ALGOS[algo])
        handle = ctypes.c_void_p()
        _check(_native.lib().reshard_comm_plan_create(comm._h, arr, n, ctypes.byref(cfg),
                                                      ctypes.byref(handle)))
        self._h = handle
        lib = _native.lib()
        self._elem = []
        if _manifest is not None:
            info = _native.LayoutInfo()
            for i in range(n):
                _check(lib.reshard_layout_info(arr[i].dst, ctypes.byref(info)))
                self._elem.append(info.elem_size)
        else:
            self._elem = [d.elem_size for _, _, d in self._layouts]

    @classmethod
    def from_manifest(cls, comm, path, algo="reshard"):
        m = path if isinstance(path, Manifest) else Manifest(path)
        return cls(comm, None, algo, _manifest=m)

    @property
    def hash(self):
        return _native.lib().reshard_plan_hash(self._h)

    def stats(self):
        """The plan's figures (bytes over the network, lower bounds, ops): a dict."""
        s = _native.PlanStats()
        _check(_native.lib().reshard_plan_stats(self._h, ctypes.byref(s), None))
        return {name: getattr(s, name) for name, _ in s._fields_}

    def _side(self, bufs, i):
        if bufs is None:
            return None
        if hasattr(bufs, "get"):
            return bufs.get(self.names[i])
        return bufs[i]

    def execute(self, src, dst, stream=None):
        """Moves every tensor. src and dst: sequences in the plan's tensor order, or mappings
        by name; None (or a missing name) where this rank holds or receives nothing. stream:
        a CUDA stream (torch.cuda.Stream, or its handle as an int) to order the refit on; with
        torch CUDA tensors the current stream is used. With RESHARD_EXECUTOR=nccl the refit is
        enqueued there and completes with the stream."""
        n = len(self.names)
        for side, bufs in (("src", src), ("dst", dst)):
            if bufs is not None and hasattr(bufs, "get"):
                unknown = sorted(set(bufs) - set(self.names))
                if unknown:
                    _fail("ERR_INVALID_ARG", "%s names tensors the plan does not have: %s"
                          % (side, ", ".join(unknown[:5])))
            elif bufs is not None and len(bufs) != n:
                _fail("ERR_INVALID_ARG", "%s has %d buffers for %d tensors" % (side, len(bufs), n))
        arr = (_native.BuffersT * max(n, 1))()
        torch_cuda = False
        for i, name in enumerate(self.names):
            s, sb, smem = _buffer(self._side(src, i), self._elem[i], False,
                                  "source of '%s'" % name)
            d, db, dmem = _buffer(self._side(dst, i), self._elem[i], True,
                                  "destination of '%s'" % name)
            mem = _native.MEM_CUDA if _native.MEM_CUDA in (smem, dmem) else _native.MEM_HOST
            arr[i] = _native.BuffersT(s, sb, d, db, mem)
            for obj in (self._side(src, i), self._side(dst, i)):
                torch_cuda = torch_cuda or bool(getattr(obj, "is_cuda", False))
        handle = _stream_handle(stream, torch_cuda)
        lib = _native.lib()
        if handle is None:
            _check(lib.reshard_plan_execute(self._h, arr))
        else:
            _check(lib.reshard_plan_execute_stream(self._h, arr, ctypes.c_void_p(handle)))

    def refit(self, named_src, named_dst, stream=None):
        """execute() by tensor name: a whole model's {name: source shard} and
        {name: destination shard}."""
        self.execute(dict(named_src), dict(named_dst), stream)

    def outcome(self):
        """After an execute (failed or not): {name: "complete" | "torn" | "untouched" |
        "none"} for this rank's destinations."""
        n = len(self.names)
        states = (ctypes.c_int * max(n, 1))()
        _check(_native.lib().reshard_plan_outcome(self._h, states))
        return {self.names[i]: _native.TENSOR_STATES[states[i]] for i in range(n)}

    def close(self):
        if getattr(self, "_h", None):
            _native.lib().reshard_plan_destroy(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def refit(plan, named_src, named_dst, stream=None):
    """plan.refit: moves a whole model by tensor name."""
    plan.refit(named_src, named_dst, stream)

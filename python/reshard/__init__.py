# SPDX-License-Identifier: Apache-2.0
"""reshard from Python: layouts, communicators, plans and refits over libnccl-net-reshard.so.

    import numpy as np, reshard
    comm = reshard.Comm.from_env()                       # torchrun / mpirun / srun variables
    src = reshard.Layout("shape=4096x1024 dtype=f32 ranks=0-3 mesh=2x2 place=R,S(0)")
    dst = reshard.Layout("shape=4096x1024 dtype=f32 ranks=4-7 place=S(1)")
    plan = reshard.Plan(comm, [("w", src, dst)])
    mine = np.zeros(dst.shard_shape(comm.rank), np.float32)
    plan.execute([src_shard_or_None], [mine])            # every refit step

Standard library only; numpy arrays, torch tensors and DTensors are taken by pointer, checked
against the layout (dtype, shape, strides) on every rank before any byte moves. Every failure
raises ReshardError with the library's status and message. docs/python.md has the whole story:
model helpers (reshard.models), the vLLM engine (reshard.vllm_engine), packaging.
"""
import contextlib
import ctypes
import threading
import weakref

from . import _buffers, _dtensor, _native
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
    if text in _buffers.FROM_TORCH:
        return _buffers.FROM_TORCH[text]
    name = getattr(dtype, "name", None) or getattr(getattr(dtype, "dtype", None), "name", text)
    if name in _buffers.FROM_NUMPY:
        return _buffers.FROM_NUMPY[name]
    _fail("ERR_INVALID_ARG", "dtype %s has no reshard equivalent (one of %s)" % (text, DTYPES))


def _view_items(spec):
    """The view items of a canonical spec: {"buffer": name, "offset": n, "view": shape,
    "strides": strides}, those present only."""
    items = {}
    for tok in spec.split():
        key, _, value = tok.partition("=")
        if key == "buffer":
            items[key] = value
        elif key == "offset":
            items[key] = int(value)
        elif key in ("view", "strides"):
            items[key] = tuple(int(n) for n in value.split("x"))
    return items


class Layout:
    """One side of a tensor: a spec (docs/layouts.md) parsed by the library."""

    def __init__(self, spec, world_size=0):
        if not isinstance(spec, str):
            _fail("ERR_INVALID_ARG", "a layout spec is a string, got %s" % type(spec).__name__)
        lib = _native.lib()
        handle = ctypes.c_void_p()
        _check(lib.reshard_layout_parse(spec.encode(), world_size, ctypes.byref(handle)))
        self._owned = True
        self._init(handle)

    def _init(self, handle):
        lib = _native.lib()
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
        self.view = _view_items(self.spec)

    @classmethod
    def _borrow(cls, handle):
        """A Layout over a handle that something else (a manifest) owns."""
        l = cls.__new__(cls)
        l._owned = False
        l._init(ctypes.c_void_p(handle))
        return l

    @classmethod
    def from_placements(cls, shape, dtype, ranks, placements, mesh_shape=None, strides=None):
        """The layout of a DTensor-style description: global shape, dtype, the global ranks of
        the mesh (row-major), one placement per mesh dim (Replicate / Shard / _StridedShard
        objects, or spec strings such as "S(0)"); strides: the local buffers' strides in
        elements (a strided view, the same on every rank), None when they are contiguous."""
        ranks = [int(r) for r in ranks]
        mesh_shape = tuple(mesh_shape) if mesh_shape else (len(ranks),)
        place = ",".join(_dtensor.placement(p, len(shape), _fail) for p in placements)
        spec = "shape=%s dtype=%s ranks=%s mesh=%s place=%s" % (
            "x".join(str(int(n)) for n in shape),
            dtype_name(dtype),
            ",".join(str(r) for r in ranks),
            "x".join(str(int(n)) for n in mesh_shape),
            place,
        )
        if strides is not None:
            spec += " strides=" + "x".join(str(int(n)) for n in strides)
        return cls(spec)

    @classmethod
    def from_dtensor(cls, t):
        """The layout of a torch DTensor: its device mesh (global ranks), placements (Shard,
        Replicate, _StridedShard), shard order, global shape and dtype. A non-contiguous local
        tensor gives a layout with its strides."""
        shape, dtype, ranks, mesh_shape, placements = _dtensor.describe(t, _fail)
        local = _buffers.local_tensor(t)
        strides = None
        if hasattr(local, "is_contiguous") and not local.is_contiguous():
            strides = tuple(local.stride())
        return cls.from_placements(shape, dtype, ranks, placements, mesh_shape, strides)

    def with_strides_of(self, tensor):
        """This layout with the strides of `tensor` (a rank's local buffer: a slice, a
        transpose, a column block of a fused weight), so that a refit reads or writes the
        tensor in place. Every rank's buffer must have these strides."""
        local = _buffers.local_tensor(tensor)
        if hasattr(local, "stride") and callable(local.stride):
            strides = tuple(local.stride())
        elif hasattr(local, "strides") and hasattr(local, "itemsize"):
            strides = tuple(s // local.itemsize for s in local.strides)
        else:
            _fail("ERR_INVALID_ARG", "with_strides_of takes a torch tensor or a numpy array, "
                  "got %s" % type(tensor).__name__)
        if len(strides) != self.ndim:
            _fail("ERR_INVALID_ARG", "with_strides_of: a %d-D tensor for a %d-D layout"
                  % (len(strides), self.ndim))
        base = " ".join(t for t in self.spec.split() if not t.startswith("strides="))
        return Layout(base + " strides=" + "x".join(str(s) for s in strides))

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
            _native.lib().reshard_layout_shard_shape(self._h, int(rank), shape, ctypes.byref(numel))
        )
        return tuple(shape[: self.ndim])

    def shard_index(self, rank, dim):
        """The global indices along tensor dim `dim` of rank's shard, in local order."""
        n = self.shard_shape(rank)[dim]
        out = (ctypes.c_int64 * max(n, 1))()
        _check(_native.lib().reshard_layout_shard_index(self._h, int(rank), dim, out))
        return list(out[:n])

    def shard_bytes(self, rank):
        """Bytes rank's buffer for this side must hold."""
        n = ctypes.c_size_t()
        _check(_native.lib().reshard_layout_shard_bytes(self._h, int(rank), ctypes.byref(n)))
        return n.value

    def shard_of(self, full, rank):
        """Rank's shard cut out of the whole tensor `full` (a numpy array, or a torch tensor
        of any dtype, a Parameter included): a test oracle and a way to fill source buffers.
        Returns the same kind, contiguous and detached."""
        if tuple(full.shape) != self.shape:
            _fail("ERR_INVALID_ARG", "shard_of: the whole tensor has shape %s, the layout %s"
                  % (tuple(full.shape), self.shape))
        index = [self.shard_index(rank, d) for d in range(self.ndim)]
        if hasattr(full, "index_select"):  # torch: no numpy round trip (bf16, Parameters)
            import torch

            out = full.detach()
            for d, idx in enumerate(index):
                out = out.index_select(d, torch.tensor(idx, dtype=torch.long,
                                                       device=out.device))
            return out.contiguous()
        import numpy as np

        return np.ascontiguousarray(full[np.ix_(*index)])

    def close(self):
        if getattr(self, "_h", None):
            if getattr(self, "_owned", True):
                _native.lib().reshard_layout_destroy(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def __repr__(self):
        return "Layout(%r)" % self.spec


class _Held:
    """A library handle that several threads may use while one of them closes it. Every call
    holds it (`with self._held() as h`); close() destroys it at once when no call holds it,
    else the last call to return does, so a close from another thread never frees what a
    call in flight uses. Once closed, calls raise ReshardError ERR_INVALID_ARG saying why."""

    _destroy = None  # the library's destroy function, by name

    def _own(self, handle):
        self._h = handle
        self._lock = threading.Lock()
        self._calls = 0
        self._closed = None  # why calls are refused, once closed

    @contextlib.contextmanager
    def _held(self):
        with self._lock:
            if self._closed is not None:
                _fail("ERR_INVALID_ARG", self._closed)
            self._calls += 1
            handle = self._h
        try:
            yield handle
        finally:
            with self._lock:
                self._calls -= 1
                handle = self._take() if self._closed is not None else None
            self._destroy_now(handle)

    def _take(self):
        """The handle, once nothing holds it, for the caller to destroy (under the lock)."""
        if self._calls or self._h is None:
            return None
        handle, self._h = self._h, None
        return handle

    def _destroy_now(self, handle):
        if handle is not None:
            getattr(_native.lib(), self._destroy)(handle)

    def _close(self, why):
        lock = getattr(self, "_lock", None)
        if lock is None:  # __init__ failed before the library made the handle
            return
        with lock:
            if self._closed is None:
                self._closed = why
            handle = self._take()
        self._destroy_now(handle)

    @property
    def closed(self):
        return getattr(self, "_closed", "never made") is not None


def _int_array(values):
    values = [int(v) for v in values]
    return (ctypes.c_int * max(len(values), 1))(*values), len(values)


def unique_id():
    """A new rendezvous id (128 bytes) for Comm(); this process must create rank 0 (itself, or
    a child forked after this call)."""
    uid = _native.UniqueId()
    _check(_native.lib().reshard_get_unique_id(ctypes.byref(uid)))
    return ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid))


class Comm(_Held):
    """A communicator: Comm(unique_id(), rank, size), or Comm.from_env() under torchrun,
    mpirun or srun (MASTER_ADDR / MASTER_PORT). close() closes its plans first (docs/python.md,
    "Lifetimes")."""

    _destroy = "reshard_comm_destroy"

    def __init__(self, uid, rank, size):
        if not isinstance(uid, (bytes, bytearray)) or len(uid) != 128:
            _fail("ERR_INVALID_ARG", "the unique id is the 128 bytes reshard.unique_id() made")
        raw = _native.UniqueId()
        ctypes.memmove(ctypes.addressof(raw), bytes(uid), 128)
        handle = ctypes.c_void_p()
        _check(_native.lib().reshard_comm_init_rank(ctypes.byref(raw), rank, size,
                                                    ctypes.byref(handle)))
        self._wrapped(handle)

    def _wrapped(self, handle):
        self._own(handle)
        self._plans = weakref.WeakSet()  # closed by close(), before the communicator

    @classmethod
    def _wrap(cls, handle):
        c = cls.__new__(cls)
        c._wrapped(handle)
        return c

    @classmethod
    def join(cls, join_id, rank, joiners):
        """A rank that was not in a communicator joins it: join_id from a member's
        grow_id(joiners), rank one of `joiners` (the number of a rank that left, or one past
        the size), the same list the members pass to grow(). Collective with their grow()."""
        if not isinstance(join_id, (bytes, bytearray)) or len(join_id) != 128:
            _fail("ERR_INVALID_ARG", "the join id is the 128 bytes a member's grow_id() made")
        raw = _native.UniqueId()
        ctypes.memmove(ctypes.addressof(raw), bytes(join_id), 128)
        arr, n = _int_array(joiners)
        handle = ctypes.c_void_p()
        _check(_native.lib().reshard_comm_join(ctypes.byref(raw), int(rank), arr, n,
                                               ctypes.byref(handle)))
        return cls._wrap(handle)

    @classmethod
    def from_env(cls):
        """Under torchrun, mpirun or srun: rank, size and rank 0's address from the launcher's
        variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, ...). Rank 0 listens on
        MASTER_PORT + 1, not MASTER_PORT (torchrun's own store holds that one): that port must
        be free on rank 0's host, or set RESHARD_BOOT_PORT to another. Collective."""
        handle = ctypes.c_void_p()
        _check(_native.lib().reshard_comm_init_env(ctypes.byref(handle)))
        return cls._wrap(handle)

    @classmethod
    def from_process_group(cls, group=None):
        """On the ranks of a torch.distributed process group (the default group when None):
        rank 0 of the group makes a fresh unique id and broadcasts it through the group
        itself; ranks and size are the group's. Collective over the group."""
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            _fail("ERR_INVALID_ARG", "from_process_group: torch.distributed is not initialized "
                  "(call init_process_group first)")
        group = group if group is not None else dist.group.WORLD
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        if rank < 0:
            _fail("ERR_INVALID_ARG", "from_process_group: this process is not in the group")
        box = [None]
        if rank == 0:
            try:
                box[0] = ("id", unique_id())
            except ReshardError as e:  # the others are told, not left waiting
                box[0] = ("error", e.status, e.message)
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
        if box[0][0] == "error":
            raise ReshardError(box[0][1], "rank 0 of the process group could not make a unique "
                               "id: %s" % box[0][2])
        return cls(box[0][1], rank, size)

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
        with self._held() as h:
            return _native.lib().reshard_comm_rank(h)

    @property
    def size(self):
        with self._held() as h:
            return _native.lib().reshard_comm_size(h)

    def has_rank(self, rank):
        """False once a shrink left `rank` out."""
        with self._held() as h:
            return bool(_native.lib().reshard_comm_has_rank(h, rank))

    def barrier(self):
        with self._held() as h:
            _check(_native.lib().reshard_comm_barrier(h))

    def abort(self):
        """Stops an execution in flight here and on every rank it can reach (any thread)."""
        with self._held() as h:
            _check(_native.lib().reshard_comm_abort(h))

    def shrink(self, exclude):
        """A communicator of the ranks not in `exclude` (only they call it); ranks keep their
        numbers. This one is left as it is: close it after."""
        exclude = [int(r) for r in exclude]
        arr = (ctypes.c_int * max(len(exclude), 1))(*exclude)
        handle = ctypes.c_void_p()
        with self._held() as h:
            _check(_native.lib().reshard_comm_shrink(h, arr, len(exclude), ctypes.byref(handle)))
        return Comm._wrap(handle)

    def grow_id(self, joiners):
        """The join id (128 bytes) to hand to the joiners for Comm.join: where the lowest
        member listens and a secret for this growth. Not collective: every member makes the
        same."""
        arr, n = _int_array(joiners)
        raw = _native.UniqueId()
        with self._held() as h:
            _check(_native.lib().reshard_comm_grow_id(h, arr, n, ctypes.byref(raw)))
        return ctypes.string_at(ctypes.addressof(raw), 128)

    def grow(self, joiners):
        """Collective over the members, with the joiners' Comm.join: a communicator of the
        members and the joiners (each the number of a rank that left, or one past the size),
        of a new membership epoch. This one is left as it is: close it after. A list naming a
        member, a number twice, or another list than the other members' raises
        ReshardError ERR_INVALID_ARG on every member, this communicator unchanged."""
        arr, n = _int_array(joiners)
        handle = ctypes.c_void_p()
        with self._held() as h:
            _check(_native.lib().reshard_comm_grow(h, arr, n, ctypes.byref(handle)))
        return Comm._wrap(handle)

    def leave(self):
        """Not collective: this rank leaves the communicator on purpose. The plans made on it
        are closed first, then it is gone here (as after close(), without waiting for the
        others), its sockets released. The others learn it at once: their call in flight, or
        their next, raises ReshardError ERR_REMOTE saying "rank R left the communicator", and
        their left() says R; they then shrink() it away. ERR_BUSY while another thread of
        this rank uses the communicator."""
        for plan in list(getattr(self, "_plans", ())):
            plan._close("the plan's communicator was left (Comm.leave closes its plans)")
        with self._lock:
            if self._closed is not None:
                _fail("ERR_INVALID_ARG", self._closed)
            if self._calls:
                _fail("ERR_BUSY", "Comm.leave: another thread is using the communicator")
            handle, self._h = self._h, None
            self._closed = "this rank left the communicator (Comm.leave)"
        _check(_native.lib().reshard_comm_leave(handle))

    def left(self):
        """The rank this rank heard leave the communicator on purpose (Comm.leave), or None.
        Never waits: an idle rank may poll it."""
        rank = ctypes.c_int(-1)
        with self._held() as h:
            _check(_native.lib().reshard_comm_left(h, ctypes.byref(rank)))
        return rank.value if rank.value >= 0 else None

    def counters(self):
        """Bytes and messages this rank's transports moved: a dict."""
        c = _native.Counters()
        with self._held() as h:
            _check(_native.lib().reshard_comm_counters(h, ctypes.byref(c)))
        return {name: getattr(c, name) for name, _ in c._fields_}

    def close(self):
        """Collective (unless the communicator failed): closes the plans made on it, then the
        communicator; later calls on either raise ReshardError ERR_INVALID_ARG. A plan
        executing in another thread finishes first, and its thread then closes the
        connections. Closing again does nothing."""
        for plan in list(getattr(self, "_plans", ())):
            plan._close("the plan's communicator was closed (Comm.close closes its plans)")
        self._close("the communicator was closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Manifest:
    """A whole model's tensors (docs/manifest.md): names and both layouts of each."""

    def __init__(self, path):
        handle = ctypes.c_void_p()
        _check(_native.lib().reshard_manifest_load(str(path).encode(), ctypes.byref(handle)))
        self._h = handle
        lib = _native.lib()
        self.world_size = lib.reshard_manifest_world_size(self._h)
        tensors = lib.reshard_manifest_tensors(self._h)
        self._tensors = tensors
        n = lib.reshard_manifest_ntensors(self._h)
        self.names = [tensors[i].name.decode() for i in range(n)]
        self.layouts = [(Layout._borrow(tensors[i].src), Layout._borrow(tensors[i].dst))
                        for i in range(n)]

    def close(self):
        if getattr(self, "_h", None):
            _native.lib().reshard_manifest_destroy(self._h)
            self._h = None

    def __del__(self):
        self.close()


def _bump_versions(tensors):
    """An in-place write tells autograd so by bumping the tensor's version counter; a refit
    writes behind torch's back, so it does the same (a backward that saved the old values then
    fails instead of using the new ones)."""
    tensors = [t for t in tensors if t is not None]
    if not tensors:
        return
    import torch

    bump = getattr(getattr(torch.autograd, "graph", None), "increment_version", None)
    for t in tensors:
        if bump is not None:
            bump(t)
        else:  # older torch: a write of nothing
            with torch.no_grad():
                t.add_(0)


def _stream_handle(stream, torch_cuda):
    """The cudaStream_t to pass, or None for a plain execute: an explicit stream (an int, or
    an object with .cuda_stream as torch's), else torch's current stream for CUDA tensors."""
    if stream is not None:
        return int(getattr(stream, "cuda_stream", stream))
    if torch_cuda:
        import torch

        return int(torch.cuda.current_stream().cuda_stream)
    return None


class Plan(_Held):
    """A collective plan on a communicator: Plan(comm, [(name, src, dst), ...]) with Layouts or
    spec strings, or Plan.from_manifest(comm, path). Every rank passes the same tensors.
    verify=True checks every execution that succeeded (as RESHARD_VERIFY=1 does): a tensor
    whose destinations differ from its sources fails it on every rank with ReshardError
    ERR_VERIFY naming the tensors. close() (or the end of a with block, or garbage collection)
    frees it, from any thread, also during an execute there: that execute finishes first."""

    _destroy = "reshard_plan_destroy"

    def __init__(self, comm, tensors, algo="reshard", _manifest=None, verify=False):
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
        cfg = _native.PlanConfig(ctypes.sizeof(_native.PlanConfig), 0, 0, _native.ALGOS[algo],
                                 1 if verify else 0)
        handle = ctypes.c_void_p()
        with comm._held() as ch:
            _check(_native.lib().reshard_comm_plan_create(ch, arr, n, ctypes.byref(cfg),
                                                          ctypes.byref(handle)))
            self._own(handle)
            comm._plans.add(self)
        if _manifest is not None:
            self._sides = list(_manifest.layouts)
        else:
            self._sides = [(s, d) for _, s, d in self._layouts]
        self._add_scales(n)
        self._wants = {}

    def _add_scales(self, n):
        """The scales tensors the plan adds after the caller's for FP8 destinations (quant=):
        named after their weights (x.weight -> x.weight_scale_inv), passed like any tensor.
        A weight quantized on the way has its scales computed: their source is None."""
        lib = _native.lib()
        with self._held() as ph:
            for i in range(n, lib.reshard_plan_ntensors(ph)):
                sides = []
                for side in (0, 1):
                    h = ctypes.c_void_p()
                    _check(lib.reshard_plan_tensor_layout(ph, i, side, ctypes.byref(h)))
                    layout = Layout.__new__(Layout)
                    layout._owned = True
                    layout._init(h)
                    sides.append(layout)
                self.names.append(lib.reshard_plan_tensor_name(ph, i).decode())
                self._sides.append(tuple(sides))

    @classmethod
    def from_manifest(cls, comm, path, algo="reshard", verify=False):
        m = path if isinstance(path, Manifest) else Manifest(path)
        return cls(comm, None, algo, _manifest=m, verify=verify)

    @property
    def hash(self):
        with self._held() as h:
            return _native.lib().reshard_plan_hash(h)

    def catch_up(self, joiners):
        """Collective over the communicator (every rank, the same joiners): the plan that brings
        the ranks that joined it (Comm.join / comm.grow), which hold no weights yet, to the
        version the other destination ranks hold since their last refit. Each joiner's shard
        comes from a replica that holds it, in its own domain first, else over the network
        once per domain; only a tensor whose shard no replica holds comes from the sources (the
        trainers), so for a replacement or a new replica the trainers send nothing: their part
        is two small votes. Execute it with the arguments this plan's execute() takes (the
        replicas' destination buffers are read, only the joiners' written): it moves full
        values (never deltas) and is not verified. Returns a Plan; close it after."""
        arr, n = _int_array(joiners)
        handle = ctypes.c_void_p()
        plan = Plan.__new__(Plan)
        plan._comm = self._comm
        plan._manifest = self._manifest
        plan._layouts = self._layouts
        plan.names = list(self.names)
        plan._sides = list(self._sides)  # the refit's: the library reads the replicas' dst
        plan._wants = {}
        with self._comm._held(), self._held() as h:
            _check(_native.lib().reshard_plan_catch_up(h, arr, n, None, ctypes.byref(handle)))
            plan._own(handle)
            self._comm._plans.add(plan)
        return plan

    def stats(self):
        """The plan's figures (bytes over the network, lower bounds, ops): a dict."""
        s = _native.PlanStats()
        with self._held() as h:
            _check(_native.lib().reshard_plan_stats(h, ctypes.byref(s), None))
        return {name: getattr(s, name) for name, _ in s._fields_}

    def _side(self, bufs, i):
        if bufs is None:
            return None
        if hasattr(bufs, "get"):
            return bufs.get(self.names[i])
        return bufs[i]

    def _buffers(self, src, dst):
        """The rank's buffers as the C API takes them, after checking each against its shard."""
        n = len(self.names)
        for side, bufs in (("src", src), ("dst", dst)):
            if bufs is not None and hasattr(bufs, "get"):
                unknown = sorted(set(bufs) - set(self.names))
                if unknown:
                    _fail("ERR_INVALID_ARG", "%s names tensors the plan does not have: %s"
                          % (side, ", ".join(unknown[:5])))
            elif bufs is not None and len(bufs) != n:
                _fail("ERR_INVALID_ARG", "%s has %d buffers for %d tensors" % (side, len(bufs), n))
        rank = self._comm.rank
        arr = (_native.BuffersT * max(n, 1))()
        held, problems, needs = [], [], []
        torch_cuda = False
        for i, name in enumerate(self.names):
            pair = []
            for k, (bufs, writable, what) in enumerate(
                    ((src, False, "source"), (dst, True, "destination"))):
                obj = self._side(bufs, i)
                want = self._wants.get((i, k))
                if want is None:  # once per plan: the rank's shard of each side
                    want = _buffers.Want(self._sides[i][k], rank, writable,
                                         "%s of '%s'" % (what, name))
                    self._wants[(i, k)] = want
                if want.numel:
                    needs.append((i, k))
                try:
                    b = _buffers.check(obj, want)
                except _buffers.Problem as e:
                    problems.append((i, k, str(e)))
                    b = _buffers.Buffer()
                pair.append(b)
                torch_cuda = torch_cuda or bool(getattr(_buffers.local_tensor(obj), "is_cuda",
                                                        False))
            held.append(pair)
        if problems:
            # Tell every rank through the start exchange: a needed buffer handed over empty
            # fails the execution everywhere before any byte moves.
            if not any((i, k) in needs for i, k, _ in problems) and needs:
                held[needs[0][0]][needs[0][1]] = _buffers.Buffer()
        for i, (s, d) in enumerate(held):
            mem = _native.MEM_CUDA if _native.MEM_CUDA in (s.mem, d.mem) else _native.MEM_HOST
            arr[i] = _native.BuffersT(s.ptr, s.nbytes, d.ptr, d.nbytes, mem)
        return arr, held, problems, torch_cuda

    def check_layouts(self, src, dst):
        """Collective, moving no weights: with both sides holding the same checkpoint (inference
        has just loaded the one training started from), compares every tensor's source and
        destination fingerprints. Returns None when every description agrees; else raises
        ReshardError ERR_VERIFY on every rank, naming the first tensors whose layouts disagree
        (with both layouts) and how many. src and dst as for execute(). The first thing to run
        when integrating a new model."""
        problems = None
        try:
            with self._held() as h:
                arr, held, problems, _ = self._buffers(src, dst)  # held keeps copies alive
                _check(_native.lib().reshard_plan_check_layouts(h, arr))
        except ReshardError as e:
            if problems:
                raise ReshardError(STATUS["ERR_BUFFER"], "%s (every rank was told: %s)"
                                   % (problems[0][2], e.message)) from None
            raise
        if problems:
            raise ReshardError(STATUS["ERR_BUFFER"], problems[0][2])

    def execute(self, src, dst, stream=None):
        """Moves every tensor. src and dst: sequences in the plan's tensor order, or mappings
        by name; None (or a missing name) where this rank holds or receives nothing. A buffer
        is a torch tensor (a DTensor: its local tensor), a numpy array, an object with
        __cuda_array_interface__ or a bytearray, of the layout's dtype and of the shard's shape
        (or flat, with exactly its elements); a strided one needs a layout with its strides
        (Layout.with_strides_of), except that a strided source is read through a copy. A bad
        buffer on any rank fails every rank before any byte moves (ReshardError ERR_BUFFER,
        naming the rank and tensor). stream: a CUDA stream (torch.cuda.Stream, or its handle as
        an int) to order the refit on; with torch CUDA tensors the current stream is used.
        With RESHARD_EXECUTOR=nccl the refit is enqueued there and completes with the stream.
        Torch destinations have their version counter bumped, as an in-place write does."""
        lib = _native.lib()
        problems = None
        try:
            with self._held() as h:
                arr, held, problems, torch_cuda = self._buffers(src, dst)
                handle = _stream_handle(stream, torch_cuda)
                if handle is None:
                    _check(lib.reshard_plan_execute(h, arr))
                else:
                    _check(lib.reshard_plan_execute_stream(h, arr, ctypes.c_void_p(handle)))
        except ReshardError as e:
            if problems:
                raise ReshardError(STATUS["ERR_BUFFER"], "%s (every rank was told: %s)"
                                   % (problems[0][2], e.message)) from None
            raise
        if problems:  # this rank needed nothing: the others went on, it still fails
            raise ReshardError(STATUS["ERR_BUFFER"], problems[0][2])
        _bump_versions(d.tensor for _, d in held)

    def refit(self, named_src, named_dst, stream=None):
        """execute() by tensor name: a whole model's {name: source shard} and
        {name: destination shard}."""
        self.execute(dict(named_src), dict(named_dst), stream)

    def outcome(self):
        """After an execute (failed or not): {name: "complete" | "torn" | "untouched" |
        "none"} for this rank's destinations."""
        n = len(self.names)
        states = (ctypes.c_int * max(n, 1))()
        with self._held() as h:
            _check(_native.lib().reshard_plan_outcome(h, states))
        return {self.names[i]: _native.TENSOR_STATES[states[i]] for i in range(n)}

    def close(self):
        """Frees the plan (not collective); later calls raise ReshardError ERR_INVALID_ARG.
        From another thread during an execute: that execute finishes, then frees it."""
        self._close("the plan was closed")

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def refit(plan, named_src, named_dst, stream=None):
    """plan.refit: moves a whole model by tensor name."""
    plan.refit(named_src, named_dst, stream)

# SPDX-License-Identifier: Apache-2.0
"""A refit's buffers, checked against the layout before any byte moves.

Each buffer (a torch tensor, a DTensor, a numpy array, an object with
__cuda_array_interface__, a bytearray or None) is checked against the shard its rank holds:
the dtype equals the layout's, the shape equals the shard's (or the buffer is flat and holds
exactly the shard's elements), and a strided buffer's strides are the layout's own. What the
checks find is a Problem, not an exception: Plan.execute tells every rank through the
library's start exchange before it raises.
"""
from . import _native

# spec dtype names of torch dtypes, numpy dtype names and array-interface type strings
FROM_TORCH = {
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
FROM_NUMPY = {
    "bfloat16": "bf16",  # ml_dtypes
    "float8_e4m3fn": "fp8e4m3",
    "float8_e5m2": "fp8e5m2",
    "float16": "f16",
    "float32": "f32",
    "float64": "f64",
    "int8": "i8",
    "uint8": "u8",
    "int32": "i32",
    "int64": "i64",
}
FROM_TYPESTR = {"f2": "f16", "f4": "f32", "f8": "f64", "i1": "i8", "u1": "u8", "i4": "i32",
                "i8": "i64"}


class Problem(Exception):
    """A buffer that cannot be used: the sentence that says why and what works."""


class Buffer:
    """What the library is handed for one buffer: pointer, bytes, memory kind; `keep` holds
    any copy made for it until the execution returns, `tensor` the torch tensor written."""

    def __init__(self, ptr=None, nbytes=0, mem=_native.MEM_HOST, keep=None, tensor=None):
        self.ptr, self.nbytes, self.mem, self.keep, self.tensor = ptr, nbytes, mem, keep, tensor


def local_tensor(obj):
    """A DTensor's local tensor (the storage the refit reads or writes); anything else as is."""
    if hasattr(obj, "to_local") and hasattr(obj, "device_mesh") and hasattr(obj, "placements"):
        local = getattr(obj, "_local_tensor", None)
        return local if local is not None else obj.to_local()
    return obj


def _span(shape, strides):
    """Elements from the first to one past the last element a strided view reaches."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides))


def contiguous_strides(shape):
    out, step = [], 1
    for n in reversed(shape):
        out.insert(0, step)
        step *= max(n, 1)
    return tuple(out)


def same_strides(shape, a, b):
    """Strides that address the same elements (dims of extent 1 may carry any stride)."""
    return all(n <= 1 or x == y for n, x, y in zip(shape, a, b))


class Want:
    """What one rank's buffer of one side of a tensor must be."""

    def __init__(self, layout, rank, writable, what):
        self.layout, self.rank, self.writable, self.what = layout, rank, writable, what
        self.shape = tuple(layout.shard_shape(rank)) if rank is not None else None
        self.numel = 1
        for n in self.shape or ():
            self.numel *= n
        self.strides = layout.view.get("strides")
        self.shared = any(k in layout.view for k in ("buffer", "view", "offset"))

    def fail(self, sentence):
        raise Problem("%s on rank %s %s" % (self.what, self.rank, sentence))


def check(obj, want):
    """The Buffer for obj, or a Problem saying why obj cannot serve as `want`."""
    obj = local_tensor(obj)
    if obj is None:
        return Buffer()
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):
        return _torch(obj, want)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _array_interface(obj, cai, want, _native.MEM_CUDA)
    iface = getattr(obj, "__array_interface__", None)
    if iface is not None:
        return _array_interface(obj, iface, want, _native.MEM_HOST)
    if isinstance(obj, (bytearray, memoryview, bytes)):
        return _bytes(obj, want)
    want.fail("is a %s: pass a torch tensor, a DTensor, a numpy array, a bytearray or None"
              % type(obj).__name__)


def _dtype(want, name, shown):
    if name is None:
        want.fail("has dtype %s, which reshard has no name for (the layout's is %s)"
                  % (shown, want.layout.dtype))
    if name != want.layout.dtype:
        want.fail("has dtype %s, the layout's is %s: cast it first (bytes are not converted)"
                  % (shown, want.layout.dtype))


def _shape(want, shape, strides, elem):
    """(bytes to hand over, copy needed) for a buffer of this shape and these strides (in
    elements), or a Problem."""
    shape, strides = tuple(shape), tuple(strides)
    numel = 1
    for n in shape:
        numel *= n
    if want.shape is None:  # a rank outside this side: nothing is read or written
        if numel:
            want.fail("holds %d elements but the rank is not on this side of the tensor: pass "
                      "None" % numel)
        return 0, False
    contiguous = same_strides(shape, strides, contiguous_strides(shape))
    if want.shared:  # a buffer shared by several tensors (buffer=, view=, offset=)
        if not contiguous:
            want.fail("is not contiguous: a layout with buffer, view or offset items takes the "
                      "whole buffer, contiguous, from its start")
        return numel * elem, False
    if want.numel == 0:
        if numel:
            want.fail("holds %d elements but the rank's shard is empty: pass None" % numel)
        return 0, False
    flat = len(shape) == 1 and numel == want.numel and contiguous
    if shape != want.shape and not flat:
        want.fail("has shape %s, its shard has shape %s (or pass a flat buffer of exactly %d "
                  "elements)" % (_fmt(shape), _fmt(want.shape), want.numel))
    if want.strides is not None:
        if flat and shape != want.shape:
            want.fail("is flat but the layout has strides=%s: pass the strided tensor itself"
                      % "x".join(map(str, want.strides)))
        if not same_strides(shape, strides, want.strides):
            want.fail("has strides %s, the layout strides=%s: build the layout with "
                      "Layout.with_strides_of(tensor)" % (_fmt(strides),
                                                          "x".join(map(str, want.strides))))
        return _span(shape, strides) * elem, False
    if contiguous:
        return numel * elem, False
    if any(s < 0 for s in strides):
        want.fail("has negative strides: pass a copy with positive strides")
    if want.writable:
        want.fail("is not contiguous (strides %s): a contiguous copy would be written instead "
                  "of it; make the layout with Layout.with_strides_of(tensor) so the refit "
                  "writes the view in place" % _fmt(strides))
    return numel * elem, True  # a source: a contiguous copy reads the same values


def _fmt(t):
    return "(" + ", ".join(str(n) for n in t) + ("," if len(t) == 1 else "") + ")"


def _torch(t, want):
    if str(t.layout) != "torch.strided":
        want.fail("is a %s tensor: pass a dense (strided) tensor, e.g. t.to_dense()"
                  % str(t.layout).replace("torch.", ""))
    if t.device.type == "meta":
        want.fail("is on the meta device: it has no storage to read or write")
    _dtype(want, FROM_TORCH.get(str(t.dtype)), str(t.dtype))
    if want.writable and t.grad_fn is not None:
        want.fail("is a non-leaf tensor with a grad_fn (%s): a refit would overwrite it behind "
                  "autograd's back; pass the leaf (a parameter) or t.detach()"
                  % type(t.grad_fn).__name__)
    nbytes, copy = _shape(want, t.shape, t.stride(), t.element_size())
    mem = _native.MEM_CUDA if t.is_cuda else _native.MEM_HOST
    if nbytes == 0:
        return Buffer(tensor=t if want.writable else None)
    if copy:
        c = t.detach().contiguous()
        return Buffer(c.data_ptr(), nbytes, mem, keep=c)
    return Buffer(t.data_ptr(), nbytes, mem, tensor=t if want.writable else None)


def _array_interface(obj, iface, want, mem):
    typestr = iface["typestr"]
    itemsize = int(typestr[2:])
    if mem == _native.MEM_HOST and hasattr(obj, "dtype"):
        name = getattr(obj.dtype, "name", str(obj.dtype))
        _dtype(want, FROM_NUMPY.get(name), name)
    elif typestr[1:] in FROM_TYPESTR:
        _dtype(want, FROM_TYPESTR[typestr[1:]], typestr)
    elif itemsize != want.layout.elem_size:  # bf16 and fp8 have no standard type string
        want.fail("has %d-byte elements (%s), the layout's %s has %d-byte ones"
                  % (itemsize, typestr, want.layout.dtype, want.layout.elem_size))
    shape = tuple(iface["shape"])
    strides = iface.get("strides")
    if strides is None:
        strides = contiguous_strides(shape)
    else:
        if any(s % itemsize for s in strides):
            want.fail("has strides that are not whole elements: pass a contiguous copy")
        strides = tuple(s // itemsize for s in strides)
    ptr, readonly = iface["data"]
    if want.writable and readonly:
        want.fail("is read-only")
    nbytes, copy = _shape(want, shape, strides, itemsize)
    if nbytes == 0:
        return Buffer()
    if copy:
        if mem != _native.MEM_HOST:
            want.fail("is not contiguous: pass a contiguous copy")
        import numpy as np

        c = np.ascontiguousarray(obj)
        return Buffer(c.ctypes.data, nbytes, mem, keep=c)
    return Buffer(ptr, nbytes, mem)


def _bytes(obj, want):
    import ctypes

    view = memoryview(obj)
    if want.writable and view.readonly:
        want.fail("is read-only")
    if view.nbytes == 0:
        _shape(want, (0,), (1,), 1)
        return Buffer()
    need = want.layout.shard_bytes(want.rank) if want.shape is not None else 0
    if view.nbytes != need and not want.shared:
        want.fail("holds %d bytes, its shard %d: a raw buffer must hold exactly its shard"
                  % (view.nbytes, need))
    if view.readonly:  # bytes: read through a pointer to its data
        holder = ctypes.c_char_p(bytes(view))
        return Buffer(ctypes.cast(holder, ctypes.c_void_p).value, view.nbytes, keep=holder)
    holder = (ctypes.c_char * view.nbytes).from_buffer(view)
    return Buffer(ctypes.addressof(holder), view.nbytes, keep=holder)

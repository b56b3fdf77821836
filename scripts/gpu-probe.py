#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""usage: scripts/gpu-probe.py [-h]

What this machine and its sandbox allow, for scripts/gpu-check.sh: one line per capability,
"NAME STATE DETAIL", STATE being ok, refused (the call exists and the sandbox or the system
says no), absent (nothing to try it on), or unknown (the probe itself died: a driver that
cannot be loaded into Python, such as a sanitizer build of the stand-in). Each probe is the smallest use of the call the
library makes, between two processes of this user, the second a child of the first:

  cma       process_vm_writev into the child (cross-memory attach: host-memory fan-out)
  pidfd     pidfd_open + pidfd_getfd of one of the child's descriptors (cuMemCreate sharing)
  cuda      libcuda loads (RESHARD_CUDA_LIB, else libcuda.so.1), cuInit, a device, a context
  cuda-ipc  cuIpcGetMemHandle here, cuIpcOpenMemHandle in a fresh process (cuMemAlloc sharing)
  vmm-fd    cuMemCreate with a POSIX descriptor, exported here, imported in a fresh process
  torch     import torch (the DTensor check)
  numpy     import numpy (the Python tests)

Exit status 0 (what was refused is in the lines, not the status); 2 for bad usage."""
import ctypes
import os
import subprocess
import sys

libc = ctypes.CDLL(None, use_errno=True)
SYS_PIDFD_OPEN, SYS_PIDFD_GETFD = 434, 438  # x86_64 and aarch64 alike
PR_SET_PTRACER = 0x59616D61


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def say(name, state, detail=""):
    print(f"{name} {state} {detail}".rstrip(), flush=True)


def errno_text():
    e = ctypes.get_errno()
    return f"{os.strerror(e)} (errno {e})"


def with_child(body):
    """Forks a child holding a buffer and /dev/null open, lets body(pid, buf, fd) act on it,
    and returns (body's result, whether the child saw its buffer change)."""
    buf = ctypes.create_string_buffer(b"before", 64)
    fd = os.open("/dev/null", os.O_RDONLY)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: let the parent attach, wait, report what it sees
        libc.prctl(PR_SET_PTRACER, os.getppid(), 0, 0, 0)
        os.write(ready_w, b"r")
        os.read(go_r, 1)
        os._exit(0 if buf.value == b"written" else 3)
    os.read(ready_r, 1)
    try:
        result = body(pid, buf, fd)
    finally:
        os.write(go_w, b"g")
        _, status = os.waitpid(pid, 0)
        for d in (fd, ready_r, ready_w, go_r, go_w):
            os.close(d)
    return result, os.waitstatus_to_exitcode(status) == 0


def probe_cma():
    def write(pid, buf, _fd):
        data = ctypes.create_string_buffer(b"written", 8)
        local = IoVec(ctypes.cast(data, ctypes.c_void_p), 8)
        remote = IoVec(ctypes.cast(buf, ctypes.c_void_p), 8)
        libc.process_vm_writev.restype = ctypes.c_ssize_t
        n = libc.process_vm_writev(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        return n, errno_text()

    (n, why), seen = with_child(write)
    if n == 8 and seen:
        say("cma", "ok")
    elif n == 8:
        say("cma", "refused", "process_vm_writev returned but the child saw nothing")
    else:
        say("cma", "refused", f"process_vm_writev: {why}")


def probe_pidfd():
    def take(pid, _buf, fd):
        libc.syscall.restype = ctypes.c_long
        pfd = libc.syscall(SYS_PIDFD_OPEN, pid, 0)
        if pfd < 0:
            return f"pidfd_open: {errno_text()}"
        got = libc.syscall(SYS_PIDFD_GETFD, ctypes.c_int(pfd), ctypes.c_int(fd), 0)
        why = errno_text()
        os.close(pfd)
        if got < 0:
            return f"pidfd_getfd: {why}"
        os.close(got)
        return None

    why, _ = with_child(take)
    say("pidfd", "ok" if why is None else "refused", why or "")


# ---- CUDA, through the driver API as the library reaches it ----

def cuda_lib():
    name = os.environ.get("RESHARD_CUDA_LIB") or "libcuda.so.1"
    return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)


def cuda_context(cu):
    """cuInit, device 0, its primary context made current: None, or why not."""
    for call, args in (("cuInit", (0,)),):
        r = getattr(cu, call)(*args)
        if r:
            return f"{call}: CUDA error {r}"
    n = ctypes.c_int(0)
    r = cu.cuDeviceGetCount(ctypes.byref(n))
    if r or n.value < 1:
        return f"cuDeviceGetCount: CUDA error {r}, {n.value} devices"
    dev, ctx = ctypes.c_int(0), ctypes.c_void_p()
    r = cu.cuDeviceGet(ctypes.byref(dev), 0)
    r = r or cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    r = r or cu.cuCtxSetCurrent(ctx)
    return f"device 0 context: CUDA error {r}" if r else None


def child(mode, arg, pass_fds=()):
    """Runs this script in a fresh process (no CUDA state inherited) for the importing half."""
    p = subprocess.run([sys.executable, os.path.abspath(__file__), mode, arg],
                       capture_output=True, text=True, timeout=60, pass_fds=pass_fds)
    return p.returncode, (p.stdout + p.stderr).strip()


def probe_cuda():
    try:
        cu = cuda_lib()
    except OSError as e:
        say("cuda", "absent", str(e))
        return None
    why = cuda_context(cu)
    if why:
        say("cuda", "absent", why)
        return None
    name = ctypes.create_string_buffer(128)
    detail = ""
    if hasattr(cu, "cuDeviceGetName") and not cu.cuDeviceGetName(name, 128, 0):
        detail = name.value.decode(errors="replace")
    ver = ctypes.c_int(0)
    if hasattr(cu, "cuDriverGetVersion") and not cu.cuDriverGetVersion(ctypes.byref(ver)):
        detail += f", driver API {ver.value // 1000}.{ver.value % 1000 // 10}"
    say("cuda", "ok", detail or os.environ.get("RESHARD_CUDA_LIB", "libcuda.so.1"))
    return cu


def probe_cuda_ipc(cu):
    ptr, handle = ctypes.c_uint64(0), ctypes.create_string_buffer(64)
    r = cu.cuMemAlloc_v2(ctypes.byref(ptr), 1 << 20)
    if r:
        say("cuda-ipc", "absent", f"cuMemAlloc: CUDA error {r}")
        return
    r = cu.cuIpcGetMemHandle(handle, ptr)
    if r:
        say("cuda-ipc", "refused", f"cuIpcGetMemHandle: CUDA error {r}")
    else:
        rc, out = child("--ipc-open", handle.raw.hex())
        say("cuda-ipc", "ok" if rc == 0 else "refused", "" if rc == 0 else out)
    cu.cuMemFree_v2(ptr)


def ipc_open(hexhandle):
    cu = cuda_lib()
    why = cuda_context(cu)
    if why:
        print(why)
        return 1
    ptr = ctypes.c_uint64(0)
    handle = IpcHandle.from_buffer_copy(bytes.fromhex(hexhandle))  # passed by value
    r = cu.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), handle, 1)
    if r:
        print(f"cuIpcOpenMemHandle: CUDA error {r}")
        return 1
    cu.cuIpcCloseMemHandle(ptr)
    return 0


class IpcHandle(ctypes.Structure):  # CUipcMemHandle
    _fields_ = [("reserved", ctypes.c_char * 64)]


class MemProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int), ("loc_type", ctypes.c_int),
                ("loc_id", ctypes.c_int), ("win32", ctypes.c_void_p), ("compression", ctypes.c_ubyte),
                ("gdr", ctypes.c_ubyte), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


def probe_vmm(cu):
    prop = MemProp(type=1, handle_types=1, loc_type=1, loc_id=0)  # pinned, POSIX fd, device 0
    h, fd = ctypes.c_uint64(0), ctypes.c_int(-1)
    r = cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(2 << 20), ctypes.byref(prop),
                       ctypes.c_ulonglong(0))
    if r:
        say("vmm-fd", "refused", f"cuMemCreate with a POSIX descriptor: CUDA error {r}")
        return
    r = cu.cuMemExportToShareableHandle(ctypes.byref(fd), h, 1, ctypes.c_ulonglong(0))
    if r:
        say("vmm-fd", "refused", f"cuMemExportToShareableHandle: CUDA error {r}")
    else:
        rc, out = child("--vmm-import", str(fd.value), pass_fds=(fd.value,))
        say("vmm-fd", "ok" if rc == 0 else "refused", "" if rc == 0 else out)
        os.close(fd.value)
    cu.cuMemRelease(h)


def vmm_import(fd):
    cu = cuda_lib()
    why = cuda_context(cu)
    if why:
        print(why)
        return 1
    h = ctypes.c_uint64(0)
    r = cu.cuMemImportFromShareableHandle(ctypes.byref(h), ctypes.c_void_p(int(fd)), 1)
    if r:
        print(f"cuMemImportFromShareableHandle: CUDA error {r}")
        return 1
    cu.cuMemRelease(h)
    return 0


def probe_module(name, what):
    try:
        m = __import__(name)
        say(what, "ok", getattr(m, "__version__", ""))
    except Exception as e:  # an import that fails for any reason means the step cannot run
        say(what, "absent", f"{type(e).__name__}: {e}".splitlines()[0])


def main(argv):
    if len(argv) > 1 and argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) == 3 and argv[1] == "--ipc-open":
        return ipc_open(argv[2])
    if len(argv) == 3 and argv[1] == "--vmm-import":
        return vmm_import(argv[2])
    if len(argv) > 1 and argv[1] != "--cuda":
        print(f"gpu-probe: unexpected argument '{argv[1]}' (-h says more)", file=sys.stderr)
        return 2
    if len(argv) == 2 and argv[1] == "--cuda":
        cu = probe_cuda()
        if cu is None:
            say("cuda-ipc", "absent", "no CUDA device")
            say("vmm-fd", "absent", "no CUDA device")
        else:
            probe_cuda_ipc(cu)
            probe_vmm(cu)
        return 0
    probe_cma()
    probe_pidfd()
    # The driver in a process of its own: one that kills its process cannot take this one along.
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--cuda"],
                           capture_output=True, text=True, timeout=120)
        lines, why = p.stdout.splitlines(), f"the CUDA probe exited with {p.returncode}"
    except subprocess.TimeoutExpired:
        lines, why = [], "the CUDA probe did not end within 120 s"
    said = {line.split()[0] for line in lines if line.strip()}
    for line in lines:
        print(line, flush=True)
    for name in ("cuda", "cuda-ipc", "vmm-fd"):
        if name not in said:
            say(name, "unknown", why)
    probe_module("numpy", "numpy")
    probe_module("torch", "torch")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

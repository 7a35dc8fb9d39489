"""Patches to Triton's interpreter (triton 3.6) for checking this repo's CUDA forms on a CPU (debugging tools:
imported only under TRITON_INTERPRET=1, by tests and experiments/gpu; the package never imports it).

- `emulate_gpu_arithmetic()`: fp32 and bf16 `tl.dot` as a sequential multiply-add chain over K into an fp32
  accumulator (what the GPU's FMA lowering computes for "ieee"; float64 products rounded to fp32 per step; the
  interpreter's own bf16 dot multiplies the raw bits), `tl.fma` with one rounding, fp32 -> bf16 casts rounded to
  nearest even (the GPU's cvt.rn; the interpreter truncates), and loop bounds passed as kernel arguments under
  numpy >= 2. Tensor-core dots (tf32, bf16) are not emulated bit for bit: the chain is a
  row- and tile-independent stand-in with their accuracy or better, so bit-level checks (decode == the full
  pass's rows) test a kernel's logic here and its bits on the GPU.
- `check_bounds()`: a bounds checker, what compute-sanitizer's memcheck does on a GPU. Every load, store and
  atomic a kernel issues on an unmasked lane must fall inside the storage of one of that launch's tensor
  arguments; anything else raises `OutOfBounds` naming the kernel, the program id, the access and the nearest
  argument. On a GPU such an access reads or writes another allocation, or faults ("an illegal memory access")
  once it leaves the caching allocator's segments: a fault is asynchronous and names no kernel, this names it.

Both are context managers that undo their patches on exit; `interpreted(module)` imports a kernel module under
both TRITON_INTERPRET=1 and the arithmetic emulation (the interpreted tests' fixture). Set TRITON_INTERPRET=1
before importing zeromismatch (ops.device reads it at import) and before a kernel module is imported (its kernels
are decorated then).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading

import numpy as np
import triton.runtime.interpreter as interp

_dot = interp.InterpreterBuilder.create_dot


def _values(h) -> np.ndarray:
    """An interpreter tensor's values as float64 (bf16 is stored as its uint16 bits)."""
    if h.dtype == interp.tl.bfloat16:
        return (h.data.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return h.data.astype(np.float64)


def _sequential_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    if a.data.dtype != np.float32 and a.dtype != interp.tl.bfloat16:
        return _dot(self, a, b, d, input_precision, max_num_imprecise_acc)
    x, y = _values(a), _values(b)
    acc = d.data.astype(np.float32).copy()
    for i in range(x.shape[-1]):
        acc = (x[..., :, i : i + 1] * y[..., i : i + 1, :] + acc).astype(np.float32)
    return interp.TensorHandle(acc, d.dtype.scalar)


_cast = interp.InterpreterBuilder.cast_impl


def _cast_rne(self, src, dst_type):
    if src.dtype.scalar == interp.tl.float32 and dst_type.scalar == interp.tl.bfloat16:
        bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        nan = np.isnan(src.data)
        rounded[nan] = (bits[nan] >> 16).astype(np.uint16) | 0x40  # stays a (quiet) NaN
        return interp.TensorHandle(rounded, dst_type.scalar)
    return _cast(self, src, dst_type)


@contextlib.contextmanager
def _patched(owner, **attrs):
    saved = {k: getattr(owner, k) for k in attrs}
    for k, v in attrs.items():
        setattr(owner, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(owner, k, v)


@contextlib.contextmanager
def emulate_gpu_arithmetic():
    set_attr = interp._LangPatchScope.set_attr

    def set_attr_np2(self, obj, name, value):
        # numpy >= 2 refuses int() of a size-1 array: a loop bound passed as a kernel argument (range(0, n)) fails
        if name == "__index__":
            value = lambda t: int(t.handle.data.reshape(-1)[0])  # noqa: E731
        set_attr(self, obj, name, value)

    # tl.fma: one rounding (the interpreter's own rounds the product first)
    fma = lambda self, x, y, z: interp.TensorHandle(  # noqa: E731
        (x.data.astype(np.float64) * y.data + z.data).astype(np.float32), z.dtype.scalar)
    with _patched(interp.InterpreterBuilder, create_dot=_sequential_dot, create_fma=fma,
                  cast_impl=_cast_rne), \
            _patched(interp._LangPatchScope, set_attr=set_attr_np2):
        yield


@contextlib.contextmanager
def interpreted(module: str):
    """`module` (a kernel module's dotted name) with its kernels interpreted and GPU-order arithmetic: sets
    TRITON_INTERPRET=1 (read when a kernel is decorated and again at launch) for the duration, restored after;
    zeromismatch.ops.device read it at import, so the other ops keep their CPU forms. For tests that call one
    kernel module's functions directly."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        with emulate_gpu_arithmetic():
            yield importlib.import_module(module)
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


class OutOfBounds(RuntimeError):
    pass


class _Launch(threading.local):
    kernel = ""
    starts = np.zeros(0, np.uint64)  # storage ranges of the launch's tensor arguments, sorted by start
    ends = np.zeros(0, np.uint64)
    names: list = []


_launch = _Launch()
stats = {"launches": 0, "accesses": 0}


def _tensors(arg, name):
    if isinstance(arg, tuple):
        for i, a in enumerate(arg):
            yield from _tensors(a, f"{name}[{i}]")
    elif isinstance(arg, interp.TensorDescriptor):
        yield from _tensors(arg.base, name)
    elif hasattr(arg, "untyped_storage"):
        yield interp._unwrap_tensor(arg), name


def _check(ptrs, mask, nbytes, what):
    addr = np.asarray(ptrs.data).astype(np.uint64)
    if mask is not None:
        addr = addr[np.broadcast_to(np.asarray(mask.data, dtype=bool), addr.shape)]
    addr = addr.reshape(-1)
    if addr.size == 0:
        return
    stats["accesses"] += int(addr.size)
    i = np.searchsorted(_launch.starts, addr, side="right") - 1
    ok = (i >= 0) & (addr + np.uint64(nbytes) <= _launch.ends[np.maximum(i, 0)])
    if ok.all():
        return
    bad = addr[~ok]
    first = int(bad[0])
    near = min(range(len(_launch.names)), key=lambda j: min(abs(first - int(_launch.starts[j])),
                                                              abs(first - int(_launch.ends[j]))))
    start, end = int(_launch.starts[near]), int(_launch.ends[near])
    where = (f"{(first - end) // nbytes} elements past the end of" if first >= end
             else f"{(start - first) // nbytes} elements before")
    grid = interp.interpreter_builder.grid_idx
    raise OutOfBounds(f"{_launch.kernel} program {grid}: {what} of {bad.size} {nbytes}-byte elements outside every "
                      f"argument; the first is {where} {_launch.names[near]} ({(end - start)} bytes)")


@contextlib.contextmanager
def check_bounds():
    init = interp.GridExecutor._init_args_hst

    def init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init(self, args_dev, kwargs)
        ranges = {}
        named = list(zip(self.arg_names, args_hst)) + list(kwargs_hst.items())
        for name, arg in named:
            for t, label in _tensors(arg, name):
                s = t.untyped_storage()
                ranges.setdefault(s.data_ptr(), (s.data_ptr() + s.nbytes(), label))
        order = sorted(ranges)
        _launch.kernel = getattr(self.fn, "__name__", str(self.fn))
        _launch.starts = np.array(order, dtype=np.uint64)
        _launch.ends = np.array([ranges[s][0] for s in order], dtype=np.uint64)
        _launch.names = [ranges[s][1] for s in order]
        stats["launches"] += 1
        return args_hst, kwargs_hst

    def esize(ptrs):
        return max(1, ptrs.get_element_ty().primitive_bitwidth // 8)

    B = interp.InterpreterBuilder
    load, store, rmw, cas = B.create_masked_load, B.create_masked_store, B.create_atomic_rmw, B.create_atomic_cas

    def masked_load(self, ptrs, mask, other, *a, **kw):
        _check(ptrs, mask, esize(ptrs), "load")
        return load(self, ptrs, mask, other, *a, **kw)

    def masked_store(self, ptrs, value, mask, *a, **kw):
        _check(ptrs, mask, esize(ptrs), "store")
        return store(self, ptrs, value, mask, *a, **kw)

    def atomic_rmw(self, op, ptr, val, mask, *a):
        _check(ptr, mask, esize(ptr), "atomic")
        return rmw(self, op, ptr, val, mask, *a)

    def atomic_cas(self, ptr, cmp, val, *a):
        _check(ptr, None, esize(ptr), "atomic cas")
        return cas(self, ptr, cmp, val, *a)

    call = interp.GridExecutor.__call__

    def grid_call(self, *args, **kwargs):
        try:
            return call(self, *args, **kwargs)
        except interp.InterpreterError as e:  # the interpreter wraps a kernel's exception in its repr
            if isinstance(e.__cause__, OutOfBounds):
                raise e.__cause__ from None
            raise

    with _patched(interp.GridExecutor, _init_args_hst=init_args_hst, __call__=grid_call), \
            _patched(B, create_masked_load=masked_load, create_masked_store=masked_store,
                     create_atomic_rmw=atomic_rmw, create_atomic_cas=atomic_cas):
        yield

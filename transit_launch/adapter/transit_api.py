"""Bindings to libtransit.so's C API (shim/transit_api.h).

cffi in ABI mode when it is installed, ctypes otherwise: this module also runs inside
the training job's own Python (the adapter directory is put on its PYTHONPATH), which
may not have cffi. The shim is found in the process's global scope, where LD_PRELOAD
put it; without it every call is a no-op and `available` is False.
"""

import transit_rules  # generated from transit_launch/rules.py and shim/transit_api.h

HOT, MASTER, OPTIMIZER, SPARSE = (transit_rules.HINT_KINDS[k] for k in ("HOT", "MASTER", "OPTIMIZER", "SPARSE"))
CDEF = transit_rules.API_CDEF


def _load():
    try:
        from cffi import FFI

        ffi = FFI()
        ffi.cdef(CDEF)
        lib = ffi.dlopen(None)
        lib.transit_api_version()  # raises when the shim is not loaded
        return "cffi", lib, ffi
    except ImportError:
        pass
    except (AttributeError, OSError):
        return None, None, None
    import ctypes

    lib = ctypes.CDLL(None)
    try:
        lib.transit_api_version  # noqa: B018 (raises AttributeError without the shim)
    except AttributeError:
        return None, None, None
    lib.transit_hint.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
    lib.transit_policy.restype = ctypes.c_char_p
    lib.transit_write_stats.argtypes = [ctypes.c_char_p]
    version = lib.transit_api_version()  # an older libtransit.so (a site's TRANSIT_SHIM) lacks the newer calls
    if version >= 3:
        lib.transit_device_alloc.argtypes, lib.transit_device_alloc.restype = [ctypes.c_size_t], ctypes.c_size_t
        lib.transit_device_free.argtypes = [ctypes.c_size_t]
    if version >= 4:
        lib.transit_adapter_attach.restype = None
    if version >= 5:
        lib.transit_state_alloc.argtypes, lib.transit_state_alloc.restype = [ctypes.c_int], None
        lib.transit_host_state.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    if version >= 8:
        lib.transit_state_segments.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t]
        lib.transit_state_segments.restype = None
    if version >= 9:
        lib.transit_state_on_host.restype = None
    if version >= 10:
        lib.transit_adapter_stats.argtypes = [ctypes.c_char_p]
    return "ctypes", lib, None


backend, _lib, _ffi = _load()
available = _lib is not None


def active() -> bool:
    return bool(available and _lib.transit_active())


def policy() -> str:
    if not available:
        return "off"
    p = _lib.transit_policy()
    return _ffi.string(p).decode() if _ffi else p.decode()


def iteration() -> int:
    return _lib.transit_iteration() if available else 0


def since(version: int) -> bool:
    """Whether the loaded shim has the calls of this API version: the adapter may meet an
    older libtransit.so, and then does without them rather than failing."""
    return bool(available and _lib.transit_api_version() >= version)


def adapter_attach() -> bool:
    """Tell the shim the adapter reports iterations (transit_api.h, API version 4); False
    with an older libtransit.so, which then still guesses boundaries from kernels."""
    if not since(4):
        return False
    _lib.transit_adapter_attach()
    return True


def hint(ptr: int, size: int, kind: int) -> int:
    return _lib.transit_hint(ptr, size, kind) if available else -1


def apply() -> None:
    if available:
        _lib.transit_apply()


def write_stats(path: str | None = None) -> int:
    if not available:
        return -1
    arg = path.encode() if path else (_ffi.NULL if _ffi else None)
    return _lib.transit_write_stats(arg)


def device_alloc(size: int) -> int:
    """Plain device memory out of the GPU budget (transit_api.h, API version 3); 0 when there
    is none, also with an older shim (the adapter then stages nothing)."""
    return _lib.transit_device_alloc(size) if since(3) else 0


def device_free(ptr: int) -> int:
    return _lib.transit_device_free(ptr) if since(3) else -1


def state_alloc(on: bool) -> bool:
    """Mark (on) or unmark the calling thread's allocations as optimizer state (transit_api.h,
    API version 5); False with an older shim, whose state is then managed memory."""
    if not since(5):
        return False
    _lib.transit_state_alloc(1 if on else 0)
    return True


def host_state(ptr: int, size: int) -> bool:
    """Whether [ptr, ptr + size) is optimizer state in the shim's pinned host memory."""
    return bool(since(5) and _lib.transit_host_state(ptr, size))


def state_segments(sizes) -> bool:
    """The segments (cudaMalloc sizes, in order) the first step's optimizer state will be
    allocated in ([]: the first step is over; transit_api.h, API version 8): the shim makes host
    memory for them ready beforehand. False with an older shim, which makes it when the state is made."""
    if not since(8):
        return False
    sizes = [int(n) for n in sizes]
    if _ffi:
        _lib.transit_state_segments(_ffi.new("size_t[]", sizes) if sizes else _ffi.NULL, len(sizes))
    else:
        import ctypes

        _lib.transit_state_segments((ctypes.c_size_t * len(sizes))(*sizes) if sizes else None, len(sizes))
    return True


def state_on_host() -> bool:
    """The state the budget cannot hold is in the application's host memory (the host step;
    API version 9): the shim's advise probes no access for it. False with an older shim."""
    if not since(9):
        return False
    _lib.transit_state_on_host()
    return True


def adapter_stats(counters: dict) -> bool:
    """The adapter's counters into the shim's stats report, as its "adapter" object (API
    version 10). False with an older shim, or when the shim refuses them (transit_api.h)."""
    import json

    if not since(10):
        return False
    text = json.dumps(counters, sort_keys=True, allow_nan=False).encode()
    return _lib.transit_adapter_stats(text) == 0

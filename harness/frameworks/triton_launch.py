"""Launching a jitted Triton kernel with less host time than `kernel[grid](...)`.

Triton's `JITFunction.run` binds and specializes every argument, looks the compiled kernel up, checks the globals
it read and asks the driver for the current device and stream at every launch. `launch` does that once per
specialization: the first launch of one goes through `kernel[grid](...)`, which compiles the kernel or finds it;
the later ones call its compiled launcher, on the current device's current stream, as Triton's would, with each
tensor passed as its address (an integer): Triton's launcher would call the tensor's `data_ptr` and ask the driver
about that address (cuPointerGetAttribute) per tensor, per launch, where the specialization's key has read it. A
specialization is keyed by more than Triton keys it by (per tensor its dtype and whether its address is a multiple
of 16; per integer whether it is 1, whether a multiple of 16, and the width it is passed as, the width alone for
one the kernel does not specialize; the current device; every constexpr and option), so a kernel compiled for one
is never launched for another. Where Triton's launch hooks are set (a profiler), or a compiled kernel lacks what
this relies on (another Triton version, the interpreter), launches go through `kernel[grid](...)`; so they do
everywhere with XFALIGN_TRITON_LAUNCH=triton (read at the first launch, or the first after `forget`).
"""

from __future__ import annotations

import os
from typing import Any

# (kernel, specialization, constexprs and options) -> (the compiled kernel's launcher, its function, its packed
# metadata, the constexprs' values in the kernel's argument order, the compiled kernel)
_FAST: dict[tuple, tuple] = {}
_DIRECT: list[bool] = []  # [whether launches may skip Triton's binding], decided at the first launch
# a caller's own key -> what `launcher` gave for it (a caller that knows its arguments' specialization from fewer
# facts than `launch` reads: triton_digest's fused digest, by dtype and size); cleared by `forget` as _FAST is
READY: dict[tuple, Any] = {}
_CALLS: list[Any] = []  # torch's current device and current raw stream, and Triton's runtime knobs


def launch(kernel, programs: int, args: tuple, meta: dict) -> Any:
    """kernel[(programs,)](*args, **meta), its arguments tensors and integers; Triton's compiled kernel."""
    return _launch(kernel, programs, args, meta)[0]


def launch_kept(kernel, programs: int, args: tuple, meta: dict) -> tuple | None:
    """`launch`, then what `launcher` gives for these arguments (None where this launch was Triton's own): for a
    caller that keeps the launcher of a launch it makes again, without looking it up a second time."""
    found = _launch(kernel, programs, args, meta)[1]
    return None if found is None else found[:4]


def _launch(kernel, programs: int, args: tuple, meta: dict) -> tuple[Any, tuple | None]:
    """`launch`; and the _FAST entry it called (None: the launch was Triton's own)."""
    if not _CALLS:
        _setup()
    addresses: list = []
    key = _key(kernel, args, meta, addresses)
    found = _FAST.get(key)
    knobs = _CALLS[2]
    if found is None or _hooked(knobs):
        compiled = kernel[(programs,)](*args, **meta)
        if found is None and _DIRECT[0]:
            _remember(key, kernel, compiled, len(args), meta)
        return compiled, None
    run, function, packed, constants, compiled = found
    run(programs, 1, 1, _CALLS[1](key[1]), function, packed, None, None, None, *addresses, *constants)
    return compiled, found


def _key(kernel, args: tuple, meta: dict, addresses: list | None = None) -> tuple:
    """_FAST's key of a launch of these arguments on the current device (after `_setup`): the device is key[1].
    `addresses`, where given, gets the arguments as the launcher takes them: a tensor's address, an integer as is."""
    return kernel, _CALLS[0](), _specialization(kernel, args, addresses), tuple(meta.items())


def launcher(kernel, args: tuple, meta: dict) -> tuple | None:
    """What `launch` calls for these arguments' specialization on the current device, once it has launched it
    directly: (Triton's compiled launcher, its function, its packed metadata, the constexprs in argument order), to
    be called as `launch` calls it, on the device's current stream; None where launches go through
    `kernel[grid](...)`."""
    if not _CALLS:
        _setup()
    found = _FAST.get(_key(kernel, args, meta))
    return None if found is None else found[:4]


def direct_on(device: int) -> bool:
    """Whether a launcher `launcher` gave for `device` may be called now: that device is the current one, and no
    launch hook (a profiler's) is set, which Triton's own launch (`kernel[grid](...)`) would call."""
    return _CALLS[0]() == device and not _hooked(_CALLS[2])


def _hooked(knobs) -> bool:
    """Whether a launch hook is set: Triton 3.6 keeps its hooks in a HookChain, never None, empty when none is."""
    enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
    return (enter is not None and bool(getattr(enter, "calls", True))) or \
        (leave is not None and bool(getattr(leave, "calls", True)))


class _NoHooks:
    launch_enter_hook = launch_exit_hook = None


def _setup() -> None:
    import torch

    runtime: Any = _NoHooks()
    direct = torch.cuda.is_available() and os.environ.get(LAUNCH_VARIABLE, "direct") != "triton"
    try:
        from triton import knobs

        if hasattr(knobs.runtime, "launch_enter_hook") and hasattr(knobs.runtime, "launch_exit_hook"):
            runtime = knobs.runtime
        else:
            direct = False
    except (ImportError, AttributeError):
        direct = False
    _DIRECT[:] = [direct]
    # without CUDA (Triton's interpreter) every launch is Triton's: no device to ask
    _CALLS[:] = [torch._C._cuda_getDevice if direct else (lambda: -1),
                 torch._C._cuda_getCurrentRawStream if direct else None, runtime]


LAUNCH_VARIABLE = "XFALIGN_TRITON_LAUNCH"  # "triton": every launch Triton's own


def forget() -> None:
    """Drop the launches remembered; the next launch reads XFALIGN_TRITON_LAUNCH again."""
    _FAST.clear()
    READY.clear()
    _DIRECT.clear()
    _CALLS.clear()


def _specialization(kernel, args: tuple, addresses: list | None = None) -> tuple:
    """What Triton could specialize the compiled kernel on, per argument (see the module's note): an integer of the
    kernel's do_not_specialize only by the width it is passed as (its value changes every launch: a digest's
    counter). `addresses`, where given, gets each argument as the launcher takes it."""
    specialized = _SPECIALIZED.get(kernel)
    if specialized is None:
        params = getattr(kernel, "params", None) or []
        specialized = _SPECIALIZED[kernel] = tuple(not getattr(param, "do_not_specialize", False) for param in params)
    found: list[tuple] = []
    passed = [] if addresses is None else addresses
    for i, arg in enumerate(args):
        if type(arg) is int:
            found.append((-2**31 <= arg < 2**31, arg < 2**63) if i < len(specialized) and not specialized[i] else
                         (arg == 1, arg % 16 == 0, -2**31 <= arg < 2**31, arg < 2**63))
            passed.append(arg)
        else:
            address = arg.data_ptr()
            found.append((arg.dtype, address % 16 == 0))
            passed.append(address)
    return tuple(found)


_SPECIALIZED: dict[Any, tuple[bool, ...]] = {}  # kernel -> per parameter, whether Triton specializes it by its value


def _remember(key: tuple, kernel, compiled, positional: int, meta: dict) -> None:
    """Keep what launching `compiled` again takes; launches stay Triton's if it lacks that."""
    try:
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
        constants = tuple(meta[name] for name in kernel.arg_names[positional:])
    except (AttributeError, KeyError, TypeError):
        _DIRECT[0] = False
        return
    if function is None:
        return
    if len(_FAST) >= 4096:  # specializations that keep changing: start over
        _FAST.clear()
    _FAST[key] = (run, function, packed, constants, compiled)

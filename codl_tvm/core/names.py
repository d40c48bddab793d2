"""Make tensor names valid C identifiers for the build, keeping the user's names outside it.

Why: TVM turns the names of ``main``'s parameters into the names of kernel arguments (an ONNX
input ``gpu_0/data_0`` becomes the OpenCL argument ``gpu_0/data_0_ptr``) and into the names of
functions derived from them, and ``clBuildProgram`` rejects the kernel. Caffe2-exported models and
many converters name tensors like that; TVM's ONNX frontend only replaces '.'.

:func:`c_identifiers` maps every original name to an identifier made of ASCII letters, digits and
'_' that does not start with a digit and is no C, C++ or OpenCL C keyword or type name. The
mapping is

- idempotent on names that are already such identifiers (they map to themselves),
- injective: two names that sanitize to the same string, or a sanitized name that equals another
  original name, are told apart by a numeric suffix (``a/b`` and ``a_b`` give ``a_b_1`` and
  ``a_b``),
- deterministic and independent of the order the names come in (suffixes go to names in sorted
  order).

:func:`rename_params` applies it to a Relax function's parameters. Only the build sees the new
names: codl-tvm binds inputs by position and keeps the original names in
:class:`~codl_tvm.core.tensors.TensorSpec`, the npz files and the artifact's manifest.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from tvm import relax

__all__ = ["c_identifiers", "is_c_identifier", "rename_params"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Words an identifier must not be in the C/OpenCL C sources TVM generates (and in C++/CUDA
# sources, which TVM generates for other targets): keywords, address-space and access qualifiers
# (with and without their underscores), and built-in type names.
_KEYWORDS = frozenset(
    """
    auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while _Alignas _Alignof _Atomic _Bool _Complex _Generic
    _Imaginary _Noreturn _Static_assert _Thread_local alignas alignof bool constexpr false
    nullptr static_assert thread_local true typeof typeof_unqual _BitInt _Decimal32 _Decimal64
    _Decimal128
    asm catch class const_cast decltype delete dynamic_cast explicit export friend mutable
    namespace new noexcept operator private protected public reinterpret_cast static_cast
    template this throw try typeid typename using virtual wchar_t char8_t char16_t char32_t
    concept consteval constinit co_await co_return co_yield requires
    __kernel kernel __global global __local local __constant constant __private __generic
    generic __read_only read_only __write_only write_only __read_write read_write uniform pipe
    __attribute__ complex imaginary
    uchar ushort uint ulong half quad size_t ptrdiff_t intptr_t uintptr_t image1d_t
    image1d_array_t image1d_buffer_t image2d_t image2d_array_t image2d_depth_t
    image2d_array_depth_t image3d_t sampler_t event_t queue_t clk_event_t ndrange_t
    reserve_id_t
    """.split()
)
# OpenCL vector types (float4, uchar16, ...).
_VECTOR_TYPE = re.compile(r"(u?char|u?short|u?int|u?long|float|double|half|bool)(2|3|4|8|16)")


def is_c_identifier(name: str) -> bool:
    """Whether ``name`` can be used unchanged as an identifier in generated C/OpenCL code."""
    return (
        _IDENT.fullmatch(name) is not None
        and name not in _KEYWORDS
        and _VECTOR_TYPE.fullmatch(name) is None
    )


def _sanitize(name: str) -> str:
    """A C identifier close to ``name``; not necessarily unique (see :func:`c_identifiers`)."""
    chars = []
    for ch in name:
        if ch.isascii() and (ch.isalnum() or ch == "_"):
            chars.append(ch)
        elif ch.isascii():
            chars.append("_")  # '/', '.', ':', '-', spaces and other punctuation
        else:
            # Spell non-ASCII characters by code point, so that names in other scripts stay
            # apart instead of all becoming underscores.
            chars.append(f"u{ord(ch):04x}")
    out = "".join(chars)
    if not out:
        return "unnamed"
    if out[0].isdigit():
        out = "_" + out
    if not is_c_identifier(out):  # a keyword or type name
        out += "_"
    return out


def c_identifiers(names: Iterable[str]) -> dict[str, str]:
    """Map each name to a distinct valid C identifier (itself where it already is one).

    Parameters
    ----------
    names
        The original names; repeats are allowed and map once.

    Returns
    -------
    dict[str, str]
        ``original -> identifier``: every value passes :func:`is_c_identifier`, values are
        pairwise distinct, and a value differs from every other key (so a renamed tensor can never
        take the name another tensor had). Keys come in the order of ``names``; each value
        depends only on the set of names, not on their order.
    """
    unique = list(dict.fromkeys(names))
    mapping = {n: n for n in unique if is_c_identifier(n)}
    taken = set(unique)  # a new name never equals any original name, valid or not
    for name in sorted(set(unique) - mapping.keys()):
        base = _sanitize(name)
        candidate, k = base, 0
        while candidate in taken or not is_c_identifier(candidate):
            k += 1
            candidate = f"{base}_{k}"
        mapping[name] = candidate
        taken.add(candidate)
    return {n: mapping[n] for n in unique}  # in the order the names came


def rename_params(func: relax.Function, new_names: Mapping[str, str]) -> relax.Function:
    """``func`` with each parameter whose name is a key of ``new_names`` renamed to its value.

    Relax tells variables apart by identity, not by name, so the function computes the same; only
    the names TVM derives kernel arguments and symbols from change. Parameters keep their order,
    types and the function's attributes.

    Parameters
    ----------
    func
        A Relax function, e.g. an imported model's ``main``.
    new_names
        Original parameter name to new name (e.g. from :func:`c_identifiers`).

    Returns
    -------
    relax.Function
        The renamed function (``func`` itself when nothing changes).
    """
    remap = {}
    params = []
    for param in func.params:
        new = new_names.get(param.name, param.name)
        if new == param.name:
            params.append(param)
            continue
        var = relax.Var(new, param.ty)
        remap[param] = var
        params.append(var)
    if not remap:
        return func
    body = func.bind_params(remap).body
    return relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs, func.span)

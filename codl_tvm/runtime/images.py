"""OpenCL images (TVM's texture memory scopes) in the codl-tvm OpenCL runtime.

A tensor of a texture scope (``global.texture``, ``global.texture-nhwc``,
``global.texture-weight``) whose last axis is 4 lives in an RGBA image2d array; the axes before
the last are split into layers, rows and pixels as TVM's texture codegen indexes them (the
scope's axis separator: ``global.texture`` keeps the last two axes before the channels as rows
and pixels, ``global.texture-nhwc`` the first as layers and the second as rows,
``global.texture-weight`` the first as rows). ``tvm.runtime.empty(..., mem_scope=scope)`` and
Relax VM storages of those scopes allocate images through the plugin; kernels receive them as
image arguments and copies use the image commands.

Where the device has ``cl_khr_image2d_from_buffer`` and accepts it, an image is created on a
buffer of the runtime (no copy between the two); otherwise it is an image of its own.
:func:`image_caps` says what the device supports, so callers can choose buffers instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from codl_tvm.core.errors import ImageError
from codl_tvm.runtime import load, plugin_function

__all__ = [
    "PIXEL_CHANNELS",
    "TEXTURE_SCOPES",
    "ImageCaps",
    "ImageError",
    "ImageInfo",
    "buffer_view",
    "copy_region_from_buffer",
    "copy_region_to_buffer",
    "empty",
    "image_caps",
    "image_info",
    "is_image",
    "read_region",
    "write_region",
]

#: Channels one image pixel holds (RGBA: the NCHW4c layout of tensors on images).
PIXEL_CHANNELS = 4

#: TVM's texture memory scopes that the runtime stores as images.
TEXTURE_SCOPES = ("global.texture", "global.texture-nhwc", "global.texture-weight")


@dataclass(frozen=True)
class ImageCaps:
    """A device's OpenCL image support.

    Attributes
    ----------
    device
        The device's name.
    image_support
        ``CL_DEVICE_IMAGE_SUPPORT``; without it every texture-scope allocation fails.
    image2d_max_width, image2d_max_height, image_max_array_size
        The largest image: pixels per row, rows, layers.
    pitch_alignment_pixels, base_address_alignment_pixels
        Alignment of an image's rows and base on a buffer (1 where the device reports none).
    image2d_from_buffer
        ``cl_khr_image2d_from_buffer``: an image can share a buffer's memory.
    rgba_float, rgba_half
        RGBA image2d arrays of ``CL_FLOAT`` / ``CL_HALF_FLOAT`` (float32 / float16 tensors).
    fp16
        ``cl_khr_fp16``: kernels can compute in half (TVM's ``read_imageh``).
    from_buffer_refused
        Allocations whose image the driver refused on a buffer (they got an image of their own).
    from_buffer_refused_why
        The last such refusal's OpenCL error, or ``""``.
    """

    device: str
    image_support: bool
    image2d_max_width: int
    image2d_max_height: int
    image_max_array_size: int
    pitch_alignment_pixels: int
    base_address_alignment_pixels: int
    image2d_from_buffer: bool
    rgba_float: bool
    rgba_half: bool
    fp16: bool
    from_buffer_refused: int
    from_buffer_refused_why: str

    def supports(self, dtype: str) -> bool:
        """Whether tensors of ``dtype`` (``"float32"`` or ``"float16"``) can be images here."""
        if not self.image_support:
            return False
        return {"float32": self.rgba_float, "float16": self.rgba_half}.get(str(dtype), False)


@dataclass(frozen=True)
class ImageInfo:
    """How one texture-scope tensor is stored.

    Attributes
    ----------
    scope
        Its memory scope.
    width, height, depth
        Pixels per row, rows per layer, layers.
    dtype
        ``"float32"`` or ``"float16"``.
    row_pitch
        Bytes from one row to the next in the buffer under the image (0 without one).
    from_buffer
        Whether the image shares a buffer's memory (:func:`buffer_view` reads it).
    view
        Whether it is a view of another tensor's storage.
    image_type
        ``"image2d_array"`` (what TVM's kernels take) or ``"image2d"``.
    """

    scope: str
    width: int
    height: int
    depth: int
    dtype: str
    row_pitch: int
    from_buffer: bool
    view: bool
    image_type: str


def _device_id(device) -> int:
    return int(getattr(device, "index", getattr(device, "device_id", device)))


def _call(name: str, *args):
    """Call a plugin function; its ValueError (bad input, limits) becomes one-line ImageError."""
    load()
    try:
        return plugin_function(name)(*args)
    except ValueError as exc:
        raise ImageError(str(exc).strip().splitlines()[-1]) from None


def image_caps(device=0) -> ImageCaps:
    """Return the image support and limits of an OpenCL device.

    Parameters
    ----------
    device
        A ``tvm.runtime.Device`` of type OpenCL, or its index.

    Returns
    -------
    ImageCaps
        What the device supports (queried once, when the runtime initialised).
    """
    return ImageCaps(**json.loads(str(_call("codl.opencl.image_caps", _device_id(device)))))


def empty(
    shape: Sequence[int],
    dtype: str,
    device,
    scope: str = "global.texture",
    image2d_array: bool = True,
):
    """Allocate an uninitialised texture-scope tensor (an image) on an OpenCL device.

    ``tvm.runtime.empty(shape, dtype, device, mem_scope=scope)`` does the same for image2d
    arrays but raises TVM's error; this one raises :class:`ImageError` and can also make a
    plain image2d (one layer), which ``cl_khr_image2d_from_buffer`` can place on a buffer on
    every driver that has it.

    Parameters
    ----------
    shape
        The tensor's shape; the last axis must be 4 (the RGBA channels).
    dtype
        ``"float32"`` or ``"float16"``.
    device
        The OpenCL device (``tvm.opencl(i)``).
    scope
        One of :data:`TEXTURE_SCOPES`.
    image2d_array
        An image2d array (what TVM's texture kernels take) or, when false, an image2d.

    Returns
    -------
    tvm.runtime.Tensor
        The tensor; its data is the image.

    Raises
    ------
    ImageError
        No image support, a dtype or shape an image cannot hold, or a size beyond the device's
        limits (the message names the device, the limit and the shape).
    """
    import tvm  # deferred: importing codl_tvm.runtime loads no TVM library

    return _call(
        "codl.opencl.image_empty",
        tvm.runtime.ShapeTuple([int(s) for s in shape]),
        tvm.runtime.DataType(dtype),
        device,
        scope,
        bool(image2d_array),
    )


def is_image(tensor) -> bool:
    """Whether ``tensor`` is an OpenCL tensor stored as an image."""
    return bool(_call("codl.opencl.is_image", tensor))


def image_info(tensor) -> ImageInfo:
    """Return how a texture-scope tensor is stored (:class:`ImageInfo`).

    Raises
    ------
    ImageError
        ``tensor`` is not an image.
    """
    return ImageInfo(**json.loads(str(_call("codl.opencl.image_info", tensor))))


def buffer_view(tensor):
    """A ``global`` OpenCL tensor over the buffer an image was created from, no copy.

    Its shape is ``[depth, height, row_pitch // pixel_bytes, 4]``: rows keep the device's pitch
    padding, so ``view[:, :, :width]`` holds the pixels.

    Raises
    ------
    ImageError
        The image is not on a buffer (:attr:`ImageInfo.from_buffer` is false).
    """
    return _call("codl.opencl.image_buffer_view", tensor)


def _region(origin: Sequence[int], region: Sequence[int]) -> tuple[list[int], list[int]]:
    if len(origin) != 3 or len(region) != 3:
        raise ImageError(
            f"origin and region are (x pixels, y rows, z layers); got {tuple(origin)} and "
            f"{tuple(region)}"
        )
    return [int(v) for v in origin], [int(v) for v in region]


def read_region(tensor, origin: Sequence[int], region: Sequence[int]) -> np.ndarray:
    """Read a region of an image into a new array of shape ``(z, y, x, 4)``.

    Parameters
    ----------
    tensor
        A texture-scope tensor.
    origin, region
        Where the region starts and its size, as (x in pixels, y in rows, z in layers).

    Raises
    ------
    ImageError
        ``tensor`` is no image, or the region is empty or not inside it.
    """
    import tvm  # deferred, as above

    origin, region = _region(origin, region)
    info = image_info(tensor)
    out = np.empty((region[2], region[1], region[0], 4), dtype=info.dtype)
    host = tvm.runtime.tensor(out)
    _call("codl.opencl.image_read_region", tensor, origin, region, host)
    return host.numpy()


def write_region(tensor, origin: Sequence[int], data: np.ndarray) -> None:
    """Write ``data`` of shape ``(z, y, x, 4)`` into an image at ``origin`` (x, y, z).

    Raises
    ------
    ImageError
        ``tensor`` is no image, ``data`` has the wrong dtype or shape, or the region is not
        inside the image.
    """
    import tvm  # deferred, as above

    data = np.ascontiguousarray(data)
    if data.ndim != 4 or data.shape[3] != 4:
        raise ImageError(f"an image region is (layers, rows, pixels, 4); got {data.shape}")
    origin, region = _region(origin, (data.shape[2], data.shape[1], data.shape[0]))
    _call("codl.opencl.image_write_region", tensor, origin, region, tvm.runtime.tensor(data))


def copy_region_to_buffer(
    tensor, origin: Sequence[int], region: Sequence[int], buffer, byte_offset: int = 0
) -> None:
    """Copy a region of an image into a ``global`` OpenCL tensor (on the device, no host copy).

    The region lands densely, (z, y, x, 4), ``byte_offset`` bytes past ``buffer``'s start.

    Raises
    ------
    ImageError
        Not an image, a region outside it, or a region that does not fit ``buffer``.
    """
    origin, region = _region(origin, region)
    _call("codl.opencl.image_copy_region_buffer", tensor, origin, region, buffer, byte_offset, True)


def copy_region_from_buffer(
    tensor, origin: Sequence[int], region: Sequence[int], buffer, byte_offset: int = 0
) -> None:
    """Copy a dense (z, y, x, 4) block of a ``global`` OpenCL tensor, starting ``byte_offset``
    bytes in, into a region of an image.

    Raises
    ------
    ImageError
        Not an image, a region outside it, or a block that runs past ``buffer``.
    """
    origin, region = _region(origin, region)
    _call(
        "codl.opencl.image_copy_region_buffer", tensor, origin, region, buffer, byte_offset, False
    )

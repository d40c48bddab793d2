/*
 * codl-tvm OpenCL runtime plugin: OpenCL images for tensors of TVM's texture memory scopes
 * (`global.texture`, `global.texture-nhwc`, `global.texture-weight`).
 *
 * A texture-scope tensor of shape [..., 4] is an RGBA image2d array whose width, height and
 * layer count follow TVM's flattening (texture.h: DefaultTextureLayoutSeparator,
 * ApplyTexture2DFlattening), so kernels from TVM's texture codegen index it as they expect.
 * The tensor's data pointer points at an ImageDescriptor (registered here, so kernel launches
 * and copies recognise it). Where the device has cl_khr_image2d_from_buffer the image aliases a
 * buffer of the device API (an SVM allocation or a host-mapped buffer), else it is an image of
 * its own.
 */
#ifndef CODL_TVM_RUNTIME_IMAGES_H_
#define CODL_TVM_RUNTIME_IMAGES_H_

#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "workspace.h"

namespace codl {

/*! \brief An image2d array's size: pixels per row, rows per layer, layers (4 channels each). */
struct TextureShape {
  size_t width{1};
  size_t height{1};
  size_t depth{1};
};

/*! \brief Whether `scope` is one of TVM's texture memory scopes ("global.texture...").*/
bool IsTextureScope(const std::string& scope);

/*!
 * \brief The image of a tensor of `shape` in texture `scope`, as TVM's OpenCL runtime and texture
 * codegen lay it out: the last axis is the 4 channels; the axes before the scope's separator
 * (`global.texture`: rank - 2, `global.texture-nhwc`: 2, `global.texture-weight`: 1) split
 * into layers (all but the last of them) and rows (the last), the rest are the row's pixels.
 * Throws a ValueError for another scope or a last axis other than 4.
 */
TextureShape FlattenTexture(const int64_t* shape, int ndim, const std::string& scope);

/*! \brief The image storage of one texture-scope tensor (the tensor's data pointer). */
struct ImageDescriptor {
  cl::cl_mem image{nullptr};
  int device_id{0};
  std::string scope;
  DLDataType dtype{kDLFloat, 32, 1};
  TextureShape shape;
  size_t row_pitch{0};  // bytes from one row to the next in the backing buffer (0: none)
  // The buffer the image is created from (cl_khr_image2d_from_buffer), if any: a data pointer
  // of the device API (SVM pointer or BufferDescriptor) and the cl_mem the image was given.
  void* backing_data{nullptr};
  cl::cl_mem backing_mem{nullptr};
  bool owns_backing_data{false};  // allocated for this image, freed with it
  bool owns_backing_mem{false};   // a cl_mem wrapping SVM memory, released after the image
  bool is_view{false};            // a view of another tensor's storage (Allocator::CreateView)
  bool array{true};               // an image2d array (TVM's kernels), else an image2d

  size_t pixel_bytes() const { return 4 * ((dtype.bits + 7) / 8); }
  /*! \brief Bytes of a dense host copy (width * height * depth pixels). */
  size_t dense_bytes() const { return shape.width * shape.height * shape.depth * pixel_bytes(); }
};

/*! \brief The image descriptor `ptr` is, or null when it is none (a buffer or SVM pointer). */
ImageDescriptor* FindImage(const void* ptr);

/*!
 * \brief Allocate the image of a tensor of `shape` and `dtype` in texture `scope` on device
 * `dev_id`: from a buffer of its own where the device can alias one, else a separate image.
 * `array` false makes an image2d (one layer) rather than the image2d array TVM's kernels take;
 * cl_khr_image2d_from_buffer only promises image2d on buffers (Intel's CPU runtime refuses
 * arrays). A device without images, a dtype other than float32/float16, or a size beyond the
 * device's limits throws one ValueError naming the device, the limit and the shape.
 */
ImageDescriptor* AllocImage(int dev_id, const int64_t* shape, int ndim, DLDataType dtype,
                            const std::string& scope, bool array = true);

/*!
 * \brief A texture-scope view of shape `shape` on `storage` (a data pointer of the device API:
 * an image descriptor, an SVM pointer or a BufferDescriptor), for TVM's Allocator::CreateView.
 * An image of the same size and type is shared; other views alias the storage's buffer, which
 * needs cl_khr_image2d_from_buffer (a ValueError says so where the device lacks it).
 */
ImageDescriptor* ImageView(int dev_id, void* storage, const int64_t* shape, int ndim,
                           DLDataType dtype, const std::string& scope);

/*! \brief Release an image (and the buffer it owns, after it) and unregister the descriptor. */
void FreeImage(ImageDescriptor* desc);

/*!
 * \brief Copy whole tensors where one side (or both) is an image: host <-> image with
 * Read/WriteImage, buffer or SVM <-> image with CopyImageToBuffer/BufferToImage, image <-> image
 * with CopyImage. Blocking, on `queue` (in order after every kernel enqueued before).
 */
void CopyWithImages(const DLTensor* from, ImageDescriptor* from_image, const DLTensor* to,
                    ImageDescriptor* to_image, cl::cl_command_queue queue);

/*! \brief Which part of an image a region copy touches, in pixels, rows and layers. */
struct ImageRegion {
  size_t origin[3]{0, 0, 0};
  size_t region[3]{0, 0, 0};
};

/*! \brief Throws a ValueError unless `r` is non-empty and lies inside `desc`'s image. */
void CheckRegion(const ImageDescriptor* desc, const ImageRegion& r);

/*! \brief Read (`to_host` true) or write a region of an image from or to dense host memory. */
void ImageRegionHost(ImageDescriptor* desc, const ImageRegion& r, void* host, bool to_host);

/*!
 * \brief Copy a region of an image to (`to_buffer` true) or from a device buffer tensor's bytes
 * starting `byte_offset` past its first element; the buffer holds the region densely.
 */
void ImageRegionBuffer(ImageDescriptor* desc, const ImageRegion& r, const DLTensor* buffer,
                       size_t byte_offset, bool to_buffer);

/*! \brief The image support and limits of device `dev_id`, as JSON. */
std::string ImageCapsJson(int dev_id);

/*! \brief How one image tensor is stored (size, pitch, whether it aliases a buffer), as JSON. */
std::string ImageInfoJson(const ImageDescriptor* desc);

}  // namespace codl

#endif  // CODL_TVM_RUNTIME_IMAGES_H_

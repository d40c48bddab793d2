/*
 * codl-tvm OpenCL runtime plugin: OpenCL images for TVM's texture memory scopes, and the
 * `DeviceAllocator.opencl` through which TVM's memory manager (the Relax VM's storages and their
 * views) allocates them.
 */
#include "images.h"

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/runtime/device_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace codl {

using namespace cl;  // NOLINT(build/namespaces)
namespace ffi = tvm::ffi;
using tvm::runtime::DeviceAPI;

namespace {

std::mutex g_images_mu;
std::unordered_set<const void*> g_images;
// Launches test every handle argument: with no image alive they skip the registry's lock.
std::atomic<int64_t> g_live_images{0};
// Allocations whose driver refused an image on a buffer, though it announces the extension.
std::atomic<int64_t> g_from_buffer_refused{0};
std::string g_refused_why;  // the last refusal's error (guarded by g_images_mu)

void Register(ImageDescriptor* desc) {
  std::lock_guard<std::mutex> lock(g_images_mu);
  g_images.insert(desc);
  ++g_live_images;
}

size_t AlignUp(size_t n, size_t align) { return (n + align - 1) / align * align; }

std::string ShapeString(const int64_t* shape, int ndim) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

std::string DeviceLabel(int dev_id) {
  return "opencl(" + std::to_string(dev_id) + ") '" + Workspace::Global()->Device(dev_id).name +
         "'";
}

/*! \brief Why images on device `dev_id` cannot alias buffers, for error messages. */
std::string NoImageOnBuffer(int dev_id) {
  return DeviceLabel(dev_id) + (Workspace::Global()->Device(dev_id).images.from_buffer
                                    ? " refuses image2d arrays on buffers"
                                    : " lacks cl_khr_image2d_from_buffer");
}

/*!
 * \brief Check that device `dev_id` can hold an image of `ts` pixels of `dtype` for a tensor of
 * `shape`; throws one ValueError naming the device, the limit and the shape.
 */
void CheckImage(int dev_id, const TextureShape& ts, DLDataType dtype, const std::string& scope,
                const int64_t* shape, int ndim) {
  const ImageCaps& c = Workspace::Global()->Device(dev_id).images;
  std::string what = "a " + scope + " image for shape " + ShapeString(shape, ndim);
  if (!c.supported) {
    TVM_FFI_THROW(ValueError) << DeviceLabel(dev_id) << " has no image support "
                              << "(CL_DEVICE_IMAGE_SUPPORT is false): cannot allocate " << what
                              << "; use buffers (memory scope 'global')";
  }
  bool half = dtype.code == kDLFloat && dtype.bits == 16 && dtype.lanes == 1;
  bool single = dtype.code == kDLFloat && dtype.bits == 32 && dtype.lanes == 1;
  if (!half && !single) {
    TVM_FFI_THROW(ValueError) << what << ": images hold float32 or float16 (CL_FLOAT or "
                              << "CL_HALF_FLOAT RGBA), not " << ffi::DLDataTypeToString(dtype);
  }
  if ((half && !c.rgba_half) || (single && !c.rgba_float)) {
    TVM_FFI_THROW(ValueError) << DeviceLabel(dev_id) << " does not support RGBA "
                              << (half ? "CL_HALF_FLOAT" : "CL_FLOAT")
                              << " image2d arrays: cannot allocate " << what;
  }
  auto limit = [&](size_t got, size_t max, const char* name, const char* axis) {
    if (got > max || got == 0) {
      TVM_FFI_THROW(ValueError) << DeviceLabel(dev_id) << ": " << what << " needs " << axis
                                << " " << got << (got == 0 ? " (empty)" : "") << ", beyond "
                                << name << " = " << max << " (image " << ts.width << " x "
                                << ts.height << " x " << ts.depth << ")";
    }
  };
  limit(ts.width, c.max_width, "CL_DEVICE_IMAGE2D_MAX_WIDTH", "width");
  limit(ts.height, c.max_height, "CL_DEVICE_IMAGE2D_MAX_HEIGHT", "height");
  limit(ts.depth, c.max_array_size, "CL_DEVICE_IMAGE_MAX_ARRAY_SIZE", "array size");
}

/*! \brief The cl_mem holding a device-API data pointer's bytes, and where they start in it. */
struct BufferHandle {
  cl_mem mem{nullptr};
  size_t offset{0};  // of `data` in `mem`
  size_t nbytes{0};  // of `mem`
  bool owned{false};
  BufferHandle() = default;
  BufferHandle(const BufferHandle&) = delete;
  BufferHandle& operator=(const BufferHandle&) = delete;
  BufferHandle(BufferHandle&& o) noexcept { *this = std::move(o); }
  BufferHandle& operator=(BufferHandle&& o) noexcept {
    std::swap(mem, o.mem);
    offset = o.offset;
    nbytes = o.nbytes;
    std::swap(owned, o.owned);
    return *this;
  }
  /*! \brief Hand the cl_mem over to the caller (who then releases it). */
  cl_mem Release() {
    owned = false;
    return mem;
  }
  ~BufferHandle() {
    if (owned && mem != nullptr) GetApi().clReleaseMemObject(mem);
  }
};

/*!
 * \brief The buffer behind a data pointer of this device API. Buffer mode: the descriptor's
 * cl_mem. SVM: a buffer over the whole SVM allocation (CL_MEM_USE_HOST_PTR with an SVM pointer
 * uses that memory, OpenCL 2.0 section 5.6.1), so image copies and images from buffers reach
 * the SVM bytes without a copy.
 */
BufferHandle AsBuffer(const void* data, const std::string& what) {
  Workspace* w = Workspace::Global();
  BufferHandle h;
  if (w->svm_mode() == SvmMode::kBuffer) {
    if (!w->IsBuffer(data)) {
      TVM_FFI_THROW(ValueError) << what << ": " << data << " is not an OpenCL buffer of the "
                                << "codl-tvm runtime";
    }
    auto* desc = static_cast<const BufferDescriptor*>(data);
    h.mem = desc->mem;
    h.nbytes = desc->nbytes;
    return h;
  }
  void* base = nullptr;
  size_t nbytes = 0;
  if (!w->FindAlloc(data, &base, &nbytes)) {
    TVM_FFI_THROW(ValueError) << what << ": " << data << " is not in an SVM allocation of the "
                              << "codl-tvm runtime";
  }
  cl_int err = CL_SUCCESS;
  h.mem = GetApi().clCreateBuffer(w->context(), CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR,
                                  std::max<size_t>(nbytes, 1), base, &err);
  if (err != CL_SUCCESS) ThrowCLError("clCreateBuffer", err, what + " (a buffer over SVM)");
  h.owned = true;
  h.offset = static_cast<const char*>(data) - static_cast<const char*>(base);
  h.nbytes = nbytes;
  return h;
}

cl_mem CreateImage(int dev_id, DLDataType dtype, const TextureShape& ts, cl_mem buffer,
                   size_t row_pitch, bool array, cl_int* err) {
  // TVM's texture codegen declares every texture parameter image2d_array_t (a layer count of 1
  // where the scope has no layer axes), so texture tensors are image2d arrays by default.
  cl_image_format fmt{CL_RGBA, dtype.bits == 16 ? CL_HALF_FLOAT : CL_FLOAT};
  cl_image_desc d{};
  d.image_type = array ? CL_MEM_OBJECT_IMAGE2D_ARRAY : CL_MEM_OBJECT_IMAGE2D;
  d.image_width = ts.width;
  d.image_height = ts.height;
  d.image_array_size = array ? ts.depth : 0;
  if (buffer != nullptr) {
    d.image_row_pitch = row_pitch;
    d.image_slice_pitch = array ? row_pitch * ts.height : 0;
    d.buffer = buffer;
  }
  return GetApi().clCreateImage(Workspace::Global()->context(), CL_MEM_READ_WRITE, &fmt, &d,
                                nullptr, err);
}

/*! \brief Row pitch (bytes) of an image of `ts` on a buffer, as the device aligns rows. */
size_t BufferRowPitch(int dev_id, const TextureShape& ts, DLDataType dtype) {
  size_t pixel = 4 * ((dtype.bits + 7) / 8);
  return AlignUp(ts.width * pixel, Workspace::Global()->Device(dev_id).images.pitch_align_pixels *
                                       pixel);
}

/*!
 * \brief An image on `buf` (bytes from buf.offset), owning `buf`'s cl_mem when it wraps SVM.
 * Throws a ValueError when the buffer is too small or misaligned for it.
 */
ImageDescriptor* ImageOnBuffer(int dev_id, const TextureShape& ts, DLDataType dtype,
                               const std::string& scope, void* data, BufferHandle buf,
                               const std::string& what, bool array = true) {
  size_t row_pitch = BufferRowPitch(dev_id, ts, dtype);
  size_t need = row_pitch * ts.height * ts.depth;
  if (buf.offset != 0) {
    // The image would need a sub-buffer at the offset; TVM's texture views start at their
    // storage's first byte.
    TVM_FFI_THROW(ValueError) << what << ": a texture view must start at its storage's first "
                              << "byte, not " << buf.offset << " bytes in";
  }
  if (need > buf.nbytes) {
    TVM_FFI_THROW(ValueError) << what << ": an image of " << ts.width << " x " << ts.height
                              << " x " << ts.depth << " pixels with a row pitch of " << row_pitch
                              << " bytes needs " << need << " bytes; its storage has "
                              << buf.nbytes;
  }
  cl_int err = CL_SUCCESS;
  cl_mem image = CreateImage(dev_id, dtype, ts, buf.mem, row_pitch, array, &err);
  if (err != CL_SUCCESS) ThrowCLError("clCreateImage", err, what + " (on a buffer)");
  auto* desc = new ImageDescriptor();
  desc->array = array;
  desc->image = image;
  desc->device_id = dev_id;
  desc->scope = scope;
  desc->dtype = dtype;
  desc->shape = ts;
  desc->row_pitch = row_pitch;
  desc->backing_data = data;
  desc->owns_backing_mem = buf.owned;
  desc->backing_mem = buf.Release();
  return desc;
}

}  // namespace

bool IsTextureScope(const std::string& scope) {
  return scope.rfind("global.texture", 0) == 0;
}

TextureShape FlattenTexture(const int64_t* shape, int ndim, const std::string& scope) {
  size_t rank = static_cast<size_t>(ndim);
  if (rank < 2 || shape[rank - 1] != 4) {
    TVM_FFI_THROW(ValueError) << "a " << scope << " tensor's last axis is the 4 RGBA channels; "
                              << "shape " << ShapeString(shape, ndim) << " has none";
  }
  // The separator: axes [0, sep - 1) are layers, axis sep - 1 the rows, [sep, rank - 1) the
  // pixels of a row (TVM's DefaultTextureLayoutSeparator and ApplyTexture2DFlattening).
  size_t sep;
  if (scope == "global.texture") {
    sep = rank - 2;
  } else if (scope == "global.texture-nhwc") {
    sep = 2;
  } else if (scope == "global.texture-weight") {
    sep = 1;
  } else {
    TVM_FFI_THROW(ValueError) << "unknown texture memory scope '" << scope << "' (known: "
                              << "global.texture, global.texture-nhwc, global.texture-weight)";
  }
  if (sep >= rank) {
    TVM_FFI_THROW(ValueError) << "a " << scope << " tensor needs more than " << sep
                              << " axes; shape " << ShapeString(shape, ndim) << " has " << rank;
  }
  TextureShape ts;
  for (size_t i = 0; i + 1 < rank; ++i) {
    size_t n = static_cast<size_t>(shape[i]);
    // sep == 0 (global.texture of rank 2) makes every axis a layer, as TVM's unsigned
    // comparison does
    if (sep == 0 || i + 1 < sep) {
      ts.depth *= n;
    } else if (i < sep) {
      ts.height *= n;
    } else {
      ts.width *= n;
    }
  }
  return ts;
}

ImageDescriptor* FindImage(const void* ptr) {
  if (ptr == nullptr || g_live_images.load(std::memory_order_relaxed) == 0) return nullptr;
  std::lock_guard<std::mutex> lock(g_images_mu);
  return g_images.count(ptr) ? static_cast<ImageDescriptor*>(const_cast<void*>(ptr)) : nullptr;
}

ImageDescriptor* AllocImage(int dev_id, const int64_t* shape, int ndim, DLDataType dtype,
                            const std::string& scope, bool array) {
  Workspace* w = Workspace::Global();
  const DeviceEntry& dev = w->Device(dev_id);
  TextureShape ts = FlattenTexture(shape, ndim, scope);
  CheckImage(dev_id, ts, dtype, scope, shape, ndim);
  std::string what = "a " + scope + " image for shape " + ShapeString(shape, ndim);
  if (!array && ts.depth != 1) {
    TVM_FFI_THROW(ValueError) << what << " has " << ts.depth << " layers: an image2d has one "
                              << "(use an image2d array)";
  }
  ImageDescriptor* desc = nullptr;
  if (dev.images.from_buffer) {
    // The image aliases an allocation of the device API, so a buffer view of it (CPU parts of
    // co-executed operators) reads the same bytes without a copy.
    size_t pixel = 4 * ((dtype.bits + 7) / 8);
    size_t bytes = BufferRowPitch(dev_id, ts, dtype) * ts.height * ts.depth;
    DLDevice d{kDLOpenCL, dev_id};
    DeviceAPI* api = DeviceAPI::Get(d);
    // The image's base alignment (CL_DEVICE_IMAGE_BASE_ADDRESS_ALIGNMENT) can exceed what
    // clSVMAlloc accepts (Intel's CPU runtime: 1024 bytes asked, refused): the allocation gets
    // the usual alignment, and an image the driver refuses on it falls back below.
    (void)pixel;
    void* data = api->AllocDataSpace(d, bytes, tvm::runtime::kAllocAlignment, dtype);
    try {
      desc = ImageOnBuffer(dev_id, ts, dtype, scope, data, AsBuffer(data, what), what, array);
      desc->owns_backing_data = true;
    } catch (const ffi::Error& e) {
      api->FreeDataSpace(d, data);
      // A driver may announce the extension yet refuse image2d arrays on buffers (the
      // extension names image2d only): the allocation then gets an image of its own.
      ++g_from_buffer_refused;
      std::lock_guard<std::mutex> lock(g_images_mu);
      g_refused_why = e.message();
      desc = nullptr;
    }
  }
  if (desc == nullptr) {
    cl_int err = CL_SUCCESS;
    cl_mem image = CreateImage(dev_id, dtype, ts, nullptr, 0, array, &err);
    if (err != CL_SUCCESS) ThrowCLError("clCreateImage", err, what + " on " + DeviceLabel(dev_id));
    desc = new ImageDescriptor();
    desc->array = array;
    desc->image = image;
    desc->device_id = dev_id;
    desc->scope = scope;
    desc->dtype = dtype;
    desc->shape = ts;
  }
  Register(desc);
  return desc;
}

ImageDescriptor* ImageView(int dev_id, void* storage, const int64_t* shape, int ndim,
                           DLDataType dtype, const std::string& scope) {
  TextureShape ts = FlattenTexture(shape, ndim, scope);
  CheckImage(dev_id, ts, dtype, scope, shape, ndim);
  std::string what = "a " + scope + " view of shape " + ShapeString(shape, ndim);
  const ImageCaps& c = Workspace::Global()->Device(dev_id).images;
  ImageDescriptor* desc = nullptr;
  if (ImageDescriptor* s = FindImage(storage)) {
    bool same = s->shape.width == ts.width && s->shape.height == ts.height &&
                s->shape.depth == ts.depth && s->dtype.bits == dtype.bits && s->array;
    if (same) {
      // The storage's own image: shared (retained), so the view outlives nothing it needs.
      CODL_CL_CALL(clRetainMemObject, s->image);
      desc = new ImageDescriptor(*s);
      desc->owns_backing_data = false;
      desc->owns_backing_mem = false;
    } else if (s->backing_mem != nullptr) {
      BufferHandle buf;
      buf.mem = s->backing_mem;
      buf.nbytes = s->row_pitch * s->shape.height * s->shape.depth;
      desc = ImageOnBuffer(dev_id, ts, dtype, scope, s->backing_data, std::move(buf), what);
    } else {
      TVM_FFI_THROW(ValueError) << what << " (image " << ts.width << " x " << ts.height << " x "
                                << ts.depth << ") on an image storage of " << s->shape.width
                                << " x " << s->shape.height << " x " << s->shape.depth
                                << " needs that storage's image on a buffer; "
                                << NoImageOnBuffer(dev_id);
    }
  } else {
    if (!c.from_buffer) {
      TVM_FFI_THROW(ValueError) << what << " on a buffer storage needs an image on a buffer; "
                                << NoImageOnBuffer(dev_id)
                                << " (allocate the storage in the texture scope)";
    }
    try {
      desc = ImageOnBuffer(dev_id, ts, dtype, scope, storage, AsBuffer(storage, what), what);
    } catch (const ffi::Error& e) {
      if (e.kind() == "ValueError") throw;
      // the driver announces cl_khr_image2d_from_buffer but refuses an image2d array on it
      TVM_FFI_THROW(ValueError) << what << " on a buffer storage: " << NoImageOnBuffer(dev_id)
                                << " (" << e.message() << "); allocate the storage in the "
                                << "texture scope";
    }
  }
  desc->scope = scope;
  desc->is_view = true;
  Register(desc);
  return desc;
}

void FreeImage(ImageDescriptor* desc) {
  {
    std::lock_guard<std::mutex> lock(g_images_mu);
    if (g_images.erase(desc) == 0) return;
    --g_live_images;
  }
  const Api& api = GetApi();
  // The image first, then the buffer it was created from: OpenCL keeps both until the kernels
  // using them are done, but a buffer must not go while an image on it may still be used.
  api.clReleaseMemObject(desc->image);
  if (desc->owns_backing_mem) api.clReleaseMemObject(desc->backing_mem);
  if (desc->owns_backing_data) {
    DLDevice d{kDLOpenCL, desc->device_id};
    DeviceAPI::Get(d)->FreeDataSpace(d, desc->backing_data);
  }
  delete desc;
}

namespace {

bool IsContiguous(const DLTensor* t) {
  if (t->strides == nullptr) return true;
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expected) return false;
    expected *= t->shape[i];
  }
  return true;
}

void CheckImageTensor(const DLTensor* t, const ImageDescriptor* desc, const char* side) {
  if (t->byte_offset != 0) {
    TVM_FFI_THROW(ValueError) << "copy " << side << " a " << desc->scope << " image: a view at "
                              << "byte offset " << t->byte_offset << " (images have none)";
  }
  if (t->dtype.bits != desc->dtype.bits || t->dtype.code != desc->dtype.code) {
    TVM_FFI_THROW(ValueError) << "copy " << side << " a " << desc->scope << " image of "
                              << ffi::DLDataTypeToString(desc->dtype) << ": tensor is "
                              << ffi::DLDataTypeToString(t->dtype);
  }
}

}  // namespace

void CopyWithImages(const DLTensor* from, ImageDescriptor* from_image, const DLTensor* to,
                    ImageDescriptor* to_image, cl_command_queue queue) {
  size_t nbytes = ffi::GetDataSize(*from);
  if (nbytes != ffi::GetDataSize(*to) || !IsContiguous(from) || !IsContiguous(to)) {
    TVM_FFI_THROW(ValueError) << "copy with an image: both tensors must be contiguous and of the "
                              << "same size (" << nbytes << " and " << ffi::GetDataSize(*to)
                              << " bytes)";
  }
  if (from_image) CheckImageTensor(from, from_image, "from");
  if (to_image) CheckImageTensor(to, to_image, "to");
  ImageDescriptor* img = from_image ? from_image : to_image;
  if (img->dense_bytes() != nbytes) {
    TVM_FFI_THROW(ValueError) << "copy with a " << img->scope << " image of "
                              << img->dense_bytes() << " bytes: the tensor has " << nbytes;
  }
  Workspace* w = Workspace::Global();
  w->UnmapAll();  // host mappings end before the device touches memory
  size_t origin[3] = {0, 0, 0};
  size_t region[3] = {img->shape.width, img->shape.height, img->shape.depth};
  if (from_image && to_image) {
    const TextureShape &a = from_image->shape, &b = to_image->shape;
    if (a.width != b.width || a.height != b.height || a.depth != b.depth) {
      TVM_FFI_THROW(ValueError) << "copy between images of " << a.width << " x " << a.height
                                << " x " << a.depth << " and " << b.width << " x " << b.height
                                << " x " << b.depth << " pixels";
    }
    CODL_CL_CALL(clEnqueueCopyImage, queue, from_image->image, to_image->image, origin, origin,
                 region, 0, nullptr, nullptr);
    CODL_CL_CALL(clFinish, queue);
    return;
  }
  const DLTensor* other = from_image ? to : from;
  if (other->device.device_type != kDLOpenCL) {
    char* host = static_cast<char*>(other->data) + other->byte_offset;
    if (from_image) {
      CODL_CL_CALL(clEnqueueReadImage, queue, img->image, CL_TRUE, origin, region, 0, 0, host, 0,
                   nullptr, nullptr);
    } else {
      CODL_CL_CALL(clEnqueueWriteImage, queue, img->image, CL_TRUE, origin, region, 0, 0, host,
                   0, nullptr, nullptr);
    }
    return;
  }
  BufferHandle buf = AsBuffer(other->data, "copy with a " + img->scope + " image");
  size_t offset = buf.offset + other->byte_offset;
  if (from_image) {
    CODL_CL_CALL(clEnqueueCopyImageToBuffer, queue, img->image, buf.mem, origin, region, offset,
                 0, nullptr, nullptr);
  } else {
    CODL_CL_CALL(clEnqueueCopyBufferToImage, queue, buf.mem, img->image, offset, origin, region,
                 0, nullptr, nullptr);
  }
  CODL_CL_CALL(clFinish, queue);
}

void CheckRegion(const ImageDescriptor* desc, const ImageRegion& r) {
  size_t size[3] = {desc->shape.width, desc->shape.height, desc->shape.depth};
  for (int i = 0; i < 3; ++i) {
    if (r.region[i] == 0 || r.origin[i] + r.region[i] > size[i]) {
      TVM_FFI_THROW(ValueError) << "image region at origin (" << r.origin[0] << ", "
                                << r.origin[1] << ", " << r.origin[2] << ") of size ("
                                << r.region[0] << ", " << r.region[1] << ", " << r.region[2]
                                << ") is not inside the " << size[0] << " x " << size[1]
                                << " x " << size[2] << " image";
    }
  }
}

void ImageRegionHost(ImageDescriptor* desc, const ImageRegion& r, void* host, bool to_host) {
  CheckRegion(desc, r);
  Workspace* w = Workspace::Global();
  w->UnmapAll();
  cl_command_queue q = w->Queue(desc->device_id);
  if (to_host) {
    CODL_CL_CALL(clEnqueueReadImage, q, desc->image, CL_TRUE, r.origin, r.region, 0, 0, host, 0,
                 nullptr, nullptr);
  } else {
    CODL_CL_CALL(clEnqueueWriteImage, q, desc->image, CL_TRUE, r.origin, r.region, 0, 0, host, 0,
                 nullptr, nullptr);
  }
}

void ImageRegionBuffer(ImageDescriptor* desc, const ImageRegion& r, const DLTensor* buffer,
                       size_t byte_offset, bool to_buffer) {
  CheckRegion(desc, r);
  Workspace* w = Workspace::Global();
  w->UnmapAll();
  BufferHandle buf = AsBuffer(buffer->data, "image region copy");
  size_t offset = buf.offset + buffer->byte_offset + byte_offset;
  size_t bytes = r.region[0] * r.region[1] * r.region[2] * desc->pixel_bytes();
  if (offset + bytes > buf.nbytes) {
    TVM_FFI_THROW(ValueError) << "image region copy of " << bytes << " bytes at byte "
                              << offset << " runs past the " << buf.nbytes << "-byte buffer";
  }
  cl_command_queue q = w->Queue(desc->device_id);
  if (to_buffer) {
    CODL_CL_CALL(clEnqueueCopyImageToBuffer, q, desc->image, buf.mem, r.origin, r.region, offset,
                 0, nullptr, nullptr);
  } else {
    CODL_CL_CALL(clEnqueueCopyBufferToImage, q, buf.mem, desc->image, offset, r.origin, r.region,
                 0, nullptr, nullptr);
  }
  CODL_CL_CALL(clFinish, q);
}

std::string ImageCapsJson(int dev_id) {
  const DeviceEntry& e = Workspace::Global()->Device(dev_id);
  const ImageCaps& c = e.images;
  auto b = [](bool v) { return v ? "true" : "false"; };
  std::ostringstream os;
  os << "{\"device\": \"" << JsonEscape(e.name) << "\", \"image_support\": " << b(c.supported)
     << ", \"image2d_max_width\": " << c.max_width
     << ", \"image2d_max_height\": " << c.max_height
     << ", \"image_max_array_size\": " << c.max_array_size
     << ", \"pitch_alignment_pixels\": " << c.pitch_align_pixels
     << ", \"base_address_alignment_pixels\": " << c.base_align_pixels
     << ", \"image2d_from_buffer\": " << b(c.from_buffer)
     << ", \"rgba_float\": " << b(c.rgba_float) << ", \"rgba_half\": " << b(c.rgba_half)
     << ", \"fp16\": " << b(e.extensions.find("cl_khr_fp16") != std::string::npos)
     << ", \"from_buffer_refused\": " << g_from_buffer_refused.load();
  {
    std::lock_guard<std::mutex> lock(g_images_mu);
    os << ", \"from_buffer_refused_why\": \"" << JsonEscape(g_refused_why) << "\"}";
  }
  return os.str();
}

std::string ImageInfoJson(const ImageDescriptor* d) {
  std::ostringstream os;
  os << "{\"scope\": \"" << JsonEscape(d->scope) << "\", \"width\": " << d->shape.width
     << ", \"height\": " << d->shape.height << ", \"depth\": " << d->shape.depth
     << ", \"dtype\": \"" << ffi::DLDataTypeToString(d->dtype) << "\", \"row_pitch\": "
     << d->row_pitch << ", \"from_buffer\": " << (d->backing_mem ? "true" : "false")
     << ", \"view\": " << (d->is_view ? "true" : "false")
     << ", \"image_type\": \"" << (d->array ? "image2d_array" : "image2d") << "\"}";
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// DeviceAllocator.opencl: TVM's memory manager with texture scopes
// ---------------------------------------------------------------------------------------------

namespace {

/*!
 * \brief Mirror of tvm::runtime::memory::Buffer and Allocator (memory_manager.h cannot be
 * included: the wheel lacks tvm/support/io.h, which its tensor.h needs). Same members and the
 * same virtual methods in the same order, so TVM's memory manager calls into our subclass
 * through the pointer `DeviceAllocator.opencl` returns.
 */
struct BufferABI {
  void* data{nullptr};
  size_t size{0};
  DLDevice device{kDLOpenCL, 0};
  int alloc_type{0};  // tvm::runtime::memory::AllocatorType
};

class AllocatorABI {
 public:
  explicit AllocatorABI(int type) : type_(type) {}
  virtual ~AllocatorABI() = default;
  virtual BufferABI Alloc(DLDevice dev, size_t nbytes, size_t alignment, DLDataType hint) = 0;
  virtual BufferABI Alloc(DLDevice dev, ffi::Shape shape, DLDataType hint,
                          const std::string& mem_scope) = 0;
  virtual void* CreateView(const BufferABI& buffer, ffi::Shape shape, DLDataType hint,
                           const std::string& mem_scope) = 0;
  virtual void FreeView(DLDevice dev, void* data) = 0;
  virtual void Free(const BufferABI& buffer) = 0;
  virtual void Clear() = 0;
  virtual size_t UsedMemory() const = 0;

 protected:
  virtual bool AllowMemoryScope(const std::string& mem_scope) const = 0;
  int type() const { return type_; }

 private:
  int type_;
};

constexpr int kNaiveAllocator = 1;   // tvm::runtime::memory::kNaive
constexpr int kPooledAllocator = 2;  // tvm::runtime::memory::kPooled

/*!
 * \brief The allocator TVM's memory manager uses for OpenCL devices (looked up as the global
 * function `DeviceAllocator.opencl`). Flat allocations behave as TVM's own naive and pooled
 * allocators (the pooled one keeps freed buffers by page-rounded size for reuse); texture-scope
 * storages are images (never pooled: an image's shape, not its size, decides who can reuse it),
 * and texture-scope views of a storage are images on its memory.
 */
class CodlAllocator final : public AllocatorABI {
 public:
  explicit CodlAllocator(int type) : AllocatorABI(type) {}
  ~CodlAllocator() { ReleaseAll(); }

  BufferABI Alloc(DLDevice dev, size_t nbytes, size_t alignment, DLDataType hint) final {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    size_t size = nbytes;
    if (type() == kPooledAllocator) {
      size = (nbytes + kPage - 1) / kPage * kPage;
      auto it = pool_.find(size);
      if (it != pool_.end() && !it->second.empty()) {
        BufferABI buf = it->second.back();
        it->second.pop_back();
        return buf;
      }
    }
    BufferABI buf;
    buf.device = dev;
    buf.size = size;
    buf.alloc_type = type();
    try {
      buf.data = DeviceAPI::Get(dev)->AllocDataSpace(dev, size, alignment, hint);
    } catch (const ffi::Error&) {
      // out of memory with buffers parked in the pool: give them back and try once more
      if (pool_.empty()) throw;
      ReleaseAll();
      buf.data = DeviceAPI::Get(dev)->AllocDataSpace(dev, size, alignment, hint);
    }
    used_ += size;
    return buf;
  }

  BufferABI Alloc(DLDevice dev, ffi::Shape shape, DLDataType hint,
                  const std::string& mem_scope) final {
    if (!AllowMemoryScope(mem_scope)) {
      TVM_FFI_THROW(ValueError) << "the codl-tvm OpenCL allocator has no memory scope '"
                                << mem_scope << "' (global or global.texture...)";
    }
    size_t nbytes = ffi::GetDataSize(shape.Product(), hint);
    if (!IsTextureScope(mem_scope)) {
      // as Allocator::Alloc: the flat size, aligned as TVM's GetDataAlignment
      size_t align = std::max<size_t>((hint.bits * hint.lanes + 7) / 8, 64);
      return Alloc(dev, nbytes, align, hint);
    }
    BufferABI buf;
    buf.device = dev;
    buf.alloc_type = type();
    buf.data = DeviceAPI::Get(dev)->AllocDataSpace(dev, static_cast<int>(shape.size()),
                                                   shape.data(), hint, ffi::String(mem_scope));
    buf.size = nbytes;
    return buf;
  }

  void Free(const BufferABI& buffer) final {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    bool image = FindImage(buffer.data) != nullptr;
    if (image || type() != kPooledAllocator) {
      if (!image) used_ -= buffer.size;
      DeviceAPI::Get(buffer.device)->FreeDataSpace(buffer.device, buffer.data);
      return;
    }
    pool_[buffer.size].push_back(buffer);
  }

  void* CreateView(const BufferABI& buffer, ffi::Shape shape, DLDataType hint,
                   const std::string& mem_scope) final {
    ImageDescriptor* storage = FindImage(buffer.data);
    if (!IsTextureScope(mem_scope)) {
      if (storage == nullptr) return buffer.data;
      if (storage->backing_data == nullptr) {
        TVM_FFI_THROW(ValueError)
            << "a '" << (mem_scope.empty() ? "global" : mem_scope) << "' view of a "
            << storage->scope << " storage needs its image on a buffer; "
            << NoImageOnBuffer(buffer.device.device_id);
      }
      return storage->backing_data;
    }
    return ImageView(buffer.device.device_id, buffer.data, shape.data(),
                     static_cast<int>(shape.size()), hint, mem_scope);
  }

  void FreeView(DLDevice, void* data) final {
    ImageDescriptor* desc = FindImage(data);
    if (desc != nullptr && desc->is_view) FreeImage(desc);
  }

  void Clear() final { ReleaseAll(); }

  size_t UsedMemory() const final { return used_.load(); }

 protected:
  bool AllowMemoryScope(const std::string& mem_scope) const final {
    return mem_scope.empty() || mem_scope == "global" || IsTextureScope(mem_scope);
  }

 private:
  void ReleaseAll() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    for (auto& [size, bufs] : pool_) {
      for (const BufferABI& b : bufs) {
        DeviceAPI::Get(b.device)->FreeDataSpace(b.device, b.data);
        used_ -= b.size;
      }
    }
    pool_.clear();
  }

  static constexpr size_t kPage = 4096;  // TVM's PooledAllocator::kDefaultPageSize
  std::recursive_mutex mu_;
  std::unordered_map<size_t, std::vector<BufferABI>> pool_;
  std::atomic<size_t> used_{0};
};

ImageDescriptor* ImageOf(const ffi::Tensor& t, const char* what) {
  const DLTensor* d = t.GetDLTensorPtr();
  ImageDescriptor* desc = d->device.device_type == kDLOpenCL ? FindImage(d->data) : nullptr;
  if (desc == nullptr) {
    TVM_FFI_THROW(ValueError) << what << " expects a texture-scope OpenCL tensor (an image)";
  }
  return desc;
}

/*! \brief An image tensor made here (image2d or image2d array), freed with its image. */
struct ImageTensorAlloc {
  std::string scope;
  bool array;
  void AllocData(DLTensor* t) {
    t->data = AllocImage(t->device.device_id, t->shape, t->ndim, t->dtype, scope, array);
  }
  void FreeData(DLTensor* t) {
    if (ImageDescriptor* d = FindImage(t->data)) FreeImage(d);
  }
};

/*! \brief A 'global' tensor over the buffer an image was created from; keeps the image alive. */
struct BackingViewAlloc {
  ffi::Tensor owner;
  void AllocData(DLTensor* t) {
    t->data = FindImage(owner.GetDLTensorPtr()->data)->backing_data;
  }
  void FreeData(DLTensor*) {}
};

ImageRegion RegionOf(const ffi::Array<int64_t>& origin, const ffi::Array<int64_t>& region) {
  if (origin.size() != 3 || region.size() != 3) {
    TVM_FFI_THROW(ValueError) << "an image region has 3 origin and 3 region values (x in "
                              << "pixels, y in rows, z in layers), got " << origin.size()
                              << " and " << region.size();
  }
  ImageRegion r;
  for (int i = 0; i < 3; ++i) {
    if (origin[i] < 0 || region[i] < 0) {
      TVM_FFI_THROW(ValueError) << "an image region's origin and size are not negative";
    }
    r.origin[i] = static_cast<size_t>(origin[i]);
    r.region[i] = static_cast<size_t>(region[i]);
  }
  return r;
}

/*! \brief A dense host tensor holding exactly `r` of `desc` (RGBA pixels). */
void CheckHostRegion(const ffi::Tensor& host, const ImageDescriptor* desc, const ImageRegion& r) {
  const DLTensor* h = host.GetDLTensorPtr();
  size_t want = r.region[0] * r.region[1] * r.region[2] * desc->pixel_bytes();
  if (h->device.device_type != kDLCPU || !IsContiguous(h) || ffi::GetDataSize(*h) != want ||
      h->dtype.bits != desc->dtype.bits) {
    TVM_FFI_THROW(ValueError) << "an image region of " << r.region[0] << " x " << r.region[1]
                              << " x " << r.region[2] << " pixels needs a contiguous CPU tensor "
                              << "of " << want << " bytes of " << ffi::DLDataTypeToString(desc->dtype)
                              << ", got " << ffi::GetDataSize(*h) << " bytes";
  }
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def("DeviceAllocator.opencl",
           [](DLDevice, int type) -> void* {
             // TVM's memory manager owns it (one per device and allocator type)
             return static_cast<AllocatorABI*>(new CodlAllocator(type));
           })
      .def("codl.opencl.image_caps",
           [](int dev_id) { return ffi::String(ImageCapsJson(dev_id)); })
      .def("codl.opencl.image_info",
           [](ffi::Tensor t) {
             return ffi::String(ImageInfoJson(ImageOf(t, "codl.opencl.image_info")));
           })
      .def("codl.opencl.image_empty",
           [](ffi::Shape shape, DLDataType dtype, DLDevice dev, ffi::String scope, bool array) {
             if (dev.device_type != kDLOpenCL) {
               TVM_FFI_THROW(ValueError) << "codl.opencl.image_empty: an image is an OpenCL "
                                         << "tensor, not device type " << dev.device_type;
             }
             Workspace::Global()->Device(dev.device_id);
             return ffi::Tensor::FromNDAlloc(ImageTensorAlloc{std::string(scope), array},
                                             ffi::ShapeView(shape.data(), shape.size()), dtype,
                                             dev);
           })
      .def("codl.opencl.image_buffer_view",
           [](ffi::Tensor t) {
             ImageDescriptor* d = ImageOf(t, "codl.opencl.image_buffer_view");
             if (d->backing_data == nullptr) {
               TVM_FFI_THROW(ValueError) << "this " << d->scope << " image is not on a buffer ("
                                         << NoImageOnBuffer(d->device_id) << ")";
             }
             // rows padded to the row pitch: [layers, rows, pitch in pixels, 4]
             int64_t shape[4] = {static_cast<int64_t>(d->shape.depth),
                                 static_cast<int64_t>(d->shape.height),
                                 static_cast<int64_t>(d->row_pitch / d->pixel_bytes()), 4};
             return ffi::Tensor::FromNDAlloc(BackingViewAlloc{t}, ffi::ShapeView(shape, 4),
                                             d->dtype, t.GetDLTensorPtr()->device);
           })
      .def("codl.opencl.is_image",
           [](ffi::Tensor t) {
             const DLTensor* d = t.GetDLTensorPtr();
             return d->device.device_type == kDLOpenCL && FindImage(d->data) != nullptr;
           })
      .def("codl.opencl.image_read_region",
           [](ffi::Tensor image, ffi::Array<int64_t> origin, ffi::Array<int64_t> region,
              ffi::Tensor host) {
             ImageDescriptor* desc = ImageOf(image, "codl.opencl.image_read_region");
             ImageRegion r = RegionOf(origin, region);
             CheckRegion(desc, r);
             CheckHostRegion(host, desc, r);
             const DLTensor* h = host.GetDLTensorPtr();
             ImageRegionHost(desc, r, static_cast<char*>(h->data) + h->byte_offset, true);
           })
      .def("codl.opencl.image_write_region",
           [](ffi::Tensor image, ffi::Array<int64_t> origin, ffi::Array<int64_t> region,
              ffi::Tensor host) {
             ImageDescriptor* desc = ImageOf(image, "codl.opencl.image_write_region");
             ImageRegion r = RegionOf(origin, region);
             CheckRegion(desc, r);
             CheckHostRegion(host, desc, r);
             const DLTensor* h = host.GetDLTensorPtr();
             ImageRegionHost(desc, r, static_cast<char*>(h->data) + h->byte_offset, false);
           })
      .def("codl.opencl.image_copy_region_buffer",
           [](ffi::Tensor image, ffi::Array<int64_t> origin, ffi::Array<int64_t> region,
              ffi::Tensor buffer, int64_t byte_offset, bool to_buffer) {
             ImageDescriptor* desc = ImageOf(image, "codl.opencl.image_copy_region_buffer");
             const DLTensor* b = buffer.GetDLTensorPtr();
             if (b->device.device_type != kDLOpenCL || FindImage(b->data) != nullptr ||
                 byte_offset < 0) {
               TVM_FFI_THROW(ValueError) << "image region copy: the buffer must be a 'global' "
                                         << "OpenCL tensor and the byte offset not negative";
             }
             ImageRegionBuffer(desc, RegionOf(origin, region), b,
                               static_cast<size_t>(byte_offset), to_buffer);
           });
}

}  // namespace codl

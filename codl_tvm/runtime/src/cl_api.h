/*
 * codl-tvm OpenCL runtime plugin: the subset of the Khronos OpenCL C API the plugin uses.
 *
 * PyPI ships no OpenCL host headers, so the few types, constants and entry points we need are
 * declared here (the OpenCL C API and ABI are a stable Khronos standard) and resolved with dlopen
 * from an ICD loader at run time: pyopencl's bundled loader, a user-given one, or the system's.
 */
#ifndef CODL_TVM_RUNTIME_CL_API_H_
#define CODL_TVM_RUNTIME_CL_API_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace codl {
namespace cl {

using cl_int = int32_t;
using cl_uint = uint32_t;
using cl_ulong = uint64_t;
using cl_bool = cl_uint;
using cl_bitfield = cl_ulong;
using cl_device_type = cl_bitfield;
using cl_platform_info = cl_uint;
using cl_device_info = cl_uint;
using cl_device_svm_capabilities = cl_bitfield;
using cl_mem_flags = cl_bitfield;
using cl_svm_mem_flags = cl_bitfield;
using cl_map_flags = cl_bitfield;
using cl_command_queue_properties = cl_bitfield;
using cl_queue_properties = cl_bitfield;
using cl_context_properties = intptr_t;
using cl_program_info = cl_uint;
using cl_program_build_info = cl_uint;
using cl_profiling_info = cl_uint;
using cl_event_info = cl_uint;
using cl_kernel_work_group_info = cl_uint;
using cl_mem_object_type = cl_uint;
using cl_channel_order = cl_uint;
using cl_channel_type = cl_uint;

using cl_platform_id = struct _cl_platform_id*;
using cl_device_id = struct _cl_device_id*;
using cl_context = struct _cl_context*;
using cl_command_queue = struct _cl_command_queue*;
using cl_mem = struct _cl_mem*;
using cl_program = struct _cl_program*;
using cl_kernel = struct _cl_kernel*;
using cl_event = struct _cl_event*;

constexpr cl_int CL_SUCCESS = 0;
constexpr cl_int CL_IMAGE_FORMAT_NOT_SUPPORTED = -10;
constexpr cl_int CL_BUILD_PROGRAM_FAILURE = -11;
constexpr cl_int CL_PLATFORM_NOT_FOUND_KHR = -1001;
constexpr cl_bool CL_FALSE = 0;
constexpr cl_bool CL_TRUE = 1;
constexpr cl_device_type CL_DEVICE_TYPE_ALL = 0xFFFFFFFF;

constexpr cl_platform_info CL_PLATFORM_VERSION = 0x0901;
constexpr cl_platform_info CL_PLATFORM_NAME = 0x0902;
constexpr cl_platform_info CL_PLATFORM_VENDOR = 0x0903;

constexpr cl_device_info CL_DEVICE_TYPE = 0x1000;
constexpr cl_device_info CL_DEVICE_MAX_COMPUTE_UNITS = 0x1002;
constexpr cl_device_info CL_DEVICE_MAX_WORK_GROUP_SIZE = 0x1004;
constexpr cl_device_info CL_DEVICE_MAX_WORK_ITEM_SIZES = 0x1005;
constexpr cl_device_info CL_DEVICE_MAX_CLOCK_FREQUENCY = 0x100C;
constexpr cl_device_info CL_DEVICE_MEM_BASE_ADDR_ALIGN = 0x1019;  // in bits
constexpr cl_device_info CL_DEVICE_GLOBAL_MEM_SIZE = 0x101F;
constexpr cl_device_info CL_DEVICE_LOCAL_MEM_SIZE = 0x1023;
constexpr cl_device_info CL_DEVICE_NAME = 0x102B;
constexpr cl_device_info CL_DEVICE_VENDOR = 0x102C;
constexpr cl_device_info CL_DRIVER_VERSION = 0x102D;
constexpr cl_device_info CL_DEVICE_VERSION = 0x102F;
constexpr cl_device_info CL_DEVICE_EXTENSIONS = 0x1030;
constexpr cl_device_info CL_DEVICE_OPENCL_C_VERSION = 0x103D;
constexpr cl_device_info CL_DEVICE_SVM_CAPABILITIES = 0x1053;
constexpr cl_device_info CL_DEVICE_IMAGE2D_MAX_WIDTH = 0x1011;
constexpr cl_device_info CL_DEVICE_IMAGE2D_MAX_HEIGHT = 0x1012;
constexpr cl_device_info CL_DEVICE_IMAGE_SUPPORT = 0x1016;
constexpr cl_device_info CL_DEVICE_IMAGE_MAX_BUFFER_SIZE = 0x1040;
constexpr cl_device_info CL_DEVICE_IMAGE_MAX_ARRAY_SIZE = 0x1041;
constexpr cl_device_info CL_DEVICE_IMAGE_PITCH_ALIGNMENT = 0x104A;       // in pixels
constexpr cl_device_info CL_DEVICE_IMAGE_BASE_ADDRESS_ALIGNMENT = 0x104B;  // in pixels

constexpr cl_device_svm_capabilities CL_DEVICE_SVM_COARSE_GRAIN_BUFFER = 1 << 0;
constexpr cl_device_svm_capabilities CL_DEVICE_SVM_FINE_GRAIN_BUFFER = 1 << 1;
constexpr cl_device_svm_capabilities CL_DEVICE_SVM_ATOMICS = 1 << 3;

constexpr cl_mem_flags CL_MEM_READ_WRITE = 1 << 0;
constexpr cl_mem_flags CL_MEM_USE_HOST_PTR = 1 << 3;
constexpr cl_mem_flags CL_MEM_ALLOC_HOST_PTR = 1 << 4;
constexpr cl_svm_mem_flags CL_MEM_SVM_FINE_GRAIN_BUFFER = 1 << 10;
constexpr cl_svm_mem_flags CL_MEM_SVM_ATOMICS = 1 << 11;
constexpr cl_map_flags CL_MAP_READ = 1 << 0;
constexpr cl_map_flags CL_MAP_WRITE = 1 << 1;
using cl_buffer_create_type = cl_uint;
constexpr cl_buffer_create_type CL_BUFFER_CREATE_TYPE_REGION = 0x1220;
/*! \brief The region of a sub-buffer (clCreateSubBuffer's CL_BUFFER_CREATE_TYPE_REGION). */
struct cl_buffer_region {
  size_t origin;
  size_t size;
};

constexpr cl_channel_order CL_RGBA = 0x10B5;
constexpr cl_channel_type CL_HALF_FLOAT = 0x10DD;
constexpr cl_channel_type CL_FLOAT = 0x10DE;
constexpr cl_mem_object_type CL_MEM_OBJECT_IMAGE2D = 0x10F1;
constexpr cl_mem_object_type CL_MEM_OBJECT_IMAGE2D_ARRAY = 0x10F3;
/*! \brief An image's channel order and channel type (clCreateImage). */
struct cl_image_format {
  cl_channel_order image_channel_order;
  cl_channel_type image_channel_data_type;
};
/*! \brief An image's type, size and pitches (OpenCL 1.2 and later); `buffer` backs an image
 * created from a buffer (cl_khr_image2d_from_buffer), else null. */
struct cl_image_desc {
  cl_mem_object_type image_type;
  size_t image_width;
  size_t image_height;
  size_t image_depth;
  size_t image_array_size;
  size_t image_row_pitch;
  size_t image_slice_pitch;
  cl_uint num_mip_levels;
  cl_uint num_samples;
  cl_mem buffer;
};

constexpr cl_command_queue_properties CL_QUEUE_PROFILING_ENABLE = 1 << 1;
constexpr cl_queue_properties CL_QUEUE_PROPERTIES = 0x1093;
constexpr cl_context_properties CL_CONTEXT_PLATFORM = 0x1084;

constexpr cl_program_info CL_PROGRAM_BINARY_SIZES = 0x1165;
constexpr cl_program_info CL_PROGRAM_BINARIES = 0x1166;
constexpr cl_program_build_info CL_PROGRAM_BUILD_LOG = 0x1183;
constexpr cl_profiling_info CL_PROFILING_COMMAND_QUEUED = 0x1280;
constexpr cl_profiling_info CL_PROFILING_COMMAND_START = 0x1282;
constexpr cl_profiling_info CL_PROFILING_COMMAND_END = 0x1283;
constexpr cl_event_info CL_EVENT_COMMAND_EXECUTION_STATUS = 0x11D3;
constexpr cl_int CL_COMPLETE = 0;

/*! \brief Entry points resolved from the ICD loader; null when the loader lacks one. */
struct Api {
#define CODL_CL_FN(ret, name, args) ret(*name) args = nullptr;
#include "cl_functions.def"
#undef CODL_CL_FN
};

/*! \brief Library to try before the system's libOpenCL (pyopencl's bundled ICD loader). */
void SetLibraryPath(const std::string& path);

/*! \brief The loaded API; throws a RuntimeError naming the library when it cannot be loaded. */
const Api& GetApi();

/*! \brief Name of an OpenCL error code, e.g. "CL_INVALID_VALUE". */
const char* ErrorName(cl_int code);

/*! \brief Throw a RuntimeError naming the failed call and the error. */
[[noreturn]] void ThrowCLError(const char* call, cl_int code, const std::string& context = "");

}  // namespace cl
}  // namespace codl

/*! \brief Call an OpenCL entry point; any error raises a Python-visible RuntimeError. */
#define CODL_CL_CALL(func, ...)                                                \
  do {                                                                         \
    const auto& codl_api_ = ::codl::cl::GetApi();                              \
    if (codl_api_.func == nullptr) ::codl::cl::ThrowCLError(#func, -9999);     \
    ::codl::cl::cl_int codl_err_ = codl_api_.func(__VA_ARGS__);                \
    if (codl_err_ != ::codl::cl::CL_SUCCESS) ::codl::cl::ThrowCLError(#func, codl_err_); \
  } while (0)

#endif  // CODL_TVM_RUNTIME_CL_API_H_

/*
 * codl-tvm OpenCL runtime plugin: ICD loading, error names and the OpenCL workspace.
 */
#include "workspace.h"

#include <dlfcn.h>
#include <time.h>
#include <tvm/ffi/error.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace codl {
namespace cl {

namespace {

std::string& LibraryPathOverride() {
  static std::string path;
  return path;
}

}  // namespace

void SetLibraryPath(const std::string& path) { LibraryPathOverride() = path; }

const Api& GetApi() {
  static Api api;
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("CODL_OPENCL_LIBRARY"); env && *env) candidates.push_back(env);
    if (!LibraryPathOverride().empty()) candidates.push_back(LibraryPathOverride());
    candidates.push_back("libOpenCL.so.1");
    candidates.push_back("libOpenCL.so");
    void* handle = nullptr;
    std::string tried;
    for (const auto& c : candidates) {
      handle = dlopen(c.c_str(), RTLD_NOW | RTLD_GLOBAL);
      if (handle) break;
      tried += "\n  " + c + ": " + dlerror();
    }
    if (!handle) {
      error = "could not load an OpenCL ICD loader; tried:" + tried +
              "\nInstall pyopencl[pocl] (a CPU OpenCL device from PyPI) or a GPU driver, or set "
              "CODL_OPENCL_LIBRARY to a libOpenCL.so.";
      return;
    }
#define CODL_CL_FN(ret, name, args) api.name = reinterpret_cast<ret(*) args>(dlsym(handle, #name));
#include "cl_functions.def"
#undef CODL_CL_FN
    if (api.clGetPlatformIDs == nullptr) error = "the OpenCL library has no clGetPlatformIDs";
  });
  if (!error.empty()) TVM_FFI_THROW(RuntimeError) << error;
  return api;
}

const char* ErrorName(cl_int code) {
  switch (code) {
    case 0: return "CL_SUCCESS";
    case -1: return "CL_DEVICE_NOT_FOUND";
    case -2: return "CL_DEVICE_NOT_AVAILABLE";
    case -3: return "CL_COMPILER_NOT_AVAILABLE";
    case -4: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case -5: return "CL_OUT_OF_RESOURCES";
    case -6: return "CL_OUT_OF_HOST_MEMORY";
    case -7: return "CL_PROFILING_INFO_NOT_AVAILABLE";
    case -8: return "CL_MEM_COPY_OVERLAP";
    case -9: return "CL_IMAGE_FORMAT_MISMATCH";
    case -10: return "CL_IMAGE_FORMAT_NOT_SUPPORTED";
    case -11: return "CL_BUILD_PROGRAM_FAILURE";
    case -12: return "CL_MAP_FAILURE";
    case -13: return "CL_MISALIGNED_SUB_BUFFER_OFFSET";
    case -14: return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
    case -30: return "CL_INVALID_VALUE";
    case -32: return "CL_INVALID_PLATFORM";
    case -33: return "CL_INVALID_DEVICE";
    case -34: return "CL_INVALID_CONTEXT";
    case -35: return "CL_INVALID_QUEUE_PROPERTIES";
    case -36: return "CL_INVALID_COMMAND_QUEUE";
    case -37: return "CL_INVALID_HOST_PTR";
    case -38: return "CL_INVALID_MEM_OBJECT";
    case -39: return "CL_INVALID_IMAGE_FORMAT_DESCRIPTOR";
    case -40: return "CL_INVALID_IMAGE_SIZE";
    case -42: return "CL_INVALID_BINARY";
    case -43: return "CL_INVALID_BUILD_OPTIONS";
    case -44: return "CL_INVALID_PROGRAM";
    case -45: return "CL_INVALID_PROGRAM_EXECUTABLE";
    case -46: return "CL_INVALID_KERNEL_NAME";
    case -47: return "CL_INVALID_KERNEL_DEFINITION";
    case -48: return "CL_INVALID_KERNEL";
    case -49: return "CL_INVALID_ARG_INDEX";
    case -50: return "CL_INVALID_ARG_VALUE";
    case -51: return "CL_INVALID_ARG_SIZE";
    case -52: return "CL_INVALID_KERNEL_ARGS";
    case -53: return "CL_INVALID_WORK_DIMENSION";
    case -54: return "CL_INVALID_WORK_GROUP_SIZE";
    case -55: return "CL_INVALID_WORK_ITEM_SIZE";
    case -56: return "CL_INVALID_GLOBAL_OFFSET";
    case -57: return "CL_INVALID_EVENT_WAIT_LIST";
    case -58: return "CL_INVALID_EVENT";
    case -59: return "CL_INVALID_OPERATION";
    case -61: return "CL_INVALID_BUFFER_SIZE";
    case -63: return "CL_INVALID_GLOBAL_WORK_SIZE";
    case -64: return "CL_INVALID_PROPERTY";
    case -65: return "CL_INVALID_IMAGE_DESCRIPTOR";
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    case -9999: return "entry point missing from the OpenCL library";
    default: return "unknown OpenCL error";
  }
}

void ThrowCLError(const char* call, cl_int code, const std::string& context) {
  std::ostringstream os;
  os << "OpenCL call " << call << " failed: " << ErrorName(code) << " (" << code << ")";
  if (!context.empty()) os << ": " << context;
  TVM_FFI_THROW(RuntimeError) << os.str();
  TVM_FFI_UNREACHABLE();
}

}  // namespace cl

using namespace cl;  // NOLINT(build/namespaces)

const char* SvmModeName(SvmMode mode) {
  switch (mode) {
    case SvmMode::kFineGrain: return "fine";
    case SvmMode::kCoarseGrain: return "coarse";
    default: return "buffer";
  }
}

int64_t HostClockNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

namespace {

std::string PlatformString(cl_platform_id p, cl_platform_info what) {
  size_t n = 0;
  CODL_CL_CALL(clGetPlatformInfo, p, what, 0, nullptr, &n);
  std::string s(n, '\0');
  CODL_CL_CALL(clGetPlatformInfo, p, what, n, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

std::string DeviceString(cl_device_id d, cl_device_info what) {
  size_t n = 0;
  CODL_CL_CALL(clGetDeviceInfo, d, what, 0, nullptr, &n);
  std::string s(n, '\0');
  CODL_CL_CALL(clGetDeviceInfo, d, what, n, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

template <typename T>
T DeviceValue(cl_device_id d, cl_device_info what) {
  T v{};
  CODL_CL_CALL(clGetDeviceInfo, d, what, sizeof(T), &v, nullptr);
  return v;
}

/*!
 * \brief Query a device's image support. Never throws: a device whose driver rejects a query
 * (OpenCL 1.x has no pitch alignment) keeps the field's default, and images stay usable or not
 * as CL_DEVICE_IMAGE_SUPPORT says.
 */
ImageCaps QueryImageCaps(cl_context ctx, cl_device_id id, const std::string& extensions) {
  const Api& api = GetApi();
  ImageCaps c;
  cl_bool support = CL_FALSE;
  if (api.clGetDeviceInfo(id, CL_DEVICE_IMAGE_SUPPORT, sizeof(support), &support, nullptr) !=
          CL_SUCCESS ||
      support == CL_FALSE || api.clCreateImage == nullptr) {
    return c;
  }
  c.supported = true;
  api.clGetDeviceInfo(id, CL_DEVICE_IMAGE2D_MAX_WIDTH, sizeof(size_t), &c.max_width, nullptr);
  api.clGetDeviceInfo(id, CL_DEVICE_IMAGE2D_MAX_HEIGHT, sizeof(size_t), &c.max_height, nullptr);
  api.clGetDeviceInfo(id, CL_DEVICE_IMAGE_MAX_ARRAY_SIZE, sizeof(size_t), &c.max_array_size,
                      nullptr);
  cl_uint v = 0;
  if (api.clGetDeviceInfo(id, CL_DEVICE_IMAGE_PITCH_ALIGNMENT, sizeof(v), &v, nullptr) ==
          CL_SUCCESS &&
      v > 0) {
    c.pitch_align_pixels = v;
  }
  v = 0;
  if (api.clGetDeviceInfo(id, CL_DEVICE_IMAGE_BASE_ADDRESS_ALIGNMENT, sizeof(v), &v, nullptr) ==
          CL_SUCCESS &&
      v > 0) {
    c.base_align_pixels = v;
  }
  c.from_buffer = extensions.find("cl_khr_image2d_from_buffer") != std::string::npos;
  cl_uint n = 0;
  if (api.clGetSupportedImageFormats != nullptr &&
      api.clGetSupportedImageFormats(ctx, CL_MEM_READ_WRITE, CL_MEM_OBJECT_IMAGE2D_ARRAY, 0,
                                     nullptr, &n) == CL_SUCCESS &&
      n > 0) {
    std::vector<cl_image_format> formats(n);
    if (api.clGetSupportedImageFormats(ctx, CL_MEM_READ_WRITE, CL_MEM_OBJECT_IMAGE2D_ARRAY, n,
                                       formats.data(), nullptr) == CL_SUCCESS) {
      for (const auto& f : formats) {
        if (f.image_channel_order != CL_RGBA) continue;
        c.rgba_float |= f.image_channel_data_type == CL_FLOAT;
        c.rgba_half |= f.image_channel_data_type == CL_HALF_FLOAT;
      }
    }
  }
  return c;
}

/*! \brief Build a trivial kernel on the platform's first device; "" on success, else why not. */
std::string ProbeCompiler(cl_platform_id p) {
  const Api& api = GetApi();
  cl_device_id dev = nullptr;
  if (api.clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &dev, nullptr) != CL_SUCCESS) return "no device";
  cl_context_properties props[] = {CL_CONTEXT_PLATFORM, reinterpret_cast<cl_context_properties>(p),
                                   0};
  cl_int err = CL_SUCCESS;
  cl_context ctx = api.clCreateContext(props, 1, &dev, nullptr, nullptr, &err);
  if (err != CL_SUCCESS) return std::string("clCreateContext: ") + ErrorName(err);
  const char* src = "__kernel void codl_probe(__global float* a) { a[get_global_id(0)] = 1.0f; }";
  size_t len = strlen(src);
  std::string why;
  cl_program prog = api.clCreateProgramWithSource(ctx, 1, &src, &len, &err);
  if (err == CL_SUCCESS) {
    err = api.clBuildProgram(prog, 1, &dev, "", nullptr, nullptr);
    if (err != CL_SUCCESS) {
      size_t n = 0;
      api.clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
      std::string log(n, '\0');
      if (n) api.clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
      // The log's first lines say why; a whole log can be many kilobytes.
      std::string first;
      size_t start = 0;
      for (int n = 0; n < 3 && start < log.size(); ++n) {
        size_t end = log.find('\n', start);
        if (end == std::string::npos) end = log.size();
        if (end > start) first += (first.empty() ? "" : " | ") + log.substr(start, end - start);
        start = end + 1;
      }
      why = std::string("cannot build a kernel (") + ErrorName(err) + "): " +
            (first.empty() ? "<empty build log>" : first);
    }
    api.clReleaseProgram(prog);
  } else {
    why = std::string("clCreateProgramWithSource: ") + ErrorName(err);
  }
  api.clReleaseContext(ctx);
  return why;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

/*!
 * \brief Whether the user's platform choice `want` (lower case, non-empty) names the platform
 * `name` of vendor `vendor`: a substring of either, case-insensitive, or a short name people use
 * for it ("pocl" for "Portable Computing Language", "amd" for "Advanced Micro Devices, Inc.").
 */
bool PlatformMatches(const std::string& want, const std::string& name, const std::string& vendor) {
  std::string n = Lower(name), v = Lower(vendor);
  if (n.find(want) != std::string::npos || v.find(want) != std::string::npos) return true;
  static const std::pair<const char*, const char*> kShortNames[] = {
      {"pocl", "portable computing language"}, {"amd", "advanced micro devices"},
      {"mali", "arm"},                          {"adreno", "qualcomm"},
      {"nvidia", "nvidia"},                     {"intel", "intel"},
  };
  for (const auto& [short_name, full] : kShortNames) {
    if (want == short_name &&
        (n.find(full) != std::string::npos || v.find(full) != std::string::npos)) {
      return true;
    }
  }
  return false;
}

}  // namespace

Workspace* Workspace::Global() {
  // Leaked on purpose: TVM tensors may be freed during interpreter shutdown after statics die.
  static Workspace* inst = new Workspace();
  return inst;
}

void Workspace::Configure(const WorkspaceConfig& config) {
  std::lock_guard<std::mutex> lock(init_mu_);
  if (initialized_) {
    bool same = config.platform_filter == config_.platform_filter &&
                config.device_index == config_.device_index &&
                config.svm_override == config_.svm_override;
    if (!same) {
      TVM_FFI_THROW(RuntimeError)
          << "codl-tvm OpenCL runtime is already initialised (platform '" << platform_name_
          << "'); device selection must be configured before the first OpenCL use";
    }
    config_.cache_dir = config.cache_dir;
    return;
  }
  config_ = config;
  configured_ = true;
}

void Workspace::EnsureInit() {
  if (initialized_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(init_mu_);
  if (initialized_) return;
  InitLocked();
  initialized_.store(true, std::memory_order_release);
}

void Workspace::InitLocked() {
  const Api& api = GetApi();
  if (!configured_) {
    // Environment variables are the configuration when the Python side did not call Configure.
    if (const char* v = std::getenv("CODL_OPENCL_PLATFORM")) config_.platform_filter = v;
    if (const char* v = std::getenv("CODL_OPENCL_DEVICE"); v && *v) config_.device_index = atoi(v);
    if (const char* v = std::getenv("CODL_OPENCL_SVM")) config_.svm_override = v;
  }
  cl_uint nplat = 0;
  cl_int err = api.clGetPlatformIDs(0, nullptr, &nplat);
  if (err == CL_PLATFORM_NOT_FOUND_KHR || (err == CL_SUCCESS && nplat == 0)) {
    const char* vendors = std::getenv("OCL_ICD_VENDORS");
    TVM_FFI_THROW(RuntimeError)
        << "No OpenCL platform found (OCL_ICD_VENDORS=" << (vendors ? vendors : "<unset>")
        << "). Install pyopencl[pocl] for a CPU OpenCL device from PyPI, or a GPU vendor "
           "driver with an ICD file.";
  }
  if (err != CL_SUCCESS) ThrowCLError("clGetPlatformIDs", err);
  std::vector<cl_platform_id> plats(nplat);
  CODL_CL_CALL(clGetPlatformIDs, nplat, plats.data(), nullptr);

  std::string want = Lower(config_.platform_filter);
  std::vector<std::string> names;
  for (cl_platform_id p : plats) {
    std::string name = PlatformString(p, CL_PLATFORM_NAME);
    names.push_back(name);
    // Every platform not used is listed with its reason (codl-tvm info shows them), the ones
    // never tried included: the user may have meant one of them.
    if (platform_ != nullptr) {
      skipped_.push_back({name, "not tried: '" + platform_name_ + "' comes first and is used"});
      continue;
    }
    if (!want.empty() && !PlatformMatches(want, name, PlatformString(p, CL_PLATFORM_VENDOR))) {
      skipped_.push_back({name, "not tried: not the platform asked for ('" +
                                    config_.platform_filter + "')"});
      continue;
    }
    cl_uint ndev = 0;
    if (api.clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &ndev) != CL_SUCCESS || ndev == 0) {
      skipped_.push_back({name, "no devices"});
      continue;
    }
    // Skip platforms whose compiler cannot build a trivial kernel (e.g. PoCL 3.0's LLVM 14 does
    // not know some recent host CPUs), chosen by name or not: a chosen one that cannot build
    // is an error naming the reason below, not a failure at the model's first kernel.
    std::string why = ProbeCompiler(p);
    if (!why.empty()) {
      skipped_.push_back({name, why});
      continue;
    }
    platform_ = p;
    platform_name_ = name;
  }
  if (platform_ == nullptr) {
    std::ostringstream os;
    for (size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << "'" << names[i] << "'";
    for (const auto& s : skipped_) {
      if (s.second.rfind("not tried", 0) != 0) os << "; skipped '" << s.first << "': " << s.second;
    }
    TVM_FFI_THROW(RuntimeError) << "No usable OpenCL platform"
                                << (want.empty() ? "" : " matches '" + config_.platform_filter + "'")
                                << "; available platforms: " << os.str()
                                << " (CODL_OPENCL_PLATFORM picks one by a part of its name or "
                                   "vendor, or pocl, intel, nvidia, amd, mali, adreno)";
  }
  platform_version_ = PlatformString(platform_, CL_PLATFORM_VERSION);
  platform_vendor_ = PlatformString(platform_, CL_PLATFORM_VENDOR);

  cl_uint ndev = 0;
  CODL_CL_CALL(clGetDeviceIDs, platform_, CL_DEVICE_TYPE_ALL, 0, nullptr, &ndev);
  std::vector<cl_device_id> ids(ndev);
  CODL_CL_CALL(clGetDeviceIDs, platform_, CL_DEVICE_TYPE_ALL, ndev, ids.data(), nullptr);
  if (config_.device_index >= 0) {
    if (config_.device_index >= static_cast<int>(ndev)) {
      TVM_FFI_THROW(RuntimeError) << "OpenCL device index " << config_.device_index
                                  << " does not exist on platform '" << platform_name_
                                  << "', which has " << ndev << " device(s)";
    }
    ids = {ids[config_.device_index]};
  }
  for (cl_device_id id : ids) {
    DeviceEntry e;
    e.id = id;
    e.name = DeviceString(id, CL_DEVICE_NAME);
    e.vendor = DeviceString(id, CL_DEVICE_VENDOR);
    e.version = DeviceString(id, CL_DEVICE_VERSION);
    e.driver_version = DeviceString(id, CL_DRIVER_VERSION);
    e.c_version = DeviceString(id, CL_DEVICE_OPENCL_C_VERSION);
    e.extensions = DeviceString(id, CL_DEVICE_EXTENSIONS);
    e.compute_units = DeviceValue<cl_uint>(id, CL_DEVICE_MAX_COMPUTE_UNITS);
    e.max_clock_mhz = DeviceValue<cl_uint>(id, CL_DEVICE_MAX_CLOCK_FREQUENCY);
    e.global_mem_bytes = DeviceValue<cl_ulong>(id, CL_DEVICE_GLOBAL_MEM_SIZE);
    e.local_mem_bytes = DeviceValue<cl_ulong>(id, CL_DEVICE_LOCAL_MEM_SIZE);
    e.max_work_group_size = DeviceValue<size_t>(id, CL_DEVICE_MAX_WORK_GROUP_SIZE);
    api.clGetDeviceInfo(id, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof(e.max_work_item_sizes),
                        e.max_work_item_sizes, nullptr);
    e.base_addr_align_bytes =
        std::max<size_t>(DeviceValue<cl_uint>(id, CL_DEVICE_MEM_BASE_ADDR_ALIGN) / 8, 1);
    // OpenCL 1.x devices reject the query: they have no SVM.
    if (api.clGetDeviceInfo(id, CL_DEVICE_SVM_CAPABILITIES, sizeof(e.svm_caps), &e.svm_caps,
                            nullptr) != CL_SUCCESS) {
      e.svm_caps = 0;
    }
    devices_.push_back(std::move(e));
  }

  // The weakest device decides the context-wide allocation mode.
  bool all_fine = true, all_coarse = true, all_atomics = true;
  for (const auto& e : devices_) {
    all_fine &= (e.svm_caps & CL_DEVICE_SVM_FINE_GRAIN_BUFFER) != 0;
    all_coarse &= (e.svm_caps & (CL_DEVICE_SVM_COARSE_GRAIN_BUFFER)) != 0 || all_fine;
    all_atomics &= (e.svm_caps & CL_DEVICE_SVM_ATOMICS) != 0;
  }
  if (api.clSVMAlloc == nullptr) all_fine = all_coarse = false;
  SvmMode best = all_fine ? SvmMode::kFineGrain
                          : (all_coarse ? SvmMode::kCoarseGrain : SvmMode::kBuffer);
  svm_mode_ = best;
  const std::string& ov = config_.svm_override;
  if (!ov.empty()) {
    SvmMode want_mode;
    if (ov == "fine") {
      want_mode = SvmMode::kFineGrain;
    } else if (ov == "coarse") {
      want_mode = SvmMode::kCoarseGrain;
    } else if (ov == "buffer") {
      want_mode = SvmMode::kBuffer;
    } else {
      TVM_FFI_THROW(ValueError) << "CODL_OPENCL_SVM must be fine, coarse or buffer, not '" << ov
                                << "'";
    }
    if (static_cast<int>(want_mode) < static_cast<int>(best)) {
      TVM_FFI_THROW(RuntimeError) << "SVM mode '" << ov << "' requested but the device(s) of '"
                                  << platform_name_ << "' only support '" << SvmModeName(best)
                                  << "'";
    }
    svm_mode_ = want_mode;
  }
  svm_atomics_ = svm_mode_ == SvmMode::kFineGrain && all_atomics;

  cl_context_properties props[] = {CL_CONTEXT_PLATFORM,
                                   reinterpret_cast<cl_context_properties>(platform_), 0};
  std::vector<cl_device_id> dev_ids;
  for (const auto& e : devices_) dev_ids.push_back(e.id);
  cl_int cerr = CL_SUCCESS;
  context_ = api.clCreateContext(props, static_cast<cl_uint>(dev_ids.size()), dev_ids.data(),
                                 nullptr, nullptr, &cerr);
  if (cerr != CL_SUCCESS) ThrowCLError("clCreateContext", cerr, platform_name_);
  for (auto& e : devices_) {
    // Profiling stays on: the event timer and the profiler read command timestamps.
    cl_int qerr = CL_SUCCESS;
    if (api.clCreateCommandQueueWithProperties != nullptr) {
      cl_queue_properties qprops[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
      e.queue = api.clCreateCommandQueueWithProperties(context_, e.id, qprops, &qerr);
    } else {
      e.queue = api.clCreateCommandQueue(context_, e.id, CL_QUEUE_PROFILING_ENABLE, &qerr);
    }
    if (qerr != CL_SUCCESS) ThrowCLError("clCreateCommandQueue", qerr, e.name);
    // image formats are a property of the context and device: queried once it exists
    e.images = QueryImageCaps(context_, e.id, e.extensions);
  }
}

const DeviceEntry& Workspace::Device(int dev_id) {
  EnsureInit();
  if (dev_id < 0 || dev_id >= static_cast<int>(devices_.size())) {
    TVM_FFI_THROW(RuntimeError) << "opencl(" << dev_id << ") does not exist: platform '"
                                << platform_name_ << "' has " << devices_.size()
                                << " selected device(s)";
  }
  return devices_[dev_id];
}

void Workspace::RegisterAlloc(void* ptr, size_t nbytes) {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  allocs_[ptr] = nbytes;
}

void Workspace::UnregisterAlloc(void* ptr) {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  allocs_.erase(ptr);
}

bool Workspace::FindAlloc(const void* ptr, void** base, size_t* nbytes) {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  auto p = reinterpret_cast<uintptr_t>(ptr);
  for (const auto& kv : allocs_) {
    auto b = reinterpret_cast<uintptr_t>(kv.first);
    if (p >= b && p < b + std::max<size_t>(kv.second, 1)) {
      *base = kv.first;
      *nbytes = kv.second;
      return true;
    }
  }
  return false;
}

void* Workspace::MapForHost(const void* ptr) {
  if (svm_mode_ == SvmMode::kFineGrain) return const_cast<void*>(ptr);
  if (svm_mode_ == SvmMode::kBuffer) {
    if (!IsBuffer(ptr)) {
      TVM_FFI_THROW(ValueError) << "pointer " << ptr << " is not an OpenCL buffer of the "
                                << "codl-tvm OpenCL runtime (buffer mode)";
    }
    auto* desc = static_cast<BufferDescriptor*>(const_cast<void*>(ptr));
    std::lock_guard<std::mutex> lock(map_mu_);
    if (desc->host != nullptr) return desc->host;
    // ALLOC_HOST_PTR buffers map without a copy on shared-memory SoCs (and on CPU devices);
    // elsewhere the driver copies here and back at the unmap, which is still correct.
    cl_int err = CL_SUCCESS;
    void* host = GetApi().clEnqueueMapBuffer(Queue(0), desc->mem, CL_TRUE,
                                             CL_MAP_READ | CL_MAP_WRITE, 0, desc->nbytes, 0,
                                             nullptr, nullptr, &err);
    if (err != CL_SUCCESS) {
      ThrowCLError("clEnqueueMapBuffer", err, std::to_string(desc->nbytes) + " bytes");
    }
    desc->host = host;
    ++host_maps;
    mapped_.push_back(desc);
    any_mapped_.store(true);
    return host;
  }
  void* base = nullptr;
  size_t nbytes = 0;
  if (!FindAlloc(ptr, &base, &nbytes)) {
    TVM_FFI_THROW(ValueError) << "pointer " << ptr << " is not in an SVM allocation of the "
                              << "codl-tvm OpenCL runtime";
  }
  std::lock_guard<std::mutex> lock(map_mu_);
  for (void* m : mapped_) {
    if (m == base) return const_cast<void*>(ptr);
  }
  CODL_CL_CALL(clEnqueueSVMMap, Queue(0), CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, base, nbytes, 0,
               nullptr, nullptr);
  mapped_.push_back(base);
  any_mapped_.store(true);
  return const_cast<void*>(ptr);
}

namespace {

/*! \brief Enqueue the unmap of one mapped allocation (an SVM base or a BufferDescriptor). */
void EnqueueUnmap(cl_command_queue q, SvmMode mode, void* m) {
  if (mode == SvmMode::kBuffer) {
    auto* desc = static_cast<BufferDescriptor*>(m);
    CODL_CL_CALL(clEnqueueUnmapMemObject, q, desc->mem, desc->host, 0, nullptr, nullptr);
    desc->host = nullptr;
  } else {
    CODL_CL_CALL(clEnqueueSVMUnmap, q, m, 0, nullptr, nullptr);
  }
}

}  // namespace

void Workspace::UnmapAll() {
  if (!any_mapped_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(map_mu_);
  for (void* m : mapped_) EnqueueUnmap(Queue(0), svm_mode_, m);
  mapped_.clear();
  any_mapped_.store(false);
}

void Workspace::Unmap(const void* ptr) {
  void* key = const_cast<void*>(ptr);
  if (svm_mode_ != SvmMode::kBuffer) {
    size_t nbytes = 0;
    if (!FindAlloc(ptr, &key, &nbytes)) return;
  }
  std::lock_guard<std::mutex> lock(map_mu_);
  auto it = std::find(mapped_.begin(), mapped_.end(), key);
  if (it == mapped_.end()) return;
  EnqueueUnmap(Queue(0), svm_mode_, key);
  mapped_.erase(it);
  any_mapped_.store(!mapped_.empty());
}

bool Workspace::IsBuffer(const void* ptr) {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  return svm_mode_ == SvmMode::kBuffer && allocs_.count(const_cast<void*>(ptr)) != 0;
}

cl_mem Workspace::SubBuffer(BufferDescriptor* desc, size_t origin, size_t size) {
  std::lock_guard<std::mutex> lock(sub_mu_);
  auto key = std::make_pair(origin, size);
  auto it = desc->subs.find(key);
  if (it != desc->subs.end()) return it->second;
  cl_buffer_region region{origin, size};
  cl_int err = CL_SUCCESS;
  cl_mem sub = GetApi().clCreateSubBuffer(desc->mem, CL_MEM_READ_WRITE,
                                          CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
  if (err != CL_SUCCESS) {
    ThrowCLError("clCreateSubBuffer", err,
                 "bytes [" + std::to_string(origin) + ", " + std::to_string(origin + size) +
                     ") of a " + std::to_string(desc->nbytes) + "-byte buffer");
  }
  desc->subs.emplace(key, sub);
  ++sub_buffers;
  return sub;
}

void Workspace::StartRecording() { recording_.fetch_add(1); }

std::vector<KernelRecord> Workspace::StopRecording() {
  std::vector<KernelRecord> out;
  {
    std::lock_guard<std::mutex> lock(rec_mu_);
    if (recording_.fetch_sub(1) == 1) {
      out.swap(records_);
    } else {
      out = records_;
      for (auto& r : out) CODL_CL_CALL(clRetainEvent, r.event);
    }
  }
  return out;
}

void Workspace::Record(KernelRecord rec) {
  std::lock_guard<std::mutex> lock(rec_mu_);
  records_.push_back(std::move(rec));
}

std::string Workspace::InfoJson() {
  EnsureInit();
  std::ostringstream os;
  os << "{\"platform\": \"" << JsonEscape(platform_name_) << "\", \"platform_version\": \""
     << JsonEscape(platform_version_) << "\", \"platform_vendor\": \""
     << JsonEscape(platform_vendor_) << "\", \"svm_mode\": \"" << SvmModeName(svm_mode_)
     << "\", \"svm_atomics\": " << (svm_atomics_ ? "true" : "false") << ", \"skipped_platforms\": [";
  for (size_t i = 0; i < skipped_.size(); ++i) {
    os << (i ? ", " : "") << "{\"platform\": \"" << JsonEscape(skipped_[i].first)
       << "\", \"reason\": \"" << JsonEscape(skipped_[i].second) << "\"}";
  }
  os << "], \"devices\": [";
  for (size_t i = 0; i < devices_.size(); ++i) {
    const auto& e = devices_[i];
    os << (i ? ", " : "") << "{\"index\": " << i << ", \"name\": \"" << JsonEscape(e.name)
       << "\", \"vendor\": \"" << JsonEscape(e.vendor) << "\", \"version\": \""
       << JsonEscape(e.version) << "\", \"driver_version\": \"" << JsonEscape(e.driver_version)
       << "\", \"opencl_c_version\": \"" << JsonEscape(e.c_version)
       << "\", \"compute_units\": " << e.compute_units
       << ", \"max_clock_mhz\": " << e.max_clock_mhz
       << ", \"global_mem_bytes\": " << e.global_mem_bytes
       << ", \"local_mem_bytes\": " << e.local_mem_bytes
       << ", \"max_work_group_size\": " << e.max_work_group_size << ", \"svm_fine_grain\": "
       << ((e.svm_caps & CL_DEVICE_SVM_FINE_GRAIN_BUFFER) ? "true" : "false")
       << ", \"svm_coarse_grain\": "
       << ((e.svm_caps & CL_DEVICE_SVM_COARSE_GRAIN_BUFFER) ? "true" : "false")
       << ", \"svm_atomics\": " << ((e.svm_caps & CL_DEVICE_SVM_ATOMICS) ? "true" : "false")
       << ", \"fp16\": "
       << (e.extensions.find("cl_khr_fp16") != std::string::npos ? "true" : "false") << "}";
  }
  os << "]}";
  return os.str();
}

}  // namespace codl

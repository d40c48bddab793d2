/*
 * codl-tvm OpenCL runtime plugin for TVM's PyPI wheel (built without USE_OPENCL).
 *
 * Registers with the stock TVM runtime:
 *  - `device_api.opencl`: a DeviceAPI allocating in shared virtual memory (fine-grained where the
 *    device has it, coarse-grained otherwise), so device tensors are host-addressable and CPU
 *    kernels can use them without copies; devices without SVM get host-mapped buffers
 *    (ALLOC_HOST_PTR, mapped for the CPU around GPU use, byte-offset views as sub-buffers);
 *  - `ffi.Module.load_from_bytes.opencl`: the loader of TVM's serialized OpenCL modules (format
 *    "cl": function-info map and source with `// Function: name` delimiters), with each kernel
 *    compiled once per context and program binaries cached on disk;
 *  - `runtime.timer.opencl`: an event-based timer so `time_evaluator` works on tvm.opencl();
 *  - tensors of TVM's texture memory scopes as OpenCL images (images.cc, which also registers
 *    `DeviceAllocator.opencl` for the Relax VM's texture-scope storages and views): allocated
 *    here, passed to kernels as image arguments, copied with the image commands;
 *  - `codl.opencl.*`: configuration, device info, cache statistics, kernel-event recording, CPU
 *    views of device tensors and map/unmap.
 */
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/cast.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/runtime/device_api.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "images.h"
#include "workspace.h"

namespace codl {

/*!
 * \brief Mirror of tvm::runtime::TimerNode (tvm/runtime/timer.h cannot be included: the wheel
 * lacks headers it needs). Same type key, so the runtime resolves the same type index, and the
 * same virtual methods in the same order, so `Timer::Start` calls into our subclass.
 */
class TimerNodeABI : public tvm::ffi::Object {
 public:
  virtual void Start() = 0;
  virtual void Stop() = 0;
  virtual int64_t SyncAndGetElapsedNanos() = 0;
  virtual ~TimerNodeABI() {}
  static constexpr const bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO("runtime.TimerNode", TimerNodeABI, tvm::ffi::Object);
};

using namespace cl;  // NOLINT(build/namespaces)
using tvm::Device;
using tvm::runtime::DeviceAPI;
using tvm::runtime::DeviceAttrKind;
namespace ffi = tvm::ffi;

namespace {

thread_local int tls_device_id = 0;

/*! \brief One enqueued SVM free: the pointer array handed to clEnqueueSVMFree, and the context.
 * PoCL 3.0 keeps the caller's array (not a copy) until the free runs on its queue thread, so
 * the array must outlive the call (a stack array was read after its frame was gone: free() of
 * garbage, intermittent crashes, mostly at exit); Intel's passes the callback another array
 * (deleting the one it is given was a double free). This object is the callback's user data
 * and is deleted there, whichever array the callback gets. */
struct PendingSvmFree {
  cl_context context;
  void* ptrs[1];
};

void FreeSvmPointers(cl_command_queue, cl_uint n, void** ptrs, void* data) {
  auto* pending = static_cast<PendingSvmFree*>(data);
  for (cl_uint i = 0; i < n; ++i) GetApi().clSVMFree(pending->context, ptrs[i]);
  delete pending;
}

// ---------------------------------------------------------------------------------------------
// Device API
// ---------------------------------------------------------------------------------------------

class OpenCLSVMDeviceAPI final : public DeviceAPI {
 public:
  static OpenCLSVMDeviceAPI* Global() {
    static OpenCLSVMDeviceAPI* inst = new OpenCLSVMDeviceAPI();
    return inst;
  }

  void SetDevice(Device dev) final { tls_device_id = dev.device_id; }

  void GetAttr(Device dev, DeviceAttrKind kind, ffi::Any* rv) final {
    Workspace* w = Workspace::Global();
    if (kind == tvm::runtime::kExist) {
      try {
        w->EnsureInit();
        *rv = static_cast<int>(dev.device_id >= 0 &&
                               dev.device_id < static_cast<int>(w->num_devices()));
      } catch (...) {
        *rv = 0;
      }
      return;
    }
    const DeviceEntry& e = w->Device(dev.device_id);
    switch (kind) {
      case tvm::runtime::kMaxThreadsPerBlock: *rv = static_cast<int64_t>(e.max_work_group_size); break;
      case tvm::runtime::kWarpSize: *rv = 1; break;
      case tvm::runtime::kMaxSharedMemoryPerBlock: *rv = static_cast<int64_t>(e.local_mem_bytes); break;
      case tvm::runtime::kComputeVersion: *rv = ffi::String(e.c_version); break;
      case tvm::runtime::kDeviceName: *rv = ffi::String(e.name); break;
      case tvm::runtime::kMaxClockRate: *rv = static_cast<int64_t>(e.max_clock_mhz); break;
      case tvm::runtime::kMultiProcessorCount: *rv = static_cast<int64_t>(e.compute_units); break;
      case tvm::runtime::kMaxThreadDimensions: {
        std::ostringstream os;
        os << "[" << e.max_work_item_sizes[0] << ", " << e.max_work_item_sizes[1] << ", "
           << e.max_work_item_sizes[2] << "]";
        *rv = ffi::String(os.str());
        break;
      }
      case tvm::runtime::kDriverVersion: *rv = ffi::String(e.driver_version); break;
      case tvm::runtime::kApiVersion: *rv = ffi::String(e.version); break;
      case tvm::runtime::kTotalGlobalMemory: *rv = static_cast<int64_t>(e.global_mem_bytes); break;
      default: break;
    }
  }

  void* AllocDataSpace(Device dev, size_t nbytes, size_t alignment, DLDataType) final {
    Workspace* w = Workspace::Global();
    w->Device(dev.device_id);  // validates the id and initialises
    size_t n = nbytes == 0 ? 1 : nbytes;
    const Api& api = GetApi();
    if (w->svm_mode() == SvmMode::kBuffer) {
      cl_int err = CL_SUCCESS;
      cl_mem mem = api.clCreateBuffer(w->context(), CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, n,
                                      nullptr, &err);
      if (err != CL_SUCCESS) ThrowCLError("clCreateBuffer", err, std::to_string(n) + " bytes");
      auto* desc = new BufferDescriptor{mem, n};
      w->RegisterAlloc(desc, 0);
      return desc;
    }
    cl_svm_mem_flags flags = CL_MEM_READ_WRITE;
    if (w->svm_mode() == SvmMode::kFineGrain) {
      flags |= CL_MEM_SVM_FINE_GRAIN_BUFFER;
      if (w->svm_atomics()) flags |= CL_MEM_SVM_ATOMICS;
    }
    cl_uint align = static_cast<cl_uint>(std::max<size_t>(alignment, 128));
    void* ptr = api.clSVMAlloc(w->context(), flags, n, align);
    if (ptr == nullptr) {
      TVM_FFI_THROW(RuntimeError) << "OpenCL call clSVMAlloc failed: could not allocate " << n
                                  << " bytes of " << SvmModeName(w->svm_mode())
                                  << "-grained SVM on opencl(" << dev.device_id << ")";
    }
    w->RegisterAlloc(ptr, n);
    return ptr;
  }

  // Tensors of a texture memory scope are images; every other scope is the flat allocation.
  void* AllocDataSpace(Device dev, int ndim, const int64_t* shape, DLDataType dtype,
                       ffi::Optional<ffi::String> mem_scope) final {
    if (mem_scope.has_value() && IsTextureScope(std::string(*mem_scope))) {
      return AllocImage(dev.device_id, shape, ndim, dtype, std::string(*mem_scope));
    }
    return DeviceAPI::AllocDataSpace(dev, ndim, shape, dtype, mem_scope);
  }

  void FreeDataSpace(Device dev, void* ptr) final {
    Workspace* w = Workspace::Global();
    if (ptr == nullptr || !w->initialized()) return;
    if (ImageDescriptor* image = FindImage(ptr)) {
      w->UnmapAll();
      FreeImage(image);
      return;
    }
    const Api& api = GetApi();
    w->UnmapAll();
    w->UnregisterAlloc(ptr);
    if (w->svm_mode() == SvmMode::kBuffer) {
      // OpenCL keeps a released buffer (and sub-buffer) alive until the kernels using it are
      // done.
      auto* desc = static_cast<BufferDescriptor*>(ptr);
      for (auto& [region, sub] : desc->subs) api.clReleaseMemObject(sub);
      api.clReleaseMemObject(desc->mem);
      delete desc;
      return;
    }
    // Kernels still queued may use the memory. A blocking clFinish here would stall the host
    // whenever the VM frees a tensor while the GPU part of a chain runs (killing the overlap),
    // so the free is enqueued behind the queued work instead (stream-ordered free).
    cl_command_queue q = w->Queue(dev.device_id);
    if (api.clEnqueueSVMFree != nullptr && w->num_devices() == 1) {
      auto* pending = new PendingSvmFree{w->context(), {ptr}};  // deleted by FreeSvmPointers
      cl_int err = api.clEnqueueSVMFree(q, 1, pending->ptrs, FreeSvmPointers, pending, 0,
                                        nullptr, nullptr);
      if (err != CL_SUCCESS) {
        delete pending;
        ThrowCLError("clEnqueueSVMFree", err);
      }
      api.clFlush(q);
    } else {
      for (size_t i = 0; i < w->num_devices(); ++i) api.clFinish(w->Queue(static_cast<int>(i)));
      api.clSVMFree(w->context(), ptr);
    }
  }

  // Kernel-local temporaries (a split-K partial sum, a padded input staged by its own kernel)
  // are workspaces that TVM allocates and frees around every call. Allocating SVM each time
  // cost about 1 ms per call on NVIDIA, so freed workspaces go to a per-device pool and are
  // reused: safe on the device's in-order queue, where a later kernel using the block runs after
  // the kernel that used it before. A request no free block fits first gives back the largest
  // free block, so the pool holds about the peak of concurrently live workspaces.
  void* AllocWorkspace(Device dev, size_t nbytes, DLDataType type_hint) final {
    size_t want = std::max<size_t>(nbytes, 1);
    void* evict = nullptr;
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      auto& pool = pools_[dev.device_id];
      auto best = pool.free.end();
      auto largest = pool.free.end();
      for (auto it = pool.free.begin(); it != pool.free.end(); ++it) {
        if (it->second >= want && (best == pool.free.end() || it->second < best->second)) {
          best = it;
        }
        if (largest == pool.free.end() || it->second > largest->second) largest = it;
      }
      if (best != pool.free.end()) {
        void* ptr = best->first;
        pool.live[ptr] = best->second;
        pool.free.erase(best);
        ++pool_reuses_;
        return ptr;
      }
      if (largest != pool.free.end()) {
        // nothing fits: give back the largest free block (too small anyway), so the pool does
        // not keep every size it ever served
        evict = largest->first;
        pool.free.erase(largest);
      }
    }
    if (evict != nullptr) FreeDataSpace(dev, evict);
    size_t rounded = (want + kPoolPage - 1) / kPoolPage * kPoolPage;
    void* ptr = AllocDataSpace(dev, rounded, tvm::runtime::kTempAllocaAlignment, type_hint);
    std::lock_guard<std::mutex> lock(pool_mu_);
    pools_[dev.device_id].live[ptr] = rounded;
    ++pool_allocs_;
    return ptr;
  }

  void FreeWorkspace(Device dev, void* ptr) final {
    std::lock_guard<std::mutex> lock(pool_mu_);
    auto& pool = pools_[dev.device_id];
    auto it = pool.live.find(ptr);
    if (it == pool.live.end()) {
      TVM_FFI_THROW(RuntimeError) << "FreeWorkspace: " << ptr
                                  << " is not a live workspace of opencl(" << dev.device_id << ")";
    }
    pool.free.emplace_back(ptr, it->second);
    pool.live.erase(it);
  }

  /*! \brief Workspace allocations made and reused, and bytes held, as JSON. */
  std::string PoolStatsJson() {
    std::lock_guard<std::mutex> lock(pool_mu_);
    size_t held = 0;
    for (const auto& [dev, pool] : pools_) {
      for (const auto& [ptr, n] : pool.free) held += n;
      for (const auto& [ptr, n] : pool.live) held += n;
    }
    std::ostringstream os;
    os << "{\"workspace_allocs\": " << pool_allocs_ << ", \"workspace_reuses\": " << pool_reuses_
       << ", \"workspace_bytes\": " << held << "}";
    return os.str();
  }

  void StreamSync(Device dev, TVMStreamHandle stream) final {
    cl_command_queue q = stream ? static_cast<cl_command_queue>(stream)
                                : Workspace::Global()->Queue(dev.device_id);
    CODL_CL_CALL(clFinish, q);
  }

 private:
  static constexpr size_t kPoolPage = 4096;
  struct Pool {
    std::vector<std::pair<void*, size_t>> free;
    std::unordered_map<void*, size_t> live;
  };
  std::mutex pool_mu_;
  std::unordered_map<int, Pool> pools_;
  uint64_t pool_allocs_ = 0;
  uint64_t pool_reuses_ = 0;

 public:

  void CopyDataFromTo(DLTensor* from, DLTensor* to, TVMStreamHandle stream) final {
    ImageDescriptor* from_image =
        from->device.device_type == kDLOpenCL ? FindImage(from->data) : nullptr;
    ImageDescriptor* to_image = to->device.device_type == kDLOpenCL ? FindImage(to->data) : nullptr;
    if (from_image == nullptr && to_image == nullptr) {
      DeviceAPI::CopyDataFromTo(from, to, stream);
      return;
    }
    int dev_id = (from_image ? from_image : to_image)->device_id;
    cl_command_queue q =
        stream ? static_cast<cl_command_queue>(stream) : Workspace::Global()->Queue(dev_id);
    CopyWithImages(from, from_image, to, to_image, q);
  }

  bool SupportsDevicePointerArithmeticsOnHost() final {
    Workspace* w = Workspace::Global();
    w->EnsureInit();
    return w->svm_mode() != SvmMode::kBuffer;
  }

 protected:
  void CopyDataFromTo(const void* from, size_t from_offset, void* to, size_t to_offset,
                      size_t size, Device dev_from, Device dev_to, DLDataType,
                      TVMStreamHandle stream) final {
    if (size == 0) return;
    Workspace* w = Workspace::Global();
    bool from_cl = dev_from.device_type == kDLOpenCL;
    bool to_cl = dev_to.device_type == kDLOpenCL;
    int dev_id = from_cl ? dev_from.device_id : dev_to.device_id;
    cl_command_queue q = stream ? static_cast<cl_command_queue>(stream) : w->Queue(dev_id);
    const char* src = static_cast<const char*>(from) + from_offset;
    char* dst = static_cast<char*>(to) + to_offset;
    if (!from_cl && !to_cl) {
      std::memcpy(dst, src, size);
      return;
    }
    w->UnmapAll();
    if (w->svm_mode() != SvmMode::kBuffer) {
      // Blocking, on the in-order queue: ordered after every kernel enqueued before it.
      CODL_CL_CALL(clEnqueueSVMMemcpy, q, CL_TRUE, dst, src, size, 0, nullptr, nullptr);
      return;
    }
    auto* bf = static_cast<const BufferDescriptor*>(from);
    auto* bt = static_cast<BufferDescriptor*>(to);
    if (from_cl && to_cl) {
      CODL_CL_CALL(clEnqueueCopyBuffer, q, bf->mem, bt->mem, from_offset, to_offset, size, 0,
                   nullptr, nullptr);
      CODL_CL_CALL(clFinish, q);
    } else if (from_cl) {
      CODL_CL_CALL(clEnqueueReadBuffer, q, bf->mem, CL_TRUE, from_offset, size, dst, 0, nullptr,
                   nullptr);
    } else {
      CODL_CL_CALL(clEnqueueWriteBuffer, q, bt->mem, CL_TRUE, to_offset, size, src, 0, nullptr,
                   nullptr);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Program binary cache on disk
// ---------------------------------------------------------------------------------------------

uint64_t Fnv1a(const std::string& s, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

std::string CacheKey(const std::string& source, const DeviceEntry& dev, const std::string& opts) {
  std::string material = source + '\0' + dev.name + '\0' + dev.vendor + '\0' + dev.version +
                         '\0' + dev.driver_version + '\0' + opts + "\0codl-v1";
  char buf[40];
  snprintf(buf, sizeof(buf), "%016llx%016llx",
           static_cast<unsigned long long>(Fnv1a(material, 14695981039346656037ULL)),
           static_cast<unsigned long long>(Fnv1a(material, 0x9E3779B97F4A7C15ULL)));
  return buf;
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream os;
  os << f.rdbuf();
  *out = os.str();
  return true;
}

void MakeDirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty()) mkdir(cur.c_str(), 0755);
    }
    if (i < path.size()) cur += path[i];
  }
}

std::string BuildLog(cl_program prog, cl_device_id dev) {
  size_t n = 0;
  GetApi().clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
  std::string log(n, '\0');
  if (n) GetApi().clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

/*! \brief Write `data` to `path` through a temporary file and a rename, so concurrent processes
 * and threads never read a partial file (the temporary's name is unique per thread). */
bool WriteAtomic(const std::string& path, const std::string& data) {
  std::ostringstream tmp;
  tmp << path << ".tmp" << getpid() << "-" << std::hash<std::thread::id>()(std::this_thread::get_id());
  std::ofstream f(tmp.str(), std::ios::binary);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  f.close();
  if (f && std::rename(tmp.str().c_str(), path.c_str()) == 0) return true;
  std::remove(tmp.str().c_str());
  return false;
}

/*! \brief The binary of a built program for its one device (false if the driver gives none). */
bool ProgramBinary(cl_program prog, std::string* out) {
  const Api& api = GetApi();
  size_t bin_size = 0;
  if (api.clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof(bin_size), &bin_size,
                           nullptr) != CL_SUCCESS ||
      bin_size == 0) {
    return false;
  }
  out->assign(bin_size, '\0');
  unsigned char* bptr = reinterpret_cast<unsigned char*>(out->data());
  return api.clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof(bptr), &bptr, nullptr) ==
         CL_SUCCESS;
}

/*! \brief Build `source` for device `dev_id`, from the disk cache when a binary is there. */
cl_program BuildCachedProgram(const std::string& source, int dev_id, const std::string& opts,
                        const std::string& what) {
  Workspace* w = Workspace::Global();
  const DeviceEntry& dev = w->Device(dev_id);
  const Api& api = GetApi();
  std::string cache_dir = w->config().cache_dir;
  std::string path;
  if (!cache_dir.empty()) {
    path = cache_dir + "/" + CacheKey(source, dev, opts) + ".bin";
    std::string bin;
    if (ReadFile(path, &bin) && !bin.empty()) {
      const unsigned char* ptr = reinterpret_cast<const unsigned char*>(bin.data());
      size_t len = bin.size();
      cl_int status = CL_SUCCESS, err = CL_SUCCESS;
      cl_program prog = api.clCreateProgramWithBinary(w->context(), 1, &dev.id, &len, &ptr,
                                                      &status, &err);
      if (err == CL_SUCCESS && status == CL_SUCCESS &&
          api.clBuildProgram(prog, 1, &dev.id, opts.c_str(), nullptr, nullptr) == CL_SUCCESS) {
        w->binary_loads++;
        w->disk_hits++;
        return prog;
      }
      // A stale or foreign binary: rebuild from source and overwrite it.
      if (prog) api.clReleaseProgram(prog);
      w->disk_errors++;
    }
  }
  const char* src = source.c_str();
  size_t len = source.size();
  cl_int err = CL_SUCCESS;
  cl_program prog = api.clCreateProgramWithSource(w->context(), 1, &src, &len, &err);
  if (err != CL_SUCCESS) ThrowCLError("clCreateProgramWithSource", err, what);
  err = api.clBuildProgram(prog, 1, &dev.id, opts.c_str(), nullptr, nullptr);
  if (err != CL_SUCCESS) {
    std::string log = BuildLog(prog, dev.id);
    api.clReleaseProgram(prog);
    ThrowCLError("clBuildProgram", err,
                 what + " on '" + dev.name + "'; build log:\n" + (log.empty() ? "<empty>" : log));
  }
  w->source_builds++;
  if (!path.empty()) {
    size_t bin_size = 0;
    if (api.clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof(bin_size), &bin_size,
                             nullptr) == CL_SUCCESS &&
        bin_size > 0) {
      std::string bin(bin_size, '\0');
      unsigned char* bptr = reinterpret_cast<unsigned char*>(bin.data());
      if (api.clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof(bptr), &bptr, nullptr) ==
          CL_SUCCESS) {
        // Write then rename so concurrent processes never read a partial file.
        MakeDirs(cache_dir);
        if (WriteAtomic(path, bin)) {
          w->disk_writes++;
        } else {
          w->disk_errors++;
        }
      }
    }
  }
  return prog;
}

// ---------------------------------------------------------------------------------------------
// Ahead-of-time program binaries: an artifact's program_binaries/ folder
// ---------------------------------------------------------------------------------------------
//
// Files are named by the disk cache's key (source, device name, vendor, version, driver version,
// options), so a binary is only ever offered to the device and driver it was built for; each
// file is "codl-aot-v1 <fnv128 hex of the payload>\n<payload>", so a truncated or altered
// binary is detected before the driver sees it and the kernel is built from source instead.

std::mutex g_aot_mu;
std::vector<std::string> g_aot_dirs;  // folders read at program creation
std::string g_aot_export_dir;         // where every created program's binary is written
std::atomic<int64_t> g_aot_loads{0}, g_aot_fallbacks{0}, g_aot_corrupt{0}, g_aot_rejected{0},
    g_aot_exports{0}, g_build_ns{0};
constexpr char kAotMagic[] = "codl-aot-v1 ";
constexpr size_t kAotMagicLen = sizeof(kAotMagic) - 1;

std::string Fnv128Hex(const std::string& s) {
  char buf[40];
  snprintf(buf, sizeof(buf), "%016llx%016llx",
           static_cast<unsigned long long>(Fnv1a(s, 14695981039346656037ULL)),
           static_cast<unsigned long long>(Fnv1a(s, 0x9E3779B97F4A7C15ULL)));
  return buf;
}

/*! \brief 1: `bin` holds the verified payload; 0: no such file; -1: corrupt. */
int ReadAot(const std::string& path, std::string* bin) {
  std::string raw;
  if (!ReadFile(path, &raw)) return 0;
  if (raw.size() <= kAotMagicLen + 33 || raw.compare(0, kAotMagicLen, kAotMagic) != 0 ||
      raw[kAotMagicLen + 32] != '\n') {
    return -1;
  }
  *bin = raw.substr(kAotMagicLen + 33);
  return Fnv128Hex(*bin) == raw.substr(kAotMagicLen, 32) ? 1 : -1;
}

cl_program FromAot(const std::string& key, const DeviceEntry& dev, const std::string& opts,
                   const std::string& what) {
  std::vector<std::string> dirs;
  {
    std::lock_guard<std::mutex> lock(g_aot_mu);
    dirs = g_aot_dirs;
  }
  if (dirs.empty()) return nullptr;
  const Api& api = GetApi();
  for (const auto& dir : dirs) {
    std::string path = dir + "/" + key + ".bin", bin;
    int st = ReadAot(path, &bin);
    if (st == 0) continue;
    if (st < 0) {
      g_aot_corrupt++;
      fprintf(stderr, "codl-tvm: note: %s: program binary fails its hash check; building %s from "
              "source\n", path.c_str(), what.c_str());
      continue;
    }
    const unsigned char* ptr = reinterpret_cast<const unsigned char*>(bin.data());
    size_t len = bin.size();
    cl_int status = CL_SUCCESS, err = CL_SUCCESS;
    cl_program prog = api.clCreateProgramWithBinary(Workspace::Global()->context(), 1, &dev.id,
                                                    &len, &ptr, &status, &err);
    if (err == CL_SUCCESS && status == CL_SUCCESS &&
        api.clBuildProgram(prog, 1, &dev.id, opts.c_str(), nullptr, nullptr) == CL_SUCCESS) {
      g_aot_loads++;
      return prog;
    }
    if (prog) api.clReleaseProgram(prog);
    g_aot_rejected++;
    fprintf(stderr, "codl-tvm: note: %s: '%s' rejected the program binary; building %s from "
            "source\n", path.c_str(), dev.name.c_str(), what.c_str());
  }
  g_aot_fallbacks++;
  return nullptr;
}

void ExportAot(const std::string& key, cl_program prog) {
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(g_aot_mu);
    dir = g_aot_export_dir;
  }
  std::string bin;
  if (dir.empty() || !ProgramBinary(prog, &bin)) return;
  std::string data = kAotMagic + Fnv128Hex(bin) + "\n" + bin;
  if (!WriteAtomic(dir + "/" + key + ".bin", data)) {
    TVM_FFI_THROW(RuntimeError) << "cannot write the program binary " << dir << "/" << key
                                << ".bin";
  }
  g_aot_exports++;
}

/*! \brief Build `source` for device `dev_id`: from an artifact's binary, the disk cache, or the
 * OpenCL compiler, in that order; exported when an export folder is set. */
cl_program BuildProgram(const std::string& source, int dev_id, const std::string& opts,
                        const std::string& what) {
  int64_t t0 = HostClockNs();
  const DeviceEntry& dev = Workspace::Global()->Device(dev_id);
  std::string key = CacheKey(source, dev, opts);
  cl_program prog = FromAot(key, dev, opts, what);
  if (prog == nullptr) prog = BuildCachedProgram(source, dev_id, opts, what);
  ExportAot(key, prog);
  g_build_ns += HostClockNs() - t0;
  return prog;
}

// Program-creation threads still running when the process exits would call into an OpenCL
// driver whose static state is being destroyed: exit waits for them (registered at the first
// start, so it runs before the destructors of the driver's statics, constructed earlier).
std::mutex g_builders_mu;
std::condition_variable g_builders_cv;
int g_active_builders = 0;

void WaitForBuilders() {
  std::unique_lock<std::mutex> lock(g_builders_mu);
  g_builders_cv.wait(lock, [] { return g_active_builders == 0; });
}

// ---------------------------------------------------------------------------------------------
// Module: TVM's serialized OpenCL module
// ---------------------------------------------------------------------------------------------

struct FunctionInfo {
  std::string name;
  std::vector<DLDataType> arg_types;
  std::vector<std::string> launch_tags;
};

class BlobReader {
 public:
  BlobReader(const char* data, size_t size) : data_(data), size_(size) {}
  uint64_t U64() { return Read<uint64_t>(); }
  template <typename T>
  T Read() {
    Need(sizeof(T), "a number");
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string Str(const char* what) {
    uint64_t n = U64();
    Need(n, what);
    std::string s(data_ + pos_, n);
    pos_ += n;
    return s;
  }

 private:
  void Need(uint64_t n, const char* what) {
    if (n > size_ - pos_) {
      TVM_FFI_THROW(ValueError) << "corrupt OpenCL module blob: " << what << " of " << n
                                << " bytes at offset " << pos_ << " runs past its end ("
                                << size_ << " bytes)";
    }
  }
  const char* data_;
  size_t size_;
  size_t pos_{0};
};

class OpenCLModuleObj;

// A warm-up shard (codl.opencl.set_warm_shard): this process creates the programs of, and
// launches, only the kernels of its module that shard `index` of `count` holds; the others are
// not built and their launches return at once. Kernels are dealt out longest source first, each
// to the shard with the least source so far: compile time grows with a kernel's source, and one
// process drawing the large convolutions would finish last. Several processes, one per shard,
// then create the programs and compile the work-group functions of one library in parallel
// (PoCL does both serially within a process) into the drivers' on-disk caches, for the process
// that times the library. Their outputs are meaningless: a skipped kernel writes nothing.
namespace {
std::atomic<uint64_t> g_warm_index{0}, g_warm_count{0};
}  // namespace

/*! \brief One kernel of a module: argument layout, launch tags and per-thread kernel objects. */
class KernelFunction {
 public:
  KernelFunction(OpenCLModuleObj* mod, ffi::ObjectPtr<ffi::Object> keep, FunctionInfo info);
  ~KernelFunction();
  void Launch(ffi::PackedArgs args);

 private:
  cl_kernel GetKernel(int dev_id);

  OpenCLModuleObj* mod_;
  ffi::ObjectPtr<ffi::Object> keep_alive_;
  FunctionInfo info_;
  std::vector<int> tag_slot_;  // launch tag -> slot in [grid x,y,z, block x,y,z]
  int work_dim_{1};
  std::mutex mu_;
  // Kernel objects are not thread-safe for clSetKernelArg: one per (thread, device).
  std::unordered_map<std::thread::id, std::vector<cl_kernel>> kernels_;
};

class OpenCLModuleObj : public ffi::ModuleObj {
 public:
  OpenCLModuleObj(std::string fmt, std::vector<FunctionInfo> funcs, std::string source)
      : fmt_(std::move(fmt)), source_(std::move(source)) {
    for (auto& f : funcs) {
      programs_[f.name] = std::make_unique<ProgramSlot>();
      fmap_[f.name] = std::move(f);
    }
    SplitSource();
    for (const auto& kv : fmap_) by_size_.push_back(kv.first);
    // longest source first; names break ties, so every shard's process deals the same way
    std::sort(by_size_.begin(), by_size_.end(), [this](const std::string& a, const std::string& b) {
      size_t sa = SourceSize(a), sb = SourceSize(b);
      return sa != sb ? sa > sb : a < b;
    });
  }

  /*! \brief Whether this process's warm-up shard (if any) holds kernel `func`. */
  bool InWarmShard(const std::string& func) {
    uint64_t count = g_warm_count.load();
    if (count <= 1) return true;
    std::lock_guard<std::mutex> lock(shard_mu_);
    if (shard_count_ != count) {  // deal the kernels out again for this count
      std::vector<size_t> load(count, 0);
      for (const auto& name : by_size_) {
        size_t least = std::min_element(load.begin(), load.end()) - load.begin();
        shard_of_[name] = least;
        load[least] += SourceSize(name);
      }
      shard_count_ = count;
    }
    auto it = shard_of_.find(func);
    return it == shard_of_.end() || it->second == g_warm_index.load();
  }
  ~OpenCLModuleObj() {
    for (auto& t : builders_) t.join();
    for (auto& kv : programs_) {
      for (cl_program p : kv.second->progs) {
        if (p) GetApi().clReleaseProgram(p);
      }
    }
  }

  /*!
   * \brief Create every kernel's program on `dev_id` with `threads` threads; with `wait` false
   * return at once (the threads run on, and a kernel's first launch waits for its own program
   * only). A kernel that fails to build is built again at its first launch, which reports it.
   */
  void BuildAll(int dev_id, int threads, bool wait) {
    auto names = std::make_shared<std::vector<std::string>>();
    for (const auto& kv : fmap_) {
      if (InWarmShard(kv.first)) names->push_back(kv.first);
    }
    auto next = std::make_shared<std::atomic<size_t>>(0);
    auto work = [this, names, next, dev_id]() {
      for (size_t i = (*next)++; i < names->size(); i = (*next)++) {
        try {
          GetProgram((*names)[i], dev_id);
        } catch (...) {
        }
      }
      std::lock_guard<std::mutex> lock(g_builders_mu);
      --g_active_builders;
      g_builders_cv.notify_all();
    };
    static std::once_flag at_exit;
    std::call_once(at_exit, [] { std::atexit(WaitForBuilders); });
    int n = std::max(threads, 1);
    {
      std::lock_guard<std::mutex> lock(g_builders_mu);
      g_active_builders += n;
    }
    std::vector<std::thread> started;
    for (int t = 0; t < n; ++t) started.emplace_back(work);
    if (wait) {
      for (auto& t : started) t.join();
      return;
    }
    std::lock_guard<std::mutex> lock(builders_mu_);
    for (auto& t : started) builders_.push_back(std::move(t));
  }

  const char* kind() const final { return "opencl"; }
  int GetPropertyMask() const final { return ffi::Module::kBinarySerializable | ffi::Module::kRunnable; }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    auto it = fmap_.find(std::string(name));
    if (it == fmap_.end()) return std::nullopt;
    auto fn = std::make_shared<KernelFunction>(this, ffi::GetObjectPtr<ffi::Object>(static_cast<ffi::Object*>(this)),
                                               it->second);
    return ffi::Function::FromPacked(
        [fn](ffi::PackedArgs args, ffi::Any*) { fn->Launch(args); });
  }

  ffi::Bytes SaveToBytes() const final {
    std::string out;
    auto put_u64 = [&out](uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); };
    auto put_str = [&](const std::string& s) {
      put_u64(s.size());
      out += s;
    };
    put_str(fmt_);
    put_u64(fmap_.size());
    for (const auto& kv : fmap_) {
      put_str(kv.first);
      put_str(kv.second.name);
      put_u64(kv.second.arg_types.size());
      for (DLDataType t : kv.second.arg_types) {
        out.push_back(static_cast<char>(t.code));
        out.push_back(static_cast<char>(t.bits));
        out.append(reinterpret_cast<const char*>(&t.lanes), 2);
      }
      put_u64(kv.second.launch_tags.size());
      for (const auto& tag : kv.second.launch_tags) put_str(tag);
      put_u64(0);  // arg_extra_tags
    }
    put_str(source_);
    return ffi::Bytes(out);
  }

  ffi::String InspectSource(const ffi::String& format) const final { return source_; }

  /*! \brief The program holding `func` on `dev_id`, built on first use. */
  cl_program GetProgram(const std::string& func, int dev_id) {
    auto slot = programs_.find(func);
    if (slot == programs_.end()) {
      TVM_FFI_THROW(ValueError) << "OpenCL module has no kernel " << func;
    }
    // one lock per kernel: a launch waits for its own kernel's program, not for every build
    std::lock_guard<std::mutex> lock(slot->second->mu);
    auto& progs = slot->second->progs;
    if (progs.size() <= static_cast<size_t>(dev_id)) progs.resize(dev_id + 1, nullptr);
    if (progs[dev_id] == nullptr) {
      auto it = sources_.find(func);
      const std::string& src = it != sources_.end() ? it->second : source_;
      progs[dev_id] = BuildProgram(src, dev_id, "", "kernel " + func);
    }
    return progs[dev_id];
  }

 private:
  // TVM separates kernels by `// Function: name` lines; each is compiled on its own (with the
  // shared preamble before the first delimiter) so only the kernels a run uses are compiled.
  void SplitSource() {
    const std::string marker = "// Function: ";
    size_t first = source_.find(marker);
    if (first == std::string::npos) return;
    std::string preamble = source_.substr(0, first);
    size_t pos = first;
    while (pos != std::string::npos) {
      size_t name_begin = pos + marker.size();
      size_t name_end = source_.find('\n', name_begin);
      if (name_end == std::string::npos) break;
      std::string name = source_.substr(name_begin, name_end - name_begin);
      while (!name.empty() && (name.back() == '\r' || name.back() == ' ')) name.pop_back();
      size_t next = source_.find(marker, name_end);
      sources_[name] = preamble + source_.substr(pos, next == std::string::npos
                                                          ? std::string::npos
                                                          : next - pos);
      pos = next;
    }
  }

  std::string fmt_;
  std::unordered_map<std::string, FunctionInfo> fmap_;
  std::string source_;
  std::unordered_map<std::string, std::string> sources_;
  size_t SourceSize(const std::string& func) const {
    auto it = sources_.find(func);
    return it != sources_.end() ? it->second.size() : 0;
  }
  std::vector<std::string> by_size_;  // kernels by source size, longest first
  std::mutex shard_mu_;
  uint64_t shard_count_{0};  // the shard count shard_of_ was dealt for
  std::unordered_map<std::string, size_t> shard_of_;
  struct ProgramSlot {
    std::mutex mu;
    std::vector<cl_program> progs;
  };
  // one slot per kernel, made in the constructor (the map itself is never changed afterwards)
  std::unordered_map<std::string, std::unique_ptr<ProgramSlot>> programs_;
  std::mutex builders_mu_;
  std::vector<std::thread> builders_;
};

KernelFunction::KernelFunction(OpenCLModuleObj* mod, ffi::ObjectPtr<ffi::Object> keep,
                               FunctionInfo info)
    : mod_(mod), keep_alive_(std::move(keep)), info_(std::move(info)) {
  bool used[6] = {false, false, false, false, false, false};
  for (const auto& tag : info_.launch_tags) {
    int rank = -1;
    if (tag.rfind("blockIdx.", 0) == 0) rank = 0;
    if (tag.rfind("threadIdx.", 0) == 0) rank = 1;
    char axis = tag.empty() ? '?' : tag.back();
    if (rank < 0 || axis < 'x' || axis > 'z') {
      TVM_FFI_THROW(ValueError) << "OpenCL kernel " << info_.name
                                << " uses launch parameter '" << tag
                                << "', which the codl-tvm OpenCL runtime does not support";
    }
    int slot = rank * 3 + (axis - 'x');
    tag_slot_.push_back(slot);
    used[slot] = true;
  }
  for (int d = 0; d < 3; ++d) {
    if (used[d] || used[d + 3]) work_dim_ = d + 1;
  }
}

KernelFunction::~KernelFunction() {
  if (!Workspace::Global()->initialized()) return;
  for (auto& kv : kernels_) {
    for (cl_kernel k : kv.second) {
      if (k) GetApi().clReleaseKernel(k);
    }
  }
}

cl_kernel KernelFunction::GetKernel(int dev_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& ks = kernels_[std::this_thread::get_id()];
  if (ks.size() <= static_cast<size_t>(dev_id)) ks.resize(dev_id + 1, nullptr);
  if (ks[dev_id] == nullptr) {
    cl_program prog = mod_->GetProgram(info_.name, dev_id);
    cl_int err = CL_SUCCESS;
    ks[dev_id] = GetApi().clCreateKernel(prog, info_.name.c_str(), &err);
    if (err != CL_SUCCESS) ThrowCLError("clCreateKernel", err, info_.name);
  }
  return ks[dev_id];
}

namespace {

/*! \brief Bytes from a view's first element to one past its last (its strides included). */
size_t ViewExtentBytes(const DLTensor* t) {
  int64_t last = 0;
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] == 0) return 0;
    int64_t stride = 1;
    if (t->strides != nullptr) {
      stride = t->strides[i];
    } else {
      for (int j = i + 1; j < t->ndim; ++j) stride *= t->shape[j];
    }
    last += (t->shape[i] - 1) * stride;
  }
  return static_cast<size_t>(last + 1) * ((t->dtype.bits * t->dtype.lanes + 7) / 8);
}

/*! \brief A temporary buffer standing in for an unaligned view during one launch. */
struct StagedView {
  BufferDescriptor* desc;
  size_t origin, size;
  cl_mem temp;
};

/*!
 * \brief Buffer mode: the cl_mem a kernel gets for a view at `origin` of `desc`.
 *
 * OpenCL buffers have no pointer arithmetic: a view with a byte offset (a region of a shared
 * output, an offset tensor of a storage) is a sub-buffer, cached per (buffer, origin, size).
 * A sub-buffer's origin must be a multiple of CL_DEVICE_MEM_BASE_ADDR_ALIGN (else
 * CL_MISALIGNED_SUB_BUFFER_OFFSET), which a region view's offset (a row of an H split) often
 * is not. Such a view runs on a temporary buffer instead: its bytes are copied in before the
 * kernel and back after it on the same in-order queue, so every other command sees the buffer
 * before or after the kernel, never the temporary. Overlapping unaligned views of one buffer
 * in one launch could not be copied back consistently and are refused.
 */
cl_mem ViewBuffer(Workspace* w, int dev_id, cl_command_queue queue, BufferDescriptor* desc,
                  size_t origin, size_t size, const std::string& what,
                  std::vector<StagedView>* staged) {
  if (origin + size > desc->nbytes) {
    TVM_FFI_THROW(ValueError) << what << ": a view of bytes [" << origin << ", " << origin + size
                              << ") does not fit its " << desc->nbytes << "-byte buffer";
  }
  if (origin == 0 && size == desc->nbytes) return desc->mem;
  size_t align = w->Device(dev_id).base_addr_align_bytes;
  if (origin % align == 0) return w->SubBuffer(desc, origin, std::max<size_t>(size, 1));
  for (const StagedView& v : *staged) {
    if (v.desc != desc) continue;
    if (v.origin == origin && v.size == size) return v.temp;
    if (origin < v.origin + v.size && v.origin < origin + size) {
      TVM_FFI_THROW(ValueError) << what << ": overlapping views at unaligned offsets " << v.origin
                                << " and " << origin << " of one buffer (buffer mode)";
    }
  }
  const Api& api = GetApi();
  cl_int err = CL_SUCCESS;
  cl_mem temp = api.clCreateBuffer(w->context(), CL_MEM_READ_WRITE, std::max<size_t>(size, 1),
                                   nullptr, &err);
  if (err != CL_SUCCESS) ThrowCLError("clCreateBuffer", err, what + " (unaligned view)");
  if (size > 0) {
    CODL_CL_CALL(clEnqueueCopyBuffer, queue, desc->mem, temp, origin, 0, size, 0, nullptr,
                 nullptr);
  }
  staged->push_back(StagedView{desc, origin, size, temp});
  ++w->staged_views;
  return temp;
}

}  // namespace

void KernelFunction::Launch(ffi::PackedArgs args) {
  if (!mod_->InWarmShard(info_.name)) return;
  Workspace* w = Workspace::Global();
  w->UnmapAll();  // coarse-grained SVM: the host's mapping ends before the GPU touches memory
  int dev_id = tls_device_id;
  cl_command_queue queue = w->Queue(dev_id);
  cl_kernel kernel = GetKernel(dev_id);
  const Api& api = GetApi();
  size_t nargs = info_.arg_types.size();
  if (static_cast<size_t>(args.size()) != nargs + tag_slot_.size()) {
    TVM_FFI_THROW(ValueError) << "OpenCL kernel " << info_.name << " expects "
                              << nargs + tag_slot_.size() << " arguments, got " << args.size();
  }
  bool svm = w->svm_mode() != SvmMode::kBuffer;
  std::vector<StagedView> staged;
  // Temporaries of unaligned views go back to their buffers even when the launch fails.
  struct StageGuard {
    std::vector<StagedView>* staged;
    cl_command_queue queue;
    bool copy_back{false};
    ~StageGuard() {
      for (const StagedView& v : *staged) {
        if (copy_back && v.size > 0) {
          GetApi().clEnqueueCopyBuffer(queue, v.temp, v.desc->mem, 0, v.origin, v.size, 0,
                                       nullptr, nullptr);
        }
        GetApi().clReleaseMemObject(v.temp);
      }
    }
  } guard{&staged, queue};
  for (size_t i = 0; i < nargs; ++i) {
    DLDataType t = info_.arg_types[i];
    cl_int err = CL_SUCCESS;
    cl_uint idx = static_cast<cl_uint>(i);
    if (t.code == kDLOpaqueHandle) {
      void* ptr = nullptr;
      void* data = nullptr;  // the tensor's data pointer (an image descriptor for textures)
      size_t byte_offset = 0, extent = 0;
      bool is_view = false;
      if (auto dl = args[i].try_cast<DLTensor*>()) {
        // Called from Python with tensors rather than from host code with data pointers.
        DLTensor* t = dl.value();
        data = t->data;
        ptr = svm ? static_cast<char*>(t->data) + t->byte_offset : t->data;
        is_view = !svm && t->byte_offset != 0;
        byte_offset = t->byte_offset;
        extent = ViewExtentBytes(t);
      } else {
        ptr = args[i].cast<void*>();
        data = ptr;
      }
      if (ImageDescriptor* image = FindImage(data)) {
        // a texture-scope tensor: the kernel's image2d_array_t parameter gets the image
        err = api.clSetKernelArg(kernel, idx, sizeof(cl_mem), &image->image);
        if (err != CL_SUCCESS) {
          ThrowCLError("clSetKernelArg", err, info_.name + " argument " + std::to_string(i) +
                                                  " (an image)");
        }
        continue;
      }
      if (svm) {
        err = api.clSetKernelArgSVMPointer(kernel, idx, ptr);
      } else {
        cl_mem mem = nullptr;
        if (ptr != nullptr) {
          std::string what = "OpenCL kernel " + info_.name + " argument " + std::to_string(i);
          if (!w->IsBuffer(ptr)) {
            TVM_FFI_THROW(ValueError) << what << " is not an OpenCL buffer of the codl-tvm "
                                      << "runtime (buffer mode: device data is no host address)";
          }
          auto* desc = static_cast<BufferDescriptor*>(ptr);
          mem = is_view ? ViewBuffer(w, dev_id, queue, desc, byte_offset, extent, what, &staged)
                        : desc->mem;
        }
        err = api.clSetKernelArg(kernel, idx, sizeof(cl_mem), &mem);
      }
    } else if (t.code == kDLInt || t.code == kDLUInt) {
      int64_t v = args[i].cast<int64_t>();
      if (t.bits == 64) {
        err = api.clSetKernelArg(kernel, idx, 8, &v);
      } else if (t.bits == 32) {
        int32_t v32 = static_cast<int32_t>(v);
        err = api.clSetKernelArg(kernel, idx, 4, &v32);
      } else if (t.bits == 16) {
        int16_t v16 = static_cast<int16_t>(v);
        err = api.clSetKernelArg(kernel, idx, 2, &v16);
      } else {
        int8_t v8 = static_cast<int8_t>(v);
        err = api.clSetKernelArg(kernel, idx, 1, &v8);
      }
    } else if (t.code == kDLFloat && (t.bits == 32 || t.bits == 64)) {
      double v = args[i].cast<double>();
      if (t.bits == 64) {
        err = api.clSetKernelArg(kernel, idx, 8, &v);
      } else {
        float f = static_cast<float>(v);
        err = api.clSetKernelArg(kernel, idx, 4, &f);
      }
    } else {
      TVM_FFI_THROW(ValueError) << "OpenCL kernel " << info_.name << ": argument " << i
                                << " has an unsupported scalar type (code "
                                << static_cast<int>(t.code) << ", " << static_cast<int>(t.bits)
                                << " bits)";
    }
    if (err != CL_SUCCESS) {
      ThrowCLError(t.code == kDLOpaqueHandle && svm ? "clSetKernelArgSVMPointer" : "clSetKernelArg",
                   err, info_.name + " argument " + std::to_string(i));
    }
  }
  size_t sizes[6] = {1, 1, 1, 1, 1, 1};
  const TVMFFIAny* raw = reinterpret_cast<const TVMFFIAny*>(args.data());
  for (size_t j = 0; j < tag_slot_.size(); ++j) {
    int64_t v = raw[nargs + j].v_int64;
    if (v > 0) sizes[tag_slot_[j]] = static_cast<size_t>(v);
  }
  size_t global[3], local[3];
  for (int d = 0; d < 3; ++d) {
    global[d] = sizes[d] * sizes[d + 3];
    local[d] = sizes[d + 3];
  }
  cl_event ev = nullptr;
  bool record = w->recording();
  cl_int err = api.clEnqueueNDRangeKernel(queue, kernel, static_cast<cl_uint>(work_dim_), nullptr,
                                          global, local, 0, nullptr, record ? &ev : nullptr);
  guard.copy_back = true;  // the copy-ins are enqueued: a temporary now holds the view's bytes
  if (err != CL_SUCCESS) {
    std::ostringstream os;
    os << info_.name << " with global (" << global[0] << ", " << global[1] << ", " << global[2]
       << ") local (" << local[0] << ", " << local[1] << ", " << local[2] << ")";
    ThrowCLError("clEnqueueNDRangeKernel", err, os.str());
  }
  if (record) w->Record(KernelRecord{info_.name, dev_id, ev});
}

ffi::Module LoadFromBytes(const ffi::Bytes& bytes) {
  BlobReader r(bytes.data(), bytes.size());
  std::string fmt = r.Str("format");
  if (fmt != "cl") {
    TVM_FFI_THROW(ValueError) << "OpenCL module format '" << fmt
                              << "' is not supported by the codl-tvm runtime (only 'cl' source)";
  }
  uint64_t n = r.U64();
  std::vector<FunctionInfo> funcs;
  for (uint64_t i = 0; i < n; ++i) {
    r.Str("function key");
    FunctionInfo info;
    info.name = r.Str("function name");
    uint64_t nargs = r.U64();
    for (uint64_t a = 0; a < nargs; ++a) {
      DLDataType t;
      t.code = r.Read<uint8_t>();
      t.bits = r.Read<uint8_t>();
      t.lanes = r.Read<uint16_t>();
      info.arg_types.push_back(t);
    }
    uint64_t ntags = r.U64();
    for (uint64_t k = 0; k < ntags; ++k) info.launch_tags.push_back(r.Str("launch tag"));
    uint64_t nextra = r.U64();
    for (uint64_t k = 0; k < nextra; ++k) r.Read<int32_t>();
    funcs.push_back(std::move(info));
  }
  std::string source = r.Str("source");
  return ffi::Module(ffi::make_object<OpenCLModuleObj>(fmt, std::move(funcs), std::move(source)));
}

// ---------------------------------------------------------------------------------------------
// Timer: marker events on the device queue (like CUDA's event timer)
// ---------------------------------------------------------------------------------------------

class OpenCLEventTimerNode : public TimerNodeABI {
 public:
  explicit OpenCLEventTimerNode(int dev_id) : dev_id_(dev_id) {}
  ~OpenCLEventTimerNode() {
    if (start_) GetApi().clReleaseEvent(start_);
    if (stop_) GetApi().clReleaseEvent(stop_);
  }
  void Start() final {
    host_start_ = HostClockNs();
    CODL_CL_CALL(clEnqueueMarkerWithWaitList, Queue(), 0, nullptr, &start_);
  }
  void Stop() final { CODL_CL_CALL(clEnqueueMarkerWithWaitList, Queue(), 0, nullptr, &stop_); }
  int64_t SyncAndGetElapsedNanos() final {
    CODL_CL_CALL(clWaitForEvents, 1, &stop_);
    cl_ulong t0 = 0, t1 = 0;
    const Api& api = GetApi();
    if (api.clGetEventProfilingInfo(start_, CL_PROFILING_COMMAND_END, sizeof(t0), &t0, nullptr) ==
            CL_SUCCESS &&
        api.clGetEventProfilingInfo(stop_, CL_PROFILING_COMMAND_END, sizeof(t1), &t1, nullptr) ==
            CL_SUCCESS &&
        t1 >= t0) {
      return static_cast<int64_t>(t1 - t0);
    }
    // Drivers without marker timestamps: host time up to the completion of the stop marker.
    return HostClockNs() - host_start_;
  }
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("codl.OpenCLEventTimer", OpenCLEventTimerNode,
                                    TimerNodeABI);

 private:
  cl_command_queue Queue() { return Workspace::Global()->Queue(dev_id_); }
  int dev_id_;
  cl_event start_{nullptr}, stop_{nullptr};
  int64_t host_start_{0};
};

// ---------------------------------------------------------------------------------------------
// CPU views of SVM tensors
// ---------------------------------------------------------------------------------------------

/*! \brief Keeps the owning OpenCL tensor alive while a CPU view of its memory exists. */
struct ViewAlloc {
  ffi::Tensor owner;
  void* host;  // the host address of owner's data pointer (mapped in buffer mode)
  void AllocData(DLTensor* t) {
    t->data = host;
    t->byte_offset = owner.GetDLTensorPtr()->byte_offset;
  }
  void FreeData(DLTensor*) {}
};

void CheckOpenCLTensor(const ffi::Tensor& t, const char* what) {
  if (t.GetDLTensorPtr()->device.device_type != kDLOpenCL) {
    TVM_FFI_THROW(ValueError) << what << " expects an OpenCL tensor, got device type "
                              << static_cast<int>(t.GetDLTensorPtr()->device.device_type);
  }
  Workspace::Global()->EnsureInit();
  if (ImageDescriptor* image = FindImage(t.GetDLTensorPtr()->data)) {
    // an image's pixels have no host address (a driver may tile them): copy them instead
    TVM_FFI_THROW(ValueError) << what << " expects a buffer tensor; this one is a "
                              << image->scope << " image (copy it to a 'global' tensor)";
  }
}

ffi::Tensor CpuView(ffi::Tensor t) {
  CheckOpenCLTensor(t, "codl.opencl.cpu_view");
  // Coarse-grained SVM and buffers: host access needs a map (blocking, after queued GPU work),
  // which lasts until the next GPU-side command. A buffer's data pointer is no host address:
  // the view points at the mapping instead.
  void* host = Workspace::Global()->MapForHost(t.GetDLTensorPtr()->data);
  const DLTensor* d = t.GetDLTensorPtr();
  std::vector<int64_t> shape(d->shape, d->shape + d->ndim);
  // A 0-d tensor (a scalar input) has no strides to copy: an empty vector's data() is null,
  // which FromNDAllocStrided rejects.
  if (d->strides != nullptr && d->ndim > 0) {
    std::vector<int64_t> strides(d->strides, d->strides + d->ndim);
    return ffi::Tensor::FromNDAllocStrided(ViewAlloc{t, host}, ffi::ShapeView(shape.data(), shape.size()),
                                           ffi::ShapeView(strides.data(), strides.size()),
                                           d->dtype, DLDevice{kDLCPU, 0});
  }
  return ffi::Tensor::FromNDAlloc(ViewAlloc{t, host}, ffi::ShapeView(shape.data(), shape.size()),
                                  d->dtype, DLDevice{kDLCPU, 0});
}

void SvmMap(ffi::Tensor t, bool write) {
  CheckOpenCLTensor(t, "codl.opencl.svm_map");
  Workspace* w = Workspace::Global();
  if (w->svm_mode() == SvmMode::kBuffer) {
    w->MapForHost(t.GetDLTensorPtr()->data);  // read and write: one mapping serves both
    return;
  }
  if (w->svm_mode() != SvmMode::kCoarseGrain) return;  // fine-grained: coherent, nothing to do
  void* ptr = static_cast<char*>(t.GetDLTensorPtr()->data) + t.GetDLTensorPtr()->byte_offset;
  size_t n = ffi::GetDataSize(*t.GetDLTensorPtr());
  CODL_CL_CALL(clEnqueueSVMMap, w->Queue(t.GetDLTensorPtr()->device.device_id), CL_TRUE,
               write ? (CL_MAP_READ | CL_MAP_WRITE) : CL_MAP_READ, ptr, n, 0, nullptr, nullptr);
}

void SvmUnmap(ffi::Tensor t) {
  CheckOpenCLTensor(t, "codl.opencl.svm_unmap");
  Workspace* w = Workspace::Global();
  if (w->svm_mode() == SvmMode::kBuffer) {
    w->Unmap(t.GetDLTensorPtr()->data);
    return;
  }
  if (w->svm_mode() != SvmMode::kCoarseGrain) return;
  void* ptr = static_cast<char*>(t.GetDLTensorPtr()->data) + t.GetDLTensorPtr()->byte_offset;
  CODL_CL_CALL(clEnqueueSVMUnmap, w->Queue(t.GetDLTensorPtr()->device.device_id), ptr, 0, nullptr, nullptr);
}

std::string RecordsJson(std::vector<KernelRecord> recs) {
  std::ostringstream os;
  os << "[";
  const Api& api = GetApi();
  for (size_t i = 0; i < recs.size(); ++i) {
    cl_ulong q = 0, s = 0, e = 0;
    api.clWaitForEvents(1, &recs[i].event);
    api.clGetEventProfilingInfo(recs[i].event, CL_PROFILING_COMMAND_QUEUED, 8, &q, nullptr);
    api.clGetEventProfilingInfo(recs[i].event, CL_PROFILING_COMMAND_START, 8, &s, nullptr);
    api.clGetEventProfilingInfo(recs[i].event, CL_PROFILING_COMMAND_END, 8, &e, nullptr);
    api.clReleaseEvent(recs[i].event);
    os << (i ? ", " : "") << "{\"name\": \"" << JsonEscape(recs[i].name)
       << "\", \"device\": " << recs[i].device << ", \"queued_ns\": " << q
       << ", \"start_ns\": " << s << ", \"end_ns\": " << e << "}";
  }
  os << "]";
  return os.str();
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::ObjectDef<OpenCLEventTimerNode>();
  refl::GlobalDef()
      .def("device_api.opencl",
           []() -> void* { return static_cast<DeviceAPI*>(OpenCLSVMDeviceAPI::Global()); })
      .def("ffi.Module.load_from_bytes.opencl", LoadFromBytes)
      .def("runtime.timer.opencl",
           [](DLDevice dev) -> ffi::ObjectRef {
             Workspace::Global()->Device(dev.device_id);
             return ffi::ObjectRef(ffi::make_object<OpenCLEventTimerNode>(dev.device_id));
           })
      .def("codl.opencl.set_library_path",
           [](ffi::String path) { cl::SetLibraryPath(std::string(path)); })
      .def("codl.opencl.configure",
           [](ffi::String platform, int device, ffi::String svm, ffi::String cache_dir) {
             WorkspaceConfig c;
             c.platform_filter = platform;
             c.device_index = device;
             c.svm_override = svm;
             c.cache_dir = cache_dir;
             Workspace::Global()->Configure(c);
           })
      .def("codl.opencl.initialized", []() { return Workspace::Global()->initialized(); })
      .def("codl.opencl.info", []() { return ffi::String(Workspace::Global()->InfoJson()); })
      .def("codl.opencl.cache_stats",
           []() {
             Workspace* w = Workspace::Global();
             std::ostringstream os;
             os << "{\"source_builds\": " << w->source_builds.load()
                << ", \"binary_loads\": " << w->binary_loads.load()
                << ", \"disk_hits\": " << w->disk_hits.load()
                << ", \"disk_writes\": " << w->disk_writes.load()
                << ", \"disk_errors\": " << w->disk_errors.load()
                << ", \"aot_loads\": " << g_aot_loads.load()
                << ", \"aot_fallbacks\": " << g_aot_fallbacks.load()
                << ", \"aot_corrupt\": " << g_aot_corrupt.load()
                << ", \"aot_rejected\": " << g_aot_rejected.load()
                << ", \"aot_exports\": " << g_aot_exports.load()
                << ", \"build_ns\": " << g_build_ns.load() << "}";
             return ffi::String(os.str());
           })
      .def("codl.opencl.buffer_stats",
           []() {
             Workspace* w = Workspace::Global();
             std::ostringstream os;
             os << "{\"host_maps\": " << w->host_maps.load()
                << ", \"sub_buffers\": " << w->sub_buffers.load()
                << ", \"staged_views\": " << w->staged_views.load() << "}";
             return ffi::String(os.str());
           })
      .def("codl.opencl.add_binary_dir",
           [](ffi::String dir) {
             std::lock_guard<std::mutex> lock(g_aot_mu);
             std::string d(dir);
             if (std::find(g_aot_dirs.begin(), g_aot_dirs.end(), d) == g_aot_dirs.end()) {
               g_aot_dirs.push_back(d);
             }
           })
      .def("codl.opencl.set_binary_export_dir",
           [](ffi::String dir) {
             std::lock_guard<std::mutex> lock(g_aot_mu);
             g_aot_export_dir = std::string(dir);
           })
      .def("codl.opencl.build_programs",
           [](ffi::Module mod, int dev_id, int threads, bool wait) {
             if (std::string(mod->kind()) != "opencl") {
               TVM_FFI_THROW(ValueError) << "build_programs expects an OpenCL module, got '"
                                         << mod->kind() << "'";
             }
             Workspace::Global()->Device(dev_id);  // context first, outside the threads
             static_cast<OpenCLModuleObj*>(mod.operator->())->BuildAll(dev_id, threads, wait);
           })
      .def("codl.opencl.set_warm_shard",
           [](int64_t index, int64_t count) {
             if (count < 0 || index < 0 || (count > 0 && index >= count)) {
               TVM_FFI_THROW(ValueError) << "warm shard " << index << " of " << count
                                         << ": needs 0 <= index < count";
             }
             g_warm_index = static_cast<uint64_t>(index);
             g_warm_count = static_cast<uint64_t>(count);
           })
      .def("codl.opencl.workspace_stats",
           []() { return ffi::String(OpenCLSVMDeviceAPI::Global()->PoolStatsJson()); })
      .def("codl.opencl.record_start", []() { Workspace::Global()->StartRecording(); })
      .def("codl.opencl.record_stop",
           []() { return ffi::String(RecordsJson(Workspace::Global()->StopRecording())); })
      .def("codl.opencl.host_clock_ns", []() { return HostClockNs(); })
      .def("codl.opencl.cpu_view", CpuView)
      .def("codl.opencl.svm_map", SvmMap)
      .def("codl.opencl.svm_unmap", SvmUnmap)
      .def("codl.opencl.finish", [](int dev_id) {
        CODL_CL_CALL(clFinish, Workspace::Global()->Queue(dev_id));
      });
}

}  // namespace codl

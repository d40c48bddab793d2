/*
 * codl-tvm OpenCL runtime plugin: the process-wide OpenCL workspace (platform, context, one queue
 * per device, SVM mode, kernel-event recording), shared by the device API, the module loader and
 * the co-execution synchronisation builtins.
 */
#ifndef CODL_TVM_RUNTIME_WORKSPACE_H_
#define CODL_TVM_RUNTIME_WORKSPACE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <unordered_map>
#include <vector>

#include "cl_api.h"

namespace codl {

/*! \brief How device tensors are allocated, from the best to the last resort. */
enum class SvmMode : int {
  kFineGrain = 0,    // clSVMAlloc(FINE_GRAIN): host and device see the same bytes, no map.
  kCoarseGrain = 1,  // clSVMAlloc: host access between clEnqueueSVMMap and Unmap.
  kBuffer = 2,       // clCreateBuffer(ALLOC_HOST_PTR): host access between clEnqueueMapBuffer
                     // and Unmap; byte-offset views reach kernels as sub-buffers.
};

const char* SvmModeName(SvmMode mode);

/*!
 * \brief A device's OpenCL image (texture) support, queried once at initialisation; callers
 * choose buffers where `supported` is false or a tensor exceeds the limits.
 */
struct ImageCaps {
  bool supported{false};        // CL_DEVICE_IMAGE_SUPPORT
  size_t max_width{0};          // CL_DEVICE_IMAGE2D_MAX_WIDTH, pixels
  size_t max_height{0};         // CL_DEVICE_IMAGE2D_MAX_HEIGHT, rows
  size_t max_array_size{0};     // CL_DEVICE_IMAGE_MAX_ARRAY_SIZE, layers
  size_t pitch_align_pixels{1};  // CL_DEVICE_IMAGE_PITCH_ALIGNMENT (1 where not reported)
  size_t base_align_pixels{1};   // CL_DEVICE_IMAGE_BASE_ADDRESS_ALIGNMENT (1 where not reported)
  bool from_buffer{false};      // cl_khr_image2d_from_buffer: an image can alias a buffer
  bool rgba_float{false};       // CL_RGBA / CL_FLOAT image2d arrays
  bool rgba_half{false};        // CL_RGBA / CL_HALF_FLOAT image2d arrays
};

/*! \brief One OpenCL device of the selected platform. */
struct DeviceEntry {
  cl::cl_device_id id{nullptr};
  std::string name, vendor, version, driver_version, c_version, extensions;
  uint32_t compute_units{0};
  uint32_t max_clock_mhz{0};
  uint64_t global_mem_bytes{0};
  uint64_t local_mem_bytes{0};
  size_t max_work_group_size{0};
  size_t max_work_item_sizes[3]{0, 0, 0};
  uint64_t svm_caps{0};
  size_t base_addr_align_bytes{0};  // CL_DEVICE_MEM_BASE_ADDR_ALIGN: sub-buffer origins
  ImageCaps images;
  cl::cl_command_queue queue{nullptr};
};

/*! \brief A kernel launch recorded while recording is on (profiler, trace). */
struct KernelRecord {
  std::string name;
  int device{0};
  cl::cl_event event{nullptr};
};

/*!
 * \brief Buffer-mode allocation (devices without SVM): the tensor's data pointer points at this,
 * so a tensor's data is no host address and a view's offset lives in DLTensor::byte_offset.
 */
struct BufferDescriptor {
  cl::cl_mem mem{nullptr};
  size_t nbytes{0};
  void* host{nullptr};  // the buffer's host address while mapped (Workspace::MapForHost)
  // Sub-buffers handed to kernels for byte-offset views, by (origin, size); released with mem.
  std::map<std::pair<size_t, size_t>, cl::cl_mem> subs;
};

/*! \brief User choices applied at initialisation (API call or environment variables). */
struct WorkspaceConfig {
  std::string platform_filter;  // substring of the platform name (case-insensitive)
  int device_index{-1};         // -1: all devices of the platform
  std::string svm_override;     // "", "fine", "coarse" or "buffer"
  std::string cache_dir;        // program-binary cache; "" disables the disk cache
};

class Workspace {
 public:
  static Workspace* Global();

  /*! \brief Set the configuration; only allowed before the first use. */
  void Configure(const WorkspaceConfig& config);
  /*! \brief Initialise on first use (thread-safe); throws a clear error when impossible. */
  void EnsureInit();
  bool initialized() const { return initialized_.load(); }

  const DeviceEntry& Device(int dev_id);
  cl::cl_command_queue Queue(int dev_id) { return Device(dev_id).queue; }
  size_t num_devices() const { return devices_.size(); }

  cl::cl_context context() const { return context_; }
  SvmMode svm_mode() const { return svm_mode_; }
  bool svm_atomics() const { return svm_atomics_; }
  const WorkspaceConfig& config() const { return config_; }

  /*! \brief Allocation registry: base pointer -> size (to find the base of an interior pointer). */
  void RegisterAlloc(void* ptr, size_t nbytes);
  void UnregisterAlloc(void* ptr);
  /*! \brief Find the allocation containing `ptr`; returns false when none does. */
  bool FindAlloc(const void* ptr, void** base, size_t* nbytes);

  /*!
   * \brief The host address of a tensor's data pointer `ptr` (the allocation's base, before
   * the tensor's byte_offset). Coarse-grained SVM and buffer mode map the allocation holding
   * `ptr` for host access (blocking, so ordered after all queued GPU work); it stays mapped
   * until UnmapAll, which every GPU-side command (kernel launch, copy, mark) calls first, so a
   * host address is valid until the next GPU-side command. Fine-grained SVM: `ptr` itself.
   */
  void* MapForHost(const void* ptr);
  void UnmapAll();
  /*! \brief Unmap the one allocation holding `ptr` if it is mapped. */
  void Unmap(const void* ptr);

  /*! \brief Buffer mode: whether `ptr` is a BufferDescriptor this runtime allocated. */
  bool IsBuffer(const void* ptr);
  /*!
   * \brief Buffer mode: a sub-buffer of `desc` for bytes [origin, origin + size), created once
   * and cached in `desc`; `origin` must be a multiple of the device's base address alignment.
   */
  cl::cl_mem SubBuffer(BufferDescriptor* desc, size_t origin, size_t size);

  /*! \brief Kernel-event recording (used by kernel timers and the profiler). */
  bool recording() const { return recording_.load(std::memory_order_relaxed) > 0; }
  void StartRecording();
  std::vector<KernelRecord> StopRecording();
  void Record(KernelRecord rec);

  /*! \brief A JSON description of the platform, devices and SVM mode. */
  std::string InfoJson();

  // Buffer mode: host mappings made, sub-buffers created and unaligned views staged through a
  // temporary buffer (tests check which path a view took).
  std::atomic<int64_t> host_maps{0}, sub_buffers{0}, staged_views{0};

  // Statistics of the program cache.
  std::atomic<int64_t> source_builds{0}, binary_loads{0}, disk_hits{0}, disk_writes{0},
      disk_errors{0};

 private:
  void InitLocked();

  std::mutex init_mu_;
  std::atomic<bool> initialized_{false};
  WorkspaceConfig config_;
  bool configured_{false};
  std::string platform_name_, platform_version_, platform_vendor_;
  cl::cl_platform_id platform_{nullptr};
  cl::cl_context context_{nullptr};
  std::vector<DeviceEntry> devices_;
  std::vector<std::pair<std::string, std::string>> skipped_;  // platform, reason
  SvmMode svm_mode_{SvmMode::kBuffer};
  bool svm_atomics_{false};

  std::mutex alloc_mu_;
  std::unordered_map<void*, size_t> allocs_;

  std::mutex map_mu_;
  std::vector<void*> mapped_;  // SVM bases, or BufferDescriptors in buffer mode
  std::mutex sub_mu_;
  std::atomic<bool> any_mapped_{false};

  std::atomic<int> recording_{0};
  std::mutex rec_mu_;
  std::vector<KernelRecord> records_;
};

/*! \brief Host monotonic clock in ns (CLOCK_MONOTONIC_RAW: PoCL's profiling time base). */
int64_t HostClockNs();

/*! \brief Escape a string for a JSON literal. */
std::string JsonEscape(const std::string& s);

}  // namespace codl

#endif  // CODL_TVM_RUNTIME_WORKSPACE_H_

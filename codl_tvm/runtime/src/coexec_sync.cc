/*
 * codl-tvm co-execution synchronisation between the OpenCL device (GPU) and the host CPU.
 *
 * A co-executed chain runs: mark = gpu_mark(); <enqueue the GPU part>; flush; cpu_wait(mark);
 * <run the CPU part>; and, where a CPU kernel reads what the GPU part wrote, another mark + wait.
 * `gpu_mark` records "everything enqueued so far" and `cpu_wait` blocks the host until it is done.
 *
 * Mechanisms (chosen per device; `codl.coexec.sync_mode` shows the choice):
 *  - "flag": a tiny kernel stores a sequence number into a fine-grained SVM flag with release
 *    semantics; the host spins on it with acquire loads (the SVM paper's active polling, ~us);
 *  - "event": a marker event the host polls with clGetEventInfo;
 *  - "finish": clFinish, exact only when nothing else is queued (the fallback).
 * Spinning backs off (pause, then sched_yield, then short sleeps) so it never starves the
 * driver's threads, and every wait has a timeout that raises instead of hanging.
 *
 * The other direction (the GPU waits for the CPU) is carried on the device: `gpu_gate` enqueues
 * a barrier whose wait list is a user event, so the GPU kernels enqueued after it (the queue is
 * in order) wait on the device while the host goes on; `cpu_signal` completes the event once
 * the CPU kernel that produces their input has run. `codl.IssueGpuAhead` issues GPU kernels
 * ahead of the CPU kernels they depend on this way; `gates_supported` says whether a device can.
 */
#include <sched.h>
#include <time.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <tvm/runtime/device_api.h>

#include "workspace.h"

namespace codl {

using namespace cl;  // NOLINT(build/namespaces)
namespace ffi = tvm::ffi;

namespace {

const char* kFlagSource =
    "__kernel void codl_set_flag(__global volatile uint* flags, uint slot, uint value) {\n"
    "  atomic_store_explicit((volatile __global atomic_uint*)&flags[slot], value,\n"
    "                        memory_order_release, memory_scope_device);\n"
    "}\n";
constexpr uint32_t kFlagSlots = 1024;

enum class SyncMode : int { kAuto = 0, kFlag = 1, kEvent = 2, kFinish = 3 };

const char* ModeName(SyncMode m) {
  switch (m) {
    case SyncMode::kFlag: return "flag";
    case SyncMode::kEvent: return "event";
    case SyncMode::kFinish: return "finish";
    default: return "auto";
  }
}

SyncMode ParseMode(const std::string& s) {
  if (s == "flag") return SyncMode::kFlag;
  if (s == "event") return SyncMode::kEvent;
  if (s == "finish") return SyncMode::kFinish;
  if (s == "auto" || s.empty()) return SyncMode::kAuto;
  TVM_FFI_THROW(ValueError) << "sync mode must be auto, flag, event or finish, not '" << s << "'";
  TVM_FFI_UNREACHABLE();
}

/*! \brief A pending mark: what the host waits on. */
struct Mark {
  SyncMode mode{SyncMode::kFinish};
  int dev_id{0};
  uint32_t slot{0};
  uint32_t value{0};
  cl_event event{nullptr};
};

class CoexecSync {
 public:
  static CoexecSync* Global() {
    static CoexecSync* inst = new CoexecSync();
    return inst;
  }

  void SetMode(const std::string& mode) {
    std::lock_guard<std::mutex> lock(mu_);
    requested_ = ParseMode(mode);
    resolved_.clear();
  }

  void SetTimeoutMs(double ms) { timeout_ns_ = static_cast<int64_t>(ms * 1e6); }
  double TimeoutMs() const { return timeout_ns_ / 1e6; }
  void SetSpin(int64_t spin_iters) { spin_iters_ = spin_iters; }

  /*! \brief The mechanism used on `dev_id`, resolving "auto" by measurement on first use. */
  SyncMode ModeFor(int dev_id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = resolved_.find(dev_id);
    if (it != resolved_.end()) return it->second;
    SyncMode m = requested_;
    if (m == SyncMode::kFlag && !FlagSupported()) {
      TVM_FFI_THROW(RuntimeError) << "sync mode 'flag' needs fine-grained SVM with atomics; "
                                  << "the OpenCL runtime runs in '"
                                  << SvmModeName(Workspace::Global()->svm_mode()) << "' mode";
    }
    if (m == SyncMode::kAuto) m = Calibrate(dev_id);
    resolved_[dev_id] = m;
    return m;
  }

  bool FlagSupported() {
    Workspace* w = Workspace::Global();
    w->EnsureInit();
    return w->svm_mode() == SvmMode::kFineGrain && w->svm_atomics();
  }

  Mark MakeMark(int dev_id, SyncMode mode) {
    Workspace* w = Workspace::Global();
    w->UnmapAll();
    cl_command_queue q = w->Queue(dev_id);
    Mark m;
    m.mode = mode;
    m.dev_id = dev_id;
    if (mode == SyncMode::kFlag) {
      EnsureFlags(dev_id);
      m.slot = next_slot_.fetch_add(1) % kFlagSlots;
      m.value = next_value_.fetch_add(1) + 1;
      uint32_t slot = m.slot, value = m.value;
      const Api& api = GetApi();
      cl_kernel k = flag_kernels_[dev_id];
      std::lock_guard<std::mutex> lock(kernel_mu_);
      CODL_CL_CALL(clSetKernelArgSVMPointer, k, 0, flags_);
      CODL_CL_CALL(clSetKernelArg, k, 1, sizeof(slot), &slot);
      CODL_CL_CALL(clSetKernelArg, k, 2, sizeof(value), &value);
      size_t one = 1;
      CODL_CL_CALL(clEnqueueNDRangeKernel, q, k, 1, nullptr, &one, &one, 0, nullptr, nullptr);
      (void)api;
    } else if (mode == SyncMode::kEvent) {
      CODL_CL_CALL(clEnqueueMarkerWithWaitList, q, 0, nullptr, &m.event);
    }
    // Real GPU drivers start executing only after a flush.
    CODL_CL_CALL(clFlush, q);
    return m;
  }

  void Wait(const Mark& m) {
    Workspace* w = Workspace::Global();
    const Api& api = GetApi();
    int64_t start = HostClockNs();
    int64_t spins = 0;
    auto backoff = [&](const char* what) {
      ++spins;
      if (spins < spin_iters_) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        return;
      }
      int64_t waited = HostClockNs() - start;
      if (waited > timeout_ns_) {
        std::ostringstream os;
        os << "co-execution sync timed out after " << waited / 1e6 << " ms waiting for " << what
           << " on opencl(" << m.dev_id << ") (timeout " << timeout_ns_ / 1e6
           << " ms; set with codl_tvm.runtime.coexec.set_timeout_ms)";
        TVM_FFI_THROW(RuntimeError) << os.str();
      }
      // Yield first, then sleep a little longer each time: never starve the driver's threads.
      if (spins < spin_iters_ + 64) {
        sched_yield();
      } else {
        timespec ts{0, std::min<int64_t>(50000, 1000 * (spins - spin_iters_ - 63))};
        nanosleep(&ts, nullptr);
      }
    };
    switch (m.mode) {
      case SyncMode::kFlag: {
        auto* flag = reinterpret_cast<std::atomic<uint32_t>*>(flags_) + m.slot;
        while (flag->load(std::memory_order_acquire) != m.value) backoff("the GPU flag");
        break;
      }
      case SyncMode::kEvent: {
        cl_int status = 1;
        while (true) {
          cl_int err = api.clGetEventInfo(m.event, CL_EVENT_COMMAND_EXECUTION_STATUS,
                                          sizeof(status), &status, nullptr);
          if (err != CL_SUCCESS) ThrowCLError("clGetEventInfo", err, "co-execution mark");
          if (status == CL_COMPLETE) break;
          if (status < 0) ThrowCLError("marker event", status, "the GPU work before it failed");
          backoff("the GPU marker event");
        }
        api.clReleaseEvent(m.event);
        break;
      }
      default:
        CODL_CL_CALL(clFinish, w->Queue(m.dev_id));
    }
  }

  /*!
   * \brief Whether GPU work can wait on the device for the CPU (gate/signal) on `dev_id`, and
   * if not why (`why` is empty when it can). Checked once per device and sync mode.
   *
   * Needs user events and barriers with a wait list (OpenCL 1.2) that hold back later
   * commands of the in-order queue, tried on the device; fine-grained SVM (with coarse SVM or
   * buffers the host maps a tensor by a blocking command on the same queue, which would wait
   * behind a gate the host has not yet signalled); one device (frees elsewhere drain every
   * queue); and a sync mode that waits for a mark, not for the whole queue (clFinish would
   * wait for gated work).
   */
  bool GatesSupported(int dev_id, std::string* why) {
    SyncMode mode = ModeFor(dev_id);  // resolve "auto" now: calibration drains the queue
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_pair(dev_id, static_cast<int>(mode));
    auto it = gate_support_.find(key);
    if (it == gate_support_.end()) {
      std::string reason = CheckGates(dev_id, mode);
      it = gate_support_.emplace(key, reason).first;
      if (!reason.empty()) {
        // Said once per device and mode: builds then issue GPU work in host order.
        fprintf(stderr,
                "codl-tvm: note: opencl(%d) cannot hold GPU work for the CPU on the device "
                "(%s); GPU kernels are issued in host order\n",
                dev_id, reason.c_str());
      }
    }
    if (why != nullptr) *why = it->second;
    return it->second.empty();
  }

  /*!
   * \brief Enqueue a barrier that holds later GPU work until `Signal` completes `ev`; `*before`
   * receives a marker of the work enqueued before the gate (what `Drain` waits for).
   */
  cl_event Gate(int dev_id, cl_event* before) {
    std::string why;
    if (!GatesSupported(dev_id, &why)) {
      TVM_FFI_THROW(RuntimeError)
          << "codl.coexec.gpu_gate: opencl(" << dev_id << ") cannot hold GPU work for the CPU ("
          << why << "); build with the GPU issued in host order (IssueGpuAhead(gates=False))";
    }
    Workspace* w = Workspace::Global();
    const Api& api = GetApi();
    cl_int err = CL_SUCCESS;
    cl_event ev = api.clCreateUserEvent(w->context(), &err);
    if (err != CL_SUCCESS) ThrowCLError("clCreateUserEvent", err, "co-execution gate");
    cl_command_queue q = w->Queue(dev_id);
    err = api.clEnqueueMarkerWithWaitList(q, 0, nullptr, before);
    if (err == CL_SUCCESS) err = api.clEnqueueBarrierWithWaitList(q, 1, &ev, nullptr);
    if (err != CL_SUCCESS) {
      api.clSetUserEventStatus(ev, CL_COMPLETE);
      api.clReleaseEvent(ev);
      ThrowCLError("clEnqueueBarrierWithWaitList", err, "co-execution gate");
    }
    // Submit what is queued before the gate: the GPU runs it while the host goes on.
    CODL_CL_CALL(clFlush, q);
    return ev;
  }

  /*! \brief Complete a gate's user event: the GPU work behind it may start. */
  void Signal(int dev_id, cl_event ev) {
    const Api& api = GetApi();
    cl_int err = api.clSetUserEventStatus(ev, CL_COMPLETE);
    api.clReleaseEvent(ev);
    if (err != CL_SUCCESS) ThrowCLError("clSetUserEventStatus", err, "co-execution signal");
    // The work behind the gate was submitted before; a flush makes sure a driver that keeps
    // commands on the host until flushed hands it over now.
    CODL_CL_CALL(clFlush, Workspace::Global()->Queue(dev_id));
  }

  /*! \brief Block the device queue behind a user event (tests of the timeout path). */
  int64_t BlockQueue(int dev_id) {
    Workspace* w = Workspace::Global();
    w->EnsureInit();
    const Api& api = GetApi();
    if (api.clCreateUserEvent == nullptr) ThrowCLError("clCreateUserEvent", -9999);
    cl_int err = CL_SUCCESS;
    cl_event ev = api.clCreateUserEvent(w->context(), &err);
    if (err != CL_SUCCESS) ThrowCLError("clCreateUserEvent", err);
    CODL_CL_CALL(clEnqueueMarkerWithWaitList, w->Queue(dev_id), 1, &ev, nullptr);
    CODL_CL_CALL(clFlush, w->Queue(dev_id));
    return reinterpret_cast<int64_t>(ev);
  }

  void UnblockQueue(int64_t handle) {
    cl_event ev = reinterpret_cast<cl_event>(handle);
    CODL_CL_CALL(clSetUserEventStatus, ev, CL_COMPLETE);
    GetApi().clReleaseEvent(ev);
  }

  /*! \brief Median cost (us) of mark + wait with `mode` on an idle queue after a tiny kernel. */
  double MeasureUs(int dev_id, SyncMode mode, int repeat) {
    std::vector<int64_t> samples;
    for (int i = 0; i < repeat; ++i) {
      Mark pre = MakeMark(dev_id, SyncMode::kFinish);
      Wait(pre);
      int64_t t0 = HostClockNs();
      Mark m = MakeMark(dev_id, mode);
      Wait(m);
      samples.push_back(HostClockNs() - t0);
    }
    std::sort(samples.begin(), samples.end());
    return samples[samples.size() / 2] / 1e3;
  }

 private:
  SyncMode Calibrate(int dev_id) {
    // mu_ is held. Flag needs fine-grained SVM + atomics; otherwise an event beats clFinish
    // because it waits only for the work before the mark.
    if (!FlagSupported()) return SyncMode::kEvent;
    double flag_us = MeasureUs(dev_id, SyncMode::kFlag, 50);
    double event_us = MeasureUs(dev_id, SyncMode::kEvent, 50);
    calibration_[dev_id] = {flag_us, event_us};
    return flag_us <= event_us ? SyncMode::kFlag : SyncMode::kEvent;
  }

  /*! \brief Why gates cannot be used on `dev_id` with `mode`, or "" (see GatesSupported). */
  std::string CheckGates(int dev_id, SyncMode mode) {
    Workspace* w = Workspace::Global();
    w->EnsureInit();
    const Api& api = GetApi();
    if (api.clCreateUserEvent == nullptr || api.clSetUserEventStatus == nullptr ||
        api.clEnqueueBarrierWithWaitList == nullptr) {
      return "the OpenCL library lacks user events or barriers with a wait list";
    }
    if (w->svm_mode() != SvmMode::kFineGrain) {
      return std::string("host access to tensors is mapped on the queue in '") +
             SvmModeName(w->svm_mode()) + "' mode";
    }
    if (w->num_devices() != 1) return "frees drain every queue with several devices";
    if (mode == SyncMode::kFinish) return "sync mode 'finish' waits for the whole queue";
    // Try it: a marker behind a gate must not complete before the user event does.
    cl_int err = CL_SUCCESS;
    cl_event ev = api.clCreateUserEvent(w->context(), &err);
    if (err != CL_SUCCESS) return "clCreateUserEvent failed with error " + std::to_string(err);
    cl_command_queue q = w->Queue(dev_id);
    err = api.clEnqueueBarrierWithWaitList(q, 1, &ev, nullptr);
    if (err != CL_SUCCESS) {
      api.clSetUserEventStatus(ev, CL_COMPLETE);
      api.clReleaseEvent(ev);
      return "clEnqueueBarrierWithWaitList failed with error " + std::to_string(err);
    }
    cl_event after = nullptr;
    err = api.clEnqueueMarkerWithWaitList(q, 0, nullptr, &after);
    api.clFlush(q);
    std::string reason;
    cl_int status = CL_COMPLETE;
    if (err == CL_SUCCESS) {
      timespec ts{0, 2000000};  // 2 ms: time for a driver that ignores the gate to run past it
      nanosleep(&ts, nullptr);
      api.clGetEventInfo(after, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(status), &status,
                         nullptr);
      if (status == CL_COMPLETE) reason = "a command behind a barrier on a user event ran early";
    } else {
      reason = "clEnqueueMarkerWithWaitList failed with error " + std::to_string(err);
    }
    err = api.clSetUserEventStatus(ev, CL_COMPLETE);
    if (err != CL_SUCCESS && reason.empty()) {
      reason = "clSetUserEventStatus failed with error " + std::to_string(err);
    }
    api.clReleaseEvent(ev);
    CODL_CL_CALL(clFinish, q);  // the probe leaves the queue as it found it
    if (after != nullptr) api.clReleaseEvent(after);
    return reason;
  }

  void EnsureFlags(int dev_id) {
    std::lock_guard<std::mutex> lock(kernel_mu_);
    Workspace* w = Workspace::Global();
    const Api& api = GetApi();
    if (flags_ == nullptr) {
      flags_ = api.clSVMAlloc(w->context(),
                              CL_MEM_READ_WRITE | CL_MEM_SVM_FINE_GRAIN_BUFFER | CL_MEM_SVM_ATOMICS,
                              kFlagSlots * sizeof(uint32_t), 64);
      if (flags_ == nullptr) {
        TVM_FFI_THROW(RuntimeError) << "clSVMAlloc of the co-execution flags failed";
      }
      std::memset(flags_, 0, kFlagSlots * sizeof(uint32_t));
    }
    if (flag_kernels_.size() <= static_cast<size_t>(dev_id)) flag_kernels_.resize(dev_id + 1);
    if (flag_kernels_[dev_id] == nullptr) {
      const DeviceEntry& dev = w->Device(dev_id);
      const char* src = kFlagSource;
      size_t len = strlen(src);
      cl_int err = CL_SUCCESS;
      cl_program prog = api.clCreateProgramWithSource(w->context(), 1, &src, &len, &err);
      if (err != CL_SUCCESS) ThrowCLError("clCreateProgramWithSource", err, "codl_set_flag");
      // C11 atomics need OpenCL C 2.0+ (PoCL and Intel default to 1.2).
      err = api.clBuildProgram(prog, 1, &dev.id, "-cl-std=CL3.0", nullptr, nullptr);
      if (err != CL_SUCCESS) err = api.clBuildProgram(prog, 1, &dev.id, "-cl-std=CL2.0", nullptr,
                                                      nullptr);
      if (err != CL_SUCCESS) ThrowCLError("clBuildProgram", err, "codl_set_flag");
      flag_kernels_[dev_id] = api.clCreateKernel(prog, "codl_set_flag", &err);
      if (err != CL_SUCCESS) ThrowCLError("clCreateKernel", err, "codl_set_flag");
    }
  }

 public:
  std::unordered_map<int, std::pair<double, double>> calibration_;

 private:
  std::mutex mu_, kernel_mu_;
  SyncMode requested_{SyncMode::kAuto};
  std::unordered_map<int, SyncMode> resolved_;
  std::map<std::pair<int, int>, std::string> gate_support_;  // (device, mode) -> why not
  void* flags_{nullptr};
  std::vector<cl_kernel> flag_kernels_;
  std::atomic<uint32_t> next_slot_{0}, next_value_{0};
  int64_t timeout_ns_{10LL * 1000 * 1000 * 1000};
  int64_t spin_iters_{20000};
};

// Marks are handed to Relax as int64 handles into this table (Relax has no opaque object type
// for them); a handle is consumed by the wait.
std::mutex g_marks_mu;
std::unordered_map<int64_t, Mark> g_marks;
int64_t g_next_mark = 1;

int64_t GpuMark(int dev_id) {
  CoexecSync* s = CoexecSync::Global();
  Mark m = s->MakeMark(dev_id, s->ModeFor(dev_id));
  std::lock_guard<std::mutex> lock(g_marks_mu);
  int64_t h = g_next_mark++;
  g_marks[h] = m;
  return h;
}

// Gates are handed to Relax as int64 handles too; a handle is consumed by its signal.
struct Gate {
  int dev_id{0};
  cl_event event{nullptr};
  cl_event before{nullptr};  // marker of the GPU work enqueued before the gate
};
std::mutex g_gates_mu;
std::map<int64_t, Gate> g_gates;  // ordered: the oldest pending gate first
int64_t g_next_gate = 1;

int64_t GpuGate(int dev_id) {
  cl_event before = nullptr;
  cl_event ev = CoexecSync::Global()->Gate(dev_id, &before);
  std::lock_guard<std::mutex> lock(g_gates_mu);
  int64_t h = g_next_gate++;
  g_gates[h] = Gate{dev_id, ev, before};
  return h;
}

/*!
 * \brief Wait until the device has run all the GPU work it can: everything, or with a gate
 * pending everything before the oldest pending gate (clFinish would wait for the CPU's signal
 * on this very thread). For timelines that run each kernel alone.
 */
void Drain(int dev_id) {
  Workspace* w = Workspace::Global();
  w->EnsureInit();
  cl_event before = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_gates_mu);
    for (auto& [h, g] : g_gates) {
      if (g.dev_id == dev_id) {
        before = g.before;
        GetApi().clRetainEvent(before);
        break;
      }
    }
  }
  if (before == nullptr) {
    CODL_CL_CALL(clFinish, w->Queue(dev_id));
    return;
  }
  CODL_CL_CALL(clFlush, w->Queue(dev_id));
  cl_int err = GetApi().clWaitForEvents(1, &before);
  GetApi().clReleaseEvent(before);
  if (err != CL_SUCCESS) ThrowCLError("clWaitForEvents", err, "co-execution drain");
}

void CpuSignal(int64_t handle) {
  Gate g;
  {
    std::lock_guard<std::mutex> lock(g_gates_mu);
    auto it = g_gates.find(handle);
    if (it == g_gates.end()) {
      TVM_FFI_THROW(ValueError) << "unknown or already-signalled co-execution gate " << handle;
    }
    g = it->second;
    g_gates.erase(it);
  }
  if (g.before != nullptr) GetApi().clReleaseEvent(g.before);
  CoexecSync::Global()->Signal(g.dev_id, g.event);
}

/*!
 * \brief Submit what is queued on the device without waiting: the host is about to run a CPU
 * kernel beside GPU work it need not wait for (real GPU drivers start executing only after a
 * flush; without one the GPU branch would wait for the next mark).
 */
void GpuFlush(int dev_id) {
  Workspace* w = Workspace::Global();
  w->EnsureInit();
  CODL_CL_CALL(clFlush, w->Queue(dev_id));
}

void CpuWait(int64_t handle) {
  Mark m;
  {
    std::lock_guard<std::mutex> lock(g_marks_mu);
    auto it = g_marks.find(handle);
    if (it == g_marks.end()) {
      TVM_FFI_THROW(ValueError) << "unknown or already-waited co-execution mark " << handle;
    }
    m = it->second;
    g_marks.erase(it);
  }
  CoexecSync::Global()->Wait(m);
}

/*! \brief A CPU tensor over an OpenCL tensor's SVM bytes; CPU tensors pass through. */
ffi::Tensor CpuViewOrSelf(ffi::Tensor t) {
  if (t.GetDLTensorPtr()->device.device_type == kDLCPU) return t;
  static ffi::Function view = ffi::Function::GetGlobal("codl.opencl.cpu_view").value();
  return view(t).cast<ffi::Tensor>();
}

/*! \brief Keeps the full tensor alive while a region view of it exists. */
struct RegionAlloc {
  ffi::Tensor owner;
  int64_t byte_offset;
  void AllocData(DLTensor* t) {
    t->data = owner.GetDLTensorPtr()->data;
    t->byte_offset = byte_offset;
  }
  void FreeData(DLTensor*) {}
};

/*!
 * \brief The rows [start, stop) of `t` along `axis` as a strided view (no copy): the part of a
 * shared output one processor writes. Kernels taking it declare the full tensor's strides.
 */
ffi::Tensor RegionView(ffi::Tensor t, int64_t axis, int64_t start, int64_t stop) {
  const DLTensor* d = t.GetDLTensorPtr();
  if (axis < 0 || axis >= d->ndim || start < 0 || stop > d->shape[axis] || start >= stop) {
    TVM_FFI_THROW(ValueError) << "region_view: rows [" << start << ", " << stop << ") of axis "
                              << axis << " do not fit a tensor of rank " << d->ndim;
  }
  std::vector<int64_t> shape(d->shape, d->shape + d->ndim), strides(d->ndim);
  int64_t acc = 1;
  for (int i = d->ndim - 1; i >= 0; --i) {
    strides[i] = d->strides ? d->strides[i] : acc;
    acc *= d->shape[i];
  }
  shape[axis] = stop - start;
  int64_t elem_bytes = (d->dtype.bits * d->dtype.lanes + 7) / 8;
  int64_t offset = d->byte_offset + start * strides[axis] * elem_bytes;
  return ffi::Tensor::FromNDAllocStrided(RegionAlloc{t, offset},
                                         ffi::ShapeView(shape.data(), shape.size()),
                                         ffi::ShapeView(strides.data(), strides.size()), d->dtype,
                                         d->device);
}

/*! \brief Owns memory from a TVM DeviceAPI (the plugin's for OpenCL, TVM's for the CPU). */
struct DeviceAlloc {
  void AllocData(DLTensor* t) {
    tvm::runtime::DeviceAPI* api = tvm::runtime::DeviceAPI::Get(t->device);
    t->data = api->AllocDataSpace(t->device, ffi::GetDataSize(*t), 128, t->dtype);
  }
  void FreeData(DLTensor* t) {
    if (t->data) tvm::runtime::DeviceAPI::Get(t->device)->FreeDataSpace(t->device, t->data);
  }
};

std::mutex g_sites_mu;
std::unordered_map<int64_t, ffi::Tensor> g_sites;

/*!
 * \brief A tensor the CPU writes, outside the VM's memory plan.
 *
 * The VM's static plan reuses storage in program order, which is unsafe when the GPU queue runs
 * behind the host: a CPU kernel could overwrite storage an earlier GPU kernel still reads. These
 * tensors are allocated per call site once (cache = true; a drain at the function's entry makes
 * reuse across calls safe) or fresh (for tensors the function returns).
 */
ffi::Tensor SiteAlloc(int64_t site, ffi::Shape shape, DLDataType dtype, int device_index,
                      bool cache) {
  DLDevice dev = device_index == 0 ? DLDevice{kDLOpenCL, 0} : DLDevice{kDLCPU, 0};
  if (cache) {
    std::lock_guard<std::mutex> lock(g_sites_mu);
    auto it = g_sites.find(site);
    if (it != g_sites.end()) {
      const DLTensor* d = it->second.GetDLTensorPtr();
      bool same = d->ndim == static_cast<int>(shape.size()) && d->dtype.code == dtype.code &&
                  d->dtype.bits == dtype.bits && d->device.device_type == dev.device_type;
      for (int i = 0; same && i < d->ndim; ++i) same = d->shape[i] == shape[i];
      if (same) return it->second;
    }
  }
  ffi::Tensor t = ffi::Tensor::FromNDAlloc(DeviceAlloc{}, shape, dtype, dev);
  if (cache) {
    std::lock_guard<std::mutex> lock(g_sites_mu);
    g_sites[site] = t;
  }
  return t;
}

/*!
 * \brief The CPU's own copy of a constant (a weight), made once per call site: each processor
 * reads its weights from its own memory, pre-arranged at the first call (CoDL), and the CPU needs
 * no SVM map for them.
 */
ffi::Tensor CpuCopy(int64_t site, ffi::Tensor t) {
  const DLTensor* d = t.GetDLTensorPtr();
  if (d->device.device_type == kDLCPU) return t;
  int64_t key = site ^ 0x5bd1e9955bd1e995LL;
  {
    std::lock_guard<std::mutex> lock(g_sites_mu);
    auto it = g_sites.find(key);
    if (it != g_sites.end()) return it->second;
  }
  std::vector<int64_t> shape(d->shape, d->shape + d->ndim);
  ffi::Tensor copy = ffi::Tensor::FromNDAlloc(DeviceAlloc{},
                                              ffi::ShapeView(shape.data(), shape.size()),
                                              d->dtype, DLDevice{kDLCPU, 0});
  Workspace* w = Workspace::Global();
  if (w->svm_mode() == SvmMode::kFineGrain && ffi::IsContiguous(*d)) {
    // Fine-grained SVM is host-coherent: copy on the host, not by a blocking command on the
    // queue, which would wait behind GPU work held by a gate (codl.coexec.gpu_gate) whose
    // signal comes after this CPU kernel. Constants are uploaded before the VM runs.
    std::memcpy(copy.GetDLTensorPtr()->data, static_cast<const char*>(d->data) + d->byte_offset,
                ffi::GetDataSize(*d));
  } else {
    DLTensor src = *d;
    DLTensor dst = *copy.GetDLTensorPtr();
    tvm::runtime::DeviceAPI::Get(d->device)->CopyDataFromTo(&src, &dst, nullptr);
  }
  std::lock_guard<std::mutex> lock(g_sites_mu);
  g_sites[key] = copy;
  return copy;
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def("codl.coexec.gpu_mark", GpuMark)
      .def("codl.coexec.cpu_wait", CpuWait)
      .def("codl.coexec.gpu_flush", GpuFlush)
      .def("codl.coexec.cpu_view", CpuViewOrSelf)
      .def("codl.coexec.region_view", RegionView)
      .def("codl.coexec.alloc", SiteAlloc)
      .def("codl.coexec.cpu_copy", CpuCopy)
      .def("codl.coexec.release_sites", []() {
        std::lock_guard<std::mutex> lock(g_sites_mu);
        g_sites.clear();
      })
      .def_packed("codl.coexec.join",
                  [](ffi::PackedArgs args, ffi::Any* rv) {
                    // The merged tensor, once every part written in place: orders the parts
                    // before the tensor's uses in the Relax program.
                    *rv = args[0];
                  })
      .def("codl.coexec.set_sync_mode",
           [](ffi::String mode) { CoexecSync::Global()->SetMode(std::string(mode)); })
      .def("codl.coexec.sync_mode",
           [](int dev_id) { return ffi::String(ModeName(CoexecSync::Global()->ModeFor(dev_id))); })
      .def("codl.coexec.flag_supported", []() { return CoexecSync::Global()->FlagSupported(); })
      .def("codl.coexec.set_timeout_ms", [](double ms) { CoexecSync::Global()->SetTimeoutMs(ms); })
      .def("codl.coexec.timeout_ms", []() { return CoexecSync::Global()->TimeoutMs(); })
      .def("codl.coexec.set_spin", [](int64_t n) { CoexecSync::Global()->SetSpin(n); })
      .def("codl.coexec.measure_us",
           [](int dev_id, ffi::String mode, int repeat) {
             return CoexecSync::Global()->MeasureUs(dev_id, ParseMode(std::string(mode)), repeat);
           })
      .def("codl.coexec.calibration",
           [](int dev_id) {
             auto& c = CoexecSync::Global()->calibration_;
             auto it = c.find(dev_id);
             std::ostringstream os;
             if (it == c.end()) {
               os << "{}";
             } else {
               os << "{\"flag_us\": " << it->second.first << ", \"event_us\": "
                  << it->second.second << "}";
             }
             return ffi::String(os.str());
           })
      .def("codl.coexec.gpu_gate", GpuGate)
      .def("codl.coexec.cpu_signal", CpuSignal)
      .def("codl.coexec.drain", Drain)
      .def("codl.coexec.gates_supported",
           [](int dev_id) { return CoexecSync::Global()->GatesSupported(dev_id, nullptr); })
      .def("codl.coexec.gates_unsupported_reason",
           [](int dev_id) {
             std::string why;
             CoexecSync::Global()->GatesSupported(dev_id, &why);
             return ffi::String(why);
           })
      .def("codl.coexec.block_queue", [](int dev_id) { return CoexecSync::Global()->BlockQueue(dev_id); })
      .def("codl.coexec.unblock_queue",
           [](int64_t h) { CoexecSync::Global()->UnblockQueue(h); });
}

}  // namespace codl

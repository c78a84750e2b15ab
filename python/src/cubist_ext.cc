// cubist._cubist: the Python package's native half, a thin nanobind layer over the same
// C++ API an engine links (dispatch/runtime.h, dispatch/moe_gemm.h) and the report
// functions the CLI uses too (report/reports.h). The Python half (python/cubist/_tensors.py) turns tensors
// into device pointers and sizes and raises every argument error; `run` here is integer
// conversion plus MoeGemm::Run. One exception, for speed: MoeGemm.run is a C method
// (RunMethod below) that reads plain torch tensors itself (ReadFastArgs: through torch's
// DLPack exchange API, or its attributes) and launches, and hands any call it does not
// accept to the Python `run`, which then raises the error or takes the general path.
//
// Errors: an absl::Status that is not OK becomes the Python exception class registered
// for its code (cubist/_errors.py) with the message unchanged. C++ exceptions exist only
// inside this file, as nanobind's way of raising; the library below never throws.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "dispatch/moe_gemm.h"
#include "dispatch/moe_layer.h"
#include "dispatch/moe_types.h"
#include "dispatch/runtime.h"
#include "report/problem_spec.h"
#include "report/reports.h"
#include "report/trust_spec.h"

namespace nb = nanobind;

namespace cubist::python {
namespace {

// The abi3 wheel (CPython 3.12 and newer, pyproject.toml) compiles this file under
// Py_LIMITED_API, which has neither the tuple macros nor PyObject_CallOneArg; there their
// checked function forms stand in. Other builds keep the macros on the run hot path.
#ifdef Py_LIMITED_API
Py_ssize_t TupleSize(PyObject* t) { return PyTuple_Size(t); }
PyObject* TupleItem(PyObject* t, Py_ssize_t i) { return PyTuple_GetItem(t, i); }
PyObject* CallOneArg(PyObject* f, PyObject* arg) {
  PyObject* args[] = {arg};
  return PyObject_Vectorcall(f, args, 1, nullptr);
}
#else
Py_ssize_t TupleSize(PyObject* t) { return PyTuple_GET_SIZE(t); }
PyObject* TupleItem(PyObject* t, Py_ssize_t i) { return PyTuple_GET_ITEM(t, i); }
PyObject* CallOneArg(PyObject* f, PyObject* arg) { return PyObject_CallOneArg(f, arg); }
#endif

// Python classes by absl::StatusCode (0..16), set once by cubist/_errors.py.
std::array<nb::object, 17>& ErrorClasses() {
  static auto* classes = new std::array<nb::object, 17>();
  return *classes;
}

struct StatusError {
  absl::Status status;
};

[[noreturn]] void Raise(absl::Status status) { throw StatusError{std::move(status)}; }

void Check(absl::Status status) {
  if (!status.ok()) Raise(std::move(status));
}

template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) Raise(std::move(v).status());
  return *std::move(v);
}

report::TrustSpec TrustOf(std::vector<std::string> keys, std::vector<std::string> key_files,
                          bool allow_expired, bool allow_rollback) {
  report::TrustSpec t;
  t.keys = std::move(keys);
  t.key_files = std::move(key_files);
  t.allow_expired = allow_expired;
  t.allow_rollback = allow_rollback;
  return t;
}

// fn() with the GIL released (network, disk, kernel loading, timing): other Python
// threads keep running meanwhile.
template <typename Fn>
auto WithoutGil(Fn fn) {
  nb::gil_scoped_release release;
  return fn();
}

// (report JSON text, status code, status message): Python parses the JSON and decides
// whether a failed report raises (cubist/__init__.py, `check`).
using ReportTuple = std::tuple<std::string, int, std::string>;

ReportTuple ToTuple(const report::CommandReport& r) {
  return {r.json.dump(2), static_cast<int>(r.status.code()), std::string(r.status.message())};
}

// Runtime and MoeGemm as Python objects. The MoeGemm holds a reference to its Runtime's
// Python object (nb::keep_alive below), so the runtime outlives its ops as the C++ API
// requires.
class PyRuntime {
 public:
  explicit PyRuntime(std::unique_ptr<Runtime> rt) : rt_(std::move(rt)) {}
  Runtime& get() { return *rt_; }

 private:
  std::unique_ptr<Runtime> rt_;
};

MoeGemmArgs ArgsOf(int wf, int af, int act, int64_t e, int64_t t, int64_t n, int64_t k) {
  MoeGemmArgs a;
  a.weight_format = static_cast<DataFormat>(wf);
  a.activation_format = static_cast<DataFormat>(af);
  a.activation = static_cast<Activation>(act);
  a.experts = e;
  a.tokens = t;
  a.n = n;
  a.k = k;
  return a;
}

// The pointer tuple's order: a, b, a_scale, b_scale, a_global_scale, b_global_scale,
// offsets, alpha, beta, limit, out, bias (as bench/moe_shim.cc and MoeGemmArgs).
void SetPointers(MoeGemmArgs& a, uint64_t pa, uint64_t pb, uint64_t as, uint64_t bs,
                 uint64_t ag, uint64_t bg, uint64_t off, uint64_t alpha, uint64_t beta,
                 uint64_t limit, uint64_t out, uint64_t bias) {
  a.a = pa;
  a.b = pb;
  a.a_scale = as;
  a.b_scale = bs;
  a.a_global_scale = ag;
  a.b_global_scale = bg;
  a.offsets = off;
  a.alpha = alpha;
  a.beta = beta;
  a.limit = limit;
  a.out = out;
  a.bias = bias;
}

nb::dict DecisionDict(const MoeGemmDecision& d) {
  nb::dict r;
  const KernelSpec& s = d.kernel->spec;
  r["kernel"] = s.name;
  r["artifact"] = s.artifact;
  r["function"] = s.function;
  r["arch"] = s.arch;
  r["abi"] = d.info.abi;
  r["tile"] = nb::make_tuple(s.tile_m, s.tile_n, s.tile_k);
  r["cluster"] = nb::make_tuple(d.cluster[0], d.cluster[1], d.cluster[2]);
  r["threads"] = d.block;
  r["shared_mem_bytes"] = d.shared_mem_bytes;
  r["from_tuning"] = d.from_tuning;
  return r;
}

// DLPack's C exchange API (dlpack.h 1.x, "DLPackExchangeAPI"), declared here as the ABI
// it is: a framework puts a table of C functions on its tensor type as
// `__dlpack_c_exchange_api__` (a capsule named "dlpack_exchange_api"; torch.Tensor has one
// in recent torch). dltensor_from_py_object_no_sync fills a caller-owned DLTensor that
// views the tensor (no Python object, no allocation, valid until control returns to the
// framework) and current_work_stream gives torch's current stream: what `run` needs of a
// tensor and of torch in two C calls instead of six Python attribute lookups per tensor.
namespace dl {
struct Device {
  int32_t device_type;  // 1 kDLCPU, 2 kDLCUDA
  int32_t device_id;
};
struct DataType {
  uint8_t code;  // 0 int, 4 bfloat, 10 float8_e4m3fn
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null means compact row-major
  uint64_t byte_offset;
};
struct Version {
  uint32_t major;
  uint32_t minor;
};
struct ApiHeader {
  Version version;
  ApiHeader* prev_api;
};
struct ExchangeApi {
  ApiHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, Tensor* out);  // 0, or -1 + error
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};
constexpr int32_t kCpu = 1;
constexpr int32_t kCuda = 2;
constexpr uint8_t kInt = 0;
constexpr uint8_t kBfloat = 4;
constexpr uint8_t kFloat8E4m3fn = 10;

// The version-1 table of a `__dlpack_c_exchange_api__` value, or null (not a capsule of
// that name, no major version 1 in its chain, or without the two functions used here).
const ExchangeApi* ApiOf(PyObject* capsule) {
  if (capsule == nullptr || !PyCapsule_IsValid(capsule, "dlpack_exchange_api")) return nullptr;
  auto* h = static_cast<ApiHeader*>(PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
  while (h != nullptr && h->version.major != 1) h = h->prev_api;
  auto* api = reinterpret_cast<const ExchangeApi*>(h);
  if (api == nullptr || api->dltensor_from_py_object_no_sync == nullptr ||
      api->current_work_stream == nullptr) {
    return nullptr;
  }
  return api;
}
}  // namespace dl

// torch's objects for the fast path (python/cubist/_tensors.py hands them over once torch
// is imported; this file never imports torch): the exact type torch.Tensor, the dtypes
// the fast path accepts, torch._C._cuda_getCurrentRawStream and torch.Tensor's DLPack
// exchange API where torch has one. Owned for the process.
struct TorchObjects {
  PyTypeObject* tensor = nullptr;
  PyObject* bfloat16 = nullptr;
  PyObject* float8_e4m3fn = nullptr;
  PyObject* int32 = nullptr;
  PyObject* current_stream = nullptr;  // (device) -> int
  const dl::ExchangeApi* api = nullptr;
  // Switches for the tests and benchmarks (_fast_path_config): read tensors through the
  // exchange API when there is one; take CPU tensors as if on the runtime's device (CPU
  // tests and the CPU microbenchmark only: they never launch).
  bool use_api = true;
  bool cpu_as_device = false;
  PyObject* s_dtype = nullptr;  // interned attribute and method names
  PyObject* s_is_cuda = nullptr;
  PyObject* s_shape = nullptr;
  PyObject* s_is_contiguous = nullptr;
  PyObject* s_data_ptr = nullptr;
  PyObject* s_get_device = nullptr;
};

TorchObjects& Torch() {
  static auto* t = new TorchObjects();
  return *t;
}

// What the fast path reads of one tensor.
enum class Elem { kBf16, kFp8, kInt32 };

struct FastTensor {
  Elem elem = Elem::kBf16;
  int ndim = 0;
  int64_t shape[3] = {0, 0, 0};
  uint64_t ptr = 0;
  int64_t device = -1;  // CUDA ordinal; -1 for a CPU tensor (only with cpu_as_device)
};

// The PyObject* result of a no-argument method call, or null (error cleared).
PyObject* CallMethod0(PyObject* self, PyObject* name) {
  PyObject* args[] = {self};
  PyObject* r = PyObject_VectorcallMethod(name, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                          nullptr);
  if (r == nullptr) PyErr_Clear();
  return r;
}

// Through the exchange API: one C call, then plain fields. Dense as torch's
// is_contiguous() defines it: every dimension of more than one element has the row-major
// stride; any tensor with no elements is dense.
bool ReadDlpack(PyObject* x, FastTensor& t) {
  const TorchObjects& T = Torch();
  dl::Tensor d{};
  if (T.api->dltensor_from_py_object_no_sync(x, &d) != 0) return PyErr_Clear(), false;
  if (d.device.device_type == dl::kCuda) {
    t.device = d.device.device_id;
  } else if (d.device.device_type == dl::kCpu && T.cpu_as_device) {
    t.device = -1;
  } else {
    return false;
  }
  if (d.dtype.lanes != 1) return false;
  if (d.dtype.code == dl::kBfloat && d.dtype.bits == 16) {
    t.elem = Elem::kBf16;
  } else if (d.dtype.code == dl::kFloat8E4m3fn && d.dtype.bits == 8) {
    t.elem = Elem::kFp8;
  } else if (d.dtype.code == dl::kInt && d.dtype.bits == 32) {
    t.elem = Elem::kInt32;
  } else {
    return false;
  }
  if (d.ndim < 0 || d.ndim > 3) return false;
  t.ndim = d.ndim;
  bool empty = false;
  for (int i = 0; i < t.ndim; ++i) {
    t.shape[i] = d.shape[i];
    empty = empty || t.shape[i] == 0;
  }
  if (d.strides != nullptr && !empty) {
    int64_t expect = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] == 1) continue;
      if (d.strides[i] != expect) return false;
      expect *= t.shape[i];
    }
  }
  t.ptr = reinterpret_cast<uintptr_t>(d.data) + d.byte_offset;
  return true;
}

// Through torch's Python attributes (torch without the exchange API, or a tensor it could
// not describe, e.g. a dtype its DLPack does not know).
bool ReadAttributes(PyObject* x, FastTensor& t) {
  const TorchObjects& T = Torch();
  PyObject* v = PyObject_GetAttr(x, T.s_is_cuda);
  if (v == nullptr) return PyErr_Clear(), false;
  const bool cuda = v == Py_True;
  Py_DECREF(v);
  if (!cuda && !T.cpu_as_device) return false;
  v = PyObject_GetAttr(x, T.s_dtype);
  if (v == nullptr) return PyErr_Clear(), false;
  Py_DECREF(v);  // dtypes are torch's singletons, alive as long as torch
  if (v == T.bfloat16) {
    t.elem = Elem::kBf16;
  } else if (v == T.float8_e4m3fn) {
    t.elem = Elem::kFp8;
  } else if (v == T.int32) {
    t.elem = Elem::kInt32;
  } else {
    return false;
  }
  v = CallMethod0(x, T.s_is_contiguous);
  if (v == nullptr) return false;
  const bool contiguous = v == Py_True;
  Py_DECREF(v);
  if (!contiguous) return false;
  v = PyObject_GetAttr(x, T.s_shape);  // torch.Size, a tuple subclass
  if (v == nullptr) return PyErr_Clear(), false;
  bool ok = PyTuple_Check(v) && TupleSize(v) <= 3;
  if (ok) {
    t.ndim = static_cast<int>(TupleSize(v));
    for (int i = 0; i < t.ndim && ok; ++i) {
      t.shape[i] = PyLong_AsLongLong(TupleItem(v, i));
      ok = !(t.shape[i] == -1 && PyErr_Occurred());
    }
  }
  Py_DECREF(v);
  if (!ok) return PyErr_Clear(), false;
  v = CallMethod0(x, T.s_data_ptr);
  if (v == nullptr) return false;
  t.ptr = PyLong_AsUnsignedLongLong(v);
  Py_DECREF(v);
  if (PyErr_Occurred()) return PyErr_Clear(), false;
  v = CallMethod0(x, T.s_get_device);
  if (v == nullptr) return false;
  const int64_t device = PyLong_AsLongLong(v);
  Py_DECREF(v);
  if (PyErr_Occurred()) return PyErr_Clear(), false;
  t.device = cuda ? device : -1;
  return true;
}

// Reads a dense CUDA torch.Tensor of at most 3 dimensions, bf16, fp8 (e4m3fn) or int32;
// false for anything else (another type, a subclass, CPU, strided, another dtype, more
// dimensions), which the Python half then handles (and words the error for).
bool ReadTorchTensor(PyObject* x, FastTensor& t) {
  const TorchObjects& T = Torch();
  if (Py_TYPE(x) != T.tensor) return false;
  if (T.api != nullptr && T.use_api && ReadDlpack(x, t)) return true;
  return ReadAttributes(x, t);
}

DataFormat FormatOf(const FastTensor& t) {
  return t.elem == Elem::kBf16 ? DataFormat::kBf16 : DataFormat::kFp8;
}

// torch's current stream on `device` (what torch.cuda.current_stream(device).cuda_stream
// gives; inside CUDA-graph capture, the capturing stream), or false (error cleared).
bool CurrentStream(int64_t device, uintptr_t& s) {
  const TorchObjects& T = Torch();
  if (T.api != nullptr && T.use_api) {
    void* p = nullptr;
    if (T.api->current_work_stream(dl::kCuda, static_cast<int32_t>(device), &p) != 0) {
      return PyErr_Clear(), false;
    }
    s = reinterpret_cast<uintptr_t>(p);
    return true;
  }
  if (T.current_stream == nullptr) return false;
  PyObject* dev = PyLong_FromLongLong(device);
  if (dev == nullptr) return PyErr_Clear(), false;
  PyObject* r = CallOneArg(T.current_stream, dev);
  Py_DECREF(dev);
  if (r == nullptr) return PyErr_Clear(), false;
  s = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(r));
  Py_DECREF(r);
  if (PyErr_Occurred()) return PyErr_Clear(), false;
  return true;
}

// A launch as the tests see it: (wf, af, act, E, T, N, K, [12 pointers], extra...), the
// pointers in MoeGemmArgs' order (a, b, a_scale, b_scale, a_global_scale, b_global_scale,
// offsets, alpha, beta, limit, out, bias).
template <typename... Extra>
nb::object LaunchTuple(const MoeGemmArgs& a, const Extra&... extra) {
  nb::list ptrs;
  for (uint64_t x : {a.a, a.b, a.a_scale, a.b_scale, a.a_global_scale, a.b_global_scale,
                     a.offsets, a.alpha, a.beta, a.limit, a.out, a.bias}) {
    ptrs.append(x);
  }
  return nb::make_tuple(static_cast<int>(a.weight_format), static_cast<int>(a.activation_format),
                        static_cast<int>(a.activation), a.experts, a.tokens, a.n, a.k, ptrs,
                        extra...);
}

// The fast path of MoeGemm.run (python/cubist/__init__.py). v: run's 16 arguments (a, b,
// offsets, out, activation, weights, activations, a_scale, b_scale, a_global_scale,
// b_global_scale, alpha, beta, limit, stream, bias). Accepts plain CUDA torch tensors,
// bf16 or fp8 (per tensor, no scale tensors), no optional argument but `activation` and
// an integer or None `stream`, all on `device`, and fills the arguments and stream `run`
// would launch with. A call with a bias takes the Python path, which checks it (calls
// without one pay nothing for it; a CUDA graph replays either path's launch at no host
// cost). It accepts only what the Python checks accept; for anything else it returns
// false and the Python half takes over (errors included, so each keeps its one wording
// there).
bool ReadFastArgs(int64_t device, PyObject* const* v, MoeGemmArgs& args, uintptr_t& s) {
  const TorchObjects& T = Torch();
  if (T.tensor == nullptr || device < 0) return false;
  for (int i = 5; i < 14; ++i) {
    if (v[i] != Py_None) return false;
  }
  if (v[15] != Py_None) return false;  // bias
  PyObject* activation = v[4];
  PyObject* stream = v[14];
  if (stream != Py_None && !PyLong_CheckExact(stream)) return false;
  if (!PyUnicode_CheckExact(activation)) return false;
  Py_ssize_t len = 0;
  const char* name = PyUnicode_AsUTF8AndSize(activation, &len);
  if (name == nullptr) return PyErr_Clear(), false;
  absl::StatusOr<Activation> act = ParseActivation(std::string_view(name, len));
  // cubist.ACTIVATIONS: the five the moe_gemm ABI encodes.
  if (!act.ok() || static_cast<int>(*act) > static_cast<int>(Activation::kSitu)) {
    return false;
  }
  FastTensor ta, tb, to, tout;
  if (!ReadTorchTensor(v[0], ta) || !ReadTorchTensor(v[1], tb) ||
      !ReadTorchTensor(v[2], to) || !ReadTorchTensor(v[3], tout)) {
    return false;
  }
  if (ta.elem == Elem::kInt32 || tb.elem == Elem::kInt32 || to.elem != Elem::kInt32 ||
      tout.elem != Elem::kBf16) {
    return false;
  }
  for (const FastTensor* x : {&ta, &tb, &to, &tout}) {
    if (x->device == -1 ? !T.cpu_as_device : x->device != device) return false;
  }
  if (to.ndim != 1 || to.shape[0] < 2) return false;
  const int64_t e = to.shape[0] - 1;
  if (tb.ndim != 3 || tb.shape[0] != e) return false;
  const int64_t n = tb.shape[1], k = tb.shape[2];
  if (ta.ndim != 2 || ta.shape[1] != k) return false;
  const int64_t t = ta.shape[0];
  const bool gated = IsGated(*act);
  if (gated && n % 2) return false;
  if (tout.ndim != 2 || tout.shape[0] != t || tout.shape[1] != (gated ? n / 2 : n)) {
    return false;
  }
  if (stream == Py_None) {
    if (!CurrentStream(device, s)) return false;
  } else {
    s = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(stream));
    if (PyErr_Occurred()) return PyErr_Clear(), false;
  }
  args = ArgsOf(static_cast<int>(FormatOf(tb)), static_cast<int>(FormatOf(ta)),
                static_cast<int>(*act), e, t, n, k);
  SetPointers(args, ta.ptr, tb.ptr, 0, 0, 0, 0, to.ptr, 0, 0, 0, tout.ptr, 0);
  return true;
}

class PyMoeGemm {
 public:
  PyMoeGemm(PyRuntime& rt, std::string pinned_kernel, bool pdl, bool allow_inexact,
            int64_t routed_top_k, int64_t routed_experts) {
    MoeGemmOptions o;
    o.pinned_kernel = std::move(pinned_kernel);
    o.programmatic_dependent_launch = pdl;
    o.allow_inexact = allow_inexact;
    o.routed_top_k = routed_top_k;
    o.routed_experts = routed_experts;
    op_ = Check(MoeGemm::Create(rt.get(), std::move(o)));
  }

  // An op without a runtime, for the CPU tests and the CPU microbenchmark: its launches
  // are recorded (LastLaunch), not made; everything else refuses.
  explicit PyMoeGemm(int64_t device) : device_(device) {}

  // The hot path: no allocation, no Python object created; the GIL is kept because
  // Run takes well under a microsecond once the problem was seen.
  void Run(int wf, int af, int act, int64_t e, int64_t t, int64_t n, int64_t k, uint64_t pa,
           uint64_t pb, uint64_t as, uint64_t bs, uint64_t ag, uint64_t bg, uint64_t off,
           uint64_t alpha, uint64_t beta, uint64_t limit, uint64_t out, uint64_t bias,
           uintptr_t stream) {
    MoeGemmArgs a = ArgsOf(wf, af, act, e, t, n, k);
    SetPointers(a, pa, pb, as, bs, ag, bg, off, alpha, beta, limit, out, bias);
    Check(Launch(a, stream));
  }

  // MoeGemm.run's fast path (python/cubist/__init__.py): ReadFastArgs, then Run. False
  // (nothing launched) when ReadFastArgs declines; a failed launch raises as `run`.
  bool FastRun(PyObject* const* v) {
    MoeGemmArgs args;
    uintptr_t stream = 0;
    if (!ReadFastArgs(device_, v, args, stream)) return false;
    Check(Launch(args, stream));
    return true;
  }

  // What an op without a runtime was last asked to launch: (wf, af, act, E, T, N, K,
  // [12 pointers], stream, launches so far), or None before the first launch.
  nb::object LastLaunch() const {
    if (launches_ == 0) return nb::none();
    const MoeGemmArgs& a = last_;
    return LaunchTuple(a, last_stream_, launches_);
  }

  // The runtime's CUDA ordinal, which every tensor of the fast path must be on.
  void SetDevice(int device) { device_ = device; }

  // Benchmark plumbing (python/benchmarks.py): `iterations` back-to-back Run calls from
  // C++ with these arguments, the GIL released; returns the host microseconds per call.
  // What the Python `run` adds is its time per call minus this.
  double RunLoopUs(int wf, int af, int act, int64_t e, int64_t t, int64_t n, int64_t k,
                   uint64_t pa, uint64_t pb, uint64_t as, uint64_t bs, uint64_t ag,
                   uint64_t bg, uint64_t off, uint64_t alpha, uint64_t beta, uint64_t limit,
                   uint64_t out, uint64_t bias, uintptr_t stream, int iterations) {
    MoeGemmArgs a = ArgsOf(wf, af, act, e, t, n, k);
    SetPointers(a, pa, pb, as, bs, ag, bg, off, alpha, beta, limit, out, bias);
    MoeGemm& op = Op();
    absl::Status s;
    std::chrono::steady_clock::duration elapsed{};
    {
      nb::gil_scoped_release release;
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < iterations && s.ok(); ++i) {
        s = op.Run(a, reinterpret_cast<CUstream>(stream));
      }
      elapsed = std::chrono::steady_clock::now() - start;
    }
    Check(std::move(s));
    return std::chrono::duration<double, std::micro>(elapsed).count() / std::max(1, iterations);
  }

  void CanImplement(int wf, int af, int act, int64_t e, int64_t t, int64_t n, int64_t k,
                    uint64_t pa, uint64_t pb, uint64_t as, uint64_t bs, uint64_t ag,
                    uint64_t bg, uint64_t off, uint64_t alpha, uint64_t beta, uint64_t limit,
                    uint64_t out, uint64_t bias) {
    MoeGemmArgs a = ArgsOf(wf, af, act, e, t, n, k);
    SetPointers(a, pa, pb, as, bs, ag, bg, off, alpha, beta, limit, out, bias);
    MoeGemm& op = Op();
    Check(WithoutGil([&] { return op.CanImplement(a); }));  // may fetch and load
  }

  nb::dict KernelFor(int wf, int af, int act, int64_t e, int64_t t, int64_t n, int64_t k) {
    MoeGemm& op = Op();
    return DecisionDict(
        *Check(WithoutGil([&] { return op.KernelFor(ArgsOf(wf, af, act, e, t, n, k)); })));
  }

  nb::dict Tune(int wf, int af, int act, int64_t e, int64_t t, int64_t n, int64_t k,
                int top_k, int warmup, int iterations, bool record) {
    MoeGemmTuneOptions o;
    o.autotune.top_k = top_k;
    o.warmup = warmup;
    o.iterations = iterations;
    o.record = record;
    MoeGemm& op = Op();
    const MoeProblem problem = op.ProblemOf(ArgsOf(wf, af, act, e, t, n, k));
    AutotuneResult result = Check(WithoutGil([&] { return op.Tune(problem, o); }));
    nb::dict out;
    out["winner"] = result.winner->name();
    out["winner_us"] = result.winner_us;
    nb::list timings;
    for (const TimedCandidate& c : result.timings) {
      nb::dict d;
      d["kernel"] = c.kernel->name();
      d["model_rank"] = c.model_rank;
      d["model_us"] = c.model_us;
      if (c.error.ok()) {
        d["measured_us"] = c.measured_us;
      } else {
        d["measured_us"] = nb::none();
        d["error"] = std::string(c.error.message());
      }
      timings.append(d);
    }
    out["timings"] = timings;
    return out;
  }

 private:
  MoeGemm& Op() {
    if (op_ == nullptr) {
      Raise(absl::FailedPreconditionError("this MoeGemm has no runtime (made for tests)"));
    }
    return *op_;
  }

  absl::Status Launch(const MoeGemmArgs& a, uintptr_t stream) {
    if (op_ != nullptr) return op_->Run(a, reinterpret_cast<CUstream>(stream));
    last_ = a;
    last_stream_ = stream;
    ++launches_;
    return absl::OkStatus();
  }

  std::unique_ptr<MoeGemm> op_;
  int64_t device_ = -1;
  MoeGemmArgs last_;  // an op without a runtime: its last launch
  uintptr_t last_stream_ = 0;
  int64_t launches_ = 0;
};

// The routed MoE layer (dispatch/moe_layer.h). Options come once, as keywords checked by
// MoeLayer::Create; Run takes the buffers as integer pointers (python/cubist/__init__.py
// checks the tensors and draws the workspace from torch's caching allocator).
class PyMoeLayer {
 public:
  PyMoeLayer(PyRuntime& rt, const std::string& weights, const std::string& activations,
             const std::string& activation, int64_t num_experts, int64_t top_k,
             int64_t hidden, int64_t intermediate, const std::string& routing,
             int64_t n_group, int64_t topk_group, double routed_scaling_factor,
             bool apply_weight_on_input, const std::string& logits,
             int64_t local_expert_offset, int64_t num_local_experts,
             int64_t max_chunk_tokens, const std::string& finalize, bool pdl,
             const std::string& input_layout, int64_t max_m,
             const std::string& fuse_intermediate_quantization,
             const std::string& nvfp4_gemm_inputs, const std::string& fuse_gather) {
    MoeLayerOptions& o = options_;
    o.weight_format = Check(ParseDataFormat(weights));
    o.activation_format = Check(ParseDataFormat(activations));
    o.activation = Check(ParseActivation(activation));
    o.num_experts = num_experts;
    o.top_k = top_k;
    o.hidden = hidden;
    o.intermediate = intermediate;
    o.routing_method = routing;
    o.n_group = n_group;
    o.topk_group = topk_group;
    o.routed_scaling_factor = static_cast<float>(routed_scaling_factor);
    o.apply_weight_on_input = apply_weight_on_input;
    o.logits_format = logits;
    o.local_expert_offset = local_expert_offset;
    o.num_local_experts = num_local_experts;
    o.max_chunk_tokens = max_chunk_tokens;
    o.finalize = finalize;
    o.programmatic_dependent_launch = pdl;
    o.input_layout = input_layout;
    o.max_m = max_m;
    o.fuse_intermediate_quantization = fuse_intermediate_quantization;
    o.nvfp4_gemm_inputs = nvfp4_gemm_inputs;
    o.fuse_gather = fuse_gather;
    op_ = Check(MoeLayer::Create(rt.get(), o));
  }

  bool FusesIntermediateQuantization() const { return op_->fuses_intermediate_quantization(); }
  bool FusesGather() const { return op_->fuses_gather(); }
  bool DecodesNvfp4Inputs(int64_t tokens) { return op_->DecodesNvfp4Inputs(tokens); }

  size_t WorkspaceSize(int64_t max_tokens) const {
    return Check(MoeLayer::WorkspaceSize(options_, max_tokens));
  }

  // The workspace's arrays (byte offsets) for batches of up to max_tokens tokens.
  nb::dict WorkspaceLayout(int64_t max_tokens) const {
    const MoeLayerWorkspace w = Check(MoeLayer::WorkspaceLayout(options_, max_tokens));
    nb::dict d;
    d["chunk_tokens"] = w.chunk_tokens;
    d["row_capacity"] = w.row_capacity;
    d["topk_ids"] = w.topk_ids;
    d["topk_weights"] = w.topk_weights;
    d["offsets"] = w.offsets;
    d["dropped"] = w.dropped;
    d["expanded_to_permuted"] = w.expanded_to_permuted;
    d["permuted_to_expanded"] = w.permuted_to_expanded;
    d["chunk_counts"] = w.chunk_counts;
    d["gathered"] = w.gathered;
    d["gathered_scale"] = w.gathered_scale;
    d["activated"] = w.activated;
    d["quantized"] = w.quantized;
    d["quantized_scale"] = w.quantized_scale;
    d["global_scales"] = w.global_scales;
    d["rows"] = w.rows;
    d["bytes"] = w.bytes;
    return d;
  }

  // p: hidden_states, router_logits, routing_bias, topk_ids, topk_weights, w1, w2,
  // w1_scale, w2_scale, w1_global_scale, w2_global_scale, input_scale, intermediate_scale,
  // w1_bias, w2_bias, alpha, beta, limit, out, workspace, masked_counts (MoeLayerArgs'
  // order, masked_counts last; 0 for an absent tensor).
  void Run(int64_t tokens, const std::vector<uint64_t>& p, size_t workspace_bytes,
           bool accumulate, uintptr_t stream, int64_t max_tokens) {
    MoeLayerArgs a = ArgsOf(tokens, p, workspace_bytes, accumulate);
    if (max_tokens >= 0) {
      Check(WithoutGil([&] { return op_->CanImplement(a, max_tokens); }));  // may load
      return;
    }
    Check(op_->Run(a, reinterpret_cast<CUstream>(stream)));
  }

 private:
  static MoeLayerArgs ArgsOf(int64_t tokens, const std::vector<uint64_t>& p,
                             size_t workspace_bytes, bool accumulate) {
    if (p.size() != 21) Raise(absl::InvalidArgumentError("moe layer: 21 pointers expected"));
    MoeLayerArgs a;
    a.tokens = tokens;
    a.hidden_states = p[0];
    a.router_logits = p[1];
    a.routing_bias = p[2];
    a.topk_ids = p[3];
    a.topk_weights = p[4];
    a.w1 = p[5];
    a.w2 = p[6];
    a.w1_scale = p[7];
    a.w2_scale = p[8];
    a.w1_global_scale = p[9];
    a.w2_global_scale = p[10];
    a.input_scale = p[11];
    a.intermediate_scale = p[12];
    a.w1_bias = p[13];
    a.w2_bias = p[14];
    a.alpha = p[15];
    a.beta = p[16];
    a.limit = p[17];
    a.out = p[18];
    a.workspace = p[19];
    a.masked_counts = p[20];
    a.workspace_bytes = workspace_bytes;
    a.accumulate = accumulate;
    return a;
  }

  MoeLayerOptions options_;
  std::unique_ptr<MoeLayer> op_;
};

// Sets the Python exception `run` raises for a failed status: the class registered for
// its code (cubist/_errors.py), the message unchanged.
void SetStatusError(const absl::Status& s) {
  const int code = static_cast<int>(s.code());
  nb::object& cls = ErrorClasses()[code >= 0 && code < 17 ? code : 2];
  const std::string msg(s.message());
  PyErr_SetString(cls.is_valid() ? cls.ptr() : PyExc_RuntimeError, msg.c_str());
}

// MoeGemm.run as a C method of the Python class MoeGemm (cubist/__init__.py installs it
// over the Python `run`, which it keeps as `fallback`). CPython calls it with the
// arguments as passed (vectorcall: no Python frame, no keyword dict, no conversion). A
// call of the usual shape (the four tensors positionally, keywords of `run`) goes
// through ReadFastArgs and launches; any other call, and anything the fast path
// declines, is handed as it came to the Python `run`, so the signature, the checks, the
// errors and their wording stay the Python function's.
constexpr int kRunKeywords = 12;  // run's keywords, in ReadFastArgs' order from v[4]
constexpr const char* kRunKeywordNames[kRunKeywords] = {
    "activation", "weights", "activations", "a_scale", "b_scale", "a_global_scale",
    "b_global_scale", "alpha", "beta", "limit", "stream", "bias"};

struct RunMethodState {
  PyObject* names[kRunKeywords] = {};  // interned
  PyObject* identity = nullptr;        // activation's default, "identity"
  PyObject* s_native = nullptr;        // "_native": the MoeGemm's PyMoeGemm
  PyTypeObject* native_type = nullptr;
  PyObject* fallback = nullptr;        // the Python MoeGemm.run
};

RunMethodState& RunState() {
  static auto* s = new RunMethodState();
  return *s;
}

// The slot (0..11) of one of run's keywords, or -1. Keyword names in calls are interned
// strings, so identity finds them; a name built at run time is compared by value.
int KeywordSlot(const RunMethodState& R, PyObject* name) {
  for (int i = 0; i < kRunKeywords; ++i) {
    if (name == R.names[i]) return i;
  }
  if (!PyUnicode_Check(name)) return -1;
  for (int i = 0; i < kRunKeywords; ++i) {
    if (PyUnicode_Compare(name, R.names[i]) == 0) return i;
  }
  return -1;
}

// 1: launched; 0: declined (or not a call of the usual shape); -1: raised.
int TryFastRun(const RunMethodState& R, PyObject* self, PyObject* const* args,
               Py_ssize_t nargs, PyObject* kwnames) {
  if (nargs != 4) return 0;
  PyObject* v[4 + kRunKeywords] = {args[0], args[1], args[2], args[3], R.identity};
  for (int i = 5; i < 4 + kRunKeywords; ++i) v[i] = Py_None;
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : TupleSize(kwnames);
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    const int slot = KeywordSlot(R, TupleItem(kwnames, i));
    if (slot < 0) return 0;
    v[4 + slot] = args[nargs + i];
  }
  PyObject* native = PyObject_GetAttr(self, R.s_native);
  if (native == nullptr) return PyErr_Clear(), 0;
  int r = 0;
  if (Py_TYPE(native) == R.native_type && nb::inst_ready(native)) {
    try {
      r = nb::inst_ptr<PyMoeGemm>(native)->FastRun(v) ? 1 : 0;
    } catch (const StatusError& e) {
      SetStatusError(e.status);
      r = -1;
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
      r = -1;
    }
  }
  Py_DECREF(native);
  return r;
}

PyObject* RunMethod(PyObject* self, PyObject* const* args, Py_ssize_t nargsf,
                    PyObject* kwnames) {
  const RunMethodState& R = RunState();
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  const int r = TryFastRun(R, self, args, nargs, kwnames);
  if (r < 0) return nullptr;
  if (r > 0) Py_RETURN_NONE;
  // The Python `run`, called as self.run(*args, **kwargs) was.
  const Py_ssize_t total = nargs + (kwnames == nullptr ? 0 : TupleSize(kwnames));
  std::vector<PyObject*> stack(static_cast<size_t>(total) + 1);
  stack[0] = self;
  std::copy(args, args + total, stack.begin() + 1);
  return PyObject_Vectorcall(R.fallback, stack.data(), static_cast<size_t>(nargs) + 1,
                             kwnames);
}

int FormatCode(const std::string& name) {
  return static_cast<int>(Check(ParseDataFormat(name)));
}

int ActivationCode(const std::string& name) {
  return static_cast<int>(Check(ParseActivation(name)));
}

}  // namespace
}  // namespace cubist::python

NB_MODULE(_cubist, m) {
  using namespace cubist;
  using namespace cubist::python;
  m.doc() = "cubist's native layer; use the `cubist` package";

  // nanobind reports the instances, types and functions still alive when the interpreter
  // ends. torch keeps what it was given until after that point: a MoeGemm used under
  // torch.compile or in a CUDA graph stays referenced from torch's caches, and with it
  // the Runtime and the bound methods, so every such script ended with ~30 lines of
  // "nanobind: leaked ..." - not a bug in the user's code, and nothing cubist can release
  // first (the objects are torch's to drop). To hunt a real reference leak in the binding,
  // take this line out for the hunt.
  nb::set_leak_warnings(false);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      SetStatusError(e.status);
    }
  });

  m.def("_register_errors", [](std::vector<nb::object> classes) {
    if (classes.size() != 17) throw nb::value_error("17 classes, one per absl::StatusCode");
    for (size_t i = 0; i < 17; ++i) ErrorClasses()[i] = classes[i];
  });
  m.def("format_code", &FormatCode);
  // (torch.Tensor, bfloat16, float8_e4m3fn or None, int32, current-stream function or
  // None, torch.Tensor.__dlpack_c_exchange_api__ or None), once torch is imported
  // (cubist/_tensors.py).
  // A later call replaces them; tensor None switches the fast path off (the CPU tests
  // drive it with stand-ins for torch's objects).
  m.def(
      "_set_torch",
      [](nb::handle tensor, nb::handle bf16, nb::handle fp8, nb::handle i32,
         nb::handle current_stream, nb::handle exchange_api) {
    TorchObjects& T = Torch();
    T.tensor = nullptr;  // the previous objects stay referenced: a few, for the process
    T.api = nullptr;
    if (tensor.is_none()) return;
    if (!PyType_Check(tensor.ptr())) throw nb::type_error("torch.Tensor expected");
    auto keep = [](nb::handle h) { return h.is_none() ? nullptr : h.inc_ref().ptr(); };
    auto name = [](const char* s) { return PyUnicode_InternFromString(s); };
    T.s_dtype = name("dtype");
    T.s_is_cuda = name("is_cuda");
    T.s_shape = name("shape");
    T.s_is_contiguous = name("is_contiguous");
    T.s_data_ptr = name("data_ptr");
    T.s_get_device = name("get_device");
    T.bfloat16 = keep(bf16);
    T.float8_e4m3fn = keep(fp8);
    T.int32 = keep(i32);
    T.current_stream = keep(current_stream);
    T.api = dl::ApiOf(keep(exchange_api));  // the capsule stays referenced with its table
    T.tensor = reinterpret_cast<PyTypeObject*>(keep(tensor));
      },
      nb::arg("tensor").none(), nb::arg("bfloat16").none(), nb::arg("float8_e4m3fn").none(),
      nb::arg("int32").none(), nb::arg("current_stream").none(),
      nb::arg("exchange_api").none() = nb::none());
  // The fast path's switches, for the tests and benchmarks: `exchange` reads tensors
  // through torch's DLPack exchange API when it has one (the default) or through their
  // Python attributes; `cpu_as_device` takes CPU tensors as if on the runtime's device
  // (the CPU tests and microbenchmark, which never launch). None leaves a switch as it is.
  // Returns {"exchange_api": found, "exchange": ..., "cpu_as_device": ...}.
  m.def(
      "_fast_path_config",
      [](nb::object exchange, nb::object cpu_as_device) {
        TorchObjects& T = Torch();
        if (!exchange.is_none()) T.use_api = nb::cast<bool>(exchange);
        if (!cpu_as_device.is_none()) T.cpu_as_device = nb::cast<bool>(cpu_as_device);
        nb::dict d;
        d["exchange_api"] = T.api != nullptr;
        d["exchange"] = T.use_api;
        d["cpu_as_device"] = T.cpu_as_device;
        return d;
      },
      nb::arg("exchange").none() = nb::none(), nb::arg("cpu_as_device").none() = nb::none());
  // MoeGemm.run as a C method descriptor of `cls` (RunMethod): `fallback` is the Python
  // `run` it hands other calls to, `doc` its docstring (with the text signature first).
  m.def("_install_run", [](nb::handle cls, nb::handle fallback, std::string doc) {
    if (!PyType_Check(cls.ptr())) throw nb::type_error("a class");
    RunMethodState& R = RunState();
    R.fallback = fallback.inc_ref().ptr();  // kept for the process, as the method
    // The method's definition must outlive it: one per call, kept for the process.
    auto* def = new PyMethodDef{
        "run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&RunMethod)),
        METH_FASTCALL | METH_KEYWORDS, (new std::string(std::move(doc)))->c_str()};
    PyObject* d = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), def);
    if (d == nullptr) throw nb::python_error();
    return nb::steal(d);
  });
  // ReadFastArgs alone, for the CPU tests: (wf, af, act, E, T, N, K, [12 pointers],
  // stream) as `run` would launch, or None where the fast path declines.
  m.def("_fast_args", [](int64_t device, nb::args v) -> nb::object {
    if (v.size() != 16) throw nb::type_error("run's 16 arguments");
    PyObject* p[16];
    for (size_t i = 0; i < 16; ++i) p[i] = v[i].ptr();
    MoeGemmArgs a;
    uintptr_t stream = 0;
    if (!ReadFastArgs(device, p, a, stream)) return nb::none();
    return LaunchTuple(a, stream);
  });
  m.def("activation_code", &ActivationCode);

  nb::class_<PyRuntime>(m, "Runtime")
      .def("__init__",
           [](PyRuntime* self, std::string manifest, std::string cache_dir, int device,
              bool offline, std::vector<std::string> mirrors, std::vector<std::string> keys,
              std::vector<std::string> key_files, bool allow_expired, bool allow_rollback,
              bool prefetch, bool preload, std::string tuning_file) {
             RuntimeOptions o;
             o.manifest = std::move(manifest);
             o.cache_dir = std::move(cache_dir);
             o.device = device;
             o.offline = offline;
             o.mirrors = std::move(mirrors);
             o.trust = Check(TrustOf(std::move(keys), std::move(key_files), allow_expired,
                                     allow_rollback)
                                 .Policy());
             o.prefetch = prefetch;
             o.preload = preload;
             o.tuning_file = std::move(tuning_file);
             // Open may download the kernels.
             new (self) PyRuntime(Check(WithoutGil([&] { return Runtime::Open(o); })));
           })
      .def_prop_ro("device_name", [](PyRuntime& r) { return r.get().device_name(); })
      .def_prop_ro("sm", [](PyRuntime& r) { return r.get().sm().number(); })
      .def_prop_ro("sm_count", [](PyRuntime& r) { return r.get().device_info().sm_count; })
      .def_prop_ro("driver_version", [](PyRuntime& r) { return r.get().driver_version(); })
      .def_prop_ro("manifest_name", [](PyRuntime& r) { return r.get().manifest().name; })
      .def_prop_ro("manifest_version", [](PyRuntime& r) { return r.get().manifest().version; })
      .def_prop_ro("tuning_path", [](PyRuntime& r) { return r.get().tuning_path(); })
      .def("make_current", [](PyRuntime& r) { Check(r.get().MakeCurrent()); })
      .def("prefetch",
           [](PyRuntime& r) { Check(WithoutGil([&] { return r.get().Prefetch(); })); })
      .def("preload",
           [](PyRuntime& r) { Check(WithoutGil([&] { return r.get().Preload(); })); });

  {
    RunMethodState& R = RunState();
    for (int i = 0; i < kRunKeywords; ++i) {
      R.names[i] = PyUnicode_InternFromString(kRunKeywordNames[i]);
    }
    R.identity = PyUnicode_InternFromString("identity");
    R.s_native = PyUnicode_InternFromString("_native");
  }
  nb::class_<PyMoeGemm> moe_gemm(m, "MoeGemm");
  RunState().native_type = reinterpret_cast<PyTypeObject*>(moe_gemm.ptr());
  moe_gemm.def(nb::init<PyRuntime&, std::string, bool, bool, int64_t, int64_t>(),
               nb::keep_alive<1, 2>())
      .def_static("_without_gpu", [](int64_t device) { return new PyMoeGemm(device); })
      .def("_last_launch", &PyMoeGemm::LastLaunch)
      .def("run", &PyMoeGemm::Run)
      .def(
          "fast_run",
          [](PyMoeGemm& g, nb::handle a, nb::handle b, nb::handle offsets, nb::handle out,
             nb::handle activation, nb::handle weights, nb::handle activations,
             nb::handle a_scale, nb::handle b_scale, nb::handle a_global_scale,
             nb::handle b_global_scale, nb::handle alpha, nb::handle beta, nb::handle limit,
             nb::handle stream, nb::handle bias) {
            PyObject* const v[] = {a.ptr(), b.ptr(), offsets.ptr(), out.ptr(),
                                   activation.ptr(), weights.ptr(), activations.ptr(),
                                   a_scale.ptr(), b_scale.ptr(), a_global_scale.ptr(),
                                   b_global_scale.ptr(), alpha.ptr(), beta.ptr(),
                                   limit.ptr(), stream.ptr(), bias.ptr()};
            return g.FastRun(v);
          },
          // Every argument may be None (nanobind refuses None for nb::handle otherwise).
          nb::arg("a").none(), nb::arg("b").none(), nb::arg("offsets").none(),
          nb::arg("out").none(), nb::arg("activation").none(), nb::arg("weights").none(),
          nb::arg("activations").none(), nb::arg("a_scale").none(),
          nb::arg("b_scale").none(), nb::arg("a_global_scale").none(),
          nb::arg("b_global_scale").none(), nb::arg("alpha").none(), nb::arg("beta").none(),
          nb::arg("limit").none(), nb::arg("stream").none(),
          nb::arg("bias").none() = nb::none())
      .def("set_device", &PyMoeGemm::SetDevice)
      .def("_run_loop_us", &PyMoeGemm::RunLoopUs)
      .def("can_implement", &PyMoeGemm::CanImplement)
      .def("kernel_for", &PyMoeGemm::KernelFor)
      .def("tune", &PyMoeGemm::Tune);

  nb::class_<PyMoeLayer>(m, "MoeLayer")
      .def(nb::init<PyRuntime&, const std::string&, const std::string&, const std::string&,
                    int64_t, int64_t, int64_t, int64_t, const std::string&, int64_t, int64_t,
                    double, bool, const std::string&, int64_t, int64_t, int64_t,
                    const std::string&, bool, const std::string&, int64_t,
                    const std::string&, const std::string&, const std::string&>(),
           nb::keep_alive<1, 2>())
      .def_prop_ro("fuses_intermediate_quantization",
                   &PyMoeLayer::FusesIntermediateQuantization)
      .def_prop_ro("fuses_gather", &PyMoeLayer::FusesGather)
      .def("decodes_nvfp4_inputs", &PyMoeLayer::DecodesNvfp4Inputs)
      .def("workspace_size", &PyMoeLayer::WorkspaceSize)
      .def("workspace_layout", &PyMoeLayer::WorkspaceLayout)
      .def("run", &PyMoeLayer::Run);

  m.def("fetch",
        [](std::string manifest, std::string cache, int jobs, bool offline,
           std::vector<std::string> mirrors, std::vector<std::string> filters, int retries,
           bool no_fsync, std::vector<std::string> keys, std::vector<std::string> key_files,
           bool allow_expired, bool allow_rollback) {
          report::FetchRequest r;
          r.manifest = std::move(manifest);
          r.cache = std::move(cache);
          r.jobs = jobs;
          r.offline = offline;
          r.mirrors = std::move(mirrors);
          r.filters = std::move(filters);
          r.retries = retries;
          r.no_fsync = no_fsync;
          r.trust = TrustOf(std::move(keys), std::move(key_files), allow_expired,
                            allow_rollback);
          return ToTuple(Check(WithoutGil([&] { return report::RunFetchReport(r); })));
        });

  m.def("verify",
        [](std::string manifest, std::string cache, bool deep, bool offline, int threads,
           std::vector<std::string> keys, std::vector<std::string> key_files,
           bool allow_expired, bool allow_rollback) {
          report::VerifyRequest r;
          r.manifest = std::move(manifest);
          r.cache = std::move(cache);
          r.deep = deep;
          r.offline = offline;
          r.threads = threads;
          r.trust = TrustOf(std::move(keys), std::move(key_files), allow_expired,
                            allow_rollback);
          return ToTuple(Check(WithoutGil([&] { return report::RunVerifyReport(r); })));
        });

  m.def("select",
        [](std::string manifest, std::string cache, std::string op, std::string weights,
           std::string activations, std::string activation, int64_t experts, int64_t tokens,
           int64_t tokens_per_expert, int64_t n, int64_t k, std::string sm, int sm_count,
           std::string output_format, std::string kernel, bool explain, bool allow_inexact,
           bool offline, std::vector<std::string> keys, std::vector<std::string> key_files,
           int64_t routed_top_k, int64_t routed_experts) {
          report::ProblemSpec p;
          p.op = std::move(op);
          p.weights = std::move(weights);
          p.activations = std::move(activations);
          p.activation = std::move(activation);
          p.experts = experts;
          p.tokens = tokens;
          p.tokens_per_expert = tokens_per_expert;
          p.n = n;
          p.k = k;
          p.sm = std::move(sm);
          p.sm_count = sm_count;
          p.output_format = std::move(output_format);
          p.routed_top_k = routed_top_k;
          p.routed_experts = routed_experts;
          report::SelectRequest r;
          r.manifest = std::move(manifest);
          r.cache = std::move(cache);
          r.problem = Check(p.ToProblem());
          r.pin = std::move(kernel);
          r.explain = explain;
          r.allow_inexact = allow_inexact;
          r.offline = offline;
          r.trust = TrustOf(std::move(keys), std::move(key_files), false, false);
          std::unique_ptr<report::Selection> s =
              Check(WithoutGil([&] { return report::Select(r); }));
          return ToTuple(report::SelectReport(*s, explain));
        });
}

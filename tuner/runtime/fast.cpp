// gemm-tune's call path in C++ for torch callers (tuner/runtime/fast.py builds and loads it).
//
// A Table maps a call's key -- what lib.gemm reads off its torch tensors (type, shape,
// strides, 16-byte alignment, device of A, B, C and the bias), the current stream, torch's
// TF32 flag and the caller's context word -- to the plan the Python path made for that
// key, in one of two forms:
//   - torch: cuBLAS as torch calls it: for a plain product (no bias, no activation, C of
//     the inputs' type) cuBLAS itself on torch's handle (cublasSgemm / cublasGemmEx, the
//     calls at::cuda::blas::gemm makes, with the handle's stream, workspace and math
//     mode as torch sets them), else through ATen (at::mm, at::addmm) as the Python path
//     calls it;
//   - launches: the kernel launches the plan's runner made, recorded once with stand-in
//     pointers and scalars (tuner/runtime/fast.py) and replayed here with the call's own:
//     each launch's parameter block with the slots to patch (A, B, C and the bias's
//     pointers plus an offset, alpha and beta), and its TMA tensor maps, encoded per call
//     from the recorded arguments with the call's pointers.
// Two entry points: call (lib.gemm: A, B, C, the bias, alpha, beta) and linear
// (act(x W^T + b) for x of any leading dimensions that fold into rows, W as nn.Linear
// keeps it: a patched layer's forward and torch_ops.linear), each with keys of its own.
// A call whose key is not in the table returns None, and the Python path serves it (and
// adds its plan here when the plan may be replayed). Nothing in a hit path calls Python.

#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <ATen/autocast_mode.h>
#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <limits>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

enum Source : int { kA = 0, kB = 1, kC = 2, kBias = 3, kAlpha = 4, kBeta = 5, kFixed = -1 };

struct Patch {
  uint32_t offset;  // bytes into the parameter block
  int source;       // kA..kBias: a pointer (8 bytes) plus `add`; kAlpha, kBeta: a float
  int64_t add;
};

struct MapSpec {  // cuTensorMapEncodeTiled's arguments; the address from `source` + `add`
  int source;
  int64_t add;
  CUtensorMapDataType dtype;
  cuuint32_t rank;
  std::array<cuuint64_t, 5> dims{};
  std::array<cuuint64_t, 5> strides{};
  std::array<cuuint32_t, 5> box{};
  std::array<cuuint32_t, 5> element_strides{};
  CUtensorMapInterleave interleave;
  CUtensorMapSwizzle swizzle;
  CUtensorMapL2promotion l2;
  CUtensorMapFloatOOBfill oob;
};

struct Launch {
  CUfunction f;
  std::array<unsigned, 3> grid, block, cluster;
  unsigned smem;
  bool dependent = false;  // programmatic stream serialization (the kernel waits first)
  std::string name;
  std::vector<uint8_t> params;  // 8-byte slots, after the tensor maps
  std::vector<Patch> patches;
  std::vector<MapSpec> maps;
};

struct Entry {
  bool torch = false;  // cuBLAS through ATen
  int act = 0;         // through ATen, after it: 0 none, 1 relu, 2 gelu, 3 gelu_tanh, 4 silu
  std::vector<Launch> launches;
  at::ScalarType out = at::kFloat;
  std::vector<int64_t> out_shape;
  int device = 0;
  CUcontext ctx = nullptr;
};

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& v) const noexcept {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t x : v) {
      h ^= static_cast<uint64_t>(x);
      h *= 1099511628211ULL;
    }
    return static_cast<size_t>(h);
  }
};

constexpr int kMaxMaps = 4;

// Products this process handed cuBLAS from here itself (fast.blas_calls()), every table's.
std::atomic<uint64_t> blas_calls{0};

// cuBLAS, called as at::cuda::blas::gemm calls it, found at run time among the libraries
// torch has loaded (no cuBLAS headers or link-time dependency: where a symbol is missing,
// or torch prefers cuBLASLt or a reduced-precision setting other than its default is on,
// the product goes through ATen instead).
struct Blas {
  using Handle = void*;
  using GetHandle = Handle (*)();
  using SetMath = int (*)(Handle, int);
  using Sgemm = int (*)(Handle, int, int, int, int, int, const float*, const float*, int,
                        const float*, int, const float*, float*, int);
  using GemmEx = int (*)(Handle, int, int, int, int, int, const void*, const void*, int,
                         int, const void*, int, int, const void*, void*, int, int, int, int);
  using GetTuning = const void* (*)();
  using TuningOn = bool (*)(const void*);  // TuningContext::IsTunableOpEnabled() const
  GetHandle handle = nullptr;
  SetMath set_math = nullptr;
  Sgemm sgemm = nullptr;
  GemmEx gemm_ex = nullptr;
  GetTuning tuning = nullptr;
  TuningOn tuning_on = nullptr;

  static void* find(const char* name, std::initializer_list<const char*> libs) {
    if (void* f = dlsym(RTLD_DEFAULT, name)) return f;
    for (const char* lib : libs)
      if (void* h = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD))
        if (void* f = dlsym(h, name)) return f;
    return nullptr;
  }

  static const Blas& get() {
    static const Blas blas = [] {
      Blas b;
      const auto cublas = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
      b.handle = reinterpret_cast<GetHandle>(
          find("_ZN2at4cuda24getCurrentCUDABlasHandleEv", {"libtorch_cuda.so"}));
      b.set_math = reinterpret_cast<SetMath>(find("cublasSetMathMode", cublas));
      b.sgemm = reinterpret_cast<Sgemm>(find("cublasSgemm_v2", cublas));
      b.gemm_ex = reinterpret_cast<GemmEx>(find("cublasGemmEx", cublas));
      b.tuning = reinterpret_cast<GetTuning>(
          find("_ZN2at4cuda7tunable16getTuningContextEv", {"libtorch_cuda.so"}));
      b.tuning_on = reinterpret_cast<TuningOn>(find(
          "_ZNK2at4cuda7tunable13TuningContext18IsTunableOpEnabledEv", {"libtorch_cuda.so"}));
      return b;
    }();
    return blas;
  }

  // What as_torch() and blas_call weigh, by name (fast.blas_report(): why the C++ path
  // calls cuBLAS itself, or goes through ATen)
  py::dict report() const {
    py::dict d;
    d["symbols"] = handle && set_math && sgemm && gemm_ex && tuning && tuning_on;
    py::list missing;
    const std::pair<const char*, const void*> found[] = {
        {"getCurrentCUDABlasHandle", reinterpret_cast<const void*>(handle)},
        {"cublasSetMathMode", reinterpret_cast<const void*>(set_math)},
        {"cublasSgemm_v2", reinterpret_cast<const void*>(sgemm)},
        {"cublasGemmEx", reinterpret_cast<const void*>(gemm_ex)},
        {"getTuningContext", reinterpret_cast<const void*>(tuning)},
        {"IsTunableOpEnabled", reinterpret_cast<const void*>(tuning_on)}};
    for (const auto& [name, f] : found)
      if (!f) missing.append(name);
    d["missing"] = missing;
    at::Context& ctx = at::globalContext();
    d["prefers_cublas"] = ctx.blasPreferredBackend() == at::BlasBackend::Cublas;
    d["deterministic"] = ctx.deterministicAlgorithms();
    d["tunable_op"] = tuning && tuning_on ? tuning_on(tuning()) : false;
    d["fp16_reduction_default"] = ctx.allowFP16ReductionCuBLAS() ==
                                  at::CuBLASReductionOption::AllowReducedPrecisionWithSplitK;
    d["bf16_reduction_default"] = ctx.allowBF16ReductionCuBLAS() ==
                                  at::CuBLASReductionOption::AllowReducedPrecisionWithSplitK;
    return d;
  }

  // torch would call cuBLAS itself now: every symbol found, cuBLAS (not cuBLASLt)
  // preferred, TunableOp off, no deterministic-algorithms check to make
  bool as_torch() const {
    if (!handle || !set_math || !sgemm || !gemm_ex || !tuning || !tuning_on) return false;
    at::Context& ctx = at::globalContext();
    return ctx.blasPreferredBackend() == at::BlasBackend::Cublas &&
           !ctx.deterministicAlgorithms() && !tuning_on(tuning());
  }
};

// cuBLAS's enums (cublas_api.h, library_types.h)
constexpr int kOpN = 0, kOpT = 1, kDefaultMath = 0, kGemmDefaultTensorOp = 99;
constexpr int kR32F = 0, kR16F = 2, kR16BF = 14;  // kR32F is also torch's compute type

// A 2-D operand as cuBLAS sees it: (op, leading dimension) of its column-major transpose,
// the way torch reads strides (a dimension of one takes any stride); false where it is
// neither row- nor column-major with a unit stride.
bool blas_view(const at::Tensor& t, int& op, int64_t& ld) {
  const int64_t r = t.size(0), c = t.size(1), s0 = t.stride(0), s1 = t.stride(1);
  if (s1 == 1 && (r == 1 || s0 >= std::max<int64_t>(c, 1))) {
    op = kOpN;
    ld = r == 1 ? std::max<int64_t>(c, 1) : s0;
    return true;
  }
  if (s0 == 1 && (c == 1 || s1 >= std::max<int64_t>(r, 1))) {
    op = kOpT;
    ld = c == 1 ? std::max<int64_t>(r, 1) : s1;
    return true;
  }
  return false;
}

void features(std::vector<int64_t>& key, const at::Tensor& t) {
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  const int64_t d = t.dim();
  key.push_back(d);
  for (int64_t i = 0; i < d; ++i) {
    key.push_back(t.size(i));
    key.push_back(t.stride(i));
  }
  key.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) & 15));
  key.push_back(t.get_device());
}

std::string error_name(CUresult r) {
  const char* s = nullptr;
  cuGetErrorName(r, &s);
  return s ? s : std::to_string(static_cast<int>(r));
}

class Table {
 public:
  // `types`: the Python types served (torch.Tensor and nn.Parameter: a subclass, such as
  // a fake or distributed tensor, takes the Python path)
  explicit Table(py::tuple types) {
    for (auto t : types) types_.push_back(t.ptr());
  }

  bool plain(py::handle h) const {
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(h.ptr()));
    for (PyObject* t : types_)
      if (t == type) return true;
    return false;
  }

  // Would autograd record a call on these tensors? (Python then runs torch's own ops.)
  static bool records_grad(const at::Tensor& a, const at::Tensor& b, const at::Tensor* c,
                           const at::Tensor* bias) {
    return at::GradMode::is_enabled() &&
           (a.requires_grad() || b.requires_grad() || (c && c->requires_grad()) ||
            (bias && bias->requires_grad()));
  }

  // The key of a call on these tensors; false where the call is not one the table serves.
  bool key_of(std::vector<int64_t>& key, const at::Tensor& a, const at::Tensor& b,
              const at::Tensor* c, const at::Tensor* bias, int64_t ctx) const {
    if (!a.is_cuda()) return false;
    const int dev = a.get_device();
    key.clear();
    key.push_back(ctx);
    key.push_back(at::globalContext().allowTF32CuBLAS());
    key.push_back(reinterpret_cast<int64_t>(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(dev)).stream()));
    features(key, a);
    features(key, b);
    if (c) features(key, *c); else key.push_back(-1);
    if (bias) features(key, *bias); else key.push_back(-1);
    return true;
  }

  // The key of a linear call, false where the table cannot serve it: autograd would record
  // it, autocast or a dispatch mode is on, x and W differ in type, or x's leading
  // dimensions do not fold into rows without a copy.
  bool linear_key(std::vector<int64_t>& key, const at::Tensor& x, const at::Tensor& w,
                  const at::Tensor* bias, int64_t ctx) const {
    if (!x.is_cuda() || x.dim() < 2 || w.dim() != 2 || x.scalar_type() != w.scalar_type())
      return false;
    if (records_grad(x, w, nullptr, bias)) return false;
    if (at::autocast::is_autocast_enabled(at::kCUDA) ||
        c10::impl::TorchDispatchModeTLS::stack_len() > 0)
      return false;
    for (int64_t i = x.dim() - 2; i > 0; --i)  // x.view(-1, K) is possible
      if (x.size(i - 1) != 1 && x.stride(i - 1) != x.stride(i) * x.size(i)) return false;
    return key_of(key, x, w, nullptr, bias, ctx);
  }

  // act(x W^T + bias) for a known key, or None.
  py::object linear(py::handle X, py::handle W, py::handle bias, int64_t ctx) {
    if (!plain(X) || !plain(W) || (!bias.is_none() && !plain(bias))) return py::none();
    const at::Tensor& x = THPVariable_Unpack(X.ptr());
    const at::Tensor& w = THPVariable_Unpack(W.ptr());
    const at::Tensor* bs = bias.is_none() ? nullptr : &THPVariable_Unpack(bias.ptr());
    thread_local std::vector<int64_t> key;
    if (!linear_key(key, x, w, bs, ctx)) return py::none();
    std::shared_ptr<const Entry> e = find(key);
    if (!e) return py::none();
    at::Tensor out;
    if (e->torch) {
      const at::Tensor x2 = x.dim() == 2 ? x : x.view({-1, x.size(-1)});
      const at::Tensor wt = w.t();
      if (!bs) {
        // no bias: the product at::linear comes to through matmul (x's rows folded, as
        // here) and mm: cuBLAS itself on torch's handle where torch would call it, else
        // at::mm (a few microseconds of the host's less either way); then the activation
        if (x.get_device() != c10::cuda::current_device() ||
            !blas_call(x2, wt, nullptr, 1.0, 0.0, out))
          out = at::mm(x2, wt);
        out = activation(rows_to(out, x), e->act);
      } else if (bs && (e->act == 1 || e->act == 3)) {
        // ReLU or GELU(tanh) with the bias in cuBLASLt's epilogue: one call, as
        // tuner.runtime.call.torch_linear makes it (LT_ACTIVATIONS)
        out = rows_to(at::_addmm_activation(*bs, x2, wt, 1, 1, e->act == 3), x);
      } else if (bs && bs->dim() == 1 && bs->scalar_type() == x.scalar_type() &&
                 (x.dim() == 2 || x.is_contiguous())) {
        // the bias in at::addmm, as at::linear itself calls it for such an x, one dispatch
        // of the host's fewer
        out = activation(rows_to(at::addmm(*bs, x2, wt), x), e->act);
      } else {
        out = at::linear(x, w, bs ? c10::optional<at::Tensor>(*bs) : c10::nullopt);
        out = activation(out, e->act);
      }
    } else if (!launch(*e, x, w, nullptr, bs, 1.0, 0.0, out)) {
      misses_.fetch_add(1, std::memory_order_relaxed);
      return py::none();
    }
    hits_.fetch_add(1, std::memory_order_relaxed);
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(out)));
  }

  // C = act(alpha A B + beta C + bias) for a known key, or None.
  py::object call(py::handle A, py::handle B, py::handle C, py::handle bias, double alpha,
                  double beta, int64_t ctx) {
    if (!plain(A) || !plain(B) || (!C.is_none() && !plain(C)) ||
        (!bias.is_none() && !plain(bias)))
      return py::none();
    const at::Tensor& a = THPVariable_Unpack(A.ptr());
    const at::Tensor& b = THPVariable_Unpack(B.ptr());
    const at::Tensor* c = C.is_none() ? nullptr : &THPVariable_Unpack(C.ptr());
    const at::Tensor* bs = bias.is_none() ? nullptr : &THPVariable_Unpack(bias.ptr());
    if (!c && beta != 0.0) return py::none();  // the Python path says why
    if (records_grad(a, b, c, bs)) return py::none();  // torch's own ops: a gradient
    thread_local std::vector<int64_t> key;
    if (!key_of(key, a, b, c, bs, ctx)) return py::none();
    std::shared_ptr<const Entry> e = find(key);
    if (!e) return py::none();
    at::Tensor out;
    if (e->torch) {
      if (!torch_call(*e, a, b, c, bs, alpha, beta, out)) {
        misses_.fetch_add(1, std::memory_order_relaxed);
        return py::none();
      }
    } else if (!launch(*e, a, b, c, bs, alpha, beta, out)) {
      misses_.fetch_add(1, std::memory_order_relaxed);
      return py::none();
    }
    hits_.fetch_add(1, std::memory_order_relaxed);
    if (c) return py::reinterpret_borrow<py::object>(C);
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(out)));
  }

  // Add the plan of the call on these tensors (the Python path's): cuBLAS through ATen
  // (`launches` empty; then `act`), or its recorded launches. out_type: 0 float32,
  // 1 float16, 2 bfloat16 (a C the call allocates, of `out_shape`). `linear`: the key is
  // linear's, of (x, W, bias) in A, B and the bias (C None).
  void add(py::handle A, py::handle B, py::handle C, py::handle bias, int64_t ctx,
           bool torch, int out_type, std::vector<int64_t> out_shape, py::list launches,
           int act, bool linear) {
    const at::Tensor& a = THPVariable_Unpack(A.ptr());
    const at::Tensor& b = THPVariable_Unpack(B.ptr());
    const at::Tensor* c = C.is_none() ? nullptr : &THPVariable_Unpack(C.ptr());
    const at::Tensor* bs = bias.is_none() ? nullptr : &THPVariable_Unpack(bias.ptr());
    std::vector<int64_t> key;
    if (linear ? !linear_key(key, a, b, bs, ctx) : !key_of(key, a, b, c, bs, ctx))
      throw std::invalid_argument("not a call this table serves");
    auto e = std::make_shared<Entry>();
    e->torch = torch;
    e->act = act;
    e->out = out_type == 1 ? at::kHalf : out_type == 2 ? at::kBFloat16 : at::kFloat;
    e->out_shape = std::move(out_shape);
    e->device = a.get_device();
    if (!torch) {
      CUdevice dev;
      CUresult r = cuDeviceGet(&dev, e->device);
      if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&e->ctx, dev);
      if (r != CUDA_SUCCESS)
        throw std::runtime_error("cuDevicePrimaryCtxRetain failed: " + error_name(r));
      for (auto item : launches) e->launches.push_back(launch_of(item.cast<py::tuple>()));
      if (e->launches.empty()) throw std::invalid_argument("a plan of no launches");
    }
    std::unique_lock lock(mu_);
    table_[std::move(key)] = std::move(e);
  }

  void clear() {
    std::unique_lock lock(mu_);
    table_.clear();
  }

  py::dict stats() const {
    std::shared_lock lock(mu_);
    py::dict d;
    d["entries"] = table_.size();
    d["hits"] = hits_.load();
    d["misses"] = misses_.load();
    return d;
  }

 private:
  std::shared_ptr<const Entry> find(const std::vector<int64_t>& key) const {
    std::shared_lock lock(mu_);
    auto it = table_.find(key);
    return it == table_.end() ? nullptr : it->second;
  }

  // x's rows as one matrix (x.view(-1, K)); false where that needs a copy
  static bool rows_of(const at::Tensor& x, at::Tensor& rows) {
    try {
      rows = x.view({-1, x.size(-1)});
      return true;
    } catch (const c10::Error&) {
      return false;
    }
  }

  // y, a product of x's rows folded into one matrix, with x's leading dimensions again
  static at::Tensor rows_to(const at::Tensor& y, const at::Tensor& x) {
    if (x.dim() == 2) return y;
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = y.size(1);
    return y.view(shape);
  }

  static at::Tensor activation(const at::Tensor& y, int act) {
    switch (act) {
      case 1: return at::relu(y);
      case 2: return at::gelu(y, "none");
      case 3: return at::gelu(y, "tanh");
      case 4: return at::silu(y);
      default: return y;
    }
  }

  // Entry e's launches on these operands (C allocated where none is given); false where
  // they cannot run here (another device current, no context).
  static bool launch(const Entry& e, const at::Tensor& a, const at::Tensor& b,
                     const at::Tensor* c, const at::Tensor* bias, double alpha, double beta,
                     at::Tensor& out) {
    if (c10::cuda::current_device() != e.device) return false;
    out = c ? *c : at::empty(e.out_shape, a.options().dtype(e.out));
    uint64_t ptrs[4] = {reinterpret_cast<uint64_t>(a.data_ptr()),
                        reinterpret_cast<uint64_t>(b.data_ptr()),
                        reinterpret_cast<uint64_t>(out.data_ptr()),
                        bias ? reinterpret_cast<uint64_t>(bias->data_ptr()) : 0};
    return replay(e, ptrs, static_cast<float>(alpha), static_cast<float>(beta),
                  c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(e.device))
                      .stream());
  }

  // C = alpha A B + beta C by cuBLAS itself on torch's handle, as at::mm / at::addmm
  // would run it (module doc): 2-D, no bias, C of the inputs' type; false where it cannot
  // (the caller goes through ATen then).
  static bool blas_call(const at::Tensor& a, const at::Tensor& b, const at::Tensor* c,
                        double alpha, double beta, at::Tensor& out) {
    const Blas& blas = Blas::get();
    const at::ScalarType dt = a.scalar_type();
    if (b.scalar_type() != dt || (c && c->scalar_type() != dt) || !blas.as_torch()) return false;
    at::Context& ctx = at::globalContext();
    if ((dt == at::kHalf && ctx.allowFP16ReductionCuBLAS() !=
                                at::CuBLASReductionOption::AllowReducedPrecisionWithSplitK) ||
        (dt == at::kBFloat16 && ctx.allowBF16ReductionCuBLAS() !=
                                    at::CuBLASReductionOption::AllowReducedPrecisionWithSplitK) ||
        (dt != at::kFloat && dt != at::kHalf && dt != at::kBFloat16))
      return false;
    const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
    if (m < 1 || n < 1 || k < 1) return false;
    int opa, opb;
    int64_t lda, ldb;
    if (!blas_view(a, opa, lda) || !blas_view(b, opb, ldb)) return false;
    if (c && (c->dim() != 2 || c->stride(1) != 1 || (m > 1 && c->stride(0) < n))) return false;
    const int64_t ldc = c && m > 1 ? c->stride(0) : n;
    constexpr int64_t kInt = std::numeric_limits<int>::max();
    if (std::max({m, n, k, lda, ldb, ldc}) > kInt) return false;
    out = c ? *c : at::empty({m, n}, a.options());
    void* h = blas.handle();  // torch's handle on the current stream, its math mode set
    // C^T = B^T A^T in cuBLAS's column-major terms
    int status;
    if (dt == at::kFloat) {
      const float fa = static_cast<float>(alpha), fb = c ? static_cast<float>(beta) : 0.0f;
      status = blas.sgemm(h, opb, opa, n, m, k, &fa, b.const_data_ptr<float>(), ldb,
                          a.const_data_ptr<float>(), lda, &fb, out.mutable_data_ptr<float>(),
                          ldc);
    } else {
      const float fa = static_cast<float>(alpha), fb = c ? static_cast<float>(beta) : 0.0f;
      const int type = dt == at::kHalf ? kR16F : kR16BF;
      blas.set_math(h, kDefaultMath);
      status = blas.gemm_ex(h, opb, opa, n, m, k, &fa, b.const_data_ptr(), type, ldb,
                            a.const_data_ptr(), type, lda, &fb, out.mutable_data_ptr(), type,
                            ldc, kR32F, kGemmDefaultTensorOp);
      blas.set_math(h, kDefaultMath);
    }
    if (status != 0)
      throw std::runtime_error("cuBLAS failed with status " + std::to_string(status));
    blas_calls.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  // A 2-D operand (or a batch of 1) over the whole batch, as torch.bmm takes it: no copy.
  static at::Tensor batched(const at::Tensor& x, int64_t batch) {
    if (x.dim() == 3 && x.size(0) == batch) return x;
    return (x.dim() == 3 ? x : x.unsqueeze(0)).expand({batch, -1, -1});
  }

  // A batch (an operand 3-D) by torch.bmm / torch.baddbmm as _torch_fallback calls them,
  // with no bias (offer() leaves a batch with one to the Python path); a C the call
  // allocates is of the plan's shape (e.out_shape).
  static void torch_batch(const Entry& e, const at::Tensor& a, const at::Tensor& b,
                          const at::Tensor* c, double alpha, double beta, at::Tensor& out) {
    int64_t batch = 1;
    for (const at::Tensor* t : {&a, &b, c})
      if (t && t->dim() == 3) batch = std::max(batch, t->size(0));
    const at::Tensor a3 = batched(a, batch), b3 = batched(b, batch);
    if (!c && alpha == 1.0) {  // as torch.matmul: the product allocates C
      out = at::bmm(a3, b3);
      return;
    }
    out = c ? *c : at::empty(e.out_shape, a.options());
    at::Tensor c3 = out.dim() == 3 ? out : out.unsqueeze(0);
    if (alpha == 1.0 && beta == 0.0) at::bmm_out(c3, a3, b3);
    else at::baddbmm_out(c3, c3, a3, b3, c ? beta : 0.0, alpha);
  }

  // cuBLAS as tuner.runtime.call._torch_fallback calls it, with no activation; false
  // where this call needs another form (the Python path).
  static bool torch_call(const Entry& e, const at::Tensor& a, const at::Tensor& b,
                         const at::Tensor* c, const at::Tensor* bias, double alpha,
                         double beta, at::Tensor& out) {
    if (a.dim() >= 3 && b.dim() == 2 && (!c || c->dim() == a.dim())) {
      // x @ W: x's rows as one matrix where they fold without a copy, as call._rows does
      at::Tensor a2, c2, out2;
      if (rows_of(a, a2) && (!c || rows_of(*c, c2))) {
        if (!torch_call(e, a2, b, c ? &c2 : nullptr, bias, alpha, beta, out2)) return false;
        out = c ? *c : rows_to(out2, a);
        return true;
      }
    }
    if (a.dim() != 2 || b.dim() != 2 || (c && c->dim() != 2)) {
      if (bias) return false;
      torch_batch(e, a, b, c, alpha, beta, out);
      return true;
    }
    if (!bias && (c || alpha == 1.0) && a.get_device() == c10::cuda::current_device() &&
        blas_call(a, b, c, alpha, beta, out))
      return true;
    if (!c) {
      if (alpha == 1.0 && !bias) out = at::mm(a, b);
      else if (bias && bias->scalar_type() == a.scalar_type())
        out = at::addmm(*bias, a, b, 1.0, alpha);
      else if (!bias) {  // as _torch_fallback: C of the plan's shape, then addmm into it
        out = at::empty(e.out_shape, a.options());
        at::addmm_out(out, out, a, b, 0.0, alpha);
      } else return false;
      return true;
    }
    at::Tensor& cc = const_cast<at::Tensor&>(*c);
    if (alpha == 1.0 && beta == 0.0 && !bias) at::mm_out(cc, a, b);
    else if (bias && beta == 0.0 && bias->scalar_type() == c->scalar_type())
      at::addmm_out(cc, *bias, a, b, 1.0, alpha);
    else if (!bias) at::addmm_out(cc, cc, a, b, beta, alpha);
    else return false;
    return true;
  }

  // The recorded launches with this call's pointers and scalars; false (nothing launched)
  // where the context cannot be made current.
  static bool replay(const Entry& e, const uint64_t ptrs[4], float alpha, float beta,
                     cudaStream_t stream) {
    CUcontext cur = nullptr;
    if (cuCtxGetCurrent(&cur) != CUDA_SUCCESS) return false;
    if (cur != e.ctx && cuCtxSetCurrent(e.ctx) != CUDA_SUCCESS) return false;
    thread_local std::vector<uint8_t> buf;
    thread_local std::vector<void*> args;
    thread_local std::array<CUtensorMap, kMaxMaps> maps;
    for (const Launch& l : e.launches) {
      buf.assign(l.params.begin(), l.params.end());
      for (const Patch& p : l.patches) {
        if (p.source <= kBias) {
          const uint64_t v = ptrs[p.source] + static_cast<uint64_t>(p.add);
          std::memcpy(buf.data() + p.offset, &v, 8);
        } else {
          const float v = p.source == kAlpha ? alpha : beta;
          std::memcpy(buf.data() + p.offset, &v, 4);
        }
      }
      args.clear();
      for (size_t i = 0; i < l.maps.size(); ++i) {
        const MapSpec& m = l.maps[i];
        void* base = reinterpret_cast<void*>(
            (m.source == kFixed ? 0 : ptrs[m.source]) + static_cast<uint64_t>(m.add));
        CUresult r = cuTensorMapEncodeTiled(
            &maps[i], m.dtype, m.rank, base, m.dims.data(), m.strides.data(), m.box.data(),
            m.element_strides.data(), m.interleave, m.swizzle, m.l2, m.oob);
        if (r != CUDA_SUCCESS)
          throw std::runtime_error("cuTensorMapEncodeTiled(" + l.name + ") failed: " +
                                   error_name(r));
        args.push_back(&maps[i]);
      }
      for (size_t off = 0; off < buf.size(); off += 8) args.push_back(buf.data() + off);
      CUresult r;
      const bool clustered = l.cluster[0] * l.cluster[1] * l.cluster[2] > 1;
      if (clustered || l.dependent) {
        CUlaunchAttribute attrs[2]{};
        unsigned n = 0;
        if (clustered) {
          attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
          attrs[n].value.clusterDim.x = l.cluster[0];
          attrs[n].value.clusterDim.y = l.cluster[1];
          attrs[n++].value.clusterDim.z = l.cluster[2];
        }
        if (l.dependent) {
          attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
          attrs[n++].value.programmaticStreamSerializationAllowed = 1;
        }
        CUlaunchConfig cfg{};
        cfg.gridDimX = l.grid[0]; cfg.gridDimY = l.grid[1]; cfg.gridDimZ = l.grid[2];
        cfg.blockDimX = l.block[0]; cfg.blockDimY = l.block[1]; cfg.blockDimZ = l.block[2];
        cfg.sharedMemBytes = l.smem;
        cfg.hStream = reinterpret_cast<CUstream>(stream);
        cfg.attrs = attrs;
        cfg.numAttrs = n;
        r = cuLaunchKernelEx(&cfg, l.f, args.data(), nullptr);
      } else {
        r = cuLaunchKernel(l.f, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1],
                           l.block[2], l.smem, reinterpret_cast<CUstream>(stream),
                           args.data(), nullptr);
      }
      if (r != CUDA_SUCCESS)
        throw std::runtime_error("cuLaunchKernel(" + l.name + ") failed: " + error_name(r));
    }
    return true;
  }

  // (f, name, grid, block, cluster, smem, params, patches, maps[, dependent]) from
  // tuner.runtime.fast
  static Launch launch_of(py::tuple t) {
    Launch l;
    l.f = reinterpret_cast<CUfunction>(t[0].cast<uintptr_t>());
    l.name = t[1].cast<std::string>();
    l.grid = t[2].cast<std::array<unsigned, 3>>();
    l.block = t[3].cast<std::array<unsigned, 3>>();
    l.cluster = t[4].cast<std::array<unsigned, 3>>();
    l.smem = t[5].cast<unsigned>();
    l.dependent = t.size() > 9 && t[9].cast<bool>();
    std::string params = t[6].cast<std::string>();
    if (params.size() % 8) throw std::invalid_argument("parameters of 8-byte slots");
    l.params.assign(params.begin(), params.end());
    for (auto p : t[7].cast<py::list>()) {
      auto q = p.cast<std::tuple<uint32_t, int, int64_t>>();
      Patch patch{std::get<0>(q), std::get<1>(q), std::get<2>(q)};
      const uint32_t width = patch.source <= kBias ? 8 : 4;
      if (patch.source < kA || patch.source > kBeta || patch.offset + width > l.params.size())
        throw std::invalid_argument("a patch outside the parameter block");
      l.patches.push_back(patch);
    }
    for (auto m : t[8].cast<py::list>()) {
      py::tuple a = m.cast<py::tuple>();
      MapSpec s{};
      s.source = a[0].cast<int>();
      s.add = a[1].cast<int64_t>();
      s.dtype = static_cast<CUtensorMapDataType>(a[2].cast<int>());
      s.rank = a[3].cast<cuuint32_t>();
      auto fill = [](auto& dst, py::handle src) {
        size_t i = 0;
        for (auto v : src) dst.at(i++) = v.cast<typename std::decay_t<decltype(dst)>::value_type>();
      };
      fill(s.dims, a[4]);
      fill(s.strides, a[5]);
      fill(s.box, a[6]);
      fill(s.element_strides, a[7]);
      s.interleave = static_cast<CUtensorMapInterleave>(a[8].cast<int>());
      s.swizzle = static_cast<CUtensorMapSwizzle>(a[9].cast<int>());
      s.l2 = static_cast<CUtensorMapL2promotion>(a[10].cast<int>());
      s.oob = static_cast<CUtensorMapFloatOOBfill>(a[11].cast<int>());
      l.maps.push_back(s);
    }
    if (l.maps.size() > kMaxMaps) throw std::invalid_argument("too many tensor maps");
    return l;
  }

  std::vector<PyObject*> types_;
  mutable std::shared_mutex mu_;
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<const Entry>, KeyHash> table_;
  std::atomic<uint64_t> hits_{0}, misses_{0};
};

// The hot entry points as METH_FASTCALL builtins bound to a table: a pybind11 method's
// argument dispatch costs more than everything else a served call does on the host but
// the launch. Each holds the table by a shared_ptr in a capsule.
constexpr const char* kCapsule = "gemm_tune_fast.Table";

Table& table_of(PyObject* capsule) {
  return **static_cast<std::shared_ptr<Table>*>(PyCapsule_GetPointer(capsule, kCapsule));
}

template <typename F>
PyObject* guarded(F&& f) {
  try {
    return f().release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

// call(A, B, C, bias, alpha, beta, ctx)
PyObject* fast_call(PyObject* capsule, PyObject* const* args, Py_ssize_t n) {
  if (n != 7) {
    PyErr_SetString(PyExc_TypeError, "call(A, B, C, bias, alpha, beta, ctx)");
    return nullptr;
  }
  const double alpha = PyFloat_AsDouble(args[4]), beta = PyFloat_AsDouble(args[5]);
  const long long ctx = PyLong_AsLongLong(args[6]);
  if (PyErr_Occurred()) return nullptr;
  return guarded([&] {
    return table_of(capsule).call(args[0], args[1], args[2], args[3], alpha, beta, ctx);
  });
}

// linear(x, W, bias, ctx)
PyObject* fast_linear(PyObject* capsule, PyObject* const* args, Py_ssize_t n) {
  if (n != 4) {
    PyErr_SetString(PyExc_TypeError, "linear(x, W, bias, ctx)");
    return nullptr;
  }
  const long long ctx = PyLong_AsLongLong(args[3]);
  if (PyErr_Occurred()) return nullptr;
  return guarded([&] { return table_of(capsule).linear(args[0], args[1], args[2], ctx); });
}

PyMethodDef kCall = {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fast_call)),
                     METH_FASTCALL, "C = act(alpha A B + beta C + bias) for a known key, or None"};
PyMethodDef kLinear = {"linear",
                       reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fast_linear)),
                       METH_FASTCALL, "act(x W^T + bias) for a known key, or None"};

py::object bound(const std::shared_ptr<Table>& t, PyMethodDef* def) {
  auto* holder = new std::shared_ptr<Table>(t);
  PyObject* capsule = PyCapsule_New(holder, kCapsule, [](PyObject* c) {
    delete static_cast<std::shared_ptr<Table>*>(PyCapsule_GetPointer(c, kCapsule));
  });
  if (!capsule) {
    delete holder;
    throw py::error_already_set();
  }
  PyObject* f = PyCFunction_New(def, capsule);
  Py_DECREF(capsule);
  if (!f) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(f);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Table, std::shared_ptr<Table>>(m, "Table", py::dynamic_attr())
      .def("add", &Table::add)
      .def("clear", &Table::clear)
      .def("stats", &Table::stats);
  m.def("blas_report", [] { return Blas::get().report(); });
  m.def("blas_calls", [] { return blas_calls.load(); });
  // A table whose call and linear are the METH_FASTCALL builtins above (instance
  // attributes: the class has no methods of those names).
  m.def("new_table", [](py::tuple types) {
    auto t = std::make_shared<Table>(types);
    py::object obj = py::cast(t);
    obj.attr("call") = bound(t, &kCall);
    obj.attr("linear") = bound(t, &kLinear);
    return obj;
  });
}

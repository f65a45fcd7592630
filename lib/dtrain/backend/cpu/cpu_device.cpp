// The CPU backend: oneDNN for convolutions and GEMMs (where built with it; im2col and OpenBLAS
// otherwise, cpu/gemm.cpp), and OpenMP loops for everything else (cpu/loops.hpp). One OpenMP
// team per replica does all the work: each sgemm runs single-threaded inside it, so no second
// pool of threads spins against the first.
#include <cblas.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/backend/cpu/gemm.hpp"
#include "dtrain/backend/cpu/loops.hpp"
#include "dtrain/backend/cpu/transformer.hpp"
#include "dtrain/backend/device.hpp"
#include "dtrain/backend/math.hpp"
#include "dtrain/base/bf16.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/hash.hpp"

#if DTRAIN_HAVE_DNNL
#include <dnnl.hpp>
#endif

namespace dtrain {

namespace {

using cpu::kParallelMin;

// ---- im2col convolution: the reference and the fallback ----

void im2col(const float* x, const ConvGeom& g, float* col, int64_t ld) {
  const int64_t ho = g.ho(), wo = g.wo(), k = g.k, h = g.h, w = g.w;
  for (int64_t ch = 0; ch < g.c; ++ch)
    for (int64_t ki = 0; ki < k; ++ki)
      for (int64_t kj = 0; kj < k; ++kj) {
        float* row = col + ((ch * k + ki) * k + kj) * ld;
        for (int64_t oi = 0; oi < ho; ++oi) {
          const int64_t ii = oi * g.stride - g.pad + ki;
          float* out = row + oi * wo;
          if (ii < 0 || ii >= h) {
            std::fill_n(out, wo, 0.f);
            continue;
          }
          const float* in = x + (ch * h + ii) * w;
          if (g.stride == 1) {
            // Columns [lo, hi) read in[oj - pad + kj] inside the image; the rest are zero.
            const int64_t lo = std::clamp<int64_t>(g.pad - kj, 0, wo);
            const int64_t hi = std::clamp<int64_t>(w + g.pad - kj, lo, wo);
            std::fill_n(out, lo, 0.f);
            std::copy(in + lo - g.pad + kj, in + hi - g.pad + kj, out + lo);
            std::fill(out + hi, out + wo, 0.f);
          } else {
            for (int64_t oj = 0; oj < wo; ++oj) {
              const int64_t jj = oj * g.stride - g.pad + kj;
              out[oj] = (jj >= 0 && jj < w) ? in[jj] : 0.f;
            }
          }
        }
      }
}

void col2im(const float* col, int64_t ld, const ConvGeom& g, float* dx) {
  const int64_t ho = g.ho(), wo = g.wo(), k = g.k, h = g.h, w = g.w;
  for (int64_t ch = 0; ch < g.c; ++ch)
    for (int64_t ki = 0; ki < k; ++ki)
      for (int64_t kj = 0; kj < k; ++kj) {
        const float* row = col + ((ch * k + ki) * k + kj) * ld;
        for (int64_t oi = 0; oi < ho; ++oi) {
          const int64_t ii = oi * g.stride - g.pad + ki;
          if (ii < 0 || ii >= h) continue;
          float* out = dx + (ch * h + ii) * w;
          for (int64_t oj = 0; oj < wo; ++oj) {
            const int64_t jj = oj * g.stride - g.pad + kj;
            if (jj >= 0 && jj < w) out[jj] += row[oi * wo + oj];
          }
        }
      }
}

// Samples per GEMM: as many as keep the column matrix near 256K floats (1 MB, about one
// core's L2 cache); larger chunks measured slower, the im2col traffic leaving the cache.
int64_t conv_chunk(int64_t ckk, int64_t p) {
  return std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, ckk * p));
}

// One thread's scratch for the im2col path.
struct ConvScratch {
  std::vector<float> col, out;
};

#if DTRAIN_HAVE_DNNL
// The buffers that hold tensors in oneDNN's blocked layouts during one primitive call, shared by
// every convolution of the device: a call stages at most three tensors (its inputs and output),
// each in its own slot, and nothing staged outlives the call (CPU primitives run synchronously).
// One set for the whole model instead of one per convolution and batch size: for ResNet-18 at
// batch 128, about 100 MiB instead of about 1.5 GiB.
class DnnlStaging {
 public:
  static constexpr int kSlots = 3;
  void* slot(int i, size_t bytes) {
    Slot& s = slots_[static_cast<size_t>(i)];
    if (bytes > s.bytes) {
      const size_t rounded = (bytes + 63) / 64 * 64;
      s.p.reset(static_cast<std::byte*>(std::aligned_alloc(64, rounded)));
      if (!s.p) throw std::bad_alloc();  // said as out of memory, with how to need less
      s.bytes = rounded;
    }
    return s.p.get();
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  struct Slot {
    std::unique_ptr<std::byte, Free> p;
    size_t bytes = 0;
  };
  std::array<Slot, kSlots> slots_;
};

// oneDNN's name for an NCHW tensor in channel blocks of b (ConvGeom::out_block; 0: NCHW).
dnnl::memory::format_tag blocked_tag(int64_t b) {
  using tag = dnnl::memory::format_tag;
  if (b == 0) return tag::nchw;
  if (b == 8) return tag::nChw8c;
  if (b == 16) return tag::nChw16c;
  DTRAIN_THROW_SYSTEM(fmt::format("no oneDNN layout for channel blocks of {}", b));
}

// Convolution g's tensors for n samples in fp32, their layouts left to oneDNN (format any),
// and its forward pass: what DnnlConv builds its primitives from, and what conv_out_block asks.
struct AnyConv {
  AnyConv(const ConvGeom& g, int64_t n, dnnl::algorithm algorithm)
      : algo(algorithm),
        src({n, g.c, g.h, g.w}, kF32, kAny),
        wei({g.oc, g.c, g.k, g.k}, kF32, kAny),
        bias({g.oc}, kF32, dnnl::memory::format_tag::x),
        dst({n, g.oc, g.ho(), g.wo()}, kF32, kAny),
        strides{g.stride, g.stride},
        pad{g.pad, g.pad} {}
  dnnl::convolution_forward::desc forward() const {
    return {dnnl::prop_kind::forward_training, algo, src, wei, bias, dst, strides, pad, pad};
  }
  dnnl::convolution_backward_data::desc backward_data() const {
    return {algo, src, wei, dst, strides, pad, pad};
  }
  dnnl::convolution_backward_weights::desc backward_weights() const {
    return {algo, src, wei, bias, dst, strides, pad, pad};
  }
  static constexpr auto kF32 = dnnl::memory::data_type::f32;
  static constexpr auto kAny = dnnl::memory::format_tag::any;
  dnnl::algorithm algo;
  dnnl::memory::desc src, wei, bias, dst;
  dnnl::memory::dims strides, pad;
};

// make(algorithm): Winograd's where `winograd` and oneDNN has it for this instruction set and
// shape (AVX-512; make throws where not), else the direct one.
template <class Make>
auto winograd_or_direct(bool winograd, Make make) {
  if (winograd) try {
      return make(dnnl::algorithm::convolution_winograd);
    } catch (const dnnl::error&) {
      // not implemented here: the direct convolution below
    }
  return make(dnnl::algorithm::convolution_direct);
}

// The forward primitive for g at n samples (winograd_or_direct).
dnnl::convolution_forward::primitive_desc forward_pd(const dnnl::engine& eng, const ConvGeom& g,
                                                     int64_t n, bool winograd) {
  return winograd_or_direct(winograd, [&](dnnl::algorithm algo) {
    return dnnl::convolution_forward::primitive_desc(AnyConv(g, n, algo).forward(), eng);
  });
}

// oneDNN convolution primitives for one geometry and batch size, with the reorders that move
// between dtrain's NCHW/OIHW tensors (or channel blocks: MapLayout) and the layouts oneDNN
// picks.
class DnnlConv {
 public:
  // winograd: Winograd's algorithm for each pass where oneDNN has it (winograd_or_direct).
  DnnlConv(const dnnl::engine& eng, DnnlStaging& staging, const ConvGeom& g, int64_t n,
           bool winograd)
      : eng_(eng), staging_(staging) {
    using dnnl::memory;
    const AnyConv a(g, n, dnnl::algorithm::convolution_direct);
    user_src_ = memory::desc(a.src.dims(), a.kF32, blocked_tag(g.in_block));
    user_wei_ = memory::desc(a.wei.dims(), a.kF32, memory::format_tag::oihw);
    user_dst_ = memory::desc(a.dst.dims(), a.kF32, blocked_tag(g.out_block));
    bias_ = a.bias;
    fwd_pd_ = forward_pd(eng_, g, n, winograd);
    bwd_data_pd_ = winograd_or_direct(winograd, [&](dnnl::algorithm algo) {
      return dnnl::convolution_backward_data::primitive_desc(AnyConv(g, n, algo).backward_data(),
                                                             eng_, fwd_pd_);
    });
    bwd_w_pd_ = winograd_or_direct(winograd, [&](dnnl::algorithm algo) {
      return dnnl::convolution_backward_weights::primitive_desc(
          AnyConv(g, n, algo).backward_weights(), eng_, fwd_pd_);
    });
    fwd_ = dnnl::convolution_forward(fwd_pd_);
    bwd_data_ = dnnl::convolution_backward_data(bwd_data_pd_);
    bwd_w_ = dnnl::convolution_backward_weights(bwd_w_pd_);
    dw_.assign(static_cast<size_t>(g.oc * g.c * g.k * g.k), 0.f);
    db_.assign(static_cast<size_t>(g.oc), 0.f);
    zero_b_.assign(static_cast<size_t>(g.oc), 0.f);
  }

  void forward(dnnl::stream& s, const float* x, const float* w, const float* b, float* y) {
    auto src = in(s, fwd_src_, 0, fwd_pd_.src_desc(), user_src_, x);
    auto wei = in(s, fwd_wei_, 1, fwd_pd_.weights_desc(), user_wei_, w);
    // No bias: zeros (oneDNN's bias gradient is computed anyway and dropped in backward).
    dnnl::memory bias(bias_, eng_, const_cast<float*>(b ? b : zero_b_.data()));
    auto dst = out(fwd_dst_, 2, fwd_pd_.dst_desc(), user_dst_, y);
    fwd_.execute(
        s,
        {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_BIAS, bias}, {DNNL_ARG_DST, dst}});
    finish(s, fwd_dst_, dst, y);
  }

  // The output's gradient is reordered once where both passes want it in the same layout:
  // slot 0 holds it for both; the input's gradient goes out of slot 2 before the weights'
  // gradient uses it, and the input takes slot 1 after the weights.
  void backward(dnnl::stream& s, const float* x, const float* w, const float* dy, float* dw,
                float* db, float* dx) {
    const bool share = bwd_data_pd_.diff_dst_desc() == bwd_w_pd_.diff_dst_desc();
    std::optional<dnnl::memory> ddst;
    if (dx) {
      ddst = in(s, bd_ddst_, 0, bwd_data_pd_.diff_dst_desc(), user_dst_, dy);
      auto wei = in(s, bd_wei_, 1, bwd_data_pd_.weights_desc(), user_wei_, w);
      auto dsrc = out(bd_dsrc_, 2, bwd_data_pd_.diff_src_desc(), user_src_, dx);
      bwd_data_.execute(
          s, {{DNNL_ARG_DIFF_DST, *ddst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, dsrc}});
      finish(s, bd_dsrc_, dsrc, dx);
    }
    if (!ddst || !share) ddst = in(s, bw_ddst_, 0, bwd_w_pd_.diff_dst_desc(), user_dst_, dy);
    auto src = in(s, bw_src_, 1, bwd_w_pd_.src_desc(), user_src_, x);
    auto dwei = out(bw_dwei_, 2, bwd_w_pd_.diff_weights_desc(), user_wei_, dw_.data());
    dnnl::memory dbias(bias_, eng_, db_.data());
    bwd_w_.execute(s, {{DNNL_ARG_SRC, src},
                       {DNNL_ARG_DIFF_DST, *ddst},
                       {DNNL_ARG_DIFF_WEIGHTS, dwei},
                       {DNNL_ARG_DIFF_BIAS, dbias}});
    finish(s, bw_dwei_, dwei, dw_.data());
    s.wait();
    // oneDNN overwrites weight gradients; dtrain accumulates them (micro-steps).
    for (size_t i = 0; i < dw_.size(); ++i) dw[i] += dw_[i];
    if (db)
      for (size_t i = 0; i < db_.size(); ++i) db[i] += db_[i];
  }

 private:
  // A tensor in the layout a primitive wants: dtrain's own memory when the layouts agree, else
  // a slot of the shared staging buffers and the reorders to and from dtrain's layout.
  struct Staged {
    bool init = false, same = false;
    dnnl::memory::desc user;
    dnnl::memory buf;  // no memory of its own: pointed at a staging slot at each use
    dnnl::reorder to, from;
  };
  void prepare(Staged& st, const dnnl::memory::desc& want, const dnnl::memory::desc& user,
               bool input) {
    if (st.init) return;
    st.init = true;
    st.user = user;
    st.same = want == user;
    if (st.same) return;
    st.buf = dnnl::memory(want, eng_, DNNL_MEMORY_NONE);
    dnnl::memory u(user, eng_, DNNL_MEMORY_NONE);
    if (input)
      st.to = dnnl::reorder(u, st.buf);
    else
      st.from = dnnl::reorder(st.buf, u);
  }
  void bind(Staged& st, int slot) {
    st.buf.set_data_handle(staging_.slot(slot, st.buf.get_desc().get_size()));
  }
  dnnl::memory in(dnnl::stream& s, Staged& st, int slot, const dnnl::memory::desc& want,
                  const dnnl::memory::desc& user, const float* p) {
    prepare(st, want, user, true);
    dnnl::memory u(user, eng_, const_cast<float*>(p));
    if (st.same) return u;
    bind(st, slot);
    st.to.execute(s, u, st.buf);
    return st.buf;
  }
  dnnl::memory out(Staged& st, int slot, const dnnl::memory::desc& want,
                   const dnnl::memory::desc& user, float* p) {
    prepare(st, want, user, false);
    if (st.same) return dnnl::memory(user, eng_, p);
    bind(st, slot);
    return st.buf;
  }
  void finish(dnnl::stream& s, Staged& st, dnnl::memory& m, float* p) {
    if (st.same) return;
    dnnl::memory u(st.user, eng_, p);
    st.from.execute(s, m, u);
  }

  dnnl::engine eng_;
  DnnlStaging& staging_;
  dnnl::memory::desc user_src_, user_wei_, user_dst_, bias_;
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd_;
  dnnl::convolution_backward_weights::primitive_desc bwd_w_pd_;
  dnnl::convolution_forward fwd_;
  dnnl::convolution_backward_data bwd_data_;
  dnnl::convolution_backward_weights bwd_w_;
  Staged fwd_src_, fwd_wei_, fwd_dst_, bd_ddst_, bd_wei_, bd_dsrc_, bw_src_, bw_ddst_, bw_dwei_;
  std::vector<float> dw_, db_, zero_b_;
};
#endif

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const CpuOptions& opt)
      : threads_(std::max(1, opt.threads)),
        conv_(opt.conv),
        gemm_lib_(opt.gemm),
        bf16_(opt.bf16),
        fuse_(opt.fuse) {
#if DTRAIN_HAVE_DNNL
    if (uses_onednn(conv_)) {
      eng_ = dnnl::engine(dnnl::engine::kind::cpu, 0);
      stream_ = dnnl::stream(eng_);
    }
#else
    conv_ = CpuConv::im2col;
    gemm_lib_ = CpuGemm::openblas;
#endif
  }
  std::string name() const override {
    return fmt::format("cpu ({} thread{}, {})", threads_, threads_ == 1 ? "" : "s",
                       cpu_libraries({threads_, conv_, bf16_, gemm_lib_, fuse_}));
  }

  void* alloc_bytes(size_t bytes) override {
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();  // said as out of memory, with how to need less
    std::memset(p, 0, rounded);
    return p;
  }
  void free_bytes(void* p) override {
    std::free(p);
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void zero(void* p, size_t bytes) override {
    std::memset(p, 0, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void fill(float* x, size_t n, float v) override {
    const auto len = static_cast<int64_t>(n);
#pragma omp parallel for num_threads(threads_) if (len >= kParallelMin) schedule(static)
    for (int64_t i = 0; i < len; ++i) x[i] = v;
  }

  // Large products are cut into row (or column) blocks of C, one single-threaded sgemm call per
  // thread (cpu/gemm.cpp). Each element of C is computed by one call; a block's size can change
  // the library's kernel at its edges, so other thread counts agree within rounding (the same
  // count gives the same bits).
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
            int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    if (m == 0 || n == 0) return;
    if (bf16_ && k > 0) {  // the operands as the stored matrices (rows x cols, leading dim)
      a = rounded(a, ta ? k : m, ta ? m : k, lda, a16_);
      b = rounded(b, tb ? n : k, tb ? k : n, ldb, b16_);
    }
    const int parts = (threads_ > 1 && m * n * k >= (int64_t{1} << 18))
                          ? static_cast<int>(std::min<int64_t>(threads_, std::max(m, n) / 16))
                          : 1;
    if (parts <= 1) {
      sgemm1(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
    const bool by_rows = m >= n;
    const int64_t len = by_rows ? m : n;
    const int64_t block = ((len + parts - 1) / parts + 63) / 64 * 64;
#pragma omp parallel for num_threads(parts) schedule(static)
    for (int t = 0; t < parts; ++t) {
      const int64_t lo = t * block, hi = std::min(len, lo + block);
      if (lo >= hi) continue;
      if (by_rows)
        sgemm1(ta, tb, hi - lo, n, k, alpha, ta ? a + lo : a + lo * lda, lda, b, ldb, beta,
               c + lo * ldc, ldc);
      else
        sgemm1(ta, tb, m, hi - lo, k, alpha, a, lda, tb ? b + lo * ldb : b + lo, ldb, beta, c + lo,
               ldc);
    }
  }

  void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) override {
#pragma omp parallel for num_threads(threads_) if (rows * cols >= kParallelMin) schedule(static)
    for (int64_t r = 0; r < rows; ++r) cpu::add_row(y + r * cols, bias, cols);
  }

  void bias_grad(const float* dy, float* db, int64_t rows, int64_t cols,
                 Accumulate mode) override {
    if (mode == Accumulate::overwrite) std::fill_n(db, cols, 0.f);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = dy + r * cols;
      for (int64_t c = 0; c < cols; ++c) db[c] += row[c];
    }
  }

  // One OpenMP loop per activation, the formula inlined into it (math.hpp), so that each
  // loop vectorises.
  void activation_forward(Activation a, const float* x, float* y, size_t n) override {
    switch (a) {
      case Activation::relu: return elementwise<math::relu>(x, y, n);
      case Activation::tanh: return elementwise<math::tanh>(x, y, n);
      case Activation::sigmoid: return elementwise<math::sigmoid>(x, y, n);
      case Activation::gelu: return elementwise<math::gelu>(x, y, n);
    }
  }

  // dx from dy and the activation's input x (ReLU, GELU) or output y (tanh, sigmoid).
  void activation_backward(Activation a, const float* x, const float* y, const float* dy, float* dx,
                           size_t n) override {
    switch (a) {
      case Activation::relu: return elementwise<math::relu_backward>(x, dy, dx, n);
      case Activation::tanh: return elementwise<math::tanh_backward>(y, dy, dx, n);
      case Activation::sigmoid: return elementwise<math::sigmoid_backward>(y, dy, dx, n);
      case Activation::gelu: return elementwise<math::gelu_backward>(x, dy, dx, n);
    }
  }

  void softmax_xent(const float* logits, const int32_t* labels, int64_t rows, int64_t classes,
                    float grad_scale, float* dlogits, double* stats, double smoothing,
                    double stat_scale) override {
    // Rows in parallel (a language model has a row per position: 2,048 of 256 logits a step
    // for configs/bytes-gpt.yaml), their results summed in row order afterwards, so the bits
    // are those of one thread.
    row_results_.resize(static_cast<size_t>(rows));
#pragma omp parallel for num_threads(threads_) if (rows * classes >= kParallelMin) schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      row_results_[static_cast<size_t>(r)] =
          math::softmax_xent_row(logits + r * classes, labels[r], classes, grad_scale,
                                 dlogits ? dlogits + r * classes : nullptr, smoothing);
    double loss = 0.0, correct = 0.0;
    for (const math::XentRow& row : row_results_) {
      loss += row.loss;
      correct += row.hit ? 1.0 : 0.0;
    }
    stats[0] += loss * stat_scale;
    stats[1] += correct * stat_scale;
  }

  void embedding_forward(const float* tokens, int64_t stride, const float* wte, const float* wpe,
                         int64_t rows, int64_t t, int64_t c, int64_t vocab, float* y) override {
    cpu::embedding_forward(threads_, tokens, stride, wte, wpe, rows, t, c, vocab, y);
  }
  void embedding_backward(const float* tokens, int64_t stride, const float* dy, int64_t rows,
                          int64_t t, int64_t c, int64_t vocab, float* dwte,
                          float* dwpe) override {
    cpu::embedding_backward(threads_, tokens, stride, dy, rows, t, c, vocab, dwte, dwpe);
  }
  void next_tokens(const float* tokens, int64_t stride, int64_t rows, int64_t t, int64_t vocab,
                   int32_t* labels) override {
    cpu::next_tokens(tokens, stride, rows, t, vocab, labels);
  }
  void layernorm_forward(const float* x, const float* gamma, const float* beta, int64_t n,
                         int64_t c, float eps, float* y, float* stats) override {
    cpu::layernorm_forward(threads_, x, gamma, beta, n, c, eps, y, stats);
  }
  void layernorm_backward(const float* x, const float* dy, const float* gamma,
                          const float* stats, int64_t n, int64_t c, float* dx, float* dgamma,
                          float* dbeta) override {
    cpu::layernorm_backward(threads_, x, dy, gamma, stats, n, c, dx, dgamma, dbeta);
  }
  void attention_forward(const float* qkv, int64_t rows, int64_t t, int64_t c, int64_t heads,
                         float* att, float* y) override {
    cpu::attention_forward(threads_, gemm_lib_, qkv, rows, t, c, heads, att, y);
  }
  void attention_backward(const float* qkv, const float* att, const float* dy, int64_t rows,
                          int64_t t, int64_t c, int64_t heads, float* dqkv) override {
    cpu::attention_backward(threads_, gemm_lib_, qkv, att, dy, rows, t, c, heads, dqkv);
  }

  void gather(const float* src, const int32_t* src_labels, int64_t features, const int64_t* idx,
              int64_t count, float* dst, int32_t* dst_labels) override {
    for (int64_t i = 0; i < count; ++i) {
      std::memcpy(dst + i * features, src + idx[i] * features,
                  static_cast<size_t>(features) * sizeof(float));
      dst_labels[i] = src_labels[idx[i]];
    }
  }

  // oneDNN's fp32 convolutions work in channel blocks (8 or 16 channels, by instruction set):
  // the block its forward pass picks for g's output, where the channels fill whole blocks.
  int64_t conv_out_block(const ConvGeom& g) override {
#if DTRAIN_HAVE_DNNL
    if (!uses_onednn(conv_) || bf16_) return 0;
    auto it = out_blocks_.find(g);
    if (it == out_blocks_.end()) it = out_blocks_.emplace(g, dnnl_out_block(g)).first;
    return it->second;
#else
    (void)g;
    return 0;
#endif
  }

  void convert_layout(const float* x, int64_t n, int64_t c, int64_t spatial, int64_t from,
                      int64_t to, float* y) override {
    if (n * c * spatial == 0) return;
    if (from == to) return copy(y, x, static_cast<size_t>(n * c * spatial) * sizeof(float));
#if DTRAIN_HAVE_DNNL
    if (uses_onednn(conv_)) return dnnl_convert(x, n, c, spatial, from, to, y);
#endif
    const auto at = [&](int64_t b, int64_t s, int64_t ch, int64_t i) {
      return b ? ((s * (c / b) + ch / b) * spatial + i) * b + ch % b : (s * c + ch) * spatial + i;
    };
#pragma omp parallel for num_threads(threads_) if (n * c * spatial >= kParallelMin) schedule(static)
    for (int64_t sc = 0; sc < n * c; ++sc)
      for (int64_t i = 0; i < spatial; ++i)
        y[at(to, sc / c, sc % c, i)] = x[at(from, sc / c, sc % c, i)];
  }

  void conv_forward(const ConvGeom& g, int64_t n, const float* x, const float* w, const float* b,
                    float* y) override {
    if (n == 0) return;
    nchw_unless_onednn(g);
    if (!bf16_) return conv_forward_f32(g, n, x, w, b, y);
    // cuDNN's bfloat16 convolution: bf16 input and weights, fp32 accumulation, a bf16 output;
    // the bias is added to that in fp32.
    const int64_t in = n * g.c * g.h * g.w, nw = g.oc * g.c * g.k * g.k, p = g.ho() * g.wo();
    const float* xr = rounded(x, 1, in, in, x16_);
    const float* wr = rounded(w, 1, nw, nw, w16_);
    zero_bias_.assign(static_cast<size_t>(g.oc), 0.f);
    conv_forward_f32(g, n, xr, wr, zero_bias_.data(), y);
    round_in_place(y, n * g.oc * p);
    add_channel_bias(y, b, n, g.oc, p);
  }
  void conv_backward(const ConvGeom& g, int64_t n, const float* x, const float* w, const float* dy,
                     float* dw, float* db, float* dx) override {
    if (n == 0) return;
    nchw_unless_onednn(g);
    if (!bf16_) return conv_backward_f32(g, n, x, w, dy, dw, db, dx);
    // bf16 operands; dx and the weight gradient come out in bf16 (the latter added to the
    // fp32 gradient); the bias gradient sums the fp32 dy.
    const int64_t in = n * g.c * g.h * g.w, nw = g.oc * g.c * g.k * g.k, p = g.ho() * g.wo();
    const float* xr = rounded(x, 1, in, in, x16_);
    const float* wr = rounded(w, 1, nw, nw, w16_);
    const float* dyr = rounded(dy, 1, n * g.oc * p, n * g.oc * p, dy16_);
    dw16_.assign(static_cast<size_t>(nw), 0.f);
    zero_bias_.assign(static_cast<size_t>(g.oc), 0.f);
    conv_backward_f32(g, n, xr, wr, dyr, dw16_.data(), zero_bias_.data(), dx);
    if (dx) round_in_place(dx, in);
    for (int64_t i = 0; i < nw; ++i) dw[i] += round_bf16(dw16_[static_cast<size_t>(i)]);
    add_conv_bias_grad(dy, n, g.oc, p, db);
  }

 private:
  // Only oneDNN's fp32 convolutions write and read channel blocks (conv_out_block).
  void nchw_unless_onednn(const ConvGeom& g) const {
    if ((g.in_block || g.out_block) && (bf16_ || !uses_onednn(conv_)))
      DTRAIN_THROW_SYSTEM("a convolution in channel blocks without oneDNN's fp32 kernels");
  }

  // ---- BatchNorm on a convolution's output in channel blocks (conv_out_block) ----
  static constexpr int64_t kMaxBlock = 16;
  static int64_t channel_blocks(int64_t c, int64_t block) {
    if ((block != 8 && block != 16) || c % block)
      DTRAIN_THROW_SYSTEM(fmt::format("BatchNorm: {} channels in blocks of {}", c, block));
    return c / block;
  }
  // tile(s, ch0, at) for every tile of n samples of c channels in blocks (MapLayout), in
  // parallel: sample s's channels ch0 to ch0 + block - 1, whose values start at float `at`.
  // Each thread takes one contiguous share of the tiles; `backwards`, it walks its share from
  // the end, where the pass before (a convolution's, or another forwards) left the values it
  // touched last in the caches.
  template <class Tile>
  void each_tile(int64_t n, int64_t c, int64_t spatial, int64_t block, Tile tile,
                 bool backwards = false) {
    const int64_t blocks = channel_blocks(c, block), tiles = n * blocks;
    cpu::split_parts(threads_, n * c * spatial, tiles, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const int64_t t = backwards ? lo + hi - 1 - i : i;
        tile(t / blocks, t % blocks * block, t * spatial * block);
      }
    });
  }
  // Per sample and channel, the float sums of a tile ([sample][channel], first and second
  // halves of bn_part_); then per channel their double sums over samples in order.
  void blocked_moments(const float* x, int64_t n, int64_t c, int64_t spatial, int64_t block,
                       double* moments) {
    bn_part_.resize(static_cast<size_t>(2 * n * c));
    float* part = bn_part_.data();
    each_tile(
        n, c, spatial, block,
        [&](int64_t s, int64_t ch0, int64_t at) {
          const int64_t k = s * c + ch0;
          cpu::bn_block_moments(x + at, block, spatial, part + k, part + n * c + k);
        },
        /*backwards=*/fuse_);
    sum_samples(n, c, [&](int64_t ch, double a, double q) {
      moments[ch] = a;
      moments[c + ch] = q;
    });
  }
  // (relu_y: of dy masked by the ReLU, into `masked`; bn_backward_sums_masked.)
  void blocked_sums(const float* x, const float* dy, const float* relu_y, const float* stats,
                    const float* gamma, int64_t n, int64_t c, int64_t spatial, int64_t block,
                    float* masked, double* sums, float* dgamma, float* dbeta) {
    bn_part_.resize(static_cast<size_t>(2 * n * c));
    float* part = bn_part_.data();
    each_tile(
        n, c, spatial, block,
        [&](int64_t s, int64_t ch0, int64_t at) {
          const int64_t k = s * c + ch0;
          if (relu_y)
            cpu::bn_block_sums_masked(x + at, dy + at, relu_y + at, stats + ch0, stats + c + ch0,
                                      block, spatial, masked + at, part + k, part + n * c + k);
          else
            cpu::bn_block_sums(x + at, dy + at, stats + ch0, stats + c + ch0, block, spatial,
                               part + k, part + n * c + k);
        },
        /*backwards=*/fuse_);
    sum_samples(n, c, [&](int64_t ch, double t1, double t2) {
      math::bn_backward_totals(t1, t2, gamma, c, ch, sums, dgamma, dbeta);
    });
  }
  // done(ch, a, b) with channel ch's sums over samples, in order, of both halves of bn_part_.
  template <class Done>
  void sum_samples(int64_t n, int64_t c, Done done) {
    const float* part = bn_part_.data();
#pragma omp parallel for num_threads(threads_) if (n * c >= kParallelMin) schedule(static)
    for (int64_t ch = 0; ch < c; ++ch) {
      double a = 0, b = 0;
      for (int64_t s = 0; s < n; ++s) {
        a += part[s * c + ch];
        b += part[(n + s) * c + ch];
      }
      done(ch, a, b);
    }
  }

  // A copy of the stored rows x cols matrix (leading dimension ld) rounded to bfloat16.
  const float* rounded(const float* src, int64_t rows, int64_t cols, int64_t ld,
                       std::vector<float>& dst) {
    dst.resize(static_cast<size_t>((rows - 1) * ld + cols));
    float* d = dst.data();
#pragma omp parallel for num_threads(threads_) if (rows * cols >= kParallelMin) schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) d[r * ld + c] = round_bf16(src[r * ld + c]);
    return d;
  }
  void round_in_place(float* x, int64_t n) {
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
  }
  // db[o] += the sum of dy over samples and positions of channel o.
  static void add_conv_bias_grad(const float* dy, int64_t n, int64_t c, int64_t p, float* db) {
    if (!db) return;  // a convolution without bias
    for (int64_t s = 0; s < n; ++s)
      for (int64_t o = 0; o < c; ++o) {
        const float* q = dy + (s * c + o) * p;
        float acc = 0.f;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = 0; i < p; ++i) acc += q[i];
        db[o] += acc;
      }
  }
  static void add_channel_bias(float* y, const float* b, int64_t n, int64_t c, int64_t p) {
    if (!b) return;
    for (int64_t s = 0; s < n; ++s)
      for (int64_t o = 0; o < c; ++o) {
        float* q = y + (s * c + o) * p;
        for (int64_t i = 0; i < p; ++i) q[i] += b[o];
      }
  }
  void conv_forward_f32(const ConvGeom& g, int64_t n, const float* x, const float* w,
                        const float* b, float* y) {
#if DTRAIN_HAVE_DNNL
    if (uses_onednn(conv_)) {
      omp_set_num_threads(threads_);
      dnnl_conv(g, n).forward(stream_, x, w, b, y);
      stream_.wait();
      return;
    }
#endif
    // Chunks of samples side by side in one [C*k*k, nb*P] column matrix: one GEMM per chunk,
    // W [OC x C*k*k] times the columns, then reordered to NCHW. Chunks run in parallel.
    const int64_t ckk = g.c * g.k * g.k, p = g.ho() * g.wo(), in_size = g.c * g.h * g.w;
    const int64_t chunk = std::min(n, conv_chunk(ckk, p));
    const int64_t chunks = (n + chunk - 1) / chunk;
    scratch_.resize(static_cast<size_t>(threads_));
#pragma omp parallel for num_threads(static_cast <int>(std::min <int64_t>(threads_, chunks))) \
    schedule(static)
    for (int64_t ci = 0; ci < chunks; ++ci) {
      auto& sc = scratch_[static_cast<size_t>(omp_get_thread_num())];
      const int64_t n0 = ci * chunk, nb = std::min(chunk, n - n0), ld = nb * p;
      sc.col.resize(static_cast<size_t>(ckk * ld));
      sc.out.resize(static_cast<size_t>(g.oc * ld));
      for (int64_t s = 0; s < nb; ++s) im2col(x + (n0 + s) * in_size, g, sc.col.data() + s * p, ld);
      sgemm1(false, false, g.oc, ld, ckk, 1.f, w, ckk, sc.col.data(), ld, 0.f, sc.out.data(), ld);
      for (int64_t o = 0; o < g.oc; ++o)
        for (int64_t s = 0; s < nb; ++s) {
          const float* src = sc.out.data() + o * ld + s * p;
          float* dst = y + ((n0 + s) * g.oc + o) * p;
          const float bo = b ? b[o] : 0.f;
          for (int64_t i = 0; i < p; ++i) dst[i] = src[i] + bo;
        }
    }
  }

  void conv_backward_f32(const ConvGeom& g, int64_t n, const float* x, const float* w,
                         const float* dy, float* dw, float* db, float* dx) {
#if DTRAIN_HAVE_DNNL
    if (uses_onednn(conv_)) {
      omp_set_num_threads(threads_);
      dnnl_conv(g, n).backward(stream_, x, w, dy, dw, db, dx);
      return;
    }
#endif
    const int64_t ckk = g.c * g.k * g.k, p = g.ho() * g.wo(), in_size = g.c * g.h * g.w;
    const int64_t chunk = std::min(n, conv_chunk(ckk, p));
    const int64_t chunks = (n + chunk - 1) / chunk;
    // Each chunk's weight gradient goes to its own slot and the slots are summed in chunk
    // order, so the result does not depend on the thread count.
    const auto nw = static_cast<size_t>(g.oc * ckk);
    partial_dw_.assign(nw * static_cast<size_t>(chunks), 0.f);
    scratch_.resize(static_cast<size_t>(threads_));
#pragma omp parallel for num_threads(static_cast <int>(std::min <int64_t>(threads_, chunks))) \
    schedule(static)
    for (int64_t ci = 0; ci < chunks; ++ci) {
      auto& sc = scratch_[static_cast<size_t>(omp_get_thread_num())];
      const int64_t n0 = ci * chunk, nb = std::min(chunk, n - n0), ld = nb * p;
      sc.col.resize(static_cast<size_t>(ckk * ld));
      sc.out.resize(static_cast<size_t>(g.oc * ld));
      for (int64_t o = 0; o < g.oc; ++o)  // dy of the chunk as [OC, nb*P]
        for (int64_t s = 0; s < nb; ++s)
          std::memcpy(sc.out.data() + o * ld + s * p, dy + ((n0 + s) * g.oc + o) * p,
                      static_cast<size_t>(p) * sizeof(float));
      for (int64_t s = 0; s < nb; ++s) im2col(x + (n0 + s) * in_size, g, sc.col.data() + s * p, ld);
      sgemm1(false, true, g.oc, ckk, ld, 1.f, sc.out.data(), ld, sc.col.data(), ld, 0.f,
             partial_dw_.data() + static_cast<size_t>(ci) * nw, ckk);
      if (dx) {
        sgemm1(true, false, ckk, ld, g.oc, 1.f, w, ckk, sc.out.data(), ld, 0.f, sc.col.data(), ld);
        for (int64_t s = 0; s < nb; ++s) {
          float* d = dx + (n0 + s) * in_size;
          std::fill_n(d, in_size, 0.f);
          col2im(sc.col.data() + s * p, ld, g, d);
        }
      }
    }
    for (int64_t ci = 0; ci < chunks; ++ci) {
      const float* pd = partial_dw_.data() + static_cast<size_t>(ci) * nw;
      for (size_t i = 0; i < nw; ++i) dw[i] += pd[i];
    }
    add_conv_bias_grad(dy, n, g.oc, p, db);
  }

 public:
  void maxpool_forward(const float* x, int64_t n, int64_t c, int64_t h, int64_t w, int64_t k,
                       int64_t stride, int64_t pad, float* y, int32_t* argmax) override {
    const int64_t ho = math::pool_out(h, k, stride, pad), wo = math::pool_out(w, k, stride, pad);
#pragma omp parallel for num_threads(threads_) if (n * c * h * w >= kParallelMin) schedule(static)
    for (int64_t p = 0; p < n * c; ++p) {
      const float* xp = x + p * h * w;
      if (k == 2 && stride == 2 && pad == 0) {  // the common case, unrolled; same tie rule
        for (int64_t oi = 0; oi < ho; ++oi) {
          const float* r0 = xp + 2 * oi * w;
          const float* r1 = r0 + w;
          float* yo = y + (p * ho + oi) * wo;
          int32_t* ao = argmax + (p * ho + oi) * wo;
          const auto top = static_cast<int32_t>(2 * oi * w), bottom = static_cast<int32_t>(top + w);
          for (int64_t oj = 0; oj < wo; ++oj) {
            // Selects instead of branches (see math::maxpool_window). Ties keep the earlier
            // position, as there.
            const auto j = static_cast<int32_t>(2 * oj);
            const float a = r0[j], b = r0[j + 1], c2 = r1[j], d2 = r1[j + 1];
            const bool gb = b > a;
            const float ab = gb ? b : a;
            const int32_t iab = gb ? top + j + 1 : top + j;
            const bool gd = d2 > c2;
            const float cd = gd ? d2 : c2;
            const int32_t icd = gd ? bottom + j + 1 : bottom + j;
            const bool g = cd > ab;
            yo[oj] = g ? cd : ab;
            ao[oj] = g ? icd : iab;
          }
        }
        continue;
      }
      for (int64_t oi = 0; oi < ho; ++oi)
        for (int64_t oj = 0; oj < wo; ++oj) {
          const math::PoolMax m = math::maxpool_window(xp, h, w, k, stride, pad, oi, oj);
          y[(p * ho + oi) * wo + oj] = m.value;
          argmax[(p * ho + oi) * wo + oj] = static_cast<int32_t>(m.index);
        }
    }
  }

  void maxpool_backward(const float* dy, const int32_t* argmax, int64_t n, int64_t c, int64_t h,
                        int64_t w, int64_t k, int64_t stride, int64_t pad, float* dx) override {
    const int64_t ho = math::pool_out(h, k, stride, pad), wo = math::pool_out(w, k, stride, pad);
#pragma omp parallel for num_threads(threads_) if (n * c * h * w >= kParallelMin) schedule(static)
    for (int64_t p = 0; p < n * c; ++p) {
      float* d = dx + p * h * w;
      std::fill_n(d, h * w, 0.f);
      for (int64_t o = 0; o < ho * wo; ++o) d[argmax[p * ho * wo + o]] += dy[p * ho * wo + o];
    }
  }

  // Per-channel reductions run in parallel over channels, each summing its samples in order:
  // the same result for every thread count. (In channel blocks: each sample's sums in parallel
  // first, then the same ordered sums over samples.)
  void channel_moments(const float* x, int64_t n, int64_t c, int64_t spatial, int64_t block,
                       double* moments) override {
    if (block) return blocked_moments(x, n, c, spatial, block, moments);
#pragma omp parallel for num_threads(threads_) if (n * c * spatial >= kParallelMin) schedule(static)
    for (int64_t ch = 0; ch < c; ++ch) {
      double sa = 0, sb = 0;
      for (int64_t s = 0; s < n; ++s) {
        const float* p = x + (s * c + ch) * spatial;
        // float inside a sample's positions (at most a few thousand terms), double across.
        float a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
        for (int64_t i = 0; i < spatial; ++i) {
          a += p[i];
          b += p[i] * p[i];
        }
        sa += a;
        sb += b;
      }
      moments[ch] = sa;
      moments[c + ch] = sb;
    }
  }

  void bn_prepare(const double* moments, double count, double eps, double momentum, float* running,
                  float* stats, int64_t c) override {
    for (int64_t ch = 0; ch < c; ++ch)
      math::bn_prepare_channel(moments, count, eps, momentum, running, stats, c, ch);
  }

  void bn_apply(const float* x, const float* stats, const float* gamma, const float* beta,
                int64_t n, int64_t c, int64_t spatial, int64_t block, float* y,
                bool relu) override {
    if (block) {
      return each_tile(n, c, spatial, block, [&](int64_t, int64_t ch0, int64_t at) {
        std::array<math::BnAffine, kMaxBlock> a;
        for (int64_t j = 0, ch = ch0; j < block; ++j, ++ch)
          a[j] = math::bn_affine(gamma[ch], beta[ch], stats[ch], stats[c + ch]);
        cpu::bn_block_apply(a.data(), x + at, block, spatial, y + at, relu);
      });
    }
#pragma omp parallel for num_threads(threads_) if (n * c * spatial >= kParallelMin) schedule(static)
    for (int64_t sc = 0; sc < n * c; ++sc) {
      const int64_t ch = sc % c;
      const float* p = x + sc * spatial;
      float* q = y + sc * spatial;
      const math::BnAffine t = math::bn_affine(gamma[ch], beta[ch], stats[ch], stats[c + ch]);
      relu ? cpu::bn_apply_relu_row(t, p, q, spatial) : cpu::bn_apply_row(t, p, q, spatial);
    }
  }

  void bn_apply_add(const float* x, const float* stats, const float* gamma, const float* beta,
                    const float* addend, int64_t n, int64_t c, int64_t spatial, int64_t block,
                    float* y, bool relu) override {
    if (!fuse_)
      return Device::bn_apply_add(x, stats, gamma, beta, addend, n, c, spatial, block, y, relu);
    if (block) {
      return each_tile(n, c, spatial, block, [&](int64_t, int64_t ch0, int64_t at) {
        std::array<math::BnAffine, kMaxBlock> a;
        for (int64_t j = 0, ch = ch0; j < block; ++j, ++ch)
          a[j] = math::bn_affine(gamma[ch], beta[ch], stats[ch], stats[c + ch]);
        cpu::bn_block_apply_add(a.data(), x + at, addend + at, block, spatial, y + at, relu);
      });
    }
#pragma omp parallel for num_threads(threads_) if (n * c * spatial >= kParallelMin) schedule(static)
    for (int64_t sc = 0; sc < n * c; ++sc) {
      const int64_t ch = sc % c, at = sc * spatial;
      const math::BnAffine t = math::bn_affine(gamma[ch], beta[ch], stats[ch], stats[c + ch]);
      relu ? cpu::bn_apply_add_row<true>(t, x + at, addend + at, y + at, spatial)
           : cpu::bn_apply_add_row<false>(t, x + at, addend + at, y + at, spatial);
    }
  }

  void bn_backward_sums(const float* x, const float* dy, const float* stats, const float* gamma,
                        int64_t n, int64_t c, int64_t spatial, int64_t block, double* sums,
                        float* dgamma, float* dbeta) override {
    sums_over_rows(x, dy, nullptr, stats, gamma, n, c, spatial, block, nullptr, sums, dgamma,
                   dbeta);
  }
  void bn_backward_sums_masked(const float* x, const float* dy, const float* relu_y,
                               const float* stats, const float* gamma, int64_t n, int64_t c,
                               int64_t spatial, int64_t block, float* masked, double* sums,
                               float* dgamma, float* dbeta) override {
    if (!fuse_)
      return Device::bn_backward_sums_masked(x, dy, relu_y, stats, gamma, n, c, spatial, block,
                                             masked, sums, dgamma, dbeta);
    sums_over_rows(x, dy, relu_y, stats, gamma, n, c, spatial, block, masked, sums, dgamma, dbeta);
  }
  // BatchNorm's backward sums, of dy or (relu_y) of dy masked into `masked` row by row, just
  // before the row's sums read it: the sums the same loop either way.
  void sums_over_rows(const float* x, const float* dy, const float* relu_y, const float* stats,
                      const float* gamma, int64_t n, int64_t c, int64_t spatial, int64_t block,
                      float* masked, double* sums, float* dgamma, float* dbeta) {
    if (block)
      return blocked_sums(x, dy, relu_y, stats, gamma, n, c, spatial, block, masked, sums, dgamma,
                          dbeta);
#pragma omp parallel for num_threads(threads_) if (n * c * spatial >= kParallelMin) schedule(static)
    for (int64_t ch = 0; ch < c; ++ch) {
      double t1 = 0, t2 = 0;
      const float m = stats[ch], is = stats[c + ch];
      for (int64_t s = 0; s < n; ++s) {
        const float* p = x + (s * c + ch) * spatial;
        const float* g = dy + (s * c + ch) * spatial;
        if (relu_y) {
          float* q = masked + (s * c + ch) * spatial;
          cpu::map<math::relu_backward>(relu_y + (s * c + ch) * spatial, g, q, spatial);
          g = q;
        }
        float a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
        for (int64_t i = 0; i < spatial; ++i) {
          a += g[i];
          b += g[i] * math::bn_xhat(p[i], m, is);
        }
        t1 += a;
        t2 += b;
      }
      math::bn_backward_totals(t1, t2, gamma, c, ch, sums, dgamma, dbeta);
    }
  }

  void bn_backward_dx(const float* x, const float* dy, const float* stats, const float* gamma,
                      const double* sums, double m, int64_t n, int64_t c, int64_t spatial,
                      int64_t block, float* dx) override {
    if (block) {
      return each_tile(n, c, spatial, block, [&](int64_t, int64_t ch0, int64_t at) {
        std::array<math::BnDx, kMaxBlock> k;
        for (int64_t j = 0, ch = ch0; j < block; ++j, ++ch)
          k[j] = math::bn_dx_coeffs(stats[ch], stats[c + ch], gamma[ch], sums[ch], sums[c + ch], m);
        cpu::bn_block_dx(k.data(), dy + at, x + at, block, spatial, dx + at);
      });
    }
#pragma omp parallel for num_threads(threads_) if (n * c * spatial >= kParallelMin) schedule(static)
    for (int64_t sc = 0; sc < n * c; ++sc) {
      const int64_t ch = sc % c;
      const float* p = x + sc * spatial;
      const float* g = dy + sc * spatial;
      float* q = dx + sc * spatial;
      cpu::bn_dx_row(
          math::bn_dx_coeffs(stats[ch], stats[c + ch], gamma[ch], sums[ch], sums[c + ch], m), g, p,
          q, spatial);
    }
  }

  void augment(const float* x, float* y, int64_t rows, int64_t c, int64_t h, int64_t w, int64_t pad,
               bool reflect, bool flip, uint64_t seed) override {
    const int64_t f = c * h * w;
#pragma omp parallel for num_threads(threads_) if (rows * f >= kParallelMin) schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
      const AugmentDraw a = augment_draw(seed, n, pad, flip);
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t i = 0; i < h; ++i)
          for (int64_t j = 0; j < w; ++j) {
            const int64_t src = augment_source(a, ch, i, j, h, w, reflect);
            y[n * f + (ch * h + i) * w + j] = src >= 0 ? x[n * f + src] : 0.f;
          }
    }
  }

  void dropout_mask(float* mask, size_t n, double p, uint64_t seed) override {
    const auto len = static_cast<int64_t>(n);
    const float keep = math::dropout_keep(p);
#pragma omp parallel for num_threads(threads_) if (len >= kParallelMin) schedule(static)
    for (int64_t i = 0; i < len; ++i)
      mask[i] = dropout_value(seed, static_cast<uint64_t>(i), p, keep);
  }

  void multiply(const float* x, const float* mask, float* y, size_t n) override {
    elementwise<math::times>(x, mask, y, n);
  }

  void add(const float* a, const float* b, float* y, size_t n) override {
    elementwise<math::plus>(a, b, y, n);
  }
  void add_relu(const float* a, const float* b, float* y, size_t n) override {
    elementwise<math::add_relu>(a, b, y, n);
  }

  void clip_by_norm(const float* x, float* y, size_t n, const double* sumsq,
                    float max_norm) override {
    scale_into(x, math::clip_factor(*sumsq, max_norm), y, n);
  }

  void scale(float* x, size_t n, float a) override {
    scale_into(x, a, x, n);
  }

  // On the calling thread alone: the replicas that fold share the machine's cores already.
  void fold(float* acc, const float* x, size_t n, bool first, float scale) override {
    if (first) {
      for (size_t i = 0; i < n; ++i) acc[i] = math::fold(0.f, x[i], true, scale);
    } else {
      for (size_t i = 0; i < n; ++i) acc[i] = math::fold(acc[i], x[i], false, scale);
    }
  }

  // Fixed chunks of 4096, each summed in 16 interleaved float lanes (independent additions,
  // which the compiler vectorises without reordering anything: 3x faster than double lanes on
  // this path, which runs twice per step), then the lanes and chunks in double in a fixed order:
  // the same bits for any thread count. A lane adds 256 products, so its relative error stays
  // below 256 x 2^-24 = 1.5e-5, far inside the noise scale's own noise.
  void sum_squares(const float* x, size_t n, double* acc) override {
    constexpr int64_t kChunk = 4096, kLanes = 16;
    const auto len = static_cast<int64_t>(n);
    const int64_t chunks = (len + kChunk - 1) / kChunk;
    std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for num_threads(threads_) if (len >= kParallelMin) schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t lo = c * kChunk, hi = std::min(len, lo + kChunk);
      float lane[kLanes] = {};
      int64_t i = lo;
      for (; i + kLanes <= hi; i += kLanes)
        for (int64_t k = 0; k < kLanes; ++k) lane[k] += x[i + k] * x[i + k];
      double sum = 0;
      for (float v : lane) sum += v;
      for (; i < hi; ++i) sum += static_cast<double>(x[i]) * x[i];
      partial[static_cast<size_t>(c)] = sum;
    }
    for (double p : partial) *acc += p;
  }


  void sgd_update(float* p, const float* g, float* buf, size_t n, float lr, float momentum,
                  float wd, bool nesterov) override {
    cpu::split(threads_, static_cast<int64_t>(n), [&](int64_t lo, int64_t hi) {
      cpu::sgd(p + lo, g + lo, buf + lo, hi - lo, lr, momentum, wd, nesterov);
    });
  }

  void adam_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float b1,
                   float b2, float eps, float wd, bool decoupled, int64_t step) override {
    const math::AdamFactors f = math::adam_factors(lr, b1, b2, step);
    cpu::split(threads_, static_cast<int64_t>(n), [&](int64_t lo, int64_t hi) {
      cpu::adam(p + lo, g + lo, m + lo, v + lo, hi - lo, f, b1, b2, eps, wd, decoupled);
    });
  }

 private:
  // dst[i] = F(a[i]) and dst[i] = F(a[i], b[i]), on the replica's threads from kParallelMin
  // elements, each thread's part in the clone for this machine (loops.hpp).
  template <float (*F)(float)>
  void elementwise(const float* a, float* dst, size_t n) {
    cpu::split(threads_, static_cast<int64_t>(n),
               [&](int64_t lo, int64_t hi) { cpu::map<F>(a + lo, dst + lo, hi - lo); });
  }
  template <float (*F)(float, float)>
  void elementwise(const float* a, const float* b, float* dst, size_t n) {
    cpu::split(threads_, static_cast<int64_t>(n),
               [&](int64_t lo, int64_t hi) { cpu::map<F>(a + lo, b + lo, dst + lo, hi - lo); });
  }
  void scale_into(const float* x, float s, float* y, size_t n) {
    cpu::split(threads_, static_cast<int64_t>(n),
               [&](int64_t lo, int64_t hi) { cpu::scale_into(x + lo, s, y + lo, hi - lo); });
  }

  void sgemm1(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) const {
    cpu::sgemm(gemm_lib_, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

#if DTRAIN_HAVE_DNNL
  // A layout change by oneDNN's reorder (one primitive per shape and pair of layouts).
  void dnnl_convert(const float* x, int64_t n, int64_t c, int64_t spatial, int64_t from,
                    int64_t to, float* y) {
    using dnnl::memory;
    const memory::dims dims{n, c, spatial, 1};
    const memory::desc a(dims, memory::data_type::f32, blocked_tag(from)),
        b(dims, memory::data_type::f32, blocked_tag(to));
    const std::array<int64_t, 5> key{n, c, spatial, from, to};
    auto it = converts_.find(key);
    if (it == converts_.end()) {
      try {
        it = converts_.emplace(key, dnnl::reorder(memory(a, eng_, DNNL_MEMORY_NONE),
                                                  memory(b, eng_, DNNL_MEMORY_NONE)))
                 .first;
      } catch (const dnnl::error& e) {
        DTRAIN_THROW_SYSTEM(fmt::format("oneDNN reorder setup failed: {}", e.what()));
      }
    }
    omp_set_num_threads(threads_);
    memory src(a, eng_, const_cast<float*>(x)), dst(b, eng_, y);
    it->second.execute(stream_, src, dst);
    stream_.wait();
  }

  // Whether g is computed with Winograd's algorithm where oneDNN has it (not in emulated bf16,
  // which stands for cuDNN's bf16 convolutions).
  bool winograd(const ConvGeom& g) const {
    return conv_ == CpuConv::onednn && !bf16_ && winograd_suits(g);
  }
  // The block of the layout oneDNN's forward primitive picks for g's output (asked at a batch
  // of 32), if one of 8 or 16 channels that g's channels fill; else 0.
  int64_t dnnl_out_block(const ConvGeom& g) {
    const AnyConv a(g, 32, dnnl::algorithm::convolution_direct);
    try {
      const auto pd = forward_pd(eng_, g, 32, winograd(g));
      for (const int64_t b : {16, 8}) {
        const dnnl::memory::desc blocks(a.dst.dims(), a.kF32, blocked_tag(b));
        if (g.oc % b == 0 && pd.dst_desc() == blocks) return b;
      }
    } catch (const dnnl::error&) {
      // no primitive here: conv_forward says why
    }
    return 0;
  }
  DnnlConv& dnnl_conv(const ConvGeom& g, int64_t n) {
    const auto key = std::make_pair(g, n);
    auto it = convs_.find(key);
    if (it == convs_.end()) {
      try {
        it = convs_.emplace(key, std::make_unique<DnnlConv>(eng_, staging_, g, n, winograd(g)))
                 .first;
      } catch (const dnnl::error& e) {
        DTRAIN_THROW_SYSTEM(fmt::format("oneDNN convolution setup failed: {}", e.what()));
      }
    }
    return *it->second;
  }
  dnnl::engine eng_;
  dnnl::stream stream_;
  DnnlStaging staging_;  // declared before convs_, which refer to it
  std::map<std::pair<ConvGeom, int64_t>, std::unique_ptr<DnnlConv>> convs_;
  std::map<ConvGeom, int64_t> out_blocks_;  // conv_out_block's answers
  std::map<std::array<int64_t, 5>, dnnl::reorder> converts_;  // convert_layout's
#endif
  int threads_;
  CpuConv conv_;
  CpuGemm gemm_lib_;
  bool bf16_;
  bool fuse_;                                                           // CpuOptions::fuse
  std::vector<float> a16_, b16_, x16_, w16_, dy16_, dw16_, zero_bias_;  // bf16 emulation
  std::vector<ConvScratch> scratch_;
  std::vector<math::XentRow> row_results_;  // softmax_xent's, before their ordered sum
  std::vector<float> partial_dw_;
  std::vector<float> bn_part_;  // BatchNorm's per-sample sums in channel blocks
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(const CpuOptions& opt) {
  return std::make_unique<CpuDevice>(opt);
}

bool have_onednn() {
  return DTRAIN_HAVE_DNNL != 0;
}

CpuConv CpuOptions::default_cpu_conv() {
  return have_onednn() ? CpuConv::onednn : CpuConv::im2col;
}

const char* to_string(CpuConv c) {
  switch (c) {
    case CpuConv::onednn:
      return "onednn";
    case CpuConv::onednn_direct:
      return "onednn-direct";
    case CpuConv::im2col:
      break;
  }
  return "im2col";
}

bool uses_onednn(CpuConv c) {
  return c != CpuConv::im2col;
}

bool winograd_suits(const ConvGeom& g) {
  return g.k == 3 && g.stride == 1 && g.pad <= 1 && g.c >= 32 && g.oc >= 32 && g.c % 16 == 0 &&
         g.oc % 16 == 0;
}

std::string onednn_conv_kernel(CpuConv conv, const ConvGeom& g, int64_t n) {
#if DTRAIN_HAVE_DNNL
  if (!uses_onednn(conv)) return "";
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return forward_pd(eng, g, n, conv == CpuConv::onednn && winograd_suits(g)).impl_info_str();
#else
  (void)conv, (void)g, (void)n;
  return "";
#endif
}

bool winograd_available(CpuConv conv) {
  return conv == CpuConv::onednn &&
         onednn_conv_kernel(conv, {32, 8, 8, 32, 3, 1, 1}, 8).find("wino") != std::string::npos;
}

CpuGemm CpuOptions::default_cpu_gemm() {
  return have_onednn() ? CpuGemm::onednn : CpuGemm::openblas;
}

const char* to_string(CpuGemm g) {
  return g == CpuGemm::onednn ? "onednn" : "openblas";
}

std::string cpu_libraries(const CpuOptions& o) {
  return fmt::format("conv {}, gemm {}{}{}", to_string(o.conv), to_string(o.gemm),
                     o.bf16 ? ", bf16 emulated" : "", o.fuse ? "" : ", unfused");
}

namespace {

// The value of the environment variable `name`: "" where unset or empty, one of `onednn` (the
// values that name oneDNN's kernels) where this dtrain has oneDNN, `other` where it names that;
// else a UserError.
std::string onednn_or(const char* name, const std::vector<std::string>& onednn, const char* other) {
  const char* v = std::getenv(name);
  const std::string s = v ? v : "";
  if (s.empty() || s == other) return s;
  if (std::find(onednn.begin(), onednn.end(), s) != onednn.end()) {
    if (!have_onednn())
      throw UserError(fmt::format(
          "{}={}, but this dtrain was built without oneDNN (install libdnnl-dev and rebuild)", name,
          s));
    return s;
  }
  throw UserError(
      fmt::format("{}={}: valid values are {} and {}", name, s, fmt::join(onednn, ", "), other));
}

}  // namespace

CpuConv cpu_conv_from_env() {
  const std::string s = onednn_or("DTRAIN_CPU_CONV", {"onednn", "onednn-direct"}, "im2col");
  if (s.empty()) return CpuOptions::default_cpu_conv();
  if (s == "onednn") return CpuConv::onednn;
  return s == "onednn-direct" ? CpuConv::onednn_direct : CpuConv::im2col;
}

bool cpu_fuse_from_env() {
  const char* v = std::getenv("DTRAIN_CPU_FUSE");
  const std::string s = v ? v : "";
  if (s.empty() || s == "on") return true;
  if (s == "off") return false;
  throw UserError(fmt::format("DTRAIN_CPU_FUSE={}: valid values are on and off", s));
}

CpuGemm cpu_gemm_from_env() {
  const std::string s = onednn_or("DTRAIN_CPU_GEMM", {"onednn"}, "openblas");
  if (s.empty()) return CpuOptions::default_cpu_gemm();
  return s == "onednn" ? CpuGemm::onednn : CpuGemm::openblas;
}

void set_blas_threads(int n) {
  openblas_set_num_threads(std::max(1, n));
}

std::string address_space_shortfall() {
  rlimit lim{};
  if (getrlimit(RLIMIT_AS, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return "";
  // The pages mapped now: the libraries, CUDA's included, and the threads started so far with
  // their OpenBLAS buffers (BUFFER_SIZE, 128 MiB on x86-64), which each worker takes as it
  // starts, before main(). Beside them: the calling thread's buffer (taken at its first
  // product), one for a worker that may not have run yet, and room for dtrain itself.
  long pages = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  constexpr double kMiB = 1024.0 * 1024;
  const double mapped = static_cast<double>(pages) * static_cast<double>(sysconf(_SC_PAGESIZE));
  const int buffers = openblas_get_num_threads() > 1 ? 2 : 1;
  const double need = mapped + buffers * 128 * kMiB + 256 * kMiB;
  const auto limit = static_cast<double>(lim.rlim_cur);
  if (limit >= need) return "";
  return fmt::format(
      "the address-space limit (ulimit -v) is {:.0f} MiB, and dtrain needs at least {:.0f} MiB "
      "to start here: its libraries and threads map {:.0f} MiB, OpenBLAS takes 128 MiB a "
      "thread, and 256 MiB are the least left for work; raise the limit (ulimit -v unlimited)",
      limit / kMiB, need / kMiB, mapped / kMiB);
}

std::string blas_description() {
  return std::string(openblas_get_config()) + " (core " + openblas_get_corename() + ")";
}

}  // namespace dtrain

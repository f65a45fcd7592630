#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numbers>
#include <string>

#include "dtrain/device.hpp"
#include "dtrain/error.hpp"

namespace dtrain {

namespace {

inline float gelu(float x) {
  // tanh approximation (Hendrycks and Gimpel 2016), as GPT-2 and llm.c use.
  constexpr float k = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.f + std::tanh(k * (x + 0.044715f * x * x * x)));
}
inline float gelu_grad(float x) {
  constexpr float k = 0.7978845608028654f;
  const float u = k * (x + 0.044715f * x * x * x);
  const float t = std::tanh(u);
  const float du = k * (1.f + 3.f * 0.044715f * x * x);
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * du;
}

class CpuDevice final : public Device {
 public:
  std::string name() const override { return "cpu"; }

  void* alloc_bytes(size_t bytes) override {
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) DTRAIN_THROW_SYSTEM("out of host memory");
    std::memset(p, 0, rounded);
    return p;
  }
  void free_bytes(void* p) override { std::free(p); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void fill(float* x, size_t n, float v) override { std::fill_n(x, n, v); }

  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
            int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    if (m == 0 || n == 0) return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
                static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
                static_cast<blasint>(ldc));
  }

  void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r) {
      float* row = y + r * cols;
      for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
    }
  }

  void bias_grad(const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate) override {
    if (!accumulate) std::fill_n(db, cols, 0.f);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = dy + r * cols;
      for (int64_t c = 0; c < cols; ++c) db[c] += row[c];
    }
  }

  void activation_forward(Activation a, const float* x, float* y, size_t n) override {
    switch (a) {
      case Activation::relu:
        for (size_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
        break;
      case Activation::tanh:
        for (size_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
        break;
      case Activation::sigmoid:
        for (size_t i = 0; i < n; ++i) y[i] = 1.f / (1.f + std::exp(-x[i]));
        break;
      case Activation::gelu:
        for (size_t i = 0; i < n; ++i) y[i] = gelu(x[i]);
        break;
    }
  }

  void activation_backward(Activation a, const float* x, const float* y, const float* dy, float* dx,
                           size_t n) override {
    switch (a) {
      case Activation::relu:
        for (size_t i = 0; i < n; ++i) dx[i] = x[i] > 0.f ? dy[i] : 0.f;
        break;
      case Activation::tanh:
        for (size_t i = 0; i < n; ++i) dx[i] = dy[i] * (1.f - y[i] * y[i]);
        break;
      case Activation::sigmoid:
        for (size_t i = 0; i < n; ++i) dx[i] = dy[i] * y[i] * (1.f - y[i]);
        break;
      case Activation::gelu:
        for (size_t i = 0; i < n; ++i) dx[i] = dy[i] * gelu_grad(x[i]);
        break;
    }
  }

  void softmax_xent(const float* logits, const int32_t* labels, int64_t rows, int64_t classes,
                    float grad_scale, float* dlogits, double* stats) override {
    double loss = 0.0, correct = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* z = logits + r * classes;
      const int32_t y = labels[r];
      float mx = z[0];
      int64_t arg = 0;
      for (int64_t c = 1; c < classes; ++c)
        if (z[c] > mx) {
          mx = z[c];
          arg = c;
        }
      double sum = 0.0;
      for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c] - mx));
      const double log_sum = std::log(sum);
      loss += log_sum - static_cast<double>(z[y] - mx);
      correct += (arg == y) ? 1.0 : 0.0;
      if (dlogits) {
        float* d = dlogits + r * classes;
        for (int64_t c = 0; c < classes; ++c) {
          const double p = std::exp(static_cast<double>(z[c] - mx) - log_sum);
          d[c] = grad_scale * static_cast<float>(p - (c == y ? 1.0 : 0.0));
        }
      }
    }
    stats[0] += loss;
    stats[1] += correct;
  }

  void gather(const float* src, const int32_t* src_labels, int64_t features, const int64_t* idx,
              int64_t count, float* dst, int32_t* dst_labels) override {
    for (int64_t i = 0; i < count; ++i) {
      std::memcpy(dst + i * features, src + idx[i] * features,
                  static_cast<size_t>(features) * sizeof(float));
      dst_labels[i] = src_labels[idx[i]];
    }
  }

  void im2col(const float* x, int64_t c, int64_t h, int64_t w, int64_t k, int64_t stride,
              int64_t pad, float* col, int64_t ld) override {
    const int64_t ho = (h + 2 * pad - k) / stride + 1, wo = (w + 2 * pad - k) / stride + 1;
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t ki = 0; ki < k; ++ki)
        for (int64_t kj = 0; kj < k; ++kj) {
          float* row = col + ((ch * k + ki) * k + kj) * ld;
          for (int64_t oi = 0; oi < ho; ++oi) {
            const int64_t ii = oi * stride - pad + ki;
            for (int64_t oj = 0; oj < wo; ++oj) {
              const int64_t jj = oj * stride - pad + kj;
              row[oi * wo + oj] =
                  (ii >= 0 && ii < h && jj >= 0 && jj < w) ? x[(ch * h + ii) * w + jj] : 0.f;
            }
          }
        }
  }

  void col2im(const float* col, int64_t ld, int64_t c, int64_t h, int64_t w, int64_t k,
              int64_t stride, int64_t pad, float* dx) override {
    const int64_t ho = (h + 2 * pad - k) / stride + 1, wo = (w + 2 * pad - k) / stride + 1;
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t ki = 0; ki < k; ++ki)
        for (int64_t kj = 0; kj < k; ++kj) {
          const float* row = col + ((ch * k + ki) * k + kj) * ld;
          for (int64_t oi = 0; oi < ho; ++oi) {
            const int64_t ii = oi * stride - pad + ki;
            if (ii < 0 || ii >= h) continue;
            for (int64_t oj = 0; oj < wo; ++oj) {
              const int64_t jj = oj * stride - pad + kj;
              if (jj >= 0 && jj < w) dx[(ch * h + ii) * w + jj] += row[oi * wo + oj];
            }
          }
        }
  }

  void swap_outer(const float* src, int64_t a, int64_t b, int64_t p, float* dst) override {
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < b; ++j)
        std::memcpy(dst + (j * a + i) * p, src + (i * b + j) * p,
                    static_cast<size_t>(p) * sizeof(float));
  }

  void add_channel_bias(float* y, const float* bias, int64_t n, int64_t c,
                        int64_t spatial) override {
    for (int64_t s = 0; s < n; ++s)
      for (int64_t ch = 0; ch < c; ++ch) {
        float* p = y + (s * c + ch) * spatial;
        for (int64_t i = 0; i < spatial; ++i) p[i] += bias[ch];
      }
  }

  void channel_bias_grad(const float* dy, float* db, int64_t n, int64_t c, int64_t spatial,
                         bool accumulate) override {
    if (!accumulate) std::fill_n(db, c, 0.f);
    for (int64_t s = 0; s < n; ++s)
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* p = dy + (s * c + ch) * spatial;
        float acc = 0.f;
        for (int64_t i = 0; i < spatial; ++i) acc += p[i];
        db[ch] += acc;
      }
  }

  void maxpool_forward(const float* x, int64_t n, int64_t c, int64_t h, int64_t w, int64_t k,
                       int64_t stride, float* y, int32_t* argmax) override {
    const int64_t ho = (h - k) / stride + 1, wo = (w - k) / stride + 1;
    for (int64_t p = 0; p < n * c; ++p) {
      const float* xp = x + p * h * w;
      for (int64_t oi = 0; oi < ho; ++oi)
        for (int64_t oj = 0; oj < wo; ++oj) {
          int64_t best = (oi * stride) * w + oj * stride;
          for (int64_t ki = 0; ki < k; ++ki)
            for (int64_t kj = 0; kj < k; ++kj) {
              const int64_t idx = (oi * stride + ki) * w + oj * stride + kj;
              if (xp[idx] > xp[best]) best = idx;
            }
          y[(p * ho + oi) * wo + oj] = xp[best];
          argmax[(p * ho + oi) * wo + oj] = static_cast<int32_t>(best);
        }
    }
  }

  void maxpool_backward(const float* dy, const int32_t* argmax, int64_t n, int64_t c, int64_t h,
                        int64_t w, int64_t k, int64_t stride, float* dx) override {
    const int64_t ho = (h - k) / stride + 1, wo = (w - k) / stride + 1;
    std::fill_n(dx, n * c * h * w, 0.f);
    for (int64_t p = 0; p < n * c; ++p)
      for (int64_t o = 0; o < ho * wo; ++o)
        dx[p * h * w + argmax[p * ho * wo + o]] += dy[p * ho * wo + o];
  }

  void channel_moments(const float* x, int64_t n, int64_t c, int64_t spatial, double* sum,
                       double* sumsq) override {
    std::fill_n(sum, c, 0.0);
    std::fill_n(sumsq, c, 0.0);
    for (int64_t s = 0; s < n; ++s)
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* p = x + (s * c + ch) * spatial;
        double a = 0, b = 0;
        for (int64_t i = 0; i < spatial; ++i) {
          a += p[i];
          b += double(p[i]) * p[i];
        }
        sum[ch] += a;
        sumsq[ch] += b;
      }
  }

  void bn_apply(const float* x, const float* mean, const float* inv_std, const float* gamma,
                const float* beta, int64_t n, int64_t c, int64_t spatial, float* y) override {
    for (int64_t s = 0; s < n; ++s)
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* p = x + (s * c + ch) * spatial;
        float* q = y + (s * c + ch) * spatial;
        const float a = gamma[ch] * inv_std[ch], b = beta[ch] - a * mean[ch];
        for (int64_t i = 0; i < spatial; ++i) q[i] = a * p[i] + b;
      }
  }

  void bn_backward_sums(const float* x, const float* dy, const float* mean, const float* inv_std,
                        const float* gamma, int64_t n, int64_t c, int64_t spatial, double* s1,
                        double* s2, float* dgamma, float* dbeta) override {
    std::fill_n(s1, c, 0.0);
    std::fill_n(s2, c, 0.0);
    for (int64_t s = 0; s < n; ++s)
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* p = x + (s * c + ch) * spatial;
        const float* g = dy + (s * c + ch) * spatial;
        double a = 0, b = 0;
        for (int64_t i = 0; i < spatial; ++i) {
          const double xhat = (double(p[i]) - mean[ch]) * inv_std[ch];
          a += g[i];
          b += double(g[i]) * xhat;
        }
        dbeta[ch] += static_cast<float>(a);
        dgamma[ch] += static_cast<float>(b);
        s1[ch] += a * gamma[ch];
        s2[ch] += b * gamma[ch];
      }
  }

  void bn_backward_dx(const float* x, const float* dy, const float* mean, const float* inv_std,
                      const float* gamma, const double* s1, const double* s2, double m, int64_t n,
                      int64_t c, int64_t spatial, float* dx) override {
    for (int64_t s = 0; s < n; ++s)
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* p = x + (s * c + ch) * spatial;
        const float* g = dy + (s * c + ch) * spatial;
        float* q = dx + (s * c + ch) * spatial;
        const double k = inv_std[ch] / m;
        for (int64_t i = 0; i < spatial; ++i) {
          const double xhat = (double(p[i]) - mean[ch]) * inv_std[ch];
          q[i] = static_cast<float>(k * (m * g[i] * gamma[ch] - s1[ch] - xhat * s2[ch]));
        }
      }
  }

  void multiply(const float* x, const float* mask, float* y, size_t n) override {
    for (size_t i = 0; i < n; ++i) y[i] = x[i] * mask[i];
  }

  void scale(float* x, size_t n, float a) override {
    for (size_t i = 0; i < n; ++i) x[i] *= a;
  }

  void sgd_update(float* p, const float* g, float* buf, size_t n, float lr, float momentum,
                  float wd, bool nesterov) override {
    // PyTorch's SGD semantics: coupled weight decay, momentum buffer without dampening.
    for (size_t i = 0; i < n; ++i) {
      float d = g[i] + wd * p[i];
      if (momentum != 0.f) {
        buf[i] = momentum * buf[i] + d;
        d = nesterov ? d + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * d;
    }
  }

  void adam_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float b1,
                   float b2, float eps, float wd, bool decoupled, int64_t step) override {
    const float bc1 = 1.f - std::pow(b1, static_cast<float>(step));
    const float bc2 = 1.f - std::pow(b2, static_cast<float>(step));
    const float bc2_sqrt = std::sqrt(bc2);
    for (size_t i = 0; i < n; ++i) {
      float d = g[i];
      if (decoupled)
        p[i] *= 1.f - lr * wd;  // AdamW (Loshchilov and Hutter 2019)
      else
        d += wd * p[i];  // Adam with L2 penalty
      m[i] = b1 * m[i] + (1.f - b1) * d;
      v[i] = b2 * v[i] + (1.f - b2) * d * d;
      const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      p[i] -= (lr / bc1) * m[i] / denom;
    }
  }
};

}  // namespace

std::unique_ptr<Device> make_cpu_device() {
  return std::make_unique<CpuDevice>();
}

void set_blas_threads(int n) {
  openblas_set_num_threads(std::max(1, n));
}

std::string blas_description() {
  return std::string(openblas_get_config()) + " (core " + openblas_get_corename() + ")";
}

}  // namespace dtrain

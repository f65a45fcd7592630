#include "dtrain/results/stats.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dtrain {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kPi = 3.14159265358979323846;
// Beyond this many degrees of freedom the t distribution is the normal one to about 1e-8 of a
// quantile, closer than the continued fraction (up to 1e-9 there) keeps.
constexpr double kNormalDf = 1e8;

// The continued fraction of I_x(a, b) (Numerical Recipes' betacf, evaluated with the modified
// Lentz method); converges fast for x < (a + 1) / (a + b + 2).
double beta_fraction(double a, double b, double x) {
  constexpr double tiny = 1e-300, eps = 4e-16;  // within two ulps of 1
  constexpr int max_terms = 20000;
  const auto guard = [](double v) { return std::abs(v) < tiny ? tiny : v; };
  double c = 1, d = 1 / guard(1 - (a + b) * x / (a + 1)), h = d;
  for (int m = 1; m <= max_terms; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((a - 1 + m2) * (a + m2));  // even step
    d = 1 / guard(1 + aa * d);
    c = guard(1 + aa / c);
    h *= d * c;
    aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + 1 + m2));  // odd step
    d = 1 / guard(1 + aa * d);
    c = guard(1 + aa / c);
    const double step = d * c;
    h *= step;
    if (std::abs(step - 1) < eps) break;
  }
  return h;
}

// Stirling's series of log Gamma(z) after its leading terms; for z >= 100 its error is below
// 1e-17.
double stirling_rest(double z) {
  const double z2 = z * z;
  return (1.0 / 12 - (1.0 / 360 - 1.0 / (1260 * z2)) / z2) / z;
}

// log(Gamma(a + b) / (Gamma(a) Gamma(b))). With a large, lgamma(a + b) - lgamma(a) cancels
// most of its digits (lgamma(5e6) is 7e7), so there the difference is taken inside Stirling's
// series instead.
double log_inverse_beta(double a, double b) {
  const double big = std::max(a, b), small = std::min(a, b);
  if (big < 100) return std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b);
  return (big - 0.5) * std::log1p(small / big) + small * std::log(big + small) - small +
         stirling_rest(big + small) - stirling_rest(big) - std::lgamma(small);
}

// I_x(a, b) with y = 1 - x given separately, so that x near 1 keeps its precision.
double beta_xy(double a, double b, double x, double y) {
  if (x <= 0) return 0;
  if (y <= 0) return 1;
  const double log_x = x > 0.5 ? std::log1p(-y) : std::log(x);
  const double log_y = y > 0.5 ? std::log1p(-x) : std::log(y);
  const double log_front = log_inverse_beta(a, b) + a * log_x + b * log_y;
  if (x < (a + 1) / (a + b + 2)) return std::exp(log_front) * beta_fraction(a, b, x) / a;
  return 1 - std::exp(log_front) * beta_fraction(b, a, y) / b;
}

bool bad_df(double df) {
  return std::isnan(df) || df <= 0;
}

// P(T >= t) for t >= 0, and the density there.
double upper_tail(double t, double df) {
  return t_two_sided_p(t, df) / 2;
}

double t_density(double t, double df) {
  if (df > kNormalDf) return std::exp(-t * t / 2) / std::sqrt(2 * kPi);
  return std::exp(std::lgamma((df + 1) / 2) - std::lgamma(df / 2) - 0.5 * std::log(df * kPi) -
                  (df + 1) / 2 * std::log1p(t * t / df));
}

// The t >= 0 with P(T >= t) = q, 0 < q <= 0.5: Newton's method on log P(T >= t), which is
// nearly straight even in the heavy tails of small df, kept inside a bracket by bisection.
double upper_quantile(double q, double df) {
  double lo = 0, hi = 1;
  while (upper_tail(hi, df) > q) {
    lo = hi;
    hi *= 4;
    if (hi > 1e300) return kInf;
  }
  double t = (lo + hi) / 2;
  for (int it = 0; it < 200; ++it) {
    const double tail = upper_tail(t, df);
    if (tail > q)
      lo = t;
    else
      hi = t;
    const double density = t_density(t, df);
    double next = t + (std::log(tail) - std::log(q)) * tail / density;
    if (!(next > lo && next < hi)) next = (lo + hi) / 2;
    const double moved = std::abs(next - t);
    t = next;
    if (moved <= 1e-15 * t || hi - lo <= 1e-15 * hi) break;
  }
  return t;
}

}  // namespace

double incomplete_beta(double a, double b, double x) {
  if (!(a > 0) || !(b > 0) || !(x >= 0 && x <= 1)) return kNaN;  // NaN fails every comparison
  return beta_xy(a, b, x, 1 - x);
}

double t_two_sided_p(double t, double df) {
  if (std::isnan(t) || bad_df(df)) return kNaN;
  if (std::isinf(t)) return 0;
  if (df > kNormalDf) return std::erfc(std::abs(t) / std::sqrt(2.0));
  // P(|T| >= |t|) = I_x(df/2, 1/2) with x = df / (df + t^2); y = 1 - x computed directly.
  const double r = std::abs(t) / std::sqrt(df);
  const double x = r < 1e150 ? 1 / (1 + r * r) : (1 / r) * (1 / r);
  const double y = r < 1e150 ? r * r / (1 + r * r) : 1;
  return beta_xy(df / 2, 0.5, x, y);
}

double t_cdf(double t, double df) {
  const double p = t_two_sided_p(t, df);
  return t > 0 ? 1 - p / 2 : p / 2;
}

double t_quantile(double p, double df) {
  if (std::isnan(p) || bad_df(df) || p < 0 || p > 1) return kNaN;
  if (p == 0) return -kInf;
  if (p == 1) return kInf;
  if (p == 0.5) return 0;
  return p < 0.5 ? -upper_quantile(p, df) : upper_quantile(1 - p, df);
}

namespace {

// Welch's standard error and degrees of freedom for these sds and counts (n >= 2, sds >= 0,
// not both 0). The df is written with the variance shares, so tiny sds do not underflow it.
void welch_se_df(double sd_a, int n_a, double sd_b, int n_b, double& se, double& df) {
  const double va = sd_a * sd_a / n_a, vb = sd_b * sd_b / n_b;
  se = std::sqrt(va + vb);
  const double wa = va / (va + vb), wb = vb / (va + vb);
  df = 1 / (wa * wa / (n_a - 1) + wb * wb / (n_b - 1));
}

bool usable_sd(double sd) {
  return std::isfinite(sd) && sd >= 0;
}

}  // namespace

double min_detectable_difference(double sd_a, int n_a, double sd_b, int n_b, double alpha,
                                 double power) {
  if (n_a < 2 || n_b < 2 || !usable_sd(sd_a) || !usable_sd(sd_b)) return kNaN;
  if (sd_a == 0 && sd_b == 0) return 0;
  double se = 0, df = 0;
  welch_se_df(sd_a, n_a, sd_b, n_b, se, df);
  return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * se;
}

int seeds_needed(double diff, double sd_a, double sd_b, double alpha, double power) {
  if (std::isnan(diff) || !usable_sd(sd_a) || !usable_sd(sd_b)) return 0;
  if (sd_a == 0 && sd_b == 0) return 0;
  const double d = std::abs(diff);
  const auto mdd = [&](int n) { return min_detectable_difference(sd_a, n, sd_b, n, alpha, power); };
  if (!(mdd(kSeedsCap) <= d)) return kSeedsCap + 1;  // diff 0 or infinite lands here too
  int lo = 1, hi = kSeedsCap;                        // mdd(hi) <= d; lo is below every answer
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (mdd(mid) <= d)
      hi = mid;
    else
      lo = mid;
  }
  return hi;
}

WelchTest welch_test(const Sample& a, const Sample& b) {
  WelchTest w;
  w.n_a = a.n;
  w.n_b = b.n;
  const bool means = std::isfinite(a.mean) && std::isfinite(b.mean);
  if (a.n < 2 || b.n < 2) {
    w.kind = WelchTest::Kind::too_few;
    if (means && a.n > 0 && b.n > 0) w.diff = b.mean - a.mean;
    return w;
  }
  if (!means || !usable_sd(a.sd) || !usable_sd(b.sd)) return w;  // invalid
  w.diff = b.mean - a.mean;
  if (a.sd == 0 && b.sd == 0) {
    w.kind = WelchTest::Kind::exact;
    w.se = w.mdd = 0;
    w.ci_low = w.ci_high = w.diff;
    w.distinguishable = w.diff != 0;
    w.p = w.distinguishable ? 0 : 1;
    return w;
  }
  w.kind = WelchTest::Kind::welch;
  welch_se_df(a.sd, a.n, b.sd, b.n, w.se, w.df);
  w.t = w.diff / w.se;
  w.p = t_two_sided_p(w.t, w.df);
  const double half = t_quantile(0.975, w.df) * w.se;
  w.ci_low = w.diff - half;
  w.ci_high = w.diff + half;
  w.distinguishable = w.p < 0.05;
  w.mdd = min_detectable_difference(a.sd, a.n, b.sd, b.n);
  w.seeds_needed = seeds_needed(w.diff, a.sd, b.sd);
  return w;
}

}  // namespace dtrain

namespace dtrain {

BatchLawFit fit_batch_law(const std::vector<double>& batch, const std::vector<double>& steps) {
  BatchLawFit f;
  f.points = static_cast<int>(std::min(batch.size(), steps.size()));
  std::vector<double> distinct;
  for (int i = 0; i < f.points; ++i) {
    const double b = batch[static_cast<size_t>(i)], s = steps[static_cast<size_t>(i)];
    if (!(b > 0 && s > 0 && std::isfinite(b) && std::isfinite(s))) {
      f.why = "a batch or a step count that is not a positive number";
      return f;
    }
    if (std::find(distinct.begin(), distinct.end(), b) == distinct.end()) distinct.push_back(b);
  }
  if (distinct.size() < 3) {
    f.why = "fewer than three batch sizes";
    return f;
  }
  // Weighted least squares of S on x = 1/B with weights 1/S^2: the normal equations.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (int i = 0; i < f.points; ++i) {
    const double x = 1 / batch[static_cast<size_t>(i)], y = steps[static_cast<size_t>(i)];
    const double w = 1 / (y * y);
    sw += w, sx += w * x, sy += w * y, sxx += w * x * x, sxy += w * x * y;
  }
  const double det = sw * sxx - sx * sx;
  const double a = (sxx * sy - sx * sxy) / det, b = (sw * sxy - sx * sy) / det;  // S_min, E_min
  if (!(det > 0) || !(b > 0)) {
    f.why = "the steps do not fall as the batch grows (B_noise <= 0)";
    return f;
  }
  if (!(a > 0)) {
    f.why = "the steps fall as 1/B over the whole range (perfect scaling, S_min <= 0): the "
            "critical batch lies beyond the largest batch run";
    return f;
  }
  double chi2 = 0, rel2 = 0;
  for (int i = 0; i < f.points; ++i) {
    const double y = steps[static_cast<size_t>(i)];
    const double r = y - (a + b / batch[static_cast<size_t>(i)]);
    chi2 += r * r / (y * y);
    rel2 += (r / y) * (r / y);
  }
  // Residual variance per unit weight; its covariance of (a, b).
  const double sigma2 = f.points > 2 ? chi2 / (f.points - 2) : 0;
  const double var_a = sigma2 * sxx / det, var_b = sigma2 * sw / det, cov = -sigma2 * sx / det;
  f.ok = true;
  f.s_min = a;
  f.b_noise = b / a;
  f.s_min_se = std::sqrt(var_a);
  f.b_noise_se = f.b_noise * std::sqrt(std::max(
                                 0.0, var_b / (b * b) + var_a / (a * a) - 2 * cov / (a * b)));
  f.rms_relative = std::sqrt(rel2 / f.points);
  return f;
}

std::vector<double> holm_adjust(const std::vector<double>& p) {
  std::vector<size_t> order;
  for (size_t i = 0; i < p.size(); ++i)
    if (!std::isnan(p[i])) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] < p[b]; });
  std::vector<double> out(p.size(), std::numeric_limits<double>::quiet_NaN());
  const auto m = static_cast<double>(order.size());
  double running = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    running = std::max(running, std::min(1.0, (m - static_cast<double>(k)) * p[order[k]]));
    out[order[k]] = running;
  }
  return out;
}

void holm_correct(const std::vector<WelchTest*>& family, double alpha) {
  std::vector<WelchTest*> tests;
  std::vector<double> p;
  for (WelchTest* w : family)
    if (w && w->kind == WelchTest::Kind::welch) {
      tests.push_back(w);
      p.push_back(w->p);
    }
  const std::vector<double> adjusted = holm_adjust(p);
  for (size_t i = 0; i < tests.size(); ++i) {
    tests[i]->family = static_cast<int>(tests.size());
    tests[i]->p_holm = adjusted[i];
    if (tests.size() > 1) tests[i]->distinguishable = adjusted[i] < alpha;
  }
}

}  // namespace dtrain

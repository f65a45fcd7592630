#pragma once
// Statistics for comparing runs over seeds: Student's t distribution, Welch's two-sample t-test
// from summary statistics, and the power arithmetic that says how many seeds would resolve a
// difference. Pure functions of their arguments: no I/O, no state.
//
// Written here rather than taken from Boost.Math or GSL, which are not dependencies of dtrain:
// the t distribution goes through the regularised incomplete beta function, evaluated with its
// continued fraction (modified Lentz), which agrees with 40-digit mpmath to about 1e-12 for df
// up to 1e4 (1e-10 up to 1e8; beyond, the normal distribution stands in).
#include <limits>
#include <string>
#include <vector>

namespace dtrain {

// The regularised incomplete beta function I_x(a, b), a > 0, b > 0, 0 <= x <= 1; NaN outside.
double incomplete_beta(double a, double b, double x);

// Student's t distribution with df > 0 degrees of freedom (not necessarily whole; df = infinity
// is the standard normal). NaN for NaN arguments or df <= 0.
double t_cdf(double t, double df);
// P(|T| >= |t|): the two-sided p-value of a t statistic, computed without cancellation.
double t_two_sided_p(double t, double df);
// The t with t_cdf(t, df) = p, 0 < p < 1 (-inf at 0, +inf at 1, NaN outside or for bad df).
double t_quantile(double p, double df);

// One side of a comparison: the mean, sample standard deviation and count of its values.
struct Sample {
  double mean = 0, sd = 0;
  int n = 0;
};

// Seeds per side beyond which seeds_needed gives up ("more than 1000").
inline constexpr int kSeedsCap = 1000;

struct WelchTest {
  static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  enum class Kind {
    invalid,  // a NaN or infinite mean or sd, or a negative sd: nothing can be said
    too_few,  // a side with fewer than 2 values: no spread, so no test
    exact,    // both sds are 0: the difference is exact, distinguishable iff it is not 0
    welch,    // Welch's t-test
  };
  Kind kind = Kind::invalid;
  int n_a = 0, n_b = 0;
  // Below, NaN where kind says the number does not exist (all of them in a WelchTest{}).
  double diff = kNaN;  // mean_b - mean_a (NaN for invalid, and too_few without both means)
  double se = kNaN, df = kNaN, t = kNaN;  // standard error of diff, Welch-Satterthwaite df, t
  double p = kNaN;                        // two-sided; 1 or 0 for exact
  double ci_low = kNaN, ci_high = kNaN;   // 95% confidence interval of diff (diff for exact)
  bool distinguishable = false;  // p < 0.05 (welch), diff != 0 (exact); false otherwise
  // The smallest |diff| this test would detect at 95% confidence with 80% power (welch; 0 for
  // exact).
  double mdd = kNaN;
  // Seeds per side that would resolve |diff| at 95% confidence and 80% power with these sds
  // (welch only; 0 where it does not apply, kSeedsCap + 1 for "more than kSeedsCap").
  int seeds_needed = 0;
  // One of a family of comparisons (rows against one baseline): the family's size and this
  // test's Holm-adjusted p (holm_correct); a family of 1 leaves p as it is.
  int family = 1;
  double p_holm = kNaN;
  bool tested() const { return kind == Kind::welch || kind == Kind::exact; }
};

// Welch's two-sample t-test of b against a (the difference is b - a).
WelchTest welch_test(const Sample& a, const Sample& b);

// Holm's step-down correction (Holm 1979) of a family of p-values: sorted ascending, the k-th
// smallest (from 0) is multiplied by m - k, each kept at least as large as the one before and
// at most 1, m being the number of p-values that are not NaN (NaN stays NaN). Controls the
// chance of any false "different" in the family at alpha, without assuming independence.
std::vector<double> holm_adjust(const std::vector<double>& p);
// Sets family and p_holm of each Welch test of the family (others are not counted), and
// distinguishable to p_holm < alpha where the family has more than one.
void holm_correct(const std::vector<WelchTest*>& family, double alpha = 0.05);

// The minimum detectable difference, two-sided at level alpha with the given power:
// (t_{1-alpha/2, df} + t_{power, df}) * se, with se and df Welch's for these sds and counts.
// NaN where a count is below 2 or an sd is negative or not finite; 0 where both sds are 0.
double min_detectable_difference(double sd_a, int n_a, double sd_b, int n_b, double alpha = 0.05,
                                 double power = 0.8);

// The smallest n (the same on both sides, 2 at least) whose minimum detectable difference is at
// most |diff|; kSeedsCap + 1 where even kSeedsCap seeds are not enough (diff 0 say); 0 where
// there is nothing to compute (NaN arguments, both sds 0).
int seeds_needed(double diff, double sd_a, double sd_b, double alpha = 0.05, double power = 0.8);

}  // namespace dtrain

namespace dtrain {

// The batch-size law (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training";
// Shallue et al. 2019 measured it): the optimizer steps S a target takes at batch B follow
// S = S_min (1 + B_noise / B), S_min the fewest steps any batch can take and B_noise the
// critical batch, where steps are twice S_min (and samples twice their own minimum,
// S_min x B_noise). Linear in 1/B: S = S_min + E_min / B with E_min = S_min x B_noise, fitted
// here by least squares weighted by 1/S^2 (relative errors: steps span orders of magnitude).
struct BatchLawFit {
  bool ok = false;
  std::string why;  // when not ok: what the points cannot give
  int points = 0;
  double s_min = 0, b_noise = 0;        // the fit
  double s_min_se = 0, b_noise_se = 0;  // standard errors (the latter by the delta method)
  double rms_relative = 0;              // root mean square of (S - fit) / S over the points
};
// From (batch, steps) points (batch > 0, steps > 0, at least three distinct batches).
BatchLawFit fit_batch_law(const std::vector<double>& batch, const std::vector<double>& steps);

}  // namespace dtrain

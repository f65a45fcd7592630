// The statistics behind `explain --seeds` and `report --by`: Student's t distribution, Welch's
// t-test, the minimum detectable difference and the seeds that would resolve a difference.
//
// Reference values not from a printed table were computed with mpmath at 40 digits (Python,
// mpmath 1.3): the t CDF as betainc(df/2, 1/2, 0, df/(df+t^2), regularized=True) (halved, and
// one minus that for t > 0), quantiles by findroot on that CDF, Welch's se and df from their
// formulas in exact arithmetic.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "dtrain/base/rng.hpp"
#include "dtrain/results/stats.hpp"

using namespace dtrain;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Approx close(double v) {
  return Approx(v).epsilon(1e-12).margin(1e-300);
}

Sample sample_of(const std::vector<double>& xs) {
  double sum = 0;
  for (double x : xs) sum += x;
  const double mean = sum / static_cast<double>(xs.size());
  double sq = 0;
  for (double x : xs) sq += (x - mean) * (x - mean);
  return {mean, std::sqrt(sq / static_cast<double>(xs.size() - 1)), static_cast<int>(xs.size())};
}

}  // namespace

TEST_CASE("stats: t quantiles against the textbook table", "[stats]") {
  CHECK(t_quantile(0.975, 10) == close(2.2281388519862742));  // table: 2.228139
  CHECK(t_quantile(0.975, 1) == close(12.706204736174693));   // table: 12.7062
  CHECK(t_quantile(0.975, kInf) == close(1.9599639845400539));
  CHECK(t_quantile(0.975, 1e5) == close(1.9599877075346093));
  CHECK(t_quantile(0.025, 10) == close(-2.2281388519862742));
  CHECK(t_quantile(0.5, 3) == 0);
  // Degrees of freedom that are not whole numbers (Welch's usually are not).
  CHECK(t_quantile(0.9, 7.3) == close(1.4089223177480422));
  CHECK(t_quantile(0.01, 3.7) == close(-3.9205078192085499));
  CHECK(t_quantile(0, 4) == -kInf);
  CHECK(t_quantile(1, 4) == kInf);
  CHECK(std::isnan(t_quantile(1.5, 4)));
  CHECK(std::isnan(t_quantile(0.9, 0)));
  CHECK(std::isnan(t_quantile(kNaN, 4)));
  CHECK(std::isnan(t_quantile(0.9, kNaN)));
}

TEST_CASE("stats: the t CDF and two-sided p-values", "[stats]") {
  CHECK(t_cdf(2.0, 5) == close(0.94903026058507082));  // table: 0.949030
  CHECK(t_cdf(-2.0, 5) == close(1 - 0.94903026058507082));
  CHECK(t_cdf(1.5, 2.5) == close(0.87608177345685187));
  CHECK(t_cdf(-0.7, 0.6) == close(0.33226903609926831));
  CHECK(t_cdf(0, 9) == 0.5);
  CHECK(t_two_sided_p(0, 9) == 1);
  CHECK(t_two_sided_p(10, 3) == close(0.0021283990584141501));
  // Far in the tail the p-value keeps its digits (no 1 - CDF).
  CHECK(t_two_sided_p(40, 30) == Approx(1.3726045194406403e-27).epsilon(1e-10));
  CHECK(t_two_sided_p(-40, 30) == t_two_sided_p(40, 30));
  CHECK(t_cdf(kInf, 3) == 1);
  CHECK(t_cdf(-kInf, 3) == 0);
  CHECK(t_cdf(1.0, kInf) == close(0.5 * std::erfc(-1 / std::sqrt(2.0))));
  CHECK(std::isnan(t_cdf(kNaN, 3)));
  CHECK(std::isnan(t_cdf(1, -1)));
  // The quantile inverts the CDF, at whole and fractional df.
  for (double df : {0.5, 1.0, 2.7, 10.0, 143.2})
    for (double p : {1e-9, 0.01, 0.3, 0.77, 0.999}) {
      INFO("df " << df << ", p " << p);
      CHECK(t_cdf(t_quantile(p, df), df) == Approx(p).epsilon(1e-11));
    }
  CHECK(incomplete_beta(2.5, 3.5, 0.3) == close(0.29675298929566637832));
  CHECK(incomplete_beta(2, 3, 0) == 0);
  CHECK(incomplete_beta(2, 3, 1) == 1);
  CHECK(std::isnan(incomplete_beta(2, 3, 1.5)));
  CHECK(std::isnan(incomplete_beta(0, 3, 0.5)));
}

TEST_CASE("stats: identical samples give p = 1 and a CI centred on 0", "[stats]") {
  const Sample a = sample_of({0.91, 0.93, 0.88, 0.90});
  const WelchTest w = welch_test(a, a);
  REQUIRE(w.kind == WelchTest::Kind::welch);
  CHECK(w.diff == 0);
  CHECK(w.t == 0);
  CHECK(w.p == 1);
  CHECK(!w.distinguishable);
  CHECK(w.ci_low == Approx(-w.ci_high));
  CHECK(w.ci_high > 0);
  CHECK(w.df == Approx(6));                // equal sds and counts: 2 (n - 1)
  CHECK(w.seeds_needed == kSeedsCap + 1);  // no difference to resolve, at any count
}

TEST_CASE("stats: shifted samples give the expected t, df and p", "[stats]") {
  // 1..5 against 3..7: both sd sqrt(2.5), so se = sqrt(2.5/5 + 2.5/5) = 1, t = 2, df = 8.
  const WelchTest w = welch_test(sample_of({1, 2, 3, 4, 5}), sample_of({3, 4, 5, 6, 7}));
  REQUIRE(w.kind == WelchTest::Kind::welch);
  CHECK(w.diff == Approx(2));
  CHECK(w.se == Approx(1));
  CHECK(w.t == Approx(2));
  CHECK(w.df == Approx(8));
  CHECK(w.p == Approx(0.080516237957262671).epsilon(1e-10));
  CHECK(w.ci_low == Approx(2 - 2.3060041352041661).epsilon(1e-10));
  CHECK(w.ci_high == Approx(2 + 2.3060041352041661).epsilon(1e-10));
  CHECK(!w.distinguishable);  // p 0.08
  CHECK(w.seeds_needed > 5);
  // The other way round: the same test with the sign turned.
  const WelchTest back = welch_test(sample_of({3, 4, 5, 6, 7}), sample_of({1, 2, 3, 4, 5}));
  CHECK(back.diff == Approx(-2));
  CHECK(back.p == Approx(w.p));
  CHECK(back.ci_low == Approx(-w.ci_high));
  // Twice the shift is distinguishable: t = 4 at 8 df.
  const WelchTest far = welch_test(sample_of({1, 2, 3, 4, 5}), sample_of({5, 6, 7, 8, 9}));
  CHECK(far.distinguishable);
  CHECK(far.p < 0.05);
  CHECK(far.ci_low > 0);
}

TEST_CASE("stats: Welch's test with unequal sds and counts", "[stats]") {
  const WelchTest w = welch_test({1.0, 0.5, 3}, {2.0, 0.8, 4});
  REQUIRE(w.kind == WelchTest::Kind::welch);
  CHECK(w.n_a == 3);
  CHECK(w.n_b == 4);
  CHECK(w.diff == Approx(1));
  CHECK(w.se == close(0.49328828623162475));
  CHECK(w.df == close(4.931975937066173));
  CHECK(w.t == close(2.0272121351984577));
  CHECK(w.p == Approx(0.099241711881901357).epsilon(1e-11));
  CHECK(w.ci_low == Approx(-0.27331640937630661).epsilon(1e-11));
  CHECK(w.ci_high == Approx(2.2733164093763066).epsilon(1e-11));
  CHECK(w.mdd == Approx(1.7274893087108592).epsilon(1e-11));
  // Not distinguishable, and consistent: the CI holds 0, |diff| is below the MDD, and more
  // seeds than these would be needed.
  CHECK(!w.distinguishable);
  CHECK(w.ci_low < 0);
  CHECK(std::abs(w.diff) < w.mdd);
  CHECK(w.seeds_needed > 4);
  CHECK(w.seeds_needed == seeds_needed(1.0, 0.5, 0.8));
}

TEST_CASE("stats: the minimum detectable difference shrinks like 1/sqrt(n)", "[stats]") {
  // sd 1 on both sides at n = 10: df 18, se sqrt(0.2).
  CHECK(min_detectable_difference(1, 10, 1, 10) == Approx(1.3250807837888799).epsilon(1e-11));
  // mdd * sqrt(n) falls as the t quantiles fall towards the normal ones, to
  // (1.959964 + 0.841621) * sqrt(2) = 3.962.
  double prev = kInf;
  for (int n : {2, 4, 16, 64, 256, 1024}) {
    const double scaled = min_detectable_difference(1, n, 1, n) * std::sqrt(n);
    INFO("n " << n);
    CHECK(scaled < prev);
    prev = scaled;
  }
  CHECK(prev == Approx((1.9599639845400539 + 0.8416212335729143) * std::sqrt(2.0)).epsilon(2e-3));
  CHECK(min_detectable_difference(1, 400, 1, 400) / min_detectable_difference(1, 100, 1, 100) ==
        Approx(0.5).epsilon(5e-3));  // 0.498: the t quantiles at 198 and 798 df
  // It scales with the sds; it is 0 with no spread and undefined below 2 values.
  CHECK(min_detectable_difference(3, 10, 3, 10) == Approx(3 * 1.3250807837888799));
  CHECK(min_detectable_difference(0, 5, 0, 5) == 0);
  CHECK(std::isnan(min_detectable_difference(1, 1, 1, 5)));
  CHECK(std::isnan(min_detectable_difference(kNaN, 5, 1, 5)));
}

TEST_CASE("stats: seeds_needed for a difference equal to the MDD at n is n", "[stats]") {
  for (int n : {2, 3, 5, 10, 37, 200, kSeedsCap}) {
    INFO("n " << n);
    const double mdd = min_detectable_difference(0.7, n, 1.3, n);
    CHECK(seeds_needed(mdd, 0.7, 1.3) == n);
    CHECK(seeds_needed(-mdd, 0.7, 1.3) == n);  // the sign does not matter
    if (n < kSeedsCap) CHECK(seeds_needed(mdd * 0.999, 0.7, 1.3) == n + 1);
  }
  CHECK(seeds_needed(100, 0.7, 1.3) == 2);  // resolved by the fewest seeds a test takes
  CHECK(seeds_needed(0, 0.7, 1.3) == kSeedsCap + 1);
  CHECK(seeds_needed(1e-6, 0.7, 1.3) == kSeedsCap + 1);
  CHECK(seeds_needed(1, 0, 0) == 0);  // no spread: nothing to resolve with seeds
  CHECK(seeds_needed(kNaN, 1, 1) == 0);
}

TEST_CASE("stats: too few values, no spread and NaN are said, not guessed", "[stats]") {
  const WelchTest one = welch_test({0.9, 0, 1}, {0.8, 0.05, 3});
  CHECK(one.kind == WelchTest::Kind::too_few);
  CHECK(!one.tested());
  CHECK(one.diff == Approx(-0.1));  // the difference is known; its uncertainty is not
  CHECK(std::isnan(one.p));
  CHECK(std::isnan(one.ci_low));
  CHECK(!one.distinguishable);
  CHECK(one.seeds_needed == 0);
  const WelchTest none = welch_test({kNaN, 0, 0}, {0.8, 0.05, 3});
  CHECK(none.kind == WelchTest::Kind::too_few);
  CHECK(std::isnan(none.diff));

  const WelchTest same = welch_test({0.5, 0, 3}, {0.5, 0, 3});
  CHECK(same.kind == WelchTest::Kind::exact);
  CHECK(same.tested());
  CHECK(!same.distinguishable);
  CHECK(same.p == 1);
  CHECK(same.diff == 0);
  const WelchTest apart = welch_test({0.5, 0, 3}, {0.25, 0, 2});
  CHECK(apart.kind == WelchTest::Kind::exact);
  CHECK(apart.distinguishable);
  CHECK(apart.p == 0);
  CHECK(apart.ci_low == -0.25);
  CHECK(apart.ci_high == -0.25);

  for (const Sample& bad :
       {Sample{kNaN, 0.1, 3}, Sample{0.5, kNaN, 3}, Sample{0.5, -1, 3}, Sample{kInf, 0.1, 3}}) {
    const WelchTest w = welch_test({0.5, 0.1, 3}, bad);
    CHECK(w.kind == WelchTest::Kind::invalid);
    CHECK(!w.tested());
    CHECK(!w.distinguishable);
    CHECK(std::isnan(w.diff));
    CHECK(std::isnan(w.p));
  }
  // One side without spread is still a test: the other side's spread carries it (df n - 1).
  const WelchTest half = welch_test({0.5, 0, 4}, {0.6, 0.1, 5});
  CHECK(half.kind == WelchTest::Kind::welch);
  CHECK(half.df == Approx(4));
}

TEST_CASE("the batch-size law's fit recovers S_min and B_noise from steps to target",
          "[stats]") {
  std::vector<double> batch, steps;
  for (double b = 64; b <= 8192; b *= 2) {
    batch.push_back(b);
    steps.push_back(1000 * (1 + 512 / b));  // S_min 1000, B_noise 512
  }
  const BatchLawFit exact = fit_batch_law(batch, steps);
  REQUIRE(exact.ok);
  CHECK(exact.points == 8);
  CHECK(exact.s_min == Approx(1000).epsilon(1e-9));
  CHECK(exact.b_noise == Approx(512).epsilon(1e-9));
  CHECK(exact.s_min_se == Approx(0).margin(1e-6));
  CHECK(exact.rms_relative == Approx(0).margin(1e-12));
  // 5% multiplicative noise, 3 seeds a batch: within three standard errors, which are not 0.
  Rng rng(3);
  std::vector<double> nb, ns;
  for (double b : batch)
    for (int seed = 0; seed < 3; ++seed) {
      nb.push_back(b);
      ns.push_back(1000 * (1 + 512 / b) * (1 + 0.05 * rng.normal()));
    }
  const BatchLawFit noisy = fit_batch_law(nb, ns);
  REQUIRE(noisy.ok);
  CHECK(noisy.s_min_se > 0);
  CHECK(noisy.b_noise_se > 0);
  CHECK(std::abs(noisy.s_min - 1000) < 3 * noisy.s_min_se);
  CHECK(std::abs(noisy.b_noise - 512) < 3 * noisy.b_noise_se);
  CHECK(noisy.rms_relative == Approx(0.05).margin(0.03));
  // What cannot be fitted says why.
  CHECK_FALSE(fit_batch_law({64, 128}, {3000, 2000}).ok);
  CHECK(fit_batch_law({64, 64, 64}, {3000, 2000, 1000}).why == "fewer than three batch sizes");
  CHECK_THAT(fit_batch_law({64, 128, 256}, {1000, 2000, 4000}).why,  // steps grow with B
             Catch::Contains("do not fall"));
  CHECK_THAT(fit_batch_law({64, 128, 256}, {500, 200, 80}).why,  // faster than 1/B
             Catch::Contains("perfect scaling"));
  CHECK_FALSE(fit_batch_law({64, 128, 0}, {1000, 900, 800}).ok);
  CHECK_FALSE(fit_batch_law({64, 128, 256}, {1000, std::nan(""), 800}).ok);
}

TEST_CASE("stats: Holm's correction of a family of p-values", "[stats]") {
  // Sorted 0.01, 0.03, 0.04 of 3: x3, x2 (0.06), x1 kept at least 0.06.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> adjusted = holm_adjust({0.04, 0.01, nan, 0.03});
  REQUIRE(adjusted.size() == 4);
  CHECK(adjusted[0] == Approx(0.06));
  CHECK(adjusted[1] == Approx(0.03));
  CHECK(std::isnan(adjusted[2]));
  CHECK(adjusted[3] == Approx(0.06));
  CHECK(holm_adjust({0.6, 0.7})[1] == 1.0);  // capped at 1
  CHECK(holm_adjust({0.02}) == std::vector<double>{0.02});
  // Three rows against one: the raw p-values say "different" for two, Holm for one.
  WelchTest a, b, c, exact;
  a.kind = b.kind = c.kind = WelchTest::Kind::welch;
  a.p = 0.01, b.p = 0.04, c.p = 0.03;
  a.distinguishable = b.distinguishable = c.distinguishable = true;
  exact.kind = WelchTest::Kind::exact;  // not a p-value: not in the family
  exact.distinguishable = true;
  holm_correct({&a, &b, &c, &exact});
  CHECK(a.family == 3);
  CHECK(a.p_holm == Approx(0.03));
  CHECK(a.distinguishable);
  CHECK_FALSE(b.distinguishable);
  CHECK_FALSE(c.distinguishable);
  CHECK(exact.family == 1);
  CHECK(exact.distinguishable);
  // A family of one changes nothing.
  WelchTest alone;
  alone.kind = WelchTest::Kind::welch;
  alone.p = 0.04;
  alone.distinguishable = true;
  holm_correct({&alone});
  CHECK(alone.distinguishable);
  CHECK(alone.p_holm == Approx(0.04));
}

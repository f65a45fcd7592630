#include "dtrain/results/sweep.hpp"

#include <fmt/format.h>

#include <sstream>

#include "dtrain/base/error.hpp"

namespace dtrain {

bool run_finished(const std::string& status) {
  return status == "done" || status == "diverged";
}

void check_distinct(const std::string& dir, const std::vector<std::string>& planned) {
  for (const auto& d : planned)
    if (d == dir) throw UserError(fmt::format("two runs of this command map to {}", dir));
}

FolderPlan plan_folder(const std::string& dir, const FolderFound& found, bool resume) {
  FolderPlan plan;
  if (!found.exists) return plan;
  if (!resume)
    plan.refusal = fmt::format(
        "{}: run folder already exists; runs are never overwritten (pick another --tag or "
        "--results folder, or pass --resume)",
        dir);
  else if (found.holder)
    plan.refusal =
        fmt::format("{}: another dtrain process{} is writing this run; wait for it to finish", dir,
                    found.holder > 0 ? fmt::format(" (pid {})", found.holder) : "");
  plan.skip = run_finished(found.status);
  // A finished run is only reused for the same experiment, never for a changed one.
  plan.compare = plan.skip && plan.refusal.empty();
  return plan;
}

std::string resume_identity(const std::string& yaml) {
  try {
    Config c = parse_config(yaml, "config.resolved.yaml");
    c.replicas = ReplicaMode::auto_;
    c.train.trace = {};  // a trace observes the run; it changes no result
    c.train.telemetry_ms = TrainConfig{}.telemetry_ms;  // neither does the device sampler
    c.train.checkpoint_steps = 0;                       // nor how often a checkpoint is written
    // nor how long a rank waits for the others, nor how many threads decode images and how
    // far ahead (a sample's crop depends on the seed, epoch and index alone)
    c.train.collective_timeout_s = TrainConfig{}.collective_timeout_s;
    c.data.workers = DataConfig{}.workers;
    c.data.prefetch = DataConfig{}.prefetch;
    return to_yaml(c);
  } catch (const UserError&) {
    return yaml;
  }
}

std::pair<std::string, std::string> first_difference(const std::string& was,
                                                     const std::string& now) {
  std::istringstream a(was), b(now);
  std::string la, lb;
  for (;;) {
    const bool more_a = static_cast<bool>(std::getline(a, la));
    const bool more_b = static_cast<bool>(std::getline(b, lb));
    if (!more_a) la = "(end of file)";
    if (!more_b) lb = "(end of file)";
    if (!more_a || !more_b || la != lb) break;
  }
  const auto trim = [](std::string& t) { t.erase(0, t.find_first_not_of(' ')); };
  trim(la);
  trim(lb);
  return {la, lb};
}

std::string config_differs(const std::string& dir, const std::optional<std::string>& had,
                           const Config& cfg) {
  if (!had)
    return fmt::format(
        "{}: --resume: this finished run has no config.resolved.yaml to compare "
        "with; pick a new --tag",
        dir);
  const std::string want = resume_identity(to_yaml(cfg));
  if (resume_identity(*had) == want) return "";
  const auto [la, lb] = first_difference(resume_identity(*had), want);
  return fmt::format(
      "{}: --resume: this run finished with another config (it has '{}', this command asks "
      "for '{}'); pick a new --tag to run the changed experiment",
      dir, la, lb);
}

std::string unfinished_as(const std::string& status) {
  return status.empty() ? "incomplete" : status;
}

std::string encode_decisions(const std::string& refusal, const std::vector<bool>& skip) {
  std::string text = refusal.empty() ? "" : "E" + refusal;
  if (text.empty())
    for (bool b : skip) text += b ? '1' : '0';
  return text;
}

void decode_decisions(const std::string& text, std::string& refusal, std::vector<bool>& skip) {
  if (!text.empty() && text[0] == 'E')
    refusal = text.substr(1);
  else
    for (size_t i = 0; i < skip.size(); ++i) skip[i] = text[i] == '1';
}

}  // namespace dtrain

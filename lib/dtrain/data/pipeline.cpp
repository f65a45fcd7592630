#include "dtrain/data/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>

#include <fmt/format.h>

#include <system_error>

#include "dtrain/base/error.hpp"

namespace dtrain {

ImagePipeline::ImagePipeline(std::shared_ptr<const ImageFiles> files,
                             const std::vector<int32_t>& labels, int workers, int prefetch,
                             int64_t max_rows)
    : files_(std::move(files)),
      labels_(labels),
      features_(files_->shape.at(0) * files_->shape.at(1) * files_->shape.at(2)),
      slots_(static_cast<size_t>(prefetch) + 1) {
  for (Slot& s : slots_) {
    s.x.resize(static_cast<size_t>(max_rows * features_));
    s.y.resize(static_cast<size_t>(max_rows));
    s.idx.reserve(static_cast<size_t>(max_rows));
  }
  try {
    for (int w = 0; w < workers; ++w) threads_.emplace_back([this] { work(); });
  } catch (const std::system_error& e) {  // out of threads: stop those started, then say so
    shut_down();
    throw SystemError(fmt::format("input pipeline: cannot start {} decode threads ({}); lower "
                                  "data.workers",
                                  workers, e.what()),
                      __FILE__, __LINE__);
  }
}

ImagePipeline::~ImagePipeline() { shut_down(); }

void ImagePipeline::shut_down() {
  {
    const std::lock_guard lock(m_);
    stopping_ = true;
    count_ = 0;
  }
  cancel_ = true;  // what waits for the decode budget gives up
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void ImagePipeline::stop() {
  std::unique_lock lock(m_);
  running_ = false;  // nothing more is claimed or planned
  // Samples still waiting for the decode budget are not decoded: with large images, each
  // taking its turn made a Ctrl-C wait half a minute.
  cancel_ = true;
  done_cv_.wait(lock, [&] { return in_flight_ == 0; });
  cancel_ = false;
  plan_ = nullptr;
}

void ImagePipeline::start(int64_t count, Plan plan, int64_t epoch, uint64_t seed) {
  stop();
  {
    const std::lock_guard lock(m_);
    plan_ = std::move(plan);
    running_ = true;
    count_ = count;
    epoch_ = epoch;
    seed_ = seed;
    next_fill_ = next_take_ = 0;
    for (Slot& s : slots_) s.batch = -1;
  }
  work_cv_.notify_all();
}

bool ImagePipeline::claim(Slot*& slot, int64_t& row) {
  if (!running_) return false;
  const auto n = static_cast<int64_t>(slots_.size());
  // The earliest batch with a sample nobody has taken: batches finish in order.
  for (int64_t b = std::max<int64_t>(0, next_take_ - 1); b < next_fill_; ++b) {
    Slot& s = slots_[static_cast<size_t>(b % n)];
    if (s.batch == b && s.claimed < static_cast<int64_t>(s.idx.size())) {
      slot = &s;
      row = s.claimed++;
      return true;
    }
  }
  // A new batch, while one slot stays with the batch in use.
  if (next_fill_ >= count_ || next_fill_ >= next_take_ + n - 1) return false;
  Slot& s = slots_[static_cast<size_t>(next_fill_ % n)];
  s.batch = next_fill_++;
  s.idx.clear();
  s.claimed = s.done = 0;
  s.error = nullptr;
  try {  // a failure is the batch's, rethrown by next(): a worker thread never throws
    plan_(s.batch, s.idx);
    if (s.idx.size() > s.y.size())
      DTRAIN_THROW_SYSTEM("input pipeline: a batch larger than the pipeline was made for");
  } catch (...) {
    s.idx.clear();
    s.error = std::current_exception();
  }
  if (s.idx.empty()) {  // done at once
    done_cv_.notify_all();
    return claim(slot, row);
  }
  slot = &s;
  row = s.claimed++;
  return true;
}

void ImagePipeline::work() {
  std::unique_lock lock(m_);
  for (;;) {
    Slot* slot = nullptr;
    int64_t row = 0;
    work_cv_.wait(lock, [&] { return stopping_ || claim(slot, row); });
    if (stopping_) return;
    ++in_flight_;
    const int64_t index = slot->idx[static_cast<size_t>(row)];
    const int64_t epoch = epoch_;
    const uint64_t seed = seed_;
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    std::exception_ptr error;
    try {
      make_sample(*files_, index, epoch, seed, slot->x.data() + row * features_, &cancel_);
      slot->y[static_cast<size_t>(row)] = labels_[static_cast<size_t>(index)];
    } catch (const UserError& e) {  // a file that does not decode, met during training
      error = std::make_exception_ptr(UserError(fmt::format(
          "{} (data.on_bad_file: skip checks every file before training and leaves such files "
          "out)",
          e.what())));
    } catch (...) {
      error = std::current_exception();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lock.lock();
    finish_sample(*slot, error, s);
  }
}

void ImagePipeline::finish_sample(Slot& slot, std::exception_ptr error, double seconds) {
  --in_flight_;
  ++decoded_;
  busy_s_ += seconds;
  if (error && !slot.error) slot.error = error;
  ++slot.done;
  done_cv_.notify_all();
}

ImagePipeline::Batch ImagePipeline::next() {
  std::unique_lock lock(m_);
  if (!running_ || next_take_ >= count_)
    DTRAIN_THROW_SYSTEM("input pipeline: no batch left in the sequence");
  const int64_t b = next_take_++;  // the batch in use before is released: its slot refills
  work_cv_.notify_all();
  Slot& s = slots_[static_cast<size_t>(b % static_cast<int64_t>(slots_.size()))];
  done_cv_.wait(lock, [&] {
    return s.batch == b && s.done == static_cast<int64_t>(s.idx.size()) && s.claimed == s.done;
  });
  if (s.error) std::rethrow_exception(s.error);
  return {s.x.data(), s.y.data(), static_cast<int64_t>(s.idx.size())};
}

int64_t ImagePipeline::decoded() const {
  const std::lock_guard lock(m_);
  return decoded_;
}

double ImagePipeline::busy_seconds() const {
  const std::lock_guard lock(m_);
  return busy_s_;
}

double measure_input_rate(const Dataset& train, const DataConfig& d, int workers, int prefetch,
                          int64_t batch, int64_t images) {
  const int64_t n = train.size();
  if (!train.files || n == 0) return 0;
  batch = std::clamp<int64_t>(batch, 1, n);
  const int64_t batches = std::max<int64_t>(1, (images + batch - 1) / batch);
  ImagePipeline p(with_transform(train.files, d), train.y, workers, prefetch, batch);
  // A stride coprime to n visits the set in a scattered order, as a shuffled epoch does.
  int64_t stride = n > 2 ? n / 2 + 1 : 1;
  while (std::gcd(stride, n) != 1) ++stride;
  const auto t0 = std::chrono::steady_clock::now();
  p.start(
      batches,
      [n, batch, stride](int64_t b, std::vector<int64_t>& out) {
        for (int64_t i = 0; i < batch; ++i) out.push_back((b * batch + i) * stride % n);
      },
      0, 1);
  for (int64_t b = 0; b < batches; ++b) p.next();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(batches * batch) / s;
}

}  // namespace dtrain

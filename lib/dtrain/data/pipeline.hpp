#pragma once
// The input pipeline of dataset: folder: `workers` threads decode the samples of the coming
// batches, up to `prefetch` batches ahead of the one in use, into host buffers. A sample's
// pixels depend on (seed, epoch, its index) alone and each is written to its own row, so any
// worker count gives the same batches, bit for bit.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dtrain/data/data.hpp"
#include "dtrain/data/image_folder.hpp"

namespace dtrain {

class ImagePipeline {
 public:
  // Which samples make batch b of a sequence (appended to `out`, which arrives empty).
  using Plan = std::function<void(int64_t b, std::vector<int64_t>& out)>;
  struct Batch {
    const float* x = nullptr;    // rows x features, the samples in plan order
    const int32_t* y = nullptr;  // rows labels
    int64_t rows = 0;
  };

  // `labels`: the dataset's, by sample index; `max_rows`: the most samples a plan puts in a
  // batch.
  ImagePipeline(std::shared_ptr<const ImageFiles> files, const std::vector<int32_t>& labels,
                int workers, int prefetch, int64_t max_rows);
  ~ImagePipeline();
  ImagePipeline(const ImagePipeline&) = delete;
  ImagePipeline& operator=(const ImagePipeline&) = delete;

  // Starts a sequence of `count` batches drawn with epoch `epoch`'s augmentation; what is left
  // of an earlier sequence is dropped. `plan` is called on worker threads until the sequence
  // ends, so what it reads must outlive it (or the next start(), or stop()).
  void start(int64_t count, Plan plan, int64_t epoch, uint64_t seed);
  // The sequence's next batch, once decoded: valid until the next call of next(), start() or
  // stop(). A sample that failed (a file that does not decode) is rethrown here.
  Batch next();
  // Ends the sequence: no more batches are decoded; returns once no worker is inside one.
  void stop();

  // Over the pipeline's life: samples decoded and the seconds workers spent on them.
  int64_t decoded() const;
  double busy_seconds() const;

 private:
  struct Slot {
    int64_t batch = -1;
    std::vector<int64_t> idx;
    std::vector<float> x;
    std::vector<int32_t> y;
    int64_t claimed = 0, done = 0;
    std::exception_ptr error;
  };
  void work();
  void shut_down();  // stops and joins the threads
  // Under the lock: a sample to decode (its slot and row), or false when there is none now.
  bool claim(Slot*& slot, int64_t& row);
  void finish_sample(Slot& slot, std::exception_ptr error, double seconds);

  std::shared_ptr<const ImageFiles> files_;
  const std::vector<int32_t>& labels_;
  const int64_t features_;
  std::vector<Slot> slots_;  // prefetch + 1: batches in flight and the one in use
  mutable std::mutex m_;
  std::condition_variable work_cv_, done_cv_;
  Plan plan_;
  int64_t count_ = 0, epoch_ = 0;
  uint64_t seed_ = 0;
  int64_t next_fill_ = 0;  // the next batch given a slot
  int64_t next_take_ = 0;  // the next batch next() returns
  int in_flight_ = 0;      // samples being decoded now
  bool running_ = false;   // a sequence is under way
  std::atomic<bool> cancel_{false};  // set by stop(): samples waiting to decode give up
  bool stopping_ = false;  // the pipeline is being destroyed
  int64_t decoded_ = 0;
  double busy_s_ = 0;
  std::vector<std::thread> threads_;
};

// Images per second that a pipeline of `workers` threads and `prefetch` batches gives on the
// training set of dataset: folder, as a run would (its crops of epoch 0), over batches of
// `batch` samples spread over the set, `images` in all (rounded up to whole batches), with the
// transform `d` asks for (see with_transform: the data may have been loaded for another run).
double measure_input_rate(const Dataset& train, const DataConfig& d, int workers, int prefetch,
                          int64_t batch, int64_t images);

}  // namespace dtrain

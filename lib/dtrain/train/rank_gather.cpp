#include "dtrain/train/rank_gather.hpp"

#include <algorithm>
#include <cstddef>

namespace dtrain {

std::vector<double> gather(Communicator& comm, const std::vector<double>& mine) {
  // A block of ranks at a time, at most 8 blocks: one all-reduce of every rank's values would
  // hold N x N values at once where the N ranks share a process (4096 replicas: gigabytes),
  // and every block is one more meeting of all ranks. Adding zeros to a value leaves it as it
  // is, so the sums are the values.
  const size_t n = mine.size(), ranks = static_cast<size_t>(comm.size());
  const size_t kBlock = std::max<size_t>(64, (ranks + 7) / 8);
  const auto me = static_cast<size_t>(comm.rank());
  std::vector<double> all, block;
  if (me == 0) all.resize(n * ranks);
  for (size_t first = 0; first < ranks; first += kBlock) {
    const size_t count = std::min(kBlock, ranks - first);
    block.assign(n * count, 0.0);
    if (me >= first && me < first + count)
      std::copy_n(mine.begin(), n, block.begin() + static_cast<std::ptrdiff_t>((me - first) * n));
    comm.allreduce(block.data(), block.size(), ReduceOp::sum);
    if (me == 0)
      std::copy_n(block.begin(), block.size(),
                  all.begin() + static_cast<std::ptrdiff_t>(first * n));
  }
  return all;
}

std::vector<uint64_t> gather_words(Communicator& comm, const std::vector<uint64_t>& mine) {
  std::vector<double> pieces(4 * mine.size());
  for (size_t i = 0; i < mine.size(); ++i)
    for (size_t p = 0; p < 4; ++p)
      pieces[i * 4 + p] = static_cast<double>((mine[i] >> (16 * p)) & 0xffff);
  const std::vector<double> all_pieces = gather(comm, pieces);
  std::vector<uint64_t> all(all_pieces.size() / 4, 0);
  for (size_t i = 0; i < all.size(); ++i)
    for (size_t p = 0; p < 4; ++p)
      all[i] |= static_cast<uint64_t>(all_pieces[i * 4 + p]) << (16 * p);
  return all;
}

uint64_t broadcast_word(Communicator& comm, uint64_t mine) {
  double pieces[4] = {};  // 16 bits each, which a double's sum holds exactly
  if (comm.rank() == 0)
    for (size_t p = 0; p < 4; ++p) pieces[p] = static_cast<double>((mine >> (16 * p)) & 0xffff);
  comm.allreduce(pieces, 4, ReduceOp::sum);
  uint64_t word = 0;
  for (size_t p = 0; p < 4; ++p) word |= static_cast<uint64_t>(pieces[p]) << (16 * p);
  return word;
}

int count_ranks(Communicator& comm, bool yes) {
  double n = yes ? 1.0 : 0.0;
  comm.allreduce(&n, 1, ReduceOp::sum);
  return static_cast<int>(n);
}

}  // namespace dtrain

#pragma once
// Every rank's values, in rank order, on rank 0: what the epoch's metrics, the straggler log,
// the step trace and checkpoints collect from the replicas. Built on the communicator's
// all-reduce (the one collective every communicator has): each rank adds its values into its
// own place in a buffer of zeros, and adding zeros to a value leaves it as it is.
#include <cstdint>
#include <vector>

#include "dtrain/comm/comm.hpp"

namespace dtrain {

// Collective: every rank passes as many values. Rank 0 gets all of them (rank r's at
// r * mine.size()); the other ranks get an empty vector.
std::vector<double> gather(Communicator& comm, const std::vector<double>& mine);

// The same for 64-bit words (random streams, float bits), sent in 16-bit pieces, which doubles
// hold exactly.
std::vector<uint64_t> gather_words(Communicator& comm, const std::vector<uint64_t>& mine);

// Collective: rank 0's `mine` on every rank.
uint64_t broadcast_word(Communicator& comm, uint64_t mine);

// Collective: on every rank, how many ranks passed true.
int count_ranks(Communicator& comm, bool yes);

}  // namespace dtrain

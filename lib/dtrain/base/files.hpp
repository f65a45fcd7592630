#pragma once
// Writing results: files replaced whole, folders created with a clear error, safe names.
#include <cstddef>
#include <optional>
#include <string>

namespace dtrain {

// Replaces `path` atomically and durably (temporary file, fsync, rename, fsync of the folder).
// A full disk or an I/O error is a SystemError; a folder the user cannot write is a UserError.
void write_file_atomic(const std::string& path, const std::string& content);
// Creates `dir` and its parents; a failure is a UserError naming the folder and `what` it is for.
void ensure_dir(const std::string& dir, const std::string& what);
// The contents of a regular file of at most `max_bytes`, for the small files dtrain reads (configs,
// summaries, metrics). Anything else (missing, a folder, a FIFO or device, too large) is a
// UserError naming the path and `what` it was read as; nothing blocks or reads without bound.
std::string read_text_file(const std::string& path, const std::string& what,
                           size_t max_bytes = size_t{64} << 20);
// The same read for files that may be absent or broken without that being an error (a run's
// status while it is written): nothing where read_text_file would throw.
std::optional<std::string> try_read_text_file(const std::string& path,
                                              size_t max_bytes = size_t{64} << 20);
// A filesystem-safe slug: every character but [A-Za-z0-9._+-] becomes '_'.
std::string slug(const std::string& s);

// Bytes the kernel says it can still hand out (MemAvailable in /proc/meminfo), or 0 where it
// does not say.
double available_host_memory();

}  // namespace dtrain

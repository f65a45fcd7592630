#pragma once
// Writing results: files replaced whole, folders created with a clear error, safe names.
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>

namespace dtrain {

// Replaces `path` atomically and durably (temporary file, fsync, rename, fsync of the folder).
// A full disk or an I/O error is a SystemError; a folder the user cannot write is a UserError,
// and so is a path that holds anything but a regular file (a device, a FIFO, a symbolic link,
// a folder: it is never replaced) or an empty path.
void write_file_atomic(const std::string& path, const std::string& content);
// Creates `path`, which must not exist, with `size` bytes, unflushed (for trees of many small
// files, where a flush of each would take minutes); never through a symbolic link. Errors as
// write_file_atomic's: a full disk names itself.
void write_new_file(const std::string& path, const void* data, size_t size);
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
// The files dtrain wrote and reads back (a run's status, summary.json, metrics.csv, checkpoints,
// resolved configs, indexes) are read through these: the same checks, and a symbolic link in
// the file's place is refused (dtrain never writes one, so it was planted: reading through it
// would show another file's contents as the run's). `max_bytes` should be what the file can
// hold; the values read still need their own range checks.
// Bounds from what each of those files can hold.
inline constexpr size_t kMaxStatusBytes = 4096;                 // one word and a newline
// A config file is read up to 1 MiB; written out with every default (config.resolved.yaml) it
// grows (a 528 KB list of 16,000 layers to 1.19 MB), bounded like the summary that repeats it.
inline constexpr size_t kMaxResolvedConfigBytes = size_t{64} << 20;  // a config with every default
inline constexpr size_t kMaxSummaryBytes = size_t{64} << 20;    // the config and per-run values
inline constexpr size_t kMaxMetricsBytes = size_t{64} << 20;    // a row per epoch (<= 100000)
inline constexpr size_t kMaxIndexBytes = size_t{16} << 20;      // a row per run (<= 10000)
std::string read_own_file(const std::string& path, const std::string& what, size_t max_bytes);
std::optional<std::string> try_read_own_file(const std::string& path, size_t max_bytes);
// What `path` is when it is not a regular file once links are followed, as a phrase for an error
// line ("missing", "a symbolic link that loops or leads nowhere", "a folder", "a FIFO", "a
// device", "a socket"); empty for a regular file (or a link to one).
std::string not_regular_file(const std::string& path);
// A filesystem-safe slug: every character but [A-Za-z0-9._+-] becomes '_'.
std::string slug(const std::string& s);
// Folders nested deeper than this below one that dtrain walks (a data folder, a results root)
// are refused: nothing dtrain reads or writes nests so deep, and each level costs the walk
// memory (9,000 levels of empty folders took 4.4 GB).
inline constexpr int kMaxFolderDepth = 64;
// Throws UserError naming `path` as nested too deep below `root`.
[[noreturn]] void refuse_deep_folder(const std::filesystem::path& path, const std::string& root);

// Whether a path names a hidden entry (its name starts with '.'), which folder readers skip.
bool is_hidden(const std::filesystem::path& p);

// Bytes this process can still have: the kernel's MemAvailable (/proc/meminfo), or less where
// an address-space limit (ulimit -v) or a memory cgroup (a container's limit) leaves less; 0
// where none says.
double available_host_memory();

// The room left under the memory limits of the cgroups that hold this process, given the text
// of /proc/self/cgroup and where the cgroup file systems are mounted (/sys/fs/cgroup): v2's
// memory.max less memory.current, v1's memory.limit_in_bytes less memory.usage_in_bytes, at
// each level up to the root, the tightest; page cache the kernel would give back (inactive
// files) counts as room. A negative number where no level has a limit.
double cgroup_memory_room(const std::string& self_cgroup, const std::string& mount_root);

}  // namespace dtrain

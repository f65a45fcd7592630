// Files the way dtrain writes them: whole or not at all, never through a planted link.
#include "dtrain/base/files.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "dtrain/base/error.hpp"

namespace dtrain {

namespace fs = std::filesystem;

namespace {
// errno values that mean the storage, not the user's choice of folder, failed.
bool storage_failure(int err) {
  return err == ENOSPC || err == EDQUOT || err == EIO || err == EFBIG;
}
[[noreturn]] void throw_write_error(const std::string& path, const char* step, int err) {
  const std::string dir = fs::path(path).parent_path().string();
  const std::string what = fmt::format("{}: cannot {} {}: {}{}", dir.empty() ? "." : dir, step,
                                       fs::path(path).filename().string(), std::strerror(err),
                                       err == ENOSPC || err == EDQUOT ? " (disk full)" : "");
  if (storage_failure(err)) throw StorageError(what, __FILE__, __LINE__);
  throw UserError(what);
}
}  // namespace

// Written to PATH.tmp.PID, flushed to the disk, renamed over PATH, and the folder flushed, so
// that after a crash PATH holds either the old or the new content, never a mix. The temporary
// file is created exclusively and never through a symbolic link: a link planted at its name is
// removed, not followed.
void write_file_atomic(const std::string& path, const std::string& content) {
  // Only a regular file is replaced: a rename over a device, a FIFO or a link (/dev/stdout)
  // would put a file in its place.
  if (path.empty()) throw UserError("an empty file name: give the file to write");
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw UserError(fmt::format("{}: not a regular file ({}); dtrain writes a file only where "
                                "there is none or a regular one, and replaces it whole",
                                path,
                                S_ISLNK(st.st_mode)    ? "a symbolic link"
                                : S_ISDIR(st.st_mode)  ? "a folder"
                                : S_ISFIFO(st.st_mode) ? "a FIFO"
                                                       : "a device or socket"));
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(tmp.c_str(), flags, 0644);
  if (fd < 0 && errno == EEXIST && ::unlink(tmp.c_str()) == 0) fd = ::open(tmp.c_str(), flags, 0644);
  if (fd < 0) throw_write_error(path, "create a temporary file for", errno);
  const auto fail = [&](const char* step) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw_write_error(path, step, err);
  };
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("write");
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("flush");
  const int rc = ::close(fd);
  fd = -1;
  if (rc != 0) fail("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("replace");
  // The rename is durable once the folder's entry is on the disk.
  const std::string dir = fs::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_new_file(const std::string& path, const void* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw_write_error(path, "create", errno);
  const auto* bytes = static_cast<const char*>(data);
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw_write_error(path, "write", err);
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) throw_write_error(path, "close", errno);
}

void ensure_dir(const std::string& dir, const std::string& what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    const std::string why = fmt::format(
        "{}: cannot create the {} folder: {}{}", dir, what, ec ? ec.message() : "not a folder",
        ec && (ec.value() == ENOSPC || ec.value() == EDQUOT) ? " (disk full)" : "");
    if (ec && storage_failure(ec.value())) throw StorageError(why, __FILE__, __LINE__);
    throw UserError(why);
  }
}

namespace {
// Opens `path` for reading (O_NONBLOCK: a FIFO cannot block; O_NOFOLLOW where `own`, so a link
// is refused by the open itself) and checks the file it got, not the name: a regular file of at
// most `max_bytes`. Reads it whole; a file that grows meanwhile is cut at `max_bytes`.
std::string read_checked(const std::string& path, const std::string& what, size_t max_bytes,
                         bool own) {
  std::error_code ec;
  const auto lst = fs::symlink_status(path, ec);
  if (ec || !fs::exists(lst)) throw UserError(fmt::format("{}: no such {}", path, what));
  if (own && fs::is_symlink(lst))
    throw UserError(fmt::format("{}: a symbolic link where dtrain wrote its {}; refused (dtrain "
                                "never writes one: it was planted or copied in)",
                                path, what));
  const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (own ? O_NOFOLLOW : 0);
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0)
    throw UserError(fmt::format("{}: cannot open {}: {}", path, what, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UserError(fmt::format("{}: not a regular file (a {} must be one)", path, what));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw UserError(fmt::format("{}: {} bytes, more than the {} bytes a {} may have", path,
                                static_cast<uint64_t>(st.st_size), max_bytes, what));
  }
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw UserError(fmt::format("{}: cannot read {}: {}", path, what, std::strerror(err)));
    }
    if (n == 0 || out.size() + static_cast<size_t>(n) > max_bytes) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}
}  // namespace

std::string read_text_file(const std::string& path, const std::string& what, size_t max_bytes) {
  return read_checked(path, what, max_bytes, false);
}

namespace {
std::optional<std::string> try_read(const std::string& path, size_t max_bytes, bool own) {
  try {
    return read_checked(path, "file", max_bytes, own);
  } catch (const UserError&) {
    return std::nullopt;
  }
}
}  // namespace

std::optional<std::string> try_read_text_file(const std::string& path, size_t max_bytes) {
  return try_read(path, max_bytes, false);
}

std::string read_own_file(const std::string& path, const std::string& what, size_t max_bytes) {
  return read_checked(path, what, max_bytes, true);
}

std::optional<std::string> try_read_own_file(const std::string& path, size_t max_bytes) {
  return try_read(path, max_bytes, true);
}

std::string not_regular_file(const std::string& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (fs::is_regular_file(st)) return "";
  if (!fs::exists(st)) {
    std::error_code lec;
    const bool link = fs::is_symlink(fs::symlink_status(path, lec));
    return link ? "a symbolic link that loops or leads nowhere" : "missing";
  }
  if (fs::is_directory(st)) return "a folder";
  if (fs::is_fifo(st)) return "a FIFO";
  if (fs::is_block_file(st) || fs::is_character_file(st)) return "a device";
  if (fs::is_socket(st)) return "a socket";
  return "not a regular file";
}

void refuse_deep_folder(const std::filesystem::path& path, const std::string& root) {
  throw UserError(fmt::format(
      "{}: folders nest more than {} levels below {}; dtrain walks no deeper (the wrong folder, "
      "or a loop of mounts?)",
      printable(path.string(), true), kMaxFolderDepth, printable(root, true)));
}

bool is_hidden(const std::filesystem::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name.front() == '.';
}

std::string slug(const std::string& s) {
  std::string out;
  for (char ch : s) {
    const bool ok = std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' ||
                    ch == '-' || ch == '+';
    out += ok ? ch : '_';
  }
  return out;
}

namespace {

// The first number after `key` in a /proc or /sys file, times `scale`; 0 where there is none.
double number_in(const char* path, const std::string& key, double scale) {
  std::ifstream in(path);
  std::string word;
  double v = 0;
  while (in >> word)
    if (word == key && in >> v) return v * scale;
  return 0;
}

// One memory cgroup's room: `limit` less `usage` plus its inactive page cache (`stat_key` in
// memory.stat); -1 without a limit (v2 writes "max", v1 a number near 2^63).
double room_in(const fs::path& dir, const char* limit, const char* usage, const char* stat_key) {
  std::ifstream in(dir / limit);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  char* end = nullptr;
  const double max = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !(max > 0) || max >= 0x1p60) return -1;
  std::ifstream u(dir / usage);
  double used = 0;
  if (!(u >> used)) used = 0;
  const double cache = number_in((dir / "memory.stat").c_str(), stat_key, 1);
  return std::max(0.0, max - std::max(0.0, used - cache));
}

}  // namespace

double cgroup_memory_room(const std::string& self_cgroup, const std::string& mount_root) {
  double room = -1;
  const auto tighter = [&](double r) {
    if (r >= 0 && (room < 0 || r < room)) room = r;
  };
  // Each line is "id:controllers:path"; v2's has id 0 and no controllers.
  std::istringstream lines(self_cgroup);
  for (std::string line; std::getline(lines, line);) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    const bool v2 = line.substr(0, a) == "0" && controllers == ",,";
    if (!v2 && controllers.find(",memory,") == std::string::npos) continue;
    const fs::path mount = v2 ? fs::path(mount_root) : fs::path(mount_root) / "memory";
    const fs::path own = fs::path(line.substr(b + 1)).relative_path();
    // Inside a container the mount often shows the process's own cgroup as its root, so the
    // path named may not exist below it: then the levels are the mount's own.
    std::error_code ec;
    fs::path dir = fs::is_directory(mount / own, ec) ? mount / own : mount;
    for (int level = 0; level < 64; ++level) {
      tighter(v2 ? room_in(dir, "memory.max", "memory.current", "inactive_file")
                 : room_in(dir, "memory.limit_in_bytes", "memory.usage_in_bytes",
                           "total_inactive_file"));
      if (dir == mount || !dir.has_relative_path()) break;
      dir = dir.parent_path();
    }
  }
  return room;
}

double available_host_memory() {
  double have = number_in("/proc/meminfo", "MemAvailable:", 1024);
  const auto tighter = [&](double room) {
    if (have <= 0 || room < have) have = room;
  };
  // An address-space limit (ulimit -v) counts what this process has mapped already.
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const double mapped = number_in("/proc/self/status", "VmSize:", 1024);
    const auto limit = static_cast<double>(as.rlim_cur);
    if (limit > mapped) tighter(limit - mapped);
  }
  const auto self = try_read_own_file("/proc/self/cgroup", 1 << 16);
  if (self) {
    const double room = cgroup_memory_room(*self, "/sys/fs/cgroup");
    if (room >= 0) tighter(std::max(room, 1.0));  // 0 would read as "unknown" to callers
  }
  return have;
}

}  // namespace dtrain

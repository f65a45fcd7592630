#pragma once
// Two kinds of failure: a user's mistake (bad config, missing file) and a system failure.
// User mistakes become one clear line and exit code 2 in the CLI; everything else is a bug or
// an environment problem and carries where it happened.
#include <stdexcept>
#include <string>

namespace dtrain {

class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class SystemError : public std::runtime_error {
 public:
  SystemError(const std::string& what, const char* file, int line, int rank = -1);
  const char* file() const { return file_; }
  int line() const { return line_; }
  int rank() const { return rank_; }

 private:
  const char* file_;
  int line_;
  int rank_;
};

// The storage failed under a file dtrain writes (disk full, quota, an I/O error): the machine's
// situation, not a bug. Its message names the folder and the file, without the source location
// (kept in file() and line()).
class StorageError : public SystemError {
 public:
  StorageError(const std::string& what, const char* file, int line)
      : SystemError(what, file, line), plain_(what) {}
  const char* what() const noexcept override { return plain_.c_str(); }

 private:
  std::string plain_;
};

// Thrown in a worker when another worker failed and the collective was abandoned.
class Aborted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown by every replica of a run stopped on request (Ctrl-C, SIGTERM) at a step boundary,
// after its checkpoint is written.
class Interrupted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A JSON parser's exception text as part of one line to a user: "parse error at line 3, column
// 7: syntax error while parsing object key - invalid string: missing closing quote", without
// the library's tag ("[json.exception.parse_error.101] ") and without its quote of the file's
// last bytes (a damaged file's bytes are not echoed to a terminal).
std::string json_error_text(const std::string& what);

// `text` as a terminal or a one-line file may show it: each byte of a C0 control (a newline, an
// escape), DEL, a C1 control (U+0080-U+009F, which some terminals obey as escapes), a mark that
// reorders text (U+202E and the like) or of invalid UTF-8 replaced by '?', or with `hex` by
// \xNN. Everything else, other scripts included, stays as it is.
std::string printable(const std::string& text, bool hex = false);

// Whether `text` holds what printable() hides, invalid UTF-8 aside: a control or a mark that
// reorders text. Never in a name or tag that becomes a folder or file name.
bool has_control_character(const std::string& text);

}  // namespace dtrain

#define DTRAIN_THROW_SYSTEM(msg) throw ::dtrain::SystemError((msg), __FILE__, __LINE__)

#pragma once
// Build identity, recorded in every summary.json. Defined in a file CMake generates, so a new
// commit recompiles one file instead of the library.
namespace dtrain {
extern const char* const kVersion;
extern const char* const kGitSha;
}  // namespace dtrain

// Test helper (header-only): reads a shard in a forked child, so that a crash or hang inside
// libhdf5 becomes an outcome a test can report instead of the end of the test binary.
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <typeinfo>

#include "kernels/base/error.h"
#include "data/shards/shard.h"

namespace packbert::test {

constexpr unsigned kChildSeconds = 10;  // reading a test shard of a few KB never takes this long

enum class Outcome { valid, rejected, other_exception, invalid_sample, wrong_count, crash, hang };

inline const char* to_string(Outcome o) {
  switch (o) {
    case Outcome::valid: return "valid";
    case Outcome::rejected: return "packbert::Error";
    case Outcome::other_exception: return "other exception";
    case Outcome::invalid_sample: return "invalid sample yielded";
    case Outcome::wrong_count: return "wrong sample count";
    case Outcome::crash: return "crash";
    case Outcome::hang: return "hang";
  }
  return "?";
}

// Reads every sample of path in a forked child: exit 0 all valid, 1 packbert::Error, 2 other
// exception, 3 a yielded sample breaks the rules, 4 fewer samples than info() promised.
inline Outcome read_in_child(const std::string& path, std::string* message) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    close(fds[0]);
    alarm(kChildSeconds);
    // A damaged length field must not make the child eat the machine: cap its memory.
    const rlimit mem{rlim_t{4} << 30, rlim_t{4} << 30};
    setrlimit(RLIMIT_AS, &mem);
    const rlimit no_core{0, 0};  // crashes are expected findings, not worth a core dump each
    setrlimit(RLIMIT_CORE, &no_core);
    auto report = [&](int code, const std::string& what) {
      ssize_t unused = write(fds[1], what.data(), what.size());
      (void)unused;
      _exit(code);
    };
    try {
      const SampleRules rules;
      ShardReader reader(path, rules, 16);
      Sample s;
      int64_t n = 0;
      while (reader.next(s)) {
        const std::string problem = check_sample(s, rules);
        if (!problem.empty() || s.id != n)
          report(3, fmt::format("sample {} (id {}): {}", n, s.id, problem));
        ++n;
      }
      if (n != reader.info().num_samples)
        report(4, fmt::format("{} samples read, info says {}", n, reader.info().num_samples));
      report(0, "");
    } catch (const Error& e) {
      report(1, e.what());
    } catch (const std::exception& e) {
      report(2, std::string(typeid(e).name()) + ": " + e.what());
    } catch (...) {
      report(2, "unknown exception");
    }
  }
  close(fds[1]);
  message->clear();
  char buf[4096];
  ssize_t got;
  while ((got = read(fds[0], buf, sizeof buf)) > 0) message->append(buf, static_cast<size_t>(got));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    *message = fmt::format("signal {} ({})", sig, strsignal(sig));
    return sig == SIGALRM ? Outcome::hang : Outcome::crash;
  }
  switch (WEXITSTATUS(status)) {
    case 0: return Outcome::valid;
    case 1: return Outcome::rejected;
    case 3: return Outcome::invalid_sample;
    case 4: return Outcome::wrong_count;
    default: return Outcome::other_exception;
  }
}

}  // namespace packbert::test

// rdmacc-run: a launcher. Starts N ranks on this host with torchrun's
// environment, hosts the TCP store for them (on node 0 of a multi-node job),
// prefixes every output line with the rank (and the host, across hosts), and
// stops everyone on this host as soon as one rank fails.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/config.hpp"
#include "rdmacc/environment.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/store.hpp"
#include "rdmacc/version.hpp"
#include "tools/src/cli.hpp"

namespace {

using Clock = std::chrono::steady_clock;
volatile std::sig_atomic_t gSignal = 0;

void onSignal(int sig) {
  gSignal = sig;
}

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int out = -1;
  int err = -1;
  std::string outBuf, errBuf;
  bool running = true;
  int status = 0;
  // Its process group has no member left: its id (the rank's pid) may name
  // someone else's group from now on, so it is never signalled again.
  bool groupGone = false;
};

void emit(const std::string& prefix, std::string& buf, FILE* to, bool flushAll) {
  size_t start = 0;
  while (true) {
    size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) break;
    fmt::print(to, "{}{}\n", prefix, std::string_view(buf).substr(start, nl - start));
    start = nl + 1;
  }
  buf.erase(0, start);
  if (flushAll && !buf.empty()) {
    fmt::print(to, "{}{}\n", prefix, buf);
    buf.clear();
  }
  std::fflush(to);
}

// A TCP port that is free now (the kernel's choice for port 0). Another
// process may take it before the rank binds it, as with torchrun --standalone.
uint16_t freePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw rdmacc::errnoError(rdmacc::ErrorKind::Store, "socket", errno, "no free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  if (rc == 0) rc = getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int saved = errno;
  close(fd);
  if (rc != 0) throw rdmacc::errnoError(rdmacc::ErrorKind::Store, "bind", saved, "no free port");
  return ntohs(addr.sin_port);
}

int exitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// What the command line asks for, checked.
struct Launch {
  int n = 0;
  int nnodes = 1;
  int nodeRank = 0;
  std::string masterAddr;
  int masterPort = 0;
  int storePort = 0;
  bool prefix = true;
  std::chrono::milliseconds timeout{0};
  std::vector<std::string> program;
  bool multiNode() const { return nnodes > 1; }
};

// Parses and checks the command line: the launch, or the exit status
// (usage errors, --help, --version).
std::variant<Launch, int> parseLaunch(int argc, char** argv) {
  Launch l;
  int& n = l.n;
  int& nnodes = l.nnodes;
  int& nodeRank = l.nodeRank;
  std::string& masterAddr = l.masterAddr;
  int& masterPort = l.masterPort;
  int& storePort = l.storePort;
  bool noPrefix = false;
  CLI::App app(
      "Starts N copies of PROGRAM on this host with RANK, WORLD_SIZE, LOCAL_RANK, "
      "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT set (as torchrun does) and "
      "rdmacc's TCP store hosted by the launcher (RDMACC_AGENT_STORE=1, RDMACC_STORE_PORT; "
      "MASTER_PORT stays free for torch.distributed's store). Across hosts, as torchrun: run it "
      "on every host with the same --nnodes, --master-addr and ports and that host's "
      "--node-rank; node 0's launcher hosts the store. Output lines are prefixed with [rank] "
      "([host:rank] across hosts). Each rank runs in a session of its own, as torchrun's "
      "workers: if a rank fails, the other ranks on this host and everything they started get "
      "SIGTERM (SIGKILL 5 s later; the other hosts' ranks learn of it from rdmacc within the "
      "operation's timeout) and rdmacc-run exits with the failing rank's status; SIGINT or "
      "SIGTERM to rdmacc-run goes on to them; and what a rank leaves running when it exits is "
      "stopped the same way, so nothing outlives the job.",
      "rdmacc-run");
  rdmacc::cli::addVersion(app);
  std::string timeoutText = "0";
  app.add_option("-n,--nproc,--nproc-per-node", n, "ranks to start on this host")
      ->required()
      ->check(CLI::Range(1, 4096));
  app.add_option("--nnodes", nnodes, "hosts in the job (each runs rdmacc-run)")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  app.add_option("--node-rank", nodeRank, "this host's index, 0 .. nnodes-1 (0 hosts the store)")
      ->check(CLI::Range(0, 65534))
      ->capture_default_str();
  app.add_option("--master-addr", masterAddr,
                 "IPv4 address of node 0, reachable from every host (required with --nnodes > "
                 "1; default 127.0.0.1)");
  app.add_option("--master-port", masterPort,
                 "MASTER_PORT for torch.distributed's store (default: 29500 across hosts, a free "
                 "port on one)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--store-port", storePort,
                 "port of rdmacc's store on node 0 (default: master port + 1 across hosts, a "
                 "free port on one)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--timeout", timeoutText,
                 "stop everything when it expires (exit 124): 300 or 300s, 250ms, 5m, 1h; 0: "
                 "never")
      ->check(rdmacc::cli::duration())
      ->capture_default_str();
  app.add_flag("--no-prefix", noPrefix, "do not prefix output lines with [rank]");
  app.prefix_command();  // PROGRAM and everything after it belong to the program
  if (auto status = rdmacc::cli::parse(app, argc, argv)) return *status;
  std::vector<std::string>& program = l.program;
  program = app.remaining();
  // prefix_command() hands the first word it does not know to the program:
  // before "--", an unknown option is a typo of ours, not a program to run.
  if (!program.empty() && program.front() != "--" && program.front().starts_with("-")) {
    fmt::print(stderr,
               "rdmacc-run: unknown option '{}' (see rdmacc-run --help; the program and its "
               "options go after --)\n",
               program.front());
    return rdmacc::cli::kUsage;
  }
  if (!program.empty() && program.front() == "--") program.erase(program.begin());
  if (program.empty()) {
    fmt::print(stderr, "rdmacc-run: no program to start (rdmacc-run -n N -- PROGRAM [ARGS...])\n");
    return rdmacc::cli::kUsage;
  }
  if (nnodes > 1 && masterAddr.empty()) {
    fmt::print(stderr,
               "rdmacc-run: --nnodes {} needs --master-addr: the address of node 0 that every "
               "host reaches (the same on every host)\n",
               nnodes);
    return rdmacc::cli::kUsage;
  }
  if (nodeRank >= nnodes) {
    fmt::print(stderr, "rdmacc-run: --node-rank {} is not below --nnodes {}\n", nodeRank, nnodes);
    return rdmacc::cli::kUsage;
  }
  if (static_cast<int64_t>(nnodes) * n > 65535) {
    fmt::print(stderr, "rdmacc-run: {} hosts x {} ranks is more than rdmacc's 65535 ranks\n",
               nnodes, n);
    return rdmacc::cli::kUsage;
  }
  const bool multiNode = nnodes > 1;
  if (masterAddr.empty()) masterAddr = "127.0.0.1";
  if (multiNode && masterPort == 0) masterPort = 29500;
  if (multiNode && storePort == 0) {
    if (masterPort == 65535) {
      fmt::print(stderr,
                 "rdmacc-run: --master-port 65535 leaves no port for the store: give "
                 "--store-port\n");
      return rdmacc::cli::kUsage;
    }
    storePort = masterPort + 1;
  }
  l.prefix = !noPrefix;
  l.timeout = rdmacc::cli::parseSeconds(timeoutText);
  return l;
}

// The ranks of this host and what watches over them: their output passed
// on with a prefix, their exits reaped, and everyone stopped when one fails,
// on a signal or at the timeout.
class Job {
 public:
  Job(const Launch& launch, std::string host) : launch_(launch), host_(std::move(host)) {}

  // Starts rank `local` of this host with torchrun's environment; false
  // (after saying why) when it cannot.
  bool spawn(int local, const std::vector<std::string>& env) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      fmt::print(stderr, "rdmacc-run: pipe: {}\n", std::strerror(errno));
      return false;
    }
    // Everything the child needs is built before fork(): this process has a
    // store thread, so the child may only make async-signal-safe calls.
    std::vector<std::string> argvStrings = launch_.program;
    std::vector<char*> argv;
    for (auto& arg : argvStrings) argv.push_back(arg.data());
    argv.push_back(nullptr);
    std::vector<std::string> envStrings = env;
    std::vector<char*> envp;
    for (auto& kv : envStrings) envp.push_back(kv.data());
    envp.push_back(nullptr);
    const std::string execFailed = fmt::format(
        "rdmacc-run: cannot execute {} (not found or not executable)\n", launch_.program[0]);
    pid_t pid = fork();
    if (pid < 0) {
      fmt::print(stderr, "rdmacc-run: fork: {}\n", std::strerror(errno));
      return false;
    }
    if (pid == 0) {
      // Its own session (and process group, whose id is its pid): the
      // launcher stops the rank with whatever it started (killpg), and a
      // terminal's Ctrl-C reaches the launcher, which passes it on.
      setsid();
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      signal(SIGPIPE, SIG_DFL);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      execvpe(argv[0], argv.data(), envp.data());
      ssize_t ignored = write(STDERR_FILENO, execFailed.data(), execFailed.size());
      (void)ignored;
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    ranks_.push_back(Rank{
        .rank = launch_.nodeRank * launch_.n + local, .pid = pid, .out = out[0], .err = err[0]});
    ++running_;
    return true;
  }

  // Watches the ranks until all exited; the launcher's exit status.
  int supervise() {
    const auto start = Clock::now();
    Clock::time_point killAt{};
    // After a rank failed, the others get a moment to fail on their own
    // (they usually learn of it within milliseconds) and report it, naming
    // the rank, before they are stopped.
    std::optional<Clock::time_point> stopAt;
    auto stop = [&](int sig, int status) {
      terminateAll(sig);
      terminated_ = true;
      if (status >= 0) result_ = status;
      killAt = Clock::now() + std::chrono::seconds(5);
    };
    while (running_ > 0) {
      if (!pumpOutput()) usleep(20000);
      if (reap() && !stopAt) stopAt = Clock::now() + std::chrono::seconds(1);
      if (stopAt && !terminated_ && Clock::now() >= *stopAt) stop(SIGTERM, -1);
      if (gSignal != 0 && !terminated_) {
        fmt::print(stderr, "rdmacc-run: caught signal {}; stopping all ranks\n",
                   static_cast<int>(gSignal));
        // SIGINT as SIGINT: a Python rank sees KeyboardInterrupt.
        stop(gSignal, 128 + gSignal);
      }
      if (launch_.timeout.count() > 0 && !terminated_ && Clock::now() - start > launch_.timeout) {
        fmt::print(stderr, "rdmacc-run: timed out after {} ms; stopping all ranks\n",
                   launch_.timeout.count());
        stop(SIGTERM, 124);
      }
      if (terminated_ && Clock::now() > killAt) terminateAll(SIGKILL);
    }
    drain();
    return result_;
  }

  // Stops every rank's process group (after a failure of the launch itself).
  void abandon() { terminateAll(SIGKILL); }

 private:
  std::string prefixOf(const Rank& r) const {
    if (!launch_.prefix) return {};
    return launch_.multiNode() ? fmt::format("[{}:{}] ", host_, r.rank)
                               : fmt::format("[{}] ", r.rank);
  }

  // Every rank's process group: the rank and what it started, also after
  // the rank itself exited (its pid stays reserved while the group has a
  // member; once it has none, it is left alone).
  void terminateAll(int sig) {
    for (auto& r : ranks_) {
      if (r.groupGone) continue;
      if (!r.running && kill(-r.pid, 0) != 0 && errno == ESRCH) {
        r.groupGone = true;
        continue;
      }
      kill(-r.pid, sig);
    }
  }

  // Passes on what the ranks wrote, waiting up to 100 ms for it; false once
  // every pipe has closed.
  bool pumpOutput() {
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, bool>> who;  // (rank, isStdout)
    for (auto& r : ranks_) {
      if (r.out >= 0) fds.push_back({r.out, POLLIN, 0}), who.emplace_back(&r, true);
      if (r.err >= 0) fds.push_back({r.err, POLLIN, 0}), who.emplace_back(&r, false);
    }
    if (fds.empty()) return false;
    poll(fds.data(), fds.size(), 100);
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      auto [r, isOut] = who[k];
      char buf[65536];
      ssize_t got = read(fds[k].fd, buf, sizeof buf);
      std::string& b = isOut ? r->outBuf : r->errBuf;
      std::string pfx = prefixOf(*r);
      if (got > 0) {
        b.append(buf, static_cast<size_t>(got));
        emit(pfx, b, isOut ? stdout : stderr, false);
      } else {
        emit(pfx, b, isOut ? stdout : stderr, true);
        close(fds[k].fd);
        (isOut ? r->out : r->err) = -1;
      }
    }
    return true;
  }

  // Collects the ranks that exited; true when the first failure of the job
  // is among them (its status becomes the launcher's).
  bool reap() {
    bool failedNow = false;
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& r : ranks_) {
        if (r.pid != pid || !r.running) continue;
        r.running = false;
        r.status = status;
        --running_;
        if (exitCode(status) != 0 && firstFailure_ < 0 && !terminated_) {
          firstFailure_ = r.rank;
          result_ = exitCode(status);
          fmt::print(stderr, "rdmacc-run: rank {} {} {}; stopping the other ranks{}\n", r.rank,
                     WIFSIGNALED(status) ? "was killed by signal" : "exited with status",
                     WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
                     launch_.multiNode() ? fmt::format(" on {}", host_) : "");
          failedNow = true;
        }
      }
    }
    return failedNow;
  }

  // What the ranks left running (a background child, a server they
  // started) goes with them, as torchrun's workers' process groups do: it
  // would hold the output pipes open and keep this launcher waiting. Then
  // what is left in the pipes, until each closes, for at most the grace
  // before SIGKILL and a moment after it (a process that left the rank's
  // session can hold a pipe for ever).
  void drain() {
    terminateAll(SIGTERM);
    const auto drainStart = Clock::now();
    bool killed = false;
    while (pumpOutput() && Clock::now() - drainStart < std::chrono::seconds(6)) {
      if (!killed && Clock::now() - drainStart > std::chrono::seconds(5)) {
        terminateAll(SIGKILL);
        killed = true;
      }
    }
    for (auto& r : ranks_) {
      for (int* fd : {&r.out, &r.err}) {
        if (*fd < 0) continue;
        emit(prefixOf(r), fd == &r.out ? r.outBuf : r.errBuf, fd == &r.out ? stdout : stderr, true);
        close(*fd);
      }
    }
  }

  const Launch& launch_;
  const std::string host_;
  std::vector<Rank> ranks_;
  int running_ = 0;
  int firstFailure_ = -1;  // rank
  int result_ = 0;
  bool terminated_ = false;
};

// The environment of rank `local` of this host: the launcher's, less what
// describes another launch, plus torchrun's variables and the store's.
std::vector<std::string> rankEnvironment(const Launch& l, int local, bool setOmpThreads) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    std::string_view name = kv.substr(0, kv.find('='));
    if (name == "RANK" || name == "LOCAL_RANK" || name == "WORLD_SIZE" ||
        name == "LOCAL_WORLD_SIZE" || name == "MASTER_ADDR" || name == "MASTER_PORT" ||
        name == "GROUP_RANK" || name == "GROUP_WORLD_SIZE" || name == "RDMACC_AGENT_STORE" ||
        name == "RDMACC_STORE_PORT") {
      continue;
    }
    env.emplace_back(kv);
  }
  env.push_back(fmt::format("RANK={}", l.nodeRank * l.n + local));
  env.push_back(fmt::format("LOCAL_RANK={}", local));
  env.push_back(fmt::format("WORLD_SIZE={}", l.nnodes * l.n));
  env.push_back(fmt::format("LOCAL_WORLD_SIZE={}", l.n));
  env.push_back(fmt::format("GROUP_RANK={}", l.nodeRank));
  env.push_back(fmt::format("GROUP_WORLD_SIZE={}", l.nnodes));
  env.push_back(fmt::format("MASTER_ADDR={}", l.masterAddr));
  env.push_back(fmt::format("MASTER_PORT={}", l.masterPort));
  env.push_back("RDMACC_AGENT_STORE=1");
  env.push_back(fmt::format("RDMACC_STORE_PORT={}", l.storePort));
  if (setOmpThreads) env.push_back("OMP_NUM_THREADS=1");
  return env;
}

}  // namespace

int main(int argc, char** argv) {
  auto parsed = parseLaunch(argc, argv);
  if (const int* status = std::get_if<int>(&parsed)) return *status;
  Launch& launch = std::get<Launch>(parsed);
  // The ranks inherit the RDMACC_* environment: a value none of them would
  // accept stops the launch here, once, instead of in every rank.
  std::optional<rdmacc::Config> config;
  try {
    config = rdmacc::Config::load();
  } catch (const std::exception& e) {
    fmt::print(stderr, "rdmacc-run: {}\n", e.what());
    return rdmacc::cli::kUsage;
  }
  // Several ranks on this host, each with OpenMP's default of one thread per
  // CPU, oversubscribe it: as torchrun, one thread each unless the user chose.
  const bool setOmpThreads = launch.n > 1 && std::getenv("OMP_NUM_THREADS") == nullptr;
  if (setOmpThreads) {
    fmt::print(stderr,
               "rdmacc-run: OMP_NUM_THREADS=1 for each of the {} ranks on this host (set "
               "OMP_NUM_THREADS to choose another number)\n",
               launch.n);
  }
  // Node 0 hosts rdmacc's store at --master-addr (one of its own addresses:
  // a wrong one fails here, not in every rank later).
  std::unique_ptr<rdmacc::TCPStoreServer> store;
  if (launch.nodeRank == 0) {
    try {
      // With RDMACC_AUTH_KEY(_FILE) set, the ranks (which inherit it) must
      // authenticate; a wrong key file stops the launch here.
      store = std::make_unique<rdmacc::TCPStoreServer>(
          launch.masterAddr, static_cast<uint16_t>(launch.storePort), rdmacc::authKey(*config),
          rdmacc::storeServerLimits(*config));
      launch.storePort = store->port();
    } catch (const std::exception& e) {
      fmt::print(stderr,
                 "rdmacc-run: cannot host the store at {}:{}: {}\n(--master-addr must be an "
                 "address of this host, node 0; --store-port a free port)\n",
                 launch.masterAddr, launch.storePort, e.what());
      return 1;
    }
  }
  // MASTER_PORT is left free for torch.distributed, whose rank 0 hosts its
  // own store there (a different protocol); rdmacc's store has its own port.
  if (launch.masterPort == 0) {
    try {
      launch.masterPort = freePort();
    } catch (const std::exception& e) {
      fmt::print(stderr, "rdmacc-run: {}\n", e.what());
      return 1;
    }
  }
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Job job(launch, rdmacc::hostName());
  for (int r = 0; r < launch.n; ++r) {
    if (!job.spawn(r, rankEnvironment(launch, r, setOmpThreads))) {
      job.abandon();
      return 1;
    }
  }
  return job.supervise();
}

// Every RDMACC_* option: its name, type, default, unit, what it does (the
// text docs/configuration.md is generated from) and its range. The parsing
// and the checks are config.cpp's.
#include <array>

#include "rdmacc/config.hpp"

namespace rdmacc {
namespace {

using enum OptionType;

// clang-format off
constexpr std::array kOptions = {
  OptionSpec{"RDMACC_IB_HCA", String, "", "",
    "RDMA device(s) and port(s), as device[:port] or a comma-separated list (e.g. mlx5_0:1,mlx5_1:1): local rank r takes entry r mod n; empty: every active port with an IPv4 address, spread the same way", 0, 0},
  OptionSpec{"RDMACC_SOCKET_IFNAME", String, "", "",
    "network interface whose IPv4 address rdma_cm binds to (e.g. eth0); empty: derived from the device's GID table", 0, 0},
  OptionSpec{"RDMACC_IB_GID_INDEX", Int, "-1", "",
    "GID index; -1: automatic (RoCE v2, IPv4-mapped, matching the bound address)", -1, 65535},
  OptionSpec{"RDMACC_IB_MTU", Int, "0", "bytes",
    "cap on the path MTU (256, 512, 1024, 2048 or 4096); 0: min of both ports' active MTU", 0, 4096},
  OptionSpec{"RDMACC_IB_TIMEOUT", Int, "17", "4.096us*2^n",
    "QP local ACK timeout exponent (17 = 537 ms; UCX waits ~1 s, NCCL 4 s); a soft-RoCE peer acknowledges from a CPU that may be busy for more than 67 ms (14): "
    "shorter timeouts retransmit what arrived, and rxe mishandles such storms; lower it only for faster detection of dead links on hardware HCAs", 1, 31},
  OptionSpec{"RDMACC_IB_RETRY_CNT", Int, "7", "",
    "QP transport retry count before a send fails with IBV_WC_RETRY_EXC_ERR", 0, 7},
  OptionSpec{"RDMACC_IB_RNR_RETRY", Int, "7", "",
    "receiver-not-ready retry count (7 = retry forever)", 0, 7},
  OptionSpec{"RDMACC_IB_MIN_RNR_TIMER", Int, "12", "code",
    "minimum RNR NAK timer code (12 = 0.64 ms)", 0, 31},
  OptionSpec{"RDMACC_IB_TC", Int, "0", "", "traffic class (DSCP << 2) of RoCE packets", 0, 255},
  OptionSpec{"RDMACC_IB_SL", Int, "0", "", "InfiniBand service level", 0, 15},
  OptionSpec{"RDMACC_TRANSPORT", String, "auto", "",
    "how peers are reached: auto (shared memory to the ranks on this host, RDMA to the others; a group "
    "on one host needs no RDMA device), rdma (every peer through the NIC, also on this host), shm "
    "(shared memory only: every rank must be on this host); the same on every rank", 0, 0},
  OptionSpec{"RDMACC_HOST_ID", String, "", "",
    "overrides which ranks count as one host for shared memory (default: hostname, boot id and "
    "namespaces); ranks with equal values share memory (tests that pretend to be several hosts)", 0, 0},
  OptionSpec{"RDMACC_IB_RAILS", Int, "1", "ports",
    "ports (NICs) each rank stripes its RDMA peers' traffic over: collective chunks round-robin over one set of queue pairs per port, point-to-point on the first; "
    "local rank r takes usable ports r, r+1, ... (RDMACC_IB_HCA lists them); every rank of a group must use the same number", 1, 4},
  OptionSpec{"RDMACC_CONNECT", String, "auto", "",
    "when RDMA connections are made, and local peers' shared-memory slots get memory (and, in groups without a one-shot board, their segments are mapped): lazy (to a peer when an operation first sends to it; formation exchanges only addresses), "
    "eager (to every peer at formation; the RDMA one-shot board needs it), auto (eager for groups of up to 8 ranks, lazy above); the same on every rank", 0, 0},
  OptionSpec{"RDMACC_SHARE_CONNECTIONS", Bool, "1", "",
    "1 (the default): a group whose members all belong to an earlier group of theirs (a DeviceMesh's groups, new_group) sends over that group's RDMA connections and slots instead of making its own: no queue pairs or registered memory of its own, its messages about as fast, zero-copy from registered memory as over its own (whose rkeys then open to every rank of that earlier group: docs/security.md), and a one-shot board of its own in a small region each member registers (docs/decisions/019); 0: every group connects on its own (its own queue pairs, slot memory and one-shot board); the same on every rank", 0, 0},
  OptionSpec{"RDMACC_QPS_PER_PEER", Int, "1", "",
    "reliable-connected queue pairs per peer; collective chunks are striped over them (point-to-point "
    "messages keep to the first)", 1, 16},
  OptionSpec{"RDMACC_MEMORY_WINDOWS", Bool, "1", "",
    "RDMA: a peer writes this rank's slots (and one-shot board) through a memory window of type 2 bound to its own queue pairs, so an rkey "
    "another peer leaks is useless to it (docs/security.md); devices without type-2 windows, or 0, use a registration per peer, whose rkey "
    "any queue pair of the group could use", 0, 0},
  OptionSpec{"RDMACC_QP_SEND_DEPTH", Int, "256", "WRs",
    "send queue depth of each queue pair", 16, 16384},
  OptionSpec{"RDMACC_QP_RECV_DEPTH", Int, "256", "WRs",
    "receive queue depth of a queue pair that does not draw from the shared receive queue", 16, 16384},
  OptionSpec{"RDMACC_SRQ", Bool, "1", "",
    "one shared receive queue per group and device (2 x slots + 4 receives per queue pair); 0: RDMACC_QP_RECV_DEPTH per queue pair", 0, 0},
  OptionSpec{"RDMACC_SRQ_PEERS", Int, "64", "peers",
    "queue pairs a lazy group's shared receive queue is made for; another is added when its connections outgrow them", 1, 65536},
  OptionSpec{"RDMACC_SLOTS_PER_PEER", Int, "16", "slots",
    "staging slots per peer and direction: messages in flight to one peer (credits)", 1, 4096},
  OptionSpec{"RDMACC_SLOT_BYTES", Int, "0", "bytes",
    "size of one staging slot (64-byte header + payload); larger transfers are pipelined in chunks of this size; "
    "0: automatic, the largest power of two from 256 KiB down to 16 KiB with 2 x (ranks - 1) x slots x size <= 32 MiB", 0, 1 << 30},
  OptionSpec{"RDMACC_REGISTRATION_CACHE", Bool, "1", "",
    "use memory registered with VerbsBackend::registerMemory for zero-copy sends; 0: always copy through the staging slots", 0, 0},
  OptionSpec{"RDMACC_ZERO_COPY_MIN_BYTES", Int, "16384", "bytes",
    "smallest message payload sent zero-copy from registered memory, and smallest receive written in place by its sender (RDMA: into registered memory; shared memory: see RDMACC_SHM_SINGLE_COPY); smaller ones are copied through the slots", 0, 1 << 30},
  OptionSpec{"RDMACC_SHM_SINGLE_COPY", Bool, "1", "",
    "shared memory: receives of at least RDMACC_ZERO_COPY_MIN_BYTES are written in place by the sending rank with one copy (process_vm_writev, where the kernel permits: "
    "same user, Yama ptrace_scope 0, no seccomp filter against it); 0: every message through the slots (two copies)", 0, 0},
  OptionSpec{"RDMACC_SHM_MEMBARRIER", Bool, "1", "",
    "shared memory: ranks register for membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) and issue one before they sleep, so that senders publish messages without a memory fence "
    "(when every local rank registered); the membarrier interrupts the CPUs that run the group's ranks, only when a rank goes to sleep; 0: a fence on every send instead", 0, 0},
  OptionSpec{"RDMACC_SHM_ONE_SHOT_BYTES", Int, "4096", "bytes",
    "shared memory, every rank of the group on one host: allreduces of up to this size (algorithm auto) are one-shot: each rank posts its input to a board in its own segment "
    "and reduces everyone's in rank order, no messages; must be the same on every rank; 0: off (the auto choice below)", 0, 65536},
  OptionSpec{"RDMACC_RDMA_ONE_SHOT_BYTES", Int, "64", "bytes",
    "RDMA, one rail carrying every peer of the group: allreduces of up to this size (algorithm auto; at most what one inline write carries, 104 bytes with 256 bytes inline) are one-shot: "
    "each rank writes its input into every peer's board with one inline RDMA WRITE and reduces everyone's in rank order as they land (no receive completions); "
    "the group has the board only when every rank offers it; 0: off", 0, 4096},
  OptionSpec{"RDMACC_TREE_MAX_BYTES", Int, "65536", "bytes",
    "auto algorithm choice: allreduce and broadcast up to this size use trees (allreduce in power-of-two groups: recursive doubling), larger ones ring/chain; "
    "allgathers up to this gathered size and reduce_scatters up to this input size go to every rank in one step (linear), larger ones around the ring", 0, int64_t{1} << 40},
  OptionSpec{"RDMACC_TUNE_FILE", String, "", "",
    "tuning table written by rdmacc-tune: the algorithm per collective, world size and size (below RDMACC_ALGO_*)", 0, 0},
  OptionSpec{"RDMACC_ALGO_ALLREDUCE", String, "auto", "",
    "allreduce algorithm: auto, ring (reduce-scatter + allgather), tree (binomial reduce + broadcast), recursive_doubling (power-of-two groups) "
    "or hierarchical (inside each host, across hosts, inside each host again); auto takes hierarchical when some host runs several ranks of a group that spans hosts", 0, 0},
  OptionSpec{"RDMACC_ALGO_BROADCAST", String, "auto", "",
    "broadcast algorithm: auto, ring (pipelined chain), tree (pipelined binomial tree) or hierarchical (a binomial tree over hosts with one inside each host)", 0, 0},
  OptionSpec{"RDMACC_ALGO_REDUCE", String, "auto", "",
    "reduce algorithm: auto, tree (binomial) or hierarchical (a binomial tree over hosts with one inside each host)", 0, 0},
  OptionSpec{"RDMACC_ALGO_BARRIER", String, "auto", "",
    "barrier algorithm: auto, dissemination or hierarchical (arrive at each host's first rank, dissemination among those, release)", 0, 0},
  OptionSpec{"RDMACC_SCRATCH_CACHE_BYTES", Int, "268435456", "bytes",
    "memory of completed operations' scratch buffers (64 KiB and larger: reduce_scatter's partial sums, the packing of gather, scatter, alltoall and the coalesced collectives) kept, at most 16 buffers, for the operations that follow; "
    "0: each is freed with its operation (a new one then costs its page faults every time)", 0, int64_t{1} << 40},
  OptionSpec{"RDMACC_COLLECTIVES_IN_FLIGHT", Int, "8", "",
    "collectives the engine runs at once when the caller issues them without waiting: a later one starts "
    "while earlier ones run if none of them has packing copies and their buffers do not overlap; 1: one at a time", 1, 64},
  OptionSpec{"RDMACC_UNEXPECTED_BYTES", Int, "67108864", "bytes",
    "what a group copies out of its slots, all peers together, for messages no started operation takes (a receive posted after its send, tags received out of order, a collective this rank has not reached), once they hold half of a peer's slots while this rank waits for that peer: the slots go back and the peer can send what this rank waits for; "
    "beyond it such messages keep their slots and the peer waits (a receive order that needs more fails at its timeout); 0: never copy", 0, int64_t{1} << 40},
  OptionSpec{"RDMACC_SPIN_US", String, "auto", "us",
    "how long the progress thread, or a caller in wait(), busy-polls without progress before it "
    "sleeps on the completion channel (0 to 10000000); auto: 50, and 1000 while the oldest operation is "
    "latency-bound (each message fits one slot) for a caller blocked in wait() (its thread has nothing "
    "else to do; past 50 it yields the CPU between polls, and after a first sleep it spins 50 again), "
    "and for the progress thread too while spinning yields the CPU (RDMACC_SPIN_YIELD): then a wake-up "
    "from sleep costs more than a longer spin", 0, 0},
  OptionSpec{"RDMACC_SPIN_YIELD", String, "auto", "",
    "give the CPU away (sched_yield) between polls while spinning: 1, 0, or auto (when this host runs "
    "more ranks of the group than the process may use CPUs, as Open MPI's yield_when_idle)", 0, 0},
  OptionSpec{"RDMACC_KEEPALIVE_INTERVAL", Duration, "1s", "",
    "while an operation waits for a peer over RDMA, the path to it is probed this often (a zero-byte write): a dead link or host fails the operation once the retry budget (RDMACC_IB_TIMEOUT x RDMACC_IB_RETRY_CNT) is spent, not at its timeout; 0: never", 0, 0},
  OptionSpec{"RDMACC_CONNECT_TIMEOUT", Duration, "60s", "",
    "time allowed for every peer to arrive and connect when the group forms, and (lazy) for one connection from its start", 0, 0},
  OptionSpec{"RDMACC_CONNECT_WINDOW", Int, "8", "peers",
    "lazy: peers a rank connects to at once; the others an operation names wait their turn, nearest first", 1, 4096},
  OptionSpec{"RDMACC_STORE_TIMEOUT", Duration, "300s", "",
    "time a store get/wait waits for a key before failing", 0, 0},
  OptionSpec{"RDMACC_TIMEOUT", Duration, "30m", "",
    "default timeout of a collective (c10d's default is 30 minutes)", 0, 0},
  OptionSpec{"RDMACC_STORE_MEMORY", Int, "1073741824", "bytes",
    "what the TCP store server (rank 0 or the launcher) holds at most in keys and values, all clients together, and again in replies not yet sent; a set past it fails for that client", 16 << 20, int64_t{1} << 40},
  OptionSpec{"RDMACC_BOOTSTRAP", String, "auto", "",
    "where rank, size and the rendezvous come from: auto (PMIx when a PMIx launcher such as srun --mpi=pmix or mpirun started the process and rdmacc was built with libpmix-dev, else the launcher's environment), pmix (PMIx or an error), env (RANK/OMPI_*/SLURM_* variables and MASTER_ADDR:MASTER_PORT)", 0, 0},
  OptionSpec{"RDMACC_AGENT_STORE", Bool, "0", "",
    "the launcher hosts the TCP store at MASTER_ADDR:MASTER_PORT (rdmacc-run sets it); else rank 0 hosts it", 0, 0},
  OptionSpec{"RDMACC_STORE_PORT", Int, "0", "",
    "port of the launcher's store when RDMACC_AGENT_STORE=1 (0: MASTER_PORT; rdmacc-run sets it, leaving MASTER_PORT to torch.distributed), or of rank 0's store under PMIx (0: a free port)", 0, 65535},
  OptionSpec{"RDMACC_AUTH_KEY", String, "", "",
    "shared secret of the job: store clients must prove they hold it (challenge-response, HMAC-SHA256) and the secret that rdma_cm connect requests prove (never send) is derived from it; empty: no authentication (see docs/security.md)", 0, 0, true},
  OptionSpec{"RDMACC_AUTH_KEY_FILE", String, "", "",
    "file holding the shared secret instead (mode 600; one line), so that the key is not in every process's environment", 0, 0},
  OptionSpec{"RDMACC_LOG_LEVEL", String, "warn", "",
    "log level: trace, debug, info, warn, error or off", 0, 0},
  OptionSpec{"RDMACC_TRACE_EVENTS", String, "", "",
    "write when each stage of every operation happened (submitted, started, each message posted and each arrival, last step done, finished) to this file when the backend is destroyed, for tools/trace-stages; %r: the rank, %h: the host name, %p: the process id (e.g. /tmp/trace.%r.csv)", 0, 0},
  OptionSpec{"RDMACC_LOG_TIMESTAMPS", Bool, "1", "",
    "begin every log line with the time it was written, UTC to the millisecond (2026-12-03T13:30:01.123Z), so that lines of ranks on different hosts can be ordered", 0, 0},
  OptionSpec{"RDMACC_LOG_FILE", String, "", "",
    "write log lines to this file (appended) instead of stderr; %h: the host name, %p: the process id (one file per rank: /tmp/rdmacc.%h.%p.log)", 0, 0},
};
// clang-format on

}  // namespace

std::span<const OptionSpec> optionTable() noexcept {
  return kOptions;
}

}  // namespace rdmacc

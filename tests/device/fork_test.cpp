// fork() while collectives run (DataLoader workers fork after the group
// formed and memory was registered): the parent's allreduces, through the
// slots and from a registered (zero-copy) buffer, stay right while children
// are forked, write to the heap pages around the parent's buffers (copy on
// write) and exit. Run on every rank of a group: rdmacc-run -n 2 -- PROGRAM.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "rdmacc/backend.hpp"
#include "rdmacc/log.hpp"

int main() {
  using namespace rdmacc;
  auto backend = initFromEnvironment();
  const int rank = backend->getRank(), size = backend->getSize();
  constexpr size_t kSmall = 1024, kLarge = 1 << 20;  // through the slots / zero-copy
  std::vector<float> small(kSmall), large(kLarge);
  backend->registerMemory(large.data(), large.size() * sizeof(float));
  long wrong = 0;
  int children = 0;
  for (int round = 0; round < 40; ++round) {
    for (size_t i = 0; i < kSmall; ++i) small[i] = static_cast<float>(rank + round + i % 7);
    for (size_t i = 0; i < kLarge; ++i) large[i] = static_cast<float>(rank * 2 + i % 5);
    std::vector<Tensor> a{Tensor{small.data(), kSmall, DataType::Float32}};
    std::vector<Tensor> b{Tensor{large.data(), kLarge, DataType::Float32}};
    auto w1 = backend->allreduce(a);
    auto w2 = backend->allreduce(b);
    // A worker forks while the two are in flight, dirties the heap around
    // our buffers (copy-on-write in the child) and leaves.
    const pid_t child = ::fork();
    if (child == 0) {
      std::vector<char> scratch(1 << 20, 'x');
      small[0] = -1;  // the child's own copy
      ::_exit(scratch[100] == 'x' ? 0 : 1);
    }
    if (child > 0) ++children;
    w1->wait();
    w2->wait();
    int status = 0;
    if (child > 0 &&
        (::waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
      std::fprintf(stderr, "rank %d: a forked child failed\n", rank);
      return 1;
    }
    for (size_t i = 0; i < kSmall; ++i) {
      float want = 0;
      for (int r = 0; r < size; ++r) want += static_cast<float>(r + round + i % 7);
      wrong += small[i] != want;
    }
    for (size_t i = 0; i < kLarge; ++i) {
      float want = 0;
      for (int r = 0; r < size; ++r) want += static_cast<float>(r * 2 + i % 5);
      wrong += large[i] != want;
    }
  }
  backend->deregisterMemory(large.data());
  backend->barrier()->wait();
  std::printf("rank %d: %d children forked during collectives, %ld wrong elements\n", rank,
              children, wrong);
  return wrong == 0 && children == 40 ? 0 : 1;
}

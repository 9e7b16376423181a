// Every allocation through the global operator new in this process, on every
// thread (allocation_count.cpp replaces it with a counting one).
#pragma once

#include <cstdint>

namespace rdmacc::test {
uint64_t allocationCount();
}

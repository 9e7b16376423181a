#include "rdmacc/types.hpp"
#include <cstring>

#include "rdmacc/options.hpp"
#include "rdmacc/work.hpp"

namespace rdmacc {

size_t elementSize(DataType dtype) noexcept {
  switch (dtype) {
    case DataType::Float32:
      return 4;
    case DataType::Float64:
      return 8;
    case DataType::Float16:
      return 2;
    case DataType::BFloat16:
      return 2;
    case DataType::Int8:
      return 1;
    case DataType::UInt8:
      return 1;
    case DataType::Int32:
      return 4;
    case DataType::Int64:
      return 8;
    case DataType::Bool:
      return 1;
  }
  return 1;
}

const char* toString(DataType dtype) noexcept {
  switch (dtype) {
    case DataType::Float32:
      return "float32";
    case DataType::Float64:
      return "float64";
    case DataType::Float16:
      return "float16";
    case DataType::BFloat16:
      return "bfloat16";
    case DataType::Int8:
      return "int8";
    case DataType::UInt8:
      return "uint8";
    case DataType::Int32:
      return "int32";
    case DataType::Int64:
      return "int64";
    case DataType::Bool:
      return "bool";
  }
  return "?";
}

const char* toString(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Product:
      return "prod";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::BAnd:
      return "band";
    case ReduceOp::BOr:
      return "bor";
    case ReduceOp::BXor:
      return "bxor";
    case ReduceOp::PreMulSum:
      return "premulsum";
  }
  return "?";
}

bool isFloatingPoint(DataType dtype) noexcept {
  return dtype == DataType::Float32 || dtype == DataType::Float64 || dtype == DataType::Float16 ||
         dtype == DataType::BFloat16;
}

bool supports(ReduceOp op, DataType dtype) noexcept {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Product:
    case ReduceOp::Min:
    case ReduceOp::Max:
      return true;
    case ReduceOp::Avg:
    case ReduceOp::PreMulSum:
      return dtype != DataType::Bool;
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor:
      return !isFloatingPoint(dtype);
  }
  return false;
}

const char* toString(Algorithm algorithm) noexcept {
  switch (algorithm) {
    case Algorithm::Auto:
      return "auto";
    case Algorithm::Ring:
      return "ring";
    case Algorithm::Tree:
      return "tree";
    case Algorithm::Linear:
      return "linear";
    case Algorithm::Pairwise:
      return "pairwise";
    case Algorithm::Dissemination:
      return "dissemination";
    case Algorithm::RecursiveDoubling:
      return "recursive_doubling";
    case Algorithm::Hierarchical:
      return "hierarchical";
  }
  return "?";
}

std::optional<Algorithm> algorithmNamed(std::string_view name) noexcept {
  for (Algorithm a :
       {Algorithm::Auto, Algorithm::Ring, Algorithm::Tree, Algorithm::Linear, Algorithm::Pairwise,
        Algorithm::Dissemination, Algorithm::RecursiveDoubling, Algorithm::Hierarchical}) {
    if (name == toString(a)) return a;
  }
  return std::nullopt;
}

std::span<const Algorithm> algorithmsOf(std::string_view collective) noexcept {
  using A = Algorithm;
  static constexpr A allreduce[] = {A::Ring, A::Tree, A::RecursiveDoubling, A::Hierarchical};
  static constexpr A broadcast[] = {A::Ring, A::Tree, A::Hierarchical};
  static constexpr A reduce[] = {A::Tree, A::Hierarchical};
  static constexpr A barrier[] = {A::Dissemination, A::Hierarchical};
  static constexpr A gathers[] = {A::Ring, A::Linear};  // allgather, reduce_scatter
  static constexpr A alltoall[] = {A::Pairwise, A::Linear};
  if (collective == "allreduce") return allreduce;
  if (collective == "broadcast") return broadcast;
  if (collective == "reduce") return reduce;
  if (collective == "barrier") return barrier;
  if (collective == "allgather" || collective == "reduce_scatter") return gathers;
  if (collective == "alltoall") return alltoall;
  return {};
}

const char* toString(OpType type) noexcept {
  switch (type) {
    case OpType::Broadcast:
      return "broadcast";
    case OpType::Allreduce:
      return "allreduce";
    case OpType::AllreduceCoalesced:
      return "allreduce_coalesced";
    case OpType::Reduce:
      return "reduce";
    case OpType::Allgather:
      return "allgather";
    case OpType::AllgatherBase:
      return "_allgather_base";
    case OpType::AllgatherCoalesced:
      return "allgather_coalesced";
    case OpType::Gather:
      return "gather";
    case OpType::Scatter:
      return "scatter";
    case OpType::ReduceScatter:
      return "reduce_scatter";
    case OpType::ReduceScatterBase:
      return "_reduce_scatter_base";
    case OpType::AlltoallBase:
      return "alltoall_base";
    case OpType::Alltoall:
      return "alltoall";
    case OpType::Send:
      return "send";
    case OpType::Recv:
      return "recv";
    case OpType::RecvAnysource:
      return "recvAnysource";
    case OpType::Barrier:
      return "barrier";
    case OpType::MonitoredBarrier:
      return "monitoredBarrier";
  }
  return "?";
}

double getElement(const Tensor& t, size_t i) {
  const uint8_t* p = static_cast<const uint8_t*>(t.data) + i * elementSize(t.dtype);
  switch (t.dtype) {
    case DataType::Float32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DataType::Float64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DataType::Float16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return halfToFloat(v);
    }
    case DataType::BFloat16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return bfloat16ToFloat(v);
    }
    case DataType::Int8:
      return static_cast<int8_t>(*p);
    case DataType::UInt8:
      return *p;
    case DataType::Int32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DataType::Int64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return static_cast<double>(v);
    }
    case DataType::Bool:
      return *p != 0;
  }
  return 0;
}

void setElement(const Tensor& t, size_t i, double v) {
  uint8_t* p = static_cast<uint8_t*>(t.data) + i * elementSize(t.dtype);
  switch (t.dtype) {
    case DataType::Float32: {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case DataType::Float64:
      std::memcpy(p, &v, 8);
      return;
    case DataType::Float16: {
      uint16_t h = floatToHalf(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      return;
    }
    case DataType::BFloat16: {
      uint16_t h = floatToBfloat16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      return;
    }
    case DataType::Int8:
      *p = static_cast<uint8_t>(static_cast<int8_t>(v));
      return;
    case DataType::UInt8:
      *p = static_cast<uint8_t>(v);
      return;
    case DataType::Int32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      return;
    }
    case DataType::Int64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      return;
    }
    case DataType::Bool:
      *p = v != 0;
      return;
  }
}

}  // namespace rdmacc

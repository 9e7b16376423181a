#include "tensors.hpp"

#include <torch/csrc/distributed/c10d/Types.hpp>

namespace rdmacc_torch {
namespace {

// PREMUL_SUM's tensor factor, if any: a list up to torch 2.0, one tensor since.
template <typename Supplement>
at::Tensor factorTensor(const Supplement& s) {
  if constexpr (requires { s.tensor_factor; }) {
    return s.tensor_factor;
  } else {
    return s.tensor_factors.empty() ? at::Tensor() : s.tensor_factors.front();
  }
}

// Elements per row of dim 0 (c10d's alltoall split sizes count rows).
int64_t rowElements(const at::Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

}  // namespace

// The view rdmacc works on; rejects what rdmacc cannot move in place.
rdmacc::Tensor view(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "rdmacc ", op, ": undefined tensor");
  TORCH_CHECK(t.layout() == at::kStrided, "rdmacc ", op, ": ", t.layout(),
              " tensors are not supported; pass a dense tensor (tensor.to_dense())");
  TORCH_CHECK(t.device().is_cpu(), "rdmacc ", op, ": the tensor is on ", t.device(),
              "; rdmacc moves CPU tensors (call .cpu(), or use the nccl backend for CUDA)");
  TORCH_CHECK(t.is_contiguous(), "rdmacc ", op,
              ": the tensor is not contiguous; pass tensor.contiguous() (and copy the result "
              "back) as with gloo");
  return rdmacc::Tensor{t.data_ptr(), static_cast<size_t>(t.numel()), toDataType(t.scalar_type())};
}

std::vector<rdmacc::Tensor> views(const std::vector<at::Tensor>& tensors, const char* op) {
  std::vector<rdmacc::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(view(t, op));
  return out;
}

std::vector<std::vector<rdmacc::Tensor>> views(const std::vector<std::vector<at::Tensor>>& lists,
                                               const char* op) {
  std::vector<std::vector<rdmacc::Tensor>> out;
  out.reserve(lists.size());
  for (const auto& list : lists) out.push_back(views(list, op));
  return out;
}

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& list : lists) out.insert(out.end(), list.begin(), list.end());
  return out;
}

std::vector<int64_t> splitElements(const std::vector<int64_t>& rows, const at::Tensor& t, int size,
                                   const char* which) {
  if (rows.empty()) {
    const int64_t dim0 = t.dim() == 0 ? 1 : t.size(0);
    TORCH_CHECK(dim0 % size == 0, "rdmacc alltoall_base: the ", which,
                " tensor's first dimension (", dim0, ") does not split evenly over ", size,
                " ranks; pass explicit split sizes");
    return {};
  }
  const int64_t perRow = rowElements(t);
  std::vector<int64_t> out;
  out.reserve(rows.size());
  for (int64_t r : rows) {
    // Checked: a split that overflows int64 would wrap into a plausible size.
    int64_t elements = 0;
    TORCH_CHECK(r >= 0 && !__builtin_mul_overflow(r, perRow, &elements),
                "rdmacc alltoall_base: ", which, " split size ", r, " x ", perRow,
                " elements per row is not a valid size");
    out.push_back(elements);
  }
  return out;
}

rdmacc::DataType toDataType(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return rdmacc::DataType::Float32;
    case at::kDouble:
      return rdmacc::DataType::Float64;
    case at::kHalf:
      return rdmacc::DataType::Float16;
    case at::kBFloat16:
      return rdmacc::DataType::BFloat16;
    case at::kChar:
      return rdmacc::DataType::Int8;
    case at::kByte:
      return rdmacc::DataType::UInt8;
    case at::kInt:
      return rdmacc::DataType::Int32;
    case at::kLong:
      return rdmacc::DataType::Int64;
    case at::kBool:
      return rdmacc::DataType::Bool;
    default:
      TORCH_CHECK(false, "rdmacc: tensors of dtype ", type,
                  " are not supported; use float32, float64, float16, bfloat16, int8, uint8, "
                  "int32, int64 or bool (convert with tensor.to(...))");
  }
}

rdmacc::ReduceOp toReduceOp(const c10d::ReduceOp& op, double* factor) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return rdmacc::ReduceOp::Sum;
    case c10d::ReduceOp::AVG:
      return rdmacc::ReduceOp::Avg;
    case c10d::ReduceOp::PRODUCT:
      return rdmacc::ReduceOp::Product;
    case c10d::ReduceOp::MIN:
      return rdmacc::ReduceOp::Min;
    case c10d::ReduceOp::MAX:
      return rdmacc::ReduceOp::Max;
    case c10d::ReduceOp::BAND:
      return rdmacc::ReduceOp::BAnd;
    case c10d::ReduceOp::BOR:
      return rdmacc::ReduceOp::BOr;
    case c10d::ReduceOp::BXOR:
      return rdmacc::ReduceOp::BXor;
    case c10d::ReduceOp::PREMUL_SUM: {
      const auto* supplement =
          dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(supplement != nullptr,
                  "rdmacc: PREMUL_SUM without a factor; build it with "
                  "torch.distributed._make_nccl_premul_sum(factor)");
      // A double, or a one-element tensor: tensor_factors (a list) up to
      // torch 2.0, tensor_factor since 2.1.
      at::Tensor f = factorTensor(*supplement);
      if (!f.defined()) {
        *factor = supplement->double_factor;
      } else {
        TORCH_CHECK(f.numel() == 1, "rdmacc: a PREMUL_SUM factor tensor must hold one element");
        *factor = f.to(at::kCPU).item<double>();
      }
      return rdmacc::ReduceOp::PreMulSum;
    }
    default:
      TORCH_CHECK(false, "rdmacc: reduce op ", static_cast<int>(op.op_), " is not supported");
  }
}

}  // namespace rdmacc_torch

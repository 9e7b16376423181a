// The translation layer between torch and rdmacc, shared by both plug-in
// points (c10d::Backend on torch >= 2.0, c10d::ProcessGroup on 1.13): at::
// Tensor seen as rdmacc::Tensor (refusing what rdmacc cannot move in place),
// c10d's dtypes and reduce ops as rdmacc's, c10d's alltoall split sizes as
// element counts.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdint>
#include <vector>

#include "rdmacc/types.hpp"

namespace rdmacc_torch {

// at::ScalarType -> rdmacc::DataType; throws c10::Error listing the supported
// types for anything else.
rdmacc::DataType toDataType(at::ScalarType type);

// c10d's ReduceOp -> rdmacc's, with PREMUL_SUM's factor in *factor.
rdmacc::ReduceOp toReduceOp(const c10d::ReduceOp& op, double* factor);

// The view rdmacc works on: a defined, dense, contiguous CPU tensor of a
// supported dtype, or a c10::Error that says what to do (`op` names the call).
rdmacc::Tensor view(const at::Tensor& t, const char* op);
std::vector<rdmacc::Tensor> views(const std::vector<at::Tensor>& tensors, const char* op);
std::vector<std::vector<rdmacc::Tensor>> views(const std::vector<std::vector<at::Tensor>>& lists,
                                               const char* op);
std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists);

// c10d's alltoall split sizes (rows of dim 0) as element counts, checked;
// empty when `rows` is (an even split, which dim 0 must allow).
std::vector<int64_t> splitElements(const std::vector<int64_t>& rows, const at::Tensor& t, int size,
                                   const char* which);

}  // namespace rdmacc_torch

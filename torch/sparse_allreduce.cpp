// allreduce of a sparse COO tensor (SUM), as gloo offers it: every rank's
// coalesced indices and values are all-gathered (the counts first, then both
// padded to the largest count), summed by coalescing, and copied into the
// caller's tensor. Runs to completion in the calling thread; the Work it
// returns is complete.
#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "process_group.hpp"

namespace rdmacc_torch {

c10::intrusive_ptr<c10d::Work> BackendRdmacc::allreduceSparse(at::Tensor& tensor,
                                                              const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM,
              "rdmacc allreduce: sparse tensors are reduced with SUM only (as with gloo); for "
              "another op pass a dense tensor (tensor.to_dense())");
  TORCH_CHECK(tensor.device().is_cpu(), "rdmacc allreduce: the sparse tensor is on ",
              tensor.device(), "; rdmacc moves CPU tensors");
  const at::Tensor input = tensor.coalesce();
  const at::Tensor indices = input._indices().contiguous();  // [sparse dims, nnz], int64
  const at::Tensor values = input._values().contiguous();    // [nnz, dense dims...]
  const int64_t n = size_;
  const rdmacc::AllgatherOptions gather{.timeout = opts.timeout};
  auto allgather = [&](const at::Tensor& out, const at::Tensor& in) {
    rdmacc::Tensor o = view(out, "allreduce (sparse)"), i = view(in, "allreduce (sparse)");
    core()._allgather_base(o, i, gather)->wait();
  };
  // Every rank's count of entries.
  const at::Tensor counts = at::empty({n}, at::kLong);
  allgather(counts, at::full({1}, input._nnz(), at::kLong));
  const auto* count = counts.data_ptr<int64_t>();
  int64_t most = 0;
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(count[r] >= 0 && count[r] <= (int64_t{1} << 40), "rdmacc allreduce (sparse): rank ",
                r, " announced ", count[r], " entries");
    most = std::max(most, count[r]);
  }
  // Indices and values, padded to the largest count.
  auto padded = [&](const at::Tensor& t, int64_t dim) {
    std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    shape[static_cast<size_t>(dim)] = most;
    at::Tensor p = at::zeros(shape, t.options());
    p.narrow(dim, 0, t.size(dim)).copy_(t);
    return p;
  };
  const at::Tensor myIndices = padded(indices, 1), myValues = padded(values, 0);
  std::vector<int64_t> indexShape{n, indices.size(0), most};
  std::vector<int64_t> valueShape{n, most};
  valueShape.insert(valueShape.end(), values.sizes().begin() + 1, values.sizes().end());
  const at::Tensor allIndices = at::empty(indexShape, indices.options());
  const at::Tensor allValues = at::empty(valueShape, values.options());
  allgather(allIndices, myIndices);
  allgather(allValues, myValues);
  std::vector<at::Tensor> indexParts, valueParts;
  for (int64_t r = 0; r < n; ++r) {
    indexParts.push_back(allIndices[r].narrow(1, 0, count[r]));
    valueParts.push_back(allValues[r].narrow(0, 0, count[r]));
    // A peer's indices are hostile input: sparse_coo_tensor does not check
    // them, and one past this tensor's sizes would be written out of bounds.
    for (int64_t d = 0; d < indices.size(0); ++d) {
      const at::Tensor row = indexParts.back()[d];
      const at::Tensor bad = row.lt(0).logical_or(row.ge(input.size(d))).nonzero();
      TORCH_CHECK(bad.numel() == 0, "rdmacc allreduce (sparse): rank ", r, " sent index ",
                  bad.numel() == 0 ? 0 : row[bad[0][0].item<int64_t>()].item<int64_t>(),
                  " in dimension ", d, ", outside this rank's tensor of sizes ", input.sizes(),
                  ": every rank must pass a sparse tensor of the same sizes");
    }
  }
  const at::Tensor sum = at::sparse_coo_tensor(at::cat(indexParts, 1), at::cat(valueParts, 0),
                                               input.sizes(), input.options())
                             .coalesce();
  tensor.copy_(sum);
  // A complete Work over the caller's tensor (its future holds it).
  auto done = std::make_shared<rdmacc::Work>(rdmacc::OpType::Allreduce, 0);
  done->finish(nullptr);
  return wrap(std::move(done), rank_, c10d::OpType::ALLREDUCE, {tensor});
}

}  // namespace rdmacc_torch

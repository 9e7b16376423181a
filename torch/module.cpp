// The Python extension rdmacc_torch._C: the process group class and the
// creator function that torch.distributed.Backend.register_backend calls.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "process_group.hpp"
#include "rdmacc/version.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  // Registers c10d's Python types (ProcessGroup, Store, Work) that ours derive from.
  py::module_::import("torch.distributed");
  m.doc() = "rdmacc: collective communication over RDMA verbs, as a torch.distributed backend";

  // c10d::Backend on torch >= 2.0, c10d::ProcessGroup on 1.13.
  auto cls = py::class_<rdmacc_torch::BackendRdmacc, rdmacc_torch::BackendBase,
                        c10::intrusive_ptr<rdmacc_torch::BackendRdmacc>>(m, "BackendRdmacc");
  cls.def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int worldSize,
                      std::chrono::duration<float> timeout) {
            return c10::make_intrusive<rdmacc_torch::BackendRdmacc>(
                store, rank, worldSize,
                std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
          }),
          py::arg("store"), py::arg("rank"), py::arg("world_size"),
          py::arg("timeout") = std::chrono::duration<float>(1800.0f),
          py::call_guard<py::gil_scoped_release>())
      .def("register_memory", &rdmacc_torch::BackendRdmacc::registerTensor, py::arg("tensor"),
           py::call_guard<py::gil_scoped_release>(),
           "Registers the tensor's memory with the device: messages sent from it skip the "
           "staging copy (zero-copy). Deregister before its storage is freed.")
      .def("deregister_memory", &rdmacc_torch::BackendRdmacc::deregisterTensor, py::arg("tensor"),
           py::call_guard<py::gil_scoped_release>());
  m.attr("ProcessGroupRdmacc") = cls;  // the 1.13 line's name
  m.attr("BACKEND_API") = py::bool_(RDMACC_TORCH_BACKEND_API != 0);
  m.attr("__version__") = rdmacc::version();

  // Forming the group waits for every rank: let other Python threads run.
  m.def(
      "create_process_group",
      [](const c10d::DistributedBackendOptions& options, const py::object& /*pgOptions*/) {
        return rdmacc_torch::ProcessGroupRdmacc::create(options);
      },
      py::arg("backend_options"), py::arg("pg_options") = py::none(),
      py::call_guard<py::gil_scoped_release>(),
      "The creator that torch.distributed.Backend.register_backend('rdmacc', ..., "
      "extended_api=True) calls.");
}

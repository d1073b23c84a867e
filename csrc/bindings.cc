// Python bindings of the native history index. The index itself lives in the other files of csrc/.
#include <pybind11/pybind11.h>

namespace py = pybind11;

PYBIND11_MODULE(_native, m) {
  m.doc() = "Native history index of sglang-histospec";
  m.attr("ABI_VERSION") = 1;
}

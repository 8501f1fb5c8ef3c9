// Python bindings of cuda/dropout.h (defined in cuda/dropout_py.cc).
#pragma once

#include "nanobind/nanobind.h"

namespace jax_dash {

void bind_dropout(nanobind::module_& m);

}  // namespace jax_dash

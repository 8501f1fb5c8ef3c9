// Python bindings of cuda/schedule.h (defined in cuda/schedule_py.cc).
#pragma once

#include "nanobind/nanobind.h"

namespace jax_dash {

void bind_schedules(nanobind::module_& m);

}  // namespace jax_dash

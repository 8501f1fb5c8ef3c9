// XLA FFI handlers for platform CUDA, defined in ffi_sm90.cu (or as "not built" stubs in ffi.cc).
#pragma once

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* JaxDashFwdCuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* JaxDashFwdDropoutCuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* JaxDashBwdDropoutCuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* JaxDashBwdCuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* JaxDashSegmentSumCuda(XLA_FFI_CallFrame* call_frame);
}

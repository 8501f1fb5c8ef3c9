// Lets the same headers compile as host C++ and as CUDA.
#pragma once

#if defined(__CUDACC__)
#define JAX_DASH_HD __host__ __device__
#else
#define JAX_DASH_HD
#endif

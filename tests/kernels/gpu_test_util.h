#pragma once
// Helpers shared by the GPU kernel tests: a self-freeing device array, a CUDA status assertion
// and llm.c-style closeness checks (|gpu - ref| <= tol + |ref| * eps).

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace gyre::kernels::gpu_test {

#define GYRE_CUDA_OK(expr)                                                               \
  do {                                                                                   \
    const cudaError_t gyre_err_ = (expr);                                                \
    ASSERT_EQ(gyre_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(gyre_err_); \
  } while (0)

// A device array that frees itself. Copies are deleted: one owner per allocation.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    if (n_ > 0) err_ = cudaMalloc(reinterpret_cast<void**>(&ptr_), n_ * sizeof(T));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    if (n_ > 0 && err_ == cudaSuccess) {
      err_ = cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
    }
  }
  ~DeviceArray() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return ptr_; }
  cudaError_t status() const { return err_; }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    if (n_ > 0) {
      const cudaError_t err = cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
      EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
    }
    return host;
  }

 private:
  size_t n_;
  T* ptr_ = nullptr;
  cudaError_t err_ = cudaSuccess;
};

// True when `got` matches `ref`: both NaN, the same infinity, or within tol + |ref| * eps.
inline bool Close(double got, double ref, double tol, double eps) {
  if (std::isnan(ref) || std::isnan(got)) return std::isnan(ref) && std::isnan(got);
  if (std::isinf(ref) || std::isinf(got)) return got == ref;
  return std::fabs(got - ref) <= tol + std::fabs(ref) * eps;
}

// Expects got[i] ~ ref[i] for every i, reporting the first few mismatches and their count.
template <typename T>
void ExpectAllClose(const std::vector<T>& got, const std::vector<T>& ref, double tol, double eps,
                    const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (Close(got[i], ref[i], tol, eps)) continue;
    if (++bad <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: gpu " << got[i] << " vs ref " << ref[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": mismatches out of " << ref.size();
}

}  // namespace gyre::kernels::gpu_test

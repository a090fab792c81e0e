// kernel<<<grid, block, shared, stream>>>(args...) in the emulated build
// (kernels/cuda/device_seams.cuh, PB_LAUNCH): the arguments are copied at the launch, as CUDA
// copies them, and every CUDA thread calls the kernel with its own copy. A pointer argument
// must be device memory (or null): a host pointer handed to a kernel is a fault here, where a
// GPU would fault once the kernel touched it.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/cuda_emu/runtime.h"

namespace packbert::emu {

// `kernel` calls the kernel with the arguments it is given (a generic lambda at the launch site,
// so that overloads and template arguments are resolved as in a CUDA launch).
template <typename Kernel>
class Launcher {
 public:
  Launcher(const char* name, dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
           Kernel kernel)
      : name_(name),
        grid_(grid),
        block_(block),
        shared_(shared),
        stream_(stream),
        kernel_(kernel) {}

  template <typename... A>
  void operator()(A&&... args) const {
    count_launch();
    auto call = std::make_shared<Call<std::decay_t<A>...>>(
        kernel_, std::tuple<std::decay_t<A>...>(std::forward<A>(args)...));
    std::string bad;
    check_pointers(call->args, std::index_sequence_for<A...>{}, bad);
    if (!bad.empty()) {
      fault("kernel '" + std::string(name_) + "': " + bad);
      set_last_error(cudaErrorInvalidValue);
      return;
    }
    launch(stream_, Launch{name_, grid_, block_, shared_, std::move(call)});
  }

 private:
  template <typename... T>
  struct Call final : KernelCall {
    Call(Kernel k, std::tuple<T...> a) : kernel(k), args(std::move(a)) {}
    void run() const override { std::apply(kernel, args); }  // each thread copies them
    Kernel kernel;
    std::tuple<T...> args;
  };

  template <typename Tuple, size_t... I>
  static void check_pointers(const Tuple& t, std::index_sequence<I...>, std::string& bad) {
    (check_one(std::get<I>(t), I, bad), ...);
  }
  template <typename T>
  static void check_one(const T& v, size_t i, std::string& bad) {
    if constexpr (std::is_pointer_v<T>) {
      if (v != nullptr && bad.empty() && !device_pointer(v))
        bad = "argument " + std::to_string(i) + " is not device memory";
    }
  }

  const char* name_;
  dim3 grid_, block_;
  size_t shared_;
  cudaStream_t stream_;
  Kernel kernel_;
};

template <typename Kernel>
Launcher<Kernel> launcher(const char* name, dim3 grid, dim3 block, size_t shared,
                          cudaStream_t stream, Kernel kernel) {
  return Launcher<Kernel>(name, grid, block, shared, stream, kernel);
}

}  // namespace packbert::emu

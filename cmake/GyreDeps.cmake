# Finds Gyre's dependencies: libtorch from PyTorch's pip wheel, the rest from Debian packages.

# --- libtorch ---------------------------------------------------------------------------------
# GYRE_PYTHON is the interpreter whose torch we build against. Default: the shared venv that
# tools/install-deps.sh creates, then python3 on PATH.
if(NOT GYRE_PYTHON)
  if(DEFINED ENV{GYRE_VENV} AND EXISTS "$ENV{GYRE_VENV}/bin/python")
    set(GYRE_PYTHON "$ENV{GYRE_VENV}/bin/python")
  elseif(EXISTS "$ENV{HOME}/.cache/gyre/venv/bin/python")
    set(GYRE_PYTHON "$ENV{HOME}/.cache/gyre/venv/bin/python")
  else()
    find_program(GYRE_PYTHON NAMES python3 python)
  endif()
endif()
set(GYRE_PYTHON "${GYRE_PYTHON}" CACHE FILEPATH "Python interpreter that has torch installed")
execute_process(
  COMMAND "${GYRE_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path, end='')"
  OUTPUT_VARIABLE GYRE_TORCH_PREFIX RESULT_VARIABLE _gyre_torch_rc ERROR_QUIET)
if(NOT _gyre_torch_rc EQUAL 0)
  message(FATAL_ERROR "gyre: cannot import torch with ${GYRE_PYTHON}. Run tools/install-deps.sh, "
                      "or pass -DGYRE_PYTHON=/path/to/python-with-torch.")
endif()
list(APPEND CMAKE_PREFIX_PATH "${GYRE_TORCH_PREFIX}")

# --- Debian packages -----------------------------------------------------------------------------
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
# Found before libtorch, whose CMake config would otherwise define protobuf::libprotobuf from
# its own bundled copy (and leave Debian's library off the link line).
find_package(Protobuf REQUIRED)
pkg_check_modules(GRPCPP REQUIRED IMPORTED_TARGET grpc++)
find_program(GYRE_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
find_package(spdlog REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(benchmark REQUIRED)
# CLI11 (Debian libcli11-dev): every command's options, --help with defaults (src/cli, src/bench).
find_package(CLI11 CONFIG REQUIRED)
find_package(ZLIB REQUIRED)
# CRC-32 and CRC-32C (src/common/crc32.cc): Intel's ISA-L.
pkg_check_modules(ISAL REQUIRED IMPORTED_TARGET libisal)
pkg_check_modules(SQLITE3 REQUIRED IMPORTED_TARGET sqlite3)
# /metrics and /health (src/observe): prometheus-cpp's registry and serializer, served by GNU
# libmicrohttpd.
find_package(prometheus-cpp CONFIG REQUIRED)
pkg_check_modules(MICROHTTPD REQUIRED IMPORTED_TARGET libmicrohttpd)
if(GYRE_BUILD_TESTS)
  find_package(GTest REQUIRED)
  # The tests' HTTP client (tests/testing/http_get.h) and PNG decoder (tests/testing/png_read.h).
  find_package(CURL REQUIRED)
  find_package(PNG REQUIRED)
endif()

# --- CUDA ---------------------------------------------------------------------------------------
set(GYRE_CUDA_ENABLED OFF)
if(NOT GYRE_WITH_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Hopper (H100/H200) unless the user chooses: set before enable_language, which would
    # otherwise pick the compiler's own default.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(GYRE_CUDA_ENABLED ON)
  elseif(GYRE_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "gyre: GYRE_WITH_CUDA=ON but no CUDA compiler was found (is nvcc on PATH?)")
  endif()
endif()
message(STATUS "gyre: CUDA kernels ${GYRE_CUDA_ENABLED}")

if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  # Without a GPU to detect, torch's config would pick a default list that nvcc 13 rejects.
  set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
endif()
# Torch's CMake config finds CUDA itself when the wheel is a CUDA build, and appends -gencode
# flags for every architecture the wheel was built for (some of which a newer nvcc rejects).
# Gyre's kernels choose their own architectures (CMAKE_CUDA_ARCHITECTURES), so keep our flags.
set(_gyre_saved_cuda_flags "${CMAKE_CUDA_FLAGS}")
# PyPI's Linux wheel is a CUDA build: its CMake config looks for a CUDA toolkit (nvcc) and stops
# when there is none, although its CPU libraries need none of it (they load the CUDA runtime they
# link from the wheel's own nvidia packages, by their RUNPATH). Without a CUDA compiler, stand in
# for the one target the config's CUDA part would define (torch::cudart, linked through
# libtorch_cuda.so's own RUNPATH), which makes that part return at once: a machine without the
# toolkit builds Gyre's CPU paths against the same wheel.
# GYRE_TORCH_WITHOUT_TOOLKIT tells the modules that libtorch's CUDA targets exist but the
# toolkit's headers do not (src/rollout's CUDA graphs need them).
set(GYRE_TORCH_WITHOUT_TOOLKIT OFF)
if(NOT GYRE_CUDA_ENABLED AND NOT TARGET torch::cudart)
  find_program(GYRE_NVCC nvcc HINTS ENV CUDA_HOME ENV CUDA_PATH /usr/local/cuda PATH_SUFFIXES bin)
  get_filename_component(_gyre_torch_lib "${GYRE_TORCH_PREFIX}/../../lib" ABSOLUTE)
  if(NOT GYRE_NVCC AND EXISTS "${_gyre_torch_lib}/libtorch_cuda.so")
    message(STATUS "gyre: libtorch is a CUDA build and there is no CUDA toolkit: CPU only")
    add_library(torch::cudart INTERFACE IMPORTED)
    set(GYRE_TORCH_WITHOUT_TOOLKIT ON)
  endif()
endif()
find_package(Torch REQUIRED)
set(CMAKE_CUDA_FLAGS "${_gyre_saved_cuda_flags}")
message(STATUS "gyre: libtorch ${Torch_VERSION} from ${GYRE_TORCH_PREFIX}")
# TORCH_LIBRARIES carries imported targets; torch's flags carry the C++ ABI define.
separate_arguments(_gyre_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
add_library(gyre_libtorch INTERFACE)
target_link_libraries(gyre_libtorch INTERFACE ${TORCH_LIBRARIES})
target_compile_options(gyre_libtorch INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${_gyre_torch_flags}>)
# The wheel's include/ also ships its own copies of protobuf (google/) and fmt headers, which
# must not shadow Debian's (gRPC and spdlog are built against those). Expose a filtered view
# with only libtorch's own headers, and strip the raw include root from torch's targets.
set(_gyre_torch_root "${TORCH_INSTALL_PREFIX}/include")
set(_gyre_torch_view "${CMAKE_BINARY_DIR}/torch-include")
file(MAKE_DIRECTORY "${_gyre_torch_view}")
foreach(_d ATen c10 caffe2 torch)
  if(EXISTS "${_gyre_torch_root}/${_d}" AND NOT EXISTS "${_gyre_torch_view}/${_d}")
    file(CREATE_LINK "${_gyre_torch_root}/${_d}" "${_gyre_torch_view}/${_d}" SYMBOLIC)
  endif()
endforeach()
foreach(_t torch torch_cpu torch_cuda c10 c10_cuda torch_library)
  if(TARGET ${_t})
    get_target_property(_inc ${_t} INTERFACE_INCLUDE_DIRECTORIES)
    if(_inc)
      list(FILTER _inc EXCLUDE REGEX "^${_gyre_torch_root}(/torch/csrc/api/include)?/?$")
      set_property(TARGET ${_t} PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${_inc}")
    endif()
  endif()
endforeach()
# SYSTEM: torch's own headers are noisy under -Wextra.
target_include_directories(gyre_libtorch SYSTEM INTERFACE "${_gyre_torch_view}"
                           "${_gyre_torch_view}/torch/csrc/api/include")

# gyre_openmp: for the sources that call at::parallel_for. It is a header template that runs on
# ATen's intra-op threads only in a translation unit compiled with OpenMP; without it the loop
# silently runs on the calling thread. With GCC (the project's compiler) those sources compile
# with -fopenmp and link the OpenMP runtime libtorch ships (lib/libgomp.so.1), so the process has
# one OpenMP thread pool (the compiler's own libgomp where the wheel has none). Clang's OpenMP
# code calls LLVM's runtime (libomp), a second pool, so clang builds (the libFuzzer targets) keep
# these loops serial.
add_library(gyre_openmp INTERFACE)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  find_library(GYRE_TORCH_GOMP NAMES libgomp.so.1 PATHS "${TORCH_INSTALL_PREFIX}/lib"
               NO_DEFAULT_PATH)
  if(GYRE_TORCH_GOMP)
    target_compile_options(gyre_openmp INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fopenmp>)
    target_link_libraries(gyre_openmp INTERFACE "${GYRE_TORCH_GOMP}")
  else()
    find_package(OpenMP REQUIRED COMPONENTS CXX)
    target_link_libraries(gyre_openmp INTERFACE OpenMP::OpenMP_CXX)
  endif()
endif()

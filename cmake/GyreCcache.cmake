# Use ccache when it is installed. CCACHE_BASEDIR + CCACHE_NOHASHDIR make object files from two
# different clones of the repository share cache entries (paths are rewritten relative to the
# source tree and the working directory is not hashed), so a fresh CI clone hits the cache.
find_program(GYRE_CCACHE ccache)
if(GYRE_CCACHE)
  set(_gyre_launcher ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${CMAKE_SOURCE_DIR} CCACHE_NOHASHDIR=1
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime ${GYRE_CCACHE})
  set(CMAKE_C_COMPILER_LAUNCHER ${_gyre_launcher})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${_gyre_launcher})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${_gyre_launcher})
  message(STATUS "gyre: using ccache ${GYRE_CCACHE}")
endif()

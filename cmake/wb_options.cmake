# Warnings, sanitizers and the CUDA toolkit probe shared by every target.
add_library(wb_warnings INTERFACE)
target_compile_options(wb_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${WB_WERROR}>>:-Werror>)
target_compile_definitions(wb_warnings INTERFACE $<$<BOOL:${WB_PROFILE}>:WB_PROFILE=1>)

# WB_FUZZ: libFuzzer needs clang; every object gets its coverage instrumentation (fuzzer-no-link) and,
# unless WB_SANITIZE names others, AddressSanitizer and UBSan. fuzz/ links the fuzzer's main.
if(WB_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "WB_FUZZ=ON needs clang (-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang)")
  endif()
  if(NOT WB_SANITIZE)
    set(WB_SANITIZE address,undefined)
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
# A sanitizer's report is fatal (UBSan would otherwise print and go on), so a test or a fuzz run fails.
if(WB_SANITIZE)
  add_compile_options(-fsanitize=${WB_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${WB_SANITIZE})
  # The sanitizers' checks keep clang from vectorizing `omp simd` loops, which it reports as a warning.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    add_compile_options(-Wno-pass-failed)
  endif()
endif()

# CUDA: AUTO builds the CUDA parts when a toolkit is found (CUDAToolkit_ROOT or /usr/local/cuda).
set(WB_HAVE_CUDA OFF)
if(NOT WB_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(WB_HAVE_CUDA ON)
  elseif(WB_CUDA STREQUAL "ON")
    message(FATAL_ERROR "WB_CUDA=ON but no CUDA toolkit was found (set CUDAToolkit_ROOT)")
  endif()
endif()

# Every module's library is wb_<module>; tests/test_<module>_*.cpp link it.

# Warnings, sanitizers and the CUDA toolkit probe shared by every target.
add_library(wb_warnings INTERFACE)
target_compile_options(wb_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${WB_WERROR}>>:-Werror>)
target_compile_definitions(wb_warnings INTERFACE $<$<BOOL:${WB_PROFILE}>:WB_PROFILE=1>)

if(WB_SANITIZE)
  add_compile_options(-fsanitize=${WB_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${WB_SANITIZE})
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

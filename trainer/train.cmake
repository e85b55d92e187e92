# wb_trainer: the training job (config, loop, observers, dumps, checkpoints) and the wb-train program.
add_library(wb_trainer STATIC
  ${CMAKE_CURRENT_SOURCE_DIR}/config.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/train.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/observers.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/progress.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/dump/dump.cpp)
target_include_directories(wb_trainer PUBLIC ${CMAKE_SOURCE_DIR})
target_link_libraries(wb_trainer PUBLIC wb_model wb_data wb_dist wb_profiler wb_store nlohmann_json::nlohmann_json
                      PRIVATE wb_warnings)

add_executable(wb-train ${CMAKE_CURRENT_SOURCE_DIR}/main.cpp)
target_link_libraries(wb-train PRIVATE wb_trainer wb_warnings)

# Tests of the whole trainer find the binaries through this.
add_library(wb_trainer_test_support INTERFACE)
add_dependencies(wb_trainer_test_support wb-train wb)
target_compile_definitions(wb_trainer_test_support INTERFACE WB_TRAIN="$<TARGET_FILE:wb-train>" WB_CLI="$<TARGET_FILE:wb>")

# The analysis tests on real runs (tests/test_analysis_trainer_run.cpp) start both programs the same way.
add_library(wb_analysis_test_support INTERFACE)
add_dependencies(wb_analysis_test_support wb-train wb)
target_compile_definitions(wb_analysis_test_support INTERFACE WB_TRAIN="$<TARGET_FILE:wb-train>" WB_CLI="$<TARGET_FILE:wb>")

# CUDA builds: the device prefetch queue and the GPU glue of wb-train (trainer/cuda/), compiled when
# the CUDA backend is (it defines WB_BACKEND_CUDA on wb_backend).
get_target_property(_wb_backend_defs wb_backend INTERFACE_COMPILE_DEFINITIONS)
if(_wb_backend_defs MATCHES "WB_BACKEND_CUDA")
  target_sources(wb_trainer PRIVATE
    ${CMAKE_CURRENT_SOURCE_DIR}/cuda/device_queue.cpp
    ${CMAKE_CURRENT_SOURCE_DIR}/cuda/gpu.cpp)
  target_link_libraries(wb_trainer PRIVATE CUDA::cudart)
endif()

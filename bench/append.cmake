# append_bench (docs/benchmarks.md, "Append and fused RoPE + append"): included
# from bench/CMakeLists.txt. It times the append kernels directly (launcher
# in kernels/append_launch.hpp, through the static flashdec_internal) to
# compare the fused form with a separate RoPE pass + append, and the public
# API for the host cost of begin / write / commit.
if(FLASHDEC_HAVE_CUDA)
  add_executable(append_bench ${CMAKE_CURRENT_SOURCE_DIR}/append_bench.cu)
  # Its chart is drawn by fd_svg_plot (src/cli/svg_plot.cpp).
  target_link_libraries(append_bench PRIVATE flashdec_internal CUDA::cudart fd_svg_plot)
  target_include_directories(append_bench PRIVATE ${PROJECT_SOURCE_DIR}/kernels
    ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(append_bench PRIVATE ${FLASHDEC_CUDA_WARNINGS} -lineinfo)
endif()

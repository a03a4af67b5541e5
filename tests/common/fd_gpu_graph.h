/* Capturing a decode call into a CUDA graph and reading its kernel nodes in
 * the GPU suites (C++):
 * which shape of a kernel a library call took shows in the dynamic shared
 * memory of its attention node. Include after fd_gpu_test.h. */
#ifndef FD_GPU_GRAPH_H
#define FD_GPU_GRAPH_H

#include <cuda.h>

#include <algorithm>
#include <vector>

/* cuGraphKernelNodeGetParams, through the runtime: the library's kernels
 * are registered with its own (static) CUDA runtime, which a suite's runtime
 * cannot name, so cudaGraphKernelNodeGetParams fails on them. */
using FdKernelNodeParamsFn = CUresult (*)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS *);

inline FdKernelNodeParamsFn fd_kernel_node_params() {
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  CUDA_OK(cudaGetDriverEntryPointByVersion("cuGraphKernelNodeGetParams", &fn, 12000,
                                           cudaEnableDefault, &found));
  assert_int_equal(found, cudaDriverEntryPointSuccess);
  return reinterpret_cast<FdKernelNodeParamsFn>(fn);
}

/* fd_decode(p) captured into a CUDA graph on `stream` (p's stream); the
 * call must succeed. */
inline cudaGraph_t fd_capture_decode(cudaStream_t stream, const fd_decode_params &p) {
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const fd_status st = fd_decode(&p);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  FD_ASSERT_OK(st);
  return graph;
}

/* The largest dynamic shared memory of `graph`'s kernel nodes (a decode
 * call's attention kernel: its merge takes a few KB), and in *kernels their
 * number. */
inline size_t fd_graph_kernel_smem(cudaGraph_t graph, size_t *kernels) {
  size_t count = 0;
  CUDA_OK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  CUDA_OK(cudaGraphGetNodes(graph, nodes.data(), &count));
  const FdKernelNodeParamsFn get_params = fd_kernel_node_params();
  size_t smem = 0;
  *kernels = 0;
  for (cudaGraphNode_t n : nodes) {
    cudaGraphNodeType type;
    CUDA_OK(cudaGraphNodeGetType(n, &type));
    if (type != cudaGraphNodeTypeKernel) continue;
    CUDA_KERNEL_NODE_PARAMS kp = {};
    assert_int_equal(get_params(n, &kp), CUDA_SUCCESS);
    smem = std::max<size_t>(smem, kp.sharedMemBytes);
    ++*kernels;
  }
  return smem;
}

#endif /* FD_GPU_GRAPH_H */

// The decode engine (docs/semantics.md S8). It drives an fd_cache through the
// public C API (fd_cache_*, fd_tx_*, fd_prefix_*, fd_decode), with one
// internal exception: apply_decision takes back its own admissions after a
// failed one with PagedCache::discard_new_request (no public call removes a
// request without a trace; docs/engine.md). Every public entry point
// validates first and mutates afterwards; failures throw fd::Error.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "attention/decode_plan.hpp"
#include "core/dtype.hpp"
#include "engine/engine_device.hpp"
#include "engine/scheduler.hpp"
#include "flashdec.h"

namespace fd {

struct EngineRequest {
  int32_t state = FD_ENGINE_REQUEST_UNKNOWN;
  bool scheduled = false;
  RequestSpec spec;     // scheduled requests only
  int32_t seq_len = 0;  // scheduled requests: mirror of the cache's seq_len
  // Scratch of begin_step's duplicate check: the mark of the last id list
  // that contained this request (a mark per list instead of a hash set).
  uint64_t id_check_mark = 0;
};

struct FairnessCounters {
  uint32_t wait_steps = 0;
  uint32_t skip_count = 0;
  uint32_t service_wait_steps = 0;
};

class Engine {
 public:
  Engine(fd_cache *cache, const fd_engine_config &config);
  ~Engine();
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;

  // Unscheduled lifecycle.
  void add_request(uint64_t id);
  void admit(uint64_t id);
  // Both modes.
  void finish(uint64_t id, bool cancelled);
  int32_t request_state(uint64_t id) const;

  // Steps. token_counts / keep_counts null: one token per row / keep all.
  fd_engine_step begin_step(const uint64_t *ids, const uint32_t *token_counts, uint32_t count);
  void step_layer(fd_tx tx, uint32_t layer, const void *q, const void *k, const void *v, void *out,
                  fd_stream stream);
  void commit_step(fd_tx tx, const uint32_t *keep_counts, uint32_t count);
  void abort_step(fd_tx tx);
  // Appends num_tokens prompt tokens to `id` through one transaction;
  // messages start with `what` (the public call's name).
  void prefill(uint64_t id, uint32_t num_tokens, const void *k, const void *v, const char *what);

  // Scheduler-managed mode.
  void submit(const fd_request_spec *spec);
  void register_prefix(const char *prefix_id, const void *k, const void *v, uint32_t n,
                       fd_stream stream);
  void evict_prefix(const char *prefix_id);
  std::shared_ptr<Snapshot> snapshot(uint64_t step, const fd_request_fairness *fairness,
                                     uint32_t count) const;
  void apply(const SchedulerConfig &config, const Decision &decision);

  fd_engine_metrics metrics() const;
  void validate() const;

  // Read-only views for the workload drivers.
  fd_cache *cache() const { return cache_; }
  const fd_cache_config &cache_config() const { return cache_config_; }
  uint32_t num_q_heads() const { return num_q_heads_; }
  bool step_open() const { return step_open_; }
  int32_t seq_len_of(uint64_t id) const;
  uint64_t prefix_blocks_of(const std::string &prefix_id) const;

 private:
  struct PrefixRecord {
    uint32_t num_blocks = 0;
  };

  void require_no_step(const char *what) const;
  void check_cache_version() const;  // scheduler-managed only
  void sync_cache_version();
  void bump() { ++state_version_; }
  EngineRequest &find(uint64_t id, const char *what);
  const EngineRequest *lookup(uint64_t id) const;
  void set_state(EngineRequest &r, uint64_t id, int32_t state);
  void require_open_step(fd_tx tx, const char *what) const;
  // Checks a step's token counts; returns the step's tokens and sets
  // step_counts_ (scratch: nothing else changes).
  uint64_t check_token_counts(const uint64_t *ids, const uint32_t *token_counts, uint32_t count);
  [[noreturn]] void abort_and_rethrow(const char *during);
  void close_step();
  void prune_evicted_prefixes();
  fd_cache_metrics cache_metrics() const;
  std::shared_ptr<Snapshot> build_snapshot(
      uint64_t step, const std::unordered_map<uint64_t, FairnessCounters> &fairness) const;
  // Bytes of an element of the step and prefill tensors (q, k, v, the
  // attention output, their device scratch): the cache's input_dtype, which
  // is its dtype unless the cache stores FP8 (S1.1).
  size_t element_size() const { return dtype_size(input_dtype_); }
  // Decode parameters of `batch` rows of the current step, without buffers.
  fd_decode_params decode_params(uint32_t batch) const;
  void plan_step();
  bool on_cuda() const { return device_ != nullptr; }
  void create_device_scratch();
  void require_device(const void *p, const char *what) const;

  fd_cache *cache_;
  fd_cache_config cache_config_{};
  int32_t input_dtype_ = FD_DTYPE_BF16;  // the cache's input_dtype, -1 resolved
  uint32_t num_q_heads_ = 0;
  uint32_t rotary_dim_ = 0;
  float rope_base_ = 10000.f;
  float sm_scale_ = 0.f;
  uint32_t cpu_threads_ = 0;
  std::vector<const void *> layer_k_, layer_v_;
  // The cache's per-layer K/V scales, read at each begin_step (so a change
  // between steps applies to the next one; S1.1).
  std::vector<float> layer_k_scales_, layer_v_scales_;
  int64_t strides_[4] = {0, 0, 0, 0};

  std::unordered_map<uint64_t, EngineRequest> requests_;
  // Scheduled waiting / active requests by submission order (snapshot order).
  std::map<uint64_t, uint64_t> waiting_by_order_, active_by_order_;
  std::unordered_set<uint64_t> used_orders_;
  std::map<std::string, PrefixRecord> prefixes_;
  bool scheduler_managed_ = false;
  bool has_unscheduled_ = false;

  // The open step.
  bool step_open_ = false;
  fd_tx step_tx_{0, 0};
  uint32_t next_layer_ = 0;
  uint32_t table_stride_ = 0;
  int32_t max_effective_len_ = 0;
  // The step's most tokens in one row. Above 1 (a step from
  // fd_engine_begin_step_multi with a count above 1) the rows' query tokens
  // are packed and decode gets q_indptr; otherwise one token per row and
  // today's decode path.
  int32_t max_q_len_ = 1;
  bool step_multi() const { return max_q_len_ > 1; }
  std::vector<uint32_t> step_counts_;
  std::vector<int32_t> step_indptr_;  // [rows + 1] (CPU caches; CUDA: device twin)
  std::vector<uint64_t> step_ids_;
  std::vector<int32_t> step_tables_, step_effective_lens_;
  std::vector<unsigned char> q_rotated_;
  std::vector<unsigned char> prefill_q_;  // prefill's zeroed dummy Q (CPU caches)
  // The step's decode plan, made in begin_step from the exact lengths (a
  // value: planning allocates nothing, so it cannot fail for lack of memory
  // once the step's transaction is open).
  DecodePlan step_plan_;
  // CUDA caches only: device twins of q_rotated_, step_tables_ and
  // step_effective_lens_, and the split-KV workspace (engine_device.hpp).
  std::unique_ptr<DeviceScratch> device_;

  // The last applied decision (scheduler-managed mode).
  bool decision_unused_ = false;
  std::vector<uint64_t> authorised_runnable_;

  uint64_t id_check_mark_ = 0;  // begin_step's current list mark
  uint64_t cache_version_ = 0;
  uint64_t state_version_ = 0;
  uint64_t counts_[6] = {0, 0, 0, 0, 0, 0};  // by fd_engine_request_state
  uint64_t completed_steps_ = 0, appended_tokens_ = 0, prefill_tokens_ = 0;
  uint64_t backpressure_ = 0, stale_decisions_ = 0, applied_decisions_ = 0;
  uint64_t layer_steps_ = 0, step_aborts_ = 0;
};

}  // namespace fd

struct fd_engine {
  std::unique_ptr<fd::Engine> impl;
};

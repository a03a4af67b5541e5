// C API of the decode engine (flashdec.h, S8).
#include <cstring>
#include <memory>

#include "core/error.hpp"
#include "core/versioned.hpp"
#include "engine/engine.hpp"
#include "engine/scheduler_handles.hpp"

using fd::guard;

namespace {

fd::Engine &impl(fd_engine *e) {
  fd::require_non_null(e, "engine");
  return *e->impl;
}
const fd::Engine &impl(const fd_engine *e) {
  fd::require_non_null(e, "engine");
  return *e->impl;
}

}  // namespace

extern "C" {

FD_API void fd_engine_config_init(fd_engine_config *config) {
  if (config == nullptr) return;
  std::memset(config, 0, sizeof *config);
  config->struct_size = sizeof *config;
  config->rope_base = 10000.f;
}

FD_API fd_status fd_engine_create(fd_cache *cache, const fd_engine_config *config,
                                  fd_engine **out) {
  return guard([&] {
    fd::require_non_null(out, "out");
    fd_engine_config c;
    fd_engine_config_init(&c);
    if (config != nullptr) {
      c = fd::read_versioned<offsetof(fd_engine_config, rotary_dim)>(config, c, "config");
    }
    auto e = std::make_unique<fd_engine>();
    e->impl = std::make_unique<fd::Engine>(cache, c);
    *out = e.release();
    return FD_OK;
  });
}

FD_API void fd_engine_destroy(fd_engine *engine) {
  delete engine;
}

FD_API fd_status fd_engine_add_request(fd_engine *engine, uint64_t request_id) {
  return guard([&] {
    impl(engine).add_request(request_id);
    return FD_OK;
  });
}

FD_API fd_status fd_engine_admit(fd_engine *engine, uint64_t request_id) {
  return guard([&] {
    impl(engine).admit(request_id);
    return FD_OK;
  });
}

FD_API fd_status fd_engine_finish(fd_engine *engine, uint64_t request_id) {
  return guard([&] {
    impl(engine).finish(request_id, false);
    return FD_OK;
  });
}

FD_API fd_status fd_engine_cancel(fd_engine *engine, uint64_t request_id) {
  return guard([&] {
    impl(engine).finish(request_id, true);
    return FD_OK;
  });
}

FD_API fd_status fd_engine_get_request_state(const fd_engine *engine, uint64_t request_id,
                                             int32_t *state) {
  return guard([&] {
    const fd::Engine &e = impl(engine);
    fd::require_non_null(state, "state");
    *state = e.request_state(request_id);
    return FD_OK;
  });
}

FD_API fd_status fd_engine_begin_step(fd_engine *engine, const uint64_t *request_ids,
                                      uint32_t count, fd_engine_step *step) {
  return guard([&] {
    fd::Engine &e = impl(engine);
    // The whole struct is required (so fd_tx is never cut): checked before the
    // step opens, or an opened step would be lost.
    constexpr size_t kMinStepSize = sizeof(fd_engine_step);
    fd::require_versioned<kMinStepSize>(step, "step");
    const fd_engine_step result = e.begin_step(request_ids, nullptr, count);
    fd::write_versioned<kMinStepSize>(step, result, "step");
    return FD_OK;
  });
}

FD_API fd_status fd_engine_begin_step_multi(fd_engine *engine, const uint64_t *request_ids,
                                            const uint32_t *token_counts, uint32_t count,
                                            fd_engine_step *step) {
  return guard([&] {
    fd::Engine &e = impl(engine);
    fd::require_non_null(token_counts, "token_counts");
    constexpr size_t kMinStepSize = sizeof(fd_engine_step);
    fd::require_versioned<kMinStepSize>(step, "step");
    const fd_engine_step result = e.begin_step(request_ids, token_counts, count);
    fd::write_versioned<kMinStepSize>(step, result, "step");
    return FD_OK;
  });
}

FD_API fd_status fd_engine_step_layer(fd_engine *engine, fd_tx tx, uint32_t layer, const void *q,
                                      const void *k, const void *v, void *out_attention,
                                      fd_stream stream) {
  return guard([&] {
    impl(engine).step_layer(tx, layer, q, k, v, out_attention, stream);
    return FD_OK;
  });
}

FD_API fd_status fd_engine_commit_step(fd_engine *engine, fd_tx tx) {
  return guard([&] {
    impl(engine).commit_step(tx, nullptr, 0);
    return FD_OK;
  });
}

FD_API fd_status fd_engine_commit_step_keep(fd_engine *engine, fd_tx tx,
                                            const uint32_t *keep_counts, uint32_t count) {
  return guard([&] {
    fd::Engine &e = impl(engine);
    fd::require_non_null(keep_counts, "keep_counts");
    e.commit_step(tx, keep_counts, count);
    return FD_OK;
  });
}

FD_API fd_status fd_engine_abort_step(fd_engine *engine, fd_tx tx) {
  return guard([&] {
    impl(engine).abort_step(tx);
    return FD_OK;
  });
}

FD_API fd_status fd_engine_prefill_request_layers(fd_engine *engine, uint64_t request_id,
                                                  const void *k, const void *v) {
  return guard([&] {
    impl(engine).prefill(request_id, 1, k, v, "prefill_request_layers");
    return FD_OK;
  });
}

FD_API fd_status fd_engine_prefill_request_tokens(fd_engine *engine, uint64_t request_id,
                                                  uint32_t num_tokens, const void *k,
                                                  const void *v) {
  return guard([&] {
    impl(engine).prefill(request_id, num_tokens, k, v, "prefill_request_tokens");
    return FD_OK;
  });
}

FD_API fd_status fd_engine_submit_request(fd_engine *engine, const fd_request_spec *spec) {
  return guard([&] {
    impl(engine).submit(spec);
    return FD_OK;
  });
}

FD_API fd_status fd_engine_register_prefix(fd_engine *engine, const char *prefix_id,
                                           const void *k_blocks, const void *v_blocks,
                                           uint32_t num_blocks, fd_stream stream) {
  return guard([&] {
    impl(engine).register_prefix(prefix_id, k_blocks, v_blocks, num_blocks, stream);
    return FD_OK;
  });
}

FD_API fd_status fd_engine_evict_prefix(fd_engine *engine, const char *prefix_id) {
  return guard([&] {
    impl(engine).evict_prefix(prefix_id);
    return FD_OK;
  });
}

FD_API fd_status fd_engine_snapshot(const fd_engine *engine, uint64_t step,
                                    const fd_request_fairness *fairness, uint32_t count,
                                    fd_snapshot **out) {
  return guard([&] {
    const fd::Engine &e = impl(engine);
    fd::require_non_null(out, "out");
    auto s = std::make_unique<fd_snapshot>();
    s->value = e.snapshot(step, fairness, count);
    *out = s.release();
    return FD_OK;
  });
}

FD_API fd_status fd_engine_apply_decision(fd_engine *engine, const fd_scheduler *scheduler,
                                          const fd_decision *decision) {
  return guard([&] {
    fd::Engine &e = impl(engine);
    fd::require_non_null(scheduler, "scheduler");
    fd::require_non_null(decision, "decision");
    e.apply(scheduler->config, decision->value);
    return FD_OK;
  });
}

FD_API fd_status fd_engine_metrics_get(const fd_engine *engine, fd_engine_metrics *metrics) {
  return guard([&] {
    const fd::Engine &e = impl(engine);
    fd::write_versioned<offsetof(fd_engine_metrics, waiting_request_count)>(metrics, e.metrics(),
                                                                            "metrics");
    return FD_OK;
  });
}

FD_API fd_status fd_engine_validate(const fd_engine *engine) {
  return guard([&] {
    impl(engine).validate();
    return FD_OK;
  });
}

}  // extern "C"

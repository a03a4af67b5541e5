// Device-side views of the cache (appended in 0.1): block tables and lengths
// delivered into caller device buffers on a stream, and the query for
// asynchronous device faults. The cache computes everything on the host; the
// storage (cache/kv_storage.hpp) decides how it reaches the destination.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cache/cache_handle.hpp"
#include "core/arg_checks.hpp"
#include "core/error.hpp"

extern "C" {

FD_API fd_status fd_cache_export_async(const fd_cache *cache, const uint64_t *request_ids,
                                       uint32_t count, uint32_t table_stride, int32_t *block_tables,
                                       int32_t *seq_lens, fd_stream stream) {
  return fd::guard([&] {
    fd::require_non_null(cache, "cache");
    const fd::PagedCache &c = cache->cache;
    // Everything is checked once, before any staging; the fill only copies.
    c.check_export(request_ids, count, table_stride, block_tables, seq_lens);
    const size_t table_ints = block_tables ? size_t{count} * table_stride : 0;
    const size_t len_ints = seq_lens ? count : 0;
    c.storage().export_tables(table_ints, len_ints, block_tables, seq_lens, stream,
                              [&](int32_t *tables, int32_t *lens) {
                                c.fill_export(count, table_stride, block_tables ? tables : nullptr,
                                              seq_lens ? lens : nullptr);
                              });
    return FD_OK;
  });
}

FD_API fd_status fd_tx_block_tables_async(const fd_cache *cache, fd_tx tx, uint32_t table_stride,
                                          int32_t *block_tables, int32_t *effective_seq_lens,
                                          fd_stream stream) {
  return fd::guard([&] {
    fd::require_non_null(cache, "cache");
    const fd::PagedCache &c = cache->cache;
    const fd::OpenTransaction &t = c.open_transaction(tx);
    fd::require_aligned(block_tables, alignof(int32_t), "block_tables");
    fd::require_aligned(effective_seq_lens, alignof(int32_t), "effective_seq_lens");
    const size_t rows = t.rows.size();
    const size_t table_ints = block_tables ? rows * table_stride : 0;
    const size_t len_ints = effective_seq_lens ? rows : 0;
    c.storage().export_tables(table_ints, len_ints, block_tables, effective_seq_lens, stream,
                              [&](int32_t *tables, int32_t *lens) {
                                if (block_tables) c.tx_block_tables(t, table_stride, tables);
                                if (effective_seq_lens)
                                  for (size_t i = 0; i < rows; ++i)
                                    lens[i] = t.rows[i].position +
                                              static_cast<int32_t>(t.rows[i].token_count);
                              });
    return FD_OK;
  });
}

FD_API fd_status fd_tx_token_indptr_async(const fd_cache *cache, fd_tx tx, int32_t *token_indptr,
                                          fd_stream stream) {
  return fd::guard([&] {
    fd::require_non_null(cache, "cache");
    const fd::PagedCache &c = cache->cache;
    const fd::OpenTransaction &t = c.open_transaction(tx);
    fd::require_non_null(token_indptr, "token_indptr");
    fd::require_aligned(token_indptr, alignof(int32_t), "token_indptr");
    const size_t rows = t.rows.size();
    // One int32 array: the export's "lengths" part carries it.
    c.storage().export_tables(
        0, rows + 1, nullptr, token_indptr, stream, [&](int32_t *, int32_t *indptr) {
          indptr[0] = 0;
          for (size_t i = 0; i < rows; ++i)
            indptr[i + 1] = indptr[i] + static_cast<int32_t>(t.rows[i].token_count);
        });
    return FD_OK;
  });
}

FD_API fd_status fd_cache_async_error(const fd_cache *cache) {
  return fd::guard([&] {
    fd::require_non_null(cache, "cache");
    std::string message;
    const fd_status s = cache->cache.storage().async_error(&message);
    if (s != FD_OK) fd::fail(s, "%s", message.c_str());
    return FD_OK;
  });
}

}  // extern "C"

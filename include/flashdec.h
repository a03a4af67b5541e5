/**
 * @file flashdec.h
 * @brief FlashDec: paged-KV decode attention runtime, plain C ABI.
 *
 * This is the one public header of libflashdec. It is plain C99, includes no
 * C++ or CUDA header, and is safe to include from C++ (declarations are wrapped
 * in `extern "C"`).
 *
 * Conventions used throughout (see docs/abi.md):
 * - Every function returns an ::fd_status (except destroy functions, version
 *   queries and ::fd_status_string / ::fd_last_error_message). ::FD_OK is the
 *   only success value. On failure a human-readable detail is available from
 *   ::fd_last_error_message on the calling thread.
 * - A failing call changes nothing observable: no partial mutation, and
 *   out-pointers are left untouched.
 * - Handles are pointers to incomplete structs. Constructors write the handle
 *   through an out-pointer only on success. Destroy functions accept NULL.
 * - Configuration and result structs begin with `struct_size`; callers fill it
 *   with `sizeof(the struct)` (the init functions do). The library accepts any
 *   older, smaller size (down to each call's minimum) and uses defaults for
 *   (or leaves unwritten) the tail. A larger size (a newer header) is refused
 *   for inputs and fine for results (the extra bytes are left alone). Fields
 *   are read and written whole; struct_size itself is never written.
 * - Pointer parameters are borrowed for the duration of the call unless their
 *   documentation says otherwise.
 * - Every array argument of every function (tensors, K/V blocks and external
 *   storage, id lists, block tables, lengths, positions, output arrays and
 *   arrays of structs, in host or device memory) must start at an address
 *   aligned to its element type: 2 bytes for f16/bf16, 4 for f32 and int32, 8
 *   for uint64 ids, int64 strides and arrays of structs with 64-bit fields
 *   (::fd_request_fairness, ::fd_workload_trace_point). A misaligned array is
 *   ::FD_ERR_INVALID_ARGUMENT, checked with the call's other arguments
 *   (nothing is read or written), with the message "<parameter> (<address>)
 *   must be aligned to <n> bytes". NULL is not misaligned (where NULL is
 *   allowed).
 * - Sizes derived from caller values (element counts, byte sizes, strides
 *   times extents) are computed exactly or checked: one that cannot be
 *   addressed is ::FD_ERR_INVALID_ARGUMENT and the message names the
 *   parameters, never a wrapped value.
 * - Element counts and ids are fixed-width integers; request ids are
 *   caller-chosen `uint64_t`; sequence lengths and block ids are `int32_t`.
 */
#ifndef FLASHDEC_H
#define FLASHDEC_H

#include <stddef.h>
#include <stdint.h>

/** @defgroup version Version
 *  Version of this header. The runtime library reports its own version through
 *  ::fd_version_number. From 1.0 on, header and runtime are compatible when
 *  their major versions are equal and the runtime's minor version is at least
 *  the header's. Before 1.0 (major 0) a minor version may change the ABI once,
 *  deliberately (docs/abi.md), so the minor versions must be equal too; the
 *  SONAME then carries both (libflashdec.so.0.2), and a program built against
 *  another 0.x minor does not load:
 *  @code
 *  uint32_t rt = fd_version_number();
 *  int same = FD_VERSION_MAJOR == 0 ? rt / 100u == FD_VERSION_NUMBER / 100u
 *                                   : rt / 10000u == FD_VERSION_MAJOR;
 *  int ok = same && rt >= FD_VERSION_NUMBER;
 *  @endcode
 *  @{
 */
/** Major version: from 1.0 on, changes only on an ABI break (the SONAME suffix
 *  is the major version; before 1.0 it is major.minor). */
#define FD_VERSION_MAJOR 0
/** Minor version: grows when functions or struct fields are appended (before
 *  1.0 it also marks a deliberate ABI break, see docs/abi.md). */
#define FD_VERSION_MINOR 2
/** Patch version: fixes with no interface change. */
#define FD_VERSION_PATCH 0
/** Version as one number: major * 10000 + minor * 100 + patch. */
#define FD_VERSION_NUMBER (FD_VERSION_MAJOR * 10000 + FD_VERSION_MINOR * 100 + FD_VERSION_PATCH)
/** @} */

/** @def FD_API
 *  Marks a function exported from libflashdec. Expands to a visibility
 *  attribute when building the library and to nothing for consumers, so the
 *  header can be fed to foreign-function tools after removing this token. */
#if defined(FLASHDEC_BUILDING_LIBRARY) && defined(__GNUC__)
#define FD_API __attribute__((visibility("default")))
#else
#define FD_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/** @defgroup status Status codes and errors
 *  Every fallible call returns an ::fd_status; ::fd_last_error_message says
 *  why a call failed (docs/abi.md rules 6-9).
 *  @{ */

/**
 * @brief Result of every fallible call. Values are pinned forever; new codes
 * are only appended.
 */
typedef enum fd_status {
  FD_OK = 0,                         /**< Success. */
  FD_ERR_INVALID_ARGUMENT = 1,       /**< A parameter is NULL, out of range or inconsistent. */
  FD_ERR_OUT_OF_BLOCKS = 2,          /**< Not enough free KV blocks (capacity). */
  FD_ERR_NOT_FOUND = 3,              /**< Unknown request id, prefix id or transaction. */
  FD_ERR_INVALID_STATE = 4,          /**< The object is in a state that forbids the call. */
  FD_ERR_STALE_HANDLE = 5,           /**< A value handle that no longer matches its object. */
  FD_ERR_UNSUPPORTED = 6,            /**< Valid, but not supported by this backend or build. */
  FD_ERR_NO_DEVICE = 7,              /**< A CUDA device was asked for and none is usable. */
  FD_ERR_DEVICE = 8,                 /**< The CUDA runtime reported an error. */
  FD_ERR_OUT_OF_MEMORY = 9,          /**< Host or device allocation failed. */
  FD_ERR_INTERNAL = 10,              /**< A bug in FlashDec; please report it. */
  FD_ERR_ALREADY_EXISTS = 11,        /**< An object with this id already exists. */
  FD_ERR_INVARIANT = 12,             /**< An internal invariant check failed (see message). */
  FD_STATUS_FORCE_32BIT = 0x7fffffff /**< Forces the enum to 32 bits; never returned. */
} fd_status;

/**
 * @brief Static, human-readable name of a status ("FD_ERR_NOT_FOUND: not found").
 * @param status Any value, known or not.
 * @return A static string owned by the library, never NULL; unknown values map
 *   to a generic string. Thread-safe.
 */
FD_API const char *fd_status_string(fd_status status);

/**
 * @brief Detail of the most recent failure on the calling thread.
 *
 * The text is thread-local and stays until the next failing call on the same
 * thread (successful calls leave it unchanged); only the returned status
 * decides success. The pointer stays valid until the next FlashDec call on this
 * thread.
 * @return Owned by the library (thread-local; do not free); never NULL (empty
 *   string when no call has failed on this thread).
 */
FD_API const char *fd_last_error_message(void);

/** @} */

/* ------------------------------------------------------------------------ */
/** @addtogroup version
 *  @{ */

/** @brief Runtime version as a string. Thread-safe.
 *  @return "MAJOR.MINOR.PATCH"; a static string owned by the library, never NULL. */
FD_API const char *fd_version_string(void);
/** @brief Runtime version as a number. Thread-safe.
 *  @return major * 10000 + minor * 100 + patch (compare with ::FD_VERSION_NUMBER). */
FD_API uint32_t fd_version_number(void);

/** @} */

/* ------------------------------------------------------------------------ */
/** @defgroup types Basic types
 *  Element types, KV layouts, devices and CUDA streams shared by every
 *  component (docs/semantics.md S1).
 *  @{ */

/** @brief Element type of Q, K, V and output tensors. Values pinned. */
typedef enum fd_dtype {
  FD_DTYPE_F32 = 0,  /**< IEEE binary32 (CPU backend only). */
  FD_DTYPE_F16 = 1,  /**< IEEE binary16. */
  FD_DTYPE_BF16 = 2, /**< bfloat16 (upper half of binary32). */
  /** OCP FP8 E4M3 (appended in 0.2; largest finite 448, NaN 0x7f/0xff, no
   *  infinity): stored K/V only (a cache's dtype, fd_decode_params.kv_dtype,
   *  fd_kv_append_params.cache_dtype), with a dequantisation scale
   *  (docs/semantics.md S1.1). */
  FD_DTYPE_FP8_E4M3 = 3,
  /** OCP FP8 E5M2 (appended in 0.2; largest finite 57344): stored K/V only,
   *  as ::FD_DTYPE_FP8_E4M3. */
  FD_DTYPE_FP8_E5M2 = 4,
  FD_DTYPE_FORCE_32BIT = 0x7fffffff /**< Forces 32 bits; not a type. */
} fd_dtype;

/**
 * @brief Order of a KV block in memory (one of K or V, one layer, one head).
 * Values pinned.
 */
typedef enum fd_kv_layout {
  /** [block_size][head_dim]: the dims of one token are contiguous (default). */
  FD_LAYOUT_TOKEN_MAJOR = 0,
  /** [head_dim][block_size]: one dim of every token of a block is contiguous. */
  FD_LAYOUT_DIM_MAJOR = 1,
  FD_LAYOUT_FORCE_32BIT = 0x7fffffff /**< Forces 32 bits; not a layout. */
} fd_kv_layout;

/**
 * @brief Which dims of a head RoPE rotates together (docs/semantics.md
 * S3.1; appended in 0.2). Values pinned.
 *
 * Both styles use the same frequencies, inv_freq[i] = rope_base^(-2i /
 * rotary_dim) for pair i < rotary_dim / 2, and leave the dims from
 * rotary_dim on unchanged (partial rotation). They differ only in where
 * pair i lives, so a checkpoint's Q/K projection weights fix the style: a
 * model trained with one gives wrong attention under the other.
 */
typedef enum fd_rope_style {
  /** Pair i is (dim i, dim i + rotary_dim/2): the two halves of the rotated
   *  dims rotate against each other ("rotate_half", GPT-NeoX style). The
   *  default, and the layout most Hugging Face checkpoints use: Llama,
   *  Mistral, Qwen, Gemma, Phi, GPT-NeoX / Pythia (the last two with
   *  rotary_dim below head_dim). */
  FD_ROPE_SPLIT_HALF = 0,
  /** Pair i is (dim 2i, dim 2i + 1): neighbouring dims rotate together, as a
   *  complex number (GPT-J style). Used by GPT-J and CodeGen (rotary_dim 64
   *  of a larger head), ChatGLM / GLM (half of each head), and by
   *  checkpoints kept in Meta's original Llama layout, whose Q/K weights are
   *  not permuted for rotate_half. */
  FD_ROPE_INTERLEAVED = 1,
  FD_ROPE_STYLE_FORCE_32BIT = 0x7fffffff /**< Forces 32 bits; not a style. */
} fd_rope_style;

/** @brief Kind of device that holds memory or runs work. Values pinned. */
typedef enum fd_device_type {
  FD_DEVICE_CPU = 0,                 /**< Host memory; work runs on the CPU backend. */
  FD_DEVICE_CUDA = 1,                /**< CUDA device memory; work runs on the CUDA backend. */
  FD_DEVICE_FORCE_32BIT = 0x7fffffff /**< Forces 32 bits; not a device. */
} fd_device_type;

/** @brief A device: its type and, for CUDA, the device ordinal. */
typedef struct fd_device {
  int32_t type;    /**< An ::fd_device_type value. */
  int32_t ordinal; /**< CUDA device ordinal; must be 0 for ::FD_DEVICE_CPU. */
} fd_device;

/**
 * @brief A CUDA stream, ABI-identical to `cudaStream_t` / `CUstream`.
 *
 * Declared without CUDA headers. NULL means the legacy default stream. Ignored
 * by the CPU backend.
 */
typedef struct CUstream_st *fd_stream;

/**
 * @brief Number of usable CUDA devices.
 *
 * Writes 0 when the library was built without CUDA, when no driver is installed
 * or when no device is visible; this is not an error.
 * @param[out] count Borrowed; receives the count. Must not be NULL.
 * @return ::FD_OK, or ::FD_ERR_INVALID_ARGUMENT when @p count is NULL.
 * Thread-safe.
 */
FD_API fd_status fd_cuda_device_count(int32_t *count);

/** @} */

/* ------------------------------------------------------------------------ */
/** @defgroup cache Paged KV cache
 *
 *  A cache owns K and V storage for every layer, a block allocator, request
 *  state, at most one open transaction, and shared prefix blocks
 *  (docs/semantics.md S4-S7).
 *
 *  Thread contract: an ::fd_cache is externally synchronised: one thread at a
 *  time may call functions on it (different caches are independent and share
 *  no hidden state).
 *  @{ */

/** @brief Opaque paged KV cache. Created by ::fd_cache_create. */
typedef struct fd_cache fd_cache;

/** @brief Parameters of ::fd_cache_create. Initialise with ::fd_cache_config_init. */
typedef struct fd_cache_config {
  uint32_t struct_size;                  /**< sizeof(fd_cache_config) as compiled by the caller. */
  uint32_t num_layers;                   /**< Layers, > 0. Default 1. */
  uint32_t num_kv_heads;                 /**< KV heads per layer, > 0. Default 8. */
  uint32_t head_dim;                     /**< Elements per head, > 0. Default 128. */
  uint32_t block_size;                   /**< Tokens per block, > 0. Default 16. */
  uint32_t max_blocks;                   /**< Physical blocks per layer, > 0. Default 1024. */
  uint32_t prefix_cache_capacity_blocks; /**< Blocks usable by shared prefixes, <= max_blocks; 0
                                            (default) disables prefixes. */
  int32_t dtype;                         /**< ::fd_dtype of stored K/V. Default ::FD_DTYPE_F16. */
  int32_t layout;   /**< ::fd_kv_layout of storage. Default ::FD_LAYOUT_TOKEN_MAJOR. */
  fd_device device; /**< Where K/V live. Default CPU. */
  /* Appended in 0.1: external K/V storage. An engine that already owns its
   * KV memory lets the cache manage blocks inside it. All NULL / 0 (the
   * default): the cache allocates and zeroes its own storage. */
  uint32_t reserved0;   /**< Must be 0 (keeps the pointers below 8-byte aligned). */
  void *k_storage;      /**< External K storage or NULL (default: owned). Caller-owned; must
                             stay valid until ::fd_cache_destroy and hold every element the
                             strides below address for num_layers layers and max_blocks
                             blocks; in @p device's memory (CUDA: device memory of that
                             ordinal). Not cleared by the cache. Set together with v_storage. */
  void *v_storage;      /**< External V storage, same strides as K; NULL with k_storage. */
  int64_t stride_layer; /**< Elements between layers of external storage; 0: max_blocks *
                             stride_block. Must be 0 without external storage. */
  int64_t stride_block; /**< Elements between blocks. These four are all 0 (packed storage
                             of @p layout) or all > 0, with the layout's contiguous axis at
                             stride 1 (dim for token-major, token for dim-major), as in
                             ::fd_decode_params; e.g. NHD pages [blocks, block_size, heads,
                             head_dim] are token-major {block_size*H*D, D, H*D, 1}. */
  int64_t stride_head;  /**< Elements between KV heads (see stride_block). */
  int64_t stride_token; /**< Elements between tokens of a block (see stride_block). */
  int64_t stride_dim;   /**< Elements between dims (see stride_block). */
  /* Appended in 0.2: FP8 storage. The cache stores K/V in dtype and takes
   * them (and Q, for fused RoPE writes) in input_dtype; an FP8 cache
   * quantises on write, stored = saturate(x / scale) rounded to nearest even
   * (docs/semantics.md S1.1), with one K and one V scale per layer. */
  int32_t input_dtype;   /**< ::fd_dtype of K, V and Q given to layer writes and of the
                              engine's step tensors; -1 (default): dtype. An FP8 cache
                              needs ::FD_DTYPE_F16 or ::FD_DTYPE_BF16 (or ::FD_DTYPE_F32 on
                              the CPU); any other cache needs -1 or dtype. */
  uint32_t reserved1;    /**< Must be 0. */
  const float *k_scales; /**< [num_layers] K dequantisation scales (value = stored x
                              scale), each finite and > 0, or NULL (default): all 1.
                              Host memory, copied at creation; FP8 caches only (others:
                              NULL). Change later with ::fd_cache_set_kv_scales. */
  const float *v_scales; /**< [num_layers] V scales, as k_scales. */
  /* Appended in 0.2: the RoPE convention of the cache's fused writes. */
  int32_t rope_style; /**< ::fd_rope_style with which ::fd_tx_write_layer_rope (and so the
                           engine's steps and prefill) rotates Q and K. Default
                           ::FD_ROPE_SPLIT_HALF. */
  uint32_t reserved2; /**< Must be 0. */
} fd_cache_config;

/**
 * @brief Fills @p config with defaults and sets struct_size.
 * @param[out] config Borrowed for the call; may be NULL (ignored).
 */
FD_API void fd_cache_config_init(fd_cache_config *config);

/**
 * @brief Creates a cache with zero-initialised K/V storage.
 *
 * Storage holds, for each of K and V, [num_layers, max_blocks, num_kv_heads,
 * block_size, head_dim] elements (or the dim-major equivalent).
 * @param[in] config Borrowed for the call; not NULL. External storage it
 *   names stays the caller's (see fd_cache_config.k_storage).
 * @param[out] out Not NULL; receives the new handle on success only; owned by
 *   the caller, release with ::fd_cache_destroy.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT for a NULL pointer, a zero size, a
 *   struct_size too small or larger than this library's struct, an unknown
 *   dtype/layout/device or prefix capacity > max_blocks; ::FD_ERR_NO_DEVICE
 *   when a CUDA device is asked for and none is usable; ::FD_ERR_UNSUPPORTED
 *   for a combination the backend does not serve; ::FD_ERR_OUT_OF_MEMORY when
 *   storage cannot be allocated. A cache that cannot fit is refused before
 *   anything is allocated, in microseconds: sizes whose bytes overflow
 *   (K or V above INT64_MAX bytes, strides beyond INT64_MAX bytes) are
 *   ::FD_ERR_INVALID_ARGUMENT ("overflows"), and a cache whose host memory
 *   (5 bytes of block bookkeeping per block, plus K and V for a CPU cache
 *   with owned storage) exceeds this machine's physical memory
 *   (sysconf(_SC_PHYS_PAGES) pages) is ::FD_ERR_OUT_OF_MEMORY ("cannot
 *   allocate ... physical memory"). A CUDA device refuses its storage (out of
 *   memory, no device) before the host bookkeeping is built.
 */
FD_API fd_status fd_cache_create(const fd_cache_config *config, fd_cache **out);

/**
 * @brief Destroys a cache and frees its storage. NULL is a no-op.
 * Any open transaction is discarded. The handle is invalid afterwards.
 * @param cache Owned by the caller, released here; may be NULL.
 */
FD_API void fd_cache_destroy(fd_cache *cache);

/**
 * @brief Copies the cache's configuration (with defaults resolved).
 * @param[in] cache Borrowed for the call; not NULL.
 * @param[in,out] config Borrowed for the call; not NULL. Caller sets
 *   struct_size (at least through max_blocks); the library fills what fits.
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT (NULL, too-small struct_size).
 */
FD_API fd_status fd_cache_get_config(const fd_cache *cache, fd_cache_config *config);

/** @brief Lifecycle state of a request id in a cache. Values pinned. */
typedef enum fd_request_state {
  FD_REQUEST_UNKNOWN = 0,                   /**< Never added to this cache. */
  FD_REQUEST_ACTIVE = 1,                    /**< Added and neither finished nor cancelled. */
  FD_REQUEST_FINISHED = 2,                  /**< Finished (terminal). */
  FD_REQUEST_CANCELLED = 3,                 /**< Cancelled (terminal). */
  FD_REQUEST_STATE_FORCE_32BIT = 0x7fffffff /**< Forces 32 bits. */
} fd_request_state;

/**
 * @brief Adds an empty active request.
 * @param[in,out] cache Borrowed for the call; not NULL.
 * @param request_id Caller-chosen id.
 * @return ::FD_OK (also when @p request_id is already active: no-op);
 *   ::FD_ERR_INVALID_STATE when the id is finished or cancelled, or while a
 *   transaction is open; ::FD_ERR_INVALID_ARGUMENT (NULL cache);
 *   ::FD_ERR_OUT_OF_MEMORY.
 */
FD_API fd_status fd_cache_add_request(fd_cache *cache, uint64_t request_id);

/**
 * @brief Finishes an active request: releases its private blocks to the front
 * of the free list (contents are not cleared) and drops its prefix reference.
 * @param[in,out] cache Borrowed for the call; not NULL.
 * @param request_id An active request.
 * @return ::FD_OK; ::FD_ERR_NOT_FOUND for an unknown id;
 *   ::FD_ERR_INVALID_STATE for a terminal id or while a transaction is open;
 *   ::FD_ERR_INVALID_ARGUMENT (NULL cache).
 */
FD_API fd_status fd_cache_finish_request(fd_cache *cache, uint64_t request_id);

/** @brief As ::fd_cache_finish_request, but the terminal state is cancelled.
 *  @param[in,out] cache Borrowed for the call; not NULL.
 *  @param request_id An active request.
 *  @return As ::fd_cache_finish_request. */
FD_API fd_status fd_cache_cancel_request(fd_cache *cache, uint64_t request_id);

/**
 * @brief Reports the lifecycle state of a request id.
 * @param[in] cache Borrowed for the call; not NULL.
 * @param request_id Any id.
 * @param[out] state Not NULL; receives an ::fd_request_state value (unknown
 *   ids give ::FD_REQUEST_UNKNOWN, which is not an error).
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT (NULL).
 */
FD_API fd_status fd_cache_request_state(const fd_cache *cache, uint64_t request_id, int32_t *state);

/**
 * @brief Number of new blocks growing every listed request by one token needs.
 *
 * A row needs a block exactly when seq_len % block_size == 0.
 * @param[in] cache Borrowed for the call; not NULL.
 * @param[in] request_ids Host memory, borrowed for the call; @p count active,
 *   unique ids.
 * @param count Entries of @p request_ids, >= 1.
 * @param[out] needed Not NULL; receives the block count.
 * @param[out] free_blocks Receives the current free block count; may be NULL.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, count 0, duplicates);
 *   ::FD_ERR_NOT_FOUND; ::FD_ERR_INVALID_STATE (a terminal id).
 */
FD_API fd_status fd_cache_blocks_needed(const fd_cache *cache, const uint64_t *request_ids,
                                        uint32_t count, uint32_t *needed, uint32_t *free_blocks);

/**
 * @brief Number of new blocks growing the listed requests by
 * @p token_counts[i] tokens each needs: the blocks ::fd_tx_begin_multi with
 * the same lists allocates (a row's new tokens fill its last block, then
 * whole new ones).
 *
 * Appended in 0.2 (issue 14): callers that plan multi-token steps (the
 * engine, schedulers) ask the cache rather than restate its block rule.
 * @param[in] cache Borrowed for the call; not NULL.
 * @param[in] request_ids Host memory, borrowed for the call; @p count active,
 *   unique ids.
 * @param[in] token_counts Host memory, borrowed for the call; @p count
 *   entries, each >= 1; NULL means one token per row (the same result as
 *   ::fd_cache_blocks_needed).
 * @param count Entries of both lists, >= 1.
 * @param[out] needed Not NULL; receives the block count (saturated at
 *   UINT32_MAX).
 * @param[out] free_blocks Receives the current free block count; may be NULL.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, count 0, duplicates, a
 *   token count of 0, a row or the whole step past INT32_MAX tokens, as
 *   ::fd_tx_begin_multi refuses them); ::FD_ERR_NOT_FOUND;
 *   ::FD_ERR_INVALID_STATE (a terminal id).
 */
FD_API fd_status fd_cache_blocks_needed_multi(const fd_cache *cache, const uint64_t *request_ids,
                                              const uint32_t *token_counts, uint32_t count,
                                              uint32_t *needed, uint32_t *free_blocks);

/**
 * @brief Largest number of blocks owned by any of the listed requests: the
 * smallest valid @p table_stride for ::fd_cache_export.
 * @param[in] cache Borrowed for the call; not NULL.
 * @param[in] request_ids Host memory, borrowed for the call; @p count ids.
 * @param count Entries of @p request_ids, >= 1.
 * @param[out] max_blocks_per_seq Not NULL; receives the largest block count.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, count 0);
 *   ::FD_ERR_NOT_FOUND; ::FD_ERR_INVALID_STATE (a terminal id).
 */
FD_API fd_status fd_cache_max_blocks_per_seq(const fd_cache *cache, const uint64_t *request_ids,
                                             uint32_t count, uint32_t *max_blocks_per_seq);

/**
 * @brief Exports committed block tables and seq_lens of active requests, in
 * the caller's order, into host memory.
 *
 * Row r of @p block_tables holds the physical block ids of request_ids[r],
 * padded with -1 to @p table_stride entries. An open transaction's new blocks
 * are not included (use ::fd_tx_block_tables).
 * @param[in] cache Borrowed for the call; not NULL.
 * @param[in] request_ids Host memory, borrowed for the call; @p count ids.
 * @param count Entries of @p request_ids (rows), >= 1.
 * @param table_stride Entries per row of @p block_tables, at least the
 *   longest row (::fd_cache_max_blocks_per_seq).
 * @param[out] block_tables Host memory, [count, table_stride] int32; may be
 *   NULL to export only seq_lens.
 * @param[out] seq_lens Host memory, [count] int32; may be NULL.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL ids, count 0, a row longer
 *   than table_stride: nothing is written); ::FD_ERR_NOT_FOUND;
 *   ::FD_ERR_INVALID_STATE (a terminal id).
 */
FD_API fd_status fd_cache_export(const fd_cache *cache, const uint64_t *request_ids, uint32_t count,
                                 uint32_t table_stride, int32_t *block_tables, int32_t *seq_lens);

/**
 * @brief Current state version: grows on every ownership or seq_len change.
 * @param[in] cache Borrowed for the call; not NULL.
 * @param[out] version Not NULL; receives the version.
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT (NULL).
 */
FD_API fd_status fd_cache_state_version(const fd_cache *cache, uint64_t *version);

/**
 * @brief Where one layer's K and V storage lives, for use with ::fd_decode.
 *
 * The pointers are owned by the cache until ::fd_cache_destroy, in the cache's
 * device memory. Strides are in elements for (block, head, token, dim), as in
 * ::fd_decode_params.
 * @param[in] cache Borrowed for the call; not NULL.
 * @param layer Layer index, < num_layers.
 * @param[out] k Not NULL; receives the K base of @p layer.
 * @param[out] v Not NULL; receives the V base of @p layer.
 * @param[out] strides Not NULL; receives 4 strides: block, head, token, dim.
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT (layer out of range, NULL).
 */
FD_API fd_status fd_cache_layer_storage(fd_cache *cache, uint32_t layer, void **k, void **v,
                                        int64_t strides[4]);

/**
 * @brief Legacy single-layer append (S5.1): one token for each listed request.
 *
 * Only for caches with num_layers == 1 and no open transaction. Equivalent to
 * ::fd_tx_begin + ::fd_tx_write_layer (layer 0) + ::fd_tx_commit, with the
 * same failure rules: every check (ids, states, capacity) happens before any
 * mutation.
 * @param[in,out] cache Borrowed for the call; not NULL.
 * @param[in] request_ids Host memory, borrowed for the call; @p count active,
 *   unique ids.
 * @param count Entries of @p request_ids, >= 1.
 * @param[in] k,v [count, num_kv_heads, head_dim] in the cache's dtype, in the
 *   cache's device memory; borrowed for the call (CUDA: read on @p stream).
 * @param stream CUDA stream the copy is enqueued on (NULL: default stream);
 *   ignored by CPU caches.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT; ::FD_ERR_NOT_FOUND;
 *   ::FD_ERR_INVALID_STATE; ::FD_ERR_OUT_OF_BLOCKS (capacity_failure_count
 *   and transaction_failure_count + 1, nothing else changes).
 */
FD_API fd_status fd_cache_append(fd_cache *cache, const uint64_t *request_ids, uint32_t count,
                                 const void *k, const void *v, fd_stream stream);

/**
 * @brief Counters and gauges of a cache (docs/semantics.md S7). Caller sets
 * struct_size; the library fills the fields that fit.
 */
typedef struct fd_cache_metrics {
  uint32_t struct_size; /**< sizeof(fd_cache_metrics) as compiled by the caller. */
  uint32_t reserved0;   /**< Padding; written as 0. */
  /* capacity */
  uint64_t max_blocks;           /**< Physical blocks. */
  uint64_t used_blocks;          /**< Private + prefix + open-transaction blocks. */
  uint64_t free_blocks;          /**< Blocks on the free list. */
  double block_utilization;      /**< used_blocks / max_blocks. */
  uint64_t active_tokens;        /**< Sum of active requests' committed seq_len. */
  uint64_t physical_data_tokens; /**< Tokens stored in used blocks (shared prefix tokens counted
                                    once). */
  uint64_t reserved_tokens;      /**< used_blocks * block_size. */
  uint64_t internal_fragmentation_tokens; /**< reserved_tokens - physical_data_tokens. */
  double
      internal_fragmentation_ratio; /**< fragmentation / reserved_tokens (0 when none reserved). */
  /* allocator (S4.2) */
  uint64_t allocation_count; /**< Blocks taken from the free list (rollback undoes nothing here). */
  uint64_t fresh_allocation_count; /**< Allocations of a block never allocated before. */
  uint64_t reuse_count;            /**< Allocations of a previously used block. */
  uint64_t free_count;             /**< Blocks released by finish/cancel/prefix eviction. */
  uint64_t capacity_failure_count; /**< Calls refused for lack of blocks. */
  /* requests */
  uint64_t active_request_count;    /**< Requests in state active. */
  uint64_t finished_request_count;  /**< Requests in state finished. */
  uint64_t cancelled_request_count; /**< Requests in state cancelled. */
  /* transactions (S5) */
  uint64_t transaction_begin_count;          /**< Successful begins. */
  uint64_t transaction_commit_count;         /**< Commits. */
  uint64_t transaction_abort_count;          /**< Aborts. */
  uint64_t open_transaction_count;           /**< 0 or 1. */
  uint64_t pending_request_count;            /**< Rows of the open transaction. */
  uint64_t reserved_transaction_blocks;      /**< Blocks allocated by the open transaction. */
  uint64_t transaction_layer_write_count;    /**< Successful layer writes. */
  uint64_t transaction_rollback_block_count; /**< Blocks returned by aborts. */
  /** Transactions that could not get or write their token: begins and legacy
   *  appends refused for lack of blocks (::FD_ERR_OUT_OF_BLOCKS), and failed
   *  layer writes of the open transaction (wrong layer, NULL, misaligned or
   *  overlapping data, bad RoPE arguments, a device or memory failure). Not
   *  counted (nothing changes): begins and appends refused for their ids,
   *  count, data or an open transaction, writes whose handle names no open
   *  transaction (stale, finished, unknown), failed commit, abort and view
   *  calls. */
  uint64_t transaction_failure_count;
  uint64_t retained_transaction_state_count;   /**< 0 or 1: full states held. */
  uint64_t terminal_transaction_history_count; /**< Entries in the terminal history. */
  uint64_t terminal_transaction_history_limit; /**< 256. */
  /* bytes */
  uint64_t bytes_per_block; /**< num_layers * 2 * kv_heads * block_size * head_dim * elem size. */
  uint64_t allocated_kv_bytes;         /**< used_blocks * bytes_per_block. */
  uint64_t reserved_transaction_bytes; /**< reserved_transaction_blocks * bytes_per_block. */
  /* shared prefixes (S6) */
  uint64_t prefix_cache_capacity_blocks;  /**< From the config. */
  uint64_t resident_prefix_count;         /**< Registered, not evicted prefixes. */
  uint64_t resident_prefix_blocks;        /**< Blocks held by them. */
  uint64_t active_prefix_references;      /**< Sum of prefix reference counts. */
  uint64_t shared_prefix_blocks;          /**< Blocks of prefixes with >= 1 reference. */
  uint64_t saved_prefix_blocks;           /**< Sum of max(0, refs - 1) * n. */
  uint64_t saved_prefix_bytes;            /**< saved_prefix_blocks * bytes_per_block. */
  uint64_t prefix_registration_count;     /**< Successful registrations. */
  uint64_t prefix_hit_count;              /**< Successful attaches. */
  uint64_t prefix_miss_count;             /**< Attaches of unknown ids. */
  double prefix_hit_ratio;                /**< hits / (hits + misses), 0 when none. */
  uint64_t prefix_eviction_count;         /**< Evictions (explicit and LRU). */
  uint64_t prefix_capacity_failure_count; /**< Registrations refused for capacity. */
  uint64_t state_version;                 /**< As ::fd_cache_state_version. */
} fd_cache_metrics;

/**
 * @brief Reads the cache metrics.
 * @param[in] cache Borrowed for the call; not NULL.
 * @param[in,out] metrics Borrowed for the call; not NULL. Caller sets
 *   struct_size (at least up to and including max_blocks); the library fills
 *   what fits.
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT (NULL, too-small struct_size).
 */
FD_API fd_status fd_cache_metrics_get(const fd_cache *cache, fd_cache_metrics *metrics);

/**
 * @brief Checks every invariant of docs/semantics.md S7.
 * @param[in] cache Borrowed for the call; not NULL.
 * @return ::FD_OK when all hold; ::FD_ERR_INVARIANT with the first violation,
 *   in words, in ::fd_last_error_message; ::FD_ERR_INVALID_ARGUMENT for NULL.
 */
FD_API fd_status fd_cache_validate(const fd_cache *cache);

/**
 * @brief As ::fd_cache_export, but the destinations are device memory and the
 * copy is enqueued on @p stream with no host synchronisation (appended in 0.1).
 *
 * The tables are computed on the host into pinned staging memory owned by the
 * cache and copied with one asynchronous copy per array; the staging slot is
 * reused only after a CUDA event recorded behind the copy has completed, so
 * the caller may call again at once. Usable inside stream capture (the
 * captured copy reads a staging slot that the cache then never reuses; a
 * cache keeps at most 64 slots and, past that, recycles the oldest captured
 * one). The first call, or one larger than any before, allocates staging
 * memory: make it outside capture.
 * On a CPU cache the destinations are host memory, written before return, and
 * @p stream is ignored.
 * @param[in] cache Borrowed for the call; not NULL.
 * @param[in] request_ids Host memory, borrowed for the call; as
 *   ::fd_cache_export.
 * @param count Rows, >= 1.
 * @param table_stride Entries per row, as ::fd_cache_export.
 * @param[out] block_tables Device memory (CUDA cache), [count, table_stride]
 *   int32, written asynchronously on @p stream; may be NULL.
 * @param[out] seq_lens Device memory (CUDA cache), [count] int32; may be NULL.
 * @param stream CUDA stream the copies are enqueued on (NULL: default stream).
 * @return As ::fd_cache_export (nothing is enqueued on failure);
 *   ::FD_ERR_DEVICE (a CUDA call failed); ::FD_ERR_OUT_OF_MEMORY (staging).
 */
FD_API fd_status fd_cache_export_async(const fd_cache *cache, const uint64_t *request_ids,
                                       uint32_t count, uint32_t table_stride, int32_t *block_tables,
                                       int32_t *seq_lens, fd_stream stream);

/**
 * @brief Reports an asynchronous device fault of work the cache enqueued
 * (docs/abi.md rule 17; appended in 0.1).
 *
 * Never blocks: it queries the CUDA events the cache recorded behind its own
 * work and the CUDA runtime's pending error. The first fault seen is kept and
 * reported by every later call. A CPU cache always reports ::FD_OK.
 * @param[in] cache Borrowed for the call; not NULL.
 * @return ::FD_OK when no fault has been observed; ::FD_ERR_DEVICE with the
 *   CUDA error's name in ::fd_last_error_message; ::FD_ERR_INVALID_ARGUMENT
 *   (NULL cache).
 */
FD_API fd_status fd_cache_async_error(const fd_cache *cache);

/**
 * @brief Shortens committed requests (appended in 0.2): tokens rejected by an
 * earlier speculative step, or an engine rolling back.
 *
 * Atomic for the batch: everything is checked first, then request i's
 * seq_len becomes seq_lens[i] and its blocks past the first
 * ceil(seq_lens[i] / block_size) are released to the front of the free list
 * in table order (each pushed to the front in turn, as finish releases them:
 * the last one is handed out first; free_count grows by their number).
 * Contents are not cleared. Shared prefix blocks are never released: a
 * length shorter than the attached prefix is refused. state_version grows
 * when a length changes; truncating to the current lengths changes nothing.
 * @param[in,out] cache Borrowed for the call; not NULL.
 * @param[in] request_ids Host memory, borrowed for the call; @p count unique,
 *   active ids.
 * @param[in] seq_lens Host memory, [count] int32, borrowed for the call: the
 *   new lengths, 0 <= seq_lens[i] <= the request's seq_len.
 * @param count Entries of both arrays, >= 1.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, count 0, duplicates, a
 *   length outside [0, seq_len] or one that "would cut into the attached
 *   prefix": the message names seq_lens[i]); ::FD_ERR_NOT_FOUND (unknown id);
 *   ::FD_ERR_INVALID_STATE (terminal id, or a transaction is open). A failure
 *   changes nothing.
 */
FD_API fd_status fd_cache_truncate(fd_cache *cache, const uint64_t *request_ids,
                                   const int32_t *seq_lens, uint32_t count);

/**
 * @brief Replaces an FP8 cache's per-layer K and V scales (appended in 0.2),
 * as vLLM's k_scale / v_scale change between steps.
 *
 * Tokens already stored keep their bytes: they are read with the new scales
 * afterwards (the caller re-quantises if it needs otherwise). Later writes
 * quantise with the new scales. Refused while a transaction is open.
 * @param[in,out] cache Borrowed for the call; not NULL; dtype FP8.
 * @param[in] k_scales,v_scales Host memory, [num_layers] each, borrowed for
 *   the call (copied); each finite and > 0; not NULL.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, a zero, negative or
 *   non-finite scale, naming the entry: nothing changes);
 *   ::FD_ERR_INVALID_STATE (not an FP8 cache, a transaction is open).
 */
FD_API fd_status fd_cache_set_kv_scales(fd_cache *cache, const float *k_scales,
                                        const float *v_scales);

/**
 * @brief Reads a cache's per-layer K and V scales (appended in 0.2); all 1
 * for a cache that is not FP8.
 * @param[in] cache Borrowed for the call; not NULL.
 * @param[out] k_scales,v_scales Host memory, [num_layers] each, borrowed for
 *   the call; either may be NULL (skipped).
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT (NULL cache).
 */
FD_API fd_status fd_cache_get_kv_scales(const fd_cache *cache, float *k_scales, float *v_scales);

/** @} */

/* ------------------------------------------------------------------------ */
/** @defgroup transactions Multi-layer token transactions
 *  Behaviour: docs/semantics.md S5.
 *
 *  New tokens for a batch of requests (one each with ::fd_tx_begin, k_i >= 1
 *  for request i with ::fd_tx_begin_multi), written layer by layer, then
 *  published at once (commit, or keep-a_i commit for speculative verify) or
 *  rolled back (abort). At most one transaction is open per cache. Same
 *  thread contract as the cache.
 *  @{ */

/**
 * @brief A transaction handle: a value, not a pointer. Misuse (stale, already
 * finished or unknown handles) is detected and reported, never undefined.
 */
typedef struct fd_tx {
  uint64_t id;            /**< Transaction id; ids start at 1 in each cache. */
  uint64_t cache_version; /**< Cache state version right after begin. */
} fd_tx;

/** @brief State of a transaction. Values pinned. */
typedef enum fd_tx_state {
  FD_TX_OPEN = 0,                      /**< Begun, neither committed nor aborted. */
  FD_TX_COMMITTED = 1,                 /**< Published. */
  FD_TX_ABORTED = 2,                   /**< Rolled back. */
  FD_TX_STATE_FORCE_32BIT = 0x7fffffff /**< Forces 32 bits. */
} fd_tx_state;

/**
 * @brief Opens a transaction for one new token of each listed request.
 *
 * Ids must be non-empty, unique and active, and no transaction may be open.
 * Capacity is checked for the whole batch first. Row r gets position =
 * seq_len, offset = position % block_size, and a new block where offset == 0.
 * The same as ::fd_tx_begin_multi with every token count 1 (token_count ==
 * batch).
 * @param[in,out] cache Borrowed for the call; not NULL.
 * @param[in] request_ids Host memory, borrowed for the call; copied.
 * @param count Entries of @p request_ids (the batch), >= 1.
 * @param[out] tx Not NULL; receives the handle on success only (a value:
 *   nothing to release).
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, count 0, duplicates);
 *   ::FD_ERR_NOT_FOUND; ::FD_ERR_INVALID_STATE (terminal id, a transaction
 *   already open); ::FD_ERR_OUT_OF_BLOCKS (capacity_failure_count and
 *   transaction_failure_count + 1, nothing else changes);
 *   ::FD_ERR_OUT_OF_MEMORY (nothing changes). Only the capacity refusal counts
 *   in transaction_failure_count; the other failures change nothing. Begin
 *   reserves the host memory that ::fd_tx_commit and ::fd_tx_abort need, so
 *   once a transaction is open neither fails for lack of memory.
 */
FD_API fd_status fd_tx_begin(fd_cache *cache, const uint64_t *request_ids, uint32_t count,
                             fd_tx *tx);

/**
 * @brief Writes one layer's K and V for every new token of the transaction,
 * at the locations the cache computed at begin.
 *
 * @p layer must equal the transaction's next layer. On success next_layer + 1
 * and transaction_layer_write_count + 1; on any failure of the open
 * transaction's write (wrong layer, bad data, a device error)
 * transaction_failure_count + 1 and the transaction stays open and unchanged.
 * A handle that names no open transaction (stale, finished, unknown) changes
 * nothing, that counter included.
 * @param[in,out] cache Borrowed for the call; not NULL.
 * @param tx Handle from ::fd_tx_begin on this cache.
 * @param layer The transaction's next layer.
 * @param[in] k,v [token_count, num_kv_heads, head_dim] in the cache's dtype
 *   and device memory: the transaction's new tokens packed in row order (row
 *   0's k_0 tokens by position, then row 1's, ...; token_count = batch for
 *   ::fd_tx_begin, fd_tx_info.token_count in general); borrowed for the call
 *   (CUDA: read on @p stream).
 * @param stream CUDA stream the append is enqueued on (NULL: default
 *   stream); ignored by CPU caches.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL data, wrong layer: "transaction
 *   requires layer 2, got layer 3"); ::FD_ERR_STALE_HANDLE; ::FD_ERR_NOT_FOUND
 *   (unknown transaction); ::FD_ERR_INVALID_STATE (already committed/aborted).
 */
FD_API fd_status fd_tx_write_layer(fd_cache *cache, fd_tx tx, uint32_t layer, const void *k,
                                   const void *v, fd_stream stream);

/**
 * @brief As ::fd_tx_write_layer, but first rotates Q and K with RoPE (S3.1),
 * in the cache's fd_cache_config.rope_style, each token at its own position;
 * writes rotated K and raw V; returns rotated Q.
 *
 * @param[in,out] cache Borrowed for the call; not NULL.
 * @param tx Handle from ::fd_tx_begin on this cache.
 * @param layer The transaction's next layer.
 * @param[in] q [token_count, num_q_heads, head_dim] in the cache's dtype and
 *   device memory, packed as K (token_count = batch for ::fd_tx_begin);
 *   borrowed for the call (CUDA: until @p stream reaches it).
 * @param num_q_heads A positive multiple of the cache's num_kv_heads.
 * @param[in] k,v As ::fd_tx_write_layer.
 * @param rotary_dim Even, 0 < rotary_dim <= head_dim.
 * @param rope_base Finite, > 0 (e.g. 10000).
 * @param[out] q_out [token_count, num_q_heads, head_dim], same memory kind as @p q;
 *   borrowed; may equal @p q (in place).
 * @param stream As ::fd_tx_write_layer.
 * @return As ::fd_tx_write_layer.
 */
FD_API fd_status fd_tx_write_layer_rope(fd_cache *cache, fd_tx tx, uint32_t layer, const void *q,
                                        uint32_t num_q_heads, const void *k, const void *v,
                                        uint32_t rotary_dim, float rope_base, void *q_out,
                                        fd_stream stream);

/**
 * @brief Publishes the tokens: every row's seq_len grows by its token count
 * (one with ::fd_tx_begin); the same as ::fd_tx_commit_keep keeping all.
 * @param[in,out] cache Borrowed for the call; not NULL.
 * @param tx Handle from ::fd_tx_begin on this cache.
 * @return ::FD_OK; ::FD_ERR_INVALID_STATE when not every layer was written
 *   (the transaction stays open) or when already committed/aborted;
 *   ::FD_ERR_STALE_HANDLE; ::FD_ERR_NOT_FOUND.
 */
FD_API fd_status fd_tx_commit(fd_cache *cache, fd_tx tx);

/**
 * @brief Rolls the tokens back: new blocks return to the front of the free
 * list in their previous order; seq_lens unchanged.
 * @param[in,out] cache Borrowed for the call; not NULL.
 * @param tx Handle from ::fd_tx_begin on this cache.
 * @return ::FD_OK; ::FD_ERR_INVALID_STATE (already committed/aborted);
 *   ::FD_ERR_STALE_HANDLE; ::FD_ERR_NOT_FOUND.
 */
FD_API fd_status fd_tx_abort(fd_cache *cache, fd_tx tx);

/** @brief Summary of an open transaction. */
typedef struct fd_tx_info {
  uint32_t struct_size;        /**< sizeof(fd_tx_info) as compiled by the caller. */
  uint32_t batch;              /**< Rows. */
  uint32_t next_layer;         /**< Next layer to write. */
  int32_t state;               /**< ::fd_tx_state (always ::FD_TX_OPEN here). */
  uint32_t max_blocks_per_seq; /**< Smallest valid table stride for ::fd_tx_block_tables. */
  uint32_t new_block_count;    /**< Blocks allocated at begin. */
  /* Appended in 0.2 (a caller's older, smaller struct gets the fields above). */
  uint32_t token_count; /**< New tokens, sum of the rows' token counts (= batch for
                             ::fd_tx_begin): the first dimension of the layer writes' K, V
                             and Q. */
} fd_tx_info;

/**
 * @brief Describes an open transaction.
 * @param[in] cache Borrowed for the call; not NULL.
 * @param tx Handle from ::fd_tx_begin on this cache.
 * @param[in,out] info Borrowed for the call; not NULL. Caller sets struct_size
 *   (at least through batch); the library fills what fits.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, too-small struct_size);
 *   ::FD_ERR_STALE_HANDLE;
 *   ::FD_ERR_NOT_FOUND; ::FD_ERR_INVALID_STATE (committed/aborted).
 */
FD_API fd_status fd_tx_get_info(const fd_cache *cache, fd_tx tx, fd_tx_info *info);

/**
 * @brief Per-row view of an open transaction, in begin's row order. Every
 * output is host memory of `batch` entries, borrowed for the call, and may be
 * NULL to skip it. For a row of k new tokens, positions, block_ids and offsets
 * describe the first one (::fd_tx_get_tokens lists every token).
 * @param[in] cache Borrowed for the call; not NULL.
 * @param tx Handle from ::fd_tx_begin on this cache.
 * @param capacity Entries available in each non-NULL array; must be >= batch.
 * @param[out] request_ids Row ids.
 * @param[out] positions First new position (= committed seq_len).
 * @param[out] block_ids Physical block of the first new token.
 * @param[out] offsets Offset inside that block.
 * @param[out] effective_seq_lens seq_len + the row's token count (+ 1 for
 *   ::fd_tx_begin).
 * @return As ::fd_tx_get_info; ::FD_ERR_INVALID_ARGUMENT when capacity < batch.
 */
FD_API fd_status fd_tx_get_rows(const fd_cache *cache, fd_tx tx, uint32_t capacity,
                                uint64_t *request_ids, int32_t *positions, int32_t *block_ids,
                                int32_t *offsets, int32_t *effective_seq_lens);

/**
 * @brief Block tables of an open transaction's rows, new blocks included,
 * padded with -1 to @p table_stride.
 * @param[in] cache Borrowed for the call; not NULL.
 * @param tx Handle from ::fd_tx_begin on this cache.
 * @param table_stride Entries per row, at least the longest row
 *   (fd_tx_info.max_blocks_per_seq).
 * @param[out] block_tables Host memory, [batch, table_stride] int32; borrowed
 *   for the call; not NULL.
 * @return As ::fd_tx_get_info; ::FD_ERR_INVALID_ARGUMENT when a row has more
 *   blocks than @p table_stride (nothing written).
 */
FD_API fd_status fd_tx_block_tables(const fd_cache *cache, fd_tx tx, uint32_t table_stride,
                                    int32_t *block_tables);

/**
 * @brief Device view of an open transaction (appended in 0.1): its block
 * tables (new blocks included, padded with -1) and effective_seq_lens
 * (seq_len + the row's token count), ready for ::fd_decode, copied into caller device buffers on
 * @p stream with no host synchronisation.
 *
 * Same staging rules as ::fd_cache_export_async. On a CPU cache the
 * destinations are host memory written before return.
 * @param[in] cache Borrowed for the call; not NULL.
 * @param tx Handle from ::fd_tx_begin on this cache.
 * @param table_stride As ::fd_tx_block_tables.
 * @param[out] block_tables Device memory (CUDA cache), [batch, table_stride]
 *   int32; may be NULL.
 * @param[out] effective_seq_lens Device memory (CUDA cache), [batch] int32
 *   (seq_len + the row's token count); may be NULL.
 * @param stream CUDA stream the copies are enqueued on (NULL: default stream).
 * @return As ::fd_tx_block_tables; ::FD_ERR_DEVICE; ::FD_ERR_OUT_OF_MEMORY.
 *
 * CUDA caches and layer writes: ::fd_tx_write_layer and
 * ::fd_tx_write_layer_rope run the append kernels with the tokens' block ids,
 * offsets and positions that the cache computed at ::fd_tx_begin. Those are
 * uploaded to the device once per transaction, by the transaction's first
 * layer write, on that write's stream (from cache-owned pinned staging; no
 * host synchronisation). Later writes of the transaction must run on the same
 * stream or one the caller orders after it, and that stream must stay valid
 * until the next ::fd_tx_begin on the cache (the staging is recycled in
 * stream order). Each write returns after
 * enqueueing; its inputs must stay valid until @p stream reaches it. The
 * first transaction, or one with more tokens than any before, allocates
 * staging memory: begin it outside stream capture. K, V, Q and q_out are
 * device memory; q_out may equal q but must not otherwise overlap q, k or v
 * (::FD_ERR_INVALID_ARGUMENT).
 */
FD_API fd_status fd_tx_block_tables_async(const fd_cache *cache, fd_tx tx, uint32_t table_stride,
                                          int32_t *block_tables, int32_t *effective_seq_lens,
                                          fd_stream stream);

/**
 * @brief Opens a transaction of token_counts[i] >= 1 new tokens for request
 * i (appended in 0.2): a prompt chunk, or the draft tokens of a speculative
 * verify step.
 *
 * As ::fd_tx_begin (which is this call with every count 1), except that row i
 * gets positions seq_len_i .. seq_len_i + k_i - 1, token j at offset
 * (seq_len_i + j) % block_size of the row's logical block (seq_len_i + j) /
 * block_size, and a new block for every logical block the row's tokens reach
 * past its committed ones (ceil((seq_len_i + k_i) / block_size) -
 * ceil(seq_len_i / block_size) blocks, taken from the front of the free list
 * row by row, in logical order). The layer writes then take the sum of k_i
 * tokens packed in row order (fd_tx_info.token_count).
 *
 * All or nothing: ids, counts and capacity for every new block are checked
 * before anything changes.
 * @param[in,out] cache Borrowed for the call; not NULL.
 * @param[in] request_ids Host memory, borrowed for the call; copied; @p count
 *   unique, active ids.
 * @param[in] token_counts Host memory, [count] uint32, borrowed for the call
 *   and copied; each >= 1; seq_len_i + k_i and the sum of the counts must fit
 *   in int32.
 * @param count Entries of @p request_ids and @p token_counts (the batch), >= 1.
 * @param[out] tx Not NULL; receives the handle on success only.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, count 0, duplicates, a
 *   count of 0: "token_counts[3] is 0: each row appends at least one token",
 *   a length or total past INT32_MAX; the message names the parameter);
 *   ::FD_ERR_NOT_FOUND; ::FD_ERR_INVALID_STATE (terminal id, a transaction
 *   already open); ::FD_ERR_OUT_OF_BLOCKS (capacity_failure_count and
 *   transaction_failure_count + 1, nothing else changes);
 *   ::FD_ERR_OUT_OF_MEMORY (nothing changes). As for ::fd_tx_begin, the
 *   memory commit, keep and abort need is reserved here.
 */
FD_API fd_status fd_tx_begin_multi(fd_cache *cache, const uint64_t *request_ids,
                                   const uint32_t *token_counts, uint32_t count, fd_tx *tx);

/**
 * @brief Per-token view of an open transaction (appended in 0.2): every new
 * token in packed order (row 0's tokens by position, then row 1's, ...), the
 * order of the layer writes' K, V and Q.
 * @param[in] cache Borrowed for the call; not NULL.
 * @param tx Handle from ::fd_tx_begin or ::fd_tx_begin_multi on this cache.
 * @param capacity Entries available in each non-NULL array; must be >=
 *   fd_tx_info.token_count.
 * @param[out] positions Host memory, borrowed for the call; each token's
 *   position; may be NULL.
 * @param[out] block_ids Host memory; the physical block each token goes to;
 *   may be NULL.
 * @param[out] offsets Host memory; the token's offset inside that block; may
 *   be NULL.
 * @return As ::fd_tx_get_info; ::FD_ERR_INVALID_ARGUMENT when capacity <
 *   token_count and an output is given (nothing written).
 */
FD_API fd_status fd_tx_get_tokens(const fd_cache *cache, fd_tx tx, uint32_t capacity,
                                  int32_t *positions, int32_t *block_ids, int32_t *offsets);

/**
 * @brief Commits the first keep_counts[i] new tokens of each row and drops
 * the rest (appended in 0.2): the keep-a_i step of speculative verify.
 *
 * Row i's seq_len grows by keep_counts[i], for every row at once. New blocks
 * of this transaction that hold no kept token go back to the front of the
 * free list in their previous order, as an abort returns them (and count in
 * transaction_rollback_block_count); dropped tokens' bytes stay in kept
 * blocks but are not visible. The transaction becomes committed (and
 * transaction_commit_count + 1). ::fd_tx_commit is this call keeping every
 * token; keeping none of a row leaves its seq_len as it was.
 * @param[in,out] cache Borrowed for the call; not NULL.
 * @param tx Handle from ::fd_tx_begin or ::fd_tx_begin_multi on this cache.
 * @param[in] keep_counts Host memory, [count] uint32, borrowed for the call;
 *   0 <= keep_counts[i] <= row i's token count.
 * @param count Entries of @p keep_counts; must equal the batch.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, count not the batch, a
 *   keep count above the row's token count: the message names
 *   keep_counts[i]; the transaction stays open and unchanged);
 *   ::FD_ERR_INVALID_STATE when not every layer was written (the transaction
 *   stays open) or when already committed/aborted; ::FD_ERR_STALE_HANDLE;
 *   ::FD_ERR_NOT_FOUND. Never fails for lack of memory (begin reserved it).
 */
FD_API fd_status fd_tx_commit_keep(fd_cache *cache, fd_tx tx, const uint32_t *keep_counts,
                                   uint32_t count);

/**
 * @brief Device copy of an open transaction's query-token offsets (appended
 * in 0.2): `[batch + 1]` int32, entry i = the tokens of rows 0..i-1, so row
 * i's new tokens are entries indptr[i] .. indptr[i+1]-1 of the packed layer
 * inputs; ready as ::fd_decode_params.q_indptr for attention over the
 * transaction's tokens. Copied on @p stream with no host synchronisation,
 * under the staging rules of ::fd_tx_block_tables_async. On a CPU cache
 * @p token_indptr is host memory written before return.
 * @param[in] cache Borrowed for the call; not NULL.
 * @param tx Handle from ::fd_tx_begin or ::fd_tx_begin_multi on this cache.
 * @param[out] token_indptr Device memory (CUDA cache), [batch + 1] int32;
 *   not NULL.
 * @param stream CUDA stream the copy is enqueued on (NULL: default stream).
 * @return As ::fd_tx_block_tables_async.
 */
FD_API fd_status fd_tx_token_indptr_async(const fd_cache *cache, fd_tx tx, int32_t *token_indptr,
                                          fd_stream stream);

/** @} */

/* ------------------------------------------------------------------------ */
/** @defgroup prefixes Shared prefix blocks
 *  Behaviour: docs/semantics.md S6.
 *  Immutable full blocks shared by several requests. Needs a cache created
 *  with prefix_cache_capacity_blocks > 0. Same thread contract as the cache.
 *  @{ */

/**
 * @brief Registers a prefix: allocates @p num_blocks blocks and copies K/V in.
 *
 * Inactive prefixes (no references) are evicted in least-recently-used order
 * to make room; if that cannot cover the need, nothing is evicted and the call
 * fails.
 * @param[in,out] cache Borrowed for the call; not NULL.
 * @param[in] prefix_id NUL-terminated, non-empty; borrowed for the call and
 *   copied.
 * @param[in] k_blocks,v_blocks [num_layers, num_blocks, num_kv_heads,
 *   block_size, head_dim] (dim-major caches: [.., head_dim, block_size]) in
 *   the cache's dtype; host or (CUDA caches) device memory; borrowed for the
 *   call.
 * @param num_blocks Blocks of the prefix, >= 1.
 * @param stream CUDA stream the copies are enqueued on (NULL: default
 *   stream); ignored by CPU caches.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, empty id, num_blocks 0);
 *   ::FD_ERR_ALREADY_EXISTS (duplicate id); ::FD_ERR_OUT_OF_BLOCKS
 *   (num_blocks > capacity, or "insufficient evictable prefix capacity");
 *   ::FD_ERR_INVALID_STATE (a transaction is open); ::FD_ERR_UNSUPPORTED
 *   (prefixes disabled).
 */
FD_API fd_status fd_prefix_register(fd_cache *cache, const char *prefix_id, const void *k_blocks,
                                    const void *v_blocks, uint32_t num_blocks, fd_stream stream);

/**
 * @brief Attaches a registered prefix to an active, empty request with no
 * prefix: its first blocks become the prefix's, seq_len = n * block_size.
 * @param[in,out] cache Borrowed for the call; not NULL.
 * @param request_id An active, empty request.
 * @param[in] prefix_id NUL-terminated; borrowed for the call.
 * @return ::FD_OK; ::FD_ERR_NOT_FOUND (unknown prefix: prefix_miss_count + 1;
 *   or unknown request); ::FD_ERR_INVALID_STATE (request not active, not empty
 *   or already attached; a transaction is open); ::FD_ERR_INVALID_ARGUMENT.
 */
FD_API fd_status fd_prefix_attach(fd_cache *cache, uint64_t request_id, const char *prefix_id);

/**
 * @brief Evicts an unreferenced prefix and frees its blocks.
 * @param[in,out] cache Borrowed for the call; not NULL.
 * @param[in] prefix_id NUL-terminated; borrowed for the call.
 * @return ::FD_OK; ::FD_ERR_NOT_FOUND; ::FD_ERR_INVALID_STATE (references
 *   remain, or a transaction is open); ::FD_ERR_INVALID_ARGUMENT.
 */
FD_API fd_status fd_prefix_evict(fd_cache *cache, const char *prefix_id);

/** @brief State of one resident prefix. */
typedef struct fd_prefix_info {
  uint32_t struct_size; /**< sizeof(fd_prefix_info) as compiled by the caller. */
  uint32_t num_blocks;  /**< Blocks of the prefix. */
  uint32_t ref_count;   /**< Attached active requests. */
  uint32_t reserved0;   /**< Padding; written as 0. */
  uint64_t last_use;    /**< LRU clock value of the last touch (larger = more recent). */
  int32_t first_block;  /**< Physical id of the prefix's first block. */
  uint32_t reserved1;   /**< Padding; written as 0. */
} fd_prefix_info;

/**
 * @brief Reports a resident prefix's state.
 * @param[in] cache Borrowed for the call; not NULL.
 * @param[in] prefix_id NUL-terminated; borrowed for the call.
 * @param[in,out] info Borrowed for the call; not NULL. Caller sets struct_size
 *   (at least through num_blocks); the library fills what fits.
 * @return ::FD_OK; ::FD_ERR_NOT_FOUND (not resident); ::FD_ERR_INVALID_ARGUMENT
 *   (NULL, too-small struct_size).
 */
FD_API fd_status fd_prefix_get_info(const fd_cache *cache, const char *prefix_id,
                                    fd_prefix_info *info);

/** @} */

/* ------------------------------------------------------------------------ */
/** @defgroup decode Decode attention, RoPE and KV append
 *  Behaviour: docs/semantics.md S1-S3.
 *
 *  Stateless functions; thread-safe (each call only touches the memory its
 *  parameters name).
 *  @{ */

/** @brief ::fd_decode_params flag: validate seq_lens and block ids on the host
 *  before launching. For device pointers this copies them to the host and
 *  synchronises @p stream (not usable inside graph capture). Host pointers are
 *  always validated. */
#define FD_DECODE_CHECK_INDICES 1u

/**
 * @brief Parameters of ::fd_decode, ::fd_decode_plan_create and
 * ::fd_decode_run (reshaped in 0.2). Initialise with ::fd_decode_params_init.
 *
 * Six sections: shape, element types, the paged K/V view, queries and
 * output, the attention variant, and execution. New fields are appended at
 * the end (docs/abi.md).
 *
 * Paged K/V view: element (block b, kv head h, token t, dim d) of a K or V
 * cache lives at `base + b*stride_block + h*stride_head + t*stride_token +
 * d*stride_dim` (strides in elements). All four strides 0 means packed
 * storage of @p layout: token-major [num_blocks, num_kv_heads, block_size,
 * head_dim] or dim-major [num_blocks, num_kv_heads, head_dim, block_size].
 * With explicit strides the layout's contiguous axis must have stride 1 (dim
 * for token-major, token for dim-major); e.g. vLLM/FlashInfer NHD pages
 * [num_blocks, block_size, num_kv_heads, head_dim] are token-major with
 * strides {block_size*H*D, D, H*D, 1}. The same view describes external
 * cache storage (::fd_cache_config) and appends (::fd_kv_append_params).
 *
 * Element types served (anything else is ::FD_ERR_UNSUPPORTED naming the
 * field): q_dtype == kv_dtype == out_dtype, each f16 or bf16 on both
 * backends, or f32 on the CPU backend.
 */
typedef struct fd_decode_params {
  uint32_t struct_size; /**< sizeof(fd_decode_params) as compiled by the caller. */
  /* Shape. */
  uint32_t batch;        /**< Rows (requests), >= 1. */
  uint32_t num_q_heads;  /**< Positive multiple of num_kv_heads. */
  uint32_t num_kv_heads; /**< KV heads (>= 1). */
  uint32_t head_dim;     /**< Elements per head (>= 1). */
  /* Element types. */
  int32_t q_dtype;   /**< ::fd_dtype of q. Default ::FD_DTYPE_BF16. */
  int32_t kv_dtype;  /**< ::fd_dtype of k_cache and v_cache. Default ::FD_DTYPE_BF16. */
  int32_t out_dtype; /**< ::fd_dtype of out. Default ::FD_DTYPE_BF16. */
  /* Paged K/V view. */
  int32_t layout;              /**< ::fd_kv_layout of the K/V cache. */
  uint32_t block_size;         /**< Tokens per block (>= 1). */
  uint32_t num_blocks;         /**< Physical blocks addressable through k/v (>= 1). */
  uint32_t max_blocks_per_seq; /**< Row stride of block_tables (>= 1). */
  const void *k_cache;         /**< K storage of one layer (see strides). */
  const void *v_cache;         /**< V storage of one layer, same strides as K. */
  int64_t stride_block;        /**< Elements between blocks (0: packed). */
  int64_t stride_head;         /**< Elements between KV heads (0: packed). */
  int64_t stride_token;        /**< Elements between tokens (0: packed). */
  int64_t stride_dim;          /**< Elements between dims (0: packed). */
  const int32_t *block_tables; /**< [batch, max_blocks_per_seq]; unused slots -1. */
  const int32_t *seq_lens;     /**< [batch] K/V tokens per row (the new token included); each
                                  in [0, max_blocks_per_seq*block_size] (exact in 64 bits). */
  /* Queries and output. */
  const void *q;           /**< [query tokens, num_q_heads, head_dim]: batch tokens, or
                                q_indptr[batch] with q_indptr. */
  const int32_t *q_indptr; /**< NULL (the default): one query token per row. Else [batch + 1]
                                offsets into q and out: row r's query tokens are
                                q_indptr[r] .. q_indptr[r+1]-1 (q_indptr[0] = 0, each row
                                1..seq_lens[r] tokens): the row's last q_len positions,
                                attended causally (S2.2). Memory of @p device. CUDA needs
                                max_q_len_hint > 0 with it and serves any number of
                                query tokens per row. */
  void *out;               /**< [query tokens, num_q_heads, head_dim]; must not alias inputs. */
  /* Attention variant (docs/semantics.md S2). */
  float sm_scale; /**< Softmax scale; 0 means 1/sqrt(head_dim). */
  /* Execution. */
  uint32_t flags;           /**< FD_DECODE_* flags. */
  int32_t max_seq_len_hint; /**< Host-known upper bound of seq_lens (0:
                                 max_blocks_per_seq*block_size). */
  int32_t max_q_len_hint;   /**< Host-known upper bound of query tokens per row (0: none
                                 given); a longer row is refused where indices are checked.
                                 With q_indptr on CUDA it is required and sizes the plan
                                 (query tiles, grid and workspace). */
  int32_t num_splits;       /**< Split-KV partitions per row: 0 automatic, 1 none, n > 1 fixed. */
  uint32_t cpu_threads;     /**< CPU backend threads, the caller's included; 0 = the
                                 FLASHDEC_THREADS environment variable if set to a positive
                                 integer (read once, at the first call), else all hardware
                                 threads. Capped at 256. Threads come from a pool the library
                                 owns (see ::fd_decode); the output bits do not depend on it. */
  void *workspace;          /**< Scratch for split-KV partials (device memory for CUDA); may be
                                 NULL. */
  size_t workspace_size;    /**< Bytes at workspace. */
  fd_device device;         /**< Where every pointer above lives and where the work runs. */
  fd_stream stream;         /**< CUDA stream the work is enqueued on (ignored on CPU). */
  /* Appended in 0.2: attention variants of current models (S2.3). All three
   * default to off and combine freely; both backends serve them (CUDA: the
   * head dims and K/V types docs/semantics.md S1 lists). */
  float logit_softcap;    /**< 0 (default): none; > 0: every score s = sm_scale * q.k becomes
                               logit_softcap * tanh(s / logit_softcap) before the softmax
                               (Gemma 2). Finite and >= 0. */
  int32_t sliding_window; /**< 0 (default): none; w > 0: a query at position p attends
                              positions p - w + 1 .. p only (the last w tokens, itself
                              included; Mistral, Gemma 2/3, GPT-OSS alternate layers). */
  const float *sinks;     /**< NULL (default) or [num_q_heads] FP32 logits, one per query head,
                              that join that head's softmax denominator and add no value
                              (GPT-OSS attention sinks); -inf is no sink. Memory of
                              @p device. */
  /* Appended in 0.2: dequantisation scales of the stored K/V (FP8 caches;
   * docs/semantics.md S1.1): attention reads K as stored x k_scale and V as
   * stored x v_scale. Any kv_dtype takes them. */
  float k_scale; /**< Finite and > 0; 1 (the default from ::fd_decode_params_init). */
  float v_scale; /**< Finite and > 0; 1 (default). */
} fd_decode_params;

/** @brief Fills @p params with defaults (CPU device, token-major, bf16 q, K/V
 *  and out, automatic splits, packed strides, one query token per row) and
 *  sets struct_size. NULL is ignored.
 *  @param[out] params Borrowed for the call; may be NULL. */
FD_API void fd_decode_params_init(fd_decode_params *params);

/**
 * @brief Workspace bytes ::fd_decode needs for @p params (with num_splits 0,
 * for the split count it would choose given max_seq_len_hint).
 * @param[in] params Borrowed for the call; not NULL. Its buffer pointers are
 *   not dereferenced and may be NULL (0.2); given ones must be aligned.
 * @param[out] bytes Not NULL; receives the byte count (0: no workspace needed).
 * @return ::FD_OK; as ::fd_decode for invalid or unsupported parameters.
 */
FD_API fd_status fd_decode_workspace_size(const fd_decode_params *params, size_t *bytes);

/**
 * @brief Paged decode attention (S2): for each row r and query head h,
 * out[r,h] = softmax(sm_scale * q[r,h] . K[r,kvh,0..len)) @ V[r,kvh,0..len),
 * with kvh = h / (num_q_heads / num_kv_heads); empty rows give zeros. With
 * q_indptr, query token j of a row of q_len n attends positions 0..len-n+j
 * (causal, S2.2).
 *
 * Equivalent to ::fd_decode_plan_create from @p params (without host lengths),
 * ::fd_decode_run and ::fd_decode_plan_destroy, except that on CUDA it
 * allocates nothing on the host either. Prefer a plan when many calls
 * (layers) share one shape and one set of lengths.
 *
 * CPU device: runs synchronously on the calling thread plus up to
 * cpu_threads - 1 workers of a pool the library creates at the first
 * multi-threaded call and joins when it is unloaded. The pool is shared by all
 * calls but holds no state a caller can see: concurrent calls (each with its
 * own buffers) never wait for one another, a call whose helpers are busy does
 * its work itself, and results are the same bits for any thread count. In a
 * child of fork() the parent's workers are not used; the child starts its own.
 * CUDA device: enqueued on @p params->stream; no host synchronisation and no
 * allocation on this path (unless ::FD_DECODE_CHECK_INDICES is set), so it can
 * be captured in a CUDA graph; results are ready when the stream reaches this
 * point. Output bits are deterministic for equal inputs and parameters.
 * With num_splits 0, the split count is chosen from host-known values and the
 * workspace available (no workspace: no split). An explicit num_splits > 1
 * needs ::fd_decode_workspace_size bytes of workspace.
 * @param[in] params Borrowed for the call; not NULL. The buffers it names are
 *   the caller's, in @p params->device memory: read (and @p out written)
 *   before return on the CPU, on @p params->stream for CUDA.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (checked before anything runs:
 *   struct_size too small or larger than this library's struct, NULL
 *   pointers, zero sizes, heads not a multiple, a seq_len or used block id
 *   out of range where checked, workspace too small); ::FD_ERR_UNSUPPORTED (a
 *   valid combination this backend does not serve: the message names the
 *   parameter); ::FD_ERR_NO_DEVICE; ::FD_ERR_DEVICE (a launch failed).
 */
FD_API fd_status fd_decode(const fd_decode_params *params);

/**
 * @brief A decode plan (appended in 0.2): the split-KV work list of one step,
 * made once on the host and used by every layer's ::fd_decode_run.
 *
 * Immutable after ::fd_decode_plan_create; thread-safe (any number of threads
 * may run with one plan at once, each with its own buffers).
 */
typedef struct fd_decode_plan fd_decode_plan;

/**
 * @brief Plans the decode calls of one step (appended in 0.2).
 *
 * Checks @p params as ::fd_decode does, except that its buffer pointers are
 * not dereferenced and may be NULL (given ones must be aligned), and decides
 * the work list: which (row, KV head, token range) items the attention
 * kernel runs and where each leaves its partial result for the merge. With @p host_seq_lens (the
 * step's exact K/V lengths, in host memory) the split-KV layout is chosen from them; without it,
 * from max_seq_len_hint as ::fd_decode does. Automatic splitting (num_splits 0) is limited to the
 * workspace @p params names when its workspace pointer is not NULL; with a NULL workspace the plan
 * splits as it sees fit and
 * ::fd_decode_plan_workspace_size says what every run must provide.
 * A run whose device seq_lens differ from the planned ones is still correct
 * (a row longer than planned costs speed, never tokens); a row longer than
 * max_seq_len_hint is refused where indices are checked, as in ::fd_decode.
 * @param[in] params Borrowed for the call; not NULL. The plan is made for
 *   its batch, num_q_heads, num_kv_heads, head_dim, q_dtype, kv_dtype,
 *   out_dtype, layout and device; every run must use the same values and
 *   takes all other fields from its own params.
 * @param[in] host_seq_lens Host memory, [params->batch] lengths, each in
 *   [0, max_seq_len_hint resolved]; borrowed for the call; may be NULL.
 * @param[out] out Not NULL; receives a new plan (owned by the caller, release
 *   with ::fd_decode_plan_destroy) on success, untouched on failure.
 * @return ::FD_OK; as ::fd_decode for invalid or unsupported parameters;
 *   ::FD_ERR_INVALID_ARGUMENT for a host length out of range (the message
 *   names the row); ::FD_ERR_OUT_OF_MEMORY. Thread-safe.
 */
FD_API fd_status fd_decode_plan_create(const fd_decode_params *params, const int32_t *host_seq_lens,
                                       fd_decode_plan **out);

/** @brief Releases @p plan (appended in 0.2). Work already enqueued with it is
 *  not affected (a plan holds no device memory).
 *  @param plan Owned by the caller, released here; may be NULL (ignored). */
FD_API void fd_decode_plan_destroy(fd_decode_plan *plan);

/**
 * @brief Workspace bytes every ::fd_decode_run with @p plan needs (appended in
 * 0.2). Thread-safe.
 * @param[in] plan Not NULL.
 * @param[out] bytes Not NULL; receives the byte count (0: none needed).
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT (NULL argument).
 */
FD_API fd_status fd_decode_plan_workspace_size(const fd_decode_plan *plan, size_t *bytes);

/**
 * @brief Runs one decode call with a plan (appended in 0.2): the attention of
 * ::fd_decode, with the split-KV layout the plan decided.
 *
 * @p params must have the planned batch, num_q_heads, num_kv_heads,
 * head_dim, element types, layout and device (see ::fd_decode_plan_create);
 * every other field (buffers, stream, strides, sm_scale) may differ from call
 * to call and
 * is checked as ::fd_decode checks it, except num_splits, which the plan's
 * work list replaces. CUDA: launches only (no allocation, no host
 * synchronisation unless ::FD_DECODE_CHECK_INDICES), so it can be captured
 * in a CUDA graph. CPU: as ::fd_decode. Output bits equal ::fd_decode's for
 * the same split layout (on CUDA, ::fd_decode without a workspace does not
 * split, while a plan made without one may: give ::fd_decode the workspace
 * the plan asks for to get the same bits).
 * @param[in] plan Not NULL; borrowed for the call.
 * @param[in] params Borrowed for the call; not NULL.
 * @return As ::fd_decode; ::FD_ERR_INVALID_ARGUMENT also when a planned field
 *   differs (the message names it) or the workspace is smaller than
 *   ::fd_decode_plan_workspace_size.
 */
FD_API fd_status fd_decode_run(const fd_decode_plan *plan, const fd_decode_params *params);

/**
 * @brief Applies RoPE (S3.1, split-half form; ::fd_rope_apply_style takes the
 * convention) in place to @p x, host memory [num_tokens, num_heads,
 * head_dim], token i rotated at positions[i].
 *
 * Runs on the CPU. FP32 math; results are rounded back to @p dtype.
 * @param dtype ::fd_dtype of @p x.
 * @param[in,out] x Host memory, [num_tokens, num_heads, head_dim]; borrowed
 *   for the call; not NULL.
 * @param num_tokens Tokens, >= 1.
 * @param num_heads Heads per token, >= 1.
 * @param head_dim Elements per head, >= 1.
 * @param[in] positions Host memory, [num_tokens] positions, each >= 0;
 *   borrowed for the call; not NULL.
 * @param rotary_dim Rotated dims per head: even, 0 < rotary_dim <= head_dim.
 * @param rope_base Finite, > 0 (e.g. 10000).
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, zero sizes, odd or out of
 *   range rotary_dim, base not finite or <= 0, a negative position: nothing is
 *   written).
 */
FD_API fd_status fd_rope_apply(int32_t dtype, void *x, uint32_t num_tokens, uint32_t num_heads,
                               uint32_t head_dim, const int32_t *positions, uint32_t rotary_dim,
                               float rope_base);

/**
 * @brief As ::fd_rope_apply, in the RoPE convention @p rope_style (appended
 * in 0.2): ::FD_ROPE_SPLIT_HALF gives ::fd_rope_apply's bits,
 * ::FD_ROPE_INTERLEAVED rotates the pairs (2i, 2i + 1) (S3.1).
 *
 * @param dtype ::fd_dtype of @p x.
 * @param[in,out] x Host memory, [num_tokens, num_heads, head_dim]; borrowed
 *   for the call; not NULL.
 * @param num_tokens Tokens, >= 1.
 * @param num_heads Heads per token, >= 1.
 * @param head_dim Elements per head, >= 1.
 * @param[in] positions Host memory, [num_tokens] positions, each >= 0;
 *   borrowed for the call; not NULL.
 * @param rotary_dim Rotated dims per head: even, 0 < rotary_dim <= head_dim;
 *   the dims from rotary_dim on stay unchanged in either style.
 * @param rope_base Finite, > 0 (e.g. 10000).
 * @param rope_style An ::fd_rope_style value.
 * @return As ::fd_rope_apply; ::FD_ERR_INVALID_ARGUMENT also for an unknown
 *   @p rope_style (nothing is written).
 */
FD_API fd_status fd_rope_apply_style(int32_t dtype, void *x, uint32_t num_tokens,
                                     uint32_t num_heads, uint32_t head_dim,
                                     const int32_t *positions, uint32_t rotary_dim, float rope_base,
                                     int32_t rope_style);

/**
 * @brief Dense reference attention on the CPU (S2, implementation 1): K/V of
 * each row contiguous, [batch, num_kv_heads, max_seq_len, head_dim].
 *
 * FP32 math, output in @p dtype. Meant for tests and for checking other
 * backends; single-threaded. Every pointer is host memory, borrowed for the
 * call, not NULL.
 * @param dtype ::fd_dtype of q, k, v and out.
 * @param batch Rows, >= 1.
 * @param num_q_heads A positive multiple of @p num_kv_heads.
 * @param num_kv_heads KV heads, >= 1.
 * @param head_dim Elements per head, >= 1.
 * @param max_seq_len Tokens per row in @p k and @p v, >= 1.
 * @param[in] q [batch, num_q_heads, head_dim].
 * @param[in] k,v [batch, num_kv_heads, max_seq_len, head_dim].
 * @param[in] seq_lens [batch], each in [0, max_seq_len].
 * @param sm_scale 0 means 1/sqrt(head_dim).
 * @param[out] out [batch, num_q_heads, head_dim].
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT.
 */
FD_API fd_status fd_reference_attention_dense(int32_t dtype, uint32_t batch, uint32_t num_q_heads,
                                              uint32_t num_kv_heads, uint32_t head_dim,
                                              uint32_t max_seq_len, const void *q, const void *k,
                                              const void *v, const int32_t *seq_lens,
                                              float sm_scale, void *out);

/**
 * @brief Parameters of ::fd_kv_append and ::fd_rope_kv_append (appended in
 * 0.1). Initialise with ::fd_kv_append_params_init.
 *
 * Token i (of num_tokens) goes to offset offsets[i] of physical block
 * block_ids[i]; its K/V element (head h, dim d) is stored at
 * `cache + block*stride_block + h*stride_head + offset*stride_token +
 * d*stride_dim` (strides in elements, all 0: packed storage of @p layout, as
 * in ::fd_decode_params). The primitives own no allocator or request state.
 */
typedef struct fd_kv_append_params {
  uint32_t struct_size;     /**< sizeof(fd_kv_append_params) as compiled by the caller. */
  int32_t dtype;            /**< ::fd_dtype of q, k, v, q_out and the caches (f32: CPU only). */
  int32_t layout;           /**< ::fd_kv_layout of the caches. */
  uint32_t num_tokens;      /**< Tokens to append (>= 1). */
  uint32_t num_q_heads;     /**< Query heads (::fd_rope_kv_append only): a positive multiple of
                                 num_kv_heads. */
  uint32_t num_kv_heads;    /**< KV heads (>= 1). */
  uint32_t head_dim;        /**< Elements per head (>= 1; CUDA: <= 1024). */
  uint32_t block_size;      /**< Tokens per block (>= 1). */
  uint32_t num_blocks;      /**< Physical blocks addressable through k_cache / v_cache. */
  uint32_t rotary_dim;      /**< ::fd_rope_kv_append: even, 0 < rotary_dim <= head_dim. */
  float rope_base;          /**< ::fd_rope_kv_append: finite, > 0 (e.g. 10000). */
  uint32_t reserved0;       /**< Must be 0. */
  const void *q;            /**< ::fd_rope_kv_append: [num_tokens, num_q_heads, head_dim]. */
  void *q_out;              /**< ::fd_rope_kv_append: rotated Q, same shape; may equal q, must not
                                 otherwise overlap q, k or v. */
  const void *k;            /**< [num_tokens, num_kv_heads, head_dim]. */
  const void *v;            /**< [num_tokens, num_kv_heads, head_dim]. */
  void *k_cache;            /**< K storage of one layer (see strides). */
  void *v_cache;            /**< V storage of one layer, same strides. */
  int64_t stride_block;     /**< Elements between blocks (0: packed). */
  int64_t stride_head;      /**< Elements between KV heads (0: packed). */
  int64_t stride_token;     /**< Elements between tokens (0: packed). */
  int64_t stride_dim;       /**< Elements between dims (0: packed). */
  const int32_t *block_ids; /**< [num_tokens] destination blocks, each in [0, num_blocks). */
  const int32_t *offsets;   /**< [num_tokens] offsets, each in [0, block_size). */
  const int32_t *positions; /**< ::fd_rope_kv_append: [num_tokens] RoPE positions, each >= 0. */
  fd_device device;         /**< Where every pointer above lives and where the work runs. */
  fd_stream stream;         /**< CUDA stream the work is enqueued on (ignored on CPU). */
  /* Appended in 0.2: FP8 caches (docs/semantics.md S1.1). dtype stays the
   * type of q, k, v and q_out. */
  int32_t cache_dtype; /**< ::fd_dtype of k_cache / v_cache; -1 (default): dtype. An FP8
                            cache_dtype needs dtype f16 or bf16 (or f32 on the CPU). */
  float k_scale;       /**< K is stored as saturate(k / k_scale); finite, > 0; default 1. */
  float v_scale;       /**< V likewise; finite, > 0; default 1. */
  uint32_t reserved1;  /**< Must be 0. */
  /* Appended in 0.2: the RoPE convention. */
  int32_t rope_style; /**< ::fd_rope_kv_append: ::fd_rope_style of the rotation. Default
                           ::FD_ROPE_SPLIT_HALF. */
  uint32_t reserved2; /**< Must be 0. */
} fd_kv_append_params;

/** @brief Fills @p params with defaults (CPU device, token-major, bf16, packed
 *  strides, rope_base 10000) and sets struct_size. NULL is ignored.
 *  @param[out] params Borrowed for the call; may be NULL. */
FD_API void fd_kv_append_params_init(fd_kv_append_params *params);

/**
 * @brief Checked KV append (S3.2): writes raw K and V of each token into
 * (block_ids[i], offsets[i]).
 *
 * Every value is checked before anything is written: shapes, strides, ids in
 * [0, num_blocks), offsets in [0, block_size). CPU device: runs synchronously.
 * CUDA device: every pointer is device memory of device.ordinal; the index
 * arrays are copied to the host and @p stream is synchronised to check them
 * (so this call is not usable inside stream capture), then the kernel is
 * enqueued on @p stream and the call returns; results are ready when the
 * stream reaches it. No duplicate (block, offset) pairs: their order is
 * unspecified.
 * @param[in] params Borrowed for the call; not NULL. The buffers it names are
 *   the caller's, in @p params->device memory; k_cache and v_cache are written.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (the message names the parameter
 *   and, for index arrays, the first bad entry; nothing is written);
 *   ::FD_ERR_UNSUPPORTED (f32 on CUDA, head_dim > 1024 on CUDA);
 *   ::FD_ERR_NO_DEVICE; ::FD_ERR_DEVICE.
 */
FD_API fd_status fd_kv_append(const fd_kv_append_params *params);

/**
 * @brief Checked fused RoPE + append (S3.1, S3.2): rotates Q and K of token i
 * at positions[i] in one pass, writes rotated K and raw V into
 * (block_ids[i], offsets[i]) and rotated Q into q_out.
 *
 * FP32 math with inv_freq[j] = powf(rope_base, -2j / rotary_dim), in the
 * convention rope_style, as ::fd_rope_apply_style, so CPU and CUDA results
 * agree within one rounding of @p dtype. Checks and synchronisation as
 * ::fd_kv_append, plus positions >= 0 and a known rope_style.
 * @param[in] params Borrowed for the call; not NULL. As ::fd_kv_append;
 *   q_out is written too.
 * @return As ::fd_kv_append.
 */
FD_API fd_status fd_rope_kv_append(const fd_kv_append_params *params);

/**
 * @brief Parameters of ::fd_reference_attention (appended in 0.2): the dense
 * reference with the query tokens (S2.2) and variants (S2.3) of
 * ::fd_decode_params. Initialise with ::fd_reference_params_init.
 *
 * K/V of each row are contiguous, [batch, num_kv_heads, max_seq_len,
 * head_dim]; every pointer is host memory, borrowed for the call.
 */
typedef struct fd_reference_params {
  uint32_t struct_size;    /**< sizeof(fd_reference_params) as compiled by the caller. */
  int32_t dtype;           /**< ::fd_dtype of q, k, v and out. */
  uint32_t batch;          /**< Rows, >= 1. */
  uint32_t num_q_heads;    /**< A positive multiple of num_kv_heads. */
  uint32_t num_kv_heads;   /**< KV heads, >= 1. */
  uint32_t head_dim;       /**< Elements per head, >= 1. */
  uint32_t max_seq_len;    /**< Tokens per row in k and v, >= 1. */
  int32_t sliding_window;  /**< As ::fd_decode_params (0: none). */
  const void *q;           /**< [query tokens, num_q_heads, head_dim]; not NULL. */
  const int32_t *q_indptr; /**< [batch + 1] query-token offsets as in
                                ::fd_decode_params; NULL: one token per row. */
  const void *k;           /**< [batch, num_kv_heads, max_seq_len, head_dim]; not NULL. */
  const void *v;           /**< As k; not NULL. */
  const int32_t *seq_lens; /**< [batch], each in [0, max_seq_len]; not NULL. */
  const float *sinks;      /**< [num_q_heads] sink logits, or NULL (none). */
  void *out;               /**< [query tokens, num_q_heads, head_dim]; not NULL. */
  float sm_scale;          /**< 0 means 1/sqrt(head_dim). */
  float logit_softcap;     /**< As ::fd_decode_params (0: none). */
} fd_reference_params;

/** @brief Fills @p params with defaults (everything 0 or NULL, dtype
 *  ::FD_DTYPE_F32) and sets struct_size. NULL is ignored.
 *  @param[out] params Borrowed for the call; may be NULL. */
FD_API void fd_reference_params_init(fd_reference_params *params);

/**
 * @brief Dense reference attention on the CPU (S2, implementation 1) with
 * several query tokens per row and the attention variants (appended in
 * 0.2); ::fd_reference_attention_dense is this call with one token per row
 * and no variant.
 *
 * FP32 math, output in dtype; single-threaded; meant for tests and for
 * checking other backends. Same rules as ::fd_decode for q_indptr (q_indptr[0]
 * = 0, each row 1 .. seq_lens[r] tokens, causal), logit_softcap,
 * sliding_window and sinks.
 * @param[in] params Borrowed for the call; not NULL; struct_size at least
 *   through out.
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT naming the field (nothing
 *   written).
 */
FD_API fd_status fd_reference_attention(const fd_reference_params *params);

/** @} */

/* ------------------------------------------------------------------------ */
/** @defgroup scheduler Block-aware scheduler
 *  Behaviour: docs/semantics.md S9.
 *
 *  A pure, deterministic planner: ::fd_scheduler_plan reads only a scheduler
 *  configuration and an ::fd_snapshot (request metadata, no K/V) and returns
 *  an ::fd_decision. Admission commits each request's whole lifetime of blocks
 *  (ceil((context + new) / block_size) minus shared prefix blocks), so a step
 *  of admitted requests can never run out of blocks.
 *
 *  Thread contract: an ::fd_scheduler is immutable after creation and
 *  thread-safe. An ::fd_snapshot is externally synchronised while it is being
 *  built and safe to read from many threads afterwards. An ::fd_decision is
 *  immutable and thread-safe.
 *  @{ */

/** @brief Opaque planner configuration. Created by ::fd_scheduler_create. */
typedef struct fd_scheduler fd_scheduler;
/** @brief Opaque scheduler input. Built with ::fd_snapshot_create and the
 *  fd_snapshot_add_* calls, or by ::fd_engine_snapshot. */
typedef struct fd_snapshot fd_snapshot;
/** @brief Opaque, immutable scheduler output. Created by ::fd_scheduler_plan. */
typedef struct fd_decision fd_decision;

/** @brief Parameters of ::fd_scheduler_create. Initialise with
 *  ::fd_scheduler_config_init. */
typedef struct fd_scheduler_config {
  uint32_t struct_size;         /**< sizeof(fd_scheduler_config) as compiled by the caller. */
  uint32_t max_active_requests; /**< Requests that may hold blocks at once, >= 1. Default 64. */
  uint32_t max_batch_requests;  /**< Rows per step, 1..max_active_requests. Default 64. */
  uint32_t reserve_blocks; /**< Blocks never committed, < the snapshot's max_blocks. Default 0. */
  uint32_t aging_threshold_steps; /**< wait_steps at which a waiting request drains the queue, >= 1.
                                     Default 8. */
} fd_scheduler_config;

/**
 * @brief Fills @p config with defaults and sets struct_size.
 * @param[out] config Borrowed for the call; may be NULL (ignored).
 */
FD_API void fd_scheduler_config_init(fd_scheduler_config *config);

/**
 * @brief Creates a scheduler.
 * @param[in] config Borrowed for the call; not NULL.
 * @param[out] out Not NULL; receives the handle on success only; owned by the
 *   caller, release with ::fd_scheduler_destroy.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, struct_size too small or
 *   larger than this library's struct,
 *   max_active_requests 0, max_batch_requests 0 or > max_active_requests,
 *   aging_threshold_steps 0); ::FD_ERR_OUT_OF_MEMORY.
 */
FD_API fd_status fd_scheduler_create(const fd_scheduler_config *config, fd_scheduler **out);

/** @brief Destroys a scheduler. NULL is a no-op. Decisions it made stay valid.
 *  @param scheduler Owned by the caller, released here; may be NULL. */
FD_API void fd_scheduler_destroy(fd_scheduler *scheduler);

/**
 * @brief Copies the scheduler's configuration.
 * @param[in] scheduler Borrowed for the call; not NULL.
 * @param[in,out] config Borrowed for the call; not NULL. Caller sets
 *   struct_size (at least through max_active_requests); the library fills what
 *   fits.
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT (NULL, too-small struct_size).
 */
FD_API fd_status fd_scheduler_get_config(const fd_scheduler *scheduler,
                                         fd_scheduler_config *config);

/**
 * @brief What the scheduler knows about a request (docs/semantics.md S9).
 * Initialise with ::fd_request_spec_init.
 *
 * Lifetime blocks = ceil((initial_context_tokens + max_new_tokens) /
 * block_size); private commitment = lifetime - prefix_blocks.
 */
typedef struct fd_request_spec {
  uint32_t struct_size;            /**< sizeof(fd_request_spec) as compiled by the caller. */
  uint32_t initial_context_tokens; /**< Prompt tokens present before generation, >= 0. */
  uint64_t id;                     /**< Caller-chosen request id. */
  uint64_t
      submission_order; /**< Position in the queue; unique among the requests planned together. */
  uint32_t max_new_tokens; /**< Tokens to generate, >= 1. */
  uint32_t prefix_blocks;  /**< Shared prefix blocks (0 without a prefix). A prefix must cover the
                                whole initial context: initial_context_tokens == prefix_blocks *
                                block_size. ::fd_engine_submit_request fills it from the registered
                                prefix when 0. */
  const char *prefix_id;   /**< NUL-terminated prefix id, or NULL / "" for none; borrowed for the
                                call and copied. */
} fd_request_spec;

/** @brief Zeroes @p spec and sets struct_size and max_new_tokens = 1. NULL is ignored.
 *  @param[out] spec Borrowed for the call; may be NULL. */
FD_API void fd_request_spec_init(fd_request_spec *spec);

/** @brief Pool-wide part of an ::fd_snapshot. Initialise with ::fd_snapshot_info_init. */
typedef struct fd_snapshot_info {
  uint32_t struct_size;            /**< sizeof(fd_snapshot_info) as compiled by the caller. */
  uint32_t block_size;             /**< Tokens per block, > 0. Default 16. */
  uint32_t max_blocks;             /**< Physical blocks of the pool, > 0. Default 1024. */
  uint32_t free_blocks;            /**< Blocks on the free list, <= max_blocks. Default 1024. */
  uint32_t resident_prefix_blocks; /**< Blocks held by resident shared prefixes. Default 0. */
  uint32_t reserved0;              /**< Must be 0. */
  uint64_t step;    /**< Caller's step counter; informational, copied into decisions. */
  uint64_t version; /**< State version the snapshot describes (::fd_engine_snapshot writes the
                         engine's state_version); compared when a decision is applied. */
} fd_snapshot_info;

/** @brief Fills @p info with defaults and sets struct_size. NULL is ignored.
 *  @param[out] info Borrowed for the call; may be NULL. */
FD_API void fd_snapshot_info_init(fd_snapshot_info *info);

/**
 * @brief Starts an empty snapshot.
 * @param[in] info Borrowed for the call; not NULL; every field is required
 *   (struct_size is the whole struct).
 * @param[out] out Not NULL; receives the handle on success only; owned by the
 *   caller, release with ::fd_snapshot_destroy.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, struct_size other than
 *   this library's, block_size or max_blocks 0,
 *   free_blocks > max_blocks, resident_prefix_blocks > max_blocks - free_blocks,
 *   reserved0 != 0); ::FD_ERR_OUT_OF_MEMORY.
 */
FD_API fd_status fd_snapshot_create(const fd_snapshot_info *info, fd_snapshot **out);

/** @brief Destroys a snapshot. NULL is a no-op.
 *  @param snapshot Owned by the caller, released here; may be NULL. */
FD_API void fd_snapshot_destroy(fd_snapshot *snapshot);

/**
 * @brief Copies the pool-wide part of a snapshot.
 * @param[in] snapshot Borrowed for the call; not NULL.
 * @param[in,out] info Borrowed for the call; not NULL. Caller sets struct_size
 *   (at least through block_size); the library fills what fits.
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT (NULL, too-small struct_size).
 */
FD_API fd_status fd_snapshot_get_info(const fd_snapshot *snapshot, fd_snapshot_info *info);

/**
 * @brief Appends a waiting request (not yet holding blocks).
 *
 * Entries keep their insertion order (::fd_engine_snapshot inserts in
 * submission order); planning sorts by submission_order itself.
 * @param[in,out] snapshot Borrowed for the call; not NULL.
 * @param[in] spec Borrowed for the call; not NULL; the prefix id is copied.
 *   struct_size must be this library's (every field is required).
 * @param wait_steps Decisions this request has waited through (caller's
 *   fairness counter).
 * @param skip_count Times a later request went first.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, struct_size other than
 *   this library's, max_new_tokens 0, context +
 *   new > INT32_MAX, prefix_blocks without a prefix id or the reverse, context
 *   != prefix_blocks * block_size for a prefixed request);
 *   ::FD_ERR_ALREADY_EXISTS (id or submission_order already in the snapshot).
 *   Nothing is added on failure.
 */
FD_API fd_status fd_snapshot_add_waiting(fd_snapshot *snapshot, const fd_request_spec *spec,
                                         uint32_t wait_steps, uint32_t skip_count);

/**
 * @brief Appends an active request (holding blocks).
 * @param[in,out] snapshot Borrowed for the call; not NULL.
 * @param[in] spec As ::fd_snapshot_add_waiting.
 * @param seq_len Committed tokens, in [0, context + new) (a request that generated
 *   every token is no longer active).
 * @param physical_blocks Must equal ceil(seq_len / block_size).
 * @param shared_blocks Must equal spec->prefix_blocks.
 * @param committed_blocks Must equal lifetime - shared_blocks.
 * @param service_wait_steps Steps since this request last ran (caller's
 *   fairness counter).
 * @return As ::fd_snapshot_add_waiting, plus ::FD_ERR_INVALID_ARGUMENT for any
 *   of the equalities above (the message names the field and both values).
 */
FD_API fd_status fd_snapshot_add_active(fd_snapshot *snapshot, const fd_request_spec *spec,
                                        int32_t seq_len, uint32_t physical_blocks,
                                        uint32_t shared_blocks, uint32_t committed_blocks,
                                        uint32_t service_wait_steps);

/** @brief Why a decision looks the way it does. Reasons are reported in this
 *  fixed order (docs/semantics.md S9 step 8). Values pinned. */
typedef enum fd_schedule_reason {
  FD_REASON_REQUEST_EXCEEDS_CAPACITY = 0, /**< A request can never fit: rejected. */
  FD_REASON_AGING_DRAIN = 1,       /**< An aged request does not fit yet: nothing admitted. */
  FD_REASON_ACTIVE_LIMIT = 2,      /**< max_active_requests reached with requests waiting. */
  FD_REASON_CAPACITY_DEFERRED = 3, /**< A request was skipped for lack of uncommitted blocks. */
  FD_REASON_ADMITTED = 4,          /**< At least one request was admitted. */
  FD_REASON_BATCH_LIMIT = 5, /**< Runnable requests beyond max_batch_requests were deferred. */
  FD_REASON_IDLE = 6,        /**< Nothing to run this step. */
  FD_REASON_FORCE_32BIT = 0x7fffffff /**< Forces 32 bits. */
} fd_schedule_reason;

/**
 * @brief Plans one step (docs/semantics.md S9): rejections, admissions in FIFO
 * order with aging, and the runnable batch.
 *
 * Pure: reads only @p scheduler and @p snapshot (which is copied into the
 * decision). Deterministic. Thread-safe.
 * @param[in] scheduler Borrowed for the call; not NULL.
 * @param[in] snapshot Borrowed for the call; not NULL. The decision keeps its
 *   own copy, so the snapshot may be destroyed or changed afterwards.
 * @param[out] out Not NULL; receives the decision on success only; owned by
 *   the caller, release with ::fd_decision_destroy.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, a snapshot that violates
 *   resident + sum(physical - shared) == max_blocks - free_blocks, reserve_blocks
 *   >= max_blocks, resident prefix blocks or committed blocks above
 *   max_blocks - reserve_blocks, more active requests than max_active_requests);
 *   ::FD_ERR_INTERNAL (the plan broke its own guarantees: a bug);
 *   ::FD_ERR_OUT_OF_MEMORY.
 */
FD_API fd_status fd_scheduler_plan(const fd_scheduler *scheduler, const fd_snapshot *snapshot,
                                   fd_decision **out);

/** @brief Destroys a decision. NULL is a no-op.
 *  @param decision Owned by the caller, released here; may be NULL. */
FD_API void fd_decision_destroy(fd_decision *decision);

/** @brief Id lists of a decision (::fd_decision_ids). Values pinned. */
typedef enum fd_decision_list {
  FD_DECISION_ADMIT = 0,    /**< Waiting requests admitted by this decision, in admission order. */
  FD_DECISION_RUNNABLE = 1, /**< Rows of this step, in row order. */
  FD_DECISION_DEFERRED = 2, /**< Active or admitted requests left out by the batch limit. */
  FD_DECISION_WAITING = 3,  /**< Requests still waiting afterwards, in submission order. */
  FD_DECISION_REJECTED = 4, /**< Requests rejected as larger than the schedulable pool. */
  FD_DECISION_LIST_FORCE_32BIT = 0x7fffffff /**< Forces 32 bits. */
} fd_decision_list;

/**
 * @brief Copies one id list of a decision.
 * @param[in] decision Borrowed for the call; not NULL.
 * @param list An ::fd_decision_list value.
 * @param[out] ids Host memory of @p capacity entries, borrowed for the call;
 *   may be NULL when @p capacity is 0 (to ask for the count).
 * @param capacity Entries at @p ids: 0, or at least the list's length.
 * @param[out] count Not NULL; receives the list's length (always, on success).
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL decision or count, unknown
 *   list, capacity below the length: nothing written).
 */
FD_API fd_status fd_decision_ids(const fd_decision *decision, int32_t list, uint64_t *ids,
                                 uint32_t capacity, uint32_t *count);

/** @brief Numbers of a decision. */
typedef struct fd_decision_summary {
  uint32_t struct_size;      /**< sizeof(fd_decision_summary) as compiled by the caller. */
  uint32_t has_drain;        /**< 1 when drain_for_request_id is set (aging drain). */
  uint64_t step;             /**< The snapshot's step. */
  uint64_t snapshot_version; /**< The snapshot's version. */
  uint64_t
      drain_for_request_id; /**< The aged request the queue drains for (valid when has_drain). */
  uint32_t
      committed_blocks_before; /**< Resident prefix blocks + active commitments before admission. */
  uint32_t committed_blocks_after;     /**< The same after admission. */
  uint32_t needed_physical_blocks_now; /**< Blocks this step allocates: admitted context + boundary
                                          rows. */
  uint32_t free_blocks_before;         /**< The snapshot's free blocks. */
  uint32_t schedulable_blocks;         /**< max_blocks - reserve_blocks. */
  uint32_t reason_count;               /**< Entries ::fd_decision_reasons returns. */
} fd_decision_summary;

/**
 * @brief Reads a decision's numbers.
 * @param[in] decision Borrowed for the call; not NULL.
 * @param[in,out] summary Borrowed for the call; not NULL. Caller sets
 *   struct_size (at least through has_drain); the library fills what fits.
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT (NULL, too-small struct_size).
 */
FD_API fd_status fd_decision_get_summary(const fd_decision *decision, fd_decision_summary *summary);

/**
 * @brief Copies a decision's reasons (::fd_schedule_reason values, each at
 * most once, in the fixed order).
 * @param[in] decision Borrowed for the call; not NULL.
 * @param[out] reasons Host memory of @p capacity entries (7 always suffice),
 *   borrowed for the call; NULL only when the decision has no reasons.
 * @param capacity Entries at @p reasons, at least the reason count.
 * @param[out] count Not NULL; receives the number of reasons.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, capacity too small:
 *   nothing written).
 */
FD_API fd_status fd_decision_reasons(const fd_decision *decision, int32_t *reasons,
                                     uint32_t capacity, uint32_t *count);

/**
 * @brief Copies the configuration a decision was planned with.
 * @param[in] decision Borrowed for the call; not NULL.
 * @param[in,out] config As ::fd_scheduler_get_config.
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT (NULL, too-small struct_size).
 */
FD_API fd_status fd_decision_get_config(const fd_decision *decision, fd_scheduler_config *config);

/**
 * @brief Copies the snapshot a decision was planned from.
 * @param[in] decision Borrowed for the call; not NULL.
 * @param[out] out Not NULL; receives a new snapshot on success only; owned by
 *   the caller, release with ::fd_snapshot_destroy.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT; ::FD_ERR_OUT_OF_MEMORY.
 */
FD_API fd_status fd_decision_copy_snapshot(const fd_decision *decision, fd_snapshot **out);

/** @} */

/* ------------------------------------------------------------------------ */
/** @defgroup engine Decode engine
 *  Behaviour: docs/semantics.md S8.
 *
 *  An engine drives one cache: request lifecycle (waiting, active, finished,
 *  cancelled, rejected), one step = one token for a batch through every layer
 *  (RoPE, append, paged decode), and, in scheduler-managed mode, admission by
 *  applying ::fd_decision values.
 *
 *  Two exclusive modes. Unscheduled: ::fd_engine_add_request,
 *  ::fd_engine_admit, steps on any active ids, ::fd_engine_finish /
 *  ::fd_engine_cancel; a step that needs more blocks than are free reports
 *  backpressure. Scheduler-managed: starts with the first
 *  ::fd_engine_submit_request (the cache must then be empty and the engine
 *  must hold no unscheduled request); requests are admitted or rejected only by
 *  ::fd_engine_apply_decision, each step runs exactly the runnable ids of the
 *  last applied decision, and any change to the cache made behind the engine's
 *  back is detected (cache state version) and refused.
 *
 *  Both backends are served. On a CPU cache (::FD_DEVICE_CPU) q, k, v and
 *  outputs are host memory in the cache's dtype and every call finishes its
 *  work before returning. On a CUDA cache (::FD_DEVICE_CUDA) they are device
 *  memory of the cache's device: each ::fd_engine_step_layer only enqueues
 *  its work on the caller's stream, and ::fd_engine_begin_step,
 *  ::fd_engine_step_layer and ::fd_engine_commit_step never synchronise the
 *  host, so a whole step can be captured in a CUDA graph. The engine then owns
 *  device scratch (rotated Q, block tables, effective seq_lens, split-KV
 *  workspace), allocated at ::fd_engine_create and reused by every step.
 *
 *  Thread contract: an ::fd_engine is externally synchronised, and so is its
 *  cache: while the engine lives, use the cache from the same thread as the
 *  engine.
 *  @{ */

/** @brief Opaque decode engine. Created by ::fd_engine_create. */
typedef struct fd_engine fd_engine;

/** @brief Parameters of ::fd_engine_create. Initialise with ::fd_engine_config_init. */
typedef struct fd_engine_config {
  uint32_t struct_size; /**< sizeof(fd_engine_config) as compiled by the caller. */
  uint32_t num_q_heads; /**< Query heads, a positive multiple of the cache's num_kv_heads; 0
                           (default) = num_kv_heads. */
  uint32_t rotary_dim;  /**< RoPE dims, even and <= head_dim; 0 (default) = head_dim. The
                             convention is the cache's fd_cache_config.rope_style. */
  float rope_base;      /**< RoPE base, finite and > 0. Default 10000. */
  float sm_scale;       /**< Softmax scale; 0 (default) = 1/sqrt(head_dim). */
  uint32_t cpu_threads; /**< CPU decode threads (as in ::fd_decode_params); 0
                           (default) = FLASHDEC_THREADS if set, else all hardware threads. */
} fd_engine_config;

/** @brief Fills @p config with defaults and sets struct_size. NULL is ignored.
 *  @param[out] config Borrowed for the call; may be NULL. */
FD_API void fd_engine_config_init(fd_engine_config *config);

/**
 * @brief Creates an engine on @p cache.
 *
 * On a CUDA cache the engine allocates its device scratch here, on the
 * cache's device: rotated Q and effective seq_lens for min(max_blocks, 256)
 * rows, block tables for min(max_blocks^2, 2^20) entries (a step never has
 * more than max_blocks rows, nor a row more than max_blocks blocks), and the
 * split-KV workspace ::fd_decode_workspace_size reports for one row and for
 * that many rows at the longest context the cache can hold (at most 128 MiB;
 * with less, decode uses fewer splits). A later step with more rows or a
 * larger table than the scratch holds grows it in ::fd_engine_begin_step (to
 * at least twice its size, within those bounds); replaced buffers are freed
 * at ::fd_engine_destroy.
 * @param cache Borrowed until ::fd_engine_destroy: it must outlive the engine.
 *   It may already hold requests (usable in unscheduled mode only). Not NULL.
 * @param[in] config Borrowed for the call; NULL means defaults.
 * @param[out] out Not NULL; receives the handle on success only; owned by the
 *   caller, release with ::fd_engine_destroy (before the cache).
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL cache or out, struct_size
 *   too small or larger than this library's struct,
 *   num_q_heads not a multiple, odd or too large rotary_dim, bad rope_base,
 *   negative or non-finite sm_scale); ::FD_ERR_INVALID_STATE (a cache
 *   transaction is open); ::FD_ERR_UNSUPPORTED (a CUDA cache whose shape
 *   ::fd_decode does not serve on CUDA); ::FD_ERR_OUT_OF_MEMORY (host or
 *   device scratch); ::FD_ERR_DEVICE (a CUDA call failed).
 */
FD_API fd_status fd_engine_create(fd_cache *cache, const fd_engine_config *config, fd_engine **out);

/**
 * @brief Destroys an engine. NULL is a no-op. An open step is aborted (its
 * cache transaction rolled back); the cache and its requests stay as they are.
 * On a CUDA cache the device scratch is freed (cudaFree, which waits for work
 * still using it).
 * @param engine Owned by the caller, released here; may be NULL.
 */
FD_API void fd_engine_destroy(fd_engine *engine);

/** @brief Lifecycle state of a request in an engine. Values pinned. */
typedef enum fd_engine_request_state {
  FD_ENGINE_REQUEST_UNKNOWN = 0,   /**< Never seen by this engine. */
  FD_ENGINE_REQUEST_WAITING = 1,   /**< Known, holds no blocks yet. */
  FD_ENGINE_REQUEST_ACTIVE = 2,    /**< Active in the cache. */
  FD_ENGINE_REQUEST_FINISHED = 3,  /**< Finished (terminal). */
  FD_ENGINE_REQUEST_CANCELLED = 4, /**< Cancelled (terminal). */
  FD_ENGINE_REQUEST_REJECTED = 5,  /**< Rejected by the scheduler; never owned blocks (terminal). */
  FD_ENGINE_REQUEST_STATE_FORCE_32BIT = 0x7fffffff /**< Forces 32 bits. */
} fd_engine_request_state;

/**
 * @brief Unscheduled mode: adds a waiting request.
 * @param[in,out] engine Borrowed for the call; not NULL.
 * @param request_id Caller-chosen id.
 * @return ::FD_OK (also when the id is already waiting or active: no-op);
 *   ::FD_ERR_INVALID_STATE (terminal id, scheduler-managed engine, a step is
 *   open).
 */
FD_API fd_status fd_engine_add_request(fd_engine *engine, uint64_t request_id);

/**
 * @brief Unscheduled mode: makes a waiting request active in the cache
 * (an empty request there).
 * @param[in,out] engine Borrowed for the call; not NULL.
 * @param request_id A waiting request.
 * @return ::FD_OK (also when already active: no-op); ::FD_ERR_NOT_FOUND
 *   (unknown id); ::FD_ERR_INVALID_STATE (terminal id, scheduler-managed
 *   engine, a step is open, the cache refused the id).
 */
FD_API fd_status fd_engine_admit(fd_engine *engine, uint64_t request_id);

/**
 * @brief Finishes a waiting or active request. Active requests release their
 * private blocks in the cache. Allowed in both modes (scheduler-managed
 * requests also finish by themselves when their last new token commits).
 * @param[in,out] engine Borrowed for the call; not NULL.
 * @param request_id A waiting or active request.
 * @return ::FD_OK; ::FD_ERR_NOT_FOUND; ::FD_ERR_INVALID_STATE (terminal id, a
 *   step is open, the cache was changed behind a scheduler-managed engine);
 *   ::FD_ERR_INVALID_ARGUMENT (NULL engine).
 */
FD_API fd_status fd_engine_finish(fd_engine *engine, uint64_t request_id);

/** @brief As ::fd_engine_finish, but the terminal state is cancelled.
 *  @param[in,out] engine Borrowed for the call; not NULL.
 *  @param request_id A waiting or active request.
 *  @return As ::fd_engine_finish. */
FD_API fd_status fd_engine_cancel(fd_engine *engine, uint64_t request_id);

/**
 * @brief Reports a request's state.
 * @param[in] engine Borrowed for the call; not NULL.
 * @param request_id Any id.
 * @param[out] state Not NULL; receives an ::fd_engine_request_state (unknown
 *   ids give ::FD_ENGINE_REQUEST_UNKNOWN, not an error).
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT (NULL).
 */
FD_API fd_status fd_engine_get_request_state(const fd_engine *engine, uint64_t request_id,
                                             int32_t *state);

/** @brief Outcome of ::fd_engine_begin_step. Values pinned. */
typedef enum fd_engine_step_outcome {
  FD_STEP_OPENED = 0, /**< A step transaction is open; run every layer, then commit or abort. */
  FD_STEP_BACKPRESSURE = 1, /**< Not enough free blocks; nothing changed but backpressure_count. */
  FD_STEP_OUTCOME_FORCE_32BIT = 0x7fffffff /**< Forces 32 bits. */
} fd_engine_step_outcome;

/** @brief Result of ::fd_engine_begin_step. */
typedef struct fd_engine_step {
  uint32_t struct_size;   /**< sizeof(fd_engine_step) as compiled by the caller. */
  int32_t outcome;        /**< An ::fd_engine_step_outcome. */
  fd_tx tx;               /**< The step's transaction handle (outcome ::FD_STEP_OPENED). */
  uint32_t batch;         /**< Rows. */
  uint32_t needed_blocks; /**< New blocks the step needs (allocated when opened). */
  uint32_t free_blocks;   /**< Free blocks before the step. */
  uint32_t reserved0;     /**< Written as 0. */
} fd_engine_step;

/**
 * @brief Opens a step: one new token for each listed request.
 *
 * Unscheduled mode: ids must be active; when the step needs more blocks than
 * are free, the call succeeds with outcome ::FD_STEP_BACKPRESSURE and changes
 * nothing but backpressure_count. Scheduler-managed mode: the ids must equal
 * the runnable ids of the last applied decision, in order, the decision must
 * not have been used by an earlier step, and every admitted request must have
 * its whole initial context (see ::fd_engine_prefill_request_layers); a
 * shortage of blocks is an invariant violation.
 *
 * Host bookkeeping only, on both backends. On a CUDA cache it may allocate
 * (and so must run outside stream capture) only when the step has more rows
 * or a larger block table than any step before (see ::fd_engine_create), and
 * in the cache's staging the first time (see ::fd_tx_block_tables_async).
 * @param[in,out] engine Borrowed for the call; not NULL.
 * @param[in] request_ids Host memory, borrowed for the call; copied.
 * @param count Entries of @p request_ids (rows), >= 1.
 * @param[in,out] step Borrowed for the call; not NULL. Caller sets struct_size
 *   to at least sizeof(fd_engine_step) (checked before the step opens);
 *   written on success only.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, count 0, duplicates,
 *   ids other than the decision's runnable ids); ::FD_ERR_NOT_FOUND;
 *   ::FD_ERR_INVALID_STATE (a step is open, an id not active, no unused
 *   applied decision, context not fully prefilled, cache changed behind the
 *   engine); ::FD_ERR_INVARIANT (scheduler-managed backpressure);
 *   ::FD_ERR_OUT_OF_MEMORY / ::FD_ERR_DEVICE (CUDA cache: growing the device
 *   scratch failed; no step is open).
 */
FD_API fd_status fd_engine_begin_step(fd_engine *engine, const uint64_t *request_ids,
                                      uint32_t count, fd_engine_step *step);

/**
 * @brief Runs one layer of the open step: rotates Q and K at each row's
 * position, appends rotated K and raw V, and decodes over the rows'
 * effective sequence lengths (the new token included).
 *
 * Layers go 0..num_layers-1 in order. Any failure (wrong layer, a refused
 * write, a decode error) aborts the whole step: its cache transaction is
 * rolled back, seq_lens are unchanged and transaction_abort_count + 1.
 *
 * CUDA cache: q, k, v and out_attention are device memory of the cache's
 * device (checked with cudaPointerGetAttributes: a host pointer is
 * ::FD_ERR_INVALID_ARGUMENT and aborts the step). The call enqueues its work
 * on @p stream and returns: layer 0 first copies the step's block tables and
 * effective seq_lens into the engine's device scratch on that stream, then
 * every layer runs the RoPE append and the decode on it. The inputs must stay
 * valid, and out_attention is ready, when @p stream reaches that point. Every
 * layer of a step must use the stream of layer 0 (or one the caller orders
 * after it), and so must the next step (the engine reuses its scratch), as
 * ::fd_tx_block_tables_async requires. No host synchronisation happens here,
 * and no allocation once the cache's staging has served a step of this size
 * (see ::fd_tx_block_tables_async), so the call may run inside stream
 * capture.
 * @param[in,out] engine Borrowed for the call; not NULL.
 * @param tx The handle from ::fd_engine_begin_step.
 * @param layer The next layer of the step.
 * @param[in] q [batch, num_q_heads, head_dim]; not modified.
 * @param[in] k,v [batch, num_kv_heads, head_dim]. All in the cache's dtype,
 *   borrowed for the call: host memory for a CPU cache, device memory of the
 *   cache's device for a CUDA cache.
 * @param[out] out_attention [batch, num_q_heads, head_dim], same memory kind
 *   as @p q; must not alias the inputs; written on success only.
 * @param stream CUDA stream the layer is enqueued on (NULL: legacy default
 *   stream); ignored by CPU caches.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL data, wrong layer, a host
 *   pointer for a CUDA cache);
 *   ::FD_ERR_STALE_HANDLE (@p tx is not the open step); ::FD_ERR_INVALID_STATE
 *   (no open step); any status of the cache or ::fd_decode (step aborted).
 */
FD_API fd_status fd_engine_step_layer(fd_engine *engine, fd_tx tx, uint32_t layer, const void *q,
                                      const void *k, const void *v, void *out_attention,
                                      fd_stream stream);

/**
 * @brief Publishes the step: every row's seq_len grows by one. In
 * scheduler-managed mode a request that reached initial_context_tokens +
 * max_new_tokens is finished.
 *
 * Host bookkeeping only: on a CUDA cache it does not wait for the step's
 * work (the published tokens are in place once the step's stream reaches
 * its last layer).
 * @param[in,out] engine Borrowed for the call; not NULL.
 * @param tx The handle from ::fd_engine_begin_step.
 * @return ::FD_OK; ::FD_ERR_INVALID_STATE (no open step, not every layer run:
 *   the step stays open); ::FD_ERR_STALE_HANDLE (@p tx is not the open step).
 */
FD_API fd_status fd_engine_commit_step(fd_engine *engine, fd_tx tx);

/**
 * @brief Rolls the open step back (seq_lens unchanged, new blocks freed).
 * @param[in,out] engine Borrowed for the call; not NULL.
 * @param tx The handle from ::fd_engine_begin_step.
 * @return ::FD_OK; ::FD_ERR_INVALID_STATE (no open step);
 *   ::FD_ERR_STALE_HANDLE (@p tx is not the open step).
 */
FD_API fd_status fd_engine_abort_step(fd_engine *engine, fd_tx tx);

/**
 * @brief Appends one prompt token to an active request, all layers, through
 * one cache transaction (published once).
 *
 * K is rotated with the engine's RoPE at the token's position, like
 * ::fd_engine_step_layer. In scheduler-managed mode only a request whose
 * seq_len is below its initial_context_tokens may be prefilled.
 *
 * CUDA cache: @p k and @p v are device memory of the cache's device (a host
 * pointer is ::FD_ERR_INVALID_ARGUMENT and changes nothing), read on the
 * legacy default stream; work that produces them on another stream must be
 * complete (or ordered before that stream). The call synchronises the legacy
 * default stream before it publishes the token, so on return @p k and @p v
 * may be reused and later steps on any stream see the token. Prefill is
 * therefore not capturable; it is off the step path.
 * @param[in,out] engine Borrowed for the call; not NULL.
 * @param request_id An active request.
 * @param[in] k,v [num_layers, num_kv_heads, head_dim], cache dtype, borrowed
 *   for the call: host memory for a CPU cache, device memory for a CUDA
 *   cache.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, host pointers for a CUDA
 *   cache); ::FD_ERR_NOT_FOUND;
 *   ::FD_ERR_INVALID_STATE (not active, context complete, a step is open,
 *   cache changed behind the engine); ::FD_ERR_OUT_OF_BLOCKS; ::FD_ERR_DEVICE
 *   (CUDA: the queued work failed). On failure the request's seq_len and
 *   blocks are unchanged.
 */
FD_API fd_status fd_engine_prefill_request_layers(fd_engine *engine, uint64_t request_id,
                                                  const void *k, const void *v);

/**
 * @brief Scheduler-managed mode: queues a request (state waiting). The first
 * call switches the engine to scheduler-managed mode.
 * @param[in,out] engine Borrowed for the call; not NULL.
 * @param[in] spec Borrowed for the call; not NULL; copied. struct_size must be
 *   this library's. A prefix id must name a prefix registered through
 *   ::fd_engine_register_prefix; prefix_blocks 0 is filled from it.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (as ::fd_snapshot_add_waiting);
 *   ::FD_ERR_ALREADY_EXISTS (id or submission_order already used);
 *   ::FD_ERR_NOT_FOUND (unknown prefix); ::FD_ERR_INVALID_STATE (first call on
 *   a non-empty cache or with unscheduled requests, a step is open, cache
 *   changed behind the engine).
 */
FD_API fd_status fd_engine_submit_request(fd_engine *engine, const fd_request_spec *spec);

/**
 * @brief Registers a shared prefix in the cache (see ::fd_prefix_register).
 * Only before the first submission.
 * @param[in,out] engine Borrowed for the call; not NULL.
 * @param[in] prefix_id As ::fd_prefix_register.
 * @param[in] k_blocks,v_blocks As ::fd_prefix_register (for a CUDA cache,
 *   host or device memory, as it allows).
 * @param num_blocks Blocks of the prefix, >= 1.
 * @param stream As ::fd_prefix_register; ignored by CPU caches.
 * @return As ::fd_prefix_register; ::FD_ERR_INVALID_STATE after a submission
 *   or while a step is open.
 */
FD_API fd_status fd_engine_register_prefix(fd_engine *engine, const char *prefix_id,
                                           const void *k_blocks, const void *v_blocks,
                                           uint32_t num_blocks, fd_stream stream);

/**
 * @brief Evicts a prefix (see ::fd_prefix_evict). Only when no request is
 * waiting or active.
 * @param[in,out] engine Borrowed for the call; not NULL.
 * @param[in] prefix_id NUL-terminated; borrowed for the call.
 * @return As ::fd_prefix_evict; ::FD_ERR_INVALID_STATE while requests are
 *   waiting or active, or a step is open.
 */
FD_API fd_status fd_engine_evict_prefix(fd_engine *engine, const char *prefix_id);

/** @brief Caller-kept fairness counters of one request (docs/semantics.md S9). */
typedef struct fd_request_fairness {
  uint64_t id;                 /**< Request id. */
  uint32_t wait_steps;         /**< Waiting: decisions waited through. */
  uint32_t skip_count;         /**< Waiting: times passed over. */
  uint32_t service_wait_steps; /**< Active: steps since it last ran. */
  uint32_t reserved0;          /**< Must be 0. */
} fd_request_fairness;

/**
 * @brief Builds the authoritative snapshot of a scheduler-managed engine:
 * waiting and active requests in submission order, with the caller's fairness
 * counters (requests not listed get zeros; entries for terminal requests are
 * ignored) and version = the engine's state_version.
 * @param[in] engine Borrowed for the call; not NULL.
 * @param step Copied into the snapshot.
 * @param[in] fairness Host memory, borrowed for the call; @p count entries
 *   with unique ids; may be NULL when @p count is 0.
 * @param count Entries of @p fairness.
 * @param[out] out Not NULL; receives a new snapshot on success only; owned by
 *   the caller, release with ::fd_snapshot_destroy.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, duplicate ids, reserved0
 *   != 0); ::FD_ERR_NOT_FOUND (an id the engine never saw);
 *   ::FD_ERR_INVALID_STATE (not scheduler-managed, a step is open, cache
 *   changed behind the engine).
 */
FD_API fd_status fd_engine_snapshot(const fd_engine *engine, uint64_t step,
                                    const fd_request_fairness *fairness, uint32_t count,
                                    fd_snapshot **out);

/**
 * @brief Applies a decision: rejects and admits the requests it names (an
 * admitted request becomes active; a prefixed one is attached to its prefix).
 *
 * Before any change the engine rebuilds its authoritative snapshot with the
 * decision snapshot's step and fairness counters, requires it to equal the
 * decision's snapshot entry by entry (same order), requires @p scheduler's
 * configuration to equal the decision's, re-plans and requires the same
 * decision. Any refusal: stale_decision_count + 1 and nothing else changes.
 * Refusals are the ::FD_ERR_STALE_HANDLE failures (this decision does not
 * match) and the ::FD_ERR_INVALID_STATE ones (the engine cannot apply any
 * decision now: not scheduler-managed, a step is open, the cache was changed
 * behind the engine); NULL arguments, ::FD_ERR_OUT_OF_MEMORY and
 * ::FD_ERR_INVARIANT are not refusals and do not count.
 * On success the decision's runnable ids become the only ids the next step
 * may use. Admitted requests with a context must be prefilled before it.
 * @param[in,out] engine Borrowed for the call; not NULL.
 * @param[in] scheduler Borrowed for the call; not NULL.
 * @param[in] decision Borrowed for the call; not NULL; the engine keeps no
 *   reference to it.
 * @return ::FD_OK; ::FD_ERR_STALE_HANDLE (snapshot version or contents differ
 *   from the engine's, other config, different re-plan; the message says
 *   which); ::FD_ERR_INVALID_ARGUMENT (NULL); ::FD_ERR_INVALID_STATE (not
 *   scheduler-managed, a step is open, cache changed behind the engine);
 *   ::FD_ERR_OUT_OF_MEMORY (host memory ran out, also inside the cache while
 *   admitting; the message then names the admission, e.g. "admission 2 of 3
 *   (request 7) failed in fd_prefix_attach", and says the decision was not
 *   applied); ::FD_ERR_INVARIANT (the cache refused a validated admission for
 *   another reason). A failure changes nothing (unless an ::FD_ERR_INVARIANT
 *   message says that taking admissions back failed): admissions already made
 *   in the cache are taken back (only the cache's state version moves on, and
 *   the engine follows it), stale_decision_count counts refusals only, and the
 *   same decision can be applied again.
 */
FD_API fd_status fd_engine_apply_decision(fd_engine *engine, const fd_scheduler *scheduler,
                                          const fd_decision *decision);

/** @brief Counters and gauges of an engine (docs/semantics.md S8). Caller sets
 *  struct_size; the library fills the fields that fit. */
typedef struct fd_engine_metrics {
  uint32_t struct_size;             /**< sizeof(fd_engine_metrics) as compiled by the caller. */
  uint32_t scheduler_managed;       /**< 1 in scheduler-managed mode. */
  uint64_t waiting_request_count;   /**< Requests waiting. */
  uint64_t active_request_count;    /**< Requests active. */
  uint64_t finished_request_count;  /**< Requests finished. */
  uint64_t cancelled_request_count; /**< Requests cancelled. */
  uint64_t rejected_request_count;  /**< Requests rejected. */
  uint64_t completed_step_count;    /**< Committed steps. */
  uint64_t appended_token_count;    /**< Tokens published by steps (rows of committed steps). */
  uint64_t prefill_token_count;     /**< Tokens published by ::fd_engine_prefill_request_layers. */
  uint64_t backpressure_count;      /**< Steps refused for lack of blocks (unscheduled mode). */
  uint64_t state_version;           /**< Grows on every change the engine makes. */
  uint64_t cache_state_version;     /**< Cache state version the engine last saw. */
  uint64_t committed_blocks;        /**< Scheduler-managed: resident prefix blocks + active lifetime
                                         commitments; 0 otherwise. */
  uint64_t
      committed_but_unallocated_blocks; /**< committed_blocks - blocks held (scheduler-managed). */
  /** Refused ::fd_engine_apply_decision calls (::FD_ERR_STALE_HANDLE or
   *  ::FD_ERR_INVALID_STATE). */
  uint64_t stale_decision_count;
  uint64_t applied_decision_count;       /**< Applied decisions. */
  uint64_t open_step_transaction_count;  /**< 0 or 1. */
  uint64_t transaction_layer_step_count; /**< Successful ::fd_engine_step_layer calls. */
  uint64_t transaction_abort_count;      /**< Aborted steps (explicit or after a failure). */
} fd_engine_metrics;

/**
 * @brief Reads the engine metrics.
 * @param[in] engine Borrowed for the call; not NULL.
 * @param[in,out] metrics Borrowed for the call; not NULL. Caller sets
 *   struct_size (at least 8); the library fills what fits.
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT (NULL, too-small struct_size).
 */
FD_API fd_status fd_engine_metrics_get(const fd_engine *engine, fd_engine_metrics *metrics);

/**
 * @brief Checks that the engine and its cache agree: the cache's own
 * invariants (::fd_cache_validate), request states, ownership of blocks, and
 * in scheduler-managed mode every lifetime commitment.
 * @param[in] engine Borrowed for the call; not NULL.
 * @return ::FD_OK; ::FD_ERR_INVARIANT with the first violation in words;
 *   ::FD_ERR_INVALID_ARGUMENT for NULL.
 */
FD_API fd_status fd_engine_validate(const fd_engine *engine);

/**
 * @brief Opens a step that appends token_counts[i] >= 1 tokens to request i
 * (appended in 0.2): speculative verification (the last accepted token and
 * the draft tokens) or a prompt chunk whose attention output is needed.
 *
 * As ::fd_engine_begin_step (which is this call with every count 1), with
 * these differences. The step's layers take the rows' tokens packed in row
 * order: ::fd_engine_step_layer's q, k, v and out_attention are
 * [token_count, heads, head_dim] with token_count = sum token_counts[i];
 * token j of row i sits at position seq_len_i + j and is rotated there, and
 * its attention is causal: it sees positions <= its own (docs/semantics.md
 * S2.2). needed_blocks counts the blocks all of a row's tokens need. In
 * scheduler-managed mode a row may not grow past initial_context_tokens +
 * max_new_tokens. Close the step with ::fd_engine_commit_step (keep every
 * token), ::fd_engine_commit_step_keep (keep the first keep_counts[i]) or
 * ::fd_engine_abort_step.
 *
 * CUDA cache: layer 0 also copies the step's query-token offsets into the
 * engine's device scratch (::fd_tx_token_indptr_async); the step stays
 * capturable under the rules of ::fd_engine_step_layer. A step with more
 * tokens than any before grows the rotated-Q scratch here.
 * @param[in,out] engine Borrowed for the call; not NULL.
 * @param[in] request_ids Host memory, [count], borrowed for the call; copied.
 * @param[in] token_counts Host memory, [count], borrowed for the call;
 *   copied; each >= 1.
 * @param count Rows, >= 1.
 * @param[in,out] step As ::fd_engine_begin_step.
 * @return As ::fd_engine_begin_step; ::FD_ERR_INVALID_ARGUMENT also for NULL
 *   token_counts, a count of 0 (naming the entry), a sum above INT32_MAX, or
 *   a scheduled row that would pass its commitment. Nothing changes on
 *   failure.
 */
FD_API fd_status fd_engine_begin_step_multi(fd_engine *engine, const uint64_t *request_ids,
                                            const uint32_t *token_counts, uint32_t count,
                                            fd_engine_step *step);

/**
 * @brief Publishes the step keeping the first keep_counts[i] of row i's new
 * tokens and dropping the rest (appended in 0.2): the accept step of
 * speculative decoding, through ::fd_tx_commit_keep.
 *
 * As ::fd_engine_commit_step otherwise: every row's seq_len grows by
 * keep_counts[i] (0 keeps none); blocks that hold only dropped tokens return
 * to the cache's free list. In scheduler-managed mode a request that reaches
 * initial_context_tokens + max_new_tokens is finished.
 * @param[in,out] engine Borrowed for the call; not NULL.
 * @param tx The handle from ::fd_engine_begin_step or
 *   ::fd_engine_begin_step_multi.
 * @param[in] keep_counts Host memory, [count], borrowed for the call; each
 *   at most the row's token count.
 * @param count The step's rows.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL keep_counts, count not the
 *   step's rows, a keep count above the row's tokens: the step stays open and
 *   nothing changes); otherwise as ::fd_engine_commit_step.
 */
FD_API fd_status fd_engine_commit_step_keep(fd_engine *engine, fd_tx tx,
                                            const uint32_t *keep_counts, uint32_t count);

/**
 * @brief Appends @p num_tokens prompt tokens to an active request, all
 * layers, through one cache transaction (appended in 0.2): the bulk form of
 * ::fd_engine_prefill_request_layers (which is this call with one token).
 *
 * Token j is rotated at position seq_len + j. All tokens are published at
 * once, or none (on failure the request's seq_len and blocks are unchanged).
 * In scheduler-managed mode the request may not grow past its
 * initial_context_tokens. Same memory and stream rules as
 * ::fd_engine_prefill_request_layers: off the step path, synchronising on a
 * CUDA cache.
 * @param[in,out] engine Borrowed for the call; not NULL.
 * @param request_id An active request.
 * @param num_tokens Tokens, >= 1.
 * @param[in] k,v [num_layers, num_tokens, num_kv_heads, head_dim], cache
 *   dtype, borrowed for the call: host memory for a CPU cache, device memory
 *   for a CUDA cache.
 * @return As ::fd_engine_prefill_request_layers; ::FD_ERR_INVALID_ARGUMENT
 *   also for num_tokens 0 or a scheduled request that would pass its context.
 */
FD_API fd_status fd_engine_prefill_request_tokens(fd_engine *engine, uint64_t request_id,
                                                  uint32_t num_tokens, const void *k,
                                                  const void *v);

/** @} */

/* ------------------------------------------------------------------------ */
/** @defgroup workloads Workload drivers
 *  Behaviour: docs/semantics.md S10.
 *
 *  Deterministic, seeded drivers that run whole scenarios on the CPU backend
 *  and report comparable numbers. Stateless functions; thread-safe. Results
 *  are immutable and thread-safe.
 *  @{ */

/** @brief Workload families. Values pinned. */
typedef enum fd_workload_kind {
  FD_WORKLOAD_SYNTHETIC =
      0, /**< Single layer, unscheduled: arrivals, cancellations, backpressure. */
  FD_WORKLOAD_SCHEDULER = 1,  /**< Lifetime scheduler vs greedy vs cancel-on-backpressure. */
  FD_WORKLOAD_INTEGRATED = 2, /**< Multi-layer, scheduler-managed, prefixes, injected failure. */
  FD_WORKLOAD_KIND_FORCE_32BIT = 0x7fffffff /**< Forces 32 bits. */
} fd_workload_kind;

/** @brief Admission policies compared by workloads. Values pinned. */
typedef enum fd_workload_policy {
  FD_POLICY_UNSCHEDULED = 0, /**< FIFO admission, backpressure stalls (synthetic workloads). */
  FD_POLICY_LIFETIME = 1,    /**< ::fd_scheduler_plan + ::fd_engine_apply_decision. */
  FD_POLICY_GREEDY = 2,      /**< Admit while the context fits; deadlock after stalled steps. */
  FD_POLICY_CANCEL_ON_BACKPRESSURE =
      3, /**< Greedy, cancelling the oldest active request on a stall. */
  FD_POLICY_FORCE_32BIT = 0x7fffffff /**< Forces 32 bits. */
} fd_workload_policy;

/** @brief Progress callback: @p done of @p total units of work are finished. */
typedef void (*fd_workload_progress_fn)(void *user_data, uint64_t done, uint64_t total);

/** @brief Parameters of ::fd_workload_run. Initialise with ::fd_workload_options_init. */
typedef struct fd_workload_options {
  uint32_t struct_size;  /**< sizeof(fd_workload_options) as compiled by the caller. */
  int32_t kind;          /**< An ::fd_workload_kind. Default ::FD_WORKLOAD_SCHEDULER. */
  const char *case_name; /**< A case of @p kind (::fd_workload_case_name); borrowed for the call. */
  uint64_t seed;         /**< Seed of every random choice. Default 0. */
  fd_workload_progress_fn
      progress;             /**< Called now and then from the calling thread; may be NULL. */
  void *progress_user_data; /**< Passed to @p progress. */
  uint32_t cpu_threads;     /**< Decode threads; 0 = FLASHDEC_THREADS if set, else all
                               hardware threads. Default 1. */
  uint32_t reserved0;       /**< Must be 0. */
} fd_workload_options;

/** @brief Fills @p options with defaults and sets struct_size. NULL is ignored.
 *  @param[out] options Borrowed for the call; may be NULL. */
FD_API void fd_workload_options_init(fd_workload_options *options);

/**
 * @brief Names the cases of a workload kind.
 * @param kind An ::fd_workload_kind.
 * @param index 0-based.
 * @param[out] name Not NULL; receives the case name, a static string owned by
 *   the library.
 * @return ::FD_OK; ::FD_ERR_NOT_FOUND (index past the last case);
 *   ::FD_ERR_INVALID_ARGUMENT (unknown kind, NULL).
 */
FD_API fd_status fd_workload_case_name(int32_t kind, uint32_t index, const char **name);

/** @brief Opaque result of ::fd_workload_run: one report and trace per policy run. */
typedef struct fd_workload_result fd_workload_result;

/**
 * @brief Runs a workload case to completion.
 * @param[in] options Borrowed for the call; not NULL.
 * @param[out] out Not NULL; receives the result on success only; owned by the
 *   caller, release with ::fd_workload_result_destroy.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, struct_size too small or
 *   larger than this library's struct, unknown kind, reserved0 != 0);
 *   ::FD_ERR_NOT_FOUND (unknown case); ::FD_ERR_INVARIANT (the run broke an
 *   engine or cache invariant: a bug); ::FD_ERR_OUT_OF_MEMORY.
 */
FD_API fd_status fd_workload_run(const fd_workload_options *options, fd_workload_result **out);

/** @brief Destroys a workload result. NULL is a no-op.
 *  @param result Owned by the caller, released here; may be NULL. */
FD_API void fd_workload_result_destroy(fd_workload_result *result);

/**
 * @brief Number of policy runs in a result (1, or 3 for scheduler cases).
 * @param[in] result Borrowed for the call; not NULL.
 * @param[out] count Not NULL; receives the number of runs.
 * @return ::FD_OK or ::FD_ERR_INVALID_ARGUMENT (NULL).
 */
FD_API fd_status fd_workload_result_count(const fd_workload_result *result, uint32_t *count);

/** @brief Report of one policy run (docs/semantics.md S10). Latencies are wall
 *  clock; every other field is deterministic for a given case and seed. */
typedef struct fd_workload_report {
  uint32_t struct_size;          /**< sizeof(fd_workload_report) as compiled by the caller. */
  int32_t kind;                  /**< ::fd_workload_kind. */
  int32_t policy;                /**< ::fd_workload_policy. */
  uint32_t max_blocks;           /**< Pool size. */
  char case_name[32];            /**< NUL-terminated case name. */
  uint64_t seed;                 /**< Seed used. */
  uint64_t steps;                /**< Loop iterations driven (including stalled ones). */
  uint64_t executed_steps;       /**< Committed steps. */
  uint64_t requests_submitted;   /**< Requests offered. */
  uint64_t requests_completed;   /**< Requests that generated every new token. */
  double completion_rate;        /**< requests_completed / requests_submitted. */
  uint64_t useful_tokens;        /**< Tokens generated by completed requests. */
  uint64_t generated_tokens;     /**< Tokens generated by any request (including cancelled ones). */
  double tokens_per_second;      /**< generated_tokens / wall time of executed steps. */
  double step_latency_p50_us;    /**< Nearest-rank percentiles of executed step wall time. */
  double step_latency_p90_us;    /**< See step_latency_p50_us. */
  double step_latency_p99_us;    /**< See step_latency_p50_us. */
  uint64_t stalled_steps;        /**< Iterations in which active requests could not run. */
  uint64_t backpressure_steps;   /**< Steps refused for lack of blocks. */
  uint64_t deadlocks;            /**< Runs stopped as deadlocked (0 or 1). */
  uint64_t forced_cancellations; /**< Requests cancelled by the policy. */
  uint64_t user_cancellations;   /**< Requests cancelled by the workload script. */
  uint64_t rejected_requests;    /**< Requests rejected as never fitting. */
  uint64_t aborted_steps;        /**< Steps rolled back (injected failures). */
  double mean_admission_wait_steps;  /**< Mean iterations from arrival to admission (admitted
                                        requests). */
  uint64_t max_admission_wait_steps; /**< Largest such wait. */
  uint64_t max_service_wait_steps; /**< Largest run of iterations an active request did not run. */
  double
      fairness; /**< Jain's index of completed requests' tokens / (finish - arrival) (1 = fair). */
  uint64_t peak_used_blocks;         /**< Largest used block count after a step. */
  double mean_used_blocks;           /**< Mean used blocks over iterations. */
  uint64_t prefix_hits;              /**< Prefix attaches. */
  uint64_t prefix_misses;            /**< Prefixed requests served without a resident prefix. */
  uint64_t peak_saved_prefix_blocks; /**< Largest saved_prefix_blocks seen. */
  uint64_t trajectory_hash;          /**< FNV-1a hash of the deterministic trajectory. */
} fd_workload_report;

/**
 * @brief Reads the report of run @p index.
 * @param[in] result Borrowed for the call; not NULL.
 * @param index Run, < ::fd_workload_result_count.
 * @param[in,out] report Borrowed for the call; not NULL. Caller sets
 *   struct_size (at least through case_name, 48 bytes); the library fills
 *   what fits.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, index out of range,
 *   too-small struct_size).
 */
FD_API fd_status fd_workload_result_report(const fd_workload_result *result, uint32_t index,
                                           fd_workload_report *report);

/** @brief One iteration of a workload run (for plots). */
typedef struct fd_workload_trace_point {
  uint64_t step;             /**< Iteration number. */
  double latency_us;         /**< Wall time of the iteration's step (0 when nothing ran). */
  uint32_t used_blocks;      /**< Blocks in use after the iteration. */
  uint32_t committed_blocks; /**< Lifetime commitments (lifetime policy), else used_blocks. */
  uint32_t active;           /**< Active requests after the iteration. */
  uint32_t waiting;          /**< Waiting requests after the iteration. */
} fd_workload_trace_point;

/**
 * @brief Copies the per-iteration trace of run @p index.
 * @param[in] result Borrowed for the call; not NULL.
 * @param index Run, < ::fd_workload_result_count.
 * @param[out] points Host memory of @p capacity entries, borrowed for the
 *   call; may be NULL when @p capacity is 0 (to ask for the count).
 * @param capacity Entries at @p points: 0, or at least the trace length.
 * @param[out] count Not NULL; receives the trace length.
 * @return ::FD_OK; ::FD_ERR_INVALID_ARGUMENT (NULL, index out of range,
 *   capacity below the length: nothing written).
 */
FD_API fd_status fd_workload_result_trace(const fd_workload_result *result, uint32_t index,
                                          fd_workload_trace_point *points, uint32_t capacity,
                                          uint32_t *count);

/** @} */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHDEC_H */

// coco_device.h -- the device layer that every generated CUDA C kernel includes.
//
// One kernel text, two executors (docs/architecture.md section 5):
//   * CUDA: NVRTC (CuPy RawModule) compiles the text; this header maps the COCO_* names onto
//     CUDA built-ins. It includes no other header, so NVRTC needs no include path (the NVRTC
//     wheel ships neither cuda_fp16.h nor cuda_bf16.h; fp16/bf16 are our own storage types).
//   * Host: g++ -O3 -std=c++17 -fopenmp -ffp-contract=off compiles the SAME text into a shared
//     library; blocks become an OpenMP loop and the threads of a block become plain loops.
//
// KERNEL CONVENTION (generated code must follow it; the host build rejects most violations):
//
//   COCO_KERNEL(scale_f32, const float* __restrict__ x, float* __restrict__ y, coco_i64 n) {
//     COCO_KERNEL_BODY_BEGIN
//     const coco_range r = coco_chunk(n, coco_grid_dim(), coco_block_idx(), 1);
//     COCO_BLOCK_STRIDE_LOOP(coco_i64, i, r.begin, r.end) { y[i] = 2.0f * x[i]; }
//     COCO_KERNEL_BODY_END
//   }
//
// * COCO_KERNEL(name, params...) declares the entry point. CUDA: `extern "C" __global__ void
//   name(params...)`, launched as usual (grid.x, block.x, dynamic shared bytes). Host:
//   `extern "C" void name(unsigned grid, unsigned block, unsigned shared_bytes, params...)`.
//   Only 1-D grids and blocks exist. A kernel has at least one parameter.
// * The body sits between COCO_KERNEL_BODY_BEGIN and COCO_KERNEL_BODY_END. On the host BEGIN
//   opens the OpenMP loop over blocks (schedule(static): every OpenMP thread runs its blocks in
//   increasing index order, which keeps cross-rank waits between same-index blocks deadlock-free)
//   and allocates the per-block dynamic shared memory.
// * Code directly in the body is BLOCK LEVEL: it runs once per block on the host but once per
//   thread on CUDA, so it must be uniform across the block and free of side effects: constants,
//   block-uniform control flow (e.g. the levels of a tree reduction), shared-memory declarations,
//   phases and coco_sync_block(). Stores, atomics and flag waits belong inside phases.
// * A PHASE is either
//     COCO_FOR_THREADS { ... }                    every thread of the block runs the body once,
//                                                 coco_thread_idx() is valid inside;
//     COCO_BLOCK_STRIDE_LOOP(T, i, begin, end) {} the threads of the block share the elements
//                                                 [begin, end), thread t taking begin+t,
//                                                 begin+t+blockDim, ... (coalesced on a GPU). On
//                                                 the host it is one contiguous, vectorizable
//                                                 loop, so the body must not depend on which
//                                                 thread runs an element (coco_thread_idx() is
//                                                 not defined there).
//   `continue` and `break` inside a phase both end the current thread's (element's) iteration
//   on both targets. `return` is not allowed in a kernel (the OpenMP host build rejects it).
//   Each phase macro is one statement, so it can be the body of a block-level if/for.
// * coco_sync_block() (= __syncthreads) separates phases; it must be at block level (checked
//   at compile time on the host, as is the nesting of phases). The host runs phases one after
//   another, each as a loop over the threads, so any block size, including 1, works.
// * Per-thread values never survive a phase boundary: on the host a block-level variable is one
//   variable for the whole block. Carry them through shared memory indexed by coco_thread_idx().
// * Shared memory: COCO_SHARED(T, name, N) for a fixed-size array; COCO_SHARED_DYN(T, name,
//   byte_offset) for a pointer into the dynamic shared memory of the launch (16-byte aligned
//   base; the launch's shared_bytes on the host).
// * No warp-size assumptions, no waits between threads of one phase or between blocks of one
//   rank. Cross-rank synchronization happens only between same-index blocks of different ranks,
//   through flags in symmetric buffers: coco_store_release_u32 / coco_wait_flag_geq, and the
//   protocol of fused collectives built on them (coco_peers_*). The host spin-wait yields the
//   core (ranks may outnumber cores).
// * VECTORS (fused collective kernels): a BLOCK_STRIDE_LOOP may run over whole vectors of
//   `lanes` = COCO_VEC_BYTES / (element size) consecutive elements, each iteration one vector:
//     COCO_VEC_IN(T, x, lanes, src);    x[k] is src[k]
//     COCO_VEC_OUT(T, y, lanes, dst);   y[k] = ... lands in dst[k] at coco_vec_store(y, dst)
//     COCO_FOR_LANES(k, lanes) { ... }  the lanes, independent elements
//   On a GPU a vector is 16 bytes: registers filled and drained with 128-bit loads and stores
//   (coalesced across the threads of a warp), so `src`/`dst` must be coco_vec_aligned and
//   lanes * sizeof(T) a multiple of 16, and `src` global memory (ld.global). On the host a vector is a 1 KiB tile of views of the
//   memory itself, which the compiler vectorizes. Lanes loops read inputs before they store
//   outputs at the same element (in-place updates), like the lanes of a GPU register vector.
//   A phase in which each thread accumulates its own vectors (a reduction's lanes) gives
//   thread t the vectors t, t + coco_vector_threads(), ... for t < coco_vector_threads():
//   every thread on a GPU, thread 0 on the host (one set of lane accumulators per block).
//   LOADS FIRST: a vector iteration declares every COCO_VEC_IN / COCO_PEERS_VEC_IN before its
//   first lanes loop, then coco_loads_issued(zero, vectors...) naming them all; on a GPU they
//   are issued there, in that order, every one before any math on loaded data (neither NVVM
//   nor ptxas may sink them to their uses: see coco_vload and coco_loads_issued), so one
//   iteration waits for memory once, not once per input.
//     COCO_PEERS_VEC_IN(T, x, lanes, table, index, first, nranks, me);
//                                       x[s][k] is element index + k of peer first + s, for
//                                       the s < COCO_PEER_BATCH with first + s < nranks
//                                       (`table` holds the peers' addresses); the slots a
//                                       GPU loads in the order rotated by `me` (its own slot
//                                       first, then me + 1, ...: ranks do not all read the
//                                       same peer at once), each into its own registers
//     COCO_FOR_PEER_SLOTS(s, start, exists) { }  s in [start, COCO_PEER_BATCH), unrolled
//                                       on a GPU (the body selects on `exists`, slot s's
//                                       peer existing), those where it holds on the host:
//                                       the peers of a batch, combined IN RANK ORDER
//   COCO_PEER_BATCH is a compile-time count: the build's largest group (COCO_PEERS_MAX) up to
//   8, so a GPU holds no register for a peer that cannot exist; larger groups take further
//   batches. Vector loops bound the group by coco_group(nranks), which tells the compiler
//   that no further batch exists where the build's groups fit one.
// * Helper functions are declared COCO_DEVICE and take any indices they need as parameters.
// * fp16/bf16 (coco_f16, coco_bf16) are 2-byte storage types: compute in float through
//   coco_to_f32 / coco_from_f32<T> (round to nearest even). fp32 accumulation throughout.
// * Numerics are "round every operation": no FMA contraction (NVRTC --fmad=false, g++
//   -ffp-contract=off), IEEE division and square root. coco_rsqrt is 1/sqrt for that reason.
//   Transcendentals (exp, log, tanh) may differ by a few ulp between CUDA and libm.
#ifndef COCO_DEVICE_H
#define COCO_DEVICE_H

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define COCO_TARGET_CUDA 1
#else
#define COCO_TARGET_HOST 1
#endif

// ---------------------------------------------------------------------------------------------
// Scalar types. NVRTC has no <cstdint> without include paths, so spell them with built-ins.
// ---------------------------------------------------------------------------------------------
typedef signed char coco_i8;
typedef int coco_i32;
typedef long long coco_i64;
typedef unsigned char coco_u8;
typedef unsigned short coco_u16;
typedef unsigned int coco_u32;
typedef unsigned long long coco_u64;
typedef float coco_f32;
typedef double coco_f64;
typedef bool coco_bool;

// 2-byte storage types with the layout of numpy.float16 / ml_dtypes.bfloat16. No arithmetic
// operators on purpose: arithmetic in fp16 would round differently on the two targets.
struct coco_f16 {
  coco_u16 bits;
};
struct coco_bf16 {
  coco_u16 bits;
};
// 1-byte fp8 storage types with the layout of ml_dtypes.float8_e4m3fn / float8_e5m2 (OCP FP8:
// e4m3fn has no infinities and one NaN per sign, S.1111.111; e5m2 is IEEE-like).
struct coco_f8e4m3 {
  coco_u8 bits;
};
struct coco_f8e5m2 {
  coco_u8 bits;
};

// The largest group a kernel of this build serves (a plan defines it: lowering/plan.py
// `Plan.peers_max`; by default any group a grid can hold), and the peers of a vector
// iteration loaded at once (see VECTORS): the whole group up to 8 peers, so that a GPU holds
// registers for exactly the peers that can exist and larger groups take further batches.
#ifndef COCO_PEERS_MAX
#define COCO_PEERS_MAX 65536
#endif
#ifndef COCO_PEER_BATCH
#define COCO_PEER_BATCH (COCO_PEERS_MAX < 8 ? COCO_PEERS_MAX : 8)
#endif
#if COCO_PEERS_MAX < 1 || COCO_PEER_BATCH < 1 || COCO_PEER_BATCH > 32
#error "COCO_PEERS_MAX must be at least 1, COCO_PEER_BATCH in [1, 32]"
#endif
#define COCO_PEERS_MAX_ ((coco_i32)(COCO_PEERS_MAX))
#define COCO_PEER_BATCH_ ((coco_i32)(COCO_PEER_BATCH))

#ifdef COCO_TARGET_HOST
// ---------------------------------------------------------------------------------------------
// Host implementation of the launch model.
// ---------------------------------------------------------------------------------------------
// glibc's C <math.h> alone: libstdc++'s wrapper would pull in <cmath>, whose overloads
// nothing here calls (every math call names its C function: the coco_* wrappers' doubles,
// the fast policy's expf...), and which is three quarters of g++'s time on a small unit
// (0.26 s of 0.31 s at -O0). Other standard libraries ignore the macro.
#define _GLIBCXX_INCLUDE_NEXT_C_HEADERS
#include <math.h>
#undef _GLIBCXX_INCLUDE_NEXT_C_HEADERS
#include <sched.h>
#include <string.h>

#include <new>

// The `fast` numerics policy's f32 functions (coco_fast_*, below) call libm's expf, logf, tanhf
// and powf. Where the build links glibc's vector math library (host_compiler.py passes
// -DCOCO_HOST_LIBMVEC -lmvec where g++ links it), they are declared with their vector variants,
// as glibc's own <math.h> declares them only under -ffast-math, so g++ vectorizes the loops that
// call them (_ZGVdN8v_expf: 8 lanes under AVX2). Exact kernels call none of them on floats.
#if defined(COCO_HOST_LIBMVEC) && defined(__GNUC__) && !defined(__clang__)
extern "C" {
__attribute__((simd("notinbranch"))) float expf(float) noexcept;
__attribute__((simd("notinbranch"))) float logf(float) noexcept;
__attribute__((simd("notinbranch"))) float tanhf(float) noexcept;
__attribute__((simd("notinbranch"))) float powf(float, float) noexcept;
}
#endif

#define COCO_DEVICE static inline
#define COCO_HD inline

#ifdef _OPENMP
#define COCO_OMP(directive) _Pragma(directive)
#else
#define COCO_OMP(directive)
#endif

namespace coco_host {
// Per-OpenMP-thread dynamic shared memory; reused by all blocks that thread runs, like SM
// shared memory is reused by successive blocks (contents are undefined at block start).
struct DynShared {
  unsigned char* ptr;
  explicit DynShared(unsigned bytes)
      : ptr(bytes ? static_cast<unsigned char*>(::operator new(bytes, std::align_val_t(64)))
                  : nullptr) {}
  ~DynShared() {
    if (ptr) ::operator delete(ptr, std::align_val_t(64));
  }
  DynShared(const DynShared&) = delete;
  DynShared& operator=(const DynShared&) = delete;
};
}  // namespace coco_host

#define COCO_KERNEL(name, ...)                                                            \
  extern "C" __attribute__((visibility("default"))) void name(                            \
      [[maybe_unused]] unsigned int coco_grid_dim_,                                       \
      [[maybe_unused]] unsigned int coco_block_dim_,                                      \
      [[maybe_unused]] unsigned int coco_shared_bytes_, __VA_ARGS__)

// coco_phase_depth_ is 0 at block level and 1 inside a phase. Phase and sync macros
// instantiate coco_at_block_level<coco_phase_depth_> with the innermost declaration in scope,
// so a misplaced one fails to compile while each macro stays a single statement. The inner
// depth is declared by `if (...) {} else BODY`: a user's own `else` after a phase then binds
// to the user's `if`, as it does on CUDA.
template <int Depth>
constexpr int coco_at_block_level() {
  static_assert(Depth == 0,
                "COCO_FOR_THREADS, COCO_BLOCK_STRIDE_LOOP and coco_sync_block() must be at "
                "block level, not inside a phase");
  return 1;
}

#define COCO_KERNEL_BODY_BEGIN                                                            \
  COCO_OMP("omp parallel") {                                                              \
    coco_host::DynShared coco_dyn_shared_(coco_shared_bytes_);                            \
    unsigned char* const coco_dyn_smem_ = coco_dyn_shared_.ptr;                           \
    (void)coco_dyn_smem_;                                                                 \
    COCO_OMP("omp for schedule(static)")                                                  \
    for (unsigned int coco_b_ = 0; coco_b_ < coco_grid_dim_; ++coco_b_) {                 \
      /* a block has a thread: what thread 0 writes in a phase (a row value in shared */  \
      /* memory) is written before a later block-stride phase reads it */                 \
      if (coco_block_dim_ == 0) __builtin_unreachable();                                  \
      [[maybe_unused]] constexpr int coco_phase_depth_ = 0;

#define COCO_KERNEL_BODY_END \
  }                          \
  }

#define coco_block_idx() (coco_b_)
#define coco_block_dim() (coco_block_dim_)
#define coco_grid_dim() (coco_grid_dim_)
// The threads that share a block's whole vectors where each thread accumulates its own (see
// VECTORS): thread 0 alone on the host, whose threads run one after another -- each would
// set up and combine a 1 KiB tile's worth of lane accumulators for a vector or two.
#define coco_vector_threads() (1u)
// Defined only inside COCO_FOR_THREADS: anywhere else `coco_t_` is undeclared.
#define coco_thread_idx() (coco_t_)

#define COCO_FOR_THREADS                                                              \
  for (unsigned int coco_t_ = 0; coco_t_ < coco_block_dim_; ++coco_t_)                \
    for (int coco_once_ = coco_at_block_level<coco_phase_depth_>(); coco_once_;       \
         coco_once_ = 0)                                                              \
      if (constexpr int coco_phase_depth_ = 1; !coco_phase_depth_) {                  \
      } else

// The elements of one phase belong to different CUDA threads, which run concurrently, so
// they cannot depend on each other: that is what makes `ivdep` legitimate here.
#define COCO_BLOCK_STRIDE_LOOP(T, i, begin, end)                                      \
  _Pragma("GCC ivdep") for (T i = (begin), coco_end_##i = (end); i < coco_end_##i; ++i) \
    for (int coco_once_ = coco_at_block_level<coco_phase_depth_>(); coco_once_;       \
         coco_once_ = 0)                                                              \
      if (constexpr int coco_phase_depth_ = 1; !coco_phase_depth_) {                  \
      } else

#define coco_sync_block() ((void)coco_at_block_level<coco_phase_depth_>())

#define COCO_SHARED(T, name, n) T name[n]
#define COCO_SHARED_DYN(T, name, byte_offset) \
  T* const name = reinterpret_cast<T*>(coco_dyn_smem_ + (byte_offset))

// ---- bit casts ----
COCO_HD coco_u32 coco_float_as_u32(float f) {
  coco_u32 u;
  memcpy(&u, &f, sizeof u);
  return u;
}
COCO_HD float coco_u32_as_float(coco_u32 u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// ---- atomics (relaxed read-modify-write, like CUDA atomicAdd) ----
COCO_HD float coco_atomic_add_f32(float* addr, float v) {
  coco_u32* p = reinterpret_cast<coco_u32*>(addr);
  coco_u32 old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(p, &old, coco_float_as_u32(coco_u32_as_float(old) + v),
                                      true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return coco_u32_as_float(old);
}
COCO_HD double coco_atomic_add_f64(double* addr, double v) {
  coco_u64* p = reinterpret_cast<coco_u64*>(addr);
  coco_u64 old = __atomic_load_n(p, __ATOMIC_RELAXED);
  for (;;) {
    double o, n;
    memcpy(&o, &old, sizeof o);
    n = o + v;
    coco_u64 nb;
    memcpy(&nb, &n, sizeof nb);
    if (__atomic_compare_exchange_n(p, &old, nb, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return o;
  }
}
COCO_HD coco_u32 coco_atomic_add_u32(coco_u32* addr, coco_u32 v) {
  return __atomic_fetch_add(addr, v, __ATOMIC_RELAXED);
}
// System scope is the only scope on the host (peers are MPI shared-memory windows).
COCO_HD coco_u32 coco_atomic_add_u32_system(coco_u32* addr, coco_u32 v) {
  return __atomic_fetch_add(addr, v, __ATOMIC_RELAXED);
}

// ---- cross-rank flags ----
COCO_HD coco_u32 coco_load_acquire_u32(const volatile coco_u32* flag) {
  return __atomic_load_n(flag, __ATOMIC_ACQUIRE);
}
COCO_HD void coco_store_release_u32(volatile coco_u32* flag, coco_u32 value) {
  __atomic_store_n(flag, value, __ATOMIC_RELEASE);
}
COCO_HD void coco_threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
COCO_HD void coco_trap() { __builtin_trap(); }

COCO_HD void coco_cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

// ---- vectors (see "VECTORS" above) ----
// A host "vector" is a tile of COCO_VEC_BYTES that the C++ compiler vectorizes with the CPU's
// own SIMD width: the lanes loop of one vector is a plain counted loop over in-place views.
// Small tiles would leave the compiler a loop of a few iterations per vector (a measured 5x
// slower than a 1 KiB tile); larger ones gain nothing and keep less of a block in L1.
#ifndef COCO_VEC_BYTES
#define COCO_VEC_BYTES 1024
#endif
#define COCO_VEC_IN(T, name, lanes, src) const T* const name = (src)
#define COCO_VEC_OUT(T, name, lanes, dst) T* const name = (dst)
// The lanes were stored in place by the lanes loop.
#define coco_vec_store(name, dst) ((void)(name))
// Lanes are distinct elements (distinct GPU threads' work): no dependence between them.
#define COCO_FOR_LANES(k, lanes) _Pragma("GCC ivdep") for (coco_i32 k = 0; k < (lanes); ++k)
// The lanes of a kernel whose vectors must stay within the innermost dim of `inner` elements
// (a broadcast): the tile shrinks to the largest power of two dividing it, so a dim shorter
// than a tile still runs the vector loop (one coordinate computation per vector) instead of
// the element loop (one per element).
static inline coco_i32 coco_vec_lanes(coco_i32 most, coco_i64 inner) {
  coco_i32 lanes = most;
  while (lanes > 1 && inner % lanes != 0) lanes /= 2;
  return lanes;
}
// A batch of peers' vectors: views of their memory, as a vector is (nothing is loaded ahead
// on the host, so the order of the slots does not matter there).
template <class T>
COCO_HD void coco_peers_view(const T* (&dst)[COCO_PEER_BATCH_], const coco_u64* table,
                             coco_i64 index, coco_i32 first, coco_i32 nranks) {
  for (coco_i32 s = 0; s < COCO_PEER_BATCH_; ++s)
    dst[s] = first + s < nranks ? (const T*)table[first + s] + index : nullptr;
}
#define COCO_PEERS_VEC_IN(T, name, lanes, table, index, first, nranks, me) \
  const T* name[COCO_PEER_BATCH_];                                         \
  coco_peers_view<T>(name, (table), (index), (first), (nranks));           \
  (void)(me)
// The slots whose peer exists (`exists`, the condition the body selects on): the compiler
// then knows the select true, hoists the peer's address and vectorizes the lanes loop.
#define COCO_FOR_PEER_SLOTS(s, start, exists) \
  for (coco_i32 s = (start); s < COCO_PEER_BATCH_; ++s) if (exists)
// Nothing is loaded ahead on the host (see the CUDA implementation).
template <class... A>
COCO_HD void coco_loads_issued(coco_i64, A&...) {}
#endif  // COCO_TARGET_HOST

#ifdef COCO_TARGET_CUDA
// ---------------------------------------------------------------------------------------------
// CUDA implementation: thin names over the built-ins.
// ---------------------------------------------------------------------------------------------
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
#error "coco_device.h needs sm_70 or newer (acquire/release loads and stores, __nanosleep)"
#endif

#define COCO_DEVICE __device__ __forceinline__
#define COCO_HD __device__ __forceinline__

#define COCO_KERNEL(name, ...) extern "C" __global__ void name(__VA_ARGS__)
#define COCO_KERNEL_BODY_BEGIN \
  {                            \
    extern __shared__ __align__(16) unsigned char coco_dyn_smem_[];
#define COCO_KERNEL_BODY_END }

#define coco_block_idx() (blockIdx.x)
#define coco_block_dim() (blockDim.x)
#define coco_grid_dim() (gridDim.x)
// Every thread: 16-byte loads, coalesced across a warp.
#define coco_vector_threads() (blockDim.x)
#define coco_thread_idx() (threadIdx.x)

// A one-trip loop so that `continue`/`break` mean the same as on the host.
#define COCO_FOR_THREADS for (int coco_once_ = 1; coco_once_; coco_once_ = 0)
#define COCO_BLOCK_STRIDE_LOOP(T, i, begin, end)                                     \
  for (T i = (begin) + (T)threadIdx.x, coco_end_##i = (end); i < coco_end_##i;       \
       i += (T)blockDim.x)                                                           \
    for (int coco_once_ = 1; coco_once_; coco_once_ = 0)
#define coco_sync_block() __syncthreads()

#define COCO_SHARED(T, name, n) __shared__ T name[n]
#define COCO_SHARED_DYN(T, name, byte_offset) \
  T* const name = reinterpret_cast<T*>(coco_dyn_smem_ + (byte_offset))

COCO_HD coco_u32 coco_float_as_u32(float f) { return __float_as_uint(f); }
COCO_HD float coco_u32_as_float(coco_u32 u) { return __uint_as_float(u); }

COCO_HD float coco_atomic_add_f32(float* addr, float v) { return atomicAdd(addr, v); }
COCO_HD double coco_atomic_add_f64(double* addr, double v) { return atomicAdd(addr, v); }
COCO_HD coco_u32 coco_atomic_add_u32(coco_u32* addr, coco_u32 v) { return atomicAdd(addr, v); }
// For counters that peers (other GPUs through IPC) update as well.
COCO_HD coco_u32 coco_atomic_add_u32_system(coco_u32* addr, coco_u32 v) {
  return atomicAdd_system(addr, v);
}

// System scope: the flag may live in a peer GPU's memory mapped through CUDA IPC.
COCO_HD coco_u32 coco_load_acquire_u32(const volatile coco_u32* flag) {
  coco_u32 v;
  asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
  return v;
}
COCO_HD void coco_store_release_u32(volatile coco_u32* flag, coco_u32 value) {
  asm volatile("st.release.sys.u32 [%0], %1;" : : "l"(flag), "r"(value) : "memory");
}
COCO_HD void coco_threadfence_system() { __threadfence_system(); }
COCO_HD void coco_trap() { __trap(); }
COCO_HD void coco_cpu_relax() { __nanosleep(32); }

// ---- vectors (see "VECTORS" above) ----
// A GPU thread moves 16 bytes per access (one 128-bit load or store per 16 bytes of a vector);
// the lanes live in registers (the lanes loop is unrolled).
#define COCO_VEC_BYTES 16
// Each 16 bytes travel as one 128-bit access, spelled in PTX.
//
// Loads are `asm volatile`: the compiler keeps volatile asm in program order and never sinks
// it towards the loaded value's first use. A plain C load would be sunk past the peers'
// loop and the IEEE divisions (whose slow paths are calls that ptxas schedules no load
// across), so the inputs of one iteration would reach memory in two or three waves. They
// name no "memory" clobber: they read only the vector they return. Every vector load reads
// global memory (kernel arguments, peers' symmetric buffers), hence ld.global.
//
// Stores are `asm volatile` too (and would be even without the keyword: an asm with no
// outputs is volatile): so they stay after the loads of their iteration (in-place updates)
// and before the barriers and fences that publish them, all of which are volatile asm or
// intrinsics with side effects. A plain C store would not do: the compiler splits a uint4
// store of lanes it can see to be equal (a value stored in two places) into 32-bit stores.
// They name no "memory" clobber either, deliberately: C-level memory accesses need no
// ordering against a vector store (no thread reads back an element it stored, except across
// coco_sync_block() or the protocol's fences, which order everything), and a clobber would
// make the compiler reload every value it holds from memory after each store -- the peer
// tables, once per iteration. The "memory" clobbers that remain, on the flag loads and stores
// (coco_load_acquire_u32, coco_store_release_u32), are needed: they keep the data accesses
// of the protocol on their side of the acquire or release.
template <class T, int L>
COCO_HD void coco_vload(T (&dst)[L], const T* src) {
  static_assert(sizeof(T) * L % 16 == 0, "a vector is a whole number of 16-byte accesses");
#pragma unroll
  for (int c = 0; c < (int)(sizeof(T) * L / 16); ++c) {
    unsigned w[4];
    asm volatile(
        "{\n\t.reg .u64 g;\n\tcvta.to.global.u64 g, %4;\n\t"
        "ld.global.v4.b32 {%0, %1, %2, %3}, [g];\n\t}"
        : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
        : "l"(reinterpret_cast<const uint4*>(src) + c));
    memcpy(reinterpret_cast<unsigned char*>(dst) + 16 * c, w, 16);
  }
}
// The vector at global address `addr` when `has` (predicated: no branch); else dst is left
// undefined and must not be read.
template <class T, int L>
COCO_HD void coco_vload_if(T (&dst)[L], coco_u64 addr, bool has) {
  static_assert(sizeof(T) * L % 16 == 0, "a vector is a whole number of 16-byte accesses");
#pragma unroll
  for (int c = 0; c < (int)(sizeof(T) * L / 16); ++c) {
    unsigned w[4];
    asm volatile(
        "{\n\t.reg .pred p;\n\t.reg .u64 g;\n\tsetp.ne.u32 p, %5, 0;\n\t"
        "cvta.to.global.u64 g, %4;\n\t@p ld.global.v4.b32 {%0, %1, %2, %3}, [g];\n\t}"
        : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
        : "l"(addr + 16u * (coco_u64)c), "r"((unsigned)has));
    memcpy(reinterpret_cast<unsigned char*>(dst) + 16 * c, w, 16);
  }
}
template <class T, int L>
COCO_HD void coco_vstore(T* dst, const T (&src)[L]) {
  static_assert(sizeof(T) * L % 16 == 0, "a vector is a whole number of 16-byte accesses");
#pragma unroll
  for (int c = 0; c < (int)(sizeof(T) * L / 16); ++c) {
    unsigned w[4];
    memcpy(w, reinterpret_cast<const unsigned char*>(src) + 16 * c, 16);
    asm volatile("st.v4.b32 [%0], {%1, %2, %3, %4};"
                 :
                 : "l"(reinterpret_cast<uint4*>(dst) + c), "r"(w[0]), "r"(w[1]), "r"(w[2]),
                   "r"(w[3]));
  }
}
#define COCO_VEC_IN(T, name, lanes, src) \
  alignas(16) T name[lanes];             \
  coco_vload(name, (src))
#define COCO_VEC_OUT(T, name, lanes, dst) alignas(16) T name[lanes]
#define coco_vec_store(name, dst) coco_vstore((dst), name)
#define COCO_FOR_LANES(k, lanes) _Pragma("unroll") for (coco_i32 k = 0; k < (lanes); ++k)
// A GPU vector is one 16-byte access whatever the innermost dim: the lanes stay a constant
// (they size register arrays), and a dim they do not divide takes the element loop.
#define coco_vec_lanes(most, inner) (most)

// A batch of peers' vectors (COCO_PEERS_VEC_IN): slot S holds peer first + S. The slots are
// loaded in the order R, R + 1, ..., wrapping around, for R = me % COCO_PEER_BATCH_ (with
// the whole group in one batch: this rank's own piece, then me + 1, ...). The order is a
// compile-time one per R, so every slot stays in its own registers (an index known only at
// run time would put the batch in local memory); `rot` picks it with a uniform branch.
template <int S, class T, int L>
COCO_HD void coco_peer_slot_vload(T (&dst)[COCO_PEER_BATCH_][L], const coco_u64* table,
                                  coco_i64 index, coco_i32 first, coco_i32 nranks) {
  const bool has = first + S < nranks;
  const coco_u64 base = has ? table[first + S] : 0ull;
  coco_vload_if(dst[S], base + (coco_u64)index * sizeof(T), has);
}
template <int R, int I, class T, int L>
COCO_HD void coco_peers_vload_rotated(T (&dst)[COCO_PEER_BATCH_][L], const coco_u64* table,
                                      coco_i64 index, coco_i32 first, coco_i32 nranks) {
  if constexpr (I < COCO_PEER_BATCH_) {
    coco_peer_slot_vload<(R + I) % COCO_PEER_BATCH_>(dst, table, index, first, nranks);
    coco_peers_vload_rotated<R, I + 1>(dst, table, index, first, nranks);
  }
}
template <int R, class T, int L>
COCO_HD void coco_peers_vload(T (&dst)[COCO_PEER_BATCH_][L], const coco_u64* table,
                              coco_i64 index, coco_i32 first, coco_i32 nranks, coco_i32 rot) {
  if constexpr (R + 1 < COCO_PEER_BATCH_) {
    if (rot != R) {
      coco_peers_vload<R + 1>(dst, table, index, first, nranks, rot);
      return;
    }
  }
  coco_peers_vload_rotated<R, 0>(dst, table, index, first, nranks);
}
#define COCO_PEERS_VEC_IN(T, name, lanes, table, index, first, nranks, me) \
  alignas(16) T name[COCO_PEER_BATCH_][lanes];                             \
  coco_peers_vload<0>(name, (table), (index), (first), (nranks), (me) % COCO_PEER_BATCH_)
// Every slot (its own registers): the body selects on `exists` (the host tests it).
#define COCO_FOR_PEER_SLOTS(s, start, exists) \
  _Pragma("unroll") for (coco_i32 s = (start); s < COCO_PEER_BATCH_; ++s)

// coco_loads_issued(zero, vectors...): after the last load of a vector iteration, before its
// first lanes loop. asm volatile keeps the loads in order and ahead of the math in the PTX,
// but ptxas reschedules the PTX: under register pressure it sinks a load to its value's first
// use, behind math that waits for the loads before it -- one more round trip to memory (seen
// in the SASS of Adam at 8 ranks and of every f16/bf16 kernel). So every 32-bit word of every
// loaded vector is XORed with a fence word that depends on one word of each 16-byte load (an
// OR of them, ANDed with `zero`): no instruction can compute on loaded data before every load
// of the iteration is issued. `zero` is a value the compilers cannot know but that is 0 (a
// kernel's `begin` >> 63: begin >= 0), so the words keep their bits exactly. The XORs are
// PTX, 4 words at a time (XORs in C let NVVM take the vectors of 2-byte lanes apart: 255
// registers and spills for bf16 gradients at 8 ranks); they cost one logic instruction per
// loaded word.
template <class A>
COCO_HD unsigned coco_fence_word(const A& v) {
  static_assert(sizeof(A) % 16 == 0, "a vector is a whole number of 16-byte accesses");
  unsigned f = 0u;
#pragma unroll
  for (int c = 0; c < (int)(sizeof(A) / 16); ++c) {
    unsigned w;
    memcpy(&w, reinterpret_cast<const unsigned char*>(&v) + 16 * c, 4);
    f |= w;
  }
  return f;
}
template <class A>
COCO_HD void coco_fence_apply(A& v, unsigned fence) {
#pragma unroll
  for (int c = 0; c < (int)(sizeof(A) / 16); ++c) {
    unsigned w[4];
    unsigned char* at = reinterpret_cast<unsigned char*>(&v) + 16 * c;
    memcpy(w, at, 16);
    asm("xor.b32 %0, %0, %4;\n\txor.b32 %1, %1, %4;\n\txor.b32 %2, %2, %4;\n\txor.b32 %3, %3, %4;"
        : "+r"(w[0]), "+r"(w[1]), "+r"(w[2]), "+r"(w[3])
        : "r"(fence));
    memcpy(at, w, 16);
  }
}
template <class... A>
COCO_HD void coco_loads_issued(coco_i64 zero, A&... vectors) {
  const unsigned fence = (coco_fence_word(vectors) | ... | 0u) & (unsigned)((coco_u64)zero >> 63);
  (coco_fence_apply(vectors, fence), ...);
}
#endif  // COCO_TARGET_CUDA

// ---------------------------------------------------------------------------------------------
// Shared by both targets.
// ---------------------------------------------------------------------------------------------

// The group size, which a build promises never exceeds COCO_PEERS_MAX (coco_peers_entry
// checks it): bounding it so lets the compiler drop the code of batches that cannot exist.
COCO_HD coco_i32 coco_group(coco_i32 nranks) {
  return nranks < COCO_PEERS_MAX_ ? nranks : COCO_PEERS_MAX_;
}

// Wrap-around-safe "flag >= value": flags are epoch counters that may wrap after 2^32 steps.
COCO_HD bool coco_flag_reached(coco_u32 current, coco_u32 value) {
  return static_cast<coco_i32>(current - value) >= 0;
}

// Spin until a peer has published `value` (or later) in `flag`. On the host the core is
// yielded after a short spin: ranks may outnumber cores, and the peer needs this core.
COCO_HD void coco_wait_flag_geq(volatile coco_u32* flag, coco_u32 value) {
  for (coco_u32 spins = 0; !coco_flag_reached(coco_load_acquire_u32(flag), value); ++spins) {
#ifdef COCO_TARGET_HOST
    if (spins >= 64) {
      sched_yield();
      continue;
    }
#endif
    coco_cpu_relax();
  }
}

// ---- the cross-rank protocol of fused collective kernels ----
// Only between same-index blocks of the members of a group, and only thread 0 of a block
// calls these. `flags` holds the addresses of every member's flag array (a symmetric u32
// buffer), in group order: entry flags, then done flags (nranks x grid each: flag p * grid + b
// says member p's block b got there), then nranks exchange flags, then exit flags (nranks x
// grid), and at its end (at the largest grid's offsets) the site's epoch counter
// (coco_epoch_next). Flags carry the launch's
// epoch, so they never need resetting.

// The epoch of this launch at its site, kept on the device in the counter pair `at` (the end
// of the site's flag array: the last launch's epoch, then a ticket). Thread 0 of every block
// reads it and takes a ticket; the block taking the last ticket (every block has read by then)
// stores the new epoch and resets the ticket for the next launch, which the stream orders
// after this one. A launch replayed from a CUDA graph, its arguments frozen at capture, thereby
// still carries a new epoch every time.
COCO_HD coco_u32 coco_epoch_next(coco_u32* at, coco_u32 grid) {
  const coco_u32 epoch = coco_load_acquire_u32(at) + 1u;
  coco_threadfence_system();  // the read above happens before this block's ticket
  if (coco_atomic_add_u32(at + 1, 1u) == grid - 1u) {
    at[1] = 0u;
    coco_store_release_u32(at, epoch);
  }
  return epoch;
}

// Publish this rank's writes and `epoch` in flag offset + me * stride of every member, then
// wait for every member's flag offset + p * stride in this rank's array.
COCO_HD void coco_peers_signal_wait(const coco_u64* flags, coco_u64 offset, coco_u64 stride,
                                    coco_i32 me, coco_i32 nranks, coco_u32 epoch) {
  coco_threadfence_system();
  for (coco_i32 p = 0; p < nranks; ++p)
    coco_store_release_u32((coco_u32*)flags[p] + offset + (coco_u64)me * stride, epoch);
  for (coco_i32 p = 0; p < nranks; ++p)
    coco_wait_flag_geq((coco_u32*)flags[me] + offset + (coco_u64)p * stride, epoch);
}

// Entry: the block announces it started (so every earlier write of its rank is complete) and
// waits for its peers' same block before reading their inputs. A peer's block b entering the
// NEXT launch has therefore finished this one: only then may it overwrite what this launch's
// block b reads of it (its piece of a gathered value).
COCO_HD void coco_peers_entry(const coco_u64* flags, coco_i32 me, coco_i32 nranks,
                              coco_u32 epoch, coco_u32 grid, coco_u32 block) {
  // A kernel built for smaller groups (COCO_PEERS_MAX) would leave peers out: stop instead.
  if (nranks > COCO_PEERS_MAX_) coco_trap();
#ifdef COCO_TARGET_HOST
  // A host launch starts after every earlier write of its rank (launches are synchronous),
  // so the first block to get here announces every block of the launch: the others then wait
  // only until their peers' launch has started, not for each of their blocks. Ranks sharing
  // cores with other work spend a scheduling delay at each wait, so this halves their waits.
  if (coco_load_acquire_u32((coco_u32*)flags[me] + block + (coco_u64)me * grid) != epoch) {
    coco_threadfence_system();
    for (coco_i32 p = 0; p < nranks; ++p)
      for (coco_u32 b = 0; b < grid; ++b)
        coco_store_release_u32((coco_u32*)flags[p] + b + (coco_u64)me * grid, epoch);
  }
  for (coco_i32 p = 0; p < nranks; ++p)
    coco_wait_flag_geq((coco_u32*)flags[me] + block + (coco_u64)p * grid, epoch);
#else
  coco_peers_signal_wait(flags, block, grid, me, nranks, epoch);
#endif
}

// Done: after storing its piece of every gathered value in its own symmetric buffer, the block
// announces it and waits for its peers' same block: their pieces are then complete (the block
// pulls them from their buffers next), and they have read all they read of this rank's
// inputs, which stay intact until then. Every rank writes only its own memory.
COCO_HD void coco_peers_done(const coco_u64* flags, coco_i32 me, coco_i32 nranks,
                             coco_u32 epoch, coco_u32 grid, coco_u32 block) {
  coco_peers_signal_wait(flags, (coco_u64)nranks * grid + block, grid, me, nranks, epoch);
  coco_threadfence_system();
}

// Exit (a gathered value assembled in place, in a symmetric argument the caller owns): the
// block announces it has pulled its chunk of every peer's piece and waits for its peers' same
// block. No peer then still reads this rank's piece when the launch ends, so the caller may
// write the argument between launches (the entry flags guard only the next launch's writes).
COCO_HD void coco_peers_exit(const coco_u64* flags, coco_i32 me, coco_i32 nranks,
                             coco_u32 epoch, coco_u32 grid, coco_u32 block) {
  coco_peers_signal_wait(flags, 2 * (coco_u64)nranks * grid + nranks + block, grid, me, nranks,
                         epoch);
}

// Exchange: the last block of each rank (coco_block_is_last) announces the partials it wrote
// into every peer's exchange buffer and waits for theirs. It runs after the done flags, which
// depend only on same-index blocks, so no rank waits on a block its own rank has not started.
COCO_HD void coco_peers_exchange(const coco_u64* flags, coco_i32 me, coco_i32 nranks,
                                 coco_u32 epoch, coco_u32 grid) {
  coco_peers_signal_wait(flags, 2 * (coco_u64)nranks * grid, 1, me, nranks, epoch);
}

// A block publishes its partial results and takes a ticket: true for the block of the launch
// that finishes last, which then (after a fence of its own) sees every block's partials. The
// counter must be 0 at launch: the last block resets it for the next one.
COCO_HD bool coco_block_is_last(coco_u32* counter, coco_u32 grid) {
  coco_threadfence_system();
  return coco_atomic_add_u32(counter, 1u) == grid - 1;
}

// A vector access at p is allowed when p is 16-byte aligned (both targets decide alike, so the
// host runs the paths a GPU takes).
COCO_HD bool coco_vec_aligned(const void* p) { return ((coco_u64)p & 15u) == 0; }

// Block-contiguous partition of [0, n) into `parts` pieces whose starts are multiples of
// `align` elements (vector width / cache line), so blocks never share a line.
struct coco_range {
  coco_i64 begin;
  coco_i64 end;
};
COCO_HD coco_range coco_chunk(coco_i64 n, coco_u32 parts, coco_u32 idx, coco_i64 align) {
  coco_i64 per = (n + (coco_i64)parts - 1) / (coco_i64)parts;
  per = (per + align - 1) / align * align;
  coco_i64 b = per * (coco_i64)idx;
  coco_i64 e = b + per;
  coco_range r;
  r.begin = b < n ? b : n;
  r.end = e < n ? e : n;
  return r;
}

// ---- fp16 / bf16 conversions (round to nearest even) ----
// Portable bit-level versions, used on the host (and by the GPU only for bf16 below sm_80).
// They are written with selects instead of branches so that g++ vectorizes loops over them
// (4x faster than _Float16, whose conversions are libgcc calls without -mf16c). Tests check
// them exhaustively against NumPy / ml_dtypes.
// The IEEE-like narrow floats (f16, e5m2) widen by placing their magnitude bits at a float's
// with the exponent rebiased one too high (`placed`): twice a normal value; for a subnormal
// 0.m, 2^emin (1 + m) (below 2^(emin+1)), from which subtracting 2^emin (`low`) leaves its
// value; from 2^17 (twice f16's / e5m2's exponent 31) the infinities and NaNs, payload kept.
// Every step is exact, no float is ever subnormal (a subnormal operand costs an x86 microcode
// assist), and the tests are on the float, so a host vectorizes it in 32-bit lanes: 1.4-1.5x
// the select between an integer form and a converted one (bit-identical on every code).
COCO_HD float coco_ieee_narrow_to_f32(coco_u32 placed, float low, coco_u32 sign) {
  const float twice = coco_u32_as_float(placed);
  const float value = twice < 2.0f * low ? twice - low : twice * 0.5f;
  const coco_u32 bits =
      twice >= 131072.0f ? (coco_float_as_u32(twice) | 0x7F800000u) : coco_float_as_u32(value);
  return coco_u32_as_float(bits | sign);
}
COCO_HD float coco_f16_bits_to_f32(coco_u16 h) {
  return coco_ieee_narrow_to_f32((((coco_u32)h & 0x7FFFu) << 13) + (113u << 23), 0x1p-14f,
                                 (coco_u32)(h & 0x8000u) << 16);
}

COCO_HD coco_u16 coco_f32_to_f16_bits(float f) {
  const coco_u32 x = coco_float_as_u32(f);
  const coco_u32 sign = (x >> 16) & 0x8000u;
  const coco_u32 ax = x & 0x7FFFFFFFu;
  // Normal half: rebias the exponent (-112 << 23) and round to nearest even on bit 13.
  const coco_u32 normal = (ax + 0xC8000FFFu + ((ax >> 13) & 1u)) >> 13;
  // Below the smallest normal half: adding 0.5f rounds to a multiple of 2^-24 (one half
  // subnormal ulp) with the FPU's round-to-nearest-even; the excess bits are the result.
  const coco_u32 subnormal = coco_float_as_u32(coco_u32_as_float(ax) + 0.5f) - 0x3F000000u;
  const coco_u32 nan = 0x7E00u | ((ax >> 13) & 0x3FFu);  // quiet, payload kept
  coco_u32 mag = ax < 0x38800000u ? subnormal : normal;
  mag = ax >= 0x477FF000u ? 0x7C00u : mag;  // rounds to infinity
  mag = ax > 0x7F800000u ? nan : mag;
  return (coco_u16)(sign | mag);
}

COCO_HD float coco_bf16_bits_to_f32(coco_u16 b) { return coco_u32_as_float((coco_u32)b << 16); }

COCO_HD coco_u16 coco_f32_to_bf16_bits(float f) {
  const coco_u32 x = coco_float_as_u32(f);
  const coco_u32 rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  const coco_u32 nan = (x >> 16) | 0x40u;  // quiet, sign and high payload kept
  return (coco_u16)((x & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

// ---- fp8 conversions (round to nearest even, as ml_dtypes' astype) ----
// One bit-level version for both targets, tested on every code and every rounding edge
// against ml_dtypes. The GPU's own cvt (sm_89) only saturates, which a cast must not do
// (e4m3fn overflows to NaN, e5m2 to infinity), and NVRTC's wheel has no cuda_fp8.h: these
// cost a few integer operations in kernels bound by memory.
// f32 -> fp8 with `man` mantissa bits and exponent bias `bias`: magnitudes from `min_normal`
// (the f32 bits of 2^(1-bias)) round on the mantissa bits; below it, adding `sub_add`
// (2^(23+1-bias-man), whose ulp is the smallest fp8 subnormal) rounds with the FPU's
// round-to-nearest-even. A code above `over` becomes `over` (the overflow code: NaN, inf or,
// saturating, the largest finite code); NaN becomes `nan`. The sign is kept throughout.
COCO_HD coco_u8 coco_f32_to_f8_bits(float f, coco_u32 man, coco_u32 bias, coco_u32 min_normal,
                                    float sub_add, coco_u32 over, coco_u32 nan) {
  const coco_u32 x = coco_float_as_u32(f);
  const coco_u32 sign = (x >> 24) & 0x80u;
  const coco_u32 ax = x & 0x7FFFFFFFu;
  const coco_u32 shift = 23u - man;
  const coco_u32 normal =
      ((ax + (1u << (shift - 1u)) - 1u + ((ax >> shift) & 1u)) >> shift) - ((127u - bias) << man);
  const coco_u32 subnormal =
      coco_float_as_u32(coco_u32_as_float(ax) + sub_add) - coco_float_as_u32(sub_add);
  coco_u32 mag = ax < min_normal ? subnormal : normal;
  mag = mag > over ? over : mag;
  mag = ax > 0x7F800000u ? nan : mag;
  return (coco_u8)(sign | mag);
}
// e4m3fn: 3 mantissa bits, bias 7, smallest normal 2^-6, largest finite 448 (code 0x7E).
COCO_HD coco_u8 coco_f32_to_f8e4m3_bits(float f) {
  return coco_f32_to_f8_bits(f, 3u, 7u, 0x3C800000u, 16384.0f, 0x7Fu, 0x7Fu);
}
// e5m2: 2 mantissa bits, bias 15, smallest normal 2^-14, largest finite 57344 (0x7B), inf 0x7C.
COCO_HD coco_u8 coco_f32_to_f8e5m2_bits(float f) {
  return coco_f32_to_f8_bits(f, 2u, 15u, 0x38800000u, 128.0f, 0x7Cu, 0x7Eu);
}
// As coco_ieee_narrow_to_f32 (above): twice a normal code's value, and 2^-6 (1 + m/8) (below
// 2^-5) for a subnormal code 0.m, less 2^-6; e4m3fn has no infinities, and NaN (S.1111.111)
// is the one code at 960. ~1.6x the select between an integer form and a converted one in a
// fused kernel's peer sum on the host (tests on the byte were done on bytes, each mask widened
// twice).
COCO_HD float coco_f8e4m3_bits_to_f32(coco_u8 b) {
  const float twice = coco_u32_as_float((((coco_u32)b & 0x7Fu) << 20) + (121u << 23));
  const float value = twice < 0.03125f ? twice - 0.015625f : twice * 0.5f;
  const coco_u32 bits = twice == 960.0f ? 0x7FC00000u : coco_float_as_u32(value);
  return coco_u32_as_float(bits | ((coco_u32)(b & 0x80u) << 24));
}
// e5m2 is the high byte of an f16 (placed from the byte itself: 8-bit lanes stay 32-bit).
COCO_HD float coco_f8e5m2_bits_to_f32(coco_u8 b) {
  return coco_ieee_narrow_to_f32((((coco_u32)b & 0x7Fu) << 21) + (113u << 23), 0x1p-14f,
                                 (coco_u32)(b & 0x80u) << 24);
}
COCO_HD coco_f8e4m3 coco_f8e4m3_from_f32(float f) {
  coco_f8e4m3 q;
  q.bits = coco_f32_to_f8e4m3_bits(f);
  return q;
}
COCO_HD coco_f8e5m2 coco_f8e5m2_from_f32(float f) {
  coco_f8e5m2 q;
  q.bits = coco_f32_to_f8e5m2_bits(f);
  return q;
}
COCO_HD float coco_to_f32(coco_f8e4m3 q) { return coco_f8e4m3_bits_to_f32(q.bits); }
COCO_HD float coco_to_f32(coco_f8e5m2 q) { return coco_f8e5m2_bits_to_f32(q.bits); }

#ifdef COCO_TARGET_CUDA
// Single instructions on the GPU (cvt rounds to nearest even); bf16 cvt needs sm_80.
COCO_HD float coco_to_f32(coco_f16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}
COCO_HD coco_f16 coco_f16_from_f32(float f) {
  coco_f16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
COCO_HD coco_bf16 coco_bf16_from_f32(float f) {
  coco_bf16 b;
#if __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b.bits) : "f"(f));
#else
  b.bits = coco_f32_to_bf16_bits(f);
#endif
  return b;
}
#else
#if defined(COCO_HOST_USE_FLOAT16) && defined(__FLT16_MAX__)
// Opt-in: g++ >= 12 has _Float16 (round to nearest even), but without -mf16c every
// conversion is a libgcc call that blocks vectorization; the bit version is faster.
COCO_HD float coco_to_f32(coco_f16 h) {
  _Float16 v;
  memcpy(&v, &h.bits, sizeof v);
  return (float)v;
}
COCO_HD coco_f16 coco_f16_from_f32(float f) {
  _Float16 v = (_Float16)f;
  coco_f16 h;
  memcpy(&h.bits, &v, sizeof v);
  return h;
}
#else
COCO_HD float coco_to_f32(coco_f16 h) { return coco_f16_bits_to_f32(h.bits); }
COCO_HD coco_f16 coco_f16_from_f32(float f) {
  coco_f16 h;
  h.bits = coco_f32_to_f16_bits(f);
  return h;
}
#endif
COCO_HD coco_bf16 coco_bf16_from_f32(float f) {
  coco_bf16 b;
  b.bits = coco_f32_to_bf16_bits(f);
  return b;
}
#endif

COCO_HD float coco_to_f32(coco_bf16 b) { return coco_bf16_bits_to_f32(b.bits); }
COCO_HD float coco_to_f32(float f) { return f; }

// coco_from_f32<T>(x): the printer can emit one spelling for every element type.
template <class T>
struct coco_from_f32_impl;
template <>
struct coco_from_f32_impl<coco_f16> {
  static COCO_HD coco_f16 cvt(float f) { return coco_f16_from_f32(f); }
};
template <>
struct coco_from_f32_impl<coco_bf16> {
  static COCO_HD coco_bf16 cvt(float f) { return coco_bf16_from_f32(f); }
};
template <>
struct coco_from_f32_impl<coco_f8e4m3> {
  static COCO_HD coco_f8e4m3 cvt(float f) { return coco_f8e4m3_from_f32(f); }
};
template <>
struct coco_from_f32_impl<coco_f8e5m2> {
  static COCO_HD coco_f8e5m2 cvt(float f) { return coco_f8e5m2_from_f32(f); }
};
template <>
struct coco_from_f32_impl<float> {
  static COCO_HD float cvt(float f) { return f; }
};
template <>
struct coco_from_f32_impl<double> {
  static COCO_HD double cvt(float f) { return (double)f; }
};
template <class T>
COCO_HD T coco_from_f32(float f) {
  return coco_from_f32_impl<T>::cvt(f);
}

// ---- math (float and double overloads; same operation order on both targets) ----
// The device side of core/elementwise.py: each function overloaded for the compute types
// (float, double, coco_i64), so the generator emits one name per op.
// NumPy semantics for max/min: a NaN operand wins (`a` when both are). One select: where `a`
// is not NaN and does not win the comparison, `b` is the answer whether or not it is a NaN
// (a comparison with a NaN is false) -- a reduction's loop-carried chain is one compare-and-
// blend per element, not three selects.
COCO_HD float coco_max(float a, float b) { return (a > b || a != a) ? a : b; }
COCO_HD float coco_min(float a, float b) { return (a < b || a != a) ? a : b; }
COCO_HD double coco_max(double a, double b) { return (a > b || a != a) ? a : b; }
COCO_HD double coco_min(double a, double b) { return (a < b || a != a) ? a : b; }
COCO_HD coco_i64 coco_max(coco_i64 a, coco_i64 b) { return a > b ? a : b; }
COCO_HD coco_i64 coco_min(coco_i64 a, coco_i64 b) { return a < b ? a : b; }
// |x| beyond `limit` (an infinity included) becomes +-limit; NaN stays NaN (coco.quantize).
COCO_HD float coco_saturate(float x, float limit) {
  return x > limit ? limit : (x < -limit ? -limit : x);
}
COCO_HD double coco_saturate(double x, double limit) {
  return x > limit ? limit : (x < -limit ? -limit : x);
}
COCO_HD float coco_relu(float x) { return coco_max(x, 0.0f); }
COCO_HD double coco_relu(double x) { return coco_max(x, 0.0); }
COCO_HD coco_i64 coco_relu(coco_i64 x) { return coco_max(x, (coco_i64)0); }
COCO_HD float coco_abs(float x) { return fabsf(x); }
COCO_HD double coco_abs(double x) { return fabs(x); }
COCO_HD coco_i64 coco_abs(coco_i64 x) { return x < 0 ? -x : x; }
// C integer division truncates; x / 0 is defined as 0 (as in the sim) instead of trapping.
COCO_HD coco_i64 coco_div(coco_i64 a, coco_i64 b) { return b == 0 ? 0 : a / b; }
COCO_HD double coco_pow(double a, double b) { return pow(a, b); }
COCO_HD coco_i64 coco_pow(coco_i64 a, coco_i64 b) { return (coco_i64)pow((double)a, (double)b); }
COCO_HD float coco_sqrt(float x) { return sqrtf(x); }
COCO_HD double coco_sqrt(double x) { return sqrt(x); }
// 1/sqrt rather than rsqrtf: CUDA's rsqrtf is approximate and would not match the host.
COCO_HD float coco_rsqrt(float x) { return 1.0f / sqrtf(x); }
COCO_HD double coco_rsqrt(double x) { return 1.0 / sqrt(x); }
COCO_HD float coco_exp(float x) { return expf(x); }
COCO_HD double coco_exp(double x) { return exp(x); }
// The log of a negative number is the positive quiet NaN, as in the sim: libm's sign of that
// NaN differs between implementations (glibc's logf gives -NaN, NumPy's vector log +NaN).
COCO_HD float coco_log(float x) { return x < 0.0f ? coco_u32_as_float(0x7FC00000u) : logf(x); }
COCO_HD double coco_log(double x) {
  return x < 0.0 ? (double)coco_u32_as_float(0x7FC00000u) : log(x);
}
COCO_HD float coco_tanh(float x) { return tanhf(x); }
COCO_HD double coco_tanh(double x) { return tanh(x); }
COCO_HD float coco_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
COCO_HD double coco_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
// GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). Below
// x = -3, 1 + tanh(u) cancels: there it is x / (1 + exp(-2u)), the same function without the
// cancellation (the sim computes it alike: core/elementwise.py).
COCO_HD float coco_gelu(float x) {
  float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return x >= -3.0f ? 0.5f * x * (1.0f + tanhf(u)) : x / (1.0f + expf(-2.0f * u));
}
COCO_HD double coco_gelu(double x) {
  double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  return x >= -3.0 ? 0.5 * x * (1.0 + tanh(u)) : x / (1.0 + exp(-2.0 * u));
}

// ---- the `fast` numerics policy (docs/architecture.md §3.4.2) ----
// Float only (an f64 op computes alike under both policies), each computed in float, not
// bit-identical across targets. On a GPU: CUDA's full-range f32 functions, whose maximum errors
// the CUDA C Programming Guide's table of mathematical functions gives as expf 2 ulp, logf 1,
// tanhf 2, powf 4, rsqrtf 2 (not the __expf / __logf intrinsics, whose error grows with |x|).
// On the host: libm's expf, logf, tanhf and powf (glibc's vector variants where the build
// links libmvec: see the host section) and 1/sqrtf. Every call is unconditional, so the host
// compiler can vectorize it; the log of a negative number is the positive NaN, as under exact.
COCO_HD float coco_fast_exp(float x) { return expf(x); }
COCO_HD float coco_fast_log(float x) {
  float y = logf(x);
  return x < 0.0f ? coco_u32_as_float(0x7FC00000u) : y;
}
COCO_HD float coco_fast_tanh(float x) { return tanhf(x); }
COCO_HD float coco_fast_pow(float a, float b) { return powf(a, b); }
COCO_HD float coco_fast_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
COCO_HD float coco_fast_gelu(float x) {
  float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return x >= -3.0f ? 0.5f * x * (1.0f + tanhf(u)) : x / (1.0f + expf(-2.0f * u));
}
#ifdef COCO_TARGET_CUDA
COCO_HD float coco_fast_rsqrt(float x) { return rsqrtf(x); }
#else
COCO_HD float coco_fast_rsqrt(float x) { return 1.0f / sqrtf(x); }
#endif

// ---- counter-based random numbers (SplitMix64 finalizer) ----
// Stateless so that any thread, block split or rank count draws the same number for the
// same element: counter_hash(seed, index, stream) = mix64(index + mix64(seed ^ stream*golden)).
COCO_HD coco_u64 coco_mix64(coco_u64 z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
COCO_HD coco_u64 coco_counter_hash(coco_u64 seed, coco_u64 index, coco_u64 stream) {
  return coco_mix64(index + coco_mix64(seed ^ (stream * 0x9E3779B97F4A7C15ull)));
}
// Keep an element when the top 24 hash bits are >= threshold (threshold = round(p * 2^24)).
COCO_HD bool coco_dropout_keep(coco_u64 seed, coco_u64 index, coco_u64 stream,
                               coco_u32 threshold) {
  return (coco_u32)(coco_counter_hash(seed, index, stream) >> 40) >= threshold;
}

#endif  // COCO_DEVICE_H
